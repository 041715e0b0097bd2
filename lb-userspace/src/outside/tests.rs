use std::net::SocketAddr;

use super::*;
use crate::translate::{ClaimKind, Seniority};
use crate::vocab::ObjectKey;

fn udp_port(addresses: &[&str], node_port: Option<u16>, serving: &[&str]) -> OutsidePort {
    OutsidePort {
        service: ObjectKey::new("kube-system", "dns"),
        port_name: "dns".into(),
        protocol: Protocol::Udp,
        family: Family::IPv4,
        port: 53,
        node_port,
        addresses: addresses
            .iter()
            .map(|a| (a.parse().unwrap(), ClaimKind::LoadBalancer))
            .collect(),
        local_policy: false,
        cluster: serving.iter().map(|s| s.parse().unwrap()).collect(),
        local: Vec::new(),
        has_endpoints: !serving.is_empty(),
        affinity_timeout_s: None,
        source_ranges: Vec::new(),
        serving: serving.iter().map(|s| s.parse().unwrap()).collect(),
        seniority: Seniority::default(),
    }
}

fn flow(src: &str, dst: &str, reply: &str) -> Flow {
    Flow {
        orig_src: src.parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        reply_src: reply.parse().unwrap(),
    }
}

/// kube-proxy's cleanup (`cleanup.go`): a flow to a UDP frontend whose replies come from no
/// serving endpoint goes, the removed endpoint's and the one nothing translated (replies from
/// the frontend itself, made while the port had no endpoint); a flow to a serving endpoint, to
/// a NodePort on another address than the node's, and to another port stays.
#[test]
fn stale_flows_are_those_whose_replies_come_from_no_serving_endpoint() {
    let port = udp_port(&["192.0.2.53"], Some(30053), &["10.244.1.5:5353"]);
    let state = OutsideState {
        node_addresses: vec!["192.168.60.11".parse().unwrap()],
        ..OutsideState::default()
    };
    let flows = [
        flow("192.168.60.100:4000", "192.0.2.53:53", "10.244.1.5:5353"),
        flow("192.168.60.100:4001", "192.0.2.53:53", "10.244.2.9:5353"),
        flow("192.168.60.100:4002", "192.0.2.53:53", "192.0.2.53:53"),
        flow(
            "192.168.60.100:4003",
            "192.168.60.11:30053",
            "10.244.2.9:5353",
        ),
        flow(
            "192.168.60.100:4004",
            "192.168.60.11:30053",
            "10.244.1.5:5353",
        ),
        flow(
            "192.168.60.100:4005",
            "192.168.60.99:30053",
            "10.244.2.9:5353",
        ),
        flow("192.168.60.100:4006", "192.0.2.53:54", "10.244.2.9:5353"),
    ];
    let found: Vec<SocketAddr> = stale_flows(&state, &[&port], &flows)
        .iter()
        .map(|f| f.orig_src)
        .collect();
    let expected: Vec<SocketAddr> = [
        "192.168.60.100:4001",
        "192.168.60.100:4002",
        "192.168.60.100:4003",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    assert_eq!(found, expected);
}
