//! The outside path in the bench: a NodePort connection from a client outside the nodes,
//! through socklb's nftables rules (`--external-traffic nftables`, written by a real agent),
//! through kube-proxy's nftables layout and through its iptables layout, each on a node of its
//! own, against the floor beside them: the same client reaching a pod behind a fourth node
//! directly (routed, no translation). First-packet latency is the TCP connect's time (the SYN
//! crosses the rules); requests per second are whole short connections (connect, a line each
//! way, close). At 1 Service and at the run's number of Services (load-balancer IPs, so that
//! kube-proxy's iptables layout walks them all before its NodePort rule), with the time each
//! layout took to install them.
use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::{
    baselines::{SvcPort, load_outside},
    stats::{Spread, median},
};
use crate::{
    Sandbox,
    client::Command,
    cluster::{Cluster, Pod},
    system::ip,
};

const NODE_PORT: u16 = 30080;
const HTTP: u16 = 8080;

/// One case at one number of Services.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OutsideCase {
    pub case: String,
    pub services: usize,
    /// TCP connect p50 in µs, per pass.
    pub connect_p50_us: Spread,
    /// ÷ the direct case's in the same pass.
    pub connect_ratio: Spread,
    pub requests_per_s: Spread,
    /// ÷ the direct case's in the same pass (below 1: slower).
    pub requests_ratio: Spread,
    pub failures: usize,
}

/// How long a layout took to install its Services.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Install {
    pub what: String,
    pub services: usize,
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct OutsideBench {
    pub cases: Vec<OutsideCase>,
    pub install: Vec<Install>,
}

/// The Services as manifests: the measured one (a NodePort to the pod behind node-1) and
/// `others` with a load-balancer IP each.
fn manifests(pod: &Pod, others: usize) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: bench, uid: b0}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.80\n  ports: [{{name: http, port: 80, targetPort: {HTTP}, nodePort: {NODE_PORT}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: bench, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: {HTTP}}}]\nendpoints: [{{addresses: [\"{}\"], nodeName: node-1}}]\n",
        pod.ip4
    );
    for (i, svc) in others_list(others).iter().enumerate() {
        let eps: Vec<String> = svc
            .endpoints
            .iter()
            .map(|e| format!("{{addresses: [\"{}\"]}}", e.ip()))
            .collect();
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: bench, uid: b{}}}\nspec:\n  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n  clusterIP: {}\n  ports: [{{name: http, port: 80, targetPort: {HTTP}}}]\nstatus: {{loadBalancer: {{ingress: [{{ip: {}}}]}}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: {HTTP}}}]\nendpoints: [{}]\n",
            i + 1,
            std::net::Ipv4Addr::from(0x0a60_1000 + u32::try_from(i).unwrap_or(0)),
            svc.vip.ip(),
            eps.join(", ")
        );
    }
    y
}

