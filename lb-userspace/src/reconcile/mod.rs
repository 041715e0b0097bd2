//! Writes the difference between the desired state and what the maps hold, one backend set at
//! a time, in an order that never lets a concurrent connect see a half-written service:
//!
//! 1. a changed backend set is written into a fresh range of the backend array (no frontend
//!    points there yet); 2. the prefilters gain the new frontends' port and filter bits and the
//!    backends' ports; 3. metadata; 4. the frontends flip to the new range and count; 5. frontends
//!    no longer wanted are deleted; 6. the frontend port bitmap and filter lose bits no frontend
//!    sets; 7. the old range waits out a grace period (`DEFAULT_GRACE`, 1 s) before reuse.
//!
//! A range a frontend uses is never written, so no connect can read a half-written or deleted
//! backend (`invariants::overwrites_used_range`), and after every write each frontend's range lies
//! in the array and holds backends of its family (`invariants::violations`). When a set finds no
//! free range, a program barrier (`ServiceMaps::barrier`; on the real maps an array-of-maps
//! update, which returns once every program run in progress has ended) frees every waiting range
//! at once (`Ranges::reclaim_waiting`); without a barrier they wait out the grace.
//!
//! When a write fails, the writes already done are undone in reverse order, which walks back
//! through the same valid states, so the service is left exactly as it was; it is recorded as
//! failed and retried later. Other services are unaffected.
//!
//! No set ever gives up room for another: the maps grow before they fill (the agent moves them
//! to larger ones, see `agent::tasks::growth`), and what can still not be had is waited for,
//! never taken. A full map never freezes a removal. When a changed set finds no free range, it
//! keeps the room it has (`in_place`): its endpoints are swapped into its own range, backends
//! that stay keep their slots, new ones take the slots of those that left, as many as fit
//! (`MapWriteError::AtCeiling` says how many serve). A slot is never written while a frontend
//! may read it: the frontends first narrow to the longest run of the range that stays (never a
//! backend that left), and the other slots are written only once no program can still read
//! them (a barrier, or the grace period at a later retry), then the frontends widen again.
//! Where no backend of the current set stays, the frontends point at none until then
//! (connects refused for the barrier's moment), never at a backend that left. A set with no
//! range of its own that finds no room is not written (`MapWriteError::NoRange`).
//!
//! Capacity goes to the oldest Service first where it is handed out (`Seniority::age`:
//! `creationTimestamp`, then uid; never by name): `sync_all` removes the sets the desired state
//! lacks first, then writes the others oldest first, so on a fresh node, after a restart or a
//! migration, the newest Service is the one that finds the maps full. The engine orders each
//! batch the same way, and what the batch's removals free goes, in the same pass, to its sets
//! that found no room.
//!
//! A frontend that does not fit never holds back the rest. The set's frontends stay; of its new
//! ones, those that fit are written, the strongest claims first (`ClaimKind::precedence`, then the
//! address), and the rest are reported (`MapWriteError::FrontendsLeftOut`) and retried. A set none
//! of whose frontends fits is not written at all (`MapWriteError::Full`). Every refusal for room
//! is `ErrorKind::MapFull`.
//!
//! A full sync over maps where a write is a system call (`ServiceMaps::queue_writes`) hands its
//! writes to a thread of their own (`queue`) and plans the next sets meanwhile: the maps take
//! the same writes and barriers in the same order. When one fails, the writer undoes that set's
//! writes and stops, and the reconciler adopts what the maps hold and writes the rest itself
//! (`write_queued`, `recover`): the maps end as without the thread.
//!
//! Ids and ranges are recovered from the maps when a `Reconciler` is made over maps a previous
//! agent wrote: service ids from the metadata, ranges and backends from the frontends, including
//! every range a frontend points into (an agent killed mid-change leaves a set's frontends on
//! two, and neither is given to another set while one does).
pub mod invariants;
mod layout;
mod live;
mod mirror;
mod queue;
mod ranges;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use lb_common::{
    FRONTEND_FLAG_AFFINITY, FRONTEND_FLAG_NO_LOCAL, Frontend, FrontendKey, MapId, ports,
};
pub use live::LiveServing;
pub use mirror::{Mirror, filter_of, port_of};
pub use ranges::{DEFAULT_GRACE, NoRange, Ranges};
use smallvec::SmallVec;

use crate::{
    dataplane::{
        abi::{backend, frontend_key, service_meta, service_port_key},
        maps::{
            Capacities, MapReadError, MapSnapshot, MapWrite, MapWriteError, ServiceMaps,
            frontends_map,
        },
    },
    hashing::{FastMap, FastSet},
    translate::{DesiredService, DesiredState},
    vocab::{ErrorKind, Protocol, ServicePortKey},
};

/// Why a backend set is not in the maps as desired: a write failed, and the set stays on its
/// previous state until a retry succeeds.
#[derive(Debug, Clone)]
pub struct WriteFailed(pub Arc<MapWriteError>);

impl WriteFailed {
    pub fn kind(&self) -> ErrorKind {
        self.0.kind()
    }
}

impl std::fmt::Display for WriteFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not applied: {}", self.0)
    }
}

/// What one reconcile pass did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    pub writes: usize,
    pub services_changed: usize,
    pub services_removed: usize,
    pub failed: BTreeMap<ServicePortKey, WriteFailed>,
    /// UDP backend sets whose serving endpoints shrank or that went away: their connected
    /// sockets may be stale.
    pub udp_changed: bool,
    /// UDP frontends were written that were not before: connected sockets made before may be
    /// untranslated (`sockets::repair_untranslated`).
    pub udp_frontends_added: bool,
}

impl SyncReport {
    pub fn merge(&mut self, other: Self) {
        self.writes += other.writes;
        self.services_changed += other.services_changed;
        self.services_removed += other.services_removed;
        self.failed.extend(other.failed);
        self.udp_changed |= other.udp_changed;
        self.udp_frontends_added |= other.udp_frontends_added;
    }
}

/// Why `Reconciler::maps` is never `None` outside a full sync.
const MAPS_HERE: &str = "the maps are the reconciler's again when a full sync returns";

/// Counters over the reconciler's life, for metrics.
#[derive(Debug, Default, Clone)]
pub struct ReconcileStats {
    pub writes: u64,
    pub rollbacks: u64,
    pub errors: BTreeMap<ErrorKind, u64>,
}

/// A backend set as written: its id and the range its frontends use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SetState {
    id: u32,
    /// Where its frontends point in the backend array (meaningless when `len` is 0).
    base: u32,
    /// How many backends, in slot order, from `base`: the backends themselves are the
    /// mirror's (`Reconciler::layout_of`), not a copy per set.
    len: u32,
    /// The extent of the backend array it holds (start, length): `base` and `len`, or the
    /// larger range it holds while narrowed inside it (see `Reconciler::in_place`).
    range: (u32, u32),
    /// UDP: the serving endpoints last written (see `DesiredService::serving`).
    serving: Box<[SocketAddr]>,
    /// When its frontends last narrowed inside its range to swap endpoints in place: the slots
    /// outside the narrowed run may be written once no program can still read them (`None`:
    /// no such narrowing waits, or a barrier has fenced it).
    narrowed_at: Option<Instant>,
}

