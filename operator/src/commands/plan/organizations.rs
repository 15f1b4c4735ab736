//! What `plan` makes of the `CleverOrganization` objects given with the manifests: the room each
//! organisation selecting the planned cluster leaves it, as the hub's rounds plan with it
//! (fleet.md §4). From the ledger in the object's status when it is given as the management cluster
//! prints it (`kubectl get cleverorganization <name> -o yaml`) and counts the cluster; otherwise from
//! the Nodes of the planned cluster given, the other clusters counted as using nothing — and a note
//! says so.
//!
//! Owns: turning the manifests' organisations into rooms, with notes. Must not: decide (the rooms
//! are limits the scheduling core respects, as in the hub).

use crds::CleverOrganization;
use scheduling::convert::Snapshot;

use crate::decisions::organization::{self, Ceiling, ClusterId, Sizer};
use crate::infra::registry::ClusterKey;

/// The room each organisation of `organizations` that selects cluster `key` (whose labels are
/// `labels`) leaves it, by name; `snapshot` holds the cluster's Nodes and the catalogues.
pub fn rooms(
    organizations: &[CleverOrganization],
    key: &ClusterKey,
    labels: &std::collections::BTreeMap<String, String>,
    snapshot: &Snapshot,
    notes: &mut Vec<String>,
) -> Vec<(String, Ceiling)> {
    let id = ClusterId { namespace: &key.namespace, name: &key.name };
    let mut out = Vec::new();
    for org in organizations {
        let name = org.metadata.name.clone().unwrap_or_default();
        if organization::needs_namespace_labels(org) {
            notes.push(format!(
                "CleverOrganization {name} selects registrations by namespace labels, which plan does not read: it is \
                 not applied to cluster {key} (the hub applies it when namespace {} matches)",
                key.namespace
            ));
            continue;
        }
        if !organization::selects(org, &Default::default(), labels) {
            continue;
        }
        let headroom = organization::headroom(org);
        let room = if organization::counted(org, id) {
            notes.push(format!(
                "CleverOrganization {name}: planned within the room its status shows for cluster {key} ({})",
                headroom.describe()
            ));
            headroom
        } else {
            let sizer = Sizer::of_catalogs(&snapshot.flavor_catalogs);
            let here = organization::count_cluster(snapshot.nodes.iter().map(AsRef::as_ref), [], &sizer);
            let ledger = if org.status.is_some() { "its status does not count cluster " } else { "no status counts " };
            notes.push(format!(
                "CleverOrganization {name}: {ledger}{key}, so only the {} Node(s) given for it are counted against its \
                 quota and the other clusters' usage is not; give the object as `kubectl get cleverorganization {name} \
                 -o yaml` prints it to plan with the whole organisation's usage",
                here.nodes
            ));
            headroom.minus(here.usage)
        };
        if room.is_limited() {
            out.push((name, room));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn org(status: serde_json::Value, selector: serde_json::Value) -> CleverOrganization {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
            "metadata": {"name": "acme", "generation": 1},
            "spec": {"clusterSelector": selector, "quota": {"cpu": "40", "memory": "64G"}},
            "status": status,
        }))
        .unwrap()
    }

    fn control_plane(n: usize) -> std::sync::Arc<k8s_openapi::api::core::v1::Node> {
        std::sync::Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("cp-{n}"), "labels": {"clever-cloud.com/flavor": "S"}}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_ledger_given_is_the_room_else_the_clusters_own_nodes_with_a_note() {
        let key = ClusterKey::new("team-a", "paris");
        let labels = [("org".to_string(), "acme".to_string())].into();
        let snapshot = Snapshot { nodes: vec![control_plane(0), control_plane(1)], ..Default::default() };
        let mut notes = Vec::new();
        // No status: the two S control-plane nodes (8 vCPU, 12G each) count, nothing else.
        let rooms = rooms(&[org(json!(null), json!({}))], &key, &labels, &snapshot, &mut notes);
        assert_eq!(rooms.len(), 1);
        assert_eq!((rooms[0].1.cpu_millis, rooms[0].1.memory_bytes), (Some(24_000), Some(40_000_000_000)));
        assert!(notes[0].contains("no status counts team-a/paris"), "{notes:?}");
        // The ledger, as the management cluster prints it: its numbers, not the Nodes given.
        let status = json!({"clusterCount": 1, "clusters": [{
            "namespace": "team-a", "name": "paris", "nodes": 4, "cpuMillis": 36000, "memoryBytes": 48_000_000_000_i64,
            "observedTime": "2026-11-28T10:00:00Z"}]});
        let mut notes = Vec::new();
        let rooms = super::rooms(&[org(status, json!({}))], &key, &labels, &snapshot, &mut notes);
        assert_eq!(rooms[0].1.cpu_millis, Some(4_000));
        assert!(notes[0].contains("the room its status shows"), "{notes:?}");
        // Not selected, or selected by namespace labels plan cannot read: no room.
        let other = org(json!(null), json!({"matchLabels": {"org": "other"}}));
        assert!(super::rooms(&[other], &key, &labels, &snapshot, &mut Vec::new()).is_empty());
        let mut by_ns = org(json!(null), json!({}));
        by_ns.spec.namespace_selector = Some(serde_json::from_value(json!({"matchLabels": {"a": "b"}})).unwrap());
        let mut notes = Vec::new();
        assert!(super::rooms(&[by_ns], &key, &labels, &snapshot, &mut notes).is_empty());
        assert!(notes[0].contains("namespace labels, which plan does not read"), "{notes:?}");
    }
}
