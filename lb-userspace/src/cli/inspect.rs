//! `socklb inspect`: the pinned maps, read-only.
use std::{fmt::Write as _, net::SocketAddr, process::ExitCode};

use clap::Subcommand;
use lb_common::{Counter, MapId};
use serde::{Deserialize, Serialize};

use super::{Output, PinArgs, print_output, table::Table};
use crate::{
    dataplane::{
        abi::backend_addr,
        bpf::{BpfServiceMaps, ReadOnlyMaps},
        dump::{self, ServiceView},
        loader::{ProgramView, attached_programs},
        maps::{IndexView, MapSnapshot, ServiceMaps as _},
        pins::PinFolder,
    },
    explain::ReadFrom,
    vocab::{ServiceAddr, ServicePortKey},
};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Output format.
    #[arg(
        short,
        long,
        value_enum,
        default_value_t,
        global = true,
        env = "SOCKLB_OUTPUT"
    )]
    pub output: Output,
    /// Only backend sets of Services in this namespace.
    #[arg(short = 'n', long, global = true, env = "SOCKLB_NAMESPACE")]
    pub namespace: Option<String>,
    /// The cgroup v2 directory the agent attaches to (`sockets`, `connections`: whose
    /// processes' network namespaces are walked; default: the cgroup2 mount).
    #[arg(long, global = true, env = "SOCKLB_CGROUP")]
    pub cgroup: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand, Debug)]
pub enum What {
    /// Frontends with their backend set and backends (optionally of one Service, by name).
    Services { name: Option<String> },
    /// What a connect to ADDR:PORT[/tcp|udp] would get.
    Lookup { target: String },
    /// The data path's counters (summed over CPUs) and every map's fill and memory.
    Stats,
    /// Session-affinity tables, by client cgroup.
    Affinity,
    /// Every socket socklb translated (its record lives in the socket's own storage).
    Sockets,
    /// Live connections per service and backend, with the backend's condition, grouped by
    /// client pod: TCP sockets by state and connected UDP sockets (optionally of one Service).
    Connections {
        /// NAMESPACE/NAME of one Service.
        service: Option<String>,
        /// Only connections to this backend (IP:PORT).
        #[arg(long, env = "SOCKLB_BACKEND")]
        backend: Option<SocketAddr>,
        /// The agent to ask (its metrics address): it knows each backend's condition and
        /// the client pods' names. Without an answer, the maps alone are read.
        #[arg(long, default_value = super::DEFAULT_METRICS_ADDRESS, env = "SOCKLB_AGENT")]
        agent: String,
    },
    /// The attached programs: instruction counts and the kernel's run counters.
    Programs,
    /// The outside path's rules (`--external-traffic nftables`) in this network namespace:
    /// each NodePort, load-balancer IP and externalIP, the Service port its rules serve, and
    /// the endpoints new flows go to.
    Outside,
}

impl InspectArgs {
    fn cgroup(&self) -> anyhow::Result<std::path::PathBuf> {
        match &self.cgroup {
            Some(c) => Ok(c.clone()),
            None => crate::dataplane::sysfs::cgroup2_mount().ok_or_else(|| {
                anyhow::anyhow!("no cgroup2 mount in /proc/self/mountinfo; pass --cgroup")
            }),
        }
    }
}

