//! Short TCP transactions (connect, one request and response, close) through each way of
//! reaching a service, with N other services installed. Only `connect()` is timed.
//!
//! Wall-clock `connect()` latency on a VM flips between levels over milliseconds to seconds, so
//! the cases are measured in rotation (a batch of each case in turn, many rounds, each round
//! starting with the next case), and each case is compared with the direct case round by round.
//! A second direct case shows how much two identical paths differ: the resolution of the
//! measurement. Every case spreads its connects over the three backends at random, as a load
//! balancer does: sending a whole batch to one backend is about 2 µs faster per connect on
//! this machine, which would flatter the direct floor.
use std::{fmt, net::SocketAddr, path::Path, process::Command, time::Duration};

use anyhow::Context as _;
use serde::Serialize;

use super::stats::{median, percentile};
use crate::{Client, bins, client::Command as ClientCommand};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Case {
    /// The client connects to a backend address itself: the floor.
    Direct,
    /// The same, from a second client pod: a control for the resolution.
    DirectControl,
    /// The client connects to the cluster IP; socklb translates at `connect()`.
    Socklb,
    /// kube-proxy's iptables layout in the client's namespace.
    Iptables,
    /// kube-proxy's nftables layout in the client's namespace.
    Nftables,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Direct => "direct",
            Self::DirectControl => "direct (control)",
            Self::Socklb => "socklb",
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        })
    }
}

/// One case's client and where it connects.
pub struct Runner {
    pub case: Case,
    pub client: Client,
    pub targets: Vec<SocketAddr>,
    pub bulk_target: SocketAddr,
}

/// Results of one case at one N.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: Case,
    pub connects: usize,
    pub failures: usize,
    pub connects_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Median over rounds of (this case's round median / direct's round median).
    pub p50_ratio_to_direct: f64,
    /// socklb only: the connect4 program's average run time per connect (kernel counters).
    pub program_ns: Option<f64>,
}

/// Bulk throughput over one long connection.
#[derive(Clone, Debug, Serialize)]
pub struct BulkResult {
    pub case: Case,
    pub gbit_per_s: f64,
}

pub struct Plan {
    pub rounds: usize,
    pub batch: usize,
    pub warmup: usize,
}

fn bench(runner: &mut Runner, count: usize) -> anyhow::Result<crate::client::Reply> {
    // Direct cases pick one of the three backends at random per connect, as socklb does.
    runner.client.run(&ClientCommand::Bench {
        targets: runner.targets.clone(),
        count,
    })
}

/// Kernel run counters of the connect4 program: (runs, nanoseconds).
fn connect4_counters(pins: &Path) -> anyhow::Result<(u64, u64)> {
    let out = Command::new(bins::socklb()?)
        .args(["inspect", "programs", "-o", "json", "--bpffs"])
        .arg(pins)
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("inspect programs")?;
    let p = v
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "socklb_connect4"))
        .context("connect4 program")?;
    Ok((
        p["run_count"].as_u64().unwrap_or(0),
        p["run_time_ns"].as_u64().unwrap_or(0),
    ))
}

/// Measures every case in rotation.
pub fn measure(runners: &mut [Runner], plan: &Plan) -> anyhow::Result<Vec<CaseResult>> {
    for r in runners.iter_mut() {
        bench(r, plan.warmup)?;
    }
    let n = runners.len();
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut round_medians: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut elapsed = vec![0u64; n];
    let mut failures = vec![0usize; n];
    for round in 0..plan.rounds {
        // Each round starts with another case, so no case always follows the same one (a
        // heavy case's leftover work, like iptables at 10,000 services, spills into the next).
        for k in 0..n {
            let i = (round + k) % n;
            let reply = bench(&mut runners[i], plan.batch)?;
            failures[i] += reply.failures();
            elapsed[i] += reply.elapsed_ns;
            let mut sorted = reply.latencies_ns.clone();
            sorted.sort_unstable();
            round_medians[i].push(median(&sorted));
            latencies[i].extend(reply.latencies_ns);
        }
    }
    let direct = runners
        .iter()
        .position(|r| r.case == Case::Direct)
        .context("a direct case")?;
    let mut results = Vec::new();
    for (i, r) in runners.iter().enumerate() {
        let mut all = latencies[i].clone();
        all.sort_unstable();
        let mut ratios: Vec<f64> = round_medians[i]
            .iter()
            .zip(&round_medians[direct])
            .map(|(a, d)| a / d)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let connects = all.len();
        results.push(CaseResult {
            case: r.case,
            connects,
            failures: failures[i],
            connects_per_s: connects as f64 / (elapsed[i] as f64 / 1e9),
            p50_us: median(&all) / 1e3,
            p99_us: percentile(&all, 0.99) / 1e3,
            p50_ratio_to_direct: ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
            program_ns: None,
        });
    }
    Ok(results)
}

/// The connect4 program's average run time per connect, from the kernel's own counters, over
/// `count` connects of the socklb case (statistics are on only for this pass: they cost a few
/// nanoseconds per program run).
pub fn program_cost(runner: &mut Runner, count: usize, pins: &Path) -> anyhow::Result<f64> {
    let stats = BpfStats::enable()?;
    let (runs, ns) = connect4_counters(pins)?;
    bench(runner, count)?;
    let (runs2, ns2) = connect4_counters(pins)?;
    drop(stats);
    let runs = runs2.saturating_sub(runs);
    anyhow::ensure!(runs > 0, "the connect4 program did not run");
    Ok(ns2.saturating_sub(ns) as f64 / runs as f64)
}

/// Bulk throughput of each case over one long connection.
pub fn bulk(runners: &mut [Runner], bytes: u64) -> anyhow::Result<Vec<BulkResult>> {
    let mut out = Vec::new();
    for r in runners.iter_mut() {
        let reply = r.client.run(&ClientCommand::Bulk {
            target: r.bulk_target,
            bytes,
        })?;
        anyhow::ensure!(reply.ok, "{} bulk failed: {:?}", r.case, reply.errors);
        let secs = Duration::from_nanos(reply.elapsed_ns).as_secs_f64();
        out.push(BulkResult {
            case: r.case,
            gbit_per_s: bytes as f64 * 8.0 / secs / 1e9,
        });
    }
    Ok(out)
}

/// Holds `BPF_ENABLE_STATS`: while it lives, the kernel counts program runs and run time.
pub struct BpfStats(#[allow(dead_code, reason = "held for its Drop")] std::os::fd::OwnedFd);

impl BpfStats {
    pub fn enable() -> anyhow::Result<Self> {
        use std::os::fd::FromRawFd as _;
        const BPF_ENABLE_STATS: libc::c_long = 32;
        // union bpf_attr, enable_stats variant: type (BPF_STATS_RUN_TIME = 0), zero padded.
        let attr = [0u8; 128];
        // SAFETY: a zeroed bpf_attr asks for run-time statistics; the kernel returns an fd.
        let fd =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), attr.len()) };
        if fd < 0 {
            anyhow::bail!("BPF_ENABLE_STATS: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok(Self(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(i32::try_from(fd)?)
        }))
    }
}
