//! What an application sees: the latency of `connect()` and of UDP request/response through
//! socklb, beside the same work sent straight to the backends (the floor) and through
//! kube-proxy's iptables and nftables layouts.
//!
//! Wall-clock latency on a VM flips between levels over milliseconds to seconds, so the cases of
//! a scenario are measured in rotation (a batch of each case in turn, each round starting with
//! the next case), and each case is compared with the direct case round by round: a scenario's
//! figure is the median of the per-round ratios, with their range. A second direct case, from
//! another pod, shows how much two identical paths differ: the resolution of the measurement.
//! Every case spreads its work over the three backends at random, as a load balancer does.
use std::{collections::BTreeMap, fmt, net::SocketAddr, time::Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::{
    stats::{Spread, median, percentile},
    world::{BACKEND_TCP, BACKEND_UDP, DNS_PORT, HTTP_PORT, VIP, World, all_vips, backends},
};
use crate::{
    Client,
    client::{Command as ClientCommand, Op},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Case {
    /// The client sends to a backend address itself: the floor.
    Direct,
    /// The same, from a second client pod: a control for the resolution.
    DirectControl,
    /// The client uses the service address; socklb translates.
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

/// What each operation of a scenario is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Traffic {
    /// A short TCP transaction (connect, one line each way, close); only `connect()` is timed.
    TcpConnect,
    /// sendto + recvfrom on one unconnected UDP socket; the round trip is timed.
    UdpUnconnected,
    /// A new connected UDP socket per request (connect, send, recv, close), all timed.
    UdpConnected,
}

/// One scenario: the traffic, and where each case sends it.
pub struct Scenario {
    pub name: String,
    pub traffic: Traffic,
    pub targets: BTreeMap<Case, Vec<SocketAddr>>,
}

impl Scenario {
    /// TCP connects to one service (hot maps), beside iptables and nftables.
    pub fn tcp_hot() -> Self {
        let vip = SocketAddr::new(VIP.parse().expect("VIP"), HTTP_PORT);
        let direct = backends(BACKEND_TCP);
        Self {
            name: "TCP connect, one service".into(),
            traffic: Traffic::TcpConnect,
            targets: BTreeMap::from([
                (Case::Socklb, vec![vip]),
                (Case::Direct, direct.clone()),
                (Case::DirectControl, direct),
                (Case::Iptables, vec![vip]),
                (Case::Nftables, vec![vip]),
            ]),
        }
    }

    /// TCP connects spread at random over every installed service (cold maps).
    pub fn tcp_cold(services: usize) -> Self {
        let vips = all_vips(services);
        let direct = backends(BACKEND_TCP);
        Self {
            name: format!("TCP connect, spread over all {} services", services + 1),
            traffic: Traffic::TcpConnect,
            targets: BTreeMap::from([
                (Case::Socklb, vips.clone()),
                (Case::Direct, direct.clone()),
                (Case::DirectControl, direct),
                (Case::Iptables, vips.clone()),
                (Case::Nftables, vips),
            ]),
        }
    }

    /// UDP request/response to the benchmark's UDP service.
    pub fn udp(traffic: Traffic) -> Self {
        let vip = SocketAddr::new(VIP.parse().expect("VIP"), DNS_PORT);
        let direct = backends(BACKEND_UDP);
        Self {
            name: match traffic {
                Traffic::UdpConnected => "UDP request/response, connected socket per request",
                _ => "UDP request/response, one unconnected socket",
            }
            .into(),
            traffic,
            targets: BTreeMap::from([
                (Case::Socklb, vec![vip]),
                (Case::Direct, direct.clone()),
                (Case::DirectControl, direct),
            ]),
        }
    }
}

pub fn command(traffic: Traffic, targets: &[SocketAddr], count: usize) -> ClientCommand {
    let targets = targets.to_vec();
    match traffic {
        Traffic::TcpConnect => ClientCommand::Bench { targets, count },
        Traffic::UdpUnconnected => ClientCommand::Ops {
            kind: Op::UdpUnconnected,
            targets,
            count,
        },
        Traffic::UdpConnected => ClientCommand::Ops {
            kind: Op::UdpConnected,
            targets,
            count,
        },
    }
}

/// One case's figures in one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: Case,
    pub operations: usize,
    pub failures: usize,
    /// The failed operations by error (errno name, or what the client saw), so that a run
    /// that lost connects says how.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub errors: std::collections::BTreeMap<String, usize>,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Per round: this case's median ÷ the direct case's median, in the same round.
    pub p50_ratio: Spread,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub services: usize,
    pub cases: Vec<CaseResult>,
}

impl ScenarioResult {
    pub fn case(&self, case: Case) -> Option<&CaseResult> {
        self.cases.iter().find(|c| c.case == case)
    }
}

pub struct Plan {
    pub rounds: usize,
    pub batch: usize,
    pub warmup: usize,
}

/// Measures every case of `scenario` in rotation.
pub fn measure(
    world: &mut World,
    scenario: &Scenario,
    plan: &Plan,
) -> anyhow::Result<ScenarioResult> {
    let cases: Vec<Case> = scenario.targets.keys().copied().collect();
    for &case in &cases {
        let cmd = command(scenario.traffic, &scenario.targets[&case], plan.warmup);
        world.runner(case)?.client.run(&cmd)?;
    }
    let n = cases.len();
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut round_medians: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut failures = vec![0usize; n];
    let mut errors = vec![std::collections::BTreeMap::<String, usize>::new(); n];
    for round in 0..plan.rounds {
        // Each round starts with another case, so no case always follows the same one (a
        // heavy case's leftover work, like iptables at 10,000 services, spills into the next).
        for k in 0..n {
            let i = (round + k) % n;
            let cmd = command(scenario.traffic, &scenario.targets[&cases[i]], plan.batch);
            let reply = world.runner(cases[i])?.client.run(&cmd)?;
            anyhow::ensure!(
                reply.ok,
                "{} {}: {:?}",
                scenario.name,
                cases[i],
                reply.error
            );
            failures[i] += reply.failures();
            for (e, k) in &reply.errors {
                *errors[i].entry(e.clone()).or_default() += k;
            }
            let mut sorted = reply.latencies_ns.clone();
            sorted.sort_unstable();
            round_medians[i].push(median(&sorted));
            latencies[i].extend(reply.latencies_ns);
        }
    }
    let direct = cases
        .iter()
        .position(|c| *c == Case::Direct)
        .context("a direct case")?;
    let mut results = Vec::new();
    for (i, &case) in cases.iter().enumerate() {
        let mut all = latencies[i].clone();
        all.sort_unstable();
        let ratios: Vec<f64> = round_medians[i]
            .iter()
            .zip(&round_medians[direct])
            .map(|(a, d)| a / d)
            .collect();
        results.push(CaseResult {
            case,
            operations: all.len(),
            failures: failures[i],
            errors: std::mem::take(&mut errors[i]),
            p50_us: median(&all) / 1e3,
            p99_us: percentile(&all, 0.99) / 1e3,
            p50_ratio: Spread::of(&ratios),
        });
    }
    Ok(ScenarioResult {
        name: scenario.name.clone(),
        services: world.services,
        cases: results,
    })
}

/// Several clients at once: connects per second and p99, socklb ÷ direct, per pass.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrentResult {
    pub clients: usize,
    pub connects_per_client: usize,
    pub socklb_connects_per_s: Spread,
    pub direct_connects_per_s: Spread,
    pub throughput_ratio: Spread,
    pub p99_ratio: Spread,
    pub failures: usize,
    /// One client at a time (a load the direct case does not saturate): CPU time per connect,
    /// every process of the sandbox and the kernel's softirq threads counted, in µs.
    pub cpu_socklb_us: Spread,
    pub cpu_direct_us: Spread,
    pub cpu_ratio: Spread,
}

