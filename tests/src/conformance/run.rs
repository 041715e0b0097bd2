//! Running the cases: through the agent's engine into in-memory maps, and on real sockets.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::{Command as Process, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};
use socklb::{
    agent::Engine,
    dataplane::maps::InMemoryMaps,
    model::{AddressType, ManifestObject, parse_manifests},
    reconcile::Reconciler,
    source::{Object, SourceEvent},
    translate::{DEFAULT_PROXY_NAME, NodeFlags},
    vocab::{Kind, Protocol, ServiceAddr},
};

use super::{Case, Node, Outcome};
use crate::{Sandbox, agent::AgentOptions, bins, client::Command, processes::Owned};

/// The agent flags for a node.
pub fn node_flags(node: &Node) -> NodeFlags {
    NodeFlags {
        name: Some("node-a".into()),
        zone: node.zone.clone(),
        addresses: node
            .addresses
            .iter()
            .map(|a| a.parse().expect("node address"))
            .collect(),
        nodeport_addresses: socklb::translate::NodePortAddresses::default(),
        kube_version: node
            .kubernetes_version
            .as_deref()
            .map_or(socklb::translate::KubeVersion::NEWEST, |v| {
                socklb::translate::KubeVersion::parse(v).expect("kubernetes-version")
            }),
        proxy_name: DEFAULT_PROXY_NAME.into(),
        external_ips: true,
    }
}

