//! The narrow interface through which the reconciler writes the maps: one write at a time
//! (`MapWrite`), and a read of everything back (`MapSnapshot`). Two implementations of
//! `ServiceMaps`: the real BPF maps (`bpf.rs`) and `InMemoryMaps` here, which unit tests use and
//! which can fail writes on purpose. A write the maps refuse is a `MapWriteError`.
//!
//! "Which backends does this address reach" is read from a snapshot in one place,
//! `MapSnapshot::reach` (over `MapSnapshot::range`; `reach_as_read` also reads the frontend
//! index as the programs do): `explain`, `inspect lookup`, `inspect sockets`, the connections
//! view, the tests and the conformance runner all call it.
use std::{collections::BTreeMap, net::SocketAddr};

use lb_common::{
    Backend, FAMILY_IPV4, Frontend, FrontendKey, IndexEntry, IndexEntry6, MapId, ServiceMeta,
    index, ports,
};

use super::abi::{backend_addr, frontend_key, service_addr, service_port_key};
use crate::vocab::{ServiceAddr, ServicePortKey};

/// One map write. The reconciler orders these so the data path never sees a half-written
/// service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapWrite {
    /// To `FRONTENDS4` or `FRONTENDS6`, by the key's family.
    PutFrontend(FrontendKey, Frontend),
    DeleteFrontend(FrontendKey),
    /// Fills `BACKENDS[base ..]`: always a range no frontend uses.
    PutBackends {
        base: u32,
        backends: Vec<Backend>,
    },
    /// Boxed: 200 bytes, where the other writes take at most 32 (a write list is mostly
    /// frontends and backends).
    PutMeta(u32, Box<ServiceMeta>),
    DeleteMeta(u32),
    /// One word of `PORTS` (the frontend filter or the backend port bitmap).
    PutPorts {
        word: u32,
        bits: u64,
    },
}

impl MapWrite {
    /// The write that gives `key` back the frontend it held (`None`: it held none).
    pub fn restore_frontend(key: FrontendKey, old: Option<Frontend>) -> Self {
        old.map_or(Self::DeleteFrontend(key), |f| Self::PutFrontend(key, f))
    }

