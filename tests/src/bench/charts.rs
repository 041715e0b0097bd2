//! The report's charts, SVG files beside report.md: the connect p50 of each case ÷ direct
//! against the number of services, each program's kernel cost per call beside the empty
//! program's, and the full sync's time against the number of services beside its floors.
//! Every point is a median of the passes, with its min–max as a bar.
use std::path::Path;

use plotters::prelude::*;

use super::{
    controlplane::FullSync,
    datapath::{Case, ScenarioResult},
    kernel::KernelCost,
    stats::Spread,
};

/// The files written, by name, with what they show (for report.md).
pub const CHARTS: [(&str, &str); 3] = [
    (
        "connect_vs_services.svg",
        "connect p50 ÷ direct, connects spread over every service, against the number of services",
    ),
    (
        "kernel_cost.svg",
        "kernel cost per call (ns): socklb's program beside the empty program",
    ),
    (
        "full_sync_vs_services.svg",
        "full sync (s) against the number of services, beside the bare map-write loop",
    ),
];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("chart: {e}")
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(120, 120, 120),
    RGBColor(148, 103, 189),
];

/// A line of medians with min–max bars, over a numeric x axis.
struct Line {
    label: String,
    points: Vec<(f64, Spread)>,
}

fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
) -> anyhow::Result<()> {
    let finite = |v: f64| v.is_finite();
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let x_max = xs.fold(0.0_f64, f64::max).max(1.0) * 1.05;
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1.max))
        .filter(|v| finite(*v))
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE)
        * 1.15;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(err)?;
    for (line, color) in lines.iter().zip(COLORS.iter().cycle()) {
        let color = *color;
        let medians: Vec<(f64, f64)> = line
            .points
            .iter()
            .filter(|(_, s)| finite(s.median))
            .map(|(x, s)| (*x, s.median))
            .collect();
        chart
            .draw_series(LineSeries::new(medians.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(line.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(medians.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
        chart
            .draw_series(
                line.points
                    .iter()
                    .filter(|(_, s)| finite(s.min) && finite(s.max))
                    .map(|(x, s)| PathElement::new(vec![(*x, s.min), (*x, s.max)], color)),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// connect p50 ÷ direct per case, one point per size measured.
fn connect_vs_services(path: &Path, scaling: &[ScenarioResult]) -> anyhow::Result<()> {
    let lines: Vec<Line> = [
        Case::Socklb,
        Case::Iptables,
        Case::Nftables,
        Case::DirectControl,
    ]
    .into_iter()
    .map(|case| Line {
        label: case.to_string(),
        points: scaling
            .iter()
            .filter_map(|s| s.case(case).map(|c| ((s.services + 1) as f64, c.p50_ratio)))
            .collect(),
    })
    .filter(|l| !l.points.is_empty())
    .collect();
    line_chart(
        path,
        "connect p50 ÷ direct connect, spread over every service",
        "services",
        "p50 ÷ direct",
        &lines,
    )
}

fn full_sync_vs_services(path: &Path, syncs: &[FullSync]) -> anyhow::Result<()> {
    let line = |label: &str, value: fn(&FullSync) -> &Spread| Line {
        label: label.into(),
        points: syncs
            .iter()
            .map(|s| (s.services as f64, *value(s)))
            .collect(),
    };
    line_chart(
        path,
        "full sync against the number of services (10 endpoints each)",
        "services",
        "seconds",
        &[
            line("engine on real BPF maps", |s| &s.real_maps_s),
            line("bare map-write loop (floor)", |s| &s.write_floor_s),
            line("engine writing nowhere", |s| &s.in_memory_s),
        ],
    )
}

/// Horizontal bars: each workload's socklb program beside the empty program, ns per call.
fn kernel_cost(path: &Path, costs: &[KernelCost]) -> anyhow::Result<()> {
    let n = costs.len();
    let x_max = costs
        .iter()
        .flat_map(|k| [k.socklb_ns.max, k.floor_ns.max])
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.15;
    let height = 90 + 44 * u32::try_from(n).unwrap_or(20);
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let names: Vec<String> = costs
        .iter()
        .map(|k| {
            let name: String = k.name.chars().take(84).collect();
            if name.len() < k.name.len() {
                format!("{name}…")
            } else {
                name
            }
        })
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "kernel cost per call (ns, median and min–max)",
            ("sans-serif", 17),
        )
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(540)
        .build_cartesian_2d(0.0..x_max, -0.5..(n as f64 - 0.5))
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n.max(1))
        .y_label_formatter(&|y| {
            let i = y.round();
            let index = usize::try_from(i as i64)
                .ok()
                .filter(|_| (y - i).abs() < 0.01);
            index
                .and_then(|i| names.get(i).cloned())
                .unwrap_or_default()
        })
        .x_desc("ns per call")
        .draw()
        .map_err(err)?;
    let bars = [
        (
            "socklb",
            COLORS[0],
            0.18_f64,
            (|k: &KernelCost| &k.socklb_ns) as fn(&KernelCost) -> &Spread,
        ),
        (
            "empty program (floor)",
            COLORS[3],
            -0.18,
            |k: &KernelCost| &k.floor_ns,
        ),
    ];
    for (label, color, offset, value) in bars {
        chart
            .draw_series(costs.iter().enumerate().map(|(i, k)| {
                let y = i as f64 + offset;
                Rectangle::new(
                    [(0.0, y - 0.15), (value(k).median.max(0.0), y + 0.15)],
                    color.filled(),
                )
            }))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        chart
            .draw_series(costs.iter().enumerate().map(|(i, k)| {
                let y = i as f64 + offset;
                PathElement::new(vec![(value(k).min, y), (value(k).max, y)], BLACK)
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes every chart the data allows; returns the names written.
pub fn write(
    dir: &Path,
    scaling: &[ScenarioResult],
    kernel: &[KernelCost],
    full_syncs: &[FullSync],
) -> anyhow::Result<Vec<&'static str>> {
    let mut written = Vec::new();
    let [(connect, _), (costs, _), (sync, _)] = CHARTS;
    if !scaling.is_empty() {
        connect_vs_services(&dir.join(connect), scaling)?;
        written.push(connect);
    }
    if !kernel.is_empty() {
        kernel_cost(&dir.join(costs), kernel)?;
        written.push(costs);
    }
    if !full_syncs.is_empty() {
        full_sync_vs_services(&dir.join(sync), full_syncs)?;
        written.push(sync);
    }
    Ok(written)
}
