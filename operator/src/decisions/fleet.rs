//! Which workload clusters a NodePool serves (fleet.md §2): the one it names, or, for a fleet pool,
//! every registered cluster of its own namespace whose labels its `clusterSelector` matches; when a
//! cluster has left a fleet pool's selection; and the summary of a fleet pool's per-cluster rows.
//!
//! Owns: those rules. Must not: read the registry or the caches (callers pass the labels they
//! hold and whether those are settled), or decide what happens to a departed cluster's nodes (its
//! claims drift as `ClusterNotSelected` and the disruption loop replaces them within budgets).

use std::collections::BTreeMap;

use crds::{NodePool, nodepool::PoolClusterStatus};

/// Whether `pool` serves cluster `namespace/cluster`, whose labels are `labels`. A pool never
/// serves a cluster of another namespace, whatever its labels (the tenancy boundary).
pub fn serves(pool: &NodePool, namespace: &str, cluster: &str, labels: &BTreeMap<String, String>) -> bool {
    pool.metadata.namespace.as_deref() == Some(namespace) && pool.selects(cluster, labels)
}

/// Whether cluster `cluster`, where `pool` has nodes, has left the fleet pool's selection: the
/// claims there drift (`ClusterNotSelected`). Only a fleet pool's cluster can leave (a named
/// cluster is the pool's for life), and only once the labels are `settled`: before every label
/// source has been read once, a missing label may just not have arrived yet.
pub fn departed(pool: &NodePool, cluster: &str, labels: &BTreeMap<String, String>, settled: bool) -> bool {
    settled && pool.is_fleet() && !pool.selects(cluster, labels)
}

/// A fleet pool's `clustersReady` column: `ready/selected`.
pub fn clusters_ready(rows: &[PoolClusterStatus]) -> String {
    let ready = rows.iter().filter(|r| r.ready == "True").count();
    format!("{ready}/{}", rows.len())
}

/// The message of a fleet pool's `Ready` condition when some selected clusters are not ready:
/// each cluster with its reason, the first few only (a condition message stays short).
pub fn not_ready_message(rows: &[PoolClusterStatus]) -> Option<String> {
    const SHOWN: usize = 5;
    let not_ready: Vec<&PoolClusterStatus> = rows.iter().filter(|r| r.ready != "True").collect();
    if not_ready.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = not_ready.iter().take(SHOWN).map(|r| format!("{} ({})", r.name, r.reason)).collect();
    if not_ready.len() > SHOWN {
        parts.push(format!("and {} more", not_ready.len() - SHOWN));
    }
    Some(format!("{} of {} selected clusters not ready: {}", not_ready.len(), rows.len(), parts.join(", ")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(ns: &str, target: serde_json::Value) -> NodePool {
        let mut spec = json!({"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
            "requirements": []}}});
        spec.as_object_mut().unwrap().extend(target.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "web", "namespace": ns}, "spec": spec,
        }))
        .unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_pool_serves_its_named_cluster_or_its_selection_in_its_own_namespace_only() {
        let prod = labels(&[("env", "prod")]);
        let named = pool("team-a", json!({"clusterName": "paris"}));
        assert!(serves(&named, "team-a", "paris", &BTreeMap::new()));
        assert!(!serves(&named, "team-a", "lyon", &prod));
        assert!(!serves(&named, "team-b", "paris", &BTreeMap::new()), "another namespace's cluster of the same name");
        let fleet = pool("team-a", json!({"clusterSelector": {"matchLabels": {"env": "prod"}}}));
        assert!(serves(&fleet, "team-a", "paris", &prod));
        assert!(serves(&fleet, "team-a", "lyon", &prod));
        assert!(!serves(&fleet, "team-a", "staging", &labels(&[("env", "staging")])));
        // fleet.md §7.1: no cluster outside the pool's namespace, whatever its labels.
        assert!(!serves(&fleet, "team-b", "paris", &prod));
        let everything = pool("team-a", json!({"clusterSelector": {}}));
        assert!(serves(&everything, "team-a", "any", &BTreeMap::new()));
        assert!(!serves(&everything, "other", "any", &BTreeMap::new()));
    }

    #[test]
    fn only_a_fleet_pool_s_cluster_departs_and_only_once_labels_are_settled() {
        let fleet = pool("team-a", json!({"clusterSelector": {"matchLabels": {"env": "prod"}}}));
        let staging = labels(&[("env", "staging")]);
        assert!(departed(&fleet, "paris", &staging, true));
        assert!(!departed(&fleet, "paris", &staging, false), "a Cluster's labels may not have arrived yet");
        assert!(!departed(&fleet, "paris", &labels(&[("env", "prod")]), true));
        let named = pool("team-a", json!({"clusterName": "paris"}));
        assert!(!departed(&named, "paris", &staging, true));
    }

    #[test]
    fn the_summary_counts_ready_rows_and_names_the_others() {
        let row = |name: &str, ready: &str, reason: &str| PoolClusterStatus {
            name: name.into(),
            ready: ready.into(),
            reason: reason.into(),
            ..PoolClusterStatus::default()
        };
        let rows =
            vec![row("a", "True", "Ready"), row("b", "False", "SecretMissing"), row("c", "False", "Unreachable")];
        assert_eq!(clusters_ready(&rows), "1/3");
        assert_eq!(
            not_ready_message(&rows).unwrap(),
            "2 of 3 selected clusters not ready: b (SecretMissing), c (Unreachable)"
        );
        assert_eq!(not_ready_message(&rows[..1]), None);
        assert_eq!(clusters_ready(&[]), "0/0");
        let many: Vec<_> = (0..8).map(|i| row(&format!("c{i}"), "False", "Syncing")).collect();
        assert!(not_ready_message(&many).unwrap().ends_with("and 3 more"), "{:?}", not_ready_message(&many));
    }
}
