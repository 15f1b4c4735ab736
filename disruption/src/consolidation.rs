//! Consolidation (karpenter-semantics §4.9–§4.11): remove under-used nodes, or replace them by one
//! cheaper node, when their pods fit elsewhere; with the hub's minimum savings θ for replacements
//! (§9 D8) and the `Balanced` policy.

use std::collections::{BTreeMap, VecDeque};

use crds::labels;
use crds::nodepool::{ConsolidationPolicy, DisruptionReason};
use jiff::Timestamp;
use scheduling::model::{NewClaim, Operator};

use crate::candidates::{Candidate, Candidates, Method, allowances, candidates};
use crate::facts::Scope;
use crate::methods::{Command, Outcome, Simulation, Simulator};

/// Hub-wide consolidation settings (karpenter-semantics §0.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// θ: a replacement must cost less than `(1 − θ) ×` the candidates' price. Hub default 0.10;
    /// 0 gives upstream's behaviour (any strictly cheaper replacement).
    pub min_replace_savings: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { min_replace_savings: 0.10 }
    }
}

/// How long multi-node consolidation may search (upstream's `MultiNodeConsolidationTimeoutDuration`).
pub const MULTI_NODE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long single-node consolidation may try candidates (upstream's
/// `SingleNodeConsolidationTimeoutDuration`).
pub const SINGLE_NODE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Candidates multi-node consolidation considers at most (§4.10, §9 D3).
pub const MAX_MULTI_NODE_CANDIDATES: usize = 100;
/// Balanced approves a move whose score is at least `1 / k`.
pub const BALANCED_K: f64 = 2.0;

/// Consolidation candidates (§4.9): labels known, `consolidateAfter` finite, `Consolidatable`, not
/// empty (emptiness takes those) and the pool's policy not `WhenEmpty` (reported blocked).
fn eligible(scope: &Scope, c: &Candidates, out: &mut Outcome) -> Vec<Candidate> {
    let mut list = Vec::new();
    for cand in &c.eligible {
        let node = &scope.nodes[cand.index];
        let Some(pool) = scope.pool(&cand.nodepool) else { continue };
        let labelled = node.instance_type.is_some() && node.zone.is_some() && node.capacity_type.is_some();
        if !labelled || pool.consolidate_after.is_none() || !node.consolidatable || node.is_empty() {
            continue;
        }
        if pool.protect_single_replica
            && let Some(p) = node.pods.iter().find(|p| p.only_ready_replica && p.reschedulable())
        {
            out.blocked.push((
                cand.claim.clone(),
                format!(
                    "pod {} is its controller's only ready replica and NodePool {} protects single replicas",
                    p.name, pool.name
                ),
            ));
            continue;
        }
        if pool.policy == ConsolidationPolicy::WhenEmpty {
            out.blocked.push((
                cand.claim.clone(),
                format!(
                    "under-used but not empty, and NodePool {} consolidates only empty nodes (WhenEmpty)",
                    pool.name
                ),
            ));
            continue;
        }
        list.push(cand.clone());
    }
    list.sort_by(|a, b| {
        let (ra, rb) = (scope.nodes[a.index].savings_ratio(), scope.nodes[b.index].savings_ratio());
        rb.total_cmp(&ra).then_with(|| a.claim.cmp(&b.claim))
    });
    list
}

/// Why a candidate set gives no command.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum NoCommand {
    /// Some pods would have nowhere to go (each as the simulation describes it).
    #[error("pods fit nowhere else: {}", .0.join("; "))]
    Unplaceable(Vec<String>),
    /// More than one replacement.
    #[error("would need {0} new nodes")]
    NewNodes(usize),
    #[error("no replacement")]
    NoReplacement,
    /// No option saves the hub's minimum share (`percent`) of the candidates' price (`total`).
    #[error("no replacement is at least {percent:.0} % cheaper than {total:.4} EUR/h")]
    NotCheaper { percent: f64, total: f64 },
    #[error("the cheaper replacements do not leave enough flavors for minValues")]
    MinValues,
    /// A `Balanced` pool finds the move not worth its disruption.
    #[error("NodePool {pool} is Balanced and the move scores {score:.2}, below {:.2}", 1.0 / BALANCED_K)]
    Unbalanced { pool: String, score: f64 },
}

