//! The NodePool status controller (hub.md §4, karpenter-semantics §1.4): `ClusterReachable` with the
//! registry's reason for the pool's cluster, `NodeClassReady`, `ValidationSucceeded`, the
//! informational `NodeRegistrationHealthy`, the root `Ready`, the pool's usage (`resources`,
//! `nodes`) summed over its claims, and its cost per hour (a metric only).
//!
//! Owns: NodePool status, written only when it differs from what the pool shows. Reads claims,
//! classes and catalogues from the hub's management cache, never from the API (it runs on every
//! claim event: performance.md B4). Must not: change specs or act on claims.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller,
        controller::{self, Action},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;

use crate::{
    decisions::conditions::{self, FALSE, TRUE, UNKNOWN},
    decisions::pool_status::{Kind, Seen, caught_up, price_per_hour},
    decisions::{fleet, organization, rollout},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::facts,
    infra::hub::Hub,
    infra::metrics::{Metrics, PoolLabels, PoolPhaseLabels, PoolResourceLabels},
    infra::organizations,
    infra::registry::{ClusterKey, Phase},
};
use crds::{
    CleverNodeClass, NodeClaim, NodePool,
    admission::{Lookup, NodePoolReferences, validate_node_pool},
    labels,
    nodepool::{PoolClusterStatus, RolloutPhase},
    quantity::Resources,
};

pub const CLUSTER_REACHABLE: &str = "ClusterReachable";
pub const NODECLASS_READY: &str = "NodeClassReady";
pub const READY: &str = "Ready";
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
pub const NODE_REGISTRATION_HEALTHY: &str = "NodeRegistrationHealthy";
/// Fleet pools: every selected cluster's instance of the pool is Ready (else which are not).
pub const CLUSTERS_READY: &str = "ClustersReady";
/// Fleet pools, informational: nodes of the pool remain in clusters it no longer selects.
pub const NODES_IN_DEPARTED_CLUSTERS: &str = "NodesInDepartedClusters";
/// Fleet pools with a rollout, informational: a cluster failed, no other starts.
pub const ROLLOUT_HALTED: &str = "RolloutHalted";
/// How often a progressing rollout is looked at when nothing wakes it (a replacement's deadline).
const ROLLOUT_RECHECK: Duration = Duration::from_secs(30);
/// Present only while garbage collection's brake holds back the sweeps of the pool's cluster
/// (hub.md §5): informational, it does not make the pool not Ready (launches go on).
pub const GARBAGE_COLLECTION_HALTED: &str = "GarbageCollectionHalted";

/// Present only while pods of the pool wait for room in an organisation's quota or cost ceiling
/// (fleet.md §4): informational, it does not make the pool not Ready.
pub const WAITING_FOR_ORGANIZATION: &str = "WaitingForOrganization";

/// What stops a reconcile (retried after 10 s): only a request, which says its step.
pub type Error = ApiError;

/// Claim events close together (a launch writes the claim several times within a second) wake the
/// pool once: its status is computed from their end state.
const DEBOUNCE: Duration = Duration::from_millis(500);
/// How soon a pool whose cache lags is looked at again.
const CATCH_UP_RETRY: Duration = Duration::from_millis(100);

/// The events each pool was woken by and has not computed its status after yet. The controller's
/// own watches wake the pool, but the status is read from the hub's cache, a separate watch that
/// may not have seen the same event yet: the reconcile waits (briefly) until it has, so the status
/// never settles on a stale count.
#[derive(Debug, Default)]
pub struct Awaited(Mutex<HashMap<ObjectRef<NodePool>, Vec<Seen>>>);

impl Awaited {
    fn expect<K: Resource>(&self, pool: &ObjectRef<NodePool>, kind: Kind, obj: &K) {
        let meta = obj.meta();
        let seen = Seen {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            deleting: meta.deletion_timestamp.is_some(),
            at: Instant::now(),
        };
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let list = all.entry(pool.clone()).or_default();
        // Only the latest event of an object matters.
        list.retain(|s| !(s.kind == seen.kind && s.namespace == seen.namespace && s.name == seen.name));
        list.push(seen);
    }

    /// The events `pool` waits for.
    fn of(&self, pool: &ObjectRef<NodePool>) -> Vec<Seen> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(pool).cloned().unwrap_or_default()
    }

    /// Forget a deleted pool.
    fn forget(&self, pool: &ObjectRef<NodePool>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(pool);
    }

    /// Forget the events the pool has now been computed after (not ones that came meanwhile).
    fn done(&self, pool: &ObjectRef<NodePool>, handled: &[Seen]) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = all.get_mut(pool) {
            list.retain(|s| !handled.contains(s));
            if list.is_empty() {
                all.remove(pool);
            }
        }
    }
}

/// The controller's context: the hub and the events each pool waits for the cache to show.
struct Ctx {
    hub: Arc<Hub>,
    awaited: Awaited,
}

pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let pools: Api<NodePool> = hub.scoped();
    let claims: Api<NodeClaim> = hub.scoped();
    // A cluster's state, or the garbage-collection brake's verdict on it, shows on its pools.
    let cluster_changes = futures::stream::select(hub.registry.change_stream(), hub.gc_halt_changes());
    // An organisation's line (who waits, and for which pools) shows on the pools waiting.
    let scope = futures::stream::unfold(hub.cache.scope_changes(), |mut rx| async move {
        rx.changed().await.ok().map(|()| ((), rx))
    });
    let cluster_changes = futures::stream::select(cluster_changes, scope);
    let controller = Controller::new(pools, watcher::Config::default())
        .with_config(controller::Config::default().debounce(DEBOUNCE));
    let pools_store = controller.store();
    let ctx = Arc::new(Ctx { hub: hub.clone(), awaited: Awaited::default() });
    let (on_claim, on_class) = (ctx.clone(), ctx.clone());
    controller
        // A claim event wakes its own pool only.
        .watches(claims, watcher::Config::default(), move |claim| {
            let ns = claim.namespace()?;
            let pool = ObjectRef::new(claim.labels().get(labels::NODEPOOL)?).within(&ns);
            on_claim.awaited.expect(&pool, Kind::Claim, &claim);
            Some(pool)
        })
        // A node class turning Ready or not changes NodeClassReady of the pools using it.
        .watches(hub.scoped::<CleverNodeClass>(), watcher::Config::default(), move |class| {
            let ns = class.namespace();
            let name = class.name_any();
            let using: Vec<ObjectRef<NodePool>> = pools_store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.template.spec.node_class_ref.name == name)
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect();
            for pool in &using {
                on_class.awaited.expect(pool, Kind::Class, &class);
            }
            using
        })
        .reconcile_all_on(cluster_changes)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| {
            // A deleted pool is not reconciled; its claims going (owner cascade) still ask for it,
            // which is when its gauges go, so a dashboard does not keep its last cost and usage.
            if let Err(kube::runtime::controller::Error::ObjectNotFound(pool)) = r
                && let Some(ns) = &pool.namespace
            {
                forget_pool(&hub.metrics, ns, &pool.name);
                ctx.awaited.forget(&ObjectRef::new(&pool.name).within(ns));
            }
            async {}
        })
        .await;
}

