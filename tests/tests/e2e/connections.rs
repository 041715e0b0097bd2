//! Who is still connected: `socklb inspect connections`, `explain` and the live-socket metrics
//! against sockets the test holds (TCP and connected UDP, two client pods, one backend turning
//! terminating, then its connections closed), as the kernel allows and without the sockets
//! iterator (the per-namespace path a lockdown kernel takes).
use std::collections::BTreeMap;

use socklb::{
    explain::Explanation,
    sockets::view::{Condition, ConnectionsView},
};
use socklb_tests::{
    Sandbox,
    agent::{AgentOptions, AgentProcess},
    client::Command,
    manifests::{Ep, service, slice},
    sandbox::ClientPod,
};

const A: &str = "10.244.1.21";
const B: &str = "10.244.2.34";
const WEB: &str = "10.96.0.10:80";
const DNS: &str = "10.96.0.53:53";

/// `inspect connections -o json ARGS`.
fn inspect(
    sandbox: &Sandbox,
    agent: &AgentProcess,
    args: &[&str],
) -> anyhow::Result<ConnectionsView> {
    let listen = agent.listen.to_string();
    let mut all = vec![
        "--cgroup",
        sandbox.cgroup.to_str().unwrap_or_default(),
        "connections",
        "--agent",
        &listen,
    ];
    all.extend_from_slice(args);
    sandbox.inspect_as(&all)
}

