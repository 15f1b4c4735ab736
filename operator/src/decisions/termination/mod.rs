//! Termination (karpenter-semantics §5): what a leaving node's drain does next, decided from plain
//! facts. The NodeClaim controller (`crate::controllers::nodeclaim`) gathers the facts (the node's pods, the
//! claim's deadline annotation, when draining began, now), calls [`drain::decide`] and carries out
//! the writes: evictions, forced deletions, the `Drained` condition, then the NodeGroup deletion.
//!
//! Owns: the drain order (§5.3), which pods block and which are left alone (§5.5), forced deletion
//! at the deadline and its grace period (§5.4), when a drain is complete, when to look again, the
//! eviction back-off and the deadline written on deletion (§5.1.1), when a Node is not drained at
//! all (NotReady, NodeGroup gone: [`must_drain`]) and when a claim expires ([`expiration`], §4.1).
//! Must not: do I/O, read a clock (time is passed in), or decide anything about NodeGroups (the
//! ownership proof stays in `crate::decisions::ownership`).

pub mod drain;
pub mod expiration;

use std::time::Duration;

use crds::admission::schedule::DurationError;
use k8s_openapi::{
    api::core::v1::Node,
    jiff::{self, SignedDuration, Timestamp},
};

pub use drain::{Decision, Owner, PodFacts, PodRef, Skip, Wait, decide};
pub use expiration::{ExpireAfterError, Expiry};

/// Condition on the NodeClaim: drain finished (True) or under way (Unknown, reason `Draining`).
pub const DRAINED: &str = "Drained";
/// Reason of `Drained=Unknown` while pods are being evicted.
pub const DRAINING: &str = "Draining";
/// Value of the load-balancer exclusion label a leaving node gets.
pub const EXCLUDE_FROM_LB_VALUE: &str = "karpenter";
/// Event on the Node while pods are left that could not be evicted this pass.
pub const FAILED_DRAINING: &str = "FailedDraining";
/// Event on the pod's node for each successful eviction.
pub const EVICTED: &str = "Evicted";
/// Event on a claim released without a drain: its Node is NotReady and its NodeGroup is gone.
pub const DRAIN_SKIPPED: &str = "DrainSkipped";

/// A drain is never complete sooner than this after it began: pods bound just before the taint was
/// seen get the time to show up (§5.2.5).
pub const MIN_DRAIN: Duration = Duration::from_secs(5);
/// How often a drain with pods left is looked at again.
pub const DRAIN_REQUEUE: Duration = Duration::from_secs(1);
/// A pod terminating for longer than this no longer holds the drain up (§5.5, "drainable").
pub const STUCK_TERMINATING: Duration = Duration::from_secs(60);
/// Grace period of a pod without `terminationGracePeriodSeconds` (the Kubernetes default).
pub const DEFAULT_POD_GRACE: i64 = 30;

/// Why no deadline can be computed from a claim's `terminationGracePeriod`; the message is the
/// `InvalidTerminationGracePeriod` event's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeadlineError {
    /// Not a Go duration.
    #[error(transparent)]
    Unparsable(#[from] DurationError),
    /// More seconds than a signed duration holds.
    #[error("terminationGracePeriod {tgp:?} is too large")]
    TooLarge {
        /// The grace period as written.
        tgp: String,
    },
    /// The deadline would be past the latest representable time.
    #[error("terminationGracePeriod {tgp:?} goes past the representable time: {why}")]
    PastRepresentable {
        /// The grace period as written.
        tgp: String,
        /// What the time arithmetic said.
        why: jiff::Error,
    },
}

// By hand: `jiff::Error` has no `PartialEq`; its message stands in for it.
impl PartialEq for DeadlineError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Unparsable(a), Self::Unparsable(b)) => a == b,
            (Self::TooLarge { tgp: a }, Self::TooLarge { tgp: b }) => a == b,
            (Self::PastRepresentable { tgp: a, why: x }, Self::PastRepresentable { tgp: b, why: y }) => {
                a == b && x.to_string() == y.to_string()
            }
            _ => false,
        }
    }
}

/// The deadline to write on a claim being deleted (§5.1.1): `deletionTimestamp +
/// terminationGracePeriod`, or `None` when there is nothing to write: no grace period, a deadline
/// already written (never rewritten), or no deletion yet. An unparsable grace period is an error
/// naming the value.
pub fn deadline_to_write(
    deletion: Option<Timestamp>,
    termination_grace_period: Option<&str>,
    existing_annotation: Option<&str>,
) -> Result<Option<Timestamp>, DeadlineError> {
    if existing_annotation.is_some() {
        return Ok(None);
    }
    let (Some(deleted), Some(tgp)) = (deletion, termination_grace_period) else {
        return Ok(None);
    };
    let seconds = crds::admission::schedule::parse_duration(tgp, false)?.unwrap_or_default();
    let seconds = i64::try_from(seconds).map_err(|_| DeadlineError::TooLarge { tgp: tgp.to_string() })?;
    deleted
        .checked_add(SignedDuration::from_secs(seconds))
        .map(Some)
        .map_err(|why| DeadlineError::PastRepresentable { tgp: tgp.to_string(), why })
}

/// The deadline the claim carries, if its annotation parses (an unparsable one counts as none, as
/// Karpenter reads it).
pub fn parse_deadline(annotation: Option<&str>) -> Option<Timestamp> {
    annotation.and_then(|a| a.parse::<Timestamp>().ok())
}

/// Back-off before evicting a pod again after a refusal (429 from a PodDisruptionBudget): 100 ms
/// doubling to 10 s (Appendix A, "eviction backoff"). `failures` counts the refusals so far (≥ 1).
pub fn eviction_backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(10);
    Duration::from_millis(100u64.saturating_mul(1 << exp)).min(Duration::from_secs(10))
}

