//! Three nodes on one machine, for the outside path: node network namespaces on one L2 fabric
//! (a bridge in the sandbox's switch namespace), pods behind each node on a bridge of the
//! node's own with routes between the nodes' pod ranges, a client outside the nodes, and one
//! agent per node (its own cgroup, pins and node name) reading the same manifests.
//!
//! Addresses. Fabric: node N is `192.168.60.1N/24` and `fd00:60::1N/64`, the outside client
//! `192.168.60.100` and `fd00:60::100`. Pods of node N: `10.244.10N.0/24` and
//! `fd00:244:10N::/64`, the node's bridge `.1`. The client reaches load-balancer IPs
//! (`192.0.2.0/24`, `2001:db8:2::/64`) and externalIPs (`198.51.100.0/24`, `2001:db8:51::/64`)
//! through a route to one node (`route_via`), as a router or `MetalLB` would send them. Every
//! address lives in a namespace the sandbox made; nothing leaves the machine.
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use crate::{
    Client, Sandbox,
    agent::{AgentOptions, AgentProcess},
    sandbox::ClientPod,
    system::ip,
};

/// One simulated node.
pub struct Node {
    /// `node-N`.
    pub name: String,
    pub netns: String,
    pub ip4: IpAddr,
    pub ip6: IpAddr,
    /// The cgroup its agent attaches to (its pods' cgroups are below it).
    pub cgroup: PathBuf,
    pub pins: PathBuf,
    index: u8,
    pods: std::sync::atomic::AtomicU8,
}

/// A pod behind a node.
pub struct Pod {
    pub netns: String,
    pub ip4: IpAddr,
    pub ip6: IpAddr,
    pub cgroup: PathBuf,
}

impl Pod {
    pub fn as_client_pod(&self) -> ClientPod {
        ClientPod {
            netns: self.netns.clone(),
            cgroup: self.cgroup.clone(),
        }
    }
}

pub struct Cluster<'a> {
    pub sandbox: &'a Sandbox,
    pub nodes: Vec<Node>,
    /// The client outside the nodes (no cgroup socklb attaches to).
    pub outside: ClientPod,
}

pub const CLIENT4: &str = "192.168.60.100";
pub const CLIENT6: &str = "fd00:60::100";
/// Load-balancer IPs and externalIPs, routed to a node from the outside client.
pub const LB_RANGES: [&str; 4] = [
    "192.0.2.0/24",
    "198.51.100.0/24",
    "2001:db8:2::/64",
    "2001:db8:51::/64",
];

impl<'a> Cluster<'a> {
    /// `count` nodes (at most 9) and the outside client; no agent yet.
    pub fn new(sandbox: &'a Sandbox, count: u8) -> anyhow::Result<Self> {
        let sw = &sandbox.switch_ns;
        sandbox.bridge(sw, "fab0")?;
        let outside_ns = sandbox.netns("o")?;
        sandbox.plug_into(
            &outside_ns,
            "eth0",
            sw,
            "fab0",
            "o0",
            &[format!("{CLIENT4}/24"), format!("{CLIENT6}/64")],
        )?;
        let mut nodes = Vec::new();
        for i in 1..=count.min(9) {
            nodes.push(Self::node(sandbox, i)?);
        }
        // Each node reaches the others' pods through them.
        for n in &nodes {
            for m in nodes.iter().filter(|m| m.index != n.index) {
                ip(&[
                    "-n",
                    &n.netns,
                    "route",
                    "add",
                    &format!("10.244.10{}.0/24", m.index),
                    "via",
                    &m.ip4.to_string(),
                ])?;
                ip(&[
                    "-n",
                    &n.netns,
                    "-6",
                    "route",
                    "add",
                    &format!("fd00:244:10{}::/64", m.index),
                    "via",
                    &m.ip6.to_string(),
                ])?;
            }
        }
        let outside = ClientPod {
            netns: outside_ns,
            cgroup: sandbox.extra_cgroup("outside")?,
        };
        let cluster = Self {
            sandbox,
            nodes,
            outside,
        };
        cluster.route_via(0)?;
        Ok(cluster)
    }

