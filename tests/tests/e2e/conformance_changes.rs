//! Kubernetes conformance over time: what kube-proxy's e2e tests (`test/e2e/network/service.go`)
//! check while Services change under a running proxy, re-expressed for a socket on this node.
//! The conformance table (`tests/tests/conformance.rs`) judges one state at a time; these tests
//! walk the sequences of the e2e tests: session affinity held, timed out and switched off and on,
//! type changes from ExternalName to ClusterIP to NodePort and back, Services deleted and
//! recreated, the `service-proxy-name` and `headless` labels toggled, the client's own address
//! seen by the backend, endpoints and ports coming and going, and the Node object's zone and
//! addresses changing. Each test names its origin.
//!
//! Objects go through the API stand-in (list, then watch), as a cluster would send them: each
//! change is a MODIFIED event, and an object that gains a label the agent's informers exclude
//! arrives as DELETED, as the API server's watch cache sends it.
//!
//! Also here: `socklb explain` end to end on a Service whose backends sort differently as text
//! than as addresses (issue 11).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use socklb::{
    explain::Link,
    vocab::{Protocol, ServiceAddr},
};
use socklb_tests::{
    Client, Sandbox,
    agent::{AgentOptions, AgentProcess},
    apiserver::{ApiServer, Resource},
    client::{Command, Reply},
    manifests::{Meta, service_object, slice_object},
};

const A: &str = "10.244.1.21";
const B: &str = "10.244.2.34";
const C: &str = "10.244.3.47";
/// This node's address (`--node-address`), where NodePorts are served.
const NODE: &str = "192.0.2.10";

/// A sandbox, the API stand-in and an agent watching it (dropped in this order).
struct World {
    agent: AgentProcess,
    api: ApiServer,
    sandbox: Sandbox,
}

impl World {
    /// `tcp` and `udp` backends answer on their addresses; the agent is `node-a` with
    /// `agent_args` (by default `--node-address 192.0.2.10`).
    fn start(tcp: &[String], udp: &[String], agent_args: Option<&[&str]>) -> anyhow::Result<Self> {
        let sandbox = Sandbox::new()?;
        for b in tcp {
            sandbox.add_backend(b.parse()?, false)?;
        }
        for b in udp {
            sandbox.add_backend(b.parse()?, true)?;
        }
        let api = ApiServer::start()?;
        let agent = start_agent(
            &sandbox,
            &api,
            agent_args.unwrap_or(&["--node-address", NODE]),
        )?;
        Ok(Self {
            agent,
            api,
            sandbox,
        })
    }

    fn apply(&self, objects: &[String]) -> anyhow::Result<()> {
        for o in objects {
            self.api.apply(o)?;
        }
        Ok(())
    }

    /// Waits until the maps say `want` for `target` (`ADDR:PORT[/udp]`), then checks on real
    /// sockets from `client` that connects get exactly that.
    fn expect(&self, client: &mut Client, target: &str, want: Want<'_>) -> anyhow::Result<()> {
        match want {
            Want::Backends(b) => self.sandbox.wait_candidates(target, b)?,
            Want::Refused => self.sandbox.wait_candidates(target, &[])?,
            Want::Untouched => self.sandbox.wait_gone(target)?,
        }
        on_sockets(client, target, want)
    }
}

fn start_agent(sandbox: &Sandbox, api: &ApiServer, args: &[&str]) -> anyhow::Result<AgentProcess> {
    let node = ["--node-name", "node-a"];
    sandbox.start_agent_watching(api, AgentOptions::with_args(node.iter().chain(args)))
}

/// What connects to an address get.
#[derive(Clone, Copy, Debug)]
enum Want<'a> {
    /// Answers from exactly these backends (`IP:PORT`), every one of them.
    Backends(&'a [&'a str]),
    /// ECONNREFUSED at once (kube-proxy: REJECT).
    Refused,
    /// Not translated: in the sandbox no route leads there, so ENETUNREACH.
    Untouched,
}

fn on_sockets(client: &mut Client, target: &str, want: Want<'_>) -> anyhow::Result<()> {
    let addr = ServiceAddr::parse(target).with_context(|| format!("address {target}"))?;
    let expected: BTreeSet<&str> = match want {
        Want::Backends(b) => b.iter().copied().collect(),
        _ => BTreeSet::new(),
    };
    // Enough connects that every expected backend answers at least once (p > 0.9999).
    let count = 12 * expected.len().max(1);
    let reply = client.run(&Command::Connect {
        target: addr.addr,
        count,
        udp: addr.protocol == Protocol::Udp,
    })?;
    let got: BTreeSet<&str> = reply.backends.keys().map(String::as_str).collect();
    let ok = match want {
        Want::Backends(_) => got == expected && reply.errors.is_empty(),
        Want::Refused => got.is_empty() && reply.errors.get("ECONNREFUSED") == Some(&count),
        Want::Untouched => got.is_empty() && reply.errors.get("ENETUNREACH") == Some(&count),
    };
    ensure!(
        ok,
        "{target}: expected {want:?}, got answers {:?} and errors {:?}",
        reply.backends,
        reply.errors
    );
    Ok(())
}

/// A Service in `default`: `spec` lines are YAML (flow style) under `spec:`.
fn service(name: &str, labels: &[(&str, &str)], spec: &[&str]) -> String {
    let meta = labels
        .iter()
        .fold(Meta::default().uid(&format!("uid-{name}")), |m, (k, v)| {
            m.label(k, v)
        });
    service_object(name, &meta, spec, &[])
}

