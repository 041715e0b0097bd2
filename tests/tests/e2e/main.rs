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
