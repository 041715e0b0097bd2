//! What must hold in the maps at every moment, for any concurrent connect: each frontend's
//! backend range lies inside the array and holds backends of the frontend's family, its port
//! is in the frontend filter, and its backend set is named in the metadata (`violations`);
//! and no write touches a range a frontend uses (`overwrites_used_range`). Tests, golden files
//! and the fuzz target check them around every single write.

use crate::dataplane::{
    abi::{backend_addr, service_addr},
    maps::{MapSnapshot, MapWrite},
};

/// The write-order rule, checked before a write: a backend range is written only while no
/// frontend points into it. Returns what the write would break.
pub fn overwrites_used_range(snap: &MapSnapshot, write: &MapWrite) -> Option<String> {
    let MapWrite::PutBackends { base, backends } = write else {
        return None;
    };
    let (start, end) = (u64::from(*base), u64::from(*base) + backends.len() as u64);
    snap.frontends.iter().find_map(|(key, fe)| {
        let (s, e) = (u64::from(fe.base), u64::from(fe.base) + u64::from(fe.count));
        (fe.count > 0 && start < e && s < end).then(|| {
            let name = service_addr(key).map_or_else(|| format!("{key:?}"), |a| a.to_string());
            format!("`{write}` overwrites {s}..{e}, which frontend {name} uses")
        })
    })
}

/// Returns every violation found (empty when the maps are consistent).
pub fn violations(snap: &MapSnapshot, backends_capacity: u32) -> Vec<String> {
    let mut out = Vec::new();
    for (key, fe) in &snap.frontends {
        let name = service_addr(key).map_or_else(|| format!("{key:?}"), |a| a.to_string());
        let end = u64::from(fe.base) + u64::from(fe.count);
        if end > u64::from(backends_capacity) {
            out.push(format!(
                "frontend {name} (service {}) range {}+{} is outside the array",
                fe.service_id, fe.base, fe.count
            ));
            continue;
        }
        for i in 0..u32::from(fe.count) {
            match snap.backends.get(fe.base + i) {
                Some(b) if b.family == key.family && backend_addr(&b).is_some() => {
                    let udp = key.protocol == lb_common::PROTOCOL_UDP;
                    let port = u16::from_be(b.port_be);
                    if !snap.backend_port_bit(udp, port) {
                        out.push(format!(
                            "frontend {name} slot {i}: backend port {port} missing from the reverse bitmap"
                        ));
                    }
                }
                Some(b) => out.push(format!(
                    "frontend {name} slot {i}: backend of family {} for a frontend of family {}",
                    b.family, key.family
                )),
                None => out.push(format!(
                    "frontend {name} (service {}) slot {i} (index {}) holds no backend",
                    fe.service_id,
                    fe.base + i
                )),
            }
        }
        if !snap.filter_bit(key) {
            out.push(format!("frontend {name}: missing from the frontend filter"));
        }
        if !snap.meta.contains_key(&fe.service_id) {
            out.push(format!(
                "frontend {name}: service {} has no metadata",
                fe.service_id
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use lb_common::{Backend, Frontend, FrontendKey};

    use super::*;

    #[test]
    fn a_write_into_a_range_in_use_is_named_and_one_beside_it_is_not() {
        let mut snap = MapSnapshot::default();
        snap.frontends.insert(
            FrontendKey::default(),
            Frontend {
                base: 4,
                count: 2,
                ..Frontend::default()
            },
        );
        let put = |base| MapWrite::PutBackends {
            base,
            backends: vec![Backend::default(); 2],
        };
        assert!(overwrites_used_range(&snap, &put(5)).is_some());
        assert!(overwrites_used_range(&snap, &put(3)).is_some());
        assert_eq!(overwrites_used_range(&snap, &put(6)), None);
        assert_eq!(overwrites_used_range(&snap, &put(2)), None);
    }
}
