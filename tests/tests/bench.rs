//! `cargo xtask bench` stopped half-way (Ctrl-C, a stop, the terminal closed) leaves nothing
//! behind, whichever phase it is in: while its first sandbox is being built, with the data
//! path's world up, and in the control plane's sandbox.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use socklb_tests::system::{end_leftovers_of, read_until};

#[test]
fn a_signalled_bench_leaves_nothing() {
    socklb_tests::require_privileges!();
    let out = std::env::temp_dir().join(format!("socklb-bench-signalled-{}", std::process::id()));
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
    let _ = std::fs::remove_dir_all(&out);
}
