//! Progressive rollout of a fleet pool's template changes (fleet.md §3): which clusters may replace
//! the pool's drifted nodes now, and how each cluster moves through `Pending → Progressing →
//! Soaking → Done` (or `Failed`, which halts the rollout).
//!
//! The revision is the pool's drift hash. A cluster is *behind* while one of the pool's nodes there
//! carries another hash; it has *finished* when none is behind, none of another hash is still being
//! deleted (a drift candidate draining) and every replacement is initialized; it *fails* when a replacement launched for the revision has not initialized within
//! [`FAILURE_AFTER`] (before the hub's registration deadline deletes the evidence), or when a
//! disruption command replacing one of its nodes for the revision was rolled back (a launch CKE
//! refused, e.g. over quota: the disruption loop records it on the candidates,
//! [`FAILURE_ANNOTATION`]).
//!
//! Owns: the phases (from the previous status, the facts and the time) and the gate the disruption
//! loop asks before drifting a node ([`may_drift`]). Must not: read the caches or the clock, or write
//! (the NodePool controller gathers the facts and writes the status; the status is the only
//! memory, so a restart or a replica hand-over resumes exactly where the rollout was).

use std::time::Duration;

use crds::{
    NodePool, drift,
    nodepool::{RolloutCluster, RolloutPhase, RolloutStatus},
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

/// A replacement launched for the revision that has not initialized after this long fails its
/// cluster (the hub deletes a claim that has not registered after 15 minutes).
pub const FAILURE_AFTER: Duration = Duration::from_secs(600);

/// On a NodeClaim: the replacement of this node for a rollout's revision failed (its disruption
/// command was rolled back). Written by the disruption loop ([`failure_record`]), read here.
pub const FAILURE_ANNOTATION: &str = "karpenter.clever-cloud.com/rollout-failure";

/// The longest [`FAILURE_ANNOTATION`] value read (the hub writes far less).
const FAILURE_RECORD_MAX: usize = 2048;

/// What [`FAILURE_ANNOTATION`] holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailureRecord {
    /// The revision whose replacement failed.
    pub revision: String,
    /// When the command was rolled back.
    pub at: Timestamp,
    /// Why, in the hub's words.
    pub why: String,
}

/// The [`FAILURE_ANNOTATION`] value for a replacement of `revision` rolled back at `at` because `why`.
pub fn failure_record(revision: &str, at: Timestamp, why: &str) -> String {
    let record = FailureRecord { revision: revision.to_string(), at, why: why.chars().take(512).collect() };
    serde_json::to_string(&record).unwrap_or_default()
}

/// The record an annotation value holds, if it is one (bounded: anyone who may patch a claim may
/// write it).
pub fn read_failure(value: &str) -> Option<FailureRecord> {
    if value.len() > FAILURE_RECORD_MAX {
        return None;
    }
    serde_json::from_str(value).ok()
}

/// What a drift command rolled back leaves on its candidate `candidate` for its pool's rollout (the
/// [`FAILURE_ANNOTATION`] value): a record when `pool` is a fleet pool with `spec.rollout` whose
/// current revision the candidate is behind (the command was replacing it for the rollout); `None`
/// otherwise.
pub fn rollback_record(
    candidate: &crds::NodeClaim,
    pool: Option<&NodePool>,
    why: &str,
    now: Timestamp,
) -> Option<String> {
    let pool = pool.filter(|p| p.is_fleet() && p.spec.rollout.is_some())?;
    let revision = drift::nodepool_hash(&pool.spec);
    stamped_revision(candidate).is_some_and(|r| r != revision).then(|| failure_record(&revision, now, why))
}

/// The template revision a claim runs: its pool hash, when stamped by this hash algorithm (a claim
/// stamped by another, or not at all, runs none the rollout knows: it is never behind).
fn stamped_revision(claim: &crds::NodeClaim) -> Option<&str> {
    let a = claim.metadata.annotations.as_ref()?;
    (a.get(drift::NODEPOOL_HASH_VERSION_ANNOTATION).map(String::as_str) == Some(drift::NODEPOOL_HASH_VERSION))
        .then(|| a.get(drift::NODEPOOL_HASH_ANNOTATION).map(String::as_str))?
}

/// The annotation that retries a failed cluster (`resume`).
pub const RESUME_ANNOTATION: &str = "karpenter.clever-cloud.com/rollout";
/// Its value.
pub const RESUME: &str = "resume";

