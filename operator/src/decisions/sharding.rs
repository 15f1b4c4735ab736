//! Sharding workload clusters across hub replicas (hub.md §6), as pure functions: which live
//! replica should own a cluster (rendezvous hashing), what a replica does with one cluster's Lease
//! as it stands, which membership Leases are stale, and the Lease names.
//!
//! Owns: those rules. Must not: read a clock, the API or the environment (time and the Leases'
//! state are arguments), so every transition is a table test.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

/// A Lease as the decisions read it (holder and renewal), from a `coordination.k8s.io/v1` Lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseView {
    /// Empty or `None`: released.
    pub holder: Option<String>,
    /// `renewTime`, else `acquireTime`.
    pub renewed: Option<Timestamp>,
    /// `leaseDurationSeconds`.
    pub duration: Duration,
}

impl LeaseView {
    /// The holder while the Lease is live at `now`: held, and renewed less than its duration ago.
    /// A Lease without a renewal time is treated as expired: nobody can prove it is alive.
    pub fn live_holder(&self, now: Timestamp) -> Option<&str> {
        let holder = self.holder.as_deref().filter(|h| !h.is_empty())?;
        let renewed = self.renewed?;
        (renewed + self.duration.max(Duration::from_secs(1)) > now).then_some(holder)
    }

    /// How long the Lease has been expired at `now` (`None` while it is live or was never renewed).
    pub fn expired_for(&self, now: Timestamp) -> Option<Duration> {
        let renewed = self.renewed?;
        let end = renewed + self.duration.max(Duration::from_secs(1));
        (end <= now).then(|| Duration::try_from(now.duration_since(end)).unwrap_or_default())
    }
}

/// The weight of `member` for `cluster` in rendezvous (highest-random-weight) hashing: the first
/// 8 bytes of SHA-256 over both. SHA-256 rather than a process-seeded hasher because every replica
/// (of any build) must compute the same owner.
pub fn weight(cluster: &str, member: &str) -> u64 {
    // A NUL between the two: `("a", "bc")` and `("ab", "c")` must not hash alike.
    let digest = Sha256::digest(format!("{cluster}\0{member}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// The member that should own `cluster`: the highest weight, ties to the smaller identity (so the
/// answer never depends on the order `members` come in). `None` without members. Rendezvous
/// hashing moves only the clusters of a member that leaves, and only those a member that joins now
/// wins (about 1/n of the fleet), to or from that member alone.
pub fn desired_owner<'a>(cluster: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .map(|m| (weight(cluster, m), m.as_str()))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, m)| m)
}

/// What a replica does with one cluster's Lease this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Free (absent, released or expired) and ours by the hash: take it.
    Acquire,
    /// Ours and ours by the hash (or no live replica should have it instead): renew it.
    Renew,
    /// Ours, but `to` should own it and is live: stop acting on the cluster, then release the
    /// Lease so `to` can take it at once rather than after an expiry.
    Release { to: String },
    /// Another replica holds it live, or it is free and another live replica should take it.
    Leave { holder: Option<String> },
}

/// Why a [`Step`] was chosen, for the one log line per decision.
impl Step {
    pub fn why(&self) -> &'static str {
        match self {
            Step::Acquire => "the cluster's Lease is free or expired and this replica should own the cluster",
            Step::Renew => "this replica holds the cluster's Lease and should own the cluster",
            Step::Release { .. } => "another live replica should own the cluster: handing it over",
            Step::Leave { holder: Some(_) } => "another replica holds the cluster's Lease",
            Step::Leave { holder: None } => "the cluster's Lease is free but another live replica should own it",
        }
    }
}

