//! The real maps: `ServiceMaps` over the pinned BPF maps, and read-only access for `inspect`
//! and metrics.
//!
//! The frontend indexes (`FRONTEND_INDEX` and `FRONTEND_INDEX6`, direct-mapped arrays of IPv4 and
//! IPv6 frontends the programs read before `FRONTENDS4` and `FRONTENDS6`) have one writer, here
//! (`FrontendIndex`, generic over the family). Each entry is written right before the hash map
//! write it copies and emptied right before a delete (a failed hash map write empties it
//! again), so an index is never older than its hash map and a removal reaches it first. Each
//! entry carries a 64-bit keyed hash of the key and the frontend: torn, misplaced and
//! other-secret entries fail it, and the programs then read the hash map. The slot is keyed with
//! the same secret, so a tenant choosing its services' addresses cannot aim at another's slot (a
//! collision costs only the hash lookup), and mixed twice, so that consecutive addresses and one
//! address's ports scatter as random keys do. The secret is in `CONFIG`, drawn by the agent that
//! creates a generation and kept by one that adopts it; the whole index is rewritten from
//! `FRONTENDS4` whenever a writer opens the maps, so nothing a crash left survives a start. The
//! writer keeps a bit per slot (whose it is, the entry says), not a copy of every holder's key.
//!
//! End-to-end tests: `frontend_index_read_first_and_a_torn_entry_passed_over` (agent killed,
//! planted torn and misplaced entries, a restart) and
//! `frontend_index_collisions_stay_in_the_hash_map`, which also check what `socklb explain` and
//! `inspect lookup` say.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};
use lb_common::{
    AffinityTable, Backend, Counter, DatapathConfig, Frontend, Frontend4Key, FrontendKey,
    IndexEntry, IndexEntry6, MapId, ServiceMeta, index,
};

use super::{
    maps::{
        BackendSlots, Capacities, IndexView, MapReadError, MapSnapshot, MapWrite, MapWriteError,
        PackedMeta, ServiceMaps,
    },
    sys,
};

pub(crate) fn read_error(map: MapId, e: MapError) -> MapReadError {
    MapReadError::new(map, io::Error::other(e))
}

fn typed<T: TryFrom<Map, Error = MapError>>(map: MapId, data: MapData) -> Result<T, MapReadError> {
    T::try_from(Map::from_map_data(data).map_err(|e| read_error(map, e))?)
        .map_err(|e| read_error(map, e))
}

/// Opens one pinned map of a layout generation (`dir`, its map directory; per-socket maps are
/// found beside it), read-only when asked.
pub fn open_map(dir: &Path, map: MapId, read_only: bool) -> Result<MapData, MapReadError> {
    let path = super::pins::map_path(dir, map);
    let fd = sys::obj_get(&path, read_only).map_err(|e| {
        MapReadError::new(
            map,
            io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        )
    })?;
    MapData::from_fd(fd).map_err(|e| read_error(map, e))
}

fn max_entries(map: MapId, data: &MapData) -> Result<u32, MapReadError> {
    Ok(data.info().map_err(|e| read_error(map, e))?.max_entries())
}

/// The maps the reconciler writes: frontends, backends, metadata and prefilters.
pub struct BpfServiceMaps {
    frontends4: HashMap<MapData, Frontend4Key, Frontend>,
    frontends6: HashMap<MapData, FrontendKey, Frontend>,
    meta: HashMap<MapData, u32, ServiceMeta>,
    ports: Array<MapData, u64>,
    /// Descriptors for the batch calls aya does not wrap.
    backends_fd: OwnedFd,
    ports_fd: OwnedFd,
    capacities: Capacities,
    /// Waits for program runs in progress (`None`: the kernel would not make one).
    barrier: Option<sys::ProgramBarrier>,
    /// The frontend indexes, for the writer that knows the programs' secret.
    index: Option<FrontendIndex<V4>>,
    index6: Option<FrontendIndex<V6>>,
}

/// One family's frontend index (`lb_common::index`): its map, the hash map it copies, and how
/// a key finds its slot and makes its entry.
trait IndexFamily {
    type Key: Copy + Eq + Default + aya::Pod;
    type Entry: Copy + Eq + Default + aya::Pod;
    const MAP: MapId;
    const SOURCE: MapId;
    fn slot(key: &Self::Key, secret: u64) -> u32;
    fn entry(key: Self::Key, frontend: Frontend, secret: u64) -> Self::Entry;
    fn key_of(entry: &Self::Entry) -> Self::Key;
}

