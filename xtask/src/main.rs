//! socklb's developer commands. Every command runs `setup` first for what it uses (and nothing
//! more), so a fresh clone needs only `cargo xtask demo` and `cargo xtask test`.
mod parallel;
mod setup;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// What to do (parsed by hand: xtask builds first in every fresh clone, and a derive-based
/// parser would cost it most of its build time).
enum Task {
    /// Only what building needs (`rust-src`, `bpf-linker`): for container builds.
    Setup {
        build_only: bool,
    },
    Demo {
        non_interactive: bool,
    },
    Test,
    Stress,
    Bench {
        quick: bool,
    },
}

const USAGE: &str = "\
socklb's developer commands

Usage: cargo xtask <COMMAND>

Commands:
  setup [--build-only]       Install what every command needs (rust-src, bpf-linker, Debian
                             and PyPI packages); --build-only: only what building needs. Each
                             command below installs what it uses, and only that, first
  demo [--non-interactive]   The main job, with no cluster: the seed scenarios on real sockets
  test                       Everything CI checks: fmt, clippy (userspace and eBPF), unit,
                             golden, property and privileged tests, fuzzing, a bench check
  bench [--quick]            The data path beside kube-proxy's iptables and nftables layouts,
                             and the control plane; writes target/bench/report.md
  stress                     The long reliability runs; writes target/stress/figures.md
";

