//! The Kubernetes API as the source: kube-rs watchers on Services, discovery.k8s.io/v1
//! EndpointSlices and this node's Node (and its deletion), and the API server's version. A
//! watcher lists, then watches; when the watch expires (410 Gone) or drops, it re-lists and the
//! listing replaces what was known, so deletions missed meanwhile are not lost.
//!
//! After an API server outage a watch is back within seconds: a failed watch is retried on its
//! own delay (200 ms doubling to at most 2 s, each with up to a quarter of jitter, back to 200 ms
//! on any event), and a 410 Gone re-lists at once. A watch reported failing is reported healthy
//! again as soon as a one-object list answers.
use std::{path::Path, time::Duration};

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

/// The delay before a watch is tried again after an error: 200 ms doubling to 1.25 s, each
/// with up to as much again of jitter (backon's), and back to 200 ms on any success
/// (kube-runtime's `StreamBackoff` resets it on every event). kube-runtime's default grows to
/// 30 s and more, so after an API server outage (a control-plane upgrade) changes reached the
/// maps 7 to 32 s after the server was back; with this cap a watch is back within about 2.5 s
/// of it, and a 410 Gone (a restarted server's fresh watch cache) re-lists after one short
/// delay.
pub fn watch_backoff() -> kube::runtime::watcher::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(WATCH_RETRY_MIN)
        .with_max_delay(WATCH_RETRY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// The first delay of [`watch_backoff`], and the longest before its jitter.
pub const WATCH_RETRY_MIN: Duration = Duration::from_millis(200);
pub const WATCH_RETRY_MAX: Duration = Duration::from_millis(1250);

/// The API server's version (`GET /version`): its major and minor, as it says them
/// (`"1"`, `"33+"`).
pub async fn server_version(client: &Client) -> anyhow::Result<(String, String)> {
    let info = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("GET /version timed out"))??;
    Ok((info.major, info.minor))
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
    // The retry delay is applied here rather than by a stream adapter: a 410 Gone re-lists at
    // once (the watcher goes back to listing on its next poll), everything else waits.
    let mut stream = watcher(api.clone(), config).boxed();
    let mut backoff = watch_backoff();
    let mut listing: Option<Vec<Object>> = None;
    let mut healthy = true;
    let mut probe = tokio::time::interval(Duration::from_secs(1));
    loop {
        let next = tokio::select! {
            next = stream.try_next() => next,
            // A watch that resumed after an outage yields nothing until something changes: while
            // it is reported failing, a one-object list says when the API answers again.
            _ = probe.tick(), if !healthy => {
                let params = kube::api::ListParams::default().limit(1);
                if api.list_metadata(&params).await.is_ok() {
                    healthy = true;
                    send(&tx, SourceEvent::Health { kind, ok: true }).await;
                }
                continue;
            }
        };
        let event = match next {
            Ok(Some(event)) => {
                kube::runtime::utils::Backoff::reset(&mut backoff);
                event
            }
            Ok(None) => return,
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                tracing::info!(%kind, "watch history expired (410 Gone): listing again");
                continue;
            }
            Err(e) => {
                tracing::warn!(%kind, error = %e, "watch failed; retrying");
                if healthy {
                    healthy = false;
                    send(&tx, SourceEvent::Health { kind, ok: false }).await;
                }
                tokio::time::sleep(backoff.next().unwrap_or(WATCH_RETRY_MAX)).await;
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

/// Watches this node's Node: every version of it, and its deletion (a delete event, or a
/// listing without it: deleted while the watch was down, or never created).
async fn watch_node(api: Api<core::Node>, name: &str, tx: mpsc::Sender<SourceEvent>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).backoff(watch_backoff()).boxed();
    // Whether the listing in progress has found the Node.
    let mut found = false;
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(node = name, error = %e, "node watch failed; retrying");
                continue;
            }
        };
        let out = match event {
            watcher::Event::Init => {
                found = false;
                continue;
            }
            watcher::Event::InitApply(node) | watcher::Event::Apply(node) => {
                found = true;
                SourceEvent::Node(node_from_api(&node))
            }
            watcher::Event::InitDone if found => continue,
            watcher::Event::InitDone | watcher::Event::Delete(_) => SourceEvent::NodeDeleted,
        };
        if tx.send(out).await.is_err() {
            return;
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

#[cfg(test)]
mod tests {
    use kube::runtime::utils::Backoff as _;

    use super::{WATCH_RETRY_MAX, WATCH_RETRY_MIN, watch_backoff};

    #[test]
    fn watch_retries_stay_short_and_reset_on_success() {
        let mut b = watch_backoff();
        let delays: Vec<_> = b.by_ref().take(12).collect();
        assert!(delays[0] >= WATCH_RETRY_MIN && delays[0] <= WATCH_RETRY_MIN * 2);
        assert!(delays.iter().all(|d| *d <= WATCH_RETRY_MAX * 2));
        assert!(
            delays[11] >= WATCH_RETRY_MAX,
            "grows to the cap: {delays:?}"
        );
        b.reset();
        assert!(b.next().is_some_and(|d| d <= WATCH_RETRY_MIN * 2));
    }
}
