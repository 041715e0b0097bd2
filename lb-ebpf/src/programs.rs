//! Entry points: one per hook and family, each a one-line call into `translate`; the release
//! program (`cgroup/sock_release`); and the two iterator programs, over the socket records
//! (`iter/bpf_sk_storage_map`) and over one network namespace's UDP sockets (`iter/udp`), which
//! the agent uses to list the sockets it translated.
#![allow(
    clippy::needless_pass_by_value,
    reason = "aya's entry-point macro hands the context over by value"
)]
use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr},
    programs::{SockAddrContext, SockContext},
};

use crate::translate::{
    ALLOW, Hook, SocketFamily, fault_verdict, may_be_service, release, reverse, try_translate,
};

/// A connect or sendmsg hook: the miss path (`may_be_service`) runs inline in the entry point,
/// and a destination that passes it is translated by `service`, a BPF function of its own. A
/// miss then runs a few dozen instructions with their exit beside them, not the start and the
/// far end of a program of thousands: after a whole TCP connection's kernel work the program's
/// code is cold, and a miss pays for each line of it that it touches (a connect to a live
/// server that is no service: 1.73× → 1.37× the empty program, four alternating bench pairs;
/// the hit's time unchanged within the noise). `service` reads the context again, so the
/// IPv4 programs keep the destination's family a constant (passed over, it put the IPv6 path
/// in them, and the hit got slower).
#[inline(always)]
fn translate(
    ctx: &SockAddrContext,
    family: SocketFamily,
    service: fn(&SockAddrContext) -> i32,
) -> i32 {
    if may_be_service(ctx, family) {
        service(ctx)
    } else {
        ALLOW
    }
}

/// The hit path of one hook (`try_translate`), kept out of its entry point.
macro_rules! service {
    ($name:ident, $hook:expr, $family:expr) => {
        #[inline(never)]
        fn $name(ctx: &SockAddrContext) -> i32 {
            try_translate(ctx, $hook, $family).unwrap_or_else(|fault| fault_verdict(&fault))
        }
    };
}

service!(connect4_service, Hook::Connect, SocketFamily::V4);
service!(connect6_service, Hook::Connect, SocketFamily::V6);
service!(sendmsg4_service, Hook::SendMsg, SocketFamily::V4);
service!(sendmsg6_service, Hook::SendMsg, SocketFamily::V6);

#[cgroup_sock_addr(connect4)]
pub(crate) fn socklb_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, SocketFamily::V4, connect4_service)
}

#[cgroup_sock_addr(connect6)]
pub(crate) fn socklb_connect6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, SocketFamily::V6, connect6_service)
}

#[cgroup_sock_addr(sendmsg4)]
pub(crate) fn socklb_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, SocketFamily::V4, sendmsg4_service)
}

#[cgroup_sock_addr(sendmsg6)]
pub(crate) fn socklb_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, SocketFamily::V6, sendmsg6_service)
}

#[cgroup_sock_addr(recvmsg4)]
pub(crate) fn socklb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, SocketFamily::V4)
}

#[cgroup_sock_addr(recvmsg6)]
pub(crate) fn socklb_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, SocketFamily::V6)
}

#[cgroup_sock_addr(getpeername4)]
pub(crate) fn socklb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, SocketFamily::V4)
}

#[cgroup_sock_addr(getpeername6)]
pub(crate) fn socklb_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, SocketFamily::V6)
}

#[cgroup_sock(sock_release)]
pub(crate) fn socklb_release(ctx: SockContext) -> i32 {
    release(&ctx)
}

/// `bpf_iter__bpf_sk_storage_map`, the context of an iterator over a socket-storage map.
#[repr(C)]
pub(crate) struct SkStorageIterCtx {
    meta: *mut IterMeta,
    map: *mut core::ffi::c_void,
    sk: *mut core::ffi::c_void,
    value: *mut lb_common::SockState,
}

impl SkStorageIterCtx {
    #[inline(always)]
    pub(crate) fn sk_ptr(&self) -> *mut core::ffi::c_void {
        self.sk
    }

    #[inline(always)]
    pub(crate) fn value_ptr(&self) -> *mut lb_common::SockState {
        self.value
    }

    /// The `seq_file` to write to.
    ///
    /// # Safety
    /// `meta` must be the kernel's pointer (it always is in an iterator run).
    #[inline(always)]
    pub(crate) unsafe fn seq(&self) -> *mut core::ffi::c_void {
        let _ = self.map;
        // SAFETY: the caller's promise; the verifier types this load from the context's BTF.
        unsafe { (*self.meta).seq }
    }
}

/// `bpf_iter__udp`, the context of an iterator over one network namespace's UDP sockets (the
/// fields after `udp_sk`, `uid` and `bucket`, are not read).
#[repr(C)]
pub(crate) struct UdpIterCtx {
    meta: *mut IterMeta,
    udp_sk: *mut core::ffi::c_void,
}

impl UdpIterCtx {
    /// The socket (`struct udp_sock *`, which starts with its `struct sock`), or null.
    #[inline(always)]
    pub(crate) fn sk_ptr(&self) -> *mut core::ffi::c_void {
        self.udp_sk
    }

    /// The `seq_file` to write to.
    ///
    /// # Safety
    /// `meta` must be the kernel's pointer (it always is in an iterator run).
    #[inline(always)]
    pub(crate) unsafe fn seq(&self) -> *mut core::ffi::c_void {
        // SAFETY: the caller's promise; the verifier types this load from the context's BTF.
        unsafe { (*self.meta).seq }
    }
}

/// `struct bpf_iter_meta`: the `seq_file` the iterator writes to.
#[repr(C)]
pub(crate) struct IterMeta {
    seq: *mut core::ffi::c_void,
    session_id: u64,
    seq_num: u64,
}

/// Every socket with a record, in one walk over the storage map: its cookie and state, so the
/// agent can find the connected UDP sockets socklb translated (`sock_diag` reports socket
/// storage for TCP only) and count translated sockets per backend and client.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/bpf_sk_storage_map")]
pub(crate) extern "C" fn socklb_sockets(ctx: *mut SkStorageIterCtx) -> i32 {
    crate::translate::write_socket_entry(ctx)
}

/// The UDP sockets of the calling thread's network namespace that have a record, with their
/// addresses (so listing them needs no `sock_diag` dump): the fallback
/// where the kernel refuses iterators over map elements (run once per pod network namespace).
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/udp")]
pub(crate) extern "C" fn socklb_udp_sockets(ctx: *mut UdpIterCtx) -> i32 {
    crate::translate::write_udp_entry(ctx)
}
