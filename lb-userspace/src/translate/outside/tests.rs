use std::net::SocketAddr;

use super::*;
use crate::model::parse_manifests;

const OBJECTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, uid: u1, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.1
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.7]
  loadBalancerSourceRanges: ["203.0.113.0/25", " 192.168.60.0/24 "]
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, nodePort: 30080}, {name: dns, port: 53, protocol: UDP, nodePort: 30053}]
status: {loadBalancer: {ingress: [{ip: 192.0.2.10}, {ip: 192.0.2.11, ipMode: Proxy}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
  - {addresses: ["10.244.1.5"], nodeName: node-a}
  - {addresses: ["10.244.1.6"], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
  - {addresses: ["10.244.2.5"], nodeName: node-b}
  - {addresses: ["10.244.2.6"], nodeName: node-b, conditions: {ready: false, serving: false}}
---
apiVersion: v1
kind: Service
metadata: {name: thief, namespace: tenant, uid: u2, creationTimestamp: "2025-01-01T00:00:00Z"}
spec:
  type: NodePort
  clusterIP: 10.96.0.2
  externalIPs: [198.51.100.7]
  ports: [{name: http, port: 80, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: drained, namespace: shop, uid: u3, creationTimestamp: "2021-01-01T00:00:00Z"}
spec:
  type: NodePort
  clusterIP: 10.96.0.3
  externalTrafficPolicy: Local
  ports: [{port: 80, nodePort: 30081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: drained-1, namespace: shop, labels: {kubernetes.io/service-name: drained}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
  - {addresses: ["10.244.2.9"], nodeName: node-b, conditions: {ready: false, serving: true, terminating: true}}
---
apiVersion: v1
kind: Service
metadata: {name: internal, namespace: shop, uid: u4}
spec:
  clusterIP: 10.96.0.4
  ports: [{port: 80}]
"#;

fn state() -> OutsideState {
    let parsed = parse_manifests("t.yaml", OBJECTS.as_bytes());
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let store: Store = parsed.objects.into_iter().collect();
    let node = NodeInfo {
        name: Some("node-a".into()),
        addresses: vec!["192.168.60.11".parse().unwrap()],
        own_addresses: vec!["192.168.60.11".parse().unwrap()],
        ..NodeInfo::default()
    };
    outside_state(&store, &node)
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn port<'a>(state: &'a OutsideState, name: &str) -> &'a OutsidePort {
    state
        .ports
        .get(&(Family::IPv4, name.to_string()))
        .unwrap_or_else(|| panic!("{name} in {:?}", state.ports.keys()))
}

/// kube-proxy's sets for externalTrafficPolicy Local (`CategorizeEndpoints`): the cluster set
/// is every ready endpoint, the local set this node's ready ones; a terminating endpoint and a
/// not-ready one are in neither while a ready one exists. UDP keeps every serving endpoint for
/// the conntrack cleanup (the terminating one too).
#[test]
fn local_policy_keeps_both_sets_and_udp_its_serving_endpoints() {
    let s = state();
    let http = port(&s, "shop/web/tcp/http");
    assert!(http.local_policy);
    assert_eq!(http.cluster, addrs(&["10.244.1.5:8080", "10.244.2.5:8080"]));
    assert_eq!(http.local, addrs(&["10.244.1.5:8080"]));
    assert!(http.has_endpoints);
    assert_eq!(http.affinity_timeout_s, Some(10_800));
    assert!(http.serving.is_empty(), "TCP needs no cleanup");
    let dns = port(&s, "shop/web/udp/dns");
    assert_eq!(
        dns.serving,
        addrs(&["10.244.1.5:5353", "10.244.1.6:5353", "10.244.2.5:5353"])
    );
    assert_eq!(dns.node_port, Some(30053));
}

/// The addresses: externalIPs and load-balancer ingress in VIP mode (an `ipMode: Proxy` one is
/// the load balancer's); source ranges trimmed and kept for the family, plus the VIP itself
/// because a range holds the node's address (allowFromNode).
#[test]
fn addresses_and_source_ranges_follow_kube_proxy() {
    let s = state();
    let http = port(&s, "shop/web/tcp/http");
    assert_eq!(
        http.addresses,
        vec![
            ("192.0.2.10".parse().unwrap(), ClaimKind::LoadBalancer),
            ("198.51.100.7".parse().unwrap(), ClaimKind::ExternalIp),
        ]
    );
    let ranges: Vec<String> = http
        .source_ranges
        .iter()
        .map(|c| format!("{}/{}", c.addr, c.prefix))
        .collect();
    assert_eq!(
        ranges,
        ["203.0.113.0/25", "192.168.60.0/24", "192.0.2.10/32"]
    );
    assert_eq!(
        http.firewalled().collect::<Vec<_>>(),
        vec!["192.0.2.10".parse::<IpAddr>().unwrap()]
    );
}

/// A newer Service naming the same externalIP and NodePort gets neither: the older owns both,
/// and the newer, with nothing left, is not served from outside at all.
#[test]
fn the_older_service_keeps_a_contested_address_and_node_port() {
    let s = state();
    assert_eq!(port(&s, "shop/web/tcp/http").node_port, Some(30080));
    assert!(
        !s.ports
            .contains_key(&(Family::IPv4, "tenant/thief/tcp/http".to_string())),
        "{:?}",
        s.ports.keys()
    );
}

/// Only terminating endpoints, on another node, under Local: the cluster set falls back to
/// them, the local set is empty, and endpoints exist (so outside clients are dropped here,
/// not refused). A ClusterIP-only Service is not served from outside.
#[test]
fn terminating_fallback_and_no_local_endpoint() {
    let s = state();
    let drained = port(&s, "shop/drained/tcp/80");
    assert_eq!(drained.cluster, addrs(&["10.244.2.9:80"]));
    assert!(drained.local.is_empty());
    assert!(drained.has_endpoints);
    assert!(!s.ports.keys().any(|(_, n)| n.starts_with("shop/internal")));
}
