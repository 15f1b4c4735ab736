//! `CapacityBuffer`: upstream's CapacityBuffer (`autoscaling.x-k8s.io/v1beta1`, as Karpenter 1.14
//! consumes it) for one workload cluster or a selection of them: room for a number of pods of a
//! given shape kept ready, so a burst does not wait for CKE's minutes of node creation.
//!
//! Owns the API shape and the checks a schema or CEL rule can express. Must not: resolve the
//! template, count replicas or place anything (pure decisions in the operator do).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, ResourceMap};
use crate::selector::ClusterSelector;

/// The only provisioning strategy (upstream's default): provision the buffer's pods as if they were
/// pending, so their room exists as running nodes.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";

/// Condition: the pod template resolved and the number of buffer pods is known.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// Condition: True when every buffer pod fits on existing or in-flight capacity in every cluster;
/// False while some need new nodes (`RequiresNewCapacity`).
pub const PROVISIONING: &str = "Provisioning";

/// Room for `replicas` pods shaped by a PodTemplate, kept ready in one workload cluster
/// (`spec.clusterName`) or in each cluster a selector matches.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    namespaced,
    status = "CapacityBufferStatus",
    shortname = "cbuf",
    category = "karpenter",
    doc = "CapacityBuffer keeps room for a number of pods of a given shape (a PodTemplate of its namespace) ready in one CKE workload cluster or in every registered cluster a selector matches: the hub provisions nodes for them as for the lowest-priority pending pods, and never consolidates that room away. Upstream's CapacityBuffer (autoscaling.x-k8s.io/v1beta1) for the hub.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Template", type_ = "string", json_path = ".spec.podTemplateRef.name"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ReadyForProvisioning\")].status"
    ),
    printcolumn(
        name = "Provisioning",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Provisioning\")].reason"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.clusterName) != has(self.clusterSelector)").message("set exactly one of spec.clusterName (the one workload cluster this buffer serves) and spec.clusterSelector (every registered cluster of this namespace whose labels match)"),
    validation = Rule::new("has(self.replicas) || has(self.limits)").message("set spec.replicas (how many buffer pods), spec.limits (as many pods as fit in these resources), or both (the smaller)")
)]
pub struct CapacityBufferSpec {
    /// Name of the one workload cluster the buffer serves (its registration Secret
    /// `<clusterName>-kubeconfig` in this namespace). Exactly one of `clusterName` and
    /// `clusterSelector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub cluster_name: Option<String>,
    /// Every registered cluster of this namespace whose labels match gets the buffer, counted per
    /// cluster. `{}` selects every registered cluster of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<ClusterSelector>,
    /// How the buffer is kept. Only `buffer.x-k8s.io/active-capacity` (upstream's default):
    /// nodes are made for the buffer's pods as if they were pending.
    #[serde(default = "default_strategy")]
    #[x_kube(validation = Rule::new("self == 'buffer.x-k8s.io/active-capacity'").message("provisioningStrategy: only buffer.x-k8s.io/active-capacity is supported"))]
    pub provisioning_strategy: String,
    /// The PodTemplate (`v1`, in this namespace) whose pod spec shapes one buffer pod: requests,
    /// node selector, affinity, tolerations and topology spread as the real pods would have. Its
    /// `template.metadata.namespace` (default `default`) is the workload namespace the buffer pods
    /// are taken to live in, for pod affinity and topology spread.
    pub pod_template_ref: LocalObjectRef,
    /// How many buffer pods to keep room for, per cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: Option<i32>,
    /// Keep room for as many buffer pods as these resources hold (`cpu`, `memory`, ...: per
    /// resource the limit divided by one pod's request, rounded down, the smallest counting);
    /// with `replicas` too, the smaller of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::resource_map")]
    pub limits: Option<ResourceMap>,
}

fn default_strategy() -> String {
    ACTIVE_CAPACITY.to_string()
}

/// A reference to an object of the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectRef {
    /// Name of the object.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
}

/// Observed state of a `CapacityBuffer`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    /// The PodTemplate the buffer pods were made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// Buffer pods kept per cluster (from `replicas` and `limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The PodTemplate's `metadata.generation` the pods were made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_generation: Option<i64>,
    /// The strategy applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    /// Per cluster served: how many buffer pods fit on existing or in-flight capacity, need new
    /// nodes, or cannot be placed, at the cluster's last provisioning round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<ClusterBuffer>,
    /// `ReadyForProvisioning` (the template resolved: `Resolved`; else `PodTemplateNotFound`,
    /// `InvalidPodTemplate`) and `Provisioning` (`FitsExistingCapacity`, `RequiresNewCapacity`,
    /// `BufferEmpty`, `NotReadyForProvisioning`, `NoCluster`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}

/// Where one cluster's buffer pods stood at its last provisioning round.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBuffer {
    /// The workload cluster.
    pub name: String,
    /// Buffer pods fitting on existing nodes or on NodeClaims not yet nodes.
    pub existing: i32,
    /// Buffer pods that needed a new node (claims made for them in that round).
    pub new_capacity: i32,
    /// Buffer pods no pool could place (limits, flavors, the organisation's room).
    pub unplaceable: i32,
}

impl CapacityBuffer {
    /// Whether this buffer serves the cluster `cluster` whose labels are `labels` (clusters of the
    /// buffer's own namespace only, as for NodePools).
    pub fn selects(&self, cluster: &str, labels: &std::collections::BTreeMap<String, String>) -> bool {
        crate::selector::targets(self.spec.cluster_name.as_ref(), self.spec.cluster_selector.as_ref(), cluster, labels)
    }
}
