//! The outside path's desired table, one per family: `OutsideState` → `Ruleset` (chains with
//! their rules, maps and sets with their elements), in nftables' own language. Pure.
//!
//! The layout is kube-proxy's nftables proxier's (`pkg/proxy/nftables/proxier.go`), written
//! anew: base chains at the same hooks and priorities (the source-range check before DNAT, the
//! no-endpoint checks after it, so `reject` never runs in prerouting), one verdict map from
//! address, protocol and port to a Service port's external chain, one from protocol and
//! NodePort, two for Service ports without endpoints (`reject`, or `drop` under
//! externalTrafficPolicy Local with none on this node), and a mark that `nat-postrouting`
//! masquerades and clears. Per Service port: `ext-` (policy), `clu-` (cluster endpoints),
//! `loc-` (local endpoints), `fw-` (source ranges), and with ClientIP affinity one `ep-` chain
//! and one `aff-` set per endpoint. Names carry a short hash of what they stand for and the
//! readable name, so a changed meaning is a new name.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use sha2::{Digest as _, Sha256};

use crate::{
    dataplane::nft::family_keyword,
    model::Cidr,
    translate::outside::{OutsidePort, OutsideState},
    vocab::Family,
};

/// How the rules are written, beyond the Services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// The packet mark bit that asks `nat-postrouting` to masquerade (kube-proxy's 14).
    pub masquerade_bit: u8,
    /// Pod ranges (`--cluster-cidr`): under externalTrafficPolicy Local, traffic from them goes
    /// to the cluster endpoints without masquerade, as kube-proxy's local-traffic detector.
    pub cluster_cidrs: Vec<Cidr>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            masquerade_bit: 14,
            cluster_cidrs: Vec::new(),
        }
    }
}

/// One chain: its base-chain definition (type, hook, priority) if it is one, and its rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<&'static str>,
    pub rules: Vec<String>,
}

/// One map or set: its definition and its elements (key → value; "" for a set).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Map {
    pub definition: String,
    pub elements: BTreeMap<String, String>,
    /// A set the rules fill (affinity): its elements are the kernel's, never written.
    pub dynamic: bool,
}

/// One family's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub family: Option<Family>,
    pub chains: BTreeMap<String, Chain>,
    pub maps: BTreeMap<String, Map>,
}

/// The verdict maps and sets every table has.
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const NODEPORT_IPS: &str = "nodeport-ips";

/// The chain names a Service port's rules live in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortChains {
    pub external: String,
    pub cluster: String,
    pub local: String,
    pub firewall: String,
}

/// A name: a prefix, a hash of `what` (so a changed meaning is a new name), and `what` itself
/// where it fits (nftables' names end at 256 bytes; `:` of IPv6 addresses reads as `.`).
fn name(prefix: &str, what: &str) -> String {
    let digest = Sha256::digest(what.as_bytes());
    let mut out = format!("{prefix}-");
    for byte in &digest[..4] {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('-');
    for c in what.chars() {
        if out.len() >= 200 {
            break;
        }
        out.push(match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '/' | '_' | '-' | '.' => c,
            _ => '.',
        });
    }
    out
}

impl PortChains {
    pub fn of(port: &OutsidePort) -> Self {
        let base = port.name();
        Self {
            external: name("ext", &base),
            cluster: name("clu", &base),
            local: name("loc", &base),
            firewall: name("fw", &base),
        }
    }
}

/// `addr` as nftables writes it in a rule or an element.
fn ip(addr: IpAddr) -> String {
    addr.to_string()
}

