//! Where pods are in the cgroup tree, looked at again every `PODS_EVERY`: the kubelet makes
//! its quality-of-service tiers when it starts, maybe after the agent.
use std::time::Duration;

use crate::dataplane::loader::Dataplane;

/// How often the agent looks again where pods are in the cgroup tree.
pub(in crate::agent) const PODS_EVERY: Duration = Duration::from_secs(30);

/// Looks again where pods are in the cgroup tree (the kubelet's tiers may come after the agent).
pub(in crate::agent) fn refresh_pods(dataplane: &mut Dataplane) {
    match dataplane.refresh_pods() {
        Ok(true) => {
            let c = dataplane.config();
            tracing::info!(
                pod_level = c.pod_level,
                tiers = ?c.tiers,
                "where pods are in the cgroup tree changed; the programs count their records there"
            );
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(
            error = &e as &dyn std::error::Error,
            "could not update the programs' settings"
        ),
    }
}
