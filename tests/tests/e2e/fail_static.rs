//! Fail static, round 2: socklb's own mechanisms never take away what works. Connected UDP
//! sockets that no program translated (they connected before their frontend existed) are
//! repaired; a termination pass never destroys a socket whose backend is serving when it
//! destroys it; the per-pod count is kept per pod on every kubelet cgroup layout.
use std::{
    net::SocketAddr,
    process::Command as Process,
    time::{Duration, Instant},
};

use socklb::dataplane::pins::PinFolder;
use socklb_tests::{
    Client, Sandbox,
    agent::AgentOptions,
    bins,
    client::Command,
    manifests::{Ep, service, slice},
};

const VIP: &str = "10.96.0.53:53";
const A: &str = "10.244.1.21";
const B: &str = "10.244.2.34";

fn dns(endpoints: &[&str]) -> String {
    let eps: Vec<Ep> = endpoints.iter().map(|ip| Ep::ready(ip)).collect();
    format!(
        "{}---\n{}",
        service("dns", "10.96.0.53", "dns", "UDP", 53, "5353", &[]),
        slice("dns-1", "dns", "dns", "UDP", 5353, &eps)
    )
}

/// A route for the service range in the client's namespace to a veth pair whose both ends are
/// there: a datagram no program translated goes nowhere (the peer end has no address), as on a
/// node with a default route (without it a connect to the range fails with ENETUNREACH, and no
/// socket would be connected). Nothing leaves the namespace.
fn route_the_service_range_nowhere(sandbox: &Sandbox) -> anyhow::Result<()> {
    for args in [
        &[
            "link", "add", "nowhere0", "type", "veth", "peer", "name", "nowhere1",
        ][..],
        &["link", "set", "nowhere0", "up"],
        &["link", "set", "nowhere1", "up"],
        &["route", "add", "10.96.0.0/12", "dev", "nowhere0"],
    ] {
        let out = Process::new("ip")
            .args(["-n", &sandbox.client_ns])
            .args(args)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A UDP socket connected to the service address, kept under `id`: connected while nothing
/// translates it, so its peer is the service address itself.
fn connect_untranslated(client: &mut Client, id: u32) -> anyhow::Result<()> {
    let r = client.run(&Command::ConnectUdp {
        id,
        target: VIP.parse()?,
    })?;
    anyhow::ensure!(r.ok, "{r:?}");
    anyhow::ensure!(
        r.peer_names.contains_key(VIP),
        "connected to the service address: {r:?}"
    );
    Ok(())
}

/// Waits for socket `id` to be terminated (its exchange fails with ECONNABORTED, or
/// EDESTADDRREQ once disconnected), at most `within`; returns how long it took.
fn terminated_within(client: &mut Client, id: u32, within: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let r = client.run(&Command::Exchange {
            id,
            msg: "query".into(),
        })?;
        if r.errors.contains_key("ECONNABORTED") || r.errors.contains_key("EDESTADDRREQ") {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            r.answers() == 0,
            "socket {id} was answered although never translated: {r:?}"
        );
        anyhow::ensure!(
            start.elapsed() < within,
            "socket {id} not terminated within {within:?}: {r:?}"
        );
    }
}

/// A new connected UDP socket to the Service is translated and answered, once the maps hold
/// the Service's endpoint (a repair can come as soon as the frontend appears, which under load
/// may be a pass before its EndpointSlice's: a connect then is refused, as kube-proxy's rules
/// refuse a Service with no endpoint).
fn served(sandbox: &Sandbox, client: &mut Client, id: u32) -> anyhow::Result<()> {
    sandbox.wait_candidates(&format!("{VIP}/udp"), &[&format!("{A}:5353")])?;
    let r = client.run(&Command::Open {
        id,
        target: VIP.parse()?,
        udp: true,
    })?;
    anyhow::ensure!(r.ok && r.answers() == 1, "{r:?}");
    Ok(())
}

fn reset(sandbox: &Sandbox) -> anyhow::Result<()> {
    let out = Process::new(bins::socklb()?)
        .args(["reset", "--bpffs"])
        .arg(sandbox.pin_folder())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Issue 53.5: a connected UDP socket made before its frontend existed is repaired, in all
/// three ways it happens: on a fresh node before the agent's first attach, before the Service
/// exists, and after `socklb reset`. Each time the socket is terminated within 5 s of the
/// agent serving the frontend (its resolver then connects again and is translated); a socket
/// of a process outside the attached cgroup, connected to the same address, is left alone.
#[test]
fn a_udp_socket_connected_before_its_frontend_existed_is_repaired() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend(format!("{A}:5353").parse()?, true)?;
    route_the_service_range_nowhere(&sandbox)?;
    let mut client = sandbox.client()?;
    let mut outside = sandbox.outside_client()?;
    let within = Duration::from_secs(5);

    // 1. A fresh node: the socket connects before any program is attached.
    connect_untranslated(&mut client, 1)?;
    connect_untranslated(&mut outside, 1)?;
    sandbox.write_manifest("dns.yaml", &dns(&[A]))?;
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    if !socklb_tests::features::Claims::of(&agent.status()?).udp_termination {
        socklb_tests::features::fallback(
            "a_udp_socket_connected_before_its_frontend_existed_is_repaired",
            "no UDP termination: nothing can repair the socket (the named loss)",
        );
        assert!(
            agent.guarantee_lost("udp-termination")?,
            "the loss is named"
        );
        let r = client.run(&Command::Exchange {
            id: 1,
            msg: "query".into(),
        })?;
        assert_eq!(r.answers(), 0, "the socket is not repaired: {r:?}");
        return Ok(());
    }
    let took = terminated_within(&mut client, 1, within)?;
    println!(
        "FIGURE repaired before the first attach: {} ms after ready",
        took.as_millis()
    );
    served(&sandbox, &mut client, 11)?;

    // 2. Before the Service exists.
    sandbox.remove_manifest("dns.yaml")?;
    sandbox.wait_gone(&format!("{VIP}/udp"))?;
    connect_untranslated(&mut client, 2)?;
    sandbox.write_manifest("dns.yaml", &dns(&[A]))?;
    let took = terminated_within(&mut client, 2, within)?;
    println!(
        "FIGURE repaired after the Service appeared: {} ms",
        took.as_millis()
    );
    served(&sandbox, &mut client, 12)?;

    // 3. After `socklb reset` (nothing attached), then an agent again.
    agent.stop()?;
    reset(&sandbox)?;
    connect_untranslated(&mut client, 3)?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    let took = terminated_within(&mut client, 3, within)?;
    println!(
        "FIGURE repaired after socklb reset: {} ms after ready",
        took.as_millis()
    );
    served(&sandbox, &mut client, 13)?;

    // The socket outside the cgroup was never socklb's to translate, nor to terminate.
    let r = outside.run(&Command::Exchange {
        id: 1,
        msg: "query".into(),
    })?;
    assert!(
        !r.errors.contains_key("ECONNABORTED") && !r.errors.contains_key("EDESTADDRREQ"),
        "left alone: {r:?}"
    );
    assert!(agent.metric("socklb_udp_sockets_terminated_total")? >= Some(1.0));
    Ok(())
}

/// Issue 53.6: a termination pass judges a socket when it destroys it, not when it found it.
/// A connected UDP socket on backend X; a pass that found it while X was not serving but runs
/// its destroy after X began serving (as a backend a rollout adds while a pass runs) leaves it
/// alone; a pass that judges X not serving then too destroys it (the control).
#[test]
fn a_termination_pass_judges_each_socket_when_it_destroys_it() -> anyhow::Result<()> {
    use std::sync::Arc;
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for ip in [A, B] {
        sandbox.add_backend(format!("{ip}:5353").parse()?, true)?;
    }
    sandbox.write_manifest("dns.yaml", &dns(&[A, B]))?;
    let agent = sandbox.start_agent(&AgentOptions::default())?;
    if !socklb_tests::features::Claims::of(&agent.status()?).udp_termination {
        socklb_tests::features::fallback(
            "a_termination_pass_judges_each_socket_when_it_destroys_it",
            "no UDP termination on this kernel: no socket is destroyed at all",
        );
        assert!(
            agent.guarantee_lost("udp-termination")?,
            "the loss is named"
        );
        return Ok(());
    }
    sandbox.wait_candidates(
        &format!("{VIP}/udp"),
        &[&format!("{A}:5353"), &format!("{B}:5353")],
    )?;
    let mut client = sandbox.client()?;
    let r = client.run(&Command::Open {
        id: 1,
        target: VIP.parse()?,
        udp: true,
    })?;
    anyhow::ensure!(r.ok, "{r:?}");
    let x: SocketAddr = r
        .backends
        .keys()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no backend: {r:?}"))?
        .parse()?;
    let pins = PinFolder::new(sandbox.pin_folder())
        .current_sockets()
        .ok_or_else(|| anyhow::anyhow!("no socket pins"))?;
    let listing = pins.listing();
    let without_x = |_: &lb_common::FrontendKey| -> Option<Arc<[SocketAddr]>> {
        Some(Arc::from(Vec::<SocketAddr>::new()))
    };
    let with_x =
        move |_: &lb_common::FrontendKey| -> Option<Arc<[SocketAddr]>> { Some(Arc::from(vec![x])) };
    let done =
        socklb::sockets::terminate_judged(&pins, listing, &sandbox.cgroup, &without_x, &with_x)?;
    assert_eq!(done.sockets, 0, "serving when destroyed: left alone");
    let r = client.run(&Command::Exchange {
        id: 1,
        msg: "still".into(),
    })?;
    assert_eq!(r.answers(), 1, "the socket still works: {r:?}");
    let done =
        socklb::sockets::terminate_judged(&pins, listing, &sandbox.cgroup, &without_x, &without_x)?;
    assert_eq!(done.sockets, 1, "not serving then either: destroyed");
    let r = client.run(&Command::Exchange {
        id: 1,
        msg: "gone".into(),
    })?;
    assert!(
        r.errors.contains_key("ECONNABORTED") || r.errors.contains_key("EDESTADDRREQ"),
        "{r:?}"
    );
    Ok(())
}

/// Issue 53.7: the per-pod bound counts each pod on every kubelet cgroup layout: kind's
/// (systemd with `cgroupRoot` `/kubelet`), and the kubepods layouts of the cgroupfs and systemd
/// drivers. Below the attached cgroup a layout's cgroups are made with two best-effort pods,
/// each a container cgroup holding a client. With `--max-sockets-per-pod 20`, the first pod's
/// 21st connected UDP socket to a Service gets ENOBUFS; the second pod, in the same tier, still
/// gets all it asks for; `/status` names the kubelet cgroup it found.
#[test]
fn the_per_pod_bound_counts_each_pod_on_every_kubelet_layout() -> anyhow::Result<()> {
    const BOUND: usize = 20;
    socklb_tests::require_privileges!();
    let uid = |n: u8| format!("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f{n}");
    let systemd_uid = |n: u8| uid(n).replace('-', "_");
    let layouts: [(&str, String, [String; 2]); 3] = [
        (
            "kind",
            "kubelet.slice/kubelet-kubepods.slice".into(),
            [1, 2].map(|n| {
                format!(
                    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice/cri-containerd-{n}.scope",
                    systemd_uid(n)
                )
            }),
        ),
        (
            "cgroupfs",
            "kubepods".into(),
            [1, 2].map(|n| format!("kubepods/besteffort/pod{}/c{n}", uid(n))),
        ),
        (
            "systemd",
            "kubepods.slice".into(),
            [1, 2].map(|n| {
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/c{n}.scope",
                    systemd_uid(n)
                )
            }),
        ),
    ];
    for (name, kubepods, pods) in layouts {
        let sandbox = Sandbox::new()?;
        sandbox.add_backend(format!("{A}:5353").parse()?, true)?;
        sandbox.write_manifest("dns.yaml", &dns(&[A]))?;
        let first = sandbox.served_pod_at(&pods[0], "10.244.103.1")?;
        let second = sandbox.served_pod_at(&pods[1], "10.244.103.2")?;
        let agent = sandbox.start_agent(&AgentOptions::with_args([
            "--max-sockets-per-pod".to_string(),
            BOUND.to_string(),
        ]))?;
        if !socklb_tests::features::Claims::of(&agent.status()?).socket_release {
            socklb_tests::features::fallback(
                "the_per_pod_bound_counts_each_pod_on_every_kubelet_layout",
                "no release program, no per-pod bound",
            );
            assert!(
                agent.guarantee_lost("socket-bound")?,
                "{name}: the loss is named"
            );
            return Ok(());
        }
        let status = agent.status()?;
        let report = status
            .pods
            .ok_or_else(|| anyhow::anyhow!("{name}: /status says nothing of pods"))?;
        assert_eq!(
            report.placement,
            socklb::dataplane::pods::Placement::Kubepods {
                kubepods: kubepods.clone().into()
            },
            "{name}: {}",
            report.reason
        );
        let hold = |client: &mut Client, count: usize| -> anyhow::Result<(usize, usize)> {
            let r = client.run(&Command::Hold {
                target: VIP.parse()?,
                count,
            })?;
            Ok((
                r.backends.get("held").copied().unwrap_or(0),
                r.errors.get("errno 105").copied().unwrap_or(0),
            ))
        };
        let mut greedy = sandbox.client_in(&first)?;
        assert_eq!(
            hold(&mut greedy, BOUND)?,
            (BOUND, 0),
            "{name}: up to the bound"
        );
        let mut more = sandbox.client_in(&first)?;
        assert_eq!(
            hold(&mut more, 1)?,
            (0, 1),
            "{name}: past the bound, ENOBUFS for that pod"
        );
        let mut neighbour = sandbox.client_in(&second)?;
        assert_eq!(
            hold(&mut neighbour, BOUND)?,
            (BOUND, 0),
            "{name}: the other pod of the same tier is not affected"
        );
        println!(
            "FIGURE per-pod bound on the {name} layout: pod level {}, {}",
            report.level, report.reason
        );
    }
    Ok(())
}