/// An EndpointSlice for `service` with `ports` (a YAML flow list) and `endpoints` (flow maps).
fn slice(name: &str, service: &str, ports: &str, endpoints: &[String]) -> String {
    slice_object(name, &Meta::default(), service, ports, endpoints)
}

/// A ready endpoint.
fn ep(ip: &str) -> String {
    format!("{{addresses: [\"{ip}\"], conditions: {{ready: true}}}}")
}

/// A ready endpoint in `zone` with a hint for it.
fn ep_in(ip: &str, zone: &str) -> String {
    format!(
        "{{addresses: [\"{ip}\"], conditions: {{ready: true}}, zone: {zone}, hints: {{forZones: [{{name: {zone}}}]}}}}"
    )
}

fn at(ips: &[&str], port: u16) -> Vec<String> {
    ips.iter().map(|ip| format!("{ip}:{port}")).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `count` connects in a row to `target`: which backends answered, and how often.
fn answers(client: &mut Client, target: &str, count: usize) -> anyhow::Result<Reply> {
    let reply = client.connect(target.parse()?, count)?;
    ensure!(reply.errors.is_empty(), "{target}: {:?}", reply.errors);
    Ok(reply)
}

/// The e2e's `checkAffinity` with `shouldHold`: 15 connects in a row (`AffinityConfirmCount`)
/// all reach the same backend; returns it.
fn sticks(client: &mut Client, target: &str) -> anyhow::Result<String> {
    let reply = answers(client, target, 15)?;
    ensure!(
        reply.backends.len() == 1,
        "{target}: affinity should hold, 15 connects reached {:?}",
        reply.backends
    );
    Ok(reply.backends.keys().next().cloned().unwrap_or_default())
}

fn affinity_of(sandbox: &Sandbox, target: &str) -> anyhow::Result<Option<u32>> {
    Ok(sandbox.lookup(target)?.affinity_timeout_s)
}

fn wait_affinity(sandbox: &Sandbox, target: &str, want: Option<u32>) -> anyhow::Result<()> {
    let start = Instant::now();
    while affinity_of(sandbox, target)? != want {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "{target}: affinity in the maps is {:?}, expected {want:?}",
            affinity_of(sandbox, target)?
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

fn affinity_service(session_affinity: &str, timeout: Option<u32>) -> String {
    let config = timeout.map_or_else(String::new, |t| {
        format!("sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}")
    });
    service(
        "affinity-nodeport",
        &[],
        &[
            "type: NodePort",
            "clusterIP: 10.96.4.4",
            "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30080}]",
            &format!("sessionAffinity: {session_affinity}"),
            &config,
        ],
    )
}

fn affinity_world(timeout: Option<u32>) -> anyhow::Result<World> {
    let world = World::start(&at(&[A, B, C], 9376), &[], None)?;
    world.apply(&[
        affinity_service("ClientIP", timeout),
        slice(
            "affinity-nodeport-1",
            "affinity-nodeport",
            "[{name: http, protocol: TCP, port: 9376}]",
            &[ep(A), ep(B), ep(C)],
        ),
    ])?;
    world
        .sandbox
        .wait_candidates("10.96.4.4:80", &strs(&at(&[A, B, C], 9376)))?;
    Ok(world)
}

/// Origin: test/e2e/network/service.go "should have session affinity work for service with
/// type clusterIP `[LinuxOnly]`" and "... for NodePort service `[LinuxOnly]`" `[Conformance]`, "should
/// be able to switch session affinity for service with type clusterIP `[LinuxOnly]`" and "... for
/// NodePort service `[LinuxOnly]`" `[Conformance]` (`execAffinityTestForNonLBServiceWithOptionalTransition`,
/// `checkAffinity`: 15 answers in a row from one pod prove affinity, any two different ones its
/// absence); the affinity is per service port, shared by its ClusterIP and NodePort (iptables:
/// one `recent` list per endpoint chain of the service port).
/// socklb keys affinity by client pod (cgroup), not source IP: a second pod has its own.
#[test]
fn session_affinity_holds_and_switches_off_and_on() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let world = affinity_world(None)?;
    let (cluster_ip, node_port) = ("10.96.4.4:80", format!("{NODE}:30080"));
    assert_eq!(affinity_of(&world.sandbox, cluster_ip)?, Some(10_800));
    let mut client = world.sandbox.client()?;
    let chosen = sticks(&mut client, cluster_ip)?;
    assert_eq!(
        sticks(&mut client, &node_port)?,
        chosen,
        "the NodePort shares the ClusterIP's affinity"
    );
    let other_pod = world.sandbox.served_pod("other", "10.244.100.7")?;
    let mut other = world.sandbox.client_in(&other_pod)?;
    sticks(&mut other, cluster_ip)?;

    world.apply(&[affinity_service("None", None)])?;
    wait_affinity(&world.sandbox, cluster_ip, None)?;
    for target in [cluster_ip, node_port.as_str()] {
        let spread = answers(&mut client, target, 30)?;
        assert!(
            spread.backends.len() > 1,
            "{target}: affinity switched off, yet 30 connects reached {:?}",
            spread.backends
        );
    }

    world.apply(&[affinity_service("ClientIP", None)])?;
    wait_affinity(&world.sandbox, cluster_ip, Some(10_800))?;
    let chosen = sticks(&mut client, cluster_ip)?;
    assert_eq!(sticks(&mut client, &node_port)?, chosen);
    Ok(())
}

/// Origin: test/e2e/network/service.go "should have session affinity timeout work for service
/// with type clusterIP `[LinuxOnly]`" and "... for NodePort service `[LinuxOnly]`"
/// (`execAffinityTestForSessionAffinityTimeout`: sticky first; then, sleeping timeout + 5 s
/// between tries, a second pod answers within 10 tries); the timeout there is 125 s, here 2 s.
/// The timeout runs from the last new connection (pkg/proxy/iptables/proxier.go: `recent
/// --rcheck --seconds` on the way in, `--set` on each new connection): connects every second
/// keep the affinity past the timeout.
#[test]
fn session_affinity_times_out_from_the_last_connect() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let timeout = 2;
    let world = affinity_world(Some(timeout))?;
    let mut client = world.sandbox.client()?;
    for target in ["10.96.4.4:80".to_string(), format!("{NODE}:30080")] {
        let chosen = sticks(&mut client, &target)?;
        for _ in 0..5 {
            std::thread::sleep(Duration::from_secs(1));
            let r = answers(&mut client, &target, 1)?;
            assert!(
                r.backends.contains_key(&chosen),
                "{target}: a connect every second keeps the affinity; got {:?}",
                r.backends
            );
        }
        let mut seen = BTreeSet::from([chosen]);
        for _ in 0..10 {
            std::thread::sleep(Duration::from_secs(u64::from(timeout) + 1));
            seen.extend(answers(&mut client, &target, 1)?.backends.into_keys());
            if seen.len() > 1 {
                break;
            }
        }
        assert!(
            seen.len() > 1,
            "{target}: still sticky after the timeout: {seen:?}"
        );
    }
    Ok(())
}

fn type_change_slice(ports: &str) -> String {
    slice(
        "externalname-service-1",
        "externalname-service",
        ports,
        &[ep(A), ep(B), ep(C)],
    )
}

/// `externalname-service` of `type_` with a cluster IP (none for ExternalName) and `ports`.
fn typed_service(type_: &str, cluster_ip: &str, ports: &str) -> String {
    let mut spec = vec![format!("type: {type_}")];
    if type_ == "ExternalName" {
        spec.push("externalName: externalsvc.example.com".into());
    } else {
        spec.push(format!("clusterIP: {cluster_ip}"));
    }
    if !ports.is_empty() {
        spec.push(format!("ports: {ports}"));
    }
    service("externalname-service", &[], &strs(&spec))
}

/// Origin: test/e2e/network/service.go "should be able to change the type from ExternalName to
/// ClusterIP" `[Conformance]`, "... from ExternalName to NodePort" `[Conformance]`, "should be
/// able to update service type to NodePort listening on same port number but different
/// protocols", "should serve endpoints on same port and different protocols" `[Conformance]`
/// (removing the UDP port stops UDP), "... from ClusterIP to ExternalName" `[Conformance]` and
/// "... from NodePort to ExternalName" `[Conformance]`; pkg/proxy/util/utils.go
/// `ShouldSkipService` (ExternalName gets nothing) and pkg/proxy/servicechangetracker.go `Update`
/// (a type change is a port-map update).
#[test]
fn type_changes_from_external_name_to_cluster_ip_to_node_port_and_back() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let backends = at(&[A, B, C], 9376);
    let world = World::start(&backends, &backends, None)?;
    let names = strs(&backends);
    let all = Want::Backends(&names);
    let w = &world;
    let mut client = world.sandbox.client()?;
    let c = &mut client;
    let (vip, vip_udp) = ("10.96.5.5:80", "10.96.5.5:80/udp");
    let (np_tcp, np_udp) = (format!("{NODE}:30080"), format!("{NODE}:30081/udp"));
    let http = "[{name: http, protocol: TCP, port: 80, targetPort: 9376}]";
    let http_np = "[{name: http, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30080}]";
    let tcp_np = "[{name: tcp-port, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30080}]";
    let tcp_udp_np = "[{name: tcp-port, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30080}, {name: udp-port, protocol: UDP, port: 80, targetPort: 9376, nodePort: 30081}]";
    let slice_http = "[{name: http, protocol: TCP, port: 9376}]";

    // ExternalName: a DNS alias; nothing is written, even with a slice labelled for it.
    w.apply(&[
        typed_service("ExternalName", "", http),
        type_change_slice(slice_http),
    ])?;
    // Let the agent see both objects: a marker Service written after them is served.
    w.apply(&[
        plain_service("marker", "10.96.5.99", &[]),
        plain_slice("marker", &[A]),
    ])?;
    w.expect(c, "10.96.5.99:80", Want::Backends(&[&backends[0]]))?;
    let written: Vec<String> = w
        .sandbox
        .services()?
        .into_iter()
        .filter_map(|s| s.service.map(|k| k.service.to_string()))
        .collect();
    assert_eq!(written, ["default/marker"], "ExternalName gets no frontend");

    // ExternalName -> ClusterIP.
    w.apply(&[typed_service("ClusterIP", "10.96.5.5", http)])?;
    w.expect(c, vip, all)?;
    w.expect(c, &np_tcp, Want::Untouched)?;

    // ClusterIP -> NodePort.
    w.apply(&[typed_service("NodePort", "10.96.5.5", http_np)])?;
    w.expect(c, &np_tcp, all)?;
    w.expect(c, vip, all)?;

    // NodePort on TCP and UDP, same port number, a node port each.
    w.apply(&[
        typed_service("NodePort", "10.96.5.5", tcp_udp_np),
        type_change_slice(
            "[{name: tcp-port, protocol: TCP, port: 9376}, {name: udp-port, protocol: UDP, port: 9376}]",
        ),
    ])?;
    for target in [vip, vip_udp, &np_tcp, &np_udp] {
        w.expect(c, target, all)?;
    }

    // The UDP port removed: UDP stops, TCP stays.
    w.apply(&[typed_service("NodePort", "10.96.5.5", tcp_np)])?;
    w.expect(c, vip_udp, Want::Untouched)?;
    w.expect(c, &np_udp, Want::Untouched)?;
    w.expect(c, &np_tcp, all)?;

    // NodePort -> ClusterIP: the node port is released.
    w.apply(&[
        typed_service("ClusterIP", "10.96.5.5", http),
        type_change_slice(slice_http),
    ])?;
    w.expect(c, &np_tcp, Want::Untouched)?;
    w.expect(c, vip, all)?;

    // ClusterIP -> ExternalName: the cluster IP is cleared, nothing is served.
    w.apply(&[typed_service("ExternalName", "", "")])?;
    w.expect(c, vip, Want::Untouched)?;

    // ExternalName -> NodePort, with a newly allocated cluster IP and node port.
    w.apply(&[typed_service(
        "NodePort",
        "10.96.5.6",
        "[{name: http, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30082}]",
    )])?;
    w.expect(c, "10.96.5.6:80", all)?;
    w.expect(c, &format!("{NODE}:30082"), all)?;
    w.expect(c, vip, Want::Untouched)?;
    Ok(())
}

