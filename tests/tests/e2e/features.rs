//! The optional parts of the data path, tested both ways on every machine: what the probe says
//! (`socklb version --features`) against what the agent loads and against an independent
//! oracle (a two-instruction iterator program of the same target, loaded from raw bytecode);
//! every optional part refused on purpose, with translation intact; and failed starts that
//! leave nothing behind and say what happened.
use std::{net::SocketAddrV4, process::Command};

use socklb::{
    cli::Versions,
    dataplane::{
        features::{Feature, State},
        sys::{self, bpf_attach_type, bpf_prog_type},
    },
};
use socklb_tests::{
    Sandbox, agent::AgentOptions, bench::floor::EMPTY_PROGRAM, bins, client::Command as Client,
    features::disabled_by_env, kernel,
};

use socklb_tests::examples;

const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";

/// `socklb version --features -o json ARGS`.
fn probe(args: &[&str]) -> anyhow::Result<(Versions, bool)> {
    let out = Command::new(bins::socklb()?)
        .args(["version", "--features", "-o", "json"])
        .args(args)
        .output()?;
    let versions: Versions = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow::anyhow!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((versions, out.status.success()))
}

/// Whether this kernel loads a two-instruction iterator program for `target`, asked with the
/// `bpf()` syscall directly (as `bpftool feature probe` would), not through socklb's object.
fn kernel_loads_iterator(target: &str) -> anyhow::Result<bool> {
    let btf = aya::Btf::from_sys_fs()?;
    let id =
        btf.id_by_type_name_kind(&format!("bpf_iter_{target}"), aya_obj::btf::BtfKind::Func)?;
    // `r0 = 0; exit` (an iterator returns 0 to go on).
    let insns = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 0, 0, 0, 0]),
        EMPTY_PROGRAM[1],
    ];
    Ok(sys::prog_load(
        bpf_prog_type::BPF_PROG_TYPE_TRACING,
        bpf_attach_type::BPF_TRACE_ITER,
        id,
        &insns,
        "probe_iter",
    )
    .is_ok())
}

/// Whether the kernel reports a translated TCP connection's record in `sock_diag`: an agent
/// that keeps TCP records in socket storage (no release program, so no connection slots), a
/// connection through the Service, and a dump in the client's network namespace asking for
/// the pinned `SOCKETS` map, made with the test's own netlink code.
fn kernel_reports_storage(sandbox: &Sandbox) -> anyhow::Result<bool> {
    use std::os::fd::AsFd as _;
    sandbox.add_backend(A.parse()?, false)?;
    sandbox.add_backend(B.parse()?, false)?;
    let agent = sandbox.start_agent(&AgentOptions::with_args([
        "--disable-feature",
        "socket-release",
    ]))?;
    let mut client = sandbox.client()?;
    let opened = client.run(&Client::Open {
        id: 1,
        target: "10.96.0.10:80".parse()?,
        udp: false,
    })?;
    anyhow::ensure!(opened.ok, "{opened:?}");
    let parse = |m: &std::collections::BTreeMap<String, usize>| -> anyhow::Result<SocketAddrV4> {
        m.keys()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no address in {opened:?}"))?
            .parse()
            .map_err(Into::into)
    };
    let (local, peer) = (parse(&opened.seen_as)?, parse(&opened.backends)?);
    let sockets = socklb::dataplane::pins::PinFolder::new(sandbox.pin_folder())
        .current_sockets()
        .ok_or_else(|| anyhow::anyhow!("no socket pins"))?;
    let map = aya::maps::MapData::from_pin(sockets.dir.join("SOCKETS"))?;
    let netns = std::fs::File::open(format!("/run/netns/{}", sandbox.client_ns))?;
    let found = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<bool> {
            // SAFETY: setns(2) on this scoped thread alone, which ends after the dump.
            if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&netns), libc::CLONE_NEWNET) }
                != 0
            {
                return Err(std::io::Error::last_os_error().into());
            }
            kernel::reports_socket_storage(map.fd().as_fd(), local, peer)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the dump thread panicked"))?
    })?;
    drop(agent);
    Ok(found)
}

