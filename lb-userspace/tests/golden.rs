//! Golden tests: Kubernetes YAML in, a readable dump of the translation and the maps out.
//!
//! Each folder under `tests/golden/` is a case; its `NN-*.yaml` files are successive states of
//! the cluster (each file is the whole world at that step), applied to one agent engine over
//! in-memory maps, so a case shows both the result and what each change wrote. The first
//! file's first line may name the node: `# node: name=node-a zone=zone-a addresses=192.0.2.10`.
//! The output is compared with `expected.txt`; `UPDATE_GOLDEN=1 cargo test` rewrites it.
//! After every single map write the maps' invariants are checked.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use socklb::{
    agent::Engine,
    dataplane::{dump, maps::InMemoryMaps},
    model::{ManifestObject, parse_manifests},
    reconcile::{Reconciler, invariants},
    source::{Kind, Object, SourceEvent},
    translate::{NodeInfo, report, translate_all},
};

fn node_from_header(text: &str) -> NodeInfo {
    let mut node = NodeInfo::default();
    let Some(header) = text.lines().next().and_then(|l| l.strip_prefix("# node:")) else {
        return node;
    };
    for kv in header.split_whitespace() {
        match kv.split_once('=') {
            Some(("name", v)) => node.name = Some(v.into()),
            Some(("zone", v)) => node.zone = Some(v.into()),
            Some(("addresses", v)) => {
                node.addresses = v
                    .split(',')
                    .map(|a| a.parse().expect("node address"))
                    .collect();
            }
            Some(("proxy", v)) => node.proxy_name = v.into(),
            _ => panic!("bad node header entry {kv:?}"),
        }
    }
    node
}

fn steps(case: &Path) -> Vec<PathBuf> {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(case)
        .expect("case folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    steps.sort();
    steps
}

fn run_case(case: &Path) -> String {
    let steps = steps(case);
    let first = std::fs::read_to_string(&steps[0]).expect("first step");
    let node = node_from_header(&first);
    let mut maps = InMemoryMaps::new();
    let broken: Arc<Mutex<Vec<String>>> = Arc::default();
    let written: Arc<Mutex<Vec<String>>> = Arc::default();
    let (sink, log) = (broken.clone(), written.clone());
    maps.observe(move |snap, write| {
        log.lock().expect("lock").push(write.to_string());
        for v in invariants::violations(snap) {
            sink.lock()
                .expect("lock")
                .push(format!("after `{write}`: {v}"));
        }
    });
    let mut engine = Engine::new(Reconciler::new(maps).expect("empty maps"), node);
    let mut out = String::new();
    for step in &steps {
        let name = step
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let parsed = parse_manifests(&name, &std::fs::read(step).expect("step file"));
        let _ = writeln!(out, "=== {name}");
        let (mut services, mut slices) = (Vec::new(), Vec::new());
        for e in &parsed.errors {
            let _ = writeln!(out, "rejected: {e}");
        }
        for o in parsed.objects {
            match o {
                ManifestObject::Service(s) => services.push(Object::Service(s)),
                ManifestObject::EndpointSlice(s) => slices.push(Object::EndpointSlice(s)),
                ManifestObject::Node(n) => engine.handle(SourceEvent::Node(n)),
            }
        }
        for (kind, objects) in [(Kind::Service, services), (Kind::EndpointSlice, slices)] {
            engine.handle(SourceEvent::Listed {
                kind,
                objects,
                resource_version: None,
                keep: Vec::new(),
            });
        }
        let pass = engine.reconcile().expect("both kinds listed");
        let _ = writeln!(out, "map writes: {}", pass.report.writes);
        for w in written.lock().expect("lock").drain(..) {
            let _ = writeln!(out, "  {w}");
        }
        for (key, problem) in &pass.report.problems {
            let _ = writeln!(out, "problem: {key}: {problem}");
        }
        let (_, reports) = translate_all(engine.store(), engine.node());
        out.push_str("--- translation\n");
        out.push_str(&report::render(&reports));
        out.push_str("--- maps\n");
        out.push_str(&dump::render(engine.reconciler().snapshot()));
    }
    let broken = broken.lock().expect("lock");
    assert!(
        broken.is_empty(),
        "{}: invariants broken:\n{}",
        case.display(),
        broken.join("\n")
    );
    out
}

#[test]
fn golden_cases() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/golden")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases");
    let mut mismatches = Vec::new();
    for case in &cases {
        let actual = run_case(case);
        let expected_path = case.join("expected.txt");
        if update {
            std::fs::write(&expected_path, &actual).expect("write expected.txt");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            let line = expected
                .lines()
                .zip(actual.lines())
                .position(|(e, a)| e != a)
                .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
            mismatches.push(format!(
                "{}: first difference at line {}:\n  expected: {:?}\n  actual:   {:?}",
                case.file_name().expect("name").to_string_lossy(),
                line + 1,
                expected.lines().nth(line).unwrap_or("<end>"),
                actual.lines().nth(line).unwrap_or("<end>"),
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatches (UPDATE_GOLDEN=1 cargo test -p lb-userspace --test golden rewrites them after review):\n{}",
        mismatches.join("\n")
    );
}
