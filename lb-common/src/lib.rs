//! The map ABI shared by socklb's eBPF programs (`lb-ebpf`) and its agent (`lb-userspace`): the
//! map types, the one table that describes every map, the counters and the program names.
//!
//! Every type here is `#[repr(C)]`, has no implicit padding (padding is spelled out as `_pad`
//! fields that are always zero), and holds no `bool`/`Option`: the verifier and the map syscalls
//! see raw bytes, and a hash map key with garbage padding would never be found. Sizes and field
//! offsets are asserted at compile time.
//!
//! Addresses and ports are kept in network byte order, exactly as `struct bpf_sock_addr` hands them
//! to the programs, so the hot path never swaps bytes. An IPv4 address lives in `addr[0]` with the
//! other three words zero.
//!
//! What is here:
//! - `MAPS`, one `MapDescriptor` per map: name, kind, key and value types and sizes, default
//!   capacity, the agent flag that resizes it, preallocation, whether it is per socket, a line of
//!   help. Maps are described once, here: the loader (pin paths, sizes, the layout digest, the
//!   check of pinned layouts), `inspect stats`, the metrics and the agent's capacity flags all
//!   iterate `MapId::ALL`, and the programs' map statics carry the same names and take their sizes
//!   from the table. A test in the agent reads the built eBPF object and requires exactly these
//!   maps with their kinds, key and value sizes, default sizes and allocation (and only
//!   `CONNECTIONS`, `FRONTEND_INDEX`, `FRONTEND_INDEX6` and `SLOTS_HELD` mmapable), and one requires every
//!   `capacity_flag` to be a flag that sizes them.
//! - `Counter`, with the names and help texts the metrics and `inspect stats` show.
//! - `program::ALL` (the eight cgroup programs), `program::RELEASE` and the iterator programs'
//!   names.
//! - `ports`: the layout of the `PORTS` array (the frontend port bitmap, the frontend filter and
//!   its hash `frontend_bit`, shared by the programs and the agent, the backend port bitmap).
//! - The per-socket records: `SockState` (the pod charged, the creation time, up to
//!   `SOCK_DESTINATIONS` destinations) in socket storage, and `ConnRecord`, a `CONNECTIONS` slot
//!   holding one TCP connection or connected UDP socket by socket cookie (`cookie` 0 when free),
//!   and `SlotsHeld`, a byte per slot that says whether a socket may hold it. A TCP connection's
//!   `cgroup_id` is the connecting process's own cgroup, not its pod's (no pod lookup on the
//!   connect path; the connections view shows it as its pod); a UDP socket's is its pod, the one
//!   charged.
//! - The iterators' entries: `SocketEntry`, and `UdpSocketEntry` with `SockAddrs` (the socket's
//!   IPv4 addresses, and whether it holds storage, a slot or both).
//! - The affinity table: `AFFINITY_WAYS` entries per client, in buckets of `AFFINITY_BUCKET`.
//! - The frontend indexes (`index`, `IndexEntry`, `IndexEntry6`): the slot and the check of an
//!   IPv4 frontend's copy in `FRONTEND_INDEX` and an IPv6 one's in `FRONTEND_INDEX6`, keyed with
//!   a secret; `holds` is the one rule by which the programs use an entry and `explain` says so.
//! - `proof`: the cookie proof's marker instructions, which the agent rewrites.
//! - `DatapathConfig`, the `CONFIG` value: the per-pod bound, the pods' cgroup level `pod_level`,
//!   the kubelet's quality-of-service `tiers` skipped to find a pod, the frontend index's secret,
//!   and `flags` (`CONFIG_CONNECTION_SLOTS`).
//! - The decision stream: `MonitorState` (the `MONITOR` value, `until_ns`), `Event` with its
//!   `event::*` kinds and `HOOK_*`, and `EVENTS_BYTES`.
//!
//! Also asserted at compile time: `MAPS` and `Counter::ALL` are indexed by their enums; the
//! kernel's element for a socket's value (72 bytes of header plus `SockState`) stays in its
//! 256-byte slab; `CONNECTION_SLOTS` and `EVENTS_BYTES` are powers of two; a client's affinity
//! table has at least two buckets.
#![no_std]
#![allow(
    clippy::pub_underscore_fields,
    reason = "explicit `_pad` fields are public so both sides can build the types literally"
)]

use core::mem::{offset_of, size_of};

pub const FAMILY_IPV4: u8 = 4;
pub const FAMILY_IPV6: u8 = 6;
pub const PROTOCOL_TCP: u8 = 6;
pub const PROTOCOL_UDP: u8 = 17;
/// `IPPROTO_MPTCP`: a multipath TCP socket, a TCP connection to its application. Past a byte:
/// the hooks read the socket's protocol whole, or 262 would read as TCP by accident.
pub const PROTOCOL_MPTCP: u32 = 262;

/// The socket-cookie proof (`cookie-proof`): how the programs tell, with loads and no helper,
/// that a socket has nothing of socklb's. Every socket socklb gives a slot or a record has had
/// its cookie made first; a socket whose cookie field in `struct sock_common` is still 0 has
/// neither, so its close, getpeername and recvmsg return at once. The programs reach the
/// kernel's socket through the kfunc `bpf_cast_to_kern_ctx` (6.2+), which aya cannot name from
/// Rust, at offsets only the running kernel's BTF knows: the object carries the instruction
/// sequences [`RELEASE`](proof::RELEASE) and [`ADDR`](proof::ADDR) of markers, and the agent
/// rewrites each before the object is parsed, into the call and loads for this kernel
/// ([`written`](proof::written)), or into `r0 = 1` and no-ops ([`off`](proof::off)): "not
/// proven", and the programs make the cookie with the helper as before.
pub mod proof {
    /// `call` with `src_reg = BPF_PSEUDO_KFUNC_CALL` (2) of BTF id `btf_id` in vmlinux, as the
    /// object holds an instruction (little-endian).
    pub const fn call(btf_id: u32) -> u64 {
        0x85 | (0x20 << 8) | ((btf_id as u64) << 32)
    }
    /// `r0 = *(u64 *)(r0 + offset)`.
    pub const fn load(offset: u16) -> u64 {
        0x79 | ((offset as u64) << 16)
    }
    /// `r0 = 1`.
    pub const NOT_PROVEN: u64 = 0xb7 | (1 << 32);
    /// `goto +0`.
    pub const NOP: u64 = 0x05;
    const CALL: u64 = call(0x5ec1_b0c1);
    const SK: u64 = load(0x7ec2);
    const COOKIE: u64 = load(0x7ec1);
    /// In the release program: the socket (`struct sock`) from the context, its cookie field.
    pub const RELEASE: [u64; 2] = [CALL, COOKIE];
    /// In a `sock_addr` program: `struct bpf_sock_addr_kern` from the context, its `sk`, that
    /// socket's cookie field.
    pub const ADDR: [u64; 3] = [CALL, SK, COOKIE];

    /// The sequences for a kernel whose kfunc has BTF id `btf_id`, with `skc_cookie` at
    /// `cookie` in `struct sock` and `sk` at `sk` in `struct bpf_sock_addr_kern`.
    pub const fn written(btf_id: u32, sk: u16, cookie: u16) -> ([u64; 2], [u64; 3]) {
        (
            [call(btf_id), load(cookie)],
            [call(btf_id), load(sk), load(cookie)],
        )
    }

