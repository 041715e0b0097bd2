//! `socklb agent`: binds its listeners, loads the programs, follows a source, keeps the maps in
//! step, attaches the programs once the maps hold a complete view, and serves health,
//! readiness, status and metrics.
//!
//! Start-up order, so that a failure leaves nothing changed: bind the listeners; take the pin
//! folder's lock; create or adopt the maps and load (verify) the programs; drop capabilities;
//! list the sources and write the first full sync; only then attach the programs (until then
//! whatever was attached before keeps serving).
mod api_route;
mod connections;
mod engine;
mod http;
mod memory;
mod metrics;
mod probes;
mod security;

pub use connections::REFRESH as CENSUS_EVERY;
pub use engine::{Engine, Pass};
pub use memory::limit_arenas;
pub use metrics::{Format, Metrics};
/// The capabilities the running agent keeps, each with its reason.
pub use security::KEEP as CAPABILITIES_KEPT;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use self::api_route::ApiRoute;
use crate::{
    dataplane::{
        abi::frontend_key,
        bpf::BpfServiceMaps,
        features::{Features, State},
        loader::{Dataplane, LoadConfig},
        sockets::{self, SocketPins, quota},
    },
    reconcile::Reconciler,
    source::{self, SourceEvent},
    status::{Failed, Owned, Rejected, Status},
    translate::NodeFlags,
    vocab::{Protocol, ServiceAddr},
};

/// How long the source may fail before the agent reports itself not ready.
const UNHEALTHY_GRACE: Duration = Duration::from_secs(5);
/// How often the agent recounts the per-pod socket records from the live sockets: a safety net
/// (the kernel keeps the counts exact), whatever any pod does.
const RECOUNT_EVERY: Duration = Duration::from_mins(5);
/// How often the agent looks again where pods are in the cgroup tree.
const PODS_EVERY: Duration = Duration::from_secs(30);

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
}

/// The listeners, bound before anything else happens.
pub struct Listeners {
    health: Option<std::net::TcpListener>,
    metrics: Option<std::net::TcpListener>,
    prometheus: Option<std::net::TcpListener>,
    kube_proxy_healthz: Option<std::net::TcpListener>,
}

impl Listeners {
    /// Binds every address; a port in use fails here, before the data path is touched.
    pub fn bind(config: &AgentConfig) -> anyhow::Result<Self> {
        let bind = |addr: Option<SocketAddr>, what: &str| -> anyhow::Result<_> {
            addr.map(|a| {
                let l = std::net::TcpListener::bind(a)
                    .with_context(|| format!("binding the {what} address {a}"))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .transpose()
        };
        Ok(Self {
            health: bind(config.health_listen, "health")?,
            metrics: bind(config.metrics_listen, "metrics")?,
            prometheus: bind(config.prometheus_listen, "prometheus")?,
            kube_proxy_healthz: config
                .kube_proxy_healthz
                .map(|a| {
                    let l = listen_like_go(a)
                        .with_context(|| format!("binding the kube-proxy healthz address {a}"))?;
                    l.set_nonblocking(true)?;
                    anyhow::Ok(l)
                })
                .transpose()
                .context(
                    "kube-proxy serves this port while it runs: next to kube-proxy, leave \
                     --kube-proxy-healthz off",
                )?,
        })
    }
}

/// A listener as Go's `net.Listen("tcp", addr)` makes it, which kube-proxy's health server
/// uses: the unspecified address (`0.0.0.0` or `::`) becomes one IPv6 socket with
/// `IPV6_V6ONLY` off, answering IPv4 and IPv6 whatever `net.ipv6.bindv6only` says (an IPv4
/// socket where the kernel has no IPv6); any other address listens on itself only.
fn listen_like_go(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    if !addr.ip().is_unspecified() {
        return std::net::TcpListener::bind(addr);
    }
    let any_v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
    let fd = match rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::AFNOSUPPORT) => return std::net::TcpListener::bind(any_v4),
        Err(e) => return Err(e.into()),
    };
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_ipv6_v6only(&fd, false)?;
    let any_v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), addr.port());
    rustix::net::bind(&fd, &any_v6)?;
    rustix::net::listen(&fd, 128)?;
    Ok(std::net::TcpListener::from(fd))
}

