//! The documentation as readers meet it: `docs/cli.md` is the command line's own reference
//! (regenerated with `UPDATE_DOCS=1`, refused under `CI=true`), and every relative link and
//! `#anchor` in the repository's Markdown leads somewhere (GitHub's heading anchors).
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

#[test]
fn the_cli_reference_is_the_command_lines_own() {
    let path = root().join("docs/cli.md");
    let want = socklb::cli::reference::markdown();
    let update = std::env::var("UPDATE_DOCS").ok();
    let ci = std::env::var("CI").as_deref() == Ok("true");
    match (update.as_deref(), ci) {
        (Some("1"), false) => {
            std::fs::write(&path, &want).expect("writing docs/cli.md");
            return;
        }
        (Some(other), _) => {
            panic!("UPDATE_DOCS={other:?}: only UPDATE_DOCS=1, and never under CI=true")
        }
        (None, _) => {}
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/cli.md is not the command line's reference (UPDATE_DOCS=1 cargo test -p lb-userspace --test integration docs rewrites it); first difference at line {}:\n  file: {:?}\n  now:  {:?}",
            line + 1,
            have.lines().nth(line).unwrap_or("<end>"),
            want.lines().nth(line).unwrap_or("<end>"),
        );
    }
    // Every flag of every subcommand is in it.
    for sub in <socklb::cli::Cli as clap::CommandFactory>::command().get_subcommands() {
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                assert!(
                    want.contains(&format!("--{long}")),
                    "socklb {} --{long} is missing",
                    sub.get_name()
                );
            }
        }
    }
}

/// The Markdown files readers are sent to.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "RELIABILITY.md",
        "tests/conformance/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                fence = Some(&trimmed[..3]);
            }
            None => {
                // Inline code spans go.
                let mut in_code = false;
                for c in line.chars() {
                    if c == '`' {
                        in_code = !in_code;
                    } else if !in_code {
                        out.push(c);
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor for a heading: links become their text, lowercase, punctuation but `-`
/// and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find(']'), after.find("](")) {
            (Some(close), Some(link)) if close == link => {
                text.push_str(&after[..close]);
                let tail = &after[close + 2..];
                rest = tail.find(')').map_or("", |p| &tail[p + 1..]);
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.replace('`', "")
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown file has (its headings', numbered as GitHub numbers repeats).
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let s = slug(line[hashes..].trim().trim_end_matches('#').trim());
            let n = seen.entry(s.clone()).or_default();
            out.insert(if *n == 0 {
                s.clone()
            } else {
                format!("{s}-{n}")
            });
            *n += 1;
        }
    }
    out
}

/// The relative targets of `[text](target)` links in prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let before = &rest[..at];
        rest = &rest[at + 2..];
        if before.rfind('[').is_none() {
            continue;
        }
        let end = rest.find([')', ' ']).unwrap_or(rest.len());
        let target = &rest[..end];
        let scheme = target
            .split_once(':')
            .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()));
        if !target.is_empty() && !scheme {
            out.push(target.to_string());
        }
    }
    out
}

#[test]
fn every_link_and_anchor_in_the_docs_leads_somewhere() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for target in links(&prose(&text)) {
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a folder").join(path)
            };
            let name = file
                .strip_prefix(root())
                .unwrap_or(&file)
                .display()
                .to_string();
            if !dest.exists() {
                problems.push(format!("{name}: {target}: no such file"));
            } else if !anchor.is_empty() && !anchors(&dest).contains(anchor) {
                problems.push(format!("{name}: {target}: no such heading"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: the parser lost them"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(slug("SocklbAgentDown"), "socklbagentdown");
    assert_eq!(slug("What each part needs"), "what-each-part-needs");
    assert_eq!(
        slug("`socklb agent` flags: the [map](x.md) sizes"),
        "socklb-agent-flags-the-map-sizes"
    );
    assert_eq!(
        links("see [a](b.md#c), [d](https://e) and [f](#g)"),
        ["b.md#c", "#g"]
    );
    assert_eq!(prose("a `[x](y)` b\n```\n[z](w)\n```\n"), "a  b\n\n\n\n");
}
