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

/// `metadata.resourceVersion`. Opaque to clients, but the API server writes a decimal integer:
/// kept as one, without an allocation (the agent holds one per Service and per EndpointSlice of
/// the cluster); anything else (none, a leading zero, a manifest's text) is kept as written, an
/// empty one without an allocation either. As large as the boxed text it replaces. Made only from
/// its text, so two are equal exactly when their texts are; shown as its text, `Debug` included.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct ResourceVersion(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Number(u64),
    Text(Box<str>),
}

impl Default for Repr {
    fn default() -> Self {
        Self::Text(Box::default())
    }
}

impl From<&str> for ResourceVersion {
    fn from(s: &str) -> Self {
        Self(match s.parse::<u64>() {
            // Only where the number reads back as the same text.
            Ok(n) if !s.starts_with(['0', '+']) || s == "0" => Repr::Number(n),
            _ => Repr::Text(s.into()),
        })
    }
}

impl std::fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Repr::Number(n) => n.fmt(f),
            Repr::Text(t) => f.write_str(t),
        }
    }
}

impl std::fmt::Debug for ResourceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.to_string(), f)
    }
}

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label that hands a Service to a non-default proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The label kube-proxy's informers use to leave headless Services (and their slices) out.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The Node label with the node's zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";

#[cfg(test)]
mod tests {
    use super::{Repr, ResourceVersion};

    /// Every resourceVersion reads back as written; the API server's decimal ones take no
    /// allocation, and the field is no larger than the boxed text it replaces.
    #[test]
    fn a_resource_version_reads_back_as_written() {
        for text in [
            "",
            "0",
            "1",
            "123456789",
            "18446744073709551615",
            "007",
            "+5",
            "abc",
            "1.5",
        ] {
            assert_eq!(ResourceVersion::from(text).to_string(), text);
        }
        assert!(matches!(
            ResourceVersion::from("4711").0,
            Repr::Number(4711)
        ));
        assert!(matches!(ResourceVersion::from("").0, Repr::Text(t) if t.is_empty()));
        for text in ["18446744073709551616", "007", "+5"] {
            assert!(matches!(&ResourceVersion::from(text).0, Repr::Text(t) if &**t == text));
        }
        // Equal exactly when the texts are, whichever way each is kept.
        assert_eq!(ResourceVersion::from("5"), ResourceVersion::from("5"));
        assert_ne!(ResourceVersion::from("5"), ResourceVersion::from("05"));
        assert_eq!(ResourceVersion::default(), ResourceVersion::from(""));
        assert_eq!(format!("{:?}", ResourceVersion::from("3")), "\"3\"");
        assert_eq!(size_of::<ResourceVersion>(), size_of::<Box<str>>());
    }
}