fn plain_service(name: &str, cluster_ip: &str, labels: &[(&str, &str)]) -> String {
    service(
        name,
        labels,
        &[
            &format!("clusterIP: {cluster_ip}"),
            "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376}]",
        ],
    )
}

fn plain_slice(service: &str, ips: &[&str]) -> String {
    let endpoints: Vec<String> = ips.iter().map(|ip| ep(ip)).collect();
    slice(
        &format!("{service}-1"),
        service,
        "[{name: http, protocol: TCP, port: 9376}]",
        &endpoints,
    )
}

/// Origin: test/e2e/network/service.go "should be able to up and down services" (a deleted
/// Service's IP stops serving, the others keep working, a new Service gets its own IP) and
/// "should work after the service has been recreated" (deleted, then created again with the
/// same selector: the new ClusterIP serves the same pods); pkg/proxy/endpointslicecache.go (a
/// slice whose Service is gone is kept but serves nothing) and "should be rejected when no
/// endpoints exist" (REJECT once the last slice goes).
#[test]
fn a_deleted_service_stops_and_a_recreated_one_serves() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let world = World::start(&at(&[A, B, C], 9376), &[], None)?;
    let w = &world;
    let mut client = world.sandbox.client()?;
    let c = &mut client;
    let (a, bc) = (at(&[A], 9376), at(&[B, C], 9376));
    w.apply(&[
        plain_service("up-down-1", "10.96.6.1", &[]),
        plain_slice("up-down-1", &[A]),
        plain_service("up-down-2", "10.96.6.2", &[]),
        plain_slice("up-down-2", &[B, C]),
    ])?;
    w.expect(c, "10.96.6.1:80", Want::Backends(&strs(&a)))?;
    w.expect(c, "10.96.6.2:80", Want::Backends(&strs(&bc)))?;

    // Stop up-down-1 (its pods stay, so does its slice): its IP stops, up-down-2 works.
    w.api.delete(Resource::Services, "default", "up-down-1");
    w.expect(c, "10.96.6.1:80", Want::Untouched)?;
    w.expect(c, "10.96.6.2:80", Want::Backends(&strs(&bc)))?;

    // A third Service, another IP.
    w.apply(&[
        plain_service("up-down-3", "10.96.6.3", &[]),
        plain_slice("up-down-3", &[C]),
    ])?;
    w.expect(c, "10.96.6.3:80", Want::Backends(&[&format!("{C}:9376")]))?;
    w.expect(c, "10.96.6.2:80", Want::Backends(&strs(&bc)))?;

    // up-down-1 created again: a new ClusterIP serves the same pods at once (the slice was kept).
    w.apply(&[plain_service("up-down-1", "10.96.6.4", &[])])?;
    w.expect(c, "10.96.6.4:80", Want::Backends(&strs(&a)))?;
    w.expect(c, "10.96.6.1:80", Want::Untouched)?;

    // Deleted and created again in one go, with the same ClusterIP.
    w.api.delete(Resource::Services, "default", "up-down-1");
    w.apply(&[plain_service("up-down-1", "10.96.6.4", &[])])?;
    std::thread::sleep(Duration::from_millis(300));
    w.expect(c, "10.96.6.4:80", Want::Backends(&strs(&a)))?;

    // Its last slice gone: refused.
    w.api
        .delete(Resource::EndpointSlices, "default", "up-down-1-1");
    w.expect(c, "10.96.6.4:80", Want::Refused)?;
    w.expect(c, "10.96.6.2:80", Want::Backends(&strs(&bc)))?;
    Ok(())
}

