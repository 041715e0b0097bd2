//! The agent's use of the C allocator: one malloc arena (the agent has a few threads and no
//! allocation-heavy parallelism; more arenas only hold more freed memory), and freed memory
//! handed back to the kernel after a full sync (its transients are large, once).

/// Limits glibc to one malloc arena. Call before starting threads.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
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
