//! The agent's core, free of IO: source events in, map writes out (through whatever
//! `ServiceMaps` the reconciler holds). It writes nothing until both Services and
//! EndpointSlices have been listed once; the first write is a full sync that also sweeps what
//! the maps hold but the cluster no longer has. After that, each change recomputes only the
//! Services it touches, and the Services whose contested addresses change hands with it.
//!
//! It schedules each failing backend set's retries on its own (0.5 s doubling to 60 s, with
//! jitter), logs only when a set starts failing, fails for another reason or is written again,
//! and keeps since when each change that arrived after the first full sync waits to be written
//! (`unapplied_since`, kube-proxy's queued updates), which is all the health probes look at: a
//! failing source is not a change, and neither is a set the maps refuse for room.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::{
    dataplane::{abi::frontend_key, maps::ServiceMaps},
    hashing::FastMap,
    model::{EndpointSlice, NodeObject, Store},
    reconcile::{Reconciler, SyncReport},
    source::{Object, SourceEvent, Subject},
    translate::{
        Conflict, DesiredService, DesiredState, Detail, NodeFlags, NodeInfo, Ownership, Refusal,
        translate_service_with,
    },
    vec_set::VecSet,
    vocab::{Kind, ObjectKey, ObjectRef, ServicePortKey},
};

/// What one `reconcile` call did, for logs and metrics.
#[derive(Debug, Default)]
pub struct Pass {
    pub report: SyncReport,
    pub full: bool,
    pub services: usize,
    pub duration: Duration,
    /// From the first event of the batch to the writes being done.
    pub lag: Option<Duration>,
    /// Address conflicts that appeared with this pass (each logged once).
    pub new_conflicts: Vec<(ServicePortKey, Conflict)>,
    /// For each EndpointSlice change this pass made effective: from its
    /// `last-change-trigger-time` to now (network programming latency, as kube-proxy).
    pub programming_latencies: Vec<Duration>,
}

pub struct Engine<M: ServiceMaps> {
    store: Store,
    flags: NodeFlags,
    node: NodeInfo,
    /// This Node, as last seen, and whether it was deleted since.
    this_node: SeenNode,
    /// The sockets listening on this node, as last seen.
    listeners: Vec<crate::vocab::Listener>,
    /// The addresses on this node's interfaces, as last seen.
    bound: Vec<std::net::IpAddr>,
    /// Nothing is written before they are known (the agent's case; tests that never send them
    /// do not ask).
    bound_needed: bool,
    /// Addresses each Service names that are never a frontend.
    refused: BTreeMap<ObjectKey, Vec<Refusal>>,
    reconciler: Reconciler<M>,
    ownership: Ownership,
    listed: BTreeSet<Kind>,
    synced: bool,
    full_sync_needed: bool,
    dirty: BTreeSet<ObjectKey>,
    keys_by_service: FastMap<ObjectKey, VecSet<ServicePortKey>>,
    /// Claims each backend set lost to another, as last computed.
    conflicts: BTreeMap<ServicePortKey, Vec<Conflict>>,
    pending_since: Option<Instant>,
    /// Changes that arrived after the first full sync and are not written yet, by Service,
    /// each since its first unwritten change (kube-proxy's `QueuedUpdate`): a pass that writes
    /// a Service's backend sets clears it, one whose write fails keeps it (kube-proxy counts a
    /// failed sync as not updated).
    unapplied: FastMap<ObjectKey, Instant>,
    /// A change of this node's identity (every Service to translate again) not yet written.
    unapplied_node: Option<Instant>,
    /// Latest rejection per subject.
    rejected: BTreeMap<Subject, String>,
    rejected_total: u64,
    unhealthy: BTreeSet<Kind>,
    /// Slice changes not yet written, by Service: their trigger times (Unix ms).
    triggers: FastMap<ObjectKey, Vec<i64>>,
    /// Trigger times before this (Unix ms) are not latencies of ours (as kube-proxy).
    started_ms: i64,
    /// Backend sets whose last write failed: when each is tried again.
    failing: FastMap<ServicePortKey, Retry>,
    retries: u64,
}

/// This node's Node object as last seen (also after its deletion: its zone and addresses stay,
/// as in kube-proxy until it exits), and whether it was deleted since (or was missing from a
/// complete listing).
#[derive(Debug, Default)]
struct SeenNode {
    last: Option<NodeObject>,
    deleted: bool,
}

