//! Which Service owns an address that several claim (CVE-2020-8554 class: anyone who can write a
//! Service can name any address as an externalIP or get it as a load-balancer ingress IP).
//!
//! The rule, the same whatever order Services arrive in: claims rank by kind first, what the
//! cluster allocates before what a user typed: a ClusterIP (allocated and made unique by the
//! API server), then a NodePort (this node's own address), then a load-balancer ingress (set by
//! a controller), then an externalIP (any Service author may write one). Within a kind the
//! older Service wins (`creationTimestamp`), then the smaller uid. Names and namespaces never
//! decide. The losing claim is not written and is reported.
//!
//! The ranks are `ClaimKind::precedence`; the age order is `Seniority::age` (`creationTimestamp`,
//! then uid), which is also the order the reconciler hands out map capacity in.
use std::{collections::BTreeSet, sync::Arc};

use serde::{Deserialize, Serialize};

use super::types::{ClaimKind, DesiredService, DesiredState, FrontendClaim};
use crate::{
    hashing::{FastMap, fast_map_with_capacity},
    vec_set::VecSet,
    vocab::{ServiceAddr, ServicePortKey},
};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Claimant {
    rank: (u8, i64, Arc<str>),
    kind: ClaimKind,
    key: ServicePortKey,
}

/// A claim that lost: the address, who claimed it and how, and who owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Conflict {
    pub addr: ServiceAddr,
    pub kind: ClaimKind,
    pub owner: ServicePortKey,
    pub owner_kind: ClaimKind,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (its {}) belongs to {} (its {})",
            self.addr, self.kind, self.owner, self.owner_kind
        )
    }
}

/// Every claim on every address, kept up to date one backend set at a time.
#[derive(Clone, Debug, Default)]
pub struct Ownership {
    /// Almost every address has one claimant: a sorted `Vec` each, not a B-tree node. Looked
    /// up by address, never walked in order: a hash of the address, not a B-tree search.
    claims: FastMap<ServiceAddr, VecSet<Claimant>>,
    /// The addresses each backend set claims (its claimants are in `claims`).
    by_key: FastMap<ServicePortKey, Box<[ServiceAddr]>>,
    /// Addresses with more than one claim: while there is none, every claim is granted and no
    /// conflict needs looking for.
    contested: usize,
}

impl Ownership {
    /// Room for about `sets` backend sets' claims (a full translation makes them all at once,
    /// and a table that grows as it goes holds its old and new halves for a moment).
    pub fn with_capacity(sets: usize) -> Self {
        Self {
            claims: fast_map_with_capacity(sets),
            by_key: fast_map_with_capacity(sets),
            contested: 0,
        }
    }

    /// Records (or replaces) the claims of one backend set. Returns every backend set whose owned
    /// addresses may have changed (this one, and the former and new owners of what it claims).
    pub fn claim(
        &mut self,
        key: &ServicePortKey,
        desired: &DesiredService,
    ) -> BTreeSet<ServicePortKey> {
        let mut affected = self.release(key);
        self.add(key, desired, Some(&mut affected));
        affected.insert(key.clone());
        affected
    }

    /// [`Self::claim`] without the sets it affects, for a full translation (every owner is
    /// decided afterwards).
    pub fn claim_new(&mut self, key: &ServicePortKey, desired: &DesiredService) {
        if self.by_key.contains_key(key) {
            self.claim(key, desired);
        } else {
            self.add(key, desired, None);
        }
    }

    fn add(
        &mut self,
        key: &ServicePortKey,
        desired: &DesiredService,
        mut affected: Option<&mut BTreeSet<ServicePortKey>>,
    ) {
        let mut addrs = Vec::with_capacity(desired.frontends.len());
        for c in &desired.frontends {
            let claimant = Claimant {
                rank: desired.seniority.rank(c.kind),
                kind: c.kind,
                key: key.clone(),
            };
            let set = self.claims.entry(c.addr).or_default();
            if let Some(affected) = affected.as_deref_mut()
                && let Some(first) = set.first()
            {
                affected.insert(first.key.clone());
            }
            if set.insert(claimant) && set.len() == 2 {
                self.contested += 1;
            }
            addrs.push(c.addr);
        }
        if !addrs.is_empty() {
            self.by_key.insert(key.clone(), addrs.into_boxed_slice());
        }
    }

    /// Forgets the claims of a backend set; returns those whose owned addresses may change.
    pub fn release(&mut self, key: &ServicePortKey) -> BTreeSet<ServicePortKey> {
        let mut affected = BTreeSet::new();
        let Some(old) = self.by_key.remove(key) else {
            return affected;
        };
        for &addr in &old {
            if let Some(set) = self.claims.get_mut(&addr) {
                // Every claim of this set on the address (it may claim one address two ways).
                let before = set.len();
                set.retain(|c| c.key != *key);
                if before >= 2 && set.len() < 2 {
                    self.contested -= 1;
                }
                if let Some(next) = set.first() {
                    affected.insert(next.key.clone());
                }
                if set.is_empty() {
                    self.claims.remove(&addr);
                }
            }
        }
        affected
    }

    /// The backend set that owns `addr`, and how it claims it.
    pub fn owner(&self, addr: &ServiceAddr) -> Option<(&ServicePortKey, ClaimKind)> {
        self.claims
            .get(addr)
            .and_then(VecSet::first)
            .map(|c| (&c.key, c.kind))
    }

    /// The claims of `desired` that `key` owns.
    pub fn granted(&self, key: &ServicePortKey, desired: &DesiredService) -> VecSet<FrontendClaim> {
        let mut granted = desired.frontends.clone();
        granted.retain(|c| self.owns(key, c));
        granted
    }

