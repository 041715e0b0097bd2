//! The per-client bound on socket records. A socket's record lives in the socket's own storage,
//! but the kernel charges that memory to the map's owner, the agent: a pod with a million
//! sockets would grow the agent by hundreds of MiB. So the programs count each client cgroup's
//! records in `SOCKET_QUOTA` as they create them, and refuse a new one (ENOBUFS, counted as
//! `record_quota`) once the client holds `--max-sockets-per-pod`.
//!
//! Nothing runs when a socket closes (that would cost every close on the node), so the counts
//! only grow in the kernel; the agent recounts them from the live sockets: each client's count
//! becomes its live records plus what it created while the listing ran. A client past its bound
//! gets new service sockets again once it has closed enough of them and the next recount ran.
use std::{collections::HashMap, path::Path};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use lb_common::MapId;

use super::{ListError, SocketPins, census};

use crate::dataplane::features::Listing;

/// What one recount found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recount {
    /// Client cgroups with a count before the recount.
    pub clients: usize,
    /// Client cgroups with a count after it (those without live records are forgotten).
    pub clients_after: usize,
    /// Live records, over all clients.
    pub records: u64,
    /// The largest count a client held after the recount.
    pub largest: u64,
    /// Clients at or past the bound after the recount.
    pub at_bound: usize,
}

/// The counts as the kernel holds them, by client cgroup.
pub fn counts(pins: &SocketPins) -> Result<HashMap<u64, u64>, ListError> {
    let map = open(pins)?;
    Ok(map.iter().flatten().collect())
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

/// Sets every client's count to its live records (plus what it created during the listing),
/// and forgets clients with none. `bound` only feeds the report.
pub fn recount(
    pins: &SocketPins,
    listing: Listing,
    cgroup: &Path,
    bound: u64,
) -> Result<Recount, ListError> {
    let mut map = open(pins)?;
    let before: HashMap<u64, u64> = map.iter().flatten().collect();
    // Counted as the records stream by: the recount's memory does not grow with the sockets.
    let mut live: HashMap<u64, u64> = HashMap::new();
    if listing.global {
        pins.for_each_global(|e| *live.entry(e.state.cgroup_id).or_default() += 1)?;
    } else {
        for socket in &census(pins, cgroup, listing, true)?.sockets {
            *live.entry(socket.state.cgroup_id).or_default() += 1;
        }
    }
    let mut report = Recount {
        clients: before.len(),
        ..Recount::default()
    };
    let now: HashMap<u64, u64> = map.iter().flatten().collect();
    for (client, held_now) in &now {
        let during = held_now.saturating_sub(before.get(client).copied().unwrap_or(0));
        let count = live.get(client).copied().unwrap_or(0) + during;
        report.records += live.get(client).copied().unwrap_or(0);
        report.largest = report.largest.max(count);
        if count >= bound {
            report.at_bound += 1;
        }
        // A write racing the programs' atomic adds loses the adds of that moment: the count
        // is low by as many, until the next recount.
        if count == 0 {
            let _ = map.remove(client);
        } else {
            report.clients_after += 1;
            let _ = map.insert(client, count, 0);
        }
    }
    Ok(report)
}
