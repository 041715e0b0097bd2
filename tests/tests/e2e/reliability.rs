//! Reliability under stress: endpoints rolling under load, kill -9 restarts under load, full
//! maps, hostile input, and what the agent keeps once loaded. The short versions run in
//! `cargo xtask test`; the long ones (`#[ignore]`) in `cargo xtask stress`, which collects the
//! `FIGURE` lines they print into a report.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use socklb::vocab::{Protocol, ServiceAddr, ServicePortKey};
use socklb_tests::{
    Sandbox,
    agent::{AgentOptions, AgentProcess},
    churn::{Rng, Roller, check},
    load::Load,
    manifests::{Ep, service, slice},
};

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name}: {value}");
}

use socklb_tests::examples;

/// A rolling update replaces every backend of a service, `updates` times, always keeping
/// ready endpoints, while a client connects in a loop: no connect fails, and every connect lands
/// on an endpoint that was a candidate when it was made.
fn churn(updates: usize, min_connects: usize) -> anyhow::Result<()> {
    let sandbox = Sandbox::new()?;
    let pool: Vec<SocketAddr> = (1..=6)
        .map(|i| SocketAddr::from(([10, 244, 5, i], 8080)))
        .collect();
    for b in &pool {
        sandbox.add_backend(*b, false)?;
    }
    let vip: SocketAddr = "10.96.0.80:80".parse()?;
    sandbox.write_manifest(
        "rolling.yaml",
        &service("rolling", "10.96.0.80", "http", "TCP", 80, "8080", &[]),
    )?;
    sandbox.write_manifest(
        "rolling-slice.yaml",
        &slice(
            "rolling-1",
            "rolling",
            "http",
            "TCP",
            8080,
            &[Ep::ready("10.244.5.1")],
        ),
    )?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    let frontend = ServiceAddr::new(vip.ip(), vip.port(), Protocol::Tcp);
    let mut roller = Roller::new(&sandbox, "rolling", frontend, pool, vec![0, 1, 2])?;
    let load = Load::start(&sandbox, vip, 1, min_connects)?;
    let start = Instant::now();
    for _ in 0..updates {
        roller.rolling_update()?;
    }
    let churn_time = start.elapsed();
    let done = load.finish()?;
    let verdict = check(&done.records[0], &roller.timeline)?;
    figure("churn rolling updates", updates);
    figure("churn endpoint-set changes", roller.timeline.len());
    figure(
        "churn duration",
        format!("{:.1} s", churn_time.as_secs_f64()),
    );
    figure("churn connects", verdict.connects);
    figure(
        "churn connects made while endpoints changed",
        verdict.during_changes,
    );
    figure(
        "churn failed connects",
        verdict.failures.values().sum::<usize>(),
    );
    figure("churn connects to a non-candidate", verdict.misrouted);
    figure("churn backends reached", verdict.backends.len());
    assert!(
        verdict.connects >= min_connects,
        "only {} connects",
        verdict.connects
    );
    assert!(
        verdict.during_changes >= min_connects / 10,
        "only {} connects overlapped the changes",
        verdict.during_changes
    );
    assert!(
        verdict.failures.is_empty(),
        "failed connects: {:?}",
        verdict.failures
    );
    assert_eq!(
        verdict.misrouted, 0,
        "connects to non-candidates: {:?}",
        verdict.examples
    );
    assert_eq!(
        verdict.backends.len(),
        6,
        "every pod served: {:?}",
        verdict.backends
    );
    Ok(())
}

#[test]
fn rolling_updates_under_load_lose_and_misroute_nothing() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    churn(10, 10_000)
}

#[test]
#[ignore = "long: cargo xtask stress"]
fn stress_rolling_updates() -> anyhow::Result<()> {
    churn(100, 100_000)
}

/// Ids and entry counts that must survive restarts unchanged.
type State = (BTreeMap<ServicePortKey, u32>, BTreeMap<String, Option<u64>>);

fn state(sandbox: &Sandbox) -> anyhow::Result<State> {
    let ids = sandbox
        .services()?
        .into_iter()
        .filter_map(|s| Some((s.service?, s.id)))
        .collect();
    let stats: socklb::cli::Stats = sandbox.inspect_as(&["stats"])?;
    let counts = stats
        .maps
        .into_iter()
        .filter(|m| m.map != "AFFINITY")
        .map(|m| (m.map, m.entries))
        .collect();
    Ok((ids, counts))
}

