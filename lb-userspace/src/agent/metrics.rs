//! Prometheus metrics: reconcile timings, map fill, errors by kind, address conflicts, and the
//! data path's per-CPU counters summed (read from the pinned map at scrape time: one small
//! array read, never a map walk).
use std::{
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use lb_common::{Counter as DpCounter, MapId};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::engine::{Engine, Pass};
use crate::{
    dataplane::{bpf::ReadOnlyMaps, loader::PinFolder, maps::ServiceMaps},
    vocab::ErrorKind,
};

type Labels = Vec<(String, String)>;

pub struct Metrics {
    pub registry: Registry,
    reconcile_duration: Histogram,
    sync_lag: Gauge<f64, AtomicU64>,
    map_entries: Family<Labels, Gauge>,
    map_capacity: Family<Labels, Gauge>,
    errors: Family<Labels, Counter>,
    writes: Counter,
    services: Gauge,
    failing_services: Gauge,
    conflicts: Gauge,
    rejected_objects: Counter,
    udp_terminated: Counter,
    /// Last cumulative values seen, to turn totals into counter increments.
    seen_errors: Mutex<std::collections::BTreeMap<ErrorKind, u64>>,
    seen_rejected: AtomicU64,
}

impl Metrics {
    pub fn new(maps_dir: PathBuf, _pins: PinFolder) -> Self {
        let mut registry = Registry::with_prefix("socklb");
        let reconcile_duration = Histogram::new(exponential_buckets(0.000_05, 4.0, 10));
        registry.register(
            "reconcile_duration_seconds",
            "Time to translate and write one batch of changes",
            reconcile_duration.clone(),
        );
        let sync_lag = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "sync_lag_seconds",
            "From the first event of the last batch to its map writes being done",
            sync_lag.clone(),
        );
        let map_entries = Family::<Labels, Gauge>::default();
        registry.register("map_entries", "Entries in each map", map_entries.clone());
        let map_capacity = Family::<Labels, Gauge>::default();
        registry.register("map_capacity", "Capacity of each map", map_capacity.clone());
        let errors = Family::<Labels, Counter>::default();
        registry.register("errors", "Errors by kind", errors.clone());
        let writes = Counter::default();
        registry.register(
            "map_writes",
            "Map writes done by the reconciler",
            writes.clone(),
        );
        let services = Gauge::default();
        registry.register(
            "service_ports",
            "Backend sets (service port, family, scope) in the maps",
            services.clone(),
        );
        let failing_services = Gauge::default();
        registry.register(
            "failing_service_ports",
            "Backend sets left on their previous state after a failed write",
            failing_services.clone(),
        );
        let conflicts = Gauge::default();
        registry.register(
            "address_conflicts",
            "Service addresses claimed by a Service that does not own them (not written)",
            conflicts.clone(),
        );
        let rejected_objects = Counter::default();
        registry.register(
            "rejected_objects",
            "Services, EndpointSlices and manifest files rejected",
            rejected_objects.clone(),
        );
        let udp_terminated = Counter::default();
        registry.register(
            "udp_sockets_terminated",
            "Connected UDP sockets destroyed because their backend stopped serving",
            udp_terminated.clone(),
        );
        registry.register_collector(Box::new(Datapath {
            maps: ReadOnlyMaps::new(maps_dir),
        }));
        Self {
            registry,
            reconcile_duration,
            sync_lag,
            map_entries,
            map_capacity,
            errors,
            writes,
            services,
            failing_services,
            conflicts,
            rejected_objects,
            udp_terminated,
            seen_errors: Mutex::new(std::collections::BTreeMap::new()),
            seen_rejected: AtomicU64::new(0),
        }
    }

    pub fn record_pass(&self, pass: &Pass) {
        self.reconcile_duration.observe(pass.duration.as_secs_f64());
        if let Some(lag) = pass.lag {
            self.sync_lag.set(lag.as_secs_f64());
        }
        self.writes.inc_by(pass.report.writes as u64);
    }

    /// Refreshes gauges and error counters from the engine's state.
    pub fn record_state<M: ServiceMaps>(&self, engine: &Engine<M>) {
        let r = engine.reconciler();
        let snap = r.snapshot();
        let caps = r.maps().capacities();
        let ranges = r.ranges();
        let sizes = [
            (
                MapId::Frontends4,
                snap.frontends
                    .keys()
                    .filter(|k| k.family == lb_common::FAMILY_IPV4)
                    .count(),
            ),
            (
                MapId::Frontends6,
                snap.frontends
                    .keys()
                    .filter(|k| k.family != lb_common::FAMILY_IPV4)
                    .count(),
            ),
            (
                MapId::Backends,
                (ranges.capacity() - ranges.free_len()) as usize,
            ),
            (MapId::ServiceMeta, snap.meta.len()),
        ];
        for (map, len) in sizes {
            let labels = vec![("map".to_string(), map.name().to_string())];
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
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (kind, total) in &r.stats().errors {
            let last = seen.entry(*kind).or_default();
            if *total > *last {
                self.errors
                    .get_or_create(&vec![("kind".to_string(), kind.metric_label().to_string())])
                    .inc_by(*total - *last);
                *last = *total;
            }
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

    pub fn record_error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&vec![("kind".to_string(), kind.metric_label().to_string())])
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        out
    }
}

/// Reads the data path's counters on every scrape (one per-CPU array read).
#[derive(Debug)]
struct Datapath {
    maps: ReadOnlyMaps,
}

impl Collector for Datapath {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Ok(counters) = self.maps.counters() {
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
        }
        Ok(())
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