pub struct Reconciler<M: ServiceMaps> {
    /// `None` only while a full sync's writer thread holds them (`write_queued`).
    maps: Option<M>,
    /// Where writes go while a full sync's writer thread holds the maps.
    queue: Option<queue::Queue>,
    /// The maps could not be read back after a queued write failed: what they hold is not
    /// known, so nothing is written until they are (every sync tries again first).
    unread: Option<Arc<MapWriteError>>,
    mirror: Mirror,
    /// By key, unordered: a full sync looks each set up several times, and a hash of its names
    /// costs less than the string comparisons of an ordered map's search.
    sets: FastMap<ServicePortKey, SetState>,
    /// The ids the sets hold, for a new id's search (a set of ids, not a map back to keys: at
    /// 10,000 sets that table was 1 MiB).
    ids: FastSet<u32>,
    next_service_id: u32,
    ranges: Ranges,
    failed: BTreeMap<ServicePortKey, WriteFailed>,
    /// Ranges a failed write moved frontends to and an interrupted rollback left them on:
    /// released once no frontend points into them.
    stranded: Vec<(u32, u32)>,
    stats: ReconcileStats,
    clock: fn() -> Instant,
    /// The UDP frontends' serving endpoints now, for the termination pass.
    live: LiveServing,
}

impl<M: ServiceMaps> Reconciler<M> {
    /// Adopts whatever the maps already hold (pinned maps after a restart): service ids come
    /// back from the metadata, ranges and backends from the frontends. Nothing is written.
    pub fn new(maps: M) -> Result<Self, MapReadError> {
        Self::with_grace(maps, DEFAULT_GRACE)
    }

    /// The same, with the time a released range waits before reuse.
    pub fn with_grace(maps: M, grace: Duration) -> Result<Self, MapReadError> {
        let snap = maps.read_all()?;
        Ok(Self::from_snapshot(maps, snap, grace))
    }

    /// Adopts `snap`, which `maps` hold.
    fn from_snapshot(maps: M, snap: MapSnapshot, grace: Duration) -> Self {
        let capacity = maps.capacities().get(MapId::Backends);
        let mut ranges = Ranges::new(capacity, grace);
        let mut sets = FastMap::default();
        let mut keys = FastMap::default();
        for (id, meta) in &snap.meta {
            if let Some(key) = service_port_key(&meta.unpack()) {
                keys.insert(*id, key.clone());
                sets.insert(
                    key,
                    SetState {
                        id: *id,
                        ..SetState::default()
                    },
                );
            }
        }
        // A set's range: the one its frontends use (all of them, when a previous agent
        // finished its last write; otherwise the first, and the next sync rewrites the set).
        let mut adopted: HashMap<u32, &Frontend> = HashMap::new();
        for fe in snap.frontends.values() {
            adopted.entry(fe.service_id).or_insert(fe);
        }
        for (id, fe) in &adopted {
            let Some(key) = keys.get(id) else { continue };
            let whole = snap
                .slots(fe.base, u32::from(fe.count))
                .all(|s| s.is_some());
            if let (true, Some(set)) = (whole, sets.get_mut(key))
                && ranges.reserve(fe.base, u32::from(fe.count))
            {
                set.base = fe.base;
                set.range = (fe.base, u32::from(fe.count));
                set.len = u32::from(fe.count);
            }
        }
        // Every other range a frontend points into (an agent stopped in the middle of a set's
        // change leaves its frontends on two): no other set may be written there while one
        // does. Released once none does (`release_stranded`, after each full sync).
        let mut stranded = Vec::new();
        for fe in snap.frontends.values() {
            let (base, len) = (fe.base, u32::from(fe.count));
            if len > 0 && ranges.reserve(base, len) {
                stranded.push((base, len));
            }
        }
        // Until a set is written, its frontends serve what their ranges hold.
        let live = LiveServing::default();
        for (fe, value) in &snap.frontends {
            if fe.protocol == lb_common::PROTOCOL_UDP {
                let held: Vec<SocketAddr> = snap.range(value).into_iter().flatten().collect();
                live.set(&[*fe], &held);
            }
        }
        let max_id = snap
            .meta
            .keys()
            .chain(snap.frontends.values().map(|f| &f.service_id))
            .copied()
            .max()
            .unwrap_or(0);
        Self {
            maps: Some(maps),
            queue: None,
            unread: None,
            mirror: Mirror::from_snapshot(snap),
            sets,
            ids: keys.into_keys().collect(),
            next_service_id: max_id.wrapping_add(1).max(1),
            ranges,
            failed: BTreeMap::new(),
            stranded,
            stats: ReconcileStats::default(),
            clock: Instant::now,
            live,
        }
    }

    pub fn maps(&self) -> &M {
        self.maps.as_ref().expect(MAPS_HERE)
    }

    pub fn maps_mut(&mut self) -> &mut M {
        self.maps.as_mut().expect(MAPS_HERE)
    }

    /// The maps' capacities, wherever the maps are.
    fn capacities(&self) -> Capacities {
        match &self.queue {
            Some(q) => q.capacities(),
            None => self.maps().capacities(),
        }
    }

    /// The maps' barrier (`ServiceMaps::barrier`), after every write queued before it.
    fn barrier(&mut self) -> bool {
        match &mut self.queue {
            Some(q) => q.barrier(),
            None => self.maps_mut().barrier(),
        }
    }

    /// What the maps hold, as far as this reconciler wrote or adopted it.
    pub fn snapshot(&self) -> &MapSnapshot {
        &self.mirror.snap
    }

    pub fn service_id(&self, key: &ServicePortKey) -> Option<u32> {
        self.sets.get(key).map(|s| s.id)
    }

    /// Every backend set in the maps, with its service id, in key order.
    pub fn service_ids(&self) -> impl Iterator<Item = (&ServicePortKey, u32)> {
        let mut out: Vec<_> = self.sets.iter().map(|(k, s)| (k, s.id)).collect();
        out.sort_unstable_by(|a, b| a.0.cmp(b.0));
        out.into_iter()
    }

    pub fn service_count(&self) -> usize {
        self.sets.len()
    }

    /// Backend sets whose last write failed (they stay on their previous state).
    pub fn failed(&self) -> &BTreeMap<ServicePortKey, WriteFailed> {
        &self.failed
    }

    pub fn stats(&self) -> &ReconcileStats {
        &self.stats
    }

    /// The backend array's ranges (free, waiting, used): for capacity reporting and tests.
    pub fn ranges(&self) -> &Ranges {
        &self.ranges
    }

