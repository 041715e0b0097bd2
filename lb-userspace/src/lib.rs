//! socklb's userspace: Kubernetes objects → desired state → map writes, and the tools to look
//! at the result.
//!
//! - `model`: Services and EndpointSlices, validated into plain types (from the API or YAML).
//! - `translate`: pure functions from those objects to the desired tables.
//! - `reconcile`: writes the difference into the maps, in a safe order.
//! - `dataplane`: the map ABI, the real and in-memory maps, loading and pinning.
//! - `source`: the Kubernetes API and manifest folders as event streams.
//! - `agent`: the long-running process; `cli`: the `socklb` command line.
pub mod agent;
pub mod cli;
pub mod dataplane;
pub mod explain;
pub mod fuzzing;
pub mod model;
pub mod reconcile;
pub mod source;
pub mod translate;
pub mod vec_set;
