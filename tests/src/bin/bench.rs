//! `socklb-bench`: run by `cargo xtask bench`. Measures the data path (socklb beside direct
//! connects and kube-proxy's iptables and nftables layouts, with 1, 1,000 and 10,000 other
//! services) and the control plane, and writes target/bench/report.md, results.json and SVG
//! charts. A benchmark, not a test: it reports targets missed, it does not fail on them.
use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use socklb_tests::{
    bench::{
        baselines::iptables_version,
        controlplane,
        datapath::{self, Case, Plan},
        report::{DatapathRun, Environment, Micro, Report},
        world::World,
    },
    privileges,
};

struct Settings {
    quick: bool,
    services: Vec<usize>,
    plan: Plan,
    program_connects: usize,
    bulk_bytes: u64,
    cp_services: usize,
    cp_changes: usize,
    cp_rolling: usize,
}

impl Settings {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                services: vec![1, 100],
                plan: Plan {
                    rounds: 3,
                    batch: 100,
                    warmup: 50,
                },
                program_connects: 1000,
                bulk_bytes: 64 << 20,
                cp_services: 1000,
                cp_changes: 200,
                cp_rolling: 20,
            }
        } else {
            Self {
                quick,
                services: vec![1, 1000, 10_000],
                plan: Plan {
                    rounds: 25,
                    batch: 400,
                    warmup: 400,
                },
                program_connects: 5000,
                bulk_bytes: 2 << 30,
                cp_services: 10_000,
                cp_changes: 1000,
                cp_rolling: 1000,
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from)
    };
    let out = flag("--out").unwrap_or_else(|| PathBuf::from("target/bench"));
    let criterion = flag("--criterion");
    if let Some(reason) = privileges::missing() {
        eprintln!("socklb-bench needs a privileged machine: {reason}");
        return ExitCode::FAILURE;
    }
    match run(&Settings::new(quick), &out, criterion.as_deref()) {
        Ok(report) => {
            println!("\n{}", report.summary());
            println!("report: {}", out.join("report.md").display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("socklb-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn environment(s: &Settings) -> Environment {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Environment {
        date,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default(),
        iptables: iptables_version(),
        quick: s.quick,
        rounds: s.plan.rounds,
        batch: s.plan.batch,
    }
}

fn run(s: &Settings, out: &Path, criterion: Option<&Path>) -> anyhow::Result<Report> {
    let mut report = Report {
        environment: environment(s),
        datapath: Vec::new(),
        bulk: Vec::new(),
        controlplane: Vec::new(),
        footprint: None,
        micro: criterion.map(micro).transpose()?.unwrap_or_default(),
    };
    eprintln!("data path: setting up the sandbox");
    let mut world = World::new()?;
    for &n in &s.services {
        eprintln!("data path: installing {n} other services");
        let load = world.set_services(n)?;
        eprintln!(
            "data path: measuring {} rounds x {} connects per case",
            s.plan.rounds, s.plan.batch
        );
        let cases = datapath::measure(&mut world.runners, &s.plan)?;
        let pins = world.sandbox.pin_folder();
        let socklb = world.runner(Case::Socklb).context("socklb case")?;
        let program_ns = datapath::program_cost(socklb, s.program_connects, &pins)?;
        for c in &cases {
            eprintln!(
                "  {n:>6} services  {:<17} p50 {:>6.1} us  p99 {:>7.1} us  {:>6.0} conn/s  ratio {:.3}",
                c.case.to_string(),
                c.p50_us,
                c.p99_us,
                c.connects_per_s,
                c.p50_ratio_to_direct
            );
        }
        eprintln!("  socklb connect4 program: {program_ns:.0} ns per connect");
        report.datapath.push(DatapathRun {
            services: n,
            load,
            cases,
            program_ns,
        });
    }
    eprintln!(
        "data path: bulk throughput, {} MiB per case",
        s.bulk_bytes >> 20
    );
    report.bulk = datapath::bulk(&mut world.runners, s.bulk_bytes)?;
    drop(world.runners);
    drop(world.agent);
    let sandbox = world.sandbox;

    eprintln!(
        "control plane: {} services x 10 endpoints, in memory",
        s.cp_services
    );
    report.controlplane.push(controlplane::in_memory(
        s.cp_services,
        10,
        s.cp_changes,
        s.cp_rolling,
    )?);
    eprintln!("control plane: the same on real BPF maps");
    report.controlplane.push(controlplane::bpf_maps(
        &sandbox,
        s.cp_services,
        10,
        s.cp_changes,
        s.cp_rolling,
    )?);
    eprintln!(
        "control plane: the agent binary on {} x 10 manifests",
        s.cp_services
    );
    report.footprint = Some(controlplane::agent_footprint(&sandbox, s.cp_services, 10)?);
    drop(sandbox);
    report.write(out)?;
    Ok(report)
}

/// Criterion's estimates, from `target/criterion/**/new/estimates.json`.
fn micro(dir: &Path) -> anyhow::Result<Vec<Micro>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "new") {
                    let est: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
                        path.join("estimates.json"),
                    )?)?;
                    let name = d.strip_prefix(dir).unwrap_or(&d).display().to_string();
                    if name != "report" {
                        out.push(Micro {
                            name,
                            mean_ns: est["mean"]["point_estimate"].as_f64().unwrap_or(0.0),
                        });
                    }
                } else {
                    stack.push(path);
                }
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
