//! The Kubernetes API as the source: kube-rs watchers on Services, discovery.k8s.io/v1
//! EndpointSlices and this node's Node. A watcher lists, then watches; when the watch expires
//! (410 Gone) or drops, it re-lists and the listing replaces what was known, so deletions missed
//! meanwhile are not lost.
use std::path::Path;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use kube::{
    Api, Client, Resource, ResourceExt as _,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::{Object, SourceEvent, Subject};
use crate::{
    model::{LABEL_HEADLESS, node_from_api, service_from_api, slice_from_api},
    vocab::{Kind, ObjectKey},
};

/// The client configuration from the kubeconfig at `path`, or in-cluster / `$KUBECONFIG` when
/// `None`. `api_server` replaces the server address (replace mode: the API server's real
/// address, never the `kubernetes` Service's ClusterIP, which only a service proxy translates).
pub async fn config(path: Option<&Path>, api_server: Option<&str>) -> anyhow::Result<kube::Config> {
    let mut config = match path {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    if let Some(server) = api_server {
        config.cluster_url = server
            .parse()
            .map_err(|e| anyhow::anyhow!("--api-server {server:?}: {e}"))?;
    }
    Ok(config)
}

/// A client over [`config`].
pub async fn client(path: Option<&Path>, api_server: Option<&str>) -> anyhow::Result<Client> {
    Ok(Client::try_from(config(path, api_server).await?)?)
}

/// Watches everything the agent needs until the receiver is gone.
pub async fn watch(client: Client, node_name: Option<String>, tx: mpsc::Sender<SourceEvent>) {
    // As kube-proxy's informers: Services and slices labelled headless are none of a proxy's
    // business. Lists are served from the API server's cache.
    let config = watcher::Config::default()
        .labels(&format!("!{LABEL_HEADLESS}"))
        .any_semantic();
    let services = watch_kind::<core::Service>(
        Api::all(client.clone()),
        config.clone(),
        Kind::Service,
        |s| service_from_api(s).map(|s| Object::Service(Box::new(s))),
        tx.clone(),
    );
    let slices = watch_kind::<discovery::EndpointSlice>(
        Api::all(client.clone()),
        config,
        Kind::EndpointSlice,
        |s| slice_from_api(s).map(|s| Object::EndpointSlice(Box::new(s))),
        tx.clone(),
    );
    let node = async {
        if let Some(name) = node_name {
            watch_node(Api::all(client), &name, tx).await;
        }
    };
    tokio::join!(services, slices, node);
}

async fn watch_kind<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    convert: fn(&K) -> Result<Object, crate::model::ValidationError>,
    tx: mpsc::Sender<SourceEvent>,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<Vec<Object>> = None;
    let mut healthy = true;
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                // The backoff keeps the stream alive; report and go on.
                tracing::warn!(%kind, error = %e, "watch failed; retrying");
                healthy = false;
                send(&tx, SourceEvent::Health { kind, ok: false }).await;
                continue;
            }
        };
        if !healthy {
            healthy = true;
            send(&tx, SourceEvent::Health { kind, ok: true }).await;
        }
        let out = match event {
            watcher::Event::Init => {
                listing = Some(Vec::new());
                continue;
            }
            watcher::Event::InitApply(obj) => {
                match convert(&obj) {
                    Ok(o) => listing.get_or_insert_with(Vec::new).push(o),
                    Err(e) => send(&tx, rejected(&e)).await,
                }
                continue;
            }
            watcher::Event::InitDone => SourceEvent::Listed {
                kind,
                objects: listing.take().unwrap_or_default(),
                keep: Vec::new(),
            },
            watcher::Event::Apply(obj) => match convert(&obj) {
                Ok(o) => SourceEvent::Applied(o),
                Err(e) => rejected(&e),
            },
            watcher::Event::Delete(obj) => SourceEvent::Deleted(
                kind,
                ObjectKey::new(obj.namespace().unwrap_or_default(), obj.name_any()),
            ),
        };
        if tx.send(out).await.is_err() {
            return;
        }
    }
}

async fn watch_node(api: Api<core::Node>, name: &str, tx: mpsc::Sender<SourceEvent>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    loop {
        match stream.try_next().await {
            Ok(Some(node)) => {
                if tx
                    .send(SourceEvent::Node(node_from_api(&node)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(node = name, error = %e, "node watch failed; retrying"),
        }
    }
}

fn rejected(e: &crate::model::ValidationError) -> SourceEvent {
    SourceEvent::Rejected {
        subject: Subject::Object(e.object.clone()),
        message: e.to_string(),
    }
}

async fn send(tx: &mpsc::Sender<SourceEvent>, event: SourceEvent) {
    let _ = tx.send(event).await;
}
