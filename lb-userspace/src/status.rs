//! The agent's own account of what it could not do, served as JSON on /status and read back by
//! `socklb explain` (which therefore does not depend on the agent module): build, readiness,
//! failed backend sets with their `ErrorKind`, address conflicts, rejected subjects, refused
//! addresses (`refused_addresses`), each optional part's `Probe` and the guarantees lost
//! (`features`, `degraded`), and the healthCheckNodePorts served (`health_check_ports`).
use serde::{Deserialize, Serialize};

use crate::{
    dataplane::features::Probe,
    translate::Conflict,
    vocab::{ErrorKind, ServicePortKey, Subject},
};

/// This build's version (what /status and `socklb version` report).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit this build came from (`unknown` outside a checkout).
pub const COMMIT: &str = env!("SOCKLB_GIT_COMMIT");

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub commit: String,
    /// The first complete sync is written and every watch works.
    pub ready: bool,
    /// Backend sets whose last write failed (they stay on their previous state), and why.
    pub failed: Vec<Failed>,
    /// Addresses a backend set claims that another owns (not written for the loser).
    pub conflicts: Vec<Owned>,
    /// Objects and files that could not be used (their last good version stays in effect).
    pub rejected: Vec<Rejected>,
    /// Addresses Services name that are never a frontend (loopback, link-local, this node's
    /// own, ...), with the Service and the field.
    #[serde(default)]
    pub refused_addresses: Vec<RefusedAddress>,
    /// Each optional part of the data path: enabled, disabled by flag, or refused by the kernel
    /// (with its errno and message).
    #[serde(default)]
    pub features: Vec<Probe>,
    /// The guarantees lost with the parts that are off, in words (empty: nothing lost).
    #[serde(default)]
    pub degraded: Vec<String>,
    /// The healthCheckNodePorts served (`--health-check-node-ports`), and those that could not
    /// listen.
    #[serde(default)]
    pub health_check_ports: Vec<HealthCheckPort>,
    /// Where pods are in the cgroup tree (the level whose cgroups the per-pod bound counts),
    /// how that was found and why.
    #[serde(default)]
    pub pods: Option<PodsReport>,
    /// The outside path (`--external-traffic nftables`): whether its rules hold what the
    /// Services ask for, and its last sync.
    #[serde(default)]
    pub outside: Option<OutsideReport>,
}

/// Where the outside path's rules stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutsideCondition {
    /// Every family's table holds what socklb last wrote, and that is the Services' state.
    InSync,
    /// The last sync failed (`reason` says why); the rules of before stay and it is retried.
    Failing,
    /// Asked for, but the node cannot run it (`reason` names what is missing); the socket path
    /// works on.
    Off,
}

/// The outside path, for `/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideReport {
    pub condition: OutsideCondition,
    pub reason: Option<String>,
    /// Service ports (per family) served from outside.
    pub service_ports: usize,
    pub syncs: u64,
    pub failures: u64,
    /// Times the rules were found changed by someone else and written again.
    pub drift_repairs: u64,
    /// UDP flows cleared because their endpoint stopped serving.
    pub udp_flows_cleared: u64,
    /// The last successful sync: how long it took and what it wrote.
    pub last_sync_ms: Option<u64>,
    pub last_full: bool,
    pub last_chains_written: usize,
    pub last_elements_written: usize,
}

/// What counts as a pod for the per-pod bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodsReport {
    /// The cgroup level of a pod (0: the root), one further down under a quality-of-service tier.
    pub level: u32,
    pub placement: crate::dataplane::pods::Placement,
    pub reason: String,
}

/// One healthCheckNodePort.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheckPort {
    pub port: u16,
    pub service: crate::vocab::ObjectKey,
    /// What it counts: distinct IPs of the Service's ready endpoints on this node.
    pub local_endpoints: usize,
    /// Where it listens (empty: it could not; see `error`).
    pub listening: Vec<std::net::SocketAddr>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    pub service_port: ServicePortKey,
    pub kind: ErrorKind,
    pub error: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owned {
    pub service_port: ServicePortKey,
    pub conflict: Conflict,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedAddress {
    pub service: crate::vocab::ObjectKey,
    pub refusal: crate::translate::Refusal,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    pub subject: Subject,
    pub message: String,
}

impl Status {
    /// The problems the agent reports for one backend set.
    pub fn problems_of(&self, key: &ServicePortKey) -> Vec<String> {
        let failed = self
            .failed
            .iter()
            .filter(|f| &f.service_port == key)
            .map(|f| f.error.clone());
        let conflicts = self
            .conflicts
            .iter()
            .filter(|c| &c.service_port == key)
            .map(|c| c.conflict.to_string());
        failed.chain(conflicts).collect()
    }
}
