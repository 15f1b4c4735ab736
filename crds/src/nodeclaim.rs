//! `NodeClaim`: Karpenter's v1 NodeClaim, namespaced, plus `spec.clusterName`. One NodeClaim is one
//! intended node; the hub realises it as one CKE `NodeGroup` with `nodeCount: 1`.
//!
//! Owns the API shape and its schema checks (the spec is immutable as a whole). Written by the hub
//! only; users read it. No lifecycle logic here.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, NodeClassReference, NodeSelectorRequirement, ResourceMap, Taint};

/// One node the hub decided to create (or created) in a workload cluster. The spec records the decision and is
/// immutable; the status follows the node through launch, registration and initialization.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    namespaced,
    status = "NodeClaimStatus",
    shortname = "nc",
    category = "karpenter",
    doc = "NodeClaim is one node the hub decided to create in a CKE workload cluster, realised as one NodeGroup with nodeCount 1.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
    printcolumn(name = "Type", type_ = "string", json_path = ".metadata.labels.node\\.kubernetes\\.io/instance-type"),
    printcolumn(name = "Capacity", type_ = "string", json_path = ".metadata.labels.karpenter\\.sh/capacity-type"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".metadata.labels.topology\\.kubernetes\\.io/zone"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "ID", type_ = "string", json_path = ".status.providerID", priority = 1),
    printcolumn(
        name = "NodePool",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/nodepool",
        priority = 1
    ),
    printcolumn(name = "NodeClass", type_ = "string", json_path = ".spec.nodeClassRef.name", priority = 1)
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("NodeClaim spec is immutable: delete the NodeClaim and let the hub create another"))]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// Workload cluster the node belongs to (the NodePool's `clusterName`).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub cluster_name: String,
    /// Taints put on the node at registration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key", "effect"]))]
    pub taints: Vec<Taint>,
    /// Taints put on the node at registration and expected to be removed by another agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key", "effect"]))]
    pub startup_taints: Vec<Taint>,
    /// Requirements the node satisfies; `node.kubernetes.io/instance-type In [...]` lists the flavors that may be
    /// launched, cheapest first.
    #[schemars(length(max = 100))]
    #[x_kube(
        validation = Rule::new("self.all(x, x.operator in ['In', 'NotIn'] ? (has(x.values) && size(x.values) != 0) : true)").message("requirements with operator In or NotIn must list at least one value"),
        validation = Rule::new("self.all(x, x.operator in ['Gt', 'Lt', 'Gte', 'Lte'] ? (has(x.values) && size(x.values) == 1 && x.values[0].matches('^[0-9]+$')) : true)").message("requirements with operator Gt, Lt, Gte or Lte must have a single non-negative integer value"),
        validation = Rule::new("self.all(x, (x.operator == 'In' && has(x.minValues)) ? (has(x.values) && size(x.values) >= x.minValues) : true)").message("requirements with minValues must list at least minValues values")
    )]
    pub requirements: Vec<NodeSelectorRequirement>,
    /// Resources the node must provide.
    #[serde(default)]
    pub resources: NodeClaimResources,
    /// The `CleverNodeClass` of the node.
    pub node_class_ref: NodeClassReference,
    /// How long a draining node may wait for its pods before they are deleted forcefully; unset waits forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub termination_grace_period: Option<String>,
    /// How long the node may live before it is replaced (`Never` disables expiry).
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub expire_after: String,
}

fn default_expire_after() -> String {
    crate::nodepool::DEFAULT_EXPIRE_AFTER.to_string()
}

/// Resources a NodeClaim asks for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NodeClaimResources {
    /// Sum of the requests of the pods planned onto the node, plus the DaemonSet overhead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::resource_map")]
    pub requests: Option<ResourceMap>,
}

/// Prefix of a CKE node's provider ID, `clevercloud://<nodegroup-name>` (the hub stamps it on the
/// Node from CKE's `clever-cloud.com/nodegroup` label, and sets it on the claim at launch).
pub const PROVIDER_ID_PREFIX: &str = "clevercloud://";

/// The provider ID of NodeGroup `nodegroup`'s node, `clevercloud://<nodegroup>`.
pub fn provider_id(nodegroup: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{nodegroup}")
}

/// Observed state of a NodeClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// `clevercloud://<nodegroup-name>`, set at launch.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Name of the Node once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Image of the node, when the platform reports one.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Capacity of the node (of its flavor until the Node reports its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::status_resource_map")]
    pub capacity: Option<ResourceMap>,
    /// Allocatable resources of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::status_resource_map")]
    pub allocatable: Option<ResourceMap>,
    /// `Launched`, `Registered`, `Initialized`, `Ready`, `Drifted`, `Consolidatable`, `Empty`, `DisruptionReason`,
    /// `Drained`, `VolumesDetached`, `InstanceTerminating`, `ConsistentStateFound`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
    /// Last time a pod was bound to the node or left it; the start of the `consolidateAfter` clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}
