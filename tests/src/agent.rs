//! The real `socklb agent` binary, run against a sandbox.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    bins,
    processes::{Owned, Registry},
    sandbox::Sandbox,
};

#[derive(Clone, Debug, Default)]
pub struct AgentOptions {
    /// Extra arguments (e.g. `--node-name`, map sizes).
    pub args: Vec<String>,
    /// Use this kubeconfig instead of the sandbox's manifests folder.
    pub kubeconfig: Option<PathBuf>,
    /// Don't wait for /readyz.
    pub no_wait: bool,
    /// How long to wait for /readyz (default 60 s: an agent starting while other test binaries
    /// load the machine takes a while to load its programs).
    pub ready_timeout: Option<Duration>,
    /// `--health-listen` (default: a free loopback port).
    pub health_listen: Option<SocketAddr>,
    /// `--metrics-listen` (default: a free loopback port).
    pub metrics_listen: Option<SocketAddr>,
    /// Run the agent in this network namespace (by name, under /run/netns) instead of the
    /// host's: its connects stay inside, and its listeners are out of the test's reach.
    pub netns: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// A memory cgroup (v1 or v2) the agent joins before it creates anything, so its maps and
    /// the socket records they hold are charged there.
    pub memory_cgroup: Option<PathBuf>,
    /// `--cgroup` (default: the sandbox's).
    pub cgroup: Option<PathBuf>,
    /// `--bpffs` (default: the sandbox's pin folder).
    pub pin_folder: Option<PathBuf>,
}

impl AgentOptions {
    /// The default options with these extra agent arguments.
    pub fn with_args<I>(args: I) -> Self
    where
        I: IntoIterator,
        I::Item: ToString,
    {
        Self {
            args: args.into_iter().map(|a| a.to_string()).collect(),
            ..Self::default()
        }
    }
}

pub struct AgentProcess {
    child: Option<Owned>,
    processes: Registry,
    /// /healthz, /livez, /readyz.
    pub health: SocketAddr,
    /// /metrics, /status (what `explain --agent` asks).
    pub listen: SocketAddr,
    pub log: PathBuf,
    command: Vec<String>,
    netns: Option<String>,
    env: Vec<(String, String)>,
    memory_cgroup: Option<PathBuf>,
}

