//! Runs the workspace's tests a few processes at a time. Most privileged tests wait (on agents,
//! sockets, timeouts) more than they compute, so on a 2-vCPU machine three processes at once
//! take about half the time of one after another. The end-to-end binary is split into shards
//! (one per module, each given its tests' exact names), so it is linked once and still runs
//! beside itself.
//!
//! Every job knows the tests it must run, from the binary's own `--list`: a job passes only
//! when its summary counts exactly those (passed or ignored) and at least one passed. A filter
//! that matches nothing (a renamed test) fails the run instead of passing with 0 tests.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::workspace_root;

/// One test binary, as built, with the tests it lists.
#[derive(Clone, Debug)]
pub(crate) struct Binary {
    /// The target's name (`e2e`, `socklb` for a crate's unit tests, ...).
    pub name: String,
    pub executable: PathBuf,
    /// Its package's folder: cargo runs test binaries there.
    pub cwd: PathBuf,
    /// Where it comes from (package folder and target kind), shown only when another binary has
    /// the same name (a crate's library and binary).
    pub origin: String,
    /// Every test it lists, ignored ones included.
    pub tests: Vec<String>,
    /// The ignored ones (run by `cargo xtask stress`).
    pub ignored: BTreeSet<String>,
}

/// One process to run: a binary, the exact tests it runs, and its environment.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub binary: Arc<Binary>,
    /// What the summary calls it (`e2e dataplane`, `e2e agent (SOCKLB_DISABLE_FEATURE=all)`).
    pub label: String,
    /// `None`: every test of the binary; else exactly these (run with `--exact`).
    pub tests: Option<Vec<String>>,
    pub envs: Vec<(String, String)>,
}

impl Job {
    /// The whole binary.
    pub(crate) fn whole(binary: &Arc<Binary>, label: String) -> Self {
        Self {
            binary: binary.clone(),
            label,
            tests: None,
            envs: Vec::new(),
        }
    }

    /// What its summary must count: (tests run and passed, tests ignored).
    fn expected(&self) -> (usize, usize) {
        let names: Vec<&String> = self.tests.as_ref().map_or_else(
            || self.binary.tests.iter().collect(),
            |t| t.iter().collect(),
        );
        let ignored = names
            .iter()
            .filter(|n| self.binary.ignored.contains(n.as_str()))
            .count();
        (names.len() - ignored, ignored)
    }

    fn args(&self) -> Vec<String> {
        match &self.tests {
            None => Vec::new(),
            Some(names) => {
                let mut args = vec!["--exact".to_string()];
                args.extend(names.iter().cloned());
                args
            }
        }
    }
}

/// A cargo command whose compiles of the workspace's crates are clippy's, with warnings (rustc's
/// and clippy's) as errors: what `cargo clippy -- -D warnings` checks, in a build that also
/// produces the artifacts. The wrapper and its arguments are set as `cargo clippy` sets them
/// (`CLIPPY_ARGS`, split on `__CLIPPY_HACKERY__`, the interface clippy-driver has read since
/// 2019); they reach only the workspace's crates, so the dependencies are the same artifacts
/// as a plain `cargo build`'s. aya-build removes the wrapper for the eBPF programs, which are
/// built as always. Every cargo command that reuses the build's artifacts must be made with
/// this, or it compiles the workspace's crates again.
pub(crate) fn with_clippy(mut command: Command) -> anyhow::Result<Command> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("running rustc --print sysroot")?;
    ensure!(sysroot.status.success(), "rustc --print sysroot failed");
    let driver =
        PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim()).join("bin/clippy-driver");
    ensure!(
        driver.exists(),
        "{} not found: install clippy (`rustup component add clippy`)",
        driver.display()
    );
    command.env("RUSTC_WORKSPACE_WRAPPER", driver).env(
        "CLIPPY_ARGS",
        "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
    );
    Ok(command)
}

