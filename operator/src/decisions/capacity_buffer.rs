//! CapacityBuffers (issue 28 item 2, upstream's CapacityBuffer): which buffers serve a cluster,
//! how many pods each keeps room for, the pods themselves (what provisioning and disruption place
//! as the lowest-priority pending pods), where a round put them, and the status that says so.
//!
//! Owns: template resolution, the replica count (upstream's: `replicas`, capped by what `limits`
//! hold), the pods' shape, placement counts and the conditions. Must not: read anything live,
//! write, or read the clock (`now` is passed).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use crds::{
    CapacityBuffer,
    capacitybuffer::{ClusterBuffer, LocalObjectRef, PROVISIONING, READY_FOR_PROVISIONING},
    common::Condition,
    quantity::parse_quantity,
};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use scheduling::{CompactPod, convert::BufferPod};

use crate::decisions::conditions::{self, FALSE, TRUE};

/// What a buffer's template resolved to.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// Pods can be made: `replicas` of them (per cluster), from `spec`.
    Ready(Resolved),
    /// No pod can be made; the `ReadyForProvisioning` reason and message.
    NotReady { reason: &'static str, message: String },
}

/// A resolved buffer.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `namespace/name` of the buffer.
    pub buffer: String,
    /// Buffer pods per cluster.
    pub replicas: i32,
    /// The template's generation.
    pub generation: Option<i64>,
    /// The pods (shared by every cluster the buffer serves).
    pub pods: Vec<BufferPod>,
}

/// Resolves `buffer` against the PodTemplates of its namespace (`templates`, any namespace:
/// filtered here).
pub fn resolve(buffer: &CapacityBuffer, templates: &[Arc<PodTemplate>]) -> Resolution {
    let ns = buffer.metadata.namespace.as_deref().unwrap_or_default();
    let name = buffer.metadata.name.as_deref().unwrap_or_default();
    let wanted = &buffer.spec.pod_template_ref.name;
    let Some(template) = templates.iter().find(|t| {
        t.metadata.namespace.as_deref().unwrap_or_default() == ns && t.metadata.name.as_deref() == Some(wanted)
    }) else {
        return Resolution::NotReady {
            reason: "PodTemplateNotFound",
            message: format!(
                "PodTemplate {wanted} not found in namespace {ns}: create it, or fix spec.podTemplateRef.name"
            ),
        };
    };
    let Some(spec) = template.template.as_ref().and_then(|t| t.spec.as_ref()) else {
        return Resolution::NotReady {
            reason: "InvalidPodTemplate",
            message: format!(
                "PodTemplate {wanted} has no template.spec: give it the pod spec the buffer keeps room for"
            ),
        };
    };
    let meta = template.template.as_ref().and_then(|t| t.metadata.as_ref());
    let workload_ns = meta.and_then(|m| m.namespace.clone()).filter(|n| !n.is_empty()).unwrap_or("default".into());
    let spec = Arc::new(sanitized(spec));
    let uid = buffer.metadata.uid.as_deref().unwrap_or(name);
    let make = |i: i32| CompactPod {
        metadata: ObjectMeta {
            name: Some(format!("capacity-buffer-{name}-{i}")),
            namespace: Some(workload_ns.clone()),
            uid: Some(format!("{uid}-{i}")),
            labels: meta.and_then(|m| m.labels.clone()),
            creation_timestamp: buffer.metadata.creation_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(spec.clone()),
        status: None,
    };
    // One pod, to read the requests `limits` divide.
    let probe = match scheduling::convert::pod_from(&make(1), &format!("PodTemplate {wanted}")) {
        Ok(p) => p,
        Err(e) => {
            return Resolution::NotReady {
                reason: "InvalidPodTemplate",
                message: format!("{}: {}: fix the PodTemplate", e.field, e.message),
            };
        }
    };
    let replicas = match replicas(buffer, &probe) {
        Ok(r) => r,
        Err(message) => return Resolution::NotReady { reason: "InvalidLimits", message },
    };
    let key = format!("{ns}/{name}");
    let pods = (1..=replicas).map(|i| BufferPod { buffer: key.clone(), pod: Arc::new(make(i)) }).collect();
    Resolution::Ready(Resolved { buffer: key, replicas, generation: template.metadata.generation, pods })
}

/// A template's spec as a buffer pod's: unbound, without the volumes that would tie it to storage
/// (a buffer keeps room, not claims), lowest priority (upstream's virtual pods).
fn sanitized(spec: &PodSpec) -> PodSpec {
    let mut spec = spec.clone();
    spec.node_name = None;
    spec.priority = Some(i32::MIN);
    let dropped: BTreeSet<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
        .map(|v| v.name.clone())
        .collect();
    if let Some(volumes) = &mut spec.volumes {
        volumes.retain(|v| !dropped.contains(&v.name));
    }
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        if let Some(mounts) = &mut c.volume_mounts {
            mounts.retain(|m| !dropped.contains(&m.name));
        }
    }
    spec
}

