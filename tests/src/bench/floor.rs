//! The kernel-side floor: an empty program (`r0 = 1; exit`) of each hook socklb uses, loaded
//! from raw bytecode and attached to the same cgroup as socklb's programs, so both run on the
//! same system calls. The kernel's run counters (`BPF_ENABLE_STATS`) then give each program's
//! nanoseconds per run, and socklb's cost is reported as a ratio to the empty program's.
use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use anyhow::Context as _;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;

/// The `sock_addr` hooks socklb attaches to, with the kernel's attach type numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Hook {
    Connect4,
    SendMsg4,
    RecvMsg4,
    GetPeerName4,
}

impl Hook {
    fn attach_type(self) -> u32 {
        match self {
            Self::Connect4 => 10,
            Self::SendMsg4 => 14,
            Self::RecvMsg4 => 19,
            Self::GetPeerName4 => 29,
        }
    }

    /// The name of socklb's program on this hook (as `socklb inspect programs` shows it).
    pub fn socklb_program(self) -> &'static str {
        use lb_common::program;
        match self {
            Self::Connect4 => program::CONNECT4,
            Self::SendMsg4 => program::SENDMSG4,
            Self::RecvMsg4 => program::RECVMSG4,
            Self::GetPeerName4 => program::GETPEERNAME4,
        }
    }
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`, zero padded.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u8; 56],
}

/// `union bpf_attr` for `BPF_LINK_CREATE` on a cgroup, zero padded.
#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u8; 112],
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct GetInfo {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
    _rest: [u8; 112],
}

const _: () = assert!(size_of::<ProgLoad>() == 128);
const _: () = assert!(size_of::<LinkCreate>() == 128);
const _: () = assert!(size_of::<GetInfo>() == 128);

/// Byte offsets in `struct bpf_prog_info` (include/uapi/linux/bpf.h).
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;
const INFO_LEN: usize = 232;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is a fully initialised, correctly sized `union bpf_attr` variant.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: i64) -> anyhow::Result<OwnedFd> {
    // SAFETY: a descriptor the kernel just returned to us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd)?) })
}

/// An empty program attached to a cgroup; detached and unloaded when dropped.
pub struct Floor {
    pub hook: Hook,
    prog: OwnedFd,
    _link: OwnedFd,
}

impl Floor {
    /// Loads `r0 = 1; exit` for `hook` and attaches it (a cgroup link, beside socklb's).
    pub fn attach(hook: Hook, cgroup: &Path) -> anyhow::Result<Self> {
        // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm 1; then BPF_JMP | BPF_EXIT.
        let insns: [u64; 2] = [
            u64::from_le_bytes([0xb7, 0x00, 0, 0, 1, 0, 0, 0]),
            u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
        ];
        let license = CString::new("GPL")?;
        let mut name = [0u8; 16];
        name[..11].copy_from_slice(b"bench_floor");
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            insn_cnt: 2,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name,
            prog_ifindex: 0,
            expected_attach_type: hook.attach_type(),
            _rest: [0; 56],
        };
        let prog = owned(bpf(BPF_PROG_LOAD, &mut attr).context("loading an empty program")?)?;
        let cg = std::fs::File::open(cgroup).with_context(|| cgroup.display().to_string())?;
        let mut link = LinkCreate {
            prog_fd: u32::try_from(prog.as_raw_fd())?,
            target_fd: u32::try_from(cg.as_raw_fd())?,
            attach_type: hook.attach_type(),
            flags: 0,
            _rest: [0; 112],
        };
        let link = owned(bpf(BPF_LINK_CREATE, &mut link).context("attaching an empty program")?)?;
        Ok(Self {
            hook,
            prog,
            _link: link,
        })
    }

    /// (runs, nanoseconds) so far, from the kernel's counters.
    pub fn counters(&self) -> anyhow::Result<(u64, u64)> {
        let mut info = [0u8; INFO_LEN];
        let mut attr = GetInfo {
            bpf_fd: u32::try_from(self.prog.as_raw_fd())?,
            info_len: u32::try_from(INFO_LEN)?,
            info: info.as_mut_ptr() as u64,
            _rest: [0; 112],
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).context("reading an empty program's counters")?;
        let field = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&info[at..at + 8]);
            u64::from_ne_bytes(b)
        };
        Ok((field(INFO_RUN_CNT), field(INFO_RUN_TIME_NS)))
    }
}

/// Holds `BPF_ENABLE_STATS`: while it lives, the kernel counts program runs and run time.
pub struct BpfStats(#[allow(dead_code, reason = "held for its Drop")] OwnedFd);

impl BpfStats {
    pub fn enable() -> anyhow::Result<Self> {
        // union bpf_attr, enable_stats variant: type BPF_STATS_RUN_TIME (0), zero padded.
        let mut attr = [0u8; 128];
        let fd = bpf(BPF_ENABLE_STATS, &mut attr).context("BPF_ENABLE_STATS")?;
        Ok(Self(owned(fd)?))
    }
}
