//! The current Services and EndpointSlices, indexed so that a change to one object names the
//! one Service whose translation it affects.
use std::{
    collections::{BTreeMap, btree_map::Entry},
    sync::Arc,
};

use smallvec::SmallVec;

use super::{EndpointSlice, ManifestObject, ObjectKey, Service};
use crate::hashing::{FastMap, FastSet};

#[derive(Clone, Debug, Default)]
pub struct Store {
    services: BTreeMap<ObjectKey, Arc<Service>>,
    slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// Service key → the slices labelled with it, in key order (the Service need not exist):
    /// a translation reads them without a search of `slices` each. Up to two inline (most
    /// Services have one or two slices), without an allocation of their own.
    slices_by_service: FastMap<ObjectKey, SmallVec<[Arc<EndpointSlice>; 2]>>,
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a Service; returns the Service key whose translation changed.
    pub fn upsert_service(&mut self, svc: Service) -> ObjectKey {
        let key = svc.key.clone();
        self.services.insert(key.clone(), Arc::new(svc));
        key
    }

    pub fn remove_service(&mut self, key: &ObjectKey) -> Option<ObjectKey> {
        self.services.remove(key).map(|_| key.clone())
    }

    /// Adds or replaces a slice; returns the Service keys whose translation changed (the old
    /// owner too, if the slice's service label moved).
    pub fn upsert_slice(&mut self, slice: EndpointSlice) -> Vec<ObjectKey> {
        let slice = Arc::new(slice);
        // One search of the slices: the insert hands back the slice it replaces.
        let old = self.slices.insert(slice.key.clone(), Arc::clone(&slice));
        self.reindex(&slice, old.and_then(|o| o.service.clone()))
    }

    /// Files `slice` under its Service in the index, and out of `old`'s (its former Service);
    /// returns both (once).
    fn reindex(&mut self, slice: &Arc<EndpointSlice>, old: Option<ObjectKey>) -> Vec<ObjectKey> {
        let mut affected = Vec::with_capacity(2);
        let new = slice.service.as_ref();
        if let Some(old) = old {
            if new != Some(&old) {
                self.unindex(&old, &slice.key);
            }
            affected.push(old);
        }
        if let Some(new) = new {
            let list = self.slices_by_service.entry(new.clone()).or_default();
            match list.binary_search_by(|s| s.key.cmp(&slice.key)) {
                Ok(i) => list[i] = Arc::clone(slice),
                Err(i) => list.insert(i, Arc::clone(slice)),
            }
            if !affected.contains(new) {
                affected.push(new.clone());
            }
        }
        affected
    }

    /// Takes the slice `key` out of `owner`'s list.
    fn unindex(&mut self, owner: &ObjectKey, key: &ObjectKey) {
        if let Some(list) = self.slices_by_service.get_mut(owner) {
            list.retain(|s| s.key != *key);
            if list.is_empty() {
                self.slices_by_service.remove(owner);
            }
        }
    }

    pub fn remove_slice(&mut self, key: &ObjectKey) -> Vec<ObjectKey> {
        let Some(old) = self.slices.remove(key) else {
            return Vec::new();
        };
        let Some(owner) = old.service.clone() else {
            return Vec::new();
        };
        self.unindex(&owner, key);
        vec![owner]
    }

    /// Replaces all Services with a complete listing (keeping those in `keep`); returns the
    /// Service keys that changed.
    pub fn replace_services(
        &mut self,
        services: Vec<Service>,
        keep: &[ObjectKey],
    ) -> Vec<ObjectKey> {
        if self.services.is_empty() {
            // A first listing, built in one go: full B-tree nodes, where inserts in key order
            // (the API's) leave them half full.
            self.services = services
                .into_iter()
                .map(|s| (s.key.clone(), Arc::new(s)))
                .collect();
            return self.services.keys().cloned().collect();
        }
        let mut affected = Vec::new();
        for key in gone(&self.services, services.iter().map(|s| &s.key), keep) {
            affected.extend(self.remove_service(&key));
        }
        for svc in services {
            // One search: an unchanged Service is left as it is.
            match self.services.entry(svc.key.clone()) {
                Entry::Occupied(e) if **e.get() == svc => {}
                Entry::Occupied(mut e) => {
                    e.insert(Arc::new(svc));
                    affected.push(e.key().clone());
                }
                Entry::Vacant(e) => {
                    affected.push(e.key().clone());
                    e.insert(Arc::new(svc));
                }
            }
        }
        affected
    }

