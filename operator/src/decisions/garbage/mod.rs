//! Garbage-collection decisions (clever-cloud.md §3.8, hub.md §5), in both directions: NodeGroups
//! whose NodeClaim is gone, and launched claims whose NodeGroup vanished before registration.
//!
//! Owns: the pure rules — which objects are candidates from cached state, and the final verdict
//! once the caller has re-read the object live — and, in `sweep`, the plan of one whole sweep
//! built on them ([`plan_sweep`]); [`crate::controllers::gc`] does the reads and deletes. Must not:
//! do I/O or read the clock. The rules
//! never answer "collect" unless the cluster is connected and synced ([`ClusterView::may_collect`]).
//! Missing data is never evidence of absence: every "unknown" answer keeps the object.

mod sweep;

pub use sweep::{
    Candidate, Gauges, Halt, Judgement, Reap, Report, StuckNode, SweepFacts, SweepPlan, VanishRead, VanishedClaim,
    claim_facts, claim_to_read, plan_sweep, vanish_candidates,
};

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::decisions::ownership::{Owner, Ownership, prove};
use crds::nodegroup::NodeGroup;

/// Minimum age before anything is collected: a group in its first upstream reconcile, or a claim
/// that was just launched, is not yet evidence of a leak.
pub const MIN_AGE: Duration = Duration::from_secs(120);

/// Default period of the safety sweep that looks for leaks the watches did not show.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(120);

/// The brake on deletions (hub.md §5): a leak is a handful of groups, so a sweep that finds a
/// large share of a cluster's groups orphaned is far likelier to be looking at the wrong data (a
/// management cluster restored without its NodeClaims, another install's groups, a cache gone
/// wrong) than at a real leak, and deleting them would remove a fleet's nodes in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Brake {
    /// At most this many groups deleted per cluster per sweep; the rest wait for the next sweep.
    pub max_per_sweep: usize,
    /// A sweep that would delete more than this percentage of the cluster's groups carrying this
    /// hub's labels (and more than one group) deletes none, and says so (100: never halt).
    pub halt_percent: u8,
}

impl Default for Brake {
    fn default() -> Self {
        Self { max_per_sweep: 10, halt_percent: 50 }
    }
}

/// What the brake lets a sweep do with `collectable` orphans among `labelled` groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrakeVerdict {
    /// Delete the first `now` of them (all of them, or up to the per-sweep cap).
    Proceed { now: usize },
    /// Delete none: `would` of `of` labelled groups look orphaned, more than the brake allows.
    Halt { would: usize, of: usize },
}

impl Brake {
    /// Pure: the verdict for one sweep of one cluster.
    pub fn judge(self, collectable: usize, labelled: usize) -> BrakeVerdict {
        let labelled = labelled.max(collectable);
        // A single orphan is always collectable: the harm of a mistake is one node, and a cluster
        // whose only group leaked must not keep it forever.
        if self.halt_percent < 100 && collectable > 1 && collectable * 100 > labelled * usize::from(self.halt_percent) {
            return BrakeVerdict::Halt { would: collectable, of: labelled };
        }
        BrakeVerdict::Proceed { now: collectable.min(self.max_per_sweep.max(1)) }
    }
}

/// What the caller knows about the cluster when a sweep starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterView {
    pub connected: bool,
    /// Every watch listed and synced since the last (re)connect or Secret rotation.
    pub synced: bool,
    /// The last list of NodeGroups and NodeClaims succeeded.
    pub lists_ok: bool,
    /// Objects younger than this are never collected ([`MIN_AGE`] unless configured).
    pub min_age: Duration,
}

impl ClusterView {
    pub fn may_collect(self) -> bool {
        self.connected && self.synced && self.lists_ok
    }
}

/// A live (uncached) read of the NodeClaim a group points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveClaim {
    Absent,
    Present {
        uid: String,
    },
    /// The read failed: nothing is known.
    Unknown,
}

/// A live (uncached) read of a NodeGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveGroup {
    Absent,
    Present,
    Unknown,
}

/// The outcome for one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Delete it (for a group: with a UID precondition on the group just read).
    Collect { why: String },
    /// Leave it; nothing to report.
    Keep,
    /// Leave it and report it: it carries our labels but fails a proof (event
    /// `GarbageCollectionRefused`, gauge).
    Refuse { why: String },
    /// A group moved from the declared source management cluster whose claim came across (UID
    /// `claim_uid` here): re-stamp it as ours ([`crate::decisions::handover::restamp`]).
    Restamp { claim_uid: String },
}