fn decide(
    scope: &Scope,
    method: Method,
    set: &[Candidate],
    simulator: &mut dyn Simulator,
    settings: Settings,
) -> Result<Command, NoCommand> {
    let indices: Vec<usize> = set.iter().map(|c| c.index).collect();
    let new_claims = match simulator.simulate(&indices) {
        Simulation::Unplaceable(pods) => return Err(NoCommand::Unplaceable(pods)),
        Simulation::Placed { new_claims } => new_claims,
    };
    let replacements = match new_claims.len() {
        0 => Vec::new(),
        1 => vec![cheaper(scope, method, set, new_claims.into_iter().next(), settings)?],
        n => return Err(NoCommand::NewNodes(n)),
    };
    let command = Command::new(method, scope, set.to_vec(), replacements);
    balanced(scope, &command)?;
    Ok(command)
}

/// The replacement narrowed to the options cheap enough (§4.9 step 3, §4.10 step 3).
fn cheaper(
    scope: &Scope,
    method: Method,
    set: &[Candidate],
    claim: Option<NewClaim>,
    settings: Settings,
) -> Result<NewClaim, NoCommand> {
    let Some(mut claim) = claim else { return Err(NoCommand::NoReplacement) };
    let total: f64 = set.iter().map(|c| scope.nodes[c.index].price).sum();
    let bound = total * (1.0 - settings.min_replace_savings);
    let mut options: Vec<_> = claim.instance_types.iter().filter(|o| o.price < bound).cloned().collect();
    if method == Method::MultiNodeConsolidation {
        // Merging into a type some candidate already has is just a deletion of the others: only
        // options strictly cheaper than the cheapest such candidate are a real replacement.
        let same_type = set
            .iter()
            .map(|c| &scope.nodes[c.index])
            .filter(|n| options.iter().any(|o| Some(&o.name) == n.instance_type.as_ref()))
            .map(|n| n.price)
            .min_by(f64::total_cmp);
        if let Some(floor) = same_type {
            options.retain(|o| o.price < floor);
        }
    }
    if options.is_empty() {
        return Err(NoCommand::NotCheaper { percent: settings.min_replace_savings * 100.0, total });
    }
    for r in &mut claim.requirements {
        if r.key == labels::INSTANCE_TYPE && r.operator == Operator::In {
            r.values.retain(|v| options.iter().any(|o| &o.name == v));
            if r.min_values.is_some_and(|m| usize::try_from(m).unwrap_or(usize::MAX) > r.values.len()) {
                return Err(NoCommand::MinValues);
            }
        }
    }
    claim.price = options[0].price;
    claim.instance_types = options;
    Ok(claim)
}

/// `Balanced` (§4.9): each Balanced pool involved must find the move worth its disruption:
/// `(savings / pool cost) / (move disruption / pool disruption) ≥ 1/k`.
fn balanced(scope: &Scope, command: &Command) -> Result<(), NoCommand> {
    let total_price: f64 = command.candidates.iter().map(|c| scope.nodes[c.index].price).sum();
    let replacement: f64 = command.replacements.iter().map(|r| r.price).sum();
    let mut pools: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for c in &command.candidates {
        let node = &scope.nodes[c.index];
        let entry = pools.entry(c.nodepool.as_str()).or_default();
        entry.0 += node.price;
        entry.1 += node.reschedule_cost();
    }
    for (name, (price, move_disruption)) in pools {
        if scope.pool(name).is_none_or(|p| p.policy != ConsolidationPolicy::Balanced) {
            continue;
        }
        // The pool's share of the replacement is proportional to its part of the price.
        let share = if total_price > 0.0 { replacement * price / total_price } else { 0.0 };
        let savings = price - share;
        let members = scope
            .nodes
            .iter()
            .filter(|n| n.nodepool.as_deref() == Some(name) && n.node.is_some() && !n.marked_for_deletion);
        let (pool_cost, pool_disruption) = members.fold((0.0, 0.0), |(c, d), n| (c + n.price, d + n.reschedule_cost()));
        let score = if pool_cost > 0.0 && move_disruption > 0.0 {
            (savings / pool_cost) / (move_disruption / pool_disruption)
        } else {
            0.0
        };
        if score < 1.0 / BALANCED_K {
            return Err(NoCommand::Unbalanced { pool: name.to_string(), score });
        }
    }
    Ok(())
}

