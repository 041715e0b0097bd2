//! What listing the live sockets costs (`socklb inspect connections`, `socklb explain`'s live
//! counts and the `socklb_live_sockets` metric, which the agent refreshes every 15 s), with N
//! connected UDP sockets held through a service, beside a floor: the kernel's own listing of
//! the same sockets (a plain `sock_diag` UDP dump in each pod's network namespace, no socket
//! storage read).
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use socklb::{
    dataplane::{pins::PinFolder, sock_diag},
    sockets::{self, NamespaceError},
};

use super::{
    stats::Spread,
    world::{DNS_PORT, VIP, World},
};
use crate::{client::Command, sandbox::Client};

#[derive(Clone, Debug, Serialize)]
pub struct ListingCost {
    /// Translated sockets held while measuring.
    pub sockets: usize,
    /// Network namespaces they are spread over.
    pub namespaces: usize,
    /// The census the agent runs for the metric and `inspect connections` (records and each
    /// socket's kernel view, namespace by namespace).
    pub census_s: Spread,
    /// The records alone, in one walk of the sockets iterator (what a count needs).
    pub records_s: Spread,
    /// The floor: the kernel's UDP dump of every namespace, nothing of socklb's read.
    pub floor_s: Spread,
    /// census ÷ floor, per pass.
    pub ratio: Spread,
}

/// Holds `count` connected UDP sockets to the DNS service from pods of the world's cgroup (a
/// few per network namespace, as the ephemeral ports allow), then lists them `passes` times
/// each way.
pub fn listing_cost(world: &World, count: usize, passes: usize) -> anyhow::Result<ListingCost> {
    let sandbox = &world.sandbox;
    let per_netns = 50_000;
    let per_process = 19_000;
    let mut held = 0;
    let mut clients: Vec<Client> = Vec::new();
    let mut namespaces = 0;
    while held < count {
        let pod = sandbox.served_pod(
            &format!("listing{namespaces}"),
            &format!("10.244.110.{}", namespaces + 1),
        )?;
        sandbox.netns_sysctl(&pod.netns, "net.ipv4.ip_local_port_range=1024 65535")?;
        namespaces += 1;
        let mut here = 0;
        while here < per_netns && held < count {
            let n = per_process.min(per_netns - here).min(count - held);
            let mut client = sandbox.client_in(&pod)?;
            let r = client.run(&Command::Hold {
                target: format!("{VIP}:{DNS_PORT}").parse()?,
                count: n,
            })?;
            let got = r.backends.get("held").copied().unwrap_or(0);
            anyhow::ensure!(got == n, "held {got} of {n} sockets: {:?}", r.errors);
            here += n;
            held += n;
            clients.push(client);
        }
    }
    let pins = PinFolder::new(sandbox.pin_folder())
        .current_sockets()
        .context("no socket maps pinned")?;
    let listing = pins.listing();
    let cgroup = &sandbox.cgroup;
    let (mut census_s, mut records_s, mut floor_s, mut ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        // What the agent does every 15 s: the census, counted into its tally as it streams.
        let start = Instant::now();
        let mut tally = sockets::view::Tally::new(sockets::record_clock_now());
        let mut found = 0;
        sockets::census_each(&pins, cgroup, listing, true, |s| {
            found += 1;
            tally.add(&s);
        })?;
        let census_t = start.elapsed().as_secs_f64();
        anyhow::ensure!(found >= held, "the census found {found} of {held} sockets");
        let start = Instant::now();
        let mut records = 0;
        sockets::census_each(&pins, cgroup, listing, false, |_| records += 1)?;
        records_s.push(start.elapsed().as_secs_f64());
        anyhow::ensure!(records >= held);
        let start = Instant::now();
        let all = sockets::namespaces(cgroup)?;
        let walked = sockets::in_each_namespace(&all, |ns| {
            sock_diag::dump(
                libc::IPPROTO_UDP as u8,
                libc::AF_INET as u8,
                sock_diag::ALL_STATES,
                &[],
            )
            .map(|v| v.len())
            .map_err(|source| NamespaceError::Dump {
                path: ns.path.clone(),
                source,
            })
        })?;
        let floor_t = start.elapsed().as_secs_f64();
        let dumped: usize = walked.iter().filter_map(|(_, r)| r.as_ref().ok()).sum();
        anyhow::ensure!(dumped >= held, "the floor's dump found {dumped} of {held}");
        census_s.push(census_t);
        floor_s.push(floor_t);
        ratio.push(census_t / floor_t);
    }
    drop(clients);
    Ok(ListingCost {
        sockets: held,
        namespaces,
        census_s: Spread::of(&census_s),
        records_s: Spread::of(&records_s),
        floor_s: Spread::of(&floor_s),
        ratio: Spread::of(&ratio),
    })
}
