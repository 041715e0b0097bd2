//! A folder of YAML manifests as the source of truth, for running without a cluster.
//!
//! **What is read**: every `*.yaml`, `*.yml` and `*.json` file under the folder, recursively.
//! Names starting with `.` are skipped (editors' swap files, a `ConfigMap` volume's `..data`
//! internals). Symlinks: a symlink to a file is followed (a `ConfigMap` volume is made of them);
//! a symlink to a folder is never descended into (no loops, no folder read twice). The folder
//! itself may be a symlink. A file bigger than the cap (`--max-manifest-bytes`, 16 MiB by
//! default), or that is not a regular file, or cannot be read, is rejected by name.
//!
//! **When**: inotify watches on the folder and every subfolder; a burst of events is left to
//! settle (20 ms without one) and then the whole folder is read again. Changes are seen by
//! content (a SHA-256 of each file's bytes), not by size and modification time: a `touch` sends
//! nothing, an edit that keeps both is still seen. A slow safety read (every 10 s) covers lost
//! events and files that symlinks point at outside the folder, which inotify does not see change.
//!
//! **Never losing what worked**: each YAML document is parsed on its own (see
//! `model::manifest`), so a syntax error loses only its own document. While part of a file
//! cannot be read (a document that is not valid YAML, the file over the cap, unreadable), every
//! object the file held at its last good read keeps its last good version: the listing names them
//! in `keep`, and the agent's store still holds them. An object rejected by validation keeps its
//! last good version too. Every problem is reported (`Rejected`, naming the file and document,
//! and the object when known) on each read that finds it, and `Fixed` once it is gone.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Read as _,
    mem::MaybeUninit,
    ops::Range,
    os::{fd::OwnedFd, unix::fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rustix::fs::inotify;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use super::{Object, SourceEvent, Subject};
use crate::{
    model::{ManifestError, ManifestObject, NodeObject, parse_manifests},
    vocab::{Kind, ObjectRef},
};

/// The default cap on one manifest file's size.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// How the folder is read and watched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// A bigger file is rejected (and its last good objects kept).
    pub max_file_bytes: u64,
    /// After an event, wait this long without another before reading.
    pub debounce: Duration,
    /// ... but never longer than this after the first event of a burst.
    pub max_delay: Duration,
    /// Read the folder this often even without events.
    pub safety_poll: Duration,
    /// Without inotify (no instance left), read the folder this often.
    pub fallback_poll: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            debounce: Duration::from_millis(20),
            max_delay: Duration::from_secs(1),
            safety_poll: Duration::from_secs(10),
            fallback_poll: Duration::from_secs(1),
        }
    }
}

/// Everything read from the folder at one moment.
#[derive(Debug, Default)]
pub struct FolderContents {
    pub services: Vec<Object>,
    pub slices: Vec<Object>,
    pub nodes: Vec<NodeObject>,
    /// Every document, object, file or subfolder that could not be used.
    pub errors: Vec<ManifestError>,
    /// What each file (and each unreadable subfolder) contributed.
    pub files: Vec<FileSummary>,
}

/// One file's (or unreadable subfolder's) part of a folder read.
#[derive(Debug, Default)]
pub struct FileSummary {
    pub path: PathBuf,
    /// The Services and EndpointSlices it defines that are in use.
    pub objects: BTreeSet<ObjectRef>,
    /// Part of it could not be read: a document that is not YAML, over the cap, unreadable (or
    /// a subfolder that could not be listed). What it held before stays in effect.
    pub incomplete: bool,
    /// A subfolder that could not be listed (rather than a file).
    pub folder: bool,
    /// Its entries in `FolderContents::errors`.
    pub errors: Range<usize>,
}

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b".")
}

/// The manifest files and folders under the root, by the policy in the module doc.
#[derive(Debug, Default)]
struct Scan {
    /// Sorted.
    files: Vec<PathBuf>,
    /// The root and every subfolder (not through symlinks), to watch.
    dirs: Vec<PathBuf>,
    /// Subfolders that could not be listed, and why.
    unreadable_dirs: Vec<(PathBuf, String)>,
}

/// Lists the folder. Fails only when the root itself cannot be listed.
fn scan(dir: &Path) -> std::io::Result<Scan> {
    let mut scan = Scan::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if d == dir => return Err(e),
            Err(e) => {
                scan.unreadable_dirs.push((d, e.to_string()));
                continue;
            }
        };
        scan.dirs.push(d.clone());
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    scan.unreadable_dirs.push((d.clone(), e.to_string()));
                    break;
                }
            };
            if is_hidden(&entry.file_name()) {
                continue;
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                stack.push(path);
            } else if is_manifest(&path) && !path.is_dir() {
                // A regular file, or a symlink to one (a dangling one is reported when read);
                // a symlink to a folder is not descended into.
                scan.files.push(path);
            }
        }
    }
    scan.files.sort();
    scan.dirs.sort();
    Ok(scan)
}