/// `FRONTEND_INDEX`, copying `FRONTENDS4`.
struct V4;

impl IndexFamily for V4 {
    type Key = Frontend4Key;
    type Entry = IndexEntry;
    const MAP: MapId = MapId::FrontendIndex;
    const SOURCE: MapId = MapId::Frontends4;
    fn slot(key: &Frontend4Key, secret: u64) -> u32 {
        index::slot(key, secret)
    }
    fn entry(key: Frontend4Key, frontend: Frontend, secret: u64) -> IndexEntry {
        IndexEntry {
            key,
            frontend,
            check: index::check(&key, &frontend, secret),
        }
    }
    fn key_of(entry: &IndexEntry) -> Frontend4Key {
        entry.key
    }
}

/// `FRONTEND_INDEX6`, copying `FRONTENDS6`.
struct V6;

impl IndexFamily for V6 {
    type Key = FrontendKey;
    type Entry = IndexEntry6;
    const MAP: MapId = MapId::FrontendIndex6;
    const SOURCE: MapId = MapId::Frontends6;
    fn slot(key: &FrontendKey, secret: u64) -> u32 {
        index::slot6(key, secret)
    }
    fn entry(key: FrontendKey, frontend: Frontend, secret: u64) -> IndexEntry6 {
        IndexEntry6 {
            key,
            frontend,
            check: index::check6(&key, &frontend, secret),
            ..IndexEntry6::default()
        }
    }
    fn key_of(entry: &IndexEntry6) -> FrontendKey {
        entry.key
    }
}

/// A frontend index as its one writer keeps it: which slots are taken, so a frontend never
/// overwrites another's entry (whose, the entry itself says: a bit per slot here, where a copy
/// of every holder's key took 256 KiB of the agent's memory). Every entry is written right
/// before the hash map write it copies, and cleared right before the delete, so the index is
/// never older than the hash map and a removal reaches it first.
struct FrontendIndex<F: IndexFamily> {
    map: Array<MapData, F::Entry>,
    /// For the batch writes aya does not wrap.
    fd: OwnedFd,
    secret: u64,
    slots: u32,
    /// A bit per slot: taken (by the frontend its entry names).
    taken: Vec<u64>,
    /// Slots taken.
    held: usize,
}

/// Writes a frontend (`insert`, its hash map write) with its copy in `index` first; should the
/// hash map refuse it, the copy is emptied again (if that fails too, the slot keeps a frontend
/// the hash map does not have until that frontend's next write or the next start).
fn indexed_put<F: IndexFamily>(
    index: &mut Option<FrontendIndex<F>>,
    key: F::Key,
    frontend: Frontend,
    insert: impl FnOnce() -> Result<(), MapWriteError>,
) -> Result<(), MapWriteError> {
    if let Some(index) = index.as_mut() {
        index.put(key, frontend)?;
    }
    let r = insert();
    if r.is_err()
        && let Some(index) = index.as_mut()
        && let Err(e) = index.clear(key)
    {
        tracing::warn!(error = %e, "could not empty a frontend index slot");
    }
    r
}

/// Empties a frontend's slot in `index`, before its hash map delete.
fn indexed_clear<F: IndexFamily>(
    index: &mut Option<FrontendIndex<F>>,
    key: F::Key,
) -> Result<(), MapWriteError> {
    index.as_mut().map_or(Ok(()), |index| index.clear(key))
}

/// Bytes written per batch when a whole index is rewritten.
const INDEX_BATCH_BYTES: usize = 64 * 1024;

