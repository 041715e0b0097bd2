//! The optional parts of the data path, and what the kernel said about each.
//!
//! The core, what translation needs (the cgroup `sock_addr` programs and their maps), loads or
//! the agent exits with the kernel's reason. Every other part is tried at start: a part the
//! kernel refuses (or the admin turns off with `--disable-feature`) is reported once with the
//! kernel's errno and what is lost, in `/status` and the `socklb_feature_enabled` gauge, and
//! the agent runs without it, through a fallback where one exists. `socklb version --features`
//! runs the same probes without an agent.
//!
//! The parts (`Feature`): `sockets-iterator`, `udp-iterator`, `sock-diag-storage`,
//! `socket-destroy`, `socket-release`. What became of each at start is a `Probe` (its `State`:
//! enabled, disabled by `--disable-feature`, or refused, with the kernel's errno and reason).
//! From them, `Features` says how sockets can be listed (`Listing`), whether UDP termination,
//! the per-pod bound and the connection slots work, and in words what is lost (`losses`) and
//! which fallback stands in (`fallbacks`). Whatever depends on a part asks `Features`
//! (`listing`, `udp_termination`, `socket_bound`, `connection_slots`), never the kernel again;
//! `inspect`, which has no agent, reads which iterators are there from the pins
//! (`SocketPins::listing`). docs/requirements.md gives the same table for operators.
use std::{collections::BTreeSet, fmt};

use serde::{Deserialize, Serialize};

/// An optional part of the data path.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Feature {
    /// `iter/bpf_sk_storage_map` over `SOCKETS`: every translated socket in one walk.
    SocketsIterator,
    /// `iter/udp` reading `SOCKETS`: one network namespace's UDP sockets with a record (the
    /// fallback for UDP).
    UdpIterator,
    /// `sock_diag` with `INET_DIAG_REQ_SK_BPF_STORAGES`: TCP sockets with their record, one
    /// network namespace at a time (the fallback for TCP).
    SockDiagStorage,
    /// `sock_diag` `SOCK_DESTROY`: terminating connected UDP sockets whose backend left.
    SocketDestroy,
    /// `cgroup/sock_release`: a closing socket's record comes off its pod's count (the per-pod
    /// bound, kept exact in the kernel) and a TCP connection frees its `CONNECTIONS` slot.
    SocketRelease,
    /// The socket-cookie proof (`lb_common::proof`): close, getpeername and recvmsg of a socket
    /// that never met socklb return after a load of its cookie field, made by no helper.
    CookieProof,
}

impl Feature {
    pub const ALL: [Self; 6] = [
        Self::SocketsIterator,
        Self::UdpIterator,
        Self::SockDiagStorage,
        Self::SocketDestroy,
        Self::SocketRelease,
        Self::CookieProof,
    ];

    /// The name in flags, `/status`, metrics and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::SocketsIterator => "sockets-iterator",
            Self::UdpIterator => "udp-iterator",
            Self::SockDiagStorage => "sock-diag-storage",
            Self::SocketDestroy => "socket-destroy",
            Self::SocketRelease => "socket-release",
            Self::CookieProof => "cookie-proof",
        }
    }

    /// What the kernel needs to offer (the README's Requirements table says the same).
    pub const fn needs(self) -> &'static str {
        match self {
            Self::SocketsIterator => {
                "BPF iterator over socket-storage maps (5.10+); refused by some lockdown or hardened kernels"
            }
            Self::UdpIterator => "BPF UDP iterator with bpf_sk_storage_get (5.10+)",
            Self::SockDiagStorage => "sock_diag reporting BPF socket storage (5.4+), CAP_BPF",
            Self::SocketDestroy => {
                "sock_diag SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY), CAP_NET_ADMIN"
            }
            Self::SocketRelease => {
                "cgroup/sock_release program with bpf_sk_storage_get and bpf_get_socket_cookie (5.11+)"
            }
            Self::CookieProof => {
                "the kfunc bpf_cast_to_kern_ctx (6.2+) and the kernel's BTF (/sys/kernel/btf/vmlinux)"
            }
        }
    }

    /// What it gives.
    pub const fn gives(self) -> &'static str {
        match self {
            Self::SocketsIterator => "lists every translated socket in one walk",
            Self::UdpIterator => "lists translated UDP sockets, one network namespace at a time",
            Self::SockDiagStorage => {
                "lists translated TCP sockets, one network namespace at a time"
            }
            Self::SocketDestroy => "terminates connected UDP sockets whose backend left",
            Self::SocketRelease => {
                "counts each pod's socket records exactly, in the kernel (the per-pod bound), and gives TCP connections a preallocated record"
            }
            Self::CookieProof => {
                "a socket that never met a Service closes, and answers getpeername and recvmsg, with a load of its cookie field and nothing else"
            }
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of one optional part at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Enabled,
    /// Turned off with `--disable-feature`.
    Disabled,
    /// The kernel refused it.
    Refused,
}

