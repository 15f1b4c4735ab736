//! The launch phase of a claim (karpenter-semantics §6.1): before `Launched=True`, mark it
//! `Launching`, enforce the launch TTL, else ask for the launch sequence; and the claim's status
//! after that sequence reports its outcome ([`launched`]).
//!
//! Owns: the `Launched` condition, the launch TTL, and the status a launch outcome writes (with the
//! conditions the next pass would add). Must not: choose a flavor or judge adoption
//! ([`crate::decisions::launch`]'s), or create anything (the controller's launch sequence does).

use std::collections::BTreeMap;

use k8s_openapi::{apimachinery::pkg::api::resource::Quantity, jiff::Timestamp};

use super::{Decision, DeleteReason, Facts, LAUNCHED, READY, Settings, Write, registration::awaiting_node};
use crate::decisions::conditions::{self, TRUE, UNKNOWN};
use crds::{NodeClaim, NodeClaimStatus};

/// Before `Launched=True`: mark Launching, enforce the launch TTL, else launch.
pub(super) fn launch(f: &Facts<'_>, s: &Settings, mut status: NodeClaimStatus) -> Decision {
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
    Launched { provider_id: String, capacity: BTreeMap<String, Quantity>, allocatable: BTreeMap<String, Quantity> },
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
            // What the next pass would add (the root condition `Ready`): written now, in the same patch.
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{
        super::{fixtures::*, *},
        *,
    };

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
    fn a_launched_claim_waiting_for_its_node_writes_nothing_more() {
        // `launched` writes what the next pass would add (Ready=Unknown); Empty, which the
        // disruption conditions set and a claim not initialized drops again, is no change either.
        let c = launched_claim();
        let d = decide(&facts(&c, NodeMatch::NotFound, Group::Cached, t(11)), &Settings::default());
        assert_eq!(status_of(&d), None, "{d:?}");
        assert_eq!(conditions::get(&c.status.as_ref().unwrap().conditions, READY).unwrap().reason, "NotReady");
    }
}
