//! The disruption methods that need no cost comparison: emptiness (§4.6) and drift (§4.7), each
//! returning at most one command, what blocked nodes, and whether the scope is "consolidated".

use std::collections::BTreeMap;

use crds::nodepool::DisruptionReason;
use jiff::Timestamp;
use scheduling::model::NewClaim;

use crate::candidates::{Candidate, Candidates, Method, allowances, candidates};
use crate::facts::Scope;

/// One disruption decision: delete `candidates`, after launching `replacements` (§4.13).
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// The method that decided it.
    pub method: Method,
    /// The budget reason it spends (the claims' `DisruptionReason`).
    pub reason: DisruptionReason,
    /// Nodes to delete.
    pub candidates: Vec<Candidate>,
    /// Claims to launch first; the candidates go only once these are initialized.
    pub replacements: Vec<NewClaim>,
    /// Σ candidate prices − Σ replacement prices, EUR/h (negative for a drift to a dearer flavor).
    pub savings_per_hour: f64,
}

impl Command {
    pub(crate) fn new(
        method: Method,
        scope: &Scope,
        candidates: Vec<Candidate>,
        replacements: Vec<NewClaim>,
    ) -> Command {
        let removed: f64 = candidates.iter().map(|c| scope.nodes[c.index].price).sum();
        let added: f64 = replacements.iter().map(|r| r.price).sum();
        Command { method, reason: method.reason(), candidates, replacements, savings_per_hour: removed - added }
    }

    /// Claim names of the candidates.
    pub fn claims(&self) -> Vec<&str> {
        self.candidates.iter().map(|c| c.claim.as_str()).collect()
    }
}

/// One line for the decision log: method, candidates, replacements and savings.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: delete {} ({:?})", self.method, self.claims().join(", "), self.reason)?;
        for r in &self.replacements {
            let options: Vec<&str> = r.instance_types.iter().map(|o| o.name.as_str()).collect();
            write!(f, ", launch one node in NodePool {} ({}) first", r.nodepool, options.join(" | "))?;
        }
        write!(f, ", saves {:.4} EUR/h", self.savings_per_hour)
    }
}

/// What a method decided in one pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The command to start, if any.
    pub command: Option<Command>,
    /// `(claim, why)`: nodes a user would expect to be disrupted but are not (`DisruptionBlocked` events).
    pub blocked: Vec<(String, String)>,
    /// `(claim, message)`: settings ignored because unreadable (warning events).
    pub warnings: Vec<(String, String)>,
    /// Some candidate was skipped only because its pool's budget was spent.
    pub budget_constrained: bool,
    /// Nothing to do and no budget in the way: the loop may skip this method until the scope
    /// changes (§4.12).
    pub consolidated: bool,
    /// The method stopped at its time limit ([`Simulator::out_of_time`]) before it had tried
    /// everything: multi-node keeps the best set found so far, single-node decides nothing.
    pub timed_out: bool,
}

/// An outcome carrying the candidates' blocked nodes and warnings, nothing decided yet.
pub(crate) fn outcome_of(c: &Candidates) -> Outcome {
    Outcome {
        blocked: c
            .excluded
            .iter()
            .filter(|(_, why)| why.blocks())
            .map(|(claim, why)| (claim.clone(), why.to_string()))
            .collect(),
        warnings: c.warnings.clone(),
        ..Outcome::default()
    }
}

/// Places the reschedulable pods of some nodes elsewhere, as the provisioner would with those
/// nodes gone (§4.8). [`crate::simulation::ScopeModel`] does it with the scheduling core.
pub trait Simulator {
    /// Simulates the removal of `nodes` (indices in [`Scope::nodes`]).
    fn simulate(&mut self, nodes: &[usize]) -> Simulation;

    /// The same, leaving the pods named in `left_behind` (`namespace/name`) out: they get no
    /// replacement capacity (drift of a claim with a `terminationGracePeriod`, §4.3).
    fn simulate_without(&mut self, nodes: &[usize], left_behind: &[String]) -> Simulation {
        let _ = left_behind;
        self.simulate(nodes)
    }

