//! The data path's counters, summed over CPUs, read on every scrape through the read-only
//! view of the maps (one lookup per counter in the per-CPU array).
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::counter::ConstCounter,
};

use crate::dataplane::bpf::ReadOnlyMaps;
use lb_common::Counter as DpCounter;

#[derive(Debug)]
pub(super) struct Datapath {
    /// The generation of maps in use (it changes when they grow).
    pub(super) generation: super::Generation,
}

impl Collector for Datapath {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Not pinned yet (or not readable): no data-path samples in this scrape.
        let maps = ReadOnlyMaps::new(super::dir_of(&self.generation));
        let Ok(counters) = maps.counters() else {
            return Ok(());
        };
        for (counter, total) in counters {
            let metric = ConstCounter::new(total);
            let name = format!("datapath_{}", DpCounter::name(counter));
            let metric_encoder = encoder.encode_descriptor(
                &name,
                DpCounter::help(counter),
                None,
                metric.metric_type(),
            )?;
            metric.encode(metric_encoder)?;
        }
        Ok(())
    }
}
