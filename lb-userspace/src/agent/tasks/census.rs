//! The live connections, as the agent serves them (`/connections`, `socklb inspect
//! connections`) and counts them (`socklb_live_sockets`): a census of the translated sockets on
//! a blocking thread, at most one at a time, every `REFRESH` and when a request finds the last
//! one older than `FRESH`; then, on the agent's loop, grouped with the backends' conditions
//! from its objects. A census also frees the connection slots whose TCP socket it did not find
//! twice in a row (see `Reclaim`).
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use crate::agent::engine::Engine;
use crate::{
    dataplane::{features::Listing, maps::ServiceMaps, pins::SocketPins, sys::record_clock_now},
    sockets::{
        CensusStats, ListError, census_each,
        cluster::FromObjects,
        listing::{free_slots, tcp_slots_before},
        view::{self, ConnectionsView, Filter, Tally},
    },
};

/// How often the agent counts live sockets and its connection slots for its metrics.
pub const REFRESH: Duration = Duration::from_secs(15);
/// A request is answered from a census at most this old.
pub(in crate::agent) const FRESH: Duration = Duration::from_secs(2);

/// A census's result, as it comes back from its thread: the connections counted as they
/// streamed by (its size grows with the connections' kinds, not with the sockets).
pub(in crate::agent) struct Counted {
    census: Result<(Tally, CensusStats), ListError>,
    cgroups: HashMap<u64, PathBuf>,
    took: Duration,
    reclaim: Reclaim,
}

/// Slots whose release was never seen. The release program frees a connection's slot when its
/// socket closes; a socket the kernel closes without a release (a multipath TCP connection's
/// first subflow: the application's socket is the MPTCP one) would keep its slot for ever. A
/// census reads the TCP slots held by sockets made before it began and crosses off each socket
/// it finds; a slot left over in two censuses in a row, both complete, is freed. (A connection
/// in a namespace no pod of the attached cgroup is in any more is not found either: it keeps
/// its backend, and reports it as its peer.) UDP slots are left alone: a terminated UDP socket
/// whose owner keeps the descriptor is in no socket table, yet holds its slot until it closes.
#[derive(Debug, Default)]
pub(in crate::agent) struct Reclaim {
    /// Slots not found by the last census.
    suspects: HashSet<u64>,
    /// Slots this census freed.
    freed: usize,
}

/// How a census went, for the metrics.
#[derive(Clone, Copy, Debug)]
pub struct Census {
    pub took: Duration,
    /// Connection slots it freed (see `Reclaim`).
    pub freed: usize,
}

/// The last view, and when its census was taken.
#[derive(Clone, Debug)]
pub struct Published {
    pub at: Instant,
    pub view: Arc<ConnectionsView>,
}

/// The requests side, shared with the HTTP handlers.
pub struct Handle {
    pub latest: watch::Receiver<Option<Published>>,
    pub ask: mpsc::Sender<()>,
    /// The kernel lets the agent list some sockets.
    possible: bool,
}

impl Handle {
    /// A view no older than `FRESH`: the last one, or the next one (asked for here). `None`
    /// at once where no socket can be listed.
    pub async fn fresh(&self) -> Option<Arc<ConnectionsView>> {
        if !self.possible {
            return None;
        }
        let mut latest = self.latest.clone();
        if let Some(p) = latest.borrow().as_ref()
            && p.at.elapsed() <= FRESH
        {
            return Some(p.view.clone());
        }
        let _ = self.ask.try_send(());
        latest.changed().await.ok()?;
        latest.borrow().as_ref().map(|p| p.view.clone())
    }
}

/// The loop's side.
pub(in crate::agent) struct Refresher {
    pins: SocketPins,
    listing: Listing,
    cgroup: PathBuf,
    in_flight: bool,
    /// Slots the last census did not find (see `Reclaim`).
    suspects: HashSet<u64>,
    done_tx: mpsc::Sender<Counted>,
    publish: watch::Sender<Option<Published>>,
}

/// What the loop waits on: finished censuses, and requests for a fresh one.
pub(in crate::agent) struct Inbox {
    pub done: mpsc::Receiver<Counted>,
    pub asked: mpsc::Receiver<()>,
}