    /// Replaces all EndpointSlices with a complete listing (keeping those in `keep`); returns
    /// the Service keys affected.
    pub fn replace_slices(
        &mut self,
        slices: Vec<EndpointSlice>,
        keep: &[ObjectKey],
    ) -> Vec<ObjectKey> {
        if self.slices.is_empty() {
            // A first listing, built in one go (as Services').
            self.slices = slices
                .into_iter()
                .map(|s| (s.key.clone(), Arc::new(s)))
                .collect();
            let listed: Vec<Arc<EndpointSlice>> = self.slices.values().cloned().collect();
            return listed
                .iter()
                .flat_map(|slice| self.reindex(slice, None))
                .collect();
        }
        let mut affected = Vec::new();
        for key in gone(&self.slices, slices.iter().map(|s| &s.key), keep) {
            affected.extend(self.remove_slice(&key));
        }
        for slice in slices {
            // One search: an unchanged slice is left as it is.
            let (slice, old) = match self.slices.entry(slice.key.clone()) {
                Entry::Occupied(e) if **e.get() == slice => continue,
                Entry::Occupied(mut e) => {
                    let slice = Arc::new(slice);
                    let old = e.insert(Arc::clone(&slice));
                    (slice, old.service.clone())
                }
                Entry::Vacant(e) => (Arc::clone(e.insert(Arc::new(slice))), None),
            };
            affected.extend(self.reindex(&slice, old));
        }
        affected
    }

    pub fn service(&self, key: &ObjectKey) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    pub fn slice(&self, key: &ObjectKey) -> Option<&Arc<EndpointSlice>> {
        self.slices.get(key)
    }

    pub fn slices(&self) -> impl Iterator<Item = &Arc<EndpointSlice>> {
        self.slices.values()
    }

    /// The slices labelled for this Service, in name order.
    pub fn slices_of(&self, service: &ObjectKey) -> Vec<&EndpointSlice> {
        self.slices_by_service
            .get(service)
            .map(|list| list.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }
}

/// The Services and EndpointSlices of parsed manifests (Nodes are not the store's business).
/// The keys of `map` that are neither listed nor kept (none when the map is empty: the first
/// listing builds no set of what it lists).
fn gone<'a, V>(
    map: &BTreeMap<ObjectKey, V>,
    listed: impl Iterator<Item = &'a ObjectKey>,
    keep: &[ObjectKey],
) -> Vec<ObjectKey> {
    if map.is_empty() {
        return Vec::new();
    }
    let mut present: FastSet<&ObjectKey> = listed.collect();
    present.extend(keep);
    map.keys()
        .filter(|k| !present.contains(k))
        .cloned()
        .collect()
}

impl FromIterator<ManifestObject> for Store {
    fn from_iter<I: IntoIterator<Item = ManifestObject>>(objects: I) -> Self {
        let mut store = Self::new();
        for object in objects {
            match object {
                ManifestObject::Service(s) => {
                    store.upsert_service(*s);
                }
                ManifestObject::EndpointSlice(s) => {
                    store.upsert_slice(*s);
                }
                ManifestObject::Node(_) => {}
            }
        }
        store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::AddressType, vocab::Family};

    fn slice(name: &str, service: Option<&str>) -> EndpointSlice {
        EndpointSlice {
            key: ObjectKey::new("ns", name),
            resource_version: "".into(),
            service: service.map(|s| ObjectKey::new("ns", s)),
            address_type: AddressType::Ip(Family::IPv4),
            endpoints: Box::default(),
            target_names: Box::default(),
            ports: Box::default(),
            proxy_name: None,
            headless_label: false,
            notes: Box::default(),
            last_change_trigger_ms: None,
        }
    }

    fn names(store: &Store, service: &str) -> Vec<String> {
        store
            .slices_of(&ObjectKey::new("ns", service))
            .iter()
            .map(|s| s.key.name.to_string())
            .collect()
    }

