//! The NodeClaim lifecycle as one pure function (karpenter-semantics §5, §6): from a claim, what
//! the hub observed of its Node, NodeGroup and pods, the time and the settings, to a [`Decision`]:
//! the writes to make, in order, and when to look again. Launch, registration, initialization,
//! liveness (launch and registration TTLs, expiry, repair), consistency and termination are all
//! here, so every transition is a table test.
//!
//! Owns: every choice of the NodeClaim controller. Must not: do I/O, read the clock, log, or decide
//! which pods a drain evicts (that is [`crate::decisions::termination`]'s, called from here).
//! The controller gathers [`Facts`], calls [`decide`], and carries out the [`Write`]s; when a
//! decision rests on the absence of a NodeGroup that the cache alone cannot prove, the decision asks
//! for an uncached read ([`Decision::needs_live_group`]) and makes no write until it has one.

use std::time::Duration;

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use crate::decisions::{
    conditions::{self, FALSE, TRUE, UNKNOWN},
    disruption_conditions,
    node_registration::{self, NodeMatch},
    ownership,
    termination::{self, PodFacts, expiration::Expiry},
};
use crds::{NodeClaim, NodeClaimStatus, labels};

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

/// Node repair (§6.5): a Node whose `Ready` condition has been `False` or `Unknown` for the
/// toleration is replaced, unless too many of its pool's nodes are unhealthy at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepairPolicy {
    pub enabled: bool,
    /// How long `Ready=False` / `Ready=Unknown` is tolerated (30 min).
    pub toleration: Duration,
    /// More than `ceil(fraction × nodes)` unhealthy nodes in the pool blocks repair (0.2).
    pub max_unhealthy_fraction: f64,
}

impl Default for RepairPolicy {
    fn default() -> Self {
        Self { enabled: true, toleration: Duration::from_secs(30 * 60), max_unhealthy_fraction: 0.2 }
    }
}

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

/// What the hub knows of the claim's NodeGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// In the cache; nothing read live (enough while the group is there).
    Cached,
    /// Absent from the cache (or terminating there), not confirmed by a live read yet.
    MissingFromCache,
    /// An uncached read: there and not being deleted; `ours` is whether the ownership proof names
    /// this very claim (name and UID), else why not.
    Present { ours: Result<(), String> },
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
    pub attachments: Option<&'a [termination::Attachment]>,
    pub pool: PoolHealth,
    /// The claim's NodePool (`None`: gone), for its drift and `consolidateAfter`.
    pub nodepool: Option<&'a crds::NodePool>,
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
    /// Replace the Node with this one (optimistic concurrency: it carries the resourceVersion read).
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
    Drain(termination::Decision),
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

/// Decide one pass over a claim in a connected, synced cluster.
pub fn decide(f: &Facts<'_>, s: &Settings) -> Decision {
    let claim = f.claim;
    let has_finalizer = claim.finalizers().iter().any(|x| x == labels::TERMINATION_FINALIZER);
    if claim.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Decision::default();
        }
        return terminate(f);
    }
    if !has_finalizer {
        // Before anything launches, so a deleted claim always passes through termination.
        return Decision::default().then(Write::AddFinalizer);
    }
    // §4.1: expiry is forceful (no budget, no replacement first); the deletion drains the node.
    let expire_after = Some(claim.spec.expire_after.as_str()).filter(|e| !e.is_empty());
    let expiry = match termination::expiration::decide(
        claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        expire_after,
        false,
        f.now,
    ) {
        Ok(Expiry::Expire) => {
            let lifetime = expire_after.unwrap_or_default();
            return Decision::default()
                .then(Write::DeleteClaim(DeleteReason::Expired))
                .event(
                    false,
                    termination::expiration::EXPIRED,
                    "Delete",
                    format!("expireAfter {lifetime} reached; the node is drained and its pods re-planned"),
                )
                .because(format!("expireAfter {lifetime} reached; deleting the claim (forceful: no disruption budget); its node is drained"));
        }
        Ok(e) => e.recheck_in(f.now),
        Err(why) => {
            // Admission refuses these; one written around it is never expired by guess.
            let d = Decision::default().event(true, "InvalidExpireAfter", "Expire", why.to_string());
            return merge(d, live(f, s, None));
        }
    };
    live(f, s, expiry)
}

/// Prepend `first`'s writes to `then`'s.
fn merge(first: Decision, mut then: Decision) -> Decision {
    let mut writes = first.writes;
    writes.append(&mut then.writes);
    then.writes = writes;
    then
}

