//! `plan --disruption`: the offline view of the disruption loop. Reduces the manifests' NodePools,
//! NodeClaims, Nodes, bound Pods and PDBs to the `disruption` crate's facts and runs its methods in
//! the loop's order (emptiness, drift, multi-node, single-node consolidation) until one decides.
//!
//! Owns the reduction of API objects to facts and the rendering; the decisions are the crate's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crds::catalog::round4;
use crds::nodepool::DisruptionReason;
use disruption::{Drift, Method, NodeFacts, Owner, PdbFacts, PodFacts, PoolFacts, Scope, ScopeModel};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use scheduling::convert::{ConvertError, PendingRule, build_input_with_volumes, pod_from, selector_from};
use scheduling::model::Settings;
use serde::Serialize;

use super::{Manifests, PlanError, resolve_cluster};

const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";

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
    /// Budgets per pool.
    pub budgets: Vec<PoolBudget>,
    /// `(nodeClaim, message)`: settings ignored because unreadable.
    pub warnings: Vec<Blocked>,
    /// Notes for standard error (not part of the JSON interface).
    #[serde(skip)]
    pub notes: Vec<String>,
}

fn document_error(object: String, field: &str, message: String) -> PlanError {
    PlanError::Convert(ConvertError { object, field: field.to_string(), message })
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

fn to_ts(t: &k8s_openapi::jiff::Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Plans the disruption of one cluster's nodes at `now`.
pub fn plan_disruption(
    manifests: &Manifests,
    cluster: Option<&str>,
    settings: Settings,
    now: Timestamp,
    mut notes: Vec<String>,
) -> Result<DisruptionPlan, PlanError> {
    let snapshot = &manifests.snapshot;
    let cluster = resolve_cluster(snapshot, cluster)?;
    let converted = build_input_with_volumes(snapshot, &manifests.volumes, &cluster, PendingRule::Unbound, settings)?;
    notes.extend(converted.notes);
    let input = converted.input;

    let mut pools = Vec::new();
    for p in snapshot.node_pools.iter().filter(|p| p.spec.cluster_name == cluster) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let types_resolve = input.pools.iter().any(|ip| ip.name == name && !ip.instance_types.is_empty());
        let mut facts = PoolFacts::from_spec(&name, &p.spec.disruption, types_resolve);
        facts.protect_single_replica = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("karpenter.clever-cloud.com/protect-single-replica"))
            .is_some_and(|v| v == "true");
        pools.push(facts);
    }

    let mut nodes = Vec::new();
    let mut bound: Vec<Vec<&Pod>> = Vec::new();
    for claim in snapshot.node_claims.iter().filter(|c| c.spec.cluster_name == cluster) {
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let conditions: &[Condition] = claim.status.as_ref().map_or(&[], |s| s.conditions.as_slice());
        let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone());
        let node: Option<&Node> =
            node_name.as_deref().and_then(|n| snapshot.nodes.iter().find(|k| k.metadata.name.as_deref() == Some(n)));
        let created = claim.metadata.creation_timestamp.as_ref().map_or(now, |t| to_ts(&t.0));
        let label = |key: &str| {
            node.and_then(|n| n.metadata.labels.as_ref()?.get(key).cloned())
                .or_else(|| claim.metadata.labels.as_ref()?.get(key).cloned())
        };
        let pool = label(NODEPOOL_LABEL);
        let mut f = NodeFacts::new(&claim_name, pool.as_deref().unwrap_or_default(), created);
        f.nodepool = pool;
        f.node = node.and_then(|n| n.metadata.name.clone());
        f.initialized = label("karpenter.sh/initialized").as_deref() == Some("true");
        f.node_ready = node
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        f.instance_terminating = is_true(conditions, "InstanceTerminating");
        f.marked_for_deletion = f.instance_terminating
            || claim.metadata.deletion_timestamp.is_some()
            || node.is_some_and(|n| n.metadata.deletion_timestamp.is_some());
        let annotated =
            |a: Option<&BTreeMap<String, String>>| a.and_then(|a| a.get(DO_NOT_DISRUPT)).is_some_and(|v| v == "true");
        f.do_not_disrupt = annotated(claim.metadata.annotations.as_ref())
            || annotated(node.and_then(|n| n.metadata.annotations.as_ref()));
        f.consolidatable = is_true(conditions, "Consolidatable");
        if node.is_some() && condition(conditions, "Consolidatable").is_none() {
            // A snapshot written by hand rarely has it; the hub sets it once consolidateAfter has passed.
            notes.push(format!(
                "NodeClaim {claim_name} has no Consolidatable condition: taken as not consolidatable (set \
                 status.conditions Consolidatable=True to plan its consolidation)"
            ));
        }
        f.drifted = condition(conditions, "Drifted")
            .filter(|c| c.status == "True")
            .map(|c| Drift { reason: c.reason.clone(), since: to_ts(&c.last_transition_time.0) });
        f.disruption_reason = condition(conditions, "DisruptionReason").filter(|c| c.status == "True").and_then(|c| {
            match c.reason.as_str() {
                "Empty" => Some(DisruptionReason::Empty),
                "Drifted" => Some(DisruptionReason::Drifted),
                "Underutilized" => Some(DisruptionReason::Underutilized),
                _ => None,
            }
        });
        let duration = |field: &str, value: &str| {
            crds::admission::schedule::parse_duration(value, true).map_err(|e| {
                document_error(format!("NodeClaim {claim_name}"), field, format!("{value:?} is not a duration: {e}"))
            })
        };
        if let Some(tgp) = &claim.spec.termination_grace_period {
            f.termination_grace_period = duration("spec.terminationGracePeriod", tgp)?;
        }
        f.expire_after = duration("spec.expireAfter", &claim.spec.expire_after)?;
        f.instance_type = label("node.kubernetes.io/instance-type");
        f.zone = label("topology.kubernetes.io/zone");
        f.capacity_type = label("karpenter.sh/capacity-type");
        f.price = price_of(&input, &f);
        let mut on_node = Vec::new();
        if let Some(n) = &f.node {
            for p in snapshot.pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n)) {
                f.pods.push(pod_facts(p, snapshot, &mut notes)?);
                on_node.push(p);
            }
        }
        nodes.push(f);
        bound.push(on_node);
    }
    let scope = Scope { pools, nodes };
    let mut seen = std::collections::BTreeSet::new();
    notes.retain(|n| seen.insert(n.clone()));

    let mut model = ScopeModel { input, ..ScopeModel::default() };
    for (i, f) in scope.nodes.iter().enumerate() {
        let index = f.node.as_ref().and_then(|n| model.input.nodes.iter().position(|e| &e.name == n));
        let mut movable = Vec::new();
        for (pod, facts) in bound[i].iter().zip(&f.pods) {
            if facts.reschedulable() {
                movable.push(pod_from(pod, &format!("Pod {}", facts.name))?);
            }
        }
        if f.marked_for_deletion {
            model.leaving.append(&mut movable);
        }
        if let Some(j) = index {
            let pool = f.nodepool.as_deref().and_then(|p| scope.pool(p));
            if pool.is_some_and(|p| p.consolidate_after.is_some()) && !f.consolidatable {
                model.no_destination.push(j);
            }
        }
        model.node_index.push(index);
        model.movable.push(movable);
    }

    let consolidation = disruption::Settings::default();
    let mut methods = Vec::new();
    let mut decision = None;
    let mut warnings: Vec<Blocked> = Vec::new();
    // The loop's order (§4.13): the first method that decides ends the pass.
    for method in [Method::Emptiness, Method::Drift, Method::MultiNodeConsolidation, Method::SingleNodeConsolidation] {
        let outcome = match method {
            Method::Emptiness => disruption::emptiness(&scope, now),
            Method::Drift => disruption::drift(&scope, now, &mut model.for_drift()),
            Method::MultiNodeConsolidation => {
                disruption::multi_node(&scope, now, &mut model.for_consolidation(), consolidation)
            }
            Method::SingleNodeConsolidation => {
                disruption::single_node(&scope, now, &mut model.for_consolidation(), consolidation)
            }
        };
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
            break;
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
    Ok(DisruptionPlan { cluster, now: now.to_string(), decision, methods, budgets, warnings, notes })
}

