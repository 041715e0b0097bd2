//! The data path on real sockets, for IPv4 and IPv6: spread, connection stickiness, reverse
//! translation, refusals, session affinity, UDP socket termination, IPv4-mapped destinations,
//! and the verifier's verdict on every program.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    thread::sleep,
    time::Duration,
};

use anyhow::Context as _;
use lb_common::{
    Counter, DatapathConfig, Frontend, Frontend4Key, FrontendKey, IndexEntry, IndexEntry6, MapId,
    index,
};
use socklb::{
    cli::{AffinityRow, SocketRow, Stats},
    dataplane::loader::ProgramView,
    explain::{Link, ReadFrom},
    vocab::{Protocol, ServiceAddr},
};
use socklb_tests::{
    Client, Sandbox,
    agent::{AgentOptions, AgentProcess},
    client::{Command, Reply},
    manifests::{Ep, service, slice},
    privileged,
    stats::{chi_square_critical_p1e6, chi_square_uniform},
};

/// One address family's addresses in the sandbox.
struct Net {
    vip: &'static str,
    backends: [&'static str; 3],
    client: &'static str,
}

const V4: Net = Net {
    vip: "10.96.0.10",
    backends: ["10.244.1.21", "10.244.2.34", "10.244.3.47"],
    client: "10.244.0.2",
};

const V6: Net = Net {
    vip: "fd00:96::10",
    backends: ["fd00:244::1:21", "fd00:244::2:34", "fd00:244::3:47"],
    client: "fd00:244::2",
};

const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 53;
const TARGET: u16 = 8080;

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("IP"), port)
}

impl Net {
    fn vip(&self, port: u16) -> SocketAddr {
        addr(self.vip, port)
    }

    fn backend(&self, i: usize) -> SocketAddr {
        addr(self.backends[i], TARGET)
    }

    fn backend_str(&self, i: usize) -> String {
        self.backend(i).to_string()
    }

    /// `socklb inspect lookup` syntax.
    fn lookup(&self, port: u16, udp: bool) -> String {
        format!("{}{}", self.vip(port), if udp { "/udp" } else { "" })
    }

    fn client_prefix(&self) -> String {
        addr(self.client, 1)
            .to_string()
            .trim_end_matches(":1")
            .to_string()
            + ":"
    }
}

/// A sandbox with `backends` (indexes into the net's three), an agent, and one Service named
/// `svc` on the VIP: TCP port 80 or UDP port 53, both to target port 8080. The agent is dropped
/// before the sandbox: a failing test prints its log from the sandbox's folder, and the
/// sandbox's teardown finds its pins free.
struct World<'n> {
    net: &'n Net,
    agent: AgentProcess,
    sandbox: Sandbox,
    udp: bool,
}

impl<'n> World<'n> {
    fn new(
        net: &'n Net,
        udp: bool,
        backends: &[usize],
        extra: &[&'static str],
    ) -> anyhow::Result<Self> {
        Self::with_agent(net, udp, backends, extra, &[])
    }

    /// The same, the agent started with `agent_args` too.
    fn with_agent(
        net: &'n Net,
        udp: bool,
        backends: &[usize],
        extra: &[&'static str],
        agent_args: &[&str],
    ) -> anyhow::Result<Self> {
        let sandbox = Sandbox::new()?;
        for i in 0..3 {
            sandbox.add_backend(net.backend(i), udp)?;
        }
        let (protocol, port) = if udp {
            ("UDP", UDP_PORT)
        } else {
            ("TCP", TCP_PORT)
        };
        sandbox.write_manifest(
            "svc.yaml",
            &service(
                "svc",
                net.vip,
                "p",
                protocol,
                port,
                &TARGET.to_string(),
                extra,
            ),
        )?;
        let world_slice = slice_yaml(net, udp, backends);
        sandbox.write_manifest("slice.yaml", &world_slice)?;
        let agent = sandbox.start_agent(&AgentOptions::with_args(agent_args))?;
        let w = Self {
            net,
            agent,
            sandbox,
            udp,
        };
        w.wait(backends)?;
        Ok(w)
    }

    fn port(&self) -> u16 {
        if self.udp { UDP_PORT } else { TCP_PORT }
    }

    /// Rewrites the slice to hold `backends` and waits until the maps say so.
    fn set_backends(&self, backends: &[usize]) -> anyhow::Result<()> {
        self.sandbox
            .write_manifest("slice.yaml", &slice_yaml(self.net, self.udp, backends))?;
        self.wait(backends)
    }

    fn wait(&self, backends: &[usize]) -> anyhow::Result<()> {
        let expected: Vec<String> = backends.iter().map(|i| self.net.backend_str(*i)).collect();
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        self.sandbox
            .wait_candidates(&self.net.lookup(self.port(), self.udp), &expected)
    }

    fn client(&self) -> anyhow::Result<Client> {
        self.sandbox.client()
    }
}

fn slice_yaml(net: &Net, udp: bool, backends: &[usize]) -> String {
    let eps: Vec<Ep> = backends
        .iter()
        .map(|i| Ep::ready(net.backends[*i]))
        .collect();
    slice(
        "svc-1",
        "svc",
        "p",
        if udp { "UDP" } else { "TCP" },
        TARGET,
        &eps,
    )
}

/// A data path counter as `socklb inspect stats` reports it.
fn counter(stats: &Stats, counter: Counter) -> Option<u64> {
    stats
        .counters
        .iter()
        .find(|(name, _)| name == counter.name())
        .map(|(_, v)| *v)
}

/// Opens socket `id` (connected UDP, or a TCP connection) to the service's port for it, which
/// must answer.
fn open(client: &mut Client, net: &Net, id: u32, udp: bool) -> anyhow::Result<Reply> {
    let r = client.run(&Command::Open {
        id,
        target: net.vip(if udp { UDP_PORT } else { TCP_PORT }),
        udp,
    })?;
    assert!(r.ok, "{r:?}");
    Ok(r)
}

/// The single backend that answered, failing if several did.
fn only_backend(reply: &Reply) -> String {
    assert_eq!(
        reply.backends.len(),
        1,
        "one backend expected: {:?}",
        reply.backends
    );
    reply.backends.keys().next().cloned().unwrap_or_default()
}

fn backend_index(net: &Net, backend: &str) -> usize {
    (0..3)
        .find(|i| net.backend_str(*i) == backend)
        .expect("a known backend")
}

/// 10,000 connects over 3 backends: a uniform spread (chi-square at p = 10^-6), every connect
/// answered, getpeername reports the service, the backend sees the client's own address.
fn spread(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, false, &[0, 1, 2], &[])?;
    let mut client = w.client()?;
    let n = 10_000;
    let reply = client.connect(net.vip(TCP_PORT), n)?;
    assert_eq!(reply.failures(), 0, "errors: {:?}", reply.errors);
    assert_eq!(reply.answers(), n);
    let counts: Vec<usize> = (0..3)
        .map(|i| {
            reply
                .backends
                .get(&net.backend_str(i))
                .copied()
                .unwrap_or(0)
        })
        .collect();
    let chi2 = chi_square_uniform(&counts);
    eprintln!("spread over 3 backends: {counts:?}, chi-square {chi2:.2}");
    assert!(
        chi2 < chi_square_critical_p1e6(2),
        "not uniform: {counts:?} (chi-square {chi2:.2})"
    );
    assert_eq!(
        reply.peer_names.get(&net.vip(TCP_PORT).to_string()),
        Some(&n)
    );
    let prefix = net.client_prefix();
    assert!(
        reply.seen_as.keys().all(|a| a.starts_with(&prefix)),
        "backends saw {:?}",
        reply.seen_as.keys().take(3).collect::<Vec<_>>()
    );
    Ok(())
}

/// A connection keeps its backend, and keeps talking to it, after that backend leaves the
/// service; new connections no longer reach it.
fn established_connection_stays(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, false, &[0, 1, 2], &[])?;
    let mut client = w.client()?;
    let opened = open(&mut client, net, 1, false)?;
    let pinned = only_backend(&opened);
    assert_eq!(
        opened.peer_names.keys().next(),
        Some(&net.vip(TCP_PORT).to_string())
    );
    let others: Vec<usize> = (0..3).filter(|i| net.backend_str(*i) != pinned).collect();
    w.set_backends(&others)?;

