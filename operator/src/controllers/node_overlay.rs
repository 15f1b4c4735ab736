//! The NodeOverlay status controller (issue 28 item 3, upstream's NodeOverlay): evaluates every
//! namespace's overlays over its NodePools' flavors (`crds::overlay::evaluate`: weights, conflicts,
//! invalid specs) and writes each overlay's `ValidationSucceeded` and `Ready`. Rounds apply an
//! overlay only once it is accepted for its current generation, so every replica and every
//! cluster of the namespace prices alike.
//!
//! Owns: NodeOverlay status, written by the namespace writer only when it differs. Must not: apply
//! prices (the scheduling conversion does, from the accepted overlays) or read the API (caches).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::conditions::{self, FALSE, TRUE},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::hub::Hub,
};
use crds::{
    NodeOverlay,
    overlay::{PoolTypes, READY, VALIDATION_SUCCEEDED, evaluate},
};

/// How often overlays are evaluated when nothing wakes the controller.
const PERIOD: Duration = Duration::from_secs(60);
/// Changes arriving together are evaluated once.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Keep every overlay's status until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut scope = hub.cache.scope_changes();
    loop {
        if hub.cache.is_ready() && hub.registry.is_namespace_writer() {
            pass(&hub).await;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = scope.changed() => {}
            () = tokio::time::sleep(PERIOD) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(DEBOUNCE) => {}
        }
    }
}

/// Every namespace with overlays, once.
async fn pass(hub: &Hub) {
    let mut by_ns: BTreeMap<String, Vec<NodeOverlay>> = BTreeMap::new();
    for o in hub.cache.overlays.state() {
        by_ns.entry(o.namespace().unwrap_or_default()).or_default().push(o.as_ref().clone());
    }
    for (ns, overlays) in by_ns {
        if let Err(e) = namespace(hub, &ns, &overlays).await {
            errors::count(hub, Reconciler::NodeOverlay, None, &e);
            tracing::warn!(namespace = %ns, step = e.step().label(), category = e.category().as_str(), error = %e, "nodeoverlay status update failed; retrying");
        }
    }
}

/// One namespace: evaluate its overlays over its pools' flavors (the node class's catalogue, as
/// the rounds start from) and write what changed.
async fn namespace(hub: &Hub, ns: &str, overlays: &[NodeOverlay]) -> Result<(), ApiError> {
    let pools = hub.cache.pools_in(ns);
    let classes = hub.cache.classes_in(ns);
    let types: Vec<Vec<crds::catalog::InstanceType>> = pools
        .iter()
        .map(|p| {
            let class = classes.iter().find(|c| c.name_any() == p.spec.template.spec.node_class_ref.name);
            hub.cached_instance_types(ns, class.map(AsRef::as_ref))
        })
        .collect();
    let views: Vec<PoolTypes<'_>> = pools.iter().zip(&types).map(|(p, t)| PoolTypes::of(p, t)).collect();
    let verdict = evaluate(overlays, &views);
    let now = hub.now();
    let api: Api<NodeOverlay> = Api::namespaced(hub.mgmt.clone(), ns);
    for o in overlays {
        let name = o.name_any();
        let generation = o.metadata.generation;
        let mut conds = o.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
        let (status, reason, message) = match verdict.refused.get(&name) {
            Some((reason, message)) => (FALSE, *reason, message.clone()),
            None => (TRUE, VALIDATION_SUCCEEDED, String::new()),
        };
        let mut changed = conditions::set(&mut conds, VALIDATION_SUCCEEDED, status, reason, &message, generation, now);
        let ready_message =
            if status == TRUE { String::new() } else { format!("{VALIDATION_SUCCEEDED}=False: {message}") };
        let ready_reason = if status == TRUE { READY } else { reason };
        changed |= conditions::set(&mut conds, READY, status, ready_reason, &ready_message, generation, now);
        if !changed {
            continue;
        }
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": conds}})))
            .await
            .step(Step::WriteNodeOverlayStatus)?;
        tracing::info!(namespace = %ns, nodeoverlay = %name, accepted = status == TRUE, reason, "nodeoverlay evaluated");
    }
    Ok(())
}
