//! The narrow interface through which the reconciler writes the maps: one write at a time, and
//! a read of everything back. Two implementations: the real BPF maps (`bpf.rs`) and
//! `InMemoryMaps` here, which unit tests use and which can fail writes on purpose.
use std::collections::BTreeMap;

use lb_common::{Backend, Frontend, FrontendKey, ServiceMeta, SlotKey, map_name};

/// One map write. The reconciler orders these so the data path never sees a half-written
/// service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapWrite {
    PutBackend(u32, Backend),
    DeleteBackend(u32),
    PutSlot(SlotKey, u32),
    DeleteSlot(SlotKey),
    PutMeta(u32, ServiceMeta),
    DeleteMeta(u32),
    PutFrontend(FrontendKey, Frontend),
    DeleteFrontend(FrontendKey),
}

impl MapWrite {
    /// The map this write goes to.
    pub fn map(&self) -> &'static str {
        match self {
            Self::PutBackend(..) | Self::DeleteBackend(_) => map_name::BACKENDS,
            Self::PutSlot(..) | Self::DeleteSlot(_) => map_name::SLOTS,
            Self::PutMeta(..) | Self::DeleteMeta(_) => map_name::SERVICE_META,
            Self::PutFrontend(..) | Self::DeleteFrontend(_) => map_name::FRONTENDS,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            Self::DeleteBackend(_)
                | Self::DeleteSlot(_)
                | Self::DeleteMeta(_)
                | Self::DeleteFrontend(_)
        )
    }
}

impl std::fmt::Display for MapWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use super::abi::{Frontend as Fe, backend_from_abi, from_fixed};
        let backend =
            |b: &Backend| backend_from_abi(b).map_or_else(|| "<invalid>".into(), |a| a.to_string());
        let frontend =
            |k: &FrontendKey| Fe::from_key(k).map_or_else(|| format!("{k:?}"), |f| f.to_string());
        match self {
            Self::PutBackend(id, b) => write!(f, "put backend {id} = {}", backend(b)),
            Self::DeleteBackend(id) => write!(f, "delete backend {id}"),
            Self::PutSlot(k, id) => {
                write!(f, "put slot {}#{} = backend {id}", k.service_id, k.slot)
            }
            Self::DeleteSlot(k) => write!(f, "delete slot {}#{}", k.service_id, k.slot),
            Self::PutMeta(id, m) => write!(
                f,
                "put meta {id} = {}:{}",
                from_fixed(&m.name),
                from_fixed(&m.port_name)
            ),
            Self::DeleteMeta(id) => write!(f, "delete meta {id}"),
            Self::PutFrontend(k, v) => write!(
                f,
                "put frontend {} = service {} count {}",
                frontend(k),
                v.service_id,
                v.count
            ),
            Self::DeleteFrontend(k) => write!(f, "delete frontend {}", frontend(k)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapWriteError {
    #[error("map {map} is full ({capacity} entries)")]
    Full { map: &'static str, capacity: u32 },
    #[error("writing map {map}: {source}")]
    Io {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("injected failure writing map {map}")]
    Injected { map: &'static str },
}

impl MapWriteError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Full { .. } => "map_full",
            Self::Io { .. } => "map_write",
            Self::Injected { .. } => "injected",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("reading map {map}: {message}")]
pub struct MapReadError {
    pub map: &'static str,
    pub message: String,
}

/// Everything the service maps hold, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapSnapshot {
    pub frontends: BTreeMap<FrontendKey, Frontend>,
    pub slots: BTreeMap<SlotKey, u32>,
    pub backends: BTreeMap<u32, Backend>,
    pub meta: BTreeMap<u32, ServiceMeta>,
}

impl MapSnapshot {
    /// Applies one write, as the kernel would (deleting a missing key is not an error here; the
    /// reconciler never asks for that).
    pub fn apply(&mut self, write: &MapWrite) {
        match write {
            MapWrite::PutBackend(id, b) => {
                self.backends.insert(*id, *b);
            }
            MapWrite::DeleteBackend(id) => {
                self.backends.remove(id);
            }
            MapWrite::PutSlot(k, id) => {
                self.slots.insert(*k, *id);
            }
            MapWrite::DeleteSlot(k) => {
                self.slots.remove(k);
            }
            MapWrite::PutMeta(id, m) => {
                self.meta.insert(*id, *m);
            }
            MapWrite::DeleteMeta(id) => {
                self.meta.remove(id);
            }
            MapWrite::PutFrontend(k, f) => {
                self.frontends.insert(*k, *f);
            }
            MapWrite::DeleteFrontend(k) => {
                self.frontends.remove(k);
            }
        }
    }

    /// Whether a put would add a key (and so needs free capacity).
    fn adds_key(&self, write: &MapWrite) -> bool {
        match write {
            MapWrite::PutBackend(id, _) => !self.backends.contains_key(id),
            MapWrite::PutSlot(k, _) => !self.slots.contains_key(k),
            MapWrite::PutMeta(id, _) => !self.meta.contains_key(id),
            MapWrite::PutFrontend(k, _) => !self.frontends.contains_key(k),
            _ => false,
        }
    }

    fn len_of(&self, map: &str) -> usize {
        match map {
            map_name::BACKENDS => self.backends.len(),
            map_name::SLOTS => self.slots.len(),
            map_name::SERVICE_META => self.meta.len(),
            _ => self.frontends.len(),
        }
    }
}

/// Capacity of each service map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    pub frontends: u32,
    pub slots: u32,
    pub backends: u32,
    pub service_meta: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        use lb_common::capacity;
        Self {
            frontends: capacity::FRONTENDS,
            slots: capacity::SLOTS,
            backends: capacity::BACKENDS,
            service_meta: capacity::SERVICE_META,
        }
    }
}

