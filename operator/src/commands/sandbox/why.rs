//! Why a sandbox cluster has pods still pending, from what the hub and the cluster record: the
//! hub's `FailedScheduling` events on the pods (the scheduling decision's reason, e.g. a pool's
//! limits), the scheduler's `PodScheduled` condition, and each NodePool's conditions that are not
//! `True` and its limits against what its nodes use.
//!
//! Owns: reading those records and wording them for the sandbox's output. Must not: guess a reason
//! nothing recorded (a pod without one says so), or reach into the hub's internals.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{Pod, Secret},
    events::v1::Event,
};
use kube::{Api, ResourceExt, api::ListParams};

use crds::{
    NodePool,
    quantity::{Resources, format_bytes, format_millis_cpu},
};

use super::world::{SandboxError, World};
use crate::decisions::fleet;

/// The prefix of the hub's `FailedScheduling` notes: the reason follows.
const HUB_NOTE_PREFIX: &str = "karpenter-hub cannot provision a node for this pod: ";

/// What cluster `i` of `world` records about its pending pods and its NodePools, one line each
/// (pods with the same reason share a line). Empty when no pod is pending.
pub async fn why_pending(world: &World, i: usize) -> Result<Vec<String>, SandboxError> {
    let c = &world.clusters[i];
    let lp = ListParams::default();
    let pods = Api::<Pod>::namespaced(c.client(), "default").list(&lp).await?.items;
    let events = Api::<Event>::namespaced(c.client(), "default").list(&lp).await?.items;
    let pools = Api::<NodePool>::namespaced(world.mgmt.client(), &c.namespace).list(&lp).await?.items;
    // A fleet pool's selection is over the registration Secret's labels (the sandbox has no Cluster API).
    let secret =
        Api::<Secret>::namespaced(world.mgmt.client(), &c.namespace).get_opt(&format!("{}-kubeconfig", c.name)).await?;
    let labels = secret.and_then(|s| s.metadata.labels).unwrap_or_default();
    let pools: Vec<NodePool> = pools.into_iter().filter(|p| fleet::serves(p, &c.namespace, &c.name, &labels)).collect();
    Ok(explain(&pods, &events, &pools))
}

/// [`why_pending`] on given objects. Pure.
pub fn explain(pods: &[Pod], events: &[Event], pools: &[NodePool]) -> Vec<String> {
    let pending: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .collect();
    if pending.is_empty() {
        return Vec::new();
    }
    // Pods grouped by reason, in the order of their names.
    let mut by_reason: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut names: Vec<&Pod> = pending.clone();
    names.sort_by_key(|p| p.name_any());
    for pod in names {
        by_reason.entry(pod_reason(pod, events)).or_default().push(pod.name_any());
    }
    let mut out: Vec<String> =
        by_reason.into_iter().map(|(reason, pods)| format!("{} pending: {reason}", short_list(&pods))).collect();
    out.sort();
    for pool in pools {
        out.extend(pool_lines(pool));
    }
    out
}

/// The hub's latest `FailedScheduling` reason for the pod, else the scheduler's condition, else
/// that nothing is recorded yet.
fn pod_reason(pod: &Pod, events: &[Event]) -> String {
    let uid = pod.uid();
    let name = pod.name_any();
    let hub = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter(|e| e.reporting_controller.as_deref() == Some(crate::infra::hub::MANAGER))
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Pod")
                    && r.name.as_deref() == Some(name.as_str())
                    && (r.uid.is_none() || r.uid == uid)
            })
        })
        .max_by_key(|e| last_seen(e));
    if let Some(note) = hub.and_then(|e| e.note.as_deref()) {
        return format!("the hub cannot provision a node: {}", note.strip_prefix(HUB_NOTE_PREFIX).unwrap_or(note));
    }
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"));
    match scheduled {
        Some(c) => format!(
            "no node fits it yet ({}: {}); the hub recorded no reason against it, so a node may be on its way",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("")
        ),
        None => "not looked at by the scheduler yet".to_string(),
    }
}

/// When an event was last seen: its series' last observation, else its own time.
fn last_seen(e: &Event) -> Option<String> {
    let t = e.series.as_ref().map(|s| &s.last_observed_time.0).or(e.event_time.as_ref().map(|t| &t.0));
    t.map(|t| t.to_string()).or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()))
}

/// Bytes as a person reads them: `16Gi`, `15.2Gi`, `771Mi` (the API's `15875160Ki` is exact but
/// not readable at a glance).
fn human_bytes(bytes: i64) -> String {
    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;
    if bytes % GI == 0 || bytes % MI == 0 && bytes < GI {
        return format_bytes(bytes);
    }
    if bytes >= GI {
        return format!("{:.1}Gi", bytes as f64 / GI as f64);
    }
    format!("{}Mi", (bytes + MI - 1) / MI)
}