/// `n` load-balancer Services (never reached): 172.16.0.0/12 addresses, two endpoints each.
fn others_list(n: usize) -> Vec<SvcPort> {
    (0..n)
        .map(|i| {
            let i = u32::try_from(i).unwrap_or(0);
            SvcPort {
                name: format!("bench/s{i}:http"),
                vip: SocketAddr::new(std::net::Ipv4Addr::from(0xac10_0000 + i).into(), 80),
                endpoints: (0..2)
                    .map(|j| {
                        SocketAddr::new(
                            std::net::Ipv4Addr::from(0x0afa_0000 + i * 2 + j).into(),
                            HTTP,
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Runs the cases at 1 Service and at `services`, `passes` passes of `per_pass` connects each.
pub fn measure(services: usize, passes: usize, per_pass: usize) -> anyhow::Result<OutsideBench> {
    let sandbox = Sandbox::shared()?;
    let cluster = Cluster::new(&sandbox, 4)?;
    let pods: Vec<Pod> = (0..4)
        .map(|i| cluster.pod(i))
        .collect::<anyhow::Result<_>>()?;
    for pod in &pods {
        cluster.serve(pod, HTTP, false)?;
    }
    // The floor: the client reaches node-4's pod directly, through node-4.
    ip(&[
        "-n",
        &cluster.outside.netns,
        "route",
        "add",
        "10.244.104.0/24",
        "via",
        &cluster.nodes[3].ip4.to_string(),
    ])?;
    sandbox.write_manifest("nodes.yaml", &cluster.node_manifests())?;
    let mut out = OutsideBench::default();
    let mut agent = None;
    for n in [1, services.max(1)] {
        let others = others_list(n - 1);
        let t0 = Instant::now();
        sandbox.write_manifest("bench.yaml", &manifests(&pods[0], n - 1))?;
        let agent = match agent.as_mut() {
            Some(a) => a,
            None => agent.insert(sandbox.start_agent(&crate::agent::AgentOptions {
                args: vec![
                    "--node-name".into(),
                    "node-1".into(),
                    "--external-traffic".into(),
                    "nftables".into(),
                ],
                netns: Some(cluster.nodes[0].netns.clone()),
                cgroup: Some(cluster.nodes[0].cgroup.clone()),
                pin_folder: Some(cluster.nodes[0].pins.clone()),
                ready_timeout: Some(Duration::from_mins(5)),
                ..Default::default()
            })?),
        };
        let deadline = Instant::now() + Duration::from_mins(5);
        let sync_ms = loop {
            let o = agent.status()?.outside;
            if let Some(o) = o.filter(|o| {
                o.condition == socklb::status::OutsideCondition::InSync && o.service_ports >= n
            }) {
                break o.last_sync_ms.unwrap_or(0);
            }
            anyhow::ensure!(Instant::now() < deadline, "socklb's rules for {n} services");
            std::thread::sleep(Duration::from_millis(50));
        };
        let whole = t0.elapsed();
        let measured = |pod: &Pod| SvcPort {
            name: "bench/web:http".into(),
            vip: SocketAddr::new(pod.ip4, NODE_PORT),
            endpoints: vec![SocketAddr::new(pod.ip4, HTTP)],
        };
        let nft = load_outside(
            &cluster.nodes[1].netns,
            true,
            &others,
            NODE_PORT,
            &measured(&pods[1]),
        )?;
        let ipt = load_outside(
            &cluster.nodes[2].netns,
            false,
            &others,
            NODE_PORT,
            &measured(&pods[2]),
        )?;
        if n > 1 {
            out.install.extend([
                Install {
                    what: "socklb: manifests written → rules in the kernel (translate, socket maps, nft)".into(),
                    services: n,
                    seconds: whole.as_secs_f64(),
                },
                Install {
                    what: "socklb: the nft transaction and its read-back".into(),
                    services: n,
                    seconds: sync_ms as f64 / 1e3,
                },
                Install {
                    what: "kube-proxy nftables layout (nft, batches of 500)".into(),
                    services: n,
                    seconds: nft.as_secs_f64(),
                },
                Install {
                    what: "kube-proxy iptables layout (iptables-restore)".into(),
                    services: n,
                    seconds: ipt.as_secs_f64(),
                },
            ]);
        }
        out.cases
            .extend(cases(&cluster, &pods, n, passes, per_pass)?);
    }
    Ok(out)
}

fn cases(
    cluster: &Cluster,
    pods: &[Pod],
    n: usize,
    passes: usize,
    per_pass: usize,
) -> anyhow::Result<Vec<OutsideCase>> {
    let targets = [
        ("direct (floor)", SocketAddr::new(pods[3].ip4, HTTP)),
        (
            "socklb nftables",
            SocketAddr::new(cluster.nodes[0].ip4, NODE_PORT),
        ),
        (
            "kube-proxy nftables",
            SocketAddr::new(cluster.nodes[1].ip4, NODE_PORT),
        ),
        (
            "kube-proxy iptables",
            SocketAddr::new(cluster.nodes[2].ip4, NODE_PORT),
        ),
    ];
    let mut client = cluster.outside_client()?;
    // Per case, per pass: (p50 µs, requests/s).
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); targets.len()];
    let mut failures = vec![0; targets.len()];
    for _ in 0..passes {
        for (i, (_, target)) in targets.iter().enumerate() {
            let r = client.run(&Command::Bench {
                targets: vec![*target],
                count: per_pass,
            })?;
            failures[i] += r.failures();
            let mut lat = r.latencies_ns.clone();
            lat.sort_unstable();
            let rps = r.answers() as f64 / (r.elapsed_ns as f64 / 1e9).max(1e-9);
            runs[i].push((median(&lat) / 1e3, rps));
        }
    }
    let floor = runs[0].clone();
    Ok(targets
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let p50: Vec<f64> = runs[i].iter().map(|r| r.0).collect();
            let rps: Vec<f64> = runs[i].iter().map(|r| r.1).collect();
            OutsideCase {
                case: (*name).to_string(),
                services: n,
                connect_ratio: Spread::of(
                    &p50.iter()
                        .zip(&floor)
                        .map(|(x, f)| x / f.0)
                        .collect::<Vec<_>>(),
                ),
                requests_ratio: Spread::of(
                    &rps.iter()
                        .zip(&floor)
                        .map(|(x, f)| x / f.1)
                        .collect::<Vec<_>>(),
                ),
                connect_p50_us: Spread::of(&p50),
                requests_per_s: Spread::of(&rps),
                failures: failures[i],
            }
        })
        .collect())
}
