//! `cargo xtask demo`, run non-interactively: every claim it makes must hold, as the kernel
//! allows and with every optional part refused; and whichever way it ends (its agent fails to
//! start, it panics, SIGTERM, SIGHUP when the terminal closes) it leaves nothing behind.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use socklb_tests::system::{end_leftovers_of, read_until};

fn demo() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_socklb-demo"));
    cmd.arg("--non-interactive");
    cmd
}

fn run_to_the_end(cmd: &mut Command) -> (bool, String, u32) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("the demo ends");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, pid)
}

#[test]
fn the_demo_holds_every_claim() {
    socklb_tests::require_privileges!();
    let (ok, text, pid) = run_to_the_end(&mut demo());
    assert!(ok, "the demo failed:\n{text}");
    assert!(text.contains("claims shown held."), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    // Where the machine's parts are known (CI), every claim is shown: none stands in for one.
    if let Some(parts) = socklb_tests::features::required_parts() {
        use socklb::dataplane::features::Feature;
        if parts.contains(&Feature::SockDiagStorage) || parts.contains(&Feature::SocketsIterator) {
            assert!(!text.contains("NOT SHOWN"), "{text}");
        }
    }
    assert!(!text.contains('\x1b'), "no terminal colour codes in a pipe");
    assert_eq!(end_leftovers_of(pid), Vec::<String>::new());
}

/// As on a kernel that refuses every optional part: the core claims all hold and the demo says
/// which parts are off and what is lost.
#[test]
fn the_demo_holds_its_core_claims_with_every_optional_part_off() {
    socklb_tests::require_privileges!();
    let (ok, text, pid) = run_to_the_end(demo().env("SOCKLB_DISABLE_FEATURE", "all"));
    assert!(ok, "the demo failed:\n{text}");
    assert!(text.contains("claims shown held."), "{text}");
    // `inspect connections` run on its own lists TCP sockets through sock_diag even where
    // the agent's parts are off; where it could not, the claim is NOT SHOWN, never passed.
    assert!(
        text.contains("the held connection is listed on A") || text.contains("NOT SHOWN"),
        "{text}"
    );
    assert!(
        text.contains("optional part sockets-iterator") && text.contains("turned off"),
        "says which part is off: {text}"
    );
    assert!(text.contains("lost: "), "says what is lost: {text}");
    assert_eq!(end_leftovers_of(pid), Vec::<String>::new());
}

/// An agent that cannot start, and a panic half-way: the demo fails and cleans up.
#[test]
fn a_failed_demo_leaves_nothing() {
    socklb_tests::require_privileges!();
    // A backend array the kernel cannot allocate: the agent's start fails.
    let (ok, text, pid) = run_to_the_end(demo().env("SOCKLB_MAX_BACKENDS", "4000000000"));
    assert!(!ok, "the demo cannot pass without an agent:\n{text}");
    assert!(text.contains("creating map BACKENDS"), "{text}");
    assert_eq!(end_leftovers_of(pid), Vec::<String>::new(), "{text}");

    let (ok, text, pid) = run_to_the_end(demo().env("SOCKLB_DEMO_PANIC_AT_STEP", "4"));
    assert!(!ok, "{text}");
    assert!(text.contains("panicking on purpose"), "{text}");
    assert_eq!(end_leftovers_of(pid), Vec::<String>::new(), "{text}");
}

/// SIGTERM (a stop) and SIGHUP (the terminal closed) while the demo runs: it tears its sandbox
/// down before it exits.
#[test]
fn a_signalled_demo_leaves_nothing() {
    socklb_tests::require_privileges!();
    for signal in [libc::SIGTERM, libc::SIGHUP] {
        let mut child = demo()
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run the demo");
        let pid = child.id();
        // Wait until the sandbox exists and the agent serves (step 3 starts after it).
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let seen = read_until(&mut lines, "3. ", Duration::from_mins(1));
        assert!(seen.contains("3. "), "the demo did not get going:\n{seen}");
        // SAFETY: signalling our own unreaped child by PID.
        unsafe { libc::kill(i32::try_from(pid).expect("pid"), signal) };
        // Keep reading so the demo never blocks on a full pipe while it cleans up.
        std::thread::spawn(move || for _ in lines {});
        let status = child.wait().expect("the demo exits");
        assert!(!status.success(), "signal {signal}: {status}");
        assert_eq!(
            end_leftovers_of(pid),
            Vec::<String>::new(),
            "signal {signal}"
        );
    }
}
