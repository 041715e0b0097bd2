//! Deploying for real: an agent that cannot bind its listeners changes nothing; replace mode
//! reaches the API on its real address (and warns when it would go through a ClusterIP);
//! uninstalling after a kill -9 leaves no program and no pin; a new agent with another map
//! layout takes over make-before-break under load.
use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use socklb::{
    cli::Reset,
    dataplane::{
        loader::ProgramView,
        pins::{PinFolder, SocketPins, socket_layout_digest},
    },
    sockets::held_slots,
};
use socklb_tests::{
    Client, Sandbox,
    agent::AgentOptions,
    apiserver::ApiServer,
    bins,
    churn::wall_ns,
    client::{Command, Reply},
    load::Load,
    manifests::{Ep, service, slice},
    system::{cgroup_program_ids, cgroup_programs},
};

const A: &str = "10.244.1.21:8080";
const B: &str = "10.244.2.34:8080";
const WEB: &str = "10.96.0.10:80";

use socklb_tests::examples;

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name}: {value}");
}

/// What the kernel itself puts in every bpf filesystem (the preloaded iterators).
const KERNEL_FILES: [&str; 2] = ["maps.debug", "progs.debug"];

/// Every file under the bpffs mount but the kernel's own, with its inode: a pin replaced is a
/// new inode.
fn pins(sandbox: &Sandbox) -> anyhow::Result<BTreeMap<PathBuf, u64>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, u64>) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if dir == root && KERNEL_FILES.iter().any(|k| path.ends_with(k)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path)?;
            out.insert(path.strip_prefix(root)?.to_path_buf(), meta.ino());
            if meta.is_dir() {
                walk(&path, root, out)?;
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(&sandbox.pin_mount, &sandbox.pin_mount, &mut out)?;
    Ok(out)
}

/// `count` connects to `target` from the sandbox's client pod.
fn connect(sandbox: &Sandbox, target: &str, count: usize) -> anyhow::Result<Reply> {
    sandbox.client()?.connect(target.parse()?, count)
}

/// Polls `check` every 25 ms for at most `limit`.
fn wait_until(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while !check()? {
        anyhow::ensure!(start.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(())
}

/// An agent that cannot bind its health or its metrics address exits non-zero, names the
/// address, and touches nothing: on a fresh node no program is attached and nothing is pinned;
/// over a running deployment the programs and every pin stay exactly as they were, and Services
/// keep being served.
#[test]
fn a_taken_listener_port_fails_the_start_and_changes_nothing() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    let taking = |which: &str| AgentOptions {
        no_wait: true,
        health_listen: (which == "health").then_some(addr),
        metrics_listen: (which == "metrics").then_some(addr),
        ..AgentOptions::default()
    };
    let fails = |which: &str| -> anyhow::Result<String> {
        let mut agent = sandbox.start_agent(&taking(which))?;
        let status = agent.wait_exit(Duration::from_mins(1))?;
        let log = agent.log_text();
        assert!(!status.success(), "{which}: {status}\n{log}");
        assert!(
            log.contains(&format!("binding the {which} address {addr}"))
                && log.contains("Address already in use"),
            "{which}: the error names the address:\n{log}"
        );
        Ok(log)
    };

    // A fresh node: nothing attached, nothing pinned.
    for which in ["health", "metrics"] {
        fails(which)?;
        assert_eq!(
            cgroup_program_ids(&sandbox.cgroup)?,
            Vec::<u32>::new(),
            "{which}: nothing attached"
        );
        assert_eq!(pins(&sandbox)?, BTreeMap::new(), "{which}: nothing pinned");
    }

    // A running deployment (its agent crashed): the failed start changes nothing.
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    let links = socklb_tests::features::Claims::of(&agent.status()?).programs();
    agent.kill9();
    let programs = cgroup_programs(&sandbox.cgroup)?;
    assert!(
        programs.values().all(|ids| ids.len() <= 1)
            && programs.values().map(Vec::len).sum::<usize>() == links,
        "one program per hook: {programs:?}"
    );
    let pinned = pins(&sandbox)?;
    for which in ["health", "metrics"] {
        let log = fails(which)?;
        assert!(!log.contains("programs loaded"), "{which}: loaded:\n{log}");
        assert_eq!(cgroup_programs(&sandbox.cgroup)?, programs, "{which}");
        assert_eq!(pins(&sandbox)?, pinned, "{which}: the pins are untouched");
        assert_eq!(connect(&sandbox, WEB, 10)?.answers(), 10, "{which}");
    }
    drop(taken);
    Ok(())
}

/// A kubeconfig whose server is `server` (TLS unverified: nothing is ever reached through it).
fn kubeconfig(path: &Path, server: &str) -> anyhow::Result<()> {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )?;
    Ok(())
}

