//! From the installed table to the desired one: the nftables transactions. Pure.
//!
//! A full sync (at start, after a failed transaction, when the table drifted) re-declares every
//! chain and map, empties and refills the chains and the maps socklb writes, and keeps the
//! affinity sets (their elements are the clients the kernel remembers). Otherwise only what
//! differs is written: new maps and chains, the rules of changed chains, and elements added,
//! changed and removed. Either way the first transaction carries everything packets see at once
//! (nftables commits it atomically); chains and sets nothing refers to any more are deleted in a
//! second one (a kernel before 6.2 keeps a chain busy for a moment after its last reference
//! goes, as kube-proxy found).
use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::render::{Chain, Map, Ruleset};
use crate::dataplane::nft::{TABLE, family_keyword};
use crate::vocab::Family;

/// The two transactions of one sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transactions {
    /// Everything packets see, in one atomic commit.
    pub main: String,
    /// Chains and sets no longer referred to.
    pub cleanup: String,
    /// How many chains were written (added or rewritten), for the log.
    pub chains_written: usize,
    /// Elements added or removed.
    pub elements_written: usize,
}

/// What a table holds, by name (from `nft -j list table`): for a full sync's leftovers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub chains: BTreeSet<String>,
    pub maps: BTreeSet<String>,
}

fn declare_chain(out: &mut String, fam: &str, name: &str, chain: &Chain) {
    match chain.base {
        Some(base) => {
            let _ = writeln!(out, "add chain {fam} {TABLE} {name} {{ {base} ; }}");
        }
        None => {
            let _ = writeln!(out, "add chain {fam} {TABLE} {name}");
        }
    }
}

fn write_rules(out: &mut String, fam: &str, name: &str, chain: &Chain) {
    for rule in &chain.rules {
        let _ = writeln!(out, "add rule {fam} {TABLE} {name} {rule}");
    }
}

fn declare_map(out: &mut String, fam: &str, name: &str, map: &Map) {
    let kind = if map.definition.contains(": verdict") {
        "map"
    } else {
        "set"
    };
    let _ = writeln!(
        out,
        "add {kind} {fam} {TABLE} {name} {{ {} ; }}",
        map.definition
    );
}

fn element_line(fam: &str, verb: &str, name: &str, key: &str, value: &str) -> String {
    if value.is_empty() || verb == "delete" {
        format!("{verb} element {fam} {TABLE} {name} {{ {key} }}\n")
    } else {
        format!("{verb} element {fam} {TABLE} {name} {{ {key} : {value} }}\n")
    }
}

/// The transactions that turn `installed` into `desired` (`None`: a full sync, over a table
/// holding `existing`).
pub fn transactions(
    family: Family,
    installed: Option<&Ruleset>,
    desired: &Ruleset,
    existing: &Names,
) -> Transactions {
    let fam = family_keyword(family);
    let mut t = Transactions::default();
    let out = &mut t.main;
    let _ = writeln!(out, "add table {fam} {TABLE}");
    match installed {
        None => full(&mut t, fam, desired, existing),
        Some(old) => changes(&mut t, fam, old, desired),
    }
    t
}

/// A full sync: every chain and map declared, the chains and written maps refilled, the
/// leftovers of `existing` emptied here and deleted in the cleanup.
fn full(t: &mut Transactions, fam: &str, desired: &Ruleset, existing: &Names) {
    let out = &mut t.main;
    for (name, map) in &desired.maps {
        declare_map(out, fam, name, map);
        if !map.dynamic {
            let _ = writeln!(
                out,
                "flush {} {fam} {TABLE} {name}",
                if map.definition.contains(": verdict") {
                    "map"
                } else {
                    "set"
                }
            );
        }
    }
    for (name, chain) in &desired.chains {
        declare_chain(out, fam, name, chain);
    }
    // Leftover chains may jump to each other: empty them all before any goes.
    for name in existing
        .chains
        .difference(&desired.chains.keys().cloned().collect())
    {
        let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
    }
    for (name, chain) in &desired.chains {
        let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
        write_rules(out, fam, name, chain);
        t.chains_written += 1;
    }
    for (name, map) in &desired.maps {
        for (key, value) in &map.elements {
            out.push_str(&element_line(fam, "add", name, key, value));
            t.elements_written += 1;
        }
    }
    for name in &existing.chains {
        if !desired.chains.contains_key(name) {
            let _ = writeln!(t.cleanup, "delete chain {fam} {TABLE} {name}");
        }
    }
    for name in &existing.maps {
        if !desired.maps.contains_key(name) {
            let _ = writeln!(t.cleanup, "delete set {fam} {TABLE} {name}");
        }
    }
}

/// Only what differs between `old` and `desired`.
fn changes(t: &mut Transactions, fam: &str, old: &Ruleset, desired: &Ruleset) {
    let out = &mut t.main;
    for (name, map) in &desired.maps {
        if !old.maps.contains_key(name) {
            declare_map(out, fam, name, map);
        }
    }
    for (name, chain) in &desired.chains {
        if !old.chains.contains_key(name) {
            declare_chain(out, fam, name, chain);
        }
    }
    for (name, chain) in &desired.chains {
        match old.chains.get(name) {
            Some(was) if was == chain => {}
            Some(_) => {
                let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
                write_rules(out, fam, name, chain);
                t.chains_written += 1;
            }
            None => {
                write_rules(out, fam, name, chain);
                t.chains_written += 1;
            }
        }
    }
    // Chains that go are emptied here (nothing jumps to them after this commit) and
    // deleted in the cleanup.
    for name in old.chains.keys() {
        if !desired.chains.contains_key(name) {
            let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
            let _ = writeln!(t.cleanup, "delete chain {fam} {TABLE} {name}");
        }
    }
    let empty = Map::default();
    for (name, map) in desired.maps.iter().filter(|(_, m)| !m.dynamic) {
        let was = old.maps.get(name).unwrap_or(&empty);
        for (key, value) in &was.elements {
            if map.elements.get(key) != Some(value) {
                out.push_str(&element_line(fam, "delete", name, key, value));
                t.elements_written += 1;
            }
        }
        for (key, value) in &map.elements {
            if was.elements.get(key) != Some(value) {
                out.push_str(&element_line(fam, "add", name, key, value));
                t.elements_written += 1;
            }
        }
    }
    for name in old.maps.keys() {
        if !desired.maps.contains_key(name) {
            let _ = writeln!(t.cleanup, "delete set {fam} {TABLE} {name}");
        }
    }
}
