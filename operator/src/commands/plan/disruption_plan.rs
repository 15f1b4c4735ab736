//! `plan --disruption`: the offline view of the disruption loop. Reduces the manifests' NodePools,
//! NodeClaims, Nodes, bound Pods and PDBs to the `disruption` crate's facts and runs its methods in
//! the loop's order (emptiness, drift, multi-node, single-node consolidation) until one decides.
//!
//! Owns the rendering; the reduction to facts and the method order are
//! [`crate::decisions::disruption_scope`]'s (shared with the hub), the decisions the crate's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crds::catalog::round4;
use crds::nodepool::DisruptionReason;
use disruption::Scope;
use jiff::Timestamp;
use scheduling::convert::PendingRule;
use scheduling::model::Settings;
use serde::Serialize;

use super::{Manifests, PlanError, clusters};
use crate::decisions::{disruption_scope, nomination};

/// A node in a decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedCandidate {
    /// NodeClaim.
    pub node_claim: String,
    /// Node, when it exists.
    pub node: Option<String>,
    /// Pool.
    pub node_pool: String,
    /// `node.kubernetes.io/instance-type`.
    pub flavor: Option<String>,
    /// Price of its offering, EUR/h.
    pub price_per_hour: f64,
    /// Pods that would be moved (`namespace/name`).
    pub pods: Vec<String>,
}

/// A replacement launched before the candidates go.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replacement {
    /// Pool.
    pub node_pool: String,
    /// The cheapest option.
    pub flavor: String,
    /// Options, cheapest first.
    pub instance_types: Vec<String>,
    /// Price of `flavor`, EUR/h.
    pub price_per_hour: f64,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedCommand {
    /// `emptiness`, `drift`, `multi-node consolidation` or `single-node consolidation`.
    pub method: String,
    /// The budget reason spent: `Empty`, `Drifted`, `Underutilized`.
    pub reason: String,
    /// Nodes deleted.
    pub candidates: Vec<PlannedCandidate>,
    /// Claims launched first.
    pub replacements: Vec<Replacement>,
    /// Σ candidate prices − Σ replacement prices, EUR/h.
    pub savings_per_hour: f64,
    /// The hub's decision log line.
    pub summary: String,
}

/// A node a user would expect to be disrupted, and why it is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocked {
    /// NodeClaim.
    pub node_claim: String,
    /// Why.
    pub reason: String,
}

/// What one method decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    /// Method.
    pub method: String,
    /// It decided: its command is `decision` (the loop runs no further method).
    pub decided: bool,
    /// Nodes blocked, with the reason.
    pub blocked: Vec<Blocked>,
    /// Some candidate was skipped only because its pool's budget was spent.
    pub budget_constrained: bool,
}

/// Budget left in a pool at `now`, per reason (before the decision).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolBudget {
    /// Pool.
    pub node_pool: String,
    /// Nodes the budget is counted on (initialized, not terminating).
    pub nodes: usize,
    /// Nodes it may still lose for `Empty`, `Drifted`, `Underutilized`.
    pub allowed: BTreeMap<String, usize>,
}

