//! kube-proxy's layouts, generated for N services, loaded into one client namespace each:
//!
//! - iptables mode: nat OUTPUT → KUBE-SERVICES (one rule per service port) → KUBE-SVC-* (one
//!   `statistic --mode random --probability` rule per endpoint) → KUBE-SEP-* (mark for
//!   masquerade if hairpin, DNAT). Loaded with one `iptables-restore`.
//! - nftables mode: a `service-ips` verdict map keyed by address, protocol and port → one chain
//!   per service (`numgen random mod N vmap`) → one chain per endpoint (DNAT). Loaded in batches
//!   (one big transaction of 10,000 services stalls the kernel for tens of seconds).
//!
//! Every rule lives in the case's own network namespace and disappears with it.
use std::{
    fmt::Write as _,
    io::Write as _,
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

/// One service port as kube-proxy sees it: the cluster IP:port and its endpoints.
#[derive(Clone, Debug)]
pub struct SvcPort {
    pub name: String,
    pub vip: SocketAddr,
    pub endpoints: Vec<SocketAddr>,
}

/// kube-proxy names chains by a hash of what they stand for.
fn chain_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02X}");
        out
    })
}

/// The iptables-restore input for the nat table.
pub fn iptables_rules(services: &[SvcPort]) -> String {
    let mut chains = String::from(
        "*nat\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    let mut rules = String::from(
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
    );
    for svc in services {
        let svc_chain = format!("KUBE-SVC-{}", chain_hash(&svc.name));
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"{} cluster IP\" -m tcp --dport {} -j {svc_chain}",
            svc.vip.ip(),
            svc.name,
            svc.vip.port()
        );
        ipt_service(svc, &mut chains, &mut rules, true);
    }
    format!("{chains}{rules}COMMIT\n")
}

/// One service's KUBE-SVC chain and its endpoints' KUBE-SEP chains, spread by conditional
/// probabilities; `cluster_ip`: with the comments and the hairpin masquerade rule kube-proxy
/// writes for a ClusterIP. Returns the KUBE-SVC chain's name.
fn ipt_service(svc: &SvcPort, chains: &mut String, rules: &mut String, cluster_ip: bool) -> String {
    let svc_chain = format!("KUBE-SVC-{}", chain_hash(&svc.name));
    let _ = writeln!(chains, ":{svc_chain} - [0:0]");
    let n = svc.endpoints.len();
    for (i, ep) in svc.endpoints.iter().enumerate() {
        let sep = format!("KUBE-SEP-{}", chain_hash(&format!("{}/{ep}", svc.name)));
        let _ = writeln!(chains, ":{sep} - [0:0]");
        let comment = if cluster_ip {
            format!(" -m comment --comment \"{} -> {ep}\"", svc.name)
        } else {
            String::new()
        };
        let left = n - i;
        if left > 1 {
            let _ = writeln!(
                rules,
                "-A {svc_chain}{comment} -m statistic --mode random --probability {:.11} -j {sep}",
                1.0 / left as f64
            );
        } else {
            let _ = writeln!(rules, "-A {svc_chain}{comment} -j {sep}");
        }
        if cluster_ip {
            let _ = writeln!(rules, "-A {sep} -s {}/32 -j KUBE-MARK-MASQ", ep.ip());
        }
        let _ = writeln!(
            rules,
            "-A {sep} -p tcp -m tcp -j DNAT --to-destination {ep}"
        );
    }
    svc_chain
}

/// The nft scripts: the table and its fixed chains, then the services in batches.
pub fn nft_scripts(services: &[SvcPort], batch: usize) -> Vec<String> {
    let mut scripts = vec![String::from(
        "add table ip kube-proxy\n\
         add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n\
         add chain ip kube-proxy services\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add chain ip kube-proxy nat-output { type nat hook output priority -100 ; policy accept ; }\n\
         add rule ip kube-proxy nat-output jump services\n",
    )];
    for chunk in services.chunks(batch.max(1)) {
        let mut s = String::new();
        for svc in chunk {
            let chain = nft_service(&mut s, svc, true);
            let _ = writeln!(
                s,
                "add element ip kube-proxy service-ips {{ {} . tcp . {} : goto {chain} }}",
                svc.vip.ip(),
                svc.vip.port()
            );
        }
        scripts.push(s);
    }
    scripts
}

