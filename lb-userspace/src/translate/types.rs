//! The desired state: what the maps should hold, as plain tables keyed in Kubernetes terms.
use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::{
    model::TargetRef,
    vec_set::VecSet,
    vocab::{ObjectKey, ServiceAddr, ServicePortKey},
};

/// How a Service claims an address: its ClusterIP (allocated and made unique by the API server)
/// or an address anyone who can write a Service may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl ClaimKind {
    /// Which kind of claim wins an address several Services claim, before age decides: the
    /// addresses the cluster allocates (ClusterIP by the API server, NodePorts on this node's
    /// own addresses, load-balancer ingress by a controller) before an address a user typed
    /// (externalIPs). Lower wins.
    pub const fn precedence(self) -> u8 {
        match self {
            Self::ClusterIp => 0,
            Self::NodePort => 1,
            Self::LoadBalancer => 2,
            Self::ExternalIp => 3,
        }
    }
}

impl fmt::Display for ClaimKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ClusterIp => "clusterIP",
            Self::NodePort => "nodePort",
            Self::ExternalIp => "externalIP",
            Self::LoadBalancer => "loadBalancer ingress",
        })
    }
}

/// One address a backend set wants to serve, and how it came by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FrontendClaim {
    pub addr: ServiceAddr,
    pub kind: ClaimKind,
}

/// Who wins between two claims of one kind on one address, and who gets capacity first: the
/// older Service, then the smaller uid. Nothing a Service author chooses (its name, its
/// namespace) decides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Seniority {
    /// `creationTimestamp` in seconds; `None` sorts last.
    pub created: Option<i64>,
    pub uid: Arc<str>,
}

impl Seniority {
    /// The ordering key of a claim: its kind's precedence, then age, then uid.
    pub fn rank(&self, kind: ClaimKind) -> (u8, i64, Arc<str>) {
        (
            kind.precedence(),
            self.created.unwrap_or(i64::MAX),
            Arc::clone(&self.uid),
        )
    }

    /// The order capacity is handed out in: the oldest Service first, then the smaller uid.
    pub fn age(&self) -> (i64, &str) {
        (self.created.unwrap_or(i64::MAX), &self.uid)
    }
}

/// What the maps should hold for one `ServicePortKey`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredService {
    /// The Service port number (kept in the maps' metadata for inspect).
    pub port: u16,
    /// Every address this backend set claims (before ownership between Services is decided).
    pub frontends: VecSet<FrontendClaim>,
    /// In canonical (numeric) order, without duplicates. Empty means connects are refused.
    pub backends: Vec<SocketAddr>,
    /// sessionAffinity ClientIP timeout.
    pub affinity_timeout_s: Option<u32>,
    /// `backends` is empty only because this node has no usable endpoint under
    /// internalTrafficPolicy Local (others have some).
    pub no_local_endpoint: bool,
    /// UDP: every serving endpoint of the port, whatever policy or topology chose; a connected
    /// UDP socket is terminated only when its backend leaves this set (as kube-proxy clears
    /// conntrack entries).
    pub serving: Vec<SocketAddr>,
    pub seniority: Seniority,
}

/// The desired state for every service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<ServicePortKey, DesiredService>,
}

/// Why an endpoint is a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Candidacy {
    /// `ready` (or absent).
    Ready,
    /// No endpoint of the set was ready, and this one is serving and terminating (KEP-1669).
    ServingTerminating,
}

/// Why an endpoint is not a candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Exclusion {
    /// Neither ready nor (serving and terminating).
    NotReady,
    /// Terminating: not a candidate while others are ready, nor when it stopped serving.
    Terminating {
        still_serving: bool,
    },
    /// internalTrafficPolicy Local keeps this node's endpoints only.
    OtherNode {
        node: Option<Arc<str>>,
    },
    OtherZone {
        hints: Vec<String>,
    },
    /// Hinted for other nodes (hints.forNodes, trafficDistribution PreferSameNode).
    HintedForOtherNode {
        hints: Vec<String>,
    },
    PortNameMissing {
        port_name: Arc<str>,
        protocol: String,
    },
    WrongFamily {
        address_type: String,
    },
    Duplicate {
        slice: Arc<str>,
    },
}

