//! The agent's metrics without a kernel: an engine over in-memory maps, its metrics encoded in
//! both formats, Prometheus' own linter (`promtool check metrics`) run on the text format, and
//! the network programming latency from the EndpointSlice controller's trigger time.
use std::{
    fmt::Write as _,
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use lb_common::MapId;
use socklb::{
    agent::{Engine, Format, Metrics},
    dataplane::{features::Features, maps::InMemoryMaps},
    model::{ManifestObject, parse_manifests},
    reconcile::Reconciler,
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
    vocab::{ErrorKind, Kind, Subject},
};

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
";

fn slice(trigger: Option<&str>, addresses: &[&str]) -> String {
    let annotation = trigger.map_or_else(String::new, |t| {
        format!("  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{t}\"}}\n")
    });
    let mut endpoints = String::new();
    for a in addresses {
        let _ = write!(
            endpoints,
            "  - addresses: [\"{a}\"]\n    conditions: {{ready: true}}\n"
        );
    }
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc12
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
{annotation}addressType: IPv4
ports: [{{name: http, protocol: TCP, port: 8080}}]
endpoints:
{endpoints}"
    )
}

fn objects(yaml: &str) -> Vec<Object> {
    let parsed = parse_manifests("test.yaml", yaml.as_bytes());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    parsed
        .objects
        .into_iter()
        .filter_map(|o| match o {
            ManifestObject::Service(s) => Some(Object::Service(s)),
            ManifestObject::EndpointSlice(s) => Some(Object::EndpointSlice(s)),
            ManifestObject::Node(_) => None,
        })
        .collect()
}

fn engine() -> Engine<InMemoryMaps> {
    let flags = NodeFlags {
        proxy_name: DEFAULT_PROXY_NAME.into(),
        external_ips: true,
        ..NodeFlags::default()
    };
    Engine::new(
        Reconciler::with_grace(InMemoryMaps::new(), Duration::ZERO).expect("empty maps"),
        flags,
    )
}

/// Metrics over a pin folder that does not exist: no data path counters, everything else.
fn metrics() -> Metrics {
    let nowhere = PathBuf::from("/nonexistent/socklb-metrics-test");
    Metrics::new(&nowhere.join("maps"), &Features::all_enabled())
}

fn list(engine: &mut Engine<InMemoryMaps>, services: &str, slices: &str) {
    for (kind, yaml) in [(Kind::Service, services), (Kind::EndpointSlice, slices)] {
        engine.handle(SourceEvent::Listed {
            kind,
            objects: objects(yaml),
            keep: Vec::new(),
        });
    }
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// A running engine's metrics: a full sync, a change with a trigger time, an error.
fn exercised() -> Metrics {
    let metrics = metrics();
    let mut engine = engine();
    list(&mut engine, SERVICE, &slice(None, &["10.244.1.21"]));
    let pass = engine.reconcile().expect("first sync");
    metrics.record_pass(&pass);
    engine.handle(SourceEvent::Applied(
        objects(&slice(
            Some(&now_rfc3339()),
            &["10.244.1.21", "10.244.2.34"],
        ))
        .pop()
        .expect("slice"),
    ));
    let pass = engine.reconcile().expect("change");
    metrics.record_pass(&pass);
    metrics.record_state(&engine, 1);
    metrics.record_error(ErrorKind::UdpTerminate);
    metrics.record_udp_terminated(2);
    metrics
}

/// promtool, if installed (outside CI: `cargo xtask setup` installs it).
fn find_promtool() -> Option<&'static str> {
    let found = ["/usr/local/bin/promtool", "promtool"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is not installed (cargo xtask setup installs it)"
        );
        eprintln!("skipping the promtool check: promtool is not installed");
    }
    found
}

fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `promtool check metrics` on `exposition`: (success, what it said).
fn promtool(exposition: &str) -> Option<(bool, String)> {
    let mut child = Command::new(find_promtool()?)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    Some((out.status.success(), said(&out)))
}