/// One file's bytes, at most `max` of them; non-blocking open, so a FIFO cannot hang the read.
fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let too_big = |len: u64| {
        format!("{len} bytes, over the cap of {max} bytes (--max-manifest-bytes): not read")
    };
    if meta.len() > max {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The folder's files as read at one moment: each one's bytes, or why not.
#[derive(Debug, Default)]
struct Reading {
    files: Vec<(PathBuf, Result<Vec<u8>, String>)>,
    unreadable_dirs: Vec<(PathBuf, String)>,
}

impl Reading {
    fn of(scan: Scan, max_file_bytes: u64) -> Self {
        Self {
            files: scan
                .files
                .into_iter()
                .map(|p| {
                    let bytes = read_file(&p, max_file_bytes);
                    (p, bytes)
                })
                .collect(),
            unreadable_dirs: scan.unreadable_dirs,
        }
    }

    /// What a change is judged by: each file's content hash (or its problem).
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            files: self
                .files
                .iter()
                .map(|(p, r)| {
                    let hash = r
                        .as_ref()
                        .map(|b| Sha256::digest(b).into())
                        .map_err(Clone::clone);
                    (p.clone(), hash)
                })
                .collect(),
            unreadable_dirs: self.unreadable_dirs.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    files: BTreeMap<PathBuf, Result<[u8; 32], String>>,
    unreadable_dirs: Vec<(PathBuf, String)>,
}

fn relative(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).unwrap_or(path).display().to_string()
}

/// Parses and validates what was read.
fn contents(dir: &Path, reading: Reading) -> FolderContents {
    let mut contents = FolderContents::default();
    let mut seen: BTreeMap<ObjectRef, PathBuf> = BTreeMap::new();
    for (path, read) in reading.files {
        let location = relative(dir, &path);
        let mut summary = FileSummary {
            path: path.clone(),
            errors: contents.errors.len()..contents.errors.len(),
            ..FileSummary::default()
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(message) => {
                contents.errors.push(ManifestError {
                    location,
                    object: None,
                    field: None,
                    message,
                });
                summary.incomplete = true;
                summary.errors.end = contents.errors.len();
                contents.files.push(summary);
                continue;
            }
        };
        let parsed = parse_manifests(&location, &bytes);
        drop(bytes);
        summary.incomplete = !parsed.unreadable.is_empty();
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
                    message: format!("also defined in {}; that one is used", relative(dir, first)),
                });
                continue;
            }
            seen.insert(label.clone(), path.clone());
            summary.objects.insert(label);
            match object {
                o @ Object::Service(_) => contents.services.push(o),
                o @ Object::EndpointSlice(_) => contents.slices.push(o),
            }
        }
        summary.errors.end = contents.errors.len();
        contents.files.push(summary);
    }
    for (path, message) in reading.unreadable_dirs {
        let start = contents.errors.len();
        contents.errors.push(ManifestError {
            location: relative(dir, &path),
            object: None,
            field: None,
            message: format!("cannot list folder: {message}"),
        });
        contents.files.push(FileSummary {
            path,
            incomplete: true,
            folder: true,
            errors: start..contents.errors.len(),
            ..FileSummary::default()
        });
    }
    contents
}

/// Reads and validates every manifest under `dir` once (for one-shot readers like `explain`).
pub fn read_folder(dir: &Path) -> std::io::Result<FolderContents> {
    read_folder_with(dir, &Options::default())
}

/// `read_folder` with a size cap of choice.
pub fn read_folder_with(dir: &Path, options: &Options) -> std::io::Result<FolderContents> {
    let scan = scan(dir)?;
    Ok(contents(dir, Reading::of(scan, options.max_file_bytes)))
}

/// The folder as a source: reads it, notices what changed, and turns it into events while
/// remembering each file's last good objects and the problems it reported.
#[derive(Debug)]
pub struct Folder {
    dir: PathBuf,
    options: Options,
    last: Option<Result<Fingerprint, String>>,
    /// The Services and EndpointSlices each file held at its last read (kept ones included).
    held: BTreeMap<PathBuf, BTreeSet<ObjectRef>>,
    /// Subjects reported as rejected at the last read.
    reported: BTreeSet<Subject>,
}

