//! Services + EndpointSlices + this node's identity → the desired state of the maps.
//!
//! Pure functions: no IO, no clock, no randomness. The same inputs always give the same tables,
//! which is what the golden tests and `socklb explain` rely on.
mod endpoints;
pub mod report;
mod types;

pub use types::{
    Candidacy, DesiredService, DesiredState, EndpointDecision, Exclusion, PortTranslation, Scope,
    ServicePortKey, ServiceTranslation, Verdict,
};

use std::{collections::BTreeSet, net::IpAddr};

use endpoints::{Selection, of_family, select};

use crate::{
    dataplane::abi::{Family, Frontend},
    model::{
        EndpointSlice, LABEL_SERVICE_PROXY_NAME, Service, ServicePort, ServiceType, Store,
        TrafficPolicy,
    },
    vec_set::VecSet,
};

/// The proxy name socklb answers to in the `service.kubernetes.io/service-proxy-name` label.
pub const DEFAULT_PROXY_NAME: &str = "socklb";

/// Who "this node" is: for traffic policy Local, topology hints and NodePort frontends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: Option<String>,
    pub zone: Option<String>,
    /// Addresses on which NodePorts are served.
    pub addresses: Vec<IpAddr>,
    pub proxy_name: String,
}

impl Default for NodeInfo {
    fn default() -> Self {
        Self {
            name: None,
            zone: None,
            addresses: Vec::new(),
            proxy_name: DEFAULT_PROXY_NAME.into(),
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

/// Translates every Service in the store, with every endpoint's decision.
pub fn translate_all(store: &Store, node: &NodeInfo) -> (DesiredState, Vec<ServiceTranslation>) {
    translate_all_with(store, node, Detail::Decisions)
}

/// Translates every Service in the store.
pub fn translate_all_with(
    store: &Store,
    node: &NodeInfo,
    detail: Detail,
) -> (DesiredState, Vec<ServiceTranslation>) {
    let mut desired = DesiredState::default();
    let mut reports = Vec::with_capacity(store.service_count());
    for svc in store.services() {
        let report = translate_service_with(svc, &store.slices_of(&svc.key), node, detail);
        for port in &report.ports {
            desired
                .services
                .insert(port.key.clone(), port.desired.clone());
        }
        reports.push(report);
    }
    (desired, reports)
}

/// Translates one Service with the slices labelled for it, with every endpoint's decision.
pub fn translate_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
) -> ServiceTranslation {
    translate_service_with(svc, slices, node, Detail::Decisions)
}

/// Translates one Service with the slices labelled for it.
pub fn translate_service_with(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeInfo,
    detail: Detail,
) -> ServiceTranslation {
    let mut out = ServiceTranslation {
        service: svc.key.clone(),
        resource_version: svc.resource_version.clone(),
        skipped: None,
        ports: Vec::new(),
        notes: Vec::new(),
    };
    if let Some(skip) = skip_reason(svc, node) {
        out.skipped = Some(skip);
        return out;
    }
    for port in &svc.ports {
        let Some(protocol) = port.protocol else {
            out.notes.push(format!(
                "port {} is {}: socklb translates TCP and UDP only",
                port.display_name(),
                port.protocol_name
            ));
            continue;
        };
        // Only the families the Service has (its cluster IPs): kube-proxy's per-family proxiers
        // leave a single-stack Service's other family alone, NodePorts included.
        for family in svc.cluster_ips.iter().map(|ip| Family::of(*ip)) {
            for scope in [Scope::Internal, Scope::External] {
                let frontends: VecSet<Frontend> = frontend_addrs(svc, port, family, scope, node)
                    .into_iter()
                    .map(|(ip, p)| Frontend::new(ip, p, protocol))
                    .collect();
                if frontends.is_empty() {
                    continue;
                }
                let policy = match scope {
                    Scope::Internal => svc.internal_traffic_policy,
                    Scope::External => svc.external_traffic_policy,
                };
                let selection = Selection {
                    service: svc,
                    port,
                    family,
                    local_only: policy == TrafficPolicy::Local,
                    node,
                };
                let (backends, endpoints) = select(&selection, slices, detail == Detail::Decisions);
                out.ports.push(PortTranslation {
                    key: ServicePortKey {
                        service: svc.key.clone(),
                        port_name: port.display_name(),
                        protocol,
                        family,
                        scope,
                    },
                    desired: DesiredService {
                        port: port.port,
                        frontends,
                        backends,
                        affinity_timeout_s: svc.affinity_timeout_s,
                    },
                    target_port: port.target_port.to_string(),
                    endpoints,
                });
            }
        }
    }
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

fn skip_reason(svc: &Service, node: &NodeInfo) -> Option<String> {
    if let Some(proxy) = svc.labels.get(LABEL_SERVICE_PROXY_NAME)
        && *proxy != node.proxy_name
    {
        return Some(format!(
            "labelled {LABEL_SERVICE_PROXY_NAME}={proxy}: handled by another proxy"
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

/// The addresses and ports where one Service port is reached, per family and scope.
fn frontend_addrs(
    svc: &Service,
    port: &ServicePort,
    family: Family,
    scope: Scope,
    node: &NodeInfo,
) -> BTreeSet<(IpAddr, u16)> {
    let mut out = BTreeSet::new();
    match scope {
        Scope::Internal => {
            if let Some(ip) = svc.cluster_ip_of(family) {
                out.insert((ip, port.port));
            }
        }
        Scope::External => {
            if matches!(svc.type_, ServiceType::NodePort | ServiceType::LoadBalancer)
                && let Some(node_port) = port.node_port
            {
                out.extend(of_family(&node.addresses, family).map(|ip| (ip, node_port)));
            }
            out.extend(of_family(&svc.external_ips, family).map(|ip| (ip, port.port)));
            if svc.type_ == ServiceType::LoadBalancer {
                out.extend(
                    svc.lb_ingress
                        .iter()
                        .filter(|i| !i.proxy_mode && Family::of(i.ip) == family)
                        .map(|i| (i.ip, port.port)),
                );
            }
            // A cluster IP is always internal, even if also listed as external.
            if let Some(ip) = svc.cluster_ip_of(family) {
                out.remove(&(ip, port.port));
            }
        }
    }
    out
}