impl Exclusion {
    /// A stable short code, for tables and JSON.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotReady => "not-ready",
            Self::Terminating { .. } => "terminating",
            Self::OtherNode { .. } | Self::HintedForOtherNode { .. } => "other-node",
            Self::OtherZone { .. } => "other-zone",
            Self::PortNameMissing { .. } => "port-name-missing",
            Self::WrongFamily { .. } => "wrong-family",
            Self::Duplicate { .. } => "duplicate",
        }
    }
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotReady => f.write_str("not ready, and not serving while terminating"),
            Self::Terminating {
                still_serving: true,
            } => f.write_str("terminating while other endpoints are ready"),
            Self::Terminating {
                still_serving: false,
            } => f.write_str("terminating and no longer serving"),
            Self::OtherNode { node } => write!(
                f,
                "on node {}, and internalTrafficPolicy Local keeps this node's endpoints only",
                node.as_deref().unwrap_or("<none>")
            ),
            Self::OtherZone { hints } => write!(f, "hinted for zone(s) {}", hints.join(",")),
            Self::HintedForOtherNode { hints } => {
                write!(f, "hinted for node(s) {}", hints.join(","))
            }
            Self::PortNameMissing {
                port_name,
                protocol,
            } => write!(
                f,
                "its slice has no {protocol} port named {port_name:?} (the Service port's name)"
            ),
            Self::WrongFamily { address_type } => {
                write!(f, "its slice's addressType is {address_type}")
            }
            Self::Duplicate { slice } => {
                write!(f, "same address and port already taken from {slice}")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "verdict")]
pub enum Verdict {
    Candidate { why: Candidacy },
    Excluded(Exclusion),
}

/// One endpoint of one slice, as seen for one backend set, with the verdict and its reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointDecision {
    pub slice: Arc<str>,
    pub address: Option<IpAddr>,
    /// The target port this slice gives for the Service port, if it has one.
    pub port: Option<u16>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub target: Option<TargetRef>,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl EndpointDecision {
    pub fn is_candidate(&self) -> bool {
        matches!(self.verdict, Verdict::Candidate { .. })
    }
}

/// Which kube-proxy rule decided a backend set's contents, for explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Ready endpoints, cluster-wide.
    Ready,
    /// Ready endpoints hinted for this zone (hints.forZones).
    ZoneHints,
    /// Ready endpoints hinted for this node (hints.forNodes).
    NodeHints,
    /// Nothing ready: the serving and terminating endpoints (KEP-1669).
    TerminatingFallback,
    /// internalTrafficPolicy Local: this node's ready endpoints.
    LocalReady,
    /// internalTrafficPolicy Local: nothing ready here, this node's serving and terminating ones.
    LocalTerminatingFallback,
    /// No usable endpoint: connects are refused.
    NoEndpoint,
    /// internalTrafficPolicy Local and no usable endpoint on this node (there are some
    /// elsewhere): refused at once, where kube-proxy drops.
    NoLocalEndpoint,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ready => "ready endpoints (kube-proxy CategorizeEndpoints)",
            Self::ZoneHints => "ready endpoints hinted for this node's zone (topology hints)",
            Self::NodeHints => "ready endpoints hinted for this node (PreferSameNode)",
            Self::TerminatingFallback => {
                "no endpoint is ready: serving terminating endpoints (KEP-1669)"
            }
            Self::LocalReady => "internalTrafficPolicy Local: this node's ready endpoints",
            Self::LocalTerminatingFallback => {
                "internalTrafficPolicy Local: nothing ready here, this node's serving terminating endpoints"
            }
            Self::NoEndpoint => "no usable endpoint: connects are refused (kube-proxy REJECT)",
            Self::NoLocalEndpoint => {
                "internalTrafficPolicy Local and no usable endpoint on this node: refused at once (kube-proxy drops)"
            }
        })
    }
}

/// One backend set of a Service: its desired state and how it was derived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortTranslation {
    pub key: ServicePortKey,
    pub desired: DesiredService,
    /// The Service's targetPort as written (number or name); empty in `Detail::Lean`.
    pub target_port: String,
    pub rule: Rule,
    pub endpoints: Vec<EndpointDecision>,
}

/// Everything one Service produces, or why it produces nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceTranslation {
    pub service: ObjectKey,
    pub resource_version: String,
    /// Set when the Service produces no frontend at all (headless, ExternalName, ...).
    pub skipped: Option<String>,
    pub ports: Vec<PortTranslation>,
    /// Things worth a warning that do not stop the rest (an SCTP port, ...).
    pub notes: Vec<String>,
    /// Addresses the Service names that are never a frontend, with the field naming them.
    #[serde(default)]
    pub refused: Vec<Refusal>,
}

/// Why an address is never a service frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecialAddress {
    /// `127.0.0.0/8`, `::1`: every pod's own loopback (its admin port, a sidecar).
    Loopback,
    /// `0.0.0.0`, `::`.
    Unspecified,
    /// `169.254.0.0/16`, `fe80::/10`: the cloud metadata service, link-local peers.
    LinkLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `0.0.0.0/8` ("this network", RFC 1122) other than `0.0.0.0` itself.
    ThisNetwork,
    /// `240.0.0.0/4` (reserved, RFC 1112) other than the broadcast address.
    Reserved,
    /// A cloud provider's metadata or DNS service, which pods reach at the same address on
    /// every node: AWS's `fd00:ec2::254` (metadata) and `fd00:ec2::253` (DNS), Google's
    /// `fd20:ce::254` (metadata), Alibaba's `100.100.100.200` (metadata), Azure's
    /// `168.63.129.16` (Azure's host agent endpoint and DNS). (The IPv4 metadata address `169.254.169.254` is
    /// link-local.)
    CloudService,
    /// One of this node's addresses (its Node object's, or bound on it) where a process on the
    /// node listens on that port: the node's own services, a node-local DNS cache. Only
    /// NodePorts are translated there.
    ThisNode,
}

