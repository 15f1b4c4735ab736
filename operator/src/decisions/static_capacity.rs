//! Static pools (`NodePool.spec.replicas`, upstream's static capacity; issue 28 item 1): how many
//! NodeClaims a static pool makes or deletes in one cluster to keep its count, over plain facts.
//!
//! The rules, upstream's where it has them:
//! - fewer live claims (not being deleted) than `replicas`: make the difference, within
//!   `limits.nodes` (a claim expired, repaired or deleted by hand is replaced after it goes);
//! - drifted claims are replaced within the pool's `Drifted` budget, the replacements first: as
//!   many more claims as the budget allows while no replacement is in flight (none when it allows
//!   none), then, once every claim that is not drifted is initialized, as many drifted ones go;
//! - more live claims than `replicas`: drifted ones first (once no replacement is in flight), then
//!   claims not launched yet, then empty nodes, then the rest by how little their pods cost to move,
//!   nodes with a do-not-disrupt pod last. Deletion goes through termination (drain, PDBs).
//!
//! New claims take the lowest free slots: a slot names its claim deterministically, so a create
//! retried after a crash finds the claim instead of making a second.
//!
//! Owns: the facts read off a pool's claims and pods, that arithmetic and the slot numbers. Must
//! not: read a cache, write, or pick flavors (the controller asks the scheduling core, as for any
//! new claim).

use std::collections::{BTreeMap, BTreeSet};

use crds::{NodeClaim, NodePool, labels};
use kube::ResourceExt;
use scheduling::{
    CompactPod,
    convert::{Snapshot, do_not_disrupt_active, is_daemonset_pod, is_static_pod, is_terminal},
};

/// The annotation holding a static claim's slot.
pub const SLOT_ANNOTATION: &str = "karpenter.clever-cloud.com/static-slot";

/// One claim of the pool in the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Member {
    /// NodeClaim name.
    pub name: String,
    /// Its slot, when it has one (claims made by the hub for this pool do).
    pub slot: Option<u32>,
    /// Being deleted.
    pub deleting: bool,
    /// Launched (a provider ID).
    pub launched: bool,
    /// Its node is initialized.
    pub initialized: bool,
    /// `Drifted=True`.
    pub drifted: bool,
    /// No pod but DaemonSet and mirror pods.
    pub empty: bool,
    /// A pod with an active `karpenter.sh/do-not-disrupt`.
    pub do_not_disrupt: bool,
    /// What moving its pods costs (upstream's rescheduling cost: pod count, deletion costs).
    pub cost: f64,
}

/// A static pool in one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// `spec.replicas`.
    pub replicas: i64,
    /// `spec.limits.nodes`, if set.
    pub node_limit: Option<i64>,
    /// Its claims in the cluster.
    pub members: Vec<Member>,
    /// Drifted claims that may be replaced at once: what the pool's budgets allow for `Drifted`
    /// now, over its live claims, less those being deleted.
    pub drift_allowance: usize,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Slots to make a claim in.
    pub create: Vec<u32>,
    /// Claims to delete, in order.
    pub delete: Vec<String>,
    /// Why, for the log line.
    pub why: String,
}