impl Task {
    fn parse(args: &[String]) -> anyhow::Result<Self> {
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(match words.as_slice() {
            ["setup"] => Self::Setup { build_only: false },
            ["setup", "--build-only"] => Self::Setup { build_only: true },
            ["demo"] => Self::Demo {
                non_interactive: false,
            },
            ["demo", "--non-interactive"] => Self::Demo {
                non_interactive: true,
            },
            ["test"] => Self::Test,
            ["stress"] => Self::Stress,
            ["bench"] => Self::Bench { quick: false },
            ["bench", "--quick"] => Self::Bench { quick: true },
            _ => bail!("unknown arguments {words:?}\n\n{USAGE}"),
        })
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty()
        || args
            .iter()
            .any(|a| a == "--help" || a == "-h" || a == "help")
    {
        print!("{USAGE}");
        return if args.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    match Task::parse(&args).and_then(|task| run(&task)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: &Task) -> anyhow::Result<()> {
    // Each command asks setup for what it runs and nothing else.
    let needs = match task {
        Task::Setup { build_only: true } => setup::Needs::BUILD,
        // Everything any command uses (the test's needs cover the others').
        Task::Setup { build_only: false } | Task::Test => setup::Needs::TEST,
        Task::Demo { .. } => setup::Needs::DEMO,
        Task::Bench { .. } => setup::Needs::BENCH,
        Task::Stress => setup::Needs::STRESS,
    };
    setup::run(needs)?;
    match task {
        Task::Setup { .. } => Ok(()),
        Task::Demo { non_interactive } => demo(*non_interactive),
        Task::Test => test(),
        Task::Bench { quick } => bench(*quick, false),
        Task::Stress => stress(),
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command in the workspace root, failing if it fails.
pub fn cmd(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

fn step(name: &str, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    eprintln!("\n==> {name}");
    let start = Instant::now();
    f().with_context(|| format!("step `{name}`"))?;
    eprintln!("==> {name}: ok ({:.1}s)", start.elapsed().as_secs_f64());
    Ok(())
}

fn demo(non_interactive: bool) -> anyhow::Result<()> {
    step("build", || {
        cmd("cargo", &["build", "--workspace", "--bins"])
    })?;
    let demo = workspace_root().join("target/debug/socklb-demo");
    let mut args = vec![];
    if non_interactive {
        args.push("--non-interactive");
    }
    let status = Command::new(demo).args(&args).status()?;
    if !status.success() {
        bail!("the demo reported a failed claim");
    }
    Ok(())
}

fn test() -> anyhow::Result<()> {
    let start = Instant::now();
    step("cargo fmt --check", || {
        cmd("cargo", &["fmt", "--all", "--check"])
    })?;
    step("clippy (eBPF, bpfel-unknown-none)", clippy_ebpf)?;
    step(
        "deploy manifests (kubernetes-validate --strict)",
        validate_deploy,
    )?;
    let mut jobs = Vec::new();
    step(
        "clippy and build: binaries, examples, benches and tests, clippy-driver compiling \
         the workspace's crates with warnings as errors (and list each test binary's tests)",
        || {
            jobs = test_jobs(&parallel::build()?)?;
            Ok(())
        },
    )?;
    step(
        "tests (unit, golden, property, privileged end-to-end; then those that depend on an \
         optional part again with every one off, SOCKLB_DISABLE_FEATURE=all), three processes \
         at a time",
        || parallel::run(jobs, TEST_PROCESSES_AT_ONCE, STRESS_RUN_LIMIT),
    )?;
    // The fuzz target builds with flags of its own, so its dependencies again: only the pure
    // layers' (lb-userspace without its `agent` feature). Built beside the other steps, even
    // at the lowest priority, it slowed them by as much as it saved: the machine has no idle
    // CPU to give it.
    step("build the fuzz target", || {
        let status = cargo_fuzz("build")
            .args(FUZZ_TARGET)
            .current_dir(workspace_root())
            .status()
            .context("running cargo fuzz build")?;
        if !status.success() {
            bail!("building the fuzz target failed ({status})");
        }
        Ok(())
    })?;
    step("fuzz manifests (20 s)", || fuzz(20).map(|_| ()))?;
    // Benchmarks are not pass/fail: this only checks that they run and write their report.
    step(
        "cargo xtask bench --quick (runs, writes its report)",
        || bench(true, true),
    )?;
    eprintln!(
        "\nall checks passed in {:.0}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Test processes running at once: their tests mostly wait (agents, sockets, timeouts).
const TEST_PROCESSES_AT_ONCE: usize = 3;

/// The end-to-end binary (`tests/tests/e2e`), run in shards of one module each.
const E2E: &str = "e2e";

/// The end-to-end modules whose tests take longest, first (so the last to start are short).
const SLOWEST_FIRST: [&str; 10] = [
    "dataplane",
    "isolation",
    "agent",
    "conformance_changes",
    "reliability",
    "tenants",
    "deploy",
    "features",
    "demo",
    "node",
];

/// The end-to-end modules whose behaviour depends on an optional part or on the cgroup
/// layout, run a second time as on a kernel that refuses every optional part (the agents
/// these tests start read the variable as their `--disable-feature`): the whole module, or the
/// tests whose names start with one of the prefixes. A prefix that matches no test fails the
/// run. The data path's translation with every part off is `features`'s.
const AGAIN_WITHOUT_OPTIONAL_PARTS: [(&str, &[&str]); 8] = [
    ("agent", &[]),
    (
        "dataplane",
        &[
            "connected_udp_socket_terminated",
            "connected_udp_sockets_listed",
            "connected_udp_slot_freed",
            "tcp_slot_freed_after_a_failed_connect",
            "tcp_slot_freed_after_reconnecting_elsewhere",
            "udp_reverse_translation",
            "established_connection_stays",
            "verifier_accepts_every_program",
        ],
    ),
    ("tenants", &[]),
    ("connections", &[]),
    ("node", &[]),
    ("reliability", &[]),
    ("deploy", &[]),
    ("fail_static", &[]),
];

/// The jobs in the order they run: the end-to-end modules slowest first, the reruns with
/// every optional part off right after the first long ones (so they do not end the run
/// alone), then every other binary whole.
fn test_jobs(binaries: &[Arc<parallel::Binary>]) -> anyhow::Result<Vec<parallel::Job>> {
    let labels = parallel::labels(binaries);
    let mut e2e = Vec::new();
    let mut others = Vec::new();
    let mut again = Vec::new();
    for (binary, label) in binaries.iter().zip(labels) {
        if binary.name != E2E {
            others.push(parallel::Job::whole(binary, label));
            continue;
        }
        let mut modules = parallel::modules(binary);
        let rank = |m: &String| {
            SLOWEST_FIRST
                .iter()
                .position(|n| n == m)
                .unwrap_or(SLOWEST_FIRST.len())
        };
        modules.sort_by_key(rank);
        for module in modules {
            e2e.push(parallel::Job {
                binary: binary.clone(),
                label: format!("{label} {module}"),
                tests: Some(parallel::select(binary, &module, &[])?),
                envs: Vec::new(),
            });
        }
        for (module, prefixes) in AGAIN_WITHOUT_OPTIONAL_PARTS {
            again.push(parallel::Job {
                binary: binary.clone(),
                label: format!("{label} {module} (SOCKLB_DISABLE_FEATURE=all)"),
                tests: Some(parallel::select(binary, module, prefixes)?),
                envs: vec![("SOCKLB_DISABLE_FEATURE".into(), "all".into())],
            });
        }
    }
    anyhow::ensure!(!e2e.is_empty(), "no test binary named {E2E} was built");
    let at = e2e.len().min(4);
    let mut jobs = e2e;
    jobs.splice(at..at, again);
    jobs.extend(others);
    Ok(jobs)
}

/// cargo fuzz's arguments for the manifests target, after the action (`build`, `run`).
const FUZZ_TARGET: [&str; 6] = [
    "--fuzz-dir",
    "lb-userspace/fuzz",
    "--sanitizer",
    "none",
    // Unoptimised: it builds in half the time, and the fuzzing here is about finding
    // crashes, not about the number of runs.
    "--dev",
    "manifests",
];

/// `cargo fuzz <action>`, on the stable toolchain. Warnings are errors: the fuzz target's build
/// is the only one of lb-userspace without its `agent` feature, which clippy does not check
/// (cargo caps the dependencies' lints). `build` and `run` must agree on the flags, or `run`
/// builds again.
fn cargo_fuzz(action: &str) -> Command {
    let mut command = Command::new(setup::cargo_fuzz_bin());
    command
        .args(["fuzz", action])
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", "-D warnings");
    command
}

/// Runs the cargo-fuzz target for `seconds`; returns libFuzzer's summary line.
fn fuzz(seconds: u64) -> anyhow::Result<String> {
    let root = workspace_root();
    let corpus = root.join("target/fuzz-corpus");
    std::fs::create_dir_all(&corpus)?;
    let out = cargo_fuzz("run")
        .args(FUZZ_TARGET)
        .arg(&corpus)
        .args([
            "examples/seed",
            "examples/scenarios/003-selector-typo",
            "lb-userspace/tests/golden/rejected-objects",
        ])
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .current_dir(&root)
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::piped())
        .output()?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        eprintln!("{log}");
        bail!("the fuzzer found a problem (see lb-userspace/fuzz/artifacts)");
    }
    let done = log
        .lines()
        .rev()
        .find(|l| l.starts_with("Done "))
        .unwrap_or("Done: no summary")
        .to_string();
    eprintln!("{done}");
    Ok(done)
}

/// How long one long test run may take before it is stopped (they take a few minutes).
const STRESS_RUN_LIMIT: Duration = Duration::from_mins(25);

/// The isolation runs at scale: how many connected UDP sockets the greedy tenant holds, and how
/// many times the backend sets shrink and grow under the connect storm (the `cargo xtask test`
/// defaults are 140,000 and 1,000).
const STRESS_HELD_SOCKETS: &str = "500000";
const STRESS_STORM_CYCLES: &str = "10000";

/// The long runs; prints and writes the figures.
fn stress() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut figures = Vec::new();
    // The tests run the binaries next to them (target/release): build them first.
    step("build (release)", || {
        cmd("cargo", &["build", "--release", "--workspace", "--bins"])
    })?;
    step("long reliability runs (rolling updates, kill -9)", || {
        let out = cargo_within(
            &[
                "test",
                "--release",
                "-p",
                "socklb-tests",
                "--test",
                E2E,
                "--",
                "reliability::",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ],
            &[],
            STRESS_RUN_LIMIT,
        )?;
        figures.extend(figure_lines(&out));
        Ok(())
    })?;
    step("tenant isolation at scale", || {
        let out = cargo_within(
            &[
                "test",
                "--release",
                "-p",
                "socklb-tests",
                "--test",
                E2E,
                "--",
                "isolation::",
                "--nocapture",
                "--test-threads=1",
            ],
            &[
                ("SOCKLB_HELD_SOCKETS", STRESS_HELD_SOCKETS),
                ("SOCKLB_STORM_CYCLES", STRESS_STORM_CYCLES),
            ],
            STRESS_RUN_LIMIT,
        )?;
        figures.extend(figure_lines(&out));
        Ok(())
    })?;
    let cases = "200000";
    step("property tests, 200,000 cases each", || {
        cargo_within(
            &[
                "test",
                "--release",
                "-p",
                "lb-userspace",
                "--test",
                "integration",
                "properties::",
            ],
            &[("PROPTEST_CASES", cases)],
            STRESS_RUN_LIMIT,
        )
        .context("a property failed")
        .map(|_| ())
    })?;
    figures.push(format!("property-test cases per property: {cases}"));
    let done = fuzz(300)?;
    figures.push(format!("fuzz (5 minutes): {done}"));
    let text = figures.iter().fold(String::new(), |mut text, figure| {
        let _ = writeln!(text, "- {figure}");
        text
    });
    std::fs::create_dir_all(root.join("target/stress"))?;
    std::fs::write(root.join("target/stress/figures.md"), &text)?;
    println!("\n{text}");
    Ok(())
}

/// The `FIGURE ...` lines of a test run's output, without the marker.
fn figure_lines(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.split_once("FIGURE ").map(|(_, f)| f.to_string()))
        .collect()
}

/// Runs `cargo ARGS` in the workspace root with `envs`, echoing its output as it comes, and
/// returns stdout and stderr together. Past `limit` it is stopped (SIGTERM to its process
/// group, SIGKILL 10 s later: the test processes cargo started go too; what their sandboxes
/// leave is swept by the next run) and the step fails.
fn cargo_within(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> anyhow::Result<String> {
    use std::{
        io::{BufRead as _, BufReader},
        os::unix::process::CommandExt as _,
        process::Stdio,
        sync::mpsc,
    };
    let mut child = Command::new("cargo")
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("running cargo")?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let _ = tx.send(line);
            }
        })
    })
    .collect();
    drop(tx);
    let group = i32::try_from(child.id()).context("pid")?;
    let start = Instant::now();
    let mut signalled: Option<Instant> = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        match signalled {
            None if start.elapsed() > limit => {
                eprintln!(
                    "xtask: `cargo {}` ran past {limit:?}: stopping it",
                    args.join(" ")
                );
                // SAFETY: signals the process group of the child started above.
                unsafe { libc::kill(-group, libc::SIGTERM) };
                signalled = Some(Instant::now());
            }
            Some(at) if at.elapsed() > Duration::from_secs(10) => {
                // SAFETY: as above.
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for r in readers {
        let _ = r.join();
    }
    let output: Vec<String> = rx.into_iter().collect();
    if signalled.is_some() {
        bail!("`cargo {}` did not finish within {limit:?}", args.join(" "));
    }
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(output.join("\n"))
}

/// `after_test`: run from `cargo xtask test`, whose build of the workspace's crates (by
/// clippy-driver) the criterion step reuses only when made with the same settings.
fn bench(quick: bool, after_test: bool) -> anyhow::Result<()> {
    // The quick run only checks that every benchmark runs and writes its report: it uses the
    // debug build the tests already made (its report says so), not a release build of its own.
    let profile = if quick { "debug" } else { "release" };
    if !quick {
        step("build (release)", || {
            cmd("cargo", &["build", "--release", "--workspace", "--bins"])
        })?;
    }
    if quick {
        // Each criterion benchmark once, as a test, in the test profile.
        step("criterion micro-benchmarks (each once)", || {
            // After `cargo xtask test`, built by its build: the same settings here, or cargo
            // builds the workspace's crates again.
            let mut command = Command::new("cargo");
            if after_test {
                command = parallel::with_clippy(command)?;
            }
            let status = command
                .args(["test", "--workspace", "--bench", "control_plane"])
                .current_dir(workspace_root())
                .status()
                .context("running cargo test --bench control_plane")?;
            if !status.success() {
                bail!("the criterion micro-benchmarks failed ({status})");
            }
            Ok(())
        })?;
    } else {
        step("criterion micro-benchmarks", || {
            cmd(
                "cargo",
                &[
                    "bench",
                    "-p",
                    "lb-userspace",
                    "--bench",
                    "control_plane",
                    "--",
                    "--noplot",
                ],
            )
        })?;
    }
    let root = workspace_root();
    let out = root.join("target/bench");
    let _ = std::fs::remove_file(out.join("report.md"));
    step("socklb-bench", || {
        let mut c = Command::new(root.join(format!("target/{profile}/socklb-bench")));
        if quick {
            c.arg("--quick");
        }
        c.arg("--out").arg(&out);
        if !quick {
            c.arg("--criterion").arg(root.join("target/criterion"));
        }
        let status = c.status()?;
        if !status.success() {
            bail!("socklb-bench failed");
        }
        Ok(())
    })?;
    if !out.join("report.md").exists() {
        bail!("no report was written to {}", out.display());
    }
    Ok(())
}

/// Validates deploy/ offline: its Kubernetes objects (deploy/*.yaml, deploy/uninstall/*.yaml)
/// against the API schemas; each kustomization.yaml, not a Kubernetes object, by checking that
/// the files it lists exist and that it lists every manifest beside it.
fn validate_deploy() -> anyhow::Result<()> {
    const CHECK_KUSTOMIZATIONS: &str = r#"
import os, sys, yaml
problems = []
for path in sys.argv[1:]:
    folder = os.path.dirname(path)
    with open(path) as f:
        listed = (yaml.safe_load(f) or {}).get("resources") or []
    for entry in listed:
        if not os.path.exists(os.path.join(folder, entry)):
            problems.append(f"{path}: lists {entry}, which does not exist")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yaml") and name != "kustomization.yaml" and name not in listed:
            problems.append(f"{path}: does not list {name}")
for problem in problems:
    print(problem, file=sys.stderr)
sys.exit(1 if problems else 0)
"#;
    let deploy = workspace_root().join("deploy");
    let mut manifests = Vec::new();
    let mut kustomizations = Vec::new();
    for folder in [deploy.clone(), deploy.join("uninstall")] {
        let entries =
            std::fs::read_dir(&folder).with_context(|| format!("reading {}", folder.display()))?;
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let path_text = path.display().to_string();
            if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                kustomizations.push(path_text);
            } else {
                manifests.push(path_text);
            }
        }
    }
    manifests.sort();
    kustomizations.sort();
    let mut args = vec![
        "-m",
        "kubernetes_validate",
        "--strict",
        "--quiet",
        "-k",
        "1.34.0",
    ];
    args.extend(manifests.iter().map(String::as_str));
    cmd("python3", &args)?;
    let mut args = vec!["-c", CHECK_KUSTOMIZATIONS];
    args.extend(kustomizations.iter().map(String::as_str));
    cmd("python3", &args)
}

fn clippy_ebpf() -> anyhow::Result<()> {
    let target_dir = workspace_root().join("target/ebpf-clippy");
    let status = Command::new("cargo")
        .args([
            "clippy",
            "-p",
            "lb-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["--", "-D", "warnings"])
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
        )
        .current_dir(workspace_root())
        .status()?;
    if !status.success() {
        bail!("clippy found problems in lb-ebpf");
    }
    Ok(())
}
