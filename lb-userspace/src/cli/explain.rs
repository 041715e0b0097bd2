//! `socklb explain`: reads the objects from the agent's sources and the maps from the pins.
use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;

use super::{DEFAULT_METRICS_ADDRESS, NodeArgs, Output, PinArgs, agent_status, print_output};
use crate::{
    dataplane::{bpf::ReadOnlyMaps, pins::PinFolder},
    explain::{Link, Sources, explain, render},
    model::{NodeObject, Store},
    source::files::read_folder,
    translate::{NodeInfo, ownership},
    vocab::{ObjectKey, ObjectRef, ServiceAddr},
};

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// NAMESPACE/NAME of the Service, or ADDR:PORT[/tcp|udp] of one of its frontends.
    pub target: String,
    /// Read the objects from this folder of manifests (as `agent --manifests` does).
    #[arg(long, conflicts_with = "kubeconfig", env = "SOCKLB_MANIFESTS")]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig for the Kubernetes API (default: in-cluster config, or $KUBECONFIG).
    #[arg(long, env = "SOCKLB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address, as the agent's --api-server.
    #[arg(long, env = "SOCKLB_API_SERVER")]
    pub api_server: Option<String>,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    /// The agent's metrics address, to ask it (GET /status) what it could not apply.
    #[arg(long, default_value = DEFAULT_METRICS_ADDRESS, env = "SOCKLB_AGENT")]
    pub agent: String,
    /// The cgroup v2 directory the agent attaches to, whose processes' network namespaces
    /// are walked for live connections (default: the cgroup2 mount).
    #[arg(long, env = "SOCKLB_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t, env = "SOCKLB_OUTPUT")]
    pub output: Output,
}

/// This node's live connections of one Service, with conditions from the objects explain read;
/// `None` (and a note) when the sockets cannot be listed (not root, say).
fn live_connections(
    args: &ExplainArgs,
    pins: &PinFolder,
    snapshot: &crate::dataplane::maps::MapSnapshot,
    store: &Store,
    service: ObjectKey,
) -> Option<crate::sockets::view::ConnectionsView> {
    use crate::sockets::view;
    let socket_pins = pins.current_sockets()?;
    let cgroup = args
        .cgroup
        .clone()
        .or_else(crate::dataplane::sysfs::cgroup2_mount)?;
    match view::connections(
        &socket_pins,
        &cgroup,
        socket_pins.listing(),
        snapshot,
        &crate::sockets::cluster::FromObjects::new(store),
        &view::cgroup_paths(&cgroup),
        &view::Filter {
            service: Some(service),
            backend: None,
        },
    ) {
        Ok(view) => Some(view),
        Err(e) => {
            eprintln!(
                "note: live connections not listed: {:#}",
                anyhow::Error::from(e)
            );
            None
        }
    }
}

/// What explain read: the objects, the rejected ones, and this Node.
struct Loaded {
    store: Store,
    rejected: BTreeMap<ObjectRef, String>,
    node: Option<NodeObject>,
}

