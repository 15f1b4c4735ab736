//! `sim::cke::objects`: the shapes the simulated CKE writes: NodeGroup statuses (conditions, phase,
//! quota message), the Nodes it creates (name, labels, taints, capacity, kubelet status) and the
//! status of pods its kubelets run.
//!
//! Owns the exact field layout (clever-cloud.md §1.3, §1.5, §1.6, §4). Must not do I/O or read a
//! clock: time comes in as an argument.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use crds::catalog::NodeShape;
use crds::labels;
use crds::nodegroup::{NodeGroup, NodeGroupCondition, NodeGroupStatus};
use serde_json::{Value, json};

use super::config::rng;
use super::quota::SimFlavor;

/// The finalizer CKE puts on NodeGroups (the platform's real name is not published; the hub must
/// not depend on it).
pub const FINALIZER: &str = "api.clever-cloud.com/nodegroup-cleanup";
/// Annotation on every Node the simulator made: the kubelet stand-in serves only those.
pub const SIMULATED_ANNOTATION: &str = "sim.clever-cloud.com/simulated";
/// Taint a kubelet registers its Node with until it is Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// Most nodes in one group (platform bound of `nodeCount`).
pub const MAX_NODE_COUNT: i32 = 16;
/// Role label value of control-plane nodes.
pub const ROLE_CONTROL_PLANE: &str = "control-plane";
/// The kubeadm role label of control-plane nodes, also the key of their `NoSchedule` taint.
pub const CONTROL_PLANE_ROLE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// RFC 3339 with seconds, as Kubernetes writes times.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Name of node `index` of a group: `<group>-node<index>`.
pub fn node_name(group: &str, index: i32) -> String {
    format!("{group}-node{index}")
}

/// The index of a node of `group` named `<group>-node<i>`.
pub fn node_index(group: &str, node: &str) -> Option<i32> {
    node.strip_prefix(group)?.strip_prefix("-node")?.parse().ok()
}

