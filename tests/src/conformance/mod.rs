//! The Kubernetes conformance suite: kube-proxy's own expectations (its unit tests, its
//! proxier tests, the e2e tests), re-expressed as data a socket on this node can observe, and
//! run twice: through the translation and reconciler into in-memory maps (no privileges), and
//! end to end in a sandbox with real sockets (`tests/tests/conformance.rs`).
//!
//! The cases are files, one per case, in `tests/conformance/` (their README gives the format
//! and the address plan). Each names its origin. An expectation is what a client on this node
//! gets when it connects to an address: the set of backends that answer, a refusal, or no
//! translation at all. Where socklb differs from kube-proxy on purpose, the case says so in
//! `note` and the README's compatibility table explains why.
pub mod run;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};

/// One case of the suite, as its file states it.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique, short, kebab-case: the test's name (the file is `NNN-<name>.txtar`).
    pub name: String,
    /// The file the case was read from.
    pub file: PathBuf,
    /// Where kube-proxy states the expectation: file, test function and case name (or the
    /// source function for rules that no test names).
    pub origin: String,
    /// This node's identity (its name is always `node-a`).
    pub node: Node,
    /// Kubernetes YAML (Services, EndpointSlices, at most the Node `node-a`), documents
    /// separated by `---`. Addresses must not collide with other cases of the same `node`.
    pub objects: String,
    /// What a client on this node gets at each address (`ADDR:PORT/TCP` or `/UDP`).
    pub expect: Vec<(String, Outcome)>,
    /// Where socklb differs from kube-proxy on purpose (empty: it does not).
    pub note: String,
}

/// Who this node is, as the agent's flags say.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    /// `--zone` (`None`: no flag; the Node object's label, if the case has one, decides).
    pub zone: Option<String>,
    /// `--node-address`: the addresses NodePorts are served on (empty: the Node object and
    /// `--nodeport-addresses` decide).
    pub addresses: Vec<String>,
    /// `--kubernetes-version` as `1.N` (`None`: the newest rules socklb knows).
    pub kubernetes_version: Option<String>,
}

/// What a connect to an address gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Connects reach these backends (`IP:PORT`), each of them, and no other.
    Backends(Vec<String>),
    /// Refused at once (ECONNREFUSED): no usable endpoint (kube-proxy: REJECT).
    Refused,
    /// Refused at once (ECONNREFUSED): internalTrafficPolicy Local and no usable endpoint on
    /// this node while others exist (kube-proxy: DROP, a timeout; socklb refuses on purpose).
    RefusedNoLocal,
    /// Not a service address for socklb: the connect is left alone (in the sandbox it gets
    /// ENETUNREACH, as no route leads there).
    Untouched,
}

/// The folder of case files.
pub fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance")
}

/// Every case, in file order.
pub fn cases() -> anyhow::Result<Vec<Case>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder())
        .with_context(|| format!("reading {}", folder().display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "txtar"));
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            parse(path, &text).with_context(|| format!("{}", path.display()))
        })
        .collect()
}

/// Reads one case file: `key: value` header lines, then the sections `-- expect --` (one
/// `ADDR/PROTO outcome` per line, `#` comments) and `-- objects.yaml --`.
pub fn parse(path: &Path, text: &str) -> anyhow::Result<Case> {
    let mut sections: Vec<(&str, String)> = vec![("", String::new())];
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("-- ").and_then(|l| l.strip_suffix(" --")) {
            sections.push((name, String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    let section = |name: &str| -> anyhow::Result<&str> {
        let mut found = sections.iter().filter(|(n, _)| *n == name);
        match (found.next(), found.next()) {
            (Some((_, body)), None) => Ok(body),
            (None, _) => bail!("no `-- {name} --` section"),
            (Some(_), Some(_)) => bail!("two `-- {name} --` sections"),
        }
    };
    for (name, _) in &sections[1..] {
        ensure!(
            ["expect", "objects.yaml"].contains(name),
            "unknown section `-- {name} --`"
        );
    }
    let (mut name, mut origin, mut note) = (None, None, String::new());
    let mut identity = Node::default();
    for line in section("")?.lines().filter(|l| !l.trim().is_empty()) {
        let (key, value) = line
            .split_once(": ")
            .with_context(|| format!("header line `{line}` is not `key: value`"))?;
        let value = value.trim();
        match key {
            "name" => name = Some(value.to_string()),
            "origin" => origin = Some(value.to_string()),
            "group" => {}
            "note" => note = value.to_string(),
            "zone" => {
                identity.zone = match value {
                    "none" => None,
                    "\"\"" => Some(String::new()),
                    z => Some(z.to_string()),
                };
            }
            "node-addresses" => {
                identity.addresses = value.split_whitespace().map(Into::into).collect();
            }
            "kubernetes-version" => identity.kubernetes_version = Some(value.to_string()),
            other => bail!("unknown header `{other}`"),
        }
    }
    let name = name.context("no `name:` header")?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    ensure!(
        stem.split_once('-').map(|(_, n)| n) == Some(name.as_str()),
        "the file name `{stem}` does not end in the case's name `{name}`"
    );
    let mut expect = Vec::new();
    for line in section("expect")?.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let addr = words.next().context("empty expectation")?.to_string();
        let outcome = match words.next() {
            Some("backends") => Outcome::Backends(words.by_ref().map(Into::into).collect()),
            Some("refused") => Outcome::Refused,
            Some("refused-no-local") => Outcome::RefusedNoLocal,
            Some("untouched") => Outcome::Untouched,
            other => bail!(
                "`{line}`: the outcome must be backends, refused, refused-no-local or \
                 untouched, not {other:?}"
            ),
        };
        ensure!(words.next().is_none(), "`{line}`: words after the outcome");
        expect.push((addr, outcome));
    }
    Ok(Case {
        name,
        file: path.to_path_buf(),
        origin: origin.context("no `origin:` header")?,
        node: identity,
        objects: section("objects.yaml")?.to_string(),
        expect,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_file_reads_into_its_parts() {
        let text = "name: x\norigin: o\nzone: none\nkubernetes-version: 1.30\n-- expect --\n\
                    # c\n10.0.0.1:80/TCP backends 1.1.1.1:80 2.2.2.2:80\n[fd00::1]:53/UDP refused\n\
                    -- objects.yaml --\nkind: Service\n";
        let case = parse(Path::new("001-x.txtar"), text).unwrap();
        assert_eq!(case.node.zone, None);
        assert_eq!(case.node.kubernetes_version.as_deref(), Some("1.30"));
        assert_eq!(
            case.expect,
            vec![
                (
                    "10.0.0.1:80/TCP".into(),
                    Outcome::Backends(vec!["1.1.1.1:80".into(), "2.2.2.2:80".into()])
                ),
                ("[fd00::1]:53/UDP".into(), Outcome::Refused),
            ]
        );
        assert_eq!(case.objects, "kind: Service\n");
        assert!(
            parse(Path::new("001-y.txtar"), text).is_err(),
            "name mismatch"
        );
        assert!(
            parse(
                Path::new("001-x.txtar"),
                &text.replace("refused", "rejected")
            )
            .is_err()
        );
    }
}
