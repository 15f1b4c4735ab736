//! Plain input and output types of one scheduling round: pools with their instance types, existing
//! nodes with their pods, pending pods, DaemonSets, settings; and the decision.
//!
//! Owns shapes only, no logic. Everything here is plain owned data (no Kubernetes API types), so that
//! tests, benchmarks and `plan` build inputs cheaply; [`crate::convert`] builds them from API objects.

use std::collections::{BTreeMap, BTreeSet};

pub use crds::catalog::{InstanceType, Offering};
pub use crds::common::{NodeSelectorRequirement, Operator, Taint, TaintEffect};
pub use crds::quantity::Resources;

/// Everything one round decides on (karpenter-semantics §3.3).
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// Ready, non-deleting pools of the scope (any order: the solver orders them by weight, then name descending).
    pub pools: Vec<Pool>,
    /// Active existing capacity: registered nodes, in-flight claims without a node, unmanaged nodes.
    pub nodes: Vec<ExistingNode>,
    /// Pods to place (already filtered by [`crate::convert`]).
    pub pods: Vec<Pod>,
    /// DaemonSets of the workload cluster: each adds its pod's requests to every compatible node.
    pub daemonsets: Vec<DaemonSet>,
    /// Labels of namespaces, for `namespaceSelector` of pod (anti-)affinity terms.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Hub-wide settings.
    pub settings: Settings,
    /// Limits several pools draw on (an organisation's quota, a pool's price ceiling): a round opens
    /// no claim beyond what they leave. Empty: none.
    pub shared: Vec<SharedLimit>,
}

/// A limit shared by several pools (or one pool's limit that is not a resource, such as its price
/// ceiling), in what is left of it. Each new claim takes, per dimension, the largest draw among the
/// instance types it may launch (as pool limits take the largest option's capacity).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedLimit {
    /// Names the limit in reasons, e.g. "organisation orga-acme" or "nodepool default price-per-hour".
    pub name: String,
    /// Pools (by name) drawing on it; `None` = every pool of the round.
    pub pools: Option<BTreeSet<String>>,
    /// What is left; `None` per dimension = unlimited in that dimension.
    pub remaining: Headroom,
    /// What one node of each instance type (by name) draws; a type not listed draws its capacity's
    /// cpu and memory and its cheapest offering's price (available, within the pool's template).
    pub sizes: BTreeMap<String, Draw>,
}

/// What is left of a [`SharedLimit`]; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Headroom {
    /// Millicores.
    pub cpu_millis: Option<i64>,
    /// Bytes (a quota counting nominal GB gives them as such: they need not be a node's capacity).
    pub memory_bytes: Option<i64>,
    /// Micro-EUR per hour.
    pub price_micros: Option<i64>,
}

/// What one node draws on a [`SharedLimit`], or what new claims drew on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Draw {
    /// Millicores.
    pub cpu_millis: i64,
    /// Bytes.
    pub memory_bytes: i64,
    /// Micro-EUR per hour.
    pub price_micros: i64,
}

/// An hourly price in micro-EUR (`price × 10⁶`, rounded), as [`Draw`] and [`Headroom`] count it.
pub fn price_micros(price: f64) -> i64 {
    // `as` saturates, and maps NaN to 0: no price can overflow the count.
    (price * 1e6).round() as i64
}

/// Hub-wide settings of the scheduler (karpenter-semantics §0.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `Respect` (default) or `Ignore` preferred affinities and `ScheduleAnyway` spreads.
    pub preference_policy: PreferencePolicy,
    /// `Strict` (default) or `BestEffort` minValues.
    pub min_values_policy: MinValuesPolicy,
    /// Instance types kept per new claim, cheapest first (`MAX_INSTANCE_TYPES`, 600).
    pub max_instance_types: usize,
    /// Improve the cost of claims holding only unconstrained pods after the solve (see [`crate::repack`]).
    pub repack: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            preference_policy: PreferencePolicy::Respect,
            min_values_policy: MinValuesPolicy::Strict,
            max_instance_types: 600,
            repack: true,
        }
    }
}

/// What to do with soft constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreferencePolicy {
    /// Preferences act as requirements until relaxed.
    #[default]
    Respect,
    /// Preferred affinities and `ScheduleAnyway` spreads are dropped up front.
    Ignore,
}

