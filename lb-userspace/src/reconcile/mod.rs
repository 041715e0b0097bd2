//! Writes the difference between the desired state and what the maps hold, one service port at
//! a time, in an order that never lets a concurrent connect see a half-written service:
//!
//! 1. new backends; 2. slots (overwrites in place, then new ones beyond the old count);
//! 3. metadata; 4. frontends with their new count, last; 5. slots beyond the new count deleted;
//! 6. backends no slot names any more deleted.
//!
//! Every intermediate state is valid (each frontend's slots `1..=count` exist and name existing
//! backends of its family). When a write fails, the writes already done are undone in reverse
//! order, which walks back through the same valid states, so the service is left exactly as it
//! was; it is recorded as failed and retried later. Other services are unaffected.
pub mod invariants;
mod layout;
mod mirror;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use lb_common::{
    FRONTEND_FLAG_AFFINITY, FRONTEND_FLAG_EXTERNAL, Frontend, SCOPE_EXTERNAL, SCOPE_INTERNAL,
    ServiceMeta, SlotKey,
};
pub use mirror::{Mirror, key_from_meta};

use crate::{
    dataplane::{
        abi::{Protocol, backend_to_abi, to_fixed},
        maps::{MapReadError, MapSnapshot, MapWrite, MapWriteError, ServiceMaps},
    },
    translate::{DesiredService, DesiredState, Scope, ServicePortKey},
};

/// Why a service port is not (fully) in the maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceProblem {
    /// A write failed; the service stays on its previous state until a retry succeeds.
    WriteFailed { kind: &'static str, message: String },
    /// Another service already owns one of its frontends; that frontend is left to the owner.
    FrontendConflict { frontend: String, owner: String },
}

impl std::fmt::Display for ServiceProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WriteFailed { message, .. } => write!(f, "not applied: {message}"),
            Self::FrontendConflict { frontend, owner } => {
                write!(f, "frontend {frontend} is already served by {owner}")
            }
        }
    }
}

/// What one reconcile pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub writes: usize,
    pub services_changed: usize,
    pub services_removed: usize,
    pub problems: BTreeMap<ServicePortKey, ServiceProblem>,
    /// Backends that left a UDP service port (connected UDP sockets to them are stale).
    pub udp_backends_removed: BTreeSet<SocketAddr>,
}

/// Counters over the reconciler's life, for metrics.
#[derive(Debug, Default, Clone)]
pub struct ReconcileStats {
    pub writes: u64,
    pub rollbacks: u64,
    /// Failures by kind (`map_full`, `map_write`, `frontend_conflict`, ...).
    pub errors: BTreeMap<&'static str, u64>,
}

pub struct Reconciler<M: ServiceMaps> {
    maps: M,
    mirror: Mirror,
    ids: BTreeMap<ServicePortKey, u32>,
    next_service_id: u32,
    next_backend_id: u32,
    problems: BTreeMap<ServicePortKey, ServiceProblem>,
    stats: ReconcileStats,
}