    /// The sequences when the proof is off: 1 in r0, never a cookie of 0.
    pub const fn off() -> ([u64; 2], [u64; 3]) {
        ([NOT_PROVEN, NOP], [NOT_PROVEN, NOP, NOP])
    }
}

/// The programs in the eBPF object, by function name (also the names of their link pins).
pub mod program {
    pub const CONNECT4: &str = "socklb_connect4";
    pub const CONNECT6: &str = "socklb_connect6";
    pub const SENDMSG4: &str = "socklb_sendmsg4";
    pub const SENDMSG6: &str = "socklb_sendmsg6";
    pub const RECVMSG4: &str = "socklb_recvmsg4";
    pub const RECVMSG6: &str = "socklb_recvmsg6";
    pub const GETPEERNAME4: &str = "socklb_getpeername4";
    pub const GETPEERNAME6: &str = "socklb_getpeername6";
    /// `cgroup/sock_release`: when a socket closes, takes its record off its pod's count and
    /// frees its connection slot. Optional (`socket-release`): without it there is no per-pod
    /// bound and TCP sockets keep their record in socket storage.
    pub const RELEASE: &str = "socklb_release";
    /// The iterator over `SOCKETS` (every translated socket's cookie and state, in one walk),
    /// pinned as `SOCKETS_ITER` beside the socket maps; not attached to the cgroup. Optional:
    /// some kernels refuse iterators over map elements.
    pub const SOCKETS_ITER: &str = "socklb_sockets";
    /// The iterator over the UDP sockets of one network namespace, reporting those with a
    /// `SOCKETS` value and their addresses (`UdpSocketEntry`; the fallback when `SOCKETS_ITER`
    /// is refused), pinned as `UDP_SOCKETS_ITER`. Optional.
    pub const UDP_ITER: &str = "socklb_udp_sockets";
    /// Every cgroup program, in attach order.
    pub const ALL: [&str; 8] = [
        CONNECT4,
        CONNECT6,
        SENDMSG4,
        SENDMSG6,
        RECVMSG4,
        RECVMSG6,
        GETPEERNAME4,
        GETPEERNAME6,
    ];
}

/// The kind of a map, as the kernel knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    Array,
    PerCpuArray,
    LruHash,
    SkStorage,
    RingBuf,
}

/// Every map socklb has. `MapId::descriptor()` tells everything else about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapId {
    Frontends4,
    Frontends6,
    Backends,
    Ports,
    Sockets,
    Connections,
    SocketQuota,
    Config,
    Affinity,
    AffinityEmpty,
    ServiceMeta,
    Counters,
    Events,
    Monitor,
    FrontendIndex,
    SlotsHeld,
    FrontendIndex6,
}

/// One map: its pin and object name, kind, key and value layout, default size and the agent flag
/// that resizes it. Loading, pinning, checking pinned layouts, inspecting, metrics and the agent's
/// flags all read this table; nothing else lists the maps.
#[derive(Clone, Copy, Debug)]
pub struct MapDescriptor {
    pub id: MapId,
    /// The map's name in the eBPF object and its file name under the pin folder.
    pub name: &'static str,
    pub kind: MapKind,
    pub key_type: &'static str,
    pub key_size: u32,
    pub value_type: &'static str,
    pub value_size: u32,
    /// Entries when the agent does not say otherwise (0: not sized by entries).
    pub default_capacity: u32,
    /// The `socklb agent` flag that sets the capacity, if it can be set.
    pub capacity_flag: Option<&'static str>,
    /// Whether the kernel allocates every entry when the map is created (`false`: on insert).
    pub preallocated: bool,
    /// Pinned beside the socket records rather than in the layout generation: these maps keep
    /// their contents when the agent migrates to other capacities (a socket connected before
    /// the migration keeps its record). Their folder is named by a digest of their own layout.
    pub per_socket: bool,
    /// What it holds, for humans (inspect, metrics help, the README).
    pub help: &'static str,
}

/// `BPF_F_NO_PREALLOC`: the maps only the agent writes allocate entries as they are inserted.
pub const MAP_F_NO_PREALLOC: u32 = 1;
/// `BPF_F_MMAPABLE`: an array the agent reads in place (`CONNECTIONS`), without a system call
/// per entry.
pub const MAP_F_MMAPABLE: u32 = 1 << 10;

impl MapId {
    /// Every map, in the order the descriptor table lists them.
    pub const ALL: [Self; 17] = [
        Self::Frontends4,
        Self::Frontends6,
        Self::Backends,
        Self::Ports,
        Self::Sockets,
        Self::Connections,
        Self::SocketQuota,
        Self::Config,
        Self::Affinity,
        Self::AffinityEmpty,
        Self::ServiceMeta,
        Self::Counters,
        Self::Events,
        Self::Monitor,
        Self::FrontendIndex,
        Self::SlotsHeld,
        Self::FrontendIndex6,
    ];

    pub const fn descriptor(self) -> &'static MapDescriptor {
        &MAPS[self as usize]
    }

    pub const fn name(self) -> &'static str {
        self.descriptor().name
    }

    pub const fn default_capacity(self) -> u32 {
        self.descriptor().default_capacity
    }

    /// Finds a map by its name.
    pub fn from_name(name: &str) -> Option<Self> {
        MAPS.iter()
            .find(|d| d.name.as_bytes() == name.as_bytes())
            .map(|d| d.id)
    }
}

