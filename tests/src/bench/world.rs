//! The benchmark's world: three backend pods, one client pod per case, the agent, and N other
//! services installed in socklb's maps and in the kube-proxy rule sets alike.
use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{
    baselines::{SvcPort, load_iptables, load_nftables},
    datapath::{Case, Runner},
};
use crate::{Sandbox, agent::AgentOptions, agent::AgentProcess, system::ip};

pub const VIP: &str = "10.96.0.10";
pub const HTTP_PORT: u16 = 80;
pub const BULK_PORT: u16 = 9000;
pub const BACKENDS: [&str; 3] = ["10.244.1.21", "10.244.2.34", "10.244.3.47"];

fn vip_of(i: usize) -> Ipv4Addr {
    // 10.100.0.0/16 onwards: inside the service range, never the benchmark's own VIP.
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + u32::try_from(i).unwrap_or(0))
}

fn endpoint_of(i: usize, j: usize) -> Ipv4Addr {
    // Endpoint j of service i: 10.(128+j).x.y, never contacted.
    let base = u32::from(Ipv4Addr::new(10, 128 + u8::try_from(j).unwrap_or(0), 0, 0));
    Ipv4Addr::from(base + u32::try_from(i).unwrap_or(0) + 1)
}

/// The benchmark's own service ports: http (80 → 8080) and bulk (9000 → 9000).
pub fn bench_services() -> Vec<SvcPort> {
    let vip = VIP.parse().expect("VIP");
    vec![
        SvcPort {
            name: "default/bench:http".into(),
            vip: SocketAddr::new(vip, HTTP_PORT),
            endpoints: BACKENDS
                .iter()
                .map(|b| SocketAddr::new(b.parse().expect("IP"), 8080))
                .collect(),
        },
        SvcPort {
            name: "default/bench:bulk".into(),
            vip: SocketAddr::new(vip, BULK_PORT),
            endpoints: BACKENDS
                .iter()
                .map(|b| SocketAddr::new(b.parse().expect("IP"), BULK_PORT))
                .collect(),
        },
    ]
}

/// `n` other services with `endpoints` endpoints each.
pub fn other_services(n: usize, endpoints: usize) -> Vec<SvcPort> {
    (0..n)
        .map(|i| SvcPort {
            name: format!("load/svc-{i}:http"),
            vip: SocketAddr::new(vip_of(i).into(), HTTP_PORT),
            endpoints: (0..endpoints)
                .map(|j| SocketAddr::new(endpoint_of(i, j).into(), 8080))
                .collect(),
        })
        .collect()
}

/// Manifests for the benchmark service and `n` others (Services and EndpointSlices).
pub fn manifests(n: usize, endpoints: usize) -> String {
    let mut y = String::with_capacity(n * (700 + 80 * endpoints));
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Service\nmetadata: {{name: bench, namespace: default}}\nspec:\n  clusterIP: {VIP}\n  ports:\n  - {{name: http, port: {HTTP_PORT}, targetPort: 8080}}\n  - {{name: bulk, port: {BULK_PORT}, targetPort: {BULK_PORT}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bench-1, namespace: default, labels: {{kubernetes.io/service-name: bench}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}, {{name: bulk, port: {BULK_PORT}}}]\nendpoints:\n"
    );
    for b in BACKENDS {
        let _ = writeln!(y, "- addresses: [\"{b}\"]");
    }
    for i in 0..n {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: load}}\nspec:\n  clusterIP: {}\n  ports: [{{name: http, port: {HTTP_PORT}, targetPort: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: load, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n",
            vip_of(i)
        );
        for j in 0..endpoints {
            // As in a real slice: every endpoint names its node (here one of 100).
            let _ = writeln!(
                y,
                "- addresses: [\"{}\"]\n  nodeName: node-{}",
                endpoint_of(i, j),
                (i * endpoints + j) % 100
            );
        }
    }
    y
}

pub struct World {
    pub sandbox: Sandbox,
    pub agent: AgentProcess,
    pub runners: Vec<Runner>,
    pub iptables_ns: String,
    pub nftables_ns: String,
}