impl Folder {
    pub fn new(dir: &Path, options: Options) -> Self {
        Self {
            dir: dir.to_path_buf(),
            options,
            last: None,
            held: BTreeMap::new(),
            reported: BTreeSet::new(),
        }
    }

    /// Reads the folder; the events when anything changed since the last read (always on the
    /// first), `None` when nothing did.
    pub fn read(&mut self, node_name: Option<&str>) -> Option<Vec<SourceEvent>> {
        self.read_watching(node_name, |_| false).0
    }

    /// `read`, calling `watch` on every folder before its files are read; also says whether
    /// `watch` saw a folder for the first time.
    fn read_watching(
        &mut self,
        node_name: Option<&str>,
        mut watch: impl FnMut(&Path) -> bool,
    ) -> (Option<Vec<SourceEvent>>, bool) {
        let scan = match scan(&self.dir) {
            Ok(scan) => scan,
            Err(e) => {
                let message = format!("cannot list the manifests folder: {e}");
                let unchanged = self.last.as_ref() == Some(&Err(message.clone()));
                self.last = Some(Err(message.clone()));
                if unchanged {
                    return (None, false);
                }
                // No listing: everything stays as it was.
                let subject = Subject::File(self.dir.clone());
                let mut events = self.fixed_except(&BTreeSet::from([subject.clone()]));
                self.reported = BTreeSet::from([subject.clone()]);
                events.push(SourceEvent::Rejected { subject, message });
                return (Some(events), false);
            }
        };
        let mut new_folder = false;
        for d in &scan.dirs {
            new_folder |= watch(d);
        }
        let reading = Reading::of(scan, self.options.max_file_bytes);
        let fingerprint = Ok(reading.fingerprint());
        if self.last.as_ref() == Some(&fingerprint) {
            return (None, new_folder);
        }
        self.last = Some(fingerprint);
        let contents = contents(&self.dir, reading);
        (Some(self.events(contents, node_name)), new_folder)
    }

    /// `Fixed` for every subject reported before that is not in `now`.
    fn fixed_except(&self, now: &BTreeSet<Subject>) -> Vec<SourceEvent> {
        self.reported
            .difference(now)
            .map(|s| SourceEvent::Fixed(s.clone()))
            .collect()
    }

    /// Turns a folder read into events, keeping the last good version of everything that could
    /// not be read.
    fn events(&mut self, contents: FolderContents, node_name: Option<&str>) -> Vec<SourceEvent> {
        let mut events = Vec::new();
        let complete = contents.files.iter().all(|f| !f.incomplete)
            && !contents
                .errors
                .iter()
                .any(|e| e.object.as_ref().is_some_and(|o| o.kind == Kind::Node));
        match contents
            .nodes
            .into_iter()
            .find(|n| Some(n.name.as_str()) == node_name)
        {
            Some(node) => events.push(SourceEvent::Node(node)),
            // A complete read without this node's Node: it was deleted (or never written).
            None if node_name.is_some() && complete => events.push(SourceEvent::NodeDeleted),
            None => {}
        }
        let present: BTreeSet<ObjectRef> = contents
            .services
            .iter()
            .chain(&contents.slices)
            .map(Object::object_ref)
            .collect();
        let mut rejected: BTreeMap<Subject, Vec<String>> = BTreeMap::new();
        let mut keep: BTreeSet<ObjectRef> = BTreeSet::new();
        let mut held = BTreeMap::new();
        for file in &contents.files {
            let errors = &contents.errors[file.errors.clone()];
            // Named rejects keep their last good version; so does everything the file held
            // while part of it cannot be read.
            let mut kept: BTreeSet<ObjectRef> = errors
                .iter()
                .filter_map(|e| e.object.clone())
                .filter(|o| o.kind != Kind::Node)
                .collect();
            if file.incomplete {
                for (path, objects) in &self.held {
                    let under = if file.folder {
                        path.starts_with(&file.path)
                    } else {
                        path == &file.path
                    };
                    if under {
                        kept.extend(objects.iter().cloned());
                    }
                }
            }
            kept.retain(|o| !present.contains(o));
            let mut now = file.objects.clone();
            now.extend(kept.iter().cloned());
            keep.extend(kept);
            if file.folder {
                // Carried over under the files' own paths, for when they are readable again.
                for (path, objects) in &self.held {
                    if path.starts_with(&file.path) {
                        let still: BTreeSet<ObjectRef> = objects
                            .iter()
                            .filter(|o| !present.contains(*o))
                            .cloned()
                            .collect();
                        held.insert(path.clone(), still);
                    }
                }
            } else {
                held.insert(file.path.clone(), now);
            }
            for error in errors {
                let subject = error
                    .object
                    .clone()
                    .map_or_else(|| Subject::File(file.path.clone()), Subject::Object);
                rejected.entry(subject).or_default().push(error.to_string());
            }
        }
        self.held = held;
        let (mut keep_services, mut keep_slices) = (Vec::new(), Vec::new());
        for object in keep {
            match object.kind {
                Kind::Service => keep_services.push(object.key),
                Kind::EndpointSlice => keep_slices.push(object.key),
                Kind::Node => {}
            }
        }
        events.push(SourceEvent::Listed {
            kind: Kind::Service,
            objects: contents.services,
            keep: keep_services,
        });
        events.push(SourceEvent::Listed {
            kind: Kind::EndpointSlice,
            objects: contents.slices,
            keep: keep_slices,
        });
        // After the listings, which clear the rejections of the objects they list.
        let now: BTreeSet<Subject> = rejected.keys().cloned().collect();
        events.extend(self.fixed_except(&now));
        self.reported = now;
        for (subject, messages) in rejected {
            events.push(SourceEvent::Rejected {
                subject,
                message: messages.join("; "),
            });
        }
        events
    }
}

