//! `socklb version`: this binary's version and git commit, and with `--agent` the running
//! agent's (from its /status), as `kubectl version` shows client and server.
use std::{fmt::Write as _, process::ExitCode, time::Duration};

use serde::{Deserialize, Serialize};

use super::{COMMIT, Output, VERSION, agent_status, print_output};

#[derive(clap::Args, Debug)]
pub struct VersionArgs {
    /// Also ask the agent serving /status at this address (its metrics address, e.g.
    /// 127.0.0.1:10325) for its version.
    #[arg(long, env = "SOCKLB_AGENT")]
    pub agent: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t, env = "SOCKLB_OUTPUT")]
    pub output: Output,
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
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentBuild {
    pub address: String,
    #[serde(flatten)]
    pub build: Build,
}

/// Exit status 1 when the agent asked for does not answer.
pub fn run(args: &VersionArgs) -> anyhow::Result<ExitCode> {
    let mut versions = Versions {
        client: Build {
            version: VERSION.to_string(),
            commit: COMMIT.to_string(),
        },
        agent: None,
        agent_error: None,
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
    Ok(match &versions.agent_error {
        Some(e) => {
            eprintln!(
                "error: the agent at {} did not answer: {e}",
                args.agent.as_deref().unwrap_or("?")
            );
            ExitCode::from(1)
        }
        None => ExitCode::SUCCESS,
    })
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
    out
}