impl<F: IndexFamily> FrontendIndex<F> {
    /// Opens the index under `dir` for the programs' `secret` (none taken yet: `rebuild`).
    fn open(dir: &Path, secret: u64) -> Result<Self, MapReadError> {
        let data = open_map(dir, F::MAP, false)?;
        let slots = max_entries(F::MAP, &data)?;
        let fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| MapReadError::new(F::MAP, e))?;
        Ok(Self {
            map: typed(F::MAP, data)?,
            fd,
            secret,
            slots,
            taken: vec![0; (slots as usize).div_ceil(64)],
            held: 0,
        })
    }

    fn write(&mut self, slot: u32, entry: F::Entry) -> Result<(), MapWriteError> {
        self.map
            .set(slot, entry, 0)
            .map_err(|e| write_error(F::MAP, self.slots, e))
    }

    fn is_taken(&self, slot: u32) -> bool {
        self.taken[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    fn mark(&mut self, slot: u32, taken: bool) {
        let word = &mut self.taken[slot as usize / 64];
        if taken {
            *word |= 1 << (slot % 64);
        } else {
            *word &= !(1 << (slot % 64));
        }
    }

    /// The frontend a taken slot's entry names (none: a write that failed left it empty).
    fn holder(&self, slot: u32) -> Result<F::Key, MapWriteError> {
        self.map
            .get(&slot, 0)
            .map(|e| F::key_of(&e))
            .map_err(|e| write_error(F::MAP, self.slots, e))
    }

    /// Copies a frontend into its slot unless another frontend holds it.
    fn put(&mut self, key: F::Key, frontend: Frontend) -> Result<(), MapWriteError> {
        let slot = F::slot(&key, self.secret);
        if self.is_taken(slot) {
            let holder = self.holder(slot)?;
            if holder != key && holder != F::Key::default() {
                return Ok(());
            }
        } else {
            // Taken before the write: should the write fail, the slot stays taken by nobody,
            // and the next frontend to want it takes it.
            self.mark(slot, true);
            self.held += 1;
        }
        self.write(slot, F::entry(key, frontend, self.secret))
    }

    /// Empties the frontend's slot if it holds it.
    fn clear(&mut self, key: F::Key) -> Result<(), MapWriteError> {
        let slot = F::slot(&key, self.secret);
        if !self.is_taken(slot) || self.holder(slot)? != key {
            return Ok(());
        }
        self.write(slot, F::Entry::default())?;
        self.mark(slot, false);
        self.held -= 1;
        Ok(())
    }

    /// Rewrites the whole index from its hash map under this secret: what a crashed agent or
    /// an earlier load left there is replaced (an entry under another secret already fails the
    /// check of programs loaded with this one).
    fn rebuild(
        &mut self,
        frontends: &HashMap<MapData, F::Key, Frontend>,
    ) -> Result<usize, MapReadError> {
        let mut held: Vec<(u32, F::Key, Frontend)> = Vec::new();
        self.taken.fill(0);
        self.held = 0;
        for entry in frontends {
            let (key, frontend) = entry.map_err(|e| read_error(F::SOURCE, e))?;
            let slot = F::slot(&key, self.secret);
            if !self.is_taken(slot) {
                self.mark(slot, true);
                self.held += 1;
                held.push((slot, key, frontend));
            }
        }
        held.sort_unstable_by_key(|(slot, ..)| *slot);
        let per_batch = INDEX_BATCH_BYTES / size_of::<F::Entry>();
        let mut batch = vec![F::Entry::default(); per_batch];
        let mut next = held.iter().peekable();
        for start in (0..self.slots as usize).step_by(per_batch) {
            let len = per_batch.min(self.slots as usize - start);
            batch.fill(F::Entry::default());
            while let Some((slot, key, frontend)) =
                next.next_if(|(slot, ..)| (*slot as usize) < start + per_batch)
            {
                batch[*slot as usize - start] = F::entry(*key, *frontend, self.secret);
            }
            sys::array_update_batch(self.fd.as_fd(), start as u32, &batch[..len])
                .map_err(|e| MapReadError::new(F::MAP, e))?;
        }
        Ok(held.len())
    }
}

impl BpfServiceMaps {
    /// Opens the pinned service maps under `dir`, read-only when `read_only`.
    pub fn open(dir: &Path, read_only: bool) -> Result<Self, MapReadError> {
        let open = |map| open_map(dir, map, read_only);
        let mut capacities = Capacities::default();
        let mut data = |map: MapId| -> Result<MapData, MapReadError> {
            let d = open(map)?;
            capacities = capacities.with(map, max_entries(map, &d)?);
            Ok(d)
        };
        let frontends4 = data(MapId::Frontends4)?;
        let frontends6 = data(MapId::Frontends6)?;
        let backends = data(MapId::Backends)?;
        let meta = data(MapId::ServiceMeta)?;
        let ports = data(MapId::Ports)?;
        let dup = |map: MapId, d: &MapData| {
            d.fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| MapReadError::new(map, e))
        };
        let backends_fd = dup(MapId::Backends, &backends)?;
        let ports_fd = dup(MapId::Ports, &ports)?;
        Ok(Self {
            frontends4: typed(MapId::Frontends4, frontends4)?,
            frontends6: typed(MapId::Frontends6, frontends6)?,
            meta: typed(MapId::ServiceMeta, meta)?,
            ports: typed(MapId::Ports, ports)?,
            backends_fd,
            ports_fd,
            capacities,
            barrier: if read_only {
                None
            } else {
                sys::ProgramBarrier::new()
                    .inspect_err(|e| tracing::debug!(error = %e, "no program barrier: released backend ranges wait out their grace period"))
                    .ok()
            },
            index: None,
            index6: None,
        })
    }

    /// Opens the pinned service maps under `dir` for writing, by the agent whose programs were
    /// loaded with `secret`, and rewrites the frontend index from `FRONTENDS4` under it.
    pub fn open_writer(dir: &Path, secret: u64) -> Result<Self, MapReadError> {
        let mut maps = Self::open(dir, false)?;
        let mut index = FrontendIndex::<V4>::open(dir, secret)?;
        let held = index.rebuild(&maps.frontends4)?;
        let mut index6 = FrontendIndex::<V6>::open(dir, secret)?;
        let held6 = index6.rebuild(&maps.frontends6)?;
        tracing::debug!(held, held6, "frontend indexes rewritten");
        maps.index = Some(index);
        maps.index6 = Some(index6);
        Ok(maps)
    }
}

