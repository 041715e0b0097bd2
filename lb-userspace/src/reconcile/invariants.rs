//! What must hold in the maps at every moment, for any concurrent connect: each frontend's
//! backend range lies inside the array and holds backends of the frontend's family, its port
//! is in the frontend port bitmap, and its backend set is named in the metadata. Tests check it
//! after every single write.
use lb_common::ports;

use crate::dataplane::{
    abi::{backend_addr, service_addr},
    maps::MapSnapshot,
};

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
            match snap.backends.get(&(fe.base + i)) {
                Some(b) if b.family == key.family && backend_addr(b).is_some() => {
                    let udp = key.protocol == lb_common::PROTOCOL_UDP;
                    let port = u16::from_be(b.port_be);
                    if !snap.port_bit(ports::BACKEND, udp, port) {
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
        let port = u16::from_be(key.port_be);
        if !snap.port_bit(
            ports::FRONTEND,
            key.protocol == lb_common::PROTOCOL_UDP,
            port,
        ) {
            out.push(format!(
                "frontend {name}: port {port} missing from the port bitmap"
            ));
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
