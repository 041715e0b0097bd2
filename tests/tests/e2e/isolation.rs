//! Tenant isolation (the threat model in RELIABILITY.md): a Service author in one namespace
//! cannot take another Service's address, and one pod cannot degrade the translation of others.
//! Each test names the hole it proves closed.
use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

use socklb::status::Status;
use socklb_tests::{
    Sandbox,
    agent::{AgentOptions, AgentProcess},
    apiserver::ApiServer,
    client::Command,
    manifests::{Ep, Meta, service, service_object, slice, slice_object},
};

const VICTIM: &str = "10.96.0.10";
const VICTIM_BACKEND: &str = "10.244.1.21:8080";
const THIEF_BACKEND: &str = "10.244.2.34:8080";

/// A Service `name` in `namespace` (with uid and creation time) and its one-endpoint slice.
fn owned_service(
    namespace: &str,
    name: &str,
    cluster_ip: &str,
    extra: &[&str],
    uid: &str,
    created: &str,
    backend: &str,
) -> String {
    let meta = Meta::default().namespace(namespace);
    let address_line = format!("clusterIP: \"{cluster_ip}\"");
    let mut spec = vec![
        address_line.as_str(),
        "ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]",
    ];
    spec.extend(extra);
    let svc = service_object(name, &meta.clone().uid(uid).created(created), &spec, &[]);
    let ip = backend.split(':').next().unwrap_or_default();
    let sl = slice_object(
        &format!("{name}-1"),
        &meta,
        name,
        "[{name: http, protocol: TCP, port: 8080}]",
        &[Ep::ready(ip).yaml()],
    );
    format!("{svc}---\n{sl}")
}

fn backends(sandbox: &Sandbox) -> anyhow::Result<()> {
    for b in [VICTIM_BACKEND, THIEF_BACKEND, "10.244.3.47:8080"] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    Ok(())
}

/// Which backends answer at `target`.
fn answered_by(sandbox: &Sandbox, target: &str, count: usize) -> anyhow::Result<BTreeSet<String>> {
    let reply = sandbox.client()?.connect(target.parse()?, count)?;
    anyhow::ensure!(reply.failures() == 0, "{target}: {:?}", reply.errors);
    Ok(reply.backends.keys().cloned().collect())
}

fn status(agent: &AgentProcess) -> anyhow::Result<Status> {
    Ok(serde_json::from_str(&agent.get("/status")?.1)?)
}

