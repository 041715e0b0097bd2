//! `docs/cli.md`, the command line's reference, written from its own definition (as the
//! manual pages are): every subcommand's usage and every flag with its help, environment
//! variable, default and values. A test compares the file with this and fails when they
//! differ (`UPDATE_DOCS=1` rewrites it), so the reference never falls behind a flag.
use std::fmt::Write as _;

use clap::CommandFactory as _;

use super::Cli;

/// The whole reference, as Markdown.
pub fn markdown() -> String {
    let cmd = Cli::command().bin_name("socklb");
    let mut out = String::from(
        "# socklb command line\n\n\
         Generated from the command line's own definition (`cargo test` fails when this file \
         falls behind it; `UPDATE_DOCS=1 cargo test -p lb-userspace --test integration docs` \
         rewrites it). `socklb manpages DIR` writes the same as manual pages, and \
         `socklb COMMAND --help` prints it. What the agent's settings mean in operation: \
         [agent.md](agent.md).\n\n",
    );
    let _ = writeln!(out, "Commands:\n");
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let _ = writeln!(
            out,
            "- [`socklb {}`](#socklb-{}): {}",
            sub.get_name(),
            sub.get_name(),
            first_line(sub.get_about().map(ToString::to_string).as_deref())
        );
    }
    out.push('\n');
    command(&mut out, &cmd, "socklb", 2);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command(&mut out, sub, &format!("socklb {}", sub.get_name()), 2);
    }
    out
}

fn first_line(text: Option<&str>) -> String {
    text.unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_string()
}

/// One command: its heading, description, usage and arguments.
fn command(out: &mut String, cmd: &clap::Command, name: &str, level: usize) {
    let _ = writeln!(out, "{} {name}\n", "#".repeat(level));
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let usage = cmd.clone().bin_name(name).render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ").trim();
    let _ = writeln!(out, "```\n{usage}\n```\n");
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    if args.is_empty() {
        return;
    }
    for arg in args {
        let _ = writeln!(out, "- {}", arg_name(arg));
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let mut notes = Vec::new();
        if let Some(env) = arg.get_env() {
            notes.push(format!("env `{}`", env.to_string_lossy()));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if !defaults.is_empty() {
            notes.push(format!("default `{}`", defaults.join(",")));
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() && arg.get_action().takes_values() {
            notes.push(format!("values {}", values.join(", ")));
        }
        for line in help.trim().lines() {
            let _ = writeln!(out, "  {}", line.trim_end());
        }
        if !notes.is_empty() {
            let _ = writeln!(out, "  ({})", notes.join("; "));
        }
    }
    out.push('\n');
}

/// `--flag <VALUE>`, `-o, --output <OUTPUT>` or `<NAME>` for a positional argument.
fn arg_name(arg: &clap::Arg) -> String {
    let value = arg.get_value_names().map_or_else(
        || format!("<{}>", arg.get_id().as_str().to_uppercase()),
        |v| {
            v.iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        },
    );
    if arg.is_positional() {
        return format!("`{value}`");
    }
    let mut names = Vec::new();
    if let Some(s) = arg.get_short() {
        names.push(format!("-{s}"));
    }
    if let Some(l) = arg.get_long() {
        names.push(format!("--{l}"));
    }
    if arg.get_action().takes_values() {
        format!("`{} {value}`", names.join(", "))
    } else {
        format!("`{}`", names.join(", "))
    }
}