/// Groups worth a live check: owned (or refused, to be reported), not terminating, old enough, and
/// whose claim the cache does not hold with the same UID. `cached_claim_uid(name)` answers from the
/// management cluster's cache.
pub fn orphan_candidates<'a>(
    view: ClusterView,
    groups: &'a [NodeGroup],
    owner: Owner<'_>,
    namespace: &str,
    now: Timestamp,
    cached_claim_uid: impl Fn(&str) -> Option<String>,
) -> Vec<(&'a NodeGroup, Ownership)> {
    if !view.may_collect() {
        return Vec::new();
    }
    groups
        .iter()
        .filter(|g| {
            !g.is_terminating() && old_enough(g.metadata.creation_timestamp.as_ref().map(|t| t.0), now, view.min_age)
        })
        .filter_map(|g| match prove(g, owner, namespace) {
            Ownership::Foreign => None,
            Ownership::Owned { claim, uid } | Ownership::Legacy { claim, uid }
                if cached_claim_uid(&claim).as_deref() == Some(uid.as_str()) =>
            {
                None
            }
            o => Some((g, o)),
        })
        .collect()
}

/// The verdict on an orphan candidate, from the ownership re-checked on the group as just re-read
/// and the live read of its claim.
pub fn judge_orphan(view: ClusterView, ownership: &Ownership, claim: &LiveClaim) -> Verdict {
    if !view.may_collect() {
        return Verdict::Keep;
    }
    match (ownership, claim) {
        (Ownership::Foreign, _) => Verdict::Keep,
        (Ownership::Refused(why), _) => Verdict::Refuse { why: why.clone() },
        // Made before management-cluster identities, and its claim is not here (by name and UID):
        // it may be another management cluster's hub's on the same hub id. Never deleted.
        (Ownership::Legacy { uid, .. }, LiveClaim::Present { uid: live }) if live == uid => Verdict::Keep,
        (Ownership::Legacy { claim, .. }, LiveClaim::Absent | LiveClaim::Present { .. }) => Verdict::Refuse {
            why: format!(
                "it was made before NodeGroups named their management cluster (no label {}) and its NodeClaim {claim} is not this management cluster's: it may belong to another management cluster's hub with the same hub id",
                crds::labels::MANAGEMENT_CLUSTER
            ),
        },
        (Ownership::Legacy { .. }, LiveClaim::Unknown) => Verdict::Keep,
        (Ownership::Owned { .. }, LiveClaim::Unknown) => Verdict::Keep,
        (Ownership::Owned { claim, .. }, LiveClaim::Absent) => {
            Verdict::Collect { why: format!("its NodeClaim {claim} no longer exists") }
        }
        (Ownership::Owned { claim, uid }, LiveClaim::Present { uid: live }) if live != uid => Verdict::Collect {
            why: format!("NodeClaim {claim} was recreated (UID {live}, the group was made for {uid})"),
        },
        (Ownership::Owned { .. }, LiveClaim::Present { .. }) => Verdict::Keep,
        // Moved from the declared source: its claim came across (by name), or has not yet (kept:
        // the copy may be under way; never evidence of a leak).
        (Ownership::Moved { .. }, LiveClaim::Present { uid }) if !uid.is_empty() => {
            Verdict::Restamp { claim_uid: uid.clone() }
        }
        (Ownership::Moved { .. }, _) => Verdict::Keep,
    }
}

/// What the caller knows of a claim for the vanished-launch direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFacts {
    pub deleting: bool,
    pub launched: bool,
    pub registered: bool,
    /// `nodeClassRef` names a `CleverNodeClass` (claims of other providers are never ours to judge).
    pub clever: bool,
    pub created: Option<Timestamp>,
}

/// Claims worth a live check of their group: launched, not registered, not deleting, old enough.
pub fn is_vanish_candidate(view: ClusterView, claim: &ClaimFacts, now: Timestamp) -> bool {
    view.may_collect()
        && claim.clever
        && !claim.deleting
        && claim.launched
        && !claim.registered
        && old_enough(claim.created, now, view.min_age)
}

/// The verdict on a vanish candidate once its group has been read live.
pub fn judge_vanished(view: ClusterView, group: &LiveGroup) -> Verdict {
    match (view.may_collect(), group) {
        (true, LiveGroup::Absent) => {
            Verdict::Collect { why: "its NodeGroup vanished before the node registered".to_string() }
        }
        _ => Verdict::Keep,
    }
}

