//! The outside path's task (`--external-traffic nftables`): on a thread of its own (`nft` runs
//! as a process, and a full table of thousands of Services takes seconds), it writes the latest
//! state the event loop publishes, checks every `DRIFT_EVERY` that the kernel's tables are still
//! what it wrote (a table deleted or edited by someone else is written again whole), retries a
//! failed sync every `RETRY_EVERY`, and reports to `/status` and the metrics. The rules are in
//! the kernel: with the agent gone they keep serving what was last written, and a new agent
//! adopts them (its first sync rewrites them in one transaction, with no moment without them).
use std::{
    sync::{Arc, PoisonError, mpsc},
    time::{Duration, Instant},
};

use crate::{
    agent::Shared,
    dataplane::nft::Nft,
    outside::{Outside, SyncReport, render::RenderOptions},
    status::{OutsideCondition, OutsideReport},
    translate::outside::OutsideState,
};

/// How often the kernel's tables are compared with what was written.
const DRIFT_EVERY: Duration = Duration::from_secs(10);
/// How soon a failed sync is tried again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The event loop's side: where it publishes each new state.
pub(in crate::agent) struct OutsideTask {
    tx: mpsc::Sender<Arc<OutsideState>>,
}

impl OutsideTask {
    /// Starts the task, or reports why the node cannot run it (the socket path works on).
    pub(in crate::agent) fn start(options: RenderOptions, shared: &Arc<Shared>) -> Option<Self> {
        let nft = Nft::find().and_then(|nft| nft.check_no_kube_proxy().map(|()| nft));
        let nft = match nft {
            Ok(nft) => nft,
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "the outside path cannot run on this node: traffic reaching it from outside is not served (the socket path works on)"
                );
                let report = OutsideReport {
                    condition: OutsideCondition::Off,
                    reason: Some(e.to_string()),
                    ..empty_report()
                };
                shared
                    .metrics
                    .record_outside(Err(()), OutsideCondition::Off);
                *shared
                    .outside
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(report);
                return None;
            }
        };
        let (tx, rx) = mpsc::channel();
        let shared = Arc::clone(shared);
        let outside = Outside::new(nft, options);
        std::thread::Builder::new()
            .name("socklb-outside".into())
            .spawn(move || run(outside, &rx, &shared))
            .ok()?;
        Some(Self { tx })
    }

    /// Hands the task the Services' state after a pass that wrote.
    pub(in crate::agent) fn publish(&mut self, state: OutsideState) {
        let _ = self.tx.send(Arc::new(state));
    }
}

fn empty_report() -> OutsideReport {
    OutsideReport {
        condition: OutsideCondition::Failing,
        reason: Some("no sync yet".into()),
        service_ports: 0,
        syncs: 0,
        failures: 0,
        drift_repairs: 0,
        udp_flows_cleared: 0,
        last_sync_ms: None,
        last_full: false,
        last_chains_written: 0,
        last_elements_written: 0,
    }
}

fn run(mut outside: Outside, rx: &mpsc::Receiver<Arc<OutsideState>>, shared: &Shared) {
    let mut report = empty_report();
    let mut latest: Option<Arc<OutsideState>> = None;
    let mut pending = false;
    let mut next_drift = Instant::now() + DRIFT_EVERY;
    loop {
        let wait = if pending {
            RETRY_EVERY
        } else {
            next_drift.saturating_duration_since(Instant::now())
        };
        match rx.recv_timeout(wait) {
            Ok(state) => {
                latest = Some(state);
                // Only the newest state counts.
                while let Ok(state) = rx.try_recv() {
                    latest = Some(state);
                }
                pending = true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if Instant::now() >= next_drift {
            next_drift = Instant::now() + DRIFT_EVERY;
            match outside.check_drift() {
                Ok(drifted) if !drifted.is_empty() => {
                    tracing::warn!(
                        families = ?drifted,
                        "the outside path's rules were changed by someone else: writing them again"
                    );
                    report.drift_repairs += drifted.len() as u64;
                    shared.metrics.record_outside_drift();
                    pending = true;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the outside path's rules back");
                }
            }
        }
        let Some(state) = latest.as_ref().filter(|_| pending) else {
            continue;
        };
        let outcome = outside.sync(state);
        pending = outcome.is_err();
        record(
            &mut report,
            state,
            outcome.as_ref().map_err(ToString::to_string),
        );
        let condition = report.condition;
        shared
            .metrics
            .record_outside(outcome.as_ref().map_err(|_| ()), condition);
        *shared
            .outside
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(report.clone());
    }
}

fn record(report: &mut OutsideReport, state: &OutsideState, outcome: Result<&SyncReport, String>) {
    match outcome {
        Ok(r) => {
            if r.full || r.chains_written > 0 || r.elements_written > 0 {
                tracing::info!(
                    full = r.full,
                    chains = r.chains_written,
                    elements = r.elements_written,
                    udp_flows_cleared = r.flows_cleared,
                    took_ms = r.took.as_secs_f64() * 1e3,
                    "outside path: rules written"
                );
            }
            if report.condition == OutsideCondition::Failing && report.syncs > 0 {
                tracing::info!("outside path: rules written again after failures");
            }
            report.condition = OutsideCondition::InSync;
            report.reason = None;
            report.service_ports = state.ports.len();
            report.syncs += 1;
            report.udp_flows_cleared += r.flows_cleared as u64;
            report.last_sync_ms = Some(u64::try_from(r.took.as_millis()).unwrap_or(u64::MAX));
            report.last_full = r.full;
            report.last_chains_written = r.chains_written;
            report.last_elements_written = r.elements_written;
        }
        Err(e) => {
            if report.condition != OutsideCondition::Failing || report.reason.as_deref() != Some(&e)
            {
                tracing::error!(error = %e, "outside path: the rules could not be written; the last written stay, retried every second");
            }
            report.condition = OutsideCondition::Failing;
            report.reason = Some(e);
            report.failures += 1;
        }
    }
}
