//! The UDP frontends' serving endpoints as they stand at this moment, for the termination pass
//! that destroys connected UDP sockets whose backend stopped serving. It judges each socket
//! right before it destroys it, against this table, never against a copy taken when it
//! started: a backend added while a pass runs (a rollout) is in the table before any program
//! can choose it, so a socket just given to it is never taken for stale.
//!
//! The reconciler keeps it: before it writes a UDP set, each of the set's frontends (those it
//! has and those it takes) serves the union of what it served and what it is to serve, with
//! the backends of both ranges; after the write, what it is to serve (or, when the write
//! failed, what it served); a frontend that goes leaves the table.
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, PoisonError, RwLock},
};

use lb_common::FrontendKey;

/// The table, shared between the reconciler and a pass on another thread.
#[derive(Clone, Debug, Default)]
pub struct LiveServing(Arc<RwLock<HashMap<FrontendKey, Arc<[SocketAddr]>>>>);

impl LiveServing {
    /// What `frontend` serves now (`None`: it is no frontend now).
    pub fn get(&self, frontend: &FrontendKey) -> Option<Arc<[SocketAddr]>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(frontend)
            .cloned()
    }

    /// Every UDP frontend now.
    pub fn frontends(&self) -> Vec<FrontendKey> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }

    /// Each of `frontends` serves `serving` too (what it served stays).
    pub(super) fn widen(&self, frontends: &[FrontendKey], serving: &[SocketAddr]) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        for fe in frontends {
            let mut list: Vec<SocketAddr> = table.get(fe).map(|l| l.to_vec()).unwrap_or_default();
            for b in serving {
                if !list.contains(b) {
                    list.push(*b);
                }
            }
            table.insert(*fe, list.into());
        }
    }

    /// Each of `frontends` serves exactly `serving`.
    pub(super) fn set(&self, frontends: &[FrontendKey], serving: &[SocketAddr]) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let mut unique: Vec<SocketAddr> = serving.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let list: Arc<[SocketAddr]> = unique.into();
        for fe in frontends {
            table.insert(*fe, Arc::clone(&list));
        }
    }

    /// `frontends` are no frontends any more.
    pub(super) fn remove(&self, frontends: &[FrontendKey]) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        for fe in frontends {
            table.remove(fe);
        }
    }
}
