//! Netlink `sock_diag` for inet sockets: list ("dump") the sockets of one family and protocol,
//! with their cgroup id and chosen BPF socket-local storage, and destroy single sockets.
//!
//! socklb uses it to find the connected UDP sockets whose backend left a service and to
//! terminate them with `SOCK_DESTROY`: their owners see `ECONNABORTED` and connect again.
//!
//! How it talks to the kernel:
//! - The netlink structures (`struct nlmsghdr`, `struct nlmsgerr`, `struct nlattr`) and
//!   constants (`NLMSG_*`, `NLM_F_*`, `NLA_F_*`) are the `libc` crate's. The `sock_diag` and
//!   `inet_diag` ones, which `libc` does not have (`struct inet_diag_sockid`,
//!   `struct inet_diag_req_v2`, `struct inet_diag_msg`, `SOCK_DIAG_BY_FAMILY`, `SOCK_DESTROY`,
//!   the `INET_DIAG_*` and `SK_DIAG_*` attribute types), are mirrored here as `#[repr(C)]` types
//!   and constants. The sizes and field offsets of all six structures are asserted at compile
//!   time. Requests are built from them and replies are decoded by copying them out of the
//!   received bytes (`read_unaligned`), never through hand-counted byte offsets.
//! - Every call opens its own `NETLINK_SOCK_DIAG` socket, so it sees the network namespace the
//!   calling thread is in at that moment (a thread that did `setns()` sees that namespace).
//! - Every request carries a fresh sequence number. Replies with another sequence number are
//!   skipped, and so are datagrams not sent by the kernel (netlink port id 0). A dump is read over
//!   as many `recv()` calls as it takes, each datagram sized first with `MSG_PEEK | MSG_TRUNC`,
//!   until `NLMSG_DONE`. `NLMSG_ERROR` with a non-zero code becomes [`SockDiagError::Netlink`].
//!   A dump flagged `NLM_F_DUMP_INTR` (inconsistent because the table changed) is read to its end
//!   and started again, up to [`DUMP_ATTEMPTS`] times.
//!
//! Kernel facts this relies on (`include/uapi/linux/inet_diag.h`, `include/uapi/linux/sock_diag.h`,
//! `net/ipv4/inet_diag.c`, `net/ipv4/udp_diag.c`, `net/core/bpf_sk_storage.c`):
//! - `INET_DIAG_CGROUP_ID` (21, a u64) is put in every full socket's reply by
//!   `inet_diag_msg_attrs_fill()` when the kernel has `CONFIG_SOCK_CGROUP_DATA`; no `idiag_ext` bit
//!   asks for it (that field has 8 bits and cannot name attributes above 8).
//! - BPF socket storage is asked for with the nested request attribute
//!   `INET_DIAG_REQ_SK_BPF_STORAGES` (2) holding one `SK_DIAG_BPF_STORAGE_REQ_MAP_FD` (1, a u32 fd)
//!   per map (an empty nest means every map). That needs `CAP_BPF` or `CAP_SYS_ADMIN` (`EPERM`
//!   otherwise); an fd that is no `BPF_MAP_TYPE_SK_STORAGE` map gives `EINVAL`, a repeated one
//!   `EEXIST`. Sockets that hold a value get `INET_DIAG_SK_BPF_STORAGES` (20), nesting one
//!   `SK_DIAG_BPF_STORAGE` (1) per map, each nesting `SK_DIAG_BPF_STORAGE_MAP_ID` (2, a u32) and
//!   `SK_DIAG_BPF_STORAGE_MAP_VALUE` (3, the value's bytes; on architectures without efficient
//!   unaligned access an `SK_DIAG_BPF_STORAGE_PAD` (1) attribute may precede it).
//! - Only sockets with an `inet_connection_sock` (TCP) ever carry storage: UDP (and raw)
//!   sockets are filled by `inet_sk_diag_fill(sk, NULL, ...)`, which returns before the storage
//!   part. A UDP dump accepts the request and reports no storage, even for sockets that have a
//!   value (checked on 6.18). A connected UDP socket's peer (`dst`) is its backend anyway.
//! - `SOCK_DESTROY` finds a UDP socket by looking its 4-tuple (and `idiag_if`) up like an incoming
//!   packet would, then compares `idiag_cookie` (unless both words are `INET_DIAG_NOCOOKIE`); a
//!   socket that is gone, or another one found in its place, answers `ENOENT`. It needs
//!   `CAP_NET_ADMIN` and `CONFIG_INET_DIAG_DESTROY` (`EOPNOTSUPP` otherwise). A destroyed UDP
//!   socket gets the pending error `ECONNABORTED` and is disconnected.
use std::{
    io,
    mem::{offset_of, size_of},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType,
    netlink::{self, SocketAddrNetlink},
    sockopt::{self, Timeout},
};

/// `AF_INET`, as `sdiag_family` and `idiag_family` carry it.
pub const AF_INET: u8 = libc::AF_INET as u8;
/// `AF_INET6`, as `sdiag_family` and `idiag_family` carry it.
pub const AF_INET6: u8 = libc::AF_INET6 as u8;
/// As a dump's family, for TCP only: both families in one walk of the table (`AF_UNSPEC`, the
/// older `TCPDIAG_GETSOCK` request). Each socket's `family` says which it is.
pub const BOTH_FAMILIES: u8 = libc::AF_UNSPEC as u8;
/// `IPPROTO_TCP`, as `sdiag_protocol` carries it.
pub const IPPROTO_TCP: u8 = libc::IPPROTO_TCP as u8;
/// `IPPROTO_UDP`, as `sdiag_protocol` carries it.
pub const IPPROTO_UDP: u8 = libc::IPPROTO_UDP as u8;
/// `TCP_ESTABLISHED`: also the state of a connected UDP socket.
pub const TCP_ESTABLISHED: u8 = 1;
/// `TCP_CLOSE`: also the state of an unconnected UDP socket.
pub const TCP_CLOSE: u8 = 7;
/// `TCP_LISTEN`.
pub const TCP_LISTEN: u8 = 10;
/// `TCP_TIME_WAIT`: a closed connection's mini socket.
pub const TCP_TIME_WAIT: u8 = 6;
/// `TCP_NEW_SYN_RECV`: a server's request socket.
pub const TCP_NEW_SYN_RECV: u8 = 12;
/// A `states` mask that selects every state.
pub const ALL_STATES: u32 = u32::MAX;
/// The states a socket with a socklb record can be in: all but a listener's (it never
/// connects) and the kernel's mini sockets (`TIME_WAIT`, `NEW_SYN_RECV`), which have no socket
/// storage; a connection's slot is freed when it is closed, before it waits. A node holds tens
/// of thousands of waiting sockets after a burst of short connections: a dump asking for every
/// state would hand each over for nothing.
pub const RECORD_STATES: u32 =
    ALL_STATES & !(state_bit(TCP_LISTEN) | state_bit(TCP_TIME_WAIT) | state_bit(TCP_NEW_SYN_RECV));

/// The `states` mask bit of one state (`1 << state`), e.g. `state_bit(TCP_ESTABLISHED)` for
/// connected UDP sockets. Combine several with `|`.
pub const fn state_bit(state: u8) -> u32 {
    match 1u32.checked_shl(state as u32) {
        Some(bit) => bit,
        None => 0,
    }
}

/// How many times [`dump`] starts a dump the kernel flagged `NLM_F_DUMP_INTR` before giving up.
pub const DUMP_ATTEMPTS: u32 = 3;

// Netlink (include/uapi/linux/netlink.h), from libc. libc declares these as `c_int`; the
// message header and attribute header carry them in u16 fields (`nlmsg_type`, `nlmsg_flags`,
// `nla_type`), so they are converted once here, checked at compile time.
/// `NLMSG_NOOP`: nothing, skipped.
const NLMSG_NOOP: u16 = netlink_u16(libc::NLMSG_NOOP);
/// `NLMSG_ERROR`: an error, or with code 0 the acknowledgement of a request.
const NLMSG_ERROR: u16 = netlink_u16(libc::NLMSG_ERROR);
/// `NLMSG_DONE`: the end of a dump.
const NLMSG_DONE: u16 = netlink_u16(libc::NLMSG_DONE);
/// `NLM_F_REQUEST`: set on every request.
const NLM_F_REQUEST: u16 = netlink_u16(libc::NLM_F_REQUEST);
/// `NLM_F_ACK`: asks for an acknowledgement (an `NLMSG_ERROR` with code 0).
const NLM_F_ACK: u16 = netlink_u16(libc::NLM_F_ACK);
/// `NLM_F_DUMP_INTR`: this part of the dump may be inconsistent.
const NLM_F_DUMP_INTR: u16 = netlink_u16(libc::NLM_F_DUMP_INTR);
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`): dump every matching object.
const NLM_F_DUMP: u16 = netlink_u16(libc::NLM_F_DUMP);
/// `NLA_F_NESTED`: the attribute holds attributes.
const NLA_F_NESTED: u16 = netlink_u16(libc::NLA_F_NESTED);
/// `NLA_F_NET_BYTEORDER`: the attribute's value is in network byte order.
const NLA_F_NET_BYTEORDER: u16 = netlink_u16(libc::NLA_F_NET_BYTEORDER);
/// `NLA_TYPE_MASK`: the attribute type without the two flags. (libc's `NLA_TYPE_MASK` is the
/// same mask as a negative `c_int`, with the upper 16 bits set too; this is its low half.)
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// A libc netlink constant (`c_int`) as the u16 that netlink headers carry. Used only in
/// constants, so a value that does not fit (negative or above `u16::MAX`) fails the build.
const fn netlink_u16(value: libc::c_int) -> u16 {
    let value = value.cast_unsigned();
    assert!(value <= 0xffff, "netlink constant does not fit in 16 bits");
    value as u16
}

// sock_diag (include/uapi/linux/sock_diag.h).
/// `SOCK_DIAG_BY_FAMILY`: the dump request, and the type of each socket in its reply.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `SOCK_DESTROY`: close one socket.
const SOCK_DESTROY: u16 = 21;
/// `TCPDIAG_GETSOCK` (`include/uapi/linux/inet_diag.h`): the older TCP dump request, and the type of
/// each socket in its reply. Its dump covers both families in one walk of the TCP table (the
/// kernel reads its family as `AF_UNSPEC`), where `SOCK_DIAG_BY_FAMILY` walks it once per family.
const TCPDIAG_GETSOCK: u16 = 18;
/// `SK_DIAG_BPF_STORAGE_REQ_MAP_FD`: one map (u32 fd) inside `INET_DIAG_REQ_SK_BPF_STORAGES`.
const SK_DIAG_BPF_STORAGE_REQ_MAP_FD: u16 = 1;
/// `SK_DIAG_BPF_STORAGE`: one map's value, nested inside `INET_DIAG_SK_BPF_STORAGES`.
const SK_DIAG_BPF_STORAGE: u16 = 1;
/// `SK_DIAG_BPF_STORAGE_MAP_ID`: the map's id (u32), inside `SK_DIAG_BPF_STORAGE`.
const SK_DIAG_BPF_STORAGE_MAP_ID: u16 = 2;
/// `SK_DIAG_BPF_STORAGE_MAP_VALUE`: the value's bytes, inside `SK_DIAG_BPF_STORAGE`.
const SK_DIAG_BPF_STORAGE_MAP_VALUE: u16 = 3;

// inet_diag (include/uapi/linux/inet_diag.h).
/// `INET_DIAG_REQ_SK_BPF_STORAGES`: request attribute naming the storage maps to report.
const INET_DIAG_REQ_SK_BPF_STORAGES: u16 = 2;
/// `INET_DIAG_SK_BPF_STORAGES`: reply attribute with the socket's storage values.
const INET_DIAG_SK_BPF_STORAGES: u16 = 20;
/// `INET_DIAG_CGROUP_ID`: reply attribute with the cgroup v2 id of the socket's creator (u64).
const INET_DIAG_CGROUP_ID: u16 = 21;

/// Initial receive buffer; grown when the kernel sends a larger datagram.
const RECV_BUFFER: usize = 32 * 1024;
/// How long one `recv()` waits for the kernel before the call fails (it answers at once).
const RECV_TIMEOUT: Duration = Duration::from_secs(10);
/// How many messages with other sequence numbers one request skips before it gives up.
const MAX_STALE_MESSAGES: usize = 1024;

/// Kernel ABI structures that are plain old data: `#[repr(C)]`, only integer fields and arrays
/// of them, and no padding (the layout assertions below check the sizes add up). So every byte
/// pattern is a valid value and every byte of a value is initialized.
///
/// # Safety
///
/// Implement only for types that are exactly that.
unsafe trait Plain: Copy {
    /// Copies a `Self` out of the start of `bytes`; `None` when `bytes` is too short.
    fn read(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < size_of::<Self>() {
            return None;
        }
        // SAFETY: `bytes` holds at least size_of::<Self>() bytes; read_unaligned needs no
        // alignment; `Plain` guarantees any byte pattern is a valid `Self`.
        Some(unsafe { bytes.as_ptr().cast::<Self>().read_unaligned() })
    }

