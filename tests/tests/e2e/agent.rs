//! The agent as a user runs it: the Kubernetes API source (against a stand-in API server),
//! the manifests source, restarts under load, health/readiness/metrics, inspect and explain on
//! the seed scenarios, and who may read the pins.
use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt as _,
    time::{Duration, Instant},
};

use socklb::{
    explain::Link,
    translate::{Exclusion, Verdict},
    vocab::{ObjectKey, ObjectRef, ServicePortKey},
};
use socklb_tests::{
    Sandbox,
    agent::AgentOptions,
    apiserver::{ApiServer, Resource},
    churn::wall_ns,
    load::Load,
    manifests::{Ep, service, slice},
};

const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";
const C: &str = "10.244.3.47:8080";

use socklb_tests::examples;

fn backends(sandbox: &Sandbox) -> anyhow::Result<()> {
    for b in [A, B, C] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    Ok(())
}

/// The ids `inspect services` reports, by backend set.
fn service_ids(sandbox: &Sandbox) -> anyhow::Result<BTreeMap<ServicePortKey, u32>> {
    Ok(sandbox
        .services()?
        .into_iter()
        .filter_map(|s| Some((s.service?, s.id)))
        .collect())
}

#[test]
fn kubernetes_source_converges_follows_changes_and_recovers() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    let api = ApiServer::start()?;
    api.apply(&std::fs::read_to_string(
        examples().join("seed/service.yaml"),
    )?)?;
    api.apply(&std::fs::read_to_string(
        examples().join("seed/endpointslice.yaml"),
    )?)?;
    let agent = sandbox.start_agent_watching(&api, AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    let mut client = sandbox.client()?;
    assert_eq!(client.connect("10.96.0.10:80".parse()?, 20)?.answers(), 20);

    // Add, update, delete.
    api.apply(&service(
        "extra",
        "10.96.0.20",
        "http",
        "TCP",
        80,
        "8080",
        &[],
    ))?;
    api.apply(&slice(
        "extra-1",
        "extra",
        "http",
        "TCP",
        8080,
        &[Ep::ready("10.244.3.47")],
    ))?;
    sandbox.wait_candidates("10.96.0.20:80", &[C])?;
    api.apply(&std::fs::read_to_string(
        examples().join("scenarios/000-after/endpointslice.yaml"),
    )?)?;
    sandbox.wait_candidates("10.96.0.10:80", &[B])?;
    api.delete(Resource::Services, "default", "extra");
    sandbox.wait_gone("10.96.0.20:80")?;

    // The watch expires while a change happens: only a re-list can reveal it.
    let lists = api.requests("list services");
    api.expire(|api| {
        api.delete(Resource::EndpointSlices, "default", "web-abc12");
        api.apply(&service(
            "late",
            "10.96.0.21",
            "http",
            "TCP",
            80,
            "8080",
            &[],
        ))
        .expect("apply");
    });
    sandbox.wait_candidates("10.96.0.10:80", &[])?;
    sandbox.wait_candidates("10.96.0.21:80", &[])?;
    assert!(
        api.requests("list services") > lists,
        "410 Gone forced a re-list"
    );

    // The watch connection drops: the agent watches again from where it was.
    let watches = api.requests("watch endpointslices");
    api.drop_watches();
    api.apply(&std::fs::read_to_string(
        examples().join("seed/endpointslice.yaml"),
    )?)?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    assert!(api.requests("watch endpointslices") > watches);
    assert_eq!(client.connect("10.96.0.10:80".parse()?, 20)?.answers(), 20);
    assert_eq!(agent.get("/readyz")?.0, 200);
    Ok(())
}