    let fresh = client.connect(net.vip(TCP_PORT), 300)?;
    assert_eq!(fresh.failures(), 0);
    assert!(
        !fresh.backends.contains_key(&pinned),
        "new connects reached the removed backend"
    );
    for round in 0..3 {
        let r = client.run(&Command::Exchange {
            id: 1,
            msg: format!("still there {round}"),
        })?;
        assert!(r.ok, "the established connection broke: {r:?}");
        assert_eq!(only_backend(&r), pinned, "the connection moved");
    }
    Ok(())
}

/// UDP: recvfrom on an unconnected socket reports the service address, the backend sees the
/// client's address, and the socket keeps its backend across sendmsg calls; connected UDP
/// sockets report the service through getpeername.
fn udp_reverse_translation_and_stickiness(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, true, &[0, 1, 2], &[])?;
    let mut client = w.client()?;
    let vip = net.vip(UDP_PORT);
    let r = client.run(&Command::SendTo {
        target: vip,
        count: 30,
        id: Some(7),
    })?;
    assert_eq!(r.failures(), 0, "{r:?}");
    assert_eq!(
        r.peer_names.get(&vip.to_string()),
        Some(&30),
        "recvfrom source: {:?}",
        r.peer_names
    );
    let prefix = net.client_prefix();
    assert!(
        r.seen_as.keys().all(|a| a.starts_with(&prefix)),
        "{:?}",
        r.seen_as
    );
    let first = only_backend(&r);

    // The backend leaves: the same socket re-picks, and sticks to the new one.
    let others: Vec<usize> = (0..3).filter(|i| net.backend_str(*i) != first).collect();
    w.set_backends(&others)?;
    let r = client.run(&Command::SendTo {
        target: vip,
        count: 30,
        id: Some(7),
    })?;
    assert_eq!(r.failures(), 0, "{r:?}");
    let second = only_backend(&r);
    assert_ne!(second, first);

    // Connected UDP: a fresh socket each time, spread, peer reported as the service.
    let r = client.run(&Command::Connect {
        target: vip,
        count: 40,
        udp: true,
    })?;
    assert_eq!(r.failures(), 0, "{r:?}");
    assert_eq!(
        r.backends.len(),
        2,
        "spread over the remaining backends: {:?}",
        r.backends
    );
    assert_eq!(r.peer_names.get(&vip.to_string()), Some(&40));
    Ok(())
}

/// A service without a backend refuses at once: ECONNREFUSED for TCP connect, UDP connect and
/// UDP sendmsg; the no-backend counter says so.
fn refused_without_backends(net: &Net) -> anyhow::Result<()> {
    let tcp = World::new(net, false, &[], &[])?;
    let mut client = tcp.client()?;
    let r = client.connect(net.vip(TCP_PORT), 3)?;
    assert_eq!(r.errors.get("ECONNREFUSED"), Some(&3), "TCP: {r:?}");

    let udp = World::new(net, true, &[], &[])?;
    let mut client = udp.client()?;
    let vip = net.vip(UDP_PORT);
    let r = client.run(&Command::Connect {
        target: vip,
        count: 3,
        udp: true,
    })?;
    assert_eq!(
        r.errors.get("ECONNREFUSED"),
        Some(&3),
        "connected UDP: {r:?}"
    );
    let r = client.run(&Command::SendTo {
        target: vip,
        count: 3,
        id: None,
    })?;
    assert_eq!(r.errors.get("ECONNREFUSED"), Some(&3), "sendto: {r:?}");
    let stats: Stats = udp.sandbox.inspect_as(&["stats"])?;
    assert_eq!(
        counter(&stats, Counter::NoBackend),
        Some(6),
        "the data path counted the refusals: {stats:?}"
    );
    Ok(())
}

/// sessionAffinity ClientIP: the client stays on one backend while it keeps using it, gets a
/// fresh choice once the timeout passes unused, and moves when its backend leaves.
fn session_affinity(net: &Net) -> anyhow::Result<()> {
    let w = World::new(
        net,
        false,
        &[0, 1, 2],
        &[
            "sessionAffinity: ClientIP",
            "sessionAffinityConfig: {clientIP: {timeoutSeconds: 1}}",
        ],
    )?;
    let mut client = w.client()?;
    let vip = net.vip(TCP_PORT);
    let held = client.connect(vip, 30)?;
    let pinned = only_backend(&held);
    // Used again within the timeout: still the same backend.
    sleep(Duration::from_millis(500));
    assert_eq!(only_backend(&client.connect(vip, 10)?), pinned);

    // Left unused past the timeout, each time: a fresh random choice. Ten rounds all landing on
    // one of three backends by chance has probability 3^-9.
    let mut seen = BTreeSet::new();
    for _ in 0..10 {
        sleep(Duration::from_millis(1300));
        seen.insert(only_backend(&client.connect(vip, 1)?));
    }
    assert!(seen.len() > 1, "affinity never expired: {seen:?}");

    // The pinned backend leaves: the client moves, and sticks to its new backend.
    let now = only_backend(&client.connect(vip, 1)?);
    let others: Vec<usize> = (0..3).filter(|i| net.backend_str(*i) != now).collect();
    w.set_backends(&others)?;
    let moved = client.connect(vip, 20)?;
    let new = only_backend(&moved);
    assert_ne!(new, now);
    assert!(others.contains(&backend_index(net, &new)));
    let affinity: Vec<AffinityRow> = w.sandbox.inspect_as(&["affinity"])?;
    let new: SocketAddr = new.parse()?;
    assert!(
        affinity.iter().any(|e| e.backend == Some(new)),
        "the affinity map records the client's backend: {affinity:?}"
    );
    Ok(())
}

/// An affinity choice's last use is stamped on the clock the agent and `inspect affinity` read
/// (`record_clock_now`, the kernel's last tick): each connect here is made between two reads of
/// that clock, and its entry's stamp falls between them. On the precise clock, which runs up to
/// a tick ahead of the coarse one, most stamps would fall after the second read, and an idle
/// time computed from them would read too short.
fn an_affinity_choice_is_stamped_on_the_records_clock(net: &Net) -> anyhow::Result<()> {
    use aya::maps::{HashMap, Map, MapData};
    use lb_common::{AffinityTable, MapId};
    const CONNECTS: usize = 20;
    let w = World::new(net, false, &[0, 1, 2], &["sessionAffinity: ClientIP"])?;
    let maps = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current()
        .context("a map generation pinned")?;
    let tables: HashMap<MapData, u64, AffinityTable> = HashMap::try_from(Map::from_map_data(
        MapData::from_pin(maps.join(MapId::Affinity.name()))?,
    )?)?;
    let last_use = || -> anyhow::Result<u64> {
        let mut latest = 0;
        for table in &tables {
            let (_, table) = table?;
            for e in table.entries.iter().filter(|e| e.service_id != 0) {
                latest = latest.max(e.last_used_ns);
            }
        }
        Ok(latest)
    };
    let now = || u64::try_from(socklb::sockets::record_clock_now().as_nanos()).expect("ns");
    let mut client = w.client()?;
    let vip = net.vip(TCP_PORT);
    for i in 0..CONNECTS {
        let before = now();
        assert_eq!(client.connect(vip, 1)?.answers(), 1);
        let after = now();
        let stamp = last_use()?;
        assert!(
            (before..=after).contains(&stamp),
            "connect {i}: made between {before} and {after} ns, its affinity entry says {stamp}"
        );
    }
    Ok(())
}

/// A connected UDP socket whose backend leaves is terminated, so the application sees an
/// error instead of sending into the void. Where the agent runs without a way to find such
/// sockets (an optional part refused or turned off), it says so, and the socket keeps its old
/// endpoint, exactly as that claim promises.
fn connected_udp_socket_terminated(net: &Net) -> anyhow::Result<()> {
    udp_termination(net, &[], false)
}

