//! `cargo xtask setup`: everything the build and the tests need on a fresh machine. Idempotent:
//! each step checks first and does nothing when its tool is already there.
use std::{
    fmt::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::{cmd, workspace_root};

/// bpf-linker's version, built against the toolchain's own libLLVM.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// A Debian package a command runs, by the program it provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Package {
    pub command: &'static str,
    pub package: &'static str,
}

/// `ip`: the sandboxes' network namespaces and veth pairs (the demo, the tests, the bench).
pub(crate) const IPROUTE2: Package = Package {
    command: "ip",
    package: "iproute2",
};
/// kube-proxy's iptables layout, beside which the bench measures (also its quick run in the tests).
pub(crate) const IPTABLES: Package = Package {
    command: "iptables",
    package: "iptables",
};
/// kube-proxy's nftables layout, likewise.
pub(crate) const NFTABLES: Package = Package {
    command: "nft",
    package: "nftables",
};
/// A load balancer's probe of the health-check ports (tests/tests/node.rs).
pub(crate) const CURL: Package = Package {
    command: "curl",
    package: "curl",
};
/// The manual pages' reader (tests/tests/manual.rs renders each page with it).
pub(crate) const MAN: Package = Package {
    command: "man",
    package: "man-db",
};

/// What one command needs installed: setup asks for that and nothing else.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Needs {
    /// Debian packages, by the program each provides.
    pub packages: &'static [Package],
    /// promtool (the metrics and alert-rule checks).
    pub promtool: bool,
    /// The PyPI package kubernetes-validate (deploy/ checked offline).
    pub kubernetes_validate: bool,
    /// cargo-fuzz (the fuzz target).
    pub cargo_fuzz: bool,
}

impl Needs {
    /// Building only (rust-src and bpf-linker, which every command needs).
    pub(crate) const BUILD: Self = Self {
        packages: &[],
        promtool: false,
        kubernetes_validate: false,
        cargo_fuzz: false,
    };
    /// `cargo xtask demo`: the sandbox's namespaces.
    pub(crate) const DEMO: Self = Self {
        packages: &[IPROUTE2],
        ..Self::BUILD
    };
    /// `cargo xtask test`: every step it runs, the quick bench among them.
    pub(crate) const TEST: Self = Self {
        packages: &[IPROUTE2, IPTABLES, NFTABLES, CURL, MAN],
        promtool: true,
        kubernetes_validate: true,
        cargo_fuzz: true,
    };
    /// `cargo xtask bench`: the sandbox and kube-proxy's two layouts.
    pub(crate) const BENCH: Self = Self {
        packages: &[IPROUTE2, IPTABLES, NFTABLES],
        ..Self::BUILD
    };
    /// `cargo xtask stress`: the sandbox and five minutes of fuzzing.
    pub(crate) const STRESS: Self = Self {
        packages: &[IPROUTE2],
        cargo_fuzz: true,
        ..Self::BUILD
    };
}

/// Where promtool goes when setup extracts it from Debian's `prometheus` package.
const PROMTOOL: &str = "/usr/local/bin/promtool";

pub(crate) fn run(needs: Needs) -> anyhow::Result<()> {
    let start = Instant::now();
    rust_src()?;
    let linker = bpf_linker()?;
    debian_packages(needs.packages)?;
    if needs.promtool {
        promtool()?;
    }
    if needs.kubernetes_validate {
        python_packages()?;
    }
    if needs.cargo_fuzz {
        cargo_fuzz()?;
    }
    eprintln!(
        "setup: ready in {:.1}s (bpf-linker: {})",
        start.elapsed().as_secs_f64(),
        linker.display()
    );
    Ok(())
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rust_src() -> anyhow::Result<()> {
    let sysroot = output("rustc", &["--print", "sysroot"])?;
    let src = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core");
    if src.exists() {
        return Ok(());
    }
    eprintln!("setup: adding rust-src to the active toolchain");
    cmd("rustup", &["component", "add", "rust-src"]).context(
        "could not add rust-src (needed to build core for the bpf target); run `rustup component add rust-src`",
    )
}

/// `<tools>/bpf-linker-<first 16 hex of sha256(rustc -vV)>`: a toolchain change gets a fresh
/// build. lb-userspace's build.rs looks in the same place.
pub(crate) fn bpf_linker_dir() -> anyhow::Result<PathBuf> {
    let version = Command::new("rustc").arg("-vV").output()?.stdout;
    let digest = Sha256::digest(&version);
    let key = digest.iter().take(8).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    Ok(tools_root().join(format!("bpf-linker-{key}")))
}

/// Where setup installs the tools it builds (bpf-linker, cargo-fuzz): `$SOCKLB_TOOLS`, else
/// `$CARGO_HOME/socklb-tools` (`~/.cargo/socklb-tools`), beside cargo's own installs, so every
/// clone on a machine shares one build of each (lb-userspace's build.rs follows the same rule).
pub(crate) fn tools_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("SOCKLB_TOOLS") {
        return PathBuf::from(dir);
    }
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("socklb-tools")
}

