//! Services + EndpointSlices + this node's identity → the desired state of the maps.
//!
//! Pure functions: no IO, no clock, no randomness. The same inputs always give the same tables,
//! which is what the golden tests and `socklb explain` rely on. The rules are kube-proxy's
//! (`pkg/proxy`), as a socket on this node can observe them, of one Kubernetes version
//! (`KubeVersion`, in `NodeInfo`: zone hints need the topology annotation up to 1.30, node hints
//! apply from 1.34; the newest rules by default). Where socklb differs on purpose,
//! docs/compatibility.md says so.
//!
//! For each backend set (a Service port, in one family, for one scope) the translation gives its
//! frontends and its backends, with every endpoint's decision and reason when asked
//! (`Detail::Decisions`). This module also holds who this node is (`NodeInfo`, `NodeFlags`,
//! `NodePortAddresses`); `types` the desired state, the claim kinds and the typed refusals
//! (`SpecialAddress`, `Refusal`); `endpoints` which endpoints become backends; `ownership` who
//! owns a contested address; `health` which Services need a healthCheckNodePort on this node and
//! what it answers; `report` the translation as text.
//!
//! Special addresses. A special address is never a frontend, whoever names it
//! (`SpecialAddress::of`): loopback, unspecified, link-local, multicast, broadcast, `0.0.0.0/8`,
//! `240.0.0.0/4`, and the cloud providers' metadata and DNS services every pod reaches at the
//! same address (`CLOUD_SERVICES`: AWS's `fd00:ec2::254` and `::253`, Google's `fd20:ce::254`,
//! Alibaba's `100.100.100.200`, Azure's `168.63.129.16`). Nor, except as a NodePort, is an
//! address of this node (`NodeInfo::own_addresses`: the Node object's, the flags', those bound on
//! its interfaces) where something on the node listens on that port (`NodeInfo::serves`: a
//! listener bound to that address, or, on the node's identity addresses, to every address): a
//! node-local DNS cache keeps the DNS ClusterIP, while an address merely bound (kube-proxy IPVS's
//! `kube-ipvs0`) is translated as any other. Such a claim is dropped and returned as a `Refusal`
//! naming the field.
//!
//! Who this node is. `NodeInfo::resolve` is the one rule: a flag wins over the Node object. The
//! NodePort addresses are decided per family (`NodePortAddresses::resolve`, kube-proxy's
//! `NewNodePortAddresses`): a family's `--node-address`es if given, else what
//! `--nodeport-addresses` picks (`primary`, the default, is the Node's first `InternalIP`, else its
//! first `ExternalIP`; CIDRs pick among the interface addresses, or the Node's while those are not
//! known; loopback never). A family with no primary address, or with no CIDR of its own or its
//! `/0`, takes every address of the family (special ones skipped) and is named in
//! `NodeInfo::node_ports_match_all`, where health-check ports listen on the family's wildcard.
//! The agent and `explain` both call it, with the interface addresses and listeners they read;
//! the healthCheckNodePort rules (`health_checks`) take the same `NodeInfo`.
mod endpoints;
mod health;
pub mod outside;
mod ownership;
pub mod report;
mod types;

pub use health::{HealthCheck, HealthChecks, health_check_body, health_checks};
pub use ownership::{Conflict, Ownership};
pub use types::{
    Candidacy, ClaimKind, DesiredService, DesiredState, EndpointDecision, Exclusion, FrontendClaim,
    PortTranslation, Refusal, Rule, Seniority, ServiceTranslation, SpecialAddress, Verdict,
};

use std::{net::IpAddr, sync::Arc};

use crate::{
    model::{
        EndpointSlice, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, NodeObject, Service, ServicePort,
        ServiceType, Store, TrafficPolicy,
    },
    vec_set::VecSet,
    vocab::{Family, Protocol, Scope, ServiceAddr, ServicePortKey, ServicePortKeyFields},
};

/// The proxy name socklb answers to in the `service.kubernetes.io/service-proxy-name` label.
pub const DEFAULT_PROXY_NAME: &str = "socklb";