    /// The map this write goes to.
    pub fn map(&self) -> MapId {
        match self {
            Self::PutFrontend(k, _) | Self::DeleteFrontend(k) => frontends_map(k),
            Self::PutBackends { .. } => MapId::Backends,
            Self::PutMeta(..) | Self::DeleteMeta(_) => MapId::ServiceMeta,
            Self::PutPorts { .. } => MapId::Ports,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(self, Self::DeleteFrontend(_) | Self::DeleteMeta(_))
    }
}

/// Which frontend map holds a key.
pub fn frontends_map(key: &FrontendKey) -> MapId {
    if key.family == lb_common::FAMILY_IPV4 {
        MapId::Frontends4
    } else {
        MapId::Frontends6
    }
}

impl std::fmt::Display for MapWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let frontend =
            |k: &FrontendKey| service_addr(k).map_or_else(|| format!("{k:?}"), |a| a.to_string());
        match self {
            Self::PutFrontend(k, v) => write!(
                f,
                "put frontend {} = service {} backends {}+{}",
                frontend(k),
                v.service_id,
                v.base,
                v.count
            ),
            Self::DeleteFrontend(k) => write!(f, "delete frontend {}", frontend(k)),
            Self::PutBackends { base, backends } => {
                let list: Vec<String> = backends
                    .iter()
                    .map(|b| backend_addr(b).map_or_else(|| "<empty>".into(), |a| a.to_string()))
                    .collect();
                write!(f, "put backends {base}.. = [{}]", list.join(", "))
            }
            Self::PutMeta(id, m) => write!(
                f,
                "put meta {id} = {}",
                service_port_key(m).map_or_else(|| "<invalid>".into(), |k| k.to_string())
            ),
            Self::DeleteMeta(id) => write!(f, "delete meta {id}"),
            Self::PutPorts { word, bits } => write!(f, "put ports word {word} = {bits:#018x}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapWriteError {
    #[error("map {} is full ({capacity} entries)", .map.name())]
    Full { map: MapId, capacity: u32 },
    #[error("map {} has no free range of {wanted} entries ({free} free, {waiting} waiting out their grace period)", MapId::Backends.name())]
    NoRange {
        wanted: u32,
        free: u32,
        waiting: u32,
    },
    #[error("writing map {}", .map.name())]
    Io {
        map: MapId,
        #[source]
        source: std::io::Error,
    },
    #[error("injected failure writing map {}", .map.name())]
    Injected { map: MapId },
    /// A full sync's queued write failed and the maps could not be read back: nothing is
    /// written until they can be.
    #[error("what the maps hold is not known since a write failed")]
    Unread(#[source] MapReadError),
    /// No free range for a changed set (the backend array is at its size: at the memory
    /// ceiling, or until it grows): the set keeps the room it has, with `serving` of its
    /// `wanted` endpoints swapped into it; no other set gives up room for it.
    #[error("map {} has no free range for the set: serving {serving} of its {wanted} endpoints in the room it has ({free} free elsewhere, {waiting} waiting out their grace period) until room frees", MapId::Backends.name())]
    AtCeiling {
        wanted: u32,
        serving: u32,
        free: u32,
        waiting: u32,
    },
    /// Some of the set's frontends did not fit (the others are written): the newest claims
    /// wait for room.
    #[error("map {} is full: {left_out} of the set's addresses are not served until room frees ({}), the others are", .map.name(), .addresses.join(", "))]
    FrontendsLeftOut {
        map: MapId,
        left_out: usize,
        addresses: Vec<String>,
    },
}

impl MapWriteError {
    pub fn kind(&self) -> crate::vocab::ErrorKind {
        use crate::vocab::ErrorKind;
        match self {
            Self::Full { .. }
            | Self::NoRange { .. }
            | Self::AtCeiling { .. }
            | Self::FrontendsLeftOut { .. } => ErrorKind::MapFull,
            Self::Io { .. } | Self::Unread(_) => ErrorKind::MapWrite,
            Self::Injected { .. } => ErrorKind::Injected,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("reading map {}", .map.name())]
pub struct MapReadError {
    pub map: MapId,
    #[source]
    pub source: std::io::Error,
}

impl MapReadError {
    pub fn new(map: MapId, source: impl Into<std::io::Error>) -> Self {
        Self {
            map,
            source: source.into(),
        }
    }
}

/// What a service address reaches, read from a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reach {
    pub service_id: u32,
    pub frontend: Frontend,
    /// The backend set, in slot order (`None` for an entry that holds no address).
    pub backends: Vec<Option<SocketAddr>>,
}

/// How the programs find a frontend: its slot in its family's index (`FRONTEND_INDEX`,
/// `FRONTEND_INDEX6`) as they read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexRead {
    /// The slot holds this frontend and its check holds: the programs use this copy and do not
    /// read the family's hash map (`FRONTENDS4`, `FRONTENDS6`).
    Held { slot: u32, frontend: Frontend },
    /// The slot is empty: they read the hash map.
    Empty { slot: u32 },
    /// Another frontend holds the slot: they read the hash map.
    Taken { slot: u32, holder: FrontendKey },
    /// The slot has this frontend's key but fails its check (torn, or written under another
    /// secret): they read the hash map.
    Failed { slot: u32 },
}

impl IndexRead {
    /// The verdict on the entry at `slot`, of either family: whether it `holds` the key whole,
    /// whether it has the key (`same_key`), whether it is `empty`, its frontend and its key.
    fn of(
        slot: u32,
        holds: bool,
        same_key: bool,
        empty: bool,
        frontend: Frontend,
        holder: FrontendKey,
    ) -> Self {
        if holds {
            Self::Held { slot, frontend }
        } else if same_key {
            Self::Failed { slot }
        } else if empty {
            Self::Empty { slot }
        } else {
            Self::Taken { slot, holder }
        }
    }
}

/// `FRONTEND_INDEX` and `FRONTEND_INDEX6` as read from their maps, with the secret the programs
/// check their entries with.
#[derive(Clone, Debug, Default)]
pub struct IndexView {
    pub secret: u64,
    pub entries: Vec<IndexEntry>,
    /// `None`: a generation from before the IPv6 index (its programs read `FRONTENDS6`).
    pub entries6: Option<Vec<IndexEntry6>>,
}

impl IndexView {
    /// What a connect to `key` finds in its family's index (`None`: the family has none).
    pub fn read(&self, key: &FrontendKey) -> Option<IndexRead> {
        if key.family != FAMILY_IPV4 {
            let slot = index::slot6(key, self.secret);
            let e = self
                .entries6
                .as_ref()?
                .get(slot as usize)
                .copied()
                .unwrap_or_default();
            let empty = e == IndexEntry6::default();
            return Some(IndexRead::of(
                slot,
                e.holds(key, self.secret),
                e.key == *key,
                empty,
                e.frontend,
                e.key,
            ));
        }
        let key4 = key.v4();
        let slot = index::slot(&key4, self.secret);
        let e = self.entries.get(slot as usize).copied().unwrap_or_default();
        let holder = FrontendKey {
            addr: [e.key.addr, 0, 0, 0],
            port_be: e.key.port_be,
            protocol: e.key.protocol,
            family: FAMILY_IPV4,
        };
        let empty = e == IndexEntry::default();
        Some(IndexRead::of(
            slot,
            e.holds(&key4, self.secret),
            e.key == key4,
            empty,
            e.frontend,
            holder,
        ))
    }

    /// The frontends the indexes hold.
    pub fn frontends(&self) -> impl Iterator<Item = Frontend> + '_ {
        let v4 = self
            .entries
            .iter()
            .filter(|e| **e != IndexEntry::default())
            .map(|e| e.frontend);
        let v6 = self
            .entries6
            .iter()
            .flatten()
            .filter(|e| **e != IndexEntry6::default())
            .map(|e| e.frontend);
        v4.chain(v6)
    }
}

/// The non-empty entries of the backend array, by index: a vector as long as the highest index
/// held (the agent packs its ranges from the start of the array), where an ordered map took a
/// tree node per few entries and a search per write. An IPv4 entry is one packed word, 8 bytes
/// where the map's value takes 20 (0.8 MiB for 100,000 backends instead of 2); any other value
/// (IPv6, or bytes an IPv4 entry does not use) is kept whole beside the words, so the mirror
/// gives back every byte that was written or read.
#[derive(Clone, Default)]
pub struct BackendSlots {
    /// `EMPTY`, an IPv4 entry packed (`pack_v4`), or `WIDE` plus an index into `wide`.
    slots: Vec<u64>,
    wide: Vec<Backend>,
    /// Indexes of `wide` no slot uses.
    free: Vec<u32>,
}

/// A slot that holds no backend (the map's all-zero value).
const EMPTY: u64 = 0;
/// The family byte of a slot kept in `wide`, the low 32 bits its index there: no packed entry
/// has it (theirs is `FAMILY_IPV4`).
const WIDE: u64 = 0xff << 48;

/// Where in `wide` a slot's entry is, if it is kept there.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a wide slot's low 32 bits are its index in `wide`"
)]
fn wide_index(word: u64) -> Option<usize> {
    (word & WIDE == WIDE).then_some(word as u32 as usize)
}

