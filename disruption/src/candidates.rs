//! Which nodes a disruption method may consider (karpenter-semantics §4.3), with a reason for every
//! node it may not, and what each pool's budget allows (§4.5).

use std::collections::BTreeMap;
use std::fmt;

use crds::nodepool::DisruptionReason;
use jiff::Timestamp;

use crate::budgets::Disrupting;
use crate::facts::{DoNotDisrupt, NodeFacts, PodFacts, Scope};

/// A disruption method of the loop (§4.2), in the order the loop tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// Empty nodes, removed in bulk.
    Emptiness,
    /// Drifted nodes, replaced one command at a time.
    Drift,
    /// Several nodes removed or merged into one.
    MultiNodeConsolidation,
    /// One node removed or replaced by a cheaper one.
    SingleNodeConsolidation,
}

impl Method {
    /// The budget reason the method spends.
    pub fn reason(self) -> DisruptionReason {
        match self {
            Method::Emptiness => DisruptionReason::Empty,
            Method::Drift => DisruptionReason::Drifted,
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => DisruptionReason::Underutilized,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Emptiness => "emptiness",
            Method::Drift => "drift",
            Method::MultiNodeConsolidation => "multi-node consolidation",
            Method::SingleNodeConsolidation => "single-node consolidation",
        })
    }
}

/// Why a node is not a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Excluded {
    /// Already part of a queued command.
    Queued,
    /// The claim has no Node yet.
    NoNode,
    /// The Node is not labelled `karpenter.sh/initialized=true`.
    NotInitialized,
    /// Being deleted already (claim, Node, instance or an earlier decision).
    MarkedForDeletion,
    /// The provisioner nominated it for pending pods.
    Nominated,
    /// `karpenter.sh/do-not-disrupt: "true"` on the Node or the NodeClaim.
    DoNotDisrupt,
    /// No `karpenter.sh/nodepool` label.
    NoNodePool,
    /// Its NodePool does not exist.
    NodePoolNotFound(String),
    /// Its NodePool's node class resolves to no instance type.
    InstanceTypesUnresolved(String),
    /// Its NodePool is static (`spec.replicas`): its count replaces its nodes, no method does.
    StaticPool(String),
    /// A pod carries an active `karpenter.sh/do-not-disrupt`.
    PodDoNotDisrupt {
        /// `namespace/name`.
        pod: String,
    },
    /// A pod is matched by more than one PDB (the eviction API refuses those).
    MultiplePdbs {
        /// `namespace/name`.
        pod: String,
        /// The PDBs.
        pdbs: Vec<String>,
    },
    /// A PDB allows no disruption of a pod now.
    PdbBlocks {
        /// `namespace/name` of the pod.
        pod: String,
        /// `namespace/name` of the PDB.
        pdb: String,
    },
}

impl Excluded {
    /// Whether users should hear about it (a `DisruptionBlocked` event): the node would be a
    /// candidate but for something they set. Transient states (queued, nominated, deleting,
    /// uninitialized) are not news.
    pub fn blocks(&self) -> bool {
        matches!(
            self,
            Excluded::DoNotDisrupt
                | Excluded::NodePoolNotFound(_)
                | Excluded::InstanceTypesUnresolved(_)
                | Excluded::PodDoNotDisrupt { .. }
                | Excluded::MultiplePdbs { .. }
                | Excluded::PdbBlocks { .. }
        )
    }
}

impl fmt::Display for Excluded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Excluded::Queued => f.write_str("already part of a disruption command"),
            Excluded::NoNode => f.write_str("no Node registered yet"),
            Excluded::NotInitialized => f.write_str("Node not initialized yet"),
            Excluded::MarkedForDeletion => f.write_str("already being deleted"),
            Excluded::Nominated => f.write_str("nominated for pending pods"),
            Excluded::DoNotDisrupt => f.write_str(
                "karpenter.sh/do-not-disrupt: \"true\" is set on the Node or NodeClaim (remove it to allow disruption)",
            ),
            Excluded::NoNodePool => f.write_str("no karpenter.sh/nodepool label"),
            Excluded::NodePoolNotFound(pool) => write!(f, "NodePool {pool} not found"),
            Excluded::StaticPool(pool) => write!(
                f,
                "NodePool {pool} is static (spec.replicas): it keeps its count, replacing drifted nodes itself, and is \
                 never consolidated"
            ),
            Excluded::InstanceTypesUnresolved(pool) => {
                write!(f, "the instance types of NodePool {pool} cannot be resolved (see its NodeClassReady condition)")
            }
            Excluded::PodDoNotDisrupt { pod } => write!(f, "pod {pod} has karpenter.sh/do-not-disrupt"),
            Excluded::MultiplePdbs { pod, pdbs } => {
                write!(
                    f,
                    "pod {pod} is matched by {} PDBs ({}), which blocks its eviction",
                    pdbs.len(),
                    pdbs.join(", ")
                )
            }
            Excluded::PdbBlocks { pod, pdb } => write!(f, "PDB {pdb} allows no disruption of pod {pod} now"),
        }
    }
}

