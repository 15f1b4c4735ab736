//! One copy of each distinct pod spec across the hub's pod caches (performance.md B4, memory).
//!
//! A ReplicaSet's pods on one node have the same projected spec (the projection keeps `nodeName`,
//! so a shared spec never shows a reader another pod's node); a cluster of 1,000 pods from a few
//! templates over 50 nodes holds a few hundred specs instead of 1,000.
//!
//! Owns: one cluster's table of the specs its cached pods hold, by value (one table per pod watch,
//! so no lock and nothing shared between clusters). Must not: keep a spec alive (it holds weak
//! references, swept as the table grows) or return a spec that is not equal to the one given.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hasher},
    sync::{Arc, Weak},
};

use k8s_openapi::api::core::v1::PodSpec;

/// The specs one cluster's cached pods hold.
#[derive(Debug, Default)]
pub struct SpecTable {
    by_hash: HashMap<u64, Vec<Weak<PodSpec>>>,
    /// Weak references held; swept when it doubles since the last sweep.
    held: usize,
    after_sweep: usize,
    hasher: std::hash::RandomState,
}

/// Hashes the JSON form of a spec without building it (the k8s types do not implement `Hash`).
struct HashWriter<H>(H);

impl<H: Hasher> std::io::Write for HashWriter<H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SpecTable {
    /// The table's copy of `spec` if it holds an equal one, else `spec` itself, now in the table.
    pub fn intern(&mut self, spec: Arc<PodSpec>) -> Arc<PodSpec> {
        let mut writer = HashWriter(self.hasher.build_hasher());
        if serde_json::to_writer(&mut writer, &*spec).is_err() {
            return spec;
        }
        let bucket = self.by_hash.entry(writer.0.finish()).or_default();
        if let Some(held) = bucket.iter().filter_map(Weak::upgrade).find(|held| **held == *spec) {
            return held;
        }
        bucket.push(Arc::downgrade(&spec));
        self.held += 1;
        if self.held > 2 * self.after_sweep + 1024 {
            self.by_hash.retain(|_, bucket| {
                bucket.retain(|w| w.strong_count() > 0);
                !bucket.is_empty()
            });
            self.held = self.by_hash.values().map(Vec::len).sum();
            self.after_sweep = self.held;
        }
        spec
    }

    /// Specs held by at least one pod.
    pub fn len(&self) -> usize {
        self.by_hash.values().flatten().filter(|w| w.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(node: Option<&str>, cpu: &str) -> Arc<PodSpec> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "nodeName": node,
                "containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}}}]
            }))
            .unwrap(),
        )
    }

    #[test]
    fn equal_specs_share_one_copy_and_different_ones_do_not() {
        let mut t = SpecTable::default();
        let mut intern = |s| t.intern(s);
        let a = intern(spec(Some("n1"), "1"));
        let b = intern(spec(Some("n1"), "1"));
        assert!(Arc::ptr_eq(&a, &b));
        let other_node = intern(spec(Some("n2"), "1"));
        assert!(!Arc::ptr_eq(&a, &other_node));
        assert_eq!(other_node.node_name.as_deref(), Some("n2"));
        let other_request = intern(spec(Some("n1"), "2"));
        assert!(!Arc::ptr_eq(&a, &other_request));
    }

    #[test]
    fn the_table_does_not_keep_specs_alive() {
        let mut t = SpecTable::default();
        let a = t.intern(spec(Some("gone"), "3"));
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        // And an equal spec after that is a fresh one, not a dangling entry.
        assert!(t.is_empty());
        let b = t.intern(spec(Some("gone"), "3"));
        assert_eq!((b.node_name.as_deref(), t.len()), (Some("gone"), 1));
    }
}
