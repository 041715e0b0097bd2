//! The outside path (`--external-traffic nftables`): traffic that reaches this node on the wire
//! for a NodePort, a load-balancer IP or an `externalIP`, rewritten (DNAT) to the Service's endpoints by
//! nftables rules in socklb's own table, one per family, as kube-proxy's nftables mode does.
//! The socket programs still serve every socket on the node; these rules see only packets no
//! program translated.
//!
//! Layers, each importing only those above it: `translate::outside` (the pure table per Service
//! port), `render` (that table as nftables chains, maps and sets), `script` (the transactions
//! from what is installed to what is desired), `installed` (reading the kernel's table back for
//! `inspect` and `explain`), and here the state kept between syncs: what each family's table
//! holds, the check that notices someone else's edit, and the UDP flows cleared when their
//! endpoint stops serving. Below it, in `dataplane`: the `nft` tool and conntrack.
pub mod evidence;
pub mod installed;
pub mod render;
pub mod script;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::{
    dataplane::{
        conntrack::{self, ConntrackError, Flow},
        nft::{Nft, NftError},
    },
    translate::outside::{OutsidePort, OutsideState},
    vocab::{Family, Protocol},
};
use render::{RenderOptions, Ruleset};

#[derive(Debug, thiserror::Error)]
pub enum OutsideError {
    #[error("{family} rules: {source}")]
    Nft {
        family: Family,
        #[source]
        source: NftError,
    },
    #[error("clearing UDP flows: {0}")]
    Conntrack(#[from] ConntrackError),
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// A family's table was written whole (start, a failed transaction, drift).
    pub full: bool,
    pub chains_written: usize,
    pub elements_written: usize,
    /// UDP flows to endpoints that stopped serving, deleted.
    pub flows_cleared: usize,
    pub took: Duration,
}

#[derive(Debug, Default)]
struct Installed {
    /// What the table holds, as socklb wrote it (`None`: unknown, the next sync is full).
    ruleset: Option<Ruleset>,
}

/// The outside path's state between syncs.
pub struct Outside {
    nft: Nft,
    options: RenderOptions,
    families: BTreeMap<Family, Installed>,
    /// The last state written, for the UDP flows to clear.
    last: Option<OutsideState>,
}

impl Outside {
    pub fn new(nft: Nft, options: RenderOptions) -> Self {
        Self {
            nft,
            options,
            families: [Family::IPv4, Family::IPv6]
                .into_iter()
                .map(|f| (f, Installed::default()))
                .collect(),
            last: None,
        }
    }

    /// Writes what changed since the last sync (all of it, where a table is not known).
    pub fn sync(&mut self, state: &OutsideState) -> Result<SyncReport, OutsideError> {
        let start = Instant::now();
        let mut report = SyncReport::default();
        for (family, installed) in &mut self.families {
            let desired = render::render(state, *family, &self.options);
            if installed.ruleset.as_ref() == Some(&desired) {
                continue;
            }
            let names = if installed.ruleset.is_none() {
                report.full = true;
                self.nft
                    .list_json(*family)
                    .map(|json| json.map(|j| installed::names(&j)).unwrap_or_default())
                    .map_err(|source| OutsideError::Nft {
                        family: *family,
                        source,
                    })?
            } else {
                script::Names::default()
            };
            let t = script::transactions(*family, installed.ruleset.as_ref(), &desired, &names);
            if let Err(source) = self.nft.apply(&t.main) {
                installed.ruleset = None;
                return Err(OutsideError::Nft {
                    family: *family,
                    source,
                });
            }
            if !t.cleanup.is_empty()
                && let Err(e) = self.nft.apply(&t.cleanup)
            {
                // Unreferenced leftovers only: the next full sync removes them.
                tracing::debug!(error = %e, "outside path: leftover chains stay until the next full sync");
            }
            report.chains_written += t.chains_written;
            report.elements_written += t.elements_written;
            installed.ruleset = Some(desired);
        }
        report.flows_cleared = self.clear_stale_flows(state)?;
        self.last = Some(state.clone());
        report.took = start.elapsed();
        Ok(report)
    }

