//! What an operator sees of a running agent: /metrics as Prometheus lints and scrapes it (text
//! format by default, `OpenMetrics` when asked), listeners that idle or slow clients cannot
//! block, and the command line's `version` and `completion`.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use socklb_tests::{Sandbox, agent::AgentOptions, bins};

/// What Prometheus sends when it scrapes.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

use socklb_tests::examples;

/// A GET with the given `Accept`: (status, headers in lower case, body).
fn get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> anyhow::Result<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let accept = accept.map_or_else(String::new, |a| format!("Accept: {a}\r\n"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: socklb\r\n{accept}\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no HTTP head")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    Ok((code, head.to_ascii_lowercase(), body.to_string()))
}

fn promtool() -> Option<&'static str> {
    let found = ["/usr/local/bin/promtool", "promtool"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is not installed (cargo xtask setup installs it)"
        );
        eprintln!("skipping the promtool checks: promtool is not installed");
    }
    found
}

/// `promtool check metrics` with the exposition on stdin.
fn promtool_check(promtool: &str, exposition: &str) -> anyhow::Result<Output> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(exposition.as_bytes())?;
    Ok(child.wait_with_output()?)
}

/// Prometheus' `OpenMetrics` parser, through promtool's backfill (which wants a timestamp on
/// every sample: one is added).
fn promtool_openmetrics(promtool: &str, exposition: &str, dir: &Path) -> anyhow::Result<Output> {
    let stamped: String = exposition
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} 1700000000\n")
            }
        })
        .collect();
    let input = dir.join("openmetrics.txt");
    std::fs::write(&input, stamped)?;
    Ok(Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&input)
        .arg(dir.join("blocks"))
        .output()?)
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        (key == series).then(|| value.parse().ok()).flatten()
    })
}

fn socklb(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Output> {
    let mut cmd = Command::new(bins::socklb()?);
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Ok(cmd.output()?)
}

/// The process, sync and map metrics of a running agent's text exposition.
fn process_sync_and_map_metrics(text: &str) -> anyhow::Result<()> {
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(value(text, process).is_some(), "no {process}");
    }
    let rss = value(text, "process_resident_memory_bytes").unwrap_or(0.0);
    assert!(rss > 1e6 && rss < 1e9, "resident memory {rss}");
    let started = value(text, "process_start_time_seconds").unwrap_or(0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    assert!(
        started <= now && now - started < 120.0,
        "started {started}, now {now}"
    );
    assert!(value(text, "socklb_sync_duration_seconds_count") >= Some(1.0));
    assert!(
        value(text, "socklb_last_sync_timestamp_seconds").is_some_and(|t| (now - t).abs() < 120.0)
    );
    // Every map the agent can size without walking it, as one entries/capacity pair (not the
    // socket storage, and not the EVENTS ring buffer, which has bytes, not entries: its drops
    // are socklb_datapath_events_dropped_total).
    for map in lb_common::MAPS
        .iter()
        .filter(|m| ![lb_common::MapId::Sockets, lb_common::MapId::Events].contains(&m.id))
    {
        let entries = value(text, &format!("socklb_map_entries{{map=\"{}\"}}", map.name));
        let capacity = value(
            text,
            &format!("socklb_map_capacity{{map=\"{}\"}}", map.name),
        );
        assert!(capacity.is_some(), "no capacity for {}", map.name);
        // AFFINITY's client tables are counted at start, then every 30 s.
        assert!(entries.is_some(), "no entries for {}", map.name);
    }
    assert_eq!(
        value(
            text,
            &format!(
                "socklb_map_entries{{map=\"{}\"}}",
                lb_common::MapId::Frontends4.name()
            )
        ),
        Some(1.0)
    );
    Ok(())
}

#[test]
fn metrics_pass_promtool_and_speak_openmetrics_when_asked() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let mut client = sandbox.client()?;
    assert_eq!(client.connect("10.96.0.10:80".parse()?, 10)?.answers(), 10);

    // The text format by default.
    let (code, head, text) = get(agent.listen, "/metrics", None)?;
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(!text.contains("# EOF"));
    if let Some(promtool) = promtool() {
        let out = promtool_check(promtool, &text)?;
        assert!(
            out.status.success() && said(&out).trim().is_empty(),
            "promtool check metrics: {}\n---\n{text}",
            said(&out)
        );
    }
    assert!(text.contains("# HELP socklb_datapath_translations_total "));
    assert!(text.contains("# TYPE socklb_datapath_translations_total counter\n"));
    assert_eq!(
        value(&text, "socklb_datapath_translations_total"),
        Some(10.0)
    );
    // The binary's own build (the test may have been compiled from another commit).
    let out = socklb(&["version", "-o", "json"], &[])?;
    let client: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let (version, commit) = (&client["client"]["version"], &client["client"]["commit"]);
    let build = format!("socklb_build_info{{version={version},commit={commit}}}");
    assert_eq!(value(&text, &build), Some(1.0), "{text}");
    process_sync_and_map_metrics(&text)?;

    // OpenMetrics when the scraper asks for it, as Prometheus does.
    let (code, head, om) = get(agent.listen, "/metrics", Some(PROMETHEUS_ACCEPT))?;
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE socklb_datapath_translations counter\n"));
    assert!(om.contains("socklb_datapath_translations_total 10\n"));
    assert!(om.contains("# TYPE socklb_build info\n"));
    if let Some(promtool) = promtool() {
        let out = promtool_openmetrics(promtool, &om, &sandbox.workdir)?;
        assert!(
            out.status.success(),
            "OpenMetrics parser: {}\n---\n{om}",
            said(&out)
        );
    }
    // A scraper that asks for the text format gets it.
    let (_, head, _) = get(agent.listen, "/metrics", Some("text/plain;version=0.0.4"))?;
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );

    // `socklb version --agent` reads the agent's build from /status.
    let out = socklb(
        &[
            "version",
            "--agent",
            &agent.listen.to_string(),
            "-o",
            "json",
        ],
        &[],
    )?;
    assert!(out.status.success(), "{}", said(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(&v["agent"]["version"], version);
    assert_eq!(&v["agent"]["commit"], commit);
    let out = socklb(&["version"], &[("SOCKLB_AGENT", &agent.listen.to_string())])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("Agent:  socklb"),
        "{text}"
    );
    Ok(())
}