/// Issue 27.4: the backend leaves while no agent runs (killed; its pins stay). The restarted
/// agent's first sync reconciles what changed meanwhile, UDP termination included: the socket
/// is terminated at once, not at the next change (kube-proxy's first sync after a restart
/// clears stale UDP entries too).
fn connected_udp_socket_terminated_across_a_restart(net: &Net) -> anyhow::Result<()> {
    udp_termination(net, &[], true)
}

/// The same where the kernel refuses the sockets iterator (as a lockdown kernel does): the
/// agent finds the sockets namespace by namespace (the UDP iterator) and terminates them all
/// the same.
fn connected_udp_socket_terminated_without_the_sockets_iterator(net: &Net) -> anyhow::Result<()> {
    udp_termination(net, &["--disable-feature", "sockets-iterator"], false)
}

fn udp_termination(net: &Net, agent_args: &[&str], across_restart: bool) -> anyhow::Result<()> {
    let mut w = World::with_agent(net, true, &[0, 1, 2], &[], agent_args)?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    let mut client = w.client()?;
    let opened = open(&mut client, net, 1, true)?;
    let pinned = only_backend(&opened);
    let others: Vec<usize> = (0..3).filter(|i| net.backend_str(*i) != pinned).collect();
    let restarted = std::time::Instant::now();
    if across_restart {
        w.agent.kill9();
        w.sandbox
            .write_manifest("slice.yaml", &slice_yaml(w.net, w.udp, &others))?;
        // The frozen maps still send new sockets to the backend that left; the socket
        // opened before keeps talking to it.
        assert!(
            client
                .run(&Command::Exchange {
                    id: 1,
                    msg: "still".into()
                })?
                .ok
        );
        w.agent.restart(true)?;
        w.wait(&others)?;
    } else {
        w.set_backends(&others)?;
    }

    let mut error = None;
    for i in 0..60 {
        let r = client.run(&Command::Exchange {
            id: 1,
            msg: format!("ping {i}"),
        })?;
        if !r.ok {
            error = r.errors.keys().next().cloned();
            break;
        }
        sleep(Duration::from_millis(50));
    }
    if !claims.udp_termination {
        socklb_tests::features::fallback(
            "udp_termination",
            "no UDP termination: checked that the socket stays on the endpoint that left",
        );
        // The named loss: the socket stays on the endpoint that left (its pod still answers).
        assert_eq!(error, None, "terminated although the agent says it cannot");
        assert_eq!(
            w.agent.metric("socklb_udp_sockets_terminated_total")?,
            Some(0.0)
        );
        return Ok(());
    }
    // SOCK_DESTROY aborts the socket: a blocked recv gets ECONNABORTED, and the socket is
    // disconnected, so the next send gets EDESTADDRREQ. Either way the application knows.
    assert!(
        matches!(error.as_deref(), Some("ECONNABORTED" | "EDESTADDRREQ")),
        "the stale UDP socket was not terminated: {error:?}"
    );
    // The agent counts a socket after destroying it, so the application can see the error
    // first: wait for the count.
    let counted = std::time::Instant::now();
    let mut terminated = w.agent.metric("socklb_udp_sockets_terminated_total")?;
    while terminated < Some(1.0) && counted.elapsed() < Duration::from_secs(5) {
        sleep(Duration::from_millis(50));
        terminated = w.agent.metric("socklb_udp_sockets_terminated_total")?;
    }
    assert!(terminated >= Some(1.0), "metric: {terminated:?}");
    if across_restart {
        println!(
            "FIGURE a connected UDP socket whose backend left while the agent was down: terminated {:.1} s after the agent was started again",
            restarted.elapsed().as_secs_f64()
        );
    }
    // A new connected socket works and avoids the removed backend.
    let r = client.run(&Command::Connect {
        target: net.vip(UDP_PORT),
        count: 10,
        udp: true,
    })?;
    assert_eq!(r.failures(), 0);
    assert!(!r.backends.contains_key(&pinned));
    Ok(())
}

/// `inspect connections` lists the connected UDP sockets a client holds through a service:
/// each under the backend that answered it, with the client's own address, the service address
/// it dialled and its state. (IPv4 sockets' addresses come from the UDP iterator, IPv6 ones
/// from `sock_diag`, where the kernel has the UDP iterator; from `sock_diag` everywhere else.)
fn connected_udp_sockets_listed(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, true, &[0, 1, 2], &[])?;
    let mut client = w.client()?;
    let mut opened = std::collections::BTreeMap::<String, usize>::new();
    for id in 1..=6 {
        let r = open(&mut client, net, id, true)?;
        *opened.entry(only_backend(&r)).or_default() += 1;
    }
    // Listed by `inspect` itself (no agent answers on port 1): what the kernel holds now.
    let view: socklb::sockets::view::ConnectionsView = w.sandbox.inspect_as(&[
        "--cgroup",
        w.sandbox.cgroup.to_str().unwrap_or_default(),
        "connections",
        "--agent",
        "127.0.0.1:1",
    ])?;
    let listing = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current_sockets()
        .expect("socket pins")
        .listing();
    if !listing.udp() {
        socklb_tests::features::fallback(
            "connected_udp_sockets_listed",
            "no UDP listing: checked that the view lists none and says so",
        );
        // Every optional part off: the view lists no UDP socket, and says so.
        assert!(
            view.missing.iter().any(|m| m.starts_with("UDP sockets")),
            "{:?}",
            view.missing
        );
        assert!(
            view.services
                .iter()
                .flat_map(|s| &s.backends)
                .all(|b| b.udp == 0)
        );
        return Ok(());
    }
    let mut listed = std::collections::BTreeMap::new();
    let mut cookies = BTreeSet::new();
    for b in view.services.iter().flat_map(|s| &s.backends) {
        *listed.entry(b.backend.to_string()).or_default() += b.udp;
        for socket in b.clients.iter().flat_map(|c| &c.sockets) {
            assert_eq!(socket.state, "connected", "{socket:?}");
            assert_eq!(socket.local.ip(), net.client.parse::<std::net::IpAddr>()?);
            assert_ne!(socket.local.port(), 0, "{socket:?}");
            assert_eq!(
                socket.frontend.map(|f| f.to_string()),
                Some(format!("{}/UDP", net.vip(UDP_PORT))),
                "{socket:?}"
            );
            assert!(cookies.insert(socket.cookie), "listed once: {socket:?}");
        }
    }
    assert_eq!(listed, opened, "{view:#?}");
    assert_eq!(cookies.len(), 6);
    Ok(())
}

/// How many connection slots are held now, read from the sandbox's pinned maps at each call.
fn held_slots(w: &World) -> impl Fn() -> Result<usize, socklb::sockets::ListError> + use<> {
    let pins = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current_sockets()
        .expect("socket pins");
    move || socklb::sockets::held_slots(&pins)
}

/// A connected UDP socket keeps its record in a connection slot, which it gives back when it
/// closes, also after it was disconnected (`connect(AF_UNSPEC)`, which no hook sees) or
/// connected again to an address no service has.
fn connected_udp_slot_freed(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, true, &[0, 1, 2], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    let held = held_slots(&w);
    let mut client = w.client()?;
    let before = held()?;
    for id in [1, 2, 3] {
        open(&mut client, net, id, true)?;
    }
    if !claims.socket_release {
        socklb_tests::features::fallback(
            "connected_udp_slot_freed",
            "no release program: checked that no slot is taken (records in socket storage)",
        );
        // No release program, no slots: the records are in socket storage.
        assert_eq!(held()?, before);
        return Ok(());
    }
    assert_eq!(held()?, before + 3, "one slot per connected socket");
    let r = client.run(&Command::Reconnect {
        id: 1,
        target: None,
    })?;
    assert!(r.ok, "{r:?}");
    // The pod's own loopback, a port no service or backend uses (a UDP connect sends nothing).
    let elsewhere = SocketAddr::new(
        if net.vip.contains(':') {
            std::net::Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        },
        9,
    );
    let r = client.run(&Command::Reconnect {
        id: 2,
        target: Some(elsewhere),
    })?;
    assert!(r.ok, "{r:?}");
    for id in [1, 2, 3] {
        client.run(&Command::Close { id })?;
    }
    assert_eq!(held()?, before, "every slot freed at close");
    Ok(())
}

