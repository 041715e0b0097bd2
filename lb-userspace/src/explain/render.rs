//! The explanation as the text a person reads: the chain, numbered, then the verdict.
use std::fmt::Write as _;

use lb_common::MapId;

use super::{Explanation, Link, ReadFrom};
use crate::{
    translate::{ServiceTranslation, report::endpoint_line},
    vocab::Family,
};

pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "explain {}", e.target);
    match (&e.service, &e.translation) {
        (Some(_), Some(t)) => {
            service(&mut out, e, t);
            slices(&mut out, e);
            endpoints(&mut out, t);
            maps(&mut out, e);
            live(&mut out, e);
            outside(&mut out, e);
        }
        _ => {
            if let Some(r) = &e.rejected {
                let _ = writeln!(out, "   rejected: {r}");
            }
        }
    }
    let link = match e.broken {
        Link::None => "OK: ".to_string(),
        link => format!(
            "broken at {}: ",
            serde_json::to_value(link)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        ),
    };
    let _ = writeln!(out, "\nverdict: {link}{}", e.verdict);
    out
}

fn service(out: &mut String, e: &Explanation, t: &ServiceTranslation) {
    let _ = writeln!(
        out,
        "\n1. Service {} (resourceVersion {})",
        t.service,
        dash(&t.resource_version)
    );
    match &e.selector {
        Some(selector) => {
            let s: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "   selector {}", s.join(","));
        }
        None => {
            let _ = writeln!(out, "   no selector (EndpointSlices are managed by hand)");
        }
    }
    if let Some(skip) = &t.skipped {
        let _ = writeln!(out, "   produces no frontend: {skip}");
    }
    for note in &t.notes {
        let _ = writeln!(out, "   note: {note}");
    }
    for r in &t.refused {
        let _ = writeln!(out, "   not served: {r}");
    }
}

fn slices(out: &mut String, e: &Explanation) {
    let name = e.service.as_ref().map_or("", |k| &*k.name);
    let _ = writeln!(
        out,
        "\n2. EndpointSlices labelled kubernetes.io/service-name={name}: {}",
        e.slices.len()
    );
    for s in &e.slices {
        let ports = if s.ports.is_empty() {
            "-".to_string()
        } else {
            s.ports.join(" ")
        };
        let _ = writeln!(
            out,
            "   {} (resourceVersion {}): {}, ports {ports}, {} endpoint(s)",
            s.name,
            dash(&s.resource_version),
            s.address_type,
            s.endpoints
        );
    }
}

fn endpoints(out: &mut String, t: &ServiceTranslation) {
    let _ = writeln!(out, "\n3. Endpoints and port mapping");
    for p in &t.ports {
        let _ = writeln!(
            out,
            "   {} {} {} {}: port {} -> targetPort {} -> {} candidate(s), by rule: {}",
            p.key.port_name,
            p.key.protocol,
            p.key.family,
            p.key.scope,
            p.desired.port,
            p.target_port,
            p.desired.backends.len(),
            p.rule
        );
        if p.endpoints.is_empty() {
            let _ = writeln!(out, "     (no endpoint)");
        }
        for d in &p.endpoints {
            let _ = writeln!(out, "     {}", endpoint_line(d));
        }
    }
}

