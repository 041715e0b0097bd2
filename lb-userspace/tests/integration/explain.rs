//! `explain` names the first broken link, for each link of the chain.
use std::collections::BTreeMap;

use socklb::{
    dataplane::maps::InMemoryMaps,
    explain::{Link, Sources, explain, render},
    model::{Store, parse_manifests},
    reconcile::Reconciler,
    translate::{NodeInfo, translate_all},
    vocab::ObjectRef,
};

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: 8080}]\n";

fn slice(port_name: &str, endpoints: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: {port_name}, port: 8080}}]\nendpoints: {endpoints}\n"
    )
}

fn store(docs: &[&str]) -> (Store, BTreeMap<ObjectRef, String>) {
    let parsed = parse_manifests("test.yaml", docs.join("---\n").as_bytes());
    let rejected = parsed
        .errors
        .iter()
        .filter_map(|e| Some((e.object.clone()?, e.to_string())))
        .collect();
    let store: Store = parsed.objects.into_iter().collect();
    (store, rejected)
}

fn sources<'a>(
    store: &'a Store,
    rejected: &'a BTreeMap<ObjectRef, String>,
    node: &'a NodeInfo,
    maps: Option<&'a socklb::dataplane::maps::MapSnapshot>,
) -> Sources<'a> {
    Sources {
        store,
        rejected,
        node,
        maps,
        index: None,
        agent: None,
        ownership: None,
        connections: None,
        outside: None,
    }
}

/// Explains `default/web` with the maps holding what the agent would write (or nothing).
fn link(docs: &[&str], synced: bool) -> (Link, String) {
    let (store, rejected) = store(docs);
    let node = NodeInfo::default();
    let mut r = Reconciler::new(InMemoryMaps::new()).unwrap();
    if synced {
        r.sync_all(&translate_all(&store, &node).0);
    }
    let e = explain(
        &sources(&store, &rejected, &node, Some(r.snapshot())),
        "default/web",
    );
    let text = render(&e);
    assert!(text.contains("verdict:"), "{text}");
    (e.broken, e.verdict)
}

#[test]
fn each_broken_link_is_named() {
    let ready = r#"[{addresses: ["10.244.1.1"]}]"#;
    assert_eq!(link(&[], true).0, Link::Service);
    let (l, why) = link(&[&SERVICE.replace("10.96.0.10", "10.96.0.999")], true);
    assert_eq!(l, Link::Service);
    assert!(
        why.contains("rejected") && why.contains("spec.clusterIP"),
        "{why}"
    );
    assert_eq!(
        link(
            &[&SERVICE.replace("clusterIP: 10.96.0.10", "clusterIP: None")],
            true
        )
        .0,
        Link::Service
    );
    assert_eq!(link(&[SERVICE], true).0, Link::EndpointSlices);
    let (l, why) = link(&[SERVICE, &slice("http", "[]")], true);
    assert_eq!(l, Link::Endpoints);
    assert!(why.contains("app=web"), "{why}");
    assert_eq!(
        link(&[SERVICE, &slice("metrics", ready)], true).0,
        Link::Port
    );
    let (l, why) = link(
        &[
            SERVICE,
            &slice(
                "http",
                r#"[{addresses: ["10.244.1.1"], conditions: {ready: false}}]"#,
            ),
        ],
        true,
    );
    assert_eq!(l, Link::Candidates);
    assert!(why.contains("1 not-ready"), "{why}");
    assert_eq!(link(&[SERVICE, &slice("http", ready)], false).0, Link::Maps);
    assert_eq!(link(&[SERVICE, &slice("http", ready)], true).0, Link::None);
}

