//! The conditions of a launched claim that the disruption loop reads (karpenter-semantics §4.1):
//! `Drifted` (from its NodePool, node class and the flavors offered), `Empty` and `Consolidatable`
//! (only once the node is initialized), with the NodePool hash re-stamp a hash version change asks
//! for.
//!
//! Owns: when those conditions are kept on the claim, and turning their outcome into the pass's
//! writes and recheck. Must not: judge drift, emptiness or `consolidateAfter` itself (that is
//! [`disruption_conditions`]'s), or disrupt anything (the disruption loop does, from these).

use kube::ResourceExt;

use super::{Facts, INITIALIZED, Pass, Write};
use crate::decisions::{conditions, disruption_conditions};

/// The disruption conditions onto the pass's status; `Empty` and `Consolidatable` dropped while the
/// node is not initialized.
pub(super) fn conditions(f: &Facts<'_>, p: &mut Pass) {
    let claim = f.claim;
    let outcome = disruption_conditions::update(
        &mut p.status,
        claim.labels(),
        claim.annotations(),
        disruption_conditions::Origin {
            pool: f.nodepool,
            class: f.nodeclass,
            offered: f.offered,
            created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
            departed: f.departed,
        },
        f.node_pods,
        claim.metadata.generation,
        f.now,
    );
    p.changed |= outcome.changed;
    if !conditions::is_true(&p.status.conditions, INITIALIZED) {
        p.changed |= conditions::remove(&mut p.status.conditions, disruption_conditions::CONSOLIDATABLE);
        p.changed |= conditions::remove(&mut p.status.conditions, disruption_conditions::EMPTY);
    } else if let Some(t) = outcome.recheck_in {
        p.requeue = p.requeue.min(t);
    }
    if let Some((hash, version)) = outcome.restamp {
        p.d.writes.push(Write::RestampPoolHash { hash, version });
    }
    if let Some(why) = outcome.warning {
        p.d = std::mem::take(&mut p.d).event(true, "InvalidConsolidateAfter", "Disrupt", why);
    }
}
