//! Registration and initialization of a launched claim's Node (karpenter-semantics §6.2, §6.3,
//! §6.6): waiting for the Node that carries the claim's provider ID, registering it (the Node the
//! hub wants, from [`node_registration`]), then initializing it and judging its consistency with
//! the flavor paid for.
//!
//! Owns: the `Registered`, `Initialized` and `ConsistentStateFound` conditions, the registration and
//! initialization writes on the Node, and the registration's count. Must not: build the Node's
//! patch (the controller's, from [`Write::RegisterNode`]), decide what a registered Node carries
//! ([`node_registration`]'s), or delete the claim (a Node that never comes is `liveness`'s
//! registration TTL, an instance gone is `liveness`'s too).

use std::time::Duration;

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use super::{CONSISTENT_STATE_FOUND, Facts, INITIALIZED, Pass, REGISTERED, SOON, Write};
use crate::decisions::{
    conditions::{self, FALSE, TRUE, UNKNOWN},
    node_registration::{self, NodeMatch},
};
use crds::NodeClaimStatus;

/// A Node not registered yet: none carries the provider ID (wait for one), several do
/// (`MultipleNodesFound`), or one does (register it).
pub(super) fn register(f: &Facts<'_>, p: &mut Pass) {
    let claim = f.claim;
    let observed = claim.metadata.generation;
    let now = f.now;
    match &f.node {
        NodeMatch::NotFound if p.registered => {
            // The Node went away but its group is still there (CKE replacing it): wait, keep Registered.
            p.requeue = SOON;
        }
        NodeMatch::NotFound => {
            p.changed |= awaiting_node(&mut p.status, observed, now);
            p.requeue = SOON;
        }
        NodeMatch::Many(n) => {
            let provider_id = p.status.provider_id.clone().unwrap_or_default();
            p.set(f, REGISTERED, FALSE, "MultipleNodesFound", &format!("{n} nodes carry provider ID {provider_id}"));
        }
        NodeMatch::One(node) => {
            let desired = node_registration::registered_node(node, claim);
            p.status.node_name = Some(node.name_any());
            p.set(f, REGISTERED, TRUE, "Registered", "");
            // What blocks initialization of the Node as registered, in the same status write (the
            // next pass would write it alone); a Node with nothing blocking is initialized by the
            // next pass, once the registration is read back.
            if let Some((reason, message)) = node_registration::initialization_blocker(&desired, claim) {
                conditions::set(&mut p.status.conditions, INITIALIZED, UNKNOWN, reason, &message, observed, now);
            }
            // Counted by the pass that registers the Node; a pass reading a claim status that lags
            // behind (the Node change wakes it) only writes the condition.
            if &desired != *node {
                p.d = std::mem::take(&mut p.d)
                    .then(Write::RegisterNode(Box::new(desired)))
                    .then(Write::NodeCreated)
                    .then(Write::RegistrationOutcome { registered: true })
                    .because(format!("node {} registered", node.name_any()));
            }
            p.requeue = Duration::from_secs(1);
        }
    }
}

/// A registered Node: initialization runs until `Initialized=True` (§6.3), then never again (a node
/// going NotReady later is liveness's and repair's business, not a step back); from the pass that
/// initializes it on, its consistency with the flavor (§6.6) in the same status write.
pub(super) fn initialize(f: &Facts<'_>, node: &Node, p: &mut Pass) {
    let claim = f.claim;
    let initialized = conditions::is_true(&p.status.conditions, INITIALIZED);
    let blocker = if initialized { None } else { node_registration::initialization_blocker(node, claim) };
    if let Some((reason, message)) = blocker {
        p.set(f, INITIALIZED, UNKNOWN, reason, &message);
        p.requeue = SOON;
        return;
    }
    if !initialized {
        p.d = std::mem::take(&mut p.d)
            .then(Write::LabelInitialized { node: node.name_any() })
            .because(format!("node {} initialized", node.name_any()));
        p.set(f, INITIALIZED, TRUE, "Initialized", "");
    }
    // §6.6: the node CKE made has the shape we paid for (judged from the pass that initializes it
    // on, in the same status write).
    let verdict = node_registration::consistency(node, claim);
    let (st, reason, message) = match &verdict {
        Ok(()) => (TRUE, "ConsistentStateFound", String::new()),
        Err(why) => (FALSE, "ConsistencyCheckFailed", why.to_string()),
    };
    let observed = claim.metadata.generation;
    if conditions::set(&mut p.status.conditions, CONSISTENT_STATE_FOUND, st, reason, &message, observed, f.now) {
        p.changed = true;
        if let Err(why) = verdict {
            p.d = std::mem::take(&mut p.d)
                .event(true, "FailedConsistencyCheck", "Check", why.to_string())
                .because(format!("node {} differs from its flavor: {why}", node.name_any()));
        }
    }
}

/// `Registered=Unknown(NodeNotFound)`: launched, no Node carries the provider ID yet. Whether it changed.
pub(super) fn awaiting_node(status: &mut NodeClaimStatus, observed: Option<i64>, now: Timestamp) -> bool {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{
        super::{fixtures::*, *},
        *,
    };

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
}