    /// Writes everything this reconciler holds into other, empty maps (larger ones: the maps
    /// grow by moving), entry for entry at the same places: the backends run by run, the
    /// prefilter words, the metadata, then the frontends. A reconciler made over them then
    /// adopts the same ids and ranges, and the programs switched to them find every service as
    /// it was.
    pub fn copy_into<N: ServiceMaps>(&self, maps: &mut N) -> Result<usize, MapWriteError> {
        let snap = &self.mirror.snap;
        let mut writes = Vec::new();
        let mut run: Option<(u32, Vec<lb_common::Backend>)> = None;
        for (index, b) in snap.backends.iter() {
            match &mut run {
                Some((base, list)) if *base + list.len() as u32 == index => list.push(b),
                _ => {
                    if let Some((base, backends)) = run.take() {
                        writes.push(MapWrite::PutBackends { base, backends });
                    }
                    run = Some((index, vec![b]));
                }
            }
        }
        if let Some((base, backends)) = run {
            writes.push(MapWrite::PutBackends { base, backends });
        }
        writes.extend(
            snap.ports
                .iter()
                .map(|(&word, &bits)| MapWrite::PutPorts { word, bits }),
        );
        writes.extend(
            snap.meta
                .iter()
                .map(|(&id, m)| MapWrite::PutMeta(id, Box::new(m.unpack()))),
        );
        writes.extend(
            snap.frontends
                .iter()
                .map(|(&k, &f)| MapWrite::PutFrontend(k, f)),
        );
        for w in &writes {
            maps.write(w)?;
        }
        Ok(writes.len())
    }

    /// The UDP frontends' serving endpoints as they stand at each moment (a handle on a table
    /// this reconciler keeps up to date around every write): a connected UDP socket whose
    /// backend is not in its frontend's list is stale.
    pub fn live_serving(&self) -> LiveServing {
        self.live.clone()
    }

    /// Takes over the live table of `other` (which held the same sets: the maps grew), so that
    /// whoever holds a handle on it keeps seeing the sets as this reconciler writes them.
    pub fn share_live_of(&mut self, other: &Self) {
        self.live = other.live.clone();
    }

    /// Makes the maps hold exactly `desired`: every backend set in it is written, and every one
    /// the maps hold that it lacks is removed, as are orphaned entries. Call it only with a
    /// complete view of the cluster (after the initial lists), never with a partial one.
    pub fn sync_all(&mut self, desired: &DesiredState) -> SyncReport {
        self.sync_all_owned(desired.clone())
    }

    /// [`Self::sync_all`], dropping each backend set's desired state once it is written: the
    /// reconciler's own state grows as the desired state shrinks (the agent's peak memory is
    /// at its first full sync).
    pub fn sync_all_owned(&mut self, desired: DesiredState) -> SyncReport {
        let mut report = SyncReport::default();
        if let Err(unread) = self.known() {
            for key in desired.services.keys() {
                self.record_failed(key, WriteFailed(Arc::clone(&unread)), &mut report);
            }
            return report;
        }
        self.failed.retain(|k, _| desired.services.contains_key(k));
        let mut stale: Vec<ServicePortKey> = self
            .sets
            .keys()
            .filter(|k| !desired.services.contains_key(*k))
            .cloned()
            .collect();
        stale.sort();
        for key in stale {
            self.sync_one_into(&key, None, &mut report);
        }
        self.sweep_orphans(&mut report);
        // Capacity goes to the oldest Services first (then the smaller uid), never by name: on
        // a fresh node, after a restart or a migration, the newest is the one that finds the
        // maps full, as on a running agent.
        let mut sets: Vec<(ServicePortKey, DesiredService)> =
            desired.services.into_iter().collect();
        // Room for every set at once: a first full sync adds them all, and a table that grows
        // as it goes hashes each key again at every doubling.
        self.sets
            .reserve(sets.len().saturating_sub(self.sets.len()));
        self.ids.reserve(sets.len().saturating_sub(self.ids.len()));
        self.mirror.reserve(sets.len());
        // The oldest last (equal ages in key order, from the end), then taken from the end: each
        // is dropped once written, and the vector shrinks as the reconciler's own state grows,
        // so the two are not both whole at the sync's end (1.5 MiB at 10,000 sets). In place,
        // without a second buffer.
        sets.sort_unstable_by(|a, b| (b.1.seniority.age(), &b.0).cmp(&(a.1.seniority.age(), &a.0)));
        if self.maps().queue_writes() {
            self.write_queued(&mut sets, &mut report);
        }
        while let Some((key, service)) = sets.pop() {
            self.sync_one_into(&key, Some(&service), &mut report);
            if sets.len() < sets.capacity() / 2 {
                sets.shrink_to_fit();
            }
        }
        self.sweep_ports(&mut report);
        self.release_stranded();
        report
    }

    /// Releases the stranded ranges no frontend points into any more.
    fn release_stranded(&mut self) {
        let now = (self.clock)();
        let frontends = &self.mirror.snap.frontends;
        let ranges = &mut self.ranges;
        self.stranded.retain(|&(start, len)| {
            let used = frontends.values().any(|f| {
                f.count > 0 && f.base < start + len && start < f.base + u32::from(f.count)
            });
            if !used {
                ranges.release(start, len, now);
            }
            used
        });
    }

    /// Brings one backend set to `desired` (`None`: remove it). `desired.frontends` must hold
    /// only the addresses this set owns.
    pub fn sync_one(
        &mut self,
        key: &ServicePortKey,
        desired: Option<&DesiredService>,
    ) -> SyncReport {
        let mut report = SyncReport::default();
        match self.known() {
            Ok(()) => self.sync_one_into(key, desired, &mut report),
            Err(unread) => self.record_failed(key, WriteFailed(unread), &mut report),
        }
        report
    }

    /// Writes sets from the end of `sets` (the oldest first), each set's writes handed to a
    /// thread of their own while the next sets are planned (a UDP set whose live table loses
    /// something waits for its own: `sync_one_into`). When a write fails, the writer undoes
    /// that set's writes and stops; the reconciler adopts what the maps hold, records that set
    /// as failed, and gives the sets queued after it back to `sets`, so the caller writes them
    /// in the same order. The maps end as the same sync without a queue leaves them.
    fn write_queued(
        &mut self,
        sets: &mut Vec<(ServicePortKey, DesiredService)>,
        report: &mut SyncReport,
    ) {
        let Some(mut maps) = self.maps.take() else {
            return;
        };
        let (queue, writer) = queue::channel(maps.capacities());
        let before = (report.writes, self.stats.writes);
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let ended = std::thread::scope(|scope| {
            let held = &mut maps;
            let spawned = std::thread::Builder::new()
                .name("socklb-writes".into())
                .spawn_scoped(scope, move || writer.run(held));
            let handle = match spawned {
                Ok(handle) => handle,
                Err(e) => {
                    tracing::warn!(error = %e, "no thread for the full sync's writes: written in turn");
                    return None;
                }
            };
            let open = CloseQueue(&mut *self);
            open.0.queue = Some(queue);
            while let Some(q) = open.0.queue.as_ref().filter(|q| !q.failed()) {
                let (done, first) = (q.jobs_done(), q.next_job());
                while in_flight.front().is_some_and(|f| f.end <= done) {
                    in_flight.pop_front();
                }
                let Some((key, service)) = sets.pop() else {
                    break;
                };
                let changed = report.services_changed;
                open.0.sync_one_into(&key, Some(&service), report);
                in_flight.push_back(InFlight {
                    first,
                    end: open.0.queue.as_ref().map_or(first, queue::Queue::next_job),
                    changed: report.services_changed - changed,
                    key,
                    service,
                });
                if sets.len() < sets.capacity() / 2 {
                    sets.shrink_to_fit();
                }
            }
            let closed = open.0.queue.take().map(queue::Queue::close);
            drop(open);
            let stopped = handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Some((closed, stopped))
        });
        self.maps = Some(maps);
        let Some((closed, stopped)) = ended else {
            return;
        };
        if let Some(closed) = closed {
            let (forward, undone) = closed.writes();
            report.writes = before.0 + forward;
            self.stats.writes = before.1 + (forward + undone) as u64;
        }
        if let Some(stopped) = stopped {
            self.recover(stopped, in_flight, sets, report);
        }
    }

