//! The control plane, in process (the agent's engine over in-memory maps and over real BPF
//! maps) and as the real agent binary (peak memory, time to ready).
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::{MapId, MapKind};
use serde::Serialize;
use serde_json::{Value, json};
use socklb::{
    agent::Engine,
    dataplane::{
        abi::{backend_addr, frontend_key},
        bpf::{BpfServiceMaps, ReadOnlyMaps},
        loader::{Dataplane, LoadConfig, remove_pins},
        maps::{
            Capacities, InMemoryMaps, MapReadError, MapSnapshot, MapWrite, MapWriteError,
            ServiceMaps,
        },
        pins::PinFolder,
    },
    model::{EndpointSlice, ManifestObject, parse_manifests},
    reconcile::Reconciler,
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
    vocab::{Kind, Protocol, ServiceAddr},
};

use super::{
    stats::{Spread, percentile_f64},
    world::{HTTP_PORT, manifests, vip_of},
};
use crate::{Sandbox, agent::AgentOptions, apiserver::ApiServer};

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

pub fn flags() -> NodeFlags {
    NodeFlags {
        proxy_name: DEFAULT_PROXY_NAME.into(),
        external_ips: true,
        ..NodeFlags::default()
    }
}

/// The engine's full sync of `events` onto `maps`: (engine, seconds, writes).
fn full_sync<M: ServiceMaps>(
    maps: M,
    events: Vec<SourceEvent>,
) -> anyhow::Result<(Engine<M>, f64, usize)> {
    let mut engine = Engine::new(Reconciler::new(maps)?, flags());
    let start = Instant::now();
    for e in events {
        engine.handle(e);
    }
    let pass = engine.reconcile().context("the full sync")?;
    let secs = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        pass.report.failed.is_empty(),
        "{:?}",
        pass.report.failed.iter().next()
    );
    Ok((engine, secs, pass.report.writes))
}

/// Maps that remember every write they were given (to replay them as the floor).
struct Recording<M> {
    inner: M,
    writes: Arc<Mutex<Vec<MapWrite>>>,
}

impl<M: ServiceMaps> ServiceMaps for Recording<M> {
    fn queue_writes(&self) -> bool {
        self.inner.queue_writes()
    }

    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        self.writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(write.clone());
        self.inner.write(write)
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        self.inner.read_all()
    }

    fn capacities(&self) -> Capacities {
        self.inner.capacities()
    }
}

/// Maps that add up the time spent inside their writes (the system calls, on real maps), so a
/// full sync's time splits into its writes and the agent's own work around them. A separate
/// pass from the timed one: two clock reads per write would move the figure they explain.
struct TimedWrites<M> {
    inner: M,
    inside: Duration,
}

impl<M: ServiceMaps> ServiceMaps for TimedWrites<M> {
    fn queue_writes(&self) -> bool {
        self.inner.queue_writes()
    }

    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        let start = Instant::now();
        let result = self.inner.write(write);
        self.inside += start.elapsed();
        result
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        self.inner.read_all()
    }

    fn capacities(&self) -> Capacities {
        self.inner.capacities()
    }
}

/// One full sync of `services` x `endpoints` through the engine into maps that discard every
/// write: translation and diff only (seconds).
pub fn translate_and_diff_secs(services: usize, endpoints: usize) -> anyhow::Result<f64> {
    Ok(full_sync(Discard, world_events(services, endpoints)?)?.1)
}

/// Maps that discard every write, as if they lived outside the process (BPF maps do): the
/// engine's own work alone.
pub struct Discard;

impl ServiceMaps for Discard {
    fn write(&mut self, _: &MapWrite) -> Result<(), MapWriteError> {
        Ok(())
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        Ok(MapSnapshot::default())
    }

    fn capacities(&self) -> Capacities {
        Capacities::default()
    }
}

/// Full sync against its floors, `passes` times: the engine writing nowhere (translation and
/// diff alone), the engine on fresh real BPF maps, and a bare loop writing the same entries to
/// fresh real BPF maps (the map-write floor).
#[derive(Clone, Debug, Serialize)]
pub struct FullSync {
    pub services: usize,
    pub endpoints: usize,
    pub writes: usize,
    /// The engine writing nowhere: translation and diff alone.
    pub in_memory_s: Spread,
    pub real_maps_s: Spread,
    /// CPU time of the process over the same sync (the reconciler's thread and the thread its
    /// writes run on), and over the bare loop.
    pub real_maps_cpu_s: Spread,
    pub write_floor_cpu_s: Spread,
    pub write_floor_s: Spread,
    /// real maps ÷ the write floor, per pass.
    pub ratio: Spread,
    /// Time inside the maps' writes during another full sync on fresh real maps (each write
    /// timed, on the thread the writes run on), and the same for the bare loop: the writes'
    /// own cost in each.
    pub engine_writes_s: Spread,
    pub floor_writes_s: Spread,
    /// The rest of that full sync's wall time: what its writes, on a thread of their own, do
    /// not account for (compare `in_memory_s`, the agent's work with no write leaving the
    /// process).
    pub engine_outside_s: Spread,
    /// `engine_outside_s` ÷ `in_memory_s`, per pass: how much slower the agent's own work is
    /// among real writes than with none.
    pub outside_ratio: Spread,
    /// `engine_writes_s` ÷ `floor_writes_s`, per pass: how much slower the same writes are among
    /// the agent's work than back to back.
    pub writes_ratio: Spread,
}

