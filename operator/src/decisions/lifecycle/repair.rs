//! Node repair (karpenter-semantics §6.5): a registered, initialized Node whose `Ready` condition has
//! been `False` or `Unknown` for the toleration is replaced at once (its claim deleted, the
//! termination deadline now), unless too many of its pool's nodes are unhealthy at once.
//!
//! Owns: the repair policy, when a Node counts as unhealthy past its toleration (the pool's cap
//! counts those, [`past_toleration`]), and the repair verdict with its event. Must not: repair a
//! Node that never initialized (the registration TTL's business), respect disruption budgets or
//! `do-not-disrupt` (repair overrides them), or count the pool's nodes itself (the controller does,
//! into [`PoolHealth`]).

use std::{ops::ControlFlow, time::Duration};

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use super::{
    Decision, DeleteReason, Facts, INITIALIZED, NODE_REPAIR_BLOCKED, Pass, PoolHealth, REPAIR_BLOCKED_RETRY, Settings,
    UNHEALTHY, Write,
};
use crate::decisions::conditions;

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

/// The repair phase of a pass over a registered Node. Repair is for nodes that worked: one that
/// never became Ready is the registration and initialization timeouts' business. Break: replace it
/// now (the pass's other writes are dropped: the claim goes).
pub(super) fn check(f: &Facts<'_>, s: &Settings, node: &Node, p: &mut Pass) -> ControlFlow<Decision> {
    let now = f.now;
    let repairable = if conditions::is_true(&p.status.conditions, INITIALIZED) {
        repair(node, f.pool, &s.repair, now)
    } else {
        Repair::Healthy
    };
    match repairable {
        Repair::Healthy => {}
        Repair::RecheckIn(t) => p.requeue = p.requeue.min(t),
        Repair::Blocked { condition, limit } => {
            p.d = std::mem::take(&mut p.d)
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
            p.requeue = p.requeue.min(REPAIR_BLOCKED_RETRY);
        }
        Repair::Now { condition } => {
            // §6.5: immediate forced deletion, overriding any pool grace period, ignoring
            // budgets and do-not-disrupt.
            let note = format!(
                "node {} has been {condition} for longer than {:?}; replacing it",
                node.name_any(),
                s.repair.toleration
            );
            return ControlFlow::Break(
                Decision::default()
                    .then(Write::TerminationTimestamp(now))
                    .then(Write::DeleteClaim(DeleteReason::Unhealthy))
                    .event(true, UNHEALTHY, "Repair", note.clone())
                    .because(note),
            );
        }
    }
    ControlFlow::Continue(())
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{
        super::{fixtures::*, *},
        *,
    };

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
}
