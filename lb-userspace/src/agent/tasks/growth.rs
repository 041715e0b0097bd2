//! The maps grow before they fill. Nothing that works is taken away to make room: instead of
//! refusing a set, or taking another's room, the agent moves its maps to larger ones, make
//! before break, as an upgrade to other sizes does: a new generation is loaded beside the
//! current one, filled with exactly what the current one holds (same service ids, same backend
//! ranges, the programs' affinity tables and counters), and the programs switched to it one
//! hook at a time; the current generation serves until then and goes after.
//!
//! A map grows (doubles) when it passes `GROW_AT` of its size, or when a write found no room in
//! it, as long as the whole generation stays under the memory ceiling (`--max-map-memory`);
//! where doubling would pass it, the map grows to what fits. At the ceiling nothing grows: a
//! set that finds no room keeps the room it has, reported (`MapWriteError::AtCeiling`,
//! `/status`, `socklb_map_at_ceiling`).
use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use lb_common::MapId;

use crate::{
    dataplane::maps::{Capacities, MapWriteError},
    reconcile::Reconciler,
};

/// The fill past which a map grows.
pub(crate) const GROW_AT: f64 = 0.75;

/// The maps that grow: those the reconciler writes, and the client cgroups' affinity tables.
pub(crate) const GROWABLE: [MapId; 5] = [
    MapId::Frontends4,
    MapId::Frontends6,
    MapId::Backends,
    MapId::ServiceMeta,
    MapId::Affinity,
];

/// The longest a map may be (the backend array's indexes and the maps' keys are 32-bit; a
/// frontend's count is 16-bit, which bounds a set, not the array).
const MAX_ENTRIES: u32 = 1 << 30;

/// After a growth that failed, the next try waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How full each growable map is, and the maps in which a write found no room.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fill {
    pub(crate) used: BTreeMap<MapId, u64>,
    pub(crate) refused: BTreeSet<MapId>,
}

impl Fill {
    /// What a reconciler holds, and the maps its failed sets found full.
    pub(crate) fn of<M: crate::dataplane::maps::ServiceMaps>(r: &Reconciler<M>) -> Self {
        let caps = r.maps().capacities();
        let ranges = r.ranges();
        let snap = r.snapshot();
        let mut used = BTreeMap::new();
        let v4 = snap
            .frontends
            .keys()
            .filter(|k| k.family == lb_common::FAMILY_IPV4)
            .count() as u64;
        used.insert(MapId::Frontends4, v4);
        used.insert(MapId::Frontends6, snap.frontends.len() as u64 - v4);
        used.insert(
            MapId::Backends,
            u64::from(caps.get(MapId::Backends))
                .saturating_sub(u64::from(ranges.free_len()) + u64::from(ranges.waiting_len())),
        );
        used.insert(MapId::ServiceMeta, snap.meta.len() as u64);
        let refused = r.failed().values().filter_map(|e| room_in(&e.0)).collect();
        Self { used, refused }
    }
}

/// The map a write found no room in, if that is why it failed.
pub(crate) fn room_in(e: &MapWriteError) -> Option<MapId> {
    match e {
        MapWriteError::Full { map, .. } | MapWriteError::FrontendsLeftOut { map, .. } => Some(*map),
        MapWriteError::NoRange { .. } | MapWriteError::AtCeiling { .. } => Some(MapId::Backends),
        MapWriteError::Io { .. } | MapWriteError::Injected { .. } | MapWriteError::Unread(_) => {
            None
        }
    }
}

/// What to do about the maps' size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Every map has room.
    Stay,
    /// Move to maps of these sizes.
    Grow(Capacities),
    /// These maps need room and none can be had under the ceiling.
    AtCeiling(BTreeSet<MapId>),
}