    /// Whether the method's time is up (upstream stops multi-node consolidation after
    /// [`crate::consolidation::MULTI_NODE_TIME_LIMIT`], single-node after
    /// [`crate::consolidation::SINGLE_NODE_TIME_LIMIT`]): asked before each simulation; the caller
    /// answers from its clock. Never, by default.
    fn out_of_time(&mut self) -> bool {
        false
    }
}

/// The result of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub enum Simulation {
    /// Every moved pod has a place: on existing nodes and on these new claims.
    Placed {
        /// Claims the provisioner would create.
        new_claims: Vec<NewClaim>,
    },
    /// Some moved pods have no place (`namespace/name: why`, at most a few).
    Unplaceable(Vec<String>),
}

/// Budget left per pool, spent as candidates are taken.
struct Spend {
    left: BTreeMap<String, usize>,
    constrained: bool,
}

impl Spend {
    fn new(scope: &Scope, reason: DisruptionReason, now: Timestamp) -> Spend {
        Spend { left: allowances(scope, reason, now), constrained: false }
    }

    fn has(&mut self, pool: &str) -> bool {
        let ok = self.left.get(pool).copied().unwrap_or(0) > 0;
        self.constrained |= !ok;
        ok
    }

    fn take(&mut self, pool: &str) -> bool {
        if !self.has(pool) {
            return false;
        }
        if let Some(left) = self.left.get_mut(pool) {
            *left -= 1;
        }
        true
    }
}

/// Candidates sorted by savings ratio, highest first (ties by claim name, for determinism).
fn by_savings_ratio(scope: &Scope, mut list: Vec<Candidate>) -> Vec<Candidate> {
    list.sort_by(|a, b| {
        let (ra, rb) = (scope.nodes[a.index].savings_ratio(), scope.nodes[b.index].savings_ratio());
        rb.total_cmp(&ra).then_with(|| a.claim.cmp(&b.claim))
    });
    list
}

/// Empty candidates of pools that allow emptiness, `Consolidatable=True` (§4.6), except those
/// holding a CapacityBuffer's room (upstream skips nodes with buffer pods too; consolidation may
/// still move that room, its simulation places the buffer's pods).
fn empty_candidates(scope: &Scope, c: &Candidates) -> Vec<Candidate> {
    c.eligible
        .iter()
        .filter(|c| {
            let node = &scope.nodes[c.index];
            let pool_allows = scope.pool(&c.nodepool).is_some_and(|p| p.consolidate_after.is_some());
            pool_allows && node.consolidatable && node.is_empty() && !node.buffer_room
        })
        .cloned()
        .collect()
}

/// Emptiness (§4.6): every empty, consolidatable candidate the budgets allow, in one delete
/// command, best savings first. To be validated after the delay with [`validate_emptiness`].
pub fn emptiness(scope: &Scope, now: Timestamp) -> Outcome {
    let c = candidates(scope, Method::Emptiness, now);
    let mut out = outcome_of(&c);
    let mut spend = Spend::new(scope, DisruptionReason::Empty, now);
    let taken: Vec<Candidate> =
        by_savings_ratio(scope, empty_candidates(scope, &c)).into_iter().filter(|c| spend.take(&c.nodepool)).collect();
    out.budget_constrained = spend.constrained;
    out.consolidated = taken.is_empty() && !spend.constrained;
    if !taken.is_empty() {
        out.command = Some(Command::new(Method::Emptiness, scope, taken, Vec::new()));
    }
    out
}

/// Emptiness after the validation delay (§4.6, §4.12), on a fresh scope: keeps the command's nodes
/// that are still empty candidates (a node nominated meanwhile for a pending pod is not) within a
/// fresh budget; `None` when none is left (the command is abandoned).
pub fn validate_emptiness(command: &Command, scope: &Scope, now: Timestamp) -> Option<Command> {
    let c = candidates(scope, Method::Emptiness, now);
    let still = empty_candidates(scope, &c);
    let mut spend = Spend::new(scope, DisruptionReason::Empty, now);
    let kept: Vec<Candidate> = command
        .candidates
        .iter()
        .filter_map(|old| still.iter().find(|c| c.claim == old.claim))
        .filter(|c| spend.take(&c.nodepool))
        .cloned()
        .collect();
    (!kept.is_empty()).then(|| Command::new(Method::Emptiness, scope, kept, Vec::new()))
}