/// What to do when fewer values than `minValues` remain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinValuesPolicy {
    /// Placement fails.
    #[default]
    Strict,
    /// minValues is lowered to what remains, and the claim is annotated.
    BestEffort,
}

/// Resource limits of a pool; `None` is unlimited. Compared with node capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Millicores.
    pub cpu_millis: Option<i64>,
    /// Bytes.
    pub memory_bytes: Option<i64>,
    /// Bytes.
    pub ephemeral_storage_bytes: Option<i64>,
    /// Pod slots.
    pub pods: Option<i64>,
    /// Nodes.
    pub nodes: Option<i64>,
    /// Extended resources (`nvidia.com/gpu`), in units: a resource not named is unlimited.
    pub extended: BTreeMap<String, i64>,
}

/// What a pool already uses: Σ capacity of its active nodes and in-flight claims, and their count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Σ capacity.
    pub resources: Resources,
    /// Σ extended resources.
    pub extended: BTreeMap<String, i64>,
    /// Number of nodes and in-flight claims.
    pub nodes: i64,
}

impl Usage {
    /// Counts a node (or in-flight claim) of the pool.
    pub fn count(&mut self, n: &ExistingNode) {
        self.resources += n.capacity;
        self.nodes += 1;
        crds::quantity::extended_add(&mut self.extended, &n.extended);
    }
}

/// A NodePool as the scheduler sees it.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    /// Name.
    pub name: String,
    /// Weight (absent = 0).
    pub weight: i32,
    /// `spec.template.spec.requirements`.
    pub requirements: Vec<NodeSelectorRequirement>,
    /// `spec.template.metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.template.spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.template.spec.startupTaints`.
    pub startup_taints: Vec<Taint>,
    /// `spec.limits`.
    pub limits: Limits,
    /// Current usage.
    pub usage: Usage,
    /// Instance types of the pool's node class (the merged flavor catalogue).
    pub instance_types: Vec<InstanceType>,
}

/// `Equal` or `Exists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TolerationOperator {
    /// Key and value must match.
    #[default]
    Equal,
    /// Key must match (any value); an empty key tolerates every taint.
    Exists,
}

/// A pod's toleration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Toleration {
    /// Taint key; empty with `Exists` tolerates everything.
    pub key: String,
    /// `Equal` (default) or `Exists`.
    pub operator: TolerationOperator,
    /// Value for `Equal`.
    pub value: String,
    /// Effect; `None` matches every effect.
    pub effect: Option<TaintEffect>,
}

/// Operator of a label selector expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// Label value in the set.
    In,
    /// Label absent or value not in the set.
    NotIn,
    /// Label present.
    Exists,
    /// Label absent.
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SelectorRequirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub operator: SelectorOperator,
    /// Values.
    pub values: Vec<String>,
}

/// A label selector (`matchLabels` ∧ `matchExpressions`); the empty selector selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LabelSelector {
    /// `matchLabels`.
    pub match_labels: BTreeMap<String, String>,
    /// `matchExpressions`.
    pub match_expressions: Vec<SelectorRequirement>,
}

/// A pod (anti-)affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PodAffinityTerm {
    /// `labelSelector`; `None` selects nothing.
    pub selector: Option<LabelSelector>,
    /// `namespaces`.
    pub namespaces: Vec<String>,
    /// `namespaceSelector`; `Some(empty)` selects every namespace.
    pub namespace_selector: Option<LabelSelector>,
    /// `topologyKey`.
    pub topology_key: String,
    /// `matchLabelKeys`: the pod's values for these keys join the selector.
    pub match_label_keys: Vec<String>,
}

/// A preferred pod (anti-)affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct WeightedPodAffinityTerm {
    /// 1..100.
    pub weight: i32,
    /// The term.
    pub term: PodAffinityTerm,
}

/// A preferred node-affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WeightedNodeTerm {
    /// 1..100.
    pub weight: i32,
    /// Expressions, AND'ed.
    pub requirements: Vec<NodeSelectorRequirement>,
}

/// `DoNotSchedule` or `ScheduleAnyway`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenUnsatisfiable {
    /// Hard constraint.
    #[default]
    DoNotSchedule,
    /// Soft constraint (relaxed).
    ScheduleAnyway,
}

/// `Honor` or `Ignore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeInclusionPolicy {
    /// Take into account.
    Honor,
    /// Disregard.
    Ignore,
}