/// A case's objects as source listings; fails on any document that does not parse.
fn listings(case: &Case) -> anyhow::Result<Vec<SourceEvent>> {
    let parsed = parse_manifests(&case.name, case.objects.as_bytes());
    if let Some(e) = parsed.errors.first() {
        bail!("{}: objects do not parse: {e}", case.name);
    }
    let (mut services, mut slices, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
    for o in parsed.objects {
        match o {
            ManifestObject::Service(s) => services.push(Object::Service(s)),
            ManifestObject::EndpointSlice(s) => slices.push(Object::EndpointSlice(s)),
            ManifestObject::Node(n) => nodes.push(SourceEvent::Node(n)),
        }
    }
    Ok(nodes
        .into_iter()
        .chain([
            SourceEvent::Listed {
                kind: Kind::Service,
                objects: services,
                keep: Vec::new(),
            },
            SourceEvent::Listed {
                kind: Kind::EndpointSlice,
                objects: slices,
                keep: Vec::new(),
            },
        ])
        .collect())
}

/// What the maps say a connect to `addr` gets.
fn outcome_in_maps(snap: &socklb::dataplane::maps::MapSnapshot, addr: &ServiceAddr) -> String {
    match snap.reach(addr) {
        None => "untouched".into(),
        Some(r) if r.frontend.count == 0 => {
            if r.frontend.flags & lb_common::FRONTEND_FLAG_NO_LOCAL != 0 {
                "refused (no local endpoint)".into()
            } else {
                "refused".into()
            }
        }
        Some(r) => {
            let set: BTreeSet<SocketAddr> = r.backends.into_iter().flatten().collect();
            describe(&set)
        }
    }
}

fn describe(set: &BTreeSet<SocketAddr>) -> String {
    format!(
        "backends [{}]",
        set.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The text of an expected outcome, as `outcome_in_maps` writes it.
fn expected_text(outcome: &Outcome) -> anyhow::Result<String> {
    Ok(match outcome {
        Outcome::Backends(b) => {
            let set: BTreeSet<SocketAddr> = b
                .iter()
                .map(|a| a.parse().with_context(|| format!("backend {a}")))
                .collect::<anyhow::Result<_>>()?;
            describe(&set)
        }
        Outcome::Refused => "refused".into(),
        Outcome::RefusedNoLocal => "refused (no local endpoint)".into(),
        Outcome::Untouched => "untouched".into(),
    })
}

/// Runs one case through the agent's engine (translation, address ownership, reconciler)
/// into in-memory maps, and compares what each address reaches.
pub fn in_memory(case: &Case) -> anyhow::Result<()> {
    let maps = InMemoryMaps::new();
    let reconciler = Reconciler::with_grace(maps, Duration::ZERO)?;
    let mut engine = Engine::new(reconciler, node_flags(&case.node));
    for e in listings(case)? {
        engine.handle(e);
    }
    engine.reconcile().context("nothing written")?;
    let snap = engine.reconciler().snapshot();
    let mut wrong = Vec::new();
    for (addr, outcome) in &case.expect {
        let a = ServiceAddr::parse(addr).with_context(|| format!("address {addr}"))?;
        let (got, want) = (outcome_in_maps(snap, &a), expected_text(outcome)?);
        if got != want {
            wrong.push(format!("  {addr}: expected {want}, the maps give {got}"));
        }
    }
    if !wrong.is_empty() {
        bail!(
            "{} ({}):\n{}",
            case.name,
            case.file.display(),
            wrong.join("\n")
        );
    }
    Ok(())
}

/// Every backend the cases' slices name, with its protocol (UDP or TCP), so the sandbox can
/// run a server for each: a connect that went to a backend it should not reach is answered,
/// and caught.
fn backends_of(cases: &[&Case]) -> BTreeSet<(SocketAddr, bool)> {
    let mut out = BTreeSet::new();
    for case in cases {
        for o in parse_manifests(&case.name, case.objects.as_bytes()).objects {
            let ManifestObject::EndpointSlice(s) = o else {
                continue;
            };
            if s.address_type == AddressType::Fqdn {
                continue;
            }
            for p in &s.ports {
                let Some(port) = p.port else { continue };
                for e in &s.endpoints {
                    if let Some(ip) = e.address {
                        out.insert((SocketAddr::new(ip, port), &*p.protocol == "UDP"));
                    }
                }
            }
        }
    }
    out
}

/// Every loopback address a case expects socklb to leave alone, with its protocol (UDP or
/// TCP). Loopback always routes, so "left alone" shows as reaching a listener on the address
/// itself in the client pod (where other addresses give ENETUNREACH).
fn untouched_loopback(cases: &[&Case]) -> anyhow::Result<BTreeSet<(SocketAddr, bool)>> {
    let mut out = BTreeSet::new();
    for case in cases {
        for (addr, outcome) in &case.expect {
            let a = ServiceAddr::parse(addr).with_context(|| format!("address {addr}"))?;
            if *outcome == Outcome::Untouched && a.addr.ip().is_loopback() {
                out.insert((a.addr, a.protocol == Protocol::Udp));
            }
        }
    }
    Ok(out)
}

/// Starts a server on `addr` in the client pod's own namespace (for loopback targets).
fn listen_in_client_pod(sandbox: &Sandbox, addr: SocketAddr, udp: bool) -> anyhow::Result<Owned> {
    let mut owned = sandbox
        .processes
        .spawn(
            Process::new(bins::sbx()?)
                .args([
                    "--netns",
                    &sandbox.client_ns,
                    "serve",
                    "--addr",
                    &addr.to_string(),
                ])
                .args(udp.then_some("--udp"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )
        .context("starting a loopback server in the client pod")?;
    let stdout = owned.child().stdout.take().context("server stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("loopback server {addr} did not start");
    }
    Ok(owned)
}

/// Runs every case of one node identity on real sockets: one sandbox, one agent, a server
/// for every endpoint, and a client pod that connects to every expected address. Returns one
/// line per case that failed (all cases are checked).
pub fn end_to_end(node: &Node, cases: &[&Case]) -> anyhow::Result<Vec<String>> {
    let sandbox = Sandbox::new()?;
    // One namespace for all of them: a node identity has up to some 200 backends, and a port
    // on the bridge for each loses ARP requests (see `add_backends_in_one_pod`).
    sandbox.add_backends_in_one_pod(&backends_of(cases))?;
    // Kept until the end: dropping one stops its server.
    let loopback_servers = untouched_loopback(cases)?
        .into_iter()
        .map(|(addr, udp)| listen_in_client_pod(&sandbox, addr, udp))
        .collect::<anyhow::Result<Vec<Owned>>>()?;
    for case in cases {
        sandbox.write_manifest(&format!("{}.yaml", case.name), &case.objects)?;
    }
    let mut args = vec!["--node-name".to_string(), "node-a".into()];
    if let Some(zone) = &node.zone {
        args.extend(["--zone".into(), zone.clone()]);
    }
    for a in &node.addresses {
        args.extend(["--node-address".into(), a.clone()]);
    }
    if let Some(version) = &node.kubernetes_version {
        args.extend(["--kubernetes-version".into(), version.clone()]);
    }
    let _agent = sandbox.start_agent(&AgentOptions {
        args,
        ..AgentOptions::default()
    })?;
    let mut client = sandbox.client()?;
    let mut failures = Vec::new();
    for case in cases {
        let mut wrong = Vec::new();
        for (addr, outcome) in &case.expect {
            let target = ServiceAddr::parse(addr)?;
            let udp = target.protocol == Protocol::Udp;
            // Left alone, a loopback connect reaches the listener on the address itself.
            let loopback = target.addr.ip().is_loopback();
            let expected: BTreeSet<String> = match outcome {
                Outcome::Backends(b) => b.iter().cloned().collect(),
                Outcome::Untouched if loopback => BTreeSet::from([target.addr.to_string()]),
                _ => BTreeSet::new(),
            };
            // Enough connects that every expected backend answers at least once (p > 0.9999).
            let count = 12 * expected.len().max(1);
            let reply = client.run(&Command::Connect {
                target: target.addr,
                count,
                udp,
            })?;
            let got: BTreeSet<String> = reply.backends.keys().cloned().collect();
            let errors: BTreeMap<String, usize> = reply.errors.clone();
            let ok = match outcome {
                Outcome::Backends(_) => got == expected && errors.is_empty(),
                Outcome::Refused | Outcome::RefusedNoLocal => {
                    got.is_empty() && errors.get("ECONNREFUSED") == Some(&count)
                }
                Outcome::Untouched if loopback => got == expected && errors.is_empty(),
                Outcome::Untouched => got.is_empty() && errors.get("ENETUNREACH") == Some(&count),
            };
            if !ok {
                wrong.push(format!(
                    "  {addr}: expected {}, got answers from {got:?} and errors {errors:?}",
                    expected_text(outcome)?
                ));
            }
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{} ({}):\n{}",
                case.name,
                case.file.display(),
                wrong.join("\n")
            ));
        }
    }
    drop(loopback_servers);
    Ok(failures)
}

/// The node identities the cases use, each with its cases, in a stable order.
pub fn by_node(cases: &[Case]) -> BTreeMap<Node, Vec<&Case>> {
    let mut out: BTreeMap<Node, Vec<&Case>> = BTreeMap::new();
    for c in cases {
        out.entry(c.node.clone()).or_default().push(c);
    }
    out
}

/// Checks the table itself: unique names, an origin each, and no address claimed by two cases
/// of one node (they share a sandbox).
pub fn check_table(cases: &[Case]) -> anyhow::Result<()> {
    let mut names = BTreeSet::new();
    for c in cases {
        anyhow::ensure!(names.insert(&c.name), "duplicate case name {}", c.name);
        anyhow::ensure!(!c.origin.is_empty(), "{} names no origin", c.name);
        anyhow::ensure!(!c.expect.is_empty(), "{} expects nothing", c.name);
    }
    for (node, group) in by_node(cases) {
        let mut seen: BTreeMap<ServiceAddr, &str> = BTreeMap::new();
        for c in group {
            for (addr, _) in &c.expect {
                let a = ServiceAddr::parse(addr)?;
                if let Some(other) = seen.insert(a, &c.name)
                    && other != c.name
                {
                    bail!("{addr} is used by {other} and {} (node {node:?})", c.name);
                }
            }
        }
    }
    Ok(())
}
