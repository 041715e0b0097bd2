//! The benchmark report: results.json, report.md with the targets judged, and SVG charts.
use std::{fmt::Write as _, path::Path};

use plotters::prelude::*;
use serde::Serialize;

use super::{
    controlplane::{AgentFootprint, ControlPlaneResult},
    datapath::{BulkResult, Case, CaseResult},
    world::LoadTimes,
};

#[derive(Clone, Debug, Serialize)]
pub struct Environment {
    pub date: String,
    pub kernel: String,
    pub cpus: usize,
    pub cpu: String,
    pub iptables: String,
    pub quick: bool,
    pub rounds: usize,
    pub batch: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct DatapathRun {
    pub services: usize,
    pub load: LoadTimes,
    pub cases: Vec<CaseResult>,
    /// socklb's connect4 program, average run time per connect (kernel counters).
    pub program_ns: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Micro {
    pub name: String,
    pub mean_ns: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub environment: Environment,
    pub datapath: Vec<DatapathRun>,
    pub bulk: Vec<BulkResult>,
    pub controlplane: Vec<ControlPlaneResult>,
    pub footprint: Option<AgentFootprint>,
    pub micro: Vec<Micro>,
}

/// A target, what was measured, and whether it was met.
pub struct Verdict {
    pub target: String,
    pub measured: String,
    pub met: bool,
    pub note: String,
}

fn case(run: &DatapathRun, c: Case) -> Option<&CaseResult> {
    run.cases.iter().find(|r| r.case == c)
}

fn miss(measured: f64, limit: f64) -> String {
    if measured <= limit {
        format!("met with {:.0}% to spare", (1.0 - measured / limit) * 100.0)
    } else {
        format!("missed by {:.0}%", (measured / limit - 1.0) * 100.0)
    }
}

impl Report {
    pub fn verdicts(&self) -> Vec<Verdict> {
        let mut out = Vec::new();
        let scale = if self.environment.quick {
            " (quick run: fewer services than the target's 10,000)"
        } else {
            ""
        };
        if let Some(run) = self.datapath.last()
            && let Some(s) = case(run, Case::Socklb)
        {
            out.push(Verdict {
                target: "socklb connect p50 within 5% of direct at 10,000 services".into(),
                measured: format!(
                    "{:.3}x direct at {} services",
                    s.p50_ratio_to_direct, run.services
                ),
                met: s.p50_ratio_to_direct <= 1.05,
                note: format!("{}{scale}", miss(s.p50_ratio_to_direct, 1.05)),
            });
            out.push(Verdict {
                target: "socklb's per-connect program cost under 300 ns at 10,000 services".into(),
                measured: format!("{:.0} ns at {} services", run.program_ns, run.services),
                met: run.program_ns < 300.0,
                note: format!("{}{scale}", miss(run.program_ns, 300.0)),
            });
        }
        if let Some(cp) = self.controlplane.iter().find(|c| c.maps == "BPF maps") {
            out.push(Verdict {
                target: "full sync of 10,000 x 10 under 1 s".into(),
                measured: format!(
                    "{:.3} s for {} x {} (real maps)",
                    cp.full_sync_s, cp.services, cp.endpoints
                ),
                met: cp.full_sync_s < 1.0,
                note: format!(
                    "{}{}",
                    miss(cp.full_sync_s, 1.0),
                    if cp.services < 10_000 { scale } else { "" }
                ),
            });
            out.push(Verdict {
                target: "one change applied in under 1 ms p99 in-process".into(),
                measured: format!("{:.0} us p99 (real maps)", cp.change_p99_us),
                met: cp.change_p99_us < 1000.0,
                note: miss(cp.change_p99_us, 1000.0),
            });
        }
        if let Some(f) = &self.footprint {
            out.push(Verdict {
                target: "agent RSS under 64 MiB at 10,000 x 10".into(),
                measured: format!(
                    "{:.1} MiB peak for {} x {}",
                    f.peak_rss_mib, f.services, f.endpoints
                ),
                met: f.peak_rss_mib < 64.0,
                note: format!(
                    "{}{}",
                    miss(f.peak_rss_mib, 64.0),
                    if f.services < 10_000 { scale } else { "" }
                ),
            });
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut m = String::new();
        let e = &self.environment;
        let _ = writeln!(m, "# socklb benchmark report\n");
        let _ = writeln!(
            m,
            "{} · kernel {} · {} CPU(s) ({}) · {}{}\n",
            e.date,
            e.kernel,
            e.cpus,
            e.cpu,
            e.iptables,
            if e.quick { " · **quick run**" } else { "" }
        );
        let _ = writeln!(
            m,
            "## Targets\n\n| target | measured | verdict |\n|---|---|---|"
        );
        for v in self.verdicts() {
            let _ = writeln!(
                m,
                "| {} | {} | {} {} |",
                v.target,
                v.measured,
                if v.met { "met:" } else { "**MISSED**:" },
                v.note
            );
        }
        self.datapath_section(&mut m);
        self.controlplane_section(&mut m);
        Self::reproduce_section(&mut m);
        m
    }

    fn datapath_section(&self, m: &mut String) {
        let e = &self.environment;
        let _ = writeln!(
            m,
            "\n## Data path\n\nShort TCP transactions (connect, one request and response, close) from a client pod to a\nservice with 3 backend pods, with N other services installed. The cases run in rotation:\n{} rounds of {} transactions each, each round starting with the next case, so drifts of the VM\nand one case's leftover work affect all alike. `p50 ratio` is the\nmedian over rounds of the case's round median divided by direct's: `direct (control)` is a\nsecond, identical direct path and shows the resolution.\n",
            e.rounds, e.batch
        );
        let _ = writeln!(
            m,
            "![connect p50](connect_p50.svg) ![connections per second](connects_per_s.svg)\n"
        );
        for run in &self.datapath {
            let _ = writeln!(
                m,
                "### {} other services\n\nInstall time: socklb {:.2} s (manifest written to maps written, YAML parsing included), iptables-restore {:.2} s, nft (batches of 500) {:.2} s. socklb's connect4 program: **{:.0} ns per connect** (kernel run counters, BPF_ENABLE_STATS).\n",
                run.services,
                run.load.socklb_s,
                run.load.iptables_s,
                run.load.nftables_s,
                run.program_ns
            );
            let _ = writeln!(
                m,
                "| case | connects/s | connect p50 | connect p99 | p50 ratio to direct | failures |\n|---|---|---|---|---|---|"
            );
            for c in &run.cases {
                let _ = writeln!(
                    m,
                    "| {} | {:.0} | {:.1} us | {:.1} us | {:.3} | {} |",
                    c.case, c.connects_per_s, c.p50_us, c.p99_us, c.p50_ratio_to_direct, c.failures
                );
            }
            let _ = writeln!(m);
        }
        if !self.bulk.is_empty() {
            let _ = writeln!(
                m,
                "### Bulk throughput over one long connection\n\n| case | Gbit/s |\n|---|---|"
            );
            for b in &self.bulk {
                let _ = writeln!(m, "| {} | {:.2} |", b.case, b.gbit_per_s);
            }
            let _ = writeln!(
                m,
                "\nsocklb does nothing per packet: its throughput should equal direct's, within noise."
            );
        }
    }

    fn controlplane_section(&self, m: &mut String) {
        let _ = writeln!(
            m,
            "\n## Control plane\n\nThe agent's engine in process: a full sync, then single EndpointSlice changes (an endpoint\nflips readiness), then a rolling update (every endpoint of the first services replaced, one pod\nat a time). Times include translation and every map write.\n\n| maps | services x endpoints | full sync | map writes | change p50 | change p99 | rolling update | per update p99 |\n|---|---|---|---|---|---|---|---|"
        );
        for c in &self.controlplane {
            let _ = writeln!(
                m,
                "| {} | {} x {} | {:.3} s | {} | {:.0} us | {:.0} us | {} services, {} updates in {:.2} s | {:.0} us |",
                c.maps,
                c.services,
                c.endpoints,
                c.full_sync_s,
                c.full_sync_writes,
                c.change_p50_us,
                c.change_p99_us,
                c.rolling_services,
                c.rolling_updates,
                c.rolling_s,
                c.rolling_p99_us
            );
        }
        if let Some(f) = &self.footprint {
            let _ = writeln!(
                m,
                "\nThe real agent binary on a manifests folder of {} x {}: ready after {:.2} s (YAML parsing included), peak RSS {:.1} MiB, RSS {:.1} MiB.",
                f.services, f.endpoints, f.ready_s, f.peak_rss_mib, f.rss_mib
            );
        }
        if !self.micro.is_empty() {
            let _ = writeln!(
                m,
                "\n### Criterion micro-benchmarks\n\n| benchmark | mean |\n|---|---|"
            );
            for b in &self.micro {
                let _ = writeln!(m, "| {} | {:.2} us |", b.name, b.mean_ns / 1e3);
            }
        }
    }

    fn reproduce_section(m: &mut String) {
        let _ = writeln!(
            m,
            "\n## Reproduce\n\n- Everything: `cargo xtask bench` (as root; `--quick` for a short run). It builds in release\n  mode, runs the criterion benchmarks (`cargo bench -p lb-userspace --bench control_plane`) and\n  `target/release/socklb-bench --out target/bench`.\n- The figures above are in `target/bench/results.json`.\n- All traffic stays in the benchmark's own network namespaces; the iptables and nftables rules\n  live in the baseline clients' namespaces and go away with them."
        );
    }

    pub fn summary(&self) -> String {
        let mut s = String::new();
        for v in self.verdicts() {
            let _ = writeln!(
                s,
                "{} {}: {} ({})",
                if v.met { "met   " } else { "MISSED" },
                v.target,
                v.measured,
                v.note
            );
        }
        s
    }

    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        self.chart(&dir.join("connect_p50.svg"), "connect() p50 (us)", |c| {
            c.p50_us
        })?;
        self.chart(
            &dir.join("connects_per_s.svg"),
            "connections per second",
            |c| c.connects_per_s,
        )?;
        Ok(())
    }

    fn chart(&self, path: &Path, title: &str, value: fn(&CaseResult) -> f64) -> anyhow::Result<()> {
        let runs = &self.datapath;
        if runs.is_empty() {
            return Ok(());
        }
        let max = runs
            .iter()
            .flat_map(|r| r.cases.iter().map(value))
            .fold(0.0_f64, f64::max)
            * 1.15;
        let root = SVGBackend::new(path, (640, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let labels: Vec<String> = runs.iter().map(|r| r.services.to_string()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.3_f64..(runs.len() as f64 - 0.7), 0.0..max.max(1.0))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("other services installed")
            .x_labels(runs.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 0.01 && i >= 0.0 {
                    labels
                        .get(usize::try_from(i as i64).unwrap_or(0))
                        .cloned()
                        .unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let cases = [
            Case::Direct,
            Case::Socklb,
            Case::Iptables,
            Case::Nftables,
            Case::DirectControl,
        ];
        let colors = [BLACK, BLUE, RED, GREEN, RGBColor(150, 150, 150)];
        for (c, color) in cases.iter().zip(colors) {
            let points: Vec<(f64, f64)> = runs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| case(r, *c).map(|x| (i as f64, value(x))))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(c.to_string())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}
