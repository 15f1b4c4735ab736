//! The disruption loop's view of one workload cluster, shared by the hub's disruption controller
//! and `plan --disruption`: API objects (NodePools, NodeClaims, Nodes, bound Pods, PDBs) reduced to
//! the `disruption` crate's facts and a scheduling model, and one pass of the loop's methods in
//! order (emptiness, drift, multi-node, single-node consolidation) until one decides.
//!
//! Owns that reduction and the method order. Must not: do I/O, read the clock (`now` is an
//! argument), or log; the controller and `plan` render and act on what it returns.

use crds::catalog::InstanceType;
use std::collections::{BTreeMap, HashMap};

use crds::nodepool::DisruptionReason;
use disruption::{Drift, Method, NodeFacts, Outcome, Owner, PdbFacts, PodFacts, PoolFacts, Scope, ScopeModel};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use scheduling::CompactPod;
use scheduling::convert::{
    ConvertError, PendingRule, Snapshot, Volumes, build_input_with_volumes, forbids_every_eviction, pod_to_place,
    selector_from,
};
use scheduling::model::Settings;

use crds::labels::{DISRUPTED_TAINT, DO_NOT_DISRUPT, NODEPOOL as NODEPOOL_LABEL};

use crate::decisions::{disruption_conditions::NODEPOOL_DRIFTED, disruption_queue, rollout};

/// Annotation of a NodePool opting in to the protection of single replicas (§9 D7).
pub const PROTECT_SINGLE_REPLICA: &str = "karpenter.clever-cloud.com/protect-single-replica";

/// A cluster as the disruption loop sees it.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The facts the methods decide on; one node per NodeClaim of the cluster, sorted by claim name.
    pub scope: Scope,
    /// The scheduling model the simulations run on.
    pub model: ScopeModel,
    /// Things ignored or assumed, for the user.
    pub notes: Vec<String>,
}

impl View {
    /// The facts alone, the model (the cluster's pods, converted: the large part) dropped now.
    pub fn into_scope(self) -> Scope {
        self.scope
    }
}