/// A claim that is not being deleted: launch, registration, initialization, liveness.
fn live(f: &Facts<'_>, s: &Settings, expiry: Option<Duration>) -> Decision {
    let claim = f.claim;
    let now = f.now;
    let observed = claim.metadata.generation;
    let mut status = claim.status.clone().unwrap_or_default();
    if !conditions::is_true(&status.conditions, LAUNCHED) {
        return launch(f, s, status);
    }
    let provider_id = status.provider_id.clone().unwrap_or_default();
    let group = ownership::parse_provider_id(&provider_id).map(str::to_string).unwrap_or_default();
    let registered = conditions::is_true(&status.conditions, REGISTERED);
    let mut d = Decision::default();
    let mut changed = false;
    let mut requeue = SETTLED;
    match &f.node {
        NodeMatch::NotFound if !group.is_empty() && matches!(f.group, Group::MissingFromCache) => {
            // Absence in the cache proves nothing (a group whose labels were stripped): read it live.
            return Decision::live_group();
        }
        NodeMatch::NotFound if !group.is_empty() && f.group.gone() => {
            return instance_lost(claim, registered, &group);
        }
        NodeMatch::NotFound if registered => {
            // The Node went away but its group is still there (CKE replacing it): wait, keep Registered.
            requeue = SOON;
        }
        NodeMatch::NotFound => {
            changed |= awaiting_node(&mut status, observed, now);
            requeue = SOON;
        }
        NodeMatch::Many(n) => {
            changed |= conditions::set(
                &mut status.conditions,
                REGISTERED,
                FALSE,
                "MultipleNodesFound",
                &format!("{n} nodes carry provider ID {provider_id}"),
                observed,
                now,
            );
        }
        NodeMatch::One(node) if node.metadata.deletion_timestamp.is_some() => {
            // §5.2: deleting the Node deletes its claim; termination then deletes the NodeGroup and
            // releases the Node.
            return Decision::default()
                .then(Write::DeleteClaim(DeleteReason::NodeDeleted))
                .because(format!("node {} is being deleted; deleting its claim", node.name_any()));
        }
        NodeMatch::One(node)
            if !group.is_empty()
                && registered
                && unhealthy_since(node).is_some()
                && (matches!(f.group, Group::MissingFromCache) || f.group.gone()) =>
        {
            // §5.2 / §7: a NotReady Node whose NodeGroup vanished is an instance that is gone (its
            // VM will not come back); a Ready one is left to drain normally. Only a live read proves
            // the group's absence (missing from the cache: read it live first).
            if !f.group.gone() {
                return Decision::live_group();
            }
            return Decision::default().then(Write::DeleteClaim(DeleteReason::InstanceGone)).because(format!(
                "node {} is not Ready and its NodeGroup {group} is gone; deleting the claim",
                node.name_any()
            ));
        }
        NodeMatch::One(node) if !registered => {
            let desired = node_registration::registered_node(node, claim);
            status.node_name = Some(node.name_any());
            changed |= conditions::set(&mut status.conditions, REGISTERED, TRUE, "Registered", "", observed, now);
            // What blocks initialization of the Node as registered, in the same status write (the
            // next pass would write it alone); a Node with nothing blocking is initialized by the
            // next pass, once the registration is read back.
            if let Some((reason, message)) = node_registration::initialization_blocker(&desired, claim) {
                conditions::set(&mut status.conditions, INITIALIZED, UNKNOWN, reason, &message, observed, now);
            }
            // Counted by the pass that registers the Node; a pass reading a claim status that lags
            // behind (the Node change wakes it) only writes the condition.
            if &desired != *node {
                d = d
                    .then(Write::RegisterNode(Box::new(desired)))
                    .then(Write::NodeCreated)
                    .then(Write::RegistrationOutcome { registered: true })
                    .because(format!("node {} registered", node.name_any()));
            }
            requeue = Duration::from_secs(1);
        }
        NodeMatch::One(node) => {
            // §6.3: initialization runs until Initialized=True, then never again (a node going
            // NotReady later is liveness's and repair's business, not a step back).
            let initialized = conditions::is_true(&status.conditions, INITIALIZED);
            let blocker = if initialized { None } else { node_registration::initialization_blocker(node, claim) };
            match blocker {
                Some((reason, message)) => {
                    changed |=
                        conditions::set(&mut status.conditions, INITIALIZED, UNKNOWN, reason, &message, observed, now);
                    requeue = SOON;
                }
                None => {
                    if !initialized {
                        d = d
                            .then(Write::LabelInitialized { node: node.name_any() })
                            .because(format!("node {} initialized", node.name_any()));
                        changed |= conditions::set(
                            &mut status.conditions,
                            INITIALIZED,
                            TRUE,
                            "Initialized",
                            "",
                            observed,
                            now,
                        );
                    }
                    // §6.6: the node CKE made has the shape we paid for (judged from the pass that
                    // initializes it on, in the same status write).
                    let verdict = node_registration::consistency(node, claim);
                    let (st, reason, message) = match &verdict {
                        Ok(()) => (TRUE, "ConsistentStateFound", String::new()),
                        Err(why) => (FALSE, "ConsistencyCheckFailed", why.clone()),
                    };
                    if conditions::set(
                        &mut status.conditions,
                        CONSISTENT_STATE_FOUND,
                        st,
                        reason,
                        &message,
                        observed,
                        now,
                    ) {
                        changed = true;
                        if let Err(why) = verdict {
                            d = d
                                .event(true, "FailedConsistencyCheck", "Check", why.clone())
                                .because(format!("node {} differs from its flavor: {why}", node.name_any()));
                        }
                    }
                }
            }
            // Repair is for nodes that worked: one that never became Ready is the registration
            // and initialization timeouts' business.
            let repairable = if conditions::is_true(&status.conditions, INITIALIZED) {
                repair(node, f.pool, &s.repair, now)
            } else {
                Repair::Healthy
            };
            match repairable {
                Repair::Healthy => {}
                Repair::RecheckIn(t) => requeue = requeue.min(t),
                Repair::Blocked { condition, limit } => {
                    d = d
                        .event(
                            true,
                            NODE_REPAIR_BLOCKED,
                            "Repair",
                            format!(
                                "node {} has been {condition} past its toleration, but {} of the pool's {} nodes are unhealthy (at most {limit} repaired at once)",
                                node.name_any(),
                                f.pool.unhealthy,
                                f.pool.nodes
                            ),
                        )
                        .because(format!("repair of node {} blocked: too many unhealthy nodes in its pool", node.name_any()));
                    requeue = requeue.min(REPAIR_BLOCKED_RETRY);
                }
                Repair::Now { condition } => {
                    // §6.5: immediate forced deletion, overriding any pool grace period, ignoring
                    // budgets and do-not-disrupt.
                    let note = format!(
                        "node {} has been {condition} for longer than {:?}; replacing it",
                        node.name_any(),
                        s.repair.toleration
                    );
                    return Decision::default()
                        .then(Write::TerminationTimestamp(now))
                        .then(Write::DeleteClaim(DeleteReason::Unhealthy))
                        .event(true, UNHEALTHY, "Repair", note.clone())
                        .because(note);
                }
            }
        }
    }
    // §4.1: what the disruption loop reads, for launched claims; Empty and Consolidatable only once
    // the node is initialized.
    let outcome = disruption_conditions::update(
        &mut status,
        claim.labels(),
        claim.annotations(),
        disruption_conditions::Origin {
            pool: f.nodepool,
            class: f.nodeclass,
            offered: f.offered,
            created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        },
        f.node_pods,
        observed,
        now,
    );
    changed |= outcome.changed;
    if !conditions::is_true(&status.conditions, INITIALIZED) {
        changed |= conditions::remove(&mut status.conditions, disruption_conditions::CONSOLIDATABLE);
        changed |= conditions::remove(&mut status.conditions, disruption_conditions::EMPTY);
    } else if let Some(t) = outcome.recheck_in {
        requeue = requeue.min(t);
    }
    if let Some((hash, version)) = outcome.restamp {
        d = d.then(Write::RestampPoolHash { hash, version });
    }
    if let Some(why) = outcome.warning {
        d = d.event(true, "InvalidConsolidateAfter", "Disrupt", why);
    }
    let ready = conditions::is_true(&status.conditions, LAUNCHED)
        && conditions::is_true(&status.conditions, REGISTERED)
        && conditions::is_true(&status.conditions, INITIALIZED);
    changed |= conditions::set(
        &mut status.conditions,
        READY,
        if ready { TRUE } else { UNKNOWN },
        if ready { "Ready" } else { "NotReady" },
        "",
        observed,
        now,
    );
    // Registration TTL, measured from the condition's last transition (§6.4).
    if !conditions::is_true(&status.conditions, REGISTERED)
        && conditions::age(&status.conditions, REGISTERED, now).is_some_and(|a| a >= s.registration_ttl)
    {
        return d
            .then(Write::Status(Box::new(status)))
            .then(Write::RegistrationOutcome { registered: false })
            .then(Write::DeleteClaim(DeleteReason::RegistrationTimeout))
            .event(true, "RegistrationTimeout", "Delete", format!("no node registered within {:?}", s.registration_ttl))
            .because("node did not register in time; deleting the claim");
    }
    if !conditions::is_true(&status.conditions, REGISTERED)
        && let Some(age) = conditions::age(&status.conditions, REGISTERED, now)
    {
        requeue = requeue.min(s.registration_ttl.saturating_sub(age));
    }
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

/// The registration of `read` (the Node as cached) into `desired` ([`Write::RegisterNode`]) as a
/// JSON patch (RFC 6902) of only what the hub changes: the labels and annotations it sets, its
/// finalizer added, and the taints replaced, each list after a `test` that it is still as read.
/// The taints are the list others change too (the kubelet and the node lifecycle controller remove
/// `node.kubernetes.io/not-ready`): a concurrent change there fails the test (422) and the next
/// pass retries on the new list, while a change anywhere else (the Node's status, heartbeats, labels
/// of others) no longer conflicts as the whole-object `replace` did. `None` when nothing differs.
pub fn registration_patch(read: &Node, desired: &Node) -> Option<serde_json::Value> {
    use serde_json::json;
    // JSON pointer escaping of a map key (RFC 6901).
    let key = |k: &str| k.replace('~', "~0").replace('/', "~1");
    let mut ops = Vec::new();
    let maps = [
        ("labels", read.metadata.labels.as_ref(), desired.metadata.labels.as_ref()),
        ("annotations", read.metadata.annotations.as_ref(), desired.metadata.annotations.as_ref()),
    ];
    for (field, have, want) in maps {
        let Some(want) = want else { continue };
        match have {
            None => ops.push(json!({"op": "add", "path": format!("/metadata/{field}"), "value": want})),
            Some(have) => {
                for (k, v) in want.iter().filter(|(k, v)| have.get(*k) != Some(*v)) {
                    ops.push(json!({"op": "add", "path": format!("/metadata/{field}/{}", key(k)), "value": v}));
                }
            }
        }
    }
    // The finalizer appended to the list as read (tested, so a stale read never adds it twice), or
    // the list created when the Node has none (a Node joins without finalizers; registration
    // follows within seconds, before any other controller finalizes it).
    let have = read.metadata.finalizers.as_deref().unwrap_or_default();
    let missing: Vec<&String> = desired.metadata.finalizers.iter().flatten().filter(|f| !have.contains(f)).collect();
    if !missing.is_empty() {
        match &read.metadata.finalizers {
            None => ops.push(json!({"op": "add", "path": "/metadata/finalizers", "value": missing})),
            Some(list) => {
                ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": list}));
                for f in missing {
                    ops.push(json!({"op": "add", "path": "/metadata/finalizers/-", "value": f}));
                }
            }
        }
    }
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
    let (have, want) = (taints(read), taints(desired));
    if have != want {
        match (&have, &want) {
            (None, Some(w)) => ops.push(json!({"op": "add", "path": "/spec/taints", "value": w})),
            (Some(h), None) => {
                ops.push(json!({"op": "test", "path": "/spec/taints", "value": h}));
                ops.push(json!({"op": "remove", "path": "/spec/taints"}));
            }
            (Some(h), Some(w)) => {
                ops.push(json!({"op": "test", "path": "/spec/taints", "value": h}));
                ops.push(json!({"op": "replace", "path": "/spec/taints", "value": w}));
            }
            (None, None) => {}
        }
    }
    (!ops.is_empty()).then_some(serde_json::Value::Array(ops))
}

/// Which copy of a claim a pass decides from: the one read (the controller's cache), or `written`,
/// the claim as this controller's last status write returned it `age` ago, while the read copy
/// does not show that write yet (the watch lags behind it). Only this controller writes a claim's
/// status, so a read status other than the written one means the read copy is older, until `fresh`
/// has passed; a read copy being deleted while the written one is not is newer whatever its status.
/// Deciding from a lagging copy would write the same status again, and re-set conditions the
/// write had set (moving their `lastTransitionTime`).
pub fn freshest<'a>(read: &'a NodeClaim, written: Option<(&'a NodeClaim, Duration)>, fresh: Duration) -> &'a NodeClaim {
    match written {
        Some((w, age))
            if age < fresh
                && w.metadata.uid == read.metadata.uid
                && w.status != read.status
                && (read.metadata.deletion_timestamp.is_none() || w.metadata.deletion_timestamp.is_some()) =>
        {
            w
        }
        _ => read,
    }
}

/// Before `Launched=True`: mark Launching, enforce the launch TTL, else launch.
fn launch(f: &Facts<'_>, s: &Settings, mut status: NodeClaimStatus) -> Decision {
    let d = Decision::default();
    let launching = conditions::get(&status.conditions, LAUNCHED).is_none().then(|| {
        conditions::set(&mut status.conditions, LAUNCHED, UNKNOWN, "Launching", "", f.claim.metadata.generation, f.now);
        Box::new(status.clone())
    });
    if conditions::age(&status.conditions, LAUNCHED, f.now).is_some_and(|a| a >= s.launch_ttl) {
        return d
            .then(Write::RegistrationOutcome { registered: false })
            .then(Write::DeleteClaim(DeleteReason::LaunchTimeout))
            .event(true, "LaunchTimeout", "Delete", format!("not launched within {:?}", s.launch_ttl))
            .because("claim did not launch in time; deleting it");
    }
    d.then(Write::Launch(launching))
}

/// What the launch sequence reported.
#[derive(Debug, Clone, PartialEq)]
pub enum LaunchOutcome {
    /// The NodeGroup exists (created or adopted) and CKE accepted it or gave no verdict in time.
    Launched {
        provider_id: String,
        capacity: std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        allocatable: std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    },
    /// A NodeGroup of that name belongs to someone else.
    Conflict(String),
    /// An API failure; retried.
    Failed(String),
}

/// The claim's status after a launch attempt (§6.1): `Launched=True` and `Registered=Unknown` on
/// success; `Launched=Unknown` with the reason otherwise.
pub fn launched(claim: &NodeClaim, outcome: &LaunchOutcome, now: Timestamp) -> NodeClaimStatus {
    let observed = claim.metadata.generation;
    let mut status = claim.status.clone().unwrap_or_default();
    match outcome {
        LaunchOutcome::Launched { provider_id, capacity, allocatable } => {
            status.provider_id = Some(provider_id.clone());
            status.capacity = Some(capacity.clone());
            status.allocatable = Some(allocatable.clone());
            conditions::set(&mut status.conditions, LAUNCHED, TRUE, "Launched", "", observed, now);
            awaiting_node(&mut status, observed, now);
            // What the next pass would add (`live`'s root condition): written now, in the same patch.
            conditions::set(&mut status.conditions, READY, UNKNOWN, "NotReady", "", observed, now);
        }
        LaunchOutcome::Conflict(why) => {
            conditions::set(&mut status.conditions, LAUNCHED, UNKNOWN, "NodeGroupConflict", why, observed, now);
        }
        LaunchOutcome::Failed(why) => {
            conditions::set(&mut status.conditions, LAUNCHED, UNKNOWN, "LaunchFailed", why, observed, now);
        }
    }
    status
}

/// `Registered=Unknown(NodeNotFound)`: launched, no Node carries the provider ID yet. Whether it changed.
fn awaiting_node(status: &mut NodeClaimStatus, observed: Option<i64>, now: Timestamp) -> bool {
    conditions::set(
        &mut status.conditions,
        REGISTERED,
        UNKNOWN,
        "NodeNotFound",
        "node not registered with cluster",
        observed,
        now,
    )
}

/// The claim's NodeGroup went away without the hub deleting it. Before registration it is a vanish
/// (clever-cloud.md §3.7): the flavor cools down and an event says so; either way the claim is
/// deleted so its pods are re-planned at once instead of at the registration timeout.
fn instance_lost(claim: &NodeClaim, registered: bool, group: &str) -> Decision {
    if registered {
        return Decision::default()
            .then(Write::DeleteClaim(DeleteReason::InstanceGone))
            .because(format!("NodeGroup {group} and its Node are gone; deleting the claim"));
    }
    let flavor = claim.labels().get(labels::INSTANCE_TYPE).cloned().unwrap_or_default();
    let mut d = Decision::default();
    if !flavor.is_empty() {
        d = d.then(Write::RecordVanish { flavor: flavor.clone() });
    }
    d.event(
        true,
        "NodeGroupVanished",
        "Register",
        format!("NodeGroup {group} disappeared before its node registered; the claim is replaced"),
    )
    .then(Write::DeleteClaim(DeleteReason::Vanished))
    .because(format!(
        "NodeGroup {group} (flavor {flavor}) disappeared before its node registered; deleting the claim so its pods are re-planned"
    ))
}

/// The repair verdict for one registered Node.
#[derive(Debug, Clone, PartialEq)]
pub enum Repair {
    Healthy,
    /// Unhealthy, within its toleration: look again then.
    RecheckIn(Duration),
    /// Past its toleration, but the pool is over its cap.
    Blocked {
        condition: String,
        limit: usize,
    },
    /// Past its toleration: replace it now.
    Now {
        condition: String,
    },
}

/// When the Node's `Ready` condition is `False` or `Unknown`, since when (its last transition).
pub fn unhealthy_since(node: &Node) -> Option<(String, Timestamp)> {
    let ready = node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    let since = ready.last_transition_time.as_ref()?.0;
    Some((format!("Ready={}", ready.status), since))
}

/// Whether a Node is past a repair toleration (it counts toward its pool's cap).
pub fn past_toleration(node: &Node, policy: &RepairPolicy, now: Timestamp) -> bool {
    policy.enabled
        && unhealthy_since(node).is_some_and(|(_, since)| {
            Duration::try_from(now.duration_since(since)).unwrap_or_default() >= policy.toleration
        })
}

/// §6.5: at the toleration, more than `ceil(fraction × nodes)` of the pool's nodes past it blocks the
/// repair; otherwise the node is replaced.
pub fn repair(node: &Node, pool: PoolHealth, policy: &RepairPolicy, now: Timestamp) -> Repair {
    if !policy.enabled {
        return Repair::Healthy;
    }
    let Some((condition, since)) = unhealthy_since(node) else {
        return Repair::Healthy;
    };
    let age = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    if age < policy.toleration {
        return Repair::RecheckIn(policy.toleration - age);
    }
    // The cap counts this node too (the controller counts every node of the pool past toleration).
    let limit = (policy.max_unhealthy_fraction * pool.nodes as f64).ceil() as usize;
    if pool.unhealthy > limit {
        return Repair::Blocked { condition, limit };
    }
    Repair::Now { condition }
}

/// A claim being deleted (§5.1, §5.2): the deadline written once; the Node (registered claims only)
/// tainted, drained in order and marked Drained, unless it is NotReady with its NodeGroup gone; then
/// the NodeGroup deleted and awaited, the Node's finalizer released and the claim's removed.
fn terminate(f: &Facts<'_>) -> Decision {
    let claim = f.claim;
    let now = f.now;
    let annotation = claim.annotations().get(labels::TERMINATION_TIMESTAMP).cloned();
    let mut d = Decision::default();
    match termination::deadline_to_write(
        claim.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        claim.spec.termination_grace_period.as_deref(),
        annotation.as_deref(),
    ) {
        Ok(Some(deadline)) => {
            // The annotation change wakes the next pass, which reads it back.
            return d.then(Write::TerminationTimestamp(deadline)).event(
                false,
                "TerminationGracePeriodSet",
                "Terminate",
                format!("pods left on the node at {deadline} are deleted regardless of budgets"),
            );
        }
        Ok(None) => {}
        Err(why) => d = d.event(true, "InvalidTerminationGracePeriod", "Terminate", why),
    }
    let deadline = termination::parse_deadline(annotation.as_deref());
    let mut status = claim.status.clone().unwrap_or_default();
    // Unregistered claims never drain (§5.1.2); a Node already gone has nothing left.
    let registered = conditions::is_true(&status.conditions, REGISTERED);
    if registered
        && let NodeMatch::One(node) = &f.node
        && !conditions::is_true(&status.conditions, termination::DRAINED)
    {
        let ready = termination::node_ready(node);
        let drain = if ready {
            true
        } else {
            let group = match &f.group {
                Group::Cached | Group::MissingFromCache => {
                    return Decision { writes: d.writes, ..Decision::live_group() };
                }
                Group::NotFound => termination::GroupState::NotFound,
                Group::Terminating => termination::GroupState::Terminating,
                Group::Present { .. } => termination::GroupState::Present,
            };
            termination::must_drain(ready, group)
        };
        if !drain {
            d = d
                .event(
                    false,
                    termination::DRAIN_SKIPPED,
                    "Terminate",
                    format!("node {} is NotReady and its NodeGroup is gone: no pod evicted", node.name_any()),
                )
                .because(format!(
                    "node {} is NotReady and its NodeGroup is gone; releasing the claim without a drain",
                    node.name_any()
                ));
        } else {
            return drain_pass(f, d, node, deadline, &mut status);
        }
    }
    let mut changed = false;
    // §5.2 step 6: a drained Node's volumes detach before its instance goes, until the deadline.
    if registered
        && let NodeMatch::One(node) = &f.node
        && conditions::is_true(&status.conditions, termination::DRAINED)
    {
        let Some(attachments) = f.attachments else {
            return Decision { writes: d.writes, needs_attachments: true, ..Decision::default() };
        };
        let blocking = termination::blocking_attachments(attachments, f.pods);
        let generation = claim.metadata.generation;
        if blocking.is_empty() {
            changed |= conditions::set(
                &mut status.conditions,
                termination::VOLUMES_DETACHED,
                TRUE,
                "VolumesDetached",
                "",
                generation,
                now,
            );
        } else if deadline.is_none_or(|dl| now < dl) {
            let message = format!("waiting for VolumeAttachments {} of node {}", blocking.join(", "), node.name_any());
            if conditions::set(
                &mut status.conditions,
                termination::VOLUMES_DETACHED,
                UNKNOWN,
                termination::AWAITING_VOLUME_DETACHMENT,
                &message,
                generation,
                now,
            ) {
                d = d.then(Write::Status(Box::new(status.clone()))).because(message);
            }
            return d.requeue(termination::DRAIN_REQUEUE);
        } else {
            let message = format!("VolumeAttachments {} still there at the termination deadline", blocking.join(", "));
            changed |= conditions::set(
                &mut status.conditions,
                termination::VOLUMES_DETACHED,
                FALSE,
                termination::GRACE_PERIOD_ELAPSED,
                &message,
                generation,
                now,
            );
        }
    }
    // The group: deleted by this claim when it is its own, never otherwise.
    let gone = match &f.group {
        Group::Cached | Group::MissingFromCache => return Decision { writes: d.writes, ..Decision::live_group() },
        Group::NotFound | Group::Terminating => true,
        Group::Present { ours: Ok(()) } => {
            if changed {
                d = d.then(Write::Status(Box::new(status)));
            }
            return d.then(Write::DeleteGroup).requeue(SOON).because("deleting the NodeGroup");
        }
        Group::Present { ours: Err(why) } => {
            // Not ours: never delete it; the claim itself may go.
            d = d.event(true, "NodeGroupConflict", "Terminate", format!("NodeGroup was not deleted: {why}"));
            true
        }
    };
    debug_assert!(gone);
    // The group is going: release our Node finalizer so CKE's can delete the Node.
    d = d.then(Write::ReleaseNodeFinalizers);
    // An accepted group whose node registered frees real capacity once fully gone; a rejected
    // group never registers a node, and a vanish happens before registration.
    if registered && matches!(f.group, Group::NotFound | Group::Terminating) {
        d = d.then(Write::ReleaseCapacity { gone: f.group == Group::NotFound });
    }
    changed |= conditions::set(
        &mut status.conditions,
        INSTANCE_TERMINATING,
        TRUE,
        "InstanceTerminating",
        "",
        claim.metadata.generation,
        now,
    );
    if changed {
        d = d.then(Write::Status(Box::new(status)));
    }
    d.then(Write::RemoveFinalizer)
}

/// One drain pass over a Node (§5.2 steps 4–5): taint and label it, mark `Drained=Unknown(Draining)`,
/// then evict per [`termination::decide`] until it is empty and at least [`termination::MIN_DRAIN`]
/// went by, then `Drained=True`.
fn drain_pass(
    f: &Facts<'_>,
    mut d: Decision,
    node: &Node,
    deadline: Option<Timestamp>,
    status: &mut NodeClaimStatus,
) -> Decision {
    let tainted = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT && t.effect == "NoSchedule" && t.value.is_none())
    });
    let labelled =
        node.labels().get(labels::EXCLUDE_FROM_LB).map(String::as_str) == Some(termination::EXCLUDE_FROM_LB_VALUE);
    if !tainted || !labelled {
        d = d
            .then(Write::TaintNode)
            .because(format!("node {} tainted karpenter.sh/disrupted; draining", node.name_any()));
    }
    let generation = f.claim.metadata.generation;
    let started = conditions::get(&status.conditions, termination::DRAINED)
        .filter(|c| c.status == UNKNOWN && c.reason == termination::DRAINING)
        .map(|c| c.last_transition_time.0);
    if started.is_none() {
        conditions::set(
            &mut status.conditions,
            termination::DRAINED,
            UNKNOWN,
            termination::DRAINING,
            "",
            generation,
            f.now,
        );
        // The status change wakes the next pass, which reads when draining began back.
        return d.then(Write::Status(Box::new(status.clone()))).requeue(termination::DRAIN_REQUEUE);
    }
    let pass = termination::decide(f.pods, deadline, started, f.now);
    let complete = pass.complete;
    let requeue = pass.requeue.unwrap_or(termination::DRAIN_REQUEUE);
    d = d.then(Write::Drain(pass));
    if !complete {
        return d.requeue(requeue);
    }
    conditions::set(&mut status.conditions, termination::DRAINED, TRUE, "Drained", "", generation, f.now);
    // The next pass reads Drained=True back and deletes the NodeGroup.
    d.then(Write::Status(Box::new(status.clone())))
        .then(Write::NodeDrained)
        .requeue(Duration::from_millis(100))
        .because(format!("node {} drained", node.name_any()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeSpec, NodeStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
        jiff::SignedDuration,
    };

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn claim() -> NodeClaim {
        let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": "c1", "namespace": "team-a", "uid": "u1", "generation": 1,
                "creationTimestamp": t(0).to_string(),
                "finalizers": [labels::TERMINATION_FINALIZER],
                "labels": {labels::NODEPOOL: "general", labels::INSTANCE_TYPE: "M"}},
            "spec": {"clusterName": "prod", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}, "requirements": []},
        }))
        .unwrap();
        c.spec.expire_after = String::new();
        c
    }

    fn launched_claim() -> NodeClaim {
        let mut c = claim();
        let outcome = LaunchOutcome::Launched {
            provider_id: "clevercloud://ng-1".into(),
            capacity: Default::default(),
            allocatable: Default::default(),
        };
        c.status = Some(launched(&c, &outcome, t(10)));
        c
    }

    fn registered_claim() -> NodeClaim {
        let mut c = launched_claim();
        let s = c.status.as_mut().unwrap();
        conditions::set(&mut s.conditions, REGISTERED, TRUE, "Registered", "", Some(1), t(20));
        conditions::set(&mut s.conditions, INITIALIZED, TRUE, "Initialized", "", Some(1), t(20));
        s.node_name = Some("n1".into());
        c
    }

    fn node(ready: &str, since: Timestamp) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(
                    [
                        (labels::REGISTERED.to_string(), "true".to_string()),
                        (labels::INITIALIZED.to_string(), "true".to_string()),
                    ]
                    .into(),
                ),
                finalizers: Some(vec![labels::TERMINATION_FINALIZER.into()]),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec { provider_id: Some("clevercloud://ng-1".into()), ..NodeSpec::default() }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_transition_time: Some(Time(since)),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    fn facts<'a>(claim: &'a NodeClaim, node: NodeMatch<'a>, group: Group, now: Timestamp) -> Facts<'a> {
        Facts {
            claim,
            node,
            group,
            pods: &[],
            attachments: Some(&[]),
            pool: PoolHealth { nodes: 1, unhealthy: 0 },
            nodepool: None,
            nodeclass: None,
            offered: None,
            node_pods: &[],
            now,
        }
    }

    fn deletes(d: &Decision) -> Option<DeleteReason> {
        d.writes.iter().find_map(|w| match w {
            Write::DeleteClaim(r) => Some(*r),
            _ => None,
        })
    }

    fn has(d: &Decision, pred: impl Fn(&Write) -> bool) -> bool {
        d.writes.iter().any(pred)
    }

    fn status_of(d: &Decision) -> Option<&NodeClaimStatus> {
        d.writes.iter().rev().find_map(|w| match w {
            Write::Status(s) => Some(s.as_ref()),
            _ => None,
        })
    }

    #[test]
    fn a_claim_without_finalizer_gets_it_before_anything_else() {
        let mut c = claim();
        c.metadata.finalizers = None;
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(1)), &Settings::default());
        assert_eq!(d.writes, vec![Write::AddFinalizer]);
    }

    #[test]
    fn a_new_claim_is_marked_launching_and_launched() {
        let c = claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(1)), &Settings::default());
        // One status write at most: Launching goes with the launch, written alone only if the
        // launch concludes nothing in this pass.
        assert_eq!(status_of(&d), None, "{d:?}");
        let Some(Write::Launch(Some(s))) = d.writes.last() else { panic!("no launch with its status: {d:?}") };
        assert_eq!(conditions::get(&s.conditions, LAUNCHED).unwrap().reason, "Launching");
        assert_eq!(conditions::get(&s.conditions, LAUNCHED).unwrap().last_transition_time.0, t(1));
    }

    #[test]
    fn launch_ttl_deletes_the_claim_from_the_condition_transition() {
        let mut c = claim();
        let mut s = NodeClaimStatus::default();
        conditions::set(&mut s.conditions, LAUNCHED, UNKNOWN, "Launching", "", Some(1), t(100));
        c.status = Some(s);
        let settings = Settings::default();
        let before = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(100 + 299)), &settings);
        assert_eq!(deletes(&before), None);
        // Launching already written: the launch carries no status of its own.
        assert!(has(&before, |w| *w == Write::Launch(None)));
        let at = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(100 + 300)), &settings);
        assert_eq!(deletes(&at), Some(DeleteReason::LaunchTimeout));
        assert!(has(&at, |w| *w == Write::RegistrationOutcome { registered: false }));
    }

    #[test]
    fn launch_outcomes_set_the_conditions() {
        let c = claim();
        let ok = launched(
            &c,
            &LaunchOutcome::Launched {
                provider_id: "clevercloud://ng-1".into(),
                capacity: Default::default(),
                allocatable: Default::default(),
            },
            t(5),
        );
        assert!(conditions::is_true(&ok.conditions, LAUNCHED));
        assert_eq!(conditions::get(&ok.conditions, REGISTERED).unwrap().reason, "NodeNotFound");
        assert_eq!(ok.provider_id.as_deref(), Some("clevercloud://ng-1"));
        let conflict = launched(&c, &LaunchOutcome::Conflict("not ours".into()), t(5));
        assert_eq!(conditions::get(&conflict.conditions, LAUNCHED).unwrap().reason, "NodeGroupConflict");
        let failed = launched(&c, &LaunchOutcome::Failed("503".into()), t(5));
        assert_eq!(conditions::get(&failed.conditions, LAUNCHED).unwrap().reason, "LaunchFailed");
    }

    #[test]
    fn no_node_yet_waits_then_registration_ttl_deletes() {
        let c = launched_claim();
        let s = Settings::default();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(60)), &s);
        assert_eq!(deletes(&d), None);
        assert_eq!(d.requeue, Some(SOON));
        // §10.11 item 151: no Node 15 min after launch.
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(10 + 900)), &s);
        assert_eq!(deletes(&d), Some(DeleteReason::RegistrationTimeout));
        assert!(has(&d, |w| matches!(w, Write::Event(e) if e.reason == "RegistrationTimeout")));
    }

    #[test]
    fn a_group_missing_from_the_cache_is_read_live_before_anything_is_deleted() {
        let c = launched_claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::MissingFromCache, t(60)), &Settings::default());
        assert!(d.needs_live_group);
        assert!(d.writes.is_empty());
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(60)), &Settings::default());
        assert_eq!(deletes(&d), Some(DeleteReason::Vanished));
        assert!(has(&d, |w| *w == Write::RecordVanish { flavor: "M".into() }));
        let c = registered_claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(60)), &Settings::default());
        assert_eq!(deletes(&d), Some(DeleteReason::InstanceGone));
        assert!(!has(&d, |w| matches!(w, Write::RecordVanish { .. })));
    }

    #[test]
    fn a_registered_claim_whose_node_went_keeps_registered_while_its_group_is_there() {
        let c = registered_claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(60)), &Settings::default());
        assert_eq!(deletes(&d), None);
        assert_eq!(d.requeue, Some(SOON));
    }

    #[test]
    fn several_nodes_with_the_provider_id_set_registered_false() {
        let c = launched_claim();
        let d = decide(&facts(&c, NodeMatch::Many(2), Group::Cached, t(60)), &Settings::default());
        let s = status_of(&d).unwrap();
        assert_eq!(conditions::get(&s.conditions, REGISTERED).unwrap().reason, "MultipleNodesFound");
    }

    #[test]
    fn a_joining_node_is_registered_and_counted_once() {
        let c = launched_claim();
        let mut n = node("True", t(0));
        n.metadata.labels = None;
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        assert!(has(&d, |w| matches!(w, Write::RegisterNode(_))));
        assert!(has(&d, |w| *w == Write::NodeCreated));
        let s = status_of(&d).unwrap();
        assert!(conditions::is_true(&s.conditions, REGISTERED));
        assert_eq!(s.node_name.as_deref(), Some("n1"));
        // A pass on a Node already registered (the claim status lagging) writes only the condition.
        let registered = node_registration::registered_node(&n, &c);
        let d = decide(&facts(&c, NodeMatch::One(&registered), Group::Cached, t(61)), &Settings::default());
        assert!(!has(&d, |w| matches!(w, Write::RegisterNode(_) | Write::NodeCreated)));
        assert!(status_of(&d).is_some());
    }

    #[test]
    fn a_launched_claim_waiting_for_its_node_writes_nothing_more() {
        // `launched` writes what the next pass would add (Ready=Unknown); Empty, which the
        // disruption conditions set and a claim not initialized drops again, is no change either.
        let c = launched_claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(11)), &Settings::default());
        assert_eq!(status_of(&d), None, "{d:?}");
        assert_eq!(conditions::get(&c.status.as_ref().unwrap().conditions, READY).unwrap().reason, "NotReady");
    }

    #[test]
    fn registration_writes_what_blocks_initialization_in_the_same_status() {
        let c = launched_claim();
        let mut n = node("False", t(0));
        n.metadata.labels = None;
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        let writes = d.writes.iter().filter(|w| matches!(w, Write::Status(_))).count();
        assert_eq!(writes, 1, "{d:?}");
        let s = status_of(&d).unwrap();
        assert!(conditions::is_true(&s.conditions, REGISTERED));
        let init = conditions::get(&s.conditions, INITIALIZED).expect("Initialized set at registration");
        assert_eq!((init.status.as_str(), init.reason.as_str()), (UNKNOWN, "NodeNotReady"));
        // Read back, the blocker unchanged: nothing to write.
        let mut back = c.clone();
        back.status = Some(s.clone());
        let registered = node_registration::registered_node(&n, &c);
        let d = decide(&facts(&back, NodeMatch::One(&registered), Group::Cached, t(61)), &Settings::default());
        assert_eq!(status_of(&d), None, "{d:?}");
    }

    #[test]
    fn the_pass_that_initializes_a_node_also_judges_its_consistency() {
        let mut c = registered_claim();
        conditions::remove(&mut c.status.as_mut().unwrap().conditions, INITIALIZED);
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        assert!(has(&d, |w| matches!(w, Write::LabelInitialized { .. })), "{d:?}");
        let s = status_of(&d).unwrap();
        assert!(conditions::is_true(&s.conditions, INITIALIZED));
        assert!(conditions::get(&s.conditions, CONSISTENT_STATE_FOUND).is_some(), "{s:?}");
        assert!(conditions::is_true(&s.conditions, READY));
    }

    #[test]
    fn a_pass_decides_from_its_own_last_write_while_the_cache_lags() {
        let fresh = Duration::from_secs(10);
        let read = claim();
        let written = launched_claim();
        let mut other = launched_claim();
        other.metadata.uid = Some("u2".into());
        let mut deleting = read.clone();
        deleting.metadata.deletion_timestamp = Some(Time(t(5)));
        type Case<'a> = (&'a str, &'a NodeClaim, Option<(&'a NodeClaim, Duration)>, bool);
        let cases: [Case<'_>; 6] = [
            ("nothing written", &read, None, false),
            ("the cache lags behind the write", &read, Some((&written, Duration::from_secs(1))), true),
            ("the cache shows the write", &written, Some((&written, Duration::from_secs(1))), false),
            ("the write is too old to trust", &read, Some((&written, fresh)), false),
            ("another claim of that name", &read, Some((&other, Duration::from_secs(1))), false),
            ("the read copy is being deleted", &deleting, Some((&written, Duration::from_secs(1))), false),
        ];
        for (what, read, written, want_written) in cases {
            let got = freshest(read, written, fresh);
            assert_eq!(std::ptr::eq(got, read), !want_written, "{what}");
        }
    }

    /// The RFC 6902 operations `registration_patch` uses, as the API server applies them (a failed
    /// `test` panics here).
    fn apply_ops(v: &mut serde_json::Value, ops: &[serde_json::Value]) {
        for op in ops {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let value = op.get("value").cloned();
            match op["op"].as_str().unwrap() {
                "test" => assert_eq!(v.pointer(path), value.as_ref(), "test of {path} failed"),
                "remove" => {
                    v.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(&last);
                }
                "add" | "replace" => match v.pointer_mut(parent).unwrap() {
                    serde_json::Value::Array(a) if last == "-" => a.push(value.unwrap()),
                    serde_json::Value::Object(m) => {
                        m.insert(last, value.unwrap());
                    }
                    other => panic!("{path}: cannot add to {other}"),
                },
                other => panic!("unexpected op {other}"),
            }
        }
    }

    fn taint(key: &str, effect: &str) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint { key: key.into(), effect: effect.into(), ..Default::default() }
    }

    #[test]
    fn registration_patches_only_what_the_hub_owns_and_tests_the_taints() {
        let mut read = node("False", t(0));
        read.metadata.labels = Some([("a/b".to_string(), "1".to_string())].into());
        read.metadata.finalizers = None;
        read.spec.as_mut().unwrap().taints = Some(vec![
            taint(labels::UNREGISTERED_TAINT, "NoExecute"),
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
        ]);
        let desired = node_registration::registered_node(&read, &claim());
        let ops = registration_patch(&read, &desired).unwrap();
        let ops = ops.as_array().unwrap();
        let has_op = |op: &str, path: &str| ops.iter().any(|o| o["op"] == op && o["path"] == path);
        // Labels one by one (JSON pointer escaping), the label already there untouched.
        assert!(has_op("add", "/metadata/labels/karpenter.sh~1registered"), "{ops:?}");
        assert!(!ops.iter().any(|o| o["path"] == "/metadata/labels/a~1b"), "{ops:?}");
        assert!(has_op("add", "/metadata/finalizers"), "{ops:?}");
        // The taints replaced only if they are still the ones read: the unregistered taint goes,
        // the kubelet's not-ready taint stays.
        let test = ops.iter().position(|o| o["op"] == "test" && o["path"] == "/spec/taints").expect("a test");
        let replace = ops.iter().position(|o| o["op"] == "replace" && o["path"] == "/spec/taints").expect("a replace");
        assert!(test < replace);
        assert_eq!(ops[test]["value"].as_array().unwrap().len(), 2);
        assert_eq!(
            ops[replace]["value"],
            serde_json::json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
        );
        assert!(!ops.iter().any(|o| o["path"].as_str().is_some_and(|p| p.starts_with("/status"))), "{ops:?}");
        // Applied, it gives the registered Node.
        let mut v = serde_json::to_value(&read).unwrap();
        apply_ops(&mut v, ops);
        assert_eq!(serde_json::from_value::<Node>(v).unwrap(), desired);
        // A Node already registered: no patch at all.
        assert_eq!(registration_patch(&desired, &desired), None);
        // A Node with a finalizer of someone else's: ours appended to the list as read, tested.
        read.metadata.finalizers = Some(vec!["example.com/other".into()]);
        let desired = node_registration::registered_node(&read, &claim());
        let ops = registration_patch(&read, &desired).unwrap();
        let ops = ops.as_array().unwrap();
        assert!(ops.iter().any(|o| o["op"] == "test" && o["path"] == "/metadata/finalizers"), "{ops:?}");
        let mut v = serde_json::to_value(&read).unwrap();
        apply_ops(&mut v, ops);
        assert_eq!(serde_json::from_value::<Node>(v).unwrap(), desired);
    }

    #[test]
    fn a_startup_taint_removed_by_its_agent_is_never_added_back() {
        // §10.11 item 148: startup taints are synced at registration only.
        let mut c = registered_claim();
        c.spec.startup_taints = vec![
            serde_json::from_value(serde_json::json!({"key": "cni.example/not-ready", "effect": "NoSchedule"}))
                .unwrap(),
        ];
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        assert!(!has(&d, |w| matches!(w, Write::RegisterNode(_))), "{d:?}");
    }

    #[test]
    fn a_deleted_node_deletes_its_claim() {
        let c = registered_claim();
        let mut n = node("True", t(0));
        n.metadata.deletion_timestamp = Some(Time(t(50)));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(60)), &Settings::default());
        assert_eq!(deletes(&d), Some(DeleteReason::NodeDeleted));
    }

    #[test]
    fn a_not_ready_node_whose_group_vanished_deletes_its_claim_after_a_live_read() {
        // §10.12 item 156 (issue 11 item 4): the instance is gone; a Ready node is left alone.
        let c = registered_claim();
        let not_ready = node("False", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&not_ready), Group::MissingFromCache, t(60)), &Settings::default());
        assert!(d.needs_live_group && d.writes.is_empty(), "absence in the cache proves nothing: {d:?}");
        let d = decide(&facts(&c, NodeMatch::One(&not_ready), Group::NotFound, t(60)), &Settings::default());
        assert_eq!(deletes(&d), Some(DeleteReason::InstanceGone));
        let d = decide(
            &facts(&c, NodeMatch::One(&not_ready), Group::Present { ours: Ok(()) }, t(60)),
            &Settings::default(),
        );
        assert_eq!(deletes(&d), None, "the group is there: repair's business");
        let ready = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&ready), Group::MissingFromCache, t(60)), &Settings::default());
        assert!(!d.needs_live_group && deletes(&d).is_none(), "a Ready node is never taken for gone");
    }

    #[test]
    fn expiry_deletes_forcefully_and_otherwise_rechecks_at_the_expiry() {
        let mut c = registered_claim();
        c.spec.expire_after = "1h".into();
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(3599)), &Settings::default());
        assert_eq!(deletes(&d), None);
        assert_eq!(d.requeue, Some(Duration::from_secs(1)));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(3600)), &Settings::default());
        assert_eq!(deletes(&d), Some(DeleteReason::Expired));
        assert_eq!(DeleteReason::Expired.disrupted_label(), Some("expired"));
    }

    #[test]
    fn an_unreadable_expire_after_is_reported_and_never_expires() {
        let mut c = registered_claim();
        c.spec.expire_after = "soon".into();
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(99_999)), &Settings::default());
        assert_eq!(deletes(&d), None);
        assert!(has(&d, |w| matches!(w, Write::Event(e) if e.reason == "InvalidExpireAfter")));
    }

    #[test]
    fn repair_waits_for_the_toleration_then_replaces_ignoring_budgets() {
        // §10.11 item 154: a Node Ready=False for 30 min.
        let c = registered_claim();
        let n = node("False", t(100));
        let s = Settings::default();
        let pool = PoolHealth { nodes: 3, unhealthy: 1 };
        let mut f = facts(&c, NodeMatch::One(&n), Group::Cached, t(100 + 1799));
        f.pool = pool;
        let d = decide(&f, &s);
        assert_eq!(deletes(&d), None);
        assert_eq!(d.requeue, Some(Duration::from_secs(1)));
        f.now = t(100 + 1800);
        let d = decide(&f, &s);
        assert_eq!(d.writes[0], Write::TerminationTimestamp(t(1900)));
        assert_eq!(deletes(&d), Some(DeleteReason::Unhealthy));
        // Ready=Unknown (the kubelet stopped reporting) counts the same.
        let n = node("Unknown", t(100));
        let mut f = facts(&c, NodeMatch::One(&n), Group::Cached, t(100 + 1800));
        f.pool = pool;
        assert_eq!(deletes(&decide(&f, &s)), Some(DeleteReason::Unhealthy));
    }

    #[test]
    fn a_node_that_never_initialized_is_not_repaired() {
        // It never worked: the registration and initialization timeouts deal with it.
        let mut c = registered_claim();
        let s = c.status.as_mut().unwrap();
        conditions::set(&mut s.conditions, INITIALIZED, UNKNOWN, "NodeNotReady", "", Some(1), t(20));
        let n = node("False", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(99_999)), &Settings::default());
        assert_eq!(deletes(&d), None);
        assert!(!has(&d, |w| matches!(w, Write::Event(e) if e.reason == NODE_REPAIR_BLOCKED)));
    }

    #[test]
    fn repair_is_capped_at_twenty_percent_of_the_pool() {
        // §10.11 item 155: 3 of 10 unhealthy > ceil(2) ⇒ blocked, event, retry in 5 min.
        let c = registered_claim();
        let n = node("False", t(0));
        let mut f = facts(&c, NodeMatch::One(&n), Group::Cached, t(4000));
        f.pool = PoolHealth { nodes: 10, unhealthy: 3 };
        let d = decide(&f, &Settings::default());
        assert_eq!(deletes(&d), None);
        assert!(has(&d, |w| matches!(w, Write::Event(e) if e.reason == NODE_REPAIR_BLOCKED)));
        assert!(d.requeue.is_some_and(|r| r <= REPAIR_BLOCKED_RETRY), "looked at again within 5 min");
        // 2 of 10 is within the cap; 1 of 3 too (ceil(0.6) = 1).
        f.pool = PoolHealth { nodes: 10, unhealthy: 2 };
        assert_eq!(deletes(&decide(&f, &Settings::default())), Some(DeleteReason::Unhealthy));
        f.pool = PoolHealth { nodes: 3, unhealthy: 1 };
        assert_eq!(deletes(&decide(&f, &Settings::default())), Some(DeleteReason::Unhealthy));
        // Switched off: never repaired.
        let off =
            Settings { repair: RepairPolicy { enabled: false, ..RepairPolicy::default() }, ..Settings::default() };
        assert_eq!(deletes(&decide(&f, &off)), None);
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

    fn deleting(mut c: NodeClaim, at: Timestamp) -> NodeClaim {
        c.metadata.deletion_timestamp = Some(Time(at));
        c
    }

    #[test]
    fn termination_writes_the_deadline_once() {
        let mut c = deleting(registered_claim(), t(100));
        c.spec.termination_grace_period = Some("1h".into());
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(101)), &Settings::default());
        assert_eq!(
            d.writes[0],
            Write::TerminationTimestamp(t(100).checked_add(SignedDuration::from_hours(1)).unwrap())
        );
        c.metadata.annotations = Some([(labels::TERMINATION_TIMESTAMP.to_string(), t(3700).to_string())].into());
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(101)), &Settings::default());
        assert!(!has(&d, |w| matches!(w, Write::TerminationTimestamp(_))));
    }

    #[test]
    fn termination_taints_marks_draining_drains_then_marks_drained() {
        // §10.10 item 135.
        let c = deleting(registered_claim(), t(100));
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(101)), &Settings::default());
        assert_eq!(d.writes[0], Write::TaintNode);
        let s = status_of(&d).unwrap();
        assert_eq!(conditions::get(&s.conditions, termination::DRAINED).unwrap().reason, termination::DRAINING);
        // Next pass: draining began at 101; empty node, 5 s later ⇒ Drained (§10.10 item 141).
        let mut c2 = c.clone();
        c2.status = Some(s.clone());
        let mut tainted = n.clone();
        tainted.metadata.labels.as_mut().unwrap().insert(labels::EXCLUDE_FROM_LB.into(), "karpenter".into());
        tainted.spec.as_mut().unwrap().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
            key: labels::DISRUPTED_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        let early = decide(&facts(&c2, NodeMatch::One(&tainted), Group::Cached, t(103)), &Settings::default());
        assert!(!has(&early, |w| *w == Write::NodeDrained));
        assert!(!has(&early, |w| *w == Write::TaintNode));
        let done = decide(&facts(&c2, NodeMatch::One(&tainted), Group::Cached, t(106)), &Settings::default());
        assert!(has(&done, |w| *w == Write::NodeDrained));
        assert!(conditions::is_true(&status_of(&done).unwrap().conditions, termination::DRAINED));
    }

    #[test]
    fn a_drained_claim_deletes_its_own_group_and_waits_for_it() {
        let mut c = deleting(registered_claim(), t(100));
        let s = c.status.as_mut().unwrap();
        conditions::set(&mut s.conditions, termination::DRAINED, TRUE, "Drained", "", Some(1), t(110));
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(111)), &Settings::default());
        assert!(d.needs_live_group, "the group is read live before it is deleted");
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(111)), &Settings::default());
        assert_eq!(d.writes.last(), Some(&Write::DeleteGroup));
        assert!(conditions::is_true(&status_of(&d).unwrap().conditions, termination::VOLUMES_DETACHED));
        assert_eq!(d.requeue, Some(SOON));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Terminating, t(112)), &Settings::default());
        assert_eq!(d.writes.first(), Some(&Write::ReleaseNodeFinalizers));
        assert_eq!(d.writes.last(), Some(&Write::RemoveFinalizer));
        assert!(conditions::is_true(&status_of(&d).unwrap().conditions, INSTANCE_TERMINATING));
    }

    fn drained(mut c: NodeClaim) -> NodeClaim {
        let s = c.status.as_mut().unwrap();
        conditions::set(&mut s.conditions, termination::DRAINED, TRUE, "Drained", "", Some(1), t(110));
        c
    }

    #[test]
    fn the_group_waits_for_volume_attachments_until_the_deadline() {
        // §10.10 item 142.
        let mut c = drained(deleting(registered_claim(), t(100)));
        let n = node("True", t(0));
        let mut f = facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(111));
        f.attachments = None;
        let d = decide(&f, &Settings::default());
        assert!(d.needs_attachments && d.writes.is_empty(), "attachments are read before the group goes");
        let attached = [termination::Attachment {
            name: "csi-1".into(),
            volume: Some("pv-1".into()),
            claim: Some(("default".into(), "data".into())),
        }];
        f.attachments = Some(&attached);
        let d = decide(&f, &Settings::default());
        assert!(!has(&d, |w| *w == Write::DeleteGroup));
        let s = status_of(&d).unwrap();
        assert_eq!(
            conditions::get(&s.conditions, termination::VOLUMES_DETACHED).unwrap().reason,
            termination::AWAITING_VOLUME_DETACHMENT
        );
        // Past the deadline: recorded as elapsed, and the group goes.
        c.metadata.annotations = Some([(labels::TERMINATION_TIMESTAMP.to_string(), t(200).to_string())].into());
        let mut f = facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(201));
        f.attachments = Some(&attached);
        let d = decide(&f, &Settings::default());
        assert!(has(&d, |w| *w == Write::DeleteGroup));
        let s = status_of(&d).unwrap();
        assert_eq!(
            conditions::get(&s.conditions, termination::VOLUMES_DETACHED).unwrap().reason,
            termination::GRACE_PERIOD_ELAPSED
        );
        // Detached: True, the group goes.
        let mut f = facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(150));
        f.attachments = Some(&[]);
        let d = decide(&f, &Settings::default());
        assert!(has(&d, |w| *w == Write::DeleteGroup));
        assert!(conditions::is_true(&status_of(&d).unwrap().conditions, termination::VOLUMES_DETACHED));
    }

    #[test]
    fn a_volume_of_a_pod_the_drain_leaves_alone_does_not_hold_the_group() {
        let attached = [
            termination::Attachment { name: "inline".into(), volume: None, claim: None },
            termination::Attachment {
                name: "ds-vol".into(),
                volume: Some("pv-ds".into()),
                claim: Some(("kube-system".into(), "agent-data".into())),
            },
        ];
        let mut agent = PodFacts::from_pod(&serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {"containers": [], "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "agent-data"}}]}
        })).unwrap());
        assert_eq!(agent.claims, ["agent-data"]);
        assert!(termination::blocking_attachments(&attached, std::slice::from_ref(&agent)).is_empty());
        // Once that pod is gone (or going), its volume is waited for like any other.
        agent.deletion = Some(t(1));
        assert_eq!(termination::blocking_attachments(&attached, &[agent]), ["ds-vol"]);
    }

    #[test]
    fn only_a_registered_claims_group_going_releases_capacity() {
        let released = |d: &Decision| {
            d.writes.iter().find_map(|w| match w {
                Write::ReleaseCapacity { gone } => Some(*gone),
                _ => None,
            })
        };
        let c = deleting(registered_claim(), t(100));
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Terminating, t(101)), &Settings::default());
        assert_eq!(released(&d), Some(false));
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(101)), &Settings::default());
        assert_eq!(released(&d), Some(true));
        let d = decide(
            &facts(&c, NodeMatch::NotFound, Group::Present { ours: Err("another hub's".into()) }, t(101)),
            &Settings::default(),
        );
        assert_eq!(released(&d), None, "a group that is not the claim's frees nothing of the hub's");
        // Launched, never registered (a rejected or vanished group): nothing released.
        let c = deleting(launched_claim(), t(100));
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::NotFound, t(101)), &Settings::default());
        assert_eq!(released(&d), None);
        assert_eq!(d.writes.last(), Some(&Write::RemoveFinalizer));
    }

    #[test]
    fn a_group_that_is_not_the_claims_is_never_deleted() {
        let c = deleting(launched_claim(), t(100));
        let d = decide(
            &facts(&c, NodeMatch::NotFound, Group::Present { ours: Err("another hub's".into()) }, t(101)),
            &Settings::default(),
        );
        assert!(!has(&d, |w| *w == Write::DeleteGroup));
        assert!(has(&d, |w| matches!(w, Write::Event(e) if e.reason == "NodeGroupConflict")));
        assert_eq!(d.writes.last(), Some(&Write::RemoveFinalizer));
    }

    #[test]
    fn an_unregistered_claim_is_never_drained() {
        // §10.10 item 145.
        let c = deleting(launched_claim(), t(100));
        let n = node("True", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(101)), &Settings::default());
        assert_eq!(d.writes, vec![Write::DeleteGroup]);
    }

    #[test]
    fn a_not_ready_node_whose_group_is_gone_is_released_without_a_drain() {
        // §10.10 item 143.
        let c = deleting(registered_claim(), t(100));
        let n = node("False", t(0));
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Cached, t(101)), &Settings::default());
        assert!(d.needs_live_group);
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::NotFound, t(101)), &Settings::default());
        assert!(!has(&d, |w| matches!(w, Write::TaintNode | Write::Drain(_))));
        assert!(has(&d, |w| matches!(w, Write::Event(e) if e.reason == termination::DRAIN_SKIPPED)));
        assert_eq!(d.writes.last(), Some(&Write::RemoveFinalizer));
        // NotReady with the group still there: drained.
        let d = decide(&facts(&c, NodeMatch::One(&n), Group::Present { ours: Ok(()) }, t(101)), &Settings::default());
        assert_eq!(d.writes[0], Write::TaintNode);
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
}
