//! Static pools (`NodePool.spec.replicas`; issue 28 item 1): per workload cluster, keep each static
//! pool serving it at its count. Gathers the pool's claims and their nodes from the watch caches,
//! asks [`static_capacity::decide`] what to make or delete, picks the new claims' flavors with the
//! scheduling core (the cheapest of the pool's that fits its DaemonSets, as for any new node), and
//! writes: creates under deterministic names (a slot each), deletes with a UID precondition
//! (termination drains them). Wakes on the management caches' news (a claim going, a pool's spec),
//! the cluster's connection, and every [`PERIOD`].
//!
//! Owns: the static pools' claim count. Must not: act on a cluster that is not synced, place pods
//! (static pools make no node for pending pods: the conversion keeps them out of every round), or
//! disrupt (their nodes are no candidates of the disruption methods).

use std::{sync::Arc, time::Duration};

use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::new_claims::{Cluster, node_claim},
    decisions::static_capacity::{self, SLOT_ANNOTATION},
    infra::errors::{self, Categorized, Reconciler, Step, StepExt},
    infra::facts,
    infra::hub::Hub,
    infra::metrics::CreatedLabels,
    infra::organizations,
    infra::registry::{ClusterKey, Connection},
};
use crds::{NodeClaim, NodePool};
use scheduling::{
    convert::{PendingRule, StaticPool, build_input_with_volumes},
    model::{Input, Pod, Toleration, TolerationOperator},
};

/// How often a cluster's static pools are looked at without news.
pub const PERIOD: Duration = Duration::from_secs(10);

/// How long to wait for the management cache to show the claims a pass created.
const CREATED_VISIBLE: Duration = Duration::from_secs(5);

/// Errors of one pass; logged, and the next pass retries.
pub use crate::infra::errors::PassError as Error;

/// Start and stop one task per registered cluster until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    crate::infra::hub::per_cluster(hub, shutdown, cluster_loop).await;
}

async fn cluster_loop(hub: Arc<Hub>, key: ClusterKey, cancel: CancellationToken) {
    let mut changes = hub.registry.changes();
    let mut scope = hub.cache.scope_changes();
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let conn = hub.registry.connection(&key).filter(|c| c.is_synced());
        if let Some(conn) = conn.as_ref()
            && hub.cache.is_ready()
            && let Err(e) = pass(&hub, conn, &key).await
        {
            errors::count(&hub, Reconciler::Provisioning, Some(&key), &e);
            tracing::warn!(cluster = %key, step = e.step().label(), category = e.category().as_str(), error = %e, "static pool pass failed; retrying");
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = changes.changed() => {}
            _ = scope.changed() => {}
            _ = ticker.tick() => {}
        }
    }
}

/// One look at the cluster's static pools.
async fn pass(hub: &Hub, conn: &Connection, key: &ClusterKey) -> Result<(), Error> {
    // Most namespaces have no static pool: no snapshot built for them every period.
    if !hub.cache.pools_in(&key.namespace).iter().any(|p| p.spec.replicas.is_some()) {
        return Ok(());
    }
    let claims = facts::claims(&hub.cache, key);
    let labels = facts::ClusterLabels::of(&hub.registry, key);
    let mut snapshot = facts::snapshot(
        &hub.cache,
        &conn.cache,
        key,
        &labels,
        &hub.settings.zone,
        &claims,
        facts::Workload::Everything,
    );
    snapshot.now = Some(hub.now());
    if !snapshot.node_pools.iter().any(|p| p.spec.replicas.is_some()) {
        return Ok(());
    }
    let converted = build_input_with_volumes(
        &snapshot,
        &conn.cache.volumes.volumes(),
        &key.name,
        PendingRule::Unschedulable,
        hub.settings.scheduler,
    )?;
    let api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    for sp in &converted.static_pools {
        let Some(pool) = snapshot.node_pools.iter().find(|p| p.name_any() == sp.pool.name) else { continue };
        let facts = static_capacity::facts_of(pool, sp.replicas, claims.iter().map(AsRef::as_ref), &snapshot);
        let decision = static_capacity::decide(&facts);
        if decision.create.is_empty() && decision.delete.is_empty() {
            continue;
        }
        tracing::info!(
            cluster = %key, nodepool = %sp.pool.name, replicas = sp.replicas, create = decision.create.len(),
            delete = ?decision.delete, why = %decision.why, "static pool keeps its count"
        );
        if !decision.create.is_empty() {
            create(hub, &api, key, pool, sp, &converted.input, &snapshot, &decision.create).await?;
        }
        for name in &decision.delete {
            let Some(claim) = claims.iter().find(|c| c.name_any() == *name) else { continue };
            let params =
                DeleteParams::default().preconditions(Preconditions { uid: claim.uid(), resource_version: None });
            match api.delete(name, &params).await {
                Ok(_) => {
                    tracing::info!(cluster = %key, nodepool = %sp.pool.name, nodeclaim = %name, "deleting NodeClaim: static pool above its count")
                }
                // Gone, or another incarnation: the next pass sees it as it is.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Step::DeleteClaim.failed(e).into()),
            }
        }
    }
    Ok(())
}

