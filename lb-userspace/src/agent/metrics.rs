//! Prometheus metrics: sync timings as kube-proxy reports them, map fill, errors by kind,
//! address conflicts, build and process information, and the data path's per-CPU counters
//! summed.
//!
//! A scrape never walks a map: it reads the `COUNTERS` per-CPU array (one lookup per counter)
//! and values cached by the agent loop and by a background refresh (`refresh_affinity`).
//!
//! Two formats: the Prometheus text format 0.0.4 (the default, and what `promtool check
//! metrics` reads) and `OpenMetrics` 1.0.0 when the scraper asks for it (`Accept`). The
//! registry encodes `OpenMetrics`; `to_prometheus_text` turns it into the text format (counter
//! families named with their `_total` samples, info families as gauges, no `# UNIT` or
//! `# EOF`).
use std::{
    path::{Path, PathBuf},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray};
use lb_common::{AffinityTable, Counter as DpCounter, MapId};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Metric, Registry},
};

use super::engine::{Engine, Pass};
use crate::{
    dataplane::{
        bpf::{ReadOnlyMaps, open_map},
        features::Features,
        maps::ServiceMaps,
        sockets::quota::Recount,
    },
    vocab::ErrorKind,
};

type Labels = Vec<(String, String)>;

/// The Prometheus text format, what Prometheus asks for when it does not ask for `OpenMetrics`.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `OpenMetrics` 1.0.0.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How often, at most, the agent counts the `AFFINITY` map's clients (a bounded key walk).
pub const AFFINITY_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

/// The exposition format of one scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// `OpenMetrics` 1.0.0.
    OpenMetrics,
}

impl Format {
    /// Picks the format from an `Accept` header as Prometheus' own client libraries do: the
    /// acceptable media range with the highest `q` that names a format we speak decides (the
    /// first one on a tie); `OpenMetrics` only when asked for, the text format otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Text;
        };
        let mut ranges: Vec<(f32, Self)> = Vec::new();
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let mut q = 1.0_f32;
            let mut version = None;
            for param in parts {
                let Some((k, v)) = param.split_once('=') else {
                    continue;
                };
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => q = v.trim().parse().unwrap_or(0.0),
                    "version" => version = Some(v.trim().trim_matches('"').to_string()),
                    _ => {}
                }
            }
            let format = match (media.as_str(), version.as_deref()) {
                ("application/openmetrics-text", None | Some("1.0.0" | "0.0.1")) => {
                    Self::OpenMetrics
                }
                ("text/plain", None | Some("0.0.4")) => Self::Text,
                _ => continue,
            };
            if q > 0.0 {
                ranges.push((q, format));
            }
        }
        // Stable: the first of equal q wins.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges.first().map_or(Self::Text, |(_, f)| *f)
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => CONTENT_TYPE_TEXT,
            Self::OpenMetrics => CONTENT_TYPE_OPENMETRICS,
        }
    }
}

pub struct Metrics {
    pub registry: Registry,
    sync_duration: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    programming_duration: Histogram,
    sync_lag: Gauge<f64, AtomicU64>,
    map_entries: Family<Labels, Gauge>,
    map_capacity: Family<Labels, Gauge>,
    errors: Family<Labels, Counter>,
    writes: Counter,
    services: Gauge,
    failing_services: Gauge,
    conflicts: Gauge,
    refused_addresses: Gauge,
    health_check_ports_failing: Gauge,
    rejected_objects: Counter,
    rejected_now: Gauge,
    udp_terminated: Counter,
    retries: Counter,
    seen_retries: AtomicU64,
    sockets: SocketMetrics,
    /// Last cumulative values seen, to turn totals into counter increments.
    seen_errors: Mutex<std::collections::BTreeMap<ErrorKind, u64>>,
    seen_rejected: AtomicU64,
    maps_dir: PathBuf,
    /// `AFFINITY`'s capacity, read once.
    affinity_capacity: Option<u32>,
}

/// kube-proxy's `sync_proxy_rules_duration_seconds` buckets: 1 ms doubling to about 16 s.
fn sync_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 15)
}