    /// After the writer stopped at a failed write: the maps hold every set before the one that
    /// failed, and that one's writes are undone (or as far as its undo got). Adopts them, records
    /// the failure as a failed write without a queue would, and gives the sets queued after it
    /// back to `sets`.
    fn recover(
        &mut self,
        stopped: queue::Stopped,
        in_flight: VecDeque<InFlight>,
        sets: &mut Vec<(ServicePortKey, DesiredService)>,
        report: &mut SyncReport,
    ) {
        self.stats.rollbacks += 1;
        if !stopped.undone {
            *self.stats.errors.entry(ErrorKind::Rollback).or_default() += 1;
        }
        let mut failed = None;
        let mut later = Vec::new();
        for f in in_flight {
            if f.end <= stopped.job {
                continue;
            }
            report.services_changed -= f.changed;
            if f.first <= stopped.job {
                failed = Some(f.key);
            } else {
                report.failed.remove(&f.key);
                later.push((f.key, f.service));
            }
        }
        tracing::debug!(
            written = stopped.written,
            undone = stopped.undone,
            again = later.len(),
            "a queued write failed: adopting what the maps hold"
        );
        if let Err(e) = self.readopt() {
            tracing::error!(error = %e, "the maps could not be read back after a failed write: nothing more is written until they are");
            let unread = Arc::new(MapWriteError::Unread(e));
            self.unread = Some(Arc::clone(&unread));
            for (key, _) in later.drain(..).chain(sets.drain(..)) {
                self.record_failed(&key, WriteFailed(Arc::clone(&unread)), report);
            }
        }
        if let Some(key) = failed {
            self.record_failed(&key, WriteFailed(Arc::new(stopped.error)), report);
        }
        sets.extend(later.into_iter().rev());
    }

    /// Adopts what the maps hold (as a reconciler made over them would), keeping this one's
    /// failures, counters, clock and live table. Of the ranges no frontend uses, those this one
    /// did not have free wait out the grace period (or a barrier) before reuse: a frontend may
    /// have pointed into one a moment ago.
    fn readopt(&mut self) -> Result<(), MapReadError> {
        let snap = self.maps().read_all()?;
        let maps = self.maps.take().expect(MAPS_HERE);
        let grace = self.ranges.grace();
        let old = std::mem::replace(self, Self::from_snapshot(maps, snap, grace));
        self.failed = old.failed;
        self.stats = old.stats;
        self.clock = old.clock;
        self.live = old.live;
        self.ranges.hold_unless_free_in(&old.ranges, (self.clock)());
        Ok(())
    }

    /// `Ok` when the maps' content is known: always, unless a queued write failed and they
    /// could not be read back, which is tried again here (`Err`: the error to refuse sets with).
    fn known(&mut self) -> Result<(), Arc<MapWriteError>> {
        let Some(unread) = self.unread.clone() else {
            return Ok(());
        };
        match self.readopt() {
            Ok(()) => {
                self.unread = None;
                Ok(())
            }
            Err(_) => Err(unread),
        }
    }

    fn sync_one_into(
        &mut self,
        key: &ServicePortKey,
        desired: Option<&DesiredService>,
        report: &mut SyncReport,
    ) {
        self.failed.remove(key);
        let Some(id) = self.id_for(key, desired.is_some()) else {
            return;
        };
        let now = (self.clock)();
        let old = self.sets.get(key).cloned().unwrap_or(SetState {
            id,
            ..SetState::default()
        });
        let plan = self.plan(key, &old, desired, now);
        let mut plan = match plan {
            Ok(plan) => plan,
            Err(e) => {
                self.record_failure(key, e, report);
                return;
            }
        };
        let edit =
            (key.protocol == Protocol::Udp).then(|| self.live_before(id, &old, desired, &plan));
        let mut undo = Vec::new();
        let mut writes = 0;
        let result = self.write_plan(&mut plan, &mut undo, &mut writes);
        report.writes += writes;
        if let Some(edit) = edit {
            // Queued, a table that loses something waits for the writes to be done, not queued
            // (one that only gains is as safe before).
            let done = result.is_ok()
                && (!edit.narrows(desired.is_none(), &plan)
                    || self.queue.as_mut().is_none_or(queue::Queue::settle));
            self.live_after(id, &edit, done, desired.is_none(), &plan, report);
        }
        match result {
            Ok(()) => {
                // A removed set gives its range back too when it had narrowed to nothing (its
                // empty layout is "unchanged", no new range).
                if plan.new_range || desired.is_none() {
                    self.ranges.release(old.range.0, old.range.1, now);
                }

                let serving = desired.map(|d| d.serving.as_slice()).unwrap_or_default();
                report.udp_changed |= key.protocol == Protocol::Udp
                    && (desired.is_none() || old.serving.iter().any(|b| !serving.contains(b)));
                match desired {
                    None => {
                        self.sets.remove(key);
                        self.ids.remove(&id);
                        report.services_removed += 1;
                    }
                    Some(d) => {
                        let range = if plan.new_range {
                            (plan.base, plan.len)
                        } else {
                            old.range
                        };
                        self.sets.insert(
                            key.clone(),
                            SetState {
                                id,
                                base: plan.base,
                                len: plan.len,
                                range,
                                serving: d.serving.as_slice().into(),
                                narrowed_at: plan.narrowed_in_place.then_some(now),
                            },
                        );
                        if writes > 0 {
                            report.services_changed += 1;
                        }
                    }
                }
                if self.swap_now(key, &plan) {
                    self.release_ports(&plan.released, report);
                    self.sync_one_into(key, desired, report);
                    return;
                }
                if let Some(narrowed) = plan.narrowed.or(plan.left_out) {
                    // Written, but not as desired: reported and retried like a failure.
                    self.record_failure(key, narrowed, report);
                }
                // Frontend ports this set stopped using, now that its frontends are gone.
                self.release_ports(&plan.released, report);
            }
            Err(e) => {
                let undone = self.rollback(undo);
                let claimed: Vec<FrontendKey> = plan
                    .writes
                    .iter()
                    .filter_map(|w| match w {
                        MapWrite::PutFrontend(k, _) => Some(*k),
                        _ => None,
                    })
                    .collect();
                self.release_ports(&claimed, report);
                if plan.new_range {
                    let len = plan.len;
                    if undone {
                        // Frontends may have pointed there for a moment: let it wait like any
                        // other.
                        self.ranges.release(plan.base, len, now);
                    } else if len > 0 {
                        self.stranded.push((plan.base, len));
                    }
                }
                if !self.sets.contains_key(key) {
                    self.ids.remove(&id);
                }
                self.record_failure(key, e, report);
            }
        }
    }

