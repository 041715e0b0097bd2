//! What a real node has around socklb (issue 20): cloud load balancers probing the ports
//! kube-proxy served (each healthCheckNodePort, and /healthz on 10256) through API server
//! outages, failed writes, Node deletions and both address families, and the node-local DNS
//! cache holding the DNS ClusterIP on a dummy interface of the node.
//!
//! The agent runs in a "node" network namespace of its own, on the sandbox's bridge at
//! `NODE_IP`, as it runs in the host's on a real node: the probes come from outside it (curl in
//! the client pod's namespace, where a load balancer's probe would come from another host), and
//! the addresses it sees bound are the node namespace's. Where the test needs the API, the
//! stand-in API server listens on the node namespace's loopback.
use std::{
    fmt::Write as _,
    net::SocketAddr,
    process::Command as Process,
    time::{Duration, Instant},
};

use crate::wait_until;
use anyhow::{Context as _, bail};
use socklb::vocab::ErrorKind;
use socklb_tests::{
    Sandbox,
    agent::{AgentOptions, AgentProcess},
    apiserver::{ApiServer, Resource},
    bins,
    curl::{self, Answer, Outcome},
    system::ip,
};

const NODE_IP: &str = "10.244.250.1";
/// The node's IPv6 address, where a test gives it one (the Node object never names it).
const NODE_IP6: &str = "fd00:244::250:1";

/// The node's namespace, with the agent in it (`args` added to its flags), once it is ready.
fn node_with_agent(sandbox: &Sandbox, args: &[&str]) -> anyhow::Result<(String, AgentProcess)> {
    let node = node_namespace(sandbox)?;
    let agent = agent_in(sandbox, &node, None, args)?;
    Ok((node, agent))
}

/// The node's network namespace, on the bridge at `NODE_IP`.
fn node_namespace(sandbox: &Sandbox) -> anyhow::Result<String> {
    Ok(sandbox.extra_client_pod("node", NODE_IP)?.netns)
}

/// The agent in the node's namespace `node` as `node-a` (`args` added to its flags), reading
/// `api` (listening in that namespace) or else the sandbox's manifests, once it is ready.
fn agent_in(
    sandbox: &Sandbox,
    node: &str,
    api: Option<&ApiServer>,
    args: &[&str],
) -> anyhow::Result<AgentProcess> {
    let mut all: Vec<String> = vec!["--node-name".into(), "node-a".into()];
    all.extend(args.iter().map(|a| (*a).to_string()));
    let options = AgentOptions {
        args: all,
        netns: Some(node.to_string()),
        no_wait: true,
        ..AgentOptions::default()
    };
    let agent = match api {
        Some(api) => sandbox.start_agent_watching(api, options)?,
        None => sandbox.start_agent(&options)?,
    };
    let ready = format!("http://{}/readyz", agent.health);
    wait_until("the agent's readiness", Duration::from_mins(1), || {
        Ok(match curl::curl(node, "GET", &ready)? {
            Outcome::Answer(a) if a.status == 200 => Some(()),
            _ => None,
        })
    })
    .with_context(|| agent.log_text())?;
    Ok(agent)
}

fn node_object(taints: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\nspec: {{taints: [{taints}]}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {NODE_IP}}}\n"
    )
}

fn load_balancer(policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.7.1\n  externalTrafficPolicy: {policy}\n  healthCheckNodePort: 32100\n  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30100}}]\n"
    )
}

fn web_endpoints(local: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n  - {{addresses: [\"10.244.7.1\"], nodeName: node-a, conditions: {local}}}\n  - {{addresses: [\"10.244.7.2\"], nodeName: node-b}}\n"
    )
}

/// What kube-proxy answers on a healthCheckNodePort (`service_health.go`), byte for byte.
fn kube_proxy_body(local_endpoints: usize) -> String {
    kube_proxy_body_of(local_endpoints, true)
}

fn kube_proxy_body_of(local_endpoints: usize, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}"
    )
}