/// A failed reconcile: counted, logged with its step and category, and retried after 10 s.
fn error_policy(pool: Arc<NodePool>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let ns = pool.namespace().unwrap_or_default();
    let key = pool.spec.cluster_name.as_ref().map(|c| ClusterKey::new(ns.clone(), c.clone()));
    errors::count(&ctx.hub, Reconciler::NodePool, key.as_ref(), e);
    tracing::warn!(namespace = %ns, nodepool = %pool.name_any(), step = e.step().label(), category = e.category().as_str(), error = %e, "nodepool reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// Drop the gauges of the NodePool `ns/name`, whatever its cluster.
pub fn forget_pool(m: &Metrics, ns: &str, name: &str) {
    let prefix = format!("{ns}/");
    let of_pool = |cluster: &str, nodepool: &str| cluster.starts_with(&prefix) && nodepool == name;
    m.nodepool_usage.forget_where(|l| of_pool(&l.cluster, &l.nodepool));
    m.nodepool_limit.forget_where(|l| of_pool(&l.cluster, &l.nodepool));
    m.nodepool_price.forget_where(|l| of_pool(&l.cluster, &l.nodepool));
    m.rollout_phase.forget_where(|l| of_pool(&l.cluster, &l.nodepool));
}

async fn reconcile(pool: Arc<NodePool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let hub = &ctx.hub;
    let ns = pool.namespace().unwrap_or_default();
    // Before the cache has listed once, a missing claim or class means nothing: no status yet.
    if !hub.cache.is_ready() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let me = ObjectRef::from_obj(pool.as_ref());
    let seen = ctx.awaited.of(&me);
    let cached = |kind: Kind, ns: &str, name: &str| match kind {
        Kind::Claim => {
            hub.cache.claims.get(&ObjectRef::new(name).within(ns)).map(|c| c.metadata.resource_version.clone())
        }
        Kind::Class => {
            hub.cache.classes.get(&ObjectRef::new(name).within(ns)).map(|c| c.metadata.resource_version.clone())
        }
    };
    if !caught_up(&seen, cached, Instant::now()) {
        return Ok(Action::requeue(CATCH_UP_RETRY));
    }
    match &pool.spec.cluster_name {
        Some(cluster) => {
            let key = ClusterKey::new(ns.clone(), cluster.clone());
            // Sharded mode (hub.md §6): the replica owning the pool's cluster writes its status; the
            // others leave it (a change of ownership re-reconciles every pool).
            if !hub.registry.writes_for(&key) {
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            named(hub, &pool, &key).await?;
        }
        None => {
            if let Some(recheck) = fleet(hub, &pool).await? {
                ctx.awaited.done(&me, &seen);
                // A rollout's soak ends, or a replacement's deadline passes, at a time.
                return Ok(Action::requeue(recheck));
            }
        }
    }
    ctx.awaited.done(&me, &seen);
    // Every input is watched (pool, its claims, its class, the registry and its labels): no
    // periodic re-check, so a steady fleet costs no LIST (performance.md B4).
    Ok(Action::await_change())
}

/// What the pool-wide conditions found: the pool's node class, and whether the pool can launch as
/// far as the class and validation go.
struct PoolWide {
    class: Option<Arc<CleverNodeClass>>,
    class_ready: bool,
    valid: bool,
}

/// `NodeClassReady`, `ValidationSucceeded` and `NodeRegistrationHealthy`, the same for every cluster
/// the pool serves.
fn pool_wide(
    hub: &Hub,
    pool: &NodePool,
    conds: &mut Vec<crds::common::Condition>,
    now: k8s_openapi::jiff::Timestamp,
) -> PoolWide {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let generation = pool.metadata.generation;
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class = hub.cache.classes.get(&ObjectRef::<CleverNodeClass>::new(class_name).within(&ns));
    let (class_status, class_reason, class_message) = match &class {
        None => (FALSE, "NodeClassNotFound", format!("CleverNodeClass {ns}/{class_name} does not exist")),
        Some(c) => match conditions::get(c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), READY)
        {
            Some(r) if r.status == TRUE => (TRUE, "NodeClassReady", String::new()),
            Some(r) => (FALSE, "NodeClassNotReady", r.message.clone()),
            None => (UNKNOWN, "AwaitingReconciliation", format!("CleverNodeClass {ns}/{class_name} has no status yet")),
        },
    };
    conditions::set(conds, NODECLASS_READY, class_status, class_reason, &class_message, generation, now);
    // The webhook's rules, re-checked: a pool stored without the webhook must say what is wrong.
    let references = NodePoolReferences {
        node_class: class.as_deref().map_or(Lookup::Missing, Lookup::Found),
        flavor_catalog: Lookup::Unchecked("not read by the status controller".to_string()),
        base: None,
    };
    let denial = validate_node_pool(pool, None, references).denial_message();
    let valid = denial.is_none();
    match denial {
        None => conditions::set(conds, VALIDATION_SUCCEEDED, TRUE, "ValidationSucceeded", "", generation, now),
        Some(m) => conditions::set(conds, VALIDATION_SUCCEEDED, FALSE, "ValidationFailed", &m, generation, now),
    };
    // Informational (karpenter-semantics §6.4): recent launches of this pool failing to register.
    let class_generation = class.as_deref().and_then(|c| c.metadata.generation);
    hub.observe_class_generation(&ns, class_name, class_generation);
    let (health, health_reason, health_message) =
        match hub.registration_healthy(&ns, &name, (generation, class_generation)) {
            None => (UNKNOWN, "AwaitingRegistration", "no launch of this pool since it or its node class changed"),
            Some(true) => (TRUE, "NodeRegistrationHealthy", ""),
            Some(false) => (
                FALSE,
                "RegistrationFailed",
                "at least half of the pool's recent launches did not register a node in time",
            ),
        };
    conditions::set(conds, NODE_REGISTRATION_HEALTHY, health, health_reason, health_message, generation, now);
    PoolWide { class, class_ready: class_status == TRUE, valid }
}

/// The pool's nodes (claims not being deleted) and the sum of their capacity.
fn usage<'a>(claims: impl IntoIterator<Item = &'a Arc<NodeClaim>>) -> (i64, Resources) {
    let (nodes, total, _) = usage_with_extended(claims);
    (nodes, total)
}

/// [`usage`], with the extended resources (a NodeOverlay's capacity) the claims report.
fn usage_with_extended<'a>(
    claims: impl IntoIterator<Item = &'a Arc<NodeClaim>>,
) -> (i64, Resources, BTreeMap<String, i64>) {
    let mut total = Resources::ZERO;
    let mut extended: BTreeMap<String, i64> = BTreeMap::new();
    let mut nodes = 0i64;
    for c in claims.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        nodes += 1;
        let Some(cap) = c.status.as_ref().and_then(|s| s.capacity.as_ref()) else { continue };
        if let Ok(r) = Resources::from_resource_list(cap) {
            total = total.saturating_add(r);
        }
        crds::quantity::extended_add(&mut extended, &crds::quantity::extended_of(cap).unwrap_or_default());
    }
    (nodes, total, extended)
}

/// The status' `resources`: the four node resources and the extended ones.
fn resource_list(
    total: Resources,
    extended: &BTreeMap<String, i64>,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    let mut list = total.to_resource_list();
    list.extend(crds::quantity::extended_list(extended));
    list
}

