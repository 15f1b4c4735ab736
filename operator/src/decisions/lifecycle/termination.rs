//! Termination of a claim being deleted (karpenter-semantics §5.1, §5.2): the deadline written
//! once; the Node (registered claims only) tainted, drained in order and marked `Drained`, unless it
//! is NotReady with its NodeGroup gone; its volumes awaited until the deadline; then the NodeGroup
//! deleted (only the claim's own) and awaited, the Node's finalizer released, capacity freed and the
//! claim's finalizer removed.
//!
//! Owns: the order of termination's steps and its conditions (`Drained`, `VolumesDetached`,
//! `InstanceTerminating`). Must not: choose which pods a drain evicts or when it is complete
//! ([`crate::decisions::termination`]'s), delete a NodeGroup on the cache's word (it asks for a live
//! read first) or one whose ownership proof does not name the claim, or drain an unregistered claim.

use std::time::Duration;

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::ResourceExt;

use super::{Decision, Facts, Group, INSTANCE_TERMINATING, REGISTERED, SOON, Write};
use crate::decisions::{
    conditions::{self, FALSE, TRUE, UNKNOWN},
    node_registration::NodeMatch,
    termination,
};
use crds::{NodeClaimStatus, labels};

/// A claim being deleted (§5.1, §5.2): the deadline written once; the Node (registered claims only)
/// tainted, drained in order and marked Drained, unless it is NotReady with its NodeGroup gone; then
/// the NodeGroup deleted and awaited, the Node's finalizer released and the claim's removed.
pub(super) fn terminate(f: &Facts<'_>) -> Decision {
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
        Err(why) => d = d.event(true, "InvalidTerminationGracePeriod", "Terminate", why.to_string()),
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
    use super::termination;
    use super::{
        super::{fixtures::*, *},
        *,
    };
    use k8s_openapi::jiff::SignedDuration;

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
            &facts(&c, NodeMatch::NotFound, Group::Present { ours: Err(NotOurs("another hub's".into())) }, t(101)),
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
            &facts(&c, NodeMatch::NotFound, Group::Present { ours: Err(NotOurs("another hub's".into())) }, t(101)),
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
}
