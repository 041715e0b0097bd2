//! The layering of `src/` (ARCHITECTURE.md, "Code map"), checked on the source text: every
//! `crate::<module>` a file names (in `use` lines, grouped or not, and in paths) must be one its
//! module may import. A failure names the file, the line and the import.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// What each top-level module may import from the rest of the crate. The modules form layers:
/// nothing here imports a module that imports it back.
const ALLOWED: &[(&str, &[&str])] = &[
    ("vocab", &[]),
    ("vec_set", &[]),
    ("hashing", &[]),
    ("model", &["vocab", "vec_set", "hashing"]),
    ("translate", &["model", "vocab", "vec_set", "hashing"]),
    ("dataplane", &["vocab"]),
    (
        "reconcile",
        &["translate", "dataplane", "vocab", "vec_set", "hashing"],
    ),
    ("outside", &["translate", "model", "dataplane", "vocab"]),
    ("source", &["model", "dataplane", "vocab"]),
    ("status", &["translate", "dataplane", "vocab"]),
    ("sockets", &["model", "dataplane", "vocab"]),
    (
        "explain",
        &[
            "outside",
            "status",
            "sockets",
            "translate",
            "model",
            "dataplane",
            "vocab",
        ],
    ),
    (
        "agent",
        &[
            "outside",
            "source",
            "status",
            "sockets",
            "reconcile",
            "translate",
            "model",
            "dataplane",
            "vocab",
            "vec_set",
            "hashing",
        ],
    ),
    (
        "fuzzing",
        &["reconcile", "translate", "model", "dataplane", "vocab"],
    ),
    // The command line is the top: it may import anything.
    ("cli", &["*"]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`src/agent/engine.rs` → `agent`), `None` for the
/// crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(stem) => Some(stem.to_string()),
        None => Some(first),
    }
}

