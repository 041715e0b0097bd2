//! The reconciler against in-memory maps: restarts, orphans, full maps, the order of writes and
//! the rule that a range a frontend uses is never written.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use lb_common::{Frontend, MapId, ports};
use socklb::{
    dataplane::{
        abi::{frontend_key, service_meta},
        maps::{
            Capacities, InMemoryMaps, MapSnapshot, MapWrite, MapWriteError, PackedMeta,
            ServiceMaps as _,
        },
    },
    reconcile::{Reconciler, SyncReport, invariants},
    translate::{ClaimKind, DesiredService, DesiredState, FrontendClaim},
    vocab::{
        Family, ObjectKey, Protocol, Scope, ServiceAddr, ServicePortKey, ServicePortKeyFields,
    },
};

fn key(name: &str) -> ServicePortKey {
    ServicePortKey::from(ServicePortKeyFields {
        service: ObjectKey::new("default", name),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
        family: Family::IPv4,
        scope: Scope::Cluster,
    })
}

fn vip(addr: &str) -> ServiceAddr {
    ServiceAddr::new(addr.parse().unwrap(), 80, Protocol::Tcp)
}

fn service(addr: &str, backends: &[&str]) -> DesiredService {
    DesiredService {
        port: 80,
        frontends: [FrontendClaim {
            addr: vip(addr),
            kind: ClaimKind::ClusterIp,
        }]
        .into_iter()
        .collect(),
        backends: backends.iter().map(|b| b.parse().unwrap()).collect(),
        ..DesiredService::default()
    }
}

fn world(services: &[(&str, &str, &[&str])]) -> DesiredState {
    DesiredState {
        services: services
            .iter()
            .map(|(name, addr, backends)| (key(name), service(addr, backends)))
            .collect(),
    }
}

/// Maps that record every write that touches a range some frontend uses, and every invariant
/// violation seen after a write.
fn guarded(maps: &mut InMemoryMaps) -> Arc<Mutex<Vec<String>>> {
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    let p = problems.clone();
    maps.guard(move |snap, write| {
        p.lock()
            .unwrap()
            .extend(invariants::overwrites_used_range(snap, write));
    });
    let p = problems.clone();
    let capacity = maps.capacities.get(MapId::Backends);
    maps.observe(move |snap, write| {
        for v in invariants::violations(snap, capacity) {
            p.lock().unwrap().push(format!("after `{write}`: {v}"));
        }
    });
    problems
}

