//! Metrics and health endpoints of `karpenter-hub run`: `/metrics` (Prometheus text, Karpenter's
//! names where one exists, ours under `karpenter_hub_`, each with a `cluster` label), `/healthz` and
//! `/readyz`.
//!
//! Owns: the metric families and the HTTP server. Must not: put anything secret in a label (the
//! cluster label is `<namespace>/<name>`, never a server URL or a token).

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry as PromRegistry},
};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PhaseLabels {
    pub cluster: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolLabels {
    pub cluster: String,
    pub nodepool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub cluster: String,
    pub nodepool: String,
    pub reason: String,
}

/// A NodeClaim created: its pool, why, and whether its minValues were relaxed (upstream's
/// `min_values_relaxed`: the claim's `karpenter.sh/nodeclaim-min-values-relaxed`, `false` when
/// absent).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CreatedLabels {
    pub cluster: String,
    pub nodepool: String,
    pub reason: String,
    pub min_values_relaxed: String,
}

impl CreatedLabels {
    /// The labels of `claim`, created in `cluster` for `reason`.
    pub fn of(cluster: &str, reason: &str, claim: &crds::NodeClaim) -> Self {
        let annotation = |k: &str| claim.metadata.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        let label = |k: &str| claim.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned();
        CreatedLabels {
            cluster: cluster.to_string(),
            nodepool: label(crds::labels::NODEPOOL).unwrap_or_default(),
            reason: reason.to_string(),
            min_values_relaxed: if annotation(crds::labels::MIN_VALUES_RELAXED).as_deref() == Some("true") {
                "true"
            } else {
                "false"
            }
            .to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolPhaseLabels {
    pub cluster: String,
    pub nodepool: String,
    pub phase: String,
}

/// A CapacityBuffer's pods in one cluster: `placement` is `existing` (on existing or launching
/// capacity), `new` (needing a new node) or `unplaceable`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct BufferLabels {
    pub cluster: String,
    pub capacitybuffer: String,
    pub placement: String,
}

/// An organisation's figure (fleet.md §4): `resource` is `cpu` (vCPUs), `memory` (bytes) or
/// `price_per_hour` (EUR), `kind` is `limit`, `used` or `reserved`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OrganizationLabels {
    pub organization: String,
    pub resource: String,
    pub kind: String,
}

/// An organisation spans clusters: its series go with the organisation, not with a cluster.
impl PerCluster for OrganizationLabels {
    fn cluster(&self) -> &str {
        ""
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ClaimLabels {
    pub cluster: String,
    pub nodepool: String,
    pub nodeclaim: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PoolResourceLabels {
    pub cluster: String,
    pub nodepool: String,
    pub resource_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MethodLabels {
    pub cluster: String,
    pub method: String,
}

/// A stage of the hub's share of a pod's wait (`batch`, `decide`, `launch`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct StageLabels {
    pub cluster: String,
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MethodErrorLabels {
    pub cluster: String,
    pub method: String,
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ResultLabels {
    pub cluster: String,
    pub result: String,
}

/// A retried API request: `api` is `management` or `workload`; `cluster` the workload cluster's key
/// (empty for the management cluster); `code` the HTTP status that asked for the retry.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct RetryLabels {
    pub api: String,
    pub cluster: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReasonLabels {
    pub cluster: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct DecisionLabels {
    pub cluster: String,
    /// `delete` or `replace`.
    pub decision: String,
    /// The budget reason: `empty`, `drifted`, `underutilized`.
    pub reason: String,
    /// `empty`, `single`, `multi`, or empty for drift.
    pub consolidation_type: String,
}

/// A failed reconcile: the controller, the step that failed and its category (the closed sets of
/// [`crate::infra::errors`]); `cluster` is empty for what belongs to no workload cluster the
/// replica serves.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    pub cluster: String,
    pub controller: String,
    pub step: String,
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CatalogLabels {
    pub flavorcatalog: String,
}

/// How a replica's ownership of a cluster changed in sharded mode: `acquired`, `released` (handed
/// over, unregistered or stopping) or `fenced` (its Lease could not be renewed in time, or another
/// replica took it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct DirectionLabels {
    pub direction: String,
}

/// Label sets that belong to one workload cluster, so its series can go when it is removed.
pub trait PerCluster {
    fn cluster(&self) -> &str;
}

macro_rules! per_cluster {
    ($($t:ty),*) => {$(impl PerCluster for $t { fn cluster(&self) -> &str { &self.cluster } })*};
}
per_cluster!(
    BufferLabels,
    StageLabels,
    CreatedLabels,
    ClusterLabels,
    ClaimLabels,
    PhaseLabels,
    ResultLabels,
    PoolLabels,
    PoolReasonLabels,
    PoolPhaseLabels,
    PoolResourceLabels,
    MethodLabels,
    MethodErrorLabels,
    ReasonLabels,
    DecisionLabels,
    RetryLabels,
    ReconcileErrorLabels
);

/// A metric family that remembers its label sets, so every series of a removed cluster can be
/// dropped (prometheus-client's `Family` can only remove a set it is given).
#[derive(Debug)]
pub struct Tracked<L, M, C = fn() -> M> {
    family: Family<L, M, C>,
    seen: Mutex<BTreeSet<L>>,
}

impl<L, M> Default for Tracked<L, M>
where
    L: Clone + std::hash::Hash + Eq + Ord,
    M: Default,
{
    fn default() -> Self {
        Self { family: Family::default(), seen: Mutex::new(BTreeSet::new()) }
    }
}

impl<L, M, C> Tracked<L, M, C>
where
    L: Clone + std::hash::Hash + Eq + Ord + PerCluster,
    M: Clone,
    C: MetricConstructor<M>,
{
    fn with_constructor(c: C) -> Self {
        Self { family: Family::new_with_constructor(c), seen: Mutex::new(BTreeSet::new()) }
    }

    /// The series of `labels` (created at 0 the first time).
    pub fn get(&self, labels: &L) -> M {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).insert(labels.clone());
        self.family.get_or_create_owned(labels)
    }

    /// Drop the series of `labels`, if any (a gauge whose value is unknown, rather than stale).
    pub fn remove(&self, labels: &L) {
        if self.seen.lock().unwrap_or_else(PoisonError::into_inner).remove(labels) {
            self.family.remove(labels);
        }
    }

    /// Drop every series whose labels match `gone` (e.g. those of a deleted NodePool).
    pub fn forget_where(&self, gone: impl Fn(&L) -> bool) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|l| {
            if gone(l) {
                self.family.remove(l);
                false
            } else {
                true
            }
        });
    }

    /// Drop every series of `cluster`.
    pub fn forget(&self, cluster: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.retain(|l| {
            if l.cluster() == cluster {
                self.family.remove(l);
                false
            } else {
                true
            }
        });
    }

    fn family(&self) -> Family<L, M, C>
    where
        C: Clone,
    {
        self.family.clone()
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;
type Buckets = fn() -> Histogram;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The hub's share of a pod's wait: fine around the batch window (1 s idle, 10 s at most) and the
/// 1.25 s target (docs/performance.md B4), up to a minute.
fn pod_wait_histogram() -> Histogram {
    Histogram::new([0.1, 0.25, 0.5, 0.75, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 15.0, 30.0, 60.0])
}

/// From a second to about four hours: a drain lasts as long as its pods' budgets and grace periods.
fn termination_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// Every metric of the process. Karpenter's names where Karpenter has the metric (with a `cluster`
/// label added), `karpenter_hub_` for the CKE provider's and the hub's own (clever-cloud.md §8).
/// Counters are registered without `_total`; the encoder appends it.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<PromRegistry>,
    /// 1 while the cluster is connected and synced.
    pub cluster_connected: Tracked<ClusterLabels, Gauge>,
    /// 1 for the cluster's current connection phase, 0 for the others.
    pub cluster_phase: Tracked<PhaseLabels, Gauge>,
    /// Connection state changes seen (reconnects, rotations, failures).
    pub cluster_transitions: Tracked<ClusterLabels, Counter>,
    /// Health probes by result (`ok`, `failed`, `unauthorized`).
    pub cluster_probes: Tracked<ResultLabels, Counter>,
    /// Watch errors after which the watcher restarted.
    pub watch_restarts: Tracked<ClusterLabels, Counter>,
    /// API requests sent again because the server asked (429, 503, 504), by API and code.
    pub api_retries: Tracked<RetryLabels, Counter>,
    /// Failed reconciles (rounds, passes), by controller, step and category.
    pub reconcile_errors: Tracked<ReconcileErrorLabels, Counter>,
    pub nodeclaims_created: Tracked<CreatedLabels, Counter>,
    pub nodeclaims_terminated: Tracked<PoolLabels, Counter>,
    pub nodeclaims_disrupted: Tracked<PoolReasonLabels, Counter>,
    pub nodes_created: Tracked<PoolLabels, Counter>,
    pub nodes_drained: Tracked<PoolLabels, Counter>,
    pub pods_drained: Tracked<PoolReasonLabels, Counter>,
    pub eviction_requests: Tracked<ResultLabels, Counter>,
    pub termination_duration: Tracked<PoolLabels, Histogram, Buckets>,
    pub drain_waiting_pods: Tracked<ClaimLabels, Gauge>,
    pub disruption_decisions: Tracked<DecisionLabels, Counter>,
    pub disruption_eligible_nodes: Tracked<ReasonLabels, Gauge>,
    pub disruption_allowed: Tracked<PoolReasonLabels, Gauge>,
    pub disruption_queue_failures: Tracked<DecisionLabels, Counter>,
    pub disruption_failed_validations: Tracked<ReasonLabels, Counter>,
    pub disruption_evaluation: Tracked<MethodLabels, Histogram, Buckets>,
    /// Disruption passes by whether the cluster's view was built (`built`) or the last verdict
    /// kept because nothing it reads changed (`kept`).
    pub disruption_views: Tracked<ResultLabels, Counter>,
    pub nodepool_usage: Tracked<PoolResourceLabels, FloatGauge>,
    pub nodepool_limit: Tracked<PoolResourceLabels, FloatGauge>,
    /// Σ catalogue price of the pool's launched claims, EUR/h.
    pub nodepool_price: Tracked<PoolLabels, FloatGauge>,
    /// A fleet pool's rollout: 1 for each selected cluster's current phase.
    pub rollout_phase: Tracked<PoolPhaseLabels, Gauge>,
    /// Each organisation's quota, usage and reservations across its clusters.
    pub organization_quota: Tracked<OrganizationLabels, FloatGauge>,
    /// Pods of the cluster that trigger provisioning, at the provisioning loop's last look.
    pub queue_depth: Tracked<ClusterLabels, Gauge>,
    /// Pods the last provisioning decision of the cluster could not place.
    pub unschedulable_pods: Tracked<ClusterLabels, Gauge>,
    /// Where the last provisioning round of a cluster put each CapacityBuffer's pods.
    pub buffer_pods: Tracked<BufferLabels, Gauge>,
    pub scheduling_duration: Tracked<ClusterLabels, Histogram, Buckets>,
    /// Per pod, from the hub's cache holding its `Unschedulable` mark to the create request of the
    /// NodeGroup launched for it: the hub's own share of the pod's wait.
    pub pod_provisioning_latency: Tracked<ClusterLabels, Histogram, Buckets>,
    /// The same wait by stage: `batch` (the mark to the start of the round that decided the pod's
    /// claim), `decide` (that round's start to the claim's create), `launch` (the claim's create to
    /// the NodeGroup's create request).
    pub pod_provisioning_stages: Tracked<StageLabels, Histogram, Buckets>,
    pub cloudprovider_duration: Tracked<MethodLabels, Histogram, Buckets>,
    pub cloudprovider_errors: Tracked<MethodErrorLabels, Counter>,
    pub acceptance_timeouts: Tracked<ClusterLabels, Counter>,
    pub quota_rejections: Tracked<ClusterLabels, Counter>,
    pub vanished: Tracked<ClusterLabels, Counter>,
    pub external_resizes: Tracked<ClusterLabels, Gauge>,
    pub gc_reaped: Tracked<ClusterLabels, Counter>,
    pub gc_refused: Tracked<ClusterLabels, Gauge>,
    pub cooldown_flavors: Tracked<ClusterLabels, Gauge>,
    pub unmanaged: Tracked<ClusterLabels, Gauge>,
    /// Groups still labelled with the management cluster the registration declares a move from.
    pub awaiting_handover: Tracked<ClusterLabels, Gauge>,
    pub unknown_flavor_lookups: Tracked<ClusterLabels, Counter>,
    /// 1 while a FlavorCatalog cannot be used (label `flavorcatalog`: `<namespace>/<name>`).
    pub catalog_invalid: Family<CatalogLabels, Gauge>,
    /// Sharded mode: workload clusters this replica owns (holds their bucket's Lease) (0 in single-leader mode).
    pub shard_owned: Gauge,
    /// Sharded mode: live replicas of this hub id, as this replica sees them.
    pub shard_members: Gauge,
    /// Sharded mode: ownership changes of this replica, by direction.
    pub shard_handovers: Family<DirectionLabels, Counter>,
    /// 1 while this replica leads: holds the Lease `karpenter-hub-<hub id>` (single-leader mode:
    /// it acts; sharded mode: it writes the namespace-wide status), or acts without election.
    pub leader: Gauge,
    /// Started and not stopping: `/readyz` answers 200 (leader or standby alike).
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn register<L, M, C>(r: &mut PromRegistry, name: &str, help: &str, t: &Tracked<L, M, C>)
where
    L: Clone + std::hash::Hash + Eq + Ord + PerCluster + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    M: Clone + Metric,
    C: MetricConstructor<M> + Clone + std::fmt::Debug + Send + Sync + 'static,
    Family<L, M, C>: Metric,
{
    r.register(name, help, t.family());
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = PromRegistry::default();
        let m = Self {
            registry: Mutex::new(PromRegistry::default()),
            cluster_connected: Tracked::default(),
            cluster_phase: Tracked::default(),
            cluster_transitions: Tracked::default(),
            cluster_probes: Tracked::default(),
            watch_restarts: Tracked::default(),
            api_retries: Tracked::default(),
            reconcile_errors: Tracked::default(),
            nodeclaims_created: Tracked::default(),
            nodeclaims_terminated: Tracked::default(),
            nodeclaims_disrupted: Tracked::default(),
            nodes_created: Tracked::default(),
            nodes_drained: Tracked::default(),
            pods_drained: Tracked::default(),
            eviction_requests: Tracked::default(),
            disruption_decisions: Tracked::default(),
            disruption_eligible_nodes: Tracked::default(),
            disruption_allowed: Tracked::default(),
            disruption_queue_failures: Tracked::default(),
            disruption_failed_validations: Tracked::default(),
            disruption_evaluation: Tracked::with_constructor(latency_histogram as Buckets),
            disruption_views: Tracked::default(),
            nodepool_usage: Tracked::default(),
            nodepool_limit: Tracked::default(),
            nodepool_price: Tracked::default(),
            rollout_phase: Tracked::default(),
            organization_quota: Tracked::default(),
            queue_depth: Tracked::default(),
            unschedulable_pods: Tracked::default(),
            buffer_pods: Tracked::default(),
            termination_duration: Tracked::with_constructor(termination_histogram as Buckets),
            drain_waiting_pods: Tracked::default(),
            scheduling_duration: Tracked::with_constructor(latency_histogram as Buckets),
            pod_provisioning_latency: Tracked::with_constructor(pod_wait_histogram as Buckets),
            pod_provisioning_stages: Tracked::with_constructor(pod_wait_histogram as Buckets),
            cloudprovider_duration: Tracked::with_constructor(latency_histogram as Buckets),
            cloudprovider_errors: Tracked::default(),
            acceptance_timeouts: Tracked::default(),
            quota_rejections: Tracked::default(),
            vanished: Tracked::default(),
            external_resizes: Tracked::default(),
            gc_reaped: Tracked::default(),
            gc_refused: Tracked::default(),
            cooldown_flavors: Tracked::default(),
            unmanaged: Tracked::default(),
            awaiting_handover: Tracked::default(),
            unknown_flavor_lookups: Tracked::default(),
            catalog_invalid: Family::default(),
            shard_owned: Gauge::default(),
            shard_members: Gauge::default(),
            shard_handovers: Family::default(),
            leader: Gauge::default(),
            ready: AtomicBool::new(false),
        };
        register(
            &mut r,
            "karpenter_hub_cluster_connected",
            "Whether the workload cluster is connected and its watches synced",
            &m.cluster_connected,
        );
        register(
            &mut r,
            "karpenter_hub_cluster_phase",
            "Connection phase of the workload cluster (1 for the current one)",
            &m.cluster_phase,
        );
        register(
            &mut r,
            "karpenter_hub_cluster_transitions",
            "Connection state changes of the workload cluster",
            &m.cluster_transitions,
        );
        register(
            &mut r,
            "karpenter_hub_cluster_probes",
            "Health probes of the workload cluster, by result",
            &m.cluster_probes,
        );
        register(
            &mut r,
            "karpenter_hub_cluster_watch_restarts",
            "Watch errors after which a watch of the workload cluster restarted",
            &m.watch_restarts,
        );
        register(
            &mut r,
            "karpenter_hub_api_retries",
            "API requests the hub sent again because the server asked (429, 503, 504), by API (management, workload) and status code",
            &m.api_retries,
        );
        register(
            &mut r,
            "karpenter_hub_reconcile_errors",
            "Failed reconciles of the hub's controllers (a provisioning round, a disruption pass), by controller, the step that failed and its category",
            &m.reconcile_errors,
        );
        register(
            &mut r,
            "karpenter_nodeclaims_created",
            "NodeClaims created, by reason and owning NodePool",
            &m.nodeclaims_created,
        );
        register(
            &mut r,
            "karpenter_nodeclaims_terminated",
            "NodeClaims terminated, by owning NodePool",
            &m.nodeclaims_terminated,
        );
        register(
            &mut r,
            "karpenter_nodeclaims_disrupted",
            "NodeClaims disrupted, by reason and owning NodePool",
            &m.nodeclaims_disrupted,
        );
        register(
            &mut r,
            "karpenter_nodes_created",
            "Nodes registered to a NodeClaim, by owning NodePool",
            &m.nodes_created,
        );
        register(
            &mut r,
            "karpenter_nodes_drained",
            "Nodes drained before their NodeGroup was deleted, by owning NodePool",
            &m.nodes_drained,
        );
        register(
            &mut r,
            "karpenter_pods_drained",
            "Pods evicted or deleted at the deadline by node termination, by reason and owning NodePool",
            &m.pods_drained,
        );
        register(
            &mut r,
            "karpenter_nodes_eviction_requests",
            "Eviction requests made by node termination, by HTTP status code (result; 0: no answer)",
            &m.eviction_requests,
        );
        register(
            &mut r,
            "karpenter_nodeclaims_termination_duration_seconds",
            "Time from a NodeClaim's deletion to the release of its finalizer (drain, volumes, NodeGroup), by owning NodePool",
            &m.termination_duration,
        );
        register(
            &mut r,
            "karpenter_hub_nodeclaims_drain_waiting_pods",
            "Pods the drain of a leaving NodeClaim's node is waiting for (refused evictions, do-not-disrupt, terminating)",
            &m.drain_waiting_pods,
        );
        register(
            &mut r,
            "karpenter_voluntary_disruption_decisions",
            "Disruption commands started, by decision (delete, replace), reason and consolidation type",
            &m.disruption_decisions,
        );
        register(
            &mut r,
            "karpenter_voluntary_disruption_eligible_nodes",
            "Nodes that are candidates of a disruption method at the last pass, by reason",
            &m.disruption_eligible_nodes,
        );
        register(
            &mut r,
            "karpenter_nodepools_allowed_disruptions",
            "Nodes the NodePool's disruption budgets still allow to disrupt, by reason",
            &m.disruption_allowed,
        );
        register(
            &mut r,
            "karpenter_voluntary_disruption_queue_failures",
            "Disruption commands rolled back (a replacement failed or did not initialize in time), by decision, reason and consolidation type",
            &m.disruption_queue_failures,
        );
        register(
            &mut r,
            "karpenter_voluntary_disruption_failed_validations",
            "Consolidation commands dropped at validation after the 15 s delay, by reason",
            &m.disruption_failed_validations,
        );
        register(
            &mut r,
            "karpenter_voluntary_disruption_decision_evaluation_duration_seconds",
            "Duration of one evaluation of a disruption method, by method",
            &m.disruption_evaluation,
        );
        register(
            &mut r,
            "karpenter_hub_disruption_views",
            "Disruption passes of the workload cluster, by whether its view was built or the last verdict kept (nothing it reads changed)",
            &m.disruption_views,
        );
        register(
            &mut r,
            "karpenter_nodepools_usage",
            "Resources provisioned by the NodePool, by resource type",
            &m.nodepool_usage,
        );
        register(
            &mut r,
            "karpenter_nodepools_limit",
            "Resource limits of the NodePool, by resource type",
            &m.nodepool_limit,
        );
        register(
            &mut r,
            "karpenter_hub_nodepool_price_per_hour",
            "Catalogue price of the NodePool's launched NodeClaims not being deleted, EUR per hour",
            &m.nodepool_price,
        );
        register(
            &mut r,
            "karpenter_hub_nodepool_rollout_phase",
            "Phase of the workload cluster in the fleet NodePool's rollout (1 for the current one)",
            &m.rollout_phase,
        );
        register(
            &mut r,
            "karpenter_hub_organization_quota",
            "A CleverOrganization's effective quota (kind=limit), usage across its clusters (kind=used: every node, NodeGroups not yet a node, reservations) and reservations of launches about to be sent (kind=reserved); resource cpu in vCPUs, memory in bytes, price_per_hour in EUR per hour (the hub's nodes). The same on every replica",
            &m.organization_quota,
        );
        register(
            &mut r,
            "karpenter_scheduler_queue_depth",
            "Pods waiting for the hub to provision capacity (unschedulable by kube-scheduler, not nominated)",
            &m.queue_depth,
        );
        register(
            &mut r,
            "karpenter_scheduler_unschedulable_pods_count",
            "Pods the last provisioning decision could not place on any NodePool",
            &m.unschedulable_pods,
        );
        register(
            &mut r,
            "karpenter_hub_capacity_buffer_pods",
            "A CapacityBuffer's pods in a cluster at its last provisioning round, by placement (existing, new, unplaceable)",
            &m.buffer_pods,
        );
        register(
            &mut r,
            "karpenter_provisioner_scheduling_duration_seconds",
            "Duration of one provisioning decision",
            &m.scheduling_duration,
        );
        register(
            &mut r,
            "karpenter_hub_pod_provisioning_latency_seconds",
            "Per pod, from the hub's cache holding its Unschedulable mark to the create request of the NodeGroup launched for it",
            &m.pod_provisioning_latency,
        );
        register(
            &mut r,
            "karpenter_hub_pod_provisioning_stage_seconds",
            "The hub's share of a pod's wait by stage: batch (the mark to the start of the round that decided its claim), decide (to the claim's create), launch (to the NodeGroup's create request)",
            &m.pod_provisioning_stages,
        );
        register(
            &mut r,
            "karpenter_cloudprovider_duration_seconds",
            "Duration of NodeGroup API calls, by method",
            &m.cloudprovider_duration,
        );
        register(
            &mut r,
            "karpenter_cloudprovider_errors",
            "Failed NodeGroup API calls, by method and error",
            &m.cloudprovider_errors,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_acceptance_timeouts",
            "Launches that got no CKE verdict in time and went on optimistically",
            &m.acceptance_timeouts,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_quota_rejections",
            "Fresh quota rejections by CKE (fast-fails in back-off excluded)",
            &m.quota_rejections,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_vanished",
            "NodeGroups that disappeared after launch before registration",
            &m.vanished,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_external_resizes",
            "Owned NodeGroups with nodeCount != 1 at the last sweep",
            &m.external_resizes,
        );
        register(
            &mut r,
            "karpenter_hub_gc_reaped_nodegroups",
            "Orphaned owned NodeGroups deleted by garbage collection",
            &m.gc_reaped,
        );
        register(
            &mut r,
            "karpenter_hub_gc_refused_nodegroups",
            "NodeGroups garbage collection refused to delete at the last sweep",
            &m.gc_refused,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_cooldown_flavors",
            "Flavors cooling down after a CKE refusal",
            &m.cooldown_flavors,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_unmanaged",
            "NodeGroups this hub does not own, at the last sweep",
            &m.unmanaged,
        );
        register(
            &mut r,
            "karpenter_hub_nodegroup_awaiting_handover",
            "NodeGroups moved from the management cluster the registration names, not re-stamped yet, at the last sweep",
            &m.awaiting_handover,
        );
        register(
            &mut r,
            "karpenter_hub_instancetype_unknown_flavor_lookups",
            "Lookups of flavors missing from the catalogue",
            &m.unknown_flavor_lookups,
        );
        r.register(
            "karpenter_hub_instancetype_flavors_config_invalid",
            "1 while a FlavorCatalog cannot be used",
            m.catalog_invalid.clone(),
        );
        r.register(
            "karpenter_hub_shard_owned_clusters",
            "Sharded mode: workload clusters this replica owns (holds the Lease of their bucket)",
            m.shard_owned.clone(),
        );
        r.register(
            "karpenter_hub_leader",
            "1 while this replica holds the hub's leader Lease (or runs without leader election), 0 on a standby",
            m.leader.clone(),
        );
        r.register(
            "karpenter_hub_shard_members",
            "Sharded mode: live replicas of this hub id, as this replica sees them",
            m.shard_members.clone(),
        );
        // Every direction from the start, so increase() sees the first handover.
        for d in ["acquired", "released", "fenced"] {
            let _ = m.shard_handovers.get_or_create(&DirectionLabels { direction: d.to_string() });
        }
        r.register(
            "karpenter_hub_shard_handovers",
            "Sharded mode: ownership changes of workload clusters on this replica, by direction (acquired, released, fenced)",
            m.shard_handovers.clone(),
        );
        *m.registry.lock().unwrap_or_else(PoisonError::into_inner) = r;
        m
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }

    /// A cluster just registered: its counters and gauges start at 0 so `increase()` alerts see
    /// the first event (clever-cloud.md §8).
    pub fn cluster_registered(&self, cluster: &str) {
        let l = ClusterLabels { cluster: cluster.to_string() };
        for c in [
            &self.acceptance_timeouts,
            &self.quota_rejections,
            &self.vanished,
            &self.gc_reaped,
            &self.unknown_flavor_lookups,
        ] {
            c.get(&l);
        }
        for g in [
            &self.external_resizes,
            &self.gc_refused,
            &self.cooldown_flavors,
            &self.unmanaged,
            &self.awaiting_handover,
            &self.cluster_connected,
        ] {
            g.get(&l);
        }
        self.cluster_transitions.get(&l);
        self.watch_restarts.get(&l);
    }

    /// A cluster was removed: every one of its series goes with it (hub.md §3 "Removal").
    pub fn cluster_removed(&self, cluster: &str) {
        self.cluster_connected.forget(cluster);
        self.cluster_phase.forget(cluster);
        self.cluster_transitions.forget(cluster);
        self.cluster_probes.forget(cluster);
        self.watch_restarts.forget(cluster);
        self.api_retries.forget(cluster);
        self.reconcile_errors.forget(cluster);
        self.nodeclaims_created.forget(cluster);
        self.nodeclaims_terminated.forget(cluster);
        self.nodeclaims_disrupted.forget(cluster);
        self.nodes_created.forget(cluster);
        self.nodes_drained.forget(cluster);
        self.disruption_decisions.forget(cluster);
        self.disruption_eligible_nodes.forget(cluster);
        self.disruption_allowed.forget(cluster);
        self.disruption_queue_failures.forget(cluster);
        self.disruption_failed_validations.forget(cluster);
        self.disruption_evaluation.forget(cluster);
        self.disruption_views.forget(cluster);
        self.pods_drained.forget(cluster);
        self.eviction_requests.forget(cluster);
        self.termination_duration.forget(cluster);
        self.drain_waiting_pods.forget(cluster);
        self.nodepool_usage.forget(cluster);
        self.nodepool_limit.forget(cluster);
        self.nodepool_price.forget(cluster);
        self.rollout_phase.forget(cluster);
        self.queue_depth.forget(cluster);
        self.unschedulable_pods.forget(cluster);
        self.buffer_pods.forget(cluster);
        self.scheduling_duration.forget(cluster);
        self.pod_provisioning_latency.forget(cluster);
        self.pod_provisioning_stages.forget(cluster);
        self.cloudprovider_duration.forget(cluster);
        self.cloudprovider_errors.forget(cluster);
        for t in [
            &self.acceptance_timeouts,
            &self.quota_rejections,
            &self.vanished,
            &self.gc_reaped,
            &self.unknown_flavor_lookups,
        ] {
            t.forget(cluster);
        }
        for g in
            [&self.external_resizes, &self.gc_refused, &self.cooldown_flavors, &self.unmanaged, &self.awaiting_handover]
        {
            g.forget(cluster);
        }
    }

    /// Shorthand for a per-cluster counter.
    pub fn inc(family: &Tracked<ClusterLabels, Counter>, cluster: &impl std::fmt::Display) {
        family.get(&ClusterLabels { cluster: cluster.to_string() }).inc();
    }

    /// Shorthand for a per-cluster gauge.
    pub fn set(family: &Tracked<ClusterLabels, Gauge>, cluster: &impl std::fmt::Display, v: i64) {
        family.get(&ClusterLabels { cluster: cluster.to_string() }).set(v);
    }

    /// Time a NodeGroup API call, counting its failures by HTTP status or transport error.
    pub async fn cloudprovider<T>(
        &self,
        cluster: &impl std::fmt::Display,
        method: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let start = std::time::Instant::now();
        let r = call.await;
        let cluster = cluster.to_string();
        self.cloudprovider_duration
            .get(&MethodLabels { cluster: cluster.clone(), method: method.to_string() })
            .observe(start.elapsed().as_secs_f64());
        if let Err(e) = &r {
            let error = match e {
                kube::Error::Api(s) => s.reason.clone(),
                _ => "Transport".to_string(),
            };
            self.cloudprovider_errors.get(&MethodErrorLabels { cluster, method: method.to_string(), error }).inc();
        }
        r
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`.
pub async fn serve(metrics: Arc<Metrics>, addr: SocketAddr, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    // The bound address: with port 0 the requested one says nothing about where to scrape.
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

/// `/healthz` and `/readyz` alone on `addr` (`--health-probe-bind-address`): the kubelet's probes
/// reach the pod there while `/metrics` may listen on the loopback interface only.
pub async fn serve_probes(metrics: Arc<Metrics>, addr: SocketAddr, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "serving /healthz and /readyz");
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.render())
}

/// Ready once started, leader and standby alike (a standby is healthy: `kubectl rollout status`,
/// `helm --wait` and Argo CD see a healthy install); the body says which it is, and so does
/// `karpenter_hub_leader`.
async fn ready_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match (m.ready.load(Ordering::Relaxed), m.leader.get() == 1) {
        (true, true) => (StatusCode::OK, "ready: leader"),
        (true, false) => (StatusCode::OK, "ready: standby"),
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_cluster_labels() {
        let m = Metrics::new();
        m.cluster_connected.get(&ClusterLabels { cluster: "team-a/prod".into() }).set(1);
        let text = m.render();
        assert!(text.contains("karpenter_hub_cluster_connected{cluster=\"team-a/prod\"} 1"), "{text}");
    }

    #[test]
    fn a_registered_cluster_starts_at_zero_and_a_removed_one_leaves_no_series() {
        let m = Metrics::new();
        m.cluster_registered("team-a/prod");
        m.cluster_registered("team-b/dev");
        let text = m.render();
        assert!(text.contains("karpenter_hub_nodegroup_quota_rejections_total{cluster=\"team-a/prod\"} 0"), "{text}");
        assert!(text.contains("karpenter_hub_gc_refused_nodegroups{cluster=\"team-a/prod\"} 0"), "{text}");
        m.nodeclaims_created
            .get(&CreatedLabels {
                cluster: "team-a/prod".into(),
                nodepool: "default".into(),
                reason: "provisioning".into(),
                min_values_relaxed: "false".into(),
            })
            .inc();
        Metrics::inc(&m.quota_rejections, &"team-a/prod");
        m.api_retries
            .get(&RetryLabels { api: "workload".into(), cluster: "team-a/prod".into(), code: "429".into() })
            .inc();
        m.nodepool_price.get(&PoolLabels { cluster: "team-a/prod".into(), nodepool: "default".into() }).set(0.0611);
        Metrics::set(&m.queue_depth, &"team-a/prod", 3);
        Metrics::set(&m.unschedulable_pods, &"team-a/prod", 1);
        let text = m.render();
        assert!(
            text.contains("karpenter_hub_nodepool_price_per_hour{cluster=\"team-a/prod\",nodepool=\"default\"} 0.0611"),
            "{text}"
        );
        assert!(text.contains("karpenter_scheduler_queue_depth{cluster=\"team-a/prod\"} 3"), "{text}");
        assert!(text.contains("karpenter_nodeclaims_created_total{cluster=\"team-a/prod\",nodepool=\"default\",reason=\"provisioning\",min_values_relaxed=\"false\"} 1"), "{text}");
        assert!(text.contains("karpenter_hub_nodegroup_quota_rejections_total{cluster=\"team-a/prod\"} 1"), "{text}");
        m.cluster_removed("team-a/prod");
        let text = m.render();
        assert!(!text.contains("team-a/prod"), "{text}");
        assert!(text.contains("team-b/dev"), "{text}");
    }

    #[test]
    fn a_removed_gauge_is_absent_rather_than_stale_and_comes_back_when_set() {
        let m = Metrics::new();
        let l = ClusterLabels { cluster: "team-a/prod".into() };
        m.queue_depth.get(&l).set(2);
        m.queue_depth.remove(&l);
        assert!(!m.render().contains("karpenter_scheduler_queue_depth{"), "{}", m.render());
        m.queue_depth.remove(&l); // removing twice is harmless
        m.queue_depth.get(&l).set(0);
        assert!(m.render().contains("karpenter_scheduler_queue_depth{cluster=\"team-a/prod\"} 0"), "{}", m.render());
    }

    #[tokio::test]
    async fn nodegroup_api_calls_are_timed_and_failures_counted_by_reason() {
        let m = Metrics::new();
        let ok: Result<u8, kube::Error> = m.cloudprovider(&"a/b", "create", async { Ok(1) }).await;
        assert!(ok.is_ok());
        let status = kube::core::Status::failure("quota", "Forbidden").with_code(403);
        let err: Result<u8, kube::Error> =
            m.cloudprovider(&"a/b", "create", async { Err(kube::Error::Api(Box::new(status))) }).await;
        assert!(err.is_err());
        let text = m.render();
        assert!(
            text.contains(
                "karpenter_cloudprovider_errors_total{cluster=\"a/b\",method=\"create\",error=\"Forbidden\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("karpenter_cloudprovider_duration_seconds_count{cluster=\"a/b\",method=\"create\"} 2"),
            "{text}"
        );
    }
}