/// Who "this node" is: for internalTrafficPolicy Local, topology hints and NodePort frontends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: Option<String>,
    pub zone: Option<String>,
    /// Addresses on which NodePorts are served.
    pub addresses: Vec<IpAddr>,
    /// The families whose NodePorts are on every address of the family on this node
    /// (kube-proxy's `MatchAll`): health-check ports listen on that family's wildcard.
    pub node_ports_match_all: Vec<Family>,
    /// Every address of this node: its Node object's, the flags', and those bound on its
    /// interfaces (a node-local DNS cache's, kube-proxy IPVS's `kube-ipvs0`).
    pub own_addresses: Vec<IpAddr>,
    /// The node's own identity among them: its Node object's addresses and the flags'.
    pub identity_addresses: Vec<IpAddr>,
    /// The sockets listening on the node. A claim on one of the node's addresses is not
    /// translated (but as a NodePort) only where something on the node serves that address
    /// and port: a listener bound to it (a node-local DNS cache), or, on the node's identity
    /// addresses, to every address (the kubelet). An address merely bound to an interface is
    /// translated as any other.
    pub listeners: Vec<crate::vocab::Listener>,
    pub proxy_name: String,
    /// Serve `spec.externalIPs` (off: as the `DenyServiceExternalIPs` admission plugin would).
    pub external_ips: bool,
    /// Whose topology rules apply: kube-proxy's of this Kubernetes version.
    pub kube_version: KubeVersion,
}

/// A Kubernetes minor version, for the rules that changed between releases (topology hints:
/// `pkg/proxy/topology.go` and the feature gates `TopologyAwareHints`,
/// `ServiceTrafficDistribution` and `PreferSameTrafficDistribution` at their defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    pub minor: u16,
}

impl KubeVersion {
    /// The newest rules socklb knows (1.35's).
    pub const NEWEST: Self = Self { minor: 35 };

    /// Parses `1.33` (also `v1.33`, `1.33.2`, `1.33+`).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().trim_start_matches('v');
        let mut parts = text.split('.');
        if parts.next()? != "1" {
            return None;
        }
        let minor: String = parts
            .next()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        minor.parse().ok().map(|minor| Self { minor })
    }

    /// Zone hints apply only to Services whose topology annotation is set and enabled (up to
    /// 1.30, where `ServiceTrafficDistribution` is alpha and off).
    pub fn hints_need_annotation(self) -> bool {
        self.minor <= 30
    }

    /// Node hints (`forNodes`, trafficDistribution PreferSameNode) are used
    /// (`PreferSameTrafficDistribution`: alpha and off in 1.33, on from 1.34).
    pub fn node_hints(self) -> bool {
        self.minor >= 34
    }
}

impl Default for KubeVersion {
    fn default() -> Self {
        Self::NEWEST
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

impl Default for NodeInfo {
    fn default() -> Self {
        Self {
            name: None,
            zone: None,
            addresses: Vec::new(),
            node_ports_match_all: Vec::new(),
            own_addresses: Vec::new(),
            identity_addresses: Vec::new(),
            listeners: Vec::new(),
            proxy_name: DEFAULT_PROXY_NAME.into(),
            external_ips: true,
            kube_version: KubeVersion::NEWEST,
        }
    }
}

/// What the operator said about this node (flags), before the Node object is known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFlags {
    pub name: Option<String>,
    /// `--zone`: wins over the Node's label.
    pub zone: Option<String>,
    /// `--node-address`: this node's NodePort addresses of their family, whatever
    /// `--nodeport-addresses` says (kube-proxy's `--bind-address` replaces its family's primary
    /// IP).
    pub addresses: Vec<IpAddr>,
    /// `--nodeport-addresses`: which of this node's addresses serve NodePorts.
    pub nodeport_addresses: NodePortAddresses,
    pub proxy_name: String,
    pub external_ips: bool,
    /// `--kubernetes-version` (or the API server's).
    pub kube_version: KubeVersion,
}

/// kube-proxy's `--nodeport-addresses`: which addresses of this node serve NodePorts, decided
/// per family (`pkg/proxy/util/nodeport_addresses.go` `NewNodePortAddresses`: a family with no
/// CIDR of its own, or with `0.0.0.0/0` / `::/0`, matches every local address of that family).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// The node's primary address of each family (the Node's first `InternalIP`, else its first
    /// `ExternalIP`): kube-proxy's nftables mode default, and socklb's. A family without one
    /// (no Node yet, or a single-stack Node) serves NodePorts on every address of that family,
    /// as kube-proxy, which then has no `/32` or `/128` of that family. (kube-proxy also wants
    /// the primary address on one of the node's interfaces; socklb takes the Node's word.)
    #[default]
    Primary,
    /// The addresses on the node's interfaces inside these ranges, per family; a family with
    /// no range here, or with its `/0` (iptables mode's default), matches all of its addresses.
    Cidrs(Vec<crate::model::Cidr>),
}

