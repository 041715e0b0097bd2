//! The traffic that reaches this node from outside (`--external-traffic nftables`): NodePorts on
//! this node's NodePort addresses, load-balancer ingress IPs and externalIPs, as kube-proxy's
//! nftables proxier (`pkg/proxy/nftables/proxier.go`) serves them on the wire. Pure: the same
//! Services, slices and node give the same table.
//!
//! Per Service port and family (`OutsidePort`): the frontends, the policy
//! (`externalTrafficPolicy`), the cluster endpoints (ready, narrowed by topology, else serving
//! and terminating: `CategorizeEndpoints`' cluster set), the local ones (this node's ready, else
//! its serving terminating ones), whether any endpoint exists anywhere (`hasEndpoints`), the
//! affinity timeout, the source ranges of the family (`loadBalancerSourceRanges`, which apply to
//! load-balancer IPs only, never to NodePorts or externalIPs), and, for UDP, every serving
//! endpoint (the flows to any other are cleared, as kube-proxy's conntrack cleanup does).
//!
//! Which Service owns an address two of them claim: the same rule as the socket path (kind,
//! then age, then uid; `ClaimKind::precedence`, `Seniority::rank`), decided here over the outside
//! claims. `ClusterIPs` reached from outside the node are not served (kube-proxy DNATs them when
//! a router sends the Service range to a node; socklb leaves that to the socket path of the
//! node the client is on).
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use super::{
    NodeInfo, endpoints, of_family, skip_reason,
    types::{ClaimKind, Seniority, SpecialAddress},
};
use crate::{
    model::{Cidr, EndpointSlice, Service, ServicePort, Store, TrafficPolicy},
    vocab::{Family, ObjectKey, Protocol},
};

/// One Service port in one family, as the outside path serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsidePort {
    pub service: ObjectKey,
    /// The port's name, or its number when the Service's only port is unnamed.
    pub port_name: Arc<str>,
    pub protocol: Protocol,
    pub family: Family,
    /// The Service port (load-balancer IPs and externalIPs listen on it).
    pub port: u16,
    /// The NodePort, when the Service has one and owns it on this node.
    pub node_port: Option<u16>,
    /// Load-balancer ingress IPs (VIP mode) and externalIPs this port owns, with their kind.
    pub addresses: Vec<(IpAddr, ClaimKind)>,
    /// `externalTrafficPolicy: Local`.
    pub local_policy: bool,
    /// The cluster endpoints, canonical order.
    pub cluster: Vec<SocketAddr>,
    /// This node's endpoints (its ready ones, else its serving terminating ones).
    pub local: Vec<SocketAddr>,
    /// Some endpoint is ready, or serving and terminating, anywhere.
    pub has_endpoints: bool,
    pub affinity_timeout_s: Option<u32>,
    /// The sources a load-balancer IP accepts (empty: any). Never NodePorts or externalIPs.
    pub source_ranges: Vec<Cidr>,
    /// UDP: every serving endpoint, whatever policy and topology chose.
    pub serving: Vec<SocketAddr>,
    pub seniority: Seniority,
}

impl OutsidePort {
    /// `namespace/name/protocol/port`, the name its rules are known by.
    pub fn name(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.service.namespace,
            self.service.name,
            self.protocol.lower(),
            self.port_name
        )
    }

    /// The load-balancer IPs that source ranges guard.
    pub fn firewalled(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addresses
            .iter()
            .filter(|(_, kind)| *kind == ClaimKind::LoadBalancer && !self.source_ranges.is_empty())
            .map(|(ip, _)| *ip)
    }
}

/// Everything the outside path serves on this node, by family then name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutsideState {
    pub ports: BTreeMap<(Family, String), OutsidePort>,
    /// The families whose every local address serves NodePorts (kube-proxy's match-all).
    pub node_ports_match_all: Vec<Family>,
    /// This node's NodePort addresses (where a family does not match all).
    pub node_addresses: Vec<IpAddr>,
}

impl OutsideState {
    pub fn of_family(&self, family: Family) -> impl Iterator<Item = &OutsidePort> {
        self.ports
            .iter()
            .filter(move |((f, _), _)| *f == family)
            .map(|(_, p)| p)
    }
}

/// The outside path's table for every Service in the store.
pub fn outside_state(store: &Store, node: &NodeInfo) -> OutsideState {
    let mut ports: Vec<OutsidePort> = Vec::new();
    for svc in store.services() {
        if skip_reason(svc, node).is_some() {
            continue;
        }
        let slices = store.slices_of(&svc.key);
        let slices: Vec<&EndpointSlice> = slices
            .iter()
            .copied()
            .filter(|s| {
                !s.headless_label
                    && s.proxy_name
                        .as_ref()
                        .is_none_or(|p| **p == *node.proxy_name)
            })
            .collect();
        for port in &svc.ports {
            let Some(protocol) = port.protocol else {
                continue;
            };
            for family in svc.cluster_ips.iter().map(|ip| Family::of(*ip)) {
                if let Some(p) = outside_port(svc, port, protocol, family, &slices, node) {
                    ports.push(p);
                }
            }
        }
    }
    decide_ownership(&mut ports);
    OutsideState {
        ports: ports
            .into_iter()
            .filter(|p| p.node_port.is_some() || !p.addresses.is_empty())
            .map(|p| ((p.family, p.name()), p))
            .collect(),
        node_ports_match_all: node.node_ports_match_all.clone(),
        node_addresses: node.addresses.clone(),
    }
}

