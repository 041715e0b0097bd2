//! Shared copies of strings that repeat across a cluster's endpoints (node and zone names):
//! a few hundred distinct values for hundreds of thousands of endpoints.
use std::{
    collections::HashSet,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

/// The one shared copy of `s`.
pub fn intern(s: &str) -> Arc<str> {
    static TABLE: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(shared) = table.get(s) {
        return Arc::clone(shared);
    }
    let shared: Arc<str> = Arc::from(s);
    table.insert(Arc::clone(&shared));
    shared
}

#[cfg(test)]
mod tests {
    #[test]
    fn equal_strings_share_one_copy() {
        let a = super::intern("node-a");
        let b = super::intern(&String::from("node-a"));
        assert!(std::sync::Arc::ptr_eq(&a, &b));
    }
}
