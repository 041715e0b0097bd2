//! A set kept as a sorted vector: for the many small sets the agent holds per Service (its
//! slices, its service ports, a service id's frontends, an address's claimants). A `BTreeSet`
//! allocates a whole node (room for 11) even for one element; at 10,000 Services that costs
//! megabytes. Most of these sets hold one element for good, so one is held inline, without an
//! allocation of its own.
use smallvec::SmallVec;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[serde(bound(
    serialize = "T: serde::Serialize",
    deserialize = "T: serde::Deserialize<'de>"
))]
pub struct VecSet<T>(SmallVec<[T; 1]>);

impl<T> Default for VecSet<T> {
    fn default() -> Self {
        Self(SmallVec::new())
    }
}

impl<T: Ord> VecSet<T> {
    /// Adds `value`; returns false if it was there.
    pub fn insert(&mut self, value: T) -> bool {
        match self.0.binary_search(&value) {
            Ok(_) => false,
            Err(i) => {
                self.0.insert(i, value);
                true
            }
        }
    }

    /// Removes `value`; returns whether it was there.
    pub fn remove(&mut self, value: &T) -> bool {
        match self.0.binary_search(value) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, value: &T) -> bool {
        self.0.binary_search(value).is_ok()
    }

    /// The smallest element.
    pub fn first(&self) -> Option<&T> {
        self.0.first()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// Keeps only the elements `keep` accepts (in place: the order stays sorted).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.0.retain(|v| keep(v));
    }
}

impl<T: Ord> FromIterator<T> for VecSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut v: SmallVec<[T; 1]> = iter.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        v.shrink_to_fit();
        Self(v)
    }
}

impl<T> IntoIterator for VecSet<T> {
    type Item = T;
    type IntoIter = smallvec::IntoIter<[T; 1]>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a VecSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::VecSet;

    #[test]
    fn behaves_like_a_set() {
        let mut s: VecSet<u32> = [3, 1, 3].into_iter().collect();
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), [1, 3]);
        assert!(s.insert(2));
        assert!(!s.insert(2));
        assert!(s.contains(&2));
        assert!(s.remove(&1));
        assert!(!s.remove(&1));
        assert_eq!(s.len(), 2);
        assert!(!s.is_empty());
        // One element takes no allocation: the set is its own size, whatever it holds.
        let one: VecSet<u64> = [7].into_iter().collect();
        assert!(!one.0.spilled());
        assert_eq!(std::mem::size_of::<VecSet<u64>>(), 24);
        let mut s: VecSet<u64> = [5, 9].into_iter().collect();
        s.remove(&9);
        s.retain(|_| true);
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), [5]);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            "[5]",
            "JSON as a list, as before"
        );
    }
}
