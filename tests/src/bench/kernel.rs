//! The kernel cost of socklb's programs, per run, against an empty program on the same hook,
//! attached to the same cgroup and run by the same system calls (see [`super::floor`]).
//!
//! The first program a hook runs after a connection's kernel work pays for what that work left
//! cold. So passes come in pairs: in one the floors are unlinked and socklb's programs run alone
//! on their hooks; in the other the floors are linked before them ([`Order`]), where they pay
//! what a program alone pays (which comes first alternates from pair to pair). Each figure is
//! socklb's ns per run alone ÷ the empty program's linked, its median over the pairs; the ratio
//! within the linked pass (socklb's program after the floors, reading low) is reported beside
//! it. A kernel that cannot
//! put a program first has the floors after socklb's (reading warm: the figure reads high), and
//! the report says so.
use std::{net::SocketAddr, path::Path};

use anyhow::Context as _;
use lb_common::{MapId, ports};
use serde::Serialize;
use socklb::dataplane::{loader::attached_programs, pins::PinFolder};

use super::{
    floor::{BpfStats, Floor, Hook, Order},
    stats::{Spread, median},
    world::{
        BACKEND_TCP, BACKEND_UDP, DNS_PORT, HTTP_PORT, VIP, VIP_AFFINITY, VIP6, World, all_vips,
        all_vips6, backends, backends6,
    },
};
use crate::client::{Command as ClientCommand, Op};

/// One program on one kind of call.
#[derive(Clone, Debug, Serialize)]
pub struct KernelCost {
    pub name: String,
    pub hook: Hook,
    /// socklb's ns per run in the passes with the floors unlinked: alone on its hook.
    pub socklb_ns: Spread,
    /// The empty program's in the passes with the floors linked: first on the hook (last where
    /// the kernel cannot put it first, see `floors_first`).
    pub floor_ns: Spread,
    /// Pair by pair, socklb's ns alone ÷ the empty program's in the pair's linked pass.
    pub ratio: Spread,
    /// Whether the floors ran first on their hooks (the kernel could link them there).
    pub floors_first: bool,
    /// socklb ÷ the empty program within the passes with the floors linked: socklb's program
    /// after them reads low (they paid for its cold lines), before them high.
    pub ratio_linked: Spread,
    /// connect4 only: a program that reads one word of socklb's `PORTS` array (a line of its
    /// own, as cold as socklb's), run by the same calls: what any prefilter costs at the least.
    /// Its ns in the passes with the floors linked: where they go first, right after the empty
    /// program (which pays for the lines every program finds cold) and before socklb's.
    pub word_floor_ns: Option<Spread>,
    /// socklb's ns alone ÷ that program's, pair by pair.
    pub word_ratio: Option<Spread>,
    /// socklb program runs per pass (checks the workload reached the program).
    pub runs: u64,
}

/// The cost of closing a socket: no socklb program runs then; the kernel frees a translated
/// socket's record with the socket. Measured as `close()` of a translated UDP socket ÷ `close()`
/// of an untranslated one, from the same client.
#[derive(Clone, Debug, Serialize)]
pub struct CloseCost {
    /// socklb programs attached to a socket-release hook.
    pub release_programs: usize,
    /// A connected UDP socket.
    pub translated_us: Spread,
    pub untranslated_us: Spread,
    pub ratio: Spread,
    /// A TCP connection (a line each way before it closes), through the service against one
    /// made to a backend directly.
    pub tcp: CloseWall,
}

/// `close()`'s wall time, of a socket translated and of one never translated.
#[derive(Clone, Debug, Serialize)]
pub struct CloseWall {
    pub translated_us: Spread,
    pub untranslated_us: Spread,
    pub ratio: Spread,
}

struct Workload {
    name: String,
    command: ClientCommand,
    hooks: Vec<Hook>,
}

impl Workload {
    /// `count` TCP connections (connect, a line each way, close), each to one of `targets`,
    /// timing the programs on `hook`.
    fn connections(
        name: impl Into<String>,
        targets: Vec<SocketAddr>,
        count: usize,
        hook: Hook,
    ) -> Self {
        Self {
            name: name.into(),
            command: ClientCommand::Bench { targets, count },
            hooks: vec![hook],
        }
    }
}

/// A port nothing listens on in the backend pods and no service uses.
const CLOSED_PORT: u16 = 9;

