//! The optional parts of the data path, as the tests see them. `cargo xtask test` runs the
//! agent, data-path and demo tests once as the kernel allows and once with
//! `SOCKLB_DISABLE_FEATURE=all` (every agent a test starts reads that variable as its
//! `--disable-feature`). Tests that depend on an optional part ask the agent's `/status` what
//! it runs with, and assert the behaviour that claim promises, either way.
use socklb::{
    dataplane::features::{Feature, State},
    status::Status,
};

/// The parts this run turns off on purpose (`SOCKLB_DISABLE_FEATURE`).
pub fn disabled_by_env() -> Vec<Feature> {
    use clap::ValueEnum as _;
    let value = std::env::var("SOCKLB_DISABLE_FEATURE").unwrap_or_default();
    if value.split(',').any(|v| v.trim() == "all") {
        return Feature::ALL.to_vec();
    }
    value
        .split(',')
        .filter_map(|v| Feature::from_str(v.trim(), false).ok())
        .collect()
}

/// What the agent says it runs with, checked against this run's switch: every part turned off
/// on purpose is reported off, with a reason, and so is every part the kernel refused.
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent promises, each on or off, read by tests one at a time"
)]
pub struct Claims {
    pub udp_termination: bool,
    pub tcp_listing: bool,
    pub udp_listing: bool,
    /// The release program: the per-pod bound, and TCP connections in preallocated slots.
    pub socket_release: bool,
}

impl Claims {
    /// The program links the agent keeps: the eight cgroup programs translation needs, and
    /// the release program where the kernel took it.
    pub fn programs(&self) -> usize {
        lb_common::program::ALL.len() + usize::from(self.socket_release)
    }

    pub fn of(status: &Status) -> Self {
        let on = |f: Feature| {
            status
                .features
                .iter()
                .any(|p| p.feature == f && p.state == State::Enabled)
        };
        for f in Feature::ALL {
            let probe = status
                .features
                .iter()
                .find(|p| p.feature == f)
                .unwrap_or_else(|| panic!("/status does not report {f}: {:?}", status.features));
            if disabled_by_env().contains(&f) {
                assert_eq!(
                    probe.state,
                    State::Disabled,
                    "{f} was turned off: {probe:?}"
                );
            }
            if probe.state != State::Enabled {
                assert!(probe.reason.is_some(), "{f} is off without a reason");
            }
        }
        let global = on(Feature::SocketsIterator);
        let claims = Self {
            udp_termination: on(Feature::SocketDestroy) && (global || on(Feature::UdpIterator)),
            tcp_listing: global || on(Feature::SockDiagStorage),
            udp_listing: global || on(Feature::UdpIterator),
            socket_release: on(Feature::SocketRelease),
        };
        if !claims.udp_termination {
            assert!(
                status.degraded.iter().any(|l| l.contains("not terminated")),
                "the lost UDP termination is named: {:?}",
                status.degraded
            );
        }
        if !claims.socket_release {
            assert!(
                status
                    .degraded
                    .iter()
                    .any(|l| l.contains("no per-pod bound")),
                "the lost per-pod bound is named: {:?}",
                status.degraded
            );
        }
        claims
    }
}