fn wait_for(what: &str, mut check: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let start = Instant::now();
    while !check()? {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(10),
            "waited for {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

/// CVE-2020-8554 class: a Service in another namespace lists the victim's ClusterIP as an
/// externalIP, or gets it as a load-balancer ingress IP. Whatever the namespace names (the
/// thief's sorts before and after `kube-system`), and whether the thief was there at start
/// (full sync) or arrives later (incremental), the ClusterIP keeps its own backends; the losing
/// claim is reported in /status, counted and logged once.
#[test]
fn a_service_cannot_take_another_services_cluster_ip() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let mut attempts = 0;
    for thief_ns in ["aaa", "zzz"] {
        for how in ["externalIPs", "loadBalancer"] {
            let thief_spec: Vec<String> = match how {
                "externalIPs" => vec![format!("externalIPs: [\"{VICTIM}\"]")],
                _ => vec!["type: LoadBalancer".into()],
            };
            let thief_status =
                format!("status:\n  loadBalancer:\n    ingress: [{{ip: \"{VICTIM}\"}}]\n");
            let thief = |ns: &str| -> String {
                let spec: Vec<&str> = thief_spec.iter().map(String::as_str).collect();
                let mut y = owned_service(
                    ns,
                    "thief",
                    "10.96.0.66",
                    &spec,
                    // An older Service with a smaller uid: only the ClusterIP rule protects.
                    "00000000-0000-0000-0000-000000000001",
                    "2001-01-01T00:00:00Z",
                    THIEF_BACKEND,
                );
                if how == "loadBalancer" {
                    let (svc, rest) = y.split_once("---\n").unwrap_or_default();
                    y = format!("{svc}{thief_status}---\n{rest}");
                }
                y
            };
            let victim = owned_service(
                "kube-system",
                "dns",
                VICTIM,
                &[],
                "ffffffff-0000-0000-0000-000000000009",
                "2024-01-01T00:00:00Z",
                VICTIM_BACKEND,
            );
            for incremental in [false, true] {
                let case = format!("{how} from namespace {thief_ns}, incremental={incremental}");
                let sandbox = Sandbox::new()?;
                backends(&sandbox)?;
                sandbox.write_manifest("victim.yaml", &victim)?;
                if !incremental {
                    sandbox.write_manifest("thief.yaml", &thief(thief_ns))?;
                }
                let agent = sandbox.start_agent(&AgentOptions::default())?;
                if incremental {
                    sandbox.write_manifest("thief.yaml", &thief(thief_ns))?;
                    sandbox.wait_candidates("10.96.0.66:80", &[THIEF_BACKEND])?;
                }
                assert_eq!(
                    answered_by(&sandbox, &format!("{VICTIM}:80"), 20)?,
                    BTreeSet::from([VICTIM_BACKEND.to_string()]),
                    "{case}: the ClusterIP was taken"
                );
                let lookup = sandbox.lookup(&format!("{VICTIM}:80"))?;
                assert_eq!(
                    lookup.service.map(|k| k.service.to_string()).as_deref(),
                    Some("kube-system/dns"),
                    "{case}"
                );
                wait_for("the conflict in /status", || {
                    Ok(status(&agent)?.conflicts.iter().any(|c| {
                        c.service_port.service.to_string() == format!("{thief_ns}/thief")
                            && c.conflict.owner.service.to_string() == "kube-system/dns"
                    }))
                })?;
                assert_eq!(
                    agent.metric("socklb_address_conflicts")?,
                    Some(1.0),
                    "{case}"
                );
                let log = agent.log_tail(200);
                assert_eq!(
                    log.matches("address not served").count(),
                    1,
                    "{case}: logged once per change:\n{log}"
                );
                // Explain names the owner.
                let (e, _) = sandbox
                    .explain_asking(&format!("{thief_ns}/thief"), &agent.listen.to_string())?;
                assert!(
                    e.verdict.contains("kube-system/dns"),
                    "{case}: {}",
                    e.verdict
                );
                attempts += 1;
            }
        }
    }
    println!(
        "FIGURE ClusterIP takeover attempts (externalIPs and LB ingress, namespaces before and after kube-system, full sync and incremental): {attempts}, taken: 0"
    );
    Ok(())
}

/// Two non-ClusterIP claims on one address: the older Service wins, not the one whose name
/// sorts first; when the owner goes, the other gets it.
#[test]
fn between_external_claims_the_older_service_wins() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    let shared = "198.51.100.7";
    // "aaa/new" sorts first but is younger; "zzz/old" is older.
    sandbox.write_manifest(
        "new.yaml",
        &owned_service(
            "aaa",
            "new",
            "10.96.0.71",
            &[&format!("externalIPs: [\"{shared}\"]")],
            "1",
            "2025-01-01T00:00:00Z",
            THIEF_BACKEND,
        ),
    )?;
    sandbox.write_manifest(
        "old.yaml",
        &owned_service(
            "zzz",
            "old",
            "10.96.0.72",
            &[&format!("externalIPs: [\"{shared}\"]")],
            "2",
            "2020-01-01T00:00:00Z",
            VICTIM_BACKEND,
        ),
    )?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    let target = format!("{shared}:80");
    sandbox.wait_candidates(&target, &[VICTIM_BACKEND])?;
    assert_eq!(
        answered_by(&sandbox, &target, 10)?,
        BTreeSet::from([VICTIM_BACKEND.to_string()])
    );
    sandbox.remove_manifest("old.yaml")?;
    sandbox.wait_candidates(&target, &[THIEF_BACKEND])?;
    Ok(())
}

