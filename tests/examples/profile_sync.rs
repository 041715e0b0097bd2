//! A full sync of 10,000 services x 10 endpoints through the engine into maps that discard
//! every write, five times: translation and diff only, for a profiler.
//! `cargo build --release -p socklb-tests --example profile_sync`, then
//! `perf record -e cpu-clock --call-graph dwarf target/release/examples/profile_sync`.
fn main() -> anyhow::Result<()> {
    for _ in 0..5 {
        let secs = socklb_tests::bench::controlplane::translate_and_diff_secs(10_000, 10)?;
        eprintln!("translate + diff: {secs:.3} s");
    }
    Ok(())
}
