//! The benchmark's world: three backend pods (TCP and UDP echo), three IPv6 ones (TCP echo)
//! behind one IPv6 service, one client pod per case, the agent, and N other services installed
//! in socklb's maps and in the kube-proxy rule sets alike.
//! Every other service's endpoints are the same three live pods, so a client can spread its
//! connects over all N services (cold maps) and every connect is answered.
use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::MapId;

use super::{
    baselines::{SvcPort, load_iptables, load_nftables},
    datapath::Case,
};
use crate::{Client, Sandbox, agent::AgentOptions, agent::AgentProcess, system::ip};

pub const VIP: &str = "10.96.0.10";
/// A service on the same backends with `sessionAffinity: ClientIP` (its own row of the kernel
/// cost).
pub const VIP_AFFINITY: &str = "10.96.0.11";
pub const HTTP_PORT: u16 = 80;
pub const DNS_PORT: u16 = 53;
pub const BACKEND_TCP: u16 = 8080;
pub const BACKEND_UDP: u16 = 5353;
pub const BACKENDS: [&str; 3] = ["10.244.1.21", "10.244.2.34", "10.244.3.47"];
/// The benchmark's IPv6 service (http only) and its backends, pods of their own.
pub const VIP6: &str = "fd00:96::10";
pub const BACKENDS6: [&str; 3] = ["fd00:244::1:21", "fd00:244::2:34", "fd00:244::3:47"];

pub fn vip_of(i: usize) -> Ipv4Addr {
    // 10.100.0.0/16 onwards: inside the service range, never the benchmark's own VIP.
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + u32::try_from(i).unwrap_or(0))
}

fn endpoint_of(i: usize, j: usize) -> Ipv4Addr {
    // Endpoint j of service i: 10.(128+j).x.y, never contacted.
    let base = u32::from(Ipv4Addr::new(10, 128 + u8::try_from(j).unwrap_or(0), 0, 0));
    Ipv4Addr::from(base + u32::try_from(i).unwrap_or(0) + 1)
}

fn backend_ips() -> impl Iterator<Item = IpAddr> {
    BACKENDS.iter().map(|b| b.parse().expect("literal IP"))
}

/// The three live backends on `port`.
pub fn backends(port: u16) -> Vec<SocketAddr> {
    backend_ips().map(|ip| SocketAddr::new(ip, port)).collect()
}

/// The three live IPv6 backends on `port`.
pub fn backends6(port: u16) -> Vec<SocketAddr> {
    BACKENDS6
        .iter()
        .map(|b| SocketAddr::new(b.parse().expect("literal IP"), port))
        .collect()
}

/// The benchmark's own service (http 80 → 8080) and `n` others, all served by the live
/// backends, as kube-proxy sees them (TCP only: the rule sets serve the TCP cases).
pub fn kube_proxy_services(n: usize) -> Vec<SvcPort> {
    let vip: IpAddr = VIP.parse().expect("VIP");
    let own = SvcPort {
        name: "default/bench:http".into(),
        vip: SocketAddr::new(vip, HTTP_PORT),
        endpoints: backends(BACKEND_TCP),
    };
    let others: Vec<SvcPort> = (0..n)
        .map(|i| SvcPort {
            name: format!("load/svc-{i}:http"),
            vip: SocketAddr::new(vip_of(i).into(), HTTP_PORT),
            endpoints: backends(BACKEND_TCP),
        })
        .collect();
    // The benchmark's service sits in the middle of the others, as an average one would.
    let (head, tail) = others.split_at(n / 2);
    let mut all = head.to_vec();
    all.push(own);
    all.extend_from_slice(tail);
    all
}

/// Every service address a cold-maps client spreads over: the benchmark's and the others'.
pub fn all_vips(n: usize) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = (0..n)
        .map(|i| SocketAddr::new(vip_of(i).into(), HTTP_PORT))
        .collect();
    v.push(SocketAddr::new(VIP.parse().expect("VIP"), HTTP_PORT));
    v
}

