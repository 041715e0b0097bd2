//! `socklb agent`: binds its listeners, loads the programs, follows a source, keeps the maps in
//! step, attaches the programs once the maps hold a complete view, and serves health,
//! readiness, status and metrics.
//!
//! Start-up order, so that a failure leaves nothing changed: bind the listeners; take the pin
//! folder's lock; create or adopt the maps and load (verify) the programs; drop capabilities;
//! list the sources and write the first full sync; only then attach the programs (until then
//! whatever was attached before keeps serving).
//!
//! - `event_loop`: the one loop that owns the engine; it routes events (source changes, ticks,
//!   finished background work) to the engine and to the periodic tasks, and records health.
//! - `tasks/`: each periodic or background task in its own file, with its state: the UDP
//!   termination pass, the per-pod recount and counts, the API version follower, the
//!   live-connection census, the pods' cgroup level.
//! - `start`: the source, this node's watches and identity.
//! - `listeners`, `http`, `probes`: the agent's own HTTP endpoints and kube-proxy's ports.
//! - `shared`: the state the HTTP handlers read.
//! - `engine`: objects → desired state → reconciler, with the agent's bookkeeping.
mod api_route;
mod engine;
mod event_loop;
mod http;
mod listeners;
mod memory;
mod metrics;
mod probes;
mod security;
mod shared;
mod start;
mod tasks;

pub use engine::{Engine, Pass};
pub use listeners::Listeners;
pub use memory::limit_arenas;
pub use metrics::{Format, Metrics};
/// The capabilities the running agent keeps, each with its reason.
pub use security::KEEP as CAPABILITIES_KEPT;
pub use shared::{Progress, Shared};
pub use tasks::census::REFRESH as CENSUS_EVERY;
pub use tasks::growth::parse_bytes;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;

use crate::{
    dataplane::{
        features::{Features, State},
        loader::{Dataplane, LoadConfig},
    },
    translate::NodeFlags,
};

/// Where the agent reads Services and EndpointSlices from.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A folder of YAML manifests, watched for changes; bigger files are rejected.
    Manifests { dir: PathBuf, max_file_bytes: u64 },
    /// The Kubernetes API: a kubeconfig file, in-cluster credentials, or `$KUBECONFIG`;
    /// `api_server` replaces the server address (replace mode: never through a ClusterIP).
    Kubernetes {
        kubeconfig: Option<PathBuf>,
        api_server: Option<String>,
    },
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub source: SourceConfig,
    pub load: LoadConfig,
    pub node: NodeFlags,
    /// /healthz, /livez, /readyz; `None` turns it off.
    pub health_listen: Option<SocketAddr>,
    /// /metrics, /status, /connections; `None` turns it off.
    pub metrics_listen: Option<SocketAddr>,
    /// /metrics alone, for a scraper off the node; `None` turns it off.
    pub prometheus_listen: Option<SocketAddr>,
    /// kube-proxy's /healthz and /livez (its `--healthz-bind-address`); `None`: off.
    pub kube_proxy_healthz: Option<SocketAddr>,
    /// Serve healthCheckNodePorts (`--health-check-node-ports`).
    pub health_check_node_ports: bool,
    /// `--external-traffic carried`: another component on this node carries Service traffic
    /// arriving from outside it (NodePorts, load-balancer IPs on the wire), which socklb does
    /// not translate. Without it the load-balancer probes say this node has nothing to offer.
    pub external_traffic: bool,
    /// `--external-traffic nftables`: socklb carries that traffic itself, with these options.
    pub outside: Option<crate::outside::render::RenderOptions>,
    /// How often failed backend sets are retried.
    pub retry_interval: Duration,
    /// The agent's own /livez fails when a change stays unwritten this long (an unreachable
    /// API server sends no change: it never fails /livez).
    pub stuck_after: Duration,
    /// kube-proxy's /healthz and /livez, and `serviceProxyHealthy` on the health-check ports,
    /// turn 503 when a change stays unwritten this long (kube-proxy's `2 × syncPeriod`).
    pub healthz_stale_after: Duration,
    /// Take the topology rules' Kubernetes version from the API server (no
    /// `--kubernetes-version` given).
    pub ask_api_version: bool,
    /// The most the maps of one generation may take, in bytes (`--max-map-memory`): they grow
    /// up to it before they fill (0: they keep their configured sizes).
    pub map_memory_ceiling: u64,
}

/// Loads the programs (nothing attached yet), then drops the capabilities the agent no longer
/// needs. Runs before the async runtime starts any thread (capabilities are per thread).
pub fn prepare(config: &AgentConfig) -> anyhow::Result<Dataplane> {
    let dataplane = Dataplane::load(&config.load).context("loading the data path")?;
    tracing::info!(
        maps = %dataplane.maps_dir.display(),
        adopted = dataplane.adopted,
        "programs loaded and verified; they attach after the first complete sync"
    );
    log_features(&dataplane.features);
    match security::drop_capabilities() {
        Ok(kept) => tracing::info!(?kept, "dropped the other capabilities"),
        Err(e) => tracing::warn!(error = %e, "could not drop capabilities; running with all"),
    }
    Ok(dataplane)
}

/// Runs the agent until SIGTERM or SIGINT: see `event_loop`.
pub async fn run(
    config: AgentConfig,
    listeners: Listeners,
    dataplane: Dataplane,
) -> anyhow::Result<()> {
    event_loop::run(config, listeners, dataplane).await
}

/// Says once, at start, which optional parts are off and why, and what that costs.
fn log_features(features: &Features) {
    for probe in &features.probes {
        match probe.state {
            State::Enabled => {}
            State::Disabled => tracing::info!(
                feature = %probe.feature,
                "optional part turned off with --disable-feature"
            ),
            State::Refused => tracing::warn!(
                feature = %probe.feature,
                errno = probe.errno,
                reason = probe.reason.as_deref().unwrap_or(""),
                "the kernel refused an optional part; running without it"
            ),
        }
    }
    for fallback in features.fallbacks() {
        tracing::info!("{fallback}");
    }
    for lost in features.losses() {
        tracing::warn!(lost, "a guarantee is lost with the parts that are off");
    }
}