/// The maps, indexed by `MapId`.
pub const MAPS: [MapDescriptor; 17] = [
    MapDescriptor {
        id: MapId::Frontends4,
        name: "FRONTENDS4",
        kind: MapKind::Hash,
        key_type: "Frontend4Key",
        key_size: size_of::<Frontend4Key>() as u32,
        value_type: "Frontend",
        value_size: size_of::<Frontend>() as u32,
        default_capacity: 65_536,
        capacity_flag: Some("max-frontends"),
        preallocated: false,
        per_socket: false,
        help: "IPv4 service addresses (address, port, protocol) and the backend range they use",
    },
    MapDescriptor {
        id: MapId::Frontends6,
        name: "FRONTENDS6",
        kind: MapKind::Hash,
        key_type: "FrontendKey",
        key_size: size_of::<FrontendKey>() as u32,
        value_type: "Frontend",
        value_size: size_of::<Frontend>() as u32,
        default_capacity: 65_536,
        capacity_flag: Some("max-frontends"),
        preallocated: false,
        per_socket: false,
        help: "IPv6 service addresses and the backend range they use",
    },
    MapDescriptor {
        id: MapId::Backends,
        name: "BACKENDS",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "Backend",
        value_size: size_of::<Backend>() as u32,
        default_capacity: 262_144,
        capacity_flag: Some("max-backends"),
        preallocated: true,
        per_socket: false,
        help: "backend addresses; each backend set owns a contiguous range",
    },
    MapDescriptor {
        id: MapId::Ports,
        name: "PORTS",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "u64",
        value_size: 8,
        default_capacity: ports::WORDS,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "the frontend filter (a bit per hashed service address) and the bitmap of ports backends use: the connect and reverse prefilters",
    },
    MapDescriptor {
        id: MapId::Sockets,
        name: "SOCKETS",
        kind: MapKind::SkStorage,
        key_type: "i32",
        key_size: 4,
        value_type: "SockState",
        value_size: size_of::<SockState>() as u32,
        default_capacity: 0,
        capacity_flag: None,
        preallocated: false,
        per_socket: true,
        help: "per-socket translation records, stored with the socket and freed with it",
    },
    MapDescriptor {
        id: MapId::Connections,
        name: "CONNECTIONS",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "ConnRecord",
        value_size: size_of::<ConnRecord>() as u32,
        default_capacity: CONNECTION_SLOTS,
        capacity_flag: None,
        preallocated: true,
        per_socket: true,
        help: "translated connects (TCP connections and connected UDP sockets) by socket cookie (a slot each, freed when the socket closes; a socket whose slot is taken keeps its record in SOCKETS)",
    },
    MapDescriptor {
        id: MapId::SocketQuota,
        name: "SOCKET_QUOTA",
        kind: MapKind::LruHash,
        key_type: "u64",
        key_size: 8,
        value_type: "u64",
        value_size: 8,
        default_capacity: 65_536,
        capacity_flag: None,
        preallocated: true,
        per_socket: true,
        help: "socket records per pod: counted up at each new record and down when its socket closes",
    },
    MapDescriptor {
        id: MapId::Config,
        name: "CONFIG",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "DatapathConfig",
        value_size: size_of::<DatapathConfig>() as u32,
        default_capacity: 1,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "settings the agent decides after probing the kernel (the per-pod socket record bound, where pods are in the cgroup tree, connection slots on or off)",
    },
    MapDescriptor {
        id: MapId::Affinity,
        name: "AFFINITY",
        kind: MapKind::LruHash,
        key_type: "u64",
        key_size: 8,
        value_type: "AffinityTable",
        value_size: size_of::<AffinityTable>() as u32,
        default_capacity: 4_096,
        capacity_flag: Some("max-affinity-clients"),
        preallocated: true,
        per_socket: false,
        help: "sessionAffinity ClientIP choices: one fixed-size table per client cgroup",
    },
    MapDescriptor {
        id: MapId::AffinityEmpty,
        name: "AFFINITY_EMPTY",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "AffinityTable",
        value_size: size_of::<AffinityTable>() as u32,
        default_capacity: 1,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "one empty affinity table, copied for a new client (a table is larger than the BPF stack)",
    },
    MapDescriptor {
        id: MapId::ServiceMeta,
        name: "SERVICE_META",
        kind: MapKind::Hash,
        key_type: "u32",
        key_size: 4,
        value_type: "ServiceMeta",
        value_size: size_of::<ServiceMeta>() as u32,
        default_capacity: 65_536,
        capacity_flag: Some("max-services"),
        preallocated: false,
        per_socket: false,
        help: "which Kubernetes service port each backend set is (read by the agent and inspect only)",
    },
    MapDescriptor {
        id: MapId::Counters,
        name: "COUNTERS",
        kind: MapKind::PerCpuArray,
        key_type: "u32",
        key_size: 4,
        value_type: "u64",
        value_size: 8,
        default_capacity: Counter::ALL.len() as u32,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "the data path's event counters, per CPU",
    },
    MapDescriptor {
        id: MapId::Events,
        name: "EVENTS",
        kind: MapKind::RingBuf,
        key_type: "-",
        key_size: 0,
        value_type: "Event",
        value_size: 0,
        default_capacity: EVENTS_BYTES,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "the data path's decisions, written only while `socklb monitor` reads them (a ring buffer of bytes)",
    },
    MapDescriptor {
        id: MapId::Monitor,
        name: "MONITOR",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "MonitorState",
        value_size: size_of::<MonitorState>() as u32,
        default_capacity: 1,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "whether a decision stream is being read (`socklb monitor` renews it every second)",
    },
    MapDescriptor {
        id: MapId::FrontendIndex,
        name: "FRONTEND_INDEX",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "IndexEntry",
        value_size: size_of::<IndexEntry>() as u32,
        default_capacity: index::SLOTS,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "IPv4 frontends copied into a direct-mapped array at a secret-keyed hash of their address, with a keyed check: the connect and sendmsg programs read one entry before FRONTENDS4 (written by the agent only)",
    },
    MapDescriptor {
        id: MapId::SlotsHeld,
        name: "SLOTS_HELD",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "SlotsHeld",
        value_size: size_of::<SlotsHeld>() as u32,
        default_capacity: CONNECTION_SLOTS / SLOTS_PER_HELD,
        capacity_flag: None,
        preallocated: true,
        per_socket: true,
        help: "a byte per CONNECTIONS slot, 1 while a socket may hold it: closing a socket or asking its peer's name reads a slot only where its byte says so",
    },
    MapDescriptor {
        id: MapId::FrontendIndex6,
        name: "FRONTEND_INDEX6",
        kind: MapKind::Array,
        key_type: "u32",
        key_size: 4,
        value_type: "IndexEntry6",
        value_size: size_of::<IndexEntry6>() as u32,
        default_capacity: index::SLOTS6,
        capacity_flag: None,
        preallocated: true,
        per_socket: false,
        help: "IPv6 frontends copied as FRONTEND_INDEX copies IPv4 ones (a cache line per entry): the connect and sendmsg programs read one entry before FRONTENDS6 (written by the agent only)",
    },
];

/// The data path's counters: indexes into the per-CPU `COUNTERS` array. Every connect or sendmsg
/// addressed to a frontend ends in exactly one of `Translations`, `NoBackend`, `NoLocalBackend`,
/// `RecordFailed`, `RecordQuota` or `Faults`, so their sum is the number of service lookups.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// A destination was rewritten to a backend.
    Translations = 0,
    /// A connect or sendmsg was refused: the service has no usable endpoint.
    NoBackend = 1,
    /// Refused: internalTrafficPolicy Local and no usable endpoint on this node.
    NoLocalBackend = 2,
    /// A session-affinity entry chose the backend.
    AffinityHits = 3,
    /// A client cgroup's affinity table was full: its own oldest entry was replaced.
    AffinityEvictions = 4,
    /// getpeername or recvmsg reported the service address instead of the backend's.
    ReverseTranslations = 5,
    /// An unconnected UDP socket kept the backend it used before.
    StickyHits = 6,
    /// The socket's record could not be stored (socket memory exhausted): the call was refused
    /// with ENOBUFS rather than let replies come back from an address the application never
    /// dialled.
    RecordFailed = 7,
    /// A frontend pointed outside the backend array (should never happen).
    Faults = 8,
    /// Refused with ENOBUFS: the client cgroup already holds as many socket records as one
    /// client may (`--max-sockets-per-pod`); its other sockets, and other clients, go on.
    RecordQuota = 9,
    /// A decision not written to the stream `socklb monitor` reads: its ring buffer was full.
    EventsDropped = 10,
}

