//! `socklb agent` arguments → `AgentConfig`.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::ValueEnum;

use super::{DEFAULT_AGENT_ADDRESS, LogFormat, NodeArgs, PinArgs, init_logging};
use crate::{
    agent::{AgentConfig, SourceConfig},
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

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Read Services and EndpointSlices from this folder of YAML manifests (watched for
    /// changes) instead of the Kubernetes API.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: in-cluster config, or $KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// cgroup v2 directory to attach to (default: the cgroup2 mount from /proc/self/mountinfo).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Address for /healthz, /readyz, /status and /metrics ("off" to disable).
    #[arg(long, default_value = DEFAULT_AGENT_ADDRESS)]
    pub listen: String,
    /// Log format (json for log collectors). `SOCKLB_LOG` sets the filter (default info).
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Log level inside the eBPF programs (off removes the logging code from the programs).
    #[arg(long, value_enum, default_value_t)]
    pub bpf_log_level: BpfLogLevel,
    /// How often the manifests folder is checked for changes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub poll_ms: u64,
    /// How often service ports whose writes failed are retried, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub retry_ms: u64,
    /// Capacity of the FRONTENDS map.
    #[arg(long, default_value_t = lb_common::capacity::FRONTENDS)]
    pub max_frontends: u32,
    /// Capacity of the SLOTS map.
    #[arg(long, default_value_t = lb_common::capacity::SLOTS)]
    pub max_slots: u32,
    /// Capacity of the BACKENDS map.
    #[arg(long, default_value_t = lb_common::capacity::BACKENDS)]
    pub max_backends: u32,
    /// Capacity of the SERVICE_META map (service ports).
    #[arg(long, default_value_t = lb_common::capacity::SERVICE_META)]
    pub max_services: u32,
    /// Capacity of the AFFINITY map (an LRU: the oldest client is evicted when full).
    #[arg(long, default_value_t = lb_common::capacity::AFFINITY)]
    pub max_affinity: u32,
    /// Capacity of the SOCK_STATE map: live translated sockets whose peer address is reported
    /// as the service's (preallocated, about 100 bytes each).
    #[arg(long, default_value_t = lb_common::capacity::SOCK_STATE)]
    pub max_sockets: u32,
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format);
    let cgroup = match args.cgroup {
        Some(c) => c,
        None => sysfs::cgroup2_mount()
            .context("no cgroup2 mount in /proc/self/mountinfo; pass --cgroup")?,
    };
    let listen = match args.listen.as_str() {
        "off" | "" => None,
        addr => Some(addr.parse().with_context(|| format!("--listen {addr}"))?),
    };
    let source = match args.manifests {
        Some(dir) => SourceConfig::Manifests {
            dir,
            poll: Duration::from_millis(args.poll_ms.max(10)),
        },
        None => SourceConfig::Kubernetes {
            kubeconfig: args.kubeconfig,
        },
    };
    let config = AgentConfig {
        source,
        load: LoadConfig {
            pin_folder: args.pins.pin_folder,
            cgroup,
            capacities: Capacities {
                frontends: args.max_frontends,
                slots: args.max_slots,
                backends: args.max_backends,
                service_meta: args.max_services,
            },
            affinity_capacity: args.max_affinity,
            sock_state_capacity: args.max_sockets,
            log_level: args.bpf_log_level as u8,
        },
        node: args.node.node_info(),
        listen,
        retry_interval: Duration::from_millis(args.retry_ms.max(10)),
    };
    crate::agent::limit_arenas();
    let dataplane = crate::agent::prepare(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(crate::agent::run(config, dataplane))?;
    Ok(ExitCode::SUCCESS)
}
