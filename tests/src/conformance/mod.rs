//! The Kubernetes conformance suite: kube-proxy's own expectations (its unit tests, its
//! proxier tests, the e2e tests), re-expressed as data a socket on this node can observe, and
//! run twice: through the translation and reconciler into in-memory maps (no privileges), and
//! end to end in a sandbox with real sockets (`tests/tests/conformance.rs`).
//!
//! Each case names its origin. An expectation is what a client on this node gets when it
//! connects to an address: the set of backends that answer, a refusal, or no translation at
//! all. Where socklb differs from kube-proxy on purpose, the case says so in `note` and the
//! README's compatibility table explains why.
mod cases;
pub mod run;

pub use cases::CASES;

/// One case of the suite.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Unique, short, kebab-case: the test's name.
    pub name: &'static str,
    /// Where kube-proxy states the expectation: file, test function and case name (or the
    /// source function for rules that no test names).
    pub origin: &'static str,
    /// This node's identity (its name is always `node-a`).
    pub node: Node,
    /// Kubernetes YAML (Services and EndpointSlices, any namespaces), documents separated by
    /// `---`. Addresses must not collide with other cases of the same `node`.
    pub objects: &'static str,
    /// What a client on this node gets at each address (`ADDR:PORT/TCP` or `/UDP`).
    pub expect: &'static [(&'static str, Outcome)],
    /// Where socklb differs from kube-proxy on purpose (empty: it does not).
    pub note: &'static str,
}

/// Who this node is, as the agent's flags say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    /// `topology.kubernetes.io/zone` (`None`: the label is absent).
    pub zone: Option<&'static str>,
    /// The node's addresses, on which NodePorts are served.
    pub addresses: &'static [&'static str],
}

/// The node most cases use: `node-a` in `zone-a`, address 192.0.2.10.
pub const NODE_A: Node = Node {
    zone: Some("zone-a"),
    addresses: &["192.0.2.10"],
};

/// `node-a` without a zone label.
pub const NODE_NO_ZONE: Node = Node {
    zone: None,
    addresses: &["192.0.2.10"],
};

/// `node-a` whose zone label is present but empty (kube-proxy keeps it as "", which no hint
/// names).
pub const NODE_EMPTY_ZONE: Node = Node {
    zone: Some(""),
    addresses: &["192.0.2.10"],
};

/// `node-a` in `zone-a` with two IPv4 addresses and one IPv6 address, for NodePorts on every
/// address of both families.
pub const NODE_DUAL_STACK: Node = Node {
    zone: Some("zone-a"),
    addresses: &["192.0.2.10", "198.51.100.10", "2001:db8::10"],
};

/// What a connect to an address gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Connects reach these backends (`IP:PORT`), each of them, and no other.
    Backends(&'static [&'static str]),
    /// Refused at once (ECONNREFUSED): no usable endpoint (kube-proxy: REJECT).
    Refused,
    /// Refused at once (ECONNREFUSED): internalTrafficPolicy Local and no usable endpoint on
    /// this node while others exist (kube-proxy: DROP, a timeout; socklb refuses on purpose).
    RefusedNoLocal,
    /// Not a service address for socklb: the connect is left alone (in the sandbox it gets
    /// ENETUNREACH, as no route leads there).
    Untouched,
}
