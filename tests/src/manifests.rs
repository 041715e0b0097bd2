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

/// What an object's metadata holds beside its name: namespace (`default` when unset), uid,
/// creation time and labels. Every YAML builder of the tests goes through these.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub created: Option<String>,
    pub labels: Vec<(String, String)>,
}

impl Meta {
    #[must_use]
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    #[must_use]
    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    /// `creationTimestamp` (RFC 3339).
    #[must_use]
    pub fn created(mut self, at: &str) -> Self {
        self.created = Some(at.to_string());
        self
    }

    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_string(), value.to_string()));
        self
    }

    /// The `metadata:` block of an object named `name`.
    fn yaml(&self, name: &str) -> String {
        let mut y = format!(
            "metadata:\n  name: {name}\n  namespace: {}\n",
            self.namespace.as_deref().unwrap_or("default")
        );
        if let Some(uid) = &self.uid {
            let _ = writeln!(y, "  uid: \"{uid}\"");
        }
        if let Some(at) = &self.created {
            let _ = writeln!(y, "  creationTimestamp: \"{at}\"");
        }
        if !self.labels.is_empty() {
            y.push_str("  labels:\n");
            for (k, v) in &self.labels {
                let _ = writeln!(y, "    {k}: \"{v}\"");
            }
        }
        y
    }
}

/// A Service: `spec` lines are YAML under `spec:` (indented here), `top` lines go at the top
/// level after it (`status: ...`).
pub fn service_object(name: &str, meta: &Meta, spec: &[&str], top: &[&str]) -> String {
    let mut y = format!("apiVersion: v1\nkind: Service\n{}spec:\n", meta.yaml(name));
    for line in spec {
        let _ = writeln!(y, "  {line}");
    }
    for line in top {
        let _ = writeln!(y, "{line}");
    }
    y
}

/// An EndpointSlice of `service` (its label added to `meta`'s): `ports` is a YAML flow list,
/// each endpoint a YAML flow map; the address family is the first endpoint's (IPv4 when none).
pub fn slice_object(
    name: &str,
    meta: &Meta,
    service: &str,
    ports: &str,
    endpoints: &[String],
) -> String {
    // The first quoted string of an endpoint is its address.
    let family = if endpoints
        .iter()
        .any(|e| e.split('"').nth(1).is_some_and(|ip| ip.contains(':')))
    {
        "IPv6"
    } else {
        "IPv4"
    };
    let meta = meta.clone().label("kubernetes.io/service-name", service);
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n{}addressType: {family}\nports: {ports}\nendpoints:\n",
        meta.yaml(name)
    );
    if endpoints.is_empty() {
        y.push_str("  []\n");
    }
    for e in endpoints {
        let _ = writeln!(y, "  - {e}");
    }
    y
}

impl Ep {
    /// As a YAML flow map.
    pub fn yaml(&self) -> String {
        let mut y = format!(
            "{{addresses: [\"{}\"], conditions: {{ready: {}, serving: {}, terminating: {}}}",
            self.ip, self.ready, self.serving, self.terminating
        );
        if let Some(node) = self.node {
            let _ = write!(y, ", nodeName: {node}");
        }
        y.push('}');
        y
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
    let address_line = format!("clusterIP: \"{cluster_ip}\"");
    let ports = format!(
        "ports: [{{name: {port_name}, protocol: {protocol}, port: {port}, targetPort: {target}}}]"
    );
    let mut spec = vec![address_line.as_str(), ports.as_str()];
    spec.extend(extra_spec);
    service_object(name, &Meta::default(), &spec, &[])
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
    let eps: Vec<String> = endpoints.iter().map(Ep::yaml).collect();
    slice_object(
        name,
        &Meta::default(),
        service,
        &format!("[{{name: {port_name}, protocol: {protocol}, port: {port}}}]"),
        &eps,
    )
}