/// `--external-ips ignore`: no Service's externalIPs are served, as with the
/// `DenyServiceExternalIPs` admission plugin.
#[test]
fn external_ips_can_be_ignored_entirely() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    sandbox.write_manifest(
        "svc.yaml",
        &owned_service(
            "default",
            "web",
            "10.96.0.81",
            &["externalIPs: [\"198.51.100.8\"]"],
            "1",
            "2020-01-01T00:00:00Z",
            VICTIM_BACKEND,
        ),
    )?;
    let _agent = sandbox.start_agent(&AgentOptions::with_args(["--external-ips", "ignore"]))?;
    sandbox.wait_candidates("10.96.0.81:80", &[VICTIM_BACKEND])?;
    assert_eq!(sandbox.candidates("198.51.100.8:80")?, None);
    let r = sandbox.client()?.connect("198.51.100.8:80".parse()?, 2)?;
    assert_eq!(r.errors.get("ENETUNREACH"), Some(&2), "left untouched");
    Ok(())
}

const UDP_VIP: &str = "10.96.0.53";
const UDP_BACKENDS: [&str; 2] = ["10.244.1.21:5353", "10.244.2.34:5353"];

/// A sandbox with a UDP service (two backends), a TCP service (three), and two more pods
/// under the attached cgroup.
fn shared_world() -> anyhow::Result<(Sandbox, AgentProcess)> {
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    for b in UDP_BACKENDS {
        sandbox.add_backend(b.parse()?, true)?;
    }
    sandbox.write_manifest(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service("dns", UDP_VIP, "dns", "UDP", 53, "5353", &[]),
            slice(
                "dns-1",
                "dns",
                "dns",
                "UDP",
                5353,
                &[Ep::ready("10.244.1.21"), Ep::ready("10.244.2.34")]
            )
        ),
    )?;
    sandbox.write_manifest(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service("web", "10.96.0.10", "http", "TCP", 80, "8080", &[]),
            slice(
                "web-1",
                "web",
                "http",
                "TCP",
                8080,
                &[
                    Ep::ready("10.244.1.21"),
                    Ep::ready("10.244.2.34"),
                    Ep::ready("10.244.3.47")
                ]
            )
        ),
    )?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    Ok((sandbox, agent))
}

/// The other pod's view: unconnected and connected UDP replies come from the service address,
/// getpeername reports it, TCP spreads over every backend.
fn translation_is_correct(client: &mut socklb_tests::Client) -> anyhow::Result<()> {
    let vip: SocketAddr = format!("{UDP_VIP}:53").parse()?;
    let unconnected = client.run(&Command::SendTo {
        target: vip,
        count: 20,
        id: None,
    })?;
    assert_eq!(unconnected.failures(), 0, "{:?}", unconnected.errors);
    assert_eq!(
        unconnected.peer_names.keys().collect::<Vec<_>>(),
        [&vip.to_string()],
        "unconnected UDP replies come from the service address"
    );
    let connected = client.run(&Command::Connect {
        target: vip,
        count: 20,
        udp: true,
    })?;
    assert_eq!(connected.failures(), 0, "{:?}", connected.errors);
    assert_eq!(
        connected.peer_names.keys().collect::<Vec<_>>(),
        [&vip.to_string()]
    );
    let tcp = client.connect("10.96.0.10:80".parse()?, 60)?;
    assert_eq!(tcp.failures(), 0, "{:?}", tcp.errors);
    assert_eq!(tcp.backends.len(), 3, "TCP spread: {:?}", tcp.backends);
    assert_eq!(
        tcp.peer_names.keys().collect::<Vec<_>>(),
        [&"10.96.0.10:80".to_string()],
        "getpeername reports the service"
    );
    Ok(())
}

