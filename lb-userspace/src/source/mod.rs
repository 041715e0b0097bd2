//! Where Services and EndpointSlices come from: the Kubernetes API (watchers, `kube`) or a
//! folder of YAML manifests (`files`). Both speak the same events to the agent, beside this
//! node's interface addresses and listening sockets (`addresses`).
pub mod addresses;
pub mod files;
pub mod kube;

pub use crate::vocab::Subject;
use crate::{
    model::{EndpointSlice, ManifestObject, NodeObject, Service, Store},
    vocab::{Kind, ObjectKey, ObjectRef},
};

#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
}

impl Object {
    pub fn object_ref(&self) -> ObjectRef {
        match self {
            Self::Service(s) => ObjectRef::service(s.key.clone()),
            Self::EndpointSlice(s) => ObjectRef::slice(s.key.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum SourceEvent {
    /// A complete listing of one kind: it replaces everything known of that kind (initial list,
    /// re-list after the watch expired, a manifest folder reload). Until both kinds have been
    /// listed once, the agent writes nothing.
    Listed {
        kind: Kind,
        objects: Vec<Object>,
        /// Objects missing from `objects` that must not be removed: they were rejected, or their
        /// file could not be read, and their last good version stays in effect.
        keep: Vec<ObjectKey>,
    },
    Applied(Object),
    Deleted(Kind, ObjectKey),
    /// This node's Node object (zone label, addresses).
    Node(NodeObject),
    /// This node's Node object is gone: deleted, or missing from a complete listing. What was
    /// last seen of it stays in effect (zone, addresses), as in kube-proxy until it exits; load
    /// balancers are told to drain the node (kube-proxy's `/healthz`).
    NodeDeleted,
    /// The addresses on this node's interfaces (its host network namespace) now: none of them
    /// is a frontend but as a NodePort (a node-local DNS cache binds the DNS ClusterIP there).
    LocalAddresses(Vec<std::net::IpAddr>),
    /// The sockets listening on this node (see `translate::NodeInfo::listeners`).
    LocalListeners(Vec<crate::vocab::Listener>),
    /// Something could not be used; the previous version of what it names stays in effect.
    Rejected {
        subject: Subject,
        message: String,
    },
    /// A subject reported before is fine again.
    Fixed(Subject),
    /// Whether the source can reach what it watches (readiness).
    Health {
        kind: Kind,
        ok: bool,
    },
}

impl From<Object> for ManifestObject {
    fn from(object: Object) -> Self {
        match object {
            Object::Service(s) => Self::Service(s),
            Object::EndpointSlice(s) => Self::EndpointSlice(s),
        }
    }
}

/// A store holding these objects (for one-shot readers such as `explain`).
pub fn store_of(objects: impl IntoIterator<Item = Object>) -> Store {
    objects.into_iter().map(ManifestObject::from).collect()
}