/// Make a claim of `pool` in each of `slots`: the flavor options the scheduling core gives one
/// node of the pool that holds nothing but the cluster's DaemonSets (cheapest first), within the
/// room the cluster's organisations leave for one node (several slots made at once are each
/// checked against that room alone; CKE's quota refuses what goes beyond).
#[allow(clippy::too_many_arguments)]
async fn create(
    hub: &Hub,
    api: &Api<NodeClaim>,
    key: &ClusterKey,
    pool: &NodePool,
    sp: &StaticPool,
    cluster_input: &Input,
    snapshot: &scheduling::convert::Snapshot,
    slots: &[u32],
) -> Result<(), Error> {
    // CKE refused a launch lately (clever-cloud.md §3.5): no new claim while the cluster backs off,
    // and flavors cooling down are not offered, as in provisioning.
    let now = hub.now();
    let capacity = hub.capacity(key).await.step(Step::ReadCapacity)?;
    if let Some(left) = capacity.backoff_remaining(now) {
        tracing::debug!(cluster = %key, nodepool = %sp.pool.name, seconds = left.as_secs(), "creation back-off after a CKE refusal; the static pool waits");
        return Ok(());
    }
    let mut input = slot_input(sp, cluster_input);
    let cooling: std::collections::BTreeSet<String> = capacity.unavailable(now).map(str::to_string).collect();
    crate::decisions::input_corrections::mark_unavailable(&mut input, &cooling);
    // The room the cluster's organisations leave (fleet.md §4) holds static nodes back too.
    let rooms = organizations::rooms(hub, key, now).await?;
    crate::decisions::organization::limit_input(&mut input, &rooms);
    let decided = scheduling::solve(&input);
    let Some(shape) = decided.new_claims.into_iter().next() else {
        let why = decided.unschedulable.first().map(|u| u.reason.clone()).unwrap_or_default();
        tracing::warn!(cluster = %key, nodepool = %sp.pool.name, reason = %why, "no flavor of the static pool can be launched; it stays below its count");
        return Ok(());
    };
    let cluster = Cluster { namespace: &key.namespace, name: &key.name };
    let class = snapshot.node_classes.iter().find(|c| c.name_any() == pool.spec.template.spec.node_class_ref.name);
    // A slot's claim is named for the slot and this decision's time: a slot filled again (after
    // expiry, say) gets a new name, never its predecessor's, whose NodeGroup (named after the claim)
    // may still be going. A create whose answer is lost is not repeated: the next decision waits
    // until the cache shows what this one made, and a restart lists it.
    let stamp = now.as_millisecond();
    let mut created = Vec::new();
    for slot in slots {
        let mut nc = node_claim(pool, class, &shape, &cluster, &[format!("static-slot-{slot}-{stamp}")])?;
        nc.annotations_mut().insert(SLOT_ANNOTATION.to_string(), slot.to_string());
        let name = nc.name_any();
        match api.create(&PostParams::default(), &nc).await {
            Ok(_) => {
                created.push(name.clone());
                hub.metrics.nodeclaims_created.get(&CreatedLabels::of(&key.to_string(), "static", &nc)).inc();
                tracing::info!(
                    cluster = %key, nodepool = %sp.pool.name, nodeclaim = %name, slot,
                    flavor = shape.instance_types.first().map(|o| o.name.as_str()).unwrap_or_default(),
                    "created NodeClaim: static pool below its count"
                );
            }
            // The same decision's create, replayed (its name holds the decision's time).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(cluster = %key, nodeclaim = %name, slot, "static slot's NodeClaim already exists");
            }
            Err(e) => return Err(Step::CreateClaim.failed(e).into()),
        }
    }
    if !created.is_empty() && !hub.claims_visible(&key.namespace, &created, CREATED_VISIBLE).await {
        tracing::warn!(cluster = %key, nodepool = %sp.pool.name, claims = created.len(), "the management cache does not show the new static NodeClaims yet; the next pass may count too few");
    }
    Ok(())
}

/// The scheduling question "one node of this pool, empty": the pool alone (its count is the
/// decision's, not a limit here), no existing node, and one pod asking for nothing that tolerates
/// every taint, so the answer is the pool's cheapest flavor that holds the cluster's DaemonSets.
fn slot_input(sp: &StaticPool, cluster_input: &Input) -> Input {
    let mut pool = sp.pool.clone();
    pool.limits = Default::default();
    let mut pod =
        Pod { namespace: "karpenter-hub".to_string(), name: format!("{}-slot", sp.pool.name), ..Pod::default() };
    pod.constraints.tolerations.push(Toleration {
        key: String::new(),
        operator: TolerationOperator::Exists,
        value: String::new(),
        effect: None,
    });
    Input {
        pools: vec![pool],
        pods: vec![pod],
        daemonsets: cluster_input.daemonsets.clone(),
        settings: cluster_input.settings,
        ..Input::default()
    }
}