    /// The value's bytes in memory (native) order, as the kernel reads them.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Plain` types have no padding, so all size_of::<Self>() bytes behind `self`
        // are initialized; the slice borrows `self` and so cannot outlive it.
        unsafe {
            std::slice::from_raw_parts(std::ptr::from_ref(self).cast::<u8>(), size_of::<Self>())
        }
    }
}

/// `struct inet_diag_sockid`: a socket's identity. Sent back verbatim (cookie included) to
/// destroy exactly that socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InetDiagSockId {
    /// `idiag_sport`: the local port, network byte order.
    pub sport_be: u16,
    /// `idiag_dport`: the peer port, network byte order (0 when unconnected).
    pub dport_be: u16,
    /// `idiag_src`: the local address; an IPv4 address fills the first 4 bytes, the rest are 0.
    pub src: [u8; 16],
    /// `idiag_dst`: the peer address, laid out like `src`.
    pub dst: [u8; 16],
    /// `idiag_if`: the interface the socket is bound to, 0 if none.
    pub if_index: u32,
    /// `idiag_cookie`: the socket cookie, low 32 bits first (`INET_DIAG_NOCOOKIE` twice in a
    /// request matches any cookie).
    pub cookie: [u32; 2],
}

impl InetDiagSockId {
    /// The socket cookie (`SO_COOKIE`) held in `cookie`.
    pub const fn cookie(&self) -> u64 {
        (self.cookie[1] as u64) << 32 | self.cookie[0] as u64
    }

    /// Stores `cookie` the way the kernel does (low 32 bits first).
    pub const fn set_cookie(&mut self, cookie: u64) {
        self.cookie = [cookie as u32, (cookie >> 32) as u32];
    }
}

/// `struct inet_diag_req_v2`: the request body of `SOCK_DIAG_BY_FAMILY` and `SOCK_DESTROY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InetDiagReqV2 {
    /// `sdiag_family`: `AF_INET` or `AF_INET6`.
    family: u8,
    /// `sdiag_protocol`: `IPPROTO_TCP`, `IPPROTO_UDP`, ...
    protocol: u8,
    /// `idiag_ext`: bit N-1 asks for extension attribute N (N <= 8); unused here.
    ext: u8,
    /// `pad`.
    pad: u8,
    /// `idiag_states`: bit N selects TCP state N.
    states: u32,
    /// `id`: for a dump only ports act as filters (0 = any); for a destroy the exact socket.
    id: InetDiagSockId,
}

/// `struct inet_diag_req`: the request body of `TCPDIAG_GETSOCK`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InetDiagReq {
    /// `idiag_family`: ignored by a dump (both families).
    family: u8,
    /// `idiag_src_len`, `idiag_dst_len`: unused.
    src_len: u8,
    dst_len: u8,
    /// `idiag_ext`: unused here.
    ext: u8,
    /// `id`: for a dump only ports act as filters (0 = any).
    id: InetDiagSockId,
    /// `idiag_states`: bit N selects TCP state N.
    states: u32,
    /// `idiag_dbs`: unused.
    dbs: u32,
}

/// `struct inet_diag_msg`: one socket in a dump, followed by attributes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InetDiagMsg {
    /// `idiag_family`.
    family: u8,
    /// `idiag_state`: a TCP state number (UDP uses `TCP_ESTABLISHED` and `TCP_CLOSE`).
    state: u8,
    /// `idiag_timer`.
    timer: u8,
    /// `idiag_retrans`.
    retrans: u8,
    /// `id`.
    id: InetDiagSockId,
    /// `idiag_expires`.
    expires: u32,
    /// `idiag_rqueue`.
    rqueue: u32,
    /// `idiag_wqueue`.
    wqueue: u32,
    /// `idiag_uid`: the owner's uid, as seen from the netlink socket's user namespace.
    uid: u32,
    /// `idiag_inode`: the socket's inode number.
    inode: u32,
}

// The netlink headers are libc's (`#[repr(C)]`, like the kernel's):
// - `libc::nlmsghdr`, the header of every netlink message: `nlmsg_len` (the message's length
//   including this header), `nlmsg_type`, `nlmsg_flags`, `nlmsg_seq` (copied from the request
//   into its replies), `nlmsg_pid` (the sender's port id, 0 for requests to the kernel);
// - `libc::nlmsgerr`, the payload of `NLMSG_ERROR`: `error` (0 for an acknowledgement, else a
//   negative errno) and `msg`, the header of the request it answers;
// - `libc::nlattr`, the header of a netlink attribute, whose value follows padded to 4 bytes:
//   `nla_len` (header plus value, without the padding) and `nla_type` (with `NLA_F_NESTED` /
//   `NLA_F_NET_BYTEORDER` in the top bits).

// SAFETY (all seven): #[repr(C)], integer fields and integer arrays only, and no padding: the
// assertions below show the fields back to back, the last one ending at the type's size.
unsafe impl Plain for libc::nlmsghdr {}
// SAFETY: see above.
unsafe impl Plain for libc::nlmsgerr {}
// SAFETY: see above.
unsafe impl Plain for libc::nlattr {}
// SAFETY: see above.
unsafe impl Plain for InetDiagSockId {}
// SAFETY: see above.
unsafe impl Plain for InetDiagReqV2 {}
// SAFETY: see above.
unsafe impl Plain for InetDiagMsg {}
// SAFETY: see above.
unsafe impl Plain for InetDiagReq {}

// The kernel ABI: sizes and offsets from the uapi headers (x86_64 and every other Linux target:
// these structures only hold naturally aligned fixed-width integers).
const _: () = {
    assert!(size_of::<libc::nlmsghdr>() == 16);
    assert!(offset_of!(libc::nlmsghdr, nlmsg_len) == 0);
    assert!(offset_of!(libc::nlmsghdr, nlmsg_type) == 4);
    assert!(offset_of!(libc::nlmsghdr, nlmsg_flags) == 6);
    assert!(offset_of!(libc::nlmsghdr, nlmsg_seq) == 8);
    assert!(offset_of!(libc::nlmsghdr, nlmsg_pid) == 12);

    assert!(size_of::<libc::nlmsgerr>() == 20);
    assert!(offset_of!(libc::nlmsgerr, error) == 0);
    assert!(offset_of!(libc::nlmsgerr, msg) == 4);

    assert!(size_of::<libc::nlattr>() == 4);
    assert!(offset_of!(libc::nlattr, nla_len) == 0);
    assert!(offset_of!(libc::nlattr, nla_type) == 2);

    assert!(size_of::<InetDiagSockId>() == 48);
    assert!(offset_of!(InetDiagSockId, sport_be) == 0);
    assert!(offset_of!(InetDiagSockId, dport_be) == 2);
    assert!(offset_of!(InetDiagSockId, src) == 4);
    assert!(offset_of!(InetDiagSockId, dst) == 20);
    assert!(offset_of!(InetDiagSockId, if_index) == 36);
    assert!(offset_of!(InetDiagSockId, cookie) == 40);

    assert!(size_of::<InetDiagReqV2>() == 56);
    assert!(offset_of!(InetDiagReqV2, family) == 0);
    assert!(offset_of!(InetDiagReqV2, protocol) == 1);
    assert!(offset_of!(InetDiagReqV2, ext) == 2);
    assert!(offset_of!(InetDiagReqV2, pad) == 3);
    assert!(offset_of!(InetDiagReqV2, states) == 4);
    assert!(offset_of!(InetDiagReqV2, id) == 8);

    assert!(size_of::<InetDiagReq>() == 60);
    assert!(offset_of!(InetDiagReq, family) == 0);
    assert!(offset_of!(InetDiagReq, ext) == 3);
    assert!(offset_of!(InetDiagReq, id) == 4);
    assert!(offset_of!(InetDiagReq, states) == 52);
    assert!(offset_of!(InetDiagReq, dbs) == 56);

    assert!(size_of::<InetDiagMsg>() == 72);
    assert!(offset_of!(InetDiagMsg, family) == 0);
    assert!(offset_of!(InetDiagMsg, state) == 1);
    assert!(offset_of!(InetDiagMsg, timer) == 2);
    assert!(offset_of!(InetDiagMsg, retrans) == 3);
    assert!(offset_of!(InetDiagMsg, id) == 4);
    assert!(offset_of!(InetDiagMsg, expires) == 52);
    assert!(offset_of!(InetDiagMsg, rqueue) == 56);
    assert!(offset_of!(InetDiagMsg, wqueue) == 60);
    assert!(offset_of!(InetDiagMsg, uid) == 64);
    assert!(offset_of!(InetDiagMsg, inode) == 68);
};