/// Decide the step of replica `me` on one cluster's Lease (`None`: no Lease yet) at `now`, given
/// the cluster's desired owner over the live members. Pure.
pub fn step(lease: Option<&LeaseView>, me: &str, desired: Option<&str>, now: Timestamp) -> Step {
    let holder = lease.and_then(|l| l.live_holder(now));
    match holder {
        Some(h) if h == me => match desired {
            Some(d) if d != me => Step::Release { to: d.to_string() },
            // Ours by the hash, or nobody live to hand it to (our own membership is failing to
            // renew): keep it; the fence stops us if the cluster Lease itself cannot be renewed.
            _ => Step::Renew,
        },
        Some(h) => Step::Leave { holder: Some(h.to_string()) },
        None if desired == Some(me) => Step::Acquire,
        None => Step::Leave { holder: None },
    }
}

/// Whether a cluster Lease held by this replica must be fenced, `since_sent` after its last
/// successful renewal was sent: from the renew deadline on (before the Lease's expiry, so the
/// replica has stopped acting before any other may take the cluster). Pure.
pub fn overdue(since_sent: Duration, timings: Timings) -> bool {
    since_sent >= timings.renew_deadline
}

/// The order of one round's Lease writes, as indices into `since_sent` (per write: how long ago
/// the Lease's last successful renewal was sent, `None` when not held): held Leases first, the
/// longest unrenewed first, so one near its deadline never waits behind a hundred fresh ones;
/// then the others (acquisitions, hand-overs) in their given order. Pure.
pub fn renewal_order(since_sent: &[Option<Duration>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..since_sent.len()).collect();
    // Stable: equal ages and the unheld keep their given (key) order.
    order.sort_by(|a, b| match (since_sent[*a], since_sent[*b]) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    order
}

/// The live members at `now` from the membership Leases: the holders of live ones, sorted and
/// without repeats. Pure.
pub fn live_members<'a>(leases: impl IntoIterator<Item = &'a LeaseView>, now: Timestamp) -> Vec<String> {
    let mut out: Vec<String> = leases.into_iter().filter_map(|l| l.live_holder(now).map(str::to_string)).collect();
    out.sort();
    out.dedup();
    out
}

/// Whether a membership Lease is stale at `now`: released, or expired for longer than `grace`, so
/// a survivor may delete it. A replica coming back under the same identity (a restarted container
/// keeps its pod name and, usually, process id 1) renews it first, so the deletion's precondition
/// fails. Pure.
pub fn stale_member(lease: &LeaseView, now: Timestamp, grace: Duration) -> bool {
    if lease.holder.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    lease.expired_for(now).is_some_and(|d| d >= grace)
}

/// The shard Lease timings, validated (renew deadline < lease duration, retry period < renew
/// deadline), so a replica always stops acting on a cluster before another may take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Why shard timings were refused: names the flags and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error(
        "--shard-renew-deadline ({renew:?}) must be shorter than --shard-lease-duration ({lease:?}): a replica must stop acting on a cluster before its Lease expires and another replica may take it; lower the deadline or raise the duration"
    )]
    DeadlineNotBeforeExpiry { renew: Duration, lease: Duration },
    #[error(
        "--shard-retry-period ({retry:?}) must be shorter than --shard-renew-deadline ({renew:?}): otherwise one missed renewal already fences the cluster; lower the retry period or raise the deadline"
    )]
    RetryNotBeforeDeadline { retry: Duration, renew: Duration },
    #[error("--shard-lease-duration must be at least 1 s (Leases count whole seconds)")]
    TooShort,
}

impl Timings {
    /// Defaults: 30 s duration, 20 s renew deadline, 10 s retry period (docs/hub.md, "Sizing and
    /// scaling": one write per owned cluster per retry period; two tries before the fence).
    pub const DEFAULT: Timings = Timings {
        lease_duration: Duration::from_secs(30),
        renew_deadline: Duration::from_secs(20),
        retry_period: Duration::from_secs(10),
    };

    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingsError> {
        if lease_duration < Duration::from_secs(1) {
            return Err(TimingsError::TooShort);
        }
        if renew_deadline >= lease_duration {
            return Err(TimingsError::DeadlineNotBeforeExpiry { renew: renew_deadline, lease: lease_duration });
        }
        if retry_period >= renew_deadline {
            return Err(TimingsError::RetryNotBeforeDeadline { retry: retry_period, renew: renew_deadline });
        }
        Ok(Self { lease_duration, renew_deadline, retry_period })
    }

