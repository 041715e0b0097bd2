//! The state the agent's loop shares with its HTTP handlers and background tasks.
use std::{
    sync::{Arc, Mutex, PoisonError, atomic::AtomicBool},
    time::{Duration, Instant},
};

use super::{AgentConfig, Metrics, probes, tasks::census};
use crate::{
    dataplane::{features::Features, loader::Dataplane},
    status::Status,
};

/// State shared with the HTTP server.
pub struct Shared {
    pub ready: AtomicBool,
    /// What the kernel said about each optional part, at start.
    pub features: Features,
    /// The live connections, as last counted.
    pub connections: census::Handle,
    /// Since when changes wait to be written (liveness, and kube-proxy's health).
    pub progress: Mutex<Progress>,
    pub stuck_after: Duration,
    pub healthz_stale_after: Duration,
    pub metrics: Metrics,
    pub status: Mutex<Status>,
    /// What kube-proxy's /healthz says about the node.
    pub node_health: probes::NodeHealth,
    /// The outside path's state, as its task last wrote it (`None`: not asked for).
    pub outside: Mutex<Option<crate::status::OutsideReport>>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// The oldest change that arrived after the first full sync and is not written yet
    /// (`Engine::unapplied_since`).
    pub unapplied_since: Option<Instant>,
}

impl Shared {
    pub(super) fn new(
        config: &AgentConfig,
        dataplane: &Dataplane,
        connections: census::Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            connections,
            ready: AtomicBool::new(false),
            features: dataplane.features.clone(),
            progress: Mutex::new(Progress::default()),
            stuck_after: config.stuck_after,
            healthz_stale_after: config.healthz_stale_after,
            metrics: Metrics::new(&dataplane.maps_dir, &dataplane.features),
            status: Mutex::new(Status::default()),
            node_health: probes::NodeHealth::new(config.external_traffic),
            outside: Mutex::new(None),
        })
    }

    /// Why the agent is not live, if it is not: a change has waited longer than
    /// `--stuck-after-s` to be written. A failing watch (an unreachable API server) is not a
    /// reason: it queues nothing, and restarting the agent would not bring the API back.
    pub fn stuck(&self) -> Option<String> {
        let waited = self.unapplied_for()?;
        (waited >= self.stuck_after).then(|| {
            format!(
                "a change has waited {:.0}s to be written",
                waited.as_secs_f64()
            )
        })
    }

    /// kube-proxy's proxy health (`ProxyHealthServer.Health`): healthy unless a change has
    /// waited to be written for `--healthz-stale-after-s` or longer. It answers kube-proxy's
    /// /healthz and /livez and `serviceProxyHealthy` on every health-check port.
    pub fn proxy_healthy(&self) -> bool {
        self.unapplied_for()
            .is_none_or(|waited| waited < self.healthz_stale_after)
    }

    /// How long the oldest unwritten change has waited, if one waits.
    fn unapplied_for(&self) -> Option<Duration> {
        let p = *self.progress.lock().unwrap_or_else(PoisonError::into_inner);
        p.unapplied_since.map(|t| t.elapsed())
    }
}
