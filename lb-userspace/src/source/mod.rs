//! Where Services and EndpointSlices come from: the Kubernetes API (watchers) or a folder of
//! YAML manifests. Both speak the same events to the agent.
pub mod files;
pub mod kube;

use std::{fmt, path::PathBuf};

use crate::{
    model::{EndpointSlice, NodeObject, Service, Store},
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

/// What a rejection is about: an object, or a manifest file that could not be read whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    Object(ObjectRef),
    File(PathBuf),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Object(o) => o.fmt(f),
            Self::File(p) => write!(f, "file {}", p.display()),
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

/// A store holding these objects (for one-shot readers such as `explain`).
pub fn store_of(objects: impl IntoIterator<Item = Object>) -> Store {
    let mut store = Store::new();
    for object in objects {
        match object {
            Object::Service(s) => {
                store.upsert_service(*s);
            }
            Object::EndpointSlice(s) => {
                store.upsert_slice(*s);
            }
        }
    }
    store
}
