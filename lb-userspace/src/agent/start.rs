//! What the agent starts from: its source of Services and EndpointSlices, the watches of this
//! node's addresses and listeners, and the node's identity (with the API server's version).
use anyhow::Context as _;
use tokio::sync::mpsc;

use super::{AgentConfig, SourceConfig, api_route::ApiRoute};
use crate::source::{self, SourceEvent};

/// Follows this node's interface addresses and listening sockets, each on a thread of its own.
pub(super) fn watch_the_node(tx: &mpsc::Sender<SourceEvent>) -> std::io::Result<()> {
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

/// This node's identity from the flags, with the API server's Kubernetes version when no flag
/// gives one.
pub(super) async fn node_flags(config: &AgentConfig) -> crate::translate::NodeFlags {
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

pub(super) async fn ask_version(
    client: &kube::Client,
) -> anyhow::Result<crate::translate::KubeVersion> {
    let (major, minor) = source::kube::server_version(client).await?;
    crate::translate::KubeVersion::parse(&format!("{major}.{minor}"))
        .ok_or_else(|| anyhow::anyhow!("version {major}.{minor} not understood"))
}

/// Starts the source; with the Kubernetes API and no `--api-server`, also returns the API
/// server's address, to tell when it is a ClusterIP (see `api_route`).
pub(super) async fn start_source(
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
