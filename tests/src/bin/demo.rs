//! `cargo xtask demo`: the seed scenarios, on real sockets, in a sandbox, with the real agent.
//! Each step says what it shows, gives the evidence, and marks each claim PASS or FAIL; the
//! exit status is non-zero if any claim fails. Ctrl-C cleans up too.
use std::{
    path::{Path, PathBuf},
    process::{Command as Process, ExitCode},
    time::Instant,
};

use anyhow::Context as _;
use socklb_tests::{
    Client, Sandbox,
    agent::{AgentOptions, AgentProcess},
    bins,
    client::Command,
    privileges,
    sandbox::teardown_on_signal,
    story::{Story, spread},
};

const WEB: &str = "10.96.0.10:80";
const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";
const C: &str = "10.244.3.47:8080";

fn main() -> ExitCode {
    let interactive = !std::env::args().any(|a| a == "--non-interactive");
    if let Some(reason) = privileges::missing() {
        eprintln!("the demo needs a privileged machine: {reason}");
        return ExitCode::FAILURE;
    }
    let mut story = Story::new(interactive);
    let started = Instant::now();
    let result = run(&mut story);
    // A signal is tearing the sandbox down (and failed the steps as it went): let it finish;
    // its handler ends the process.
    socklb_tests::sandbox::wait_if_interrupted();
    if let Err(e) = &result {
        eprintln!("\ndemo aborted: {e:#}");
    }
    println!("\n(demo ran in {:.1}s)", started.elapsed().as_secs_f64());
    if result.is_ok() && story.summary() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// `socklb ARGS` against the sandbox's pins and manifests; its standard output.
fn socklb(sandbox: &Sandbox, args: &[&str]) -> anyhow::Result<String> {
    let out = Process::new(bins::socklb()?)
        .args(args)
        .arg("--bpffs")
        .arg(sandbox.pin_folder())
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn explain(sandbox: &Sandbox, target: &str) -> anyhow::Result<String> {
    let manifests = sandbox.manifests();
    let manifests = manifests.to_str().context("path")?;
    socklb(sandbox, &["explain", target, "--manifests", manifests])
}

fn count(reply: &socklb_tests::client::Reply, backend: &str) -> usize {
    reply.backends.get(backend).copied().unwrap_or(0)
}

fn run(story: &mut Story) -> anyhow::Result<()> {
    story.step(
        "A node, without a cluster",
        "A client pod in a cgroup of its own, and three backend pods, each in its own network\n\
         namespace on a bridge, each answering with its own address:\n\
         A = 10.244.1.21:8080, B = 10.244.2.34:8080, C = 10.244.3.47:8080.\n\
         Service addresses (10.96.0.0/12) have no route here: only socklb can make them work.",
    );
    teardown_on_signal()?;
    let sandbox = Sandbox::shared()?;
    for backend in [A, B, C] {
        sandbox.add_backend(backend.parse()?, false)?;
    }
    story.show(&format!(
        "sandbox {}: client netns {}, cgroup {}",
        sandbox.id,
        sandbox.client_ns,
        sandbox.cgroup.display()
    ));

    let agent = start(story, &sandbox)?;
    let mut client = sandbox.client()?;
    spread_step(story, &mut client)?;
    let pinned = long_lived(story, &mut client)?;
    terminating(story, &sandbox, &agent, &mut client, pinned)?;
    selector_typo(story, &sandbox, &mut client)?;
    named_port(story, &sandbox, &mut client)?;
    all_terminating(story, &sandbox, &mut client)?;
    affinity(story, &sandbox, &mut client)?;
    outside(story, &sandbox)?;
    summary(story, &sandbox, &agent)?;
    drop(client);
    drop(agent);
    cleanup(story, &sandbox);
    Ok(())
}

fn start(story: &mut Story, sandbox: &Sandbox) -> anyhow::Result<AgentProcess> {
    story.step(
        "socklb agent --manifests examples/seed",
        "Seed 000: the Service default/web is 10.96.0.10:80/TCP with targetPort 8080, and its\n\
         EndpointSlice lists A and B, both ready. The agent loads its programs, attaches them to\n\
         the client's cgroup, and writes the maps.",
    );
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    story.show(&socklb(sandbox, &["inspect", "services"])?);
    story.claim(
        "the agent is ready (/readyz answers 200)",
        agent.get("/readyz")?.0 == 200,
    );
    features(story, &agent)?;
    Ok(agent)
}

/// What this kernel offers: the optional parts on and off (`SOCKLB_DISABLE_FEATURE` turns some
/// off on purpose), why, and what is lost.
fn features(story: &mut Story, agent: &AgentProcess) -> anyhow::Result<()> {
    use socklb::dataplane::features::State;
    let status = agent.status()?;
    for p in &status.features {
        let state = match p.state {
            State::Enabled => "on".to_string(),
            State::Disabled => "off (turned off with --disable-feature)".to_string(),
            State::Refused => format!(
                "off: refused by this kernel ({})",
                p.reason.as_deref().unwrap_or("no reason given")
            ),
        };
        story.show(&format!("optional part {:<18} {state}", p.feature.name()));
    }
    for lost in &status.degraded {
        story.show(&format!("lost: {lost}"));
    }
    story.claim(
        "the programs translation needs loaded; every optional part is reported, and each one \
         that is off says why",
        status.features.len() == socklb::dataplane::features::Feature::ALL.len()
            && status
                .features
                .iter()
                .all(|p| p.state == State::Enabled || p.reason.is_some()),
    );
    Ok(())
}

fn spread_step(story: &mut Story, client: &mut Client) -> anyhow::Result<()> {
    story.step(
        "200 short connections to 10.96.0.10:80",
        "Each connect() is translated to a backend once, in the kernel, before any packet leaves.",
    );
    let r = client.connect(WEB.parse()?, 200)?;
    story.show(&spread(&r.backends));
    story.claim(
        "every connection was answered",
        r.answers() == 200 && r.failures() == 0,
    );
    story.claim(
        "both A and B answered, C (not in the service) never",
        count(&r, A) > 0 && count(&r, B) > 0 && count(&r, C) == 0,
    );
    story.claim(
        "getpeername() reports 10.96.0.10:80, as behind kube-proxy",
        r.peer_names.get(WEB) == Some(&200),
    );
    story.claim(
        "the backends saw the client's own address 10.244.0.2 (no NAT)",
        r.seen_as.keys().all(|a| a.starts_with("10.244.0.2:")),
    );
    Ok(())
}

/// Opens long-lived connections until one lands on A; keeps it as connection 1.
fn long_lived(story: &mut Story, client: &mut Client) -> anyhow::Result<u32> {
    story.step(
        "A long-lived connection to A",
        "Connections are opened until one lands on A; it stays open for the next steps.",
    );
    for id in 1..=40 {
        let r = client.run(&Command::Open {
            id,
            target: WEB.parse()?,
            udp: false,
        })?;
        if r.backends.contains_key(A) {
            story.show(&format!("connection {id}: {}", r.line.unwrap_or_default()));
            story.claim("a connection to 10.96.0.10:80 is established with A", true);
            return Ok(id);
        }
        client.run(&Command::Close { id })?;
    }
    story.claim("a connection to 10.96.0.10:80 is established with A", false);
    anyhow::bail!("no connection reached A in 40 tries")
}

fn terminating(
    story: &mut Story,
    sandbox: &Sandbox,
    agent: &AgentProcess,
    client: &mut Client,
    pinned: u32,
) -> anyhow::Result<()> {
    story.step(
        "The second EndpointSlice snapshot: A is shutting down",
        "Seed 000 after the update: A is ready: false, serving: false, terminating: true; B stays\n\
         ready. New connections may only go to B; what is already connected to A stays there.",
    );
    sandbox.write_manifest(
        "endpointslice.yaml",
        &std::fs::read_to_string(examples().join("scenarios/000-after/endpointslice.yaml"))?,
    )?;
    let start = Instant::now();
    sandbox.wait_candidates(WEB, &[B])?;
    story.show(&format!(
        "maps updated {:.0} ms after the file changed",
        start.elapsed().as_secs_f64() * 1e3
    ));
    let r = client.connect(WEB.parse()?, 100)?;
    story.show(&spread(&r.backends));
    story.claim("100 new connections all reached B", count(&r, B) == 100);
    let e = client.run(&Command::Exchange {
        id: pinned,
        msg: "are you still there?".into(),
    })?;
    story.show(&format!(
        "on the old connection: {}",
        e.line.clone().unwrap_or_else(|| format!("{:?}", e.errors))
    ));
    story.claim(
        "the established connection still exchanges data with A (connections are not migrated)",
        e.ok && e.backends.contains_key(A),
    );
    story.claim(
        "getpeername() on new connections still says 10.96.0.10:80",
        r.peer_names.get(WEB) == Some(&100),
    );
    who_is_connected(story, sandbox, agent, client)?;
    client.run(&Command::Close { id: pinned })?;
    Ok(())
}

/// Two more long-lived connections (they go to B), then who is still connected where.
fn who_is_connected(
    story: &mut Story,
    sandbox: &Sandbox,
    agent: &AgentProcess,
    client: &mut Client,
) -> anyhow::Result<()> {
    use socklb::sockets::view::{Condition, ConnectionsView};
    for id in [101, 102] {
        client.run(&Command::Open {
            id,
            target: WEB.parse()?,
            udp: false,
        })?;
    }
    let listen = agent.listen.to_string();
    let args = [
        "inspect",
        "connections",
        "default/web",
        "--agent",
        &listen,
        "--cgroup",
    ];
    let cgroup = sandbox.cgroup.display().to_string();
    // Established ones: the short connections of the step before may still be closing.
    let count = |v: &ConnectionsView, backend: &str| -> (usize, Option<Condition>) {
        v.services
            .iter()
            .flat_map(|s| &s.backends)
            .find(|b| b.backend.to_string() == backend)
            .map_or((0, None), |b| {
                (
                    b.tcp.get("ESTABLISHED").copied().unwrap_or(0),
                    Some(b.condition),
                )
            })
    };
    // The agent answers from a census at most 2 s old: ask until it shows the new sockets.
    let mut view = ConnectionsView::default();
    for _ in 0..25 {
        let json = socklb(sandbox, &[&args[..], &[&cgroup, "-o", "json"]].concat())?;
        view = serde_json::from_str(&json).unwrap_or_default();
        if count(&view, B).0 >= 2 || !view.missing.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    story.show(&format!(
        "$ socklb inspect connections default/web\n{}",
        socklb(sandbox, &[&args[..], &[&cgroup]].concat())?
    ));
    if let Some(missing) = view.missing.iter().find(|m| m.starts_with("TCP")) {
        story.not_shown(
            "who is still connected to A and B",
            &format!("this kernel's optional parts cannot list TCP sockets: {missing}"),
        );
        return Ok(());
    }
    // With the agent's listing off, inspect lists on its own, with conditions from the maps.
    let (left, kept) = if view.conditions_from_objects {
        (Condition::Terminating, Condition::Ready)
    } else {
        (Condition::NotInSet, Condition::InSet)
    };
    story.claim(
        &format!("the held connection is listed on A, which is {left}"),
        count(&view, A) == (1, Some(left)),
    );
    story.claim(
        &format!("the new long-lived connections are listed on B, which is {kept}"),
        count(&view, B) == (2, Some(kept)),
    );
    for id in [101, 102] {
        client.run(&Command::Close { id })?;
    }
    Ok(())
}

fn selector_typo(story: &mut Story, sandbox: &Sandbox, client: &mut Client) -> anyhow::Result<()> {
    story.step(
        "A selector that matches nothing (seed 003)",
        "default/shop (10.96.0.30:80) selects app: webs instead of app: web. The name still\n\
         resolves, the cluster IP exists, but the EndpointSlice is empty.",
    );
    sandbox.copy_manifests(&examples().join("scenarios/003-selector-typo"))?;
    sandbox.wait_candidates("10.96.0.30:80", &[])?;
    let monitor = Monitor::start(sandbox)?;
    let r = client.connect("10.96.0.30:80".parse()?, 3)?;
    story.show(&format!("connect errors: {:?}", r.errors));
    story.claim(
        "connect() is refused at once (ECONNREFUSED), not left to time out",
        r.errors.get("ECONNREFUSED") == Some(&3),
    );
    let ok = client.connect(WEB.parse()?, 1)?;
    let seen = monitor.finish()?;
    let mut shown = String::from("$ socklb monitor\n");
    for line in &seen {
        shown.push_str(&line.describe());
        shown.push('\n');
    }
    story.show(&shown);
    let refused = seen
        .iter()
        .filter(|l| {
            l.seen.frontend.to_string() == "10.96.0.30:80/TCP"
                && l.seen.decision == socklb::dataplane::events::Decision::NoBackend
                && l.service
                    .as_ref()
                    .is_some_and(|k| k.service.to_string() == "default/shop")
        })
        .count();
    story.claim(
        "socklb monitor shows the 3 refusals of default/shop, for want of an endpoint",
        refused == 3,
    );
    story.claim(
        "and the connect to default/web that followed, with the backend it got",
        ok.answers() == 1
            && seen.iter().any(|l| {
                l.seen.frontend.to_string() == "10.96.0.10:80/TCP"
                    && l.seen.backend.map(|b| b.to_string()).as_deref() == Some(B)
            }),
    );
    let text = explain(sandbox, "default/shop")?;
    story.show(&format!("$ socklb explain default/shop\n{text}"));
    story.claim(
        "socklb explain names the empty endpoint set as the broken link",
        text.contains("verdict: broken at endpoints") && text.contains("app=webs"),
    );
    Ok(())
}

/// `socklb monitor -o json` in the background, from when it has claimed the stream.
struct Monitor {
    child: std::process::Child,
}

impl Monitor {
    fn start(sandbox: &Sandbox) -> anyhow::Result<Self> {
        use std::io::BufRead as _;
        let mut child = Process::new(bins::socklb()?)
            .args([
                "monitor",
                "-o",
                "json",
                "--count",
                "4",
                "--seconds",
                "20",
                "--bpffs",
            ])
            .arg(sandbox.pin_folder())
            .arg("--cgroup")
            .arg(&sandbox.cgroup)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().context("monitor stderr")?;
        let mut first = String::new();
        std::io::BufReader::new(stderr).read_line(&mut first)?;
        anyhow::ensure!(
            first.contains("reading the data path's decisions"),
            "socklb monitor: {first}"
        );
        Ok(Self { child })
    }

    /// Waits for it to end (its four decisions, or its time) and reads what it showed.
    fn finish(self) -> anyhow::Result<Vec<socklb::cli::Shown>> {
        let out = self.child.wait_with_output()?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| match serde_json::from_str(l) {
                Ok(socklb::cli::MonitorLine::Decision(d)) => Some(*d),
                _ => None,
            })
            .collect())
    }
}

fn named_port(story: &mut Story, sandbox: &Sandbox, client: &mut Client) -> anyhow::Result<()> {
    story.step(
        "A named targetPort (seed 004)",
        "reading/notes-api (10.96.0.40:80) has targetPort: http; the pods call 8080 \"http\".\n\
         The EndpointSlice carries the resolved number; socklb reads it per slice.",
    );
    sandbox.copy_manifests(&examples().join("scenarios/004-named-target-port"))?;
    sandbox.wait_candidates("10.96.0.40:80", &[A, B])?;
    story.show(&socklb(sandbox, &["inspect", "lookup", "10.96.0.40:80"])?);
    let r = client.connect("10.96.0.40:80".parse()?, 50)?;
    story.claim(
        "connections to port 80 reach the pods' port 8080",
        r.answers() == 50 && r.backends.keys().all(|b| b.ends_with(":8080")),
    );
    Ok(())
}

fn all_terminating(
    story: &mut Story,
    sandbox: &Sandbox,
    client: &mut Client,
) -> anyhow::Result<()> {
    story.step(
        "Every endpoint terminating (KEP-1669)",
        "default/rollout (10.96.0.50:80): A and B are terminating but still serving, C stopped\n\
         serving. With nothing ready, kube-proxy keeps using the serving ones rather than refusing.",
    );
    sandbox.copy_manifests(&examples().join("scenarios/kep-1669-all-terminating"))?;
    sandbox.wait_candidates("10.96.0.50:80", &[A, B])?;
    let r = client.connect("10.96.0.50:80".parse()?, 60)?;
    story.show(&spread(&r.backends));
    story.claim(
        "connections go to the serving endpoints A and B, never to C",
        r.answers() == 60 && count(&r, C) == 0 && count(&r, A) > 0 && count(&r, B) > 0,
    );
    Ok(())
}

fn affinity(story: &mut Story, sandbox: &Sandbox, client: &mut Client) -> anyhow::Result<()> {
    story.step(
        "Session affinity",
        "default/sticky (10.96.0.60:80) has sessionAffinity: ClientIP over A, B and C: this\n\
         client (its pod) keeps the backend it first got.",
    );
    sandbox.copy_manifests(&examples().join("scenarios/session-affinity"))?;
    sandbox.wait_candidates("10.96.0.60:80", &[A, B, C])?;
    let r = client.connect("10.96.0.60:80".parse()?, 50)?;
    story.show(&spread(&r.backends));
    story.claim(
        "50 connections, one backend",
        r.answers() == 50 && r.backends.len() == 1,
    );
    story.show(&socklb(sandbox, &["inspect", "affinity"])?);
    Ok(())
}

fn outside(story: &mut Story, sandbox: &Sandbox) -> anyhow::Result<()> {
    story.step(
        "A process outside the cgroup",
        "Same network namespace, not in the cgroup: socklb leaves it alone.",
    );
    let r = sandbox.outside_client()?.connect(WEB.parse()?, 1)?;
    story.show(&format!("errors: {:?}", r.errors));
    story.claim(
        "its connect to the service fails with ENETUNREACH: no packet to the virtual IP",
        r.errors.get("ENETUNREACH") == Some(&1),
    );
    Ok(())
}

fn summary(story: &mut Story, sandbox: &Sandbox, agent: &AgentProcess) -> anyhow::Result<()> {
    story.step("What this node's maps hold", "$ socklb inspect services");
    story.show(&socklb(sandbox, &["inspect", "services"])?);
    story.show(&socklb(sandbox, &["inspect", "stats"])?);
    let translations = agent
        .metric("socklb_datapath_translations_total")?
        .unwrap_or(0.0);
    let refused = agent
        .metric("socklb_datapath_no_backend_total")?
        .unwrap_or(0.0);
    story.claim(
        "the kernel counted the translations and the refusals",
        translations >= 460.0 && refused >= 3.0,
    );
    Ok(())
}

fn cleanup(story: &mut Story, sandbox: &Sandbox) {
    story.step(
        "Cleaning up",
        "Processes, programs, pins, cgroup and namespaces are removed.",
    );
    sandbox.teardown();
    let netns = Process::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    story.claim(
        "no namespace, cgroup or pin of the demo is left",
        !netns.contains(&sandbox.id)
            && !sandbox.cgroup.exists()
            && !Path::new(&sandbox.pin_folder()).exists(),
    );
}
