//! One garbage-collection sweep of one cluster as a plan (clever-cloud.md §3.8, hub.md §5): from
//! what the sweep gathered (the caches, the live re-reads of the orphan candidates and of their
//! claims, the live reads of the vanish candidates' groups), every report, re-stamp, delete (capped
//! or halted by the brake), vanished claim and stuck-node release, with the texts of their events
//! and the gauges' values. Which objects are worth a live read is decided here too
//! ([`claim_to_read`], [`vanish_candidates`], with the rules' [`super::orphan_candidates`]).
//!
//! Owns: the plan and its order (the brake weighs every orphan of the sweep before any delete).
//! Must not: do I/O, read the clock or log: [`crate::controllers::gc`] gathers the facts, re-reads
//! live what the plan acts on, and carries the plan out, each delete with a UID precondition on the
//! group as just read.

use std::sync::Arc;

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use super::{
    Brake, BrakeVerdict, ClaimFacts, ClusterView, LiveClaim, LiveGroup, Verdict, is_vanish_candidate, judge_orphan,
    judge_vanished,
};
use crate::decisions::{
    capacity::CapacityState,
    conditions, handover,
    lifecycle::{LAUNCHED, REGISTERED},
    ownership::{self, Owner, Ownership, prove},
};
use crds::{NodeClaim, NodeGroup, labels};

/// An orphan candidate as re-read live: found and not being deleted, with the ownership proven on
/// that copy and the live read of the claim it names.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub group: NodeGroup,
    pub ownership: Ownership,
    pub claim: LiveClaim,
}

/// The claim whose live read judges a candidate with this ownership, if any.
pub fn claim_to_read(ownership: &Ownership) -> Option<&str> {
    match ownership {
        Ownership::Owned { claim, .. } | Ownership::Legacy { claim, .. } | Ownership::Moved { claim, .. } => {
            Some(claim)
        }
        Ownership::Foreign | Ownership::Refused(_) => None,
    }
}

/// What the vanished-launch rules know of a claim, from the cache.
pub fn claim_facts(c: &NodeClaim) -> ClaimFacts {
    let conds = c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    ClaimFacts {
        deleting: c.metadata.deletion_timestamp.is_some(),
        launched: conditions::is_true(conds, LAUNCHED),
        registered: conditions::is_true(conds, REGISTERED),
        clever: c.spec.node_class_ref.kind == labels::NODECLASS_KIND && c.spec.node_class_ref.group == labels::GROUP,
        created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
    }
}

/// The claims of cluster `cluster` whose group is worth a live read ([`is_vanish_candidate`]), each
/// with its group's name: from its provider ID, or the name derived before launch.
pub fn vanish_candidates<'c>(
    view: ClusterView,
    claims: &'c [Arc<NodeClaim>],
    owner: Owner<'_>,
    namespace: &str,
    cluster: &str,
    now: Timestamp,
) -> Vec<(&'c NodeClaim, String)> {
    claims
        .iter()
        .filter(|c| c.spec.cluster_name == cluster && is_vanish_candidate(view, &claim_facts(c), now))
        .map(|c| {
            let group = c
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|p| ownership::parse_provider_id(p).ok().map(str::to_string))
                .unwrap_or_else(|| ownership::nodegroup_name(owner.hub_id, namespace, &c.name_any()));
            (c.as_ref(), group)
        })
        .collect()
}

/// A vanish candidate with the live read of its group.
#[derive(Debug, Clone)]
pub struct VanishRead<'a> {
    pub claim: &'a NodeClaim,
    pub group: String,
    pub live: LiveGroup,
}

