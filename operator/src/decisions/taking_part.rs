//! Which NodePools of a workload cluster take part in scheduling, for provisioning rounds and
//! disruption's simulation alike (karpenter-semantics §1.4): the pools serving the cluster (by
//! name, or a fleet pool by its selector: [`fleet::serves`]) not being deleted whose node class is
//! Ready; and the fleet pools the cluster has departed from that still have nodes there, whose
//! budgets keep applying to those nodes.
//!
//! Owns: that rule. Must not: read caches (the callers pass what their caches hold).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use crds::{CleverNodeClass, NodePool};
use kube::ResourceExt;

use crate::decisions::{conditions, fleet};

/// Whether a node class is Ready: its pools take part, and claims launch with it.
pub fn class_ready(class: &CleverNodeClass) -> bool {
    conditions::is_true(class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), "Ready")
}

/// The pools serving cluster `namespace/cluster` (labels `labels`) that take part, among `pools`
/// of that namespace, given its node `classes`.
pub fn pools(
    classes: &[Arc<CleverNodeClass>],
    pools: &[Arc<NodePool>],
    namespace: &str,
    cluster: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<NodePool> {
    let ready = ready_classes(classes);
    pools
        .iter()
        .filter(|p| fleet::serves(p, namespace, cluster, labels) && usable(p, &ready))
        .map(|p| p.as_ref().clone())
        .collect()
}

/// The fleet pools cluster `cluster` has departed from ([`fleet::departed`]) that still have one of
/// `claims` there: not destinations of any pod, but the disruption loop needs their budgets and
/// `consolidateAfter` to replace those nodes.
pub fn departed(
    classes: &[Arc<CleverNodeClass>],
    pools: &[Arc<NodePool>],
    cluster: &str,
    labels: &BTreeMap<String, String>,
    settled: bool,
    claims: &[Arc<crds::NodeClaim>],
) -> Vec<NodePool> {
    let ready = ready_classes(classes);
    let with_claims: BTreeSet<&str> =
        claims.iter().filter_map(|c| c.labels().get(crds::labels::NODEPOOL).map(String::as_str)).collect();
    pools
        .iter()
        .filter(|p| {
            with_claims.contains(p.name_any().as_str())
                && fleet::departed(p, cluster, labels, settled)
                && usable(p, &ready)
        })
        .map(|p| p.as_ref().clone())
        .collect()
}

fn ready_classes(classes: &[Arc<CleverNodeClass>]) -> BTreeSet<String> {
    classes.iter().filter(|c| class_ready(c)).map(|c| c.name_any()).collect()
}

fn usable(pool: &NodePool, ready: &BTreeSet<String>) -> bool {
    pool.metadata.deletion_timestamp.is_none() && ready.contains(&pool.spec.template.spec.node_class_ref.name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, ready: &str) -> Arc<CleverNodeClass> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap(),
        )
    }

    fn pool(name: &str, cluster: &str, class: &str, deleting: bool) -> Arc<NodePool> {
        let mut v = json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"clusterName": cluster, "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": class},
                "requirements": []}}},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn only_the_cluster_s_live_pools_whose_class_is_ready_take_part() {
        let classes = [class("ready", "True"), class("broken", "False")];
        let all = [
            pool("a", "prod", "ready", false),
            pool("b", "prod", "broken", false),
            pool("c", "prod", "missing", false),
            pool("d", "prod", "ready", true),
            pool("e", "staging", "ready", false),
        ];
        let none = BTreeMap::new();
        let names: Vec<String> =
            pools(&classes, &all, "team-a", "prod", &none).iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a"]);
        assert!(pools(&classes, &all, "team-b", "prod", &none).is_empty(), "another namespace's cluster");
    }

    fn fleet(name: &str, env: &str) -> Arc<NodePool> {
        let mut p = pool(name, "unused", "ready", false).as_ref().clone();
        p.spec.cluster_name = None;
        p.spec.cluster_selector = Some(serde_json::from_value(json!({"matchLabels": {"env": env}})).unwrap());
        Arc::new(p)
    }

    fn claim(pool: &str) -> Arc<crds::NodeClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
                "metadata": {"name": format!("{pool}-x"), "namespace": "team-a", "labels": {"karpenter.sh/nodepool": pool}},
                "spec": {"clusterName": "paris", "requirements": [],
                    "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "ready"}},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_fleet_pool_takes_part_where_it_selects_and_stays_known_where_it_has_nodes_left() {
        let classes = [class("ready", "True")];
        let all = [fleet("prod-web", "prod"), fleet("staging-web", "staging"), pool("named", "paris", "ready", false)];
        let prod = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let names = |v: Vec<NodePool>| v.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
        assert_eq!(names(pools(&classes, &all, "team-a", "paris", &prod)), ["prod-web", "named"]);
        // paris left staging-web's selection with a node of it still there: known for its budgets,
        // once the labels are settled; a pool with no node there is not.
        let claims = [claim("staging-web"), claim("named")];
        assert_eq!(names(departed(&classes, &all, "paris", &prod, true, &claims)), ["staging-web"]);
        assert!(departed(&classes, &all, "paris", &prod, false, &claims).is_empty());
        assert!(departed(&classes, &all, "paris", &prod, true, &claims[1..]).is_empty());
    }
}