#[test]
fn a_frontend_address_finds_its_service_and_digests_agree_when_in_step() {
    let (store, rejected) = store(&[SERVICE, &slice("http", r#"[{addresses: ["10.244.1.1"]}]"#)]);
    let node = NodeInfo::default();
    let mut r = Reconciler::new(InMemoryMaps::new()).unwrap();
    r.sync_all(&translate_all(&store, &node).0);
    let e = explain(
        &sources(&store, &rejected, &node, Some(r.snapshot())),
        "10.96.0.10:80/tcp",
    );
    assert_eq!(
        e.service.as_ref().map(ToString::to_string).as_deref(),
        Some("default/web")
    );
    assert_eq!(e.broken, Link::None);
    assert_eq!(e.desired_digest, e.maps_digest);
    assert_eq!(e.desired_digest.len(), 64);
    let empty = socklb::dataplane::maps::MapSnapshot::default();
    let stale = explain(
        &sources(&store, &rejected, &node, Some(&empty)),
        "default/web",
    );
    assert_ne!(stale.desired_digest, stale.maps_digest);
}

/// The maps' side and the desired side are compared as addresses, whatever their text order:
/// `.9` sorts after `.10` as text but before it as a number.
#[test]
fn backends_that_sort_differently_as_text_still_match() {
    for (family, addrs) in [
        (
            "IPv4",
            ["10.244.1.9", "10.244.1.10", "10.244.1.100", "10.244.1.2"],
        ),
        ("IPv6", ["fd00::9", "fd00::10", "fd00::a", "fd00::100"]),
    ] {
        let endpoints = addrs
            .iter()
            .map(|a| format!("{{addresses: [\"{a}\"]}}"))
            .collect::<Vec<_>>()
            .join(", ");
        let service = if family == "IPv6" {
            SERVICE.replace("clusterIP: 10.96.0.10", "clusterIP: fd00:96::10")
        } else {
            SERVICE.to_string()
        };
        let slice = slice("http", &format!("[{endpoints}]"))
            .replace("addressType: IPv4", &format!("addressType: {family}"));
        let (store, rejected) = store(&[&service, &slice]);
        let node = NodeInfo::default();
        let mut r = Reconciler::new(InMemoryMaps::new()).unwrap();
        r.sync_all(&translate_all(&store, &node).0);
        let e = explain(
            &sources(&store, &rejected, &node, Some(r.snapshot())),
            "default/web",
        );
        assert_eq!(e.broken, Link::None, "{family}: {}", e.verdict);
        assert_eq!(e.desired_digest, e.maps_digest, "{family}");
        assert!(e.maps.iter().all(|m| m.matches), "{family}: {:?}", e.maps);
    }
}

/// A Service naming another's ClusterIP as an externalIP gets no frontend there, and explain
/// says who owns the address.
#[test]
fn an_address_owned_by_another_service_is_named() {
    let thief = "apiVersion: v1\nkind: Service\nmetadata: {name: aaa, namespace: aaa, uid: u1, creationTimestamp: \"2020-01-01T00:00:00Z\"}\nspec:\n  clusterIP: 10.96.0.99\n  externalIPs: [10.96.0.10]\n  ports: [{name: http, port: 80}]\n";
    let thief_slice = slice("http", r#"[{addresses: ["10.244.9.9"]}]"#)
        .replace(
            "name: web-1, namespace: default",
            "name: aaa-1, namespace: aaa",
        )
        .replace(
            "kubernetes.io/service-name: web",
            "kubernetes.io/service-name: aaa",
        );
    let (store, rejected) = store(&[
        SERVICE,
        &slice("http", r#"[{addresses: ["10.244.1.1"]}]"#),
        thief,
        &thief_slice,
    ]);
    let node = NodeInfo::default();
    let (desired, _) = translate_all(&store, &node);
    let mut r = Reconciler::new(InMemoryMaps::new()).unwrap();
    r.sync_all(&desired);
    let ownership = socklb::translate::ownership(&store, &node);
    let web = explain(
        &sources(&store, &rejected, &node, Some(r.snapshot())),
        "default/web",
    );
    assert_eq!(
        web.broken,
        Link::None,
        "the ClusterIP stays its own: {}",
        web.verdict
    );
    let e = explain(
        &Sources {
            ownership: Some(&ownership),
            ..sources(&store, &rejected, &node, Some(r.snapshot()))
        },
        "aaa/aaa",
    );
    assert_eq!(e.broken, Link::Ownership, "{}", e.verdict);
    assert!(e.verdict.contains("default/web"), "{}", e.verdict);
    let owners: Vec<_> = e
        .maps
        .iter()
        .filter_map(|m| m.owned_by.as_ref())
        .map(|c| (c.addr.to_string(), c.owner.service.to_string()))
        .collect();
    assert_eq!(
        owners,
        [("10.96.0.10:80/TCP".to_string(), "default/web".to_string())],
        "the frontend another Service owns, and its owner"
    );
}
