//! From API objects to the scheduler's input (karpenter-semantics §3.2, §3.3): which pods are
//! provisionable, which nodes and in-flight claims are existing capacity, each pool's instance types
//! (its node class and flavor catalogue), limits and usage, DaemonSet pods, and the counted pods of
//! topology.
//!
//! Owns the reading of Kubernetes shapes into [`crate::model`]. Pure: objects in, input and notes
//! out. Errors name the object and the field; things that are merely ignored become notes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crds::catalog::{Catalog, DEFAULT_ZONE, InstanceType};
use crds::quantity::{Resources, parse_quantity};
use crds::{CleverNodeClass, FlavorCatalog, NodeClaim, NodePool, labels};
use k8s_openapi::api::apps::v1::DaemonSet as K8sDaemonSet;
use k8s_openapi::api::core::v1::{
    Node as K8sNode, NodeSelectorRequirement as K8sNodeReq, PodSpec, Taint as K8sTaint, Toleration as K8sToleration,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::affinity::selector_matches;
use crate::compact::CompactPod;
use crate::model::{
    Constraints, DaemonSet, ExistingNode, HostPort, Input, LabelSelector, Limits, NodeInclusionPolicy,
    NodeSelectorRequirement, Operator, Pod, PodAffinityTerm, Pool, RunningPod, SelectorOperator, SelectorRequirement,
    Settings, SpreadConstraint, Taint, TaintEffect, Toleration, TolerationOperator, Usage, WeightedNodeTerm,
    WeightedPodAffinityTerm, WhenUnsatisfiable,
};
use crate::resources::pod_requests;

/// An object that cannot be read, naming it and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ConvertError {
    /// `Pod default/web-1`.
    pub object: String,
    /// `spec.containers[app].resources.requests.cpu`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The objects of one workload cluster and its scope, as listed.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// NodePools (all clusters; filtered by `clusterName`).
    pub node_pools: Vec<NodePool>,
    /// Node classes.
    pub node_classes: Vec<CleverNodeClass>,
    /// Flavor catalogues.
    pub flavor_catalogs: Vec<FlavorCatalog>,
    /// NodeClaims (all clusters; filtered by `clusterName`).
    pub node_claims: Vec<NodeClaim>,
    /// Nodes of the workload cluster. Shared (`Arc`), so that the operator hands its watch cache
    /// over without copying it.
    pub nodes: Vec<Arc<K8sNode>>,
    /// Pods of the workload cluster (shared, as nodes).
    pub pods: Vec<Arc<CompactPod>>,
    /// DaemonSets of the workload cluster.
    pub daemonsets: Vec<Arc<K8sDaemonSet>>,
    /// PodDisruptionBudgets of the workload cluster.
    pub pdbs: Vec<Arc<PodDisruptionBudget>>,
    /// The zone flavors are offered in (the one the hub launches in); [`DEFAULT_ZONE`] when unset.
    pub zone: Option<String>,
}

impl Snapshot {
    fn zone(&self) -> &str {
        self.zone.as_deref().unwrap_or(DEFAULT_ZONE)
    }
}

/// The storage objects of a workload cluster, for the volume checks of §3.2 (pods with invalid
/// volumes are not provisioned). `None`: not listed, so not checked.
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    /// PersistentVolumeClaims.
    pub pvcs: Option<Vec<PersistentVolumeClaim>>,
    /// StorageClasses.
    pub storage_classes: Option<Vec<StorageClass>>,
    /// PersistentVolumes (their node affinity constrains where pods using them may go).
    pub pvs: Option<Vec<PersistentVolume>>,
    /// CSINodes: attach limits of existing nodes per CSI driver.
    pub csinodes: Option<Vec<CSINode>>,
}

/// How pending pods are recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingRule {
    /// The operator: `PodScheduled=False/Unschedulable` from kube-scheduler is required (§3.2).
    Unschedulable,
    /// `plan`: every unbound pod counts (snapshots rarely carry status).
    Unbound,
}

/// The input of a round plus what was ignored and why.
#[derive(Debug, Clone, Default)]
pub struct Converted {
    /// The input.
    pub input: Input,
    /// Things ignored, for the user.
    pub notes: Vec<String>,
}

fn object(kind: &str, meta: &ObjectMeta) -> String {
    let namespaced = !matches!(kind, "Node");
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(n)) => format!("{kind} {ns}/{n}"),
        (None, Some(n)) if namespaced && kind != "NodePool" && kind != "NodeClaim" => format!("{kind} default/{n}"),
        (None, Some(n)) => format!("{kind} {n}"),
        _ => format!("{kind} (unnamed)"),
    }
}

fn err(object: &str, field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError { object: object.to_string(), field: field.into(), message: message.into() }
}

fn is_daemonset_pod(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet")
}

fn is_static_pod(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.kind == "Node")
}

fn is_terminal(p: &CompactPod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn unschedulable_by_scheduler(p: &CompactPod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

/// Whether an unbound pod is one the operator's round would take as pending (§3.2 under
/// [`PendingRule::Unschedulable`]): the trigger of the batch window, with the same tests as
/// [`build_input`] so a trigger never opens a round that has nothing to place.
pub fn triggers_provisioning(p: &CompactPod) -> bool {
    let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let nominated = p.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty());
    !bound
        && !is_daemonset_pod(&p.metadata)
        && !is_static_pod(&p.metadata)
        && !is_terminal(p)
        && p.metadata.deletion_timestamp.is_none()
        && !nominated
        && unschedulable_by_scheduler(p)
}

fn node_marked_for_deletion(n: &K8sNode) -> bool {
    n.metadata.deletion_timestamp.is_some()
        || n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT && t.effect == "NoSchedule"))
}

/// Builds the input of one cluster's round (§3.3). Pools are those whose `clusterName` is
/// `cluster`; the caller keeps only Ready pools in the operator, `plan` takes them all.
pub fn build_input(
    snapshot: &Snapshot,
    cluster: &str,
    rule: PendingRule,
    settings: Settings,
) -> Result<Converted, ConvertError> {
    build_input_with_volumes(snapshot, &Volumes::default(), cluster, rule, settings)
}