/// CPU time so far, in ns, of every process the sandbox started (all their threads, with the
/// softirq work the kernel did in their context) and of the kernel's softirq threads.
fn cpu_ns(world: &World) -> anyhow::Result<u64> {
    let mut pids = world.sandbox.process_ids();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.starts_with("ksoftirqd/")
            && let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok())
        {
            pids.push(pid);
        }
    }
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            // The first field: time on a CPU, in ns (CONFIG_SCHED_INFO).
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total += stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// µs of CPU per connect of one client's `count` connects.
fn cpu_per_connect(
    world: &World,
    client: &mut [Client],
    targets: &[SocketAddr],
    count: usize,
) -> anyhow::Result<f64> {
    let before = cpu_ns(world)?;
    let (rate, _, _) = all_at_once(client, targets, count)?;
    anyhow::ensure!(rate > 0.0, "no connect completed");
    let spent = cpu_ns(world)?.saturating_sub(before);
    Ok(spent as f64 / 1000.0 / count as f64)
}

fn all_at_once(
    clients: &mut [Client],
    targets: &[SocketAddr],
    count: usize,
) -> anyhow::Result<(f64, f64, usize)> {
    let start = Instant::now();
    for c in clients.iter_mut() {
        c.send(&command(Traffic::TcpConnect, targets, count))?;
    }
    let mut latencies = Vec::new();
    let mut failures = 0;
    for c in clients.iter_mut() {
        let r = c.receive()?;
        anyhow::ensure!(r.ok, "concurrent client: {:?}", r.error);
        failures += r.failures();
        latencies.extend(r.latencies_ns);
    }
    let secs = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok((
        latencies.len() as f64 / secs,
        percentile(&latencies, 0.99),
        failures,
    ))
}

