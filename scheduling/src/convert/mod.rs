//! From API objects to the scheduler's input (karpenter-semantics §3.2, §3.3): which pods are
//! provisionable, which nodes and in-flight claims are existing capacity, each pool's instance types
//! (its node class and flavor catalogue), limits and usage, DaemonSet pods, and the counted pods of
//! topology.
//!
//! Here: the snapshot and its result, and [`build_input`], which walks the objects and sorts them
//! out. One reading per file: `pending` (which pods need capacity, §3.2), `spec` (a pod spec's
//! requests and scheduling constraints), `volumes` (what a pod's volumes require, §3.12), `capacity`
//! (nodes, in-flight claims, pools' catalogues and limits). A pool's price ceiling becomes a
//! [`SharedLimit`] of that pool alone, less what its nodes and claims in flight cost.
//!
//! Owns the reading of Kubernetes shapes into [`crate::model`]. Pure: objects in, input and notes
//! out. Errors name the object and the field; things that are merely ignored become notes. Must not
//! decide where a pod goes (that is [`crate::solve`](mod@crate::solve)).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crds::catalog::{DEFAULT_ZONE, InstanceType};
use crds::{CleverNodeClass, FlavorCatalog, NodeClaim, NodePool, labels};
use k8s_openapi::api::apps::v1::DaemonSet as K8sDaemonSet;
use k8s_openapi::api::core::v1::Node as K8sNode;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::compact::CompactPod;
use crate::model::{DaemonSet, ExistingNode, Headroom, Input, Pool, Settings, SharedLimit, Usage};

mod capacity;
mod pending;
mod spec;
mod volumes;

use capacity::{
    claim_options, in_flight, limits_of, node_from, node_marked_for_deletion, pool_types, price_limit_of, price_of,
};
use pending::{Provisionable, blocks_eviction, provisionable, unschedulable_by_scheduler};
pub use pending::{
    do_not_disrupt_active, forbids_every_eviction, is_daemonset_pod, is_static_pod, is_terminal, triggers_provisioning,
};
pub use spec::{UnsupportedSelectorOperator, constraints_from, pod_from, selector_from};
use spec::{pod_from_spec, running_from};
use volumes::{csi_volumes, invalid_volume, volume_topology};

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
    /// NodePools (all clusters; those serving the cluster are kept: its `clusterName`, or a fleet
    /// pool's `clusterSelector` matching the cluster's labels).
    pub node_pools: Vec<NodePool>,
    /// Labels of the workload clusters, by name: what fleet pools select on. A cluster absent has
    /// no labels.
    pub cluster_labels: BTreeMap<String, BTreeMap<String, String>>,
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
    /// When it was taken: judges `karpenter.sh/do-not-disrupt` durations of pods on leaving nodes
    /// (unset: every valid duration counts as still running).
    pub now: Option<k8s_openapi::jiff::Timestamp>,
    /// CapacityBuffers' pods for this cluster: pods to place as the lowest-priority pending pods
    /// (never real pods, whatever their own fields say).
    pub buffer_pods: Vec<BufferPod>,
    /// NodeOverlays that apply (the caller kept the accepted ones: [`crds::overlay::evaluate`]);
    /// each changes prices in the pools of its namespace.
    pub node_overlays: Vec<crds::NodeOverlay>,
}

/// One pod a CapacityBuffer keeps room for.
#[derive(Debug, Clone)]
pub struct BufferPod {
    /// The buffer, `namespace/name` (a management-cluster object).
    pub buffer: String,
    /// The pod: its template's spec, unbound, in the workload namespace the buffer names.
    pub pod: Arc<CompactPod>,
}

impl Snapshot {
    /// Whether `pool` serves `cluster`, by its name or its selector over the cluster's labels.
    pub fn serves(&self, pool: &NodePool, cluster: &str) -> bool {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        pool.selects(cluster, self.cluster_labels.get(cluster).unwrap_or(&NONE))
    }

    fn zone(&self) -> &str {
        self.zone.as_deref().unwrap_or(DEFAULT_ZONE)
    }
}

