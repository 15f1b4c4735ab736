//! The NodeClaim lifecycle as one pure function (karpenter-semantics §5, §6): from a claim, what
//! the hub observed of its Node, NodeGroup and pods, the time and the settings, to a [`Decision`]:
//! the writes to make, in order, and when to look again. This module holds the vocabulary every
//! phase shares ([`Facts`] in, [`Write`]s and a [`Decision`] out) and the entry point [`decide`],
//! which runs the phases in order: the finalizer ([`finalizer`]), termination of a claim being
//! deleted (`termination`), expiry, then for a claim that is not being deleted its launch
//! (`launch`), the liveness of its instance and its registration TTL (`liveness`), the
//! registration and initialization of its Node (`registration`), node repair (`repair`), and the
//! conditions the disruption loop reads (`disruption`). Each phase is its own module, so every
//! transition is a table test next to the phase that makes it. Which copy of a claim a pass
//! decides from is `freshness`'s rule.
//!
//! Owns: every choice of the NodeClaim controller, the order of the phases, and the one status a
//! pass writes. Must not: do I/O, read the clock, log, build the API requests that carry a
//! [`Write`] out (the controller's: it says HOW, this says WHAT), or decide which pods a drain
//! evicts (that is [`crate::decisions::termination`]'s, called from `termination`).
//! The controller gathers [`Facts`], calls [`decide`], and carries out the [`Write`]s; when a
//! decision rests on the absence of a NodeGroup that the cache alone cannot prove, the decision asks
//! for an uncached read ([`Decision::needs_live_group`]) and makes no write until it has one.

mod disruption;
#[cfg(test)]
pub(crate) mod fixtures;
mod freshness;
mod launch;
mod liveness;
mod registration;
mod repair;
mod termination;

use std::{ops::ControlFlow, time::Duration};

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use crate::decisions::{
    conditions::{self, TRUE, UNKNOWN},
    node_registration::NodeMatch,
    ownership,
    termination::{Attachment, PodFacts},
};
use crds::{NodeClaim, NodeClaimStatus, labels};

pub use freshness::freshest;
pub use launch::{LaunchOutcome, launched};
pub use repair::{Repair, RepairPolicy, past_toleration, repair, unhealthy_since};

pub const LAUNCHED: &str = "Launched";
pub const REGISTERED: &str = "Registered";
pub const INITIALIZED: &str = "Initialized";
pub const READY: &str = "Ready";
pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
pub const CONSISTENT_STATE_FOUND: &str = "ConsistentStateFound";

/// Event reasons of the lifecycle.
pub const NODE_REPAIR_BLOCKED: &str = "NodeRepairBlocked";
pub const UNHEALTHY: &str = "Unhealthy";

/// How long before a recheck when waiting on something that changes by itself (a Node joining).
const SOON: Duration = Duration::from_secs(2);
/// The periodic look at a settled claim.
const SETTLED: Duration = Duration::from_secs(60);
/// A repair blocked by the pool's cap is retried after this (§6.5).
pub const REPAIR_BLOCKED_RETRY: Duration = Duration::from_secs(300);

/// The settings the lifecycle reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `Launched` not True after this ⇒ the claim is deleted (5 min).
    pub launch_ttl: Duration,
    /// `Registered` not True after this ⇒ the claim is deleted (15 min).
    pub registration_ttl: Duration,
    pub repair: RepairPolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            launch_ttl: Duration::from_secs(300),
            registration_ttl: Duration::from_secs(900),
            repair: RepairPolicy::default(),
        }
    }
}

/// Why a NodeGroup of the claim's name is not the claim's (the ownership proof's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotOurs(pub String);

/// What the hub knows of the claim's NodeGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// In the cache; nothing read live (enough while the group is there).
    Cached,
    /// Absent from the cache (or terminating there), not confirmed by a live read yet.
    MissingFromCache,
    /// An uncached read: there and not being deleted; `ours` is whether the ownership proof names
    /// this very claim (name and UID), else why not.
    Present { ours: Result<(), NotOurs> },
    /// An uncached read: being deleted.
    Terminating,
    /// An uncached read: NotFound.
    NotFound,
}

impl Group {
    /// Gone as far as a launched claim is concerned (§3.7): NotFound, or terminating while the claim
    /// itself is not being deleted.
    fn gone(&self) -> bool {
        matches!(self, Group::Terminating | Group::NotFound)
    }
}

