//! What the outside path holds for each frontend, against what the Services ask for: for
//! `socklb inspect outside` (what the kernel's tables hold) and `socklb explain` (desired
//! against installed, with a digest of each and the first broken link). Pure.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{
    installed::InstalledTable,
    render::{
        NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, PortChains, SERVICE_IPS, SERVICE_NODEPORTS,
    },
};
use crate::{translate::outside::OutsidePort, vocab::Family};

/// One frontend of the outside path: where its new flows go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontend {
    pub family: String,
    /// `192.0.2.10 . tcp . 80`, or `tcp . 30080` for a NodePort on this node's addresses.
    pub key: String,
    /// The Service port (`namespace/name/protocol/port`), when its chain names one.
    pub service_port: Option<String>,
    /// `goto ext-...`, `goto reject-chain` (no endpoint: refused), `drop` (none on this node
    /// under Local).
    pub verdict: String,
    /// The endpoints new flows are sent to (following the chains).
    pub endpoints: BTreeSet<SocketAddr>,
}

/// One frontend, desired against installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub desired: Frontend,
    /// `None`: the tables do not hold it.
    pub installed: Option<Frontend>,
}

impl Check {
    pub fn holds(&self) -> bool {
        self.installed.as_ref() == Some(&self.desired)
    }

    /// What is wrong, in words, when something is.
    pub fn problem(&self) -> Option<String> {
        let d = &self.desired;
        match &self.installed {
            None => Some(format!("{} {}: not in the rules", d.family, d.key)),
            Some(i) if i.verdict != d.verdict => Some(format!(
                "{} {}: the rules say {:?}, the Service asks for {:?}",
                d.family, d.key, i.verdict, d.verdict
            )),
            Some(i) if i.endpoints != d.endpoints => Some(format!(
                "{} {}: the rules send to {}, the Service asks for {}",
                d.family,
                d.key,
                list(&i.endpoints),
                list(&d.endpoints)
            )),
            Some(_) => None,
        }
    }
}

fn list(set: &BTreeSet<SocketAddr>) -> String {
    if set.is_empty() {
        "nothing".into()
    } else {
        set.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn family_name(family: Family) -> String {
    family.to_string()
}

/// The Service port a chain's name carries (`ext-1a2b3c4d-shop/web/tcp/http`).
fn service_port_of(chain: &str) -> Option<String> {
    let mut parts = chain.splitn(3, '-');
    let (_, _, rest) = (parts.next()?, parts.next()?, parts.next()?);
    rest.contains('/').then(|| rest.to_string())
}

/// The frontends one port's rules should hold.
pub fn desired(port: &OutsidePort) -> Vec<Frontend> {
    let chains = PortChains::of(port);
    let proto = port.protocol.lower();
    let endpoints: BTreeSet<SocketAddr> = if port.has_endpoints && port.local_policy {
        // From outside, the local endpoints; from the node itself (and pod ranges), the
        // cluster's: both are reachable from the external chain.
        port.local.iter().chain(&port.cluster).copied().collect()
    } else if port.has_endpoints {
        port.cluster.iter().copied().collect()
    } else {
        BTreeSet::new()
    };
    let verdict = if port.has_endpoints {
        format!("goto {}", chains.external)
    } else {
        "goto reject-chain".to_string()
    };
    let frontend = |key: String| Frontend {
        family: family_name(port.family),
        key,
        service_port: Some(port.name()),
        verdict: verdict.clone(),
        endpoints: endpoints.clone(),
    };
    let mut out: Vec<Frontend> = port
        .addresses
        .iter()
        .map(|(ip, _)| frontend(format!("{ip} . {proto} . {}", port.port)))
        .collect();
    if let Some(np) = port.node_port {
        out.push(frontend(format!("{proto} . {np}")));
    }
    out
}

/// Every frontend the installed table of `family` holds.
pub fn installed(table: &InstalledTable, family: Family) -> Vec<Frontend> {
    let mut out: BTreeMap<String, Frontend> = BTreeMap::new();
    for (map, fallback) in [
        (SERVICE_IPS, false),
        (SERVICE_NODEPORTS, false),
        (NO_ENDPOINT_SERVICES, true),
        (NO_ENDPOINT_NODEPORTS, true),
    ] {
        for (key, verdict) in table.maps.get(map).into_iter().flatten() {
            if fallback && out.contains_key(key) {
                // The external chain wins; a `drop` beside it only catches what it leaves.
                continue;
            }
            let chain = verdict
                .strip_prefix("goto ")
                .or_else(|| verdict.strip_prefix("jump "));
            out.insert(
                key.clone(),
                Frontend {
                    family: family_name(family),
                    key: key.clone(),
                    service_port: chain.and_then(service_port_of),
                    verdict: verdict.clone(),
                    endpoints: chain
                        .filter(|c| *c != "reject-chain")
                        .map(|c| table.endpoints_from(c))
                        .unwrap_or_default(),
                },
            );
        }
    }
    out.into_values().collect()
}

/// Each desired frontend of `ports` against the installed tables (by family).
pub fn check(ports: &[&OutsidePort], tables: &BTreeMap<Family, InstalledTable>) -> Vec<Check> {
    let installed: BTreeMap<(String, String), Frontend> = tables
        .iter()
        .flat_map(|(family, t)| installed(t, *family))
        .map(|f| ((f.family.clone(), f.key.clone()), f))
        .collect();
    ports
        .iter()
        .flat_map(|p| desired(p))
        .map(|d| Check {
            installed: installed.get(&(d.family.clone(), d.key.clone())).cloned(),
            desired: d,
        })
        .collect()
}

/// A digest of frontends (desired or installed, in the same form): equal digests, equal rules.
pub fn digest<'a>(frontends: impl IntoIterator<Item = &'a Frontend>) -> String {
    let mut hasher = Sha256::new();
    for f in frontends {
        hasher.update(serde_json::to_string(f).unwrap_or_default().as_bytes());
    }
    let d = hasher.finalize();
    let mut out = String::new();
    for b in &d[..8] {
        let _ = write!(out, "{b:02x}");
    }
    out
}