/// A connection's record is stamped on the clock the agent's census and recount read
/// (`record_clock_now`): a record stamped before a count read that clock was made before it.
/// So a census never expects to find (and frees the slot of) a connection made while it runs,
/// and a recount never counts such a record twice. Each connection here is made between two
/// reads of that clock: the census's own question (which TCP slots were taken before a moment)
/// must leave it out at the first and count it at the second. On another clock (the precise
/// one against the kernel's last tick, or the other way round) most of them fall on the wrong
/// side of one read or the other.
fn a_record_is_stamped_on_the_census_clock(net: &Net) -> anyhow::Result<()> {
    const CONNECTIONS: u32 = 20;
    let w = World::new(net, false, &[0], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    if !claims.socket_release {
        socklb_tests::features::fallback(
            "a_record_is_stamped_on_the_census_clock",
            "no release program, no slots: the records are in socket storage",
        );
        return Ok(());
    }
    let pins = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current_sockets()
        .context("socket pins")?;
    let now = || u64::try_from(socklb::sockets::record_clock_now().as_nanos()).expect("ns");
    let slots_before =
        |at: u64| socklb::sockets::listing::tcp_slots_before(&pins, at).map(|s| s.len());
    let mut client = w.client()?;
    for id in 0..CONNECTIONS {
        let before = now();
        open(&mut client, net, id, false)?;
        let after = now();
        let made = id as usize;
        assert_eq!(
            slots_before(before)?,
            made,
            "connection {id}: made after {before} ns, yet its slot reads as older"
        );
        assert_eq!(
            slots_before(after + 1)?,
            made + 1,
            "connection {id}: made by {after} ns, yet its slot reads as younger"
        );
    }
    Ok(())
}

/// A TCP connect that fails after the hook took its connection slot gives the slot back when
/// the socket closes. Here the only backend has no route from the client's namespace, so the
/// kernel's connect fails before it sets the peer (a blocking connect refused or timed out, or
/// `connect(AF_UNSPEC)`, clears it the same way): the release program once skipped a TCP
/// socket with no peer, and each failed connect kept a slot for ever. Nothing leaves the
/// sandbox: the route lookup fails in the client's namespace.
fn tcp_slot_freed_after_a_failed_connect(net: &Net) -> anyhow::Result<()> {
    const FAILED: usize = 20;
    let w = World::new(net, false, &[0], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    let held = held_slots(&w);
    let unroutable = if net.vip.contains(':') {
        "fd00:250::7"
    } else {
        "10.250.0.7"
    };
    w.sandbox.write_manifest(
        "slice.yaml",
        &slice("svc-1", "svc", "p", "TCP", TARGET, &[Ep::ready(unroutable)]),
    )?;
    let backend = addr(unroutable, TARGET).to_string();
    w.sandbox
        .wait_candidates(&net.lookup(TCP_PORT, false), &[backend.as_str()])?;
    let mut client = w.client()?;
    let stats: Stats = w.sandbox.inspect_as(&["stats"])?;
    let translated = counter(&stats, Counter::Translations).unwrap_or(0);
    let before = held()?;
    let r = client.connect(net.vip(TCP_PORT), FAILED)?;
    assert_eq!(r.errors.get("ENETUNREACH"), Some(&FAILED), "{r:?}");
    let stats: Stats = w.sandbox.inspect_as(&["stats"])?;
    assert_eq!(
        counter(&stats, Counter::Translations),
        Some(translated + FAILED as u64),
        "each connect was translated (and took a slot) before the kernel's connect failed"
    );
    assert_eq!(
        held()?,
        before,
        "no slot kept by a failed connect's closed socket"
    );
    // Control: a connect that succeeds holds a slot while its socket is open (where the release
    // program runs; without it there are no slots, and records live in socket storage).
    w.set_backends(&[0])?;
    open(&mut client, net, 1, false)?;
    let while_open = if claims.socket_release {
        before + 1
    } else {
        socklb_tests::features::fallback(
            "tcp_slot_freed_after_a_failed_connect",
            "no release program: checked that no slot is taken",
        );
        before
    };
    assert_eq!(held()?, while_open, "an open connection holds its slot");
    client.run(&Command::Close { id: 1 })?;
    assert_eq!(held()?, before, "and gives it back at close");
    Ok(())
}

/// A TCP connection to a service that is disconnected (`connect(AF_UNSPEC)`, which no hook
/// sees) and connected again to a port no backend uses gives its connection slot back when it
/// closes. The release program once looked only at TCP sockets with no peer or a peer on a
/// backend port, so each such socket kept its slot for ever, and any pod could fill the table
/// that way.
fn tcp_slot_freed_after_reconnecting_elsewhere(net: &Net) -> anyhow::Result<()> {
    const SOCKETS: u32 = 3;
    let mut w = World::new(net, false, &[0], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    let held = held_slots(&w);
    // A server in the first backend's pod on a port no service's backend uses.
    let elsewhere = addr(net.backends[0], TARGET + 1);
    w.sandbox.add_backend(elsewhere, false)?;
    let mut client = w.client()?;
    let before = held()?;
    for id in 1..=SOCKETS {
        open(&mut client, net, id, false)?;
    }
    let while_open = if claims.socket_release {
        before + SOCKETS as usize
    } else {
        socklb_tests::features::fallback(
            "tcp_slot_freed_after_reconnecting_elsewhere",
            "no release program: checked that no slot is taken",
        );
        before
    };
    assert_eq!(held()?, while_open, "each connection holds its slot");
    for id in 1..=SOCKETS {
        let r = client.run(&Command::Reconnect { id, target: None })?;
        assert!(r.ok, "disconnect: {r:?}");
        let r = client.run(&Command::Reconnect {
            id,
            target: Some(elsewhere),
        })?;
        assert!(r.ok, "connect elsewhere: {r:?}");
        assert_eq!(
            r.peer_names.keys().collect::<Vec<_>>(),
            [&elsewhere.to_string()],
            "connected directly, untranslated"
        );
    }
    // The release program frees the slots in the kernel: no agent needed.
    w.agent.kill9();
    for id in 1..=SOCKETS {
        client.run(&Command::Close { id })?;
    }
    assert_eq!(
        held()?,
        before,
        "every slot freed at close, with the agent killed"
    );
    Ok(())
}

/// A TCP socket whose record went to its socket storage (its connection slot was held by
/// another socket), disconnected (`connect(AF_UNSPEC)`) and connected to the service again once
/// that slot is free, holds both a record in storage and its slot: its close, with the agent
/// killed, gives back both, the slot and its pod's count. A close that skipped the storage of
/// a TCP socket holding its slot (an optimization measured for the close's kernel cost) would
/// keep one count of the pod for ever (until a recount). Every free slot is held here by a
/// cookie no socket has, written with the agent killed (no census frees them), then freed
/// again.
fn tcp_socket_with_its_record_in_storage_and_a_slot_gives_both_back(
    net: &Net,
) -> anyhow::Result<()> {
    use aya::maps::{Array, Map, MapData};
    use lb_common::{ConnRecord, MapId};
    let mut w = World::new(net, false, &[0], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    if !claims.socket_release {
        socklb_tests::features::fallback(
            "tcp_socket_with_its_record_in_storage_and_a_slot_gives_both_back",
            "no release program, no slots: every record is in socket storage",
        );
        return Ok(());
    }
    let pins = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current_sockets()
        .context("socket pins")?;
    let held = held_slots(&w);
    let pods_count =
        || -> anyhow::Result<i64> { Ok(socklb::sockets::quota::counts(&pins)?.values().sum()) };
    w.agent.kill9();
    let (count_before, held_before) = (pods_count()?, held()?);
    let mut slots: Array<MapData, ConnRecord> = Array::try_from(Map::from_map_data(
        MapData::from_pin(pins.dir.join(MapId::Connections.name()))?,
    )?)?;
    let mut taken = Vec::new();
    for slot in 0..slots.len() {
        if slots.get(&slot, 0)?.cookie == 0 {
            let other = ConnRecord {
                cookie: u64::MAX - u64::from(slot),
                ..ConnRecord::default()
            };
            slots.set(slot, other, 0)?;
            taken.push(slot);
        }
    }
    let mut client = w.client()?;
    let free = |slots: &mut Array<MapData, ConnRecord>| -> anyhow::Result<()> {
        for &slot in &taken {
            slots.set(slot, ConnRecord::default(), 0)?;
        }
        Ok(())
    };
    let opened = open(&mut client, net, 1, false);
    free(&mut slots)?;
    opened?;
    assert_eq!(
        (pods_count()?, held()?),
        (count_before + 1, held_before),
        "the record in storage is counted against its pod, and no slot is held"
    );
    let r = client.run(&Command::Reconnect {
        id: 1,
        target: None,
    })?;
    assert!(r.ok, "disconnect: {r:?}");
    let vip = net.vip(TCP_PORT);
    let r = client.run(&Command::Reconnect {
        id: 1,
        target: Some(vip),
    })?;
    assert!(r.ok, "connect again: {r:?}");
    assert_eq!(
        r.peer_names.keys().collect::<Vec<_>>(),
        [&vip.to_string()],
        "translated again, its peer named from its record"
    );
    let r = client.run(&Command::Exchange {
        id: 1,
        msg: "again".into(),
    })?;
    assert_eq!(only_backend(&r), net.backend_str(0), "{r:?}");
    assert_eq!(
        (pods_count()?, held()?),
        (count_before + 1, held_before + 1),
        "the socket holds its slot now, and its pod is still counted once (a TCP slot is not)"
    );
    client.run(&Command::Close { id: 1 })?;
    assert_eq!(
        (pods_count()?, held()?),
        (count_before, held_before),
        "its close gave back its pod's count and its slot"
    );
    Ok(())
}

/// A process outside the cgroup, in the same namespace, is never translated.
fn outside_cgroup_untouched(net: &Net) -> anyhow::Result<()> {
    let w = World::new(net, false, &[0, 1, 2], &[])?;
    let mut outside = w.sandbox.outside_client()?;
    let r = outside.connect(net.vip(TCP_PORT), 3)?;
    assert_eq!(r.errors.get("ENETUNREACH"), Some(&3), "{r:?}");
    // While the cgroup's own client is.
    assert_eq!(w.client()?.connect(net.vip(TCP_PORT), 3)?.answers(), 3);
    Ok(())
}

/// A multipath TCP socket (`IPPROTO_MPTCP`, 262) is a TCP connection to its application: it
/// is translated as TCP and answered by a backend. The kernel runs the connect hook for its
/// first subflow (a TCP socket), which takes the slot; the application's socket never holds
/// one, so its getpeername reports the backend it reached (the named difference, see
/// docs/limits.md). The kernel closes that subflow without a release, so its slot is freed by
/// the agent: after two censuses that do not find its socket (forced here by asking for
/// `/connections` more than 2 s apart), every slot the connections held is free again.
fn mptcp_translated_and_its_slot_reclaimed(net: &Net) -> anyhow::Result<()> {
    const OPEN: u32 = 5;
    let w = World::new(net, false, &[0, 1, 2], &[])?;
    let claims = socklb_tests::features::Claims::of(&w.agent.status()?);
    let held = held_slots(&w);
    let mut client = w.client()?;
    // A TCP connection open throughout: the censuses find it, and it keeps its slot.
    open(&mut client, net, 100, false)?;
    let before = held()?;
    for id in 1..=OPEN {
        let r = client.run(&Command::OpenMptcp {
            id,
            target: net.vip(TCP_PORT),
        })?;
        if r.errors.contains_key("EPROTONOSUPPORT") || r.errors.contains_key("ENOPROTOOPT") {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: the CI machines' kernels have MPTCP (net.mptcp.enabled): {r:?}"
            );
            socklb_tests::features::fallback(
                "mptcp_translated_and_its_slot_reclaimed",
                "no MPTCP in this kernel",
            );
            return Ok(());
        }
        assert!(r.ok, "{r:?}");
        let backend = only_backend(&r);
        backend_index(net, &backend);
        assert_eq!(
            r.peer_names.keys().collect::<Vec<_>>(),
            [&backend],
            "getpeername reports the backend reached (the application's socket holds no record)"
        );
    }
    let while_open = if claims.socket_release {
        before + OPEN as usize
    } else {
        before
    };
    assert_eq!(
        held()?,
        while_open,
        "each open MPTCP connection's subflow holds a slot"
    );
    for id in 1..=OPEN {
        client.run(&Command::Close { id })?;
    }
    if !claims.socket_release {
        socklb_tests::features::fallback(
            "mptcp_translated_and_its_slot_reclaimed",
            "no release program: no slots",
        );
        return Ok(());
    }
    if claims.tcp_listing || claims.udp_listing {
        let start = std::time::Instant::now();
        while held()? != before && start.elapsed() < std::time::Duration::from_secs(15) {
            std::thread::sleep(std::time::Duration::from_millis(2_100));
            w.agent.get("/connections")?;
        }
        assert_eq!(
            held()?,
            before,
            "the agent freed the slots of the closed connections"
        );
        let r = client.run(&Command::Exchange {
            id: 100,
            msg: "still".into(),
        })?;
        assert_eq!(
            r.peer_names.keys().collect::<Vec<_>>(),
            [&net.vip(TCP_PORT).to_string()],
            "the open TCP connection kept its record: {r:?}"
        );
        assert_eq!(
            w.agent.metric("socklb_connection_slots_freed_total")?,
            Some(f64::from(OPEN))
        );
        println!(
            "FIGURE MPTCP slots freed {:.1} s after close",
            start.elapsed().as_secs_f64()
        );
    } else {
        socklb_tests::features::fallback(
            "mptcp_translated_and_its_slot_reclaimed",
            "no socket listing: the slots stay held (the named loss)",
        );
        assert_eq!(held()?, while_open);
    }
    Ok(())
}

macro_rules! both_families {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[test]
            fn ipv4() -> anyhow::Result<()> {
                if !super::privileged(concat!(stringify!($scenario), "::ipv4")) {
                    return Ok(());
                }
                super::$scenario(&super::V4)
            }

            #[test]
            fn ipv6() -> anyhow::Result<()> {
                if !super::privileged(concat!(stringify!($scenario), "::ipv6")) {
                    return Ok(());
                }
                super::$scenario(&super::V6)
            }
        }
    )*};
}

