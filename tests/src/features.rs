//! The optional parts of the data path, as the tests see them. `cargo xtask test` runs the
//! agent, data-path and demo tests once as the kernel allows and once with
//! `SOCKLB_DISABLE_FEATURE=all` (every agent a test starts reads that variable as its
//! `--disable-feature`). Tests that depend on an optional part ask the agent's `/status` what
//! it runs with, and assert the behaviour that claim promises, either way.
//!
//! Under `CI=true`, in the run with no part turned off on purpose, the parts must be exactly
//! those `tests/expected-parts.txt` lists for this kernel: a probe that wrongly said "refused"
//! fails the run instead of quietly testing the fallbacks. A test that checks a fallback says
//! so in its output (`FALLBACK ...`).
use std::collections::BTreeSet;

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

/// The kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether `text` matches `pattern`, where `*` matches any text.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The parts `expected-parts.txt` (its text) lists for kernel `release`; `None` when no line
/// matches.
pub fn expected_parts_in(text: &str, release: &str) -> anyhow::Result<Option<BTreeSet<Feature>>> {
    use clap::ValueEnum as _;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let pattern = words.next().unwrap_or_default();
        if !glob(pattern, release) {
            continue;
        }
        return words
            .map(|w| {
                Feature::from_str(w, false)
                    .map_err(|e| anyhow::anyhow!("expected-parts.txt: {w}: {e}"))
            })
            .collect::<anyhow::Result<BTreeSet<_>>>()
            .map(Some);
    }
    Ok(None)
}

/// Under `CI=true`, with no part turned off on purpose: the parts every agent must run with
/// on this machine. Panics when the machine is not listed. `None` elsewhere.
pub fn required_parts() -> Option<BTreeSet<Feature>> {
    if std::env::var("CI").as_deref() != Ok("true") || !disabled_by_env().is_empty() {
        return None;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("expected-parts.txt");
    let text = std::fs::read_to_string(&path).expect("tests/expected-parts.txt");
    let release = kernel_release();
    match expected_parts_in(&text, &release) {
        Ok(Some(parts)) => Some(parts),
        Ok(None) => panic!(
            "CI=true: kernel {release} is not in {}: say which optional parts it takes",
            path.display()
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Says that a test checked a fallback (an optional part off) instead of the part itself.
pub fn fallback(test: &str, what: &str) {
    println!("FALLBACK {test}: {what}");
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
        if let Some(required) = required_parts() {
            for f in Feature::ALL {
                assert_eq!(
                    on(f),
                    required.contains(&f),
                    "{f}: the agent runs it {}, tests/expected-parts.txt says this kernel ({}) {}",
                    if on(f) { "on" } else { "off" },
                    kernel_release(),
                    if required.contains(&f) {
                        "takes it"
                    } else {
                        "refuses it"
                    },
                );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_release_picks_its_line() {
        let text = "# comment\n6.18.*-fc-*  udp-iterator socket-release\n6.*  socket-release\n";
        let parts = |r| expected_parts_in(text, r).expect("parses");
        assert_eq!(
            parts("6.18.44-fc-v1252"),
            Some([Feature::UdpIterator, Feature::SocketRelease].into())
        );
        assert_eq!(
            parts("6.1.0-27-amd64"),
            Some([Feature::SocketRelease].into())
        );
        assert_eq!(parts("5.15.0"), None);
        assert!(expected_parts_in("* no-such-part", "x").is_err());
        assert!(glob("6.18.*", "6.18.44") && !glob("6.18.*", "6.1.8") && glob("*", ""));
    }
}