/// Everything one sweep of one cluster gathered.
#[derive(Debug, Clone)]
pub struct SweepFacts<'a> {
    pub view: ClusterView,
    /// This hub on the cluster, with the move its registration declares.
    pub owner: Owner<'a>,
    /// The cluster's registration namespace and name.
    pub namespace: &'a str,
    pub cluster: &'a str,
    /// The cluster's groups as the workload cache shows them.
    pub groups: &'a [NodeGroup],
    /// The namespace's claims as the management cache shows them.
    pub claims: &'a [Arc<NodeClaim>],
    /// The cluster's Nodes as the workload cache shows them.
    pub nodes: &'a [Arc<Node>],
    /// The orphan candidates found live and not terminating, in the order they were read.
    pub candidates: &'a [Candidate],
    /// The vanish candidates, in the order they were read.
    pub vanish: &'a [VanishRead<'a>],
    /// The cluster's capacity memory (`None`: could not be read), for the cool-down gauge.
    pub capacity: Option<&'a CapacityState>,
    pub brake: Brake,
    pub now: Timestamp,
}

/// An event on a NodeGroup, mirrored onto its NodePool.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    pub group: &'a NodeGroup,
    pub note: String,
}

/// What judging an orphan candidate calls for, besides its delete.
#[derive(Debug, Clone)]
pub enum Judgement<'a> {
    /// It carries this hub's labels but fails the ownership proof: kept, and reported
    /// (`GarbageCollectionRefused`).
    Refuse { report: Report<'a>, why: String },
    /// Moved with its claim from the declared source, its claim here now: merge this patch
    /// (re-stamped as this management cluster's, guarded by the version proven). Not a deletion:
    /// the brake does not weigh it.
    Restamp { group: &'a NodeGroup, patch: serde_json::Value },
}

/// The brake halted the sweep: nothing is deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    /// Orphans found, of the groups labelled this hub's.
    pub would: usize,
    pub of: usize,
    /// Said on the cluster's NodePools (condition and event).
    pub why: String,
}

/// An orphaned group to delete, with a UID precondition on this copy, read live.
#[derive(Debug, Clone)]
pub struct Reap<'a> {
    pub group: &'a NodeGroup,
    pub why: String,
    /// The `GarbageCollected` event's text, once deleted.
    pub note: String,
}

/// A Node whose hub finalizer no claim will ever release: its claim is gone and its owned group
/// going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckNode {
    pub node: String,
    pub group: String,
}

/// A launched claim whose group vanished before its node registered: delete it (UID
/// precondition) so its pods are re-planned, and arm its flavor's cool-down.
#[derive(Debug, Clone)]
pub struct VanishedClaim<'a> {
    pub claim: &'a NodeClaim,
    pub group: String,
    pub why: String,
    /// The claim's flavor (its instance-type label), if it has one.
    pub flavor: Option<String>,
    /// The `NodeGroupVanished` event's text, once deleted.
    pub note: String,
}

/// The gauges one sweep sets for its cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Groups of no hub of ours.
    pub unmanaged: usize,
    /// Groups moved from the declared source, not re-stamped yet.
    pub awaiting_handover: usize,
    pub external_resizes: usize,
    /// Flavors cooling down.
    pub cooldown_flavors: usize,
    /// Groups the sweep refused to touch.
    pub refused: usize,
}

/// One sweep's plan, carried out in this order: the gauges, the reports of foreign autoscalers and
/// resized groups, the candidates' judgements, the brake's halt (or its end), the deletes, the
/// stuck-node releases, the vanished claims.
#[derive(Debug, Clone, Default)]
pub struct SweepPlan<'a> {
    pub gauges: Gauges,
    /// Groups of another Karpenter (the in-cluster provider) on this cluster:
    /// `ForeignAutoscalerDetected`, on the group only.
    pub foreign_autoscalers: Vec<Report<'a>>,
    /// Groups of ours whose node count someone changed: `NodeGroupExternallyResized`.
    pub resized: Vec<Report<'a>>,
    /// The candidates' refusals and re-stamps, in the order they were read.
    pub judged: Vec<Judgement<'a>>,
    /// `Some`: the brake halted the sweep and `deletes` is empty; `None`: it did not (a halt of an
    /// earlier sweep ends).
    pub halt: Option<Halt>,
    /// The orphans to delete now, at most the brake's cap.
    pub deletes: Vec<Reap<'a>>,
    /// Orphans left for a later sweep by the cap (all of them when halted).
    pub deferred: usize,
    pub stuck: Vec<StuckNode>,
    pub vanished: Vec<VanishedClaim<'a>>,
}