/// The workload that runs every program a socket that never meets a Service meets: a TCP
/// connection to a live pod's address (connect4, getpeername4, then close: `sock_release`). Its
/// programs' nanoseconds are also summed per pass into one row of its own.
pub const WHOLE_LIFE: &str = "a TCP connection to a pod, no service: its whole life";

fn workloads(services: usize, services6: usize, count: usize, tcp_label: &str) -> Vec<Workload> {
    let vip_tcp = all_vips(services);
    let vip_udp = vec![SocketAddr::new(VIP.parse().expect("VIP"), DNS_PORT)];
    let on_service_port: Vec<SocketAddr> = backends(HTTP_PORT);
    let mut loads = vec![
        Workload::connections(
            format!("connect4, service hit, TCP, {tcp_label}, spread over all services"),
            vip_tcp.clone(),
            count,
            Hook::Connect4,
        ),
        Workload::connections(
            format!("connect4, service hit, TCP, {tcp_label}, one service (hot maps)"),
            vec![SocketAddr::new(VIP.parse().expect("VIP"), HTTP_PORT)],
            count,
            Hook::Connect4,
        ),
        Workload::connections(
            format!("connect4, service hit, TCP, {tcp_label}, sessionAffinity ClientIP (hot maps)"),
            vec![SocketAddr::new(
                VIP_AFFINITY.parse().expect("VIP"),
                HTTP_PORT,
            )],
            count,
            Hook::Connect4,
        ),
        Workload {
            name: "connect4, service hit, UDP (socket recorded)".into(),
            command: ClientCommand::Ops {
                kind: Op::UdpConnected,
                targets: vip_udp.clone(),
                count,
            },
            hooks: vec![Hook::Connect4],
        },
        // Nothing listens there either: refused at once, so the connection's own traffic
        // does not interrupt the programs (the live-server workload below shows that).
        Workload::connections(
            "connect4, not a service, a port no service uses",
            backends(CLOSED_PORT),
            count,
            Hook::Connect4,
        ),
        Workload::connections(
            "connect4, not a service, a live server (a full TCP connection each)",
            backends(BACKEND_TCP),
            count,
            Hook::Connect4,
        ),
        // Nothing listens on the pods' port 80: refused at once, after the programs ran.
        Workload::connections(
            "connect4, not a service, a port services use",
            on_service_port,
            count,
            Hook::Connect4,
        ),
        Workload::connections(
            "sock_release, a translated TCP connection closed",
            vec![SocketAddr::new(VIP.parse().expect("VIP"), HTTP_PORT)],
            count,
            Hook::SockRelease,
        ),
        Workload::connections(
            "sock_release, a socket never translated closed",
            backends(CLOSED_PORT),
            count,
            Hook::SockRelease,
        ),
        Workload {
            name: "getpeername4, translated TCP socket".into(),
            command: ClientCommand::Ops {
                kind: Op::TcpPeerName,
                targets: vip_tcp,
                count,
            },
            hooks: vec![Hook::GetPeerName4],
        },
        Workload {
            name: "sendmsg4 / recvmsg4, unconnected UDP to a service".into(),
            command: ClientCommand::Ops {
                kind: Op::UdpUnconnected,
                targets: vip_udp,
                count,
            },
            hooks: vec![Hook::SendMsg4, Hook::RecvMsg4],
        },
    ];
    loads.splice(2..2, ipv6(count, tcp_label, services6));
    loads.extend(untranslated_peers(count));
    loads
}