/// kube-proxy's `/healthz` and `/livez` on a healthy node, as a probe from `netns` gets them:
/// its JSON (1.33+ keys, in its order), `nodeEligible` on `/healthz` only, 404 elsewhere.
fn kube_proxy_health_answers(probe_from: &str) -> anyhow::Result<()> {
    let healthz = curl::get(probe_from, &format!("http://{NODE_IP}:10256/healthz"))?;
    assert_eq!(healthz.status, 200, "{healthz:?}");
    assert_eq!(healthz.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_str(&healthz.body)?;
    assert_eq!(v["healthy"], true);
    assert_eq!(v["nodeEligible"], true);
    for key in ["lastUpdated", "currentTime"] {
        let t = v[key].as_str().with_context(|| format!("{key} in {v}"))?;
        assert!(
            t.contains('T') && t.ends_with('Z'),
            "{key}: {t} is not RFC 3339 UTC"
        );
    }
    assert!(
        healthz.body.starts_with("{\"lastUpdated\":"),
        "kube-proxy's key order: {}",
        healthz.body
    );
    let livez = curl::get(probe_from, &format!("http://{NODE_IP}:10256/livez"))?;
    assert_eq!(livez.status, 200);
    let v: serde_json::Value = serde_json::from_str(&livez.body)?;
    assert!(
        v.get("nodeEligible").is_none(),
        "/livez ignores the node: {v}"
    );
    let other = curl::get(probe_from, &format!("http://{NODE_IP}:10256/metrics"))?;
    assert_eq!(other.status, 404);
    Ok(())
}

/// Issue 20.2 and 20.3: a cloud load balancer's probes, answered as kube-proxy answers them,
/// following the endpoints, the Service and the Node.
#[test]
fn load_balancers_probes_get_kube_proxys_answers() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.write_manifest("node.yaml", &node_object(""))?;
    sandbox.write_manifest("web.yaml", &load_balancer("Local"))?;
    sandbox.write_manifest("web-1.yaml", &web_endpoints("{ready: true}"))?;
    let (node_ns, agent) = node_with_agent(
        &sandbox,
        &[
            "--health-check-node-ports",
            "--kube-proxy-healthz",
            "0.0.0.0:10256",
            "--external-traffic",
            "carried",
        ],
    )?;
    let probe_from = &sandbox.client_ns;
    let hc = format!("http://{NODE_IP}:32100");
    // 1. One ready endpoint on this node: 200, kube-proxy's body and headers, on any path.
    let a = wait_until("the health-check port", Duration::from_secs(10), || {
        Ok(
            match curl::curl(probe_from, "GET", &format!("{hc}/healthz"))? {
                Outcome::Answer(a) => Some(a),
                Outcome::Failed { .. } => None,
            },
        )
    })
    .with_context(|| agent.log_text())?;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, kube_proxy_body(1));
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(a.header("x-load-balancing-endpoint-weight"), Some("1"));
    let Outcome::Answer(other) = curl::curl(probe_from, "POST", &format!("{hc}/any/path"))? else {
        bail!("no answer on another path");
    };
    assert_eq!((other.status, other.body), (200, kube_proxy_body(1)));

    // 2. kube-proxy's /healthz and /livez.
    kube_proxy_health_answers(probe_from)?;

    // 3. The local endpoint terminates (still serving): it no longer counts, 503.
    sandbox.write_manifest(
        "web-1.yaml",
        &web_endpoints("{ready: false, serving: true, terminating: true}"),
    )?;
    let a = wait_until(
        "503 once no endpoint is ready here",
        Duration::from_secs(10),
        || {
            let a = curl::get(probe_from, &hc)?;
            Ok((a.status == 503).then_some(a))
        },
    )?;
    assert_eq!(a.body, kube_proxy_body(0));
    assert_eq!(a.header("x-load-balancing-endpoint-weight"), Some("0"));

    // 4. /status names the port, its Service and its count.
    let status = curl::get(&node_ns, &format!("http://{}/status", agent.listen))?;
    let status: socklb::status::Status = serde_json::from_str(&status.body)?;
    let port = status
        .health_check_ports
        .iter()
        .find(|p| p.port == 32100)
        .context("port 32100 in /status")?;
    assert_eq!(port.service.to_string(), "shop/web");
    assert_eq!(port.local_endpoints, 0);
    assert_eq!(port.error, None);

    // 5. The cluster autoscaler taints the node: /healthz drains it, /livez does not.
    sandbox.write_manifest(
        "node.yaml",
        &node_object(
            "{key: ToBeDeletedByClusterAutoscaler, value: \"1700000000\", effect: NoSchedule}",
        ),
    )?;
    let healthz = wait_until(
        "/healthz 503 on a tainted node",
        Duration::from_secs(10),
        || {
            let a = curl::get(probe_from, &format!("http://{NODE_IP}:10256/healthz"))?;
            Ok((a.status == 503).then_some(a))
        },
    )?;
    let v: serde_json::Value = serde_json::from_str(&healthz.body)?;
    assert_eq!(
        (&v["nodeEligible"], &v["healthy"]),
        (&false.into(), &true.into())
    );
    assert_eq!(
        curl::get(probe_from, &format!("http://{NODE_IP}:10256/livez"))?.status,
        200
    );

    // 6. externalTrafficPolicy Cluster: no health check, the port closes.
    sandbox.write_manifest("web.yaml", &load_balancer("Cluster"))?;
    wait_until("the port closed", Duration::from_secs(10), || {
        Ok(match curl::curl(probe_from, "GET", &hc)? {
            Outcome::Failed { code: 7, .. } => Some(()),
            _ => None,
        })
    })?;
    reopen_and_stop_quietly(&sandbox, agent, probe_from, &hc)?;
    println!(
        "FIGURE health-check port: 200/503 and close followed the endpoints, Service and Node"
    );
    Ok(())
}