/// [`build_input`], with the volume checks of §3.2 over the storage objects given.
pub fn build_input_with_volumes(
    snapshot: &Snapshot,
    volumes: &Volumes,
    cluster: &str,
    rule: PendingRule,
    settings: Settings,
) -> Result<Converted, ConvertError> {
    let mut out = Converted::default();
    out.input.settings = settings;
    let pools: Vec<&NodePool> = snapshot.node_pools.iter().filter(|p| p.spec.cluster_name == cluster).collect();
    let pool_names: BTreeSet<&str> = pools.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
    let claims: Vec<&NodeClaim> = snapshot.node_claims.iter().filter(|c| c.spec.cluster_name == cluster).collect();
    // Each pool's catalogue is resolved once per round, for its claims in flight and its offer.
    let mut catalogs: BTreeMap<String, (Vec<InstanceType>, BTreeMap<String, String>)> = BTreeMap::new();
    for p in &pools {
        if let Some(name) = &p.metadata.name {
            let resolved = pool_types(p, &object("NodePool", &p.metadata), snapshot, &mut out.notes);
            catalogs.insert(name.clone(), resolved);
        }
    }

    // Existing capacity: active nodes and in-flight claims. A claim is its node's by the node's name
    // in its status, or by the provider ID they share (Karpenter's link: the Node may be seen before
    // the claim's status names it, and must not be counted twice, once as a node, once in flight).
    // A CKE node's provider ID, before the hub stamps it, is the one its NodeGroup label gives.
    let provider_id = |n: &K8sNode| {
        n.spec.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty()).or_else(|| {
            n.metadata.labels.as_ref()?.get(labels::CLEVER_NODEGROUP).map(|g| crds::nodeclaim::provider_id(g))
        })
    };
    // Filled by the loop over nodes (leaving ones too), read by the loop over claims after it.
    let mut node_provider_ids: BTreeSet<String> = BTreeSet::new();
    let claim_provider_id =
        |c: &NodeClaim| c.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty());
    let mut deleting_nodes: BTreeSet<String> = BTreeSet::new();
    let mut node_index: BTreeMap<String, usize> = BTreeMap::new();
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    for n in &snapshot.nodes {
        let obj = object("Node", &n.metadata);
        let name = n.metadata.name.clone().ok_or_else(|| err(&obj, "metadata.name", "missing"))?;
        let pool = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::NODEPOOL))
            .filter(|p| pool_names.contains(p.as_str()));
        let node_pid = provider_id(n);
        if let Some(p) = &node_pid {
            node_provider_ids.insert(p.clone());
        }
        if node_marked_for_deletion(n) {
            deleting_nodes.insert(name);
            continue;
        }
        let claim = claims.iter().find(|c| {
            c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())
                || (node_pid.is_some() && claim_provider_id(c) == node_pid)
        });
        let existing = node_from(n, &obj, &name, pool.cloned(), claim.copied())?;
        if let Some(p) = pool {
            let u = usage.entry(p.clone()).or_default();
            u.resources += existing.capacity;
            u.nodes += 1;
        }
        let mut existing = existing;
        if let Some(csinode) =
            volumes.csinodes.iter().flatten().find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
        {
            for d in &csinode.spec.drivers {
                if let Some(count) = d.allocatable.as_ref().and_then(|a| a.count) {
                    existing.csi_limits.insert(d.name.clone(), i64::from(count));
                }
            }
        }
        node_index.insert(name, out.input.nodes.len());
        out.input.nodes.push(existing);
    }
    for c in &claims {
        let has_node = c
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| node_index.contains_key(n) || deleting_nodes.contains(n))
            || claim_provider_id(c).is_some_and(|p| node_provider_ids.contains(&p));
        if has_node || c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let obj = object("NodeClaim", &c.metadata);
        let pool = c.metadata.labels.as_ref().and_then(|l| l.get(labels::NODEPOOL)).cloned();
        let types = pool.as_deref().and_then(|p| catalogs.get(p)).map(|(t, _)| t.as_slice());
        let existing = in_flight(c, &obj, pool.clone(), types, snapshot)?;
        if let Some(p) = pool {
            let u = usage.entry(p).or_default();
            u.resources += existing.capacity;
            u.nodes += 1;
        }
        out.input.nodes.push(existing);
    }

    // Pools.
    for p in &pools {
        let obj = object("NodePool", &p.metadata);
        let name = p.metadata.name.clone().ok_or_else(|| err(&obj, "metadata.name", "missing"))?;
        let (instance_types, class_labels) = catalogs.remove(&name).unwrap_or_default();
        let mut pool_labels = class_labels;
        if let Some(m) = &p.spec.template.metadata {
            pool_labels.extend(m.labels.clone());
        }
        out.input.pools.push(Pool {
            weight: p.spec.weight.unwrap_or(0),
            requirements: p.spec.template.spec.requirements.clone(),
            labels: pool_labels,
            taints: p.spec.template.spec.taints.clone(),
            startup_taints: p.spec.template.spec.startup_taints.clone(),
            limits: limits_of(p, &obj)?,
            usage: usage.get(&name).copied().unwrap_or_default(),
            instance_types,
            name,
        });
    }

    // Pods: bound ones onto their nodes, pending ones to place.
    let mut ds_pods: BTreeMap<(String, String), &CompactPod> = BTreeMap::new();
    for p in &snapshot.pods {
        let obj = object("Pod", &p.metadata);
        let Some(spec) = &p.spec else { return Err(err(&obj, "spec", "missing")) };
        let ns = p.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        if let Some(owner) = p.metadata.owner_references.iter().flatten().find(|o| o.kind == "DaemonSet") {
            let key = (ns.clone(), owner.name.clone());
            let newer = ds_pods.get(&key).is_none_or(|old| {
                old.metadata.creation_timestamp.as_ref().map(|t| t.0)
                    < p.metadata.creation_timestamp.as_ref().map(|t| t.0)
            });
            if newer {
                ds_pods.insert(key, p);
            }
        }
        let node_name = spec.node_name.as_deref().filter(|n| !n.is_empty());
        match node_name {
            Some(node) if deleting_nodes.contains(node) => {
                // Pods of a leaving node need capacity unless they stay (§3.2).
                if is_daemonset_pod(&p.metadata) || is_static_pod(&p.metadata) || is_terminal(p) {
                    continue;
                }
                // §5.5: a pod already terminating is on its way out with its controller's
                // replacement (a ReplicaSet's new pod is pending on its own); only a StatefulSet's
                // pod keeps its identity and must be re-homed as itself.
                let stateful = p.metadata.owner_references.iter().flatten().any(|o| o.kind == "StatefulSet");
                if p.metadata.deletion_timestamp.is_some() && !stateful {
                    continue;
                }
                if let Some(why) = blocks_eviction(p, &snapshot.pdbs) {
                    out.notes
                        .push(format!("{obj}: stays on leaving node {node} ({why}); no capacity is launched for it"));
                    continue;
                }
                let mut pod = pod_from(p, &obj)?;
                pod.constraints.volume_requirements = volume_topology(spec, &ns, volumes);
                pod.csi_volumes = csi_volumes(spec, &ns, volumes);
                out.input.pods.push(pod);
            }
            Some(node) => {
                if let Some(&i) = node_index.get(node) {
                    let mut running = running_from(p, &obj)?;
                    running.csi_volumes = csi_volumes(spec, &ns, volumes);
                    out.input.nodes[i].pods.push(running);
                }
            }
            None => {
                if is_daemonset_pod(&p.metadata) || is_static_pod(&p.metadata) || is_terminal(p) {
                    continue;
                }
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if p.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty()) {
                    out.notes.push(format!("{obj}: ignored, nominated to a node (preemption under way)"));
                    continue;
                }
                if rule == PendingRule::Unschedulable && !unschedulable_by_scheduler(p) {
                    continue;
                }
                let ns = p.metadata.namespace.as_deref().unwrap_or("default");
                match provisionable(spec).and_volumes(|| invalid_volume(spec, ns, volumes)) {
                    Provisionable::Yes => {
                        let mut pod = pod_from(p, &obj)?;
                        pod.constraints.volume_requirements = volume_topology(spec, ns, volumes);
                        pod.csi_volumes = csi_volumes(spec, ns, volumes);
                        out.input.pods.push(pod);
                    }
                    Provisionable::OptOut => {}
                    Provisionable::Ignored(why) => out.notes.push(format!("{obj}: ignored, {why}")),
                }
            }
        }
    }

    // DaemonSets: the newest real pod, else the template.
    for ds in &snapshot.daemonsets {
        let obj = object("DaemonSet", &ds.metadata);
        let ns = ds.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        let name = ds.metadata.name.clone().ok_or_else(|| err(&obj, "metadata.name", "missing"))?;
        let pod = match ds_pods.get(&(ns.clone(), name.clone())) {
            Some(p) => pod_from(p, &object("Pod", &p.metadata))?,
            None => {
                let spec = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
                let Some(spec) = spec else { return Err(err(&obj, "spec.template.spec", "missing")) };
                let meta = ds.spec.as_ref().and_then(|s| s.template.metadata.clone()).unwrap_or_default();
                pod_from_spec(&ns, &name, &meta, spec, None, &obj, "spec.template.spec")?
            }
        };
        out.input.daemonsets.push(DaemonSet { namespace: ns, name, pod });
    }
    Ok(out)
}

