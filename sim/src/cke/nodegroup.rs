//! `sim::cke::nodegroup`: the NodeGroup controller's decisions, as a pure, level-triggered planner.
//!
//! Owns: given the NodeGroups and Nodes the API shows, the time, the configuration and what the
//! controller remembers ([`GroupTracker`]), which writes CKE makes next ([`GroupAction`]) and when
//! to look again. Behaviour (clever-cloud.md §1.3–§1.6): finalizer on sight, `ReconcileInProgress`,
//! verdict after `verdict_delay` (accepted, quota-rejected with CKE's message, or `InvalidFlavor`;
//! judged by the shared organisation when `quota.organization` is set, each group once),
//! `<group>-node<i>` for `i < nodeCount` after `node_join_delay` (re-registered if the Node object is
//! deleted while the group lives, as a kubelet does), extra nodes removed after a scale-down,
//! `status.nodeCount` kept current, optional vanishing, and deletion: `Terminating=True`, Nodes
//! deleted after `node_removal_delay`, finalizer removed once no Node of the group is left.
//!
//! Must not: do I/O or read a clock; wait on anything. The runner executes the actions.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use crds::labels;
use crds::nodegroup::{NodeGroup, NodeGroupStatus, Verdict};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::config::{GroupSelector, SimCkeConfig, rng};
use super::kubelet::is_simulated;
use super::objects::{self, FINALIZER, MAX_NODE_COUNT, NodeSpecInput};
use super::quota::{MemberFigures, QuotaVerdict, Seat, Usage, judge};

/// A write the NodeGroup controller wants made.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupAction {
    /// Set `metadata.finalizers` of `group` to `finalizers` (ours added or removed), guarded by
    /// `resource_version`.
    SetFinalizers {
        /// Group name.
        group: String,
        /// Resource version the list was computed from.
        resource_version: Option<String>,
        /// The full new list.
        finalizers: Vec<String>,
    },
    /// Replace the status of `group`.
    PatchStatus {
        /// Group name.
        group: String,
        /// New status.
        status: Box<NodeGroupStatus>,
    },
    /// Create this Node (JSON of a `v1/Node`, status included).
    CreateNode {
        /// Node name.
        name: String,
        /// UID of the group.
        group_uid: String,
        /// Index of the node in the group.
        index: i32,
        /// The object.
        node: Box<Value>,
    },
    /// Delete this Node.
    DeleteNode {
        /// Node name.
        name: String,
    },
    /// Delete `group` on the platform's own initiative (vanish), with a UID precondition.
    Vanish {
        /// Group name.
        group: String,
        /// Its UID.
        uid: String,
    },
}

impl GroupAction {
    /// A one-line description for logs.
    pub fn summary(&self) -> String {
        match self {
            GroupAction::SetFinalizers { group, finalizers, .. } => {
                format!("set finalizers of NodeGroup {group} to {finalizers:?}")
            }
            GroupAction::PatchStatus { group, status } => {
                format!("write status of NodeGroup {group} (phase {:?})", status.phase)
            }
            GroupAction::CreateNode { name, .. } => format!("create Node {name}"),
            GroupAction::DeleteNode { name } => format!("delete Node {name}"),
            GroupAction::Vanish { group, .. } => format!("delete NodeGroup {group} (vanish)"),
        }
    }
}

/// What the controller remembers between passes, per group UID (lost on restart: everything is
/// re-derived from the API then, only delays restart).
#[derive(Debug, Default)]
pub struct GroupTracker {
    groups: HashMap<String, Track>,
    /// Simulated worker nodes whose group is gone: when first seen so.
    orphans: HashMap<String, DateTime<Utc>>,
    /// Groups the controller made vanish (by name), for reporting.
    vanished: Vec<String>,
    /// Quota reservations left behind by gone groups, and until when they count.
    leaks: Vec<(Usage, DateTime<Utc>)>,
    /// The cluster's place in its organisation (`quota.organization`); dropped with the tracker,
    /// which frees what the cluster counted there.
    seat: Option<Seat>,
}

#[derive(Debug)]
struct Track {
    first_seen: DateTime<Utc>,
    accepted_at: Option<DateTime<Utc>>,
    /// RAM usage hit the limit exactly when accepted.
    at_quota_edge: bool,
    /// The refusal message, once refused for quota.
    refused: Option<String>,
    vanish_at: Option<DateTime<Utc>>,
    vanish_decided: bool,
    vanish_requested: bool,
    deletion_seen: Option<DateTime<Utc>>,
    removal_due: Option<DateTime<Utc>>,
    /// Per node index: when the node is (re)due to join, and how many times it joined.
    joins: BTreeMap<i32, Join>,
    /// Extra nodes (index ≥ nodeCount): when first seen extra.
    extra_seen: HashMap<String, DateTime<Utc>>,
    /// Nodes whose deletion was requested.
    deleting: HashSet<String>,
    /// The group's quota reservation, while it is refused or still in its first reconcile: what
    /// stays reserved for a while once the group is gone (`reservation_leak`).
    leaky: Option<Usage>,
}

#[derive(Debug, Clone, Copy)]
struct Join {
    /// When the current (re)join is due.
    due: DateTime<Utc>,
    /// Created and not yet seen present.
    created: bool,
    /// Seen present since the last creation.
    seen: bool,
    /// Number of (re)joins so far (keys the delay draw).
    round: u32,
}

impl Track {
    fn new(now: DateTime<Utc>) -> Track {
        Track {
            first_seen: now,
            accepted_at: None,
            at_quota_edge: false,
            refused: None,
            vanish_at: None,
            vanish_decided: false,
            vanish_requested: false,
            deletion_seen: None,
            removal_due: None,
            joins: BTreeMap::new(),
            extra_seen: HashMap::new(),
            deleting: HashSet::new(),
            leaky: None,
        }
    }
}