/// The pool's gauges for cluster `key`, from its claims there; a removed cluster's series dropped.
fn gauges(hub: &Hub, pool: &NodePool, key: &ClusterKey, class: Option<&CleverNodeClass>, claims: &[Arc<NodeClaim>]) {
    let ns = &key.namespace;
    let name = pool.name_any();
    let m = &hub.metrics;
    if !hub.registry.clusters().contains(key) {
        // A removed cluster's series are gone (hub.md §3 "Removal"): a pool of an unregistered
        // cluster writes none, and drops those a reconcile racing the removal wrote back.
        let cluster = key.to_string();
        m.nodepool_usage.forget(&cluster);
        m.nodepool_limit.forget(&cluster);
        m.nodepool_price.forget(&cluster);
        return;
    }
    let (nodes, total) = usage(claims);
    let labels = |resource_type: &str| PoolResourceLabels {
        cluster: key.to_string(),
        nodepool: name.clone(),
        resource_type: resource_type.to_string(),
    };
    // Cost, with the catalogue the pool's launches use (the built-in one while the class is missing),
    // as the cache shows it: a price is no reason for a live read.
    let mut types = hub.cached_instance_types(ns, class);
    hub.overlaid(ns, &pool.name_any(), &mut types);
    let priced = price_per_hour(claims.iter().map(AsRef::as_ref), &types);
    m.nodepool_usage.get(&labels("cpu")).set(total.cpu_millis as f64 / 1000.0);
    m.nodepool_usage.get(&labels("memory")).set(total.memory_bytes as f64);
    m.nodepool_usage.get(&labels("nodes")).set(nodes as f64);
    if let Some(limits) = pool.spec.limits.as_ref().and_then(|l| Resources::from_resource_list(l).ok()) {
        let declared = |k: &str| pool.spec.limits.as_ref().is_some_and(|l| l.contains_key(k));
        if declared("cpu") {
            m.nodepool_limit.get(&labels("cpu")).set(limits.cpu_millis as f64 / 1000.0);
        }
        if declared("memory") {
            m.nodepool_limit.get(&labels("memory")).set(limits.memory_bytes as f64);
        }
    }
    m.nodepool_price.get(&PoolLabels { cluster: key.to_string(), nodepool: name.clone() }).set(priced.eur_per_hour);
    if !priced.unpriced.is_empty() {
        tracing::debug!(namespace = %ns, nodepool = %name, claims = ?priced.unpriced, "claims of flavors the catalogue does not price are left out of the pool's cost");
    }
}

/// Whether cluster `key` can be provisioned for (connected and synced), with its condition reason
/// and message.
fn reachability(hub: &Hub, key: &ClusterKey) -> (bool, &'static str, String) {
    let cluster = hub.registry.status(key);
    let synced = hub.registry.connection(key).is_some_and(|c| c.is_synced());
    let reachable = cluster.phase == Phase::Connected && synced;
    let message = if cluster.phase == Phase::SecretMissing {
        format!("cluster {} is not registered: {}", key.name, cluster.message)
    } else {
        cluster.message.clone()
    };
    (reachable, cluster.phase.reason(), message)
}

/// The claims of the pool (by its label) in the namespace, as the cache holds them.
fn pool_claims(hub: &Hub, pool: &NodePool) -> Vec<Arc<NodeClaim>> {
    let name = pool.name_any();
    hub.cache
        .claims_in(&pool.namespace().unwrap_or_default())
        .into_iter()
        .filter(|c| c.labels().get(labels::NODEPOOL) == Some(&name))
        .collect()
}

/// The status of a pool naming one cluster.
async fn named(hub: &Hub, pool: &NodePool, key: &ClusterKey) -> Result<(), Error> {
    let ns = &key.namespace;
    let name = pool.name_any();
    let now = hub.now();
    let generation = pool.metadata.generation;
    let mut conds = pool.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let before = conditions::get(&conds, CLUSTER_REACHABLE).map(|c| (c.status.clone(), c.reason.clone()));
    let (reachable, reason, message) = reachability(hub, key);
    conditions::set(
        &mut conds,
        CLUSTER_REACHABLE,
        if reachable { TRUE } else { FALSE },
        reason,
        &message,
        generation,
        now,
    );
    if let Some(now_reachable) = conditions::get(&conds, CLUSTER_REACHABLE)
        && before.as_ref() != Some(&(now_reachable.status.clone(), now_reachable.reason.clone()))
    {
        // hub.md §4: the pool's users see their cluster's state changes as events too.
        let note = if message.is_empty() {
            format!("cluster {}: {}", key.name, now_reachable.reason)
        } else {
            format!("cluster {}: {}: {message}", key.name, now_reachable.reason)
        };
        hub.event(&pool.object_ref(&()), !reachable, &now_reachable.reason, "Connect", note).await;
    }
    let wide = pool_wide(hub, pool, &mut conds, now);
    match hub.gc_halt(key) {
        Some(why) => {
            conditions::set(&mut conds, GARBAGE_COLLECTION_HALTED, TRUE, "TooManyOrphans", &why, generation, now);
        }
        None => {
            conditions::remove(&mut conds, GARBAGE_COLLECTION_HALTED);
        }
    }
    let waiting = waits_for_organization(hub, key, &name, now).await?;
    set_waiting(&mut conds, waiting.into_iter().collect(), generation, now);
    let ready = conditions::set_root_except(
        &mut conds,
        READY,
        &[NODE_REGISTRATION_HEALTHY, GARBAGE_COLLECTION_HALTED, WAITING_FOR_ORGANIZATION],
        generation,
        now,
    );
    // Usage: Σ capacity of the pool's claims that are not being deleted.
    let claims = pool_claims(hub, pool);
    gauges(hub, pool, key, wide.class.as_deref(), &claims);
    if write_summary(hub, pool, conds, &claims, wide.class.as_deref(), &[]).await? {
        tracing::debug!(namespace = %ns, nodepool = %name, ready, cluster = %key, "nodepool status updated");
    }
    Ok(())
}

