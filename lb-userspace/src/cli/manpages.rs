//! `socklb manpages DIR`: a manual page for `socklb` and for each subcommand (`socklb-agent.1`,
//! ...), written from the command line's own definition (`clap_mangen`), so a page never falls
//! behind a flag. The container image installs them (`deploy/Containerfile`).
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::CommandFactory as _;

use super::Cli;

#[derive(clap::Args, Debug)]
pub struct ManpagesArgs {
    /// The folder to write the pages to (section 1: `socklb.1`, `socklb-agent.1`, ...); made
    /// if missing.
    pub dir: PathBuf,
}

pub(super) fn run(args: &ManpagesArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("making {}", args.dir.display()))?;
    for (file, page) in pages()? {
        let path = args.dir.join(&file);
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Every page, by file name: `socklb.1` and `socklb-<subcommand>.1` for each subcommand.
pub fn pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let cmd = Cli::command();
    let mut out = vec![("socklb.1".to_string(), render(cmd.clone())?)];
    for sub in cmd.get_subcommands() {
        let name = format!("socklb-{}", sub.get_name());
        let page = sub
            .clone()
            .name(name.clone())
            .display_name(format!("socklb {}", sub.get_name()))
            .version(cmd.get_version().unwrap_or_default().to_string());
        out.push((format!("{name}.1"), render(page)?));
    }
    Ok(out)
}

fn render(cmd: clap::Command) -> anyhow::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut page)
        .context("rendering a manual page")?;
    Ok(page)
}