/// A topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpreadConstraint {
    /// `maxSkew`.
    pub max_skew: i32,
    /// `topologyKey`.
    pub topology_key: String,
    /// `whenUnsatisfiable`.
    pub when_unsatisfiable: WhenUnsatisfiable,
    /// `labelSelector`; `None` selects nothing (the constraint never restricts).
    pub selector: Option<LabelSelector>,
    /// `minDomains`.
    pub min_domains: Option<i32>,
    /// `nodeAffinityPolicy` (default `Honor`).
    pub node_affinity_policy: NodeInclusionPolicy,
    /// `nodeTaintsPolicy` (default `Ignore`).
    pub node_taints_policy: NodeInclusionPolicy,
    /// `matchLabelKeys`.
    pub match_label_keys: Vec<String>,
}

/// A host port a pod binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HostPort {
    /// Host IP; empty or `0.0.0.0` is unspecified.
    pub ip: String,
    /// Port.
    pub port: i32,
    /// `TCP` (default), `UDP`, `SCTP`.
    pub protocol: String,
}

/// Scheduling constraints of a pod: pods with equal constraints (and labels and namespace) share all
/// derived data in the solver.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Constraints {
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node-affinity terms, OR'ed (each term's expressions AND'ed).
    pub required_terms: Vec<Vec<NodeSelectorRequirement>>,
    /// Preferred node-affinity terms.
    pub preferred_terms: Vec<WeightedNodeTerm>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Required pod affinity.
    pub pod_affinity: Vec<PodAffinityTerm>,
    /// Preferred pod affinity.
    pub preferred_pod_affinity: Vec<WeightedPodAffinityTerm>,
    /// Required pod anti-affinity.
    pub pod_anti_affinity: Vec<PodAffinityTerm>,
    /// Preferred pod anti-affinity.
    pub preferred_pod_anti_affinity: Vec<WeightedPodAffinityTerm>,
    /// Topology spread constraints.
    pub topology_spread: Vec<SpreadConstraint>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// Node requirements from the pod's volumes (a bound PV's node affinity, an unbound PVC's
    /// `allowedTopologies`), OR'ed alternatives; empty: none. They constrain the node only, never the
    /// pod's own topology eligibility (§3.12).
    pub volume_requirements: Vec<Vec<NodeSelectorRequirement>>,
}

impl Constraints {
    /// No pod-level topology: no spread, no pod (anti-)affinity.
    pub fn has_topology(&self) -> bool {
        !(self.pod_affinity.is_empty()
            && self.preferred_pod_affinity.is_empty()
            && self.pod_anti_affinity.is_empty()
            && self.preferred_pod_anti_affinity.is_empty()
            && self.topology_spread.is_empty())
    }
}

/// A pod to place.
#[derive(Debug, Clone, Default)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (queue tie-break).
    pub uid: String,
    /// Creation time, seconds since the epoch (queue order).
    pub created: i64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Effective requests (§3.8), `pods: 1` included.
    pub requests: Resources,
    /// Extended resources requested (`nvidia.com/gpu`, ...), non-zero only: only flavors a
    /// NodeOverlay gives them to (and nodes reporting them) offer any.
    pub extended: BTreeMap<String, i64>,
    /// Constraints.
    pub constraints: Constraints,
    /// CSI volumes it mounts: `(driver, namespace/claim)` (attach limits of existing nodes, §3.12).
    pub csi_volumes: Vec<(String, String)>,
    /// A CapacityBuffer's pod (`namespace/name` of the buffer), not a real one: placed after every
    /// real pod (the lowest priority), so it never takes room or a limit a real pod could use.
    pub buffer: Option<String>,
}

impl Pod {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A pod already bound to an existing node.
#[derive(Debug, Clone, Default)]
pub struct RunningPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Requests.
    pub requests: Resources,
    /// Extended resources requested, non-zero only.
    pub extended: BTreeMap<String, i64>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// `namespace/name` of the owning DaemonSet, if any.
    pub daemonset: Option<String>,
    /// Required pod anti-affinity terms (applied in reverse to new pods).
    pub anti_affinity: Vec<PodAffinityTerm>,
    /// Counted by topology: not terminal, not terminating.
    pub counted: bool,
    /// CSI volumes it mounts: `(driver, namespace/claim)`.
    pub csi_volumes: Vec<(String, String)>,
}

