//! The monitoring kit in deploy/monitoring: its rules pass `promtool check rules` and their unit
//! tests (`check.py`), every `PromQL` expression of the rules and the dashboard parses, and every
//! metric they name is one a running agent exports.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    process::Output,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use promql_parser::{
    parser::{self, Expr},
    util::{ExprVisitor, walk_expr},
};
use serde_json::Value;
use socklb_tests::{
    Sandbox,
    agent::{AgentOptions, AgentProcess, http_get},
    client::Command,
    manifests::{Ep, service, slice},
};

/// `one`, the Service the privileged test holds a connection to.
const ONE_VIP: &str = "10.96.0.20";

/// Series the rules or the dashboard may name that the agent does not export, and why.
const NOT_THE_AGENTS: [(&str, &str); 1] = [(
    "up",
    "Prometheus' own series per target: whether its last scrape worked (SocklbAgentDown, \
     SocklbAgentAbsent, the dashboard's agent count)",
)];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn monitoring() -> PathBuf {
    workspace().join("deploy/monitoring")
}

fn promtool() -> Option<&'static str> {
    let found = ["/usr/local/bin/promtool", "promtool"]
        .into_iter()
        .find(|p| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok()
        });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is not installed (cargo xtask setup installs it)"
        );
        eprintln!("skipping the promtool checks: promtool is not installed");
    }
    found
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A Grafana expression with its variables replaced by values `PromQL` parses: the interval
/// variables by durations, every other variable (`$node`, `${job}`, `${node:regex}`) by `x`
/// (they stand inside label matchers' quotes).
fn grafana_to_promql(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').unwrap_or(braced.len());
            let name = braced[..end].split(':').next().unwrap_or_default();
            // `{`, the name (and format), `}`.
            (name, end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(match name {
            "__rate_interval" | "__interval" => "5m",
            "__range" => "1h",
            _ => "x",
        });
        rest = &after[len.min(after.len())..];
    }
    out.push_str(rest);
    out
}

/// Collects the metric name of every selector (instant and range) of an expression.
#[derive(Default)]
struct Names {
    names: BTreeSet<String>,
    unnamed: usize,
}

impl ExprVisitor for Names {
    type Error = anyhow::Error;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        let selector = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        if let Some(vs) = selector {
            match &vs.name {
                Some(name) => {
                    self.names.insert(name.clone());
                }
                None => self.unnamed += 1,
            }
        }
        Ok(true)
    }
}

/// The metrics an expression names (every selector must name one: `{__name__=~...}` would
/// escape this check).
fn metric_names(expr: &str) -> anyhow::Result<BTreeSet<String>> {
    let ast = parser::parse(expr).map_err(|e| anyhow::anyhow!("{expr}: {e:?}"))?;
    let mut names = Names::default();
    walk_expr(&mut names, &ast)?;
    anyhow::ensure!(
        names.unnamed == 0,
        "{expr}: a selector without a metric name"
    );
    Ok(names.names)
}

/// Every `PromQL` expression of rules.yaml and dashboard.json, with where it is.
fn expressions() -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let rules_text = std::fs::read_to_string(monitoring().join("rules.yaml"))?;
    let rules: Value = serde_saphyr::from_str(&rules_text)?;
    for group in rules["groups"]
        .as_array()
        .context("rules.yaml: no groups")?
    {
        for rule in group["rules"].as_array().context("rules.yaml: no rules")? {
            let name = rule["alert"]
                .as_str()
                .or_else(|| rule["record"].as_str())
                .context("rules.yaml: a rule without a name")?;
            let expr = rule["expr"].as_str().context("rules.yaml: no expr")?;
            out.push((format!("rules.yaml {name}"), expr.to_string()));
        }
    }
    let dashboard_text = std::fs::read_to_string(monitoring().join("dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&dashboard_text)?;
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .context("dashboard.json: no panels")?
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let title = panel["title"].as_str().unwrap_or("?");
                out.push((
                    format!("dashboard.json \"{title}\""),
                    grafana_to_promql(expr),
                ));
            }
        }
    }
    Ok(out)
}

/// The series names an exposition (Prometheus text format or `OpenMetrics`) offers: each
/// family's name from its `# TYPE` line with the series names its type derives from it (a
/// histogram's `_bucket`, `_sum`, `_count`; a counter's `_total`), and every sample's name.
/// A family with no series yet (no error counted, no live socket) is left out whole, `# TYPE`
/// line included: the privileged test below makes both appear.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            names.insert(name.to_string());
            let derived: &[&str] = match kind {
                "counter" if !name.ends_with("_total") => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                "info" => &["_info"],
                _ => &[],
            };
            names.extend(derived.iter().map(|suffix| format!("{name}{suffix}")));
        } else if !line.starts_with('#')
            && let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty())
        {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn metric_names_are_found_in_every_part_of_an_expression() -> anyhow::Result<()> {
    // Both sides of binary operators, function and aggregation arguments, range selectors and
    // subqueries (older promql-parser walkers skipped a binary operator's right-hand side).
    let names = metric_names(
        "sum by (le) (rate(a_total{job=\"x\"}[5m])) / b + histogram_quantile(0.9, c_bucket) \
         and d or max_over_time(e[10m:1m]) unless absent(f)",
    )?;
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        ["a_total", "b", "c_bucket", "d", "e", "f"]
    );
    assert_eq!(
        grafana_to_promql("rate(x{job=\"$job\", node=~\"${node:regex}\"}[$__rate_interval])"),
        "rate(x{job=\"x\", node=~\"x\"}[5m])"
    );
    Ok(())
}