/// Whether a pod on a leaving node stays: `do-not-disrupt`, or a PDB that allows no eviction.
fn blocks_eviction(p: &CompactPod, pdbs: &[Arc<PodDisruptionBudget>]) -> Option<String> {
    let ann = p.metadata.annotations.as_ref();
    if ann.and_then(|a| a.get(labels::DO_NOT_DISRUPT)).is_some_and(|v| v == "true") {
        return Some(format!("{}=true", labels::DO_NOT_DISRUPT));
    }
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let pod_labels = p.metadata.labels.clone().unwrap_or_default();
    for pdb in pdbs {
        if pdb.metadata.namespace.as_deref().unwrap_or("default") != ns {
            continue;
        }
        let Some(spec) = &pdb.spec else { continue };
        let Some(sel) = spec.selector.as_ref().and_then(|s| selector_from(s).ok()) else { continue };
        if !selector_matches(&sel, &pod_labels) {
            continue;
        }
        let zero = |v: &IntOrString| match v {
            IntOrString::Int(0) => true,
            IntOrString::String(s) => s == "0" || s == "0%",
            IntOrString::Int(_) => false,
        };
        let blocking = spec.max_unavailable.as_ref().is_some_and(zero)
            || spec.min_available.as_ref().is_some_and(|v| matches!(v, IntOrString::String(s) if s == "100%"));
        if blocking {
            return Some(format!(
                "PodDisruptionBudget {} allows no eviction",
                pdb.metadata.name.as_deref().unwrap_or("")
            ));
        }
    }
    None
}

enum Provisionable {
    Yes,
    OptOut,
    Ignored(String),
}

impl Provisionable {
    fn and_volumes(self, check: impl FnOnce() -> Option<String>) -> Provisionable {
        match self {
            Provisionable::Yes => check().map_or(Provisionable::Yes, Provisionable::Ignored),
            other => other,
        }
    }
}

/// Node requirements from a pod's volumes (§3.12): a bound PV's node affinity (hostname terms
/// ignored), an unbound PVC's StorageClass `allowedTopologies`; several volumes combine as the cross
/// product of their alternatives (at most 16). Empty: unconstrained.
fn volume_topology(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Vec<Vec<NodeSelectorRequirement>> {
    const MAX_ALTERNATIVES: usize = 16;
    let mut combos: Vec<Vec<NodeSelectorRequirement>> = vec![Vec::new()];
    let in_req = |key: &str, values: Vec<String>| NodeSelectorRequirement {
        key: key.to_string(),
        operator: Operator::In,
        values,
        min_values: None,
    };
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let Some(pvc) = volumes.pvcs.iter().flatten().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        }) else {
            continue;
        };
        let alts: Vec<Vec<NodeSelectorRequirement>> = match pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
            Some(pv_name) if !pv_name.is_empty() => {
                let pv = volumes.pvs.iter().flatten().find(|p| p.metadata.name.as_deref() == Some(pv_name));
                let terms = pv
                    .and_then(|p| p.spec.as_ref())
                    .and_then(|s| s.node_affinity.as_ref())
                    .and_then(|a| a.required.as_ref())
                    .map(|r| r.node_selector_terms.clone())
                    .unwrap_or_default();
                terms
                    .iter()
                    .filter_map(|t| {
                        let reqs: Vec<NodeSelectorRequirement> = t
                            .match_expressions
                            .iter()
                            .flatten()
                            .filter(|e| e.key != labels::HOSTNAME)
                            .filter_map(|e| {
                                Some(NodeSelectorRequirement {
                                    key: e.key.clone(),
                                    operator: operator(&e.operator)?,
                                    values: e.values.clone().unwrap_or_default(),
                                    min_values: None,
                                })
                            })
                            .collect();
                        (!reqs.is_empty()).then_some(reqs)
                    })
                    .collect()
            }
            _ => {
                let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
                let class = volumes.storage_classes.iter().flatten().find(|c| c.metadata.name.as_deref() == class_name);
                class
                    .and_then(|c| c.allowed_topologies.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        t.match_label_expressions
                            .iter()
                            .flatten()
                            .map(|e| in_req(&e.key, e.values.clone()))
                            .collect::<Vec<_>>()
                    })
                    .filter(|r| !r.is_empty())
                    .collect()
            }
        };
        if alts.is_empty() {
            continue;
        }
        let mut next = Vec::new();
        for c in &combos {
            for a in &alts {
                if next.len() < MAX_ALTERNATIVES {
                    let mut both = c.clone();
                    both.extend(a.iter().cloned());
                    next.push(both);
                }
            }
        }
        combos = next;
    }
    if combos.iter().all(Vec::is_empty) { Vec::new() } else { combos }
}