/// Prometheus' `OpenMetrics` parser, through promtool's backfill (which wants a timestamp on
/// every sample: one is added): (success, what it said).
fn promtool_openmetrics(exposition: &str) -> Option<(bool, String)> {
    let promtool = find_promtool()?;
    let dir = std::env::temp_dir().join(format!("socklb-openmetrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary folder");
    let mut stamped = String::new();
    for line in exposition.lines() {
        if line.starts_with('#') {
            let _ = writeln!(stamped, "{line}");
        } else {
            let _ = writeln!(stamped, "{line} 1700000000");
        }
    }
    std::fs::write(dir.join("in.txt"), stamped).expect("write");
    let out = Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(dir.join("in.txt"))
        .arg(dir.join("blocks"))
        .output()
        .expect("promtool runs");
    let _ = std::fs::remove_dir_all(&dir);
    Some((out.status.success(), said(&out)))
}

#[test]
fn the_text_format_passes_promtool_with_help_and_type_on_every_metric() {
    let text = exercised().encode(Format::Text);
    if let Some((ok, said)) = promtool(&text) {
        assert!(
            ok && said.trim().is_empty(),
            "promtool: {said}\n---\n{text}"
        );
    }
    // Every sample's family has HELP and TYPE (what promtool reads them by).
    let described: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(
            described.iter().any(|d| name == *d
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(d))),
            "{name} has no TYPE"
        );
    }
    for family in &described {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} has no HELP"
        );
    }
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    for expected in [
        "socklb_build_info{version=\"",
        "socklb_sync_duration_seconds_count 2",
        "socklb_rejected_objects_total 0",
        "socklb_rejected_objects_current 0",
        "socklb_network_programming_duration_seconds_count 1",
        "socklb_last_sync_timestamp_seconds ",
        "socklb_errors_total{kind=\"udp_terminate\"} 1",
        "socklb_udp_sockets_terminated_total 2",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
    }
    let map = |metric: &str, map: MapId| format!("socklb_{metric}{{map=\"{}\"}} ", map.name());
    for expected in [
        map("map_entries", MapId::Frontends4) + "1",
        map("map_entries", MapId::Backends),
        map("map_capacity", MapId::ServiceMeta),
    ] {
        assert!(text.contains(&expected), "no {expected:?} in\n{text}");
    }
}

#[test]
fn openmetrics_has_the_same_samples_and_ends_with_eof() {
    let metrics = exercised();
    let om = metrics.encode(Format::OpenMetrics);
    let text = metrics.encode(Format::Text);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert_eq!(om.matches("# EOF").count(), 1);
    if let Some((ok, said)) = promtool_openmetrics(&om) {
        assert!(ok, "OpenMetrics parser: {said}\n---\n{om}");
    }
    // The text format is not OpenMetrics (no # EOF): the same parser refuses it.
    if let Some((ok, _)) = promtool_openmetrics(&text) {
        assert!(!ok);
    }
    assert!(om.contains("# TYPE socklb_errors counter\n"));
    assert!(om.contains("# TYPE socklb_build info\n"));
    assert!(text.contains("# TYPE socklb_errors_total counter\n"));
    assert!(text.contains("# TYPE socklb_build_info gauge\n"));
    // The same samples, as values (the two encoders write numbers and order a histogram's
    // lines each their own way; process times and sizes move between the two scrapes).
    let samples = |s: &str| -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = s
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("process_"))
            .filter(|l| !l.starts_with("socklb_last_sync_timestamp_seconds"))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                // `le="1.0"` and `le="1"` are one bucket.
                let series = match series.split_once("le=\"") {
                    Some((head, rest)) => {
                        let (bound, tail) = rest.split_once('"')?;
                        let bound = bound
                            .parse::<f64>()
                            .map_or(bound.to_string(), |b| b.to_string());
                        format!("{head}le=\"{bound}\"{tail}")
                    }
                    None => series.to_string(),
                };
                Some((series, value.parse::<f64>().ok()?.to_bits()))
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(samples(&om), samples(&text));
    assert!(samples(&om).len() > 50, "{om}");
}