/// Origin: test/e2e/network/service.go "should implement service.kubernetes.io/service-proxy-name"
/// and "should implement service.kubernetes.io/headless": a Service created with the label is
/// never served; another one stops when the label is added and serves again when it is removed;
/// cmd/kube-proxy/app/server.go (the informers' label selector: the label's presence, any value,
/// hides the Service). socklb is a proxy of its own: `service-proxy-name: socklb` is served.
#[test]
fn service_proxy_name_and_headless_labels_turn_a_service_off_and_on() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let world = World::start(&at(&[A, B, C], 9376), &[], None)?;
    let w = &world;
    let mut client = world.sandbox.client()?;
    let c = &mut client;
    let bc = at(&[B, C], 9376);
    let bc_names = strs(&bc);
    let bc = Want::Backends(&bc_names);
    for (n, label, value) in [
        (1, "service.kubernetes.io/service-proxy-name", "foo-bar"),
        (2, "service.kubernetes.io/headless", ""),
    ] {
        let (disabled, toggled) = (format!("disabled-{n}"), format!("toggled-{n}"));
        let (off_ip, on_ip) = (format!("10.96.7.{n}1"), format!("10.96.7.{n}2"));
        let (off_target, on_target) = (format!("{off_ip}:80"), format!("{on_ip}:80"));
        w.apply(&[
            plain_service(&disabled, &off_ip, &[(label, value)]),
            plain_slice(&disabled, &[A]),
            plain_service(&toggled, &on_ip, &[]),
            plain_slice(&toggled, &[B, C]),
        ])?;
        w.expect(c, &on_target, bc)?;
        on_sockets(c, &off_target, Want::Untouched)?;

        w.apply(&[plain_service(&toggled, &on_ip, &[(label, value)])])?;
        w.expect(c, &on_target, Want::Untouched)?;

        w.apply(&[plain_service(&toggled, &on_ip, &[])])?;
        w.expect(c, &on_target, bc)?;
        w.expect(c, &off_target, Want::Untouched)?;
    }
    // Named for socklb: served.
    w.apply(&[
        plain_service(
            "ours",
            "10.96.7.99",
            &[("service.kubernetes.io/service-proxy-name", "socklb")],
        ),
        plain_slice("ours", &[B, C]),
    ])?;
    w.expect(c, "10.96.7.99:80", bc)?;
    Ok(())
}

