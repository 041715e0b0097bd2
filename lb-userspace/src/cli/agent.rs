//! `socklb agent` arguments → `AgentConfig`. Every flag can also come from a `SOCKLB_*`
//! environment variable (so a `ConfigMap` can feed the `DaemonSet`).
use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::ValueEnum;
use lb_common::MapId;

use super::{
    DEFAULT_HEALTH_ADDRESS, DEFAULT_METRICS_ADDRESS, FeatureArgs, LogFormat, NodeArgs, PinArgs,
    init_logging,
};
use crate::{
    agent::{AgentConfig, Listeners, SourceConfig},
    dataplane::{loader::LoadConfig, maps::Capacities, sysfs},
};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum BpfLogLevel {
    #[default]
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// What `getpeername()` reports on a TCP socket connected through a service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PeerName {
    /// The service address the application dialled (as kube-proxy's NAT shows it). Each TCP
    /// connection gets a record at connect: a preallocated `CONNECTIONS` slot, or its own
    /// socket storage when its slot is taken.
    #[default]
    Service,
    /// The backend's address (as Calico's connect-time balancer): no record for TCP sockets,
    /// the cheapest connect.
    Backend,
}

/// Who carries Service traffic that arrives from outside the node (NodePorts, load-balancer
/// IPs and externalIPs on the wire): socklb translates sockets on the node only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ExternalTraffic {
    /// Nothing on this node: the load-balancer probes (health-check ports, kube-proxy's
    /// /healthz) tell load balancers that target nodes to send this node nothing.
    #[default]
    None,
    /// Another component on this node (the CNI's eBPF service handling, say): the probes
    /// answer as kube-proxy's would.
    Carried,
    /// socklb itself, with nftables rules in a table of its own (`ip socklb`, `ip6 socklb`), as
    /// kube-proxy's nftables mode: `NodePorts`, load-balancer IPs and `externalIPs` reaching this
    /// node are rewritten (DNAT) to their endpoints; the probes answer as kube-proxy's would. Needs the
    /// `nft` tool (1.0.1 or newer) and no kube-proxy rules on the node.
    Nftables,
}

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Read Services and EndpointSlices from this folder of YAML manifests (watched for
    /// changes) instead of the Kubernetes API.
    #[arg(long, conflicts_with = "kubeconfig", env = "SOCKLB_MANIFESTS")]
    pub manifests: Option<PathBuf>,
    /// Reject a manifest file bigger than this many bytes (its last good objects stay).
    #[arg(long, default_value_t = crate::source::files::DEFAULT_MAX_FILE_BYTES, env = "SOCKLB_MAX_MANIFEST_BYTES")]
    pub max_manifest_bytes: u64,
    /// Kubeconfig for the Kubernetes API (default: in-cluster config, or $KUBECONFIG).
    #[arg(long, env = "SOCKLB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's real address (https://HOST:PORT). Required to replace kube-proxy: the
    /// in-cluster default reaches the API through the `kubernetes` Service's ClusterIP, which
    /// only this agent could translate.
    #[arg(long, env = "SOCKLB_API_SERVER")]
    pub api_server: Option<String>,
    /// cgroup v2 directory to attach to (default: the cgroup2 mount from /proc/self/mountinfo).
    #[arg(long, env = "SOCKLB_CGROUP")]
    pub cgroup: Option<PathBuf>,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Address for /healthz, /livez and /readyz ("off" to disable).
    #[arg(long, default_value = DEFAULT_HEALTH_ADDRESS, env = "SOCKLB_HEALTH_LISTEN")]
    pub health_listen: String,
    /// Address for /metrics, /status and /connections ("off" to disable). Keep it on
    /// loopback: /status and /connections name Services and client pods.
    #[arg(long, default_value = DEFAULT_METRICS_ADDRESS, env = "SOCKLB_METRICS_LISTEN")]
    pub metrics_listen: String,
    /// Address for /metrics alone, for a scraper off the node (the node's own address, say,
    /// as the DaemonSet sets it); "off", the default. Nothing else is served there.
    #[arg(long, default_value = "off", env = "SOCKLB_PROMETHEUS_LISTEN")]
    pub prometheus_listen: String,
    /// Serve the healthCheckNodePort of every LoadBalancer Service with
    /// externalTrafficPolicy Local, as kube-proxy does (200 while this node has a ready
    /// endpoint of it and carries its traffic, see --external-traffic, else 503). Only instead
    /// of kube-proxy: next to it, the ports are its.
    #[arg(long, env = "SOCKLB_HEALTH_CHECK_NODE_PORTS")]
    pub health_check_node_ports: bool,
    /// Serve kube-proxy's /healthz and /livez on this address: IP:PORT, or an IP alone for port
    /// 10256 ("off", the default; kube-proxy's is 0.0.0.0:10256, which, as kube-proxy's, answers
    /// IPv4 and IPv6). Only instead of kube-proxy, whose port it is.
    #[arg(long, default_value = "off", env = "SOCKLB_KUBE_PROXY_HEALTHZ")]
    pub kube_proxy_healthz: String,
    /// Who carries Service traffic arriving from outside this node (NodePorts, load-balancer
    /// IPs on the wire), which socklb does not translate. With "none" the health-check ports
    /// answer localEndpoints 0 (503) and kube-proxy's /healthz nodeEligible false (503), so
    /// load balancers that target nodes send this node nothing; "carried": another component
    /// on this node does (the CNI's service handling), and they answer as kube-proxy's.
    #[arg(long, value_enum, default_value_t, env = "SOCKLB_EXTERNAL_TRAFFIC")]
    pub external_traffic: ExternalTraffic,
    /// With --external-traffic nftables: the cluster's pod ranges (comma-separated CIDRs, as
    /// kube-proxy's --cluster-cidr). Under externalTrafficPolicy Local, traffic from them that
    /// reaches a NodePort or load-balancer IP is sent to any endpoint, unmasqueraded, as
    /// kube-proxy's local-traffic detector does. Without it only the node's own traffic is.
    #[arg(long, value_delimiter = ',', env = "SOCKLB_CLUSTER_CIDR")]
    pub cluster_cidr: Vec<String>,
    /// With --external-traffic nftables: the packet mark bit (0-31) that asks for masquerade,
    /// cleared before the packet leaves (kube-proxy's --iptables-masquerade-bit).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31), env = "SOCKLB_MASQUERADE_BIT")]
    pub masquerade_bit: u8,
    /// Log format (json for log collectors).
    #[arg(long, value_enum, default_value_t, env = "SOCKLB_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace); `SOCKLB_LOG` takes a full filter instead.
    #[arg(long, default_value = "info", env = "SOCKLB_LOG_LEVEL")]
    pub log_level: String,
    /// Log level inside the eBPF programs (off removes the logging code from the programs).
    #[arg(long, value_enum, default_value_t, env = "SOCKLB_BPF_LOG_LEVEL")]
    pub bpf_log_level: BpfLogLevel,
    /// What `getpeername()` reports on TCP sockets connected through a service.
    #[arg(long, value_enum, default_value_t, env = "SOCKLB_TCP_PEER_NAME")]
    pub tcp_peer_name: PeerName,
    /// How often the agent looks for failed backend sets due another try, in milliseconds
    /// (each failing set backs off on its own, from 0.5 s to 60 s).
    #[arg(long, default_value_t = 1000, env = "SOCKLB_RETRY_MS")]
    pub retry_ms: u64,
    /// The agent's own /livez (the kubelet's liveness probe) fails when a change that arrived
    /// after the first full sync stays unwritten this long (seconds). An unreachable API server
    /// sends no change: it never fails /livez (only /readyz).
    #[arg(long, default_value_t = 120, env = "SOCKLB_STUCK_AFTER_S")]
    pub stuck_after_s: u64,
    /// kube-proxy's /healthz and /livez, and the health-check ports' `serviceProxyHealthy`,
    /// turn 503 when a change that arrived after the first full sync stays unwritten this long
    /// (seconds): kube-proxy's 2 × syncPeriod (30 s). An unreachable API server sends no
    /// change: it never turns them 503.
    #[arg(long, default_value_t = 60, env = "SOCKLB_HEALTHZ_STALE_AFTER_S")]
    pub healthz_stale_after_s: u64,
    /// The most the maps may take together (a Kubernetes quantity: 512Mi, 1Gi, or bytes). The
    /// `--max-*` sizes below are where the maps start: a map grows (doubles) before it fills,
    /// moved to larger maps make-before-break, up to this; nothing is refused for room below it.
    /// 0: the maps keep their sizes.
    #[arg(long, default_value = "512Mi", env = "SOCKLB_MAX_MAP_MEMORY")]
    pub max_map_memory: String,
    /// Capacity of FRONTENDS4 and FRONTENDS6 (service addresses of each family) to start with.
    #[arg(long, default_value_t = MapId::Frontends4.default_capacity(), env = "SOCKLB_MAX_FRONTENDS")]
    pub max_frontends: u32,
    /// Capacity of BACKENDS (backend entries over all backend sets) to start with.
    #[arg(long, default_value_t = MapId::Backends.default_capacity(), env = "SOCKLB_MAX_BACKENDS")]
    pub max_backends: u32,
    /// Capacity of SERVICE_META (backend sets: service ports per family and scope) to start
    /// with.
    #[arg(long, default_value_t = MapId::ServiceMeta.default_capacity(), env = "SOCKLB_MAX_SERVICES")]
    pub max_services: u32,
    /// Capacity of AFFINITY (client cgroups with a session-affinity table, an LRU) to start
    /// with.
    #[arg(long, default_value_t = MapId::Affinity.default_capacity(), env = "SOCKLB_MAX_AFFINITY_CLIENTS")]
    pub max_affinity_clients: u32,
    /// Translated sockets one client cgroup (a pod's container) may hold at once; past it, its
    /// new service sockets get ENOBUFS. Each holds a record the kernel charges to the agent's
    /// memory. 0 turns the bound off.
    #[arg(long, default_value_t = 65_536, env = "SOCKLB_MAX_SOCKETS_PER_POD")]
    pub max_sockets_per_pod: u64,
    #[command(flatten)]
    pub features: FeatureArgs,
}

