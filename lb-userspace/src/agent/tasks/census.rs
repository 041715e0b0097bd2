//! The live connections, as the agent serves them (`/connections`, `socklb inspect
//! connections`) and counts them (`socklb_live_sockets`): a census of the translated sockets on
//! a blocking thread, at most one at a time, every `REFRESH` and when a request finds the last
//! one older than `FRESH`; then, on the agent's loop, grouped with the backends' conditions
//! from its objects.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use crate::agent::engine::Engine;
use crate::{
    dataplane::{features::Listing, maps::ServiceMaps, pins::SocketPins, sys::monotonic_now},
    sockets::{
        CensusStats, ListError, census_each,
        cluster::FromObjects,
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
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let mut tally = Tally::new(monotonic_now());
            let census = census_each(&pins, &cgroup, listing, true, |s| tally.add(&s))
                .map(|stats| (tally, stats));
            let cgroups = view::cgroup_paths(&cgroup);
            let _ = tx.blocking_send(Counted {
                census,
                cgroups,
                took: start.elapsed(),
            });
        });
    }

    /// Groups a finished census with the engine's objects and maps, and publishes it.
    pub(in crate::agent) fn finish<M: ServiceMaps>(
        &mut self,
        counted: Counted,
        engine: &Engine<M>,
    ) -> Option<(Arc<ConnectionsView>, Duration)> {
        self.in_flight = false;
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
        Some((view, counted.took))
    }
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
