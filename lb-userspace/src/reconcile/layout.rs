//! Where each backend sits in a service's slots. Backends that stay keep their slot (so session
//! affinity and UDP stickiness survive unrelated changes); new ones fill the holes left by
//! removed ones; if more left than came, the last slots move into the remaining holes.
use std::{collections::BTreeSet, net::SocketAddr};

/// `old` is what slots `1..=count` hold now (`None` where a slot is unusable); `desired` the
/// backends wanted. Returns the new contents of slots `1..=len`.
pub(super) fn layout(old: &[Option<SocketAddr>], desired: &[SocketAddr]) -> Vec<SocketAddr> {
    // A new set, or one that did not change (most of a full sync): the desired order as it is.
    if old.is_empty() || old.iter().copied().eq(desired.iter().copied().map(Some)) {
        return desired.to_vec();
    }
    let want: BTreeSet<SocketAddr> = desired.iter().copied().collect();
    let mut seen = BTreeSet::new();
    let mut slots: Vec<Option<SocketAddr>> = old
        .iter()
        .map(|a| a.filter(|a| want.contains(a) && seen.insert(*a)))
        .collect();
    let mut additions = desired.iter().copied().filter(|a| !seen.contains(a));
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match additions.next() {
            Some(a) => *slot = Some(a),
            None => break,
        }
    }
    slots.extend(additions.map(Some));
    loop {
        while slots.last() == Some(&None) {
            slots.pop();
        }
        let Some(hole) = slots.iter().position(Option::is_none) else {
            break;
        };
        let last = slots.pop().flatten();
        slots[hole] = last;
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, n], 80))
    }

    #[test]
    fn staying_backends_keep_their_slots() {
        let old = [Some(a(1)), Some(a(2)), Some(a(3))];
        assert_eq!(layout(&old, &[a(1), a(3), a(4)]), vec![a(1), a(4), a(3)]);
    }

    #[test]
    fn shrinking_moves_the_last_into_the_hole() {
        let old = [Some(a(1)), Some(a(2)), Some(a(3))];
        assert_eq!(layout(&old, &[a(1), a(3)]), vec![a(1), a(3)]);
        assert_eq!(layout(&old, &[a(2), a(3)]), vec![a(3), a(2)]);
        assert_eq!(layout(&old, &[]), Vec::<SocketAddr>::new());
    }

    #[test]
    fn growing_appends_and_unusable_slots_are_refilled() {
        assert_eq!(layout(&[], &[a(2), a(1)]), vec![a(2), a(1)]);
        let same = [Some(a(2)), Some(a(1))];
        assert_eq!(layout(&same, &[a(2), a(1)]), vec![a(2), a(1)]);
        assert_eq!(layout(&same, &[a(1), a(2)]), vec![a(2), a(1)]);
        let old = [None, Some(a(2)), Some(a(2))];
        assert_eq!(layout(&old, &[a(2), a(5)]), vec![a(5), a(2)]);
    }
}