/// Replace mode. The agent's configuration points at the `kubernetes` Service's ClusterIP
/// (10.96.0.1:443, as in-cluster configuration does), which nothing translates here:
/// - without `--api-server` it says loudly, at start, that it would reach the API through a
///   ClusterIP with no kube-proxy on the node (run in the client pod's network namespace, where
///   that address has no route, so its connects stay in the sandbox), and never attaches;
/// - with `--api-server` on the stand-in's plain loopback address it converges and serves,
///   the `kubernetes` Service included, and says nothing of the kind.
#[test]
#[allow(clippy::too_many_lines)] // one scenario in two halves, each reading best in order
fn replace_mode_reaches_the_api_on_its_real_address_and_warns_without_it() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    for b in [A, B] {
        sandbox.add_backend(b.parse()?, false)?;
    }
    // The API server "behind" the kubernetes Service, as a backend pod.
    let api_pod: SocketAddr = "10.244.3.47:6443".parse()?;
    sandbox.add_backend(api_pod, false)?;
    let api = ApiServer::start()?;
    for file in ["seed/service.yaml", "seed/endpointslice.yaml"] {
        api.apply(&std::fs::read_to_string(examples().join(file))?)?;
    }
    api.apply(&service(
        "kubernetes",
        "10.96.0.1",
        "https",
        "TCP",
        443,
        "6443",
        &[],
    ))?;
    api.apply(&slice(
        "kubernetes",
        "kubernetes",
        "https",
        "TCP",
        6443,
        &[Ep::ready("10.244.3.47")],
    ))?;
    let config = sandbox.workdir.join("kubeconfig");
    kubeconfig(&config, "https://10.96.0.1:443")?;
    let in_cluster_env = vec![
        (
            "KUBERNETES_SERVICE_HOST".to_string(),
            "10.96.0.1".to_string(),
        ),
        ("KUBERNETES_SERVICE_PORT".to_string(), "443".to_string()),
    ];
    let warning = "reaches the API server through the `kubernetes` Service's ClusterIP";

    // 1. Through the ClusterIP: a loud warning, and it cannot get anywhere.
    let mut stuck = sandbox.start_agent(&AgentOptions {
        kubeconfig: Some(config.clone()),
        env: in_cluster_env.clone(),
        netns: Some(sandbox.client_ns.clone()),
        no_wait: true,
        ..AgentOptions::default()
    })?;
    wait_until("the warning", Duration::from_mins(1), || {
        Ok(stuck.log_text().contains(warning))
    })?;
    wait_until("a failed watch", Duration::from_mins(1), || {
        Ok(stuck.log_text().contains("watch failed"))
    })?;
    let log = stuck.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(warning))
        .expect("the warning");
    for said in [
        "ERROR",
        "10.96.0.1:443",
        "no kube-proxy answers on this node",
        "--api-server",
        "SOCKLB_API_SERVER",
    ] {
        assert!(line.contains(said), "{said:?} not in {line}");
    }
    assert_eq!(
        cgroup_program_ids(&sandbox.cgroup)?,
        Vec::<u32>::new(),
        "no complete sync, nothing attached"
    );
    assert_eq!(
        api.requests("list services"),
        0,
        "the stand-in was never reached"
    );
    stuck.kill9();

    // 2. Replace mode: the real address, the same configuration and environment otherwise.
    let server = format!("http://{}", api.addr);
    let agent = sandbox.start_agent(&AgentOptions {
        kubeconfig: Some(config),
        env: in_cluster_env,
        args: vec!["--api-server".into(), server.clone()],
        ..AgentOptions::default()
    })?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    sandbox.wait_candidates("10.96.0.1:443", &["10.244.3.47:6443"])?;
    let mut client = sandbox.client()?;
    assert_eq!(client.connect(WEB.parse()?, 20)?.answers(), 20);
    let kubernetes = client.connect("10.96.0.1:443".parse()?, 5)?;
    assert_eq!(
        kubernetes.backends.get(&api_pod.to_string()),
        Some(&5),
        "pods reach the API through the kubernetes Service: {kubernetes:?}"
    );
    assert!(api.requests("list services") >= 1);
    let log = agent.log_text();
    assert!(
        log.lines().any(
            |l| l.contains("reading Services and EndpointSlices from the API")
                && l.contains(&server)
        ),
        "the agent names the server it uses:\n{log}"
    );
    assert!(
        !log.contains("reaches the API server through"),
        "no warning in replace mode:\n{log}"
    );
    assert_eq!(agent.get("/readyz")?.0, 200);
    Ok(())
}

