//! The words every layer speaks: which object, which service address, which backend set, which
//! kind of error. Typed values compare, sort and key maps; they become strings only at the edges
//! (CLI, JSON, metrics, logs) through `Display`.
//!
//! This module depends on nothing else in the crate, so every layer can use it.
use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
};

use serde::{Deserialize, Serialize};

/// The Kubernetes kinds socklb reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
        })
    }
}

/// `namespace/name` of a namespaced object. Shared strings: the agent keeps a Service's key in
/// several indexes, and a clone is a reference count, not an allocation. Namespaces are
/// interned where objects are read, so keys of one namespace compare it by pointer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// Equality of shared strings: the same allocation is equal without reading it.
fn shared_eq(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

/// Order of shared strings (as `str`), without reading them when they are one allocation.
fn shared_cmp(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
    if Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        a.cmp(b)
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        shared_eq(&self.namespace, &other.namespace) && shared_eq(&self.name, &other.name)
    }
}

impl Eq for ObjectKey {}

/// By content, as equality compares (a pointer is only its shortcut).
impl std::hash::Hash for ObjectKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.namespace.hash(state);
        self.name.hash(state);
    }
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        shared_cmp(&self.namespace, &other.namespace)
            .then_with(|| shared_cmp(&self.name, &other.name))
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl ObjectKey {
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name`, or a bare name in `default` (CLI input).
    pub fn parse(s: &str) -> Self {
        match s.split_once('/') {
            Some((ns, name)) => Self::new(ns, name),
            None => Self::new("default", s),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One object: its kind and key. `Display` gives `Kind namespace/name` (`Node name` for Nodes).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectRef {
    pub kind: Kind,
    pub key: ObjectKey,
}

impl ObjectRef {
    pub fn new(kind: Kind, key: ObjectKey) -> Self {
        Self { kind, key }
    }

    pub fn service(key: ObjectKey) -> Self {
        Self::new(Kind::Service, key)
    }

    pub fn slice(key: ObjectKey) -> Self {
        Self::new(Kind::EndpointSlice, key)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Node => write!(f, "Node {}", self.key.name),
            kind => write!(f, "{kind} {}", self.key),
        }
    }
}

/// What a rejection is about: an object, or a manifest file that could not be read whole.
/// `Display` gives `Kind namespace/name` or `file PATH`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Subject {
    Object(ObjectRef),
    File(PathBuf),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Object(o) => o.fmt(f),
            Self::File(p) => write!(f, "file {}", p.display()),
        }
    }
}

/// The transport protocols socklb translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// Parses "TCP"/"tcp", as Kubernetes and the CLI write it.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            _ => None,
        }
    }

    /// The lowercase name, as nftables and most tools write it.
    pub const fn lower(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        })
    }
}

/// A socket on this node (its network namespace: the host's) that receives what is sent to an
/// address and port: a TCP listener, or a UDP socket bound and not connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Listener {
    /// The address it is bound to; `None`: every address (`0.0.0.0`, `::`).
    pub addr: Option<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
}

impl Listener {
    /// Whether it receives what is sent to `addr`:`port` over `protocol`: bound to that address,
    /// or (with `wildcard`) to every address.
    pub fn receives(&self, addr: IpAddr, port: u16, protocol: Protocol, wildcard: bool) -> bool {
        self.port == port
            && self.protocol == protocol
            && match self.addr {
                Some(a) => a == addr,
                None => wildcard,
            }
    }
}

/// IPv4 or IPv6, as Kubernetes names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    IPv4,
    IPv6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::IPv4 } else { Self::IPv6 }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::IPv4 => "IPv4",
            Self::IPv6 => "IPv6",
        })
    }
}

/// A service address with its protocol: where a client connects (`10.96.0.10:53/UDP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceAddr {
    pub addr: SocketAddr,
    pub protocol: Protocol,
}

impl ServiceAddr {
    pub fn new(ip: IpAddr, port: u16, protocol: Protocol) -> Self {
        Self {
            addr: SocketAddr::new(ip, port),
            protocol,
        }
    }

    pub fn family(&self) -> Family {
        Family::of(self.addr.ip())
    }

    /// Parses `ADDR:PORT[/tcp|udp]` (IPv6 as `[ADDR]:PORT`); TCP when no protocol is given.
    pub fn parse(target: &str) -> Result<Self, AddrParseError> {
        let (addr, protocol) = match target.rsplit_once('/') {
            Some((a, p)) => (
                a,
                Protocol::parse(p).ok_or_else(|| AddrParseError::Protocol(p.to_string()))?,
            ),
            None => (target, Protocol::Tcp),
        };
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| AddrParseError::Address(addr.to_string()))?;
        Ok(Self::new(addr.ip(), addr.port(), protocol))
    }
}

