//! `sim::cke::fit`: the simulated binder's placement logic, a small kube-scheduler.
//!
//! Owns: deciding, for each pending pod, the node it is bound to or the kube-scheduler-like
//! `Unschedulable` message it gets. Filters, in kube-scheduler's plugin order (the first failing
//! filter names a node's reason): `NodeUnschedulable`, `TaintToleration` (`NoSchedule` and
//! `NoExecute`), `NodeAffinity` (`nodeSelector` and required node affinity), `NodeResourcesFit`
//! (cpu, memory, ephemeral-storage, pod count), `InterPodAffinity` (required terms only).
//! Among fitting nodes the least-allocated one wins, ties by name, so the outcome is deterministic.
//!
//! Must not: do I/O, read a clock, or depend on the hub's `scheduling` crate (tests of the hub must
//! not be judged by the hub's own code). Not modelled: extended resources, host ports, volumes,
//! topology spread constraints, preemption, `namespaceSelector` with labels (treated as "the pod's
//! namespace"), pod-level `spec.resources`.

use std::collections::{BTreeMap, HashMap};

use crds::quantity::Resources;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodAffinityTerm, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Scheduler name the binder serves (a pod with no `schedulerName` gets this one).
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// Label kube-scheduler's hostname topology uses.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Why a node cannot take a pod, with the wording kube-scheduler uses in its message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FitFailure {
    /// `spec.unschedulable` (cordoned) and the pod does not tolerate `node.kubernetes.io/unschedulable`.
    Unschedulable,
    /// A `NoSchedule`/`NoExecute` taint the pod does not tolerate.
    UntoleratedTaint {
        /// Taint key.
        key: String,
        /// Taint value (empty when none).
        value: String,
    },
    /// `nodeSelector` or required node affinity does not match.
    NodeAffinity,
    /// Not enough of these resources left (`cpu`, `memory`, `ephemeral-storage`).
    Insufficient(Vec<&'static str>),
    /// Not enough of this extended resource left (`nvidia.com/gpu`): the node has none, or its
    /// pods use it.
    InsufficientExtended(String),
    /// The node's pod capacity is used up.
    TooManyPods,
    /// A required pod affinity term has no matching pod in the node's topology domain.
    PodAffinity,
    /// The pod's required anti-affinity, or an existing pod's, forbids the node.
    PodAntiAffinity,
    /// The node is being deleted.
    Terminating,
}

impl FitFailure {
    /// The reasons kube-scheduler lists for one node (one per insufficient resource).
    fn reasons(&self) -> Vec<String> {
        match self {
            FitFailure::Unschedulable => vec!["node(s) were unschedulable".to_string()],
            FitFailure::UntoleratedTaint { key, value } => {
                vec![format!("node(s) had untolerated taint {{{key}: {value}}}")]
            }
            FitFailure::NodeAffinity => vec!["node(s) didn't match Pod's node affinity/selector".to_string()],
            FitFailure::Insufficient(resources) => resources.iter().map(|r| format!("Insufficient {r}")).collect(),
            FitFailure::InsufficientExtended(r) => vec![format!("Insufficient {r}")],
            FitFailure::TooManyPods => vec!["Too many pods".to_string()],
            FitFailure::PodAffinity => vec!["node(s) didn't match pod affinity rules".to_string()],
            FitFailure::PodAntiAffinity => vec!["node(s) didn't match pod anti-affinity rules".to_string()],
            FitFailure::Terminating => vec!["node(s) were being deleted".to_string()],
        }
    }
}

/// The binder's decision for one pending pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bind `namespace/name` to `node`.
    Bind {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Target node.
        node: String,
    },
    /// Mark `namespace/name` `PodScheduled=False, reason=Unschedulable` with `message`.
    Unschedulable {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// kube-scheduler-like message.
        message: String,
    },
}

/// Whether a pod is waiting for this binder: no node, default scheduler, no scheduling gate, not
/// being deleted, not finished.
pub fn is_pending_for_binder(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let no_node = spec.node_name.as_deref().is_none_or(str::is_empty);
    let ours = spec.scheduler_name.as_deref().is_none_or(|s| s.is_empty() || s == DEFAULT_SCHEDULER);
    // kube-scheduler leaves pods with scheduling gates alone until the gates are removed.
    let gated = spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty());
    no_node && ours && !gated && pod.metadata.deletion_timestamp.is_none() && !is_terminal(pod)
}

