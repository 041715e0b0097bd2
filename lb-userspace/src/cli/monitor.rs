//! `socklb monitor`: the data path's decisions as they happen, one line each (as `cilium
//! monitor` shows Cilium's): the client (its cgroup, and the pod UID in its path), the Service
//! and the address it dialled, the backend chosen or the refusal and its reason. The programs
//! write decisions only while a monitor runs; decisions dropped because the stream's buffer was
//! full are counted and said.
use std::{
    collections::HashMap,
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_common::Counter;
use serde::{Deserialize, Serialize};

use super::{Output, PinArgs};
use crate::{
    dataplane::{
        bpf::ReadOnlyMaps,
        events::{Reader, Seen},
        maps::MapSnapshot,
        pins::PinFolder,
        sys::monotonic_now,
    },
    sockets::view::{cgroup_paths, pod_uid},
    vocab::{ObjectKey, ServicePortKey},
};

#[derive(clap::Args, Debug)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Only decisions for this Service (NAMESPACE/NAME).
    #[arg(long, env = "SOCKLB_SERVICE")]
    pub service: Option<String>,
    /// Only decisions for this pod's processes (its UID, as in its cgroup's path).
    #[arg(long, env = "SOCKLB_POD")]
    pub pod: Option<String>,
    /// The cgroup v2 root, where clients' cgroups are named (default: the cgroup2 mount).
    #[arg(long, env = "SOCKLB_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Stop after this many decisions (shown ones).
    #[arg(long, env = "SOCKLB_MONITOR_COUNT")]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, env = "SOCKLB_MONITOR_SECONDS")]
    pub seconds: Option<u64>,
    /// Output: table (a line per decision) or json (an object per line).
    #[arg(short, long, value_enum, default_value_t, env = "SOCKLB_OUTPUT")]
    pub output: Output,
}

/// One line of `-o json`: a decision, or a count of decisions dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MonitorLine {
    Decision(Box<Shown>),
    Dropped {
        /// Decisions the programs could not write since the last line of this kind.
        dropped: u64,
    },
}

/// A decision as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    /// Wall-clock time of the decision.
    pub time: jiff::Timestamp,
    #[serde(flatten)]
    pub seen: Seen,
    /// The backend set of the address dialled (`None`: gone from the maps since).
    pub service: Option<ServicePortKey>,
    /// The client's cgroup, below the cgroup root.
    pub cgroup: Option<String>,
    pub pod_uid: Option<String>,
}

