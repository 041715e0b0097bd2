//! Terminating connected UDP sockets whose backend stopped serving.
//!
//! A connected UDP socket (a DNS client, say) was translated once, at `connect()`; if its backend
//! goes away it would keep sending into the void. socklb destroys such sockets with `sock_diag`
//! `SOCK_DESTROY`, so the application sees an error and connects again, getting a live backend.
//! Only sockets socklb translated are considered: the `SOCKETS` iterator lists every socket
//! with a record (its cookie and what it was translated to), and a socket without one (a direct
//! connection to a pod, a headless Service's endpoint) is never touched. A translated socket is
//! destroyed when its frontend is gone, or its backend is no longer a serving endpoint of the
//! frontend's backend set, as kube-proxy clears conntrack entries. The sockets are found (by
//! cookie) in the network namespaces of the processes in the attached cgroup tree.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io,
    net::SocketAddr,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use lb_common::{FrontendKey, SockRecord};

use super::{abi::backend_addr, sock_diag, sockets};

/// What one termination pass did.
#[derive(Debug, Default)]
pub struct Terminated {
    pub namespaces: usize,
    pub sockets: usize,
    /// Sockets that could not be destroyed (the pass went on with the others).
    pub errors: Vec<sock_diag::SockDiagError>,
}

/// The sockets the pass may destroy: connected UDP (`TCP_ESTABLISHED` is how the kernel calls a
/// connected UDP socket).
const CONNECTED: u32 = 1 << 1;

/// Destroys the connected UDP sockets translated by socklb whose backend is not serving any
/// more. `serving` holds every UDP frontend and the serving endpoints of its backend set.
/// A socket that cannot be destroyed is reported and the pass goes on with the others.
pub fn terminate_stale<S: std::hash::BuildHasher>(
    cgroup: &Path,
    maps_dir: &Path,
    serving: &HashMap<FrontendKey, Arc<[SocketAddr]>, S>,
) -> io::Result<Terminated> {
    let mut done = Terminated::default();
    // Cookie → the backend its record names (a socket that reconnected elsewhere keeps its
    // old record: only a socket still talking to that backend is stale).
    let stale: Arc<HashMap<u64, SocketAddr>> = Arc::new(
        sockets::translated(maps_dir)?
            .into_iter()
            .filter(|e| is_stale(&e.record, serving))
            .filter_map(|e| Some((e.cookie, backend_addr(&e.record.backend)?)))
            .collect(),
    );
    if stale.is_empty() {
        return Ok(done);
    }
    for ns_path in namespaces(cgroup)?.into_values() {
        let stale = stale.clone();
        // setns() changes only the calling thread's namespace: do it on a thread of its own.
        let result = std::thread::spawn(move || -> io::Result<(usize, Vec<_>)> {
            let ns = std::fs::File::open(&ns_path)?;
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            let mut destroyed = 0;
            let mut errors = Vec::new();
            for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                let sockets = sock_diag::dump(libc::IPPROTO_UDP as u8, family, CONNECTED, &[])
                    .map_err(io::Error::other)?;
                for socket in sockets
                    .iter()
                    .filter(|s| stale.get(&s.cookie) == Some(&s.dst()))
                {
                    match sock_diag::destroy(socket) {
                        Ok(true) => destroyed += 1,
                        Ok(false) => {}
                        Err(e) => errors.push(e),
                    }
                }
            }
            Ok((destroyed, errors))
        })
        .join()
        .map_err(|_| io::Error::other("socket termination thread panicked"))?;
        match result {
            Ok((n, errors)) => {
                done.namespaces += 1;
                done.sockets += n;
                done.errors.extend(errors);
            }
            // A pod that went away meanwhile: nothing to terminate there.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A UDP record whose frontend is gone or whose backend stopped serving.
fn is_stale<S: std::hash::BuildHasher>(
    record: &SockRecord,
    serving: &HashMap<FrontendKey, Arc<[SocketAddr]>, S>,
) -> bool {
    if record.frontend.protocol != lb_common::PROTOCOL_UDP {
        return false;
    }
    let Some(backend) = backend_addr(&record.backend) else {
        return false;
    };
    match serving.get(&record.frontend) {
        None => true,
        Some(list) => !list.contains(&backend),
    }
}

/// One `/proc/PID/ns/net` per network namespace used by processes of `root`'s cgroup tree,
/// by (device, inode).
fn namespaces(root: &Path) -> io::Result<BTreeMap<(u64, u64), PathBuf>> {
    let mut netns = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut seen = BTreeSet::new();
    while let Some(dir) = stack.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(meta) = std::fs::metadata(&path) {
                netns.entry((meta.dev(), meta.ino())).or_insert(path);
            }
        }
        for entry in std::fs::read_dir(&dir)?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    Ok(netns)
}