/// The IPv6 rows of the IPv4 ones: a hit on the one IPv6 service, and a miss to a live pod;
/// with `services6` IPv6 services installed, a hit spread over them beside one spread over as
/// many IPv4 services.
fn ipv6(count: usize, tcp_label: &str, services6: usize) -> Vec<Workload> {
    let mut loads = vec![
        Workload {
            name: format!("connect6, service hit, TCP, {tcp_label}, one service (hot maps)"),
            command: ClientCommand::Bench {
                targets: vec![SocketAddr::new(VIP6.parse().expect("VIP6"), HTTP_PORT)],
                count,
            },
            hooks: vec![Hook::Connect6],
        },
        Workload {
            name: "connect6, not a service, a live server (a full TCP connection each)".into(),
            command: ClientCommand::Bench {
                targets: backends6(BACKEND_TCP),
                count,
            },
            hooks: vec![Hook::Connect6],
        },
        // An IPv6 connect to a pod on a port some service uses: the IPv6 miss that reads the
        // most (the port's word and the filter's).
        Workload::connections(
            "connect6, not a service, a port services use",
            backends6(HTTP_PORT),
            count,
            Hook::Connect6,
        ),
    ];
    if services6 > 0 {
        loads.extend([
            Workload {
                name: format!(
                    "connect6, service hit, TCP, {tcp_label}, spread over {services6} IPv6 services"
                ),
                command: ClientCommand::Bench {
                    targets: all_vips6(services6),
                    count,
                },
                hooks: vec![Hook::Connect6],
            },
            Workload {
                name: format!(
                    "connect4, service hit, TCP, {tcp_label}, spread over {services6} IPv4 services (beside the IPv6 row)"
                ),
                command: ClientCommand::Bench {
                    targets: all_vips(services6),
                    count,
                },
                hooks: vec![Hook::Connect4],
            },
        ]);
    }
    loads
}

/// The reverse programs' other path: a peer on a port backends use, on a socket that was never
/// translated (a pod talking to another pod's address on such a port: a scrape, a
/// `StatefulSet`'s peers), which looks for a record and finds none.
fn untranslated_peers(count: usize) -> Vec<Workload> {
    vec![
        Workload {
            name: "getpeername4, a TCP connection made directly to a backend (never translated)"
                .into(),
            command: ClientCommand::Ops {
                kind: Op::TcpPeerName,
                targets: backends(BACKEND_TCP),
                count,
            },
            hooks: vec![Hook::GetPeerName4],
        },
        Workload {
            name: WHOLE_LIFE.into(),
            command: ClientCommand::Ops {
                kind: Op::TcpPeerName,
                targets: backends(BACKEND_TCP),
                count,
            },
            hooks: vec![Hook::Connect4, Hook::GetPeerName4, Hook::SockRelease],
        },
        Workload {
            name: "sendmsg4 / recvmsg4, unconnected UDP directly to a backend (never translated)"
                .into(),
            command: ClientCommand::Ops {
                kind: Op::UdpUnconnected,
                targets: backends(BACKEND_UDP),
                count,
            },
            hooks: vec![Hook::SendMsg4, Hook::RecvMsg4],
        },
        Workload {
            name: "getpeername6, a TCP connection made directly to a backend (never translated)"
                .into(),
            command: ClientCommand::Ops {
                kind: Op::TcpPeerName,
                targets: backends6(BACKEND_TCP),
                count,
            },
            hooks: vec![Hook::GetPeerName6],
        },
        Workload {
            name: "sendmsg6 / recvmsg6, unconnected UDP directly to a backend (never translated)"
                .into(),
            command: ClientCommand::Ops {
                kind: Op::UdpUnconnected,
                targets: backends6(BACKEND_UDP),
                count,
            },
            hooks: vec![Hook::SendMsg6, Hook::RecvMsg6],
        },
    ]
}

/// (runs, ns) of socklb's program on `hook`.
fn socklb_counters(pins: &PinFolder, hook: Hook) -> anyhow::Result<(u64, u64)> {
    let p = attached_programs(pins)?
        .into_iter()
        .find(|p| p.name == hook.socklb_program())
        .with_context(|| format!("{} is not attached", hook.socklb_program()))?;
    Ok((p.run_count, p.run_time_ns))
}

fn per_run(before: (u64, u64), after: (u64, u64)) -> (u64, f64) {
    let runs = after.0.saturating_sub(before.0);
    let ns = after.1.saturating_sub(before.1);
    (runs, ns as f64 / runs.max(1) as f64)
}