/// The client addresses the backends saw.
fn seen_as(reply: &Reply) -> anyhow::Result<BTreeSet<IpAddr>> {
    reply
        .seen_as
        .keys()
        .map(|p| Ok(p.parse::<SocketAddr>()?.ip()))
        .collect()
}

/// Origin: test/e2e/network/service.go "should preserve source pod IP for traffic thru service
/// cluster IP `[LinuxOnly]`" (`execSourceIPTest`: the backend echoes the client address, which
/// must be the client pod's IP, from pods on two nodes). socklb never rewrites a source address:
/// through a NodePort too (where kube-proxy masquerades with externalTrafficPolicy Cluster), over
/// TCP, connected UDP and unconnected UDP.
#[test]
fn backends_see_the_client_pods_own_address() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let backends = at(&[A, B, C], 9376);
    let world = World::start(&backends, &backends, None)?;
    world.apply(&[
        service(
            "sourceip-test",
            &[],
            &[
                "type: NodePort",
                "clusterIP: 10.96.3.3",
                "ports: [{name: tcp, protocol: TCP, port: 8080, targetPort: 9376, nodePort: 30080}, {name: udp, protocol: UDP, port: 8080, targetPort: 9376, nodePort: 30080}]",
            ],
        ),
        slice(
            "sourceip-test-1",
            "sourceip-test",
            "[{name: tcp, protocol: TCP, port: 9376}, {name: udp, protocol: UDP, port: 9376}]",
            &[ep(A), ep(B), ep(C)],
        ),
    ])?;
    world
        .sandbox
        .wait_candidates("10.96.3.3:8080/udp", &strs(&backends))?;
    world
        .sandbox
        .wait_candidates(&format!("{NODE}:30080"), &strs(&backends))?;
    let second = world.sandbox.served_pod("second", "10.244.100.8")?;
    let pods = [
        (
            world.sandbox.client()?,
            socklb_tests::sandbox::CLIENT_V4.parse::<IpAddr>()?,
        ),
        (world.sandbox.client_in(&second)?, "10.244.100.8".parse()?),
    ];
    for (mut client, own) in pods {
        for (target, udp) in [
            ("10.96.3.3:8080", false),
            ("10.96.3.3:8080", true),
            ("192.0.2.10:30080", false),
            ("192.0.2.10:30080", true),
        ] {
            let r = client.run(&Command::Connect {
                target: target.parse()?,
                count: 10,
                udp,
            })?;
            ensure!(r.errors.is_empty(), "{target} udp={udp}: {:?}", r.errors);
            assert_eq!(
                seen_as(&r)?,
                BTreeSet::from([own]),
                "{target} udp={udp}: the backends saw {:?}",
                r.seen_as
            );
        }
        let r = client.run(&Command::SendTo {
            target: "10.96.3.3:8080".parse()?,
            count: 10,
            id: None,
        })?;
        ensure!(r.errors.is_empty(), "sendto: {:?}", r.errors);
        assert_eq!(seen_as(&r)?, BTreeSet::from([own]), "unconnected UDP");
    }
    Ok(())
}

