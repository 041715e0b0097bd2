//! Micro-benchmarks of the control plane's pure parts: translating one Service, and the
//! reconciler's diff for one backend set (no change, and one endpoint replaced) against
//! in-memory maps (no syscalls: the kernel's side is measured by `socklb-bench`).
use std::{fmt::Write as _, hint::black_box};

use criterion::{Criterion, criterion_group, criterion_main};
use socklb::{
    dataplane::maps::InMemoryMaps,
    model::{Store, parse_manifests},
    reconcile::Reconciler,
    translate::{ClaimKind, DesiredService, FrontendClaim, NodeInfo, translate_service},
    vocab::{
        Family, ObjectKey, Protocol, Scope, ServiceAddr, ServicePortKey, ServicePortKeyFields,
    },
};

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80, targetPort: 8080}]\n";

fn slice(endpoints: usize) -> String {
    let mut s = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n",
    );
    for i in 0..endpoints {
        let _ = writeln!(
            s,
            "- addresses: [\"10.244.{}.{}\"]\n  conditions: {{ready: {}}}",
            i / 200,
            i % 200 + 1,
            i % 7 != 0
        );
    }
    s
}

fn store(endpoints: usize) -> Store {
    parse_manifests(
        "bench",
        format!("{SERVICE}---\n{}", slice(endpoints)).as_bytes(),
    )
    .objects
    .into_iter()
    .collect()
}

fn translation(c: &mut Criterion) {
    let node = NodeInfo::default();
    for endpoints in [10, 100, 1000] {
        let store = store(endpoints);
        let key = ObjectKey::new("default", "web");
        let svc = store.service(&key).expect("service").clone();
        c.bench_function(&format!("translate_service/{endpoints}_endpoints"), |b| {
            b.iter(|| translate_service(black_box(&svc), &store.slices_of(&key), &node));
        });
    }
}

fn desired(backends: impl Iterator<Item = u32>) -> DesiredService {
    DesiredService {
        port: 80,
        frontends: [FrontendClaim {
            addr: ServiceAddr::new("10.96.0.10".parse().unwrap(), 80, Protocol::Tcp),
            kind: ClaimKind::ClusterIp,
        }]
        .into_iter()
        .collect(),
        backends: backends
            .map(|i| format!("10.244.0.{i}:8080").parse().unwrap())
            .collect(),
        ..DesiredService::default()
    }
}

fn diff(c: &mut Criterion) {
    let key = ServicePortKey::from(ServicePortKeyFields {
        service: ObjectKey::new("default", "web"),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
        family: Family::IPv4,
        scope: Scope::Cluster,
    });
    let a = desired(1..=10);
    let b = desired(2..=11);
    // No grace period: in memory no connect can be reading a released range.
    let mut r =
        Reconciler::with_grace(InMemoryMaps::new(), std::time::Duration::ZERO).expect("maps");
    r.sync_one(&key, Some(&a));
    c.bench_function("reconcile_in_memory/no_change_10_backends", |bench| {
        bench.iter(|| r.sync_one(black_box(&key), Some(&a)));
    });
    c.bench_function(
        "reconcile_in_memory/one_endpoint_replaced_10_backends",
        |bench| {
            let mut flip = false;
            bench.iter(|| {
                flip = !flip;
                r.sync_one(black_box(&key), Some(if flip { &b } else { &a }))
            });
        },
    );
}

criterion_group!(benches, translation, diff);
criterion_main!(benches);
