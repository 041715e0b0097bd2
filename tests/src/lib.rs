//! The harness for socklb's privileged end-to-end tests, its demo and its benchmark: sandboxes
//! (network namespaces, a child cgroup, a private bpffs, memory cgroups, removed on success,
//! failure and panic; `sandbox`), backend and client processes (`client`, the `sbx` binary), and
//! the real `socklb agent` binary (`agent`).
//!
//! Beside them: a stand-in API server (`apiserver`: lists, watches, bookmarks, 410 Gone; it can
//! stop and come back with or without its history, change the version it reports, and listen in
//! a node's network namespace); curl as a load balancer's probe (`curl`); what the agent a test
//! started runs with (`features`: the optional parts it reports in `/status`, and
//! `SOCKLB_DISABLE_FEATURE`); connect loops that record every connect (`load`); the kernel's own verdicts on the optional parts, asked without socklb's probe (`kernel`); the conformance runner (`conformance`, over the cases in
//! `tests/conformance/`, one file each); the benchmark (`bench`, the `socklb-bench` binary;
//! `--only kernel` measures the programs' kernel cost alone, the release program's at close and
//! the hit with a monitor reading included); and `sandbox-drill`, which signals a run at a chosen
//! moment for the signal handler's tests (`drop-then-signal`: while a sandbox's own `Drop` is
//! tearing it down).
//!
//! Privileged tests start with `require_privileges!()`: without root they skip with a one-line
//! reason, except under `CI=true`, where they fail.
pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod bins;
pub mod churn;
pub mod client;
pub mod cluster;
pub mod conformance;
pub mod curl;
pub mod features;
pub mod kernel;
pub mod load;
pub mod manifests;
pub mod privileges;
pub mod processes;
pub mod sandbox;
pub mod stats;
pub mod story;
pub mod system;

pub use privileges::privileged;
pub use sandbox::{Client, Sandbox};

/// The repository's `examples/` folder (the seed scenarios' manifests).
pub fn examples() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}
