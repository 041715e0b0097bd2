//! Shared copies of values that repeat across a cluster's endpoints (node and zone names,
//! targetRef kinds and namespaces, topology hints): a few hundred distinct values for hundreds
//! of thousands of endpoints. A table forgets values nobody else holds any more, so object churn
//! cannot grow it without bound: whenever it has doubled since the last sweep, unshared entries
//! are dropped (amortised constant time per call).
use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::Hash,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

struct Table<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Size at which the next sweep runs.
    sweep_at: usize,
}

const MIN_SWEEP: usize = 1024;

/// One table of shared values of type `T`, for a `static`.
pub(super) struct Interner<T: ?Sized>(OnceLock<Mutex<Table<T>>>);

impl<T: ?Sized + Hash + Eq> Interner<T> {
    pub(super) const fn new() -> Self {
        Self(OnceLock::new())
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table<T>> {
        self.0
            .get_or_init(|| {
                Mutex::new(Table {
                    values: HashSet::new(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The one shared copy of `value` (`make` makes it when there is none yet).
    pub(super) fn get<Q>(&self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Q: ?Sized + Hash + Eq,
        Arc<T>: Borrow<Q>,
    {
        let mut table = self.table();
        if let Some(shared) = table.values.get(value) {
            return Arc::clone(shared);
        }
        if table.values.len() >= table.sweep_at {
            table.values.retain(|v| Arc::strong_count(v) > 1);
            table.sweep_at = (table.values.len() * 2).max(MIN_SWEEP);
        }
        let shared = make(value);
        table.values.insert(Arc::clone(&shared));
        shared
    }

    /// Values the table holds now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.table().values.len()
    }
}

static STRINGS: Interner<str> = Interner::new();

/// The one shared copy of `s`.
pub(super) fn intern(s: &str) -> Arc<str> {
    STRINGS.get(s, |s| Arc::from(s))
}

#[cfg(test)]
mod tests {
    use super::STRINGS;

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
        assert!(STRINGS.len() < 5_000, "{} strings kept", STRINGS.len());
    }
}