/// kube-proxy's `network_programming_duration_seconds` buckets: 0.25 s to 5 min.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..60).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

fn map_labels(map: MapId) -> Labels {
    vec![("map".to_string(), map.name().to_string())]
}

/// Sync and network programming durations.
fn histograms(r: &mut Registry) -> [Histogram; 2] {
    [
        (
            "sync_duration_seconds",
            "Time of one sync, full or partial, from translation to the last map write \
             (kube-proxy's sync_proxy_rules_duration_seconds)",
            sync_buckets().collect(),
        ),
        (
            "network_programming_duration_seconds",
            "From an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time) \
             to the maps serving it (kube-proxy's network_programming_duration_seconds)",
            programming_buckets(),
        ),
    ]
    .map(|(name, help, buckets): (_, _, Vec<f64>)| register(r, name, help, Histogram::new(buckets)))
}

/// Registers a metric and hands back a handle on it.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Sets the entries and capacity of the maps the reconciler does not hold (their size is fixed
/// while the agent runs); returns `AFFINITY`'s capacity.
fn fixed_sizes(
    maps_dir: &Path,
    entries: &Family<Labels, Gauge>,
    capacities: &Family<Labels, Gauge>,
) -> Option<u32> {
    let read_only = ReadOnlyMaps::new(maps_dir);
    let mut affinity = None;
    for map in [
        MapId::Affinity,
        MapId::SocketQuota,
        MapId::AffinityEmpty,
        MapId::Config,
        MapId::Counters,
    ] {
        let Ok((capacity, _)) = read_only.footprint(map) else {
            continue;
        };
        capacities
            .get_or_create(&map_labels(map))
            .set(i64::from(capacity));
        if map == MapId::Affinity {
            affinity = Some(capacity);
        } else if map == MapId::SocketQuota {
            // Client counts: set at each recount.
            entries.get_or_create(&map_labels(map)).set(0);
        } else {
            // Arrays: every entry exists.
            entries
                .get_or_create(&map_labels(map))
                .set(i64::from(capacity));
        }
    }
    affinity
}

/// The translated sockets: records per client at each recount, live connections at each
/// census.
struct SocketMetrics {
    records: Gauge,
    clients_at_bound: Gauge,
    live: Family<Labels, Gauge>,
    listing_seconds: Gauge<f64, AtomicU64>,
}

impl SocketMetrics {
    fn register(r: &mut Registry) -> Self {
        let [records, clients_at_bound] = [
            (
                "socket_records",
                "Socket records (translated sockets) held for all clients, at the last recount",
            ),
            (
                "socket_clients_at_bound",
                "Client cgroups holding as many socket records as one may \
                 (--max-sockets-per-pod), at the last recount",
            ),
        ]
        .map(|(name, help)| register(r, name, help, Gauge::default()));
        let live = register(
            r,
            "live_sockets",
            "Translated TCP sockets (any state) and connected UDP sockets, by service port, \
             protocol and the backend's condition (ready, serving-terminating, terminating, \
             not-ready, gone), counted every 15 s",
            Family::<Labels, Gauge>::default(),
        );
        let listing_seconds = register(
            r,
            "live_sockets_listing_seconds",
            "How long the last count of the live sockets took",
            Gauge::<f64, AtomicU64>::default(),
        );
        Self {
            records,
            clients_at_bound,
            live,
            listing_seconds,
        }
    }
}

/// `socklb_feature_enabled{feature}`: decided at start, fixed for the agent's life.
fn register_features(r: &mut Registry, features: &Features) {
    let feature_enabled: Family<Labels, Gauge> = register(
        r,
        "feature_enabled",
        "Whether each optional part of the data path is on (1) or off (0: refused by the \
         kernel or turned off with --disable-feature; /status says why)",
        Family::default(),
    );
    for probe in &features.probes {
        feature_enabled
            .get_or_create(&vec![("feature".to_string(), probe.feature.to_string())])
            .set(i64::from(features.enabled(probe.feature)));
    }
}

