//! `cargo xtask bench` stopped half-way (Ctrl-C, a stop, the terminal closed) leaves nothing
//! behind, whichever phase it is in: while its first sandbox is being built, with the data
//! path's world up, and in the control plane's sandbox. Also: the bench on a kernel that cannot
//! order cgroup programs, and the signal handler while a sandbox's own `Drop` tears it down.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::Duration,
};

use socklb_tests::{
    bench::floor::REFUSE_FIRST_ENV,
    system::{end_leftovers_of, read_until},
};

/// Runs `cmd` to its end with its stderr in `log` (a file, not a pipe: nothing that outlived it
/// can keep the test waiting), then ends and lists what its sandboxes left: its exit status,
/// the leftovers (see `end_leftovers_of`) and its stderr.
fn run_logged(cmd: &mut Command, log: &Path) -> (ExitStatus, Vec<String>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("run it");
    let status = child.wait().expect("it exits");
    let left = end_leftovers_of(child.id());
    (
        status,
        left,
        std::fs::read_to_string(log).unwrap_or_default(),
    )
}

/// A file or folder a test made, removed when the test ends, also when it fails.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn a_signalled_bench_leaves_nothing() {
    socklb_tests::require_privileges!();
    let out = std::env::temp_dir().join(format!("socklb-bench-signalled-{}", std::process::id()));
    let _removed = Removed(out.clone());
    for (only, phase, signal) in [
        // Signalled as the first sandbox is being made.
        ("kernel", "data path: setting up the sandbox", libc::SIGHUP),
        // The data path's world up: client, backend and kube-proxy pods, the agent.
        ("kernel", "kernel cost: ", libc::SIGINT),
        ("control-plane", "control plane: ", libc::SIGTERM),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_socklb-bench"))
            .args(["--quick", "--only", only, "--out"])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the bench");
        let pid = child.id();
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let seen = read_until(&mut lines, phase, Duration::from_mins(2));
        assert!(
            seen.lines().any(|l| l.starts_with(phase)),
            "--only {only}: the bench never reached {phase:?}:\n{seen}"
        );
        // SAFETY: signalling our own unreaped child by PID.
        unsafe { libc::kill(i32::try_from(pid).expect("pid"), signal) };
        // Keep reading so the bench never blocks on a full pipe while it cleans up.
        let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
        let status = child.wait().expect("the bench exits");
        // A process of its sandbox that outlived it holds the pipe open (the reader would wait
        // for ever): list what it left, end those processes, then read the rest.
        let left = end_leftovers_of(pid);
        let rest = rest.join().expect("reader").join("\n");
        assert_eq!(
            status.code(),
            Some(128 + signal),
            "--only {only}, signal {signal}: exits with 128 + the signal:\n{seen}{rest}"
        );
        assert!(
            rest.contains("interrupted: cleaning up"),
            "--only {only}, signal {signal}: says it cleans up:\n{seen}{rest}"
        );
        assert_eq!(
            left,
            Vec::<String>::new(),
            "--only {only}, signal {signal}: {seen}{rest}"
        );
    }
}

/// A kernel that cannot link a program before another on a cgroup hook (no `BPF_F_BEFORE`,
/// before 6.6): the bench measures the programs' kernel cost with the empty programs after
/// socklb's in every pass (socklb's alone in the other pass of each pair), and its report says
/// so on each row.
#[test]
fn a_kernel_that_cannot_order_programs_gets_its_floors_after_only() {
    socklb_tests::require_privileges!();
    let out = std::env::temp_dir().join(format!("socklb-bench-floors-last-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("output folder");
    let _removed = Removed(out.clone());
    let (status, left, stderr) = run_logged(
        Command::new(env!("CARGO_BIN_EXE_socklb-bench"))
            .args(["--quick", "--only", "kernel", "--out"])
            .arg(&out)
            .env(REFUSE_FIRST_ENV, "1"),
        &out.join("stderr.log"),
    );
    assert!(status.success(), "{status}:\n{stderr}");
    assert_eq!(left, Vec::<String>::new(), "{stderr}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).expect("results.json"))
            .expect("results.json is JSON");
    let rows = results["kernel"].as_array().expect("kernel rows");
    assert!(!rows.is_empty(), "{results}");
    for row in rows {
        assert_eq!(row["floors_first"], false, "no pass before: {row}");
        for figure in ["ratio", "ratio_linked", "socklb_ns", "floor_ns"] {
            assert!(
                row[figure]["median"].as_f64().is_some_and(|r| r > 0.0),
                "{figure}: {row}"
            );
        }
    }
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let says =
        "floors after socklb's program in every pass (this kernel cannot link a program before it)";
    assert!(
        report
            .lines()
            .any(|l| l.contains("connect4") && l.contains(says)),
        "the report says why there is one order:\n{report}"
    );
}

/// A signal that arrives while a sandbox is being torn down by its own `Drop` (its last handle
/// gone, as when a failed phase unwinds) waits for that teardown before the process exits, and
/// nothing is left. The handler once found no sandbox it could reach, exited at once, and left
/// an agent and a server of the bench running, which hung CI.
#[test]
fn a_signal_during_a_dropped_sandboxs_teardown_waits_for_it() {
    socklb_tests::require_privileges!();
    let log = std::env::temp_dir().join(format!("socklb-drill-{}.log", std::process::id()));
    let _removed = Removed(log.clone());
    let (status, left, stderr) = run_logged(
        Command::new(env!("CARGO_BIN_EXE_sandbox-drill")).arg("drop-then-signal"),
        &log,
    );
    assert!(
        stderr.contains("its teardown has begun: signalling"),
        "the drill reached the moment it is about:\n{stderr}"
    );
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "the handler exits with 128 + the signal:\n{stderr}"
    );
    assert_eq!(left, Vec::<String>::new(), "{stderr}");
}
