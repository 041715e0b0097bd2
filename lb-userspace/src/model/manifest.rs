//! Multi-document YAML manifests (Services, EndpointSlices, Nodes, and `List`s of them) parsed
//! into validated objects. A bad document is reported with its file, document number, object and
//! field, and never stops the others from loading.
//!
//! The file is cut into documents at its `---` and `...` marker lines first (YAML forbids those
//! lines inside a document's content, so the cut is exact), and each document is parsed on its
//! own: a syntax error (an operator's half-finished edit) loses only its own document, and the
//! documents before and after it still load. The broken document is named when its `kind` and
//! `metadata` still parse, so its last good version can be kept by name.
use std::{fmt, net::IpAddr};

use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{EndpointSlice, LABEL_TOPOLOGY_ZONE, Service, service_from_api, slice_from_api};
use crate::vocab::{Kind, ObjectKey, ObjectRef};

/// A Node, as far as socklb cares: its name, zone and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeObject {
    pub name: String,
    pub zone: Option<String>,
    /// `status.addresses` of type `InternalIP`, in order.
    pub internal_ips: Vec<IpAddr>,
    /// `status.addresses` of type `ExternalIP`, in order.
    pub external_ips: Vec<IpAddr>,
    /// Being deleted (`metadata.deletionTimestamp`), or tainted
    /// `ToBeDeletedByClusterAutoscaler`: load balancers should drain it (kube-proxy's
    /// `/healthz` answers 503).
    pub leaving: bool,
}

/// The cluster autoscaler's taint on a node it is about to remove.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

impl NodeObject {
    /// Every `InternalIP`, then every `ExternalIP` (kube-proxy's `GetNodeHostIPs` order).
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.internal_ips.iter().chain(&self.external_ips).copied()
    }

    /// The node's primary address of each family: the first of `addresses` of that family
    /// (`--nodeport-addresses primary`).
    pub fn primary(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for ip in self.addresses() {
            if !out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
                out.push(ip);
            }
        }
        out
    }
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
    /// Numbers of the documents that are not valid YAML (or the whole file, as document 0, when
    /// it is not UTF-8): what they held is unknown, so their objects' last good versions stay.
    pub unreadable: Vec<usize>,
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
            parsed.unreadable.push(0);
            return parsed;
        }
    };
    let documents = documents(text);
    let workers = if text.len() < PARALLEL_FROM_BYTES {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS))
    };
    if workers <= 1 || documents.len() < 2 {
        parse_documents(location, &documents, &mut parsed);
        return parsed;
    }
    // A big file: its documents are independent, so groups of them are parsed side by side
    // (YAML parsing is most of the cost), then put back in order.
    let parts: Vec<Parsed> = std::thread::scope(|scope| {
        let handles: Vec<_> = documents
            .chunks(documents.len().div_ceil(workers))
            .map(|group| {
                let parse = move || {
                    let mut part = Parsed::default();
                    parse_documents(location, group, &mut part);
                    part
                };
                std::thread::Builder::new()
                    .name("manifest-parse".into())
                    .spawn_scoped(scope, parse)
                    .map_err(|_| group)
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                // No thread to be had: parse this group here.
                Err(group) => {
                    let mut part = Parsed::default();
                    parse_documents(location, group, &mut part);
                    part
                }
            })
            .collect()
    });
    for part in parts {
        parsed.objects.extend(part.objects);
        parsed.errors.extend(part.errors);
        parsed.unreadable.extend(part.unreadable);
    }
    parsed
}

/// Files at least this big are parsed on several threads.
const PARALLEL_FROM_BYTES: usize = 1 << 20;
const MAX_WORKERS: usize = 4;

fn parse_documents(location: &str, documents: &[Document<'_>], parsed: &mut Parsed) {
    for document in documents {
        let here = format!("{location}#{}", document.number);
        match parse_yaml(document.text) {
            Ok(values) => {
                for value in values {
                    if !value.is_null() {
                        parse_value(&here, value, parsed);
                    }
                }
            }
            Err(e) => {
                parsed.errors.push(ManifestError {
                    location: here,
                    object: name_broken_document(document.text),
                    field: None,
                    message: format!(
                        "invalid YAML (document starting at line {}): {}",
                        document.first_line,
                        render_yaml_error(&e, document.first_line - 1)
                    ),
                });
                parsed.unreadable.push(document.number);
            }
        }
    }
}

/// One document of a multi-document YAML file, as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Document<'a> {
    /// 1-based, counting empty documents (as YAML parsers do).
    number: usize,
    /// 1-based line of the file where the document's text starts.
    first_line: usize,
    text: &'a str,
}