    /// Before a UDP set's writes: each of its frontends, those it has and those it takes,
    /// serves what it served and what it is to serve (see `LiveServing`), before any program
    /// can choose a new backend.
    fn live_before(
        &self,
        id: u32,
        old: &SetState,
        desired: Option<&DesiredService>,
        plan: &Plan,
    ) -> LiveEdit {
        let current: Vec<FrontendKey> = self.mirror.frontends_of(id).copied().collect();
        let claimed: Vec<FrontendKey> = plan
            .writes
            .iter()
            .filter_map(|w| match w {
                MapWrite::PutFrontend(k, _) if !current.contains(k) => Some(*k),
                _ => None,
            })
            .collect();
        let was: Vec<SocketAddr> = old
            .serving
            .iter()
            .copied()
            .chain(self.layout_of(old).into_iter().flatten())
            .collect();
        let will: Vec<SocketAddr> = desired
            .map(|d| {
                d.serving
                    .iter()
                    .copied()
                    .chain(plan.layout.iter().copied())
                    .collect()
            })
            .unwrap_or_default();
        let mut both = current.clone();
        both.extend(&claimed);
        let mut serving = was.clone();
        serving.extend(&will);
        self.live.widen(&both, &serving);
        LiveEdit {
            current,
            claimed,
            was,
            will,
        }
    }

    /// After a UDP set's writes: its frontends serve what it is to serve (or, when the write
    /// failed, what it served); the frontends it let go, or all of them when it went, leave.
    fn live_after(
        &self,
        id: u32,
        edit: &LiveEdit,
        ok: bool,
        removed: bool,
        plan: &Plan,
        report: &mut SyncReport,
    ) {
        match (ok, removed) {
            (true, true) => self.live.remove(&edit.current),
            (true, false) => {
                report.udp_frontends_added |= !edit.claimed.is_empty();
                let now_held: Vec<FrontendKey> = self.mirror.frontends_of(id).copied().collect();
                self.live.set(&now_held, &edit.will);
                self.live.remove(&plan.released);
            }
            (false, _) => {
                self.live.set(&edit.current, &edit.was);
                self.live.remove(&edit.claimed);
            }
        }
    }

    /// After a set narrowed inside its own range: whether the swap can finish now, because a
    /// barrier says no program reads the slots outside the narrowed run any more.
    fn swap_now(&mut self, key: &ServicePortKey, plan: &Plan) -> bool {
        if !plan.narrowed_in_place || !self.barrier() {
            return false;
        }
        if let Some(set) = self.sets.get_mut(key) {
            set.narrowed_at = None;
        }
        true
    }

    fn record_failure(&mut self, key: &ServicePortKey, e: MapWriteError, report: &mut SyncReport) {
        self.record_failed(key, WriteFailed(Arc::new(e)), report);
    }

    fn record_failed(
        &mut self,
        key: &ServicePortKey,
        failed: WriteFailed,
        report: &mut SyncReport,
    ) {
        *self.stats.errors.entry(failed.kind()).or_default() += 1;
        // The engine logs when a set starts and stops failing, not every retry.
        tracing::debug!(service = %key, error = %failed.0, "service port not written as desired");
        report.failed.insert(key.clone(), failed.clone());
        self.failed.insert(key.clone(), failed);
    }

    fn id_for(&mut self, key: &ServicePortKey, create: bool) -> Option<u32> {
        if let Some(set) = self.sets.get(key) {
            return Some(set.id);
        }
        if !create {
            return None;
        }
        let mut id = self.next_service_id;
        while id == 0 || self.ids.contains(&id) || self.mirror.snap.meta.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_service_id = id.wrapping_add(1);
        self.ids.insert(id);
        self.sets.insert(
            key.clone(),
            SetState {
                id,
                ..SetState::default()
            },
        );
        Some(id)
    }

    /// The ordered writes for one backend set.
    fn plan(
        &mut self,
        key: &ServicePortKey,
        old: &SetState,
        desired: Option<&DesiredService>,
        now: Instant,
    ) -> Result<Plan, MapWriteError> {
        let id = old.id;
        let empty = DesiredService::default();
        let want = desired.unwrap_or(&empty);
        let udp = key.protocol == Protocol::Udp;
        let mut writes = Vec::new();

        // Which frontends fit: a set none of whose addresses fit is not written at all (it would
        // hold backends and metadata for nothing).
        let current: Vec<FrontendKey> = self.mirror.frontends_of(id).copied().collect();
        let (wanted, left_out) = self.frontends_with_room(want, &current);
        if wanted.is_empty()
            && let Some(MapWriteError::FrontendsLeftOut { map, .. }) = &left_out
        {
            return Err(MapWriteError::Full {
                map: *map,
                capacity: self.capacities().get(*map),
            });
        }

        // 1. The backends, positions kept where they stay; a changed set gets a fresh range.
        let Placed {
            base,
            layout,
            new_range,
            narrowed,
            narrowed_in_place,
        } = self.place(old, want, now, &mut writes)?;

        // 2. Prefilters: the port and filter bits of new frontends, and the backends' ports (set
        // only: a socket may keep a backend long after the backend left its set).
        self.set_bits(udp, &wanted, &layout, &mut writes);

        // 3. Metadata, before any frontend points at the id.
        if let Some(d) = desired {
            let meta = service_meta(key, d.port);
            if self
                .mirror
                .snap
                .meta
                .get(&id)
                .is_none_or(|m| m.unpack() != meta)
            {
                writes.push(MapWrite::PutMeta(id, Box::new(meta)));
            }
        }

        // 4. Frontends with the new range and count.
        let mut flags = 0;
        if want.affinity_timeout_s.is_some() {
            flags |= FRONTEND_FLAG_AFFINITY;
        }
        if want.no_local_endpoint {
            flags |= FRONTEND_FLAG_NO_LOCAL;
        }
        let value = Frontend {
            service_id: id,
            base,
            count: u16::try_from(layout.len()).unwrap_or(u16::MAX),
            flags,
            affinity_timeout_s: want.affinity_timeout_s.unwrap_or(0),
        };
        for k in &wanted {
            if self.mirror.snap.frontends.get(k) != Some(&value) {
                writes.push(MapWrite::PutFrontend(*k, value));
            }
        }
        // 5. Frontends no longer wanted.
        let released: Vec<FrontendKey> = current
            .iter()
            .filter(|k| wanted.binary_search(k).is_err())
            .copied()
            .collect();
        writes.extend(released.iter().map(|k| MapWrite::DeleteFrontend(*k)));
        if desired.is_none() && self.mirror.snap.meta.contains_key(&id) {
            writes.push(MapWrite::DeleteMeta(id));
        }
        Ok(Plan {
            writes,
            base,
            len: layout.len() as u32,
            layout,
            new_range,
            narrowed,
            narrowed_in_place,
            left_out,
            released,
        })
    }

