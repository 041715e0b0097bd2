//! Every socket socklb translated, read from the kernel through the pinned `SOCKETS`
//! iterator: its cookie and its record. The records live in each socket's own storage; the
//! iterator is the one way to list them (`sock_diag` reports socket storage for TCP only).
use std::{io::Read as _, os::fd::AsFd as _, path::Path};

use lb_common::SocketEntry;

use super::sys;

/// The iterator link's pin, in the map directory.
pub const ITER_PIN: &str = "SOCKETS_ITER";

/// Reads every translated socket's cookie and record.
pub fn translated(maps_dir: &Path) -> std::io::Result<Vec<SocketEntry>> {
    let link = sys::obj_get(&maps_dir.join(ITER_PIN), false)?;
    let mut iter = sys::iter_create(link.as_fd())?;
    let mut bytes = Vec::new();
    iter.read_to_end(&mut bytes)?;
    Ok(bytes
        .chunks_exact(size_of::<SocketEntry>())
        .map(|chunk| {
            // SAFETY: SocketEntry is plain old data (repr(C), integers only, no padding, asserted
            // in lb-common) and the chunk holds exactly its size.
            unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<SocketEntry>()) }
        })
        .collect())
}
