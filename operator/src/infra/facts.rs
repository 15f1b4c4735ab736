//! One workload cluster's facts as the watch caches hold them, in the plain form the scheduling
//! and disruption cores read (a [`Snapshot`]): from the management cache the namespace's NodePools
//! that take part (their node class Ready), node classes, flavor catalogues and the cluster's
//! NodeClaims; from the workload cache its Nodes, Pods, DaemonSets and PodDisruptionBudgets.
//! Provisioning's rounds and disruption's passes gather through here, so both see a cluster alike;
//! the caches are plain [`kube::runtime::reflector::Store`]s, so tests fill them from watcher
//! events and gather without a server.
//!
//! Owns: that assembly. Must not: read anything live, decide (the decisions and the cores do),
//! write, or look at whether the caches are synced (the callers gate on it first).

use std::sync::Arc;

use crds::NodeClaim;
use scheduling::convert::Snapshot;

use crate::{
    decisions::taking_part,
    infra::{hub::MgmtCache, registry::ClusterKey, registry::WorkloadCache},
};

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

/// The cluster's objects as the scheduling and disruption cores read them: the pools whose node
/// class is Ready (the only ones that take part), `claims` (the cluster's, see [`claims`]), and the
/// rest from the caches: the workload objects shared with them (`Arc`s), the management objects
/// copied.
pub fn snapshot(
    mgmt: &MgmtCache,
    workload: &WorkloadCache,
    key: &ClusterKey,
    zone: &str,
    claims: &[Arc<NodeClaim>],
    reading: Workload,
) -> Snapshot {
    let ns = &key.namespace;
    let classes = mgmt.classes_in(ns);
    let nodes_and_pods = reading == Workload::Everything || !claims.is_empty();
    Snapshot {
        node_pools: taking_part::pools(&classes, &mgmt.pools_in(ns), &key.name),
        node_classes: classes.iter().map(|c| c.as_ref().clone()).collect(),
        flavor_catalogs: mgmt.catalogs_in(ns).iter().map(|c| c.as_ref().clone()).collect(),
        node_claims: claims.iter().map(|c| c.as_ref().clone()).collect(),
        nodes: if nodes_and_pods { workload.nodes.state() } else { Vec::new() },
        pods: if nodes_and_pods { workload.pods.state() } else { Vec::new() },
        daemonsets: workload.daemonsets.state(),
        pdbs: workload.pdbs.state(),
        zone: Some(zone.to_string()),
    }
}
