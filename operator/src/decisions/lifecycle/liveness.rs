//! Liveness of a claim that is not being deleted (karpenter-semantics §4.1, §5.2, §6.4;
//! clever-cloud.md §3.7): whether it has expired, whether its instance is gone (its NodeGroup
//! vanished, its Node deleted or NotReady with its group gone), and the registration TTL.
//!
//! Owns: the deletions of a live claim for expiry, a lost instance (a vanish before registration
//! also cools its flavor down), a deleted Node or a Node that never registered, and the live read
//! of a NodeGroup the cache no longer shows before any of them.
//! Must not: take a NodeGroup's absence from the cache for its absence (only an uncached read,
//! [`Group::NotFound`] or [`Group::Terminating`], proves it), repair a NotReady Node whose group is
//! there (`repair`'s), or delete a claim being deleted (`termination`'s).

use std::{ops::ControlFlow, time::Duration};

use kube::ResourceExt;

use super::{Decision, DeleteReason, Facts, Group, Pass, REGISTERED, Settings, Write, repair::unhealthy_since};
use crate::decisions::{
    conditions,
    node_registration::NodeMatch,
    termination::{self, expiration::Expiry},
};
use crds::{NodeClaim, labels};

/// Expiry (§4.1) is forceful (no budget, no replacement first); the deletion drains the node.
/// Break: the claim expired, deleted. Continue: the writes that go first (an event on an
/// `expireAfter` that does not parse, never expired by guess) and when the claim expires, if ever.
pub(super) fn expiry(f: &Facts<'_>) -> ControlFlow<Decision, (Decision, Option<Duration>)> {
    let claim = f.claim;
    let expire_after = Some(claim.spec.expire_after.as_str()).filter(|e| !e.is_empty());
    match termination::expiration::decide(
        claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        expire_after,
        false,
        f.now,
    ) {
        Ok(Expiry::Expire) => {
            let lifetime = expire_after.unwrap_or_default();
            ControlFlow::Break(
                Decision::default()
                    .then(Write::DeleteClaim(DeleteReason::Expired))
                    .event(
                        false,
                        termination::expiration::EXPIRED,
                        "Delete",
                        format!("expireAfter {lifetime} reached; the node is drained and its pods re-planned"),
                    )
                    .because(format!("expireAfter {lifetime} reached; deleting the claim (forceful: no disruption budget); its node is drained")),
            )
        }
        Ok(e) => ControlFlow::Continue((Decision::default(), e.recheck_in(f.now))),
        Err(why) => {
            // Admission refuses these; one written around it is never expired by guess.
            let d = Decision::default().event(true, "InvalidExpireAfter", "Expire", why.to_string());
            ControlFlow::Continue((d, None))
        }
    }
}

/// Whether the launched claim's instance is still there: its Node being deleted deletes the claim,
/// its NodeGroup gone (a live read proves it; the cache's absence asks for one) deletes it too.
pub(super) fn instance(f: &Facts<'_>, p: &Pass) -> ControlFlow<Decision> {
    let group = p.group.as_str();
    match &f.node {
        NodeMatch::NotFound if !group.is_empty() && matches!(f.group, Group::MissingFromCache) => {
            // Absence in the cache proves nothing (a group whose labels were stripped): read it live.
            ControlFlow::Break(Decision::live_group())
        }
        NodeMatch::NotFound if !group.is_empty() && f.group.gone() => {
            ControlFlow::Break(instance_lost(f.claim, p.registered, group))
        }
        NodeMatch::One(node) if node.metadata.deletion_timestamp.is_some() => {
            // §5.2: deleting the Node deletes its claim; termination then deletes the NodeGroup and
            // releases the Node.
            ControlFlow::Break(
                Decision::default()
                    .then(Write::DeleteClaim(DeleteReason::NodeDeleted))
                    .because(format!("node {} is being deleted; deleting its claim", node.name_any())),
            )
        }
        NodeMatch::One(node)
            if !group.is_empty()
                && p.registered
                && unhealthy_since(node).is_some()
                && (matches!(f.group, Group::MissingFromCache) || f.group.gone()) =>
        {
            // §5.2 / §7: a NotReady Node whose NodeGroup vanished is an instance that is gone (its
            // VM will not come back); a Ready one is left to drain normally. Only a live read proves
            // the group's absence (missing from the cache: read it live first).
            if !f.group.gone() {
                return ControlFlow::Break(Decision::live_group());
            }
            ControlFlow::Break(Decision::default().then(Write::DeleteClaim(DeleteReason::InstanceGone)).because(
                format!("node {} is not Ready and its NodeGroup {group} is gone; deleting the claim", node.name_any()),
            ))
        }
        _ => ControlFlow::Continue(()),
    }
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

/// Registration TTL, measured from the condition's last transition (§6.4): past it, the status is
/// written (the outcome of this pass's phases) and the claim deleted; before it, looked at again
/// when it falls.
pub(super) fn registration_ttl(f: &Facts<'_>, s: &Settings, mut p: Pass) -> ControlFlow<Decision, Pass> {
    let registered = conditions::is_true(&p.status.conditions, REGISTERED);
    let age = conditions::age(&p.status.conditions, REGISTERED, f.now);
    if !registered && age.is_some_and(|a| a >= s.registration_ttl) {
        return ControlFlow::Break(
            p.d.then(Write::Status(Box::new(p.status)))
                .then(Write::RegistrationOutcome { registered: false })
                .then(Write::DeleteClaim(DeleteReason::RegistrationTimeout))
                .event(
                    true,
                    "RegistrationTimeout",
                    "Delete",
                    format!("no node registered within {:?}", s.registration_ttl),
                )
                .because("node did not register in time; deleting the claim"),
        );
    }
    if !registered && let Some(age) = age {
        p.requeue = p.requeue.min(s.registration_ttl.saturating_sub(age));
    }
    ControlFlow::Continue(p)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{
        super::{fixtures::*, *},
        *,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
}
