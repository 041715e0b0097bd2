//! `socklb agent`: loads and attaches the programs, follows a source, keeps the maps in step,
//! and serves health, readiness and metrics.
mod engine;
mod http;
mod memory;
mod metrics;
mod security;

pub use engine::{Engine, Pass};
pub use memory::limit_arenas;
pub use metrics::Metrics;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use crate::{
    dataplane::{
        bpf::BpfServiceMaps,
        loader::{Dataplane, LoadConfig},
        udp_sockets,
    },
    reconcile::Reconciler,
    source::{self, SourceEvent},
    translate::NodeInfo,
};

/// Where the agent reads Services and EndpointSlices from.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A folder of YAML manifests, polled for changes.
    Manifests { dir: PathBuf, poll: Duration },
    /// The Kubernetes API: a kubeconfig file, or in-cluster / `$KUBECONFIG` when `None`.
    Kubernetes { kubeconfig: Option<PathBuf> },
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub source: SourceConfig,
    pub load: LoadConfig,
    pub node: NodeInfo,
    /// Where /healthz, /readyz, /status and /metrics are served; `None` turns the server off.
    pub listen: Option<SocketAddr>,
    /// How often failed service ports are retried.
    pub retry_interval: Duration,
}

/// State shared with the HTTP server.
pub struct Shared {
    pub ready: AtomicBool,
    pub metrics: Metrics,
    /// What /status reports: service ports not in the maps as asked, and rejected objects.
    pub status: std::sync::Mutex<Status>,
}

/// The agent's own account of what it could not do, served as JSON on /status (and read by
/// `socklb explain`).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Status {
    pub ready: bool,
    /// Service port (`namespace/name:port/PROTO family scope`) → why it is not as desired.
    pub problems: std::collections::BTreeMap<String, String>,
    /// Object (`Kind namespace/name`) → why it was rejected.
    pub rejected: std::collections::BTreeMap<String, String>,
}

/// Loads and attaches the programs, then drops the capabilities the agent no longer needs.
/// Runs before the async runtime starts any thread (capabilities are per thread).
pub fn prepare(config: &AgentConfig) -> anyhow::Result<Dataplane> {
    let dataplane = Dataplane::load(&config.load).context("loading the data path")?;
    tracing::info!(
        cgroup = %config.load.cgroup.display(),
        pins = %dataplane.pins.root.display(),
        programs = dataplane.program_ids.len(),
        "programs attached"
    );
    match security::drop_capabilities() {
        Ok(kept) => tracing::info!(?kept, "dropped the other capabilities"),
        Err(e) => tracing::warn!(error = %e, "could not drop capabilities; running with all"),
    }
    Ok(dataplane)
}

pub async fn run(config: AgentConfig, mut dataplane: Dataplane) -> anyhow::Result<()> {
    spawn_ebpf_logger(&mut dataplane, config.load.log_level);

    let maps = dataplane
        .service_maps()
        .context("opening the service maps")?;
    let reconciler = Reconciler::new(maps).context("reading the pinned maps")?;
    if !reconciler.service_ids().is_empty() {
        tracing::info!(
            service_ports = reconciler.service_ids().len(),
            "adopted pinned state; it stays in effect until the first complete sync"
        );
    }
    let mut engine = Engine::new(reconciler, config.node.clone());

    let shared = Arc::new(Shared {
        ready: AtomicBool::new(false),
        metrics: Metrics::new(Some(dataplane.pins.maps())),
        status: std::sync::Mutex::new(Status::default()),
    });
    if let Some(listen) = config.listen {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(%listen, "serving /healthz, /readyz, /metrics");
        tokio::spawn(http::serve(listener, shared.clone()));
    }

    let (tx, mut rx) = mpsc::channel::<SourceEvent>(4096);
    start_source(&config, tx).await?;

    let mut retry = tokio::time::interval(config.retry_interval);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
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
            _ = retry.tick() => engine.retry_failed(),
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
        if let Some(pass) = engine.reconcile() {
            log_pass(&pass);
            if !pass.stale_udp_backends.is_empty() {
                terminate_udp_sockets(
                    &config.load.cgroup,
                    pass.stale_udp_backends.clone(),
                    &shared,
                );
            }
            shared.metrics.record_pass(&pass);
            if engine.is_synced() && !shared.ready.swap(true, Ordering::Relaxed) {
                tracing::info!("first complete sync written: ready");
            }
        }
        record_state(&engine, &shared);
    }
    tracing::info!(
        "stopping; programs and maps stay pinned and keep serving (`socklb reset` removes them)"
    );
    Ok(())
}

async fn start_source(config: &AgentConfig, tx: mpsc::Sender<SourceEvent>) -> anyhow::Result<()> {
    match &config.source {
        SourceConfig::Manifests { dir, poll } => {
            anyhow::ensure!(dir.is_dir(), "--manifests {}: not a folder", dir.display());
            let (dir, poll, node) = (dir.clone(), *poll, config.node.name.clone());
            std::thread::Builder::new()
                .name("manifests".into())
                .spawn(move || source::files::watch(&dir, node.as_deref(), poll, &tx))?;
        }
        SourceConfig::Kubernetes { kubeconfig } => {
            let client = source::kube::client(kubeconfig.as_deref())
                .await
                .context("connecting to the Kubernetes API")?;
            tokio::spawn(source::kube::watch(client, config.node.name.clone(), tx));
        }
    }
    Ok(())
}

/// Destroys connected UDP sockets to backends that left (off the event loop).
fn terminate_udp_sockets(
    cgroup: &std::path::Path,
    backends: std::collections::BTreeSet<SocketAddr>,
    shared: &Arc<Shared>,
) {
    let (cgroup, shared) = (cgroup.to_path_buf(), shared.clone());
    tokio::task::spawn_blocking(move || match udp_sockets::terminate(&cgroup, &backends) {
        Ok(done) => {
            shared.metrics.record_udp_terminated(done.sockets);
            if done.sockets > 0 {
                tracing::info!(
                    sockets = done.sockets,
                    namespaces = done.namespaces,
                    backends = ?backends,
                    "terminated connected UDP sockets to removed backends"
                );
            }
        }
        Err(e) => {
            shared.metrics.record_error("udp_terminate");
            tracing::warn!(error = %e, "could not terminate UDP sockets to removed backends");
        }
    });
}

fn record_state(engine: &Engine<BpfServiceMaps>, shared: &Shared) {
    use crate::dataplane::maps::ServiceMaps as _;
    let r = engine.reconciler();
    shared.metrics.record_state(
        r.snapshot(),
        &r.maps().capacities(),
        r.service_ids().len(),
        r.problems().len(),
        &r.stats().errors,
        engine.rejected_total(),
    );
    let status = Status {
        ready: shared.ready.load(Ordering::Relaxed),
        problems: r
            .problems()
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect(),
        rejected: engine.rejected().clone(),
    };
    *shared
        .status
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = status;
}

fn log_pass(pass: &Pass) {
    let report = &pass.report;
    if pass.full {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            changed = report.services_changed,
            removed = report.services_removed,
            failing = report.problems.len(),
            duration_ms = pass.duration.as_secs_f64() * 1e3,
            "full sync"
        );
    } else if report.writes > 0 || !report.problems.is_empty() {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            failing = report.problems.len(),
            duration_us = pass.duration.as_micros() as u64,
            "sync"
        );
    }
    for (key, problem) in &report.problems {
        tracing::warn!(service = %key, "{problem}");
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