impl BpfServiceMaps {
    /// Reads into `backends` the ranges of `frontends`.
    fn read_ranges<'a>(
        &self,
        backends: &mut BackendSlots,
        frontends: impl Iterator<Item = &'a Frontend>,
    ) -> Result<(), MapReadError> {
        let mut ranges: Vec<(u32, u32)> = frontends
            .filter(|f| f.count > 0)
            .map(|f| (f.base, u32::from(f.count)))
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        for (base, count) in ranges {
            let entries = sys::array_lookup_range::<Backend>(self.backends_fd.as_fd(), base, count)
                .map_err(|e| MapReadError::new(MapId::Backends, e))?;
            for (i, b) in entries.into_iter().enumerate() {
                if b != Backend::default() {
                    backends.insert(base + i as u32, b);
                }
            }
        }
        Ok(())
    }

    /// Reads into `snap` the backend ranges of the frontends only `index` still holds (a copy
    /// the agent left while `FRONTENDS4` changed under it), so that the snapshot shows what the
    /// programs read.
    pub fn read_index_ranges(
        &self,
        snap: &mut MapSnapshot,
        index: &IndexView,
    ) -> Result<(), MapReadError> {
        let used: std::collections::BTreeSet<(u32, u16)> =
            snap.frontends.values().map(|f| (f.base, f.count)).collect();
        // An entry is whatever the map holds (planted, torn): only ranges inside the array.
        let capacity = u64::from(self.capacities.get(MapId::Backends));
        let only_indexed: Vec<Frontend> = index
            .frontends()
            .filter(|f| {
                !used.contains(&(f.base, f.count))
                    && u64::from(f.base) + u64::from(f.count) <= capacity
            })
            .collect();
        self.read_ranges(&mut snap.backends, only_indexed.iter())
    }

    /// One frontend and the backends its range holds, without walking the other maps: what a
    /// connect to `key` would choose among right now.
    pub fn lookup(
        &self,
        key: &FrontendKey,
    ) -> Result<Option<(Frontend, Vec<Backend>)>, MapReadError> {
        let found = if key.family == lb_common::FAMILY_IPV4 {
            self.frontends4.get(&key.v4(), 0)
        } else {
            self.frontends6.get(key, 0)
        };
        let map = if key.family == lb_common::FAMILY_IPV4 {
            MapId::Frontends4
        } else {
            MapId::Frontends6
        };
        let frontend = match found {
            Ok(f) => f,
            Err(MapError::KeyNotFound) => return Ok(None),
            Err(e) => return Err(read_error(map, e)),
        };
        let backends = sys::array_lookup_range::<Backend>(
            self.backends_fd.as_fd(),
            frontend.base,
            u32::from(frontend.count),
        )
        .map_err(|e| MapReadError::new(MapId::Backends, e))?;
        Ok(Some((frontend, backends)))
    }
}