/// The verdict on one optional part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub feature: Feature,
    pub state: State,
    /// The kernel's errno, when it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// Why it is not enabled: the kernel's message (errno and verifier output), or the flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Probe {
    pub fn enabled(feature: Feature) -> Self {
        Self {
            feature,
            state: State::Enabled,
            errno: None,
            reason: None,
        }
    }

    pub fn disabled(feature: Feature) -> Self {
        Self {
            feature,
            state: State::Disabled,
            errno: None,
            reason: Some("turned off with --disable-feature".into()),
        }
    }

    /// Refused by the kernel with `errno` (where it gave one); `error`'s whole chain is the
    /// reason.
    pub fn refused(
        feature: Feature,
        errno: Option<i32>,
        error: &(dyn std::error::Error + 'static),
    ) -> Self {
        let mut reason = error.to_string();
        let mut source = error.source();
        while let Some(e) = source {
            reason.push_str(": ");
            reason.push_str(&e.to_string());
            source = e.source();
        }
        Self {
            feature,
            state: State::Refused,
            errno,
            reason: Some(reason),
        }
    }
}

/// Every optional part's verdict, as decided at start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub probes: Vec<Probe>,
}

/// How translated sockets are listed, given what the kernel allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Every record in one walk (`SocketsIterator`): the way to count them.
    pub global: bool,
    /// TCP records, per network namespace (`SockDiagStorage`): the way to see them with the
    /// kernel's view, one namespace's sockets in memory at a time.
    pub tcp_per_namespace: bool,
    /// UDP records, per network namespace (`UdpIterator`), likewise.
    pub udp_per_namespace: bool,
}

impl Listing {
    pub fn tcp(self) -> bool {
        self.global || self.tcp_per_namespace
    }

    pub fn udp(self) -> bool {
        self.global || self.udp_per_namespace
    }
}

impl Features {
    pub fn new(probes: Vec<Probe>) -> Self {
        Self { probes }
    }

    /// Every part enabled (for tests and in-memory use).
    pub fn all_enabled() -> Self {
        Self::new(Feature::ALL.into_iter().map(Probe::enabled).collect())
    }

    pub fn enabled(&self, feature: Feature) -> bool {
        self.probes
            .iter()
            .any(|p| p.feature == feature && p.state == State::Enabled)
    }

    pub fn probe(&self, feature: Feature) -> Option<&Probe> {
        self.probes.iter().find(|p| p.feature == feature)
    }

    pub fn listing(&self) -> Listing {
        Listing {
            global: self.enabled(Feature::SocketsIterator),
            tcp_per_namespace: self.enabled(Feature::SockDiagStorage),
            udp_per_namespace: self.enabled(Feature::UdpIterator),
        }
    }

    /// Stale connected UDP sockets can be found and destroyed.
    pub fn udp_termination(&self) -> bool {
        self.listing().udp() && self.enabled(Feature::SocketDestroy)
    }

    /// The per-pod bound on socket records: the release program keeps each pod's count exact,
    /// in the kernel, with or without an agent.
    pub fn socket_bound(&self) -> bool {
        self.enabled(Feature::SocketRelease)
    }

    /// TCP connections take a preallocated `CONNECTIONS` slot (freed by the release program)
    /// instead of an allocation in socket storage.
    pub fn connection_slots(&self) -> bool {
        self.enabled(Feature::SocketRelease)
    }

    /// Each guarantee lost with the parts that are off, in words for logs, `/status` and the
    /// demo. Empty when nothing is lost.
    pub fn losses(&self) -> Vec<&'static str> {
        self.lost().into_iter().map(Guarantee::lost).collect()
    }

    /// The guarantees lost with the parts that are off (a part whose loss another part
    /// makes up for, such as the sockets iterator where the per-namespace listing works,
    /// loses none).
    pub fn lost(&self) -> Vec<Guarantee> {
        Guarantee::ALL
            .into_iter()
            .filter(|g| !self.keeps(*g))
            .collect()
    }

    /// Whether the parts that are on keep `guarantee`.
    pub fn keeps(&self, guarantee: Guarantee) -> bool {
        let listing = self.listing();
        match guarantee {
            Guarantee::UdpTermination => self.udp_termination(),
            Guarantee::UdpListing => listing.udp(),
            Guarantee::TcpListing => listing.tcp(),
            Guarantee::SocketBound => self.socket_bound(),
        }
    }

    /// How the parts that are on stand in for those that are off, in words.
    pub fn fallbacks(&self) -> Vec<&'static str> {
        let listing = self.listing();
        let mut out = Vec::new();
        if !listing.global && (listing.tcp() || listing.udp()) {
            out.push(
                "translated sockets are found one pod network namespace at a time (sock_diag for TCP, the UDP iterator for UDP) instead of in one walk",
            );
        }
        if !self.enabled(Feature::CookieProof) {
            out.push(
                "every TCP and UDP socket's close, getpeername and recvmsg make its cookie with bpf_get_socket_cookie to look for a slot, where a load would show most have none",
            );
        }
        if !self.connection_slots() {
            out.push(
                "TCP connections keep their record in socket storage, allocated at each connect, instead of a preallocated slot",
            );
        }
        out
    }
}

