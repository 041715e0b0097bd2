//! The Service as socklb needs it, validated from the Kubernetes API type.
use std::{net::IpAddr, sync::Arc};

use k8s_openapi::{api::core::v1 as core, apimachinery::pkg::util::intstr::IntOrString};

use super::{
    LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, ValidationError,
    intern::intern,
    validate::{Checker, Cidr, parse_ip_sloppy},
};
use crate::vocab::{Family, Kind, ObjectKey, Protocol};

/// sessionAffinityConfig.clientIP.timeoutSeconds when unset (3 hours), as the API defaults it.
pub(super) const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// The API's upper bound for the affinity timeout (one day).
pub(super) const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

impl std::fmt::Display for TargetPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Name(s) => write!(f, "{s}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// Empty for the single unnamed port of a one-port Service. Interned, as the protocol
    /// name: a cluster has a few port names for all its Services.
    pub name: Arc<str>,
    /// The name used in keys and output: the port name, or the port number when unnamed.
    pub name_or_number: Arc<str>,
    /// None for protocols socklb does not translate (SCTP), kept so explain can say so.
    pub protocol: Option<Protocol>,
    pub protocol_name: Arc<str>,
    pub port: u16,
    pub target_port: TargetPort,
    pub node_port: Option<u16>,
}

/// A load-balancer ingress address from `status.loadBalancer.ingress`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbIngress {
    pub ip: IpAddr,
    /// `ipMode: Proxy`: the load balancer proxies, so traffic to this IP must leave the node.
    pub proxy_mode: bool,
}

/// `spec.selector`'s pairs, sorted by key.
pub type Selector = Box<[(Box<str>, Box<str>)]>;

/// Lists and strings are boxed slices, not vectors: the agent holds every Service of the
/// cluster, and a Service is not changed in place (each version replaces the last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub key: ObjectKey,
    pub resource_version: super::ResourceVersion,
    /// `metadata.uid`: with `created`, decides which of two Services claiming one address owns it.
    pub uid: Arc<str>,
    /// `metadata.creationTimestamp`, seconds since the epoch.
    pub created: Option<i64>,
    /// `service.kubernetes.io/service-proxy-name`, when labelled.
    pub proxy_name: Option<Box<str>>,
    /// Labelled `service.kubernetes.io/headless` (kube-proxy ignores such Services).
    pub headless_label: bool,
    pub type_: ServiceType,
    /// `clusterIP: None`.
    pub headless: bool,
    /// `spec.clusterIPs` (or `spec.clusterIP`), one per family.
    pub cluster_ips: Box<[IpAddr]>,
    pub external_ips: Box<[IpAddr]>,
    pub lb_ingress: Box<[LbIngress]>,
    /// `spec.loadBalancerSourceRanges`, parsed; entries that do not parse are left out (noted).
    pub source_ranges: Box<[Cidr]>,
    pub ports: Box<[ServicePort]>,
    /// `spec.selector`, sorted by key; explain shows it. Pairs, not a map: a one-entry
    /// `BTreeMap` allocates a node for eleven, and the agent holds every Service.
    pub selector: Option<Selector>,
    /// sessionAffinity ClientIP timeout, when affinity is on.
    pub affinity_timeout_s: Option<u32>,
    pub internal_traffic_policy: TrafficPolicy,
    pub external_traffic_policy: TrafficPolicy,
    /// Applied by the EndpointSlice controller (endpoints arrive ready); kept for explain.
    pub publish_not_ready_addresses: bool,
    pub traffic_distribution: Option<Box<str>>,
    /// `spec.healthCheckNodePort` (LoadBalancer, externalTrafficPolicy Local).
    pub health_check_node_port: Option<u16>,
    /// The topology annotation's value: `service.kubernetes.io/topology-aware-hints` when
    /// present (it wins, as in kube-proxy), else `service.kubernetes.io/topology-mode`.
    pub topology_annotation: Option<Box<str>>,
    /// Parts of the Service that were left out without rejecting it (an externalIP that does
    /// not parse, say), as kube-proxy skips them one by one.
    pub notes: Box<[String]>,
}

impl Service {
    pub fn cluster_ip_of(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips
            .iter()
            .copied()
            .find(|ip| Family::of(*ip) == family)
    }
}