fn write_error(map: MapId, capacity: u32, e: MapError) -> MapWriteError {
    if let MapError::SyscallError(aya::sys::SyscallError { io_error, .. }) = &e
        && io_error.raw_os_error() == Some(libc::E2BIG)
    {
        return MapWriteError::Full { map, capacity };
    }
    MapWriteError::Io {
        map,
        source: io::Error::other(e),
    }
}

/// Deleting a key that is already gone is fine.
fn removed(map: MapId, capacity: u32, r: Result<(), MapError>) -> Result<(), MapWriteError> {
    match r {
        Err(MapError::KeyNotFound) | Ok(()) => Ok(()),
        Err(MapError::SyscallError(aya::sys::SyscallError { io_error, .. }))
            if io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(e) => Err(write_error(map, capacity, e)),
    }
}

impl ServiceMaps for BpfServiceMaps {
    /// Each write is a system call: a full sync plans the next sets while they run.
    fn queue_writes(&self) -> bool {
        true
    }

    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        let map = write.map();
        let cap = self.capacities.get(map);
        let put = |r: Result<(), MapError>| r.map_err(|e| write_error(map, cap, e));
        match write {
            MapWrite::PutFrontend(k, f) if map == MapId::Frontends4 => {
                let insert = || put(self.frontends4.insert(k.v4(), f, 0));
                indexed_put(&mut self.index, k.v4(), *f, insert)
            }
            MapWrite::PutFrontend(k, f) => {
                let insert = || put(self.frontends6.insert(k, f, 0));
                indexed_put(&mut self.index6, *k, *f, insert)
            }
            MapWrite::DeleteFrontend(k) if map == MapId::Frontends4 => {
                indexed_clear(&mut self.index, k.v4())?;
                removed(map, cap, self.frontends4.remove(&k.v4()))
            }
            MapWrite::DeleteFrontend(k) => {
                indexed_clear(&mut self.index6, *k)?;
                removed(map, cap, self.frontends6.remove(k))
            }
            MapWrite::PutBackends { base, backends } => {
                if u64::from(*base) + backends.len() as u64 > u64::from(cap) {
                    return Err(MapWriteError::Full { map, capacity: cap });
                }
                sys::array_update_batch(self.backends_fd.as_fd(), *base, backends)
                    .map_err(|source| MapWriteError::Io { map, source })
            }
            MapWrite::PutMeta(id, m) => put(self.meta.insert(id, m.as_ref(), 0)),
            MapWrite::DeleteMeta(id) => removed(map, cap, self.meta.remove(id)),
            MapWrite::PutPorts { word, bits } => put(self.ports.set(*word, bits, 0)),
        }
    }

    fn barrier(&mut self) -> bool {
        self.barrier.as_ref().is_some_and(|b| b.wait().is_ok())
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        let mut snap = MapSnapshot::default();
        for entry in &self.frontends4 {
            let (k, v) = entry.map_err(|e| read_error(MapId::Frontends4, e))?;
            let key = FrontendKey {
                addr: [k.addr, 0, 0, 0],
                port_be: k.port_be,
                protocol: k.protocol,
                family: lb_common::FAMILY_IPV4,
            };
            snap.frontends.insert(key, v);
        }
        for entry in &self.frontends6 {
            let (k, v) = entry.map_err(|e| read_error(MapId::Frontends6, e))?;
            snap.frontends.insert(k, v);
        }
        for entry in &self.meta {
            let (k, v) = entry.map_err(|e| read_error(MapId::ServiceMeta, e))?;
            snap.meta.insert(k, PackedMeta::pack(&v));
        }
        let words = sys::array_lookup_range::<u64>(
            self.ports_fd.as_fd(),
            0,
            self.capacities.get(MapId::Ports),
        )
        .map_err(|e| MapReadError::new(MapId::Ports, e))?;
        for (i, bits) in words.into_iter().enumerate() {
            if bits != 0 {
                snap.ports.insert(i as u32, bits);
            }
        }
        // The backend array: only the ranges frontends use.
        self.read_ranges(&mut snap.backends, snap.frontends.values())?;
        Ok(snap)
    }

    fn capacities(&self) -> Capacities {
        self.capacities
    }

    fn frontend_indexes(&self) -> Vec<(MapId, usize, u32)> {
        let v4 = self.index.as_ref().map(|i| (V4::MAP, i.held, i.slots));
        let v6 = self.index6.as_ref().map(|i| (V6::MAP, i.held, i.slots));
        v4.into_iter().chain(v6).collect()
    }
}