/// One socket from a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagSocket {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The protocol the dump asked for (`IPPROTO_UDP`, ...).
    pub protocol: u8,
    /// A TCP state number; a connected UDP socket is `TCP_ESTABLISHED`.
    pub state: u8,
    /// The socket's identity as the kernel reported it.
    pub id: InetDiagSockId,
    /// The socket cookie (`SO_COOKIE`). [`destroy`] sends this one, so it is the value that
    /// selects the socket.
    pub cookie: u64,
    /// The owner's uid.
    pub uid: u32,
    /// The socket's inode number.
    pub inode: u32,
    /// The cgroup v2 id (the cgroup directory's inode number) of the cgroup the socket was
    /// created in; `None` on kernels without `CONFIG_SOCK_CGROUP_DATA`.
    pub cgroup_id: Option<u64>,
    /// The socket's values in the BPF socket-storage maps the dump asked for (a map without a
    /// value for this socket is absent). Always empty for UDP sockets: the kernel reports
    /// storage for TCP sockets only.
    pub storages: Vec<Storage>,
}

/// One BPF socket-local storage value of a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Storage {
    /// The map's id (`bpf_map_info.id`), not an fd.
    pub map_id: u32,
    /// The value's bytes, as large as the map's value size.
    pub value: Vec<u8>,
}

impl DiagSocket {
    /// The local address and port. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is reported as
    /// the IPv4 address.
    pub fn src(&self) -> SocketAddr {
        socket_address(self.family, self.id.src, self.id.sport_be)
    }

    /// The peer address and port (unspecified and 0 when unconnected). An IPv4-mapped IPv6
    /// address is reported as the IPv4 address.
    pub fn dst(&self) -> SocketAddr {
        socket_address(self.family, self.id.dst, self.id.dport_be)
    }

    /// The socket's value in the storage map with id `map_id`, if the dump asked for that map
    /// and the socket has one.
    pub fn storage(&self, map_id: u32) -> Option<&[u8]> {
        self.storages
            .iter()
            .find(|s| s.map_id == map_id)
            .map(|s| s.value.as_slice())
    }
}

/// An address of `family` from the 16 bytes of an `inet_diag_sockid` and a network-order port.
fn socket_address(family: u8, addr: [u8; 16], port_be: u16) -> SocketAddr {
    let port = u16::from_be(port_be);
    let ip = if family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
    } else {
        let v6 = Ipv6Addr::from(addr);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    };
    SocketAddr::new(ip, port)
}

/// What went wrong talking `sock_diag`.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    /// A system call on the netlink socket failed.
    #[error("sock_diag: {op} on the netlink socket failed")]
    Io {
        /// The call: "socket", "send", "recv", ...
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The kernel answered the request with an error code.
    #[error(
        "sock_diag: the kernel refused the {op} request: {}",
        io::Error::from_raw_os_error(*errno)
    )]
    Netlink {
        /// The request: "dump" or "destroy".
        op: &'static str,
        /// The (positive) errno.
        errno: i32,
    },
    /// A reply was shorter than the structure or the length it announced.
    #[error("sock_diag: truncated {what} in the kernel's reply")]
    Truncated {
        /// The part that did not fit.
        what: &'static str,
    },
    /// The kernel kept sending messages for other requests instead of answering this one.
    #[error("sock_diag: expected replies to request {expected}, kept getting {got}")]
    Sequence {
        /// This request's sequence number.
        expected: u32,
        /// The last sequence number seen instead.
        got: u32,
    },
    /// A message that has no place in the reply (e.g. socket data answering a destroy).
    #[error("sock_diag: unexpected message of type {kind} in the {op} reply")]
    UnexpectedMessage {
        /// The request: "dump" or "destroy".
        op: &'static str,
        /// Its `nlmsg_type`.
        kind: u16,
    },
    /// Every attempt at the dump was flagged `NLM_F_DUMP_INTR` (the socket table kept changing).
    #[error("sock_diag: the dump was interrupted {attempts} times in a row")]
    DumpInterrupted {
        /// How many dumps were tried.
        attempts: u32,
    },
    /// More storage maps than one netlink attribute (64 KiB) can name.
    #[error("sock_diag: {maps} storage maps do not fit in one request")]
    TooManyMaps {
        /// How many were given.
        maps: usize,
    },
}

impl SockDiagError {
    /// The errno the kernel answered with, for [`SockDiagError::Netlink`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Netlink { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Lists the sockets of `family` (`AF_INET` or `AF_INET6`) and `protocol` (`IPPROTO_UDP`, ...)
/// whose state is in the `states` mask (bit N = TCP state N; see [`state_bit`], [`ALL_STATES`]),
/// in the calling thread's current network namespace.
///
/// Each socket comes with its cgroup id, and with its values in the BPF socket-storage maps
/// `storage_maps` (`BPF_MAP_TYPE_SK_STORAGE`; asking for any needs `CAP_BPF` or
/// `CAP_SYS_ADMIN`). The kernel reports storage for TCP sockets only, never for UDP ones (see
/// the module documentation). An `AF_INET6` dump includes dual-stack sockets talking IPv4 (their
/// addresses are IPv4-mapped); an `AF_INET` dump does not.
pub fn dump(
    protocol: u8,
    family: u8,
    states: u32,
    storage_maps: &[BorrowedFd<'_>],
) -> Result<Vec<DiagSocket>, SockDiagError> {
    dump_with(
        &mut Netlink::open()?,
        protocol,
        family,
        states,
        storage_maps,
    )
}

/// Destroys `socket` (`SOCK_DESTROY`) in the calling thread's current network namespace: the
/// kernel finds it by its addresses, ports and interface, and destroys it only if its cookie is
/// `socket.cookie`. A UDP socket's owner then sees `ECONNABORTED`.
///
/// Returns `true` if the kernel destroyed it and `false` if no such socket exists any more
/// (`ENOENT`: closed, or replaced by another socket with the same addresses). Needs
/// `CAP_NET_ADMIN` and a kernel with `CONFIG_INET_DIAG_DESTROY`.
pub fn destroy(socket: &DiagSocket) -> Result<bool, SockDiagError> {
    destroy_with(&mut Netlink::open()?, socket)
}

/// Sends requests and hands over reply datagrams: the netlink socket, or a script in tests.
trait Transport {
    /// Sends one request to the kernel.
    fn send(&mut self, request: &[u8]) -> Result<(), SockDiagError>;
    /// Waits for the kernel's next datagram and returns it whole.
    fn recv(&mut self) -> Result<&[u8], SockDiagError>;
}

/// A `NETLINK_SOCK_DIAG` socket and its receive buffer.
struct Netlink {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Netlink {
    /// Opens a socket in the calling thread's current network namespace.
    fn open() -> Result<Self, SockDiagError> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )
        .map_err(io_error("socket"))?;
        // The kernel answers at once; the timeout only bounds a wait that should never happen.
        sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(RECV_TIMEOUT))
            .map_err(io_error("setsockopt(SO_RCVTIMEO)"))?;
        Ok(Self {
            fd,
            buf: vec![0; RECV_BUFFER],
        })
    }
}

impl Transport for Netlink {
    fn send(&mut self, request: &[u8]) -> Result<(), SockDiagError> {
        let kernel = SocketAddrNetlink::new(0, 0);
        let sent =
            retry_on_eintr(|| rustix::net::sendto(&self.fd, request, SendFlags::empty(), &kernel))
                .map_err(io_error("send"))?;
        if sent != request.len() {
            return Err(SockDiagError::Io {
                op: "send",
                source: io::ErrorKind::WriteZero.into(),
            });
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<&[u8], SockDiagError> {
        loop {
            // How large is the next datagram? (MSG_TRUNC makes recv return its full length.)
            let (_, len) = retry_on_eintr(|| {
                rustix::net::recv(
                    &self.fd,
                    &mut [0u8; 0][..],
                    RecvFlags::PEEK | RecvFlags::TRUNC,
                )
            })
            .map_err(io_error("recv"))?;
            if len > self.buf.len() {
                self.buf.resize(len, 0);
            }
            let (_, len, from) = retry_on_eintr(|| {
                rustix::net::recvfrom(&self.fd, &mut self.buf[..], RecvFlags::TRUNC)
            })
            .map_err(io_error("recv"))?;
            if len > self.buf.len() {
                return Err(SockDiagError::Truncated { what: "datagram" });
            }
            // Only the kernel (port id 0) answers requests; another process may send to our port
            // id too, and that is not ours to read.
            let from_process = from
                .and_then(|a| SocketAddrNetlink::try_from(a).ok())
                .is_some_and(|a| a.pid() != 0);
            if !from_process {
                return Ok(&self.buf[..len]);
            }
        }
    }
}

/// Runs a system call again while it fails with `EINTR`.
fn retry_on_eintr<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => {}
            other => return other,
        }
    }
}

