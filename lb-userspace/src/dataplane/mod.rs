//! The kernel side as userspace sees it: the map ABI conversions, the map-writing interface
//! (real and in-memory), loading and pinning, readable dumps of map contents, and socket
//! diagnostics.
pub mod abi;
pub mod bpf;
pub mod dump;
pub mod loader;
pub mod maps;
pub mod sock_diag;
pub mod sockets;
pub mod sys;
pub mod sysfs;
pub mod udp_sockets;
