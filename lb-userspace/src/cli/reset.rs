//! `socklb reset`: detach the programs, remove every pin, and delete the outside path's
//! nftables tables in this network namespace (the uninstall path).
use std::{fmt::Write as _, process::ExitCode};

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
    /// The outside path's nftables tables deleted (`ip socklb`, `ip6 socklb`).
    #[serde(default)]
    pub nft_tables: usize,
}

/// Exit status 0 also when nothing was pinned.
pub(super) fn run(args: &ResetArgs) -> anyhow::Result<ExitCode> {
    let pins = PinFolder::new(&args.pins.pin_folder);
    let mut reset = Reset {
        pin_folder: pins.root.display().to_string(),
        pinned: pins.root.exists(),
        links: 0,
        maps: 0,
        nft_tables: 0,
    };
    if reset.pinned {
        let removed = remove_pins(&pins)?;
        reset.links = removed.links;
        reset.maps = removed.maps;
    }
    // The outside path's rules, where the nft tool is (without it there can be none of ours).
    if let Ok(nft) = crate::dataplane::nft::Nft::find() {
        reset.nft_tables = nft.delete_tables()?;
    }
    print_output(args.output, &reset, || {
        let mut text = if reset.pinned {
            format!(
                "detached {} program link(s) and removed {} map pin(s) from {}\n",
                reset.links, reset.maps, reset.pin_folder
            )
        } else {
            format!("nothing pinned at {}\n", reset.pin_folder)
        };
        if reset.nft_tables > 0 {
            let _ = writeln!(
                text,
                "deleted {} nftables table(s) of the outside path",
                reset.nft_tables
            );
        }
        text
    })?;
    Ok(ExitCode::SUCCESS)
}