/// The sizes to grow to: each growable map past `GROW_AT` of its size, or refused room, doubles,
/// as long as the generation's bytes (`bytes`: each map's capacity and bytes now) stay under
/// `ceiling`; where doubling would pass it, the map grows to what fits, if that is any larger.
pub(crate) fn plan(
    caps: &Capacities,
    fill: &Fill,
    bytes: &BTreeMap<MapId, (u32, u64)>,
    ceiling: u64,
) -> Decision {
    let needs: Vec<MapId> = GROWABLE
        .into_iter()
        .filter(|m| {
            let cap = u64::from(caps.get(*m));
            let used = fill.used.get(m).copied().unwrap_or(0);
            fill.refused.contains(m) || (cap > 0 && used as f64 >= GROW_AT * cap as f64)
        })
        .collect();
    if needs.is_empty() {
        return Decision::Stay;
    }
    let mut total: u64 = bytes.values().map(|(_, b)| *b).sum();
    let mut new = *caps;
    let mut stuck = BTreeSet::new();
    for map in needs {
        let cap = caps.get(map);
        let Some(&(pinned, map_bytes)) = bytes.get(&map) else {
            stuck.insert(map);
            continue;
        };
        let per_entry = map_bytes.div_ceil(u64::from(pinned.max(1))).max(1);
        let room = ceiling.saturating_sub(total);
        let by_room = cap.saturating_add(u32::try_from(room / per_entry).unwrap_or(u32::MAX));
        let grown = cap.saturating_mul(2).min(by_room).min(MAX_ENTRIES);
        // Growing by less than an eighth is not worth a move.
        if grown <= cap.saturating_add(cap / 8) {
            stuck.insert(map);
            continue;
        }
        total += u64::from(grown - cap) * per_entry;
        new = new.with(map, grown);
    }
    if new == *caps {
        Decision::AtCeiling(stuck)
    } else {
        Decision::Grow(new)
    }
}

/// The task's state: the ceiling, and when a failed growth may be tried again.
pub(in crate::agent) struct Growth {
    pub ceiling: u64,
    retry_at: Option<Instant>,
    /// The maps last found at the ceiling (said once, until it changes).
    pub at_ceiling: BTreeSet<MapId>,
    pub grown: u64,
}

impl Growth {
    pub(in crate::agent) fn new(ceiling: u64) -> Self {
        Self {
            ceiling,
            retry_at: None,
            at_ceiling: BTreeSet::new(),
            grown: 0,
        }
    }

    /// Whether a growth may be tried now (not within `RETRY_AFTER` of one that failed).
    pub(in crate::agent) fn may_try(&self) -> bool {
        self.ceiling > 0 && self.retry_at.is_none_or(|t| Instant::now() >= t)
    }

    pub(in crate::agent) fn failed(&mut self) {
        self.retry_at = Some(Instant::now() + RETRY_AFTER);
    }

    pub(in crate::agent) fn succeeded(&mut self) {
        self.retry_at = None;
        self.grown += 1;
    }
}

/// `256Mi`, `1Gi`, `512Ki` or a plain number of bytes (`0`: the maps never grow).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |at| text.split_at(at));
    let n: u64 = digits.parse().ok()?;
    let unit: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(caps: &Capacities, per_entry: u64) -> BTreeMap<MapId, (u32, u64)> {
        GROWABLE
            .into_iter()
            .map(|m| (m, (caps.get(m), u64::from(caps.get(m)) * per_entry)))
            .collect()
    }

    fn fill(used: &[(MapId, u64)], refused: &[MapId]) -> Fill {
        Fill {
            used: used.iter().copied().collect(),
            refused: refused.iter().copied().collect(),
        }
    }

    #[test]
    fn a_map_past_three_quarters_or_refused_doubles() {
        let caps = Capacities::default().with(MapId::Backends, 16);
        let b = bytes(&caps, 10);
        assert_eq!(
            plan(&caps, &fill(&[(MapId::Backends, 11)], &[]), &b, u64::MAX),
            Decision::Stay
        );
        assert_eq!(
            plan(&caps, &fill(&[(MapId::Backends, 12)], &[]), &b, u64::MAX),
            Decision::Grow(caps.with(MapId::Backends, 32))
        );
        assert_eq!(
            plan(&caps, &fill(&[], &[MapId::Backends]), &b, u64::MAX),
            Decision::Grow(caps.with(MapId::Backends, 32))
        );
    }

    #[test]
    fn the_ceiling_bounds_growth_and_then_stops_it() {
        let caps = Capacities::default().with(MapId::Backends, 1000);
        let b = bytes(&caps, 10);
        let total: u64 = b.values().map(|(_, x)| *x).sum();
        // Room for 500 more entries of 10 bytes: grows by half, not double.
        let d = plan(&caps, &fill(&[], &[MapId::Backends]), &b, total + 5_000);
        assert_eq!(d, Decision::Grow(caps.with(MapId::Backends, 1500)));
        // Room for 100 more: not worth a move (under an eighth): at the ceiling.
        let d = plan(&caps, &fill(&[], &[MapId::Backends]), &b, total + 1_000);
        assert_eq!(d, Decision::AtCeiling([MapId::Backends].into()));
    }

    #[test]
    fn sizes_parse_as_kubernetes_quantities() {
        assert_eq!(parse_bytes("256Mi"), Some(256 << 20));
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("12MB"), None);
    }
}
