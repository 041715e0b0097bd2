//! The kernel-side floor: an empty program (`r0 = 1; exit`) of each hook socklb uses, loaded
//! from raw bytecode and attached to the same cgroup as socklb's programs, so both run on the
//! same system calls. The kernel's run counters (`BPF_ENABLE_STATS`) then give each program's
//! nanoseconds per run, and socklb's cost is reported as a ratio to the empty program's.
use std::{os::fd::AsFd as _, path::Path};

use anyhow::Context as _;
use socklb::dataplane::sys::{self, bpf_attach_type, bpf_prog_type};

/// The cgroup hooks socklb attaches to: the `sock_addr` ones and the socket release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Hook {
    Connect4,
    Connect6,
    SendMsg4,
    RecvMsg4,
    GetPeerName4,
    SendMsg6,
    RecvMsg6,
    GetPeerName6,
    SockRelease,
}

impl Hook {
    fn attach_type(self) -> bpf_attach_type {
        match self {
            Self::Connect4 => bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
            Self::Connect6 => bpf_attach_type::BPF_CGROUP_INET6_CONNECT,
            Self::SendMsg4 => bpf_attach_type::BPF_CGROUP_UDP4_SENDMSG,
            Self::RecvMsg4 => bpf_attach_type::BPF_CGROUP_UDP4_RECVMSG,
            Self::GetPeerName4 => bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
            Self::SendMsg6 => bpf_attach_type::BPF_CGROUP_UDP6_SENDMSG,
            Self::RecvMsg6 => bpf_attach_type::BPF_CGROUP_UDP6_RECVMSG,
            Self::GetPeerName6 => bpf_attach_type::BPF_CGROUP_INET6_GETPEERNAME,
            Self::SockRelease => bpf_attach_type::BPF_CGROUP_INET_SOCK_RELEASE,
        }
    }

    fn prog_type(self) -> bpf_prog_type {
        match self {
            Self::SockRelease => bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK,
            _ => bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        }
    }

    /// The name of socklb's program on this hook (as `socklb inspect programs` shows it).
    pub fn socklb_program(self) -> &'static str {
        use lb_common::program;
        match self {
            Self::Connect4 => program::CONNECT4,
            Self::Connect6 => program::CONNECT6,
            Self::SendMsg4 => program::SENDMSG4,
            Self::RecvMsg4 => program::RECVMSG4,
            Self::GetPeerName4 => program::GETPEERNAME4,
            Self::SendMsg6 => program::SENDMSG6,
            Self::RecvMsg6 => program::RECVMSG6,
            Self::GetPeerName6 => program::GETPEERNAME6,
            Self::SockRelease => program::RELEASE,
        }
    }
}

/// `r0 = 1; exit`: `BPF_ALU64 | BPF_MOV | BPF_K` (dst r0, imm 1), then `BPF_JMP | BPF_EXIT`.
pub const EMPTY_PROGRAM: [u64; 2] = [
    u64::from_le_bytes([0xb7, 0x00, 0, 0, 1, 0, 0, 0]),
    u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
];

/// A program that reads one word of an array and allows the call: `word[0] = key; r0 =
/// lookup(map, &word); if r0 { r0 = *r0 }; r0 = 1; exit`. What any prefilter must do at the
/// least, so a miss's cost over it is the program's own work beyond one array read.
fn word_reader(map_fd: u32, key: u32) -> [u64; 10] {
    let k = key.to_le_bytes();
    let f = map_fd.to_le_bytes();
    [
        // *(u32 *)(r10 - 4) = key: BPF_ST | BPF_MEM | BPF_W.
        u64::from_le_bytes([0x62, 0x0a, 0xfc, 0xff, k[0], k[1], k[2], k[3]]),
        // r2 = r10; r2 += -4
        u64::from_le_bytes([0xbf, 0xa2, 0, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x07, 0x02, 0, 0, 0xfc, 0xff, 0xff, 0xff]),
        // r1 = the map (BPF_LD | BPF_IMM | BPF_DW, src BPF_PSEUDO_MAP_FD), two slots.
        u64::from_le_bytes([0x18, 0x11, 0, 0, f[0], f[1], f[2], f[3]]),
        0,
        // call bpf_map_lookup_elem (the verifier inlines it for an array)
        u64::from_le_bytes([0x85, 0, 0, 0, 1, 0, 0, 0]),
        // if r0 == 0 goto +1; r0 = *(u64 *)(r0 + 0)
        u64::from_le_bytes([0x15, 0x00, 1, 0, 0, 0, 0, 0]),
        u64::from_le_bytes([0x79, 0x00, 0, 0, 0, 0, 0, 0]),
        EMPTY_PROGRAM[0],
        EMPTY_PROGRAM[1],
    ]
}

