//! Shared copies of strings that repeat across a cluster's endpoints (node and zone names,
//! targetRef kinds and namespaces): a few hundred distinct values for hundreds of thousands of
//! endpoints. The table forgets strings nobody else holds any more, so object churn cannot grow
//! it without bound: whenever it has doubled since the last sweep, unshared entries are dropped
//! (amortised constant time per call).
use std::{
    collections::HashSet,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

struct Table {
    strings: HashSet<Arc<str>>,
    /// Size at which the next sweep runs.
    sweep_at: usize,
}

const MIN_SWEEP: usize = 1024;

fn table() -> std::sync::MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            Mutex::new(Table {
                strings: HashSet::new(),
                sweep_at: MIN_SWEEP,
            })
        })
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The one shared copy of `s`.
pub(super) fn intern(s: &str) -> Arc<str> {
    let mut table = table();
    if let Some(shared) = table.strings.get(s) {
        return Arc::clone(shared);
    }
    if table.strings.len() >= table.sweep_at {
        table.strings.retain(|s| Arc::strong_count(s) > 1);
        table.sweep_at = (table.strings.len() * 2).max(MIN_SWEEP);
    }
    let shared: Arc<str> = Arc::from(s);
    table.strings.insert(Arc::clone(&shared));
    shared
}

/// Strings the table holds now.
#[cfg(test)]
pub(super) fn interned() -> usize {
    table().strings.len()
}

#[cfg(test)]
mod tests {
    #[test]
    fn equal_strings_share_one_copy() {
        let a = super::intern("node-a");
        let b = super::intern(&String::from("node-a"));
        assert!(std::sync::Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn churn_does_not_grow_the_table_without_bound() {
        for round in 0..50 {
            let held: Vec<_> = (0..1000)
                .map(|i| super::intern(&format!("churn-{round}-{i}")))
                .collect();
            drop(held);
        }
        // 50,000 distinct strings went through; only a bounded number may remain.
        assert!(
            super::interned() < 5_000,
            "{} strings kept",
            super::interned()
        );
    }
}