/// kill -9 at random moments while a client connects in a loop: no connect fails, and after
/// each restart the maps converge to the desired digest with no leaked ids or entries.
fn restarts(rounds: usize, min_connects: usize) -> anyhow::Result<()> {
    let sandbox = Sandbox::new()?;
    for b in ["10.244.1.21:8080", "10.244.2.34:8080", "10.244.3.47:8080"] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    sandbox.copy_manifests(&examples().join("seed"))?;
    sandbox.copy_manifests(&examples().join("scenarios/session-affinity"))?;
    sandbox.copy_manifests(&examples().join("scenarios/003-selector-typo"))?;
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    let before = state(&sandbox)?;
    let load = Load::start(&sandbox, "10.96.0.10:80".parse()?, 1, min_connects)?;
    let extra = (0..200)
        .flat_map(|i| {
            let endpoints: Vec<String> = (1..=20).map(|j| format!("10.245.{i}.{j}")).collect();
            let endpoints: Vec<Ep> = endpoints.iter().map(|e| Ep::ready(e)).collect();
            [
                service(
                    &format!("extra-{i}"),
                    &format!("10.96.7.{i}"),
                    "http",
                    "TCP",
                    80,
                    "8080",
                    &[],
                ),
                slice(
                    &format!("extra-{i}-1"),
                    &format!("extra-{i}"),
                    "http",
                    "TCP",
                    8080,
                    &endpoints,
                ),
            ]
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    let mut rng = Rng::from_time();
    let mut slowest = Duration::ZERO;
    let (mut early, mut left) = (0, [0; 3]);
    for round in 0..rounds {
        std::thread::sleep(rng.millis(50, 400));
        agent.kill9();
        if round % 2 == 1 {
            // Also kill a starting agent (mid-load, mid-attach with pins being moved, or
            // mid-sync) that has 200 new services to write; they are gone again when the next
            // agent starts, which must remove whatever was half-written.
            sandbox.write_manifest("extra.yaml", &extra)?;
            std::thread::sleep(rng.millis(0, 100));
            agent.restart(false)?;
            std::thread::sleep(rng.millis(10, 70));
            agent.kill9();
            sandbox.remove_manifest("extra.yaml")?;
            early += 1;
            // What the killed agent left for the next one: nothing, part of, or all of the
            // 200 new service ports.
            match state(&sandbox)?.0.len().saturating_sub(before.0.len()) {
                0 => left[0] += 1,
                200 => left[2] += 1,
                _ => left[1] += 1,
            }
        }
        std::thread::sleep(rng.millis(0, 200));
        let start = Instant::now();
        agent.restart(true)?;
        slowest = slowest.max(start.elapsed());
        converged(&sandbox, &agent)?;
        assert_eq!(
            state(&sandbox)?,
            before,
            "restart {round}: ids or entry counts changed"
        );
    }
    restart_keeping(&sandbox, &mut agent, &extra)?;
    let done = load.finish()?;
    let connects = done.connects.len();
    let failed = done.failed();
    figure("restarts (kill -9)", rounds + early);
    figure(
        "of which killed while starting (loading, attaching or syncing)",
        early,
    );
    figure(
        "what those kills left in the maps for the next agent to remove",
        format!(
            "none of 200 new service ports {} times, some {} times, all {} times",
            left[0], left[1], left[2]
        ),
    );
    figure("restart connects", connects);
    figure("restart failed connects", failed.len());
    figure(
        "restart slowest time to ready",
        format!("{:.0} ms", slowest.as_secs_f64() * 1e3),
    );
    assert!(connects >= min_connects);
    assert!(
        failed.is_empty(),
        "failed connects: {:?}",
        &failed[..failed.len().min(5)]
    );
    Ok(())
}

/// Last, the 200 extra service ports stay: the agent started after one more kill -9 writes
/// every one of them, and each is checked against its manifest (their endpoints, 10.245.I.1 to
/// .20, sort differently as text than as addresses).
fn restart_keeping(sandbox: &Sandbox, agent: &mut AgentProcess, extra: &str) -> anyhow::Result<()> {
    sandbox.write_manifest("extra.yaml", extra)?;
    agent.kill9();
    agent.restart(true)?;
    let checked = converged(sandbox, agent)?;
    anyhow::ensure!(checked >= 203, "only {checked} Services checked");
    extras_as_built(sandbox)?;
    figure(
        "Services checked against the maps after the last restart",
        checked,
    );
    Ok(())
}

/// The 200 extra Services as this test built them, checked without the library's translation:
/// `extra-I` answers on 10.96.7.I:80/TCP with exactly 10.245.I.1 to .20, port 8080.
fn extras_as_built(sandbox: &Sandbox) -> anyhow::Result<()> {
    let held = sandbox.services()?;
    for i in 0..200u8 {
        let frontend = ServiceAddr::new([10, 96, 7, i].into(), 80, Protocol::Tcp);
        let view = held
            .iter()
            .find(|v| v.frontends.iter().any(|f| f.frontend == frontend))
            .ok_or_else(|| anyhow::anyhow!("{frontend} is not in the maps"))?;
        let mut backends = view.active_backends();
        backends.sort_unstable();
        let want: Vec<SocketAddr> = (1..=20u8)
            .map(|j| SocketAddr::from(([10, 245, i, j], 8080)))
            .collect();
        anyhow::ensure!(backends == want, "{frontend}: {backends:?}");
    }
    Ok(())
}

/// One backend set as compared: its frontends and its backends in numeric order.
type Held = (std::collections::BTreeSet<ServiceAddr>, Vec<SocketAddr>);

/// Every Service the test created converged. The desired state of every Service in the
/// manifests folder and the maps (`inspect services`) agree backend set by backend set. That
/// desired state comes from the code under test (`translate_all`, as the agent computes it):
/// this checks that a restarted agent writes what it means to, not that what it means is
/// right (the conformance cases and [`extras_as_built`] check that independently). Compared compared as typed values: the same frontends,
/// the same backends in numeric order (the 200 extra services' endpoints, 10.245.I.1 to .20,
/// sort differently as text). Nothing else is in the maps (a killed agent's half-written extras
/// were removed). And `explain`, the agent's own check, finds equal digests for the seed's
/// Services. Returns how many Services were checked.
fn converged(sandbox: &Sandbox, agent: &AgentProcess) -> anyhow::Result<usize> {
    use std::collections::BTreeSet;

    use socklb::{
        source::{files::read_folder, store_of},
        translate::{NodeInfo, translate_all},
    };
    let contents = read_folder(&sandbox.manifests())?;
    anyhow::ensure!(contents.errors.is_empty(), "{:?}", contents.errors);
    let mut objects = contents.services;
    objects.extend(contents.slices);
    let store = store_of(objects);
    // The agent runs without node flags: the default identity.
    let (desired, _) = translate_all(&store, &NodeInfo::default());
    let want: BTreeMap<ServicePortKey, Held> = desired
        .services
        .into_iter()
        .filter(|(_, d)| !d.frontends.is_empty())
        .map(|(k, d)| {
            let frontends = d.frontends.iter().map(|c| c.addr).collect();
            (k, (frontends, d.backends))
        })
        .collect();
    let held: BTreeMap<ServicePortKey, Held> = sandbox
        .services()?
        .into_iter()
        .map(|view| {
            let mut backends = view.active_backends();
            backends.sort_unstable();
            let frontends = view.frontends.iter().map(|f| f.frontend).collect();
            let key = view
                .service
                .ok_or_else(|| anyhow::anyhow!("backend set {} names no Service", view.id))?;
            Ok((key, (frontends, backends)))
        })
        .collect::<anyhow::Result<_>>()?;
    for (key, w) in &want {
        assert_eq!(held.get(key), Some(w), "{key} did not converge");
    }
    let stray: Vec<&ServicePortKey> = held.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        stray.is_empty(),
        "in the maps but in no manifest: {stray:?}"
    );
    let services: BTreeSet<_> = store.services().map(|s| s.key.clone()).collect();
    for svc in services.iter().filter(|s| !s.name.starts_with("extra-")) {
        let (e, _) = sandbox.explain_asking(&svc.to_string(), &agent.listen.to_string())?;
        assert_eq!(
            e.desired_digest, e.maps_digest,
            "{svc} did not converge: {}",
            e.verdict
        );
    }
    Ok(services.len())
}

#[test]
fn kill_9_at_random_moments_loses_nothing() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    restarts(3, 5_000)
}

