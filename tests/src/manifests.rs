//! Kubernetes YAML for tests and the demo, built from a few parameters.
use std::{fmt::Write as _, net::IpAddr};

/// One endpoint of a slice with its conditions.
#[derive(Clone, Debug)]
pub struct Ep {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node: Option<&'static str>,
}

impl Ep {
    pub fn ready(ip: &str) -> Self {
        Self {
            ip: ip.parse().expect("endpoint IP"),
            ready: true,
            serving: true,
            terminating: false,
            node: None,
        }
    }

    /// Shutting down: not ready, terminating, and serving or not.
    pub fn terminating(ip: &str, serving: bool) -> Self {
        Self {
            ready: false,
            serving,
            terminating: true,
            ..Self::ready(ip)
        }
    }

    #[must_use]
    pub fn on(mut self, node: &'static str) -> Self {
        self.node = Some(node);
        self
    }
}

/// A ClusterIP Service with one port named `port_name`. `extra_spec` is YAML added to `spec`
/// (indented by four spaces), e.g. `"sessionAffinity: ClientIP"`.
pub fn service(
    name: &str,
    cluster_ip: &str,
    port_name: &str,
    protocol: &str,
    port: u16,
    target: &str,
    extra_spec: &[&str],
) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  clusterIP: \"{cluster_ip}\"\n  ports:\n    - name: {port_name}\n      protocol: {protocol}\n      port: {port}\n      targetPort: {target}\n"
    );
    for line in extra_spec {
        let _ = writeln!(y, "  {line}");
    }
    y
}

/// An EndpointSlice for `service` whose port `port_name` is `port`.
pub fn slice(
    name: &str,
    service: &str,
    port_name: &str,
    protocol: &str,
    port: u16,
    endpoints: &[Ep],
) -> String {
    let family = match endpoints.first().map(|e| e.ip) {
        Some(IpAddr::V6(_)) => "IPv6",
        _ => "IPv4",
    };
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: {family}\nports:\n  - name: {port_name}\n    protocol: {protocol}\n    port: {port}\nendpoints:\n"
    );
    if endpoints.is_empty() {
        y.push_str("  []\n");
    }
    for e in endpoints {
        let _ = write!(
            y,
            "  - addresses: [\"{}\"]\n    conditions: {{ready: {}, serving: {}, terminating: {}}}\n",
            e.ip, e.ready, e.serving, e.terminating
        );
        if let Some(node) = e.node {
            let _ = writeln!(y, "    nodeName: {node}");
        }
    }
    y
}