/// Drift (§4.7): drifted candidates, oldest drift first. Empty ones go together in one delete
/// command without simulation (upstream now takes one per command, each simulated: a difference
/// docs/hub.md lists); otherwise the first non-empty one whose pods all find a place gives one
/// command with the claims the simulation made. A node whose pods fit nowhere is
/// reported blocked and the next one is tried. No validation delay.
pub fn drift(scope: &Scope, now: Timestamp, simulator: &mut dyn Simulator) -> Outcome {
    let c = candidates(scope, Method::Drift, now);
    let mut out = outcome_of(&c);
    let mut drifted: Vec<Candidate> =
        c.eligible.iter().filter(|c| scope.nodes[c.index].drifted.is_some()).cloned().collect();
    drifted.sort_by(|a, b| {
        let since = |c: &Candidate| scope.nodes[c.index].drifted.as_ref().map(|d| d.since);
        since(a).cmp(&since(b)).then_with(|| a.claim.cmp(&b.claim))
    });
    let mut spend = Spend::new(scope, DisruptionReason::Drifted, now);
    let (empty, busy): (Vec<Candidate>, Vec<Candidate>) =
        drifted.into_iter().partition(|c| scope.nodes[c.index].is_empty());
    let empty: Vec<Candidate> = empty.into_iter().filter(|c| spend.take(&c.nodepool)).collect();
    if !empty.is_empty() {
        out.command = Some(Command::new(Method::Drift, scope, empty, Vec::new()));
        out.budget_constrained = spend.constrained;
        return out;
    }
    for candidate in busy {
        if !spend.has(&candidate.nodepool) {
            continue;
        }
        // A claim with a terminationGracePeriod is drifted past its protected pods (§4.3). Those
        // kept for good (an active do-not-disrupt, a PDB forbidding every eviction) get no room
        // on the replacements, as upstream; one under a PDB that allows no eviction only *now*
        // goes once the budget allows, so its room is launched with the others.
        let node = &scope.nodes[candidate.index];
        let left_behind: Vec<String> = if node.termination_grace_period.is_some() {
            node.pods
                .iter()
                .filter(|p| p.reschedulable() && !p.currently_reschedulable(now))
                .map(|p| p.name.clone())
                .collect()
        } else {
            Vec::new()
        };
        match simulator.simulate_without(&[candidate.index], &left_behind) {
            Simulation::Placed { new_claims } => {
                out.command = Some(Command::new(Method::Drift, scope, vec![candidate], new_claims));
                break;
            }
            Simulation::Unplaceable(pods) => {
                out.blocked.push((
                    candidate.claim.clone(),
                    format!("drifted, but pods fit nowhere else: {}", pods.join("; ")),
                ));
            }
        }
    }
    out.budget_constrained = spend.constrained;
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::facts::{Drift, NodeFacts, Owner, PodFacts};
    use crate::testkit::*;
    use jiff::SignedDuration;

    /// A simulator answering from a table: nodes listed in `unplaceable` fit nowhere, others need
    /// one replacement claim of the given price.
    struct Table {
        unplaceable: Vec<usize>,
        calls: Vec<Vec<usize>>,
    }

    impl Simulator for Table {
        fn simulate(&mut self, nodes: &[usize]) -> Simulation {
            self.calls.push(nodes.to_vec());
            if nodes.iter().any(|n| self.unplaceable.contains(n)) {
                return Simulation::Unplaceable(vec!["default/big: no flavor has 64 CPU".into()]);
            }
            Simulation::Placed { new_claims: vec![claim(0.05)] }
        }
    }

    fn table(unplaceable: &[usize]) -> Table {
        Table { unplaceable: unplaceable.to_vec(), calls: Vec::new() }
    }

    fn claim(price: f64) -> NewClaim {
        NewClaim {
            nodepool: "default".into(),
            instance_types: vec![scheduling::model::ClaimOption { name: "2XS".into(), price }],
            price,
            pods: vec![0],
            requests: Default::default(),
            extended: Default::default(),
            requirements: Vec::new(),
            labels: Default::default(),
            taints: Vec::new(),
            startup_taints: Vec::new(),
            min_values_relaxed: false,
        }
    }

    fn busy(name: &str, price: f64) -> NodeFacts {
        let mut n = node(name, price);
        n.pods.push(pod(&format!("{name}-web")));
        n
    }

    fn drifted(mut n: NodeFacts, minutes_ago: i64) -> NodeFacts {
        n.drifted =
            Some(Drift { reason: "NodePoolDrifted".into(), since: now() - SignedDuration::from_mins(minutes_ago) });
        n
    }

    fn claims(out: &Outcome) -> Vec<&str> {
        out.command.as_ref().map(|c| c.claims()).unwrap_or_default()
    }

    #[test]
    fn checklist_10_8_emptiness() {
        // 107. 5 empty consolidatable nodes, budget 3 → one command deleting 3, still 3 after the delay.
        let mut s = scope((0..5).map(|i| node(&format!("n{i}"), 0.1 + f64::from(i) / 100.0)).collect());
        s.pools = vec![pool_with_budgets("default", &[("3", None)])];
        let out = emptiness(&s, now());
        assert_eq!(claims(&out), ["n4", "n3", "n2"], "107: best savings first, three of them");
        assert!(out.budget_constrained && !out.consolidated, "107");
        let validated = validate_emptiness(out.command.as_ref().unwrap(), &s, now() + SignedDuration::from_secs(15));
        assert_eq!(validated.unwrap().claims(), ["n4", "n3", "n2"], "107");

        // 108. Only DaemonSet pods → empty.
        let mut n = node("ds", 0.1);
        n.pods.push(PodFacts { owner: Owner::DaemonSet, ..pod("agent") });
        n.pods.push(PodFacts { owner: Owner::Node, ..pod("static") });
        assert_eq!(claims(&emptiness(&scope(vec![n]), now())), ["ds"], "108");

        // 109. A terminating Deployment pod leaves the node empty; a terminating StatefulSet pod does not.
        let mut n = node("dep", 0.1);
        n.pods.push(PodFacts { terminating: true, ..pod("web") });
        assert_eq!(claims(&emptiness(&scope(vec![n]), now())), ["dep"], "109");
        let mut n = node("sts", 0.1);
        n.pods.push(PodFacts { terminating: true, owner: Owner::StatefulSet, ..pod("db-0") });
        assert!(emptiness(&scope(vec![n]), now()).command.is_none(), "109");

        // 110. An empty node inside its consolidateAfter (not Consolidatable yet) is kept.
        let mut n = node("fresh", 0.1);
        n.consolidatable = false;
        assert!(emptiness(&scope(vec![n]), now()).command.is_none(), "110");

        // Issue 28 item 2: an empty node holding a CapacityBuffer's room is kept.
        let mut n = node("warm", 1.0);
        assert_eq!(claims(&emptiness(&scope(vec![n.clone()]), now())), ["warm"], "without the buffer");
        n.buffer_room = true;
        assert!(emptiness(&scope(vec![n]), now()).command.is_none(), "buffer room");

        // 111. A pod with deletion cost −2147483648 still makes the node non-empty (§9 D1).
        let mut n = node("cheap-pod", 0.1);
        n.pods.push(PodFacts { deletion_cost: i32::MIN, ..pod("web") });
        assert!(n.reschedule_cost() <= 1.0, "111: upstream would call it empty");
        assert!(emptiness(&scope(vec![n]), now()).command.is_none(), "111");

        // 112. A pending pod that needs the node gets it nominated during the delay → command abandoned.
        let s = scope(vec![node("spare", 0.1)]);
        let command = emptiness(&s, now()).command.unwrap();
        let mut later = s.clone();
        later.nodes[0].nominated = true;
        assert_eq!(validate_emptiness(&command, &later, now() + SignedDuration::from_secs(15)), None, "112");
        // ... and a node that got a pod meanwhile is dropped from the command, the rest kept.
        let mut s = scope(vec![node("a", 0.1), node("b", 0.1)]);
        s.pools = vec![pool_with_budgets("default", &[("100%", None)])];
        let command = emptiness(&s, now()).command.unwrap();
        assert_eq!(command.claims(), ["a", "b"], "112");
        let mut later = s.clone();
        later.nodes[0].pods.push(pod("new"));
        assert_eq!(validate_emptiness(&command, &later, now()).unwrap().claims(), ["b"], "112");
    }

    #[test]
    fn checklist_10_7_item_94_never_disables_emptiness() {
        // 94. consolidateAfter: Never → no emptiness deletion (and nothing to wait for: consolidated).
        let mut s = scope(vec![node("a", 0.1)]);
        s.pools[0].consolidate_after = None;
        let out = emptiness(&s, now());
        assert!(out.command.is_none());
        assert!(out.consolidated);
    }

    #[test]
    fn emptiness_with_no_budget_is_not_consolidated() {
        let mut s = scope(vec![node("a", 0.1)]);
        s.pools = vec![pool_with_budgets("default", &[("0", Some(DisruptionReason::Empty))])];
        let out = emptiness(&s, now());
        assert!(out.command.is_none());
        assert!(out.budget_constrained && !out.consolidated, "a budget block must be retried, not cached");
    }

    #[test]
    fn checklist_10_8_drift() {
        // 113. A drifted node with pods → one command with a replacement (launched before the delete).
        let s = scope(vec![drifted(busy("x", 0.1), 10)]);
        let out = drift(&s, now(), &mut table(&[]));
        let command = out.command.unwrap();
        assert_eq!(command.claims(), ["x"], "113");
        assert_eq!(command.replacements.len(), 1, "113");
        assert_eq!(command.reason, DisruptionReason::Drifted, "113");
        assert_eq!(
            command.to_string(),
            "drift: delete x (Drifted), launch one node in NodePool default (2XS) first, saves 0.0500 EUR/h",
            "the decision's log line"
        );

        // 114. Drifted X (earlier), Y, and an empty drifted Z → Z, then X, then Y (a budget for all
        // three: each started command's candidates are charged to it).
        let mut s = scope(vec![drifted(busy("x", 0.1), 30), drifted(busy("y", 0.1), 10), drifted(node("z", 0.1), 5)]);
        s.pools = vec![crate::testkit::pool_with_budgets("default", &[("3", None)])];
        let mut order = Vec::new();
        for _ in 0..3 {
            let out = drift(&s, now(), &mut table(&[]));
            let c = out.command.unwrap();
            order.extend(c.claims().iter().map(|c| c.to_string()));
            for cand in &c.candidates {
                s.nodes[cand.index].queued = true;
            }
        }
        assert_eq!(order, ["z", "x", "y"], "114");

        // Several commands at once: with a budget of 2, a third drifted node waits while two
        // started commands' candidates are queued.
        let mut s = scope(vec![drifted(busy("x", 0.1), 30), drifted(busy("y", 0.1), 10), drifted(busy("w", 0.1), 5)]);
        s.pools = vec![crate::testkit::pool_with_budgets("default", &[("2", None)])];
        s.nodes[0].queued = true;
        assert_eq!(claims(&drift(&s, now(), &mut table(&[]))), ["y"], "one of two in flight: one more");
        s.nodes[1].queued = true;
        let out = drift(&s, now(), &mut table(&[]));
        assert!(out.command.is_none() && out.budget_constrained, "two in flight: the budget is spent");

        // 116. A drifted node whose pods fit nowhere → blocked with the pods named, the next one processed.
        let s = scope(vec![drifted(busy("x", 0.1), 30), drifted(busy("y", 0.1), 10)]);
        let mut sim = table(&[0]);
        let out = drift(&s, now(), &mut sim);
        assert_eq!(claims(&out), ["y"], "116");
        assert_eq!(out.blocked.len(), 1, "116");
        assert_eq!(out.blocked[0].0, "x", "116");
        assert!(out.blocked[0].1.contains("default/big"), "116: {:?}", out.blocked);
        assert_eq!(sim.calls, [vec![0], vec![1]], "116: one simulation per candidate");
    }

    #[test]
    fn drift_respects_budgets_and_skips_undrifted_nodes() {
        let mut s = scope(vec![drifted(busy("x", 0.1), 30), busy("plain", 0.1)]);
        s.pools = vec![pool_with_budgets("default", &[("0", Some(DisruptionReason::Drifted))])];
        let mut sim = table(&[]);
        let out = drift(&s, now(), &mut sim);
        assert!(out.command.is_none());
        assert!(out.budget_constrained);
        assert!(sim.calls.is_empty(), "no simulation for a node the budget forbids");
        s.pools = vec![pool("default")];
        let out = drift(&s, now(), &mut table(&[]));
        assert_eq!(claims(&out), ["x"], "the undrifted node is never picked");
    }
}
