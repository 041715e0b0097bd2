//! Where pods are in the cgroup tree, looked at again every `PODS_EVERY`: the kubelet makes
//! its quality-of-service tiers when it starts, maybe after the agent.
use std::time::Duration;

use crate::dataplane::loader::Dataplane;

/// How often the agent looks again where pods are in the cgroup tree.
pub(in crate::agent) const PODS_EVERY: Duration = Duration::from_secs(30);

/// Says where pods are and why: a tree where no pod could be placed is a warning (every child
/// of the attached cgroup then counts on its own).
pub(in crate::agent) fn log_placement(pods: &crate::dataplane::pods::PodCgroups, what: &str) {
    let reason = pods.placement.reason();
    if pods.placement.placed() {
        tracing::info!(pod_level = pods.level, tiers = ?pods.tiers, reason, "{what}: each pod's socket records count against the pod");
    } else {
        tracing::warn!(
            pod_level = pods.level,
            reason,
            "{what}: the per-pod bound cannot find pods"
        );
    }
}

/// Looks again where pods are in the cgroup tree (the kubelet's tiers may come after the agent).
pub(in crate::agent) fn refresh_pods(dataplane: &mut Dataplane) {
    match dataplane.refresh_pods() {
        Ok(true) => log_placement(&dataplane.pods, "where pods are in the cgroup tree changed"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            error = &e as &dyn std::error::Error,
            "could not update the programs' settings"
        ),
    }
}