/// Origin: test/e2e/network/service.go "should serve a basic endpoint from pods" `[Conformance]`
/// (the endpoints follow pods: pod1, pod1 and pod2, pod2, none), "should serve multiport
/// endpoints from pods" `[Conformance]` (two named target ports on different pods), "should be
/// updated after adding or deleting ports " (a port added serves its pod, removed stops while the
/// first keeps working) and "should be rejected when no endpoints exist" (REJECT).
#[test]
fn endpoints_and_ports_follow_their_changes() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let mut tcp = at(&[A, B], 9376);
    tcp.extend([format!("{A}:100"), format!("{B}:101")]);
    let world = World::start(&tcp, &[], None)?;
    let w = &world;
    let mut client = world.sandbox.client()?;
    let c = &mut client;
    w.apply(&[plain_service("endpoint-test2", "10.96.9.1", &[])])?;
    w.expect(c, "10.96.9.1:80", Want::Refused)?;
    for step in [&[A][..], &[A, B], &[B]] {
        w.apply(&[plain_slice("endpoint-test2", step)])?;
        let want: Vec<String> = at(step, 9376);
        w.expect(c, "10.96.9.1:80", Want::Backends(&strs(&want)))?;
    }
    w.apply(&[plain_slice("endpoint-test2", &[])])?;
    w.expect(c, "10.96.9.1:80", Want::Refused)?;

    // Two named target ports, each on its own pod (the slice controller writes a slice per
    // distinct port set).
    let multiport = |ports: &str| {
        service(
            "multi-endpoint-test",
            &[],
            &["clusterIP: 10.96.9.2", &format!("ports: {ports}")],
        )
    };
    let both = "[{name: portname1, port: 80, targetPort: svc1}, {name: portname2, port: 81, targetPort: svc2}]";
    w.apply(&[
        multiport(both),
        slice(
            "multi-endpoint-test-1",
            "multi-endpoint-test",
            "[{name: portname1, protocol: TCP, port: 100}]",
            &[ep(A)],
        ),
        slice(
            "multi-endpoint-test-2",
            "multi-endpoint-test",
            "[{name: portname2, protocol: TCP, port: 101}]",
            &[ep(B)],
        ),
    ])?;
    let (pod1, pod2) = (format!("{A}:100"), format!("{B}:101"));
    w.expect(c, "10.96.9.2:80", Want::Backends(&[&pod1]))?;
    w.expect(c, "10.96.9.2:81", Want::Backends(&[&pod2]))?;

    // The second port removed from the Service: it stops, the first keeps working.
    w.apply(&[multiport("[{name: portname1, port: 80, targetPort: svc1}]")])?;
    w.expect(c, "10.96.9.2:81", Want::Untouched)?;
    w.expect(c, "10.96.9.2:80", Want::Backends(&[&pod1]))?;
    // And added again.
    w.apply(&[multiport(both)])?;
    w.expect(c, "10.96.9.2:81", Want::Backends(&[&pod2]))?;
    Ok(())
}

fn node(zone: Option<&str>, address: &str) -> String {
    let labels = zone.map_or_else(String::new, |z| {
        format!("  labels: {{topology.kubernetes.io/zone: {z}}}\n")
    });
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\n{labels}status:\n  addresses: [{{type: InternalIP, address: {address}}}, {{type: Hostname, address: node-a}}]\n"
    )
}

/// Origin: pkg/proxy/config/config.go `NodeTopologyConfig.handleNodeEvent` (this node's zone
/// comes from its Node's `topology.kubernetes.io/zone` label; a fresh map on every change, so a
/// removed label clears the zone; node deletion is ignored), pkg/proxy/topology.go
/// `CategorizeEndpoints` (zone hints for this zone only), and cmd/kube-proxy/app/server.go (the
/// node's IPs serve NodePorts). socklb's flags (`--zone`, `--node-address`) win over the Node.
#[test]
fn the_node_object_sets_zone_and_node_port_addresses_unless_flags_do() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox_backends = at(&[A, B, C], 9376);
    let mut world = World::start(&sandbox_backends, &[], Some(&[][..]))?;
    world.apply(&[
        node(Some("zone-a"), "192.0.2.10"),
        service(
            "hinted",
            &[],
            &[
                "type: NodePort",
                "clusterIP: 10.96.2.2",
                "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376, nodePort: 30080}]",
            ],
        ),
        slice(
            "hinted-1",
            "hinted",
            "[{name: http, protocol: TCP, port: 9376}]",
            &[ep_in(A, "zone-a"), ep_in(B, "zone-b"), ep_in(C, "zone-b")],
        ),
    ])?;
    let mut client = world.sandbox.client()?;
    let c = &mut client;
    let (a, bc, abc) = (at(&[A], 9376), at(&[B, C], 9376), at(&[A, B, C], 9376));
    world.expect(c, "10.96.2.2:80", Want::Backends(&strs(&a)))?;
    world.expect(c, "192.0.2.10:30080", Want::Backends(&strs(&a)))?;

    // The zone label removed, the address changed.
    world.apply(&[node(None, "192.0.2.11")])?;
    world.expect(c, "10.96.2.2:80", Want::Backends(&strs(&abc)))?;
    world.expect(c, "192.0.2.11:30080", Want::Backends(&strs(&abc)))?;
    world.expect(c, "192.0.2.10:30080", Want::Untouched)?;

    // Another zone.
    world.apply(&[node(Some("zone-b"), "192.0.2.11")])?;
    world.expect(c, "10.96.2.2:80", Want::Backends(&strs(&bc)))?;

    // The Node deleted: the last identity stays.
    world.api.delete(Resource::Nodes, "", "node-a");
    std::thread::sleep(Duration::from_millis(500));
    world.expect(c, "10.96.2.2:80", Want::Backends(&strs(&bc)))?;
    world.expect(c, "192.0.2.11:30080", Want::Backends(&strs(&bc)))?;

    // A new agent with flags: they win over the Node (zone-b, 192.0.2.11).
    world.apply(&[node(Some("zone-b"), "192.0.2.11")])?;
    world.agent.kill9();
    world.agent = start_agent(
        &world.sandbox,
        &world.api,
        &["--zone", "zone-a", "--node-address", "192.0.2.10"],
    )?;
    world.expect(c, "10.96.2.2:80", Want::Backends(&strs(&a)))?;
    world.expect(c, "192.0.2.10:30080", Want::Backends(&strs(&a)))?;
    world.expect(c, "192.0.2.11:30080", Want::Untouched)?;
    Ok(())
}