/// `socklb reset` with the JSON output read into the CLI's own type.
fn reset(pin_folder: &Path) -> anyhow::Result<Reset> {
    let out = std::process::Command::new(bins::socklb()?)
        .args(["reset", "-o", "json", "--bpffs"])
        .arg(pin_folder)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "socklb reset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Uninstall as the cleanup DaemonSet does it, after the agent's pod was deleted (kill -9
/// here: what a crash or a deleted DaemonSet leaves is pinned programs serving frozen maps):
/// `socklb reset` leaves no program attached to the cgroup (as the kernel reports it, pins or
/// not) and nothing in the bpf filesystem, the Service address is untouched again, and a
/// second run (a restarted cleanup pod) finds nothing and succeeds.
#[test]
fn uninstall_after_kill_9_leaves_no_program_and_no_pin() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let mut agent = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    let programs = socklb_tests::features::Claims::of(&agent.status()?).programs();
    agent.kill9();
    let attached = cgroup_program_ids(&sandbox.cgroup)?;
    assert_eq!(attached.len(), programs);
    assert_eq!(
        connect(&sandbox, WEB, 10)?.answers(),
        10,
        "frozen, but still translating"
    );

    let done = reset(&sandbox.pin_folder())?;
    assert!(done.pinned, "{done:?}");
    assert_eq!(done.links, programs, "{done:?}");
    assert!(done.maps >= lb_common::MAPS.len(), "{done:?}");
    assert_eq!(
        cgroup_program_ids(&sandbox.cgroup)?,
        Vec::<u32>::new(),
        "no program attached"
    );
    assert_eq!(pins(&sandbox)?, BTreeMap::new(), "nothing left in bpffs");
    let untouched = connect(&sandbox, WEB, 3)?;
    assert_eq!(
        untouched.errors.get("ENETUNREACH"),
        Some(&3),
        "the ClusterIP is a plain address again: {untouched:?}"
    );
    let again = reset(&sandbox.pin_folder())?;
    assert!(
        !again.pinned && again.links == 0 && again.maps == 0,
        "{again:?}"
    );
    Ok(())
}

