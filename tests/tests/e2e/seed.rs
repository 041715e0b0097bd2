//! The first end-to-end slice: seed 000's Service (10.96.0.10:80 → 8080) with two ready
//! endpoints, served by the real agent from examples/seed, on real sockets.
use std::path::PathBuf;

use socklb_tests::{Sandbox, agent::AgentOptions};

fn seed_manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/seed")
}

#[test]
fn seed_service_reaches_both_backends_and_leaves_other_processes_alone() -> anyhow::Result<()> {
    socklb_tests::require_privileges!();
    let sandbox = Sandbox::new()?;
    sandbox.add_backend("10.244.1.21:8080".parse()?, false)?;
    sandbox.add_backend("10.244.2.34:8080".parse()?, false)?;
    sandbox.copy_manifests(&seed_manifests())?;
    let _agent = sandbox.start_agent(&AgentOptions::default())?;

    let mut client = sandbox.client()?;
    let reply = client.connect("10.96.0.10:80".parse()?, 200)?;
    assert_eq!(reply.failures(), 0, "connects failed: {reply:?}");
    assert_eq!(
        reply.backends.keys().collect::<Vec<_>>(),
        ["10.244.1.21:8080", "10.244.2.34:8080"],
        "both backends answer"
    );
    assert!(
        reply.backends.values().all(|n| *n >= 40),
        "both get a fair share: {:?}",
        reply.backends
    );
    assert_eq!(
        reply.peer_names.get("10.96.0.10:80"),
        Some(&200),
        "getpeername reports the service address"
    );
    assert!(
        reply
            .seen_as
            .keys()
            .all(|peer| peer.starts_with("10.244.0.2:")),
        "the backends see the client's own address: {:?}",
        reply.seen_as.keys().take(3).collect::<Vec<_>>()
    );

    let mut outside = sandbox.outside_client()?;
    let reply = outside.connect("10.96.0.10:80".parse()?, 3)?;
    assert_eq!(
        reply.errors.get("ENETUNREACH"),
        Some(&3),
        "a process outside the cgroup is not translated: {reply:?}"
    );
    Ok(())
}