/// Every workload, `count` calls each, in `pairs` pairs of passes: socklb's programs alone,
/// then beside empty ones. `tcp_label` says how the agent treats TCP sockets (recorded or not).
pub fn program_costs(
    world: &mut World,
    pins: &Path,
    pairs: usize,
    count: usize,
    tcp_label: &str,
    only_first: bool,
) -> anyhow::Result<Vec<KernelCost>> {
    let pins = PinFolder::new(pins);
    let cgroup = world.sandbox.cgroup.clone();
    let release = attached_programs(&pins)?
        .iter()
        .any(|p| p.name == Hook::SockRelease.socklb_program());
    let mut floors: Vec<Floor> = [
        Hook::Connect4,
        Hook::Connect6,
        Hook::SendMsg4,
        Hook::RecvMsg4,
        Hook::GetPeerName4,
        Hook::SendMsg6,
        Hook::RecvMsg6,
        Hook::GetPeerName6,
        Hook::SockRelease,
    ]
    .into_iter()
    .filter(|h| release || *h != Hook::SockRelease)
    .map(|h| Floor::attach(h, &cgroup))
    .collect::<anyhow::Result<_>>()?;
    // Word 0x8000 / 64 away from the live server's port word: another line of the same
    // array, 4 KiB off, so socklb's read does not warm it.
    let mut word_floor = Floor::attach_word_reader(
        Hook::Connect4,
        &cgroup,
        &pins
            .current()
            .context("no map generation pinned")?
            .join(MapId::Ports.name()),
        ports::frontend_port_word(false, BACKEND_TCP ^ 0x8000),
    )?;
    // Whether the kernel can run the floors first (see `Order`); they start last, as attached.
    let place = match floors[0].relink(Order::FloorFirst) {
        Ok(()) => Order::FloorFirst,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Order::FloorLast,
        Err(e) => return Err(e).context("linking an empty program before socklb's"),
    };
    let _stats = BpfStats::enable()?;
    let mut loads = workloads(world.services, world.services6, count, tcp_label);
    loads.retain(|w| release || !w.hooks.contains(&Hook::SockRelease));
    if only_first {
        loads.truncate(2);
    }
    // (workload, hook) → per pass
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); loads.iter().map(|w| w.hooks.len()).sum()];
    let client = &mut world.runner(super::datapath::Case::Socklb)?.client;
    client.run(&loads[0].command)?;
    for pass in 0..2 * pairs {
        // Alone first in even pairs, linked first in odd ones: a drift within a pair (caches
        // warming over a run, the machine's hour) falls on both sides alike.
        let alone = (pass % 2 == 0) != ((pass / 2) % 2 == 1);
        if alone {
            for f in floors.iter_mut().chain([&mut word_floor]) {
                f.unlink();
            }
        } else {
            // Each link goes to the front or the back of the hook's list as it is made: the
            // one-word program is linked before the empty ones, so on connect4 the empty
            // program runs first (the figure's floor), then the one-word program, then
            // socklb's (at the back: socklb's, the one-word, the empty).
            for f in [&mut word_floor].into_iter().chain(floors.iter_mut()) {
                f.relink(place)
                    .with_context(|| format!("linking the {:?} floor {place:?}", f.hook))?;
            }
        }
        let floor = |hook: Hook| floors.iter().find(|f| f.hook == hook).context("floor");
        let mut slot = 0;
        for w in &loads {
            let mut before = Vec::new();
            for &h in &w.hooks {
                before.push((
                    socklb_counters(&pins, h)?,
                    floor(h)?.counters()?,
                    word_floor.counters()?,
                ));
            }
            let reply = client.run(&w.command)?;
            anyhow::ensure!(reply.ok, "{}: {:?}", w.name, reply.error);
            for (i, &h) in w.hooks.iter().enumerate() {
                let (runs, s_ns) = per_run(before[i].0, socklb_counters(&pins, h)?);
                let (_, f_ns) = per_run(before[i].1, floor(h)?.counters()?);
                let (_, w_ns) = per_run(before[i].2, word_floor.counters()?);
                anyhow::ensure!(runs > 0, "{}: {} did not run", w.name, h.socklb_program());
                samples[slot].push(Sample {
                    socklb_ns: s_ns,
                    floor_ns: f_ns,
                    runs,
                    word_ns: w_ns,
                    alone,
                });
                slot += 1;
            }
        }
    }
    Ok(costs_of(&loads, &samples, place == Order::FloorFirst))
}

/// Each workload's program on each hook, and the whole life's sum.
fn costs_of(loads: &[Workload], samples: &[Vec<Sample>], floors_first: bool) -> Vec<KernelCost> {
    let mut out = Vec::new();
    let mut slot = 0;
    for w in loads {
        for &h in &w.hooks {
            let name = if w.hooks.len() > 1 {
                format!("{} ({})", w.name, h.socklb_program())
            } else {
                w.name.clone()
            };
            out.push(cost_of(name, h, &samples[slot], floors_first));
            slot += 1;
        }
        if w.name == WHOLE_LIFE {
            let parts = &samples[slot - w.hooks.len()..slot];
            out.push(whole_life(parts, floors_first));
        }
    }
    out
}

