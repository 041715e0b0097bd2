//! The addresses on this node's interfaces (the agent's network namespace: the host's), and
//! their changes as they happen (rtnetlink address events); and the sockets listening on the
//! node, read every second (`sock_diag`). A claim on one of the node's addresses is left to the
//! node only where something there listens on that address and port: `NodeLocal DNSCache`
//! binds the `kube-dns` ClusterIP on a dummy interface and listens there, and pods' DNS
//! queries must reach that cache, as kube-proxy's rules let them; kube-proxy IPVS's
//! `kube-ipvs0` binds every ClusterIP and listens on none, and those are translated as any
//! other.
//!
//! The addresses are read with `getifaddrs`, followed with rtnetlink address events and re-read
//! every 30 s, and sent as `SourceEvent::LocalAddresses`. The listeners (`watch_listeners`: TCP in
//! `LISTEN`, UDP bound and unconnected below the ephemeral range) are sent as
//! `SourceEvent::LocalListeners` when they change.
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType, netlink::SocketAddrNetlink};
use tokio::sync::mpsc;

use super::SourceEvent;
use crate::{
    dataplane::sock_diag,
    vocab::{Listener, Protocol},
};

/// How often the listeners are read again (nothing announces a new listening socket).
const LISTENERS_EVERY: Duration = Duration::from_secs(1);

/// A re-read even without events (a lost event, an overflowed socket buffer).
const SAFETY_REREAD: Duration = Duration::from_secs(30);
/// Events arriving together are read as one change.
const SETTLE: Duration = Duration::from_millis(20);

/// Every IPv4 and IPv6 address on this network namespace's interfaces (`getifaddrs`).
pub fn current() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cursor };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in (read unaligned: the list only
                // promises a sockaddr's alignment).
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6 (read unaligned, as above).
                let sin6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in6>()) };
                out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cursor = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The sockets listening in this network namespace: TCP sockets in `LISTEN`, and UDP sockets
/// bound and not connected on a port below the ephemeral range (a client's socket for one query
/// binds an ephemeral port: it is no service, and would change at every query).
pub fn listeners() -> Result<Vec<Listener>, sock_diag::SockDiagError> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut out = Vec::new();
    for family in [sock_diag::AF_INET, sock_diag::AF_INET6] {
        for (protocol, number, state) in [
            (Protocol::Tcp, sock_diag::IPPROTO_TCP, sock_diag::TCP_LISTEN),
            (Protocol::Udp, sock_diag::IPPROTO_UDP, sock_diag::TCP_CLOSE),
        ] {
            for s in sock_diag::dump(number, family, sock_diag::state_bit(state), &[])? {
                let local = s.src();
                if protocol == Protocol::Udp && local.port() >= ephemeral {
                    continue;
                }
                let ip = match local.ip() {
                    std::net::IpAddr::V6(v6) => v6
                        .to_ipv4_mapped()
                        .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                    v4 @ std::net::IpAddr::V4(_) => v4,
                };
                out.push(Listener {
                    addr: (!ip.is_unspecified()).then_some(ip),
                    port: local.port(),
                    protocol,
                });
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Sends this namespace's listeners now and whenever they change, read every second (a
/// blocking loop, for a thread of its own). Ends when the receiver is gone.
pub fn watch_listeners(tx: &mpsc::Sender<SourceEvent>) {
    let mut last: Option<Vec<Listener>> = None;
    let mut warned = false;
    loop {
        match listeners() {
            Ok(now) if last.as_ref() != Some(&now) => {
                if tx
                    .blocking_send(SourceEvent::LocalListeners(now.clone()))
                    .is_err()
                {
                    return;
                }
                last = Some(now);
            }
            Ok(_) => {}
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "cannot read the sockets listening on this node: addresses bound on it are translated whether or not something listens there"
                    );
                }
                warned = true;
            }
        }
        std::thread::sleep(LISTENERS_EVERY);
        if tx.is_closed() {
            return;
        }
    }
}

/// Sends this namespace's addresses now, and again whenever they change (a blocking loop, for
/// a thread of its own). Ends when the receiver is gone.
pub fn watch(tx: &mpsc::Sender<SourceEvent>) {
    let socket = subscribe();
    if let Err(e) = &socket {
        tracing::warn!(
            error = e as &dyn std::error::Error,
            "cannot follow address changes (rtnetlink); re-reading them every 30 s"
        );
    }
    let mut last: Option<Vec<IpAddr>> = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match current() {
            Ok(addrs) if last.as_ref() != Some(&addrs) => {
                if tx
                    .blocking_send(SourceEvent::LocalAddresses(addrs.clone()))
                    .is_err()
                {
                    return;
                }
                last = Some(addrs);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reading this node's addresses"),
        }
        match &socket {
            // Any event (or the safety timeout) means: read them all again.
            Ok(fd) => {
                let _ = rustix::net::recv(fd, &mut buf[..], RecvFlags::empty());
                std::thread::sleep(SETTLE);
                while rustix::net::recv(fd, &mut buf[..], RecvFlags::DONTWAIT).is_ok() {}
            }
            Err(_) => std::thread::sleep(SAFETY_REREAD),
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// A `NETLINK_ROUTE` socket subscribed to IPv4 and IPv6 address events, with a receive timeout
/// of `SAFETY_REREAD`.
fn subscribe() -> io::Result<std::os::fd::OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        // NETLINK_ROUTE is protocol 0.
        None,
    )?;
    let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR).cast_unsigned();
    rustix::net::bind(&fd, &SocketAddrNetlink::new(0, groups))?;
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(SAFETY_REREAD),
    )?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_among_this_namespaces_addresses() {
        let addrs = super::current().expect("getifaddrs");
        assert!(addrs.iter().any(std::net::IpAddr::is_loopback), "{addrs:?}");
    }
}