fn bpf_linker() -> anyhow::Result<PathBuf> {
    let dir = bpf_linker_dir()?;
    let bin = dir.join("bin/bpf-linker");
    if bin.exists()
        && Command::new(&bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Ok(bin);
    }
    let sysroot_lib = PathBuf::from(output("rustc", &["--print", "sysroot"])?.trim()).join("lib");
    let libllvm = std::fs::read_dir(&sysroot_lib)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .with_context(|| {
            format!(
                "no libLLVM.so.*-rust-* in {}: is this a rustup toolchain?",
                sysroot_lib.display()
            )
        })?;
    let llvm_major = output("rustc", &["-vV"])?
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next().map(str::to_string))
        .context("rustc -vV shows no LLVM version")?;
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute, once per toolchain)",
        libllvm.display()
    );
    let rustflags = format!(
        "-C link-arg=-Wl,-rpath,{} -C link-arg={}",
        sysroot_lib.display(),
        libllvm.display()
    );
    let status = Command::new("cargo")
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--no-default-features",
        ])
        .args(["--features", &format!("llvm-{llvm_major},no-llvm-linking")])
        .arg("--root")
        .arg(&dir)
        .env("RUSTFLAGS", rustflags)
        .env_remove("RUSTC_BOOTSTRAP")
        .status()?;
    if !status.success() {
        bail!(
            "building bpf-linker failed; it needs crates.io access and the toolchain's libLLVM ({})",
            libllvm.display()
        );
    }
    Ok(bin)
}

fn have(command: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(command).is_file()))
        || Path::new("/usr/sbin").join(command).is_file()
        || Path::new("/sbin").join(command).is_file()
}

fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what}; run `cargo xtask setup` as root");
    }
    Ok(())
}

fn debian_packages(packages: &[Package]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|p| !have(p.command))
        .map(|p| p.package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    require_root(&format!(
        "missing Debian packages {missing:?} (`{}`)",
        install_command(&missing)
    ))?;
    eprintln!("setup: installing Debian packages {}", missing.join(" "));
    apt_install(&missing)
}

/// The command a person would type to install `packages` as setup does.
fn install_command(packages: &[&str]) -> String {
    format!(
        "apt-get install --no-install-recommends {}",
        packages.join(" ")
    )
}

/// Installs `packages` without their recommendations. The transaction is simulated first: it
/// goes ahead when it only installs packages and upgrades installed ones (a security or point
/// release of a library or of a package built from the same source, which `apt-get install`
/// typed by hand would do too), after saying which; it is refused when it would remove or
/// downgrade an installed package, naming the command that would do it anyway.
fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let mut args = vec![
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "--no-upgrade",
    ];
    args.extend(packages);
    // Missing or stale package lists (a 404 for a superseded version): update once, retry.
    for update in [false, true] {
        if update {
            cmd_env(
                "apt-get",
                &["update", "-q"],
                &[("DEBIAN_FRONTEND", "noninteractive")],
            )?;
        }
        let simulation = Command::new("apt-get")
            .args(&args)
            .arg("--simulate")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()?;
        if !simulation.status.success() {
            continue;
        }
        let changes = Changes::of(&String::from_utf8_lossy(&simulation.stdout), |a, b| {
            version_newer(a, b)
        });
        if !changes.refused.is_empty() {
            bail!(
                "installing {} would also {}; setup removes and downgrades nothing. If that is \
                 fine, run `{}` and run this command again",
                packages.join(" "),
                changes.refused.join(", "),
                install_command(packages)
            );
        }
        if !changes.upgraded.is_empty() {
            eprintln!(
                "setup: this also upgrades installed packages (as `{}` would): {}",
                install_command(packages),
                changes.upgraded.join(", ")
            );
        }
        let installed = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
        if installed {
            return Ok(());
        }
    }
    bail!(
        "`{}` failed (see apt's output above)",
        install_command(packages)
    )
}

