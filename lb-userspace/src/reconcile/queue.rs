//! A full sync's writes on a thread of their own, in the order the reconciler made them: while
//! the maps take one set's writes, the reconciler plans the next ones. The reconciler's mirror
//! takes each write when it is queued, as if it had succeeded; the writer stops at the first
//! that fails, after undoing that set's writes (as the reconciler's own rollback would), and
//! the reconciler then adopts what the maps hold and writes the sets after it itself.
//!
//! Nothing here decides what is written: the jobs are the reconciler's writes, one job per
//! call of its `enqueue`, in its order; a barrier runs after every write queued before it.
use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
    mpsc::{Receiver, SyncSender},
};

use crate::dataplane::maps::{Capacities, MapWrite, MapWriteError, ServiceMaps};

/// Jobs handed over at once: one wake-up of the writer per batch, not per set.
const BATCH_WRITES: usize = 256;
/// Batches waiting at most: how far the reconciler may run ahead of the maps.
const BATCHES: usize = 4;

/// Jobs handed over together, in one list of writes (read in order by the writer), each write
/// with the write that undoes it (`None`: nothing to undo). A job is one `enqueue` call's
/// writes: `ends` holds where each ends in `writes`.
#[derive(Default)]
struct Batch {
    writes: Vec<MapWrite>,
    undo: Vec<Option<MapWrite>>,
    ends: Vec<usize>,
}

enum Message {
    Jobs(Batch),
    /// Answers once every write queued before it is done: whether all succeeded and, for a
    /// barrier, the maps' barrier then ran.
    Wait {
        barrier: bool,
        answer: SyncSender<bool>,
    },
}

/// Where the writer stopped: the job whose write failed, and what it did.
#[derive(Debug)]
pub(super) struct Stopped {
    pub(super) job: usize,
    pub(super) error: MapWriteError,
    /// Writes of that job done before the failure (now undone, if `undone`).
    pub(super) written: usize,
    /// Every write done of that job was undone: the maps are as before the job.
    pub(super) undone: bool,
}

#[derive(Default)]
struct Progress {
    /// Jobs the writer finished (every write done).
    jobs: AtomicUsize,
    /// Forward writes done, every job counted.
    writes: AtomicUsize,
    /// Undo writes done after a failure.
    undo_writes: AtomicUsize,
    failed: AtomicBool,
}

/// The reconciler's end of the queue.
pub(super) struct Queue {
    tx: SyncSender<Message>,
    batch: Batch,
    jobs: usize,
    progress: Arc<Progress>,
    capacities: Capacities,
}

/// The writer's end: runs on its own thread with the maps.
pub(super) struct Writer {
    rx: Receiver<Message>,
    progress: Arc<Progress>,
}

/// A queue and its writer, for maps of these capacities.
pub(super) fn channel(capacities: Capacities) -> (Queue, Writer) {
    let (tx, rx) = std::sync::mpsc::sync_channel(BATCHES);
    let progress = Arc::new(Progress::default());
    (
        Queue {
            tx,
            batch: Batch::default(),
            jobs: 0,
            progress: Arc::clone(&progress),
            capacities,
        },
        Writer { rx, progress },
    )
}

impl Queue {
    /// Queues one job: `writes`, each with the write that undoes it (`undo_of`, called in
    /// order).
    pub(super) fn push(
        &mut self,
        writes: Vec<MapWrite>,
        undo_of: impl FnMut(&MapWrite) -> Option<MapWrite>,
    ) {
        let b = &mut self.batch;
        b.undo.extend(writes.iter().map(undo_of));
        b.writes.extend(writes);
        b.ends.push(b.writes.len());
        self.jobs += 1;
        if b.writes.len() >= BATCH_WRITES {
            self.flush();
        }
    }

    /// The number the next job will have.
    pub(super) fn next_job(&self) -> usize {
        self.jobs
    }

    fn flush(&mut self) {
        if self.batch.ends.is_empty() {
            return;
        }
        // A writer that stopped still drains the channel; one that is gone has failed, which
        // `failed` reports.
        let _ = self.tx.send(Message::Jobs(std::mem::take(&mut self.batch)));
    }

    /// The maps' barrier, once every write queued so far is done (`false` when the writer
    /// stopped at a failure).
    pub(super) fn barrier(&mut self) -> bool {
        self.wait(true)
    }

