//! Map contents in readable form: a structured view (for `inspect -o json`, which tests read
//! back into these same types) and a stable text rendering (for golden files and `inspect`).
use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr};

use lb_common::{FRONTEND_FLAG_AFFINITY, FRONTEND_FLAG_NO_LOCAL};
use serde::{Deserialize, Serialize};

use super::{abi::service_addr, maps::MapSnapshot};
use crate::vocab::{ServiceAddr, ServicePortKey};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendView {
    pub frontend: ServiceAddr,
    /// Backends connects choose among.
    pub count: u16,
    /// sessionAffinity ClientIP timeout, when on.
    pub affinity_timeout_s: Option<u32>,
    /// Refused because internalTrafficPolicy Local has no endpoint on this node.
    pub no_local_endpoint: bool,
}

/// One backend set as the maps hold it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    pub id: u32,
    /// The backend set, when the metadata names it.
    pub service: Option<ServicePortKey>,
    pub port: Option<u16>,
    pub frontends: Vec<FrontendView>,
    /// Where its range starts in the backend array.
    pub base: u32,
    /// The backends, in slot order (`None`: an entry that holds no address: a bug).
    pub backends: Vec<Option<SocketAddr>>,
}

impl ServiceView {
    /// The backends a connect can get now.
    pub fn active_backends(&self) -> Vec<SocketAddr> {
        self.backends.iter().flatten().copied().collect()
    }
}

/// Groups the maps by service id.
pub fn services(snap: &MapSnapshot) -> Vec<ServiceView> {
    let mut by_id: BTreeMap<u32, ServiceView> = BTreeMap::new();
    let view = |id: u32| ServiceView {
        id,
        service: snap.service_port(id),
        port: snap.meta.get(&id).map(|m| m.unpack().port),
        frontends: Vec::new(),
        base: 0,
        backends: Vec::new(),
    };
    for id in snap.meta.keys() {
        by_id.entry(*id).or_insert_with(|| view(*id));
    }
    for (key, fe) in &snap.frontends {
        let Some(frontend) = service_addr(key) else {
            continue;
        };
        let v = by_id
            .entry(fe.service_id)
            .or_insert_with(|| view(fe.service_id));
        if v.frontends.is_empty() || fe.count as usize > v.backends.len() {
            v.base = fe.base;
            v.backends = snap.range(fe);
        }
        v.frontends.push(FrontendView {
            frontend,
            count: fe.count,
            affinity_timeout_s: (fe.flags & FRONTEND_FLAG_AFFINITY != 0)
                .then_some(fe.affinity_timeout_s),
            no_local_endpoint: fe.flags & FRONTEND_FLAG_NO_LOCAL != 0,
        });
    }
    let mut out: Vec<ServiceView> = by_id.into_values().collect();
    out.sort_by(|a, b| (&a.service, a.id).cmp(&(&b.service, b.id)));
    out
}

/// The maps as stable text: one block per backend set. Range positions are left out (they
/// depend on allocation order, not on what a connect gets).
pub fn render(snap: &MapSnapshot) -> String {
    let mut out = String::new();
    for s in services(snap) {
        let _ = writeln!(
            out,
            "service {} port {}",
            s.service
                .as_ref()
                .map_or_else(|| format!("<id {}>", s.id), ToString::to_string),
            s.port.map_or_else(|| "?".into(), |p| p.to_string()),
        );
        for f in &s.frontends {
            let affinity = f
                .affinity_timeout_s
                .map(|t| format!(" affinity ClientIP {t}s"))
                .unwrap_or_default();
            let local = if f.no_local_endpoint {
                " (no local endpoint)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  frontend {} count {}{affinity}{local}",
                f.frontend, f.count
            );
        }
        for (slot, b) in s.backends.iter().enumerate() {
            let _ = writeln!(
                out,
                "  slot {slot} -> {}",
                b.map_or_else(|| "<empty>".into(), |a| a.to_string())
            );
        }
    }
    out
}
