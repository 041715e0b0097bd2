//! Prometheus metrics: sync timings as kube-proxy reports them, map fill, errors by kind,
//! address conflicts, build and process information, and the data path's per-CPU counters
//! summed.
//!
//! A scrape never walks a map: it reads the `COUNTERS` per-CPU array (one lookup per counter)
//! and values cached by the agent loop and by a background refresh (`refresh_affinity`).
//!
//! Two formats: the Prometheus text format 0.0.4 (the default, and what `promtool check
//! metrics` reads) and `OpenMetrics` 1.0.0 when the scraper asks for it (`Accept`), both
//! written by prometheus-client's encoders (label values escaped as each format wants).
mod datapath;
mod outside;
mod process;
mod sockets;

use std::{
    path::{Path, PathBuf},
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use lb_common::MapId;
use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Metric, Registry},
};

use super::engine::{Engine, Pass};
use crate::{
    dataplane::{bpf::ReadOnlyMaps, features::Features, maps::ServiceMaps},
    sockets::quota::Recount,
    vocab::ErrorKind,
};

type Labels = Vec<(String, String)>;

/// The Prometheus text format, what Prometheus asks for when it does not ask for `OpenMetrics`.
pub(super) const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `OpenMetrics` 1.0.0.
pub(super) const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How often, at most, the agent counts the `AFFINITY` map's clients (a bounded key walk).
pub(super) const AFFINITY_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

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
    sockets: sockets::SocketMetrics,
    outside: outside::OutsideMetrics,
    /// Last cumulative values seen, to turn totals into counter increments.
    seen_errors: Mutex<std::collections::BTreeMap<ErrorKind, u64>>,
    seen_rejected: AtomicU64,
    /// The generation the maps are read from (it changes when the maps grow).
    maps_dir: Generation,
    /// `AFFINITY`'s capacity (0: unknown).
    affinity_capacity: std::sync::atomic::AtomicU32,
    growths: Counter,
    at_ceiling: Family<Labels, Gauge>,
    pods_placed: Gauge,
}

/// The directory of the generation of maps in use, shared with the collectors that read it.
pub(super) type Generation = std::sync::Arc<std::sync::RwLock<PathBuf>>;

