//! A folder of YAML manifests as the source of truth, for running without a cluster. The folder
//! is polled; any change re-reads it and sends complete listings, so adds, edits and deletions
//! all follow. A document that fails to parse or validate keeps the object's last good version
//! (the agent's store holds it; the listing names the objects to keep).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use tokio::sync::mpsc;

use super::{Kind, Object, SourceEvent};
use crate::model::{ManifestObject, NodeObject, ObjectKey, parse_manifests};

/// Everything read from the folder at one moment.
#[derive(Debug, Default)]
pub struct FolderContents {
    pub services: Vec<Object>,
    pub slices: Vec<Object>,
    pub nodes: Vec<NodeObject>,
    /// (object, message) for every document or object that could not be used.
    pub errors: Vec<(Option<String>, String)>,
}

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// The manifest files under `dir` (recursively), sorted.
fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if is_manifest(&path) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A cheap change detector: each file's path, size and modification time.
fn fingerprint(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64, Option<SystemTime>)>> {
    manifest_files(dir)?
        .into_iter()
        .map(|p| {
            let meta = fs::metadata(&p)?;
            Ok((p, meta.len(), meta.modified().ok()))
        })
        .collect()
}

fn object_label(object: &Object) -> String {
    match object {
        Object::Service(s) => format!("Service {}", s.key),
        Object::EndpointSlice(s) => format!("EndpointSlice {}", s.key),
    }
}

/// Reads and validates every manifest under `dir`.
pub fn read_folder(dir: &Path) -> std::io::Result<FolderContents> {
    let mut contents = FolderContents::default();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for path in manifest_files(dir)? {
        let bytes = fs::read(&path)?;
        let location = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        let parsed = parse_manifests(&location, &bytes);
        for e in parsed.errors {
            contents.errors.push((e.object.clone(), e.to_string()));
        }
        for object in parsed.objects {
            let object = match object {
                ManifestObject::Service(s) => Object::Service(s),
                ManifestObject::EndpointSlice(s) => Object::EndpointSlice(s),
                ManifestObject::Node(n) => {
                    contents.nodes.push(n);
                    continue;
                }
            };
            let label = object_label(&object);
            if let Some(first) = seen.get(&label) {
                contents.errors.push((
                    Some(label.clone()),
                    format!(
                        "{location}: {label} is also defined in {}; that one is used",
                        first.display()
                    ),
                ));
                continue;
            }
            seen.insert(label, path.clone());
            match object {
                o @ Object::Service(_) => contents.services.push(o),
                o @ Object::EndpointSlice(_) => contents.slices.push(o),
            }
        }
    }
    Ok(contents)
}

/// Polls `dir` every `interval` and sends listings whenever it changed. Runs on its own thread
/// until the receiver is gone.
pub fn watch(
    dir: &Path,
    node_name: Option<&str>,
    interval: Duration,
    tx: &mpsc::Sender<SourceEvent>,
) {
    let mut last = None;
    loop {
        let fp = fingerprint(dir).map_err(|e| e.to_string());
        if last.as_ref() != Some(&fp) {
            let events = match read_folder(dir) {
                Ok(contents) => listing(contents, node_name),
                Err(e) => vec![SourceEvent::Rejected {
                    object: None,
                    message: format!("reading {}: {e}", dir.display()),
                }],
            };
            last = Some(fp);
            for event in events {
                if tx.blocking_send(event).is_err() {
                    return;
                }
            }
        }
        std::thread::sleep(interval);
    }
}

/// Turns a folder read into events, keeping the last good version of rejected objects.
fn listing(contents: FolderContents, node_name: Option<&str>) -> Vec<SourceEvent> {
    let mut events = Vec::new();
    if let Some(node) = contents
        .nodes
        .into_iter()
        .find(|n| Some(n.name.as_str()) == node_name)
    {
        events.push(SourceEvent::Node(node));
    }
    let services = contents.services;
    let slices = contents.slices;
    let present: BTreeSet<String> = services.iter().chain(&slices).map(object_label).collect();
    // A rejected object that is not also present in good form keeps its last good version,
    // which the agent's store still holds.
    let (mut keep_services, mut keep_slices) = (Vec::new(), Vec::new());
    for (object, message) in contents.errors {
        if let Some(label) = &object
            && !present.contains(label)
        {
            match label.split_once(' ') {
                Some(("Service", key)) => keep_services.push(ObjectKey::parse(key)),
                Some(("EndpointSlice", key)) => keep_slices.push(ObjectKey::parse(key)),
                _ => {}
            }
        }
        events.push(SourceEvent::Rejected { object, message });
    }
    events.push(SourceEvent::Listed {
        kind: Kind::Service,
        objects: services,
        resource_version: None,
        keep: keep_services,
    });
    events.push(SourceEvent::Listed {
        kind: Kind::EndpointSlice,
        objects: slices,
        resource_version: None,
        keep: keep_slices,
    });
    events
}
