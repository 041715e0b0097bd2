//! Which endpoints of a Service's slices become backends, as kube-proxy's
//! `EndpointSliceCache` and `CategorizeEndpoints` (pkg/proxy/topology.go) decide it:
//!
//! - only slices of the backend set's family, the first address of each endpoint, the port of
//!   the slice port named like the Service port (with the same protocol);
//! - one entry per address and port: a later copy replaces an earlier one unless the later one
//!   is terminating (a running pod wins over a terminating one with a reused IP);
//! - the cluster set: ready endpoints, narrowed by topology hints when every ready endpoint has
//!   hints and some are for this node (forNodes) or its zone (forZones); if none is ready, every
//!   serving and terminating endpoint (topology ignored);
//! - the local set (internalTrafficPolicy Local): this node's ready endpoints, else this node's
//!   serving and terminating ones; topology never applies.
use std::{net::SocketAddr, sync::Arc};

use super::{
    NodeInfo,
    types::{Candidacy, EndpointDecision, Exclusion, Rule, Verdict},
};
use crate::{
    hashing::{FastMap, fast_map_with_capacity},
    model::{AddressType, Endpoint, EndpointSlice, ServicePort, TargetView},
    vocab::Family,
};

/// One endpoint of one slice as considered, and its verdict so far.
struct Seen<'a> {
    slice: &'a EndpointSlice,
    endpoint: &'a Endpoint,
    port: Option<u16>,
    /// Set when the endpoint is usable at all (address, port, family) and not a duplicate.
    addr: Option<SocketAddr>,
    /// Why it is out before any set is chosen (port, family, duplicate).
    early: Option<Exclusion>,
}

/// The endpoints of one Service port and family, merged as kube-proxy merges slices.
pub(super) struct Merged<'a> {
    seen: Vec<Seen<'a>>,
}

/// A chosen set: the endpoints (indexes into `Merged::seen`) and the rule that chose them.
pub(super) struct Chosen {
    pub members: Vec<usize>,
    pub rule: Rule,
    pub why: Candidacy,
}

/// Up to this many endpoints, a copy of an address is found by a scan.
const SCAN_MAX: usize = 16;

/// Merges the slices for one Service port in one family.
pub(super) fn merge<'a>(
    port: &ServicePort,
    family: Family,
    slices: &[&'a EndpointSlice],
) -> Merged<'a> {
    let total = slices.iter().map(|s| s.endpoints.len()).sum();
    let mut seen = Vec::with_capacity(total);
    // Where each address's kept copy is: found by a scan in a small Service (most), which
    // needs no table; by a map in a larger one.
    let mut by_addr: Option<FastMap<SocketAddr, usize>> =
        (total > SCAN_MAX).then(|| fast_map_with_capacity(total));
    for slice in slices {
        let target = target_port(port, slice);
        for endpoint in &slice.endpoints {
            let index = seen.len();
            let (addr, early) = match (slice.address_type, endpoint.address, target) {
                (AddressType::Ip(f), Some(ip), Some(p)) if f == family => {
                    (Some(SocketAddr::new(ip, p)), None)
                }
                (AddressType::Ip(f), Some(_), None) if f == family => (
                    None,
                    Some(Exclusion::PortNameMissing {
                        port_name: Arc::clone(&port.name_or_number),
                        protocol: port.protocol_name.to_string(),
                    }),
                ),
                _ => (
                    None,
                    Some(Exclusion::WrongFamily {
                        address_type: slice.address_type.to_string(),
                    }),
                ),
            };
            seen.push(Seen {
                slice,
                endpoint,
                port: target,
                addr,
                early,
            });
            let Some(addr) = addr else {
                continue;
            };
            let kept = match &by_addr {
                Some(map) => map.get(&addr).copied(),
                // Only the kept copy of an address still has it.
                None => seen[..index].iter().position(|s| s.addr == Some(addr)),
            };
            match kept {
                None => {
                    if let Some(map) = &mut by_addr {
                        map.insert(addr, index);
                    }
                }
                Some(kept) => {
                    // A later copy replaces the kept one unless the later one is terminating.
                    let (winner, loser) = if endpoint.is_terminating() {
                        (kept, index)
                    } else {
                        (index, kept)
                    };
                    if let Some(map) = &mut by_addr {
                        map.insert(addr, winner);
                    }
                    let slice = Arc::clone(&seen[winner].slice.key.name);
                    seen[loser].addr = None;
                    seen[loser].early = Some(Exclusion::Duplicate { slice });
                }
            }
        }
    }
    Merged { seen }
}

/// The port number this slice gives for the Service port: the slice port whose name and
/// protocol are the Service port's (named targetPorts resolve per pod, so two slices may give
/// the same name different numbers).
fn target_port(port: &ServicePort, slice: &EndpointSlice) -> Option<u16> {
    slice
        .ports
        .iter()
        .find(|p| p.name == port.name && p.protocol == port.protocol_name)
        .and_then(|p| p.port)
}

