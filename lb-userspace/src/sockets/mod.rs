//! The live-sockets subsystem: the sockets socklb translated, as the kernel holds them now,
//! and what is done with them. Its layers, each importing only those above it:
//!
//! - `listing`: reading the records from the kernel (connection slots, socket storage through
//!   the iterators or `sock_diag`, one pod network namespace at a time where needed) into a
//!   census, streamed or collected;
//! - `terminate`: destroying the connected UDP sockets whose backend stopped serving;
//! - `quota`: the per-pod counts of socket records, read and recounted;
//! - `view`: the census for people, per service port, backend and client pod (pure);
//! - `cluster`: the cluster's side of that view, each backend's condition and each client
//!   pod's name from the Services and EndpointSlices.
//!
//! Below it, in `dataplane`: the pins (`pins::SocketPins`), the `sock_diag` netlink client and
//! the system calls. Above it: the agent's tasks (the census behind `/connections` and the
//! metrics, the recount, the termination pass), `explain`, and `socklb inspect`.
pub mod cluster;
pub mod listing;
pub mod quota;
pub mod terminate;
pub mod view;

pub use listing::{
    CensusStats, ListError, LiveSocket, Namespace, NamespaceError, census, census_each, held_slots,
    in_each_namespace, namespaces, protocol_of, record_clock_now, records,
};
pub use terminate::{
    Serving, TerminateError, Terminated, repair_untranslated, terminate_judged, terminate_stale,
};
