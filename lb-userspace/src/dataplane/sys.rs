//! The `bpf()` commands aya 0.14 does not wrap, in one place, on the kernel's own types as
//! aya-obj generates them (`bpf_attr`, `bpf_cmd`, `bpf_attach_type`, `bpf_prog_info`): pin
//! opening (read-only too) and pinning, iterator links and walks, batch reads and writes of
//! array maps, an mmapable array mapped read-only (`MappedArray`), the program barrier
//! (`ProgramBarrier`: an array-of-maps update, which returns once every program run in progress
//! has ended), and for the tests and the benchmark a program from raw bytecode, a cgroup link,
//! a program's info, a cgroup's attached programs and a frozen map. Everything else goes through
//! aya.
use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya_obj::generated::{BPF_F_RDONLY, bpf_attr, bpf_cmd};
pub use aya_obj::generated::{bpf_attach_type, bpf_prog_info, bpf_prog_type};

/// `union bpf_iter_link_info` for a map iterator (aya-obj's bindings lack it).
#[repr(C)]
struct IterLinkInfo {
    map_fd: u32,
    _rest: [u32; 3],
}

const _: () = assert!(size_of::<IterLinkInfo>() == 16);

/// A zeroed `bpf_attr`: the kernel refuses one whose unused bytes are not zero.
fn zeroed() -> bpf_attr {
    // SAFETY: bpf_attr is a C union of integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: `attr` is a bpf_attr set up for `cmd`, zero elsewhere, and every pointer in it is
    // valid for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fd_u32(fd: BorrowedFd<'_>) -> io::Result<u32> {
    u32::try_from(fd.as_raw_fd()).map_err(io::Error::other)
}

fn owned(fd: i64) -> io::Result<OwnedFd> {
    // SAFETY: the syscall returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).map_err(io::Error::other)?) })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// Opens a pinned object; with `read_only` the kernel hands out a read-only descriptor, so
/// `inspect` cannot change anything even by mistake.
pub fn obj_get(path: &Path, read_only: bool) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut a = zeroed();
    a.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    a.__bindgen_anon_4.file_flags = if read_only { BPF_F_RDONLY } else { 0 };
    owned(bpf(bpf_cmd::BPF_OBJ_GET, &mut a)?)
}

/// Pins a BPF object at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut a = zeroed();
    a.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    a.__bindgen_anon_4.bpf_fd = fd_u32(fd)?;
    bpf(bpf_cmd::BPF_OBJ_PIN, &mut a).map(drop)
}

/// A link of an iterator program, over the map `map` for a map iterator.
pub fn iter_link(prog: BorrowedFd<'_>, map: Option<BorrowedFd<'_>>) -> io::Result<OwnedFd> {
    let info = IterLinkInfo {
        map_fd: map.map(fd_u32).transpose()?.unwrap_or(0),
        _rest: [0; 3],
    };
    let mut a = zeroed();
    // SAFETY: `a` is zeroed and every member is plain integers: borrowing the one we fill.
    let link = unsafe { &mut a.link_create };
    link.__bindgen_anon_1.prog_fd = fd_u32(prog)?;
    link.attach_type = bpf_attach_type::BPF_TRACE_ITER as u32;
    if map.is_some() {
        link.__bindgen_anon_3.__bindgen_anon_1.iter_info = std::ptr::from_ref(&info) as u64;
        link.__bindgen_anon_3.__bindgen_anon_1.iter_info_len = size_of::<IterLinkInfo>() as u32;
    }
    owned(bpf(bpf_cmd::BPF_LINK_CREATE, &mut a)?)
}

/// A fresh iterator instance of an iterator link: reading it runs the walk (in the calling
/// thread's network namespace, for socket iterators).
pub fn iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    let mut a = zeroed();
    a.iter_create.link_fd = fd_u32(link)?;
    Ok(owned(bpf(bpf_cmd::BPF_ITER_CREATE, &mut a)?)?.into())
}

