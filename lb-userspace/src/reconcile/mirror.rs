//! The reconciler's copy of what the maps hold, with the indexes a diff needs. It changes only
//! through `apply`, after the same write succeeded on the maps, so it never drifts from them.
use std::collections::HashMap;

use lb_common::FrontendKey;

use crate::{
    dataplane::maps::{MapSnapshot, MapWrite},
    vec_set::VecSet,
};

#[derive(Clone, Debug, Default)]
pub struct Mirror {
    pub snap: MapSnapshot,
    frontends_of: HashMap<u32, VecSet<FrontendKey>>,
    /// How many frontends use each (UDP?, port): the frontend port bitmap must hold these.
    port_users: HashMap<(bool, u16), u32>,
}

/// The (UDP?, port) of a frontend key, as the port bitmap indexes it.
pub fn port_of(key: &FrontendKey) -> (bool, u16) {
    (
        key.protocol == lb_common::PROTOCOL_UDP,
        u16::from_be(key.port_be),
    )
}

impl Mirror {
    pub fn from_snapshot(snap: MapSnapshot) -> Self {
        let mut mirror = Self::default();
        for (k, f) in &snap.frontends {
            mirror
                .frontends_of
                .entry(f.service_id)
                .or_default()
                .insert(*k);
            *mirror.port_users.entry(port_of(k)).or_default() += 1;
        }
        mirror.snap = snap;
        mirror
    }

    pub fn apply(&mut self, write: &MapWrite) {
        match write {
            MapWrite::PutFrontend(k, f) => {
                if let Some(old) = self.snap.frontends.get(k) {
                    self.drop_frontend(old.service_id, k);
                } else {
                    *self.port_users.entry(port_of(k)).or_default() += 1;
                }
                self.frontends_of
                    .entry(f.service_id)
                    .or_default()
                    .insert(*k);
            }
            MapWrite::DeleteFrontend(k) => {
                if let Some(old) = self.snap.frontends.get(k) {
                    self.drop_frontend(old.service_id, k);
                    let port = port_of(k);
                    if let Some(n) = self.port_users.get_mut(&port) {
                        *n -= 1;
                        if *n == 0 {
                            self.port_users.remove(&port);
                        }
                    }
                }
            }
            _ => {}
        }
        self.snap.apply(write);
    }

    fn drop_frontend(&mut self, service_id: u32, key: &FrontendKey) {
        if let Some(set) = self.frontends_of.get_mut(&service_id) {
            set.remove(key);
            if set.is_empty() {
                self.frontends_of.remove(&service_id);
            }
        }
    }

    /// The frontend keys that point at a service id.
    pub fn frontends_of(&self, service_id: u32) -> impl Iterator<Item = &FrontendKey> {
        self.frontends_of.get(&service_id).into_iter().flatten()
    }

    /// The service ids that frontends point at.
    pub fn frontend_service_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.frontends_of.keys().copied()
    }
}

impl Mirror {
    /// Whether some frontend in the maps uses this (UDP?, port).
    pub fn port_in_use(&self, udp: bool, port: u16) -> bool {
        self.port_users.contains_key(&(udp, port))
    }
}
