//! lb-userspace's integration tests, in one binary: unprivileged, no kernel needed.
mod deploy;
mod docs;
mod explain;
mod layering;
mod manifests;
mod metrics;
mod properties;
mod reconcile;