/// State shared with the HTTP server.
pub struct Shared {
    pub ready: AtomicBool,
    /// What the kernel said about each optional part, at start.
    pub features: Features,
    /// One UDP-termination pass at a time; a change during a pass asks for another.
    udp_pass: Mutex<Pass2>,
    /// The live connections, as last counted.
    pub connections: connections::Handle,
    /// The UDP backend sets' serving endpoints for the pass asked for while one ran.
    udp_serving:
        Mutex<Option<std::collections::HashMap<lb_common::FrontendKey, Arc<[SocketAddr]>>>>,
    /// Since when changes wait to be written (liveness, and kube-proxy's health).
    pub progress: Mutex<Progress>,
    pub stuck_after: Duration,
    pub healthz_stale_after: Duration,
    pub metrics: Metrics,
    pub status: Mutex<Status>,
    /// What kube-proxy's /healthz says about the node.
    pub node_health: probes::NodeHealth,
}

/// Whether a UDP-termination pass runs, and whether another was asked for meanwhile.
#[derive(Debug, Default)]
struct Pass2 {
    running: bool,
    again: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// The oldest change that arrived after the first full sync and is not written yet
    /// (`Engine::unapplied_since`).
    pub unapplied_since: Option<Instant>,
}

impl Shared {
    fn new(
        config: &AgentConfig,
        dataplane: &Dataplane,
        connections: connections::Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            connections,
            ready: AtomicBool::new(false),
            features: dataplane.features.clone(),
            udp_pass: Mutex::new(Pass2::default()),
            udp_serving: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            stuck_after: config.stuck_after,
            healthz_stale_after: config.healthz_stale_after,
            metrics: Metrics::new(dataplane.maps_dir.clone(), &dataplane.features),
            status: Mutex::new(Status::default()),
            node_health: probes::NodeHealth::new(config.external_traffic),
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

pub async fn run(
    config: AgentConfig,
    listeners: Listeners,
    mut dataplane: Dataplane,
) -> anyhow::Result<()> {
    spawn_ebpf_logger(&mut dataplane, config.load.log_level);
    let maps = dataplane
        .service_maps()
        .context("opening the service maps")?;
    let reconciler = Reconciler::new(maps).context("reading the pinned maps")?;
    if reconciler.service_count() > 0 {
        tracing::info!(
            service_ports = reconciler.service_count(),
            "adopted pinned state; it stays in effect until the first complete sync"
        );
    }
    let flags = node_flags(&config).await;
    let (mut version_rx, version_asked) = spawn_version_follower(&config, flags.kube_version);
    let mut engine = Engine::new(reconciler, flags);
    let (mut refresher, mut inbox, handle) = connections::Refresher::new(
        dataplane.sockets.clone(),
        dataplane.features.listing(),
        config.load.cgroup.clone(),
    );
    let shared = Shared::new(&config, &dataplane, handle);
    serve(listeners, &shared)?;

    let (tx, mut rx) = mpsc::channel::<SourceEvent>(4096);
    // This node's interface addresses first: none of them may be written as a frontend.
    engine.await_local_addresses();
    watch_the_node(&tx)?;
    let mut api_route = start_source(&config, tx).await?;

    let mut retry = tokio::time::interval(config.retry_interval);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pods_tick = tokio::time::interval(PODS_EVERY);
    pods_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut census_tick = tokio::time::interval(connections::REFRESH);
    census_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut attached = false;
    let mut unhealthy_since: Option<Instant> = None;
    let mut health_checks = config
        .health_check_node_ports
        .then(|| probes::HealthCheckServers::new(shared.clone()));
    loop {
        tokio::select! {
            event = rx.recv() => {
                let Some(event) = event else {
                    anyhow::bail!("the source stopped");
                };
                engine.handle(event);
                while let Ok(event) = rx.try_recv() {
                    engine.handle(event);
                }
            }
            _ = retry.tick() => {
                engine.retry_failed();
                // Ports that could not listen are tried again.
                if let Some(servers) = health_checks.as_mut().filter(|s| s.failing() > 0) {
                    sync_health_checks(servers, &engine);
                }
            }
            Some(version) = version_rx.recv() => engine.set_kube_version(version),
            _ = census_tick.tick() => {
                refresher.start();
                record_counts(&config, &dataplane, &shared);
            }
            _ = pods_tick.tick(), if attached => refresh_pods(&mut dataplane),
            Some(()) = inbox.asked.recv() => refresher.start(),
            Some(counted) = inbox.done.recv() => {
                if let Some((view, took)) = refresher.finish(counted, &engine) {
                    shared.metrics.record_connections(&view, took);
                }
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
        if let Some(pass) = engine.reconcile() {
            log_pass(&pass);
            if pass.report.udp_changed && attached && shared.features.udp_termination() {
                terminate_udp_sockets(&config, &dataplane, &engine, &shared);
            }
            shared.metrics.record_pass(&pass);
            shared.node_health.written(&engine);
            if let Some(servers) = &mut health_checks {
                sync_health_checks(servers, &engine);
            }
        }
        if engine.is_synced() && !attached {
            attach(&config, &mut dataplane, &engine, &shared)?;
            attached = true;
        }
        check_api_route(api_route.as_mut().filter(|_| attached), &engine);
        if record_progress(&engine, &shared, attached, &mut unhealthy_since) {
            // The watches work again: after a control-plane upgrade the version may be newer.
            version_asked.notify_one();
        }
        record_state(&engine, &shared, health_checks.as_ref());
    }
    tracing::info!(
        "stopping; programs and maps stay pinned and keep serving (`socklb reset` removes them)"
    );
    Ok(())
}

/// Follows this node's interface addresses and listening sockets, each on a thread of its own.
fn watch_the_node(tx: &mpsc::Sender<SourceEvent>) -> std::io::Result<()> {
    let addresses_tx = tx.clone();
    std::thread::Builder::new()
        .name("addresses".into())
        .spawn(move || source::addresses::watch(&addresses_tx))?;
    let listeners_tx = tx.clone();
    std::thread::Builder::new()
        .name("listeners".into())
        .spawn(move || source::addresses::watch_listeners(&listeners_tx))?;
    Ok(())
}

/// After the first complete sync: attaches the programs, starts the recounts, and looks for the
/// connected UDP sockets whose backend left while no agent ran (they are found now, not at the
/// next change).
fn attach(
    config: &AgentConfig,
    dataplane: &mut Dataplane,
    engine: &Engine<BpfServiceMaps>,
    shared: &Arc<Shared>,
) -> anyhow::Result<()> {
    let ids = dataplane.attach().context("attaching the programs")?;
    tracing::info!(
        cgroup = %config.load.cgroup.display(),
        programs = ids.len(),
        pod_level = dataplane.config().pod_level,
        "first complete sync written; programs attached"
    );
    spawn_recount(config, dataplane, shared);
    if shared.features.udp_termination() {
        terminate_udp_sockets(config, dataplane, engine, shared);
    }
    Ok(())
}

/// This node's identity from the flags, with the API server's Kubernetes version when no flag
/// gives one.
async fn node_flags(config: &AgentConfig) -> crate::translate::NodeFlags {
    let mut flags = config.node.clone();
    if config.ask_api_version {
        flags.kube_version = api_version(config).await.unwrap_or(flags.kube_version);
    }
    tracing::info!(
        kubernetes = %flags.kube_version,
        "following this version's kube-proxy topology rules"
    );
    flags
}

/// The API server's Kubernetes version, for the topology rules; `None` (and a warning) when it
/// cannot be asked.
async fn api_version(config: &AgentConfig) -> Option<crate::translate::KubeVersion> {
    let SourceConfig::Kubernetes {
        kubeconfig,
        api_server,
    } = &config.source
    else {
        return None;
    };
    let asked = async {
        let client = source::kube::client(kubeconfig.as_deref(), api_server.as_deref()).await?;
        ask_version(&client).await
    };
    match asked.await {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, "could not ask the API server its version; following the newest topology rules (set --kubernetes-version)");
            None
        }
    }
}

async fn ask_version(client: &kube::Client) -> anyhow::Result<crate::translate::KubeVersion> {
    let (major, minor) = source::kube::server_version(client).await?;
    crate::translate::KubeVersion::parse(&format!("{major}.{minor}"))
        .ok_or_else(|| anyhow::anyhow!("version {major}.{minor} not understood"))
}

/// How often the agent asks the API server its version again (also after every watch that
/// failed works again: a control-plane upgrade restarts the API servers).
const VERSION_EVERY: Duration = Duration::from_mins(10);

/// Which version to follow once the API server says `told` while `known` is followed: only a
/// newer one. During an upgrade of several API servers `/version` answers from whichever one
/// serves the request, old or new; the rules must not flap between them. A downgrade is
/// followed after a restart (or with `--kubernetes-version`).
fn newer_version(
    known: crate::translate::KubeVersion,
    told: crate::translate::KubeVersion,
) -> Option<crate::translate::KubeVersion> {
    (told > known).then_some(told)
}

/// With the API server's version to follow (no `--kubernetes-version`), starts
/// `follow_api_version`: the newer versions it finds, and what asks it to look now.
fn spawn_version_follower(
    config: &AgentConfig,
    known: crate::translate::KubeVersion,
) -> (
    mpsc::Receiver<crate::translate::KubeVersion>,
    Arc<tokio::sync::Notify>,
) {
    let (tx, rx) = mpsc::channel(4);
    let asked = Arc::new(tokio::sync::Notify::new());
    if config.ask_api_version {
        tokio::spawn(follow_api_version(config.clone(), known, asked.clone(), tx));
    }
    (rx, asked)
}

/// Asks the API server its version every `VERSION_EVERY` and when `asked`; sends each newer
/// one (the loop re-translates everything with its rules).
async fn follow_api_version(
    config: AgentConfig,
    mut known: crate::translate::KubeVersion,
    asked: Arc<tokio::sync::Notify>,
    tx: mpsc::Sender<crate::translate::KubeVersion>,
) {
    let SourceConfig::Kubernetes {
        kubeconfig,
        api_server,
    } = &config.source
    else {
        return;
    };
    let mut client: Option<kube::Client> = None;
    let mut older_said = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(VERSION_EVERY) => {}
            () = asked.notified() => {}
        }
        if client.is_none() {
            client = source::kube::client(kubeconfig.as_deref(), api_server.as_deref())
                .await
                .inspect_err(|e| tracing::debug!(error = %e, "building a client to ask the API server's version"))
                .ok();
        }
        let Some(c) = &client else { continue };
        let told = match ask_version(c).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "could not ask the API server its version; asked again later");
                continue;
            }
        };
        match newer_version(known, told) {
            Some(newer) => {
                tracing::info!(
                    was = %known,
                    kubernetes = %newer,
                    "the API server's version changed: following this version's kube-proxy topology rules (everything is translated again)"
                );
                known = newer;
                older_said = None;
                if tx.send(newer).await.is_err() {
                    return;
                }
            }
            None if told < known && older_said != Some(told) => {
                tracing::info!(
                    kubernetes = %known,
                    api_server = %told,
                    "an API server says an older version (mid-upgrade?): keeping the newer rules until the agent restarts"
                );
                older_said = Some(told);
            }
            None => {}
        }
    }
}

