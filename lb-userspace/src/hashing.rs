//! Hash maps for the agent's own tables, keyed by names and addresses it holds by the tens of
//! thousands. The standard library's `SipHash` was 3% of a full sync's profile; foldhash is several
//! times faster and still seeded per map, so a tenant choosing Service names cannot pick
//! colliding keys ahead of time.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// An empty [`FastMap`] with room for `capacity` entries.
pub fn fast_map_with_capacity<K, V>(capacity: usize) -> FastMap<K, V> {
    FastMap::with_capacity_and_hasher(capacity, foldhash::fast::RandomState::default())
}
