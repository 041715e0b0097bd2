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

use anyhow::{Context as _, bail};
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

/// Waits until `check` holds, at most `limit`.
fn eventually<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(t) = check()? {
            return Ok(t);
        }
        if start.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every agent's outside rules are in sync with at least `ports` service ports.
fn in_sync(agents: &[AgentProcess], ports: usize) -> anyhow::Result<()> {
    for agent in agents {
        eventually("the outside rules in sync", Duration::from_secs(20), || {
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
    source_ranges(&mut w)
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
    eventually("node-1's health check 200", Duration::from_secs(10), || {
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
    eventually(
        "the load-balancer IP inside the ranges",
        Duration::from_secs(10),
        || Ok((connects(client, lb, 5, false)?.answers() == 5).then_some(())),
    )?;
    sandbox.write_manifest(
        "web.yaml",
        &web("Local", &["loadBalancerSourceRanges: [203.0.113.0/24]"]),
    )?;
    eventually(
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
