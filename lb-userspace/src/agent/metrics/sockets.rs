//! The translated sockets' metrics: socket records per pod as the kernel counts them, live
//! connections per Service, protocol and condition at each census.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{Labels, register};

/// The translated sockets: records per pod from the kernel's counts (every 15 s), live
/// connections at each census.
pub(super) struct SocketMetrics {
    pub(super) records: Gauge,
    pub(super) clients_at_bound: Gauge,
    pub(super) live: Family<Labels, Gauge>,
    pub(super) listing_seconds: Gauge<f64, AtomicU64>,
    pub(super) slots_freed: Counter,
}

impl SocketMetrics {
    pub(super) fn register(r: &mut Registry) -> Self {
        let [records, clients_at_bound] = [
            (
                "socket_records",
                "Socket records in socket storage held by all pods (the kernel's per-pod counts, \
                 read every 15 s; TCP connections in preallocated slots are not counted)",
            ),
            (
                "socket_clients_at_bound",
                "Pods holding as many socket records as one may (--max-sockets-per-pod): their \
                 new service sockets get ENOBUFS (read every 15 s)",
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
        let slots_freed = register(
            r,
            "connection_slots_freed",
            "Connection slots the agent freed because their TCP socket was gone in two censuses \
             in a row without the release program seeing it close (a multipath TCP subflow)",
            Counter::default(),
        );
        Self {
            records,
            clients_at_bound,
            live,
            listing_seconds,
            slots_freed,
        }
    }
}