fn fresh_maps(sandbox: &Sandbox, name: &str) -> anyhow::Result<(Dataplane, BpfServiceMaps)> {
    let pins = sandbox.pin_mount.join(name);
    if pins.exists() {
        remove_pins(&PinFolder::new(&pins))?;
    }
    let cgroup = sandbox
        .cgroup
        .parent()
        .context("cgroup parent")?
        .join(format!(
            "{}-{name}",
            sandbox
                .cgroup
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("sbx")
        ));
    let cgroup = if cgroup.exists() {
        cgroup
    } else {
        sandbox.extra_cgroup(name)?
    };
    let dataplane = Dataplane::load(&LoadConfig {
        pin_folder: pins,
        cgroup,
        capacities: Capacities::default(),
        log_level: 0,
        record_tcp: true,
        disabled: std::collections::BTreeSet::new(),
        max_sockets_per_pod: None,
    })?;
    let maps = dataplane.service_maps()?;
    Ok((dataplane, maps))
}

fn drop_maps(sandbox: &Sandbox, name: &str, dataplane: Dataplane) -> anyhow::Result<()> {
    drop(dataplane);
    remove_pins(&PinFolder::new(sandbox.pin_mount.join(name)))?;
    Ok(())
}

/// The CPU time this process has used, every thread, user and system (s).
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &raw mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