/// Upstream's count: `replicas`, and when `limits` are set, at most as many pods as they hold
/// (per resource a pod requests, the limit divided by the request, rounded down; the smallest).
/// Resources the pod does not request do not bound it.
pub fn replicas(buffer: &CapacityBuffer, pod: &scheduling::model::Pod) -> Result<i32, String> {
    let mut by_limits: Option<i64> = None;
    for (key, q) in buffer.spec.limits.iter().flatten() {
        let parsed = parse_quantity(q.0.trim())
            .map_err(|e| format!("spec.limits.{key}: {e}: use a quantity such as 4 or 8Gi"))?;
        let (limit, request) = match key.as_str() {
            "cpu" => (parsed.as_millis(), pod.requests.cpu_millis),
            "memory" => (parsed.as_units(), pod.requests.memory_bytes),
            "ephemeral-storage" => (parsed.as_units(), pod.requests.ephemeral_storage_bytes),
            "pods" => (parsed.as_units(), pod.requests.pods),
            other => (parsed.as_units(), pod.extended.get(other).copied().unwrap_or(0)),
        };
        if request <= 0 {
            continue;
        }
        let n = (limit / request).max(0);
        by_limits = Some(by_limits.map_or(n, |m| m.min(n)));
    }
    let count = match (buffer.spec.replicas.map(i64::from), by_limits) {
        (Some(r), Some(l)) => r.min(l),
        (Some(r), None) => r,
        (None, Some(l)) => l,
        (None, None) => 0,
    };
    // The schema bounds replicas to 10000; limits alone could ask for more.
    Ok(i32::try_from(count.clamp(0, MAX_PODS)).unwrap_or(0))
}

/// Most pods one buffer keeps per cluster (the schema's bound on `replicas`, applied to `limits`).
pub const MAX_PODS: i64 = 10_000;

/// Where one round put one buffer's pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placement {
    /// On existing nodes or claims in flight.
    pub existing: i32,
    /// On the round's new claims.
    pub new_capacity: i32,
    /// Nowhere.
    pub unplaceable: i32,
}

/// Per buffer (`namespace/name`), where `decision` put its pods of `input`.
pub fn placements(input: &scheduling::Input, decision: &scheduling::Decision) -> BTreeMap<String, Placement> {
    let mut out: BTreeMap<String, Placement> = BTreeMap::new();
    let mut count = |pod: usize, f: fn(&mut Placement)| {
        if let Some(b) = input.pods.get(pod).and_then(|p| p.buffer.as_ref()) {
            f(out.entry(b.clone()).or_default());
        }
    };
    for a in &decision.existing {
        for &p in &a.pods {
            count(p, |pl| pl.existing += 1);
        }
    }
    for c in &decision.new_claims {
        for &p in &c.pods {
            count(p, |pl| pl.new_capacity += 1);
        }
    }
    for u in &decision.unschedulable {
        count(u.pod, |pl| pl.unplaceable += 1);
    }
    out
}

/// A cluster's row of a buffer's status.
pub fn row(cluster: &str, placement: Placement) -> ClusterBuffer {
    ClusterBuffer {
        name: cluster.to_string(),
        existing: placement.existing,
        new_capacity: placement.new_capacity,
        unplaceable: placement.unplaceable,
    }
}

