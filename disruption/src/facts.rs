//! The plain facts the disruption decisions read: a scope's pools and its nodes (one per NodeClaim)
//! with their pods, PDB verdicts and annotations, already reduced from API objects by the caller.
//!
//! Owns shapes and the small per-fact rules (pod classes, eviction cost, do-not-disrupt values),
//! nothing else. No API types here, so tests and `plan` build facts cheaply.

use crds::admission::schedule::{do_not_disrupt_holds, parse_duration, parse_go_duration};
use crds::nodepool::{ConsolidationPolicy, Disruption, DisruptionReason};
use jiff::Timestamp;

use crate::budgets::Budgets;

/// One scope (namespace, cluster): its pools and the nodes of its NodeClaims.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// NodePools of the scope.
    pub pools: Vec<PoolFacts>,
    /// One entry per NodeClaim of the scope.
    pub nodes: Vec<NodeFacts>,
}

impl Scope {
    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&PoolFacts> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The first instant after `now` at which the methods' verdict over this scope may change with
    /// time alone, nothing in it changing: a scheduled budget opening or closing, a pod's
    /// do-not-disrupt duration running out. `None`: none would. (A candidate's disruption cost
    /// also falls as it ages, which reorders candidates slowly; a caller keeping a verdict looks
    /// again after a while anyway, as upstream's consolidated state expires.)
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        let budgets = self.pools.iter().filter_map(|p| p.budgets.next_change(now));
        let pods = self.nodes.iter().flat_map(|n| &n.pods).filter_map(|p| p.do_not_disrupt_ends(now));
        budgets.chain(pods).min()
    }
}

/// What disruption needs of a NodePool.
#[derive(Debug, Clone)]
pub struct PoolFacts {
    /// Name.
    pub name: String,
    /// `spec.disruption.consolidationPolicy`.
    pub policy: ConsolidationPolicy,
    /// `spec.disruption.consolidateAfter` in seconds; `None` for `Never` (no consolidation, no emptiness).
    pub consolidate_after: Option<u64>,
    /// `spec.disruption.budgets`, parsed.
    pub budgets: Budgets,
    /// The pool's node class resolves to instance types (else its nodes are not candidates).
    pub types_resolve: bool,
    /// Annotation `karpenter.clever-cloud.com/protect-single-replica: "true"` (§9 D7): consolidation
    /// of under-used nodes skips nodes hosting a controller's only ready replica.
    pub protect_single_replica: bool,
    /// A static pool (`spec.replicas`): its nodes are no candidates of any method; the count it
    /// keeps replaces them (drift one at a time, replacement first; expiry after).
    pub static_pool: bool,
}

impl PoolFacts {
    /// Facts of a pool from its `spec.disruption`. An unreadable `consolidateAfter` (the webhook
    /// refuses them) is taken as `Never`: doing nothing is the safe reading.
    pub fn from_spec(name: &str, disruption: &Disruption, types_resolve: bool) -> PoolFacts {
        PoolFacts {
            name: name.to_string(),
            policy: disruption.consolidation_policy,
            consolidate_after: parse_duration(&disruption.consolidate_after, true).ok().flatten(),
            budgets: Budgets::parse(&disruption.budgets),
            types_resolve,
            protect_single_replica: false,
            static_pool: false,
        }
    }
}

/// Why a claim is drifted (its `Drifted=True` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// `NodePoolDrifted`, `RequirementsDrifted`, `InstanceTypeNotFound` or a provider reason.
    pub reason: String,
    /// When the condition turned True (oldest drift goes first).
    pub since: Timestamp,
}

