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
    let mut maps = InMemoryMaps::new();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let live_cell: Arc<Mutex<Option<socklb::reconcile::LiveServing>>> = Arc::default();
    let (sink, cell) = (seen.clone(), live_cell.clone());
    maps.guard(move |snap, write| {
        let Some(live) = cell.lock().unwrap().clone() else {
            return;
        };
        if let MapWrite::PutFrontend(k, f) = write {
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
