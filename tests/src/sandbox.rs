//! A throwaway world for one test or demo run: a client network namespace inside a child cgroup
//! of its own, a backend namespace joined to it by a veth pair, a private bpf filesystem for
//! socklb's pins, and the processes started in them. Everything is removed when the `Sandbox`
//! is dropped, on success, failure or panic; what a killed run left behind is swept by the next
//! one (names carry the owning PID).
//!
//! Addresses: the client is 10.244.0.2/16 and `fd00:244::2/64`; backends get addresses in the same
//! subnets. Service addresses (10.96.0.0/12, `fd00:96::/64`) have no route in the client
//! namespace, so a connect that socklb does not translate fails with ENETUNREACH and never
//! leaves the sandbox.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command as Process, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    agent::{AgentOptions, AgentProcess},
    bins,
    client::{Command, Reply},
    system::{cgroup2_mount, ip, kill_and_wait},
};

pub const CLIENT_V4: &str = "10.244.0.2";
pub const CLIENT_V6: &str = "fd00:244::2";

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub struct Sandbox {
    pub id: String,
    pub client_ns: String,
    pub backend_ns: String,
    pub cgroup: PathBuf,
    pub pin_mount: PathBuf,
    pub workdir: PathBuf,
    backend_ips: Mutex<Vec<IpAddr>>,
    servers: Mutex<Vec<(SocketAddr, bool, Child)>>,
    made: Made,
}

/// What has been created so far, so a half-built sandbox is torn down too.
#[derive(Default)]
struct Made {
    netns: Mutex<Vec<String>>,
    cgroup: Mutex<Option<PathBuf>>,
    mount: Mutex<Option<PathBuf>>,
    workdir: Mutex<Option<PathBuf>>,
}

impl Sandbox {
    /// Builds the namespaces, the veth pair, the cgroup and the bpf filesystem.
    pub fn new() -> anyhow::Result<Self> {
        crate::system::sweep_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 256;
        let id = format!("slb{:x}x{n:02x}", std::process::id());
        let cg2 = cgroup2_mount().context("no cgroup2 mount")?;
        let sandbox = Self {
            client_ns: format!("{id}c"),
            backend_ns: format!("{id}b"),
            cgroup: cg2.join(&id),
            pin_mount: std::env::temp_dir().join(format!("{id}-bpffs")),
            workdir: std::env::temp_dir().join(format!("{id}-work")),
            id,
            backend_ips: Mutex::new(Vec::new()),
            servers: Mutex::new(Vec::new()),
            made: Made::default(),
        };
        sandbox.build()?;
        Ok(sandbox)
    }