/// An IPv4 entry as one word: address, port, family and padding byte. Never `EMPTY` or `WIDE`
/// (its family byte is `FAMILY_IPV4`).
fn pack_v4(b: &Backend) -> Option<u64> {
    (b.family == lb_common::FAMILY_IPV4 && b.addr[1..] == [0, 0, 0]).then(|| {
        u64::from(b.addr[0])
            | u64::from(b.port_be) << 32
            | u64::from(b.family) << 48
            | u64::from(b._pad) << 56
    })
}

#[allow(
    clippy::cast_possible_truncation,
    reason = "each field is taken from its own bits of the word"
)]
fn unpack_v4(word: u64) -> Backend {
    Backend {
        addr: [word as u32, 0, 0, 0],
        port_be: (word >> 32) as u16,
        family: (word >> 48) as u8,
        _pad: (word >> 56) as u8,
    }
}

impl BackendSlots {
    /// The entry at `index`, unless it is empty.
    pub fn get(&self, index: u32) -> Option<Backend> {
        self.entry(*self.slots.get(index as usize)?)
    }

    fn entry(&self, word: u64) -> Option<Backend> {
        match (word, wide_index(word)) {
            (EMPTY, _) => None,
            (_, Some(at)) => self.wide.get(at).copied(),
            (w, None) => Some(unpack_v4(w)),
        }
    }

    /// Writes `index` (an empty `backend` clears it).
    pub fn insert(&mut self, index: u32, backend: Backend) {
        let i = index as usize;
        if i >= self.slots.len() {
            if backend == Backend::default() {
                return;
            }
            self.slots.resize(i + 1, EMPTY);
        }
        let old = self.slots[i];
        let word = if backend == Backend::default() {
            EMPTY
        } else if let Some(packed) = pack_v4(&backend) {
            packed
        } else if let Some(at) = wide_index(old) {
            // Overwritten in place: the slot keeps its place in `wide`.
            self.wide[at] = backend;
            return;
        } else {
            let at = if let Some(at) = self.free.pop() {
                self.wide[at as usize] = backend;
                at
            } else {
                self.wide.push(backend);
                u32::try_from(self.wide.len() - 1).expect("fewer wide entries than slots")
            };
            WIDE | u64::from(at)
        };
        if let Some(at) = wide_index(old) {
            self.wide[at] = Backend::default();
            self.free
                .push(u32::try_from(at).expect("read from 32 bits"));
        }
        self.slots[i] = word;
    }

