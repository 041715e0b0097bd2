//! Live translated connections for people: per service port and backend, the backend's
//! condition, the TCP sockets by state and the connected UDP sockets, grouped by client pod
//! (its cgroup, the pod UID in the cgroup's path, and its name where the caller knows it), each
//! socket with its age. Pure: a census and the maps' snapshot in, a view out; the backend's
//! condition and the client's name come from the caller (the agent and `explain` have the
//! cluster's objects, `inspect` alone only the maps). Counted as the census streams by
//! (`Tally`) and grouped without IO (`summarize`); `connections` lists and groups in one go.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::listing::{CensusStats, LiveSocket, records};
use crate::{
    dataplane::{
        abi::{backend_addr, service_addr},
        maps::MapSnapshot,
        sock_diag,
    },
    vocab::{ObjectKey, Protocol, ServiceAddr, ServicePortKey},
};

/// A backend's condition, from the service's EndpointSlices (or, with the maps alone, whether
/// the backend set holds it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    Ready,
    /// Terminating and still serving: chosen only while no endpoint is ready (KEP-1669).
    ServingTerminating,
    /// Terminating, not serving: no new connection reaches it.
    Terminating,
    /// In a slice, not ready, not terminating.
    NotReady,
    /// In no slice of the service any more.
    Gone,
    /// Only the maps were read: the backend set holds it.
    InSet,
    /// Only the maps were read: the backend set no longer holds it.
    NotInSet,
}