fn assert_no_problems(problems: &Mutex<Vec<String>>) {
    let problems = problems.lock().unwrap();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The map write error a failed backend set reports.
fn failure(report: &SyncReport, name: &str) -> Arc<MapWriteError> {
    report
        .failed
        .get(&key(name))
        .unwrap_or_else(|| panic!("{name} did not fail: {:?}", report.failed))
        .0
        .clone()
}

fn reached(snap: &MapSnapshot, addr: &str) -> Option<Vec<String>> {
    snap.reach(&vip(addr)).map(|r| {
        r.backends
            .into_iter()
            .map(|b| b.map_or_else(|| "<empty>".into(), |a| a.to_string()))
            .collect()
    })
}

#[test]
fn a_restarted_reconciler_adopts_ids_and_ranges_and_writes_nothing_when_in_step() {
    let desired = world(&[
        ("a", "10.96.0.1", &["10.244.0.1:80", "10.244.0.2:80"]),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
    ]);
    let mut first = Reconciler::new(InMemoryMaps::new()).unwrap();
    first.sync_all(&desired);
    let ids: Vec<(ServicePortKey, u32)> =
        first.service_ids().map(|(k, id)| (k.clone(), id)).collect();
    let content = first.maps().content.clone();

    // The pinned maps outlive the agent; a new one starts on them.
    let mut maps = InMemoryMaps::new();
    maps.content = content.clone();
    let problems = guarded(&mut maps);
    let mut second = Reconciler::new(maps).unwrap();
    let adopted: Vec<(ServicePortKey, u32)> = second
        .service_ids()
        .map(|(k, id)| (k.clone(), id))
        .collect();
    assert_eq!(adopted, ids, "service ids recovered from the metadata");
    let report = second.sync_all(&desired);
    assert_eq!(
        report.writes, 0,
        "nothing to write when the maps already match"
    );
    assert_eq!(second.maps().content, content);

    // A change after the restart keeps the ids and moves the set to a range no frontend used.
    second.sync_all(&world(&[
        (
            "a",
            "10.96.0.1",
            &["10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"],
        ),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
    ]));
    let again: Vec<(ServicePortKey, u32)> = second
        .service_ids()
        .map(|(k, id)| (k.clone(), id))
        .collect();
    assert_eq!(again, ids);
    assert_eq!(
        reached(second.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"]
    );
    assert_no_problems(&problems);
}

/// An agent killed in the middle of a set's change leaves its frontends on two ranges: the
/// first flipped to the new one, the second still on the old. The next agent must not hand
/// either range to another set while a frontend points into it (here an older Service, written
/// first, would have taken the old range and the second frontend would have reached its
/// backends).
#[test]
fn a_restart_after_a_change_cut_short_keeps_every_range_a_frontend_uses() {
    let caps = Capacities::default().with(MapId::Backends, 8);
    let (ep_a, ep_b, ep_c) = ("10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80");
    let mut two = aged(service("10.96.0.1", &[ep_a, ep_b]), 2025, "two-uid");
    two.frontends = ["10.96.0.1", "10.96.0.3"]
        .into_iter()
        .map(|a| FrontendClaim {
            addr: vip(a),
            kind: ClaimKind::ClusterIp,
        })
        .collect();
    let mut desired = DesiredState::default();
    desired.services.insert(key("two"), two.clone());
    let mut first = Reconciler::new(InMemoryMaps::with_capacities(caps)).unwrap();
    let report = first.sync_all(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let old_range = *first.snapshot().frontends.values().next().unwrap();

    // Killed mid-change: the new range written and the first frontend flipped, not the second.
    let mut maps = InMemoryMaps::with_capacities(caps);
    maps.content = first.maps().content.clone();
    let new_base = old_range.base + u32::from(old_range.count);
    maps.write(&MapWrite::PutBackends {
        base: new_base,
        backends: [ep_a, ep_b, ep_c]
            .iter()
            .map(|a| socklb::dataplane::abi::backend(a.parse().unwrap()))
            .collect(),
    })
    .unwrap();
    maps.write(&MapWrite::PutFrontend(
        frontend_key(vip("10.96.0.1")),
        Frontend {
            base: new_base,
            count: 3,
            ..old_range
        },
    ))
    .unwrap();
    assert_eq!(
        reached(&maps.content, "10.96.0.3").unwrap(),
        [ep_a, ep_b],
        "the second frontend is still on the old range"
    );

    let problems = guarded(&mut maps);
    let mut second = Reconciler::new(maps).unwrap();
    let mut after = DesiredState::default();
    let mut grown = two;
    grown.backends = [ep_a, ep_b, ep_c]
        .iter()
        .map(|b| b.parse().unwrap())
        .collect();
    after.services.insert(key("two"), grown);
    after.services.insert(
        key("older"),
        aged(
            service("10.96.0.9", &["10.245.0.1:80", "10.245.0.2:80"]),
            2019,
            "older-uid",
        ),
    );
    let report = second.sync_all(&after);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    for addr in ["10.96.0.1", "10.96.0.3"] {
        let mut got = reached(second.snapshot(), addr).unwrap();
        got.sort();
        assert_eq!(got, [ep_a, ep_b, ep_c], "{addr}");
    }
    assert_no_problems(&problems);
}

#[test]
fn the_first_full_sync_sweeps_what_the_cluster_no_longer_has() {
    let mut maps = InMemoryMaps::new();
    {
        let mut old = Reconciler::new(InMemoryMaps::new()).unwrap();
        old.sync_all(&world(&[
            ("gone", "10.96.0.9", &["10.244.0.9:80"]),
            ("kept", "10.96.0.1", &["10.244.0.1:80"]),
        ]));
        maps.content = old.maps().content.clone();
    }
    // An orphan: a frontend of a service id without metadata (a crash mid-write).
    maps.content.frontends.insert(
        frontend_key(vip("10.96.0.77")),
        Frontend {
            service_id: 77,
            base: 100,
            count: 0,
            ..Frontend::default()
        },
    );
    // And metadata of a set nothing uses.
    maps.content
        .meta
        .insert(78, PackedMeta::pack(&service_meta(&key("forgotten"), 80)));

    let mut r = Reconciler::new(maps).unwrap();
    r.sync_all(&world(&[("kept", "10.96.0.1", &["10.244.0.1:80"])]));
    let snap = r.snapshot();
    assert_eq!(
        snap.frontends
            .keys()
            .map(|k| socklb::dataplane::abi::service_addr(k).unwrap())
            .collect::<Vec<_>>(),
        [vip("10.96.0.1")],
        "only the kept service's frontend is left"
    );
    assert_eq!(
        snap.meta.len(),
        1,
        "only the kept service's metadata is left"
    );
    assert!(reached(snap, "10.96.0.9").is_none());
    assert!(reached(snap, "10.96.0.77").is_none());
}

#[test]
fn a_full_map_leaves_that_service_as_it_was_and_the_others_work() {
    let caps = Capacities::default().with(MapId::Frontends4, 2);
    let mut maps = InMemoryMaps::with_capacities(caps);
    let problems = guarded(&mut maps);
    let mut r = Reconciler::new(maps).unwrap();
    let report = r.sync_all(&world(&[
        ("a", "10.96.0.1", &["10.244.0.1:80"]),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
        ("c", "10.96.0.3", &["10.244.0.3:80"]),
    ]));
    // The sets are written in key order: a and b fit, c does not.
    assert_eq!(
        report.failed.keys().cloned().collect::<Vec<_>>(),
        [key("c")],
        "the one that did not fit is named"
    );
    assert!(
        matches!(
            *failure(&report, "c"),
            MapWriteError::Full {
                map: MapId::Frontends4,
                capacity: 2
            }
        ),
        "{}",
        report.failed[&key("c")]
    );
    let snap = r.snapshot();
    assert!(
        reached(snap, "10.96.0.3").is_none(),
        "c was not written at all"
    );
    assert_eq!(reached(snap, "10.96.0.1").unwrap(), ["10.244.0.1:80"]);
    assert!(snap.meta.len() == 2, "c's metadata was rolled back");

    // Room appears (a goes away): the retry writes c.
    let report = r.sync_all(&world(&[
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
        ("c", "10.96.0.3", &["10.244.0.3:80"]),
    ]));
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        reached(r.snapshot(), "10.96.0.3").unwrap(),
        ["10.244.0.3:80"]
    );
    assert_no_problems(&problems);
}

#[test]
fn a_changed_set_moves_to_a_fresh_range_and_the_old_one_waits_out_its_grace() {
    let caps = Capacities::default().with(MapId::Backends, 3);
    // Without a program barrier: a released range waits out the grace period.
    let mut maps = InMemoryMaps::with_capacities(caps).without_barrier();
    let problems = guarded(&mut maps);
    let mut r = Reconciler::with_grace(maps, Duration::from_hours(1)).unwrap();
    r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80"],
    )]));
    // Three backends do not fit beside the two in use: the range of two is still referenced.
    let report = r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"],
    )]));
    assert!(
        matches!(
            *failure(&report, "a"),
            MapWriteError::AtCeiling {
                wanted: 3,
                serving: 2,
                ..
            }
        ),
        "{}",
        report.failed[&key("a")]
    );
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.1:80", "10.244.0.2:80"],
        "left as it was"
    );
    // One backend fits in the other two entries; the first range then waits (an hour here).
    r.sync_all(&world(&[("a", "10.96.0.1", &["10.244.0.2:80"])]));
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.2:80"]
    );
    assert_eq!(r.ranges().waiting_len(), 2);
    // No room for the new backend, and the one in use left: the set swaps it into its own
    // slot. Without a barrier the frontends first point at what stays (nothing: connects are
    // refused, never sent to the backend that left) until no program can read the slot.
    let report = r.sync_all(&world(&[("a", "10.96.0.1", &["10.244.0.3:80"])]));
    assert!(
        matches!(
            *failure(&report, "a"),
            MapWriteError::AtCeiling {
                wanted: 1,
                waiting: 2,
                serving: 0,
                ..
            }
        ),
        "{}",
        report.failed[&key("a")]
    );
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        Vec::<String>::new()
    );
    // The Service goes: the range it still held (narrowed to nothing) waits out its grace with
    // the other, and no entry of the array is lost.
    let report = r.sync_all(&DesiredState::default());
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        r.ranges().free_len() + r.ranges().waiting_len(),
        3,
        "every entry free or waiting"
    );
    assert_no_problems(&problems);
}