    pub fn remove(&mut self, index: u32) {
        self.insert(index, Backend::default());
    }

    /// The non-empty entries, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Backend)> + '_ {
        (0u32..)
            .zip(&self.slots)
            .filter_map(|(i, w)| Some((i, self.entry(*w)?)))
    }
}

/// The entries by index, as the map holds them (not the packed words).
impl std::fmt::Debug for BackendSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl PartialEq for BackendSlots {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for BackendSlots {}

/// A `SERVICE_META` value as a snapshot keeps it: its two names without their trailing zero
/// padding, then its fixed fields. About 30 bytes for a 200-byte value, and the agent mirrors
/// one per backend set (2 MiB at 10,000 Services, boxed whole). Lossless: only trailing zeros
/// are left out, so `unpack` gives back every byte `pack` took, whoever wrote the value.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedMeta(Box<[u8]>);

impl PackedMeta {
    /// The fixed fields after the names: port (2 bytes), protocol, family, scope, padding (3).
    const TAIL: usize = 8;

    pub fn pack(meta: &ServiceMeta) -> Self {
        let used = |b: &[u8]| b.iter().rposition(|c| *c != 0).map_or(0, |i| i + 1);
        let (name, port_name) = (used(&meta.name), used(&meta.port_name));
        let mut out = Vec::with_capacity(1 + name + port_name + Self::TAIL);
        const {
            assert!(
                lb_common::SERVICE_NAME_LEN < 256,
                "a name's length fits a byte"
            );
        }
        out.push(name as u8);
        out.extend_from_slice(&meta.name[..name]);
        out.extend_from_slice(&meta.port_name[..port_name]);
        out.extend_from_slice(&meta.port.to_le_bytes());
        out.extend_from_slice(&[meta.protocol, meta.family, meta.scope]);
        out.extend_from_slice(&meta._pad);
        Self(out.into())
    }

    pub fn unpack(&self) -> ServiceMeta {
        let b = &self.0;
        let name = usize::from(b[0]);
        let tail = b.len() - Self::TAIL;
        let mut meta = ServiceMeta::default();
        meta.name[..name].copy_from_slice(&b[1..=name]);
        meta.port_name[..tail - 1 - name].copy_from_slice(&b[1 + name..tail]);
        meta.port = u16::from_le_bytes([b[tail], b[tail + 1]]);
        [meta.protocol, meta.family, meta.scope] = [b[tail + 2], b[tail + 3], b[tail + 4]];
        meta._pad.copy_from_slice(&b[tail + 5..]);
        meta
    }
}

impl std::fmt::Debug for PackedMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.unpack().fmt(f)
    }
}

/// What the service maps hold, in key order. `backends` holds the non-empty entries of the
/// backend array that were read (the ranges frontends use, at least).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapSnapshot {
    pub frontends: BTreeMap<FrontendKey, Frontend>,
    pub backends: BackendSlots,
    /// Packed: the 200-byte value is mostly zero padding.
    pub meta: BTreeMap<u32, PackedMeta>,
    /// Non-zero words of `PORTS`.
    pub ports: BTreeMap<u32, u64>,
}

impl MapSnapshot {
    /// Applies one write, as the kernel would, and returns the write that undoes it, from the
    /// value it replaced (`None` for backends: a range is written only while no frontend uses
    /// it, so there is nothing to undo).
    pub fn apply(&mut self, write: &MapWrite) -> Option<MapWrite> {
        let restore_meta = |id: u32, old: Option<PackedMeta>| {
            old.map_or(MapWrite::DeleteMeta(id), |m| {
                MapWrite::PutMeta(id, Box::new(m.unpack()))
            })
        };
        Some(match write {
            MapWrite::PutFrontend(k, f) => {
                MapWrite::restore_frontend(*k, self.frontends.insert(*k, *f))
            }
            MapWrite::DeleteFrontend(k) => MapWrite::restore_frontend(*k, self.frontends.remove(k)),
            MapWrite::PutBackends { base, backends } => {
                for (i, b) in backends.iter().enumerate() {
                    self.backends.insert(base + i as u32, *b);
                }
                return None;
            }
            MapWrite::PutMeta(id, m) => {
                restore_meta(*id, self.meta.insert(*id, PackedMeta::pack(m)))
            }
            MapWrite::DeleteMeta(id) => restore_meta(*id, self.meta.remove(id)),
            MapWrite::PutPorts { word, bits } => {
                let old = if *bits == 0 {
                    self.ports.remove(word)
                } else {
                    self.ports.insert(*word, *bits)
                };
                MapWrite::PutPorts {
                    word: *word,
                    bits: old.unwrap_or(0),
                }
            }
        })
    }

