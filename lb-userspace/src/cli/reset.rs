//! `socklb reset`: detach the programs and remove every pin (the uninstall path).
use std::process::ExitCode;

use super::PinArgs;
use crate::dataplane::loader::{PinFolder, remove_pins};

#[derive(clap::Args, Debug)]
pub struct ResetArgs {
    #[command(flatten)]
    pub pins: PinArgs,
}

pub fn run(args: &ResetArgs) -> anyhow::Result<ExitCode> {
    let pins = PinFolder::new(&args.pins.pin_folder);
    if !pins.root.exists() {
        println!("nothing pinned at {}", pins.root.display());
        return Ok(ExitCode::SUCCESS);
    }
    let removed = remove_pins(&pins)?;
    println!(
        "detached {} program link(s) and removed {} map pin(s) from {}",
        removed.links,
        removed.maps,
        pins.root.display()
    );
    Ok(ExitCode::SUCCESS)
}
