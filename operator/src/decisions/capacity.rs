//! What the hub remembers about a workload cluster's capacity on the CKE side (clever-cloud.md
//! §3.5): flavors in cool-down after a quota rejection or a vanish, and the cluster's creation
//! back-off. The organisation quota is invisible to the hub, so this memory is all it has to avoid
//! retrying a flavor CKE just refused.
//!
//! Owns: the state and its transitions, as plain data that serialises to JSON so the controller can
//! persist it in the management cluster and reload it after a restart or a leader change.
//! Must not: read the clock (time is passed in) or talk to any cluster.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crds::catalog::Flavor;

/// Tunables (hub flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a refused flavor is not offered (default 3 min).
    pub cooldown: Duration,
    /// First creation back-off after a rejection (default 60 s); doubles on each consecutive one.
    pub backoff: Duration,
    /// Longest back-off.
    pub max_backoff: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            cooldown: Duration::from_secs(180),
            backoff: Duration::from_secs(60),
            max_backoff: Duration::from_secs(600),
        }
    }
}

/// Which quota dimension a rejection exhausted, read best-effort from CKE's message (it is not a
/// contract: `Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Memory,
    Cpu,
    Unknown,
}

pub fn exhausted_dimension(message: &str) -> Dimension {
    let m = message.to_ascii_lowercase();
    if m.contains("ram") || m.contains("memory") {
        Dimension::Memory
    } else if m.contains("cpu") || m.contains("core") {
        Dimension::Cpu
    } else {
        Dimension::Unknown
    }
}

/// The persisted memory of one workload cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityState {
    /// Flavor → end of its cool-down.
    #[serde(default)]
    pub unavailable_until: BTreeMap<String, Timestamp>,
    /// No NodeGroup creation in this cluster before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_until: Option<Timestamp>,
    /// Rejections and vanishes since capacity was last freed (drives the back-off growth).
    #[serde(default)]
    pub consecutive_failures: u32,
    /// CKE's last refusal message, shown on conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message: Option<String>,
    /// Accepted NodeGroups whose node had registered, deleted while a cool-down or the back-off ran:
    /// when one of them is fully gone, capacity was freed (§3.5). Persisted, so a restart between
    /// the deletion and the disappearance does not forget it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub freeing: BTreeSet<String>,
}

impl CapacityState {
    /// CKE refused `flavor` for quota: cool it down with every flavor at least as large in the
    /// exhausted dimension, and back off creations in this cluster.
    pub fn record_rejection(&mut self, flavor: &str, message: &str, flavors: &[Flavor], now: Timestamp, p: Policy) {
        let until = now + signed(p.cooldown);
        let refused = flavors.iter().find(|f| f.name == flavor);
        let dim = exhausted_dimension(message);
        for f in flavors {
            let larger = match (refused, dim) {
                (Some(r), Dimension::Memory) => f.memory_ki >= r.memory_ki,
                (Some(r), Dimension::Cpu) => f.cpu >= r.cpu,
                (Some(r), Dimension::Unknown) => f.memory_ki >= r.memory_ki && f.cpu >= r.cpu,
                (None, _) => false,
            };
            if larger || f.name == flavor {
                self.cool_down(&f.name, until);
            }
        }
        self.cool_down(flavor, until);
        self.last_message = Some(message.to_string());
        self.fail(now, p);
    }

    /// An accepted group of `flavor` vanished before its node registered: same treatment as a
    /// rejection of that flavor alone.
    pub fn record_vanish(&mut self, flavor: &str, now: Timestamp, p: Policy) {
        self.cool_down(flavor, now + signed(p.cooldown));
        self.last_message = Some(format!("a NodeGroup of flavor {flavor} vanished after acceptance"));
        self.fail(now, p);
    }

    /// A previously accepted hub-owned group is fully gone: real capacity was freed, so everything
    /// may be tried again. (Deleting a *rejected* group frees nothing and must not call this.)
    /// Groups still [`freeing`](Self::freeing) are forgotten: nothing is left for them to clear.
    pub fn record_capacity_freed(&mut self) {
        self.unavailable_until.clear();
        self.backoff_until = None;
        self.consecutive_failures = 0;
        self.freeing.clear();
    }