/// One tenant holds far more translated sockets than the old node-wide table had room for
/// (131,072): each record lives in its own socket's storage, so another pod's translation is
/// unaffected and nothing is refused.
#[test]
fn a_tenant_holding_many_sockets_does_not_degrade_another() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let held = std::env::var("SOCKLB_HELD_SOCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(140_000usize);
    let (sandbox, _agent) = shared_world()?;
    let other_pod = sandbox.served_pod("other", "10.244.100.2")?;
    // A connected UDP socket takes a local port of its network namespace (at most ~64,000 with
    // the widest port range), and a process holds at most its hard RLIMIT_NOFILE (20,000 in some
    // containers; raising it needs CAP_SYS_RESOURCE): the tenant runs as many pods and processes
    // as it takes.
    let per_pod = 60_000usize;
    let per_process = usize::try_from(nofile_hard_limit()?.saturating_sub(100))?;
    let mut greedy = Vec::new();
    let mut holding = 0;
    let start = Instant::now();
    let mut pods = 0;
    while holding < held {
        let pod = sandbox.served_pod(
            &format!("greedy{pods}"),
            &format!("10.244.101.{}", pods + 1),
        )?;
        pods += 1;
        sandbox.netns_sysctl(&pod.netns, "net.ipv4.ip_local_port_range=1024 65535")?;
        let in_pod = per_pod.min(held - holding);
        let mut pod_holds = 0;
        while pod_holds < in_pod {
            let count = per_process.min(in_pod - pod_holds);
            let mut client = sandbox.client_in(&pod)?;
            let r = client.run(&Command::Hold {
                target: format!("{UDP_VIP}:53").parse()?,
                count,
            })?;
            assert_eq!(r.backends.get("held"), Some(&count), "{:?}", r.errors);
            pod_holds += count;
            greedy.push(client);
        }
        holding += pod_holds;
    }
    let took = start.elapsed();
    let mut other = sandbox.client_in(&other_pod)?;
    let records: Vec<socklb::cli::SocketRow> = sandbox.inspect_as(&["sockets"])?;
    assert!(records.len() >= held, "{} records", records.len());
    translation_is_correct(&mut other)?;
    let stats: socklb::cli::Stats = sandbox.inspect_as(&["stats"])?;
    let failed = stats.counters.iter().find(|(n, _)| n == "record_failed");
    assert_eq!(failed.map(|(_, v)| *v), Some(0));
    println!(
        "FIGURE greedy tenant: {holding} connected UDP sockets held in {pods} pods by {} processes (opened in {:.1} s), {} per-socket records, record_failed 0; the other pod's UDP replies, getpeername and TCP spread correct",
        greedy.len(),
        took.as_secs_f64(),
        records.len()
    );
    for mut client in greedy {
        client.run(&Command::Release)?;
    }
    Ok(())
}

fn nofile_hard_limit() -> anyhow::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall writing into a valid struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(limit.rlim_max)
}