/// The conditions of a buffer from its resolution and the rows of the clusters it serves
/// (`served`: their names; a served cluster without a row has had no round yet).
pub fn set_conditions(
    conds: &mut Vec<Condition>,
    resolution: &Resolution,
    served: &[String],
    rows: &[ClusterBuffer],
    generation: Option<i64>,
    now: Timestamp,
) {
    let replicas = match resolution {
        Resolution::NotReady { reason, message } => {
            conditions::set(conds, READY_FOR_PROVISIONING, FALSE, reason, message, generation, now);
            let message = "the buffer's pod template is not resolved (see ReadyForProvisioning)";
            conditions::set(conds, PROVISIONING, FALSE, "NotReadyForProvisioning", message, generation, now);
            return;
        }
        Resolution::Ready(r) => {
            conditions::set(conds, READY_FOR_PROVISIONING, TRUE, "Resolved", "Pod template resolved", generation, now);
            r.replicas
        }
    };
    if replicas == 0 {
        let message = "replicas (or what limits hold) is 0: no room is kept";
        conditions::set(conds, PROVISIONING, FALSE, "BufferEmpty", message, generation, now);
        return;
    }
    if served.is_empty() {
        let message = "the buffer serves no registered cluster (spec.clusterName or spec.clusterSelector)";
        conditions::set(conds, PROVISIONING, FALSE, "NoCluster", message, generation, now);
        return;
    }
    let mut needing = Vec::new();
    let mut unplaced = 0;
    let mut awaiting = 0;
    for name in served {
        match rows.iter().find(|r| &r.name == name) {
            None => awaiting += 1,
            Some(r) => {
                unplaced += r.unplaceable;
                if r.new_capacity > 0 || r.unplaceable > 0 || r.existing < replicas {
                    needing.push(format!(
                        "{name}: {}/{replicas} need new capacity, {} unplaceable",
                        r.new_capacity, r.unplaceable
                    ));
                }
            }
        }
    }
    if needing.is_empty() && awaiting == 0 {
        let message = format!(
            "{replicas} buffer pod(s) fit on existing or launching capacity in each of {} cluster(s)",
            served.len()
        );
        conditions::set(conds, PROVISIONING, TRUE, "FitsExistingCapacity", &message, generation, now);
    } else if needing.is_empty() {
        let message = format!("{awaiting} cluster(s) not looked at yet");
        conditions::set(conds, PROVISIONING, FALSE, "AwaitingRound", &message, generation, now);
    } else {
        needing.truncate(10);
        let reason = if unplaced > 0 { "Unplaceable" } else { "RequiresNewCapacity" };
        conditions::set(conds, PROVISIONING, FALSE, reason, &needing.join("; "), generation, now);
    }
}