/// This node's NodePort addresses and the families that match all of theirs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePorts {
    pub addresses: Vec<IpAddr>,
    /// Families whose every address serves NodePorts (kube-proxy's `MatchAll`).
    pub match_all: Vec<Family>,
}

impl NodePortAddresses {
    /// Parses the flag's value: `primary`, or CIDRs (comma-separated), as kube-proxy's
    /// validation accepts them.
    pub fn parse(values: &[String]) -> Result<Self, String> {
        if values.iter().any(|v| v == "primary") {
            return if values.len() == 1 {
                Ok(Self::Primary)
            } else {
                Err("can't use both 'primary' and CIDRs".into())
            };
        }
        values
            .iter()
            .map(|v| {
                crate::model::Cidr::parse(v).ok_or_else(|| format!("{v}: must be a valid CIDR"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self::Cidrs)
    }

    /// The NodePort addresses of a node with this Node object and these interface addresses
    /// (`bound`; empty when unknown, then the Node's addresses stand in for them), per family:
    /// `given` (`--node-address`) when it has some of that family, else what this flag picks.
    /// Never loopback; a family matching all of its addresses skips every special address
    /// (link-local, say), which is never a frontend.
    pub fn resolve(
        &self,
        given: &[IpAddr],
        node: Option<&NodeObject>,
        bound: &[IpAddr],
    ) -> NodePorts {
        let mut out = NodePorts::default();
        for family in [Family::IPv4, Family::IPv6] {
            let usable = |ip: &IpAddr| !ip.is_loopback() && !ip.is_unspecified();
            let given: Vec<IpAddr> = of_family(given, family).filter(usable).collect();
            if !given.is_empty() {
                out.addresses.extend(given);
                continue;
            }
            let candidates: Vec<IpAddr> = if bound.is_empty() {
                node.map(|n| of_family(&n.addresses().collect::<Vec<_>>(), family).collect())
                    .unwrap_or_default()
            } else {
                of_family(bound, family).collect()
            };
            let picked: Option<Vec<IpAddr>> = match self {
                Self::Primary => node
                    .and_then(|n| n.primary().into_iter().find(|ip| Family::of(*ip) == family))
                    .filter(usable)
                    .map(|ip| vec![ip]),
                Self::Cidrs(cidrs) => {
                    let mine: Vec<_> = cidrs
                        .iter()
                        .filter(|c| Family::of(c.addr) == family)
                        .collect();
                    (!mine.is_empty() && !mine.iter().any(|c| c.is_everything())).then(|| {
                        candidates
                            .iter()
                            .copied()
                            .filter(|ip| mine.iter().any(|c| c.contains(*ip)))
                            .filter(usable)
                            .collect()
                    })
                }
            };
            if let Some(picked) = picked {
                out.addresses.extend(picked);
            } else {
                out.match_all.push(family);
                out.addresses.extend(
                    candidates
                        .into_iter()
                        .filter(|ip| SpecialAddress::of(*ip).is_none()),
                );
            }
        }
        out.addresses.dedup();
        out
    }
}

impl NodeInfo {
    /// The one rule for who this node is, used by the agent and by explain alike: a flag the
    /// operator gave wins; otherwise the Node object says (its zone label, its `InternalIP` and
    /// `ExternalIP` addresses). A zone label removed from the Node clears the zone, as in
    /// kube-proxy. `bound` are the addresses on the node's interfaces (host network namespace).
    pub fn resolve(
        flags: &NodeFlags,
        node: Option<&NodeObject>,
        bound: &[IpAddr],
        listeners: &[crate::vocab::Listener],
    ) -> Self {
        let mut identity: Vec<IpAddr> = flags.addresses.clone();
        identity.extend(node.iter().flat_map(|n| n.addresses()));
        identity.sort_unstable();
        identity.dedup();
        let mut own = identity.clone();
        own.extend(bound.iter().copied());
        own.sort_unstable();
        own.dedup();
        let mut listeners = listeners.to_vec();
        listeners.sort_unstable();
        listeners.dedup();
        let node_ports = flags
            .nodeport_addresses
            .resolve(&flags.addresses, node, bound);
        Self {
            own_addresses: own,
            identity_addresses: identity,
            listeners,
            name: flags.name.clone(),
            zone: flags
                .zone
                .clone()
                .or_else(|| node.and_then(|n| n.zone.clone())),
            addresses: node_ports.addresses,
            node_ports_match_all: node_ports.match_all,
            proxy_name: flags.proxy_name.clone(),
            external_ips: flags.external_ips,
            kube_version: flags.kube_version,
        }
    }
}

impl NodeInfo {
    /// Whether something on this node serves `ip`:`port` (see `listeners`): such a claim is
    /// left to the node, as kube-proxy's rules deliver it locally.
    pub fn serves(&self, ip: IpAddr, port: u16, protocol: Protocol) -> bool {
        self.own_addresses.contains(&ip) && {
            let identity = self.identity_addresses.contains(&ip);
            self.listeners
                .iter()
                .any(|l| l.receives(ip, port, protocol, identity))
        }
    }
}

/// How much a translation records besides the desired state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// The desired state only (the agent).
    Lean,
    /// Also every endpoint's decision and its reason (`explain`, reports, golden tests).
    Decisions,
}

/// Translates every Service in the store, with every endpoint's decision, and decides which
/// Service owns each contested address.
pub fn translate_all(store: &Store, node: &NodeInfo) -> (DesiredState, Vec<ServiceTranslation>) {
    translate_all_with(store, node, Detail::Decisions)
}

/// Translates every Service in the store and resolves address ownership.
pub fn translate_all_with(
    store: &Store,
    node: &NodeInfo,
    detail: Detail,
) -> (DesiredState, Vec<ServiceTranslation>) {
    let mut desired = DesiredState::default();
    let mut reports = Vec::with_capacity(store.service_count());
    let mut ownership = Ownership::default();
    for svc in store.services() {
        let report = translate_service_with(svc, &store.slices_of(&svc.key), node, detail);
        for port in &report.ports {
            ownership.claim(&port.key, &port.desired);
            desired
                .services
                .insert(port.key.clone(), port.desired.clone());
        }
        reports.push(report);
    }
    ownership.apply(&mut desired);
    (desired, reports)
}

/// Every Service's claims on addresses, to say who owns a contested one (the same claims
/// `translate_all` decides with).
pub fn ownership(store: &Store, node: &NodeInfo) -> Ownership {
    let mut ownership = Ownership::default();
    for svc in store.services() {
        let t = translate_service_with(svc, &store.slices_of(&svc.key), node, Detail::Lean);
        for port in &t.ports {
            ownership.claim(&port.key, &port.desired);
        }
    }
    ownership
}

/// Translates one Service with the slices labelled for it, with every endpoint's decision.
pub fn translate_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
) -> ServiceTranslation {
    translate_service_with(svc, slices, node, Detail::Decisions)
}

/// Translates one Service with the slices labelled for it. The frontends are every address the
/// Service claims; `Ownership` decides which of them it gets when Services contend.
pub fn translate_service_with(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
    detail: Detail,
) -> ServiceTranslation {
    let mut out = ServiceTranslation {
        service: svc.key.clone(),
        resource_version: svc.resource_version.to_string(),
        skipped: None,
        ports: Vec::with_capacity(svc.ports.len() * svc.cluster_ips.len()),
        notes: svc.notes.to_vec(),
        refused: Vec::new(),
    };
    if let Some(skip) = skip_reason(svc, node) {
        out.skipped = Some(skip);
        return out;
    }
    let slices = own_slices(slices, node, &mut out.notes);
    if svc.publish_not_ready_addresses {
        out.notes.push(
            "publishNotReadyAddresses: the EndpointSlice controller writes not-ready pods as ready; the proxy reads only the conditions"
                .into(),
        );
    }
    let seniority = Seniority {
        created: svc.created,
        uid: Arc::clone(&svc.uid),
    };
    for port in &svc.ports {
        let Some(protocol) = port.protocol else {
            out.notes.push(format!(
                "port {} is {}: socklb translates TCP and UDP only",
                port.name_or_number, port.protocol_name
            ));
            continue;
        };
        // Only the families the Service has (its cluster IPs): kube-proxy's per-family proxiers
        // leave a single-stack Service's other family alone, NodePorts and external IPs included.
        for family in svc.cluster_ips.iter().map(|ip| Family::of(*ip)) {
            let ctx = PortContext {
                svc,
                port,
                protocol,
                family,
                slices: &slices,
                node,
                detail,
                seniority: &seniority,
            };
            out.ports
                .extend(ctx.translate(&mut out.notes, &mut out.refused));
        }
    }
    out.refused.sort();
    out.refused.dedup();
    let families: Vec<Family> = svc.cluster_ips.iter().map(|ip| Family::of(*ip)).collect();
    let external = svc
        .external_ips
        .iter()
        .chain(svc.lb_ingress.iter().map(|i| &i.ip));
    for ip in external.filter(|ip| !families.contains(&Family::of(**ip))) {
        out.notes.push(format!(
            "{ip} is ignored: the Service has no {} cluster IP",
            Family::of(*ip)
        ));
    }
    if out.ports.is_empty() && out.notes.is_empty() {
        out.skipped = Some("no port with a frontend on this node".into());
    }
    out
}

/// One Service port in one family: everything its backend sets need.
struct PortContext<'a> {
    svc: &'a Service,
    port: &'a ServicePort,
    protocol: Protocol,
    family: Family,
    slices: &'a [&'a EndpointSlice],
    node: &'a NodeInfo,
    detail: Detail,
    seniority: &'a Seniority,
}

