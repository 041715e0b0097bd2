//! The `process_*` metrics Prometheus' client libraries export, read from /proc/self.
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use super::gauge;

/// The `process_*` metrics of Prometheus' client libraries, from /proc/self.
#[derive(Debug)]
pub(super) struct Process {
    /// `process_start_time_seconds`: fixed for the process' life.
    start_time: Option<f64>,
    ticks_per_second: f64,
    page_size: f64,
}

impl Process {
    pub(super) fn new() -> Self {
        let ticks = rustix::param::clock_ticks_per_second();
        let ticks_per_second = if ticks > 0 { ticks as f64 } else { 100.0 };
        let page_size = rustix::param::page_size() as f64;
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let start_ticks = ProcStat::read().map(|s| s.start_ticks);
        Self {
            start_time: boot_time
                .zip(start_ticks)
                .map(|(boot, start)| boot + start / ticks_per_second),
            ticks_per_second,
            page_size,
        }
    }
}

/// The fields of /proc/self/stat the process metrics use.
struct ProcStat {
    cpu_ticks: f64,
    start_ticks: f64,
    virtual_bytes: f64,
    resident_pages: f64,
}

impl ProcStat {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(&stat)
    }

    /// Fields after the command name (which may hold spaces and parentheses), counted from 3
    /// as in proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    fn parse(stat: &str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        Some(Self {
            cpu_ticks: field(14)? + field(15)?,
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
            resident_pages: field(24)?,
        })
    }
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(stat) = ProcStat::read() {
            let cpu = ConstCounter::new(stat.cpu_ticks / self.ticks_per_second);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            let gauges = [
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes",
                    stat.resident_pages * self.page_size,
                ),
                (
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes",
                    stat.virtual_bytes,
                ),
            ];
            for (name, help, value) in gauges {
                let g = ConstGauge::new(value);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let g = ConstGauge::new(gauge(fds.count()));
            g.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            let g = ConstGauge::new(i64::try_from(limit).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(start) = self.start_time {
            let g = ConstGauge::new(start);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ProcStat;

    #[test]
    fn proc_stat_fields_are_read_after_the_command_name() {
        let stat = "1234 (socklb (a) b) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let s = ProcStat::parse(stat).expect("parses");
        assert!((s.cpu_ticks - 300.0).abs() < f64::EPSILON);
        assert!((s.start_ticks - 12345.0).abs() < f64::EPSILON);
        assert!((s.virtual_bytes - 104_857_600.0).abs() < f64::EPSILON);
        assert!((s.resident_pages - 2560.0).abs() < f64::EPSILON);
    }
}
