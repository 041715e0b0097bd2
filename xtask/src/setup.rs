//! `cargo xtask setup`: everything the build and the tests need on a fresh machine. Idempotent:
//! each step checks first and does nothing when its tool is already there.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
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
    ("bpftool", "bpftool"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
];

pub fn run(build_only: bool) -> anyhow::Result<()> {
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

/// `target/tools/bpf-linker-<first 16 hex of sha256(rustc -vV)>`: a toolchain change gets a
/// fresh build. lb-userspace's build.rs looks in the same place.
pub fn bpf_linker_dir() -> anyhow::Result<PathBuf> {
    let version = Command::new("rustc").arg("-vV").output()?.stdout;
    let digest = Sha256::digest(&version);
    let key = digest.iter().take(8).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    Ok(target_dir().join("tools").join(format!("bpf-linker-{key}")))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
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

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(c, _)| !have(c))
        .map(|(_, p)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "missing Debian packages {missing:?}; run `cargo xtask setup` as root, or `apt-get install {}`",
            missing.join(" ")
        );
    }
    eprintln!("setup: installing Debian packages {}", missing.join(" "));
    let install = |update: bool| -> anyhow::Result<bool> {
        if update {
            cmd_env(
                "apt-get",
                &["update", "-q"],
                &[("DEBIAN_FRONTEND", "noninteractive")],
            )?;
        }
        let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
        args.extend(&missing);
        Ok(Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success())
    };
    // Stale package lists give 404s: update once and retry.
    if !install(false)? && !install(true)? {
        bail!("apt-get install {} failed", missing.join(" "));
    }
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

/// Where `cargo fuzz` is installed (`target/tools/cargo-fuzz/bin/cargo-fuzz`).
pub fn cargo_fuzz_bin() -> PathBuf {
    target_dir().join("tools/cargo-fuzz/bin/cargo-fuzz")
}

/// cargo-fuzz runs the fuzz target over manifest parsing and translation.
fn cargo_fuzz() -> anyhow::Result<()> {
    if cargo_fuzz_bin().exists() {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz (about half a minute, once)");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz@0.13.2", "--locked", "--root"])
        .arg(target_dir().join("tools/cargo-fuzz"))
        .env_remove("RUSTC_BOOTSTRAP")
        .status()?;
    if !status.success() {
        bail!("installing cargo-fuzz failed (it needs crates.io)");
    }
    Ok(())
}