impl GroupTracker {
    /// Names of the groups this controller made vanish, in order.
    pub fn vanished(&self) -> &[String] {
        &self.vanished
    }

    /// A write failed: forget that it was made, so a later pass makes it again. (Status and
    /// finalizer writes need nothing: they are re-derived from the object, which did not change.)
    pub fn failed(&mut self, action: &GroupAction) {
        match action {
            GroupAction::CreateNode { group_uid, index, .. } => {
                if let Some(join) = self.groups.get_mut(group_uid).and_then(|t| t.joins.get_mut(index)) {
                    join.created = false;
                }
            }
            GroupAction::DeleteNode { name } => {
                for track in self.groups.values_mut() {
                    track.deleting.remove(name);
                }
            }
            GroupAction::Vanish { group, uid } => {
                if let Some(track) = self.groups.get_mut(uid) {
                    track.vanish_requested = false;
                }
                if let Some(pos) = self.vanished.iter().rposition(|v| v == group) {
                    self.vanished.remove(pos);
                }
            }
            GroupAction::SetFinalizers { .. } | GroupAction::PatchStatus { .. } => {}
        }
    }
}

/// The outcome of a pass: the writes, and when to look again at the latest (None: only on change).
#[derive(Debug, Default)]
pub struct GroupPlan {
    /// Writes, in order.
    pub actions: Vec<GroupAction>,
    /// The earliest time a pending delay expires.
    pub wake_at: Option<DateTime<Utc>>,
}

impl GroupPlan {
    fn wake(&mut self, at: DateTime<Utc>) {
        if self.wake_at.is_none_or(|w| at < w) {
            self.wake_at = Some(at);
        }
    }
}

