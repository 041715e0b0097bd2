//! Entry points: one per hook and family, each a one-line call into `translate`.
#![allow(
    clippy::needless_pass_by_value,
    reason = "aya's entry-point macro hands the context over by value"
)]
use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr},
    programs::{SockAddrContext, SockContext},
};

use crate::translate::{
    Hook, SocketFamily, fault_verdict, try_release, try_reverse, try_translate,
};

#[inline(always)]
fn translate(ctx: &SockAddrContext, hook: Hook, family: SocketFamily) -> i32 {
    try_translate(ctx, hook, family).unwrap_or_else(|fault| fault_verdict(ctx, &fault))
}

#[cgroup_sock_addr(connect4)]
pub fn socklb_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, Hook::Connect, SocketFamily::V4)
}

#[cgroup_sock_addr(connect6)]
pub fn socklb_connect6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, Hook::Connect, SocketFamily::V6)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn socklb_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx, Hook::SendMsg, SocketFamily::V4)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn socklb_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate(&ctx, Hook::SendMsg, SocketFamily::V6)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn socklb_recvmsg4(ctx: SockAddrContext) -> i32 {
    try_reverse(&ctx, SocketFamily::V4)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn socklb_recvmsg6(ctx: SockAddrContext) -> i32 {
    try_reverse(&ctx, SocketFamily::V6)
}

#[cgroup_sock_addr(getpeername4)]
pub fn socklb_getpeername4(ctx: SockAddrContext) -> i32 {
    try_reverse(&ctx, SocketFamily::V4)
}

#[cgroup_sock_addr(getpeername6)]
pub fn socklb_getpeername6(ctx: SockAddrContext) -> i32 {
    try_reverse(&ctx, SocketFamily::V6)
}

#[cgroup_sock(sock_release)]
pub fn socklb_sock_release(ctx: SockContext) -> i32 {
    try_release(&ctx);
    1
}
