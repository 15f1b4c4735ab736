//! `NodePool`: Karpenter's v1 NodePool, namespaced, plus `spec.clusterName` (the workload cluster served).
//!
//! Owns the API shape, Karpenter's defaults and every check a CRD schema or CEL rule can express, so
//! that a management cluster without the webhook still rejects bad pools. Must not hold decision
//! logic (budgets at runtime, limits accounting): those are pure functions elsewhere.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Condition, NodeClassReference, NodeSelectorRequirement, ResourceMap, Taint};
use crate::selector::ClusterSelector;

/// Default `expireAfter`: 30 days, as upstream.
pub const DEFAULT_EXPIRE_AFTER: &str = "720h";
/// Default `consolidateAfter`, as upstream.
pub const DEFAULT_CONSOLIDATE_AFTER: &str = "0s";
/// Default budget, as upstream.
pub const DEFAULT_BUDGET_NODES: &str = "10%";

/// A NodePool sets constraints on the nodes the hub may create for one workload cluster (`spec.clusterName`)
/// or for each cluster a selector matches (`spec.clusterSelector`: a fleet pool), and on the pods that can run
/// on them. Field names and semantics follow Karpenter's `karpenter.sh/v1` NodePool.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "NodePool",
    plural = "nodepools",
    namespaced,
    status = "NodePoolStatus",
    shortname = "np",
    category = "karpenter",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.nodes"),
    doc = "NodePool is Karpenter's NodePool for one CKE workload cluster, or for every registered cluster of its namespace a selector matches (a fleet pool): the constraints on the nodes the hub may create there (flavors, labels, taints, limits), and how it may disrupt them.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.clusterName",
        description = "Workload cluster served (empty for a fleet pool)"
    ),
    printcolumn(
        name = "Clusters",
        type_ = "string",
        json_path = ".status.clustersReady",
        description = "Fleet pool: selected clusters whose instance of the pool is Ready / selected clusters"
    ),
    printcolumn(name = "NodeClass", type_ = "string", json_path = ".spec.template.spec.nodeClassRef.name"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodes"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".status.resources.cpu"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".status.resources.memory"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight", priority = 1),
    printcolumn(
        name = "Reachable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ClusterReachable\")].reason",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.clusterName) != has(self.clusterSelector)").message("set exactly one of spec.clusterName (the one workload cluster this pool serves) and spec.clusterSelector (every registered cluster of this namespace whose labels match: a fleet pool)"),
    validation = Rule::new("has(self.clusterName) == has(oldSelf.clusterName)").message("clusterName cannot be added or removed: a pool serves one named cluster or a selection for its whole life; create a new NodePool instead"),
    validation = Rule::new("!has(self.rollout) || has(self.clusterSelector)").message("rollout applies to fleet pools only (spec.clusterSelector): a pool naming one cluster has nothing to roll out cluster by cluster; remove spec.rollout"),
    validation = Rule::new("has(self.replicas) == has(oldSelf.replicas)").message("replicas cannot be added or removed: a pool is static (a fixed number of nodes) or dynamic (nodes for pending pods) for its whole life; create a new NodePool instead"),
    validation = Rule::new("!has(self.replicas) || !has(self.limits) || size(self.limits) == 0 || (size(self.limits) == 1 && 'nodes' in self.limits)").message("a static pool (spec.replicas) takes only limits.nodes: remove the other limits"),
    validation = Rule::new("!has(self.replicas) || !has(self.weight)").message("weight does not apply to a static pool (spec.replicas): it makes no node for pending pods; remove spec.weight")
)]
pub struct NodePoolSpec {
    /// Name of the one workload cluster this pool serves. The hub reaches it through the Secret
    /// `<clusterName>-kubeconfig` in this namespace (Cluster API convention). Immutable. Exactly one
    /// of `clusterName` and `clusterSelector` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("clusterName is immutable: create a new NodePool for another cluster"))]
    pub cluster_name: Option<String>,
    /// A fleet pool: serves every registered cluster of this namespace whose labels (its registration
    /// Secret's over its Cluster API `Cluster`'s) match, each as a `clusterName` pool of the same spec
    /// would, with `limits` and budgets counted per cluster. Mutable: a cluster that leaves the
    /// selection gets no new node from this pool, and its nodes are drifted (`ClusterNotSelected`)
    /// and replaced within its budgets, never deleted at once. `{}` selects every registered cluster
    /// of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<ClusterSelector>,
    /// Template of the NodeClaims (and so of the nodes) this pool creates.
    pub template: NodeClaimTemplate,
    /// How and when the hub may disrupt (consolidate, replace) this pool's nodes.
    #[serde(default)]
    pub disruption: Disruption,
    /// Ceiling on the resources of all nodes of this pool (`cpu`, `memory`, `nodes`, `pods`, extended resources),
    /// compared with node capacity, and on their cost: `karpenter.clever-cloud.com/price-per-hour` (EUR per hour
    /// at catalogue prices, a decimal string such as `"0.5"`). Counted per cluster for a fleet pool. An absent
    /// key is unlimited. The hub never creates a node that would take the pool above a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::resource_map")]
    pub limits: Option<ResourceMap>,
    /// Priority of this pool over others (1–100, higher first). A lower-weight pool is used only when every
    /// higher-weight pool cannot take a pod. Absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
    /// A static pool: keep exactly this many nodes in each cluster the pool serves, whatever the
    /// pods (upstream's static capacity). The hub makes no node for pending pods through it (they
    /// may still land on its nodes), never consolidates or empties its nodes, replaces drifted
    /// nodes within its `Drifted` budget (the replacements first) and an expired or deleted one
    /// after it goes;
    /// lowering it deletes the surplus (not yet launched first, then empty nodes, then those whose
    /// pods cost least to move). Only `limits.nodes` applies. Cannot be added or removed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
    /// Fleet pools only: roll a change of the pool's template out cluster by cluster instead of in
    /// every selected cluster at once. Without it, every cluster replaces its drifted nodes at once,
    /// each within its own budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// How a fleet pool's template changes reach its clusters (fleet.md §3).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Clusters replacing drifted nodes at once: a count (`"1"`) or a percentage of the selected clusters
    /// (`"25%"`, rounded up). A string, as budgets' `nodes`.
    #[serde(default = "default_max_clusters")]
    #[schemars(regex(pattern = r"^((100|[1-9][0-9]?)%|[1-9][0-9]*)$"))]
    pub max_clusters: String,
    /// Clusters to go first, in this order; the others follow by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), schema_with = "cluster_names")]
    pub order: Vec<String>,
    /// How long a cluster that finished stays healthy before the next one starts (`10m`, `1h`, `0s`).
    #[serde(default = "default_soak")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub soak: String,
}

