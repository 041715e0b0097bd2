//! `socklb monitor`: the data path's decisions as they happen. The demo shows them (its claims
//! include the refusals of seed 003's typo, see `tests/tests/demo.rs`); here the filters, the
//! reasons, and what happens under load: decisions the stream had no room for are counted, and
//! nothing is written while nobody reads.
use std::{
    io::BufRead as _,
    process::{Command as Process, Stdio},
};

use socklb::{
    cli::MonitorLine,
    dataplane::{events::Decision, pins::PinFolder},
};
use socklb_tests::{Sandbox, agent::AgentOptions, bins, client::Command};

const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";
const C: &str = "10.244.3.47:8080";

use socklb_tests::examples;

/// `socklb monitor -o json ARGS` until it has claimed the stream.
fn monitor(sandbox: &Sandbox, args: &[&str]) -> anyhow::Result<std::process::Child> {
    let mut child = Process::new(bins::socklb()?)
        .args(["monitor", "-o", "json", "--bpffs"])
        .arg(sandbox.pin_folder())
        .arg("--cgroup")
        .arg(&sandbox.cgroup)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    std::io::BufReader::new(child.stderr.take().expect("stderr")).read_line(&mut first)?;
    anyhow::ensure!(first.contains("reading"), "{first}");
    Ok(child)
}

fn lines(child: std::process::Child) -> anyhow::Result<Vec<MonitorLine>> {
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

#[test]
fn monitor_shows_decisions_with_their_reasons_and_filters_by_service() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in [A, B, C] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    sandbox.copy_manifests(&examples().join("seed"))?;
    sandbox.copy_manifests(&examples().join("scenarios/003-selector-typo"))?;
    sandbox.copy_manifests(&examples().join("scenarios/session-affinity"))?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    sandbox.wait_candidates("10.96.0.30:80", &[])?;
    sandbox.wait_candidates("10.96.0.60:80", &[A, B, C])?;

    // Every decision: translations to A or B, affinity hits, the refusals of the typo.
    let all = monitor(&sandbox, &["--count", "8", "--seconds", "20"])?;
    // One reader at a time (a ring buffer has one consumer): a second is refused.
    let second = Process::new(bins::socklb()?)
        .args(["monitor", "--seconds", "1", "--bpffs"])
        .arg(sandbox.pin_folder())
        .output()?;
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another socklb monitor"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let mut client = sandbox.client()?;
    let web = client.connect("10.96.0.10:80".parse()?, 3)?;
    assert_eq!(web.answers(), 3);
    let shop = client.connect("10.96.0.30:80".parse()?, 2)?;
    assert_eq!(shop.errors.get("ECONNREFUSED"), Some(&2));
    let sticky = client.connect("10.96.0.60:80".parse()?, 3)?;
    assert_eq!(sticky.answers(), 3, "{sticky:?}");

    let decisions: Vec<_> = lines(all)?
        .into_iter()
        .filter_map(|l| match l {
            MonitorLine::Decision(d) => Some(*d),
            MonitorLine::Dropped { .. } => None,
        })
        .collect();
    assert_eq!(decisions.len(), 8, "{decisions:#?}");
    let kinds: Vec<(String, Decision)> = decisions
        .iter()
        .map(|d| (d.seen.frontend.to_string(), d.seen.decision))
        .collect();
    assert_eq!(
        kinds,
        [
            ("10.96.0.10:80/TCP".to_string(), Decision::Translated),
            ("10.96.0.10:80/TCP".to_string(), Decision::Translated),
            ("10.96.0.10:80/TCP".to_string(), Decision::Translated),
            ("10.96.0.30:80/TCP".to_string(), Decision::NoBackend),
            ("10.96.0.30:80/TCP".to_string(), Decision::NoBackend),
            ("10.96.0.60:80/TCP".to_string(), Decision::Translated),
            ("10.96.0.60:80/TCP".to_string(), Decision::AffinityHit),
            ("10.96.0.60:80/TCP".to_string(), Decision::AffinityHit),
        ],
        "{decisions:#?}"
    );
    // What the client saw is what the monitor says it got.
    let seen_backends: std::collections::BTreeSet<String> = decisions
        .iter()
        .take(3)
        .filter_map(|d| d.seen.backend.map(|b| b.to_string()))
        .collect();
    let answered: std::collections::BTreeSet<String> = web.backends.keys().cloned().collect();
    assert_eq!(seen_backends, answered);
    assert!(decisions.iter().all(|d| d.cgroup.as_deref() == Some("/")));
    assert_eq!(
        decisions[3].service.as_ref().map(|k| k.service.to_string()),
        Some("default/shop".into())
    );

    // Only one Service's decisions.
    let only_shop = monitor(
        &sandbox,
        &[
            "--service",
            "default/shop",
            "--count",
            "2",
            "--seconds",
            "20",
        ],
    )?;
    client.connect("10.96.0.10:80".parse()?, 2)?;
    client.connect("10.96.0.30:80".parse()?, 2)?;
    let shop_only = lines(only_shop)?;
    assert_eq!(shop_only.len(), 2, "{shop_only:#?}");
    assert!(shop_only.iter().all(|l| matches!(
        l,
        MonitorLine::Decision(d) if d.seen.decision == Decision::NoBackend
    )));
    Ok(())
}

