//! Connect loops in the sandbox's client pod, one process per client, each recording every
//! connect with its wall-clock start and end (`client::Command::Record`): what the load tests
//! judge (failures, the backends reached, connects inside a window such as an outage).
use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::{
    Sandbox,
    client::{Command, Reply},
};

/// One recorded connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    pub start_ns: u64,
    pub end_ns: u64,
    /// The backend that answered, or `!ERRNO`.
    pub outcome: String,
}

impl Connect {
    pub fn failed(&self) -> bool {
        self.outcome.starts_with('!')
    }

    /// Whether it ran wholly inside `[from, to]`.
    pub fn within(&self, from: u64, to: u64) -> bool {
        self.start_ns >= from && self.end_ns <= to
    }

    /// Whether any part of it ran inside `[from, to]`.
    pub fn overlaps(&self, from: u64, to: u64) -> bool {
        self.end_ns >= from && self.start_ns <= to
    }
}

/// A load that runs until told to stop.
pub struct Load {
    threads: Vec<std::thread::JoinHandle<anyhow::Result<Reply>>>,
    records: Vec<PathBuf>,
    stop: PathBuf,
}

/// What a load did.
pub struct Finished {
    pub replies: Vec<Reply>,
    /// Every connect of every client.
    pub connects: Vec<Connect>,
    /// Each client's record file (for `churn::check`).
    pub records: Vec<PathBuf>,
}

impl Finished {
    pub fn failed(&self) -> Vec<&Connect> {
        self.connects.iter().filter(|c| c.failed()).collect()
    }
}

impl Load {
    /// `clients` processes connecting to `target` in loops, each at least `min_count` times
    /// before it stops (at most 15 minutes).
    pub fn start(
        sandbox: &Sandbox,
        target: SocketAddr,
        clients: usize,
        min_count: usize,
    ) -> anyhow::Result<Self> {
        Self::start_in(sandbox, None, target, clients, min_count)
    }

    /// The same, in `pod` (the sandbox's client pod when `None`).
    pub fn start_in(
        sandbox: &Sandbox,
        pod: Option<&crate::sandbox::ClientPod>,
        target: SocketAddr,
        clients: usize,
        min_count: usize,
    ) -> anyhow::Result<Self> {
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        let n = LOADS.fetch_add(1, Ordering::Relaxed);
        let stop = sandbox.workdir.join(format!("stop-load-{n}"));
        let mut threads = Vec::new();
        let mut records = Vec::new();
        for i in 0..clients {
            let out = sandbox.workdir.join(format!("load-{n}-{i}.txt"));
            let mut client = match pod {
                Some(pod) => sandbox.client_in(pod)?,
                None => sandbox.client()?,
            };
            let (o, s) = (out.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                client.run(&Command::Record {
                    target,
                    out: o,
                    stop: s,
                    min_count,
                    max_seconds: 900,
                })
            }));
            records.push(out);
        }
        Ok(Self {
            threads,
            records,
            stop,
        })
    }

    /// Connects answered so far that started at or after `from_ns` (wall clock), from the
    /// records the clients write a line at a time.
    pub fn answered_since(&self, from_ns: u64) -> anyhow::Result<usize> {
        let mut n = 0;
        for r in &self.records {
            let text = std::fs::read_to_string(r).unwrap_or_default();
            n += parse_connects(&text)?
                .iter()
                .filter(|c| !c.failed() && c.start_ns >= from_ns)
                .count();
        }
        Ok(n)
    }

    /// Stops the loops (each makes its `min_count` first) and reads their records.
    pub fn finish(self) -> anyhow::Result<Finished> {
        std::fs::write(&self.stop, "")?;
        let mut replies = Vec::new();
        for t in self.threads {
            let reply = t
                .join()
                .map_err(|_| anyhow::anyhow!("load thread panicked"))??;
            anyhow::ensure!(reply.ok, "the load client failed: {reply:?}");
            replies.push(reply);
        }
        let mut connects = Vec::new();
        for r in &self.records {
            connects.extend(parse_connects(&std::fs::read_to_string(r)?)?);
        }
        Ok(Finished {
            replies,
            connects,
            records: self.records,
        })
    }
}

/// A client's record: a line per connect, `START_NS END_NS BACKEND|!ERRNO`; a line still being
/// written (no outcome yet) is left out.
fn parse_connects(text: &str) -> anyhow::Result<Vec<Connect>> {
    let mut connects = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(t0), Some(t1), Some(what)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        connects.push(Connect {
            start_ns: t0.parse()?,
            end_ns: t1.parse()?,
            outcome: what.to_string(),
        });
    }
    Ok(connects)
}
