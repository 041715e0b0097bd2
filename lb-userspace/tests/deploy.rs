//! The deployment as shipped: its arguments are ones the agent accepts, and its RBAC only reads.
use std::path::PathBuf;

use clap::Parser as _;
use serde_json::Value;
use socklb::cli::Cli;

fn documents(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("deploy file");
    serde_saphyr::from_multiple(&text).expect("YAML")
}

#[test]
fn the_daemonset_runs_the_agent_with_arguments_it_accepts() {
    let ds = &documents("daemonset.yaml")[0];
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let mut argv = vec!["socklb".to_string()];
    argv.extend(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string()),
    );
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(matches!(cli.command, socklb::cli::Command::Agent(_)));
    assert_eq!(
        container["env"][0]["name"], "NODE_NAME",
        "node identity from the downward API"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["host"], "127.0.0.1");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
}

#[test]
fn rbac_only_reads_services_endpointslices_and_nodes() {
    let docs = documents("rbac.yaml");
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("ClusterRole");
    let mut seen = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"], "read-only verbs");
        seen.extend(
            rule["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .filter_map(Value::as_str),
        );
    }
    seen.sort_unstable();
    assert_eq!(seen, ["endpointslices", "nodes", "services"]);
}
