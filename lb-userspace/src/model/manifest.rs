//! Multi-document YAML manifests (Services, EndpointSlices, Nodes, and `List`s of them) parsed
//! into validated objects. A bad document is reported with its file, document number, object and
//! field, and never stops the others from loading.
use std::{fmt, net::IpAddr};

use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::{EndpointSlice, LABEL_TOPOLOGY_ZONE, Service, service_from_api, slice_from_api};
use crate::vocab::{Kind, ObjectKey, ObjectRef};

/// A Node, as far as socklb cares: its name, zone and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeObject {
    pub name: String,
    pub zone: Option<String>,
    pub addresses: Vec<IpAddr>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ManifestObject {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(NodeObject),
}

/// One document (or one item of a List) that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// `file.yaml`, `file.yaml#2` (second document), `file.yaml#2.items[3]`.
    pub location: String,
    /// The object, when the document got that far.
    pub object: Option<ObjectRef>,
    /// The offending field, e.g. `spec.ports[0].port`.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.location)?;
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The objects and errors found in one manifest file's bytes.
#[derive(Debug, Default)]
pub struct Parsed {
    pub objects: Vec<ManifestObject>,
    pub errors: Vec<ManifestError>,
}

/// Parses one file's contents. `location` names the file in errors.
pub fn parse_manifests(location: &str, bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            parsed.errors.push(ManifestError {
                location: location.to_string(),
                object: None,
                field: None,
                message: format!("not UTF-8 (invalid byte at offset {})", e.valid_up_to()),
            });
            return parsed;
        }
    };
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let here = format!("{location}#{}", i + 1);
        match serde::Deserialize::deserialize(document) {
            Ok(Value::Null) => {}
            Ok(value) => parse_value(&here, value, &mut parsed),
            Err(e) => {
                parsed.errors.push(ManifestError {
                    location: here,
                    object: None,
                    field: None,
                    message: format!("invalid YAML: {e}"),
                });
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        }
    }
    parsed
}

fn parse_value(location: &str, value: Value, parsed: &mut Parsed) {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let object = object_ref(&kind, &value);
    let error = |field: Option<String>, message: String| ManifestError {
        location: location.to_string(),
        object: object.clone(),
        field,
        message,
    };
    match (api_version, kind.as_str()) {
        ("v1", "Service") => match typed::<core::Service>(value) {
            Ok(svc) => match service_from_api(&svc) {
                Ok(svc) => parsed.objects.push(ManifestObject::Service(Box::new(svc))),
                Err(e) => parsed.errors.push(ManifestError {
                    object: Some(e.object),
                    ..error(Some(e.field), e.message)
                }),
            },
            Err((field, message)) => parsed.errors.push(error(field, message)),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            match typed::<discovery::EndpointSlice>(value) {
                Ok(slice) => match slice_from_api(&slice) {
                    Ok(slice) => parsed
                        .objects
                        .push(ManifestObject::EndpointSlice(Box::new(slice))),
                    Err(e) => parsed.errors.push(ManifestError {
                        object: Some(e.object),
                        ..error(Some(e.field), e.message)
                    }),
                },
                Err((field, message)) => parsed.errors.push(error(field, message)),
            }
        }
        ("v1", "Node") => match typed::<core::Node>(value) {
            Ok(node) => parsed
                .objects
                .push(ManifestObject::Node(node_from_api(&node))),
            Err((field, message)) => parsed.errors.push(error(field, message)),
        },
        (_, "List" | "ServiceList" | "EndpointSliceList") => {
            if let Some(Value::Sequence(items)) = value.get("items").cloned() {
                for (j, item) in items.into_iter().enumerate() {
                    parse_value(&format!("{location}.items[{j}]"), item, parsed);
                }
            }
        }
        ("", _) | (_, "") => parsed.errors.push(ManifestError {
            location: location.to_string(),
            object: None,
            field: Some(
                if kind.is_empty() {
                    "kind"
                } else {
                    "apiVersion"
                }
                .into(),
            ),
            message: "missing: not a Kubernetes object".into(),
        }),
        // Deployments, Pods and the like may share a file with Services: not ours to read.
        _ => {}
    }
}

/// Deserializes into the API type, reporting the path of the field that did not fit.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, (Option<String>, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != ".").then_some(path);
        (field, e.into_inner().to_string())
    })
}

/// The object a document describes, when it is one of the kinds socklb reads.
fn object_ref(kind: &str, value: &Value) -> Option<ObjectRef> {
    let kind = match kind {
        "Service" => Kind::Service,
        "EndpointSlice" => Kind::EndpointSlice,
        "Node" => Kind::Node,
        _ => return None,
    };
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let namespace = match kind {
        Kind::Node => "",
        _ => meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or("default"),
    };
    Some(ObjectRef::new(kind, ObjectKey::new(namespace, name)))
}

pub fn node_from_api(node: &core::Node) -> NodeObject {
    NodeObject {
        name: node.metadata.name.clone().unwrap_or_default(),
        zone: node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .cloned(),
        addresses: node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect(),
    }
}