fn document_error(object: String, field: &str, message: String) -> ConvertError {
    ConvertError { object, field: field.to_string(), message }
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

/// The budget reason a `DisruptionReason` condition's reason names.
pub fn reason_of(name: &str) -> Option<DisruptionReason> {
    match name {
        "Empty" => Some(DisruptionReason::Empty),
        "Drifted" => Some(DisruptionReason::Drifted),
        "Underutilized" => Some(DisruptionReason::Underutilized),
        _ => None,
    }
}

/// Reduces one cluster's objects to the disruption facts at `now`. `rule` says which unbound pods
/// are pending (the hub: kube-scheduler's verdict; `plan`: every unbound pod).
pub fn view(
    snapshot: &Snapshot,
    volumes: &Volumes,
    cluster: &str,
    rule: PendingRule,
    settings: Settings,
    now: Timestamp,
) -> Result<View, ConvertError> {
    let converted = build_input_with_volumes(snapshot, volumes, cluster, rule, settings)?;
    let mut notes = converted.notes;
    let input = converted.input;
    let mut pools = Vec::new();
    // The pools serving the cluster, and those it departed from (fleet.md §2: the snapshot carries
    // them only while they have nodes there), whose budgets keep applying to those nodes: their
    // flavors need not resolve, as no pod may land on them.
    let named = |p: &&crds::NodePool| p.spec.cluster_name.as_deref().is_none_or(|c| c == cluster);
    // A departed pool's flavors, to price its nodes (consolidation compares prices).
    let mut departed_types = Vec::new();
    for p in snapshot.node_pools.iter().filter(named).filter(|p| !snapshot.serves(p, cluster)) {
        let name = p.metadata.name.clone().unwrap_or_default();
        departed_types.push((name, scheduling::convert::pool_instance_types(snapshot, p)));
    }
    for p in snapshot.node_pools.iter().filter(named) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let types_resolve = !snapshot.serves(p, cluster)
            || input.pools.iter().any(|ip| ip.name == name && !ip.instance_types.is_empty());
        let mut facts = PoolFacts::from_spec(&name, &p.spec.disruption, types_resolve);
        facts.protect_single_replica =
            p.metadata.annotations.as_ref().and_then(|a| a.get(PROTECT_SINGLE_REPLICA)).is_some_and(|v| v == "true");
        facts.static_pool = p.spec.replicas.is_some();
        pools.push(facts);
    }

    let mut nodes = Vec::new();
    let mut bound: Vec<Vec<&CompactPod>> = Vec::new();
    // One pass over the pods: by node, and the ready replicas per owner (a pod per pod would be
    // quadratic at a thousand pods).
    let mut by_node: HashMap<&str, Vec<&CompactPod>> = HashMap::new();
    let mut ready_replicas: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for p in &snapshot.pods {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            by_node.entry(n).or_default().push(p.as_ref());
        }
        if pod_ready(p) {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            for r in p.metadata.owner_references.iter().flatten() {
                *ready_replicas.entry((ns, r.kind.as_str(), r.name.as_str())).or_default() += 1;
            }
        }
    }
    // Claims in name order: indices stay put between passes unless claims come or go.
    let mut claims: Vec<&crds::NodeClaim> =
        snapshot.node_claims.iter().filter(|c| c.spec.cluster_name == cluster).collect();
    claims.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for claim in claims {
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let conditions: &[Condition] = claim.status.as_ref().map_or(&[], |s| s.conditions.as_slice());
        let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone());
        let node: Option<&Node> = node_name
            .as_deref()
            .and_then(|n| snapshot.nodes.iter().find(|k| k.metadata.name.as_deref() == Some(n)))
            .map(AsRef::as_ref);
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
        // A fleet pool's rollout holds its template drift (the revision is the template's hash)
        // back in the clusters whose turn it is not (fleet.md §3). Other drift (requirements, node
        // class, flavor, a cluster leaving the selection) changes no revision: not held.
        if f.drifted.as_ref().is_some_and(|d| d.reason == NODEPOOL_DRIFTED)
            && let Some(pool) = f
                .nodepool
                .as_deref()
                .and_then(|n| snapshot.node_pools.iter().find(|p| p.metadata.name.as_deref() == Some(n)))
            && let Err(why) = rollout::may_drift(pool, cluster)
        {
            f.drifted = None;
            let name = pool.metadata.name.as_deref().unwrap_or_default();
            notes.push(format!("NodePool {name}: its drifted nodes wait for the rollout: {why}"));
        }
        // A claim carrying a started command is queued, and charged to that command's reason even
        // before the lifecycle mirrors it in the DisruptionReason condition.
        let recorded = claim.metadata.annotations.as_ref().and_then(disruption_queue::Recorded::on);
        f.queued = recorded.is_some();
        f.disruption_reason = recorded.map(|r| r.reason).or_else(|| {
            condition(conditions, "DisruptionReason").filter(|c| c.status == "True").and_then(|c| reason_of(&c.reason))
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
        f.price = price_of(&input, &departed_types, &f);
        let mut on_node = Vec::new();
        if let Some(n) = &f.node {
            for p in by_node.get(n.as_str()).into_iter().flatten() {
                f.pods.push(pod_facts(p, snapshot, &ready_replicas, &mut notes)?);
                on_node.push(*p);
            }
        }
        nodes.push(f);
        bound.push(on_node);
    }
    let mut scope = Scope { pools, nodes };
    mark_buffer_room(&mut scope, &input);
    let mut seen = std::collections::BTreeSet::new();
    notes.retain(|n| seen.insert(n.clone()));

    let mut model = ScopeModel { input, ..ScopeModel::default() };
    // Pods the round already places: those of Nodes being deleted (the conversion's rule) are
    // pending pods there, and are not placed twice.
    let pending: std::collections::BTreeSet<String> = model.input.pods.iter().map(|p| p.key()).collect();
    for (i, f) in scope.nodes.iter().enumerate() {
        let index = f.node.as_ref().and_then(|n| model.input.nodes.iter().position(|e| &e.name == n));
        let mut movable = Vec::new();
        // A started command's candidate leaves as a deleting one does (upstream marks it for
        // deletion): no destination for another command, its pods need a place.
        let leaving = f.marked_for_deletion || f.queued;
        for (pod, facts) in bound[i].iter().zip(&f.pods) {
            if !facts.reschedulable() {
                continue;
            }
            // Its volumes go with it: a destination must be in their zone and below their
            // drivers' attach limits, as for a pending pod.
            let moved = pod_to_place(pod, &format!("Pod {}", facts.name), volumes)?;
            if !leaving {
                movable.push(moved);
            } else if facts.currently_reschedulable(now) && !pending.contains(&moved.key()) {
                // A leaving node's pod needs one place, unless it stays for good (upstream).
                model.leaving.push(moved);
            }
        }
        if leaving && let Some(j) = index {
            // Its claim is being deleted (or in a command) but its Node not yet: no destination,
            // and its pods leave.
            model.deleting.push(j);
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

    Ok(View { scope, model, notes })
}

/// Marks the nodes where the provisioner would place CapacityBuffers' pods now (after the real
/// pending pods, as its round does): emptiness keeps them, their free room being the buffer. One
/// extra solve, only for clusters with buffer pods.
fn mark_buffer_room(scope: &mut Scope, input: &scheduling::Input) {
    if !input.pods.iter().any(|p| p.buffer.is_some()) {
        return;
    }
    let baseline = scheduling::solve(input);
    for a in &baseline.existing {
        if !a.pods.iter().any(|&p| input.pods[p].buffer.is_some()) {
            continue;
        }
        let Some(name) = input.nodes.get(a.node).map(|n| n.name.as_str()) else { continue };
        for f in scope.nodes.iter_mut().filter(|f| f.node.as_deref() == Some(name)) {
            f.buffer_room = true;
        }
    }
}

/// What one pass of the loop decided: each method tried, in order, with its outcome; the last one
/// tried holds the command, if any.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    pub methods: Vec<(Method, Outcome)>,
}

impl Pass {
    /// The command of the pass (the first method, in loop order, that decided).
    pub fn command(&self) -> Option<&disruption::Command> {
        self.methods.last().and_then(|(_, o)| o.command.as_ref())
    }
}

/// The methods of the loop, in order (§4.2).
const METHODS: [Method; 4] =
    [Method::Emptiness, Method::Drift, Method::MultiNodeConsolidation, Method::SingleNodeConsolidation];

/// One method's evaluation; consolidation stops when `out_of_time` says its time is up (the
/// caller's clock; [`disruption::MULTI_NODE_TIME_LIMIT`], [`disruption::SINGLE_NODE_TIME_LIMIT`]).
pub fn evaluate(
    method: Method,
    scope: &Scope,
    model: &ScopeModel,
    now: Timestamp,
    settings: disruption::Settings,
    out_of_time: &dyn Fn() -> bool,
) -> Outcome {
    match method {
        Method::Emptiness => disruption::emptiness(scope, now),
        Method::Drift => disruption::drift(scope, now, &mut model.for_drift()),
        Method::MultiNodeConsolidation => {
            disruption::multi_node(scope, now, &mut model.for_consolidation_until(out_of_time), settings)
        }
        Method::SingleNodeConsolidation => {
            disruption::single_node(scope, now, &mut model.for_consolidation_until(out_of_time), settings)
        }
    }
}

/// The time limit of `method` (upstream's consolidation timeouts), if it has one.
pub fn time_limit(method: Method) -> Option<std::time::Duration> {
    match method {
        Method::MultiNodeConsolidation => Some(disruption::MULTI_NODE_TIME_LIMIT),
        Method::SingleNodeConsolidation => Some(disruption::SINGLE_NODE_TIME_LIMIT),
        Method::Emptiness | Method::Drift => None,
    }
}

/// One pass of the loop's methods in order (§4.2): emptiness, drift, multi-node, single-node
/// consolidation; the first that decides ends the pass. `skip_consolidation` leaves out the methods
/// that found nothing to do since the scope last changed (§4.12). `evaluate` runs one method
/// ([`evaluate`], which a caller may wrap, e.g. to time it).
pub fn decide(skip_consolidation: bool, mut evaluate: impl FnMut(Method) -> Outcome) -> Pass {
    let mut pass = Pass::default();
    for method in METHODS {
        if skip_consolidation && method != Method::Drift {
            continue;
        }
        let outcome = evaluate(method);
        let decided = outcome.command.is_some();
        pass.methods.push((method, outcome));
        if decided {
            break;
        }
    }
    pass
}

/// The hourly price of a node's offering in its pool's instance types (0 when unknown): a pool of
/// the round, or one the cluster departed from (`departed`, by pool name).
fn price_of(input: &scheduling::Input, departed: &[(String, Vec<InstanceType>)], f: &NodeFacts) -> f64 {
    let Some(t) = &f.instance_type else { return 0.0 };
    let of_pool = |name: &str| f.nodepool.as_deref().is_none_or(|n| n == name);
    input
        .pools
        .iter()
        .filter(|p| of_pool(&p.name))
        .flat_map(|p| p.instance_types.iter())
        .chain(departed.iter().filter(|(name, _)| of_pool(name)).flat_map(|(_, types)| types.iter()))
        .filter(|it| &it.name == t)
        .flat_map(|it| it.offerings.iter())
        .find(|o| {
            f.zone.as_deref().is_none_or(|z| z == o.zone)
                && f.capacity_type.as_deref().is_none_or(|c| c == o.capacity_type)
        })
        .map_or(0.0, |o| o.price_hourly)
}

fn pod_facts(
    p: &CompactPod,
    snapshot: &Snapshot,
    ready_replicas: &HashMap<(&str, &str, &str), usize>,
    notes: &mut Vec<String>,
) -> Result<PodFacts, ConvertError> {
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
            .map_err(|e| document_error(format!("PodDisruptionBudget {pdb_name}"), "spec.selector", e.to_string()))?;
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
                fully_blocking: pdb.spec.as_ref().is_some_and(forbids_every_eviction),
            });
        }
    }
    Ok(PodFacts {
        name,
        owner: Owner::of(p.metadata.owner_references.as_deref().unwrap_or_default()),
        terminal: matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
        terminating: p.metadata.deletion_timestamp.is_some(),
        ready: pod_ready(p),
        tolerates_disrupted: p
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| ts.iter().any(tolerates_disrupted)),
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
                ready_replicas.get(&(ns.as_str(), o.kind.as_str(), o.name.as_str())).copied() == Some(1)
            }),
    })
}