both_families!(
    spread,
    established_connection_stays,
    udp_reverse_translation_and_stickiness,
    refused_without_backends,
    session_affinity,
    an_affinity_choice_is_stamped_on_the_records_clock,
    connected_udp_socket_terminated,
    connected_udp_socket_terminated_without_the_sockets_iterator,
    connected_udp_socket_terminated_across_a_restart,
    connected_udp_sockets_listed,
    connected_udp_slot_freed,
    a_record_is_stamped_on_the_census_clock,
    tcp_slot_freed_after_a_failed_connect,
    tcp_slot_freed_after_reconnecting_elsewhere,
    tcp_socket_with_its_record_in_storage_and_a_slot_gives_both_back,
    mptcp_translated_and_its_slot_reclaimed,
    outside_cgroup_untouched,
);

/// Java and gRPC clients dial IPv4 services through AF_INET6 sockets (`::ffff:a.b.c.d`).
#[test]
fn ipv4_mapped_destinations_are_translated() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let tcp = World::new(&V4, false, &[0, 1, 2], &[])?;
    let mapped: SocketAddr = format!("[::ffff:{}]:{TCP_PORT}", V4.vip).parse()?;
    let r = tcp.client()?.connect(mapped, 50)?;
    assert_eq!(r.failures(), 0, "{r:?}");
    assert!(r.backends.len() > 1, "{:?}", r.backends);
    assert_eq!(
        r.peer_names.get(&mapped.to_string()),
        Some(&50),
        "{:?}",
        r.peer_names
    );

    let udp = World::new(&V4, true, &[0, 1, 2], &[])?;
    let mapped: SocketAddr = format!("[::ffff:{}]:{UDP_PORT}", V4.vip).parse()?;
    let r = udp.client()?.run(&Command::SendTo {
        target: mapped,
        count: 10,
        id: None,
    })?;
    assert_eq!(r.failures(), 0, "{r:?}");
    assert_eq!(
        r.peer_names.get(&mapped.to_string()),
        Some(&10),
        "{:?}",
        r.peer_names
    );
    Ok(())
}

