//! The outside path's metrics (`--external-traffic nftables`): its syncs, their failures and
//! duration, the rules found changed by someone else, the UDP flows cleared, and the state its
//! rules are in (only where the mode is asked for).
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{Labels, register};
use crate::status::OutsideCondition;

pub(super) struct OutsideMetrics {
    pub(super) syncs: Counter,
    pub(super) failures: Counter,
    pub(super) drift_repairs: Counter,
    pub(super) flows_cleared: Counter,
    pub(super) duration: Gauge<f64, AtomicU64>,
    pub(super) state: Family<Labels, Gauge>,
}

impl OutsideMetrics {
    pub(super) fn register(r: &mut Registry) -> Self {
        let [syncs, failures, drift_repairs, flows_cleared] = [
            (
                "outside_syncs",
                "Syncs of the outside path's nftables rules (--external-traffic nftables)",
            ),
            (
                "outside_sync_failures",
                "Syncs of the outside path's rules that failed (nft refused the transaction, or \
                 conntrack could not be read): the rules of before stay, and it is retried",
            ),
            (
                "outside_drift_repairs",
                "Times the outside path's rules were found changed by someone else (a table \
                 deleted, a chain flushed, an element removed) and written again whole",
            ),
            (
                "outside_udp_flows_cleared",
                "UDP conntrack entries deleted because their endpoint stopped serving",
            ),
        ]
        .map(|(name, help)| register(r, name, help, Counter::default()));
        let duration = register(
            r,
            "outside_sync_duration_seconds",
            "How long the last successful sync of the outside path's rules took",
            Gauge::<f64, AtomicU64>::default(),
        );
        let state = register(
            r,
            "outside_rules",
            "The state the outside path's rules are in (1 for the current one): in-sync, \
             failing (the last sync failed), off (asked for, but the node cannot run it)",
            Family::<Labels, Gauge>::default(),
        );
        Self {
            syncs,
            failures,
            drift_repairs,
            flows_cleared,
            duration,
            state,
        }
    }

    pub(super) fn set_state(&self, condition: OutsideCondition) {
        for (name, c) in [
            ("in-sync", OutsideCondition::InSync),
            ("failing", OutsideCondition::Failing),
            ("off", OutsideCondition::Off),
        ] {
            self.state
                .get_or_create(&vec![("state".to_string(), name.to_string())])
                .set(i64::from(c == condition));
        }
    }
}
