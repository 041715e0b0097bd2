//! The kernel side as userspace sees it: the map ABI conversions, the map-writing interface
//! (real and in-memory), loading and pinning with the kernel's optional features, readable
//! dumps of map contents, and the translated sockets.
pub mod abi;
#[cfg(feature = "agent")]
pub mod bpf;
#[cfg(feature = "agent")]
pub mod conntrack;
#[cfg(feature = "agent")]
pub mod dump;
#[cfg(feature = "agent")]
pub mod events;
#[cfg(feature = "agent")]
pub mod features;
#[cfg(feature = "agent")]
pub mod loader;
pub mod maps;
#[cfg(feature = "agent")]
pub mod nft;
#[cfg(feature = "agent")]
pub mod pins;
#[cfg(feature = "agent")]
pub mod pods;
#[cfg(feature = "agent")]
pub mod probe;
#[cfg(feature = "agent")]
pub mod proof;
#[cfg(feature = "agent")]
pub mod sock_diag;
#[cfg(feature = "agent")]
pub mod sys;
#[cfg(feature = "agent")]
pub mod sysfs;