/// The verifier accepts every program on this kernel, each within three quarters of the
/// kernel's limit on verified instructions; their sizes are printed.
#[test]
fn verifier_accepts_every_program() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let w = World::new(&V4, false, &[0], &[])?;
    let programs: Vec<ProgramView> = w.sandbox.inspect_as(&["programs"])?;
    let names: Vec<&str> = programs.iter().map(|p| p.name.as_str()).collect();
    let mut expected = lb_common::program::ALL.to_vec();
    if socklb_tests::features::Claims::of(&w.agent.status()?).socket_release {
        expected.push(lb_common::program::RELEASE);
    }
    assert_eq!(names, expected);
    eprintln!(
        "{:<22} {:>12} {:>22}",
        "program", "instructions", "verified instructions"
    );
    for p in &programs {
        let insns = p.instructions.unwrap_or(0);
        let verified = p.verified_instructions.unwrap_or(0);
        eprintln!("{:<22} {insns:>12} {verified:>22}", p.name);
        assert!(insns > 0 && verified > 0, "{p:?}");
        // The kernel refuses a program whose verification passes 1,000,000 instructions, and
        // other kernels' verifiers prune less than this one's: keep a quarter of it spare.
        assert!(
            verified <= VERIFIED_BUDGET,
            "{}: {verified} verified instructions, over the budget of {VERIFIED_BUDGET} \
             (three quarters of the kernel's limit of 1,000,000)",
            p.name
        );
    }
    Ok(())
}

/// At most this many verified instructions per program (see `verifier_accepts_every_program`).
const VERIFIED_BUDGET: u32 = 750_000;

/// aya-log: off by default, so the verifier removes the logging code (fewer instructions than
/// with logging on); `--bpf-log-level debug` turns it on at load time and the agent forwards
/// the programs' records.
#[test]
fn program_logging_is_off_by_default_and_switchable_at_load() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let verified = |sandbox: &Sandbox| -> anyhow::Result<u32> {
        let programs: Vec<ProgramView> = sandbox.inspect_as(&["programs"])?;
        Ok(programs
            .iter()
            .find(|p| p.name == lb_common::program::CONNECT4)
            .and_then(|p| p.instructions)
            .unwrap_or(0))
    };
    let quiet = World::new(&V4, false, &[0], &[])?;
    let quiet_size = verified(&quiet.sandbox)?;
    drop(quiet);

    let sandbox = Sandbox::new()?;
    sandbox.add_backend(V4.backend(0), false)?;
    sandbox.write_manifest(
        "svc.yaml",
        &service("svc", V4.vip, "p", "TCP", TCP_PORT, "8080", &[]),
    )?;
    sandbox.write_manifest("slice.yaml", &slice_yaml(&V4, false, &[0]))?;
    let agent = sandbox.start_agent(&AgentOptions::with_args(["--bpf-log-level", "debug"]))?;
    let loud_size = verified(&sandbox)?;
    assert!(
        quiet_size < loud_size,
        "logging off should remove code: {quiet_size} vs {loud_size} instructions"
    );
    let r = sandbox.client()?.connect(V4.vip(TCP_PORT), 3)?;
    assert_eq!(r.answers(), 3);
    let mut logged = false;
    for _ in 0..40 {
        if agent.log_tail(200).contains("-> backend") {
            logged = true;
            break;
        }
        sleep(Duration::from_millis(50));
    }
    assert!(
        logged,
        "no program log line in the agent's log:\n{}",
        agent.log_tail(20)
    );
    Ok(())
}

/// A translated socket's record goes away with the socket: after a thousand closed connections
/// only the three open ones hold one (as `socklb inspect sockets` lists them, from the
/// connection slots and the sockets' storage), and closing those (the process exiting) leaves
/// none. A record in a connection slot is freed by the release program at close; one in the
/// socket's own storage (the slot held, or no release program) goes with the socket.
#[test]
fn per_socket_state_goes_away_with_the_socket() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let w = World::new(&V4, false, &[0, 1, 2], &[])?;
    let records =
        |sandbox: &Sandbox| -> anyhow::Result<Vec<SocketRow>> { sandbox.inspect_as(&["sockets"]) };
    let mut client = w.client()?;
    assert_eq!(client.connect(V4.vip(TCP_PORT), 1000)?.answers(), 1000);
    for id in 1..=3 {
        assert!(
            client
                .run(&Command::Open {
                    id,
                    target: V4.vip(TCP_PORT),
                    udp: false
                })?
                .ok
        );
    }
    let open = records(&w.sandbox)?;
    assert_eq!(
        open.len(),
        3,
        "only the three open sockets keep a record: {open:?}"
    );
    for r in &open {
        assert_eq!(
            r.frontend,
            Some(socklb::vocab::ServiceAddr::new(
                V4.vip.parse()?,
                TCP_PORT,
                socklb::vocab::Protocol::Tcp
            ))
        );
        assert!(r.service.is_some(), "{r:?}");
    }
    drop(client);
    assert!(
        records(&w.sandbox)?.is_empty(),
        "closing (here: the process exiting) releases them"
    );
    let stats: Stats = w.sandbox.inspect_as(&["stats"])?;
    assert_eq!(counter(&stats, Counter::Translations), Some(1003));
    assert_eq!(counter(&stats, Counter::RecordFailed), Some(0));
    Ok(())
}

/// The maps behind the frontend index, opened from the sandbox's pins as the node admin (or a
/// test) would: to read what they hold and to plant what a crash or a torn read would leave.
struct IndexMaps {
    frontends: aya::maps::HashMap<aya::maps::MapData, Frontend4Key, Frontend>,
    index: aya::maps::Array<aya::maps::MapData, IndexEntry>,
    config: aya::maps::Array<aya::maps::MapData, DatapathConfig>,
}

impl IndexMaps {
    fn open(w: &World) -> anyhow::Result<Self> {
        Ok(Self {
            frontends: pinned_map(w, MapId::Frontends4)?.try_into()?,
            index: pinned_map(w, MapId::FrontendIndex)?.try_into()?,
            config: pinned_map(w, MapId::Config)?.try_into()?,
        })
    }

    /// The secret the programs read now.
    fn secret(&self) -> anyhow::Result<u64> {
        Ok(self.config.get(&0, 0)?.index_secret)
    }

    fn frontend(&self, key: Frontend4Key) -> anyhow::Result<Frontend> {
        Ok(self.frontends.get(&key, 0)?)
    }

    fn set_frontend(&mut self, key: Frontend4Key, frontend: Frontend) -> anyhow::Result<()> {
        Ok(self.frontends.insert(key, frontend, 0)?)
    }

    fn set_entry(&mut self, slot: u32, entry: IndexEntry) -> anyhow::Result<()> {
        Ok(self.index.set(slot, entry, 0)?)
    }

    /// Every non-empty slot.
    fn entries(&self) -> anyhow::Result<BTreeMap<u32, IndexEntry>> {
        let mut held = BTreeMap::new();
        for slot in 0..self.index.len() {
            let entry = self.index.get(&slot, 0)?;
            if entry != IndexEntry::default() {
                held.insert(slot, entry);
            }
        }
        Ok(held)
    }

