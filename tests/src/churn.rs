//! Endpoints rolling under load, and the check that every connect landed on an endpoint that
//! was a candidate at that moment.
//!
//! Each change of the endpoint set is recorded with the wall-clock time its manifest was written
//! and the time the maps were seen to hold it. A state may be in effect from the moment it was
//! written until the next state was seen in the maps; a connect (with its own start and end
//! times) is correct if its backend belongs to some state that may have been in effect while it
//! ran.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use socklb::{
    dataplane::{bpf::BpfServiceMaps, maps::ServiceMaps as _, pins::PinFolder},
    vocab::ServiceAddr,
};

use crate::{
    Sandbox,
    manifests::{Ep, slice},
};

pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One endpoint set, when it was written and when the maps held it.
#[derive(Clone, Debug)]
pub struct State {
    pub written_ns: u64,
    pub converged_ns: u64,
    pub backends: BTreeSet<String>,
}

/// A small deterministic random source (xorshift), seeded and printed for reproduction.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn from_time() -> Self {
        let seed = wall_ns();
        eprintln!("random seed {seed}");
        Self::new(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo).max(1))
    }
}

/// Rolls a service's endpoints over a pool of backend pods and keeps the timeline.
pub struct Roller<'s> {
    sandbox: &'s Sandbox,
    service: String,
    port: u16,
    pool: Vec<SocketAddr>,
    frontend: ServiceAddr,
    maps: BpfServiceMaps,
    current: Vec<usize>,
    pub timeline: Vec<State>,
}

impl<'s> Roller<'s> {
    /// `pool` holds twice the service's size: a rolling update moves the set from one half to
    /// the other. The maps must already hold `initial`.
    pub fn new(
        sandbox: &'s Sandbox,
        service: &str,
        frontend: ServiceAddr,
        pool: Vec<SocketAddr>,
        initial: Vec<usize>,
    ) -> anyhow::Result<Self> {
        let dir = PinFolder::new(sandbox.pin_folder())
            .current()
            .context("no pinned maps")?;
        let maps = BpfServiceMaps::open(&dir, true)?;
        let port = pool.first().context("an empty pool")?.port();
        let mut roller = Self {
            sandbox,
            service: service.to_string(),
            port,
            pool,
            frontend,
            maps,
            current: Vec::new(),
            timeline: Vec::new(),
        };
        roller.apply(initial)?;
        Ok(roller)
    }

    fn names(&self, set: &[usize]) -> BTreeSet<String> {
        set.iter().map(|i| self.pool[*i].to_string()).collect()
    }

    /// What the maps give the frontend now.
    pub fn in_maps(&self) -> anyhow::Result<Option<BTreeSet<String>>> {
        let snap = self.maps.read_all()?;
        Ok(snap.reach(&self.frontend).map(|r| {
            r.backends
                .into_iter()
                .flatten()
                .map(|b| b.to_string())
                .collect()
        }))
    }

