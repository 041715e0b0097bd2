//! The kernel's own verdicts on socklb's optional parts, asked without socklb's probe and
//! without its netlink code: each part's call or program, in the smallest form that uses the
//! same kernel feature. `features.rs` compares them with what the probe and the agent report,
//! so a probe that wrongly says "refused" (or "on") fails a test.
use std::{
    io,
    net::{SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use socklb::dataplane::sys::{self, bpf_attach_type, bpf_prog_type};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `INET_DIAG_REQ_SK_BPF_STORAGES` and, nested in it, `SK_DIAG_BPF_STORAGE_REQ_MAP_FD`.
const INET_DIAG_REQ_SK_BPF_STORAGES: u16 = 2;
const SK_DIAG_BPF_STORAGE_REQ_MAP_FD: u16 = 1;
/// The reply's `INET_DIAG_SK_BPF_STORAGES`.
const INET_DIAG_SK_BPF_STORAGES: u16 = 20;
const NLA_F_NESTED: u16 = 1 << 15;

/// Whether the kernel loads a `cgroup/sock_release` program that reads the socket's cookie (the
/// hook and a helper socklb's release program calls), from raw bytecode.
pub fn loads_release_program() -> bool {
    // r0 = bpf_get_socket_cookie(r1 = ctx); r0 = 1; exit
    let insns = [
        u64::from_le_bytes([0x85, 0, 0, 0, 46, 0, 0, 0]),
        u64::from_le_bytes([0xb7, 0, 0, 0, 1, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    sys::prog_load(
        bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK,
        bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
        0,
        &insns,
        "oracle_release",
    )
    .is_ok()
}

/// Whether the kernel lets both program types socklb's cookie proof runs in (`cgroup/sock_release`
/// and a `cgroup/getpeername4` one) call the kfunc `bpf_cast_to_kern_ctx`, its id read from
/// the kernel's BTF with aya's parser (socklb reads it with another), from raw bytecode.
pub fn calls_cast_to_kern_ctx() -> bool {
    let Ok(btf) = aya::Btf::from_sys_fs() else {
        return false;
    };
    let Ok(id) = btf.id_by_type_name_kind("bpf_cast_to_kern_ctx", aya_obj::btf::BtfKind::Func)
    else {
        return false;
    };
    // r0 = bpf_cast_to_kern_ctx(r1 = ctx) (a kfunc call: src_reg 2); r0 = 1; exit
    let mut call = [0x85, 0x20, 0, 0, 0, 0, 0, 0];
    call[4..].copy_from_slice(&id.to_le_bytes());
    let insns = [
        u64::from_le_bytes(call),
        u64::from_le_bytes([0xb7, 0, 0, 0, 1, 0, 0, 0]),
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    [
        (
            bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK,
            bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
        ),
        (
            bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
        ),
    ]
    .into_iter()
    .all(|(prog, attach)| sys::prog_load(prog, attach, 0, &insns, "oracle_kfunc").is_ok())
}

/// A `NETLINK_SOCK_DIAG` socket in the calling thread's network namespace.
fn sock_diag_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
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
    // SAFETY: a descriptor socket(2) just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `inet_diag_req_v2` for one IPv4 socket (or, with `dump`, every socket of `protocol`),
/// in a netlink message of `kind`, with `attributes` after it.
fn request(
    kind: u16,
    flags: u16,
    protocol: u8,
    local: SocketAddrV4,
    peer: SocketAddrV4,
    attributes: &[u8],
) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend([libc::AF_INET as u8, protocol, 0, 0]);
    body.extend(u32::MAX.to_ne_bytes()); // every state
    body.extend(local.port().to_be_bytes());
    body.extend(peer.port().to_be_bytes());
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&local.ip().octets());
    let mut dst = [0u8; 16];
    dst[..4].copy_from_slice(&peer.ip().octets());
    body.extend(src);
    body.extend(dst);
    body.extend(0u32.to_ne_bytes()); // interface
    body.extend([0xff; 8]); // INET_DIAG_NOCOOKIE
    body.extend(attributes);
    let len = 16 + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend(u32::try_from(len).unwrap_or(0).to_ne_bytes());
    msg.extend(kind.to_ne_bytes());
    msg.extend(flags.to_ne_bytes());
    msg.extend(1u32.to_ne_bytes()); // sequence
    msg.extend(0u32.to_ne_bytes()); // port id: the kernel's
    msg.extend(body);
    msg
}

/// A netlink attribute (`type`, payload), padded to 4 bytes.
fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut out = Vec::new();
    out.extend(u16::try_from(len).unwrap_or(0).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(payload);
    out.resize(len.next_multiple_of(4), 0);
    out
}

fn send(fd: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: `msg` outlives the call; sending to the kernel (address zero).
    let n = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The netlink messages of one receive: (type, payload).
fn receive(fd: &OwnedFd) -> io::Result<Vec<(u16, Vec<u8>)>> {
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `buf` outlives the call and is as long as said.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut rest = &buf[..usize::try_from(n).unwrap_or(0)];
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap_or_default()) as usize;
        let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap_or_default());
        if len < 16 || len > rest.len() {
            break;
        }
        out.push((kind, rest[16..len].to_vec()));
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    Ok(out)
}

/// The errno of an `NLMSG_ERROR` payload (0: success).
fn error_of(payload: &[u8]) -> i32 {
    -i32::from_ne_bytes(payload[0..4].try_into().unwrap_or_default())
}

/// Whether the kernel destroys a connected UDP socket on `SOCK_DESTROY` (the socket's next
/// receive then fails with `ECONNABORTED`): asked with two UDP sockets on loopback. `Ok(false)`
/// when it says the call is not supported (no `CONFIG_INET_DIAG_DESTROY`).
pub fn destroys_udp_sockets() -> anyhow::Result<bool> {
    let peer = UdpSocket::bind("127.0.0.1:0")?;
    let victim = UdpSocket::bind("127.0.0.1:0")?;
    victim.connect(peer.local_addr()?)?;
    let (SocketAddr::V4(local), SocketAddr::V4(remote)) =
        (victim.local_addr()?, victim.peer_addr()?)
    else {
        anyhow::bail!("loopback sockets are IPv4");
    };
    let nl = sock_diag_socket()?;
    send(
        &nl,
        &request(
            SOCK_DESTROY,
            NLM_F_REQUEST | NLM_F_ACK,
            libc::IPPROTO_UDP as u8,
            local,
            remote,
            &[],
        ),
    )?;
    let replies = receive(&nl)?;
    let Some((_, payload)) = replies.iter().find(|(k, _)| *k == NLMSG_ERROR) else {
        anyhow::bail!("no answer to SOCK_DESTROY");
    };
    match error_of(payload) {
        0 => {}
        libc::EOPNOTSUPP => return Ok(false),
        e => return Err(io::Error::from_raw_os_error(e).into()),
    }
    victim.set_nonblocking(true)?;
    let mut buf = [0u8; 8];
    match victim.recv(&mut buf) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(true),
        other => anyhow::bail!("SOCK_DESTROY said yes, but the socket's receive gave {other:?}"),
    }
}

/// Whether the kernel reports a TCP socket's BPF storage in `sock_diag` (the dump asked for
/// the storage map `map`): dumped in the calling thread's network namespace, true when the
/// socket `local` → `peer` comes back with its storage attribute. The socket must hold storage
/// in `map`.
pub fn reports_socket_storage(
    map: BorrowedFd<'_>,
    local: SocketAddrV4,
    peer: SocketAddrV4,
) -> anyhow::Result<bool> {
    let fd = u32::try_from(map.as_raw_fd())?;
    let nested = attribute(SK_DIAG_BPF_STORAGE_REQ_MAP_FD, &fd.to_ne_bytes());
    let storages = attribute(INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED, &nested);
    let nl = sock_diag_socket()?;
    let unspecified = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
    send(
        &nl,
        &request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            libc::IPPROTO_TCP as u8,
            unspecified,
            unspecified,
            &storages,
        ),
    )?;
    loop {
        for (kind, payload) in receive(&nl)? {
            match kind {
                NLMSG_DONE => return Ok(false),
                NLMSG_ERROR => match error_of(&payload) {
                    0 => return Ok(false),
                    e => return Err(io::Error::from_raw_os_error(e).into()),
                },
                SOCK_DIAG_BY_FAMILY => {
                    // inet_diag_msg: family, state, timer, retrans, then the socket id.
                    if payload.len() < 72 {
                        continue;
                    }
                    let sport = u16::from_be_bytes([payload[4], payload[5]]);
                    let dport = u16::from_be_bytes([payload[6], payload[7]]);
                    let src: [u8; 4] = payload[8..12].try_into().unwrap_or_default();
                    let dst: [u8; 4] = payload[24..28].try_into().unwrap_or_default();
                    if SocketAddrV4::new(src.into(), sport) != local
                        || SocketAddrV4::new(dst.into(), dport) != peer
                    {
                        continue;
                    }
                    return Ok(has_attribute(&payload[72..], INET_DIAG_SK_BPF_STORAGES));
                }
                _ => {}
            }
        }
    }
}

/// Whether a run of netlink attributes holds one of `kind`.
fn has_attribute(mut rest: &[u8], kind: u16) -> bool {
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let k = u16::from_ne_bytes([rest[2], rest[3]]) & !NLA_F_NESTED;
        if k == kind {
            return true;
        }
        if len < 4 {
            return false;
        }
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    false
}
