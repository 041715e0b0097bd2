//! The control plane, in process (the agent's engine over in-memory maps and over real BPF
//! maps) and as the real agent binary (peak memory, time to ready).
use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde::Serialize;
use socklb::{
    agent::Engine,
    dataplane::{
        loader::{Dataplane, LoadConfig, PinFolder, remove_pins},
        maps::{Capacities, InMemoryMaps, ServiceMaps},
    },
    model::{EndpointSlice, ManifestObject, parse_manifests},
    reconcile::Reconciler,
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
    vocab::Kind,
};

use super::{stats::percentile_f64, world::manifests};
use crate::{Sandbox, agent::AgentOptions};

#[derive(Clone, Debug, Serialize)]
pub struct ControlPlaneResult {
    pub maps: String,
    pub services: usize,
    pub endpoints: usize,
    pub full_sync_s: f64,
    pub full_sync_writes: usize,
    pub changes: usize,
    pub change_p50_us: f64,
    pub change_p99_us: f64,
    pub rolling_services: usize,
    pub rolling_updates: usize,
    pub rolling_s: f64,
    pub rolling_p99_us: f64,
}

/// The objects of `services` services with `endpoints` endpoints each, as source events.
pub fn world_events(services: usize, endpoints: usize) -> anyhow::Result<Vec<SourceEvent>> {
    let parsed = parse_manifests("bench", manifests(services, endpoints).as_bytes());
    anyhow::ensure!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    let (mut svcs, mut slices) = (Vec::new(), Vec::new());
    for o in parsed.objects {
        match o {
            ManifestObject::Service(s) => svcs.push(Object::Service(s)),
            ManifestObject::EndpointSlice(s) => slices.push(Object::EndpointSlice(s)),
            ManifestObject::Node(_) => {}
        }
    }
    Ok(vec![
        SourceEvent::Listed {
            kind: Kind::Service,
            objects: svcs,
            keep: Vec::new(),
        },
        SourceEvent::Listed {
            kind: Kind::EndpointSlice,
            objects: slices,
            keep: Vec::new(),
        },
    ])
}

fn slice_of(engine: &Engine<impl ServiceMaps>, i: usize) -> anyhow::Result<EndpointSlice> {
    let key = socklb::model::ObjectKey::new("load", format!("svc-{i}-1"));
    Ok(engine
        .store()
        .slice(&key)
        .context("slice")?
        .as_ref()
        .clone())
}

fn apply(
    engine: &mut Engine<impl ServiceMaps>,
    slice: EndpointSlice,
) -> anyhow::Result<(Duration, usize)> {
    let start = Instant::now();
    engine.handle(SourceEvent::Applied(Object::EndpointSlice(Box::new(slice))));
    let pass = engine.reconcile().context("a change to reconcile")?;
    anyhow::ensure!(pass.report.failed.is_empty(), "{:?}", pass.report.failed);
    Ok((start.elapsed(), pass.report.writes))
}

