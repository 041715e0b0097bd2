//! Terminating connected UDP sockets whose backend stopped serving.
//!
//! A connected UDP socket (a DNS client, say) was translated once, at `connect()`; if its backend
//! goes away it would keep sending into the void. socklb destroys such sockets with `sock_diag`
//! `SOCK_DESTROY`, so the application sees an error and connects again, getting a live backend.
//! Only sockets socklb translated are considered: a socket without a record (a direct
//! connection to a pod, a headless Service's endpoint) is never touched. A translated socket is
//! destroyed when its frontend is gone, or the backend it is connected to is no longer a serving
//! endpoint of the frontend's backend set, as kube-proxy clears conntrack entries. The sockets
//! are found in the network namespaces of the processes in the attached cgroup tree, with their
//! records read the way the kernel allowed (see `listing`). Where the UDP iterator runs, it
//! picks the candidates and a namespace is dumped only when it has one (the dump gives the
//! socket's identity for `SOCK_DESTROY`).
use std::{net::SocketAddr, path::Path, sync::Arc};

use lb_common::{FrontendKey, SockRecord};

use super::listing::{ListError, NamespaceError, Records, in_each_namespace, namespaces, records};
use crate::{
    dataplane::{abi::backend_addr, features::Listing, pins::SocketPins, sock_diag},
    vocab::Protocol,
};

/// Why a termination pass could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum TerminateError {
    #[error("listing the translated sockets")]
    List(#[from] ListError),
}

/// What one termination pass did.
#[derive(Debug, Default)]
pub struct Terminated {
    pub namespaces: usize,
    pub sockets: usize,
    /// Namespaces that could not be read (the pass went on with the others).
    pub namespace_errors: Vec<NamespaceError>,
    /// Sockets that could not be destroyed (the pass went on with the others).
    pub errors: Vec<sock_diag::SockDiagError>,
}

/// The sockets the pass may destroy: connected UDP (`TCP_ESTABLISHED` is how the kernel calls a
/// connected UDP socket).
const CONNECTED: u32 = sock_diag::state_bit(sock_diag::TCP_ESTABLISHED);

/// What a UDP frontend serves at this moment (`None`: it is no frontend now), asked again for
/// each socket right before it is destroyed.
pub type Serving<'a> = &'a (dyn Fn(&FrontendKey) -> Option<Arc<[SocketAddr]>> + Sync);

/// Destroys the connected UDP sockets translated by socklb whose backend is not serving any
/// more, as `serving` says at the moment each is destroyed (a backend that began serving since
/// the socket was found is never taken for stale). A namespace or socket that fails is
/// reported and the pass goes on with the others.
pub fn terminate_stale(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    serving: Serving<'_>,
) -> Result<Terminated, TerminateError> {
    terminate_judged(pins, listing, cgroup, serving, serving)
}

