//! The checks the fuzz target (lb-userspace/fuzz) runs on arbitrary bytes: parse them as
//! manifests, translate what validates, reconcile it into in-memory maps, and assert that the
//! write-order rule holds before every write and the maps' invariants after it. Any panic is a
//! finding.
use crate::{
    dataplane::maps::{InMemoryMaps, ServiceMaps as _},
    model::{Store, parse_manifests},
    reconcile::{Reconciler, invariants},
    translate::{NodeInfo, translate_all},
};

/// Panics if the bytes make any layer misbehave.
pub fn manifests(data: &[u8]) {
    let parsed = parse_manifests("fuzz", data);
    for e in &parsed.errors {
        // Every rejection names where it came from.
        assert!(e.location.starts_with("fuzz"), "{e}");
    }
    let store: Store = parsed.objects.into_iter().collect();
    let node = NodeInfo {
        name: Some("node-a".into()),
        zone: Some("zone-a".into()),
        addresses: vec![
            "192.0.2.1".parse().expect("literal"),
            "2001:db8::1".parse().expect("literal"),
        ],
        ..NodeInfo::default()
    };
    let (desired, _) = translate_all(&store, &node);
    let mut maps = InMemoryMaps::new();
    maps.guard(|snap, write| {
        let broken = invariants::overwrites_used_range(snap, write);
        assert!(broken.is_none(), "{broken:?}");
    });
    maps.observe(|snap, write| {
        let broken = invariants::violations(snap, lb_common::MapId::Backends.default_capacity());
        assert!(broken.is_empty(), "after {write}: {broken:?}");
    });
    let mut reconciler = Reconciler::new(maps).expect("empty maps");
    reconciler.sync_all(&desired);
    let snap = reconciler.maps().read_all().expect("in-memory read");
    assert_eq!(
        &snap,
        reconciler.snapshot(),
        "the reconciler's mirror matches the maps"
    );
}