fn outside_port(
    svc: &Service,
    port: &ServicePort,
    protocol: Protocol,
    family: Family,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
) -> Option<OutsidePort> {
    let mut addresses: Vec<(IpAddr, ClaimKind)> = Vec::new();
    if node.external_ips {
        addresses
            .extend(of_family(&svc.external_ips, family).map(|ip| (ip, ClaimKind::ExternalIp)));
    }
    addresses.extend(
        svc.lb_ingress
            .iter()
            .filter(|i| !i.proxy_mode && Family::of(i.ip) == family)
            .map(|i| (i.ip, ClaimKind::LoadBalancer)),
    );
    // Never a special address, nor one of this node's where a process on it listens on the
    // port (the socket path's rule).
    addresses.retain(|(ip, _)| {
        SpecialAddress::of(*ip).is_none() && !node.serves(*ip, port.port, protocol)
    });
    addresses.sort_unstable();
    addresses.dedup_by_key(|(ip, _)| *ip);
    if port.node_port.is_none() && addresses.is_empty() {
        return None;
    }
    let merged = endpoints::merge(port, family, slices);
    let members = |chosen: endpoints::Chosen| {
        let mut out: Vec<SocketAddr> = chosen
            .members
            .iter()
            .filter_map(|i| merged.addr(*i))
            .collect();
        crate::vocab::canonical(&mut out);
        out.dedup();
        out
    };
    let cluster = members(merged.cluster(node, svc.topology_annotation.as_deref()));
    let local = members(merged.local(node));
    let mut source_ranges: Vec<Cidr> = svc
        .source_ranges
        .iter()
        .copied()
        .filter(|r| Family::of(r.addr) == family)
        .collect();
    if source_ranges.iter().any(Cidr::is_everything) {
        source_ranges.clear();
    }
    if !source_ranges.is_empty()
        && node
            .own_addresses
            .iter()
            .any(|ip| source_ranges.iter().any(|r| r.contains(*ip)))
    {
        // A range holding a node address lets the node in: a process on the node reaching a
        // load-balancer IP it holds sources from that IP (kube-proxy's allowFromNode).
        for (ip, kind) in &addresses {
            if *kind == ClaimKind::LoadBalancer {
                source_ranges.push(Cidr {
                    addr: *ip,
                    prefix: if ip.is_ipv4() { 32 } else { 128 },
                });
            }
        }
    }
    Some(OutsidePort {
        service: svc.key.clone(),
        port_name: Arc::clone(&port.name_or_number),
        protocol,
        family,
        port: port.port,
        node_port: port.node_port,
        addresses,
        local_policy: svc.external_traffic_policy == TrafficPolicy::Local,
        cluster,
        local,
        has_endpoints: merged.has_any(),
        affinity_timeout_s: svc.affinity_timeout_s,
        source_ranges,
        serving: if protocol == Protocol::Udp {
            merged.serving()
        } else {
            Vec::new()
        },
        seniority: Seniority {
            created: svc.created,
            uid: Arc::clone(&svc.uid),
        },
    })
}

/// Where two Service ports claim one NodePort (protocol and number) or one address (with
/// protocol and port), the stronger claim keeps it: kind, then age, then uid.
fn decide_ownership(ports: &mut [OutsidePort]) {
    type Rank = (u8, i64, Arc<str>);
    let mut node_ports: BTreeMap<(Family, Protocol, u16), (Rank, usize)> = BTreeMap::new();
    let mut addresses: BTreeMap<(IpAddr, Protocol, u16), (Rank, usize)> = BTreeMap::new();
    for (i, p) in ports.iter().enumerate() {
        if let Some(np) = p.node_port {
            let rank = p.seniority.rank(ClaimKind::NodePort);
            let entry = node_ports
                .entry((p.family, p.protocol, np))
                .or_insert((rank.clone(), i));
            if rank < entry.0 {
                *entry = (rank, i);
            }
        }
        for (ip, kind) in &p.addresses {
            let rank = p.seniority.rank(*kind);
            let entry = addresses
                .entry((*ip, p.protocol, p.port))
                .or_insert((rank.clone(), i));
            if rank < entry.0 {
                *entry = (rank, i);
            }
        }
    }
    for (i, p) in ports.iter_mut().enumerate() {
        if let Some(np) = p.node_port
            && node_ports.get(&(p.family, p.protocol, np)).map(|(_, w)| *w) != Some(i)
        {
            p.node_port = None;
        }
        let (protocol, port) = (p.protocol, p.port);
        p.addresses
            .retain(|(ip, _)| addresses.get(&(*ip, protocol, port)).map(|(_, w)| *w) == Some(i));
    }
}

#[cfg(test)]
mod tests;
