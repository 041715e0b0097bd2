//! The data path's decisions as they happen (`socklb monitor`): the programs write one `Event`
//! per connect or sendmsg to a service address into the `EVENTS` ring buffer, but only while a
//! reader has said it is there (`MONITOR.until_ns`, renewed every second, so a reader that dies
//! stops the stream by itself). While nobody reads, a decision costs one array load more.
//! `Reader` is the only reader (an abstract unix socket named after the generation;
//! `ReaderError::Busy` for a second one), drains `EVENTS` on its own clock (the programs write
//! with `BPF_RB_NO_WAKEUP`) and decodes each `Event`; a full buffer drops decisions, counted as
//! `EventsDropped`.
use std::{net::SocketAddr, path::Path, time::Duration};

use aya::maps::{Array, Map, MapData, RingBuf};
use lb_common::{Event, HOOK_SENDMSG, MapId, MonitorState, event};
use serde::{Deserialize, Serialize};

use super::{
    abi::{backend_addr, protocol_from, service_addr},
    bpf::{open_map, read_error},
    maps::MapReadError,
};
use crate::vocab::{Protocol, ServiceAddr};

/// How long a reader's claim lasts: it renews it every second.
pub const CLAIM: Duration = Duration::from_secs(3);

/// What the data path decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Sent to a backend chosen afresh.
    Translated,
    /// Sent to the backend the client's session-affinity entry holds.
    AffinityHit,
    /// An unconnected UDP socket kept the backend it used before.
    Sticky,
    /// Refused (ECONNREFUSED): the Service has no usable endpoint.
    NoBackend,
    /// Refused (ECONNREFUSED): internalTrafficPolicy Local, no endpoint on this node.
    NoLocalBackend,
    /// Refused (ENOBUFS): the pod holds as many socket records as it may.
    PodBound,
    /// Refused (ENOBUFS): the socket's record could not be stored (socket memory).
    RecordFailed,
}

impl Decision {
    fn of(kind: u8) -> Option<Self> {
        Some(match kind {
            event::TRANSLATED => Self::Translated,
            event::AFFINITY => Self::AffinityHit,
            event::STICKY => Self::Sticky,
            event::NO_BACKEND => Self::NoBackend,
            event::NO_LOCAL_BACKEND => Self::NoLocalBackend,
            event::RECORD_QUOTA => Self::PodBound,
            event::RECORD_FAILED => Self::RecordFailed,
            _ => return None,
        })
    }

    /// The call was refused.
    pub fn refused(self) -> bool {
        !matches!(self, Self::Translated | Self::AffinityHit | Self::Sticky)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Translated => "translated",
            Self::AffinityHit => "affinity hit",
            Self::Sticky => "sticky",
            Self::NoBackend => "refused: no endpoint (ECONNREFUSED)",
            Self::NoLocalBackend => "refused: no endpoint on this node (ECONNREFUSED)",
            Self::PodBound => "refused: the pod holds as many socket records as it may (ENOBUFS)",
            Self::RecordFailed => "refused: the socket's record could not be stored (ENOBUFS)",
        }
    }
}

/// One decision, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// `CLOCK_MONOTONIC` of the decision.
    pub at_ns: u64,
    /// `connect` or `sendmsg`.
    pub hook: String,
    pub protocol: Protocol,
    /// The cgroup v2 id of the calling process.
    pub cgroup_id: u64,
    /// The service address dialled.
    pub frontend: ServiceAddr,
    pub service_id: u32,
    /// The backend chosen; none when refused.
    pub backend: Option<SocketAddr>,
    pub decision: Decision,
}

/// An `Event` from the ring buffer's bytes (`None`: too short).
fn event_from(bytes: &[u8]) -> Option<Event> {
    (bytes.len() >= size_of::<Event>()).then(|| {
        // SAFETY: Event is plain old data (repr(C), integers only, no padding, asserted in
        // lb-common) and `bytes` holds at least its size.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) }
    })
}

impl Seen {
    /// `None` for bytes that are no event of this layout.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let e = event_from(bytes)?;
        Some(Self {
            at_ns: e.at_ns,
            hook: if e.hook == HOOK_SENDMSG {
                "sendmsg"
            } else {
                "connect"
            }
            .to_string(),
            protocol: protocol_from(e.frontend.protocol)?,
            cgroup_id: e.cgroup_id,
            frontend: service_addr(&e.frontend)?,
            service_id: e.service_id,
            backend: backend_addr(&e.backend),
            decision: Decision::of(e.kind)?,
        })
    }
}

/// A reader of the decisions: its claim in `MONITOR`, and the ring buffer.
pub struct Reader {
    monitor: Array<MapData, MonitorState>,
    events: RingBuf<MapData>,
    /// Held while this reader lives: a ring buffer has one consumer, so a second reader of
    /// the same stream would take decisions from the first.
    _only: std::os::unix::net::UnixListener,
}

/// Why a reader could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error(
        "another socklb monitor reads this node's decisions (one at a time: they would take decisions from each other)"
    )]
    Busy,
    #[error(transparent)]
    Map(#[from] MapReadError),
}

impl Reader {
    /// Opens the generation's `MONITOR` and `EVENTS` (pinned under `maps_dir`) and claims the
    /// stream; refused while another reader holds it.
    pub fn open(maps_dir: &Path) -> Result<Self, ReaderError> {
        let only = only_reader(maps_dir)?;
        let monitor = Array::try_from(Map::Array(open_map(maps_dir, MapId::Monitor, false)?))
            .map_err(|e| read_error(MapId::Monitor, e))?;
        let events = RingBuf::try_from(Map::RingBuf(open_map(maps_dir, MapId::Events, false)?))
            .map_err(|e| read_error(MapId::Events, e))?;
        let mut reader = Self {
            monitor,
            events,
            _only: only,
        };
        reader.claim()?;
        Ok(reader)
    }

    /// Tells the programs a reader is there for the next `CLAIM` (call it every second).
    pub fn claim(&mut self) -> Result<(), MapReadError> {
        let until = super::sys::monotonic_now() + CLAIM;
        self.set(u64::try_from(until.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Tells the programs nobody reads any more.
    pub fn release(&mut self) -> Result<(), MapReadError> {
        self.set(0)
    }

    fn set(&mut self, until_ns: u64) -> Result<(), MapReadError> {
        self.monitor
            .set(0, MonitorState { until_ns }, 0)
            .map_err(|e| read_error(MapId::Monitor, e))
    }

    /// Waits `timeout` (the programs do not wake the reader: it reads on its own clock) and
    /// hands each decision written meanwhile to `each`.
    pub fn read(&mut self, timeout: Duration, mut each: impl FnMut(Seen)) -> std::io::Result<()> {
        std::thread::sleep(timeout);
        while let Some(item) = self.events.next() {
            if let Some(seen) = Seen::decode(&item) {
                each(seen);
            }
        }
        Ok(())
    }
}

/// An abstract unix socket named after the stream, bound while its reader lives (the kernel
/// frees the name when the process ends, however it ends).
fn only_reader(maps_dir: &Path) -> Result<std::os::unix::net::UnixListener, ReaderError> {
    use std::os::linux::net::SocketAddrExt as _;
    let name = format!("socklb-monitor:{}", maps_dir.display());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| MapReadError::new(MapId::Events, e))?;
    std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            ReaderError::Busy
        } else {
            ReaderError::Map(MapReadError::new(MapId::Events, e))
        }
    })
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
