//! The maps, as BTF-defined maps. Their names, types and default sizes are `lb_common`'s map
//! table; the agent resizes them at load time and pins them so state survives its restarts.
use aya_ebpf::{
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, SkStorage},
    macros::btf_map,
};
use lb_common::{
    AffinityTable, Backend, ConnRecord, Counter, DatapathConfig, Event, Frontend, Frontend4Key,
    FrontendKey, IndexEntry, IndexEntry6, MAP_F_MMAPABLE, MAP_F_NO_PREALLOC, MapId, MonitorState,
    ServiceMeta, SlotsHeld, SockState,
};

const fn size(id: MapId) -> usize {
    id.default_capacity() as usize
}

/// IPv4 service address → backend range. Written only by the agent, so entries are allocated on
/// insert (no preallocation) and an empty map costs nothing.
#[btf_map]
pub(crate) static FRONTENDS4: HashMap<
    Frontend4Key,
    Frontend,
    { size(MapId::Frontends4) },
    { MAP_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Most IPv4 frontends again, one per slot of a direct-mapped array (`lb_common::index`): read
/// before `FRONTENDS4`, one array load instead of a hash lookup. Mmapable only for its layout:
/// the kernel then starts the values on a page, so no 32-byte entry straddles two cache lines.
#[btf_map]
pub(crate) static FRONTEND_INDEX: Array<
    IndexEntry,
    { size(MapId::FrontendIndex) },
    { MAP_F_MMAPABLE as usize },
> = Array::new();

/// The IPv6 frontend index (`lb_common::IndexEntry6`), as `FRONTEND_INDEX` for IPv4: read before
/// `FRONTENDS6`. Mmapable for its layout: each 64-byte entry is one cache line.
#[btf_map]
pub(crate) static FRONTEND_INDEX6: Array<
    IndexEntry6,
    { size(MapId::FrontendIndex6) },
    { MAP_F_MMAPABLE as usize },
> = Array::new();

/// IPv6 service address → backend range.
#[btf_map]
pub(crate) static FRONTENDS6: HashMap<
    FrontendKey,
    Frontend,
    { size(MapId::Frontends6) },
    { MAP_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Backend sets, each a contiguous range that the agent never rewrites while a frontend uses it.
#[btf_map]
pub(crate) static BACKENDS: Array<Backend, { size(MapId::Backends) }> = Array::new();

/// The frontend port bitmap, the frontend filter and the backend port bitmap
/// (`lb_common::ports`): the connect and reverse prefilters.
#[btf_map]
pub(crate) static PORTS: Array<u64, { size(MapId::Ports) }> = Array::new();

/// Each translated socket's state, in the socket's own storage: created at connect (or the
/// first sendmsg), freed by the kernel with the socket. No shared capacity to exhaust.
#[btf_map]
pub(crate) static SOCKETS: SkStorage<SockState> = SkStorage::new();

/// Translated connects (TCP connections and connected UDP sockets), one slot per socket cookie
/// (its low bits): taken at connect when free, freed by the release program. Preallocated, so a connection costs no allocation; a
/// connection whose slot another live one holds keeps its record in `SOCKETS` instead. The
/// agent reads it in place (mmap).
#[btf_map]
pub(crate) static CONNECTIONS: Array<
    ConnRecord,
    { size(MapId::Connections) },
    { MAP_F_MMAPABLE as usize },
> = Array::new();

/// A byte per `CONNECTIONS` slot, 1 while a socket may hold it (`lb_common::SlotsHeld`): a
/// socket that holds no slot (most sockets on a node never meet a Service) is told so by a
/// line of 128 KiB that stays in the cache, not by its slot's line in 9 MiB. Mmapable only for
/// its layout (values start on a page, so an entry is one cache line).
#[btf_map]
pub(crate) static SLOTS_HELD: Array<
    SlotsHeld,
    { size(MapId::SlotsHeld) },
    { MAP_F_MMAPABLE as usize },
> = Array::new();

/// Socket records per pod: counted up when a record is created and down when its socket
/// closes (the release program), so the count is what the pod holds, with or without an agent.
/// Read as a signed number: a count forgotten by the LRU and started again may go below zero
/// when older sockets close, which only lets that pod through. An LRU, so a node with more pods
/// than entries forgets the least recently active pod's count, not anyone's records.
#[btf_map]
pub(crate) static SOCKET_QUOTA: LruHashMap<u64, u64, { size(MapId::SocketQuota) }> =
    LruHashMap::new();

/// The agent's settings (one entry).
#[btf_map]
pub(crate) static CONFIG: Array<DatapathConfig, { size(MapId::Config) }> = Array::new();

/// sessionAffinity ClientIP: one fixed table per client cgroup.
#[btf_map]
pub(crate) static AFFINITY: LruHashMap<u64, AffinityTable, { size(MapId::Affinity) }> =
    LruHashMap::new();

/// One all-zero table that a new client's table is copied from (it does not fit on the stack).
#[btf_map]
pub(crate) static AFFINITY_EMPTY: Array<AffinityTable, { size(MapId::AffinityEmpty) }> =
    Array::new();

/// Service id → which Kubernetes service port it is. Only the agent and `socklb inspect` read
/// it; declared here so it is created, sized and pinned with the others.
#[btf_map]
pub(crate) static SERVICE_META: HashMap<
    u32,
    ServiceMeta,
    { size(MapId::ServiceMeta) },
    { MAP_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Per-CPU event counters, indexed by `lb_common::Counter`.
#[btf_map]
pub(crate) static COUNTERS: PerCpuArray<u64, { size(MapId::Counters) }> = PerCpuArray::new();

/// The decisions, while `socklb monitor` reads them (`MONITOR`).
#[btf_map]
pub(crate) static EVENTS: RingBuf<Event, { size(MapId::Events) }> = RingBuf::new();

/// Whether someone reads `EVENTS`, and until when.
#[btf_map]
pub(crate) static MONITOR: Array<MonitorState, { size(MapId::Monitor) }> = Array::new();

#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU value, only this CPU's program invocation touches it.
        unsafe { *value += 1 };
    }
}