/// The plan of one sweep.
pub fn plan_sweep<'a>(f: &SweepFacts<'a>) -> SweepPlan<'a> {
    let mut plan = SweepPlan::default();
    // The brake's population: groups carrying this hub's and namespace's labels, not going.
    let mut labelled = 0;
    for g in f.groups {
        let proof = prove(g, f.owner, f.namespace);
        if proof.is_labelled_ours() && !g.is_terminating() {
            labelled += 1;
        }
        match proof {
            Ownership::Foreign => plan.gauges.unmanaged += 1,
            Ownership::Moved { .. } => plan.gauges.awaiting_handover += 1,
            Ownership::Owned { .. } | Ownership::Legacy { .. } if g.spec.node_count != 1 => {
                plan.resized.push(Report {
                    group: g,
                    note: format!(
                        "NodeGroup {} has nodeCount {} instead of 1: check the cluster's autoscalingEnabled and who holds nodegroups/scale; the hub never scales it back and does not track its extra nodes",
                        g.name_any(),
                        g.spec.node_count
                    ),
                });
            }
            _ => {}
        }
        // clever-cloud.md §3.9: another Karpenter (the in-cluster provider) also manages this cluster.
        if matches!(proof, Ownership::Foreign)
            && g.labels().get(labels::IN_CLUSTER_MANAGED).map(String::as_str) == Some("true")
        {
            plan.foreign_autoscalers.push(Report {
                group: g,
                note: format!(
                    "NodeGroup {} is managed by the in-cluster Karpenter provider ({}=true): two autoscalers on one cluster fight over capacity; the hub never touches it",
                    g.name_any(),
                    labels::IN_CLUSTER_MANAGED
                ),
            });
        }
    }
    plan.gauges.external_resizes = plan.resized.len();
    plan.gauges.cooldown_flavors = f.capacity.map(|s| s.unavailable(f.now).count()).unwrap_or_default();

    // Judge every candidate first, delete after: the brake weighs the whole sweep.
    let mut collectable = Vec::new();
    for c in f.candidates {
        match judge_orphan(f.view, &c.ownership, &c.claim) {
            Verdict::Collect { why } => collectable.push((&c.group, why)),
            Verdict::Refuse { why } => {
                let note = format!(
                    "NodeGroup {} carries this hub's labels but fails the ownership proof ({why}); kept, never deleted: remove the labels or delete it by hand",
                    c.group.name_any()
                );
                plan.judged.push(Judgement::Refuse { report: Report { group: &c.group, note }, why });
                plan.gauges.refused += 1;
            }
            Verdict::Restamp { claim_uid } => {
                let version = c.group.metadata.resource_version.as_deref().unwrap_or_default();
                let patch = handover::restamp(f.owner.management_cluster, &claim_uid, version);
                plan.judged.push(Judgement::Restamp { group: &c.group, patch });
            }
            Verdict::Keep => {}
        }
    }
    let allowed = match f.brake.judge(collectable.len(), labelled) {
        BrakeVerdict::Halt { would, of } => {
            let percent = f.brake.halt_percent;
            let why = format!(
                "garbage collection of cluster {} is halted: {would} of the {of} NodeGroups this hub labelled there look orphaned (their NodeClaims are gone from this management cluster), more than the {percent}% one sweep may delete, so none was deleted. If this management cluster lost its NodeClaims (a restore, a move), bring them back; if the groups really are leaked, delete them by hand or raise --gc-halt-percent",
                f.cluster
            );
            plan.halt = Some(Halt { would, of, why });
            0
        }
        BrakeVerdict::Proceed { now } => now,
    };
    plan.deferred = collectable.len().saturating_sub(allowed);
    plan.deletes = collectable
        .into_iter()
        .take(allowed)
        .map(|(group, why)| {
            let note = format!("deleted orphaned NodeGroup {}: {why}", group.name_any());
            Reap { group, why, note }
        })
        .collect();

    plan.stuck = stuck_nodes(f);

    plan.vanished = f
        .vanish
        .iter()
        .filter_map(|v| match judge_vanished(f.view, &v.live) {
            Verdict::Collect { why } => Some(VanishedClaim {
                claim: v.claim,
                group: v.group.clone(),
                flavor: v.claim.labels().get(labels::INSTANCE_TYPE).filter(|x| !x.is_empty()).cloned(),
                note: format!("NodeGroup {} is gone ({why}); the claim is replaced", v.group),
                why,
            }),
            _ => None,
        })
        .collect();
    plan
}