/// With a program barrier (the kernel's array-of-maps wait), a released range is reused as soon
/// as no program can still read it, without waiting out the grace period: a set changing at a
/// full backend array gets its new backends in the same write.
#[test]
fn a_barrier_frees_released_ranges_at_once() {
    let caps = Capacities::default().with(MapId::Backends, 3);
    let mut maps = InMemoryMaps::with_capacities(caps);
    let problems = guarded(&mut maps);
    let mut r = Reconciler::with_grace(maps, Duration::from_hours(1)).unwrap();
    r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80"],
    )]));
    r.sync_all(&world(&[("a", "10.96.0.1", &["10.244.0.2:80"])]));
    let report = r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.2:80", "10.244.0.3:80"],
    )]));
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.2:80", "10.244.0.3:80"]
    );
    assert_no_problems(&problems);
}

/// At exactly full maps, a change that removes a backend and adds another swaps the new one
/// into the slot of the one that left: the frontends narrow to the slot that stays, a barrier
/// later the freed slot is written and they widen again, all in the same sync. No write ever
/// touches a slot a frontend uses (`guarded`).
#[test]
fn a_change_at_exactly_full_maps_swaps_endpoints_in_place() {
    let caps = Capacities::default().with(MapId::Backends, 4);
    let mut maps = InMemoryMaps::with_capacities(caps);
    let problems = guarded(&mut maps);
    let mut r = Reconciler::with_grace(maps, Duration::ZERO).unwrap();
    let big = ("big", "10.96.0.9", &["10.244.9.1:80", "10.244.9.2:80"][..]);
    r.sync_all(&world(&[
        big,
        ("a", "10.96.0.1", &["10.244.0.1:80", "10.244.0.2:80"]),
    ]));
    assert_eq!(r.ranges().free_len(), 0, "exactly full");
    let report = r.sync_all(&world(&[
        big,
        ("a", "10.96.0.1", &["10.244.0.2:80", "10.244.0.3:80"]),
    ]));
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let mut reached_a = reached(r.snapshot(), "10.96.0.1").unwrap();
    reached_a.sort();
    assert_eq!(reached_a, ["10.244.0.2:80", "10.244.0.3:80"]);
    assert_eq!(
        reached(r.snapshot(), "10.96.0.9").unwrap(),
        ["10.244.9.1:80", "10.244.9.2:80"],
        "the other set is untouched"
    );
    assert_no_problems(&problems);
}

/// The same without a program barrier: the frontends narrow to the slot that stays (never the
/// backend that left), and the swap finishes at the retry once the grace has passed.
#[test]
fn without_a_barrier_an_in_place_swap_finishes_after_the_grace() {
    let grace = Duration::from_millis(200);
    let caps = Capacities::default().with(MapId::Backends, 4);
    let mut maps = InMemoryMaps::with_capacities(caps).without_barrier();
    let problems = guarded(&mut maps);
    let mut r = Reconciler::with_grace(maps, grace).unwrap();
    let big = ("big", "10.96.0.9", &["10.244.9.1:80", "10.244.9.2:80"][..]);
    let before = world(&[big, ("a", "10.96.0.1", &["10.244.0.1:80", "10.244.0.2:80"])]);
    let after = world(&[big, ("a", "10.96.0.1", &["10.244.0.2:80", "10.244.0.3:80"])]);
    r.sync_all(&before);
    let report = r.sync_all(&after);
    assert!(
        matches!(
            *failure(&report, "a"),
            MapWriteError::AtCeiling { serving: 1, .. }
        ),
        "{}",
        report.failed[&key("a")]
    );
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.2:80"],
        "the backend that left is never chosen again"
    );
    // Too early: nothing changes.
    let report = r.sync_all(&after);
    assert!(report.failed.contains_key(&key("a")));
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.2:80"]
    );
    std::thread::sleep(grace + Duration::from_millis(50));
    let report = r.sync_all(&after);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let mut reached_a = reached(r.snapshot(), "10.96.0.1").unwrap();
    reached_a.sort();
    assert_eq!(reached_a, ["10.244.0.2:80", "10.244.0.3:80"]);
    assert_no_problems(&problems);
}