/// One failing backend set's retries: exponential delays with jitter, from `RETRY_MIN` to
/// `RETRY_MAX`, so a set that keeps failing costs little and logs only its state changes.
struct Retry {
    delays: backon::ExponentialBackoff,
    next: Instant,
    attempts: u32,
    error: String,
}

/// The first retry of a failed backend set comes after this, each next one twice as late, at
/// most `RETRY_MAX`.
pub(super) const RETRY_MIN: Duration = Duration::from_millis(500);
pub(super) const RETRY_MAX: Duration = Duration::from_mins(1);

impl Retry {
    fn new(error: String, now: Instant) -> Self {
        use backon::BackoffBuilder as _;
        let mut delays = backon::ExponentialBuilder::new()
            .with_min_delay(RETRY_MIN)
            .with_max_delay(RETRY_MAX)
            .with_jitter()
            .without_max_times()
            .build();
        let first = delays.next().unwrap_or(RETRY_MIN);
        Self {
            delays,
            next: now + first,
            attempts: 1,
            error,
        }
    }
}

impl<M: ServiceMaps> Engine<M> {
    pub fn new(reconciler: Reconciler<M>, flags: NodeFlags) -> Self {
        Self {
            store: Store::new(),
            node: NodeInfo::resolve(&flags, None, &[], &[]),
            this_node: SeenNode::default(),
            bound: Vec::new(),
            listeners: Vec::new(),
            bound_needed: false,
            refused: BTreeMap::new(),
            flags,
            reconciler,
            ownership: Ownership::default(),
            listed: BTreeSet::new(),
            synced: false,
            full_sync_needed: true,
            dirty: BTreeSet::new(),
            keys_by_service: FastMap::default(),
            conflicts: BTreeMap::new(),
            pending_since: None,
            unapplied: FastMap::default(),
            unapplied_node: None,
            rejected: BTreeMap::new(),
            rejected_total: 0,
            unhealthy: BTreeSet::new(),
            triggers: FastMap::default(),
            started_ms: unix_ms(),
            failing: FastMap::default(),
            retries: 0,
        }
    }

    /// Retries of failed backend sets so far.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// This node's Node object, once seen.
    pub fn node_object(&self) -> Option<&crate::model::NodeObject> {
        self.this_node.last.as_ref()
    }

