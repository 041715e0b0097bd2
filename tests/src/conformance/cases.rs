//! The cases. Each states its origin in kube-proxy's code or tests; see
//! /work/notes/kubeproxy-rules.md for the rules in words.
//!
//! Addresses: case N uses cluster IPs `10.96.N.x` (and `fd00:96::N:x`), pods `10.244.N.x` (and
//! `fd00:244::N:x`), externalIPs `198.18.N.x`, load-balancer IPs `198.19.N.x` and node port
//! 30000+N, so cases of one node never collide; its objects live in namespace `nsN` (the ownership cases
//! also use `aaa` and `kube-system`, with object names that carry N).
//!
//! Conditions, as kube-proxy's tests name them: none written means ready (and serving, not
//! terminating); "not ready" is `{ready: false, serving: false, terminating: false}`; "serving
//! terminating" is `{ready: false, serving: true, terminating: true}`; "terminating, not serving"
//! is `{ready: false, serving: false, terminating: true}`. Endpoints on this node say
//! `nodeName: node-a`; an endpoint without a nodeName is on no node (remote), as in kube-proxy's
//! proxier tests.
//!
//! externalTrafficPolicy Local: kube-proxy sends traffic that starts on the node (pods, host) to
//! the cluster set ("short-circuit"), so for every client socklb serves, NodePorts, externalIPs
//! and load-balancer IPs reach the cluster set whatever the policy; the local set is what the
//! ClusterIP reaches under internalTrafficPolicy Local.
use super::{
    Case, NODE_A, NODE_DUAL_STACK, NODE_EMPTY_ZONE, NODE_NO_ZONE,
    Outcome::{Backends, Refused, RefusedNoLocal, Untouched},
};

/// internalTrafficPolicy Local with usable endpoints only on other nodes.
const NO_LOCAL: &str = "kube-proxy drops (the client times out); socklb refuses at once, counted apart (no_local_backend)";

/// Load-balancer IPs restricted by loadBalancerSourceRanges.
const SOURCE_RANGES: &str = "kube-proxy firewalls the load-balancer IP on the node (sources outside the ranges, pods included, are dropped); socklb does not translate it, so the connect leaves the node and the load balancer (or the packet path) applies the ranges";

/// Which Service owns an address several claim.
const OWNERSHIP: &str = "kube-proxy leaves an address two Services claim to map order (undefined); socklb gives it to the ClusterIP, else to the older Service, then the smaller uid (names and namespaces never decide)";

pub const CASES: &[Case] = &[
    // ---------------------------------------------------------------------------------------
    // ClusterIP basics, no endpoints, internalTrafficPolicy Local
    // ---------------------------------------------------------------------------------------
    Case {
        name: "cluster-ip-basic",
        origin: "pkg/proxy/nftables/proxier_test.go TestClusterIPGeneral \"simple clusterIP\"; test/e2e/network/service.go \"should serve a basic endpoint from pods\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: basic, namespace: ns1}
spec:
  clusterIP: 10.96.1.1
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: basic-1, namespace: ns1, labels: {kubernetes.io/service-name: basic}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - addresses: ["10.244.1.1"]
  - addresses: ["10.244.1.2"]
"#,
        expect: &[(
            "10.96.1.1:80/TCP",
            Backends(&["10.244.1.1:8080", "10.244.1.2:8080"]),
        )],
        note: "",
    },
    Case {
        name: "no-endpoints-rejected",
        origin: "pkg/proxy/nftables/proxier_test.go TestNoEndpointsReject \"pod to cluster IP with no endpoints\"; test/e2e/network/service.go \"should be rejected when no endpoints exist\"",
        node: NODE_A,
        objects: r"
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: ns2}
spec:
  clusterIP: 10.96.2.1
  ports: [{name: http, port: 80}]
",
        expect: &[("10.96.2.1:80/TCP", Refused)],
        note: "",
    },
    Case {
        name: "itp-local-only-remote-endpoints",
        origin: "pkg/proxy/nftables/proxier_test.go TestInternalTrafficPolicy \"internalTrafficPolicy is local and there are no local endpoints\" (DROP); pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, but all endpoints are remote\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: itp, namespace: ns3}
spec:
  clusterIP: 10.96.3.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-1, namespace: ns3, labels: {kubernetes.io/service-name: itp}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - addresses: ["10.244.3.1"]
    nodeName: node-b
"#,
        expect: &[("10.96.3.1:80/TCP", RefusedNoLocal)],
        note: NO_LOCAL,
    },
    // ---------------------------------------------------------------------------------------
    // pkg/proxy/topology_test.go TestCategorizeEndpoints: zone hints
    // ---------------------------------------------------------------------------------------
    Case {
        name: "topology-zone-hints-filter",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns4}
spec:
  clusterIP: 10.96.4.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns4, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.4.3"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.4.4"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.4.5"], hints: {forZones: [{name: zone-c}]}}
  - {addresses: ["10.244.4.6"], hints: {forZones: [{name: zone-a}]}}
