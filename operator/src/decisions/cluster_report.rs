//! What a cluster's `WorkloadCluster` report says, and when it is worth writing again (fleet.md §6:
//! the fleet view reads the management cluster only).
//!
//! Owns: the report's content from what the hub saw, the write rule (on change, else a refresh so a
//! reader can tell a served cluster from an abandoned report), and staleness as a reader judges it.
//! Must not: read caches or the clock (callers pass what they saw and the time).

use std::time::Duration;

use crds::{NodeClaim, WorkloadClusterStatus};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

/// A report unchanged this long is written again (its `observedTime` moves on). 15 minutes: the
/// refreshes of a fleet of 1,000 clusters cost 1.1 writes/s on the management API (every 3 minutes
/// they were 5.6/s, more than the shard Leases and everything else the hub writes while idle).
pub const REFRESH: Duration = Duration::from_secs(900);

/// A report older than this is stale to a reader: no replica has served the cluster for that long
/// (a writer refreshes every [`REFRESH`]; the margin covers a slow pass or a hand-over).
pub const STALE_AFTER: Duration = Duration::from_secs(2400);

/// What the hub saw of one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen<'a> {
    /// The connection phase's reason (`Connected`, `Unreachable`, …).
    pub phase: &'a str,
    /// The registry's message (the hub's words), empty when there is nothing to say.
    pub message: &'a str,
    /// Once the cluster's caches have synced: its Nodes and its pods waiting for capacity.
    pub synced: Option<(usize, usize)>,
    /// Catalogue price of the hub's launched claims there, EUR/h.
    pub eur_per_hour: f64,
    /// The replica writing.
    pub replica: &'a str,
}

/// The hub's claims for a cluster not being deleted, and those being deleted.
pub fn claim_counts<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>) -> (usize, usize) {
    claims.into_iter().fold((0, 0), |(live, going), c| {
        if c.metadata.deletion_timestamp.is_some() { (live, going + 1) } else { (live + 1, going) }
    })
}

/// The report for `seen` and the claims' counts ([`claim_counts`]), observed at `now`.
pub fn report(seen: &Seen<'_>, claims: (usize, usize), now: Timestamp) -> WorkloadClusterStatus {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    WorkloadClusterStatus {
        phase: seen.phase.to_string(),
        message: (!seen.message.is_empty()).then(|| seen.message.chars().take(1024).collect()),
        nodes: seen.synced.map(|(nodes, _)| count(nodes)),
        hub_nodes: count(claims.0),
        pending_pods: seen.synced.map(|(_, pending)| count(pending)),
        disrupting: count(claims.1),
        price_per_hour: price(seen.eur_per_hour),
        replica: (!seen.replica.is_empty()).then(|| seen.replica.to_string()),
        observed_time: Time(now),
    }
}

/// EUR/h as the report writes it: four decimal places.
pub fn price(eur_per_hour: f64) -> String {
    // An empty sum is -0.0, which would print as "-0.0000".
    format!("{:.4}", if eur_per_hour > 0.0 { eur_per_hour } else { 0.0 })
}

/// Whether `new` must be written, the last written report being `last`: when it says something
/// else, or when the last one is [`REFRESH`] old.
pub fn due(last: Option<&WorkloadClusterStatus>, new: &WorkloadClusterStatus) -> bool {
    let Some(last) = last else { return true };
    let same = WorkloadClusterStatus { observed_time: new.observed_time.clone(), ..last.clone() } == *new;
    !same || age(last, new.observed_time.0) >= REFRESH
}

/// Whether a reader at `now` should distrust `report` (see [`STALE_AFTER`]).
pub fn is_stale(report: &WorkloadClusterStatus, now: Timestamp) -> bool {
    age(report, now) > STALE_AFTER
}

fn age(report: &WorkloadClusterStatus, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(report.observed_time.0)).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn seen() -> Seen<'static> {
        Seen { phase: "Connected", message: "", synced: Some((5, 2)), eur_per_hour: 0.18339, replica: "hub-0" }
    }

    fn claim(deleting: bool) -> NodeClaim {
        let mut v = serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": "c", "namespace": "team-a"},
            "spec": {"clusterName": "prod", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}, "requirements": []},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_report_counts_what_was_seen() {
        let claims = [claim(false), claim(false), claim(true)];
        let r = report(&seen(), claim_counts(&claims), at(0));
        assert_eq!(r.phase, "Connected");
        assert_eq!(r.message, None);
        assert_eq!((r.nodes, r.pending_pods), (Some(5), Some(2)));
        assert_eq!((r.hub_nodes, r.disrupting), (2, 1));
        assert_eq!(r.price_per_hour, "0.1834");
        assert_eq!(r.replica.as_deref(), Some("hub-0"));
    }

    #[test]
    fn an_unsynced_cluster_reports_no_node_or_pod_count_rather_than_zero() {
        let s = Seen { phase: "Unreachable", message: "dial failed", synced: None, ..seen() };
        let r = report(&s, (3, 0), at(0));
        assert_eq!((r.nodes, r.pending_pods), (None, None));
        assert_eq!(r.message.as_deref(), Some("dial failed"));
        // The hub's own claims are known from the management cluster whatever the connection.
        assert_eq!(r.hub_nodes, 3);
    }

    #[test]
    fn a_report_is_written_on_change_and_refreshed_when_old() {
        let first = report(&seen(), (2, 0), at(0));
        assert!(due(None, &first));
        assert!(!due(Some(&first), &report(&seen(), (2, 0), at(60))), "nothing new a minute later");
        assert!(due(Some(&first), &report(&seen(), (3, 0), at(60))), "a new claim");
        let unreachable = Seen { phase: "Unreachable", synced: None, ..seen() };
        assert!(due(Some(&first), &report(&unreachable, (2, 0), at(60))), "a new phase");
        assert!(!due(Some(&first), &report(&seen(), (2, 0), at(899))), "nothing new within REFRESH");
        assert!(due(Some(&first), &report(&seen(), (2, 0), at(900))), "refreshed after REFRESH");
        // Prices that print the same are the same.
        let cheaper = Seen { eur_per_hour: 0.18341, ..seen() };
        assert!(!due(Some(&first), &report(&cheaper, (2, 0), at(60))));
        assert_eq!(price(std::iter::empty::<f64>().sum()), "0.0000", "an empty sum is -0.0");
    }

    #[test]
    fn a_report_is_stale_past_the_limit_only() {
        let r = report(&seen(), (0, 0), at(0));
        assert!(!is_stale(&r, at(2400)));
        assert!(is_stale(&r, at(2401)));
        // A clock behind the writer's is not a reason to distrust it.
        assert!(!is_stale(&r, at(-30)));
    }
}