pub(super) fn run(args: &MonitorArgs) -> anyhow::Result<ExitCode> {
    let pins = PinFolder::new(&args.pins.pin_folder);
    let maps_dir = pins
        .current()
        .with_context(|| format!("no socklb maps pinned under {}", pins.root.display()))?;
    let service = args.service.as_deref().map(ObjectKey::parse);
    let root = args
        .cgroup
        .clone()
        .or_else(crate::dataplane::sysfs::cgroup2_mount)
        .context("no cgroup2 mount found; give --cgroup")?;
    let mut reader = Reader::open(&maps_dir).map_err(|e| match e {
        crate::dataplane::events::ReaderError::Busy => anyhow::Error::from(e),
        crate::dataplane::events::ReaderError::Map(m) => anyhow::Error::from(m).context(
            "opening the decision stream (EVENTS, MONITOR); an agent older than this socklb has none",
        ),
    })?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let mut names = Names::new(maps_dir.clone(), root);
    let counters = ReadOnlyMaps::new(&maps_dir);
    let dropped_at_start = dropped(&counters);
    let mut dropped_said = dropped_at_start;
    let started = Instant::now();
    let mut claimed = Instant::now();
    let mut shown = 0u64;
    // Said once the stream is claimed: from here on every decision is seen.
    eprintln!("socklb monitor: reading the data path's decisions (Ctrl-C to stop)");
    while !stop.load(Ordering::Relaxed)
        && args.count.is_none_or(|n| shown < n)
        && args
            .seconds
            .is_none_or(|s| started.elapsed() < Duration::from_secs(s))
    {
        if claimed.elapsed() >= Duration::from_secs(1) {
            reader.claim()?;
            claimed = Instant::now();
            let now = dropped(&counters);
            if now > dropped_said {
                print_dropped(args.output, now - dropped_said)?;
                dropped_said = now;
            }
        }
        let mut lines = Vec::new();
        reader.read(Duration::from_millis(50), |seen| lines.push(seen))?;
        for seen in lines {
            if args.count.is_some_and(|n| shown >= n) {
                break;
            }
            let line = names.show(seen);
            if service
                .as_ref()
                .is_some_and(|s| line.service.as_ref().is_none_or(|k| &k.service != s))
                || args
                    .pod
                    .as_ref()
                    .is_some_and(|p| line.pod_uid.as_ref() != Some(p))
            {
                continue;
            }
            shown += 1;
            print_line(args.output, &line)?;
        }
    }
    reader.release()?;
    let now = dropped(&counters);
    if now > dropped_said {
        print_dropped(args.output, now - dropped_said)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The data path's count of dropped decisions.
fn dropped(counters: &ReadOnlyMaps) -> u64 {
    counters
        .counters()
        .ok()
        .and_then(|all| {
            all.into_iter()
                .find(|(c, _)| *c == Counter::EventsDropped)
                .map(|(_, n)| n)
        })
        .unwrap_or(0)
}

fn print_dropped(output: Output, n: u64) -> anyhow::Result<()> {
    match output {
        Output::Json | Output::Yaml => println!(
            "{}",
            serde_json::to_string(&MonitorLine::Dropped { dropped: n })?
        ),
        Output::Table => {
            eprintln!("socklb monitor: {n} decision(s) dropped (the stream's buffer was full)");
        }
    }
    Ok(())
}

fn print_line(output: Output, line: &Shown) -> anyhow::Result<()> {
    match output {
        Output::Json | Output::Yaml => println!(
            "{}",
            serde_json::to_string(&MonitorLine::Decision(Box::new(line.clone())))?
        ),
        Output::Table => println!("{}", text(line)),
    }
    Ok(())
}

impl Shown {
    /// The decision in words, as the table output shows it.
    pub fn describe(&self) -> String {
        text(self)
    }
}

/// One decision in words.
fn text(line: &Shown) -> String {
    let client = match (&line.pod_uid, &line.cgroup) {
        (Some(uid), _) => format!("pod {uid}"),
        (None, Some(path)) => format!("cgroup {path}"),
        (None, None) => format!("cgroup #{}", line.seen.cgroup_id),
    };
    let service = line.service.as_ref().map_or_else(
        || format!("service #{}", line.seen.service_id),
        ToString::to_string,
    );
    let time = line.time.strftime("%H:%M:%S%.3f");
    let to = match (line.seen.backend, line.seen.decision.refused()) {
        (Some(b), false) => format!("-> {b} ({})", line.seen.decision.name()),
        _ => line.seen.decision.name().to_string(),
    };
    format!(
        "{time} {:<7} {client}  {service}  {}  {to}",
        line.seen.hook, line.seen.frontend
    )
}

/// Names for what the events carry as numbers: service ids (from `SERVICE_META`) and cgroup ids
/// (the cgroup tree), each read again when an unknown one comes.
struct Names {
    maps_dir: PathBuf,
    root: PathBuf,
    services: HashMap<u32, ServicePortKey>,
    cgroups: HashMap<u64, PathBuf>,
    read_at: Option<Instant>,
    /// Monotonic ↔ wall clock, for the decisions' times.
    offset: (Duration, jiff::Timestamp),
}

impl Names {
    fn new(maps_dir: PathBuf, root: PathBuf) -> Self {
        Self {
            maps_dir,
            root,
            services: HashMap::new(),
            cgroups: HashMap::new(),
            read_at: None,
            offset: (monotonic_now(), jiff::Timestamp::now()),
        }
    }

    fn show(&mut self, seen: Seen) -> Shown {
        if !self.services.contains_key(&seen.service_id)
            || !self.cgroups.contains_key(&seen.cgroup_id)
        {
            self.refresh();
        }
        let path = self.cgroups.get(&seen.cgroup_id);
        let at = Duration::from_nanos(seen.at_ns);
        let (mono, wall) = self.offset;
        let time = match at.checked_sub(mono) {
            Some(after) => wall + after,
            None => wall - mono.saturating_sub(at),
        };
        Shown {
            time,
            service: self.services.get(&seen.service_id).cloned(),
            cgroup: path.map(|p| format!("/{}", p.display())),
            pod_uid: path.and_then(|p| pod_uid(p)),
            seen,
        }
    }

    /// Reads the names again, at most once a second.
    fn refresh(&mut self) {
        if self
            .read_at
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.read_at = Some(Instant::now());
        self.cgroups = cgroup_paths(&self.root);
        if let Ok(maps) = crate::dataplane::bpf::BpfServiceMaps::open(&self.maps_dir, true) {
            use crate::dataplane::maps::ServiceMaps as _;
            if let Ok(snap) = maps.read_all() {
                self.services = services(&snap);
            }
        }
    }
}

fn services(snap: &MapSnapshot) -> HashMap<u32, ServicePortKey> {
    snap.meta
        .keys()
        .filter_map(|id| Some((*id, snap.service_port(*id)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dataplane::events::Decision, vocab::ServiceAddr};

    #[test]
    fn a_refusal_reads_as_one() {
        let line = Shown {
            time: jiff::Timestamp::UNIX_EPOCH,
            seen: Seen {
                at_ns: 1,
                hook: "connect".into(),
                protocol: crate::vocab::Protocol::Tcp,
                cgroup_id: 7,
                frontend: ServiceAddr::parse("10.96.0.11:80").expect("address"),
                service_id: 3,
                backend: None,
                decision: Decision::NoBackend,
            },
            service: None,
            cgroup: Some("/pod-a".into()),
            pod_uid: None,
        };
        let t = text(&line);
        assert!(t.contains("refused: no endpoint (ECONNREFUSED)"), "{t}");
        assert!(
            t.contains("cgroup /pod-a") && t.contains("10.96.0.11:80"),
            "{t}"
        );
        let json =
            serde_json::to_string(&MonitorLine::Decision(Box::new(line.clone()))).expect("json");
        let back: MonitorLine = serde_json::from_str(&json).expect("read back");
        assert_eq!(back, MonitorLine::Decision(Box::new(line)));
        assert!(matches!(
            serde_json::from_str::<MonitorLine>("{\"dropped\":3}").expect("dropped"),
            MonitorLine::Dropped { dropped: 3 }
        ));
    }
}