/// How soon: `manifests::an_edit_reaches_the_maps_on_the_watchers_event`, which reads the maps
/// directly (here each look is a `socklb inspect` process).
#[test]
fn editing_a_manifest_changes_the_maps() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    for (file, expected) in [
        ("scenarios/000-after/endpointslice.yaml", vec![B]),
        ("seed/endpointslice.yaml", vec![A, B]),
    ] {
        sandbox.write_manifest(
            "endpointslice.yaml",
            &std::fs::read_to_string(examples().join(file))?,
        )?;
        sandbox.wait_candidates("10.96.0.10:80", &expected)?;
    }
    sandbox.remove_manifest("service.yaml")?;
    sandbox.wait_gone("10.96.0.10:80")?;
    Ok(())
}

/// kill -9 five times under a connect loop: every connect is answered, also the tens made
/// while no agent runs (counted per outage, from the kill to the new agent's readiness), a
/// change made while it is down is applied after, and service ids survive.
#[test]
fn kill_9_under_load_loses_no_connect_and_keeps_ids() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    sandbox.copy_manifests(&examples().join("scenarios/session-affinity"))?;
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    let ids = service_ids(&sandbox)?;

    let socket_pins = socklb::dataplane::pins::PinFolder::new(sandbox.pin_folder())
        .current_sockets()
        .expect("socket pins");
    let legacy_pin = socket_pins
        .dir
        .join(socklb::dataplane::pins::LEGACY_UDP_ITER_PIN);

    let load = Load::start(&sandbox, "10.96.0.10:80".parse()?, 1, 5_000)?;
    // Each outage: from the kill to the next agent's start (no agent process at all).
    let mut outages = Vec::new();
    for round in 0..5 {
        std::thread::sleep(Duration::from_millis(150));
        agent.kill9();
        let killed = wall_ns();
        if round == 0 {
            // What an agent of an older version leaves: its UDP iterator, whose entries have
            // another layout, at the old pin (any object will do: only the name counts).
            aya::maps::MapData::from_pin(socket_pins.dir.join("SOCKETS"))?.pin(&legacy_pin)?;
        }
        // While the agent is down, connects keep being translated by the pinned programs: the
        // outage lasts at least 100 ms and until ten connects made since the kill have been
        // answered (at most 5 s: a data path that stopped serving fails the count below).
        std::thread::sleep(Duration::from_millis(100));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while load.answered_since(killed)? < 10 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if round == 2 {
            // A change made while it is down is picked up after the restart.
            sandbox.write_manifest(
                "endpointslice.yaml",
                &std::fs::read_to_string(
                    examples().join("scenarios/000-after/endpointslice.yaml"),
                )?,
            )?;
        }
        outages.push((killed, wall_ns()));
        agent.restart(true)?;
    }
    let done = load.finish()?;
    assert_eq!(
        done.failed(),
        Vec::<&socklb_tests::load::Connect>::new(),
        "connects failed across restarts"
    );
    assert!(done.connects.len() >= 5_000, "{}", done.connects.len());
    for (i, (from, to)) in outages.iter().enumerate() {
        let during = done
            .connects
            .iter()
            .filter(|c| c.within(*from, *to))
            .count();
        println!(
            "FIGURE outage {i}: {during} connects answered in the {} ms no agent ran",
            (to - from) / 1_000_000
        );
        assert!(
            during >= 10,
            "outage {i}: only {during} connects ran while no agent did"
        );
    }
    sandbox.wait_candidates("10.96.0.10:80", &[B])?;
    assert_eq!(service_ids(&sandbox)?, ids, "service ids survive restarts");
    let log = agent.log_tail(400);
    assert!(log.contains("adopted pinned state"), "{log}");
    assert!(
        !legacy_pin.exists(),
        "the restarted agent removed the older agent's UDP iterator pin"
    );
    let programs: Vec<socklb::dataplane::loader::ProgramView> =
        sandbox.inspect_as(&["programs"])?;
    assert_eq!(
        programs.len(),
        socklb_tests::features::Claims::of(&agent.status()?).programs(),
        "one link per program, no leftovers"
    );
    Ok(())
}