impl Refresher {
    pub(in crate::agent) fn new(
        pins: SocketPins,
        listing: Listing,
        cgroup: PathBuf,
    ) -> (Self, Inbox, Handle) {
        let (done_tx, done) = mpsc::channel(1);
        let (ask, asked) = mpsc::channel(1);
        let (publish, latest) = watch::channel(None);
        let possible = listing.tcp() || listing.udp();
        (
            Self {
                pins,
                listing,
                cgroup,
                in_flight: false,
                suspects: HashSet::new(),
                done_tx,
                publish,
            },
            Inbox { done, asked },
            Handle {
                latest,
                ask,
                possible,
            },
        )
    }

    /// Whether the kernel lets the agent list any socket at all.
    pub(in crate::agent) fn possible(&self) -> bool {
        self.listing.tcp() || self.listing.udp()
    }

    /// Starts a census on a blocking thread unless one runs.
    pub(in crate::agent) fn start(&mut self) {
        if self.in_flight || !self.possible() {
            return;
        }
        self.in_flight = true;
        let (pins, listing, cgroup, tx) = (
            self.pins.clone(),
            self.listing,
            self.cgroup.clone(),
            self.done_tx.clone(),
        );
        let suspects = std::mem::take(&mut self.suspects);
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let now = record_clock_now();
            let since = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
            let mut unseen = tcp_slots_before(&pins, since).unwrap_or_default();
            let mut tally = Tally::new(now);
            let census = census_each(&pins, &cgroup, listing, true, |s| {
                unseen.remove(&s.cookie);
                tally.add(&s);
            })
            .map(|stats| (tally, stats));
            let reclaim = match &census {
                Ok((_, stats)) if stats.errors.is_empty() => reclaim(&pins, &suspects, unseen),
                // Sockets in a namespace that could not be read were not seen: nothing is
                // judged gone.
                _ => Reclaim::default(),
            };
            let cgroups = view::cgroup_paths(&cgroup);
            let _ = tx.blocking_send(Counted {
                census,
                cgroups,
                took: start.elapsed(),
                reclaim,
            });
        });
    }

    /// Groups a finished census with the engine's objects and maps, and publishes it.
    pub(in crate::agent) fn finish<M: ServiceMaps>(
        &mut self,
        counted: Counted,
        engine: &Engine<M>,
    ) -> Option<(Arc<ConnectionsView>, Census)> {
        self.in_flight = false;
        self.suspects = counted.reclaim.suspects;
        if counted.reclaim.freed > 0 {
            tracing::info!(
                slots = counted.reclaim.freed,
                "freed connection slots whose TCP socket was gone in two censuses in a row (closed without a release: a multipath TCP subflow)"
            );
        }
        let (tally, stats) = match counted.census {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "could not list the live sockets"
                );
                return None;
            }
        };
        let cluster = FromObjects::new(engine.store());
        let view = Arc::new(view::summarize(
            tally,
            &stats,
            engine.reconciler().snapshot(),
            &cluster,
            &counted.cgroups,
            &Filter::default(),
        ));
        self.publish.send_replace(Some(Published {
            at: Instant::now(),
            view: view.clone(),
        }));
        Some((
            view,
            Census {
                took: counted.took,
                freed: counted.reclaim.freed,
            },
        ))
    }
}

/// Frees the slots neither this census nor the last found; keeps the rest of this one's
/// unseen slots as the next census's suspects.
fn reclaim(pins: &SocketPins, suspects: &HashSet<u64>, unseen: HashSet<u64>) -> Reclaim {
    let (gone, suspects): (HashSet<u64>, HashSet<u64>) =
        unseen.into_iter().partition(|c| suspects.contains(c));
    let freed = free_slots(pins, &gone).unwrap_or_else(|e| {
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            "could not free connection slots whose socket is gone"
        );
        0
    });
    Reclaim { suspects, freed }
}

/// The view narrowed to one Service and/or backend.
pub(in crate::agent) fn filtered(view: &ConnectionsView, filter: &Filter) -> ConnectionsView {
    let mut out = view.clone();
    out.services.retain(|s| {
        filter
            .service
            .as_ref()
            .is_none_or(|f| s.service.as_ref().is_some_and(|k| &k.service == f))
    });
    if let Some(b) = filter.backend {
        for s in &mut out.services {
            s.backends.retain(|x| x.backend == b);
        }
        out.services.retain(|s| !s.backends.is_empty());
    }
    out
}