/// One NodeClaim and its Node, as disruption sees them.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    /// NodeClaim name.
    pub claim: String,
    /// Node name, when the Node exists.
    pub node: Option<String>,
    /// `karpenter.sh/nodepool` label of the Node (or claim).
    pub nodepool: Option<String>,
    /// The Node is labelled `karpenter.sh/initialized=true`.
    pub initialized: bool,
    /// The Node's `Ready` condition is True.
    pub node_ready: bool,
    /// The claim has `InstanceTerminating=True` (not counted in the pool's budget base).
    pub instance_terminating: bool,
    /// Marked for deletion: in-memory mark, claim or Node deleting, `InstanceTerminating`.
    pub marked_for_deletion: bool,
    /// Nominated for pending pods by the provisioner (recently, per the nomination window).
    pub nominated: bool,
    /// Part of a queued disruption command.
    pub queued: bool,
    /// `karpenter.sh/do-not-disrupt: "true"` on the Node or the claim.
    pub do_not_disrupt: bool,
    /// `Consolidatable=True`.
    pub consolidatable: bool,
    /// `Drifted=True`, with its reason and since when.
    pub drifted: Option<Drift>,
    /// The claim's `DisruptionReason`, when it is a budget reason (charged to that reason's budgets).
    pub disruption_reason: Option<DisruptionReason>,
    /// `spec.terminationGracePeriod` in seconds.
    pub termination_grace_period: Option<u64>,
    /// Creation time of the claim.
    pub created: Timestamp,
    /// `spec.expireAfter` in seconds; `None` for `Never`.
    pub expire_after: Option<u64>,
    /// `node.kubernetes.io/instance-type` label.
    pub instance_type: Option<String>,
    /// `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
    /// `karpenter.sh/capacity-type` label.
    pub capacity_type: Option<String>,
    /// Hourly price of the node's offering (0 when unknown).
    pub price: f64,
    /// Pods bound to the Node.
    pub pods: Vec<PodFacts>,
    /// A CapacityBuffer's pods sit in its free room (the provisioner would place them there now):
    /// not empty in the sense of emptiness, which would delete the room the buffer keeps.
    pub buffer_room: bool,
}

impl NodeFacts {
    /// A claim with an initialized, Ready node and nothing else set (tests and `plan` fill the rest).
    pub fn new(claim: &str, nodepool: &str, created: Timestamp) -> NodeFacts {
        NodeFacts {
            claim: claim.to_string(),
            node: Some(claim.to_string()),
            nodepool: Some(nodepool.to_string()),
            initialized: true,
            node_ready: true,
            instance_terminating: false,
            marked_for_deletion: false,
            nominated: false,
            queued: false,
            do_not_disrupt: false,
            consolidatable: true,
            drifted: None,
            disruption_reason: None,
            termination_grace_period: None,
            created,
            expire_after: None,
            instance_type: None,
            zone: None,
            capacity_type: None,
            price: 0.0,
            pods: Vec::new(),
            buffer_room: false,
        }
    }

    /// Pods that would need a new place if the node went (§4.4, §4.6).
    pub fn reschedulable_pods(&self) -> impl Iterator<Item = &PodFacts> {
        self.pods.iter().filter(|p| p.reschedulable())
    }

    /// No reschedulable pod (hub decision §9 D1: cost plays no part).
    pub fn is_empty(&self) -> bool {
        self.reschedulable_pods().next().is_none()
    }

    /// `1 + Σ max(0, eviction cost)` of the reschedulable pods (§4.4).
    pub fn reschedule_cost(&self) -> f64 {
        1.0 + self.reschedulable_pods().map(|p| p.eviction_cost().max(0.0)).sum::<f64>()
    }

    /// `price / reschedule_cost`: candidates are tried in decreasing order of this.
    pub fn savings_ratio(&self) -> f64 {
        self.price / self.reschedule_cost()
    }

    /// `Σ eviction cost of all pods × lifetime remaining` (§4.4).
    pub fn disruption_cost(&self, now: Timestamp) -> f64 {
        let remaining = match self.expire_after {
            Some(expire) if expire > 0 => {
                let age = now.duration_since(self.created).as_secs_f64();
                ((expire as f64 - age) / expire as f64).clamp(0.0, 1.0)
            }
            Some(_) => 0.0,
            None => 1.0,
        };
        self.pods.iter().map(PodFacts::eviction_cost).sum::<f64>() * remaining
    }
}

/// What owns a pod, as far as disruption cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Owner {
    /// A Deployment's ReplicaSet, a Job, a bare pod, ...
    #[default]
    Other,
    /// A DaemonSet: recreated on every node, never rescheduled.
    DaemonSet,
    /// A StatefulSet: a terminating pod still needs its place (it is recreated only once gone).
    StatefulSet,
    /// The Node (a mirror pod of a static pod).
    Node,
}

impl Owner {
    /// The owner that decides a pod's fate: its controller reference, else its first owner.
    pub fn of(refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]) -> Owner {
        let owner = refs.iter().find(|o| o.controller == Some(true)).or_else(|| refs.first());
        match owner.map(|o| o.kind.as_str()) {
            Some("DaemonSet") => Owner::DaemonSet,
            Some("StatefulSet") => Owner::StatefulSet,
            Some("Node") => Owner::Node,
            _ => Owner::Other,
        }
    }
}