/// How many nodes of the claim's pool there are and how many are unhealthy past a repair
/// toleration (the repair cap's inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolHealth {
    pub nodes: usize,
    pub unhealthy: usize,
}

/// Everything one decision needs, gathered by the controller.
#[derive(Debug)]
pub struct Facts<'a> {
    pub claim: &'a NodeClaim,
    /// The Nodes carrying the claim's provider ID (from the workload cluster's cache).
    pub node: NodeMatch<'a>,
    pub group: Group,
    /// The pods bound to the claim's Node (termination only).
    pub pods: &'a [PodFacts],
    /// The VolumeAttachments of the claim's Node, once read (termination only, after the drain).
    pub attachments: Option<&'a [Attachment]>,
    pub pool: PoolHealth,
    /// The claim's NodePool (`None`: gone), for its drift and `consolidateAfter`.
    pub nodepool: Option<&'a crds::NodePool>,
    /// The claim's cluster has left its fleet pool's selection (drift `ClusterNotSelected`).
    pub departed: bool,
    /// The claim's CleverNodeClass (`None`: gone or not read), for its drift.
    pub nodeclass: Option<&'a crds::CleverNodeClass>,
    /// The flavors the class's catalogue serves now (`None`: not known), for `InstanceTypeNotFound`.
    pub offered: Option<&'a [String]>,
    /// The pods bound to the claim's Node, for `Empty`, `Consolidatable` and `lastPodEventTime`.
    pub node_pods: &'a [&'a scheduling::CompactPod],
    pub now: Timestamp,
}

/// Why the hub deletes a claim; the `reason` of `karpenter_nodeclaims_disrupted_total` where there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    LaunchTimeout,
    RegistrationTimeout,
    Expired,
    Unhealthy,
    /// The Node is being deleted (a user's `kubectl delete node`): the claim goes with it (§5.2).
    NodeDeleted,
    /// The NodeGroup went away on its own before the node registered (clever-cloud.md §3.7).
    Vanished,
    /// The NodeGroup and its Node are gone after registration.
    InstanceGone,
}

impl DeleteReason {
    /// The `reason` label of `karpenter_nodeclaims_disrupted_total`, for the reasons counted there.
    pub fn disrupted_label(self) -> Option<&'static str> {
        match self {
            DeleteReason::LaunchTimeout => Some("launch_timeout"),
            DeleteReason::RegistrationTimeout => Some("registration_timeout"),
            DeleteReason::Expired => Some("expired"),
            DeleteReason::Unhealthy => Some("unhealthy"),
            DeleteReason::NodeDeleted | DeleteReason::Vanished | DeleteReason::InstanceGone => None,
        }
    }
}

/// An event to publish on the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// One write the controller carries out, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Add the termination finalizer to the claim (before anything launches).
    AddFinalizer,
    /// Merge-patch the claim's status with this one.
    Status(Box<NodeClaimStatus>),
    /// Run the launch sequence (create or adopt the NodeGroup, await CKE's verdict) and report its
    /// outcome through [`launched`]. The status given (`Launched=Unknown(Launching)`, set by this
    /// pass) is written only when the launch does not conclude in this pass: a launch that does
    /// writes its outcome in the same single status write.
    Launch(Option<Box<NodeClaimStatus>>),
    /// Make the Node as read this one (the registered Node; the controller writes only what differs).
    RegisterNode(Box<Node>),
    /// Label the Node `karpenter.sh/initialized=true`.
    LabelInitialized {
        node: String,
    },
    /// Write the claim's `karpenter.sh/nodeclaim-termination-timestamp` annotation.
    TerminationTimestamp(Timestamp),
    /// Re-stamp the claim's NodePool hash and hash version (the hash algorithm changed, §1.9).
    RestampPoolHash {
        hash: String,
        version: String,
    },
    /// Delete the claim.
    DeleteClaim(DeleteReason),
    /// The claim's NodeGroup vanished before registration: arm the flavor's cool-down.
    RecordVanish {
        flavor: String,
    },
    /// A registration outcome for the pool's registration health (§6.4).
    RegistrationOutcome {
        registered: bool,
    },
    /// A node was registered (counted once, by the pass that registered it).
    NodeCreated,
    /// Taint the Node `karpenter.sh/disrupted:NoSchedule` and label it out of load balancers.
    TaintNode,
    /// One drain pass: forced deletions and evictions.
    Drain(crate::decisions::termination::Decision),
    /// The Node is drained (counted once).
    NodeDrained,
    /// Delete the claim's NodeGroup (UID precondition).
    DeleteGroup,
    /// Release the hub's finalizer on the Nodes of the claim's NodeGroup.
    ReleaseNodeFinalizers,
    /// Remove the claim's termination finalizer: the claim is gone.
    RemoveFinalizer,
    /// The group of a claim whose node registered (accepted, not a vanish) is going (`gone`: no
    /// longer exists): its capacity is freed once it is fully gone (clever-cloud.md §3.5; see
    /// [`crate::decisions::capacity::CapacityState::group_released`]).
    ReleaseCapacity {
        gone: bool,
    },
    Event(Event),
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub writes: Vec<Write>,
    /// Look again after this; `None`: only when something changes.
    pub requeue: Option<Duration>,
    /// Decide again once the NodeGroup has been read live (no write made).
    pub needs_live_group: bool,
    /// Decide again once the Node's VolumeAttachments have been read (no write made).
    pub needs_attachments: bool,
    /// One line saying why, for the log (empty when nothing happened worth a line).
    pub why: String,
}

