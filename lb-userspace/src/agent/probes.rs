//! The ports load balancers probe on a node, served in kube-proxy's place. Both are opt-in:
//! next to kube-proxy they are kube-proxy's ports.
//!
//! - `--health-check-node-ports`: every LoadBalancer Service with externalTrafficPolicy Local
//!   gets its `healthCheckNodePort` (`pkg/proxy/healthcheck/service_health.go`): any path and
//!   method, 200 while this node has a ready endpoint of the Service and the proxy is healthy
//!   (`Shared::proxy_healthy`), 503 otherwise, with kube-proxy's body and headers. Without it
//!   a cloud load balancer marks every node down. The rules and the body are
//!   `translate::health`'s. It listens per family as kube-proxy's (`listen_addresses`).
//! - `--kube-proxy-healthz ADDR` (kube-proxy's `0.0.0.0:10256`, one dual-stack socket as Go's):
//!   `/healthz` and `/livez` as `pkg/proxy/healthcheck/proxy_health.go` (1.33+ JSON): both 503
//!   once a change has waited `--healthz-stale-after-s` to be written (never for an unreachable
//!   API server); `/healthz` also while the Node is not eligible (`NodeHealth`). Cloud load
//!   balancers probe it for externalTrafficPolicy Cluster Services.
//!
//! socklb does not translate traffic arriving from outside the node. Unless another component
//! carries it (`--external-traffic carried`), both tell load balancers that target nodes to
//! send this node nothing: `localEndpoints` 0 on the health-check ports, `nodeEligible` false.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, Mutex, PoisonError, RwLock, atomic::Ordering},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse as _, Response},
    routing::any,
};

use super::{Shared, http};
use crate::{
    model::NodeObject,
    status::HealthCheckPort,
    translate::{HealthCheck, HealthChecks, NodeInfo, health_check_body, of_family},
    vocab::{Family, ObjectKey},
};

/// Whether load balancers should send this node traffic, and when the agent last wrote.
#[derive(Debug)]
pub struct NodeHealth {
    /// kube-proxy's `nodeEligible`: the Node has been seen, is not leaving (being deleted, or
    /// tainted by the cluster autoscaler) and was not deleted; and something on this node
    /// carries the traffic load balancers send it (`--external-traffic carried`).
    pub eligible: std::sync::atomic::AtomicBool,
    /// When changes were last written (kube-proxy's `lastUpdated`).
    pub last_updated: Mutex<jiff::Timestamp>,
    /// `--external-traffic carried`: another component on this node carries Service traffic
    /// arriving from outside it, which socklb does not translate.
    pub external_traffic: bool,
}

impl NodeHealth {
    pub fn new(external_traffic: bool) -> Self {
        Self {
            eligible: false.into(),
            last_updated: Mutex::new(jiff::Timestamp::now()),
            external_traffic,
        }
    }

    /// Follows the Node object. Before it is seen the node is not eligible (kube-proxy 1.34+:
    /// its node manager has no Node; up to 1.33 it said eligible while starting up); once it is
    /// deleted, not either (kube-proxy 1.37+ exits and, restarted, has no Node).
    pub fn follow(&self, node: Option<&NodeObject>, deleted: bool) {
        let eligible = self.external_traffic && !deleted && node.is_some_and(|n| !n.leaving);
        if self.eligible.swap(eligible, Ordering::Relaxed) != eligible {
            tracing::info!(
                eligible,
                "node eligibility for load-balancer traffic changed (kube-proxy /healthz)"
            );
        }
    }

    /// After a pass: kube-proxy's `Updated` (its `lastUpdated`) once nothing queued is left
    /// unwritten.
    pub fn written<M: crate::dataplane::maps::ServiceMaps>(&self, engine: &super::Engine<M>) {
        if engine.unapplied_since().is_none() {
            *self
                .last_updated
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = jiff::Timestamp::now();
        }
    }
}

/// kube-proxy's health answer (`ProxyHealth`, 1.33+), keys in its order.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ProxyHealth {
    last_updated: String,
    current_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_eligible: Option<bool>,
    healthy: bool,
}