    /// The backends `frontend` chooses among, in slot order.
    pub fn range(&self, frontend: &Frontend) -> Vec<Option<SocketAddr>> {
        self.slots(frontend.base, u32::from(frontend.count))
            .collect()
    }

    /// The backends in `len` slots from `base` (`None` for a slot that holds none).
    pub fn slots(&self, base: u32, len: u32) -> impl Iterator<Item = Option<SocketAddr>> + '_ {
        (0..len).map(move |i| {
            self.backends
                .get(base.wrapping_add(i))
                .and_then(|b| backend_addr(&b))
        })
    }

    /// What a connect to `addr` would choose among: the one place that reads "which backends a
    /// frontend reaches" from the maps.
    pub fn reach(&self, addr: &ServiceAddr) -> Option<Reach> {
        let frontend = *self.frontends.get(&frontend_key(*addr))?;
        Some(Reach {
            service_id: frontend.service_id,
            frontend,
            backends: self.range(&frontend),
        })
    }

    /// What a connect to `addr` reaches as the programs read the maps: an IPv4 frontend's
    /// `FRONTEND_INDEX` copy when they use it (a copy `FRONTENDS4` no longer agrees with, say
    /// with the agent killed mid-change, is what they use), else `FRONTENDS4` or `FRONTENDS6`;
    /// and what the index held for it.
    pub fn reach_as_read(
        &self,
        addr: &ServiceAddr,
        index: Option<&IndexView>,
    ) -> (Option<Reach>, Option<IndexRead>) {
        let read = index.and_then(|i| i.read(&frontend_key(*addr)));
        let reach = match read {
            Some(IndexRead::Held { frontend, .. }) => Some(Reach {
                service_id: frontend.service_id,
                frontend,
                backends: self.range(&frontend),
            }),
            _ => self.reach(addr),
        };
        (reach, read)
    }

    /// The backend set a service id is, from its metadata.
    pub fn service_port(&self, service_id: u32) -> Option<ServicePortKey> {
        self.meta
            .get(&service_id)
            .and_then(|m| service_port_key(&m.unpack()))
    }

    /// Whether the prefilters pass this service address: its port's bit in the frontend port
    /// bitmap and its bit in the frontend filter (see `lb_common::ports`).
    pub fn filter_bit(&self, key: &FrontendKey) -> bool {
        let udp = key.protocol == lb_common::PROTOCOL_UDP;
        let port = u16::from_be(key.port_be);
        let index = ports::frontend_bit(&key.addr, key.port_be);
        let has = |word: u32, bit: u32| {
            self.ports
                .get(&word)
                .is_some_and(|w| w & ports::bit(bit) != 0)
        };
        has(ports::frontend_port_word(udp, port), u32::from(port))
            && has(ports::frontend_word(udp, index), index)
    }

    /// Whether the backend port bitmap has this port (host byte order).
    pub fn backend_port_bit(&self, udp: bool, port: u16) -> bool {
        self.ports
            .get(&ports::backend_word(udp, port))
            .is_some_and(|w| w & ports::bit(u32::from(port)) != 0)
    }

    /// The entries `map` holds, where a snapshot knows them: each frontend map's keys, the
    /// metadata's, and the `PORTS` words with a bit set. `None` for the others (the backend
    /// array's use is its ranges, which the reconciler knows).
    pub fn entries(&self, map: MapId) -> Option<usize> {
        match map {
            MapId::Frontends4 | MapId::Frontends6 => Some(
                self.frontends
                    .keys()
                    .filter(|k| frontends_map(k) == map)
                    .count(),
            ),
            MapId::ServiceMeta => Some(self.meta.len()),
            MapId::Ports => Some(self.ports.len()),
            _ => None,
        }
    }

    /// Whether a write would add a key to a hash map (and so needs free capacity).
    fn adds_key(&self, write: &MapWrite) -> bool {
        match write {
            MapWrite::PutFrontend(k, _) => !self.frontends.contains_key(k),
            MapWrite::PutMeta(id, _) => !self.meta.contains_key(id),
            _ => false,
        }
    }
}