#[test]
fn writes_are_ordered_range_bitmaps_metadata_then_the_frontend() {
    let mut maps = InMemoryMaps::new();
    let log: Arc<Mutex<Vec<MapWrite>>> = Arc::default();
    let l = log.clone();
    maps.observe(move |_, w| l.lock().unwrap().push(w.clone()));
    let mut r = Reconciler::new(maps).unwrap();
    r.sync_all(&world(&[("a", "10.96.0.1", &["10.244.0.1:8080"])]));
    let kinds: Vec<&str> = log
        .lock()
        .unwrap()
        .iter()
        .map(|w| match w {
            MapWrite::PutBackends { .. } => "backends",
            MapWrite::PutPorts { word, .. }
                if *word < ports::BACKEND || *word >= ports::FRONTEND_PORTS =>
            {
                "frontend port"
            }
            MapWrite::PutPorts { .. } => "backend port",
            MapWrite::PutMeta(..) => "meta",
            MapWrite::PutFrontend(..) => "frontend",
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "backends",
            "frontend port",
            "backend port",
            "frontend port",
            "meta",
            "frontend"
        ]
    );
    log.lock().unwrap().clear();
    r.sync_all(&DesiredState::default());
    let kinds: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .map(|w| {
            w.to_string()
                .split(' ')
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(
        kinds,
        ["delete frontend", "delete meta", "put ports", "put ports"],
        "removal: the frontend first, then its metadata, then the filter and port bits"
    );
    assert!(!r.snapshot().filter_bit(&frontend_key(vip("10.96.0.1"))));
    assert!(
        r.snapshot().backend_port_bit(false, 8080),
        "backend port bits stay: sockets may keep a backend after it left"
    );
}

/// A Service created in `year` (its age decides who gets room).
fn aged(mut s: DesiredService, year: i64, uid: &str) -> DesiredService {
    s.seniority = socklb::translate::Seniority {
        created: Some((year - 1970) * 365 * 86_400),
        uid: uid.into(),
    };
    s
}

/// An older Service (2019) at 10.96.0.1 with `old` as its endpoints, and seven newer two-endpoint
/// Services (2025) that, with it at two, fill a backend array of 16.
fn rollout_world(old: &[&str]) -> DesiredState {
    let mut w = DesiredState::default();
    w.services
        .insert(key("old"), aged(service("10.96.0.1", old), 2019, "old-uid"));
    for i in 0..7 {
        w.services.insert(
            key(&format!("filler-{i}")),
            aged(
                service(
                    &format!("10.96.1.{i}"),
                    &[&format!("10.245.{i}.1:80"), &format!("10.245.{i}.2:80")],
                ),
                2025,
                &format!("filler-{i}"),
            ),
        );
    }
    w
}

/// The rollout at a full backend array that cannot grow: seven newer Services (2025) and an
/// older one (2019) fill it; the older one rolls as a Deployment does, {A,B} → {A,B,C} → {B,C}
/// → {B,C,D} → {C,D}. It keeps the room it has and swaps its endpoints into it: the surge
/// endpoint waits (reported, the set serving the two it has), each replacement takes the slot
/// of the endpoint that left. No other set loses anything, at any step, with a barrier or
/// without one (then each swap finishes at the retry after the grace).
#[test]
fn at_a_full_backend_array_a_rollout_swaps_in_place_and_takes_no_one_elses_room() {
    for barrier in [true, false] {
        let grace = Duration::from_millis(100);
        let caps = Capacities::default().with(MapId::Backends, 16);
        let mut maps = InMemoryMaps::with_capacities(caps);
        if !barrier {
            maps = maps.without_barrier();
        }
        let problems = guarded(&mut maps);
        let mut r = Reconciler::with_grace(maps, grace).unwrap();
        let (ep_a, ep_b, ep_c, ep_d) = (
            "10.244.0.1:80",
            "10.244.0.2:80",
            "10.244.0.3:80",
            "10.244.0.4:80",
        );
        let report = r.sync_all(&rollout_world(&[ep_a, ep_b]));
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(r.ranges().free_len(), 0, "exactly full");
        for (step, serves, surge) in [
            (&[ep_a, ep_b, ep_c][..], &[ep_a, ep_b][..], true),
            (&[ep_b, ep_c], &[ep_b, ep_c], false),
            (&[ep_b, ep_c, ep_d], &[ep_b, ep_c], true),
            (&[ep_c, ep_d], &[ep_c, ep_d], false),
        ] {
            let mut report = r.sync_all(&rollout_world(step));
            if !barrier && !surge {
                // Narrowed to what stays, then swapped at the retry after the grace.
                std::thread::sleep(grace + Duration::from_millis(20));
                report = r.sync_all(&rollout_world(step));
            }
            let mut reached_old = reached(r.snapshot(), "10.96.0.1").unwrap();
            reached_old.sort();
            assert_eq!(reached_old, serves, "step {step:?} (barrier: {barrier})");
            if surge {
                assert!(
                    matches!(
                        *failure(&report, "old"),
                        MapWriteError::AtCeiling {
                            wanted: 3,
                            serving: 2,
                            ..
                        }
                    ),
                    "{:?}",
                    report.failed
                );
            } else {
                assert!(report.failed.is_empty(), "{:?}", report.failed);
            }
            for i in 0..7 {
                assert_eq!(
                    reached(r.snapshot(), &format!("10.96.1.{i}")).unwrap(),
                    [format!("10.245.{i}.1:80"), format!("10.245.{i}.2:80")],
                    "a newer Service keeps everything at step {step:?}"
                );
            }
        }
        assert_no_problems(&problems);
    }
}

/// A full frontend map: an older Service gets a new address and, in the same update, its
/// endpoint moves A → C. The backend change applies whatever the address does; the address
/// that does not fit waits (reported), and no newer Service gives up its frontend for it.
#[test]
fn a_frontend_that_does_not_fit_never_holds_back_the_rest_of_the_change() {
    let caps = Capacities::default().with(MapId::Frontends4, 3);
    let mut maps = InMemoryMaps::with_capacities(caps);
    let problems = guarded(&mut maps);
    let mut r = Reconciler::new(maps).unwrap();
    let two_addresses = |backends: &[&str], second: bool| {
        let mut s = service("10.96.0.1", backends);
        if second {
            s.frontends.insert(FrontendClaim {
                addr: vip("203.0.113.1"),
                kind: ClaimKind::LoadBalancer,
            });
        }
        s
    };
    let world_with = |backends: &[&str], second: bool| {
        let mut w = DesiredState::default();
        w.services.insert(
            key("old"),
            aged(two_addresses(backends, second), 2019, "old-uid"),
        );
        w.services.insert(
            key("tenant"),
            aged(service("10.96.1.1", &["10.245.0.1:80"]), 2024, "tenant-uid"),
        );
        w.services.insert(
            key("newest"),
            aged(service("10.96.1.2", &["10.245.0.2:80"]), 2025, "newest-uid"),
        );
        w
    };
    r.sync_all(&world_with(&["10.244.0.1:80"], false));
    assert_eq!(r.snapshot().frontends.len(), 3, "exactly full");
    let report = r.sync_all(&world_with(&["10.244.0.3:80"], true));
    assert_eq!(
        reached(r.snapshot(), "10.96.0.1").unwrap(),
        ["10.244.0.3:80"],
        "the endpoint moved"
    );
    assert!(
        reached(r.snapshot(), "203.0.113.1").is_none(),
        "the new address waits for room"
    );
    assert!(
        matches!(
            *failure(&report, "old"),
            MapWriteError::FrontendsLeftOut { left_out: 1, .. }
        ),
        "{:?}",
        report.failed
    );
    for (name, addr, backend) in [
        ("tenant", "10.96.1.1", "10.245.0.1:80"),
        ("newest", "10.96.1.2", "10.245.0.2:80"),
    ] {
        assert_eq!(
            reached(r.snapshot(), addr).unwrap(),
            [backend],
            "{name} keeps its frontend"
        );
        assert!(!report.failed.contains_key(&key(name)));
    }
    assert_no_problems(&problems);
}

/// Nothing is ever taken out to make room, even where a removal keeps failing: the set that
/// cannot be removed keeps serving, the one that finds no room waits, and the sync returns.
#[test]
fn no_set_is_taken_out_for_another_even_where_removals_fail() {
    let caps = Capacities::default().with(MapId::Backends, 2);
    let maps = InMemoryMaps::with_capacities(caps);
    let mut r = Reconciler::new(maps).unwrap();
    let newer = aged(
        service("10.96.0.2", &["10.244.1.1:80", "10.244.1.2:80"]),
        2025,
        "newer",
    );
    let report = r.sync_all(&DesiredState {
        services: [(key("newer"), newer.clone())].into_iter().collect(),
    });
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    r.maps_mut()
        .fail_when(|_, w, _| matches!(w, MapWrite::DeleteFrontend(_) | MapWrite::DeleteMeta(_)));
    let both = DesiredState {
        services: [
            (key("newer"), newer),
            (
                key("older"),
                aged(service("10.96.0.1", &["10.244.0.1:80"]), 2019, "older"),
            ),
        ]
        .into_iter()
        .collect(),
    };
    // On its own thread: before the fix this sync never returned.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let report = r.sync_all(&both);
        tx.send((report, r)).ok();
    });
    let (report, r) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the sync returns");
    assert!(
        report.failed.contains_key(&key("older")),
        "no room: {:?}",
        report.failed
    );
    assert_eq!(
        reached(r.snapshot(), "10.96.0.2").unwrap(),
        ["10.244.1.1:80", "10.244.1.2:80"],
        "the set whose removal failed still serves"
    );
}

