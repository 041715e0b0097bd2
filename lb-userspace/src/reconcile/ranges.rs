//! Ranges of the backend array. A backend set's range is never written while a frontend may
//! use it: a changed set gets a fresh range, its frontends flip to it, and the old range waits
//! out a grace period before it can be handed out again, so a connect that read the old
//! frontend just before the flip still finds its backends.
use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

/// How long a released range stays untouched. A program runs for microseconds; this is far
/// longer than any run that may still hold the old frontend.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Ranges {
    capacity: u32,
    /// Free extents: start → length, coalesced.
    free: BTreeMap<u32, u32>,
    /// Released extents and when they may be reused.
    waiting: VecDeque<(Instant, u32, u32)>,
    grace: Duration,
}

/// No free extent is long enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRange {
    pub wanted: u32,
    pub free: u32,
    pub waiting: u32,
}

impl Ranges {
    pub fn new(capacity: u32, grace: Duration) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self {
            capacity,
            free,
            waiting: VecDeque::new(),
            grace,
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// How long a released range waits before reuse.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Marks `[start, start + len)` used (a range adopted from pinned maps). Returns false if
    /// part of it was not free (two frontends disagree; the caller rewrites that set).
    pub fn reserve(&mut self, start: u32, len: u32) -> bool {
        if len == 0 {
            return true;
        }
        let end = u64::from(start) + u64::from(len);
        let Some((&fs, &fl)) = self.free.range(..=start).next_back() else {
            return false;
        };
        let fend = u64::from(fs) + u64::from(fl);
        if end > fend {
            return false;
        }
        self.free.remove(&fs);
        if start > fs {
            self.free.insert(fs, start - fs);
        }
        if end < fend {
            self.free.insert(end as u32, (fend - end) as u32);
        }
        true
    }

    /// A range of `len` entries (best fit), after returning ranges whose grace has passed.
    pub fn alloc(&mut self, len: u32, now: Instant) -> Result<u32, NoRange> {
        self.expire(now);
        if len == 0 {
            return Ok(0);
        }
        let best = self
            .free
            .iter()
            .filter(|(_, l)| **l >= len)
            .min_by_key(|(s, l)| (**l, **s))
            .map(|(s, l)| (*s, *l));
        let Some((start, flen)) = best else {
            return Err(NoRange {
                wanted: len,
                free: self.free_len(),
                waiting: self.waiting.iter().map(|(_, _, l)| *l).sum(),
            });
        };
        self.free.remove(&start);
        if flen > len {
            self.free.insert(start + len, flen - len);
        }
        Ok(start)
    }

    /// Returns a range that frontends may still have been reading: usable after the grace.
    pub fn release(&mut self, start: u32, len: u32, now: Instant) {
        if len > 0 {
            self.waiting.push_back((now + self.grace, start, len));
        }
    }

    /// Returns a range no frontend ever pointed at: usable at once.
    pub fn free_now(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let mut start = start;
        let mut len = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back()
            && ps + pl == start
        {
            self.free.remove(&ps);
            start = ps;
            len += pl;
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(due, start, len)) = self.waiting.front() {
            if due > now {
                break;
            }
            self.waiting.pop_front();
            self.free_now(start, len);
        }
    }

    /// Returns every released range at once: for after a program barrier (no program can
    /// still read them).
    pub fn reclaim_waiting(&mut self) {
        while let Some((_, start, len)) = self.waiting.pop_front() {
            self.free_now(start, len);
        }
    }

    /// Keeps free only what `before` had free too: the rest of what is free here waits out the
    /// grace period from `now`, since `before` may have had a frontend point into it a moment
    /// ago (a range in use or waiting there).
    pub fn hold_unless_free_in(&mut self, before: &Ranges, now: Instant) {
        let due = now + self.grace;
        for (start, len) in std::mem::take(&mut self.free) {
            let end = u64::from(start) + u64::from(len);
            let mut at = u64::from(start);
            for (&bs, &bl) in before.free.range(..=(end - 1) as u32) {
                let (s, e) = (
                    u64::from(bs).max(at),
                    (u64::from(bs) + u64::from(bl)).min(end),
                );
                if s >= e {
                    continue;
                }
                if s > at {
                    self.waiting.push_back((due, at as u32, (s - at) as u32));
                }
                self.free_now(s as u32, (e - s) as u32);
                at = e;
            }
            if at < end {
                self.waiting.push_back((due, at as u32, (end - at) as u32));
            }
        }
    }

    pub fn free_len(&self) -> u32 {
        self.free.values().sum()
    }

    pub fn waiting_len(&self) -> u32 {
        self.waiting.iter().map(|(_, _, l)| *l).sum()
    }

    /// Whether `[start, start + len)` is free or waiting (used by invariant checks in tests).
    pub fn is_unused(&self, start: u32, len: u32) -> bool {
        let end = u64::from(start) + u64::from(len);
        let inside =
            |s: u32, l: u32| u64::from(s) <= u64::from(start) && end <= u64::from(s) + u64::from(l);
        self.free.iter().any(|(s, l)| inside(*s, *l))
            || self.waiting.iter().any(|(_, s, l)| inside(*s, *l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_ranges_wait_out_the_grace_period() {
        let t0 = Instant::now();
        let mut r = Ranges::new(10, Duration::from_secs(1));
        let a = r.alloc(6, t0).unwrap();
        let b = r.alloc(4, t0).unwrap();
        assert_ne!(a, b);
        r.release(a, 6, t0);
        assert_eq!(
            r.alloc(6, t0 + Duration::from_millis(500)),
            Err(NoRange {
                wanted: 6,
                free: 0,
                waiting: 6
            })
        );
        assert_eq!(r.alloc(6, t0 + Duration::from_secs(1)), Ok(a));
    }

    #[test]
    fn freed_neighbours_coalesce_and_adoption_splits() {
        let t0 = Instant::now();
        let mut r = Ranges::new(100, Duration::ZERO);
        assert!(r.reserve(10, 5));
        assert!(!r.reserve(12, 5), "overlaps the reserved range");
        let a = r.alloc(10, t0).unwrap();
        assert_eq!(a, 0);
        r.free_now(10, 5);
        r.free_now(0, 10);
        assert_eq!(r.alloc(100, t0), Ok(0));
    }
}
