//! Which Services ask this node for a health-check port, and what it answers: kube-proxy's
//! `healthCheckNodePort` servers (`pkg/proxy/healthcheck/service_health.go`), for cloud load
//! balancers that send a LoadBalancer Service with externalTrafficPolicy Local only to nodes
//! that have its endpoints.
//!
//! The rules, from kube-proxy: a Service needs a server when it is of type LoadBalancer, its
//! externalTrafficPolicy is Local and the API server allocated `spec.healthCheckNodePort`
//! (`NeedsHealthCheck`). Its count is the number of distinct IPs of its ready endpoints whose
//! `nodeName` is this node, across all its ports and slices (`getLocalReadyEndpointIPs`:
//! serving-but-terminating endpoints do not count, topology does not narrow it). Unlike
//! kube-proxy, whose two per-family proxiers each count their own family (before 1.36 only one
//! of them got the port of a dual-stack Service; from 1.36 each family answers on its own
//! socket), socklb counts both families on one server.
use std::{collections::BTreeMap, net::IpAddr};

use super::{NodeInfo, endpoints::is_local, own_slices, skip_reason};
use crate::{
    model::{AddressType, ServiceType, Store, TrafficPolicy},
    vocab::ObjectKey,
};

/// One health-check port's Service and its local endpoints now.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealthCheck {
    pub service: ObjectKey,
    /// Distinct IPs of the Service's ready endpoints on this node.
    pub local_endpoints: usize,
}

/// What this node serves: a health check per port, and the Services that asked for a port
/// another (older) Service has (only manifests can do that; the API server allocates
/// `healthCheckNodePort` from the NodePort range, unique).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthChecks {
    pub ports: BTreeMap<u16, HealthCheck>,
    pub contested: Vec<(u16, ObjectKey)>,
}

/// The health checks of every Service in the store, for this node.
pub fn health_checks(store: &Store, node: &NodeInfo) -> HealthChecks {
    let mut wanted: Vec<_> = store
        .services()
        .filter(|svc| {
            svc.type_ == ServiceType::LoadBalancer
                && svc.external_traffic_policy == TrafficPolicy::Local
                && skip_reason(svc, node).is_none()
        })
        .filter_map(|svc| svc.health_check_node_port.map(|port| (port, svc)))
        .collect();
    // The older Service keeps a contested port (then the smaller uid), as for addresses.
    wanted.sort_by(|(_, a), (_, b)| (a.created, &a.uid).cmp(&(b.created, &b.uid)));
    let mut out = HealthChecks::default();
    for (port, svc) in wanted {
        if out.ports.contains_key(&port) {
            out.contested.push((port, svc.key.clone()));
            continue;
        }
        let mut ips: Vec<IpAddr> = own_slices(&store.slices_of(&svc.key), node, &mut Vec::new())
            .into_iter()
            .filter(|s| s.address_type != AddressType::Fqdn && !s.ports.is_empty())
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.is_ready() && is_local(e, node))
            .filter_map(|e| e.address)
            .collect();
        ips.sort_unstable();
        ips.dedup();
        out.ports.insert(
            port,
            HealthCheck {
                service: svc.key.clone(),
                local_endpoints: ips.len(),
            },
        );
    }
    out
}

/// The body kube-proxy writes, byte for byte (tab-indented, keys in this order, no newline at
/// the end: `pkg/proxy/README.md` tells other proxies to copy it exactly).
pub fn health_check_body(check: &HealthCheck, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        go_quote(&check.service.namespace),
        go_quote(&check.service.name),
        check.local_endpoints,
        proxy_healthy
    )
}

/// Go's `%q` of a namespace or name (DNS labels: nothing to escape but in theory).
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse_manifests;

    const OBJECTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, uid: u1, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.1
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80}, {name: https, port: 443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.0.1"], nodeName: node-a}
  - {addresses: ["10.244.0.2"], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
  - {addresses: ["10.244.0.3"], nodeName: node-a, conditions: {ready: false}}
  - {addresses: ["10.244.0.4"], nodeName: node-b}
  - {addresses: ["10.244.0.5"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: https, port: 443}]
endpoints:
  - {addresses: ["10.244.0.1"], nodeName: node-a}
  - {addresses: ["10.244.0.6"], nodeName: node-a}
---
apiVersion: v1
kind: Service
metadata: {name: late, namespace: other, uid: u2, creationTimestamp: "2025-01-01T00:00:00Z"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.2
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: cluster, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.3
  externalTrafficPolicy: Cluster
  healthCheckNodePort: 32001
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: nodeport, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.4
  externalTrafficPolicy: Local
  healthCheckNodePort: 32002
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.5
  externalTrafficPolicy: Local
  healthCheckNodePort: 32003
  ports: [{port: 80}]
"#;

    /// kube-proxy's rules (`NeedsHealthCheck`, `getLocalReadyEndpointIPs`): LoadBalancer with
    /// externalTrafficPolicy Local only; distinct IPs of ready endpoints on this node, over
    /// every port; terminating and not-ready ones do not count.
    #[test]
    fn health_checks_count_distinct_ready_local_endpoint_ips() {
        let parsed = parse_manifests("t.yaml", OBJECTS.as_bytes());
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let store: Store = parsed.objects.into_iter().collect();
        let node = NodeInfo {
            name: Some("node-a".into()),
            ..NodeInfo::default()
        };
        let checks = health_checks(&store, &node);
        let ports: Vec<(u16, String, usize)> = checks
            .ports
            .iter()
            .map(|(p, c)| (*p, c.service.to_string(), c.local_endpoints))
            .collect();
        assert_eq!(
            ports,
            vec![
                (32000, "shop/web".into(), 2),
                (32003, "shop/empty".into(), 0)
            ]
        );
        assert_eq!(
            checks.contested,
            vec![(32000, ObjectKey::new("other", "late"))]
        );
        let nameless = health_checks(&store, &NodeInfo::default());
        assert_eq!(
            nameless.ports[&32000].local_endpoints, 0,
            "no node name: nothing is local"
        );
    }

    #[test]
    fn the_body_is_kube_proxys_byte_for_byte() {
        let check = HealthCheck {
            service: ObjectKey::new("default", "web"),
            local_endpoints: 2,
        };
        assert_eq!(
            health_check_body(&check, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