    /// What the index should hold for `key`: its `FRONTENDS4` value, checked under the secret.
    fn expected(&self, key: Frontend4Key) -> anyhow::Result<(u32, IndexEntry)> {
        let secret = self.secret()?;
        let frontend = self.frontend(key)?;
        Ok((
            index::slot(&key, secret),
            IndexEntry {
                key,
                frontend,
                check: index::check(&key, &frontend, secret),
            },
        ))
    }
}

/// `map` of the agent's current generation, writable.
fn pinned_map(w: &World, map: MapId) -> anyhow::Result<aya::maps::Map> {
    let dir = socklb::dataplane::pins::PinFolder::new(w.sandbox.pin_folder())
        .current()
        .context("no map generation")?;
    let data = socklb::dataplane::bpf::open_map(&dir, map, false)?;
    Ok(aya::maps::Map::from_map_data(data)?)
}

fn tcp_key(vip: &str, port: u16) -> Frontend4Key {
    let ip: std::net::Ipv4Addr = vip.parse().expect("IPv4");
    Frontend4Key {
        addr: u32::from_ne_bytes(ip.octets()),
        port_be: port.to_be(),
        protocol: lb_common::PROTOCOL_TCP,
        _pad: 0,
    }
}

/// Adds a TCP Service `name` on `vip:port` whose one endpoint is backend `backend`, and waits
/// until the maps hold it.
fn add_tcp_service(
    w: &World,
    name: &str,
    vip: &str,
    port: u16,
    backend: usize,
) -> anyhow::Result<()> {
    let s = &w.sandbox;
    let target = TARGET.to_string();
    s.write_manifest(
        &format!("{name}.yaml"),
        &service(name, vip, "p", "TCP", port, &target, &[]),
    )?;
    s.write_manifest(
        &format!("{name}-slice.yaml"),
        &slice(
            &format!("{name}-1"),
            name,
            "p",
            "TCP",
            TARGET,
            &[Ep::ready(V4.backends[backend])],
        ),
    )?;
    s.wait_candidates(&addr(vip, port).to_string(), &[&V4.backend_str(backend)])
}

/// The backends 20 connects to `vip:port` reached; every connect must be answered.
fn answered(w: &World, vip: &str, port: u16) -> anyhow::Result<BTreeSet<usize>> {
    let r = w.client()?.connect(addr(vip, port), 20)?;
    assert_eq!(r.failures(), 0, "{vip}:{port}: {r:?}");
    Ok(r.backends.keys().map(|b| backend_index(&V4, b)).collect())
}

const VIP2: &str = "10.96.0.11";

/// What `socklb explain` says of the TCP frontend `vip:port`: where the programs find it, the
/// backends it shows for it, and whether it calls them the Service's.
fn explained(
    w: &World,
    vip: &str,
    port: u16,
) -> anyhow::Result<(Option<ReadFrom>, Vec<SocketAddr>, bool)> {
    let (e, _) = w.sandbox.explain(&format!("{vip}:{port}"))?;
    let m = e
        .maps
        .iter()
        .find(|m| m.frontend.addr == addr(vip, port) && m.frontend.protocol == Protocol::Tcp)
        .with_context(|| format!("explain shows no {vip}:{port}: {:?}", e.maps))?;
    Ok((
        m.read_from.clone(),
        m.maps_backends.clone().unwrap_or_default(),
        m.matches,
    ))
}

/// That `socklb explain` finds the TCP frontend `vip:port` where `read_from` says, with backend
/// `backend` alone, which it calls the Service's.
fn assert_explained(
    w: &World,
    vip: &str,
    port: u16,
    read_from: ReadFrom,
    backend: usize,
) -> anyhow::Result<()> {
    assert_eq!(
        explained(w, vip, port)?,
        (Some(read_from), vec![backend_at(backend)], true),
        "explain {vip}:{port}"
    );
    Ok(())
}

/// Backend `i`'s address as the maps hold it.
fn backend_at(i: usize) -> SocketAddr {
    addr(V4.backends[i], TARGET)
}

/// The frontend index holds each IPv4 frontend as `FRONTENDS4` does, the programs read it
/// before `FRONTENDS4` and go on reading it with the agent killed, and an entry whose check
/// fails (what a connect reading an entry the agent is rewriting sees: one frontend's key and
/// check with another's backends) is passed over for `FRONTENDS4`. A restarted agent rewrites
/// the index from `FRONTENDS4`, whatever was planted in it.
#[test]
fn frontend_index_read_first_and_a_torn_entry_passed_over() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let mut w = World::new(&V4, false, &[0], &[])?;
    add_tcp_service(&w, "svc2", VIP2, TCP_PORT, 1)?;
    let (k1, k2) = (tcp_key(V4.vip, TCP_PORT), tcp_key(VIP2, TCP_PORT));
    let mut maps = IndexMaps::open(&w)?;
    assert_ne!(maps.secret()?, 0, "the agent drew a secret");
    let (s1, e1) = maps.expected(k1)?;
    let (s2, e2) = maps.expected(k2)?;
    // Two frontends share a slot once in 32,768 secrets: then the first one written keeps it.
    let mut want = BTreeMap::from([(s1, e1)]);
    want.entry(s2).or_insert(e2);
    assert_eq!(
        maps.entries()?,
        want,
        "the index holds each frontend at its slot"
    );
    assert_eq!(answered(&w, V4.vip, TCP_PORT)?, BTreeSet::from([0]));
    // explain names the slot the programs read.
    let index = |agrees| ReadFrom::Index {
        slot: s1,
        frontends4_agrees: agrees,
    };
    assert_explained(&w, V4.vip, TCP_PORT, index(true), 0)?;

    w.agent.kill9();
    // FRONTENDS4 now sends svc to svc2's backend; the index entry still says backend 0.
    maps.set_frontend(k1, e2.frontend)?;
    assert_eq!(
        answered(&w, V4.vip, TCP_PORT)?,
        BTreeSet::from([0]),
        "the index is read first, also with the agent killed"
    );
    // explain and inspect lookup show what the programs use, and that FRONTENDS4 disagrees.
    assert_explained(&w, V4.vip, TCP_PORT, index(false), 0)?;
    let lookup = w.sandbox.lookup(&format!("{}:{TCP_PORT}", V4.vip))?;
    assert_eq!(
        (lookup.candidates, lookup.read_from),
        (vec![backend_at(0)], index(false))
    );
    maps.set_frontend(k1, e1.frontend)?;
    // Torn: svc's key and check around svc2's backends.
    let torn = IndexEntry {
        frontend: e2.frontend,
        ..e1
    };
    maps.set_entry(s1, torn)?;
    assert_eq!(
        answered(&w, V4.vip, TCP_PORT)?,
        BTreeSet::from([0]),
        "an entry whose check fails is passed over for FRONTENDS4"
    );
    assert_explained(
        &w,
        V4.vip,
        TCP_PORT,
        ReadFrom::EntryFailsCheck { slot: s1 },
        0,
    )?;
    // svc2's check, valid for svc2's entry, under svc's key.
    maps.set_entry(s1, IndexEntry { key: k1, ..e2 })?;
    assert_eq!(answered(&w, V4.vip, TCP_PORT)?, BTreeSet::from([0]));
    // The same entry with the check the secret gives is used: the check is what decides.
    let forged = IndexEntry {
        key: k1,
        frontend: e2.frontend,
        check: index::check(&k1, &e2.frontend, maps.secret()?),
    };
    maps.set_entry(s1, forged)?;
    assert_eq!(answered(&w, V4.vip, TCP_PORT)?, BTreeSet::from([1]));
    let (e, ok) = w.sandbox.explain(&format!("{}:{TCP_PORT}", V4.vip))?;
    assert!(
        !ok && e.broken == Link::Maps,
        "explain calls the maps broken when what the programs read is not the Service's: {}",
        e.verdict
    );
    assert_eq!(
        explained(&w, V4.vip, TCP_PORT)?.1,
        vec![backend_at(1)],
        "and shows the backend the index sends connects to"
    );

    // A restart (the same layout: the secret is kept) rewrites the index from FRONTENDS4.
    w.agent.restart(true)?;
    let maps = IndexMaps::open(&w)?;
    let mut want = BTreeMap::from([maps.expected(k1)?]);
    let (s2, e2) = maps.expected(k2)?;
    want.entry(s2).or_insert(e2);
    assert_eq!(maps.entries()?, want, "rewritten at start");
    assert_eq!(answered(&w, V4.vip, TCP_PORT)?, BTreeSet::from([0]));
    assert_eq!(answered(&w, VIP2, TCP_PORT)?, BTreeSet::from([1]));
    Ok(())
}

