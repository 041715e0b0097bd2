//! Map contents in readable form: a structured view (for `inspect -o json` and tests) and a
//! stable text rendering (for golden files and `inspect`).
use std::{collections::BTreeMap, fmt::Write as _};

use lb_common::{FRONTEND_FLAG_AFFINITY, SlotKey};
use serde::Serialize;

use super::{
    abi::{Frontend, backend_from_abi},
    maps::MapSnapshot,
};
use crate::reconcile::key_from_meta;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrontendView {
    pub frontend: String,
    pub active: u16,
    /// sessionAffinity ClientIP timeout, when on.
    pub affinity_timeout_s: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlotView {
    pub slot: u32,
    pub backend_id: u32,
    /// None: the slot names a backend id the backend map lacks.
    pub backend: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceView {
    pub id: u32,
    /// `namespace/name:port`, when the metadata is present.
    pub service: Option<String>,
    pub protocol: Option<String>,
    pub family: Option<String>,
    pub scope: Option<String>,
    pub port: Option<u16>,
    pub frontends: Vec<FrontendView>,
    /// Slots the data path chooses among (the largest count of its frontends).
    pub active: u16,
    pub slots: Vec<SlotView>,
}

impl ServiceView {
    /// Backend addresses of the active slots, in slot order.
    pub fn active_backends(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| s.slot <= u32::from(self.active))
            .filter_map(|s| s.backend.clone())
            .collect()
    }
}

/// Groups the maps by service id.
pub fn services(snap: &MapSnapshot) -> Vec<ServiceView> {
    let mut by_id: BTreeMap<u32, ServiceView> = BTreeMap::new();
    let view = |id: u32| ServiceView {
        id,
        service: None,
        protocol: None,
        family: None,
        scope: None,
        port: None,
        frontends: Vec::new(),
        active: 0,
        slots: Vec::new(),
    };
    for (id, meta) in &snap.meta {
        let v = by_id.entry(*id).or_insert_with(|| view(*id));
        if let Some(key) = key_from_meta(meta) {
            v.service = Some(format!("{}:{}", key.service, key.port_name));
            v.protocol = Some(key.protocol.to_string());
            v.family = Some(key.family.to_string());
            v.scope = Some(key.scope.to_string());
        }
        v.port = Some(meta.port);
    }
    for (key, fe) in &snap.frontends {
        let v = by_id
            .entry(fe.service_id)
            .or_insert_with(|| view(fe.service_id));
        v.active = v.active.max(fe.count);
        v.frontends.push(FrontendView {
            frontend: Frontend::from_key(key).map_or_else(|| format!("{key:?}"), |f| f.to_string()),
            active: fe.count,
            affinity_timeout_s: (fe.flags & FRONTEND_FLAG_AFFINITY != 0)
                .then_some(fe.affinity_timeout_s),
        });
    }
    for (SlotKey { service_id, slot }, backend_id) in &snap.slots {
        let v = by_id
            .entry(*service_id)
            .or_insert_with(|| view(*service_id));
        v.slots.push(SlotView {
            slot: *slot,
            backend_id: *backend_id,
            backend: snap
                .backends
                .get(backend_id)
                .and_then(backend_from_abi)
                .map(|a| a.to_string()),
        });
    }
    let mut out: Vec<ServiceView> = by_id.into_values().collect();
    out.sort_by(|a, b| {
        (&a.service, a.scope.as_deref(), a.family.as_deref(), a.id).cmp(&(
            &b.service,
            b.scope.as_deref(),
            b.family.as_deref(),
            b.id,
        ))
    });
    out
}

/// The maps as stable text: one block per service, then the backend table.
pub fn render(snap: &MapSnapshot) -> String {
    let mut out = String::new();
    for s in services(snap) {
        let _ = writeln!(
            out,
            "service {} {} {} {} {} port {} active {}",
            s.id,
            s.service.as_deref().unwrap_or("<no metadata>"),
            s.protocol.as_deref().unwrap_or("?"),
            s.family.as_deref().unwrap_or("?"),
            s.scope.as_deref().unwrap_or("?"),
            s.port.map_or_else(|| "?".into(), |p| p.to_string()),
            s.active,
        );
        for f in &s.frontends {
            let affinity = f
                .affinity_timeout_s
                .map(|t| format!(" affinity ClientIP {t}s"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  frontend {} count {}{affinity}",
                f.frontend, f.active
            );
        }
        for slot in &s.slots {
            let marker = if slot.slot <= u32::from(s.active) {
                ""
            } else {
                " (inactive)"
            };
            let _ = writeln!(
                out,
                "  slot {} -> backend {} {}{marker}",
                slot.slot,
                slot.backend_id,
                slot.backend.as_deref().unwrap_or("<missing>")
            );
        }
    }
    let _ = writeln!(out, "backends {}", snap.backends.len());
    for (id, b) in &snap.backends {
        let addr = backend_from_abi(b).map_or_else(|| "<invalid>".into(), |a| a.to_string());
        let _ = writeln!(out, "  backend {id} {addr}");
    }
    out
}
