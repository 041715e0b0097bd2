//! Terminating connected UDP sockets whose backend left the service.
//!
//! A connected UDP socket (a DNS client, say) was translated once, at `connect()`; if its backend
//! goes away it would keep sending into the void. socklb destroys such sockets with `sock_diag`
//! `SOCK_DESTROY`, so the application sees an error (ECONNABORTED) and connects again, getting
//! a live backend. Only sockets created by processes in the attached cgroup tree are touched
//! (matched by the socket's cgroup id), in the network namespaces those processes live in.
use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_CGROUP_ID: u16 = 21;
const TCP_ESTABLISHED: u8 = 1;
/// The fixed part of `struct inet_diag_msg`.
const DIAG_MSG_LEN: usize = 72;
const HEADER_LEN: usize = 16;
const REQUEST_LEN: usize = 56;

/// A socket found by the dump: its identity (`struct inet_diag_sockid`) and family.
#[derive(Clone, Debug)]
struct Found {
    family: u8,
    /// The raw 48-byte `inet_diag_sockid`, sent back verbatim to destroy the socket.
    id: [u8; 48],
}

/// What one termination pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Terminated {
    pub namespaces: usize,
    pub sockets: usize,
}

/// Destroys the connected UDP sockets, created under `cgroup`, whose peer is one of `backends`.
pub fn terminate(cgroup: &Path, backends: &BTreeSet<SocketAddr>) -> io::Result<Terminated> {
    let mut done = Terminated::default();
    if backends.is_empty() {
        return Ok(done);
    }
    let (cgroup_ids, netns) = cgroup_tree(cgroup)?;
    for ns_path in netns.values() {
        let ns_path = ns_path.clone();
        let (ids, targets) = (cgroup_ids.clone(), backends.clone());
        // setns() changes only the calling thread's namespace: do it on a thread of its own.
        let n = std::thread::spawn(move || -> io::Result<usize> {
            let ns = std::fs::File::open(&ns_path)?;
            // SAFETY: setns on a namespace fd we opened, for this thread only.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            destroy_in_current_netns(&ids, &targets)
        })
        .join()
        .map_err(|_| io::Error::other("socket termination thread panicked"))??;
        done.namespaces += 1;
        done.sockets += n;
    }
    Ok(done)
}

/// The cgroup ids of `root` and its descendants, and one `/proc/PID/ns/net` per network
/// namespace their processes use.
/// Network namespaces by (device, inode), each with a path that opens it.
type Namespaces = BTreeMap<(u64, u64), PathBuf>;

fn cgroup_tree(root: &Path) -> io::Result<(BTreeSet<u64>, Namespaces)> {
    let mut ids = BTreeSet::new();
    let mut netns = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        ids.insert(std::fs::metadata(&dir)?.ino());
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(meta) = std::fs::metadata(&path) {
                netns.entry((meta.dev(), meta.ino())).or_insert(path);
            }
        }
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    Ok((ids, netns))
}

fn destroy_in_current_netns(
    cgroup_ids: &BTreeSet<u64>,
    targets: &BTreeSet<SocketAddr>,
) -> io::Result<usize> {
    let sock = netlink_socket()?;
    let mut found = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        found.extend(dump_udp(&sock, family, cgroup_ids, targets)?);
    }
    let mut destroyed = 0;
    for f in &found {
        match request(
            &sock,
            SOCK_DESTROY,
            NLM_F_REQUEST | NLM_F_ACK,
            f.family,
            &f.id,
        ) {
            Ok(()) => destroyed += 1,
            // Closed meanwhile: nothing to do.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(destroyed)
}

fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn message(kind: u16, flags: u16, family: u8, id: &[u8; 48]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + REQUEST_LEN);
    m.extend_from_slice(&((HEADER_LEN + REQUEST_LEN) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    // struct inet_diag_req_v2
    m.push(family);
    m.push(libc::IPPROTO_UDP as u8);
    m.push(0); // idiag_ext
    m.push(0);
    m.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes()); // connected sockets
    m.extend_from_slice(id);
    m
}

fn send(sock: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: sockaddr_nl zeroed with the family set addresses the kernel.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: valid buffer and address for the call.
    let rc = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn recv(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid buffer.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Netlink messages in a received buffer: (type, payload).
fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= buf.len() {
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default()) as usize;
        if len < HEADER_LEN || at + len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        out.push((kind, &buf[at + HEADER_LEN..at + len]));
        at += (len + 3) & !3;
    }
    out
}

fn netlink_error(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(..4)
        .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap_or_default()));
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-code))
    }
}

