//! `socklb explain`: reads the objects from the agent's sources and the maps from the pins.
use std::{collections::BTreeMap, path::PathBuf, process::ExitCode};

use anyhow::Context as _;

use super::{DEFAULT_AGENT_ADDRESS, NodeArgs, Output, PinArgs};
use crate::{
    agent::Status,
    dataplane::{bpf::BpfServiceMaps, loader::PinFolder, maps::ServiceMaps as _},
    explain::{Link, Sources, explain, render},
    model::Store,
    source::{Object, files::read_folder},
    translate::NodeInfo,
};

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// NAMESPACE/NAME of the Service, or ADDR:PORT[/tcp|udp] of one of its frontends.
    pub target: String,
    /// Read the objects from this folder of manifests (as `agent --manifests` does).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: in-cluster config, or $KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    /// The agent's address, to ask it (GET /status) what it could not apply.
    #[arg(long, default_value = DEFAULT_AGENT_ADDRESS)]
    pub agent: String,
    /// Output format: readable text (table) or JSON.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// Exit status 0 when nothing is broken on socklb's side, 1 when a link is.
pub fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let mut node = args.node.node_info();
    let (store, rejected) = match &args.manifests {
        Some(dir) => from_manifests(dir, &mut node)?,
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(from_api(args.kubeconfig.as_deref(), &mut node))?,
    };
    let pins = PinFolder::new(&args.pins.pin_folder);
    let snapshot = if pins.exists() {
        Some(BpfServiceMaps::open_pinned(&pins.maps(), true)?.read_all()?)
    } else {
        None
    };
    let agent = agent_status(&args.agent);
    let explanation = explain(
        &Sources {
            store: &store,
            rejected: &rejected,
            node: &node,
            maps: snapshot.as_ref(),
            agent: agent.as_ref(),
        },
        &args.target,
    );
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
        Output::Table => print!("{}", render(&explanation)),
    }
    Ok(if explanation.broken == Link::None {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

type Loaded = (Store, BTreeMap<String, String>);

fn load(objects: Vec<Object>) -> Store {
    let mut store = Store::new();
    for o in objects {
        match o {
            Object::Service(s) => {
                store.upsert_service(*s);
            }
            Object::EndpointSlice(s) => {
                store.upsert_slice(*s);
            }
        }
    }
    store
}

fn from_manifests(dir: &std::path::Path, node: &mut NodeInfo) -> anyhow::Result<Loaded> {
    let contents = read_folder(dir).with_context(|| format!("reading {}", dir.display()))?;
    if let Some(n) = contents
        .nodes
        .iter()
        .find(|n| Some(n.name.as_str()) == node.name.as_deref())
    {
        fill_node(node, n);
    }
    let rejected = contents
        .errors
        .into_iter()
        .filter_map(|(object, message)| object.map(|o| (o, message)))
        .collect();
    let mut objects = contents.services;
    objects.extend(contents.slices);
    Ok((load(objects), rejected))
}

fn fill_node(node: &mut NodeInfo, n: &crate::model::NodeObject) {
    if node.zone.is_none() {
        node.zone.clone_from(&n.zone);
    }
    if node.addresses.is_empty() {
        node.addresses.clone_from(&n.addresses);
    }
}

async fn from_api(
    kubeconfig: Option<&std::path::Path>,
    node: &mut NodeInfo,
) -> anyhow::Result<Loaded> {
    use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
    use kube::{Api, api::ListParams};

    use crate::model::{node_from_api, service_from_api, slice_from_api};

    let client = crate::source::kube::client(kubeconfig).await?;
    let mut objects = Vec::new();
    let mut rejected = BTreeMap::new();
    let services: Api<core::Service> = Api::all(client.clone());
    for s in services.list(&ListParams::default()).await?.items {
        match service_from_api(&s) {
            Ok(s) => objects.push(Object::Service(Box::new(s))),
            Err(e) => {
                rejected.insert(format!("{} {}", e.kind, e.object), e.to_string());
            }
        }
    }
    let slices: Api<discovery::EndpointSlice> = Api::all(client.clone());
    for s in slices.list(&ListParams::default()).await?.items {
        match slice_from_api(&s) {
            Ok(s) => objects.push(Object::EndpointSlice(Box::new(s))),
            Err(e) => {
                rejected.insert(format!("{} {}", e.kind, e.object), e.to_string());
            }
        }
    }
    if let Some(name) = node.name.clone() {
        let nodes: Api<core::Node> = Api::all(client);
        if let Ok(n) = nodes.get(&name).await {
            fill_node(node, &node_from_api(&n));
        }
    }
    Ok((load(objects), rejected))
}

/// The agent's /status, if it answers within a second.
fn agent_status(addr: &str) -> Option<Status> {
    use std::io::{Read as _, Write as _};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let timeout = std::time::Duration::from_secs(1);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(b"GET /status HTTP/1.0\r\nHost: socklb\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}
