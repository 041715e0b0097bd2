//! The harness for socklb's privileged end-to-end tests and its demo: sandboxes (network
//! namespaces, a child cgroup, a private bpffs), backend and client processes, and the real
//! `socklb agent` binary.
pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod bins;
pub mod churn;
pub mod client;
pub mod conformance;
pub mod curl;
pub mod features;
pub mod manifests;
pub mod privileges;
pub mod processes;
pub mod sandbox;
pub mod stats;
pub mod story;
pub mod system;

pub use privileges::privileged;
pub use sandbox::{Client, Sandbox};
