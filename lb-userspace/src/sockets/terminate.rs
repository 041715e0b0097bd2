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
use std::{collections::HashMap, net::SocketAddr, path::Path, sync::Arc};

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

/// Destroys the connected UDP sockets translated by socklb whose backend is not serving any
/// more. `serving` holds every UDP frontend and the serving endpoints of its backend set.
/// A namespace or socket that fails is reported and the pass goes on with the others.
pub fn terminate_stale<S: std::hash::BuildHasher + Sync>(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    serving: &HashMap<FrontendKey, Arc<[SocketAddr]>, S>,
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
            if records(&state)
                .any(|r| backend_addr(&r.backend) == Some(dst) && is_stale(r, serving))
            {
                stale_sockets.push(socket.clone());
            }
        })?;
        let mut destroyed = 0;
        let mut errors = Vec::new();
        for socket in &stale_sockets {
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