/// A node a method may disrupt.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Index in [`Scope::nodes`].
    pub index: usize,
    /// NodeClaim name.
    pub claim: String,
    /// NodePool name.
    pub nodepool: String,
}

/// The candidates of a method, the nodes left out with why, and warnings to emit as events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// Candidates, in scope order.
    pub eligible: Vec<Candidate>,
    /// `(claim, why)` for every other node.
    pub excluded: Vec<(String, Excluded)>,
    /// `(claim, message)`: something ignored that the user should fix (an unreadable annotation).
    pub warnings: Vec<(String, String)>,
}

/// The candidates of `method` in `scope` at `now` (§4.3). Drift of a claim with a
/// `terminationGracePeriod` skips the pod checks: those pods are forced out at the deadline anyway.
pub fn candidates(scope: &Scope, method: Method, now: Timestamp) -> Candidates {
    let mut out = Candidates::default();
    for (index, node) in scope.nodes.iter().enumerate() {
        let skip_pods = method == Method::Drift && node.termination_grace_period.is_some();
        match check(scope, node, skip_pods, now, &mut out.warnings) {
            Ok(nodepool) => out.eligible.push(Candidate { index, claim: node.claim.clone(), nodepool }),
            Err(why) => out.excluded.push((node.claim.clone(), why)),
        }
    }
    out
}

fn check(
    scope: &Scope,
    node: &NodeFacts,
    skip_pods: bool,
    now: Timestamp,
    warnings: &mut Vec<(String, String)>,
) -> Result<String, Excluded> {
    if node.queued {
        return Err(Excluded::Queued);
    }
    if node.node.is_none() {
        return Err(Excluded::NoNode);
    }
    if !node.initialized {
        return Err(Excluded::NotInitialized);
    }
    if node.marked_for_deletion || node.instance_terminating {
        return Err(Excluded::MarkedForDeletion);
    }
    if node.nominated {
        return Err(Excluded::Nominated);
    }
    if node.do_not_disrupt {
        return Err(Excluded::DoNotDisrupt);
    }
    let pool_name = node.nodepool.clone().ok_or(Excluded::NoNodePool)?;
    let pool = scope.pool(&pool_name).ok_or_else(|| Excluded::NodePoolNotFound(pool_name.clone()))?;
    if pool.static_pool {
        return Err(Excluded::StaticPool(pool_name));
    }
    if !pool.types_resolve {
        return Err(Excluded::InstanceTypesUnresolved(pool_name));
    }
    if skip_pods {
        return Ok(pool_name);
    }
    for pod in &node.pods {
        if let DoNotDisrupt::Invalid(value) = pod.do_not_disrupt_at(now)
            && pod.active()
        {
            warnings.push((
                node.claim.clone(),
                format!(
                    "pod {}: karpenter.sh/do-not-disrupt {value:?} is neither \"true\" nor a duration such as 30m; ignored",
                    pod.name
                ),
            ));
        }
        if let Some(why) = pod_blocks(pod, now) {
            return Err(why);
        }
    }
    Ok(pool_name)
}

/// Why this pod alone keeps its node from voluntary disruption (§4.3): an active pod with an
/// active do-not-disrupt, or an evictable pod matched by several PDBs or by one allowing nothing.
pub fn pod_blocks(pod: &PodFacts, now: Timestamp) -> Option<Excluded> {
    if pod.active() && pod.do_not_disrupt_at(now) == DoNotDisrupt::Yes {
        return Some(Excluded::PodDoNotDisrupt { pod: pod.name.clone() });
    }
    if !pod.evictable() {
        return None;
    }
    if pod.pdbs.len() > 1 {
        return Some(Excluded::MultiplePdbs {
            pod: pod.name.clone(),
            pdbs: pod.pdbs.iter().map(|p| p.name.clone()).collect(),
        });
    }
    pod.pdbs
        .iter()
        .find(|p| p.disruptions_allowed <= 0 && (pod.ready || !p.always_allow_unhealthy))
        .map(|pdb| Excluded::PdbBlocks { pod: pod.name.clone(), pdb: pdb.name.clone() })
}

/// A pool's budget base at runtime (§4.5): `N` = its initialized nodes whose claim is not
/// `InstanceTerminating`, and among them those already leaving (Node not Ready, or marked for
/// deletion), by `DisruptionReason`.
pub fn pool_counts(scope: &Scope, pool: &str) -> (usize, Disrupting) {
    let mut n = 0;
    let mut disrupting = Disrupting::default();
    for node in &scope.nodes {
        if node.nodepool.as_deref() != Some(pool)
            || node.node.is_none()
            || !node.initialized
            || node.instance_terminating
        {
            continue;
        }
        n += 1;
        // A started command's candidates are leaving already (upstream charges them at once): the
        // next command gets what the budget has left.
        if !node.node_ready || node.marked_for_deletion || node.queued {
            disrupting.add(node.disruption_reason);
        }
    }
    (n, disrupting)
}