/// Opens the health-check port again, then stops the agent gracefully: the listeners close
/// without a word of warning (their accept loops once logged "accept failed" for a listener
/// shut down on purpose).
fn reopen_and_stop_quietly(
    sandbox: &Sandbox,
    mut agent: AgentProcess,
    probe_from: &str,
    hc: &str,
) -> anyhow::Result<()> {
    sandbox.write_manifest("web.yaml", &load_balancer("Local"))?;
    wait_until("the port open again", Duration::from_secs(10), || {
        Ok(match curl::curl(probe_from, "GET", hc)? {
            Outcome::Answer(a) => Some(a),
            Outcome::Failed { .. } => None,
        })
    })?;
    assert!(agent.stop()?.success());
    let log = agent.log_text();
    let spurious: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("accept failed"))
        .collect();
    assert!(spurious.is_empty(), "{spurious:#?}");
    Ok(())
}

/// Next to kube-proxy, 10256 is its port: asked for it while it is taken, the agent stops
/// before it loads anything and says why.
#[test]
fn a_taken_kube_proxy_healthz_port_stops_the_agent_with_the_reason() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let mut agent = sandbox.start_agent(&AgentOptions {
        args: vec!["--kube-proxy-healthz".into(), addr.clone()],
        no_wait: true,
        ..AgentOptions::default()
    })?;
    let status = agent.wait_exit(Duration::from_mins(1))?;
    assert!(!status.success());
    let log = agent.log_text();
    assert!(
        log.contains(&addr) && log.contains("kube-proxy serves this port"),
        "{log}"
    );
    assert!(
        socklb_tests::system::cgroup_program_ids(&sandbox.cgroup)?.is_empty(),
        "nothing attached"
    );
    Ok(())
}

/// What a load balancer and the kubelet see on a node: the health-check port 32100, kube-proxy's
/// `/healthz` and `/livez` on 10256 (probed from the client pod's namespace, off the node), and
/// the agent's own `/livez` and `/readyz` (its liveness and readiness probes, on the node).
struct Probes<'a> {
    from: &'a str,
    node: &'a str,
    agent: &'a AgentProcess,
}

impl Probes<'_> {
    fn health_check(&self) -> anyhow::Result<Answer> {
        curl::get(self.from, &format!("http://{NODE_IP}:32100/"))
    }

    fn kube_proxy(&self, path: &str) -> anyhow::Result<(Answer, serde_json::Value)> {
        let a = curl::get(self.from, &format!("http://{NODE_IP}:10256{path}"))?;
        let v = serde_json::from_str(&a.body).with_context(|| format!("{path}: {}", a.body))?;
        Ok((a, v))
    }

    fn agent(&self, path: &str) -> anyhow::Result<Answer> {
        curl::get(self.node, &format!("http://{}{path}", self.agent.health))
    }

    /// The four probes a load balancer and the kubelet depend on, as (what, status).
    fn statuses(&self) -> anyhow::Result<Vec<(&'static str, u16)>> {
        Ok(vec![
            ("healthCheckNodePort", self.health_check()?.status),
            ("kube-proxy /healthz", self.kube_proxy("/healthz")?.0.status),
            ("kube-proxy /livez", self.kube_proxy("/livez")?.0.status),
            ("agent /livez", self.agent("/livez")?.status),
        ])
    }
}

/// The objects of the load-balancer tests through the API: this node, the LoadBalancer Service
/// `shop/web` (externalTrafficPolicy Local, healthCheckNodePort 32100) and its endpoints, one
/// of them ready on this node.
fn api_with_web(node_ns: &str) -> anyhow::Result<ApiServer> {
    let api = ApiServer::start_in(node_ns)?;
    api.apply(&node_object(""))?;
    api.apply(&load_balancer("Local"))?;
    api.apply(&web_endpoints("{ready: true}"))?;
    Ok(api)
}

/// kube-proxy's rule (`proxy_health.go`): only an update queued and left unapplied for
/// 2 × syncPeriod makes it unhealthy, and an API server outage queues nothing. So while the API
/// server is away, here for 10 s, longer than the agent's `--healthz-stale-after-s` (3 s) and
/// `--stuck-after-s` (4 s), the health-check port, kube-proxy's `/healthz` and `/livez` and the
/// agent's own `/livez` stay 200: a control-plane upgrade neither drains every node from the
/// load balancers nor restarts every agent (the old rule failed them all after `--stuck-after-s`
/// of failing watches). Readiness, which restarts nothing, says the watches fail.
#[test]
fn an_api_server_outage_keeps_load_balancers_probes_and_the_agents_livez_at_200()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let node_ns = node_namespace(&sandbox)?;
    let api = api_with_web(&node_ns)?;
    let agent = agent_in(
        &sandbox,
        &node_ns,
        Some(&api),
        &[
            "--health-check-node-ports",
            "--kube-proxy-healthz",
            "0.0.0.0:10256",
            "--external-traffic",
            "carried",
            "--healthz-stale-after-s",
            "3",
            "--stuck-after-s",
            "4",
        ],
    )?;
    let probes = Probes {
        from: &sandbox.client_ns,
        node: &node_ns,
        agent: &agent,
    };
    let all_200 = |p: &Probes<'_>| -> anyhow::Result<bool> {
        Ok(p.statuses()?.iter().all(|(_, s)| *s == 200))
    };
    wait_until("every probe at 200", Duration::from_secs(10), || {
        Ok(all_200(&probes)?.then_some(()))
    })
    .with_context(|| agent.log_text())?;

    api.stop();
    let away = Instant::now();
    let mut unready = false;
    while away.elapsed() < Duration::from_secs(10) {
        let statuses = probes.statuses()?;
        assert!(
            statuses.iter().all(|(_, s)| *s == 200),
            "{:.1} s into the outage: {statuses:?}\n{}",
            away.elapsed().as_secs_f64(),
            agent.log_text()
        );
        unready |= probes.agent("/readyz")?.status == 503;
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(unready, "/readyz says the watches fail");
    let (_, healthz) = probes.kube_proxy("/healthz")?;
    assert_eq!(
        (&healthz["healthy"], &healthz["nodeEligible"]),
        (&true.into(), &true.into()),
        "{healthz}"
    );
    let hc = probes.health_check()?;
    assert_eq!(hc.body, kube_proxy_body(1));

    // The API server is back: ready again, and a change made then reaches the probes.
    api.restart(true)?;
    wait_until("ready again", Duration::from_secs(15), || {
        Ok((probes.agent("/readyz")?.status == 200).then_some(()))
    })?;
    api.apply(&web_endpoints(
        "{ready: false, serving: true, terminating: true}",
    ))?;
    wait_until(
        "the change on the health-check port",
        Duration::from_secs(10),
        || {
            let a = probes.health_check()?;
            Ok((a.body == kube_proxy_body(0)).then_some(()))
        },
    )?;
    println!(
        "FIGURE API server away 10 s (stale after 3 s, stuck after 4 s): every load-balancer probe and the agent's /livez stayed 200"
    );
    Ok(())
}