/// The CSI volumes of a pod: `(driver, namespace/claim)` for each PVC whose bound PV is a CSI volume,
/// or, unbound, whose StorageClass names the provisioner.
fn csi_volumes(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Vec<(String, String)> {
    if volumes.csinodes.is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let Some(pvc) = volumes.pvcs.iter().flatten().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        }) else {
            continue;
        };
        let driver = match pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty()) {
            Some(pv_name) => volumes
                .pvs
                .iter()
                .flatten()
                .find(|p| p.metadata.name.as_deref() == Some(pv_name))
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.driver.clone()),
            None => {
                let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
                volumes
                    .storage_classes
                    .iter()
                    .flatten()
                    .find(|c| c.metadata.name.as_deref() == class_name)
                    .map(|c| c.provisioner.clone())
            }
        };
        if let Some(d) = driver {
            out.push((d, format!("{namespace}/{claim}")));
        }
    }
    out
}

/// The first invalid volume of a pod (§3.2 3): missing PVC, PVC deleting or `Lost`, unbound PVC
/// without a storage class or with one that does not exist, or whose class binds `Immediate`.
fn invalid_volume(spec: &PodSpec, namespace: &str, volumes: &Volumes) -> Option<String> {
    let pvcs = volumes.pvcs.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(claim) = v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()) else { continue };
        let pvc = pvcs.iter().find(|c| {
            c.metadata.name.as_deref() == Some(claim)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        });
        let Some(pvc) = pvc else {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} not found", v.name));
        };
        if pvc.metadata.deletion_timestamp.is_some() {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} is being deleted", v.name));
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            return Some(format!("volume {}: PersistentVolumeClaim {claim} is Lost", v.name));
        }
        let bound = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|n| !n.is_empty());
        if bound {
            continue;
        }
        let Some(classes) = &volumes.storage_classes else { continue };
        let class_name = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).or_else(|| {
            classes
                .iter()
                .find(|c| {
                    c.metadata.annotations.as_ref().and_then(|a| a.get("storageclass.kubernetes.io/is-default-class"))
                        == Some(&"true".to_string())
                })
                .and_then(|c| c.metadata.name.clone())
        });
        let Some(class_name) = class_name.filter(|c| !c.is_empty()) else {
            return Some(format!("volume {}: unbound PersistentVolumeClaim {claim} has no storage class", v.name));
        };
        match classes.iter().find(|c| c.metadata.name.as_deref() == Some(class_name.as_str())) {
            None => return Some(format!("volume {}: StorageClass {class_name} of {claim} not found", v.name)),
            Some(c) if c.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") => {
                return Some(format!(
                    "volume {}: unbound PersistentVolumeClaim {claim} uses the Immediate StorageClass {class_name}",
                    v.name
                ));
            }
            Some(_) => {}
        }
    }
    None
}

fn is_restricted_for_pods(key: &str) -> bool {
    let key = crate::requirements::normalize_key(key);
    if key == labels::HOSTNAME {
        return true;
    }
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    let in_domain = |d: &str| domain == d || domain.ends_with(&format!(".{d}"));
    (in_domain("karpenter.sh") && key != labels::CAPACITY_TYPE && key != labels::NODEPOOL)
        || (in_domain("karpenter.clever-cloud.com") && key != labels::INSTANCE_CPU && key != labels::INSTANCE_MEMORY)
}

/// §3.2: `karpenter.sh/nodepool DoesNotExist` opts out silently; restricted keys, unsupported
/// operators and `matchFields` are ignored with a reason.
fn provisionable(spec: &PodSpec) -> Provisionable {
    for k in spec.node_selector.iter().flat_map(|m| m.keys()) {
        if is_restricted_for_pods(k) {
            return Provisionable::Ignored(format!("nodeSelector uses the restricted label {k}"));
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    for term in required.iter().flat_map(|r| r.node_selector_terms.iter()) {
        if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            return Provisionable::Ignored(
                "required node affinity uses matchFields, which the hub does not support".into(),
            );
        }
        for e in term.match_expressions.iter().flatten() {
            if e.key == labels::NODEPOOL && e.operator == "DoesNotExist" {
                return Provisionable::OptOut;
            }
            if is_restricted_for_pods(&e.key) {
                return Provisionable::Ignored(format!("required node affinity uses the restricted label {}", e.key));
            }
            if operator(&e.operator).is_none() {
                return Provisionable::Ignored(format!(
                    "required node affinity uses the unsupported operator {}",
                    e.operator
                ));
            }
        }
    }
    Provisionable::Yes
}

fn operator(op: &str) -> Option<Operator> {
    Some(match op {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        _ => return None,
    })
}

fn node_reqs(list: &[K8sNodeReq], obj: &str, field: &str) -> Result<Vec<NodeSelectorRequirement>, ConvertError> {
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            let op = operator(&e.operator).ok_or_else(|| {
                err(obj, format!("{field}[{i}].operator"), format!("unsupported operator {}", e.operator))
            })?;
            Ok(NodeSelectorRequirement {
                key: e.key.clone(),
                operator: op,
                values: e.values.clone().unwrap_or_default(),
                min_values: None,
            })
        })
        .collect()
}