/// A `---` or `...` marker line: the marker at column 0, then nothing or whitespace.
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// Cuts a YAML stream into its documents at the marker lines. Comments, blank lines and
/// directives before a `---` belong to the document it starts; `...` ends a document.
fn documents(text: &str) -> Vec<Document<'_>> {
    let body = text.strip_prefix('\u{feff}').unwrap_or(text);
    let bom = text.len() - body.len();
    let mut out = Vec::new();
    let (mut start, mut start_line, mut has_content) = (bom, 1, false);
    let (mut offset, mut line_no) = (bom, 1);
    let mut close = |from: usize, to: usize, first_line: usize| {
        out.push(Document {
            number: out.len() + 1,
            first_line,
            text: &text[from..to],
        });
    };
    for line in body.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            if has_content {
                close(start, offset, start_line);
                (start, start_line) = (offset, line_no);
            }
            has_content = true;
        } else if is_marker(bare, "...") {
            if has_content {
                close(start, offset + line.len(), start_line);
            }
            (start, start_line, has_content) = (offset + line.len(), line_no + 1, false);
        } else if !has_content {
            let trimmed = bare.trim_start();
            has_content =
                !(trimmed.is_empty() || trimmed.starts_with('#') || bare.starts_with('%'));
        }
        offset += line.len();
        line_no += 1;
    }
    if has_content {
        close(start, text.len(), start_line);
    }
    out
}

/// Parsing options: no error snippets (the message names the line), duplicate keys are errors,
/// and the default budget against alias bombs and deep nesting.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    }
}

/// The values of one document's text (none when it is empty).
fn parse_yaml(text: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    serde_saphyr::from_multiple_with_options(text, yaml_options())
}

/// A parser error as one line, its line numbers counted from the start of the file.
fn render_yaml_error(error: &serde_saphyr::Error, line_offset: usize) -> String {
    let mut options = serde_saphyr::RenderOptions::default();
    options.snippets = serde_saphyr::SnippetMode::Off;
    options.line_offset = line_offset as u64;
    error
        .render_with_options(options)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The object a document that is not valid YAML was meant to be, when its top-level `kind` and
/// `metadata` parse on their own (the syntax error is elsewhere, say in `spec`).
fn name_broken_document(text: &str) -> Option<ObjectRef> {
    let mut kept = String::new();
    let mut keeping = false;
    for line in text.lines() {
        let top_level = line
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '#');
        if top_level {
            keeping = line.starts_with("kind:") || line.starts_with("metadata:");
        }
        if keeping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let value: Value = serde_saphyr::from_str_with_options(&kept, yaml_options()).ok()?;
    let kind = value.get("kind")?.as_str()?;
    value.get("metadata")?.get("name")?.as_str()?;
    object_ref(kind, &value)
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
            if let Value::Object(mut list) = value
                && let Some(Value::Array(items)) = list.remove("items")
            {
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
        internal_ips: addresses_of(node, "InternalIP"),
        external_ips: addresses_of(node, "ExternalIP"),
        leaving: node.metadata.deletion_timestamp.is_some()
            || node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == TAINT_TO_BE_DELETED)),
    }
}

fn addresses_of(node: &core::Node, kind: &str) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == kind)
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::documents;

    fn cut(text: &str) -> Vec<(usize, usize, &str)> {
        documents(text)
            .iter()
            .map(|d| (d.number, d.first_line, d.text))
            .collect()
    }

    #[test]
    fn documents_are_cut_at_marker_lines_only() {
        let text =
            "# c\n---\na: 1\n--- # x\nb: |\n  --- indented\n...\n%YAML 1.2\n---\nc: 3\n----\n";
        assert_eq!(
            cut(text),
            [
                (1, 1, "# c\n---\na: 1\n"),
                (2, 4, "--- # x\nb: |\n  --- indented\n...\n"),
                (3, 8, "%YAML 1.2\n---\nc: 3\n----\n"),
            ]
        );
        assert_eq!(cut(""), []);
        assert_eq!(cut("# only a comment\n\n"), []);
        assert_eq!(cut("---\n---\na\n"), [(1, 1, "---\n"), (2, 2, "---\na\n")]);
        assert_eq!(cut("a\r\n---\r\nb"), [(1, 1, "a\r\n"), (2, 2, "---\r\nb")]);
    }
}