/// An EndpointSlice of `n` ready endpoints, the first on this node.
fn many_web_endpoints(n: u8) -> String {
    let mut y = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n",
    );
    for i in 1..=n {
        let node = if i == 1 { "node-a" } else { "node-b" };
        let _ = writeln!(y, "  - {{addresses: [\"10.244.7.{i}\"], nodeName: {node}}}");
    }
    y
}

/// kube-proxy's rule (`proxy_health.go`): a change that cannot be applied turns `/healthz`,
/// `/livez` and the health-check ports 503 once it has waited the stale time (here 3 s), the
/// agent's own `/livez` once it has waited `--stuck-after-s`. A change the maps refuse for room
/// (a Service larger than `--max-backends`: the capacity rule refuses the overreaching object,
/// reported) is no such change: the probes stay 200, as kube-proxy, which has no capacity,
/// would be. The unwritable change is made so by freezing the backend map (`BPF_MAP_FREEZE`:
/// every write gets EPERM).
#[test]
fn a_change_that_cannot_be_written_turns_the_probes_503_after_the_stale_time() -> anyhow::Result<()>
{
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let node_ns = node_namespace(&sandbox)?;
    let api = api_with_web(&node_ns)?;
    let agent = agent_in(&sandbox, &node_ns, Some(&api), &STALE_IN_3_S)?;
    let probes = Probes {
        from: &sandbox.client_ns,
        node: &node_ns,
        agent: &agent,
    };
    let all_200 =
        || -> anyhow::Result<bool> { Ok(probes.statuses()?.iter().all(|(_, s)| *s == 200)) };
    wait_until("every probe at 200", Duration::from_secs(10), || {
        Ok(all_200()?.then_some(()))
    })
    .with_context(|| agent.log_text())?;

    let status = || status_of(&node_ns, &agent);
    // Too large for the maps: refused for room, reported, and the probes stay 200.
    api.apply(&many_web_endpoints(6))?;
    std::thread::sleep(Duration::from_secs(5));
    let now = status()?;
    assert!(
        now.failed.iter().any(|f| f.kind == ErrorKind::MapFull),
        "{:?}",
        now.failed
    );
    assert!(all_200()?, "{:?}", probes.statuses()?);
    api.apply(&many_web_endpoints(2))?;
    wait_until(
        "the change that fits written",
        Duration::from_secs(10),
        || {
            let status: socklb::status::Status = serde_json::from_str(
                &curl::get(&node_ns, &format!("http://{}/status", agent.listen))?.body,
            )?;
            Ok(status.failed.is_empty().then_some(()))
        },
    )?;

    // Now no write can succeed: the backend array is frozen.
    freeze_backends(&sandbox)?;
    let changed = Instant::now();
    api.apply(&many_web_endpoints(1))?;
    let (healthz, body) = wait_until("kube-proxy's /healthz 503", Duration::from_secs(15), || {
        let (a, v) = probes.kube_proxy("/healthz")?;
        Ok((a.status == 503).then_some((a, v)))
    })
    .with_context(|| agent.log_text())?;
    let after = changed.elapsed();
    assert!(
        after >= Duration::from_millis(2900),
        "503 only once the change has waited the stale time: {after:?}"
    );
    assert_eq!(
        (&body["healthy"], &body["nodeEligible"]),
        (&false.into(), &true.into()),
        "{}",
        healthz.body
    );
    assert_ne!(
        body["lastUpdated"], body["currentTime"],
        "a 503: the last write"
    );
    assert_eq!(probes.kube_proxy("/livez")?.0.status, 503);
    assert_eq!(probes.health_check()?.status, 503);
    let failed = status()?.failed;
    assert!(
        failed
            .iter()
            .any(|f| f.service_port.service.to_string() == "shop/web"
                && f.kind == ErrorKind::MapWrite),
        "{failed:?}"
    );
    let livez = wait_until("the agent's /livez 503", Duration::from_secs(15), || {
        let a = probes.agent("/livez")?;
        Ok((a.status == 503).then_some(a))
    })?;
    assert!(
        changed.elapsed() >= Duration::from_millis(5900),
        "the agent's /livez waits --stuck-after-s"
    );
    assert!(livez.body.contains("to be written"), "{}", livez.body);
    let after = after.as_secs_f64();
    println!(
        "FIGURE an unwritable change: kube-proxy's /healthz 503 {after:.1} s after it (stale after 3 s); a change refused for room kept every probe at 200"
    );
    Ok(())
}