impl PortContext<'_> {
    /// The backend sets of this port and family: the cluster set for every frontend, or the
    /// local set for the ClusterIP and the cluster set for the others (internalTrafficPolicy
    /// Local).
    fn translate(
        &self,
        notes: &mut Vec<String>,
        refused: &mut Vec<Refusal>,
    ) -> Vec<PortTranslation> {
        let (svc, port, protocol, family, node) =
            (self.svc, self.port, self.protocol, self.family, self.node);
        let mut out = Vec::with_capacity(2);
        let merged = endpoints::merge(port, family, self.slices);
        let local_policy = svc.internal_traffic_policy == TrafficPolicy::Local;
        let claims = claims(svc, port, protocol, family, node, notes, refused);
        let (internal, external): (Vec<FrontendClaim>, Vec<FrontendClaim>) = claims
            .into_iter()
            .partition(|c| c.kind == ClaimKind::ClusterIp);
        // The ClusterIP uses the local set under internalTrafficPolicy Local. Every other
        // frontend uses the cluster set: kube-proxy applies externalTrafficPolicy Local only to
        // traffic from outside the node, and every client socklb serves is on the node.
        let mut sets = Vec::with_capacity(2);
        if local_policy {
            sets.push((Scope::Local, internal));
            sets.push((Scope::Cluster, external));
        } else {
            let mut all = internal;
            all.extend(external);
            sets.push((Scope::Cluster, all));
        }
        for (scope, frontends) in sets {
            if frontends.is_empty() {
                continue;
            }
            let chosen = match scope {
                Scope::Cluster => merged.cluster(node, svc.topology_annotation.as_deref()),
                Scope::Local => merged.local(node),
            };
            let mut backends = Vec::with_capacity(chosen.members.len());
            backends.extend(chosen.members.iter().filter_map(|i| merged.addr(*i)));
            crate::vocab::canonical(&mut backends);
            backends.dedup();
            let endpoints = if self.detail == Detail::Decisions {
                merged.decisions(&chosen, node, scope == Scope::Local)
            } else {
                Vec::new()
            };
            out.push(PortTranslation {
                key: ServicePortKey::from(ServicePortKeyFields {
                    service: svc.key.clone(),
                    port_name: Arc::clone(&port.name_or_number),
                    protocol,
                    family,
                    scope,
                }),
                desired: DesiredService {
                    port: port.port,
                    frontends: frontends.into_iter().collect(),
                    no_local_endpoint: chosen.rule == Rule::NoLocalEndpoint,
                    backends,
                    affinity_timeout_s: svc.affinity_timeout_s,
                    serving: if protocol == Protocol::Udp {
                        merged.serving()
                    } else {
                        Vec::new()
                    },
                    seniority: self.seniority.clone(),
                },
                target_port: match self.detail {
                    Detail::Decisions => port.target_port.to_string(),
                    Detail::Lean => String::new(),
                },
                rule: chosen.rule,
                endpoints,
            });
        }
        out
    }
}