/// Full sync, then single changes, then a rolling update, on `maps`.
pub fn run(
    label: &str,
    maps: impl ServiceMaps,
    services: usize,
    endpoints: usize,
    changes: usize,
    rolling: usize,
) -> anyhow::Result<ControlPlaneResult> {
    let events = world_events(services, endpoints)?;
    let flags = NodeFlags {
        proxy_name: DEFAULT_PROXY_NAME.into(),
        external_ips: true,
        ..NodeFlags::default()
    };
    let mut engine = Engine::new(Reconciler::new(maps)?, flags);
    let start = Instant::now();
    for e in events {
        engine.handle(e);
    }
    let pass = engine.reconcile().context("the full sync")?;
    let full_sync_s = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        pass.report.failed.is_empty(),
        "{:?}",
        pass.report.failed.iter().next()
    );

    // One EndpointSlice change at a time: an endpoint goes not-ready, later ready again.
    let mut change_times = Vec::with_capacity(changes);
    for c in 0..changes {
        let i = (c * 7919) % services;
        let mut slice = slice_of(&engine, i)?;
        let e = &mut slice.endpoints[c % endpoints];
        e.ready = Some(!e.is_ready());
        change_times.push(apply(&mut engine, slice)?.0.as_secs_f64());
    }

    // A rolling update: every endpoint of `rolling` services replaced, one pod at a time.
    let mut rolling_times = Vec::with_capacity(rolling * endpoints);
    let start = Instant::now();
    for i in 0..rolling {
        for j in 0..endpoints {
            let mut slice = slice_of(&engine, i)?;
            let n = u32::try_from(i * endpoints + j).unwrap_or(0);
            slice.endpoints[j].address = Some(IpAddr::V4(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(10, 200, 0, 0)) + n,
            )));
            slice.endpoints[j].ready = Some(true);
            rolling_times.push(apply(&mut engine, slice)?.0.as_secs_f64());
        }
    }
    let rolling_s = start.elapsed().as_secs_f64();
    Ok(ControlPlaneResult {
        maps: label.into(),
        services,
        endpoints,
        full_sync_s,
        full_sync_writes: pass.report.writes,
        changes,
        change_p50_us: percentile_f64(&change_times, 0.5) * 1e6,
        change_p99_us: percentile_f64(&change_times, 0.99) * 1e6,
        rolling_services: rolling,
        rolling_updates: rolling_times.len(),
        rolling_s,
        rolling_p99_us: percentile_f64(&rolling_times, 0.99) * 1e6,
    })
}

pub fn in_memory(
    services: usize,
    endpoints: usize,
    changes: usize,
    rolling: usize,
) -> anyhow::Result<ControlPlaneResult> {
    run(
        "in-memory",
        InMemoryMaps::new(),
        services,
        endpoints,
        changes,
        rolling,
    )
}

/// The same against real BPF maps (loaded into a cgroup of the sandbox's with no process in
/// it, pinned in the sandbox's bpffs, removed afterwards).
pub fn bpf_maps(
    sandbox: &Sandbox,
    services: usize,
    endpoints: usize,
    changes: usize,
    rolling: usize,
) -> anyhow::Result<ControlPlaneResult> {
    let pins = sandbox.pin_mount.join("controlplane");
    let cgroup = sandbox.extra_cgroup("controlplane")?;
    let dataplane = Dataplane::load(&LoadConfig {
        pin_folder: pins.clone(),
        cgroup,
        capacities: Capacities::default(),
        log_level: 0,
        record_tcp: true,
    })?;
    let maps = dataplane.service_maps()?;
    let result = run("BPF maps", maps, services, endpoints, changes, rolling);
    drop(dataplane);
    remove_pins(&PinFolder::new(&pins))?;
    result
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentFootprint {
    pub services: usize,
    pub endpoints: usize,
    pub ready_s: f64,
    pub peak_rss_mib: f64,
    pub rss_mib: f64,
}

fn status_kib(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("{field} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0))
}

/// The real agent on a manifests folder of `services` × `endpoints`: time to ready and peak RSS.
pub fn agent_footprint(
    sandbox: &Sandbox,
    services: usize,
    endpoints: usize,
) -> anyhow::Result<AgentFootprint> {
    for entry in std::fs::read_dir(sandbox.manifests())? {
        std::fs::remove_file(entry?.path())?;
    }
    if sandbox.pin_folder().exists() {
        remove_pins(&PinFolder::new(sandbox.pin_folder()))?;
    }
    sandbox.write_manifest("load.yaml", &manifests(services, endpoints))?;
    let start = Instant::now();
    let agent = sandbox.start_agent(&AgentOptions {
        ready_timeout: Some(Duration::from_mins(3)),
        ..AgentOptions::default()
    })?;
    let ready_s = start.elapsed().as_secs_f64();
    let pid = agent.pid().context("agent pid")?;
    let footprint = AgentFootprint {
        services,
        endpoints,
        ready_s,
        peak_rss_mib: status_kib(pid, "VmHWM:")? / 1024.0,
        rss_mib: status_kib(pid, "VmRSS:")? / 1024.0,
    };
    drop(agent);
    Ok(footprint)
}