impl Counter {
    pub const ALL: [Self; 11] = [
        Self::Translations,
        Self::NoBackend,
        Self::NoLocalBackend,
        Self::AffinityHits,
        Self::AffinityEvictions,
        Self::ReverseTranslations,
        Self::StickyHits,
        Self::RecordFailed,
        Self::Faults,
        Self::RecordQuota,
        Self::EventsDropped,
    ];

    /// The name in metrics (`socklb_datapath_<name>_total`) and `socklb inspect stats`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Translations => "translations",
            Self::NoBackend => "no_backend",
            Self::NoLocalBackend => "no_local_backend",
            Self::AffinityHits => "affinity_hits",
            Self::AffinityEvictions => "affinity_evictions",
            Self::ReverseTranslations => "reverse_translations",
            Self::StickyHits => "sticky_hits",
            Self::RecordFailed => "record_failed",
            Self::Faults => "faults",
            Self::RecordQuota => "record_quota",
            Self::EventsDropped => "events_dropped",
        }
    }

    /// One line for metric HELP texts.
    pub const fn help(self) -> &'static str {
        match self {
            Self::Translations => {
                "Connects and datagrams to a service address rewritten to a backend"
            }
            Self::NoBackend => {
                "Connects and datagrams refused because the service has no usable endpoint"
            }
            Self::NoLocalBackend => {
                "Connects refused because internalTrafficPolicy is Local and this node has no usable endpoint"
            }
            Self::AffinityHits => "Backends chosen by a sessionAffinity ClientIP entry",
            Self::AffinityEvictions => {
                "Affinity entries replaced because their client's own table was full"
            }
            Self::ReverseTranslations => {
                "getpeername and recvmsg calls that reported the service address"
            }
            Self::StickyHits => "Datagrams of unconnected UDP sockets that kept their backend",
            Self::RecordFailed => {
                "Calls refused with ENOBUFS because the socket's translation record could not be stored"
            }
            Self::Faults => "Frontends pointing outside the backend array (never expected)",
            Self::RecordQuota => {
                "Calls refused with ENOBUFS because the client cgroup holds as many socket records as one client may"
            }
            Self::EventsDropped => {
                "Decisions not written to the stream socklb monitor reads because its buffer was full"
            }
        }
    }
}

/// `Frontend::flags`: the service has `sessionAffinity: ClientIP`.
pub const FRONTEND_FLAG_AFFINITY: u16 = 1;
/// `Frontend::flags`: `count` is 0 because internalTrafficPolicy is Local and no usable endpoint
/// is on this node (endpoints exist elsewhere): refused, but counted apart.
pub const FRONTEND_FLAG_NO_LOCAL: u16 = 2;

/// Bumped when what a generation's maps hold changes while their names and sizes do not: the
/// agent's layout digest takes it in, so an upgrade migrates to maps of their own, written
/// before the new programs attach, instead of rewriting maps the running programs read.
/// 1: the frontend filter's bit is a multiplicative hash (`ports::frontend_bit`).
pub const GENERATION_REVISION: u32 = 1;

/// Layout of the `PORTS` array: the programs' prefilters, one array lookup each (the verifier
/// inlines it).
/// - The frontend port bitmap, per protocol: one bit per port some frontend uses. A connect or
///   sendmsg to a port no service uses is decided by this one lookup, in a region small enough
///   to stay in the cache (the same word for every connect to that port, whatever the address).
/// - The frontend filter, per protocol: one bit per hash of (address, port). A connect or
///   sendmsg whose bit is clear goes to no service, so a miss on a port services use (443, 53,
///   80 to addresses outside the cluster) costs this second lookup only. A set bit may be
///   another service address's: that false positive costs the frontend hash lookup.
/// - The backend bitmap, per protocol: one bit per port some backend uses (getpeername and
///   recvmsg only look for a socket's record behind those).
#[allow(
    clippy::inline_always,
    reason = "used on the programs' hot path, where a bpf-to-bpf call would cost more"
)]
pub mod ports {
    /// Bits of the frontend filter per protocol: 2^20 (128 KiB), so 30,000 frontends of one
    /// protocol leave 97% of misses at one lookup.
    pub const FILTER_BITS: u32 = 20;
    /// Words of the frontend filter per protocol.
    pub const FILTER_WORDS: u32 = 1 << (FILTER_BITS - 6);
    /// First word of the frontend filter (TCP, then UDP).
    pub const FRONTEND: u32 = 0;
    /// First word of the backend port bitmap (TCP, then UDP).
    pub const BACKEND: u32 = 2 * FILTER_WORDS;
    /// Words of a port bitmap per protocol (65,536 ports).
    pub const BACKEND_WORDS: u32 = 1024;
    /// First word of the frontend port bitmap (TCP, then UDP).
    pub const FRONTEND_PORTS: u32 = BACKEND + 2 * BACKEND_WORDS;
    /// Words in the `PORTS` array.
    pub const WORDS: u32 = FRONTEND_PORTS + 2 * BACKEND_WORDS;

    /// The frontend filter's bit for a service address (address words and port in network
    /// byte order, IPv4 in `addr[0]` and the rest zero), `FILTER_BITS` of a hash of both. The
    /// programs and the agent compute it with this one function. On every connect to a port
    /// services use: one multiply (the two mixes before it cost a port services use about a
    /// tenth of an empty program more).
    #[inline(always)]
    pub const fn frontend_bit(addr: &[u32; 4], port_be: u16) -> u32 {
        let x =
            addr[0] ^ addr[1].rotate_left(8) ^ addr[2].rotate_left(16) ^ addr[3].rotate_left(24);
        // Knuth's multiplicative hashing: the key times 2^64 / golden ratio, its top bits
        // taken; every bit of the 48-bit key moves them. The address's last bytes, the ones
        // that vary between services, go lowest: consecutive keys are what it spreads best
        // (`reconcile::mirror`'s test holds the filter to what an ideal hash gives).
        let key = x.swap_bytes() as u64 | (port_be as u64) << 32;
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FILTER_BITS)) as u32
    }

    /// The word holding frontend filter bit `index` (from `frontend_bit`).
    #[inline(always)]
    pub const fn frontend_word(udp: bool, index: u32) -> u32 {
        FRONTEND + if udp { FILTER_WORDS } else { 0 } + (index >> 6)
    }

    /// The word holding a backend port's bit (host byte order).
    #[inline(always)]
    pub const fn backend_word(udp: bool, port: u16) -> u32 {
        BACKEND + if udp { BACKEND_WORDS } else { 0 } + (port as u32 >> 6)
    }

    /// The word holding a frontend port's bit (host byte order).
    #[inline(always)]
    pub const fn frontend_port_word(udp: bool, port: u16) -> u32 {
        FRONTEND_PORTS + if udp { BACKEND_WORDS } else { 0 } + (port as u32 >> 6)
    }

    /// The bit of a filter index or port within its word.
    #[inline(always)]
    pub const fn bit(index: u32) -> u64 {
        1 << (index & 63)
    }
}

/// An IPv4 service address as a client dials it: `FRONTENDS4` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend4Key {
    /// Network byte order.
    pub addr: u32,
    /// Network byte order.
    pub port_be: u16,
    pub protocol: u8,
    pub _pad: u8,
}