/// The programs of one workload summed per pass, as one row: `WHOLE_LIFE (sum)`.
fn whole_life(parts: &[Vec<Sample>], floors_first: bool) -> KernelCost {
    let passes = parts.iter().map(Vec::len).min().unwrap_or(0);
    let summed: Vec<Sample> = (0..passes)
        .map(|i| Sample {
            socklb_ns: parts.iter().map(|p| p[i].socklb_ns).sum(),
            floor_ns: parts.iter().map(|p| p[i].floor_ns).sum(),
            runs: parts.iter().map(|p| p[i].runs).min().unwrap_or(0),
            word_ns: 0.0,
            alone: parts[0][i].alone,
        })
        .collect();
    cost_of(
        format!("{WHOLE_LIFE} (sum)"),
        Hook::SockRelease,
        &summed,
        floors_first,
    )
}

/// The hit's cost (spread and hot) while `socklb monitor` reads the decisions: a reader claims
/// the stream and drains it on a thread of its own, as the command does.
pub fn monitor_costs(
    world: &mut World,
    pins: &Path,
    pairs: usize,
    count: usize,
) -> anyhow::Result<(Vec<KernelCost>, u64)> {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    };
    let maps = PinFolder::new(pins)
        .current()
        .context("no map generation pinned")?;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let mut reader = socklb::dataplane::events::Reader::open(&maps)?;
    let reading = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut claimed = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if claimed.elapsed() >= std::time::Duration::from_secs(1) {
                    reader.claim()?;
                    claimed = std::time::Instant::now();
                }
                reader.read(std::time::Duration::from_millis(50), |_| {
                    seen.fetch_add(1, Ordering::Relaxed);
                })?;
            }
            Ok(())
        })
    };
    let costs = program_costs(world, pins, pairs, count, "socklb monitor reading", true);
    stop.store(true, Ordering::Relaxed);
    reading
        .join()
        .map_err(|_| anyhow::anyhow!("the monitor's reader panicked"))??;
    Ok((costs?, seen.load(Ordering::Relaxed)))
}

/// One pass of one workload on one hook.
#[derive(Clone)]
struct Sample {
    socklb_ns: f64,
    floor_ns: f64,
    /// socklb program runs.
    runs: u64,
    /// The one-word program's ns per run.
    word_ns: f64,
    /// The floors unlinked: socklb's program alone on its hook.
    alone: bool,
}

/// One program's figures over its pairs of passes (socklb's alone and the floors linked, in
/// either order: first on the hook when `floors_first`).
fn cost_of(name: String, hook: Hook, s: &[Sample], floors_first: bool) -> KernelCost {
    // (socklb alone, the floors linked), from each pair in either order.
    let pairs: Vec<(&Sample, &Sample)> = s
        .chunks_exact(2)
        .filter_map(|p| match (p[0].alone, p[1].alone) {
            (true, false) => Some((&p[0], &p[1])),
            (false, true) => Some((&p[1], &p[0])),
            _ => None,
        })
        .collect();
    let spread = |f: &dyn Fn(&Sample, &Sample) -> f64| {
        Spread::of(&pairs.iter().map(|(a, l)| f(a, l)).collect::<Vec<_>>())
    };
    KernelCost {
        name,
        hook,
        socklb_ns: spread(&|a, _| a.socklb_ns),
        floor_ns: spread(&|_, l| l.floor_ns),
        ratio: spread(&|a, l| a.socklb_ns / l.floor_ns),
        floors_first,
        ratio_linked: spread(&|_, l| l.socklb_ns / l.floor_ns),
        word_floor_ns: (hook == Hook::Connect4).then(|| spread(&|_, l| l.word_ns)),
        word_ratio: (hook == Hook::Connect4).then(|| spread(&|a, l| a.socklb_ns / l.word_ns)),
        runs: s.first().map_or(0, |x| x.runs),
    }
}