/// A PodDisruptionBudget matching a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbFacts {
    /// `namespace/name`.
    pub name: String,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: i32,
    /// `unhealthyPodEvictionPolicy: AlwaysAllow`.
    pub always_allow_unhealthy: bool,
    /// Its spec forbids every eviction (`maxUnavailable: 0` or `"0%"`, `minAvailable: "100%"`),
    /// whatever the pods' health: a pod under it is not going anywhere.
    pub fully_blocking: bool,
}

/// A pod bound to a node.
#[derive(Debug, Clone, Default)]
pub struct PodFacts {
    /// `namespace/name`.
    pub name: String,
    /// Its owner kind.
    pub owner: Owner,
    /// Phase `Succeeded` or `Failed`.
    pub terminal: bool,
    /// Has a deletion timestamp.
    pub terminating: bool,
    /// `Ready=True`.
    pub ready: bool,
    /// Tolerates `karpenter.sh/disrupted:NoSchedule` (the drain leaves it alone).
    pub tolerates_disrupted: bool,
    /// `status.startTime` (else creation): the start of a do-not-disrupt duration.
    pub started: Option<Timestamp>,
    /// The `karpenter.sh/do-not-disrupt` annotation, as written.
    pub do_not_disrupt: Option<String>,
    /// PDBs whose selector matches the pod.
    pub pdbs: Vec<PdbFacts>,
    /// `controller.kubernetes.io/pod-deletion-cost`.
    pub deletion_cost: i32,
    /// `spec.priority`.
    pub priority: i32,
    /// The only ready replica of its controller (Deployment, StatefulSet, ...): read with the pool's
    /// `protect-single-replica` opt-in.
    pub only_ready_replica: bool,
}

/// What a pod's `karpenter.sh/do-not-disrupt` annotation says at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DoNotDisrupt {
    /// No annotation, or a duration that has run out.
    No,
    /// `"true"`, or a duration still running.
    Yes,
    /// Neither `"true"` nor a duration: ignored, with a warning naming the value.
    Invalid(String),
}

impl PodFacts {
    /// Not terminal and not terminating.
    pub fn active(&self) -> bool {
        !self.terminal && !self.terminating
    }

    /// Needs a new place if its node goes: active (or a terminating StatefulSet pod), neither a
    /// DaemonSet pod nor a mirror pod.
    pub fn reschedulable(&self) -> bool {
        let alive = self.active() || (self.owner == Owner::StatefulSet && self.terminating && !self.terminal);
        alive && !matches!(self.owner, Owner::DaemonSet | Owner::Node)
    }

    /// The drain would evict it: active, not a mirror pod, not tolerating the disrupted taint.
    pub fn evictable(&self) -> bool {
        self.active() && self.owner != Owner::Node && !self.tolerates_disrupted
    }

    /// Needs a place now if its node goes (upstream's "currently reschedulable", §4.3, §5.5):
    /// [`PodFacts::reschedulable`], and nothing keeps it on its node for good — an active
    /// do-not-disrupt, a PodDisruptionBudget whose spec forbids every eviction, or several PDBs
    /// (the eviction API refuses such a pod). A PDB that allows no eviction *now* does not keep
    /// it: it goes once the budget allows, and needs its place then.
    pub fn currently_reschedulable(&self, now: Timestamp) -> bool {
        self.reschedulable() && !self.kept(now)
    }

    /// Kept on its node for good, as far as disruption can tell.
    fn kept(&self, now: Timestamp) -> bool {
        if self.active() && self.do_not_disrupt_at(now) == DoNotDisrupt::Yes {
            return true;
        }
        if !self.evictable() {
            return false;
        }
        self.pdbs.len() > 1 || self.pdbs.iter().any(|p| p.fully_blocking && (self.ready || !p.always_allow_unhealthy))
    }

    /// `clamp(1 + deletion_cost / 2^27 + priority / 2^25, −10, 10)` (§4.4).
    pub fn eviction_cost(&self) -> f64 {
        (1.0 + f64::from(self.deletion_cost) / 2f64.powi(27) + f64::from(self.priority) / 2f64.powi(25))
            .clamp(-10.0, 10.0)
    }

    /// When a do-not-disrupt duration that holds at `now` stops holding (the pod's start plus the
    /// duration, in whole seconds as [`PodFacts::do_not_disrupt_at`] counts); `None` for `true`,
    /// `false`, an unknown start or a duration already over.
    pub fn do_not_disrupt_ends(&self, now: Timestamp) -> Option<Timestamp> {
        let duration = parse_go_duration(self.do_not_disrupt.as_deref()?)?;
        let seconds = i64::try_from(duration.as_secs()).ok()?;
        let end = self.started?.checked_add(jiff::SignedDuration::from_secs(seconds)).ok()?;
        (end > now).then_some(end)
    }