/// A wait for every BPF program run in progress to end: an update of an array-of-maps makes
/// the kernel wait for an RCU grace period before it returns (`maybe_wait_bpf_programs`,
/// kernel/bpf/syscall.c, since 4.20), and the cgroup programs run under RCU. After `wait`
/// returns, no program still holds a map value it read before the call. The map is the
/// agent's own, unpinned and unused by any program.
pub struct ProgramBarrier {
    outer: OwnedFd,
    inner: OwnedFd,
}

impl ProgramBarrier {
    pub fn new() -> io::Result<Self> {
        let create = |map_type: u32, value_size: u32, inner: Option<BorrowedFd<'_>>| {
            let mut a = zeroed();
            // SAFETY: `a` is zeroed; the member set up is the one BPF_MAP_CREATE reads.
            let m = unsafe { &mut a.__bindgen_anon_1 };
            m.map_type = map_type;
            m.key_size = 4;
            m.value_size = value_size;
            m.max_entries = 1;
            if let Some(fd) = inner {
                m.inner_map_fd = fd_u32(fd)?;
            }
            owned(bpf(bpf_cmd::BPF_MAP_CREATE, &mut a)?)
        };
        let array = aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_ARRAY as u32;
        let of_maps = aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_ARRAY_OF_MAPS as u32;
        let inner = create(array, 4, None)?;
        let outer = create(of_maps, 4, Some(inner.as_fd()))?;
        Ok(Self { outer, inner })
    }

    /// Returns once every program run that started before the call has ended.
    pub fn wait(&self) -> io::Result<()> {
        let key = 0u32;
        let value = fd_u32(self.inner.as_fd())?;
        let mut a = zeroed();
        // SAFETY: as above, for BPF_MAP_UPDATE_ELEM; key and value outlive the call.
        let e = unsafe { &mut a.__bindgen_anon_2 };
        e.map_fd = fd_u32(self.outer.as_fd())?;
        e.key = std::ptr::from_ref(&key) as u64;
        e.__bindgen_anon_1.value = std::ptr::from_ref(&value) as u64;
        bpf(bpf_cmd::BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
    }
}

/// Freezes a map (`BPF_MAP_FREEZE`): from now on every write from user space fails with
/// `EPERM`, programs still read it. For tests: a write that cannot succeed, whatever the room.
pub fn map_freeze(map: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = zeroed();
    a.__bindgen_anon_2.map_fd = fd_u32(map)?;
    bpf(bpf_cmd::BPF_MAP_FREEZE, &mut a).map(drop)
}

/// Writes `values` at consecutive indexes from `start` of an array map, in one syscall.
pub fn array_update_batch<T: Copy>(
    map: BorrowedFd<'_>,
    start: u32,
    values: &[T],
) -> io::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    let keys: Vec<u32> = (0..values.len() as u32).map(|i| start + i).collect();
    let mut a = zeroed();
    a.batch.keys = keys.as_ptr() as u64;
    a.batch.values = values.as_ptr() as u64;
    a.batch.count = u32::try_from(values.len()).map_err(io::Error::other)?;
    a.batch.map_fd = fd_u32(map)?;
    bpf(bpf_cmd::BPF_MAP_UPDATE_BATCH, &mut a).map(drop)
}

/// Reads `count` consecutive entries from `start` of an array map, in as few syscalls as the
/// kernel allows.
pub fn array_lookup_range<T: Copy + Default>(
    map: BorrowedFd<'_>,
    start: u32,
    count: u32,
) -> io::Result<Vec<T>> {
    let mut out = Vec::with_capacity(count as usize);
    let mut next = start;
    while out.len() < count as usize {
        let want = count - out.len() as u32;
        let mut keys = vec![0u32; want as usize];
        let mut values = vec![T::default(); want as usize];
        // The kernel continues after the key in `in_batch`: the one before `next`.
        let previous = next.wrapping_sub(1);
        let mut out_batch = 0u32;
        let mut a = zeroed();
        if next != 0 {
            a.batch.in_batch = std::ptr::from_ref(&previous) as u64;
        }
        a.batch.out_batch = std::ptr::from_mut(&mut out_batch) as u64;
        a.batch.keys = keys.as_mut_ptr() as u64;
        a.batch.values = values.as_mut_ptr() as u64;
        a.batch.count = want;
        a.batch.map_fd = fd_u32(map)?;
        let result = bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut a);
        // SAFETY: the batch member is the one set up above; the kernel wrote back how many
        // entries it read into its `count`.
        let got = unsafe { a.batch.count } as usize;
        match result {
            Ok(_) => {}
            // ENOENT: the end of the array was reached; what was read is valid.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        if got == 0 {
            break;
        }
        out.extend_from_slice(&values[..got.min(want as usize)]);
        next += got as u32;
    }
    Ok(out)
}