/// Why a Service produces nothing at all, as kube-proxy's informers and `ShouldSkipService`
/// decide.
fn skip_reason(svc: &Service, node: &NodeInfo) -> Option<String> {
    if let Some(proxy) = &svc.proxy_name
        && **proxy != *node.proxy_name
    {
        return Some(format!(
            "labelled {LABEL_SERVICE_PROXY_NAME}={proxy}: handled by another proxy"
        ));
    }
    if svc.headless_label {
        return Some(format!(
            "labelled {LABEL_HEADLESS}: no proxy serves it (kube-proxy's informers skip it)"
        ));
    }
    if svc.type_ == ServiceType::ExternalName {
        return Some("type ExternalName: a DNS alias, no virtual IP".into());
    }
    if svc.headless {
        return Some("headless (clusterIP: None): DNS returns the endpoints, no virtual IP".into());
    }
    if svc.cluster_ips.is_empty() {
        return Some("no cluster IP allocated".into());
    }
    None
}

/// The slices kube-proxy would see: those labelled for another proxy, or headless, are left out.
fn own_slices<'a>(
    slices: &[&'a EndpointSlice],
    node: &NodeInfo,
    notes: &mut Vec<String>,
) -> Vec<&'a EndpointSlice> {
    let mut out = Vec::with_capacity(slices.len());
    for slice in slices {
        if let Some(proxy) = slice
            .proxy_name
            .as_ref()
            .filter(|p| ***p != *node.proxy_name)
        {
            notes.push(format!(
                "EndpointSlice {} is labelled {LABEL_SERVICE_PROXY_NAME}={proxy}: ignored",
                slice.key.name
            ));
        } else if slice.headless_label {
            notes.push(format!(
                "EndpointSlice {} is labelled {LABEL_HEADLESS}: ignored",
                slice.key.name
            ));
        } else {
            for note in &slice.notes {
                notes.push(format!("EndpointSlice {}: {note}", slice.key.name));
            }
            out.push(*slice);
        }
    }
    out
}

