//! `CleverOrganization`: one Clever Cloud organisation as the hub sees it (fleet.md §4, §5): which
//! registered clusters belong to it, the quota the platform enforces across them (every node of
//! every cluster, control plane included, by flavor size), and the cost ceiling across the
//! clusters' hub-launched nodes.
//!
//! Owns the API shape and the status ledger's data (per-cluster usage and the reservations of
//! launches about to be sent). Cluster-scoped: an organisation spans namespaces. The spec is the
//! user's; the status is the hub's, written under optimistic concurrency (every write carries the
//! resourceVersion it read), so concurrent launches of different clusters or replicas never spend
//! the same headroom. Must not: decide (that is the operator's `decisions::organization`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, ResourceMap};
use crate::selector::ClusterSelector;

/// A Clever Cloud organisation: the clusters that belong to it, its quota and its cost ceiling.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "CleverOrganization",
    plural = "cleverorganizations",
    status = "CleverOrganizationStatus",
    shortname = "corg",
    category = "karpenter",
    doc = "CleverOrganization declares one Clever Cloud organisation: the registered workload clusters that belong to it (by their labels), the quota Clever Cloud enforces across all their nodes (control plane included), and a cost ceiling across the nodes the hub launches for them. The hub never sends a NodeGroup create that would take the organisation above its quota.",
    printcolumn(name = "Clusters", type_ = "integer", json_path = ".status.clusterCount"),
    printcolumn(name = "CPU used", type_ = "string", json_path = ".status.used.cpu"),
    printcolumn(name = "CPU quota", type_ = "string", json_path = ".status.quota.cpu"),
    printcolumn(name = "Memory used", type_ = "string", json_path = ".status.used.memory"),
    printcolumn(name = "Memory quota", type_ = "string", json_path = ".status.quota.memory"),
    printcolumn(name = "EUR/h", type_ = "string", json_path = ".status.pricePerHour"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.quota) && (has(self.quota.cpu) || has(self.quota.memory))) || (has(self.limits) && size(self.limits) > 0)").message("set spec.quota (the organisation's vCPU and memory quota) or spec.limits (its cost ceiling, karpenter.clever-cloud.com/price-per-hour), or both: an organisation with neither limits nothing")
)]
pub struct CleverOrganizationSpec {
    /// The registered clusters that belong to this organisation, by their labels (the registration
    /// Secret's over the Cluster API `Cluster`'s). `{}` selects every registered cluster (of the
    /// namespaces `namespaceSelector` selects).
    pub cluster_selector: ClusterSelector,
    /// Only clusters registered in namespaces whose labels match; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<ClusterSelector>,
    /// The quota Clever Cloud enforces for the organisation, across every node of its clusters,
    /// control plane included: `cpu` in vCPUs, `memory` in bytes of nominal flavor size (`40G` is
    /// forty flavor gigabytes: an `XS` counts `8G`). An absent key is not limited by the hub
    /// (Clever Cloud may still refuse; the hub then learns the limit, see `status.observedQuota`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<OrganizationQuota>,
    /// Ceilings across the organisation's clusters; only `karpenter.clever-cloud.com/price-per-hour`
    /// (EUR per hour, a decimal string such as `"2.5"`), counting the nodes the hub launches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::resource_map")]
    #[x_kube(
        validation = Rule::new("self.all(k, k == 'karpenter.clever-cloud.com/price-per-hour')").message("spec.limits takes only karpenter.clever-cloud.com/price-per-hour (EUR per hour across the organisation's clusters); resource quotas go in spec.quota"),
        validation = Rule::new("self.all(k, string(self[k]).matches('^([0-9]{1,12}([.][0-9]{0,6})?|[.][0-9]{1,6})$'))").message("karpenter.clever-cloud.com/price-per-hour is EUR per hour as a decimal string, digits with at most 6 decimals, e.g. \"2.5\" (no exponent, sign or unit)")
    )]
    pub limits: Option<ResourceMap>,
}

/// An organisation's quota.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrganizationQuota {
    /// vCPUs (e.g. `40`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "quota_quantity")]
    pub cpu: Option<String>,
    /// Nominal memory (e.g. `40G`: forty flavor gigabytes, as Clever Cloud counts them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "quota_quantity")]
    pub memory: Option<String>,
}

