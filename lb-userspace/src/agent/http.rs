//! The two listeners: health (/healthz, /livez, /readyz) for the kubelet's probes, and
//! metrics (/metrics, /status) for Prometheus and `socklb explain`.
use std::sync::{Arc, PoisonError, atomic::Ordering};

use axum::{Router, extract::State, http::StatusCode, routing::get};

use super::Shared;

pub async fn serve_health(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", get(livez))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "health server stopped");
    }
}

pub async fn serve_metrics(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
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
    let status = shared
        .status
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    (
        [("content-type", "application/json")],
        serde_json::to_string_pretty(&status).unwrap_or_default(),
    )
}

async fn metrics(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}
