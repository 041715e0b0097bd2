//! The agent's use of the C allocator: one malloc arena (the agent has a few threads and no
//! allocation-heavy parallelism; more arenas only hold more freed memory), large blocks always
//! in their own mappings, and freed memory handed back to the kernel after a full sync (its
//! transients are large, once). The mmap threshold is held at 128 KiB: glibc raises its own to
//! the largest mapping freed so far, and a full sync's transients would then land among
//! long-lived objects and leave holes `malloc_trim` cannot return.

/// A block this large or larger gets its own mapping, returned to the kernel when freed (glibc's
/// initial threshold, held fixed).
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Limits glibc to one malloc arena and fixes its mmap threshold. Call before starting threads.
///
/// The threshold is fixed because glibc's own rises to the largest mapped block freed so far:
/// after the first list page or full sync, the next large transients (a page's objects, a
/// sync's tables) land in the heap among long-lived objects and leave holes there that
/// `malloc_trim` cannot return. Fixed, the agent's peak RSS at 10,000 × 10 in API mode is
/// about 1.6 MiB lower (`profile_api` with `MALLOC_MMAP_THRESHOLD_=131072`: 55.2-55.5 MiB
/// against 57.0-57.4 MiB).
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns freed heap memory to the kernel.
pub(super) fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