    /// Writes the slice with `set` ready and waits until the maps hold it.
    pub fn apply(&mut self, set: Vec<usize>) -> anyhow::Result<()> {
        let eps: Vec<Ep> = set
            .iter()
            .map(|i| Ep::ready(&self.pool[*i].ip().to_string()))
            .collect();
        let want = self.names(&set);
        let written_ns = wall_ns();
        self.sandbox.write_manifest(
            "rolling-slice.yaml",
            &slice(
                &format!("{}-1", self.service),
                &self.service,
                "http",
                "TCP",
                self.port,
                &eps,
            ),
        )?;
        // Pace the changes like a real rollout (readiness probes, controller and API latency),
        // and so that the load has time to run while each state is in effect.
        std::thread::sleep(Duration::from_millis(10));
        let start = Instant::now();
        while self.in_maps()?.as_ref() != Some(&want) {
            if start.elapsed() > Duration::from_secs(15) {
                bail!(
                    "the maps never held {want:?} (they hold {:?})",
                    self.in_maps()?
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.timeline.push(State {
            written_ns,
            converged_ns: wall_ns(),
            backends: want,
        });
        self.current = set;
        Ok(())
    }

    /// Replaces every endpoint by one from the other half of the pool, one at a time: add a new
    /// one, then remove an old one (a surge of one, as a Deployment's rolling update does).
    pub fn rolling_update(&mut self) -> anyhow::Result<()> {
        let half = self.pool.len() / 2;
        let old = self.current.clone();
        let new: Vec<usize> = old.iter().map(|i| (i + half) % self.pool.len()).collect();
        let mut set = old.clone();
        for (o, n) in old.iter().zip(&new) {
            set.push(*n);
            self.apply(set.clone())?;
            set.retain(|x| x != o);
            self.apply(set.clone())?;
        }
        Ok(())
    }
}

/// What the maps give one frontend, watched about every millisecond on a thread of its own:
/// each change of the set, with the wall-clock time it was first seen.
pub struct Watcher {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<Seen>>,
}

/// Each change a [`Watcher`] saw: when, and the set the maps held from then on.
pub type Seen = Vec<(u64, BTreeSet<String>)>;

impl Watcher {
    pub fn start(sandbox: &Sandbox, frontend: ServiceAddr) -> anyhow::Result<Self> {
        use std::sync::{Arc, atomic::AtomicBool, atomic::Ordering};
        let dir = PinFolder::new(sandbox.pin_folder())
            .current()
            .context("no pinned maps")?;
        let maps = BpfServiceMaps::open(&dir, true)?;
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Seen::new();
            while flag.load(Ordering::Relaxed) {
                let snap = maps.read_all()?;
                let now = wall_ns();
                let set: BTreeSet<String> = snap
                    .reach(&frontend)
                    .map(|r| {
                        r.backends
                            .into_iter()
                            .flatten()
                            .map(|b| b.to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                if seen.last().is_none_or(|(_, last)| *last != set) {
                    seen.push((now, set));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(seen)
        });
        Ok(Self { running, thread })
    }

    /// Stops watching; the changes seen, in order.
    pub fn stop(self) -> anyhow::Result<Seen> {
        self.running
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the watcher panicked"))?
    }
}

/// The timeline of sets written in order (`written`: when, and the set) from what a
/// [`Watcher`] saw: write j was in effect at the latest from the first moment the maps were
/// seen holding its set or a later write's (the maps only move forward). Sets may repeat, so
/// an observation is taken for the earliest write it can be, at or after the last one matched
/// (the conservative choice: a later one would close more windows than the maps may have).
/// A write never seen stays possible until a later one is.
pub fn timeline(
    written: &[(u64, BTreeSet<String>)],
    seen: &[(u64, BTreeSet<String>)],
) -> Vec<State> {
    let mut converged = vec![u64::MAX; written.len()];
    let mut last = 0;
    for (t, set) in seen {
        let Some(k) = (last..written.len())
            .take_while(|&k| written[k].0 <= *t)
            .find(|&k| written[k].1 == *set)
        else {
            continue;
        };
        for c in converged.iter_mut().take(k + 1) {
            *c = (*c).min(*t);
        }
        last = k;
    }
    written
        .iter()
        .zip(&converged)
        .map(|((w, set), c)| State {
            written_ns: *w,
            converged_ns: *c,
            backends: set.clone(),
        })
        .collect()
}

/// What a recorded run shows.
#[derive(Debug, Default)]
pub struct Verdict {
    pub connects: usize,
    /// Connects made while the endpoint set was changing (between the first change written and
    /// the last one seen in the maps).
    pub during_changes: usize,
    pub failures: BTreeMap<String, usize>,
    pub backends: BTreeMap<String, usize>,
    /// Connects that reached a backend no state in effect at that time had.
    pub misrouted: usize,
    /// The first few of them.
    pub examples: Vec<String>,
}

/// Reads a `Record` file and checks it against the timeline.
pub fn check(record: &Path, timeline: &[State]) -> anyhow::Result<Verdict> {
    let text = std::fs::read_to_string(record)?;
    let mut v = Verdict::default();
    // State j may be in effect from its write to the next state's convergence.
    let windows: Vec<(u64, u64, &BTreeSet<String>)> = timeline
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let start = if j == 0 { 0 } else { s.written_ns };
            let end = timeline.get(j + 1).map_or(u64::MAX, |n| n.converged_ns);
            (start, end, &s.backends)
        })
        .collect();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(s), Some(e), Some(what)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (s, e): (u64, u64) = (s.parse()?, e.parse()?);
        v.connects += 1;
        if timeline.len() > 1
            && e >= timeline[1].written_ns
            && s <= timeline[timeline.len() - 1].converged_ns
        {
            v.during_changes += 1;
        }
        if let Some(errno) = what.strip_prefix('!') {
            *v.failures.entry(errno.to_string()).or_default() += 1;
            continue;
        }
        *v.backends.entry(what.to_string()).or_default() += 1;
        let first = windows.partition_point(|w| w.1 < s);
        let ok = windows[first..]
            .iter()
            .take_while(|w| w.0 <= e)
            .any(|w| w.2.contains(what));
        if !ok {
            v.misrouted += 1;
            if v.examples.len() < 10 {
                v.examples.push(format!("{what} at {s}..{e}"));
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Observations map to the latest write of their set made before them; every earlier
    /// write is over from then on, and a write never seen stays possible until a later one is.
    #[test]
    fn a_timeline_follows_what_the_maps_were_seen_holding() {
        let set = |names: &[&str]| -> BTreeSet<String> {
            names.iter().map(|n| (*n).to_string()).collect()
        };
        let written = vec![
            (0, set(&["a", "b"])),
            (100, set(&["b"])),
            (200, set(&["a"])),
            (300, set(&["a", "b"])),
        ];
        // The maps held a+b, then b (at 110), skipped a, then a+b again at 320.
        let seen = vec![
            (5, set(&["a", "b"])),
            (110, set(&["b"])),
            (320, set(&["a", "b"])),
        ];
        let t = timeline(&written, &seen);
        let converged: Vec<u64> = t.iter().map(|s| s.converged_ns).collect();
        assert_eq!(converged, [5, 110, 320, 320]);
        // The maps seen at a+b again before b was ever seen: that may still be the first
        // write (the agent behind), so b and the later writes stay possible.
        let seen = vec![(5, set(&["a", "b"])), (310, set(&["a", "b"]))];
        let converged: Vec<u64> = timeline(&written, &seen)
            .iter()
            .map(|s| s.converged_ns)
            .collect();
        assert_eq!(converged, [5, u64::MAX, u64::MAX, u64::MAX]);
    }

    #[test]
    fn a_connect_may_use_any_state_that_was_possibly_in_effect() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_string()).collect();
        let timeline = vec![
            State {
                written_ns: 0,
                converged_ns: 10,
                backends: set(&["a"]),
            },
            State {
                written_ns: 100,
                converged_ns: 120,
                backends: set(&["b"]),
            },
        ];
        let dir = std::env::temp_dir().join(format!("churn-check-{}", std::process::id()));
        std::fs::write(
            &dir,
            "50 60 a\n105 110 a\n105 110 b\n130 140 a\n130 140 b\n150 151 !ECONNREFUSED\n",
        )
        .unwrap();
        let v = check(&dir, &timeline).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(v.connects, 6);
        assert_eq!(v.misrouted, 1);
        assert_eq!(
            v.examples,
            ["a at 130..140"],
            "after b converged, a is wrong"
        );
        assert_eq!(v.failures.get("ECONNREFUSED"), Some(&1));
    }
}