    fn build(&self) -> anyhow::Result<()> {
        for ns in [&self.client_ns, &self.backend_ns] {
            ip(&["netns", "add", ns])?;
            lock(&self.made.netns).push(ns.clone());
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let (cv, bv) = (format!("{}c", self.id), format!("{}b", self.id));
        ip(&[
            "-n",
            &self.client_ns,
            "link",
            "add",
            &cv,
            "type",
            "veth",
            "peer",
            "name",
            &bv,
            "netns",
            &self.backend_ns,
        ])?;
        ip(&[
            "-n",
            &self.client_ns,
            "addr",
            "add",
            &format!("{CLIENT_V4}/16"),
            "dev",
            &cv,
        ])?;
        ip(&[
            "-n",
            &self.client_ns,
            "addr",
            "add",
            &format!("{CLIENT_V6}/64"),
            "dev",
            &cv,
            "nodad",
        ])?;
        ip(&["-n", &self.client_ns, "link", "set", &cv, "up"])?;
        ip(&["-n", &self.backend_ns, "link", "set", &bv, "up"])?;

        std::fs::create_dir(&self.cgroup)
            .with_context(|| format!("creating {}", self.cgroup.display()))?;
        *lock(&self.made.cgroup) = Some(self.cgroup.clone());

        std::fs::create_dir_all(&self.pin_mount)?;
        crate::system::mount_bpffs(&self.pin_mount)?;
        *lock(&self.made.mount) = Some(self.pin_mount.clone());

        std::fs::create_dir_all(self.manifests())?;
        *lock(&self.made.workdir) = Some(self.workdir.clone());
        Ok(())
    }

    /// Where socklb pins its maps and links in this sandbox.
    pub fn pin_folder(&self) -> PathBuf {
        self.pin_mount.join("socklb")
    }

    /// The manifests folder an agent started by `start_agent` watches.
    pub fn manifests(&self) -> PathBuf {
        self.workdir.join("manifests")
    }

    /// Writes (or replaces) one manifest file.
    pub fn write_manifest(&self, name: &str, yaml: &str) -> anyhow::Result<()> {
        let path = self.manifests().join(name);
        let tmp = self.workdir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn remove_manifest(&self, name: &str) -> anyhow::Result<()> {
        std::fs::remove_file(self.manifests().join(name))?;
        Ok(())
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

    /// Starts a backend "pod" answering on `addr` (TCP, or UDP with `udp`).
    pub fn add_backend(&self, addr: SocketAddr, udp: bool) -> anyhow::Result<()> {
        self.add_backend_ip(addr.ip())?;
        let mut child = Process::new(bins::sbx()?)
            .args([
                "--netns",
                &self.backend_ns,
                "serve",
                "--addr",
                &addr.to_string(),
            ])
            .args(udp.then_some("--udp"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a backend")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("backend stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            kill_and_wait(&mut child);
            bail!("backend {addr} did not start");
        }
        lock(&self.servers).push((addr, udp, child));
        Ok(())
    }

    fn add_backend_ip(&self, addr: IpAddr) -> anyhow::Result<()> {
        let mut ips = lock(&self.backend_ips);
        if ips.contains(&addr) {
            return Ok(());
        }
        let dev = format!("{}b", self.id);
        let cidr = if addr.is_ipv4() {
            format!("{addr}/16")
        } else {
            format!("{addr}/64")
        };
        let mut args = vec!["-n", &self.backend_ns, "addr", "add", &cidr, "dev", &dev];
        if addr.is_ipv6() {
            args.push("nodad");
        }
        ip(&args)?;
        ips.push(addr);
        Ok(())
    }

    /// Stops the backend process serving `addr` (its address stays, so connects are refused).
    pub fn stop_backend(&self, addr: SocketAddr, udp: bool) {
        let mut servers = lock(&self.servers);
        if let Some(i) = servers.iter().position(|(a, u, _)| *a == addr && *u == udp) {
            let (_, _, mut child) = servers.remove(i);
            kill_and_wait(&mut child);
        }
    }

    /// A client process in the sandbox's cgroup and client namespace: what socklb serves.
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::spawn(Some(&self.cgroup), &self.client_ns)
    }

    /// A client in the client namespace but outside the cgroup: socklb must leave it alone.
    pub fn outside_client(&self) -> anyhow::Result<Client> {
        Client::spawn(None, &self.client_ns)
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

    /// Runs `socklb explain TARGET -o json` against this sandbox's manifests and pins;
    /// returns the parsed explanation and whether the command reported no broken link.
    pub fn explain(&self, target: &str) -> anyhow::Result<(serde_json::Value, bool)> {
        let out = Process::new(bins::socklb()?)
            .args(["explain", target, "-o", "json", "--manifests"])
            .arg(self.manifests())
            .arg("--bpffs")
            .arg(self.pin_folder())
            .output()?;
        let value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("explain output: {}", String::from_utf8_lossy(&out.stderr)))?;
        Ok((value, out.status.success()))
    }

    /// The backends a connect to `target` (`ADDR:PORT[/udp]`) can get now, per the maps.
    pub fn candidates(&self, target: &str) -> anyhow::Result<Vec<String>> {
        let v = self.inspect(&["lookup", target])?;
        Ok(v["candidates"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits until the maps give `target` exactly `expected` (in any order).
    pub fn wait_candidates(&self, target: &str, expected: &[&str]) -> anyhow::Result<()> {
        let mut want: Vec<String> = expected.iter().map(|s| (*s).to_string()).collect();
        want.sort();
        let start = Instant::now();
        loop {
            let mut got = self.candidates(target)?;
            got.sort();
            if got == want {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!("{target}: maps hold {got:?}, expected {want:?}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Starts `socklb agent` on this sandbox's cgroup, pins and manifests folder, and waits
    /// until it reports ready.
    pub fn start_agent(&self, options: &AgentOptions) -> anyhow::Result<AgentProcess> {
        AgentProcess::start(self, options)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for (_, _, mut child) in lock(&self.servers).drain(..) {
            kill_and_wait(&mut child);
        }
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
        if let Some(cgroup) = lock(&self.made.cgroup).take() {
            crate::system::remove_cgroup(&cgroup);
        }
        for ns in lock(&self.made.netns).drain(..) {
            let _ = ip(&["netns", "del", &ns]);
        }
        if let Some(dir) = lock(&self.made.workdir).take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running `sbx client`; commands go in on stdin, replies come back on stdout.
pub struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn spawn(cgroup: Option<&Path>, netns: &str) -> anyhow::Result<Self> {
        let mut cmd = Process::new(bins::sbx()?);
        if let Some(cg) = cgroup {
            cmd.arg("--cgroup").arg(cg);
        }
        let mut child = cmd
            .args(["--netns", netns, "client"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a client")?;
        let stdin = child.stdin.take().context("client stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("client stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if !line.contains("ready") {
            kill_and_wait(&mut child);
            bail!("client did not start: {line:?}");
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    pub fn run(&mut self, cmd: &Command) -> anyhow::Result<Reply> {
        writeln!(self.stdin, "{}", serde_json::to_string(cmd)?)?;
        self.stdin.flush()?;
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

    /// Repeats `f` until it returns true or `timeout` passes; returns whether it did.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        mut f: impl FnMut(&mut Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<bool> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if f(self)? {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        kill_and_wait(&mut self.child);
    }
}
