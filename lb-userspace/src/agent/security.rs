//! Once its programs are loaded and attached, the agent keeps only the capabilities it still
//! uses: `CAP_BPF` (map writes), `CAP_NET_ADMIN` (destroying stale UDP sockets), `CAP_SYS_ADMIN` and
//! `CAP_SYS_PTRACE` (entering pods' network namespaces for that), `CAP_NET_BIND_SERVICE` (a low
//! --listen port). Everything else goes from the effective, permitted, inheritable and bounding
//! sets, and `no_new_privs` is set. Capabilities are per thread: call this before any thread
//! starts.
use caps::{CapSet, Capability, CapsHashSet};

const KEEP: [Capability; 5] = [
    Capability::CAP_BPF,
    Capability::CAP_NET_ADMIN,
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_NET_BIND_SERVICE,
];

/// Drops what the agent no longer needs; returns the capabilities kept.
pub fn drop_capabilities() -> Result<Vec<String>, caps::errors::CapsError> {
    let keep: CapsHashSet = KEEP.into_iter().collect();
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
