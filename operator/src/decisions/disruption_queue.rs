//! The disruption orchestration queue (karpenter-semantics §4.13) as pure decisions: how a started
//! command is recorded on its candidate NodeClaims, and, from what the hub observes of its
//! candidates and replacements, what happens next (wait, delete the candidates, or roll back).
//!
//! The hub keeps the command on the candidates themselves (annotation [`COMMAND_ANNOTATION`]),
//! written before the replacements are created under the deterministic names it lists: a hub
//! restarted at any later point finds the command where it left it, waits for the same
//! replacements and deletes the same candidates — it neither loses nor repeats it. A crash between
//! the record and the creation leaves a replacement missing, which rolls the command back.
//!
//! Owns: the record's shape, the deterministic names (command id, replacement claims) and the
//! processing decision. Must not: do I/O, read the clock, or log.

use std::time::Duration;

/// Consolidation and emptiness commands wait this long by default (`--disruption-validation-seconds`),
/// then are validated again (§4.12).
pub const VALIDATION_DELAY: Duration = Duration::from_secs(15);

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crds::nodepool::DisruptionReason;

/// NodeClaim annotation: the disruption command the claim is a candidate of (JSON, [`Recorded`]).
pub const COMMAND_ANNOTATION: &str = "karpenter.clever-cloud.com/disruption-command";
/// NodeClaim annotation on a replacement: the id of the command it was launched for.
pub const REPLACES_ANNOTATION: &str = "karpenter.clever-cloud.com/disruption-replacement-for";

/// A command waits at least this long for its replacements (§4.13: `clamp(80 ms × queued, 10 min, 1 h)`).
pub const MIN_TIMEOUT: Duration = Duration::from_secs(600);
/// ... and at most this long.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// How often a command waiting on its replacements is looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// A started command, as recorded on each of its candidates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// Deterministic id ([`command_id`]).
    pub id: String,
    /// The method that decided it (`emptiness`, `drift`, ...).
    pub method: String,
    /// The budget reason it spends.
    pub reason: DisruptionReason,
    /// When it started (RFC 3339): the timeout counts from here.
    pub started: Time,
    /// Candidate NodeClaims.
    pub candidates: Vec<String>,
    /// Replacement NodeClaims, created right after this record is written.
    pub replacements: Vec<String>,
    /// Σ candidate prices − Σ replacement prices, EUR/h.
    pub savings_per_hour: f64,
}

impl Recorded {
    /// The record as an annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A record read back; `None` when the annotation is not one (written by hand): ignored.
    pub fn from_annotation(value: &str) -> Option<Recorded> {
        serde_json::from_str(value).ok()
    }

    /// The record among a claim's annotations, if it carries one that reads.
    pub fn on(annotations: &std::collections::BTreeMap<String, String>) -> Option<Recorded> {
        annotations.get(COMMAND_ANNOTATION).and_then(|v| Recorded::from_annotation(v))
    }

    /// A merge patch removing the record from a claim.
    pub fn removal() -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": {COMMAND_ANNOTATION: null}}})
    }

    /// How long the command may wait for its replacements, given how many commands are queued.
    pub fn timeout(queued: usize) -> Duration {
        let per = Duration::from_millis(80).saturating_mul(u32::try_from(queued).unwrap_or(u32::MAX));
        per.clamp(MIN_TIMEOUT, MAX_TIMEOUT)
    }
}

/// The id of a command: its method and its candidates' UIDs, hashed (a retried start after a lost
/// answer finds the same names).
pub fn command_id(method: &str, candidate_uids: &[&str]) -> String {
    let mut uids = candidate_uids.to_vec();
    uids.sort_unstable();
    let digest = Sha256::digest(format!("{method}/{}", uids.join(",")).as_bytes());
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// The name of the `index`-th replacement of command `id` in `pool` (at most 63 characters).
pub fn replacement_name(pool: &str, id: &str, index: usize) -> String {
    let digest = Sha256::digest(format!("{id}/{index}").as_bytes());
    let suffix: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    let mut name: String = pool.chars().take(63 - 8).collect();
    name.push_str("-r");
    name.push_str(&suffix[..5]);
    name
}

/// A candidate as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateState {
    pub name: String,
    /// The claim exists.
    pub exists: bool,
    /// The claim is being deleted.
    pub deleting: bool,
}