/// kube-proxy's ports, stale after 3 s, the agent's own `/livez` after 6 s, room for 4 backends
/// (that may not grow).
const STALE_IN_3_S: [&str; 13] = [
    "--health-check-node-ports",
    "--kube-proxy-healthz",
    "0.0.0.0:10256",
    "--external-traffic",
    "carried",
    "--healthz-stale-after-s",
    "3",
    "--stuck-after-s",
    "6",
    "--max-backends",
    "4",
    "--max-map-memory",
    "0",
];

/// The agent's `/status`, asked from the node's namespace.
fn status_of(node_ns: &str, agent: &AgentProcess) -> anyhow::Result<socklb::status::Status> {
    Ok(serde_json::from_str(
        &curl::get(node_ns, &format!("http://{}/status", agent.listen))?.body,
    )?)
}

/// Freezes the sandbox's pinned backend array (`BPF_MAP_FREEZE`): every write to it fails
/// with EPERM from now on.
fn freeze_backends(sandbox: &Sandbox) -> anyhow::Result<()> {
    let maps = socklb::dataplane::pins::PinFolder::new(sandbox.pin_folder())
        .current()
        .context("a map generation")?;
    let backends =
        socklb::dataplane::sys::obj_get(&maps.join(lb_common::MapId::Backends.name()), false)?;
    socklb::dataplane::sys::map_freeze(std::os::fd::AsFd::as_fd(&backends))?;
    Ok(())
}

/// kube-proxy's `/healthz` follows its Node (`NodeEligible`): 503 before the Node is seen
/// (1.34+), 200 once it is, 503 once it is deleted (1.37+ exits and, restarted, has no Node),
/// 200 when it is back. `/livez` and the health-check port never look at the Node, and the
/// agent keeps serving with the Node's last addresses.
#[test]
fn a_deleted_node_turns_kube_proxys_healthz_503() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let node_ns = node_namespace(&sandbox)?;
    let api = ApiServer::start_in(&node_ns)?;
    api.apply(&load_balancer("Local"))?;
    api.apply(&web_endpoints("{ready: true}"))?;
    let agent = agent_in(
        &sandbox,
        &node_ns,
        Some(&api),
        &[
            "--health-check-node-ports",
            "--kube-proxy-healthz",
            "0.0.0.0:10256",
            "--external-traffic",
            "carried",
            "--node-address",
            NODE_IP,
        ],
    )?;
    let probes = Probes {
        from: &sandbox.client_ns,
        node: &node_ns,
        agent: &agent,
    };
    let healthz = |status: u16, what: &str| -> anyhow::Result<serde_json::Value> {
        wait_until(what, Duration::from_secs(10), || {
            let (a, v) = probes.kube_proxy("/healthz")?;
            Ok((a.status == status).then_some(v))
        })
        .with_context(|| agent.log_text())
    };
    // 1. No Node yet.
    let v = healthz(503, "/healthz 503 before the Node is seen")?;
    assert_eq!(
        (&v["nodeEligible"], &v["healthy"]),
        (&false.into(), &true.into())
    );

    // 2. The Node appears.
    api.apply(&node_object(""))?;
    healthz(200, "/healthz 200 once the Node is seen")?;

    // 3. The Node is deleted: drained, the rest unchanged.
    api.delete(Resource::Nodes, "", "node-a");
    let v = healthz(503, "/healthz 503 once the Node is deleted")?;
    assert_eq!(
        (&v["nodeEligible"], &v["healthy"]),
        (&false.into(), &true.into())
    );
    assert_eq!(probes.kube_proxy("/livez")?.0.status, 200);
    let hc = probes.health_check()?;
    assert_eq!((hc.status, hc.body), (200, kube_proxy_body(1)));
    assert_eq!(probes.agent("/livez")?.status, 200);
    assert!(
        agent.log_text().contains("Node object was deleted"),
        "{}",
        agent.log_text()
    );

    // 4. It comes back.
    api.apply(&node_object(""))?;
    healthz(200, "/healthz 200 once the Node is back")?;
    Ok(())
}

