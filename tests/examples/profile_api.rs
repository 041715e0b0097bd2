//! The agent in API mode on N realistic services (default 10,000), once per allocator setting
//! given as `NAME=VALUE` arguments (none: the default): time to ready and memory.
fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let services = args
        .first()
        .and_then(|a| a.parse().ok())
        .inspect(|_| {
            args.remove(0);
        })
        .unwrap_or(10_000);
    let sandbox = socklb_tests::Sandbox::new()?;
    let mut settings: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for a in &args {
        if let Some((k, v)) = a.split_once('=') {
            settings.push(vec![(k.to_string(), v.to_string())]);
        }
    }
    for env in settings {
        let r =
            socklb_tests::bench::controlplane::api_mode_with(&sandbox, services, 0, env.clone())?;
        eprintln!(
            "{env:?}: ready {:.1} s, peak RSS {:.1} MiB, RSS after {:.1} MiB",
            r.ready_s, r.peak_rss_mib, r.rss_mib
        );
    }
    Ok(())
}