/// A label selector; unsupported operators are errors (a missing selector is `None` upstream of this).
pub fn selector_from(s: &K8sSelector) -> Result<LabelSelector, String> {
    let mut out =
        LabelSelector { match_labels: s.match_labels.clone().unwrap_or_default(), match_expressions: Vec::new() };
    for e in s.match_expressions.iter().flatten() {
        let operator = match e.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            other => return Err(format!("unsupported selector operator {other}")),
        };
        out.match_expressions.push(SelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

fn effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

fn taint_from(t: &K8sTaint, obj: &str, field: &str) -> Result<Taint, ConvertError> {
    let effect = effect(&t.effect)
        .ok_or_else(|| err(obj, format!("{field}.effect"), format!("unknown effect {:?}", t.effect)))?;
    Ok(Taint { key: t.key.clone(), value: t.value.clone().filter(|v| !v.is_empty()), effect })
}

fn toleration_from(t: &K8sToleration, obj: &str, field: &str) -> Result<Toleration, ConvertError> {
    let operator = match t.operator.as_deref() {
        None | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(other) => return Err(err(obj, format!("{field}.operator"), format!("unknown operator {other}"))),
    };
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(effect(e).ok_or_else(|| err(obj, format!("{field}.effect"), format!("unknown effect {e}")))?),
    };
    Ok(Toleration {
        key: t.key.clone().unwrap_or_default(),
        operator,
        value: t.value.clone().unwrap_or_default(),
        effect,
    })
}

fn term_from(
    t: &k8s_openapi::api::core::v1::PodAffinityTerm,
    obj: &str,
    field: &str,
) -> Result<PodAffinityTerm, ConvertError> {
    let selector = match &t.label_selector {
        None => None,
        Some(s) => Some(selector_from(s).map_err(|m| err(obj, format!("{field}.labelSelector"), m))?),
    };
    let namespace_selector = match &t.namespace_selector {
        None => None,
        Some(s) => Some(selector_from(s).map_err(|m| err(obj, format!("{field}.namespaceSelector"), m))?),
    };
    Ok(PodAffinityTerm {
        selector,
        namespaces: t.namespaces.clone().unwrap_or_default(),
        namespace_selector,
        topology_key: t.topology_key.clone(),
        match_label_keys: t.match_label_keys.clone().unwrap_or_default(),
    })
}

fn policy(
    v: Option<&str>,
    default: NodeInclusionPolicy,
    obj: &str,
    field: &str,
) -> Result<NodeInclusionPolicy, ConvertError> {
    match v {
        None => Ok(default),
        Some("Honor") => Ok(NodeInclusionPolicy::Honor),
        Some("Ignore") => Ok(NodeInclusionPolicy::Ignore),
        Some(other) => Err(err(obj, field, format!("unknown policy {other}"))),
    }
}

/// The scheduling constraints of a pod spec.
pub fn constraints_from(spec: &PodSpec, obj: &str, base: &str) -> Result<Constraints, ConvertError> {
    let mut c = Constraints { node_selector: spec.node_selector.clone().unwrap_or_default(), ..Constraints::default() };
    if let Some(na) = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()) {
        if let Some(r) = &na.required_during_scheduling_ignored_during_execution {
            for (i, t) in r.node_selector_terms.iter().enumerate() {
                let f = format!(
                    "{base}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}].matchExpressions"
                );
                c.required_terms.push(node_reqs(t.match_expressions.as_deref().unwrap_or_default(), obj, &f)?);
            }
        }
        for (i, p) in na.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let f = format!(
                "{base}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference.matchExpressions"
            );
            c.preferred_terms.push(WeightedNodeTerm {
                weight: p.weight,
                requirements: node_reqs(p.preference.match_expressions.as_deref().unwrap_or_default(), obj, &f)?,
            });
        }
    }
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        c.tolerations.push(toleration_from(t, obj, &format!("{base}.tolerations[{i}]"))?);
    }
    if let Some(pa) = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref()) {
        for (i, t) in pa.required_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            c.pod_affinity.push(term_from(t, obj, &format!("{base}.affinity.podAffinity.required[{i}]"))?);
        }
        for (i, t) in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let term = term_from(&t.pod_affinity_term, obj, &format!("{base}.affinity.podAffinity.preferred[{i}]"))?;
            c.preferred_pod_affinity.push(WeightedPodAffinityTerm { weight: t.weight, term });
        }
    }
    if let Some(pa) = spec.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref()) {
        for (i, t) in pa.required_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            c.pod_anti_affinity.push(term_from(t, obj, &format!("{base}.affinity.podAntiAffinity.required[{i}]"))?);
        }
        for (i, t) in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
            let term =
                term_from(&t.pod_affinity_term, obj, &format!("{base}.affinity.podAntiAffinity.preferred[{i}]"))?;
            c.preferred_pod_anti_affinity.push(WeightedPodAffinityTerm { weight: t.weight, term });
        }
    }
    for (i, t) in spec.topology_spread_constraints.iter().flatten().enumerate() {
        let f = format!("{base}.topologySpreadConstraints[{i}]");
        let when = match t.when_unsatisfiable.as_str() {
            "DoNotSchedule" => WhenUnsatisfiable::DoNotSchedule,
            "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
            other => return Err(err(obj, format!("{f}.whenUnsatisfiable"), format!("unknown value {other}"))),
        };
        // A missing or unparsable selector selects nothing: the constraint never restricts (§3.11).
        let selector = t.label_selector.as_ref().and_then(|s| selector_from(s).ok());
        c.topology_spread.push(SpreadConstraint {
            max_skew: t.max_skew,
            topology_key: t.topology_key.clone(),
            when_unsatisfiable: when,
            selector,
            min_domains: t.min_domains,
            node_affinity_policy: policy(
                t.node_affinity_policy.as_deref(),
                NodeInclusionPolicy::Honor,
                obj,
                &format!("{f}.nodeAffinityPolicy"),
            )?,
            node_taints_policy: policy(
                t.node_taints_policy.as_deref(),
                NodeInclusionPolicy::Ignore,
                obj,
                &format!("{f}.nodeTaintsPolicy"),
            )?,
            match_label_keys: t.match_label_keys.clone().unwrap_or_default(),
        });
    }
    c.host_ports = host_ports(spec);
    Ok(c)
}

fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always")))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&h| h > 0)?;
            Some(HostPort {
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
            })
        })
        .collect()
}

fn pod_from_spec(
    namespace: &str,
    name: &str,
    meta: &ObjectMeta,
    spec: &PodSpec,
    status: Option<&k8s_openapi::api::core::v1::PodStatus>,
    obj: &str,
    base: &str,
) -> Result<Pod, ConvertError> {
    let (requests, extended) = pod_requests(spec, status).map_err(|e| {
        let field = match e.container.as_str() {
            "overhead" => format!("{base}.overhead.{}", e.resource),
            "resources" => format!("{base}.resources.{}.{}", e.field, e.resource),
            c if e.field == "allocatedResources" => format!(
                "status.containerStatuses[{}].allocatedResources.{}",
                c.trim_start_matches("containers["),
                e.resource
            )
            .replace("]].", "]."),
            c => format!("{base}.{c}.resources.{}.{}", e.field, e.resource),
        };
        err(obj, field, e.source.to_string())
    })?;
    Ok(Pod {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: meta.uid.clone().unwrap_or_else(|| format!("{namespace}/{name}")),
        created: meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        labels: meta.labels.clone().unwrap_or_default(),
        requests,
        extended,
        constraints: constraints_from(spec, obj, base)?,
        csi_volumes: Vec::new(),
    })
}