fn policy(c: &Checker, field: &str, value: Option<&str>) -> Result<TrafficPolicy, ValidationError> {
    match value {
        None | Some("" | "Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(c.error(field, format!("{other:?} is not Cluster or Local"))),
    }
}

/// Validates a Service from the API (or a manifest) into socklb's model.
pub fn service_from_api(svc: &core::Service) -> Result<Service, ValidationError> {
    let meta = &svc.metadata;
    let (c, key) = Checker::for_object(Kind::Service, meta, 63)?;
    let spec = svc
        .spec
        .as_ref()
        .ok_or_else(|| c.error("spec", "missing"))?;

    let type_ = match spec.type_.as_deref() {
        None | Some("" | "ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        Some(other) => return Err(c.error("spec.type", format!("unknown type {other:?}"))),
    };

    let (cluster_ips, headless) = cluster_ips(&c, spec)?;

    let mut notes = Vec::new();
    let external_ips = sloppy_ips(
        "spec.externalIPs",
        spec.external_ips.iter().flatten(),
        &mut notes,
    );
    let source_ranges = source_ranges(spec, &mut notes);
    let lb_ingress = lb_ingress(svc, &mut notes);
    let ports = validate_ports(&c, spec.ports.as_deref().unwrap_or_default())?;

    let affinity_timeout_s = affinity_timeout(&c, spec)?;

    Ok(Service {
        key,
        resource_version: meta.resource_version.as_deref().unwrap_or_default().into(),
        uid: meta.uid.as_deref().unwrap_or_default().into(),
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        proxy_name: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
            .map(|n| n.as_str().into()),
        headless_label: meta
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_HEADLESS)),
        type_,
        headless,
        cluster_ips: cluster_ips.into(),
        external_ips: external_ips.into(),
        lb_ingress: lb_ingress.into(),
        source_ranges: source_ranges.into(),
        ports: ports.into(),
        selector: spec.selector.as_ref().map(|s| {
            s.iter()
                .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
                .collect()
        }),
        affinity_timeout_s,
        internal_traffic_policy: policy(
            &c,
            "spec.internalTrafficPolicy",
            spec.internal_traffic_policy.as_deref(),
        )?,
        external_traffic_policy: policy(
            &c,
            "spec.externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?,
        publish_not_ready_addresses: spec.publish_not_ready_addresses.unwrap_or(false),
        traffic_distribution: spec.traffic_distribution.as_deref().map(Into::into),
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
        topology_annotation: meta.annotations.as_ref().and_then(|a| {
            // kube-proxy reads the deprecated annotation, and the current one when that is
            // empty or absent.
            a.get(ANNOTATION_TOPOLOGY_AWARE_HINTS)
                .filter(|v| !v.is_empty())
                .or_else(|| a.get(ANNOTATION_TOPOLOGY_MODE))
                .map(|v| v.as_str().into())
        }),
        notes: notes.into(),
    })
}

/// The topology annotations kube-proxy read before 1.33 (`pkg/proxy/serviceport.go`).
pub(super) const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str =
    "service.kubernetes.io/topology-aware-hints";
pub(super) const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";

/// `spec.clusterIPs` (or `spec.clusterIP`): the addresses, and whether the Service is headless.
fn cluster_ips(
    c: &Checker,
    spec: &core::ServiceSpec,
) -> Result<(Vec<IpAddr>, bool), ValidationError> {
    let mut headless = false;
    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    let listed: Vec<(String, &str)> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect(),
        _ => spec
            .cluster_ip
            .iter()
            .map(|ip| ("spec.clusterIP".to_string(), ip.as_str()))
            .collect(),
    };
    for (field, ip) in listed {
        match ip {
            "None" => headless = true,
            "" => {}
            ip => {
                let ip = c.ip(&field, ip)?;
                if cluster_ips
                    .iter()
                    .any(|other| Family::of(*other) == Family::of(ip))
                {
                    return Err(c.error(field, format!("second {} cluster IP", Family::of(ip))));
                }
                cluster_ips.push(ip);
            }
        }
    }
    Ok((cluster_ips, headless))
}

/// Addresses of a list field, parsed as kube-proxy does (leading zeros allowed); one that does
/// not parse is left out with a note, the others kept.
fn sloppy_ips<'a>(
    field: &str,
    values: impl Iterator<Item = &'a String>,
    notes: &mut Vec<String>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, value) in values.enumerate() {
        if value.is_empty() {
            continue;
        }
        match parse_ip_sloppy(value) {
            Some(ip) => out.push(ip),
            None => notes.push(format!(
                "{field}[{i}] {value:?} is not an IP address: left out"
            )),
        }
    }
    out
}