/// Issue 11: `socklb explain` on a dual-stack Service whose backends sort differently as text
/// than as addresses (`10.244.1.2 < .9 < .10 < .100` numerically, not as text; `fd00:244::9 <
/// ::a < ::10` likewise) says healthy and exits 0; the maps' and the desired backends agree as typed
/// addresses, and so do the digests. Every backend answers, on both families.
#[test]
fn explain_calls_a_service_healthy_whatever_the_text_order_of_its_backends() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let v4: Vec<String> = ["2", "9", "10", "11", "19", "20", "99", "100", "101", "200"]
        .iter()
        .map(|h| format!("10.244.1.{h}"))
        .collect();
    let v6: Vec<String> = ["9", "a", "10", "1f", "a0", "100"]
        .iter()
        .map(|h| format!("fd00:244::{h}"))
        .collect();
    let sandbox = Sandbox::new()?;
    let mut expected: BTreeMap<String, Vec<SocketAddr>> = BTreeMap::new();
    for (ips, vip) in [(&v4, "10.96.8.8:80"), (&v6, "[fd00:96::8]:80")] {
        let mut addrs = Vec::new();
        for ip in ips {
            let addr = SocketAddr::new(ip.parse()?, 9376);
            sandbox.add_backend(addr, false)?;
            addrs.push(addr);
        }
        addrs.sort();
        expected.insert(vip.to_string(), addrs);
    }
    let endpoints = |ips: &[String]| ips.iter().map(|ip| ep(ip)).collect::<Vec<_>>();
    let ports = "[{name: http, protocol: TCP, port: 9376}]";
    sandbox.write_manifest(
        "many.yaml",
        &[
            service(
                "many",
                &[],
                &[
                    "clusterIPs: [10.96.8.8, \"fd00:96::8\"]",
                    "ipFamilies: [IPv4, IPv6]",
                    "ipFamilyPolicy: RequireDualStack",
                    "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376}]",
                ],
            ),
            slice("many-v4", "many", ports, &endpoints(&v4)),
            slice("many-v6", "many", ports, &endpoints(&v6)),
        ]
        .join("---\n"),
    )?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let mut client = sandbox.client()?;
    for (vip, addrs) in &expected {
        let want: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        sandbox.wait_candidates(vip, &strs(&want))?;
        on_sockets(&mut client, vip, Want::Backends(&strs(&want)))?;
    }
    for target in ["default/many", "10.96.8.8:80", "[fd00:96::8]:80"] {
        for agent_addr in [None, Some(agent.listen.to_string())] {
            let (e, ok) = match &agent_addr {
                None => sandbox.explain(target)?,
                Some(a) => sandbox.explain_asking(target, a)?,
            };
            let case = format!(
                "explain {target} (asking the agent: {})",
                agent_addr.is_some()
            );
            assert!(ok, "{case}: exit status not 0: {}", e.verdict);
            assert_eq!(e.broken, Link::None, "{case}: {}", e.verdict);
            assert_eq!(e.desired_digest, e.maps_digest, "{case}");
            let checked: BTreeMap<String, (Option<Vec<SocketAddr>>, Vec<SocketAddr>)> = e
                .maps
                .iter()
                .map(|m| {
                    let mut held = m.maps_backends.clone();
                    if let Some(h) = held.as_mut() {
                        h.sort();
                    }
                    let mut desired = m.desired_backends.clone();
                    desired.sort();
                    (m.frontend.addr.to_string(), (held, desired))
                })
                .collect();
            for (vip, addrs) in &expected {
                assert_eq!(
                    checked.get(vip),
                    Some(&(Some(addrs.clone()), addrs.clone())),
                    "{case}: {vip}"
                );
            }
            assert!(e.maps.iter().all(|m| m.matches), "{case}: {:?}", e.maps);
        }
    }
    Ok(())
}