impl AgentArgs {
    /// The map sizes, from the flags named in the map table.
    fn capacities(&self) -> Capacities {
        let mut c = Capacities::default();
        for map in MapId::ALL {
            let value = match map.descriptor().capacity_flag {
                Some("max-frontends") => self.max_frontends,
                Some("max-backends") => self.max_backends,
                Some("max-services") => self.max_services,
                Some("max-affinity-clients") => self.max_affinity_clients,
                _ => continue,
            };
            c = c.with(map, value);
        }
        c
    }
}

fn listen(value: &str, flag: &str) -> anyhow::Result<Option<SocketAddr>> {
    match value {
        "off" | "" => Ok(None),
        addr => Ok(Some(
            addr.parse().with_context(|| format!("--{flag} {addr}"))?,
        )),
    }
}

/// kube-proxy's port for /healthz and /livez (`ports.ProxyHealthzPort`).
const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;

/// `--kube-proxy-healthz`: `IP:PORT` or, as kube-proxy's `--healthz-bind-address`
/// (`IPPortVar`), an IP alone for port 10256 (`[v6]` or a bare IPv6 address too).
fn kube_proxy_healthz(value: &str) -> anyhow::Result<Option<SocketAddr>> {
    if let Ok(ip) = value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        return Ok(Some(SocketAddr::new(ip, KUBE_PROXY_HEALTHZ_PORT)));
    }
    listen(value, "kube-proxy-healthz").context("not an IP or IP:PORT")
}

