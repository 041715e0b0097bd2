//! Which endpoints of a Service's slices become backends of one backend set, following
//! kube-proxy's reading of EndpointSlices: port by the Service port's name, ready endpoints
//! first, serving-and-terminating ones when none is ready (KEP-1669), traffic policy Local,
//! and topology hints.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use super::{
    NodeInfo,
    types::{Candidacy, EndpointDecision, Exclusion, Verdict},
};
use crate::{
    dataplane::abi::Family,
    model::{AddressType, Endpoint, EndpointSlice, Service, ServicePort},
};

/// The inputs that select among endpoints for one backend set.
pub struct Selection<'a> {
    pub service: &'a Service,
    pub port: &'a ServicePort,
    pub family: Family,
    /// Traffic policy Local: only endpoints on this node.
    pub local_only: bool,
    pub node: &'a NodeInfo,
}

struct Pending<'a> {
    index: usize,
    addr: SocketAddr,
    endpoint: &'a Endpoint,
}

/// One endpoint of one slice as considered for a backend set, and its verdict so far.
struct Seen<'a> {
    slice: &'a EndpointSlice,
    endpoint: &'a Endpoint,
    port: Option<u16>,
    verdict: Verdict,
}

impl Seen<'_> {
    fn decision(self) -> EndpointDecision {
        EndpointDecision {
            slice: self.slice.key.name.to_string(),
            address: self.endpoint.address,
            port: self.port,
            ready: self.endpoint.ready,
            serving: self.endpoint.serving,
            terminating: self.endpoint.terminating,
            node_name: self.endpoint.node_name().map(str::to_string),
            zone: self.endpoint.zone().map(str::to_string),
            target: self.endpoint.target().map(str::to_string),
            verdict: self.verdict,
        }
    }
}

/// Returns the backends (sorted) and, with `detail`, a decision for every endpoint
/// considered (the agent does not need them; `explain` and the golden tests do).
pub fn select(
    sel: &Selection<'_>,
    slices: &[&EndpointSlice],
    detail: bool,
) -> (Vec<SocketAddr>, Vec<EndpointDecision>) {
    let mut decisions: Vec<Seen<'_>> = Vec::new();
    let mut pending: Vec<Pending<'_>> = Vec::new();

    for slice in slices {
        let target = target_port(sel.port, slice);
        for endpoint in &slice.endpoints {
            let index = decisions.len();
            decisions.push(Seen {
                slice,
                endpoint,
                port: target,
                verdict: Verdict::Candidate {
                    why: Candidacy::Ready,
                },
            });
            let exclusion = match (slice.address_type, endpoint.address, target) {
                (AddressType::Ip(family), Some(ip), Some(port)) if family == sel.family => {
                    pending.push(Pending {
                        index,
                        addr: SocketAddr::new(ip, port),
                        endpoint,
                    });
                    continue;
                }
                (AddressType::Ip(family), Some(_), None) if family == sel.family => {
                    Exclusion::PortNameMissing {
                        port_name: sel.port.name.clone(),
                        protocol: sel.port.protocol_name.clone(),
                    }
                }
                _ => Exclusion::WrongFamily {
                    address_type: slice.address_type.to_string(),
                },
            };
            decisions[index].verdict = Verdict::Excluded(exclusion);
        }
    }

    let pending = dedup(pending, &mut decisions);
    let pending = if sel.local_only {
        let node = sel.node.name.as_deref();
        let (local, other): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|p| node.is_some() && p.endpoint.node_name() == node);
        for p in other {
            decisions[p.index].verdict = Verdict::Excluded(Exclusion::OtherNode {
                node: p.endpoint.node_name().map(str::to_string),
            });
        }
        local
    } else {
        pending
    };

    let chosen = if sel.service.publish_not_ready_addresses {
        for p in &pending {
            if !p.endpoint.is_ready() {
                decisions[p.index].verdict = Verdict::Candidate {
                    why: Candidacy::PublishNotReady,
                };
            }
        }
        pending.iter().collect::<Vec<_>>()
    } else {
        by_readiness(sel, &pending, &mut decisions)
    };

    let mut backends: Vec<SocketAddr> = chosen.iter().map(|p| p.addr).collect();
    backends.sort_unstable();
    let decisions = if detail {
        decisions.into_iter().map(Seen::decision).collect()
    } else {
        Vec::new()
    };
    (backends, decisions)
}

/// The port number this slice gives for the Service port: the slice port whose name is the
/// Service port's name (targetPort names are resolved per pod by the EndpointSlice controller,
/// so two slices may give the same name different numbers).
fn target_port(port: &ServicePort, slice: &EndpointSlice) -> Option<u16> {
    slice
        .ports
        .iter()
        .find(|p| p.name == port.name && p.protocol == port.protocol_name)
        .and_then(|p| p.port)
}

