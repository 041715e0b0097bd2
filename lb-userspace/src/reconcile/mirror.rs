//! The reconciler's copy of what the maps hold, with the indexes a diff needs. It changes only
//! through `apply`, after the same write succeeded on the maps, so it never drifts from them.

use lb_common::FrontendKey;

use crate::{
    dataplane::maps::{MapSnapshot, MapWrite},
    hashing::FastMap,
    vec_set::VecSet,
};

#[derive(Clone, Debug, Default)]
pub struct Mirror {
    pub snap: MapSnapshot,
    frontends_of: FastMap<u32, VecSet<FrontendKey>>,
    /// How many frontends set each (UDP?, frontend filter bit): the filter must hold these.
    filter_users: FastMap<(bool, u32), u32>,
    /// How many frontends use each (UDP?, port): the frontend port bitmap must hold these.
    port_users: FastMap<(bool, u16), u32>,
    /// Frontends in `FRONTENDS4` and `FRONTENDS6`.
    counts: [usize; 2],
}

/// The (UDP?, port in host order) of a frontend key: its bit in the frontend port bitmap.
pub fn port_of(key: &FrontendKey) -> (bool, u16) {
    (
        key.protocol == lb_common::PROTOCOL_UDP,
        u16::from_be(key.port_be),
    )
}

/// The (UDP?, frontend filter bit) of a frontend key (see `lb_common::ports`).
pub fn filter_of(key: &FrontendKey) -> (bool, u32) {
    (
        key.protocol == lb_common::PROTOCOL_UDP,
        lb_common::ports::frontend_bit(&key.addr, key.port_be),
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
            *mirror.filter_users.entry(filter_of(k)).or_default() += 1;
            *mirror.port_users.entry(port_of(k)).or_default() += 1;
            mirror.counts[family_index(k)] += 1;
        }
        mirror.snap = snap;
        mirror
    }

    /// Room for `sets` backend sets' frontends (a first full sync adds them all).
    pub fn reserve(&mut self, sets: usize) {
        self.frontends_of
            .reserve(sets.saturating_sub(self.frontends_of.len()));
    }

    /// Applies one write and returns the write that undoes it (see `MapSnapshot::apply`): the
    /// value it replaces is found by the same search that writes it.
    pub fn apply(&mut self, write: &MapWrite) -> Option<MapWrite> {
        match write {
            MapWrite::PutFrontend(k, f) => {
                // Written here, not by `snap.apply`: one search of the frontends for both.
                let old = self.snap.frontends.insert(*k, *f);
                if let Some(old) = old {
                    self.drop_frontend(old.service_id, k);
                } else {
                    *self.filter_users.entry(filter_of(k)).or_default() += 1;
                    *self.port_users.entry(port_of(k)).or_default() += 1;
                    self.counts[family_index(k)] += 1;
                }
                self.frontends_of
                    .entry(f.service_id)
                    .or_default()
                    .insert(*k);
                return Some(MapWrite::restore_frontend(*k, old));
            }
            MapWrite::DeleteFrontend(k) => {
                let old = self.snap.frontends.remove(k);
                if let Some(old) = old {
                    self.drop_frontend(old.service_id, k);
                    release(&mut self.filter_users, &filter_of(k));
                    release(&mut self.port_users, &port_of(k));
                    self.counts[family_index(k)] -= 1;
                }
                return Some(MapWrite::restore_frontend(*k, old));
            }
            _ => {}
        }
        self.snap.apply(write)
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
    /// Whether some frontend in the maps sets this (UDP?, frontend filter bit).
    pub fn filter_in_use(&self, udp: bool, bit: u32) -> bool {
        self.filter_users.contains_key(&(udp, bit))
    }

    /// The frontends `map` (`FRONTENDS4` or `FRONTENDS6`) holds.
    pub fn frontend_count(&self, map: lb_common::MapId) -> usize {
        self.counts[usize::from(map == lb_common::MapId::Frontends6)]
    }

    /// Whether some frontend in the maps uses this (UDP?, port).
    pub fn port_in_use(&self, udp: bool, port: u16) -> bool {
        self.port_users.contains_key(&(udp, port))
    }
}

/// 0 for a key of `FRONTENDS4`, 1 for `FRONTENDS6`.
fn family_index(key: &FrontendKey) -> usize {
    usize::from(key.family != lb_common::FAMILY_IPV4)
}

/// One user fewer of `key`; forgotten at none.
fn release<K: std::hash::Hash + Eq>(users: &mut FastMap<K, u32>, key: &K) {
    if let Some(n) = users.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            users.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use lb_common::{FAMILY_IPV4, PROTOCOL_TCP, ports};

    use super::*;

    fn key(ip: Ipv4Addr, port: u16) -> FrontendKey {
        FrontendKey {
            addr: [u32::from(ip).to_be(), 0, 0, 0],
            port_be: port.to_be(),
            protocol: PROTOCOL_TCP,
            family: FAMILY_IPV4,
        }
    }

    /// 30,000 service addresses in one `/16`, each on 80 and 443 (60,000 frontends, past the scale the
    /// bench runs): the filter's bits stay near what an ideal hash gives, and of 100,000
    /// connects to other addresses on the same ports (the ones services use, so a port
    /// prefilter would pass them all) fewer than 8% reach the hash lookup.
    #[test]
    fn the_frontend_filter_keeps_misses_at_one_lookup() {
        let base = u32::from(Ipv4Addr::new(10, 96, 0, 0));
        let mut set = std::collections::HashSet::new();
        for i in 0..30_000 {
            for port in [80, 443] {
                set.insert(filter_of(&key(Ipv4Addr::from(base + i), port)).1);
            }
        }
        let n = 60_000.0_f64;
        let bits = f64::from(1u32 << ports::FILTER_BITS);
        let ideal = bits * (1.0 - (-n / bits).exp());
        assert!(
            set.len() as f64 > 0.98 * ideal,
            "{} distinct bits, ideal {ideal:.0}",
            set.len()
        );
        let outside = u32::from(Ipv4Addr::new(172, 16, 0, 0));
        let passed = (0..100_000u32)
            .filter(|i| {
                let port = if i % 2 == 0 { 80 } else { 443 };
                set.contains(&filter_of(&key(Ipv4Addr::from(outside + i / 2), port)).1)
            })
            .count();
        assert!(passed < 8_000, "{passed} of 100,000 misses pass the filter");
        assert!(set.iter().all(|&b| b < 1 << ports::FILTER_BITS));
    }
}