/// A dual-stack LoadBalancer Service `shop/web` (externalTrafficPolicy Local, NodePort 30100,
/// healthCheckNodePort 32100) with one ready endpoint of each family on this node.
fn dual_stack_web() -> String {
    "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  type: LoadBalancer\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIPs: [10.96.7.1, \"fd00:96::7:1\"]\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32100\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30100}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-4, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n  - {addresses: [\"10.244.7.1\"], nodeName: node-a}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-6, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv6\nports: [{name: http, port: 8080}]\nendpoints:\n  - {addresses: [\"fd00:244::7:1\"], nodeName: node-a}\n".into()
}

/// Both families, as kube-proxy: `0.0.0.0:10256` is Go's dual-stack listener (one `[::]`
/// socket with `IPV6_V6ONLY` off, whatever `net.ipv6.bindv6only` says: here 1), so probes over
/// IPv4 and IPv6 get kube-proxy's answer. And `--nodeport-addresses primary` with a Node that
/// names only an IPv4 address: IPv6 has no primary address, so, as kube-proxy's
/// `NewNodePortAddresses`, every IPv6 address of the node serves NodePorts (a pod on this node
/// reaches the Service through the node's IPv6 address) and the health-check port listens on
/// IPv6's wildcard, and on the primary address for IPv4.
#[test]
fn kube_proxys_ports_answer_both_families_and_a_family_without_a_primary_address_serves_all_of_its_addresses()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend("10.244.7.1:8080".parse()?, false)?;
    sandbox.add_backend(format!("[{}]:8080", "fd00:244::7:1").parse()?, false)?;
    sandbox.write_manifest("node.yaml", &node_object(""))?;
    sandbox.write_manifest("web.yaml", &dual_stack_web())?;
    let node_ns = node_namespace(&sandbox)?;
    ip(&[
        "-n",
        &node_ns,
        "addr",
        "add",
        &format!("{NODE_IP6}/64"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    sandbox.netns_sysctl(&node_ns, "net.ipv6.bindv6only=1")?;
    let agent = agent_in(
        &sandbox,
        &node_ns,
        None,
        &[
            "--health-check-node-ports",
            "--kube-proxy-healthz",
            "0.0.0.0",
            "--external-traffic",
            "carried",
        ],
    )?;
    let from = &sandbox.client_ns;
    for host in [NODE_IP.to_string(), format!("[{NODE_IP6}]")] {
        for path in ["/healthz", "/livez"] {
            let url = format!("http://{host}:10256{path}");
            let a = wait_until(&url, Duration::from_secs(10), || {
                Ok(match curl::curl(from, "GET", &url)? {
                    Outcome::Answer(a) => Some(a),
                    Outcome::Failed { .. } => None,
                })
            })
            .with_context(|| agent.log_text())?;
            assert_eq!(a.status, 200, "{url}: {a:?}");
            assert!(a.body.starts_with("{\"lastUpdated\":"), "{url}: {}", a.body);
        }
        let url = format!("http://{host}:32100/");
        let a = wait_until(&url, Duration::from_secs(10), || {
            Ok(match curl::curl(from, "GET", &url)? {
                Outcome::Answer(a) => Some(a),
                Outcome::Failed { .. } => None,
            })
        })
        .with_context(|| agent.log_text())?;
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, kube_proxy_body(2).as_str()),
            "{url}"
        );
    }
    // The health-check port: the IPv4 primary address and IPv6's wildcard.
    let status = curl::get(&node_ns, &format!("http://{}/status", agent.listen))?;
    let status: socklb::status::Status = serde_json::from_str(&status.body)?;
    let port = status
        .health_check_ports
        .iter()
        .find(|p| p.port == 32100)
        .context("port 32100 in /status")?;
    let listening: Vec<String> = port.listening.iter().map(ToString::to_string).collect();
    assert_eq!(
        listening,
        vec![format!("{NODE_IP}:32100"), "[::]:32100".to_string()]
    );
    // NodePorts: the primary IPv4 address, and every IPv6 address of the node.
    let mut client = sandbox.client()?;
    for (target, backend) in [
        (format!("{NODE_IP}:30100"), "10.244.7.1:8080"),
        (format!("[{NODE_IP6}]:30100"), "[fd00:244::7:1]:8080"),
    ] {
        sandbox.wait_candidates(&target, &[backend])?;
        let reply = client.connect(target.parse()?, 5)?;
        assert_eq!(
            reply.backends.keys().collect::<Vec<_>>(),
            vec![backend],
            "{target}: {reply:?}"
        );
    }
    Ok(())
}

