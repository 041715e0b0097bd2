//! `socklb-bench`: run by `cargo xtask bench`. Measures socklb's programs beside empty ones, the
//! data path beside direct connects and kube-proxy's iptables and nftables layouts at N other
//! services, and the control plane beside a bare map-write loop; writes target/bench/report.md
//! and results.json. A benchmark, not a test: it reports targets missed, it does not fail on them.
use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use socklb_tests::{
    bench::{
        baselines::iptables_version,
        controlplane,
        datapath::{self, Plan, Scenario, Traffic},
        kernel, listing,
        report::{self, Environment, Micro, Report},
        world::World,
    },
    privileges,
};

/// The parts `--only` picks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `kernel`: the programs' kernel cost.
    Kernel,
    /// `control-plane`.
    ControlPlane,
    /// `listing`: the live sockets' listing.
    Listing,
    /// `outside`: NodePorts from outside the node, through socklb's and kube-proxy's rules.
    Outside,
    /// `concurrent`: several clients at once, and the CPU time per connect.
    Concurrent,
}

struct Settings {
    quick: bool,
    /// `--only PART`: one part of the benchmark (a quick look while changing it).
    only: Option<Part>,
    /// Other services installed for the data path.
    services: usize,
    /// Passes of every ratio measured against a floor.
    passes: usize,
    /// Calls per pass in the kernel-cost workloads.
    kernel_calls: usize,
    plan: Plan,
    /// Connects per client per pass when several clients run at once.
    concurrent_connects: usize,
    /// Live translated sockets held while their listing is measured.
    listing_sockets: usize,
    cp_services: usize,
    cp_changes: usize,
    cp_rolling: usize,
    api_changes: usize,
    /// The outside path: passes and connects per case and pass.
    outside_passes: usize,
    outside_connects: usize,
}

impl Settings {
    fn new(quick: bool) -> Self {
        if quick && cfg!(debug_assertions) {
            // The check run of `cargo xtask test` (a debug build): every benchmark runs and the
            // report is written; its figures mean nothing, so it stays small.
            Self {
                only: None,
                quick,
                services: 300,
                passes: 3,
                kernel_calls: 200,
                plan: Plan {
                    rounds: 3,
                    batch: 50,
                    warmup: 20,
                },
                concurrent_connects: 100,
                listing_sockets: 2_000,
                cp_services: 300,
                cp_changes: 50,
                cp_rolling: 10,
                api_changes: 20,
                outside_passes: 3,
                outside_connects: 50,
            }
        } else if quick {
            Self {
                only: None,
                quick,
                services: 1000,
                passes: 5,
                kernel_calls: 500,
                plan: Plan {
                    rounds: 5,
                    batch: 100,
                    warmup: 50,
                },
                concurrent_connects: 200,
                listing_sockets: 10_000,
                cp_services: 1000,
                cp_changes: 200,
                cp_rolling: 20,
                api_changes: 50,
                outside_passes: 5,
                outside_connects: 200,
            }
        } else {
            Self {
                only: None,
                quick,
                services: 10_000,
                passes: 7,
                kernel_calls: 3000,
                plan: Plan {
                    rounds: 25,
                    batch: 400,
                    warmup: 400,
                },
                concurrent_connects: 1500,
                listing_sockets: 100_000,
                cp_services: 10_000,
                cp_changes: 1000,
                cp_rolling: 1000,
                api_changes: 300,
                outside_passes: 7,
                outside_connects: 1000,
            }
        }
    }
}

const USAGE: &str = "usage: socklb-bench [--quick] \
[--only kernel|control-plane|listing|outside|concurrent] [--out DIR] [--criterion DIR]
  --quick      every benchmark once at a small size (its report says its figures mean nothing)
  --only PART  one part: the programs' kernel cost, the control plane, the live sockets' listing,
               traffic from outside the node (NodePorts through socklb's and kube-proxy's rules),
               or several clients at once with the CPU time per connect
  --out DIR    where the report, results.json and the charts go (target/bench)
  --criterion DIR  criterion's output to take the micro-benchmarks from";