impl Merged<'_> {
    fn usable(&self) -> impl Iterator<Item = (usize, &Endpoint)> + '_ {
        self.seen
            .iter()
            .enumerate()
            .filter(|(_, s)| s.addr.is_some())
            .map(|(i, s)| (i, s.endpoint))
    }

    /// Some endpoint, anywhere, is ready or serving and terminating.
    pub(super) fn has_any(&self) -> bool {
        self.usable().any(|(_, e)| usable(e))
    }

    pub(super) fn addr(&self, index: usize) -> Option<SocketAddr> {
        self.seen[index].addr
    }

    /// Every serving endpoint (for stale UDP socket termination).
    pub(super) fn serving(&self) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = self
            .usable()
            .filter(|(_, e)| e.is_serving())
            .filter_map(|(i, _)| self.seen[i].addr)
            .collect();
        crate::vocab::canonical(&mut out);
        out
    }

    /// The cluster set: ready endpoints narrowed by topology, else the serving terminating ones.
    /// `annotation` is the Service's topology annotation (it matters up to 1.30 only).
    pub(super) fn cluster(&self, node: &NodeInfo, annotation: Option<&str>) -> Chosen {
        let mut ready: Vec<usize> = Vec::with_capacity(self.seen.len());
        ready.extend(self.usable().filter(|(_, e)| e.is_ready()).map(|(i, _)| i));
        if ready.is_empty() {
            let members: Vec<usize> = self
                .usable()
                .filter(|(_, e)| e.is_serving() && e.is_terminating())
                .map(|(i, _)| i)
                .collect();
            let rule = if members.is_empty() {
                Rule::NoEndpoint
            } else {
                Rule::TerminatingFallback
            };
            return Chosen {
                members,
                rule,
                why: Candidacy::ServingTerminating,
            };
        }
        let endpoint = |i: &usize| self.seen[*i].endpoint;
        let for_me = |hints: Option<&[Arc<str>]>, me: Option<&str>| {
            me.is_some_and(|me| {
                !me.is_empty() && hints.is_some_and(|h| h.iter().any(|x| &**x == me))
            })
        };
        let all_hinted = |f: fn(&Endpoint) -> Option<&[Arc<str>]>| {
            ready
                .iter()
                .all(|i| f(endpoint(i)).is_some_and(|h| !h.is_empty()))
        };
        // Node hints first, then zone hints: used when every ready endpoint has one and some
        // name this node (its zone), as the Kubernetes version's kube-proxy does.
        let version = node.kube_version;
        let annotated = annotation.is_some_and(|a| !matches!(a, "" | "disabled" | "Disabled"));
        let by_hints: [(Hints, Option<&str>, Rule); 2] = [
            (Endpoint::node_hints, node.name.as_deref(), Rule::NodeHints),
            (Endpoint::zone_hints, node.zone.as_deref(), Rule::ZoneHints),
        ];
        for (hints, me, rule) in by_hints {
            if (rule == Rule::NodeHints && !version.node_hints())
                || (version.hints_need_annotation() && !annotated)
            {
                continue;
            }
            let members: Vec<usize> = ready
                .iter()
                .copied()
                .filter(|i| for_me(hints(endpoint(i)), me))
                .collect();
            if all_hinted(hints) && !members.is_empty() {
                return Chosen {
                    members,
                    rule,
                    why: Candidacy::Ready,
                };
            }
        }
        Chosen {
            members: ready,
            rule: Rule::Ready,
            why: Candidacy::Ready,
        }
    }

    /// The local set: this node's ready endpoints, else its serving terminating ones.
    pub(super) fn local(&self, node: &NodeInfo) -> Chosen {
        let local: Vec<(usize, &Endpoint)> =
            self.usable().filter(|(_, e)| is_local(e, node)).collect();
        let ready: Vec<usize> = local
            .iter()
            .filter(|(_, e)| e.is_ready())
            .map(|(i, _)| *i)
            .collect();
        if !ready.is_empty() {
            return Chosen {
                members: ready,
                rule: Rule::LocalReady,
                why: Candidacy::Ready,
            };
        }
        let members: Vec<usize> = local
            .iter()
            .filter(|(_, e)| e.is_serving() && e.is_terminating())
            .map(|(i, _)| *i)
            .collect();
        let rule = match (members.is_empty(), self.has_any()) {
            (false, _) => Rule::LocalTerminatingFallback,
            (true, true) => Rule::NoLocalEndpoint,
            (true, false) => Rule::NoEndpoint,
        };
        Chosen {
            members,
            rule,
            why: Candidacy::ServingTerminating,
        }
    }

    /// Each endpoint's verdict for a chosen set (for explain and golden files).
    pub(super) fn decisions(
        &self,
        chosen: &Chosen,
        node: &NodeInfo,
        local: bool,
    ) -> Vec<EndpointDecision> {
        self.seen
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let verdict = if let Some(x) = &s.early {
                    Verdict::Excluded(x.clone())
                } else if chosen.members.contains(&i) {
                    Verdict::Candidate {
                        why: if s.endpoint.is_ready() {
                            Candidacy::Ready
                        } else {
                            chosen.why
                        },
                    }
                } else {
                    Verdict::Excluded(Self::why_out(s.endpoint, chosen, node, local))
                };
                EndpointDecision {
                    slice: Arc::clone(&s.slice.key.name),
                    address: s.endpoint.address,
                    port: s.port,
                    ready: s.endpoint.ready,
                    serving: s.endpoint.serving,
                    terminating: s.endpoint.terminating,
                    node_name: s.endpoint.node_name_shared(),
                    zone: s.endpoint.zone_shared(),
                    target: s.slice.target_of(s.endpoint).map(TargetView::to_target_ref),
                    verdict,
                }
            })
            .collect()
    }

    fn why_out(e: &Endpoint, chosen: &Chosen, node: &NodeInfo, local: bool) -> Exclusion {
        if local && !is_local(e, node) {
            return Exclusion::OtherNode {
                node: e.node_name_shared(),
            };
        }
        if !usable(e) {
            return if e.is_terminating() {
                Exclusion::Terminating {
                    still_serving: false,
                }
            } else {
                Exclusion::NotReady
            };
        }
        if !e.is_ready() {
            return Exclusion::Terminating {
                still_serving: true,
            };
        }
        match chosen.rule {
            Rule::NodeHints => Exclusion::HintedForOtherNode {
                hints: e
                    .node_hints()
                    .unwrap_or_default()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            },
            Rule::ZoneHints => Exclusion::OtherZone {
                hints: e
                    .zone_hints()
                    .unwrap_or_default()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            },
            _ => Exclusion::NotReady,
        }
    }
}