/// A NodeGroup condition.
fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
    generation: Option<i64>,
) -> NodeGroupCondition {
    NodeGroupCondition {
        type_: Some(type_.to_string()),
        status: Some(if status { "True" } else { "False" }.to_string()),
        last_transition_time: Some(now.to_string()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        observed_generation: generation,
    }
}

/// `new` conditions, keeping each one's `lastTransitionTime` from `old` when its status did not change.
fn carry_transitions(old: Option<&NodeGroupStatus>, mut new: Vec<NodeGroupCondition>) -> Vec<NodeGroupCondition> {
    let old = old.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    for c in &mut new {
        if let Some(prev) = old.iter().find(|o| o.type_ == c.type_)
            && prev.status == c.status
            && prev.last_transition_time.is_some()
        {
            c.last_transition_time.clone_from(&prev.last_transition_time);
        }
    }
    new
}

/// Status while CKE reconciles a new group: `ReconcileInProgress=True`, no phase.
pub fn status_in_progress(group: &NodeGroup, now: DateTime<Utc>) -> NodeGroupStatus {
    let now = timestamp(now);
    let generation = group.metadata.generation;
    NodeGroupStatus {
        conditions: Some(vec![condition(
            "ReconcileInProgress",
            true,
            "Reconciling",
            "NodeGroup is being reconciled",
            &now,
            generation,
        )]),
        target_node_count: Some(group.spec.node_count),
        ..NodeGroupStatus::default()
    }
}

/// Status of an accepted group: `Ready=True, reason=Synced`, `phase: Synced`, node counts, upstream id
/// and the echo of labels and taints.
pub fn status_accepted(group: &NodeGroup, now: DateTime<Utc>, nodes: i32, upstream_id: &str) -> NodeGroupStatus {
    let now = timestamp(now);
    let generation = group.metadata.generation;
    let conditions = vec![
        condition("Ready", true, "Synced", "NodeGroup is synced", &now, generation),
        condition("ReconcileInProgress", false, "Synced", "NodeGroup is synced", &now, generation),
        condition("ReconcileFailed", false, "Synced", "NodeGroup is synced", &now, generation),
    ];
    let mut conditions = carry_transitions(group.status.as_ref(), conditions);
    keep_terminating(group, &mut conditions);
    NodeGroupStatus {
        conditions: Some(conditions),
        phase: Some("Synced".to_string()),
        node_count: Some(nodes),
        target_node_count: Some(group.spec.node_count),
        upstream_id: Some(upstream_id.to_string()),
        labels: group.spec.labels.clone(),
        taints: group.spec.taints.clone(),
    }
}

/// Status of a group refused for quota: `phase: QuotaExceeded`, `ReconcileFailed=True,
/// reason=QuotaExceeded` with CKE's message, `Ready=False`.
pub fn status_quota_exceeded(group: &NodeGroup, now: DateTime<Utc>, message: &str) -> NodeGroupStatus {
    let now = timestamp(now);
    let generation = group.metadata.generation;
    NodeGroupStatus {
        conditions: Some(vec![
            condition("Ready", false, "QuotaExceeded", message, &now, generation),
            condition("ReconcileInProgress", false, "QuotaExceeded", message, &now, generation),
            condition("ReconcileFailed", true, "QuotaExceeded", message, &now, generation),
        ]),
        phase: Some("QuotaExceeded".to_string()),
        node_count: Some(0),
        target_node_count: Some(group.spec.node_count),
        ..NodeGroupStatus::default()
    }
}

/// Status of a group whose flavor the platform does not know: `ReconcileFailed=True,
/// reason=InvalidFlavor` (inferred: the platform's exact wording is not known), no phase.
pub fn status_invalid_flavor(group: &NodeGroup, now: DateTime<Utc>, known: &[SimFlavor]) -> NodeGroupStatus {
    let now = timestamp(now);
    let generation = group.metadata.generation;
    let names: Vec<&str> = known.iter().map(|f| f.name.as_str()).collect();
    let message = format!("Unknown flavor {:?}: expected one of {}", group.spec.flavor, names.join(", "));
    NodeGroupStatus {
        conditions: Some(vec![
            condition("Ready", false, "InvalidFlavor", &message, &now, generation),
            condition("ReconcileInProgress", false, "InvalidFlavor", &message, &now, generation),
            condition("ReconcileFailed", true, "InvalidFlavor", &message, &now, generation),
        ]),
        node_count: Some(0),
        target_node_count: Some(group.spec.node_count),
        ..NodeGroupStatus::default()
    }
}

fn keep_terminating(group: &NodeGroup, conditions: &mut Vec<NodeGroupCondition>) {
    let old = group.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    if let Some(t) = old.iter().find(|c| c.type_.as_deref() == Some("Terminating")) {
        conditions.push(t.clone());
    }
}

/// Whether the status already says `Terminating=True`.
pub fn has_terminating(group: &NodeGroup) -> bool {
    let conditions = group.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    conditions.iter().any(|c| c.type_.as_deref() == Some("Terminating") && c.status.as_deref() == Some("True"))
}

/// The current status plus `Terminating=True` (the group's deletion is in progress).
pub fn status_terminating(group: &NodeGroup, now: DateTime<Utc>) -> NodeGroupStatus {
    let now = timestamp(now);
    let mut status = group.status.clone().unwrap_or_default();
    let mut conditions = status.conditions.take().unwrap_or_default();
    conditions.retain(|c| c.type_.as_deref() != Some("Terminating"));
    conditions.push(condition(
        "Terminating",
        true,
        "Deleting",
        "NodeGroup is being deleted",
        &now,
        group.metadata.generation,
    ));
    status.conditions = Some(conditions);
    status
}

/// An upstream id for a group (`nodegroup_` + a UUID-shaped value drawn from the seed and the
/// group's name).
pub fn upstream_id(seed: u64, group: &str) -> String {
    let mut r = rng(seed, &format!("{group}/upstream"));
    let (a, b) = (r.next_u64(), r.next_u64());
    format!(
        "nodegroup_{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// A private IPv4 address drawn from the seed for `key` (`10.<a>.<b>.<c>`, never `.0`).
pub fn ip(seed: u64, key: &str, second_octet_base: u8) -> String {
    let v = rng(seed, key).next_u64();
    let a = second_octet_base.saturating_add((v & 0x0f) as u8);
    let b = ((v >> 8) & 0xff) as u8;
    let c = 1 + ((v >> 16) % 254) as u8;
    format!("10.{a}.{b}.{c}")
}

/// What a simulated Node is made from.
#[derive(Debug, Clone)]
pub struct NodeSpecInput<'a> {
    /// Node name.
    pub name: &'a str,
    /// The flavor.
    pub flavor: &'a SimFlavor,
    /// Group name (None for control-plane nodes).
    pub group: Option<&'a str>,
    /// `spec.labels` of the group.
    pub extra_labels: Option<&'a BTreeMap<String, String>>,
    /// `spec.taints` of the group as JSON objects `{key, value?, effect}`.
    pub taints: Vec<Value>,
    /// Whether the node joins Ready (control plane) or with `Ready=False` and the not-ready taint.
    pub ready: bool,
    /// Kubelet version.
    pub kubelet_version: &'a str,
    /// Seed (addresses, machine ids).
    pub seed: u64,
}

/// The Node as CKE's VM registers it (clever-cloud.md §1.6): kubelet labels, the platform's
/// `clever-cloud.com/*` labels, the group's labels and taints, no providerID, the flavor's
/// capacity and allocatable (kube-reserved 100Mi, eviction threshold 10 % of ephemeral storage).
pub fn node_object(input: &NodeSpecInput<'_>, now: DateTime<Utc>) -> Value {
    let mut labels: BTreeMap<String, String> = input.extra_labels.cloned().unwrap_or_default();
    for (k, v) in [
        (labels::HOSTNAME, input.name),
        (labels::ARCH, crds::catalog::ARCH_AMD64),
        (labels::OS, crds::catalog::OS_LINUX),
        ("beta.kubernetes.io/arch", crds::catalog::ARCH_AMD64),
        ("beta.kubernetes.io/os", crds::catalog::OS_LINUX),
        (labels::CLEVER_FLAVOR, input.flavor.name.as_str()),
        (
            labels::CLEVER_NODE_ROLE,
            if input.group.is_some() { crds::catalog::NODE_ROLE_WORKER } else { ROLE_CONTROL_PLANE },
        ),
    ] {
        labels.insert(k.to_string(), v.to_string());
    }
    if let Some(group) = input.group {
        labels.insert(labels::CLEVER_NODEGROUP.to_string(), group.to_string());
    }
    let mut taints = input.taints.clone();
    if !input.ready {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule", "timeAdded": timestamp(now)}));
    }
    let mut spec = json!({});
    if !taints.is_empty() {
        spec["taints"] = Value::Array(taints);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": input.name,
            "labels": labels,
            "annotations": {SIMULATED_ANNOTATION: "true", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": node_status(input, now),
    })
}

/// The kubelet's status of a simulated node (`Ready` as given).
pub fn node_status(input: &NodeSpecInput<'_>, now: DateTime<Utc>) -> Value {
    let capacity = NodeShape::capacity(input.flavor.cpu, input.flavor.memory_ki);
    let allocatable = capacity.saturating_sub(NodeShape::overhead()).floored_at_zero();
    let mut r = rng(input.seed, &format!("{}/machine", input.name));
    let machine_id = format!("{:016x}{:016x}", r.next_u64(), r.next_u64());
    let boot_id = format!("{:016x}", r.next_u64());
    json!({
        "capacity": capacity.to_resource_list(),
        "allocatable": allocatable.to_resource_list(),
        "conditions": node_conditions(input.ready, now),
        "addresses": [
            {"type": "InternalIP", "address": ip(input.seed, &format!("node/{}", input.name), 0)},
            {"type": "Hostname", "address": input.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "architecture": crds::catalog::ARCH_AMD64,
            "operatingSystem": crds::catalog::OS_LINUX,
            "osImage": "Ubuntu 24.04.2 LTS",
            "kernelVersion": "6.8.0-60-generic",
            "containerRuntimeVersion": "containerd://2.1.1",
            "kubeletVersion": input.kubelet_version,
            "kubeProxyVersion": input.kubelet_version,
            "machineID": machine_id,
            "systemUUID": machine_id,
            "bootID": boot_id,
        },
    })
}

/// A node's pressure conditions (all False) and `Ready`.
pub fn node_conditions(ready: bool, now: DateTime<Utc>) -> Value {
    let now = timestamp(now);
    let pressure = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "False", "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let ready = if ready {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
               "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady",
               "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ready,
    ])
}

/// The status a kubelet reports for a running pod: phase `Running`, every condition True, each
/// container running and ready.
pub fn pod_running_status(
    pod: &k8s_openapi::api::core::v1::Pod,
    host_ip: &str,
    pod_ip: &str,
    now: DateTime<Utc>,
) -> Value {
    let now = timestamp(now);
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let spec = pod.spec.as_ref();
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let containers: Vec<Value> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[])
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let id = format!("{:016x}", rng(0, &format!("{key}/{}", c.name)).next_u64());
            json!({
                "name": c.name, "image": image, "imageID": "", "containerID": format!("containerd://{id}"),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    json!({
        "phase": "Running",
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": now,
        "qosClass": qos_class(pod),
        "conditions": [
            cond("PodReadyToStartContainers"),
            cond("Initialized"),
            cond("Ready"),
            cond("ContainersReady"),
            cond("PodScheduled"),
        ],
        "containerStatuses": containers,
    })
}

/// The pod's QoS class (Guaranteed, Burstable or BestEffort), as the API server computes it
/// ([`crate::qos::qos_class`], over the spec as JSON).
pub fn qos_class(pod: &k8s_openapi::api::core::v1::Pod) -> &'static str {
    // Serialising a typed spec cannot fail; a missing spec reads as no containers.
    let spec = pod.spec.as_ref().and_then(|s| serde_json::to_value(s).ok()).unwrap_or(Value::Null);
    crate::qos::qos_class(&spec)
}

/// Namespace of the kubelets' heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// A kubelet's heartbeat Lease for a node (`kube-node-lease/<node>`, owned by the Node so it goes
/// with it), renewed at `now`.
pub fn node_lease(node: &str, node_uid: &str, duration: std::time::Duration, now: DateTime<Utc>) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": NODE_LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": duration.as_secs().max(1),
            "renewTime": now.to_rfc3339_opts(SecondsFormat::Micros, true),
        },
    })
}

