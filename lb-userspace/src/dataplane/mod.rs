//! The kernel side as userspace sees it: the map ABI conversions, the map-writing interface
//! (real and in-memory), loading and pinning with the kernel's optional features, readable
//! dumps of map contents, and the translated sockets.
pub mod abi;
pub mod bpf;
pub mod conntrack;
pub mod dump;
pub mod events;
pub mod features;
pub mod loader;
pub mod maps;
pub mod nft;
pub mod pins;
pub mod pods;
pub mod probe;
pub mod proof;
pub mod sock_diag;
pub mod sys;
pub mod sysfs;