/// A replacement as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplacementState {
    pub name: String,
    /// The claim exists and is not being deleted.
    pub present: bool,
    /// `Initialized=True`.
    pub initialized: bool,
}

/// What to do with a started command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Replacements not all initialized yet: look again after `requeue`.
    Wait { why: String, requeue: Duration },
    /// Every replacement is initialized: delete these candidates (the termination drain follows).
    Delete { claims: Vec<String> },
    /// The command failed: remove the taint and the record from these candidates; replacements
    /// already made stay as ordinary capacity.
    RollBack { why: String, claims: Vec<String> },
    /// Every candidate is deleting or gone: nothing left to do.
    Done,
}

/// The next step of `command` at `now`, with `queued` commands in the cluster.
pub fn process(
    command: &Recorded,
    candidates: &[CandidateState],
    replacements: &[ReplacementState],
    queued: usize,
    now: Timestamp,
) -> Step {
    let left: Vec<String> = candidates.iter().filter(|c| c.exists && !c.deleting).map(|c| c.name.clone()).collect();
    if left.is_empty() {
        return Step::Done;
    }
    let observed = |name: &str| replacements.iter().find(|r| r.name == name);
    if let Some(gone) = command.replacements.iter().find(|r| !observed(r).is_some_and(|o| o.present)) {
        return Step::RollBack {
            why: format!("replacement NodeClaim {gone} is gone before it initialized (a failed launch or a deletion)"),
            claims: left,
        };
    }
    let waiting: Vec<&str> = command
        .replacements
        .iter()
        .filter(|r| !observed(r).is_some_and(|o| o.initialized))
        .map(String::as_str)
        .collect();
    if waiting.is_empty() {
        return Step::Delete { claims: left };
    }
    let timeout = Recorded::timeout(queued);
    let waited = Duration::try_from(now.duration_since(command.started.0)).unwrap_or_default();
    if waited > timeout {
        return Step::RollBack {
            why: format!("replacement {} not initialized within {} min", waiting.join(", "), timeout.as_secs() / 60),
            claims: left,
        };
    }
    Step::Wait { why: format!("waiting for replacement {} to initialize", waiting.join(", ")), requeue: POLL }
}