/// Serves kube-proxy's `/healthz` and `/livez` (other paths: 404, as its mux).
pub(super) async fn serve_kube_proxy_healthz(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
) {
    let app = Router::new()
        .route(
            "/healthz",
            any(|s: State<Arc<Shared>>| async move { proxy_health(&s, true) }),
        )
        .route(
            "/livez",
            any(|s: State<Arc<Shared>>| async move { proxy_health(&s, false) }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "404 page not found\n") })
        .with_state(shared);
    http::serve(listener, app, "kube-proxy-healthz").await;
}

fn proxy_health(shared: &Shared, with_node: bool) -> Response {
    let healthy = shared.proxy_healthy();
    let now = jiff::Timestamp::now();
    let eligible = shared.node_health.eligible.load(Ordering::Relaxed);
    let ok = healthy && (!with_node || eligible);
    // As kube-proxy: a 200 reports now as its last update, a 503 the real one.
    let last = if ok {
        now
    } else {
        *shared
            .node_health
            .last_updated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    };
    let body = ProxyHealth {
        last_updated: last.to_string(),
        current_time: now.to_string(),
        node_eligible: with_node.then_some(eligible),
        healthy,
    };
    json(
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        serde_json::to_string(&body).unwrap_or_default(),
        None,
    )
}

fn json(status: StatusCode, body: String, weight: Option<usize>) -> Response {
    let mut response = (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response();
    if let Some(w) = weight {
        response.headers_mut().insert(
            "x-load-balancing-endpoint-weight",
            header::HeaderValue::from(w),
        );
    }
    response
}

/// The open health-check ports: their listeners, and the table their handlers read.
pub(super) struct HealthCheckServers {
    shared: Arc<Shared>,
    table: Arc<RwLock<BTreeMap<u16, HealthCheck>>>,
    open: BTreeMap<u16, Server>,
    /// Ports that could not listen, with why (tried again at every sync).
    failed: BTreeMap<u16, String>,
    contested: Vec<(u16, ObjectKey)>,
}

struct Server {
    service: ObjectKey,
    /// Where it was asked to listen.
    on: Vec<ListenOn>,
    /// Where it listens.
    addresses: Vec<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// A second descriptor of each listener, to stop it listening at once.
    listeners: Vec<std::os::fd::OwnedFd>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // The listeners stop listening now, so the port can be bound again at once (on other
        // addresses after the node's changed: a listener still open on `[::]` would refuse
        // that bind until the aborted tasks are dropped, some time later).
        for l in &self.listeners {
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
        }
        // Ending the accept loop drops its listener: the port closes.
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Server {
    /// Listens on `port` at each of `listen` and serves `app` there.
    fn listen(
        service: &ObjectKey,
        port: u16,
        listen: &[ListenOn],
        app: &Router,
    ) -> anyhow::Result<Self> {
        // All or nothing, as kube-proxy: a port half open would answer for some addresses.
        let listeners = listen
            .iter()
            .map(|on| bind(*on, port))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut server = Self {
            service: service.clone(),
            on: listen.to_vec(),
            addresses: Vec::new(),
            tasks: Vec::new(),
            listeners: Vec::new(),
        };
        for l in listeners.into_iter().flatten() {
            server.addresses.push(l.local_addr()?);
            server
                .listeners
                .push(std::os::fd::AsFd::as_fd(&l).try_clone_to_owned()?);
            server.tasks.push(tokio::spawn(http::serve(
                l,
                app.clone(),
                "health-check-node-port",
            )));
        }
        Ok(server)
    }
}

/// The state one port's handler reads.
struct PortState {
    port: u16,
    table: Arc<RwLock<BTreeMap<u16, HealthCheck>>>,
    shared: Arc<Shared>,
}

impl HealthCheckServers {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            table: Arc::default(),
            open: BTreeMap::new(),
            failed: BTreeMap::new(),
            contested: Vec::new(),
        }
    }

    /// Opens, keeps or closes each port as `checks` says, on `listen` addresses (see
    /// `listen_addresses`), and updates what each answers.
    pub(super) fn sync(&mut self, checks: HealthChecks, listen: &[ListenOn]) {
        for (port, service) in &checks.contested {
            if !self.contested.contains(&(*port, service.clone())) {
                tracing::warn!(
                    port,
                    %service,
                    "healthCheckNodePort taken by an older Service: not served for this one"
                );
            }
        }
        self.contested = checks.contested;
        let wanted = checks.ports;
        self.open.retain(|port, server| {
            let keep = wanted
                .get(port)
                .is_some_and(|c| c.service == server.service)
                && server.on == listen;
            if !keep {
                tracing::info!(port, service = %server.service, "health-check port closed");
            }
            keep
        });
        self.failed.retain(|port, _| wanted.contains_key(port));
        *self.table.write().unwrap_or_else(PoisonError::into_inner) = wanted.clone();
        for (port, check) in &wanted {
            if self.open.contains_key(port) {
                continue;
            }
            match self.start(*port, &check.service, listen) {
                Ok(server) => {
                    tracing::info!(
                        port,
                        service = %check.service,
                        addresses = ?server.addresses,
                        local_endpoints = check.local_endpoints,
                        "health-check port open"
                    );
                    self.failed.remove(port);
                    self.open.insert(*port, server);
                }
                Err(e) => {
                    let error = format!("{e:#}");
                    if self.failed.get(port) != Some(&error) {
                        tracing::error!(
                            port,
                            service = %check.service,
                            error,
                            "health-check port cannot listen; load balancers will see this node down for the Service (tried again at every sync)"
                        );
                    }
                    self.failed.insert(*port, error);
                }
            }
        }
    }

    fn start(&self, port: u16, service: &ObjectKey, listen: &[ListenOn]) -> anyhow::Result<Server> {
        let state = Arc::new(PortState {
            port,
            table: self.table.clone(),
            shared: self.shared.clone(),
        });
        let app = Router::new().fallback(answer).with_state(state);
        Server::listen(service, port, listen, &app)
    }

    /// The ports as /status shows them.
    pub(super) fn report(&self) -> Vec<HealthCheckPort> {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<HealthCheckPort> = table
            .iter()
            .map(|(port, check)| HealthCheckPort {
                port: *port,
                service: check.service.clone(),
                local_endpoints: check.local_endpoints,
                listening: self
                    .open
                    .get(port)
                    .map(|s| s.addresses.clone())
                    .unwrap_or_default(),
                error: self.failed.get(port).cloned(),
            })
            .collect();
        out.extend(self.contested.iter().map(|(port, service)| HealthCheckPort {
            port: *port,
            service: service.clone(),
            local_endpoints: 0,
            listening: Vec::new(),
            error: Some(format!(
                "port {port} is another Service's healthCheckNodePort (the older one keeps it)"
            )),
        }));
        out
    }

    /// Ports wanted but not listening.
    pub(super) fn failing(&self) -> usize {
        self.failed.len() + self.contested.len()
    }
}

