//! Where Services and EndpointSlices come from: the Kubernetes API (watchers) or a folder of
//! YAML manifests. Both speak the same events to the agent.
pub mod files;
pub mod kube;

use crate::model::{EndpointSlice, NodeObject, ObjectKey, Service};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Service,
    EndpointSlice,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum SourceEvent {
    /// A complete listing of one kind: it replaces everything known of that kind (initial list,
    /// re-list after the watch expired, a manifest folder reload). Until both kinds have been
    /// listed once, the agent writes nothing.
    Listed {
        kind: Kind,
        objects: Vec<Object>,
        resource_version: Option<String>,
        /// Objects missing from `objects` that must not be removed: they were rejected and
        /// their last good version stays in effect.
        keep: Vec<ObjectKey>,
    },
    Applied(Object),
    Deleted(Kind, ObjectKey),
    /// This node's Node object (zone label, addresses).
    Node(NodeObject),
    /// An object that could not be used; it names the object and the field. The previous
    /// version of that object, if any, stays in effect.
    Rejected {
        object: Option<String>,
        message: String,
    },
}