/// How many more nodes each pool may lose for `reason` at `now`.
pub fn allowances(scope: &Scope, reason: DisruptionReason, now: Timestamp) -> BTreeMap<String, usize> {
    scope
        .pools
        .iter()
        .map(|pool| {
            let (n, disrupting) = pool_counts(scope, &pool.name);
            (pool.name.clone(), pool.budgets.allowed(n, &disrupting, reason, now))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::facts::{Owner, PdbFacts};
    use crate::testkit::*;

    fn only(scope: &Scope, method: Method) -> Result<(), Excluded> {
        let c = candidates(scope, method, now());
        match (c.eligible.len(), c.excluded.first()) {
            (1, None) => Ok(()),
            (0, Some((_, why))) => Err(why.clone()),
            _ => panic!("one node expected: {c:?}"),
        }
    }

    fn with_pod(pod: PodFacts) -> Scope {
        let mut n = node("a", 0.1);
        n.pods.push(pod);
        scope(vec![n])
    }

    #[test]
    fn checklist_10_7_candidates() {
        // 100. do-not-disrupt "true" on the Node → not a candidate (and an event); "false" → a candidate.
        let mut s = scope(vec![node("a", 0.1)]);
        s.nodes[0].do_not_disrupt = true;
        let why = only(&s, Method::SingleNodeConsolidation).unwrap_err();
        assert_eq!(why, Excluded::DoNotDisrupt);
        assert!(why.blocks(), "100: users hear about it");
        assert!(only(&scope(vec![node("a", 0.1)]), Method::SingleNodeConsolidation).is_ok(), "100");

        // 101. A pod with do-not-disrupt "30m" started 10 min ago → blocked; 31 min ago → candidate.
        let timed = |minutes: i64| PodFacts {
            do_not_disrupt: Some("30m".into()),
            started: Some(now() - jiff::SignedDuration::from_mins(minutes)),
            ..pod("web")
        };
        assert_eq!(
            only(&with_pod(timed(10)), Method::Emptiness),
            Err(Excluded::PodDoNotDisrupt { pod: "default/web".into() }),
            "101"
        );
        assert!(only(&with_pod(timed(31)), Method::Emptiness).is_ok(), "101");
        // Go's duration syntax, as upstream reads the annotation: "0.5h" is 30 min.
        let go = |minutes: i64| PodFacts { do_not_disrupt: Some("0.5h".into()), ..timed(minutes) };
        assert!(only(&with_pod(go(10)), Method::Emptiness).is_err(), "101, Go syntax");
        assert!(only(&with_pod(go(31)), Method::Emptiness).is_ok(), "101, Go syntax");

        // 102. do-not-disrupt "banana" → a candidate and a warning naming the value.
        let banana = with_pod(PodFacts { do_not_disrupt: Some("banana".into()), ..pod("web") });
        let c = candidates(&banana, Method::SingleNodeConsolidation, now());
        assert_eq!(c.eligible.len(), 1, "102");
        assert_eq!(c.warnings.len(), 1, "102");
        assert!(c.warnings[0].1.contains("\"banana\""), "102: {:?}", c.warnings);

        // 103. A PDB with disruptionsAllowed 0 → not a consolidation candidate; drifted with a TGP → drift proceeds.
        let mut blocked = with_pod(PodFacts { pdbs: vec![pdb("web-pdb", 0)], ..pod("web") });
        assert_eq!(
            only(&blocked, Method::SingleNodeConsolidation),
            Err(Excluded::PdbBlocks { pod: "default/web".into(), pdb: "default/web-pdb".into() }),
            "103"
        );
        assert!(only(&blocked, Method::Drift).is_err(), "103: without a TGP drift respects the PDB");
        blocked.nodes[0].termination_grace_period = Some(3600);
        assert!(only(&blocked, Method::Drift).is_ok(), "103: with a TGP drift proceeds");
        assert!(only(&blocked, Method::Emptiness).is_err(), "103: only drift skips the pod checks");

        // 104. A pod matched by two PDBs → not a candidate, whatever they allow.
        let two = with_pod(PodFacts { pdbs: vec![pdb("a", 5), pdb("b", 5)], ..pod("web") });
        assert!(matches!(only(&two, Method::Emptiness), Err(Excluded::MultiplePdbs { .. })), "104");

        // 105. Nominated or uninitialized → skipped (silently).
        let mut s = scope(vec![node("a", 0.1)]);
        s.nodes[0].nominated = true;
        let why = only(&s, Method::Emptiness).unwrap_err();
        assert_eq!(why, Excluded::Nominated, "105");
        assert!(!why.blocks(), "105");
        let mut s = scope(vec![node("a", 0.1)]);
        s.nodes[0].initialized = false;
        assert_eq!(only(&s, Method::Emptiness), Err(Excluded::NotInitialized), "105");

        // 106. A DaemonSet pod with do-not-disrupt "true" blocks; a succeeded pod with it does not.
        let ds = with_pod(PodFacts { owner: Owner::DaemonSet, do_not_disrupt: Some("true".into()), ..pod("agent") });
        assert!(matches!(only(&ds, Method::Emptiness), Err(Excluded::PodDoNotDisrupt { .. })), "106");
        let done = with_pod(PodFacts { terminal: true, do_not_disrupt: Some("true".into()), ..pod("job") });
        assert!(only(&done, Method::Emptiness).is_ok(), "106");
    }

    #[test]
    fn pdb_rules_follow_the_eviction_api() {
        // AlwaysAllow lets an unready pod go even at 0; a Ready one stays protected.
        let unhealthy = PdbFacts { always_allow_unhealthy: true, ..pdb("p", 0) };
        let unready = with_pod(PodFacts { pdbs: vec![unhealthy.clone()], ready: false, ..pod("web") });
        assert!(only(&unready, Method::Emptiness).is_ok());
        let ready = with_pod(PodFacts { pdbs: vec![unhealthy], ..pod("web") });
        assert!(only(&ready, Method::Emptiness).is_err());
        // Pods the drain never evicts are not checked: mirror pods, pods tolerating the disrupted taint, finished pods.
        for p in [
            PodFacts { owner: Owner::Node, pdbs: vec![pdb("p", 0)], ..pod("static") },
            PodFacts { tolerates_disrupted: true, pdbs: vec![pdb("p", 0)], ..pod("tolerant") },
            PodFacts { terminal: true, pdbs: vec![pdb("p", 0)], ..pod("done") },
        ] {
            assert!(only(&with_pod(p.clone()), Method::Emptiness).is_ok(), "{p:?}");
        }
    }

    #[test]
    fn every_exclusion_has_a_reason() {
        let mut nodes: Vec<NodeFacts> = (0..9).map(|i| node(&format!("n{i}"), 0.1)).collect();
        nodes[0].queued = true;
        nodes[1].node = None;
        nodes[2].marked_for_deletion = true;
        nodes[3].instance_terminating = true;
        nodes[4].nodepool = None;
        nodes[5].nodepool = Some("gone".into());
        nodes[6].pods.push(PodFacts { do_not_disrupt: Some("true".into()), ..pod("x") });
        let mut s = scope(nodes);
        s.pools.push(pool_unresolved("broken"));
        s.nodes[7].nodepool = Some("broken".into());
        let c = candidates(&s, Method::SingleNodeConsolidation, now());
        let reasons: Vec<String> = c.excluded.iter().map(|(claim, why)| format!("{claim}: {why}")).collect();
        assert_eq!(
            reasons,
            [
                "n0: already part of a disruption command",
                "n1: no Node registered yet",
                "n2: already being deleted",
                "n3: already being deleted",
                "n4: no karpenter.sh/nodepool label",
                "n5: NodePool gone not found",
                "n6: pod default/x has karpenter.sh/do-not-disrupt",
                "n7: the instance types of NodePool broken cannot be resolved (see its NodeClassReady condition)",
            ]
        );
        assert_eq!(c.eligible.iter().map(|c| c.claim.as_str()).collect::<Vec<_>>(), ["n8"]);
    }

    #[test]
    fn checklist_10_1_item_20_budget_base() {
        // 20. 10 initialized nodes (one InstanceTerminating) and 2 uninitialized → N = 9.
        let mut nodes: Vec<NodeFacts> = (0..12).map(|i| node(&format!("n{i}"), 0.1)).collect();
        nodes[0].instance_terminating = true;
        nodes[10].initialized = false;
        nodes[11].initialized = false;
        // One NotReady node and one being deleted for Drifted are leaving.
        nodes[1].node_ready = false;
        nodes[2].marked_for_deletion = true;
        nodes[2].disruption_reason = Some(DisruptionReason::Drifted);
        let s = scope(nodes);
        let (n, disrupting) = pool_counts(&s, "default");
        assert_eq!(n, 9);
        assert_eq!(disrupting.total, 2);
        assert_eq!(disrupting.by_reason.get(&DisruptionReason::Drifted), Some(&1));
        // Default 10 % of 9 = 1, minus 2 leaving = 0.
        assert_eq!(allowances(&s, DisruptionReason::Empty, now()).get("default"), Some(&0));
    }
}