/// The probe, the agent and the kernel agree on every optional part, with this run's switch
/// (`SOCKLB_DISABLE_FEATURE`) and with every part turned off.
#[test]
fn the_probe_agrees_with_the_agent_and_the_kernel() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let (versions, ok) = probe(&[])?;
    assert!(ok, "the core loads here");
    let kernel = versions.kernel.expect("--features reports the kernel");
    assert!(kernel.core && kernel.core_error.is_none());
    assert_eq!(kernel.features.len(), Feature::ALL.len());

    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let status = agent.status()?;
    for probe in &kernel.features {
        let loaded = status
            .features
            .iter()
            .find(|p| p.feature == probe.feature)
            .expect("the agent reports every part");
        assert_eq!(
            (probe.state, probe.errno),
            (loaded.state, loaded.errno),
            "{}: version --features says {probe:?}, the agent {loaded:?}",
            probe.feature
        );
        let metric = agent.metric(&format!(
            "socklb_feature_enabled{{feature=\"{}\"}}",
            probe.feature
        ))?;
        assert_eq!(
            metric,
            Some(if loaded.state == State::Enabled {
                1.0
            } else {
                0.0
            }),
            "{}",
            probe.feature
        );
    }
    // The independent oracle: the kernel's verdict on a minimal program of each target.
    for (feature, target) in [
        (Feature::SocketsIterator, "bpf_sk_storage_map"),
        (Feature::UdpIterator, "udp"),
    ] {
        let state = kernel
            .features
            .iter()
            .find(|p| p.feature == feature)
            .map(|p| p.state);
        let expected = if disabled_by_env().contains(&feature) {
            State::Disabled
        } else if kernel_loads_iterator(target)? {
            State::Enabled
        } else {
            State::Refused
        };
        assert_eq!(
            state,
            Some(expected),
            "{feature} (iterator target {target})"
        );
    }

    // Everything off: the same verdict from both, each with its reason.
    let (versions, ok) = probe(&["--disable-feature", "all"])?;
    assert!(ok, "optional parts off do not fail the probe");
    let kernel = versions.kernel.expect("kernel report");
    assert!(
        kernel
            .features
            .iter()
            .all(|p| p.state == State::Disabled && p.reason.is_some())
    );
    assert!(
        kernel.losses.iter().any(|l| l.contains("not terminated")),
        "{:?}",
        kernel.losses
    );
    Ok(())
}

/// Every optional part the probe reports against the kernel's own verdict, asked without
/// socklb's probe or netlink code (`socklb_tests::kernel`): a minimal release program, a
/// kfunc call from both program types the cookie proof runs in, a
/// `SOCK_DESTROY` of a loopback UDP socket, a `sock_diag` dump asking for a translated
/// connection's storage; and, under `CI=true`, against the parts `tests/expected-parts.txt`
/// lists for this kernel. (The iterators are checked above.)
#[test]
fn the_probe_agrees_with_the_kernels_own_verdict_on_each_part() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let (versions, ok) = probe(&[])?;
    assert!(ok, "the core loads here");
    let kernel = versions.kernel.expect("--features reports the kernel");
    let verdict = |feature: Feature, takes: bool| {
        if disabled_by_env().contains(&feature) {
            State::Disabled
        } else if takes {
            State::Enabled
        } else {
            State::Refused
        }
    };
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let storage = kernel_reports_storage(&sandbox)?;
    for (feature, expected) in [
        (
            Feature::SocketRelease,
            verdict(Feature::SocketRelease, kernel::loads_release_program()),
        ),
        (
            Feature::SocketDestroy,
            verdict(Feature::SocketDestroy, kernel::destroys_udp_sockets()?),
        ),
        (
            Feature::CookieProof,
            verdict(Feature::CookieProof, kernel::calls_cast_to_kern_ctx()),
        ),
        (
            Feature::SockDiagStorage,
            verdict(Feature::SockDiagStorage, storage),
        ),
    ] {
        let state = kernel
            .features
            .iter()
            .find(|p| p.feature == feature)
            .map(|p| p.state);
        assert_eq!(
            state,
            Some(expected),
            "{feature}: the probe against the kernel"
        );
    }
    // And this machine's expected list (CI), against the probe.
    if let Some(required) = socklb_tests::features::required_parts() {
        for p in &kernel.features {
            assert_eq!(
                p.state == State::Enabled,
                required.contains(&p.feature),
                "{}: tests/expected-parts.txt against the probe ({:?})",
                p.feature,
                p.state
            );
        }
    }

    Ok(())
}