fn held<F: IndexFamily>(entries: &[F::Entry]) -> u64 {
    entries
        .iter()
        .filter(|e| **e != F::Entry::default())
        .count() as u64
}

/// Read-only access to a pin folder's other maps (counters, affinity), for inspect and metrics.
#[derive(Debug)]
pub struct ReadOnlyMaps {
    dir: PathBuf,
}

impl ReadOnlyMaps {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The data path's counters, summed over CPUs.
    pub fn counters(&self) -> Result<Vec<(Counter, u64)>, MapReadError> {
        let map = MapId::Counters;
        let array: PerCpuArray<MapData, u64> = typed(map, open_map(&self.dir, map, true)?)?;
        Counter::ALL
            .iter()
            .map(|c| {
                array
                    .get(&(*c as u32), 0)
                    .map(|values| (*c, values.iter().sum()))
                    .map_err(|e| read_error(map, e))
            })
            .collect()
    }

    /// The affinity tables, by client cgroup id, at most `limit` of them (a bounded walk).
    pub fn affinity(&self, limit: usize) -> Result<Vec<(u64, AffinityTable)>, MapReadError> {
        let map = MapId::Affinity;
        let lru: HashMap<MapData, u64, AffinityTable> =
            typed(map, open_map(&self.dir, map, true)?)?;
        lru.iter()
            .take(limit)
            .map(|e| e.map_err(|e| read_error(map, e)))
            .collect()
    }

    /// The slots of the frontend index `map` (`FRONTEND_INDEX`, `FRONTEND_INDEX6`) that hold a
    /// frontend (an entry per frontend of its family but those whose slot another holds).
    pub fn index_held(&self, map: MapId) -> Result<u64, MapReadError> {
        Ok(if map == V6::MAP {
            held::<V6>(&self.index_entries::<V6>()?)
        } else {
            held::<V4>(&self.index_entries::<V4>()?)
        })
    }

    /// The frontend indexes as the programs read them: their entries and the secret `CONFIG`
    /// gives them. A generation from before the IPv6 index reads as one with it empty.
    pub fn index_view(&self) -> Result<IndexView, MapReadError> {
        let map = MapId::Config;
        let config: Array<MapData, DatapathConfig> = typed(map, open_map(&self.dir, map, true)?)?;
        let secret = config
            .get(&0, 0)
            .map_err(|e| read_error(map, e))?
            .index_secret;
        Ok(IndexView {
            secret,
            entries: self.index_entries::<V4>()?,
            entries6: self.index_entries::<V6>().ok(),
        })
    }

    fn index_entries<F: IndexFamily>(&self) -> Result<Vec<F::Entry>, MapReadError> {
        let data = open_map(&self.dir, F::MAP, true)?;
        let slots = max_entries(F::MAP, &data)?;
        sys::array_lookup_range::<F::Entry>(data.fd().as_fd(), 0, slots)
            .map_err(|e| MapReadError::new(F::MAP, e))
    }

    /// Whether `map` is pinned in this generation.
    pub fn has(&self, map: MapId) -> bool {
        self.dir.join(map.name()).exists()
    }

    /// A map's capacity and the bytes the kernel charges for it (`memlock` in fdinfo).
    pub fn footprint(&self, map: MapId) -> Result<(u32, u64), MapReadError> {
        let data = open_map(&self.dir, map, true)?;
        let capacity = max_entries(map, &data)?;
        let fdinfo = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            std::os::fd::AsRawFd::as_raw_fd(&data.fd().as_fd())
        ))
        .map_err(|e| MapReadError::new(map, e))?;
        let memlock = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        Ok((capacity, memlock))
    }
}
