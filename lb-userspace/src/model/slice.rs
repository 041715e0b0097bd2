//! The EndpointSlice as socklb needs it, validated from the Kubernetes API type.
use std::{net::IpAddr, sync::Arc};

use k8s_openapi::api::discovery::v1 as discovery;

use super::{
    LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, ValidationError,
    intern::{Interner, intern},
    validate::{Checker, parse_ip_sloppy},
};
use crate::vocab::{Family, Kind, ObjectKey, Protocol};

/// The API's limit on endpoints in one slice.
pub(super) const MAX_ENDPOINTS_PER_SLICE: usize = 1000;
/// The API's limit on ports in one slice.
pub(super) const MAX_PORTS_PER_SLICE: usize = 100;
/// When the change a slice carries was triggered (RFC 3339), set by the EndpointSlice
/// controller; kube-proxy's network programming latency starts there.
pub(super) const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressType {
    Ip(Family),
    Fqdn,
}

impl std::fmt::Display for AddressType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ip(family) => family.fmt(f),
            Self::Fqdn => f.write_str("FQDN"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The first address (the API says consumers use only the first).
    pub address: Option<IpAddr>,
    /// As written: `None` means the condition was absent.
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    /// Its `nodeName`, `zone`, `hints` and `targetRef` kind, interned together: a cluster has
    /// about one such context per node (hints follow the zone, targets are Pods in the slice's
    /// namespace), shared by all its endpoints. `None`: none of them is set.
    context: Option<Arc<Context>>,
    /// Its `targetRef` name's bytes in the slice's `target_names`
    /// ([`EndpointSlice::target_of`]). With the context, an endpoint takes 40 bytes and no
    /// allocation of its own (the agent holds every endpoint of the cluster).
    name_start: u32,
    name_len: u32,
}

/// What an endpoint shares with others on its node (see `Endpoint::context`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Context {
    /// `nodeName`.
    node: Option<Arc<str>>,
    zone: Option<Arc<str>>,
    hints: Hints,
    /// The `targetRef`, when present: its name is the endpoint's.
    target: Option<TargetScope>,
}

static CONTEXTS: Interner<Context> = Interner::new();

/// A `targetRef`'s kind and namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TargetScope {
    kind: Arc<str>,
    /// `None`: the slice's own (nearly always), so one context serves every namespace.
    namespace: Option<Arc<str>>,
}

/// An endpoint's topology hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hints {
    /// `hints.forZones` names.
    pub zones: Option<Box<[Arc<str>]>>,
    /// `hints.forNodes` names.
    pub nodes: Option<Box<[Arc<str>]>>,
}

/// An endpoint's `targetRef` (usually a Pod).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetRef {
    pub kind: Arc<str>,
    pub key: ObjectKey,
}

/// An endpoint's `targetRef` as its slice holds it (no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetView<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl TargetView<'_> {
    /// An owned copy (explain's decisions carry one).
    pub fn to_target_ref(self) -> TargetRef {
        TargetRef {
            kind: intern(self.kind),
            key: ObjectKey::new(intern(self.namespace), self.name),
        }
    }
}

impl std::fmt::Display for TargetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.key)
    }
}

impl Endpoint {
    pub fn node_name(&self) -> Option<&str> {
        self.context.as_ref()?.node.as_deref()
    }

    /// The node's name, shared.
    pub fn node_name_shared(&self) -> Option<Arc<str>> {
        self.context.as_ref()?.node.clone()
    }

    pub fn zone(&self) -> Option<&str> {
        self.context.as_ref()?.zone.as_deref()
    }

    /// The zone's name, shared.
    pub fn zone_shared(&self) -> Option<Arc<str>> {
        self.context.as_ref()?.zone.clone()
    }

    pub fn zone_hints(&self) -> Option<&[Arc<str>]> {
        self.context.as_ref()?.hints.zones.as_deref()
    }

    pub fn node_hints(&self) -> Option<&[Arc<str>]> {
        self.context.as_ref()?.hints.nodes.as_deref()
    }

    /// Absent `ready` counts as ready, as the API documents.
    pub fn is_ready(&self) -> bool {
        self.ready.unwrap_or(true)
    }

    /// Absent `serving` counts as serving (kube-proxy's reading).
    pub fn is_serving(&self) -> bool {
        self.serving.unwrap_or(true)
    }