fn pod_ready(p: &CompactPod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `t` tolerates `karpenter.sh/disrupted:NoSchedule` as Kubernetes matches a toleration
/// (upstream's `ToleratesDisruptedNoScheduleTaint`): the taint has no value, so `Equal` tolerates
/// it only with an empty value.
fn tolerates_disrupted(t: &k8s_openapi::api::core::v1::Toleration) -> bool {
    let key = t.key.as_deref().unwrap_or_default();
    let exists = t.operator.as_deref() == Some("Exists");
    let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
    let value_ok = exists || t.value.as_deref().unwrap_or_default().is_empty();
    effect_ok && value_ok && (key == DISRUPTED_TAINT || (key.is_empty() && exists))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_disrupted_taint_is_tolerated_as_kubernetes_matches_tolerations() {
        let t = |v: serde_json::Value| tolerates_disrupted(&serde_json::from_value(v).unwrap());
        assert!(t(serde_json::json!({"key": DISRUPTED_TAINT, "operator": "Exists"})));
        assert!(t(serde_json::json!({"key": DISRUPTED_TAINT, "effect": "NoSchedule"})), "Equal to no value");
        assert!(t(serde_json::json!({"operator": "Exists"})), "tolerates everything");
        assert!(
            !t(serde_json::json!({"key": DISRUPTED_TAINT, "operator": "Equal", "value": "true"})),
            "a value the taint lacks"
        );
        assert!(!t(serde_json::json!({"key": DISRUPTED_TAINT, "operator": "Exists", "effect": "NoExecute"})));
        assert!(!t(serde_json::json!({"key": "other", "operator": "Exists"})));
    }
}