/// Whether Debian version `a` is newer than `b` (`dpkg --compare-versions a gt b`).
fn version_newer(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}

/// What an `apt-get --simulate` transcript does to installed packages.
#[derive(Debug, Default, PartialEq, Eq)]
struct Changes {
    /// `name old → new`, for installed packages moved to a newer version.
    upgraded: Vec<String>,
    /// What a person would not accept from an install: removals and downgrades.
    refused: Vec<String>,
}

impl Changes {
    /// Reads `Inst NAME [OLD] (NEW ...)` (no `[OLD]`: a new package) and `Remv NAME ...`;
    /// `newer(a, b)` compares two versions.
    fn of(simulation: &str, newer: impl Fn(&str, &str) -> bool) -> Self {
        let mut changes = Self::default();
        for line in simulation.lines() {
            if let Some(rest) = line.strip_prefix("Inst ") {
                let mut words = rest.split_whitespace();
                let (Some(name), Some(old)) = (words.next(), words.next()) else {
                    continue;
                };
                let Some(old) = old.strip_prefix('[').and_then(|o| o.strip_suffix(']')) else {
                    continue;
                };
                let new = words.next().unwrap_or("").trim_start_matches('(');
                if newer(new, old) {
                    changes.upgraded.push(format!("{name} {old} → {new}"));
                } else {
                    changes
                        .refused
                        .push(format!("downgrade {name} {old} → {new}"));
                }
            } else if let Some(rest) = line.strip_prefix("Remv ") {
                let name = rest.split_whitespace().next().unwrap_or(rest);
                changes.refused.push(format!("remove {name}"));
            }
        }
        changes
    }
}

/// promtool, Prometheus' own linter, for the tests' `promtool check metrics`. Debian ships it
/// only inside the `prometheus` package, which would also bring the Prometheus server, a
/// system user, an init script that starts the server where no policy-rc.d forbids it, and a
/// dozen JavaScript packages for its web UI. Setup downloads that package (verified by apt
/// against the signed lists) and extracts promtool alone to /usr/local/bin.
fn promtool() -> anyhow::Result<()> {
    if have("promtool") {
        return Ok(());
    }
    require_root("promtool is missing")?;
    eprintln!("setup: extracting promtool from Debian's prometheus package to {PROMTOOL}");
    let dir = workspace_root().join("target/tmp/prometheus-deb");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let download = |update: bool| -> anyhow::Result<bool> {
        if update {
            cmd_env(
                "apt-get",
                &["update", "-q"],
                &[("DEBIAN_FRONTEND", "noninteractive")],
            )?;
        }
        // apt's sandbox user (_apt) cannot write into target/: download as root, as apt
        // would anyway, after a warning.
        Ok(Command::new("apt-get")
            .args([
                "download",
                "-q",
                "-o",
                "APT::Sandbox::User=root",
                "prometheus",
            ])
            .current_dir(&dir)
            .status()?
            .success())
    };
    if !download(false)? && !download(true)? {
        bail!("apt-get download prometheus failed (needed for promtool)");
    }
    let deb = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download prometheus left no .deb")?;
    let mut contents = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let stdout = contents.stdout.take().context("dpkg-deb has no stdout")?;
    let extracted = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(&dir)
        .arg("./usr/bin/promtool")
        .stdin(stdout)
        .status()?;
    if !contents.wait()?.success() || !extracted.success() {
        bail!("could not extract usr/bin/promtool from {}", deb.display());
    }
    let staged = PathBuf::from(format!("{PROMTOOL}.tmp"));
    std::fs::copy(dir.join("usr/bin/promtool"), &staged)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&staged, PROMTOOL)?;
    std::fs::remove_dir_all(&dir)?;
    let version = output(PROMTOOL, &["--version"])?;
    eprintln!(
        "setup: {}",
        version.lines().next().unwrap_or("promtool installed")
    );
    Ok(())
}

