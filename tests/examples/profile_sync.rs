//! A full sync of 10,000 services x 10 endpoints through the engine into maps that discard
//! every write, five times: translation and diff only, for a profiler.
//! `cargo build --release -p socklb-tests --example profile_sync`, then
//! `perf record -e cpu-clock --call-graph dwarf --control fifo:CTL -D -1
//! target/release/examples/profile_sync CTL`: with a fifo path, the profiler is enabled only
//! around the timed part (the objects are parsed outside it).
use std::{io::Write as _, time::Instant};

use anyhow::Context as _;
use socklb::{agent::Engine, reconcile::Reconciler};
use socklb_tests::bench::controlplane::{Discard, flags, world_events};

fn main() -> anyhow::Result<()> {
    let mut control = match std::env::args().nth(1) {
        Some(path) => Some(std::fs::OpenOptions::new().write(true).open(path)?),
        None => None,
    };
    let events = world_events(10_000, 10)?;
    for _ in 0..5 {
        let events = events.clone();
        let mut engine = Engine::new(Reconciler::new(Discard)?, flags());
        if let Some(c) = &mut control {
            c.write_all(b"enable\n")?;
        }
        let start = Instant::now();
        for e in events {
            engine.handle(e);
        }
        let handled = start.elapsed().as_secs_f64();
        let pass = engine.reconcile().context("the full sync")?;
        let secs = start.elapsed().as_secs_f64();
        if let Some(c) = &mut control {
            c.write_all(b"disable\n")?;
        }
        anyhow::ensure!(pass.report.failed.is_empty(), "a write failed");
        eprintln!("translate + diff: {secs:.3} s (events into the model {handled:.3} s)");
    }
    Ok(())
}