fn request(sock: &OwnedFd, kind: u16, flags: u16, family: u8, id: &[u8; 48]) -> io::Result<()> {
    send(sock, &message(kind, flags, family, id))?;
    let mut buf = vec![0u8; 8192];
    let n = recv(sock, &mut buf)?;
    for (t, payload) in messages(&buf[..n]) {
        if t == NLMSG_ERROR {
            return netlink_error(payload);
        }
    }
    Ok(())
}

fn dump_udp(
    sock: &OwnedFd,
    family: u8,
    cgroup_ids: &BTreeSet<u64>,
    targets: &BTreeSet<SocketAddr>,
) -> io::Result<Vec<Found>> {
    send(
        sock,
        &message(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            family,
            &[0; 48],
        ),
    )?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(sock, &mut buf)?;
        for (kind, payload) in messages(&buf[..n]) {
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    netlink_error(payload)?;
                    return Ok(found);
                }
                _ => {
                    if let Some(f) = parse(payload, cgroup_ids, targets) {
                        found.push(f);
                    }
                }
            }
        }
    }
}

/// One `inet_diag_msg`: keep it if its peer is a target and its cgroup is ours.
fn parse(
    payload: &[u8],
    cgroup_ids: &BTreeSet<u64>,
    targets: &BTreeSet<SocketAddr>,
) -> Option<Found> {
    if payload.len() < DIAG_MSG_LEN {
        return None;
    }
    let family = payload[0];
    let id: [u8; 48] = payload[4..52].try_into().ok()?;
    let dport = u16::from_be_bytes([id[2], id[3]]);
    let dst = &id[20..36];
    let peer = if family == libc::AF_INET as u8 {
        IpAddr::V4(Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]))
    } else {
        let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(dst).ok()?);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    };
    if !targets.contains(&SocketAddr::new(peer, dport)) {
        return None;
    }
    let cgroup = attributes(&payload[DIAG_MSG_LEN..])
        .find(|(t, _)| *t == INET_DIAG_CGROUP_ID)
        .and_then(|(_, v)| {
            v.get(..8)
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
        });
    // Without the attribute (old kernels) the socket's netns is ours anyway.
    if cgroup.is_some_and(|c| !cgroup_ids.contains(&c)) {
        return None;
    }
    Some(Found { family, id })
}

fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((kind, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag_msg(family: u8, dst: &[u8], dport: u16, cgroup: Option<u64>) -> Vec<u8> {
        let mut m = vec![family, TCP_ESTABLISHED, 0, 0];
        let mut id = [0u8; 48];
        id[2..4].copy_from_slice(&dport.to_be_bytes());
        id[20..20 + dst.len()].copy_from_slice(dst);
        m.extend_from_slice(&id);
        m.extend_from_slice(&[0; 20]);
        if let Some(c) = cgroup {
            m.extend_from_slice(&12u16.to_ne_bytes());
            m.extend_from_slice(&INET_DIAG_CGROUP_ID.to_ne_bytes());
            m.extend_from_slice(&c.to_ne_bytes());
        }
        m
    }

    #[test]
    fn matches_peer_and_cgroup() {
        let targets = BTreeSet::from(["10.244.1.21:53".parse().unwrap()]);
        let ours = BTreeSet::from([42]);
        let v4 = libc::AF_INET as u8;
        assert!(
            parse(
                &diag_msg(v4, &[10, 244, 1, 21], 53, Some(42)),
                &ours,
                &targets
            )
            .is_some()
        );
        assert!(
            parse(
                &diag_msg(v4, &[10, 244, 1, 21], 53, Some(7)),
                &ours,
                &targets
            )
            .is_none(),
            "other cgroup"
        );
        assert!(
            parse(
                &diag_msg(v4, &[10, 244, 1, 21], 54, Some(42)),
                &ours,
                &targets
            )
            .is_none(),
            "other port"
        );
        let mapped = Ipv4Addr::new(10, 244, 1, 21).to_ipv6_mapped().octets();
        assert!(
            parse(
                &diag_msg(libc::AF_INET6 as u8, &mapped, 53, Some(42)),
                &ours,
                &targets
            )
            .is_some(),
            "an AF_INET6 socket connected to the IPv4-mapped backend"
        );
    }
}