fn old_enough(created: Option<Timestamp>, now: Timestamp, min_age: Duration) -> bool {
    // No creation time means an object we cannot date: never old enough.
    created.is_some_and(|c| now.duration_since(c).as_secs() >= min_age.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::decisions::ownership::ClaimIdentity;
    use crds::nodegroup::NodeGroupSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    const ME: Owner<'static> = Owner { hub_id: "default", management_cluster: "mgmt-1", moved_from: None };

    const OK: ClusterView = ClusterView { connected: true, synced: true, lists_ok: true, min_age: MIN_AGE };

    fn now() -> Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    fn group(claim: &str, age_secs: i64) -> NodeGroup {
        let id = ClaimIdentity {
            hub_id: "default",
            management_cluster: "mgmt-1",
            namespace: "ns",
            claim,
            claim_uid: "uid-1",
            nodepool: "p",
            nodeclass: "c",
        };
        NodeGroup {
            metadata: ObjectMeta {
                name: Some(id.nodegroup_name()),
                labels: Some(id.labels()),
                annotations: Some(id.annotations("h")),
                creation_timestamp: Some(Time(now() - k8s_openapi::jiff::SignedDuration::from_secs(age_secs))),
                ..ObjectMeta::default()
            },
            spec: NodeGroupSpec { flavor: "M".into(), node_count: 1, labels: None, taints: None },
            status: None,
        }
    }

    #[test]
    fn nothing_is_a_candidate_unless_the_cluster_is_connected_synced_and_listed() {
        let groups = [group("a", 600)];
        for view in [
            ClusterView { connected: false, ..OK },
            ClusterView { synced: false, ..OK },
            ClusterView { lists_ok: false, ..OK },
        ] {
            assert!(orphan_candidates(view, &groups, ME, "ns", now(), |_| None).is_empty());
            let owned = Ownership::Owned { claim: "a".into(), uid: "uid-1".into() };
            assert_eq!(judge_orphan(view, &owned, &LiveClaim::Absent), Verdict::Keep);
            assert_eq!(judge_vanished(view, &LiveGroup::Absent), Verdict::Keep);
        }
        assert_eq!(orphan_candidates(OK, &groups, ME, "ns", now(), |_| None).len(), 1);
    }

    #[test]
    fn young_live_foreign_and_terminating_groups_are_not_candidates() {
        let young = group("a", 60);
        let live = group("b", 600);
        let mut terminating = group("c", 600);
        terminating.metadata.deletion_timestamp = Some(Time(now()));
        let groups = [young, live, terminating, group("d", 600)];
        let got = orphan_candidates(OK, &groups, ME, "ns", now(), |c| (c == "b").then(|| "uid-1".to_string()));
        let names: Vec<_> = got.iter().map(|(g, _)| g.metadata.name.clone().unwrap()).collect();
        assert_eq!(names.len(), 1);
        assert!(names[0].starts_with("d-"));
        assert!(orphan_candidates(OK, &groups, Owner { hub_id: "other", ..ME }, "ns", now(), |_| None).is_empty());
        assert!(orphan_candidates(OK, &groups, ME, "other-ns", now(), |_| None).is_empty());
    }

    #[test]
    fn only_a_confirmed_absence_or_a_new_uid_collects() {
        let owned = Ownership::Owned { claim: "a".into(), uid: "uid-1".into() };
        assert!(matches!(judge_orphan(OK, &owned, &LiveClaim::Absent), Verdict::Collect { .. }));
        assert!(matches!(
            judge_orphan(OK, &owned, &LiveClaim::Present { uid: "uid-2".into() }),
            Verdict::Collect { why } if why.contains("recreated")
        ));
        assert_eq!(judge_orphan(OK, &owned, &LiveClaim::Present { uid: "uid-1".into() }), Verdict::Keep);
        assert_eq!(judge_orphan(OK, &owned, &LiveClaim::Unknown), Verdict::Keep);
        let refused = Ownership::Refused("no uid".into());
        assert!(matches!(judge_orphan(OK, &refused, &LiveClaim::Absent), Verdict::Refuse { .. }));
    }

    #[test]
    fn a_moved_group_is_restamped_once_its_claim_came_across_and_never_collected() {
        let mut moved = group("a", 600);
        moved.metadata.labels.as_mut().unwrap().insert(crds::labels::MANAGEMENT_CLUSTER.into(), "mgmt-0".into());
        let me = ME.moved_from(Some("mgmt-0"));
        let found = orphan_candidates(OK, std::slice::from_ref(&moved), me, "ns", now(), |_| Some("uid-new".into()));
        assert_eq!(found.len(), 1, "a moved group is judged even when its claim is cached");
        let proof = &found[0].1;
        assert_eq!(
            judge_orphan(OK, proof, &LiveClaim::Present { uid: "uid-new".into() }),
            Verdict::Restamp { claim_uid: "uid-new".into() }
        );
        assert_eq!(judge_orphan(OK, proof, &LiveClaim::Absent), Verdict::Keep, "the copy may be under way");
        assert_eq!(judge_orphan(OK, proof, &LiveClaim::Unknown), Verdict::Keep);
        assert!(
            orphan_candidates(OK, std::slice::from_ref(&moved), ME, "ns", now(), |_| None).is_empty(),
            "undeclared: foreign"
        );
    }

    #[test]
    fn vanished_launches_need_age_launch_without_registration_and_a_live_absence() {
        let claim = ClaimFacts {
            deleting: false,
            launched: true,
            registered: false,
            clever: true,
            created: Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(300)),
        };
        assert!(is_vanish_candidate(OK, &claim, now()));
        assert!(!is_vanish_candidate(OK, &ClaimFacts { registered: true, ..claim.clone() }, now()));
        assert!(!is_vanish_candidate(OK, &ClaimFacts { deleting: true, ..claim.clone() }, now()));
        assert!(!is_vanish_candidate(OK, &ClaimFacts { clever: false, ..claim.clone() }, now()));
        assert!(!is_vanish_candidate(OK, &ClaimFacts { created: None, ..claim.clone() }, now()));
        assert!(!is_vanish_candidate(
            OK,
            &ClaimFacts { created: Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(30)), ..claim },
            now()
        ));
        assert!(matches!(judge_vanished(OK, &LiveGroup::Absent), Verdict::Collect { .. }));
        assert_eq!(judge_vanished(OK, &LiveGroup::Present), Verdict::Keep);
        assert_eq!(judge_vanished(OK, &LiveGroup::Unknown), Verdict::Keep);
    }

    #[test]
    fn another_management_cluster_s_groups_are_never_candidates() {
        let mut theirs = group("a", 600);
        theirs.metadata.labels.as_mut().unwrap().insert(crds::labels::MANAGEMENT_CLUSTER.into(), "mgmt-2".into());
        assert!(orphan_candidates(OK, &[theirs], ME, "ns", now(), |_| None).is_empty());
    }

    #[test]
    fn legacy_groups_are_their_claim_s_when_the_uid_says_so_and_otherwise_reported_never_collected() {
        let mut legacy = group("a", 600);
        legacy.metadata.labels.as_mut().unwrap().remove(crds::labels::MANAGEMENT_CLUSTER);
        let groups = [legacy];
        // Its claim is here with its UID: its claim's, not a candidate.
        let here = |c: &str| (c == "a").then(|| "uid-1".to_string());
        assert!(orphan_candidates(OK, &groups, ME, "ns", now(), here).is_empty());
        // Orphaned: a candidate, but reported, never collected.
        let got = orphan_candidates(OK, &groups, ME, "ns", now(), |_| None);
        assert_eq!(got.len(), 1);
        let proof = &got[0].1;
        assert!(matches!(proof, Ownership::Legacy { .. }));
        for live in [LiveClaim::Absent, LiveClaim::Present { uid: "uid-9".into() }] {
            assert!(
                matches!(judge_orphan(OK, proof, &live), Verdict::Refuse { why } if why.contains("another management cluster"))
            );
        }
        assert_eq!(judge_orphan(OK, proof, &LiveClaim::Present { uid: "uid-1".into() }), Verdict::Keep);
        assert_eq!(judge_orphan(OK, proof, &LiveClaim::Unknown), Verdict::Keep);
    }

    #[test]
    fn the_brake_caps_a_sweep_and_halts_one_that_would_delete_most_of_a_cluster() {
        let brake = Brake::default();
        // A leak: a few of many.
        assert_eq!(brake.judge(0, 20), BrakeVerdict::Proceed { now: 0 });
        assert_eq!(brake.judge(3, 20), BrakeVerdict::Proceed { now: 3 });
        // One orphan is always collectable, even the only group.
        assert_eq!(brake.judge(1, 1), BrakeVerdict::Proceed { now: 1 });
        // Exactly half is allowed, more is not.
        assert_eq!(brake.judge(2, 4), BrakeVerdict::Proceed { now: 2 });
        assert_eq!(brake.judge(3, 4), BrakeVerdict::Halt { would: 3, of: 4 });
        // The incident: three groups, all of them orphaned at once.
        assert_eq!(brake.judge(3, 3), BrakeVerdict::Halt { would: 3, of: 3 });
        // A miscount never makes the share look smaller than it is.
        assert_eq!(brake.judge(3, 0), BrakeVerdict::Halt { would: 3, of: 3 });
        // The cap: many orphans among very many groups go a sweep at a time.
        assert_eq!(brake.judge(40, 200), BrakeVerdict::Proceed { now: 10 });
        assert_eq!(Brake { max_per_sweep: 0, ..brake }.judge(5, 200), BrakeVerdict::Proceed { now: 1 });
        // 100 % never halts.
        assert_eq!(Brake { halt_percent: 100, ..brake }.judge(3, 3), BrakeVerdict::Proceed { now: 3 });
    }
}
