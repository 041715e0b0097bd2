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

use super::{Object, SourceEvent, Subject};
use crate::{
    model::{ManifestError, ManifestObject, NodeObject, parse_manifests},
    vocab::{Kind, ObjectRef},
};

/// Everything read from the folder at one moment.
#[derive(Debug, Default)]
pub struct FolderContents {
    pub services: Vec<Object>,
    pub slices: Vec<Object>,
    pub nodes: Vec<NodeObject>,
    /// Every document or object that could not be used.
    pub errors: Vec<ManifestError>,
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

/// Reads and validates every manifest under `dir`.
pub fn read_folder(dir: &Path) -> std::io::Result<FolderContents> {
    let mut contents = FolderContents::default();
    let mut seen: BTreeMap<ObjectRef, PathBuf> = BTreeMap::new();
    for path in manifest_files(dir)? {
        let bytes = fs::read(&path)?;
        let location = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        let parsed = parse_manifests(&location, &bytes);
        contents.errors.extend(parsed.errors);
        for object in parsed.objects {
            let object = match object {
                ManifestObject::Service(s) => Object::Service(s),
                ManifestObject::EndpointSlice(s) => Object::EndpointSlice(s),
                ManifestObject::Node(n) => {
                    contents.nodes.push(n);
                    continue;
                }
            };
            let label = object.object_ref();
            if let Some(first) = seen.get(&label) {
                contents.errors.push(ManifestError {
                    location: location.clone(),
                    object: Some(label.clone()),
                    field: None,
                    message: format!("also defined in {}; that one is used", first.display()),
                });
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
pub fn watch(dir: &Path, node_name: Option<&str>, tx: &mpsc::Sender<SourceEvent>) {
    let interval = Duration::from_millis(200);
    let mut last = None;
    loop {
        let fp = fingerprint(dir).map_err(|e| e.to_string());
        if last.as_ref() != Some(&fp) {
            let events = match read_folder(dir) {
                Ok(contents) => listing(contents, node_name),
                Err(e) => vec![SourceEvent::Rejected {
                    subject: Subject::File(dir.to_path_buf()),
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
    let present: BTreeSet<ObjectRef> = services
        .iter()
        .chain(&slices)
        .map(Object::object_ref)
        .collect();
    // A rejected object that is not also present in good form keeps its last good version,
    // which the agent's store still holds.
    let (mut keep_services, mut keep_slices) = (Vec::new(), Vec::new());
    for error in contents.errors {
        if let Some(object) = &error.object
            && !present.contains(object)
        {
            match object.kind {
                Kind::Service => keep_services.push(object.key.clone()),
                Kind::EndpointSlice => keep_slices.push(object.key.clone()),
                Kind::Node => {}
            }
        }
        let subject = error.object.clone().map_or_else(
            || Subject::File(PathBuf::from(&error.location)),
            Subject::Object,
        );
        events.push(SourceEvent::Rejected {
            subject,
            message: error.to_string(),
        });
    }
    events.push(SourceEvent::Listed {
        kind: Kind::Service,
        objects: services,
        keep: keep_services,
    });
    events.push(SourceEvent::Listed {
        kind: Kind::EndpointSlice,
        objects: slices,
        keep: keep_slices,
    });
    events
}
