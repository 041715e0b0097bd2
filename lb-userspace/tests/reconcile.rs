//! The reconciler against in-memory maps: restarts, orphans, full maps.
use lb_common::{Frontend as FrontendValue, SlotKey};
use socklb::{
    dataplane::{
        abi::{Family, Frontend, Protocol},
        maps::{Capacities, InMemoryMaps, MapWrite, ServiceMaps as _},
    },
    model::ObjectKey,
    reconcile::{Reconciler, ServiceProblem, invariants},
    translate::{DesiredService, DesiredState, Scope, ServicePortKey},
};

fn key(name: &str) -> ServicePortKey {
    ServicePortKey {
        service: ObjectKey::new("default", name),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
        family: Family::IPv4,
        scope: Scope::Internal,
    }
}

fn service(vip: &str, backends: &[&str]) -> DesiredService {
    DesiredService {
        port: 80,
        frontends: [Frontend::new(vip.parse().unwrap(), 80, Protocol::Tcp)]
            .into_iter()
            .collect(),
        backends: backends.iter().map(|b| b.parse().unwrap()).collect(),
        affinity_timeout_s: None,
    }
}

fn world(services: &[(&str, &str, &[&str])]) -> DesiredState {
    DesiredState {
        services: services
            .iter()
            .map(|(name, vip, backends)| (key(name), service(vip, backends)))
            .collect(),
    }
}

#[test]
fn a_restarted_reconciler_adopts_ids_and_writes_nothing_when_in_step() {
    let desired = world(&[
        ("a", "10.96.0.1", &["10.244.0.1:80", "10.244.0.2:80"]),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
    ]);
    let mut first = Reconciler::new(InMemoryMaps::new()).unwrap();
    first.sync_all(&desired);
    let ids = first.service_ids().clone();
    let content = first.maps().content.clone();

    // The pinned maps outlive the agent; a new one starts on them.
    let mut maps = InMemoryMaps::new();
    maps.content = content.clone();
    let mut second = Reconciler::new(maps).unwrap();
    assert_eq!(
        second.service_ids(),
        &ids,
        "service ids recovered from the metadata"
    );
    let report = second.sync_all(&desired);
    assert_eq!(
        report.writes, 0,
        "nothing to write when the maps already match"
    );
    assert_eq!(second.maps().content, content);

    // A change after the restart reuses the recovered ids and backend ids.
    let report = second.sync_all(&world(&[
        (
            "a",
            "10.96.0.1",
            &["10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"],
        ),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
    ]));
    assert_eq!(second.service_ids(), &ids);
    assert_eq!(
        report.writes, 3,
        "one backend, one slot, one frontend count"
    );
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
    // An orphan: a frontend and slot of a service id without metadata (a crash mid-write).
    maps.content.frontends.insert(
        Frontend::new("10.96.0.77".parse().unwrap(), 80, Protocol::Tcp).to_key(),
        FrontendValue {
            service_id: 77,
            count: 1,
            ..FrontendValue::default()
        },
    );
    maps.content.slots.insert(
        SlotKey {
            service_id: 77,
            slot: 1,
        },
        1,
    );

    let mut r = Reconciler::new(maps).unwrap();
    r.sync_all(&world(&[("kept", "10.96.0.1", &["10.244.0.1:80"])]));
    let snap = r.snapshot();
    assert_eq!(
        snap.frontends.len(),
        1,
        "only the kept service's frontend is left"
    );
    assert_eq!(snap.slots.len(), 1);
    assert_eq!(
        snap.backends.len(),
        1,
        "the swept services' backends are freed"
    );
    assert_eq!(snap.meta.len(), 1);
    assert!(invariants::violations(snap).is_empty());
}

#[test]
fn a_full_map_leaves_that_service_as_it_was_and_the_others_work() {
    let mut r = Reconciler::new(InMemoryMaps::with_capacities(Capacities {
        backends: 3,
        ..Capacities::default()
    }))
    .unwrap();
    r.sync_all(&world(&[
        ("a", "10.96.0.1", &["10.244.0.1:80"]),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
    ]));
    let before = r.snapshot().clone();

    // "a" grows by two backends, one more than the backend map holds; "c" is new and small.
    let report = r.sync_all(&world(&[
        (
            "a",
            "10.96.0.1",
            &["10.244.0.1:80", "10.244.0.5:80", "10.244.0.6:80"],
        ),
        ("b", "10.96.0.2", &["10.244.0.2:80"]),
        ("c", "10.96.0.3", &["10.244.0.2:80"]),
    ]));
    match report.problems.get(&key("a")) {
        Some(ServiceProblem::WriteFailed { kind, message }) => {
            assert_eq!(*kind, "map_full");
            assert!(message.contains("BACKENDS"), "names the map: {message}");
        }
        other => panic!("expected a write failure for a, got {other:?}"),
    }
    let snap = r.snapshot();
    let a_fe = Frontend::new("10.96.0.1".parse().unwrap(), 80, Protocol::Tcp).to_key();
    assert_eq!(
        snap.frontends[&a_fe], before.frontends[&a_fe],
        "a is on its previous state"
    );
    assert_eq!(
        snap.backends.len(),
        2,
        "the half-added backend was taken back"
    );
    let c_fe = Frontend::new("10.96.0.3".parse().unwrap(), 80, Protocol::Tcp).to_key();
    assert_eq!(snap.frontends[&c_fe].count, 1, "c, which fits, is written");
    assert_eq!(r.stats().errors.get("map_full"), Some(&1));
    assert!(invariants::violations(snap).is_empty());

    // Room is made (b goes): the retry of a succeeds.
    r.maps_mut().capacities.backends = 4;
    let report = r.sync_all(&world(&[
        (
            "a",
            "10.96.0.1",
            &["10.244.0.1:80", "10.244.0.5:80", "10.244.0.6:80"],
        ),
        ("c", "10.96.0.3", &["10.244.0.2:80"]),
    ]));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(r.snapshot().frontends[&a_fe].count, 3);
}

#[test]
fn writes_are_ordered_backends_slots_then_the_frontend() {
    let mut r = Reconciler::new(InMemoryMaps::new()).unwrap();
    r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80"],
    )]));
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = log.clone();
    r.maps_mut()
        .observe(move |_, w| sink.lock().unwrap().push(w.clone()));
    // Grow: a new backend, a new slot, then the count.
    r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80", "10.244.0.3:80"],
    )]));
    let kinds: Vec<&str> = log
        .lock()
        .unwrap()
        .iter()
        .map(|w| match w {
            MapWrite::PutBackend(..) => "backend",
            MapWrite::PutSlot(..) => "slot",
            MapWrite::PutFrontend(..) => "frontend",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["backend", "slot", "frontend"]);
    log.lock().unwrap().clear();
    // Shrink: the count first, then the trimmed slot, then the freed backend.
    r.sync_all(&world(&[(
        "a",
        "10.96.0.1",
        &["10.244.0.1:80", "10.244.0.2:80"],
    )]));
    let kinds: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        kinds,
        [
            "put frontend 10.96.0.1:80/TCP = service 1 count 2",
            "delete slot 1#3",
            "delete backend 3"
        ]
    );
    assert_eq!(r.maps().capacities(), Capacities::default());
}