/// When a pod's sockets cannot hold a record (here: its network namespace allows almost no
/// socket option memory), its translations that need one fail with ENOBUFS, counted, rather
/// than let replies come back from an address it never dialled; the other pod is untouched.
/// Where the release program runs, a connect (TCP, or a connected UDP socket) keeps its record
/// in its preallocated slot and needs no socket memory; an unconnected UDP socket's always
/// needs it.
#[test]
fn a_pod_out_of_socket_memory_fails_explicitly_alone() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let (sandbox, agent) = shared_world()?;
    let starved_pod = sandbox.served_pod("starved", "10.244.100.3")?;
    let other_pod = sandbox.served_pod("other", "10.244.100.4")?;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &starved_pod.netns])
        .args(["sysctl", "-q", "-w", "net.core.optmem_max=64"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut starved = sandbox.client_in(&starved_pod)?;
    let slots = socklb_tests::features::Claims::of(&agent.status()?).socket_release;
    let enobufs = |r: &socklb_tests::client::Reply, what: &str| {
        if slots {
            assert_eq!(r.failures(), 0, "{what} in slots: {:?}", r.errors);
        } else {
            assert_eq!(
                r.errors.get("errno 105"),
                Some(&5),
                "{what}: {:?}",
                r.errors
            );
        }
    };
    enobufs(&starved.connect("10.96.0.10:80".parse()?, 5)?, "TCP");
    let udp_vip: std::net::SocketAddr = format!("{UDP_VIP}:53").parse()?;
    enobufs(
        &starved.run(&Command::Connect {
            target: udp_vip,
            count: 5,
            udp: true,
        })?,
        "connected UDP",
    );
    let r = starved.run(&Command::SendTo {
        target: udp_vip,
        count: 5,
        id: None,
    })?;
    assert_eq!(
        r.errors.get("errno 105"),
        Some(&5),
        "unconnected UDP: {:?}",
        r.errors
    );
    let failed = agent.metric("socklb_datapath_record_failed_total")?;
    let refused = if slots { 5.0 } else { 15.0 };
    assert!(failed >= Some(refused), "{failed:?}");
    let mut other = sandbox.client_in(&other_pod)?;
    translation_is_correct(&mut other)?;
    println!(
        "FIGURE starved pod: {0} of 5 TCP connects and {0} of 5 connected UDP connects failed (a connect's record takes a preallocated slot where the release program runs), 5 of 5 unconnected UDP datagrams failed with ENOBUFS, socklb_datapath_record_failed_total {1}; the other pod correct",
        if slots { 0 } else { 5 },
        failed.unwrap_or(0.0)
    );
    Ok(())
}

/// Session affinity: a pod that uses more affinity services than its table holds replaces only
/// its own entries (counted); another pod stays on its backend.
#[test]
fn a_pod_with_many_affinity_services_only_evicts_its_own() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    let services = lb_common::AFFINITY_WAYS + 8;
    for i in 0..services {
        let name = format!("sticky-{i}");
        sandbox.write_manifest(
            &format!("{name}.yaml"),
            &format!(
                "{}---\n{}",
                service(
                    &name,
                    &format!("10.96.7.{}", i + 1),
                    "http",
                    "TCP",
                    80,
                    "8080",
                    &["sessionAffinity: ClientIP"]
                ),
                slice(
                    &format!("{name}-1"),
                    &name,
                    "http",
                    "TCP",
                    8080,
                    &[
                        Ep::ready("10.244.1.21"),
                        Ep::ready("10.244.2.34"),
                        Ep::ready("10.244.3.47")
                    ]
                )
            ),
        )?;
    }
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let calm_pod = sandbox.served_pod("calm", "10.244.100.5")?;
    let busy_pod = sandbox.served_pod("busy", "10.244.100.6")?;
    let mut calm = sandbox.client_in(&calm_pod)?;
    let mut busy = sandbox.client_in(&busy_pod)?;
    let first = calm.connect("10.96.7.1:80".parse()?, 10)?;
    assert_eq!(first.backends.len(), 1, "sticky: {:?}", first.backends);
    for round in 0..3 {
        for i in 0..services {
            let r = busy.connect(format!("10.96.7.{}:80", i + 1).parse()?, 2)?;
            assert_eq!(r.failures(), 0, "round {round}: {:?}", r.errors);
        }
    }
    let again = calm.connect("10.96.7.1:80".parse()?, 10)?;
    assert_eq!(
        again.backends, first.backends,
        "the calm pod kept its backend"
    );
    let evictions = agent.metric("socklb_datapath_affinity_evictions_total")?;
    assert!(
        evictions >= Some(1.0),
        "the busy pod's own evictions are counted"
    );
    println!(
        "FIGURE affinity: a pod cycling through {services} sticky services (its table holds {}) evicted {} of its own entries; the other pod kept its backend",
        lb_common::AFFINITY_WAYS,
        evictions.unwrap_or(0.0)
    );
    Ok(())
}

/// Stale UDP socket termination touches only sockets socklb translated: a pod's connected UDP
/// socket straight to a pod IP (a headless Service's endpoint, a `StatefulSet` peer) survives
/// the backend leaving a Service, while the socket that went through the Service is ended.
#[test]
fn udp_termination_leaves_direct_pod_flows_alone() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let (sandbox, _agent) = shared_world()?;
    let mut client = sandbox.client()?;
    let backend: SocketAddr = UDP_BACKENDS[0].parse()?;
    // Through the service, until it lands on UDP_BACKENDS[0].
    let mut via_service = None;
    for id in 1..50 {
        let r = client.run(&Command::Open {
            id,
            target: format!("{UDP_VIP}:53").parse()?,
            udp: true,
        })?;
        if r.backends.contains_key(&backend.to_string()) {
            via_service = Some(id);
            break;
        }
    }
    let via_service = via_service.expect("a socket on the first backend");
    let direct = client.run(&Command::Open {
        id: 100,
        target: backend,
        udp: true,
    })?;
    assert!(direct.ok, "{direct:?}");
    // The first backend leaves the service.
    sandbox.write_manifest(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service("dns", UDP_VIP, "dns", "UDP", 53, "5353", &[]),
            slice(
                "dns-1",
                "dns",
                "dns",
                "UDP",
                5353,
                &[Ep::ready("10.244.2.34")]
            )
        ),
    )?;
    sandbox.wait_candidates(&format!("{UDP_VIP}:53/udp"), &[UDP_BACKENDS[1]])?;
    let mut ended = false;
    let left = Instant::now();
    for i in 0..60 {
        let r = client.run(&Command::Exchange {
            id: via_service,
            msg: format!("ping {i}"),
        })?;
        if !r.ok {
            ended = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ended, "the translated socket was not terminated");
    let took = left.elapsed();
    for i in 0..5 {
        let r = client.run(&Command::Exchange {
            id: 100,
            msg: format!("direct {i}"),
        })?;
        assert!(r.ok, "the direct socket was touched: {r:?}");
    }
    println!(
        "FIGURE UDP termination: the socket translated to the removed backend was ended {} ms after the maps dropped its backend (at the first exchange); the direct socket to the same pod answered 5 of 5",
        took.as_millis()
    );
    Ok(())
}