/// A service address of either family: `FRONTENDS6` key (family 6), and the frontend a socket's
/// record names.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    /// Network byte order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port_be: u16,
    pub protocol: u8,
    pub family: u8,
}

impl FrontendKey {
    /// The `FRONTENDS4` key of an IPv4 frontend.
    pub const fn v4(&self) -> Frontend4Key {
        Frontend4Key {
            addr: self.addr[0],
            port_be: self.port_be,
            protocol: self.protocol,
            _pad: 0,
        }
    }
}

/// `FRONTENDS4`/`FRONTENDS6` value. The programs choose among `BACKENDS[base .. base + count]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frontend {
    /// Identifies the backend set (one service port, one family, one endpoint scope).
    pub service_id: u32,
    /// First index of the backend set's range in `BACKENDS`.
    pub base: u32,
    /// Usable backends; 0 means the service rejects connects with ECONNREFUSED.
    pub count: u16,
    pub flags: u16,
    /// sessionAffinity ClientIP timeout, seconds (0 when affinity is off).
    pub affinity_timeout_s: u32,
}

/// `FRONTEND_INDEX` value: an IPv4 frontend beside its key. The agent writes it right before the
/// `FRONTENDS4` entry it copies (and clears it right before deleting that entry); the programs
/// only read it, and use it only when its key is theirs and its check holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexEntry {
    /// All zero: the slot is empty.
    pub key: Frontend4Key,
    pub frontend: Frontend,
    /// `index::check` of the key and frontend under the programs' secret. The kernel copies a
    /// value the agent writes byte by byte, so a program can read an entry half rewritten; such
    /// an entry, or one written under another load's secret, fails the check and the program
    /// reads `FRONTENDS4` instead.
    pub check: u64,
}

impl IndexEntry {
    /// Whether this entry is `key`'s, whole, under `secret`: the one rule by which the programs
    /// use an entry (anything else sends them to `FRONTENDS4`), and by which `explain` says so.
    #[allow(clippy::inline_always, reason = "on the programs' hot path")]
    #[inline(always)]
    pub fn holds(&self, key: &Frontend4Key, secret: u64) -> bool {
        self.key == *key && self.check == index::check(key, &self.frontend, secret)
    }
}

/// `FRONTEND_INDEX6` value: an IPv6 frontend beside its key, written and read by the rules of
/// `IndexEntry`. A cache line each (the rest is padding), so that one entry is one line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexEntry6 {
    /// All zero: the slot is empty.
    pub key: FrontendKey,
    pub _pad: u32,
    pub frontend: Frontend,
    /// `index::check6` of the key and frontend under the programs' secret.
    pub check: u64,
    pub _pad_line: [u64; 2],
}

impl IndexEntry6 {
    /// As `IndexEntry::holds`, for an IPv6 key.
    #[allow(clippy::inline_always, reason = "on the programs' hot path")]
    #[inline(always)]
    pub fn holds(&self, key: &FrontendKey, secret: u64) -> bool {
        self.key == *key && self.check == index::check6(key, &self.frontend, secret)
    }
}

/// The frontend index (`FRONTEND_INDEX`): one array read instead of a hash lookup for most IPv4
/// frontends. Direct-mapped; a frontend whose slot another holds is found in `FRONTENDS4` only.
/// The slot and the check are keyed with a secret the agent draws at each load
/// (`DatapathConfig::index_secret`), so a tenant that chooses its services' addresses and ports can neither aim
/// at another's slot nor forge a check.
#[allow(
    clippy::inline_always,
    reason = "used on the programs' hot path, where a bpf-to-bpf call would cost more"
)]
pub mod index {
    use super::{Frontend, Frontend4Key, FrontendKey};

    /// Slots in the index (entries of 32 bytes: 1 MiB). 10,000 IPv4 frontends fill 26% of them
    /// and leave about 14% in a colliding slot.
    pub const SLOTS: u32 = 1 << 15;
    const SLOT_BITS: u32 = SLOTS.trailing_zeros();

    /// The slot of a frontend.
    #[inline(always)]
    pub const fn slot(key: &Frontend4Key, secret: u64) -> u32 {
        // Mixed twice before the top bits are taken. One product of the keyed word alone
        // (`(secret ^ word) * MUL`) left 54-66% of 10,000 consecutive service addresses on one port
        // outside the index, against 14% for random keys: a ClusterIP's varying bytes are the
        // word's high ones, which one product carries into few top bits.
        (fold(secret, key_word(key)).wrapping_mul(MUL) >> (64 - SLOT_BITS)) as u32
    }

    /// The check an entry holding `key` and `frontend` carries.
    #[inline(always)]
    pub const fn check(key: &Frontend4Key, frontend: &Frontend, secret: u64) -> u64 {
        let h = fold(secret.rotate_left(32), key_word(key));
        let h = fold(h, frontend.service_id as u64 | (frontend.base as u64) << 32);
        fold(
            h,
            frontend.count as u64
                | (frontend.flags as u64) << 16
                | (frontend.affinity_timeout_s as u64) << 32,
        )
    }

    /// Slots in the IPv6 index (entries of 64 bytes: 1 MiB).
    pub const SLOTS6: u32 = 1 << 14;
    const SLOT6_BITS: u32 = SLOTS6.trailing_zeros();
    const _: () = assert!(SLOTS.is_power_of_two() && SLOTS6.is_power_of_two());

    /// The slot of an IPv6 frontend (its three words mixed in turn, as `slot` mixes one).
    #[inline(always)]
    pub const fn slot6(key: &FrontendKey, secret: u64) -> u32 {
        let [a, b, c] = key_words6(key);
        (fold(fold(fold(secret, a), b), c).wrapping_mul(MUL) >> (64 - SLOT6_BITS)) as u32
    }

    /// The check an IPv6 entry holding `key` and `frontend` carries.
    #[inline(always)]
    pub const fn check6(key: &FrontendKey, frontend: &Frontend, secret: u64) -> u64 {
        let [a, b, c] = key_words6(key);
        let h = fold(fold(fold(secret.rotate_left(32), a), b), c);
        let h = fold(h, frontend.service_id as u64 | (frontend.base as u64) << 32);
        fold(
            h,
            frontend.count as u64
                | (frontend.flags as u64) << 16
                | (frontend.affinity_timeout_s as u64) << 32,
        )
    }

    #[inline(always)]
    const fn key_words6(key: &FrontendKey) -> [u64; 3] {
        [
            key.addr[0] as u64 | (key.addr[1] as u64) << 32,
            key.addr[2] as u64 | (key.addr[3] as u64) << 32,
            key.port_be as u64 | (key.protocol as u64) << 16 | (key.family as u64) << 24,
        ]
    }

    const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

    #[inline(always)]
    const fn fold(h: u64, word: u64) -> u64 {
        let x = (h ^ word).wrapping_mul(MUL);
        x ^ (x >> 29)
    }

    #[inline(always)]
    const fn key_word(key: &Frontend4Key) -> u64 {
        // The padding byte is zero in every key the programs and the agent make.
        key.addr as u64 | (key.port_be as u64) << 32 | (key.protocol as u64) << 48
    }
}