/// The live table the termination pass judges by (issue 53.6): before any write lets a
/// program choose a UDP set's new backend, the table already says it serves; after the write
/// it says exactly what the set serves; a set that goes leaves it.
#[test]
fn the_live_serving_table_holds_a_backend_before_any_program_can_choose_it() {
    live_serving_case(InMemoryMaps::new());
}

/// The same with the full syncs' writes on a thread of their own: the table follows them as
/// they are done.
#[test]
fn the_live_serving_table_follows_writes_done_on_the_writer_thread() {
    live_serving_case(InMemoryMaps::new().queued());
}

fn live_serving_case(mut maps: InMemoryMaps) {
    use std::collections::BTreeMap;
    let udp_key = ServicePortKey::from(ServicePortKeyFields {
        service: ObjectKey::new("default", "dns"),
        port_name: "dns".into(),
        protocol: Protocol::Udp,
        family: Family::IPv4,
        scope: Scope::Cluster,
    });
    let addr = ServiceAddr::new("10.96.0.53".parse().unwrap(), 53, Protocol::Udp);
    let set = |backends: &[&str]| {
        let backends: Vec<std::net::SocketAddr> =
            backends.iter().map(|b| b.parse().unwrap()).collect();
        DesiredService {
            port: 53,
            frontends: [FrontendClaim {
                addr,
                kind: ClaimKind::ClusterIp,
            }]
            .into_iter()
            .collect(),
            serving: backends.clone(),
            backends,
            ..DesiredService::default()
        }
    };
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let live_cell: Arc<Mutex<Option<socklb::reconcile::LiveServing>>> = Arc::default();
    let (sink, cell) = (seen.clone(), live_cell.clone());
    maps.guard(move |snap, write| {
        let Some(live) = cell.lock().unwrap().clone() else {
            return;
        };
        // What each frontend reaches now, until this write, and what it will reach after.
        let mut reach: Vec<(lb_common::FrontendKey, Frontend)> =
            snap.frontends.iter().map(|(k, f)| (*k, *f)).collect();
        if let MapWrite::PutFrontend(k, f) = write {
            reach.push((*k, *f));
        }
        for (k, f) in &reach {
            let reachable: Vec<std::net::SocketAddr> =
                snap.range(f).into_iter().flatten().collect();
            let serving = live.get(k).map(|l| l.to_vec()).unwrap_or_default();
            for b in reachable {
                if !serving.contains(&b) {
                    sink.lock().unwrap().push(format!(
                        "{write}: {b} reachable, not in the live table {serving:?}"
                    ));
                }
            }
        }
    });
    let mut r = Reconciler::new(maps).unwrap();
    *live_cell.lock().unwrap() = Some(r.live_serving());
    let live = r.live_serving();
    let world = |backends: &[&str]| DesiredState {
        services: BTreeMap::from([(udp_key.clone(), set(backends))])
            .into_iter()
            .collect(),
    };
    r.sync_all(&world(&["10.244.0.1:53"]));
    r.sync_all(&world(&["10.244.0.1:53", "10.244.0.2:53"]));
    r.sync_all(&world(&["10.244.0.2:53", "10.244.0.3:53"]));
    let fe = frontend_key(addr);
    let mut now: Vec<String> = live
        .get(&fe)
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    now.sort();
    assert_eq!(
        now,
        ["10.244.0.2:53", "10.244.0.3:53"],
        "exactly what it serves after"
    );
    r.sync_all(&DesiredState::default());
    assert!(live.get(&fe).is_none(), "a set that goes leaves the table");
    let seen = seen.lock().unwrap();
    assert!(seen.is_empty(), "{}", seen.join("\n"));
}