/// Nodes being deleted that still carry the hub's finalizer although no claim will ever terminate
/// them (no claim names their group, and their owned group is going): their finalizer is released,
/// or the Node and CKE's NodeGroup wait on each other forever. This also retries a release that
/// failed after a reap.
fn stuck_nodes(f: &SweepFacts<'_>) -> Vec<StuckNode> {
    let mut stuck = Vec::new();
    for node in f.nodes {
        if node.metadata.deletion_timestamp.is_none()
            || !node.finalizers().iter().any(|x| x == labels::TERMINATION_FINALIZER)
        {
            continue;
        }
        let Some(group) = ownership::node_group(node) else { continue };
        // Only our own group, proven by its labels: another Karpenter uses the same finalizer name.
        let group_going =
            f.groups.iter().find(|g| g.name_any() == group).is_some_and(|g| {
                g.is_terminating() && matches!(prove(g, f.owner, f.namespace), Ownership::Owned { .. })
            });
        let provider_id = ownership::provider_id(&group);
        let claimed = f
            .claims
            .iter()
            .any(|c| c.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str()));
        if group_going && !claimed {
            stuck.push(StuckNode { node: node.name_any(), group });
        }
    }
    stuck
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::decisions::{
        garbage::MIN_AGE,
        lifecycle::{
            LaunchOutcome,
            fixtures::{claim, t},
            launched,
        },
        ownership::ClaimIdentity,
    };
    use crds::nodegroup::NodeGroupSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const ME: Owner<'static> = Owner { hub_id: "default", management_cluster: "mgmt-1", moved_from: None };
    const OK: ClusterView = ClusterView { connected: true, synced: true, lists_ok: true, min_age: MIN_AGE };

    /// A group this hub made for claim `claim` (UID `uid-<claim>`) in management cluster `mgmt`.
    fn group(claim: &str, mgmt: &str) -> NodeGroup {
        let uid = format!("uid-{claim}");
        let id = ClaimIdentity {
            hub_id: "default",
            management_cluster: mgmt,
            namespace: "team-a",
            claim,
            claim_uid: &uid,
            nodepool: "general",
            nodeclass: "default",
        };
        NodeGroup {
            metadata: ObjectMeta {
                name: Some(id.nodegroup_name()),
                uid: Some(format!("g-{claim}")),
                resource_version: Some("5".into()),
                labels: Some(id.labels()),
                annotations: Some(id.annotations("h")),
                creation_timestamp: Some(Time(t(0))),
                ..ObjectMeta::default()
            },
            spec: NodeGroupSpec { flavor: "M".into(), node_count: 1, labels: None, taints: None },
            status: None,
        }
    }

    fn foreign(name: &str, in_cluster: bool) -> NodeGroup {
        let mut marks = std::collections::BTreeMap::new();
        if in_cluster {
            marks.insert(labels::IN_CLUSTER_MANAGED.to_string(), "true".to_string());
        }
        NodeGroup {
            metadata: ObjectMeta { name: Some(name.into()), labels: Some(marks), ..ObjectMeta::default() },
            spec: NodeGroupSpec { flavor: "M".into(), node_count: 1, labels: None, taints: None },
            status: None,
        }
    }

    fn orphan(g: &NodeGroup) -> Candidate {
        let ownership = prove(g, ME, "team-a");
        Candidate { group: g.clone(), ownership, claim: LiveClaim::Absent }
    }

    fn facts<'a>(groups: &'a [NodeGroup], candidates: &'a [Candidate]) -> SweepFacts<'a> {
        SweepFacts {
            view: OK,
            owner: ME,
            namespace: "team-a",
            cluster: "prod",
            groups,
            claims: &[],
            nodes: &[],
            candidates,
            vanish: &[],
            capacity: None,
            brake: Brake::default(),
            now: t(600),
        }
    }

    fn names(reaps: &[Reap<'_>]) -> Vec<String> {
        reaps.iter().map(|r| r.group.name_any()).collect()
    }

    #[test]
    fn orphans_are_deleted_up_to_the_cap_with_the_rest_deferred() {
        let groups: Vec<NodeGroup> = (0..40).map(|i| group(&format!("c{i}"), "mgmt-1")).collect();
        let candidates: Vec<Candidate> = groups[..3].iter().map(orphan).collect();
        let plan = plan_sweep(&facts(&groups, &candidates));
        assert_eq!(plan.halt, None);
        assert_eq!(names(&plan.deletes), groups[..3].iter().map(|g| g.name_any()).collect::<Vec<_>>());
        assert_eq!(plan.deletes[0].why, "its NodeClaim c0 no longer exists");
        assert_eq!(
            plan.deletes[0].note,
            format!("deleted orphaned NodeGroup {}: its NodeClaim c0 no longer exists", groups[0].name_any())
        );
        assert_eq!(plan.deferred, 0);
        // More orphans than one sweep deletes (still under the halt share): the first ten now.
        let groups: Vec<NodeGroup> = (0..200).map(|i| group(&format!("c{i}"), "mgmt-1")).collect();
        let candidates: Vec<Candidate> = groups[..40].iter().map(orphan).collect();
        let plan = plan_sweep(&facts(&groups, &candidates));
        assert_eq!(plan.deletes.len(), 10);
        assert_eq!(plan.deferred, 30);
    }

    #[test]
    fn the_brake_weighs_the_whole_sweep_and_halts_before_any_delete() {
        let groups: Vec<NodeGroup> = (0..3).map(|i| group(&format!("c{i}"), "mgmt-1")).collect();
        let candidates: Vec<Candidate> = groups.iter().map(orphan).collect();
        let plan = plan_sweep(&facts(&groups, &candidates));
        assert!(plan.deletes.is_empty(), "{:?}", names(&plan.deletes));
        assert_eq!(plan.deferred, 3);
        let halt = plan.halt.unwrap();
        assert_eq!((halt.would, halt.of), (3, 3));
        assert!(
            halt.why.starts_with("garbage collection of cluster prod is halted: 3 of the 3 NodeGroups"),
            "{}",
            halt.why
        );
        assert!(halt.why.contains("more than the 50%"), "{}", halt.why);
        // Groups going are not in the brake's population; foreign ones neither.
        let mut more = groups.clone();
        more.extend((3..6).map(|i| {
            let mut g = group(&format!("c{i}"), "mgmt-1");
            g.metadata.deletion_timestamp = Some(Time(t(1)));
            g
        }));
        more.extend((0..10).map(|i| foreign(&format!("f{i}"), false)));
        assert!(plan_sweep(&facts(&more, &candidates)).halt.is_some());
        // Among enough live groups of ours, the same three go.
        more.extend((6..9).map(|i| group(&format!("c{i}"), "mgmt-1")));
        let plan = plan_sweep(&facts(&more, &candidates));
        assert_eq!((plan.halt, plan.deletes.len()), (None, 3));
    }

    #[test]
    fn a_moved_group_whose_claim_came_across_is_restamped_at_the_version_read_and_never_deleted() {
        let moved = group("c1", "mgmt-0");
        let me = ME.moved_from(Some("mgmt-0"));
        let candidate = Candidate {
            group: moved.clone(),
            ownership: prove(&moved, me, "team-a"),
            claim: LiveClaim::Present { uid: "uid-new".into() },
        };
        let groups = [moved.clone()];
        let candidates = [candidate];
        let f = SweepFacts { owner: me, ..facts(&groups, &candidates) };
        let plan = plan_sweep(&f);
        let [Judgement::Restamp { group, patch }] = plan.judged.as_slice() else { panic!("{:?}", plan.judged) };
        assert!(std::ptr::eq(*group, &candidates[0].group));
        assert_eq!(*patch, handover::restamp("mgmt-1", "uid-new", "5"));
        assert_eq!(plan.gauges.awaiting_handover, 1);
        assert!(plan.deletes.is_empty());
        // Its claim not here yet: nothing at all.
        let waiting = [Candidate { claim: LiveClaim::Absent, ..candidates[0].clone() }];
        let plan = plan_sweep(&SweepFacts { owner: me, ..facts(&groups, &waiting) });
        assert_eq!((plan.judged.len(), plan.deletes.len()), (0, 0));
    }

    #[test]
    fn a_group_failing_the_proof_is_reported_and_counted_never_deleted() {
        let mut g = group("c1", "mgmt-1");
        g.metadata.annotations.as_mut().unwrap().remove(labels::NODECLAIM_UID);
        let proof = prove(&g, ME, "team-a");
        assert!(matches!(proof, Ownership::Refused(_)), "{proof:?}");
        let groups = [g.clone()];
        let candidates = [Candidate { group: g.clone(), ownership: proof, claim: LiveClaim::Absent }];
        let plan = plan_sweep(&facts(&groups, &candidates));
        let [Judgement::Refuse { report, why }] = plan.judged.as_slice() else { panic!("{:?}", plan.judged) };
        assert!(std::ptr::eq(report.group, &candidates[0].group));
        assert_eq!(
            report.note,
            format!(
                "NodeGroup {} carries this hub's labels but fails the ownership proof ({why}); kept, never deleted: remove the labels or delete it by hand",
                g.name_any()
            )
        );
        assert_eq!(plan.gauges.refused, 1);
        assert!(plan.deletes.is_empty());
        // Not connected: nothing is judged at all.
        let plan = plan_sweep(&SweepFacts { view: ClusterView { synced: false, ..OK }, ..facts(&groups, &candidates) });
        assert!(plan.judged.is_empty());
    }

    #[test]
    fn foreign_autoscalers_and_resized_groups_are_reported_and_counted() {
        let mut resized = group("c1", "mgmt-1");
        resized.spec.node_count = 3;
        let groups = [resized.clone(), foreign("karpenter-x", true), foreign("manual", false), group("c2", "mgmt-1")];
        let plan = plan_sweep(&SweepFacts { capacity: None, ..facts(&groups, &[]) });
        assert_eq!(
            plan.gauges,
            Gauges { unmanaged: 2, awaiting_handover: 0, external_resizes: 1, cooldown_flavors: 0, refused: 0 }
        );
        assert_eq!(plan.foreign_autoscalers.len(), 1);
        assert_eq!(plan.foreign_autoscalers[0].group.name_any(), "karpenter-x");
        assert!(plan.foreign_autoscalers[0].note.contains("in-cluster Karpenter provider"));
        assert_eq!(plan.resized.len(), 1);
        assert!(plan.resized[0].note.contains("has nodeCount 3 instead of 1"), "{}", plan.resized[0].note);
        let cooling = CapacityState {
            unavailable_until: [("M".to_string(), t(700)), ("L".to_string(), t(10))].into(),
            ..CapacityState::default()
        };
        assert_eq!(
            plan_sweep(&SweepFacts { capacity: Some(&cooling), ..facts(&groups, &[]) }).gauges.cooldown_flavors,
            1
        );
    }

    fn stuck_node(name: &str, group: &str, finalizer: bool) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.deletion_timestamp = Some(Time(t(500)));
        n.metadata.labels = Some([(labels::CLEVER_NODEGROUP.to_string(), group.to_string())].into());
        if finalizer {
            n.metadata.finalizers = Some(vec![labels::TERMINATION_FINALIZER.to_string()]);
        }
        Arc::new(n)
    }

    #[test]
    fn a_deleted_node_of_a_going_group_no_claim_names_is_released() {
        let mut going = group("c1", "mgmt-1");
        going.metadata.deletion_timestamp = Some(Time(t(400)));
        let mut theirs = foreign("karpenter-x", true);
        theirs.metadata.deletion_timestamp = Some(Time(t(400)));
        let standing = group("c2", "mgmt-1");
        let groups = [going.clone(), theirs, standing.clone()];
        let nodes = [
            stuck_node("n1", &going.name_any(), true),
            stuck_node("n2", "karpenter-x", true),
            stuck_node("n3", &standing.name_any(), true),
            stuck_node("n4", &going.name_any(), false),
        ];
        let f = SweepFacts { nodes: &nodes, ..facts(&groups, &[]) };
        assert_eq!(plan_sweep(&f).stuck, vec![StuckNode { node: "n1".into(), group: going.name_any() }]);
        // A claim still names the group: its own termination releases the node.
        let mut c = claim();
        let outcome = LaunchOutcome::Launched {
            provider_id: ownership::provider_id(&going.name_any()),
            capacity: Default::default(),
            allocatable: Default::default(),
        };
        c.status = Some(launched(&c, &outcome, t(10)));
        let claims = [Arc::new(c)];
        assert!(plan_sweep(&SweepFacts { claims: &claims, ..f }).stuck.is_empty());
    }

    fn launched_at(name: &str, created: i64, flavor: &str) -> Arc<NodeClaim> {
        let mut c = claim();
        c.metadata.name = Some(name.into());
        c.metadata.creation_timestamp = Some(Time(t(created)));
        c.metadata.labels.as_mut().unwrap().insert(labels::INSTANCE_TYPE.into(), flavor.into());
        let outcome = LaunchOutcome::Launched {
            provider_id: format!("clevercloud://ng-{name}"),
            capacity: Default::default(),
            allocatable: Default::default(),
        };
        c.status = Some(launched(&c, &outcome, t(created)));
        Arc::new(c)
    }

    #[test]
    fn a_launched_claim_whose_group_is_confirmed_gone_is_replaced_and_its_flavor_cools() {
        let claims = [launched_at("old", 0, "M"), launched_at("young", 590, "M"), launched_at("bare", 0, "")];
        let mut other = launched_at("elsewhere", 0, "M").as_ref().clone();
        other.spec.cluster_name = "staging".into();
        let mut all = claims.to_vec();
        all.push(Arc::new(other));
        // Old enough, launched, not registered, in this cluster: its group read live.
        let picked = vanish_candidates(OK, &all, ME, "team-a", "prod", t(600));
        let picked: Vec<(&str, &str)> =
            picked.iter().map(|(c, g)| (c.metadata.name.as_deref().unwrap(), g.as_str())).collect();
        assert_eq!(picked, vec![("old", "ng-old"), ("bare", "ng-bare")]);
        let reads = [
            VanishRead { claim: &claims[0], group: "ng-old".into(), live: LiveGroup::Absent },
            VanishRead { claim: &claims[2], group: "ng-bare".into(), live: LiveGroup::Absent },
        ];
        let f = SweepFacts { vanish: &reads, ..facts(&[], &[]) };
        let plan = plan_sweep(&f);
        assert_eq!(plan.vanished.len(), 2);
        let v = &plan.vanished[0];
        assert!(std::ptr::eq(v.claim, claims[0].as_ref()));
        assert_eq!(v.flavor.as_deref(), Some("M"));
        assert_eq!(v.why, "its NodeGroup vanished before the node registered");
        assert_eq!(
            v.note,
            "NodeGroup ng-old is gone (its NodeGroup vanished before the node registered); the claim is replaced"
        );
        assert_eq!(plan.vanished[1].flavor, None, "no flavor label: no cool-down to arm");
        // Present or unknown: kept.
        for live in [LiveGroup::Present, LiveGroup::Unknown] {
            let reads = [VanishRead { live, ..reads[0].clone() }];
            assert!(plan_sweep(&SweepFacts { vanish: &reads, ..facts(&[], &[]) }).vanished.is_empty());
        }
        // Which claim a candidate's live read is of.
        assert_eq!(claim_to_read(&Ownership::Owned { claim: "c1".into(), uid: "u".into() }), Some("c1"));
        assert_eq!(claim_to_read(&Ownership::Foreign), None);
    }
}
