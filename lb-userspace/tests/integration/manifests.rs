//! The manifests source: a syntax error loses only its own document and keeps the last good
//! version of what it held; the size cap; the symlink and hidden-file policy; changes seen by
//! content; problems reported until fixed; inotify picks edits up at once.
use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant, SystemTime},
};

use proptest::prelude::*;
use socklb::{
    model::{ManifestObject, parse_manifests},
    source::{
        Object, SourceEvent, Subject,
        files::{Folder, Options, read_folder_with, watch_with},
    },
    vocab::{Kind, ObjectKey, ObjectRef},
};

/// A scratch folder, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "socklb-manifests-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("parent");
        }
        std::fs::write(&path, text).expect("write");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterIP: {ip}\n  ports:\n  - name: http\n    port: 80\n"
    )
}

/// `service` with a syntax error in `spec` (an unclosed flow sequence); `kind` and `metadata`
/// still parse, so the document can be named.
fn broken_service(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterIP: 10.96.0.99\n  ports: [{{name: http, port: 80\n"
    )
}

fn svc(name: &str) -> ObjectRef {
    ObjectRef::service(ObjectKey::new("default", name))
}

fn three(middle: &str) -> String {
    format!(
        "{}---\n{middle}---\n{}",
        service("one", "10.96.0.1"),
        service("three", "10.96.0.3")
    )
}

fn names(objects: &[ManifestObject]) -> Vec<String> {
    objects
        .iter()
        .map(|o| match o {
            ManifestObject::Service(s) => s.key.name.to_string(),
            ManifestObject::EndpointSlice(s) => s.key.name.to_string(),
            ManifestObject::Node(n) => n.name.clone(),
        })
        .collect()
}

#[test]
fn a_syntax_error_in_the_second_of_three_documents_keeps_the_first_and_the_third() {
    let parsed = parse_manifests("f.yaml", three(&broken_service("two")).as_bytes());
    assert_eq!(names(&parsed.objects), ["one", "three"]);
    assert_eq!(parsed.unreadable, [2]);
    let [error] = parsed.errors.as_slice() else {
        panic!("{:?}", parsed.errors)
    };
    assert_eq!(error.location, "f.yaml#2");
    assert_eq!(
        error.object,
        Some(svc("two")),
        "named from kind and metadata"
    );
    assert!(error.message.starts_with("invalid YAML"), "{error}");
    // The second document starts at its `---` on line 11; the unclosed `{` is on line 19 of
    // the file.
    assert!(error.message.contains("starting at line 11"), "{error}");
    assert!(error.message.contains("line 19, column 11"), "{error}");
}

#[test]
fn a_broken_document_that_cannot_be_named_still_loses_only_itself() {
    let middle = "apiVersion: v1\nkind: Service\nmetadata: {name: two\nspec: {}\n";
    let parsed = parse_manifests("f.yaml", three(middle).as_bytes());
    assert_eq!(names(&parsed.objects), ["one", "three"]);
    assert_eq!(parsed.errors.len(), 1);
    assert_eq!(parsed.errors[0].object, None);
    // Bad indentation, a tab, an unknown alias: the same.
    for middle in [
        "kind: Service\n metadata:\n  name: x\n bad: [\n",
        "kind: Service\nmetadata:\n\tname: x\n",
        "kind: Service\nmetadata: *nowhere\n",
        "kind: Service\nkind: Service\n",
    ] {
        let parsed = parse_manifests("f.yaml", three(middle).as_bytes());
        assert_eq!(names(&parsed.objects), ["one", "three"], "{middle:?}");
        assert_eq!(parsed.unreadable, [2], "{middle:?}");
    }
}

#[test]
fn document_markers_directives_comments_and_line_endings() {
    // Comments before the first `---`, `...` ends, directives, CRLF, a BOM: numbering as YAML
    // counts documents.
    let text = format!(
        "\u{feff}# header comment\n---\n{}...\n%YAML 1.2\n---\n{}---\n---\n{}",
        service("a", "10.96.0.1"),
        service("b", "10.96.0.2"),
        service("c", "10.96.0.3").replace('\n', "\r\n"),
    );
    let parsed = parse_manifests("f.yaml", text.as_bytes());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    assert_eq!(names(&parsed.objects), ["a", "b", "c"]);
    // A broken fourth document is reported as #4 (the empty third counts).
    let text = format!(
        "{}---\n{}---\n---\nkind: [\n---\n{}",
        service("a", "10.96.0.1"),
        service("b", "10.96.0.2"),
        service("c", "10.96.0.3"),
    );
    let parsed = parse_manifests("f.yaml", text.as_bytes());
    assert_eq!(names(&parsed.objects), ["a", "b", "c"]);
    assert_eq!(parsed.errors[0].location, "f.yaml#4", "{:?}", parsed.errors);
    // JSON is YAML too.
    let parsed = parse_manifests(
        "f.json",
        br#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j"}, "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}}"#,
    );
    assert_eq!(names(&parsed.objects), ["j"]);
}

#[test]
fn a_big_file_of_many_documents_parses_whole_and_in_order() {
    // Over 1024 documents (a YAML parser's usual cap per stream) and over 1 MiB (parsed on
    // several threads), with broken documents here and there.
    let comment = format!("# {}\n", "x".repeat(700));
    let docs: Vec<String> = (0..1500)
        .map(|i| {
            if i % 500 == 250 {
                format!("{comment}kind: [\n")
            } else {
                format!("{comment}{}", service(&format!("s{i}"), "10.96.0.1"))
            }
        })
        .collect();
    let text = docs.join("---\n");
    assert!(text.len() > 1 << 20);
    let parsed = parse_manifests("big.yaml", text.as_bytes());
    let expected: Vec<String> = (0..1500)
        .filter(|i| i % 500 != 250)
        .map(|i| format!("s{i}"))
        .collect();
    assert_eq!(names(&parsed.objects), expected);
    assert_eq!(parsed.unreadable, [251, 751, 1251]);
    let locations: Vec<&str> = parsed.errors.iter().map(|e| e.location.as_str()).collect();
    assert_eq!(locations, ["big.yaml#251", "big.yaml#751", "big.yaml#1251"]);
}

#[test]
fn typed_errors_keep_their_field_path() {
    let text = service("bad", "10.96.0.1").replace("port: 80", "port: eighty");
    let parsed = parse_manifests("f.yaml", text.as_bytes());
    assert_eq!(parsed.errors.len(), 1);
    let e = &parsed.errors[0];
    assert_eq!(e.field.as_deref(), Some("spec.ports[0].port"), "{e}");
    assert_eq!(e.object, Some(svc("bad")));
    assert!(parsed.unreadable.is_empty(), "valid YAML, invalid object");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever an operator leaves half-typed in the middle document, the documents around it
    /// load. (Lines starting with `%` are directives of the *next* document in YAML: left out.)
    #[test]
    fn any_middle_document_leaves_the_others_alone(
        middle in prop_oneof![
            "[a-z:{}\\[\\],'\"#&*!|>@`%?\\- \t\n]{0,120}",
            any::<String>(),
        ]
    ) {
        let middle: String = middle
            .lines()
            .filter(|l| !l.starts_with('%'))
            .fold(String::new(), |mut s, l| { let _ = writeln!(s, "{l}"); s });
        let parsed = parse_manifests("f.yaml", three(&middle).as_bytes());
        let names = names(&parsed.objects);
        prop_assert_eq!(names.first().map(String::as_str), Some("one"));
        prop_assert_eq!(names.last().map(String::as_str), Some("three"));
    }
}

fn listed(events: &[SourceEvent], kind: Kind) -> (Vec<String>, Vec<String>) {
    events
        .iter()
        .find_map(|e| match e {
            SourceEvent::Listed {
                kind: k,
                objects,
                keep,
            } if *k == kind => Some((
                objects
                    .iter()
                    .map(|o| match o {
                        Object::Service(s) => s.key.name.to_string(),
                        Object::EndpointSlice(s) => s.key.name.to_string(),
                    })
                    .collect(),
                keep.iter().map(|k| k.name.to_string()).collect(),
            )),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {kind} listing in {events:?}"))
}

fn rejected(events: &[SourceEvent]) -> Vec<(Subject, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Rejected { subject, message } => Some((subject.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

fn fixed(events: &[SourceEvent]) -> BTreeSet<Subject> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Fixed(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_folder_keeps_a_broken_documents_last_good_version_and_reports_it_until_fixed() {
    let dir = TempDir::new();
    let good = format!(
        "{}---\n{}---\n{}",
        service("one", "10.96.0.1"),
        service("two", "10.96.0.2"),
        service("three", "10.96.0.3")
    );
    dir.write("svc.yaml", &good);
    let mut folder = Folder::new(&dir.0, Options::default());
    let events = folder.read(None).expect("first read");
    assert_eq!(listed(&events, Kind::Service).0, ["one", "two", "three"]);
    assert!(rejected(&events).is_empty());

    // A half-finished edit of `two`: one and three stay, two is kept, reported by name.
    dir.write("svc.yaml", &three(&broken_service("two")));
    let events = folder.read(None).expect("changed");
    assert_eq!(
        listed(&events, Kind::Service),
        (vec!["one".into(), "three".into()], vec!["two".into()])
    );
    let [(subject, message)] = rejected(&events).try_into().expect("one rejection");
    assert_eq!(subject, Subject::Object(svc("two")));
    assert!(
        message.contains("svc.yaml#2") && message.contains("invalid YAML"),
        "{message}"
    );

    // Broken so that it cannot be named any more: the file's last good objects still stay,
    // and the file is reported.
    let middle = "apiVersion: v1\nkind: Service\nmetadata: {name: tw\n";
    dir.write("svc.yaml", &three(middle));
    let events = folder.read(None).expect("changed");
    assert_eq!(listed(&events, Kind::Service).1, ["two"]);
    let path = dir.0.join("svc.yaml");
    assert_eq!(
        rejected(&events)
            .into_iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        [Subject::File(path.clone())]
    );
    assert_eq!(
        fixed(&events),
        BTreeSet::from([Subject::Object(svc("two"))])
    );

    // Nothing changed: nothing sent.
    assert!(folder.read(None).is_none());

    // Fixed: all three listed, nothing kept, the report withdrawn.
    dir.write("svc.yaml", &good);
    let events = folder.read(None).expect("changed");
    assert_eq!(
        listed(&events, Kind::Service),
        (vec!["one".into(), "two".into(), "three".into()], vec![])
    );
    assert!(rejected(&events).is_empty());
    assert_eq!(fixed(&events), BTreeSet::from([Subject::File(path)]));

    // Deleting the file removes its objects: that is no error.
    std::fs::remove_file(dir.0.join("svc.yaml")).expect("rm");
    let events = folder.read(None).expect("changed");
    assert_eq!(listed(&events, Kind::Service), (vec![], vec![]));
}

#[test]
fn a_file_over_the_size_cap_is_rejected_by_name_and_its_objects_kept() {
    let dir = TempDir::new();
    let path = dir.write("svc.yaml", &service("web", "10.96.0.1"));
    dir.write("other.yaml", &service("other", "10.96.0.2"));
    let options = Options {
        max_file_bytes: 200,
        ..Options::default()
    };
    let mut folder = Folder::new(&dir.0, options.clone());
    let events = folder.read(None).expect("first");
    assert_eq!(listed(&events, Kind::Service).0, ["other", "web"]);

    let padded = format!("{}# {}\n", service("web", "10.96.0.1"), "x".repeat(200));
    dir.write("svc.yaml", &padded);
    let events = folder.read(None).expect("changed");
    assert_eq!(
        listed(&events, Kind::Service),
        (vec!["other".into()], vec!["web".into()])
    );
    let [(subject, message)] = rejected(&events).try_into().expect("one rejection");
    assert_eq!(subject, Subject::File(path.clone()));
    assert!(message.contains("over the cap of 200 bytes"), "{message}");

    // `read_folder_with` (explain) applies the same cap.
    let contents = read_folder_with(&dir.0, &options).expect("read");
    assert!(contents.errors.iter().any(|e| e.location == "svc.yaml"));

    dir.write("svc.yaml", &service("web", "10.96.0.1"));
    let events = folder.read(None).expect("changed");
    assert_eq!(listed(&events, Kind::Service).0, ["other", "web"]);
    assert_eq!(fixed(&events), BTreeSet::from([Subject::File(path)]));
}

#[test]
fn symlinks_to_files_are_followed_symlinked_folders_and_hidden_names_are_not() {
    let dir = TempDir::new();
    let outside = TempDir::new();
    outside.write("target.yaml", &service("linked-file", "10.96.0.1"));
    outside.write(
        "sub/in-linked-folder.yaml",
        &service("linked-folder", "10.96.0.2"),
    );
    dir.write("nested/real.yaml", &service("real", "10.96.0.3"));
    dir.write(".hidden.yaml", &service("hidden", "10.96.0.4"));
    dir.write(
        ".git/in-hidden-folder.yaml",
        &service("hidden-folder", "10.96.0.5"),
    );
    dir.write("notes.txt", "not a manifest");
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, dir.0.join(name)).expect("symlink");
    };
    link(&outside.0.join("target.yaml"), "link.yaml");
    link(&outside.0.join("sub"), "linked-folder");
    link(&dir.0, "loop"); // a cycle: never followed
    link(&outside.0.join("missing.yaml"), "dangling.yaml");

    let mut folder = Folder::new(&dir.0, Options::default());
    let events = folder.read(None).expect("first");
    assert_eq!(listed(&events, Kind::Service).0, ["linked-file", "real"]);
    let rejected = rejected(&events);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].0, Subject::File(dir.0.join("dangling.yaml")));
    assert!(rejected[0].1.contains("cannot read"), "{rejected:?}");

    // The folder itself may be a symlink.
    let via = outside.0.join("via-link");
    std::os::unix::fs::symlink(&dir.0, &via).expect("symlink");
    let mut folder = Folder::new(&via, Options::default());
    let events = folder.read(None).expect("first");
    assert_eq!(listed(&events, Kind::Service).0, ["linked-file", "real"]);
}

#[test]
fn a_fifo_named_like_a_manifest_is_rejected_without_hanging() {
    let dir = TempDir::new();
    let fifo = dir.0.join("pipe.yaml");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
    let mut folder = Folder::new(&dir.0, Options::default());
    let events = folder.read(None).expect("first");
    assert_eq!(
        rejected(&events),
        [(
            Subject::File(fifo),
            "pipe.yaml: not a regular file".to_string()
        )]
    );
}

#[test]
fn changes_are_seen_by_content_not_by_size_and_mtime() {
    let dir = TempDir::new();
    let path = dir.write("svc.yaml", &service("web", "10.96.0.1"));
    let mut folder = Folder::new(&dir.0, Options::default());
    assert!(folder.read(None).is_some());
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");

    // Same bytes, new mtime (a touch, a rewrite by a config tool): nothing to send.
    std::fs::write(&path, service("web", "10.96.0.1")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(SystemTime::now() + Duration::from_mins(1)))
        .expect("touch");
    assert!(folder.read(None).is_none(), "same content");

    // Different bytes, same size and the same mtime: seen.
    std::fs::write(&path, service("web", "10.96.0.2")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    let events = folder.read(None).expect("content changed");
    let Some(SourceEvent::Listed { objects, .. }) = events.first() else {
        panic!("{events:?}")
    };
    let Object::Service(s) = &objects[0] else {
        panic!("{objects:?}")
    };
    assert_eq!(s.cluster_ips[0].to_string(), "10.96.0.2");
}

/// Waits for a listing of Services whose names are `expected`.
fn wait_listing(
    rx: &mut tokio::sync::mpsc::Receiver<SourceEvent>,
    expected: &[&str],
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let left = within
            .checked_sub(start.elapsed())
            .unwrap_or_else(|| panic!("no listing of {expected:?} within {within:?}"));
        let deadline = Instant::now() + left;
        let event = loop {
            match rx.try_recv() {
                Ok(e) => break Some(e),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break None,
                Err(e) => panic!("{e}"),
            }
        };
        if let Some(SourceEvent::Listed {
            kind: Kind::Service,
            objects,
            ..
        }) = event
        {
            let names: Vec<String> = objects
                .iter()
                .map(|o| o.object_ref().key.name.to_string())
                .collect();
            if names == expected {
                return start.elapsed();
            }
        }
    }
}

#[test]
fn inotify_picks_up_edits_and_new_subfolders_without_waiting_for_the_safety_read() {
    let dir = TempDir::new();
    dir.write("a.yaml", &service("a", "10.96.0.1"));
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let options = Options {
        // Far beyond the test's patience: only inotify can deliver in time.
        safety_poll: Duration::from_mins(10),
        ..Options::default()
    };
    let watched = dir.0.clone();
    let thread = std::thread::spawn(move || watch_with(&watched, None, &options, &tx));
    wait_listing(&mut rx, &["a"], Duration::from_secs(5));

    let mut slowest = Duration::ZERO;
    for round in 0..5 {
        dir.write("a.yaml", &service("a", &format!("10.96.1.{round}")));
        dir.write("b.yaml", &service("b", "10.96.0.2"));
        slowest = slowest.max(wait_listing(&mut rx, &["a", "b"], Duration::from_secs(2)));
        std::fs::remove_file(dir.0.join("b.yaml")).expect("rm");
        slowest = slowest.max(wait_listing(&mut rx, &["a"], Duration::from_secs(2)));
    }
    // A folder made after the start, and a file in it.
    dir.write("new/deeper/c.yaml", &service("c", "10.96.0.3"));
    wait_listing(&mut rx, &["a", "c"], Duration::from_secs(2));
    dir.write("new/deeper/c.yaml", &service("c", "10.96.0.4"));
    dir.write("new/deeper/d.yaml", &service("d", "10.96.0.5"));
    wait_listing(&mut rx, &["a", "c", "d"], Duration::from_secs(2));
    eprintln!("slowest edit to listing: {slowest:?}");

    drop(rx);
    // The watcher notices the receiver is gone at its next event.
    dir.write("a.yaml", &service("a", "10.96.0.9"));
    thread.join().expect("watcher thread");
}
