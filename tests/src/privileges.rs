//! Whether privileged tests can run here. Under CI=true they must: a missing privilege or
//! kernel feature fails the run loudly. Elsewhere a test skips with a one-line reason.
use std::path::Path;

/// What is missing for privileged tests, if anything.
pub fn missing() -> Option<String> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root".into());
    }
    if crate::system::cgroup2_mount().is_none() {
        return Some("no cgroup v2 mount".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    if std::process::Command::new("ip").arg("-V").output().is_err() {
        return Some("iproute2 (ip) is not installed; run `cargo xtask setup`".into());
    }
    None
}

/// Call first in every privileged test: `if !socklb_tests::privileged("name") { return; }`.
/// Panics under CI=true when the test cannot run.
pub fn privileged(test: &str) -> bool {
    let Some(reason) = missing() else {
        return true;
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "privileged test {test} cannot run under CI=true: {reason}"
    );
    eprintln!("skipping {test}: {reason}");
    false
}