/// An upgrade to an agent whose map layout differs (other map sizes: another `maps-<digest>`
/// generation) while three client processes connect in a loop: the old programs keep serving
/// until the new agent has written its first full sync into its new maps, the new links go in
/// beside the old ones, then the old ones go. No connect fails; the new generation serves;
/// the old generation's folder is gone; exactly one program per hook is attached; a connection
/// made before the switch still reports the Service's address from getpeername.
#[test]
fn a_new_map_layout_takes_over_make_before_break_under_load() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let mut old = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    let folder = PinFolder::new(sandbox.pin_folder());
    let old_generation = folder.current().expect("a generation");
    let old_programs = cgroup_program_ids(&sandbox.cgroup)?;
    let links = socklb_tests::features::Claims::of(&old.status()?).programs();
    assert_eq!(old_programs.len(), links);

    let (mut held, opened) = hold_a_connection(&sandbox)?;
    let load = Load::start(&sandbox, WEB.parse()?, 3, 1)?;
    std::thread::sleep(Duration::from_millis(300));
    // A rolling update: the old pod gets SIGTERM and exits, then the new one starts.
    let stopped = old.stop()?;
    assert!(stopped.success(), "the old agent stops cleanly: {stopped}");
    let switch_start = wall_ns();
    let new_backends = 4096u32;
    assert_ne!(new_backends, lb_common::MapId::Backends.default_capacity());
    let new = sandbox.start_agent(&AgentOptions::with_args([
        "--max-backends".to_string(),
        new_backends.to_string(),
    ]))?;
    let switch_end = wall_ns();
    std::thread::sleep(Duration::from_millis(300));
    let done = load.finish()?;
    let (replies, connects) = (&done.replies, &done.connects);
    let failed = done.failed();
    let during = connects
        .iter()
        .filter(|c| c.overlaps(switch_start, switch_end))
        .count();
    let switch_ms = (switch_end - switch_start) / 1_000_000;
    figure("layout migration: connects", connects.len());
    figure("layout migration: connects during the switch", during);
    figure("layout migration: failed connects", failed.len());
    figure("layout migration: new agent start to ready (ms)", switch_ms);
    for r in replies {
        assert!(r.errors.is_empty(), "failed connects: {:?}", r.errors);
    }
    assert!(failed.is_empty(), "failed connects: {failed:?}");
    assert!(
        during >= 10,
        "only {during} connects overlapped the {switch_ms} ms switch"
    );
    let backends: std::collections::BTreeSet<&str> =
        connects.iter().map(|c| c.outcome.as_str()).collect();
    assert_eq!(
        backends,
        [A, B].into_iter().collect(),
        "every connect reached the Service's backends"
    );

    // The new generation is the one attached and serving.
    let new_generation = folder.current().expect("a generation");
    assert_ne!(new_generation, old_generation);
    assert!(
        !old_generation.exists(),
        "{} is still there",
        old_generation.display()
    );
    assert_eq!(folder.map_dirs(), std::slice::from_ref(&new_generation));
    assert_eq!(
        new.metric("socklb_map_capacity{map=\"BACKENDS\"}")?,
        Some(f64::from(new_backends))
    );
    let programs = cgroup_programs(&sandbox.cgroup)?;
    assert!(
        programs.values().all(|ids| ids.len() <= 1)
            && programs.values().map(Vec::len).sum::<usize>() == links,
        "exactly one program per hook: {programs:?}"
    );
    let mut attached: Vec<u32> = programs.into_values().flatten().collect();
    attached.sort_unstable();
    let mut pinned: Vec<u32> = sandbox
        .inspect_as::<Vec<ProgramView>>(&["programs"])?
        .iter()
        .map(|p| p.id)
        .collect();
    pinned.sort_unstable();
    assert_eq!(
        attached, pinned,
        "the attached programs are the pinned ones"
    );
    assert!(
        attached.iter().all(|id| !old_programs.contains(id)),
        "the old programs are gone: {attached:?} vs {old_programs:?}"
    );
    assert!(
        new.log_text()
            .contains("removed another layout's maps (migrated)"),
        "{}",
        new.log_tail(30)
    );
    sandbox.wait_candidates(WEB, &[A, B])?;
    assert_eq!(connect(&sandbox, WEB, 20)?.answers(), 20);
    still_on_the_service(&mut held, &opened)
}