    /// The `PORTS` writes that set the filter and port bits of `frontends` and the port bits of
    /// `backends` (only words that change).
    fn set_bits(
        &self,
        udp: bool,
        frontends: &[FrontendKey],
        backends: &[SocketAddr],
        writes: &mut Vec<MapWrite>,
    ) {
        let mut bits = WordBits::new();
        for k in frontends {
            let (_, index) = filter_of(k);
            bits.push((ports::frontend_word(udp, index), ports::bit(index)));
            let (_, port) = port_of(k);
            bits.push((
                ports::frontend_port_word(udp, port),
                ports::bit(u32::from(port)),
            ));
        }
        for b in backends {
            let port = (
                ports::backend_word(udp, b.port()),
                ports::bit(u32::from(b.port())),
            );
            // A set's backends mostly share one port: each run of it once.
            if bits.last() != Some(&port) {
                bits.push(port);
            }
        }
        by_word(&mut bits);
        for &(word, set) in &bits {
            let current = self.word(word);
            if current | set != current {
                writes.push(MapWrite::PutPorts {
                    word,
                    bits: current | set,
                });
            }
        }
    }

    /// What a set's slots hold, from the mirror (`None` for a slot that holds no backend).
    fn layout_of(&self, set: &SetState) -> Vec<Option<SocketAddr>> {
        self.mirror.snap.slots(set.base, set.len).collect()
    }

    /// Where the set's backends go: the current range when they are unchanged, else a fresh
    /// one (with the write that fills it). With no room, the set keeps the room it has
    /// ([`Self::in_place`]); a set with no range of its own waits whole (`NoRange`).
    fn place(
        &mut self,
        old: &SetState,
        want: &DesiredService,
        now: Instant,
        writes: &mut Vec<MapWrite>,
    ) -> Result<Placed, MapWriteError> {
        let old_slots = self.layout_of(old);
        let layout = layout::layout(&old_slots, &want.backends);
        if old_slots
            .iter()
            .copied()
            .eq(layout.iter().copied().map(Some))
        {
            return Ok(Placed::at(old.base, layout));
        }
        let len = layout.len() as u32;
        match self.ranges.alloc(len, now) {
            Ok(base) => {
                if len > 0 {
                    writes.push(MapWrite::PutBackends {
                        base,
                        backends: layout.iter().map(|a| backend(*a)).collect(),
                    });
                }
                Ok(Placed {
                    new_range: true,
                    ..Placed::at(base, layout)
                })
            }
            Err(e) => {
                if let Some(base) = self.make_room(len, now) {
                    writes.push(MapWrite::PutBackends {
                        base,
                        backends: layout.iter().map(|a| backend(*a)).collect(),
                    });
                    return Ok(Placed {
                        new_range: true,
                        ..Placed::at(base, layout)
                    });
                }
                self.in_place(old, want, e, now, writes)
            }
        }
    }

