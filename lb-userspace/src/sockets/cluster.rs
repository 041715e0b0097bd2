//! The cluster's side of the connections view (`sockets::view`): each backend's condition from
//! its Service's EndpointSlices, and client pods' names by address from the slices'
//! `targetRef`s, looked up in one pass for the addresses a census found, never indexed whole.
//! The agent and `explain` both read it from their objects; the first slice that lists an
//! address decides its condition, as kube-proxy merges duplicates.
use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use crate::{
    model::{AddressType, Store},
    sockets::view::{Cluster, Condition},
    vocab::ServicePortKey,
};

/// Conditions and pod names from a store of Services and EndpointSlices.
pub struct FromObjects<'a> {
    store: &'a Store,
}

impl<'a> FromObjects<'a> {
    pub fn new(store: &'a Store) -> Self {
        Self { store }
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

    /// One pass over every endpoint, keeping only the addresses asked for (none asked: no
    /// pass). An index of every pod, built for each census, cost the agent's loop a pass and
    /// an entry per endpoint of the cluster every 15 s (100,000 at 10,000 Services), with no
    /// client connected.
    fn pods_at(&self, ips: &HashSet<IpAddr>) -> HashMap<IpAddr, String> {
        let mut pods = HashMap::new();
        if ips.is_empty() {
            return pods;
        }
        for slice in self.store.slices() {
            for ep in &slice.endpoints {
                if let (Some(addr), Some(target)) = (ep.address, slice.target_of(ep))
                    && target.kind == "Pod"
                    && ips.contains(&addr)
                {
                    pods.insert(addr, format!("{}/{}", target.namespace, target.name));
                }
            }
        }
        pods
    }

    fn has_objects(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use crate::model::parse_manifests;

    const SLICE: &str = r"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.5]
  targetRef: {kind: Pod, name: web-7f9c, namespace: shop}
- addresses: [10.244.1.6]
  targetRef: {kind: Pod, name: web-2b1d, namespace: shop}
- addresses: [10.244.1.7]
- addresses: [10.244.1.8]
  targetRef: {kind: Node, name: node-1}
";

    #[test]
    fn client_pods_are_named_for_the_addresses_asked_only() {
        let parsed = parse_manifests("slice.yaml", SLICE.as_bytes());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let store: Store = parsed.objects.into_iter().collect();
        let cluster = FromObjects::new(&store);
        let ip = |s: &str| s.parse::<IpAddr>().expect("address");
        let asked = HashSet::from([
            ip("10.244.1.6"),
            ip("10.244.1.7"),
            ip("10.244.1.8"),
            ip("10.0.0.1"),
        ]);
        assert_eq!(
            cluster.pods_at(&asked),
            HashMap::from([(ip("10.244.1.6"), "shop/web-2b1d".to_string())]),
            "only a Pod target is named; an address without one, or not in a slice, is not"
        );
        assert!(cluster.pods_at(&HashSet::new()).is_empty());
    }
}
