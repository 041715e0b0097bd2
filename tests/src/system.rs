//! Small system helpers for the sandbox: iproute2, mounts, cgroups, processes.
use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The cgroup v2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

pub fn mount_bpffs(target: &Path) -> anyhow::Result<()> {
    let target_c = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: valid C strings, no data.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target_c.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting bpffs on {}: {}",
            target.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn unmount(target: &Path) {
    if let Ok(c) = CString::new(target.as_os_str().as_bytes()) {
        // SAFETY: valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Removes a cgroup directory, waiting briefly for exited processes to leave it.
pub fn remove_cgroup(path: &Path) {
    let start = Instant::now();
    while std::fs::remove_dir(path).is_err()
        && path.exists()
        && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The PID encoded in a sandbox name `slb<hex pid>x<2 hex digits>...`, if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    let (pid, _) = name.strip_prefix("slb")?.split_once('x')?;
    u32::from_str_radix(pid, 16).ok()
}

/// Removes what sandboxes of processes that no longer exist left behind (a run killed with
/// SIGKILL cannot clean up after itself).
pub fn sweep_stale() {
    let dead = |name: &str| owner_pid(name).is_some_and(|pid| !pid_alive(pid));
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if dead(name) {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    let tmp = std::env::temp_dir();
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name) {
                if name.ends_with("-bpffs") {
                    unmount(&entry.path());
                    let _ = std::fs::remove_dir(entry.path());
                } else if name.ends_with("-work") {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    if let Some(cg2) = cgroup2_mount()
        && let Ok(entries) = std::fs::read_dir(&cg2)
    {
        for entry in entries.flatten() {
            if dead(&entry.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sandbox_names_carry_their_owner() {
        assert_eq!(super::owner_pid("slb1a2bx03c"), Some(0x1a2b));
        assert_eq!(super::owner_pid("slbffx01-bpffs"), Some(0xff));
        assert_eq!(super::owner_pid("slbzzx01"), None);
        assert_eq!(super::owner_pid("other"), None);
    }
}