/// A program loaded from raw bytecode (`insns`, 8-byte instructions), with the verifier's log
/// when the kernel refuses it: the benchmark's empty floor programs, and the tests' own probes
/// of what the kernel accepts (independent of socklb's object).
pub fn prog_load(
    prog_type: bpf_prog_type,
    expected_attach_type: bpf_attach_type,
    attach_btf_id: u32,
    insns: &[u64],
    name: &str,
) -> Result<OwnedFd, (io::Error, String)> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut a = zeroed();
    // SAFETY: `a` is zeroed and every member is plain integers: borrowing the one we fill.
    let load = unsafe { &mut a.__bindgen_anon_3 };
    load.prog_type = prog_type as u32;
    load.expected_attach_type = expected_attach_type as u32;
    load.attach_btf_id = attach_btf_id;
    load.insn_cnt = u32::try_from(insns.len()).map_err(|e| (io::Error::other(e), String::new()))?;
    load.insns = insns.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    load.log_level = 1;
    load.log_size = log.len() as u32;
    load.log_buf = log.as_mut_ptr() as u64;
    for (dst, src) in load.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    bpf(bpf_cmd::BPF_PROG_LOAD, &mut a)
        .and_then(owned)
        .map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            (e, String::from_utf8_lossy(&log[..end]).into_owned())
        })
}

/// Attaches `prog` to the cgroup `cgroup` with a link, after the programs already on that hook,
/// or before all of them when `first` (`BPF_F_BEFORE`: kernels with the multi-program API on
/// cgroups, from 2025; an older one refuses the flag with `EINVAL`).
pub fn cgroup_link(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: bpf_attach_type,
    first: bool,
) -> io::Result<OwnedFd> {
    let mut a = zeroed();
    a.link_create.__bindgen_anon_1.prog_fd = fd_u32(prog)?;
    a.link_create.__bindgen_anon_2.target_fd = fd_u32(cgroup)?;
    a.link_create.attach_type = attach_type as u32;
    if first {
        a.link_create.flags = aya_obj::generated::BPF_F_BEFORE;
    }
    owned(bpf(bpf_cmd::BPF_LINK_CREATE, &mut a)?)
}

/// A program's `bpf_prog_info` (its run counters among others).
pub fn prog_info(prog: BorrowedFd<'_>) -> io::Result<bpf_prog_info> {
    // SAFETY: bpf_prog_info is a C struct of integers; all-zero is a valid value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut a = zeroed();
    a.info.bpf_fd = fd_u32(prog)?;
    a.info.info_len = size_of::<bpf_prog_info>() as u32;
    a.info.info = std::ptr::from_mut(&mut info) as u64;
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(info)
}

/// The ids of the programs attached to `cgroup` on `attach_type` (what `bpftool cgroup show`
/// asks), at most 64.
pub fn prog_query(cgroup: BorrowedFd<'_>, attach_type: bpf_attach_type) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut a = zeroed();
    a.query.__bindgen_anon_1.target_fd = fd_u32(cgroup)?;
    a.query.attach_type = attach_type as u32;
    a.query.prog_ids = ids.as_mut_ptr() as u64;
    a.query.__bindgen_anon_2.prog_cnt = ids.len() as u32;
    bpf(bpf_cmd::BPF_PROG_QUERY, &mut a)?;
    // SAFETY: the query member set up above; the kernel wrote back the count.
    let count = unsafe { a.query.__bindgen_anon_2.prog_cnt } as usize;
    Ok(ids[..count.min(ids.len())].to_vec())
}

