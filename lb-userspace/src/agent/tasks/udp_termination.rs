//! The UDP termination pass, off the event loop, one at a time (a request while one runs makes
//! it run once more when it ends):
//! - connected UDP sockets whose backend stopped serving are destroyed
//!   (`sockets::terminate_stale`), each judged against the reconciler's live table right
//!   before it is (`reconcile::LiveServing`), so a socket given a backend that a rollout
//!   added while the pass ran is never taken for stale;
//! - when asked to repair (at the first attach after a start, and when a UDP frontend
//!   appears), connected UDP sockets whose peer is a UDP frontend, which no program translated
//!   (they connected before it existed), are destroyed too (`sockets::repair_untranslated`).
use std::sync::{Arc, Mutex, PoisonError};

use crate::{
    agent::{AgentConfig, Shared},
    dataplane::{features::Listing, loader::Dataplane, pins::SocketPins},
    reconcile::LiveServing,
    sockets::{self, Terminated},
};

/// Whether a pass runs, and what the next one is to do when one was asked for meanwhile.
#[derive(Debug, Default)]
struct State {
    running: bool,
    /// Asked for while a pass ran.
    again: bool,
    /// The next pass also repairs untranslated sockets.
    repair: bool,
}

/// The termination task: at most one pass at a time, each on a blocking thread.
#[derive(Clone, Default)]
pub(in crate::agent) struct UdpTermination {
    state: Arc<Mutex<State>>,
}

impl UdpTermination {
    /// Asks for a pass over the live table `live` (and, with `repair`, for the untranslated
    /// sockets too): starts one, or, while one runs, makes it run once more when it ends.
    pub(in crate::agent) fn request(
        &self,
        config: &AgentConfig,
        dataplane: &Dataplane,
        live: &LiveServing,
        shared: &Arc<Shared>,
        repair: bool,
    ) {
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.repair |= repair;
            if state.running {
                state.again = true;
                return;
            }
            state.running = true;
        }
        let pass = Pass {
            cgroup: config.load.cgroup.clone(),
            pins: dataplane.sockets.clone(),
            listing: dataplane.features.listing(),
            live: live.clone(),
            shared: shared.clone(),
        };
        let task = self.clone();
        tokio::task::spawn_blocking(move || {
            loop {
                let repair = std::mem::take(
                    &mut task
                        .state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .repair,
                );
                pass.run(repair);
                let mut state = task.state.lock().unwrap_or_else(PoisonError::into_inner);
                if !std::mem::take(&mut state.again) {
                    state.running = false;
                    return;
                }
            }
        });
    }
}

/// What one pass needs.
struct Pass {
    cgroup: std::path::PathBuf,
    pins: SocketPins,
    listing: Listing,
    live: LiveServing,
    shared: Arc<Shared>,
}

impl Pass {
    /// One pass; each namespace or socket that fails is counted and logged on its own.
    fn run(&self, repair: bool) {
        let live = &self.live;
        let serving = move |fe: &lb_common::FrontendKey| live.get(fe);
        let stale = sockets::terminate_stale(&self.pins, self.listing, &self.cgroup, &serving);
        self.report(
            stale,
            "terminated connected UDP sockets whose backend stopped serving",
        );
        if repair {
            let repaired =
                sockets::repair_untranslated(&self.pins, &self.cgroup, &self.live.frontends());
            self.report(
                repaired,
                "terminated connected UDP sockets that connected to a UDP Service before it was translated: their applications connect again",
            );
        }
    }

    fn report(&self, result: Result<Terminated, sockets::TerminateError>, what: &'static str) {
        let metrics = &self.shared.metrics;
        match result {
            Ok(done) => {
                metrics.record_udp_terminated(done.sockets);
                for e in &done.namespace_errors {
                    metrics.record_error(crate::vocab::ErrorKind::UdpTerminate);
                    tracing::warn!(
                        error = e as &dyn std::error::Error,
                        "could not look for UDP sockets to terminate in a network namespace"
                    );
                }
                for e in &done.errors {
                    metrics.record_error(crate::vocab::ErrorKind::UdpTerminate);
                    tracing::warn!(
                        error = e as &dyn std::error::Error,
                        "could not terminate a UDP socket"
                    );
                }
                if done.sockets > 0 {
                    tracing::info!(
                        sockets = done.sockets,
                        namespaces = done.namespaces,
                        "{what}"
                    );
                }
            }
            Err(e) => {
                metrics.record_error(crate::vocab::ErrorKind::UdpTerminate);
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "could not look for UDP sockets to terminate"
                );
            }
        }
    }
}