#[test]
fn health_readiness_and_metrics() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    assert_eq!(agent.get("/healthz")?.0, 200);
    assert_eq!(agent.get("/readyz")?.0, 200);
    let mut client = sandbox.client()?;
    assert_eq!(client.connect("10.96.0.10:80".parse()?, 25)?.answers(), 25);
    let metric = |name: &str| agent.metric(name).ok().flatten();
    assert_eq!(metric("socklb_datapath_translations_total"), Some(25.0));
    assert_eq!(metric("socklb_service_ports"), Some(1.0));
    let backends = lb_common::MapId::Backends;
    assert_eq!(
        metric(&format!(
            "socklb_map_entries{{map=\"{}\"}}",
            backends.name()
        )),
        Some(2.0)
    );
    assert_eq!(
        metric(&format!(
            "socklb_map_capacity{{map=\"{}\"}}",
            backends.name()
        )),
        Some(f64::from(backends.default_capacity()))
    );
    assert!(metric("socklb_sync_duration_seconds_count") >= Some(1.0));
    assert!(metric("socklb_sync_lag_seconds").is_some());
    Ok(())
}

#[test]
fn a_bad_manifest_is_reported_and_the_rest_keeps_working() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    // A broken edit of the slice (a port out of range): the last good version stays in effect.
    sandbox.write_manifest(
        "endpointslice.yaml",
        &slice(
            "web-abc12",
            "web",
            "http",
            "TCP",
            8080,
            &[Ep::ready("10.244.1.21")],
        )
        .replace("port: 8080", "port: 80800"),
    )?;
    let start = Instant::now();
    while agent
        .metric("socklb_rejected_objects_total")?
        .unwrap_or(0.0)
        < 1.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no rejection counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        agent.log_tail(50).contains("ports[0].port"),
        "{}",
        agent.log_tail(10)
    );
    assert_eq!(
        sandbox.candidates("10.96.0.10:80")?.map(|c| c.len()),
        Some(2),
        "the last good slice is kept"
    );
    assert_eq!(
        sandbox
            .client()?
            .connect("10.96.0.10:80".parse()?, 10)?
            .answers(),
        10
    );
    // One endpoint whose address does not parse is left out, as kube-proxy does; the others
    // stay in service.
    sandbox.write_manifest(
        "endpointslice.yaml",
        &slice(
            "web-abc12",
            "web",
            "http",
            "TCP",
            8080,
            &[Ep::ready("10.244.1.21"), Ep::ready("10.244.2.34")],
        )
        .replace("10.244.1.21", "10.244.1.300"),
    )?;
    sandbox.wait_candidates("10.96.0.10:80", &[B])?;
    let (web, _) = sandbox.explain("default/web")?;
    let notes = web.translation.map(|t| t.notes).unwrap_or_default();
    assert!(
        notes.iter().any(|n| n.contains("10.244.1.300")),
        "the left-out endpoint is named: {notes:?}"
    );
    Ok(())
}

