//! The maps, as BTF-defined maps. Types and default sizes come from `lb-common`; the agent can
//! resize each one at load time and pins them so state survives its restarts.
use aya_ebpf::{
    btf_maps::{HashMap, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use lb_common::{
    AffinityKey, AffinityValue, Backend, Frontend, FrontendKey, ServiceMeta, SlotKey, SockState,
    capacity, counter,
};

/// Service address → backend set and active count.
#[btf_map]
pub static FRONTENDS: HashMap<FrontendKey, Frontend, { capacity::FRONTENDS as usize }> =
    HashMap::new();

/// (service id, slot 1..=count) → backend id.
#[btf_map]
pub static SLOTS: HashMap<SlotKey, u32, { capacity::SLOTS as usize }> = HashMap::new();

/// Backend id → address.
#[btf_map]
pub static BACKENDS: HashMap<u32, Backend, { capacity::BACKENDS as usize }> = HashMap::new();

/// Per-socket translation record, by socket cookie. Preallocated (an insert allocates nothing
/// on the connect path); the `sock_release` program deletes the entry with the socket.
#[btf_map]
pub static SOCK_STATE: HashMap<u64, SockState, { capacity::SOCK_STATE as usize }> = HashMap::new();

/// sessionAffinity ClientIP: client of a service → backend, with last use.
#[btf_map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue, { capacity::AFFINITY as usize }> =
    LruHashMap::new();

/// Service id → which Kubernetes service port it is. Only the agent and `socklb inspect` read it;
/// it is declared here so it is created, sized and pinned together with the others.
#[btf_map]
pub static SERVICE_META: HashMap<u32, ServiceMeta, { capacity::SERVICE_META as usize }> =
    HashMap::new();

/// Per-CPU event counters, indexed by `lb_common::counter`.
#[btf_map]
pub static COUNTERS: PerCpuArray<u64, { counter::COUNT as usize }> = PerCpuArray::new();

#[inline(always)]
pub fn count(index: u32) {
    if let Some(value) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU value, only this CPU's program invocation touches it.
        unsafe { *value += 1 };
    }
}