/// `clients` socklb clients connect at once (spread over every service), then `clients` direct
/// clients (spread over the backends); `passes` alternations.
pub fn concurrent(
    world: &World,
    clients: usize,
    count: usize,
    passes: usize,
) -> anyhow::Result<ConcurrentResult> {
    let mut socklb = world.extra_clients(Case::Socklb, clients)?;
    let mut direct = world.extra_clients(Case::Direct, clients)?;
    let vips = all_vips(world.services);
    let pods = backends(BACKEND_TCP);
    all_at_once(&mut socklb, &vips, count / 4)?;
    all_at_once(&mut direct, &pods, count / 4)?;
    let (mut s_rate, mut d_rate, mut rate_ratio, mut p99_ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut failures = 0;
    for pass in 0..passes {
        let (s, d) = if pass % 2 == 0 {
            let s = all_at_once(&mut socklb, &vips, count)?;
            (s, all_at_once(&mut direct, &pods, count)?)
        } else {
            let d = all_at_once(&mut direct, &pods, count)?;
            (all_at_once(&mut socklb, &vips, count)?, d)
        };
        failures += s.2 + d.2;
        s_rate.push(s.0);
        d_rate.push(d.0);
        rate_ratio.push(s.0 / d.0);
        p99_ratio.push(s.1 / d.1);
    }
    let (mut cpu_s, mut cpu_d, mut cpu_ratio) = (Vec::new(), Vec::new(), Vec::new());
    for pass in 0..passes {
        let (s, d) = if pass % 2 == 0 {
            let s = cpu_per_connect(world, &mut socklb[..1], &vips, count)?;
            (s, cpu_per_connect(world, &mut direct[..1], &pods, count)?)
        } else {
            let d = cpu_per_connect(world, &mut direct[..1], &pods, count)?;
            (cpu_per_connect(world, &mut socklb[..1], &vips, count)?, d)
        };
        cpu_s.push(s);
        cpu_d.push(d);
        cpu_ratio.push(s / d);
    }
    Ok(ConcurrentResult {
        clients,
        connects_per_client: count,
        socklb_connects_per_s: Spread::of(&s_rate),
        direct_connects_per_s: Spread::of(&d_rate),
        throughput_ratio: Spread::of(&rate_ratio),
        p99_ratio: Spread::of(&p99_ratio),
        failures,
        cpu_socklb_us: Spread::of(&cpu_s),
        cpu_direct_us: Spread::of(&cpu_d),
        cpu_ratio: Spread::of(&cpu_ratio),
    })
}
