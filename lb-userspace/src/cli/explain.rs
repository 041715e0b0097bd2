//! `socklb explain`: from a Service to this node's maps.
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// NAMESPACE/NAME of the Service, or ADDR:PORT[/tcp|udp] of one of its frontends.
    pub target: String,
}

pub fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("explain {}: not built yet", args.target)
}