/// Exit status 0 when nothing is broken on socklb's side, 1 when a link is.
pub(super) fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let flags = args.node.flags()?;
    let loaded = match &args.manifests {
        Some(dir) => from_manifests(dir, flags.name.as_deref())?,
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(from_api(args, flags.name.as_deref()))?,
    };
    // The one rule for who this node is, shared with the agent.
    // The addresses on this host's interfaces, as the agent on it sees them.
    let bound = crate::source::addresses::current().unwrap_or_default();
    let listeners = crate::source::addresses::listeners().unwrap_or_default();
    let node = NodeInfo::resolve(&flags, loaded.node.as_ref(), &bound, &listeners);
    // With manifests every Service's claims are known; from the API only the Service was
    // read, and the agent's /status says who owns contested addresses.
    let ownership = args
        .manifests
        .is_some()
        .then(|| ownership(&loaded.store, &node));
    let pins = PinFolder::new(&args.pins.pin_folder);
    let (snapshot, index) = match pins.current() {
        Some(_) => {
            let (dir, maps, mut snapshot) = super::inspect::read_current(&pins)?;
            // A generation from before the index has none: frontends are then read from
            // the hash maps, as its programs read them.
            let index = ReadOnlyMaps::new(&dir)
                .index_view()
                .inspect_err(|e| tracing::debug!(error = %e, "frontend index not read"))
                .ok();
            if let Some(index) = &index {
                maps.read_index_ranges(&mut snapshot, index)?;
            }
            (Some(snapshot), index)
        }
        None => (None, None),
    };
    let agent = agent_status(&args.agent, Duration::from_secs(1)).ok();
    let connections = snapshot.as_ref().and_then(|snap| {
        let key = crate::explain::resolve(&loaded.store, &node, &args.target)?;
        live_connections(args, &pins, snap, &loaded.store, key)
    });
    let explanation = explain(
        &Sources {
            store: &loaded.store,
            rejected: &loaded.rejected,
            node: &node,
            maps: snapshot.as_ref(),
            index: index.as_ref(),
            agent: agent.as_ref(),
            ownership: ownership.as_ref(),
            connections: connections.as_ref(),
            outside: outside_tables().as_ref(),
        },
        &args.target,
    );
    print_output(args.output, &explanation, || render(&explanation))?;
    Ok(if explanation.broken == Link::None {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The outside path's tables on this node, when the nft tool is here and they exist.
fn outside_tables() -> Option<
    std::collections::BTreeMap<crate::vocab::Family, crate::outside::installed::InstalledTable>,
> {
    let nft = crate::dataplane::nft::Nft::find().ok()?;
    let tables: std::collections::BTreeMap<_, _> =
        [crate::vocab::Family::IPv4, crate::vocab::Family::IPv6]
            .into_iter()
            .filter_map(|family| {
                let json = nft.list_json(family).ok()??;
                Some((
                    family,
                    crate::outside::installed::InstalledTable::parse(&json),
                ))
            })
            .collect();
    (!tables.is_empty()).then_some(tables)
}

fn from_manifests(dir: &std::path::Path, node_name: Option<&str>) -> anyhow::Result<Loaded> {
    let contents = read_folder(dir).with_context(|| format!("reading {}", dir.display()))?;
    let node = contents
        .nodes
        .iter()
        .find(|n| Some(n.name.as_str()) == node_name)
        .cloned();
    let rejected = contents
        .errors
        .iter()
        .filter_map(|e| e.object.clone().map(|o| (o, e.to_string())))
        .collect();
    let mut objects = contents.services;
    objects.extend(contents.slices);
    let store = crate::source::store_of(objects);
    Ok(Loaded {
        store,
        rejected,
        node,
    })
}

/// From the API: only what the answer needs (the Service, its slices by label, this Node);
/// a frontend address as target needs the Service list to find its owner.
async fn from_api(args: &ExplainArgs, node_name: Option<&str>) -> anyhow::Result<Loaded> {
    use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
    use kube::{Api, api::ListParams};

    use crate::model::{LABEL_SERVICE_NAME, node_from_api, service_from_api, slice_from_api};

    let client =
        crate::source::kube::client(args.kubeconfig.as_deref(), args.api_server.as_deref()).await?;
    let mut store = Store::new();
    let mut rejected = BTreeMap::new();
    let key = if ServiceAddr::parse(&args.target).is_ok() {
        let all: Api<core::Service> = Api::all(client.clone());
        for s in all.list(&ListParams::default()).await?.items {
            match service_from_api(&s) {
                Ok(s) => {
                    store.upsert_service(s);
                }
                Err(e) => {
                    rejected.insert(e.object.clone(), e.to_string());
                }
            }
        }
        None
    } else {
        Some(ObjectKey::parse(&args.target))
    };
    let keys: Vec<ObjectKey> = match &key {
        Some(k) => {
            let services: Api<core::Service> = Api::namespaced(client.clone(), &k.namespace);
            if let Some(s) = services.get_opt(&k.name).await? {
                match service_from_api(&s) {
                    Ok(s) => {
                        store.upsert_service(s);
                    }
                    Err(e) => {
                        rejected.insert(e.object.clone(), e.to_string());
                    }
                }
            }
            vec![k.clone()]
        }
        None => store.services().map(|s| s.key.clone()).collect(),
    };
    for k in keys {
        let slices: Api<discovery::EndpointSlice> = Api::namespaced(client.clone(), &k.namespace);
        let selector = format!("{LABEL_SERVICE_NAME}={}", k.name);
        for s in slices
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            match slice_from_api(&s) {
                Ok(s) => {
                    store.upsert_slice(s);
                }
                Err(e) => {
                    rejected.insert(e.object.clone(), e.to_string());
                }
            }
        }
    }
    let mut node = None;
    if let Some(name) = node_name {
        let nodes: Api<core::Node> = Api::all(client);
        if let Ok(n) = nodes.get(name).await {
            node = Some(node_from_api(&n));
        }
    }
    Ok(Loaded {
        store,
        rejected,
        node,
    })
}