/// Keeps one entry per address and port, preferring the best conditions.
fn dedup<'a>(pending: Vec<Pending<'a>>, decisions: &mut [Seen<'_>]) -> Vec<Pending<'a>> {
    let rank = |e: &Endpoint| match (e.is_ready(), e.is_serving()) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    };
    let mut best: BTreeMap<SocketAddr, Pending<'a>> = BTreeMap::new();
    for p in pending {
        match best.get(&p.addr) {
            Some(kept) if rank(kept.endpoint) <= rank(p.endpoint) => {
                let slice = decisions[kept.index].slice.key.name.to_string();
                decisions[p.index].verdict = Verdict::Excluded(Exclusion::Duplicate { slice });
            }
            _ => {
                if let Some(replaced) = best.insert(p.addr, p) {
                    let slice = decisions[best[&replaced.addr].index]
                        .slice
                        .key
                        .name
                        .to_string();
                    decisions[replaced.index].verdict =
                        Verdict::Excluded(Exclusion::Duplicate { slice });
                }
            }
        }
    }
    let mut kept: Vec<_> = best.into_values().collect();
    kept.sort_by_key(|p| p.index);
    kept
}

/// Ready endpoints (narrowed by topology when the policy is Cluster); if there are none,
/// serving-and-terminating ones.
fn by_readiness<'p, 'a>(
    sel: &Selection<'_>,
    pending: &'p [Pending<'a>],
    decisions: &mut [Seen<'_>],
) -> Vec<&'p Pending<'a>> {
    let ready: Vec<&Pending<'a>> = pending.iter().filter(|p| p.endpoint.is_ready()).collect();
    let chosen = if ready.is_empty() {
        let fallback: Vec<_> = pending
            .iter()
            .filter(|p| p.endpoint.is_serving() && p.endpoint.is_terminating())
            .collect();
        for p in &fallback {
            decisions[p.index].verdict = Verdict::Candidate {
                why: Candidacy::ServingTerminating,
            };
        }
        fallback
    } else if sel.local_only {
        ready
    } else {
        by_topology(sel, ready, decisions)
    };
    for p in pending {
        if !chosen.iter().any(|c| c.index == p.index)
            && matches!(decisions[p.index].verdict, Verdict::Candidate { .. })
        {
            decisions[p.index].verdict = Verdict::Excluded(if p.endpoint.is_terminating() {
                Exclusion::Terminating {
                    serving: p.endpoint.is_serving(),
                }
            } else {
                Exclusion::NotReady
            });
        }
    }
    chosen
}

/// Topology-aware routing: when every ready endpoint carries hints and some are for this node
/// (hints.forNodes, PreferSameNode) or this node's zone (hints.forZones), keep only those.
fn by_topology<'p, 'a>(
    sel: &Selection<'_>,
    ready: Vec<&'p Pending<'a>>,
    decisions: &mut [Seen<'_>],
) -> Vec<&'p Pending<'a>> {
    let hinted_for = |hints: Option<&[String]>, me: Option<&str>| {
        me.is_some_and(|me| hints.is_some_and(|h| h.iter().any(|x| x == me)))
    };
    let all_have = |f: fn(&Endpoint) -> Option<&[String]>| {
        ready
            .iter()
            .all(|p| f(p.endpoint).is_some_and(|h| !h.is_empty()))
    };
    let node = sel.node.name.as_deref();
    let zone = sel.node.zone.as_deref();
    let prefer_node = sel.service.traffic_distribution.as_deref() == Some("PreferSameNode");
    if prefer_node
        && all_have(Endpoint::node_hints)
        && ready
            .iter()
            .any(|p| hinted_for(p.endpoint.node_hints(), node))
    {
        let (keep, drop): (Vec<_>, Vec<_>) = ready
            .into_iter()
            .partition(|p| hinted_for(p.endpoint.node_hints(), node));
        for p in drop {
            decisions[p.index].verdict = Verdict::Excluded(Exclusion::HintedForOtherNode {
                hints: p.endpoint.node_hints().unwrap_or_default().to_vec(),
            });
        }
        return keep;
    }
    if all_have(Endpoint::zone_hints)
        && ready
            .iter()
            .any(|p| hinted_for(p.endpoint.zone_hints(), zone))
    {
        let (keep, drop): (Vec<_>, Vec<_>) = ready
            .into_iter()
            .partition(|p| hinted_for(p.endpoint.zone_hints(), zone));
        for p in drop {
            decisions[p.index].verdict = Verdict::Excluded(Exclusion::OtherZone {
                hints: p.endpoint.zone_hints().unwrap_or_default().to_vec(),
            });
        }
        return keep;
    }
    ready
}

/// All addresses of one family among the given ones.
pub fn of_family(addrs: &[IpAddr], family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    addrs
        .iter()
        .copied()
        .filter(move |ip| Family::of(*ip) == family)
}