/// A second agent on the same pin folder (a surge during a rollout, a debug run) refuses to
/// start, naming the first, and changes nothing.
#[test]
fn a_second_agent_on_the_same_pins_refuses() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let (sandbox, first) = shared_world()?;
    let second = std::process::Command::new(socklb_tests::bins::socklb()?)
        .args(["agent", "--manifests"])
        .arg(sandbox.manifests())
        .arg("--cgroup")
        .arg(&sandbox.cgroup)
        .arg("--bpffs")
        .arg(sandbox.pin_folder())
        .args([
            "--health-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .output()?;
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("another socklb agent")
            && said.contains(&format!("pid {}", first.pid().unwrap_or(0))),
        "{said}"
    );
    let programs: Vec<socklb::dataplane::loader::ProgramView> =
        sandbox.inspect_as(&["programs"])?;
    let claims = socklb_tests::features::Claims::of(&first.status()?);
    assert_eq!(programs.len(), claims.programs());
    let mut client = sandbox.client()?;
    translation_is_correct(&mut client)?;
    Ok(())
}

/// Backend sets shrink and grow thousands of times (through the API stand-in, as fast as the
/// agent takes them) while three client processes connect in loops: no connect fails, and
/// every connect lands on an endpoint its Service had while the connect ran (the timeline
/// oracle: each set's window runs from its write to the maps holding a later one, watched
/// every millisecond). A second Service churns beside it on a pod of its own, so ranges are
/// freed and reused by another set all along: a connect that read a range after it was reused
/// would land on that pod, outside the first Service's set. (Ranges in use are never written,
/// freed ones wait.)
#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: two Services churning under load, then the timeline's verdict"
)]
fn no_connect_fails_or_leaves_its_set_while_backend_sets_shrink_and_grow() -> anyhow::Result<()> {
    use socklb::vocab::{Protocol, ServiceAddr};
    use socklb_tests::churn::{Watcher, check, timeline, wall_ns};
    // The other Service's pods: never a backend of `web`.
    const OUTSIDE: [&str; 2] = ["10.244.4.58:8080", "10.244.5.69:8080"];

    socklb_tests::require_privileges!();
    let cycles: usize = std::env::var("SOCKLB_STORM_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let sandbox = Sandbox::new()?;
    backends(&sandbox)?;
    for b in OUTSIDE {
        sandbox.add_backend(b.parse()?, false)?;
    }
    let api = ApiServer::start()?;
    let three = [
        Ep::ready("10.244.1.21"),
        Ep::ready("10.244.2.34"),
        Ep::ready("10.244.3.47"),
    ];
    let others = [Ep::ready("10.244.4.58"), Ep::ready("10.244.5.69")];
    api.apply(&service(
        "web",
        "10.96.0.10",
        "http",
        "TCP",
        80,
        "8080",
        &[],
    ))?;
    api.apply(&slice("web-1", "web", "http", "TCP", 8080, &three))?;
    api.apply(&service(
        "other",
        "10.96.0.11",
        "http",
        "TCP",
        80,
        "8080",
        &[],
    ))?;
    api.apply(&slice("other-1", "other", "http", "TCP", 8080, &others))?;
    let agent = sandbox.start_agent_watching(&api, AgentOptions::default())?;
    sandbox.wait_candidates("10.96.0.11:80", &["10.244.4.58:8080", "10.244.5.69:8080"])?;
    let vip: SocketAddr = "10.96.0.10:80".parse()?;
    let frontend = ServiceAddr::new(vip.ip(), vip.port(), Protocol::Tcp);
    let names =
        |eps: &[Ep]| -> BTreeSet<String> { eps.iter().map(|e| format!("{}:8080", e.ip)).collect() };

    let watcher = Watcher::start(&sandbox, frontend)?;
    let stop = sandbox.workdir.join("stop");
    let mut loads = Vec::new();
    let mut records = Vec::new();
    for i in 0..3 {
        let mut client = sandbox.client()?;
        let (out, stop) = (sandbox.workdir.join(format!("record-{i}")), stop.clone());
        records.push(out.clone());
        loads.push(std::thread::spawn(move || {
            client.run(&Command::Record {
                target: vip,
                out,
                stop,
                min_count: 1,
                max_seconds: 600,
            })
        }));
    }
    let subsets: [&[Ep]; 4] = [&three[..2], &three[1..], &three[..1], &three];
    // Each write of `web`'s slice, in order: when, and the set it names.
    let mut written: Vec<(u64, BTreeSet<String>)> = vec![(0, names(&three))];
    let start = Instant::now();
    for c in 0..cycles {
        let set = subsets[c % subsets.len()];
        written.push((wall_ns(), names(set)));
        api.apply(&slice("web-1", "web", "http", "TCP", 8080, set))?;
        let other: &[Ep] = if c % 2 == 0 { &others[..1] } else { &others };
        api.apply(&slice("other-1", "other", "http", "TCP", 8080, other))?;
        std::thread::sleep(Duration::from_millis(2));
    }
    // Let the agent catch up with the last change, then stop the load.
    sandbox.wait_candidates(
        "10.96.0.10:80",
        &["10.244.1.21:8080", "10.244.2.34:8080", "10.244.3.47:8080"],
    )?;
    std::fs::write(&stop, "")?;
    let mut connects = 0;
    let mut failures = 0;
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    for load in loads {
        let reply = load.join().expect("load thread")?;
        connects += reply.answers() + reply.failures();
        failures += reply.failures();
        for (e, n) in reply.errors {
            *errors.entry(e).or_default() += n;
        }
    }
    let seen = watcher.stop()?;
    let timeline = timeline(&written, &seen);
    let mut misrouted = 0;
    let mut during = 0;
    let mut examples = Vec::new();
    let mut outside = BTreeSet::new();
    for record in &records {
        let v = check(record, &timeline)?;
        misrouted += v.misrouted;
        during += v.during_changes;
        examples.extend(v.examples);
        outside.extend(
            v.backends
                .keys()
                .filter(|b| OUTSIDE.contains(&b.as_str()))
                .cloned(),
        );
    }
    let elapsed = start.elapsed();
    println!(
        "FIGURE storm: {cycles} shrink/grow cycles of two Services in {:.1}s, {connects} connects from 3 processes ({during} while sets changed), {failures} failed, {misrouted} to a backend not in the set then; {} distinct sets seen in the maps",
        elapsed.as_secs_f64(),
        seen.len()
    );
    assert!(
        outside.is_empty(),
        "connects reached another Service's pods: {outside:?}"
    );
    assert_eq!(
        misrouted, 0,
        "connects to a backend not in the set then: {examples:?}"
    );
    assert_eq!(failures, 0, "failed connects: {errors:?}");
    assert!(connects > 1000, "the load ran: {connects} connects");
    assert!(
        during > 1000,
        "the load ran while the sets changed: {during}"
    );
    assert!(
        seen.len() > cycles / 10,
        "the watcher saw the sets change: {} of {cycles}",
        seen.len()
    );
    assert!(
        agent.metric("socklb_datapath_faults_total")? == Some(0.0),
        "no frontend ever pointed at a missing backend"
    );
    Ok(())
}