/// The gauges the agent sets from its state after each pass.
fn state_gauges(r: &mut Registry) -> [Gauge; 6] {
    [
        (
            "service_ports",
            "Backend sets (service port, family, scope) in the maps",
        ),
        (
            "failing_service_ports",
            "Backend sets left on their previous state after a failed write",
        ),
        (
            "address_conflicts",
            "Service addresses claimed by a Service that does not own them (not written)",
        ),
        (
            "rejected_objects_current",
            "Services, EndpointSlices and manifest documents rejected now (their last good \
             version, if any, stays in effect); 0 once every one is fixed",
        ),
        (
            "refused_addresses",
            "Addresses Services name that are never a frontend (loopback, unspecified, \
             link-local, multicast, this node's own but as a NodePort); /status names them",
        ),
        (
            "health_check_ports_failing",
            "healthCheckNodePorts this node should serve but does not (the port would not \
             listen, or another Service has it); /status says why",
        ),
    ]
    .map(|(name, help)| register(r, name, help, Gauge::default()))
}

/// The counters of what the agent did.
fn event_counters(r: &mut Registry) -> [Counter; 4] {
    [
        ("map_writes", "Map writes done by the reconciler"),
        (
            "rejected_objects",
            "Rejections of Services, EndpointSlices and manifest documents (each problem \
             counted once; socklb_rejected_objects_current is how many stand now)",
        ),
        (
            "udp_sockets_terminated",
            "Connected UDP sockets destroyed because their backend stopped serving",
        ),
        (
            "retries",
            "Retries of backend sets whose write failed (each set backs off from 0.5 s to \
             60 s)",
        ),
    ]
    .map(|(name, help)| register(r, name, help, Counter::default()))
}