/// `inspect` until `done` holds for its view (the agent answers from a census at most 2 s
/// old), at most 10 s; the last view.
fn inspect_until(
    sandbox: &Sandbox,
    agent: &AgentProcess,
    args: &[&str],
    done: impl Fn(&ConnectionsView) -> bool,
) -> anyhow::Result<ConnectionsView> {
    let start = std::time::Instant::now();
    loop {
        let view = inspect(sandbox, agent, args)?;
        if done(&view) || start.elapsed() > std::time::Duration::from_secs(10) {
            return Ok(view);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// (TCP, UDP) connections the view counts on `backend` of `service`, by client cgroup path.
fn counts(
    view: &ConnectionsView,
    service: &str,
    backend: &str,
) -> (usize, usize, BTreeMap<String, usize>) {
    let mut by_client = BTreeMap::new();
    let (mut tcp, mut udp) = (0, 0);
    for s in view.services.iter().filter(|s| {
        s.service
            .as_ref()
            .is_some_and(|k| k.service.to_string() == service)
    }) {
        for b in s
            .backends
            .iter()
            .filter(|b| b.backend.to_string() == backend)
        {
            tcp += b.tcp.values().sum::<usize>();
            udp += b.udp;
            for c in &b.clients {
                *by_client
                    .entry(c.cgroup.clone().unwrap_or_default())
                    .or_default() += c.total;
                assert!(
                    c.sockets.len() == c.total.min(socklb::sockets::view::SAMPLE),
                    "the sample holds the oldest {} of {}: {c:?}",
                    socklb::sockets::view::SAMPLE,
                    c.total
                );
            }
        }
    }
    (tcp, udp, by_client)
}

fn condition(view: &ConnectionsView, backend: &str) -> Option<Condition> {
    view.services
        .iter()
        .flat_map(|s| &s.backends)
        .find(|b| b.backend.to_string() == backend)
        .map(|b| b.condition)
}

fn web_slice(a: Ep) -> String {
    slice("web-1", "web", "http", "TCP", 8080, &[a, Ep::ready(B)])
}

fn world(agent_args: &[&str]) -> anyhow::Result<(Sandbox, AgentProcess, ClientPod, ClientPod)> {
    let sandbox = Sandbox::new()?;
    for ip in [A, B] {
        sandbox.add_backend(format!("{ip}:8080").parse()?, false)?;
        sandbox.add_backend(format!("{ip}:5353").parse()?, true)?;
    }
    sandbox.write_manifest(
        "web.yaml",
        &service("web", "10.96.0.10", "http", "TCP", 80, "8080", &[]),
    )?;
    sandbox.write_manifest("web-slice.yaml", &web_slice(Ep::ready(A)))?;
    sandbox.write_manifest(
        "dns.yaml",
        &service("dns", "10.96.0.53", "dns", "UDP", 53, "5353", &[]),
    )?;
    sandbox.write_manifest(
        "dns-slice.yaml",
        &slice(
            "dns-1",
            "dns",
            "dns",
            "UDP",
            5353,
            &[Ep::ready(A), Ep::ready(B)],
        ),
    )?;
    let agent = sandbox.start_agent(&AgentOptions::with_args(agent_args))?;
    sandbox.wait_candidates(WEB, &[&format!("{A}:8080"), &format!("{B}:8080")])?;
    let one = sandbox.served_pod("one", "10.244.0.11")?;
    let two = sandbox.served_pod("two", "10.244.0.12")?;
    Ok((sandbox, agent, one, two))
}

/// Opens connections from `client` until `want` of them reached `backend`; the others are
/// closed again. Returns the ids kept.
fn open_to(
    client: &mut socklb_tests::Client,
    target: &str,
    udp: bool,
    backend: &str,
    want: usize,
    first_id: u32,
) -> anyhow::Result<Vec<u32>> {
    let mut kept = Vec::new();
    for id in first_id..first_id + 200 {
        let r = client.run(&Command::Open {
            id,
            target: target.parse()?,
            udp,
        })?;
        anyhow::ensure!(r.ok, "open {target}: {r:?}");
        if r.backends.keys().any(|b| b.starts_with(backend)) {
            kept.push(id);
            if kept.len() == want {
                return Ok(kept);
            }
        } else {
            client.run(&Command::Close { id })?;
        }
    }
    anyhow::bail!("{want} connections to {backend} not reached")
}

fn scenario(agent_args: &[&str]) -> anyhow::Result<()> {
    let (sandbox, agent, one, two) = world(agent_args)?;
    let mut c1 = sandbox.client_in(&one)?;
    let mut c2 = sandbox.client_in(&two)?;
    // Pod one: 3 TCP to A, 1 TCP to B, 2 connected UDP to A. Pod two: 2 TCP to A.
    let one_a = open_to(&mut c1, WEB, false, A, 3, 1)?;
    open_to(&mut c1, WEB, false, B, 1, 300)?;
    open_to(&mut c1, DNS, true, A, 2, 600)?;
    let two_a = open_to(&mut c2, WEB, false, A, 2, 1)?;

    let a = format!("{A}:8080");
    // What `inspect` can list here: what the kernel lets it read through the pins the agent
    // made (with every optional part off, the agent pins no iterator: UDP sockets are not
    // listed, and the view says so).
    let listing = socklb::dataplane::pins::PinFolder::new(sandbox.pin_folder())
        .current_sockets()
        .expect("socket pins")
        .listing();
    let udp_held = if listing.udp() { 2 } else { 0 };
    // Where the agent cannot list (every part off), `inspect` lists alone, with conditions
    // from the maps.
    let claims = socklb_tests::features::Claims::of(&agent.status()?);
    let agent_lists = claims.tcp_listing || claims.udp_listing;
    let cond = |objects: Condition, maps: Condition| if agent_lists { objects } else { maps };
    let view = inspect_until(&sandbox, &agent, &[], |v| {
        counts(v, "default/web", &a).0 == 5
            && counts(v, "default/dns", &format!("{A}:5353")).1 == udp_held
    })?;
    if !listing.udp() {
        assert!(
            view.missing.iter().any(|m| m.starts_with("UDP sockets")),
            "the view says what it cannot list: {:?}",
            view.missing
        );
    }
    let (tcp, udp, clients) = counts(&view, "default/web", &a);
    assert_eq!((tcp, udp), (5, 0), "{view:#?}");
    assert_eq!(
        clients,
        BTreeMap::from([("/one".to_string(), 3), ("/two".to_string(), 2)]),
        "grouped by client pod"
    );
    assert_eq!(counts(&view, "default/web", &format!("{B}:8080")).0, 1);
    assert_eq!(
        counts(&view, "default/dns", &format!("{A}:5353")).1,
        udp_held
    );
    assert_eq!(
        condition(&view, &a),
        Some(cond(Condition::Ready, Condition::InSet))
    );
    let tcp_states: Vec<&String> = view
        .services
        .iter()
        .flat_map(|s| &s.backends)
        .flat_map(|b| b.tcp.keys())
        .collect();
    assert!(
        tcp_states.iter().all(|s| *s == "ESTABLISHED"),
        "{tcp_states:?}"
    );
    assert!(
        view.services
            .iter()
            .flat_map(|s| &s.backends)
            .flat_map(|b| &b.clients)
            .flat_map(|c| &c.sockets)
            .all(|s| s.age_s.is_some_and(|a| a < 30.0)),
        "every socket has an age, since it was opened in this test: {view:#?}"
    );

    terminating_then_drained(&sandbox, &agent, &mut (c1, c2), (one_a, two_a), agent_lists)
}

/// A turns terminating with its 5 TCP connections held (3 from pod one, 2 from pod two); then
/// they close and A is drained.
fn terminating_then_drained(
    sandbox: &Sandbox,
    agent: &AgentProcess,
    clients: &mut (socklb_tests::Client, socklb_tests::Client),
    held: (Vec<u32>, Vec<u32>),
    agent_lists: bool,
) -> anyhow::Result<()> {
    let a = format!("{A}:8080");
    let cond = |objects: Condition, maps: Condition| if agent_lists { objects } else { maps };
    let (c1, c2) = clients;
    let (one_a, two_a) = held;
    // A turns terminating: its connections stay, and say so; new ones go to B.
    sandbox.write_manifest("web-slice.yaml", &web_slice(Ep::terminating(A, false)))?;
    sandbox.wait_candidates(WEB, &[&format!("{B}:8080")])?;
    let view = inspect_until(sandbox, agent, &["default/web", "--backend", &a], |v| {
        condition(v, &a) == Some(cond(Condition::Terminating, Condition::NotInSet))
    })?;
    assert_eq!(view.services.len(), 1, "narrowed to default/web: {view:#?}");
    assert_eq!(counts(&view, "default/web", &a).0, 5);
    assert_eq!(
        condition(&view, &a),
        Some(cond(Condition::Terminating, Condition::NotInSet))
    );
    let metric = agent.metric(
        "socklb_live_sockets{service=\"default/web:http\",protocol=\"tcp\",condition=\"terminating\"}",
    )?;
    // The agent lists with the parts it runs with (`inspect` with what the kernel offers).
    let claims = socklb_tests::features::Claims::of(&agent.status()?);
    assert_eq!(metric, claims.tcp_listing.then_some(5.0));
    let (e, _) = sandbox.explain_asking("default/web", &agent.listen.to_string())?;
    let live = explain_live(&e, &a);
    assert_eq!((live.0, live.1), (5, false), "5 connections, not drained");

    // Without the agent: the same counts, conditions from the maps alone.
    let local: ConnectionsView = sandbox.inspect_as(&[
        "--cgroup",
        sandbox.cgroup.to_str().unwrap_or_default(),
        "connections",
        "default/web",
        "--agent",
        "127.0.0.1:1",
    ])?;
    assert!(!local.conditions_from_objects);
    assert_eq!(counts(&local, "default/web", &a).0, 5);
    assert_eq!(condition(&local, &a), Some(Condition::NotInSet));

    // Their connections closed, A is drained.
    for id in one_a {
        c1.run(&Command::Close { id })?;
    }
    for id in two_a {
        c2.run(&Command::Close { id })?;
    }
    let mut drained = (usize::MAX, false);
    for _ in 0..50 {
        let (e, _) = sandbox.explain_asking("default/web", &agent.listen.to_string())?;
        drained = explain_live(&e, &a);
        if drained == (0, true) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(drained, (0, true), "A drained");
    Ok(())
}

/// (connections, drained) explain reports for `backend`.
fn explain_live(e: &Explanation, backend: &str) -> (usize, bool) {
    let live = e.live.as_ref().expect("explain lists live connections");
    let ep = live
        .endpoints
        .iter()
        .find(|ep| ep.backend.to_string() == backend)
        .unwrap_or_else(|| panic!("{backend} in {live:#?}"));
    (ep.connections, ep.drained)
}

#[test]
fn live_connections_per_backend_and_pod() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    scenario(&[])
}

/// The same on the path a kernel that refuses the sockets iterator takes.
#[test]
fn live_connections_without_the_sockets_iterator() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    scenario(&["--disable-feature", "sockets-iterator"])
}