/// The facts of static pool `pool` (count `replicas`) in a cluster: `claims` are the cluster's
/// NodeClaims (the pool's are picked by label), `snapshot` holds its pods (and the time a pod's
/// do-not-disrupt duration is judged at).
pub fn facts_of<'a>(
    pool: &NodePool,
    replicas: i64,
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    snapshot: &Snapshot,
) -> Facts {
    let name = pool.name_any();
    let claims: Vec<&NodeClaim> =
        claims.into_iter().filter(|c| c.labels().get(labels::NODEPOOL) == Some(&name)).collect();

    // What a drain would move off each of the pool's nodes (not DaemonSet, mirror or finished
    // pods), grouped in one pass over the cluster's pods.
    let nodes: BTreeSet<&str> = claims.iter().filter_map(|c| node_of(c)).collect();
    let mut by_node: BTreeMap<&str, Vec<&CompactPod>> = BTreeMap::new();
    for p in &snapshot.pods {
        if let Some(node) = p.node_name().filter(|n| nodes.contains(n))
            && !is_daemonset_pod(&p.metadata)
            && !is_static_pod(&p.metadata)
            && !is_terminal(p)
        {
            by_node.entry(node).or_default().push(p);
        }
    }
    let members: Vec<Member> = claims
        .into_iter()
        .map(|c| {
            let status = c.status.as_ref();
            let condition =
                |t: &str| status.is_some_and(|s| s.conditions.iter().any(|k| k.type_ == t && k.status == "True"));
            let node = node_of(c);
            let pods = node.and_then(|n| by_node.get(n)).map_or(&[][..], Vec::as_slice);
            Member {
                name: c.name_any(),
                slot: c.annotations().get(SLOT_ANNOTATION).and_then(|s| s.parse().ok()),
                deleting: c.metadata.deletion_timestamp.is_some(),
                launched: status.and_then(|s| s.provider_id.as_deref()).is_some_and(|p| !p.is_empty()),
                initialized: condition("Initialized"),
                drifted: condition("Drifted"),
                empty: node.is_some() && pods.is_empty(),
                do_not_disrupt: pods.iter().any(|p| do_not_disrupt_active(p, snapshot.now).is_some()),
                cost: f64::from(u32::try_from(pods.len()).unwrap_or(u32::MAX)),
            }
        })
        .collect();
    let node_limit = pool.spec.limits.as_ref().and_then(|l| l.get("nodes")).and_then(|q| q.0.parse::<i64>().ok());
    // Upstream's static drift spends the pool's Drifted budget; claims being deleted are disrupting.
    let mut disrupting = disruption::Disrupting::default();
    for _ in members.iter().filter(|m: &&Member| m.deleting) {
        disrupting.add(None);
    }
    let live = members.iter().filter(|m| !m.deleting).count();
    let now = snapshot
        .now
        .and_then(|t| jiff::Timestamp::from_second(t.as_second()).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let drift_allowance = disruption::Budgets::parse(&pool.spec.disruption.budgets).allowed(
        live,
        &disrupting,
        crds::nodepool::DisruptionReason::Drifted,
        now,
    );
    Facts { replicas, node_limit, members, drift_allowance }
}

/// The node a claim's status names, if any.
fn node_of(c: &NodeClaim) -> Option<&str> {
    c.status.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

/// Decides what keeps the pool at its count (see the module comment).
pub fn decide(facts: &Facts) -> Decision {
    let live: Vec<&Member> = facts.members.iter().filter(|m| !m.deleting).collect();
    let replicas = usize::try_from(facts.replicas.max(0)).unwrap_or(usize::MAX);
    let limit = facts.node_limit.and_then(|l| usize::try_from(l.max(0)).ok()).unwrap_or(usize::MAX);
    let drifted: Vec<&Member> = live.iter().copied().filter(|m| m.drifted).collect();
    let healthy = live.len() - drifted.len();
    let in_flight = live.iter().any(|m| !m.drifted && !m.initialized);
    let mut out = Decision::default();
    let mut create = 0;
    if live.len() < replicas {
        create = replicas - live.len();
        out.why = format!("{} live of {replicas}", live.len());
    } else if !drifted.is_empty() && healthy < replicas && !in_flight && live.len() <= replicas {
        create = drifted.len().min(replicas - healthy).min(facts.drift_allowance);
        out.why = if create == 0 {
            format!("{} drifted wait: the pool's Drifted budget allows none now", drifted.len())
        } else {
            format!("replacing {create} of {} drifted first (Drifted budget: {})", drifted.len(), facts.drift_allowance)
        };
    }
    // Every member counts against limits.nodes, those being deleted too (their nodes still run).
    let room = limit.saturating_sub(facts.members.len());
    if create > room {
        out.why = format!("{}; limits.nodes {limit} leaves room for {room}", out.why);
        create = room;
    }
    out.create = free_slots(facts, create);

    let surplus = live.len().saturating_sub(replicas);
    // A drifted node goes once its replacement is up; a surplus of nothing drifted goes at once.
    let replacing = !drifted.is_empty() && in_flight;
    if surplus > 0 && !replacing {
        let mut order: Vec<&Member> = live.clone();
        // Drifted first, then not launched, then empty, then by cost with do-not-disrupt last.
        order.sort_by(|a, b| {
            let rank = |m: &Member| (!m.drifted, m.launched, !m.empty, m.do_not_disrupt);
            rank(a).cmp(&rank(b)).then(a.cost.total_cmp(&b.cost)).then(a.name.cmp(&b.name))
        });
        out.delete = order.into_iter().take(surplus).map(|m| m.name.clone()).collect();
        out.why = if drifted.is_empty() {
            format!("{} live, {surplus} above replicas {replicas}", live.len())
        } else {
            format!("{} live, {surplus} above replicas {replicas}: drifted ones go first", live.len())
        };
    }
    out
}

/// The `n` lowest slots no member holds (those being deleted included: their names are taken
/// until they are gone).
fn free_slots(facts: &Facts, n: usize) -> Vec<u32> {
    let used: BTreeSet<u32> = facts.members.iter().filter_map(|m| m.slot).collect();
    (0..).filter(|s| !used.contains(s)).take(n).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn member(name: &str, slot: u32) -> Member {
        Member { name: name.into(), slot: Some(slot), launched: true, initialized: true, ..Member::default() }
    }

    fn facts(replicas: i64, members: Vec<Member>) -> Facts {
        Facts { replicas, node_limit: None, members, drift_allowance: 1 }
    }

    /// What a claim's node holds: a DaemonSet's and a finished pod leave it empty; a busy node
    /// counts its pods, and an active do-not-disrupt (a duration from the pod's start) marks it.
    #[test]
    fn facts_read_each_claims_node_and_what_a_drain_would_move() {
        use std::sync::Arc;
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fixed", "namespace": "team"},
            "spec": {"clusterName": "c", "replicas": 2, "limits": {"nodes": "3"},
                "template": {"spec": {"nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}, "requirements": []}}}
        }))
        .unwrap();
        let claim = |name: &str, node: &str| -> NodeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "team", "labels": {"karpenter.sh/nodepool": "fixed"},
                    "annotations": {SLOT_ANNOTATION: "1"}},
                "spec": {"clusterName": "c", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
                "status": {"providerID": format!("clevercloud://{name}"), "nodeName": node}
            }))
            .unwrap()
        };
        // A pod on `node`: its phase, owner kind and do-not-disrupt value if any.
        let pod = |name: &str, node: &str, phase: &str, owner: Option<&str>, dnd: Option<&str>| -> Arc<CompactPod> {
            let owners: Vec<serde_json::Value> = owner
                .map(|k| serde_json::json!({"apiVersion": "apps/v1", "kind": k, "name": name, "uid": "o"}))
                .into_iter()
                .collect();
            let annotations: serde_json::Map<String, serde_json::Value> =
                dnd.map(|v| ("karpenter.sh/do-not-disrupt".to_string(), v.into())).into_iter().collect();
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "app", "ownerReferences": owners, "annotations": annotations},
                    "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                    "status": {"phase": phase, "startTime": "2026-11-25T11:50:00Z"}
                }))
                .unwrap(),
            )
        };
        let snapshot = Snapshot {
            pods: vec![
                pod("agent", "n1", "Running", Some("DaemonSet"), None),
                pod("done", "n1", "Succeeded", None, None),
                pod("web", "n2", "Running", None, None),
                pod("batch", "n2", "Running", None, Some("30m")),
            ],
            now: Some("2026-11-25T12:00:00Z".parse().unwrap()),
            ..Snapshot::default()
        };
        let claims = [claim("a", "n1"), claim("b", "n2")];
        let f = facts_of(&pool, 2, claims.iter(), &snapshot);
        assert_eq!((f.replicas, f.node_limit), (2, Some(3)));
        let a = &f.members[0];
        assert!(a.empty && !a.do_not_disrupt && a.launched && a.slot == Some(1), "{a:?}");
        let b = &f.members[1];
        assert!(!b.empty && b.do_not_disrupt && b.cost == 2.0, "started 10 min ago, 30m holds: {b:?}");
        let later = Snapshot { now: Some("2026-11-25T12:30:00Z".parse().unwrap()), ..snapshot };
        assert!(!facts_of(&pool, 2, claims.iter(), &later).members[1].do_not_disrupt, "30m over");
    }

    #[test]
    fn a_pool_below_its_count_makes_the_difference_in_the_lowest_free_slots() {
        let d = decide(&facts(3, vec![member("a", 1)]));
        assert_eq!((d.create, d.delete), (vec![0, 2], vec![]));
        // A claim being deleted (expired) is replaced now; its slot stays taken until it is gone.
        let mut expired = member("a", 0);
        expired.deleting = true;
        let d = decide(&facts(1, vec![expired]));
        assert_eq!(d.create, vec![1]);
        // At the count: nothing.
        assert_eq!(decide(&facts(2, vec![member("a", 0), member("b", 1)])), Decision::default());
    }

    #[test]
    fn limits_nodes_caps_the_claims_those_being_deleted_included() {
        let mut f = facts(4, vec![member("a", 0)]);
        f.node_limit = Some(2);
        assert_eq!(decide(&f).create, vec![1]);
        f.members[0].deleting = true;
        assert_eq!(decide(&f).create, vec![1], "the node being deleted still runs");
        f.node_limit = Some(1);
        let d = decide(&f);
        assert!(d.create.is_empty() && d.why.contains("limits.nodes 1"), "{d:?}");
    }

    #[test]
    fn a_drifted_node_is_replaced_one_at_a_time_the_replacement_first() {
        let mut a = member("a", 0);
        a.drifted = true;
        let mut b = member("b", 1);
        b.drifted = true;
        // Two drifted of two: one replacement, nothing deleted yet.
        let d = decide(&facts(2, vec![a.clone(), b.clone()]));
        assert_eq!((d.create.clone(), d.delete.clone()), (vec![2], vec![]), "{d:?}");
        // The replacement in flight: nothing more.
        let mut c = member("c", 2);
        c.initialized = false;
        c.launched = false;
        assert_eq!(decide(&facts(2, vec![a.clone(), b.clone(), c.clone()])), Decision::default());
        // Initialized: a drifted one goes; the next replacement waits until then.
        c.initialized = true;
        c.launched = true;
        let d = decide(&facts(2, vec![a.clone(), b.clone(), c.clone()]));
        assert_eq!((d.create, d.delete), (vec![], vec!["a".to_string()]));
        // a leaving: b is replaced next.
        let mut leaving = a.clone();
        leaving.deleting = true;
        let d = decide(&facts(2, vec![leaving, b, c]));
        assert_eq!((d.create, d.delete), (vec![3], vec![]));
    }

    /// Issue 28 item 1's leftover: drifted claims are replaced within the pool's Drifted budget
    /// (upstream's static drift), not one at a time; a budget of none replaces none.
    #[test]
    fn drifted_claims_are_replaced_within_the_drifted_budget() {
        let drifted = |name: &str, slot: u32| Member { drifted: true, ..member(name, slot) };
        let three = vec![drifted("a", 0), drifted("b", 1), drifted("c", 2)];
        let with = |allowance: usize, members: Vec<Member>| Facts { drift_allowance: allowance, ..facts(3, members) };
        let d = decide(&with(2, three.clone()));
        assert_eq!((d.create.clone(), d.delete.clone()), (vec![3, 4], vec![]), "{d:?}");
        let d = decide(&with(5, three.clone()));
        assert_eq!(d.create, vec![3, 4, 5], "never more than the drifted");
        let d = decide(&with(0, three.clone()));
        assert_eq!((d.create.clone(), d.delete.clone()), (vec![], vec![]));
        assert!(d.why.contains("budget allows none"), "{}", d.why);
        // Both replacements up: two drifted go together.
        let mut members = three;
        members.push(member("d", 3));
        members.push(member("e", 4));
        let d = decide(&with(2, members));
        assert_eq!(d.delete, ["a", "b"]);
    }

    /// The allowance is the pool's Drifted budget over its live claims, less those being deleted.
    #[test]
    fn the_drift_allowance_is_the_pools_drifted_budget() {
        let pool = |budgets: serde_json::Value| -> NodePool {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "fixed", "namespace": "team"},
                "spec": {"clusterName": "alpha", "replicas": 3, "disruption": {"budgets": budgets},
                    "template": {"spec": {"requirements": [],
                        "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}}}
            }))
            .unwrap()
        };
        let claim = |name: &str, deleting: bool| -> NodeClaim {
            let mut meta =
                serde_json::json!({"name": name, "namespace": "team", "labels": {"karpenter.sh/nodepool": "fixed"}});
            if deleting {
                meta["deletionTimestamp"] = serde_json::json!("2026-11-25T11:00:00Z");
                meta["finalizers"] = serde_json::json!(["karpenter.sh/termination"]);
            }
            serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim", "metadata": meta,
                "spec": {"clusterName": "alpha", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}
            }))
            .unwrap()
        };
        let snapshot = Snapshot { now: Some("2026-11-25T12:00:00Z".parse().unwrap()), ..Snapshot::default() };
        let claims = [claim("a", false), claim("b", false), claim("c", false), claim("d", true)];
        let allowance = |budgets| facts_of(&pool(budgets), 3, claims.iter(), &snapshot).drift_allowance;
        assert_eq!(allowance(serde_json::json!([{"nodes": "2"}])), 1, "2, less the one being deleted");
        assert_eq!(allowance(serde_json::json!([{"nodes": "0", "reasons": ["Drifted"]}])), 0);
        assert_eq!(allowance(serde_json::json!([{"nodes": "100%"}])), 2, "3 live, 1 deleting");
    }

    #[test]
    fn scaling_down_deletes_not_launched_then_empty_then_cheapest_with_do_not_disrupt_last() {
        let mut unlaunched = member("u", 0);
        unlaunched.launched = false;
        unlaunched.initialized = false;
        let mut empty = member("e", 1);
        empty.empty = true;
        let mut busy = member("busy", 2);
        busy.cost = 10.0;
        let mut light = member("light", 3);
        light.cost = 1.0;
        let mut kept = member("kept", 4);
        kept.do_not_disrupt = true;
        let all = vec![kept.clone(), busy.clone(), light.clone(), empty.clone(), unlaunched];
        let d = decide(&facts(1, all));
        assert_eq!(d.delete, ["u", "e", "light", "busy"]);
        assert!(d.create.is_empty());
        let d = decide(&facts(0, vec![kept, light]));
        assert_eq!(d.delete, ["light", "kept"], "do-not-disrupt last, but the count wins");
    }
}
