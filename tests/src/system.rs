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
use socklb::dataplane::sys::{self, bpf_attach_type};

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

/// Reads a child's output `lines` until one starts with `prefix` or `limit` has passed; the
/// text read, that line included (a test then signals the child at a known phase).
pub fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    prefix: &str,
    limit: Duration,
) -> String {
    let start = Instant::now();
    let mut seen = String::new();
    while let Some(Ok(line)) = lines.next() {
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with(prefix) || start.elapsed() > limit {
            break;
        }
    }
    seen
}

/// Everything a sandbox of process `pid` made that still exists: network namespaces, cgroups,
/// bpffs mounts and work folders (by the name prefix every sandbox of that process carries),
/// files in /etc/netns, and live processes whose command line names one of them (an agent, a
/// backend server or a client of such a sandbox). Those processes are ended (SIGKILL) as they
/// are listed: they are the caller's child's children, and a test that found them must not
/// leave them running (one holding the child's output pipe open would also block its reader).
pub fn end_leftovers_of(pid: u32) -> Vec<String> {
    let prefix = format!("slb{pid:x}x");
    let mut found: Vec<String> = processes_naming(&prefix)
        .into_iter()
        .map(|(pid, cmd)| {
            sigkill(pid);
            format!("process {pid}: {cmd}")
        })
        .collect();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name.starts_with(&prefix) {
                found.push(format!("netns {name}"));
            }
        }
    }
    let mut dirs = vec![std::env::temp_dir(), PathBuf::from("/etc/netns")];
    dirs.extend(cgroup2_mount());
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(entry.path().display().to_string());
            }
        }
    }
    found
}

/// The PIDs in `/proc`.
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// A process's state letter and parent PID, from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces: the fields follow its last ')'.
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// Whether `pid` is a process that has not exited (a zombie, `Z`, or dead, `X`, has).
pub(crate) fn running(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// SIGKILL to `pid`, a process the caller found as its own child or its child's.
pub(crate) fn sigkill(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Running processes whose command line contains `needle`: PID and command line.
fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    pids()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            (cmd.contains(needle) && running(pid)).then(|| (pid, cmd.trim_end().to_string()))
        })
        .collect()
}

/// Ends (SIGKILL) every running child of this process and returns their PIDs and command
/// names: a signalled run's last step, for any process started outside a sandbox's registry
/// (an `ip` command mid-run) or that a teardown missed. Only this process's own children:
/// processes it started.
pub fn end_own_children() -> Vec<(u32, String)> {
    let me = std::process::id();
    pids()
        .filter(|pid| running(*pid) && proc_stat(*pid).is_some_and(|(_, parent)| parent == me))
        .map(|pid| {
            sigkill(pid);
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, comm.trim().to_string())
        })
        .collect()
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
    if let Ok(entries) = std::fs::read_dir("/etc/netns") {
        for entry in entries.flatten() {
            if dead(&entry.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(entry.path());
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

/// The cgroup attach types socklb uses, by bpftool's names (the release program's only where
/// the kernel took it).
pub const SOCKLB_ATTACH_TYPES: [(bpf_attach_type, &str); 9] = [
    (
        bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
        "cgroup_inet4_connect",
    ),
    (
        bpf_attach_type::BPF_CGROUP_INET6_CONNECT,
        "cgroup_inet6_connect",
    ),
    (
        bpf_attach_type::BPF_CGROUP_UDP4_SENDMSG,
        "cgroup_udp4_sendmsg",
    ),
    (
        bpf_attach_type::BPF_CGROUP_UDP6_SENDMSG,
        "cgroup_udp6_sendmsg",
    ),
    (
        bpf_attach_type::BPF_CGROUP_UDP4_RECVMSG,
        "cgroup_udp4_recvmsg",
    ),
    (
        bpf_attach_type::BPF_CGROUP_UDP6_RECVMSG,
        "cgroup_udp6_recvmsg",
    ),
    (
        bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
        "cgroup_inet4_getpeername",
    ),
    (
        bpf_attach_type::BPF_CGROUP_INET6_GETPEERNAME,
        "cgroup_inet6_getpeername",
    ),
    (
        bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
        "cgroup_inet_sock_release",
    ),
];

/// The programs attached to `cgroup` itself (not inherited), by attach type, as the kernel
/// reports them: `BPF_PROG_QUERY`, what `bpftool cgroup show` runs. Independent of socklb's
/// pins, so it also sees a link whose pin is gone.
pub fn cgroup_programs(cgroup: &Path) -> anyhow::Result<BTreeMap<&'static str, Vec<u32>>> {
    use std::os::fd::AsFd as _;
    let dir = std::fs::File::open(cgroup)
        .with_context(|| format!("opening cgroup {}", cgroup.display()))?;
    let mut out = BTreeMap::new();
    for (attach_type, name) in SOCKLB_ATTACH_TYPES {
        let ids = sys::prog_query(dir.as_fd(), attach_type)
            .with_context(|| format!("BPF_PROG_QUERY {name} on {}", cgroup.display()))?;
        out.insert(name, ids);
    }
    Ok(out)
}

/// Every program id attached to `cgroup` by socklb's attach types.
pub fn cgroup_program_ids(cgroup: &Path) -> anyhow::Result<Vec<u32>> {
    Ok(cgroup_programs(cgroup)?.into_values().flatten().collect())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};

    #[test]
    fn a_leftover_process_is_listed_and_ended() {
        use std::time::{Duration, Instant};
        // A process whose command line names a sandbox of "process" 0xfffffffe (none exists):
        // what an agent or a server that outlived its run looks like.
        let mut child = std::process::Command::new("sleep")
            .arg0("slbfffffffex00c-sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        // `spawn` can return before /proc shows the new command line.
        let deadline = Instant::now() + Duration::from_secs(5);
        while super::processes_naming("slbfffffffex00c").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let left = super::end_leftovers_of(0xffff_fffe);
        let mut status = None;
        while status.is_none() && Instant::now() < deadline {
            status = child.try_wait().expect("try_wait");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Never left running, whatever the assertions below say.
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            left,
            vec![format!("process {}: slbfffffffex00c-sleep 60", child.id())]
        );
        assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL));
        assert_eq!(super::end_leftovers_of(0xffff_fffe), Vec::<String>::new());
    }

    #[test]
    fn a_process_state_and_parent_are_read_from_proc() {
        let (state, parent) = super::proc_stat(std::process::id()).expect("own stat");
        assert!(matches!(state, 'R' | 'S'), "{state}");
        assert_eq!(parent, std::os::unix::process::parent_id());
    }

    #[test]
    fn sandbox_names_carry_their_owner() {
        assert_eq!(super::owner_pid("slb1a2bx03c"), Some(0x1a2b));
        assert_eq!(super::owner_pid("slbffx01-bpffs"), Some(0xff));
        assert_eq!(super::owner_pid("slbzzx01"), None);
        assert_eq!(super::owner_pid("other"), None);
    }
}
