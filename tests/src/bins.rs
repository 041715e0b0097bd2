//! Where the binaries under test are: next to the running executable (target/<profile>/, or its
//! parent when running from deps/ or examples/), unless `SOCKLB_BIN` / `SBX_BIN` say otherwise.
use std::path::PathBuf;

use anyhow::{Context as _, bail};

fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("executable without a folder")?;
    Ok(if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.parent()
            .context("deps or examples without a parent")?
            .to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

fn find(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let path = bin_dir()?.join(name);
    if !path.exists() {
        bail!(
            "{} not found; build it first (cargo build --workspace --bins) or set {env}",
            path.display()
        );
    }
    Ok(path)
}

/// The `socklb` binary.
pub fn socklb() -> anyhow::Result<PathBuf> {
    find("socklb", "SOCKLB_BIN")
}

/// The sandbox helper.
pub fn sbx() -> anyhow::Result<PathBuf> {
    find("sbx", "SBX_BIN")
}