/// `close()` of translated and untranslated sockets (connected UDP, and TCP connections),
/// `passes` times, `count` each.
pub fn close_cost(
    world: &mut World,
    pins: &Path,
    passes: usize,
    count: usize,
) -> anyhow::Result<CloseCost> {
    let release_programs = attached_programs(&PinFolder::new(pins))?
        .iter()
        .filter(|p| p.name.contains("release"))
        .count();
    let client = &mut world.runner(super::datapath::Case::Socklb)?.client;
    let mut p50 = |kind: Op, targets: &Vec<SocketAddr>| -> anyhow::Result<f64> {
        let reply = client.run(&ClientCommand::Ops {
            kind,
            targets: targets.clone(),
            count,
        })?;
        anyhow::ensure!(
            reply.ok && reply.failures() == 0,
            "close: {:?}",
            reply.errors
        );
        let mut l = reply.latencies_ns;
        l.sort_unstable();
        Ok(median(&l) / 1e3)
    };
    let mut wall = |kind: Op, vip: Vec<SocketAddr>, direct: Vec<SocketAddr>| {
        let (mut through_vip, mut direct_us, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pass in 0..passes {
            let (translated, untranslated) = if pass % 2 == 0 {
                let translated = p50(kind, &vip)?;
                (translated, p50(kind, &direct)?)
            } else {
                let untranslated = p50(kind, &direct)?;
                (p50(kind, &vip)?, untranslated)
            };
            through_vip.push(translated);
            direct_us.push(untranslated);
            ratios.push(translated / untranslated);
        }
        anyhow::Ok(CloseWall {
            translated_us: Spread::of(&through_vip),
            untranslated_us: Spread::of(&direct_us),
            ratio: Spread::of(&ratios),
        })
    };
    let udp = wall(
        Op::UdpClose,
        vec![SocketAddr::new(VIP.parse()?, DNS_PORT)],
        backends(BACKEND_UDP),
    )?;
    let tcp = wall(
        Op::TcpClose,
        vec![SocketAddr::new(VIP.parse()?, HTTP_PORT)],
        backends(BACKEND_TCP),
    )?;
    Ok(CloseCost {
        release_programs,
        translated_us: udp.translated_us,
        untranslated_us: udp.untranslated_us,
        ratio: udp.ratio,
        tcp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(alone: bool, socklb_ns: f64, floor_ns: f64) -> Sample {
        Sample {
            socklb_ns,
            floor_ns,
            runs: 10,
            word_ns: 50.0,
            alone,
        }
    }

    #[test]
    fn socklb_alone_is_divided_by_the_floor_of_its_pair() {
        let passes = [
            sample(true, 100.0, 0.0),
            sample(false, 60.0, 40.0),
            sample(true, 120.0, 0.0),
            sample(false, 70.0, 48.0),
        ];
        let k = cost_of("row".into(), Hook::Connect4, &passes, true);
        // socklb's ns from the passes alone, the empty program's from the linked ones:
        // 100 / 40 and 120 / 48.
        assert_eq!((k.ratio.min, k.ratio.max, k.ratio.passes), (2.5, 2.5, 2));
        assert_eq!((k.socklb_ns.min, k.socklb_ns.max), (100.0, 120.0));
        assert_eq!((k.floor_ns.min, k.floor_ns.max), (40.0, 48.0));
        // Within the linked passes: 60 / 40 and 70 / 48.
        assert_eq!((k.ratio_linked.min, k.ratio_linked.max), (70.0 / 48.0, 1.5));
        // The one-word program of the linked passes: 100 / 50 and 120 / 50.
        let w = k.word_ratio.expect("connect4");
        assert_eq!((w.min, w.max), (2.0, 2.4));
        assert!(k.floors_first);
    }

    #[test]
    fn pairs_in_either_order_and_a_pass_out_of_step_left_out() {
        let passes = [
            // Two linked passes: a pair out of step, left out.
            sample(false, 60.0, 40.0),
            sample(false, 60.0, 20.0),
            // Linked first, then alone: 90 / 30.
            sample(false, 50.0, 30.0),
            sample(true, 90.0, 0.0),
            // Alone, then linked: 80 / 40.
            sample(true, 80.0, 0.0),
            sample(false, 55.0, 40.0),
            // A last pass out of its pair.
            sample(true, 1000.0, 0.0),
        ];
        let k = cost_of("row".into(), Hook::SockRelease, &passes, false);
        assert_eq!((k.ratio.min, k.ratio.max, k.ratio.passes), (2.0, 3.0, 2));
        assert_eq!((k.socklb_ns.min, k.socklb_ns.max), (80.0, 90.0));
        assert!(!k.floors_first);
        assert!(k.word_ratio.is_none());
    }
}