/// The cloud providers' metadata and DNS services outside link-local ranges (see
/// `SpecialAddress::CloudService`).
pub(super) const CLOUD_SERVICES: [IpAddr; 5] = [
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x253)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(std::net::Ipv4Addr::new(168, 63, 129, 16)),
];

impl SpecialAddress {
    /// The special range `ip` is in, if any (this node's addresses aside).
    pub fn of(ip: IpAddr) -> Option<Self> {
        if CLOUD_SERVICES.contains(&ip) {
            return Some(Self::CloudService);
        }
        match ip {
            IpAddr::V4(v4) => {
                if v4.is_loopback() {
                    Some(Self::Loopback)
                } else if v4.is_unspecified() {
                    Some(Self::Unspecified)
                } else if v4.is_link_local() {
                    Some(Self::LinkLocal)
                } else if v4.is_multicast() {
                    Some(Self::Multicast)
                } else if v4.is_broadcast() {
                    Some(Self::Broadcast)
                } else if v4.octets()[0] == 0 {
                    Some(Self::ThisNetwork)
                } else if v4.octets()[0] >= 240 {
                    Some(Self::Reserved)
                } else {
                    None
                }
            }
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return Self::of(IpAddr::V4(v4));
                }
                if v6.is_loopback() {
                    Some(Self::Loopback)
                } else if v6.is_unspecified() {
                    Some(Self::Unspecified)
                } else if v6.is_unicast_link_local() {
                    Some(Self::LinkLocal)
                } else if v6.is_multicast() {
                    Some(Self::Multicast)
                } else {
                    None
                }
            }
        }
    }
}

impl fmt::Display for SpecialAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Loopback => "a loopback address: every pod's own",
            Self::Unspecified => "the unspecified address",
            Self::LinkLocal => "a link-local address (the cloud metadata service lives there)",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::ThisNetwork => "in 0.0.0.0/8 (\"this network\")",
            Self::Reserved => "in 240.0.0.0/4 (reserved)",
            Self::CloudService => {
                "a cloud provider's metadata or DNS service, which every pod reaches at that address"
            }
            Self::ThisNode => {
                "one of this node's own addresses, where a process on the node listens on that port (only NodePorts are translated there)"
            }
        })
    }
}

/// An address a Service names that socklb never makes a frontend.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Refusal {
    pub addr: IpAddr,
    /// The field that names it: `spec.clusterIPs`, `spec.externalIPs`,
    /// `status.loadBalancer.ingress`, or `nodePort` (a node address given by flag).
    pub field: String,
    pub why: SpecialAddress,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} is never a frontend: it is {}",
            self.field, self.addr, self.why
        )
    }
}

#[cfg(test)]
mod special_address_tests {
    use std::net::IpAddr;

    use super::SpecialAddress;

    fn of(ip: &str) -> Option<SpecialAddress> {
        SpecialAddress::of(ip.parse::<IpAddr>().expect("an address"))
    }

    /// One address (or a few) of each kind, the edges of each range, and addresses just
    /// outside them.
    #[test]
    fn every_kind_of_special_address_and_its_edges() {
        use SpecialAddress::*;
        for (ip, kind) in [
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("::1", Some(Loopback)),
            ("0.0.0.0", Some(Unspecified)),
            ("::", Some(Unspecified)),
            ("0.0.0.1", Some(ThisNetwork)),
            ("0.255.255.255", Some(ThisNetwork)),
            ("1.0.0.0", None),
            ("169.254.169.254", Some(LinkLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("224.0.0.1", Some(Multicast)),
            ("ff02::1", Some(Multicast)),
            ("239.255.255.255", Some(Multicast)),
            ("240.0.0.0", Some(Reserved)),
            ("255.255.255.254", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("fd00:ec2::254", Some(CloudService)),
            ("fd00:ec2::253", Some(CloudService)),
            ("fd20:ce::254", Some(CloudService)),
            ("100.100.100.200", Some(CloudService)),
            ("168.63.129.16", Some(CloudService)),
            ("168.63.129.17", None),
            ("fd00:ec2::255", None),
            ("100.100.100.201", None),
            ("::ffff:168.63.129.16", Some(CloudService)),
            ("::ffff:240.0.0.1", Some(Reserved)),
            ("10.96.0.1", None),
            ("fd00::1", None),
        ] {
            assert_eq!(of(ip), kind, "{ip}");
        }
    }
}