/// One listening socket of a health-check port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListenOn {
    /// One address (`IP_FREEBIND`: a NodePort address need not be on an interface yet).
    Ip(IpAddr),
    /// Every address of one family: `0.0.0.0`, or `[::]` with `IPV6_V6ONLY`.
    AnyOf(Family),
    /// Every address of both families: `[::]` with `IPV6_V6ONLY` off (`0.0.0.0` where the
    /// kernel has no IPv6).
    Any,
}

/// Where health-check ports listen, per family as kube-proxy's (`newServiceHealthServer` of
/// each family's proxier): a family whose NodePorts match all of its addresses on its wildcard
/// (both: one dual-stack socket), otherwise on each NodePort address of the family; a family
/// with neither listens nowhere.
pub(super) fn listen_addresses(node: &NodeInfo) -> Vec<ListenOn> {
    let all = |f| node.node_ports_match_all.contains(&f);
    if all(Family::IPv4) && all(Family::IPv6) {
        return vec![ListenOn::Any];
    }
    let mut out = Vec::new();
    for family in [Family::IPv4, Family::IPv6] {
        if all(family) {
            out.push(ListenOn::AnyOf(family));
        } else {
            out.extend(of_family(&node.addresses, family).map(ListenOn::Ip));
        }
    }
    out
}

