//! `socklb version`: this binary's version and git commit, with `--agent` the running agent's
//! (from its /status), as `kubectl version` shows client and server, and with `--features`
//! what this node's kernel offers: the core and every optional part, tried as the agent would
//! (on throwaway maps; nothing is pinned or attached).
use std::{fmt::Write as _, process::ExitCode, time::Duration};

use serde::{Deserialize, Serialize};

use super::{COMMIT, FeatureArgs, Output, VERSION, agent_status, print_output};
use crate::dataplane::features::{Feature, Probe, State};

#[derive(clap::Args, Debug)]
pub struct VersionArgs {
    /// Also ask the agent serving /status at this address (its metrics address, e.g.
    /// 127.0.0.1:10325) for its version.
    #[arg(long, env = "SOCKLB_AGENT")]
    pub agent: Option<String>,
    /// Also try what this node's kernel offers: the programs translation needs, and each
    /// optional part (needs root, like the agent).
    #[arg(long, env = "SOCKLB_FEATURES")]
    pub features: bool,
    #[command(flatten)]
    pub disable: FeatureArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t, env = "SOCKLB_OUTPUT")]
    pub output: Output,
}

/// What `--features` found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelReport {
    /// The cgroup programs translation needs loaded (`false`: the agent cannot run here).
    pub core: bool,
    /// Why the core did not load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_error: Option<String>,
    /// Each optional part (empty when the core did not load).
    pub features: Vec<Probe>,
    /// The guarantees lost with the parts that are off.
    pub losses: Vec<String>,
    /// How the parts that are on stand in for those that are off.
    pub fallbacks: Vec<String>,
}

/// A build's version and commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    pub version: String,
    pub commit: String,
}

/// What `socklb version` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Versions {
    pub client: Build,
    /// The agent asked with --agent, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentBuild>,
    /// Why the agent asked with --agent did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_error: Option<String>,
    /// With --features: what this node's kernel offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelReport>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentBuild {
    pub address: String,
    #[serde(flatten)]
    pub build: Build,
}

/// Exit status 1 when the agent asked for does not answer, or when the kernel refuses the
/// programs translation needs.
pub(super) fn run(args: &VersionArgs) -> anyhow::Result<ExitCode> {
    let mut versions = Versions {
        client: Build {
            version: VERSION.to_string(),
            commit: COMMIT.to_string(),
        },
        agent: None,
        agent_error: None,
        kernel: args.features.then(|| kernel_report(&args.disable)),
    };
    if let Some(addr) = &args.agent {
        match agent_status(addr, Duration::from_secs(2)) {
            Ok(status) => {
                versions.agent = Some(AgentBuild {
                    address: addr.clone(),
                    build: Build {
                        version: status.version,
                        commit: status.commit,
                    },
                });
            }
            Err(e) => versions.agent_error = Some(format!("{e:#}")),
        }
    }
    print_output(args.output, &versions, || text(&versions))?;
    if let Some(e) = &versions.agent_error {
        eprintln!(
            "error: the agent at {} did not answer: {e}",
            args.agent.as_deref().unwrap_or("?")
        );
        return Ok(ExitCode::from(1));
    }
    if versions.kernel.as_ref().is_some_and(|k| !k.core) {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn kernel_report(disable: &FeatureArgs) -> KernelReport {
    match crate::dataplane::loader::probe_kernel(&disable.disabled()) {
        Ok(features) => KernelReport {
            core: true,
            core_error: None,
            losses: features.losses().into_iter().map(str::to_string).collect(),
            fallbacks: features
                .fallbacks()
                .into_iter()
                .map(str::to_string)
                .collect(),
            features: features.probes,
        },
        Err(e) => KernelReport {
            core: false,
            core_error: Some(format!("{:#}", anyhow::Error::from(e))),
            features: Vec::new(),
            losses: Vec::new(),
            fallbacks: Vec::new(),
        },
    }
}

fn kernel_text(k: &KernelReport) -> String {
    let mut out = String::from("\nKernel:\n");
    match &k.core_error {
        None => out.push_str("  translation (cgroup sock_addr programs): loads\n"),
        Some(e) => {
            let _ = writeln!(
                out,
                "  translation (cgroup sock_addr programs): REFUSED: {e}"
            );
            out.push_str("  socklb cannot run on this node.\n");
            return out;
        }
    }
    let mut t = super::table::Table::new(["OPTIONAL PART", "STATE", "NEEDS", "WHY OFF"]);
    for p in &k.features {
        let state = match p.state {
            State::Enabled => "on".to_string(),
            State::Disabled => "off (flag)".to_string(),
            State::Refused => match p.errno {
                Some(errno) => format!("REFUSED ({})", std::io::Error::from_raw_os_error(errno)),
                None => "REFUSED".to_string(),
            },
        };
        t.row(vec![
            p.feature.to_string(),
            state,
            Feature::needs(p.feature).to_string(),
            p.reason.clone().unwrap_or_default(),
        ]);
    }
    for line in t.render().lines() {
        let _ = writeln!(out, "  {line}");
    }
    for f in &k.fallbacks {
        let _ = writeln!(out, "  fallback: {f}");
    }
    if k.losses.is_empty() {
        out.push_str("  nothing is lost.\n");
    }
    for l in &k.losses {
        let _ = writeln!(out, "  lost: {l}");
    }
    out
}

fn text(v: &Versions) -> String {
    let mut out = format!(
        "Client: socklb {} (commit {})\n",
        v.client.version, v.client.commit
    );
    if let Some(a) = &v.agent {
        let _ = writeln!(
            out,
            "Agent:  socklb {} (commit {}) at {}",
            a.build.version, a.build.commit, a.address
        );
        if a.build != v.client {
            out.push_str("        (the agent runs another build than this client)\n");
        }
    }
    if let Some(k) = &v.kernel {
        out.push_str(&kernel_text(k));
    }
    out
}