/// Replace mode where nothing on the node carries traffic arriving from outside it (the
/// default, `--external-traffic none`): socklb translates sockets on the node only, so a load
/// balancer that targets nodes would send its traffic into nothing. The health-check port says
/// the node has no endpoint to offer (kube-proxy's body with `localEndpoints: 0`, weight 0,
/// 503) and kube-proxy's `/healthz` that the node is not eligible (503); `/livez` and the
/// agent's own probes are unaffected, and `/status` keeps the real count.
#[test]
fn without_a_carrier_of_external_traffic_load_balancers_are_told_to_send_nothing()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.write_manifest("node.yaml", &node_object(""))?;
    sandbox.write_manifest("web.yaml", &load_balancer("Local"))?;
    sandbox.write_manifest("web-1.yaml", &web_endpoints("{ready: true}"))?;
    let (node_ns, agent) = node_with_agent(
        &sandbox,
        &[
            "--health-check-node-ports",
            "--kube-proxy-healthz",
            "0.0.0.0:10256",
        ],
    )?;
    let probes = Probes {
        from: &sandbox.client_ns,
        node: &node_ns,
        agent: &agent,
    };
    let hc = wait_until("the health-check port", Duration::from_secs(10), || {
        Ok(
            match curl::curl(probes.from, "GET", &format!("http://{NODE_IP}:32100/"))? {
                Outcome::Answer(a) => Some(a),
                Outcome::Failed { .. } => None,
            },
        )
    })
    .with_context(|| agent.log_text())?;
    assert_eq!(
        (hc.status, hc.body.as_str()),
        (503, kube_proxy_body(0).as_str())
    );
    assert_eq!(hc.header("x-load-balancing-endpoint-weight"), Some("0"));
    let (a, v) = probes.kube_proxy("/healthz")?;
    assert_eq!(a.status, 503);
    assert_eq!(
        (&v["nodeEligible"], &v["healthy"]),
        (&false.into(), &true.into())
    );
    assert_eq!(probes.kube_proxy("/livez")?.0.status, 200);
    assert_eq!(probes.agent("/livez")?.status, 200);
    assert_eq!(probes.agent("/readyz")?.status, 200);
    let status = curl::get(&node_ns, &format!("http://{}/status", agent.listen))?;
    let status: socklb::status::Status = serde_json::from_str(&status.body)?;
    let port = status
        .health_check_ports
        .iter()
        .find(|p| p.port == 32100)
        .context("port 32100 in /status")?;
    assert_eq!(port.local_endpoints, 1);
    Ok(())
}

/// `getent` (the glibc resolver) in the client pod, asking its nameserver for a name: the
/// address it got names the DNS server that answered.
fn resolve(sandbox: &Sandbox) -> anyhow::Result<String> {
    // Into the pod's cgroup first (`ip netns exec` mounts a sysfs of the namespace's own,
    // without the cgroup tree), then into its namespace with its /etc/resolv.conf.
    let out = Process::new(bins::sbx()?)
        .args(["--cgroup", &sandbox.cgroup.display().to_string()])
        .args(["exec", "ip", "netns", "exec", &sandbox.client_ns])
        .args(["getent", "ahostsv4", "probe.cluster.test"])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map_or_else(
            || {
                format!(
                    "nothing (exit {:?}: {})",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            },
            str::to_string,
        ))
}

const CLUSTER_DNS_ANSWER: &str = "192.0.2.1";
const NODE_CACHE_ANSWER: &str = "192.0.2.53";

/// The cluster's DNS (kube-dns at 10.96.0.10, one pod answering `CLUSTER_DNS_ANSWER`), the
/// client pod's resolver pointed at it, and the node with the agent and an interface for the
/// node-local cache's address (returned: the node's namespace, the agent, the device).
fn dns_world(sandbox: &Sandbox) -> anyhow::Result<(String, AgentProcess, &'static str)> {
    let dns_pod = sandbox.pod("10.244.5.53".parse()?)?;
    sandbox.add_dns_server(
        &dns_pod,
        "10.244.5.53:53".parse()?,
        CLUSTER_DNS_ANSWER.parse()?,
    )?;
    sandbox.write_manifest(
        "kube-dns.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: kube-dns, namespace: kube-system}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: dns, port: 53, protocol: UDP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: kube-dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}\naddressType: IPv4\nports: [{name: dns, port: 53, protocol: UDP}]\nendpoints:\n  - {addresses: [\"10.244.5.53\"], nodeName: node-b}\n",
    )?;
    sandbox.resolv_conf(
        &sandbox.client_ns,
        "nameserver 10.96.0.10\noptions timeout:1 attempts:2\n",
    )?;
    let (node_ns, agent) = node_with_agent(sandbox, &[])?;
    // The node: a dummy interface for the cache's address (node-local-dns's setup; kernels
    // built without dummy interfaces get the address on the loopback, which routes the same:
    // local), the cache listening on it, and the pod's route to that address through the node
    // (on a real node, the pod's default route).
    let device = if ip(&[
        "-n",
        &node_ns,
        "link",
        "add",
        "nodelocaldns",
        "type",
        "dummy",
    ])
    .is_ok()
    {
        ip(&["-n", &node_ns, "link", "set", "nodelocaldns", "up"])?;
        "nodelocaldns"
    } else {
        "lo"
    };
    ip(&[
        "-n",
        &sandbox.client_ns,
        "route",
        "add",
        "10.96.0.10/32",
        "via",
        NODE_IP,
    ])?;
    Ok((node_ns, agent, device))
}