/// A loopback port for an agent's listener, free when this returns. It is taken below the
/// kernel's ephemeral range: a port from that range (what binding port 0 gives) can be taken by
/// any concurrent test's outgoing connection before the agent binds it.
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static TRIES: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|h| *h > LOW + 1_000)
        .unwrap_or(32_768);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..1_000 {
        // Spread over the range by process, time and attempt, so test binaries running at once
        // rarely try the same ports.
        let n = TRIES.fetch_add(1, Ordering::Relaxed);
        let mix = std::process::id()
            .wrapping_mul(0x9e37_79b1)
            .wrapping_add(n.wrapping_mul(0x85eb_ca6b))
            ^ nanos;
        let port = u16::try_from(LOW + mix % (high - LOW)).unwrap_or(0);
        if port != 0 && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl AgentProcess {
    pub fn start(sandbox: &Sandbox, options: &AgentOptions) -> anyhow::Result<Self> {
        // A listener port chosen here may still be taken by another process before the agent
        // binds it: then the agent exits saying so, and starts again on other ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(sandbox, options) {
                Err(e)
                    if attempt < 5
                        && (options.metrics_listen.is_none()
                            || options.health_listen.is_none())
                        && format!("{e:#}").contains("Address already in use") =>
                {
                    eprintln!("the agent's listener port was taken; starting it again: {e:#}");
                }
                other => return other,
            }
        }
    }

    fn start_once(sandbox: &Sandbox, options: &AgentOptions) -> anyhow::Result<Self> {
        let listen: SocketAddr = match options.metrics_listen {
            Some(a) => a,
            None => format!("127.0.0.1:{}", free_port()?).parse()?,
        };
        let health: SocketAddr = match options.health_listen {
            Some(a) => a,
            None => format!("127.0.0.1:{}", free_port()?).parse()?,
        };
        let log = sandbox.workdir.join(format!("agent-{}.log", listen.port()));
        let mut command: Vec<String> = vec!["agent".into()];
        if let Some(k) = &options.kubeconfig {
            command.extend(["--kubeconfig".into(), k.display().to_string()]);
        } else {
            command.extend([
                "--manifests".into(),
                sandbox.manifests().display().to_string(),
            ]);
        }
        command.extend([
            "--cgroup".into(),
            options
                .cgroup
                .as_ref()
                .unwrap_or(&sandbox.cgroup)
                .display()
                .to_string(),
            "--bpffs".into(),
            options
                .pin_folder
                .clone()
                .unwrap_or_else(|| sandbox.pin_folder())
                .display()
                .to_string(),
            "--metrics-listen".into(),
            listen.to_string(),
            "--health-listen".into(),
            health.to_string(),
        ]);
        command.extend(options.args.iter().cloned());
        // A test's own `--disable-feature` would replace this run's `SOCKLB_DISABLE_FEATURE`
        // (a flag wins over its variable): add the run's parts to it, so a run that turns every
        // optional part off does so for these agents too.
        if let Ok(env) = std::env::var("SOCKLB_DISABLE_FEATURE")
            && !env.trim().is_empty()
        {
            let mut args = command.iter_mut();
            while let Some(arg) = args.next() {
                if arg == "--disable-feature"
                    && let Some(value) = args.next()
                {
                    *value = format!("{value},{env}");
                }
            }
        }
        let mut agent = Self {
            child: None,
            processes: sandbox.processes.clone(),
            health,
            listen,
            log,
            command,
            netns: options.netns.clone(),
            env: options.env.clone(),
            memory_cgroup: options.memory_cgroup.clone(),
        };
        agent.spawn()?;
        if !options.no_wait {
            agent.wait_ready(options.ready_timeout.unwrap_or(Duration::from_mins(1)))?;
        }
        Ok(agent)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(bins::socklb()?);
        cmd.args(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let netns = self
            .netns
            .as_ref()
            .map(|ns| {
                std::fs::File::open(format!("/run/netns/{ns}"))
                    .with_context(|| format!("opening netns {ns}"))
            })
            .transpose()?;
        let join = self
            .memory_cgroup
            .as_ref()
            .map(|dir| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
                    .with_context(|| format!("opening {}/cgroup.procs", dir.display()))
            })
            .transpose()?;
        if let Some(procs) = &join {
            let fd = procs.as_raw_fd();
            // SAFETY: only write(2) runs between fork and exec, on a descriptor `join` keeps
            // open until the spawn returns; "0" moves the writing process itself.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        if let Some(file) = &netns {
            let fd = file.as_raw_fd();
            // SAFETY: only setns(2) runs between fork and exec, on a descriptor that `netns`
            // keeps open until the spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let child = self
            .processes
            .spawn(&mut cmd)
            .context("starting socklb agent")?;
        drop(netns);
        drop(join);
        self.child = Some(child);
        Ok(())
    }

    /// Kills the agent with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        // Dropping the process kills and reaps it.
        self.child = None;
    }

    /// Starts the same agent again (after `kill9`).
    pub fn restart(&mut self, wait: bool) -> anyhow::Result<()> {
        self.kill9();
        self.spawn()?;
        if wait {
            self.wait_ready(Duration::from_mins(1))?;
        }
        Ok(())
    }

    /// Stops the agent with SIGTERM and waits for it.
    pub fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut owned = self.child.take().context("agent not running")?;
        // SAFETY: signalling our own unreaped child by PID.
        unsafe { libc::kill(i32::try_from(owned.id())?, libc::SIGTERM) };
        Ok(owned.child().wait()?)
    }

    /// Waits for the agent to exit on its own (a failed start): its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            let owned = self.child.as_mut().context("agent not running")?;
            if let Some(status) = owned.child().try_wait()? {
                return Ok(status);
            }
            if start.elapsed() > timeout {
                bail!(
                    "agent still running after {timeout:?}:\n{}",
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Owned::id)
    }

    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(owned) = self.child.as_mut()
                && let Some(status) = owned.child().try_wait()?
            {
                bail!("agent exited with {status}:\n{}", self.log_tail(40));
            }
            if self.get("/readyz").is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("agent not ready after {timeout:?}:\n{}", self.log_tail(40))
    }

    /// An HTTP GET on the agent (the health or the metrics listener, by path): (status code,
    /// body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let addr = if ["/healthz", "/livez", "/readyz"].contains(&path) {
            self.health
        } else {
            self.listen
        };
        match &self.netns {
            Some(ns) => http_get_in(ns, addr, path),
            None => http_get(addr, path),
        }
    }

    /// The agent's /status, as the library's own type.
    pub fn status(&self) -> anyhow::Result<socklb::status::Status> {
        let (code, body) = self.get("/status")?;
        anyhow::ensure!(code == 200, "GET /status: HTTP {code}: {body}");
        serde_json::from_str(&body).with_context(|| format!("/status: {body}"))
    }

    /// The value of a metric line (`name{labels} value`) from /metrics.
    pub fn metric(&self, name_and_labels: &str) -> anyhow::Result<Option<f64>> {
        let (_, body) = self.get("/metrics")?;
        Ok(body.lines().find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key == name_and_labels)
                .then(|| value.parse().ok())
                .flatten()
        }))
    }

    /// Whether /metrics reports the promise `guarantee` lost (`socklb_guarantee_lost` 1): the
    /// loss a refused part brings is named, not silent.
    pub fn guarantee_lost(&self, guarantee: &str) -> anyhow::Result<bool> {
        let value = self.metric(&format!(
            "socklb_guarantee_lost{{guarantee=\"{guarantee}\"}}"
        ))?;
        Ok(value == Some(1.0))
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- socklb agent log (last 40 lines) ---\n{}",
                self.log_tail(40)
            );
        }
        self.kill9();
    }
}

/// An HTTP GET of `path` on `addr`: (status code, body).
/// `http_get` from inside the network namespace `netns` (on a thread of its own, which
/// enters it).
pub fn http_get_in(netns: &str, addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let file = std::fs::File::open(format!("/run/netns/{netns}"))
        .with_context(|| format!("opening netns {netns}"))?;
    let path = path.to_string();
    std::thread::spawn(move || {
        // SAFETY: setns(2) on a descriptor `file` holds; it moves only this thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        http_get(addr, &path)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the request thread panicked"))?
}

pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: socklb\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}