/// `status.loadBalancer.ingress[].ip`, with their ipMode (hostname-only entries are not
/// addresses and are skipped).
fn lb_ingress(svc: &core::Service, notes: &mut Vec<String>) -> Vec<LbIngress> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut out = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        match parse_ip_sloppy(ip) {
            Some(ip) => out.push(LbIngress {
                ip,
                proxy_mode: ing.ip_mode.as_deref() == Some("Proxy"),
            }),
            None => notes.push(format!(
                "status.loadBalancer.ingress[{i}].ip {ip:?} is not an IP address: left out"
            )),
        }
    }
    out
}

/// `spec.loadBalancerSourceRanges`: trimmed and parsed one by one, as kube-proxy does.
fn source_ranges(spec: &core::ServiceSpec, notes: &mut Vec<String>) -> Vec<Cidr> {
    let mut out = Vec::new();
    for (i, value) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        match Cidr::parse(value.trim()) {
            Some(cidr) => out.push(cidr),
            None => notes.push(format!(
                "spec.loadBalancerSourceRanges[{i}] {value:?} is not a CIDR: left out"
            )),
        }
    }
    out
}

/// sessionAffinity ClientIP's timeout, when affinity is on.
fn affinity_timeout(c: &Checker, spec: &core::ServiceSpec) -> Result<Option<u32>, ValidationError> {
    match spec.session_affinity.as_deref() {
        None | Some("" | "None") => Ok(None),
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|s| s.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Ok(Some(DEFAULT_AFFINITY_TIMEOUT_S)),
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => Ok(Some(t)),
                    _ => Err(c.error(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} is outside 1-{MAX_AFFINITY_TIMEOUT_S}"),
                    )),
                },
            }
        }
        Some(other) => Err(c.error(
            "spec.sessionAffinity",
            format!("{other:?} is not None or ClientIP"),
        )),
    }
}

fn validate_ports(
    c: &Checker,
    ports: &[core::ServicePort],
) -> Result<Vec<ServicePort>, ValidationError> {
    let mut out: Vec<ServicePort> = Vec::with_capacity(ports.len());
    for (i, p) in ports.iter().enumerate() {
        let field = |f: &str| format!("spec.ports[{i}].{f}");
        let name = p.name.clone().unwrap_or_default();
        if !name.is_empty() {
            c.dns_label(&field("name"), &name)?;
        } else if ports.len() > 1 {
            return Err(c.error(
                field("name"),
                "every port of a multi-port Service needs a name",
            ));
        }
        let protocol_name = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let protocol = match protocol_name.as_str() {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => None,
            other => {
                return Err(c.error(
                    field("protocol"),
                    format!("{other:?} is not TCP, UDP or SCTP"),
                ));
            }
        };
        let port = c.port(&field("port"), p.port)?;
        let target_port = match &p.target_port {
            None => TargetPort::Number(port),
            Some(IntOrString::Int(n)) => TargetPort::Number(c.port(&field("targetPort"), *n)?),
            Some(IntOrString::String(s)) => {
                if let Ok(n) = s.parse::<i32>() {
                    TargetPort::Number(c.port(&field("targetPort"), n)?)
                } else {
                    c.port_name(&field("targetPort"), s)?;
                    TargetPort::Name(s.clone())
                }
            }
        };
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => Some(c.port(&field("nodePort"), n)?),
        };
        if out.iter().any(|o| *o.name == *name) {
            return Err(c.error(field("name"), format!("duplicate port name {name:?}")));
        }
        if out
            .iter()
            .any(|o| o.port == port && *o.protocol_name == *protocol_name)
        {
            return Err(c.error(
                field("port"),
                format!("duplicate port {port}/{protocol_name}"),
            ));
        }
        if let Some(n) = node_port
            && out
                .iter()
                .any(|o| o.node_port == Some(n) && *o.protocol_name == *protocol_name)
        {
            // As the API server's validation: one node port serves one service port.
            return Err(c.error(
                field("nodePort"),
                format!("duplicate node port {n}/{protocol_name}"),
            ));
        }
        let name = intern(&name);
        out.push(ServicePort {
            name_or_number: if name.is_empty() {
                Arc::from(port.to_string())
            } else {
                Arc::clone(&name)
            },
            name,
            protocol,
            protocol_name: intern(&protocol_name),
            port,
            target_port,
            node_port,
        });
    }
    Ok(out)
}