/// A connection that outlives its Service across a migration (the Service goes while the agent
/// is down, and the new agent has another map layout): getpeername still reports the Service's
/// address, and closing it frees its connection slot. The programs look for a record only on
/// ports in the backend port bitmap; no backend of the new generation uses the connection's
/// port, so the new generation starts with the old one's bits.
#[test]
fn a_connection_outliving_its_service_across_a_migration_keeps_its_name_and_frees_its_slot()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let mut old = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    let folder = PinFolder::new(sandbox.pin_folder());
    let old_generation = folder.current().expect("a generation");
    let slots = SocketPins::new(folder.sockets(&socket_layout_digest()));
    // Slots need the release program; without it (refused, or turned off) the record is in
    // socket storage, and only the name is to check.
    let with_slots = socklb_tests::features::Claims::of(&old.status()?).socket_release;
    let (mut held, opened) = hold_a_connection(&sandbox)?;
    assert_eq!(
        held_slots(&slots)?,
        usize::from(with_slots),
        "the connection holds a slot where there are slots"
    );
    let stopped = old.stop()?;
    assert!(stopped.success(), "the old agent stops cleanly: {stopped}");
    sandbox.remove_manifest("service.yaml")?;
    sandbox.remove_manifest("endpointslice.yaml")?;
    let new = sandbox.start_agent(&AgentOptions::with_args([
        "--max-backends".to_string(),
        "4096".to_string(),
    ]))?;
    sandbox.wait_gone(WEB)?;
    assert_ne!(folder.current().as_ref(), Some(&old_generation), "migrated");
    assert!(
        new.log_text()
            .contains("carried the backend port bitmap of the previous layout"),
        "{}",
        new.log_tail(30)
    );
    still_on_the_service(&mut held, &opened)?;
    closing_frees_its_slot(&mut held, &slots)
}

/// An agent that finds its connection slots without `SLOTS_HELD` beside them (an older agent's
/// folder: its programs took slots and wrote no byte) marks every slot as possibly held before
/// its own programs read the bytes: a connection made before the upgrade still reports the
/// Service's address from getpeername, and closing it frees its slot.
#[test]
fn a_connection_made_under_an_agent_without_slot_bytes_keeps_its_name_and_frees_its_slot()
-> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::seeded()?;
    let mut old = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    let folder = PinFolder::new(sandbox.pin_folder());
    let slots = SocketPins::new(folder.sockets(&socket_layout_digest()));
    if !socklb_tests::features::Claims::of(&old.status()?).socket_release {
        // No release program, no slots: the record is in socket storage.
        println!("FALLBACK no connection slots on this kernel: nothing to mark");
        return Ok(());
    }
    let (mut held, opened) = hold_a_connection(&sandbox)?;
    assert_eq!(held_slots(&slots)?, 1, "the connection holds a slot");
    let stopped = old.stop()?;
    assert!(stopped.success(), "the old agent stops cleanly: {stopped}");
    // As an older agent left the folder: slots, and no byte per slot.
    std::fs::remove_file(slots.dir.join(lb_common::MapId::SlotsHeld.name()))?;
    let new = sandbox.start_agent(&AgentOptions::default())?;
    sandbox.wait_candidates(WEB, &[A, B])?;
    assert!(
        new.log_text()
            .contains("marked every connection slot as possibly held"),
        "{}",
        new.log_tail(30)
    );
    still_on_the_service(&mut held, &opened)?;
    closing_frees_its_slot(&mut held, &slots)
}

/// Closes the held connection; its slot is then free.
fn closing_frees_its_slot(held: &mut Client, slots: &SocketPins) -> anyhow::Result<()> {
    let closed = held.run(&Command::Close { id: 1 })?;
    assert!(closed.ok, "{closed:?}");
    assert_eq!(
        held_slots(slots)?,
        0,
        "closing the connection freed its slot"
    );
    Ok(())
}

/// A connection to the Service made before a migration: its record lives in the per-socket
/// storage, which a new layout keeps when the records' own layout is unchanged.
fn hold_a_connection(sandbox: &Sandbox) -> anyhow::Result<(Client, Reply)> {
    let mut held = sandbox.client()?;
    let opened = held.run(&Command::Open {
        id: 1,
        target: WEB.parse()?,
        udp: false,
    })?;
    assert!(opened.ok, "{opened:?}");
    Ok((held, opened))
}

/// The held connection still reports the Service's address from getpeername (its record was
/// read by the new programs), and still talks to its backend.
fn still_on_the_service(held: &mut Client, opened: &Reply) -> anyhow::Result<()> {
    let after = held.run(&Command::Exchange {
        id: 1,
        msg: "after the migration".into(),
    })?;
    assert!(after.ok, "{after:?}");
    assert_eq!(
        after.peer_names.keys().collect::<Vec<_>>(),
        [WEB],
        "getpeername of a connection made before the migration: {after:?}"
    );
    assert_eq!(
        after.backends, opened.backends,
        "the connection kept its backend"
    );
    Ok(())
}
