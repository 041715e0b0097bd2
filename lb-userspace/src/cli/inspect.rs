//! `socklb inspect`: the pinned maps, read-only.
use std::{fmt::Write as _, process::ExitCode};

use clap::Subcommand;
use lb_common::map_name;
use serde::Serialize;

use super::{Output, PinArgs, table::Table};
use crate::dataplane::{
    abi::{Frontend, backend_from_abi, words_to_ip},
    bpf::{BpfServiceMaps, named_counters, open_pinned_map, read_affinity, sock_state_fill},
    dump::{self, ServiceView},
    loader::PinFolder,
    maps::{MapSnapshot, ServiceMaps as _},
};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t, global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Frontends with their service, active/total backends and the backends.
    Services,
    /// The backend table.
    Backends,
    /// What a connect to ADDR:PORT[/tcp|udp] would get: the candidates and affinity.
    Lookup { target: String },
    /// The data path's counters (summed over CPUs) and map fill.
    Stats,
    /// Session-affinity entries.
    Affinity,
    /// The attached programs: instruction counts and the kernel's run counters.
    Programs,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let pins = PinFolder::new(&args.pins.pin_folder);
    anyhow::ensure!(
        pins.exists(),
        "no socklb maps pinned under {} (is the agent running with --bpffs {}?)",
        pins.root.display(),
        pins.root.display()
    );
    let maps = BpfServiceMaps::open_pinned(&pins.maps(), true)?;
    let snap = maps.read_all()?;
    let json = args.output == Output::Json;
    let text = match &args.what {
        What::Services => services(&snap, json)?,
        What::Backends => backends(&snap, json)?,
        What::Lookup { target } => lookup(&pins, &snap, target, json)?,
        What::Stats => stats(&pins, &maps, &snap, json)?,
        What::Affinity => affinity(&pins, &snap, json)?,
        What::Programs => programs(&pins, json)?,
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn to_json<T: Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

fn services(snap: &MapSnapshot, json: bool) -> anyhow::Result<String> {
    let views = dump::services(snap);
    if json {
        return to_json(&views);
    }
    let mut t = Table::new(["FRONTEND", "SERVICE", "SCOPE", "ACTIVE/TOTAL", "BACKENDS"]);
    for v in &views {
        for f in &v.frontends {
            t.row(vec![
                f.frontend.clone(),
                v.service
                    .clone()
                    .unwrap_or_else(|| format!("<id {}>", v.id)),
                v.scope.clone().unwrap_or_default(),
                format!("{}/{}", f.active, v.slots.len()),
                backends_cell(v),
            ]);
        }
    }
    Ok(t.render())
}

fn backends_cell(v: &ServiceView) -> String {
    let active = v.active_backends();
    if active.is_empty() {
        "<none: connects refused>".into()
    } else {
        active.join(",")
    }
}

#[derive(Serialize)]
struct BackendRow {
    id: u32,
    address: Option<String>,
    services: Vec<String>,
}

fn backends(snap: &MapSnapshot, json: bool) -> anyhow::Result<String> {
    let views = dump::services(snap);
    let rows: Vec<BackendRow> = snap
        .backends
        .iter()
        .map(|(id, b)| BackendRow {
            id: *id,
            address: backend_from_abi(b).map(|a| a.to_string()),
            services: views
                .iter()
                .filter(|v| v.slots.iter().any(|s| s.backend_id == *id))
                .map(|v| {
                    v.service
                        .clone()
                        .unwrap_or_else(|| format!("<id {}>", v.id))
                })
                .collect(),
        })
        .collect();
    if json {
        return to_json(&rows);
    }
    let mut t = Table::new(["ID", "ADDRESS", "SERVICES"]);
    for r in rows {
        t.row(vec![
            r.id.to_string(),
            r.address.unwrap_or_default(),
            r.services.join(","),
        ]);
    }
    Ok(t.render())
}

#[derive(Serialize)]
struct Lookup {
    frontend: String,
    service: Option<String>,
    verdict: String,
    candidates: Vec<String>,
    affinity_timeout_s: Option<u32>,
    affinity_entries: usize,
}

fn lookup(
    pins: &PinFolder,
    snap: &MapSnapshot,
    target: &str,
    json: bool,
) -> anyhow::Result<String> {
    let frontend = Frontend::parse(target).map_err(anyhow::Error::msg)?;
    let key = frontend.to_key();
    let result = match snap.frontends.get(&key) {
        None => Lookup {
            frontend: frontend.to_string(),
            service: None,
            verdict: "not a service frontend: connect() is left untouched".into(),
            candidates: Vec::new(),
            affinity_timeout_s: None,
            affinity_entries: 0,
        },
        Some(fe) => {
            let view = dump::services(snap)
                .into_iter()
                .find(|v| v.id == fe.service_id);
            let candidates: Vec<String> = view
                .as_ref()
                .map(|v| {
                    v.slots
                        .iter()
                        .filter(|s| s.slot <= u32::from(fe.count))
                        .map(|s| {
                            s.backend
                                .clone()
                                .unwrap_or_else(|| format!("<missing backend {}>", s.backend_id))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let affinity_entries =
                open_pinned_map(&pins.map(map_name::AFFINITY), map_name::AFFINITY, true)
                    .and_then(read_affinity)
                    .map_or(0, |entries| {
                        entries
                            .iter()
                            .filter(|(k, _)| k.service_id == fe.service_id)
                            .count()
                    });
            let verdict = if fe.count == 0 {
                "no active backend: connect() fails with ECONNREFUSED".to_string()
            } else {
                format!(
                    "connect() goes to one of {} backend(s), chosen at random",
                    fe.count
                )
            };
            Lookup {
                frontend: frontend.to_string(),
                service: view.and_then(|v| v.service),
                verdict,
                candidates,
                affinity_timeout_s: (fe.flags & lb_common::FRONTEND_FLAG_AFFINITY != 0)
                    .then_some(fe.affinity_timeout_s),
                affinity_entries,
            }
        }
    };
    if json {
        return to_json(&result);
    }
    let mut out = format!(
        "frontend  {}\nservice   {}\nverdict   {}\n",
        result.frontend,
        result.service.as_deref().unwrap_or("-"),
        result.verdict
    );
    if let Some(t) = result.affinity_timeout_s {
        let _ = writeln!(
            out,
            "affinity  ClientIP, {t}s; {} client(s) pinned",
            result.affinity_entries
        );
    }
    for (i, c) in result.candidates.iter().enumerate() {
        let _ = writeln!(out, "  slot {} -> {c}", i + 1);
    }
    Ok(out)
}

#[derive(Serialize)]
struct Stats {
    counters: Vec<(String, u64)>,
    maps: Vec<(String, usize, u32)>,
}

fn stats(
    pins: &PinFolder,
    maps: &BpfServiceMaps,
    snap: &MapSnapshot,
    json: bool,
) -> anyhow::Result<String> {
    let counters = named_counters(open_pinned_map(
        &pins.map(map_name::COUNTERS),
        map_name::COUNTERS,
        true,
    )?)?;
    let (sockets, sockets_cap) = sock_state_fill(open_pinned_map(
        &pins.map(map_name::SOCK_STATE),
        map_name::SOCK_STATE,
        true,
    )?)?;
    let affinity = read_affinity(open_pinned_map(
        &pins.map(map_name::AFFINITY),
        map_name::AFFINITY,
        true,
    )?)?;
    let affinity_cap = open_pinned_map(&pins.map(map_name::AFFINITY), map_name::AFFINITY, true)?
        .info()
        .map_or(0, |i| i.max_entries());
    let caps = maps.capacities();
    let stats = Stats {
        counters: counters
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
        maps: vec![
            (
                map_name::FRONTENDS.into(),
                snap.frontends.len(),
                caps.frontends,
            ),
            (map_name::SLOTS.into(), snap.slots.len(), caps.slots),
            (
                map_name::BACKENDS.into(),
                snap.backends.len(),
                caps.backends,
            ),
            (
                map_name::SERVICE_META.into(),
                snap.meta.len(),
                caps.service_meta,
            ),
            (map_name::AFFINITY.into(), affinity.len(), affinity_cap),
            (map_name::SOCK_STATE.into(), sockets, sockets_cap),
        ],
    };
    if json {
        return to_json(&stats);
    }
    let mut t = Table::new(["COUNTER", "TOTAL"]);
    for (n, v) in &stats.counters {
        t.row(vec![n.clone(), v.to_string()]);
    }
    let mut m = Table::new(["MAP", "ENTRIES", "CAPACITY"]);
    for (n, len, cap) in &stats.maps {
        m.row(vec![n.clone(), len.to_string(), cap.to_string()]);
    }
    Ok(format!("{}\n{}", t.render(), m.render()))
}

fn programs(pins: &PinFolder, json: bool) -> anyhow::Result<String> {
    let programs = crate::dataplane::loader::attached_programs(pins)?;
    if json {
        return to_json(&programs);
    }
    let mut t = Table::new(["PROGRAM", "ID", "INSNS", "VERIFIED", "RUNS", "AVG NS"]);
    let opt = |v: Option<u32>| v.map_or_else(|| "-".into(), |v| v.to_string());
    for p in programs {
        let avg = if p.run_count == 0 {
            "-".to_string()
        } else {
            format!("{:.0}", p.run_time_ns as f64 / p.run_count as f64)
        };
        t.row(vec![
            p.name,
            p.id.to_string(),
            opt(p.instructions),
            opt(p.verified_instructions),
            p.run_count.to_string(),
            avg,
        ]);
    }
    Ok(t.render())
}

#[derive(Serialize)]
struct AffinityRow {
    service: String,
    netns_cookie: u64,
    client: Option<String>,
    backend: Option<String>,
    idle_s: f64,
}

fn affinity(pins: &PinFolder, snap: &MapSnapshot, json: bool) -> anyhow::Result<String> {
    let entries = read_affinity(open_pinned_map(
        &pins.map(map_name::AFFINITY),
        map_name::AFFINITY,
        true,
    )?)?;
    let views = dump::services(snap);
    let now = monotonic_ns();
    let rows: Vec<AffinityRow> = entries
        .iter()
        .map(|(k, v)| AffinityRow {
            service: views
                .iter()
                .find(|s| s.id == k.service_id)
                .and_then(|s| s.service.clone())
                .unwrap_or_else(|| format!("<id {}>", k.service_id)),
            netns_cookie: k.netns_cookie,
            client: words_to_ip(k.client, k.family).map(|ip| ip.to_string()),
            backend: snap
                .backends
                .get(&v.backend_id)
                .and_then(backend_from_abi)
                .map(|a| a.to_string()),
            idle_s: now.saturating_sub(v.last_used_ns) as f64 / 1e9,
        })
        .collect();
    if json {
        return to_json(&rows);
    }
    let mut t = Table::new(["SERVICE", "NETNS", "CLIENT", "BACKEND", "IDLE"]);
    for r in rows {
        t.row(vec![
            r.service,
            r.netns_cookie.to_string(),
            r.client.unwrap_or_default(),
            r.backend.unwrap_or_else(|| "<gone>".into()),
            format!("{:.1}s", r.idle_s),
        ]);
    }
    Ok(t.render())
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `bpf_ktime_get_ns()` reads.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