/// `n` sets of one to eight backends, every seventh one UDP (its live table follows each of
/// its writes), aged so that the oldest is written first.
fn big_world(n: usize, shift: usize) -> DesiredState {
    let mut services = std::collections::BTreeMap::new();
    for i in 0..n {
        let name = format!("s{i}");
        let udp = i % 7 == 3;
        let k = ServicePortKey::from(ServicePortKeyFields {
            service: ObjectKey::new("default", name.as_str()),
            port_name: "p".into(),
            protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
            family: Family::IPv4,
            scope: Scope::Cluster,
        });
        let addr = ServiceAddr::new(
            std::net::Ipv4Addr::from(0x0a60_0000 + i as u32).into(),
            if udp { 53 } else { 80 },
            if udp { Protocol::Udp } else { Protocol::Tcp },
        );
        let backends: Vec<std::net::SocketAddr> = (0..=(i + shift) % 8)
            .map(|j| {
                format!("10.244.{}.{}:8080", i % 200, j + shift)
                    .parse()
                    .unwrap()
            })
            .collect();
        let set = DesiredService {
            port: if udp { 53 } else { 80 },
            frontends: [FrontendClaim {
                addr,
                kind: ClaimKind::ClusterIp,
            }]
            .into_iter()
            .collect(),
            serving: if udp { backends.clone() } else { Vec::new() },
            backends,
            ..DesiredService::default()
        };
        services.insert(k, aged(set, 2000 + i64::try_from(i % 20).unwrap(), &name));
    }
    DesiredState { services }
}

/// `big_world` without its UDP sets: no set waits for its own writes, so many are queued at once.
fn tcp_world(n: usize, shift: usize) -> DesiredState {
    let mut world = big_world(n, shift);
    world.services.retain(|k, _| k.protocol == Protocol::Tcp);
    world
}

/// The frontend of `world`'s set named `name`.
fn frontend_of(world: &DesiredState, name: &str) -> lb_common::FrontendKey {
    world
        .services
        .iter()
        .find(|(k, _)| k.service.name.as_ref() == name)
        .map(|(_, d)| frontend_key(d.frontends.iter().next().unwrap().addr))
        .unwrap()
}

/// In-memory maps with a backend array of `slots`, whose full syncs queue their writes or not.
fn backend_array(slots: u32, queued: bool) -> InMemoryMaps {
    let maps = InMemoryMaps::with_capacities(Capacities::default().with(MapId::Backends, slots));
    if queued { maps.queued() } else { maps }
}

/// Every address of `world` and the backends a connect to it reaches, in `snap`.
fn reaches(snap: &MapSnapshot, world: &DesiredState) -> Vec<(String, Option<Vec<String>>)> {
    world
        .services
        .values()
        .flat_map(|d| d.frontends.iter())
        .map(|c| {
            let reach = snap.reach(&c.addr).map(|r| {
                r.backends
                    .into_iter()
                    .map(|b| b.map_or_else(|| "<empty>".into(), |a| a.to_string()))
                    .collect()
            });
            (c.addr.to_string(), reach)
        })
        .collect()
}

/// Maps that log every write they take and every barrier, in order, on the thread that
/// writes.
struct Logged {
    inner: InMemoryMaps,
    log: Arc<Mutex<Vec<String>>>,
}

impl socklb::dataplane::maps::ServiceMaps for Logged {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        self.inner.write(write)?;
        self.log.lock().unwrap().push(write.to_string());
        Ok(())
    }

    fn read_all(&self) -> Result<MapSnapshot, socklb::dataplane::maps::MapReadError> {
        self.inner.read_all()
    }

    fn capacities(&self) -> Capacities {
        self.inner.capacities()
    }

    fn barrier(&mut self) -> bool {
        self.log.lock().unwrap().push("barrier".into());
        self.inner.barrier()
    }

    fn queue_writes(&self) -> bool {
        self.inner.queue_writes()
    }
}

/// A full sync with its writes on their own thread does exactly what one without does: the
/// same writes and barriers in the same order (a first sync, then one where every set
/// changes, some go and some come, and the backend array runs short of free ranges so the
/// released ones are reclaimed after a barrier), never a range a frontend uses, and every
/// address reaches its backends.
#[test]
fn a_full_sync_with_its_writes_on_a_thread_writes_the_same_in_the_same_order() {
    let first = big_world(600, 0);
    let mut second = big_world(700, 1);
    second
        .services
        .retain(|k, _| !k.service.name.ends_with('5'));
    let run = |queued: bool| {
        let mut maps = backend_array(4_096, queued);
        let problems = guarded(&mut maps);
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let maps = Logged {
            inner: maps,
            log: log.clone(),
        };
        // Released ranges come back only through a barrier, never by the clock: the two runs
        // take different times.
        let mut r = Reconciler::with_grace(maps, Duration::from_hours(1)).unwrap();
        let a = r.sync_all(&first);
        assert!(a.failed.is_empty(), "{:?}", a.failed);
        assert_eq!(
            reaches(r.snapshot(), &first),
            reaches(&r.maps().inner.content, &first)
        );
        let b = r.sync_all(&second);
        assert!(b.failed.is_empty(), "{:?}", b.failed);
        assert_no_problems(&problems);
        let reached = reaches(&r.maps().inner.content, &second);
        let log = log.lock().unwrap().clone();
        (
            log,
            (a.writes, b.writes, b.services_changed),
            reached,
            r.stats().writes,
        )
    };
    let serial = run(false);
    let queued = run(true);
    assert!(serial.0.len() > 2_000, "{} writes", serial.0.len());
    assert!(
        serial.0.iter().any(|w| w == "barrier"),
        "the second sync needed a barrier"
    );
    assert!(
        serial.0 == queued.0,
        "the logs differ first at {:?}: {:?}",
        serial.0.iter().zip(&queued.0).position(|(a, b)| a != b),
        serial
            .0
            .iter()
            .zip(&queued.0)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(3)
            .collect::<Vec<_>>()
    );
    assert_eq!(serial.1, queued.1, "the reports' counts");
    assert_eq!(serial.3, queued.3, "the writes counted for metrics");
    // What a connect reaches, read from the maps themselves.
    for (addr, reach) in &queued.2 {
        let mut want: Vec<String> = second
            .services
            .values()
            .find(|d| d.frontends.iter().any(|c| c.addr.to_string() == *addr))
            .unwrap()
            .backends
            .iter()
            .map(ToString::to_string)
            .collect();
        want.sort();
        // In slot order, which keeps the place of a backend that stays.
        let mut got = reach.clone().unwrap_or_default();
        got.sort();
        assert_eq!(got, want, "{addr}");
    }
}

