//! `WorkloadCluster`: the hub's report on one registered workload cluster, in the namespace of its
//! registration Secret and under the cluster's name. What `karpenter-hub fleet` reads: everything
//! a fleet view needs from a cluster (reachability, nodes in all, pending pods, cost) without
//! reaching that cluster.
//!
//! Owns the API shape. Written by the hub only (its status, by the replica that owns the cluster);
//! the spec is empty, so the object is a report, not a setting. Removed with its registration Secret
//! (owner reference).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A registered workload cluster as the hub last saw it. Created by the hub; nothing to set.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "WorkloadCluster",
    plural = "workloadclusters",
    namespaced,
    status = "WorkloadClusterStatus",
    shortname = "wlc",
    category = "karpenter",
    doc = "WorkloadCluster is the hub's report on one registered workload cluster (the cluster registered by the Secret <name>-kubeconfig of its namespace). Written by the hub.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodes"),
    printcolumn(name = "By hub", type_ = "integer", json_path = ".status.hubNodes"),
    printcolumn(name = "Pending", type_ = "integer", json_path = ".status.pendingPods"),
    printcolumn(name = "EUR/h", type_ = "string", json_path = ".status.pricePerHour"),
    printcolumn(name = "Observed", type_ = "date", json_path = ".status.observedTime")
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadClusterSpec {}

/// What the hub saw of the cluster when it last wrote.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadClusterStatus {
    /// The hub's connection to the cluster: `Connected`, `Syncing`, `Unreachable`, `Unauthorized`,
    /// `InvalidKubeconfig`, `NodeGroupAPINotServed`, `DuplicateCluster`, `Paused` or `HandoverRefused`
    /// (the `ClusterReachable` reasons of its NodePools).
    #[schemars(length(max = 64))]
    pub phase: String,
    /// Why, in the hub's words, when the phase is not `Connected` (never text the cluster sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Nodes in the cluster, whoever made them (control plane and foreign nodes included); absent
    /// until the hub's caches of the cluster have synced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub nodes: Option<i64>,
    /// The hub's NodeClaims for the cluster that are not being deleted.
    #[schemars(range(min = 0))]
    pub hub_nodes: i64,
    /// Pods waiting for capacity (unschedulable, as the scheduler marked them); absent until synced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pending_pods: Option<i64>,
    /// The hub's NodeClaims for the cluster being deleted now (drained, then their NodeGroups
    /// removed): disruption or termination in progress.
    #[schemars(range(min = 0))]
    pub disrupting: i64,
    /// Catalogue price of the hub's launched NodeClaims for the cluster, EUR per hour, as a decimal
    /// string with four places (e.g. `0.1834`).
    #[schemars(length(max = 32))]
    pub price_per_hour: String,
    /// The hub replica that wrote this (sharded mode: the cluster's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub replica: Option<String>,
    /// When the hub wrote this. It rewrites it at least every few minutes while it serves the
    /// cluster, so an old time means no replica serves it.
    pub observed_time: Time,
}