/// The capacity of every map, indexed by `MapId`, from the descriptor table unless changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities([u32; MapId::ALL.len()]);

impl Default for Capacities {
    fn default() -> Self {
        let mut c = [0; MapId::ALL.len()];
        for id in MapId::ALL {
            c[id as usize] = id.default_capacity();
        }
        Self(c)
    }
}

impl Capacities {
    pub fn get(&self, map: MapId) -> u32 {
        self.0[map as usize]
    }

    #[must_use]
    pub fn with(mut self, map: MapId, capacity: u32) -> Self {
        self.0[map as usize] = capacity;
        self
    }
}

/// Where the reconciler's writes go.
pub trait ServiceMaps: Send {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError>;
    /// Whether a full sync hands these maps' writes to a thread of their own while it plans
    /// the next sets (`Reconciler::sync_all_owned`): worth it where a write is a system call.
    fn queue_writes(&self) -> bool {
        false
    }
    /// Everything the maps hold (the backend array: the ranges frontends use).
    fn read_all(&self) -> Result<MapSnapshot, MapReadError>;
    fn capacities(&self) -> Capacities;
    /// Returns once no program still uses a value it read before the call, so a backend
    /// range no frontend points at any more can be written at once (instead of after the
    /// grace period). `false` where that cannot be known (then ranges wait out the grace).
    fn barrier(&mut self) -> bool {
        true
    }
    /// Each frontend index's map, slots held and slots, where the maps have them.
    fn frontend_indexes(&self) -> Vec<(MapId, usize, u32)> {
        Vec::new()
    }
}

/// Decides whether the n-th write (counting from 0) fails; the flag says whether the write
/// would add a key (the writes a full map refuses).
pub type FailureRule = Box<dyn FnMut(usize, &MapWrite, bool) -> bool + Send>;
/// Runs after every successful write with the maps' new content (invariant checks in tests).
pub type WriteObserver = Box<dyn FnMut(&MapSnapshot, &MapWrite) + Send>;
/// Runs before every write with the maps' current content (checks that a write is safe then).
pub type WriteGuard = Box<dyn FnMut(&MapSnapshot, &MapWrite) + Send>;

/// Maps in memory, with the kernel's capacity limits and optional injected failures.
#[derive(Default)]
pub struct InMemoryMaps {
    pub content: MapSnapshot,
    pub capacities: Capacities,
    writes: usize,
    fail: Option<FailureRule>,
    observer: Option<WriteObserver>,
    guard: Option<WriteGuard>,
    /// Like a kernel without the array-of-maps wait: released ranges wait out their grace.
    no_barrier: bool,
    /// A full sync queues the writes for a thread of their own (`ServiceMaps::queue_writes`).
    queued: bool,
}

impl InMemoryMaps {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacities(capacities: Capacities) -> Self {
        Self {
            capacities,
            ..Self::default()
        }
    }

    /// As maps without a program barrier (see `ServiceMaps::barrier`).
    #[must_use]
    pub fn without_barrier(mut self) -> Self {
        self.no_barrier = true;
        self
    }

    /// As maps whose full-sync writes run on a thread of their own, like the BPF maps'.
    #[must_use]
    pub fn queued(mut self) -> Self {
        self.queued = true;
        self
    }

    /// Makes writes fail when `rule(write_number, write, adds_key)` returns true.
    pub fn fail_when(&mut self, rule: impl FnMut(usize, &MapWrite, bool) -> bool + Send + 'static) {
        self.fail = Some(Box::new(rule));
    }

    pub fn stop_failing(&mut self) {
        self.fail = None;
    }

    /// Calls `observer` after every successful write.
    pub fn observe(&mut self, observer: impl FnMut(&MapSnapshot, &MapWrite) + Send + 'static) {
        self.observer = Some(Box::new(observer));
    }

    /// Calls `guard` before every write, with the content the write applies to.
    pub fn guard(&mut self, guard: impl FnMut(&MapSnapshot, &MapWrite) + Send + 'static) {
        self.guard = Some(Box::new(guard));
    }

    /// Writes attempted so far.
    pub fn writes(&self) -> usize {
        self.writes
    }
}

