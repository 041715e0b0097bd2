//! Property tests over arbitrary (also nonsensical) Services and EndpointSlices:
//! - validation and translation never panic;
//! - after every single map write, each frontend's range holds backends of its family, and only
//!   backends it had before or should have after the change; no write touches a range a
//!   frontend uses;
//! - reconciling a change incrementally gives the same maps as reconciling from scratch;
//! - with injected write failures (on any write, removals included), a failed backend set is
//!   left exactly as it was, the others reach their desired state, and a retry without failures
//!   converges.
//!
//! The expected view is computed here, independently of the reconciler: each address goes to
//! the claim the ownership rule picks (ClusterIP first, then the oldest Service, then the
//! smallest uid), written out again in `expected_view`.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::{
    api::{core::v1 as core, discovery::v1 as discovery},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use lb_common::MapId;
use proptest::prelude::*;
use socklb::{
    dataplane::{
        abi::service_addr,
        maps::{InMemoryMaps, MapSnapshot},
    },
    model::{Store, service_from_api, slice_from_api},
    reconcile::{Reconciler, invariants},
    translate::{ClaimKind, DesiredState, NodeInfo, translate_all},
    vocab::{ErrorKind, ServiceAddr, ServicePortKey},
};

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> {
    proptest::sample::select(items)
}

const NAMES: &[&str] = &["a", "b", "c", "Bad_Name", ""];
const IPS: &[&str] = &[
    "10.96.0.1",
    "10.96.0.2",
    "fd00:96::1",
    "fd00:96::2",
    "None",
    "",
    "garbage",
    "10.96.0.300",
];
const POD_IPS: &[&str] = &[
    "10.244.0.1",
    "10.244.0.2",
    "10.244.0.3",
    "10.244.0.4",
    "fd00:244::1",
    "fd00:244::2",
    "nope",
];

fn opt_bool() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![Just(None), Just(Some(true)), Just(Some(false))]
}

fn service_port() -> impl Strategy<Value = core::ServicePort> {
    (
        pick(&["", "http", "dns", "BAD NAME"]),
        pick(&[None, Some("TCP"), Some("UDP"), Some("SCTP"), Some("XYZ")]),
        prop_oneof![Just(80), Just(53), Just(0), Just(70000), -3..5i32],
        prop_oneof![
            Just(None),
            (1..9000i32).prop_map(|n| Some(IntOrString::Int(n))),
            pick(&["http", "dns", "8080", "Bad"]).prop_map(|s| Some(IntOrString::String(s.into()))),
        ],
        prop_oneof![Just(None), Just(Some(30080)), Just(Some(99999))],
    )
        .prop_map(
            |(name, protocol, port, target_port, node_port)| core::ServicePort {
                name: (!name.is_empty()).then(|| name.into()),
                protocol: protocol.map(Into::into),
                port,
                target_port,
                node_port,
                ..Default::default()
            },
        )
}