#[test]
#[ignore = "long: cargo xtask stress"]
fn stress_restarts() -> anyhow::Result<()> {
    restarts(20, 100_000)
}

#[test]
fn a_service_that_does_not_fit_is_reported_and_the_others_work() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in ["10.244.1.21:8080", "10.244.2.34:8080", "10.244.3.47:8080"] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    let eps = |ips: &[&str]| ips.iter().map(|ip| Ep::ready(ip)).collect::<Vec<_>>();
    for (name, vip, ips) in [
        ("a", "10.96.0.91", vec!["10.244.1.21", "10.244.2.34"]),
        ("b", "10.96.0.92", vec!["10.244.3.47"]),
        (
            "c",
            "10.96.0.93",
            vec!["10.244.9.1", "10.244.9.2", "10.244.9.3"],
        ),
    ] {
        sandbox.write_manifest(
            &format!("{name}.yaml"),
            &format!(
                "{}---\n{}",
                service(name, vip, "http", "TCP", 80, "8080", &[]),
                slice(&format!("{name}-1"), name, "http", "TCP", 8080, &eps(&ips))
            ),
        )?;
    }
    // Room for 5 backends that may not grow (the ceiling at 0): a (2) and b (1) fit, c (3
    // more) does not.
    let agent = sandbox.start_agent(&AgentOptions {
        args: [
            "--max-backends",
            "5",
            "--max-frontends",
            "4",
            "--max-services",
            "4",
            "--max-map-memory",
            "0",
        ]
        .map(String::from)
        .to_vec(),
        ..AgentOptions::default()
    })?;
    let mut client = sandbox.client()?;
    assert_eq!(client.connect("10.96.0.91:80".parse()?, 10)?.answers(), 10);
    assert_eq!(client.connect("10.96.0.92:80".parse()?, 10)?.answers(), 10);
    assert_eq!(
        sandbox.candidates("10.96.0.93:80")?,
        None,
        "c is not half-written"
    );
    let stats: socklb::cli::Stats = sandbox.inspect_as(&["stats"])?;
    let maps: BTreeMap<String, (Option<u64>, u32)> = stats
        .maps
        .into_iter()
        .map(|m| (m.map, (m.entries, m.capacity)))
        .collect();
    assert_eq!(
        maps["BACKENDS"],
        (Some(3), 5),
        "only a's and b's backends, of 5"
    );
    assert_eq!(maps["FRONTENDS4"].0, Some(2));
    assert_eq!(maps["SERVICE_META"].0, Some(2));
    assert!(agent.metric("socklb_errors_total{kind=\"map_full\"}")? >= Some(1.0));
    assert_eq!(agent.metric("socklb_failing_service_ports")?, Some(1.0));
    assert_eq!(
        agent.metric("socklb_map_capacity{map=\"BACKENDS\"}")?,
        Some(5.0)
    );
    assert!(
        agent
            .log_tail(100)
            .contains("map BACKENDS has no free range of 3"),
        "{}",
        agent.log_tail(20)
    );
    let (e, ok) = sandbox.explain_asking("default/c", &agent.listen.to_string())?;
    assert!(!ok);
    assert_eq!(e.broken, socklb::explain::Link::Maps, "{}", e.verdict);
    assert!(
        e.verdict.contains("map BACKENDS has no free range of 3"),
        "{}",
        e.verdict
    );

    // b goes away: c fits now, and the agent's retry writes it.
    sandbox.remove_manifest("b.yaml")?;
    sandbox.wait_candidates(
        "10.96.0.93:80",
        &["10.244.9.1:8080", "10.244.9.2:8080", "10.244.9.3:8080"],
    )?;
    assert_eq!(client.connect("10.96.0.91:80".parse()?, 10)?.answers(), 10);
    Ok(())
}