/// `a, b, c` or `a, b, c and 4 more`.
fn short_list(names: &[String]) -> String {
    const SHOWN: usize = 4;
    let shown = names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN { format!("{shown} and {} more", names.len() - SHOWN) } else { shown }
}

/// A pool's conditions that are not `True` (the informational `NodeRegistrationHealthy` included
/// only when `False`), and its limits against what its nodes use.
fn pool_lines(pool: &NodePool) -> Vec<String> {
    let who = format!("NodePool {}/{}", pool.namespace().unwrap_or_default(), pool.name_any());
    let mut out = Vec::new();
    let conditions = pool.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    for c in conditions {
        let quiet = c.status == "True" || (c.type_ == "NodeRegistrationHealthy" && c.status != "False");
        // The root `Ready` repeats another condition's reason: shown only when it says something.
        if quiet || (c.type_ == "Ready" && conditions.iter().any(|o| o.type_ != "Ready" && o.status == "False")) {
            continue;
        }
        let message = if c.message.is_empty() { String::new() } else { format!(": {}", c.message) };
        out.push(format!("{who}: {}={} ({}){message}", c.type_, c.status, c.reason));
    }
    let limits = pool.spec.limits.as_ref().and_then(|l| Resources::from_resource_list(l).ok().map(|r| (l, r)));
    if let Some((given, limit)) = limits {
        let used = pool
            .status
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| Resources::from_resource_list(r).ok())
            .unwrap_or(Resources::ZERO);
        let mut parts = Vec::new();
        if given.contains_key("cpu") {
            let (used, limit) = (used.cpu_millis, limit.cpu_millis);
            let left = format_millis_cpu((limit - used).max(0));
            parts.push(format!("cpu {} used of {} ({left} left)", format_millis_cpu(used), format_millis_cpu(limit)));
        }
        if given.contains_key("memory") {
            let (used, limit) = (used.memory_bytes, limit.memory_bytes);
            let left = human_bytes((limit - used).max(0));
            parts.push(format!("memory {} used of {} ({left} left)", human_bytes(used), human_bytes(limit)));
        }
        if !parts.is_empty() {
            out.push(format!("{who} limits: {}", parts.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}
        }))
        .unwrap()
    }

    fn hub_event(pod: &str, note: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{pod}.1"), "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reason": "FailedScheduling", "reportingController": "karpenter-hub", "reportingInstance": "",
            "action": "Provision", "type": "Warning", "note": format!("{HUB_NOTE_PREFIX}{note}"),
            "regarding": {"kind": "Pod", "namespace": "default", "name": pod, "uid": format!("uid-{pod}")}
        }))
        .unwrap()
    }

    fn pool() -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "default", "namespace": "team-a"},
            "spec": {"clusterName": "prod", "limits": {"memory": "16Gi"},
                     "template": {"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}}},
            "status": {"resources": {"cpu": "10", "memory": "15613Mi"}, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    #[test]
    fn pending_pods_are_grouped_by_the_reason_the_hub_recorded_and_the_pool_shows_its_limits() {
        let pods =
            [pod("web-10", "Pending"), pod("web-11", "Pending"), pod("web-1", "Running"), pod("web-12", "Pending")];
        let events = [
            hub_event("web-10", "nodepool default: limits memory 16Gi exhausted"),
            hub_event("web-11", "nodepool default: limits memory 16Gi exhausted"),
        ];
        let lines = explain(&pods, &events, &[pool()]);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(
            lines.contains(&"web-10, web-11 pending: the hub cannot provision a node: nodepool default: limits memory 16Gi exhausted".to_string()),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("web-12 pending: no node fits it yet (Unschedulable: 0/3 nodes are available)")),
            "{lines:#?}"
        );
        assert!(
            lines.contains(&"NodePool team-a/default limits: memory 15.2Gi used of 16Gi (771Mi left)".to_string()),
            "{lines:#?}"
        );
    }

    #[test]
    fn bytes_read_as_a_person_writes_them() {
        assert_eq!(human_bytes(16 << 30), "16Gi");
        assert_eq!(human_bytes(15_875_160 * 1024), "15.1Gi");
        assert_eq!(human_bytes(902_056 * 1024), "881Mi");
        assert_eq!(human_bytes(512 << 20), "512Mi");
        assert_eq!(human_bytes(0), "0");
    }

    #[test]
    fn nothing_is_said_when_no_pod_is_pending() {
        assert!(explain(&[pod("web-1", "Running")], &[], &[pool()]).is_empty());
    }
}