/// Serves health, metrics and status on the listeners bound at start.
fn serve(listeners: Listeners, shared: &Arc<Shared>) -> anyhow::Result<()> {
    if let Some(l) = listeners.health {
        tracing::info!(listen = %l.local_addr()?, "serving /healthz, /livez, /readyz");
        tokio::spawn(http::serve_health(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if let Some(l) = listeners.kube_proxy_healthz {
        tracing::info!(listen = %l.local_addr()?, "serving kube-proxy's /healthz and /livez");
        tokio::spawn(probes::serve_kube_proxy_healthz(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if listeners.metrics.is_some() || listeners.prometheus.is_some() {
        tokio::spawn(http::refresh_affinity(shared.clone()));
    }
    if let Some(l) = listeners.metrics {
        tracing::info!(listen = %l.local_addr()?, "serving /metrics, /status, /connections");
        tokio::spawn(http::serve_metrics(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if let Some(l) = listeners.prometheus {
        tracing::info!(listen = %l.local_addr()?, "serving /metrics alone");
        tokio::spawn(http::serve_prometheus(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    Ok(())
}

/// Starts the source; with the Kubernetes API and no `--api-server`, also returns the API
/// server's address, to tell when it is a ClusterIP (see `api_route`).
async fn start_source(
    config: &AgentConfig,
    tx: mpsc::Sender<SourceEvent>,
) -> anyhow::Result<Option<ApiRoute>> {
    match &config.source {
        SourceConfig::Manifests {
            dir,
            max_file_bytes,
        } => {
            anyhow::ensure!(dir.is_dir(), "--manifests {}: not a folder", dir.display());
            let (dir, node) = (dir.clone(), config.node.name.clone());
            let options = source::files::Options {
                max_file_bytes: *max_file_bytes,
                ..source::files::Options::default()
            };
            std::thread::Builder::new()
                .name("manifests".into())
                .spawn(move || source::files::watch_with(&dir, node.as_deref(), &options, &tx))?;
        }
        SourceConfig::Kubernetes {
            kubeconfig,
            api_server,
        } => {
            let client_config = source::kube::config(kubeconfig.as_deref(), api_server.as_deref())
                .await
                .context("reading the Kubernetes client configuration")?;
            let url = &client_config.cluster_url;
            tracing::info!(server = %url, "reading Services and EndpointSlices from the API");
            let mut route = if api_server.is_none() {
                ApiRoute::new(url.scheme_str(), url.host(), url.port_u16())
            } else {
                None
            };
            if let Some(r) = route.as_mut() {
                // The agent answers on kube-proxy's port itself: that says nothing of kube-proxy.
                r.kube_proxy_replaced = config.kube_proxy_healthz.is_some();
                let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
                tokio::task::block_in_place(|| r.check_start(host.as_deref()));
            }
            let client =
                kube::Client::try_from(client_config).context("building the Kubernetes client")?;
            tokio::spawn(source::kube::watch(client, config.node.name.clone(), tx));
            return Ok(route);
        }
    }
    Ok(None)
}

/// Whether the API server's address is a Service frontend in the maps (once they are attached):
/// the agent would depend on its own translation (said once).
fn check_api_route(route: Option<&mut ApiRoute>, engine: &Engine<BpfServiceMaps>) {
    let Some(route) = route else {
        return;
    };
    let server = ServiceAddr::new(route.server.ip(), route.server.port(), Protocol::Tcp);
    let frontends = &engine.reconciler().snapshot().frontends;
    let is_frontend = frontends.contains_key(&frontend_key(server));
    tokio::task::block_in_place(|| route.check_frontend(is_frontend));
}

/// Destroys connected UDP sockets whose backend stopped serving, off the event loop, one pass
/// at a time: a change while a pass runs makes it run once more with the latest state.
fn terminate_udp_sockets(
    config: &AgentConfig,
    dataplane: &Dataplane,
    engine: &Engine<BpfServiceMaps>,
    shared: &Arc<Shared>,
) {
    {
        let mut pass = shared
            .udp_pass
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if pass.running {
            pass.again = true;
            // The running pass reads the state it was given; the next one needs the new state.
            *shared
                .udp_serving
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(engine.reconciler().udp_serving());
            return;
        }
        pass.running = true;
    }
    let serving = engine.reconciler().udp_serving();
    let (cgroup, pins, listing, shared) = (
        config.load.cgroup.clone(),
        dataplane.sockets.clone(),
        dataplane.features.listing(),
        shared.clone(),
    );
    tokio::task::spawn_blocking(move || {
        let mut serving = serving;
        loop {
            udp_pass(&pins, listing, &cgroup, &serving, &shared);
            let mut pass = shared
                .udp_pass
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !pass.again {
                pass.running = false;
                return;
            }
            pass.again = false;
            if let Some(newer) = shared
                .udp_serving
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                serving = newer;
            }
        }
    });
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

/// Starts the recount loop when the per-pod bound is on (once the programs are attached).
fn spawn_recount(config: &AgentConfig, dataplane: &Dataplane, shared: &Arc<Shared>) {
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
fn record_counts(config: &AgentConfig, dataplane: &Dataplane, shared: &Arc<Shared>) {
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

/// Looks again where pods are in the cgroup tree (the kubelet's tiers may come after the agent).
fn refresh_pods(dataplane: &mut Dataplane) {
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

/// Readiness, liveness and the Node's eligibility from the engine's state. Readiness also goes
/// while the watches keep failing (no Service routes to the agent, and a rollout waits);
/// liveness does not. Returns whether the watches work again after failing.
fn record_progress(
    engine: &Engine<BpfServiceMaps>,
    shared: &Shared,
    attached: bool,
    unhealthy_since: &mut Option<Instant>,
) -> bool {
    shared
        .node_health
        .follow(engine.node_object(), engine.node_deleted());
    let was_failing = unhealthy_since.is_some();
    *unhealthy_since = if engine.is_healthy() {
        None
    } else {
        unhealthy_since.or(Some(Instant::now()))
    };
    // A watch that fails once (a 410 Gone before the re-list, a dropped connection) is not
    // "failing": readiness goes only when it stays unhealthy.
    let ready = attached && unhealthy_since.is_none_or(|t| t.elapsed() < UNHEALTHY_GRACE);
    if shared.ready.swap(ready, Ordering::Relaxed) != ready {
        tracing::info!(ready, "readiness changed");
    }
    *shared
        .progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Progress {
        unapplied_since: engine.unapplied_since(),
    };
    was_failing && unhealthy_since.is_none()
}

/// Opens and closes the healthCheckNodePorts as the Services say.
fn sync_health_checks(servers: &mut probes::HealthCheckServers, engine: &Engine<BpfServiceMaps>) {
    servers.sync(
        crate::translate::health_checks(engine.store(), engine.node()),
        &probes::listen_addresses(engine.node()),
    );
}

fn record_state(
    engine: &Engine<BpfServiceMaps>,
    shared: &Shared,
    health_checks: Option<&probes::HealthCheckServers>,
) {
    let r = engine.reconciler();
    shared.metrics.record_state(
        engine,
        health_checks.map_or(0, probes::HealthCheckServers::failing),
    );
    let status = Status {
        version: crate::status::VERSION.to_string(),
        commit: crate::status::COMMIT.to_string(),
        ready: shared.ready.load(Ordering::Relaxed),
        failed: r
            .failed()
            .iter()
            .map(|(k, e)| Failed {
                service_port: k.clone(),
                kind: e.kind(),
                error: e.to_string(),
            })
            .collect(),
        conflicts: engine
            .conflicts()
            .iter()
            .flat_map(|(k, list)| {
                list.iter().map(|c| Owned {
                    service_port: k.clone(),
                    conflict: c.clone(),
                })
            })
            .collect(),
        rejected: engine
            .rejected()
            .iter()
            .map(|(s, m)| Rejected {
                subject: s.clone(),
                message: m.clone(),
            })
            .collect(),
        refused_addresses: engine
            .refused()
            .iter()
            .flat_map(|(service, list)| {
                list.iter().map(|r| crate::status::RefusedAddress {
                    service: service.clone(),
                    refusal: r.clone(),
                })
            })
            .collect(),
        features: shared.features.probes.clone(),
        degraded: shared
            .features
            .losses()
            .into_iter()
            .map(str::to_string)
            .collect(),
        health_check_ports: health_checks
            .map(probes::HealthCheckServers::report)
            .unwrap_or_default(),
    };
    *shared.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
}

fn log_pass(pass: &Pass) {
    let report = &pass.report;
    if pass.full {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            changed = report.services_changed,
            removed = report.services_removed,
            failing = report.failed.len(),
            duration_ms = pass.duration.as_secs_f64() * 1e3,
            "full sync"
        );
    } else if report.writes > 0 || !report.failed.is_empty() {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            failing = report.failed.len(),
            duration_us = pass.duration.as_micros() as u64,
            "sync"
        );
    }
    for (key, conflict) in &pass.new_conflicts {
        tracing::warn!(service = %key, "address not served: {conflict}");
    }
}

/// With a log level above 0, forwards the programs' aya-log records to our logs.
fn spawn_ebpf_logger(dataplane: &mut Dataplane, level: u8) {
    if level == 0 {
        return;
    }
    match aya_log::EbpfLogger::init(&mut dataplane.ebpf) {
        Ok(logger) => {
            tokio::spawn(async move {
                // SAFETY: the logger owns its ring buffer descriptor for as long as the AsyncFd
                // holds the logger, and nothing else closes it.
                let registered = unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        logger,
                        tokio::io::Interest::READABLE,
                    )
                };
                let Ok(mut fd) = registered else {
                    return;
                };
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        return;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "eBPF log forwarding unavailable"),
    }
}

#[cfg(test)]
mod tests {
    use super::newer_version;
    use crate::translate::KubeVersion;

    /// A control-plane upgrade raises the rules; an API server of the old version answering in
    /// the middle of it does not lower them again.
    #[test]
    fn only_a_newer_api_server_version_is_followed() {
        let v = |minor| KubeVersion { minor };
        assert_eq!(newer_version(v(33), v(34)), Some(v(34)));
        assert_eq!(newer_version(v(34), v(34)), None);
        assert_eq!(newer_version(v(34), v(33)), None);
    }
}