/// Whether the server closed `s` (a read returns end of file or a reset).
fn closed(s: &mut TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0_u8; 512];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn idle_and_slow_clients_cannot_block_readyz_or_metrics() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    // 64 connections on each listener that never finish a request: half send nothing, half
    // the start of a request (a slowloris).
    let mut idle = Vec::new();
    for addr in [agent.listen, agent.health] {
        for i in 0..64 {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            if i % 2 == 1 {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: socklb\r\n")?;
            }
            idle.push((addr, s));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut slowest = Duration::ZERO;
    for path in [
        "/readyz", "/livez", "/metrics", "/status", "/readyz", "/metrics",
    ] {
        let start = Instant::now();
        let (code, _) = agent.get(path)?;
        assert_eq!(code, 200, "{path}");
        // Under 3 s: a request that waited for a place would wait for the 5-s header timeout
        // to close an idle connection; the rest is margin for a loaded machine.
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{path} took {:?} beside 64 idle connections",
            start.elapsed()
        );
        slowest = slowest.max(start.elapsed());
    }
    // The connection limit: at most 32 of each listener's stay open.
    for addr in [agent.listen, agent.health] {
        let open = idle
            .iter_mut()
            .filter(|(a, _)| *a == addr)
            .filter(|(_, s)| !closed(&mut s.try_clone().expect("clone")))
            .count();
        assert!(open <= 32, "{open} idle connections open on {addr}");
    }
    // The header timeout (5 s) closes the rest.
    let waiting = Instant::now();
    let deadline = waiting + Duration::from_secs(9);
    loop {
        let open = idle
            .iter_mut()
            .filter(|(_, s)| !closed(&mut s.try_clone().expect("clone")))
            .count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle connections still open after the header timeout"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(agent.get("/readyz")?.0, 200);
    println!(
        "FIGURE /metrics beside 64 idle and half-sent connections per listener: slowest answer {} ms; at most 32 kept open per listener; the rest closed {:.1} s later",
        slowest.as_millis(),
        waiting.elapsed().as_secs_f64()
    );
    Ok(())
}

#[test]
fn version_and_completion_as_kubectl_users_expect() -> anyhow::Result<()> {
    let version = socklb::cli::VERSION;
    let out = socklb(&["--version"], &[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.starts_with(&format!("socklb {version}")),
        "{text}"
    );

    let out = socklb(&["version"], &[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        text.starts_with(&format!("Client: socklb {version} (commit ")),
        "{text}"
    );
    let out = socklb(&["version", "-o", "json"], &[])?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["client"]["version"], version);
    assert!(v.get("agent").is_none());
    // Every flag also from the environment.
    let out = socklb(&["version"], &[("SOCKLB_OUTPUT", "yaml")])?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("client:") && text.contains(version),
        "{text}"
    );
    // An agent that does not answer: the client's version, the reason, exit status 1.
    let out = socklb(&["version", "--agent", "127.0.0.1:1", "-o", "json"], &[])?;
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["client"]["version"], version);
    assert!(v["agent_error"].is_string(), "{v}");

    for shell in ["bash", "zsh", "fish"] {
        let out = socklb(&["completion", shell], &[])?;
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}: {}", said(&out));
        for word in ["inspect", "explain", "reset", "version", "bpffs"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = socklb(&["completion", "tcsh"], &[])?;
    assert!(!out.status.success());

    // reset speaks JSON and YAML too (nothing pinned here: exit 0).
    let nowhere = std::env::temp_dir().join(format!("socklb-no-pins-{}", std::process::id()));
    let out = socklb(
        &[
            "reset",
            "--bpffs",
            &nowhere.display().to_string(),
            "-o",
            "json",
        ],
        &[],
    )?;
    assert!(out.status.success(), "{}", said(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["pinned"], false);
    Ok(())
}
