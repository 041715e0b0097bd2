//! socklb's kernel side: cgroup `sock_addr` programs that translate a service address to a backend
//! when a socket connects (or sends an unconnected datagram), and translate it back when the
//! application asks who its peer is. Nothing here runs per packet.
//!
//! The entry points in `programs` are thin: one per hook and family, the release program
//! (`socklb_release`, `cgroup/sock_release`) and the two iterator programs
//! (`iter/bpf_sk_storage_map` over `SOCKETS`, `iter/udp`). The logic lives in `translate`
//! (`try_translate` returns a verdict or a `Fault` the entry point counts; `reverse` and `release`
//! cannot fail), the map definitions in `maps`, and context access in `sockaddr` (single 4-byte
//! loads and stores, as the verifier wants). This crate imports `lb-common` and aya-ebpf only.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// BPF has an atomic add but no compare-exchange, so core's `AtomicU64::fetch_add` does not
// exist for this target; the intrinsic compiles to the BPF instruction. (The eBPF crate is
// built with RUSTC_BOOTSTRAP=1 for `-Z build-std` already.)
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
// The one instruction of `proof` the agent rewrites is written with inline assembly.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![allow(
    clippy::inline_always,
    reason = "helpers are inlined into each program; the hit path is a function of its own (`programs::translate`)"
)]

#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod programs;
#[cfg(target_arch = "bpf")]
mod proof;
#[cfg(target_arch = "bpf")]
mod sockaddr;
#[cfg(target_arch = "bpf")]
mod translate;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach a panic, so this is never called.
    unsafe { core::hint::unreachable_unchecked() }
}

/// The crate only has content for the bpf target; on the host it is an empty binary so that
/// workspace-wide commands (`cargo check --workspace`) still work.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