/// The generation's directory now.
pub(super) fn dir_of(generation: &Generation) -> PathBuf {
    generation
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
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
        MapId::Connections,
        MapId::SlotsHeld,
        MapId::AffinityEmpty,
        MapId::Config,
        MapId::Counters,
        MapId::Monitor,
    ] {
        let Ok((capacity, _)) = read_only.footprint(map) else {
            continue;
        };
        capacities
            .get_or_create(&map_labels(map))
            .set(i64::from(capacity));
        if map == MapId::Affinity {
            affinity = Some(capacity);
        } else if map == MapId::SocketQuota || map == MapId::Connections {
            // Pods with a count, slots held: set every 15 s.
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

/// `socklb_feature_enabled{feature}` and `socklb_guarantee_lost{guarantee}`: decided at start,
/// fixed for the agent's life.
/// The maps' growth and ceiling, and whether pods were placed in the cgroup tree.
fn placement_gauges(r: &mut Registry) -> (Counter, Family<Labels, Gauge>, Gauge) {
    let growths = register(
        r,
        "map_growths",
        "Moves of the maps to larger ones because they filled (each a new generation, made \
         before the old one is let go)",
        Counter::default(),
    );
    let at_ceiling = register(
        r,
        "map_at_ceiling",
        "Whether a map needs room and cannot grow past --max-map-memory (1): sets that find \
         no room keep the room they have and are reported",
        Family::<Labels, Gauge>::default(),
    );
    for map in crate::agent::tasks::growth::GROWABLE {
        at_ceiling.get_or_create(&map_labels(map)).set(0);
    }
    let pods_placed = register(
        r,
        "pods_placed",
        "Whether the agent found where pods are in the cgroup tree (1), so that the \
         per-pod bound counts each pod; 0: no kubelet pod cgroup found, each child of the \
         attached cgroup counts on its own (/status says why)",
        Gauge::default(),
    );
    (growths, at_ceiling, pods_placed)
}

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
    let lost: Family<Labels, Gauge> = register(
        r,
        "guarantee_lost",
        "Whether a guarantee of socklb is lost (1) with the optional parts that are off, or \
         kept (0): what alerts should follow; a part off whose loss another part makes up \
         for loses nothing",
        Family::default(),
    );
    for g in crate::dataplane::features::Guarantee::ALL {
        lost.get_or_create(&vec![("guarantee".to_string(), g.to_string())])
            .set(i64::from(!features.keeps(g)));
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
    pub fn new(maps_dir: &Path, features: &Features) -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::Process::new()));
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
                "Entries in use in each map (AFFINITY: client tables, counted every 30 s; SOCKET_QUOTA: pods with socket records, CONNECTIONS: slots held, every 15 s)",
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
        let sockets = sockets::SocketMetrics::register(r);
        let outside = outside::OutsideMetrics::register(r);
        r.register(
            "build",
            "The socklb version and git commit of the running agent",
            Info::new(vec![
                ("version".to_string(), crate::status::VERSION.to_string()),
                ("commit".to_string(), crate::status::COMMIT.to_string()),
            ]),
        );
        let generation: Generation =
            std::sync::Arc::new(std::sync::RwLock::new(maps_dir.to_path_buf()));
        r.register_collector(Box::new(datapath::Datapath {
            generation: generation.clone(),
        }));
        let affinity_capacity = fixed_sizes(maps_dir, &map_entries, &map_capacity);
        let (growths, at_ceiling, pods_placed) = placement_gauges(r);
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
            outside,
            seen_errors: Mutex::new(std::collections::BTreeMap::new()),
            seen_rejected: AtomicU64::new(0),
            maps_dir: generation,
            affinity_capacity: std::sync::atomic::AtomicU32::new(affinity_capacity.unwrap_or(0)),
            growths,
            at_ceiling,
            pods_placed,
        }
    }

    /// One sync of the outside path: its outcome, and the state its rules are in after it.
    pub fn record_outside(
        &self,
        outcome: Result<&crate::outside::SyncReport, ()>,
        condition: crate::status::OutsideCondition,
    ) {
        match outcome {
            Ok(report) => {
                self.outside.syncs.inc();
                self.outside.duration.set(report.took.as_secs_f64());
                self.outside
                    .flows_cleared
                    .inc_by(report.flows_cleared as u64);
            }
            Err(()) => {
                self.outside.failures.inc();
            }
        }
        self.outside.set_state(condition);
    }

    /// The outside path's rules were found changed by someone else.
    pub fn record_outside_drift(&self) {
        self.outside.drift_repairs.inc();
    }

    /// Whether the pods' level is known.
    pub fn record_pods(&self, placed: bool) {
        self.pods_placed.set(i64::from(placed));
    }

    /// Reads the maps from `dir` from now on (the maps grew into a new generation), and the
    /// sizes of the maps the reconciler does not hold from it.
    pub fn follow_generation(&self, dir: &Path) {
        *self
            .maps_dir
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = dir.to_path_buf();
        let affinity = fixed_sizes(dir, &self.map_entries, &self.map_capacity);
        self.affinity_capacity
            .store(affinity.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// The maps' growth: the sizes now, those at the ceiling, and how many moves so far.
    pub fn record_growth(
        &self,
        capacities: &crate::dataplane::maps::Capacities,
        at_ceiling: &std::collections::BTreeSet<MapId>,
        grown: u64,
    ) {
        for map in crate::agent::tasks::growth::GROWABLE {
            self.at_ceiling
                .get_or_create(&map_labels(map))
                .set(i64::from(at_ceiling.contains(&map)));
            self.map_capacity
                .get_or_create(&map_labels(map))
                .set(i64::from(capacities.get(map)));
        }
        let counted = self.growths.get();
        if grown > counted {
            self.growths.inc_by(grown - counted);
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
        for (map, held, slots) in r.maps().frontend_indexes() {
            let labels = map_labels(map);
            self.map_entries.get_or_create(&labels).set(gauge(held));
            self.map_capacity
                .get_or_create(&labels)
                .set(i64::from(slots));
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
        view: &crate::sockets::view::ConnectionsView,
        census: crate::agent::tasks::census::Census,
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
        self.sockets.listing_seconds.set(census.took.as_secs_f64());
        self.sockets.slots_freed.inc_by(census.freed as u64);
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

    /// The `CONNECTIONS` slots held now.
    pub fn record_slots(&self, held: usize) {
        self.map_entries
            .get_or_create(&map_labels(MapId::Connections))
            .set(gauge(held));
    }

    /// The kernel's per-pod counts (`SOCKET_QUOTA`), as read now.
    pub fn record_counts<S: std::hash::BuildHasher>(
        &self,
        counts: &std::collections::HashMap<u64, i64, S>,
        bound: u64,
    ) {
        self.map_entries
            .get_or_create(&map_labels(MapId::SocketQuota))
            .set(gauge(counts.len()));
        let records: i64 = counts.values().map(|c| (*c).max(0)).sum();
        self.sockets.records.set(records);
        let at_bound = counts
            .values()
            .filter(|c| (**c).max(0).cast_unsigned() >= bound)
            .count();
        self.sockets.clients_at_bound.set(gauge(at_bound));
    }

    pub fn record_error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&vec![("kind".to_string(), kind.metric_label().to_string())])
            .inc();
    }

    /// Counts the `AFFINITY` map's client tables: a walk over its keys, bounded by its
    /// capacity. Blocking; the agent runs it off the scrape path, every `AFFINITY_REFRESH`.
    pub fn refresh_affinity(&self) {
        let capacity = self
            .affinity_capacity
            .load(std::sync::atomic::Ordering::Relaxed);
        if capacity == 0 {
            return;
        }
        let Ok(tables) = ReadOnlyMaps::new(dir_of(&self.maps_dir)).affinity(capacity as usize)
        else {
            return;
        };
        self.map_entries
            .get_or_create(&map_labels(MapId::Affinity))
            .set(gauge(tables.len()));
    }

    /// The exposition, in the format asked for.
    pub fn encode(&self, format: Format) -> String {
        let mut out = String::new();
        let encoded = match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
            Format::Text => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
        };
        if encoded.is_err() {
            out.clear();
            out.push_str("# encoding failed\n");
            if format == Format::OpenMetrics {
                out.push_str("# EOF\n");
            }
            return out;
        }
        out
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(super) fn gauge(n: usize) -> i64 {
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
    fn programming_buckets_are_kube_proxys() {
        let b = programming_buckets();
        assert_eq!(b.len(), 2 + 59 + 12 + 7);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert!((b[b.len() - 1] - 300.0).abs() < f64::EPSILON);
    }
}