/// IPv6 service `i`'s address: `fd00:96::1:0` onwards (the benchmark's own IPv6 VIP is below).
pub fn vip6_of(i: usize) -> std::net::Ipv6Addr {
    let i = u32::try_from(i).unwrap_or(0);
    let [hi, lo] = [(i >> 16) as u16, (i & 0xffff) as u16];
    std::net::Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 1 + hi, lo)
}

/// The first `n` IPv6 services' frontends.
pub fn all_vips6(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::new(vip6_of(i).into(), HTTP_PORT))
        .collect()
}

/// `n` IPv6 services on the live IPv6 backends.
fn ipv6_manifests(n: usize) -> String {
    let mut y = String::with_capacity(n * 600);
    for i in 0..n {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc6-{i}, namespace: load}}\nspec:\n  clusterIP: \"{}\"\n  ipFamilies: [IPv6]\n  ports: [{{name: http, port: {HTTP_PORT}, targetPort: {BACKEND_TCP}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc6-{i}-1, namespace: load, labels: {{kubernetes.io/service-name: svc6-{i}}}}}\naddressType: IPv6\nports: [{{name: http, port: {BACKEND_TCP}}}]\nendpoints:\n",
            vip6_of(i)
        );
        for b in BACKENDS6 {
            let _ = writeln!(y, "- addresses: [\"{b}\"]");
        }
    }
    y
}

/// Manifests for the data path: the benchmark's service (http and dns) and `n` others on the
/// live backends.
pub fn datapath_manifests(n: usize) -> String {
    let mut y = String::with_capacity(n * 600);
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Service\nmetadata: {{name: bench, namespace: default}}\nspec:\n  clusterIP: {VIP}\n  ports:\n  - {{name: http, port: {HTTP_PORT}, targetPort: {BACKEND_TCP}}}\n  - {{name: dns, port: {DNS_PORT}, targetPort: {BACKEND_UDP}, protocol: UDP}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bench-1, namespace: default, labels: {{kubernetes.io/service-name: bench}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_TCP}}}, {{name: dns, port: {BACKEND_UDP}, protocol: UDP}}]\nendpoints:\n"
    );
    for b in BACKENDS {
        let _ = writeln!(y, "- addresses: [\"{b}\"]");
    }
    let _ = write!(
        y,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: bench6, namespace: default}}\nspec:\n  clusterIP: \"{VIP6}\"\n  ipFamilies: [IPv6]\n  ports:\n  - {{name: http, port: {HTTP_PORT}, targetPort: {BACKEND_TCP}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bench6-1, namespace: default, labels: {{kubernetes.io/service-name: bench6}}}}\naddressType: IPv6\nports: [{{name: http, port: {BACKEND_TCP}}}]\nendpoints:\n"
    );
    for b in BACKENDS6 {
        let _ = writeln!(y, "- addresses: [\"{b}\"]");
    }
    let _ = write!(
        y,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: bench-affinity, namespace: default}}\nspec:\n  clusterIP: {VIP_AFFINITY}\n  sessionAffinity: ClientIP\n  ports:\n  - {{name: http, port: {HTTP_PORT}, targetPort: {BACKEND_TCP}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bench-affinity-1, namespace: default, labels: {{kubernetes.io/service-name: bench-affinity}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_TCP}}}]\nendpoints:\n"
    );
    for b in BACKENDS {
        let _ = writeln!(y, "- addresses: [\"{b}\"]");
    }
    for i in 0..n {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: load}}\nspec:\n  clusterIP: {}\n  ports: [{{name: http, port: {HTTP_PORT}, targetPort: {BACKEND_TCP}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: load, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: {BACKEND_TCP}}}]\nendpoints:\n",
            vip_of(i)
        );
        for b in BACKENDS {
            let _ = writeln!(y, "- addresses: [\"{b}\"]");
        }
    }
    y
}

