//! Replace mode's trap: an agent that reaches the API server through a Service's ClusterIP
//! depends on a translation only a service proxy installs. Next to kube-proxy that works; with
//! no other proxy on the node, after a reboot (empty maps) nothing translates that address and
//! the agent can never list anything. Without `--api-server`, the agent says so at start when
//! the server is the `kubernetes` Service's ClusterIP (`KUBERNETES_SERVICE_HOST`, what
//! in-cluster configuration uses), and after its first sync when the server is any Service
//! frontend in its own maps; loudest when no kube-proxy answers on the node.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

/// kube-proxy's health server (`--healthz-bind-address`, 0.0.0.0:10256 by default), as the
/// agent reaches it from the host network.
pub(super) const KUBE_PROXY_HEALTHZ: &str = "127.0.0.1:10256";

/// Why the API server's address is a ClusterIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClusterIp {
    /// It is `KUBERNETES_SERVICE_HOST`: the `kubernetes` Service.
    KubernetesService,
    /// It is a Service frontend in socklb's own maps.
    Frontend,
}

/// The API server's address, when the agent found it without `--api-server`.
#[derive(Debug)]
pub(super) struct ApiRoute {
    pub server: SocketAddr,
    /// The agent serves kube-proxy's health port itself (`--kube-proxy-healthz`): what answers
    /// there is not kube-proxy.
    pub kube_proxy_replaced: bool,
    warned: bool,
}

impl ApiRoute {
    /// From the client configuration's server URL; `None` when the host is a name (the agent
    /// cannot tell what it resolves to through whom).
    pub(super) fn new(scheme: Option<&str>, host: Option<&str>, port: Option<u16>) -> Option<Self> {
        let host = host?.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = host.parse().ok()?;
        let port = port.unwrap_or(if scheme == Some("http") { 80 } else { 443 });
        Some(Self {
            server: SocketAddr::new(ip, port),
            kube_proxy_replaced: false,
            warned: false,
        })
    }

    /// At start: whether the server is the `kubernetes` Service's ClusterIP.
    pub(super) fn check_start(
        &mut self,
        kubernetes_service_host: Option<&str>,
    ) -> Option<ClusterIp> {
        let service_ip = kubernetes_service_host
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|h| h.parse::<IpAddr>().ok())?;
        (service_ip == self.server.ip()).then(|| self.warn(ClusterIp::KubernetesService))?
    }

    /// After a sync: whether the server is a Service frontend in the maps (said once).
    pub(super) fn check_frontend(&mut self, is_frontend: bool) -> Option<ClusterIp> {
        (is_frontend && !self.warned).then(|| self.warn(ClusterIp::Frontend))?
    }

    fn warn(&mut self, why: ClusterIp) -> Option<ClusterIp> {
        if self.warned {
            return None;
        }
        self.warned = true;
        let what = match why {
            ClusterIp::KubernetesService => {
                "the `kubernetes` Service's ClusterIP (KUBERNETES_SERVICE_HOST)"
            }
            ClusterIp::Frontend => "a Service's ClusterIP that socklb itself translates",
        };
        if !self.kube_proxy_replaced && kube_proxy_answers() {
            tracing::warn!(
                server = %self.server,
                "the agent reaches the API server through {what}: that works while kube-proxy \
                 runs on this node (it answers on {KUBE_PROXY_HEALTHZ}); before removing \
                 kube-proxy, set --api-server (SOCKLB_API_SERVER) to the API server's real \
                 address"
            );
        } else {
            tracing::error!(
                server = %self.server,
                "the agent reaches the API server through {what}, and no kube-proxy answers \
                 on this node ({KUBE_PROXY_HEALTHZ}): only socklb's own maps can translate that \
                 address, so after a reboot (empty maps) the agent could never list anything. \
                 Set --api-server (SOCKLB_API_SERVER) to the API server's real address"
            );
        }
        Some(why)
    }
}

/// Whether something answers HTTP on kube-proxy's health port.
fn kube_proxy_answers() -> bool {
    let Ok(addr) = KUBE_PROXY_HEALTHZ.parse::<SocketAddr>() else {
        return false;
    };
    let timeout = Duration::from_millis(500);
    let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    if s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 5];
    s.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ip_address_is_judged() {
        assert!(ApiRoute::new(Some("https"), Some("api.example.com"), Some(6443)).is_none());
        let r = ApiRoute::new(Some("https"), Some("10.96.0.1"), None).expect("an address");
        assert_eq!(r.server, "10.96.0.1:443".parse().expect("addr"));
        let r = ApiRoute::new(Some("http"), Some("[fd00:96::1]"), None).expect("an address");
        assert_eq!(r.server, "[fd00:96::1]:80".parse().expect("addr"));
    }

    #[test]
    fn the_kubernetes_service_host_is_a_cluster_ip_and_said_once() {
        let mut r = ApiRoute::new(Some("https"), Some("10.96.0.1"), Some(443)).expect("addr");
        assert_eq!(r.check_start(Some("10.96.0.2")), None);
        assert_eq!(r.check_start(None), None);
        assert_eq!(
            r.check_start(Some("10.96.0.1")),
            Some(ClusterIp::KubernetesService)
        );
        assert_eq!(r.check_frontend(true), None, "said once");

        let mut r = ApiRoute::new(Some("https"), Some("192.0.2.10"), Some(6443)).expect("addr");
        assert_eq!(r.check_start(Some("10.96.0.1")), None);
        assert_eq!(r.check_frontend(false), None);
        assert_eq!(r.check_frontend(true), Some(ClusterIp::Frontend));
        assert_eq!(r.check_frontend(true), None);
    }
}