#[test]
fn monitoring_rules_pass_promtool_and_their_unit_tests() -> anyhow::Result<()> {
    let Some(promtool) = promtool() else {
        return Ok(());
    };
    let out = std::process::Command::new("python3")
        .arg(monitoring().join("check.py"))
        .env("PROMTOOL", promtool)
        .current_dir(workspace())
        .output()
        .context("running python3 deploy/monitoring/check.py")?;
    assert!(
        out.status.success(),
        "deploy/monitoring/check.py failed:\n{}",
        said(&out)
    );
    Ok(())
}

/// Whether the exposition says this optional part is on.
fn feature_on(exposition: &str, feature: &str) -> bool {
    let series = format!("socklb_feature_enabled{{feature=\"{feature}\"}} 1");
    exposition.lines().any(|l| l == series)
}

/// The agent's /metrics once it shows an error counted and a live socket (or, when this kernel
/// lets the agent list no TCP socket, once the error is there): families with no series yet
/// are left out of the exposition whole, `# TYPE` line included.
/// Read where Prometheus reads it: the `--prometheus-listen` address, `scrape`.
fn exposition_with_every_family(
    agent: &AgentProcess,
    scrape: SocketAddr,
) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        // Asks for a fresh count of the live sockets (else one every 15 s).
        let _ = agent.get("/connections")?;
        let (code, exposition) = http_get(scrape, "/metrics")?;
        anyhow::ensure!(code == 200, "GET /metrics: HTTP {code}: {exposition}");
        let tcp_listed = feature_on(&exposition, "sockets-iterator")
            || feature_on(&exposition, "sock-diag-storage");
        let errors = exposition.contains("\nsocklb_errors_total{kind=\"map_full\"}");
        let live = exposition.contains("\nsocklb_live_sockets{");
        if errors && (live || !tcp_listed) {
            if !live {
                eprintln!("this kernel lets the agent list no TCP socket: no live-socket series");
            }
            return Ok(exposition);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(45),
            "no map_full error or no live socket in /metrics after 45 s:\n{exposition}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn every_metric_the_rules_and_dashboard_name_is_one_the_agent_exports() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    // Seed 000's web (two backends) cannot fit in a backend array of one, so a map_full error
    // is counted; `one` (a single backend) fits, and the test holds a connection to it, so
    // live sockets are counted: both families appear in the exposition only once they have a
    // series.
    let sandbox = Sandbox::seeded()?;
    sandbox.write_manifest(
        "one.yaml",
        &format!(
            "{}---\n{}",
            service("one", ONE_VIP, "http", "TCP", 80, "8080", &[]),
            slice(
                "one-1",
                "one",
                "http",
                "TCP",
                8080,
                &[Ep::ready("10.244.1.21")]
            )
        ),
    )?;
    // Scraped as the DaemonSet and the PodMonitor have it: /metrics alone on an address of
    // its own (`--prometheus-listen`).
    let scrape: SocketAddr = format!("127.0.0.1:{}", socklb_tests::agent::free_port()?).parse()?;
    let agent = sandbox.start_agent(&AgentOptions::with_args([
        "--max-backends".to_string(),
        "1".into(),
        "--max-map-memory".into(),
        "0".into(),
        "--prometheus-listen".into(),
        scrape.to_string(),
    ]))?;
    for path in ["/status", "/connections"] {
        let (code, _) = http_get(scrape, path)?;
        anyhow::ensure!(
            code == 404,
            "the scrape address serves only /metrics: GET {path} answered {code}"
        );
    }
    let mut client = sandbox.client()?;
    let opened = client.run(&Command::Open {
        id: 1,
        target: format!("{ONE_VIP}:80").parse()?,
        udp: false,
    })?;
    anyhow::ensure!(opened.ok, "connection to {ONE_VIP}:80: {opened:?}");
    let exposition = exposition_with_every_family(&agent, scrape)?;
    let exported = exported_names(&exposition);

    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (place, expr) in expressions()? {
        let names = metric_names(&expr).with_context(|| format!("{place} does not parse"))?;
        for name in names {
            used.entry(name).or_default().push(place.clone());
        }
    }
    // Not vacuous: the alerts' and the panels' main metrics were found.
    for name in [
        "socklb_failing_service_ports",
        "socklb_errors_total",
        "socklb_map_entries",
        "socklb_map_capacity",
        "socklb_datapath_translations_total",
        "socklb_network_programming_duration_seconds_bucket",
        "socklb_live_sockets",
        "socklb_feature_enabled",
        "socklb_guarantee_lost",
        "process_start_time_seconds",
    ] {
        assert!(used.contains_key(name), "no expression names {name}");
    }
    let mut not_the_agents: BTreeSet<&str> = NOT_THE_AGENTS.iter().map(|(name, _)| *name).collect();
    if !exposition.contains("\nsocklb_live_sockets{") {
        // Checked wherever the kernel lets the agent list TCP sockets.
        not_the_agents.insert("socklb_live_sockets");
    }
    if !exposition.contains("\nsocklb_outside_rules{") {
        // Exported only where the outside path is asked for (never on this test's host
        // namespace): `outside.rs` reads it from agents that run it, in-sync and off.
        not_the_agents.insert("socklb_outside_rules");
    }
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| {
            !exported.contains(name.as_str()) && !not_the_agents.contains(name.as_str())
        })
        .map(|(name, places)| format!("{name} (in {})", places.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics named in deploy/monitoring that the agent does not export:\n  {}\n\
         the agent exports:\n  {}",
        missing.join("\n  "),
        exported.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );
    // The allowed ones are not the agent's indeed (an entry made stale by a new agent metric
    // would hide nothing, but would say something false).
    for (name, why) in NOT_THE_AGENTS {
        assert!(
            !exported.contains(name),
            "{name} is exported by the agent now; drop it from NOT_THE_AGENTS ({why})"
        );
    }
    client.run(&Command::Close { id: 1 })?;
    Ok(())
}
