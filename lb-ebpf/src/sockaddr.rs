//! Reading and writing the address a `sock_addr` hook sees. The verifier only allows 4-byte
//! accesses to these fields, so every access is a single volatile u32 load or store.
use aya_ebpf::{bindings::bpf_sock_addr, programs::SockAddrContext};
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use lb_common::{FAMILY_IPV4, FAMILY_IPV6, PROTOCOL_MPTCP, PROTOCOL_TCP, PROTOCOL_UDP};

/// An address and port in network byte order, as `lb_common` keys hold them. An IPv4-mapped
/// IPv6 address (`::ffff:a.b.c.d`) is represented as the IPv4 address it carries.
#[derive(Clone, Copy)]
pub(crate) struct SockAddr {
    pub addr: [u32; 4],
    pub port_be: u16,
    pub family: u8,
}

/// The third word of an IPv4-mapped IPv6 address, in network byte order.
const V4_MAPPED_PREFIX: u32 = 0x0000_ffff_u32.to_be();

#[inline(always)]
fn raw(ctx: &SockAddrContext) -> *mut bpf_sock_addr {
    ctx.sock_addr
}

#[inline(always)]
fn port(ctx: &SockAddrContext) -> u16 {
    // SAFETY: ctx points at the kernel's bpf_sock_addr for the whole program run.
    let port = unsafe { read_volatile(addr_of!((*raw(ctx)).user_port)) };
    // The port sits in the low 16 bits, already in network byte order.
    port as u16
}

/// The destination (connect, sendmsg) or peer (getpeername, recvmsg) of an AF_INET socket.
#[inline(always)]
pub(crate) fn load_v4(ctx: &SockAddrContext) -> SockAddr {
    // SAFETY: see `port`.
    let ip = unsafe { read_volatile(addr_of!((*raw(ctx)).user_ip4)) };
    SockAddr {
        addr: [ip, 0, 0, 0],
        port_be: port(ctx),
        family: FAMILY_IPV4,
    }
}

/// The same for an AF_INET6 socket; IPv4-mapped addresses come back as IPv4.
#[inline(always)]
pub(crate) fn load_v6(ctx: &SockAddrContext) -> SockAddr {
    let p = raw(ctx);
    // SAFETY: see `port`.
    let w = unsafe {
        [
            read_volatile(addr_of!((*p).user_ip6[0])),
            read_volatile(addr_of!((*p).user_ip6[1])),
            read_volatile(addr_of!((*p).user_ip6[2])),
            read_volatile(addr_of!((*p).user_ip6[3])),
        ]
    };
    let port_be = port(ctx);
    if w[0] == 0 && w[1] == 0 && w[2] == V4_MAPPED_PREFIX {
        SockAddr {
            addr: [w[3], 0, 0, 0],
            port_be,
            family: FAMILY_IPV4,
        }
    } else {
        SockAddr {
            addr: w,
            port_be,
            family: FAMILY_IPV6,
        }
    }
}

#[inline(always)]
fn store_port(ctx: &SockAddrContext, port_be: u16) {
    // SAFETY: see `port`; user_port is writable in every hook socklb uses.
    unsafe { write_volatile(addr_of_mut!((*raw(ctx)).user_port), u32::from(port_be)) };
}

/// Rewrites the address of an AF_INET socket's hook.
#[inline(always)]
pub(crate) fn store_v4(ctx: &SockAddrContext, addr: &[u32; 4], port_be: u16) {
    // SAFETY: see `store_port`.
    unsafe { write_volatile(addr_of_mut!((*raw(ctx)).user_ip4), addr[0]) };
    store_port(ctx, port_be);
}

/// Rewrites the address of an AF_INET6 socket's hook; an IPv4 address is written IPv4-mapped.
#[inline(always)]
pub(crate) fn store_v6(ctx: &SockAddrContext, addr: &[u32; 4], port_be: u16, family: u8) {
    let w = if family == FAMILY_IPV4 {
        [0, 0, V4_MAPPED_PREFIX, addr[0]]
    } else {
        *addr
    };
    let p = raw(ctx);
    // SAFETY: see `store_port`.
    unsafe {
        write_volatile(addr_of_mut!((*p).user_ip6[0]), w[0]);
        write_volatile(addr_of_mut!((*p).user_ip6[1]), w[1]);
        write_volatile(addr_of_mut!((*p).user_ip6[2]), w[2]);
        write_volatile(addr_of_mut!((*p).user_ip6[3]), w[3]);
    }
    store_port(ctx, port_be);
}

/// Whether the socket is UDP (`Some(true)`) or TCP (`Some(false)`: a multipath TCP socket
/// too, a TCP connection to its application), read whole; `None` for any other protocol.
#[inline(always)]
pub(crate) fn udp(ctx: &SockAddrContext) -> Option<bool> {
    // SAFETY: see `port`.
    transport(unsafe { read_volatile(addr_of!((*raw(ctx)).protocol)) })
}

/// [`udp`] of a protocol number as the kernel gives it (a `u32`).
#[inline(always)]
pub(crate) fn transport(protocol: u32) -> Option<bool> {
    match protocol {
        p if p == u32::from(PROTOCOL_TCP) || p == PROTOCOL_MPTCP => Some(false),
        p if p == u32::from(PROTOCOL_UDP) => Some(true),
        _ => None,
    }
}