/// The IPv6 index (`FRONTEND_INDEX6`) holds the IPv6 frontend at its slot, under the secret;
/// the programs read it before `FRONTENDS6`, with the agent killed too (a `FRONTENDS6` entry
/// planted with no backend, which would refuse, does not reach the connects); an entry whose
/// check fails is passed over for `FRONTENDS6` (the planted entry then refuses with
/// ECONNREFUSED); explain and inspect lookup name the slot; a restart rewrites both.
#[test]
fn ipv6_frontend_index_read_first_and_a_torn_entry_passed_over() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let mut w = World::new(&V6, false, &[0], &[])?;
    let mut frontends: aya::maps::HashMap<_, FrontendKey, Frontend> =
        pinned_map(&w, MapId::Frontends6)?.try_into()?;
    let mut index6: aya::maps::Array<_, IndexEntry6> =
        pinned_map(&w, MapId::FrontendIndex6)?.try_into()?;
    let config: aya::maps::Array<_, DatapathConfig> = pinned_map(&w, MapId::Config)?.try_into()?;
    let secret = config.get(&0, 0)?.index_secret;
    let ip: std::net::Ipv6Addr = V6.vip.parse()?;
    let octets = ip.octets();
    let word =
        |i: usize| u32::from_ne_bytes([octets[i], octets[i + 1], octets[i + 2], octets[i + 3]]);
    let key = FrontendKey {
        addr: [word(0), word(4), word(8), word(12)],
        port_be: TCP_PORT.to_be(),
        protocol: lb_common::PROTOCOL_TCP,
        family: lb_common::FAMILY_IPV6,
    };
    let frontend = frontends.get(&key, 0)?;
    let slot = index::slot6(&key, secret);
    let entry = IndexEntry6 {
        key,
        frontend,
        check: index::check6(&key, &frontend, secret),
        ..IndexEntry6::default()
    };
    assert_eq!(
        index6.get(&slot, 0)?,
        entry,
        "the index holds the frontend at its slot"
    );
    let vip = V6.vip(TCP_PORT);
    let connects = |w: &World| w.client()?.connect(vip, 20);
    let r = connects(&w)?;
    assert_eq!((r.failures(), r.backends.len()), (0, 1), "{r:?}");
    let read_from = |agrees| ReadFrom::Index {
        slot,
        frontends4_agrees: agrees,
    };
    let lookup = w.sandbox.lookup(&V6.lookup(TCP_PORT, false))?;
    assert_eq!(lookup.read_from, read_from(true));

    w.agent.kill9();
    let refusing = Frontend {
        count: 0,
        ..frontend
    };
    frontends.insert(key, refusing, 0)?;
    let r = connects(&w)?;
    assert_eq!(
        (r.failures(), r.backends.len()),
        (0, 1),
        "the index is read first, also with the agent killed: {r:?}"
    );
    let lookup = w.sandbox.lookup(&V6.lookup(TCP_PORT, false))?;
    assert_eq!(lookup.read_from, read_from(false), "inspect lookup");
    // Torn: the key and check of the frontend around a frontend with no backend.
    index6.set(
        slot,
        IndexEntry6 {
            frontend: refusing,
            ..entry
        },
        0,
    )?;
    let r = connects(&w)?;
    assert_eq!(
        r.errors.get("ECONNREFUSED"),
        Some(&20),
        "an entry whose check fails is passed over for FRONTENDS6: {r:?}"
    );
    let lookup = w.sandbox.lookup(&V6.lookup(TCP_PORT, false))?;
    assert_eq!(lookup.read_from, ReadFrom::EntryFailsCheck { slot });

    // A restart rewrites FRONTENDS6 from the Service and the index from FRONTENDS6.
    w.agent.restart(true)?;
    w.wait(&[0])?;
    let r = connects(&w)?;
    assert_eq!((r.failures(), r.backends.len()), (0, 1), "{r:?}");
    let secret = config.get(&0, 0)?.index_secret;
    let frontend = frontends.get(&key, 0)?;
    assert_eq!(
        index6.get(&index::slot6(&key, secret), 0)?.frontend,
        frontend,
        "rewritten at start"
    );
    Ok(())
}

/// Two frontends whose slots collide: the one written first keeps the slot, the other is served
/// from `FRONTENDS4`, each to its own backend. Deleting the holder empties the slot before its
/// frontend goes (its connects are no longer translated), and the next start gives the slot to
/// the other.
#[test]
fn frontend_index_collisions_stay_in_the_hash_map() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let mut w = World::new(&V4, false, &[0], &[])?;
    let k1 = tcp_key(V4.vip, TCP_PORT);
    let maps = IndexMaps::open(&w)?;
    let secret = maps.secret()?;
    let s1 = index::slot(&k1, secret);
    // An address and port in the same slot (about two per address over the ports searched).
    let (vip3, port3) = (1..=254u8)
        .flat_map(|host| (1024..=u16::MAX).map(move |port| (format!("10.96.1.{host}"), port)))
        .find(|(vip, port)| index::slot(&tcp_key(vip, *port), secret) == s1)
        .context("no colliding service address")?;
    add_tcp_service(&w, "svc3", &vip3, port3, 2)?;
    let k3 = tcp_key(&vip3, port3);
    let (_, e1) = maps.expected(k1)?;
    assert_eq!(
        maps.entries()?,
        BTreeMap::from([(s1, e1)]),
        "the first frontend keeps the slot"
    );
    assert!(maps.frontend(k3).is_ok(), "the other is in FRONTENDS4");
    // What an operator sees: two frontends, one of them in the index.
    let stats: Stats = w.sandbox.inspect_as(&["stats"])?;
    let entries = |name: &str| {
        stats
            .maps
            .iter()
            .find(|m| m.map == name)
            .and_then(|m| m.entries)
    };
    assert_eq!(
        (entries("FRONTENDS4"), entries("FRONTEND_INDEX")),
        (Some(2), Some(1)),
        "{stats:?}"
    );
    assert_eq!(answered(&w, V4.vip, TCP_PORT)?, BTreeSet::from([0]));
    assert_eq!(answered(&w, &vip3, port3)?, BTreeSet::from([2]));
    // explain names the frontend that holds the slot.
    let by = Some(ServiceAddr::new(V4.vip.parse()?, TCP_PORT, Protocol::Tcp));
    assert_explained(&w, &vip3, port3, ReadFrom::SlotHeld { slot: s1, by }, 2)?;

    w.sandbox.remove_manifest("svc.yaml")?;
    w.sandbox.remove_manifest("slice.yaml")?;
    w.sandbox.wait_gone(&V4.lookup(TCP_PORT, false))?;
    assert_eq!(
        maps.entries()?,
        BTreeMap::new(),
        "the holder's slot emptied"
    );
    let r = w.client()?.connect(V4.vip(TCP_PORT), 3)?;
    assert_eq!(
        r.errors.get("ENETUNREACH"),
        Some(&3),
        "a deleted service is not translated: {r:?}"
    );
    assert_eq!(answered(&w, &vip3, port3)?, BTreeSet::from([2]));
    assert_eq!(
        explained(&w, &vip3, port3)?.0,
        Some(ReadFrom::SlotEmpty { slot: s1 })
    );

    w.agent.restart(true)?;
    let maps = IndexMaps::open(&w)?;
    assert_eq!(
        maps.entries()?,
        BTreeMap::from([maps.expected(k3)?]),
        "the next start gives the slot to the frontend left"
    );
    assert_eq!(answered(&w, &vip3, port3)?, BTreeSet::from([2]));
    Ok(())
}
