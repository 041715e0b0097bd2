//! `socklb completion SHELL`: the shell completion script, from the command line's own
//! definition (`clap_complete`), so it never falls behind a flag.
use std::process::ExitCode;

use clap::CommandFactory as _;
use clap_complete::Shell;

use super::Cli;

#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

pub(super) fn run(args: &CompletionArgs) -> ExitCode {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "socklb", &mut std::io::stdout());
    ExitCode::SUCCESS
}