/// How long each way took to install N services.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadTimes {
    pub services: usize,
    pub socklb_s: f64,
    pub iptables_s: f64,
    pub nftables_s: f64,
}

impl World {
    pub fn new() -> anyhow::Result<Self> {
        let sandbox = Sandbox::new()?;
        for b in BACKENDS {
            sandbox.add_backend(SocketAddr::new(b.parse()?, 8080), false)?;
            sandbox.add_sink(SocketAddr::new(b.parse()?, BULK_PORT))?;
        }
        sandbox.write_manifest("bench.yaml", &manifests(0, 3))?;
        let agent = sandbox.start_agent(&AgentOptions::default())?;
        let vip = |port| SocketAddr::new(VIP.parse().expect("VIP"), port);
        let backends: Vec<SocketAddr> = BACKENDS
            .iter()
            .map(|b| SocketAddr::new(b.parse().expect("IP"), 8080))
            .collect();
        let sink = SocketAddr::new(BACKENDS[0].parse()?, BULK_PORT);
        let mut runners = vec![Runner {
            case: Case::Socklb,
            client: sandbox.client()?,
            targets: vec![vip(HTTP_PORT)],
            bulk_target: vip(BULK_PORT),
        }];
        let mut pod_ns = Vec::new();
        for (case, name, addr) in [
            (Case::Direct, "direct", "10.244.0.3"),
            (Case::DirectControl, "control", "10.244.0.4"),
            (Case::Iptables, "ipt", "10.244.0.5"),
            (Case::Nftables, "nft", "10.244.0.6"),
        ] {
            let pod = sandbox.extra_client_pod(name, addr)?;
            let via_vip = matches!(case, Case::Iptables | Case::Nftables);
            if via_vip {
                // DNAT in nat OUTPUT runs after connect()'s route lookup: the service range
                // needs a route, in this namespace only.
                ip(&[
                    "-n",
                    &pod.netns,
                    "route",
                    "add",
                    "10.96.0.0/12",
                    "dev",
                    "eth0",
                ])?;
            }
            pod_ns.push(pod.netns.clone());
            runners.push(Runner {
                case,
                client: sandbox.client_in(&pod)?,
                targets: if via_vip {
                    vec![vip(HTTP_PORT)]
                } else {
                    backends.clone()
                },
                bulk_target: if via_vip { vip(BULK_PORT) } else { sink },
            });
        }
        Ok(Self {
            iptables_ns: pod_ns[2].clone(),
            nftables_ns: pod_ns[3].clone(),
            sandbox,
            agent,
            runners,
        })
    }

    /// Installs the benchmark service and `n` others everywhere; returns how long each took.
    pub fn set_services(&mut self, n: usize) -> anyhow::Result<LoadTimes> {
        let start = Instant::now();
        self.sandbox
            .write_manifest("bench.yaml", &manifests(n, 3))?;
        let want = (n + 2) as f64;
        while self.agent.metric("socklb_service_ports")?.unwrap_or(0.0) < want - 0.5 {
            anyhow::ensure!(
                start.elapsed() < Duration::from_mins(2),
                "socklb did not converge on {n} services"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let socklb_s = start.elapsed().as_secs_f64();
        let mut services = bench_services();
        // The benchmark's service sits in the middle of the others, as an average one would.
        let others = other_services(n, 3);
        let (head, tail) = others.split_at(n / 2);
        let mut all: Vec<SvcPort> = head.to_vec();
        all.append(&mut services);
        all.extend_from_slice(tail);
        let iptables_s = load_iptables(&self.iptables_ns, &all)
            .context("loading the iptables layout")?
            .as_secs_f64();
        let nftables_s = load_nftables(&self.nftables_ns, &all)
            .context("loading the nftables layout")?
            .as_secs_f64();
        Ok(LoadTimes {
            services: n,
            socklb_s,
            iptables_s,
            nftables_s,
        })
    }

    pub fn runner(&mut self, case: Case) -> Option<&mut Runner> {
        self.runners.iter_mut().find(|r| r.case == case)
    }
}
