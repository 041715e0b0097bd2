//! Runs the workspace's test binaries a few at a time instead of one after another, as
//! cargo-nextest does across binaries. Most privileged tests wait (on agents, sockets,
//! timeouts) more than they compute, so on a 2-vCPU machine three binaries at once take about
//! half the time of `cargo test`'s one at a time. Each binary's output is kept and printed when
//! it ends; the first failure is reported after every binary has run.
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

use anyhow::{Context as _, bail};

use crate::workspace_root;

/// One test binary to run, with the environment it runs under.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    /// The target's name (`dataplane`, `socklb` for a crate's unit tests, ...).
    pub name: String,
    pub executable: PathBuf,
    /// Its package's folder: cargo runs test binaries there.
    pub cwd: PathBuf,
    pub envs: Vec<(String, String)>,
    /// Arguments to the test binary (test name filters).
    pub args: Vec<String>,
    /// Where it comes from (package folder and target kind), shown only when another binary has
    /// the same name (a crate's library and binary, two packages' `metrics` tests).
    pub origin: String,
}

/// Builds every test binary of the workspace (`cargo test --no-run`) and lists them.
pub(crate) fn build() -> anyhow::Result<Vec<Job>> {
    let out = Command::new("cargo")
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed");
    }
    let mut jobs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
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
        jobs.push(Job {
            name: name.to_string(),
            executable: PathBuf::from(executable),
            cwd,
            envs: Vec::new(),
            args: Vec::new(),
            origin: format!("{folder} {kind}"),
        });
    }
    if jobs.is_empty() {
        bail!("cargo test --no-run listed no test binary");
    }
    Ok(jobs)
}

/// Runs `jobs` (in this order, the longest first is best) with at most `at_once` running, each
/// stopped after `limit`. Fails naming every binary that failed.
pub(crate) fn run(jobs: Vec<Job>, at_once: usize, limit: Duration) -> anyhow::Result<()> {
    let shared = Arc::new(shared_names(&jobs));
    let queue = Arc::new(Mutex::new(VecDeque::from(jobs)));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..at_once.max(1))
        .map(|_| {
            let (queue, failed, shared) = (queue.clone(), failed.clone(), shared.clone());
            std::thread::spawn(move || {
                loop {
                    let job = queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .pop_front();
                    let Some(job) = job else { break };
                    let label = label(&job, &shared);
                    if let Err(e) = run_one(&job, &label, limit) {
                        failed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!("{label}: {e:#}"));
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
            "{} test binaries failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// The names that binaries from more than one place have.
fn shared_names(jobs: &[Job]) -> BTreeSet<String> {
    let mut origins: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for j in jobs {
        origins.entry(&j.name).or_default().insert(&j.origin);
    }
    origins
        .into_iter()
        .filter(|(_, o)| o.len() > 1)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// How a binary's run is named in the summary: its name, where it comes from when another one
/// shares the name, and its environment and arguments.
fn label(job: &Job, shared: &BTreeSet<String>) -> String {
    let mut name = job.name.clone();
    if shared.contains(&job.name) {
        name = format!("{name} [{}]", job.origin);
    }
    let mut words: Vec<String> = job.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    words.extend(job.args.iter().cloned());
    if words.is_empty() {
        name
    } else {
        format!("{name} ({})", words.join(" "))
    }
}

/// Runs one binary to its end or `limit`; prints its summary line, or its whole output when it
/// failed. Returns the summary line (`test result: ...`).
fn run_one(job: &Job, label: &str, limit: Duration) -> anyhow::Result<String> {
    use std::os::unix::process::CommandExt as _;
    // A number per run: two binaries may share a name (a crate's library and its binary, say)
    // and run at once; a shared log would lose one's output to the other's cleanup.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let start = Instant::now();
    let log = std::env::temp_dir().join(format!(
        "socklb-test-{}-{}-{}.log",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed),
        job.name,
    ));
    let file = std::fs::File::create(&log)?;
    let mut child = Command::new(&job.executable)
        .current_dir(&job.cwd)
        .envs(job.envs.iter().map(|(k, v)| (k, v)))
        .args(&job.args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .with_context(|| format!("running {}", job.executable.display()))?;
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
    match status {
        Some(s) if s.success() => {
            eprintln!("    {label:<55} {took:>6.1}s  {summary}");
            Ok(summary)
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
    use std::{path::PathBuf, time::Duration};

    use super::{Job, label, run_one, shared_names};

    fn job(name: &str, script: &str) -> Job {
        Job {
            name: name.to_string(),
            executable: PathBuf::from("/bin/sh"),
            cwd: std::env::temp_dir(),
            envs: Vec::new(),
            args: vec!["-c".to_string(), script.to_string()],
            origin: "tmp test".to_string(),
        }
    }

    fn named(name: &str, origin: &str) -> Job {
        Job {
            name: name.to_string(),
            executable: PathBuf::from("/bin/true"),
            cwd: std::env::temp_dir(),
            envs: Vec::new(),
            args: Vec::new(),
            origin: origin.to_string(),
        }
    }

    /// The summary tells apart binaries of one name from different places (a crate's library
    /// and binary, two packages' `metrics` tests printed as two `metrics` rows), and leaves a
    /// unique name alone; a rerun of one binary is told apart by its environment.
    #[test]
    fn binaries_of_one_name_are_labelled_by_origin() {
        let mut rerun = named("dataplane", "tests test");
        rerun
            .envs
            .push(("SOCKLB_DISABLE_FEATURE".into(), "all".into()));
        let jobs = [
            named("socklb", "lb-userspace lib"),
            named("socklb", "lb-userspace bin"),
            named("dataplane", "tests test"),
            rerun.clone(),
        ];
        let shared = shared_names(&jobs);
        let labels: Vec<String> = jobs.iter().map(|j| label(j, &shared)).collect();
        assert_eq!(
            labels,
            [
                "socklb [lb-userspace lib]",
                "socklb [lb-userspace bin]",
                "dataplane",
                "dataplane (SOCKLB_DISABLE_FEATURE=all)",
            ]
        );
    }

    /// A crate's library and its binary both have the crate's name and may run at once: each
    /// keeps its own output (the shorter one's cleanup once took the longer one's, so a
    /// failure there would have printed nothing).
    #[test]
    fn binaries_of_one_name_at_once_keep_their_own_output() {
        let slow = std::thread::spawn(|| {
            run_one(
                &job("same", "sleep 0.5; echo 'test result: ok. slow'"),
                "same",
                Duration::from_secs(30),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        let fast = run_one(
            &job("same", "echo 'test result: ok. fast'"),
            "same",
            Duration::from_secs(30),
        )
        .expect("the fast one runs");
        let slow = slow.join().expect("no panic").expect("the slow one runs");
        assert_eq!(fast, "test result: ok. fast");
        assert_eq!(slow, "test result: ok. slow");
    }
}