    /// A changed set that finds no free range keeps the room it has: its range (`old.range`)
    /// takes the wanted backends, those that stay in their slots and new ones in the slots of
    /// those that left, as many as fit. Never a slot a frontend may read: when a slot the
    /// frontends now use must change, they first narrow to the longest run of used slots that
    /// stay (nothing written into the range; `narrowed_in_place`; a run of none refuses
    /// connects meanwhile), and the other slots are written at the next call once no program
    /// can still read them (a barrier, or the grace since the narrowing), when the frontends
    /// widen again. Backends that left are never chosen again.
    fn in_place(
        &mut self,
        old: &SetState,
        want: &DesiredService,
        no_range: NoRange,
        now: Instant,
        writes: &mut Vec<MapWrite>,
    ) -> Result<Placed, MapWriteError> {
        let (start, room) = old.range;
        if room == 0 {
            return Err(MapWriteError::NoRange {
                wanted: no_range.wanted,
                free: no_range.free,
                waiting: no_range.waiting,
            });
        }
        let held: Vec<Option<SocketAddr>> = self.mirror.snap.slots(start, room).collect();
        let target = in_place_layout(&held, &want.backends);
        let k = target.len() as u32;
        let at_ceiling = |serving: u32| MapWriteError::AtCeiling {
            wanted: want.backends.len() as u32,
            serving,
            free: no_range.free,
            waiting: no_range.waiting,
        };
        let full = (want.backends.len() as u32 > k).then(|| at_ceiling(k));
        let in_use = old.base..old.base + old.len;
        let changed: Vec<u32> = (0..k)
            .filter(|&p| held[p as usize] != Some(target[p as usize]))
            .collect();
        if changed.is_empty() {
            // The slots hold the target already: the frontends only widen (or move) to it.
            return Ok(Placed {
                narrowed: full,
                ..Placed::at(start, target)
            });
        }
        if changed.iter().any(|p| in_use.contains(&(start + p))) {
            // Narrow first, to the longest run of used slots that stay as they are.
            let used: Vec<SocketAddr> = self.layout_of(old).iter().map_while(|s| *s).collect();
            let keep: Vec<SocketAddr> = used
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let p = old.base + i as u32 - start;
                    if p < k && target[p as usize] == *b {
                        *b
                    } else {
                        // Not kept as it is: ends a run.
                        SocketAddr::from(([0, 0, 0, 0], 0))
                    }
                })
                .collect();
            // None stays (every endpoint replaced at once): the frontends point at nothing
            // (connects refused) until the swap, a barrier later, rather than at backends that
            // left.
            let (run_start, run) = staying_run(&keep, &want.backends);
            return Ok(Placed {
                narrowed: Some(at_ceiling(run.len() as u32)),
                narrowed_in_place: true,
                ..Placed::at(old.base + run_start, run)
            });
        }
        // Every slot to write is outside what the frontends use now: written once no program
        // can still read them (they did before the narrowing).
        let fenced = old
            .narrowed_at
            .is_none_or(|t| now.duration_since(t) >= self.ranges.grace())
            || self.barrier();
        if !fenced {
            return Err(at_ceiling(old.len));
        }
        let mut run_start = None;
        for p in 0..=k {
            let differs = p < k && changed.binary_search(&p).is_ok();
            match (differs, run_start) {
                (true, None) => run_start = Some(p),
                (false, Some(from)) => {
                    writes.push(MapWrite::PutBackends {
                        base: start + from,
                        backends: target[from as usize..p as usize]
                            .iter()
                            .map(|a| backend(*a))
                            .collect(),
                    });
                    run_start = None;
                }
                _ => {}
            }
        }
        Ok(Placed {
            narrowed: full,
            ..Placed::at(start, target)
        })
    }

    /// A fresh range of `len` backends when none is free: the ranges waiting out their grace
    /// period are free once no program can still read them (a barrier). `None`: there is no
    /// room even so (the caller keeps the set's own room or waits).
    fn make_room(&mut self, len: u32, now: Instant) -> Option<u32> {
        if self.ranges.waiting_len() > 0 && self.barrier() {
            self.ranges.reclaim_waiting();
            if let Ok(base) = self.ranges.alloc(len, now) {
                return Some(base);
            }
        }
        None
    }

    /// The frontends `want` names that fit: where a frontend map lacks room for the new ones,
    /// what does not fit is left out, the strongest claims kept (ClusterIP, then NodePort,
    /// load balancer, externalIP), and reported. Frontends the set has already always stay.
    fn frontends_with_room(
        &self,
        want: &DesiredService,
        current: &[FrontendKey],
    ) -> (Vec<FrontendKey>, Option<MapWriteError>) {
        let mut claims: Vec<&crate::translate::FrontendClaim> = want.frontends.iter().collect();
        claims.sort_by_key(|c| (c.kind.precedence(), c.addr));
        let mut wanted = Vec::with_capacity(claims.len());
        let mut left_out: Vec<(MapId, String)> = Vec::new();
        for map in [MapId::Frontends4, MapId::Frontends6] {
            let new: Vec<&crate::translate::FrontendClaim> = claims
                .iter()
                .copied()
                .filter(|c| {
                    let k = frontend_key(c.addr);
                    frontends_map(&k) == map
                        && !current.contains(&k)
                        && !self.mirror.snap.frontends.contains_key(&k)
                })
                .collect();
            let capacity = self.capacities().get(map) as usize;
            let fits = capacity.saturating_sub(self.mirror.frontend_count(map));
            for (i, c) in new.iter().enumerate() {
                if i >= fits {
                    left_out.push((map, c.addr.to_string()));
                }
            }
            let dropped: BTreeSet<FrontendKey> = new
                .iter()
                .skip(fits)
                .map(|c| frontend_key(c.addr))
                .collect();
            wanted.extend(
                claims
                    .iter()
                    .map(|c| frontend_key(c.addr))
                    .filter(|k| frontends_map(k) == map && !dropped.contains(k)),
            );
        }
        // In key order, each once: the order the frontends are written in.
        wanted.sort_unstable();
        wanted.dedup();
        let error = left_out
            .first()
            .map(|(map, _)| MapWriteError::FrontendsLeftOut {
                map: *map,
                left_out: left_out.len(),
                addresses: left_out.iter().map(|(_, a)| a.clone()).collect(),
            });
        (wanted, error)
    }

    fn word(&self, word: u32) -> u64 {
        self.mirror.snap.ports.get(&word).copied().unwrap_or(0)
    }

    /// Clears the filter and port bits of these frontends where no frontend sets them any
    /// more (after the frontends are gone).
    fn release_ports(&mut self, released: &[FrontendKey], report: &mut SyncReport) {
        if released.is_empty() {
            return;
        }
        let mut cleared = WordBits::new();
        for key in released {
            let (udp, index) = filter_of(key);
            if !self.mirror.filter_in_use(udp, index) {
                cleared.push((ports::frontend_word(udp, index), ports::bit(index)));
            }
            let (udp, port) = port_of(key);
            if !self.mirror.port_in_use(udp, port) {
                cleared.push((
                    ports::frontend_port_word(udp, port),
                    ports::bit(u32::from(port)),
                ));
            }
        }
        by_word(&mut cleared);
        let writes: Vec<MapWrite> = cleared
            .into_iter()
            .filter_map(|(word, clear)| {
                let current = self.word(word);
                (current & !clear != current).then_some(MapWrite::PutPorts {
                    word,
                    bits: current & !clear,
                })
            })
            .collect();
        self.write_ports(&writes, report);
    }

    /// Clears every frontend filter and frontend port bit no frontend sets (after a full
    /// sync, and for bits an earlier agent left).
    fn sweep_ports(&mut self, report: &mut SyncReport) {
        let mut writes = Vec::new();
        let mirror = &self.mirror;
        for (&word, &bits) in &mirror.snap.ports {
            let in_use = |bit: u32| -> bool {
                if word < ports::BACKEND {
                    let udp = word >= ports::FILTER_WORDS;
                    let first = (word - if udp { ports::FILTER_WORDS } else { 0 }) << 6;
                    mirror.filter_in_use(udp, first + bit)
                } else {
                    let udp = word >= ports::FRONTEND_PORTS + ports::BACKEND_WORDS;
                    let first =
                        (word - ports::FRONTEND_PORTS - if udp { ports::BACKEND_WORDS } else { 0 })
                            << 6;
                    u16::try_from(first + bit).is_ok_and(|port| mirror.port_in_use(udp, port))
                }
            };
            if (ports::BACKEND..ports::FRONTEND_PORTS).contains(&word) {
                // The backend port bitmap is set only.
                continue;
            }
            let mut keep = 0u64;
            for bit in 0..64u32 {
                if bits & (1 << bit) != 0 && in_use(bit) {
                    keep |= 1 << bit;
                }
            }
            if keep != bits {
                writes.push(MapWrite::PutPorts { word, bits: keep });
            }
        }
        self.write_ports(&writes, report);
    }

    fn write_ports(&mut self, writes: &[MapWrite], report: &mut SyncReport) {
        let mut undo = Vec::new();
        let mut done = 0;
        if let Err(e) = self.execute(writes, &mut undo, &mut done) {
            *self.stats.errors.entry(e.kind()).or_default() += 1;
            tracing::warn!(error = %e, "could not clear unused port bits (harmless: costs a lookup)");
        }
        report.writes += done;
    }

    /// A plan's writes: queued while a full sync's writer thread holds the maps (the plan's
    /// list handed over), else done in turn.
    fn write_plan(
        &mut self,
        plan: &mut Plan,
        undo: &mut Vec<MapWrite>,
        done: &mut usize,
    ) -> Result<(), MapWriteError> {
        if self.queue.is_some() {
            self.enqueue(std::mem::take(&mut plan.writes), done);
            return Ok(());
        }
        self.execute(&plan.writes, undo, done)
    }

    /// Queues writes for the full sync's writer thread (`write_queued`): the mirror takes them
    /// now, as if done, and the writer stops at the first that fails.
    fn enqueue(&mut self, writes: Vec<MapWrite>, done: &mut usize) {
        if writes.is_empty() {
            return;
        }
        *done += writes.len();
        self.stats.writes += writes.len() as u64;
        let Some(q) = self.queue.as_mut() else {
            return;
        };
        let mirror = &mut self.mirror;
        q.push(writes, |w| mirror.apply(w));
    }

    /// Runs writes in order, recording for each the write that undoes it; `done` counts them.
    fn execute(
        &mut self,
        writes: &[MapWrite],
        undo: &mut Vec<MapWrite>,
        done: &mut usize,
    ) -> Result<(), MapWriteError> {
        if self.queue.is_some() {
            self.enqueue(writes.to_vec(), done);
            return Ok(());
        }
        for write in writes {
            self.maps_mut().write(write)?;
            // What the mirror replaces is what the maps held: the write that undoes this one.
            let inverse = self.mirror.apply(write);
            self.stats.writes += 1;
            *done += 1;
            undo.extend(inverse);
        }
        Ok(())
    }

    /// Undoes writes newest first. Undoing frees or rewrites existing keys, so it does not need
    /// capacity. Each undo step lands on a state the forward writes passed through, so when one
    /// fails the rollback stops there: the maps stay valid (never a frontend without its
    /// metadata, port bit or range), the error is counted and logged, and the retry or the
    /// orphan sweep finishes the job.
    /// Whether every write was undone.
    fn rollback(&mut self, undo: Vec<MapWrite>) -> bool {
        self.stats.rollbacks += 1;
        for write in undo.into_iter().rev() {
            if let Err(e) = self.maps_mut().write(&write) {
                *self.stats.errors.entry(ErrorKind::Rollback).or_default() += 1;
                tracing::error!(error = %e, %write, "rollback write failed; stopped at a valid state");
                return false;
            }
            let _ = self.mirror.apply(&write);
            self.stats.writes += 1;
        }
        true
    }

    /// Frontends and metadata of service ids no backend set owns (left by a crash or by an
    /// older agent).
    fn sweep_orphans(&mut self, report: &mut SyncReport) {
        let owned: BTreeSet<u32> = self.sets.values().map(|s| s.id).collect();
        let mut orphans: BTreeSet<u32> = self.mirror.frontend_service_ids().collect();
        orphans.extend(self.mirror.snap.meta.keys().copied());
        orphans.retain(|id| !owned.contains(id));
        for id in orphans {
            let mut writes: Vec<MapWrite> = self
                .mirror
                .frontends_of(id)
                .copied()
                .map(MapWrite::DeleteFrontend)
                .collect();
            if self.mirror.snap.meta.contains_key(&id) {
                writes.push(MapWrite::DeleteMeta(id));
            }
            let mut undo = Vec::new();
            let mut done = 0;
            if let Err(e) = self.execute(&writes, &mut undo, &mut done) {
                *self.stats.errors.entry(e.kind()).or_default() += 1;
                tracing::warn!(service_id = id, error = %e, "could not remove orphaned service");
            }
            report.writes += done;
            report.services_removed += 1;
        }
    }
}