/// kubernetes-validate checks the deploy/ manifests offline against the API schemas.
fn python_packages() -> anyhow::Result<()> {
    let ok = Command::new("python3")
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Ok(());
    }
    eprintln!("setup: installing the PyPI package kubernetes-validate");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "kubernetes-validate",
        ])
        .status()?;
    if !status.success() {
        bail!("pip install kubernetes-validate failed (needed to validate deploy/ offline)");
    }
    Ok(())
}

fn cmd_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()?;
    if !status.success() {
        bail!("{program} {} failed", args.join(" "));
    }
    Ok(())
}

/// Where `cargo fuzz` is installed (`<tools>/cargo-fuzz-<version>/bin/cargo-fuzz`).
pub(crate) fn cargo_fuzz_bin() -> PathBuf {
    tools_root().join(format!("cargo-fuzz-{CARGO_FUZZ_VERSION}/bin/cargo-fuzz"))
}

const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// cargo-fuzz runs the fuzz target over manifest parsing and translation.
fn cargo_fuzz() -> anyhow::Result<()> {
    if cargo_fuzz_bin().exists() {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz (about half a minute, once)");
    let status = Command::new("cargo")
        .args([
            "install",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
            "--locked",
            "--root",
        ])
        .arg(tools_root().join(format!("cargo-fuzz-{CARGO_FUZZ_VERSION}")))
        .env_remove("RUSTC_BOOTSTRAP")
        .status()?;
    if !status.success() {
        bail!("installing cargo-fuzz failed (it needs crates.io)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Changes;

    /// Shapes from `apt-get install --simulate --no-upgrade` on Debian 12.
    const SIMULATION: &str = "\
NOTE: This is only a simulation!
Inst bpftool (7.1.0+6.1.192-3 Debian-Security:12/oldstable-security [amd64])
Inst linux-libc-dev [6.1.187-1] (6.1.192-3 Debian-Security:12/oldstable-security [amd64])
Conf linux-libc-dev (6.1.192-3 Debian-Security:12/oldstable-security [amd64])
Inst iptables (1.8.9-2 Debian:12.15/oldstable [amd64])
";

    /// Enough of dpkg's ordering for the cases here (the real one runs `dpkg`).
    fn newer(a: &str, b: &str) -> bool {
        let parts = |v: &str| -> Vec<u32> {
            v.split(|c: char| !c.is_ascii_digit())
                .filter_map(|p| p.parse().ok())
                .collect()
        };
        parts(a) > parts(b)
    }

    #[test]
    fn new_packages_and_upgrades_go_ahead_and_are_said() {
        let changes = Changes::of(SIMULATION, newer);
        assert_eq!(changes.upgraded, ["linux-libc-dev 6.1.187-1 → 6.1.192-3"]);
        assert!(changes.refused.is_empty());
    }

    #[test]
    fn removals_and_downgrades_are_refused() {
        let simulation = "\
Inst libapt-pkg6.0 [2.6.2] (2.6.1 Debian:12/oldstable [amd64])
Remv iptables-legacy [1.8.9-2]
Inst apt-utils (2.6.2 Debian-Security:12/oldstable-security [amd64])
";
        let changes = Changes::of(simulation, newer);
        assert_eq!(
            changes.refused,
            [
                "downgrade libapt-pkg6.0 2.6.2 → 2.6.1",
                "remove iptables-legacy"
            ]
        );
        assert!(changes.upgraded.is_empty());
    }

    #[test]
    fn only_installs_change_nothing() {
        let changes = Changes::of(
            "Inst nftables (1.0.6-2+deb12u2 Debian:12.11/stable [amd64])",
            newer,
        );
        assert_eq!(changes, Changes::default());
    }
}