    pub fn is_terminating(&self) -> bool {
        self.terminating.unwrap_or(false)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPort {
    /// The Service port's name this entry is for (empty for an unnamed port). Interned, as
    /// the protocol: a cluster has a few port names for all its slices.
    pub name: Arc<str>,
    pub protocol: Arc<str>,
    /// None: the API's "all ports", which a Service cannot use.
    pub port: Option<u16>,
}

impl EndpointPort {
    pub fn protocol(&self) -> Option<Protocol> {
        Protocol::parse(&self.protocol)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSlice {
    pub key: ObjectKey,
    pub resource_version: super::ResourceVersion,
    /// The Service it belongs to (`kubernetes.io/service-name`), in the slice's namespace.
    pub service: Option<ObjectKey>,
    pub address_type: AddressType,
    /// Boxed slices, as the other lists: a slice is replaced whole, never grown.
    pub endpoints: Box<[Endpoint]>,
    /// The endpoints' `targetRef` names, one after the other (one allocation per slice).
    pub(super) target_names: Box<str>,
    pub ports: Box<[EndpointPort]>,
    /// `service.kubernetes.io/service-proxy-name`, when labelled.
    pub proxy_name: Option<Box<str>>,
    /// Labelled `service.kubernetes.io/headless` (kube-proxy ignores such slices).
    pub headless_label: bool,
    /// Endpoints left out without rejecting the slice (an address that does not parse, say).
    pub notes: Box<[String]>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`, in Unix milliseconds, when present
    /// and valid (for the network programming latency metric).
    pub last_change_trigger_ms: Option<i64>,
}

impl EndpointSlice {
    /// The `targetRef` of `endpoint`, one of this slice's endpoints.
    pub fn target_of<'a>(&'a self, endpoint: &'a Endpoint) -> Option<TargetView<'a>> {
        let t = endpoint.context.as_ref()?.target.as_ref()?;
        let start = endpoint.name_start as usize;
        Some(TargetView {
            kind: &t.kind,
            namespace: t.namespace.as_deref().unwrap_or(&self.key.namespace),
            name: self
                .target_names
                .get(start..start + endpoint.name_len as usize)
                .unwrap_or("?"),
        })
    }
}

/// Validates an EndpointSlice from the API (or a manifest) into socklb's model.
pub fn slice_from_api(slice: &discovery::EndpointSlice) -> Result<EndpointSlice, ValidationError> {
    let meta = &slice.metadata;
    let (c, key) = Checker::for_object(Kind::EndpointSlice, meta, 253)?;
    let service = match meta.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) {
        Some(svc) => {
            c.dns_name(&format!("metadata.labels[{LABEL_SERVICE_NAME}]"), svc, 63)?;
            Some(ObjectKey::new(Arc::clone(&key.namespace), intern(svc)))
        }
        None => None,
    };
    let address_type = match slice.address_type.as_str() {
        "IPv4" => AddressType::Ip(Family::IPv4),
        "IPv6" => AddressType::Ip(Family::IPv6),
        "FQDN" => AddressType::Fqdn,
        other => {
            return Err(c.error(
                "addressType",
                format!("{other:?} is not IPv4, IPv6 or FQDN"),
            ));
        }
    };
    if slice.endpoints.len() > MAX_ENDPOINTS_PER_SLICE {
        return Err(c.error(
            "endpoints",
            format!(
                "{} endpoints, at most {MAX_ENDPOINTS_PER_SLICE} allowed in one slice",
                slice.endpoints.len()
            ),
        ));
    }
    let mut notes = Vec::new();
    let (endpoints, target_names) = endpoints(address_type, slice, &key.namespace, &mut notes);
    let ports = ports(&c, slice)?;
    let labels = meta.labels.as_ref();
    Ok(EndpointSlice {
        key,
        resource_version: meta.resource_version.as_deref().unwrap_or_default().into(),
        service,
        address_type,
        endpoints: endpoints.into(),
        target_names: target_names.into(),
        ports: ports.into(),
        proxy_name: labels
            .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
            .map(|n| n.as_str().into()),
        headless_label: labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)),
        notes: notes.into(),
        last_change_trigger_ms: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME))
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(k8s_openapi::jiff::Timestamp::as_millisecond),
    })
}

/// The slice's endpoints, as kube-proxy reads them: the first address only; an endpoint without
/// an address, or whose address does not parse or is of the other family, is left out with a
/// note while the others stay. With them, their `targetRef` names one after the other.
fn endpoints(
    address_type: AddressType,
    slice: &discovery::EndpointSlice,
    namespace: &str,
    notes: &mut Vec<String>,
) -> (Vec<Endpoint>, String) {
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    let names_len = slice
        .endpoints
        .iter()
        .filter_map(|e| e.target_ref.as_ref()?.name.as_ref().map(String::len))
        .sum();
    let mut names = String::with_capacity(names_len);
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let address = match (address_type, ep.addresses.first()) {
            (_, None) => {
                notes.push(format!("endpoints[{i}] has no address: left out"));
                continue;
            }
            (AddressType::Fqdn, Some(_)) => None,
            (AddressType::Ip(family), Some(a)) => match parse_ip_sloppy(a) {
                Some(ip) if Family::of(ip) == family => Some(ip),
                Some(ip) => {
                    notes.push(format!(
                        "endpoints[{i}].addresses[0] {ip} is not an {family} address, as addressType says: left out"
                    ));
                    continue;
                }
                None => {
                    notes.push(format!(
                        "endpoints[{i}].addresses[0] {a:?} is not an IP address: left out"
                    ));
                    continue;
                }
            },
        };
        let conditions = ep.conditions.clone().unwrap_or_default();
        let (target_scope, name_start, name_bytes) = match target(ep, namespace, &mut names) {
            Some((scope, start, len)) => (Some(scope), start, len),
            None => (None, 0, 0),
        };
        let context = Context {
            node: ep.node_name.as_deref().map(intern),
            zone: ep.zone.as_deref().map(intern),
            hints: hints(ep),
            target: target_scope,
        };
        endpoints.push(Endpoint {
            address,
            ready: conditions.ready,
            serving: conditions.serving,
            terminating: conditions.terminating,
            context: (context != Context::default())
                .then(|| CONTEXTS.get(&context, |c| Arc::new(c.clone()))),
            name_start,
            name_len: name_bytes,
        });
    }
    (endpoints, names)
}

fn ports(
    c: &Checker,
    slice: &discovery::EndpointSlice,
) -> Result<Vec<EndpointPort>, ValidationError> {
    let api_ports = slice.ports.as_deref().unwrap_or_default();
    if api_ports.len() > MAX_PORTS_PER_SLICE {
        return Err(c.error(
            "ports",
            format!(
                "{} ports, at most {MAX_PORTS_PER_SLICE} allowed",
                api_ports.len()
            ),
        ));
    }
    let mut ports = Vec::with_capacity(api_ports.len());
    for (i, p) in api_ports.iter().enumerate() {
        let name = p.name.clone().unwrap_or_default();
        if !name.is_empty() {
            c.dns_label(&format!("ports[{i}].name"), &name)?;
        }
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if !matches!(protocol.as_str(), "TCP" | "UDP" | "SCTP") {
            return Err(c.error(
                format!("ports[{i}].protocol"),
                format!("{protocol:?} is not TCP, UDP or SCTP"),
            ));
        }
        let port = p
            .port
            .map(|n| c.port(&format!("ports[{i}].port"), n))
            .transpose()?;
        ports.push(EndpointPort {
            name: intern(&name),
            protocol: intern(&protocol),
            port,
        });
    }
    Ok(ports)
}

/// The endpoint's hints; none when absent or naming nothing.
fn hints(ep: &discovery::Endpoint) -> Hints {
    let Some(h) = ep.hints.as_ref() else {
        return Hints::default();
    };
    Hints {
        zones: h
            .for_zones
            .as_ref()
            .map(|z| z.iter().map(|z| intern(&z.name)).collect()),
        nodes: h
            .for_nodes
            .as_ref()
            .map(|n| n.iter().map(|n| intern(&n.name)).collect()),
    }
}

/// The endpoint's `targetRef`: its kind and namespace, and where its name went in `names`.
fn target(
    ep: &discovery::Endpoint,
    namespace: &str,
    names: &mut String,
) -> Option<(TargetScope, u32, u32)> {
    let t = ep.target_ref.as_ref()?;
    let scope = TargetScope {
        kind: intern(t.kind.as_deref().unwrap_or("Object")),
        namespace: t
            .namespace
            .as_deref()
            .filter(|ns| *ns != namespace)
            .map(intern),
    };
    let name = t.name.as_deref().unwrap_or("?");
    // A slice holds at most 1,000 endpoints with names of at most 253 bytes (validated or
    // not, an object from the API server is far below 4 GiB).
    let name_start = u32::try_from(names.len()).ok()?;
    let name_len = u32::try_from(name.len()).ok()?;
    names.push_str(name);
    Some((scope, name_start, name_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice_with_annotation(value: &str) -> discovery::EndpointSlice {
        discovery::EndpointSlice {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web-abc12".into()),
                namespace: Some("default".into()),
                annotations: Some(
                    [(
                        ANNOTATION_LAST_CHANGE_TRIGGER_TIME.to_string(),
                        value.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_endpoint_allocates_nothing_and_shares_its_node_zone_hints_and_target_kind() {
        // No allocation per endpoint: its pod's name is in the slice's one buffer, the rest in
        // a context shared with the endpoints beside it.
        assert!(std::mem::size_of::<Endpoint>() <= 40);
        let endpoint = |zone: &str, pod: &str, namespace: Option<&str>| discovery::Endpoint {
            addresses: vec!["10.0.0.1".into()],
            zone: Some(zone.into()),
            hints: Some(discovery::EndpointHints {
                for_zones: Some(vec![discovery::ForZone { name: zone.into() }]),
                ..Default::default()
            }),
            target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: namespace.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut slice = slice_with_annotation("");
        slice.endpoints = vec![
            endpoint("zone-a", "web-1", None),
            endpoint("zone-a", "web-2", Some("default")),
            endpoint("zone-b", "web-3", None),
            endpoint("zone-b", "web-4", Some("elsewhere")),
        ];
        let s = slice_from_api(&slice).unwrap();
        let context = |i: usize| s.endpoints[i].context.clone().unwrap();
        // The slice's own namespace, written or not, is one context.
        assert!(Arc::ptr_eq(&context(0), &context(1)));
        assert!(!Arc::ptr_eq(&context(0), &context(2)));
        assert!(!Arc::ptr_eq(&context(2), &context(3)));
        // Another slice's endpoints in the same place share it too.
        let other = slice_from_api(&slice).unwrap();
        assert!(Arc::ptr_eq(
            &context(2),
            other.endpoints[2].context.as_ref().unwrap()
        ));
        assert_eq!(s.endpoints[2].zone(), Some("zone-b"));
        assert_eq!(s.endpoints[2].node_name(), None);
        assert_eq!(s.endpoints[2].zone_hints().unwrap()[0].as_ref(), "zone-b");
        assert_eq!(s.endpoints[1].node_hints(), None);
        let target = |i: usize| s.target_of(&s.endpoints[i]).unwrap();
        assert_eq!(target(1).name, "web-2");
        assert_eq!(target(2).name, "web-3");
        assert_eq!((target(0).kind, target(0).namespace), ("Pod", "default"));
        assert_eq!((target(1).kind, target(1).namespace), ("Pod", "default"));
        assert_eq!(
            (target(3).namespace, target(3).name),
            ("elsewhere", "web-4")
        );
        assert_eq!(
            target(1).to_target_ref().to_string(),
            "Pod default/web-2",
            "explain's owned copy"
        );
        // Hints present but naming nothing read as no hints; with nothing else set, the
        // endpoint has no context at all.
        slice.endpoints = vec![discovery::Endpoint {
            addresses: vec!["10.0.0.1".into()],
            hints: Some(discovery::EndpointHints::default()),
            ..Default::default()
        }];
        let s = slice_from_api(&slice).unwrap();
        assert!(s.endpoints[0].context.is_none());
        assert_eq!(s.endpoints[0].zone_hints(), None);
        assert_eq!(s.target_of(&s.endpoints[0]), None);
    }

    #[test]
    fn a_service_and_the_slices_labelled_with_it_share_one_copy_of_its_name() {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap();
        let svc = crate::model::service_from_api(&svc).unwrap();
        let mut slice = slice_with_annotation("");
        slice.metadata.labels = Some([(LABEL_SERVICE_NAME.to_string(), "web".to_string())].into());
        let a = slice_from_api(&slice).unwrap();
        let b = slice_from_api(&slice).unwrap();
        let (a, b) = (a.service.unwrap(), b.service.unwrap());
        assert_eq!(a, svc.key);
        assert!(Arc::ptr_eq(&a.name, &svc.key.name));
        assert!(Arc::ptr_eq(&b.name, &svc.key.name));
        // A slice's own name is its own.
        assert!(!Arc::ptr_eq(
            &slice_from_api(&slice).unwrap().key.name,
            &slice_from_api(&slice).unwrap().key.name
        ));
    }

    #[test]
    fn the_last_change_trigger_time_is_read_in_unix_milliseconds() {
        let s = slice_from_api(&slice_with_annotation("2024-01-02T03:04:05.678901Z")).unwrap();
        assert_eq!(s.last_change_trigger_ms, Some(1_704_164_645_678));
        let s = slice_from_api(&slice_with_annotation("2024-01-02T04:04:05+01:00")).unwrap();
        assert_eq!(s.last_change_trigger_ms, Some(1_704_164_645_000));
        // Not a time: the slice is still used, without it.
        let s = slice_from_api(&slice_with_annotation("yesterday")).unwrap();
        assert_eq!(s.last_change_trigger_ms, None);
    }
}
