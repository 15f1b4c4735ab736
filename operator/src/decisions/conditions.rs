//! Status conditions the way Kubernetes and Karpenter keep them: one per type, and
//! `lastTransitionTime` moves only when the status does (so "Launched not True for 5 min" can be
//! measured from it).
//!
//! Owns: reading and setting conditions on a list. Must not: read the clock (time is passed in).

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use crds::common::Condition;

pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == TRUE)
}

pub fn is_false(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == FALSE)
}

/// Set a condition; returns whether anything changed. The message is cut to 300 characters (the
/// length Karpenter keeps) on a character boundary.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let message: String = message.chars().take(300).collect();
    // A reason must match `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`; an empty one is not allowed.
    let reason = if reason.is_empty() { type_.to_string() } else { reason.to_string() };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status == status
                && c.reason == reason
                && c.message == message
                && c.observed_generation == observed_generation
            {
                return false;
            }
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.to_string();
            c.reason = reason;
            c.message = message;
            c.observed_generation = observed_generation;
            true
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason,
                message,
                observed_generation,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// Set the root condition `root` (e.g. `Ready`): True when every other condition is True, else
/// False with the non-empty messages of those that are not. Returns whether it is True.
pub fn set_root(conditions: &mut Vec<Condition>, root: &str, observed_generation: Option<i64>, now: Timestamp) -> bool {
    set_root_except(conditions, root, &[], observed_generation, now)
}

/// [`set_root`] ignoring the `informational` condition types (they explain, they never block).
pub fn set_root_except(
    conditions: &mut Vec<Condition>,
    root: &str,
    informational: &[&str],
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let blocking: Vec<&Condition> = conditions
        .iter()
        .filter(|c| c.type_ != root && c.status != TRUE && !informational.contains(&c.type_.as_str()))
        .collect();
    let ready = blocking.is_empty();
    let why = blocking.iter().map(|c| c.message.as_str()).filter(|m| !m.is_empty()).collect::<Vec<_>>().join("; ");
    let (status, reason) = if ready { (TRUE, root.to_string()) } else { (FALSE, format!("Not{root}")) };
    set(conditions, root, status, &reason, &why, observed_generation, now);
    ready
}

/// Remove a condition; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// How long a condition has had its current status.
pub fn age(conditions: &[Condition], type_: &str, now: Timestamp) -> Option<std::time::Duration> {
    get(conditions, type_)
        .and_then(|c| std::time::Duration::try_from(now.duration_since(c.last_transition_time.0)).ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let t1 = Timestamp::from_second(1_800_000_060).unwrap();
        let mut c = Vec::new();
        assert!(set(&mut c, "Launched", UNKNOWN, "Pending", "", None, t0));
        assert!(!set(&mut c, "Launched", UNKNOWN, "Pending", "", None, t1));
        assert!(set(&mut c, "Launched", UNKNOWN, "LaunchFailed", "boom", None, t1));
        assert_eq!(c[0].last_transition_time.0, t0);
        assert!(set(&mut c, "Launched", TRUE, "Launched", "", None, t1));
        assert_eq!(c[0].last_transition_time.0, t1);
        assert_eq!(
            age(&c, "Launched", t1 + std::time::Duration::from_secs(5)),
            Some(std::time::Duration::from_secs(5))
        );
        assert!(is_true(&c, "Launched"));
        assert!(remove(&mut c, "Launched") && c.is_empty());
    }

    #[test]
    fn the_root_condition_is_true_only_when_every_other_is() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let mut c = Vec::new();
        set(&mut c, "A", TRUE, "A", "", None, t0);
        set(&mut c, "B", FALSE, "Broken", "b is broken", None, t0);
        set(&mut c, "C", UNKNOWN, "Waiting", "", None, t0);
        assert!(!set_root(&mut c, "Ready", None, t0));
        let ready = get(&c, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str(), ready.message.as_str()),
            (FALSE, "NotReady", "b is broken")
        );
        set(&mut c, "B", TRUE, "B", "", None, t0);
        set(&mut c, "C", TRUE, "C", "", None, t0);
        assert!(set_root(&mut c, "Ready", None, t0));
        assert_eq!(get(&c, "Ready").unwrap().reason, "Ready");
    }

    #[test]
    fn long_messages_are_cut_and_empty_reasons_replaced() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let mut c = Vec::new();
        set(&mut c, "Launched", UNKNOWN, "", &"é".repeat(400), None, t0);
        assert_eq!(c[0].message.chars().count(), 300);
        assert_eq!(c[0].reason, "Launched");
    }
}