/// Whether a pod has finished (`Succeeded` or `Failed`): it holds no resources any more.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The requests a pod is scheduled with: for each resource, the larger of the sum over regular
/// containers and sidecars and the largest init container (plus the sidecars started before it),
/// plus `spec.overhead`; one pod. Unparsable quantities count as zero (the API server would have
/// refused them).
pub fn pod_requests(pod: &Pod) -> Resources {
    let Some(spec) = pod.spec.as_ref() else { return Resources { pods: 1, ..Resources::ZERO } };
    let mut sum = spec.containers.iter().map(container_requests).fold(Resources::ZERO, Resources::saturating_add);
    let mut init_max = Resources::ZERO;
    let mut sidecars = Resources::ZERO;
    for init in spec.init_containers.iter().flatten() {
        let req = container_requests(init);
        if init.restart_policy.as_deref() == Some("Always") {
            sidecars += req;
            sum += req;
        } else {
            init_max = max_each(init_max, sidecars + req);
        }
    }
    let overhead = spec.overhead.as_ref().and_then(|o| Resources::from_resource_list(o).ok()).unwrap_or_default();
    let mut total = max_each(sum, init_max) + overhead;
    total.pods = 1;
    total
}

/// The extended resources a pod requests (every resource but the node ones): the sum over its
/// containers, or its largest init container when more (requests, else limits).
pub fn pod_extended(pod: &Pod) -> BTreeMap<String, i64> {
    let Some(spec) = pod.spec.as_ref() else { return BTreeMap::new() };
    let of = |c: &Container| {
        let resources = c.resources.as_ref();
        let mut merged = resources.and_then(|r| r.limits.clone()).unwrap_or_default();
        merged.extend(resources.and_then(|r| r.requests.clone()).unwrap_or_default());
        crds::quantity::extended_of(&merged).unwrap_or_default()
    };
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in of(c) {
            *total.entry(k).or_insert(0) += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in of(c) {
            let e = total.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    total
}

/// A node's extended resources allocatable (capacity when allocatable is absent).
fn node_extended(node: &Node) -> BTreeMap<String, i64> {
    let status = node.status.as_ref();
    let list = status.and_then(|s| s.allocatable.as_ref()).or_else(|| status.and_then(|s| s.capacity.as_ref()));
    list.and_then(|l| crds::quantity::extended_of(l).ok()).unwrap_or_default()
}

fn container_requests(c: &Container) -> Resources {
    // A container with limits but no requests gets requests = limits (API defaulting); be lenient
    // when talking to a server that did not default.
    let resources = c.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let mut merged = limits.cloned().unwrap_or_default();
    merged.extend(requests.cloned().unwrap_or_default());
    let mut r = Resources::ZERO;
    for key in [crds::quantity::CPU, crds::quantity::MEMORY, crds::quantity::EPHEMERAL_STORAGE] {
        if let Some(q) = merged.get(key) {
            let one = BTreeMap::from([(key.to_string(), q.clone())]);
            r += Resources::from_resource_list(&one).unwrap_or_default();
        }
    }
    r
}

fn max_each(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu_millis: a.cpu_millis.max(b.cpu_millis),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
        ephemeral_storage_bytes: a.ephemeral_storage_bytes.max(b.ephemeral_storage_bytes),
        pods: a.pods.max(b.pods),
    }
}

/// A node's allocatable resources (capacity when allocatable is absent).
pub fn node_allocatable(node: &Node) -> Resources {
    let status = node.status.as_ref();
    let list = status.and_then(|s| s.allocatable.as_ref()).or_else(|| status.and_then(|s| s.capacity.as_ref()));
    list.and_then(|l| Resources::from_resource_list(l).ok()).unwrap_or_default()
}

/// Whether `tolerations` tolerate `taint` (Kubernetes' `ToleratesTaint`).
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
        let key = t.key.as_deref().unwrap_or("");
        let key_ok = key.is_empty() || key == taint.key;
        let value_ok = match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            "Equal" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
            _ => false,
        };
        // An empty key with operator Exists tolerates everything; an empty key with Equal is invalid.
        effect_ok && key_ok && value_ok && (!key.is_empty() || t.operator.as_deref() == Some("Exists"))
    })
}

/// Whether a label set matches a node selector requirement (`In`, `NotIn`, `Exists`,
/// `DoesNotExist`, `Gt`, `Lt`).
pub fn requirement_matches(labels: &BTreeMap<String, String>, req: &NodeSelectorRequirement) -> bool {
    let value = labels.get(&req.key);
    let values = req.values.as_deref().unwrap_or(&[]);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value, values) else { return false };
            match (v.parse::<i64>(), bound.parse::<i64>()) {
                (Ok(v), Ok(b)) if req.operator == "Gt" => v > b,
                (Ok(v), Ok(b)) => v < b,
                _ => false,
            }
        }
        _ => false,
    }
}

