//! What must hold in the maps at every moment, for any concurrent connect: each frontend's
//! slots `1..=count` exist and name existing backends of the frontend's family. Tests check it
//! after every single write.
use lb_common::SlotKey;

use crate::dataplane::maps::MapSnapshot;

/// Returns every violation found (empty when the maps are consistent).
pub fn violations(snap: &MapSnapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (key, fe) in &snap.frontends {
        for slot in 1..=u32::from(fe.count) {
            let slot_key = SlotKey {
                service_id: fe.service_id,
                slot,
            };
            let Some(backend_id) = snap.slots.get(&slot_key) else {
                out.push(format!(
                    "frontend {key:?} (service {}, count {}) has no slot {slot}",
                    fe.service_id, fe.count
                ));
                continue;
            };
            match snap.backends.get(backend_id) {
                None => out.push(format!(
                    "service {} slot {slot} names missing backend {backend_id}",
                    fe.service_id
                )),
                Some(b) if b.family != key.family => out.push(format!(
                    "service {} slot {slot}: backend {backend_id} is family {}, frontend family {}",
                    fe.service_id, b.family, key.family
                )),
                Some(_) => {}
            }
        }
    }
    out
}