/// Set (to anything), the bench acts as a kernel that cannot link a program before another on
/// a cgroup hook (no `BPF_F_BEFORE`, before 6.6): the floors run after socklb's program in
/// every pass. Its tests use it to see that path on kernels that can.
pub const REFUSE_FIRST_ENV: &str = "SOCKLB_BENCH_REFUSE_FLOOR_FIRST";

/// Where a floor runs on its hook: after socklb's program (as attached) or before it.
///
/// The first program a hook runs after a connection's kernel work pays for what that work left
/// cold, as a program alone on its hook does: a floor after socklb's runs warm, one before pays
/// for both. So the bench takes socklb's cost from a pass with the floors last and the floor's
/// from one with them first (`kernel`'s doc), each where it pays what it would pay alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Order {
    FloorLast,
    FloorFirst,
}

/// An empty program attached to a cgroup; detached and unloaded when dropped.
pub struct Floor {
    pub hook: Hook,
    prog: std::os::fd::OwnedFd,
    cgroup: std::fs::File,
    /// `None` while unlinked ([`Floor::unlink`]).
    link: Option<std::os::fd::OwnedFd>,
}

impl Floor {
    /// Loads `r0 = 1; exit` for `hook` and attaches it (a cgroup link, beside socklb's).
    pub fn attach(hook: Hook, cgroup: &Path) -> anyhow::Result<Self> {
        Self::attach_program(hook, cgroup, &EMPTY_PROGRAM, "an empty program")
    }

    /// Loads a program that reads word `key` of the array pinned at `array` (socklb's `PORTS`,
    /// say) for `hook` and attaches it beside socklb's.
    pub fn attach_word_reader(
        hook: Hook,
        cgroup: &Path,
        array: &Path,
        key: u32,
    ) -> anyhow::Result<Self> {
        let map = sys::obj_get(array, true).with_context(|| array.display().to_string())?;
        let fd = u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&map))?;
        // The program holds its own reference to the map once loaded.
        Self::attach_program(hook, cgroup, &word_reader(fd, key), "a one-word program")
    }

    fn attach_program(
        hook: Hook,
        cgroup: &Path,
        insns: &[u64],
        what: &str,
    ) -> anyhow::Result<Self> {
        let prog = sys::prog_load(
            hook.prog_type(),
            hook.attach_type(),
            0,
            insns,
            "bench_floor",
        )
        .map_err(|(e, log)| anyhow::anyhow!("loading {what}: {e}: {log}"))?;
        let cg = std::fs::File::open(cgroup).with_context(|| cgroup.display().to_string())?;
        let link = sys::cgroup_link(prog.as_fd(), cg.as_fd(), hook.attach_type(), false)
            .with_context(|| format!("attaching {what}"))?;
        Ok(Self {
            hook,
            prog,
            cgroup: cg,
            link: Some(link),
        })
    }

    /// Links the program again, at `order` among the hook's programs (its counters go on).
    /// An error leaves it linked where it was; a kernel that cannot put it first says
    /// `EINVAL` (and so does this, first, when [`REFUSE_FIRST_ENV`] is set).
    pub fn relink(&mut self, order: Order) -> std::io::Result<()> {
        if order == Order::FloorFirst && std::env::var_os(REFUSE_FIRST_ENV).is_some() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let link = sys::cgroup_link(
            self.prog.as_fd(),
            self.cgroup.as_fd(),
            self.hook.attach_type(),
            order == Order::FloorFirst,
        )?;
        // The old link goes once the new one runs: the hook never lacks the floor.
        self.link = Some(link);
        Ok(())
    }

    /// Takes the program off its hook (socklb's then runs alone); [`Floor::relink`] puts it
    /// back.
    pub fn unlink(&mut self) {
        self.link = None;
    }

    /// (runs, nanoseconds) so far, from the kernel's counters.
    pub fn counters(&self) -> anyhow::Result<(u64, u64)> {
        let info =
            sys::prog_info(self.prog.as_fd()).context("reading an empty program's counters")?;
        Ok((info.run_cnt, info.run_time_ns))
    }
}

/// Holds `BPF_ENABLE_STATS`: while it lives, the kernel counts program runs and run time.
pub struct BpfStats(#[allow(dead_code, reason = "held for its Drop")] std::os::fd::OwnedFd);

impl BpfStats {
    pub fn enable() -> anyhow::Result<Self> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
        Ok(Self(fd))
    }
}
