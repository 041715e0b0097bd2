//! `socklb explain`: the chain from a Service to this node's maps, link by link, ending with
//! the first broken one. Pure: objects, node identity, a map snapshot, the agent's status, (with
//! manifests) every Service's claims, and this node's live connections when they could be listed,
//! in; an `Explanation` out (rendered as text or JSON by the CLI). Everything is compared as typed
//! values; digests are taken over the canonical (numeric) order. It never imports the agent: the
//! agent's side comes in as its `/status`.
use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

mod render;

pub use render::render;

use crate::{
    dataplane::{
        abi::service_addr,
        maps::{IndexRead, IndexView, MapSnapshot},
    },
    model::{EndpointSlice, Service, Store},
    sockets::{
        cluster::endpoints_of,
        view::{BackendConnections, Condition, ConnectionsView},
    },
    status::Status,
    translate::{
        Conflict, Exclusion, NodeInfo, Ownership, PortTranslation, Rule, ServiceTranslation,
        Verdict, translate_service,
    },
    vocab::{ObjectKey, ObjectRef, ServiceAddr},
};

/// The link that broke first, in the order the seeds teach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    Service,
    EndpointSlices,
    Endpoints,
    Port,
    Candidates,
    /// The address belongs to another Service.
    Ownership,
    Maps,
    /// Nothing broken on socklb's side.
    None,
}

/// Where the programs find a frontend, which is where `maps_backends` was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadFrom {
    /// The index entry at `slot` (`FRONTEND_INDEX`, or `FRONTEND_INDEX6` for IPv6): the programs
    /// do not read the family's hash map; `frontends4_agrees` (a name from before the IPv6
    /// index) says whether that hash map (`FRONTENDS4`, `FRONTENDS6`) holds the same frontend
    /// (it may not while the agent is down mid-change; its next start rewrites the index).
    Index { slot: u32, frontends4_agrees: bool },
    /// The hash map: the frontend's index slot is empty.
    SlotEmpty { slot: u32 },
    /// The hash map: another frontend holds the slot.
    SlotHeld { slot: u32, by: Option<ServiceAddr> },
    /// The hash map: the slot's entry has this frontend's key but fails its check (torn, or
    /// written under another secret).
    EntryFailsCheck { slot: u32 },
    /// The hash map, when the index could not be read.
    HashMap,
}

impl ReadFrom {
    /// From what the index held for `addr` (`None`: no index read).
    pub fn of(read: Option<IndexRead>, snapshot: &MapSnapshot, addr: &ServiceAddr) -> Self {
        match read {
            None => Self::HashMap,
            Some(IndexRead::Held { slot, frontend }) => Self::Index {
                slot,
                frontends4_agrees: snapshot.reach(addr).map(|r| r.frontend) == Some(frontend),
            },
            Some(IndexRead::Empty { slot }) => Self::SlotEmpty { slot },
            Some(IndexRead::Taken { slot, holder }) => Self::SlotHeld {
                slot,
                by: service_addr(&holder),
            },
            Some(IndexRead::Failed { slot }) => Self::EntryFailsCheck { slot },
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SliceSummary {
    pub name: String,
    pub resource_version: String,
    pub address_type: String,
    pub ports: Vec<String>,
    pub endpoints: usize,
}

/// One frontend: what the maps hold for it against what the Service asks for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapCheck {
    pub frontend: ServiceAddr,
    /// What the maps hold for the frontend: `None` when absent.
    pub maps_backends: Option<Vec<SocketAddr>>,
    pub desired_backends: Vec<SocketAddr>,
    /// Where the programs find the frontend (`None`: no maps were read).
    pub read_from: Option<ReadFrom>,
    /// Another Service owns this address (it is not written for this one).
    pub owned_by: Option<Conflict>,
    pub matches: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Explanation {
    pub target: String,
    pub service: Option<ObjectKey>,
    /// Why the Service was rejected by validation, if it was.
    pub rejected: Option<String>,
    /// The translation with every endpoint's decision.
    pub translation: Option<ServiceTranslation>,
    pub selector: Option<BTreeMap<String, String>>,
    pub slices: Vec<SliceSummary>,
    pub maps: Vec<MapCheck>,
    /// Whether pinned maps were readable at all.
    pub maps_available: bool,
    /// Whether the agent answered, and what it reports for this Service's backend sets.
    pub agent_reachable: bool,
    pub agent_problems: Vec<String>,
    pub desired_digest: String,
    pub maps_digest: String,
    /// Every object the desired state came from, with its resourceVersion.
    pub resource_versions: Vec<ObjectVersion>,
    pub broken: Link,
    pub verdict: String,
    /// Each endpoint's live connections on this node, when they could be listed.
    #[serde(default)]
    pub live: Option<LiveConnections>,
    /// The outside path (`--external-traffic nftables`), where its tables are on this node.
    #[serde(default)]
    pub outside: Option<OutsideExplanation>,
}

/// The live translated connections of the Service's backend sets, per endpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LiveConnections {
    pub endpoints: Vec<EndpointLive>,
    /// What could not be listed on this node (named losses).
    pub missing: Vec<String>,
}

/// One endpoint of one backend set, and what is still connected to it from this node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointLive {
    pub service_port: crate::vocab::ServicePortKey,
    pub backend: SocketAddr,
    pub condition: Condition,
    /// TCP sockets in any state and connected UDP sockets.
    pub connections: usize,
    pub clients: usize,
    /// No new connection reaches it (terminating or gone) and none is left: it is drained.
    pub drained: bool,
}

/// An object the desired state came from, as it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectVersion {
    pub object: ObjectRef,
    pub resource_version: String,
}

