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

/// Debian packages the tests and benchmarks use, by the command each provides.
const PACKAGES: [(&str, &str); 4] = [
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("bpftool", "bpftool"),
];

/// Where promtool goes when setup extracts it from Debian's `prometheus` package.
const PROMTOOL: &str = "/usr/local/bin/promtool";

pub(crate) fn run(build_only: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    rust_src()?;
    let linker = bpf_linker()?;
    if !build_only {
        debian_packages()?;
        python_packages()?;
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

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(c, _)| !have(c))
        .map(|(_, p)| *p)
        .collect();
    if !missing.is_empty() {
        require_root(&format!(
            "missing Debian packages {missing:?} (`apt-get install --no-install-recommends {}`)",
            missing.join(" ")
        ))?;
        eprintln!("setup: installing Debian packages {}", missing.join(" "));
        apt_install(&missing)?;
    }
    promtool()
}

/// Installs `packages` without their recommendations, and only if that upgrades and removes
/// nothing already installed. `--no-upgrade` only covers the packages named; a dependency
/// that needs a newer version of an installed library would still be upgraded, so the
/// transaction is simulated first and refused if it would touch an installed package.
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
        let touched = touches_installed(&String::from_utf8_lossy(&simulation.stdout));
        if !touched.is_empty() {
            bail!(
                "installing {} would also upgrade or remove installed packages ({}); setup \
                 changes nothing already installed: install them yourself if that is fine",
                packages.join(" "),
                touched.join(", ")
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
    bail!("apt-get install {} failed", packages.join(" "))
}

/// The installed packages an `apt-get --simulate` transcript upgrades (`Inst NAME [OLD] (NEW
/// ...)`; a new package has no `[OLD]`) or removes (`Remv NAME ...`).
fn touches_installed(simulation: &str) -> Vec<String> {
    simulation
        .lines()
        .filter_map(|line| {
            if let Some(rest) = line.strip_prefix("Inst ") {
                let mut words = rest.split_whitespace();
                let name = words.next()?;
                words
                    .next()
                    .is_some_and(|w| w.starts_with('['))
                    .then(|| format!("{name} (upgrade)"))
            } else {
                let name = line.strip_prefix("Remv ")?.split_whitespace().next()?;
                Some(format!("{name} (removal)"))
            }
        })
        .collect()
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
    use super::touches_installed;

    #[test]
    fn simulation_upgrades_and_removals_are_found_new_packages_are_not() {
        // Shapes from `apt-get install --simulate --no-upgrade apt-utils` on Debian 12.
        let simulation = "\
NOTE: This is only a simulation!
Inst libapt-pkg6.0 [2.6.1] (2.6.2 Debian-Security:12/oldstable-security [amd64])
Conf libapt-pkg6.0 (2.6.2 Debian-Security:12/oldstable-security [amd64])
Inst apt-utils (2.6.2 Debian-Security:12/oldstable-security [amd64])
Remv iptables-legacy [1.8.9-2]
Conf apt-utils (2.6.2 Debian-Security:12/oldstable-security [amd64])
";
        assert_eq!(
            touches_installed(simulation),
            ["libapt-pkg6.0 (upgrade)", "iptables-legacy (removal)"]
        );
        assert!(
            touches_installed("Inst nftables (1.0.6-2+deb12u2 Debian:12.11/stable [amd64])")
                .is_empty()
        );
    }
}
