//! The kernel-facing filesystem facts socklb depends on: bpffs, cgroup v2, memlock.
use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

fn fs_magic(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs fills the zeroed struct; c is a valid C string.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        (libc::statfs(c.as_ptr(), &raw mut st) == 0).then_some(st.f_type)
    }
}

pub fn is_bpffs(path: &Path) -> bool {
    fs_magic(path) == Some(BPF_FS_MAGIC)
}

pub fn is_cgroup2(path: &Path) -> bool {
    path.is_dir() && fs_magic(path) == Some(CGROUP2_SUPER_MAGIC)
}

pub fn mount_bpffs(target: &Path) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_bytes())?;
    let fstype = c"bpf";
    // SAFETY: valid C strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const limit) } != 0 {
        tracing::debug!(
            error = %io::Error::last_os_error(),
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