fn term_matches(node: &Node, term: &NodeSelectorTerm) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing.
        return false;
    }
    let name = BTreeMap::from([("metadata.name".to_string(), node.metadata.name.clone().unwrap_or_default())]);
    exprs.iter().all(|r| requirement_matches(labels, r))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement_matches(&name, r))
}

/// Whether a node satisfies a pod's `nodeSelector` and required node affinity.
pub fn node_affinity_matches(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return true };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let selector_ok = spec.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref());
    let affinity_ok = required.is_none_or(|sel| sel.node_selector_terms.iter().any(|t| term_matches(node, t)));
    selector_ok && affinity_ok
}

/// Whether `labels` match a label selector (`matchLabels` and `matchExpressions`). A missing
/// selector matches nothing, an empty one everything (as in pod affinity terms).
pub fn label_selector_matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else { return false };
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or(&[]);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The state the binder decides on: nodes and the pods already bound to them.
#[derive(Debug)]
pub struct Snapshot<'a> {
    nodes: Vec<NodeState<'a>>,
    /// (node, pod) indices of the pods that carry required anti-affinity terms.
    anti_affinity_holders: Vec<(usize, usize)>,
}

#[derive(Debug)]
struct NodeState<'a> {
    node: &'a Node,
    name: String,
    allocatable: Resources,
    requested: Resources,
    /// Extended resources: allocatable, and what its pods request.
    extended: BTreeMap<String, i64>,
    extended_requested: BTreeMap<String, i64>,
    /// (namespace, labels, required anti-affinity terms) of the pods on the node.
    pods: Vec<PodInfo>,
}

#[derive(Debug, Clone)]
struct PodInfo {
    namespace: String,
    labels: BTreeMap<String, String>,
    anti_affinity: Vec<PodAffinityTerm>,
}

impl PodInfo {
    fn of(pod: &Pod) -> PodInfo {
        let anti_affinity = pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.clone())
            .unwrap_or_default();
        PodInfo {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            anti_affinity,
        }
    }
}

/// Whether `term` (of a pod in `owner_namespace`) selects `other`.
fn term_selects(term: &PodAffinityTerm, owner_namespace: &str, other: &PodInfo) -> bool {
    let namespaces = term.namespaces.as_deref().unwrap_or(&[]);
    let ns_ok = if !namespaces.is_empty() {
        namespaces.contains(&other.namespace)
    } else if let Some(sel) = term.namespace_selector.as_ref() {
        // An empty namespaceSelector means all namespaces; a non-empty one would need namespace
        // labels, which the binder does not read: judged as "the pod's own namespace".
        let empty = sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && sel.match_expressions.as_ref().is_none_or(Vec::is_empty);
        empty || other.namespace == owner_namespace
    } else {
        other.namespace == owner_namespace
    };
    ns_ok && label_selector_matches(term.label_selector.as_ref(), &other.labels)
}