impl Metrics {
    /// The agent's metrics over the maps pinned in `maps_dir`. Reads the capacity of the maps
    /// the reconciler does not hold once, here.
    pub fn new(maps_dir: PathBuf, features: &Features) -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(Process::new()));
        let r = root.sub_registry_with_prefix("socklb");
        let [sync_duration, programming_duration] = histograms(r);
        let [last_sync, sync_lag] = [
            (
                "last_sync_timestamp_seconds",
                "When the last sync without a failed write ended, in seconds since the Unix \
                 epoch (kube-proxy's sync_proxy_rules_last_timestamp_seconds)",
            ),
            (
                "sync_lag_seconds",
                "From the first event of the last batch to its map writes being done",
            ),
        ]
        .map(|(name, help)| register(r, name, help, Gauge::<f64, AtomicU64>::default()));
        let [map_entries, map_capacity] = [
            (
                "map_entries",
                "Entries in use in each map (AFFINITY: client tables, counted every 30 s; SOCKET_QUOTA: clients with socket records, at the last recount)",
            ),
            ("map_capacity", "Capacity of each map, in entries"),
        ]
        .map(|(name, help)| register(r, name, help, Family::<Labels, Gauge>::default()));
        let errors = register(r, "errors", "Errors by kind", Family::default());
        let [
            services,
            failing_services,
            conflicts,
            rejected_now,
            refused_addresses,
            health_check_ports_failing,
        ] = state_gauges(r);
        let [writes, rejected_objects, udp_terminated, retries] = event_counters(r);
        register_features(r, features);
        let sockets = SocketMetrics::register(r);
        r.register(
            "build",
            "The socklb version and git commit of the running agent",
            Info::new(vec![
                ("version".to_string(), crate::status::VERSION.to_string()),
                ("commit".to_string(), crate::status::COMMIT.to_string()),
            ]),
        );
        r.register_collector(Box::new(Datapath {
            dir: maps_dir.clone(),
            counters: Mutex::new(None),
        }));
        let affinity_capacity = fixed_sizes(&maps_dir, &map_entries, &map_capacity);
        Self {
            registry: root,
            sync_duration,
            last_sync,
            programming_duration,
            sync_lag,
            map_entries,
            map_capacity,
            errors,
            writes,
            services,
            failing_services,
            conflicts,
            refused_addresses,
            health_check_ports_failing,
            rejected_objects,
            rejected_now,
            udp_terminated,
            retries,
            seen_retries: AtomicU64::new(0),
            sockets,
            seen_errors: Mutex::new(std::collections::BTreeMap::new()),
            seen_rejected: AtomicU64::new(0),
            maps_dir,
            affinity_capacity,
        }
    }

    pub fn record_pass(&self, pass: &Pass) {
        let seconds = pass.duration.as_secs_f64();
        self.sync_duration.observe(seconds);
        if pass.report.failed.is_empty() {
            self.last_sync.set(unix_seconds(SystemTime::now()));
        }
        for latency in &pass.programming_latencies {
            self.programming_duration.observe(latency.as_secs_f64());
        }
        if let Some(lag) = pass.lag {
            self.sync_lag.set(lag.as_secs_f64());
        }
        self.writes.inc_by(pass.report.writes as u64);
    }

    /// Refreshes gauges and error counters from the engine's state.
    pub fn record_state<M: ServiceMaps>(&self, engine: &Engine<M>, health_checks_failing: usize) {
        self.health_check_ports_failing
            .set(gauge(health_checks_failing));
        let r = engine.reconciler();
        let snap = r.snapshot();
        let caps = r.maps().capacities();
        let ranges = r.ranges();
        let used_backends = (ranges.capacity() - ranges.free_len()) as usize;
        let sizes = [
            MapId::Frontends4,
            MapId::Frontends6,
            MapId::ServiceMeta,
            MapId::Ports,
        ]
        .map(|map| (map, snap.entries(map).unwrap_or_default()))
        .into_iter()
        .chain([(MapId::Backends, used_backends)]);
        for (map, len) in sizes {
            let labels = map_labels(map);
            self.map_entries.get_or_create(&labels).set(gauge(len));
            self.map_capacity
                .get_or_create(&labels)
                .set(i64::from(caps.get(map)));
        }
        self.services.set(gauge(r.service_count()));
        self.failing_services.set(gauge(r.failed().len()));
        self.conflicts
            .set(gauge(engine.conflicts().values().map(Vec::len).sum()));
        let mut seen = self
            .seen_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (kind, total) in &r.stats().errors {
            let last = seen.entry(*kind).or_default();
            if *total > *last {
                self.errors
                    .get_or_create(&vec![("kind".to_string(), kind.metric_label().to_string())])
                    .inc_by(*total - *last);
                *last = *total;
            }
        }
        self.rejected_now.set(gauge(engine.rejected().len()));
        self.refused_addresses
            .set(gauge(engine.refused().values().map(Vec::len).sum()));
        let retries = engine.retries();
        let last = self.seen_retries.swap(retries, Ordering::Relaxed);
        if retries > last {
            self.retries.inc_by(retries - last);
        }
        let rejected_total = engine.rejected_total();
        let last = self.seen_rejected.swap(rejected_total, Ordering::Relaxed);
        if rejected_total > last {
            self.rejected_objects.inc_by(rejected_total - last);
        }
    }

    pub fn record_udp_terminated(&self, sockets: usize) {
        self.udp_terminated.inc_by(sockets as u64);
    }

    /// Replaces the live-socket counts with those of `view` (series that dropped to zero go).
    pub fn record_connections(
        &self,
        view: &crate::dataplane::sockets::view::ConnectionsView,
        took: std::time::Duration,
    ) {
        let mut counts: std::collections::BTreeMap<Labels, usize> =
            std::collections::BTreeMap::new();
        for service in &view.services {
            let name = service.service.as_ref().map_or_else(
                || "<gone>".to_string(),
                |k| format!("{}:{}", k.service, k.port_name),
            );
            for b in &service.backends {
                for (protocol, n) in [("tcp", b.tcp.values().sum::<usize>()), ("udp", b.udp)] {
                    if n > 0 {
                        *counts
                            .entry(vec![
                                ("service".to_string(), name.clone()),
                                ("protocol".to_string(), protocol.to_string()),
                                ("condition".to_string(), b.condition.name().to_string()),
                            ])
                            .or_default() += n;
                    }
                }
            }
        }
        self.sockets.live.clear();
        for (labels, n) in counts {
            self.sockets.live.get_or_create(&labels).set(gauge(n));
        }
        self.sockets.listing_seconds.set(took.as_secs_f64());
    }

    pub fn record_recount(&self, recount: &Recount) {
        self.map_entries
            .get_or_create(&map_labels(MapId::SocketQuota))
            .set(gauge(recount.clients_after));
        self.sockets
            .records
            .set(i64::try_from(recount.records).unwrap_or(i64::MAX));
        self.sockets.clients_at_bound.set(gauge(recount.at_bound));
    }

    pub fn record_error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&vec![("kind".to_string(), kind.metric_label().to_string())])
            .inc();
    }

    /// Counts the `AFFINITY` map's client tables: a walk over its keys, bounded by its
    /// capacity. Blocking; the agent runs it off the scrape path, every `AFFINITY_REFRESH`.
    pub fn refresh_affinity(&self) {
        let Some(capacity) = self.affinity_capacity else {
            return;
        };
        let map = MapId::Affinity;
        let Ok(data) = open_map(&self.maps_dir, map, true) else {
            return;
        };
        let Ok(lru) =
            Map::from_map_data(data).and_then(BpfHashMap::<_, u64, AffinityTable>::try_from)
        else {
            return;
        };
        let clients = lru.keys().take(capacity as usize).flatten().count();
        self.map_entries
            .get_or_create(&map_labels(map))
            .set(gauge(clients));
    }

    /// The exposition, in the format asked for.
    pub fn encode(&self, format: Format) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            out.push_str("# encoding failed\n");
            if format == Format::OpenMetrics {
                out.push_str("# EOF\n");
            }
            return out;
        }
        match format {
            Format::OpenMetrics => out,
            Format::Text => to_prometheus_text(&out),
        }
    }
}