/// Default `rollout.maxClusters`: one cluster at a time.
pub const DEFAULT_MAX_CLUSTERS: &str = "1";
/// Default `rollout.soak`.
pub const DEFAULT_SOAK: &str = "5m";

fn default_max_clusters() -> String {
    DEFAULT_MAX_CLUSTERS.to_string()
}

fn default_soak() -> String {
    DEFAULT_SOAK.to_string()
}

fn cluster_names(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 100,
        "items": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
    })
}

/// Template of the NodeClaims a pool creates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct NodeClaimTemplate {
    /// Labels and annotations put on the NodeClaims and their nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// Specification of the NodeClaims.
    pub spec: NodeClaimTemplateSpec,
}

/// Labels and annotations of the template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct TemplateMetadata {
    /// Labels put on every node of the pool. Keys under `karpenter.sh/` (except `karpenter.sh/capacity-type`) and
    /// `karpenter.clever-cloud.com/` (except `instance-cpu` and `instance-memory`) are reserved for the system, as
    /// are `karpenter.sh/nodepool` and `kubernetes.io/hostname`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "template_labels")]
    pub labels: BTreeMap<String, String>,
    /// Annotations put on every node of the pool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 100))]
    pub annotations: BTreeMap<String, String>,
}

fn template_labels(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 100,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": crate::common::LABEL_VALUE_PATTERN},
        "x-kubernetes-validations": [
            {"rule": "self.all(k, k != 'karpenter.sh/nodepool')", "message": "label \"karpenter.sh/nodepool\" is restricted: the hub sets it"},
            {"rule": "self.all(k, k != 'kubernetes.io/hostname')", "message": "label \"kubernetes.io/hostname\" is restricted: the kubelet sets it"},
            {"rule": "self.all(k, k == 'karpenter.sh/capacity-type' || !k.find('^([^/]+)').endsWith('karpenter.sh'))", "message": "label domain \"karpenter.sh\" is restricted (only karpenter.sh/capacity-type may be set)"},
            {"rule": "self.all(k, k in ['karpenter.clever-cloud.com/instance-cpu', 'karpenter.clever-cloud.com/instance-memory'] || !k.find('^([^/]+)').endsWith('karpenter.clever-cloud.com'))", "message": "label domain \"karpenter.clever-cloud.com\" is restricted: it carries the hub's ownership labels"},
            {"rule": "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))", "message": "label keys must be qualified names ([prefix/]name, e.g. team or example.com/team)"}
        ]
    })
}