impl<'a> Snapshot<'a> {
    /// Builds the snapshot from all nodes and all pods (pods not bound to a listed node, and
    /// finished pods, are ignored).
    pub fn new(nodes: &'a [Node], pods: &[Pod]) -> Snapshot<'a> {
        let mut states: Vec<NodeState<'a>> = nodes
            .iter()
            .map(|node| NodeState {
                node,
                name: node.metadata.name.clone().unwrap_or_default(),
                allocatable: node_allocatable(node),
                requested: Resources::ZERO,
                extended: node_extended(node),
                extended_requested: BTreeMap::new(),
                pods: Vec::new(),
            })
            .collect();
        states.sort_by(|a, b| a.name.cmp(&b.name));
        let index: HashMap<String, usize> = states.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let mut holders = Vec::new();
        for pod in pods {
            if is_terminal(pod) {
                continue;
            }
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
            if let Some(&i) = index.get(node) {
                let info = PodInfo::of(pod);
                if !info.anti_affinity.is_empty() {
                    holders.push((i, states[i].pods.len()));
                }
                states[i].requested += pod_requests(pod);
                crds::quantity::extended_add(&mut states[i].extended_requested, &pod_extended(pod));
                states[i].pods.push(info);
            }
        }
        Snapshot { nodes: states, anti_affinity_holders: holders }
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn topology_value<'n>(&'n self, node: usize, key: &str) -> Option<&'n str> {
        let state = &self.nodes[node];
        let label = state.node.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str);
        match label {
            Some(v) => Some(v),
            // Nodes the sim makes always carry a hostname label; be lenient with hand-made ones.
            None if key == HOSTNAME_LABEL => Some(state.name.as_str()),
            None => None,
        }
    }

    /// Pods in the same `key` topology domain as `node` (including the node's own pods).
    fn pods_in_domain(&self, node: usize, key: &str) -> Vec<&PodInfo> {
        let Some(value) = self.topology_value(node, key) else { return Vec::new() };
        (0..self.nodes.len())
            .filter(|&i| self.topology_value(i, key) == Some(value))
            .flat_map(|i| self.nodes[i].pods.iter())
            .collect()
    }

    /// Checks whether `pod` (with `requests`) fits node number `i`; the first failing filter wins.
    fn check(
        &self,
        pod: &Pod,
        me: &PodInfo,
        requests: &Resources,
        extended: &BTreeMap<String, i64>,
        i: usize,
    ) -> Result<(), FitFailure> {
        let state = &self.nodes[i];
        let node = state.node;
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
        if node.metadata.deletion_timestamp.is_some() {
            return Err(FitFailure::Terminating);
        }
        if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            let cordon = Taint {
                key: "node.kubernetes.io/unschedulable".to_string(),
                effect: "NoSchedule".to_string(),
                ..Taint::default()
            };
            if !tolerates(tolerations, &cordon) {
                return Err(FitFailure::Unschedulable);
            }
        }
        for taint in node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[]) {
            if (taint.effect == "NoSchedule" || taint.effect == "NoExecute") && !tolerates(tolerations, taint) {
                return Err(FitFailure::UntoleratedTaint {
                    key: taint.key.clone(),
                    value: taint.value.clone().unwrap_or_default(),
                });
            }
        }
        if !node_affinity_matches(pod, node) {
            return Err(FitFailure::NodeAffinity);
        }
        let free = state.allocatable - state.requested;
        if requests.pods > free.pods {
            return Err(FitFailure::TooManyPods);
        }
        let mut short = Vec::new();
        if requests.cpu_millis > free.cpu_millis {
            short.push(crds::quantity::CPU);
        }
        if requests.memory_bytes > free.memory_bytes {
            short.push(crds::quantity::MEMORY);
        }
        if requests.ephemeral_storage_bytes > free.ephemeral_storage_bytes {
            short.push(crds::quantity::EPHEMERAL_STORAGE);
        }
        if !short.is_empty() {
            return Err(FitFailure::Insufficient(short));
        }
        for (k, v) in extended {
            let left =
                state.extended.get(k).copied().unwrap_or(0) - state.extended_requested.get(k).copied().unwrap_or(0);
            if *v > left {
                return Err(FitFailure::InsufficientExtended(k.clone()));
            }
        }
        self.check_pod_affinity(pod, me, i)
    }

    fn check_pod_affinity(&self, pod: &Pod, me: &PodInfo, i: usize) -> Result<(), FitFailure> {
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        // Existing pods' anti-affinity against the incoming pod (only the few pods that have some).
        for &(j, k) in &self.anti_affinity_holders {
            let other = &self.nodes[j].pods[k];
            for term in &other.anti_affinity {
                if term_selects(term, &other.namespace, me)
                    && self.topology_value(j, &term.topology_key).is_some()
                    && self.topology_value(j, &term.topology_key) == self.topology_value(i, &term.topology_key)
                {
                    return Err(FitFailure::PodAntiAffinity);
                }
            }
        }
        for term in &me.anti_affinity {
            if self.pods_in_domain(i, &term.topology_key).iter().any(|other| term_selects(term, &me.namespace, other)) {
                return Err(FitFailure::PodAntiAffinity);
            }
        }
        let required = affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_deref())
            .unwrap_or(&[]);
        for term in required {
            if self.topology_value(i, &term.topology_key).is_none() {
                return Err(FitFailure::PodAffinity);
            }
            let in_domain =
                self.pods_in_domain(i, &term.topology_key).iter().any(|other| term_selects(term, &me.namespace, other));
            if in_domain {
                continue;
            }
            // kube-scheduler's special case: no pod matches anywhere and the pod matches its own
            // term, so the first pod of a group can land.
            let anywhere =
                self.nodes.iter().flat_map(|s| s.pods.iter()).any(|other| term_selects(term, &me.namespace, other));
            if anywhere || !term_selects(term, &me.namespace, me) {
                return Err(FitFailure::PodAffinity);
            }
        }
        Ok(())
    }

    /// Least-allocated score after placing `requests` on node `i` (higher is emptier), in
    /// thousandths, averaged over cpu and memory.
    fn score(&self, requests: &Resources, i: usize) -> i64 {
        let state = &self.nodes[i];
        let used = state.requested + *requests;
        let part = |alloc: i64, used: i64| if alloc <= 0 { 0 } else { (alloc - used).max(0) * 1000 / alloc };
        (part(state.allocatable.cpu_millis, used.cpu_millis) + part(state.allocatable.memory_bytes, used.memory_bytes))
            / 2
    }

    /// Decides one pod: the best fitting node (recorded in the snapshot, so later pods see it), or
    /// the per-node failures.
    pub fn place(&mut self, pod: &Pod) -> Result<String, Vec<FitFailure>> {
        let requests = pod_requests(pod);
        let extended = pod_extended(pod);
        let me = PodInfo::of(pod);
        let mut best: Option<(i64, usize)> = None;
        let mut failures = Vec::new();
        for i in 0..self.nodes.len() {
            match self.check(pod, &me, &requests, &extended, i) {
                Ok(()) => {
                    let score = self.score(&requests, i);
                    // Nodes are sorted by name: the first of equal scores wins.
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, i));
                    }
                }
                Err(f) => failures.push(f),
            }
        }
        match best {
            Some((_, i)) => {
                self.nodes[i].requested += requests;
                crds::quantity::extended_add(&mut self.nodes[i].extended_requested, &extended);
                if !me.anti_affinity.is_empty() {
                    self.anti_affinity_holders.push((i, self.nodes[i].pods.len()));
                }
                self.nodes[i].pods.push(me);
                Ok(self.nodes[i].name.clone())
            }
            None => Err(failures),
        }
    }
}