/// The template reference a resolved buffer reports.
pub fn template_ref(buffer: &CapacityBuffer, resolution: &Resolution) -> Option<LocalObjectRef> {
    matches!(resolution, Resolution::Ready(_)).then(|| buffer.spec.pod_template_ref.clone())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn buffer(spec: serde_json::Value) -> CapacityBuffer {
        let mut s = json!({"clusterName": "c1", "podTemplateRef": {"name": "web"}});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CapacityBuffer",
            "metadata": {"name": "warm", "namespace": "demo", "uid": "u1"},
            "spec": s
        }))
        .unwrap()
    }

    fn template(ns: &str, cpu: &str) -> Arc<PodTemplate> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PodTemplate",
                "metadata": {"name": "web", "namespace": ns, "generation": 3},
                "template": {"metadata": {"namespace": "shop", "labels": {"app": "web"}}, "spec": {
                    "nodeName": "somewhere",
                    "containers": [{"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/d"}, {"name": "cfg", "mountPath": "/c"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}, {"name": "cfg", "configMap": {"name": "c"}}]
                }}
            }))
            .unwrap(),
        )
    }

    fn ready(r: Resolution) -> Resolved {
        match r {
            Resolution::Ready(r) => r,
            Resolution::NotReady { reason, message } => panic!("{reason}: {message}"),
        }
    }

    #[test]
    fn replicas_are_capped_by_what_the_limits_hold() {
        let t = [template("demo", "500m")];
        assert_eq!(ready(resolve(&buffer(json!({"replicas": 3})), &t)).replicas, 3);
        // 2 CPU hold four 500m pods; 3 replicas is the smaller.
        assert_eq!(ready(resolve(&buffer(json!({"replicas": 3, "limits": {"cpu": "2"}})), &t)).replicas, 3);
        assert_eq!(ready(resolve(&buffer(json!({"replicas": 9, "limits": {"cpu": "2"}})), &t)).replicas, 4);
        // Limits alone: the smallest of cpu (4) and memory (2 of 1Gi in 2.5Gi).
        assert_eq!(ready(resolve(&buffer(json!({"limits": {"cpu": "2", "memory": "2.5Gi"}})), &t)).replicas, 2);
        // A resource the pod does not request bounds nothing.
        assert_eq!(ready(resolve(&buffer(json!({"replicas": 2, "limits": {"nvidia.com/gpu": "1"}})), &t)).replicas, 2);
        assert_eq!(ready(resolve(&buffer(json!({"replicas": 0})), &t)).replicas, 0);
    }

    #[test]
    fn the_pods_are_the_template_unbound_without_storage() {
        let r = ready(resolve(&buffer(json!({"replicas": 2})), &[template("demo", "1")]));
        assert_eq!(r.buffer, "demo/warm");
        assert_eq!(r.generation, Some(3));
        let names: Vec<&str> = r.pods.iter().map(|p| p.pod.metadata.name.as_deref().unwrap()).collect();
        assert_eq!(names, ["capacity-buffer-warm-1", "capacity-buffer-warm-2"]);
        let pod = &r.pods[0].pod;
        assert_eq!(pod.metadata.namespace.as_deref(), Some("shop"), "the template's workload namespace");
        assert_eq!(pod.metadata.uid.as_deref(), Some("u1-1"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!((spec.node_name.as_deref(), spec.priority), (None, Some(i32::MIN)));
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["cfg"]);
        let mounts: Vec<&str> = spec.containers[0].volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
        assert_eq!(mounts, ["cfg"]);
        assert!(Arc::ptr_eq(r.pods[0].pod.spec.as_ref().unwrap(), r.pods[1].pod.spec.as_ref().unwrap()), "one spec");
    }

    #[test]
    fn an_unresolved_buffer_says_why() {
        let b = buffer(json!({"replicas": 1}));
        let reason = |r: Resolution| match r {
            Resolution::NotReady { reason, .. } => reason,
            Resolution::Ready(_) => "Ready",
        };
        assert_eq!(reason(resolve(&b, &[])), "PodTemplateNotFound");
        assert_eq!(reason(resolve(&b, &[template("other", "1")])), "PodTemplateNotFound", "another namespace's");
        assert_eq!(reason(resolve(&b, &[template("demo", "lots")])), "InvalidPodTemplate");
        let bad = buffer(json!({"limits": {"cpu": "many"}}));
        assert_eq!(reason(resolve(&bad, &[template("demo", "1")])), "InvalidLimits");
    }

    #[test]
    fn provisioning_says_whether_the_room_exists() {
        let t = [template("demo", "1")];
        let b = buffer(json!({"replicas": 2}));
        let res = resolve(&b, &t);
        let now: Timestamp = "2026-11-29T01:00:00Z".parse().unwrap();
        let reason_of = |conds: &[Condition]| {
            let c = conds.iter().find(|c| c.type_ == PROVISIONING).unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let served = vec!["c1".to_string()];
        let mut conds = Vec::new();
        set_conditions(&mut conds, &res, &served, &[], Some(1), now);
        assert_eq!(reason_of(&conds), (FALSE.into(), "AwaitingRound".into()));
        let fits = row("c1", Placement { existing: 2, ..Placement::default() });
        set_conditions(&mut conds, &res, &served, std::slice::from_ref(&fits), Some(1), now);
        assert_eq!(reason_of(&conds), (TRUE.into(), "FitsExistingCapacity".into()));
        let needs = row("c1", Placement { existing: 1, new_capacity: 1, unplaceable: 0 });
        set_conditions(&mut conds, &res, &served, &[needs], Some(1), now);
        assert_eq!(reason_of(&conds), (FALSE.into(), "RequiresNewCapacity".into()));
        let stuck = row("c1", Placement { existing: 1, new_capacity: 0, unplaceable: 1 });
        set_conditions(&mut conds, &res, &served, &[stuck], Some(1), now);
        assert_eq!(reason_of(&conds), (FALSE.into(), "Unplaceable".into()));
        set_conditions(&mut conds, &res, &[], &[fits], Some(1), now);
        assert_eq!(reason_of(&conds), (FALSE.into(), "NoCluster".into()));
        set_conditions(&mut conds, &resolve(&b, &[]), &served, &[], Some(1), now);
        assert_eq!(reason_of(&conds), (FALSE.into(), "NotReadyForProvisioning".into()));
        let ready = conds.iter().find(|c| c.type_ == READY_FOR_PROVISIONING).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), (FALSE, "PodTemplateNotFound"));
    }

    #[test]
    fn placements_count_buffer_pods_only() {
        let mut input = scheduling::testkit::input(
            vec![scheduling::testkit::pool("default")],
            vec![scheduling::testkit::pod("web", 1000, 1 << 28), scheduling::testkit::pod("b1", 1000, 1 << 28)],
        );
        input.pods[1].buffer = Some("demo/warm".into());
        let decision = scheduling::solve(&input);
        let p = placements(&input, &decision);
        assert_eq!(p.len(), 1);
        assert_eq!(p["demo/warm"], Placement { existing: 0, new_capacity: 1, unplaceable: 0 });
    }
}