/// Why pods of pool `pool` wait in cluster `key` for an organisation's room (its ledger, which every
/// replica reads alike), if they do.
async fn waits_for_organization(
    hub: &Hub,
    key: &ClusterKey,
    pool: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Option<String>, Error> {
    let orgs = organizations::cached(hub, key).await?;
    Ok(orgs.iter().find_map(|o| organization::waits_for(o, organizations::id(key), pool, now)))
}

/// `WaitingForOrganization` with `why` (one line per waiting cluster; at most three listed), or
/// none when nothing waits.
fn set_waiting(
    conds: &mut Vec<crds::common::Condition>,
    why: Vec<String>,
    generation: Option<i64>,
    now: k8s_openapi::jiff::Timestamp,
) {
    if why.is_empty() {
        conditions::remove(conds, WAITING_FOR_ORGANIZATION);
        return;
    }
    let mut message = why.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if why.len() > 3 {
        message.push_str(&format!("; and {} more clusters", why.len() - 3));
    }
    conditions::set(conds, WAITING_FOR_ORGANIZATION, TRUE, "HeadroomExhausted", &message, generation, now);
}

/// Merge-patch the pool's summary (conditions, usage over all its claims not being deleted, and
/// `extra` keys: a fleet pool's `clustersReady` and `rollout`, `null` to remove one) when it differs
/// from what the pool shows; whether it did.
async fn write_summary(
    hub: &Hub,
    pool: &NodePool,
    conds: Vec<crds::common::Condition>,
    claims: &[Arc<NodeClaim>],
    class: Option<&CleverNodeClass>,
    extra: &[(&str, serde_json::Value)],
) -> Result<bool, Error> {
    let (nodes, total, extended) = usage_with_extended(claims);
    let resources = resource_list(total, &extended);
    let mut status = json!({
        "conditions": conds,
        "resources": resources,
        "nodes": nodes,
        "nodeClassObservedGeneration": class.and_then(|c| c.metadata.generation),
    });
    for (key, value) in extra {
        status[*key] = value.clone();
    }
    let current = serde_json::to_value(&pool.status).unwrap_or_default();
    let null = serde_json::Value::Null;
    let changed = ["conditions", "resources", "nodes"]
        .iter()
        .chain(extra.iter().map(|(k, _)| k))
        .any(|k| current.get(*k).unwrap_or(&null) != status.get(*k).unwrap_or(&null));
    if changed {
        Api::<NodePool>::namespaced(hub.mgmt.clone(), &pool.namespace().unwrap_or_default())
            .patch_status(&pool.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
            .await
            .step(Step::WriteNodePoolStatus)?;
    }
    Ok(changed)
}

/// The fleet rows `manager` owns on `pool`, by the server's managedFields (`k:{"name":...}` keys
/// of `status.clusters`).
fn owned_rows(pool: &NodePool, manager: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for entry in pool.metadata.managed_fields.iter().flatten() {
        if entry.manager.as_deref() != Some(manager) || entry.subresource.as_deref() != Some("status") {
            continue;
        }
        let Some(rows) = entry.fields_v1.as_ref().and_then(|f| f.0.pointer("/f:status/f:clusters")) else { continue };
        for key in rows.as_object().into_iter().flat_map(|m| m.keys()) {
            let name = key
                .strip_prefix("k:")
                .and_then(|k| serde_json::from_str::<serde_json::Value>(k).ok())
                .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string));
            out.extend(name);
        }
    }
    out
}