pub(super) fn run(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format, &args.log_level);
    let cgroup = match &args.cgroup {
        Some(c) => c.clone(),
        None => sysfs::cgroup2_mount()
            .context("no cgroup2 mount in /proc/self/mountinfo; pass --cgroup")?,
    };
    let source = match &args.manifests {
        Some(dir) => SourceConfig::Manifests {
            dir: dir.clone(),
            max_file_bytes: args.max_manifest_bytes,
        },
        None => SourceConfig::Kubernetes {
            kubeconfig: args.kubeconfig.clone(),
            api_server: args.api_server.clone(),
        },
    };
    let config = AgentConfig {
        source,
        load: LoadConfig {
            pin_folder: args.pins.pin_folder.clone(),
            cgroup,
            capacities: args.capacities(),
            log_level: args.bpf_log_level as u8,
            record_tcp: args.tcp_peer_name == PeerName::Service,
            disabled: args.features.disabled(),
            max_sockets_per_pod: (args.max_sockets_per_pod > 0).then_some(args.max_sockets_per_pod),
        },
        node: args.node.flags()?,
        health_listen: listen(&args.health_listen, "health-listen")?,
        metrics_listen: listen(&args.metrics_listen, "metrics-listen")?,
        prometheus_listen: listen(&args.prometheus_listen, "prometheus-listen")?,
        kube_proxy_healthz: kube_proxy_healthz(&args.kube_proxy_healthz)?,
        health_check_node_ports: args.health_check_node_ports,
        external_traffic: args.external_traffic != ExternalTraffic::None,
        outside: (args.external_traffic == ExternalTraffic::Nftables)
            .then(|| outside_options(args))
            .transpose()?,
        retry_interval: Duration::from_millis(args.retry_ms.max(10)),
        stuck_after: Duration::from_secs(args.stuck_after_s.max(1)),
        healthz_stale_after: Duration::from_secs(args.healthz_stale_after_s.max(1)),
        ask_api_version: args.node.kubernetes_version.is_none() && args.manifests.is_none(),
        map_memory_ceiling: crate::agent::parse_bytes(&args.max_map_memory).with_context(|| {
            format!(
                "--max-map-memory {:?}: a size such as 512Mi, 1Gi or a number of bytes",
                args.max_map_memory
            )
        })?,
    };
    crate::agent::limit_arenas();
    // Bind first: a port in use must fail before anything is loaded or attached.
    let listeners = Listeners::bind(&config)?;
    let dataplane = crate::agent::prepare(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(crate::agent::run(config, listeners, dataplane))?;
    Ok(ExitCode::SUCCESS)
}

