//! One workload cluster's facts as the watch caches hold them, in the plain form the scheduling
//! and disruption cores read (a [`Snapshot`]): from the management cache the namespace's NodePools
//! that take part (their node class Ready), node classes, flavor catalogues and the cluster's
//! NodeClaims; from the workload cache its Nodes, Pods, DaemonSets and PodDisruptionBudgets (its
//! storage objects come beside the snapshot, from [`WorkloadCache::volumes`], as `plan` reads them).
//! Provisioning's rounds and disruption's passes gather through here, so both see a cluster alike;
//! the caches are plain [`kube::runtime::reflector::Store`]s, so tests fill them from watcher
//! events and gather without a server.
//!
//! Owns: that assembly. Must not: read anything live, decide (the decisions and the cores do),
//! write, or look at whether the caches are synced (the callers gate on it first).

use std::sync::Arc;

use crds::{NodeClaim, NodePool};
use scheduling::convert::{BufferPod, Snapshot};

use crate::{
    decisions::{capacity_buffer, fleet, taking_part},
    infra::{
        hub::MgmtCache,
        registry::{ClusterKey, Labels, Registry, WorkloadCache},
    },
};

/// A cluster's labels (fleet.md §1) as the registry holds them, and whether they are settled
/// ([`Registry::labels_settled`]): what fleet pools select on.
#[derive(Debug, Clone, Default)]
pub struct ClusterLabels {
    pub labels: Labels,
    pub settled: bool,
}

impl ClusterLabels {
    /// Cluster `key`'s, from `registry`.
    pub fn of(registry: &Registry, key: &ClusterKey) -> Self {
        ClusterLabels { labels: registry.labels(key), settled: registry.labels_settled() }
    }
}

/// The clusters `pool` serves, sorted: the one it names (registered or not: its status says which),
/// or, for a fleet pool, every registered cluster of its namespace whose labels it selects.
pub fn served_by(registry: &Registry, pool: &NodePool) -> Vec<ClusterKey> {
    let ns = pool.metadata.namespace.clone().unwrap_or_default();
    if let Some(name) = &pool.spec.cluster_name {
        return vec![ClusterKey::new(ns, name.clone())];
    }
    registry
        .registered()
        .into_iter()
        .filter(|k| k.namespace == ns && fleet::serves(pool, &ns, &k.name, &registry.labels(k)))
        .collect()
}

/// The NodeClaims of cluster `key`, as the management cache holds them.
pub fn claims(mgmt: &MgmtCache, key: &ClusterKey) -> Vec<Arc<NodeClaim>> {
    mgmt.claims_in(&key.namespace).into_iter().filter(|c| c.spec.cluster_name == key.name).collect()
}

/// How much of the workload cluster a snapshot carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Every cached Node and Pod (provisioning: pending pods, and the room existing nodes have).
    Everything,
    /// Nodes and Pods only when the cluster has claims (disruption: without a claim the hub has no
    /// node to disrupt, and the view needs only the pools' budgets, not the cluster's pods).
    WithClaims,
}

/// The cluster's objects as the scheduling and disruption cores read them: the pools serving it whose
/// node class is Ready (the only ones that take part), the fleet pools it departed from that still
/// have nodes there (for their budgets; never destinations), `claims` (the cluster's, see [`claims`]), and the
/// rest from the caches: the workload objects shared with them (`Arc`s), the management objects
/// copied.
pub fn snapshot(
    mgmt: &MgmtCache,
    workload: &WorkloadCache,
    key: &ClusterKey,
    labels: &ClusterLabels,
    zone: &str,
    claims: &[Arc<NodeClaim>],
    reading: Workload,
) -> Snapshot {
    let ns = &key.namespace;
    let classes = mgmt.classes_in(ns);
    let pools = mgmt.pools_in(ns);
    let nodes_and_pods = reading == Workload::Everything || !claims.is_empty();
    let mut node_pools = taking_part::pools(&classes, &pools, ns, &key.name, &labels.labels);
    node_pools.extend(taking_part::departed(&classes, &pools, &key.name, &labels.labels, labels.settled, claims));
    Snapshot {
        node_pools,
        cluster_labels: [(key.name.clone(), labels.labels.clone())].into(),
        node_classes: classes.iter().map(|c| c.as_ref().clone()).collect(),
        flavor_catalogs: mgmt.catalogs_in(ns).iter().map(|c| c.as_ref().clone()).collect(),
        node_claims: claims.iter().map(|c| c.as_ref().clone()).collect(),
        nodes: if nodes_and_pods { workload.nodes.state() } else { Vec::new() },
        pods: if nodes_and_pods { workload.pods.state() } else { Vec::new() },
        daemonsets: workload.daemonsets.state(),
        pdbs: workload.pdbs.state(),
        zone: Some(zone.to_string()),
        // The caller's time (a snapshot reads no clock).
        now: None,
        buffer_pods: if nodes_and_pods { buffer_pods(mgmt, key, labels) } else { Vec::new() },
        node_overlays: mgmt.overlays_in(ns),
    }
}

/// The pods of the CapacityBuffers serving cluster `key`, resolved against the cached PodTemplates
/// of its namespace; a buffer that does not resolve has none (its status says why).
pub fn buffer_pods(mgmt: &MgmtCache, key: &ClusterKey, labels: &ClusterLabels) -> Vec<BufferPod> {
    let buffers = mgmt.buffers_in(&key.namespace);
    if buffers.is_empty() {
        return Vec::new();
    }
    let templates = mgmt.pod_templates.state();
    buffers
        .iter()
        .filter(|b| b.selects(&key.name, &labels.labels))
        .filter_map(|b| match capacity_buffer::resolve(b, &templates) {
            capacity_buffer::Resolution::Ready(r) => Some(r.pods),
            capacity_buffer::Resolution::NotReady { .. } => None,
        })
        .flatten()
        .collect()
}