/// Where `explain` looks: the objects (as the agent's source has them), this node, the pinned
/// maps, the agent's own account (its /status), and who owns contested addresses, each when
/// available.
pub struct Sources<'a> {
    pub store: &'a Store,
    /// Objects rejected by validation, and why.
    pub rejected: &'a BTreeMap<ObjectRef, String>,
    pub node: &'a NodeInfo,
    /// `None` when no maps are pinned.
    pub maps: Option<&'a MapSnapshot>,
    /// The frontend index beside them (`None`: not read; frontends are then looked up in the
    /// hash maps only).
    pub index: Option<&'a IndexView>,
    /// `None` when the agent could not be asked.
    pub agent: Option<&'a Status>,
    /// Every Service's claims, when the whole cluster was read (manifests); otherwise the
    /// agent's status says who owns what.
    pub ownership: Option<&'a Ownership>,
    /// This node's live connections, when they could be listed.
    pub connections: Option<&'a ConnectionsView>,
    /// The outside path's tables as the kernel holds them, by family (`None`: there are none).
    pub outside:
        Option<&'a BTreeMap<crate::vocab::Family, crate::outside::installed::InstalledTable>>,
}

/// The outside path for one Service: each frontend, desired against installed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OutsideExplanation {
    pub checks: Vec<crate::outside::evidence::Check>,
    pub desired_digest: String,
    pub installed_digest: String,
    /// The first frontend whose rules are not what the Service asks for.
    pub problem: Option<String>,
}

/// Finds the Service a target names: `namespace/name` (or `name` in default), or a frontend
/// address `ADDR:PORT[/tcp|udp]`.
pub fn resolve(store: &Store, node: &NodeInfo, target: &str) -> Option<ObjectKey> {
    if let Ok(frontend) = ServiceAddr::parse(target) {
        return store
            .services()
            .find(|svc| {
                translate_service(svc, &store.slices_of(&svc.key), node)
                    .ports
                    .iter()
                    .any(|p| p.desired.frontends.iter().any(|c| c.addr == frontend))
            })
            .map(|svc| svc.key.clone());
    }
    Some(ObjectKey::parse(target))
}

