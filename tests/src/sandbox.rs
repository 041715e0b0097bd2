//! A throwaway world for one test or demo run: a client "pod" (network namespace) inside a
//! child cgroup of its own, backend pods each in their own network namespace (or many backends
//! in one, for a suite of hundreds), all joined by veth pairs to a bridge, a private bpf
//! filesystem for socklb's pins, and the processes started in them. `teardown` (run by `Drop`,
//! on success, failure or panic, and by the signal handler of `teardown_on_signal` for every
//! sandbox made with `Sandbox::shared`) removes all of it; what a killed run left behind is
//! swept by the next one (names carry the owning PID).
//!
//! Addresses: the client is 10.244.0.2/16 and `fd00:244::2/64`; backends get addresses in the same
//! subnets. Service addresses (10.96.0.0/12, `fd00:96::/64`) have no route in the client
//! namespace, so a connect that socklb does not translate fails with ENETUNREACH and never
//! leaves the sandbox.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{ChildStdin, ChildStdout, Command as Process, Stdio},
    sync::{
        Arc, Mutex, OnceLock, Weak,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    agent::{AgentOptions, AgentProcess},
    apiserver::ApiServer,
    bins,
    client::{Command, Reply},
    processes::{Owned, Registry},
    system::{cgroup2_mount, ip},
};

pub const CLIENT_V4: &str = "10.244.0.2";
pub const CLIENT_V6: &str = "fd00:244::2";

/// A pod address with the prefix of the sandbox's pod network.
fn pod_cidr(addr: IpAddr) -> String {
    if addr.is_ipv4() {
        format!("{addr}/16")
    } else {
        format!("{addr}/64")
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub struct Sandbox {
    pub id: String,
    pub client_ns: String,
    /// The namespace holding the bridge every pod is plugged into.
    pub switch_ns: String,
    pub cgroup: PathBuf,
    pub pin_mount: PathBuf,
    pub workdir: PathBuf,
    /// Backend pod namespace by address.
    pods: Mutex<BTreeMap<IpAddr, String>>,
    servers: Mutex<Vec<(SocketAddr, bool, Owned)>>,
    pub(crate) processes: Registry,
    made: Made,
    /// Set when a teardown has finished (`LIVE` keeps a handle on it: see `teardown_on_signal`).
    torn_down: Arc<std::sync::atomic::AtomicBool>,
}

/// What has been created so far, so a half-built sandbox is torn down too. Each kind is made
/// while its lock is held and only while the sandbox is open: a teardown (from a signal
/// handler, while the demo's main thread is still building) closes it first and then waits
/// for the creation in progress, so nothing is made after it looked.
#[derive(Default)]
struct Made {
    closed: std::sync::atomic::AtomicBool,
    netns: Mutex<Vec<String>>,
    cgroups: Mutex<Vec<PathBuf>>,
    mount: Mutex<Option<PathBuf>>,
    workdir: Mutex<Option<PathBuf>>,
    /// Folders in /etc/netns (files `ip netns exec` binds over /etc in a namespace).
    etc_netns: Mutex<Vec<PathBuf>>,
}

impl Made {
    fn open(&self) -> anyhow::Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            bail!("the sandbox is being torn down");
        }
        Ok(())
    }
}

impl Sandbox {
    /// Builds the client and switch namespaces, the cgroup and the bpf filesystem.
    pub fn new() -> anyhow::Result<Self> {
        let sandbox = Self::unbuilt()?;
        sandbox.build()?;
        Ok(sandbox)
    }

    /// The same, shared, and torn down by the handler of [`teardown_on_signal`] when the
    /// process is signalled, whichever phase of a run it is in (a run that makes several
    /// sandboxes, one after another or side by side, registers each). It is registered before
    /// anything is made, so a signal while it is being built tears down what was made so far;
    /// once a signal's teardown has begun, no new sandbox is made.
    pub fn shared() -> anyhow::Result<Arc<Self>> {
        let sandbox = Arc::new(Self::unbuilt()?);
        {
            let mut live = lock(&LIVE);
            if interrupted() {
                bail!("interrupted: no new sandbox");
            }
            live.retain(|entry| !entry.finished());
            live.push(Registered {
                sandbox: Arc::downgrade(&sandbox),
                torn_down: sandbox.torn_down.clone(),
            });
        }
        sandbox.build()?;
        Ok(sandbox)
    }

