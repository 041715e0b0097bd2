//! The per-pod bound on socket records. A socket's record in socket storage is kernel memory
//! charged to the map's owner, the agent: a pod with a million sockets would grow the agent by
//! hundreds of MiB. So the programs count each pod's records in `SOCKET_QUOTA` as they create
//! them and refuse a new one (ENOBUFS, counted as `record_quota`) once the pod holds
//! `--max-sockets-per-pod`; the release program takes a record off when its socket closes. The
//! count is what the pod holds, in the kernel, with or without an agent, at any rate of
//! short-lived sockets. (TCP connections in `CONNECTIONS` slots cost no allocation and are not
//! counted; a connected UDP socket's slot is.) `counts` reads the per-pod counts; `recount`
//! sets each pod's count to its live records made before it first read the counts, plus what
//! changed while the listing ran.
//!
//! The agent recounts from the live records only as a safety net: once after it attached its
//! programs (counts an older agent kept without the release program are corrected), and every
//! few minutes (a count the LRU forgot and started again). The recount streams the records: its
//! memory does not grow with the sockets, on either listing path.
use std::{collections::HashMap, os::fd::AsFd as _, path::Path};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use lb_common::{MapId, SockState};

use super::listing::{
    ListError, NamespaceError, for_each_entry, in_each_namespace, namespaces, state_from,
};
use crate::dataplane::{features::Listing, sys};
use crate::dataplane::{pins::SocketPins, sock_diag};

/// What one recount found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recount {
    /// Pods with a count before the recount.
    pub clients: usize,
    /// Pods with a count after it (those without live records are forgotten).
    pub clients_after: usize,
    /// Live records, over all pods.
    pub records: u64,
    /// The largest count a pod held after the recount.
    pub largest: u64,
    /// Pods at or past the bound after the recount.
    pub at_bound: usize,
    /// Counts the recount changed (0 when the kernel's counts were exact).
    pub corrected: usize,
    /// Namespaces that could not be read (their records are not in this recount).
    pub namespace_errors: usize,
}

/// The counts as the kernel holds them, by pod (signed: see `SOCKET_QUOTA`).
pub fn counts(pins: &SocketPins) -> Result<HashMap<u64, i64>, ListError> {
    let map = open(pins)?;
    Ok(map
        .iter()
        .flatten()
        .map(|(k, v)| (k, v.cast_signed()))
        .collect())
}