/// The status of a fleet pool (fleet.md §2): one row per selected cluster, written by the replica
/// that acts for that cluster (server-side apply, its own field manager); the summary (conditions,
/// `clustersReady`, usage) written by the namespace writer from every row.
async fn fleet(hub: &Hub, pool: &NodePool) -> Result<Option<Duration>, Error> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let now = hub.now();
    let generation = pool.metadata.generation;
    let served = facts::served_by(&hub.registry, pool);
    let mut conds = pool.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let wide = pool_wide(hub, pool, &mut conds, now);
    let claims = pool_claims(hub, pool);
    let existing: &[PoolClusterStatus] = pool.status.as_ref().map_or(&[], |s| s.clusters.as_slice());

    // This replica's rows: the selected clusters it acts for.
    let mut mine = Vec::new();
    for key in served.iter().filter(|k| hub.registry.writes_for(k)) {
        let here: Vec<Arc<NodeClaim>> = claims.iter().filter(|c| c.spec.cluster_name == key.name).cloned().collect();
        gauges(hub, pool, key, wide.class.as_deref(), &here);
        let (nodes, total, extended) = usage_with_extended(&here);
        let (reachable, reason, _) = reachability(hub, key);
        let reason = if !reachable {
            reason
        } else if !wide.class_ready {
            "NodeClassNotReady"
        } else if !wide.valid {
            "ValidationFailed"
        } else {
            READY
        };
        mine.push(PoolClusterStatus {
            name: key.name.clone(),
            nodes,
            resources: Some(resource_list(total, &extended)),
            ready: if reason == READY { TRUE } else { FALSE }.to_string(),
            reason: reason.to_string(),
            revisions: rollout::revisions_of(here.iter().map(AsRef::as_ref)),
        });
    }
    let served_names: std::collections::BTreeSet<&str> = served.iter().map(|k| k.name.as_str()).collect();
    let stale = existing.iter().any(|r| !served_names.contains(r.name.as_str()));
    let differs = mine.iter().any(|row| existing.iter().find(|r| r.name == row.name) != Some(row));
    // A row another replica wrote (before this one took the cluster over) is taken over by the
    // next apply, so that this replica's later applies may remove it. A server that reports no
    // field managers (the emulator) leaves nothing to take over.
    let manager = hub.rows_manager("rows");
    let reports_managers = pool.metadata.managed_fields.as_ref().is_some_and(|m| !m.is_empty());
    let owned = owned_rows(pool, &manager);
    let taken_over = reports_managers && mine.iter().any(|r| !owned.contains(&r.name));
    let api = Api::<NodePool>::namespaced(hub.mgmt.clone(), &ns);
    if differs || stale || taken_over {
        // Rows this manager wrote before and no longer lists (a cluster that left) are removed by
        // the apply itself.
        let apply = json!({
            "apiVersion": NodePool::api_version(&()), "kind": "NodePool",
            "metadata": {"name": name, "namespace": ns},
            "status": {"clusters": mine},
        });
        api.patch_status(&name, &PatchParams::apply(&manager).force(), &Patch::Apply(&apply))
            .await
            .step(Step::WriteNodePoolStatus)?;
    }
    if !hub.registry.is_namespace_writer() {
        // The rollout is the namespace writer's to report (this replica may have been it).
        rollout_gauges(&hub.metrics, &ns, &name, None);
        return Ok(None);
    }
    // The summary, from every row: this replica's fresh ones, the others' as the pool shows them.
    let rows: Vec<PoolClusterStatus> = served
        .iter()
        .map(|k| {
            mine.iter().chain(existing).find(|r| r.name == k.name).cloned().unwrap_or_else(|| PoolClusterStatus {
                name: k.name.clone(),
                ready: UNKNOWN.to_string(),
                reason: "AwaitingOwner".to_string(),
                ..PoolClusterStatus::default()
            })
        })
        .collect();
    conditions::remove(&mut conds, CLUSTER_REACHABLE);
    conditions::remove(&mut conds, GARBAGE_COLLECTION_HALTED);
    match (rows.is_empty(), fleet::not_ready_message(&rows)) {
        (true, _) => conditions::set(
            &mut conds,
            CLUSTERS_READY,
            FALSE,
            "NoClusterSelected",
            &format!("clusterSelector matches no registered cluster of namespace {ns}"),
            generation,
            now,
        ),
        (false, None) => conditions::set(&mut conds, CLUSTERS_READY, TRUE, CLUSTERS_READY, "", generation, now),
        (false, Some(message)) => {
            conditions::set(&mut conds, CLUSTERS_READY, FALSE, "ClustersNotReady", &message, generation, now)
        }
    };
    // Nodes left in clusters that departed the selection (fleet.md §2): shown, not counted against
    // readiness.
    let mut departed: BTreeMap<&str, usize> = BTreeMap::new();
    for c in claims.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        if !served_names.contains(c.spec.cluster_name.as_str()) {
            *departed.entry(c.spec.cluster_name.as_str()).or_default() += 1;
        }
    }
    if departed.is_empty() {
        conditions::remove(&mut conds, NODES_IN_DEPARTED_CLUSTERS);
    } else {
        let total: usize = departed.values().sum();
        let by: Vec<String> = departed.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        let message = format!(
            "{total} node(s) in clusters this pool no longer selects ({}): drifted (ClusterNotSelected) and replaced \
             within the pool's budgets where another pool serves the cluster, else left in place",
            by.join(", ")
        );
        conditions::set(&mut conds, NODES_IN_DEPARTED_CLUSTERS, TRUE, "ClusterNotSelected", &message, generation, now);
    }
    let (rollout, recheck, resumed) = advance_rollout(hub, pool, &served, &claims, &mut conds, now).await;
    let mut waiting = Vec::new();
    for key in &served {
        if let Some(why) = waits_for_organization(hub, key, &name, now).await? {
            waiting.push(format!("cluster {}: {why}", key.name));
        }
    }
    set_waiting(&mut conds, waiting, generation, now);
    let ready = conditions::set_root_except(
        &mut conds,
        READY,
        &[NODE_REGISTRATION_HEALTHY, NODES_IN_DEPARTED_CLUSTERS, ROLLOUT_HALTED, WAITING_FOR_ORGANIZATION],
        generation,
        now,
    );
    let summary = fleet::clusters_ready(&rows);
    let extra = [("clustersReady", json!(summary)), ("rollout", rollout)];
    if write_summary(hub, pool, conds, &claims, wide.class.as_deref(), &extra).await? {
        tracing::debug!(namespace = %ns, nodepool = %name, ready, clusters = %summary, "fleet nodepool status updated");
    }
    if resumed {
        // Retried once: the annotation goes, so the next failure halts again.
        let unmark = json!({"metadata": {"annotations": {rollout::RESUME_ANNOTATION: null}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&unmark)).await.step(Step::WriteNodePoolStatus)?;
    }
    // Rows of clusters no longer selected that no live writer removes (their manager's replica
    // is gone): removed one by one, each guarded by its name, so a concurrent write is not undone.
    if stale {
        prune(&api, &name, &served_names).await?;
    }
    Ok(recheck)
}

