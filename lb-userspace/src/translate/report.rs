//! The translation as readable text: every Service, each backend set, and every endpoint with
//! its conditions and the reason it is or is not a candidate.
use std::fmt::Write as _;

use super::types::{Candidacy, EndpointDecision, ServiceTranslation, Verdict};

fn cond(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "true",
        Some(false) => "false",
        None => "-",
    }
}

/// One endpoint line: address, conditions, node, and the verdict with its reason.
pub fn endpoint_line(e: &EndpointDecision) -> String {
    let addr = match (e.address, e.port) {
        (Some(ip), Some(port)) => std::net::SocketAddr::new(ip, port).to_string(),
        (Some(ip), None) => format!("{ip}:<no port>"),
        (None, _) => "<no IP address>".into(),
    };
    let verdict = match &e.verdict {
        Verdict::Candidate { why } => format!(
            "candidate ({})",
            match why {
                Candidacy::Ready => "ready",
                Candidacy::ServingTerminating => "serving while terminating; nothing is ready",
            }
        ),
        Verdict::Excluded(x) => format!("excluded, {}: {x}", x.code()),
    };
    format!(
        "{addr} [{}] ready={} serving={} terminating={} node={}: {verdict}",
        e.slice,
        cond(e.ready),
        cond(e.serving),
        cond(e.terminating),
        e.node_name.as_deref().unwrap_or("-"),
    )
}

pub fn render(translations: &[ServiceTranslation]) -> String {
    let mut out = String::new();
    for t in translations {
        let _ = writeln!(
            out,
            "service {} (resourceVersion {})",
            t.service,
            or_dash(&t.resource_version)
        );
        if let Some(skip) = &t.skipped {
            let _ = writeln!(out, "  skipped: {skip}");
        }
        for note in &t.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        for p in &t.ports {
            let d = &p.desired;
            let affinity = d
                .affinity_timeout_s
                .map(|s| format!(", affinity ClientIP {s}s"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {} {} {} {}: port {} -> targetPort {}, {} backend(s){affinity}, rule {:?}",
                p.key.port_name,
                p.key.protocol,
                p.key.family,
                p.key.scope,
                d.port,
                p.target_port,
                d.backends.len(),
                p.rule,
            );
            for f in &d.frontends {
                let _ = writeln!(out, "    frontend {} ({})", f.addr, f.kind);
            }
            for e in &p.endpoints {
                let _ = writeln!(out, "    endpoint {}", endpoint_line(e));
            }
        }
    }
    out
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}