fn after(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    t + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The quota usage of a group's nodes, if its flavor is known.
fn group_usage(cfg: &SimCkeConfig, g: &NodeGroup) -> Option<Usage> {
    let f = cfg.flavor(&g.spec.flavor)?;
    Some(Usage::default().plus(f.usage(), i64::from(g.spec.node_count.clamp(0, MAX_NODE_COUNT))))
}

/// The group's verdict; with `remembered`, a verdict this controller gave that the API does not show
/// yet (a lagging watch, a failed status write) stands instead of `Pending`: an organisation judges
/// a group once, and must not count an accepted group as awaiting its verdict.
fn effective_verdict(g: &NodeGroup, track: &Track, remembered: bool) -> Verdict {
    let verdict = g.verdict();
    if remembered && verdict == Verdict::Pending {
        if track.accepted_at.is_some() {
            return Verdict::Accepted;
        }
        if let Some(message) = &track.refused {
            return Verdict::QuotaRejected(Some(message.clone()));
        }
    }
    verdict
}

fn has_finalizer(g: &NodeGroup) -> bool {
    g.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

fn selector_matches(sel: &GroupSelector, g: &NodeGroup, at_edge: bool) -> bool {
    match sel {
        GroupSelector::All => true,
        GroupSelector::NamePrefix(p) => g.metadata.name.as_deref().is_some_and(|n| n.starts_with(p.as_str())),
        GroupSelector::Label(k, v) => g.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v),
        GroupSelector::AtQuotaEdge => at_edge,
    }
}

/// One pass of the NodeGroup controller over `groups` and `nodes` at `now`.
pub fn plan(
    cfg: &SimCkeConfig,
    now: DateTime<Utc>,
    groups: &[NodeGroup],
    nodes: &[Node],
    tracker: &mut GroupTracker,
) -> GroupPlan {
    let mut out = GroupPlan::default();
    let mut groups: Vec<&NodeGroup> = groups.iter().filter(|g| g.metadata.uid.is_some()).collect();
    groups.sort_by(|a, b| {
        let created = |g: &NodeGroup| g.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a).cmp(&created(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });

    // The Nodes CKE made for each group (a hand-made Node carrying the label is not CKE's to delete
    // or wait for).
    let nodes_by_group: HashMap<&str, Vec<&Node>> =
        nodes.iter().filter(|n| is_simulated(n)).fold(HashMap::new(), |mut m, n| {
            if let Some(g) = n.metadata.labels.as_ref().and_then(|l| l.get(labels::CLEVER_NODEGROUP)) {
                m.entry(g.as_str()).or_default().push(n);
            }
            m
        });

    // The organisation follows the configuration: a changed member leaves the previous one.
    let member = cfg.quota.organization.as_ref();
    if tracker.seat.as_ref().map(Seat::member) != member {
        tracker.seat = member.map(Seat::take);
    }
    let remembered = tracker.seat.is_some();

    // Quota accounting: accepted groups hold their VMs until fully gone (terminating included).
    let mut workers = Usage::default();
    // Groups still awaiting their verdict when the pass begins.
    let mut in_flight: HashMap<&str, Usage> = HashMap::new();
    for g in &groups {
        let uid = g.metadata.uid.as_deref().unwrap_or_default();
        let track = tracker.groups.entry(uid.to_string()).or_insert_with(|| Track::new(now));
        let Some(usage) = group_usage(cfg, g) else { continue };
        let verdict = effective_verdict(g, track, remembered);
        track.leaky = matches!(verdict, Verdict::Pending | Verdict::QuotaRejected(_)).then_some(usage);
        match verdict {
            Verdict::Accepted => workers = workers.plus(usage, 1),
            Verdict::Pending if g.metadata.deletion_timestamp.is_none() => {
                in_flight.insert(uid, usage);
            }
            _ => {}
        }
    }

    // Forget groups that are gone; refused or unreconciled ones may leave their reservation behind.
    let live: HashSet<&str> = groups.iter().filter_map(|g| g.metadata.uid.as_deref()).collect();
    let leaks = &mut tracker.leaks;
    tracker.groups.retain(|uid, track| {
        let keep = live.contains(uid.as_str());
        if let (false, Some(usage), Some(d)) = (keep, track.leaky, cfg.reservation_leak) {
            leaks.push((usage, after(now, d)));
        }
        keep
    });
    leaks.retain(|(_, until)| *until > now);
    let accepted = workers;
    let mut leaked = Usage::default();
    for (usage, until) in leaks.iter() {
        workers = workers.plus(*usage, 1);
        leaked = leaked.plus(*usage, 1);
        out.wake(*until);
    }
    // What the organisation counts for this cluster, before any verdict of this pass.
    let figures = |accepted: Usage, judged: &HashSet<String>| MemberFigures {
        control_plane: cfg.quota.control_plane,
        accepted,
        leaked,
        in_flight: in_flight
            .iter()
            .filter(|(uid, _)| !judged.contains(**uid))
            .map(|(uid, usage)| (uid.to_string(), *usage))
            .collect(),
    };
    if let Some(seat) = &tracker.seat {
        seat.publish(figures(accepted, &HashSet::new()));
    }

    let mut accepted_this_pass: HashSet<String> = HashSet::new();
    // Groups judged this pass and what the accepted ones add (the organisation's view at the end).
    let mut judged_this_pass: HashSet<String> = HashSet::new();
    let mut accepted_now = Usage::default();
    for g in &groups {
        let uid = g.metadata.uid.clone().unwrap_or_default();
        let name = g.metadata.name.clone().unwrap_or_default();
        let Some(track) = tracker.groups.get_mut(&uid) else { continue };
        let group_nodes: Vec<&Node> = nodes_by_group.get(name.as_str()).cloned().unwrap_or_default();

        if g.metadata.deletion_timestamp.is_some() {
            plan_deletion(cfg, now, g, &name, &group_nodes, track, &mut out);
            continue;
        }

        if !has_finalizer(g) {
            let mut finalizers = g.metadata.finalizers.clone().unwrap_or_default();
            finalizers.push(FINALIZER.to_string());
            out.actions.push(GroupAction::SetFinalizers {
                group: name.clone(),
                resource_version: g.metadata.resource_version.clone(),
                finalizers,
            });
        }

        match effective_verdict(g, track, remembered) {
            Verdict::Pending => {
                let due = after(track.first_seen, cfg.verdict_delay.draw(cfg.seed, &format!("{name}/verdict")));
                if now < due {
                    if g.status.as_ref().and_then(|s| s.conditions.as_ref()).is_none_or(Vec::is_empty) {
                        out.actions.push(GroupAction::PatchStatus {
                            group: name.clone(),
                            status: Box::new(objects::status_in_progress(g, now)),
                        });
                    }
                    out.wake(due);
                    continue;
                }
                let Some(usage) = group_usage(cfg, g) else {
                    out.actions.push(GroupAction::PatchStatus {
                        group: name.clone(),
                        status: Box::new(objects::status_invalid_flavor(g, now, &cfg.flavors)),
                    });
                    continue;
                };
                let (verdict, limit) = if let Some(seat) = &tracker.seat {
                    // The organisation judges against every member's figures, and counts an
                    // acceptance before anyone else is judged.
                    seat.judge(&uid, usage, cfg.judge_concurrently)
                } else {
                    // Judged together: the others that were in flight when this pass began count too.
                    let others = if cfg.judge_concurrently {
                        in_flight
                            .iter()
                            .filter(|(u, _)| **u != uid.as_str() && !accepted_this_pass.contains(**u))
                            .fold(Usage::default(), |acc, (_, u)| acc.plus(*u, 1))
                    } else {
                        Usage::default()
                    };
                    (judge(&cfg.quota, workers.plus(others, 1), usage), cfg.quota.limit)
                };
                judged_this_pass.insert(uid.clone());
                match verdict {
                    QuotaVerdict::Fits(total) => {
                        workers = workers.plus(usage, 1);
                        accepted_now = accepted_now.plus(usage, 1);
                        accepted_this_pass.insert(uid.clone());
                        track.accepted_at = Some(now);
                        track.at_quota_edge = total.ram_gb == limit.ram_gb;
                        let id = objects::upstream_id(cfg.seed, &name);
                        out.actions.push(GroupAction::PatchStatus {
                            group: name.clone(),
                            status: Box::new(objects::status_accepted(g, now, 0, &id)),
                        });
                        plan_accepted(cfg, now, g, &name, &uid, &group_nodes, track, &mut out, &mut tracker.vanished);
                    }
                    QuotaVerdict::Exceeded(message) => {
                        track.refused = Some(message.clone());
                        out.actions.push(GroupAction::PatchStatus {
                            group: name.clone(),
                            status: Box::new(objects::status_quota_exceeded(g, now, &message)),
                        });
                    }
                }
            }
            Verdict::Accepted => {
                plan_accepted(cfg, now, g, &name, &uid, &group_nodes, track, &mut out, &mut tracker.vanished);
                // Keep status.nodeCount current.
                let present = group_nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()).count();
                let present = i32::try_from(present).unwrap_or(i32::MAX);
                let status = g.status.as_ref();
                // (An acceptance the API does not show yet is written again.)
                if status.and_then(|s| s.node_count) != Some(present)
                    || status.and_then(|s| s.target_node_count) != Some(g.spec.node_count)
                    || g.verdict() != Verdict::Accepted
                {
                    let id = status
                        .and_then(|s| s.upstream_id.clone())
                        .unwrap_or_else(|| objects::upstream_id(cfg.seed, &name));
                    out.actions.push(GroupAction::PatchStatus {
                        group: name.clone(),
                        status: Box::new(objects::status_accepted(g, now, present, &id)),
                    });
                }
            }
            // A refusal the API does not show yet is written again.
            Verdict::QuotaRejected(Some(message)) if g.verdict() == Verdict::Pending => {
                out.actions.push(GroupAction::PatchStatus {
                    group: name.clone(),
                    status: Box::new(objects::status_quota_exceeded(g, now, &message)),
                });
            }
            Verdict::QuotaRejected(_) | Verdict::Failed { .. } => {}
        }
    }
    if let Some(seat) = &tracker.seat {
        seat.publish(figures(accepted.plus(accepted_now, 1), &judged_this_pass));
    }

    // Simulated worker nodes whose group is gone entirely: the VM went with it.
    let names: HashSet<&str> = groups.iter().filter_map(|g| g.metadata.name.as_deref()).collect();
    let mut orphans_now = HashSet::new();
    for n in nodes {
        let simulated = is_simulated(n);
        let Some(group) = n.metadata.labels.as_ref().and_then(|l| l.get(labels::CLEVER_NODEGROUP)) else { continue };
        let Some(node_name) = n.metadata.name.as_deref() else { continue };
        if !simulated || names.contains(group.as_str()) || n.metadata.deletion_timestamp.is_some() {
            continue;
        }
        orphans_now.insert(node_name.to_string());
        let seen = *tracker.orphans.entry(node_name.to_string()).or_insert(now);
        let due = after(seen, cfg.node_removal_delay.draw(cfg.seed, &format!("{node_name}/orphan")));
        if now >= due {
            out.actions.push(GroupAction::DeleteNode { name: node_name.to_string() });
        } else {
            out.wake(due);
        }
    }
    tracker.orphans.retain(|n, _| orphans_now.contains(n));
    out
}

#[allow(clippy::too_many_arguments)]
fn plan_accepted(
    cfg: &SimCkeConfig,
    now: DateTime<Utc>,
    g: &NodeGroup,
    name: &str,
    uid: &str,
    group_nodes: &[&Node],
    track: &mut Track,
    out: &mut GroupPlan,
    vanished: &mut Vec<String>,
) {
    let accepted_at = *track.accepted_at.get_or_insert(now);

    // Vanishing: decided once, at acceptance.
    if !track.vanish_decided {
        track.vanish_decided = true;
        for (i, rule) in cfg.vanish.iter().enumerate() {
            if selector_matches(&rule.selector, g, track.at_quota_edge) {
                let draw = rng(cfg.seed, &format!("{name}/vanish/{i}")).next_f64();
                if draw < rule.probability {
                    track.vanish_at = Some(after(accepted_at, rule.after));
                    break;
                }
            }
        }
    }
    if let Some(at) = track.vanish_at {
        if now >= at {
            if !track.vanish_requested {
                track.vanish_requested = true;
                vanished.push(name.to_string());
                out.actions.push(GroupAction::Vanish { group: name.to_string(), uid: uid.to_string() });
            }
            return;
        }
        out.wake(at);
    }

    let Some(flavor) = cfg.flavor(&g.spec.flavor) else { return };
    let wanted = g.spec.node_count.clamp(0, MAX_NODE_COUNT);
    let present: HashMap<String, &Node> =
        group_nodes.iter().filter_map(|n| Some((n.metadata.name.clone()?, *n))).collect();
    for i in 0..wanted {
        let node_name = objects::node_name(name, i);
        let join = track.joins.entry(i).or_insert_with(|| Join {
            due: after(accepted_at, cfg.node_join_delay.draw(cfg.seed, &format!("{node_name}/join/0"))),
            created: false,
            seen: false,
            round: 0,
        });
        if present.contains_key(&node_name) {
            join.seen = true;
            join.created = false;
            continue;
        }
        if join.created {
            // Created, not visible yet: the watch will show it.
            continue;
        }
        if join.seen {
            // It was there and its Node object is gone while the VM lives: the kubelet registers again.
            join.seen = false;
            join.round += 1;
            join.due = after(now, cfg.node_join_delay.draw(cfg.seed, &format!("{node_name}/join/{}", join.round)));
            track.deleting.remove(&node_name);
        }
        if now < join.due {
            out.wake(join.due);
            continue;
        }
        let taints: Vec<Value> = g
            .spec
            .taints
            .iter()
            .flatten()
            .map(|t| {
                let mut v = json!({"key": t.key, "effect": t.effect});
                if let Some(value) = &t.value {
                    v["value"] = json!(value);
                }
                v
            })
            .collect();
        let input = NodeSpecInput {
            name: &node_name,
            flavor,
            group: Some(name),
            extra_labels: g.spec.labels.as_ref(),
            taints,
            ready: false,
            kubelet_version: &cfg.kubelet_version,
            seed: cfg.seed,
        };
        join.created = true;
        out.actions.push(GroupAction::CreateNode {
            name: node_name.clone(),
            group_uid: uid.to_string(),
            index: i,
            node: Box::new(objects::node_object(&input, now)),
        });
    }
    track.joins.retain(|i, _| *i < wanted);

    // Scale-down: nodes beyond nodeCount go after the removal delay.
    let mut extra_now = HashSet::new();
    for (node_name, node) in &present {
        let beyond = objects::node_index(name, node_name).is_none_or(|i| i >= wanted);
        if !beyond || node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        extra_now.insert(node_name.clone());
        let seen = *track.extra_seen.entry(node_name.clone()).or_insert(now);
        let due = after(seen, cfg.node_removal_delay.draw(cfg.seed, &format!("{node_name}/remove")));
        if now < due {
            out.wake(due);
        } else if track.deleting.insert(node_name.clone()) {
            out.actions.push(GroupAction::DeleteNode { name: node_name.clone() });
        }
    }
    track.extra_seen.retain(|n, _| extra_now.contains(n));
}

#[allow(clippy::too_many_arguments)]
fn plan_deletion(
    cfg: &SimCkeConfig,
    now: DateTime<Utc>,
    g: &NodeGroup,
    name: &str,
    group_nodes: &[&Node],
    track: &mut Track,
    out: &mut GroupPlan,
) {
    if !has_finalizer(g) {
        // Not ours to hold (deleted before CKE saw it, or another party's finalizer).
        return;
    }
    let seen = *track.deletion_seen.get_or_insert(now);
    if !objects::has_terminating(g) {
        out.actions.push(GroupAction::PatchStatus {
            group: name.to_string(),
            status: Box::new(objects::status_terminating(g, now)),
        });
    }
    let due = *track.removal_due.get_or_insert_with(|| {
        // A group whose VM exists (or is being created) takes the teardown delay.
        let has_vm = !group_nodes.is_empty() || track.joins.values().any(|j| j.created || j.seen);
        let delay = if has_vm { cfg.node_removal_delay } else { cfg.empty_group_removal_delay };
        after(seen, delay.draw(cfg.seed, &format!("{name}/teardown")))
    });
    if now < due {
        out.wake(due);
        return;
    }
    for n in group_nodes {
        let Some(node_name) = n.metadata.name.clone() else { continue };
        if n.metadata.deletion_timestamp.is_none() && track.deleting.insert(node_name.clone()) {
            out.actions.push(GroupAction::DeleteNode { name: node_name });
        }
    }
    if group_nodes.is_empty() {
        let finalizers: Vec<String> =
            g.metadata.finalizers.iter().flatten().filter(|f| *f != FINALIZER).cloned().collect();
        out.actions.push(GroupAction::SetFinalizers {
            group: name.to_string(),
            resource_version: g.metadata.resource_version.clone(),
            finalizers,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cke::config::{DelayRange, VanishRule};
    use crate::cke::quota::OrganizationQuota;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_767_225_600 + s, 0).unwrap()
    }

    fn group(name: &str, flavor: &str, created: i64) -> NodeGroup {
        serde_json::from_value(json!({
            "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1", "generation": 1,
                         "creationTimestamp": objects::timestamp(t(created))},
            "spec": {"flavor": flavor, "nodeCount": 1, "labels": {"team": "a"},
                     "taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]},
        }))
        .unwrap()
    }

    /// Applies the plan's writes to the in-memory world, as the API would.
    fn apply(groups: &mut Vec<NodeGroup>, nodes: &mut Vec<Node>, actions: &[GroupAction]) {
        for a in actions {
            match a {
                GroupAction::SetFinalizers { group, finalizers, .. } => {
                    let g = groups.iter_mut().find(|g| g.metadata.name.as_deref() == Some(group)).unwrap();
                    g.metadata.finalizers = Some(finalizers.clone());
                    if finalizers.is_empty() && g.metadata.deletion_timestamp.is_some() {
                        groups.retain(|g| g.metadata.name.as_deref() != Some(group));
                    }
                }
                GroupAction::PatchStatus { group, status } => {
                    let g = groups.iter_mut().find(|g| g.metadata.name.as_deref() == Some(group)).unwrap();
                    g.status = Some((**status).clone());
                }
                GroupAction::CreateNode { node, .. } => nodes.push(serde_json::from_value((**node).clone()).unwrap()),
                GroupAction::DeleteNode { name } => nodes.retain(|n| n.metadata.name.as_deref() != Some(name)),
                GroupAction::Vanish { group, .. } => delete(groups, group),
            }
        }
    }

    fn delete(groups: &mut Vec<NodeGroup>, name: &str) {
        let g = groups.iter_mut().find(|g| g.metadata.name.as_deref() == Some(name)).unwrap();
        if g.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            groups.retain(|g| g.metadata.name.as_deref() != Some(name));
        } else {
            g.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
    }

    struct World {
        cfg: SimCkeConfig,
        groups: Vec<NodeGroup>,
        nodes: Vec<Node>,
        tracker: GroupTracker,
    }

    impl World {
        fn new(cfg: SimCkeConfig) -> World {
            World { cfg, groups: Vec::new(), nodes: Vec::new(), tracker: GroupTracker::default() }
        }
        fn step(&mut self, now: i64) -> GroupPlan {
            let p = plan(&self.cfg, t(now), &self.groups, &self.nodes, &mut self.tracker);
            apply(&mut self.groups, &mut self.nodes, &p.actions);
            p
        }
        fn group(&self, name: &str) -> Option<&NodeGroup> {
            self.groups.iter().find(|g| g.metadata.name.as_deref() == Some(name))
        }
    }

    #[test]
    fn accept_then_node_joins_after_delay() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("ng", "XS", 0));
        let p = w.step(0);
        assert_eq!(p.wake_at, Some(t(1)));
        let g = w.group("ng").unwrap();
        assert!(has_finalizer(g));
        assert_eq!(g.verdict(), Verdict::Pending);
        let p = w.step(1);
        assert!(w.group("ng").unwrap().is_accepted());
        assert_eq!(p.wake_at, Some(t(26)), "node joins 25 s after acceptance");
        assert!(w.nodes.is_empty());
        w.step(26);
        assert_eq!(w.nodes.len(), 1);
        let node = &w.nodes[0];
        assert_eq!(node.metadata.name.as_deref(), Some("ng-node0"));
        assert_eq!(node.metadata.labels.as_ref().unwrap()["team"], "a");
        // Next pass records nodeCount 1.
        w.step(27);
        assert_eq!(w.group("ng").unwrap().status.as_ref().unwrap().node_count, Some(1));
        let p = w.step(28);
        assert!(p.actions.is_empty(), "steady state: {:?}", p.actions);
    }

    #[test]
    fn quota_rejects_with_cke_message_counting_control_plane() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("big", "L", 0));
        w.step(0);
        w.step(1);
        let g = w.group("big").unwrap();
        assert!(g.is_quota_rejected());
        assert_eq!(
            g.verdict(),
            Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB".into()))
        );
        w.step(100);
        assert!(w.nodes.is_empty());
    }

    #[test]
    fn concurrent_creations_are_judged_together() {
        // Room for one M (24 + 16 = 40 GB), not two.
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("m1", "M", 0));
        w.groups.push(group("m2", "M", 0));
        w.step(0);
        w.step(1);
        assert!(w.group("m1").unwrap().is_quota_rejected());
        assert!(w.group("m2").unwrap().is_quota_rejected());

        let mut w = World::new(SimCkeConfig { judge_concurrently: false, ..SimCkeConfig::default() });
        w.groups.push(group("m1", "M", 0));
        w.groups.push(group("m2", "M", 0));
        w.step(0);
        w.step(1);
        assert!(w.group("m1").unwrap().is_accepted());
        assert!(w.group("m2").unwrap().is_quota_rejected());
        // Accepted groups count while they live; once gone, the quota is free again.
        w.groups.push(group("m3", "M", 5));
        w.step(5);
        w.step(6);
        assert!(w.group("m3").unwrap().is_quota_rejected());
    }

    #[test]
    fn unknown_flavor_fails() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("odd", "XXL", 0));
        w.step(0);
        w.step(1);
        let g = w.group("odd").unwrap();
        assert!(matches!(g.verdict(), Verdict::Failed { reason: Some(r), .. } if r == "InvalidFlavor"));
        assert!(!g.is_quota_rejected());
        w.step(100);
        assert!(w.nodes.is_empty());
    }

    #[test]
    fn deletion_waits_for_the_node_then_releases_the_finalizer() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("ng", "2XS", 0));
        w.step(0);
        w.step(1);
        w.step(26);
        assert_eq!(w.nodes.len(), 1);
        delete(&mut w.groups, "ng");
        let p = w.step(30);
        assert!(objects::has_terminating(w.group("ng").unwrap()));
        assert_eq!(p.wake_at, Some(t(65)), "VM torn down 35 s after the delete");
        assert_eq!(w.nodes.len(), 1);
        // The Node holds a foreign finalizer: CKE asks for its deletion and waits.
        let p = plan(&w.cfg, t(65), &w.groups, &w.nodes, &mut w.tracker);
        assert_eq!(p.actions, vec![GroupAction::DeleteNode { name: "ng-node0".into() }]);
        w.nodes[0].metadata.deletion_timestamp = w.group("ng").unwrap().metadata.deletion_timestamp.clone();
        let p = w.step(66);
        assert!(p.actions.is_empty(), "waits for the Node to be gone: {:?}", p.actions);
        w.nodes.clear();
        w.step(70);
        assert!(w.group("ng").is_none(), "finalizer released once the Node is gone");
    }

    #[test]
    fn deleting_a_group_without_node_is_quick() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("ng", "2XS", 0));
        w.step(0);
        w.step(1);
        delete(&mut w.groups, "ng");
        let p = w.step(2);
        assert_eq!(p.wake_at, Some(t(3)));
        w.step(3);
        assert!(w.group("ng").is_none());
        // The pending join is never carried out.
        w.step(60);
        assert!(w.nodes.is_empty());
    }

    #[test]
    fn vanish_rule_deletes_an_accepted_group() {
        let cfg = SimCkeConfig {
            vanish: vec![VanishRule {
                selector: GroupSelector::NamePrefix("doomed".into()),
                probability: 1.0,
                after: Duration::from_secs(2),
            }],
            ..SimCkeConfig::default()
        };
        let mut w = World::new(cfg);
        w.groups.push(group("doomed-1", "2XS", 0));
        w.groups.push(group("safe", "2XS", 0));
        w.step(0);
        let p = w.step(1);
        assert_eq!(p.wake_at, Some(t(3)));
        assert!(w.group("doomed-1").unwrap().is_accepted());
        let p = plan(&w.cfg, t(3), &w.groups, &w.nodes, &mut w.tracker);
        assert!(p.actions.contains(&GroupAction::Vanish { group: "doomed-1".into(), uid: "uid-doomed-1".into() }));
        apply(&mut w.groups, &mut w.nodes, &p.actions);
        assert_eq!(w.tracker.vanished(), ["doomed-1"]);
        w.step(4);
        w.step(5);
        assert!(w.group("doomed-1").is_none());
        assert!(w.group("safe").unwrap().is_accepted());
    }

    #[test]
    fn vanish_at_quota_edge() {
        let cfg = SimCkeConfig {
            vanish: vec![VanishRule { selector: GroupSelector::AtQuotaEdge, probability: 1.0, after: Duration::ZERO }],
            judge_concurrently: false,
            ..SimCkeConfig::default()
        };
        let mut w = World::new(cfg);
        w.groups.push(group("s", "S", 0)); // 24 + 12 = 36 GB
        w.step(0);
        w.step(1);
        assert!(w.tracker.vanished().is_empty());
        w.groups.push(group("tiny", "2XS", 2)); // 36 + 4 = 40 GB: the edge
        w.step(2);
        w.step(3);
        assert_eq!(w.tracker.vanished(), ["tiny"]);
    }

    #[test]
    fn node_count_is_honoured_and_scale_down_removes_extra_nodes() {
        let mut cfg = SimCkeConfig::instant();
        cfg.quota.limit.vcpu = 1000;
        cfg.quota.limit.ram_gb = 1000;
        let mut w = World::new(cfg);
        let mut g = group("ng", "2XS", 0);
        g.spec.node_count = 3;
        w.groups.push(g);
        for s in 0..3 {
            w.step(s);
        }
        let mut names: Vec<_> = w.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        names.sort();
        assert_eq!(names, ["ng-node0", "ng-node1", "ng-node2"]);
        w.groups[0].spec.node_count = 1;
        w.step(4);
        w.step(5);
        let names: Vec<_> = w.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        assert_eq!(names, ["ng-node0"]);
        assert_eq!(w.group("ng").unwrap().status.as_ref().unwrap().node_count, Some(1));
    }

    #[test]
    fn a_deleted_node_registers_again_while_the_group_lives() {
        let mut w = World::new(SimCkeConfig::instant());
        w.groups.push(group("ng", "2XS", 0));
        w.step(0);
        w.step(1);
        assert_eq!(w.nodes.len(), 1);
        w.step(2);
        w.nodes.clear();
        w.step(3);
        assert_eq!(w.nodes.len(), 1);
    }

    #[test]
    fn refused_groups_can_leave_their_reservation_behind() {
        let cfg = SimCkeConfig { reservation_leak: Some(Duration::from_secs(300)), ..SimCkeConfig::default() };
        let mut w = World::new(cfg);
        w.groups.push(group("big", "L", 0));
        w.step(0);
        w.step(1);
        assert!(w.group("big").unwrap().is_quota_rejected());
        // The hub deletes the refused group: its 24 GB stay reserved for 5 minutes.
        delete(&mut w.groups, "big");
        w.step(2);
        w.step(3);
        assert!(w.group("big").is_none());
        w.groups.push(group("small", "2XS", 10));
        w.step(10);
        w.step(11);
        assert_eq!(
            w.group("small").unwrap().verdict(),
            Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 40.0 GB | actual = 52.0 GB".into()))
        );
        // Once the leak expires, the same request passes.
        delete(&mut w.groups, "small");
        w.step(12);
        w.step(13);
        let p = w.step(14);
        assert!(p.wake_at.is_some(), "wakes when the leaks expire");
        w.step(320);
        w.groups.push(group("later", "2XS", 320));
        w.step(320);
        w.step(321);
        assert!(w.group("later").unwrap().is_accepted());
    }

    #[test]
    fn hand_made_nodes_with_the_group_label_are_left_alone() {
        let mut w = World::new(SimCkeConfig::instant());
        w.groups.push(group("ng", "2XS", 0));
        w.step(0);
        w.step(1);
        let mut fake = w.nodes[0].clone();
        fake.metadata.name = Some("decoy".into());
        fake.metadata.annotations = None;
        w.nodes.push(fake);
        delete(&mut w.groups, "ng");
        for s in 2..6 {
            w.step(s);
        }
        assert!(w.group("ng").is_none(), "the group does not wait for a Node CKE did not make");
        let names: Vec<_> = w.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        assert_eq!(names, ["decoy"]);
    }

    #[test]
    fn failed_writes_are_made_again() {
        let mut w = World::new(SimCkeConfig::instant());
        w.groups.push(group("ng", "2XS", 0));
        let creates = |p: &GroupPlan| -> Vec<GroupAction> {
            p.actions.iter().filter(|a| matches!(a, GroupAction::CreateNode { .. })).cloned().collect()
        };
        // The create is planned; apply everything but the Node (its write fails).
        let p = plan(&w.cfg, t(0), &w.groups, &w.nodes, &mut w.tracker);
        let create = creates(&p);
        assert_eq!(create.len(), 1);
        let others: Vec<GroupAction> =
            p.actions.iter().filter(|a| !matches!(a, GroupAction::CreateNode { .. })).cloned().collect();
        apply(&mut w.groups, &mut w.nodes, &others);
        // Not repeated while in flight...
        assert!(creates(&plan(&w.cfg, t(1), &w.groups, &w.nodes, &mut w.tracker)).is_empty());
        // ...but once it failed.
        w.tracker.failed(&create[0]);
        let again = creates(&plan(&w.cfg, t(2), &w.groups, &w.nodes, &mut w.tracker));
        assert!(matches!(&again[..], [GroupAction::CreateNode { name, .. }] if name == "ng-node0"));
    }

    #[test]
    fn orphaned_simulated_nodes_are_removed() {
        let mut w = World::new(SimCkeConfig::default());
        w.groups.push(group("ng", "2XS", 0));
        w.step(0);
        w.step(1);
        w.step(26);
        // Someone strips the finalizer and the group disappears.
        w.groups.clear();
        let p = w.step(30);
        assert_eq!(p.wake_at, Some(t(65)));
        w.step(65);
        assert!(w.nodes.is_empty());
    }

    /// A cluster of `org` (default delays and control plane), as member `id`.
    fn member(org: &OrganizationQuota, id: &str) -> World {
        let mut cfg = SimCkeConfig::default();
        cfg.quota.organization = Some(org.member(id));
        World::new(cfg)
    }

    fn org64() -> OrganizationQuota {
        OrganizationQuota::new(Usage { vcpu: 64, ram_gb: 64 })
    }

    #[test]
    fn an_organisation_judges_its_clusters_against_one_limit() {
        // Two control planes (2 × 16 vCPU / 24 GB) in 64 / 64: 32 vCPU / 16 GB left.
        let org = org64();
        let (mut a, mut b) = (member(&org, "a"), member(&org, "b"));
        a.groups.push(group("m", "M", 0));
        a.step(0);
        b.step(0);
        assert_eq!(org.usage(), Usage { vcpu: 32, ram_gb: 48 });
        // Alone, either cluster could take an M (24 + 16 GB under 64); a takes the last 16 GB.
        a.step(1);
        assert!(a.group("m").unwrap().is_accepted());
        b.groups.push(group("tiny", "2XS", 1));
        b.step(1);
        b.step(2);
        assert_eq!(
            b.group("tiny").unwrap().verdict(),
            Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 64.0 GB | actual = 68.0 GB".into()))
        );
        assert_eq!(org.usage(), Usage { vcpu: 42, ram_gb: 64 });
        let stats = org.stats();
        assert_eq!((stats.verdicts, stats.refusals), (2, 1));
        assert_eq!(stats.refusals_by_member, BTreeMap::from([("b".to_string(), 1)]));
        assert_eq!(stats.peak, Usage { vcpu: 42, ram_gb: 64 });
        // Steady state: nothing judged twice.
        for s in 3..40 {
            a.step(s);
            b.step(s);
        }
        assert_eq!(org.stats().verdicts, 2);
        assert_eq!(a.nodes.len(), 1);
        assert!(b.nodes.is_empty());
    }

    #[test]
    fn groups_awaiting_their_verdict_count_across_clusters() {
        let org = org64();
        let (mut a, mut b) = (member(&org, "a"), member(&org, "b"));
        a.groups.push(group("a-m", "M", 0));
        b.groups.push(group("b-m", "M", 0));
        a.step(0);
        b.step(0);
        // a's M is judged with b's in flight (48 + 16 + 16 GB); once refused it no longer awaits
        // its verdict, and b's fits.
        a.step(1);
        assert_eq!(
            a.group("a-m").unwrap().verdict(),
            Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 64.0 GB | actual = 80.0 GB".into()))
        );
        b.step(1);
        assert!(b.group("b-m").unwrap().is_accepted());
    }

    #[test]
    fn leaked_reservations_count_across_clusters() {
        let org = org64();
        let mut a = member(&org, "a");
        a.cfg.reservation_leak = Some(Duration::from_secs(300));
        let mut b = member(&org, "b");
        a.groups.push(group("big", "L", 0));
        a.step(0);
        b.step(0);
        a.step(1);
        assert!(a.group("big").unwrap().is_quota_rejected());
        delete(&mut a.groups, "big");
        a.step(2);
        a.step(3);
        assert!(a.group("big").is_none());
        a.step(4);
        assert_eq!(org.usage_of("a"), Some(Usage { vcpu: 28, ram_gb: 48 }), "control plane + L leaked");
        b.groups.push(group("tiny", "2XS", 10));
        b.step(10);
        b.step(11);
        assert_eq!(
            b.group("tiny").unwrap().verdict(),
            Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 64.0 GB | actual = 76.0 GB".into()))
        );
        // a's pass after the leak expires frees it for everyone.
        a.step(303);
        assert_eq!(org.usage_of("a"), Some(Usage { vcpu: 28, ram_gb: 48 }), "leaked until 304 s");
        a.step(304);
        assert_eq!(org.usage(), Usage { vcpu: 32, ram_gb: 48 });
        b.groups.push(group("later", "2XS", 304));
        b.step(304);
        b.step(305);
        assert!(b.group("later").unwrap().is_accepted());
    }

    #[test]
    fn a_stopped_cluster_frees_its_quota() {
        let org = org64();
        let (mut a, mut b) = (member(&org, "a"), member(&org, "b"));
        a.groups.push(group("m", "M", 0));
        a.step(0);
        b.step(0);
        a.step(1);
        b.groups.push(group("first", "2XS", 1));
        b.step(1);
        b.step(2);
        assert!(b.group("first").unwrap().is_quota_rejected());
        // The cluster is gone (its controller with it): its control plane and groups no longer count.
        drop(a);
        assert_eq!(org.members(), ["b"]);
        assert_eq!(org.usage(), Usage { vcpu: 16, ram_gb: 24 });
        b.groups.push(group("second", "2XS", 3));
        b.step(3);
        b.step(4);
        assert!(b.group("second").unwrap().is_accepted());
    }

    #[test]
    fn a_cluster_can_move_to_another_organisation() {
        let (first, second) = (org64(), org64());
        let mut a = member(&first, "a");
        a.step(0);
        assert_eq!(first.members(), ["a"]);
        a.cfg.quota.organization = Some(second.member("a"));
        a.step(1);
        assert!(first.members().is_empty());
        assert_eq!(second.members(), ["a"]);
        a.cfg.quota.organization = None;
        a.step(2);
        assert!(second.members().is_empty());
    }

    #[test]
    fn an_organisation_judges_a_group_once_even_if_the_api_lags() {
        let org = org64();
        let mut a = member(&org, "a");
        a.groups.push(group("m", "M", 0));
        a.step(0);
        // The acceptance is decided, but its status write does not reach the API.
        let p = plan(&a.cfg, t(1), &a.groups, &a.nodes, &mut a.tracker);
        assert!(p.actions.iter().any(
            |x| matches!(x, GroupAction::PatchStatus { status, .. } if status.phase.as_deref() == Some("Synced"))
        ));
        assert_eq!(org.usage(), Usage { vcpu: 26, ram_gb: 40 });
        // The next pass still sees it pending: counted as accepted, written again, not judged again.
        let p = plan(&a.cfg, t(2), &a.groups, &a.nodes, &mut a.tracker);
        assert_eq!(org.usage(), Usage { vcpu: 26, ram_gb: 40 });
        apply(&mut a.groups, &mut a.nodes, &p.actions);
        assert!(a.group("m").unwrap().is_accepted());
        assert_eq!(org.stats().verdicts, 1);
    }

    #[test]
    fn delays_are_drawn_from_ranges_deterministically() {
        let cfg = SimCkeConfig {
            seed: 9,
            verdict_delay: DelayRange::between(Duration::from_secs(1), Duration::from_secs(3)),
            ..SimCkeConfig::default()
        };
        let wake = |cfg: &SimCkeConfig| {
            let mut tracker = GroupTracker::default();
            plan(cfg, t(0), &[group("ng", "XS", 0)], &[], &mut tracker).wake_at
        };
        let a = wake(&cfg).unwrap();
        assert_eq!(Some(a), wake(&cfg));
        assert!(a >= t(1) && a <= t(3));
    }
}