const WATCH_MASK: inotify::WatchFlags = inotify::WatchFlags::CREATE
    .union(inotify::WatchFlags::DELETE)
    .union(inotify::WatchFlags::MODIFY)
    .union(inotify::WatchFlags::CLOSE_WRITE)
    .union(inotify::WatchFlags::MOVED_FROM)
    .union(inotify::WatchFlags::MOVED_TO)
    .union(inotify::WatchFlags::ATTRIB)
    .union(inotify::WatchFlags::DELETE_SELF)
    .union(inotify::WatchFlags::MOVE_SELF)
    .union(inotify::WatchFlags::ONLYDIR);

/// inotify watches on the folder tree.
struct Watcher {
    fd: OwnedFd,
    watched: BTreeSet<i32>,
}

impl Watcher {
    fn new() -> rustix::io::Result<Self> {
        Ok(Self {
            fd: inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?,
            watched: BTreeSet::new(),
        })
    }

    /// Watches `dir` (again: harmless); true when it was not watched before.
    fn add(&mut self, dir: &Path) -> bool {
        match inotify::add_watch(&self.fd, dir, WATCH_MASK) {
            Ok(wd) => self.watched.insert(wd),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch folder");
                false
            }
        }
    }

    /// Reads every queued event; true when there was one.
    fn drain(&mut self) -> bool {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        let mut any = false;
        while let Ok(event) = reader.next() {
            any = true;
            if event.events().contains(inotify::ReadFlags::IGNORED) {
                self.watched.remove(&event.wd());
            }
        }
        any
    }

    /// Waits until an event is queued or `timeout` passes; true on an event.
    fn wait(&self, timeout: Duration) -> bool {
        let timeout = rustix::event::Timespec::try_from(timeout).ok();
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        matches!(rustix::event::poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0)
    }

    /// Returns after a burst of events has settled, or after the safety interval.
    fn wait_for_change(&mut self, options: &Options) {
        if !self.wait(options.safety_poll) {
            return;
        }
        let start = Instant::now();
        self.drain();
        while start.elapsed() < options.max_delay && self.wait(options.debounce) {
            self.drain();
        }
    }
}

/// Watches `dir` with the default options (see `watch_with`).
pub fn watch(dir: &Path, node_name: Option<&str>, tx: &mpsc::Sender<SourceEvent>) {
    watch_with(dir, node_name, &Options::default(), tx);
}

/// Reads `dir` and sends listings whenever its content changed, on inotify events (settled)
/// and every `safety_poll`. Runs on its own thread until the receiver is gone.
pub fn watch_with(
    dir: &Path,
    node_name: Option<&str>,
    options: &Options,
    tx: &mpsc::Sender<SourceEvent>,
) {
    let mut folder = Folder::new(dir, options.clone());
    let mut watcher = match Watcher::new() {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "inotify unavailable: reading the manifests folder every {:?} instead",
                options.fallback_poll
            );
            None
        }
    };
    loop {
        let (events, new_folder) = match &mut watcher {
            Some(w) => folder.read_watching(node_name, |d| w.add(d)),
            None => (folder.read(node_name), false),
        };
        for event in events.into_iter().flatten() {
            if tx.blocking_send(event).is_err() {
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        if new_folder {
            // Files may have landed in a new folder before its watch: read once more.
            continue;
        }
        match &mut watcher {
            Some(w) => w.wait_for_change(options),
            None => std::thread::sleep(options.fallback_poll),
        }
    }
}
