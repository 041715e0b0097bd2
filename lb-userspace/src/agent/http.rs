//! /healthz (the process answers), /readyz (the first complete sync is written) and /metrics.
use std::sync::{Arc, atomic::Ordering};

use axum::{Router, extract::State, http::StatusCode, routing::get};

use super::Shared;

pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "HTTP server stopped");
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first complete sync\n",
        )
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    let status = shared
        .status
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    (
        [("content-type", "application/json")],
        serde_json::to_string_pretty(&status).unwrap_or_default(),
    )
}

async fn metrics(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        shared.metrics.encode(),
    )
}