/// The replacements of an in-flight `command` that a view built from the cache would miss: those
/// `cached` does not hold. The record is written before the replacements are created, so for a
/// moment the cache can show the candidates leaving but not the claims that take their pods; a
/// command decided over that view would launch for those pods a second time. The next command
/// waits until this is empty (a replacement that never shows rolls its command back instead).
pub fn unseen_replacements(command: &Recorded, cached: impl Fn(&str) -> bool) -> Vec<&str> {
    command.replacements.iter().map(String::as_str).filter(|name| !cached(name)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn command(replacements: &[&str]) -> Recorded {
        Recorded {
            id: "abc".into(),
            method: "single-node consolidation".into(),
            reason: DisruptionReason::Underutilized,
            started: Time(t("2026-01-01T00:00:00Z")),
            candidates: vec!["a".into(), "b".into()],
            replacements: replacements.iter().map(|s| s.to_string()).collect(),
            savings_per_hour: 0.1,
        }
    }

    fn cand(name: &str, exists: bool, deleting: bool) -> CandidateState {
        CandidateState { name: name.into(), exists, deleting }
    }

    fn repl(name: &str, present: bool, initialized: bool) -> ReplacementState {
        ReplacementState { name: name.into(), present, initialized }
    }

    const NOW: &str = "2026-01-01T00:01:00Z";

    #[test]
    fn a_pure_delete_deletes_its_candidates_at_once() {
        let s = process(&command(&[]), &[cand("a", true, false), cand("b", true, false)], &[], 1, t(NOW));
        assert_eq!(s, Step::Delete { claims: vec!["a".into(), "b".into()] });
    }

    #[test]
    fn candidates_wait_for_every_replacement_to_initialize() {
        let c = [cand("a", true, false), cand("b", true, false)];
        let s = process(&command(&["r1", "r2"]), &c, &[repl("r1", true, true), repl("r2", true, false)], 1, t(NOW));
        assert!(
            matches!(s, Step::Wait { ref why, requeue } if why.contains("r2") && !why.contains("r1") && requeue == POLL),
            "{s:?}"
        );
        let s = process(&command(&["r1", "r2"]), &c, &[repl("r1", true, true), repl("r2", true, true)], 1, t(NOW));
        assert_eq!(s, Step::Delete { claims: vec!["a".into(), "b".into()] });
    }

    #[test]
    fn a_vanished_replacement_rolls_the_command_back() {
        let c = [cand("a", true, false), cand("b", true, false)];
        for observed in [vec![], vec![repl("r1", false, false)]] {
            let s = process(&command(&["r1"]), &c, &observed, 1, t(NOW));
            assert!(
                matches!(s, Step::RollBack { ref why, ref claims } if why.contains("r1") && claims.len() == 2),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_replacement_not_initialized_in_time_rolls_back_and_the_timeout_grows_with_the_queue() {
        let c = [cand("a", true, false)];
        let r = [repl("r1", true, false)];
        let s = process(&command(&["r1"]), &c, &r, 1, t("2026-01-01T00:09:59Z"));
        assert!(matches!(s, Step::Wait { .. }), "{s:?}");
        let s = process(&command(&["r1"]), &c, &r, 1, t("2026-01-01T00:10:01Z"));
        assert!(matches!(s, Step::RollBack { ref why, .. } if why.contains("10 min")), "{s:?}");
        assert_eq!(Recorded::timeout(0), MIN_TIMEOUT);
        assert_eq!(Recorded::timeout(10_000), Duration::from_secs(800));
        assert_eq!(Recorded::timeout(1_000_000), MAX_TIMEOUT);
    }

    #[test]
    fn deleting_or_gone_candidates_are_left_alone_and_all_gone_is_done() {
        let s = process(&command(&[]), &[cand("a", true, true), cand("b", true, false)], &[], 1, t(NOW));
        assert_eq!(s, Step::Delete { claims: vec!["b".into()] });
        let s = process(&command(&["r1"]), &[cand("a", false, false), cand("b", true, true)], &[], 1, t(NOW));
        assert_eq!(s, Step::Done, "nothing left to roll back or delete");
    }

    #[test]
    fn the_record_round_trips_and_a_hand_written_value_is_ignored() {
        let c = command(&["r1"]);
        assert_eq!(Recorded::from_annotation(&c.to_annotation()), Some(c));
        assert_eq!(Recorded::from_annotation("true"), None);
    }

    #[test]
    fn names_are_deterministic_and_valid() {
        assert_eq!(command_id("drift", &["u2", "u1"]), command_id("drift", &["u1", "u2"]));
        assert_ne!(command_id("drift", &["u1"]), command_id("emptiness", &["u1"]));
        let long = "p".repeat(80);
        let name = replacement_name(&long, "abc", 0);
        assert!(name.len() <= 63 && name.starts_with("ppp") && name.contains("-r"), "{name}");
        assert_eq!(name, replacement_name(&long, "abc", 0));
        assert_ne!(replacement_name("pool", "abc", 0), replacement_name("pool", "abc", 1));
    }

    #[test]
    fn the_next_command_waits_for_replacements_the_cache_does_not_show_yet() {
        let c = command(&["r1", "r2"]);
        assert_eq!(unseen_replacements(&c, |_| false), ["r1", "r2"], "recorded, nothing created yet");
        assert_eq!(unseen_replacements(&c, |n| n == "r1"), ["r2"]);
        assert!(unseen_replacements(&c, |_| true).is_empty());
        assert!(unseen_replacements(&command(&[]), |_| false).is_empty(), "a pure delete launches nothing");
    }
}
