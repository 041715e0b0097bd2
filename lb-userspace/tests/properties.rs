//! Property tests over arbitrary (also nonsensical) Services and EndpointSlices:
//! - validation and translation never panic;
//! - after every single map write, each frontend's active slots name existing backends of its
//!   family, and only backends the service had before or should have after the change;
//! - reconciling a change incrementally gives the same maps as reconciling from scratch;
//! - with injected write failures, a failed service is left exactly as it was, the others
//!   reach their desired state, and a retry without failures converges.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use k8s_openapi::{
    api::{core::v1 as core, discovery::v1 as discovery},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use lb_common::SlotKey;
use proptest::prelude::*;
use socklb::{
    dataplane::{
        abi::{Frontend, backend_from_abi},
        maps::{InMemoryMaps, MapSnapshot},
    },
    model::{Store, service_from_api, slice_from_api},
    reconcile::{Reconciler, ServiceProblem, invariants},
    translate::{DesiredState, NodeInfo, ServicePortKey, translate_all},
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
        opt_bool(),
        proptest::collection::vec(pick(IPS), 0..2),
    )
        .prop_map(
            |(name, ns, ip, ips, type_, ports, (affinity, timeout), (itp, etp), pnra, external)| {
                core::Service {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        namespace: Some(ns.into()),
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

/// Validates (dropping rejected objects, like the agent) and translates a world.
fn desired(world: &World) -> DesiredState {
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
    translate_all(&store, &node()).0
}

/// What a client would see: frontend → the backends it spreads over.
fn view(snap: &MapSnapshot) -> BTreeMap<Frontend, BTreeSet<SocketAddr>> {
    snap.frontends
        .iter()
        .map(|(k, fe)| {
            let backends = (1..=u32::from(fe.count))
                .filter_map(|slot| {
                    let id = snap.slots.get(&SlotKey {
                        service_id: fe.service_id,
                        slot,
                    })?;
                    backend_from_abi(snap.backends.get(id)?)
                })
                .collect();
            (Frontend::from_key(k).expect("valid key"), backends)
        })
        .collect()
}

/// The view the desired state asks for (frontends owned by the first claimant only).
fn desired_view(
    d: &DesiredState,
    problems: &BTreeMap<ServicePortKey, ServiceProblem>,
) -> BTreeMap<Frontend, BTreeSet<SocketAddr>> {
    let mut out = BTreeMap::new();
    for (key, svc) in &d.services {
        for fe in &svc.frontends {
            let conflicted = matches!(problems.get(key), Some(ServiceProblem::FrontendConflict { frontend, .. }) if *frontend == fe.to_string());
            if !conflicted {
                out.insert(*fe, svc.backends.iter().copied().collect());
            }
        }
    }
    out
}

type Allowed = Arc<Mutex<BTreeMap<Frontend, BTreeSet<SocketAddr>>>>;

/// Maps that check, after every write, the invariants and that each frontend only reaches
/// backends it is allowed to (what it had before the change, or should have after it).
fn checked_maps(allowed: &Allowed, violations: &Arc<Mutex<Vec<String>>>) -> InMemoryMaps {
    let mut maps = InMemoryMaps::new();
    let (allowed, sink) = (allowed.clone(), violations.clone());
    maps.observe(move |snap, write| {
        let mut found = invariants::violations(snap);
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

fn allow(
    allowed: &Allowed,
    before: &BTreeMap<Frontend, BTreeSet<SocketAddr>>,
    after: &DesiredState,
) {
    let mut a = before.clone();
    for svc in after.services.values() {
        for fe in &svc.frontends {
            a.entry(*fe)
                .or_default()
                .extend(svc.backends.iter().copied());
        }
    }
    *allowed.lock().expect("lock") = a;
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn incremental_equals_from_scratch_and_every_write_is_safe(first in world(), second in world()) {
        let (d1, d2) = (desired(&first), desired(&second));
        let allowed: Allowed = Arc::default();
        let violations = Arc::new(Mutex::new(Vec::new()));
        let mut r = Reconciler::new(checked_maps(&allowed, &violations)).unwrap();
        allow(&allowed, &BTreeMap::new(), &d1);
        r.sync_all(&d1);
        prop_assert_eq!(view(r.snapshot()), desired_view(&d1, r.problems()));
        allow(&allowed, &view(r.snapshot()), &d2);
        r.sync_all(&d2);
        let incremental = view(r.snapshot());

        let mut fresh = Reconciler::new(InMemoryMaps::new()).unwrap();
        fresh.sync_all(&d2);
        prop_assert_eq!(&incremental, &view(fresh.snapshot()));
        prop_assert_eq!(&incremental, &desired_view(&d2, r.problems()));
        prop_assert!(r.snapshot().backends.len() <= fresh.snapshot().backends.len(), "no leaked backends");
        prop_assert_eq!(r.snapshot().slots.len(), fresh.snapshot().slots.len(), "no leaked slots");
        let v = violations.lock().unwrap();
        prop_assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn failed_writes_leave_services_as_they_were(worlds in proptest::collection::vec(world(), 2..5), seed in any::<u64>(), every in 2..9usize) {
        let allowed: Allowed = Arc::default();
        let violations = Arc::new(Mutex::new(Vec::new()));
        let mut maps = checked_maps(&allowed, &violations);
        // Like a full map: writes that add a key fail, at pseudo-random moments.
        maps.fail_when(move |n, _, adds_key| {
            adds_key && (n as u64).wrapping_mul(seed | 1).rotate_left(7).is_multiple_of(every as u64)
        });
        let mut r = Reconciler::new(maps).unwrap();
        for w in &worlds {
            let d = desired(w);
            // Frontends two service ports ask for (one owns it, the other reports a conflict).
            let mut claims: BTreeMap<_, usize> = BTreeMap::new();
            for fe in d.services.values().flat_map(|s| &s.frontends) {
                *claims.entry(fe).or_default() += 1;
            }
            let before = view(r.snapshot());
            allow(&allowed, &before, &d);
            r.sync_all(&d);
            let after = view(r.snapshot());
            let want = desired_view(&d, r.problems());
            for (key, problem) in r.problems() {
                let ServiceProblem::WriteFailed { .. } = problem else { continue };
                // A failed service is exactly as before: each of its frontends reaches what it
                // reached before the change (or does not exist if it did not before).
                // A failed removal leaves the old frontends, which `before` holds too.
                let Some(svc) = d.services.get(key) else { continue };
                for fe in svc.frontends.iter().filter(|fe| claims[fe] == 1) {
                    prop_assert_eq!(after.get(fe), before.get(fe), "{} of failed {}", fe, key);
                }
            }
            for (key, svc) in &d.services {
                if r.problems().contains_key(key) {
                    continue;
                }
                for fe in &svc.frontends {
                    prop_assert_eq!(after.get(fe), want.get(fe), "{} of {}", fe, key);
                }
            }
        }
        // The retry, once writes succeed again, converges.
        r.maps_mut().stop_failing();
        let last = desired(worlds.last().unwrap());
        allow(&allowed, &view(r.snapshot()), &last);
        r.sync_all(&last);
        let only_conflicts = r
            .problems()
            .values()
            .all(|p| matches!(p, ServiceProblem::FrontendConflict { .. }));
        prop_assert!(only_conflicts, "problems left: {:?}", r.problems());
        prop_assert_eq!(view(r.snapshot()), desired_view(&last, r.problems()));
        let v = violations.lock().unwrap();
        prop_assert!(v.is_empty(), "{}", v.join("\n"));
    }
}
