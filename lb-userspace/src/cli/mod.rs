//! The `socklb` command line: a thin layer over the library, one file per subcommand.
mod agent;
mod completion;
mod explain;
mod inspect;
mod manpages;
mod monitor;
pub mod reference;
mod reset;
mod table;
mod version;

pub use inspect::{AffinityRow, Lookup, MapStats, SocketRow, Stats};
pub use manpages::pages as manual_pages;
pub use monitor::{MonitorLine, Shown};
pub use reset::Reset;
pub use version::{KernelReport, Versions};

use std::{net::IpAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use crate::{
    status::Status,
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
};

pub const DEFAULT_PIN_FOLDER: &str = "/sys/fs/bpf/socklb";
/// Where the agent serves /healthz, /livez and /readyz. kube-proxy uses 10249 and 10256,
/// Cilium 9879 and 9962-9965, Calico 9099 and 9091, the kubelet 10248, 10250 and 10255.
pub const DEFAULT_HEALTH_ADDRESS: &str = "127.0.0.1:10324";
/// Where the agent serves /metrics and /status, and where explain asks it.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:10325";
pub use crate::status::{COMMIT, VERSION};

#[derive(Parser, Debug)]
#[command(
    name = "socklb",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SOCKLB_GIT_COMMIT"), ")"),
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
    /// Show the data path's decisions as they happen: who connected to which Service, the
    /// backend chosen or the refusal and why.
    #[command(
        long_about = "Show the data path's decisions as they happen, one line each: the \
        client (its cgroup, the pod UID in its path), the Service and the address it dialled, \
        the backend chosen (afresh, by session affinity, or kept by an unconnected UDP \
        socket), or the refusal and its reason (no endpoint, no endpoint on this node, the \
        pod's bound on socket records). The programs write decisions only while a monitor \
        runs (it renews its claim every second); decisions dropped because the stream's \
        buffer was full are counted and said."
    )]
    Monitor(monitor::MonitorArgs),
    /// Detach the programs and remove every pin: services stop being translated.
    Reset(reset::ResetArgs),
    /// Print the version and git commit of this binary (and of a running agent, with --agent).
    Version(version::VersionArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(long_about = "Print a shell completion script.\n\n\
        bash:  source <(socklb completion bash)    (or save it in /etc/bash_completion.d/socklb)\n\
        zsh:   socklb completion zsh > \"${fpath[1]}/_socklb\"\n\
        fish:  socklb completion fish > ~/.config/fish/completions/socklb.fish")]
    Completion(completion::CompletionArgs),
    /// Write a manual page for socklb and for each subcommand into a folder (section 1).
    #[command(
        long_about = "Write a manual page for socklb and for each subcommand into a \
        folder (section 1: socklb.1, socklb-agent.1, ...), from the command line's own \
        definition. The container image installs them in /usr/local/share/man/man1.\n\n\
        socklb manpages /usr/local/share/man/man1 && man socklb-agent"
    )]
    Manpages(manpages::ManpagesArgs),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Prints a value as JSON or YAML (the library's own serialisable types), or as the table
/// `text` renders.
pub fn print_output<T: serde::Serialize>(
    output: Output,
    value: &T,
    text: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(value)?),
        Output::Table => print!("{}", text()),
    }
    Ok(())
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

/// Optional parts of the data path to leave off, shared by `agent` and `version --features`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FeatureArgs {
    /// An optional part of the data path not to load: sockets-iterator, udp-iterator,
    /// sock-diag-storage, socket-destroy, socket-release, cookie-proof, or all (repeatable or
    /// comma-separated). What the
    /// kernel would refuse anyway, on purpose: to test a node's degraded mode.
    #[arg(
        long = "disable-feature",
        value_delimiter = ',',
        value_parser = parse_disable,
        env = "SOCKLB_DISABLE_FEATURE"
    )]
    pub disable_feature: Vec<Disable>,
}

/// One `--disable-feature` value: a part, or every part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disable {
    All,
    One(crate::dataplane::features::Feature),
}

fn parse_disable(value: &str) -> Result<Disable, String> {
    use clap::ValueEnum as _;
    if value == "all" {
        return Ok(Disable::All);
    }
    crate::dataplane::features::Feature::from_str(value, false)
        .map(Disable::One)
        .map_err(|_| {
            let names: Vec<&str> = crate::dataplane::features::Feature::ALL
                .iter()
                .map(|f| f.name())
                .collect();
            format!(
                "{value}: not an optional part (one of {}, or all)",
                names.join(", ")
            )
        })
}

impl FeatureArgs {
    pub fn disabled(&self) -> std::collections::BTreeSet<crate::dataplane::features::Feature> {
        let named: Vec<_> = self
            .disable_feature
            .iter()
            .filter_map(|d| match d {
                Disable::One(f) => Some(*f),
                Disable::All => None,
            })
            .collect();
        crate::dataplane::features::disabled_set(
            &named,
            self.disable_feature.contains(&Disable::All),
        )
    }
}

/// Whether `spec.externalIPs` are served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ExternalIps {
    #[default]
    Allow,
    /// Never serve them (as the `DenyServiceExternalIPs` admission plugin refuses them).
    Ignore,
}

