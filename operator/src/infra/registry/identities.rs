//! Which registration speaks for a workload cluster registered more than once (hub.md §1): the
//! registrations of one namespace that identified the same cluster (its `kube-system` UID), ranked
//! oldest Secret first; namespaces never compete. In sharded mode the registrations other replicas
//! identified (published on their shard bucket Leases) rank beside this replica's own.
//!
//! Owns: the table of identified clusters shared by the connection tasks, and the ranking. Must
//! not: connect, or compare registrations across namespaces.

use std::{collections::BTreeMap, sync::PoisonError};

use super::ClusterKey;

/// A registration's place among registrations of the same workload cluster: the older Secret
/// first, then the one this process saw first (creation times have a one-second resolution).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    pub(super) created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    pub(super) seen: u64,
}

/// Which registrations have identified which workload cluster (`kube-system` UID), shared by the
/// connection tasks.
///
/// Per namespace: registrations in different namespaces never compete for a cluster. The UID is
/// what the server named in a kubeconfig answers, and a tenant chooses that server: were the
/// table shared, a tenant's older Secret pointing at a server that answers another tenant's UID
/// would take that tenant's cluster away (`DuplicateCluster`), and the refusal would name the
/// first tenant's objects to the second. Nothing the hub can check proves a connection genuine
/// against such a server, so namespaces are kept apart instead of ranked. Two namespaces that
/// really reach one cluster are then served like two hubs on it: each keeps to its own NodeGroups
/// (the ownership labels name the namespace, hub.md §5), and both may provision for the same
/// pending pods. Within a namespace (one tenant, who can delete either Secret) the oldest Secret
/// speaks, and the refusal names a Secret of that namespace only.
///
/// Clusters are recorded by a digest of their UID ([`digest`]), the form other replicas publish.
#[derive(Debug, Default)]
pub(crate) struct Identities {
    claims: std::sync::Mutex<BTreeMap<ClusterKey, (String, Rank)>>,
    /// Sharded mode: the registrations other replicas identified, from the bucket Leases they hold
    /// live (replaced whole at each shard round).
    remote: std::sync::Mutex<BTreeMap<ClusterKey, (String, Rank)>>,
}

/// The UID of a workload cluster as recorded and published: a SHA-256 digest (16 bytes, hex), so
/// nothing a workload cluster answered is copied into the management cluster.
pub(crate) fn digest(uid: &str) -> String {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(format!("kube-system\0{uid}").as_bytes()).iter().take(16).map(|b| format!("{b:02x}")).collect()
}

