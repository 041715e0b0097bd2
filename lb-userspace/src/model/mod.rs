//! Kubernetes objects as socklb uses them: parsed from the API or from YAML, validated once, and
//! turned into plain Rust types (addresses parsed, ports ranged, enums instead of strings).
//! Everything downstream (translation, explain) works on these types only.
mod intern;
mod manifest;
mod service;
mod slice;
mod store;
mod validate;

pub use manifest::{
    ManifestError, ManifestObject, NodeObject, Parsed, node_from_api, parse_manifests,
};
pub use service::{
    LbIngress, Service, ServicePort, ServiceType, TargetPort, TrafficPolicy, service_from_api,
};
pub use slice::{
    AddressType, Endpoint, EndpointDetails, EndpointPort, EndpointSlice, slice_from_api,
};
pub use store::Store;
pub use validate::ValidationError;

use std::{fmt, sync::Arc};

use serde::Serialize;

/// `namespace/name` of a namespaced object. Shared strings: the agent keeps a Service's key in
/// several indexes, and a clone is a reference count, not an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name`, or a bare name in `default`.
    pub fn parse(s: &str) -> Self {
        match s.split_once('/') {
            Some((ns, name)) => Self::new(ns, name),
            None => Self::new("default", s),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label that hands a Service to a non-default proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The Node label with the node's zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