impl ServiceMaps for InMemoryMaps {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        let n = self.writes;
        self.writes += 1;
        if let Some(guard) = self.guard.as_mut() {
            guard(&self.content, write);
        }
        let adds_key = self.content.adds_key(write);
        let map = write.map();
        if let Some(rule) = self.fail.as_mut()
            && rule(n, write, adds_key)
        {
            return Err(MapWriteError::Injected { map });
        }
        let capacity = self.capacities.get(map);
        let fits = match write {
            MapWrite::PutBackends { base, backends } => {
                u64::from(*base) + backends.len() as u64 <= u64::from(capacity)
            }
            MapWrite::PutPorts { word, .. } => *word < capacity,
            // Both frontend maps together under the capacity: no need to count one of them
            // (counting is linear; a full sync would be quadratic).
            MapWrite::PutFrontend(..) if self.content.frontends.len() < capacity as usize => true,
            _ => !adds_key || self.content.entries(map).unwrap_or(0) < capacity as usize,
        };
        if !fits {
            return Err(MapWriteError::Full { map, capacity });
        }
        self.content.apply(write);
        if let Some(observer) = self.observer.as_mut() {
            observer(&self.content, write);
        }
        Ok(())
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        Ok(self.content.clone())
    }

    fn capacities(&self) -> Capacities {
        self.capacities
    }

    fn barrier(&mut self) -> bool {
        !self.no_barrier
    }

    fn queue_writes(&self) -> bool {
        self.queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(last: u8) -> Backend {
        Backend {
            addr: [u32::from_be_bytes([10, 244, 0, last]).to_be(), 0, 0, 0],
            port_be: 8080u16.to_be(),
            family: lb_common::FAMILY_IPV4,
            ..Backend::default()
        }
    }

    #[test]
    fn the_backend_array_mirror_holds_what_was_written_and_nothing_else() {
        let mut snap = MapSnapshot::default();
        snap.apply(&MapWrite::PutBackends {
            base: 4,
            backends: vec![backend(1), backend(2), Backend::default()],
        });
        assert_eq!(snap.backends.get(4), Some(backend(1)));
        assert_eq!(snap.backends.get(5), Some(backend(2)));
        assert_eq!(snap.backends.get(6), None, "an empty entry is no entry");
        assert_eq!(snap.backends.get(0), None);
        assert_eq!(snap.backends.get(1_000_000), None);
        snap.apply(&MapWrite::PutBackends {
            base: 4,
            backends: vec![Backend::default()],
        });
        let held: Vec<(u32, Backend)> = snap.backends.iter().collect();
        assert_eq!(held, vec![(5, backend(2))]);
        // Equal to a mirror that only ever held index 5, though this one grew past it.
        let mut other = BackendSlots::default();
        other.insert(5, backend(2));
        assert_eq!(snap.backends, other);
        other.remove(5);
        assert_ne!(snap.backends, other);
    }

    /// IPv4 entries are packed, anything else is kept whole: every value comes back as it was
    /// written, through overwrites in any order, and a freed place is used again.
    #[test]
    fn the_backend_array_mirror_gives_back_ipv6_and_unusual_entries_whole() {
        let v6 = |last: u32| Backend {
            addr: [0xfd00_0000_u32.to_be(), 0, 0, last.to_be()],
            port_be: 8443u16.to_be(),
            family: lb_common::FAMILY_IPV6,
            _pad: 0,
        };
        // Bytes an IPv4 entry does not use: another writer's value, kept as read.
        let odd = Backend {
            addr: [backend(9).addr[0], 7, 0, 0],
            _pad: 5,
            ..backend(9)
        };
        let padded = Backend {
            _pad: 0xff,
            ..backend(8)
        };
        let mut slots = BackendSlots::default();
        slots.insert(0, v6(1));
        slots.insert(1, backend(1));
        slots.insert(2, odd);
        slots.insert(3, padded);
        slots.insert(4, v6(2));
        let all: Vec<(u32, Backend)> = slots.iter().collect();
        assert_eq!(
            all,
            vec![
                (0, v6(1)),
                (1, backend(1)),
                (2, odd),
                (3, padded),
                (4, v6(2))
            ]
        );
        // IPv6 over IPv6, IPv4 over IPv6, IPv6 over IPv4, empty over IPv6.
        slots.insert(0, v6(3));
        slots.insert(4, backend(4));
        slots.insert(1, v6(5));
        slots.remove(2);
        assert_eq!(slots.get(0), Some(v6(3)));
        assert_eq!(slots.get(1), Some(v6(5)));
        assert_eq!(slots.get(2), None);
        assert_eq!(slots.get(3), Some(padded));
        assert_eq!(slots.get(4), Some(backend(4)));
        // Six values were kept whole in all, four are now: freed places are used again.
        slots.insert(5, v6(6));
        slots.insert(6, v6(7));
        assert_eq!(slots.wide.len(), 4, "{:?}", slots.wide);
        assert_eq!(slots.get(5), Some(v6(6)));
        assert_eq!(slots.get(6), Some(v6(7)));
        let mut same = BackendSlots::default();
        for (i, b) in [
            v6(3),
            v6(5),
            Backend::default(),
            padded,
            backend(4),
            v6(6),
            v6(7),
        ]
        .into_iter()
        .enumerate()
        {
            same.insert(u32::try_from(i).unwrap(), b);
        }
        assert_eq!(slots, same);
    }

    #[test]
    fn packed_metadata_gives_back_every_byte_and_keeps_only_the_names_used() {
        let mut full = ServiceMeta {
            name: [b'n'; lb_common::SERVICE_NAME_LEN],
            port_name: [b'p'; lb_common::PORT_NAME_LEN],
            port: 0xfffe,
            protocol: 17,
            family: 10,
            scope: 1,
            _pad: [1, 2, 3],
        };
        // A zero inside a name (another writer's value) is kept; only trailing ones go.
        full.name[5] = 0;
        full.port_name[63] = 0;
        let mut short = ServiceMeta::default();
        short.name[..9].copy_from_slice(b"shop/cart");
        short.port_name[..4].copy_from_slice(b"http");
        short.port = 8080;
        for meta in [full, short, ServiceMeta::default()] {
            let packed = PackedMeta::pack(&meta);
            assert_eq!(packed.unpack(), meta);
        }
        assert_eq!(PackedMeta::pack(&short).0.len(), 1 + 9 + 4 + 8);
    }

    #[test]
    fn a_write_is_small_and_the_metadata_it_carries_is_mirrored_whole() {
        // A full sync's write list holds one write per frontend, range and metadata entry.
        assert!(std::mem::size_of::<MapWrite>() <= 40);
        let mut meta = ServiceMeta::default();
        meta.name[..7].copy_from_slice(b"ns/name");
        meta.port = 80;
        let mut snap = MapSnapshot::default();
        snap.apply(&MapWrite::PutMeta(7, Box::new(meta)));
        assert_eq!(snap.meta.get(&7).map(PackedMeta::unpack), Some(meta));
        snap.apply(&MapWrite::DeleteMeta(7));
        assert!(snap.meta.is_empty());
    }

    /// A rollback replays, newest first, the writes `apply` returned: the maps come back to
    /// what they held, key by key, whatever each write replaced (nothing, another value, or
    /// a key it deletes).
    #[test]
    fn the_writes_apply_returns_undo_it_newest_first() {
        let key = |last: u8| FrontendKey {
            addr: [u32::from_ne_bytes([10, 96, 0, last]), 0, 0, 0],
            port_be: 80u16.to_be(),
            protocol: lb_common::PROTOCOL_TCP,
            family: lb_common::FAMILY_IPV4,
        };
        let frontend = |id: u32| Frontend {
            service_id: id,
            base: 4 * id,
            count: 2,
            ..Frontend::default()
        };
        let mut meta = ServiceMeta::default();
        meta.name[..7].copy_from_slice(b"ns/name");
        let mut before = MapSnapshot::default();
        for write in [
            MapWrite::PutFrontend(key(1), frontend(1)),
            MapWrite::PutMeta(1, Box::new(meta)),
            MapWrite::PutPorts {
                word: 3,
                bits: 0b101,
            },
        ] {
            let _ = before.apply(&write);
        }
        meta.port = 8080;
        let writes = [
            MapWrite::PutFrontend(key(1), frontend(2)),
            MapWrite::PutFrontend(key(2), frontend(2)),
            MapWrite::DeleteFrontend(key(3)),
            MapWrite::PutMeta(1, Box::new(meta)),
            MapWrite::PutMeta(2, Box::new(meta)),
            MapWrite::DeleteMeta(1),
            MapWrite::PutPorts {
                word: 3,
                bits: 0b111,
            },
            MapWrite::PutPorts { word: 4, bits: 1 },
            MapWrite::PutPorts { word: 3, bits: 0 },
            MapWrite::DeleteFrontend(key(1)),
        ];
        let mut snap = before.clone();
        let undo: Vec<MapWrite> = writes.iter().filter_map(|w| snap.apply(w)).collect();
        assert_ne!(snap, before);
        for write in undo.iter().rev() {
            let _ = snap.apply(write);
        }
        assert_eq!(snap, before);
    }
}