/// `BACKENDS` value: where a connect goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// Network byte order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network byte order.
    pub port_be: u16,
    pub family: u8,
    pub _pad: u8,
}

/// One destination a socket was translated to: the service address it dialled and the backend
/// it was sent to instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockRecord {
    /// The service address the socket dialled (family 0: the record is unused).
    pub frontend: FrontendKey,
    /// Where it was sent instead.
    pub backend: Backend,
    pub service_id: u32,
    /// Index of `backend` within its backend set (not an absolute `BACKENDS` index).
    pub slot: u32,
}

/// Destinations one socket remembers: a UDP socket connected to one service that also sends
/// to others (or one `sendmmsg()` batch to several) gets each one's replies from that service's
/// address. glibc and musl resolvers use at most 3 nameservers (`MAXNS`); a fourth destination
/// replaces the oldest. Three keep the kernel's element for a socket's value in its 256-byte
/// slab (72 bytes of header plus the value).
pub const SOCK_DESTINATIONS: usize = 3;

/// `SOCKETS` value (socket-local storage): who the socket belongs to and where it was
/// translated, so getpeername and recvmsg report the service address, an unconnected UDP socket
/// keeps its backend, and the agent can list live sockets per backend and client, and find the
/// connected UDP sockets whose backend left. It lives with the socket and is freed with it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// The cgroup v2 id of the pod whose call created the record (`DatapathConfig::pod_level`;
    /// the process's own cgroup outside pods): the count the record is charged to, and the
    /// client it is listed under.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_coarse_ns()` (`CLOCK_MONOTONIC_COARSE`, the kernel's last tick) when the
    /// record was created: the socket's age.
    pub created_ns: u64,
    /// Which record the next new destination replaces once all are used (taken modulo
    /// `SOCK_DESTINATIONS`).
    pub next: u32,
    pub _pad: u32,
    pub records: [SockRecord; SOCK_DESTINATIONS],
}

/// What the socket iterators write for each socket with a `SOCKETS` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketEntry {
    /// The socket's cookie (as `sock_diag` reports it).
    pub cookie: u64,
    pub state: SockState,
}

/// The socket's own addresses as the kernel holds them (the start of `struct sock_common`, a
/// layout unchanged since Linux 2.6), so a census of IPv4 UDP sockets needs no `sock_diag` dump.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockAddrs {
    /// `skc_daddr`, network byte order (0 when unconnected).
    pub peer_addr: u32,
    /// `skc_rcv_saddr`, network byte order.
    pub local_addr: u32,
    /// `skc_dport`, network byte order.
    pub peer_port_be: u16,
    /// `skc_num`, host byte order.
    pub local_port: u16,
    /// `skc_family`: `AF_INET` (2) or `AF_INET6` (10; its addresses are not in this struct).
    pub family: u16,
    /// `skc_state`: a TCP state number (a connected UDP socket is `TCP_ESTABLISHED`).
    pub tcp_state: u8,
    /// Where its records are: `HOLDS_STORAGE`, `HOLDS_SLOT` or both (each counts once
    /// against its pod's bound).
    pub holds: u8,
}

/// `SockAddrs::holds`: the socket has a `SOCKETS` value.
pub const HOLDS_STORAGE: u8 = 1;
/// `SockAddrs::holds`: the socket holds its `CONNECTIONS` slot.
pub const HOLDS_SLOT: u8 = 2;

/// What the UDP iterator writes for each UDP socket with a record (a `SOCKETS` value, a
/// `CONNECTIONS` slot, or both: the state then holds the slot's record too).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpSocketEntry {
    pub cookie: u64,
    pub addrs: SockAddrs,
    pub state: SockState,
}

/// `CONFIG` value: what the agent decides once it knows what the kernel offers. The programs
/// read it on every translation; it stays in force while no agent runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Socket records one pod may hold (`SOCKET_QUOTA`); `u64::MAX` turns the bound off.
    pub max_sockets_per_pod: u64,
    /// The cgroups whose children are pods although they sit at `pod_level` themselves: the
    /// kubelet's quality-of-service tiers (`kubepods/burstable`, `kubepods/besteffort`); 0:
    /// unused.
    pub tiers: [u64; 2],
    /// The cgroup level of a pod's cgroup: a socket's records are counted against the
    /// creating process's ancestor at this level (one level lower under a tier). 0: against
    /// the process's own cgroup.
    pub pod_level: u32,
    /// `CONFIG_*` bits.
    pub flags: u32,
    /// Keys the frontend index's slots and checks (`index`): drawn by the agent that creates a
    /// map generation and kept by one that adopts it (which rewrites the index anyway).
    pub index_secret: u64,
}

/// `DatapathConfig::flags`: connects (TCP, and connected UDP sockets) take a slot in
/// `CONNECTIONS` (the release program is attached and frees it).
pub const CONFIG_CONNECTION_SLOTS: u32 = 1;

impl Default for DatapathConfig {
    /// No bound, no slots, until the agent writes its settings.
    fn default() -> Self {
        Self {
            max_sockets_per_pod: u64::MAX,
            tiers: [0; 2],
            pod_level: 0,
            flags: 0,
            index_secret: 0,
        }
    }
}

/// Slots in `CONNECTIONS`: a power of two (the slot is the cookie's low bits). A connection
/// whose slot another live connection holds keeps its record in `SOCKETS` instead.
pub const CONNECTION_SLOTS: u32 = 1 << 17;

/// `CONNECTIONS` value: one translated connect (a TCP connection or a connected UDP socket), in
/// the slot of its socket cookie. The same facts as a `SockState` with one record, without an
/// allocation per socket. A UDP socket's slot counts against its pod's bound (thousands of
/// connected UDP sockets cost a pod nothing to make); a TCP connection's does not.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnRecord {
    /// The socket's cookie; 0: the slot is free. Written last, cleared by the release program.
    pub cookie: u64,
    /// The cgroup v2 id of the process that connected (UDP: of its pod, the one charged).
    pub cgroup_id: u64,
    /// `bpf_ktime_get_coarse_ns()` (`CLOCK_MONOTONIC_COARSE`) at connect.
    pub created_ns: u64,
    pub frontend: FrontendKey,
    pub backend: Backend,
    pub service_id: u32,
    /// Index of `backend` within its backend set.
    pub slot: u32,
}

/// `CONNECTIONS` slots per `SLOTS_HELD` entry.
pub const SLOTS_PER_HELD: u32 = 64;

/// `SLOTS_HELD` value: a byte per `CONNECTIONS` slot, 1 while a socket may hold the slot, for
/// `SLOTS_PER_HELD` consecutive slots (one cache line; the whole array is 128 KiB, where the
/// slots are 9 MiB). Written 1 after a slot's cookie at connect and 0 before it at close, by the
/// one socket that holds the slot; a socket whose byte is 0 holds no slot, so closing it or
/// asking its peer's name reads no slot. A byte left 1 with its slot free only costs that read
/// (an agent that finds the array new, beside slots an older agent's programs took, fills it
/// with 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotsHeld {
    pub held: [u8; SLOTS_PER_HELD as usize],
}

