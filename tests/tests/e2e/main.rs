//! socklb's end-to-end tests, in one binary (each module was a binary of its own: each linked
//! the whole agent again). Most are privileged: real programs on real sockets in sandboxes
//! (network namespaces and cgroups the test makes and removes); under `CI=true` they must run.
//! `cargo xtask test` runs this binary in shards, one or more modules each, a few at once,
//! and a second time for the modules whose behaviour depends on an optional kernel part, with
//! every such part off.
mod agent;
mod bench;
mod conformance_changes;
mod connections;
mod dataplane;
mod demo;
mod deploy;
mod fail_static;
mod features;
mod isolation;
mod manifests;
mod manual;
mod metrics;
mod monitor;
mod monitoring;
mod node;
mod outside;
mod reliability;
mod seed;
mod tenants;

use std::time::{Duration, Instant};

/// Waits until `check` gives a value, at most `limit` (checked every 100 ms); the error names
/// `what`.
fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(t) = check()? {
            return Ok(t);
        }
        if start.elapsed() > limit {
            anyhow::bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