    /// Families whose table is not what socklb last wrote (deleted, a chain flushed or
    /// removed, an element of a map socklb writes removed, added or changed): each is marked
    /// unknown, so the next sync writes it whole. Judged on the kernel's listing against what
    /// was written, not against an earlier listing, so an edit right after a write is seen too.
    pub fn check_drift(&mut self) -> Result<Vec<Family>, OutsideError> {
        let mut drifted = Vec::new();
        for (family, installed) in &mut self.families {
            let Some(written) = &installed.ruleset else {
                continue;
            };
            let listing = self
                .nft
                .list_json(*family)
                .map_err(|source| OutsideError::Nft {
                    family: *family,
                    source,
                })?;
            let holds =
                listing.is_some_and(|json| installed::InstalledTable::parse(&json).holds(written));
            if !holds {
                installed.ruleset = None;
                drifted.push(*family);
            }
        }
        Ok(drifted)
    }

    /// Whether every family's table is known to hold what socklb wrote.
    pub fn in_sync(&self) -> bool {
        self.families.values().all(|i| i.ruleset.is_some())
    }

    /// The desired table of each family for `state` (for explain and status).
    pub fn render(&self, state: &OutsideState, family: Family) -> Ruleset {
        render::render(state, family, &self.options)
    }

    /// Deletes UDP flows whose reply comes from no serving endpoint of the Service port whose
    /// frontend their first packet went to, once some UDP port's frontends or serving
    /// endpoints changed (or at the first sync).
    fn clear_stale_flows(&self, state: &OutsideState) -> Result<usize, OutsideError> {
        let udp = |s: &OutsideState| -> Vec<OutsidePort> {
            s.ports
                .values()
                .filter(|p| p.protocol == Protocol::Udp)
                .cloned()
                .collect()
        };
        let now = udp(state);
        if self.last.as_ref().is_some_and(|last| udp(last) == now) {
            return Ok(0);
        }
        let mut cleared = 0;
        for family in [Family::IPv4, Family::IPv6] {
            let ports: Vec<&OutsidePort> = now.iter().filter(|p| p.family == family).collect();
            if ports.is_empty() {
                continue;
            }
            let flows = conntrack::udp_flows(family)?;
            for flow in stale_flows(state, &ports, &flows) {
                if conntrack::delete(&flow)? {
                    cleared += 1;
                }
            }
        }
        Ok(cleared)
    }
}

/// The flows to delete: to a frontend of one of `ports` (an address and port, or a NodePort on
/// a NodePort address) whose replies come from an address that serves no endpoint of it (a
/// removed endpoint, or the frontend itself when nothing translated the flow).
pub fn stale_flows(state: &OutsideState, ports: &[&OutsidePort], flows: &[Flow]) -> Vec<Flow> {
    let mut by_address: BTreeMap<SocketAddr, BTreeSet<SocketAddr>> = BTreeMap::new();
    let mut by_node_port: BTreeMap<u16, BTreeSet<SocketAddr>> = BTreeMap::new();
    for p in ports {
        let serving: BTreeSet<SocketAddr> = p.serving.iter().copied().collect();
        for (ip, _) in &p.addresses {
            by_address.insert(SocketAddr::new(*ip, p.port), serving.clone());
        }
        if let Some(np) = p.node_port {
            by_node_port.insert(np, serving);
        }
    }
    flows
        .iter()
        .filter(|f| {
            let serving = by_address.get(&f.orig_dst).or_else(|| {
                let family = Family::of(f.orig_dst.ip());
                let on_node = state.node_ports_match_all.contains(&family)
                    || state.node_addresses.contains(&f.orig_dst.ip());
                on_node
                    .then(|| by_node_port.get(&f.orig_dst.port()))
                    .flatten()
            });
            serving.is_some_and(|s| !s.contains(&f.reply_src))
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests;