/// kube-proxy's iptables layout for traffic from outside: `nat PREROUTING` → KUBE-SERVICES
/// (one rule per load-balancer IP, then `--dst-type LOCAL` → KUBE-NODEPORTS last, as
/// kube-proxy writes it), the NodePort's KUBE-EXT chain marking for masquerade, KUBE-SVC and
/// KUBE-SEP chains as above, and POSTROUTING's masquerade of marked packets.
pub fn iptables_outside_rules(services: &[SvcPort], node_port: u16, measured: &SvcPort) -> String {
    let mut chains = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n",
    );
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n",
    );
    for svc in services {
        let svc_chain = ipt_service(svc, &mut chains, &mut rules, false);
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"{} loadbalancer IP\" -m tcp --dport {} -j {svc_chain}",
            svc.vip.ip(),
            svc.name,
            svc.vip.port()
        );
    }
    let svc_chain = ipt_service(measured, &mut chains, &mut rules, false);
    let ext = format!("KUBE-EXT-{}", chain_hash(&measured.name));
    let _ = writeln!(chains, ":{ext} - [0:0]");
    let _ = writeln!(rules, "-A {ext} -j KUBE-MARK-MASQ\n-A {ext} -j {svc_chain}");
    let _ = writeln!(
        rules,
        "-A KUBE-NODEPORTS -p tcp -m tcp --dport {node_port} -j {ext}\n\
         -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    format!("{chains}{rules}COMMIT\n")
}

/// kube-proxy's nftables layout for traffic from outside (1.31's shapes): `nat-prerouting` →
/// `services` (the `service-ips` verdict map by load-balancer IP, then `service-nodeports` for
/// local addresses), an external chain marking for masquerade, a chain per service
/// (`numgen random mod N vmap`) and per endpoint (DNAT), and `nat-postrouting`'s masquerade;
/// the services in batches of `batch`.
pub fn nft_outside_scripts(
    services: &[SvcPort],
    node_port: u16,
    measured: &SvcPort,
    batch: usize,
) -> Vec<String> {
    let mut first = String::from(
        "add table ip kube-proxy\n\
         add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
         add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; }\n\
         add chain ip kube-proxy services\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\
         add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; policy accept ; }\n\
         add rule ip kube-proxy nat-prerouting jump services\n\
         add chain ip kube-proxy masquerading\n\
         add rule ip kube-proxy masquerading mark and 0x4000 == 0 return\n\
         add rule ip kube-proxy masquerading mark set mark xor 0x4000\n\
         add rule ip kube-proxy masquerading masquerade fully-random\n\
         add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; policy accept ; }\n\
         add rule ip kube-proxy nat-postrouting jump masquerading\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n",
    );
    let chain = nft_service(&mut first, measured, false);
    let ext = format!("external-{}", chain_hash(&measured.name));
    let _ = writeln!(first, "add chain ip kube-proxy {ext}");
    let _ = writeln!(
        first,
        "add rule ip kube-proxy {ext} jump mark-for-masquerade"
    );
    let _ = writeln!(first, "add rule ip kube-proxy {ext} goto {chain}");
    let _ = writeln!(
        first,
        "add element ip kube-proxy service-nodeports {{ tcp . {node_port} : goto {ext} }}"
    );
    let mut scripts = vec![first];
    for chunk in services.chunks(batch.max(1)) {
        let mut s = String::new();
        for svc in chunk {
            let chain = nft_service(&mut s, svc, false);
            let _ = writeln!(
                s,
                "add element ip kube-proxy service-ips {{ {} . tcp . {} : goto {chain} }}",
                svc.vip.ip(),
                svc.vip.port()
            );
        }
        scripts.push(s);
    }
    scripts
}