/// kube-scheduler's `FitError` message: `0/N nodes are available: <count reason, …>.` with the
/// reasons sorted, then its preemption summary (`No preemption victims found for incoming pod` for
/// nodes short of resources or blocked by pod anti-affinity, which evicting pods could fix but the
/// binder never does; `Preemption is not helpful for scheduling` for the others);
/// `no nodes available to schedule pods` when there is no node at all.
pub fn unschedulable_message(node_count: usize, failures: &[FitFailure]) -> String {
    if node_count == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut preemption: BTreeMap<&str, usize> = BTreeMap::new();
    for f in failures {
        for reason in f.reasons() {
            *counts.entry(reason).or_default() += 1;
        }
        let resolvable = matches!(
            f,
            FitFailure::Insufficient(_)
                | FitFailure::InsufficientExtended(_)
                | FitFailure::TooManyPods
                | FitFailure::PodAntiAffinity
        );
        let summary = if resolvable {
            "No preemption victims found for incoming pod"
        } else {
            "Preemption is not helpful for scheduling"
        };
        *preemption.entry(summary).or_default() += 1;
    }
    let join = |m: Vec<String>| m.join(", ");
    let reasons = join(counts.iter().map(|(r, n)| format!("{n} {r}")).collect());
    let preemption = join(preemption.iter().map(|(r, n)| format!("{n} {r}")).collect());
    format!(
        "0/{node_count} nodes are available: {reasons}. preemption: 0/{node_count} nodes are available: {preemption}."
    )
}