    /// This node's Node object was deleted (or was missing from a complete listing), and has
    /// not come back since.
    pub fn node_deleted(&self) -> bool {
        self.this_node.deleted
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    pub fn reconciler(&self) -> &Reconciler<M> {
        &self.reconciler
    }

    /// Puts `reconciler` (over larger maps holding the same) in place of the current one, and
    /// asks for a full sync, which writes what found no room before.
    pub fn replace_reconciler(&mut self, reconciler: Reconciler<M>) -> Reconciler<M> {
        self.full_sync_needed = true;
        std::mem::replace(&mut self.reconciler, reconciler)
    }

    pub fn reconciler_mut(&mut self) -> &mut Reconciler<M> {
        &mut self.reconciler
    }

    /// Both kinds listed and the first full sync written.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Every watch (or folder read) works.
    pub fn is_healthy(&self) -> bool {
        self.unhealthy.is_empty()
    }

    pub fn rejected(&self) -> &BTreeMap<Subject, String> {
        &self.rejected
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected_total
    }

    /// Addresses each Service names that are never a frontend (special addresses).
    pub fn refused(&self) -> &BTreeMap<ObjectKey, Vec<Refusal>> {
        &self.refused
    }

    /// Addresses each backend set claims but another owns.
    pub fn conflicts(&self) -> &BTreeMap<ServicePortKey, Vec<Conflict>> {
        &self.conflicts
    }

    /// Since when the oldest change that arrived after the first full sync has waited to be
    /// written, if one waits: kube-proxy's `oldestPendingQueued` (`proxy_health.go`). Nothing
    /// before the first full sync counts, nor an unreachable API server (it sends no change),
    /// nor the retries of a backend set that failed without a change; a change whose write
    /// fails keeps waiting until a retry writes it.
    pub fn unapplied_since(&self) -> Option<Instant> {
        self.unapplied
            .values()
            .copied()
            .chain(self.unapplied_node)
            .min()
    }

    /// Marks Services to translate again after a change; after the first full sync the change
    /// also waits to be written (`unapplied_since`).
    fn changed(&mut self, services: impl IntoIterator<Item = ObjectKey>) {
        let now = Instant::now();
        for key in services {
            if self.synced {
                self.unapplied.entry(key.clone()).or_insert(now);
            }
            // A full sync recomputes every Service and clears the set.
            if !self.full_sync_needed {
                self.dirty.insert(key);
            }
        }
    }

    pub fn handle(&mut self, event: SourceEvent) {
        self.pending_since.get_or_insert_with(Instant::now);
        match event {
            SourceEvent::Listed {
                kind,
                objects,
                keep,
            } => {
                for o in &objects {
                    self.rejected.remove(&Subject::Object(o.object_ref()));
                }
                if kind == Kind::EndpointSlice {
                    for o in &objects {
                        if let Object::EndpointSlice(s) = o {
                            self.note_trigger(s);
                        }
                    }
                }
                let affected = match kind {
                    Kind::EndpointSlice => self.store.replace_slices(
                        objects
                            .into_iter()
                            .filter_map(|o| match o {
                                Object::EndpointSlice(s) => Some(*s),
                                Object::Service(_) => None,
                            })
                            .collect(),
                        &keep,
                    ),
                    _ => self.store.replace_services(
                        objects
                            .into_iter()
                            .filter_map(|o| match o {
                                Object::Service(s) => Some(*s),
                                Object::EndpointSlice(_) => None,
                            })
                            .collect(),
                        &keep,
                    ),
                };
                self.listed.insert(kind);
                self.changed(affected);
            }
            SourceEvent::Applied(object) => {
                self.rejected.remove(&Subject::Object(object.object_ref()));
                match object {
                    Object::Service(s) => {
                        let key = self.store.upsert_service(*s);
                        self.changed([key]);
                    }
                    Object::EndpointSlice(s) => {
                        self.note_trigger(&s);
                        let affected = self.store.upsert_slice(*s);
                        self.changed(affected);
                    }
                }
            }
            SourceEvent::Deleted(Kind::EndpointSlice, key) => {
                self.rejected
                    .remove(&Subject::Object(ObjectRef::slice(key.clone())));
                let affected = self.store.remove_slice(&key);
                self.changed(affected);
            }
            SourceEvent::Deleted(_, key) => {
                self.rejected
                    .remove(&Subject::Object(ObjectRef::service(key.clone())));
                let affected = self.store.remove_service(&key);
                self.changed(affected);
            }
            SourceEvent::Node(node) => self.node_event(Some(node)),
            SourceEvent::NodeDeleted => self.node_event(None),
            SourceEvent::LocalListeners(listeners) => self.local_listeners(listeners),
            SourceEvent::LocalAddresses(addrs) => self.local_addresses(addrs),
            SourceEvent::Rejected { subject, message } => {
                if self.rejected.get(&subject) != Some(&message) {
                    tracing::warn!(%subject, "{message}");
                    self.rejected_total += 1;
                }
                self.rejected.insert(subject, message);
            }
            SourceEvent::Fixed(subject) => {
                if self.rejected.remove(&subject).is_some() {
                    tracing::info!(%subject, "fixed");
                }
            }
            SourceEvent::Health { kind, ok } => {
                if ok {
                    self.unhealthy.remove(&kind);
                } else {
                    self.unhealthy.insert(kind);
                }
            }
        }
    }

    /// This node's Node object, or (`None`) its deletion: the last one seen stays in effect.
    fn node_event(&mut self, node: Option<NodeObject>) {
        let Some(node) = node else {
            if !self.this_node.deleted {
                let node = self.flags.name.as_deref().unwrap_or_default();
                if self.this_node.last.is_some() {
                    tracing::warn!(
                        node,
                        "this node's Node object was deleted: kube-proxy's /healthz answers 503 (load balancers drain the node); the last zone and addresses stay in effect"
                    );
                } else {
                    tracing::warn!(
                        node,
                        "no Node object of this name: kube-proxy's /healthz answers 503 until it appears"
                    );
                }
            }
            self.this_node.deleted = true;
            return;
        };
        if self.this_node.deleted {
            tracing::info!(node = %node.name, "this node's Node object is back");
            self.this_node.deleted = false;
        }
        self.this_node.last = Some(node);
        self.resolve_node();
    }

    /// This node's interface addresses changed (or are known for the first time).
    fn local_addresses(&mut self, mut addrs: Vec<std::net::IpAddr>) {
        addrs.sort_unstable();
        addrs.dedup();
        self.bound_needed = false;
        if addrs != self.bound {
            self.bound = addrs;
            self.resolve_node();
        }
    }

    /// The sockets listening on this node changed.
    fn local_listeners(&mut self, mut listeners: Vec<crate::vocab::Listener>) {
        listeners.sort_unstable();
        listeners.dedup();
        if listeners != self.listeners {
            self.listeners = listeners;
            self.resolve_node();
        }
    }

    /// Remembers when a slice's change was triggered, if it is new and happened after start.
    fn note_trigger(&mut self, slice: &EndpointSlice) {
        let (Some(at), Some(service)) = (slice.last_change_trigger_ms, &slice.service) else {
            return;
        };
        let known = self
            .store
            .slice(&slice.key)
            .and_then(|s| s.last_change_trigger_ms);
        if at >= self.started_ms && known != Some(at) {
            self.triggers.entry(service.clone()).or_default().push(at);
        }
    }

    /// The latencies of the slice changes of `services` that are now written (Services with a
    /// failed backend set keep theirs until the retry writes them).
    fn programmed(&mut self, services: impl IntoIterator<Item = ObjectKey>) -> Vec<Duration> {
        let now = unix_ms();
        let mut latencies = Vec::new();
        for svc in services {
            if self.reconciler.failed().keys().any(|k| k.service == svc) {
                continue;
            }
            for at in self.triggers.remove(&svc).unwrap_or_default() {
                latencies.push(Duration::from_millis(
                    u64::try_from(now.saturating_sub(at)).unwrap_or(0),
                ));
            }
        }
        latencies
    }

    /// The Services with a backend set the maps refused for a reason other than room: a
    /// change to them is not applied. A set refused for room (the capacity rule leaves the
    /// newest object out, reported) is applied as far as it can be, as a rejected object is:
    /// kube-proxy has no capacity, and one tenant's oversized Service must not turn every
    /// node's health checks 503.
    fn unwritable_services(&self) -> BTreeSet<ObjectKey> {
        self.reconciler
            .failed()
            .iter()
            .filter(|(_, e)| e.kind() != crate::vocab::ErrorKind::MapFull)
            .map(|(k, _)| k.service.clone())
            .collect()
    }

    /// Who this node is from the flags, its Node object and its interfaces' addresses; a change
    /// rewrites everything.
    fn resolve_node(&mut self) {
        let info = NodeInfo::resolve(
            &self.flags,
            self.this_node.last.as_ref(),
            &self.bound,
            &self.listeners,
        );
        if info == self.node {
            return;
        }
        // Listeners come and go with any process on the node: they matter only to the
        // Services claiming one of its addresses, not to every Service.
        let listeners_only = NodeInfo {
            listeners: self.node.listeners.clone(),
            ..info.clone()
        } == self.node;
        if listeners_only {
            let own = &info.own_addresses;
            let affected: Vec<ObjectKey> = self
                .store
                .services()
                .filter(|s| {
                    s.cluster_ips
                        .iter()
                        .chain(&s.external_ips)
                        .chain(s.lb_ingress.iter().map(|i| &i.ip))
                        .any(|ip| own.contains(ip))
                })
                .map(|s| s.key.clone())
                .collect();
            self.node = info;
            self.changed(affected);
            return;
        }
        tracing::info!(
            zone = ?info.zone,
            node_ports = ?info.addresses,
            own = ?info.own_addresses,
            "node identity changed"
        );
        self.node = info;
        self.full_sync_needed = true;
        if self.synced {
            self.unapplied_node.get_or_insert_with(Instant::now);
        }
    }

    /// Follows another Kubernetes version's topology rules (the API server's changed): every
    /// Service is translated again.
    pub fn set_kube_version(&mut self, version: crate::translate::KubeVersion) {
        self.flags.kube_version = version;
        self.resolve_node();
    }

    /// Marks the Services of the failed backend sets whose retry is due for another attempt.
    pub fn retry_failed(&mut self) {
        let now = Instant::now();
        let due: Vec<ObjectKey> = self
            .reconciler
            .failed()
            .keys()
            .filter(|k| self.failing.get(*k).is_none_or(|r| r.next <= now))
            .map(|k| k.service.clone())
            .collect();
        self.retries += due.len() as u64;
        self.dirty.extend(due);
    }

    /// After a pass: logs the sets that started or stopped failing, and schedules each failing
    /// set's next try (later each time it fails again).
    fn track_failures(&mut self, tried: Option<&BTreeSet<ObjectKey>>) {
        let now = Instant::now();
        let failed = self.reconciler.failed();
        self.failing.retain(|key, retry| {
            if failed.contains_key(key) {
                return true;
            }
            tracing::info!(service = %key, attempts = retry.attempts, "written as desired again");
            false
        });
        for (key, error) in failed {
            let text = error.to_string();
            match self.failing.get_mut(key) {
                None => {
                    tracing::warn!(service = %key, error = %text, "service port not written as desired; retrying with backoff");
                    self.failing.insert(key.clone(), Retry::new(text, now));
                }
                Some(retry) if tried.is_none_or(|t| t.contains(&key.service)) => {
                    retry.attempts += 1;
                    retry.next = now + retry.delays.next().unwrap_or(RETRY_MAX);
                    if retry.error != text {
                        tracing::warn!(service = %key, error = %text, attempts = retry.attempts, "service port still not written, now for another reason");
                        retry.error = text;
                    }
                }
                Some(_) => {}
            }
        }
    }

    pub fn has_work(&self) -> bool {
        self.listed.len() == 2
            && !self.bound_needed
            && (self.full_sync_needed || !self.dirty.is_empty())
    }

    /// Writes nothing until this node's interface addresses are known
    /// (`SourceEvent::LocalAddresses`).
    pub fn await_local_addresses(&mut self) {
        self.bound_needed = true;
    }

    /// Writes what changed. Does nothing before both kinds have been listed.
    pub fn reconcile(&mut self) -> Option<Pass> {
        if !self.has_work() {
            return None;
        }
        let start = Instant::now();
        let lag_from = self.pending_since.take();
        let mut pass = Pass::default();
        let before = self.conflicts.clone();
        if self.full_sync_needed {
            let desired = self.translate_everything();
            pass.services = self.keys_by_service.len();
            pass.report = self.reconciler.sync_all_owned(desired);
            super::memory::release_free_memory();
            pass.full = true;
            let all: Vec<ObjectKey> = self.triggers.keys().cloned().collect();
            pass.programming_latencies = self.programmed(all);
            self.dirty.clear();
            self.full_sync_needed = false;
            self.synced = true;
            self.track_failures(None);
            self.unapplied_node = None;
            let failing = self.unwritable_services();
            self.unapplied.retain(|svc, _| failing.contains(svc));
        } else {
            let dirty = std::mem::take(&mut self.dirty);
            pass.services = dirty.len();
            pass.report = self.sync_services(&dirty);
            self.track_failures(Some(&dirty));
            let failing = self.unwritable_services();
            for svc in dirty.iter().filter(|s| !failing.contains(*s)) {
                self.unapplied.remove(svc);
            }
            pass.programming_latencies = self.programmed(dirty);
        }
        for (key, list) in &self.conflicts {
            for c in list {
                if !before.get(key).is_some_and(|old| old.contains(c)) {
                    pass.new_conflicts.push((key.clone(), c.clone()));
                }
            }
        }
        pass.duration = start.elapsed();
        pass.lag = lag_from.map(|t| t.elapsed());
        Some(pass)
    }

    /// The desired state of every Service, with address ownership decided, and each Service's
    /// backend sets.
    fn translate_everything(&mut self) -> DesiredState {
        // Collected first, then built in one go: a B-tree built from sorted entries has full
        // nodes, one filled by inserts in order half-full ones (1.4 MiB at 10,000 sets, held
        // through the whole sync).
        let mut sets = Vec::with_capacity(self.store.service_count());
        self.keys_by_service.clear();
        self.ownership = Ownership::with_capacity(self.store.service_count());
        self.refused.clear();
        for svc in self.store.services() {
            let t = translate_service_with(
                svc,
                &self.store.slices_of(&svc.key),
                &self.node,
                Detail::Lean,
            );
            if !t.refused.is_empty() {
                self.refused.insert(svc.key.clone(), t.refused.clone());
            }
            self.keys_by_service.insert(
                svc.key.clone(),
                t.ports.iter().map(|p| p.key.clone()).collect(),
            );
            for port in t.ports {
                self.ownership.claim_new(&port.key, &port.desired);
                sets.push((port.key, port.desired));
            }
        }
        let mut desired = DesiredState {
            services: sets.into_iter().collect(),
        };
        self.conflicts = desired
            .services
            .iter()
            .map(|(k, d)| (k.clone(), self.ownership.conflicts(k, d)))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        self.ownership.apply(&mut desired);
        desired
    }

    /// Recomputes the given Services, and any Service whose contested addresses change owner
    /// with them, and writes the result.
    fn sync_services(&mut self, dirty: &BTreeSet<ObjectKey>) -> SyncReport {
        let mut report = SyncReport::default();
        let mut translated: BTreeMap<ObjectKey, Vec<(ServicePortKey, DesiredService)>> =
            BTreeMap::new();
        let mut removed: Vec<ServicePortKey> = Vec::new();
        let mut affected: BTreeSet<ServicePortKey> = BTreeSet::new();
        for svc in dirty {
            let sets = self.translate(svc);
            let old = self.keys_by_service.remove(svc).unwrap_or_default();
            // Backend sets whose removal failed earlier are still in the maps: remove them now.
            let mut old: BTreeSet<ServicePortKey> = old.into_iter().collect();
            old.extend(
                self.reconciler
                    .failed()
                    .keys()
                    .filter(|k| k.service == *svc)
                    .cloned(),
            );
            for gone in old.iter().filter(|k| !sets.iter().any(|(n, _)| n == *k)) {
                affected.extend(self.ownership.release(gone));
                removed.push(gone.clone());
            }
            for (key, desired) in &sets {
                affected.extend(self.ownership.claim(key, desired));
            }
            if !sets.is_empty() {
                self.keys_by_service
                    .insert(svc.clone(), sets.iter().map(|(k, _)| k.clone()).collect());
            }
            translated.insert(svc.clone(), sets);
        }
        // Services whose addresses change hands with these: re-read them as they are.
        let others: BTreeSet<ObjectKey> = affected
            .iter()
            .map(|k| k.service.clone())
            .filter(|s| !translated.contains_key(s))
            .collect();
        for svc in others {
            let sets = self.translate(&svc);
            translated.insert(svc, sets);
        }
        // Sets that gain an address are written before those that lose it, so the address is
        // handed over without a moment of nobody serving it.
        let mut writes: Vec<(bool, ServicePortKey, DesiredService)> = Vec::new();
        for sets in translated.into_values() {
            for (key, mut desired) in sets {
                let lost = self.ownership.conflicts(&key, &desired);
                if lost.is_empty() {
                    self.conflicts.remove(&key);
                } else {
                    self.conflicts.insert(key.clone(), lost);
                }
                desired.frontends = self.ownership.granted(&key, &desired);
                let id = self.reconciler.service_id(&key);
                let snap = self.reconciler.snapshot();
                let gains = desired.frontends.iter().any(|c| {
                    snap.frontends
                        .get(&frontend_key(c.addr))
                        .is_none_or(|f| Some(f.service_id) != id)
                });
                writes.push((!gains, key, desired));
            }
        }
        // Gainers first; then, as in a full sync, capacity to the oldest Service first.
        writes.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.2.seniority.age().cmp(&b.2.seniority.age()))
                .then_with(|| a.1.cmp(&b.1))
        });
        for (_, key, desired) in &writes {
            report.merge(self.reconciler.sync_one(key, Some(desired)));
        }
        for key in &removed {
            self.conflicts.remove(key);
            report.merge(self.reconciler.sync_one(key, None));
            if self.reconciler.service_id(key).is_some() {
                // Its removal failed: keep tracking it so the retry removes it.
                self.keys_by_service
                    .entry(key.service.clone())
                    .or_default()
                    .insert(key.clone());
            }
        }
        if !removed.is_empty() {
            // What the removals freed goes, in this same pass, to the sets of this batch that
            // found no room (the oldest first, as above).
            for (_, key, desired) in &writes {
                let short = report
                    .failed
                    .get(key)
                    .is_some_and(|e| e.kind() == crate::vocab::ErrorKind::MapFull);
                if short {
                    report.failed.remove(key);
                    report.merge(self.reconciler.sync_one(key, Some(desired)));
                }
            }
        }
        report
    }

    fn translate(&mut self, svc: &ObjectKey) -> Vec<(ServicePortKey, DesiredService)> {
        let Some(s) = self.store.service(svc) else {
            self.refused.remove(svc);
            return Vec::new();
        };
        let t = translate_service_with(s, &self.store.slices_of(svc), &self.node, Detail::Lean);
        if t.refused.is_empty() {
            self.refused.remove(svc);
        } else if self.refused.get(svc) != Some(&t.refused) {
            for r in &t.refused {
                tracing::warn!(service = %svc, "not served: {r}");
            }
            self.refused.insert(svc.clone(), t.refused);
        }
        t.ports.into_iter().map(|p| (p.key, p.desired)).collect()
    }
}

