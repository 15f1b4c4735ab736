//! `sim::apiserver::disruptions`: a log of every pod whose termination began, by eviction or by a
//! plain DELETE, with the PodDisruptionBudget state the server saw at that instant. Chaos tests
//! read it to tell which pod left when, how, and whether its budget allowed it: request counters
//! say how many evictions there were, not which pod or under what budget.
//!
//! Owns: the record types and the shared, bounded log. Must not: change what any request answers
//! (kube-apiserver has no such log; it is an observation point only, written under the store lock
//! so each record is consistent with the write it describes).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::lock;

/// Records kept; older ones are dropped (a long-running sandbox must not grow without bound).
const CAPACITY: usize = 100_000;

/// How a pod's termination began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// `POST pods/<name>/eviction`, admitted (the budget allowed it, or did not apply).
    Eviction,
    /// `DELETE pods/<name>` (also the kubelet stand-in's pod garbage collection of pods whose
    /// Node is gone), with the grace period the server applied.
    Delete { grace_seconds: i64 },
}

/// A PodDisruptionBudget's status as the disruption controller computes it, at the instant of
/// the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbState {
    pub name: String,
    pub disruptions_allowed: i64,
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub expected_pods: i64,
}

/// One pod whose termination began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDisruption {
    /// Position in the log (0-based, never reused, counts dropped records too).
    pub seq: u64,
    /// The server clock's time.
    pub at: DateTime<Utc>,
    /// The store's resourceVersion before the write.
    pub resource_version: u64,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`, when bound.
    pub node: Option<String>,
    /// The pod's `Ready` condition was `True`.
    pub ready: bool,
    pub via: Via,
    /// The one budget selecting the pod (`None` when none does, or several do).
    pub pdb: Option<PdbState>,
}

/// The log of one API server. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct DisruptionLog {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    records: VecDeque<PodDisruption>,
    next_seq: u64,
}

impl DisruptionLog {
    /// Appends `d`, giving it the next sequence number.
    pub(crate) fn record(&self, mut d: PodDisruption) {
        let mut inner = lock(&self.inner);
        d.seq = inner.next_seq;
        inner.next_seq += 1;
        if inner.records.len() >= CAPACITY {
            inner.records.pop_front();
        }
        inner.records.push_back(d);
    }

    /// Records with `seq >= from`, oldest first (a reader keeps the next `seq` it wants).
    pub fn since(&self, from: u64) -> Vec<PodDisruption> {
        lock(&self.inner).records.iter().filter(|d| d.seq >= from).cloned().collect()
    }

    /// Every record kept, oldest first.
    pub fn entries(&self) -> Vec<PodDisruption> {
        self.since(0)
    }

    /// Records made so far (including any dropped).
    pub fn len(&self) -> u64 {
        lock(&self.inner).next_seq
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec(name: &str) -> PodDisruption {
        PodDisruption {
            seq: 0,
            at: DateTime::<Utc>::UNIX_EPOCH,
            resource_version: 1,
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: None,
            ready: false,
            via: Via::Eviction,
            pdb: None,
        }
    }

    #[test]
    fn records_are_numbered_and_read_from_a_position() {
        let log = DisruptionLog::default();
        log.record(rec("a"));
        log.record(rec("b"));
        log.record(rec("c"));
        assert_eq!(log.len(), 3);
        let names: Vec<String> = log.since(1).into_iter().map(|d| format!("{}:{}", d.seq, d.name)).collect();
        assert_eq!(names, ["1:b", "2:c"]);
        assert!(log.since(3).is_empty());
    }
}