/// Maps a failed system call to [`SockDiagError::Io`].
fn io_error(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> SockDiagError {
    move |errno| SockDiagError::Io {
        op,
        source: errno.into(),
    }
}

/// The next request's sequence number: unique within the process (until it wraps at 2^32).
fn next_seq() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A request: header, `inet_diag_req_v2`, and when `storage_maps` is not empty the nested
/// `INET_DIAG_REQ_SK_BPF_STORAGES` attribute naming them. Every part is a multiple of 4 bytes,
/// so no padding is needed.
fn encode_request(
    kind: u16,
    flags: u16,
    seq: u32,
    request: &InetDiagReqV2,
    storage_maps: &[BorrowedFd<'_>],
) -> Result<Vec<u8>, SockDiagError> {
    encode_request_body(kind, flags, seq, request.as_bytes(), storage_maps)
}

/// [`encode_request`] with any request body (a multiple of 4 bytes).
fn encode_request_body(
    kind: u16,
    flags: u16,
    seq: u32,
    body: &[u8],
    storage_maps: &[BorrowedFd<'_>],
) -> Result<Vec<u8>, SockDiagError> {
    debug_assert_eq!(body.len() % 4, 0);
    let mut attributes = Vec::new();
    if !storage_maps.is_empty() {
        const MAP_FD_LEN: usize = size_of::<libc::nlattr>() + size_of::<u32>();
        let nest_len = size_of::<libc::nlattr>() + storage_maps.len() * MAP_FD_LEN;
        let nest_len = u16::try_from(nest_len).map_err(|_| SockDiagError::TooManyMaps {
            maps: storage_maps.len(),
        })?;
        let nest = libc::nlattr {
            nla_len: nest_len,
            nla_type: INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED,
        };
        attributes.extend_from_slice(nest.as_bytes());
        for map in storage_maps {
            let map_fd = libc::nlattr {
                nla_len: MAP_FD_LEN as u16,
                nla_type: SK_DIAG_BPF_STORAGE_REQ_MAP_FD,
            };
            attributes.extend_from_slice(map_fd.as_bytes());
            // A BorrowedFd is never negative.
            attributes.extend_from_slice(&map.as_raw_fd().cast_unsigned().to_ne_bytes());
        }
    }
    let len = size_of::<libc::nlmsghdr>() + body.len() + attributes.len();
    let header = libc::nlmsghdr {
        nlmsg_len: len as u32,
        nlmsg_type: kind,
        nlmsg_flags: flags,
        nlmsg_seq: seq,
        nlmsg_pid: 0,
    };
    let mut message = Vec::with_capacity(len);
    message.extend_from_slice(header.as_bytes());
    message.extend_from_slice(body);
    message.extend_from_slice(&attributes);
    Ok(message)
}

/// The dump: request, then read every part, starting again when the kernel flags it
/// interrupted.
fn dump_with(
    transport: &mut impl Transport,
    protocol: u8,
    family: u8,
    states: u32,
    storage_maps: &[BorrowedFd<'_>],
) -> Result<Vec<DiagSocket>, SockDiagError> {
    let mut sockets = Vec::new();
    dump_each_with(
        transport,
        protocol,
        family,
        states,
        storage_maps,
        &mut |event| match event {
            Dumped::Socket(socket) => sockets.push(socket.clone()),
            Dumped::Restart => sockets.clear(),
        },
    )?;
    Ok(sockets)
}

/// What a streaming dump hands over.
pub enum Dumped<'a> {
    Socket(&'a DiagSocket),
    /// The kernel interrupted the dump (its tables changed): it starts again, so forget what
    /// came so far.
    Restart,
}

/// Like [`dump`], but hands each socket to `each` as it is read instead of collecting them:
/// the memory does not grow with the sockets. When the kernel interrupts the dump it starts
/// again, after handing over `Dumped::Restart`: what came before is to be forgotten.
/// `family` may be [`BOTH_FAMILIES`] for TCP.
pub fn dump_each(
    protocol: u8,
    family: u8,
    states: u32,
    storage_maps: &[BorrowedFd<'_>],
    each: &mut dyn FnMut(Dumped<'_>),
) -> Result<(), SockDiagError> {
    dump_each_with(
        &mut Netlink::open()?,
        protocol,
        family,
        states,
        storage_maps,
        each,
    )
}

fn dump_each_with(
    transport: &mut impl Transport,
    protocol: u8,
    family: u8,
    states: u32,
    storage_maps: &[BorrowedFd<'_>],
    each: &mut dyn FnMut(Dumped<'_>),
) -> Result<(), SockDiagError> {
    let v2 = |family| InetDiagReqV2 {
        family,
        protocol,
        states,
        ..InetDiagReqV2::default()
    };
    if family != BOTH_FAMILIES || protocol != IPPROTO_TCP {
        return dump_request(
            transport,
            SOCK_DIAG_BY_FAMILY,
            v2(family).as_bytes(),
            protocol,
            storage_maps,
            each,
        );
    }
    // Both families of TCP: the older request, one walk of the table.
    let request = InetDiagReq {
        states,
        ..InetDiagReq::default()
    };
    match dump_request(
        transport,
        TCPDIAG_GETSOCK,
        request.as_bytes(),
        protocol,
        storage_maps,
        each,
    ) {
        // A kernel without the older request (or without storages in it): a dump per family.
        Err(SockDiagError::Netlink { errno, .. })
            if [libc::EINVAL, libc::ENOENT, libc::EOPNOTSUPP].contains(&errno) =>
        {
            tracing::debug!(errno, "TCPDIAG_GETSOCK refused: one TCP dump per family");
            // A restart forgets everything handed over so far: both families again.
            'pair: for _ in 0..DUMP_ATTEMPTS {
                each(Dumped::Restart);
                for family in [AF_INET, AF_INET6] {
                    let mut restarted = false;
                    dump_request(
                        transport,
                        SOCK_DIAG_BY_FAMILY,
                        v2(family).as_bytes(),
                        protocol,
                        storage_maps,
                        &mut |event| match event {
                            Dumped::Restart => restarted = true,
                            socket @ Dumped::Socket(_) => each(socket),
                        },
                    )?;
                    if restarted {
                        continue 'pair;
                    }
                }
                return Ok(());
            }
            Err(SockDiagError::DumpInterrupted {
                attempts: DUMP_ATTEMPTS,
            })
        }
        other => other,
    }
}

/// One dump request of type `kind`, its replies (of the same type) handed to `each`; started
/// again when the kernel interrupts it.
fn dump_request(
    transport: &mut impl Transport,
    kind: u16,
    body: &[u8],
    protocol: u8,
    storage_maps: &[BorrowedFd<'_>],
    each: &mut dyn FnMut(Dumped<'_>),
) -> Result<(), SockDiagError> {
    for attempt in 0..DUMP_ATTEMPTS {
        if attempt > 0 {
            each(Dumped::Restart);
        }
        let seq = next_seq();
        let flags = NLM_F_REQUEST | NLM_F_DUMP;
        transport.send(&encode_request_body(kind, flags, seq, body, storage_maps)?)?;
        let end = read_replies(transport, seq, "dump", |header, payload| {
            if header.nlmsg_type != kind {
                return Err(SockDiagError::UnexpectedMessage {
                    op: "dump",
                    kind: header.nlmsg_type,
                });
            }
            each(Dumped::Socket(&parse_socket(payload, protocol)?));
            Ok(())
        })?;
        match end {
            End::Done { interrupted: true } => {}
            End::Done { interrupted: false } | End::Ack => return Ok(()),
        }
    }
    Err(SockDiagError::DumpInterrupted {
        attempts: DUMP_ATTEMPTS,
    })
}

/// The destroy: request with `NLM_F_ACK`, then wait for the acknowledgement or the error.
fn destroy_with(
    transport: &mut impl Transport,
    socket: &DiagSocket,
) -> Result<bool, SockDiagError> {
    let mut id = socket.id;
    id.set_cookie(socket.cookie);
    let request = InetDiagReqV2 {
        family: socket.family,
        protocol: socket.protocol,
        states: ALL_STATES,
        id,
        ..InetDiagReqV2::default()
    };
    let seq = next_seq();
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    transport.send(&encode_request(SOCK_DESTROY, flags, seq, &request, &[])?)?;
    let end = read_replies(transport, seq, "destroy", |header, _| {
        Err(SockDiagError::UnexpectedMessage {
            op: "destroy",
            kind: header.nlmsg_type,
        })
    });
    match end {
        Ok(End::Ack) => Ok(true),
        Ok(End::Done { .. }) => Err(SockDiagError::UnexpectedMessage {
            op: "destroy",
            kind: NLMSG_DONE,
        }),
        Err(SockDiagError::Netlink {
            errno: libc::ENOENT,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How the replies to a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// `NLMSG_DONE`: the dump is complete; `interrupted` when a part carried `NLM_F_DUMP_INTR`.
    Done { interrupted: bool },
    /// `NLMSG_ERROR` with code 0: the acknowledgement.
    Ack,
}

/// Reads the replies to request `seq` (named `op` in errors) until `NLMSG_DONE` or
/// `NLMSG_ERROR`, over as many datagrams as they take, handing every other message to
/// `on_message`. Messages with another sequence number are skipped.
fn read_replies(
    transport: &mut impl Transport,
    seq: u32,
    op: &'static str,
    mut on_message: impl FnMut(&libc::nlmsghdr, &[u8]) -> Result<(), SockDiagError>,
) -> Result<End, SockDiagError> {
    let mut stale = 0;
    let mut interrupted = false;
    loop {
        for message in messages(transport.recv()?) {
            let (header, payload) = message?;
            if header.nlmsg_seq != seq {
                // A late reply to an earlier request: not ours.
                stale += 1;
                if stale > MAX_STALE_MESSAGES {
                    return Err(SockDiagError::Sequence {
                        expected: seq,
                        got: header.nlmsg_seq,
                    });
                }
                continue;
            }
            interrupted |= header.nlmsg_flags & NLM_F_DUMP_INTR != 0;
            match header.nlmsg_type {
                NLMSG_NOOP => {}
                NLMSG_ERROR => {
                    let error = libc::nlmsgerr::read(payload)
                        .ok_or(SockDiagError::Truncated { what: "nlmsgerr" })?;
                    return match error.error {
                        0 => Ok(End::Ack),
                        code => Err(SockDiagError::Netlink {
                            op,
                            errno: code.saturating_abs(),
                        }),
                    };
                }
                NLMSG_DONE => {
                    // The payload is the dump's final status (an int; 0 or a negative errno).
                    let status = payload
                        .first_chunk::<4>()
                        .map_or(0, |b| i32::from_ne_bytes(*b));
                    return if status < 0 {
                        Err(SockDiagError::Netlink {
                            op,
                            errno: status.saturating_abs(),
                        })
                    } else {
                        Ok(End::Done { interrupted })
                    };
                }
                _ => on_message(&header, payload)?,
            }
        }
    }
}

/// The netlink messages in a datagram: (header, payload). A message that claims more bytes than
/// the datagram holds, or a partial header, is an error.
fn messages(
    mut datagram: &[u8],
) -> impl Iterator<Item = Result<(libc::nlmsghdr, &[u8]), SockDiagError>> {
    std::iter::from_fn(move || {
        if datagram.is_empty() {
            return None;
        }
        let Some(header) = libc::nlmsghdr::read(datagram) else {
            datagram = &[];
            return Some(Err(SockDiagError::Truncated { what: "nlmsghdr" }));
        };
        let len = header.nlmsg_len as usize;
        if len < size_of::<libc::nlmsghdr>() || len > datagram.len() {
            datagram = &[];
            return Some(Err(SockDiagError::Truncated {
                what: "netlink message",
            }));
        }
        let payload = &datagram[size_of::<libc::nlmsghdr>()..len];
        datagram = &datagram[align4(len).min(datagram.len())..];
        Some(Ok((header, payload)))
    })
}

/// The attributes in `bytes`: (type without the flag bits, value). An attribute that claims more
/// bytes than remain, or a partial header, is an error.
fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), SockDiagError>> {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let Some(attr) = libc::nlattr::read(bytes) else {
            bytes = &[];
            return Some(Err(SockDiagError::Truncated { what: "nlattr" }));
        };
        let len = usize::from(attr.nla_len);
        if len < size_of::<libc::nlattr>() || len > bytes.len() {
            bytes = &[];
            return Some(Err(SockDiagError::Truncated {
                what: "netlink attribute",
            }));
        }
        let value = &bytes[size_of::<libc::nlattr>()..len];
        bytes = &bytes[align4(len).min(bytes.len())..];
        Some(Ok((attr.nla_type & NLA_TYPE_MASK, value)))
    })
}

/// `NLMSG_ALIGN` / `NLA_ALIGN`: rounds up to a multiple of 4. (libc's macros of those names
/// return `c_int`, and its `NLA_ALIGN` is an `unsafe fn`; lengths here are `usize`.)
const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// One `SOCK_DIAG_BY_FAMILY` message: `inet_diag_msg` and its attributes.
fn parse_socket(payload: &[u8], protocol: u8) -> Result<DiagSocket, SockDiagError> {
    let msg = InetDiagMsg::read(payload).ok_or(SockDiagError::Truncated {
        what: "inet_diag_msg",
    })?;
    let mut socket = DiagSocket {
        family: msg.family,
        protocol,
        state: msg.state,
        id: msg.id,
        cookie: msg.id.cookie(),
        uid: msg.uid,
        inode: msg.inode,
        cgroup_id: None,
        storages: Vec::new(),
    };
    for attribute in attributes(&payload[align4(size_of::<InetDiagMsg>())..]) {
        let (kind, value) = attribute?;
        match kind {
            INET_DIAG_CGROUP_ID => {
                let id = value.first_chunk::<8>().ok_or(SockDiagError::Truncated {
                    what: "INET_DIAG_CGROUP_ID",
                })?;
                socket.cgroup_id = Some(u64::from_ne_bytes(*id));
            }
            INET_DIAG_SK_BPF_STORAGES => parse_storages(value, &mut socket.storages)?,
            _ => {}
        }
    }
    Ok(socket)
}

/// The value of `INET_DIAG_SK_BPF_STORAGES`: one nested `SK_DIAG_BPF_STORAGE` per map.
fn parse_storages(value: &[u8], storages: &mut Vec<Storage>) -> Result<(), SockDiagError> {
    for storage in attributes(value) {
        let (kind, nested) = storage?;
        if kind != SK_DIAG_BPF_STORAGE {
            continue;
        }
        let (mut map_id, mut map_value) = (None, None);
        for attribute in attributes(nested) {
            match attribute? {
                (SK_DIAG_BPF_STORAGE_MAP_ID, id) => {
                    let id = id.first_chunk::<4>().ok_or(SockDiagError::Truncated {
                        what: "SK_DIAG_BPF_STORAGE_MAP_ID",
                    })?;
                    map_id = Some(u32::from_ne_bytes(*id));
                }
                (SK_DIAG_BPF_STORAGE_MAP_VALUE, bytes) => map_value = Some(bytes.to_vec()),
                // SK_DIAG_BPF_STORAGE_PAD (alignment filler) and anything newer.
                _ => {}
            }
        }
        match (map_id, map_value) {
            (Some(map_id), Some(value)) => storages.push(Storage { map_id, value }),
            _ => {
                return Err(SockDiagError::Truncated {
                    what: "SK_DIAG_BPF_STORAGE",
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, os::fd::AsFd as _};

    use super::*;

    /// A reply datagram, built from the sequence number of the last request sent.
    type Datagram = Box<dyn Fn(u32) -> Vec<u8>>;

    /// A transport that records requests and plays scripted datagrams.
    struct Script {
        sent: Vec<Vec<u8>>,
        replies: VecDeque<Datagram>,
        buf: Vec<u8>,
    }

    impl Script {
        fn new(replies: Vec<Datagram>) -> Self {
            Self {
                sent: Vec::new(),
                replies: replies.into(),
                buf: Vec::new(),
            }
        }

        /// The header of the `n`th request sent.
        fn header(&self, n: usize) -> libc::nlmsghdr {
            libc::nlmsghdr::read(&self.sent[n]).expect("a whole header")
        }
    }

    impl Transport for Script {
        fn send(&mut self, request: &[u8]) -> Result<(), SockDiagError> {
            self.sent.push(request.to_vec());
            Ok(())
        }

        fn recv(&mut self) -> Result<&[u8], SockDiagError> {
            let seq = self.header(self.sent.len() - 1).nlmsg_seq;
            let next = self
                .replies
                .pop_front()
                .expect("the code under test read past the scripted replies");
            self.buf = next(seq);
            Ok(&self.buf)
        }
    }

    fn pad4(bytes: &mut Vec<u8>) {
        bytes.resize(align4(bytes.len()), 0);
    }

    /// A netlink message.
    fn nlmsg(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let header = libc::nlmsghdr {
            nlmsg_len: (size_of::<libc::nlmsghdr>() + payload.len()) as u32,
            nlmsg_type: kind,
            nlmsg_flags: flags,
            nlmsg_seq: seq,
            nlmsg_pid: 0,
        };
        let mut message = header.as_bytes().to_vec();
        message.extend_from_slice(payload);
        pad4(&mut message);
        message
    }

    /// A netlink attribute (type may carry flag bits).
    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let header = libc::nlattr {
            nla_len: (size_of::<libc::nlattr>() + value.len()) as u16,
            nla_type: kind,
        };
        let mut attribute = header.as_bytes().to_vec();
        attribute.extend_from_slice(value);
        pad4(&mut attribute);
        attribute
    }

    /// An identity with the given addresses and cookie.
    fn sock_id(src: SocketAddr, dst: SocketAddr, cookie: u64) -> InetDiagSockId {
        fn bytes(ip: IpAddr) -> [u8; 16] {
            let mut out = [0; 16];
            match ip {
                IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => out = v6.octets(),
            }
            out
        }
        let mut id = InetDiagSockId {
            sport_be: src.port().to_be(),
            dport_be: dst.port().to_be(),
            src: bytes(src.ip()),
            dst: bytes(dst.ip()),
            if_index: 0,
            cookie: [0; 2],
        };
        id.set_cookie(cookie);
        id
    }

    /// A `SOCK_DIAG_BY_FAMILY` payload: `inet_diag_msg` and attributes.
    fn socket_payload(family: u8, id: InetDiagSockId, attrs: &[Vec<u8>]) -> Vec<u8> {
        let msg = InetDiagMsg {
            family,
            state: TCP_ESTABLISHED,
            id,
            uid: 1000,
            inode: 4242,
            ..InetDiagMsg::default()
        };
        let mut payload = msg.as_bytes().to_vec();
        for a in attrs {
            payload.extend_from_slice(a);
        }
        payload
    }

    /// A connected IPv4 UDP socket from 10.0.0.1:(1000 + n) to 10.96.0.10:53 with cookie n.
    fn udp4(n: u16) -> Vec<u8> {
        let id = sock_id(
            SocketAddr::from(([10, 0, 0, 1], 1000 + n)),
            SocketAddr::from(([10, 96, 0, 10], 53)),
            u64::from(n),
        );
        socket_payload(
            AF_INET,
            id,
            &[attr(INET_DIAG_CGROUP_ID, &7u64.to_ne_bytes())],
        )
    }

    fn sock_msg(seq: u32, payload: &[u8]) -> Vec<u8> {
        nlmsg(SOCK_DIAG_BY_FAMILY, 0x02, seq, payload)
    }

    fn done(seq: u32) -> Vec<u8> {
        nlmsg(NLMSG_DONE, 0x02, seq, &0i32.to_ne_bytes())
    }

    /// An `NLMSG_ERROR` payload: `-errno` (0 for an acknowledgement) and the request's header.
    fn error(seq: u32, errno: i32) -> Vec<u8> {
        let err = libc::nlmsgerr {
            error: -errno,
            msg: libc::nlmsghdr {
                nlmsg_len: 72,
                nlmsg_type: SOCK_DESTROY,
                nlmsg_flags: NLM_F_REQUEST | NLM_F_ACK,
                nlmsg_seq: seq,
                nlmsg_pid: 0,
            },
        };
        nlmsg(NLMSG_ERROR, 0, seq, err.as_bytes())
    }

    fn cookies(sockets: &[DiagSocket]) -> Vec<u64> {
        sockets.iter().map(|s| s.cookie).collect()
    }

    #[test]
    fn dump_request_layout() {
        let null1 = std::fs::File::open("/dev/null").unwrap();
        let null2 = std::fs::File::open("/dev/null").unwrap();
        let maps = [null1.as_fd(), null2.as_fd()];
        let request = InetDiagReqV2 {
            family: AF_INET6,
            protocol: IPPROTO_UDP,
            states: state_bit(TCP_ESTABLISHED),
            ..InetDiagReqV2::default()
        };
        let bytes = encode_request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            77,
            &request,
            &maps,
        )
        .unwrap();
        let header = libc::nlmsghdr::read(&bytes).unwrap();
        assert_eq!(header.nlmsg_len as usize, bytes.len());
        assert_eq!(bytes.len(), 16 + 56 + 4 + 2 * 8);
        assert_eq!(
            (
                header.nlmsg_type,
                header.nlmsg_flags,
                header.nlmsg_seq,
                header.nlmsg_pid
            ),
            (20, 0x301, 77, 0)
        );
        let body = InetDiagReqV2::read(&bytes[16..]).unwrap();
        assert_eq!(body, request);
        assert_eq!(body.states, 0b10);
        let nest = libc::nlattr::read(&bytes[72..]).unwrap();
        assert_eq!(nest.nla_len, 4 + 16);
        assert_eq!(
            nest.nla_type,
            2 | 0x8000,
            "INET_DIAG_REQ_SK_BPF_STORAGES, nested"
        );
        let fds: Vec<(u16, u32)> = attributes(&bytes[76..])
            .map(|a| {
                let (kind, value) = a.unwrap();
                (kind, u32::from_ne_bytes(*value.first_chunk().unwrap()))
            })
            .collect();
        assert_eq!(
            fds,
            [
                (1, null1.as_raw_fd().cast_unsigned()),
                (1, null2.as_raw_fd().cast_unsigned())
            ]
        );
        // Without maps: no attribute at all.
        let plain = encode_request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            &request,
            &[],
        )
        .unwrap();
        assert_eq!(plain.len(), 72);
    }

    #[test]
    fn multi_part_dump_over_several_datagrams() {
        let mut script = Script::new(vec![
            Box::new(|seq| [sock_msg(seq, &udp4(1)), sock_msg(seq, &udp4(2))].concat()),
            // A late part of some earlier request is skipped.
            Box::new(|seq| [sock_msg(seq - 1, &udp4(99)), sock_msg(seq, &udp4(3))].concat()),
            Box::new(|seq| {
                [
                    nlmsg(NLMSG_NOOP, 0, seq, &[]),
                    sock_msg(seq, &udp4(4)),
                    done(seq),
                ]
                .concat()
            }),
        ]);
        let sockets = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap();
        assert_eq!(cookies(&sockets), [1, 2, 3, 4]);
        assert!(script.replies.is_empty());
        assert_eq!(script.sent.len(), 1);
        let s = &sockets[0];
        assert_eq!(
            (s.family, s.protocol, s.state),
            (AF_INET, IPPROTO_UDP, TCP_ESTABLISHED)
        );
        assert_eq!((s.uid, s.inode, s.cgroup_id), (1000, 4242, Some(7)));
        assert_eq!(s.src(), "10.0.0.1:1001".parse().unwrap());
        assert_eq!(s.dst(), "10.96.0.10:53".parse().unwrap());
        assert!(s.storages.is_empty());
    }

    #[test]
    fn both_tcp_families_in_one_older_request_else_one_v2_dump_per_family() {
        // The kernel answers the older request: one request, its replies of its own type.
        let mut script = Script::new(vec![Box::new(|seq| {
            [nlmsg(TCPDIAG_GETSOCK, 0x02, seq, &udp4(1)), done(seq)].concat()
        })]);
        let sockets =
            dump_with(&mut script, IPPROTO_TCP, BOTH_FAMILIES, RECORD_STATES, &[]).unwrap();
        assert_eq!(cookies(&sockets), [1]);
        assert_eq!(script.sent.len(), 1);
        assert_eq!(script.header(0).nlmsg_type, 18, "TCPDIAG_GETSOCK");
        let body = InetDiagReq::read(&script.sent[0][16..]).unwrap();
        assert_eq!((body.family, body.states), (0, RECORD_STATES));
        assert_eq!(script.sent[0].len(), 16 + 60);

        // A kernel that refuses it: a v2 dump per family, what came before forgotten.
        let mut script = Script::new(vec![
            Box::new(|seq| error(seq, libc::EINVAL)),
            Box::new(|seq| [sock_msg(seq, &udp4(2)), done(seq)].concat()),
            Box::new(|seq| [sock_msg(seq, &udp4(3)), done(seq)].concat()),
        ]);
        let sockets =
            dump_with(&mut script, IPPROTO_TCP, BOTH_FAMILIES, RECORD_STATES, &[]).unwrap();
        assert_eq!(cookies(&sockets), [2, 3]);
        let sent: Vec<(u16, u8, u8)> = (0..3)
            .map(|n| {
                let body = InetDiagReqV2::read(&script.sent[n][16..]).unwrap();
                (script.header(n).nlmsg_type, body.family, body.protocol)
            })
            .collect();
        assert_eq!(
            sent[1..],
            [(20, AF_INET, IPPROTO_TCP), (20, AF_INET6, IPPROTO_TCP)]
        );
        assert_eq!(sent[0].0, 18);

        // Any other error is the dump's.
        let mut script = Script::new(vec![Box::new(|seq| error(seq, libc::EPERM))]);
        let err = dump_with(&mut script, IPPROTO_TCP, BOTH_FAMILIES, RECORD_STATES, &[]);
        assert!(matches!(err, Err(SockDiagError::Netlink { errno, .. }) if errno == libc::EPERM));
        assert_eq!(script.sent.len(), 1);
    }

    #[test]
    fn every_request_gets_a_fresh_sequence_number() {
        let mut script = Script::new(vec![
            Box::new(done),
            Box::new(|seq| error(seq, 0)),
            Box::new(done),
        ]);
        dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap();
        let socket = parse_socket(&udp4(1), IPPROTO_UDP).unwrap();
        destroy_with(&mut script, &socket).unwrap();
        dump_with(&mut script, IPPROTO_UDP, AF_INET6, ALL_STATES, &[]).unwrap();
        let seqs: Vec<u32> = (0..3).map(|n| script.header(n).nlmsg_seq).collect();
        assert!(
            seqs[0] != seqs[1] && seqs[1] != seqs[2] && seqs[0] != seqs[2],
            "{seqs:?}"
        );
    }

    #[test]
    fn attributes_cgroup_and_nested_storages() {
        let value_a = [0xaa; 48];
        let value_b = [1, 2, 3, 4, 5];
        let storages = [
            attr(
                SK_DIAG_BPF_STORAGE | NLA_F_NESTED,
                &[
                    attr(SK_DIAG_BPF_STORAGE_MAP_ID, &17u32.to_ne_bytes()),
                    // The alignment filler some architectures put before 64-bit values.
                    attr(1, &[]),
                    attr(SK_DIAG_BPF_STORAGE_MAP_VALUE, &value_a),
                ]
                .concat(),
            ),
            attr(
                SK_DIAG_BPF_STORAGE | NLA_F_NESTED,
                &[
                    attr(SK_DIAG_BPF_STORAGE_MAP_VALUE, &value_b),
                    attr(SK_DIAG_BPF_STORAGE_MAP_ID, &18u32.to_ne_bytes()),
                ]
                .concat(),
            ),
        ]
        .concat();
        let id = sock_id(
            "[fd00::1]:40000".parse().unwrap(),
            "[::ffff:10.96.0.10]:53".parse().unwrap(),
            0x1234_5678_9abc_def0,
        );
        let payload = socket_payload(
            AF_INET6,
            id,
            &[
                attr(8, &[0]),     // INET_DIAG_SHUTDOWN
                attr(22, &[0, 0]), // INET_DIAG_SOCKOPT
                attr(INET_DIAG_CGROUP_ID, &0x0102_0304_0506_0708u64.to_ne_bytes()),
                attr(INET_DIAG_SK_BPF_STORAGES | NLA_F_NESTED, &storages),
            ],
        );
        let s = parse_socket(&payload, IPPROTO_UDP).unwrap();
        assert_eq!(s.cookie, 0x1234_5678_9abc_def0);
        assert_eq!(s.id.cookie, [0x9abc_def0, 0x1234_5678], "low word first");
        assert_eq!(s.cgroup_id, Some(0x0102_0304_0506_0708));
        assert_eq!(
            s.storages,
            [
                Storage {
                    map_id: 17,
                    value: value_a.to_vec()
                },
                Storage {
                    map_id: 18,
                    value: value_b.to_vec()
                },
            ]
        );
        assert_eq!(s.storage(18), Some(&value_b[..]));
        assert_eq!(s.storage(19), None);
        assert_eq!(s.src(), "[fd00::1]:40000".parse().unwrap());
        assert_eq!(
            s.dst(),
            "10.96.0.10:53".parse().unwrap(),
            "IPv4-mapped reported as IPv4"
        );
    }

    #[test]
    fn without_cgroup_attribute() {
        let id = sock_id(
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:2".parse().unwrap(),
            5,
        );
        let s = parse_socket(&socket_payload(AF_INET, id, &[]), IPPROTO_UDP).unwrap();
        assert_eq!(s.cgroup_id, None);
    }

    #[test]
    fn netlink_errors_are_mapped() {
        let mut script = Script::new(vec![Box::new(|seq| error(seq, libc::EPERM))]);
        let err = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap_err();
        assert!(
            matches!(
                err,
                SockDiagError::Netlink {
                    op: "dump",
                    errno: libc::EPERM
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.errno(), Some(libc::EPERM));
        assert!(err.to_string().contains("Operation not permitted"), "{err}");

        // A dump that fails half way reports the status in NLMSG_DONE.
        let mut script = Script::new(vec![Box::new(|seq| {
            [
                sock_msg(seq, &udp4(1)),
                nlmsg(NLMSG_DONE, 2, seq, &(-libc::ENOBUFS).to_ne_bytes()),
            ]
            .concat()
        })]);
        let err = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENOBUFS));
    }

    #[test]
    fn destroy_outcomes() {
        let socket = parse_socket(&udp4(3), IPPROTO_UDP).unwrap();
        let outcome = |reply: Datagram| destroy_with(&mut Script::new(vec![reply]), &socket);
        assert!(
            outcome(Box::new(|seq| error(seq, 0))).unwrap(),
            "acknowledged"
        );
        assert!(
            !outcome(Box::new(|seq| error(seq, libc::ENOENT))).unwrap(),
            "already gone"
        );
        let err = outcome(Box::new(|seq| error(seq, libc::EOPNOTSUPP))).unwrap_err();
        assert!(
            matches!(
                err,
                SockDiagError::Netlink {
                    op: "destroy",
                    errno: libc::EOPNOTSUPP
                }
            ),
            "{err:?}"
        );
        // A stale acknowledgement of an earlier request is not this one's.
        assert!(
            !outcome(Box::new(|seq| [
                error(seq - 1, 0),
                error(seq, libc::ENOENT)
            ]
            .concat()))
            .unwrap()
        );
    }

    #[test]
    fn destroy_request_layout() {
        let mut socket = parse_socket(&udp4(3), IPPROTO_UDP).unwrap();
        socket.cookie = 0xdead_beef_0000_0001;
        let mut script = Script::new(vec![Box::new(|seq| error(seq, 0))]);
        destroy_with(&mut script, &socket).unwrap();
        let bytes = &script.sent[0];
        let header = libc::nlmsghdr::read(bytes).unwrap();
        assert_eq!(
            (header.nlmsg_len, header.nlmsg_type, header.nlmsg_flags),
            (72, 21, 0x05)
        );
        let body = InetDiagReqV2::read(&bytes[16..]).unwrap();
        assert_eq!((body.family, body.protocol), (AF_INET, IPPROTO_UDP));
        assert_eq!(
            body.id.cookie,
            [1, 0xdead_beef],
            "the socket's cookie field is sent"
        );
        assert_eq!((body.id.src, body.id.dst), (socket.id.src, socket.id.dst));
        assert_eq!(
            (body.id.sport_be, body.id.dport_be),
            (1003u16.to_be(), 53u16.to_be())
        );
    }

    #[test]
    fn interrupted_dump_is_restarted() {
        let mut script = Script::new(vec![
            Box::new(|seq| [nlmsg(SOCK_DIAG_BY_FAMILY, 0x12, seq, &udp4(1)), done(seq)].concat()),
            Box::new(|seq| [sock_msg(seq, &udp4(2)), done(seq)].concat()),
        ]);
        let sockets = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap();
        assert_eq!(cookies(&sockets), [2], "only the complete second dump");
        assert_eq!(script.sent.len(), 2);
        assert_ne!(script.header(0).nlmsg_seq, script.header(1).nlmsg_seq);

        let always = (0..DUMP_ATTEMPTS)
            .map(|_| -> Datagram {
                Box::new(|seq| nlmsg(NLMSG_DONE, 0x12, seq, &0i32.to_ne_bytes()))
            })
            .collect();
        let err = dump_with(
            &mut Script::new(always),
            IPPROTO_UDP,
            AF_INET,
            ALL_STATES,
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(err, SockDiagError::DumpInterrupted { attempts: 3 }),
            "{err:?}"
        );
    }

    #[test]
    fn truncated_replies_are_rejected() {
        /// What should be reported as truncated, and a datagram that is.
        type Case = (&'static str, fn(u32) -> Vec<u8>);

        let short_msg = |seq| sock_msg(seq, &udp4(1)[..40]);
        let header_overruns = |seq| {
            let mut m = sock_msg(seq, &udp4(1));
            m[..4].copy_from_slice(&1000u32.to_ne_bytes());
            m
        };
        let partial_header = |seq| [sock_msg(seq, &udp4(1)), vec![0; 8]].concat();
        let attr_overruns = |seq| {
            let mut payload = udp4(1);
            payload[72..74].copy_from_slice(&200u16.to_ne_bytes());
            sock_msg(seq, &payload)
        };
        let short_cgroup = |seq| {
            let id = sock_id(
                "10.0.0.1:1".parse().unwrap(),
                "10.0.0.2:2".parse().unwrap(),
                5,
            );
            sock_msg(
                seq,
                &socket_payload(AF_INET, id, &[attr(INET_DIAG_CGROUP_ID, &[1, 2, 3, 4])]),
            )
        };
        let storage_without_value = |seq| {
            let id = sock_id(
                "10.0.0.1:1".parse().unwrap(),
                "10.0.0.2:2".parse().unwrap(),
                5,
            );
            let storage = attr(
                INET_DIAG_SK_BPF_STORAGES | NLA_F_NESTED,
                &attr(
                    SK_DIAG_BPF_STORAGE | NLA_F_NESTED,
                    &attr(SK_DIAG_BPF_STORAGE_MAP_ID, &1u32.to_ne_bytes()),
                ),
            );
            sock_msg(seq, &socket_payload(AF_INET, id, &[storage]))
        };
        let short_error = |seq| nlmsg(NLMSG_ERROR, 0, seq, &(-1i32).to_ne_bytes());
        let cases: [Case; 7] = [
            ("inet_diag_msg", short_msg),
            ("netlink message", header_overruns),
            ("nlmsghdr", partial_header),
            ("netlink attribute", attr_overruns),
            ("INET_DIAG_CGROUP_ID", short_cgroup),
            ("SK_DIAG_BPF_STORAGE", storage_without_value),
            ("nlmsgerr", short_error),
        ];
        for (expected, datagram) in cases {
            let mut script = Script::new(vec![Box::new(datagram)]);
            let err = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap_err();
            assert!(
                matches!(err, SockDiagError::Truncated { what } if what == expected),
                "{expected}: {err:?}"
            );
        }
    }

    #[test]
    fn endless_stale_replies_are_an_error() {
        let mut script = Script::new(vec![Box::new(|seq| {
            (0..=MAX_STALE_MESSAGES)
                .flat_map(|_| done(seq.wrapping_add(1000)))
                .collect()
        })]);
        let err = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap_err();
        assert!(matches!(err, SockDiagError::Sequence { .. }), "{err:?}");
    }

    #[test]
    fn unexpected_messages() {
        let mut script = Script::new(vec![Box::new(|seq| nlmsg(99, 0, seq, &[]))]);
        let err = dump_with(&mut script, IPPROTO_UDP, AF_INET, ALL_STATES, &[]).unwrap_err();
        assert!(matches!(
            err,
            SockDiagError::UnexpectedMessage {
                op: "dump",
                kind: 99
            }
        ));
        let socket = parse_socket(&udp4(3), IPPROTO_UDP).unwrap();
        let err = destroy_with(&mut Script::new(vec![Box::new(done)]), &socket).unwrap_err();
        assert!(matches!(
            err,
            SockDiagError::UnexpectedMessage {
                op: "destroy",
                kind: 3
            }
        ));
    }

    #[test]
    fn addresses() {
        let s = |family, src: &str, dst: &str| DiagSocket {
            family,
            protocol: IPPROTO_UDP,
            state: TCP_ESTABLISHED,
            id: sock_id(src.parse().unwrap(), dst.parse().unwrap(), 1),
            cookie: 1,
            uid: 0,
            inode: 0,
            cgroup_id: None,
            storages: Vec::new(),
        };
        let v4 = s(AF_INET, "10.0.0.1:5", "10.0.0.2:6");
        assert_eq!(
            (v4.src(), v4.dst()),
            ("10.0.0.1:5".parse().unwrap(), "10.0.0.2:6".parse().unwrap())
        );
        let v6 = s(AF_INET6, "[fd00::1]:5", "[fd00::2]:6");
        assert_eq!(v6.dst(), "[fd00::2]:6".parse().unwrap());
        let mapped = s(AF_INET6, "[::ffff:10.0.0.1]:5", "[::ffff:10.0.0.2]:6");
        assert_eq!(
            (mapped.src(), mapped.dst()),
            ("10.0.0.1:5".parse().unwrap(), "10.0.0.2:6".parse().unwrap())
        );
        let unconnected = s(AF_INET6, "[::]:5", "[::]:0");
        assert_eq!(unconnected.dst(), "[::]:0".parse().unwrap());
        assert_eq!(state_bit(TCP_ESTABLISHED) | state_bit(TCP_CLOSE), 0x82);
        assert_eq!(state_bit(40), 0);
    }

    /// Tests against the running kernel, each in a network namespace of its own that lives
    /// exactly as long as the test's thread: nothing to clean up, even when a test fails.
    mod kernel {
        use std::{
            io::ErrorKind,
            net::UdpSocket,
            os::{fd::AsRawFd, unix::fs::MetadataExt as _},
            path::PathBuf,
        };

        use super::super::*;

        /// Runs `f` on a new thread inside a new network namespace with `lo` up, or returns `None`
        /// (and says so) when not running as root.
        pub(super) fn in_new_netns<T: Send + 'static>(
            f: impl FnOnce() -> T + Send + 'static,
        ) -> Option<T> {
            if !rustix::process::geteuid().is_root() {
                eprintln!("skipped: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF)");
                return None;
            }
            let thread = std::thread::spawn(move || {
                // SAFETY: only the network namespace is unshared, and only for this thread; the
                // file descriptor table stays shared, so no fd is hidden from other threads.
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
                    .expect("unshare(CLONE_NEWNET)");
                loopback_up();
                f()
            });
            Some(
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            )
        }

        /// Brings `lo` up in the current network namespace (`SIOCSIFFLAGS`; rustix has no call
        /// for interface flags).
        fn loopback_up() {
            let sock = rustix::net::socket(AddressFamily::INET, SocketType::DGRAM, None).unwrap();
            // SAFETY: ifreq is plain C data for which all-zero bytes are a valid value.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (dst, src) in req.ifr_name.iter_mut().zip(b"lo") {
                *dst = libc::c_char::from_ne_bytes([*src]);
            }
            // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_flags of the ifreq we own, on a
            // socket we own.
            let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &raw mut req) };
            assert_eq!(rc, 0, "SIOCGIFFLAGS lo: {}", io::Error::last_os_error());
            // SAFETY: SIOCGIFFLAGS just filled the flags member of the union.
            unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
            // SAFETY: SIOCSIFFLAGS reads ifr_name and ifr_flags of the ifreq we own.
            let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &raw const req) };
            assert_eq!(rc, 0, "SIOCSIFFLAGS lo: {}", io::Error::last_os_error());
        }

        /// A UDP socket bound to `local` and connected to `peer`, with a receive timeout.
        pub(super) fn connected(local: &str, peer: SocketAddr) -> UdpSocket {
            let socket = UdpSocket::bind(local).unwrap();
            socket.connect(peer).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            socket
        }

        pub(super) fn server(local: &str) -> UdpSocket {
            let socket = UdpSocket::bind(local).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            socket
        }

        pub(super) fn cookie(socket: &impl std::os::fd::AsFd) -> u64 {
            sockopt::socket_cookie(socket).unwrap()
        }

        pub(super) fn find(sockets: &[DiagSocket], cookie: u64) -> &DiagSocket {
            sockets
                .iter()
                .find(|s| s.cookie == cookie)
                .unwrap_or_else(|| panic!("no socket with cookie {cookie} in {sockets:#?}"))
        }

        /// Sends a ping from `client` and has `server` answer it: the socket still works.
        pub(super) fn round_trip(client: &UdpSocket, server: &UdpSocket) {
            client.send(b"ping").unwrap();
            let mut buf = [0; 16];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"ping");
            server.send_to(b"pong", from).unwrap();
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"pong");
        }

        /// `recv` on a destroyed socket fails with `ECONNABORTED`.
        pub(super) fn assert_aborted(client: &UdpSocket) {
            let err = client.recv(&mut [0; 16]).unwrap_err();
            assert_ne!(err.kind(), ErrorKind::WouldBlock, "recv timed out instead");
            assert_eq!(err.raw_os_error(), Some(libc::ECONNABORTED), "{err}");
        }

        /// The cgroup v2 id of the calling thread's cgroup (the inode of its directory), when a
        /// cgroup2 file system is mounted.
        pub(super) fn own_cgroup_id() -> Option<u64> {
            let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
            let mount = mounts
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.get(2) == Some(&"cgroup2"))?[1]
                .to_owned();
            let cgroups = std::fs::read_to_string("/proc/thread-self/cgroup").ok()?;
            let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
            let dir = PathBuf::from(mount).join(path.trim_start_matches('/'));
            Some(std::fs::metadata(dir).ok()?.ino())
        }

        /// socklb's own `SOCKETS` map (a `BPF_MAP_TYPE_SK_STORAGE`), from the embedded eBPF
        /// object on throwaway maps, written through aya.
        pub(super) struct SkStorageMap {
            pub fd: OwnedFd,
            pub id: u32,
        }

        impl SkStorageMap {
            pub(super) fn create() -> io::Result<Self> {
                use std::os::fd::AsFd as _;
                let mut ebpf =
                    crate::dataplane::loader::throwaway_object().map_err(io::Error::other)?;
                let Some(aya::maps::Map::SkStorage(data)) =
                    ebpf.take_map(lb_common::MapId::Sockets.name())
                else {
                    return Err(io::Error::other("no SOCKETS socket-storage map"));
                };
                let fd = data.fd().as_fd().try_clone_to_owned()?;
                let id = data.info().map_err(io::Error::other)?.id();
                Ok(Self { fd, id })
            }

            /// Gives `socket` the value `value` in this map (through aya, on a descriptor of
            /// its own).
            pub(super) fn set(
                &self,
                socket: &impl AsRawFd,
                value: &lb_common::SockState,
            ) -> io::Result<()> {
                let data =
                    aya::maps::MapData::from_fd(self.fd.try_clone()?).map_err(io::Error::other)?;
                let mut map: aya::maps::SkStorage<_, lb_common::SockState> =
                    aya::maps::Map::SkStorage(data)
                        .try_into()
                        .map_err(io::Error::other)?;
                map.insert(socket, *value, 0).map_err(io::Error::other)
            }
        }

        /// A recognisable value: each record's slot is its index plus one.
        pub(super) fn sample_state() -> lb_common::SockState {
            let mut state = lb_common::SockState {
                cgroup_id: 42,
                created_ns: 7,
                ..lb_common::SockState::default()
            };
            for (i, r) in state.records.iter_mut().enumerate() {
                r.slot = i as u32 + 1;
            }
            state
        }

        /// A value's bytes, as the kernel reports it.
        pub(super) fn bytes_of(state: &lb_common::SockState) -> Vec<u8> {
            // SAFETY: SockState is plain old data without padding (asserted in lb-common).
            unsafe {
                std::slice::from_raw_parts(
                    std::ptr::from_ref(state).cast::<u8>(),
                    size_of::<lb_common::SockState>(),
                )
            }
            .to_vec()
        }
    }

    #[test]
    fn kernel_dump_and_destroy() {
        kernel::in_new_netns(|| {
            use kernel::{assert_aborted, connected, cookie, find, round_trip, server};
            let server4 = server("127.0.0.1:0");
            let server6 = server("[::1]:0");
            let server_mapped = server("127.0.0.1:0");
            let c4 = connected("127.0.0.1:0", server4.local_addr().unwrap());
            let c6 = connected("[::1]:0", server6.local_addr().unwrap());
            // A dual-stack AF_INET6 socket talking IPv4.
            let mapped_peer = SocketAddr::new(
                IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()),
                server_mapped.local_addr().unwrap().port(),
            );
            let c_mapped = connected("[::]:0", mapped_peer);

            let connected_only = state_bit(TCP_ESTABLISHED);
            let v4 = dump(IPPROTO_UDP, AF_INET, connected_only, &[]).unwrap();
            let v6 = dump(IPPROTO_UDP, AF_INET6, connected_only, &[]).unwrap();
            assert_eq!(v4.len(), 1, "only c4 is connected IPv4: {v4:#?}");
            assert_eq!(v6.len(), 2, "c6 and c_mapped: {v6:#?}");
            let d4 = find(&v4, cookie(&c4));
            let d6 = find(&v6, cookie(&c6));
            let d_mapped = find(&v6, cookie(&c_mapped));
            assert_eq!(
                (d4.family, d4.protocol, d4.state),
                (AF_INET, IPPROTO_UDP, TCP_ESTABLISHED)
            );
            assert_eq!(d4.src(), c4.local_addr().unwrap());
            assert_eq!(d4.dst(), server4.local_addr().unwrap());
            assert_eq!(d6.src(), c6.local_addr().unwrap());
            assert_eq!(d6.dst(), server6.local_addr().unwrap());
            assert_eq!(d_mapped.family, AF_INET6);
            assert_eq!(
                d_mapped.dst(),
                server_mapped.local_addr().unwrap(),
                "reported as IPv4"
            );
            assert_eq!(d_mapped.src().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
            assert!(d4.cgroup_id.is_some(), "INET_DIAG_CGROUP_ID without asking");
            if let Some(own) = kernel::own_cgroup_id() {
                assert_eq!(d4.cgroup_id, Some(own), "the creating thread's cgroup");
            }
            assert!(d4.inode != 0 && d4.storages.is_empty());

            // Unconnected sockets (the servers) are TCP_CLOSE.
            let unconnected = dump(IPPROTO_UDP, AF_INET, state_bit(TCP_CLOSE), &[]).unwrap();
            assert_eq!(unconnected.len(), 2, "{unconnected:#?}");
            find(&unconnected, cookie(&server4));

            // A wrong cookie matches nothing, even though the addresses do.
            let mut wrong = d6.clone();
            wrong.cookie ^= 1;
            assert!(
                !destroy(&wrong).unwrap(),
                "a wrong cookie must not destroy c6"
            );

            assert!(destroy(d4).unwrap());
            assert!(destroy(d_mapped).unwrap());
            assert_aborted(&c4);
            assert_aborted(&c_mapped);
            round_trip(&c6, &server6);

            // Destroyed sockets are disconnected; a closed one is gone.
            let after = dump(IPPROTO_UDP, AF_INET6, connected_only, &[]).unwrap();
            assert_eq!(cookies(&after), [cookie(&c6)]);
            assert!(
                dump(IPPROTO_UDP, AF_INET, connected_only, &[])
                    .unwrap()
                    .is_empty()
            );
            let d6 = d6.clone();
            drop(c6);
            assert!(
                !destroy(&d6).unwrap(),
                "closed: ENOENT, reported as already gone"
            );
        });
    }

    #[test]
    fn kernel_dump_with_bpf_storage() {
        kernel::in_new_netns(|| {
            use std::net::{TcpListener, TcpStream};

            use kernel::{SkStorageMap, bytes_of, connected, cookie, find, sample_state, server};
            let map = SkStorageMap::create().expect("a BPF_MAP_TYPE_SK_STORAGE map");
            let empty_map = SkStorageMap::create().unwrap();
            let value = sample_state();
            let maps = [map.fd.as_fd(), empty_map.fd.as_fd()];
            let established = state_bit(TCP_ESTABLISHED);

            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let with = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let without = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            map.set(&with, &value).unwrap();
            let tcp = dump(IPPROTO_TCP, AF_INET, established, &maps).unwrap();
            assert_eq!(
                find(&tcp, cookie(&with)).storages,
                [Storage {
                    map_id: map.id,
                    value: bytes_of(&value)
                }]
            );
            assert!(find(&tcp, cookie(&without)).storages.is_empty());
            // Not asked for, not reported.
            let plain = dump(IPPROTO_TCP, AF_INET, established, &[]).unwrap();
            assert!(find(&plain, cookie(&with)).storages.is_empty());

            // UDP sockets take the same request, but the kernel (inet_sk_diag_fill() returns
            // early for sockets without an inet_connection_sock) never reports their storage:
            // no assertion on that here, it is the kernel's to change.
            let server = server("127.0.0.1:0");
            let udp = connected("127.0.0.1:0", server.local_addr().unwrap());
            map.set(&udp, &value).unwrap();
            let udps = dump(IPPROTO_UDP, AF_INET, established, &maps).unwrap();
            find(&udps, cookie(&udp));

            // The kernel checks the fds: not a map, or the same map twice.
            let err = dump(IPPROTO_TCP, AF_INET, established, &[udp.as_fd()]).unwrap_err();
            assert_eq!(err.errno(), Some(libc::EINVAL), "{err:?}");
            let twice = [map.fd.as_fd(), map.fd.as_fd()];
            let err = dump(IPPROTO_TCP, AF_INET, established, &twice).unwrap_err();
            assert_eq!(err.errno(), Some(libc::EEXIST), "{err:?}");
        });
    }

    #[test]
    fn one_tcp_dump_lists_both_families() {
        kernel::in_new_netns(|| {
            let mut held = Vec::new();
            let mut cookies = Vec::new();
            for local in ["127.0.0.1:0", "[::1]:0"] {
                let listener = std::net::TcpListener::bind(local).unwrap();
                let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                let (accepted, _) = listener.accept().unwrap();
                cookies.push((kernel::cookie(&client), local.starts_with('[')));
                cookies.push((kernel::cookie(&accepted), local.starts_with('[')));
                held.push((listener, client, accepted));
            }
            let established = state_bit(TCP_ESTABLISHED);
            let both = dump(IPPROTO_TCP, BOTH_FAMILIES, established, &[]).unwrap();
            assert_eq!(both.len(), 4, "{both:?}");
            for (cookie, v6) in cookies {
                let socket = kernel::find(&both, cookie);
                assert_eq!(socket.family, if v6 { AF_INET6 } else { AF_INET });
                assert_eq!(socket.protocol, IPPROTO_TCP);
            }
            let v4 = dump(IPPROTO_TCP, AF_INET, established, &[]).unwrap();
            let v6 = dump(IPPROTO_TCP, AF_INET6, established, &[]).unwrap();
            assert_eq!((v4.len(), v6.len()), (2, 2));
            drop(held);
        });
    }

    #[test]
    fn kernel_dump_spans_many_datagrams() {
        /// Counts the datagrams the real socket delivers.
        struct Counting(Netlink, usize);
        impl Transport for Counting {
            fn send(&mut self, request: &[u8]) -> Result<(), SockDiagError> {
                self.0.send(request)
            }
            fn recv(&mut self) -> Result<&[u8], SockDiagError> {
                self.1 += 1;
                self.0.recv()
            }
        }

        kernel::in_new_netns(|| {
            let server = kernel::server("127.0.0.1:0");
            let peer = server.local_addr().unwrap();
            let clients: Vec<_> = (0..400)
                .map(|_| kernel::connected("127.0.0.1:0", peer))
                .collect();
            let mut counting = Counting(Netlink::open().unwrap(), 0);
            let established = state_bit(TCP_ESTABLISHED);
            let sockets = dump_with(&mut counting, IPPROTO_UDP, AF_INET, established, &[]).unwrap();
            assert_eq!(sockets.len(), clients.len());
            for client in &clients {
                kernel::find(&sockets, kernel::cookie(client));
            }
            assert!(
                counting.1 > 1,
                "400 sockets took {} datagram(s)",
                counting.1
            );
            eprintln!("400 sockets in {} datagrams", counting.1);
        });
    }
}
