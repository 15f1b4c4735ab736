//! The drain's I/O (karpenter-semantics §5.2–5.4): the `karpenter.sh/disrupted` taint and the
//! load-balancer exclusion label, the forced deletions and evictions of one pass of
//! [`termination::decide`], with a back-off per pod after a PodDisruptionBudget refuses.
//!
//! Owns: those writes and the events on blocking pods and the Node. Must not: choose which pods go
//! or when (termination's decision), or evict anything but exactly the pod decided (UID precondition).

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, Pod, Taint},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::json;

use super::Claim;
use crate::{
    decisions::termination::{self, Attachment, Decision, PodRef},
    infra::{hub::Hub, registry::Connection},
};
use crds::labels;

/// Eviction refusals per pod (cluster, pod): how many so far and when the next attempt may go, on
/// the hub's clock. The lifecycle controller's own memory, in memory on purpose: after a restart
/// the first attempt simply comes sooner, and the API answers it the same way.
#[derive(Debug, Default)]
pub(super) struct Refusals(
    pub(super) std::sync::Mutex<std::collections::HashMap<(String, PodRef), (u32, k8s_openapi::jiff::Timestamp)>>,
);

/// The VolumeAttachments of `node`, each with the claim bound to its PersistentVolume (§5.2 step 6).
/// A cluster that does not serve VolumeAttachments has none.
pub(super) async fn volume_attachments(conn: &Connection, node: &str) -> Result<Vec<Attachment>, kube::Error> {
    let api: Api<VolumeAttachment> = Api::all(conn.client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let volumes: Api<PersistentVolume> = Api::all(conn.client.clone());
    let mut out = Vec::new();
    for va in list.into_iter().filter(|va| va.spec.node_name == node) {
        let volume = va.spec.source.persistent_volume_name.clone();
        let claim = match &volume {
            Some(pv) => volumes.get_opt(pv).await?.and_then(|pv| {
                let r = pv.spec?.claim_ref?;
                Some((r.namespace?, r.name?))
            }),
            None => None,
        };
        out.push(Attachment { name: va.name_any(), volume, claim });
    }
    Ok(out)
}

/// Taint the Node `karpenter.sh/disrupted:NoSchedule` (overwriting any taint of that key) and label
/// it out of external load balancers. `false` when the Node is gone.
pub(super) async fn taint(conn: &Connection, node: &Node) -> Result<bool, kube::Error> {
    let nodes: Api<Node> = Api::all(conn.client.clone());
    let mut taints: Vec<Taint> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.retain(|t| t.key != labels::DISRUPTED_TAINT);
    taints.push(Taint { key: labels::DISRUPTED_TAINT.into(), effect: "NoSchedule".into(), ..Taint::default() });
    // The resourceVersion makes a concurrent change fail and retry instead of being overwritten.
    let patch = json!({
        "metadata": {
            "labels": {labels::EXCLUDE_FROM_LB: termination::EXCLUDE_FROM_LB_VALUE},
            "resourceVersion": node.resource_version(),
        },
        "spec": {"taints": taints},
    });
    match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The writes of one drain pass: forced deletions, then evictions (each with a UID precondition).
/// Failures are reported and retried by the next pass, never fatal to it.
pub(super) async fn carry_out(c: &Claim<'_>, hub: &Hub, conn: &Connection, node: &Node, decision: &Decision) {
    let node_ref = node.object_ref(&());
    let pod_ref = |p: &PodRef| crate::infra::hub::pod_reference(&p.namespace, &p.name, &p.uid);
    let exactly = |p: &PodRef| Some(Preconditions { uid: Some(p.uid.clone()), resource_version: None });
    // §5.4: the claim's DisruptionReason when a disruption command took it, else a forceful termination.
    let recorded =
        crate::decisions::disruption_queue::Recorded::on(c.obj.annotations()).map(|r| format!("{:?}", r.reason));
    let reason = recorded.as_deref().unwrap_or("Forceful Termination");
    for (p, grace) in &decision.force {
        let pods: Api<Pod> = Api::namespaced(conn.client.clone(), &p.namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(u32::try_from(*grace).unwrap_or(u32::MAX)),
            preconditions: exactly(p),
            ..DeleteParams::default()
        };
        match pods.delete(&p.name, &dp).await {
            Ok(_) => {
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, pod = %p, grace_seconds = grace, "termination grace period reached; pod deleted");
                hub.metrics.pods_drained.get(&c.disrupted(reason)).inc();
                let note = format!("deleted with a grace period of {grace}s: the node's termination grace period ends");
                hub.workload_event(
                    &conn.client,
                    &pod_ref(p),
                    crate::infra::hub::event(true, "ForceDeleted", "Delete", note),
                    crate::infra::hub::EVENT_DEDUPE,
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(cluster = %c.key, nodeclaim = %c.name, pod = %p, error = %crate::infra::apierror::plain(&e), "deleting a pod at the termination deadline failed; retrying");
            }
        }
    }
    for (p, _) in decision.waiting.iter().filter(|(_, w)| *w == termination::Wait::DoNotDisrupt) {
        let note = format!(
            "node {} (NodeClaim {}) is draining and waits for this pod: karpenter.sh/do-not-disrupt keeps it until \
             it ends, the annotation is removed, or the claim's termination grace period runs out",
            node.name_any(),
            c.name
        );
        hub.workload_event(
            &conn.client,
            &pod_ref(p),
            crate::infra::hub::event(false, "DisruptionBlocked", "Drain", note),
            crate::infra::hub::EVENT_DEDUPE,
        )
        .await;
    }
    let now = hub.now();
    let refusals = || c.refusals.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Entries not refreshed for a minute belong to pods that went some other way (a refused pod is
    // retried every 10 s at most).
    refusals().retain(|_, (_, next)| next.checked_add(Duration::from_secs(60)).is_ok_and(|t| t > now));
    for p in &decision.evict {
        let key = (c.key.to_string(), p.clone());
        if refusals().get(&key).is_some_and(|(_, next)| *next > now) {
            continue;
        }
        let result = evict_exactly(&conn.evictions, p).await;
        let code = match &result {
            Ok(_) => 200,
            Err(kube::Error::Api(s)) => s.code,
            Err(_) => 0,
        };
        hub.metrics
            .eviction_requests
            .get(&crate::infra::metrics::ResultLabels { cluster: c.key.to_string(), result: code.to_string() })
            .inc();
        match result {
            Ok(_) => {
                refusals().remove(&key);
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), pod = %p, "pod evicted");
                hub.metrics.pods_drained.get(&c.disrupted(reason)).inc();
                let note = format!("evicted from node {} (NodeClaim {})", node.name_any(), c.name);
                hub.workload_event(
                    &conn.client,
                    &pod_ref(p),
                    crate::infra::hub::event(false, termination::EVICTED, "Evict", note),
                    crate::infra::hub::EVENT_DEDUPE,
                )
                .await;
            }
            // Already gone, or a newer pod of that name: done with this one.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                refusals().remove(&key);
            }
            // A PodDisruptionBudget refuses (429), or the pod has more than one (500 with that message).
            Err(kube::Error::Api(s)) if s.code == 429 || s.message.contains("more than one PodDisruptionBudget") => {
                let failures = {
                    let mut r = refusals();
                    let entry = r.entry(key).or_insert((0, now));
                    entry.0 = entry.0.saturating_add(1);
                    entry.1 = now.checked_add(termination::eviction_backoff(entry.0)).unwrap_or(now);
                    entry.0
                };
                // In the hub's own words: the server's message is any text it chose (docs/security.md);
                // the log has it at debug.
                let why = if s.code == 429 {
                    "a PodDisruptionBudget allows no eviction now (HTTP 429)"
                } else {
                    "the pod is selected by more than one PodDisruptionBudget, which the eviction API refuses (HTTP 500)"
                };
                tracing::debug!(cluster = %c.key, nodeclaim = %c.name, pod = %p, message = %s.message, "eviction refused by the workload API server");
                let note = format!("cannot evict pod {p}: {why}");
                // Also where the pod's owner looks (`kubectl describe pod`).
                let on_pod =
                    format!("eviction refused while draining node {} (NodeClaim {}): {why}", node.name_any(), c.name);
                hub.workload_event(
                    &conn.client,
                    &pod_ref(p),
                    crate::infra::hub::event(true, termination::FAILED_DRAINING, "Drain", on_pod),
                    crate::infra::hub::EVENT_DEDUPE,
                )
                .await;
                if hub
                    .workload_event(
                        &conn.client,
                        &node_ref,
                        crate::infra::hub::event(true, termination::FAILED_DRAINING, "Drain", note),
                        crate::infra::hub::EVENT_DEDUPE,
                    )
                    .await
                {
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), pod = %p, failures, why, "eviction refused; backing off");
                }
            }
            Err(e) => {
                tracing::warn!(cluster = %c.key, nodeclaim = %c.name, pod = %p, error = %crate::infra::apierror::plain(&e), "eviction failed; retrying");
            }
        }
    }
}

/// POST an Eviction for exactly this pod (UID precondition), so a PodDisruptionBudget is honoured
/// and a newer pod of the same name is never hit. Written out rather than through kube's
/// `Api::evict`, whose body names the field `delete_options` where the API expects
/// `deleteOptions`: the server drops it, and the precondition with it.
pub async fn evict_exactly(client: &kube::Client, p: &PodRef) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": p.name, "namespace": p.namespace},
        "deleteOptions": {"preconditions": {"uid": p.uid}},
    });
    pods.create_subresource::<_, serde_json::Value>("eviction", &p.name, &PostParams::default(), &eviction).await?;
    Ok(())
}
