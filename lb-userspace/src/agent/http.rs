//! The two listeners: health (/healthz, /livez, /readyz) for the kubelet's probes, and
//! metrics (/metrics, /status, /connections) for Prometheus, `socklb explain` and `socklb
//! inspect connections`.
//!
//! Neither can stall the agent or the other: each has its own accept loop that always accepts,
//! keeps at most `MAX_CONNECTIONS` connections (a new one closes the oldest, which on a healthy
//! listener is an idle keep-alive or a client that never sent its request), closes a connection
//! whose request headers take longer than `HEADER_TIMEOUT`, and answers 503 to a request not
//! handled within `REQUEST_TIMEOUT`. A scrape reads only cached values and the per-CPU counter
//! array, off the async workers.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
    time::Duration,
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse as _, Response},
    routing::get,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::sync::oneshot;

use super::{Shared, metrics::Format};

/// Connections kept open per listener.
pub(super) const MAX_CONNECTIONS: usize = 32;
/// A request's headers must arrive within this (from the connection's start, or from the end
/// of the previous response on a keep-alive connection).
pub(super) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A request must be handled within this.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn serve_health(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", get(livez))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .layer(middleware::from_fn(deadline))
        .with_state(shared);
    serve(listener, app, "health").await;
}

pub(super) async fn serve_metrics(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/connections", get(connections))
        .layer(middleware::from_fn(deadline))
        .with_state(shared);
    serve(listener, app, "metrics").await;
}

/// `--prometheus-listen`: the metrics alone, for a scraper that reaches the node's address
/// (the status and the connections name Services and client pods: they stay on loopback).
pub(super) async fn serve_prometheus(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn(deadline))
        .with_state(shared);
    serve(listener, app, "prometheus").await;
}

/// Counts AFFINITY's clients now and every `AFFINITY_REFRESH` (a bounded key walk, on a
/// blocking thread): the scrape only reads the result.
pub(super) async fn refresh_affinity(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(super::metrics::AFFINITY_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let shared = shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.metrics.refresh_affinity()).await;
    }
}

/// The accept loop: every connection served by hyper with a header timeout, at most
/// `MAX_CONNECTIONS` at once (the oldest goes when a new one comes).
pub(super) async fn serve(listener: tokio::net::TcpListener, app: Router, what: &'static str) {
    let live: Arc<Mutex<BTreeMap<u64, oneshot::Sender<()>>>> = Arc::default();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024);
    let builder = Arc::new(builder);
    for id in 0_u64.. {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                // Shut down (a health-check port closed, the agent stopping): not listening
                // any more, and never again.
                tracing::debug!(listener = what, "listener shut down");
                return;
            }
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!(listener = what, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (close, closed) = oneshot::channel();
        {
            let mut live = live.lock().unwrap_or_else(PoisonError::into_inner);
            while live.len() >= MAX_CONNECTIONS {
                // Dropping its sender closes the oldest connection.
                if live.pop_first().is_some() {
                    tracing::debug!(
                        listener = what,
                        "connection limit reached: closed the oldest"
                    );
                }
            }
            live.insert(id, close);
        }
        let (live, builder, app) = (live.clone(), builder.clone(), app.clone());
        tokio::spawn(async move {
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
            tokio::select! {
                _ = conn => {}
                _ = closed => {}
            }
            live.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        });
    }
}

/// Answers 503 to a request its handler did not finish within `REQUEST_TIMEOUT`.
async fn deadline(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the request timed out\n").into_response(),
    }
}

async fn livez(State(shared): State<Arc<Shared>>) -> (StatusCode, String) {
    match shared.stuck() {
        None => (StatusCode::OK, "ok\n".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("stuck: {why}\n")),
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the first complete sync, or a watch is failing\n",
        )
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    let mut status = shared
        .status
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    // The outside path's task reports on its own thread: its latest word, not the loop's copy.
    status.outside.clone_from(
        &shared
            .outside
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    (
        [("content-type", "application/json")],
        serde_json::to_string_pretty(&status).unwrap_or_default(),
    )
}

/// `/connections[?service=NAMESPACE/NAME][&backend=IP:PORT]`: the live connections as JSON
/// (what `socklb inspect connections` shows), from a census at most `FRESH` old.
async fn connections(
    State(shared): State<Arc<Shared>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let mut filter = crate::sockets::view::Filter::default();
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = v
            .replace("%2F", "/")
            .replace("%2f", "/")
            .replace("%3A", ":")
            .replace("%3a", ":");
        match k {
            "service" => filter.service = Some(crate::vocab::ObjectKey::parse(&v)),
            "backend" => match v.parse() {
                Ok(addr) => filter.backend = Some(addr),
                Err(_) => {
                    return (
                        StatusCode::BAD_REQUEST,
                        format!("backend={v}: not IP:PORT\n"),
                    )
                        .into_response();
                }
            },
            _ => {
                return (StatusCode::BAD_REQUEST, format!("unknown parameter {k}\n"))
                    .into_response();
            }
        }
    }
    match shared.connections.fresh().await {
        Some(view) => {
            let view = super::tasks::census::filtered(&view, &filter);
            (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string_pretty(&view).unwrap_or_default(),
            )
                .into_response()
        }
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "this node's kernel lets socklb list no translated socket (see /status)\n",
        )
            .into_response(),
    }
}

/// The Prometheus text format, or `OpenMetrics` when the `Accept` header prefers it.
async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let format = Format::negotiate((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    match tokio::task::spawn_blocking(move || shared.metrics.encode(format)).await {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::{os::fd::AsFd as _, time::Duration};

    /// A listener shut down on purpose (a health-check port closed, the agent stopping) ends
    /// its accept loop at once: accept then fails with EINVAL for ever, which the loop once
    /// logged as a warning every 100 ms until its task was aborted.
    #[tokio::test]
    async fn a_listener_shut_down_ends_its_accept_loop() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let fd = listener
            .as_fd()
            .try_clone_to_owned()
            .expect("a second descriptor");
        let serving = tokio::spawn(super::serve(listener, axum::Router::new(), "test"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        rustix::net::shutdown(&fd, rustix::net::Shutdown::Both).expect("shutdown");
        tokio::time::timeout(Duration::from_secs(2), serving)
            .await
            .expect("the accept loop ended")
            .expect("without a panic");
    }
}