/// Specification of the NodeClaims a pool creates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.taints) || !has(self.startupTaints) || self.taints.all(t, !self.startupTaints.exists(s, s.key == t.key && s.effect == t.effect))").message("a taint key and effect may appear only once across taints and startupTaints"))]
pub struct NodeClaimTemplateSpec {
    /// Taints put on every node of the pool; pods must tolerate them to land there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key", "effect"]))]
    pub taints: Vec<Taint>,
    /// Taints put on a node when it registers and expected to be removed by another agent (e.g. a CNI or a
    /// device plugin) once the node is ready. Pods need not tolerate them to be provisioned for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["key", "effect"]))]
    pub startup_taints: Vec<Taint>,
    /// Requirements that constrain the nodes of the pool (flavor, zone, capacity type, your own labels). A node
    /// must satisfy all of them.
    #[schemars(length(max = 100))]
    #[x_kube(
        validation = Rule::new("self.all(x, x.operator in ['In', 'NotIn'] ? (has(x.values) && size(x.values) != 0) : true)").message("requirements with operator In or NotIn must list at least one value"),
        validation = Rule::new("self.all(x, x.operator in ['Exists', 'DoesNotExist'] ? (!has(x.values) || size(x.values) == 0) : true)").message("requirements with operator Exists or DoesNotExist must not list values"),
        validation = Rule::new("self.all(x, x.operator in ['Gt', 'Lt', 'Gte', 'Lte'] ? (has(x.values) && size(x.values) == 1 && x.values[0].matches('^[0-9]+$')) : true)").message("requirements with operator Gt, Lt, Gte or Lte must have a single non-negative integer value"),
        validation = Rule::new("self.all(x, (x.operator == 'In' && has(x.minValues)) ? (has(x.values) && size(x.values) >= x.minValues) : true)").message("requirements with minValues must list at least minValues values"),
        validation = Rule::new("self.all(x, x.key != 'karpenter.sh/nodepool')").message("requirement key \"karpenter.sh/nodepool\" is restricted: the hub sets it"),
        validation = Rule::new("self.all(x, x.key != 'kubernetes.io/hostname')").message("requirement key \"kubernetes.io/hostname\" is restricted"),
        validation = Rule::new("self.all(x, x.key == 'karpenter.sh/capacity-type' || !x.key.find('^([^/]+)').endsWith('karpenter.sh'))").message("label domain \"karpenter.sh\" is restricted (only karpenter.sh/capacity-type may be required)"),
        validation = Rule::new("self.all(x, x.key in ['karpenter.clever-cloud.com/instance-cpu', 'karpenter.clever-cloud.com/instance-memory'] || !x.key.find('^([^/]+)').endsWith('karpenter.clever-cloud.com'))").message("label domain \"karpenter.clever-cloud.com\" is restricted (only instance-cpu and instance-memory may be required)"),
        validation = Rule::new("self.all(x, (x.key == 'karpenter.sh/capacity-type' && x.operator == 'In') ? (has(x.values) && x.values.filter(v, v in ['on-demand', 'spot', 'reserved']).size() >= (has(x.minValues) ? x.minValues : 1)) : true)").message("karpenter.sh/capacity-type In must list known capacity types (on-demand, spot, reserved), at least minValues of them")
    )]
    pub requirements: Vec<NodeSelectorRequirement>,
    /// The `CleverNodeClass` (same namespace) giving the Clever-specific node settings. `group` and `kind` are
    /// immutable; changing `name` makes the existing nodes drifted (the hub replaces them).
    #[x_kube(
        validation = Rule::new("self.group == oldSelf.group").message("nodeClassRef.group is immutable"),
        validation = Rule::new("self.kind == oldSelf.kind").message("nodeClassRef.kind is immutable")
    )]
    pub node_class_ref: NodeClassReference,
    /// How long a node may live before the hub replaces it (`720h` by default; `Never` disables expiry). Expiry is
    /// forceful: it ignores disruption budgets.
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub expire_after: String,
    /// How long a draining node may wait for its pods (PDBs, do-not-disrupt) before they are deleted forcefully.
    /// Unset means wait forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub termination_grace_period: Option<String>,
}

