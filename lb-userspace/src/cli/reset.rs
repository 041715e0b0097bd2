//! `socklb reset`: detach the programs and remove every pin (the uninstall path).
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use super::{Output, PinArgs, print_output};
use crate::dataplane::{loader::remove_pins, pins::PinFolder};

#[derive(clap::Args, Debug)]
pub struct ResetArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t, env = "SOCKLB_OUTPUT")]
    pub output: Output,
}

/// What `socklb reset` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reset {
    pub pin_folder: String,
    /// Whether anything was pinned there.
    pub pinned: bool,
    /// Program links detached.
    pub links: usize,
    /// Map pins removed.
    pub maps: usize,
}

/// Exit status 0 also when nothing was pinned.
pub(super) fn run(args: &ResetArgs) -> anyhow::Result<ExitCode> {
    let pins = PinFolder::new(&args.pins.pin_folder);
    let mut reset = Reset {
        pin_folder: pins.root.display().to_string(),
        pinned: pins.root.exists(),
        links: 0,
        maps: 0,
    };
    if reset.pinned {
        let removed = remove_pins(&pins)?;
        reset.links = removed.links;
        reset.maps = removed.maps;
    }
    print_output(args.output, &reset, || {
        if reset.pinned {
            format!(
                "detached {} program link(s) and removed {} map pin(s) from {}\n",
                reset.links, reset.maps, reset.pin_folder
            )
        } else {
            format!("nothing pinned at {}\n", reset.pin_folder)
        }
    })?;
    Ok(ExitCode::SUCCESS)
}