/// Lints and builds the workspace's binaries, examples, benchmarks and every test binary in
/// one cargo run, and lists each test binary's tests. A binary that lists no test fails the
/// build step (mark a target without tests `test = false`).
///
/// One run, not `cargo clippy --all-targets` then `cargo build` then `cargo test --no-run`:
/// clippy-driver compiles the workspace's own crates (`with_clippy`), so the dependencies
/// are compiled once instead of checked once and built again, and the two cores stay busy to
/// the end.
pub(crate) fn build() -> anyhow::Result<Vec<Arc<Binary>>> {
    let out = with_clippy(Command::new("cargo"))?
        .args([
            "build",
            "--workspace",
            "--bins",
            "--examples",
            // The benchmark targets only (`--benches` would also build every binary as one).
            "--bench",
            "*",
            "--tests",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build (with clippy)")?;
    if !out.status.success() {
        bail!("clippy or the build failed (the errors are above)");
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        // The benchmarks are built to be linted; `cargo xtask bench` runs them.
        if message["reason"] != "compiler-artifact"
            || message["profile"]["test"] != true
            || message["target"]["kind"][0] == "bench"
        {
            continue;
        }
        let (Some(name), Some(executable), Some(manifest)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
            message["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let cwd = PathBuf::from(manifest)
            .parent()
            .map_or_else(workspace_root, PathBuf::from);
        let folder = cwd
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        let kind = message["target"]["kind"][0].as_str().unwrap_or("test");
        let executable = PathBuf::from(executable);
        let tests = list(&executable, &cwd, false)?;
        let ignored: BTreeSet<String> = list(&executable, &cwd, true)?.into_iter().collect();
        ensure!(
            !tests.is_empty(),
            "test binary {name} ({folder} {kind}) has no test: give its target `test = false`"
        );
        binaries.push(Arc::new(Binary {
            name: name.to_string(),
            executable,
            cwd,
            origin: format!("{folder} {kind}"),
            tests,
            ignored,
        }));
    }
    if binaries.is_empty() {
        bail!("cargo test --no-run listed no test binary");
    }
    Ok(binaries)
}

/// The tests a binary lists (`--list`; with `ignored`, only the ignored ones).
fn list(executable: &PathBuf, cwd: &PathBuf, ignored: bool) -> anyhow::Result<Vec<String>> {
    let mut c = Command::new(executable);
    c.arg("--list").current_dir(cwd).stdin(Stdio::null());
    if ignored {
        c.arg("--ignored");
    }
    let out = c
        .output()
        .with_context(|| format!("listing the tests of {}", executable.display()))?;
    ensure!(
        out.status.success(),
        "listing the tests of {} failed: {}",
        executable.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

/// The test names of a `--list` output (`name: test` lines).
fn parse_list(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// The tests of `binary` in module `module` (`module::...`), in list order.
pub(crate) fn module_tests(binary: &Binary, module: &str) -> Vec<String> {
    binary
        .tests
        .iter()
        .filter(|t| t.split("::").next() == Some(module))
        .cloned()
        .collect()
}

/// The top-level modules of a binary's tests, in list order.
pub(crate) fn modules(binary: &Binary) -> Vec<String> {
    let mut seen = BTreeSet::new();
    binary
        .tests
        .iter()
        .filter_map(|t| t.split("::").next())
        .filter(|m| seen.insert(m.to_string()))
        .map(str::to_string)
        .collect()
}

/// The tests of `module` whose names (after `module::`) start with one of `prefixes`; fails
/// naming a prefix that matches nothing, so a renamed test cannot silently drop out of a run.
pub(crate) fn select(
    binary: &Binary,
    module: &str,
    prefixes: &[&str],
) -> anyhow::Result<Vec<String>> {
    let tests = module_tests(binary, module);
    ensure!(
        !tests.is_empty(),
        "{}: no test module named {module}",
        binary.name
    );
    if prefixes.is_empty() {
        return Ok(tests);
    }
    let mut out = Vec::new();
    for p in prefixes {
        let full = format!("{module}::{p}");
        let matched: Vec<&String> = tests.iter().filter(|t| t.starts_with(&full)).collect();
        ensure!(
            !matched.is_empty(),
            "{}: no test starts with {full} (renamed? update xtask's list)",
            binary.name
        );
        out.extend(matched.into_iter().cloned());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Runs `jobs` (in this order, the longest first is best) with at most `at_once` running, each
/// stopped after `limit`. Fails naming every job that failed.
pub(crate) fn run(jobs: Vec<Job>, at_once: usize, limit: Duration) -> anyhow::Result<()> {
    let queue = Arc::new(Mutex::new(VecDeque::from(jobs)));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..at_once.max(1))
        .map(|_| {
            let (queue, failed) = (queue.clone(), failed.clone());
            std::thread::spawn(move || {
                loop {
                    let job = queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .pop_front();
                    let Some(job) = job else { break };
                    if let Err(e) = run_one(&job, limit) {
                        failed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!("{}: {e:#}", job.label));
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let failed = failed.lock().unwrap_or_else(PoisonError::into_inner);
    if !failed.is_empty() {
        bail!(
            "{} test jobs failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// How each binary is named in the summary: its name, and where it comes from when another
/// one shares the name.
pub(crate) fn labels(binaries: &[Arc<Binary>]) -> Vec<String> {
    let mut origins: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for b in binaries {
        origins.entry(&b.name).or_default().insert(&b.origin);
    }
    binaries
        .iter()
        .map(|b| {
            if origins.get(b.name.as_str()).is_some_and(|o| o.len() > 1) {
                format!("{} [{}]", b.name, b.origin)
            } else {
                b.name.clone()
            }
        })
        .collect()
}

/// A libtest summary's counts (passed, failed, ignored).
fn counts(summary: &str) -> Option<(usize, usize, usize)> {
    let count = |word: &str| -> Option<usize> {
        summary
            .split(';')
            .find_map(|part| part.trim().strip_suffix(word))
            .and_then(|n| n.trim().rsplit(' ').next())
            .and_then(|n| n.parse().ok())
    };
    Some((count("passed")?, count("failed")?, count("ignored")?))
}

/// Runs one job to its end or `limit`; prints its summary line, or its whole output when it
/// failed. Fails when the summary does not count exactly the job's tests.
fn run_one(job: &Job, limit: Duration) -> anyhow::Result<String> {
    run_with_args(job, &job.args(), limit)
}

/// [`run_one`] with the binary's arguments given.
fn run_with_args(job: &Job, args: &[String], limit: Duration) -> anyhow::Result<String> {
    use std::os::unix::process::CommandExt as _;
    // A number per run: two jobs may share a binary and run at once.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let start = Instant::now();
    let log = std::env::temp_dir().join(format!(
        "socklb-test-{}-{}-{}.log",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed),
        job.binary.name,
    ));
    let file = std::fs::File::create(&log)?;
    let mut child = Command::new(&job.binary.executable)
        .current_dir(&job.binary.cwd)
        .envs(job.envs.iter().map(|(k, v)| (k, v)))
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .with_context(|| format!("running {}", job.binary.executable.display()))?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > limit {
            // The whole process group: the binary and the agents and clients it started.
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: signalling the process group of a child we spawned in its own group.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let summary = output
        .lines()
        .rev()
        .find(|l| l.starts_with("test result:"))
        .unwrap_or("")
        .to_string();
    let took = start.elapsed().as_secs_f64();
    let label = &job.label;
    match status {
        Some(s) if s.success() => {
            let (run, ignored) = job.expected();
            match counts(&summary) {
                Some((passed, 0, i)) if passed == run && i == ignored && passed > 0 => {
                    eprintln!("    {label:<55} {took:>6.1}s  {summary}");
                    Ok(summary)
                }
                _ => {
                    eprintln!("\n---- {label} ----\n{output}");
                    bail!(
                        "expected {run} tests to pass and {ignored} ignored, the binary said `{summary}`"
                    )
                }
            }
        }
        Some(s) => {
            eprintln!("\n---- {label} ({s}) ----\n{output}");
            bail!("{s} after {took:.0}s")
        }
        None => {
            eprintln!("\n---- {label} (stopped after {limit:?}) ----\n{output}");
            bail!("stopped after {limit:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, path::PathBuf, sync::Arc, time::Duration};

    use super::{Binary, Job, counts, labels, parse_list, run_with_args, select};

    fn binary(name: &str, tests: &[&str]) -> Arc<Binary> {
        Arc::new(Binary {
            name: name.to_string(),
            executable: PathBuf::from("/bin/sh"),
            cwd: std::env::temp_dir(),
            origin: "tmp test".to_string(),
            tests: tests.iter().map(|t| (*t).to_string()).collect(),
            ignored: BTreeSet::new(),
        })
    }

    /// Runs a job of a binary listing `tests` whose process is `sh -c SCRIPT`.
    fn run_script(tests: &[&str], script: &str) -> anyhow::Result<String> {
        let job = Job::whole(&binary("script", tests), "script".into());
        run_with_args(
            &job,
            &["-c".to_string(), script.to_string()],
            Duration::from_secs(30),
        )
    }

    fn summary(passed: usize, filtered: usize) -> String {
        format!(
            "test result: ok. {passed} passed; 0 failed; 0 ignored; 0 measured; {filtered} filtered out"
        )
    }

    #[test]
    fn the_list_and_the_summary_are_read_as_libtest_writes_them() {
        let listed = parse_list("a::b: test\nc: test\n\n2 tests, 0 benchmarks\n");
        assert_eq!(listed, ["a::b", "c"]);
        assert_eq!(
            counts(
                "test result: ok. 12 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 1.2s"
            ),
            Some((12, 0, 2))
        );
        assert_eq!(counts("no summary"), None);
    }

    /// A rerun that names a test no longer there (renamed) fails the run, and a module that
    /// does not exist does too.
    #[test]
    fn a_filter_that_matches_nothing_fails() {
        let b = binary("e2e", &["dataplane::udp_one", "dataplane::tcp", "agent::x"]);
        assert_eq!(
            select(&b, "dataplane", &["udp"]).expect("matches"),
            ["dataplane::udp_one"]
        );
        assert_eq!(select(&b, "agent", &[]).expect("whole"), ["agent::x"]);
        let e = select(&b, "dataplane", &["udp", "renamed"]).expect_err("no match");
        assert!(e.to_string().contains("dataplane::renamed"), "{e}");
        assert!(select(&b, "nothing", &[]).is_err());
    }

    /// A job passes only when its summary counts exactly its tests: 0 passed, or fewer than it
    /// names (a filter that lost some), fails it, whatever the exit status.
    #[test]
    fn a_job_that_runs_fewer_tests_than_it_names_fails() {
        let two = ["a", "b"];
        assert!(run_script(&two, &format!("echo '{}'", summary(2, 0))).is_ok());
        assert!(run_script(&[], &format!("echo '{}'", summary(0, 5))).is_err());
        assert!(run_script(&two, &format!("echo '{}'", summary(1, 1))).is_err());
        assert!(run_script(&two, "echo 'no summary at all'").is_err());
        assert!(run_script(&two, &format!("echo '{}'; exit 1", summary(2, 0))).is_err());
    }

    /// The summary tells apart binaries of one name from different places (a crate's library
    /// and binary), and leaves a unique name alone.
    #[test]
    fn binaries_of_one_name_are_labelled_by_origin() {
        let named = |name: &str, origin: &str| {
            Arc::new(Binary {
                origin: origin.to_string(),
                ..(*binary(name, &["t"])).clone()
            })
        };
        let binaries = [
            named("socklb", "lb-userspace lib"),
            named("socklb", "lb-userspace bin"),
            named("e2e", "tests test"),
        ];
        assert_eq!(
            labels(&binaries),
            [
                "socklb [lb-userspace lib]",
                "socklb [lb-userspace bin]",
                "e2e"
            ]
        );
    }

    /// Two jobs of one binary at once keep their own output.
    #[test]
    fn jobs_of_one_binary_at_once_keep_their_own_output() {
        let slow = std::thread::spawn(|| {
            run_script(
                &["a"],
                &format!("sleep 0.5; echo '{}; slow'", summary(1, 0)),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        let fast = run_script(&["a"], &format!("echo '{}; fast'", summary(1, 0)))
            .expect("the fast one runs");
        let slow = slow.join().expect("no panic").expect("the slow one runs");
        assert!(fast.ends_with("fast"), "{fast}");
        assert!(slow.ends_with("slow"), "{slow}");
    }
}