/// The disruption plan, in the stable JSON shape (`docs/plan.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPlan {
    /// Cluster.
    pub cluster: String,
    /// The instant decided at (RFC 3339, UTC).
    pub now: String,
    /// The command the loop would start: the first method, in loop order, that decides.
    pub decision: Option<PlannedCommand>,
    /// The methods evaluated, in loop order, up to the deciding one.
    pub methods: Vec<MethodResult>,
    /// NodeClaims the pending pods of the snapshot would be placed on (the hub's provisioning round
    /// nominates them): no candidate for the nomination window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nominated: Vec<String>,
    /// Budgets per pool.
    pub budgets: Vec<PoolBudget>,
    /// `(nodeClaim, message)`: settings ignored because unreadable.
    pub warnings: Vec<Blocked>,
    /// Notes for standard error (not part of the JSON interface).
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// Plans the disruption of one cluster's nodes at `now`.
pub fn plan_disruption(
    manifests: &Manifests,
    cluster: Option<&str>,
    settings: Settings,
    now: Timestamp,
    mut notes: Vec<String>,
) -> Result<DisruptionPlan, PlanError> {
    // The cluster's snapshot: its pools, and the fleet pools it departed from that still have
    // NodeClaims there, whose budgets keep applying to those nodes.
    let target = clusters::target(manifests, cluster)?;
    notes.extend(target.notes);
    let cluster = target.cluster;
    let mut view =
        disruption_scope::view(&target.snapshot, &manifests.volumes, &cluster, PendingRule::Unbound, settings, now)?;
    notes.extend(std::mem::take(&mut view.notes));
    // Replacements spend the organisations' room while the candidates run, as in the hub.
    let rooms = super::organization_rooms(manifests, &target.key, &target.snapshot, &cluster, &mut notes);
    crate::decisions::organization::limit_input(&mut view.model.input, &rooms);
    // The hub's provisioning round runs first: nodes it puts the pending pods on are nominated.
    let placed = scheduling::solve(&view.model.input);
    let mut nominations = nomination::Nominations::default();
    nominations.nominate(nomination::targets(&view.model.input, &placed), now);
    nomination::mark(&mut view.scope, &nominations, now);
    let nominated: Vec<String> = view.scope.nodes.iter().filter(|n| n.nominated).map(|n| n.claim.clone()).collect();
    let scope = view.scope;
    let settings = disruption::Settings::default();
    let pass = disruption_scope::decide(false, |method| {
        // A plan runs every method to its end (no time limit).
        disruption_scope::evaluate(method, &scope, &view.model, now, settings, &|| false)
    });
    let mut methods = Vec::new();
    let mut decision = None;
    let mut warnings: Vec<Blocked> = Vec::new();
    for (method, outcome) in pass.methods {
        for (claim, message) in outcome.warnings {
            let w = Blocked { node_claim: claim, reason: message };
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
        let command = outcome.command.as_ref().map(|c| render_command(c, &scope));
        methods.push(MethodResult {
            method: method.to_string(),
            decided: command.is_some(),
            blocked: outcome.blocked.into_iter().map(|(node_claim, reason)| Blocked { node_claim, reason }).collect(),
            budget_constrained: outcome.budget_constrained,
        });
        if command.is_some() {
            decision = command;
        }
    }

    let reasons = [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized];
    let per_reason: Vec<BTreeMap<String, usize>> =
        reasons.iter().map(|r| disruption::allowances(&scope, *r, now)).collect();
    let budgets = scope
        .pools
        .iter()
        .map(|p| PoolBudget {
            node_pool: p.name.clone(),
            nodes: disruption::candidates::pool_counts(&scope, &p.name).0,
            allowed: reasons
                .iter()
                .zip(&per_reason)
                .map(|(r, m)| (format!("{r:?}"), m.get(&p.name).copied().unwrap_or(0)))
                .collect(),
        })
        .collect();
    Ok(DisruptionPlan { cluster, now: now.to_string(), decision, methods, nominated, budgets, warnings, notes })
}

fn render_command(c: &disruption::Command, scope: &Scope) -> PlannedCommand {
    PlannedCommand {
        method: c.method.to_string(),
        reason: format!("{:?}", c.reason),
        candidates: c
            .candidates
            .iter()
            .map(|cand| {
                let n = &scope.nodes[cand.index];
                PlannedCandidate {
                    node_claim: cand.claim.clone(),
                    node: n.node.clone(),
                    node_pool: cand.nodepool.clone(),
                    flavor: n.instance_type.clone(),
                    price_per_hour: round4(n.price),
                    pods: n.reschedulable_pods().map(|p| p.name.clone()).collect(),
                }
            })
            .collect(),
        replacements: c
            .replacements
            .iter()
            .map(|r| Replacement {
                node_pool: r.nodepool.clone(),
                flavor: r.instance_types.first().map(|o| o.name.clone()).unwrap_or_default(),
                instance_types: r.instance_types.iter().map(|o| o.name.clone()).collect(),
                price_per_hour: round4(r.price),
            })
            .collect(),
        savings_per_hour: round4(c.savings_per_hour),
        summary: c.to_string(),
    }
}

/// The JSON document (pretty, trailing newline).
pub fn to_json(plan: &DisruptionPlan) -> String {
    let mut s = serde_json::to_string_pretty(plan).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// The table for humans.
pub fn to_table(plan: &DisruptionPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Cluster {} at {}:", plan.cluster, plan.now);
    match &plan.decision {
        None => {
            let _ = writeln!(out, "  nothing would be disrupted");
        }
        Some(c) => {
            let _ = writeln!(out, "  {} ({}): saves {:.4} EUR/h", c.method, c.reason, c.savings_per_hour);
            for cand in &c.candidates {
                let _ = writeln!(
                    out,
                    "  delete {} (NodePool {}, {}, {:.4} EUR/h); moves: {}",
                    cand.node_claim,
                    cand.node_pool,
                    cand.flavor.as_deref().unwrap_or("?"),
                    cand.price_per_hour,
                    if cand.pods.is_empty() { "none".to_string() } else { cand.pods.join(", ") }
                );
            }
            for r in &c.replacements {
                let _ = writeln!(
                    out,
                    "  launch first: NodePool {}, {} ({:.4} EUR/h; options {})",
                    r.node_pool,
                    r.flavor,
                    r.price_per_hour,
                    r.instance_types.join(",")
                );
            }
        }
    }
    let blocked: Vec<&Blocked> = plan.methods.iter().flat_map(|m| &m.blocked).collect();
    if !blocked.is_empty() {
        let _ = writeln!(out, "\nBlocked:");
        let mut seen = Vec::new();
        for b in blocked {
            if !seen.contains(&b) {
                let _ = writeln!(out, "  {}: {}", b.node_claim, b.reason);
                seen.push(b);
            }
        }
    }
    for m in plan.methods.iter().filter(|m| m.budget_constrained) {
        let _ = writeln!(out, "\n{}: held back by a disruption budget (see Budgets)", m.method);
    }
    if !plan.nominated.is_empty() {
        let _ = writeln!(
            out,
            "\nNominated for pending pods (no candidate for {} s): {}",
            nomination::WINDOW.as_secs(),
            plan.nominated.join(", ")
        );
    }
    let _ = writeln!(out, "\nBudgets (nodes each pool may still lose, per reason, before this decision):");
    for b in &plan.budgets {
        let allowed: Vec<String> = b.allowed.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = writeln!(out, "  {} (counted on {} node(s)): {}", b.node_pool, b.nodes, allowed.join(", "));
    }
    for w in &plan.warnings {
        let _ = writeln!(out, "warning: {}: {}", w.node_claim, w.reason);
    }
    out
}