#[test]
fn hostile_manifests_are_rejected_one_by_one_and_the_rest_works() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let svc = |name: &str, ip: &str, port: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: {port}}}]\n"
        )
    };
    let big = (0..10_000).fold(String::new(), |mut big, i| {
        let _ = writeln!(
            big,
            "- addresses: [\"10.{}.{}.{}\"]",
            120 + i / 65536,
            (i / 256) % 256,
            i % 256
        );
        big
    });
    let bad: Vec<(&str, Vec<u8>, &str)> = vec![
        ("non-utf8.yaml", b"apiVersion: v1\nkind: Service\nmetadata: {name: \xff\xfe}\n".to_vec(), "not UTF-8"),
        ("truncated.yaml", b"apiVersion: v1\nkind: Service\nmetadata: {name: cut, namespace: default}\nspec: {clusterIP: 10.96.1.1, ports: [{port: 8".to_vec(), "invalid YAML"),
        ("huge-name.yaml", svc(&"x".repeat(300), "10.96.1.2", "80").into_bytes(), "metadata.name"),
        ("bad-ip.yaml", svc("bad-ip", "10.96.1.300", "80").into_bytes(), "spec.clusterIP"),
        ("port-zero.yaml", svc("port-zero", "10.96.1.4", "0").into_bytes(), "spec.ports[0].port"),
        ("port-big.yaml", svc("port-big", "10.96.1.5", "65536").into_bytes(), "spec.ports[0].port"),
        ("wrong-family.yaml", slice("web-v5", "web", "http", "TCP", 8080, &[Ep::ready("10.244.1.21")]).replace("addressType: IPv4", "addressType: IPv5").into_bytes(), "addressType"),
        ("big-slice.yaml", format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: big, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n{big}").into_bytes(), "at most 1000"),
        ("duplicate.yaml", std::fs::read(examples().join("seed/service.yaml"))?, "also defined in"),
    ];
    for (name, bytes, _) in &bad {
        std::fs::write(sandbox.manifests().join(name), bytes)?;
    }
    // A conflicting slice (A not ready here, ready in the seed's) is no error: the endpoint
    // counts once, with its best conditions.
    sandbox.write_manifest(
        "conflicting.yaml",
        &slice(
            "web-other",
            "web",
            "http",
            "TCP",
            8080,
            &[Ep::terminating("10.244.1.21", false)],
        ),
    )?;
    // 10,000 endpoints in one service, in ten slices of a thousand: fine.
    for s in 0..10 {
        let eps: Vec<Ep> = (0..1000)
            .map(|i| Ep::ready(&format!("10.{}.{}.{}", 130 + s, i / 256, i % 256)))
            .collect();
        sandbox.write_manifest(
            &format!("many-{s}.yaml"),
            &slice(&format!("many-{s}"), "many", "http", "TCP", 8080, &eps),
        )?;
    }
    sandbox.write_manifest(
        "many.yaml",
        &service("many", "10.96.1.10", "http", "TCP", 80, "8080", &[]),
    )?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &["10.244.1.21:8080", "10.244.2.34:8080"])?;
    assert_eq!(
        sandbox.candidates("10.96.1.10:80")?.map(|c| c.len()),
        Some(10_000)
    );
    assert_eq!(
        sandbox
            .client()?
            .connect("10.96.0.10:80".parse()?, 20)?
            .answers(),
        20
    );
    let log = agent.log_tail(400);
    for (name, _, field) in &bad {
        assert!(
            log.lines().any(|l| l.contains(name) && l.contains(field)),
            "{name}: no rejection naming {field:?} in the log:\n{log}"
        );
    }
    assert!(agent.metric("socklb_rejected_objects_total")? >= Some(bad.len() as f64));
    let (_, body) = agent.get("/status")?;
    let status: socklb::status::Status = serde_json::from_str(&body)?;
    assert!(status.rejected.len() >= 6, "{status:?}");
    assert_eq!(agent.get("/healthz")?.0, 200);
    figure("hostile manifest files rejected", bad.len());
    Ok(())
}

fn cap_bits(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(u64::MAX)
}

#[test]
fn the_agent_keeps_only_the_capabilities_it_uses() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend("10.244.1.21:8080".parse()?, false)?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid().unwrap_or(0)))?;
    // CAP_NET_ADMIN 12, CAP_SYS_PTRACE 19, CAP_SYS_ADMIN 21, CAP_BPF 39 (socklb::agent::
    // CAPABILITIES_KEPT); not CAP_NET_BIND_SERVICE: the listeners are bound before the drop.
    let kept: u64 = (1 << 12) | (1 << 19) | (1 << 21) | (1 << 39);
    for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(cap_bits(&status, field), kept, "{field} {status}");
    }
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1'))
    );
    // And it still does its job: a change is written to the maps.
    sandbox.write_manifest(
        "endpointslice.yaml",
        &std::fs::read_to_string(examples().join("scenarios/000-after/endpointslice.yaml"))?,
    )?;
    sandbox.wait_candidates("10.96.0.10:80", &["10.244.2.34:8080"])?;
    Ok(())
}
