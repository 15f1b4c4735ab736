//! Order-independent fingerprints of cache contents: each item hashed alone and the hashes added,
//! so the order a watch cache returns its objects in does not matter and nothing is allocated per
//! item. Used to tell "nothing a decision reads has changed" (provisioning's node set, the
//! disruption loop's consolidated state).
//!
//! Owns: the hashing. Must not: decide what goes into a fingerprint (the callers do).

use std::hash::{Hash, Hasher};

/// The hash of one item.
pub fn one(item: impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    item.hash(&mut h);
    h.finish()
}

/// A fingerprint of an unordered set of items.
pub fn of<T: Hash>(items: impl IntoIterator<Item = T>) -> u64 {
    sum(items.into_iter().map(one))
}

/// The fingerprint of items hashed by [`one`] (for sets mixing kinds of items).
pub fn sum(hashes: impl IntoIterator<Item = u64>) -> u64 {
    hashes.into_iter().fold(0, u64::wrapping_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_order() {
        assert_eq!(of(["a", "b"]), of(["b", "a"]));
        assert_ne!(of(["a", "b"]), of(["a", "c"]));
        assert_eq!(of(["a", "b"]), sum([one("a"), one("b")]));
    }
}