/// A write on the writer thread fails: that set is left as it was and reported, and every set
/// queued after it is still written, as without the thread. Then, the undo of a failed set
/// failing too (the maps keep a half-written set, as after a kill): the next sync finishes it.
#[test]
fn a_failed_write_on_the_writer_thread_costs_only_its_own_set() {
    // Many sets queued past the failed one.
    let world = tcp_world(400, 0);
    let sets = world.services.len();
    let victim = frontend_of(&world, "s151");
    let run = |queued: bool| {
        let mut maps = backend_array(8_192, queued);
        let problems = guarded(&mut maps);
        maps.fail_when(move |_, w, _| matches!(w, MapWrite::PutFrontend(k, _) if *k == victim));
        let mut r = Reconciler::new(maps).unwrap();
        let report = r.sync_all(&world);
        assert_no_problems(&problems);
        (r, report, problems)
    };
    let (_, serial, _) = run(false);
    let (mut r, report, problems) = run(true);
    assert_eq!(
        report
            .failed
            .keys()
            .map(|k| k.service.name.to_string())
            .collect::<Vec<_>>(),
        ["s151"],
        "only the set whose write failed"
    );
    assert!(matches!(
        *failure_of(&report, "s151"),
        MapWriteError::Injected { .. }
    ));
    let content = &r.maps().content;
    for (addr, reach) in reaches(content, &world) {
        if addr.starts_with("10.96.0.151:") {
            assert_eq!(reach, None, "{addr}: the failed set serves nothing");
        } else {
            assert!(
                reach.is_some_and(|b| !b.is_empty()),
                "{addr} reaches no backend"
            );
        }
    }
    assert_eq!(
        content.meta.len(),
        sets - 1,
        "the failed set's metadata was undone"
    );
    assert_eq!(
        reaches(content, &world),
        reaches(&run(false).0.maps().content, &world)
    );
    assert_eq!(report.writes, serial.writes, "writes counted");
    assert_eq!(report.services_changed, serial.services_changed);
    assert_eq!(
        reaches(r.snapshot(), &world),
        reaches(content, &world),
        "the mirror is the maps"
    );

    // The next sync, the write working again, writes it.
    r.maps_mut().stop_failing();
    let again = r.sync_all(&world);
    assert!(again.failed.is_empty(), "{:?}", again.failed);
    assert!(
        reaches(&r.maps().content, &world)
            .iter()
            .all(|(_, b)| b.is_some())
    );
    assert_no_problems(&problems);
}

/// A failed write whose undo fails too: the new set's metadata stays without a frontend, as
/// after a kill; the others are written, and the next sync completes it.
#[test]
fn a_failed_queued_write_whose_undo_fails_is_finished_by_the_next_sync() {
    let world = tcp_world(400, 0);
    let sets = world.services.len();
    let mut maps = backend_array(8_192, true);
    let problems = guarded(&mut maps);
    let mut r = Reconciler::new(maps).unwrap();
    assert!(r.sync_all(&world).failed.is_empty());
    let mut changed = tcp_world(400, 1);
    let newcomer = key("newcomer");
    changed
        .services
        .insert(newcomer.clone(), service("10.97.0.1", &["10.245.0.1:8080"]));
    let fe = frontend_key(vip("10.97.0.1"));
    let armed = Arc::new(Mutex::new(true));
    let gate = armed.clone();
    r.maps_mut().fail_when(move |_, w, _| {
        *gate.lock().unwrap()
            && match w {
                MapWrite::PutFrontend(k, _) => *k == fe,
                MapWrite::DeleteMeta(_) => true,
                _ => false,
            }
    });
    let report = r.sync_all(&changed);
    assert_eq!(
        report.failed.keys().cloned().collect::<Vec<_>>(),
        [newcomer]
    );
    assert!(
        r.stats()
            .errors
            .contains_key(&socklb::vocab::ErrorKind::Rollback),
        "the undo's failure is counted"
    );
    assert_eq!(
        r.maps().content.meta.len(),
        sets + 1,
        "the newcomer's metadata stays, as the undo failed"
    );
    for (addr, reach) in reaches(&r.maps().content, &changed) {
        assert_eq!(reach.is_some(), !addr.starts_with("10.97.0.1:"), "{addr}");
    }
    *armed.lock().unwrap() = false;
    let report = r.sync_all(&changed);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    for (addr, reach) in reaches(&r.maps().content, &changed) {
        assert!(reach.is_some_and(|b| !b.is_empty()), "{addr}");
    }
    assert_eq!(
        reaches(r.snapshot(), &changed),
        reaches(&r.maps().content, &changed)
    );
    assert_no_problems(&problems);
}

