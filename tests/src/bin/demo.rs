//! `cargo xtask demo`: the seed scenarios, on real sockets, in a sandbox, with the real agent.
use std::{path::PathBuf, process::ExitCode};

use socklb_tests::{
    Sandbox,
    agent::AgentOptions,
    privileges,
    story::{Story, spread},
};

const VIP: &str = "10.96.0.10:80";
const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";

fn main() -> ExitCode {
    let interactive = !std::env::args().any(|a| a == "--non-interactive");
    if let Some(reason) = privileges::missing() {
        eprintln!("the demo needs a privileged machine: {reason}");
        return ExitCode::FAILURE;
    }
    let mut story = Story::new(interactive);
    match run(&mut story) {
        Ok(()) if story.summary() => ExitCode::SUCCESS,
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo aborted: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/seed")
}

fn run(story: &mut Story) -> anyhow::Result<()> {
    story.step(
        "A sandbox",
        "A client network namespace inside a cgroup of its own, and two backend pods\n\
         answering with their own address: A = 10.244.1.21:8080, B = 10.244.2.34:8080.",
    );
    let sandbox = Sandbox::new()?;
    sandbox.add_backend(A.parse()?, false)?;
    sandbox.add_backend(B.parse()?, false)?;
    sandbox.copy_manifests(&examples())?;
    story.show(&format!(
        "client netns {}, cgroup {}",
        sandbox.client_ns,
        sandbox.cgroup.display()
    ));

    story.step(
        "socklb agent --manifests examples/seed",
        "The Service default/web is 10.96.0.10:80/TCP with targetPort 8080; its EndpointSlice\n\
         lists A and B, both ready.",
    );
    let _agent = sandbox.start_agent(&AgentOptions::default())?;
    story.show("agent ready: programs attached to the sandbox cgroup, maps written");

    story.step(
        "100 short connections to 10.96.0.10:80",
        "Each connect() is translated to a backend once, in the kernel, before any packet is sent.",
    );
    let mut client = sandbox.client()?;
    let reply = client.connect(VIP.parse()?, 100)?;
    story.show(&spread(&reply.backends));
    story.claim(
        "every connection was answered",
        reply.answers() == 100 && reply.failures() == 0,
    );
    story.claim(
        "both backends answered",
        reply.backends.get(A).copied().unwrap_or(0) > 0
            && reply.backends.get(B).copied().unwrap_or(0) > 0,
    );
    story.claim(
        "getpeername() still reports the service address 10.96.0.10:80",
        reply.peer_names.get(VIP) == Some(&100),
    );

    story.step(
        "A process outside the cgroup",
        "Same network namespace, not in the cgroup: socklb leaves it alone.",
    );
    let mut outside = sandbox.outside_client()?;
    let reply = outside.connect(VIP.parse()?, 1)?;
    story.show(&format!("errors: {:?}", reply.errors));
    story.claim(
        "its connect to the virtual IP fails with ENETUNREACH (no packet leaves)",
        reply.errors.get("ENETUNREACH") == Some(&1),
    );
    Ok(())
}