/// Rewrites prometheus-client's `OpenMetrics` exposition in the Prometheus text format 0.0.4:
/// a counter family `x` becomes `x_total` (the name its samples carry, so HELP and TYPE
/// describe them), an info family `x` becomes the gauge `x_info`, `# UNIT` and `# EOF` go, and
/// HELP keeps only the escapes the text format knows (`\\` and `\n`).
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE: hold it until the type says what the family is called.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take());
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{family}_total"), "counter"),
                "info" => (format!("{family}_info"), "gauge"),
                "gaugehistogram" => (family.to_string(), "histogram"),
                "stateset" | "unknown" => (family.to_string(), "untyped"),
                other => (family.to_string(), other),
            };
            match help.take() {
                Some((of, text)) if of == family => flush_help(&mut out, Some((&name, text))),
                other => flush_help(&mut out, other),
            }
            out.push_str("# TYPE ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
        } else if !(line.starts_with("# UNIT ") || line == "# EOF") {
            flush_help(&mut out, help.take());
            out.push_str(line);
            out.push('\n');
        }
    }
    flush_help(&mut out, help.take());
    out
}

fn flush_help(out: &mut String, help: Option<(&str, &str)>) {
    let Some((name, text)) = help else {
        return;
    };
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    // OpenMetrics escapes `"` in HELP too; the text format does not.
    out.push_str(&text.replace("\\\"", "\""));
    out.push('\n');
}

/// Reads the data path's counters on every scrape: one lookup per counter in the per-CPU
/// array, opened once.
struct Datapath {
    dir: PathBuf,
    counters: Mutex<Option<PerCpuArray<MapData, u64>>>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Datapath {
    fn read(&self) -> Option<Vec<(DpCounter, u64)>> {
        let mut slot = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            let data = open_map(&self.dir, MapId::Counters, true).ok()?;
            *slot = Some(
                Map::from_map_data(data)
                    .and_then(PerCpuArray::try_from)
                    .ok()?,
            );
        }
        let array = slot.as_ref()?;
        DpCounter::ALL
            .iter()
            .map(|c| {
                array
                    .get(&(*c as u32), 0)
                    .ok()
                    .map(|values| (*c, values.iter().sum()))
            })
            .collect()
    }
}