/// The hourly price of a node's offering in its pool's instance types (0 when unknown).
fn price_of(input: &scheduling::Input, f: &NodeFacts) -> f64 {
    let Some(t) = &f.instance_type else { return 0.0 };
    input
        .pools
        .iter()
        .filter(|p| f.nodepool.as_deref().is_none_or(|n| n == p.name))
        .flat_map(|p| p.instance_types.iter())
        .filter(|it| &it.name == t)
        .flat_map(|it| it.offerings.iter())
        .find(|o| {
            f.zone.as_deref().is_none_or(|z| z == o.zone)
                && f.capacity_type.as_deref().is_none_or(|c| c == o.capacity_type)
        })
        .map_or(0.0, |o| o.price_hourly)
}

fn pod_facts(
    p: &Pod,
    snapshot: &scheduling::convert::Snapshot,
    notes: &mut Vec<String>,
) -> Result<PodFacts, PlanError> {
    let ns = p.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or_default());
    let owner = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .or_else(|| p.metadata.owner_references.iter().flatten().next());
    let status = p.status.as_ref();
    let annotations = p.metadata.annotations.clone().unwrap_or_default();
    let deletion_cost = match annotations.get("controller.kubernetes.io/pod-deletion-cost") {
        Some(v) => v.parse::<i32>().map_err(|_| {
            document_error(
                format!("Pod {name}"),
                "metadata.annotations[controller.kubernetes.io/pod-deletion-cost]",
                format!("{v:?} is not a 32-bit integer"),
            )
        })?,
        None => 0,
    };
    let labels = p.metadata.labels.clone().unwrap_or_default();
    let mut pdbs = Vec::new();
    for pdb in snapshot.pdbs.iter().filter(|d| d.metadata.namespace.as_deref().unwrap_or("default") == ns) {
        let pdb_name = format!("{ns}/{}", pdb.metadata.name.as_deref().unwrap_or_default());
        let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else { continue };
        let sel = selector_from(sel)
            .map_err(|e| document_error(format!("PodDisruptionBudget {pdb_name}"), "spec.selector", e))?;
        if scheduling::affinity::selector_matches(&sel, &labels) {
            if pdb.status.is_none() {
                notes.push(format!(
                    "PodDisruptionBudget {pdb_name} has no status: taken as allowing no disruption, as before the \
                     disruption controller has counted its pods"
                ));
            }
            pdbs.push(PdbFacts {
                name: pdb_name,
                // No status: the disruption controller has not counted yet, so nothing may go.
                disruptions_allowed: pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed),
                always_allow_unhealthy: pdb.spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                    == Some("AlwaysAllow"),
            });
        }
    }
    Ok(PodFacts {
        name,
        owner: Owner::of(p.metadata.owner_references.as_deref().unwrap_or_default()),
        terminal: matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
        terminating: p.metadata.deletion_timestamp.is_some(),
        ready: pod_ready(p),
        tolerates_disrupted: p.spec.as_ref().and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| {
            ts.iter().any(|t| {
                let key = t.key.as_deref().unwrap_or_default();
                let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
                effect_ok && (key == DISRUPTED_TAINT || (key.is_empty() && t.operator.as_deref() == Some("Exists")))
            })
        }),
        started: status
            .and_then(|s| s.start_time.as_ref())
            .or(p.metadata.creation_timestamp.as_ref())
            .map(|t| to_ts(&t.0)),
        do_not_disrupt: annotations.get(DO_NOT_DISRUPT).cloned(),
        pdbs,
        deletion_cost,
        priority: p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        only_ready_replica: pod_ready(p)
            && owner.is_some_and(|o| {
                let same = |q: &&Pod| {
                    q.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && q.metadata.owner_references.iter().flatten().any(|r| r.kind == o.kind && r.name == o.name)
                };
                snapshot.pods.iter().filter(same).filter(|q| pod_ready(q)).count() == 1
            }),
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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
