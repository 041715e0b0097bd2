//! Arbitrary bytes as a manifests file: parsing, validation, translation and reconciliation
//! must never panic, and the maps must stay consistent after every write. Then the same bytes as
//! one document between two good ones: whatever they hold, the good ones still load (a broken
//! document loses only itself).
#![no_main]

use socklb::model::{ManifestObject, parse_manifests};

const FIRST: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: first, namespace: default}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
const LAST: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: last, namespace: default}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n";

fn name(object: &ManifestObject) -> &str {
    match object {
        ManifestObject::Service(s) => &s.key.name,
        ManifestObject::EndpointSlice(s) => &s.key.name,
        ManifestObject::Node(n) => &n.name,
    }
}

fn documents_around_it_survive(data: &[u8]) {
    // Lines starting with `%` are directives of the next document: they may break it, by YAML's
    // rules, so they are left out here.
    let middle: String = String::from_utf8_lossy(data)
        .lines()
        .filter(|l| !l.starts_with('%'))
        .flat_map(|l| [l, "\n"])
        .collect();
    let text = format!("{FIRST}---\n{middle}---\n{LAST}");
    let parsed = parse_manifests("fuzz", text.as_bytes());
    assert_eq!(parsed.objects.first().map(name), Some("first"), "{text:?}");
    assert_eq!(parsed.objects.last().map(name), Some("last"), "{text:?}");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    socklb::fuzzing::manifests(data);
    documents_around_it_survive(data);
});