/// Single-node consolidation (§4.11): candidates by savings ratio, pools interleaved round-robin;
/// the first one that gives a real command (delete, or one cheaper replacement) wins. The command
/// is to be validated after the delay before it starts.
pub fn single_node(scope: &Scope, now: Timestamp, simulator: &mut dyn Simulator, settings: Settings) -> Outcome {
    let c = candidates(scope, Method::SingleNodeConsolidation, now);
    let mut out = crate::methods::outcome_of(&c);
    let list = eligible(scope, &c, &mut out);
    let mut queues: BTreeMap<&str, VecDeque<&Candidate>> = BTreeMap::new();
    for cand in &list {
        queues.entry(cand.nodepool.as_str()).or_default().push_back(cand);
    }
    let left = allowances(scope, DisruptionReason::Underutilized, now);
    let mut constrained = false;
    let mut order = Vec::with_capacity(list.len());
    while queues.values().any(|q| !q.is_empty()) {
        for q in queues.values_mut() {
            order.extend(q.pop_front());
        }
    }
    for cand in order {
        if left.get(&cand.nodepool).copied().unwrap_or(0) == 0 {
            constrained = true;
            continue;
        }
        if simulator.out_of_time() {
            // Upstream abandons the pass: a command found this late may rest on a stale view.
            out.timed_out = true;
            break;
        }
        match decide(scope, Method::SingleNodeConsolidation, std::slice::from_ref(cand), simulator, settings) {
            Ok(command) => {
                out.command = Some(command);
                break;
            }
            Err(_no_op) => continue,
        }
    }
    out.budget_constrained = constrained;
    out.consolidated = out.command.is_none() && !constrained && !out.timed_out;
    out
}

/// Multi-node consolidation (§4.10): the best candidates the budgets allow (at most 100, at least
/// 2), and a binary search on the prefix length for a set that can go at once (deleted, or merged
/// into one cheaper node). Validity is not monotone in the prefix, so the answer is a good prefix,
/// not necessarily the longest.
pub fn multi_node(scope: &Scope, now: Timestamp, simulator: &mut dyn Simulator, settings: Settings) -> Outcome {
    let c = candidates(scope, Method::MultiNodeConsolidation, now);
    let mut out = crate::methods::outcome_of(&c);
    let mut left = allowances(scope, DisruptionReason::Underutilized, now);
    let mut constrained = false;
    let mut taken = Vec::new();
    for cand in eligible(scope, &c, &mut out) {
        if taken.len() == MAX_MULTI_NODE_CANDIDATES {
            break;
        }
        match left.get_mut(&cand.nodepool) {
            Some(n) if *n > 0 => {
                *n -= 1;
                taken.push(cand);
            }
            _ => constrained = true,
        }
    }
    let mut best = None;
    if taken.len() >= 2 {
        let (mut lo, mut hi) = (1usize, taken.len() - 1);
        while lo <= hi {
            if simulator.out_of_time() {
                // The best set found so far stands (upstream's multi-node timeout).
                out.timed_out = true;
                break;
            }
            let mid = (lo + hi) / 2;
            match decide(scope, Method::MultiNodeConsolidation, &taken[..=mid], simulator, settings) {
                Ok(command) => {
                    best = Some(command);
                    lo = mid + 1;
                }
                Err(_) => hi = mid - 1,
            }
        }
    }
    out.budget_constrained = constrained;
    out.consolidated = best.is_none() && !constrained && !out.timed_out;
    out.command = best;
    out
}