/// A pending pod.
pub fn pod_from(p: &CompactPod, obj: &str) -> Result<Pod, ConvertError> {
    let spec = p.spec.as_ref().ok_or_else(|| err(obj, "spec", "missing"))?;
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let name = p.metadata.name.as_deref().ok_or_else(|| err(obj, "metadata.name", "missing"))?;
    pod_from_spec(ns, name, &p.metadata, spec, p.status.as_ref(), obj, "spec")
}

fn running_from(p: &CompactPod, obj: &str) -> Result<RunningPod, ConvertError> {
    let pod = pod_from(p, obj)?;
    let daemonset = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DaemonSet")
        .map(|o| format!("{}/{}", pod.namespace, o.name));
    Ok(RunningPod {
        counted: !is_terminal(p) && p.metadata.deletion_timestamp.is_none(),
        namespace: pod.namespace,
        name: pod.name,
        labels: pod.labels,
        requests: pod.requests,
        host_ports: pod.constraints.host_ports,
        daemonset,
        anti_affinity: pod.constraints.pod_anti_affinity,
        csi_volumes: Vec::new(),
    })
}

fn resources_of(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    obj: &str,
    field: &str,
) -> Result<Resources, ConvertError> {
    match list {
        None => Ok(Resources::ZERO),
        Some(l) => Resources::from_resource_list(l).map_err(|e| err(obj, field, e.to_string())),
    }
}

fn node_from(
    n: &K8sNode,
    obj: &str,
    name: &str,
    pool: Option<String>,
    claim: Option<&NodeClaim>,
) -> Result<ExistingNode, ConvertError> {
    let lbls = n.metadata.labels.clone().unwrap_or_default();
    let status = n.status.as_ref();
    let capacity = resources_of(status.and_then(|s| s.capacity.as_ref()), obj, "status.capacity")?;
    let allocatable = match status.and_then(|s| s.allocatable.as_ref()) {
        Some(a) => resources_of(Some(a), obj, "status.allocatable")?,
        None => capacity,
    };
    let mut taints = Vec::new();
    for (i, t) in n.spec.as_ref().and_then(|s| s.taints.as_ref()).into_iter().flatten().enumerate() {
        taints.push(taint_from(t, obj, &format!("spec.taints[{i}]"))?);
    }
    let managed = pool.is_some();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True");
    let initialized = if managed { lbls.get(labels::INITIALIZED).is_some_and(|v| v == "true") } else { ready };
    Ok(ExistingNode {
        name: name.to_string(),
        labels: lbls,
        taints,
        startup_taints: claim.map(|c| c.spec.startup_taints.clone()).unwrap_or_default(),
        allocatable,
        capacity,
        pods: Vec::new(),
        managed,
        initialized,
        nodepool: pool,
        csi_limits: BTreeMap::new(),
    })
}