impl SlotsHeld {
    /// Every slot of the entry may be held.
    pub const ALL: Self = Self {
        held: [1; SLOTS_PER_HELD as usize],
    };
}

/// Entries in one client's affinity table.
pub const AFFINITY_WAYS: usize = 16;
/// Entries of one bucket of a client's affinity table: a service's choices go in the bucket its
/// id hashes to (set-associative), so a connect searches this many entries, not all of them.
pub const AFFINITY_BUCKET: usize = 4;

/// One remembered choice: a pod (network namespace) of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityEntry {
    pub netns_cookie: u64,
    /// `bpf_ktime_get_coarse_ns()` (`CLOCK_MONOTONIC_COARSE`) of the last connect that used
    /// this entry (entries an older agent's programs wrote: `CLOCK_MONOTONIC`, at most a tick
    /// ahead).
    pub last_used_ns: u64,
    pub backend: Backend,
    /// 0: the entry is free.
    pub service_id: u32,
    /// Index within the backend set.
    pub slot: u32,
    pub _pad: u32,
}

/// `AFFINITY` value, keyed by the client's cgroup id: a fixed number of entries per client, so
/// one pod can only ever replace its own choices.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityTable {
    pub entries: [AffinityEntry; AFFINITY_WAYS],
}

impl Default for AffinityTable {
    fn default() -> Self {
        Self {
            entries: [AffinityEntry::default(); AFFINITY_WAYS],
        }
    }
}

/// Bytes of the `EVENTS` ring buffer (a power of two, a multiple of the page size): about
/// 4,000 decisions between two reads of `socklb monitor`.
pub const EVENTS_BYTES: u32 = 1 << 18;

/// `MONITOR` value: whether the programs write their decisions to `EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorState {
    /// `bpf_ktime_get_ns()` until which a reader is there (0: none). `socklb monitor` moves it
    /// a few seconds ahead every second, so a reader that dies stops the stream by itself.
    pub until_ns: u64,
}

/// What a decision was (`Event::kind`).
pub mod event {
    /// Translated to a backend chosen afresh.
    pub const TRANSLATED: u8 = 1;
    /// Translated to the backend the client's session-affinity entry holds.
    pub const AFFINITY: u8 = 2;
    /// Translated to the backend an unconnected UDP socket used before.
    pub const STICKY: u8 = 3;
    /// Refused (ECONNREFUSED): the service has no usable endpoint.
    pub const NO_BACKEND: u8 = 4;
    /// Refused (ECONNREFUSED): internalTrafficPolicy Local and no endpoint on this node.
    pub const NO_LOCAL_BACKEND: u8 = 5;
    /// Refused (ENOBUFS): the pod holds as many socket records as it may.
    pub const RECORD_QUOTA: u8 = 6;
    /// Refused (ENOBUFS): the socket's record could not be stored.
    pub const RECORD_FAILED: u8 = 7;
}

/// `Event::hook`.
pub const HOOK_CONNECT: u8 = 1;
pub const HOOK_SENDMSG: u8 = 2;

/// One decision of the data path, as `socklb monitor` reads it from `EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()`.
    pub at_ns: u64,
    /// The cgroup v2 id of the calling process.
    pub cgroup_id: u64,
    /// The service address dialled.
    pub frontend: FrontendKey,
    /// The backend chosen (zero when refused).
    pub backend: Backend,
    pub service_id: u32,
    /// `event::*`.
    pub kind: u8,
    /// `HOOK_*`.
    pub hook: u8,
    pub _pad: [u8; 2],
}

/// Longest `namespace/name` kept in `ServiceMeta` (Kubernetes allows 63 + 1 + 63).
pub const SERVICE_NAME_LEN: usize = 128;
/// Longest service port name kept (a DNS-1123 label: 63 characters, plus a terminating zero).
pub const PORT_NAME_LEN: usize = 64;

/// `SERVICE_META` value, keyed by service id: which Kubernetes service port a backend set is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceMeta {
    /// `namespace/name`, UTF-8, zero padded.
    pub name: [u8; SERVICE_NAME_LEN],
    /// The service port's name, UTF-8, zero padded (the port number for a single unnamed port).
    pub port_name: [u8; PORT_NAME_LEN],
    /// The service port (host byte order).
    pub port: u16,
    pub protocol: u8,
    pub family: u8,
    /// `SCOPE_CLUSTER` or `SCOPE_LOCAL`.
    pub scope: u8,
    pub _pad: [u8; 3],
}

/// `ServiceMeta::scope`: the backend set holds the cluster-wide endpoints.
pub const SCOPE_CLUSTER: u8 = 0;
/// `ServiceMeta::scope`: the backend set holds this node's endpoints (internalTrafficPolicy Local).
pub const SCOPE_LOCAL: u8 = 1;

impl Default for ServiceMeta {
    fn default() -> Self {
        Self {
            name: [0; SERVICE_NAME_LEN],
            port_name: [0; PORT_NAME_LEN],
            port: 0,
            protocol: 0,
            family: 0,
            scope: 0,
            _pad: [0; 3],
        }
    }
}

