//! The agent's core, free of IO: source events in, map writes out (through whatever
//! `ServiceMaps` the reconciler holds). It writes nothing until both Services and
//! EndpointSlices have been listed once; the first write is a full sync that also sweeps what
//! the maps hold but the cluster no longer has. After that, each change recomputes only the
//! Services it touches.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::{
    dataplane::maps::ServiceMaps,
    model::{NodeObject, ObjectKey, Store},
    reconcile::{Reconciler, ServiceProblem, SyncReport},
    source::{Kind, Object, SourceEvent},
    translate::{DesiredState, Detail, NodeInfo, ServicePortKey, translate_service_with},
    vec_set::VecSet,
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
    /// Backends no UDP service port uses any more: connected UDP sockets to them are stale.
    pub stale_udp_backends: BTreeSet<SocketAddr>,
}

pub struct Engine<M: ServiceMaps> {
    store: Store,
    node: NodeInfo,
    reconciler: Reconciler<M>,
    listed: BTreeSet<Kind>,
    synced: bool,
    full_sync_needed: bool,
    dirty: BTreeSet<ObjectKey>,
    keys_by_service: BTreeMap<ObjectKey, VecSet<ServicePortKey>>,
    pending_since: Option<Instant>,
    resource_versions: BTreeMap<Kind, String>,
    /// Latest rejection per object (or per source when unnamed).
    rejected: BTreeMap<String, String>,
    rejected_total: u64,
}

