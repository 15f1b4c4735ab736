//! The pending pods of one workload cluster, kept up to date by its pod watch: the set of pods that
//! would trigger provisioning right now, and a wake-up for the provisioning loop whenever a pod
//! joins it. This is what makes provisioning event-driven (performance.md B4): the loop sleeps until
//! the watch says something is new instead of scanning the pod cache on a timer.
//!
//! It also remembers when the cache first held each pod's mark (the process's monotonic clock):
//! the start of the hub's own share of a pod's wait (`karpenter_hub_pod_provisioning_latency_seconds`).
//!
//! Owns: the set and its notification. Must not: decide anything (the provisioning loop and the
//! batch window do) or hold pods (only their UIDs).

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, PoisonError},
    time::Instant,
};

use kube::runtime::watcher;
use scheduling::CompactPod;
use scheduling::convert::triggers_provisioning;
use tokio::sync::Notify;

/// The UIDs of the pods waiting for capacity, maintained from watch events.
#[derive(Debug, Default)]
pub struct PendingPods {
    state: Mutex<State>,
    joined: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Each pending pod, with when the cache first held it pending.
    pending: HashMap<String, Instant>,
    /// A relist in progress: the new set being built (the old one stays valid until it is done).
    relist: Option<HashSet<String>>,
    /// Bumped whenever a pod joins the set.
    version: u64,
}

impl PendingPods {
    /// Apply one event of the pod watch (after the reflector stored it).
    pub fn observe(&self, event: &watcher::Event<CompactPod>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let joined = match event {
            watcher::Event::Apply(pod) => s.update(pod),
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    s.pending.remove(uid);
                }
                false
            }
            watcher::Event::Init => {
                s.relist = Some(HashSet::new());
                false
            }
            watcher::Event::InitApply(pod) => {
                if let (Some(set), Some(uid)) = (s.relist.as_mut(), pod.metadata.uid.as_deref())
                    && triggers_provisioning(pod)
                {
                    set.insert(uid.to_string());
                }
                false
            }
            watcher::Event::InitDone => match s.relist.take() {
                Some(set) => {
                    let joined = set.iter().any(|u| !s.pending.contains_key(u));
                    // A pod still pending keeps the instant it was first seen so.
                    let now = Instant::now();
                    s.pending = set
                        .into_iter()
                        .map(|u| {
                            let since = s.pending.get(&u).copied().unwrap_or(now);
                            (u, since)
                        })
                        .collect();
                    joined
                }
                None => false,
            },
        };
        if joined {
            s.version = s.version.wrapping_add(1);
            drop(s);
            self.joined.notify_one();
        }
    }

    /// The pods waiting now.
    pub fn snapshot(&self) -> HashSet<String> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).pending.keys().cloned().collect()
    }

    /// When the cache first held each of `uids` pending, for those still pending.
    pub fn since<'a>(&self, uids: impl IntoIterator<Item = &'a str>) -> Vec<Instant> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        uids.into_iter().filter_map(|u| s.pending.get(u).copied()).collect()
    }

    /// How many pods wait now.
    pub fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).pending.len()
    }

    /// Whether no pod waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves when a pod joins the set after the last call (one consumer: the provisioning loop;
    /// a join while nobody waits is remembered, so none is missed).
    pub async fn joined(&self) {
        self.joined.notified().await;
    }
}

impl State {
    /// Returns whether the pod joined the set.
    fn update(&mut self, pod: &CompactPod) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else { return false };
        if triggers_provisioning(pod) {
            if self.pending.contains_key(uid) {
                return false;
            }
            self.pending.insert(uid.to_string(), Instant::now());
            true
        } else {
            self.pending.remove(uid);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;

    fn pod(uid: &str, unschedulable: bool, node: Option<&str>) -> CompactPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c"}], "nodeName": node},
            "status": {"phase": "Pending", "conditions": if unschedulable {
                serde_json::json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])
            } else { serde_json::json!([]) }},
        }))
        .unwrap()
    }

    async fn woken(p: &PendingPods) -> bool {
        tokio::time::timeout(Duration::from_millis(50), p.joined()).await.is_ok()
    }

    #[tokio::test]
    async fn a_pod_marked_unschedulable_joins_and_wakes_and_leaves_when_bound_or_deleted() {
        let p = PendingPods::default();
        p.observe(&watcher::Event::Apply(pod("a", false, None)));
        assert!(p.is_empty(), "not yet refused by the scheduler");
        assert!(!woken(&p).await);
        p.observe(&watcher::Event::Apply(pod("a", true, None)));
        assert_eq!(p.snapshot(), HashSet::from(["a".to_string()]));
        assert!(woken(&p).await);
        let first = p.since(["a", "z"]);
        assert_eq!(first.len(), 1, "only the pods pending");
        // A status update of a pod already waiting is not news, and keeps when it was first seen.
        p.observe(&watcher::Event::Apply(pod("a", true, None)));
        assert!(!woken(&p).await);
        assert_eq!(p.since(["a"]), first);
        p.observe(&watcher::Event::Init);
        p.observe(&watcher::Event::InitApply(pod("a", true, None)));
        p.observe(&watcher::Event::InitDone);
        assert_eq!(p.since(["a"]), first, "a relist keeps it too");
        p.observe(&watcher::Event::Apply(pod("a", true, Some("n1"))));
        assert!(p.is_empty(), "bound");
        p.observe(&watcher::Event::Apply(pod("b", true, None)));
        p.observe(&watcher::Event::Delete(pod("b", true, None)));
        assert!(p.is_empty(), "deleted");
    }

    #[tokio::test]
    async fn a_relist_replaces_the_set_and_wakes_only_for_pods_new_to_it() {
        let p = PendingPods::default();
        p.observe(&watcher::Event::Apply(pod("a", true, None)));
        assert!(woken(&p).await);
        p.observe(&watcher::Event::Init);
        p.observe(&watcher::Event::InitApply(pod("a", true, None)));
        assert_eq!(p.len(), 1, "the old set holds until the relist is done");
        p.observe(&watcher::Event::InitDone);
        assert!(!woken(&p).await, "nothing new");
        p.observe(&watcher::Event::Init);
        p.observe(&watcher::Event::InitApply(pod("b", true, None)));
        p.observe(&watcher::Event::InitDone);
        assert_eq!(p.snapshot(), HashSet::from(["b".to_string()]), "a went while the watch was down");
        assert!(woken(&p).await);
    }
}