/// What the hub knows of the organisation: usage, reservations, learned quota, per cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleverOrganizationStatus {
    /// Registered clusters selected.
    #[serde(default)]
    pub cluster_count: i64,
    /// Usage across the clusters: every Node by its flavor's size, NodeGroups not yet a Node, and
    /// reservations of launches about to be sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<QuotaAmount>,
    /// The part of `used` that is reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<QuotaAmount>,
    /// The quota the hub enforces: the smaller of `spec.quota` and `observedQuota`, per resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaAmount>,
    /// The quota learned from Clever Cloud's refusal messages (`Quota exceeded: RAM max: limit =
    /// 40.0 GB ...`). Forgotten when the spec changes (raise `spec.quota` after Clever Cloud raised
    /// the organisation's quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_quota: Option<ObservedQuota>,
    /// Catalogue price of the hub's nodes and launches across the clusters, EUR per hour (four places).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub price_per_hour: Option<String>,
    /// One entry per selected cluster, written by the replica that serves it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace", "name"]))]
    pub clusters: Vec<OrganizationCluster>,
    /// `QuotaExhausted` (True while launches wait for headroom, naming the clusters waiting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}

/// An amount of quota, as quantities (`cpu` in vCPUs, `memory` in bytes, e.g. `44G`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaAmount {
    /// vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub cpu: Option<String>,
    /// Bytes of nominal memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub memory: Option<String>,
}

/// A quota learned from a refusal.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedQuota {
    /// vCPUs, when a CPU refusal said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub cpu: Option<String>,
    /// Bytes, when a RAM refusal said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub memory: Option<String>,
    /// The cluster (`namespace/name`) whose launch was refused.
    #[schemars(length(max = 320))]
    pub cluster: String,
    /// When.
    pub observed_time: Time,
    /// The spec generation it was learned under; another generation ignores it.
    pub generation: i64,
}

/// One cluster's share of the organisation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrganizationCluster {
    /// Namespace of the registration.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// Cluster name.
    #[schemars(length(max = 63))]
    pub name: String,
    /// Nodes counted (control plane and foreign nodes included).
    pub nodes: i64,
    /// Nodes of a flavor the catalogue does not know, counted by their capacity.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unknown_flavor_nodes: i64,
    /// vCPU millicores of the nodes and of the hub's NodeGroups not yet a Node.
    pub cpu_millis: i64,
    /// Nominal memory bytes of the same.
    pub memory_bytes: i64,
    /// Catalogue price of the hub's nodes and NodeGroups not yet a Node, micro-EUR per hour.
    #[serde(default)]
    pub price_micros: i64,
    /// Launches about to be sent (not yet NodeGroups the hub sees).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub reservations: Vec<Reservation>,
    /// Pods waiting for headroom, when a launch of this cluster found none (fairness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// The hub replica that serves the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub replica: Option<String>,
    /// When the usage was counted.
    pub observed_time: Time,
}

/// The headroom one launch holds until its NodeGroup is seen (or refused).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The NodeGroup about to be created.
    #[schemars(length(max = 253))]
    pub group: String,
    /// Its flavor.
    #[schemars(length(max = 63))]
    pub flavor: String,
    /// vCPU millicores.
    pub cpu_millis: i64,
    /// Nominal memory bytes.
    pub memory_bytes: i64,
    /// Catalogue price, micro-EUR per hour.
    #[serde(default)]
    pub price_micros: i64,
    /// When it was taken.
    pub time: Time,
}

/// What a cluster waits for, when the organisation's headroom is short.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    /// The weight of the pool the launch is for.
    pub weight: i32,
    /// Since when (the oldest pending pod, or the first refused attempt).
    pub since: Time,
    /// When a launch last asked; a mark not renewed for a while is ignored.
    pub last: Time,
    /// vCPU millicores the launch needs.
    pub cpu_millis: i64,
    /// Nominal memory bytes the launch needs.
    pub memory_bytes: i64,
    /// The NodePools whose pods wait (their conditions name the organisation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 253)))]
    pub pools: Vec<String>,
}

/// A non-negative quantity.
fn quota_quantity(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 64,
        "pattern": crate::common::QUANTITY_PATTERN
    })
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &i64) -> bool {
    *v == 0
}