/// Every address one Service port claims in one family. Special addresses are never claimed
/// (whoever wrote them: the API server refuses them in externalIPs but not in a load
/// balancer's status, and manifests are not validated by it): they go to `refused`.
fn claims(
    svc: &Service,
    port: &ServicePort,
    protocol: Protocol,
    family: Family,
    node: &NodeInfo,
    notes: &mut Vec<String>,
    refused: &mut Vec<Refusal>,
) -> VecSet<FrontendClaim> {
    let mut out: Vec<FrontendClaim> = Vec::with_capacity(4);
    let claim = |ip: IpAddr, p: u16, kind: ClaimKind| FrontendClaim {
        addr: ServiceAddr::new(ip, p, protocol),
        kind,
    };
    let cluster_ip = svc.cluster_ip_of(family);
    if let Some(ip) = cluster_ip {
        out.push(claim(ip, port.port, ClaimKind::ClusterIp));
    }
    if let Some(node_port) = port.node_port {
        out.extend(
            of_family(&node.addresses, family).map(|ip| claim(ip, node_port, ClaimKind::NodePort)),
        );
    }
    if node.external_ips {
        out.extend(
            of_family(&svc.external_ips, family)
                .map(|ip| claim(ip, port.port, ClaimKind::ExternalIp)),
        );
    } else if !svc.external_ips.is_empty() && family == first_family(svc) {
        notes.push(
            "spec.externalIPs are not served: the agent runs with --external-ips ignore".into(),
        );
    }
    let ranges: Vec<_> = svc
        .source_ranges
        .iter()
        .filter(|r| Family::of(r.addr) == family)
        .collect();
    let firewalled = !ranges.is_empty() && !ranges.iter().any(|r| r.is_everything());
    for ingress in svc.lb_ingress.iter().filter(|i| Family::of(i.ip) == family) {
        if ingress.proxy_mode {
            continue;
        }
        if firewalled {
            let firewall_note = format!(
                "load-balancer IP {} is not translated: loadBalancerSourceRanges apply to it, so connects go to the load balancer, which enforces them",
                ingress.ip
            );
            if !notes.contains(&firewall_note) {
                notes.push(firewall_note);
            }
            continue;
        }
        out.push(claim(ingress.ip, port.port, ClaimKind::LoadBalancer));
    }
    out.retain(|c| {
        let ip = c.addr.addr.ip();
        let why = SpecialAddress::of(ip).or_else(|| {
            (c.kind != ClaimKind::NodePort && node.serves(ip, c.addr.addr.port(), c.addr.protocol))
                .then_some(SpecialAddress::ThisNode)
        });
        if let Some(why) = why {
            refused.push(Refusal {
                addr: ip,
                field: match c.kind {
                    ClaimKind::ClusterIp => "spec.clusterIPs",
                    ClaimKind::ExternalIp => "spec.externalIPs",
                    ClaimKind::LoadBalancer => "status.loadBalancer.ingress",
                    ClaimKind::NodePort => "the node's NodePort addresses",
                }
                .to_string(),
                why,
            });
        }
        why.is_none()
    });
    // One claim per address: the strongest kind (a ClusterIP also listed as an external IP is
    // still the ClusterIP).
    out.sort_by_key(|c| (c.addr, c.kind.precedence()));
    out.dedup_by_key(|c| c.addr);
    out.into_iter().collect()
}

