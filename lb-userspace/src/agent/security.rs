//! Once its programs are loaded, the agent keeps only the capabilities it still uses, and sets
//! `no_new_privs`. Everything else goes from the effective, permitted, inheritable and bounding
//! sets. Capabilities are per thread: call this before any thread starts.
//!
//! Not kept, because the agent has done what needed them before it gets here: binding its
//! listeners (`CAP_NET_BIND_SERVICE`, only for a port below 1024), loading the programs
//! (`CAP_PERFMON`), raising `RLIMIT_MEMLOCK` (`CAP_SYS_RESOURCE`).
use caps::{CapSet, Capability, CapsHashSet};

/// What the running agent still needs, each for one reason.
pub const KEEP: [(Capability, &str); 4] = [
    (
        Capability::CAP_BPF,
        "bpf() after loading: map writes, attach (link create), pins; older kernels check each call",
    ),
    (
        Capability::CAP_NET_ADMIN,
        "destroy connected UDP sockets whose backend went away (sock_diag SOCK_DESTROY)",
    ),
    (
        Capability::CAP_SYS_ADMIN,
        "setns() into pods' network namespaces to find those sockets",
    ),
    (
        Capability::CAP_SYS_PTRACE,
        "open /proc/<pid>/ns/net of pods' processes, which the agent does not own",
    ),
];

/// Drops what the agent no longer needs; returns the capabilities kept.
pub(super) fn drop_capabilities() -> Result<Vec<String>, caps::errors::CapsError> {
    let keep: CapsHashSet = KEEP.into_iter().map(|(cap, _)| cap).collect();
    for cap in caps::all() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap)? {
            caps::drop(None, CapSet::Bounding, cap)?;
        }
    }
    let permitted = caps::read(None, CapSet::Permitted)?;
    let kept: CapsHashSet = permitted.intersection(&keep).copied().collect();
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    caps::set(None, CapSet::Effective, &kept)?;
    caps::set(None, CapSet::Permitted, &kept)?;
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        tracing::warn!(error = %e, "could not set no_new_privs");
    }
    let mut names: Vec<String> = kept.iter().map(ToString::to_string).collect();
    names.sort();
    Ok(names)
}
