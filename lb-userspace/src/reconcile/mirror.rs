//! The reconciler's copy of what the maps hold, with the indexes a diff needs. It changes only
//! through `apply`, after the same write succeeded on the maps, so it never drifts from them.
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
};

use lb_common::{FrontendKey, SCOPE_EXTERNAL, ServiceMeta, SlotKey};

use crate::{
    dataplane::{
        abi::{Family, Protocol, backend_from_abi, from_fixed},
        maps::{MapSnapshot, MapWrite},
    },
    model::ObjectKey,
    translate::{Scope, ServicePortKey},
    vec_set::VecSet,
};

#[derive(Clone, Debug, Default)]
pub struct Mirror {
    pub snap: MapSnapshot,
    backend_ids: BTreeMap<SocketAddr, u32>,
    /// How many slots name each backend id.
    backend_refs: HashMap<u32, u32>,
    frontends_of: BTreeMap<u32, VecSet<FrontendKey>>,
}

impl Mirror {
    pub fn from_snapshot(snap: MapSnapshot) -> Self {
        let mut mirror = Self::default();
        for (id, b) in &snap.backends {
            if let Some(addr) = backend_from_abi(b) {
                mirror.backend_ids.insert(addr, *id);
            }
        }
        for id in snap.slots.values() {
            *mirror.backend_refs.entry(*id).or_default() += 1;
        }
        for (k, f) in &snap.frontends {
            mirror
                .frontends_of
                .entry(f.service_id)
                .or_default()
                .insert(*k);
        }
        mirror.snap = snap;
        mirror
    }

    pub fn apply(&mut self, write: &MapWrite) {
        match write {
            MapWrite::PutBackend(id, b) => {
                if let Some(addr) = backend_from_abi(b) {
                    self.backend_ids.insert(addr, *id);
                }
            }
            MapWrite::DeleteBackend(id) => {
                if let Some(addr) = self.snap.backends.get(id).and_then(backend_from_abi) {
                    self.backend_ids.remove(&addr);
                }
            }
            MapWrite::PutSlot(k, id) => {
                if let Some(old) = self.snap.slots.get(k).copied() {
                    self.unref(old);
                }
                *self.backend_refs.entry(*id).or_default() += 1;
            }
            MapWrite::DeleteSlot(k) => {
                if let Some(old) = self.snap.slots.get(k).copied() {
                    self.unref(old);
                }
            }
            MapWrite::PutFrontend(k, f) => {
                if let Some(old) = self.snap.frontends.get(k) {
                    self.drop_frontend(old.service_id, k);
                }
                self.frontends_of
                    .entry(f.service_id)
                    .or_default()
                    .insert(*k);
            }
            MapWrite::DeleteFrontend(k) => {
                if let Some(old) = self.snap.frontends.get(k) {
                    self.drop_frontend(old.service_id, k);
                }
            }
            MapWrite::PutMeta(..) | MapWrite::DeleteMeta(_) => {}
        }
        self.snap.apply(write);
    }

    fn unref(&mut self, id: u32) {
        if let Some(n) = self.backend_refs.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.backend_refs.remove(&id);
            }
        }
    }

    fn drop_frontend(&mut self, service_id: u32, key: &FrontendKey) {
        if let Some(set) = self.frontends_of.get_mut(&service_id) {
            set.remove(key);
            if set.is_empty() {
                self.frontends_of.remove(&service_id);
            }
        }
    }

    pub fn backend_id(&self, addr: &SocketAddr) -> Option<u32> {
        self.backend_ids.get(addr).copied()
    }

    pub fn backend_addr(&self, id: u32) -> Option<SocketAddr> {
        self.snap.backends.get(&id).and_then(backend_from_abi)
    }

    pub fn is_referenced(&self, backend_id: u32) -> bool {
        self.backend_refs.contains_key(&backend_id)
    }

    /// The frontend keys that point at a service id.
    pub fn frontends_of(&self, service_id: u32) -> impl Iterator<Item = &FrontendKey> {
        self.frontends_of.get(&service_id).into_iter().flatten()
    }

    /// The service ids that frontends point at.
    pub fn frontend_service_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.frontends_of.keys().copied()
    }

    /// Slot number → backend id for a service, all slots present (also beyond its count).
    pub fn slots_of(&self, service_id: u32) -> BTreeMap<u32, u32> {
        let from = SlotKey {
            service_id,
            slot: 0,
        };
        let to = SlotKey {
            service_id,
            slot: u32::MAX,
        };
        self.snap
            .slots
            .range(from..=to)
            .map(|(k, v)| (k.slot, *v))
            .collect()
    }

    /// The largest count among the service's frontends: the slots the data path may read.
    pub fn active_count(&self, service_id: u32) -> u16 {
        self.frontends_of(service_id)
            .filter_map(|k| self.snap.frontends.get(k))
            .map(|f| f.count)
            .max()
            .unwrap_or(0)
    }

    /// Backend ids no slot names.
    pub fn unreferenced_backends(&self) -> Vec<u32> {
        self.snap
            .backends
            .keys()
            .copied()
            .filter(|id| !self.is_referenced(*id))
            .collect()
    }
}

/// The service port a metadata entry describes.
pub fn key_from_meta(meta: &ServiceMeta) -> Option<ServicePortKey> {
    Some(ServicePortKey {
        service: ObjectKey::parse(&from_fixed(&meta.name)),
        port_name: from_fixed(&meta.port_name),
        protocol: Protocol::from_number(meta.protocol)?,
        family: Family::from_number(meta.family)?,
        scope: if meta.scope == SCOPE_EXTERNAL {
            Scope::External
        } else {
            Scope::Internal
        },
    })
}