/// The `PodScheduled=False, reason=Unschedulable` condition kube-scheduler writes; `since` keeps an
/// earlier transition time (the pod was already unschedulable), else `now`.
pub fn unschedulable_condition(message: &str, since: Option<&str>, now: DateTime<Utc>) -> Value {
    let transition = since.map_or_else(|| timestamp(now), str::to_string);
    json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
           "lastProbeTime": null, "lastTransitionTime": transition})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    fn group(spec: Value) -> NodeGroup {
        serde_json::from_value(json!({
            "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
            "metadata": {"name": "ng", "uid": "u1", "generation": 1},
            "spec": spec,
        }))
        .unwrap()
    }

    fn t0() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap()
    }

    #[test]
    fn verdict_shapes_are_read_as_the_hub_reads_them() {
        let g = group(json!({"flavor": "XS", "nodeCount": 1}));
        let mut in_progress = g.clone();
        in_progress.status = Some(status_in_progress(&g, t0()));
        assert_eq!(in_progress.verdict(), crds::nodegroup::Verdict::Pending);
        let mut accepted = g.clone();
        accepted.status = Some(status_accepted(&g, t0(), 0, "id"));
        assert!(accepted.is_accepted());
        assert_eq!(accepted.status.as_ref().unwrap().phase.as_deref(), Some("Synced"));
        let msg = "Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB";
        let mut rejected = g.clone();
        rejected.status = Some(status_quota_exceeded(&g, t0(), msg));
        assert_eq!(rejected.verdict(), crds::nodegroup::Verdict::QuotaRejected(Some(msg.to_string())));
        assert!(!rejected.is_accepted());
        let mut invalid = group(json!({"flavor": "HUGE", "nodeCount": 1}));
        invalid.status = Some(status_invalid_flavor(&invalid, t0(), &SimFlavor::builtins()));
        assert!(
            matches!(invalid.verdict(), crds::nodegroup::Verdict::Failed { reason: Some(r), .. } if r == "InvalidFlavor")
        );
        // Terminating keeps the verdict and adds the condition.
        let mut term = accepted.clone();
        term.status = Some(status_terminating(&accepted, t0()));
        assert!(term.is_accepted());
        assert!(has_terminating(&term));
    }

    #[test]
    fn transitions_keep_their_time() {
        let g = group(json!({"flavor": "XS", "nodeCount": 1}));
        let mut accepted = g.clone();
        accepted.status = Some(status_accepted(&g, t0(), 0, "id"));
        let later = t0() + chrono::Duration::seconds(30);
        let again = status_accepted(&accepted, later, 1, "id");
        let ready = again.conditions.unwrap().into_iter().find(|c| c.type_.as_deref() == Some("Ready")).unwrap();
        assert_eq!(ready.last_transition_time.as_deref(), Some("2026-01-01T00:00:00Z"));
    }

    #[test]
    fn node_has_cke_labels_capacity_and_taints() {
        let flavor = SimFlavor::builtins().into_iter().find(|f| f.name == "XS").unwrap();
        let extra = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let input = NodeSpecInput {
            name: "ng-node0",
            flavor: &flavor,
            group: Some("ng"),
            extra_labels: Some(&extra),
            taints: vec![json!({"key": "karpenter.sh/unregistered", "effect": "NoExecute"})],
            ready: false,
            kubelet_version: "v1.36.0",
            seed: 1,
        };
        let node: Node = serde_json::from_value(node_object(&input, t0())).unwrap();
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["clever-cloud.com/flavor"], "XS");
        assert_eq!(labels["clever-cloud.com/nodegroup"], "ng");
        assert_eq!(labels["clever-cloud.com/cluster-node-role"], "worker");
        assert_eq!(labels["kubernetes.io/hostname"], "ng-node0");
        assert_eq!(labels["team"], "a");
        assert!(!labels.contains_key("node.kubernetes.io/instance-type"), "CKE sets no instance-type label");
        let spec = node.spec.as_ref().unwrap();
        assert!(spec.provider_id.is_none(), "CKE leaves providerID empty");
        let taints: Vec<&str> = spec.taints.as_ref().unwrap().iter().map(|t| t.key.as_str()).collect();
        assert_eq!(taints, ["karpenter.sh/unregistered", NOT_READY_TAINT]);
        let status = node.status.as_ref().unwrap();
        let cap = status.capacity.as_ref().unwrap();
        let alloc = status.allocatable.as_ref().unwrap();
        assert_eq!(cap["cpu"].0, "6");
        assert_eq!(cap["memory"].0, "7937580Ki");
        assert_eq!(alloc["memory"].0, "7835180Ki");
        assert_eq!(cap["ephemeral-storage"].0, "40971488Ki");
        assert_eq!(alloc["ephemeral-storage"].0, "36874339Ki");
        assert_eq!(alloc["pods"].0, "110");
        let ready = status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
    }

    #[test]
    fn node_lease_shape() {
        let lease = node_lease("n", "u", std::time::Duration::from_secs(40), t0());
        let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(lease).unwrap();
        assert_eq!(lease.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert!(spec.renew_time.is_some());
    }

    #[test]
    fn names_and_ids() {
        assert_eq!(node_name("ng", 0), "ng-node0");
        assert_eq!(node_index("ng", "ng-node3"), Some(3));
        assert_eq!(node_index("ng", "ng-2-node0"), None);
        assert_eq!(upstream_id(1, "u"), upstream_id(1, "u"));
        assert_ne!(upstream_id(1, "u"), upstream_id(2, "u"));
        assert!(ip(3, "x", 0).starts_with("10."));
    }

    #[test]
    fn qos_classes() {
        let pod = |res: Value| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": res}]}}),
            )
            .unwrap()
        };
        assert_eq!(qos_class(&pod(json!({}))), "BestEffort");
        assert_eq!(qos_class(&pod(json!({"requests": {"cpu": "1"}}))), "Burstable");
        assert_eq!(qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))), "Guaranteed");
    }
}