/// Why a consolidation command is dropped at validation (§4.12).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalidated {
    /// The NodeClaim is no longer a consolidation candidate.
    #[error("{claim} is no longer a consolidation candidate")]
    NoLongerCandidate {
        /// The candidate's NodeClaim.
        claim: String,
    },
    /// The pool's budget has no room left for this candidate.
    #[error("the budget of NodePool {nodepool} no longer allows it")]
    Budget {
        /// The candidate's NodePool.
        nodepool: String,
    },
    /// Some pods would have nowhere to go now (each as the simulation describes it).
    #[error("pods fit nowhere else now: {}", .0.join("; "))]
    Unplaceable(Vec<String>),
    /// A Delete that now needs this many new nodes.
    #[error("a Delete now needs {0} new nodes")]
    DeleteNeedsNodes(usize),
    /// Instance types the replacement planned that it can no longer be.
    #[error("the replacement can no longer be {}", .0.join(", "))]
    Narrowed(Vec<String>),
    /// A Replace that now needs this many new nodes (not one).
    #[error("the replacement now needs {0} new nodes")]
    ReplacementNeedsNodes(usize),
}

/// A consolidation command after the validation delay (§4.12), on a fresh scope: every candidate
/// must still be a consolidation candidate within a fresh budget, and a new simulation must agree —
/// a Delete still needs no new node, a Replace still exactly one whose options include all of the
/// command's. `Err` says why the command is dropped.
pub fn validate_consolidation(
    command: &Command,
    scope: &Scope,
    now: Timestamp,
    simulator: &mut dyn Simulator,
) -> Result<(), Invalidated> {
    let c = candidates(scope, command.method, now);
    let mut ignored = Outcome::default();
    let still = eligible(scope, &c, &mut ignored);
    let mut left = allowances(scope, DisruptionReason::Underutilized, now);
    for cand in &command.candidates {
        if !still.iter().any(|s| s.claim == cand.claim && s.index == cand.index) {
            return Err(Invalidated::NoLongerCandidate { claim: cand.claim.clone() });
        }
        match left.get_mut(&cand.nodepool) {
            Some(n) if *n > 0 => *n -= 1,
            _ => return Err(Invalidated::Budget { nodepool: cand.nodepool.clone() }),
        }
    }
    let indices: Vec<usize> = command.candidates.iter().map(|c| c.index).collect();
    let new_claims = match simulator.simulate(&indices) {
        Simulation::Unplaceable(pods) => return Err(Invalidated::Unplaceable(pods)),
        Simulation::Placed { new_claims } => new_claims,
    };
    match (command.replacements.first(), new_claims.as_slice()) {
        (None, []) => Ok(()),
        (None, _) => Err(Invalidated::DeleteNeedsNodes(new_claims.len())),
        (Some(planned), [now_claim]) => {
            let missing: Vec<String> = planned
                .instance_types
                .iter()
                .filter(|o| !now_claim.instance_types.iter().any(|n| n.name == o.name))
                .map(|o| o.name.clone())
                .collect();
            if missing.is_empty() { Ok(()) } else { Err(Invalidated::Narrowed(missing)) }
        }
        (Some(_), claims) => Err(Invalidated::ReplacementNeedsNodes(claims.len())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::facts::{NodeFacts, PodFacts};
    use crate::simulation::ScopeModel;
    use crate::testkit::{now, pod as pod_facts, scope};
    use scheduling::testkit::{GI, flavors, node_of, pod, pool, running};

    /// `(name, flavor, pods as (cpu millis, memory GiB))`.
    type Spec<'a> = (&'a str, &'a str, &'a [(i64, i64)]);

    /// A scope of pool `default` (API defaults) and the matching scheduling model.
    fn fleet(nodes: &[Spec<'_>]) -> (Scope, ScopeModel) {
        let price = |flavor: &str| flavors().into_iter().find(|t| t.name == flavor).and_then(|t| t.price()).unwrap();
        let mut facts = Vec::new();
        let mut model = ScopeModel::default();
        model.input.pools = vec![pool("default")];
        for (i, (name, flavor, pods)) in nodes.iter().enumerate() {
            let mut n = crate::testkit::node(name, price(flavor));
            n.instance_type = Some(flavor.to_string());
            let names: Vec<String> = (0..pods.len()).map(|j| format!("{name}-{j}")).collect();
            n.pods = names.iter().map(|p| pod_facts(p)).collect();
            facts.push(n);
            let running_pods = pods.iter().zip(&names).map(|((cpu, gib), p)| running(p, *cpu, gib * GI, &[])).collect();
            let mut existing = node_of(name, flavor, running_pods);
            existing.managed = true;
            existing.nodepool = Some("default".into());
            model.input.nodes.push(existing);
            model.node_index.push(Some(i));
            model.movable.push(pods.iter().zip(&names).map(|((cpu, gib), p)| pod(p, *cpu, gib * GI)).collect());
        }
        (scope(facts), model)
    }

    fn replacement_options(out: &Outcome) -> Vec<String> {
        let c = out.command.as_ref().unwrap();
        assert_eq!(c.replacements.len(), 1, "{c:?}");
        c.replacements[0].instance_types.iter().map(|o| o.name.clone()).collect()
    }

    fn single(s: &Scope, m: &ScopeModel) -> Outcome {
        single_node(s, now(), &mut m.for_consolidation(), Settings::default())
    }

    fn multi(s: &Scope, m: &ScopeModel) -> Outcome {
        multi_node(s, now(), &mut m.for_consolidation(), Settings::default())
    }

    fn open_budget(s: &mut Scope) {
        s.pools = vec![crate::testkit::pool_with_budgets("default", &[("100%", None)])];
    }

    #[test]
    fn checklist_10_9_single_node() {
        // 117. Two 2XS, each with one 1 CPU/1Gi pod → one node deleted, no new claim.
        let (s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        let out = single(&s, &m);
        let c = out.command.unwrap();
        assert_eq!(c.claims().len(), 1, "117");
        assert!(c.replacements.is_empty(), "117");
        assert!((c.savings_per_hour - 0.0333).abs() < 1e-9, "117: {}", c.savings_per_hour);

        // 118. A lone M with pods totalling 3 CPU/3Gi → Replace with options 2XS, XS, S.
        let (s, m) = fleet(&[("m", "M", &[(1000, 1), (1000, 1), (1000, 1)])]);
        let out = single(&s, &m);
        assert_eq!(replacement_options(&out), ["2XS", "XS", "S"], "118");
        let c = out.command.unwrap();
        assert_eq!(c.reason, DisruptionReason::Underutilized);
        assert!((c.savings_per_hour - (0.1167 - 0.0333)).abs() < 1e-9, "118: {}", c.savings_per_hour);
        let types = c.replacements[0].requirements.iter().find(|r| r.key == labels::INSTANCE_TYPE).unwrap();
        assert_eq!(types.values, ["2XS", "XS", "S"], "118: the claim's requirement narrowed too");

        // 119. A lone XS with pods totalling 4.5 CPU → no action (nothing cheaper fits); consolidated.
        let (s, m) = fleet(&[("xs", "XS", &[(2500, 1), (2000, 1)])]);
        let out = single(&s, &m);
        assert!(out.command.is_none(), "119");
        assert!(out.consolidated, "119");
    }

    #[test]
    fn a_pool_at_its_limit_still_replaces_a_node_by_a_smaller_one() {
        // The candidate's capacity leaves the pool's usage in the simulation: an M whose pool is
        // capped at one node and 16 CPU is replaced by a 2XS (upstream counts the candidate too
        // and can never shrink a pool at its limit).
        let (s, mut m) = fleet(&[("m", "M", &[(1000, 1), (1000, 1)])]);
        let capacity = m.input.nodes[0].capacity;
        m.input.pools[0].limits.nodes = Some(1);
        m.input.pools[0].limits.cpu_millis = Some(16_000);
        m.input.pools[0].usage.resources = capacity;
        m.input.pools[0].usage.nodes = 1;
        assert_eq!(replacement_options(&single(&s, &m)).first().map(String::as_str), Some("2XS"));
    }

    #[test]
    fn checklist_10_9_multi_node() {
        // 120. Three 2XS, each with one 1 CPU/1Gi pod → one command deleting two, no new claim.
        let (mut s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)]), ("c", "2XS", &[(1000, 1)])]);
        open_budget(&mut s);
        let c = multi(&s, &m).command.unwrap();
        assert_eq!(c.claims().len(), 2, "120");
        assert!(c.replacements.is_empty(), "120");

        // 121. Two S, each with one 5 CPU/1Gi pod → Replace by one claim whose only option is M.
        let (mut s, m) = fleet(&[("a", "S", &[(5000, 1)]), ("b", "S", &[(5000, 1)])]);
        open_budget(&mut s);
        let out = multi(&s, &m);
        assert_eq!(replacement_options(&out), ["M"], "121");
        assert_eq!(out.command.unwrap().claims().len(), 2, "121");

        // 122. Three S, each with one 5 CPU/1Gi pod → one XL replacing all three with Karpenter's loop
        // (repack off). The hub's cost repack places the three pods on M + XS (two claims, so no
        // 3→1 move) and the search keeps the 2→1 prefix instead: two S replaced by an M, which
        // leaves the fleet at 0.2056 EUR/h instead of 0.2222 with the XL.
        let (mut s, mut m) = fleet(&[("a", "S", &[(5000, 1)]), ("b", "S", &[(5000, 1)]), ("c", "S", &[(5000, 1)])]);
        open_budget(&mut s);
        m.input.settings.repack = false;
        let out = multi(&s, &m);
        assert_eq!(replacement_options(&out).first().map(String::as_str), Some("XL"), "122");
        assert_eq!(out.command.unwrap().claims().len(), 3, "122");
        m.input.settings.repack = true;
        let out = multi(&s, &m);
        assert_eq!(replacement_options(&out), ["M"], "122 (hub)");
        assert_eq!(out.command.unwrap().claims().len(), 2, "122 (hub)");

        // 123. Two 2XS, each with one 3 CPU/1Gi pod → no action (XS saves 8.3 %); with θ = 0 → Replace by XS.
        let (mut s, m) = fleet(&[("a", "2XS", &[(3000, 1)]), ("b", "2XS", &[(3000, 1)])]);
        open_budget(&mut s);
        assert!(multi(&s, &m).command.is_none(), "123");
        let upstream = Settings { min_replace_savings: 0.0 };
        let out = multi_node(&s, now(), &mut m.for_consolidation(), upstream);
        assert_eq!(replacement_options(&out).first().map(String::as_str), Some("XS"), "123");
    }

    /// Upstream's consolidation timeouts: asked before each simulation, multi-node keeps the best
    /// set found before its time ran out, single-node decides nothing; neither claims the scope
    /// consolidated (the next pass tries again).
    #[test]
    fn consolidation_stops_at_its_time_limit() {
        let (mut s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)]), ("c", "2XS", &[(1000, 1)])]);
        open_budget(&mut s);
        let never = || false;
        let full = multi_node(&s, now(), &mut m.for_consolidation_until(&never), Settings::default());
        assert!(!full.timed_out && full.command.is_some());
        // Time runs out after the first simulation of the binary search: its answer stands.
        let asked = std::cell::Cell::new(0);
        let after_one = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        let out = multi_node(&s, now(), &mut m.for_consolidation_until(&after_one), Settings::default());
        assert!(out.timed_out && !out.consolidated);
        assert_eq!(out.command.map(|c| c.claims().len()), Some(2), "the first prefix tried (two nodes) stands");
        let at_once = || true;
        let out = multi_node(&s, now(), &mut m.for_consolidation_until(&at_once), Settings::default());
        assert!(out.timed_out && out.command.is_none() && !out.consolidated);
        let out = single_node(&s, now(), &mut m.for_consolidation_until(&at_once), Settings::default());
        assert!(out.timed_out && out.command.is_none() && !out.consolidated, "single-node abandons the pass");
        let out = single_node(&s, now(), &mut m.for_consolidation_until(&never), Settings::default());
        assert!(!out.timed_out && out.command.is_some());
    }

    #[test]
    fn checklist_10_9_destinations_and_policies() {
        // 124. WhenEmpty and an under-used non-empty node → no action, and a blocked event.
        let (mut s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        s.pools[0].policy = ConsolidationPolicy::WhenEmpty;
        let out = single(&s, &m);
        assert!(out.command.is_none(), "124");
        assert_eq!(out.blocked.len(), 2, "124");
        assert!(out.blocked[0].1.contains("WhenEmpty"), "124: {:?}", out.blocked);

        // 125. The only room is on an uninitialized node → no action.
        let (s, mut m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "XS", &[(6000, 1)])]);
        let mut fresh = node_of("fresh", "XL", Vec::new());
        fresh.managed = true;
        fresh.initialized = false;
        fresh.nodepool = Some("default".into());
        m.input.nodes.push(fresh.clone());
        let out = single(&s, &m);
        assert!(out.command.is_none(), "125: {:?}", out.command);
        // The same node initialized takes the pod: a Delete.
        m.input.nodes.last_mut().unwrap().initialized = true;
        assert!(single(&s, &m).command.is_some_and(|c| c.replacements.is_empty()), "125");

        // 126. The only destination not yet Consolidatable (finite consolidateAfter) → no Delete.
        let (mut s, mut m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        s.nodes[1].consolidatable = false;
        m.no_destination = vec![1];
        let out = single(&s, &m);
        assert!(out.command.is_none_or(|c| !c.replacements.is_empty()), "126");

        // 127. A permanently unschedulable pending pod → an otherwise valid Delete proceeds.
        let (s, mut m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        m.input.pods.push(pod("huge", 64_000, GI));
        let c = single(&s, &m).command.unwrap();
        assert!(c.replacements.is_empty(), "127");
    }

    #[test]
    fn checklist_10_9_item_131_balanced() {
        // Four 2XS, one pod on each of three, 7 pods on the candidate → delete rejected (score 0.44);
        // with 1 pod on it → approved (score 1.0).
        let mut nodes: Vec<NodeFacts> = ["a", "b", "c", "d"].iter().map(|n| crate::testkit::node(n, 0.0333)).collect();
        for n in &mut nodes[..3] {
            n.pods = vec![pod_facts(&format!("{}-0", n.claim))];
        }
        nodes[3].pods = (0..7).map(|j| pod_facts(&format!("d-{j}"))).collect::<Vec<PodFacts>>();
        let mut s = scope(nodes);
        s.pools[0].policy = ConsolidationPolicy::Balanced;
        let delete = |s: &Scope| Command::new(Method::SingleNodeConsolidation, s, vec![candidate(s, 3)], Vec::new());
        let err = balanced(&s, &delete(&s)).unwrap_err();
        assert!(err.to_string().contains("0.44"), "131: {err}");
        s.nodes[3].pods.truncate(1);
        assert_eq!(balanced(&s, &delete(&s)), Ok(()), "131");
    }

    fn candidate(s: &Scope, i: usize) -> Candidate {
        Candidate { index: i, claim: s.nodes[i].claim.clone(), nodepool: "default".into() }
    }

    #[test]
    fn single_node_respects_the_budget_and_does_not_cache_a_budget_block() {
        let (mut s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        s.pools = vec![crate::testkit::pool_with_budgets("default", &[("0", Some(DisruptionReason::Underutilized))])];
        let out = single(&s, &m);
        assert!(out.command.is_none());
        assert!(out.budget_constrained && !out.consolidated);
    }

    #[test]
    fn multi_node_takes_at_most_100_candidates() {
        // 129. 150 candidates → at most 100 in the search (every set is valid here: all fit on one node).
        let specs: Vec<(String, &str)> = (0..150).map(|i| (format!("n{i:03}"), "2XS")).collect();
        let (mut s, _) = fleet(&[]);
        open_budget(&mut s);
        for (name, _) in &specs {
            let mut n = crate::testkit::node(name, 0.0333);
            n.pods = vec![pod_facts(&format!("{name}-0"))];
            s.nodes.push(n);
        }
        struct Largest(usize);
        impl Simulator for Largest {
            fn simulate(&mut self, nodes: &[usize]) -> Simulation {
                self.0 = self.0.max(nodes.len());
                Simulation::Placed { new_claims: Vec::new() }
            }
        }
        let mut sim = Largest(0);
        let out = multi_node(&s, now(), &mut sim, Settings::default());
        assert_eq!(sim.0, 100, "129");
        assert_eq!(out.command.unwrap().candidates.len(), 100, "129");
    }

    #[test]
    fn checklist_10_9_validation() {
        // 128. A Replace whose options shrink during the wait → dropped.
        let (s, mut m) = fleet(&[("m", "M", &[(1000, 1), (1000, 1), (1000, 1)])]);
        let command = single(&s, &m).command.unwrap();
        assert_eq!(validate_consolidation(&command, &s, now(), &mut m.for_consolidation()), Ok(()), "128");
        // The pool's flavors narrow: 2XS is gone.
        m.input.pools[0].instance_types.retain(|t| t.name != "2XS");
        let err = validate_consolidation(&command, &s, now(), &mut m.for_consolidation()).unwrap_err();
        assert!(err.to_string().contains("2XS"), "128: {err}");

        // A Delete whose destination filled up meanwhile → dropped; a candidate nominated meanwhile → dropped.
        let (s, mut m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        let command = single(&s, &m).command.unwrap();
        let mut later = s.clone();
        later.nodes[command.candidates[0].index].nominated = true;
        assert!(validate_consolidation(&command, &later, now(), &mut m.for_consolidation()).is_err());
        let other = 1 - command.candidates[0].index;
        m.input.nodes[other].pods.push(running("filler", 3000, GI, &[]));
        let err = validate_consolidation(&command, &s, now(), &mut m.for_consolidation()).unwrap_err();
        assert!(err.to_string().contains("new nodes"), "{err}");
    }

    #[test]
    fn checklist_10_7_item_103_drift_with_a_grace_period_leaves_protected_pods_behind() {
        // 103. A drifted node with a TGP whose big pod a PDB blocks: drift proceeds.
        let (mut s, m) = fleet(&[("a", "XS", &[(5500, 1), (500, 1)]), ("b", "2XS", &[(1000, 1)])]);
        s.nodes[0].drifted = Some(crate::facts::Drift { reason: "NodePoolDrifted".into(), since: now() });
        s.nodes[0].pods[0].pdbs = vec![crate::testkit::pdb("big", 0)];
        assert!(crate::methods::drift(&s, now(), &mut m.for_drift()).command.is_none(), "103: no TGP, the PDB holds");
        s.nodes[0].termination_grace_period = Some(3600);
        // A PDB allowing no eviction *now* (minAvailable 1 of 1, say) is not fully blocking: the pod
        // goes once the budget allows, so it is currently reschedulable and its room is launched
        // (§5.5, as upstream): a replacement for the big pod, the small one moves to b.
        let c = crate::methods::drift(&s, now(), &mut m.for_drift()).command.unwrap();
        assert_eq!(c.claims(), ["a"], "103");
        assert_eq!(c.replacements.len(), 1, "103: capacity for the pod the PDB holds only now");
        // A fully blocking PDB (maxUnavailable 0): the pod never leaves before the deadline, gets no
        // room (forced out then), and the other pod moves to b: no replacement.
        s.nodes[0].pods[0].pdbs[0].fully_blocking = true;
        let c = crate::methods::drift(&s, now(), &mut m.for_drift()).command.unwrap();
        assert!(c.replacements.is_empty(), "103: no capacity for the fully blocked pod: {:?}", c.replacements);
        // So for an active do-not-disrupt.
        s.nodes[0].pods[0].pdbs.clear();
        s.nodes[0].pods[0].do_not_disrupt = Some("true".into());
        let c = crate::methods::drift(&s, now(), &mut m.for_drift()).command.unwrap();
        assert!(c.replacements.is_empty(), "103: {:?}", c.replacements);
        // Without either the big pod needs a replacement.
        s.nodes[0].pods[0].do_not_disrupt = None;
        let c = crate::methods::drift(&s, now(), &mut m.for_drift()).command.unwrap();
        assert_eq!(c.replacements.len(), 1, "103");
    }

    #[test]
    fn protect_single_replica_is_opt_in() {
        // §9 D7: with the pool annotation, a node hosting a controller's only ready replica is not consolidated.
        let (mut s, m) = fleet(&[("a", "2XS", &[(1000, 1)]), ("b", "2XS", &[(1000, 1)])]);
        for n in &mut s.nodes {
            n.pods[0].only_ready_replica = true;
        }
        assert!(single(&s, &m).command.is_some(), "off by default");
        s.pools[0].protect_single_replica = true;
        let out = single(&s, &m);
        assert!(out.command.is_none());
        assert_eq!(out.blocked.len(), 2);
        assert!(out.blocked[0].1.contains("only ready replica"), "{:?}", out.blocked);
    }
}