pub(super) fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    if matches!(args.what, What::Outside) {
        // The kernel's nftables tables: no pinned map needed.
        let frontends = outside_frontends()?;
        print_output(args.output, &frontends, || outside_text(&frontends))?;
        return Ok(ExitCode::SUCCESS);
    }
    let pins = PinFolder::new(&args.pins.pin_folder);
    let (dir, maps, mut snap) = read_current(&pins)?;
    let other = ReadOnlyMaps::new(&dir);
    let filter = |key: Option<&ServicePortKey>, name: Option<&str>| {
        args.namespace
            .as_deref()
            .is_none_or(|ns| key.is_some_and(|k| &*k.service.namespace == ns))
            && name.is_none_or(|n| key.is_some_and(|k| &*k.service.name == n))
    };
    match &args.what {
        What::Services { name } => {
            let views: Vec<ServiceView> = dump::services(&snap)
                .into_iter()
                .filter(|v| filter(v.service.as_ref(), name.as_deref()))
                .collect();
            print_output(args.output, &views, || services_table(&views))?;
        }
        What::Lookup { target } => {
            // A generation from before the index has none: its programs read the hash maps.
            let index = other.index_view().ok();
            if let Some(index) = &index {
                maps.read_index_ranges(&mut snap, index)?;
            }
            let lookup = lookup(&snap, index.as_ref(), target)?;
            print_output(args.output, &lookup, || lookup_text(&lookup))?;
        }
        What::Stats => {
            let stats = stats(&other, &maps, &snap)?;
            print_output(args.output, &stats, || stats_text(&stats))?;
        }
        What::Affinity => {
            let rows = affinity(&other, &snap)?;
            let rows: Vec<AffinityRow> = rows
                .into_iter()
                .filter(|r| filter(r.service.as_ref(), None))
                .collect();
            print_output(args.output, &rows, || affinity_text(&rows))?;
        }
        What::Sockets => {
            let rows = sockets(&pins, &args.cgroup()?, &snap)?;
            print_output(args.output, &rows, || sockets_text(&rows))?;
        }
        What::Connections {
            service,
            backend,
            agent,
        } => {
            let filter = crate::sockets::view::Filter {
                service: service.as_deref().map(crate::vocab::ObjectKey::parse),
                backend: *backend,
            };
            let view = connections(&pins, &args.cgroup()?, &snap, &filter, agent)?;
            print_output(args.output, &view, || connections_text(&view))?;
        }
        What::Programs => {
            let programs = attached_programs(&pins)?;
            print_output(args.output, &programs, || programs_text(&programs))?;
        }
        What::Outside => unreachable!("answered above"),
    }
    Ok(ExitCode::SUCCESS)
}

