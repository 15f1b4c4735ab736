//! Nomination (karpenter-semantics §4.2, upstream's `StateNode.Nominate`): a provisioning round
//! that expects pending pods to land on an existing node or an in-flight claim nominates it, and the
//! disruption loop does not pick a nominated node as a candidate until the nomination window has
//! passed, so a node is never removed under pods that are about to be scheduled onto it.
//!
//! Owns: the window, the nominations of one cluster and their expiry, and marking a disruption
//! scope's nominated nodes. Must not: do I/O or read the clock (`now` is an argument).

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;

use crate::decisions::batcher;

/// How long a nomination holds: two batch windows at their longest, at least 10 s (upstream's).
pub const WINDOW: Duration = {
    let two_batches = Duration::from_secs(2 * batcher::DEFAULT_MAX.as_secs());
    if two_batches.as_secs() > 10 { two_batches } else { Duration::from_secs(10) }
};

/// The nodes of one cluster nominated for pending pods, by name (a Node's, or an in-flight claim's
/// as the scheduling input names it), each until when.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Nominations {
    until: BTreeMap<String, Timestamp>,
}

impl Nominations {
    /// Nominate `names` at `now` for [`WINDOW`]; expired nominations are dropped.
    pub fn nominate<'a>(&mut self, names: impl IntoIterator<Item = &'a str>, now: Timestamp) {
        self.until.retain(|_, until| *until > now);
        let until = now + WINDOW;
        for name in names {
            self.until.insert(name.to_string(), until);
        }
    }

    /// Whether `name` is nominated at `now`.
    pub fn is_nominated(&self, name: &str, now: Timestamp) -> bool {
        self.until.get(name).is_some_and(|until| *until > now)
    }

    /// The names nominated at `now`, sorted.
    pub fn active(&self, now: Timestamp) -> Vec<String> {
        self.until.iter().filter(|(_, until)| **until > now).map(|(n, _)| n.clone()).collect()
    }
}

/// The existing nodes (or in-flight claims) a provisioning decision puts pending pods on: what it
/// nominates.
pub fn targets<'a>(input: &'a scheduling::Input, decision: &scheduling::Decision) -> Vec<&'a str> {
    decision
        .existing
        .iter()
        // Room a CapacityBuffer's pods would take is no nomination: emptiness keeps it (the
        // disruption view finds it itself), consolidation may move it.
        .filter(|a| a.pods.iter().any(|&p| input.pods.get(p).is_some_and(|p| p.buffer.is_none())))
        .filter_map(|a| input.nodes.get(a.node).map(|n| n.name.as_str()))
        .collect()
}

/// Mark the nodes of `scope` nominated at `now`, by their Node's name or their claim's; returns
/// how many are.
pub fn mark(scope: &mut disruption::Scope, nominations: &Nominations, now: Timestamp) -> usize {
    let mut marked = 0;
    for n in &mut scope.nodes {
        n.nominated = nominations.is_nominated(&n.claim, now)
            || n.node.as_deref().is_some_and(|node| nominations.is_nominated(node, now));
        marked += usize::from(n.nominated);
    }
    marked
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn the_window_is_two_batches_at_least_ten_seconds() {
        assert_eq!(WINDOW, Duration::from_secs(20));
    }

    #[test]
    fn a_nomination_holds_for_the_window_and_is_renewed_by_the_next() {
        let mut n = Nominations::default();
        n.nominate(["node-a", "claim-b"], t(0));
        assert!(n.is_nominated("node-a", t(19)));
        assert!(!n.is_nominated("node-a", t(20)), "expired at the window's end");
        n.nominate(["node-a"], t(15));
        assert!(n.is_nominated("node-a", t(34)), "renewed");
        assert_eq!(n.active(t(21)), vec!["node-a".to_string()]);
        n.nominate([], t(40));
        assert!(n.until.is_empty(), "expired ones are dropped");
    }

    #[test]
    fn marking_matches_the_node_name_or_the_claim_name() {
        let mut scope = disruption::Scope::default();
        let mut on_node = disruption::NodeFacts::new("claim-a", "default", t(0));
        on_node.node = Some("node-a".into());
        let in_flight = disruption::NodeFacts::new("claim-b", "default", t(0));
        let other = disruption::NodeFacts::new("claim-c", "default", t(0));
        scope.nodes = vec![on_node, in_flight, other];
        let mut n = Nominations::default();
        n.nominate(["node-a", "claim-b"], t(0));
        assert_eq!(mark(&mut scope, &n, t(5)), 2);
        assert_eq!(scope.nodes.iter().map(|n| n.nominated).collect::<Vec<_>>(), [true, true, false]);
        assert_eq!(mark(&mut scope, &n, t(25)), 0, "after the window");
        assert!(scope.nodes.iter().all(|n| !n.nominated));
    }
}
