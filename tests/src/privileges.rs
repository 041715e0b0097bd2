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

/// What a skipped test returns: nothing, or `Ok(())`.
pub trait Skipped {
    fn skipped() -> Self;
}

impl Skipped for () {
    fn skipped() -> Self {}
}

impl<E> Skipped for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

/// The name of the function this expands in (a test's name).
#[macro_export]
macro_rules! function_name {
    () => {{
        fn here() {}
        let path = ::std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").unwrap_or(path);
        path.rsplit("::").next().unwrap_or(path)
    }};
}

/// The first line of every privileged test: returns from it (skipped, with the reason on
/// stderr) when privileged tests cannot run here, and fails it under CI=true (see
/// [`privileged`]).
#[macro_export]
macro_rules! require_privileges {
    () => {
        if !$crate::privileged($crate::function_name!()) {
            return $crate::privileges::Skipped::skipped();
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_privileged_test_is_named_by_its_function() {
        assert_eq!(
            crate::function_name!(),
            "a_privileged_test_is_named_by_its_function"
        );
    }
}