/// The current generation's maps and what they hold. A generation the agent replaces (its
/// maps grew) is removed once the programs use the new one: a read that loses its folder that
/// way reads the new one (a few times at most).
pub(super) fn read_current(
    pins: &PinFolder,
) -> anyhow::Result<(
    std::path::PathBuf,
    BpfServiceMaps,
    crate::dataplane::maps::MapSnapshot,
)> {
    let mut tries = 0;
    loop {
        let Some(dir) = pins.current() else {
            anyhow::bail!(
                "no socklb maps pinned under {} (is the agent running with --bpffs {}?)",
                pins.root.display(),
                pins.root.display()
            );
        };
        let read = BpfServiceMaps::open(&dir, true).and_then(|maps| {
            let snap = maps.read_all()?;
            Ok((maps, snap))
        });
        match read {
            Ok((maps, snap)) => return Ok((dir, maps, snap)),
            // Removed under us (its pins go before its folder): read the one now current.
            Err(_) if pins.current().as_deref() != Some(dir.as_path()) && tries < 5 => {
                tries += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Every frontend the outside path's tables hold, both families.
fn outside_frontends() -> anyhow::Result<Vec<crate::outside::evidence::Frontend>> {
    use crate::{outside::installed::InstalledTable, vocab::Family};
    let nft = crate::dataplane::nft::Nft::find()?;
    let mut out = Vec::new();
    for family in [Family::IPv4, Family::IPv6] {
        if let Some(json) = nft.list_json(family)? {
            out.extend(crate::outside::evidence::installed(
                &InstalledTable::parse(&json),
                family,
            ));
        }
    }
    Ok(out)
}

fn outside_text(frontends: &[crate::outside::evidence::Frontend]) -> String {
    if frontends.is_empty() {
        return "no outside-path rules in this network namespace\n".into();
    }
    let mut t = Table::new(["FAMILY", "FRONTEND", "SERVICE PORT", "SENDS TO"]);
    for f in frontends {
        let to = if f.endpoints.is_empty() {
            f.verdict.clone()
        } else {
            f.endpoints
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        t.row(vec![
            f.family.clone(),
            f.key.clone(),
            f.service_port.clone().unwrap_or_default(),
            to,
        ]);
    }
    t.render()
}

fn services_table(views: &[ServiceView]) -> String {
    let mut t = Table::new(["FRONTENDS", "SERVICE", "COUNT", "BACKENDS"]);
    for v in views {
        let backends = v.active_backends();
        for f in &v.frontends {
            let cell = if f.no_local_endpoint {
                "<none on this node: refused>".to_string()
            } else if f.count == 0 {
                "<none: connects refused>".to_string()
            } else {
                backends
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            t.row(vec![
                f.frontend.to_string(),
                v.service
                    .as_ref()
                    .map_or_else(|| format!("<id {}>", v.id), ToString::to_string),
                f.count.to_string(),
                cell,
            ]);
        }
    }
    t.render()
}

/// What a connect to one address would get.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lookup {
    pub frontend: ServiceAddr,
    pub service: Option<ServicePortKey>,
    /// Whether the address is a service frontend at all (connects to others are untouched).
    pub is_frontend: bool,
    pub verdict: String,
    /// The backends a connect chooses among, in slot order.
    pub candidates: Vec<SocketAddr>,
    pub affinity_timeout_s: Option<u32>,
    /// Where the programs find the frontend (its slot in its family's index, or the hash map and
    /// why), which is where `candidates` were read.
    pub read_from: ReadFrom,
}

fn lookup(snap: &MapSnapshot, index: Option<&IndexView>, target: &str) -> anyhow::Result<Lookup> {
    let frontend = ServiceAddr::parse(target)?;
    // As the programs read the maps: an IPv4 frontend's index copy first.
    let (reach, read) = snap.reach_as_read(&frontend, index);
    let read_from = ReadFrom::of(read, snap, &frontend);
    let Some(reach) = reach else {
        return Ok(Lookup {
            frontend,
            service: None,
            is_frontend: false,
            verdict: "not a service frontend: connect() is left untouched".into(),
            candidates: Vec::new(),
            affinity_timeout_s: None,
            read_from,
        });
    };
    let fe = reach.frontend;
    let verdict = if fe.count == 0 && fe.flags & lb_common::FRONTEND_FLAG_NO_LOCAL != 0 {
        "internalTrafficPolicy Local and no usable endpoint on this node: connect() fails with ECONNREFUSED".to_string()
    } else if fe.count == 0 {
        "no usable endpoint: connect() fails with ECONNREFUSED".to_string()
    } else {
        format!(
            "connect() goes to one of {} backend(s), chosen at random",
            fe.count
        )
    };
    Ok(Lookup {
        frontend,
        service: snap.service_port(reach.service_id),
        is_frontend: true,
        verdict,
        candidates: reach.backends.into_iter().flatten().collect(),
        affinity_timeout_s: (fe.flags & lb_common::FRONTEND_FLAG_AFFINITY != 0)
            .then_some(fe.affinity_timeout_s),
        read_from,
    })
}

fn lookup_text(l: &Lookup) -> String {
    let mut out = format!(
        "frontend  {}\nservice   {}\nverdict   {}\n",
        l.frontend,
        l.service
            .as_ref()
            .map_or_else(|| "-".into(), ToString::to_string),
        l.verdict
    );
    if let Some(t) = l.affinity_timeout_s {
        let _ = writeln!(out, "affinity  ClientIP, {t}s");
    }
    if l.is_frontend {
        let _ = writeln!(
            out,
            "read from {}",
            l.read_from.describe(l.frontend.family())
        );
    }
    for (i, c) in l.candidates.iter().enumerate() {
        let _ = writeln!(out, "  slot {i} -> {c}");
    }
    out
}

/// One map's fill, size and memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapStats {
    pub map: String,
    /// Entries in use, where the agent can know it without walking the map.
    pub entries: Option<u64>,
    pub capacity: u32,
    /// Bytes the kernel charges for the map (fdinfo `memlock`).
    pub memory_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    pub counters: Vec<(String, u64)>,
    pub maps: Vec<MapStats>,
}

fn stats(other: &ReadOnlyMaps, maps: &BpfServiceMaps, snap: &MapSnapshot) -> anyhow::Result<Stats> {
    let counters = other
        .counters()?
        .into_iter()
        .map(|(c, v)| (Counter::name(c).to_string(), v))
        .collect();
    let caps = maps.capacities();
    let used_backends: u64 = dump::services(snap)
        .iter()
        .map(|v| v.backends.len() as u64)
        .sum();
    let mut rows = Vec::new();
    for map in MapId::ALL {
        // A generation an older agent made may lack a map this one has.
        if !other.has(map) {
            continue;
        }
        let (capacity, memory_bytes) = other.footprint(map)?;
        let entries = match map {
            MapId::Backends => Some(used_backends),
            MapId::FrontendIndex | MapId::FrontendIndex6 => Some(other.index_held(map)?),
            _ => snap.entries(map).map(|n| n as u64),
        };
        rows.push(MapStats {
            map: map.name().to_string(),
            entries,
            capacity: if map.descriptor().capacity_flag.is_some() {
                caps.get(map).max(capacity)
            } else {
                capacity
            },
            memory_bytes,
        });
    }
    Ok(Stats {
        counters,
        maps: rows,
    })
}

fn stats_text(stats: &Stats) -> String {
    let mut t = Table::new(["COUNTER", "TOTAL"]);
    for (n, v) in &stats.counters {
        t.row(vec![n.clone(), v.to_string()]);
    }
    let mut m = Table::new(["MAP", "ENTRIES", "CAPACITY", "MEMORY"]);
    for s in &stats.maps {
        m.row(vec![
            s.map.clone(),
            s.entries.map_or_else(|| "-".into(), |e| e.to_string()),
            s.capacity.to_string(),
            format!("{:.1} KiB", s.memory_bytes as f64 / 1024.0),
        ]);
    }
    format!("{}\n{}", t.render(), m.render())
}

fn programs_text(programs: &[ProgramView]) -> String {
    let mut t = Table::new(["PROGRAM", "ID", "INSNS", "VERIFIED", "RUNS", "AVG NS"]);
    let opt = |v: Option<u32>| v.map_or_else(|| "-".into(), |v| v.to_string());
    for p in programs {
        let avg = if p.run_count == 0 {
            "-".to_string()
        } else {
            format!("{:.0}", p.run_time_ns as f64 / p.run_count as f64)
        };
        t.row(vec![
            p.name.clone(),
            p.id.to_string(),
            opt(p.instructions),
            opt(p.verified_instructions),
            p.run_count.to_string(),
            avg,
        ]);
    }
    t.render()
}

/// One destination of a translated socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SocketRow {
    pub cookie: u64,
    /// The client's cgroup id (the process that created the record).
    pub cgroup_id: u64,
    pub frontend: Option<ServiceAddr>,
    pub backend: Option<SocketAddr>,
    /// The backend set the frontend belongs to now (`None`: gone).
    pub service: Option<ServicePortKey>,
}

fn sockets(
    pins: &PinFolder,
    cgroup: &std::path::Path,
    snap: &MapSnapshot,
) -> anyhow::Result<Vec<SocketRow>> {
    use crate::sockets;
    let Some(socket_pins) = pins.current_sockets() else {
        anyhow::bail!("no socket maps pinned under {}", pins.root.display());
    };
    let listing = socket_pins.listing();
    let census = sockets::census(&socket_pins, cgroup, listing, !listing.global)?;
    for e in &census.stats.errors {
        eprintln!(
            "warning: {:#}",
            anyhow::Error::from(std::io::Error::other(e.to_string()))
        );
    }
    let mut rows = Vec::new();
    for socket in &census.sockets {
        for record in sockets::records(&socket.state) {
            let frontend = crate::dataplane::abi::service_addr(&record.frontend);
            rows.push(SocketRow {
                cookie: socket.cookie,
                cgroup_id: socket.state.cgroup_id,
                service: frontend
                    .and_then(|f| snap.reach(&f))
                    .and_then(|r| snap.service_port(r.service_id)),
                frontend,
                backend: backend_addr(&record.backend),
            });
        }
    }
    rows.sort_by_key(|r| (r.cookie, r.frontend));
    Ok(rows)
}

fn sockets_text(rows: &[SocketRow]) -> String {
    let mut t = Table::new(["COOKIE", "CGROUP", "FRONTEND", "BACKEND", "SERVICE"]);
    for r in rows {
        t.row(vec![
            r.cookie.to_string(),
            r.cgroup_id.to_string(),
            r.frontend.map_or_else(|| "-".into(), |f| f.to_string()),
            r.backend.map_or_else(|| "-".into(), |b| b.to_string()),
            r.service
                .as_ref()
                .map_or_else(|| "<gone>".into(), ToString::to_string),
        ]);
    }
    t.render()
}

/// The agent's view (it has the objects), or one from the maps alone when it does not answer.
fn connections(
    pins: &PinFolder,
    cgroup: &std::path::Path,
    snap: &MapSnapshot,
    filter: &crate::sockets::view::Filter,
    agent: &str,
) -> anyhow::Result<crate::sockets::view::ConnectionsView> {
    use crate::sockets::view;
    let mut query = Vec::new();
    if let Some(s) = &filter.service {
        query.push(format!("service={s}"));
    }
    if let Some(b) = filter.backend {
        query.push(format!("backend={b}"));
    }
    let path = format!("/connections?{}", query.join("&"));
    match super::agent_get(agent, &path, std::time::Duration::from_secs(10)) {
        Ok((200, body)) => {
            return serde_json::from_str(&body)
                .map_err(|e| anyhow::anyhow!("{agent}{path}: not a connections view: {e}"));
        }
        Ok((code, body)) => eprintln!(
            "note: the agent at {agent} answered HTTP {code}: {}",
            body.trim()
        ),
        Err(e) => eprintln!(
            "note: no agent at {agent} ({e:#}): conditions come from the maps alone (in-set, not-in-set)"
        ),
    }
    let Some(socket_pins) = pins.current_sockets() else {
        anyhow::bail!("no socket maps pinned under {}", pins.root.display());
    };
    Ok(view::connections(
        &socket_pins,
        cgroup,
        socket_pins.listing(),
        snap,
        &view::MapsOnly::new(snap),
        &view::cgroup_paths(cgroup),
        filter,
    )?)
}

fn connections_text(v: &crate::sockets::view::ConnectionsView) -> String {
    let mut out = String::new();
    for s in &v.services {
        let name = s
            .service
            .as_ref()
            .map_or_else(|| "<service gone>".to_string(), ToString::to_string);
        let frontends: Vec<String> = s.frontends.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "{name} (dialled as {})", frontends.join(", "));
        for b in &s.backends {
            let mut kinds: Vec<String> = b
                .tcp
                .iter()
                .map(|(st, n)| format!("TCP {st} {n}"))
                .collect();
            if b.udp > 0 {
                kinds.push(format!("UDP connected {}", b.udp));
            }
            let clients = b.clients.len();
            let _ = writeln!(
                out,
                "  {:<24} {:<20} {} connection{} from {clients} client{} ({})",
                b.backend.to_string(),
                b.condition.to_string(),
                b.total(),
                if b.total() == 1 { "" } else { "s" },
                if clients == 1 { "" } else { "s" },
                kinds.join(", ")
            );
            for c in &b.clients {
                let who = match (&c.pod, &c.pod_uid) {
                    (Some(pod), _) => format!("pod {pod}"),
                    (None, Some(uid)) => format!("pod uid {uid}"),
                    (None, None) => format!("cgroup {}", c.cgroup.as_deref().unwrap_or("?")),
                };
                let _ = writeln!(
                    out,
                    "      {who}: {} socket{}{}",
                    c.total,
                    if c.total == 1 { "" } else { "s" },
                    c.oldest_s
                        .map(|a| format!(", oldest {a:.0}s"))
                        .unwrap_or_default()
                );
            }
        }
    }
    if v.services.is_empty() {
        out.push_str("no live translated connections\n");
    }
    for m in &v.missing {
        let _ = writeln!(out, "not listed here: {m}");
    }
    for e in &v.errors {
        let _ = writeln!(out, "could not read: {e}");
    }
    if !v.conditions_from_objects {
        out.push_str("(conditions from the maps alone; ask the agent for ready/terminating)\n");
    }
    out
}

/// One remembered affinity choice.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AffinityRow {
    /// The client's cgroup id (its table).
    pub cgroup: u64,
    pub netns_cookie: u64,
    pub service: Option<ServicePortKey>,
    pub backend: Option<SocketAddr>,
    pub idle_s: f64,
}

/// How many client tables inspect reads at most (a bounded walk).
const AFFINITY_LIMIT: usize = 4096;

fn affinity(other: &ReadOnlyMaps, snap: &MapSnapshot) -> anyhow::Result<Vec<AffinityRow>> {
    // The clock the programs stamp an entry's last use with.
    let now =
        u64::try_from(crate::dataplane::sys::record_clock_now().as_nanos()).unwrap_or(u64::MAX);
    let mut rows = Vec::new();
    for (cgroup, table) in other.affinity(AFFINITY_LIMIT)? {
        for e in table.entries.iter().filter(|e| e.service_id != 0) {
            rows.push(AffinityRow {
                cgroup,
                netns_cookie: e.netns_cookie,
                service: snap.service_port(e.service_id),
                backend: backend_addr(&e.backend),
                idle_s: now.saturating_sub(e.last_used_ns) as f64 / 1e9,
            });
        }
    }
    Ok(rows)
}

fn affinity_text(rows: &[AffinityRow]) -> String {
    let mut t = Table::new(["CGROUP", "NETNS", "SERVICE", "BACKEND", "IDLE"]);
    for r in rows {
        t.row(vec![
            r.cgroup.to_string(),
            r.netns_cookie.to_string(),
            r.service
                .as_ref()
                .map_or_else(|| "<gone>".into(), ToString::to_string),
            r.backend.map_or_else(|| "-".into(), |b| b.to_string()),
            format!("{:.1}s", r.idle_s),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_counter_has_a_distinct_name() {
        let mut names: Vec<&str> = lb_common::Counter::ALL
            .iter()
            .map(|c| lb_common::Counter::name(*c))
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), lb_common::Counter::ALL.len());
    }
}