    fn node(sandbox: &Sandbox, i: u8) -> anyhow::Result<Node> {
        let ns = sandbox.netns(&format!("n{i}"))?;
        let ip4: IpAddr = format!("192.168.60.1{i}").parse()?;
        let ip6: IpAddr = format!("fd00:60::1{i}").parse()?;
        sandbox.plug_into(
            &ns,
            "eth0",
            &sandbox.switch_ns,
            "fab0",
            &format!("n{i}"),
            &[format!("{ip4}/24"), format!("{ip6}/64")],
        )?;
        sandbox.bridge(&ns, "cbr0")?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.244.10{i}.1/24"),
            "dev",
            "cbr0",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("fd00:244:10{i}::1/64"),
            "dev",
            "cbr0",
            "nodad",
        ])?;
        for setting in [
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
            "net.ipv4.conf.all.rp_filter=0",
        ] {
            sandbox.netns_sysctl(&ns, setting)?;
        }
        let cgroup = sandbox.extra_cgroup(&format!("node{i}"))?;
        Ok(Node {
            name: format!("node-{i}"),
            netns: ns,
            ip4,
            ip6,
            cgroup,
            pins: sandbox.pin_mount.join(format!("node{i}")),
            index: i,
            pods: std::sync::atomic::AtomicU8::new(1),
        })
    }

    /// Sends the outside client's traffic for load-balancer IPs and externalIPs to node
    /// `index` (0-based), as a router would.
    pub fn route_via(&self, index: usize) -> anyhow::Result<()> {
        let node = &self.nodes[index];
        for range in LB_RANGES {
            let via = if range.contains(':') {
                node.ip6.to_string()
            } else {
                node.ip4.to_string()
            };
            ip(&[
                "-n",
                &self.outside.netns,
                "route",
                "replace",
                range,
                "via",
                &via,
            ])?;
        }
        Ok(())
    }

    /// A new pod behind node `index` (0-based).
    pub fn pod(&self, index: usize) -> anyhow::Result<Pod> {
        let node = &self.nodes[index];
        let n = node.pods.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let i = node.index;
        let ns = self.sandbox.netns(&format!("p{i}{n}"))?;
        let ip4: IpAddr = format!("10.244.10{i}.{n}").parse()?;
        let ip6: IpAddr = format!("fd00:244:10{i}::{n}").parse()?;
        self.sandbox.plug_into(
            &ns,
            "eth0",
            &node.netns,
            "cbr0",
            &format!("p{n}"),
            &[format!("{ip4}/24"), format!("{ip6}/64")],
        )?;
        ip(&[
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            &format!("10.244.10{i}.1"),
        ])?;
        ip(&[
            "-n",
            &ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("fd00:244:10{i}::1"),
        ])?;
        let cgroup = node.cgroup.join(format!("pod{n}"));
        self.sandbox.child_cgroup(&cgroup)?;
        Ok(Pod {
            netns: ns,
            ip4,
            ip6,
            cgroup,
        })
    }

    /// A backend in `pod` answering on `port` (both families), TCP or UDP.
    pub fn serve(&self, pod: &Pod, port: u16, udp: bool) -> anyhow::Result<()> {
        for addr in [pod.ip4, pod.ip6] {
            self.sandbox
                .serve_in_netns(&pod.netns, SocketAddr::new(addr, port), udp)?;
        }
        Ok(())
    }

    /// The Node objects, as manifests.
    pub fn node_manifests(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "apiVersion: v1\nkind: Node\nmetadata: {{name: {}}}\nstatus:\n  addresses:\n    - {{type: InternalIP, address: {}}}\n    - {{type: InternalIP, address: \"{}\"}}\n",
                    n.name, n.ip4, n.ip6
                )
            })
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// Starts node `index`'s agent with `--external-traffic nftables` and `args`.
    pub fn agent(&self, index: usize, args: &[&str]) -> anyhow::Result<AgentProcess> {
        let node = &self.nodes[index];
        let mut all: Vec<String> = [
            "--node-name",
            &node.name,
            "--external-traffic",
            "nftables",
            "--health-check-node-ports",
        ]
        .iter()
        .map(|a| (*a).to_string())
        .collect();
        all.extend(args.iter().map(|a| (*a).to_string()));
        self.sandbox.start_agent(&AgentOptions {
            args: all,
            netns: Some(node.netns.clone()),
            cgroup: Some(node.cgroup.clone()),
            pin_folder: Some(node.pins.clone()),
            ..AgentOptions::default()
        })
    }

    /// A client process outside the nodes.
    pub fn outside_client(&self) -> anyhow::Result<Client> {
        self.sandbox.client_in(&self.outside)
    }

    /// A client process in `pod` (socklb's programs of its node attached above it).
    pub fn client_in(&self, pod: &Pod) -> anyhow::Result<Client> {
        self.sandbox.client_in(&pod.as_client_pod())
    }
}