impl Identities {
    /// Record that `key` reaches cluster `uid`; the registration of its namespace that speaks for
    /// it (maybe `key`).
    pub(crate) fn claim(&self, key: &ClusterKey, uid: &str, rank: &Rank) -> ClusterKey {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), (digest(uid), rank.clone()));
        self.owner(&key.namespace, uid).unwrap_or_else(|| key.clone())
    }

    /// The registration in `namespace` that speaks for cluster `uid`, if any there identified it
    /// (here or, in sharded mode, on another replica).
    pub(crate) fn owner(&self, namespace: &str, uid: &str) -> Option<ClusterKey> {
        let mut all = self.remote.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // This replica's own claims win over a stale copy of what another replica published.
        all.extend(
            self.claims.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(k, v)| (k.clone(), v.clone())),
        );
        owner(&all, namespace, &digest(uid))
    }

    /// This replica's claims (UID digest and rank) for the registrations `wanted` says.
    pub(crate) fn claimed(&self, wanted: impl Fn(&ClusterKey) -> bool) -> BTreeMap<ClusterKey, (String, Rank)> {
        let claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        claims.iter().filter(|(k, _)| wanted(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Replace what other replicas published (UID digests); whether it changed.
    pub(crate) fn set_remote(&self, remote: BTreeMap<ClusterKey, (String, Rank)>) -> bool {
        let mut current = self.remote.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = *current != remote;
        *current = remote;
        changed
    }

    /// `key` no longer reaches any cluster (removed, or its kubeconfig is unusable).
    pub(crate) fn release(&self, key: &ClusterKey) {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }
}

/// Of the registrations in `namespace` that identified cluster `uid` (its digest), the one that
/// speaks for it: the lowest rank (the oldest Secret), then the lowest key. Pure.
fn owner(claims: &BTreeMap<ClusterKey, (String, Rank)>, namespace: &str, uid: &str) -> Option<ClusterKey> {
    claims
        .iter()
        .filter(|(k, (u, _))| k.namespace == namespace && u == uid)
        .min_by(|a, b| (&a.1.1, a.0).cmp(&(&b.1.1, b.0)))
        .map(|(k, _)| k.clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_oldest_registration_of_a_cluster_speaks_for_it_and_the_next_takes_over_when_it_goes() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Some(Time(s.parse().unwrap()));
        let (a, b, c) =
            (ClusterKey::new("team-a", "alpha"), ClusterKey::new("team-a", "copy"), ClusterKey::new("team-a", "other"));
        let ids = Identities::default();
        // b's Secret is younger although its key sorts first: a speaks for the cluster.
        assert_eq!(ids.claim(&a, "uid-1", &Rank { created: at("2026-01-01T00:00:00Z"), seen: 5 }), a);
        assert_eq!(ids.claim(&b, "uid-1", &Rank { created: at("2026-01-01T00:00:01Z"), seen: 1 }), a);
        // Another cluster is not a duplicate.
        assert_eq!(ids.claim(&c, "uid-2", &Rank { created: at("2026-01-01T00:00:02Z"), seen: 6 }), c);
        assert_eq!(ids.owner("team-a", "uid-1"), Some(a.clone()));
        ids.release(&a);
        assert_eq!(ids.owner("team-a", "uid-1"), Some(b.clone()));
        // Same second: the one seen first.
        assert_eq!(ids.claim(&a, "uid-1", &Rank { created: at("2026-01-01T00:00:01Z"), seen: 0 }), a);
        ids.release(&a);
        ids.release(&b);
        assert_eq!(ids.owner("team-a", "uid-1"), None);
        assert_eq!(ids.owner("team-a", "uid-2"), Some(c));
    }

    /// The hijack of issue 23: team-a's older Secret names a server that answers team-b's
    /// `kube-system` UID. Namespaces do not compete: team-b's registration speaks for its cluster,
    /// and team-a's for whatever its server is.
    #[test]
    fn registrations_in_different_namespaces_never_outrank_each_other() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Some(Time(s.parse().unwrap()));
        let (attacker, victim) = (ClusterKey::new("team-a", "fake"), ClusterKey::new("team-b", "prod"));
        let ids = Identities::default();
        assert_eq!(ids.claim(&attacker, "uid-b", &Rank { created: at("2020-01-01T00:00:00Z"), seen: 0 }), attacker);
        assert_eq!(ids.claim(&victim, "uid-b", &Rank { created: at("2026-01-01T00:00:00Z"), seen: 1 }), victim);
        assert_eq!(ids.owner("team-b", "uid-b"), Some(victim.clone()));
        assert_eq!(ids.owner("team-a", "uid-b"), Some(attacker.clone()));
        // Nor does it the other way round, and a namespace with no claim has no owner.
        ids.release(&attacker);
        assert_eq!(ids.owner("team-a", "uid-b"), None);
        assert_eq!(ids.owner("team-b", "uid-b"), Some(victim));
    }

    /// Sharded mode: a registration another replica identified (published on its bucket Lease)
    /// outranks a younger one here, and stops doing so once that replica's claim is gone; other
    /// namespaces' claims still do not compete.
    #[test]
    fn claims_published_by_other_replicas_rank_beside_this_replicas_own() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Some(Time(s.parse().unwrap()));
        let (here, there, elsewhere) =
            (ClusterKey::new("team-a", "copy"), ClusterKey::new("team-a", "prod"), ClusterKey::new("team-b", "prod"));
        let ids = Identities::default();
        assert_eq!(ids.claim(&here, "uid-1", &Rank { created: at("2026-01-02T00:00:00Z"), seen: 0 }), here);
        let older = Rank { created: at("2026-01-01T00:00:00Z"), seen: 0 };
        let remote = BTreeMap::from([
            (there.clone(), (digest("uid-1"), older.clone())),
            (elsewhere.clone(), (digest("uid-1"), older.clone())),
        ]);
        assert!(ids.set_remote(remote.clone()));
        assert!(!ids.set_remote(remote), "the same table again is no change");
        assert_eq!(ids.owner("team-a", "uid-1"), Some(there));
        assert_eq!(ids.owner("team-b", "uid-1"), Some(elsewhere));
        // What this replica publishes: its own claims only, by digest (never the UID itself).
        let published = ids.claimed(|_| true);
        assert_eq!(published.len(), 1);
        assert_eq!(published[&here].0, digest("uid-1"));
        assert!(!published[&here].0.contains("uid-1"));
        ids.set_remote(BTreeMap::new());
        assert_eq!(ids.owner("team-a", "uid-1"), Some(here));
    }
}
