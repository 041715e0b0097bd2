//! The per-pod socket records: recounted from the live sockets when the programs attach and
//! every `RECOUNT_EVERY` (a safety net: the kernel keeps the counts exact), and read for the
//! metrics with the connection slots held.
use std::{sync::Arc, time::Duration};

use crate::{
    agent::{AgentConfig, Shared},
    dataplane::{loader::Dataplane, pins::SocketPins},
    sockets::{self, quota},
};

/// How often the agent recounts the per-pod socket records from the live sockets: a safety net
/// (the kernel keeps the counts exact), whatever any pod does.
const RECOUNT_EVERY: Duration = Duration::from_mins(5);

/// Starts the recount loop when the per-pod bound is on (once the programs are attached).
pub(in crate::agent) fn spawn(config: &AgentConfig, dataplane: &Dataplane, shared: &Arc<Shared>) {
    if let Some(bound) = config
        .load
        .max_sockets_per_pod
        .filter(|_| shared.features.socket_bound())
    {
        tokio::spawn(recount_loop(
            config.load.cgroup.clone(),
            dataplane.sockets.clone(),
            dataplane.features.listing(),
            shared.clone(),
            bound,
        ));
    }
}

/// Recounts the per-pod socket records from the live sockets now (counts kept before the
/// release program was attached are corrected) and then every `RECOUNT_EVERY`; off the event
/// loop, streaming the records.
async fn recount_loop(
    cgroup: std::path::PathBuf,
    pins: SocketPins,
    listing: crate::dataplane::features::Listing,
    shared: Arc<Shared>,
    bound: u64,
) {
    let mut tick = tokio::time::interval(RECOUNT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (cgroup, pins, shared) = (cgroup.clone(), pins.clone(), shared.clone());
        let done = tokio::task::spawn_blocking(move || {
            let result = quota::recount(&pins, listing, &cgroup, bound);
            (result, shared)
        })
        .await;
        let Ok((result, shared)) = done else {
            continue;
        };
        match result {
            Ok(r) => {
                shared.metrics.record_recount(&r);
                if r.corrected > 0 {
                    tracing::info!(
                        pods = r.corrected,
                        records = r.records,
                        "recounted the per-pod socket records: some counts were off"
                    );
                }
                if r.at_bound > 0 {
                    tracing::warn!(
                        pods = r.at_bound,
                        bound,
                        largest = r.largest,
                        "pods hold as many socket records as one may: their new service sockets get ENOBUFS"
                    );
                }
            }
            Err(e) => {
                shared
                    .metrics
                    .record_error(crate::vocab::ErrorKind::Recount);
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "could not recount the socket records"
                );
            }
        }
    }
}

/// Reads the connection slots held and each pod's count of socket records for the metrics, on
/// a blocking thread: a read of the whole slot table the reconcile loop does not wait for.
pub(in crate::agent) fn record_counts(
    config: &AgentConfig,
    dataplane: &Dataplane,
    shared: &Arc<Shared>,
) {
    let sockets = dataplane.sockets.clone();
    let bound = config
        .load
        .max_sockets_per_pod
        .filter(|_| shared.features.socket_bound());
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        if let Ok(held) = sockets::held_slots(&sockets) {
            shared.metrics.record_slots(held);
        }
        if let Some(bound) = bound
            && let Ok(counts) = quota::counts(&sockets)
        {
            shared.metrics.record_counts(&counts, bound);
        }
    });
}