#[test]
fn inspect_and_explain_tell_the_seed_scenarios() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    sandbox.copy_manifests(&examples().join("scenarios/003-selector-typo"))?;
    sandbox.copy_manifests(&examples().join("scenarios/004-named-target-port"))?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;

    // inspect services: every frontend with its backend set and backends.
    let services = sandbox.services()?;
    let by_name = |ns: &str, name: &str| {
        services
            .iter()
            .find(|s| {
                s.service
                    .as_ref()
                    .is_some_and(|k| &*k.service.namespace == ns && &*k.service.name == name)
            })
            .unwrap_or_else(|| panic!("{ns}/{name} in inspect services: {services:?}"))
    };
    assert_eq!(by_name("default", "web").frontends[0].count, 2);
    assert_eq!(
        by_name("default", "shop").frontends[0].count,
        0,
        "the typo'd selector: no backend"
    );
    let notes = by_name("reading", "notes-api");
    assert_eq!(
        notes.active_backends(),
        [A.parse()?, B.parse()?],
        "targetPort http resolved to 8080"
    );

    // Seed 000 before: all links fine, digests equal.
    let (web, ok) = sandbox.explain("default/web")?;
    assert!(ok, "{}", web.verdict);
    assert_eq!(web.broken, Link::None);
    assert_eq!(web.desired_digest, web.maps_digest);
    assert_eq!(
        web.resource_version(&ObjectRef::service(ObjectKey::new("default", "web"))),
        Some("101")
    );

    // Seed 003: the empty endpoint set is the broken link; connects are refused.
    let (shop, ok) = sandbox.explain("10.96.0.30:80")?;
    assert!(!ok);
    assert_eq!(shop.broken, Link::Endpoints, "{}", shop.verdict);
    assert!(shop.verdict.contains("app=webs"), "{}", shop.verdict);
    let lookup = sandbox.lookup("10.96.0.30:80")?;
    assert!(
        lookup.verdict.contains("ECONNREFUSED"),
        "{}",
        lookup.verdict
    );
    let refused = sandbox.client()?.connect("10.96.0.30:80".parse()?, 2)?;
    assert_eq!(refused.errors.get("ECONNREFUSED"), Some(&2));

    // Seed 000 after: A terminating; explain shows why A is out and that the maps agree.
    sandbox.write_manifest(
        "endpointslice.yaml",
        &std::fs::read_to_string(examples().join("scenarios/000-after/endpointslice.yaml"))?,
    )?;
    sandbox.wait_candidates("10.96.0.10:80", &[B])?;
    let (web, ok) = sandbox.explain("default/web")?;
    assert!(ok, "{}", web.verdict);
    let translation = web.translation.expect("translation");
    let a_ip: std::net::IpAddr = "10.244.1.21".parse()?;
    let a = translation.ports[0]
        .endpoints
        .iter()
        .find(|e| e.address == Some(a_ip))
        .expect("A listed");
    assert!(
        matches!(a.verdict, Verdict::Excluded(Exclusion::Terminating { .. })),
        "{:?}",
        a.verdict
    );
    assert_eq!(web.maps[0].maps_backends, Some(vec![B.parse()?]));
    Ok(())
}

#[test]
fn pins_are_root_only_and_reset_removes_everything() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
    let pins = sandbox.pin_folder();
    let maps = socklb::dataplane::pins::PinFolder::new(&pins)
        .current()
        .expect("a map generation");
    assert_eq!(mode(&pins)?, 0o700);
    assert_eq!(mode(&maps)?, 0o700);
    assert_eq!(
        mode(&maps.join(lb_common::MapId::Frontends4.name()))?,
        0o600
    );
    assert_eq!(
        mode(&pins.join("links").join(lb_common::program::CONNECT4))?,
        0o600
    );

    // Stopping the agent keeps the programs serving; reset removes them.
    let links = socklb_tests::features::Claims::of(&agent.status()?).programs();
    agent.stop()?;
    let programs: Vec<socklb::dataplane::loader::ProgramView> =
        sandbox.inspect_as(&["programs"])?;
    assert_eq!(programs.len(), links);
    let out = std::process::Command::new(socklb_tests::bins::socklb()?)
        .args(["reset", "--bpffs"])
        .arg(&pins)
        .output()?;
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("detached {links} program link(s)")),
        "{said}"
    );
    assert!(!pins.exists());
    let outside = sandbox.client()?.connect("10.96.0.10:80".parse()?, 1)?;
    assert_eq!(
        outside.errors.get("ENETUNREACH"),
        Some(&1),
        "no longer translated"
    );
    Ok(())
}

