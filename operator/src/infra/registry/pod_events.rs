//! Pod events of one workload cluster, kept from its pod watch (karpenter-semantics §4.1, upstream's
//! pod-events controller): a pod bound to a node, ended, or started terminating changes what its
//! node's claim says (`lastPodEventTime`, `Empty`), so the node is announced and its claim decided
//! again at once instead of at its next periodic pass. Any other pod change (readiness, status
//! messages) is no pod event and announces nothing.
//!
//! Owns: the last event state of each bound pod (two hashes per pod, not the pod) and the
//! announcement. Must not: decide anything about the claim (the claim's pass does) or hold pods.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Mutex, PoisonError},
};

use kube::runtime::watcher;
use scheduling::CompactPod;

/// A pod event on `node` of `cluster`: the claim of that node should look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePods {
    pub cluster: super::ClusterKey,
    pub node: String,
}

/// The pod-event state of each bound pod of one cluster, by a hash of its UID.
#[derive(Debug, Default)]
pub struct PodEvents {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    seen: HashMap<u64, u64>,
    /// A relist in progress: the new table being built (announcing nothing: a pod that changed
    /// while the watch was down is caught by its claim's periodic pass).
    relist: Option<HashMap<u64, u64>>,
}

impl PodEvents {
    /// Apply one event of the pod watch; returns the node whose claim should look again.
    pub fn observe(&self, event: &watcher::Event<CompactPod>) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(pod) => {
                let (key, node, state) = facts(pod)?;
                let Some(node) = node else {
                    s.seen.remove(&key);
                    return None;
                };
                (s.seen.insert(key, state) != Some(state)).then(|| node.to_string())
            }
            watcher::Event::Delete(pod) => {
                let (key, node, _) = facts(pod)?;
                s.seen.remove(&key);
                node.map(str::to_string)
            }
            watcher::Event::Init => {
                s.relist = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(pod) => {
                if let Some((key, Some(_), state)) = facts(pod)
                    && let Some(relist) = s.relist.as_mut()
                {
                    relist.insert(key, state);
                }
                None
            }
            watcher::Event::InitDone => {
                if let Some(relist) = s.relist.take() {
                    s.seen = relist;
                }
                None
            }
        }
    }

    /// How many bound pods are tracked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).seen.len()
    }

    /// Whether no bound pod is tracked.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pod's key, its node, and its event state (its node, ended, terminating) as a hash.
fn facts(pod: &CompactPod) -> Option<(u64, Option<&str>, u64)> {
    let uid = pod.metadata.uid.as_deref()?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty());
    let ended = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Some((hash(&uid), node, hash(&(node, ended, terminating))))
}

fn hash(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pod(uid: &str, node: Option<&str>, phase: &str, terminating: bool) -> CompactPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": uid, "namespace": "default", "uid": uid,
                "deletionTimestamp": terminating.then_some("2026-11-28T12:00:00Z"),
            },
            "spec": {"containers": [{"name": "c"}], "nodeName": node},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn binding_ending_and_terminating_announce_the_node_other_changes_do_not() {
        let e = PodEvents::default();
        assert_eq!(e.observe(&watcher::Event::Apply(pod("a", None, "Pending", false))), None, "not bound");
        assert_eq!(e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Pending", false))).as_deref(), Some("n1"));
        assert_eq!(
            e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Running", false))),
            None,
            "running is no pod event"
        );
        assert_eq!(e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Running", false))), None, "a resync");
        assert_eq!(
            e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Running", true))).as_deref(),
            Some("n1"),
            "terminating"
        );
        assert_eq!(
            e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Succeeded", true))).as_deref(),
            Some("n1"),
            "ended"
        );
        assert_eq!(e.observe(&watcher::Event::Delete(pod("a", Some("n1"), "Succeeded", true))).as_deref(), Some("n1"));
        assert!(e.is_empty(), "a deleted pod is forgotten");
        assert_eq!(e.observe(&watcher::Event::Delete(pod("b", None, "Pending", false))), None, "never bound");
    }

    #[test]
    fn a_relist_replaces_the_table_without_announcing() {
        let e = PodEvents::default();
        e.observe(&watcher::Event::Apply(pod("gone", Some("n1"), "Running", false)));
        e.observe(&watcher::Event::Init);
        assert_eq!(e.observe(&watcher::Event::InitApply(pod("a", Some("n2"), "Running", false))), None);
        assert_eq!(e.observe(&watcher::Event::InitApply(pod("p", None, "Pending", false))), None);
        assert_eq!(e.len(), 1, "the old table holds until the relist is done");
        e.observe(&watcher::Event::InitDone);
        assert_eq!(e.len(), 1, "only the relisted bound pod");
        assert_eq!(e.observe(&watcher::Event::Apply(pod("a", Some("n2"), "Running", false))), None, "known");
        assert_eq!(e.observe(&watcher::Event::Apply(pod("gone", Some("n1"), "Running", false))).as_deref(), Some("n1"));
    }

    #[test]
    fn a_pod_moving_to_no_node_is_forgotten_without_an_announcement() {
        let e = PodEvents::default();
        e.observe(&watcher::Event::Apply(pod("a", Some("n1"), "Running", false)));
        assert_eq!(e.observe(&watcher::Event::Apply(pod("a", None, "Pending", false))), None);
        assert!(e.is_empty());
    }
}