/// An array map created with `BPF_F_MMAPABLE`, mapped read-only: its entries are read in
/// place, without a system call each. Unmapped when dropped.
pub struct MappedArray<T> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is read-only shared memory, read with volatile loads of `Copy` values;
// moving or sharing the handle between threads is fine.
unsafe impl<T: Send> Send for MappedArray<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for MappedArray<T> {}

impl<T: Copy> MappedArray<T> {
    /// Maps the `len` entries of the array behind `map` (its value size must be `T`'s, a
    /// multiple of 8, as the kernel lays an mmapable array out).
    pub fn map(map: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        Self::map_at(map, 0, len)
    }

    /// Maps entries `first..first + len` only. Pages of a mapping that are read count in the
    /// process's RSS until it is unmapped: a scan of a large array reads it window by window,
    /// each window unmapped before the next. `first`'s byte offset must be page-aligned.
    pub fn map_at(map: BorrowedFd<'_>, first: usize, len: usize) -> io::Result<Self> {
        assert!(
            size_of::<T>().is_multiple_of(8),
            "array values are 8-byte aligned"
        );
        let too_large = || io::Error::other("array too large to map");
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(too_large)?;
        let offset = first.checked_mul(size_of::<T>()).ok_or_else(too_large)?;
        let offset = libc::off_t::try_from(offset).map_err(|_| too_large())?;
        // SAFETY: a fresh shared read-only mapping of the map's memory; the kernel checks the
        // offset and length against the map.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<T>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len, bytes })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry `i`, as it is now (programs may write it concurrently: a torn read is possible,
    /// which callers check by the entry's own key field).
    pub fn get(&self, i: usize) -> Option<T> {
        (i < self.len).then(|| {
            // SAFETY: `i` is inside the mapping; volatile because the kernel writes it.
            unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(i)) }
        })
    }
}

impl<T> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.bytes);
        }
    }
}

/// Takes the pages wholly inside `bytes` out of the process's resident set: read-only data of
/// this binary read once (the embedded eBPF object, once copied for its proof to be written).
/// Their file's pages stay in the page cache, where the kernel may reclaim them; a later read
/// maps them again with the same contents. Returns how many bytes were given back.
///
/// # Safety
///
/// `bytes` must lie in a read-only private mapping of a file (an immutable static of this
/// binary's `.rodata`, without relocations): anywhere else `MADV_DONTNEED` would replace the
/// pages with zeros behind a shared reference.
pub unsafe fn forget_resident(bytes: &'static [u8]) -> io::Result<usize> {
    let page = rustix::param::page_size();
    let first = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end <= first {
        return Ok(0);
    }
    // SAFETY: whole pages inside `bytes`, file-backed and never written (the caller's
    // promise): `MADV_DONTNEED` unmaps them and a read maps the file's again.
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(end - first)
}

/// `CLOCK_MONOTONIC` now, the clock `bpf_ktime_get_ns()` reads (the decision stream's times
/// and its claim).
pub fn monotonic_now() -> std::time::Duration {
    clock_now(rustix::time::ClockId::Monotonic)
}

/// `CLOCK_MONOTONIC_COARSE` now (the kernel's last tick), the clock the programs stamp a
/// socket's record (`created_ns`) and an affinity choice's last use (`last_used_ns`) with
/// (`bpf_ktime_get_coarse_ns()`): an age is now minus its stamp, and a record stamped before
/// this value was made before it was read.
pub fn record_clock_now() -> std::time::Duration {
    clock_now(rustix::time::ClockId::MonotonicCoarse)
}

fn clock_now(clock: rustix::time::ClockId) -> std::time::Duration {
    let t = rustix::time::clock_gettime(clock);
    std::time::Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    /// The decision stream's clock is the precise one: it moves within microseconds, where the
    /// records' clock moves only at the kernel's tick (milliseconds).
    #[test]
    fn the_streams_clock_is_precise_and_the_records_clock_never_ahead_of_it() {
        let first = super::monotonic_now();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_micros(20) {}
        assert!(
            super::monotonic_now() > first,
            "CLOCK_MONOTONIC moves in 20 µs"
        );
        let coarse = super::record_clock_now();
        assert!(
            coarse <= super::monotonic_now(),
            "the tick is never ahead of the precise clock"
        );
    }
}