pub fn full_sync_floor(
    sandbox: &Sandbox,
    services: usize,
    endpoints: usize,
    passes: usize,
) -> anyhow::Result<FullSync> {
    let (mut mem, mut real, mut floor, mut ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut engine_writes, mut engine_outside, mut floor_writes, mut writes_ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut outside_ratio = Vec::new();
    let (mut real_cpu, mut floor_cpu) = (Vec::new(), Vec::new());
    let mut writes = 0;
    for _ in 0..passes {
        let (_, in_memory, _) = full_sync(Discard, world_events(services, endpoints)?)?;
        mem.push(in_memory);
        let recorded = Arc::new(Mutex::new(Vec::new()));
        full_sync(
            Recording {
                inner: InMemoryMaps::new(),
                writes: recorded.clone(),
            },
            world_events(services, endpoints)?,
        )?;
        let recorded = std::mem::take(
            &mut *recorded
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        writes = recorded.len();

        let (dataplane, maps) = fresh_maps(sandbox, "fullsync")?;
        let events = world_events(services, endpoints)?;
        let cpu = process_cpu_s();
        let (engine, secs, _) = full_sync(maps, events)?;
        real_cpu.push(process_cpu_s() - cpu);
        drop(engine);
        drop_maps(sandbox, "fullsync", dataplane)?;
        real.push(secs);

        let (dataplane, mut maps) = fresh_maps(sandbox, "fullsync")?;
        let cpu = process_cpu_s();
        let start = Instant::now();
        for w in &recorded {
            maps.write(w)?;
        }
        let bare = start.elapsed().as_secs_f64();
        floor_cpu.push(process_cpu_s() - cpu);
        drop(maps);
        drop_maps(sandbox, "fullsync", dataplane)?;
        floor.push(bare);
        ratio.push(secs / bare);

        let (dataplane, maps) = fresh_maps(sandbox, "fullsync")?;
        let timed = TimedWrites {
            inner: maps,
            inside: Duration::ZERO,
        };
        let (engine, total, _) = full_sync(timed, world_events(services, endpoints)?)?;
        let inside = engine.reconciler().maps().inside.as_secs_f64();
        engine_outside.push(total - inside);
        outside_ratio.push((total - inside) / in_memory);
        drop(engine);
        drop_maps(sandbox, "fullsync", dataplane)?;
        let (dataplane, maps) = fresh_maps(sandbox, "fullsync")?;
        let mut timed = TimedWrites {
            inner: maps,
            inside: Duration::ZERO,
        };
        for w in &recorded {
            timed.write(w)?;
        }
        let bare_inside = timed.inside.as_secs_f64();
        drop(timed);
        drop_maps(sandbox, "fullsync", dataplane)?;
        engine_writes.push(inside);
        floor_writes.push(bare_inside);
        writes_ratio.push(inside / bare_inside);
    }
    Ok(FullSync {
        services,
        endpoints,
        writes,
        in_memory_s: Spread::of(&mem),
        real_maps_s: Spread::of(&real),
        real_maps_cpu_s: Spread::of(&real_cpu),
        write_floor_cpu_s: Spread::of(&floor_cpu),
        write_floor_s: Spread::of(&floor),
        ratio: Spread::of(&ratio),
        engine_writes_s: Spread::of(&engine_writes),
        floor_writes_s: Spread::of(&floor_writes),
        engine_outside_s: Spread::of(&engine_outside),
        outside_ratio: Spread::of(&outside_ratio),
        writes_ratio: Spread::of(&writes_ratio),
    })
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
    let (mut engine, full_sync_s, writes) = full_sync(maps, events)?;

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
        full_sync_writes: writes,
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
    let (dataplane, maps) = fresh_maps(sandbox, "controlplane")?;
    let result = run("BPF maps", maps, services, endpoints, changes, rolling);
    drop_maps(sandbox, "controlplane", dataplane)?;
    result
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

/// A Service and its slices as a real cluster serves them: uid, creation time, selector, two
/// slices of five endpoints each with targetRef, nodeName, zone and hints, owner references and
/// the trigger-time annotation.
pub fn realistic_objects(i: usize, endpoints_per_slice: usize) -> Vec<Value> {
    let name = format!("svc-{i}");
    let uid = |what: &str| format!("{i:08x}-{what:0>4}-4000-8000-{:012x}", i * 7 + what.len());
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": name, "namespace": "load", "uid": uid("svc"),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": name, "team": format!("team-{}", i % 20)},
        },
        "spec": {
            "type": "ClusterIP", "clusterIP": vip_of(i).to_string(),
            "clusterIPs": [vip_of(i).to_string()], "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster", "selector": {"app": name},
            "ports": [{"name": "http", "port": HTTP_PORT, "protocol": "TCP", "targetPort": 8080}],
        },
    });
    let mut out = vec![service];
    for s in 0..2 {
        let endpoints: Vec<Value> = (0..endpoints_per_slice)
            .map(|j| {
                let n = u32::try_from((i * 2 + s) * endpoints_per_slice + j).unwrap_or(0);
                let zone = format!("zone-{}", ["a", "b", "c"][(n % 3) as usize]);
                json!({
                    "addresses": [Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n).to_string()],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": format!("node-{}", n % 100),
                    "zone": zone,
                    "hints": {"forZones": [{"name": zone}]},
                    "targetRef": {
                        "kind": "Pod", "namespace": "load",
                        "name": format!("{name}-7d9f8c6b5-{n:05x}"), "uid": uid(&format!("p{j}")),
                    },
                })
            })
            .collect();
        out.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{name}-{s}"), "namespace": "load", "generateName": format!("{name}-"),
                "uid": uid(&format!("sl{s}")),
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Service", "name": name, "uid": uid("svc"),
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        }));
    }
    out
}

/// One map's memory as the kernel accounts it (`memlock` in the map's fdinfo).
#[derive(Clone, Debug, Serialize)]
pub struct MapMemory {
    pub map: String,
    pub kind: String,
    pub capacity: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub preallocated: bool,
    pub bytes: u64,
}

/// The agent against the API stand-in with realistic objects.
#[derive(Clone, Debug, Serialize)]
pub struct ApiMode {
    pub services: usize,
    pub endpoints_per_service: usize,
    pub ready_s: f64,
    pub peak_rss_mib: f64,
    pub rss_mib: f64,
    pub maps: Vec<MapMemory>,
    pub map_mib: f64,
    pub changes: usize,
    /// EndpointSlice written to the API → the maps hold the new endpoint.
    pub change_p50_ms: f64,
    pub change_p99_ms: f64,
    pub change_max_ms: f64,
}

fn status_of(pid: u32) -> anyhow::Result<(f64, f64)> {
    Ok((
        status_kib(pid, "VmHWM:")? / 1024.0,
        status_kib(pid, "VmRSS:")? / 1024.0,
    ))
}

/// Every map's memory in the pin folder's current generation.
pub fn map_memory(pins: &std::path::Path) -> anyhow::Result<Vec<MapMemory>> {
    let dir = PinFolder::new(pins)
        .current()
        .context("no map generation pinned")?;
    let maps = ReadOnlyMaps::new(dir);
    let mut out = Vec::new();
    for id in MapId::ALL {
        let d = id.descriptor();
        let (capacity, bytes) = maps.footprint(id)?;
        out.push(MapMemory {
            map: d.name.into(),
            kind: match d.kind {
                MapKind::Hash => "hash",
                MapKind::Array => "array",
                MapKind::PerCpuArray => "per-CPU array",
                MapKind::LruHash => "LRU hash",
                MapKind::SkStorage => "socket storage",
                MapKind::RingBuf => "ring buffer",
            }
            .into(),
            capacity,
            key_size: d.key_size,
            value_size: d.value_size,
            preallocated: d.preallocated,
            bytes,
        });
    }
    Ok(out)
}

