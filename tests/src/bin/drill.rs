//! `sandbox-drill`: a run that is signalled at a chosen moment, for the tests of the signal
//! handler (`socklb_tests::sandbox::teardown_on_signal`) in `tests/bench.rs`.
//!
//! `sandbox-drill drop-then-signal`: builds a shared sandbox with three backend pods (their
//! namespaces and servers), drops its last handle on another thread, as a failed phase
//! unwinding does, and signals itself (SIGTERM) as soon as that drop has begun, so the signal
//! arrives while the sandbox's `Drop` is still tearing it down and the handler can no longer
//! reach the sandbox. The handler must wait for that teardown before it exits (128 + 15); once,
//! it exited at once and left the rest of the sandbox behind.
use std::sync::Arc;

use anyhow::bail;
use socklb_tests::sandbox::{self, Sandbox};

fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("drop-then-signal") => drop_then_signal(),
        other => bail!("usage: sandbox-drill drop-then-signal (got {other:?})"),
    }
}

fn drop_then_signal() -> anyhow::Result<()> {
    sandbox::teardown_on_signal()?;
    let sandbox = Sandbox::shared()?;
    for ip in ["10.244.1.21", "10.244.2.34", "10.244.3.47"] {
        sandbox.add_backend(format!("{ip}:8080").parse()?, false)?;
    }
    let weak = Arc::downgrade(&sandbox);
    let dropper = std::thread::spawn(move || drop(sandbox));
    while weak.strong_count() > 0 {
        std::thread::yield_now();
    }
    eprintln!("drill: the last handle is gone, its teardown has begun: signalling");
    // SAFETY: signalling this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    let _ = dropper.join();
    // The handler ends the process with 128 + the signal; this thread must not end it first.
    sandbox::wait_if_interrupted();
    bail!("the signal's handler did not end the process")
}