impl<M: ServiceMaps> Reconciler<M> {
    /// Adopts whatever the maps already hold (pinned maps after a restart): service ids come
    /// back from the metadata, backend ids from the backend map. Nothing is written.
    pub fn new(maps: M) -> Result<Self, MapReadError> {
        let snap = maps.read_all()?;
        let ids: BTreeMap<ServicePortKey, u32> = snap
            .meta
            .iter()
            .filter_map(|(id, meta)| key_from_meta(meta).map(|k| (k, *id)))
            .collect();
        let max_service = snap
            .meta
            .keys()
            .chain(snap.frontends.values().map(|f| &f.service_id))
            .chain(snap.slots.keys().map(|k| &k.service_id))
            .copied()
            .max()
            .unwrap_or(0);
        let max_backend = snap.backends.keys().copied().max().unwrap_or(0);
        Ok(Self {
            maps,
            mirror: Mirror::from_snapshot(snap),
            ids,
            next_service_id: max_service.wrapping_add(1).max(1),
            next_backend_id: max_backend.wrapping_add(1).max(1),
            problems: BTreeMap::new(),
            stats: ReconcileStats::default(),
        })
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// What the maps hold, as far as this reconciler wrote or adopted it.
    pub fn snapshot(&self) -> &MapSnapshot {
        &self.mirror.snap
    }

    pub fn service_id(&self, key: &ServicePortKey) -> Option<u32> {
        self.ids.get(key).copied()
    }

    pub fn service_ids(&self) -> &BTreeMap<ServicePortKey, u32> {
        &self.ids
    }

    pub fn problems(&self) -> &BTreeMap<ServicePortKey, ServiceProblem> {
        &self.problems
    }

    pub fn stats(&self) -> &ReconcileStats {
        &self.stats
    }

    /// Makes the maps hold exactly `desired`: every service port in it is written, and every
    /// one the maps hold that it lacks is removed, as are orphaned entries. Call it only with a
    /// complete view of the cluster (after the initial lists), never with a partial one.
    pub fn sync_all(&mut self, desired: &DesiredState) -> SyncReport {
        let mut report = SyncReport::default();
        // Problems of service ports that are neither wanted nor in the maps are moot.
        let ids = &self.ids;
        self.problems
            .retain(|k, _| desired.services.contains_key(k) || ids.contains_key(k));
        let stale: Vec<ServicePortKey> = self
            .ids
            .keys()
            .filter(|k| !desired.services.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            self.sync_one_into(&key, None, &mut report);
        }
        self.sweep_orphans(&mut report);
        for (key, service) in &desired.services {
            self.sync_one_into(key, Some(service), &mut report);
        }
        self.free_unreferenced_backends(&mut report);
        report
    }

    /// Brings one service port to `desired` (`None`: remove it).
    pub fn sync_one(
        &mut self,
        key: &ServicePortKey,
        desired: Option<&DesiredService>,
    ) -> SyncReport {
        let mut report = SyncReport::default();
        self.sync_one_into(key, desired, &mut report);
        report
    }

    fn sync_one_into(
        &mut self,
        key: &ServicePortKey,
        desired: Option<&DesiredService>,
        report: &mut SyncReport,
    ) {
        self.problems.remove(key);
        let Some(id) = self.id_for(key, desired.is_some()) else {
            return;
        };
        let (phase1, conflicts) = self.plan(id, key, desired);
        for (frontend, owner) in conflicts {
            *self.stats.errors.entry("frontend_conflict").or_default() += 1;
            report.problems.insert(
                key.clone(),
                ServiceProblem::FrontendConflict { frontend, owner },
            );
        }
        let old_backends: BTreeSet<u32> = self.mirror.slots_of(id).into_values().collect();
        let old_active = self.active_backends(id);
        let mut undo = Vec::new();
        let mut result = self.execute(&phase1, &mut undo);
        if result.is_ok() {
            // Backends this service no longer names and nobody else does.
            let frees: Vec<MapWrite> = old_backends
                .into_iter()
                .filter(|b| !self.mirror.is_referenced(*b))
                .map(MapWrite::DeleteBackend)
                .collect();
            result = self.execute(&frees, &mut undo);
        }
        let writes = undo.len();
        match result {
            Ok(()) => {
                report.writes += writes;
                if key.protocol == Protocol::Udp {
                    let now = self.active_backends(id);
                    report
                        .udp_backends_removed
                        .extend(old_active.difference(&now).copied());
                }
                if desired.is_none() {
                    self.ids.remove(key);
                    report.services_removed += 1;
                } else if writes > 0 {
                    report.services_changed += 1;
                }
            }
            Err(e) => {
                self.rollback(undo);
                report.writes += writes;
                if !self.mirror.snap.meta.contains_key(&id)
                    && self.mirror.frontends_of(id).next().is_none()
                {
                    self.ids.remove(key);
                }
                *self.stats.errors.entry(e.kind()).or_default() += 1;
                tracing::warn!(service = %key, error = %e, "service left on its previous state");
                report.problems.insert(
                    key.clone(),
                    ServiceProblem::WriteFailed {
                        kind: e.kind(),
                        message: e.to_string(),
                    },
                );
            }
        }
        if let Some(problem) = report.problems.get(key) {
            self.problems.insert(key.clone(), problem.clone());
        }
    }

    /// The backend addresses a service id's frontends currently spread over.
    fn active_backends(&self, id: u32) -> BTreeSet<SocketAddr> {
        let slots = self.mirror.slots_of(id);
        (1..=u32::from(self.mirror.active_count(id)))
            .filter_map(|s| slots.get(&s).and_then(|b| self.mirror.backend_addr(*b)))
            .collect()
    }

    /// Every backend address some UDP frontend currently spreads over.
    pub fn active_udp_backends(&self) -> BTreeSet<SocketAddr> {
        self.ids
            .iter()
            .filter(|(k, _)| k.protocol == Protocol::Udp)
            .flat_map(|(_, id)| self.active_backends(*id))
            .collect()
    }

    fn id_for(&mut self, key: &ServicePortKey, create: bool) -> Option<u32> {
        if let Some(id) = self.ids.get(key) {
            return Some(*id);
        }
        if !create {
            return None;
        }
        let used: BTreeSet<u32> = self.ids.values().copied().collect();
        let mut id = self.next_service_id;
        while id == 0 || used.contains(&id) || self.mirror.snap.meta.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_service_id = id.wrapping_add(1);
        self.ids.insert(key.clone(), id);
        Some(id)
    }

    fn new_backend_id(&mut self, planned: &BTreeSet<u32>) -> u32 {
        let mut id = self.next_backend_id;
        while id == 0 || self.mirror.snap.backends.contains_key(&id) || planned.contains(&id) {
            id = id.wrapping_add(1);
        }
        self.next_backend_id = id.wrapping_add(1);
        id
    }

    /// The ordered writes (steps 1-5) for one service port, and its frontend conflicts.
    fn plan(
        &mut self,
        id: u32,
        key: &ServicePortKey,
        desired: Option<&DesiredService>,
    ) -> (Vec<MapWrite>, Vec<(String, String)>) {
        let mut writes = Vec::new();
        let mut conflicts = Vec::new();
        let old_slots = self.mirror.slots_of(id);
        let empty = DesiredService::default();
        let want = desired.unwrap_or(&empty);

        // 1. Backends, and where each sits.
        let old_count = u32::from(self.mirror.active_count(id));
        let old_active: Vec<Option<SocketAddr>> = (1..=old_count)
            .map(|s| old_slots.get(&s).and_then(|b| self.mirror.backend_addr(*b)))
            .collect();
        let new_layout = layout::layout(&old_active, &want.backends);
        let mut planned = BTreeSet::new();
        let mut layout_ids = Vec::with_capacity(new_layout.len());
        for addr in &new_layout {
            let backend_id = if let Some(b) = self.mirror.backend_id(addr) {
                b
            } else {
                let b = self.new_backend_id(&planned);
                planned.insert(b);
                writes.push(MapWrite::PutBackend(b, backend_to_abi(*addr)));
                b
            };
            layout_ids.push(backend_id);
        }

        // 2. Slots: in place first (visible at once, each names a valid backend), then the
        // new ones beyond the old count (invisible until the frontend's count grows).
        let mut beyond = Vec::new();
        for (i, backend_id) in layout_ids.iter().enumerate() {
            let slot = i as u32 + 1;
            if old_slots.get(&slot) != Some(backend_id) {
                let write = MapWrite::PutSlot(
                    SlotKey {
                        service_id: id,
                        slot,
                    },
                    *backend_id,
                );
                if slot <= old_count {
                    writes.push(write);
                } else {
                    beyond.push(write);
                }
            }
        }
        writes.extend(beyond);

        // 3. Metadata, before any frontend points at the id.
        if let Some(meta) = desired.map(|d| service_meta(key, d.port))
            && self.mirror.snap.meta.get(&id) != Some(&meta)
        {
            writes.push(MapWrite::PutMeta(id, meta));
        }

        // 4. Frontends with the new count, last.
        let count = u16::try_from(layout_ids.len()).unwrap_or(u16::MAX);
        let value = Frontend {
            service_id: id,
            count,
            flags: frontend_flags(key, want),
            affinity_timeout_s: want.affinity_timeout_s.unwrap_or(0),
            _pad: 0,
        };
        let wanted: BTreeSet<_> = want.frontends.iter().map(|f| f.to_key()).collect();
        for fe in &want.frontends {
            let fk = fe.to_key();
            match self.mirror.snap.frontends.get(&fk) {
                Some(cur) if cur.service_id != id && self.is_owned_elsewhere(cur.service_id) => {
                    let owner = self.owner_name(cur.service_id);
                    conflicts.push((fe.to_string(), owner));
                }
                Some(cur) if *cur == value => {}
                _ => writes.push(MapWrite::PutFrontend(fk, value)),
            }
        }
        let gone: Vec<_> = self
            .mirror
            .frontends_of(id)
            .filter(|k| !wanted.contains(k))
            .copied()
            .collect();
        writes.extend(gone.into_iter().map(MapWrite::DeleteFrontend));

        // 5. Slots the data path can no longer reach.
        let keep = u32::try_from(layout_ids.len()).unwrap_or(u32::MAX);
        writes.extend(
            old_slots
                .keys()
                .filter(|s| **s == 0 || **s > keep)
                .map(|s| {
                    MapWrite::DeleteSlot(SlotKey {
                        service_id: id,
                        slot: *s,
                    })
                }),
        );
        if desired.is_none() && self.mirror.snap.meta.contains_key(&id) {
            writes.push(MapWrite::DeleteMeta(id));
        }
        (writes, conflicts)
    }

    fn is_owned_elsewhere(&self, service_id: u32) -> bool {
        self.ids.values().any(|id| *id == service_id)
    }

    fn owner_name(&self, service_id: u32) -> String {
        self.ids
            .iter()
            .find(|(_, id)| **id == service_id)
            .map_or_else(
                || format!("service id {service_id}"),
                |(k, _)| k.to_string(),
            )
    }

    /// Runs writes in order, recording for each the write that undoes it.
    fn execute(
        &mut self,
        writes: &[MapWrite],
        undo: &mut Vec<MapWrite>,
    ) -> Result<(), MapWriteError> {
        for write in writes {
            let inverse = self.inverse(write);
            self.maps.write(write)?;
            self.mirror.apply(write);
            self.stats.writes += 1;
            undo.push(inverse);
        }
        Ok(())
    }

    fn inverse(&self, write: &MapWrite) -> MapWrite {
        let snap = &self.mirror.snap;
        match write {
            MapWrite::PutBackend(id, _) | MapWrite::DeleteBackend(id) => snap
                .backends
                .get(id)
                .map_or(MapWrite::DeleteBackend(*id), |b| {
                    MapWrite::PutBackend(*id, *b)
                }),
            MapWrite::PutSlot(k, _) | MapWrite::DeleteSlot(k) => snap
                .slots
                .get(k)
                .map_or(MapWrite::DeleteSlot(*k), |b| MapWrite::PutSlot(*k, *b)),
            MapWrite::PutMeta(id, _) | MapWrite::DeleteMeta(id) => snap
                .meta
                .get(id)
                .map_or(MapWrite::DeleteMeta(*id), |m| MapWrite::PutMeta(*id, *m)),
            MapWrite::PutFrontend(k, _) | MapWrite::DeleteFrontend(k) => snap
                .frontends
                .get(k)
                .map_or(MapWrite::DeleteFrontend(*k), |f| {
                    MapWrite::PutFrontend(*k, *f)
                }),
        }
    }

    /// Undoes writes newest first. Undoing frees or rewrites existing keys, so it does not need
    /// capacity; a failure here is logged and leaves a valid (if mixed) state for the retry.
    fn rollback(&mut self, undo: Vec<MapWrite>) {
        self.stats.rollbacks += 1;
        for write in undo.into_iter().rev() {
            match self.maps.write(&write) {
                Ok(()) => {
                    self.mirror.apply(&write);
                    self.stats.writes += 1;
                }
                Err(e) => {
                    *self.stats.errors.entry("rollback").or_default() += 1;
                    tracing::error!(error = %e, ?write, "rollback write failed");
                }
            }
        }
    }

    /// Frontends, slots and metadata of service ids no desired service owns (left by a crash
    /// or by an older agent).
    fn sweep_orphans(&mut self, report: &mut SyncReport) {
        let owned: BTreeSet<u32> = self.ids.values().copied().collect();
        let mut orphans: BTreeSet<u32> = self.mirror.frontend_service_ids().collect();
        orphans.extend(self.mirror.snap.slots.keys().map(|k| k.service_id));
        orphans.extend(self.mirror.snap.meta.keys().copied());
        orphans.retain(|id| !owned.contains(id));
        for id in orphans {
            let mut writes: Vec<MapWrite> = self
                .mirror
                .frontends_of(id)
                .copied()
                .map(MapWrite::DeleteFrontend)
                .collect();
            writes.extend(self.mirror.slots_of(id).keys().map(|s| {
                MapWrite::DeleteSlot(SlotKey {
                    service_id: id,
                    slot: *s,
                })
            }));
            if self.mirror.snap.meta.contains_key(&id) {
                writes.push(MapWrite::DeleteMeta(id));
            }
            let mut undo = Vec::new();
            if let Err(e) = self.execute(&writes, &mut undo) {
                *self.stats.errors.entry(e.kind()).or_default() += 1;
                tracing::warn!(service_id = id, error = %e, "could not remove orphaned service");
            }
            report.writes += undo.len();
            report.services_removed += 1;
        }
    }

    fn free_unreferenced_backends(&mut self, report: &mut SyncReport) {
        let frees: Vec<MapWrite> = self
            .mirror
            .unreferenced_backends()
            .into_iter()
            .map(MapWrite::DeleteBackend)
            .collect();
        let mut undo = Vec::new();
        if let Err(e) = self.execute(&frees, &mut undo) {
            *self.stats.errors.entry(e.kind()).or_default() += 1;
        }
        report.writes += undo.len();
    }
}

fn frontend_flags(key: &ServicePortKey, desired: &DesiredService) -> u16 {
    let mut flags = 0;
    if desired.affinity_timeout_s.is_some() {
        flags |= FRONTEND_FLAG_AFFINITY;
    }
    if key.scope == Scope::External {
        flags |= FRONTEND_FLAG_EXTERNAL;
    }
    flags
}

fn service_meta(key: &ServicePortKey, port: u16) -> ServiceMeta {
    ServiceMeta {
        name: to_fixed(&key.service.to_string()),
        port_name: to_fixed(&key.port_name),
        port,
        protocol: key.protocol.number(),
        family: key.family.number(),
        scope: match key.scope {
            Scope::Internal => SCOPE_INTERNAL,
            Scope::External => SCOPE_EXTERNAL,
        },
        _pad: [0; 3],
    }
}