#[test]
fn network_programming_latency_counts_each_change_once_from_its_trigger_time() {
    let mut engine = engine();
    // Triggered before the agent started: not a latency of ours (as kube-proxy).
    list(
        &mut engine,
        SERVICE,
        &slice(Some("2020-01-01T00:00:00Z"), &["10.244.1.21"]),
    );
    let pass = engine.reconcile().expect("first sync");
    assert!(pass.programming_latencies.is_empty(), "{pass:?}");

    let trigger = now_rfc3339();
    std::thread::sleep(Duration::from_millis(30));
    engine.handle(SourceEvent::Applied(
        objects(&slice(Some(&trigger), &["10.244.1.21", "10.244.2.34"]))
            .pop()
            .expect("slice"),
    ));
    let pass = engine.reconcile().expect("change");
    assert_eq!(pass.programming_latencies.len(), 1, "{pass:?}");
    let latency = pass.programming_latencies[0];
    assert!(
        latency >= Duration::from_millis(30) && latency < Duration::from_secs(5),
        "{latency:?}"
    );

    // The same version again (a re-list): nothing new to measure.
    list(
        &mut engine,
        SERVICE,
        &slice(Some(&trigger), &["10.244.1.21", "10.244.2.34"]),
    );
    if let Some(pass) = engine.reconcile() {
        assert!(pass.programming_latencies.is_empty(), "{pass:?}");
    }
}

/// The value of one sample in the text format.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        (key == series).then(|| value.parse().ok()).flatten()
    })
}

#[test]
fn rejected_objects_are_counted_once_and_gauged_until_fixed() {
    let metrics = metrics();
    let mut engine = engine();
    list(&mut engine, SERVICE, &slice(None, &["10.244.1.21"]));
    let bad = |n: &str| Subject::File(PathBuf::from(format!("/manifests/{n}.yaml")));
    let reject = |engine: &mut Engine<InMemoryMaps>, n: &str| {
        engine.handle(SourceEvent::Rejected {
            subject: bad(n),
            message: format!("{n}.yaml#1: invalid YAML"),
        });
    };
    let read = |metrics: &Metrics, engine: &Engine<InMemoryMaps>| {
        metrics.record_state(engine, 0);
        let text = metrics.encode(Format::Text);
        (
            sample(&text, "socklb_rejected_objects_total"),
            sample(&text, "socklb_rejected_objects_current"),
        )
    };
    assert_eq!(read(&metrics, &engine), (Some(0.0), Some(0.0)));
    reject(&mut engine, "a");
    reject(&mut engine, "b");
    assert_eq!(read(&metrics, &engine), (Some(2.0), Some(2.0)));
    // The same problem reported again (a re-read of the same broken file): nothing new.
    reject(&mut engine, "a");
    assert_eq!(read(&metrics, &engine), (Some(2.0), Some(2.0)));
    engine.handle(SourceEvent::Fixed(bad("a")));
    assert_eq!(read(&metrics, &engine), (Some(2.0), Some(1.0)));
    engine.handle(SourceEvent::Fixed(bad("b")));
    assert_eq!(read(&metrics, &engine), (Some(2.0), Some(0.0)));
    // Both families live side by side in OpenMetrics too (a gauge named like the counter
    // family would clash there).
    let om = metrics.encode(Format::OpenMetrics);
    assert!(
        om.contains("# TYPE socklb_rejected_objects counter\n"),
        "{om}"
    );
    assert!(
        om.contains("# TYPE socklb_rejected_objects_current gauge\n"),
        "{om}"
    );
}

#[test]
fn accept_headers_pick_the_format() {
    assert_eq!(
        Format::negotiate(None).content_type(),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(
        Format::negotiate(Some("application/openmetrics-text; version=1.0.0")).content_type(),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
}