/// Walks the chain for `target` (a Service or one of its frontends).
pub fn explain(sources: &Sources<'_>, target: &str) -> Explanation {
    let Sources {
        store,
        rejected,
        node,
        maps: snapshot,
        index,
        agent,
        ownership,
        connections,
        outside,
    } = *sources;
    let service = resolve(store, node, target);
    let mut e = Explanation {
        target: target.to_string(),
        service: service.clone(),
        rejected: None,
        translation: None,
        selector: None,
        slices: Vec::new(),
        maps: Vec::new(),
        maps_available: snapshot.is_some(),
        agent_reachable: agent.is_some(),
        agent_problems: Vec::new(),
        desired_digest: String::new(),
        maps_digest: String::new(),
        resource_versions: Vec::new(),
        broken: Link::None,
        verdict: String::new(),
        live: None,
        outside: None,
    };
    let Some(key) = service else {
        return e.broken_at(Link::Service, format!("no Service has a frontend {target}"));
    };
    let Some(svc) = store.service(&key) else {
        e.rejected = rejected.get(&ObjectRef::service(key.clone())).cloned();
        let why = e.rejected.as_ref().map_or_else(
            || "it does not exist".to_string(),
            |r| format!("it was rejected: {r}"),
        );
        return e.broken_at(Link::Service, format!("Service {key}: {why}"));
    };
    let slices = store.slices_of(&key);
    e.selector = svc.selector.as_ref().map(|s| {
        s.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    e.resource_versions.push(ObjectVersion {
        object: ObjectRef::service(key.clone()),
        resource_version: svc.resource_version.to_string(),
    });
    e.summarize_slices(&slices);
    let translation = translate_service(svc, &slices, node);
    let mut conflicts: Vec<Conflict> = Vec::new();
    for port in &translation.ports {
        if let Some(status) = agent {
            for p in status.problems_of(&port.key) {
                e.agent_problems.push(format!("{}: {p}", port.key));
            }
            conflicts.extend(
                status
                    .conflicts
                    .iter()
                    .filter(|c| c.service_port == port.key)
                    .map(|c| c.conflict.clone()),
            );
        }
        if let Some(o) = ownership {
            for c in o.conflicts(&port.key, &port.desired) {
                if !conflicts.iter().any(|x| x.addr == c.addr) {
                    conflicts.push(c);
                }
            }
        }
    }
    e.check_maps(&translation, snapshot.map(|s| (s, index)), &conflicts);
    e.live = connections.map(|view| live(store, &translation, view));
    e.outside = outside.map(|tables| outside_of(store, node, &key, tables));
    e.translation = Some(translation.clone());
    let (link, verdict) = first_broken_link(&key, svc, &slices, &translation, &e);
    e.broken_at(link, verdict)
}

/// The outside path's frontends of Service `key`, desired against installed.
fn outside_of(
    store: &Store,
    node: &NodeInfo,
    key: &ObjectKey,
    tables: &BTreeMap<crate::vocab::Family, crate::outside::installed::InstalledTable>,
) -> OutsideExplanation {
    use crate::outside::evidence;
    let state = crate::translate::outside::outside_state(store, node);
    let ports: Vec<_> = state.ports.values().filter(|p| &p.service == key).collect();
    let checks = evidence::check(&ports, tables);
    OutsideExplanation {
        desired_digest: evidence::digest(checks.iter().map(|c| &c.desired)),
        installed_digest: evidence::digest(checks.iter().filter_map(|c| c.installed.as_ref())),
        problem: checks.iter().find_map(evidence::Check::problem),
        checks,
    }
}

/// Every endpoint of every backend set with its live connections, and the backends that still
/// hold connections but are in no slice any more.
fn live(
    store: &Store,
    translation: &ServiceTranslation,
    view: &ConnectionsView,
) -> LiveConnections {
    let mut endpoints = Vec::new();
    for port in &translation.ports {
        let held = view
            .services
            .iter()
            .filter(|s| s.service.as_ref() == Some(&port.key))
            .flat_map(|s| s.backends.iter());
        let mut listed = endpoints_of(store, &port.key);
        for b in held.clone() {
            if !listed.iter().any(|(addr, _)| *addr == b.backend) {
                listed.push((b.backend, Condition::Gone));
            }
        }
        for (backend, condition) in listed {
            let found = held.clone().find(|b| b.backend == backend);
            let connections = found.map_or(0, BackendConnections::total);
            endpoints.push(EndpointLive {
                service_port: port.key.clone(),
                backend,
                condition,
                connections,
                clients: found.map_or(0, |b| b.clients.len()),
                drained: condition.draining() && connections == 0,
            });
        }
    }
    LiveConnections {
        endpoints,
        missing: view.missing.clone(),
    }
}

/// Checks the links in order and names the first broken one.
fn first_broken_link(
    key: &ObjectKey,
    svc: &Service,
    slices: &[&EndpointSlice],
    translation: &ServiceTranslation,
    e: &Explanation,
) -> (Link, String) {
    if let Some(skip) = &translation.skipped {
        return (
            Link::Service,
            format!("Service {key} gets no frontend: {skip}"),
        );
    }
    if slices.is_empty() {
        let why = if svc.selector.is_some() {
            "the EndpointSlice controller has not written any (yet)"
        } else {
            "the Service has no selector, and nobody wrote slices for it by hand"
        };
        return (
            Link::EndpointSlices,
            format!(
                "no EndpointSlice is labelled kubernetes.io/service-name={}: {why}",
                key.name
            ),
        );
    }
    if slices.iter().all(|s| s.endpoints.is_empty()) {
        let selector = svc.selector.as_ref().map_or_else(
            || "(no selector)".to_string(),
            |s| {
                s.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        );
        return (
            Link::Endpoints,
            format!(
                "the endpoint set is empty: the selector {selector} matches no pod, so the EndpointSlices list no endpoint; connects to the Service are refused"
            ),
        );
    }
    for port in &translation.ports {
        if port.desired.backends.is_empty() {
            let (link, why) = why_no_candidate(port);
            return (
                link,
                format!(
                    "{} ({}) has no candidate endpoint: {why}; connects are refused (rule: {})",
                    port.key,
                    frontends(port),
                    port.rule
                ),
            );
        }
    }
    if let Some((m, owner)) = e
        .maps
        .iter()
        .find_map(|m| m.owned_by.as_ref().map(|o| (m, o)))
    {
        return (
            Link::Ownership,
            format!("{} is not served for this Service: {owner}", m.frontend),
        );
    }
    if !e.maps_available {
        return (
            Link::Maps,
            "no socklb maps are pinned on this node (is the agent running?)".into(),
        );
    }
    if let Some(bad) = e.maps.iter().find(|m| !m.matches) {
        let held = bad
            .maps_backends
            .as_ref()
            .map_or_else(|| "nothing".to_string(), |b| list(b));
        let why = match (e.agent_problems.first(), e.agent_reachable) {
            (Some(problem), _) => format!("the agent reports {problem}"),
            (None, true) => "the agent reports no problem: it may be catching up".to_string(),
            (None, false) => {
                "agent lagging, failing, or stopped: see its log and /metrics".to_string()
            }
        };
        let verdict = format!(
            "this node's maps hold {held} for {}, the Service asks for {} ({why})",
            bad.frontend,
            list(&bad.desired_backends)
        );
        return (Link::Maps, verdict);
    }
    (
        Link::None,
        "the maps hold what the Service asks for; if connects still fail, look past socklb: is the backend listening on the target port, NetworkPolicy, routes".into(),
    )
}

fn list(addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return "no backend".into();
    }
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn frontends(port: &PortTranslation) -> String {
    port.desired
        .frontends
        .iter()
        .map(|c| c.addr.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a backend set has no candidate: the port name, the policy, or the endpoints' conditions.
fn why_no_candidate(port: &PortTranslation) -> (Link, String) {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &port.endpoints {
        if let Verdict::Excluded(x) = &d.verdict {
            *reasons.entry(x.code()).or_default() += 1;
        }
    }
    let port_missing = port.endpoints.iter().all(|d| {
        matches!(
            d.verdict,
            Verdict::Excluded(Exclusion::PortNameMissing { .. } | Exclusion::WrongFamily { .. })
        )
    });
    let summary = reasons
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    if port_missing && reasons.contains_key("port-name-missing") {
        (
            Link::Port,
            format!(
                "no slice has a {} port named {:?} (the Service port's name) for the target port {}",
                port.key.protocol, port.key.port_name, port.target_port
            ),
        )
    } else if port.endpoints.is_empty() {
        (Link::Endpoints, "no endpoint".into())
    } else if port.rule == Rule::NoLocalEndpoint {
        (
            Link::Candidates,
            format!(
                "internalTrafficPolicy is Local and no usable endpoint is on this node ({summary})"
            ),
        )
    } else {
        (
            Link::Candidates,
            format!("every endpoint is excluded ({summary})"),
        )
    }
}

impl Explanation {
    fn summarize_slices(&mut self, slices: &[&EndpointSlice]) {
        for s in slices {
            self.resource_versions.push(ObjectVersion {
                object: ObjectRef::slice(s.key.clone()),
                resource_version: s.resource_version.to_string(),
            });
            self.slices.push(SliceSummary {
                name: s.key.name.to_string(),
                resource_version: s.resource_version.to_string(),
                address_type: s.address_type.to_string(),
                ports: s
                    .ports
                    .iter()
                    .map(|p| {
                        let port = p.port.map_or_else(|| "-".into(), |n| n.to_string());
                        let name = if p.name.is_empty() {
                            "<unnamed>"
                        } else {
                            &p.name
                        };
                        format!("{name}={port}/{}", p.protocol)
                    })
                    .collect(),
                endpoints: s.endpoints.len(),
            });
        }
    }

    /// The resourceVersion `object` was read at, if the desired state came from it.
    pub fn resource_version(&self, object: &ObjectRef) -> Option<&str> {
        self.resource_versions
            .iter()
            .find(|v| v.object == *object)
            .map(|v| v.resource_version.as_str())
    }

    fn broken_at(mut self, link: Link, verdict: String) -> Self {
        self.broken = link;
        self.verdict = verdict;
        self
    }

    fn check_maps(
        &mut self,
        translation: &ServiceTranslation,
        maps: Option<(&MapSnapshot, Option<&IndexView>)>,
        conflicts: &[Conflict],
    ) {
        let mut checks: Vec<MapCheck> = Vec::new();
        for port in &translation.ports {
            for claim in &port.desired.frontends {
                let owned_by = conflicts.iter().find(|c| c.addr == claim.addr).cloned();
                // As the programs read the maps: the family's index first.
                let (reach, read_from) = maps.map_or((None, None), |(snapshot, index)| {
                    let (reach, read) = snapshot.reach_as_read(&claim.addr, index);
                    (reach, Some(ReadFrom::of(read, snapshot, &claim.addr)))
                });
                let held = reach.map(|reach| {
                    let mut b: Vec<SocketAddr> = reach.backends.into_iter().flatten().collect();
                    crate::vocab::canonical(&mut b);
                    b
                });
                checks.push(MapCheck {
                    frontend: claim.addr,
                    matches: owned_by.is_some() || held.as_ref() == Some(&port.desired.backends),
                    maps_backends: held,
                    desired_backends: port.desired.backends.clone(),
                    read_from,
                    owned_by,
                });
            }
        }
        checks.sort_by_key(|c| c.frontend);
        // Digests over the typed values in canonical order: the same content always gives the
        // same digest, however it was formatted or sorted as text.
        let mut desired_text = String::new();
        let mut maps_text = String::new();
        for c in checks.iter().filter(|c| c.owned_by.is_none()) {
            let _ = writeln!(desired_text, "{} {}", c.frontend, list(&c.desired_backends));
            let _ = writeln!(
                maps_text,
                "{} {}",
                c.frontend,
                c.maps_backends
                    .as_ref()
                    .map_or_else(|| "absent".into(), |b| list(b))
            );
        }
        self.desired_digest = hex(&Sha256::digest(desired_text.as_bytes()));
        self.maps_digest = hex(&Sha256::digest(maps_text.as_bytes()));
        self.maps = checks;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