fn open(pins: &SocketPins) -> Result<BpfHashMap<MapData, u64, u64>, ListError> {
    let path = pins.dir.join(MapId::SocketQuota.name());
    let err = |source: std::io::Error| ListError::Map {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(|e| err(std::io::Error::other(e)))?;
    Map::from_map_data(data)
        .and_then(BpfHashMap::try_from)
        .map_err(|e| err(std::io::Error::other(e)))
}

/// Adds `held` records of `state`'s pod to `live`, if they were made before `since` (records
/// made since are in the kernel's count's move while the listing ran: see `recount`).
fn tally(live: &mut HashMap<u64, u64>, state: &SockState, held: u64, since: u64) {
    if held > 0 && state.created_ns < since {
        *live.entry(state.cgroup_id).or_default() += held;
    }
}

/// The live records in socket storage made before `since` (`CLOCK_MONOTONIC_COARSE` ns, the
/// records' clock), by pod, streamed: in one walk where the kernel allows it, else one
/// namespace of `cgroup`'s tree at a time (TCP through `sock_diag`'s storage attribute, UDP
/// through the UDP iterator).
fn live_records(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    since: u64,
) -> Result<(HashMap<u64, u64>, usize), ListError> {
    let mut live: HashMap<u64, u64> = HashMap::new();
    if listing.global {
        pins.for_each_global(|e| tally(&mut live, &e.state, 1, since))?;
        // Connected UDP sockets' slots count too (TCP connections' do not).
        if let Some(slots) = super::listing::Slots::open(pins)? {
            slots.each(|_, state| {
                if super::listing::protocol_of(&state) == Some(crate::vocab::Protocol::Udp) {
                    tally(&mut live, &state, 1, since);
                }
            })?;
        }
        return Ok((live, 0));
    }
    let sockets = if listing.tcp_per_namespace {
        Some(pins.sockets_map()?)
    } else {
        None
    };
    let udp = if listing.udp_per_namespace {
        Some(pins.udp_iter()?)
    } else {
        None
    };
    let walked = in_each_namespace(&namespaces(cgroup)?, |ns| {
        let mut here: HashMap<u64, u64> = HashMap::new();
        if let Some(map) = &sockets {
            // Both families in one walk of the node's TCP table.
            sock_diag::dump_each(
                sock_diag::IPPROTO_TCP,
                sock_diag::BOTH_FAMILIES,
                sock_diag::RECORD_STATES,
                &[map.as_fd()],
                &mut |event| match event {
                    sock_diag::Dumped::Socket(socket) => {
                        if let Some(state) =
                            socket.storages.first().and_then(|s| state_from(&s.value))
                        {
                            tally(&mut here, &state, 1, since);
                        }
                    }
                    sock_diag::Dumped::Restart => here.clear(),
                },
            )
            .map_err(|source| NamespaceError::Dump {
                path: ns.path.clone(),
                source,
            })?;
        }
        if let Some(link) = &udp {
            let iter_err = |source| NamespaceError::UdpIterator {
                path: ns.path.clone(),
                source,
            };
            let file = sys::iter_create(link.as_fd()).map_err(iter_err)?;
            // A UDP socket's value in storage and its slot each count against its pod's bound.
            for_each_entry(file, |e: &lb_common::UdpSocketEntry| {
                tally(
                    &mut here,
                    &e.state,
                    u64::from(e.addrs.holds.count_ones()),
                    since,
                );
            })
            .map_err(iter_err)?;
        }
        Ok(here)
    })?;
    let mut errors = 0;
    for (_, result) in walked {
        match result {
            Ok(here) => {
                for (pod, n) in here {
                    *live.entry(pod).or_default() += n;
                }
            }
            Err(e) if e.is_gone() => {}
            Err(_) => errors += 1,
        }
    }
    Ok((live, errors))
}

/// Sets every pod's count to its live records (plus what changed while the listing ran) where
/// they differ, and forgets pods with none. `bound` only feeds the report. Where a namespace
/// could not be read, its pods' counts are left as the kernel keeps them.
///
/// A record made after the counts were first read is in what changed; the listing may see it
/// too, so only records made before then count as live (counted twice, a pod that opened
/// sockets during a recount was held to fewer than its bound until the next one). A record
/// closed before the listing reached it is only in what changed: the count is then low by one
/// until the next recount, which only lets the pod through.
pub fn recount(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    bound: u64,
) -> Result<Recount, ListError> {
    let mut map = open(pins)?;
    let since =
        u64::try_from(crate::dataplane::sys::record_clock_now().as_nanos()).unwrap_or(u64::MAX);
    let before: HashMap<u64, i64> = map
        .iter()
        .flatten()
        .map(|(k, v)| (k, v.cast_signed()))
        .collect();
    let (live, namespace_errors) = live_records(pins, listing, cgroup, since)?;
    let mut report = Recount {
        clients: before.len(),
        namespace_errors,
        ..Recount::default()
    };
    let now: HashMap<u64, i64> = map
        .iter()
        .flatten()
        .map(|(k, v)| (k, v.cast_signed()))
        .collect();
    let mut pods: Vec<u64> = now.keys().chain(live.keys()).copied().collect();
    pods.sort_unstable();
    pods.dedup();
    for pod in pods {
        let held_now = now.get(&pod).copied().unwrap_or(0);
        let during = held_now - before.get(&pod).copied().unwrap_or(0);
        let alive = live.get(&pod).copied().unwrap_or(0);
        report.records += alive;
        let count = if namespace_errors > 0 && alive == 0 {
            // Perhaps in a namespace that could not be read: leave it.
            held_now
        } else {
            (i64::try_from(alive).unwrap_or(i64::MAX) + during).max(0)
        };
        let count_u = count.cast_unsigned();
        report.largest = report.largest.max(count_u);
        if count_u >= bound {
            report.at_bound += 1;
        }
        // A write racing the programs' atomic adds loses the adds of that moment: the count
        // is off by as many, until the next recount.
        if count == held_now && now.contains_key(&pod) {
            report.clients_after += usize::from(count != 0);
            continue;
        }
        report.corrected += 1;
        if count == 0 {
            let _ = map.remove(&pod);
        } else {
            report.clients_after += 1;
            let _ = map.insert(pod, count_u, 0);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use lb_common::SockState;

    use super::tally;

    /// A record made after the recount read the counts is already in the count's move while
    /// the listing ran: the listing does not count it again.
    #[test]
    fn records_made_during_a_recount_count_once() {
        let since = 1_000;
        let record = |pod, created_ns| SockState {
            cgroup_id: pod,
            created_ns,
            ..SockState::default()
        };
        let mut live = HashMap::new();
        tally(&mut live, &record(7, 999), 1, since);
        tally(&mut live, &record(7, 1_000), 1, since);
        tally(&mut live, &record(7, 5_000), 2, since);
        tally(&mut live, &record(8, 10), 2, since);
        tally(&mut live, &record(9, 10), 0, since);
        assert_eq!(live, HashMap::from([(7, 1), (8, 2)]));
    }
}