fn default_expire_after() -> String {
    DEFAULT_EXPIRE_AFTER.to_string()
}

/// Which nodes may be consolidated.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConsolidationPolicy {
    /// Only nodes without workload pods are removed.
    WhenEmpty,
    /// Empty nodes are removed, and under-used nodes are removed or replaced by cheaper ones.
    #[default]
    WhenEmptyOrUnderutilized,
    /// Like `WhenEmptyOrUnderutilized`, but a move must save enough relative to the disruption it causes.
    Balanced,
}

/// Disruption settings of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Which nodes may be consolidated: `WhenEmpty`, `WhenEmptyOrUnderutilized` (default) or `Balanced`.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// How long a node must have seen no pod scheduled or removed before it may be consolidated (`0s` by default;
    /// `Never` disables consolidation, including of empty nodes).
    #[serde(default = "default_consolidate_after")]
    #[schemars(regex(pattern = r"^(([0-9]+(s|m|h))+|Never)$"))]
    pub consolidate_after: String,
    /// How many nodes may be disrupted at once, possibly per reason and time window. When no budget applies, at
    /// most 10 % of the nodes are disrupted at once.
    #[serde(default = "default_budgets")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.schedule) == has(x.duration))").message("a budget's schedule and duration must be set together"))]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Self {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: default_consolidate_after(),
            budgets: default_budgets(),
        }
    }
}

fn default_consolidate_after() -> String {
    DEFAULT_CONSOLIDATE_AFTER.to_string()
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget { nodes: DEFAULT_BUDGET_NODES.to_string(), schedule: None, duration: None, reasons: None }]
}

/// Reason for a voluntary disruption, as budgets select them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum DisruptionReason {
    /// A node without workload pods.
    Empty,
    /// A node that no longer matches its pool or node class.
    Drifted,
    /// A node whose pods fit elsewhere or on a cheaper node.
    Underutilized,
}

/// A disruption budget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct Budget {
    /// Nodes that may be disrupted at once: a count (`3`) or a percentage of the pool's nodes (`10%`, rounded up).
    #[serde(default = "default_budget_nodes")]
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// When the budget starts to apply: a 5-field cron expression in UTC (`0 9 * * 1-5`) or a macro (`@daily`,
    /// `@hourly`, ...). Time-zone prefixes are not supported. Requires `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"
    ))]
    #[x_kube(validation = Rule::new("!self.startsWith('CRON_TZ=') && !self.startsWith('TZ=')").message("schedules are always UTC: remove the time-zone prefix"))]
    pub schedule: Option<String>,
    /// How long the budget applies after each `schedule` time, in hours and/or minutes (`8h`, `90m`, `1h30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"))]
    pub duration: Option<String>,
    /// Disruption reasons the budget limits (`Empty`, `Drifted`, `Underutilized`); absent means all. Expiry is
    /// not a reason: it ignores budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3))]
    pub reasons: Option<Vec<DisruptionReason>>,
}

