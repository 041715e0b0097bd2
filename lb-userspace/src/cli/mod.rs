//! The `socklb` command line: a thin layer over the library, one file per subcommand.
mod agent;
mod explain;
mod inspect;
mod reset;
mod table;

use std::{net::IpAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

use crate::translate::{DEFAULT_PROXY_NAME, NodeInfo};

pub const DEFAULT_PIN_FOLDER: &str = "/sys/fs/bpf/socklb";
/// Where the agent serves /healthz, /readyz, /status and /metrics, and where explain asks it.
pub const DEFAULT_AGENT_ADDRESS: &str = "127.0.0.1:10256";

#[derive(Parser, Debug)]
#[command(
    name = "socklb",
    version,
    about = "Socket-level load balancing for Kubernetes Services",
    long_about = "socklb translates a Service's ClusterIP:port to one of its endpoints when a socket \
                  connects (cgroup sock_addr hooks), so no packet is ever translated."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Load and attach the programs, then keep the maps in step with the cluster (or manifests).
    Agent(agent::AgentArgs),
    /// Show what the pinned maps hold (read-only; works with or without a running agent).
    Inspect(inspect::InspectArgs),
    /// Walk a Service from object to maps and name the first broken link.
    Explain(explain::ExplainArgs),
    /// Detach the programs and remove every pin: services stop being translated.
    Reset(reset::ResetArgs),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The pin folder argument shared by every subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct PinArgs {
    /// Folder on a bpf filesystem holding socklb's pinned maps and links.
    #[arg(long = "bpffs", default_value = DEFAULT_PIN_FOLDER, env = "SOCKLB_BPFFS", global = true)]
    pub pin_folder: PathBuf,
}

/// Who this node is, as the agent and explain both need it.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name, for traffic policy Local and topology hints.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// This node's zone (default: the Node's topology.kubernetes.io/zone label).
    #[arg(long)]
    pub zone: Option<String>,
    /// An address of this node on which NodePorts are served (repeatable; default: the Node's
    /// InternalIP/ExternalIP addresses).
    #[arg(long = "node-address")]
    pub node_addresses: Vec<IpAddr>,
    /// Serve only Services without a service-proxy-name label, or labelled with this name.
    #[arg(long, default_value = DEFAULT_PROXY_NAME)]
    pub proxy_name: String,
}

impl NodeArgs {
    pub fn node_info(&self) -> NodeInfo {
        NodeInfo {
            name: self.node_name.clone(),
            zone: self.zone.clone(),
            addresses: self.node_addresses.clone(),
            proxy_name: self.proxy_name.clone(),
        }
    }
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOCKLB_LOG")
        // The programs' own records are already filtered by --bpf-log-level at load time.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,lb_ebpf=trace"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Runs the command line; returns the process exit code.
pub fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent(args) => agent::run(args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Reset(args) => reset::run(&args),
    }
}
