//! The UDP termination pass: connected UDP sockets whose backend stopped serving are destroyed
//! (`sockets::terminate_stale`), off the event loop, one pass at a time; a change while a pass
//! runs makes it run once more with the latest state.
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use crate::{
    agent::{AgentConfig, Engine, Shared},
    dataplane::{bpf::BpfServiceMaps, loader::Dataplane, pins::SocketPins},
    sockets,
};

/// Whether a pass runs, and the state the next one is to judge by when a change came
/// while it ran.
#[derive(Debug, Default)]
struct State {
    running: bool,
    /// Asked for while a pass ran: the UDP frontends' serving endpoints then.
    again: Option<Serving>,
}

/// Every UDP frontend and the serving endpoints of its backend set.
type Serving = HashMap<lb_common::FrontendKey, Arc<[SocketAddr]>>;

/// The termination task: at most one pass at a time, each on a blocking thread.
#[derive(Clone, Default)]
pub(in crate::agent) struct UdpTermination {
    state: Arc<Mutex<State>>,
}

impl UdpTermination {
    /// Asks for a pass with the engine's current state: starts one, or, while one runs, makes
    /// it run once more with this state when it ends.
    pub(in crate::agent) fn request(
        &self,
        config: &AgentConfig,
        dataplane: &Dataplane,
        engine: &Engine<BpfServiceMaps>,
        shared: &Arc<Shared>,
    ) {
        let serving = engine.reconciler().udp_serving();
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.running {
                state.again = Some(serving);
                return;
            }
            state.running = true;
        }
        let (cgroup, pins, listing, shared, task) = (
            config.load.cgroup.clone(),
            dataplane.sockets.clone(),
            dataplane.features.listing(),
            shared.clone(),
            self.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let mut serving = serving;
            loop {
                udp_pass(&pins, listing, &cgroup, &serving, &shared);
                let mut state = task.state.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(newer) = state.again.take() else {
                    state.running = false;
                    return;
                };
                serving = newer;
            }
        });
    }
}

/// One termination pass; each namespace or socket that fails is counted and logged on its own.
fn udp_pass(
    pins: &SocketPins,
    listing: crate::dataplane::features::Listing,
    cgroup: &std::path::Path,
    serving: &std::collections::HashMap<lb_common::FrontendKey, Arc<[SocketAddr]>>,
    shared: &Shared,
) {
    match sockets::terminate_stale(pins, listing, cgroup, serving) {
        Ok(done) => {
            shared.metrics.record_udp_terminated(done.sockets);
            for e in &done.namespace_errors {
                shared
                    .metrics
                    .record_error(crate::vocab::ErrorKind::UdpTerminate);
                tracing::warn!(
                    error = e as &dyn std::error::Error,
                    "could not look for stale UDP sockets in a network namespace"
                );
            }
            for e in &done.errors {
                shared
                    .metrics
                    .record_error(crate::vocab::ErrorKind::UdpTerminate);
                tracing::warn!(
                    error = e as &dyn std::error::Error,
                    "could not terminate a stale UDP socket"
                );
            }
            if done.sockets > 0 {
                tracing::info!(
                    sockets = done.sockets,
                    namespaces = done.namespaces,
                    "terminated connected UDP sockets whose backend stopped serving"
                );
            }
        }
        Err(e) => {
            shared
                .metrics
                .record_error(crate::vocab::ErrorKind::UdpTerminate);
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "could not look for stale UDP sockets"
            );
        }
    }
}