/// Wall-clock time in Unix milliseconds (trigger times are wall-clock).
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::Engine;
    use crate::{
        dataplane::maps::InMemoryMaps,
        model::{ManifestObject, parse_manifests},
        reconcile::Reconciler,
        source::{Object, SourceEvent},
        translate::NodeFlags,
        vocab::Kind,
    };

    fn objects(yaml: &str) -> Vec<Object> {
        let parsed = parse_manifests("t.yaml", yaml.as_bytes());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        parsed
            .objects
            .into_iter()
            .filter_map(|o| match o {
                ManifestObject::Service(s) => Some(Object::Service(s)),
                ManifestObject::EndpointSlice(s) => Some(Object::EndpointSlice(s)),
                ManifestObject::Node(_) => None,
            })
            .collect()
    }

    fn web(endpoints: &str) -> Vec<Object> {
        objects(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: d}}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{{name: http, port: 80}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: d, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{endpoints}]\n"
        ))
    }

    fn listed(engine: &mut Engine<InMemoryMaps>, objects: Vec<Object>) {
        let (services, slices): (Vec<Object>, Vec<Object>) = objects
            .into_iter()
            .partition(|o| matches!(o, Object::Service(_)));
        for (kind, objects) in [(Kind::Service, services), (Kind::EndpointSlice, slices)] {
            engine.handle(SourceEvent::Listed {
                kind,
                objects,
                keep: Vec::new(),
            });
        }
    }

    fn slice_of(objects: Vec<Object>) -> Object {
        objects
            .into_iter()
            .find(|o| matches!(o, Object::EndpointSlice(_)))
            .expect("a slice")
    }

    /// A listener coming or going on the node re-translates only the Services claiming one of
    /// its addresses, not every Service (host processes open listeners all the time).
    #[test]
    fn a_listener_change_translates_only_services_on_the_nodes_addresses() {
        use crate::vocab::{Listener, Protocol};
        let mut engine = Engine::new(
            Reconciler::new(InMemoryMaps::new()).expect("reconciler"),
            NodeFlags::default(),
        );
        let mut all = web("{addresses: [10.244.0.1]}");
        all.extend(objects(
            "apiVersion: v1\nkind: Service\nmetadata: {name: other, namespace: d}\nspec:\n  clusterIP: 10.96.0.2\n  ports: [{name: http, port: 80}]\n",
        ));
        listed(&mut engine, all);
        // web's ClusterIP is bound on the node (as NodeLocal DNSCache binds kube-dns's).
        engine.handle(SourceEvent::LocalAddresses(vec![
            "10.96.0.1".parse().expect("ip"),
        ]));
        assert!(engine.reconcile().is_some_and(|p| p.full));
        let listener = |addr: Option<&str>, port| Listener {
            addr: addr.map(|a| a.parse().expect("ip")),
            port,
            protocol: Protocol::Tcp,
        };
        engine.handle(SourceEvent::LocalListeners(vec![listener(None, 22)]));
        let pass = engine.reconcile().expect("a pass");
        assert!(!pass.full, "no full sync for a listener");
        assert_eq!(pass.services, 1, "web only");
        assert!(
            !engine
                .node()
                .serves("10.96.0.1".parse().expect("ip"), 80, Protocol::Tcp)
        );
        engine.handle(SourceEvent::LocalListeners(vec![
            listener(None, 22),
            listener(Some("10.96.0.1"), 80),
        ]));
        let pass = engine.reconcile().expect("a pass");
        assert!(!pass.full);
        assert_eq!(pass.services, 1);
        assert!(
            engine
                .node()
                .serves("10.96.0.1".parse().expect("ip"), 80, Protocol::Tcp)
        );
    }

    /// kube-proxy's health rule (`proxy_health.go`): only a change queued after the first sync
    /// and not yet written counts; a sync that fails leaves it queued; nothing else (an
    /// unhealthy source, the initial lists, retries without a change) does.
    #[test]
    fn only_changes_after_the_first_sync_wait_and_a_failed_write_keeps_them_waiting() {
        let mut engine = Engine::new(
            Reconciler::new(InMemoryMaps::new()).expect("reconciler"),
            NodeFlags::default(),
        );
        listed(&mut engine, web("{addresses: [10.244.0.1]}"));
        assert_eq!(
            engine.unapplied_since(),
            None,
            "the initial lists never wait"
        );
        assert!(engine.reconcile().is_some_and(|p| p.full));
        assert_eq!(engine.unapplied_since(), None);

        // The API server goes away: the source says so, and nothing waits.
        engine.handle(SourceEvent::Health {
            kind: Kind::Service,
            ok: false,
        });
        assert!(!engine.is_healthy());
        assert_eq!(engine.unapplied_since(), None);
        engine.handle(SourceEvent::Health {
            kind: Kind::Service,
            ok: true,
        });

        // A change waits until a pass writes it.
        let before = Instant::now();
        engine.handle(SourceEvent::Applied(slice_of(web(
            "{addresses: [10.244.0.2]}",
        ))));
        let since = engine.unapplied_since().expect("a change waits");
        assert!(since >= before);
        // A second change does not move the clock (the oldest counts).
        engine.handle(SourceEvent::Applied(slice_of(web(
            "{addresses: [10.244.0.3]}",
        ))));
        assert_eq!(engine.unapplied_since(), Some(since));
        assert!(engine.reconcile().is_some());
        assert_eq!(engine.unapplied_since(), None, "written");

        // Every write fails: the change keeps waiting, through the retries, from its arrival.
        engine.reconciler_mut().maps_mut().fail_when(|_, _, _| true);
        engine.handle(SourceEvent::Applied(slice_of(web(
            "{addresses: [10.244.0.4]}",
        ))));
        let since = engine.unapplied_since().expect("a change waits");
        let pass = engine.reconcile().expect("a pass");
        assert!(!pass.report.failed.is_empty(), "{pass:?}");
        assert_eq!(engine.unapplied_since(), Some(since), "a failed write");
        std::thread::sleep(super::RETRY_MIN * 3);
        engine.retry_failed();
        assert!(engine.reconcile().is_some());
        assert_eq!(engine.unapplied_since(), Some(since), "a failed retry");

        // Writes work again: the retry writes it and nothing waits.
        engine.reconciler_mut().maps_mut().stop_failing();
        std::thread::sleep(super::RETRY_MAX.min(super::RETRY_MIN * 6));
        engine.retry_failed();
        assert!(engine.reconcile().is_some());
        assert!(engine.reconciler().failed().is_empty());
        assert_eq!(engine.unapplied_since(), None);
    }

    /// A backend set that fails from the first sync on, with no change since, does not count
    /// (kube-proxy's initial sync is not a queued update); its retries do not either.
    #[test]
    fn a_set_failing_since_the_first_sync_without_a_change_does_not_wait() {
        let mut maps = InMemoryMaps::new();
        maps.fail_when(|_, _, _| true);
        let mut engine = Engine::new(
            Reconciler::new(maps).expect("reconciler"),
            NodeFlags::default(),
        );
        listed(&mut engine, web("{addresses: [10.244.0.1]}"));
        let pass = engine.reconcile().expect("the first sync");
        assert!(!pass.report.failed.is_empty());
        assert_eq!(engine.unapplied_since(), None);
        std::thread::sleep(super::RETRY_MIN * 3);
        engine.retry_failed();
        assert!(engine.reconcile().is_some());
        assert_eq!(engine.unapplied_since(), None);
    }

    /// A change refused for room (a Service larger than the maps hold) is reported, but is no
    /// change waiting to be applied: one tenant's oversized Service must not turn every node's
    /// health checks 503 (kube-proxy has no capacity to run out of).
    #[test]
    fn a_change_refused_for_room_does_not_wait() {
        use crate::dataplane::maps::Capacities;
        let maps = InMemoryMaps::with_capacities(
            Capacities::default().with(lb_common::MapId::Backends, 2),
        );
        let mut engine = Engine::new(
            Reconciler::new(maps).expect("reconciler"),
            NodeFlags::default(),
        );
        listed(&mut engine, web("{addresses: [10.244.0.1]}"));
        assert!(engine.reconcile().is_some_and(|p| p.full));
        engine.handle(SourceEvent::Applied(slice_of(web(
            "{addresses: [10.244.0.1]}, {addresses: [10.244.0.2]}, {addresses: [10.244.0.3]}",
        ))));
        let pass = engine.reconcile().expect("a pass");
        assert!(
            pass.report
                .failed
                .values()
                .all(|e| e.kind() == crate::vocab::ErrorKind::MapFull)
                && !pass.report.failed.is_empty(),
            "{pass:?}"
        );
        assert_eq!(engine.unapplied_since(), None);
    }
}
