//! The CleverNodeClass status controller (clever-cloud.md §7.2): `ValidationSucceeded` from the same
//! admission rules the webhook applies, `NodeGroupAPIServed` from the clusters whose NodePools use
//! the class, the root `Ready` that launches require, and the informational
//! `FlavorCatalogResolved` (False while its catalogue reference dangles or is refused: the built-in
//! catalogue is served meanwhile).
//!
//! Owns: the status of node classes, and a cache of the flavor catalogues its watch already
//! receives (read instead of a GET per reconcile). Must not: block on a cluster (it reads the
//! registry's published state), or change the spec.

use std::{sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;

use crate::{
    decisions::conditions::{self, FALSE, TRUE},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::facts,
    infra::hub::Hub,
    infra::registry::{ClusterKey, Phase},
};
use crds::{
    CleverNodeClass, FlavorCatalog, NodePool,
    admission::{Lookup, validate_node_class},
    catalog::CatalogProblem,
};

pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
pub const NODEGROUP_API_SERVED: &str = "NodeGroupAPIServed";
pub const READY: &str = "Ready";
pub const FLAVOR_CATALOG_RESOLVED: &str = "FlavorCatalogResolved";

/// What stops a reconcile (retried after 10 s): only a request, which says its step.
pub type Error = ApiError;

/// The controller's context: the hub, and the catalogues as the watch that wakes the classes saw
/// them. A store of its own rather than the hub's management cache: a change is in this store
/// before it wakes the classes (the reflector applies it first), so a class is never judged on a
/// catalogue older than the change that woke it. Catalogues are few and small.
struct Ctx {
    hub: Arc<Hub>,
    catalogs: Store<FlavorCatalog>,
}

pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let classes: Api<CleverNodeClass> = hub.scoped();
    // A cluster connecting or failing changes NodeGroupAPIServed: re-check every class then.
    let cluster_changes = hub.registry.change_stream();
    // A catalogue created, fixed or broken changes FlavorCatalogResolved of the classes using it.
    let (catalogs, writer) = reflector::store();
    let catalog_changes = reflector::reflector(
        writer,
        watcher(hub.scoped::<FlavorCatalog>(), watcher::Config::default()).default_backoff(),
    )
    .touched_objects()
    .filter_map(|r| async move { r.ok().map(|_| ()) });
    Controller::new(classes, watcher::Config::default())
        // A pool starting (or stopping) to use a class changes the clusters it is checked against.
        .watches(hub.scoped::<NodePool>(), watcher::Config::default(), |pool| {
            let ns = pool.namespace()?;
            Some(kube::runtime::reflector::ObjectRef::new(&pool.spec.template.spec.node_class_ref.name).within(&ns))
        })
        .reconcile_all_on(futures::stream::select(cluster_changes, catalog_changes))
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Ctx { hub, catalogs }))
        .for_each(|_| async {})
        .await;
}