// The ABI, checked at compile time: sizes, and the offsets of fields that follow a narrower one.
const _: () = {
    assert!(size_of::<Frontend4Key>() == 8);
    assert!(offset_of!(Frontend4Key, port_be) == 4);
    assert!(offset_of!(Frontend4Key, protocol) == 6);
    assert!(size_of::<FrontendKey>() == 20);
    assert!(offset_of!(FrontendKey, port_be) == 16);
    assert!(offset_of!(FrontendKey, protocol) == 18);
    assert!(offset_of!(FrontendKey, family) == 19);
    assert!(size_of::<Frontend>() == 16);
    assert!(offset_of!(Frontend, base) == 4);
    assert!(offset_of!(Frontend, count) == 8);
    assert!(offset_of!(Frontend, flags) == 10);
    assert!(offset_of!(Frontend, affinity_timeout_s) == 12);
    assert!(size_of::<IndexEntry>() == 32);
    assert!(offset_of!(IndexEntry, frontend) == 8);
    assert!(offset_of!(IndexEntry, check) == 24);
    assert!(size_of::<IndexEntry6>() == 64);
    assert!(offset_of!(IndexEntry6, frontend) == 24);
    assert!(offset_of!(IndexEntry6, check) == 40);
    assert!(index::SLOTS.is_power_of_two());
    assert!(size_of::<Backend>() == 20);
    assert!(offset_of!(Backend, port_be) == 16);
    assert!(offset_of!(Backend, family) == 18);
    assert!(size_of::<SockRecord>() == 48);
    assert!(offset_of!(SockRecord, backend) == 20);
    assert!(offset_of!(SockRecord, service_id) == 40);
    assert!(offset_of!(SockRecord, slot) == 44);
    assert!(offset_of!(SockState, created_ns) == 8);
    assert!(offset_of!(SockState, next) == 16);
    assert!(offset_of!(SockState, records) == 24);
    assert!(size_of::<SockState>() == 24 + 48 * SOCK_DESTINATIONS);
    // The storage element (72 bytes of header, then the value) stays in the 256-byte slab.
    assert!(72 + size_of::<SockState>() <= 256);
    assert!(size_of::<SocketEntry>() == 8 + size_of::<SockState>());
    assert!(size_of::<SockAddrs>() == 16);
    assert!(offset_of!(SockAddrs, peer_port_be) == 8);
    assert!(offset_of!(SockAddrs, family) == 12);
    assert!(offset_of!(SockAddrs, tcp_state) == 14);
    assert!(offset_of!(UdpSocketEntry, addrs) == 8);
    assert!(offset_of!(UdpSocketEntry, state) == 24);
    assert!(size_of::<UdpSocketEntry>() == 24 + size_of::<SockState>());
    assert!(size_of::<DatapathConfig>() == 40);
    assert!(offset_of!(DatapathConfig, tiers) == 8);
    assert!(offset_of!(DatapathConfig, pod_level) == 24);
    assert!(offset_of!(DatapathConfig, flags) == 28);
    assert!(offset_of!(DatapathConfig, index_secret) == 32);
    assert!(size_of::<ConnRecord>() == 72);
    assert!(offset_of!(ConnRecord, frontend) == 24);
    assert!(offset_of!(ConnRecord, backend) == 44);
    assert!(offset_of!(ConnRecord, service_id) == 64);
    assert!(offset_of!(ConnRecord, slot) == 68);
    assert!(CONNECTION_SLOTS.is_power_of_two());
    assert!(size_of::<SlotsHeld>() == SLOTS_PER_HELD as usize);
    assert!(CONNECTION_SLOTS.is_multiple_of(SLOTS_PER_HELD));
    assert!(size_of::<MonitorState>() == 8);
    assert!(size_of::<Event>() == 64);
    assert!(offset_of!(Event, frontend) == 16);
    assert!(offset_of!(Event, backend) == 36);
    assert!(offset_of!(Event, service_id) == 56);
    assert!(offset_of!(Event, kind) == 60);
    assert!(EVENTS_BYTES.is_power_of_two());
    assert!(size_of::<AffinityEntry>() == 48);
    assert!(offset_of!(AffinityEntry, backend) == 16);
    assert!(offset_of!(AffinityEntry, service_id) == 36);
    assert!(offset_of!(AffinityEntry, slot) == 40);
    assert!(size_of::<AffinityTable>() == 48 * AFFINITY_WAYS);
    assert!(AFFINITY_WAYS.is_power_of_two());
    assert!(AFFINITY_BUCKET.is_power_of_two() && AFFINITY_WAYS / AFFINITY_BUCKET >= 2);
    assert!(size_of::<ServiceMeta>() == 200);
    assert!(offset_of!(ServiceMeta, port) == 192);
    assert!(offset_of!(ServiceMeta, scope) == 196);
    // The descriptor table is indexed by `MapId`, and the counters by `Counter`.
    let mut i = 0;
    while i < MAPS.len() {
        assert!(MAPS[i].id as usize == i);
        assert!(MapId::ALL[i] as usize == i);
        i += 1;
    }
    let mut c = 0;
    while c < Counter::ALL.len() {
        assert!(Counter::ALL[c] as usize == c);
        c += 1;
    }
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), contain only integers and integer arrays, and have no
    // implicit padding (asserted above), so every byte pattern is a valid value.
    unsafe impl aya::Pod for super::Frontend4Key {}
    unsafe impl aya::Pod for super::FrontendKey {}
    unsafe impl aya::Pod for super::Frontend {}
    unsafe impl aya::Pod for super::IndexEntry {}
    unsafe impl aya::Pod for super::IndexEntry6 {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::SockRecord {}
    unsafe impl aya::Pod for super::SockState {}
    unsafe impl aya::Pod for super::DatapathConfig {}
    unsafe impl aya::Pod for super::ConnRecord {}
    unsafe impl aya::Pod for super::SlotsHeld {}
    unsafe impl aya::Pod for super::MonitorState {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::AffinityEntry {}
    unsafe impl aya::Pod for super::AffinityTable {}
    unsafe impl aya::Pod for super::ServiceMeta {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::{Frontend4Key, index};

    /// The share of `n` keys that get a slot of their own, under a few secrets (the lowest).
    fn least_held(keys: &[Frontend4Key]) -> f64 {
        [0, 1, 0x0123_4567_89ab_cdef, u64::MAX, 0x9e37_79b9_7f4a_7c15]
            .iter()
            .map(|&secret| {
                let mut taken = vec![false; index::SLOTS as usize];
                let held = keys
                    .iter()
                    .filter(|k| {
                        !std::mem::replace(&mut taken[index::slot(k, secret) as usize], true)
                    })
                    .count();
                held as f64 / keys.len() as f64
            })
            .fold(1.0, f64::min)
    }

    fn key(addr: [u8; 4], port: u16) -> Frontend4Key {
        Frontend4Key {
            addr: u32::from_ne_bytes(addr),
            port_be: port.to_be(),
            protocol: 6,
            _pad: 0,
        }
    }

    /// The IPv6 index scatters consecutive addresses as random keys would be (the same bound as
    /// the IPv4 test's below).
    #[test]
    fn consecutive_ipv6_cluster_ips_are_held_as_random_keys_would_be() {
        let n = 5_000u32;
        let a = f64::from(n) / f64::from(index::SLOTS6);
        let random = (1.0 - (-a).exp()) / a;
        let keys: Vec<super::FrontendKey> = (0..n)
            .map(|i| super::FrontendKey {
                addr: [0xfd00_u32.to_be(), 0x96_u32.to_be(), 0, i.to_be()],
                port_be: 80u16.to_be(),
                protocol: 6,
                family: 6,
            })
            .collect();
        for secret in [0, 1, 0x0123_4567_89ab_cdef, u64::MAX] {
            let mut taken = vec![false; index::SLOTS6 as usize];
            let held = keys
                .iter()
                .filter(|k| !std::mem::replace(&mut taken[index::slot6(k, secret) as usize], true))
                .count();
            let share = held as f64 / f64::from(n);
            assert!(share > random - 0.03, "{share} held, random keys {random}");
        }
    }

    /// Keys thrown into `SLOTS` slots at random: each gets one of its own with probability
    /// (1 - e^-a) / a at load a = keys / slots. Service addresses set by hand or by a tool
    /// often come in runs, and a service has several ports: the slot must scatter consecutive
    /// addresses, and one address's ports, as well.
    #[test]
    fn consecutive_cluster_ips_are_held_as_random_keys_would_be() {
        let n = 10_000u32;
        let a = f64::from(n) / f64::from(index::SLOTS);
        let random = (1.0 - (-a).exp()) / a;
        let consecutive: Vec<_> = (0..n)
            .map(|i| key((0x0a64_0000 + i).to_be_bytes(), 80))
            .collect();
        let ports: Vec<_> = (0..n / 4)
            .flat_map(|i| [53, 80, 443, 8080].map(|p| key((0x0a60_0001 + i).to_be_bytes(), p)))
            .collect();
        for (what, keys) in [("consecutive", consecutive), ("four ports", ports)] {
            let held = least_held(&keys);
            assert!(
                held > random - 0.02,
                "{what}: {held:.3} of the keys hold a slot, random keys {random:.3}"
            );
        }
    }
}
