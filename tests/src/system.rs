//! Small system helpers for the sandbox: iproute2, mounts, cgroups, processes.
use std::{
    collections::BTreeMap,
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

/// The cgroup attach types socklb uses (`enum bpf_attach_type`), by bpftool's names.
pub const SOCKLB_ATTACH_TYPES: [(u32, &str); 8] = [
    (10, "cgroup_inet4_connect"),
    (11, "cgroup_inet6_connect"),
    (14, "cgroup_udp4_sendmsg"),
    (15, "cgroup_udp6_sendmsg"),
    (19, "cgroup_udp4_recvmsg"),
    (20, "cgroup_udp6_recvmsg"),
    (29, "cgroup_inet4_getpeername"),
    (30, "cgroup_inet6_getpeername"),
];

/// The programs attached to `cgroup` itself (not inherited), by attach type, as the kernel
/// reports them: `BPF_PROG_QUERY`, what `bpftool cgroup show` runs. Independent of socklb's
/// pins, so it also sees a link whose pin is gone.
pub fn cgroup_programs(cgroup: &Path) -> anyhow::Result<BTreeMap<&'static str, Vec<u32>>> {
    use std::os::fd::AsRawFd as _;
    /// The `BPF_PROG_QUERY` part of `union bpf_attr`, field names as the kernel's.
    #[repr(C)]
    #[allow(clippy::struct_field_names)]
    struct Query {
        target_fd: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
        _pad: u32,
        prog_attach_flags: u64,
        link_ids: u64,
        link_attach_flags: u64,
        revision: u64,
    }
    const BPF_PROG_QUERY: libc::c_long = 16;
    let dir = std::fs::File::open(cgroup)
        .with_context(|| format!("opening cgroup {}", cgroup.display()))?;
    let mut out = BTreeMap::new();
    for (attach_type, name) in SOCKLB_ATTACH_TYPES {
        let mut ids = [0u32; 64];
        let mut query = Query {
            target_fd: u32::try_from(dir.as_raw_fd())?,
            attach_type,
            query_flags: 0,
            attach_flags: 0,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: u32::try_from(ids.len())?,
            _pad: 0,
            prog_attach_flags: 0,
            link_ids: 0,
            link_attach_flags: 0,
            revision: 0,
        };
        // SAFETY: a valid bpf_attr for BPF_PROG_QUERY; `ids` outlives the call and holds
        // `prog_cnt` entries.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &raw mut query,
                size_of::<Query>(),
            )
        };
        if rc != 0 {
            bail!(
                "BPF_PROG_QUERY {name} on {}: {}",
                cgroup.display(),
                std::io::Error::last_os_error()
            );
        }
        let count = usize::try_from(query.prog_cnt)?.min(ids.len());
        out.insert(name, ids[..count].to_vec());
    }
    Ok(out)
}

/// Every program id attached to `cgroup` by socklb's attach types.
pub fn cgroup_program_ids(cgroup: &Path) -> anyhow::Result<Vec<u32>> {
    Ok(cgroup_programs(cgroup)?.into_values().flatten().collect())
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
