//! The agent's listeners: bound before anything else happens (a port in use stops the agent
//! with nothing touched), then served once the loop starts.
use std::{net::SocketAddr, sync::Arc};

use anyhow::Context as _;

use super::{AgentConfig, Shared, http, probes};

/// The listeners, bound before anything else happens.
pub struct Listeners {
    health: Option<std::net::TcpListener>,
    metrics: Option<std::net::TcpListener>,
    prometheus: Option<std::net::TcpListener>,
    kube_proxy_healthz: Option<std::net::TcpListener>,
}

impl Listeners {
    /// Binds every address; a port in use fails here, before the data path is touched.
    pub fn bind(config: &AgentConfig) -> anyhow::Result<Self> {
        let bind = |addr: Option<SocketAddr>, what: &str| -> anyhow::Result<_> {
            addr.map(|a| {
                let l = std::net::TcpListener::bind(a)
                    .with_context(|| format!("binding the {what} address {a}"))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .transpose()
        };
        Ok(Self {
            health: bind(config.health_listen, "health")?,
            metrics: bind(config.metrics_listen, "metrics")?,
            prometheus: bind(config.prometheus_listen, "prometheus")?,
            kube_proxy_healthz: config
                .kube_proxy_healthz
                .map(|a| {
                    let l = listen_like_go(a)
                        .with_context(|| format!("binding the kube-proxy healthz address {a}"))?;
                    l.set_nonblocking(true)?;
                    anyhow::Ok(l)
                })
                .transpose()
                .context(
                    "kube-proxy serves this port while it runs: next to kube-proxy, leave \
                     --kube-proxy-healthz off",
                )?,
        })
    }
}

/// A listener as Go's `net.Listen("tcp", addr)` makes it, which kube-proxy's health server
/// uses: the unspecified address (`0.0.0.0` or `::`) becomes one IPv6 socket with
/// `IPV6_V6ONLY` off, answering IPv4 and IPv6 whatever `net.ipv6.bindv6only` says (an IPv4
/// socket where the kernel has no IPv6); any other address listens on itself only.
fn listen_like_go(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    if !addr.ip().is_unspecified() {
        return std::net::TcpListener::bind(addr);
    }
    let any_v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
    let fd = match rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::AFNOSUPPORT) => return std::net::TcpListener::bind(any_v4),
        Err(e) => return Err(e.into()),
    };
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_ipv6_v6only(&fd, false)?;
    let any_v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), addr.port());
    rustix::net::bind(&fd, &any_v6)?;
    rustix::net::listen(&fd, 128)?;
    Ok(std::net::TcpListener::from(fd))
}

/// Serves health, metrics and status on the listeners bound at start.
pub(super) fn serve(listeners: Listeners, shared: &Arc<Shared>) -> anyhow::Result<()> {
    if let Some(l) = listeners.health {
        tracing::info!(listen = %l.local_addr()?, "serving /healthz, /livez, /readyz");
        tokio::spawn(http::serve_health(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if let Some(l) = listeners.kube_proxy_healthz {
        tracing::info!(listen = %l.local_addr()?, "serving kube-proxy's /healthz and /livez");
        tokio::spawn(probes::serve_kube_proxy_healthz(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if listeners.metrics.is_some() || listeners.prometheus.is_some() {
        tokio::spawn(http::refresh_affinity(shared.clone()));
    }
    if let Some(l) = listeners.metrics {
        tracing::info!(listen = %l.local_addr()?, "serving /metrics, /status, /connections");
        tokio::spawn(http::serve_metrics(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    if let Some(l) = listeners.prometheus {
        tracing::info!(listen = %l.local_addr()?, "serving /metrics alone");
        tokio::spawn(http::serve_prometheus(
            tokio::net::TcpListener::from_std(l)?,
            shared.clone(),
        ));
    }
    Ok(())
}