/// Issue 20.5: without `--kubernetes-version` the agent follows the API server's version
/// (`/version`): kube-proxy 1.30 ignores zone hints on a Service without the topology
/// annotation (pkg/proxy/topology.go `canUseTopology`, `ServiceTrafficDistribution` off), 1.33
/// uses them (`topologyModeFromHints`).
#[test]
fn topology_rules_follow_the_api_servers_version() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in at(&[A, B, C], 9376) {
        sandbox.add_backend(b.parse()?, false)?;
    }
    let api = ApiServer::start()?;
    api.set_minor_version(30);
    for o in [
        service(
            "close",
            &[],
            &[
                "clusterIP: 10.96.2.3",
                "trafficDistribution: PreferClose",
                "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376}]",
            ],
        ),
        slice(
            "close-1",
            "close",
            "[{name: http, protocol: TCP, port: 9376}]",
            &[ep_in(A, "zone-a"), ep_in(B, "zone-b"), ep_in(C, "zone-b")],
        ),
    ] {
        api.apply(&o)?;
    }
    let mut agent = start_agent(&sandbox, &api, &["--zone", "zone-a"])?;
    let mut client = sandbox.client()?;
    let (a, abc) = (at(&[A], 9376), at(&[A, B, C], 9376));
    sandbox.wait_candidates("10.96.2.3:80", &strs(&abc))?;
    on_sockets(&mut client, "10.96.2.3:80", Want::Backends(&strs(&abc)))?;
    assert!(
        agent.log_text().contains("kubernetes=1.30"),
        "{}",
        agent.log_text()
    );

    // The control plane upgraded to 1.33; the agent restarts (as on its next rollout).
    api.set_minor_version(33);
    agent.restart(true)?;
    sandbox.wait_candidates("10.96.2.3:80", &strs(&a))?;
    on_sockets(&mut client, "10.96.2.3:80", Want::Backends(&strs(&a)))?;
    Ok(())
}

/// The control plane is upgraded while the agent runs (1.33 → 1.34): the API server goes away
/// and comes back newer, and the agent, asking `/version` again once its watches work again,
/// follows 1.34's rules without a restart: node hints (`PreferSameNode`,
/// `PreferSameTrafficDistribution` on from 1.34) instead of zone hints (pkg/proxy/topology.go
/// as each release has it). An API server that answers with the older version afterwards (one
/// not yet upgraded, behind the same address) does not take the rules back.
#[test]
fn topology_rules_follow_an_api_server_upgraded_while_the_agent_runs() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in at(&[A, B, C], 9376) {
        sandbox.add_backend(b.parse()?, false)?;
    }
    let api = ApiServer::start()?;
    api.set_minor_version(33);
    let hinted = |ip: &str, node: &str, zone: &str| {
        format!(
            "{{addresses: [\"{ip}\"], conditions: {{ready: true}}, nodeName: {node}, zone: {zone}, hints: {{forZones: [{{name: {zone}}}], forNodes: [{{name: {node}}}]}}}}"
        )
    };
    for o in [
        service(
            "same-node",
            &[],
            &[
                "clusterIP: 10.96.2.4",
                "trafficDistribution: PreferSameNode",
                "ports: [{name: http, protocol: TCP, port: 80, targetPort: 9376}]",
            ],
        ),
        slice(
            "same-node-1",
            "same-node",
            "[{name: http, protocol: TCP, port: 9376}]",
            &[
                hinted(A, "node-a", "zone-a"),
                hinted(B, "node-b", "zone-b"),
                hinted(C, "node-c", "zone-a"),
            ],
        ),
    ] {
        api.apply(&o)?;
    }
    let agent = start_agent(&sandbox, &api, &["--zone", "zone-a"])?;
    let mut client = sandbox.client()?;
    let (a, ac) = (at(&[A], 9376), at(&[A, C], 9376));
    // 1.33: the zone hints (node hints are ignored).
    sandbox.wait_candidates("10.96.2.4:80", &strs(&ac))?;
    on_sockets(&mut client, "10.96.2.4:80", Want::Backends(&strs(&ac)))?;

    // The upgrade: the API server restarts as 1.34.
    let asked = api.requests("version");
    api.stop();
    api.set_minor_version(34);
    std::thread::sleep(Duration::from_secs(2));
    api.restart(true)?;
    sandbox
        .wait_candidates("10.96.2.4:80", &strs(&a))
        .with_context(|| agent.log_text())?;
    on_sockets(&mut client, "10.96.2.4:80", Want::Backends(&strs(&a)))?;
    assert!(api.requests("version") > asked);
    let log = agent.log_text();
    assert!(
        log.contains("the API server's version changed") && log.contains("kubernetes=1.34"),
        "{log}"
    );

    // An API server of the old version answers again (mid-upgrade): the rules stay 1.34's.
    let asked = api.requests("version");
    api.stop();
    api.set_minor_version(33);
    std::thread::sleep(Duration::from_secs(2));
    api.restart(true)?;
    let start = Instant::now();
    while api.requests("version") == asked {
        ensure!(
            start.elapsed() < Duration::from_secs(15),
            "the version was not asked again: {}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    on_sockets(&mut client, "10.96.2.4:80", Want::Backends(&strs(&a)))?;
    assert!(
        agent.log_text().contains("keeping the newer rules"),
        "{}",
        agent.log_text()
    );
    Ok(())
}