fn first_family(svc: &Service) -> Family {
    svc.cluster_ips
        .first()
        .map_or(Family::IPv4, |ip| Family::of(*ip))
}

/// All addresses of one family among the given ones.
pub fn of_family(addrs: &[IpAddr], family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    addrs
        .iter()
        .copied()
        .filter(move |ip| Family::of(*ip) == family)
}

#[cfg(test)]
mod tests {
    use super::{KubeVersion, NodePortAddresses};
    use crate::{model::NodeObject, vocab::Family};

    #[test]
    fn kubernetes_versions_parse_as_the_api_server_and_users_write_them() {
        for text in ["1.30", "v1.30", "1.30.4", "1.30+", " 1.30 "] {
            assert_eq!(
                KubeVersion::parse(text),
                Some(KubeVersion { minor: 30 }),
                "{text}"
            );
        }
        for text in ["2.1", "1", "1.x", "", "30"] {
            assert_eq!(KubeVersion::parse(text), None, "{text}");
        }
        assert!(KubeVersion { minor: 30 }.hints_need_annotation());
        assert!(!KubeVersion { minor: 31 }.hints_need_annotation());
        assert!(!KubeVersion { minor: 33 }.node_hints());
        assert!(KubeVersion { minor: 34 }.node_hints());
    }