"#,
        expect: &[(
            "10.96.4.1:80/TCP",
            Backends(&["10.244.4.3:80", "10.244.4.6:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-etp-local-uses-hinted-cluster-set",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"externalTrafficPolicy: Local, topology ignored for Local endpoints\" (the cluster set, which pods and the host reach through the NodePort: pkg/proxy/nftables/proxier.go syncProxyRules short-circuit)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns5}
spec:
  type: NodePort
  clusterIP: 10.96.5.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30005}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns5, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.5.3"], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.5.4"], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.5.5"], hints: {forZones: [{name: zone-c}]}}
  - {addresses: ["10.244.5.6"], hints: {forZones: [{name: zone-a}]}}
"#,
        expect: &[
            (
                "10.96.5.1:80/TCP",
                Backends(&["10.244.5.3:80", "10.244.5.6:80"]),
            ),
            (
                "192.0.2.10:30005/TCP",
                Backends(&["10.244.5.3:80", "10.244.5.6:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "topology-itp-local-ignores-hints",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, topology ignored for Local endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns6}
spec:
  type: NodePort
  clusterIP: 10.96.6.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30006}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns6, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.6.3"], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.6.4"], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.6.5"], hints: {forZones: [{name: zone-c}]}}
  - {addresses: ["10.244.6.6"], hints: {forZones: [{name: zone-a}]}}
"#,
        expect: &[
            (
                "10.96.6.1:80/TCP",
                Backends(&["10.244.6.3:80", "10.244.6.4:80"]),
            ),
            (
                "192.0.2.10:30006/TCP",
                Backends(&["10.244.6.3:80", "10.244.6.6:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "topology-node-without-zone-label",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"empty node labels\"",
        node: NODE_NO_ZONE,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns7}
spec:
  clusterIP: 10.96.7.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns7, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.7.1"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.7.2"], hints: {forZones: [{name: zone-b}]}}
"#,
        expect: &[(
            "10.96.7.1:80/TCP",
            Backends(&["10.244.7.1:80", "10.244.7.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-empty-zone-label",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"empty zone label\"",
        node: NODE_EMPTY_ZONE,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns8}
spec:
  clusterIP: 10.96.8.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns8, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.8.1"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.8.2"], hints: {forZones: [{name: zone-b}]}}
"#,
        expect: &[(
            "10.96.8.1:80/TCP",
            Backends(&["10.244.8.1:80", "10.244.8.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-no-hint-for-this-zone",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"node in different zone, no endpoint filtering\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns9}
spec:
  clusterIP: 10.96.9.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns9, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.9.1"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.9.2"], hints: {forZones: [{name: zone-c}]}}
"#,
        expect: &[(
            "10.96.9.1:80/TCP",
            Backends(&["10.244.9.1:80", "10.244.9.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-unready-endpoint",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"unready endpoint\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns10}
spec:
  clusterIP: 10.96.10.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns10, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.10.3"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.10.4"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.10.5"], hints: {forZones: [{name: zone-c}]}}
  - addresses: ["10.244.10.6"]
    hints: {forZones: [{name: zone-a}]}
    conditions: {ready: false, serving: false, terminating: false}
"#,
        expect: &[("10.96.10.1:80/TCP", Backends(&["10.244.10.3:80"]))],
        note: "",
    },
    Case {
        name: "topology-only-unready-in-this-zone",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"only unready endpoints in same zone (should not filter)\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns11}
spec:
  clusterIP: 10.96.11.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns11, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.11.3"]
    hints: {forZones: [{name: zone-a}]}
    conditions: {ready: false, serving: false, terminating: false}
  - {addresses: ["10.244.11.4"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.11.5"], hints: {forZones: [{name: zone-c}]}}
  - addresses: ["10.244.11.6"]
    hints: {forZones: [{name: zone-a}]}
    conditions: {ready: false, serving: false, terminating: false}
"#,
        expect: &[(
            "10.96.11.1:80/TCP",
            Backends(&["10.244.11.4:80", "10.244.11.5:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-missing-hints",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"missing hints, no filtering applied\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns12}
spec:
  clusterIP: 10.96.12.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns12, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.12.3"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.12.4"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.12.5"]}
  - {addresses: ["10.244.12.6"], hints: {forZones: [{name: zone-a}]}}
"#,
        expect: &[(
            "10.96.12.1:80/TCP",
            Backends(&[
                "10.244.12.3:80",
                "10.244.12.4:80",
                "10.244.12.5:80",
                "10.244.12.6:80",
            ]),
        )],
        note: "",
    },
    Case {
        name: "topology-multiple-hints-per-endpoint",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"multiple hints per endpoint, filtering includes any endpoint with zone included\" (this node in zone-a instead of zone-c)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns13}
spec:
  clusterIP: 10.96.13.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns13, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.13.3"], hints: {forZones: [{name: zone-c}, {name: zone-b}, {name: zone-a}]}}
  - {addresses: ["10.244.13.4"], hints: {forZones: [{name: zone-b}, {name: zone-a}]}}
  - {addresses: ["10.244.13.5"], hints: {forZones: [{name: zone-b}, {name: zone-d}]}}
  - {addresses: ["10.244.13.6"], hints: {forZones: [{name: zone-a}]}}
"#,
        expect: &[(
            "10.96.13.1:80/TCP",
            Backends(&["10.244.13.3:80", "10.244.13.4:80", "10.244.13.6:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-conflicting-with-etp-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"conflicting topology and localness require merging allEndpoints\" (the cluster set; pods and the host reach it through the NodePort)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns14}
spec:
  type: NodePort
  clusterIP: 10.96.14.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30014}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns14, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.14.1"], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.14.2"], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.14.3"], nodeName: node-b, hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.14.4"], nodeName: node-b, hints: {forZones: [{name: zone-b}]}}
"#,
        expect: &[
            (
                "10.96.14.1:80/TCP",
                Backends(&["10.244.14.1:80", "10.244.14.3:80"]),
            ),
            (
                "192.0.2.10:30014/TCP",
                Backends(&["10.244.14.1:80", "10.244.14.3:80"]),
            ),
        ],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // TestCategorizeEndpoints: traffic policies, readiness, terminating fallback
    // ---------------------------------------------------------------------------------------
    Case {
        name: "itp-local-no-endpoints-rejected",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, with empty endpoints\"; pkg/proxy/nftables/proxier_test.go TestInternalTrafficPolicy \"endpoints deleted\" (REJECT)",
        node: NODE_A,
        objects: r"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns15}
spec:
  clusterIP: 10.96.15.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns15, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints: []
",
        expect: &[("10.96.15.1:80/TCP", Refused)],
        note: "",
    },
    Case {
        name: "itp-local-all-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, all endpoints are local\"; pkg/proxy/nftables/proxier_test.go TestInternalTrafficPolicy \"internalTrafficPolicy is local and there are multiple local endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns16}
spec:
  clusterIP: 10.96.16.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns16, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.16.1"], nodeName: node-a}
  - {addresses: ["10.244.16.2"], nodeName: node-a}
  - {addresses: ["10.244.16.3"], nodeName: node-b}
"#,
        expect: &[(
            "10.96.16.1:80/TCP",
            Backends(&["10.244.16.1:80", "10.244.16.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "itp-local-some-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, some endpoints are local\"; pkg/proxy/nftables/proxier_test.go TestInternalTrafficPolicy \"internalTrafficPolicy is local and there is one local endpoint\"; test/e2e/network/service.go \"should respect internalTrafficPolicy=Local Pod to Pod\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns17}
spec:
  clusterIP: 10.96.17.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns17, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.17.1"], nodeName: node-a}
  - {addresses: ["10.244.17.2"], nodeName: node-b}
  - {addresses: ["10.244.17.3"], nodeName: node-c}
"#,
        expect: &[("10.96.17.1:80/TCP", Backends(&["10.244.17.1:80"]))],
        note: "",
    },
    Case {
        name: "udp-endpoints-not-ready-rejected",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"Cluster traffic policy, endpoints not Ready\" (on a UDP port)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns18}
spec:
  clusterIP: 10.96.18.1
  ports: [{name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns18, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
  - addresses: ["10.244.18.1"]
    conditions: {ready: false, serving: false, terminating: false}
  - addresses: ["10.244.18.2"]
    conditions: {ready: false, serving: false, terminating: false}
"#,
        expect: &[("10.96.18.1:53/UDP", Refused)],
        note: "",
    },
    Case {
        name: "some-endpoints-ready",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"Cluster traffic policy, some endpoints are Ready\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns19}
spec:
  clusterIP: 10.96.19.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns19, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.19.1"]
    conditions: {ready: false, serving: false, terminating: false}
  - addresses: ["10.244.19.2"]
    conditions: {ready: true}
"#,
        expect: &[("10.96.19.1:80/TCP", Backends(&["10.244.19.2:80"]))],
        note: "",
    },
    Case {
        name: "all-endpoints-terminating",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"Cluster traffic policy, all endpoints are terminating\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns20}
spec:
  clusterIP: 10.96.20.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns20, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.20.1"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.20.2"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[(
            "10.96.20.1:80/TCP",
            Backends(&["10.244.20.1:80", "10.244.20.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "itp-local-etp-cluster-some-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Local, eTP: Cluster, some endpoints local\"; pkg/proxy/nftables/proxier_test.go TestInternalExternalMasquerade \"pod to NodePort with iTP:Local\" (iTP never applies to external frontends)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns21}
spec:
  type: NodePort
  clusterIP: 10.96.21.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30021}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns21, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.21.1"], nodeName: node-a}
  - {addresses: ["10.244.21.2"]}
"#,
        expect: &[
            ("10.96.21.1:80/TCP", Backends(&["10.244.21.1:80"])),
            (
                "192.0.2.10:30021/TCP",
                Backends(&["10.244.21.1:80", "10.244.21.2:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "etp-local-every-frontend-from-a-pod",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Cluster, eTP: Local, some endpoints local\"; pkg/proxy/nftables/proxier_test.go TestExternalTrafficPolicyLocal \"pod to cluster IP hits both endpoints, unmasqueraded\", \"pod to external IP hits both endpoints, unmasqueraded\", \"pod to LB IP hits only both endpoints, unmasqueraded\", \"pod to NodePort hits both endpoints, unmasqueraded\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns22}
spec:
  type: LoadBalancer
  clusterIP: 10.96.22.1
  externalTrafficPolicy: Local
  externalIPs: [198.18.22.1]
  ports: [{name: http, port: 80, nodePort: 30022}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.22.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns22, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.22.1"], nodeName: node-a}
  - {addresses: ["10.244.22.2"]}
"#,
        expect: &[
            (
                "10.96.22.1:80/TCP",
                Backends(&["10.244.22.1:80", "10.244.22.2:80"]),
            ),
            (
                "198.18.22.1:80/TCP",
                Backends(&["10.244.22.1:80", "10.244.22.2:80"]),
            ),
            (
                "198.19.22.1:80/TCP",
                Backends(&["10.244.22.1:80", "10.244.22.2:80"]),
            ),
            (
                "192.0.2.10:30022/TCP",
                Backends(&["10.244.22.1:80", "10.244.22.2:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "itp-local-etp-local-some-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Local, eTP: Local, some endpoints local\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns23}
spec:
  type: NodePort
  clusterIP: 10.96.23.1
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30023}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns23, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.23.1"], nodeName: node-a}
  - {addresses: ["10.244.23.2"]}
"#,
        expect: &[
            ("10.96.23.1:80/TCP", Backends(&["10.244.23.1:80"])),
            (
                "192.0.2.10:30023/TCP",
                Backends(&["10.244.23.1:80", "10.244.23.2:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "itp-local-etp-local-all-remote",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Local, eTP: Local, all endpoints remote\"; pkg/proxy/nftables/proxier.go syncProxyRules (\"Traffic to the clusterIP will be dropped, but external traffic may still be accepted\")",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns24}
spec:
  type: NodePort
  clusterIP: 10.96.24.1
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30024}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns24, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.24.1"]}
  - {addresses: ["10.244.24.2"]}
"#,
        expect: &[
            ("10.96.24.1:80/TCP", RefusedNoLocal),
            (
                "192.0.2.10:30024/TCP",
                Backends(&["10.244.24.1:80", "10.244.24.2:80"]),
            ),
        ],
        note: NO_LOCAL,
    },
    Case {
        name: "itp-local-etp-local-remote-terminating",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Local, eTP: Local, all endpoints remote and terminating\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns25}
spec:
  type: NodePort
  clusterIP: 10.96.25.1
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30025}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns25, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.25.1"]
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.25.2"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.25.1:80/TCP", RefusedNoLocal),
            (
                "192.0.2.10:30025/TCP",
                Backends(&["10.244.25.1:80", "10.244.25.2:80"]),
            ),
        ],
        note: NO_LOCAL,
    },
    Case {
        name: "etp-local-with-terminating-endpoints",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Cluster, eTP: Local, with terminating endpoints\" (the cluster set; the local set is for sources off the node)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns26}
spec:
  type: NodePort
  clusterIP: 10.96.26.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30026}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns26, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.26.1"]}
  - addresses: ["10.244.26.2"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: false}
  - addresses: ["10.244.26.3"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.26.4"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.26.1:80/TCP", Backends(&["10.244.26.1:80"])),
            ("192.0.2.10:30026/TCP", Backends(&["10.244.26.1:80"])),
        ],
        note: "",
    },
    Case {
        name: "itp-local-terminating-fallback-is-local",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"iTP: Cluster, eTP: Local, with terminating endpoints\" (its local set, reached here through internalTrafficPolicy Local: the local fallback to serving terminating endpoints is decided apart from the cluster set; pkg/proxy/topology.go CategorizeEndpoints)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns27}
spec:
  type: NodePort
  clusterIP: 10.96.27.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30027}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns27, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.27.1"]}
  - addresses: ["10.244.27.2"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: false}
  - addresses: ["10.244.27.3"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.27.4"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.27.1:80/TCP", Backends(&["10.244.27.3:80"])),
            ("192.0.2.10:30027/TCP", Backends(&["10.244.27.1:80"])),
        ],
        note: "",
    },
    Case {
        name: "etp-local-not-externally-accessible",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"externalTrafficPolicy ignored if not externally accessible\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns28}
spec:
  type: LoadBalancer
  clusterIP: 10.96.28.1
  externalTrafficPolicy: Local
  allocateLoadBalancerNodePorts: false
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns28, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.28.1"]}
  - {addresses: ["10.244.28.2"], nodeName: node-a}
"#,
        expect: &[(
            "10.96.28.1:80/TCP",
            Backends(&["10.244.28.1:80", "10.244.28.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "itp-local-internal-only",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"no cluster endpoints for iTP:Local internal-only service\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns29}
spec:
  clusterIP: 10.96.29.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns29, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.29.1"]}
  - {addresses: ["10.244.29.2"], nodeName: node-a}
"#,
        expect: &[("10.96.29.1:80/TCP", Backends(&["10.244.29.2:80"]))],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // TestCategorizeEndpoints: node hints (PreferSameTrafficDistribution on: GA in 1.35)
    // ---------------------------------------------------------------------------------------
    Case {
        name: "prefer-same-node",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"PreferSameNode available\" (upstream since 1.33; text read in Antrea's copy third_party/proxy/topology_test.go)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns30}
spec:
  clusterIP: 10.96.30.1
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns30, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.30.1"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-a}]}}
  - {addresses: ["10.244.30.2"], hints: {forZones: [{name: zone-b}], forNodes: [{name: node-b}]}}
  - {addresses: ["10.244.30.3"], hints: {forZones: [{name: zone-c}], forNodes: [{name: node-c}]}}
  - {addresses: ["10.244.30.4"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-d}]}}
"#,
        expect: &[("10.96.30.1:80/TCP", Backends(&["10.244.30.1:80"]))],
        note: "",
    },
    Case {
        name: "prefer-same-node-some-unhinted",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"PreferSameNode ignored if some endpoints unhinted\" (Antrea's copy)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns31}
spec:
  clusterIP: 10.96.31.1
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns31, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.31.1"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-a}]}}
  - {addresses: ["10.244.31.2"]}
  - {addresses: ["10.244.31.3"], hints: {forZones: [{name: zone-c}], forNodes: [{name: node-c}]}}
  - {addresses: ["10.244.31.4"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-d}]}}
"#,
        expect: &[(
            "10.96.31.1:80/TCP",
            Backends(&[
                "10.244.31.1:80",
                "10.244.31.2:80",
                "10.244.31.3:80",
                "10.244.31.4:80",
            ]),
        )],
        note: "",
    },
    Case {
        name: "prefer-same-node-falls-back-to-zone",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"PreferSameNode falls back to PreferSameZone if no endpoint for node\" (Antrea's copy)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns32}
spec:
  clusterIP: 10.96.32.1
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns32, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.32.1"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-1}]}}
  - {addresses: ["10.244.32.2"], hints: {forZones: [{name: zone-b}], forNodes: [{name: node-2}]}}
  - {addresses: ["10.244.32.3"], hints: {forZones: [{name: zone-c}], forNodes: [{name: node-3}]}}
  - {addresses: ["10.244.32.4"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-4}]}}
"#,
        expect: &[(
            "10.96.32.1:80/TCP",
            Backends(&["10.244.32.1:80", "10.244.32.4:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-hints-on-ready-endpoints-only",
        origin: "pkg/proxy/topology.go topologyModeFromHints and CategorizeEndpoints (only ready endpoints choose the mode; serving terminating ones are no fallback while any is ready)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns33}
spec:
  clusterIP: 10.96.33.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns33, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.33.1"], hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["10.244.33.2"], hints: {forZones: [{name: zone-c}]}}
  - addresses: ["10.244.33.3"]
    hints: {forZones: [{name: zone-a}]}
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[(
            "10.96.33.1:80/TCP",
            Backends(&["10.244.33.1:80", "10.244.33.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "topology-ignored-in-terminating-fallback",
        origin: "pkg/proxy/topology.go CategorizeEndpoints (no ready endpoint: every serving terminating endpoint, topology ignored)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns34}
spec:
  clusterIP: 10.96.34.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns34, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.34.1"]
    hints: {forZones: [{name: zone-a}]}
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.34.2"]
    hints: {forZones: [{name: zone-b}]}
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[(
            "10.96.34.1:80/TCP",
            Backends(&["10.244.34.1:80", "10.244.34.2:80"]),
        )],
        note: "",
    },
    Case {
        name: "prefer-same-node-needs-every-node-hint",
        origin: "pkg/proxy/topology.go topologyModeFromHints (one ready endpoint without a node hint: node mode off, zone mode still applies)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns35}
spec:
  clusterIP: 10.96.35.1
  trafficDistribution: PreferSameNode
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns35, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.35.1"], hints: {forZones: [{name: zone-a}], forNodes: [{name: node-a}]}}
  - {addresses: ["10.244.35.2"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.35.3"], hints: {forZones: [{name: zone-b}], forNodes: [{name: node-b}]}}
"#,
        expect: &[(
            "10.96.35.1:80/TCP",
            Backends(&["10.244.35.1:80", "10.244.35.2:80"]),
        )],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // The proxier tests (pkg/proxy/{nftables,iptables}/proxier_test.go)
    // ---------------------------------------------------------------------------------------
    Case {
        name: "cluster-ip-target-port",
        origin: "pkg/proxy/nftables/proxier_test.go TestClusterIPGeneral \"clusterIP with TargetPort\", \"clusterIP with multiple endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns36}
spec:
  clusterIP: 10.96.36.1
  ports: [{name: https, port: 443, targetPort: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns36, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: https, port: 8443}]
endpoints:
  - {addresses: ["10.244.36.1"]}
  - {addresses: ["10.244.36.2"], nodeName: node-a}
"#,
        expect: &[(
            "10.96.36.1:443/TCP",
            Backends(&["10.244.36.1:8443", "10.244.36.2:8443"]),
        )],
        note: "",
    },
    Case {
        name: "same-port-tcp-and-udp",
        origin: "pkg/proxy/nftables/proxier_test.go TestClusterIPGeneral \"clusterIP with TCP, UDP, and SCTP on same port (TCP)\", \"(UDP)\"; test/e2e/network/service.go \"should serve endpoints on same port and different protocols\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns37}
spec:
  clusterIP: 10.96.37.1
  ports:
    - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 5353}
    - {name: dns-udp, port: 53, protocol: UDP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns37, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports:
  - {name: dns-tcp, port: 5353, protocol: TCP}
  - {name: dns-udp, port: 53, protocol: UDP}
endpoints:
  - {addresses: ["10.244.37.1"]}
"#,
        expect: &[
            ("10.96.37.1:53/TCP", Backends(&["10.244.37.1:5353"])),
            ("10.96.37.1:53/UDP", Backends(&["10.244.37.1:53"])),
        ],
        note: "",
    },
    Case {
        name: "cluster-ip-undeclared-port-or-protocol",
        origin: "pkg/proxy/iptables/proxier_test.go TestClusterIPGeneral \"TCP-only port does not match UDP traffic\", \"svc1 does not accept svc2's ports\" (no rule: the packet passes untranslated)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns38}
spec:
  clusterIP: 10.96.38.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns38, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.38.1"]}
"#,
        expect: &[
            ("10.96.38.1:80/TCP", Backends(&["10.244.38.1:80"])),
            ("10.96.38.1:80/UDP", Untouched),
            ("10.96.38.1:81/TCP", Untouched),
        ],
        note: "as kube-proxy's iptables mode (no rule, the connect goes its way); nftables mode rejects connects to a live ClusterIP's undeclared ports and protocols (cluster-ips-check)",
    },
    Case {
        name: "node-port",
        origin: "pkg/proxy/nftables/proxier_test.go TestNodePorts \"ipv4\" (\"node to nodePort\"; loopback is never a NodePort address: pkg/proxy/nftables/proxier.go, noLocalhost); pkg/proxy/iptables/proxier.go (--dst-type LOCAL: another node's address is not a NodePort here)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns39}
spec:
  type: NodePort
  clusterIP: 10.96.39.1
  ports: [{name: http, port: 80, nodePort: 30039}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns39, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.39.1"]}
  - {addresses: ["10.244.39.2"], nodeName: node-a}
"#,
        expect: &[
            (
                "10.96.39.1:80/TCP",
                Backends(&["10.244.39.1:80", "10.244.39.2:80"]),
            ),
            (
                "192.0.2.10:30039/TCP",
                Backends(&["10.244.39.1:80", "10.244.39.2:80"]),
            ),
            ("127.0.0.1:30039/TCP", Untouched),
            ("192.0.2.11:30039/TCP", Untouched),
        ],
        note: "NodePorts are served on the node's addresses only, as in kube-proxy's nftables mode; iptables mode also serves them on 127.0.0.1 (localhostNodePorts)",
    },
    Case {
        name: "node-port-every-node-address-and-family",
        origin: "pkg/proxy/nftables/proxier_test.go TestNodePorts \"ipv4, multiple nodeport-addresses\" (\"external to nodePort on secondary IP\"), \"ipv6\"; pkg/proxy/servicechangetracker.go serviceToServiceMap (a single-stack Service gets no rules in the other family)",
        node: NODE_DUAL_STACK,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: ns40}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.40.1, "fd00:96::40:1"]
  ports: [{name: http, port: 80, nodePort: 30040}]
---
apiVersion: v1
kind: Service
metadata: {name: single, namespace: ns40}
spec:
  type: NodePort
  clusterIP: 10.96.40.2
  ports: [{name: http, port: 80, nodePort: 30140}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v4, namespace: ns40, labels: {kubernetes.io/service-name: dual}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.40.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v6, namespace: ns40, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["fd00:244::40:1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: single-v4, namespace: ns40, labels: {kubernetes.io/service-name: single}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.40.2"]}
"#,
        expect: &[
            ("192.0.2.10:30040/TCP", Backends(&["10.244.40.1:80"])),
            ("198.51.100.10:30040/TCP", Backends(&["10.244.40.1:80"])),
            (
                "[2001:db8::10]:30040/TCP",
                Backends(&["[fd00:244::40:1]:80"]),
            ),
            ("198.51.100.10:30140/TCP", Backends(&["10.244.40.2:80"])),
            ("[2001:db8::10]:30140/TCP", Untouched),
        ],
        note: "",
    },
    Case {
        name: "external-ip-not-assigned-to-a-node",
        origin: "test/e2e/network/service.go \"should be possible to connect to a service via ExternalIP when the external IP is not assigned to a node\" (both families); pkg/proxy/nftables/proxier_test.go TestExternalTrafficPolicyCluster \"pod to external IP hits both endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns41}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.41.1, "fd00:96::41:1"]
  externalIPs: [203.0.113.250, "2001:DB8::cb00:71fa"]
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v4, namespace: ns41, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: ["10.244.41.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v6, namespace: ns41, labels: {kubernetes.io/service-name: s}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: ["fd00:244::41:1"]}
"#,
        expect: &[
            ("203.0.113.250:80/TCP", Backends(&["10.244.41.1:8080"])),
            (
                "[2001:db8::cb00:71fa]:80/TCP",
                Backends(&["[fd00:244::41:1]:8080"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "load-balancer-ip-mode",
        origin: "pkg/proxy/nftables/proxier_test.go TestLoadBalancerIngressRouteTypeProxy \"ipMode Proxy\", \"ipMode VIP\", \"ipMode nil\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns42}
spec:
  type: LoadBalancer
  clusterIP: 10.96.42.1
  ports: [{name: http, port: 80, nodePort: 30042}]
status:
  loadBalancer:
    ingress:
      - {ip: 198.19.42.1, ipMode: Proxy}
      - {ip: 198.19.42.2, ipMode: VIP}
      - {ip: 198.19.42.3}
      - {hostname: lb.example.com}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns42, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.42.1"]}
"#,
        expect: &[
            ("198.19.42.1:80/TCP", Untouched),
            ("198.19.42.2:80/TCP", Backends(&["10.244.42.1:80"])),
            ("198.19.42.3:80/TCP", Backends(&["10.244.42.1:80"])),
        ],
        note: "",
    },
    Case {
        name: "load-balancer-source-ranges",
        origin: "pkg/proxy/nftables/proxier_test.go TestLoadBalancer \"pod to cluster IP\", \"nodePort bypasses LoadBalancerSourceRanges\", \"pod to LB1 (blocked by LoadBalancerSourceRanges)\" (DROP) and \"node to LB1 (allowed by LoadBalancerSourceRanges)\"; source ranges never apply to externalIPs (pkg/proxy/nftables/proxier.go syncProxyRules, firewall on LB VIPs only)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns43}
spec:
  type: LoadBalancer
  clusterIP: 10.96.43.1
  externalIPs: [198.18.43.1]
  loadBalancerSourceRanges: ["192.168.0.0/24", " 203.0.113.0/25"]
  ports: [{name: http, port: 80, nodePort: 30043}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.43.1}, {ip: 198.19.43.2}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns43, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.43.1"]}
"#,
        expect: &[
            ("10.96.43.1:80/TCP", Backends(&["10.244.43.1:80"])),
            ("192.0.2.10:30043/TCP", Backends(&["10.244.43.1:80"])),
            ("198.18.43.1:80/TCP", Backends(&["10.244.43.1:80"])),
            ("198.19.43.1:80/TCP", Untouched),
            ("198.19.43.2:80/TCP", Untouched),
        ],
        note: SOURCE_RANGES,
    },
    Case {
        name: "load-balancer-source-ranges-open",
        origin: "pkg/proxy/serviceport.go newBaseServiceInfo (only this family's ranges count: pkg/proxy/util MapCIDRsByIPFamily; newer versions also drop a zero-length range) with pkg/proxy/nftables/proxier_test.go TestLoadBalancer (a source inside the ranges reaches the endpoints: 0.0.0.0/0 holds every source)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: everyone, namespace: ns44}
spec:
  type: LoadBalancer
  clusterIP: 10.96.44.1
  loadBalancerSourceRanges: ["0.0.0.0/0"]
  ports: [{name: http, port: 80, nodePort: 30044}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.44.1}]
---
apiVersion: v1
kind: Service
metadata: {name: v6-ranges, namespace: ns44}
spec:
  type: LoadBalancer
  clusterIP: 10.96.44.2
  loadBalancerSourceRanges: ["2001:db8::/32"]
  ports: [{name: http, port: 80, nodePort: 30144}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.44.2}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: everyone-1, namespace: ns44, labels: {kubernetes.io/service-name: everyone}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.44.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: v6-ranges-1, namespace: ns44, labels: {kubernetes.io/service-name: v6-ranges}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.44.2"]}
"#,
        expect: &[
            ("198.19.44.1:80/TCP", Backends(&["10.244.44.1:80"])),
            ("198.19.44.2:80/TCP", Backends(&["10.244.44.2:80"])),
        ],
        note: "",
    },
    Case {
        name: "no-endpoints-rejected-on-every-frontend",
        origin: "pkg/proxy/nftables/proxier_test.go TestNoEndpointsReject \"pod to cluster IP with no endpoints\", \"pod to NodePort with no endpoints\", \"pod to LoadBalancer IP with no endpoints\", \"external to external IP with no endpoints\"",
        node: NODE_A,
        objects: r"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns45}
spec:
  type: LoadBalancer
  clusterIP: 10.96.45.1
  externalIPs: [198.18.45.1]
  ports: [{name: http, port: 80, nodePort: 30045}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.45.1}]
",
        expect: &[
            ("10.96.45.1:80/TCP", Refused),
            ("198.18.45.1:80/TCP", Refused),
            ("192.0.2.10:30045/TCP", Refused),
            ("198.19.45.1:80/TCP", Refused),
        ],
        note: "",
    },
    Case {
        name: "etp-cluster-every-frontend",
        origin: "pkg/proxy/nftables/proxier_test.go TestExternalTrafficPolicyCluster \"pod to cluster IP hits both endpoints\", \"pod to external IP hits both endpoints\", \"pod to LB IP hits both endpoints\", \"pod to NodePort hits both endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns46}
spec:
  type: LoadBalancer
  clusterIP: 10.96.46.1
  externalTrafficPolicy: Cluster
  externalIPs: [198.18.46.1]
  ports: [{name: http, port: 80, nodePort: 30046}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.46.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns46, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.46.1"]}
  - {addresses: ["10.244.46.2"], nodeName: node-a}
"#,
        expect: &[
            (
                "10.96.46.1:80/TCP",
                Backends(&["10.244.46.1:80", "10.244.46.2:80"]),
            ),
            (
                "198.18.46.1:80/TCP",
                Backends(&["10.244.46.1:80", "10.244.46.2:80"]),
            ),
            (
                "198.19.46.1:80/TCP",
                Backends(&["10.244.46.1:80", "10.244.46.2:80"]),
            ),
            (
                "192.0.2.10:30046/TCP",
                Backends(&["10.244.46.1:80", "10.244.46.2:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "terminating-etp-local-ready-exist",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyLocal \"ready endpoints exist\" (\"pod to clusterIP\"; the LB IP from a pod is short-circuited to the same set)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns47}
spec:
  type: LoadBalancer
  clusterIP: 10.96.47.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30047}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.47.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns47, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.47.1"]
    nodeName: node-a
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: ["10.244.47.2"]
    nodeName: node-a
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: ["10.244.47.3"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.47.4"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
  - addresses: ["10.244.47.5"]
    nodeName: node-b
    conditions: {ready: true, serving: true, terminating: false}
"#,
        expect: &[
            (
                "10.96.47.1:80/TCP",
                Backends(&["10.244.47.1:80", "10.244.47.2:80", "10.244.47.5:80"]),
            ),
            (
                "198.19.47.1:80/TCP",
                Backends(&["10.244.47.1:80", "10.244.47.2:80", "10.244.47.5:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "terminating-etp-local-only-terminating-here",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyLocal \"only terminating endpoints exist\" (\"pod to clusterIP\" reaches the remote ready endpoint)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns48}
spec:
  type: LoadBalancer
  clusterIP: 10.96.48.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30048}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.48.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns48, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.48.2"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.48.3"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.48.4"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
  - addresses: ["10.244.48.5"]
    nodeName: node-b
    conditions: {ready: true, serving: true, terminating: false}
"#,
        expect: &[
            ("10.96.48.1:80/TCP", Backends(&["10.244.48.5:80"])),
            ("198.19.48.1:80/TCP", Backends(&["10.244.48.5:80"])),
        ],
        note: "",
    },
    Case {
        name: "terminating-only-on-remote-node",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyLocal \"terminating endpoints on remote node\" (\"pod to clusterIP\"), TestTerminatingEndpointsTrafficPolicyCluster \"terminating endpoints on remote node\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns49}
spec:
  type: LoadBalancer
  clusterIP: 10.96.49.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30049}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.49.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns49, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.49.5"]
    nodeName: node-b
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.49.1:80/TCP", Backends(&["10.244.49.5:80"])),
            ("198.19.49.1:80/TCP", Backends(&["10.244.49.5:80"])),
            ("192.0.2.10:30049/TCP", Backends(&["10.244.49.5:80"])),
        ],
        note: "",
    },
    Case {
        name: "terminating-no-usable-endpoint",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyLocal \"no usable endpoints on any node\" (REJECT), TestTerminatingEndpointsTrafficPolicyCluster \"no usable endpoints on any node\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns50}
spec:
  type: LoadBalancer
  clusterIP: 10.96.50.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30050}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.50.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns50, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.50.4"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
  - addresses: ["10.244.50.5"]
    nodeName: node-b
    conditions: {ready: false, serving: false, terminating: true}
"#,
        expect: &[
            ("10.96.50.1:80/TCP", Refused),
            ("198.19.50.1:80/TCP", Refused),
        ],
        note: "",
    },
    Case {
        name: "terminating-etp-cluster-ready-exist",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyCluster \"ready endpoints exist\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns51}
spec:
  type: LoadBalancer
  clusterIP: 10.96.51.1
  externalTrafficPolicy: Cluster
  ports: [{name: http, port: 80, nodePort: 30051}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.51.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns51, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.51.1"]
    nodeName: node-a
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: ["10.244.51.2"]
    nodeName: node-a
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: ["10.244.51.3"]
    nodeName: node-b
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.51.4"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
  - addresses: ["10.244.51.5"]
    nodeName: node-b
    conditions: {ready: true, serving: true, terminating: false}
"#,
        expect: &[
            (
                "10.96.51.1:80/TCP",
                Backends(&["10.244.51.1:80", "10.244.51.2:80", "10.244.51.5:80"]),
            ),
            (
                "198.19.51.1:80/TCP",
                Backends(&["10.244.51.1:80", "10.244.51.2:80", "10.244.51.5:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "terminating-etp-cluster-only-terminating",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyCluster \"only terminating endpoints exist\"; test/e2e/network/service.go \"should fallback to terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Cluster\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns52}
spec:
  type: LoadBalancer
  clusterIP: 10.96.52.1
  externalTrafficPolicy: Cluster
  ports: [{name: http, port: 80, nodePort: 30052}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.52.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns52, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.52.2"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.52.3"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.52.4"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
  - addresses: ["10.244.52.5"]
    nodeName: node-b
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            (
                "10.96.52.1:80/TCP",
                Backends(&["10.244.52.2:80", "10.244.52.3:80", "10.244.52.5:80"]),
            ),
            (
                "198.19.52.1:80/TCP",
                Backends(&["10.244.52.2:80", "10.244.52.3:80", "10.244.52.5:80"]),
            ),
            (
                "192.0.2.10:30052/TCP",
                Backends(&["10.244.52.2:80", "10.244.52.3:80", "10.244.52.5:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "bad-ips-normalised",
        origin: "pkg/proxy/nftables/proxier_test.go TestBadIPs (leading zeros in the clusterIP, externalIP, load-balancer IP, source range and endpoint address are read as decimal: utilnet.ParseIPSloppy)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns53}
spec:
  type: LoadBalancer
  clusterIP: "10.096.053.001"
  externalIPs: ["198.018.053.001"]
  ports: [{name: http, port: 80, nodePort: 30053}]
status:
  loadBalancer:
    ingress: [{ip: "198.019.053.001"}]
---
apiVersion: v1
kind: Service
metadata: {name: ranged, namespace: ns53}
spec:
  type: LoadBalancer
  clusterIP: 10.96.53.2
  loadBalancerSourceRanges: ["203.0.113.000/025"]
  ports: [{name: http, port: 80, nodePort: 30153}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.53.2}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns53, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.053.001"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ranged-1, namespace: ns53, labels: {kubernetes.io/service-name: ranged}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.53.2"]}
"#,
        expect: &[
            ("10.96.53.1:80/TCP", Backends(&["10.244.53.1:80"])),
            ("198.18.53.1:80/TCP", Backends(&["10.244.53.1:80"])),
            ("198.19.53.1:80/TCP", Backends(&["10.244.53.1:80"])),
            ("192.0.2.10:30053/TCP", Backends(&["10.244.53.1:80"])),
            ("10.96.53.2:80/TCP", Backends(&["10.244.53.2:80"])),
            ("198.19.53.2:80/TCP", Untouched),
        ],
        note: SOURCE_RANGES,
    },
    Case {
        name: "invalid-external-ip-skipped",
        origin: "pkg/proxy/serviceport.go newBaseServiceInfo (externalIPs and load-balancer IPs that do not parse are skipped one by one: pkg/proxy/util MapIPsByIPFamily)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns54}
spec:
  type: LoadBalancer
  clusterIP: 10.96.54.1
  externalIPs: ["not-an-ip", "", 198.18.54.1, "198.18.54.300"]
  ports: [{name: http, port: 80, nodePort: 30054}]
status:
  loadBalancer:
    ingress: [{ip: "1.2.3"}, {ip: 198.19.54.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns54, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.54.1"]}
"#,
        expect: &[
            ("10.96.54.1:80/TCP", Backends(&["10.244.54.1:80"])),
            ("198.18.54.1:80/TCP", Backends(&["10.244.54.1:80"])),
            ("198.19.54.1:80/TCP", Backends(&["10.244.54.1:80"])),
            ("192.0.2.10:30054/TCP", Backends(&["10.244.54.1:80"])),
        ],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // Service and EndpointSlice filtering and merging (servicechangetracker, endpointslicecache)
    // ---------------------------------------------------------------------------------------
    Case {
        name: "headless-label",
        origin: "test/e2e/network/service.go \"should implement service.kubernetes.io/headless\"; cmd/kube-proxy/app/server.go (informers select services without the service.kubernetes.io/headless label)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns55, labels: {service.kubernetes.io/headless: ""}}
spec:
  type: NodePort
  clusterIP: 10.96.55.1
  ports: [{name: http, port: 80, nodePort: 30055}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns55, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.55.1"]}
"#,
        expect: &[
            ("10.96.55.1:80/TCP", Untouched),
            ("192.0.2.10:30055/TCP", Untouched),
        ],
        note: "",
    },
    Case {
        name: "headless-label-on-a-slice",
        origin: "cmd/kube-proxy/app/server.go (the same label selector filters EndpointSlices: a slice labelled service.kubernetes.io/headless is never seen)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns56}
spec:
  clusterIP: 10.96.56.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns56, labels: {kubernetes.io/service-name: s, service.kubernetes.io/headless: ""}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.56.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns56, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.56.2"]}
"#,
        expect: &[("10.96.56.1:80/TCP", Backends(&["10.244.56.2:80"]))],
        note: "",
    },
    Case {
        name: "service-proxy-name-another-proxy",
        origin: "test/e2e/network/service.go \"should implement service.kubernetes.io/service-proxy-name\" (label value foo-bar); cmd/kube-proxy/app/server.go (informers select objects without the label)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns57, labels: {service.kubernetes.io/service-proxy-name: foo-bar}}
spec:
  type: NodePort
  clusterIP: 10.96.57.1
  externalIPs: [198.18.57.1]
  ports: [{name: http, port: 80, nodePort: 30057}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns57, labels: {kubernetes.io/service-name: s, service.kubernetes.io/service-proxy-name: foo-bar}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.57.1"]}
"#,
        expect: &[
            ("10.96.57.1:80/TCP", Untouched),
            ("198.18.57.1:80/TCP", Untouched),
            ("192.0.2.10:30057/TCP", Untouched),
        ],
        note: "",
    },
    Case {
        name: "service-proxy-name-socklb",
        origin: "test/e2e/network/service.go \"should implement service.kubernetes.io/service-proxy-name\" (the label hands a Service to the proxy it names; cmd/kube-proxy/app/server.go: kube-proxy, named by no label, skips every labelled Service)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns58, labels: {service.kubernetes.io/service-proxy-name: socklb}}
spec:
  clusterIP: 10.96.58.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns58, labels: {kubernetes.io/service-name: s, service.kubernetes.io/service-proxy-name: socklb}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.58.1"]}
"#,
        expect: &[("10.96.58.1:80/TCP", Backends(&["10.244.58.1:80"]))],
        note: "kube-proxy skips every Service with the label; socklb serves those that name it (--proxy-name, default socklb), as a non-default proxy does",
    },
    Case {
        name: "external-name-with-cluster-ip",
        origin: "pkg/proxy/iptables/proxier_test.go TestBuildServiceMapServiceTypeExternalName; pkg/proxy/util/utils.go ShouldSkipService",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns59}
spec:
  type: ExternalName
  externalName: foo2.bar.com
  clusterIP: 10.96.59.1
  externalIPs: [198.18.59.1]
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns59, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.59.1"]}
"#,
        expect: &[
            ("10.96.59.1:80/TCP", Untouched),
            ("198.18.59.1:80/TCP", Untouched),
        ],
        note: "",
    },
    Case {
        name: "single-stack-ignores-other-family",
        origin: "pkg/proxy/servicechangetracker.go serviceToServiceMap (no ClusterIP of the proxier's family: the Service is ignored by that family, externalIPs and load-balancer IPs included)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns60}
spec:
  type: LoadBalancer
  clusterIP: 10.96.60.1
  externalIPs: [198.18.60.1, "2001:db8:60::1"]
  ports: [{name: http, port: 80, nodePort: 30060}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.60.1}, {ip: "2001:db8:60::2"}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v4, namespace: ns60, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.60.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v6, namespace: ns60, labels: {kubernetes.io/service-name: s}}
addressType: IPv6
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["fd00:244::60:1"]}
"#,
        expect: &[
            ("198.18.60.1:80/TCP", Backends(&["10.244.60.1:80"])),
            ("198.19.60.1:80/TCP", Backends(&["10.244.60.1:80"])),
            ("[2001:db8:60::1]:80/TCP", Untouched),
            ("[2001:db8:60::2]:80/TCP", Untouched),
        ],
        note: "",
    },
    Case {
        name: "duplicate-endpoint-non-terminating-wins",
        origin: "pkg/proxy/endpointslicecache.go addEndpoints (one IP:port in two slices: a terminating copy never replaces another; a pod IP reused while the old pod terminates)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns61}
spec:
  clusterIP: 10.96.61.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-a, namespace: ns61, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.61.1"]
    conditions: {ready: false, serving: true, terminating: true}
  - {addresses: ["10.244.61.2"]}
  - {addresses: ["10.244.61.3"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-b, namespace: ns61, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.61.1"]}
  - addresses: ["10.244.61.3"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[(
            "10.96.61.1:80/TCP",
            Backends(&["10.244.61.1:80", "10.244.61.2:80", "10.244.61.3:80"]),
        )],
        note: "",
    },
    Case {
        name: "other-family-slice-ignored",
        origin: "pkg/proxy/endpointschangetracker.go EndpointSliceUpdate (a slice whose addressType is not the proxier's family is ignored)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns62}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::62:1"
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v4, namespace: ns62, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.62.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v6, namespace: ns62, labels: {kubernetes.io/service-name: s}}
addressType: IPv6
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["fd00:244::62:1"]}
"#,
        expect: &[("[fd00:96::62:1]:80/TCP", Backends(&["[fd00:244::62:1]:80"]))],
        note: "",
    },
    Case {
        name: "fqdn-slice-ignored",
        origin: "pkg/proxy/endpointschangetracker.go EndpointSliceUpdate (FQDN slices are never of the proxier's family)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns63}
spec:
  clusterIP: 10.96.63.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns63, labels: {kubernetes.io/service-name: s}}
addressType: FQDN
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["backend.example.com"]}
"#,
        expect: &[("10.96.63.1:80/TCP", Refused)],
        note: "",
    },
    Case {
        name: "slice-port-name-matches-no-service-port",
        origin: "pkg/proxy/endpointslicecache.go endpointInfoByServicePort (slice ports are keyed by name and protocol; one no Service port has reaches nothing)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns64}
spec:
  clusterIP: 10.96.64.1
  ports:
    - {name: http, port: 80}
    - {name: metrics, port: 9090}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns64, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports:
  - {name: web, port: 8080}
  - {name: metrics, port: 9091}
endpoints:
  - {addresses: ["10.244.64.1"]}
"#,
        expect: &[
            ("10.96.64.1:80/TCP", Refused),
            ("10.96.64.1:9090/TCP", Backends(&["10.244.64.1:9091"])),
        ],
        note: "",
    },
    Case {
        name: "endpoint-without-address-skipped",
        origin: "pkg/proxy/endpointslicecache.go addEndpoints (\"Ignoring invalid endpoint port with empty address\")",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns65}
spec:
  clusterIP: 10.96.65.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns65, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: []}
  - {addresses: ["10.244.65.1", "10.244.65.9"]}
"#,
        expect: &[("10.96.65.1:80/TCP", Backends(&["10.244.65.1:80"]))],
        note: "",
    },
    Case {
        name: "slices-merged",
        origin: "pkg/proxy/endpointslicecache_test.go TestEndpointsMapFromESC \"2 slices, same port\", \"2 overlapping slices, same port\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns66}
spec:
  clusterIP: 10.96.66.1
  ports: [{name: port-0, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns66, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: port-0, port: 80}]
endpoints:
  - {addresses: ["10.244.66.1"]}
  - {addresses: ["10.244.66.2"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns66, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: port-0, port: 80}]
endpoints:
  - {addresses: ["10.244.66.2"]}
  - {addresses: ["10.244.66.3"]}
"#,
        expect: &[(
            "10.96.66.1:80/TCP",
            Backends(&["10.244.66.1:80", "10.244.66.2:80", "10.244.66.3:80"]),
        )],
        note: "",
    },
    Case {
        name: "named-target-port-per-slice",
        origin: "pkg/proxy/endpointslicecache_test.go TestEndpointsMapFromESC \"Different endpoints with duplicate IPs should not be filtered\" (a named targetPort resolves per pod, so slices give one port name different numbers)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns67}
spec:
  clusterIP: 10.96.67.1
  ports: [{name: http, port: 80, targetPort: web}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns67, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
  - {addresses: ["10.244.67.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns67, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 9090}]
endpoints:
  - {addresses: ["10.244.67.1"]}
  - {addresses: ["10.244.67.2"]}
"#,
        expect: &[(
            "10.96.67.1:80/TCP",
            Backends(&["10.244.67.1:8080", "10.244.67.1:9090", "10.244.67.2:9090"]),
        )],
        note: "",
    },
    Case {
        name: "long-port-name",
        origin: "pkg/proxy/types.go ServicePortName (any DNS-1123 label, up to 63 characters, names a service port; issue 11)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns68}
spec:
  clusterIP: 10.96.68.1
  ports:
    - {name: a-port-name-well-beyond-fifteen-characters-up-to-sixty-three-ok, port: 80}
    - {name: http, port: 81}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns68, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports:
  - {name: a-port-name-well-beyond-fifteen-characters-up-to-sixty-three-ok, port: 80}
  - {name: http, port: 81}
endpoints:
  - {addresses: ["10.244.68.1"]}
"#,
        expect: &[
            ("10.96.68.1:80/TCP", Backends(&["10.244.68.1:80"])),
            ("10.96.68.1:81/TCP", Backends(&["10.244.68.1:81"])),
        ],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // test/e2e/network/service.go
    // ---------------------------------------------------------------------------------------
    Case {
        name: "multiport-endpoints",
        origin: "test/e2e/network/service.go \"should serve multiport endpoints from pods\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns69}
spec:
  clusterIP: 10.96.69.1
  ports:
    - {name: portname1, port: 80, targetPort: svc1}
    - {name: portname2, port: 81, targetPort: svc2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns69, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: portname1, port: 100}]
endpoints:
  - {addresses: ["10.244.69.1"], nodeName: node-a}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns69, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: portname2, port: 101}]
endpoints:
  - {addresses: ["10.244.69.2"], nodeName: node-b}
"#,
        expect: &[
            ("10.96.69.1:80/TCP", Backends(&["10.244.69.1:100"])),
            ("10.96.69.1:81/TCP", Backends(&["10.244.69.2:101"])),
        ],
        note: "",
    },
    Case {
        name: "publish-not-ready-addresses",
        origin: "test/e2e/network/service.go \"should be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is true\", \"should create endpoints for unready pods\" (staging/src/k8s.io/endpointslice/utils.go podToEndpoint writes such pods ready; kube-proxy reads the conditions only)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns70}
spec:
  type: NodePort
  clusterIP: 10.96.70.1
  publishNotReadyAddresses: true
  ports: [{name: http, port: 80, nodePort: 30070}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns70, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.70.1"]
    nodeName: node-b
    conditions: {ready: true, serving: false, terminating: true}
"#,
        expect: &[
            ("10.96.70.1:80/TCP", Backends(&["10.244.70.1:80"])),
            ("192.0.2.10:30070/TCP", Backends(&["10.244.70.1:80"])),
        ],
        note: "",
    },
    Case {
        name: "not-published-unready-terminating",
        origin: "test/e2e/network/service.go \"should not be able to connect to terminating and unready endpoints if PublishNotReadyAddresses is false\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns71}
spec:
  type: NodePort
  clusterIP: 10.96.71.1
  ports: [{name: http, port: 80, nodePort: 30071}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns71, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.71.1"]
    nodeName: node-b
    conditions: {ready: false, serving: false, terminating: true}
"#,
        expect: &[
            ("10.96.71.1:80/TCP", Refused),
            ("192.0.2.10:30071/TCP", Refused),
        ],
        note: "",
    },
    Case {
        name: "published-unready-counts-for-topology",
        origin: "staging/src/k8s.io/endpointslice/utils.go podToEndpoint (publishNotReadyAddresses: written ready) with pkg/proxy/topology.go topologyModeFromHints (a ready endpoint without hints turns zone filtering off)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns72}
spec:
  clusterIP: 10.96.72.1
  publishNotReadyAddresses: true
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns72, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.72.1"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["10.244.72.2"], hints: {forZones: [{name: zone-b}]}}
  - addresses: ["10.244.72.3"]
    conditions: {ready: true, serving: false, terminating: false}
"#,
        expect: &[(
            "10.96.72.1:80/TCP",
            Backends(&["10.244.72.1:80", "10.244.72.2:80", "10.244.72.3:80"]),
        )],
        note: "",
    },
    Case {
        name: "itp-local-local-terminating-fallback",
        origin: "test/e2e/network/service.go \"should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local\" (the client on the endpoint's node)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns73}
spec:
  clusterIP: 10.96.73.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns73, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.73.1"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[("10.96.73.1:80/TCP", Backends(&["10.244.73.1:80"]))],
        note: "",
    },
    Case {
        name: "itp-local-remote-terminating",
        origin: "test/e2e/network/service.go \"should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local\" (the client on the other node fails)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns74}
spec:
  clusterIP: 10.96.74.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns74, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.74.1"]
    nodeName: node-b
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[("10.96.74.1:80/TCP", RefusedNoLocal)],
        note: NO_LOCAL,
    },
    Case {
        name: "etp-local-terminating-node-port",
        origin: "test/e2e/network/service.go \"should fallback to local terminating endpoints when there are no ready endpoints with externalTrafficPolicy=Local\" (a pod on the node without the endpoint reaching its own node's NodePort: short-circuited, succeeds under kube-proxy per the test's comment; another node's address is not this node's business)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns75}
spec:
  type: NodePort
  clusterIP: 10.96.75.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30075}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns75, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.75.1"]
    nodeName: node-b
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.75.1:80/TCP", Backends(&["10.244.75.1:80"])),
            ("192.0.2.10:30075/TCP", Backends(&["10.244.75.1:80"])),
            ("192.0.2.11:30075/TCP", Untouched),
        ],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // Address ownership (socklb's own rule: CVE-2020-8554, issue 12)
    // ---------------------------------------------------------------------------------------
    Case {
        name: "external-ip-cannot-take-cluster-ip",
        origin: "socklb address ownership (CVE-2020-8554; issue 12): a ClusterIP claim wins; kube-proxy: pkg/proxy/nftables/proxier.go service-ips map, one element per address (undefined winner)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: dns-76, namespace: kube-system, uid: 99999999-0000-0000-0000-000000000076, creationTimestamp: "2024-06-01T00:00:00Z"}
spec:
  clusterIP: 10.96.76.1
  ports: [{name: dns, port: 53}]
---
apiVersion: v1
kind: Service
metadata: {name: evil-76, namespace: aaa, uid: 00000000-0000-0000-0000-000000000076, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  clusterIP: 10.96.76.2
  externalIPs: [10.96.76.1]
  ports: [{name: dns, port: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-76-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns-76}}
addressType: IPv4
ports: [{name: dns, port: 53}]
endpoints:
  - {addresses: ["10.244.76.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: evil-76-1, namespace: aaa, labels: {kubernetes.io/service-name: evil-76}}
addressType: IPv4
ports: [{name: dns, port: 53}]
endpoints:
  - {addresses: ["10.244.76.9"]}
"#,
        expect: &[
            ("10.96.76.1:53/TCP", Backends(&["10.244.76.1:53"])),
            ("10.96.76.2:53/TCP", Backends(&["10.244.76.9:53"])),
        ],
        note: OWNERSHIP,
    },
    Case {
        name: "external-ip-cannot-take-cluster-ip-from-kube-system",
        origin: "socklb address ownership (CVE-2020-8554; issue 12), the other namespace order: the claimant in kube-system, the ClusterIP's owner in aaa",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: web-77, namespace: aaa, uid: 99999999-0000-0000-0000-000000000077, creationTimestamp: "2024-06-01T00:00:00Z"}
spec:
  clusterIP: 10.96.77.1
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: evil-77, namespace: kube-system, uid: 00000000-0000-0000-0000-000000000077, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.77.2
  externalIPs: [10.96.77.1]
  ports: [{name: http, port: 80, nodePort: 30077}]
status:
  loadBalancer:
    ingress: [{ip: 10.96.77.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-77-1, namespace: aaa, labels: {kubernetes.io/service-name: web-77}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.77.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: evil-77-1, namespace: kube-system, labels: {kubernetes.io/service-name: evil-77}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.77.9"]}
"#,
        expect: &[
            ("10.96.77.1:80/TCP", Backends(&["10.244.77.1:80"])),
            ("10.96.77.2:80/TCP", Backends(&["10.244.77.9:80"])),
        ],
        note: OWNERSHIP,
    },
    Case {
        name: "contested-external-ip-older-service-wins",
        origin: "socklb address ownership (issue 12): between two non-ClusterIP claims the older creationTimestamp wins; kube-proxy: undefined (pkg/proxy/nftables/proxier.go service-ips map)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: newer-78, namespace: aaa, uid: 00000000-0000-0000-0000-000000000078, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  clusterIP: 10.96.78.1
  externalIPs: [198.18.78.1]
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: older-78, namespace: zzz, uid: ffffffff-0000-0000-0000-000000000078, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  clusterIP: 10.96.78.2
  externalIPs: [198.18.78.1]
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: newer-78-1, namespace: aaa, labels: {kubernetes.io/service-name: newer-78}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.78.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: older-78-1, namespace: zzz, labels: {kubernetes.io/service-name: older-78}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.78.2"]}
"#,
        expect: &[
            ("198.18.78.1:80/TCP", Backends(&["10.244.78.2:80"])),
            ("10.96.78.1:80/TCP", Backends(&["10.244.78.1:80"])),
        ],
        note: OWNERSHIP,
    },
    Case {
        name: "contested-address-same-age-smaller-uid-wins",
        origin: "socklb address ownership (issue 12): same creationTimestamp, the smaller uid wins, whether the claim is an externalIP or a load-balancer IP",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: a-79, namespace: aaa, uid: ffffffff-0000-0000-0000-000000000079, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  clusterIP: 10.96.79.1
  externalIPs: [198.18.79.1]
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: z-79, namespace: zzz, uid: 00000000-0000-0000-0000-000000000079, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.79.2
  ports: [{name: http, port: 80, nodePort: 30079}]
status:
  loadBalancer:
    ingress: [{ip: 198.18.79.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: a-79-1, namespace: aaa, labels: {kubernetes.io/service-name: a-79}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.79.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: z-79-1, namespace: zzz, labels: {kubernetes.io/service-name: z-79}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.79.2"]}
"#,
        expect: &[("198.18.79.1:80/TCP", Backends(&["10.244.79.2:80"]))],
        note: OWNERSHIP,
    },
    // ---------------------------------------------------------------------------------------
    // Dual stack and UDP
    // ---------------------------------------------------------------------------------------
    Case {
        name: "dual-stack-cluster-ips",
        origin: "pkg/proxy/servicechangetracker.go serviceToServiceMap with pkg/proxy/util GetClusterIPByFamily (each family's proxier serves its own ClusterIP with its own family's slices); test/e2e/network/dual_stack.go",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns80}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  clusterIPs: ["fd00:96::80:1", 10.96.80.1]
  ports:
    - {name: http, port: 80, protocol: TCP}
    - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v4, namespace: ns80, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports:
  - {name: http, port: 80, protocol: TCP}
  - {name: dns, port: 5353, protocol: UDP}
endpoints:
  - {addresses: ["10.244.80.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-v6, namespace: ns80, labels: {kubernetes.io/service-name: s}}
addressType: IPv6
ports:
  - {name: http, port: 80, protocol: TCP}
  - {name: dns, port: 5353, protocol: UDP}
endpoints:
  - {addresses: ["fd00:244::80:1"]}
  - {addresses: ["fd00:244::80:2"], nodeName: node-a}
"#,
        expect: &[
            ("10.96.80.1:80/TCP", Backends(&["10.244.80.1:80"])),
            ("10.96.80.1:53/UDP", Backends(&["10.244.80.1:5353"])),
            (
                "[fd00:96::80:1]:80/TCP",
                Backends(&["[fd00:244::80:1]:80", "[fd00:244::80:2]:80"]),
            ),
            (
                "[fd00:96::80:1]:53/UDP",
                Backends(&["[fd00:244::80:1]:5353", "[fd00:244::80:2]:5353"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "ipv6-itp-local-and-zone-hints",
        origin: "pkg/proxy/topology_test.go TestCategorizeEndpoints \"internalTrafficPolicy: Local, topology ignored for Local endpoints\" on an IPv6 single-stack Service",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: local, namespace: ns81}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::81:1"
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: ns81}
spec:
  ipFamilies: [IPv6]
  clusterIP: "fd00:96::81:2"
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: ns81, labels: {kubernetes.io/service-name: local}}
addressType: IPv6
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["fd00:244::81:1"], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
  - {addresses: ["fd00:244::81:2"], nodeName: node-b, hints: {forZones: [{name: zone-a}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zoned-1, namespace: ns81, labels: {kubernetes.io/service-name: zoned}}
addressType: IPv6
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["fd00:244::81:3"], hints: {forZones: [{name: zone-a}]}}
  - {addresses: ["fd00:244::81:4"], hints: {forZones: [{name: zone-b}]}}
"#,
        expect: &[
            ("[fd00:96::81:1]:80/TCP", Backends(&["[fd00:244::81:1]:80"])),
            ("[fd00:96::81:2]:80/TCP", Backends(&["[fd00:244::81:3]:80"])),
        ],
        note: "",
    },
    Case {
        name: "udp-itp-local-only-remote",
        origin: "pkg/proxy/nftables/proxier_test.go TestInternalTrafficPolicy \"internalTrafficPolicy is local and there are no local endpoints\" (DROP), on a UDP port",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns82}
spec:
  clusterIP: 10.96.82.1
  internalTrafficPolicy: Local
  ports: [{name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns82, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
  - {addresses: ["10.244.82.1"], nodeName: node-b}
"#,
        expect: &[("10.96.82.1:53/UDP", RefusedNoLocal)],
        note: NO_LOCAL,
    },
    Case {
        name: "udp-terminating-fallback-and-node-port",
        origin: "pkg/proxy/nftables/proxier_test.go TestTerminatingEndpointsTrafficPolicyCluster \"only terminating endpoints exist\", on a UDP NodePort Service",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns83}
spec:
  type: NodePort
  clusterIP: 10.96.83.1
  ports: [{name: dns, port: 53, protocol: UDP, nodePort: 30083}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns83, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints:
  - addresses: ["10.244.83.1"]
    nodeName: node-a
    conditions: {ready: false, serving: true, terminating: true}
  - addresses: ["10.244.83.2"]
    conditions: {ready: false, serving: false, terminating: true}
"#,
        expect: &[
            ("10.96.83.1:53/UDP", Backends(&["10.244.83.1:53"])),
            ("192.0.2.10:30083/UDP", Backends(&["10.244.83.1:53"])),
        ],
        note: "",
    },
    // ---------------------------------------------------------------------------------------
    // More slice rules, REJECT against DROP, condition defaults, NodePort contention
    // ---------------------------------------------------------------------------------------
    Case {
        name: "slice-ports-keyed-by-name-protocol-namespace",
        origin: "pkg/proxy/endpointslicecache.go endpointInfoByServicePort (key: the slice's namespace and service-name label, port name and protocol; the port number is the slice's) and endpointSliceCacheKeys; pkg/proxy/endpointslicecache_test.go TestEndpointsMapFromESC \"3 slices with different services and namespaces\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns84}
spec:
  clusterIP: 10.96.84.1
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: web, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns84, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: TCP}]
endpoints:
  - {addresses: ["10.244.84.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-2, namespace: ns84, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: web, port: 8081, protocol: TCP}]
endpoints:
  - {addresses: ["10.244.84.2"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-3, namespace: ns84b, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: web, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: ["10.244.84.3"]}
"#,
        expect: &[
            ("10.96.84.1:53/UDP", Refused),
            ("10.96.84.1:80/TCP", Backends(&["10.244.84.2:8081"])),
        ],
        note: "",
    },
    Case {
        name: "itp-local-reject-or-drop",
        origin: "pkg/proxy/topology.go CategorizeEndpoints (hasAnyEndpoints: some endpoint anywhere is ready, or serving and terminating) with pkg/proxy/nftables/proxier.go syncProxyRules (none usable anywhere: REJECT; usable elsewhere only: DROP)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: nowhere, namespace: ns85}
spec:
  clusterIP: 10.96.85.1
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: elsewhere, namespace: ns85}
spec:
  clusterIP: 10.96.85.2
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: nowhere-1, namespace: ns85, labels: {kubernetes.io/service-name: nowhere}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.85.1"]
    nodeName: node-b
    conditions: {ready: false, serving: false, terminating: false}
  - addresses: ["10.244.85.2"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: true}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: elsewhere-1, namespace: ns85, labels: {kubernetes.io/service-name: elsewhere}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.85.3"]
    nodeName: node-a
    conditions: {ready: false, serving: false, terminating: false}
  - {addresses: ["10.244.85.4"], nodeName: node-b}
"#,
        expect: &[
            ("10.96.85.1:80/TCP", Refused),
            ("10.96.85.2:80/TCP", RefusedNoLocal),
        ],
        note: NO_LOCAL,
    },
    Case {
        name: "absent-conditions-defaults",
        origin: "pkg/proxy/endpointslicecache.go addEndpoints (ready and serving default to true, terminating to false, each on its own)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: fallback, namespace: ns86}
spec:
  clusterIP: 10.96.86.1
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: ready, namespace: ns86}
spec:
  clusterIP: 10.96.86.2
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: fallback-1, namespace: ns86, labels: {kubernetes.io/service-name: fallback}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.86.1"]
    conditions: {ready: false, terminating: true}
  - addresses: ["10.244.86.2"]
    conditions: {ready: false}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ready-1, namespace: ns86, labels: {kubernetes.io/service-name: ready}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - addresses: ["10.244.86.3"]
    conditions: {}
  - addresses: ["10.244.86.4"]
    conditions: {serving: false}
  - addresses: ["10.244.86.5"]
    conditions: {ready: false, serving: true, terminating: true}
"#,
        expect: &[
            ("10.96.86.1:80/TCP", Backends(&["10.244.86.1:80"])),
            (
                "10.96.86.2:80/TCP",
                Backends(&["10.244.86.3:80", "10.244.86.4:80"]),
            ),
        ],
        note: "",
    },
    Case {
        name: "node-port-contested-by-external-ip",
        origin: "socklb address ownership (issue 12): a NodePort on a node address and another Service's externalIP naming that address and port; kube-proxy: the exact address match wins (pkg/proxy/nftables/proxier.go service-ips before service-nodeports; iptables: the nodeports jump is the last rule of KUBE-SERVICES)",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: node-port-87, namespace: ns87, uid: 00000000-0000-0000-0000-000000000087, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  type: NodePort
  clusterIP: 10.96.87.1
  ports: [{name: http, port: 80, nodePort: 30087}]
---
apiVersion: v1
kind: Service
metadata: {name: external-87, namespace: ns87, uid: 00000000-0000-0000-0000-000000000187, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  clusterIP: 10.96.87.2
  externalIPs: [192.0.2.10]
  ports: [{name: http, port: 30087}, {name: other, port: 30187}]
---
apiVersion: v1
kind: Service
metadata: {name: node-port-187, namespace: ns87, uid: 00000000-0000-0000-0000-000000000287, creationTimestamp: "2025-01-01T00:00:00Z"}
spec:
  type: NodePort
  clusterIP: 10.96.87.3
  ports: [{name: http, port: 80, nodePort: 30187}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: node-port-87-1, namespace: ns87, labels: {kubernetes.io/service-name: node-port-87}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.87.1"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: external-87-1, namespace: ns87, labels: {kubernetes.io/service-name: external-87}}
addressType: IPv4
ports: [{name: http, port: 30087}, {name: other, port: 30187}]
endpoints:
  - {addresses: ["10.244.87.2"]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: node-port-187-1, namespace: ns87, labels: {kubernetes.io/service-name: node-port-187}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.87.3"]}
"#,
        expect: &[
            ("192.0.2.10:30087/TCP", Backends(&["10.244.87.1:80"])),
            ("192.0.2.10:30187/TCP", Backends(&["10.244.87.3:80"])),
        ],
        note: "kube-proxy gives a node address and port to the externalIP (or load-balancer IP) naming it, over a NodePort; socklb never serves an externalIP or load-balancer IP that is one of this node's own addresses (only NodePorts are served there), so neither an older nor a newer Service's externalIP can take a NodePort",
    },
    Case {
        name: "cluster-ip-none",
        origin: "pkg/proxy/util/utils.go ShouldSkipService (clusterIP None: no rule at all, externalIPs included); pkg/proxy/iptables/proxier_test.go TestBuildServiceMapServiceHeadless",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns88}
spec:
  clusterIP: None
  externalIPs: [198.18.88.1]
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns88, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{name: http, port: 80}]
endpoints:
  - {addresses: ["10.244.88.1"]}
"#,
        expect: &[("198.18.88.1:80/TCP", Untouched)],
        note: "",
    },
    Case {
        name: "sctp-port-not-translated",
        origin: "pkg/proxy/nftables/proxier_test.go TestClusterIPGeneral \"clusterIP with TCP, UDP, and SCTP on same port (SCTP)\" (kube-proxy DNATs SCTP too); test/e2e/network/service.go \"should allow creating a basic SCTP service with pod and endpoints\"",
        node: NODE_A,
        objects: r#"
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns89}
spec:
  clusterIP: 10.96.89.1
  ports:
    - {name: http, port: 80, protocol: TCP}
    - {name: sip, port: 5060, protocol: SCTP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns89, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports:
  - {name: http, port: 80, protocol: TCP}
  - {name: sip, port: 5060, protocol: SCTP}
endpoints:
  - {addresses: ["10.244.89.1"]}
"#,
        expect: &[
            ("10.96.89.1:80/TCP", Backends(&["10.244.89.1:80"])),
            // No frontend for the SCTP port: not even a TCP or UDP one on its number.
            ("10.96.89.1:5060/TCP", Untouched),
            ("10.96.89.1:5060/UDP", Untouched),
        ],
        note: "socklb translates TCP and UDP only: an SCTP port gets no frontend (explain says so), and SCTP connects go their way untranslated, to kube-proxy or the CNI if one handles them",
    },
];
