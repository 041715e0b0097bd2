//! The map ABI shared by socklb's eBPF programs (`lb-ebpf`) and its agent (`lb-userspace`).
//!
//! Every type here is `#[repr(C)]`, has no implicit padding (padding is spelled out as `_pad`
//! fields that are always zero), and holds no `bool`/`Option`: the verifier and the map syscalls
//! see raw bytes, and a hash map key with garbage padding would never be found. Sizes and field
//! offsets are asserted at compile time.
//!
//! Addresses and ports are kept in network byte order, exactly as `struct bpf_sock_addr` hands them
//! to the programs, so the hot path never swaps bytes. An IPv4 address lives in `addr[0]` with the
//! other three words zero.
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

/// Names of the maps in the eBPF object; also the file names under the pin folder.
pub mod map_name {
    pub const FRONTENDS: &str = "FRONTENDS";
    pub const SLOTS: &str = "SLOTS";
    pub const BACKENDS: &str = "BACKENDS";
    pub const SOCK_STATE: &str = "SOCK_STATE";
    pub const AFFINITY: &str = "AFFINITY";
    pub const COUNTERS: &str = "COUNTERS";
    /// Created by the agent (the programs never read it): service names for `inspect` and for
    /// recovering service ids after a restart.
    pub const SERVICE_META: &str = "SERVICE_META";
}

/// Default capacities; the agent can override each one at load time.
pub mod capacity {
    pub const FRONTENDS: u32 = 65_536;
    pub const SLOTS: u32 = 262_144;
    pub const BACKENDS: u32 = 131_072;
    pub const AFFINITY: u32 = 65_536;
    /// Live translated sockets (their reverse-translation state).
    pub const SOCK_STATE: u32 = 131_072;
    pub const SERVICE_META: u32 = 65_536;
}

/// Indexes into the per-CPU `COUNTERS` array. Every connect or sendmsg addressed to a
/// frontend ends in exactly one of `TRANSLATIONS`, `NO_BACKEND` or `ERRORS`, so their sum is
/// the number of service lookups (not counted separately: one update less on the hot path).
pub mod counter {
    /// A destination was rewritten to a backend.
    pub const TRANSLATIONS: u32 = 0;
    /// A connect or sendmsg was refused because the service had no active backend.
    pub const NO_BACKEND: u32 = 1;
    /// A session-affinity entry chose the backend.
    pub const AFFINITY_HITS: u32 = 2;
    /// getpeername or recvmsg reported the service address instead of the backend's.
    pub const REVERSE_TRANSLATIONS: u32 = 3;
    /// An unconnected UDP socket kept the backend it used before.
    pub const STICKY_HITS: u32 = 4;
    /// A frontend pointed at a missing slot or backend (should never happen; the reconciler's
    /// write order prevents it).
    pub const ERRORS: u32 = 5;
    /// `SOCK_STATE` was full: the socket was translated, but getpeername/recvmsg will show the
    /// backend's address and UDP stickiness is lost for it.
    pub const SOCK_STATE_FULL: u32 = 6;
    /// Number of counters (the array's size).
    pub const COUNT: u32 = 8;
    /// Names, by index, as exported in metrics and `socklb inspect stats`.
    pub const NAMES: [&str; 7] = [
        "translations",
        "no_backend",
        "affinity_hits",
        "reverse_translations",
        "sticky_hits",
        "errors",
        "sock_state_full",
    ];
}

/// `Frontend::flags`: the service has `sessionAffinity: ClientIP`.
pub const FRONTEND_FLAG_AFFINITY: u16 = 1;
/// `Frontend::flags`: the frontend is reached from outside the cluster's service network
/// (NodePort, externalIP, load-balancer ingress), so externalTrafficPolicy applies.
pub const FRONTEND_FLAG_EXTERNAL: u16 = 2;

/// `ServiceMeta::scope` values.
pub const SCOPE_INTERNAL: u8 = 0;
pub const SCOPE_EXTERNAL: u8 = 1;

/// A service address as a client dials it: `FRONTENDS` key.
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

