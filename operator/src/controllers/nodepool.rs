//! The NodePool status controller (hub.md §4, karpenter-semantics §1.4): `ClusterReachable` with the
//! registry's reason for the pool's cluster, `NodeClassReady`, `ValidationSucceeded`, the
//! informational `NodeRegistrationHealthy`, the root `Ready`, and the pool's usage (`resources`,
//! `nodes`) summed over its claims.
//!
//! Owns: NodePool status. Must not: change specs or act on claims.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{Controller, controller::Action, watcher},
};
use serde_json::json;

use crate::{
    decisions::conditions::{self, FALSE, TRUE, UNKNOWN},
    infra::hub::Hub,
    infra::metrics::PoolResourceLabels,
    infra::registry::{ClusterKey, Phase},
};
use crds::{
    CleverNodeClass, NodeClaim, NodePool,
    admission::{Lookup, NodePoolReferences, validate_node_pool},
    labels,
    quantity::Resources,
};

pub const CLUSTER_REACHABLE: &str = "ClusterReachable";
pub const NODECLASS_READY: &str = "NodeClassReady";
pub const READY: &str = "Ready";
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
pub const NODE_REGISTRATION_HEALTHY: &str = "NodeRegistrationHealthy";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error: {}", crate::infra::apierror::plain(.0))]
    Kube(#[from] kube::Error),
}

pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let pools: Api<NodePool> = hub.scoped();
    let claims: Api<NodeClaim> = hub.scoped();
    let cluster_changes = hub.registry.change_stream();
    let controller = Controller::new(pools, watcher::Config::default());
    let pools_store = controller.store();
    controller
        .watches(claims, watcher::Config::default(), |claim| {
            let ns = claim.namespace()?;
            let pool = claim.labels().get(labels::NODEPOOL)?.clone();
            Some(kube::runtime::reflector::ObjectRef::new(&pool).within(&ns))
        })
        // A node class turning Ready or not changes NodeClassReady of the pools using it.
        .watches(hub.scoped::<CleverNodeClass>(), watcher::Config::default(), move |class| {
            let ns = class.namespace();
            let name = class.name_any();
            pools_store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.template.spec.node_class_ref.name == name)
                .map(|p| kube::runtime::reflector::ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(cluster_changes)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, |_, _, _| Action::requeue(Duration::from_secs(10)), hub)
        .for_each(|_| async {})
        .await;
}

async fn reconcile(pool: Arc<NodePool>, hub: Arc<Hub>) -> Result<Action, Error> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let key = ClusterKey::new(ns.clone(), pool.spec.cluster_name.clone());
    let cluster = hub.registry.status(&key);
    let synced = hub.registry.connection(&key).is_some_and(|c| c.is_synced());
    let now = Timestamp::now();
    let generation = pool.metadata.generation;
    let mut conds = pool.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let before = conditions::get(&conds, CLUSTER_REACHABLE).map(|c| (c.status.clone(), c.reason.clone()));
    let reachable = cluster.phase == Phase::Connected && synced;
    let message = if cluster.phase == Phase::SecretMissing {
        format!("cluster {} is not registered: {}", key.name, cluster.message)
    } else {
        cluster.message.clone()
    };
    conditions::set(
        &mut conds,
        CLUSTER_REACHABLE,
        if reachable { TRUE } else { FALSE },
        cluster.phase.reason(),
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
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class = Api::<CleverNodeClass>::namespaced(hub.mgmt.clone(), &ns).get_opt(class_name).await?;
    let (class_status, class_reason, class_message) = match &class {
        None => (FALSE, "NodeClassNotFound", format!("CleverNodeClass {ns}/{class_name} does not exist")),
        Some(c) => match conditions::get(c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), READY)
        {
            Some(r) if r.status == TRUE => (TRUE, "NodeClassReady", String::new()),
            Some(r) => (FALSE, "NodeClassNotReady", r.message.clone()),
            None => (UNKNOWN, "AwaitingReconciliation", format!("CleverNodeClass {ns}/{class_name} has no status yet")),
        },
    };
    conditions::set(&mut conds, NODECLASS_READY, class_status, class_reason, &class_message, generation, now);
    // The webhook's rules, re-checked: a pool stored without the webhook must say what is wrong.
    let references = NodePoolReferences {
        node_class: class.as_ref().map_or(Lookup::Missing, Lookup::Found),
        flavor_catalog: Lookup::Unchecked("not read by the status controller".to_string()),
        base: None,
    };
    match validate_node_pool(&pool, None, references).denial_message() {
        None => conditions::set(&mut conds, VALIDATION_SUCCEEDED, TRUE, "ValidationSucceeded", "", generation, now),
        Some(m) => conditions::set(&mut conds, VALIDATION_SUCCEEDED, FALSE, "ValidationFailed", &m, generation, now),
    };
    // Informational (karpenter-semantics §6.4): recent launches of this pool failing to register.
    let class_generation = class.as_ref().and_then(|c| c.metadata.generation);
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
    conditions::set(&mut conds, NODE_REGISTRATION_HEALTHY, health, health_reason, health_message, generation, now);
    let ready = conditions::set_root_except(&mut conds, READY, &[NODE_REGISTRATION_HEALTHY], generation, now);

    // Usage: Σ capacity of the pool's claims that are not being deleted.
    let claims = Api::<NodeClaim>::namespaced(hub.mgmt.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{}={name}", labels::NODEPOOL)))
        .await?
        .items;
    let mut total = Resources::ZERO;
    let mut nodes = 0i64;
    for c in claims.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        nodes += 1;
        if let Some(cap) = c.status.as_ref().and_then(|s| s.capacity.as_ref())
            && let Ok(r) = Resources::from_resource_list(cap)
        {
            total = total.saturating_add(r);
        }
    }
    let labels = |resource_type: &str| PoolResourceLabels {
        cluster: key.to_string(),
        nodepool: name.clone(),
        resource_type: resource_type.to_string(),
    };
    let m = &hub.metrics;
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
    let resources: BTreeMap<String, _> = total.to_resource_list();
    let status = json!({
        "conditions": conds,
        "resources": resources,
        "nodes": nodes,
        "nodeClassObservedGeneration": class.as_ref().and_then(|c| c.metadata.generation),
    });
    let current = serde_json::to_value(&pool.status).unwrap_or_default();
    let changed = ["conditions", "resources", "nodes"].iter().any(|k| current.get(*k) != status.get(*k));
    if changed {
        Api::<NodePool>::namespaced(hub.mgmt.clone(), &ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
            .await?;
        tracing::debug!(namespace = %ns, nodepool = %name, ready, cluster = %key, "nodepool status updated");
    }
    // Every input is watched (pool, its claims, its class, the registry): no periodic re-check,
    // so a steady fleet costs no LIST (performance.md B4).
    Ok(Action::await_change())
}