/// An in-flight claim (no Node yet): labels from its single-valued requirements, its own taints,
/// allocatable from its status or, before launch, the smallest of its options.
fn in_flight(
    c: &NodeClaim,
    obj: &str,
    pool: Option<String>,
    types: Option<&[InstanceType]>,
    snapshot: &Snapshot,
) -> Result<ExistingNode, ConvertError> {
    let name = c.metadata.name.clone().ok_or_else(|| err(obj, "metadata.name", "missing"))?;
    let mut lbls: BTreeMap<String, String> = c.metadata.labels.clone().unwrap_or_default();
    for r in &c.spec.requirements {
        if r.operator == Operator::In && r.values.len() == 1 {
            lbls.insert(r.key.clone(), r.values[0].clone());
        }
    }
    lbls.insert(labels::HOSTNAME.to_string(), name.clone());
    let status = c.status.as_ref();
    let (mut capacity, mut allocatable) = (
        resources_of(status.and_then(|s| s.capacity.as_ref()), obj, "status.capacity")?,
        resources_of(status.and_then(|s| s.allocatable.as_ref()), obj, "status.allocatable")?,
    );
    if allocatable.is_zero() {
        let options: Vec<&String> = c
            .spec
            .requirements
            .iter()
            .filter(|r| r.key == labels::INSTANCE_TYPE && r.operator == Operator::In)
            .flat_map(|r| r.values.iter())
            .collect();
        let builtin;
        let types = match types {
            Some(t) => t,
            None => {
                builtin = Catalog::builtin().instance_types(snapshot.zone());
                builtin.as_slice()
            }
        };
        let smallest = types
            .iter()
            .filter(|t| options.contains(&&t.name))
            .min_by_key(|t| (t.allocatable.cpu_millis, t.allocatable.memory_bytes));
        if let Some(t) = smallest {
            allocatable = t.allocatable;
            capacity = t.capacity;
            for (k, v) in &t.labels {
                lbls.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    Ok(ExistingNode {
        name,
        labels: lbls,
        taints: c.spec.taints.clone(),
        startup_taints: c.spec.startup_taints.clone(),
        allocatable,
        capacity,
        pods: Vec::new(),
        managed: true,
        initialized: false,
        nodepool: pool,
        csi_limits: BTreeMap::new(),
    })
}

/// The instance types of a pool (its node class's catalogue) and the class's node labels.
fn pool_types(
    p: &NodePool,
    obj: &str,
    snapshot: &Snapshot,
    notes: &mut Vec<String>,
) -> (Vec<InstanceType>, BTreeMap<String, String>) {
    let ns = p.metadata.namespace.as_deref();
    let class_name = &p.spec.template.spec.node_class_ref.name;
    let class = snapshot.node_classes.iter().find(|c| {
        c.metadata.name.as_deref() == Some(class_name.as_str())
            && (ns.is_none() || c.metadata.namespace.as_deref() == ns || c.metadata.namespace.is_none())
    });
    let Some(class) = class else {
        notes.push(format!("{obj}: CleverNodeClass {class_name} not found; the built-in flavors are used"));
        return (Catalog::builtin().instance_types(snapshot.zone()), BTreeMap::new());
    };
    let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
    let found = reference.and_then(|name| {
        snapshot.flavor_catalogs.iter().find(|f| {
            f.metadata.name.as_deref() == Some(name)
                && (ns.is_none() || f.metadata.namespace.as_deref() == ns || f.metadata.namespace.is_none())
        })
    });
    let (catalog, problem) = crds::catalog::served(&Catalog::builtin(), reference, found);
    if let Some(problem) = problem {
        notes.push(format!("{obj}: {problem}"));
    }
    notes.extend(catalog.warnings.iter().map(|w| format!("{obj}: FlavorCatalog: {w}")));
    (catalog.instance_types(snapshot.zone()), class.spec.labels.clone())
}

fn limits_of(p: &NodePool, obj: &str) -> Result<Limits, ConvertError> {
    let mut l = Limits::default();
    for (k, q) in p.spec.limits.iter().flatten() {
        let field = format!("spec.limits.{k}");
        let parsed = parse_quantity(q.0.trim()).map_err(|e| err(obj, &field, e.to_string()))?;
        match k.as_str() {
            "cpu" => l.cpu_millis = Some(parsed.as_millis()),
            "memory" => l.memory_bytes = Some(parsed.as_units()),
            "ephemeral-storage" => l.ephemeral_storage_bytes = Some(parsed.as_units()),
            "pods" => l.pods = Some(parsed.as_units()),
            "nodes" => l.nodes = Some(parsed.as_units()),
            _ => {}
        }
    }
    Ok(l)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    #[allow(clippy::expect_used)]
    fn only_pods_the_scheduler_gave_up_on_trigger_provisioning() {
        let pod = |extra: serde_json::Value| -> CompactPod {
            let mut v = json!({
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
            });
            json_patch_merge(&mut v, extra);
            serde_json::from_value(v).expect("a pod")
        };
        assert!(triggers_provisioning(&pod(json!({}))));
        assert!(!triggers_provisioning(&pod(json!({"spec": {"nodeName": "n"}}))));
        assert!(!triggers_provisioning(&pod(json!({"status": {"conditions": []}}))));
        assert!(!triggers_provisioning(&pod(json!({"status": {"nominatedNodeName": "n"}}))));
        assert!(!triggers_provisioning(&pod(json!({"status": {"phase": "Failed"}}))));
        assert!(!triggers_provisioning(&pod(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}))));
        assert!(!triggers_provisioning(&pod(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]}})
        )));
    }

    fn json_patch_merge(target: &mut serde_json::Value, patch: serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    json_patch_merge(t.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (t, p) => *t = p,
        }
    }

    fn pool() -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "default", "namespace": "demo"},
            "spec": {"clusterName": "c1", "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": []}}}
        }))
        .unwrap()
    }

    fn pod(name: &str, extra: serde_json::Value) -> Arc<CompactPod> {
        let mut v = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]}});
        merge(&mut v, extra);
        Arc::new(serde_json::from_value(v).unwrap())
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

    fn unschedulable() -> serde_json::Value {
        json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
    }

    fn names(c: &Converted) -> Vec<String> {
        c.input.pods.iter().map(|p| p.name.clone()).collect()
    }

    fn convert(snapshot: &Snapshot, rule: PendingRule) -> Converted {
        build_input(snapshot, "c1", rule, Settings::default()).unwrap()
    }

    /// A launched claim whose Node has joined but whose status does not name it yet is that Node,
    /// by the provider ID they share: one node in the input, not the node and an in-flight claim.
    #[test]
    fn a_claim_is_its_node_by_provider_id_before_its_status_names_it() {
        let node: K8sNode = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "default-abcde-0a1b2c3d-node0", "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"providerID": "clevercloud://default-abcde-0a1b2c3d"},
            "status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}}))
        .unwrap();
        let claim = |status: serde_json::Value| -> NodeClaim {
            serde_json::from_value(json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": "default-abcde", "namespace": "demo", "labels": {"karpenter.sh/nodepool": "default"}},
                "spec": {"clusterName": "c1", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
                "status": status
            }))
            .unwrap()
        };
        let input = |c: NodeClaim| {
            let snap = Snapshot {
                node_pools: vec![pool()],
                nodes: vec![Arc::new(node.clone())],
                node_claims: vec![c],
                ..Snapshot::default()
            };
            convert(&snap, PendingRule::Unschedulable).input.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
        };
        let joined = ["default-abcde-0a1b2c3d-node0".to_string()];
        assert_eq!(input(claim(json!({"providerID": "clevercloud://default-abcde-0a1b2c3d"}))), joined);
        assert_eq!(
            input(claim(
                json!({"providerID": "clevercloud://default-abcde-0a1b2c3d", "nodeName": "default-abcde-0a1b2c3d-node0"})
            )),
            joined
        );
        // Before the hub stamps the node's provider ID, CKE's NodeGroup label links them.
        let mut unstamped = node.clone();
        unstamped.spec = None;
        unstamped
            .metadata
            .labels
            .get_or_insert_default()
            .insert(labels::CLEVER_NODEGROUP.into(), "default-abcde-0a1b2c3d".into());
        let snap = Snapshot {
            node_pools: vec![pool()],
            nodes: vec![Arc::new(unstamped)],
            node_claims: vec![claim(json!({"providerID": "clevercloud://default-abcde-0a1b2c3d"}))],
            ..Snapshot::default()
        };
        assert_eq!(convert(&snap, PendingRule::Unschedulable).input.nodes.len(), 1);
        // Another group's claim is still in flight beside the node.
        assert_eq!(input(claim(json!({"providerID": "clevercloud://default-fffff-00000000"}))).len(), 2);
    }

    #[test]
    fn c33_only_unschedulable_and_not_nominated_pods_are_provisionable() {
        let snap = Snapshot {
            node_pools: vec![pool()],
            pods: vec![
                pod("pending", unschedulable()),
                pod("no-condition", json!({})),
                pod(
                    "nominated",
                    json!({"status": {"nominatedNodeName": "n1", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}),
                ),
            ],
            ..Snapshot::default()
        };
        assert_eq!(names(&convert(&snap, PendingRule::Unschedulable)), vec!["pending"]);
        // plan counts every unbound pod, but still not one being preempted for.
        assert_eq!(names(&convert(&snap, PendingRule::Unbound)), vec!["pending", "no-condition"]);
    }

    #[test]
    fn c34_c35_restricted_keys_and_opt_out() {
        let snap = Snapshot {
            node_pools: vec![pool()],
            pods: vec![
                pod("hostname", json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "n1"}}})),
                pod(
                    "fields",
                    json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}),
                ),
                pod(
                    "opt-out",
                    json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}}}),
                ),
                pod("ok", json!({})),
            ],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unbound);
        assert_eq!(names(&c), vec!["ok"]);
        assert!(c.notes.iter().any(|n| n.contains("hostname") && n.contains("restricted")), "{:?}", c.notes);
        assert!(c.notes.iter().any(|n| n.contains("fields") && n.contains("matchFields")), "{:?}", c.notes);
        assert!(!c.notes.iter().any(|n| n.contains("opt-out")), "{:?}", c.notes);
    }

    #[test]
    fn c32_c89_c90_pods_of_leaving_nodes() {
        let node: K8sNode = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "old", "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "6", "memory": "7937580Ki", "pods": "110"}}}))
        .unwrap();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "db", "namespace": "shop"}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "db"}}}}))
        .unwrap();
        let snap = Snapshot {
            node_pools: vec![pool()],
            nodes: vec![Arc::new(node)],
            pods: vec![
                pod("web", json!({"spec": {"nodeName": "old"}})),
                pod("db", json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "old"}})),
                pod(
                    "kept",
                    json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}, "spec": {"nodeName": "old"}}),
                ),
                pod(
                    "agent",
                    json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u"}]}, "spec": {"nodeName": "old"}}),
                ),
            ],
            pdbs: vec![Arc::new(pdb)],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unschedulable);
        assert_eq!(names(&c), vec!["web"]);
        assert!(c.input.nodes.is_empty(), "a leaving node is no capacity");
    }

    #[test]
    fn terminating_pods_of_a_leaving_node_are_provisioned_for_only_when_a_statefulset_owns_them() {
        // Issue 13 item 12, karpenter-semantics §5.5.
        let node: K8sNode = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "old", "labels": {"karpenter.sh/nodepool": "default"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"capacity": {"cpu": "6", "memory": "7937580Ki", "pods": "110"}}}))
        .unwrap();
        let owned = |kind: &str| {
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u"}]}, "spec": {"nodeName": "old"}})
        };
        let snap = Snapshot {
            node_pools: vec![pool()],
            nodes: vec![Arc::new(node)],
            pods: vec![
                pod("from-replicaset", owned("ReplicaSet")),
                pod(
                    "bare",
                    json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "old"}}),
                ),
                pod("from-statefulset", owned("StatefulSet")),
                pod("running", json!({"spec": {"nodeName": "old"}})),
            ],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unschedulable);
        assert_eq!(names(&c), vec!["from-statefulset", "running"]);
    }

    #[test]
    fn c36_missing_pvc() {
        let with_pvc = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "gone"}}]}});
        let snap = Snapshot {
            node_pools: vec![pool()],
            pods: vec![pod("broken", with_pvc), pod("fine", json!({}))],
            ..Snapshot::default()
        };
        // Not listed: not checked.
        assert_eq!(names(&convert(&snap, PendingRule::Unbound)).len(), 2);
        let volumes = Volumes { pvcs: Some(Vec::new()), ..Volumes::default() };
        let c = build_input_with_volumes(&snap, &volumes, "c1", PendingRule::Unbound, Settings::default()).unwrap();
        assert_eq!(names(&c), vec!["fine"]);
        assert!(
            c.notes.iter().any(|n| n.contains("broken") && n.contains("PersistentVolumeClaim gone not found")),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn bound_volumes_pin_the_zone() {
        let pvc: PersistentVolumeClaim =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "shop"}, "spec": {"volumeName": "pv-1"}}))
            .unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]},
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}}))
        .unwrap();
        let mut p = pool();
        p.spec.template.spec.requirements = Vec::new();
        let snap = Snapshot {
            node_pools: vec![p],
            pods: vec![pod(
                "db",
                json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
            )],
            ..Snapshot::default()
        };
        let volumes = Volumes { pvcs: Some(vec![pvc]), pvs: Some(vec![pv]), ..Volumes::default() };
        let mut c = build_input_with_volumes(&snap, &volumes, "c1", PendingRule::Unbound, Settings::default()).unwrap();
        let alts = &c.input.pods[0].constraints.volume_requirements;
        assert_eq!(alts.len(), 1);
        assert_eq!(alts[0].len(), 1, "hostname terms are ignored");
        c.input.pools[0].instance_types = crate::testkit::flavors_3_zones();
        let d = crate::solve(&c.input);
        let zone = d.new_claims[0].requirements.iter().find(|r| r.key == labels::ZONE).unwrap();
        assert_eq!(zone.values, vec!["b"]);
    }

    #[test]
    fn csi_limits_and_volumes_are_read() {
        let node: K8sNode =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"capacity": {"cpu": "16", "memory": "32Gi", "pods": "110"}}}))
            .unwrap();
        let csinode: CSINode = serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "csi.example", "nodeID": "n1", "allocatable": {"count": 1}}]}}))
        .unwrap();
        let pvc = |name: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": "shop"}, "spec": {"volumeName": format!("pv-{name}")}}))
            .unwrap()
        };
        let pv = |name: &str| -> PersistentVolume {
            serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("pv-{name}")},
                "spec": {"csi": {"driver": "csi.example", "volumeHandle": name}}}),
            )
            .unwrap()
        };
        let uses =
            |claim: &str| json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]}});
        let mut running = pod("db-0", uses("a"));
        Arc::make_mut(Arc::make_mut(&mut running).spec.as_mut().unwrap()).node_name = Some("n1".into());
        let snap = Snapshot {
            node_pools: vec![pool()],
            nodes: vec![Arc::new(node)],
            pods: vec![running, pod("db-1", uses("b"))],
            ..Snapshot::default()
        };
        let volumes = Volumes {
            pvcs: Some(vec![pvc("a"), pvc("b")]),
            pvs: Some(vec![pv("a"), pv("b")]),
            csinodes: Some(vec![csinode]),
            ..Volumes::default()
        };
        let c = build_input_with_volumes(&snap, &volumes, "c1", PendingRule::Unbound, Settings::default()).unwrap();
        assert_eq!(c.input.nodes[0].csi_limits.get("csi.example"), Some(&1));
        assert_eq!(c.input.nodes[0].pods[0].csi_volumes, vec![("csi.example".to_string(), "shop/a".to_string())]);
        let d = crate::solve(&c.input);
        assert!(d.existing.is_empty(), "the attach limit keeps db-1 off n1");
        assert_eq!(d.new_claims.len(), 1);
    }

    #[test]
    fn errors_name_object_and_field() {
        let snap = Snapshot {
            node_pools: vec![pool()],
            pods: vec![pod("bad", json!({"spec": {"tolerations": [{"key": "x", "operator": "Maybe"}]}}))],
            ..Snapshot::default()
        };
        let e = build_input(&snap, "c1", PendingRule::Unbound, Settings::default()).unwrap_err();
        assert_eq!(e.object, "Pod shop/bad");
        assert_eq!(e.field, "spec.tolerations[0].operator");
    }
}