/// A set whose writes are queued and maybe not yet done (`Reconciler::write_queued`): its jobs,
/// and what to write again if the writer stops before them.
struct InFlight {
    first: usize,
    end: usize,
    /// What it added to `SyncReport::services_changed`.
    changed: usize,
    key: ServicePortKey,
    service: DesiredService,
}

/// Closes a full sync's queue when dropped, also on a panic, so its writer thread ends and
/// the scope holding it can join it.
struct CloseQueue<'a, M: ServiceMaps>(&'a mut Reconciler<M>);

impl<M: ServiceMaps> Drop for CloseQueue<'_, M> {
    fn drop(&mut self) {
        self.0.queue = None;
    }
}

/// (word, bit) pairs of the `PORTS` array that a plan sets or clears: a few per set, inline.
type WordBits = SmallVec<[(u32, u64); 8]>;

/// The bits of each word together, in word order (the order the writes go in).
fn by_word(bits: &mut WordBits) {
    bits.sort_unstable_by_key(|&(word, _)| word);
    bits.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 |= later.1;
        }
        same
    });
}

/// The longest run of consecutive slots of `current` whose backends are all still `wanted`:
/// its start and its backends (empty when none stays).
fn staying_run(current: &[SocketAddr], wanted: &[SocketAddr]) -> (u32, Vec<SocketAddr>) {
    let (mut best, mut best_len) = (0usize, 0usize);
    let mut start = 0usize;
    for (i, b) in current.iter().enumerate() {
        if wanted.contains(b) {
            if i + 1 - start > best_len {
                best = start;
                best_len = i + 1 - start;
            }
        } else {
            start = i + 1;
        }
    }
    (best as u32, current[best..best + best_len].to_vec())
}

/// A UDP set's frontends and serving endpoints around its write (`Reconciler::live_before`).
struct LiveEdit {
    current: Vec<FrontendKey>,
    claimed: Vec<FrontendKey>,
    was: Vec<SocketAddr>,
    will: Vec<SocketAddr>,
}

impl LiveEdit {
    /// Whether the table loses something once the writes are done: a backend the set served
    /// and will not, or a frontend. Until then it must hold what the maps still serve.
    fn narrows(&self, removed: bool, plan: &Plan) -> bool {
        removed || !plan.released.is_empty() || self.was.iter().any(|b| !self.will.contains(b))
    }
}

/// Where a set's backends go (`Reconciler::place`).
struct Placed {
    base: u32,
    layout: Vec<SocketAddr>,
    /// The set moves to a new range (the old one is released after a successful write).
    new_range: bool,
    /// Written, but not as desired (no room): reported and retried.
    narrowed: Option<MapWriteError>,
    /// The frontends narrow inside the set's own range so that its other slots can be written
    /// once no program reads them (see `Reconciler::in_place`).
    narrowed_in_place: bool,
}

impl Placed {
    /// The set's backends `layout` from `base`, in place.
    fn at(base: u32, layout: Vec<SocketAddr>) -> Self {
        Self {
            base,
            layout,
            new_range: false,
            narrowed: None,
            narrowed_in_place: false,
        }
    }
}

/// The layout a set's own range takes for `wanted` (`in_place`): a slot keeps its backend
/// while it is wanted, and the others take the wanted backends not yet placed, in order; as
/// many slots as the range has and backends are wanted. Each backend once.
fn in_place_layout(held: &[Option<SocketAddr>], wanted: &[SocketAddr]) -> Vec<SocketAddr> {
    let k = wanted.len().min(held.len());
    let mut target: Vec<Option<SocketAddr>> = vec![None; k];
    let mut placed: Vec<SocketAddr> = Vec::with_capacity(k);
    for (p, slot) in held.iter().enumerate().take(k) {
        if let Some(b) = slot
            && wanted.contains(b)
            && !placed.contains(b)
        {
            target[p] = Some(*b);
            placed.push(*b);
        }
    }
    let mut rest = wanted.iter().filter(|b| !placed.contains(b));
    target
        .into_iter()
        .map(|t| t.or_else(|| rest.next().copied()))
        .map(|t| t.expect("as many wanted backends as slots"))
        .collect()
}

/// The writes for one backend set, and what they lead to.
struct Plan {
    writes: Vec<MapWrite>,
    /// The backends the frontends reach after the writes.
    layout: Vec<SocketAddr>,
    base: u32,
    /// Backends from `base`.
    len: u32,
    /// The set moved to a new range (the old one is released after a successful write).
    new_range: bool,
    /// No room: the set was narrowed in place (written, then reported as failed).
    narrowed: Option<MapWriteError>,
    /// Narrowed inside its own range to swap endpoints in: finished after a barrier.
    narrowed_in_place: bool,
    /// Some new frontends did not fit (the others are written; reported as failed).
    left_out: Option<MapWriteError>,
    /// The frontends the plan deletes: their filter and port bits go once no frontend sets
    /// them.
    released: Vec<FrontendKey>,
}