    fn owns(&self, key: &ServicePortKey, claim: &FrontendClaim) -> bool {
        self.owner(&claim.addr)
            .is_none_or(|(owner, _)| owner == key)
    }

    /// The claims of `desired` that `key` lost, and to whom.
    pub fn conflicts(&self, key: &ServicePortKey, desired: &DesiredService) -> Vec<Conflict> {
        if self.contested == 0 {
            return Vec::new();
        }
        desired
            .frontends
            .iter()
            .filter_map(|c| {
                let (owner, owner_kind) = self.owner(&c.addr)?;
                (owner != key).then(|| Conflict {
                    addr: c.addr,
                    kind: c.kind,
                    owner: owner.clone(),
                    owner_kind,
                })
            })
            .collect()
    }

    /// Leaves each backend set in `desired` with only the addresses it owns.
    pub fn apply(&self, desired: &mut DesiredState) {
        if self.contested == 0 {
            return;
        }
        for (key, service) in &mut desired.services {
            service.frontends.retain(|c| self.owns(key, c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Family, ObjectKey, Protocol, Scope, ServicePortKeyFields};

    fn key(name: &str) -> ServicePortKey {
        ServicePortKey::from(ServicePortKeyFields {
            service: ObjectKey::new("ns", name),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            family: Family::IPv4,
            scope: Scope::Cluster,
        })
    }

    fn wants(created: i64, addrs: &[(&str, ClaimKind)]) -> DesiredService {
        DesiredService {
            frontends: addrs
                .iter()
                .map(|(a, kind)| FrontendClaim {
                    addr: ServiceAddr::new(a.parse().unwrap(), 80, Protocol::Tcp),
                    kind: *kind,
                })
                .collect(),
            seniority: super::super::types::Seniority {
                created: Some(created),
                uid: format!("uid-{created}").into(),
            },
            ..DesiredService::default()
        }
    }

    /// A set that claims one address two ways (an externalIP equal to its ClusterIP) leaves it
    /// whole when it goes: nothing of it stays claimed or counted as contested.
    #[test]
    fn a_set_claiming_an_address_two_ways_releases_both_claims() {
        let (a, b) = (key("a"), key("b"));
        let twice = wants(
            1,
            &[
                ("10.96.0.1", ClaimKind::ClusterIp),
                ("10.96.0.1", ClaimKind::ExternalIp),
            ],
        );
        let other = wants(2, &[("10.96.0.1", ClaimKind::ExternalIp)]);
        let mut o = Ownership::default();
        o.claim_new(&a, &twice);
        o.claim_new(&b, &other);
        assert_eq!(o.conflicts(&b, &other).len(), 1, "a holds it");
        let affected = o.release(&a);
        assert!(affected.contains(&b), "the address passes to b");
        assert!(o.conflicts(&b, &other).is_empty());
        assert_eq!(o.contested, 0);
        let addr = ServiceAddr::new("10.96.0.1".parse().unwrap(), 80, Protocol::Tcp);
        assert_eq!(o.owner(&addr).map(|(k, _)| k.clone()), Some(b.clone()));
        o.release(&b);
        assert!(o.claims.is_empty() && o.by_key.is_empty());
        assert_eq!(o.contested, 0);
    }

    /// Whatever the order claims come and go in, an address two Services claim goes to the
    /// older one, the other's claim is a conflict, and once one leaves nothing is contested.
    #[test]
    fn a_shared_address_is_contested_only_while_two_claim_it() {
        let (old, new) = (key("old"), key("new"));
        let own = wants(
            1,
            &[
                ("10.96.0.1", ClaimKind::ClusterIp),
                ("192.0.2.9", ClaimKind::ExternalIp),
            ],
        );
        let theirs = wants(
            2,
            &[
                ("10.96.0.2", ClaimKind::ClusterIp),
                ("192.0.2.9", ClaimKind::ExternalIp),
            ],
        );
        let mut o = Ownership::default();
        o.claim_new(&new, &theirs);
        assert!(
            o.conflicts(&new, &theirs).is_empty(),
            "alone, it owns all it claims"
        );
        o.claim_new(&old, &own);
        let lost = o.conflicts(&new, &theirs);
        assert_eq!(lost.len(), 1);
        assert_eq!(
            (lost[0].owner.clone(), lost[0].kind),
            (old.clone(), ClaimKind::ExternalIp)
        );
        assert!(o.conflicts(&old, &own).is_empty());
        let mut desired = DesiredState::default();
        desired.services.insert(old.clone(), own.clone());
        desired.services.insert(new.clone(), theirs.clone());
        o.apply(&mut desired);
        assert_eq!(
            desired.services[&new].frontends.len(),
            1,
            "only its ClusterIP"
        );
        assert_eq!(desired.services[&old].frontends.len(), 2);
        // The older one leaves: the newer one gets the address, and nothing is contested.
        o.release(&old);
        assert!(o.conflicts(&new, &theirs).is_empty());
        assert_eq!(o.granted(&new, &theirs).len(), 2);
        // Back, then its claim replaced by one without the address.
        o.claim(&old, &own);
        assert_eq!(o.conflicts(&new, &theirs).len(), 1);
        o.claim(&old, &wants(1, &[("10.96.0.1", ClaimKind::ClusterIp)]));
        assert!(o.conflicts(&new, &theirs).is_empty());
        assert_eq!(o.granted(&new, &theirs).len(), 2);
    }
}
