//! The kernel's table read back (`nft -j list table`), for a full sync's leftovers, for
//! `socklb inspect outside` and for `explain`: the elements of each map in the form `render`
//! writes them, and the endpoints each chain sends new flows to.
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use super::script::Names;

/// The names of the chains and of the maps and sets of a listing.
pub fn names(json: &Value) -> Names {
    let mut out = Names::default();
    for item in objects(json) {
        if let Some(c) = item.get("chain") {
            if let Some(n) = c.get("name").and_then(Value::as_str) {
                out.chains.insert(n.to_string());
            }
        } else if let Some(m) = item.get("map").or_else(|| item.get("set"))
            && let Some(n) = m.get("name").and_then(Value::as_str)
        {
            out.maps.insert(n.to_string());
        }
    }
    out
}

fn objects(json: &Value) -> impl Iterator<Item = &Value> {
    json.get("nftables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// A table as the kernel holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstalledTable {
    /// Map or set → key → value ("" for a set), written as `render` writes them.
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Chain → its rules' expressions.
    pub chains: BTreeMap<String, Vec<Value>>,
}

impl InstalledTable {
    pub fn parse(json: &Value) -> Self {
        let mut out = Self::default();
        for item in objects(json) {
            if let Some(c) = item.get("chain") {
                if let Some(n) = c.get("name").and_then(Value::as_str) {
                    out.chains.entry(n.to_string()).or_default();
                }
            } else if let Some(r) = item.get("rule") {
                if let (Some(chain), Some(expr)) =
                    (r.get("chain").and_then(Value::as_str), r.get("expr"))
                {
                    out.chains
                        .entry(chain.to_string())
                        .or_default()
                        .push(expr.clone());
                }
            } else if let Some(m) = item.get("map").or_else(|| item.get("set"))
                && let Some(n) = m.get("name").and_then(Value::as_str)
            {
                let elements = out.maps.entry(n.to_string()).or_default();
                for e in m
                    .get("elem")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let (key, value) = match e.as_array() {
                        Some(pair) if pair.len() == 2 && item.get("map").is_some() => {
                            (text(&pair[0]), verdict(&pair[1]))
                        }
                        _ => (text(e), String::new()),
                    };
                    elements.insert(key, value);
                }
            }
        }
        out
    }

    /// Whether this table still holds what `written` says: every chain, with as many rules,
    /// and exactly the elements of every map socklb writes (the affinity sets' elements are the
    /// kernel's). Leftover chains and sets beside them do not count.
    pub fn holds(&self, written: &super::render::Ruleset) -> bool {
        let chains = written.chains.iter().all(|(name, chain)| {
            self.chains
                .get(name)
                .is_some_and(|rules| rules.len() == chain.rules.len())
        });
        let maps = written.maps.iter().all(|(name, map)| {
            let Some(elements) = self.maps.get(name) else {
                return false;
            };
            map.dynamic || *elements == map.elements
        });
        chains && maps
    }

    /// The endpoints new flows entering `chain` are sent to, following its jumps, gotos and
    /// verdict maps (each chain once).
    pub fn endpoints_from(&self, chain: &str) -> BTreeSet<SocketAddr> {
        let mut seen = BTreeSet::new();
        let mut out = BTreeSet::new();
        self.walk(chain, &mut seen, &mut out);
        out
    }

    fn walk(&self, chain: &str, seen: &mut BTreeSet<String>, out: &mut BTreeSet<SocketAddr>) {
        if !seen.insert(chain.to_string()) {
            return;
        }
        let mut next = Vec::new();
        for rule in self.chains.get(chain).into_iter().flatten() {
            collect(rule, out, &mut next);
        }
        for c in next {
            self.walk(&c, seen, out);
        }
    }
}

/// DNAT targets and chains jumped to, anywhere in an expression.
fn collect(v: &Value, out: &mut BTreeSet<SocketAddr>, next: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(d) = map.get("dnat") {
                dnat_targets(d, out);
            }
            for key in ["goto", "jump"] {
                if let Some(t) = map
                    .get(key)
                    .and_then(|g| g.get("target"))
                    .and_then(Value::as_str)
                {
                    next.push(t.to_string());
                }
            }
            for value in map.values() {
                collect(value, out, next);
            }
        }
        Value::Array(items) => {
            for item in items {
                collect(item, out, next);
            }
        }
        _ => {}
    }
}

fn dnat_targets(d: &Value, out: &mut BTreeSet<SocketAddr>) {
    let addr = d.get("addr");
    let port = d.get("port").and_then(Value::as_u64);
    if let (Some(a), Some(p)) = (addr.and_then(Value::as_str), port) {
        if let (Ok(ip), Ok(port)) = (a.parse::<IpAddr>(), u16::try_from(p)) {
            out.insert(SocketAddr::new(ip, port));
        }
        return;
    }
    // `addr . port to numgen ... map { 0 : A . P, ... }`: the pairs are concatenations in the
    // map's data.
    let mut pairs = Vec::new();
    concats(addr.unwrap_or(&Value::Null), &mut pairs);
    for pair in pairs {
        if let [a, p] = pair.as_slice()
            && let (Some(ip), Some(port)) = (
                a.as_str().and_then(|s| s.parse::<IpAddr>().ok()),
                p.as_u64().and_then(|p| u16::try_from(p).ok()),
            )
        {
            out.insert(SocketAddr::new(ip, port));
        }
    }
}

fn concats<'a>(v: &'a Value, out: &mut Vec<&'a Vec<Value>>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(parts)) = map.get("concat") {
                out.push(parts);
            }
            for value in map.values() {
                concats(value, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                concats(item, out);
            }
        }
        _ => {}
    }
}

/// A key as `render` writes it: `192.0.2.10 . tcp . 80`, `tcp . 30080`, `10.0.0.1`.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(map) => {
            if let Some(Value::Array(parts)) = map.get("concat") {
                parts.iter().map(text).collect::<Vec<_>>().join(" . ")
            } else if let Some(e) = map.get("elem") {
                // An element with options (a timeout, a comment): its value.
                text(e.get("val").unwrap_or(e))
            } else if let Some(p) = map.get("prefix") {
                format!(
                    "{}/{}",
                    p.get("addr").map(text).unwrap_or_default(),
                    p.get("len").map(text).unwrap_or_default()
                )
            } else {
                v.to_string()
            }
        }
        other => other.to_string(),
    }
}

/// A verdict as `render` writes it: `goto CHAIN`, `drop`.
fn verdict(v: &Value) -> String {
    if let Value::Object(map) = v {
        for key in ["goto", "jump"] {
            if let Some(t) = map
                .get(key)
                .and_then(|g| g.get("target"))
                .and_then(Value::as_str)
            {
                return format!("{key} {t}");
            }
        }
        if let Some(k) = map.keys().next() {
            return k.clone();
        }
    }
    text(v)
}
