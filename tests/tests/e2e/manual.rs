//! The manual pages: `socklb manpages DIR` writes one for socklb and one for each subcommand,
//! and `man` (man-db, the reader users have) renders each without complaint, with every flag
//! the command line takes.
use std::process::Command;

use clap::CommandFactory as _;

#[test]
fn every_subcommand_has_a_manual_page_with_every_flag() -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let out = Command::new(socklb_tests::bins::socklb()?)
        .arg("manpages")
        .arg(&dir)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli = socklb::cli::Cli::command();
    let mut pages = vec![("socklb.1".to_string(), cli.clone())];
    for sub in cli.get_subcommands() {
        pages.push((format!("socklb-{}.1", sub.get_name()), sub.clone()));
    }
    for (file, cmd) in pages {
        let path = dir.join(&file);
        assert!(path.exists(), "{file} was written");
        let shown = Command::new("man")
            .args(["--warnings", "-l", "-P", "cat"])
            .arg(&path)
            .env("MANWIDTH", "200")
            .env("LC_ALL", "C.UTF-8")
            .output()?;
        let text = String::from_utf8_lossy(&shown.stdout);
        let complaints = String::from_utf8_lossy(&shown.stderr);
        assert!(shown.status.success(), "man {file}: {complaints}");
        assert!(
            complaints.trim().is_empty(),
            "man {file} warns: {complaints}"
        );
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                assert!(
                    text.contains(&format!("--{long}")),
                    "{file} does not show --{long}:\n{text}"
                );
            }
        }
        for sub in cmd.get_subcommands() {
            assert!(
                text.contains(sub.get_name()),
                "{file} does not name its subcommand {}",
                sub.get_name()
            );
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// A fresh folder under the system's temporary folder.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("socklb-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