/// `addr:port` as a DNAT target of its family.
fn target(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

struct Words {
    /// `ip` / `ip6`.
    fam: &'static str,
    addr_type: &'static str,
    loopback: &'static str,
    mark: String,
}

impl Words {
    fn of(family: Family, options: &RenderOptions) -> Self {
        Self {
            fam: family_keyword(family),
            addr_type: match family {
                Family::IPv4 => "ipv4_addr",
                Family::IPv6 => "ipv6_addr",
            },
            loopback: match family {
                Family::IPv4 => "127.0.0.0/8",
                Family::IPv6 => "::1",
            },
            mark: format!("{:#010x}", 1u32 << options.masquerade_bit.min(31)),
        }
    }
}

/// The table for `family`.
pub fn render(state: &OutsideState, family: Family, options: &RenderOptions) -> Ruleset {
    let w = Words::of(family, options);
    let mut set = Ruleset {
        family: Some(family),
        ..Ruleset::default()
    };
    base_chains(&mut set, &w, state, family);
    for port in state.of_family(family) {
        port_rules(&mut set, &w, port, options);
    }
    set
}

/// The chains every table has: the base chains at their hooks, the dispatch and the checks.
fn base_chain_rules(
    w: &Words,
    match_all: bool,
) -> [(&'static str, Option<&'static str>, Vec<String>); 14] {
    let fam = w.fam;
    let node_port_match = if match_all {
        format!("fib daddr type local {fam} daddr != {}", w.loopback)
    } else {
        format!("{fam} daddr @{NODEPORT_IPS}")
    };
    [
        (
            "filter-prerouting-pre-dnat",
            Some("type filter hook prerouting priority -110"),
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-output-pre-dnat",
            Some("type filter hook output priority -110"),
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-input",
            Some("type filter hook input priority 0"),
            vec![
                "ct state new jump nodeport-endpoints-check".into(),
                "ct state new jump service-endpoints-check".into(),
            ],
        ),
        (
            "filter-forward",
            Some("type filter hook forward priority 0"),
            vec!["ct state new jump service-endpoints-check".into()],
        ),
        (
            "filter-output",
            Some("type filter hook output priority 0"),
            vec!["ct state new jump service-endpoints-check".into()],
        ),
        (
            "nat-prerouting",
            Some("type nat hook prerouting priority -100"),
            vec!["jump services".into()],
        ),
        (
            "nat-output",
            Some("type nat hook output priority -100"),
            vec!["jump services".into()],
        ),
        (
            "nat-postrouting",
            Some("type nat hook postrouting priority 100"),
            vec!["jump masquerading".into()],
        ),
        (
            "services",
            None,
            vec![
                format!("{fam} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
                format!("{node_port_match} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
            ],
        ),
        (
            "masquerading",
            None,
            vec![format!(
                "meta mark & {m} != 0 meta mark set meta mark ^ {m} masquerade fully-random",
                m = w.mark
            )],
        ),
        ("reject-chain", None, vec!["reject".into()]),
        (
            "firewall-check",
            None,
            vec![format!(
                "{fam} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"
            )],
        ),
        (
            "service-endpoints-check",
            None,
            vec![format!(
                "{fam} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"
            )],
        ),
        (
            "nodeport-endpoints-check",
            None,
            vec![format!(
                "{node_port_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
            )],
        ),
    ]
}

fn base_chains(set: &mut Ruleset, w: &Words, state: &OutsideState, family: Family) {
    let at = w.addr_type;
    let match_all = state.node_ports_match_all.contains(&family);
    for (name, base, rules) in base_chain_rules(w, match_all) {
        set.chains.insert(name.to_string(), Chain { base, rules });
    }
    let address_map = format!("type {at} . inet_proto . inet_service : verdict");
    for (name, definition) in [
        (SERVICE_IPS, address_map.clone()),
        (
            SERVICE_NODEPORTS,
            "type inet_proto . inet_service : verdict".to_string(),
        ),
        (NO_ENDPOINT_SERVICES, address_map.clone()),
        (
            NO_ENDPOINT_NODEPORTS,
            "type inet_proto . inet_service : verdict".to_string(),
        ),
        (FIREWALL_IPS, address_map),
        (NODEPORT_IPS, format!("type {at}")),
    ] {
        set.maps.insert(
            name.to_string(),
            Map {
                definition,
                ..Map::default()
            },
        );
    }
    if !match_all {
        let elements = &mut set
            .maps
            .get_mut(NODEPORT_IPS)
            .expect("defined above")
            .elements;
        for addr in state
            .node_addresses
            .iter()
            .filter(|a| Family::of(**a) == family)
        {
            elements.insert(ip(*addr), String::new());
        }
    }
}

fn element(set: &mut Ruleset, map: &str, key: String, value: String) {
    if let Some(m) = set.maps.get_mut(map) {
        m.elements.insert(key, value);
    }
}

fn port_rules(set: &mut Ruleset, w: &Words, port: &OutsidePort, options: &RenderOptions) {
    let fam = w.fam;
    let chains = PortChains::of(port);
    let proto = port.protocol.lower();
    let no_local = port.local_policy && port.local.is_empty();
    // Where the frontends go: the external chain while any endpoint exists; else refused.
    let (verdict, fallback) = if port.has_endpoints {
        (
            Some(format!("goto {}", chains.external)),
            no_local.then(|| "drop".to_string()),
        )
    } else {
        (None, Some("goto reject-chain".to_string()))
    };
    let address_key = |addr: IpAddr| format!("{} . {proto} . {}", ip(addr), port.port);
    for (addr, _) in &port.addresses {
        if let Some(v) = &verdict {
            element(set, SERVICE_IPS, address_key(*addr), v.clone());
        }
        if let Some(v) = &fallback {
            element(set, NO_ENDPOINT_SERVICES, address_key(*addr), v.clone());
        }
    }
    if let Some(node_port) = port.node_port {
        let key = format!("{proto} . {node_port}");
        if let Some(v) = &verdict {
            element(set, SERVICE_NODEPORTS, key.clone(), v.clone());
        }
        if let Some(v) = &fallback {
            element(set, NO_ENDPOINT_NODEPORTS, key, v.clone());
        }
    }
    let firewalled: Vec<IpAddr> = port.firewalled().collect();
    if !firewalled.is_empty() {
        let ranges: Vec<String> = port
            .source_ranges
            .iter()
            .map(|c| c.network().to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // A rule per range, not an anonymous set (see `MAP_ABOVE`): inside one, back to the
        // base chain (accepted); outside them all, dropped.
        let mut rules: Vec<String> = ranges
            .iter()
            .map(|r| format!("{fam} saddr {r} return"))
            .collect();
        rules.push("drop".into());
        set.chains
            .insert(chains.firewall.clone(), Chain { base: None, rules });
        for vip in firewalled {
            element(
                set,
                FIREWALL_IPS,
                address_key(vip),
                format!("goto {}", chains.firewall),
            );
        }
    }
    if !port.has_endpoints {
        return;
    }
    let masquerade = format!("meta mark set meta mark | {}", w.mark);
    let mut external = Vec::new();
    if port.local_policy {
        for cidr in options
            .cluster_cidrs
            .iter()
            .filter(|c| Family::of(c.addr) == port.family)
        {
            external.push(format!(
                "{fam} saddr {} goto {}",
                cidr.network(),
                chains.cluster
            ));
        }
        external.push(format!("fib saddr type local {masquerade}"));
        external.push(format!("fib saddr type local goto {}", chains.cluster));
        if !port.local.is_empty() {
            external.push(format!("goto {}", chains.local));
        }
    } else {
        external.push(masquerade);
        external.push(format!("goto {}", chains.cluster));
    }
    set.chains.insert(
        chains.external.clone(),
        Chain {
            base: None,
            rules: external,
        },
    );
    endpoint_chain(set, w, port, &chains.cluster, &port.cluster);
    if port.local_policy && !port.local.is_empty() {
        endpoint_chain(set, w, port, &chains.local, &port.local);
    }
}

/// Up to this many endpoints a flow picks one by rules; above, by an anonymous map. Each
/// anonymous map or set in a table makes every later one slower to add (nftables looks for a
/// free name among them all): 10,000 Services with a map each took 16.5 s to load here, with
/// rules 0.7 s. A rule costs a first packet a few nanoseconds; a set of hundreds of endpoints
/// is better served by one lookup.
const MAP_ABOVE: usize = 64;

/// One statement per endpoint, each taken with the probability that spreads flows evenly: the
/// first with 1/N, the next with 1/(N-1) of what is left, ..., the last always (as kube-proxy's
/// iptables mode does with `statistic`).
fn spread(statements: &[String]) -> Vec<String> {
    let n = statements.len();
    statements
        .iter()
        .enumerate()
        .map(|(i, st)| {
            if n - i > 1 {
                format!("numgen random mod {} == 0 {st}", n - i)
            } else {
                st.clone()
            }
        })
        .collect()
}

/// A chain that sends each new flow to one of `endpoints`: at random, or, with ClientIP
/// affinity, to the endpoint a client's address last reached within the timeout.
fn endpoint_chain(
    set: &mut Ruleset,
    w: &Words,
    port: &OutsidePort,
    chain: &str,
    endpoints: &[SocketAddr],
) {
    if endpoints.is_empty() {
        return;
    }
    let fam = w.fam;
    let proto = port.protocol.lower();
    let mut rules = Vec::new();
    if let Some(timeout) = port.affinity_timeout_s {
        let mut jumps = Vec::new();
        for ep in endpoints {
            let what = format!("{}__{}", port.name(), ep);
            let ep_chain = name("ep", &what);
            let aff = name("aff", &format!("{what}__{timeout}s"));
            set.maps.insert(
                aff.clone(),
                Map {
                    definition: format!(
                        "type {}; flags dynamic,timeout; timeout {timeout}s",
                        w.addr_type
                    ),
                    elements: BTreeMap::new(),
                    dynamic: true,
                },
            );
            set.chains.insert(
                ep_chain.clone(),
                Chain {
                    base: None,
                    rules: vec![
                        format!("update @{aff} {{ {fam} saddr }}"),
                        format!("meta l4proto {proto} dnat {fam} to {}", target(*ep)),
                    ],
                },
            );
            rules.push(format!("{fam} saddr @{aff} goto {ep_chain}"));
            jumps.push(format!("goto {ep_chain}"));
        }
        rules.extend(spread(&jumps));
    } else if endpoints.len() > MAP_ABOVE {
        let choices: Vec<String> = endpoints
            .iter()
            .enumerate()
            .map(|(i, ep)| format!("{i} : {} . {}", ip(ep.ip()), ep.port()))
            .collect();
        rules.push(format!(
            "meta l4proto {proto} dnat {fam} addr . port to numgen random mod {} map {{ {} }}",
            endpoints.len(),
            choices.join(", ")
        ));
    } else {
        let dnats: Vec<String> = endpoints
            .iter()
            .map(|ep| format!("meta l4proto {proto} dnat {fam} to {}", target(*ep)))
            .collect();
        rules.extend(spread(&dnats));
    }
    set.chains
        .insert(chain.to_string(), Chain { base: None, rules });
}
