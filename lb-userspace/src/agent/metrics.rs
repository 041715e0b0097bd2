//! Prometheus metrics: reconcile timings, map fill, errors by kind, and the data path's per-CPU
//! counters summed (read from the pinned map at scrape time).
use std::{
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use lb_common::map_name;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::engine::Pass;
use crate::dataplane::{
    bpf::{named_counters, open_pinned_map, read_affinity, sock_state_fill},
    maps::{Capacities, MapSnapshot},
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
    rejected_objects: Counter,
    udp_terminated: Counter,
    /// Last cumulative values seen, to turn totals into counter increments.
    seen_errors: Mutex<std::collections::BTreeMap<String, u64>>,
    seen_rejected: AtomicU64,
}

impl Metrics {
    pub fn new(maps_dir: Option<PathBuf>) -> Self {
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
            "Service ports (backend sets) in the maps",
            services.clone(),
        );
        let failing_services = Gauge::default();
        registry.register(
            "failing_service_ports",
            "Service ports left on their previous state after a failed write, or with a conflict",
            failing_services.clone(),
        );
        let rejected_objects = Counter::default();
        registry.register(
            "rejected_objects",
            "Services and EndpointSlices rejected by validation",
            rejected_objects.clone(),
        );
        let udp_terminated = Counter::default();
        registry.register(
            "udp_sockets_terminated",
            "Connected UDP sockets destroyed because their backend left the service",
            udp_terminated.clone(),
        );
        if let Some(dir) = maps_dir {
            registry.register_collector(Box::new(Datapath { maps_dir: dir }));
        }
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

    /// Refreshes gauges and error counters from the reconciler's state.
    pub fn record_state(
        &self,
        snap: &MapSnapshot,
        capacities: &Capacities,
        service_ports: usize,
        failing: usize,
        errors: &std::collections::BTreeMap<&'static str, u64>,
        rejected_total: u64,
    ) {
        let sizes = [
            (
                map_name::FRONTENDS,
                snap.frontends.len(),
                capacities.frontends,
            ),
            (map_name::SLOTS, snap.slots.len(), capacities.slots),
            (map_name::BACKENDS, snap.backends.len(), capacities.backends),
            (
                map_name::SERVICE_META,
                snap.meta.len(),
                capacities.service_meta,
            ),
        ];
        for (map, len, cap) in sizes {
            let labels = vec![("map".to_string(), map.to_string())];
            self.map_entries.get_or_create(&labels).set(gauge(len));
            self.map_capacity.get_or_create(&labels).set(i64::from(cap));
        }
        self.services.set(gauge(service_ports));
        self.failing_services.set(gauge(failing));
        let mut seen = self
            .seen_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (kind, total) in errors {
            let last = seen.entry((*kind).to_string()).or_default();
            if *total > *last {
                self.errors
                    .get_or_create(&vec![("kind".to_string(), (*kind).to_string())])
                    .inc_by(*total - *last);
                *last = *total;
            }
        }
        let last = self.seen_rejected.swap(rejected_total, Ordering::Relaxed);
        if rejected_total > last {
            self.rejected_objects.inc_by(rejected_total - last);
        }
    }

    pub fn record_udp_terminated(&self, sockets: usize) {
        self.udp_terminated.inc_by(sockets as u64);
    }

    pub fn record_error(&self, kind: &str) {
        self.errors
            .get_or_create(&vec![("kind".to_string(), kind.to_string())])
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

/// Reads the data path's counters and the affinity map's fill on every scrape.
#[derive(Debug)]
struct Datapath {
    maps_dir: PathBuf,
}

impl Collector for Datapath {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Ok(counters) = open_pinned_map(
            &self.maps_dir.join(map_name::COUNTERS),
            map_name::COUNTERS,
            true,
        )
        .and_then(named_counters)
        {
            for (name, total) in counters {
                let metric = ConstCounter::new(total);
                let (metric_name, help) = (
                    format!("datapath_{name}"),
                    format!("Data path events: {name} (summed over CPUs)"),
                );
                let metric_encoder =
                    encoder.encode_descriptor(&metric_name, &help, None, metric.metric_type())?;
                metric.encode(metric_encoder)?;
            }
        }
        if let Ok((entries, _)) = open_pinned_map(
            &self.maps_dir.join(map_name::SOCK_STATE),
            map_name::SOCK_STATE,
            true,
        )
        .and_then(sock_state_fill)
        {
            let metric = ConstGauge::new(gauge(entries));
            let metric_encoder = encoder.encode_descriptor(
                "sock_state_entries",
                "Live translated sockets with a reverse-translation record (SOCK_STATE)",
                None,
                metric.metric_type(),
            )?;
            metric.encode(metric_encoder)?;
        }
        if let Ok(entries) = open_pinned_map(
            &self.maps_dir.join(map_name::AFFINITY),
            map_name::AFFINITY,
            true,
        )
        .and_then(read_affinity)
        {
            let metric = ConstGauge::new(gauge(entries.len()));
            let metric_encoder = encoder.encode_descriptor(
                "affinity_entries",
                "Session-affinity entries in the AFFINITY map",
                None,
                metric.metric_type(),
            )?;
            metric.encode(metric_encoder)?;
        }
        Ok(())
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