impl From<Pod> for RunningPod {
    /// `pod` bound to a node: what it takes there and what it keeps away; counted by topology, no
    /// DaemonSet's (callers that know better set those two).
    fn from(pod: Pod) -> RunningPod {
        RunningPod {
            namespace: pod.namespace,
            name: pod.name,
            labels: pod.labels,
            requests: pod.requests,
            extended: pod.extended,
            host_ports: pod.constraints.host_ports,
            daemonset: None,
            anti_affinity: pod.constraints.pod_anti_affinity,
            counted: true,
            csi_volumes: pod.csi_volumes,
        }
    }
}

/// Existing capacity: a node, or an in-flight claim without one.
#[derive(Debug, Clone, Default)]
pub struct ExistingNode {
    /// Node name (or claim name for an in-flight claim).
    pub name: String,
    /// Labels (an in-flight claim: the single values of its requirements).
    pub labels: BTreeMap<String, String>,
    /// Taints (an unregistered claim: its own `taints`).
    pub taints: Vec<Taint>,
    /// The claim's startup taints (ignored while a managed node is uninitialized).
    pub startup_taints: Vec<Taint>,
    /// Allocatable.
    pub allocatable: Resources,
    /// Capacity.
    pub capacity: Resources,
    /// Extended resources allocatable (`nvidia.com/gpu: 1`); a managed node not initialized yet
    /// also counts what its claim's flavor offers (its device plugin may not have reported them).
    pub extended: BTreeMap<String, i64>,
    /// Pods bound to it.
    pub pods: Vec<RunningPod>,
    /// Owned by the hub (a NodeClaim exists).
    pub managed: bool,
    /// Initialized (`karpenter.sh/initialized=true`, or an unmanaged node that is Ready).
    pub initialized: bool,
    /// Pool of a managed node.
    pub nodepool: Option<String>,
    /// CSI attach limits per driver (`CSINode.spec.drivers[].allocatable.count`); absent: unlimited.
    pub csi_limits: BTreeMap<String, i64>,
}

/// A DaemonSet, as the pod it would put on every compatible node.
#[derive(Debug, Clone, Default)]
pub struct DaemonSet {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The newest real pod, else the template with limits standing in for requests.
    pub pod: Pod,
}

impl DaemonSet {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The decision of a round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Claims to create, in creation order.
    pub new_claims: Vec<NewClaim>,
    /// Existing nodes (by index in [`Input::nodes`]) receiving pods, in node order.
    pub existing: Vec<NodeAssignment>,
    /// Pods that cannot be placed, in input order, with a reason a user can act on.
    pub unschedulable: Vec<Unschedulable>,
    /// What the new claims draw on each shared limit, in the order of [`Input::shared`]: per claim
    /// and dimension, the largest draw among its options (the launch picks one of them), summed.
    pub shared_drawn: Vec<Draw>,
}

impl Decision {
    /// Σ price of the new claims' cheapest options.
    pub fn total_price(&self) -> f64 {
        self.new_claims.iter().fold(0.0, |acc, c| acc + c.price)
    }
}

/// One instance type a claim may launch.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimOption {
    /// Flavor name.
    pub name: String,
    /// Price under the claim's requirements, EUR/h.
    pub price: f64,
}

/// A claim to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewClaim {
    /// Pool name.
    pub nodepool: String,
    /// Options, cheapest first (at most `max_instance_types`).
    pub instance_types: Vec<ClaimOption>,
    /// Price of the cheapest option: what would be launched.
    pub price: f64,
    /// Pods (indices in [`Input::pods`]).
    pub pods: Vec<usize>,
    /// Σ pod requests + the minimum DaemonSet overhead.
    pub requests: Resources,
    /// Σ the pods' extended resources (every option offers them).
    pub extended: BTreeMap<String, i64>,
    /// Requirements of the claim (instance types, capacity type narrowed, one value per custom key).
    pub requirements: Vec<NodeSelectorRequirement>,
    /// Labels of the claim.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Startup taints.
    pub startup_taints: Vec<Taint>,
    /// BestEffort lowered a minValues.
    pub min_values_relaxed: bool,
}

/// Pods placed on an existing node (nominated, never bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAssignment {
    /// Index in [`Input::nodes`].
    pub node: usize,
    /// Pods (indices in [`Input::pods`]).
    pub pods: Vec<usize>,
}

/// A pod left pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    /// Index in [`Input::pods`].
    pub pod: usize,
    /// Why, naming keys, quantities and pools.
    pub reason: String,
}