/// [`terminate_stale`] with the judgement made while the sockets are found (`listed`) and the
/// one made right before each is destroyed (`now`) given apart: they are the same table in a
/// pass, and differ where a test plays a change that lands in between.
pub fn terminate_judged(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    serving: Serving<'_>,
    now: Serving<'_>,
) -> Result<Terminated, TerminateError> {
    let mut done = Terminated::default();
    if listing.global {
        // One walk over the records first: nothing stale, no namespace to visit.
        let mut any = false;
        pins.for_each_global(|e| any |= records(&e.state).any(|r| is_stale(r, serving)))?;
        if let Some(slots) = super::listing::Slots::open(pins)? {
            slots.each(|_, state| any |= records(&state).any(|r| is_stale(r, serving)))?;
        }
        if !any {
            return Ok(done);
        }
    }
    let source = Records::open(pins, listing)?;
    let walked = in_each_namespace(&namespaces(cgroup)?, |ns| {
        // Found during the dump, destroyed after it (a destroy during a dump would make the
        // kernel interrupt it).
        let mut stale_sockets = Vec::new();
        // Where the UDP iterator reads the sockets, only those it finds stale are dumped (an
        // IPv4 socket's peer is known from it; an IPv6 one's when the dump shows it).
        let stale_record = |state: &lb_common::SockState, peer: Option<SocketAddr>| {
            records(state).any(|r| {
                is_stale(r, serving) && peer.is_none_or(|p| backend_addr(&r.backend) == Some(p))
            })
        };
        source.here_where(ns, Protocol::Udp, CONNECTED, &stale_record, &mut |found| {
            let Some((socket, state)) = found else {
                stale_sockets.clear();
                return;
            };
            // Only the record of the backend the socket is connected to matters: a socket that
            // reconnected elsewhere keeps its other records.
            let dst = socket.dst();
            if let Some(r) = records(&state)
                .find(|r| backend_addr(&r.backend) == Some(dst) && is_stale(r, serving))
            {
                stale_sockets.push((socket.clone(), r.frontend));
            }
        })?;
        let mut destroyed = 0;
        let mut errors = Vec::new();
        for (socket, frontend) in &stale_sockets {
            // Judged again now: the table may have gained its backend since the dump.
            if now(frontend).is_some_and(|list| list.contains(&socket.dst())) {
                continue;
            }
            match sock_diag::destroy(socket) {
                Ok(true) => destroyed += 1,
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        Ok((destroyed, errors))
    })?;
    for (_, result) in walked {
        match result {
            Ok((n, errors)) => {
                done.namespaces += 1;
                done.sockets += n;
                done.errors.extend(errors);
            }
            // A pod that went away meanwhile: nothing to terminate there.
            Err(e) if e.is_gone() => {}
            Err(e) => done.namespace_errors.push(e),
        }
    }
    Ok(done)
}

/// A UDP record whose frontend is gone or whose backend stopped serving.
fn is_stale(record: &SockRecord, serving: Serving<'_>) -> bool {
    if record.frontend.protocol != lb_common::PROTOCOL_UDP {
        return false;
    }
    let Some(backend) = backend_addr(&record.backend) else {
        return false;
    };
    serving(&record.frontend).is_none_or(|list| !list.contains(&backend))
}

/// Destroys the connected UDP sockets of the attached cgroup tree whose peer is a UDP
/// frontend, `frontends`: no program translated them (they connected before the frontend
/// existed, before the programs were attached, or while none were, after `socklb reset`), so
/// their datagrams go to the service address and are never answered. kube-proxy clears the
/// conntrack entries of a UDP Service that gains endpoints, so such a socket recovers there;
/// here its application gets an error and connects again, and the programs translate that.
/// Only sockets created in the attached tree (their cgroup, from `sock_diag`) and holding no
/// connection slot are touched. A namespace or socket that fails is reported and the pass goes
/// on with the others.
pub fn repair_untranslated(
    pins: &SocketPins,
    cgroup: &Path,
    frontends: &[FrontendKey],
) -> Result<Terminated, TerminateError> {
    let mut done = Terminated::default();
    let addresses: std::collections::HashSet<SocketAddr> = frontends
        .iter()
        .filter(|k| k.protocol == lb_common::PROTOCOL_UDP)
        .filter_map(|k| crate::dataplane::abi::service_addr(k).map(|a| a.addr))
        .collect();
    if addresses.is_empty() {
        return Ok(done);
    }
    let tree = cgroup_ids(cgroup)?;
    let slots = super::listing::Slots::open(pins)?;
    let walked = in_each_namespace(&namespaces(cgroup)?, |ns| {
        let mut found = Vec::new();
        for family in [sock_diag::AF_INET, sock_diag::AF_INET6] {
            let sockets = sock_diag::dump(sock_diag::IPPROTO_UDP, family, CONNECTED, &[]).map_err(
                |source| NamespaceError::Dump {
                    path: ns.path.clone(),
                    source,
                },
            )?;
            found.extend(sockets.into_iter().filter(|s| {
                addresses.contains(&s.dst())
                    && s.cgroup_id.is_some_and(|id| tree.contains(&id))
                    && slots.as_ref().is_none_or(|sl| sl.get(s.cookie).is_none())
            }));
        }
        let mut destroyed = 0;
        let mut errors = Vec::new();
        for socket in &found {
            match sock_diag::destroy(socket) {
                Ok(true) => destroyed += 1,
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        Ok((destroyed, errors))
    })?;
    for (_, result) in walked {
        match result {
            Ok((n, errors)) => {
                done.namespaces += 1;
                done.sockets += n;
                done.errors.extend(errors);
            }
            Err(e) if e.is_gone() => {}
            Err(e) => done.namespace_errors.push(e),
        }
    }
    Ok(done)
}

/// The cgroup ids (directory inode numbers, as cgroup v2 numbers them) of `root`'s tree.
fn cgroup_ids(root: &Path) -> Result<std::collections::HashSet<u64>, ListError> {
    use std::os::unix::fs::MetadataExt as _;
    let mut ids = std::collections::HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        match std::fs::metadata(&dir) {
            Ok(m) => {
                ids.insert(m.ino());
            }
            Err(_) if dir != root => continue,
            Err(source) => {
                return Err(ListError::Cgroup {
                    path: dir.clone(),
                    source,
                });
            }
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        stack.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    Ok(ids)
}