/// One selected cluster, as the rollout sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    pub name: String,
    /// The pool's nodes there (claims not being deleted) on another revision.
    pub behind: usize,
    /// The pool's claims there on the revision that have not initialized yet.
    pub initializing: usize,
    /// The pool's claims there on another revision being deleted (a drift candidate draining): the
    /// cluster is still replacing until they are gone.
    pub leaving: usize,
    /// Why the cluster fails, if one of its replacements does (see [`FAILURE_AFTER`] and
    /// [`FAILURE_ANNOTATION`]).
    pub failure: Option<String>,
    /// When, for a failure that happened at a time (a rolled-back command): it fails the cluster
    /// only if it came after the cluster entered its phase, so a resumed cluster is judged by its
    /// new attempts. `None`: the failure holds now (a replacement still not initialized).
    pub failed_at: Option<Timestamp>,
}

/// The rollout's settings, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Clusters in `Progressing` or `Soaking` at once (at least 1).
    pub max_clusters: usize,
    pub soak: Duration,
}

impl Settings {
    /// From the pool's `spec.rollout` and the number of selected clusters; `None` when a value
    /// cannot be read (the schema refuses them): the safe reading is then one cluster at a time
    /// with the default soak.
    pub fn of(rollout: &crds::nodepool::Rollout, selected: usize) -> Settings {
        let max_clusters = match rollout.max_clusters.strip_suffix('%') {
            Some(p) => p.parse::<usize>().ok().map(|p| (selected * p).div_ceil(100)),
            None => rollout.max_clusters.parse::<usize>().ok(),
        }
        .unwrap_or(1)
        .max(1);
        let soak = crds::admission::schedule::parse_duration(&rollout.soak, false)
            .ok()
            .flatten()
            .map_or(Duration::from_secs(300), Duration::from_secs);
        Settings { max_clusters, soak }
    }
}

/// A cluster moving from one phase to another (an event each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub cluster: String,
    pub from: Option<RolloutPhase>,
    pub to: RolloutPhase,
    /// Why (the failure, for `Failed`).
    pub message: Option<String>,
}

/// The next status of the rollout of `revision` over the selected clusters `facts`, from `previous`
/// at `now`; `order` names the clusters that go first; `resume` retries the failed clusters.
pub fn advance(
    previous: Option<&RolloutStatus>,
    revision: &str,
    order: &[String],
    facts: &[ClusterFacts],
    settings: Settings,
    resume: bool,
    now: Timestamp,
) -> (RolloutStatus, Vec<Change>) {
    // A new revision starts over: every cluster's phase is judged afresh.
    let previous = previous.filter(|p| p.revision == revision);
    let mut clusters = Vec::new();
    let mut changes = Vec::new();
    let set = |entry: &mut RolloutCluster, to: RolloutPhase, message: Option<String>, changes: &mut Vec<Change>| {
        if entry.phase != to {
            changes.push(Change { cluster: entry.name.clone(), from: Some(entry.phase), to, message: message.clone() });
            entry.phase = to;
            entry.since = Time(now);
        }
        entry.message = message;
    };
    for f in facts {
        let finished = f.behind == 0 && f.initializing == 0 && f.leaving == 0;
        let before = previous.and_then(|p| p.clusters.iter().find(|c| c.name == f.name));
        let Some(before) = before else {
            let phase = if finished { RolloutPhase::Done } else { RolloutPhase::Pending };
            changes.push(Change { cluster: f.name.clone(), from: None, to: phase, message: None });
            clusters.push(RolloutCluster { name: f.name.clone(), phase, since: Time(now), message: None });
            continue;
        };
        let mut entry = before.clone();
        match entry.phase {
            RolloutPhase::Failed if resume => set(&mut entry, RolloutPhase::Pending, None, &mut changes),
            RolloutPhase::Failed => {}
            RolloutPhase::Progressing | RolloutPhase::Soaking
                if f.failure.is_some() && f.failed_at.is_none_or(|at| at >= entry.since.0) =>
            {
                set(&mut entry, RolloutPhase::Failed, f.failure.clone(), &mut changes)
            }
            RolloutPhase::Progressing if finished => set(&mut entry, RolloutPhase::Soaking, None, &mut changes),
            RolloutPhase::Progressing => {}
            RolloutPhase::Soaking if !finished => set(&mut entry, RolloutPhase::Progressing, None, &mut changes),
            RolloutPhase::Soaking => {
                let soaked = Duration::try_from(now.duration_since(entry.since.0)).unwrap_or_default();
                if soaked >= settings.soak {
                    set(&mut entry, RolloutPhase::Done, None, &mut changes);
                }
            }
            // Its old nodes went another way (emptiness, consolidation, a user): nothing to roll.
            RolloutPhase::Pending if finished => set(&mut entry, RolloutPhase::Done, None, &mut changes),
            RolloutPhase::Pending => {}
            RolloutPhase::Done if !finished && f.behind > 0 => {
                set(&mut entry, RolloutPhase::Pending, None, &mut changes)
            }
            RolloutPhase::Done => {}
        }
        clusters.push(entry);
    }
    // Start Pending clusters while there is room and nothing failed: `order` first, then by name.
    let halted = clusters.iter().any(|c| c.phase == RolloutPhase::Failed);
    let busy = |c: &RolloutCluster| matches!(c.phase, RolloutPhase::Progressing | RolloutPhase::Soaking);
    let mut room = settings.max_clusters.saturating_sub(clusters.iter().filter(|c| busy(c)).count());
    if !halted {
        let rank = |name: &str| order.iter().position(|o| o == name).unwrap_or(usize::MAX);
        let mut waiting: Vec<usize> =
            (0..clusters.len()).filter(|&i| clusters[i].phase == RolloutPhase::Pending).collect();
        waiting.sort_by(|&a, &b| {
            rank(&clusters[a].name).cmp(&rank(&clusters[b].name)).then_with(|| clusters[a].name.cmp(&clusters[b].name))
        });
        for i in waiting {
            if room == 0 {
                break;
            }
            set(&mut clusters[i], RolloutPhase::Progressing, None, &mut changes);
            room -= 1;
        }
    }
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    (RolloutStatus { revision: revision.to_string(), clusters }, changes)
}