/// A failed reconcile: counted (a class is no cluster's), logged with its step and category, and
/// retried after 10 s.
fn error_policy(class: Arc<CleverNodeClass>, e: &Error, ctx: Arc<Ctx>) -> Action {
    errors::count(&ctx.hub, Reconciler::NodeClass, None, e);
    tracing::warn!(namespace = %class.namespace().unwrap_or_default(), nodeclass = %class.name_any(), step = e.step().label(), category = e.category().as_str(), error = %e, "node class reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// The NodeGroupAPIServed verdict over the clusters using a class: `(status, reason, message)`.
pub fn api_served(clusters: &[(ClusterKey, Phase)]) -> (&'static str, &'static str, String) {
    let missing: Vec<String> =
        clusters.iter().filter(|(_, p)| *p == Phase::NodeGroupApiNotServed).map(|(k, _)| k.to_string()).collect();
    if missing.is_empty() {
        (TRUE, "NodeGroupAPIServed", String::new())
    } else {
        (
            FALSE,
            "NodeGroupAPIUnavailable",
            format!("nodegroups.api.clever-cloud.com is not served in {}: is it a CKE cluster?", missing.join(", ")),
        )
    }
}

async fn reconcile(class: Arc<CleverNodeClass>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let hub = &ctx.hub;
    let ns = class.namespace().unwrap_or_default();
    let name = class.name_any();
    // Before the catalogue watch has listed once, a missing catalogue means nothing: judge later.
    if class.spec.flavor_catalog_ref.is_some() && ctx.catalogs.wait_until_ready().now_or_never().is_none() {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let catalog = match &class.spec.flavor_catalog_ref {
        None => Lookup::Missing,
        Some(r) => match ctx.catalogs.get(&ObjectRef::new(&r.name).within(&ns)) {
            Some(fc) => Lookup::Found(FlavorCatalog::clone(&fc)),
            None => Lookup::Missing,
        },
    };
    let verdict = validate_node_class(&class, None, catalog.as_ref());
    // From the shared watch cache: a periodic re-check must not LIST (performance.md B4).
    let pools = hub.cache.pools_in(&ns);
    let mut clusters: Vec<(ClusterKey, Phase)> = pools
        .iter()
        .filter(|p| p.spec.template.spec.node_class_ref.name == name)
        .flat_map(|p| {
            facts::served_by(&hub.registry, p).into_iter().map(|key| {
                // Sharded mode: a cluster owned by another replica, as its owner reported it (on a
                // fleet pool, in the cluster's row).
                let status = p.status.as_ref();
                let reported = match &p.spec.cluster_name {
                    Some(_) => status
                        .and_then(|s| conditions::get(&s.conditions, "ClusterReachable"))
                        .map(|c| c.reason.clone()),
                    None => {
                        status.and_then(|s| s.clusters.iter().find(|r| r.name == key.name)).map(|r| r.reason.clone())
                    }
                };
                let phase = hub.registry.phase_or_reported(&key, reported.as_deref());
                (key, phase)
            })
        })
        .collect();
    clusters.sort_by(|a, b| a.0.cmp(&b.0));
    clusters.dedup_by(|a, b| a.0 == b.0);
    let now = hub.now();
    let generation = class.metadata.generation;
    let mut conds = class.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    match verdict.denial_message() {
        None => conditions::set(&mut conds, VALIDATION_SUCCEEDED, TRUE, "ValidationSucceeded", "", generation, now),
        Some(m) => conditions::set(&mut conds, VALIDATION_SUCCEEDED, FALSE, "ValidationFailed", &m, generation, now),
    };
    let (status, reason, message) = api_served(&clusters);
    conditions::set(&mut conds, NODEGROUP_API_SERVED, status, reason, &message, generation, now);
    // Informational (clever-cloud.md §5): a dangling or refused catalogue does not block launches,
    // the built-in catalogue is served meanwhile, but the class says so.
    let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
    match (reference, &catalog) {
        (None, _) => {
            conditions::remove(&mut conds, FLAVOR_CATALOG_RESOLVED);
        }
        // Could not read it: keep what was last known.
        (Some(_), Lookup::Unchecked(_)) => {}
        (Some(_), lookup) => {
            let found = match lookup {
                Lookup::Found(fc) => Some(fc),
                _ => None,
            };
            match crds::catalog::served(&crds::catalog::Catalog::builtin(), reference, found).1 {
                None => conditions::set(
                    &mut conds,
                    FLAVOR_CATALOG_RESOLVED,
                    TRUE,
                    "FlavorCatalogServed",
                    "",
                    generation,
                    now,
                ),
                Some(problem) => {
                    let reason = match problem {
                        CatalogProblem::Missing { .. } => "FlavorCatalogNotFound",
                        CatalogProblem::Invalid { .. } => "FlavorCatalogInvalid",
                    };
                    conditions::set(
                        &mut conds,
                        FLAVOR_CATALOG_RESOLVED,
                        FALSE,
                        reason,
                        &problem.to_string(),
                        generation,
                        now,
                    )
                }
            };
        }
    }
    let ready = conditions::set_root_except(&mut conds, READY, &[FLAVOR_CATALOG_RESOLVED], generation, now);
    if class.status.as_ref().map(|s| &s.conditions) != Some(&conds) {
        let api: Api<CleverNodeClass> = Api::namespaced(hub.mgmt.clone(), &ns);
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": conds}})))
            .await
            .step(Step::WriteNodeClassStatus)?;
        tracing::info!(namespace = %ns, nodeclass = %name, ready, "node class status updated");
    }
    // While the probe fails, re-check every minute (clever-cloud.md §7.2).
    Ok(Action::requeue(if ready { Duration::from_secs(300) } else { Duration::from_secs(60) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_served_names_every_cluster_without_nodegroups() {
        assert_eq!(api_served(&[]).0, TRUE);
        let (s, r, m) = api_served(&[
            (ClusterKey::new("a", "one"), Phase::Connected),
            (ClusterKey::new("a", "two"), Phase::NodeGroupApiNotServed),
        ]);
        assert_eq!((s, r), (FALSE, "NodeGroupAPIUnavailable"));
        assert!(m.contains("a/two") && !m.contains("a/one"), "{m}");
    }
}
