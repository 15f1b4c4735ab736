//! Change counters of the watch caches: kube's reflector `Store` keeps no revision, so each watch
//! tells one of these about every event it applied, and a loop that built something from the
//! stores can tell, by comparing two [`Stamp`]s, that nothing it read has changed since.
//!
//! A workload cluster's caches share one counter (any change of any kind moves it); the management
//! cache counts per namespace, so that a claim written in one tenant's namespace does not make
//! every cluster's loop rebuild, plus once for cluster-scoped objects and relists, which may
//! concern any namespace.
//!
//! Owns: the counting. Must not: hold objects, or say what a change means (the callers decide
//! what a moved stamp makes them do again).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use kube::runtime::{reflector::Lookup, watcher::Event};

/// Distinguishes the counters of two caches (a reconnection makes new ones, which count from zero).
static EPOCHS: AtomicU64 = AtomicU64::new(1);

/// The change counters of one set of caches. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct Changes {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    epoch: u64,
    /// Every change of every kind.
    all: AtomicU64,
    /// Changes that may concern any namespace: cluster-scoped objects, relists.
    wide: AtomicU64,
    /// Per namespace, when counted so ([`Changes::per_namespace`]).
    namespaces: Option<Mutex<HashMap<String, u64>>>,
}

impl Changes {
    fn with(namespaces: bool) -> Self {
        Changes {
            inner: Arc::new(Inner {
                epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
                all: AtomicU64::new(0),
                wide: AtomicU64::new(0),
                namespaces: namespaces.then(Mutex::default),
            }),
        }
    }

    /// Counters for caches read as a whole (a workload cluster's).
    pub fn new() -> Self {
        Self::with(false)
    }

    /// Counters that also count per namespace (the management cache, read a namespace at a time).
    pub fn per_namespace() -> Self {
        Self::with(true)
    }

    /// Counts one event a watch applied to its store: an object added, changed or deleted, or a
    /// (re)list completed (whatever happened while the watch was down). The listing's own events
    /// are not counted one by one: its end is.
    pub fn observe<K: Lookup<DynamicType = ()>>(&self, event: &Event<K>) {
        match event {
            Event::Apply(o) | Event::Delete(o) => self.bump(o.namespace().as_deref()),
            Event::InitDone => self.bump(None),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    fn bump(&self, namespace: Option<&str>) {
        let inner = &self.inner;
        inner.all.fetch_add(1, Ordering::Release);
        match (namespace, &inner.namespaces) {
            (Some(ns), Some(map)) => {
                let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
                // Namespaces are few and long-lived in a management cluster: the map is not pruned.
                *map.entry(ns.to_string()).or_default() += 1;
            }
            // Cluster-scoped, a relist, or caches not counted per namespace.
            _ => {
                inner.wide.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Where every cache stands now.
    pub fn stamp(&self) -> Stamp {
        let inner = &self.inner;
        Stamp { epoch: inner.epoch, wide: inner.all.load(Ordering::Acquire), namespace: 0 }
    }

    /// Where what a reader of `namespace` sees stands now: that namespace's objects, cluster-scoped
    /// ones and relists (not other namespaces' changes).
    pub fn stamp_of(&self, namespace: &str) -> Stamp {
        let inner = &self.inner;
        let Some(map) = &inner.namespaces else { return self.stamp() };
        // Read before the namespace's count: a change landing between the two reads is either in
        // both or shows at the next stamp.
        let wide = inner.wide.load(Ordering::Acquire);
        let namespace = map.lock().unwrap_or_else(PoisonError::into_inner).get(namespace).copied().unwrap_or(0);
        Stamp { epoch: inner.epoch, wide, namespace }
    }
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a set of caches stood: two equal stamps of the same caches mean no event was applied in
/// between (to what the stamp covers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    epoch: u64,
    wide: u64,
    namespace: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::ObjectMeta;

    fn cm(ns: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some("x".into()), namespace: Some(ns.into()), ..ObjectMeta::default() },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn every_applied_change_moves_the_stamp_and_the_listing_counts_once() {
        let c = Changes::new();
        let s0 = c.stamp();
        c.observe(&Event::<ConfigMap>::Init);
        c.observe(&Event::InitApply(cm("a")));
        assert_eq!(c.stamp(), s0, "a listing in progress is not a change yet");
        c.observe(&Event::<ConfigMap>::InitDone);
        let s1 = c.stamp();
        assert_ne!(s1, s0);
        c.observe(&Event::Apply(cm("a")));
        let s2 = c.stamp();
        assert_ne!(s2, s1);
        c.observe(&Event::Delete(cm("b")));
        assert_ne!(c.stamp(), s2);
        assert_eq!(c.stamp(), c.stamp(), "reading changes nothing");
    }

    #[test]
    fn a_namespace_reader_sees_its_namespace_cluster_scoped_objects_and_relists_only() {
        let c = Changes::per_namespace();
        let (a0, b0) = (c.stamp_of("a"), c.stamp_of("b"));
        c.observe(&Event::Apply(cm("a")));
        assert_ne!(c.stamp_of("a"), a0);
        assert_eq!(c.stamp_of("b"), b0, "another namespace's change");
        let (a1, b1) = (c.stamp_of("a"), c.stamp_of("b"));
        let ns = Namespace {
            metadata: ObjectMeta { name: Some("n".into()), ..ObjectMeta::default() },
            ..Default::default()
        };
        c.observe(&Event::Apply(ns));
        assert!(c.stamp_of("a") != a1 && c.stamp_of("b") != b1, "a cluster-scoped object concerns everyone");
        let (a2, b2) = (c.stamp_of("a"), c.stamp_of("b"));
        c.observe(&Event::<ConfigMap>::InitDone);
        assert!(c.stamp_of("a") != a2 && c.stamp_of("b") != b2, "a relist concerns everyone");
    }

    #[test]
    fn two_caches_never_share_a_stamp() {
        let (a, b) = (Changes::new(), Changes::new());
        assert_ne!(a.stamp(), b.stamp(), "a reconnection's new caches count from zero again");
    }
}
