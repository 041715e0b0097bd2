//! The cheapest proof that a socket has nothing of socklb's: its cookie was never made
//! (`lb_common::proof`). Two or three instructions the agent writes at load time, no helper,
//! no map: the kfunc `bpf_cast_to_kern_ctx` (which the verifier turns into a register move)
//! and the loads down to the socket's cookie field; or, without the proof, `r0 = 1`, which
//! sends the caller down its old path (the cookie from `bpf_get_socket_cookie`).
use core::ffi::c_void;

use aya_ebpf::programs::{SockAddrContext, SockContext};
use lb_common::proof::{ADDR, RELEASE};

/// Runs the marker instructions `$insn` (the agent's rewrite of them; `$quads` has a `.quad`
/// for each) on the context `$ctx` and gives r0: the socket's cookie field, or 1 without the
/// proof.
macro_rules! cookie_field {
    ($ctx:expr, $quads:literal, $($insn:expr),+) => {{
        let cookie: u64;
        // SAFETY: the call's one argument is the program's context (the verifier checks it),
        // the loads are BTF accesses the verifier checks against the kernel's structures and
        // the JIT makes fault-safe; a kfunc call clobbers r1-r5.
        unsafe {
            core::arch::asm!(
                $quads,
                $(const $insn,)+
                inout("r1") $ctx.cast::<c_void>() => _,
                lateout("r0") cookie,
                lateout("r2") _,
                lateout("r3") _,
                lateout("r4") _,
                lateout("r5") _,
                options(nostack, readonly, preserves_flags),
            );
        }
        cookie
    }};
}

/// True when the closing socket certainly has no slot and no record: its cookie was never made.
#[inline(always)]
pub(crate) fn never_met(ctx: &SockContext) -> bool {
    cookie_field!(ctx.sock, ".quad {}\n.quad {}", RELEASE[0], RELEASE[1]) == 0
}

/// The same for the socket of a `sock_addr` hook (getpeername, recvmsg), through `struct
/// bpf_sock_addr_kern`'s `sk`.
#[inline(always)]
pub(crate) fn never_met_addr(ctx: &SockAddrContext) -> bool {
    cookie_field!(
        ctx.sock_addr,
        ".quad {}\n.quad {}\n.quad {}",
        ADDR[0],
        ADDR[1],
        ADDR[2]
    ) == 0
}