/// Who this node is, as the agent and explain both need it. Flags given win over the Node
/// object; see `NodeInfo::resolve`.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name, for internalTrafficPolicy Local and topology hints.
    #[arg(long, env = "SOCKLB_NODE_NAME")]
    pub node_name: Option<String>,
    /// This node's zone (default: the Node's topology.kubernetes.io/zone label).
    #[arg(long, env = "SOCKLB_ZONE")]
    pub zone: Option<String>,
    /// An address of this node on which NodePorts are served (repeatable): overrides
    /// --nodeport-addresses. Never 127.0.0.1.
    #[arg(
        long = "node-address",
        env = "SOCKLB_NODE_ADDRESSES",
        value_delimiter = ','
    )]
    pub node_addresses: Vec<IpAddr>,
    /// kube-proxy's --nodeport-addresses: "primary" (the Node's first `InternalIP` of each
    /// family, else its first `ExternalIP`; kube-proxy's nftables mode default), or CIDRs whose
    /// addresses on this node's interfaces serve NodePorts (`0.0.0.0/0,::/0`: every one, as
    /// iptables mode without the flag). Never loopback.
    #[arg(
        long = "nodeport-addresses",
        env = "SOCKLB_NODEPORT_ADDRESSES",
        value_delimiter = ',',
        default_value = "primary"
    )]
    pub nodeport_addresses: Vec<String>,
    /// Follow this Kubernetes version's kube-proxy topology rules (1.30: zone hints only with
    /// the topology annotation; 1.31-1.33: zone hints; 1.34+: node hints too). Default: the
    /// API server's version; with --manifests, the newest rules (1.35).
    #[arg(long, env = "SOCKLB_KUBERNETES_VERSION")]
    pub kubernetes_version: Option<String>,
    /// Serve only Services without a service-proxy-name label, or labelled with this name.
    #[arg(long, default_value = DEFAULT_PROXY_NAME, env = "SOCKLB_PROXY_NAME")]
    pub proxy_name: String,
    /// Serve spec.externalIPs, or ignore them everywhere.
    #[arg(long, value_enum, default_value_t, env = "SOCKLB_EXTERNAL_IPS")]
    pub external_ips: ExternalIps,
}

impl NodeArgs {
    pub fn flags(&self) -> anyhow::Result<NodeFlags> {
        Ok(NodeFlags {
            name: self
                .node_name
                .clone()
                .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty())),
            zone: self.zone.clone(),
            addresses: self.node_addresses.clone(),
            nodeport_addresses: crate::translate::NodePortAddresses::parse(
                &self.nodeport_addresses,
            )
            .map_err(|e| anyhow::anyhow!("--nodeport-addresses: {e}"))?,
            proxy_name: self.proxy_name.clone(),
            external_ips: self.external_ips == ExternalIps::Allow,
            kube_version: match &self.kubernetes_version {
                Some(v) => crate::translate::KubeVersion::parse(v).ok_or_else(|| {
                    anyhow::anyhow!("--kubernetes-version {v}: not a version like 1.33")
                })?,
                None => crate::translate::KubeVersion::NEWEST,
            },
        })
    }
}

/// Sets up logging to stderr: colour only on a terminal, JSON with the event's fields at the
/// top level for collectors. `SOCKLB_LOG` (an env-filter) overrides `level`.
pub fn init_logging(format: LogFormat, level: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOCKLB_LOG")
        // The programs' own records are already filtered by --bpf-log-level at load time.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},lb_ebpf=trace")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Runs the command line; returns the process exit code.
pub fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent(args) => agent::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Reset(args) => reset::run(&args),
        Command::Version(args) => version::run(&args),
        Command::Completion(args) => Ok(completion::run(&args)),
        Command::Manpages(args) => manpages::run(&args),
        Command::Monitor(args) => monitor::run(&args),
    }
}

/// An HTTP GET on the agent's metrics address (`HOST:PORT`, `http://` allowed): the status
/// code and the body.
pub fn agent_get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    use std::{
        io::{Read as _, Write as _},
        net::ToSocketAddrs as _,
    };
    let host = addr.trim_start_matches("http://").trim_end_matches('/');
    let target = host
        .to_socket_addrs()
        .with_context(|| format!("{addr}: not HOST:PORT"))?
        .next()
        .with_context(|| format!("{addr}: no address"))?;
    let mut s = std::net::TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("connecting to {target}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut response = Vec::new();
    s.read_to_end(&mut response)
        .with_context(|| format!("reading the answer from {target}"))?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("{target} did not answer HTTP"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{target} did not answer HTTP"))?;
    Ok((code, body.to_string()))
}

/// The agent's /status.
pub fn agent_status(addr: &str, timeout: Duration) -> anyhow::Result<Status> {
    let (code, body) = agent_get(addr, "/status", timeout)?;
    anyhow::ensure!(code == 200, "GET /status on {addr}: HTTP {code}");
    serde_json::from_str(&body)
        .with_context(|| format!("GET /status on {addr}: not socklb's status"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every flag of every subcommand can come from a `SOCKLB_*` variable (so a `ConfigMap`
    /// can feed it); positional arguments, --help and --version excepted.
    #[test]
    fn every_flag_has_an_environment_variable() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || id == "help" || id == "version" {
                    continue;
                }
                match arg.get_env().and_then(|e| e.to_str()) {
                    Some(env) if env.starts_with("SOCKLB_") => {}
                    other => missing.push(format!("{path} --{id}: {other:?}")),
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "socklb", &mut missing);
        assert!(
            missing.is_empty(),
            "flags without SOCKLB_* env: {missing:#?}"
        );
    }
}