impl<M: ServiceMaps> Engine<M> {
    pub fn new(reconciler: Reconciler<M>, node: NodeInfo) -> Self {
        Self {
            store: Store::new(),
            node,
            reconciler,
            listed: BTreeSet::new(),
            synced: false,
            full_sync_needed: true,
            dirty: BTreeSet::new(),
            keys_by_service: BTreeMap::new(),
            pending_since: None,
            resource_versions: BTreeMap::new(),
            rejected: BTreeMap::new(),
            rejected_total: 0,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    pub fn reconciler(&self) -> &Reconciler<M> {
        &self.reconciler
    }

    pub fn reconciler_mut(&mut self) -> &mut Reconciler<M> {
        &mut self.reconciler
    }

    /// Both kinds listed and the first full sync written.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    pub fn rejected(&self) -> &BTreeMap<String, String> {
        &self.rejected
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected_total
    }

    pub fn resource_versions(&self) -> &BTreeMap<Kind, String> {
        &self.resource_versions
    }

    pub fn handle(&mut self, event: SourceEvent) {
        self.pending_since.get_or_insert_with(Instant::now);
        match event {
            SourceEvent::Listed {
                kind,
                objects,
                resource_version,
                keep,
            } => {
                let affected = match kind {
                    Kind::Service => self.store.replace_services(
                        objects
                            .into_iter()
                            .filter_map(|o| match o {
                                Object::Service(s) => Some(*s),
                                Object::EndpointSlice(_) => None,
                            })
                            .collect(),
                        &keep,
                    ),
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
                };
                self.listed.insert(kind);
                if let Some(rv) = resource_version {
                    self.resource_versions.insert(kind, rv);
                }
                self.dirty.extend(affected);
            }
            SourceEvent::Applied(Object::Service(s)) => {
                self.forget_rejection(&format!("Service {}", s.key));
                let key = self.store.upsert_service(*s);
                self.dirty.insert(key);
            }
            SourceEvent::Applied(Object::EndpointSlice(s)) => {
                self.forget_rejection(&format!("EndpointSlice {}", s.key));
                let affected = self.store.upsert_slice(*s);
                self.dirty.extend(affected);
            }
            SourceEvent::Deleted(Kind::Service, key) => {
                self.dirty.extend(self.store.remove_service(&key));
            }
            SourceEvent::Deleted(Kind::EndpointSlice, key) => {
                self.dirty.extend(self.store.remove_slice(&key));
            }
            SourceEvent::Node(node) => self.set_node(&node),
            SourceEvent::Rejected { object, message } => {
                tracing::warn!(object = object.as_deref().unwrap_or("-"), "{message}");
                self.rejected_total += 1;
                self.rejected
                    .insert(object.unwrap_or_else(|| "source".into()), message);
            }
        }
    }

    fn forget_rejection(&mut self, label: &str) {
        self.rejected.remove(label);
    }

    fn set_node(&mut self, node: &NodeObject) {
        let mut info = self.node.clone();
        if node.zone.is_some() {
            info.zone.clone_from(&node.zone);
        }
        if !node.addresses.is_empty() {
            info.addresses.clone_from(&node.addresses);
        }
        if info != self.node {
            tracing::info!(zone = ?info.zone, addresses = ?info.addresses, "node identity changed");
            self.node = info;
            self.full_sync_needed = true;
        }
    }

    /// Marks the services of every failed service port for another attempt.
    pub fn retry_failed(&mut self) {
        let services: Vec<ObjectKey> = self
            .reconciler
            .problems()
            .keys()
            .map(|k| k.service.clone())
            .collect();
        self.dirty.extend(services);
    }

    pub fn has_work(&self) -> bool {
        self.listed.len() == 2 && (self.full_sync_needed || !self.dirty.is_empty())
    }

    /// Writes what changed. Does nothing before both kinds have been listed.
    pub fn reconcile(&mut self) -> Option<Pass> {
        if !self.has_work() {
            return None;
        }
        let start = Instant::now();
        let lag_from = self.pending_since.take();
        let mut pass = Pass::default();
        if self.full_sync_needed {
            let (desired, keys) = self.translate_everything();
            pass.services = keys.len();
            self.keys_by_service = keys;
            pass.report = self.reconciler.sync_all(&desired);
            drop(desired);
            super::memory::release_free_memory();
            pass.full = true;
            self.dirty.clear();
            self.full_sync_needed = false;
            self.synced = true;
        } else {
            let dirty = std::mem::take(&mut self.dirty);
            pass.services = dirty.len();
            for svc in &dirty {
                self.sync_service(svc, &mut pass.report);
            }
            // A frontend another service was waiting for may have been freed just now.
            let waiting: BTreeSet<ObjectKey> = self
                .reconciler
                .problems()
                .iter()
                .filter(|(_, p)| matches!(p, ServiceProblem::FrontendConflict { .. }))
                .map(|(k, _)| k.service.clone())
                .filter(|s| !dirty.contains(s))
                .collect();
            for svc in &waiting {
                self.sync_service(svc, &mut pass.report);
            }
        }
        if !pass.report.udp_backends_removed.is_empty() {
            let active = self.reconciler.active_udp_backends();
            pass.stale_udp_backends = pass
                .report
                .udp_backends_removed
                .difference(&active)
                .copied()
                .collect();
        }
        pass.duration = start.elapsed();
        pass.lag = lag_from.map(|t| t.elapsed());
        Some(pass)
    }

    /// The desired state of every Service, and each Service's service ports, without the
    /// per-endpoint records only `explain` reads.
    fn translate_everything(&self) -> (DesiredState, BTreeMap<ObjectKey, VecSet<ServicePortKey>>) {
        let mut desired = DesiredState::default();
        let mut keys = BTreeMap::new();
        for svc in self.store.services() {
            let t = translate_service_with(
                svc,
                &self.store.slices_of(&svc.key),
                &self.node,
                Detail::Lean,
            );
            keys.insert(
                svc.key.clone(),
                t.ports.iter().map(|p| p.key.clone()).collect(),
            );
            for port in t.ports {
                desired.services.insert(port.key, port.desired);
            }
        }
        (desired, keys)
    }

    fn sync_service(&mut self, svc: &ObjectKey, report: &mut SyncReport) {
        let translation = self.store.service(svc).map(|s| {
            translate_service_with(s, &self.store.slices_of(svc), &self.node, Detail::Lean)
        });
        let mut old: BTreeSet<ServicePortKey> = self
            .keys_by_service
            .remove(svc)
            .map(|keys| keys.into_iter().collect())
            .unwrap_or_default();
        // Service ports whose removal failed earlier are still in the maps: remove them now.
        old.extend(
            self.reconciler
                .problems()
                .keys()
                .filter(|k| k.service == *svc)
                .cloned(),
        );
        let mut new = BTreeSet::new();
        for port in translation.iter().flat_map(|t| &t.ports) {
            new.insert(port.key.clone());
        }
        let mut tracked = new.clone();
        for gone in old.difference(&new) {
            merge(report, self.reconciler.sync_one(gone, None));
            if self.reconciler.service_id(gone).is_some() {
                tracked.insert(gone.clone());
            }
        }
        for port in translation.iter().flat_map(|t| &t.ports) {
            merge(
                report,
                self.reconciler.sync_one(&port.key, Some(&port.desired)),
            );
        }
        if !tracked.is_empty() {
            self.keys_by_service
                .insert(svc.clone(), tracked.into_iter().collect());
        }
    }
}

fn merge(into: &mut SyncReport, from: SyncReport) {
    into.writes += from.writes;
    into.services_changed += from.services_changed;
    into.services_removed += from.services_removed;
    into.problems.extend(from.problems);
    into.udp_backends_removed.extend(from.udp_backends_removed);
}