/// The outside path's options from the flags.
fn outside_options(args: &AgentArgs) -> anyhow::Result<crate::outside::render::RenderOptions> {
    let cluster_cidrs = args
        .cluster_cidr
        .iter()
        .map(|c| {
            crate::model::Cidr::parse(c.trim())
                .ok_or_else(|| anyhow::anyhow!("--cluster-cidr {c:?}: not a CIDR (10.244.0.0/16)"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(crate::outside::render::RenderOptions {
        masquerade_bit: args.masquerade_bit,
        cluster_cidrs,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use lb_common::MapId;

    use crate::cli::{Cli, Command};

    /// kube-proxy's `--healthz-bind-address` forms: `IP:PORT`, or an IP alone for 10256.
    #[test]
    fn the_kube_proxy_healthz_address_takes_kube_proxys_forms() {
        let parse = |v: &str| {
            super::kube_proxy_healthz(v)
                .expect(v)
                .map(|a| a.to_string())
        };
        assert_eq!(parse("off"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("0.0.0.0:10256").as_deref(), Some("0.0.0.0:10256"));
        assert_eq!(parse("0.0.0.0").as_deref(), Some("0.0.0.0:10256"));
        assert_eq!(parse("::").as_deref(), Some("[::]:10256"));
        assert_eq!(parse("[::]").as_deref(), Some("[::]:10256"));
        assert_eq!(parse("[fd00::1]:8080").as_deref(), Some("[fd00::1]:8080"));
        assert!(super::kube_proxy_healthz("10.0.0.0/8").is_err());
        assert!(super::kube_proxy_healthz("node-a:10256").is_err());
    }

    /// The flag the map table names for a map sizes that map: `socklb agent --<flag> 7` gives
    /// every map with that flag 7 entries and leaves the others at their default.
    #[test]
    fn every_capacity_flag_of_the_map_table_sizes_its_maps() {
        for map in MapId::ALL {
            let Some(flag) = map.descriptor().capacity_flag else {
                continue;
            };
            let cli = Cli::try_parse_from(["socklb", "agent", &format!("--{flag}"), "7"])
                .unwrap_or_else(|e| panic!("--{flag} (from the map table): {e}"));
            let Command::Agent(args) = cli.command else {
                panic!("not the agent command");
            };
            let caps = args.capacities();
            for other in MapId::ALL {
                let want = if other.descriptor().capacity_flag == Some(flag) {
                    7
                } else {
                    other.default_capacity()
                };
                assert_eq!(caps.get(other), want, "--{flag}: {}", other.name());
            }
        }
    }
}