/// What socklb promises that an optional part (or a pair of them) stands behind: what
/// `/status` (`degraded`), the log and `socklb_guarantee_lost` name when it is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Guarantee {
    /// Connected UDP sockets whose backend leaves are terminated.
    UdpTermination,
    /// Translated UDP sockets are listed.
    UdpListing,
    /// Translated TCP sockets are listed.
    TcpListing,
    /// The per-pod bound on socket records.
    SocketBound,
}

impl Guarantee {
    pub const ALL: [Self; 4] = [
        Self::UdpTermination,
        Self::UdpListing,
        Self::TcpListing,
        Self::SocketBound,
    ];

    /// The name in metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::UdpTermination => "udp-termination",
            Self::UdpListing => "udp-listing",
            Self::TcpListing => "tcp-listing",
            Self::SocketBound => "socket-bound",
        }
    }

    /// What is lost without it, in words.
    pub const fn lost(self) -> &'static str {
        match self {
            Self::UdpTermination => {
                "connected UDP sockets whose backend leaves are not terminated: they keep sending to the old endpoint until the application reconnects; nor are sockets connected before their frontend existed repaired"
            }
            Self::UdpListing => {
                "translated UDP sockets are not listed (inspect connections, explain, live-socket metrics)"
            }
            Self::TcpListing => {
                "translated TCP sockets are not listed (inspect connections, explain, live-socket metrics)"
            }
            Self::SocketBound => {
                "no per-pod bound on socket records (--max-sockets-per-pod): counting them needs the release program"
            }
        }
    }
}

impl std::fmt::Display for Guarantee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The parts turned off on the command line (`all` turns off every one).
pub fn disabled_set(named: &[Feature], all: bool) -> BTreeSet<Feature> {
    if all {
        Feature::ALL.into_iter().collect()
    } else {
        named.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn with(off: &[Feature]) -> Features {
        Features::new(
            Feature::ALL
                .into_iter()
                .map(|f| {
                    if off.contains(&f) {
                        Probe::disabled(f)
                    } else {
                        Probe::enabled(f)
                    }
                })
                .collect(),
        )
    }

    #[test]
    fn everything_enabled_loses_nothing() {
        let f = Features::all_enabled();
        assert!(f.losses().is_empty());
        assert!(f.fallbacks().is_empty());
        assert!(f.udp_termination() && f.socket_bound());
    }

    /// The kernel of issue 18: the storage-map iterator refused, the rest loads.
    #[test]
    fn without_the_sockets_iterator_the_per_namespace_paths_keep_every_guarantee() {
        let f = with(&[Feature::SocketsIterator]);
        assert!(f.losses().is_empty(), "{:?}", f.losses());
        assert_eq!(f.fallbacks().len(), 1);
        assert!(f.udp_termination());
        let l = f.listing();
        assert!(!l.global && l.tcp_per_namespace && l.udp_per_namespace);
    }

    #[test]
    fn every_part_off_names_each_lost_guarantee() {
        let f = with(&Feature::ALL);
        let lost = f.losses().join("\n");
        assert!(lost.contains("UDP sockets whose backend leaves are not terminated"));
        assert!(lost.contains("UDP sockets are not listed"));
        assert!(lost.contains("TCP sockets are not listed"));
        assert!(lost.contains("no per-pod bound"));
    }

    #[test]
    fn destroy_alone_off_loses_termination_only() {
        let f = with(&[Feature::SocketDestroy]);
        assert_eq!(f.losses().len(), 1);
        assert!(!f.udp_termination() && f.socket_bound());
    }

    #[test]
    fn release_off_loses_the_bound_and_the_slots_only() {
        let f = with(&[Feature::SocketRelease]);
        assert_eq!(f.losses().len(), 1, "{:?}", f.losses());
        assert!(f.losses()[0].contains("no per-pod bound"));
        assert!(!f.socket_bound() && !f.connection_slots() && f.udp_termination());
        assert_eq!(f.fallbacks().len(), 1);
    }

    #[test]
    fn a_refusal_keeps_the_kernels_errno_and_message() {
        let e = io::Error::from_raw_os_error(libc::EPERM);
        let p = Probe::refused(Feature::SocketsIterator, e.raw_os_error(), &e);
        assert_eq!(p.errno, Some(libc::EPERM));
        assert_eq!(p.state, State::Refused);
        assert!(
            p.reason
                .is_some_and(|r| r.contains("Operation not permitted"))
        );
    }
}