/// The modules named right after each `crate::` in one statement: `crate::a::X`,
/// `crate::{a::X, b::{Y, Z}}`.
fn imported(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(item);
        } else {
            out.push(rest.to_string());
        }
    }
    out.into_iter()
        .map(|item| {
            item.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every `crate::` import in a file, with its line number; comments are skipped and a `use`
/// statement is read whole (it may span lines).
fn imports_of(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut statement: Option<(usize, String)> = None;
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        if let Some((_, text)) = statement.as_mut() {
            text.push_str(code);
        } else if code.trim_start().starts_with("use crate::")
            || code.trim_start().starts_with("pub use crate::")
        {
            statement = Some((i + 1, code.to_string()));
        } else {
            for m in imported(code) {
                out.push((i + 1, m));
            }
            continue;
        }
        if code.contains(';')
            && let Some((at, text)) = statement.take()
        {
            for m in imported(&text) {
                out.push((at, m));
            }
        }
    }
    out
}

#[test]
fn every_module_imports_only_what_its_layer_allows() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let shown = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(file);
        let Some(may) = allowed.get(module.as_str()) else {
            wrong.push(format!(
                "{}: module `{module}` is not in the layering table (tests/layering.rs, ARCHITECTURE.md)",
                shown.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(file).expect("source file");
        for (line, import) in imports_of(&source) {
            if import != module && !may.contains(&"*") && !may.contains(&import.as_str()) {
                wrong.push(format!(
                    "{}:{line}: `{module}` imports `crate::{import}`; it may import only {may:?}",
                    shown.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_import_reader_sees_grouped_nested_and_inline_imports() {
    let source = "use crate::{\n    dataplane::maps::X,\n    translate::{A, b::C},\n};\n\
                  // use crate::agent::Nope;\n\
                  fn f() { crate::cli::VERSION; }\n";
    assert_eq!(
        imports_of(source),
        [
            (1, "dataplane".to_string()),
            (1, "translate".to_string()),
            (6, "cli".to_string())
        ]
    );
}

/// The module path of a file below `src/` (`dataplane/sockets/quota.rs` → `dataplane`,
/// `sockets`, `quota`; a `mod.rs` is its folder).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut path: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    let last = path.pop().unwrap_or_default();
    if let Some(stem) = last.strip_suffix(".rs")
        && stem != "mod"
    {
        path.push(stem.to_string());
    }
    path
}

/// The absolute module paths one line names through `crate::` or `super::` (groups of one level
/// are opened: `super::{a::X, b}` names `a` and `b`).
fn named_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        (
            "super::super::",
            here[..here.len().saturating_sub(2)].to_vec(),
        ),
        ("super::", here[..here.len().saturating_sub(1)].to_vec()),
        // Inside a group (`crate::{dataplane::{a, b}}`) too.
        ("dataplane::", vec!["dataplane".to_string()]),
    ] {
        for (at, _) in code.match_indices(prefix) {
            let before = &code[..at];
            let rest = &code[at + prefix.len()..];
            // `super::super::` is not also read as `super::`; `dataplane::` only as a name.
            if prefix == "super::" && (before.ends_with("super::") || rest.starts_with("super::"))
                || prefix == "dataplane::"
                    && before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            // Only this path: up to the next one the line names.
            let end = ["crate::", "super::"]
                .iter()
                .filter_map(|p| rest.find(p))
                .min()
                .unwrap_or(rest.len());
            for item in imported(&format!("crate::{}", &rest[..end])) {
                let mut path = base.clone();
                path.push(item);
                out.push(path);
            }
        }
    }
    out
}

/// Depth-first search for a back edge from `node`: the circle found, named.
fn visit(
    node: &str,
    edges: &BTreeMap<String, std::collections::BTreeSet<String>>,
    stack: &mut Vec<String>,
    done: &mut std::collections::BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = stack.iter().position(|n| n == node) {
        let mut circle = stack[at..].to_vec();
        circle.push(node.to_string());
        return Some(circle);
    }
    if done.contains(node) {
        return None;
    }
    stack.push(node.to_string());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(circle) = visit(next, edges, stack, done) {
            return Some(circle);
        }
    }
    stack.pop();
    done.insert(node.to_string());
    None
}

/// Within `dataplane`, the submodules import one another in layers too: no circle (test code,
/// after a file's `#[cfg(test)]`, is not counted).
#[test]
fn dataplane_submodules_import_one_another_without_a_circle() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("dataplane"), &mut files);
    let mut edges: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let here = module_path(&src, file);
        let Some(own) = here.get(1).cloned() else {
            continue;
        };
        let source = std::fs::read_to_string(file).expect("source file");
        let mut open: Option<String> = None;
        for line in source.lines() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.split("//").next().unwrap_or_default();
            let text = match open.as_mut() {
                Some(statement) => {
                    statement.push_str(code);
                    if !code.contains(';') {
                        continue;
                    }
                    open.take().unwrap_or_default()
                }
                None if code.trim_start().starts_with("use ")
                    || code.trim_start().starts_with("pub use ") =>
                {
                    if !code.contains(';') {
                        open = Some(code.to_string());
                        continue;
                    }
                    code.to_string()
                }
                None => code.to_string(),
            };
            for path in named_paths(&text, &here) {
                if path.len() >= 2 && path[0] == "dataplane" && path[1] != own {
                    edges
                        .entry(own.clone())
                        .or_default()
                        .insert(path[1].clone());
                }
            }
        }
    }
    let mut done = std::collections::BTreeSet::new();
    for node in edges.keys() {
        let circle = visit(node, &edges, &mut Vec::new(), &mut done);
        assert!(
            circle.is_none(),
            "dataplane modules import each other in a circle: {}",
            circle.unwrap_or_default().join(" → ")
        );
    }
    // The reader sees the imports it must: the loader uses the map opener and the probes.
    assert!(edges["loader"].contains("bpf") && edges["loader"].contains("probe"));
}

#[test]
fn the_path_reader_resolves_super_and_crate() {
    let here: Vec<String> = ["dataplane", "sockets", "quota"].map(String::from).to_vec();
    assert_eq!(
        named_paths("use super::{a::X, b};", &here),
        [
            vec!["dataplane".to_string(), "sockets".into(), "a".into()],
            vec!["dataplane".to_string(), "sockets".into(), "b".into()]
        ]
    );
    assert_eq!(
        named_paths("super::super::loader::f(); crate::vocab::X", &here),
        [
            vec!["vocab".to_string()],
            vec!["dataplane".to_string(), "loader".into()]
        ]
    );
    assert_eq!(
        named_paths(
            "use crate::{dataplane::{abi::X, maps::Y}, vocab::Z};",
            &here
        ),
        [
            vec!["dataplane".to_string()],
            vec!["vocab".to_string()],
            vec!["dataplane".to_string(), "abi".into()],
            vec!["dataplane".to_string(), "maps".into()]
        ]
    );
}