/// The agent in API mode on `services` realistic services: time to ready, memory, then
/// `changes` EndpointSlice changes through the API, each timed until the maps show it.
pub fn api_mode(sandbox: &Sandbox, services: usize, changes: usize) -> anyhow::Result<ApiMode> {
    api_mode_with(sandbox, services, changes, Vec::new())
}

/// [`api_mode`] with extra environment variables for the agent (to try allocator settings).
pub fn api_mode_with(
    sandbox: &Sandbox,
    services: usize,
    changes: usize,
    env: Vec<(String, String)>,
) -> anyhow::Result<ApiMode> {
    const PER_SLICE: usize = 5;
    if sandbox.pin_folder().exists() {
        remove_pins(&PinFolder::new(sandbox.pin_folder()))?;
    }
    let api = ApiServer::start()?;
    api.apply_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-3", "labels": {"topology.kubernetes.io/zone": "zone-b"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.3"}]},
    }))?;
    let mut slices: Vec<Value> = Vec::with_capacity(services * 2);
    for i in 0..services {
        let mut objects = realistic_objects(i, PER_SLICE).into_iter();
        if let Some(svc) = objects.next() {
            api.apply_value(svc)?;
        }
        for sl in objects {
            api.apply_value(sl.clone())?;
            slices.push(sl);
        }
    }
    let kubeconfig = sandbox.workdir.join("bench-kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let start = Instant::now();
    let agent = sandbox.start_agent(&AgentOptions {
        kubeconfig: Some(kubeconfig),
        args: vec!["--node-name".into(), "node-3".into()],
        ready_timeout: Some(Duration::from_mins(3)),
        env,
        ..AgentOptions::default()
    })?;
    let ready_s = start.elapsed().as_secs_f64();
    let pid = agent.pid().context("agent pid")?;
    let dir = PinFolder::new(sandbox.pin_folder())
        .current()
        .context("no map generation")?;
    let maps = BpfServiceMaps::open(&dir, true)?;
    let mut latencies = Vec::with_capacity(changes);
    for c in 0..changes {
        let i = (c * 7919) % services;
        let mut slice = slices[i * 2].clone();
        let n = u32::try_from(c).unwrap_or(0);
        let fresh = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 1)) + n);
        // A new pod in this node's zone, so topology hints keep it for this node.
        slice["endpoints"][0]["addresses"] = json!([fresh.to_string()]);
        slice["endpoints"][0]["zone"] = json!("zone-b");
        slice["endpoints"][0]["hints"] = json!({"forZones": [{"name": "zone-b"}]});
        slices[i * 2] = slice.clone();
        let key = frontend_key(ServiceAddr::new(vip_of(i).into(), HTTP_PORT, Protocol::Tcp));
        let want = SocketAddr::new(fresh.into(), 8080);
        let t0 = Instant::now();
        api.apply_value(slice)?;
        loop {
            let seen = maps
                .lookup(&key)?
                .is_some_and(|(_, b)| b.iter().any(|b| backend_addr(b) == Some(want)));
            if seen {
                break;
            }
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(10),
                "change {c} to svc-{i} never reached the maps"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        latencies.push(t0.elapsed().as_secs_f64());
    }
    // A running agent counts its connection slots and takes a census of the live sockets every
    // `REFRESH` (the first at start, before the listing): the peak is read after one at full size.
    let settled = start + socklb::agent::CENSUS_EVERY + Duration::from_secs(2);
    std::thread::sleep(settled.saturating_duration_since(Instant::now()));
    let (peak_rss_mib, rss_mib) = status_of(pid)?;
    let maps_memory = map_memory(&sandbox.pin_folder())?;
    let map_mib = maps_memory.iter().map(|m| m.bytes as f64).sum::<f64>() / (1024.0 * 1024.0);
    drop(agent);
    Ok(ApiMode {
        services,
        endpoints_per_service: 2 * PER_SLICE,
        ready_s,
        peak_rss_mib,
        rss_mib,
        maps: maps_memory,
        map_mib,
        changes,
        change_p50_ms: percentile_f64(&latencies, 0.5) * 1e3,
        change_p99_ms: percentile_f64(&latencies, 0.99) * 1e3,
        change_max_ms: percentile_f64(&latencies, 1.0) * 1e3,
    })
}