/// Issue 20.1: the node-local DNS cache (`NodeLocal DNSCache`) binds the kube-dns ClusterIP on a dummy interface of the
/// node and listens there. While it listens, pods' queries reach the node's cache (socklb leaves
/// the address alone, as kube-proxy's rules deliver it locally); once it goes, the cluster's
/// DNS pods answer again. Issue 27.5: the address alone, with nothing listening on it (kube-proxy
/// IPVS's `kube-ipvs0` binds every ClusterIP and listens on none), is translated as any other.
#[test]
fn node_local_dns_cache_answers_while_it_holds_the_dns_cluster_ip() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    let (node_ns, agent, device) = dns_world(&sandbox)?;
    let cache: SocketAddr = "10.96.0.10:53".parse()?;

    // 1. No cache on the node: the cluster's DNS pod answers.
    assert_eq!(
        resolve(&sandbox)?,
        CLUSTER_DNS_ANSWER,
        "{}",
        agent.log_text()
    );

    // 2. The address on the node with nothing listening there (kube-ipvs0): still translated,
    //    through the address changes and the listener reads that follow.
    ip(&[
        "-n",
        &node_ns,
        "addr",
        "add",
        "10.96.0.10/32",
        "dev",
        device,
    ])?;
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        resolve(&sandbox)?,
        CLUSTER_DNS_ANSWER,
        "an address bound with nothing listening is translated: {}",
        agent.log_text()
    );
    let status = curl::get(&node_ns, &format!("http://{}/status", agent.listen))?;
    let status: socklb::status::Status = serde_json::from_str(&status.body)?;
    assert!(
        status.refused_addresses.is_empty(),
        "{:?}",
        status.refused_addresses
    );

    // 3. The cache listens there (node-local-dns sets itself up the same way: the address,
    //    then the listener): pods' queries reach it.
    sandbox.add_dns_server(&node_ns, cache, NODE_CACHE_ANSWER.parse()?)?;
    let took = Instant::now();
    wait_until(
        "the node's cache answering",
        Duration::from_secs(10),
        || Ok((resolve(&sandbox)? == NODE_CACHE_ANSWER).then_some(())),
    )
    .with_context(|| agent.log_text())?;
    let to_cache = took.elapsed();
    let status = curl::get(&node_ns, &format!("http://{}/status", agent.listen))?;
    let status: socklb::status::Status = serde_json::from_str(&status.body)?;
    assert!(
        status
            .refused_addresses
            .iter()
            .any(|r| r.service.to_string() == "kube-system/kube-dns"),
        "/status says why 10.96.0.10 is left alone: {:?}",
        status.refused_addresses
    );

    // 4. The cache goes away (node-local-dns removed): the cluster's DNS pods answer again.
    ip(&[
        "-n",
        &node_ns,
        "addr",
        "del",
        "10.96.0.10/32",
        "dev",
        device,
    ])?;
    let took = Instant::now();
    wait_until(
        "the cluster's DNS answering again",
        Duration::from_secs(10),
        || Ok((resolve(&sandbox)? == CLUSTER_DNS_ANSWER).then_some(())),
    )
    .with_context(|| agent.log_text())?;
    println!(
        "FIGURE node-local DNS: cache answering {:.2} s after it started listening on the address, cluster DNS {:.2} s after it went",
        to_cache.as_secs_f64(),
        took.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Issue 20.6, decided: socklb translates every socket of a served pod's cgroup, in whatever
/// network namespace it is, so a nested namespace inside a pod (kind or Docker-in-Docker)
/// gets the outer cluster's backends for the outer cluster's service addresses. kube-proxy
/// translates packets as they leave the pod's namespace, after the inner cluster's own proxy
/// had its turn. The README says so and how to avoid it (an inner cluster with a service CIDR
/// of its own). Here: a process in a fresh namespace of its own (loopback only, where an
/// untranslated connect gets ENETUNREACH) connects to the Service, and is refused by the
/// backend's address on its loopback: the connect was rewritten to the outer backend.
#[test]
fn a_nested_network_namespace_in_a_pod_is_translated_too() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend("10.244.9.1:8080".parse()?, false)?;
    sandbox.write_manifest(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.9.1\n  ports: [{name: http, port: 80, targetPort: 8080}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n  - {addresses: [\"10.244.9.1\"]}\n",
    )?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    let sbx = bins::sbx()?.display().to_string();
    let connect = |target: &str| -> anyhow::Result<String> {
        // In the pod's cgroup, a network namespace of its own (gone when the shell exits).
        let script = format!(
            "ip link set lo up && ip addr add 10.244.9.1/32 dev lo && \
             echo '{{\"op\":\"connect\",\"target\":\"{target}\",\"count\":1}}' | {sbx} client"
        );
        let out = Process::new(&sbx)
            .args(["--cgroup", &sandbox.cgroup.display().to_string()])
            .args(["exec", "unshare", "--net", "sh", "-c", &script])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let translated = connect("10.96.9.1:80")?;
    assert!(
        translated.contains("ECONNREFUSED"),
        "the nested namespace's connect went to the outer backend's address: {translated}"
    );
    let untouched = connect("10.96.9.2:80")?;
    assert!(
        untouched.contains("ENETUNREACH"),
        "an address socklb does not serve is left alone: {untouched}"
    );
    Ok(())
}