    #[test]
    fn a_slice_that_changes_service_affects_both_and_is_listed_under_the_new_one() {
        let mut store = Store::new();
        let key = |s: &str| ObjectKey::new("ns", s);
        assert_eq!(store.upsert_slice(slice("s1", Some("a"))), vec![key("a")]);
        assert_eq!(store.upsert_slice(slice("s2", Some("a"))), vec![key("a")]);
        // The same owner again: only it is affected, and the slice is listed once.
        assert_eq!(store.upsert_slice(slice("s1", Some("a"))), vec![key("a")]);
        assert_eq!(names(&store, "a"), ["s1", "s2"]);
        // Moved to another Service: both are affected.
        assert_eq!(
            store.upsert_slice(slice("s1", Some("b"))),
            vec![key("a"), key("b")]
        );
        assert_eq!(names(&store, "a"), ["s2"]);
        assert_eq!(names(&store, "b"), ["s1"]);
        // Its label removed: only the former owner.
        assert_eq!(store.upsert_slice(slice("s1", None)), vec![key("b")]);
        assert!(names(&store, "b").is_empty());
        assert_eq!(store.remove_slice(&key("s2")), vec![key("a")]);
        assert!(names(&store, "a").is_empty());
        assert_eq!(store.slice_count(), 1);
    }

    #[test]
    fn a_listing_names_what_it_changed_removed_or_added_and_keeps_what_it_is_told() {
        let mut store = Store::new();
        let key = |s: &str| ObjectKey::new("ns", s);
        let first = vec![slice("s1", Some("a")), slice("s2", Some("b"))];
        assert_eq!(store.replace_slices(first, &[]), vec![key("a"), key("b")]);
        // s1 unchanged, s2 gone, s3 new; s4 (not listed) kept.
        store.upsert_slice(slice("s4", Some("d")));
        let mut changed = slice("s5", Some("e"));
        changed.resource_version = "2".into();
        let second = vec![slice("s1", Some("a")), slice("s3", Some("c")), changed];
        let mut affected = store.replace_slices(second, &[key("s4")]);
        affected.sort();
        assert_eq!(affected, vec![key("b"), key("c"), key("e")]);
        assert_eq!(store.slice_count(), 4);
        assert!(names(&store, "b").is_empty());
        assert_eq!(names(&store, "d"), ["s4"]);
        // A listed slice that changed is replaced and names its Service.
        let mut again = slice("s5", Some("e"));
        again.resource_version = "3".into();
        let all = vec![
            slice("s1", Some("a")),
            slice("s3", Some("c")),
            slice("s4", Some("d")),
            again,
        ];
        assert_eq!(store.replace_slices(all, &[]), vec![key("e")]);
        // The Service's list holds the slice as it is now, not as it was.
        let listed = store.slices_of(&key("e"));
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].resource_version.to_string(), "3");
        let mut moved = slice("s5", Some("e"));
        moved.resource_version = "4".into();
        store.upsert_slice(moved);
        assert_eq!(
            store.slices_of(&key("e"))[0].resource_version.to_string(),
            "4"
        );
    }

    #[test]
    fn a_first_listing_in_any_order_is_indexed_as_upserts_would_index_it() {
        let key = |s: &str| ObjectKey::new("ns", s);
        let listing = vec![
            slice("s3", Some("a")),
            slice("s2", Some("b")),
            slice("s1", Some("a")),
            slice("s0", None),
        ];
        let mut listed = Store::new();
        let mut affected = listed.replace_slices(listing.clone(), &[]);
        affected.sort();
        affected.dedup();
        assert_eq!(affected, vec![key("a"), key("b")]);
        let mut upserted = Store::new();
        for s in listing {
            upserted.upsert_slice(s);
        }
        for svc in ["a", "b", "c"] {
            assert_eq!(names(&listed, svc), names(&upserted, svc), "{svc}");
        }
        assert_eq!(names(&listed, "a"), ["s1", "s3"]);
        assert_eq!(listed.slice_count(), 4);
        assert!(
            listed
                .slices()
                .map(|s| &s.key)
                .eq(upserted.slices().map(|s| &s.key))
        );
    }
}