impl fmt::Display for ServiceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.protocol)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddrParseError {
    #[error("{0:?} is not tcp or udp")]
    Protocol(String),
    #[error("{0:?} is not ADDR:PORT (IPv6: [ADDR]:PORT)")]
    Address(String),
}

/// Which endpoints a backend set holds: the cluster-wide ones, or only this node's
/// (internalTrafficPolicy Local, for the ClusterIP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Cluster,
    Local,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cluster => "cluster",
            Self::Local => "local",
        })
    }
}

/// One backend set: a Service port, in one family, for one scope. It owns a service id in the
/// maps, and every frontend of it shares its backends.
///
/// Shared, with its hash computed once: the reconciler's, the ownership's and the engine's
/// tables each hold every key (tens of thousands), so a key there is one pointer, a clone is a
/// reference count, and hashing or telling two keys apart reads no name. Its fields are read
/// through `Deref` ([`ServicePortKeyFields`]).
#[derive(Clone)]
pub struct ServicePortKey(Arc<HashedKey>);

struct HashedKey {
    fields: ServicePortKeyFields,
    /// `fields` hashed with the process's one seed (random, so a tenant choosing Service names
    /// cannot pick colliding keys ahead of time).
    hash: u64,
}

/// A process-wide seed: equal keys hash equal in every table.
static KEY_HASHER: std::sync::LazyLock<foldhash::fast::RandomState> =
    std::sync::LazyLock::new(foldhash::fast::RandomState::default);

impl From<ServicePortKeyFields> for ServicePortKey {
    fn from(fields: ServicePortKeyFields) -> Self {
        use std::hash::BuildHasher;
        let hash = KEY_HASHER.hash_one(&fields);
        Self(Arc::new(HashedKey { fields, hash }))
    }
}

impl std::ops::Deref for ServicePortKey {
    type Target = ServicePortKeyFields;
    fn deref(&self) -> &ServicePortKeyFields {
        &self.0.fields
    }
}

impl PartialEq for ServicePortKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.0.hash == other.0.hash && **self == **other)
    }
}

impl Eq for ServicePortKey {}

impl std::hash::Hash for ServicePortKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl Ord for ServicePortKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            std::cmp::Ordering::Equal
        } else {
            (**self).cmp(&**other)
        }
    }
}

impl PartialOrd for ServicePortKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServicePortKey")
            .field("service", &self.service)
            .field("port_name", &self.port_name)
            .field("protocol", &self.protocol)
            .field("family", &self.family)
            .field("scope", &self.scope)
            .finish()
    }
}

impl Serialize for ServicePortKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ServicePortKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ServicePortKeyFields::deserialize(deserializer).map(Self::from)
    }
}

impl fmt::Display for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// What a [`ServicePortKey`] names.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServicePortKeyFields {
    pub service: ObjectKey,
    /// The port's name, or its number when the Service's only port is unnamed.
    pub port_name: Arc<str>,
    pub protocol: Protocol,
    pub family: Family,
    pub scope: Scope,
}

impl PartialEq for ServicePortKeyFields {
    fn eq(&self, other: &Self) -> bool {
        self.service == other.service
            && shared_eq(&self.port_name, &other.port_name)
            && self.protocol == other.protocol
            && self.family == other.family
            && self.scope == other.scope
    }
}

impl Eq for ServicePortKeyFields {}

impl std::hash::Hash for ServicePortKeyFields {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.service.hash(state);
        self.port_name.hash(state);
        self.protocol.hash(state);
        self.family.hash(state);
        self.scope.hash(state);
    }
}

/// Field by field, as the fields are declared (what a derived order would be).
impl Ord for ServicePortKeyFields {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.service
            .cmp(&other.service)
            .then_with(|| shared_cmp(&self.port_name, &other.port_name))
            .then_with(|| self.protocol.cmp(&other.protocol))
            .then_with(|| self.family.cmp(&other.family))
            .then_with(|| self.scope.cmp(&other.scope))
    }
}

impl PartialOrd for ServicePortKeyFields {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ServicePortKeyFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}/{} {} {}",
            self.service, self.port_name, self.protocol, self.family, self.scope
        )
    }
}

/// What went wrong, as a closed set: metrics label errors with `metric_label`, never with
/// message text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ErrorKind {
    /// A map had no room (a full hash map, or no free range in the backend array).
    MapFull,
    /// A map write failed for another reason.
    MapWrite,
    /// A write failed on purpose (tests).
    Injected,
    /// Undoing a failed change failed too.
    Rollback,
    /// A service address claimed by another service that owns it.
    AddressConflict,
    /// Terminating stale connected UDP sockets failed.
    UdpTerminate,
    /// A watch or a manifests folder read failed.
    Source,
    /// An object was rejected by validation.
    Rejected,
    /// Recounting the socket records per client failed.
    Recount,
}

impl ErrorKind {
    pub const ALL: [Self; 9] = [
        Self::MapFull,
        Self::MapWrite,
        Self::Injected,
        Self::Rollback,
        Self::AddressConflict,
        Self::UdpTerminate,
        Self::Source,
        Self::Rejected,
        Self::Recount,
    ];

