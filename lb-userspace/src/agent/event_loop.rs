//! The agent's event loop: one task owns the engine; source events, ticks and finished
//! background work arrive here and are routed to the engine and the periodic tasks
//! (`tasks/`); after each round the maps are reconciled, the programs attached once the first
//! complete sync is written, and readiness, liveness and status recorded.
//!
//! Nothing is written before both Services and EndpointSlices have been listed once and this
//! node's interface addresses are known; the first write is a full sync that also sweeps what
//! the maps hold and the cluster no longer has. The programs are attached only after it, and
//! `CONFIG` written only after them. The loop never lists sockets: censuses, recounts and
//! termination passes run on blocking threads, one of each kind at a time.
use std::{
    sync::{Arc, PoisonError, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use super::{
    AgentConfig, Engine, Listeners, Pass, Progress, Shared,
    api_route::ApiRoute,
    listeners, probes, start,
    tasks::{census, growth, outside, pods, recount, udp_termination, version},
};
use crate::{
    dataplane::{abi::frontend_key, bpf::BpfServiceMaps, features::Feature, loader::Dataplane},
    reconcile::Reconciler,
    source::SourceEvent,
    status::{Failed, Owned, Rejected, Status},
    vocab::{Protocol, ServiceAddr},
};

/// How often the agent looks whether a map passed its fill threshold (the affinity tables,
/// which the programs fill, are only counted then; the others are looked at after every pass).
const GROWTH_EVERY: Duration = Duration::from_secs(10);

/// How long the source may fail before the agent reports itself not ready.
const UNHEALTHY_GRACE: Duration = Duration::from_secs(5);

pub(super) async fn run(
    config: AgentConfig,
    listeners: Listeners,
    mut dataplane: Dataplane,
) -> anyhow::Result<()> {
    spawn_ebpf_logger(&mut dataplane, config.load.log_level);
    let maps = dataplane
        .service_maps()
        .context("opening the service maps")?;
    let reconciler = Reconciler::new(maps).context("reading the pinned maps")?;
    if reconciler.service_count() > 0 {
        tracing::info!(
            service_ports = reconciler.service_count(),
            "adopted pinned state; it stays in effect until the first complete sync"
        );
    }
    let flags = start::node_flags(&config).await;
    let (mut version_rx, version_asked) = version::spawn_follower(&config, flags.kube_version);
    let mut engine = Engine::new(reconciler, flags);
    let (mut refresher, mut inbox, handle) = census::Refresher::new(
        dataplane.sockets.clone(),
        dataplane.features.listing(),
        config.load.cgroup.clone(),
    );
    let shared = Shared::new(&config, &dataplane, handle);
    listeners::serve(listeners, &shared)?;

    let (tx, mut rx) = mpsc::channel::<SourceEvent>(4096);
    // This node's interface addresses first: none of them may be written as a frontend.
    engine.await_local_addresses();
    start::watch_the_node(&tx)?;
    let mut api_route = start::start_source(&config, tx).await?;

    let mut retry = ticker(config.retry_interval);
    let mut pods_tick = ticker(pods::PODS_EVERY);
    let mut growth_tick = ticker(GROWTH_EVERY);
    let mut census_tick = ticker(census::REFRESH);
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut attached = false;
    let mut unhealthy_since: Option<Instant> = None;
    let mut tasks = Tasks::new(&config, &shared);
    loop {
        tokio::select! {
            event = rx.recv() => {
                let Some(event) = event else {
                    anyhow::bail!("the source stopped");
                };
                engine.handle(event);
                while let Ok(event) = rx.try_recv() {
                    engine.handle(event);
                }
            }
            _ = retry.tick() => {
                engine.retry_failed();
                // Ports that could not listen are tried again.
                if let Some(servers) = tasks.health_checks.as_mut().filter(|s| s.failing() > 0) {
                    sync_health_checks(servers, &engine);
                }
            }
            Some(version) = version_rx.recv() => engine.set_kube_version(version),
            _ = census_tick.tick() => {
                refresher.start();
                recount::record_counts(&config, &dataplane, &shared);
            }
            _ = pods_tick.tick(), if attached => pods::refresh_pods(&mut dataplane),
            _ = growth_tick.tick(), if engine.is_synced() => {
                grow(&config, &mut dataplane, &mut engine, &shared, &mut tasks.growth, attached, true)?;
            }
            Some(()) = inbox.asked.recv() => refresher.start(),
            Some(counted) = inbox.done.recv() => {
                if let Some((view, census)) = refresher.finish(counted, &engine) {
                    shared.metrics.record_connections(&view, census);
                }
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
        write(
            &config,
            &mut dataplane,
            &mut engine,
            &shared,
            &mut tasks,
            attached,
        )?;
        if engine.is_synced() && !attached {
            attach(&config, &mut dataplane, &engine, &shared, &tasks.udp)?;
            attached = true;
        }
        check_api_route(api_route.as_mut().filter(|_| attached), &engine);
        if record_progress(&engine, &shared, attached, &mut unhealthy_since) {
            // The watches work again: after a control-plane upgrade the version may be newer.
            version_asked.notify_one();
        }
        record_state(
            &engine,
            &shared,
            tasks.health_checks.as_ref(),
            &dataplane.pods,
        );
    }
    tracing::info!(
        "stopping; programs and maps stay pinned and keep serving (`socklb reset` removes them)"
    );
    Ok(())
}

/// After the first complete sync: attaches the programs, starts the recounts, and looks for the
/// connected UDP sockets whose backend left while no agent ran (they are found now, not at the
/// next change).
fn attach(
    config: &AgentConfig,
    dataplane: &mut Dataplane,
    engine: &Engine<BpfServiceMaps>,
    shared: &Arc<Shared>,
    udp: &udp_termination::UdpTermination,
) -> anyhow::Result<()> {
    // Records an older agent's programs made without the socket's cookie would look like
    // sockets that never met socklb to the cookie proof: every listing makes the cookie of each
    // socket it lists, once before the proof's programs are attached and once after (a record
    // the old programs made in between).
    make_cookies(config, dataplane);
    let ids = dataplane.attach().context("attaching the programs")?;
    make_cookies(config, dataplane);
    tracing::info!(
        cgroup = %config.load.cgroup.display(),
        programs = ids.len(),
        pod_level = dataplane.config().pod_level,
        "first complete sync written; programs attached"
    );
    pods::log_placement(&dataplane.pods, "programs attached");
    recount::spawn(config, dataplane, shared);
    if shared.features.udp_termination() {
        udp.request(
            config,
            dataplane,
            &engine.reconciler().live_serving(),
            shared,
            true,
        );
    }
    Ok(())
}

/// Lists every translated socket once, for the cookie the listing makes (`attach`); only when
/// the cookie proof is on.
fn make_cookies(config: &AgentConfig, dataplane: &Dataplane) {
    if !dataplane.features.enabled(Feature::CookieProof) {
        return;
    }
    let listed = tokio::task::block_in_place(|| {
        crate::sockets::census_each(
            &dataplane.sockets,
            &config.load.cgroup,
            dataplane.features.listing(),
            false,
            |_| {},
        )
    });
    if let Err(e) = listed {
        tracing::warn!(
            error = %e,
            "listing the translated sockets failed: a record an older agent made without its socket's cookie may be missed by close, getpeername and recvmsg until the next listing"
        );
    }
}

/// Whether the API server's address is a Service frontend in the maps (once they are attached):
/// the agent would depend on its own translation (said once).
fn check_api_route(route: Option<&mut ApiRoute>, engine: &Engine<BpfServiceMaps>) {
    let Some(route) = route else {
        return;
    };
    let server = ServiceAddr::new(route.server.ip(), route.server.port(), Protocol::Tcp);
    let frontends = &engine.reconciler().snapshot().frontends;
    let is_frontend = frontends.contains_key(&frontend_key(server));
    tokio::task::block_in_place(|| route.check_frontend(is_frontend));
}

/// Readiness, liveness and the Node's eligibility from the engine's state. Readiness also goes
/// while the watches keep failing (no Service routes to the agent, and a rollout waits);
/// liveness does not. Returns whether the watches work again after failing.
fn record_progress(
    engine: &Engine<BpfServiceMaps>,
    shared: &Shared,
    attached: bool,
    unhealthy_since: &mut Option<Instant>,
) -> bool {
    shared
        .node_health
        .follow(engine.node_object(), engine.node_deleted());
    let was_failing = unhealthy_since.is_some();
    *unhealthy_since = if engine.is_healthy() {
        None
    } else {
        unhealthy_since.or(Some(Instant::now()))
    };
    // A watch that fails once (a 410 Gone before the re-list, a dropped connection) is not
    // "failing": readiness goes only when it stays unhealthy.
    let ready = attached && unhealthy_since.is_none_or(|t| t.elapsed() < UNHEALTHY_GRACE);
    if shared.ready.swap(ready, Ordering::Relaxed) != ready {
        tracing::info!(ready, "readiness changed");
    }
    *shared
        .progress
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Progress {
        unapplied_since: engine.unapplied_since(),
    };
    was_failing && unhealthy_since.is_none()
}

/// Opens and closes the healthCheckNodePorts as the Services say.
fn sync_health_checks(servers: &mut probes::HealthCheckServers, engine: &Engine<BpfServiceMaps>) {
    servers.sync(
        crate::translate::health_checks(engine.store(), engine.node()),
        &probes::listen_addresses(engine.node()),
    );
}

fn record_state(
    engine: &Engine<BpfServiceMaps>,
    shared: &Shared,
    health_checks: Option<&probes::HealthCheckServers>,
    pods: &crate::dataplane::pods::PodCgroups,
) {
    let r = engine.reconciler();
    shared.metrics.record_pods(pods.placement.placed());
    shared.metrics.record_state(
        engine,
        health_checks.map_or(0, probes::HealthCheckServers::failing),
    );
    let status = Status {
        version: crate::status::VERSION.to_string(),
        commit: crate::status::COMMIT.to_string(),
        ready: shared.ready.load(Ordering::Relaxed),
        failed: r
            .failed()
            .iter()
            .map(|(k, e)| Failed {
                service_port: k.clone(),
                kind: e.kind(),
                error: e.to_string(),
            })
            .collect(),
        conflicts: engine
            .conflicts()
            .iter()
            .flat_map(|(k, list)| {
                list.iter().map(|c| Owned {
                    service_port: k.clone(),
                    conflict: c.clone(),
                })
            })
            .collect(),
        rejected: engine
            .rejected()
            .iter()
            .map(|(s, m)| Rejected {
                subject: s.clone(),
                message: m.clone(),
            })
            .collect(),
        refused_addresses: engine
            .refused()
            .iter()
            .flat_map(|(service, list)| {
                list.iter().map(|r| crate::status::RefusedAddress {
                    service: service.clone(),
                    refusal: r.clone(),
                })
            })
            .collect(),
        features: shared.features.probes.clone(),
        degraded: shared
            .features
            .losses()
            .into_iter()
            .map(str::to_string)
            .collect(),
        health_check_ports: health_checks
            .map(probes::HealthCheckServers::report)
            .unwrap_or_default(),
        pods: Some(crate::status::PodsReport {
            level: pods.level,
            placement: pods.placement.clone(),
            reason: pods.placement.reason(),
        }),
        // Filled in by the handler, from the outside path's task.
        outside: None,
    };
    *shared.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
}

fn log_pass(pass: &Pass) {
    let report = &pass.report;
    if pass.full {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            changed = report.services_changed,
            removed = report.services_removed,
            failing = report.failed.len(),
            duration_ms = pass.duration.as_secs_f64() * 1e3,
            "full sync"
        );
    } else if report.writes > 0 || !report.failed.is_empty() {
        tracing::info!(
            services = pass.services,
            writes = report.writes,
            failing = report.failed.len(),
            duration_us = pass.duration.as_micros() as u64,
            "sync"
        );
    }
    for (key, conflict) in &pass.new_conflicts {
        tracing::warn!(service = %key, "address not served: {conflict}");
    }
}

/// With a log level above 0, forwards the programs' aya-log records to our logs.
fn spawn_ebpf_logger(dataplane: &mut Dataplane, level: u8) {
    if level == 0 {
        return;
    }
    match aya_log::EbpfLogger::init(&mut dataplane.ebpf) {
        Ok(logger) => {
            tokio::spawn(async move {
                // SAFETY: the logger owns its ring buffer descriptor for as long as the AsyncFd
                // holds the logger, and nothing else closes it.
                let registered = unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        logger,
                        tokio::io::Interest::READABLE,
                    )
                };
                let Ok(mut fd) = registered else {
                    return;
                };
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        return;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "eBPF log forwarding unavailable"),
    }
}

/// A tick every `period` that skips what it missed rather than bursting.
fn ticker(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// The tasks the loop keeps state for across rounds.
struct Tasks {
    udp: udp_termination::UdpTermination,
    health_checks: Option<probes::HealthCheckServers>,
    growth: growth::Growth,
    outside: Option<outside::OutsideTask>,
}

impl Tasks {
    fn new(config: &AgentConfig, shared: &Arc<Shared>) -> Self {
        Self {
            udp: udp_termination::UdpTermination::default(),
            health_checks: config
                .health_check_node_ports
                .then(|| probes::HealthCheckServers::new(Arc::clone(shared))),
            growth: growth::Growth::new(config.map_memory_ceiling),
            outside: config
                .outside
                .clone()
                .and_then(|options| outside::OutsideTask::start(options, shared)),
        }
    }
}

/// Writes what changed, and where the pass found maps filling up, moves them to larger ones
/// and writes again what found no room.
fn write(
    config: &AgentConfig,
    dataplane: &mut Dataplane,
    engine: &mut Engine<BpfServiceMaps>,
    shared: &Arc<Shared>,
    tasks: &mut Tasks,
    attached: bool,
) -> anyhow::Result<()> {
    let mut wrote = false;
    for _ in 0..2 {
        let Some(pass) = engine.reconcile() else {
            break;
        };
        wrote = true;
        log_pass(&pass);
        let (changed, added) = (pass.report.udp_changed, pass.report.udp_frontends_added);
        if (changed || added) && attached && shared.features.udp_termination() {
            let live = engine.reconciler().live_serving();
            tasks.udp.request(config, dataplane, &live, shared, added);
        }
        shared.metrics.record_pass(&pass);
        shared.node_health.written(engine);
        if let Some(servers) = &mut tasks.health_checks {
            sync_health_checks(servers, engine);
        }
        if !engine.is_synced()
            || !grow(
                config,
                dataplane,
                engine,
                shared,
                &mut tasks.growth,
                attached,
                false,
            )?
        {
            break;
        }
    }
    if wrote
        && engine.is_synced()
        && let Some(outside) = tasks.outside.as_mut()
    {
        outside.publish(crate::translate::outside::outside_state(
            engine.store(),
            engine.node(),
        ));
    }
    Ok(())
}

/// Moves the maps to larger ones when they fill (see `tasks::growth`): the growth is planned
/// from what the reconciler holds (and, when `count_affinity`, the affinity tables), a new
/// generation loaded and filled with the same, the programs switched to it (when attached),
/// and the reconciler replaced by one over it. Returns whether the maps grew. A growth that
/// fails before the switch leaves everything as it was and is tried again later; one that
/// fails while switching stops the agent (a restart adopts whichever generation the programs
/// use).
fn grow(
    config: &AgentConfig,
    dataplane: &mut Dataplane,
    engine: &mut Engine<BpfServiceMaps>,
    shared: &Shared,
    growth: &mut growth::Growth,
    attached: bool,
    count_affinity: bool,
) -> anyhow::Result<bool> {
    use crate::dataplane::bpf::ReadOnlyMaps;
    if !growth.may_try() {
        return Ok(false);
    }
    let mut fill = growth::Fill::of(engine.reconciler());
    let read = ReadOnlyMaps::new(&dataplane.maps_dir);
    if count_affinity {
        let cap = dataplane.capacities.get(lb_common::MapId::Affinity);
        if let Ok(tables) = read.affinity(cap as usize) {
            fill.used
                .insert(lb_common::MapId::Affinity, tables.len() as u64);
        }
    }
    let bytes = lb_common::MAPS
        .iter()
        .filter(|d| !d.per_socket)
        .filter_map(|d| read.footprint(d.id).ok().map(|f| (d.id, f)))
        .collect();
    let decision = growth::plan(&dataplane.capacities, &fill, &bytes, growth.ceiling);
    let caps = match decision {
        growth::Decision::Stay => {
            growth.at_ceiling.clear();
            shared
                .metrics
                .record_growth(&dataplane.capacities, &growth.at_ceiling, growth.grown);
            return Ok(false);
        }
        growth::Decision::AtCeiling(maps) => {
            if maps != growth.at_ceiling {
                let names: Vec<&str> = maps.iter().map(|m| m.name()).collect();
                tracing::warn!(maps = ?names, ceiling = growth.ceiling, "maps need room and cannot grow past --max-map-memory: sets that find no room keep the room they have and are reported");
            }
            growth.at_ceiling = maps;
            shared
                .metrics
                .record_growth(&dataplane.capacities, &growth.at_ceiling, growth.grown);
            return Ok(false);
        }
        growth::Decision::Grow(caps) => caps,
    };
    let started = Instant::now();
    let from = dataplane.capacities;
    let grown = match dataplane.grow(&config.load, caps) {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "could not make larger maps; tried again later"
            );
            growth.failed();
            return Ok(false);
        }
    };
    let filled = dataplane
        .grown_maps(&grown)
        .map_err(anyhow::Error::from)
        .and_then(|mut maps| {
            engine
                .reconciler()
                .copy_into(&mut maps)
                .map_err(anyhow::Error::from)
                .map(|_| maps)
        });
    let maps = match filled {
        Ok(maps) => maps,
        Err(e) => {
            tracing::warn!(error = %e, "could not fill the larger maps; tried again later");
            dataplane.abandon(grown);
            growth.failed();
            return Ok(false);
        }
    };
    dataplane
        .switch(grown, attached)
        .context("switching the programs to the larger maps")?;
    let mut reconciler = Reconciler::new(maps).context("reading the larger maps")?;
    reconciler.share_live_of(engine.reconciler());
    drop(engine.replace_reconciler(reconciler));
    shared.metrics.follow_generation(&dataplane.maps_dir);
    growth.succeeded();
    growth.at_ceiling.clear();
    shared
        .metrics
        .record_growth(&dataplane.capacities, &growth.at_ceiling, growth.grown);
    let sizes: Vec<String> = growth::GROWABLE
        .iter()
        .filter(|m| from.get(**m) != caps.get(**m))
        .map(|m| format!("{} {} -> {}", m.name(), from.get(*m), caps.get(*m)))
        .collect();
    tracing::info!(
        grown = ?sizes,
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        maps = %dataplane.maps_dir.display(),
        "maps grew before they filled: the programs use the larger ones"
    );
    Ok(true)
}