/// Whether every argument is one `main` reads: a word it does not know (a typo, `--help`)
/// must not start a run of several minutes that ignores it.
fn check_args(args: &[String]) -> Result<(), String> {
    let mut words = args.iter().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--quick" => {}
            "--only" | "--out" | "--criterion" => {
                if words.next().is_none() {
                    return Err(format!("{word} needs a value"));
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = check_args(&args) {
        eprintln!("socklb-bench: {e}\n{USAGE}");
        return ExitCode::FAILURE;
    }
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
    let mut settings = Settings::new(quick);
    settings.only = match args
        .windows(2)
        .find(|w| w[0] == "--only")
        .map(|w| w[1].as_str())
    {
        None => None,
        Some("kernel") => Some(Part::Kernel),
        Some("control-plane") => Some(Part::ControlPlane),
        Some("listing") => Some(Part::Listing),
        Some("outside") => Some(Part::Outside),
        Some("concurrent") => Some(Part::Concurrent),
        Some(other) => {
            eprintln!(
                "socklb-bench: --only {other}: kernel, control-plane, listing, outside or concurrent"
            );
            return ExitCode::FAILURE;
        }
    };
    // Ctrl-C, a stop or a closed terminal tears down whichever sandbox the run is in.
    if let Err(e) = socklb_tests::sandbox::teardown_on_signal() {
        eprintln!("socklb-bench: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = run(&settings, &out, criterion.as_deref());
    // A signal is tearing the sandbox down (and failed the run as it went): let it finish; its
    // handler ends the process.
    socklb_tests::sandbox::wait_if_interrupted();
    match result {
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
        cpus: cpus(),
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_default(),
        iptables: iptables_version(),
        quick: s.quick,
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        passes: s.passes,
        rounds: s.plan.rounds,
        batch: s.plan.batch,
        services: s.services,
    }
}

/// The smaller numbers of services measured beside `n` for the charts (ascending); one only in
/// the check run of a debug build, which only shows that the benchmarks run.
fn smaller_sizes(n: usize) -> Vec<usize> {
    let sizes: &[usize] = if cfg!(debug_assertions) {
        &[n / 3]
    } else {
        &[n / 10, n / 3]
    };
    sizes.iter().copied().filter(|m| *m > 0).collect()
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

fn run(s: &Settings, out: &Path, criterion: Option<&Path>) -> anyhow::Result<Report> {
    let mut report = Report {
        environment: Some(environment(s)),
        micro: criterion.map(micro).transpose()?.unwrap_or_default(),
        ..Report::default()
    };
    let sandbox = match s.only {
        Some(Part::ControlPlane | Part::Outside) => socklb_tests::Sandbox::shared()?,
        Some(Part::Listing) => listing_only(s, &mut report)?,
        _ => data_path(s, &mut report)?,
    };
    if matches!(s.only, None | Some(Part::ControlPlane)) {
        control_plane(s, &sandbox, &mut report)?;
    }
    drop(sandbox);
    if matches!(s.only, None | Some(Part::Outside)) {
        eprintln!(
            "outside: NodePort from outside through socklb's and kube-proxy's rules, 1 and {} services",
            s.services
        );
        let o = socklb_tests::bench::outside::measure(
            s.services,
            s.outside_passes,
            s.outside_connects,
        )?;
        for c in &o.cases {
            eprintln!(
                "  {:<22} {:>6} services  connect {}  requests {}  failed {}",
                c.case,
                c.services,
                c.connect_ratio.show(3),
                c.requests_ratio.show(3),
                c.failures
            );
        }
        for i in &o.install {
            eprintln!(
                "  install {:>6} services {:>8.2} s  {}",
                i.services, i.seconds, i.what
            );
        }
        report.outside = Some(o);
    }
    report.write(out)?;
    Ok(report)
}

fn print_costs(costs: &[kernel::KernelCost]) {
    for k in costs {
        eprintln!(
            "  {:<70} {:>16} ns  ratio {}",
            k.name,
            k.socklb_ns.show(0),
            k.ratio.show(2)
        );
    }
}

/// The kernel cost of the programs and the data path's latency; hands back the sandbox for the
/// control plane.
///
/// IPv6 services installed for the kernel rows that spread IPv6 connects (and the IPv4 row
/// beside them, over as many): enough that the lookups miss the caches, few enough that the
/// IPv4 world's maps keep their size.
const IPV6_SERVICES: usize = 2_000;

fn data_path(s: &Settings, report: &mut Report) -> anyhow::Result<Arc<socklb_tests::Sandbox>> {
    eprintln!("data path: setting up the sandbox");
    let mut world = World::new()?;
    eprintln!("data path: installing {} other services", s.services);
    report.load = Some(world.set_services(s.services)?);
    let pins = world.sandbox.pin_folder();
    if s.only == Some(Part::Concurrent) {
        concurrent(s, &world, report)?;
        world.stop_agent();
        drop(world.runners);
        return Ok(world.sandbox);
    }

    let services6 = IPV6_SERVICES.min(s.services);
    eprintln!("kernel cost: installing {services6} IPv6 services for the IPv6 spread rows");
    world.set_ipv6_services(services6)?;
    report.index = Some(world.index_share()?);
    eprintln!(
        "kernel cost: {} pairs of passes x {} calls per workload, beside empty programs",
        s.passes, s.kernel_calls
    );
    report.kernel = kernel::program_costs(
        &mut world,
        &pins,
        s.passes,
        s.kernel_calls,
        "socket recorded (default)",
        false,
    )?;
    print_costs(&report.kernel);
    // Only the kernel rows have them: the sections after measure the IPv4 world alone.
    world.set_ipv6_services(0)?;
    if s.only == Some(Part::Kernel) {
        return without_tcp_records(s, world, &pins, report);
    }
    report.close = Some(kernel::close_cost(
        &mut world,
        &pins,
        s.passes,
        s.kernel_calls,
    )?);
    let scenarios = [
        Scenario::tcp_hot(),
        Scenario::tcp_cold(s.services),
        Scenario::udp(Traffic::UdpUnconnected),
        Scenario::udp(Traffic::UdpConnected),
    ];
    for scenario in &scenarios {
        eprintln!(
            "data path: {} ({} rounds x {} per case)",
            scenario.name, s.plan.rounds, s.plan.batch
        );
        let r = datapath::measure(&mut world, scenario, &s.plan)?;
        for c in &r.cases {
            eprintln!(
                "  {:<17} p50 {:>7.1} us  p99 {:>7.1} us  ratio {}  failed {}{}",
                c.case.to_string(),
                c.p50_us,
                c.p99_us,
                c.p50_ratio.show(3),
                c.failures,
                if c.errors.is_empty() {
                    String::new()
                } else {
                    format!(" {:?}", c.errors)
                }
            );
        }
        report.scenarios.push(r);
    }
    // The spread-connect scenario at smaller numbers of services too, for the chart against
    // the number of services (after the figures above, so the load time stays from zero).
    for n in smaller_sizes(s.services).into_iter().rev() {
        eprintln!("data path: spread connects over {n} services");
        world.set_services(n)?;
        report.scaling.push(datapath::measure(
            &mut world,
            &Scenario::tcp_cold(n),
            &s.plan,
        )?);
    }
    report.scaling.reverse();
    report.scaling.extend(
        report
            .scenarios
            .iter()
            .find(|r| r.name.starts_with("TCP connect, spread"))
            .cloned(),
    );
    world.set_services(s.services)?;
    eprintln!(
        "data path: listing {} live sockets beside the kernel's own listing",
        s.listing_sockets
    );
    report.listing = Some(listing::listing_cost(&world, s.listing_sockets, s.passes)?);
    concurrent(s, &world, report)?;
    without_tcp_records(s, world, &pins, report)
}

/// Several clients at once, then one at a time for the CPU time per connect.
fn concurrent(s: &Settings, world: &World, report: &mut Report) -> anyhow::Result<()> {
    let clients = 2 * cpus();
    eprintln!("data path: {clients} clients at once, {} passes", s.passes);
    let c = datapath::concurrent(world, clients, s.concurrent_connects, s.passes)?;
    eprintln!(
        "  connects/s {}  p99 {}  CPU per connect {} ({:.1} us / {:.1} us)",
        c.throughput_ratio.show(3),
        c.p99_ratio.show(3),
        c.cpu_ratio.show(3),
        c.cpu_socklb_us.median,
        c.cpu_direct_us.median
    );
    report.concurrent = Some(c);
    Ok(())
}

/// `--only listing`: the world with its services and the listing's cost, nothing else.
fn listing_only(s: &Settings, report: &mut Report) -> anyhow::Result<Arc<socklb_tests::Sandbox>> {
    let mut world = World::new()?;
    report.load = Some(world.set_services(s.services)?);
    eprintln!("listing {} live sockets", s.listing_sockets);
    report.listing = Some(listing::listing_cost(&world, s.listing_sockets, s.passes)?);
    world.stop_agent();
    drop(world.runners);
    Ok(world.sandbox)
}

/// The hit's kernel cost again with `--tcp-peer-name backend` (no TCP record at all); hands
/// back the sandbox.
fn without_tcp_records(
    s: &Settings,
    mut world: World,
    pins: &std::path::Path,
    report: &mut Report,
) -> anyhow::Result<Arc<socklb_tests::Sandbox>> {
    eprintln!("kernel cost: the hit again while socklb monitor reads the decisions");
    let (costs, seen) = kernel::monitor_costs(&mut world, pins, s.passes, s.kernel_calls)?;
    report.kernel_monitor = costs;
    report.monitor_decisions = seen;
    print_costs(&report.kernel_monitor);
    report.verifier = Some(verifier(s, pins)?);
    eprintln!("kernel cost: the agent again with --tcp-peer-name backend");
    world.restart_agent(&["--tcp-peer-name", "backend"])?;
    report.kernel_no_tcp_record = kernel::program_costs(
        &mut world,
        pins,
        s.passes,
        s.kernel_calls,
        "no record (--tcp-peer-name backend)",
        true,
    )?;
    print_costs(&report.kernel_no_tcp_record);
    world.stop_agent();
    drop(world.runners);
    Ok(world.sandbox)
}

/// The verifier's cost at a start: the system CPU of loading every program (`socklb version
/// --features`, as an agent's start loads them), and each attached program's verified
/// instructions.
fn verifier(s: &Settings, pins: &std::path::Path) -> anyhow::Result<report::Verifier> {
    let mut system = Vec::new();
    for _ in 0..s.passes.min(5) {
        let child = std::process::Command::new(socklb_tests::bins::socklb()?)
            .args(["version", "--features", "-o", "json"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let pid = i32::try_from(child.id())?;
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child by pid, into valid locations.
        if unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) } != pid {
            anyhow::bail!("wait4: {}", std::io::Error::last_os_error());
        }
        let stime = usage.ru_stime;
        system.push(stime.tv_sec as f64 + stime.tv_usec as f64 / 1e6);
    }
    let out = std::process::Command::new(socklb_tests::bins::socklb()?)
        .args(["version", "--features", "-o", "json"])
        .output()?;
    let versions: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let parts_on = versions["kernel"]["features"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["state"] == "enabled")
        .filter_map(|p| p["feature"].as_str().map(str::to_owned))
        .collect();
    let programs = socklb::dataplane::loader::attached_programs(
        &socklb::dataplane::pins::PinFolder::new(pins),
    )?
    .into_iter()
    .map(|p| (p.name, p.verified_instructions.unwrap_or(0)))
    .collect();
    Ok(report::Verifier {
        load_system_s: socklb_tests::bench::stats::Spread::of(&system),
        programs,
        parts_on,
    })
}

/// A full sync beside a bare write loop, single changes and a rolling update, and the agent in
/// API mode.
fn control_plane(
    s: &Settings,
    sandbox: &socklb_tests::Sandbox,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!(
        "control plane: full sync of {} x 10, {} passes, beside a bare write loop",
        s.cp_services, s.passes
    );
    report.full_sync = Some(controlplane::full_sync_floor(
        sandbox,
        s.cp_services,
        10,
        s.passes,
    )?);
    for n in smaller_sizes(s.cp_services) {
        eprintln!("control plane: full sync of {n} x 10, for the chart");
        report
            .full_sync_scaling
            .push(controlplane::full_sync_floor(sandbox, n, 10, s.passes)?);
    }
    report.full_sync_scaling.extend(report.full_sync.clone());
    eprintln!("control plane: single changes and a rolling update, in process");
    report.changes.push(controlplane::in_memory(
        s.cp_services,
        10,
        s.cp_changes,
        s.cp_rolling,
    )?);
    report.changes.push(controlplane::bpf_maps(
        sandbox,
        s.cp_services,
        10,
        s.cp_changes,
        s.cp_rolling,
    )?);
    eprintln!(
        "control plane: the agent in API mode, {} realistic services, then {}",
        s.cp_services / 2,
        s.cp_services
    );
    report.api_half = Some(controlplane::api_mode(sandbox, s.cp_services / 2, 0)?);
    report.api = Some(controlplane::api_mode(
        sandbox,
        s.cp_services,
        s.api_changes,
    )?);
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::check_args;

    fn args(words: &[&str]) -> Vec<String> {
        std::iter::once("socklb-bench")
            .chain(words.iter().copied())
            .map(String::from)
            .collect()
    }

    #[test]
    fn only_known_arguments_start_a_run() {
        assert!(check_args(&args(&[])).is_ok());
        assert!(check_args(&args(&["--quick", "--only", "kernel", "--out", "/tmp/b"])).is_ok());
        assert!(
            check_args(&args(&["--only"])).is_err(),
            "a flag without its value"
        );
        assert!(check_args(&args(&["--qiuck"])).is_err(), "a typo");
        assert!(check_args(&args(&["kernel"])).is_err(), "a bare word");
    }
}