/// `FRONTENDS` value. The programs choose among slots `1..=count` of `service_id`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frontend {
    /// Identifies the backend set (one service port, one family, one traffic scope).
    pub service_id: u32,
    /// Active backends; 0 means the service rejects connects with ECONNREFUSED.
    pub count: u16,
    pub flags: u16,
    /// sessionAffinity ClientIP timeout, seconds (0 when affinity is off).
    pub affinity_timeout_s: u32,
    pub _pad: u32,
}

/// `SLOTS` key; the value is a backend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    pub service_id: u32,
    /// 1-based.
    pub slot: u32,
}

/// `BACKENDS` value, keyed by backend id (u32).
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

/// Per-socket state (`SOCK_STATE`, keyed by socket cookie): what a socket was translated to, so
/// getpeername and recvmsg can report the service address, and an unconnected UDP socket keeps
/// its backend. The `sock_release` program deletes it when the socket goes, so it cannot leak.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// The service address the socket dialled.
    pub frontend: FrontendKey,
    /// Where it was sent instead.
    pub backend: Backend,
    pub service_id: u32,
    pub backend_id: u32,
    pub slot: u32,
    pub _pad: u32,
}

/// `AFFINITY` key: one client (a pod: its network namespace, plus its source address when the
/// socket was bound to one) of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    /// Network byte order; zero when the socket had no bound source address.
    pub client: [u32; 4],
    pub service_id: u32,
    pub family: u8,
    pub _pad: [u8; 3],
}

/// `AFFINITY` value. Valid while `slot` still holds `backend_id` within the frontend's count and
/// the entry was used less than the timeout ago.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    /// `bpf_ktime_get_ns()` of the last connect that used this entry.
    pub last_used_ns: u64,
    pub backend_id: u32,
    pub slot: u32,
}

/// Longest `namespace/name` kept in `ServiceMeta` (Kubernetes allows 63 + 1 + 63).
pub const SERVICE_NAME_LEN: usize = 128;
/// Longest service port name (Kubernetes allows 15).
pub const PORT_NAME_LEN: usize = 16;

/// `SERVICE_META` value, keyed by service id: which Kubernetes service port a backend set is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceMeta {
    /// `namespace/name`, UTF-8, zero padded.
    pub name: [u8; SERVICE_NAME_LEN],
    /// The service port's name, UTF-8, zero padded (empty for a single unnamed port).
    pub port_name: [u8; PORT_NAME_LEN],
    /// The service port (host byte order).
    pub port: u16,
    pub protocol: u8,
    pub family: u8,
    /// `SCOPE_INTERNAL` or `SCOPE_EXTERNAL`.
    pub scope: u8,
    pub _pad: [u8; 3],
}

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
    assert!(size_of::<FrontendKey>() == 20);
    assert!(offset_of!(FrontendKey, port_be) == 16);
    assert!(offset_of!(FrontendKey, protocol) == 18);
    assert!(offset_of!(FrontendKey, family) == 19);
    assert!(size_of::<Frontend>() == 16);
    assert!(offset_of!(Frontend, count) == 4);
    assert!(offset_of!(Frontend, flags) == 6);
    assert!(offset_of!(Frontend, affinity_timeout_s) == 8);
    assert!(size_of::<SlotKey>() == 8);
    assert!(size_of::<Backend>() == 20);
    assert!(offset_of!(Backend, port_be) == 16);
    assert!(offset_of!(Backend, family) == 18);
    assert!(size_of::<SockState>() == 56);
    assert!(offset_of!(SockState, backend) == 20);
    assert!(offset_of!(SockState, service_id) == 40);
    assert!(size_of::<AffinityKey>() == 32);
    assert!(offset_of!(AffinityKey, client) == 8);
    assert!(offset_of!(AffinityKey, service_id) == 24);
    assert!(offset_of!(AffinityKey, family) == 28);
    assert!(size_of::<AffinityValue>() == 16);
    assert!(size_of::<ServiceMeta>() == 152);
    assert!(offset_of!(ServiceMeta, port) == 144);
    assert!(offset_of!(ServiceMeta, scope) == 148);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), contain only integers and integer arrays, and have no
    // implicit padding (asserted above), so every byte pattern is a valid value.
    unsafe impl aya::Pod for super::FrontendKey {}
    unsafe impl aya::Pod for super::Frontend {}
    unsafe impl aya::Pod for super::SlotKey {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::SockState {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
    unsafe impl aya::Pod for super::ServiceMeta {}
}
