//! The agent's periodic and background tasks, each with its state and its schedule; the event
//! loop only routes ticks and results to them.
pub(super) mod census;
pub(super) mod growth;
pub(super) mod outside;
pub(super) mod pods;
pub(super) mod recount;
pub(super) mod udp_termination;
pub(super) mod version;