/// One service's chain and its endpoints' chains, in kube-proxy's nftables shape; its name.
/// `hairpin`: each endpoint chain first marks an endpoint's connects to itself for masquerade,
/// as kube-proxy writes for a ClusterIP.
fn nft_service(s: &mut String, svc: &SvcPort, hairpin: bool) -> String {
    let chain = format!("service-{}", chain_hash(&svc.name));
    let _ = writeln!(s, "add chain ip kube-proxy {chain}");
    let mut vmap = Vec::new();
    for (i, ep) in svc.endpoints.iter().enumerate() {
        let ep_chain = format!("endpoint-{}", chain_hash(&format!("{}/{ep}", svc.name)));
        let _ = writeln!(s, "add chain ip kube-proxy {ep_chain}");
        if hairpin {
            let _ = writeln!(
                s,
                "add rule ip kube-proxy {ep_chain} ip saddr {} jump mark-for-masquerade",
                ep.ip()
            );
        }
        let _ = writeln!(
            s,
            "add rule ip kube-proxy {ep_chain} meta l4proto tcp dnat to {ep}"
        );
        vmap.push(format!("{i} : goto {ep_chain}"));
    }
    let _ = writeln!(
        s,
        "add rule ip kube-proxy {chain} numgen random mod {} vmap {{ {} }}",
        svc.endpoints.len(),
        vmap.join(", ")
    );
    chain
}

/// Loads kube-proxy's outside layout of one mode into `netns`; returns the load time.
pub fn load_outside(
    netns: &str,
    nftables: bool,
    services: &[SvcPort],
    node_port: u16,
    measured: &SvcPort,
) -> anyhow::Result<Duration> {
    if nftables {
        let _ = run_in(netns, "nft", &["-f", "-"], "delete table ip kube-proxy\n");
        let start = Instant::now();
        for script in nft_outside_scripts(services, node_port, measured, 500) {
            run_in(netns, "nft", &["-f", "-"], &script)?;
        }
        Ok(start.elapsed())
    } else {
        let rules = iptables_outside_rules(services, node_port, measured);
        let start = Instant::now();
        run_in(netns, "iptables-restore", &[], &rules)?;
        Ok(start.elapsed())
    }
}

fn run_in(netns: &str, program: &str, args: &[&str], input: &str) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, program])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program} in {netns}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Replaces the nat table of `netns` with kube-proxy's iptables layout; returns the load time.
pub fn load_iptables(netns: &str, services: &[SvcPort]) -> anyhow::Result<Duration> {
    let rules = iptables_rules(services);
    let start = Instant::now();
    run_in(netns, "iptables-restore", &[], &rules)?;
    Ok(start.elapsed())
}

/// Replaces the kube-proxy table of `netns` with the nftables layout, in batches; returns the
/// load time.
pub fn load_nftables(netns: &str, services: &[SvcPort]) -> anyhow::Result<Duration> {
    let _ = run_in(netns, "nft", &["-f", "-"], "delete table ip kube-proxy\n");
    let start = Instant::now();
    for script in nft_scripts(services, 500) {
        run_in(netns, "nft", &["-f", "-"], &script)?;
    }
    Ok(start.elapsed())
}

/// The iptables variant in use (`iptables v1.8.9 (nf_tables)`).
pub fn iptables_version() -> String {
    Command::new("iptables").arg("-V").output().map_or_else(
        |_| "iptables: unknown".into(),
        |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> SvcPort {
        SvcPort {
            name: "default/web:http".into(),
            vip: "10.96.0.10:80".parse().unwrap(),
            endpoints: vec![
                "10.244.1.21:8080".parse().unwrap(),
                "10.244.2.34:8080".parse().unwrap(),
            ],
        }
    }

    #[test]
    fn iptables_layout_spreads_with_conditional_probabilities() {
        let rules = iptables_rules(&[svc()]);
        assert!(rules.contains("-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp"));
        assert!(rules.contains("--probability 0.50000000000"));
        assert_eq!(rules.matches("-j DNAT --to-destination").count(), 2);
        assert!(rules.ends_with("COMMIT\n"));
    }

    #[test]
    fn nft_layout_uses_a_verdict_map_and_batches() {
        let scripts = nft_scripts(&[svc(), svc(), svc()], 2);
        assert_eq!(scripts.len(), 3, "the table, then two batches");
        assert!(scripts[0].contains("vmap @service-ips"));
        assert!(scripts[1].contains("numgen random mod 2 vmap"));
    }
}