impl Decision {
    fn then(mut self, w: Write) -> Self {
        self.writes.push(w);
        self
    }

    fn requeue(mut self, d: Duration) -> Self {
        self.requeue = Some(self.requeue.map_or(d, |r| r.min(d)));
        self
    }

    fn because(mut self, why: impl Into<String>) -> Self {
        self.why = why.into();
        self
    }

    fn live_group() -> Self {
        Decision { needs_live_group: true, ..Decision::default() }
    }

    fn event(self, warning: bool, reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        self.then(Write::Event(Event { warning, reason, action, note: note.into() }))
    }
}

/// The first phase, on the claim alone, whatever the state of its cluster: a claim without the
/// termination finalizer gets it before anything else (before anything launches, so a deleted
/// claim always passes through termination), and one being deleted without it needs nothing.
/// `None`: the finalizer is there; the rest of the lifecycle needs the cluster's [`Facts`]
/// ([`decide`]).
pub fn finalizer(claim: &NodeClaim) -> Option<Decision> {
    if claim.finalizers().iter().any(|x| x == labels::TERMINATION_FINALIZER) {
        return None;
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Some(Decision::default());
    }
    Some(Decision::default().then(Write::AddFinalizer))
}

/// Decide one pass over a claim in a connected, synced cluster.
pub fn decide(f: &Facts<'_>, s: &Settings) -> Decision {
    if let Some(d) = finalizer(f.claim) {
        return d;
    }
    if f.claim.metadata.deletion_timestamp.is_some() {
        return termination::terminate(f);
    }
    let (first, expiry) = match liveness::expiry(f) {
        ControlFlow::Break(expired) => return expired,
        ControlFlow::Continue(until) => until,
    };
    merge(first, live(f, s, expiry))
}

/// Prepend `first`'s writes to `then`'s.
fn merge(first: Decision, mut then: Decision) -> Decision {
    let mut writes = first.writes;
    writes.append(&mut then.writes);
    then.writes = writes;
    then
}

/// A claim that is not being deleted: launch until `Launched=True`, then the phases of a launched
/// claim, then the one status write. `expiry`: when the claim expires, to look again then.
fn live(f: &Facts<'_>, s: &Settings, expiry: Option<Duration>) -> Decision {
    let status = f.claim.status.clone().unwrap_or_default();
    if !conditions::is_true(&status.conditions, LAUNCHED) {
        return launch::launch(f, s, status);
    }
    match phases(f, s, Pass::new(status)) {
        ControlFlow::Break(d) => d,
        ControlFlow::Continue(pass) => pass.finish(f.claim, expiry),
    }
}

/// The phases of a launched claim, in order; any of them may end the pass with a decision of its
/// own (a deletion, a live read to make first).
fn phases(f: &Facts<'_>, s: &Settings, mut p: Pass) -> ControlFlow<Decision, Pass> {
    liveness::instance(f, &p)?;
    match &f.node {
        NodeMatch::One(node) if p.registered => {
            registration::initialize(f, node, &mut p);
            repair::check(f, s, node, &mut p)?;
        }
        _ => registration::register(f, &mut p),
    }
    disruption::conditions(f, &mut p);
    p.ready(f);
    liveness::registration_ttl(f, s, p)
}