fn default_budget_nodes() -> String {
    DEFAULT_BUDGET_NODES.to_string()
}

/// Observed state of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Sum of the capacity of the pool's nodes that are not being deleted, with `nodes` their count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::status_resource_map")]
    pub resources: Option<ResourceMap>,
    /// Number of the pool's nodes that are not being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Generation of the node class last seen by the hub for this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
    /// Fleet pool: `ready/selected`, the selected clusters whose instance of the pool is Ready, over the
    /// clusters selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub clusters_ready: Option<String>,
    /// Fleet pool with `spec.rollout`: the revision being rolled out and each selected cluster's phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Fleet pool: one row per selected cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<PoolClusterStatus>,
    /// `ValidationSucceeded`, `NodeClassReady`, `ClusterReachable` (reason `SecretMissing`, `InvalidKubeconfig`,
    /// `Unauthorized`, `Unreachable`, `NodeGroupAPINotServed`, `Syncing` or `Connected`), `NodeRegistrationHealthy`
    /// and the root `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}

/// Where a fleet pool's rollout stands (fleet.md §3).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The revision being rolled out: the pool's drift hash (docs/drift-hash.md).
    #[schemars(length(max = 64))]
    pub revision: String,
    /// Each selected cluster's phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<RolloutCluster>,
}

/// One cluster's phase in a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCluster {
    /// The cluster's name.
    #[schemars(length(max = 63))]
    pub name: String,
    /// `Pending` (waiting for its turn), `Progressing` (replacing its drifted nodes), `Soaking` (finished,
    /// watched for `soak`), `Done`, or `Failed` (halts the rollout; the message says why).
    pub phase: RolloutPhase,
    /// When the cluster entered its phase.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

/// A cluster's phase in a rollout.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Waiting for its turn: drift of the pool's nodes there is held back.
    Pending,
    /// Replacing its drifted nodes, within its budgets.
    Progressing,
    /// Finished; watched for `soak` before it counts as done.
    Soaking,
    /// On the revision.
    Done,
    /// A replacement failed: the rollout halts until a new revision or the resume annotation.
    Failed,
}

/// A fleet pool's instance in one selected cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolClusterStatus {
    /// The cluster's name (its registration Secret is `<name>-kubeconfig` in the pool's namespace).
    #[schemars(length(max = 63))]
    pub name: String,
    /// Number of the pool's nodes in this cluster that are not being deleted.
    #[serde(default)]
    pub nodes: i64,
    /// Sum of their capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::common::status_resource_map")]
    pub resources: Option<ResourceMap>,
    /// `True` when the hub can provision for this pool in this cluster (cluster connected and synced,
    /// node class Ready, pool valid).
    #[schemars(length(max = 16))]
    pub ready: String,
    /// Why, in one word: the cluster's `ClusterReachable` reason when it is not reachable (`SecretMissing`,
    /// `Unreachable`, …), else the first condition that is not True, else `Ready`.
    #[schemars(length(max = 128))]
    pub reason: String,
    /// The template revisions (drift hashes) the pool's nodes here run, sorted: one when the cluster is on
    /// a single revision, several while a change is rolled out, none without nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 64)))]
    pub revisions: Vec<String>,
}

impl NodePool {
    /// Whether this pool serves the cluster `cluster` whose labels are `labels`, among the clusters of
    /// the pool's own namespace (callers pass only those: no pool reaches another namespace).
    pub fn selects(&self, cluster: &str, labels: &BTreeMap<String, String>) -> bool {
        crate::selector::targets(self.spec.cluster_name.as_ref(), self.spec.cluster_selector.as_ref(), cluster, labels)
    }

    /// The labels its template puts on every node (none when it sets no metadata).
    pub fn template_labels(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.spec.template.metadata.as_ref().map_or(&NONE, |m| &m.labels)
    }

    /// Whether this is a fleet pool (it selects clusters by label rather than naming one).
    pub fn is_fleet(&self) -> bool {
        self.spec.cluster_name.is_none() && self.spec.cluster_selector.is_some()
    }
}
