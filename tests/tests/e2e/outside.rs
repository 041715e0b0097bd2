//! The outside path (`--external-traffic nftables`), on three simulated nodes (`cluster.rs`):
//! a client outside the nodes reaches NodePort, load-balancer IP and externalIP Services over
//! TCP and UDP, in both families, under both traffic policies, with kube-proxy's e2e tests
//! (`test/e2e/network/service.go`, `loadbalancer.go`, `conntrack.go`) as the list of what to
//! cover; and the rules keep serving with the agent killed, are repaired when someone else
//! changes them, and go with `socklb reset`.
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use socklb_tests::{
    Client, Sandbox,
    agent::AgentProcess,
    client::{Command, Reply},
    cluster::{CLIENT4, CLIENT6, Cluster, Pod},
    curl,
};

const HTTP: u16 = 8080;
const DNS: u16 = 5353;

/// The Service: LoadBalancer (dual-stack) with a TCP and a UDP port, a NodePort each, a
/// load-balancer IP and an externalIP per family; `extra` adds spec lines.
fn web(policy: &str, extra: &[&str]) -> String {
    let mut spec = vec![
        "type: LoadBalancer".to_string(),
        "clusterIP: 10.96.0.80".into(),
        "clusterIPs: [10.96.0.80, \"fd00:96::80\"]".into(),
        "ipFamilies: [IPv4, IPv6]".into(),
        "ipFamilyPolicy: RequireDualStack".into(),
        format!("externalTrafficPolicy: {policy}"),
        "externalIPs: [198.51.100.7, \"2001:db8:51::7\"]".into(),
        "ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}, {name: dns, port: 53, targetPort: 5353, nodePort: 30053, protocol: UDP}]".into(),
    ];
    if policy == "Local" {
        spec.push("healthCheckNodePort: 32100".into());
    }
    spec.extend(extra.iter().map(|s| (*s).to_string()));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, uid: w1, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec:\n{}\nstatus: {{loadBalancer: {{ingress: [{{ip: 192.0.2.10}}, {{ip: \"2001:db8:2::10\"}}]}}}}\n",
        spec.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

/// The Service's slices (one per family): each endpoint `(pod, node name, condition)`.
fn slices(endpoints: &[(&Pod, &str, &str)]) -> String {
    let mut out = Vec::new();
    for (family, v6) in [("IPv4", false), ("IPv6", true)] {
        let eps: Vec<String> = endpoints
            .iter()
            .map(|(pod, node, conditions)| {
                let ip = if v6 { pod.ip6 } else { pod.ip4 };
                format!("  - {{addresses: [\"{ip}\"], nodeName: {node}, conditions: {conditions}}}")
            })
            .collect();
        out.push(format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-{}, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: {family}\nports: [{{name: http, port: {HTTP}}}, {{name: dns, port: {DNS}, protocol: UDP}}]\nendpoints:\n{}\n",
            family.to_lowercase(),
            if eps.is_empty() { "  []".to_string() } else { eps.join("\n") }
        ));
    }
    out.join("---\n")
}

const READY: &str = "{ready: true}";

/// Waits until every agent's outside rules are in sync with at least `ports` service ports.
fn in_sync(agents: &[AgentProcess], ports: usize) -> anyhow::Result<()> {
    for agent in agents {
        crate::wait_until("the outside rules in sync", Duration::from_secs(20), || {
            let s = agent.status()?;
            Ok(s.outside.filter(|o| {
                o.condition == socklb::status::OutsideCondition::InSync && o.service_ports >= ports
            }))
        })
        .with_context(|| agent.log_tail(30))?;
    }
    Ok(())
}

fn at(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// The backends that answered (their address without the port) and the client addresses
/// they saw (without the port).
fn answered(r: &Reply) -> (BTreeSet<IpAddr>, BTreeSet<IpAddr>) {
    let ip = |s: &String| s.parse::<SocketAddr>().map(|a| a.ip()).ok();
    (
        r.backends.keys().filter_map(ip).collect(),
        r.seen_as.keys().filter_map(ip).collect(),
    )
}

fn connects(
    client: &mut Client,
    target: SocketAddr,
    count: usize,
    udp: bool,
) -> anyhow::Result<Reply> {
    client.run(&Command::Connect { target, count, udp })
}

/// `socklb ARGS` inside node `i`'s namespace: (success, stdout).
fn socklb_in(w: &World, i: usize, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let node = &w.cluster.nodes[i];
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &node.netns])
        .arg(socklb_tests::bins::socklb()?)
        .args(args)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// `socklb explain shop/web` on node `i`, as JSON.
fn explain_on(w: &World, i: usize) -> anyhow::Result<socklb::explain::Explanation> {
    let node = &w.cluster.nodes[i];
    let manifests = w.cluster.sandbox.manifests();
    let pins = node.pins.display().to_string();
    let (_, out) = socklb_in(
        w,
        i,
        &[
            "explain",
            "shop/web",
            "--manifests",
            &manifests.display().to_string(),
            "--node-name",
            &node.name,
            "--bpffs",
            &pins,
            "--agent",
            "127.0.0.1:1",
            "-o",
            "json",
        ],
    )?;
    serde_json::from_str(&out).with_context(|| out.clone())
}

/// Three nodes, a pod with an endpoint on node-1 (A) and one on node-3 (C), an agent per node,
/// and a client outside the nodes.
struct World<'a> {
    cluster: Cluster<'a>,
    pod_a: Pod,
    pod_c: Pod,
    agents: Vec<AgentProcess>,
    client: Client,
}

impl<'a> World<'a> {
    fn new(sandbox: &'a Sandbox, policy: &str) -> anyhow::Result<Self> {
        let cluster = Cluster::new(sandbox, 3)?;
        let pod_a = cluster.pod(0)?;
        let pod_c = cluster.pod(2)?;
        for pod in [&pod_a, &pod_c] {
            cluster.serve(pod, HTTP, false)?;
            cluster.serve(pod, DNS, true)?;
        }
        sandbox.write_manifest("nodes.yaml", &cluster.node_manifests())?;
        sandbox.write_manifest("web.yaml", &web(policy, &[]))?;
        sandbox.write_manifest(
            "web-slices.yaml",
            &slices(&[(&pod_a, "node-1", READY), (&pod_c, "node-3", READY)]),
        )?;
        let agents: Vec<AgentProcess> = (0..3)
            .map(|i| cluster.agent(i, &[]))
            .collect::<anyhow::Result<_>>()?;
        in_sync(&agents, 4)?;
        for agent in &agents {
            anyhow::ensure!(
                agent.metric("socklb_outside_rules{state=\"in-sync\"}")? == Some(1.0),
                "the metric says in sync"
            );
        }
        let client = cluster.outside_client()?;
        Ok(Self {
            cluster,
            pod_a,
            pod_c,
            agents,
            client,
        })
    }

    /// Node `i`'s addresses towards the fabric and its pods: a masqueraded source is one of
    /// them (the address of the interface towards the endpoint).
    fn node_addrs(&self, i: usize, v6: bool) -> anyhow::Result<BTreeSet<IpAddr>> {
        let n = &self.cluster.nodes[i];
        Ok(if v6 {
            BTreeSet::from([n.ip6, format!("fd00:244:10{}::1", i + 1).parse()?])
        } else {
            BTreeSet::from([n.ip4, format!("10.244.10{}.1", i + 1).parse()?])
        })
    }
}

/// Every frontend kind from outside, in both families and both protocols, under both policies:
/// - `externalTrafficPolicy: Cluster`: a NodePort on a node without endpoints, the
///   load-balancer IP and the `externalIP` reach the endpoints of every node, and the source is
///   masqueraded to the node ("should be able to create a functioning NodePort service", "...
///   connect to a service via `ExternalIP` when the external IP is not assigned to a node");
/// - Local: the node with an endpoint answers from it and the endpoint sees the client's own
///   address; a node without one answers nothing; its `healthCheckNodePort` says 200 with the
///   count where an endpoint is, 503 elsewhere ("`LoadBalancers` ESIPP ... should work for
///   type=NodePort / `LoadBalancer`", "should only target nodes with endpoints");
/// - `loadBalancerSourceRanges`: a client inside them reaches the load-balancer IP, one outside
///   does not, and never the NodePort or `externalIP` ("should only allow access from service
///   loadbalancer source ranges");
/// - a pod's connect to its own node's NodePort stays on the socket path (the endpoint sees
///   the pod's address, not a masqueraded one).
#[test]
fn every_frontend_from_outside_under_both_policies() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let mut w = World::new(&sandbox, "Cluster")?;
    cluster_policy(&mut w)?;
    own_node_port_from_a_pod(&w)?;
    local_policy(&mut w)?;
    source_ranges(&mut w)?;
    client_ip_affinity(&mut w)?;
    // The drift check ran (every 10 s) over every kind of rule and element above, both
    // families, and found the tables as written: no false alarm.
    for agent in &w.agents {
        assert_eq!(
            agent.metric("socklb_outside_drift_repairs_total")?,
            Some(0.0),
            "{}",
            agent.log_tail(20)
        );
    }
    Ok(())
}

/// `sessionAffinity: ClientIP` from outside: every connect of one client address reaches the
/// endpoint its first reached, per source address ("should have session affinity work for
/// NodePort service"); without it both endpoints answer.
fn client_ip_affinity(w: &mut World) -> anyhow::Result<()> {
    w.cluster.sandbox.write_manifest(
        "web.yaml",
        &web(
            "Cluster",
            &[
                "sessionAffinity: ClientIP",
                "sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}",
            ],
        ),
    )?;
    in_sync(&w.agents, 4)?;
    let target = at(w.cluster.nodes[1].ip4, 30080);
    let client = &mut w.client;
    let reached = crate::wait_until("affinity in the rules", Duration::from_secs(10), || {
        let r = connects(client, target, 30, false)?;
        Ok((r.answers() == 30 && r.backends.len() == 1).then(|| answered(&r).0))
    })?;
    let r = connects(client, target, 30, false)?;
    assert_eq!(
        answered(&r).0,
        reached,
        "the same endpoint every time: {r:?}"
    );
    println!("FIGURE outside, ClientIP affinity: 60 connects from one client, one endpoint");
    Ok(())
}

/// Cluster: every frontend reaches both endpoints, masqueraded to the node it entered.
fn cluster_policy(w: &mut World) -> anyhow::Result<()> {
    let (n2, pod_a, pod_c) = (&w.cluster.nodes[1], &w.pod_a, &w.pod_c);
    for (family, node_ip, lb, ext, a_ip, c_ip) in [
        (
            "IPv4",
            n2.ip4,
            "192.0.2.10",
            "198.51.100.7",
            pod_a.ip4,
            pod_c.ip4,
        ),
        (
            "IPv6",
            n2.ip6,
            "2001:db8:2::10",
            "2001:db8:51::7",
            pod_a.ip6,
            pod_c.ip6,
        ),
    ] {
        let v6 = family == "IPv6";
        for (what, target, via) in [
            (
                "NodePort of a node without endpoints",
                at(node_ip, 30080),
                w.node_addrs(1, v6)?,
            ),
            (
                "load-balancer IP",
                at(lb.parse()?, 80),
                w.node_addrs(0, v6)?,
            ),
            ("externalIP", at(ext.parse()?, 80), w.node_addrs(0, v6)?),
        ] {
            for udp in [false, true] {
                let target = if udp {
                    SocketAddr::new(target.ip(), if target.port() == 30080 { 30053 } else { 53 })
                } else {
                    target
                };
                let r = connects(&mut w.client, target, 40, udp)?;
                let (backends, seen) = answered(&r);
                assert_eq!(r.answers(), 40, "{family} {what} udp={udp}: {r:?}");
                assert_eq!(
                    backends,
                    BTreeSet::from([a_ip, c_ip]),
                    "{family} {what} udp={udp}: both nodes' endpoints"
                );
                assert!(
                    !seen.is_empty() && seen.is_subset(&via),
                    "{family} {what} udp={udp}: masqueraded to the node: {seen:?}"
                );
            }
        }
    }
    println!(
        "FIGURE outside, Cluster: NodePort, load-balancer IP and externalIP, TCP and UDP, IPv4 and IPv6: 40 of 40 each, both endpoints, source the node's"
    );
    // What the rules hold, as `inspect` and `explain` show them.
    let (ok, out) = socklb_in(w, 1, &["inspect", "outside", "-o", "json"])?;
    assert!(ok, "{out}");
    let frontends: Vec<socklb::outside::evidence::Frontend> = serde_json::from_str(&out)?;
    let node_port = frontends
        .iter()
        .find(|f| f.family == "IPv4" && f.key == "tcp . 30080")
        .context("the NodePort in inspect outside")?;
    assert_eq!(
        node_port.endpoints,
        BTreeSet::from([at(w.pod_a.ip4, HTTP), at(w.pod_c.ip4, HTTP)])
    );
    assert_eq!(node_port.service_port.as_deref(), Some("shop/web/tcp/http"));
    let e = explain_on(w, 1)?;
    let o = e.outside.context("explain's outside section")?;
    assert_eq!(o.checks.len(), 12, "3 frontends x 2 protocols x 2 families");
    assert!(o.problem.is_none(), "{:?}", o.problem);
    assert_eq!(o.desired_digest, o.installed_digest);
    Ok(())
}

/// A pod's connect to its own node's NodePort: the socket path, no masquerade.
fn own_node_port_from_a_pod(w: &World) -> anyhow::Result<()> {
    let pod_b = w.cluster.pod(0)?;
    let mut in_pod = w.cluster.client_in(&pod_b)?;
    let r = connects(&mut in_pod, at(w.cluster.nodes[0].ip4, 30080), 20, false)?;
    assert_eq!(r.answers(), 20, "{r:?}");
    assert_eq!(
        answered(&r).1,
        BTreeSet::from([pod_b.ip4]),
        "the pod's own address: {r:?}"
    );
    Ok(())
}

/// Local: the endpoint's node answers with the client's address kept; the others do not.
fn local_policy(w: &mut World) -> anyhow::Result<()> {
    w.cluster
        .sandbox
        .write_manifest("web.yaml", &web("Local", &[]))?;
    let (n1, n2) = (&w.cluster.nodes[0], &w.cluster.nodes[1]);
    let outside = &w.cluster.outside.netns;
    let hc = |node: IpAddr| format!("http://{}/", at(node, 32100));
    crate::wait_until("node-1's health check 200", Duration::from_secs(10), || {
        Ok(match curl::curl(outside, "GET", &hc(n1.ip4))? {
            curl::Outcome::Answer(x) if x.status == 200 => Some(x),
            _ => None,
        })
    })?;
    in_sync(&w.agents, 4)?;
    let h1 = curl::get(outside, &hc(n1.ip4))?;
    // A's two addresses (socklb counts both families on one port: docs/compatibility.md).
    assert!(h1.body.contains("\"localEndpoints\": 2"), "{}", h1.body);
    let h2 = curl::get(outside, &hc(n2.ip4))?;
    assert_eq!(h2.status, 503, "{}", h2.body);
    for (family, node_ip, other_ip, client_ip, a_ip) in [
        ("IPv4", n1.ip4, n2.ip4, CLIENT4, w.pod_a.ip4),
        ("IPv6", n1.ip6, n2.ip6, CLIENT6, w.pod_a.ip6),
    ] {
        for udp in [false, true] {
            let port = if udp { 30053 } else { 30080 };
            let r = connects(&mut w.client, at(node_ip, port), 30, udp)?;
            let (backends, seen) = answered(&r);
            assert_eq!(r.answers(), 30, "{family} udp={udp}: {r:?}");
            assert_eq!(
                backends,
                BTreeSet::from([a_ip]),
                "{family} udp={udp}: the local endpoint"
            );
            assert_eq!(
                seen,
                BTreeSet::from([client_ip.parse::<IpAddr>()?]),
                "{family} udp={udp}: the client's own address"
            );
            let r = connects(&mut w.client, at(other_ip, port), 1, udp)?;
            assert_eq!(
                r.answers(),
                0,
                "{family} udp={udp}: no endpoint on node-2: {r:?}"
            );
        }
    }
    let r = connects(&mut w.client, at("192.0.2.10".parse()?, 80), 20, false)?;
    assert_eq!(
        answered(&r),
        (
            BTreeSet::from([w.pod_a.ip4]),
            BTreeSet::from([CLIENT4.parse()?])
        )
    );
    println!(
        "FIGURE outside, Local: the endpoint's node answers with the client's address, node-2 nothing; health checks 200 (2 addresses) and 503"
    );
    Ok(())
}

/// Source ranges: inside them the load-balancer IP answers; outside, only it is refused.
fn source_ranges(w: &mut World) -> anyhow::Result<()> {
    let sandbox = w.cluster.sandbox;
    sandbox.write_manifest(
        "web.yaml",
        &web("Local", &["loadBalancerSourceRanges: [192.168.60.0/25]"]),
    )?;
    in_sync(&w.agents, 4)?;
    let lb = at("192.0.2.10".parse()?, 80);
    let client = &mut w.client;
    crate::wait_until(
        "the load-balancer IP inside the ranges",
        Duration::from_secs(10),
        || Ok((connects(client, lb, 5, false)?.answers() == 5).then_some(())),
    )?;
    sandbox.write_manifest(
        "web.yaml",
        &web("Local", &["loadBalancerSourceRanges: [203.0.113.0/24]"]),
    )?;
    crate::wait_until(
        "the load-balancer IP refused outside the ranges",
        Duration::from_secs(10),
        || Ok((connects(client, lb, 1, false)?.answers() == 0).then_some(())),
    )?;
    for (what, target) in [
        ("NodePort", at(w.cluster.nodes[0].ip4, 30080)),
        ("externalIP", at("198.51.100.7".parse()?, 80)),
    ] {
        let r = connects(client, target, 10, false)?;
        assert_eq!(
            r.answers(),
            10,
            "{what} is not guarded by the ranges: {r:?}"
        );
    }
    println!(
        "FIGURE outside, loadBalancerSourceRanges: inside 5 of 5, outside 0; NodePort and externalIP not guarded"
    );
    Ok(())
}

/// The number of successful syncs an agent's outside path has made.
fn syncs(agent: &AgentProcess) -> anyhow::Result<u64> {
    Ok(agent.status()?.outside.map_or(0, |o| o.syncs))
}

/// Writes the slices and waits until `agent` wrote its rules for them: the time it was done.
fn change(w: &World, agent: usize, endpoints: &[(&Pod, &str, &str)]) -> anyhow::Result<Instant> {
    let before = syncs(&w.agents[agent])?;
    let written = Instant::now();
    w.cluster
        .sandbox
        .write_manifest("web-slices.yaml", &slices(endpoints))?;
    crate::wait_until("the change in the rules", Duration::from_secs(10), || {
        Ok((syncs(&w.agents[agent])? > before).then(Instant::now))
    })?;
    let done = Instant::now();
    println!(
        "FIGURE outside: a change reached node-{}'s rules {} ms after its manifest was written",
        agent + 1,
        (done - written).as_millis()
    );
    Ok(done)
}

/// Changes as a rollout makes them, under load from outside through node-2's NodePort (no
/// endpoint on node-2: every connect crosses to another node): A, C → A, C, D → C, D → D. Every
/// connect is answered, and none that starts after the rules dropped an endpoint reaches it.
/// A connected UDP socket from outside keeps its socket while its endpoint leaves: the flow is
/// cleared and its next datagram reaches a serving endpoint ("should be able to preserve UDP
/// traffic when server pod cycles for a NodePort service").
#[test]
fn removed_endpoints_get_no_new_flow_and_udp_flows_move() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let mut w = World::new(&sandbox, "Cluster")?;
    let pod_d = w.cluster.pod(1)?;
    w.cluster.serve(&pod_d, HTTP, false)?;
    w.cluster.serve(&pod_d, DNS, true)?;
    let (pod_a, pod_c) = (&w.pod_a, &w.pod_c);
    let n2 = w.cluster.nodes[1].ip4;

    // UDP first: a connected socket's flow, then its endpoint leaves.
    let r = w.client.run(&Command::Open {
        id: 1,
        target: at(n2, 30053),
        udp: true,
    })?;
    let (first, _) = answered(&r);
    let first = *first.iter().next().context("an answer")?;
    let (leaving, staying) = if first == pod_a.ip4 {
        (pod_a, pod_c)
    } else {
        (pod_c, pod_a)
    };
    let stay_node = if staying.ip4 == pod_a.ip4 {
        "node-1"
    } else {
        "node-3"
    };
    change(&w, 1, &[(staying, stay_node, READY)])?;
    let moved = crate::wait_until("the UDP flow moved", Duration::from_secs(5), || {
        let r = w.client.run(&Command::Exchange {
            id: 1,
            msg: "again".into(),
        })?;
        Ok(answered(&r).0.contains(&staying.ip4).then_some(()))
    });
    moved.context("the connected UDP socket still reached the endpoint that left")?;
    assert_ne!(leaving.ip4, staying.ip4);
    println!(
        "FIGURE outside, UDP: a connected socket's flow moved to a serving endpoint after its endpoint left"
    );
    change(&w, 1, &[(pod_a, "node-1", READY), (pod_c, "node-3", READY)])?;

    // TCP under load through the rollout.
    let load = socklb_tests::load::Load::start_in(
        &sandbox,
        Some(&w.cluster.outside),
        at(n2, 30080),
        2,
        500,
    )?;
    std::thread::sleep(Duration::from_millis(300));
    change(
        &w,
        1,
        &[
            (pod_a, "node-1", READY),
            (pod_c, "node-3", READY),
            (&pod_d, "node-2", READY),
        ],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let without_a = change(
        &w,
        1,
        &[(pod_c, "node-3", READY), (&pod_d, "node-2", READY)],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let without_c = change(&w, 1, &[(&pod_d, "node-2", READY)])?;
    std::thread::sleep(Duration::from_millis(300));
    let done = load.finish()?;
    assert!(
        done.failed().is_empty(),
        "failed: {:?}",
        &done.failed()[..done.failed().len().min(5)]
    );
    let epoch = |t: Instant| -> u64 {
        let ago = t.elapsed();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(now.saturating_sub(ago).as_nanos()).unwrap_or(u64::MAX)
    };
    let a = format!("{}:{HTTP}", pod_a.ip4);
    let c = format!("{}:{HTTP}", pod_c.ip4);
    let late_a = done
        .connects
        .iter()
        .filter(|x| x.start_ns > epoch(without_a) && x.outcome == a)
        .count();
    let late_c = done
        .connects
        .iter()
        .filter(|x| x.start_ns > epoch(without_c) && x.outcome == c)
        .count();
    assert_eq!((late_a, late_c), (0, 0), "new flows to removed endpoints");
    println!(
        "FIGURE outside, rollout under load: {} connects from outside through node-2's NodePort, 0 failed, 0 to an endpoint after its removal reached the rules",
        done.connects.len()
    );
    Ok(())
}

/// With the agents killed the rules keep serving what was last written; a restart adopts them
/// with no failed connect; rules someone else deletes or flushes are written again; `socklb
/// reset` deletes them; a node without the nft tool, or with kube-proxy's rules, runs the
/// socket path and says why the outside path is off.
#[test]
fn the_rules_outlive_the_agent_and_are_repaired() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let mut w = World::new(&sandbox, "Cluster")?;
    let n2 = &w.cluster.nodes[1];
    let target = at(n2.ip4, 30080);
    let load =
        socklb_tests::load::Load::start_in(&sandbox, Some(&w.cluster.outside), target, 1, 300)?;
    std::thread::sleep(Duration::from_millis(300));
    for agent in &mut w.agents {
        agent.kill9();
    }
    std::thread::sleep(Duration::from_millis(500));
    for agent in &mut w.agents {
        agent.restart(true)?;
    }
    in_sync(&w.agents, 4)?;
    std::thread::sleep(Duration::from_millis(300));
    let done = load.finish()?;
    assert!(done.failed().is_empty(), "{:?}", done.failed().first());
    let restarted = w.agents[1].status()?.outside.context("outside")?;
    println!(
        "FIGURE outside: {} connects from outside through kill -9 of every agent and their restart, 0 failed; the restart's first sync took {:?} ms",
        done.connects.len(),
        restarted.last_sync_ms
    );

    // Someone else's edits.
    let nft = |args: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &n2.netns,
                "sh",
                "-c",
                &format!("nft {args}"),
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "nft {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    for (what, edit) in [
        ("the table deleted", "delete table ip socklb"),
        (
            "the dispatch chain flushed",
            "flush chain ip socklb services",
        ),
        (
            "a NodePort element removed",
            "delete element ip socklb service-nodeports { tcp . 30080 }",
        ),
    ] {
        nft(edit)?;
        let start = Instant::now();
        let client = &mut w.client;
        crate::wait_until(what, Duration::from_secs(20), || {
            Ok((connects(client, target, 1, false)?.answers() == 1).then_some(()))
        })
        .with_context(|| w.agents[1].log_tail(30))?;
        println!(
            "FIGURE outside: {what} by someone else, repaired in {} ms",
            start.elapsed().as_millis()
        );
    }
    assert!(w.agents[1].metric("socklb_outside_drift_repairs_total")? >= Some(3.0));

    // With the agent stopped, an edit stays, and explain names it.
    w.agents[1].stop()?;
    nft("delete element ip socklb service-nodeports { tcp . 30080 }")?;
    let e = explain_on(&w, 1)?;
    let o = e.outside.context("explain's outside section")?;
    assert_ne!(o.desired_digest, o.installed_digest);
    let problem = o.problem.unwrap_or_default();
    assert!(
        problem.contains("tcp . 30080: not in the rules"),
        "{problem}"
    );
    println!("FIGURE outside: explain names the first broken link: {problem}");

    // socklb reset deletes the tables.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &n2.netns])
        .arg(socklb_tests::bins::socklb()?)
        .args(["reset", "--bpffs"])
        .arg(&n2.pins)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tables = nft("list tables")?;
    assert!(!tables.contains("socklb"), "{tables}");
    Ok(())
}

/// A node that cannot run the outside path: without the nft tool, and with kube-proxy's table
/// on it. The agent starts, serves pods through the socket path, and `/status` and the metrics
/// name what is missing.
#[test]
fn a_node_that_cannot_carry_outside_traffic_says_why_and_serves_pods() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let cluster = Cluster::new(&sandbox, 2)?;
    let pod = cluster.pod(1)?;
    cluster.serve(&pod, HTTP, false)?;
    cluster.serve(&pod, DNS, true)?;
    sandbox.write_manifest("nodes.yaml", &cluster.node_manifests())?;
    sandbox.write_manifest("web.yaml", &web("Cluster", &[]))?;
    sandbox.write_manifest("web-slices.yaml", &slices(&[(&pod, "node-2", READY)]))?;
    let client_pod = cluster.pod(0)?;
    for (what, setup, expect) in [
        ("no nft tool", None, "nft tool was not found"),
        (
            "kube-proxy's table",
            Some("add table ip kube-proxy"),
            "kube-proxy's rules are on this node",
        ),
    ] {
        let node = &cluster.nodes[0];
        let mut options = socklb_tests::agent::AgentOptions {
            args: vec![
                "--node-name".into(),
                node.name.clone(),
                "--external-traffic".into(),
                "nftables".into(),
            ],
            netns: Some(node.netns.clone()),
            cgroup: Some(node.cgroup.clone()),
            pin_folder: Some(node.pins.clone()),
            ..Default::default()
        };
        match setup {
            None => options.env.push(("PATH".into(), "/nonexistent".into())),
            Some(script) => {
                let out = std::process::Command::new("ip")
                    .args(["netns", "exec", &node.netns, "nft", script])
                    .output()?;
                anyhow::ensure!(out.status.success());
            }
        }
        let mut agent = sandbox.start_agent(&options)?;
        let outside = agent.status()?.outside.context("an outside report")?;
        assert_eq!(
            outside.condition,
            socklb::status::OutsideCondition::Off,
            "{what}"
        );
        let reason = outside.reason.unwrap_or_default();
        assert!(reason.contains(expect), "{what}: {reason}");
        assert_eq!(
            agent.metric("socklb_outside_rules{state=\"off\"}")?,
            Some(1.0),
            "{what}"
        );
        // The socket path serves the pods.
        let mut client = cluster.client_in(&client_pod)?;
        let r = connects(&mut client, at("10.96.0.80".parse()?, 80), 10, false)?;
        assert_eq!(r.answers(), 10, "{what}: {r:?}");
        agent.stop()?;
        println!("FIGURE outside off ({what}): /status says {reason:?}; pods served 10 of 10");
    }
    Ok(())
}