/// Deletes a key that is not in FRONTENDS6 through `map` (with aya): ENOENT if the descriptor
/// may write, EPERM if it may not.
fn delete_missing_key(map: aya::maps::MapData) -> std::io::Error {
    let mut frontends: aya::maps::HashMap<_, lb_common::FrontendKey, lb_common::Frontend> =
        aya::maps::Map::from_map_data(map)
            .and_then(aya::maps::HashMap::try_from)
            .expect("FRONTENDS6 is a hash map");
    // An address no frontend has (the all-ones IPv6 address, port 0).
    let key = lb_common::FrontendKey {
        addr: [u32::MAX; 4],
        ..lb_common::FrontendKey::default()
    };
    match frontends.remove(&key) {
        Err(aya::maps::MapError::SyscallError(e)) => e.io_error,
        other => panic!("deleting a key that is not there: {other:?}"),
    }
}

#[test]
fn inspect_opens_the_maps_read_only() -> anyhow::Result<()> {
    use socklb::dataplane::bpf::open_map;
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    let dir = socklb::dataplane::pins::PinFolder::new(sandbox.pin_folder())
        .current()
        .expect("a map generation");
    let writable = open_map(&dir, lb_common::MapId::Frontends6, false)?;
    let read_only = open_map(&dir, lb_common::MapId::Frontends6, true)?;
    assert_eq!(
        delete_missing_key(writable).raw_os_error(),
        Some(libc::ENOENT),
        "the agent's kind of descriptor reaches the map"
    );
    assert_eq!(
        delete_missing_key(read_only).raw_os_error(),
        Some(libc::EPERM),
        "inspect's descriptor cannot write"
    );
    // And inspect itself still reads through it.
    assert_eq!(sandbox.services()?.len(), 1);
    Ok(())
}

/// A control-plane upgrade: the API server goes away for 10 s and comes back, once with its
/// history (watches resume) and once with a fresh watch cache (410 Gone, re-list). The data
/// path keeps translating throughout, and a change made at its return reaches the maps within
/// 5 s both times (the watches' retries stay short and reset on success).
#[test]
fn changes_reach_the_maps_within_5_s_of_the_api_servers_return() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    let api = ApiServer::start()?;
    api.apply(&std::fs::read_to_string(
        examples().join("seed/service.yaml"),
    )?)?;
    api.apply(&std::fs::read_to_string(
        examples().join("seed/endpointslice.yaml"),
    )?)?;
    let agent = sandbox.start_agent_watching(&api, AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.10:80", &[A, B])?;
    let mut client = sandbox.client()?;
    for (keep_history, endpoints) in [(true, [B, C]), (false, [A, C])] {
        api.stop();
        std::thread::sleep(Duration::from_secs(10));
        assert_eq!(
            client.connect("10.96.0.10:80".parse()?, 10)?.answers(),
            10,
            "the data path translates while the API server is away"
        );
        api.restart(keep_history)?;
        let ips: Vec<&str> = endpoints
            .iter()
            .map(|e| e.split(':').next().unwrap_or_default())
            .collect();
        api.apply(&slice(
            "web-abc12",
            "web",
            "http",
            "TCP",
            8080,
            &[Ep::ready(ips[0]), Ep::ready(ips[1])],
        ))?;
        let back = Instant::now();
        let mut want: Vec<String> = endpoints.iter().map(|e| (*e).to_string()).collect();
        want.sort();
        loop {
            let mut got = sandbox.candidates("10.96.0.10:80")?.unwrap_or_default();
            got.sort();
            if got == want {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(5),
                "history kept: {keep_history}; maps hold {got:?} {:.1} s after the API server came back",
                back.elapsed().as_secs_f64()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "FIGURE API server back after 10 s away (history kept: {keep_history}): the change reached the maps {:.2} s after its return",
            back.elapsed().as_secs_f64()
        );
    }
    // Ready again once every watch answers (within a few seconds of the return).
    let start = Instant::now();
    while agent.get("/readyz")?.0 != 200 {
        assert!(start.elapsed() < Duration::from_secs(10), "not ready again");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