    /// The annotation's verdict at `now`: `"true"` holds forever, a duration (`30m`) from the pod's
    /// start; a pod without a known start keeps a duration in force (the cautious reading).
    pub fn do_not_disrupt_at(&self, now: Timestamp) -> DoNotDisrupt {
        let Some(value) = self.do_not_disrupt.as_deref() else {
            return DoNotDisrupt::No;
        };
        // Go's duration syntax, as Karpenter reads the annotation (`1.5h`, `+30m`, `90s`).
        match do_not_disrupt_holds(value, self.started.map(|started| now.duration_since(started).as_secs())) {
            Some(true) => DoNotDisrupt::Yes,
            Some(false) => DoNotDisrupt::No,
            None => DoNotDisrupt::Invalid(value.to_string()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testkit::{node, now, pdb, pod, scope};
    use jiff::SignedDuration;

    /// A do-not-disrupt duration's end is a change time alone brings: announced, and the verdict
    /// flips there and not a second before.
    #[test]
    fn a_do_not_disrupt_duration_says_when_it_runs_out() {
        let started = now() - SignedDuration::from_mins(10);
        let p = |value: &str| PodFacts { do_not_disrupt: Some(value.into()), started: Some(started), ..pod("web") };
        let end = started + SignedDuration::from_mins(30);
        assert_eq!(p("30m").do_not_disrupt_ends(now()), Some(end));
        assert_eq!(p("30m").do_not_disrupt_at(end - SignedDuration::from_secs(1)), DoNotDisrupt::Yes);
        assert_eq!(p("30m").do_not_disrupt_at(end), DoNotDisrupt::No);
        assert_eq!(p("5m").do_not_disrupt_ends(now()), None, "already over");
        assert_eq!(p("true").do_not_disrupt_ends(now()), None, "never ends");
        assert_eq!(p("banana").do_not_disrupt_ends(now()), None);
        assert_eq!(
            PodFacts { started: None, ..p("30m") }.do_not_disrupt_ends(now()),
            None,
            "holds while the start is unknown"
        );
        let mut n = node("a", 1.0);
        n.pods = vec![p("1h"), p("30m"), pod("plain")];
        assert_eq!(scope(vec![n]).next_change(now()), Some(end), "the scope's first change");
        assert_eq!(scope(vec![node("b", 1.0)]).next_change(now()), None, "no schedule, no duration");
    }

    /// Upstream's "currently reschedulable" (karpenter-semantics §5.5): only what keeps a pod on
    /// its node for good holds its room back.
    #[test]
    fn a_pod_is_currently_reschedulable_unless_something_keeps_it_for_good() {
        let mut p = PodFacts { ready: true, ..pod("web") };
        assert!(p.currently_reschedulable(now()));
        // A PDB allowing nothing now (minAvailable 1 of 1): it still leaves, later.
        p.pdbs = vec![pdb("now", 0)];
        assert!(p.currently_reschedulable(now()));
        // A PDB whose spec forbids every eviction, or two PDBs: it stays.
        p.pdbs[0].fully_blocking = true;
        assert!(!p.currently_reschedulable(now()));
        p.pdbs = vec![pdb("a", 1), pdb("b", 1)];
        assert!(!p.currently_reschedulable(now()));
        // An unhealthy pod under a fully blocking PDB with AlwaysAllow is evicted anyway.
        p.pdbs = vec![PdbFacts { fully_blocking: true, always_allow_unhealthy: true, ..pdb("p", 0) }];
        p.ready = false;
        assert!(p.currently_reschedulable(now()));
        // An active do-not-disrupt keeps it; one run out does not.
        let mut p = PodFacts { ready: true, do_not_disrupt: Some("true".into()), ..pod("web") };
        assert!(!p.currently_reschedulable(now()));
        p.do_not_disrupt = Some("30m".into());
        p.started = Some(now() - jiff::SignedDuration::from_mins(31));
        assert!(p.currently_reschedulable(now()));
        // A DaemonSet pod never needs a place.
        let ds = PodFacts { owner: Owner::DaemonSet, ..pod("ds") };
        assert!(!ds.currently_reschedulable(now()));
    }
}
