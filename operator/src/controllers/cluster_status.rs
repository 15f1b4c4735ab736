//! Where a user sees the state of each workload cluster (hub.md §4), outside NodePool conditions:
//! the per-cluster connection metrics and an event on the kubeconfig Secret at every change of
//! connection phase. A cluster's series start at 0 when it registers and go when it is removed.
//!
//! Owns: following the registry's changes into metrics and Secret events. Must not: put anything
//! from the kubeconfig in an event or a label (the message is the registry's, already scrubbed),
//! nor anything the cluster's server sent (the registry's message has none; its `cause`, in the
//! hub's own words, goes to the log only).

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::ObjectReference;
use tokio_util::sync::CancellationToken;

use crate::{
    infra::hub::Hub,
    infra::metrics::{ClusterLabels, PhaseLabels},
    infra::registry::{ClusterKey, ClusterStatus, Phase},
};

const PHASES: [Phase; 10] = Phase::ALL;

/// What changed between two observations of the registry.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub registered: Vec<ClusterKey>,
    pub removed: Vec<ClusterKey>,
    /// Clusters whose phase changed (or that are new), with the new status.
    pub transitions: Vec<(ClusterKey, ClusterStatus)>,
}

/// Compare the last known phases with the current statuses. Pure.
pub fn diff(last: &BTreeMap<ClusterKey, Phase>, now: &BTreeMap<ClusterKey, ClusterStatus>) -> Changes {
    let mut out = Changes::default();
    for key in last.keys().filter(|k| !now.contains_key(*k)) {
        out.removed.push(key.clone());
    }
    for (key, status) in now {
        match last.get(key) {
            None => {
                out.registered.push(key.clone());
                out.transitions.push((key.clone(), status.clone()));
            }
            Some(p) if *p != status.phase => out.transitions.push((key.clone(), status.clone())),
            Some(_) => {}
        }
    }
    out
}

/// Whether reaching `phase` deserves a Warning (the cluster cannot get decisions for a reason a
/// person must fix or should know about). A pause is someone's deliberate choice: a Normal event.
pub fn is_warning(phase: Phase) -> bool {
    !matches!(phase, Phase::Connected | Phase::Syncing | Phase::Paused)
}

fn secret_ref(key: &ClusterKey) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Secret".to_string()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.secret_name()),
        ..Default::default()
    }
}

/// Follow the registry until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut changes = hub.registry.changes();
    let mut last: BTreeMap<ClusterKey, Phase> = BTreeMap::new();
    loop {
        let now: BTreeMap<ClusterKey, ClusterStatus> =
            hub.registry.clusters().into_iter().map(|k| (k.clone(), hub.registry.status(&k))).collect();
        let d = diff(&last, &now);
        let m = &hub.metrics;
        for key in &d.removed {
            m.cluster_removed(&key.to_string());
            last.remove(key);
        }
        for key in &d.registered {
            m.cluster_registered(&key.to_string());
        }
        for (key, status) in &d.transitions {
            last.insert(key.clone(), status.phase);
            let cluster = key.to_string();
            m.cluster_transitions.get(&ClusterLabels { cluster: cluster.clone() }).inc();
            for p in PHASES {
                m.cluster_phase
                    .get(&PhaseLabels { cluster: cluster.clone(), phase: p.reason().to_string() })
                    .set(i64::from(p == status.phase));
            }
            tracing::info!(cluster = %key, phase = status.phase.reason(), message = %status.message, cause = status.cause.map(tracing::field::display), "cluster connection state changed");
            let note = if status.message.is_empty() {
                format!("cluster {}: {}", key.name, status.phase.reason())
            } else {
                format!("cluster {}: {}: {}", key.name, status.phase.reason(), status.message)
            };
            hub.event(&secret_ref(key), is_warning(status.phase), status.phase.reason(), "Connect", note).await;
        }
        // Synced is not a phase change of its own: refresh the gauge on every change.
        for (key, status) in &now {
            let synced = hub.registry.connection(key).is_some_and(|c| c.is_synced());
            let connected = status.phase == Phase::Connected && synced;
            m.cluster_connected.get(&ClusterLabels { cluster: key.to_string() }).set(i64::from(connected));
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(phase: Phase) -> ClusterStatus {
        ClusterStatus { phase, message: String::new(), cause: None }
    }

    #[test]
    fn new_clusters_register_and_transition_once() {
        let a = ClusterKey::new("team-a", "alpha");
        let last = BTreeMap::new();
        let now = BTreeMap::from([(a.clone(), st(Phase::Syncing))]);
        let d = diff(&last, &now);
        assert_eq!(d.registered, vec![a.clone()]);
        assert_eq!(d.transitions.len(), 1);
        // Same phase again: nothing to report.
        let last = BTreeMap::from([(a.clone(), Phase::Syncing)]);
        assert_eq!(diff(&last, &now), Changes::default());
    }

    #[test]
    fn a_phase_change_is_a_transition_and_a_vanished_cluster_is_removed() {
        let a = ClusterKey::new("team-a", "alpha");
        let b = ClusterKey::new("team-b", "beta");
        let last = BTreeMap::from([(a.clone(), Phase::Connected), (b.clone(), Phase::Connected)]);
        let now = BTreeMap::from([(a.clone(), st(Phase::Unreachable))]);
        let d = diff(&last, &now);
        assert_eq!(d.removed, vec![b]);
        assert!(d.registered.is_empty());
        assert_eq!(d.transitions, vec![(a, st(Phase::Unreachable))]);
    }

    #[test]
    fn only_trouble_is_a_warning() {
        assert!(!is_warning(Phase::Connected));
        assert!(!is_warning(Phase::Syncing));
        assert!(!is_warning(Phase::Paused), "a pause is deliberate, not trouble");
        for p in [
            Phase::Unauthorized,
            Phase::Unreachable,
            Phase::InvalidKubeconfig,
            Phase::SecretMissing,
            Phase::DuplicateCluster,
        ] {
            assert!(is_warning(p), "{p:?}");
        }
    }
}
