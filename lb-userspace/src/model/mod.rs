//! Kubernetes objects as socklb uses them: parsed from the API or from YAML, validated once, and
//! turned into plain Rust types (addresses parsed, ports ranged, enums instead of strings).
//! Everything downstream (translation, explain) works on these types only; the model knows
//! nothing of maps.
//!
//! Validation never panics and never loses an object silently: a rejected object is a
//! `ValidationError` naming the object (`ObjectRef`) and the field. The `Store` indexes what
//! validated.
mod intern;
mod manifest;
mod service;
mod slice;
mod store;
mod validate;

pub use manifest::{
    ManifestError, ManifestObject, NodeObject, Parsed, TAINT_TO_BE_DELETED, node_from_api,
    parse_manifests,
};
pub use service::{
    LbIngress, Selector, Service, ServicePort, ServiceType, TargetPort, TrafficPolicy,
    service_from_api,
};
pub use slice::{
    AddressType, Endpoint, EndpointPort, EndpointSlice, Hints, TargetRef, TargetView,
    slice_from_api,
};
pub use store::Store;
pub use validate::{Cidr, ValidationError, parse_ip_sloppy};

pub use crate::vocab::ObjectKey;

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label that hands a Service to a non-default proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The label kube-proxy's informers use to leave headless Services (and their slices) out.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The Node label with the node's zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
