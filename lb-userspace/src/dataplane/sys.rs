//! The few `bpf()` commands aya 0.14 does not wrap: read-only pin opening, and batch reads and
//! writes of array maps (one syscall for a whole backend range).
use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `enum bpf_attach_type`: an iterator.
const BPF_TRACE_ITER: u32 = 28;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `file_flags` of `BPF_OBJ_GET`: a descriptor that can only read.
const BPF_F_RDONLY: u32 = 1 << 3;

/// `union bpf_attr`, as large as the kernel's, zero beyond what a command uses.
#[repr(C, align(8))]
struct Attr([u8; 128]);

/// The `BPF_OBJ_GET` part of `union bpf_attr`.
#[repr(C)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    /// Spelled out: the kernel rejects an attr whose unused bytes are not zero.
    _pad: u32,
}

/// The batch part of `union bpf_attr`.
#[repr(C)]
#[allow(clippy::struct_field_names, reason = "the kernel's names")]
struct Batch {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The `BPF_LINK_CREATE` part of `union bpf_attr`, with the iterator's link info.
#[repr(C)]
struct LinkCreateIter {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
}

/// `union bpf_iter_link_info` for a map iterator.
#[repr(C)]
struct IterLinkInfo {
    map_fd: u32,
    _rest: [u32; 3],
}

const _: () = {
    assert!(size_of::<ObjGet>() == 24);
    assert!(size_of::<LinkCreateIter>() == 32);
    assert!(size_of::<IterLinkInfo>() == 16);
    assert!(size_of::<Batch>() == 56);
};

/// The attr for a command, from its part. `T` must have no implicit padding (its padding is
/// spelled out as zero fields): the kernel refuses non-zero bytes it does not expect.
fn attr<T>(part: &T) -> Attr {
    let mut attr = Attr([0; 128]);
    // SAFETY: `T` is a plain repr(C) struct no larger than the buffer (asserted by callers'
    // types above); copying its bytes is how bpf_attr is built.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(part).cast::<u8>(),
            attr.0.as_mut_ptr(),
            size_of::<T>(),
        );
    }
    attr
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a zero-padded bpf_attr for `cmd`, and every pointer in it is valid for
    // the duration of the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), size_of::<Attr>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Opens a pinned object; with `read_only` the kernel hands out a read-only descriptor, so
/// `inspect` cannot change anything even by mistake.
pub fn obj_get(path: &Path, read_only: bool) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut a = attr(&ObjGet {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: if read_only { BPF_F_RDONLY } else { 0 },
        path_fd: 0,
        _pad: 0,
    });
    let fd = bpf(BPF_OBJ_GET, &mut a)?;
    // SAFETY: the syscall returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).map_err(io::Error::other)?) })
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
    let mut a = attr(&Batch {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(values.len()).map_err(io::Error::other)?,
        map_fd: u32::try_from(map.as_raw_fd()).map_err(io::Error::other)?,
        elem_flags: 0,
        flags: 0,
    });
    bpf(BPF_MAP_UPDATE_BATCH, &mut a)?;
    Ok(())
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
        let mut a = attr(&Batch {
            in_batch: if next == 0 {
                0
            } else {
                std::ptr::from_ref(&previous) as u64
            },
            out_batch: std::ptr::from_mut(&mut out_batch) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: want,
            map_fd: u32::try_from(map.as_raw_fd()).map_err(io::Error::other)?,
            elem_flags: 0,
            flags: 0,
        });
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut a);
        // The kernel writes back how many it read into `count` (offset 32 of the batch part).
        let got = u32::from_ne_bytes([a.0[32], a.0[33], a.0[34], a.0[35]]) as usize;
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

fn fd_u32(fd: BorrowedFd<'_>) -> io::Result<u32> {
    u32::try_from(fd.as_raw_fd()).map_err(io::Error::other)
}

fn owned(fd: i64) -> io::Result<OwnedFd> {
    // SAFETY: the syscall returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).map_err(io::Error::other)?) })
}

/// A link of an iterator program over the map `map`.
pub fn map_iter_link(prog: BorrowedFd<'_>, map: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let info = IterLinkInfo {
        map_fd: fd_u32(map)?,
        _rest: [0; 3],
    };
    let mut a = attr(&LinkCreateIter {
        prog_fd: fd_u32(prog)?,
        target_fd: 0,
        attach_type: BPF_TRACE_ITER,
        flags: 0,
        iter_info: std::ptr::from_ref(&info) as u64,
        iter_info_len: size_of::<IterLinkInfo>() as u32,
        _pad: 0,
    });
    owned(bpf(BPF_LINK_CREATE, &mut a)?)
}

/// A fresh iterator instance of an iterator link: reading it runs the walk.
pub fn iter_create(link: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    let mut a = attr(&[fd_u32(link)?, 0u32]);
    Ok(owned(bpf(BPF_ITER_CREATE, &mut a)?)?.into())
}

/// Pins a BPF object at `path`.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut a = attr(&ObjGet {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: fd_u32(fd)?,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    });
    bpf(BPF_OBJ_PIN, &mut a)?;
    Ok(())
}
