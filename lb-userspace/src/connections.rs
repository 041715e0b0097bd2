//! The cluster's side of the connections view (`dataplane::sockets::view`): each backend's
//! condition from its Service's EndpointSlices, and client pods' names by address from the
//! slices' `targetRef`s. The agent and `explain` both read it from their objects.
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use crate::{
    dataplane::sockets::view::{Cluster, Condition},
    model::{AddressType, Store},
    vocab::ServicePortKey,
};

/// Conditions and pod names from a store of Services and EndpointSlices.
pub struct FromObjects<'a> {
    store: &'a Store,
    pods: HashMap<IpAddr, String>,
}

impl<'a> FromObjects<'a> {
    /// Indexes the pods the slices name, by address (one pass over every endpoint).
    pub fn new(store: &'a Store) -> Self {
        let mut pods = HashMap::new();
        for slice in store.slices() {
            for ep in &slice.endpoints {
                if let (Some(addr), Some(target)) = (ep.address, ep.target())
                    && &*target.kind == "Pod"
                {
                    pods.insert(addr, target.key.to_string());
                }
            }
        }
        Self { store, pods }
    }
}

/// Every endpoint the Service's slices list for one backend set, with its condition (the
/// first slice that lists an address decides, as kube-proxy merges duplicates).
pub fn endpoints_of(store: &Store, key: &ServicePortKey) -> Vec<(SocketAddr, Condition)> {
    let Some(port) = store.service(&key.service).and_then(|svc| {
        svc.ports
            .iter()
            .find(|p| p.name_or_number == key.port_name && p.protocol == Some(key.protocol))
            .cloned()
    }) else {
        return Vec::new();
    };
    let mut out: Vec<(SocketAddr, Condition)> = Vec::new();
    for slice in store.slices_of(&key.service) {
        if slice.address_type != AddressType::Ip(key.family) {
            continue;
        }
        let Some(number) = slice
            .ports
            .iter()
            .find(|p| p.name == port.name && p.protocol() == Some(key.protocol))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(addr) = ep.address else { continue };
            let backend = SocketAddr::new(addr, number);
            if out.iter().any(|(b, _)| *b == backend) {
                continue;
            }
            let condition = if ep.is_ready() {
                Condition::Ready
            } else if ep.is_terminating() && ep.is_serving() {
                Condition::ServingTerminating
            } else if ep.is_terminating() {
                Condition::Terminating
            } else {
                Condition::NotReady
            };
            out.push((backend, condition));
        }
    }
    out
}

impl Cluster for FromObjects<'_> {
    fn condition(&self, service: Option<&ServicePortKey>, backend: SocketAddr) -> Condition {
        service
            .and_then(|key| {
                endpoints_of(self.store, key)
                    .into_iter()
                    .find(|(b, _)| *b == backend)
            })
            .map_or(Condition::Gone, |(_, c)| c)
    }

    fn pod_at(&self, ip: IpAddr) -> Option<String> {
        self.pods.get(&ip).cloned()
    }

    fn has_objects(&self) -> bool {
        true
    }
}