/// A listener for `on` and `port`; `None` for an IPv6 wildcard where the kernel has no IPv6.
fn bind(on: ListenOn, port: u16) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    use anyhow::Context as _;
    let attempt = |ip: IpAddr, v6only: bool| -> std::io::Result<tokio::net::TcpListener> {
        let socket = if ip.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        if ip.is_ipv6() {
            rustix::net::sockopt::set_ipv6_v6only(&socket, v6only)?;
        }
        if !ip.is_unspecified() {
            if ip.is_ipv4() {
                rustix::net::sockopt::set_ip_freebind(&socket, true)?;
            } else {
                rustix::net::sockopt::set_ipv6_freebind(&socket, true)?;
            }
        }
        socket.bind(SocketAddr::new(ip, port))?;
        socket.listen(64)
    };
    let no_ipv6 = |e: &std::io::Error| e.raw_os_error() == Some(libc::EAFNOSUPPORT);
    let (any4, any6) = (
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    );
    let (shown, result) = match on {
        ListenOn::Ip(ip) => (ip, attempt(ip, true).map(Some)),
        ListenOn::AnyOf(Family::IPv4) => (any4, attempt(any4, false).map(Some)),
        ListenOn::AnyOf(Family::IPv6) => match attempt(any6, true) {
            Err(e) if no_ipv6(&e) => (any6, Ok(None)),
            other => (any6, other.map(Some)),
        },
        ListenOn::Any => match attempt(any6, false) {
            Err(e) if no_ipv6(&e) => (any4, attempt(any4, false).map(Some)),
            other => (any6, other.map(Some)),
        },
    };
    result.with_context(|| format!("listening on {}", SocketAddr::new(shown, port)))
}

/// One health-check port's answer, whatever the path or method.
async fn answer(State(state): State<Arc<PortState>>) -> Response {
    let check = state
        .table
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&state.port)
        .cloned();
    let Some(mut check) = check else {
        // Closing: the port is no longer wanted.
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    // Nothing on this node carries the load balancer's traffic to the endpoints: none of them
    // is reachable through this node (`--external-traffic none`).
    if !state.shared.node_health.external_traffic {
        check.local_endpoints = 0;
    }
    let healthy = state.shared.proxy_healthy();
    let status = if check.local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        health_check_body(&check, healthy),
        Some(check.local_endpoints),
    )
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use axum::Router;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::{ListenOn, Server, bind};
    use crate::vocab::ObjectKey;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn app() -> Router {
        Router::new().fallback(|| async { "answered" })
    }

    /// What a client gets from `GET /` at `addr`.
    async fn get(addr: SocketAddr) -> std::io::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// A node change moves a health-check port from the wildcard to the node's address: one
    /// sync drops the old server and binds the new one, with no await between, so the old
    /// accept task (aborted, not yet dropped by the runtime) still holds its listener. The bind
    /// must succeed then, not at the next sync (it failed with EADDRINUSE once in CI before
    /// the old listeners were shut down on drop).
    #[tokio::test]
    async fn a_port_moved_to_the_nodes_address_listens_at_once() {
        let service = ObjectKey::new("default", "lb");
        let old = Server::listen(&service, 0, &[ListenOn::Any], &app()).expect("wildcard listens");
        let port = old.addresses[0].port();
        assert!(
            get(SocketAddr::new(LOOPBACK, port))
                .await
                .expect("the wildcard answers")
                .ends_with("answered")
        );
        // The control: while the wildcard listens, the node's address cannot take the port.
        let busy = bind(ListenOn::Ip(LOOPBACK), port).expect_err("the port is taken");
        let errno = busy
            .chain()
            .find_map(|e| e.downcast_ref::<std::io::Error>())
            .and_then(std::io::Error::raw_os_error);
        assert_eq!(errno, Some(libc::EADDRINUSE), "{busy:#}");

        drop(old);
        let new = Server::listen(&service, port, &[ListenOn::Ip(LOOPBACK)], &app())
            .expect("the node's address listens in the same sync");
        assert_eq!(new.addresses, [SocketAddr::new(LOOPBACK, port)]);
        let answer = get(SocketAddr::new(LOOPBACK, port))
            .await
            .expect("the moved port answers");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("answered"), "{answer}");
    }
}