/// The storage objects of a workload cluster, for the volume checks of §3.2 (pods with invalid
/// volumes are not provisioned). `None`: not listed, so not checked. Shared (`Arc`s), as the
/// hub's watch caches hold them.
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    /// PersistentVolumeClaims.
    pub pvcs: Option<Vec<Arc<PersistentVolumeClaim>>>,
    /// StorageClasses.
    pub storage_classes: Option<Vec<Arc<StorageClass>>>,
    /// PersistentVolumes (their node affinity constrains where pods using them may go).
    pub pvs: Option<Vec<Arc<PersistentVolume>>>,
    /// CSINodes: attach limits of existing nodes per CSI driver.
    pub csinodes: Option<Vec<Arc<CSINode>>>,
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
    /// Static pools (`spec.replicas`) serving the cluster: never in `input.pools`, so no pending
    /// pod gets a node from them (their nodes are in `input.nodes`, room for pending pods like any
    /// other); their model is here for what keeps their count.
    pub static_pools: Vec<StaticPool>,
}

/// A static pool as the scheduling model reads it, and the node count it keeps.
#[derive(Debug, Clone)]
pub struct StaticPool {
    /// The pool (its usage counts its nodes and claims in flight).
    pub pool: Pool,
    /// `spec.replicas`.
    pub replicas: i64,
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

/// The instance types `pool` would launch (its node class's catalogue, as a round resolves them),
/// for a pool a round does not take: one the cluster has left, whose nodes are still priced.
pub fn pool_instance_types(snapshot: &Snapshot, pool: &NodePool) -> Vec<crds::catalog::InstanceType> {
    let mut notes = Vec::new();
    capacity::pool_types(pool, &object("NodePool", &pool.metadata), snapshot, &mut notes).0
}

/// Builds the input of one cluster's round (§3.3). Pools are those serving `cluster`
/// ([`Snapshot::serves`]); the caller keeps only Ready pools in the operator, `plan` takes them all.
pub fn build_input(
    snapshot: &Snapshot,
    cluster: &str,
    rule: PendingRule,
    settings: Settings,
) -> Result<Converted, ConvertError> {
    build_input_with_volumes(snapshot, &Volumes::default(), cluster, rule, settings)
}

/// A pod to place ([`pod_from`]) with what its volumes ask of its node (§3.12): the zones or
/// nodes its bound volumes and its unbound claims' classes allow, and the CSI volumes it attaches
/// (a node at a driver's limit takes none). Pending pods and pods moved off a node alike.
pub fn pod_to_place(p: &CompactPod, obj: &str, volumes: &Volumes) -> Result<crate::model::Pod, ConvertError> {
    let mut pod = pod_from(p, obj)?;
    if let Some(spec) = p.spec.as_ref() {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        pod.constraints.volume_requirements = volume_topology(spec, ns, volumes);
        pod.csi_volumes = csi_volumes(spec, ns, volumes);
    }
    Ok(pod)
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
    let pools: Vec<&NodePool> = snapshot.node_pools.iter().filter(|p| snapshot.serves(p, cluster)).collect();
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

    // Price ceilings, read before the nodes are priced against them.
    let mut price_limits: BTreeMap<String, i64> = BTreeMap::new();
    for p in &pools {
        if let (Some(name), Some(limit)) = (&p.metadata.name, price_limit_of(p, &object("NodePool", &p.metadata))?) {
            price_limits.insert(name.clone(), limit);
        }
    }
    let mut price_usage: BTreeMap<String, i64> = BTreeMap::new();
    let mut count_price = |pool: &str, node: &ExistingNode, options: &[String], obj: &str, notes: &mut Vec<String>| {
        if !price_limits.contains_key(pool) {
            return;
        }
        let types = catalogs.get(pool).map_or(&[][..], |(t, _)| t.as_slice());
        match price_of(node, options, types) {
            Ok(micros) => {
                let u = price_usage.entry(pool.to_string()).or_default();
                *u = u.saturating_add(micros);
            }
            Err(unknown) => notes.push(format!(
                "{obj}: instance type {unknown} is not in the catalogue of NodePool {pool}: it counts 0 toward \
                 spec.limits.{}",
                labels::PRICE_PER_HOUR
            )),
        }
    };

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
            usage.entry(p.clone()).or_default().count(&existing);
            count_price(p, &existing, &[], &obj, &mut out.notes);
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
            count_price(&p, &existing, &claim_options(c), &obj, &mut out.notes);
            usage.entry(p).or_default().count(&existing);
        }
        out.input.nodes.push(existing);
    }

    // Pools.
    for p in &pools {
        let obj = object("NodePool", &p.metadata);
        let name = p.metadata.name.clone().ok_or_else(|| err(&obj, "metadata.name", "missing"))?;
        if let Some(&limit) = price_limits.get(&name) {
            let used = price_usage.get(&name).copied().unwrap_or(0);
            out.input.shared.push(SharedLimit {
                name: format!("nodepool {name} price-per-hour"),
                pools: Some(BTreeSet::from([name.clone()])),
                remaining: Headroom { price_micros: Some(limit.saturating_sub(used)), ..Headroom::default() },
                sizes: BTreeMap::new(),
            });
        }
        let (instance_types, class_labels) = catalogs.remove(&name).unwrap_or_default();
        let mut pool_labels = class_labels;
        if let Some(m) = &p.spec.template.metadata {
            pool_labels.extend(m.labels.clone());
        }
        let pool = Pool {
            weight: p.spec.weight.unwrap_or(0),
            requirements: p.spec.template.spec.requirements.clone(),
            labels: pool_labels,
            taints: p.spec.template.spec.taints.clone(),
            startup_taints: p.spec.template.spec.startup_taints.clone(),
            limits: limits_of(p, &obj)?,
            usage: usage.get(&name).cloned().unwrap_or_default(),
            instance_types,
            name,
        };
        match p.spec.replicas {
            Some(replicas) => out.static_pools.push(StaticPool { pool, replicas }),
            None => out.input.pools.push(pool),
        }
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
                if let Some(why) = blocks_eviction(p, &snapshot.pdbs, snapshot.now) {
                    out.notes
                        .push(format!("{obj}: stays on leaving node {node} ({why}); no capacity is launched for it"));
                    continue;
                }
                out.input.pods.push(pod_to_place(p, &obj, volumes)?);
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
                        out.input.pods.push(pod_to_place(p, &obj, volumes)?);
                    }
                    Provisionable::OptOut => {}
                    Provisionable::Ignored(why) => out.notes.push(format!("{obj}: ignored, {why}")),
                }
            }
        }
    }

    // CapacityBuffer pods: as pending pods, except that nothing about them is a real pod's (no
    // trigger rule, no volumes: a buffer's template keeps room, not storage).
    for b in &snapshot.buffer_pods {
        let obj = format!("CapacityBuffer {} pod {}", b.buffer, b.pod.metadata.name.as_deref().unwrap_or_default());
        let Some(spec) = &b.pod.spec else { return Err(err(&obj, "spec", "missing")) };
        match provisionable(spec) {
            Provisionable::Yes => {
                let mut pod = pod_from(&b.pod, &obj)?;
                pod.buffer = Some(b.buffer.clone());
                out.input.pods.push(pod);
            }
            Provisionable::OptOut => {}
            Provisionable::Ignored(why) => out.notes.push(format!("{obj}: ignored, {why}")),
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

    /// Issue 28 item 2: a CapacityBuffer's pods are pods to place under either pending rule, marked
    /// with their buffer; a real pod is never one, whatever it carries.
    #[test]
    fn buffer_pods_are_placed_and_marked() {
        let buffer_pod = |name: &str| BufferPod { buffer: "demo/warm".to_string(), pod: pod(name, json!({})) };
        let snap = Snapshot {
            node_pools: vec![pool()],
            pods: vec![pod("web", unschedulable())],
            buffer_pods: vec![buffer_pod("capacity-buffer-warm-1"), buffer_pod("capacity-buffer-warm-2")],
            ..Snapshot::default()
        };
        for rule in [PendingRule::Unschedulable, PendingRule::Unbound] {
            let c = convert(&snap, rule);
            let marks: Vec<(&str, Option<&str>)> =
                c.input.pods.iter().map(|p| (p.name.as_str(), p.buffer.as_deref())).collect();
            assert_eq!(
                marks,
                [
                    ("web", None),
                    ("capacity-buffer-warm-1", Some("demo/warm")),
                    ("capacity-buffer-warm-2", Some("demo/warm"))
                ]
            );
        }
    }

    /// Issue 28 item 1: a static pool (`spec.replicas`) is no pool a pending pod can get a node
    /// from; its nodes stay room like any other, and its model is kept for what keeps its count.
    #[test]
    fn a_static_pool_makes_no_node_for_pending_pods_but_its_nodes_are_room() {
        let mut fixed = pool();
        fixed.metadata.name = Some("fixed".to_string());
        fixed.spec.replicas = Some(2);
        let node: K8sNode = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "fixed-node", "labels": {"karpenter.sh/nodepool": "fixed"}},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
        .unwrap();
        let snap = Snapshot {
            node_pools: vec![pool(), fixed],
            nodes: vec![Arc::new(node)],
            pods: vec![pod("web", unschedulable())],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unschedulable);
        let pools: Vec<&str> = c.input.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(pools, ["default"]);
        assert_eq!(c.static_pools.len(), 1);
        assert_eq!((c.static_pools[0].pool.name.as_str(), c.static_pools[0].replicas), ("fixed", 2));
        assert_eq!(c.static_pools[0].pool.usage.nodes, 1, "its node counts toward its usage");
        assert_eq!(c.input.nodes.len(), 1, "its node is room for pending pods");
        assert_eq!(names(&c), ["web"]);
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

    /// Node `old` of pool `default` (an XS), being deleted since `since`.
    fn deleting_node(since: &str) -> K8sNode {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "old", "labels": {"karpenter.sh/nodepool": "default"}, "deletionTimestamp": since},
            "status": {"capacity": {"cpu": "6", "memory": "7937580Ki", "pods": "110"}}}))
        .unwrap()
    }

    /// Issue 27 (audit): a pod stays on its leaving node while its do-not-disrupt duration runs
    /// (from its start, at the snapshot's time; no time known: still running) and when several
    /// PodDisruptionBudgets select it; not once the duration is over, nor under one PDB that allows
    /// some eviction.
    #[test]
    fn durations_and_several_pdbs_keep_pods_on_a_leaving_node_as_upstream() {
        let node = deleting_node("2026-11-25T11:00:00Z");
        let pdb = |name: &str| -> Arc<PodDisruptionBudget> {
            Arc::new(serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": "shop"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "db"}}}}))
            .unwrap())
        };
        let lasting = |d: &str| {
            json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": d}}, "spec": {"nodeName": "old"},
                "status": {"startTime": "2026-11-25T11:30:00Z"}})
        };
        let mut snap = Snapshot {
            node_pools: vec![pool()],
            nodes: vec![Arc::new(node)],
            pods: vec![
                pod("db", json!({"metadata": {"labels": {"app": "db"}}, "spec": {"nodeName": "old"}})),
                pod("for-an-hour", lasting("1h")),
                pod("for-ten-minutes", lasting("10m")),
            ],
            pdbs: vec![pdb("db-a")],
            now: Some("2026-11-25T12:00:00Z".parse().unwrap()),
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unschedulable);
        assert_eq!(names(&c), vec!["db", "for-ten-minutes"], "one PDB allowing evictions, a duration over");
        assert!(c.notes.iter().any(|n| n.contains("for-an-hour") && n.contains("not over yet")), "{:?}", c.notes);
        snap.pdbs.push(pdb("db-b"));
        snap.now = None;
        let c = convert(&snap, PendingRule::Unschedulable);
        assert_eq!(names(&c), Vec::<String>::new(), "two PDBs; no time known");
        assert!(c.notes.iter().any(|n| n.contains("db-a, db-b all select it")), "{:?}", c.notes);
    }

    #[test]
    fn terminating_pods_of_a_leaving_node_are_provisioned_for_only_when_a_statefulset_owns_them() {
        // Issue 13 item 12, karpenter-semantics §5.5.
        let node = deleting_node("2026-01-01T00:00:00Z");
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
        let volumes = Volumes { pvcs: Some(vec![Arc::new(pvc)]), pvs: Some(vec![Arc::new(pv)]), ..Volumes::default() };
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
            pvcs: Some(vec![Arc::new(pvc("a")), Arc::new(pvc("b"))]),
            pvs: Some(vec![Arc::new(pv("a")), Arc::new(pv("b"))]),
            csinodes: Some(vec![Arc::new(csinode)]),
            ..Volumes::default()
        };
        let c = build_input_with_volumes(&snap, &volumes, "c1", PendingRule::Unbound, Settings::default()).unwrap();
        assert_eq!(c.input.nodes[0].csi_limits.get("csi.example"), Some(&1));
        assert_eq!(c.input.nodes[0].pods[0].csi_volumes, vec![("csi.example".to_string(), "shop/a".to_string())]);
        let d = crate::solve(&c.input);
        assert!(d.existing.is_empty(), "the attach limit keeps db-1 off n1");
        assert_eq!(d.new_claims.len(), 1);
    }

    fn priced_pool(limits: serde_json::Value) -> NodePool {
        let mut p = pool();
        p.spec.limits = serde_json::from_value(limits).unwrap();
        p
    }

    #[test]
    fn a_price_ceiling_is_a_limit_of_its_pool_less_what_its_nodes_cost() {
        let node = |name: &str, flavor: &str| -> Arc<K8sNode> {
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default",
                        "node.kubernetes.io/instance-type": flavor}},
                    "status": {"capacity": {"cpu": "6", "memory": "7937580Ki", "pods": "110"}}}))
                .unwrap(),
            )
        };
        let claim = |name: &str, options: &[&str], status: serde_json::Value| -> NodeClaim {
            serde_json::from_value(json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": name, "namespace": "demo", "labels": {"karpenter.sh/nodepool": "default"}},
                "spec": {"clusterName": "c1",
                    "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": options}],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
                "status": status
            }))
            .unwrap()
        };
        let snap = Snapshot {
            node_pools: vec![priced_pool(json!({"cpu": "100", "karpenter.clever-cloud.com/price-per-hour": "0.5"}))],
            nodes: vec![node("n-xs", "XS"), node("n-odd", "mystery")],
            node_claims: vec![
                // Not launched: sized (and priced) as its smallest option, a 2XS.
                claim("fresh", &["2XS", "XS"], json!({})),
                // Launched, its type not settled in its labels: its dearest option, an M.
                claim("launched", &["S", "M"], json!({"allocatable": {"cpu": "8", "memory": "11Gi", "pods": "110"}})),
            ],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unbound);
        assert_eq!(c.input.pools[0].limits.cpu_millis, Some(100_000));
        assert_eq!(c.input.pools[0].usage.nodes, 4);
        assert_eq!(
            c.input.shared,
            vec![SharedLimit {
                name: "nodepool default price-per-hour".into(),
                pools: Some(BTreeSet::from(["default".to_string()])),
                // 0.5 − (XS 0.0611 + 2XS 0.0333 + M 0.1167), the unknown flavor counting 0.
                remaining: Headroom { price_micros: Some(288_900), ..Headroom::default() },
                sizes: BTreeMap::new(),
            }]
        );
        assert!(
            c.notes.iter().any(|n| n.starts_with("Node n-odd: instance type mystery is not in the catalogue")),
            "{:?}",
            c.notes
        );
        // Over the ceiling already: what is left is negative, and no type fits.
        let mut over = snap.clone();
        over.node_pools = vec![priced_pool(json!({"karpenter.clever-cloud.com/price-per-hour": "0.1"}))];
        let c = convert(&over, PendingRule::Unbound);
        assert_eq!(c.input.shared[0].remaining.price_micros, Some(100_000 - 211_100));
        // No ceiling, no shared limit (and no note about prices).
        let mut plain = snap.clone();
        plain.node_pools = vec![pool()];
        let c = convert(&plain, PendingRule::Unbound);
        assert!(c.input.shared.is_empty());
        assert!(!c.notes.iter().any(|n| n.contains("price-per-hour")), "{:?}", c.notes);
    }

    #[test]
    fn a_price_ceiling_that_is_no_decimal_eur_names_the_field_and_the_form() {
        for bad in ["1e3", "-1", "0.1234567", "5Gi"] {
            let snap = Snapshot {
                node_pools: vec![priced_pool(json!({"karpenter.clever-cloud.com/price-per-hour": bad}))],
                ..Snapshot::default()
            };
            let e = build_input(&snap, "c1", PendingRule::Unbound, Settings::default()).unwrap_err();
            assert_eq!(e.object, "NodePool demo/default");
            assert_eq!(e.field, "spec.limits.karpenter.clever-cloud.com/price-per-hour");
            assert!(e.message.contains("EUR per hour as a decimal string"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn a_price_ceiling_reaches_the_solver() {
        // 0.05 EUR/h: a 2XS (0.0333) for the 1-CPU pod; the 5-CPU one needs an XS (0.0611): pending.
        let snap = Snapshot {
            node_pools: vec![priced_pool(json!({"karpenter.clever-cloud.com/price-per-hour": "0.05"}))],
            pods: vec![
                pod("small", json!({})),
                pod(
                    "large",
                    json!({"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "5"}}}]}}),
                ),
            ],
            ..Snapshot::default()
        };
        let c = convert(&snap, PendingRule::Unbound);
        let d = crate::solve(&c.input);
        assert_eq!(d.new_claims.len(), 1);
        assert_eq!(d.new_claims[0].instance_types[0].name, "2XS");
        assert_eq!(d.unschedulable.len(), 1);
        assert!(d.unschedulable[0].reason.contains("nodepool default price-per-hour"), "{}", d.unschedulable[0].reason);
        assert_eq!(d.shared_drawn[0].price_micros, 33_300);
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