fn failure_of(report: &SyncReport, name: &str) -> Arc<MapWriteError> {
    report
        .failed
        .iter()
        .find(|(k, _)| k.service.name.as_ref() == name)
        .map_or_else(|| panic!("{name} did not fail"), |(_, f)| f.0.clone())
}

/// After a failed write on the writer thread, the reconciler adopts what the maps hold; the
/// ranges no frontend holds then may have been read a moment ago (a set's frontends just moved
/// off them), so none is written before a barrier or the grace: on maps without a barrier and
/// a grace longer than the test, no write ever lands in a range a frontend pointed into, and
/// every address still reaches a backend.
#[test]
fn after_a_failed_queued_write_no_range_a_frontend_just_left_is_written() {
    let (first, second) = (tcp_world(300, 0), tcp_world(300, 1));
    let mut maps = backend_array(8_192, true).without_barrier();
    let problems = guarded(&mut maps);
    let pointed: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let (sink, seen) = (problems.clone(), pointed.clone());
    maps.guard(move |snap, write| {
        let mut seen = seen.lock().unwrap();
        seen.extend(
            snap.frontends
                .values()
                .filter(|f| f.count > 0)
                .map(|f| (f.base, f.base + u32::from(f.count))),
        );
        if let MapWrite::PutBackends { base, backends } = write {
            let end = base + backends.len() as u32;
            if let Some(r) = seen.iter().find(|(s, e)| *s < end && *base < *e) {
                sink.lock().unwrap().push(format!(
                    "`{write}` lands in {}..{}, which a frontend pointed into",
                    r.0, r.1
                ));
            }
        }
    });
    let mut r = Reconciler::with_grace(maps, Duration::from_hours(1)).unwrap();
    assert!(r.sync_all(&first).failed.is_empty());
    let victim = frontend_of(&second, "s151");
    r.maps_mut()
        .fail_when(move |_, w, _| matches!(w, MapWrite::PutFrontend(k, _) if *k == victim));
    let report = r.sync_all(&second);
    assert!(matches!(
        *failure_of(&report, "s151"),
        MapWriteError::Injected { .. }
    ));
    assert_no_problems(&problems);
    for (addr, reach) in reaches(&r.maps().content, &second) {
        assert!(
            reach.is_some_and(|b| !b.is_empty()),
            "{addr} reaches no backend"
        );
    }
    assert_eq!(
        reaches(r.snapshot(), &second),
        reaches(&r.maps().content, &second)
    );
}

/// Maps whose reads fail while `unreadable` is set.
struct Unreadable {
    inner: InMemoryMaps,
    unreadable: Arc<std::sync::atomic::AtomicBool>,
}

impl socklb::dataplane::maps::ServiceMaps for Unreadable {
    fn write(&mut self, write: &MapWrite) -> Result<(), MapWriteError> {
        self.inner.write(write)
    }

    fn read_all(&self) -> Result<MapSnapshot, socklb::dataplane::maps::MapReadError> {
        if self.unreadable.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(socklb::dataplane::maps::MapReadError::new(
                MapId::Frontends4,
                std::io::Error::other("injected read failure"),
            ));
        }
        self.inner.read_all()
    }

    fn capacities(&self) -> Capacities {
        self.inner.capacities()
    }

    fn queue_writes(&self) -> bool {
        true
    }
}

/// A queued write fails and the maps then cannot be read back: what they hold is not known, so
/// nothing more is written (the sets not written are refused, named, and the maps keep serving
/// what they held) until a read works again; then the next sync writes everything.
#[test]
fn maps_not_read_back_after_a_failed_queued_write_are_not_written_until_they_are() {
    let world = tcp_world(200, 0);
    let victim = frontend_of(&world, "s151");
    let mut inner = backend_array(8_192, false);
    let problems = guarded(&mut inner);
    inner.fail_when(move |_, w, _| matches!(w, MapWrite::PutFrontend(k, _) if *k == victim));
    let unreadable = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut r = Reconciler::new(Unreadable {
        inner,
        unreadable: unreadable.clone(),
    })
    .unwrap();
    unreadable.store(true, std::sync::atomic::Ordering::SeqCst);
    let report = r.sync_all(&world);
    assert!(matches!(
        *failure_of(&report, "s151"),
        MapWriteError::Injected { .. }
    ));
    let unread: Vec<String> = report
        .failed
        .iter()
        .filter(|(_, f)| matches!(*f.0, MapWriteError::Unread(_)))
        .map(|(k, _)| k.service.name.to_string())
        .collect();
    let served = reaches(&r.maps().inner.content, &world)
        .into_iter()
        .filter(|(_, b)| b.is_some())
        .count();
    assert!(served > 0, "the sets written before the failure serve");
    assert!(
        !unread.is_empty(),
        "the sets after the failure are refused as unread"
    );
    assert_eq!(
        served + unread.len() + 1,
        world.services.len(),
        "every set is served or named as refused"
    );

    // Still unreadable: nothing is written, every set is refused.
    let writes = r.maps().inner.writes();
    let report = r.sync_all(&world);
    assert_eq!(
        r.maps().inner.writes(),
        writes,
        "no write while the maps are unknown"
    );
    assert_eq!(report.failed.len(), world.services.len());
    assert_eq!(
        reaches(&r.maps().inner.content, &world)
            .iter()
            .filter(|(_, b)| b.is_some())
            .count(),
        served,
        "what served still serves"
    );

    // Readable and writable again: the next sync writes everything.
    unreadable.store(false, std::sync::atomic::Ordering::SeqCst);
    r.maps_mut().inner.stop_failing();
    let report = r.sync_all(&world);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    for (addr, reach) in reaches(&r.maps().inner.content, &world) {
        assert!(reach.is_some_and(|b| !b.is_empty()), "{addr}");
    }
    assert_eq!(
        reaches(r.snapshot(), &world),
        reaches(&r.maps().inner.content, &world)
    );
    assert_no_problems(&problems);
}