/// Ready, or serving while terminating: kube-proxy would route to it in some case.
fn usable(e: &Endpoint) -> bool {
    e.is_ready() || (e.is_serving() && e.is_terminating())
}

/// An endpoint's topology hints of one kind (node or zone).
type Hints = fn(&Endpoint) -> Option<&[Arc<str>]>;

/// On this node: the endpoint's nodeName is exactly this node's name.
pub(super) fn is_local(e: &Endpoint, node: &NodeInfo) -> bool {
    matches!((e.node_name(), node.name.as_deref()), (Some(a), Some(b)) if !b.is_empty() && a == b)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::{core::v1 as core, discovery::v1 as discovery},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;
    use crate::model::{service_from_api, slice_from_api};

    fn slice(name: &str, endpoints: &[(u8, bool)]) -> EndpointSlice {
        slice_from_api(&discovery::EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some([("kubernetes.io/service-name".into(), "web".into())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|&(last, terminating)| discovery::Endpoint {
                    addresses: vec![format!("10.0.0.{last}")],
                    conditions: Some(discovery::EndpointConditions {
                        ready: Some(!terminating),
                        serving: Some(true),
                        terminating: Some(terminating),
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(vec![discovery::EndpointPort {
                port: Some(8080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
        })
        .unwrap()
    }

    /// kube-proxy's `EndpointSliceCache.addEndpoints`: a later copy of an address replaces the
    /// kept one unless the later one is terminating. The same in a small Service (its copies
    /// found by a scan) and a large one (by a map).
    #[test]
    fn a_later_copy_of_an_address_wins_unless_it_is_terminating_in_small_and_large_services() {
        let svc = service_from_api(&core::Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(core::ServiceSpec {
                cluster_ip: Some("10.96.0.10".into()),
                cluster_ips: Some(vec!["10.96.0.10".into()]),
                ports: Some(vec![core::ServicePort {
                    port: 80,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        for others in [0u8, 30] {
            // .1 twice, the later copy ready: it wins. .2 twice, the later copy terminating:
            // the earlier one stays.
            let mut first: Vec<(u8, bool)> = vec![(1, true), (2, false)];
            first.extend((0..others).map(|i| (100 + i, false)));
            let (a, b) = (slice("a", &first), slice("b", &[(1, false), (2, true)]));
            let merged = merge(&svc.ports[0], Family::IPv4, &[&a, &b]);
            let kept = |last: u8| -> Vec<usize> {
                let addr = SocketAddr::from(([10, 0, 0, last], 8080));
                (0..merged.seen.len())
                    .filter(|&i| merged.addr(i) == Some(addr))
                    .collect()
            };
            let n = first.len();
            assert_eq!(
                kept(1),
                vec![n],
                "{others} others: the later ready copy of .1"
            );
            assert_eq!(kept(2), vec![1], "{others} others: the earlier copy of .2");
            for loser in [0, n + 1] {
                assert!(
                    matches!(merged.seen[loser].early, Some(Exclusion::Duplicate { .. })),
                    "{others} others: endpoint {loser} is a duplicate"
                );
            }
            assert_eq!(
                (0..merged.seen.len())
                    .filter(|&i| merged.addr(i).is_some())
                    .count(),
                2 + usize::from(others),
                "{others} others: every other address kept once"
            );
        }
    }
}
