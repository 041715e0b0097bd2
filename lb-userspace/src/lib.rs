//! socklb's userspace: Kubernetes objects → desired state → map writes, and the tools to look
//! at the result.
//!
//! - `vocab`: the typed identities every layer shares (objects, service addresses, backend
//!   sets, error kinds); depends on nothing else here.
//! - `hashing` and `vec_set`: the agent's own collections; depend on nothing.
//! - `model`: Services and EndpointSlices, validated into plain types (from the API or YAML).
//! - `translate`: pure functions from those objects to the desired tables.
//! - `reconcile`: writes the difference into the maps, in a safe order.
//! - `dataplane`: the map ABI, the real and in-memory maps, loading and pinning.
//! - `source`: the Kubernetes API and manifest folders as event streams.
//! - `status`: what the agent reports it could not do (read back by `explain`).
//! - `sockets`: the live-sockets subsystem: the translated sockets read from the kernel, the
//!   UDP termination pass, the per-pod counts, and the view of live connections for people.
//! - `explain`: the chain from a Service to the maps, and the first broken link.
//! - `agent`: the long-running process; `cli`: the `socklb` command line.
//!
//! Modules import only downward: vocab ← model ← translate ← reconcile → dataplane → vocab;
//! source on model; status on translate and dataplane; sockets on model and dataplane;
//! explain on status, sockets, translate and dataplane; agent on all of those but
//! explain; cli on everything. `tests/integration/layering.rs` holds the exact table and checks it;
//! ARCHITECTURE.md explains it.
#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "agent")]
pub mod cli;
pub mod dataplane;
#[cfg(feature = "agent")]
pub mod explain;
pub mod fuzzing;
pub mod hashing;
pub mod model;
#[cfg(feature = "agent")]
pub mod outside;
pub mod reconcile;
#[cfg(feature = "agent")]
pub mod sockets;
#[cfg(feature = "agent")]
pub mod source;
#[cfg(feature = "agent")]
pub mod status;
pub mod translate;
pub mod vec_set;
pub mod vocab;