    /// Whether a cool-down or the back-off runs at `now` (something an early clear would lift).
    pub fn restricted(&self, now: Timestamp) -> bool {
        self.unavailable(now).next().is_some() || self.backoff_remaining(now).is_some()
    }

    /// The hub is terminating the claim of `group`, an accepted group whose node registered (so not
    /// a vanish, and not a rejected group): `gone` when the group no longer exists, else it is
    /// still terminating. Gone: capacity is freed now if anything restricts launches. Terminating:
    /// remembered, if anything restricts launches, until [`group_gone`](Self::group_gone). Returns
    /// whether the state changed (only then is it written).
    pub fn group_released(&mut self, group: &str, gone: bool, now: Timestamp) -> bool {
        if !self.restricted(now) {
            return false;
        }
        if gone {
            self.record_capacity_freed();
        } else if !self.freeing.insert(group.to_string()) {
            return false;
        }
        true
    }

    /// `group` is no longer in the workload cluster: if it was [`freeing`](Self::freeing), capacity
    /// was freed. Returns whether the state changed.
    pub fn group_gone(&mut self, group: &str) -> bool {
        if !self.freeing.contains(group) {
            return false;
        }
        self.record_capacity_freed();
        true
    }

    pub fn is_available(&self, flavor: &str, now: Timestamp) -> bool {
        self.unavailable_until.get(flavor).is_none_or(|until| *until <= now)
    }

    /// Flavors in cool-down at `now`.
    pub fn unavailable(&self, now: Timestamp) -> impl Iterator<Item = &str> {
        self.unavailable_until.iter().filter(move |(_, u)| **u > now).map(|(f, _)| f.as_str())
    }

    /// How long until the next cool-down or back-off ends, if any is running.
    pub fn next_expiry(&self, now: Timestamp) -> Option<Duration> {
        self.unavailable_until
            .values()
            .chain(self.backoff_until.iter())
            .filter(|u| **u > now)
            .min()
            .and_then(|u| Duration::try_from(u.duration_since(now)).ok())
    }

    /// Creations fail fast until this instant, if any.
    pub fn backoff_remaining(&self, now: Timestamp) -> Option<Duration> {
        self.backoff_until.filter(|u| *u > now).and_then(|u| Duration::try_from(u.duration_since(now)).ok())
    }

    /// Drop expired entries (keeps the persisted object small). Returns whether anything changed.
    pub fn prune(&mut self, now: Timestamp) -> bool {
        let before = self.clone();
        self.unavailable_until.retain(|_, u| *u > now);
        if self.backoff_until.is_some_and(|u| u <= now) {
            self.backoff_until = None;
        }
        *self != before
    }

    fn cool_down(&mut self, flavor: &str, until: Timestamp) {
        let e = self.unavailable_until.entry(flavor.to_string()).or_insert(until);
        if *e < until {
            *e = until;
        }
    }

    fn fail(&mut self, now: Timestamp, p: Policy) {
        let exp = self.consecutive_failures.min(16);
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let backoff = p.backoff.saturating_mul(1u32 << exp).min(p.max_backoff);
        let until = now + signed(backoff);
        if self.backoff_until.is_none_or(|b| b < until) {
            self.backoff_until = Some(until);
        }
    }
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn flavors() -> Vec<Flavor> {
        crds::catalog::Catalog::builtin().flavors
    }

    const RAM: &str = "Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB";

    #[test]
    fn a_ram_rejection_cools_down_the_flavor_and_every_larger_one() {
        let mut s = CapacityState::default();
        s.record_rejection("M", RAM, &flavors(), t(0), Policy::default());
        let mut down: Vec<_> = s.unavailable(t(1)).collect();
        down.sort();
        assert_eq!(down, ["L", "M", "XL"]);
        assert!(s.is_available("S", t(1)));
        assert!(!s.is_available("M", t(179)));
        assert!(s.is_available("M", t(180)), "cool-down lasts 3 minutes");
        assert_eq!(s.backoff_remaining(t(0)), Some(Duration::from_secs(60)));
        assert_eq!(s.last_message.as_deref(), Some(RAM));
    }