impl Condition {
    /// New connections can no longer reach it: what remains drains.
    pub fn draining(self) -> bool {
        matches!(self, Self::Terminating | Self::Gone | Self::NotInSet)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::ServingTerminating => "serving-terminating",
            Self::Terminating => "terminating",
            Self::NotReady => "not-ready",
            Self::Gone => "gone",
            Self::InSet => "in-set",
            Self::NotInSet => "not-in-set",
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which connections to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub service: Option<ObjectKey>,
    pub backend: Option<SocketAddr>,
}

/// Every connection the census found, grouped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsView {
    pub services: Vec<ServiceConnections>,
    /// Pod network namespaces walked.
    pub namespaces: usize,
    /// Namespaces that could not be read.
    pub errors: Vec<String>,
    /// What this view cannot show on this node (named losses).
    pub missing: Vec<String>,
    /// Conditions come from the cluster's objects (`false`: from the maps alone).
    pub conditions_from_objects: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceConnections {
    /// The backend set the connections went through (`None`: it is gone from the maps).
    pub service: Option<ServicePortKey>,
    /// The service addresses the clients dialled.
    pub frontends: Vec<ServiceAddr>,
    pub backends: Vec<BackendConnections>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendConnections {
    pub backend: SocketAddr,
    pub condition: Condition,
    /// TCP sockets by state (`ESTABLISHED`, `CLOSE_WAIT`, ...).
    pub tcp: BTreeMap<String, usize>,
    /// Connected UDP sockets.
    pub udp: usize,
    pub clients: Vec<ClientConnections>,
}

impl BackendConnections {
    pub fn total(&self) -> usize {
        self.tcp.values().sum::<usize>() + self.udp
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientConnections {
    /// The cgroup v2 id of the client: its pod's cgroup (a process outside pods: its own).
    pub cgroup_id: u64,
    /// Its path below the cgroup root, when found.
    pub cgroup: Option<String>,
    /// The pod UID in that path (kubelet's cgroup layout), when there is one.
    pub pod_uid: Option<String>,
    /// `namespace/name`, where the caller knows the pod (by its address).
    pub pod: Option<String>,
    /// The client's connections to this backend.
    pub total: usize,
    /// The age of its oldest one, in seconds.
    pub oldest_s: Option<f64>,
    /// The oldest few of them (at most `SAMPLE`), each with its details.
    pub sockets: Vec<SocketSummary>,
}

/// Sockets listed one by one per client and backend; the others are only counted.
pub const SAMPLE: usize = 16;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SocketSummary {
    pub cookie: u64,
    pub protocol: Protocol,
    /// `ESTABLISHED`, ... for TCP; `connected` for UDP.
    pub state: String,
    /// The client's own address.
    pub local: SocketAddr,
    pub frontend: Option<ServiceAddr>,
    /// Since the socket was first translated, in seconds.
    pub age_s: Option<f64>,
}

/// What the caller knows of the cluster, for the view.
pub trait Cluster {
    /// The condition of `backend` in `service`'s EndpointSlices.
    fn condition(&self, service: Option<&ServicePortKey>, backend: SocketAddr) -> Condition;
    /// The pods with these addresses, `namespace/name`, by address.
    fn pods_at(&self, ips: &HashSet<IpAddr>) -> HashMap<IpAddr, String>;
    /// Conditions come from objects, not from the maps alone.
    fn has_objects(&self) -> bool;
}

/// Conditions from the maps alone: whether the backend set holds the backend now.
pub struct MapsOnly {
    held: HashMap<ServicePortKey, Vec<SocketAddr>>,
}

impl MapsOnly {
    pub fn new(snapshot: &MapSnapshot) -> Self {
        let mut held: HashMap<ServicePortKey, Vec<SocketAddr>> = HashMap::new();
        for frontend in snapshot.frontends.values() {
            if let Some(key) = snapshot.service_port(frontend.service_id) {
                let list = held.entry(key).or_default();
                for b in snapshot.range(frontend).into_iter().flatten() {
                    if !list.contains(&b) {
                        list.push(b);
                    }
                }
            }
        }
        Self { held }
    }
}

impl Cluster for MapsOnly {
    fn condition(&self, service: Option<&ServicePortKey>, backend: SocketAddr) -> Condition {
        let held = service
            .and_then(|k| self.held.get(k))
            .is_some_and(|list| list.contains(&backend));
        if held {
            Condition::InSet
        } else {
            Condition::NotInSet
        }
    }

    fn pods_at(&self, _ips: &HashSet<IpAddr>) -> HashMap<IpAddr, String> {
        HashMap::new()
    }

    fn has_objects(&self) -> bool {
        false
    }
}

/// The name `sock_diag` and `ss` give a TCP state number.
pub fn tcp_state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => "UNKNOWN",
    }
}

/// The cgroup directories below `root`, by id (a cgroup v2 id is its directory's inode).
pub fn cgroup_paths(root: &Path) -> HashMap<u64, PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(meta) = std::fs::metadata(&dir) {
            out.insert(
                meta.ino(),
                dir.strip_prefix(root).unwrap_or(&dir).to_path_buf(),
            );
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    out
}

/// The cgroup a client is shown as: its pod's, when its own lies inside a pod's cgroup. A TCP
/// connection in a `CONNECTIONS` slot names the process's own (container) cgroup, every other
/// record names the pod, so without this one pod would be two clients of the same backend.
fn pod_level<S: std::hash::BuildHasher>(
    cgroup_id: u64,
    cgroups: &HashMap<u64, PathBuf, S>,
    by_path: &HashMap<&Path, u64>,
) -> u64 {
    let Some(path) = cgroups.get(&cgroup_id) else {
        return cgroup_id;
    };
    let mut prefix = PathBuf::new();
    for c in path.components() {
        prefix.push(c);
        if pod_uid(Path::new(c.as_os_str())).is_some() {
            return by_path.get(prefix.as_path()).copied().unwrap_or(cgroup_id);
        }
    }
    cgroup_id
}

/// The pod UID in a kubelet cgroup path: `.../pod<uid>/...` (cgroupfs driver) or
/// `...-pod<uid with _>.slice/...` (systemd driver).
pub fn pod_uid(path: &Path) -> Option<String> {
    path.components().rev().find_map(|c| {
        let name = c.as_os_str().to_str()?;
        let name = name.strip_suffix(".slice").unwrap_or(name);
        let at = name.rfind("pod")?;
        let uid = name[at + 3..].replace('_', "-");
        let dashes = uid.matches('-').count();
        (uid.len() == 36
            && dashes == 4
            && uid.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-'))
        .then_some(uid)
    })
}

/// The census's live connections (TCP sockets in any state, connected UDP sockets), counted
/// as they stream by, by the address dialled, backend and client: its size grows with those,
/// not with the sockets.
#[derive(Debug, Default)]
pub struct Tally {
    connections: BTreeMap<(Option<ServiceAddr>, SocketAddr, u64), Client>,
    now: Duration,
}

/// One client's connections to one backend through one address.
#[derive(Debug, Default)]
struct Client {
    tcp: BTreeMap<&'static str, usize>,
    udp: usize,
    /// The oldest `SAMPLE`, by age.
    sample: Vec<SocketSummary>,
}

impl Tally {
    /// `now` is `CLOCK_MONOTONIC_COARSE`, the records' clock (see `record_clock_now`).
    pub fn new(now: Duration) -> Self {
        Self {
            connections: BTreeMap::new(),
            now,
        }
    }

    /// Counts one socket (unconnected UDP sockets and sockets without a kernel view are no
    /// connection).
    pub fn add(&mut self, socket: &LiveSocket) {
        let Some((backend, frontend, state, summary)) = connection(socket, self.now) else {
            return;
        };
        let client = self
            .connections
            .entry((frontend, backend, socket.state.cgroup_id))
            .or_default();
        match socket.protocol {
            Protocol::Tcp => *client.tcp.entry(state).or_default() += 1,
            Protocol::Udp => client.udp += 1,
        }
        // Keep the oldest: a sample of sockets still open long after the others.
        let age = |s: &SocketSummary| s.age_s.unwrap_or(0.0);
        if client.sample.len() < SAMPLE {
            client.sample.push(summary);
        } else if let Some(youngest) = client
            .sample
            .iter_mut()
            .min_by(|a, b| age(a).total_cmp(&age(b)))
            && age(youngest) < age(&summary)
        {
            *youngest = summary;
        }
    }
}

/// Groups the counted connections by service port, backend and client.
pub fn summarize<S: std::hash::BuildHasher>(
    tally: Tally,
    stats: &CensusStats,
    snapshot: &MapSnapshot,
    cluster: &dyn Cluster,
    cgroups: &HashMap<u64, PathBuf, S>,
    filter: &Filter,
) -> ConnectionsView {
    let mut backends: BTreeMap<BackendKey, (Vec<ServiceAddr>, BTreeMap<u64, Client>)> =
        BTreeMap::new();
    let by_path: HashMap<&Path, u64> = cgroups.iter().map(|(id, p)| (p.as_path(), *id)).collect();
    for ((frontend, backend, cgroup_id), client) in tally.connections {
        let cgroup_id = pod_level(cgroup_id, cgroups, &by_path);
        let service = frontend
            .and_then(|f| snapshot.reach(&f))
            .and_then(|r| snapshot.service_port(r.service_id));
        if filter
            .service
            .as_ref()
            .is_some_and(|s| service.as_ref().is_none_or(|k| &k.service != s))
            || filter.backend.is_some_and(|b| b != backend)
        {
            continue;
        }
        let entry = backends.entry((service, backend)).or_default();
        if let Some(f) = frontend
            && !entry.0.contains(&f)
        {
            entry.0.push(f);
        }
        let merged = entry.1.entry(cgroup_id).or_default();
        for (state, n) in client.tcp {
            *merged.tcp.entry(state).or_default() += n;
        }
        merged.udp += client.udp;
        merged.sample.extend(client.sample);
    }
    let asked: HashSet<IpAddr> = backends
        .values()
        .flat_map(|(_, clients)| clients.values())
        .flat_map(|c| c.sample.iter().map(|s| s.local.ip()))
        .collect();
    let pods = cluster.pods_at(&asked);
    let mut services: BTreeMap<Option<ServicePortKey>, ServiceConnections> = BTreeMap::new();
    for ((service, backend), (frontends, clients)) in backends {
        let condition = cluster.condition(service.as_ref(), backend);
        let mut tcp = BTreeMap::new();
        let mut udp = 0;
        let clients = clients
            .into_iter()
            .map(|(cgroup_id, client)| {
                for (state, n) in &client.tcp {
                    *tcp.entry((*state).to_string()).or_default() += n;
                }
                udp += client.udp;
                let mut sockets = client.sample;
                sockets.sort_by(|a, b| {
                    b.age_s
                        .unwrap_or(0.0)
                        .total_cmp(&a.age_s.unwrap_or(0.0))
                        .then(a.cookie.cmp(&b.cookie))
                });
                sockets.truncate(SAMPLE);
                let path = cgroups.get(&cgroup_id);
                ClientConnections {
                    cgroup_id,
                    cgroup: path.map(|p| format!("/{}", p.display())),
                    pod_uid: path.and_then(|p| pod_uid(p)),
                    pod: sockets
                        .first()
                        .and_then(|s| pods.get(&s.local.ip()).cloned()),
                    total: client.tcp.values().sum::<usize>() + client.udp,
                    oldest_s: sockets.first().and_then(|s| s.age_s),
                    sockets,
                }
            })
            .collect();
        let svc = services
            .entry(service.clone())
            .or_insert_with(|| ServiceConnections {
                service,
                frontends: Vec::new(),
                backends: Vec::new(),
            });
        for f in frontends {
            if !svc.frontends.contains(&f) {
                svc.frontends.push(f);
            }
        }
        svc.backends.push(BackendConnections {
            backend,
            condition,
            tcp,
            udp,
            clients,
        });
    }
    ConnectionsView {
        services: services.into_values().collect(),
        namespaces: stats.namespaces,
        errors: stats.errors.iter().map(ToString::to_string).collect(),
        missing: missing(stats),
        conditions_from_objects: cluster.has_objects(),
    }
}

/// Lists and groups in one go: the census streams into a tally.
pub fn connections<S: std::hash::BuildHasher>(
    pins: &crate::dataplane::pins::SocketPins,
    cgroup: &Path,
    listing: crate::dataplane::features::Listing,
    snapshot: &MapSnapshot,
    cluster: &dyn Cluster,
    cgroups: &HashMap<u64, PathBuf, S>,
    filter: &Filter,
) -> Result<ConnectionsView, super::listing::ListError> {
    let mut tally = Tally::new(crate::dataplane::sys::record_clock_now());
    let stats = super::listing::census_each(pins, cgroup, listing, true, |s| tally.add(&s))?;
    Ok(summarize(tally, &stats, snapshot, cluster, cgroups, filter))
}

/// What the listing could not see, in words.
fn missing(stats: &CensusStats) -> Vec<String> {
    let Some(listing) = stats.listing else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if !listing.tcp() {
        out.push(
            "TCP sockets: this kernel lets socklb read neither the sockets iterator nor sock_diag's socket storage"
                .to_string(),
        );
    }
    if !listing.udp() {
        out.push(
            "UDP sockets: this kernel lets socklb read neither the sockets iterator nor the UDP iterator"
                .to_string(),
        );
    }
    out
}

/// A backend of a backend set (`None`: the set is gone from the maps).
type BackendKey = (Option<ServicePortKey>, SocketAddr);

/// One socket as a connection: its backend, the address it dialled, its state's name and its
/// summary. `None` for sockets that are no connection (unconnected UDP, no kernel view).
fn connection(
    socket: &LiveSocket,
    now: Duration,
) -> Option<(SocketAddr, Option<ServiceAddr>, &'static str, SocketSummary)> {
    let kernel = socket.kernel.as_ref()?;
    let state = match socket.protocol {
        Protocol::Tcp => tcp_state_name(kernel.state),
        Protocol::Udp if kernel.state == sock_diag::TCP_ESTABLISHED => "connected",
        Protocol::Udp => return None,
    };
    let record = records(&socket.state).find(|r| backend_addr(&r.backend) == Some(kernel.peer))?;
    let frontend = service_addr(&record.frontend);
    let created = Duration::from_nanos(socket.state.created_ns);
    let age_s = (socket.state.created_ns != 0)
        .then(|| now.checked_sub(created))
        .flatten()
        .map(|age| age.as_secs_f64());
    Some((
        kernel.peer,
        frontend,
        state,
        SocketSummary {
            cookie: socket.cookie,
            protocol: socket.protocol,
            state: state.to_string(),
            local: kernel.local,
            frontend,
            age_s,
        },
    ))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use std::{collections::HashMap, path::PathBuf};

    use super::{pod_level, pod_uid};

    /// A container's cgroup and its pod's are one client (the pod's); cgroups outside pods, or
    /// not found, stay as they are.
    #[test]
    fn a_containers_cgroup_is_shown_as_its_pods() {
        let pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_1111_2222_3333_444455556666.slice";
        let cgroups: HashMap<u64, PathBuf> = [
            (10, PathBuf::from(pod)),
            (11, Path::new(pod).join("cri-containerd-1234.scope")),
            (20, PathBuf::from("system.slice/sshd.service")),
        ]
        .into_iter()
        .collect();
        let by_path: HashMap<&Path, u64> =
            cgroups.iter().map(|(id, p)| (p.as_path(), *id)).collect();
        assert_eq!(pod_level(11, &cgroups, &by_path), 10);
        assert_eq!(pod_level(10, &cgroups, &by_path), 10);
        assert_eq!(pod_level(20, &cgroups, &by_path), 20);
        assert_eq!(pod_level(99, &cgroups, &by_path), 99);
    }

    #[test]
    fn pod_uids_in_both_cgroup_drivers() {
        assert_eq!(
            pod_uid(Path::new(
                "kubepods/burstable/pod0a1b2c3d-1111-2222-3333-444455556666/abcdef"
            ))
            .as_deref(),
            Some("0a1b2c3d-1111-2222-3333-444455556666")
        );
        assert_eq!(
            pod_uid(Path::new(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_1111_2222_3333_444455556666.slice/cri-containerd-1234.scope"
            ))
            .as_deref(),
            Some("0a1b2c3d-1111-2222-3333-444455556666")
        );
        assert_eq!(pod_uid(Path::new("system.slice/sshd.service")), None);
        assert_eq!(pod_uid(Path::new("slb1x00/podx")), None);
    }
}
