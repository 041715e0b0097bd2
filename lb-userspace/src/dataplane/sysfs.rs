//! The kernel-facing filesystem facts socklb depends on: bpffs, cgroup v2, memlock, and the
//! kernel's lockdown mode (read for the permission hint of a failed start).
use std::{
    io,
    path::{Path, PathBuf},
};

pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

fn fs_magic(path: &Path) -> Option<i64> {
    rustix::fs::statfs(path).ok().map(|st| st.f_type)
}

pub fn is_bpffs(path: &Path) -> bool {
    fs_magic(path) == Some(BPF_FS_MAGIC)
}

pub fn is_cgroup2(path: &Path) -> bool {
    path.is_dir() && fs_magic(path) == Some(CGROUP2_SUPER_MAGIC)
}

pub fn mount_bpffs(target: &Path) -> io::Result<()> {
    rustix::mount::mount(
        "bpf",
        target,
        "bpf",
        rustix::mount::MountFlags::empty(),
        None,
    )?;
    Ok(())
}

/// The cgroup v2 mount point, from /proc/self/mountinfo (it is /sys/fs/cgroup on unified hosts
/// and /sys/fs/cgroup/unified on hybrid ones).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&mountinfo)
}

pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // fields: id parent major:minor root mountpoint options [optional...] - fstype source ...
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// Kernels before 5.11 charge BPF memory to `RLIMIT_MEMLOCK`; newer ones use memcg. Raising the
/// limit may be refused (no `CAP_SYS_RESOURCE`), which is harmless on those kernels.
pub fn raise_memlock_limit() {
    let unlimited = rustix::process::Rlimit {
        current: None,
        maximum: None,
    };
    if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Memlock, unlimited) {
        tracing::debug!(
            error = %e,
            "could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_on_hybrid_and_unified_hosts() {
        let hybrid = "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount_in("1 2 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}

/// The kernel's lockdown mode (`integrity`, `confidentiality`) when lockdown is on, from
/// securityfs; `None` when it is off or securityfs is not readable.
pub fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    lockdown_mode(&text)
}

/// The selected mode in securityfs's lockdown file ("none [integrity] confidentiality").
fn lockdown_mode(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    let mode = &text[start..end];
    (mode != "none").then(|| mode.to_string())
}

#[cfg(test)]
mod lockdown_tests {
    #[test]
    fn the_bracketed_mode_is_the_selected_one() {
        assert_eq!(
            super::lockdown_mode("[none] integrity confidentiality\n"),
            None
        );
        assert_eq!(
            super::lockdown_mode("none [integrity] confidentiality\n").as_deref(),
            Some("integrity")
        );
        assert_eq!(super::lockdown_mode(""), None);
    }
}