/// What a pass over a launched claim builds up, phase after phase.
struct Pass {
    /// The writes so far (the status write comes last, made by [`Pass::finish`]).
    d: Decision,
    /// The claim's status as the phases leave it.
    status: NodeClaimStatus,
    /// Whether a phase touched the status (whether it differs is [`Pass::finish`]'s comparison).
    changed: bool,
    /// When to look again, the soonest any phase asks for.
    requeue: Duration,
    /// The claim's NodeGroup, from its provider ID (empty when that does not parse).
    group: String,
    /// `Registered=True` as read at the start of the pass.
    registered: bool,
}

impl Pass {
    fn new(status: NodeClaimStatus) -> Self {
        let provider_id = status.provider_id.as_deref().unwrap_or_default();
        let group = ownership::parse_provider_id(provider_id).map(str::to_string).unwrap_or_default();
        let registered = conditions::is_true(&status.conditions, REGISTERED);
        Pass { d: Decision::default(), status, changed: false, requeue: SETTLED, group, registered }
    }

    /// Set one condition on the status, remembering that it changed.
    fn set(&mut self, f: &Facts<'_>, kind: &str, status: &str, reason: &str, message: &str) {
        self.changed |= conditions::set(
            &mut self.status.conditions,
            kind,
            status,
            reason,
            message,
            f.claim.metadata.generation,
            f.now,
        );
    }

    /// The root condition: `Ready` once launched, registered and initialized.
    fn ready(&mut self, f: &Facts<'_>) {
        let c = &self.status.conditions;
        let ready = conditions::is_true(c, LAUNCHED)
            && conditions::is_true(c, REGISTERED)
            && conditions::is_true(c, INITIALIZED);
        self.set(f, READY, if ready { TRUE } else { UNKNOWN }, if ready { "Ready" } else { "NotReady" }, "");
    }

    /// The pass's decision: its writes, then the status when it differs from the one read, and the
    /// soonest look again (at the latest when the claim expires).
    fn finish(self, claim: &NodeClaim, expiry: Option<Duration>) -> Decision {
        let Pass { mut d, status, changed, requeue, .. } = self;
        // `changed` says a step touched the status; whether it differs is the comparison (a condition
        // set then removed again in the same pass, as `Empty` before initialization, is no change and
        // no write).
        if changed && claim.status.as_ref() != Some(&status) {
            // The status before the Node writes' follow-ups: a registration's writes go first, so a
            // failed Node write leaves the condition unset and the next pass retries.
            d.writes.push(Write::Status(Box::new(status)));
        }
        let requeue = expiry.map_or(requeue, |e| requeue.min(e));
        d.requeue(requeue)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{fixtures::*, *};

    #[test]
    fn the_finalizer_phase_needs_the_claim_alone() {
        // What the controller carries out before it looks at the claim's cluster.
        let mut c = claim();
        assert_eq!(finalizer(&c), None, "the finalizer is there: the facts decide");
        c.metadata.finalizers = None;
        assert_eq!(finalizer(&c), Some(Decision::default().then(Write::AddFinalizer)));
        let c = deleting(c, t(100));
        assert_eq!(finalizer(&c), Some(Decision::default()), "released: nothing left to do");
    }

    #[test]
    fn a_claim_without_finalizer_gets_it_before_anything_else() {
        let mut c = claim();
        c.metadata.finalizers = None;
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(1)), &Settings::default());
        assert_eq!(d.writes, vec![Write::AddFinalizer]);
    }

    #[test]
    fn a_claim_without_finalizer_being_deleted_needs_nothing() {
        let mut c = deleting(registered_claim(), t(100));
        c.metadata.finalizers = None;
        assert_eq!(
            decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(101)), &Settings::default()),
            Decision::default()
        );
    }

    #[test]
    fn a_healthy_initialized_node_is_ready_and_rechecked_periodically() {
        let c = registered_claim();
        let mut n = node("True", t(0));
        n.metadata.labels.as_mut().unwrap().insert(labels::INITIALIZED.into(), "true".into());
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        assert_eq!(deletes(&d), None);
        let s = status_of(&d).unwrap();
        assert!(conditions::is_true(&s.conditions, READY));
    }
}