/// The claim's NodeGroup, as the termination path read it (uncached) before draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// There, not being deleted.
    Present,
    /// There with a deletionTimestamp: the instance still runs until CKE removes it.
    Terminating,
    /// NotFound: the instance is gone.
    NotFound,
}

/// Whether a leaving claim's Node is drained (karpenter-semantics §5.2 step 2, §10.10 item 143):
/// a NotReady Node whose NodeGroup is NotFound has no instance behind it, so its pods cannot be
/// evicted gracefully and nothing would ever finish them: the claim is released at once, without
/// evictions. A Ready Node is drained whatever the group says (its pods still run and serve), and
/// a NotReady Node whose group is still there (or only terminating) is drained too: the kubelet may
/// come back, and the instance is not proven gone.
pub fn must_drain(node_ready: bool, group: GroupState) -> bool {
    node_ready || group != GroupState::NotFound
}

/// The claim condition of §5.2 step 6.
pub const VOLUMES_DETACHED: &str = "VolumesDetached";
/// Its reason while attachments remain before the deadline.
pub const AWAITING_VOLUME_DETACHMENT: &str = "AwaitingVolumeDetachment";
/// Its reason once the deadline passed with attachments left.
pub const GRACE_PERIOD_ELAPSED: &str = "TerminationGracePeriodElapsed";

/// A VolumeAttachment of the node being terminated, as the volume step reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub name: String,
    /// `spec.source.persistentVolumeName` (inline volumes have none).
    pub volume: Option<String>,
    /// The claim (namespace, name) bound to that PersistentVolume, when it could be read.
    pub claim: Option<(String, String)>,
}

/// The attachments the NodeGroup's deletion waits for (§5.2 step 6): those of a PersistentVolume,
/// except a volume still mounted by a pod the drain left on the node (a DaemonSet's or static pod's,
/// one tolerating the disrupted taint): that volume detaches with the instance, never before.
pub fn blocking_attachments<'a>(attachments: &'a [Attachment], pods_left: &[PodFacts]) -> Vec<&'a str> {
    attachments
        .iter()
        .filter(|a| a.volume.is_some())
        .filter(|a| {
            !a.claim.as_ref().is_some_and(|(ns, claim)| {
                pods_left.iter().any(|p| {
                    !p.terminal && p.deletion.is_none() && p.pod.namespace == *ns && p.claims.iter().any(|c| c == claim)
                })
            })
        })
        .map(|a| a.name.as_str())
        .collect()
}

/// A Node is Ready when its `Ready` condition is `True`; `False`, `Unknown` (the kubelet stopped
/// reporting) or no condition at all is NotReady, as Karpenter reads it.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_deadline_is_deletion_plus_the_grace_period() {
        let d = deadline_to_write(Some(ts("2026-01-01T00:00:00Z")), Some("1h30m"), None).unwrap();
        assert_eq!(d, Some(ts("2026-01-01T01:30:00Z")));
    }

    #[test]
    fn an_existing_deadline_is_never_rewritten() {
        let d = deadline_to_write(Some(ts("2026-01-01T00:00:00Z")), Some("1h"), Some("2030-01-01T00:00:00Z"));
        assert_eq!(d, Ok(None));
        // Even an unparsable one: it was written by someone, the hub does not overwrite it.
        assert_eq!(deadline_to_write(Some(ts("2026-01-01T00:00:00Z")), Some("1h"), Some("junk")), Ok(None));
    }

    #[test]
    fn no_grace_period_or_no_deletion_writes_nothing() {
        assert_eq!(deadline_to_write(Some(ts("2026-01-01T00:00:00Z")), None, None), Ok(None));
        assert_eq!(deadline_to_write(None, Some("1h"), None), Ok(None));
    }

    #[test]
    fn a_bad_grace_period_is_an_error_naming_it() {
        let e = deadline_to_write(Some(ts("2026-01-01T00:00:00Z")), Some("3 days"), None).unwrap_err();
        assert!(e.to_string().contains("3 days"), "{e}");
    }

    #[test]
    fn deadlines_parse_as_rfc3339_and_junk_counts_as_none() {
        assert_eq!(parse_deadline(Some("2026-01-01T01:00:00Z")), Some(ts("2026-01-01T01:00:00Z")));
        assert_eq!(parse_deadline(Some("tomorrow")), None);
        assert_eq!(parse_deadline(None), None);
    }

    #[test]
    fn eviction_backoff_doubles_from_100ms_to_10s() {
        let got: Vec<u64> = (1..=10).map(|n| eviction_backoff(n).as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]);
        assert_eq!(eviction_backoff(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn a_not_ready_node_whose_group_is_gone_is_released_without_a_drain() {
        use GroupState::*;
        // (node ready, group, drained?)
        let table = [
            (false, NotFound, false),
            (true, NotFound, true),
            (false, Present, true),
            (false, Terminating, true),
            (true, Present, true),
            (true, Terminating, true),
        ];
        for (ready, group, want) in table {
            assert_eq!(must_drain(ready, group), want, "ready={ready} group={group:?}");
        }
    }

    #[test]
    fn only_a_true_ready_condition_is_ready() {
        let node = |status: Option<&str>| -> Node {
            let conditions = status.map(|s| serde_json::json!([{"type": "Ready", "status": s}]));
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n"},
                "status": {"conditions": conditions.unwrap_or(serde_json::json!([]))}
            }))
            .unwrap()
        };
        assert!(node_ready(&node(Some("True"))));
        assert!(!node_ready(&node(Some("False"))));
        assert!(!node_ready(&node(Some("Unknown"))));
        assert!(!node_ready(&node(None)));
        assert!(!node_ready(&Node::default()));
    }
}