/// With every optional part refused on purpose the core claims hold: spread, refusal,
/// getpeername and UDP replies from the service address; `/status` names each part off and
/// each lost guarantee, and the gauges say 0.
#[test]
fn every_optional_part_off_keeps_translation() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in [A, B] {
        sandbox.add_backend(b.parse()?, false)?;
        sandbox.add_backend(b.parse()?, true)?;
    }
    sandbox.copy_manifests(&examples().join("seed"))?;
    sandbox.write_manifest(
        "dns.yaml",
        &socklb_tests::manifests::service("dns", "10.96.0.53", "dns", "UDP", 53, "8080", &[]),
    )?;
    sandbox.write_manifest(
        "dns-slice.yaml",
        &socklb_tests::manifests::slice(
            "dns-1",
            "dns",
            "dns",
            "UDP",
            8080,
            &[
                socklb_tests::manifests::Ep::ready("10.244.1.21"),
                socklb_tests::manifests::Ep::ready("10.244.2.34"),
            ],
        ),
    )?;
    let agent = sandbox.start_agent(&AgentOptions::with_args(["--disable-feature", "all"]))?;
    sandbox.wait_candidates("10.96.0.53:53/udp", &[A, B])?;
    let status = agent.status()?;
    for f in Feature::ALL {
        let p = status
            .features
            .iter()
            .find(|p| p.feature == f)
            .expect("every part reported");
        assert_eq!(p.state, State::Disabled, "{f}");
        assert!(p.reason.is_some());
        assert_eq!(
            agent.metric(&format!("socklb_feature_enabled{{feature=\"{f}\"}}"))?,
            Some(0.0)
        );
    }
    assert_eq!(status.degraded.len(), 4, "{:?}", status.degraded);
    let log = agent.log_text();
    assert!(log.contains("a guarantee is lost"), "logged once: {log}");

    let mut client = sandbox.client()?;
    let r = client.connect("10.96.0.10:80".parse()?, 60)?;
    assert_eq!(r.answers(), 60);
    assert!(r.backends.contains_key(A) && r.backends.contains_key(B));
    assert_eq!(r.peer_names.get("10.96.0.10:80"), Some(&60));
    let udp = client.run(&Client::SendTo {
        target: "10.96.0.53:53".parse()?,
        count: 10,
        id: None,
    })?;
    assert_eq!(udp.answers(), 10, "{udp:?}");
    assert_eq!(
        udp.peer_names.get("10.96.0.53:53"),
        Some(&10),
        "replies come from the service address: {udp:?}"
    );
    Ok(())
}

/// No usable pin folder left behind, and the pin folder has no generation of its own.
fn generations(pins: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(pins)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("maps-") || n.starts_with("sockets-"))
        .collect()
}

/// A start that fails after creating maps removes them; the message names what failed; the
/// permission hint appears only when the process lacks a capability, read from its own set.
#[test]
fn a_failed_start_says_why_and_leaves_nothing() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.copy_manifests(&examples().join("seed"))?;
    let agent_args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--manifests".into(),
            sandbox.manifests().display().to_string(),
            "--cgroup".into(),
            sandbox.cgroup.display().to_string(),
            "--bpffs".into(),
            sandbox.pin_folder().display().to_string(),
            "--health-listen".into(),
            "off".into(),
            "--metrics-listen".into(),
            "off".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_string()));
        args
    };

    // A backend array the kernel cannot allocate: the maps already made are removed again.
    let out = Command::new("timeout")
        .arg("60")
        .arg(bins::socklb()?)
        .args(agent_args(&["--max-backends", "4000000000"]))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("BACKENDS"), "names the map: {err}");
    assert!(
        !err.contains("lacks CAP_"),
        "root with every capability gets no permission hint: {err}"
    );
    assert_eq!(generations(&sandbox.pin_folder()), Vec::<String>::new());

    // Without CAP_BPF and CAP_SYS_ADMIN (root otherwise): the hint names them, and the kernel's
    // errno is said once.
    let out = Command::new("timeout")
        .arg("60")
        .args([
            "setpriv",
            "--bounding-set",
            "-bpf,-sys_admin,-perfmon",
            "--",
        ])
        .arg(bins::socklb()?)
        .args(agent_args(&[]))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("lacks CAP_BPF"), "{err}");
    assert!(err.contains("CAP_SYS_ADMIN"), "{err}");
    assert_eq!(
        err.matches("Operation not permitted").count(),
        1,
        "the errno once: {err}"
    );
    assert_eq!(generations(&sandbox.pin_folder()), Vec::<String>::new());

    // And a normal start still works on the same folder.
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.add_backend(A.parse()?, false)?;
    sandbox.add_backend(B.parse()?, false)?;
    assert_eq!(
        sandbox
            .client()?
            .connect("10.96.0.10:80".parse()?, 10)?
            .answers(),
        10
    );
    drop(agent);
    Ok(())
}