impl Collector for Datapath {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(counters) = self.read() else {
            return Ok(());
        };
        for (counter, total) in counters {
            let metric = ConstCounter::new(total);
            let name = format!("datapath_{}", DpCounter::name(counter));
            let metric_encoder = encoder.encode_descriptor(
                &name,
                DpCounter::help(counter),
                None,
                metric.metric_type(),
            )?;
            metric.encode(metric_encoder)?;
        }
        Ok(())
    }
}

/// The `process_*` metrics of Prometheus' client libraries, from /proc/self.
#[derive(Debug)]
struct Process {
    /// `process_start_time_seconds`: fixed for the process' life.
    start_time: Option<f64>,
    ticks_per_second: f64,
    page_size: f64,
}

impl Process {
    fn new() -> Self {
        let ticks = rustix::param::clock_ticks_per_second();
        let ticks_per_second = if ticks > 0 { ticks as f64 } else { 100.0 };
        let page_size = rustix::param::page_size() as f64;
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let start_ticks = ProcStat::read().map(|s| s.start_ticks);
        Self {
            start_time: boot_time
                .zip(start_ticks)
                .map(|(boot, start)| boot + start / ticks_per_second),
            ticks_per_second,
            page_size,
        }
    }
}

/// The fields of /proc/self/stat the process metrics use.
struct ProcStat {
    cpu_ticks: f64,
    start_ticks: f64,
    virtual_bytes: f64,
    resident_pages: f64,
}

impl ProcStat {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(&stat)
    }

    /// Fields after the command name (which may hold spaces and parentheses), counted from 3
    /// as in proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    fn parse(stat: &str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        Some(Self {
            cpu_ticks: field(14)? + field(15)?,
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
            resident_pages: field(24)?,
        })
    }
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(stat) = ProcStat::read() {
            let cpu = ConstCounter::new(stat.cpu_ticks / self.ticks_per_second);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            let gauges = [
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes",
                    stat.resident_pages * self.page_size,
                ),
                (
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes",
                    stat.virtual_bytes,
                ),
            ];
            for (name, help, value) in gauges {
                let g = ConstGauge::new(value);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let g = ConstGauge::new(gauge(fds.count()));
            g.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            let g = ConstGauge::new(i64::try_from(limit).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(start) = self.start_time {
            let g = ConstGauge::new(start);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_choose_the_format() {
        // What Prometheus 2.x and 3.x send.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some(
                "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"
            )),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        // A version we do not speak is not chosen.
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=2.0.0")),
            Format::Text
        );
    }

    #[test]
    fn openmetrics_becomes_the_text_format() {
        let om = "# HELP a_seconds Time \\\"quoted\\\".\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\na_seconds_sum 1.0\na_seconds_count 1\na_seconds_bucket{le=\"+Inf\"} 1\n# HELP b Things.\n# TYPE b counter\nb_total{kind=\"x\"} 3\n# HELP c Build.\n# TYPE c info\nc_info{version=\"1\"} 1\n# EOF\n";
        let text = to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_seconds Time \"quoted\".\n# TYPE a_seconds histogram\na_seconds_sum 1.0\na_seconds_count 1\na_seconds_bucket{le=\"+Inf\"} 1\n# HELP b_total Things.\n# TYPE b_total counter\nb_total{kind=\"x\"} 3\n# HELP c_info Build.\n# TYPE c_info gauge\nc_info{version=\"1\"} 1\n"
        );
    }

    #[test]
    fn proc_stat_fields_are_read_after_the_command_name() {
        let stat = "1234 (socklb (a) b) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let s = ProcStat::parse(stat).expect("parses");
        assert!((s.cpu_ticks - 300.0).abs() < f64::EPSILON);
        assert!((s.start_ticks - 12345.0).abs() < f64::EPSILON);
        assert!((s.virtual_bytes - 104_857_600.0).abs() < f64::EPSILON);
        assert!((s.resident_pages - 2560.0).abs() < f64::EPSILON);
    }

    #[test]
    fn programming_buckets_are_kube_proxys() {
        let b = programming_buckets();
        assert_eq!(b.len(), 2 + 59 + 12 + 7);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert!((b[b.len() - 1] - 300.0).abs() < f64::EPSILON);
    }
}
