//! The CapacityBuffer status controller (issue 28 item 2): each buffer's resolution
//! (`ReadyForProvisioning`, `replicas`, the template), one row per served cluster saying where its
//! last provisioning round put the buffer's pods, and `Provisioning` summed over the rows; the
//! `karpenter_hub_capacity_buffer_pods` gauge.
//!
//! Rows are written, as fleet pools' are, by the replica acting for each cluster (server-side
//! apply under its own field manager); the rest by the namespace writer from every row. Owns:
//! CapacityBuffer status, written only when it differs. Must not: place pods or create anything
//! (provisioning does, with the buffers' pods in its rounds), or read the API (the caches only).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::capacity_buffer::{self, Resolution},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::hub::Hub,
    infra::metrics::BufferLabels,
    infra::registry::ClusterKey,
};
use crds::{CapacityBuffer, capacitybuffer::ClusterBuffer};

/// How often buffers are looked at when nothing wakes the controller.
const PERIOD: Duration = Duration::from_secs(30);
/// Changes arriving together are written once.
const DEBOUNCE: Duration = Duration::from_millis(500);

/// Keep every buffer's status until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut placements = hub.buffer_changes();
    let mut scope = hub.cache.scope_changes();
    let mut clusters = hub.registry.changes();
    loop {
        if hub.cache.is_ready() {
            pass(&hub).await;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = placements.changed() => {}
            _ = scope.changed() => {}
            _ = clusters.changed() => {}
            () = tokio::time::sleep(PERIOD) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(DEBOUNCE) => {}
        }
    }
}

/// Every buffer once; a failure is counted, logged and retried on the next pass.
async fn pass(hub: &Hub) {
    let templates = hub.cache.pod_templates.state();
    let buffers = hub.cache.buffers.state();
    let mut gauged = BTreeSet::new();
    for buffer in &buffers {
        match reconcile(hub, buffer, &templates).await {
            Ok(labels) => gauged.extend(labels),
            Err(e) => {
                errors::count(hub, Reconciler::CapacityBuffer, None, &e);
                tracing::warn!(
                    namespace = %buffer.namespace().unwrap_or_default(), capacitybuffer = %buffer.name_any(),
                    step = e.step().label(), category = e.category().as_str(), error = %e,
                    "capacitybuffer status update failed; retrying"
                );
            }
        }
    }
    // Series of buffers gone, or of clusters this replica no longer acts for.
    hub.metrics.buffer_pods.forget_where(|l| !gauged.contains(l));
}

/// One buffer: its rows for the clusters this replica acts for, then (namespace writer) the
/// summary. Returns the gauge series it set.
async fn reconcile(
    hub: &Hub,
    buffer: &CapacityBuffer,
    templates: &[Arc<k8s_openapi::api::core::v1::PodTemplate>],
) -> Result<Vec<BufferLabels>, ApiError> {
    let ns = buffer.namespace().unwrap_or_default();
    let name = buffer.name_any();
    let key = format!("{ns}/{name}");
    let resolution = capacity_buffer::resolve(buffer, templates);
    let served: Vec<ClusterKey> = hub
        .registry
        .registered()
        .into_iter()
        .filter(|k| k.namespace == ns && buffer.selects(&k.name, &hub.registry.labels(k)))
        .collect();
    let ready = matches!(resolution, Resolution::Ready(_));
    let mine: Vec<ClusterBuffer> = served
        .iter()
        .filter(|k| ready && hub.registry.writes_for(k))
        .filter_map(|k| hub.buffer_placement(k, &key).map(|p| capacity_buffer::row(&k.name, p)))
        .collect();
    let mut gauged = Vec::new();
    for row in &mine {
        for (placement, n) in [("existing", row.existing), ("new", row.new_capacity), ("unplaceable", row.unplaceable)]
        {
            let labels = BufferLabels {
                cluster: format!("{ns}/{}", row.name),
                capacitybuffer: name.clone(),
                placement: placement.to_string(),
            };
            hub.metrics.buffer_pods.get(&labels).set(i64::from(n));
            gauged.push(labels);
        }
    }
    let status = buffer.status.clone().unwrap_or_default();
    let api: Api<CapacityBuffer> = Api::namespaced(hub.mgmt.clone(), &ns);
    let differs = mine.iter().any(|row| status.clusters.iter().find(|r| r.name == row.name) != Some(row));
    let mine_names: BTreeSet<&str> = mine.iter().map(|r| r.name.as_str()).collect();
    // Rows of clusters this replica acts for that it no longer has (the buffer left the cluster,
    // or its template stopped resolving): the apply without them removes them.
    let stale = status
        .clusters
        .iter()
        .any(|r| !mine_names.contains(r.name.as_str()) && hub.registry.writes_for(&ClusterKey::new(&ns, &r.name)));
    if differs || stale {
        let apply = json!({
            "apiVersion": CapacityBuffer::api_version(&()), "kind": "CapacityBuffer",
            "metadata": {"name": name, "namespace": ns},
            "status": {"clusters": mine},
        });
        api.patch_status(&name, &PatchParams::apply(&hub.rows_manager("buffer-rows")).force(), &Patch::Apply(&apply))
            .await
            .step(Step::WriteCapacityBufferStatus)?;
    }
    if !hub.registry.is_namespace_writer() {
        return Ok(gauged);
    }
    // The summary, from every row: this replica's fresh ones, the others' as the buffer shows them.
    let rows: Vec<ClusterBuffer> =
        served.iter().filter_map(|k| mine.iter().chain(&status.clusters).find(|r| r.name == k.name).cloned()).collect();
    let names: Vec<String> = served.iter().map(|k| k.name.clone()).collect();
    let mut conds = status.conditions.clone();
    let generation = buffer.metadata.generation;
    capacity_buffer::set_conditions(&mut conds, &resolution, &names, &rows, generation, hub.now());
    let (replicas, template_generation) = match &resolution {
        Resolution::Ready(r) => (Some(r.replicas), r.generation),
        Resolution::NotReady { .. } => (None, None),
    };
    let summary = json!({
        "conditions": conds,
        "replicas": replicas,
        "podTemplateRef": capacity_buffer::template_ref(buffer, &resolution),
        "podTemplateGeneration": template_generation,
        "provisioningStrategy": buffer.spec.provisioning_strategy,
    });
    let current = serde_json::to_value(&status).unwrap_or_default();
    let null = serde_json::Value::Null;
    let changed = ["conditions", "replicas", "podTemplateRef", "podTemplateGeneration", "provisioningStrategy"]
        .iter()
        .any(|k| current.get(*k).unwrap_or(&null) != summary.get(*k).unwrap_or(&null));
    if changed {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": summary})))
            .await
            .step(Step::WriteCapacityBufferStatus)?;
        let provisioning = conds.iter().find(|c| c.type_ == crds::capacitybuffer::PROVISIONING);
        tracing::info!(
            namespace = %ns, capacitybuffer = %name, replicas = replicas.unwrap_or(0), clusters = names.len(),
            provisioning = provisioning.map(|c| c.reason.as_str()).unwrap_or_default(),
            "capacitybuffer status updated"
        );
    }
    Ok(gauged)
}