    /// Waits until every write queued so far is done: whether all succeeded.
    pub(super) fn settle(&mut self) -> bool {
        self.wait(false)
    }

    fn wait(&mut self, barrier: bool) -> bool {
        self.flush();
        let (answer, rx) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Message::Wait { barrier, answer }).is_err() {
            return false;
        }
        rx.recv().unwrap_or(false)
    }

    /// Whether a write failed (the writer writes nothing more).
    pub(super) fn failed(&self) -> bool {
        self.progress.failed.load(Ordering::Acquire)
    }

    /// Jobs the writer has finished: every job numbered below is in the maps.
    pub(super) fn jobs_done(&self) -> usize {
        self.progress.jobs.load(Ordering::Acquire)
    }

    pub(super) fn capacities(&self) -> Capacities {
        self.capacities
    }

    /// Hands over what is left and closes the queue: the writer ends once it has run it.
    pub(super) fn close(mut self) -> Closed {
        self.flush();
        Closed {
            progress: self.progress,
        }
    }
}

/// A closed queue's counters, read once its writer has ended.
pub(super) struct Closed {
    progress: Arc<Progress>,
}

impl Closed {
    /// Forward writes and undo writes the writer did.
    pub(super) fn writes(&self) -> (usize, usize) {
        (
            self.progress.writes.load(Ordering::Acquire),
            self.progress.undo_writes.load(Ordering::Acquire),
        )
    }
}

impl Writer {
    /// Runs the jobs on `maps` in order until the queue closes; where it stopped, if a write
    /// failed. Its counters are published once per batch, not per write: the reconciler reads
    /// them between sets, and a line written at every write would travel between the two
    /// cores at every read.
    pub(super) fn run<M: ServiceMaps>(self, maps: &mut M) -> Option<Stopped> {
        let mut stopped: Option<Stopped> = None;
        let mut counts = Counts::default();
        for message in &self.rx {
            match message {
                Message::Wait { barrier, answer } => {
                    let _ = answer.send(stopped.is_none() && (!barrier || maps.barrier()));
                }
                Message::Jobs(batch) => {
                    let mut start = 0;
                    for &end in &batch.ends {
                        if stopped.is_none() {
                            let (writes, undo) =
                                (&batch.writes[start..end], &batch.undo[start..end]);
                            stopped = run_job(maps, counts.jobs, writes, undo, &mut counts);
                            if stopped.is_none() {
                                counts.jobs += 1;
                            }
                        }
                        start = end;
                    }
                    self.publish(&counts, stopped.is_some());
                }
            }
        }
        self.publish(&counts, stopped.is_some());
        stopped
    }

    fn publish(&self, counts: &Counts, failed: bool) {
        let p = &self.progress;
        p.writes.store(counts.writes, Ordering::Relaxed);
        p.undo_writes.store(counts.undo_writes, Ordering::Relaxed);
        p.jobs.store(counts.jobs, Ordering::Release);
        if failed {
            p.failed.store(true, Ordering::Release);
        }
    }
}

/// What the writer did so far.
#[derive(Default)]
struct Counts {
    /// Jobs finished (every write done).
    jobs: usize,
    writes: usize,
    undo_writes: usize,
}

fn run_job<M: ServiceMaps>(
    maps: &mut M,
    number: usize,
    writes: &[MapWrite],
    undo_of: &[Option<MapWrite>],
    counts: &mut Counts,
) -> Option<Stopped> {
    for (i, write) in writes.iter().enumerate() {
        if let Err(error) = maps.write(write) {
            let undone = undo(maps, &undo_of[..i], counts);
            return Some(Stopped {
                job: number,
                error,
                written: i,
                undone,
            });
        }
        counts.writes += 1;
    }
    None
}

/// The done writes' undo, newest first, stopping at the first that fails (each step is a
/// state the forward writes passed through).
fn undo<M: ServiceMaps>(maps: &mut M, undo: &[Option<MapWrite>], counts: &mut Counts) -> bool {
    for write in undo.iter().rev().flatten() {
        if let Err(e) = maps.write(write) {
            tracing::error!(error = %e, %write, "rollback write failed; stopped at a valid state");
            return false;
        }
        counts.undo_writes += 1;
    }
    true
}