    #[test]
    fn node_port_addresses_follow_kube_proxys_flag() {
        let ip = |s: &str| s.parse().unwrap();
        let node = NodeObject {
            name: "node-a".into(),
            zone: None,
            internal_ips: vec![ip("192.0.2.100"), ip("192.0.2.101"), ip("fd00::100")],
            external_ips: vec![ip("203.0.113.100")],
            leaving: false,
        };
        let primary = NodePortAddresses::parse(&["primary".into()]).unwrap();
        assert_eq!(primary, NodePortAddresses::default());
        let picked = primary.resolve(&[], Some(&node), &[]);
        assert_eq!(picked.addresses, vec![ip("192.0.2.100"), ip("fd00::100")]);
        assert!(picked.match_all.is_empty());
        // No Node (nothing known yet): every family matches all, and nothing is bound.
        let unknown = primary.resolve(&[], None, &[]);
        assert_eq!(unknown.addresses, Vec::<std::net::IpAddr>::new());
        assert_eq!(unknown.match_all, vec![Family::IPv4, Family::IPv6]);
        let cidrs =
            NodePortAddresses::parse(&["192.0.2.0/24".into(), "203.0.113.0/24".into()]).unwrap();
        // Unknown interfaces: the Node's addresses inside the ranges; IPv6 has no range of its
        // own, so every IPv6 address (kube-proxy adds `::/0` to a family without a CIDR).
        let picked = cidrs.resolve(&[], Some(&node), &[]);
        assert_eq!(
            picked.addresses,
            vec![
                ip("192.0.2.100"),
                ip("192.0.2.101"),
                ip("203.0.113.100"),
                ip("fd00::100")
            ]
        );
        assert_eq!(picked.match_all, vec![Family::IPv6]);
        // Known interfaces: only what is bound there (a NATed ExternalIP is not), never loopback.
        assert_eq!(
            cidrs
                .resolve(
                    &[],
                    Some(&node),
                    &[ip("192.0.2.101"), ip("127.0.0.1"), ip("10.1.1.1")]
                )
                .addresses,
            vec![ip("192.0.2.101")]
        );
        let all = NodePortAddresses::parse(&["0.0.0.0/0".into()]).unwrap();
        let picked = all.resolve(&[], Some(&node), &[ip("127.0.0.1"), ip("10.1.1.1")]);
        assert_eq!(picked.addresses, vec![ip("10.1.1.1")]);
        assert_eq!(picked.match_all, vec![Family::IPv4, Family::IPv6]);
        assert!(NodePortAddresses::parse(&["primary".into(), "10.0.0.0/8".into()]).is_err());
        assert!(NodePortAddresses::parse(&["10.0.0.0/33".into()]).is_err());
    }

    /// kube-proxy's `primary` (cmd/kube-proxy/app/server.go, `NewNodePortAddresses`): a family
    /// whose node IP is missing keeps loopback there, gets no `/32` or `/128`, and so matches
    /// every local address of that family; special addresses are never NodePorts.
    #[test]
    fn a_family_without_a_primary_address_serves_every_address_of_its_family() {
        let ip = |s: &str| s.parse().unwrap();
        let v4_only = NodeObject {
            name: "node-a".into(),
            zone: None,
            internal_ips: vec![ip("192.0.2.100")],
            external_ips: Vec::new(),
            leaving: false,
        };
        let bound = [
            ip("127.0.0.1"),
            ip("192.0.2.100"),
            ip("192.0.2.200"),
            ip("::1"),
            ip("fe80::1"),
            ip("fd00::5"),
            ip("fd00::6"),
        ];
        let picked = NodePortAddresses::Primary.resolve(&[], Some(&v4_only), &bound);
        assert_eq!(
            picked.addresses,
            vec![ip("192.0.2.100"), ip("fd00::5"), ip("fd00::6")]
        );
        assert_eq!(picked.match_all, vec![Family::IPv6]);
    }

    /// `--node-address` replaces the NodePort addresses of its own family only (kube-proxy's
    /// `--bind-address` replaces its family's primary IP); the other family follows
    /// `--nodeport-addresses`. With CIDRs, a `/0` makes only its own family match all.
    #[test]
    fn node_addresses_replace_their_own_family_only() {
        let ip = |s: &str| s.parse().unwrap();
        let node = NodeObject {
            name: "node-a".into(),
            zone: None,
            internal_ips: vec![ip("192.0.2.100"), ip("fd00::100")],
            external_ips: Vec::new(),
            leaving: false,
        };
        let picked = NodePortAddresses::Primary.resolve(&[ip("192.0.2.7")], Some(&node), &[]);
        assert_eq!(picked.addresses, vec![ip("192.0.2.7"), ip("fd00::100")]);
        assert!(picked.match_all.is_empty());
        let bound = [
            ip("192.0.2.100"),
            ip("198.51.100.1"),
            ip("fd00::100"),
            ip("fd00::7"),
        ];
        let cidrs = NodePortAddresses::parse(&["::/0".into(), "198.51.100.0/24".into()]).unwrap();
        let picked = cidrs.resolve(&[], Some(&node), &bound);
        assert_eq!(
            picked.addresses,
            vec![ip("198.51.100.1"), ip("fd00::100"), ip("fd00::7")]
        );
        assert_eq!(picked.match_all, vec![Family::IPv6]);
        let picked = cidrs.resolve(&[ip("fd00::9")], Some(&node), &bound);
        assert_eq!(picked.addresses, vec![ip("198.51.100.1"), ip("fd00::9")]);
        assert!(picked.match_all.is_empty());
    }
}