    /// Management writes per second spent renewing `owned` clusters (plus the membership Lease).
    pub fn renewal_writes_per_second(&self, owned: usize) -> f64 {
        (owned as f64 + 1.0) / self.retry_period.as_secs_f64()
    }
}

impl Default for Timings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// At most 63 characters (a label value and a DNS label), lowercase alphanumerics and `-`.
const MAX_NAME: usize = 63;

/// The name of cluster `namespace/cluster`'s Lease for hub `hub_id`: readable
/// `kh-<hub>-<namespace>-<cluster>` cut to fit, then always a hash of the three, so names differ
/// whenever the triple does (dashes inside names would make the readable part ambiguous). Pure.
pub fn cluster_lease_name(hub_id: &str, namespace: &str, cluster: &str) -> String {
    named(&format!("kh-{hub_id}-{namespace}-{cluster}"), &format!("cluster\0{hub_id}\0{namespace}\0{cluster}"))
}

/// The name of replica `identity`'s membership Lease for hub `hub_id`. Pure.
pub fn member_lease_name(hub_id: &str, identity: &str) -> String {
    named(&format!("kh-{hub_id}-member-{identity}"), &format!("member\0{hub_id}\0{identity}"))
}

fn named(readable: &str, unique: &str) -> String {
    let digest = Sha256::digest(unique.as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let mut base: String = readable
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(MAX_NAME - hash.len() - 1)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{hash}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const D: Duration = Duration::from_secs(30);

    fn t0() -> Timestamp {
        "2026-11-26T10:00:00Z".parse().unwrap()
    }

    fn held(by: &str, renewed_ago: u64) -> LeaseView {
        LeaseView { holder: Some(by.into()), renewed: Some(t0() - Duration::from_secs(renewed_ago)), duration: D }
    }

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("hub-{i}")).collect()
    }

    fn clusters(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("team-{}/cluster-{i}", i % 7)).collect()
    }

    #[test]
    fn steps_over_the_lease_and_the_desired_owner() {
        let now = t0();
        let released = LeaseView { holder: None, renewed: Some(now), duration: D };
        let never_renewed = LeaseView { holder: Some("b".into()), renewed: None, duration: D };
        let leave = |h: Option<&str>| Step::Leave { holder: h.map(str::to_string) };
        let table: Vec<(&str, Option<LeaseView>, Option<&str>, Step)> = vec![
            ("no lease, ours", None, Some("a"), Step::Acquire),
            ("no lease, theirs", None, Some("b"), leave(None)),
            ("released, ours", Some(released.clone()), Some("a"), Step::Acquire),
            ("released, theirs", Some(released), Some("b"), leave(None)),
            ("expired other, ours", Some(held("b", 31)), Some("a"), Step::Acquire),
            ("exactly expired, ours", Some(held("b", 30)), Some("a"), Step::Acquire),
            ("never renewed, ours", Some(never_renewed), Some("a"), Step::Acquire),
            ("live other, ours by hash", Some(held("b", 29)), Some("a"), leave(Some("b"))),
            ("live other, theirs", Some(held("b", 1)), Some("b"), leave(Some("b"))),
            ("live ours, ours", Some(held("a", 5)), Some("a"), Step::Renew),
            ("live ours, nobody live", Some(held("a", 5)), None, Step::Renew),
            ("live ours, another's", Some(held("a", 5)), Some("c"), Step::Release { to: "c".into() }),
            // Ours but expired (we were fenced meanwhile): like any free Lease.
            ("expired ours, ours", Some(held("a", 40)), Some("a"), Step::Acquire),
            ("expired ours, theirs", Some(held("a", 40)), Some("c"), leave(None)),
        ];
        for (what, lease, desired, want) in table {
            assert_eq!(step(lease.as_ref(), "a", desired, now), want, "{what}");
        }
    }

    #[test]
    fn a_held_lease_is_overdue_from_the_renew_deadline_on() {
        let ms = Duration::from_millis;
        let table = [(ms(0), false), (ms(19_999), false), (ms(20_000), true), (ms(29_000), true)];
        for (since_sent, want) in table {
            assert_eq!(overdue(since_sent, Timings::DEFAULT), want, "{since_sent:?}");
        }
    }

    #[test]
    fn renewals_go_oldest_first_then_the_unheld_in_their_order() {
        let s = |n: u64| Some(Duration::from_secs(n));
        // (case, time since each Lease was last renewed (None: not held), expected order)
        type Case = (&'static str, Vec<Option<Duration>>, Vec<usize>);
        let table: Vec<Case> = vec![
            ("nothing", vec![], vec![]),
            ("held only", vec![s(3), s(12), s(7)], vec![1, 2, 0]),
            ("unheld only: as given", vec![None, None, None], vec![0, 1, 2]),
            ("held before unheld", vec![None, s(1), None, s(19)], vec![3, 1, 0, 2]),
            ("ties keep their order", vec![s(5), None, s(5)], vec![0, 2, 1]),
        ];
        for (what, since, want) in table {
            assert_eq!(renewal_order(&since), want, "{what}");
        }
    }

    #[test]
    fn live_members_are_the_holders_of_live_membership_leases() {
        let now = t0();
        let leases =
            [held("b", 1), held("a", 29), held("c", 31), LeaseView { holder: None, renewed: Some(now), duration: D }];
        assert_eq!(live_members(&leases, now), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn a_membership_lease_is_stale_once_released_or_expired_past_the_grace() {
        let now = t0();
        let grace = Duration::from_secs(60);
        assert!(!stale_member(&held("a", 10), now, grace), "live");
        assert!(!stale_member(&held("a", 80), now, grace), "expired 50 s ago, within the grace");
        assert!(stale_member(&held("a", 90), now, grace), "expired 60 s ago");
        assert!(stale_member(&LeaseView { holder: Some(String::new()), ..held("a", 1) }, now, grace));
    }

    #[test]
    fn timings_refuse_a_deadline_at_or_past_the_expiry_and_name_the_flags() {
        let s = Duration::from_secs;
        assert_eq!(Timings::new(s(30), s(20), s(10)), Ok(Timings::DEFAULT));
        let e = Timings::new(s(30), s(30), s(5)).unwrap_err();
        assert!(e.to_string().contains("--shard-renew-deadline") && e.to_string().contains("--shard-lease-duration"));
        assert!(matches!(Timings::new(s(30), s(20), s(20)), Err(TimingsError::RetryNotBeforeDeadline { .. })));
        assert_eq!(Timings::new(Duration::from_millis(500), s(0), s(0)), Err(TimingsError::TooShort));
        // One write per owned cluster (and the membership Lease) per retry period.
        assert!((Timings::DEFAULT.renewal_writes_per_second(99) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn lease_names_are_dns_labels_distinct_and_stable() {
        let a = cluster_lease_name("default", "team-a", "prod");
        assert_eq!(a, cluster_lease_name("default", "team-a", "prod"), "deterministic");
        assert!(a.starts_with("kh-default-team-a-prod-"), "{a}");
        // The same readable part from different triples still differs.
        assert_ne!(cluster_lease_name("default", "team-a", "prod"), cluster_lease_name("default", "team", "a-prod"));
        assert_ne!(cluster_lease_name("a", "b", "c"), member_lease_name("a", "b-c"));
        let long = cluster_lease_name(&"h".repeat(63), &"n".repeat(63), &"c".repeat(63));
        let id = member_lease_name("default", "Karpenter_Hub-7d9f.x-1234");
        for n in [&a, &long, &id] {
            assert!(n.len() <= 63, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
            assert!(!n.starts_with('-') && !n.ends_with('-'), "{n}");
        }
    }

    #[test]
    fn the_desired_owner_does_not_depend_on_member_order_and_none_without_members() {
        let mut m = members(5);
        let before: Vec<String> = clusters(50).iter().map(|c| desired_owner(c, &m).unwrap().to_string()).collect();
        m.reverse();
        let after: Vec<String> = clusters(50).iter().map(|c| desired_owner(c, &m).unwrap().to_string()).collect();
        assert_eq!(before, after);
        assert_eq!(desired_owner("x/y", &[]), None);
    }

    #[test]
    fn thirty_clusters_over_three_replicas_are_spread() {
        // The fleet of operator/tests/suite/sharding.rs: every replica gets a share.
        let m = vec!["replica-0".to_string(), "replica-1".to_string(), "replica-2".to_string()];
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for i in 0..30 {
            *counts.entry(desired_owner(&format!("team-{i}/c-{i}"), &m).unwrap()).or_default() += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.values().all(|n| *n >= 4), "{counts:?}");
    }

    /// Within 5 standard deviations of a fair share of `total` over `n` (binomial): a bound a
    /// hash that spreads evenly meets, and a skewed one misses.
    fn fair(count: usize, total: usize, n: usize) -> bool {
        let p = 1.0 / n as f64;
        let mean = total as f64 * p;
        (count as f64 - mean).abs() <= 5.0 * (total as f64 * p * (1.0 - p)).sqrt()
    }

    /// Balance over many fleets (deterministic: the same fleets at every run, so the statistical
    /// bound cannot flake): every member gets a fair share of 1000 clusters.
    #[test]
    fn shares_are_balanced() {
        for n in 2..9 {
            for salt in 0..20 {
                let m: Vec<String> = (0..n).map(|i| format!("hub-{salt}-{i}")).collect();
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for c in 0..1000 {
                    *counts.entry(desired_owner(&format!("ns/c-{salt}-{c}"), &m).unwrap()).or_default() += 1;
                }
                assert_eq!(counts.len(), n, "a member with nothing: {counts:?}");
                for (member, count) in &counts {
                    assert!(fair(*count, 1000, n), "{member}: {count} of 1000 over {n} members");
                }
            }
        }
    }

    /// A member joining wins about 1/(n+1) of the clusters (deterministic fleets, as above).
    #[test]
    fn a_joining_member_takes_a_fair_share() {
        for n in 1..8 {
            for salt in 0..20 {
                let before: Vec<String> = (0..n).map(|i| format!("hub-{salt}-{i}")).collect();
                let mut after = before.clone();
                after.push(format!("hub-{salt}-new"));
                let moved = (0..600)
                    .map(|c| format!("ns/c-{salt}-{c}"))
                    .filter(|c| desired_owner(c, &before) != desired_owner(c, &after))
                    .count();
                assert!(fair(moved, 600, n + 1), "moved {moved} of 600 joining {n} members");
            }
        }
    }

    proptest! {
        /// Minimal movement, exactly: a member joining takes clusters only for itself (nothing
        /// moves between the others), and leaving again gives back exactly what it took.
        #[test]
        fn joining_or_leaving_moves_only_the_clusters_of_that_member(n in 1usize..8, salt in 0u32..100_000) {
            let before: Vec<String> = (0..n).map(|i| format!("hub-{salt}-{i}")).collect();
            let mut after = before.clone();
            let newcomer = format!("hub-{salt}-new");
            after.push(newcomer.clone());
            for c in (0..200).map(|c| format!("ns/c-{salt}-{c}")) {
                let (was, now) = (desired_owner(&c, &before).unwrap(), desired_owner(&c, &after).unwrap());
                if now != newcomer {
                    prop_assert_eq!(now, was, "a join moved {} between old members", c);
                }
            }
            // A member leaving (any of them) moves only its own clusters.
            let gone = &after[salt as usize % after.len()];
            let left: Vec<String> = after.iter().filter(|m| *m != gone).cloned().collect();
            for c in (0..200).map(|c| format!("ns/c-{salt}-{c}")) {
                let (was, now) = (desired_owner(&c, &after).unwrap(), desired_owner(&c, &left).unwrap());
                if was != gone.as_str() {
                    prop_assert_eq!(now, was, "{} leaving moved {}", gone, c);
                }
            }
        }
    }
}
