//! Builds the eBPF programs (`lb-ebpf`) with aya-build and leaves the object in `OUT_DIR`, where
//! `src/dataplane/loader.rs` embeds it; without the `agent` feature (the fuzz target's build),
//! which has no loader, it builds nothing but the commit's name.
//!
//! Two things are scoped to this build script so they never leak into the userspace crates:
//! - `RUSTC_BOOTSTRAP=1`, which lets the stable toolchain build `core` for the bpf target;
//! - the `bpf-linker` that `cargo xtask setup` built against this toolchain's libLLVM, found in
//!   `$SOCKLB_TOOLS` or `$CARGO_HOME/socklb-tools` (`~/.cargo/socklb-tools`), in
//!   `bpf-linker-<hash of rustc -vV>/bin`, and put first on the child's PATH.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .context("lb-userspace has no parent folder")?;
    println!(
        "cargo:rustc-env=SOCKLB_GIT_COMMIT={}",
        git_commit(workspace)
    );
    // The commit changes with HEAD (a checkout) or with the branch HEAD names (a commit).
    let git = workspace.join(".git");
    let mut watched = vec![git.join("HEAD"), git.join("packed-refs")];
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD"))
        && let Some(branch) = head.trim().strip_prefix("ref: ")
    {
        watched.push(git.join(branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }

    #[cfg(feature = "agent")]
    ebpf::build(workspace)?;
    Ok(())
}

/// The checkout's commit (with `+dirty` when files differ), or `unknown` outside a checkout.
fn git_commit(workspace: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(workspace)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) if !commit.is_empty() => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{commit}+dirty")
            } else {
                commit
            }
        }
        _ => "unknown".into(),
    }
}

#[cfg(feature = "agent")]
mod ebpf {
    use std::{
        env,
        path::{Path, PathBuf},
        process::Command,
    };

    use anyhow::{Context as _, bail};
    use sha2::{Digest as _, Sha256};

    /// Builds `lb-ebpf` for the bpf target with aya-build, with the bpf-linker setup installed.
    pub(crate) fn build(workspace: &Path) -> anyhow::Result<()> {
        let tool_dir = bpf_linker_dir(workspace)?;
        println!("cargo:rerun-if-changed={}", tool_dir.display());
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join("lb-common/src").display()
        );

        let linker = tool_dir.join("bpf-linker");
        if !linker.exists() && which("bpf-linker").is_none() {
            bail!(
                "bpf-linker not found (looked in {} and on PATH): run `cargo xtask setup`",
                tool_dir.display()
            );
        }
        let path = env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![tool_dir];
        dirs.extend(env::split_paths(&path));
        // SAFETY: build scripts are single-threaded; the variables are read by aya-build's child
        // cargo process only.
        unsafe {
            env::set_var("PATH", env::join_paths(dirs)?);
            env::set_var("RUSTC_BOOTSTRAP", "1");
            // aya-build turns every line the inner cargo prints into a warning; keep it to errors.
            env::set_var("CARGO_TERM_QUIET", "true");
            // The workspace's release profile links the agent with fat LTO (a smaller binary, less
            // of it resident); the eBPF programs keep the default they were verified and measured
            // with: the same object, byte for byte, as before the agent's LTO.
            env::set_var("CARGO_PROFILE_RELEASE_LTO", "false");
        }

        let ebpf_dir = workspace.join("lb-ebpf");
        let ebpf = aya_build::Package {
            name: "lb-ebpf",
            root_dir: ebpf_dir.to_str().context("workspace path is not UTF-8")?,
            ..Default::default()
        };
        aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom("stable"))
    }

    /// `<tools>/bpf-linker-<first 16 hex of sha256(rustc -vV)>/bin`, the folder xtask installs to
    /// (`<tools>`: `$SOCKLB_TOOLS`, else `$CARGO_HOME/socklb-tools`, else `~/.cargo/socklb-tools`).
    fn bpf_linker_dir(workspace: &Path) -> anyhow::Result<PathBuf> {
        let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let out = Command::new(&rustc)
            .arg("-vV")
            .output()
            .with_context(|| format!("running {rustc} -vV"))?;
        let key = hex16(&Sha256::digest(&out.stdout));
        println!("cargo:rerun-if-env-changed=SOCKLB_TOOLS");
        let tools = env::var_os("SOCKLB_TOOLS")
            .map(PathBuf::from)
            .or_else(|| {
                env::var_os("CARGO_HOME")
                    .map(PathBuf::from)
                    .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
                    .map(|home| home.join("socklb-tools"))
            })
            .unwrap_or_else(|| workspace.join("target/tools"));
        Ok(tools.join(format!("bpf-linker-{key}")).join("bin"))
    }

    fn hex16(digest: &[u8]) -> String {
        use std::fmt::Write as _;
        digest.iter().take(8).fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }

    fn which(program: &str) -> Option<PathBuf> {
        env::split_paths(&env::var_os("PATH")?)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    }
}
