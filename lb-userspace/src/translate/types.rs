//! The desired state: what the maps should hold, as plain tables keyed in Kubernetes terms.
use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;

use crate::{
    dataplane::abi::{Family, Frontend, Protocol},
    model::ObjectKey,
    vec_set::VecSet,
};

/// Which clients a backend set serves: pods dialling the cluster IP, or traffic to the node's
/// ports and external addresses (where externalTrafficPolicy applies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Internal,
    External,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Internal => "internal",
            Self::External => "external",
        })
    }
}

/// One backend set: a Service port, in one family, for one scope. It owns a service id in the
/// maps, and every frontend of it shares its slots.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServicePortKey {
    pub service: ObjectKey,
    /// The port's name, or its number when the Service's only port is unnamed.
    pub port_name: String,
    pub protocol: Protocol,
    pub family: Family,
    pub scope: Scope,
}

impl fmt::Display for ServicePortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}/{} {} {}",
            self.service, self.port_name, self.protocol, self.family, self.scope
        )
    }
}

/// What the maps should hold for one `ServicePortKey`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DesiredService {
    /// The Service port number (kept in the maps' metadata for inspect).
    pub port: u16,
    pub frontends: VecSet<Frontend>,
    /// Sorted, without duplicates. Empty means connects are refused.
    pub backends: Vec<SocketAddr>,
    /// sessionAffinity ClientIP timeout.
    pub affinity_timeout_s: Option<u32>,
}

/// The desired state for every service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredState {
    pub services: BTreeMap<ServicePortKey, DesiredService>,
}

/// Why an endpoint is a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Candidacy {
    /// `ready` (or absent).
    Ready,
    /// No endpoint was ready, and this one is serving and terminating (KEP-1669).
    ServingTerminating,
    /// The Service has publishNotReadyAddresses: conditions are disregarded.
    PublishNotReady,
}

/// Why an endpoint is not a candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Exclusion {
    NotReady,
    /// Terminating: not a candidate while others are ready, nor when it stopped serving.
    Terminating {
        serving: bool,
    },
    OtherNode {
        node: Option<String>,
    },
    OtherZone {
        hints: Vec<String>,
    },
    /// trafficDistribution PreferSameNode, and hinted for another node.
    HintedForOtherNode {
        hints: Vec<String>,
    },
    PortNameMissing {
        port_name: String,
        protocol: String,
    },
    WrongFamily {
        address_type: String,
    },
    Duplicate {
        slice: String,
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
            Self::NotReady => f.write_str("not ready"),
            Self::Terminating { serving: true } => {
                f.write_str("terminating while other endpoints are ready")
            }
            Self::Terminating { serving: false } => {
                f.write_str("terminating and no longer serving")
            }
            Self::OtherNode { node } => write!(
                f,
                "on node {}, and traffic policy Local keeps this node's endpoints only",
                node.as_deref().unwrap_or("<none>")
            ),
            Self::OtherZone { hints } => write!(f, "hinted for zone(s) {}", hints.join(",")),
            Self::HintedForOtherNode { hints } => write!(
                f,
                "hinted for node(s) {} (trafficDistribution PreferSameNode)",
                hints.join(",")
            ),
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "verdict")]
pub enum Verdict {
    Candidate { why: Candidacy },
    Excluded(Exclusion),
}

/// One endpoint of one slice, as seen for one backend set, with the verdict and its reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointDecision {
    pub slice: String,
    pub address: Option<IpAddr>,
    /// The target port this slice gives for the Service port, if it has one.
    pub port: Option<u16>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub target: Option<String>,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl EndpointDecision {
    pub fn is_candidate(&self) -> bool {
        matches!(self.verdict, Verdict::Candidate { .. })
    }
}

/// One backend set of a Service: its desired state and how it was derived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortTranslation {
    pub key: ServicePortKey,
    pub desired: DesiredService,
    /// The Service's targetPort as written (number or name).
    pub target_port: String,
    pub endpoints: Vec<EndpointDecision>,
}

/// Everything one Service produces, or why it produces nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceTranslation {
    pub service: ObjectKey,
    pub resource_version: String,
    /// Set when the Service produces no frontend at all (headless, ExternalName, ...).
    pub skipped: Option<String>,
    pub ports: Vec<PortTranslation>,
    /// Things worth a warning that do not stop the rest (an SCTP port, ...).
    pub notes: Vec<String>,
}