fn maps(out: &mut String, e: &Explanation) {
    let _ = writeln!(out, "\n4. This node's maps");
    if !e.maps_available {
        let _ = writeln!(out, "   no pinned maps");
    }
    for m in &e.maps {
        let held = match &m.maps_backends {
            None => "absent".to_string(),
            Some(b) if b.is_empty() => "no backend (connects refused)".to_string(),
            Some(b) => b
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        };
        let verdict = match (&m.owned_by, m.matches) {
            (Some(owner), _) => format!("NOT SERVED: {owner}"),
            (None, true) => "matches".into(),
            (None, false) => "DIFFERS".into(),
        };
        let _ = writeln!(out, "   {} -> {held} [{verdict}]", m.frontend);
        if let Some(from) = &m.read_from {
            let _ = writeln!(
                out,
                "      read from {}",
                from.describe(m.frontend.family())
            );
        }
    }
    if e.agent_reachable {
        if e.agent_problems.is_empty() {
            let _ = writeln!(out, "   the agent reports no problem with this Service");
        }
        for p in &e.agent_problems {
            let _ = writeln!(out, "   the agent reports {p}");
        }
    } else {
        let _ = writeln!(out, "   (the agent's /status was not reachable)");
    }
    let _ = writeln!(out, "\n   desired sha256 {}", e.desired_digest);
    let _ = writeln!(out, "   maps    sha256 {}", e.maps_digest);
    let rvs: Vec<String> = e
        .resource_versions
        .iter()
        .map(|v| format!("{}@{}", v.object, dash(&v.resource_version)))
        .collect();
    let _ = writeln!(out, "   from {}", rvs.join(", "));
}

impl ReadFrom {
    /// Where the programs find a frontend of `family`, as a person reads it.
    pub fn describe(&self, family: Family) -> String {
        let (index, hash) = match family {
            Family::IPv4 => (MapId::FrontendIndex.name(), MapId::Frontends4.name()),
            Family::IPv6 => (MapId::FrontendIndex6.name(), MapId::Frontends6.name()),
        };
        match self {
            ReadFrom::Index {
                slot,
                frontends4_agrees: true,
            } => format!("{index} (slot {slot})"),
            ReadFrom::Index {
                slot,
                frontends4_agrees: false,
            } => format!(
                "{index} (slot {slot}), which {hash} does not agree with: the agent rewrites the index from {hash} at its next start"
            ),
            ReadFrom::SlotEmpty { slot } => format!("{hash} ({index} slot {slot} is empty)"),
            ReadFrom::SlotHeld { slot, by } => format!(
                "{hash} ({index} slot {slot} holds {})",
                by.as_ref()
                    .map_or_else(|| "another frontend".into(), ToString::to_string)
            ),
            ReadFrom::EntryFailsCheck { slot } => {
                format!("{hash} ({index} slot {slot} fails its check)")
            }
            ReadFrom::HashMap => hash.to_string(),
        }
    }
}

fn live(out: &mut String, e: &Explanation) {
    let Some(live) = &e.live else {
        return;
    };
    let _ = writeln!(out, "\n5. Live connections on this node");
    for ep in &live.endpoints {
        let state = if ep.drained {
            "drained".to_string()
        } else {
            format!(
                "{} connection{} from {} client{}",
                ep.connections,
                if ep.connections == 1 { "" } else { "s" },
                ep.clients,
                if ep.clients == 1 { "" } else { "s" }
            )
        };
        let _ = writeln!(
            out,
            "   {} {} {:<22} {:<20} {state}",
            ep.service_port.port_name,
            ep.service_port.protocol,
            ep.backend.to_string(),
            ep.condition.to_string()
        );
    }
    for m in &live.missing {
        let _ = writeln!(out, "   not listed: {m}");
    }
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// The outside path's frontends, where its tables are on this node.
fn outside(out: &mut String, e: &Explanation) {
    let Some(o) = &e.outside else {
        return;
    };
    let _ = writeln!(
        out,
        "\n   from outside the node (nftables, table socklb): desired {} installed {}",
        o.desired_digest, o.installed_digest
    );
    if o.checks.is_empty() {
        let _ = writeln!(
            out,
            "   no NodePort, load-balancer IP or externalIP on this node"
        );
    }
    for c in &o.checks {
        let d = &c.desired;
        let state = if c.holds() { "ok" } else { "DIFFERS" };
        let endpoints: Vec<String> = d.endpoints.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "   {state:7} {} {} -> {}",
            d.family,
            d.key,
            if endpoints.is_empty() {
                d.verdict.clone()
            } else {
                endpoints.join(", ")
            }
        );
    }
    if let Some(p) = &o.problem {
        let _ = writeln!(out, "   first broken link: {p}");
    }
}
