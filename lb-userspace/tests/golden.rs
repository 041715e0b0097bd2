//! Golden tests: Kubernetes YAML in, a readable dump of the translation and the maps out.
//!
//! Each folder under `tests/golden/` is a case; its `NN-*.yaml` files are successive states of
//! the cluster (each file is the whole world at that step), applied to one agent engine over
//! in-memory maps, so a case shows both the result and what each change wrote. The first
//! file's first line may name the node: `# node: name=node-a zone=zone-a addresses=192.0.2.10`.
//! The output is compared with `expected.txt`; `UPDATE_GOLDEN=1 cargo test` rewrites it (any
//! other value, or `UPDATE_GOLDEN` under `CI=true`, stops the run: CI only ever compares).
//! Before every single map write the write-order rule is checked, after it the maps'
//! invariants. Each case is a test of its own: a failing case is named, and the others still
//! run.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use lb_common::MapId;
use libtest_mimic::{Arguments, Failed, Trial};
use socklb::{
    agent::Engine,
    dataplane::{dump, maps::InMemoryMaps},
    model::{ManifestObject, parse_manifests},
    reconcile::{Reconciler, invariants},
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags, report, translate_all},
    vocab::Kind,
};

fn node_from_header(text: &str) -> NodeFlags {
    let mut node = NodeFlags {
        proxy_name: DEFAULT_PROXY_NAME.into(),
        external_ips: true,
        ..NodeFlags::default()
    };
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
            Some(("external-ips", "ignore")) => node.external_ips = false,
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

fn run_case(case: &Path) -> Result<String, String> {
    let steps = steps(case);
    let first = std::fs::read_to_string(&steps[0]).expect("first step");
    let node = node_from_header(&first);
    let mut maps = InMemoryMaps::new();
    let broken: Arc<Mutex<Vec<String>>> = Arc::default();
    let written: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = broken.clone();
    maps.guard(move |snap, write| {
        sink.lock()
            .expect("lock")
            .extend(invariants::overwrites_used_range(snap, write));
    });
    let (sink, log) = (broken.clone(), written.clone());
    maps.observe(move |snap, write| {
        log.lock().expect("lock").push(write.to_string());
        for v in invariants::violations(snap, MapId::Backends.default_capacity()) {
            sink.lock()
                .expect("lock")
                .push(format!("after `{write}`: {v}"));
        }
    });
    let reconciler = Reconciler::with_grace(maps, std::time::Duration::ZERO).expect("empty maps");
    let mut engine = Engine::new(reconciler, node);
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
                keep: Vec::new(),
            });
        }
        let Some(pass) = engine.reconcile() else {
            return Err(format!(
                "{name}: nothing to do after both kinds were listed"
            ));
        };
        let _ = writeln!(out, "map writes: {}", pass.report.writes);
        for w in written.lock().expect("lock").drain(..) {
            let _ = writeln!(out, "  {w}");
        }
        for (key, problem) in &pass.report.failed {
            let _ = writeln!(out, "failed: {key}: {problem}");
        }
        for (key, conflicts) in engine.conflicts() {
            for c in conflicts {
                let _ = writeln!(out, "not served: {key}: {c}");
            }
        }
        let (_, reports) = translate_all(engine.store(), engine.node());
        out.push_str("--- translation\n");
        out.push_str(&report::render(&reports));
        out.push_str("--- maps\n");
        out.push_str(&dump::render(engine.reconciler().snapshot()));
    }
    let broken = broken.lock().expect("lock");
    if !broken.is_empty() {
        return Err(format!("invariants broken:\n{}", broken.join("\n")));
    }
    Ok(out)
}

/// Whether this run rewrites `expected.txt`: only with `UPDATE_GOLDEN=1`, never under
/// `CI=true`; any other value is refused, so a typo cannot pass every case.
fn rewriting(update: Option<&str>, ci: bool) -> Result<bool, String> {
    match (update, ci) {
        (None, _) => Ok(false),
        (Some(_), true) => Err("UPDATE_GOLDEN is refused under CI=true: CI compares".into()),
        (Some("1"), false) => Ok(true),
        (Some(other), false) => Err(format!(
            "UPDATE_GOLDEN={other:?}: only UPDATE_GOLDEN=1 rewrites expected.txt"
        )),
    }
}

fn check(case: &Path, rewrite: bool) -> Result<(), Failed> {
    let actual = run_case(case)?;
    let expected_path = case.join("expected.txt");
    if rewrite {
        std::fs::write(&expected_path, &actual).map_err(|e| e.to_string())?;
        return Ok(());
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    if expected == actual {
        return Ok(());
    }
    let line = expected
        .lines()
        .zip(actual.lines())
        .position(|(e, a)| e != a)
        .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
    Err(format!(
        "first difference at line {} (UPDATE_GOLDEN=1 cargo test -p lb-userspace --test golden rewrites expected.txt after review):\n  expected: {:?}\n  actual:   {:?}",
        line + 1,
        expected.lines().nth(line).unwrap_or("<end>"),
        actual.lines().nth(line).unwrap_or("<end>"),
    )
    .into())
}

fn main() {
    let update = std::env::var("UPDATE_GOLDEN").ok();
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let rewrite = match rewriting(update.as_deref(), ci) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("golden: {e}");
            std::process::exit(2);
        }
    };
    assert_eq!(rewriting(None, true), Ok(false));
    assert!(rewriting(Some("1"), true).is_err() && rewriting(Some("yes"), false).is_err());
    assert_eq!(rewriting(Some("1"), false), Ok(true));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/golden")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases");
    let trials = cases
        .into_iter()
        .map(|case| {
            let name = case
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            Trial::test(name, move || check(&case, rewrite))
        })
        .collect();
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