    /// Names only; nothing is made yet.
    fn unbuilt() -> anyhow::Result<Self> {
        crate::system::sweep_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 256;
        let id = format!("slb{:x}x{n:02x}", std::process::id());
        let cg2 = cgroup2_mount().context("no cgroup2 mount")?;
        Ok(Self {
            client_ns: format!("{id}c"),
            switch_ns: format!("{id}s"),
            cgroup: cg2.join(&id),
            pin_mount: std::env::temp_dir().join(format!("{id}-bpffs")),
            workdir: std::env::temp_dir().join(format!("{id}-work")),
            id,
            pods: Mutex::new(BTreeMap::new()),
            servers: Mutex::new(Vec::new()),
            processes: Registry::default(),
            made: Made::default(),
            torn_down: Arc::default(),
        })
    }

    fn add_netns(&self, name: &str) -> anyhow::Result<()> {
        {
            let mut made = lock(&self.made.netns);
            self.made.open()?;
            ip(&["netns", "add", name])?;
            made.push(name.to_string());
        }
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    /// Plugs a namespace into the bridge: `port` on the switch side, `eth0` inside.
    fn plug(&self, ns: &str, port: &str, addrs: &[String]) -> anyhow::Result<()> {
        let sw = &self.switch_ns;
        ip(&[
            "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        ip(&["-n", sw, "link", "set", port, "master", "br0", "up"])?;
        for a in addrs {
            let mut args = vec!["-n", ns, "addr", "add", a.as_str(), "dev", "eth0"];
            if a.contains(':') {
                args.push("nodad");
            }
            ip(&args)?;
        }
        ip(&["-n", ns, "link", "set", "eth0", "up"])
    }

    fn build(&self) -> anyhow::Result<()> {
        self.add_netns(&self.switch_ns)?;
        ip(&[
            "-n",
            &self.switch_ns,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", &self.switch_ns, "link", "set", "br0", "up"])?;
        self.add_netns(&self.client_ns)?;
        self.plug(
            &self.client_ns,
            "client",
            &[format!("{CLIENT_V4}/16"), format!("{CLIENT_V6}/64")],
        )?;

        self.add_cgroup(&self.cgroup)?;

        {
            let mut mount = lock(&self.made.mount);
            self.made.open()?;
            std::fs::create_dir_all(&self.pin_mount)?;
            *mount = Some(self.pin_mount.clone());
            crate::system::mount_bpffs(&self.pin_mount)?;
        }
        let mut workdir = lock(&self.made.workdir);
        self.made.open()?;
        *workdir = Some(self.workdir.clone());
        std::fs::create_dir_all(self.manifests())?;
        Ok(())
    }

    fn add_cgroup(&self, path: &Path) -> anyhow::Result<()> {
        let mut made = lock(&self.made.cgroups);
        self.made.open()?;
        std::fs::create_dir(path).with_context(|| format!("creating {}", path.display()))?;
        made.push(path.to_path_buf());
        Ok(())
    }

    /// A network namespace of the sandbox named `{id}{suffix}`, with its loopback up; removed
    /// with the sandbox.
    pub fn netns(&self, suffix: &str) -> anyhow::Result<String> {
        let ns = format!("{}{suffix}", self.id);
        self.add_netns(&ns)?;
        Ok(ns)
    }

    /// A bridge `name` (up) in namespace `ns`.
    pub fn bridge(&self, ns: &str, name: &str) -> anyhow::Result<()> {
        ip(&[
            "-n",
            ns,
            "link",
            "add",
            name,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", ns, "link", "set", name, "up"])
    }

    /// Plugs `ns` into the bridge `bridge` of namespace `bridge_ns`: `port` on the bridge's
    /// side, `inside` in `ns` with `addrs` (CIDR notation), both up.
    pub fn plug_into(
        &self,
        ns: &str,
        inside: &str,
        bridge_ns: &str,
        bridge: &str,
        port: &str,
        addrs: &[String],
    ) -> anyhow::Result<()> {
        ip(&[
            "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", inside, "netns",
            ns,
        ])?;
        ip(&["-n", bridge_ns, "link", "set", port, "master", bridge, "up"])?;
        for a in addrs {
            let mut args = vec!["-n", ns, "addr", "add", a.as_str(), "dev", inside];
            if a.contains(':') {
                args.push("nodad");
            }
            ip(&args)?;
        }
        ip(&["-n", ns, "link", "set", inside, "up"])
    }

    /// A cgroup at `path` (a child of a cgroup the sandbox made), removed with the sandbox.
    pub fn child_cgroup(&self, path: &Path) -> anyhow::Result<()> {
        self.add_cgroup(path)
    }

    /// Another client pod on the bridge at `ipv4`, with a cgroup of its own that is a sibling
    /// of the sandbox's (socklb's programs attached to the sandbox cgroup do not reach it).
    pub fn extra_client_pod(&self, name: &str, ipv4: &str) -> anyhow::Result<ClientPod> {
        let n = lock(&self.made.netns).len();
        let ns = format!("{}k{n}", self.id);
        self.add_netns(&ns)?;
        self.plug(&ns, &format!("k{n}"), &[format!("{ipv4}/16")])?;
        let cgroup = self.extra_cgroup(name)?;
        Ok(ClientPod { netns: ns, cgroup })
    }

    /// Gives `netns` its own /etc/resolv.conf (for processes started with `ip netns exec`),
    /// removed with the sandbox.
    pub fn resolv_conf(&self, netns: &str, text: &str) -> anyhow::Result<()> {
        let dir = PathBuf::from("/etc/netns").join(netns);
        {
            let mut made = lock(&self.made.etc_netns);
            self.made.open()?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            made.push(dir.clone());
        }
        std::fs::write(dir.join("resolv.conf"), text)?;
        Ok(())
    }

    /// Another pod served by socklb: a network namespace on the bridge at `ipv4` and a cgroup
    /// below the sandbox's (where socklb's programs are attached), removed with the sandbox.
    pub fn served_pod(&self, name: &str, ipv4: &str) -> anyhow::Result<ClientPod> {
        let n = lock(&self.made.netns).len();
        let ns = format!("{}q{n}", self.id);
        self.add_netns(&ns)?;
        self.plug(&ns, &format!("q{n}"), &[format!("{ipv4}/16")])?;
        let cgroup = self.cgroup.join(name);
        self.add_cgroup(&cgroup)?;
        Ok(ClientPod { netns: ns, cgroup })
    }

    /// A pod served by socklb whose cgroup is `path` below the sandbox's (every folder of it
    /// made as needed, as a kubelet's layout nests them), on the bridge at `ipv4`; removed
    /// with the sandbox.
    pub fn served_pod_at(&self, path: &str, ipv4: &str) -> anyhow::Result<ClientPod> {
        let mut cgroup = self.cgroup.clone();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            cgroup.push(part);
            if !cgroup.exists() {
                self.add_cgroup(&cgroup)?;
            }
        }
        let n = lock(&self.made.netns).len();
        let ns = format!("{}q{n}", self.id);
        self.add_netns(&ns)?;
        self.plug(&ns, &format!("q{n}"), &[format!("{ipv4}/16")])?;
        Ok(ClientPod { netns: ns, cgroup })
    }

    /// A memory cgroup of its own below this process's (cgroup v2 when the memory controller
    /// is there, else v1's), removed with the sandbox: for an agent whose memory is limited.
    pub fn memory_cgroup(&self, name: &str) -> anyhow::Result<MemoryCgroup> {
        let cg2 = cgroup2_mount().context("no cgroup2 mount")?;
        let v2 = std::fs::read_to_string(cg2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
        let path = if v2 {
            self.cgroup
                .parent()
                .context("sandbox cgroup without a parent")?
                .join(format!("{}-{name}", self.id))
        } else {
            let own = std::fs::read_to_string("/proc/self/cgroup")?
                .lines()
                .find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let _ = parts.next();
                    (parts.next()?.split(',').any(|c| c == "memory"))
                        .then(|| parts.next().map(str::to_string))
                        .flatten()
                })
                .context("no v1 memory cgroup for this process")?;
            PathBuf::from("/sys/fs/cgroup/memory")
                .join(own.trim_start_matches('/'))
                .join(format!("{}-{name}", self.id))
        };
        self.add_cgroup(&path)?;
        Ok(MemoryCgroup { path, v2 })
    }

    /// An empty cgroup, a sibling of the sandbox's, removed with the sandbox.
    pub fn extra_cgroup(&self, name: &str) -> anyhow::Result<PathBuf> {
        let cgroup = self
            .cgroup
            .parent()
            .context("sandbox cgroup without a parent")?
            .join(format!("{}-{name}", self.id));
        self.add_cgroup(&cgroup)?;
        Ok(cgroup)
    }

    /// A client process in `pod`.
    pub fn client_in(&self, pod: &ClientPod) -> anyhow::Result<Client> {
        Client::spawn(&self.processes, Some(&pod.cgroup), &pod.netns)
    }

    /// Where socklb pins its maps and links in this sandbox.
    pub fn pin_folder(&self) -> PathBuf {
        self.pin_mount.join("socklb")
    }

    /// The manifests folder an agent started by `start_agent` watches.
    pub fn manifests(&self) -> PathBuf {
        self.workdir.join("manifests")
    }

    /// Writes (or replaces, atomically) one manifest file.
    pub fn write_manifest(&self, name: &str, yaml: &str) -> anyhow::Result<()> {
        let tmp = self.workdir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, self.manifests().join(name))?;
        Ok(())
    }

    pub fn remove_manifest(&self, name: &str) -> anyhow::Result<()> {
        std::fs::remove_file(self.manifests().join(name))?;
        Ok(())
    }

    /// A sandbox with seed 000 (`examples/seed`: web, 10.96.0.10:80 → 10.244.1.21:8080 and
    /// 10.244.2.34:8080) in its manifests folder and both backends running.
    pub fn seeded() -> anyhow::Result<Self> {
        let sandbox = Self::new()?;
        for b in ["10.244.1.21:8080", "10.244.2.34:8080"] {
            sandbox.add_backend(b.parse()?, false)?;
        }
        sandbox.copy_manifests(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed"))?;
        Ok(sandbox)
    }

    /// Copies every manifest of `dir` into the watched folder.
    pub fn copy_manifests(&self, dir: &Path) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let name = path
                    .file_name()
                    .context("file name")?
                    .to_string_lossy()
                    .into_owned();
                self.write_manifest(&name, &std::fs::read_to_string(&path)?)?;
            }
        }
        Ok(())
    }

    /// The backend pod's namespace for an address, created (and plugged in) on first use.
    pub fn pod(&self, addr: IpAddr) -> anyhow::Result<String> {
        let mut pods = lock(&self.pods);
        if let Some(ns) = pods.get(&addr) {
            return Ok(ns.clone());
        }
        self.new_pod(&mut pods, &BTreeSet::from([addr]))
    }

    /// A new pod namespace holding `ips`, plugged into the bridge and recorded as their pod.
    fn new_pod(
        &self,
        pods: &mut BTreeMap<IpAddr, String>,
        ips: &BTreeSet<IpAddr>,
    ) -> anyhow::Result<String> {
        let n = pods.len() + 1;
        let ns = format!("{}p{n}", self.id);
        self.add_netns(&ns)?;
        let cidrs: Vec<String> = ips.iter().map(|ip| pod_cidr(*ip)).collect();
        self.plug(&ns, &format!("pod{n}"), &cidrs)?;
        for ip in ips {
            pods.insert(*ip, ns.clone());
        }
        Ok(ns)
    }

    /// Starts a backend for each of `backends` (address, UDP or TCP), all in one pod namespace
    /// holding every address: one bridge port for all of them. A suite with hundreds of
    /// backends needs it. The bridge copies each ARP or neighbour-discovery broadcast to every
    /// port at once, and with a port per backend the copies of a few broadcasts overflow the
    /// CPU's backlog (`net.core.netdev_max_backlog`, 1,000 by default): a backend whose copy
    /// is dropped three times in a row is unreachable, and the client's connect fails with
    /// EHOSTUNREACH (CI saw it with 209 backends, 1,900 packets dropped in two seconds).
    pub fn add_backends_in_one_pod(
        &self,
        backends: &BTreeSet<(SocketAddr, bool)>,
    ) -> anyhow::Result<()> {
        {
            let mut pods = lock(&self.pods);
            let ips: BTreeSet<IpAddr> = backends.iter().map(|(a, _)| a.ip()).collect();
            if let Some(ip) = ips.iter().find(|ip| pods.contains_key(ip)) {
                bail!("{ip} already has a pod of its own");
            }
            self.new_pod(&mut pods, &ips)?;
        }
        // Each address's pod is now the shared one.
        for (addr, udp) in backends {
            self.add_backend(*addr, *udp)
                .with_context(|| format!("backend {addr}"))?;
        }
        Ok(())
    }

    /// Sets a sysctl (`name=value`) inside one of this sandbox's network namespaces.
    pub fn netns_sysctl(&self, netns: &str, setting: &str) -> anyhow::Result<()> {
        let out = Process::new("ip")
            .args(["netns", "exec", netns, "sysctl", "-q", "-w", setting])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "sysctl {setting} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Starts a backend answering on `addr` (TCP, or UDP with `udp`) in its pod.
    pub fn add_backend(&self, addr: SocketAddr, udp: bool) -> anyhow::Result<()> {
        self.add_server(addr, udp.then_some("--udp"), udp)
    }

    /// Starts a bulk sink on `addr` (TCP): it reads until EOF and answers with the count.
    pub fn add_sink(&self, addr: SocketAddr) -> anyhow::Result<()> {
        self.add_server(addr, Some("--sink"), false)
    }

    fn add_server(&self, addr: SocketAddr, flag: Option<&str>, udp: bool) -> anyhow::Result<()> {
        let ns = self.pod(addr.ip())?;
        self.serve_in(&ns, addr, flag, udp)
    }

    /// Starts a server answering on `addr` inside the network namespace `ns` (a client pod's own
    /// loopback port, say).
    pub fn serve_in_netns(&self, ns: &str, addr: SocketAddr, udp: bool) -> anyhow::Result<()> {
        self.serve_in(ns, addr, udp.then_some("--udp"), udp)
    }

    /// Starts a DNS server on `addr` (UDP) inside `ns` that answers every A question with
    /// `answer`: which server a resolver reached shows in the address it got.
    pub fn add_dns_server(
        &self,
        ns: &str,
        addr: SocketAddr,
        answer: std::net::Ipv4Addr,
    ) -> anyhow::Result<()> {
        let answer = answer.to_string();
        self.start_server(ns, addr, &["dns", "--answer", &answer], true)
    }

    fn serve_in(
        &self,
        ns: &str,
        addr: SocketAddr,
        flag: Option<&str>,
        udp: bool,
    ) -> anyhow::Result<()> {
        let mut args = vec!["serve"];
        args.extend(flag);
        self.start_server(ns, addr, &args, udp)
    }

    fn start_server(
        &self,
        ns: &str,
        addr: SocketAddr,
        args: &[&str],
        udp: bool,
    ) -> anyhow::Result<()> {
        let mut owned = self
            .processes
            .spawn(
                Process::new(bins::sbx()?)
                    .args(["--netns", ns])
                    .args(args)
                    .args(["--addr", &addr.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit()),
            )
            .context("starting a backend")?;
        let mut line = String::new();
        let stdout = owned.child().stdout.take().context("backend stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("backend {addr} did not start");
        }
        lock(&self.servers).push((addr, udp, owned));
        Ok(())
    }

    /// Every process this sandbox started and still tracks (agents, clients, backends).
    pub fn process_ids(&self) -> Vec<u32> {
        self.processes.live()
    }

    /// Stops the backend process serving `addr` (its pod stays, so connects are refused).
    pub fn stop_backend(&self, addr: SocketAddr, udp: bool) {
        lock(&self.servers).retain(|(a, u, _)| !(*a == addr && *u == udp));
    }

    /// A client process in the sandbox's cgroup and client namespace: what socklb serves.
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::spawn(&self.processes, Some(&self.cgroup), &self.client_ns)
    }

    /// A client in the client namespace but outside the cgroup: socklb must leave it alone.
    pub fn outside_client(&self) -> anyhow::Result<Client> {
        Client::spawn(&self.processes, None, &self.client_ns)
    }

    /// Runs `socklb inspect -o json ARGS` on this sandbox's pins.
    pub fn inspect(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let out = Process::new(bins::socklb()?)
            .arg("inspect")
            .arg("--bpffs")
            .arg(self.pin_folder())
            .args(["-o", "json"])
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "socklb inspect {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Runs `socklb inspect -o json ARGS` and reads the output into the CLI's own view type.
    pub fn inspect_as<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> anyhow::Result<T> {
        let value = self.inspect(args)?;
        serde_json::from_value(value.clone())
            .with_context(|| format!("inspect {} output: {value}", args.join(" ")))
    }

    /// Every backend set the pinned maps hold (`inspect services`).
    pub fn services(&self) -> anyhow::Result<Vec<socklb::dataplane::dump::ServiceView>> {
        self.inspect_as(&["services"])
    }

    /// What a connect to `target` would get (`inspect lookup`).
    pub fn lookup(&self, target: &str) -> anyhow::Result<socklb::cli::Lookup> {
        self.inspect_as(&["lookup", target])
    }

    /// Runs `socklb explain TARGET -o json` against this sandbox's manifests and pins;
    /// returns the explanation and whether the command reported no broken link.
    pub fn explain(&self, target: &str) -> anyhow::Result<(socklb::explain::Explanation, bool)> {
        self.explain_asking(target, "127.0.0.1:1")
    }

    /// `explain` that also asks the agent at `agent` (its metrics address) for its /status.
    pub fn explain_asking(
        &self,
        target: &str,
        agent: &str,
    ) -> anyhow::Result<(socklb::explain::Explanation, bool)> {
        let out = Process::new(bins::socklb()?)
            .args([
                "explain",
                target,
                "-o",
                "json",
                "--agent",
                agent,
                "--manifests",
            ])
            .arg(self.manifests())
            .arg("--bpffs")
            .arg(self.pin_folder())
            .output()?;
        let value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "explain output: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok((value, out.status.success()))
    }

    /// The backends a connect to `target` (`ADDR:PORT[/udp]`) can get now, per the maps;
    /// `None` when `target` is not a service frontend.
    pub fn candidates(&self, target: &str) -> anyhow::Result<Option<Vec<String>>> {
        let l = self.lookup(target)?;
        Ok(l.is_frontend
            .then(|| l.candidates.iter().map(ToString::to_string).collect()))
    }

    /// Waits until `target` is a frontend whose backends are exactly `expected` (any order;
    /// empty: present, with no backend).
    pub fn wait_candidates(&self, target: &str, expected: &[&str]) -> anyhow::Result<()> {
        let mut want: Vec<String> = expected.iter().map(|s| (*s).to_string()).collect();
        want.sort();
        let start = Instant::now();
        loop {
            let mut got = self.candidates(target)?;
            if let Some(g) = got.as_mut() {
                g.sort();
            }
            if got.as_ref() == Some(&want) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!("{target}: maps hold {got:?}, expected {want:?}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until `target` is no service frontend any more.
    pub fn wait_gone(&self, target: &str) -> anyhow::Result<()> {
        let start = Instant::now();
        while self.candidates(target)?.is_some() {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("{target} is still in the maps");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(())
    }

    /// Starts `socklb agent` on this sandbox's cgroup, pins and manifests folder, and waits
    /// until it reports ready.
    pub fn start_agent(&self, options: &AgentOptions) -> anyhow::Result<AgentProcess> {
        AgentProcess::start(self, options)
    }

    /// Starts `socklb agent` watching `api` (a kubeconfig for it written into the workdir)
    /// instead of the manifests folder, and waits until it reports ready.
    pub fn start_agent_watching(
        &self,
        api: &ApiServer,
        options: AgentOptions,
    ) -> anyhow::Result<AgentProcess> {
        let kubeconfig = self.workdir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        self.start_agent(&AgentOptions {
            kubeconfig: Some(kubeconfig),
            ..options
        })
    }

    /// Removes everything: processes, programs and pins, the cgroup, the namespaces, the
    /// files. Safe to call more than once, and from another thread.
    pub fn teardown(&self) {
        self.made.closed.store(true, Ordering::SeqCst);
        self.processes.close();
        lock(&self.servers).clear();
        if let Some(mount) = lock(&self.made.mount).take() {
            let pins = mount.join("socklb");
            if pins.exists()
                && let Ok(socklb) = bins::socklb()
            {
                let _ = Process::new(socklb)
                    .args(["reset", "--bpffs"])
                    .arg(&pins)
                    .stdout(Stdio::null())
                    .status();
            }
            crate::system::unmount(&mount);
            let _ = std::fs::remove_dir(&mount);
        }
        if let Some(mount) = Some(&self.pin_mount).filter(|m| m.exists()) {
            // Created, but its mount not recorded (torn down while mounting).
            crate::system::unmount(mount);
            let _ = std::fs::remove_dir(mount);
        }
        for cgroup in lock(&self.made.cgroups).drain(..).rev() {
            crate::system::remove_cgroup(&cgroup);
        }
        for ns in lock(&self.made.netns).drain(..).rev() {
            let _ = ip(&["netns", "del", &ns]);
        }
        for dir in lock(&self.made.etc_netns).drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some(dir) = lock(&self.made.workdir).take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        self.torn_down.store(true, Ordering::SeqCst);
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Set once a signal's teardown has begun: the process ends when it is done.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set by the signal itself (in the kernel's delivery, before any thread sees a call it
/// interrupted fail), where `INTERRUPTED` waits for the handler thread to run.
static SIGNALLED: OnceLock<Arc<std::sync::atomic::AtomicBool>> = OnceLock::new();

/// Whether a signal is tearing the sandbox down, or has arrived and is about to. The main
/// thread, which sees its work fail as the processes go (or a call the signal interrupted),
/// must then not return (that would end the process half-way through the teardown): it calls
/// `wait_if_interrupted` and the handler's exit ends the process.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
        || SIGNALLED
            .get()
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
}

/// Blocks forever when a signal is tearing the sandbox down (see `interrupted`).
pub fn wait_if_interrupted() {
    while interrupted() {
        std::thread::park();
    }
}

/// The sandboxes made by [`Sandbox::shared`] whose teardown may not have finished.
static LIVE: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// A sandbox in `LIVE`: held weakly, with its teardown's end, which outlives it. A sandbox
/// being dropped (its last handle gone, say as a failed phase unwinds) can no longer be
/// upgraded while its `Drop` still tears it down: the handler then waits for that teardown
/// instead of exiting in the middle of it (which once left an agent and a server running).
struct Registered {
    sandbox: Weak<Sandbox>,
    torn_down: Arc<std::sync::atomic::AtomicBool>,
}

impl Registered {
    fn finished(&self) -> bool {
        self.sandbox.strong_count() == 0 && self.torn_down.load(Ordering::SeqCst)
    }
}

/// Tears down every live sandbox made by [`Sandbox::shared`] and exits when the process gets
/// SIGINT (Ctrl-C), SIGTERM or SIGHUP (the terminal closed). Call it once, before the first
/// sandbox; later calls do nothing. One handler for the whole process: a run that makes its
/// sandboxes phase by phase (the bench) needs no handler per sandbox, which would race to exit.
/// The handler holds the sandboxes weakly: one that ends on its own (done, failed or panicked)
/// is torn down when its last handle drops.
pub fn teardown_on_signal() -> anyhow::Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let handled = [
                signal_hook::consts::SIGINT,
                signal_hook::consts::SIGTERM,
                signal_hook::consts::SIGHUP,
            ];
            let flag = SIGNALLED.get_or_init(Arc::default);
            for signal in handled {
                signal_hook::flag::register(signal, flag.clone())
                    .map_err(|e| format!("installing the signal handler: {e}"))?;
            }
            let mut signals = signal_hook::iterator::Signals::new(handled)
                .map_err(|e| format!("installing the signal handler: {e}"))?;
            std::thread::spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    let (live, torn_down): (Vec<Arc<Sandbox>>, Vec<_>) = {
                        // Under the registry's lock: a sandbox registered after this sees
                        // `interrupted` and is never built.
                        let live = lock(&LIVE);
                        INTERRUPTED.store(true, Ordering::SeqCst);
                        let upgraded = live.iter().filter_map(|r| r.sandbox.upgrade()).collect();
                        (upgraded, live.iter().map(|r| r.torn_down.clone()).collect())
                    };
                    // Stdout may be a closed terminal now: say it on stderr, ignore failures.
                    let _ = writeln!(std::io::stderr(), "\ninterrupted: cleaning up the sandbox");
                    for sandbox in &live {
                        sandbox.teardown();
                    }
                    // A sandbox whose last handle went before this looked is being torn down
                    // by its `Drop` in another thread: let that finish too (bounded).
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    while torn_down.iter().any(|done| !done.load(Ordering::SeqCst))
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    // The main thread runs on while this one tears down: a process it started
                    // outside a registry (an `ip` command) may still run. Each is this
                    // process's child until it exits; said, so a missed one is seen.
                    let ended = crate::system::end_own_children();
                    if !ended.is_empty() {
                        let _ = writeln!(
                            std::io::stderr(),
                            "interrupted: ended {} more processes: {ended:?}",
                            ended.len()
                        );
                    }
                    std::process::exit(128 + signal);
                }
            });
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A memory cgroup (see `Sandbox::memory_cgroup`).
#[derive(Clone, Debug)]
pub struct MemoryCgroup {
    pub path: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// Bytes charged now (kernel memory included).
    pub fn usage(&self) -> anyhow::Result<u64> {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        Ok(std::fs::read_to_string(self.path.join(file))?
            .trim()
            .parse()?)
    }

    /// The most it was ever charged.
    pub fn peak(&self) -> anyhow::Result<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        Ok(std::fs::read_to_string(self.path.join(file))?
            .trim()
            .parse()?)
    }

    /// Sets the limit (`memory.max`, or v1's `memory.limit_in_bytes`).
    pub fn limit(&self, bytes: u64) -> anyhow::Result<()> {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(self.path.join(file), bytes.to_string())
            .with_context(|| format!("{}/{file}", self.path.display()))
    }

    /// How many times the kernel OOM-killed a process of this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        std::fs::read_to_string(self.path.join(file))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

/// A client pod of its own: a network namespace and a cgroup.
#[derive(Clone, Debug)]
pub struct ClientPod {
    pub netns: String,
    pub cgroup: PathBuf,
}

/// A running `sbx client`; commands go in on stdin, replies come back on stdout.
pub struct Client {
    process: Owned,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn spawn(processes: &Registry, cgroup: Option<&Path>, netns: &str) -> anyhow::Result<Self> {
        let mut cmd = Process::new(bins::sbx()?);
        if let Some(cg) = cgroup {
            cmd.arg("--cgroup").arg(cg);
        }
        cmd.args(["--netns", netns, "client"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut process = processes.spawn(&mut cmd).context("starting a client")?;
        let stdin = process.child().stdin.take().context("client stdin")?;
        let mut stdout = BufReader::new(process.child().stdout.take().context("client stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if !line.contains("ready") {
            bail!("client did not start: {line:?}");
        }
        Ok(Self {
            process,
            stdin,
            stdout,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    pub fn run(&mut self, cmd: &Command) -> anyhow::Result<Reply> {
        self.send(cmd)?;
        self.receive()
    }

    /// Sends a command without waiting: several clients can then work at once, and
    /// [`Client::receive`] collects each one's reply.
    pub fn send(&mut self, cmd: &Command) -> anyhow::Result<()> {
        writeln!(self.stdin, "{}", serde_json::to_string(cmd)?)?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The reply to the command sent last.
    pub fn receive(&mut self) -> anyhow::Result<Reply> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("client reply {line:?}"))
    }

    /// `count` short TCP connections to `target`.
    pub fn connect(&mut self, target: SocketAddr, count: usize) -> anyhow::Result<Reply> {
        self.run(&Command::Connect {
            target,
            count,
            udp: false,
        })
    }
}