/// `karpenter_hub_nodepool_rollout_phase` of pool `ns/name`: 1 for each cluster's current phase in
/// `rollout`, no series for a cluster not in it (nor for any, without a rollout).
fn rollout_gauges(m: &Metrics, ns: &str, name: &str, rollout: Option<&crds::nodepool::RolloutStatus>) {
    let current: std::collections::BTreeSet<PoolPhaseLabels> = rollout
        .map(|r| &r.clusters[..])
        .unwrap_or_default()
        .iter()
        .map(|c| PoolPhaseLabels {
            cluster: format!("{ns}/{}", c.name),
            nodepool: name.to_string(),
            phase: format!("{:?}", c.phase),
        })
        .collect();
    let prefix = format!("{ns}/");
    m.rollout_phase.forget_where(|l| l.nodepool == name && l.cluster.starts_with(&prefix) && !current.contains(l));
    for labels in &current {
        m.rollout_phase.get(labels).set(1);
    }
}

/// The rollout of a fleet pool's revision (fleet.md §3), advanced by the namespace writer: the
/// next `status.rollout` (`null` without `spec.rollout`), when to look again (a cluster soaking, or
/// progressing towards its failure deadline), and whether the resume annotation was consumed.
/// Sets or clears `RolloutHalted`; one event and one log line per cluster changing phase.
async fn advance_rollout(
    hub: &Hub,
    pool: &NodePool,
    served: &[ClusterKey],
    claims: &[Arc<NodeClaim>],
    conds: &mut Vec<crds::common::Condition>,
    now: k8s_openapi::jiff::Timestamp,
) -> (serde_json::Value, Option<Duration>, bool) {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let Some(spec) = &pool.spec.rollout else {
        conditions::remove(conds, ROLLOUT_HALTED);
        rollout_gauges(&hub.metrics, &ns, &name, None);
        return (serde_json::Value::Null, None, false);
    };
    let revision = crds::drift::nodepool_hash(&pool.spec);
    let facts: Vec<rollout::ClusterFacts> =
        served.iter().map(|k| rollout::facts_of(&k.name, claims.iter().map(AsRef::as_ref), &revision, now)).collect();
    let settings = rollout::Settings::of(spec, served.len());
    let resume = pool.annotations().get(rollout::RESUME_ANNOTATION).is_some_and(|v| v == rollout::RESUME);
    let previous = pool.status.as_ref().and_then(|s| s.rollout.as_ref());
    let (next, changes) = rollout::advance(previous, &revision, &spec.order, &facts, settings, resume, now);
    for c in &changes {
        // A cluster's first phase in a revision is news only when it starts.
        if c.from.is_none() && c.to != RolloutPhase::Progressing {
            continue;
        }
        let failed = c.to == RolloutPhase::Failed;
        let note = match &c.message {
            Some(why) => format!("cluster {}: {:?} in the rollout of revision {revision}: {why}", c.cluster, c.to),
            None => format!("cluster {}: {:?} in the rollout of revision {revision}", c.cluster, c.to),
        };
        tracing::info!(namespace = %ns, nodepool = %name, cluster = %c.cluster, revision = %revision, from = ?c.from, to = ?c.to, why = c.message.as_deref().unwrap_or(""), "rollout phase changed");
        hub.event(&pool.object_ref(&()), failed, &format!("Rollout{:?}", c.to), "Rollout", note).await;
    }
    rollout_gauges(&hub.metrics, &ns, &name, Some(&next));
    let generation = pool.metadata.generation;
    match next.clusters.iter().find(|c| c.phase == RolloutPhase::Failed) {
        Some(failed) => {
            let message = format!(
                "cluster {} failed: {}; no other cluster starts (annotate the pool {}={} to retry it, or change the \
                 template for a new revision)",
                failed.name,
                failed.message.as_deref().unwrap_or("a replacement failed"),
                rollout::RESUME_ANNOTATION,
                rollout::RESUME
            );
            conditions::set(conds, ROLLOUT_HALTED, TRUE, "ClusterFailed", &message, generation, now);
        }
        None => {
            conditions::remove(conds, ROLLOUT_HALTED);
        }
    }
    // Soaking ends at a time; a progressing cluster may fail at one. Other changes are watched.
    let mut recheck: Option<Duration> = None;
    for c in &next.clusters {
        let elapsed = Duration::try_from(now.duration_since(c.since.0)).unwrap_or_default();
        let at = match c.phase {
            RolloutPhase::Soaking => Some(settings.soak.saturating_sub(elapsed)),
            RolloutPhase::Progressing => Some(ROLLOUT_RECHECK),
            _ => None,
        };
        recheck = match (recheck, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let value = serde_json::to_value(&next).unwrap_or(serde_json::Value::Null);
    (value, recheck.map(|d| d.max(Duration::from_secs(1))), resume)
}

/// Remove the rows of clusters not in `served` from the pool's live status.
async fn prune(api: &Api<NodePool>, name: &str, served: &std::collections::BTreeSet<&str>) -> Result<(), Error> {
    let live = api.get_status(name).await.step(Step::WriteNodePoolStatus)?;
    let rows = live.status.map(|s| s.clusters).unwrap_or_default();
    // From the end, so earlier indices stay valid within the one patch.
    let mut ops = Vec::new();
    for (i, row) in rows.iter().enumerate().rev().filter(|(_, r)| !served.contains(r.name.as_str())) {
        ops.push(json!({"op": "test", "path": format!("/status/clusters/{i}/name"), "value": row.name}));
        ops.push(json!({"op": "remove", "path": format!("/status/clusters/{i}")}));
    }
    if ops.is_empty() {
        return Ok(());
    }
    let Ok(patch) = serde_json::from_value(serde_json::Value::Array(ops)) else { return Ok(()) };
    match api.patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
        // 422: a row moved meanwhile; the next reconcile looks again.
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(()),
        r => r.map(|_| ()).step(Step::WriteNodePoolStatus),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_a_manager_owns_are_read_from_managed_fields() {
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "web", "namespace": "team-a", "managedFields": [
                {"manager": "karpenter-hub-rows-a", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:clusters": {"k:{\"name\":\"paris\"}": {".": {}, "f:name": {}}, "k:{\"name\":\"lyon\"}": {}}}}},
                {"manager": "karpenter-hub-rows-b", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:clusters": {"k:{\"name\":\"nice\"}": {}}}}},
                {"manager": "karpenter-hub-rows-a", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:clusters": {"k:{\"name\":\"brest\"}": {}}}}}
            ]},
            "spec": {"clusterSelector": {}, "template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}}},
        }))
        .unwrap();
        let owned = |m: &str| owned_rows(&pool, m).into_iter().collect::<Vec<_>>();
        assert_eq!(owned("karpenter-hub-rows-a"), ["lyon", "paris"], "status subresource entries only");
        assert_eq!(owned("karpenter-hub-rows-b"), ["nice"]);
        assert!(owned("karpenter-hub-rows-c").is_empty());
    }

    #[test]
    fn forgetting_a_pool_drops_its_gauges_only() {
        let m = Metrics::new();
        for (cluster, pool) in [("team-a/prod", "default"), ("team-a/prod", "gpu"), ("team-b/prod", "default")] {
            let l = PoolLabels { cluster: cluster.into(), nodepool: pool.into() };
            m.nodepool_price.get(&l).set(1.0);
            let r = PoolResourceLabels { cluster: cluster.into(), nodepool: pool.into(), resource_type: "cpu".into() };
            m.nodepool_usage.get(&r).set(1.0);
            m.nodepool_limit.get(&r).set(1.0);
        }
        forget_pool(&m, "team-a", "default");
        let text = m.render();
        assert!(!text.contains("cluster=\"team-a/prod\",nodepool=\"default\""), "{text}");
        assert_eq!(text.matches("nodepool=\"gpu\"").count(), 3, "{text}");
        assert_eq!(text.matches("cluster=\"team-b/prod\",nodepool=\"default\"").count(), 3, "{text}");
    }
}
