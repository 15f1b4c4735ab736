//! The FlavorCatalog status controller (clever-cloud.md §5 "A bad catalogue never crashes the
//! hub"): `Ready` False with the first refused entry and field when the catalogue cannot be used
//! (the node classes referencing it are served the built-in catalogue meanwhile), `flavorCount`
//! served, an event when readiness changes, and the `instancetype_flavors_config_invalid` gauge.
//!
//! Owns: FlavorCatalog status and that gauge. Must not: change the spec or decide which catalogue a
//! launch uses (that is [`crds::catalog::served`], shared with scheduling).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, watcher},
};
use serde_json::json;

use crate::{
    decisions::conditions::{self, FALSE, TRUE},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::hub::Hub,
    infra::metrics::CatalogLabels,
};
use crds::{
    FlavorCatalog,
    catalog::{Catalog, CatalogProblem, served},
};

pub const READY: &str = "Ready";

/// What stops a reconcile (retried after 10 s): only a request, which says its step.
pub type Error = ApiError;

pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let catalogs: Api<FlavorCatalog> = hub.scoped();
    Controller::new(catalogs, watcher::Config::default())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, hub)
        .for_each(|_| async {})
        .await;
}

/// A failed reconcile: counted (a catalogue is no cluster's), logged with its step and category,
/// and retried after 10 s.
fn error_policy(fc: Arc<FlavorCatalog>, e: &Error, hub: Arc<Hub>) -> Action {
    errors::count(&hub, Reconciler::FlavorCatalog, None, e);
    tracing::warn!(namespace = %fc.namespace().unwrap_or_default(), flavorcatalog = %fc.name_any(), step = e.step().label(), category = e.category().as_str(), error = %e, "flavor catalogue reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

/// The Ready condition and flavor count of a catalogue. Pure.
pub fn judge(fc: &FlavorCatalog) -> (bool, &'static str, String, usize) {
    let name = fc.name_any();
    match served(&Catalog::builtin(), Some(&name), Some(fc)) {
        (c, None) => (true, "Valid", c.warnings.join("; "), c.flavors.len()),
        (c, Some(CatalogProblem::Invalid { reason, .. })) => (
            false,
            "Invalid",
            format!("{reason}; the node classes referencing it are served the built-in catalogue until it is fixed"),
            c.flavors.len(),
        ),
        (c, Some(p)) => (false, "Invalid", p.to_string(), c.flavors.len()),
    }
}

async fn reconcile(fc: Arc<FlavorCatalog>, hub: Arc<Hub>) -> Result<Action, Error> {
    let ns = fc.namespace().unwrap_or_default();
    let name = fc.name_any();
    let (ready, reason, message, count) = judge(&fc);
    hub.metrics
        .catalog_invalid
        .get_or_create(&CatalogLabels { flavorcatalog: format!("{ns}/{name}") })
        .set(i64::from(!ready));
    let mut conds = fc.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let was_ready = conditions::get(&conds, READY).map(|c| c.status == TRUE);
    conditions::set(
        &mut conds,
        READY,
        if ready { TRUE } else { FALSE },
        reason,
        &message,
        fc.metadata.generation,
        hub.now(),
    );
    if was_ready != Some(ready) {
        if ready {
            tracing::info!(namespace = %ns, flavorcatalog = %name, flavors = count, "flavor catalogue served");
        } else {
            tracing::warn!(namespace = %ns, flavorcatalog = %name, why = %message, "flavor catalogue refused; the built-in catalogue is served instead");
        }
        let event_reason = if ready { "FlavorCatalogReady" } else { "FlavorCatalogInvalid" };
        hub.event(&fc.object_ref(&()), !ready, event_reason, "Validate", message.clone()).await;
    }
    let status = json!({"conditions": conds, "flavorCount": count});
    let current = serde_json::to_value(&fc.status).unwrap_or_default();
    if current.get("conditions") != status.get("conditions") || current.get("flavorCount") != status.get("flavorCount")
    {
        Api::<FlavorCatalog>::namespaced(hub.mgmt.clone(), &ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
            .await
            .step(Step::WriteFlavorCatalogStatus)?;
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn fc(flavors: serde_json::Value) -> FlavorCatalog {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
            "metadata": {"name": "fc", "namespace": "a"}, "spec": {"flavors": flavors}
        }))
        .unwrap()
    }

    #[test]
    fn a_good_catalogue_is_ready_and_counts_its_flavors() {
        let (ready, reason, _, count) =
            judge(&fc(json!([{"name": "CPU-XS", "cpu": 8, "memoryKi": 4_000_000, "priceHourly": 0.07}])));
        assert!(ready);
        assert_eq!(reason, "Valid");
        assert_eq!(count, 7, "six built-ins plus the new one");
    }

    #[test]
    fn a_bad_catalogue_is_not_ready_names_the_entry_and_serves_the_built_ins() {
        let (ready, reason, message, count) = judge(&fc(json!([{"name": "HUGE", "cpu": 64}])));
        assert!(!ready);
        assert_eq!(reason, "Invalid");
        assert!(message.contains("spec.flavors[0]") && message.contains("built-in"), "{message}");
        assert_eq!(count, 6);
    }
}
