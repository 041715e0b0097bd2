//! The deployment as shipped: its arguments are ones the agent accepts, its capabilities cover
//! what the agent keeps, the uninstall path runs `socklb reset` on the agent's pins, and its
//! RBAC only reads.
use std::path::PathBuf;

use clap::Parser as _;
use serde_json::Value;
use socklb::cli::{Cli, Command};

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

/// A container's command line, parsed by the real CLI.
fn parsed(container: &Value) -> Command {
    let mut argv = vec!["socklb".to_string()];
    argv.extend(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string()),
    );
    Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .command
}

fn agent_container() -> Value {
    documents("daemonset.yaml")[0]["spec"]["template"]["spec"]["containers"][0].clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_uninstall_path_resets_the_pins_the_agent_uses() {
    let Command::Agent(agent) = parsed(&agent_container()) else {
        panic!("the DaemonSet runs the agent");
    };
    let docs = documents("uninstall/cleanup.yaml");
    let pod = &docs[0]["spec"]["template"]["spec"];
    let init = &pod["initContainers"];
    assert_eq!(init.as_array().map(Vec::len), Some(1), "one init container");
    let Command::Reset(reset) = parsed(&init[0]) else {
        panic!("the cleanup runs socklb reset: {:?}", init[0]["args"]);
    };
    assert_eq!(
        reset.pins.pin_folder, agent.pins.pin_folder,
        "reset removes the pins the agent made"
    );
    assert!(
        init[0]["command"].is_null(),
        "the image's entrypoint (socklb) runs it"
    );
    // The cleanup reads the host's bpffs where the agent pinned: same host path.
    let host_path = |ds: &Value, volume: &str| {
        ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == volume))
            .map(|v| v["hostPath"]["path"].clone())
    };
    let agent_ds = &documents("daemonset.yaml")[0];
    assert_eq!(host_path(&docs[0], "bpffs"), host_path(agent_ds, "bpffs"));
    assert!(host_path(agent_ds, "bpffs").is_some());
    // It can detach and unpin: the capabilities `socklb reset` uses.
    let added = strings(&init[0]["securityContext"]["capabilities"]["add"]);
    for cap in ["BPF", "NET_ADMIN"] {
        assert!(added.iter().any(|a| a == cap), "{cap} in {added:?}");
    }
}

#[test]
fn the_daemonset_grants_every_capability_the_agent_keeps_and_no_low_port_one() {
    let container = agent_container();
    let caps = &container["securityContext"]["capabilities"];
    assert_eq!(strings(&caps["drop"]), ["ALL"]);
    let added = strings(&caps["add"]);
    for (cap, why) in socklb::agent::CAPABILITIES_KEPT {
        let name = cap.to_string();
        let name = name.strip_prefix("CAP_").unwrap_or(&name);
        assert!(
            added.iter().any(|a| a == name),
            "the agent keeps {cap} ({why}) but the DaemonSet does not grant it: {added:?}"
        );
    }
    assert!(
        container["securityContext"]["privileged"].is_null(),
        "explicit capabilities, not privileged"
    );
    // Both listeners above 1024: no CAP_NET_BIND_SERVICE.
    let Command::Agent(agent) = parsed(&container) else {
        panic!("the DaemonSet runs the agent");
    };
    for listen in [
        &agent.health_listen,
        &agent.metrics_listen,
        &agent.prometheus_listen,
    ] {
        let port: u16 = listen
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("HOST:PORT");
        assert!(port >= 1024, "{listen}");
    }
    assert!(!added.iter().any(|a| a == "NET_BIND_SERVICE"), "{added:?}");
}

/// Prometheus reaches the agent where the `PodMonitor` looks: the container port named `metrics`
/// is the port of `--prometheus-listen` (/metrics alone) on the node's address from the
/// downward API, and the `PodMonitor` selects the DaemonSet's pods. /status and /connections,
/// which name Services and client pods, stay on loopback.
#[test]
fn the_podmonitor_scrapes_metrics_alone_on_the_nodes_address() {
    let ds = &documents("daemonset.yaml")[0];
    let container = agent_container();
    let Command::Agent(agent) = parsed(&container) else {
        panic!("the DaemonSet runs the agent");
    };
    let (host, port) = agent
        .prometheus_listen
        .rsplit_once(':')
        .expect("--prometheus-listen HOST:PORT");
    assert_eq!(host, "$(HOST_IP)", "the node's address");
    let env = container["env"].as_array().expect("env");
    let host_ip = env
        .iter()
        .find(|e| e["name"] == "HOST_IP")
        .expect("HOST_IP in the environment");
    assert_eq!(
        host_ip["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    let named = container["ports"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "metrics"))
        .expect("a container port named metrics");
    assert_eq!(
        named["containerPort"]
            .as_u64()
            .map(|p| p.to_string())
            .as_deref(),
        Some(port)
    );
    assert!(
        agent.metrics_listen.starts_with("127.0.0.1:"),
        "/status and /connections on loopback: {}",
        agent.metrics_listen
    );

    let monitor = &documents("monitoring/podmonitor.yaml")[0];
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        monitor["metadata"]["namespace"], ds["metadata"]["namespace"],
        "the PodMonitor looks in the DaemonSet's namespace"
    );
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            &labels[k], v,
            "the PodMonitor's selector {k} matches the pods"
        );
    }
}