/// Manifests for the control plane: `n` services with `endpoints` endpoints each (addresses
/// never contacted), every endpoint naming its node as in a real slice.
pub fn manifests(n: usize, endpoints: usize) -> String {
    let mut y = String::with_capacity(n * (700 + 80 * endpoints));
    for i in 0..n {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: load}}\nspec:\n  clusterIP: {}\n  ports: [{{name: http, port: {HTTP_PORT}, targetPort: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: load, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n",
            vip_of(i)
        );
        for j in 0..endpoints {
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

/// A client of one case.
pub struct Runner {
    pub case: Case,
    pub client: Client,
}

pub struct World {
    /// Shared, so a signal tears it down (`sandbox::teardown_on_signal`).
    pub sandbox: Arc<Sandbox>,
    agent: Option<AgentProcess>,
    pub runners: Vec<Runner>,
    direct_pod: crate::sandbox::ClientPod,
    iptables_ns: String,
    nftables_ns: String,
    pub services: usize,
    /// IPv6 services installed beside them (`set_ipv6_services`), for the IPv6 spread rows.
    pub services6: usize,
}

/// The frontend indexes' share of the frontends of each family, from the agent's
/// `socklb_map_entries`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct IndexShare {
    pub frontends4: u64,
    pub held: u64,
    pub frontends6: u64,
    pub held6: u64,
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
        let sandbox = Sandbox::shared()?;
        for ip in backend_ips() {
            sandbox.add_backend(SocketAddr::new(ip, BACKEND_TCP), false)?;
            sandbox.add_backend(SocketAddr::new(ip, BACKEND_UDP), true)?;
            tcp_hygiene(&sandbox, &sandbox.pod(ip)?)?;
        }
        for addr in backends6(BACKEND_TCP) {
            sandbox.add_backend(addr, false)?;
            sandbox.add_backend(SocketAddr::new(addr.ip(), BACKEND_UDP), true)?;
            tcp_hygiene(&sandbox, &sandbox.pod(addr.ip())?)?;
        }
        tcp_hygiene(&sandbox, &sandbox.client_ns)?;
        sandbox.write_manifest("bench.yaml", &datapath_manifests(0))?;
        let agent = sandbox.start_agent(&AgentOptions::default())?;
        let mut runners = vec![Runner {
            case: Case::Socklb,
            client: sandbox.client()?,
        }];
        let mut direct_pod = None;
        let mut netns = Vec::new();
        for (case, name, addr) in [
            (Case::Direct, "direct", "10.244.0.3"),
            (Case::DirectControl, "control", "10.244.0.4"),
            (Case::Iptables, "ipt", "10.244.0.5"),
            (Case::Nftables, "nft", "10.244.0.6"),
        ] {
            let pod = sandbox.extra_client_pod(name, addr)?;
            if matches!(case, Case::Iptables | Case::Nftables) {
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
            tcp_hygiene(&sandbox, &pod.netns)?;
            runners.push(Runner {
                case,
                client: sandbox.client_in(&pod)?,
            });
            netns.push(pod.netns.clone());
            if case == Case::Direct {
                direct_pod = Some(pod);
            }
        }
        Ok(Self {
            sandbox,
            agent: Some(agent),
            runners,
            direct_pod: direct_pod.context("the direct pod")?,
            iptables_ns: netns[2].clone(),
            nftables_ns: netns[3].clone(),
            services: 0,
            services6: 0,
        })
    }

    /// Installs the benchmark service and `n` others everywhere; returns how long each took.
    pub fn set_services(&mut self, n: usize) -> anyhow::Result<LoadTimes> {
        let start = Instant::now();
        self.sandbox
            .write_manifest("bench.yaml", &datapath_manifests(n))?;
        self.wait_service_ports(n + 3)?;
        let socklb_s = start.elapsed().as_secs_f64();
        let all = kube_proxy_services(n);
        let iptables_s = load_iptables(&self.iptables_ns, &all)
            .context("loading the iptables layout")?
            .as_secs_f64();
        let nftables_s = load_nftables(&self.nftables_ns, &all)
            .context("loading the nftables layout")?
            .as_secs_f64();
        self.services = n;
        Ok(LoadTimes {
            services: n,
            socklb_s,
            iptables_s,
            nftables_s,
        })
    }

    pub fn agent(&self) -> anyhow::Result<&AgentProcess> {
        self.agent.as_ref().context("no agent running")
    }

    /// Installs `n` IPv6 services on the live IPv6 backends (0: removes them), beside the
    /// others, and waits until the agent holds them.
    pub fn set_ipv6_services(&mut self, n: usize) -> anyhow::Result<()> {
        let agent = self.agent()?;
        let ports =
            || -> anyhow::Result<f64> { Ok(agent.metric("socklb_service_ports")?.unwrap_or(0.0)) };
        let want = ports()? + n as f64 - self.services6 as f64;
        self.sandbox
            .write_manifest("bench6.yaml", &ipv6_manifests(n))?;
        let start = Instant::now();
        while (ports()? - want).abs() > 0.5 {
            anyhow::ensure!(
                start.elapsed() < Duration::from_mins(3),
                "socklb did not converge on {n} IPv6 services"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.services6 = n;
        Ok(())
    }

    fn wait_service_ports(&self, want: usize) -> anyhow::Result<()> {
        let start = Instant::now();
        let agent = self.agent()?;
        while agent.metric("socklb_service_ports")?.unwrap_or(0.0) < want as f64 - 0.5 {
            anyhow::ensure!(
                start.elapsed() < Duration::from_mins(3),
                "socklb did not converge on {want} service ports"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// How many frontends of each family the agent has installed, and how many its frontend
    /// index holds.
    pub fn index_share(&self) -> anyhow::Result<IndexShare> {
        let agent = self.agent()?;
        let entries = |map: MapId| -> anyhow::Result<u64> {
            let name = format!("socklb_map_entries{{map=\"{}\"}}", map.name());
            let v = agent.metric(&name)?.with_context(|| format!("no {name}"))?;
            // A gauge of entries: a whole number well within f64's exact integers.
            format!("{v:.0}")
                .parse()
                .with_context(|| format!("{name} is {v}, not a count"))
        };
        Ok(IndexShare {
            frontends4: entries(MapId::Frontends4)?,
            held: entries(MapId::FrontendIndex)?,
            frontends6: entries(MapId::Frontends6)?,
            held6: entries(MapId::FrontendIndex6)?,
        })
    }

    /// Restarts the agent with `args` (the maps stay pinned; the programs are replaced).
    pub fn restart_agent(&mut self, args: &[&str]) -> anyhow::Result<()> {
        // The old agent goes first: one writer per pin folder.
        drop(self.agent.take());
        self.agent = Some(self.sandbox.start_agent(&AgentOptions {
            args: args.iter().map(ToString::to_string).collect(),
            ready_timeout: Some(Duration::from_mins(3)),
            ..AgentOptions::default()
        })?);
        self.wait_service_ports(self.services + 2)
    }

    /// Stops the agent (its pins stay until the sandbox goes).
    pub fn stop_agent(&mut self) {
        drop(self.agent.take());
    }

    pub fn runner(&mut self, case: Case) -> anyhow::Result<&mut Runner> {
        self.runners
            .iter_mut()
            .find(|r| r.case == case)
            .with_context(|| format!("no {case} client"))
    }

    /// `k` more clients of `case` (socklb: in the served cgroup; direct: in the direct pod).
    pub fn extra_clients(&self, case: Case, k: usize) -> anyhow::Result<Vec<Client>> {
        (0..k)
            .map(|_| match case {
                Case::Socklb => self.sandbox.client(),
                _ => self.sandbox.client_in(&self.direct_pod),
            })
            .collect()
    }
}

/// Tens of thousands of short connections between the same few addresses leave their 4-tuples
/// in `TIME_WAIT` for a minute: let new connects reuse them and use the whole port range, as a
/// busy node is tuned, so no pass stalls on a SYN retransmit (in every case alike).
fn tcp_hygiene(sandbox: &Sandbox, netns: &str) -> anyhow::Result<()> {
    sandbox.netns_sysctl(netns, "net.ipv4.tcp_tw_reuse=1")?;
    sandbox.netns_sysctl(netns, "net.ipv4.ip_local_port_range=1024 65535")
}