    /// The `kind` label of `socklb_errors_total`.
    pub const fn metric_label(self) -> &'static str {
        match self {
            Self::MapFull => "map_full",
            Self::MapWrite => "map_write",
            Self::Injected => "injected",
            Self::Rollback => "rollback",
            Self::AddressConflict => "address_conflict",
            Self::UdpTerminate => "udp_terminate",
            Self::Source => "source",
            Self::Rejected => "rejected",
            Self::Recount => "recount",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.metric_label())
    }
}

/// Sorts addresses in the one canonical order everything compares and digests in: numeric
/// (IPv4 before IPv6, then address, then port), never text order.
pub fn canonical(addrs: &mut [SocketAddr]) {
    addrs.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys order and compare as their (namespace, name) strings, whether or not they share
    /// allocations, and equal keys hash alike.
    #[test]
    fn object_keys_compare_by_content() {
        use std::hash::BuildHasher as _;
        let shared: Arc<str> = Arc::from("team-a");
        let names = ["a", "a", "c", "b"];
        let mut keys: Vec<ObjectKey> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let ns = if i % 2 == 0 {
                    Arc::clone(&shared)
                } else {
                    Arc::from("team-a")
                };
                ObjectKey::new(ns, *n)
            })
            .collect();
        keys.push(ObjectKey::new("team-0", "z"));
        keys.sort();
        let text: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            ["team-0/z", "team-a/a", "team-a/a", "team-a/b", "team-a/c"]
        );
        assert_eq!(keys[1], keys[2]);
        let h = std::collections::hash_map::RandomState::new();
        assert_eq!(h.hash_one(&keys[1]), h.hash_one(&keys[2]));
        assert_ne!(keys[1], keys[3]);
    }

    /// Backend set keys built apart (from the translation and from the maps' metadata, say)
    /// are equal, hash alike in any table and order by their fields, as one shared copy does;
    /// their JSON is their fields'.
    #[test]
    fn service_port_keys_compare_by_content_whether_shared_or_not() {
        use std::hash::BuildHasher as _;
        let key = |name: &str, port: &str, scope: Scope| {
            ServicePortKey::from(ServicePortKeyFields {
                service: ObjectKey::new("team-a", name),
                port_name: port.into(),
                protocol: Protocol::Tcp,
                family: Family::IPv4,
                scope,
            })
        };
        let a = key("web", "http", Scope::Cluster);
        let b = key("web", "http", Scope::Cluster);
        assert_eq!(a, b);
        assert_eq!(a.clone(), a);
        let h = foldhash::fast::RandomState::default();
        assert_eq!(h.hash_one(&a), h.hash_one(&b));
        let mut keys = [
            key("web", "metrics", Scope::Cluster),
            key("web", "http", Scope::Local),
            key("api", "http", Scope::Cluster),
            a.clone(),
        ];
        keys.sort();
        let text: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "team-a/api:http/TCP IPv4 cluster",
                "team-a/web:http/TCP IPv4 cluster",
                "team-a/web:http/TCP IPv4 local",
                "team-a/web:metrics/TCP IPv4 cluster",
            ]
        );
        assert_ne!(a, key("web", "http", Scope::Local));
        assert_ne!(a, key("web", "https", Scope::Cluster));
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json, serde_json::to_value(&*a).unwrap());
        assert_eq!(json["port_name"], "http");
        assert_eq!(serde_json::from_value::<ServicePortKey>(json).unwrap(), a);
    }

    #[test]
    fn service_addresses_parse_and_print() {
        let a = ServiceAddr::parse("10.96.0.10:53/udp").unwrap();
        assert_eq!(a.to_string(), "10.96.0.10:53/UDP");
        assert_eq!(
            ServiceAddr::parse("[fd00::1]:80").unwrap().family(),
            Family::IPv6
        );
        assert!(ServiceAddr::parse("10.96.0.10:53/sctp").is_err());
        assert!(ServiceAddr::parse("10.96.0.10").is_err());
    }

    #[test]
    fn object_refs_read_as_humans_write_them() {
        let r = ObjectRef::service(ObjectKey::new("kube-system", "dns"));
        assert_eq!(r.to_string(), "Service kube-system/dns");
        let n = ObjectRef::new(Kind::Node, ObjectKey::new("", "node-a"));
        assert_eq!(n.to_string(), "Node node-a");
    }

    #[test]
    fn canonical_order_is_numeric() {
        let mut v: Vec<SocketAddr> = ["10.0.0.10:80", "10.0.0.9:80", "[::1]:80", "10.0.0.9:8"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        canonical(&mut v);
        let text: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            ["10.0.0.9:8", "10.0.0.9:80", "10.0.0.10:80", "[::1]:80"]
        );
    }
}
