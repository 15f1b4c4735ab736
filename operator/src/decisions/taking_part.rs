//! Which NodePools of a workload cluster take part in scheduling, for provisioning rounds and
//! disruption's simulation alike (karpenter-semantics §1.4): the cluster's pools not being deleted
//! whose node class is Ready.
//!
//! Owns: that rule. Must not: read caches (the callers pass what their caches hold).

use std::{collections::BTreeSet, sync::Arc};

use crds::{CleverNodeClass, NodePool};
use kube::ResourceExt;

use crate::decisions::conditions;

/// Whether a node class is Ready: its pools take part, and claims launch with it.
pub fn class_ready(class: &CleverNodeClass) -> bool {
    conditions::is_true(class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), "Ready")
}

/// The pools of cluster `cluster` (among `pools` of one namespace) that take part, given the
/// namespace's node `classes`.
pub fn pools(classes: &[Arc<CleverNodeClass>], pools: &[Arc<NodePool>], cluster: &str) -> Vec<NodePool> {
    let ready: BTreeSet<String> = classes.iter().filter(|c| class_ready(c)).map(|c| c.name_any()).collect();
    pools
        .iter()
        .filter(|p| {
            p.spec.cluster_name == cluster
                && p.metadata.deletion_timestamp.is_none()
                && ready.contains(&p.spec.template.spec.node_class_ref.name)
        })
        .map(|p| p.as_ref().clone())
        .collect()
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
        let names: Vec<String> = pools(&classes, &all, "prod").iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a"]);
    }
}