    #[test]
    fn the_backoff_grows_on_consecutive_failures_and_is_capped() {
        let mut s = CapacityState::default();
        let p = Policy::default();
        let mut seen = Vec::new();
        for i in 0..6 {
            s.record_vanish("S", t(i * 1000), p);
            seen.push(s.backoff_remaining(t(i * 1000)).unwrap().as_secs());
        }
        assert_eq!(seen, [60, 120, 240, 480, 600, 600]);
    }

    #[test]
    fn freed_capacity_clears_everything_and_prune_drops_expired_entries() {
        let mut s = CapacityState::default();
        s.record_rejection("XL", "Quota exceeded: vCPU", &flavors(), t(0), Policy::default());
        assert!(!s.is_available("XL", t(1)));
        assert!(s.is_available("S", t(1)), "a cpu rejection of XL leaves smaller flavors");
        let mut pruned = s.clone();
        assert!(pruned.prune(t(10_000)));
        assert!(pruned.unavailable_until.is_empty() && pruned.backoff_until.is_none());
        assert_eq!(pruned.consecutive_failures, 1, "pruning forgets dates, not the failure streak");
        s.record_capacity_freed();
        assert_eq!(s.backoff_remaining(t(1)), None);
        assert!(s.is_available("XL", t(1)));
    }

    #[test]
    fn a_registered_group_fully_gone_clears_the_backoff_and_a_rejected_or_unknown_one_does_not() {
        let p = Policy::default();
        let mut s = CapacityState::default();
        // Nothing restricts launches: nothing to remember, nothing written.
        assert!(!s.group_released("g1", false, t(0)));
        assert!(!s.group_released("g1", true, t(0)));
        assert!(s.freeing.is_empty());
        s.record_rejection("M", RAM, &flavors(), t(0), p);
        // Terminating: remembered once.
        assert!(s.group_released("g1", false, t(1)));
        assert!(!s.group_released("g1", false, t(2)), "the same group twice changes nothing");
        assert!(s.restricted(t(2)));
        // Another group going (a rejected one is never released; a vanished one never freeing) frees nothing.
        assert!(!s.group_gone("g2"));
        assert!(!s.is_available("M", t(3)));
        // The remembered group is gone: everything may be tried again.
        assert!(s.group_gone("g1"));
        assert!(s.is_available("M", t(3)) && s.backoff_remaining(t(3)).is_none() && s.freeing.is_empty());
        assert_eq!(s.consecutive_failures, 0);
        assert!(!s.group_gone("g1"), "idempotent");
        // Already gone when the claim's termination sees it: cleared at once.
        s.record_vanish("S", t(10), p);
        assert!(s.group_released("g3", true, t(11)));
        assert!(!s.restricted(t(11)));
        // After the restriction expired there is nothing to clear.
        s.record_vanish("S", t(20), p);
        assert!(!s.group_released("g4", false, t(20 + 600)));
    }

    #[test]
    fn state_survives_a_round_trip_through_json() {
        let mut s = CapacityState::default();
        s.record_rejection("2XS", RAM, &flavors(), t(5), Policy::default());
        s.group_released("g", false, t(6));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<CapacityState>(&json).unwrap(), s);
        assert_eq!(serde_json::from_str::<CapacityState>("{}").unwrap(), CapacityState::default());
    }

    #[test]
    fn message_dimensions() {
        assert_eq!(exhausted_dimension(RAM), Dimension::Memory);
        assert_eq!(exhausted_dimension("Quota exceeded: vCPU max"), Dimension::Cpu);
        assert_eq!(exhausted_dimension("nope"), Dimension::Unknown);
    }
}