/// Decides every pending pod of `pods` against `nodes`, highest priority first, then oldest, then
/// by namespace/name. Pods already bound are accounted on their nodes.
pub fn decide(nodes: &[Node], pods: &[Pod]) -> Vec<Decision> {
    let mut snapshot = Snapshot::new(nodes, pods);
    let mut pending: Vec<&Pod> = pods.iter().filter(|p| is_pending_for_binder(p)).collect();
    pending.sort_by(|a, b| {
        let prio = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let key =
            |p: &Pod| (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        prio(b).cmp(&prio(a)).then_with(|| created(a).cmp(&created(b))).then_with(|| key(a).cmp(&key(b)))
    });
    pending
        .into_iter()
        .map(|pod| {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            match snapshot.place(pod) {
                Ok(node) => Decision::Bind { namespace, name, node },
                Err(failures) => Decision::Unschedulable {
                    namespace,
                    name,
                    message: unschedulable_message(snapshot.node_count(), &failures),
                },
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cpu: &str, memory: &str, extra: serde_json::Value) -> Node {
        let mut n = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "clever-cloud.com/cluster-node-role": "worker"}},
            "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "10Gi"}},
        });
        merge(&mut n, extra);
        serde_json::from_value(n).unwrap()
    }

    fn pod(name: &str, cpu: &str, memory: &str, extra: serde_json::Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        });
        merge(&mut p, extra);
        serde_json::from_value(p).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn bound(p: Pod, node: &str) -> Pod {
        let mut p = p;
        p.spec.as_mut().unwrap().node_name = Some(node.to_string());
        p
    }

    #[test]
    fn requests_sum_containers_and_max_init() {
        let p = pod(
            "p",
            "500m",
            "1Gi",
            json!({"spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "250m"}}}
                ],
                "initContainers": [
                    {"name": "i", "resources": {"requests": {"cpu": "2", "memory": "100Mi"}}},
                    {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
                ],
                "overhead": {"memory": "10Mi"}
            }}),
        );
        let r = pod_requests(&p);
        assert_eq!(r.cpu_millis, 2000); // max(500+250+100, 2000)
        assert_eq!(r.memory_bytes, (1 << 30) + 10 * (1 << 20));
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn extended_resources_bind_only_where_the_node_has_them_left() {
        let gpu = |n: &str| json!({"status": {"allocatable": {"nvidia.com/gpu": n}}});
        let nodes = vec![node("a", "8", "8Gi", json!({})), node("g", "8", "8Gi", gpu("1"))];
        let wants = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let pods = vec![pod("train", "1", "1Gi", wants.clone()), pod("again", "1", "1Gi", wants)];
        let d = decide(&nodes, &pods);
        // Equal priority and age: by name, "again" first.
        assert_eq!(d[0], Decision::Bind { namespace: "default".into(), name: "again".into(), node: "g".into() });
        let Decision::Unschedulable { message, .. } = &d[1] else { panic!("{:?}", d[1]) };
        assert!(message.contains("2 Insufficient nvidia.com/gpu"), "{message}");
    }

    #[test]
    fn binds_to_fitting_node_and_accounts_bound_pods() {
        let nodes = vec![node("a", "2", "4Gi", json!({})), node("b", "4", "8Gi", json!({}))];
        let pods = vec![
            bound(pod("existing", "3", "1Gi", json!({})), "b"),
            pod("new", "1500m", "1Gi", json!({})),
            pod("second", "1", "1Gi", json!({})),
        ];
        let d = decide(&nodes, &pods);
        assert_eq!(d[0], Decision::Bind { namespace: "default".into(), name: "new".into(), node: "a".into() });
        // a has 500m left, b 1 CPU: second goes to b.
        assert_eq!(d[1], Decision::Bind { namespace: "default".into(), name: "second".into(), node: "b".into() });
    }

    #[test]
    fn insufficient_resources_message() {
        let nodes = vec![node("a", "2", "4Gi", json!({})), node("b", "2", "1Gi", json!({}))];
        let d = decide(&nodes, &[pod("big", "3", "2Gi", json!({}))]);
        let Decision::Unschedulable { message, .. } = &d[0] else { panic!("{d:?}") };
        assert_eq!(
            message,
            "0/2 nodes are available: 2 Insufficient cpu, 1 Insufficient memory. preemption: 0/2 nodes are \
             available: 2 No preemption victims found for incoming pod."
        );
    }

    #[test]
    fn no_nodes_message() {
        let d = decide(&[], &[pod("p", "1", "1Gi", json!({}))]);
        assert!(
            matches!(&d[0], Decision::Unschedulable { message, .. } if message == "no nodes available to schedule pods")
        );
    }

    #[test]
    fn taints_block_unless_tolerated() {
        let tainted = json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ]}});
        let unregistered = json!({"spec": {"taints": [
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
            {"key": "soft", "effect": "PreferNoSchedule"}
        ]}});
        let nodes = vec![node("a", "4", "8Gi", tainted), node("b", "4", "8Gi", unregistered)];
        let d = decide(&nodes, &[pod("p", "1", "1Gi", json!({}))]);
        let Decision::Unschedulable { message, .. } = &d[0] else { panic!("{d:?}") };
        assert!(message.contains("1 node(s) had untolerated taint {karpenter.sh/unregistered: }"), "{message}");
        assert!(message.contains("1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }"), "{message}");
        let tolerant = pod(
            "t",
            "1",
            "1Gi",
            json!({"spec": {"tolerations": [{"key": "karpenter.sh/unregistered", "operator": "Exists"}]}}),
        );
        let d = decide(&nodes, &[tolerant]);
        assert!(matches!(&d[0], Decision::Bind { node, .. } if node == "b"));
        let all = pod("all", "1", "1Gi", json!({"spec": {"tolerations": [{"operator": "Exists"}]}}));
        assert!(matches!(&decide(&nodes, &[all])[0], Decision::Bind { .. }));
    }

    #[test]
    fn toleration_matching_rules() {
        let taint = Taint { key: "k".into(), value: Some("v".into()), effect: "NoSchedule".into(), time_added: None };
        let t = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        assert!(tolerates(&[t(json!({"key": "k", "value": "v"}))], &taint));
        assert!(tolerates(
            &[t(json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}))],
            &taint
        ));
        assert!(!tolerates(&[t(json!({"key": "k", "value": "w"}))], &taint));
        assert!(!tolerates(&[t(json!({"key": "k", "operator": "Exists", "effect": "NoExecute"}))], &taint));
        assert!(tolerates(&[t(json!({"operator": "Exists"}))], &taint));
        assert!(!tolerates(&[t(json!({"value": "v"}))], &taint));
    }

    #[test]
    fn cordoned_nodes_are_skipped() {
        let nodes = vec![node("a", "4", "8Gi", json!({"spec": {"unschedulable": true}}))];
        let d = decide(&nodes, &[pod("p", "1", "1Gi", json!({}))]);
        assert!(
            matches!(&d[0], Decision::Unschedulable { message, .. } if message.contains("1 node(s) were unschedulable"))
        );
    }

    #[test]
    fn node_selector_and_required_affinity() {
        let nodes = vec![
            node(
                "cp",
                "8",
                "16Gi",
                json!({"metadata": {"labels": {"clever-cloud.com/cluster-node-role": "control-plane"}}}),
            ),
            node(
                "w",
                "2",
                "4Gi",
                json!({"metadata": {"labels": {"clever-cloud.com/flavor": "2XS", "cpu-count": "4"}}}),
            ),
        ];
        let sel =
            pod("s", "1", "1Gi", json!({"spec": {"nodeSelector": {"clever-cloud.com/cluster-node-role": "worker"}}}));
        assert!(matches!(&decide(&nodes, &[sel])[0], Decision::Bind { node, .. } if node == "w"));
        let aff = |op: &str, values: serde_json::Value| {
            pod(
                "a",
                "1",
                "1Gi",
                json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "clever-cloud.com/flavor", "operator": op, "values": values}]}]
                }}}}}),
            )
        };
        assert!(
            matches!(&decide(&nodes, &[aff("In", json!(["2XS", "XS"]))])[0], Decision::Bind { node, .. } if node == "w")
        );
        let d = decide(&nodes, &[aff("In", json!(["XL"]))]);
        assert!(matches!(&d[0], Decision::Unschedulable { message, .. }
            if message.starts_with("0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")));
        assert!(
            matches!(&decide(&nodes, &[aff("DoesNotExist", json!(null))])[0], Decision::Bind { node, .. } if node == "cp")
        );
        let labels = BTreeMap::from([("cpu-count".to_string(), "4".to_string())]);
        let req = |op: &str, v: &str| NodeSelectorRequirement {
            key: "cpu-count".into(),
            operator: op.into(),
            values: Some(vec![v.into()]),
        };
        assert!(requirement_matches(&labels, &req("Gt", "3")));
        assert!(!requirement_matches(&labels, &req("Gt", "4")));
        assert!(requirement_matches(&labels, &req("Lt", "5")));
        assert!(!requirement_matches(&labels, &req("Lt", "x")));
        assert!(requirement_matches(&labels, &req("NotIn", "5")));
    }

    #[test]
    fn match_fields_on_node_name() {
        let nodes = vec![node("a", "4", "8Gi", json!({})), node("b", "4", "8Gi", json!({}))];
        let p = pod(
            "p",
            "1",
            "1Gi",
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]
            }}}}}),
        );
        assert!(matches!(&decide(&nodes, &[p])[0], Decision::Bind { node, .. } if node == "b"));
    }

    #[test]
    fn too_many_pods() {
        let nodes = vec![node("a", "4", "8Gi", json!({"status": {"allocatable": {"pods": "1"}}}))];
        let pods = vec![pod("p1", "0", "0", json!({})), pod("p2", "0", "0", json!({}))];
        let d = decide(&nodes, &pods);
        assert!(matches!(&d[0], Decision::Bind { .. }));
        assert!(matches!(&d[1], Decision::Unschedulable { message, .. } if message.contains("1 Too many pods")));
    }

    #[test]
    fn required_anti_affinity_spreads_one_per_node() {
        let nodes = vec![node("a", "8", "16Gi", json!({})), node("b", "8", "16Gi", json!({}))];
        let anti = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
        ]}}}});
        let pods = vec![
            pod("w1", "1", "1Gi", anti.clone()),
            pod("w2", "1", "1Gi", anti.clone()),
            pod("w3", "1", "1Gi", anti.clone()),
        ];
        let d = decide(&nodes, &pods);
        let targets: Vec<_> = d
            .iter()
            .filter_map(|d| if let Decision::Bind { node, .. } = d { Some(node.clone()) } else { None })
            .collect();
        assert_eq!(targets.len(), 2);
        assert_ne!(targets[0], targets[1]);
        assert!(matches!(&d[2], Decision::Unschedulable { message, .. }
            if message.contains("2 node(s) didn't match pod anti-affinity rules")));
        // A pod without anti-affinity but selected by an existing pod's term is kept away too.
        let existing = vec![
            bound(pod("w1", "1", "1Gi", anti), "a"),
            pod("plain", "1", "1Gi", json!({"metadata": {"labels": {"app": "web"}}})),
        ];
        let d = decide(&nodes, &existing);
        assert!(matches!(&d[0], Decision::Bind { node, .. } if node == "b"));
    }

    #[test]
    fn required_pod_affinity() {
        let nodes = vec![node("a", "8", "16Gi", json!({})), node("b", "8", "16Gi", json!({}))];
        let with = |name: &str| {
            pod(
                name,
                "1",
                "1Gi",
                json!({"metadata": {"labels": {"app": "db"}}, "spec": {"affinity": {"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
                ]}}}}),
            )
        };
        // First pod of the group lands anywhere (self-match), the next follows it.
        let d = decide(&nodes, &[with("d1"), with("d2")]);
        let Decision::Bind { node: first, .. } = &d[0] else { panic!("{d:?}") };
        assert!(matches!(&d[1], Decision::Bind { node, .. } if node == first));
    }

    #[test]
    fn skips_non_pending_pods() {
        let nodes = vec![node("a", "4", "8Gi", json!({}))];
        let other_sched = pod("o", "1", "1Gi", json!({"spec": {"schedulerName": "custom"}}));
        let done = pod("d", "1", "1Gi", json!({"status": {"phase": "Succeeded"}}));
        let deleting = pod("x", "1", "1Gi", json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        let gated = pod("g", "1", "1Gi", json!({"spec": {"schedulingGates": [{"name": "example.com/wait"}]}}));
        assert!(decide(&nodes, &[other_sched, done, deleting, gated]).is_empty());
    }

    #[test]
    fn finished_pods_free_their_resources() {
        let nodes = vec![node("a", "2", "4Gi", json!({}))];
        let pods = vec![
            bound(pod("old", "2", "1Gi", json!({"status": {"phase": "Failed"}})), "a"),
            pod("new", "2", "1Gi", json!({})),
        ];
        assert!(matches!(&decide(&nodes, &pods)[0], Decision::Bind { .. }));
    }

    #[test]
    fn priority_then_age_orders_pending_pods() {
        let nodes = vec![node("a", "2", "4Gi", json!({}))];
        let pods = vec![
            pod("low", "2", "1Gi", json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}})),
            pod(
                "high",
                "2",
                "1Gi",
                json!({"metadata": {"creationTimestamp": "2026-01-02T00:00:00Z"}, "spec": {"priority": 100}}),
            ),
        ];
        let d = decide(&nodes, &pods);
        assert!(matches!(&d[0], Decision::Bind { name, .. } if name == "high"));
        assert!(matches!(&d[1], Decision::Unschedulable { name, .. } if name == "low"));
    }

    #[test]
    fn least_allocated_node_wins() {
        let nodes = vec![node("a", "2", "4Gi", json!({})), node("b", "8", "16Gi", json!({}))];
        let d = decide(&nodes, &[pod("p", "1", "1Gi", json!({}))]);
        assert!(matches!(&d[0], Decision::Bind { node, .. } if node == "b"));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod scale_tests {
    use super::*;
    use serde_json::json;

    /// A pass over a thousand pending pods and fifty nodes stays cheap (the binder runs one per
    /// burst of watch events).
    #[test]
    fn a_thousand_pods_on_fifty_nodes() {
        let nodes: Vec<Node> = (0..50)
            .map(|i| {
                serde_json::from_value(json!({
                    "metadata": {"name": format!("n{i}"), "labels": {"kubernetes.io/hostname": format!("n{i}")}},
                    "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}},
                }))
                .unwrap()
            })
            .collect();
        let pods: Vec<Pod> = (0..1000)
            .map(|i| {
                serde_json::from_value(json!({
                    "metadata": {"name": format!("p{i}"), "namespace": "default", "labels": {"app": format!("a{}", i % 10)}},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]},
                }))
                .unwrap()
            })
            .collect();
        let started = std::time::Instant::now();
        let decisions = decide(&nodes, &pods);
        let binds = decisions.iter().filter(|d| matches!(d, Decision::Bind { .. })).count();
        // 50 nodes × 16 pods of 500m.
        assert_eq!(binds, 800);
        eprintln!("decide(1000 pods, 50 nodes): {:?}", started.elapsed());
    }
}