/// Cluster `cluster`'s facts from the pool's `claims` (any cluster's; those of `cluster` are read)
/// for the rollout of `revision` at `now`. A claim stamped by another hash algorithm (or not at all)
/// is never behind: the hub never drifts it for its template.
pub fn facts_of<'a>(
    cluster: &str,
    claims: impl IntoIterator<Item = &'a crds::NodeClaim>,
    revision: &str,
    now: Timestamp,
) -> ClusterFacts {
    let mut f = ClusterFacts { name: cluster.to_string(), ..ClusterFacts::default() };
    // A replacement still not initialized holds now; a rolled-back one happened at a time.
    let mut stuck: Option<String> = None;
    let mut rolled_back: Option<(Timestamp, String)> = None;
    for c in claims {
        if c.spec.cluster_name != cluster {
            continue;
        }
        if c.metadata.deletion_timestamp.is_some() {
            // A node of an older revision still draining: its replacement is not over.
            if stamped_revision(c).is_some_and(|r| r != revision) {
                f.leaving += 1;
            }
            continue;
        }
        let name = c.metadata.name.as_deref().unwrap_or_default();
        let annotation = |k: &str| c.metadata.annotations.as_ref().and_then(|a| a.get(k)).map(String::as_str);
        if let Some(record) = annotation(FAILURE_ANNOTATION).and_then(read_failure).filter(|r| r.revision == revision)
            && rolled_back.as_ref().is_none_or(|(at, _)| record.at > *at)
        {
            let why = format!("the replacement of NodeClaim {name} was rolled back: {}", record.why);
            rolled_back = Some((record.at, why));
        }
        if stamped_revision(c).is_some_and(|r| r != revision) {
            f.behind += 1;
            continue;
        }
        let conditions = c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        if crate::decisions::conditions::is_true(conditions, "Initialized") {
            continue;
        }
        f.initializing += 1;
        let created = c.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let age = Duration::try_from(now.duration_since(created)).unwrap_or_default();
        if age >= FAILURE_AFTER && stuck.is_none() {
            stuck =
                Some(format!("NodeClaim {name} has not initialized {} min after it was created", age.as_secs() / 60));
        }
    }
    match (stuck, rolled_back) {
        (Some(why), _) => f.failure = Some(why),
        (None, Some((at, why))) => {
            f.failure = Some(why);
            f.failed_at = Some(at);
        }
        (None, None) => {}
    }
    f
}