fn service() -> impl Strategy<Value = core::Service> {
    (
        pick(NAMES),
        pick(&["default", "x"]),
        pick(IPS),
        proptest::collection::vec(pick(IPS), 0..3),
        pick(&[
            None,
            Some("ClusterIP"),
            Some("NodePort"),
            Some("LoadBalancer"),
            Some("ExternalName"),
            Some("Weird"),
        ]),
        proptest::collection::vec(service_port(), 0..4),
        (
            pick(&[None, Some("ClientIP"), Some("Bogus")]),
            prop_oneof![Just(None), (-5..100_000i32).prop_map(Some)],
        ),
        (
            pick(&[None, Some("Local"), Some("Cluster"), Some("Wrong")]),
            pick(&[None, Some("Local"), Some("Cluster")]),
        ),
        (opt_bool(), pick(&["u1", "u2", "u3"]), 0..3i64),
        proptest::collection::vec(pick(IPS), 0..2),
    )
        .prop_map(
            |(
                name,
                ns,
                ip,
                ips,
                type_,
                ports,
                (affinity, timeout),
                (itp, etp),
                (pnra, uid, age),
                external,
            )| {
                core::Service {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        namespace: Some(ns.into()),
                        uid: Some(uid.into()),
                        creation_timestamp: Some(Time(
                            k8s_openapi::jiff::Timestamp::from_second(1_600_000_000 + age)
                                .expect("valid"),
                        )),
                        ..Default::default()
                    },
                    spec: Some(core::ServiceSpec {
                        cluster_ip: Some(ip.into()),
                        cluster_ips: (!ips.is_empty())
                            .then(|| ips.iter().map(|s| (*s).into()).collect()),
                        type_: type_.map(Into::into),
                        ports: Some(ports),
                        session_affinity: affinity.map(Into::into),
                        session_affinity_config: timeout.map(|t| core::SessionAffinityConfig {
                            client_ip: Some(core::ClientIPConfig {
                                timeout_seconds: Some(t),
                            }),
                        }),
                        internal_traffic_policy: itp.map(Into::into),
                        external_traffic_policy: etp.map(Into::into),
                        publish_not_ready_addresses: pnra,
                        external_ips: Some(external.iter().map(|s| (*s).into()).collect()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            },
        )
}

fn endpoint() -> impl Strategy<Value = discovery::Endpoint> {
    (
        proptest::collection::vec(pick(POD_IPS), 0..2),
        (opt_bool(), opt_bool(), opt_bool()),
        pick(&[None, Some("node-a"), Some("node-b")]),
        pick(&[None, Some("zone-a"), Some("zone-b"), Some("")]),
    )
        .prop_map(|(addresses, (ready, serving, terminating), node, hints)| {
            discovery::Endpoint {
                addresses: addresses.iter().map(|s| (*s).into()).collect(),
                conditions: Some(discovery::EndpointConditions {
                    ready,
                    serving,
                    terminating,
                }),
                node_name: node.map(Into::into),
                hints: hints.map(|zone| discovery::EndpointHints {
                    for_zones: Some(if zone.is_empty() {
                        Vec::new()
                    } else {
                        vec![discovery::ForZone { name: zone.into() }]
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
}

fn slice() -> impl Strategy<Value = discovery::EndpointSlice> {
    (
        pick(&["s1", "s2", "s3", "s4"]),
        pick(&["default", "x"]),
        pick(&[Some("a"), Some("b"), Some("c"), None]),
        pick(&["IPv4", "IPv6", "FQDN", "IPv5"]),
        proptest::collection::vec(endpoint(), 0..6),
        proptest::collection::vec(
            (
                pick(&["", "http", "dns"]),
                pick(&[None, Some("TCP"), Some("UDP")]),
                prop_oneof![Just(None), (0..70000i32).prop_map(Some)],
            ),
            0..3,
        ),
    )
        .prop_map(
            |(name, ns, svc, address_type, endpoints, ports)| discovery::EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some(ns.into()),
                    labels: svc
                        .map(|s| BTreeMap::from([("kubernetes.io/service-name".into(), s.into())])),
                    ..Default::default()
                },
                address_type: address_type.into(),
                endpoints,
                ports: Some(
                    ports
                        .into_iter()
                        .map(|(name, protocol, port)| discovery::EndpointPort {
                            name: (!name.is_empty()).then(|| name.into()),
                            protocol: protocol.map(Into::into),
                            port,
                            ..Default::default()
                        })
                        .collect(),
                ),
            },
        )
}

type World = (Vec<core::Service>, Vec<discovery::EndpointSlice>);

fn world() -> impl Strategy<Value = World> {
    (
        proptest::collection::vec(service(), 0..6),
        proptest::collection::vec(slice(), 0..6),
    )
}

fn node() -> NodeInfo {
    NodeInfo {
        name: Some("node-a".into()),
        zone: Some("zone-a".into()),
        addresses: vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()],
        ..NodeInfo::default()
    }
}

/// Validates (dropping rejected objects, like the agent) and translates a world, every claim
/// kept: `translate_all`'s own ownership step is what `expected_view` checks.
fn desired(world: &World) -> (DesiredState, DesiredState) {
    let mut store = Store::new();
    let mut seen = BTreeSet::new();
    for s in world.0.iter().filter_map(|s| service_from_api(s).ok()) {
        if seen.insert(s.key.clone()) {
            store.upsert_service(s);
        }
    }
    for s in world.1.iter().filter_map(|s| slice_from_api(s).ok()) {
        store.upsert_slice(s);
    }
    let mut claimed = DesiredState::default();
    for svc in store.services() {
        let t = socklb::translate::translate_service(svc, &store.slices_of(&svc.key), &node());
        for p in t.ports {
            claimed.services.insert(p.key, p.desired);
        }
    }
    (translate_all(&store, &node()).0, claimed)
}

type View = BTreeMap<ServiceAddr, BTreeSet<SocketAddr>>;

/// What a client would see: service address → the backends it spreads over.
fn view(snap: &MapSnapshot) -> View {
    snap.frontends
        .iter()
        .map(|(k, fe)| {
            let backends = snap.range(fe).into_iter().flatten().collect();
            (service_addr(k).expect("valid key"), backends)
        })
        .collect()
}

/// Who wins an address: (not a ClusterIP, creation time, uid, backend set), smallest first.
type Rank = (bool, i64, String, ServicePortKey);

/// The view the claims ask for, ownership decided here: per address, the claim with the
/// smallest (not a ClusterIP, creation time, uid, backend set).
fn expected_view(claims: &DesiredState) -> View {
    let mut best: BTreeMap<ServiceAddr, (Rank, BTreeSet<SocketAddr>)> = BTreeMap::new();
    for (key, svc) in &claims.services {
        for c in &svc.frontends {
            let rank = (
                c.kind != ClaimKind::ClusterIp,
                svc.seniority.created.unwrap_or(i64::MAX),
                svc.seniority.uid.to_string(),
                key.clone(),
            );
            let entry = (rank, svc.backends.iter().copied().collect());
            match best.get(&c.addr) {
                Some((r, _)) if *r <= entry.0 => {}
                _ => {
                    best.insert(c.addr, entry);
                }
            }
        }
    }
    best.into_iter().map(|(a, (_, b))| (a, b)).collect()
}

type Allowed = Arc<Mutex<View>>;

/// Maps that check, before every write, that it touches no range a frontend uses, and after
/// every write the invariants and that each frontend only reaches backends it is allowed to
/// (what it had before the change, or should have after it).
fn checked_maps(allowed: &Allowed, violations: &Arc<Mutex<Vec<String>>>) -> InMemoryMaps {
    let mut maps = InMemoryMaps::new();
    let sink = violations.clone();
    maps.guard(move |snap, write| {
        sink.lock()
            .expect("lock")
            .extend(invariants::overwrites_used_range(snap, write));
    });
    let (allowed, sink) = (allowed.clone(), violations.clone());
    maps.observe(move |snap, write| {
        let mut found = invariants::violations(snap, MapId::Backends.default_capacity());
        let allowed = allowed.lock().expect("lock");
        for (fe, backends) in view(snap) {
            if let Some(ok) = allowed.get(&fe)
                && !backends.is_subset(ok)
            {
                found.push(format!("{fe} reaches {backends:?}, allowed {ok:?}"));
            }
        }
        if !found.is_empty() {
            sink.lock()
                .expect("lock")
                .push(format!("after `{write}`: {}", found.join("; ")));
        }
    });
    maps
}

fn allow(allowed: &Allowed, before: &View, after: &View) {
    let mut a = before.clone();
    for (fe, backends) in after {
        a.entry(*fe).or_default().extend(backends.iter().copied());
    }
    *allowed.lock().expect("lock") = a;
}

/// A reconciler whose released ranges are reusable at once (in memory no connect can still be
/// reading one), so capacity never depends on the clock.
fn reconciler(maps: InMemoryMaps) -> Reconciler<InMemoryMaps> {
    Reconciler::with_grace(maps, std::time::Duration::ZERO).unwrap()
}

fn rollback_errors(r: &Reconciler<InMemoryMaps>) -> u64 {
    r.stats()
        .errors
        .get(&ErrorKind::Rollback)
        .copied()
        .unwrap_or(0)
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn incremental_equals_from_scratch_and_every_write_is_safe(first in world(), second in world()) {
        let ((d1, c1), (d2, c2)) = (desired(&first), desired(&second));
        let allowed: Allowed = Arc::default();
        let violations = Arc::new(Mutex::new(Vec::new()));
        let mut r = reconciler(checked_maps(&allowed, &violations));
        allow(&allowed, &View::new(), &expected_view(&c1));
        r.sync_all(&d1);
        prop_assert_eq!(view(r.snapshot()), expected_view(&c1));
        allow(&allowed, &view(r.snapshot()), &expected_view(&c2));
        r.sync_all(&d2);
        let incremental = view(r.snapshot());

        let mut fresh = reconciler(InMemoryMaps::new());
        fresh.sync_all(&d2);
        prop_assert_eq!(&incremental, &view(fresh.snapshot()));
        prop_assert_eq!(&incremental, &expected_view(&c2));
        prop_assert_eq!(r.snapshot().meta.len(), fresh.snapshot().meta.len(), "no leaked metadata");
        // Released ranges wait for their grace (zero here) until the next allocation.
        prop_assert_eq!(
            r.ranges().free_len() + r.ranges().waiting_len(),
            fresh.ranges().free_len(),
            "no leaked ranges"
        );
        let v = violations.lock().unwrap();
        prop_assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn failed_writes_leave_services_as_they_were(worlds in proptest::collection::vec(world(), 2..5), seed in any::<u64>(), every in 2..9usize) {
        let allowed: Allowed = Arc::default();
        let violations = Arc::new(Mutex::new(Vec::new()));
        let mut maps = checked_maps(&allowed, &violations);
        // Any write may fail, removals included, at pseudo-random moments.
        maps.fail_when(move |n, _, _| {
            (n as u64).wrapping_mul(seed | 1).rotate_left(7).is_multiple_of(every as u64)
        });
        let mut r = reconciler(maps);
        for w in &worlds {
            let (d, c) = desired(w);
            let want = expected_view(&c);
            let before = view(r.snapshot());
            allow(&allowed, &before, &want);
            let undo_failed_before = rollback_errors(&r);
            r.sync_all(&d);
            let after = view(r.snapshot());
            // An undo write that fails too (counted, and logged as an error) leaves a mixed
            // state, safe but not the old one: the retry below must still converge.
            let undo_failed = rollback_errors(&r) > undo_failed_before;
            let failed: BTreeSet<ServicePortKey> = r.failed().keys().cloned().collect();
            // Addresses a failed backend set claims, now or before: exactly as they were.
            let mut untouchable = BTreeSet::new();
            for key in &failed {
                if let Some(svc) = c.services.get(key) {
                    untouchable.extend(svc.frontends.iter().map(|f| f.addr));
                }
                // A failed removal: the set's old frontends are still in the maps.
                let snap = r.snapshot();
                if let Some(id) = r.service_id(key) {
                    untouchable.extend(
                        snap.frontends
                            .iter()
                            .filter(|(_, f)| f.service_id == id)
                            .filter_map(|(k, _)| service_addr(k)),
                    );
                }
            }
            for fe in &untouchable {
                // An address another set (that did not fail) now owns may have moved to it.
                let contested = c.services.iter().any(|(k, s)| !failed.contains(k) && s.frontends.iter().any(|f| f.addr == *fe));
                if !contested && !undo_failed {
                    prop_assert_eq!(after.get(fe), before.get(fe), "{} of a failed set", fe);
                }
            }
            for (fe, backends) in &want {
                if untouchable.contains(fe) {
                    continue;
                }
                prop_assert_eq!(after.get(fe), Some(backends), "{}", fe);
            }
        }
        // The retry, once writes succeed again, converges.
        r.maps_mut().stop_failing();
        let (last, claims) = desired(worlds.last().unwrap());
        allow(&allowed, &view(r.snapshot()), &expected_view(&claims));
        r.sync_all(&last);
        prop_assert!(r.failed().is_empty(), "failures left: {:?}", r.failed());
        prop_assert_eq!(view(r.snapshot()), expected_view(&claims));
        let mut fresh = reconciler(InMemoryMaps::new());
        fresh.sync_all(&last);
        prop_assert_eq!(
            r.ranges().free_len() + r.ranges().waiting_len(),
            fresh.ranges().free_len(),
            "no leaked ranges"
        );
        let v = violations.lock().unwrap();
        prop_assert!(v.is_empty(), "{}", v.join("\n"));
    }
}