impl Capacities {
    pub fn of(&self, map: &str) -> u32 {
        match map {
            map_name::BACKENDS => self.backends,
            map_name::SLOTS => self.slots,
            map_name::SERVICE_META => self.service_meta,
            _ => self.frontends,
        }
    }
}

/// Where the reconciler's writes go.
pub trait ServiceMaps {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError>;
    fn read_all(&self) -> Result<MapSnapshot, MapReadError>;
    fn capacities(&self) -> Capacities;
}

/// Decides whether the n-th write (counting from 0) fails; the flag says whether the write
/// would add a key (the writes a full map refuses).
pub type FailureRule = Box<dyn FnMut(usize, &MapWrite, bool) -> bool + Send>;
/// Runs after every successful write with the maps' new content (invariant checks in tests).
pub type WriteObserver = Box<dyn FnMut(&MapSnapshot, &MapWrite) + Send>;

/// Maps in memory, with the kernel's capacity limits and optional injected failures.
#[derive(Default)]
pub struct InMemoryMaps {
    pub content: MapSnapshot,
    pub capacities: Capacities,
    writes: usize,
    fail: Option<FailureRule>,
    observer: Option<WriteObserver>,
}

impl InMemoryMaps {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacities(capacities: Capacities) -> Self {
        Self {
            capacities,
            ..Self::default()
        }
    }

    /// Makes writes fail when `rule(write_number, write, adds_key)` returns true.
    pub fn fail_when(&mut self, rule: impl FnMut(usize, &MapWrite, bool) -> bool + Send + 'static) {
        self.fail = Some(Box::new(rule));
    }

    pub fn stop_failing(&mut self) {
        self.fail = None;
    }

    /// Calls `observer` after every successful write.
    pub fn observe(&mut self, observer: impl FnMut(&MapSnapshot, &MapWrite) + Send + 'static) {
        self.observer = Some(Box::new(observer));
    }

    /// Writes attempted so far.
    pub fn writes(&self) -> usize {
        self.writes
    }
}

impl ServiceMaps for InMemoryMaps {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        let n = self.writes;
        self.writes += 1;
        let adds_key = self.content.adds_key(write);
        if let Some(rule) = self.fail.as_mut()
            && rule(n, write, adds_key)
        {
            return Err(MapWriteError::Injected { map: write.map() });
        }
        let map = write.map();
        let capacity = self.capacities.of(map);
        if adds_key && self.content.len_of(map) >= capacity as usize {
            return Err(MapWriteError::Full { map, capacity });
        }
        self.content.apply(write);
        if let Some(observer) = self.observer.as_mut() {
            observer(&self.content, write);
        }
        Ok(())
    }

    fn read_all(&self) -> Result<MapSnapshot, MapReadError> {
        Ok(self.content.clone())
    }

    fn capacities(&self) -> Capacities {
        self.capacities
    }
}