/// Under load a reader that falls behind loses decisions: they are counted
/// (`socklb_datapath_events_dropped_total`), never in the way of a connect. Nothing is written
/// while nobody reads.
#[test]
fn decisions_beyond_the_streams_room_are_counted_and_nothing_is_written_unread()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend("10.244.1.21:5353".parse()?, true)?;
    sandbox.write_manifest(
        "dns.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: dns, namespace: default}\nspec:\n  clusterIP: 10.96.0.53\n  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 5353}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}\naddressType: IPv4\nports: [{name: dns, port: 5353, protocol: UDP}]\nendpoints:\n  - {addresses: [\"10.244.1.21\"]}\n",
    )?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.53:53/udp", &["10.244.1.21:5353"])?;
    let churn = |n: usize| -> anyhow::Result<()> {
        let r = sandbox.client()?.run(&Command::Ops {
            kind: socklb_tests::client::Op::UdpClose,
            targets: vec!["10.96.0.53:53".parse()?],
            count: n,
        })?;
        anyhow::ensure!(r.latencies_ns.len() == n, "{:?}", r.errors);
        Ok(())
    };
    let dropped = || -> anyhow::Result<usize> {
        let n = agent.metric("socklb_datapath_events_dropped_total")?;
        // A counter's value is a whole number: its text is parsed as one.
        Ok(n.map_or(0, |n| format!("{n:.0}").parse().unwrap_or(usize::MAX)))
    };

    // Nobody reads: nothing is written, nothing dropped.
    churn(10_000)?;
    assert_eq!(dropped()?, 0);

    // A reader that claims the stream but does not read yet: the ring buffer holds what fits,
    // the rest is counted.
    let maps = PinFolder::new(sandbox.pin_folder())
        .current()
        .expect("a map generation");
    let mut reader = socklb::dataplane::events::Reader::open(&maps)?;
    let sent = 10_000;
    churn(sent)?;
    let mut read = 0usize;
    reader.read(std::time::Duration::from_millis(100), |_| read += 1)?;
    let lost = dropped()?;
    assert!(read > 1000 && lost > 0, "read {read}, dropped {lost}");
    assert_eq!(read + lost, sent, "every decision read or counted");
    // The reader goes away (its claim is withdrawn): nothing more is written.
    drop(reader);
    churn(1_000)?;
    assert_eq!(dropped()?, lost);
    println!(
        "FIGURE socklb monitor under load: {sent} decisions while the reader waited, {read} read, {lost} dropped and counted"
    );
    Ok(())
}
