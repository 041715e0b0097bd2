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

/// Why a termination pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum TerminateError {
    #[error("listing the translated sockets (the SOCKETS iterator)")]
    Records(#[source] io::Error),
    #[error("walking the cgroup tree at {}", .path.display())]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entering the network namespace {}", .path.display())]
    Namespace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listing connected UDP sockets in {}", .path.display())]
    Dump {
        path: PathBuf,
        #[source]
        source: sock_diag::SockDiagError,
    },
    #[error("the socket termination thread panicked")]
    Panicked,
}

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
const CONNECTED: u32 = sock_diag::state_bit(sock_diag::TCP_ESTABLISHED);

/// Destroys the connected UDP sockets translated by socklb whose backend is not serving any
/// more. `serving` holds every UDP frontend and the serving endpoints of its backend set.
/// A socket that cannot be destroyed is reported and the pass goes on with the others.
pub fn terminate_stale<S: std::hash::BuildHasher>(
    cgroup: &Path,
    maps_dir: &Path,
    serving: &HashMap<FrontendKey, Arc<[SocketAddr]>, S>,
) -> Result<Terminated, TerminateError> {
    let mut done = Terminated::default();
    // Cookie → the backend its record names (a socket that reconnected elsewhere keeps its
    // old record: only a socket still talking to that backend is stale).
    let stale: Arc<HashMap<u64, SocketAddr>> = Arc::new(
        sockets::translated(maps_dir)
            .map_err(TerminateError::Records)?
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
        let result = std::thread::spawn(move || -> Result<(usize, Vec<_>), TerminateError> {
            let enter = || {
                let ns = std::fs::File::open(&ns_path)?;
                rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                Ok(())
            };
            enter().map_err(|source| TerminateError::Namespace {
                path: ns_path.clone(),
                source,
            })?;
            let mut destroyed = 0;
            let mut errors = Vec::new();
            for family in [sock_diag::AF_INET, sock_diag::AF_INET6] {
                let sockets = sock_diag::dump(sock_diag::IPPROTO_UDP, family, CONNECTED, &[])
                    .map_err(|source| TerminateError::Dump {
                        path: ns_path.clone(),
                        source,
                    })?;
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
        .map_err(|_| TerminateError::Panicked)?;
        match result {
            Ok((n, errors)) => {
                done.namespaces += 1;
                done.sockets += n;
                done.errors.extend(errors);
            }
            // A pod that went away meanwhile: nothing to terminate there.
            Err(TerminateError::Namespace { source, .. })
                if source.kind() == io::ErrorKind::NotFound => {}
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
fn namespaces(root: &Path) -> Result<BTreeMap<(u64, u64), PathBuf>, TerminateError> {
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
        let entries = std::fs::read_dir(&dir).map_err(|source| TerminateError::Cgroup {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    Ok(netns)
}