/// The template revisions the pool's `claims` of one cluster run (those not being deleted, stamped
/// by this hash algorithm), distinct and sorted, at most eight (a status row's bound).
pub fn revisions_of<'a>(claims: impl IntoIterator<Item = &'a crds::NodeClaim>) -> Vec<String> {
    let mut out: Vec<String> = claims
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| stamped_revision(c).map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out.truncate(8);
    out
}

/// Why a rollout holds a cluster's drifted nodes back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldBack {
    #[error("the rollout of revision {revision} has not started yet")]
    NotStarted { revision: String },
    #[error("cluster {cluster} is {phase:?} in the rollout of revision {revision}")]
    NotItsTurn { cluster: String, phase: RolloutPhase, revision: String },
    #[error("cluster {cluster} is not in the rollout of revision {revision} yet")]
    NotInRollout { cluster: String, revision: String },
}

/// Whether the disruption loop may replace `pool`'s drifted nodes in `cluster` now (fleet.md §3):
/// always without `spec.rollout`; with it, only while the rollout of the pool's current revision
/// has the cluster `Progressing`. `Err` says why not. Only the template's drift (`NodePoolDrifted`)
/// is the rollout's: callers do not ask for other drift.
pub fn may_drift(pool: &NodePool, cluster: &str) -> Result<(), HeldBack> {
    if pool.spec.rollout.is_none() || !pool.is_fleet() {
        return Ok(());
    }
    let revision = drift::nodepool_hash(&pool.spec);
    let status = pool.status.as_ref().and_then(|s| s.rollout.as_ref()).filter(|r| r.revision == revision);
    let Some(status) = status else {
        return Err(HeldBack::NotStarted { revision });
    };
    let cluster = cluster.to_string();
    match status.clusters.iter().find(|c| c.name == cluster).map(|c| c.phase) {
        Some(RolloutPhase::Progressing) => Ok(()),
        Some(phase) => Err(HeldBack::NotItsTurn { cluster, phase, revision }),
        None => Err(HeldBack::NotInRollout { cluster, revision }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use RolloutPhase::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn facts(name: &str, behind: usize, initializing: usize) -> ClusterFacts {
        ClusterFacts { name: name.into(), behind, initializing, leaving: 0, failure: None, failed_at: None }
    }

    const ONE: Settings = Settings { max_clusters: 1, soak: Duration::from_secs(60) };

    fn phases(s: &RolloutStatus) -> Vec<(&str, RolloutPhase)> {
        s.clusters.iter().map(|c| (c.name.as_str(), c.phase)).collect()
    }

    #[test]
    fn one_cluster_at_a_time_in_order_then_by_name_each_soaked_before_the_next() {
        let order = vec!["canary".to_string()];
        let mut all = vec![facts("a", 2, 0), facts("b", 1, 0), facts("canary", 1, 0), facts("fresh", 0, 0)];
        let (s, changes) = advance(None, "r2", &order, &all, ONE, false, t(0));
        // A cluster with nothing behind is Done at once; the canary goes first.
        assert_eq!(phases(&s), [("a", Pending), ("b", Pending), ("canary", Progressing), ("fresh", Done)]);
        assert!(changes.iter().any(|c| c.cluster == "canary" && c.to == Progressing));
        // The canary replaces its node: a replacement initializing, then finished → Soaking.
        all[2] = facts("canary", 0, 1);
        let (s, _) = advance(Some(&s), "r2", &order, &all, ONE, false, t(30));
        assert_eq!(phases(&s)[2], ("canary", Progressing));
        all[2] = facts("canary", 0, 0);
        let (s, _) = advance(Some(&s), "r2", &order, &all, ONE, false, t(40));
        assert_eq!(phases(&s)[..3], [("a", Pending), ("b", Pending), ("canary", Soaking)]);
        // Not soaked long enough: nobody else starts.
        let (s, _) = advance(Some(&s), "r2", &order, &all, ONE, false, t(99));
        assert_eq!(phases(&s)[..3], [("a", Pending), ("b", Pending), ("canary", Soaking)]);
        // Soaked: Done, and the next by name starts.
        let (s, _) = advance(Some(&s), "r2", &order, &all, ONE, false, t(100));
        assert_eq!(phases(&s)[..3], [("a", Progressing), ("b", Pending), ("canary", Done)]);
    }

    #[test]
    fn at_most_max_clusters_are_busy_and_a_percentage_rounds_up() {
        let all: Vec<ClusterFacts> = (0..5).map(|i| facts(&format!("c{i}"), 1, 0)).collect();
        let rollout =
            |max: &str| crds::nodepool::Rollout { max_clusters: max.into(), order: vec![], soak: "0s".into() };
        let settings = Settings::of(&rollout("30%"), all.len());
        assert_eq!(settings, Settings { max_clusters: 2, soak: Duration::ZERO });
        assert_eq!(Settings::of(&rollout("1%"), 5).max_clusters, 1);
        assert_eq!(Settings::of(&rollout("3"), 5).max_clusters, 3);
        let (s, _) = advance(None, "r", &[], &all, settings, false, t(0));
        let busy = s.clusters.iter().filter(|c| c.phase == Progressing).count();
        assert_eq!(busy, 2);
        // Every step afterwards keeps at most two busy.
        let mut s = s;
        let mut all = all;
        for step in 1..20 {
            for (f, c) in all.iter_mut().zip(&s.clusters) {
                if c.phase == Progressing {
                    f.behind = 0;
                }
            }
            let (next, _) = advance(Some(&s), "r", &[], &all, settings, false, t(step));
            let busy = next.clusters.iter().filter(|c| matches!(c.phase, Progressing | Soaking)).count();
            assert!(busy <= 2, "step {step}: {:?}", phases(&next));
            s = next;
        }
        assert!(s.clusters.iter().all(|c| c.phase == Done), "{:?}", phases(&s));
    }

    #[test]
    fn a_failure_halts_the_rollout_until_resumed_or_a_new_revision() {
        let mut all = vec![facts("a", 1, 0), facts("b", 1, 0)];
        let (s, _) = advance(None, "r", &[], &all, ONE, false, t(0));
        all[0].failure = Some("NodeClaim web-x not initialized 10m after its launch".into());
        let (s, changes) = advance(Some(&s), "r", &[], &all, ONE, false, t(10));
        assert_eq!(phases(&s), [("a", Failed), ("b", Pending)], "b does not start");
        assert_eq!(s.clusters[0].message.as_deref(), Some("NodeClaim web-x not initialized 10m after its launch"));
        assert!(changes.iter().any(|c| c.to == Failed && c.message.is_some()));
        // Still halted later, whatever happens in a.
        all[0] = facts("a", 0, 0);
        let (s, _) = advance(Some(&s), "r", &[], &all, ONE, false, t(500));
        assert_eq!(phases(&s), [("a", Failed), ("b", Pending)]);
        // Resumed: a is retried, taking its turn again before b.
        let (resumed, _) = advance(Some(&s), "r", &[], &all, ONE, true, t(501));
        assert_eq!(phases(&resumed), [("a", Progressing), ("b", Pending)], "the failed cluster goes again first");
        // A new revision starts over from the clusters not on it.
        let (fresh, _) = advance(Some(&s), "r2", &[], &[facts("a", 1, 0), facts("b", 0, 0)], ONE, false, t(600));
        assert_eq!(phases(&fresh), [("a", Progressing), ("b", Done)]);
    }

    #[test]
    fn a_restart_resumes_from_the_status_neither_repeating_nor_skipping() {
        let all = vec![facts("a", 0, 0), facts("b", 1, 0), facts("c", 1, 0)];
        let done = RolloutCluster { name: "a".into(), phase: Done, since: Time(t(0)), message: None };
        let soaking = RolloutCluster { name: "b".into(), phase: Progressing, since: Time(t(5)), message: None };
        let pending = RolloutCluster { name: "c".into(), phase: Pending, since: Time(t(0)), message: None };
        let status = RolloutStatus { revision: "r".into(), clusters: vec![done, soaking, pending] };
        // Whatever time a new process starts at, the same status gives the same phases.
        for at in [t(6), t(3600)] {
            let (s, changes) = advance(Some(&status), "r", &[], &all, ONE, false, at);
            assert_eq!(phases(&s), [("a", Done), ("b", Progressing), ("c", Pending)]);
            assert!(changes.is_empty(), "{changes:?}");
        }
    }

    #[test]
    fn a_cluster_s_facts_come_from_its_claims_hashes_and_initialization() {
        let claim = |name: &str, cluster: &str, hash: Option<&str>, initialized: bool, age: i64| -> crds::NodeClaim {
            let mut annotations = serde_json::Map::new();
            if let Some(h) = hash {
                annotations.insert(drift::NODEPOOL_HASH_ANNOTATION.into(), h.into());
                annotations.insert(drift::NODEPOOL_HASH_VERSION_ANNOTATION.into(), drift::NODEPOOL_HASH_VERSION.into());
            }
            let status = if initialized { "True" } else { "Unknown" };
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": name, "namespace": "team-a", "annotations": annotations,
                    "creationTimestamp": Time(t(1000 - age)).0.to_string()},
                "spec": {"clusterName": cluster, "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
                "status": {"conditions": [{"type": "Initialized", "status": status, "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap()
        };
        let claims = [
            claim("old-1", "paris", Some("r1"), true, 5000),
            claim("old-2", "paris", Some("r1"), true, 5000),
            claim("new-1", "paris", Some("r2"), false, 60),
            claim("new-2", "paris", Some("r2"), true, 60),
            claim("unstamped", "paris", None, true, 5000),
            claim("elsewhere", "lyon", Some("r1"), true, 5000),
        ];
        let f = facts_of("paris", &claims, "r2", t(1000));
        assert_eq!(
            f,
            ClusterFacts {
                name: "paris".into(),
                behind: 2,
                initializing: 1,
                leaving: 0,
                failure: None,
                failed_at: None
            }
        );
        // A drift candidate of the old revision still draining: the cluster has not finished.
        let mut draining = claim("old-3", "paris", Some("r1"), true, 5000);
        draining.metadata.deletion_timestamp = Some(Time(t(990)));
        let mut done = claim("new-4", "paris", Some("r2"), true, 60);
        done.metadata.deletion_timestamp = Some(Time(t(995)));
        let f = facts_of("paris", &[draining, done, claim("new-5", "paris", Some("r2"), true, 60)], "r2", t(1000));
        assert_eq!((f.behind, f.initializing, f.leaving), (0, 0, 1));
        let (status, _) = advance(
            Some(&RolloutStatus {
                revision: "r2".into(),
                clusters: vec![RolloutCluster {
                    name: "paris".into(),
                    phase: Progressing,
                    since: Time(t(0)),
                    message: None,
                }],
            }),
            "r2",
            &[],
            &[f],
            ONE,
            false,
            t(1000),
        );
        assert_eq!(phases(&status), [("paris", Progressing)], "not soaking while its old node drains");
        let stuck = [claim("new-3", "paris", Some("r2"), false, 601)];
        let f = facts_of("paris", &stuck, "r2", t(1000));
        assert_eq!(f.failure.as_deref(), Some("NodeClaim new-3 has not initialized 10 min after it was created"));
    }

    #[test]
    fn drift_waits_for_the_cluster_s_turn_in_the_current_revision() {
        let mut pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"clusterSelector": {"matchLabels": {"env": "prod"}}, "rollout": {"maxClusters": "1"},
                "template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}}},
        }))
        .unwrap();
        assert!(may_drift(&pool, "paris").unwrap_err().to_string().contains("has not started yet"));
        let revision = drift::nodepool_hash(&pool.spec);
        let entry = |name: &str, phase| RolloutCluster { name: name.into(), phase, since: Time(t(0)), message: None };
        let status = |revision: &str| RolloutStatus {
            revision: revision.into(),
            clusters: vec![entry("lyon", Pending), entry("paris", Progressing), entry("nice", Done)],
        };
        pool.status = Some(crds::nodepool::NodePoolStatus { rollout: Some(status(&revision)), ..Default::default() });
        assert_eq!(may_drift(&pool, "paris"), Ok(()));
        assert!(may_drift(&pool, "lyon").unwrap_err().to_string().contains("cluster lyon is Pending"));
        assert!(may_drift(&pool, "nice").unwrap_err().to_string().contains("is Done"));
        assert!(may_drift(&pool, "brest").unwrap_err().to_string().contains("not in the rollout"));
        // The status of an older revision: the new one has not started.
        pool.status = Some(crds::nodepool::NodePoolStatus { rollout: Some(status("older")), ..Default::default() });
        assert!(may_drift(&pool, "paris").is_err());
        // Without spec.rollout, drift goes as always.
        pool.spec.rollout = None;
        assert_eq!(may_drift(&pool, "lyon"), Ok(()));
    }

    #[test]
    fn a_rolled_back_replacement_fails_its_cluster_once_and_a_resume_judges_new_attempts_only() {
        let mut all = vec![facts("a", 1, 0), facts("b", 1, 0)];
        let (s, _) = advance(None, "r", &[], &all, ONE, false, t(0));
        assert_eq!(phases(&s), [("a", Progressing), ("b", Pending)]);
        all[0].failure = Some("the replacement of NodeClaim web-x was rolled back: over quota".into());
        all[0].failed_at = Some(t(20));
        let (s, _) = advance(Some(&s), "r", &[], &all, ONE, false, t(21));
        assert_eq!(phases(&s), [("a", Failed), ("b", Pending)], "the rollout halts, b untouched");
        // Resumed at 30: the record of 20 is older than the new attempt and fails nothing.
        let (s, _) = advance(Some(&s), "r", &[], &all, ONE, true, t(30));
        let (s, _) = advance(Some(&s), "r", &[], &all, ONE, false, t(31));
        assert_eq!(phases(&s), [("a", Progressing), ("b", Pending)]);
        // A new rollback after the resume fails it again.
        all[0].failed_at = Some(t(40));
        let (s, _) = advance(Some(&s), "r", &[], &all, ONE, false, t(41));
        assert_eq!(phases(&s), [("a", Failed), ("b", Pending)]);
    }

    #[test]
    fn a_failure_record_is_read_for_its_revision_only_and_bounded() {
        let claim = |name: &str, record: Option<String>| {
            let mut c: crds::NodeClaim = serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": name, "namespace": "team-a", "annotations": {
                    drift::NODEPOOL_HASH_ANNOTATION: "old", drift::NODEPOOL_HASH_VERSION_ANNOTATION: drift::NODEPOOL_HASH_VERSION}},
                "spec": {"clusterName": "paris", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
            }))
            .unwrap();
            if let Some(r) = record {
                c.metadata.annotations.get_or_insert_default().insert(FAILURE_ANNOTATION.into(), r);
            }
            c
        };
        let claims = [
            claim("web-a", Some(failure_record("new", t(10), "replacement web-r1 is gone before it initialized"))),
            claim("web-b", Some(failure_record("new", t(20), "replacement web-r2 is gone before it initialized"))),
            claim("web-c", Some(failure_record("older", t(30), "another revision's"))),
            claim(
                "web-d",
                Some(format!("{{\"revision\":\"new\",\"at\":\"{}\",\"why\":\"{}\"}}", t(40), "x".repeat(4096))),
            ),
        ];
        let f = facts_of("paris", &claims, "new", t(50));
        assert_eq!(f.behind, 4);
        assert_eq!(f.failed_at, Some(t(20)), "the latest record of the revision; the oversized one is ignored");
        assert_eq!(
            f.failure.as_deref(),
            Some(
                "the replacement of NodeClaim web-b was rolled back: replacement web-r2 is gone before it initialized"
            )
        );
        assert_eq!(facts_of("paris", &claims, "newer", t(50)).failure, None, "a record of another revision");
    }

    #[test]
    fn a_cluster_s_revisions_are_its_nodes_distinct_hashes() {
        let claim = |hash: Option<&str>, deleting: bool| {
            let mut v = serde_json::json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": "c", "namespace": "team-a"},
                "spec": {"clusterName": "paris", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
            });
            if let Some(h) = hash {
                v["metadata"]["annotations"] = serde_json::json!({
                    drift::NODEPOOL_HASH_ANNOTATION: h, drift::NODEPOOL_HASH_VERSION_ANNOTATION: drift::NODEPOOL_HASH_VERSION});
            }
            if deleting {
                v["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value::<crds::NodeClaim>(v).unwrap()
        };
        let claims = [
            claim(Some("b"), false),
            claim(Some("a"), false),
            claim(Some("b"), false),
            claim(Some("c"), true),
            claim(None, false),
        ];
        assert_eq!(revisions_of(&claims), ["a", "b"], "distinct, sorted; a deleting or unstamped claim runs none");
        assert!(revisions_of(&[]).is_empty());
    }

    #[test]
    fn clusters_joining_and_leaving_the_selection() {
        let (s, _) = advance(None, "r", &[], &[facts("a", 1, 0)], ONE, false, t(0));
        // b joins behind: Pending (a is busy); a leaves: its entry goes, and b starts.
        let (s, _) = advance(Some(&s), "r", &[], &[facts("a", 1, 0), facts("b", 1, 0)], ONE, false, t(1));
        assert_eq!(phases(&s), [("a", Progressing), ("b", Pending)]);
        let (s, _) = advance(Some(&s), "r", &[], &[facts("b", 1, 0)], ONE, false, t(2));
        assert_eq!(phases(&s), [("b", Progressing)]);
    }
}
