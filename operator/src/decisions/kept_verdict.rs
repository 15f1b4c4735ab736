//! Whether a per-cluster loop may keep its last verdict instead of rebuilding the cluster's view
//! and deciding again (issue 30: the disruption loop rebuilt every cluster's full view every pass):
//! only while nothing it reads has changed (the caller's `inputs`, compared whole) and no change
//! time alone brings is due (the view's own next change, e.g. a budget's schedule opening), and
//! never for longer than [`MAX_AGE`] (upstream's consolidated state expires so, and a candidate's
//! cost drifts slowly with its age).
//!
//! Owns: that rule. Must not: say what the inputs are (the controller does), read a clock or a
//! cache.

use std::time::Duration;

use jiff::Timestamp;

/// The longest a verdict is kept with nothing changing.
pub const MAX_AGE: Duration = Duration::from_secs(300);

/// A verdict reached over `inputs` at some instant, good until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept<I> {
    inputs: I,
    until: Timestamp,
}

impl<I: PartialEq> Kept<I> {
    /// The verdict reached at `now` over `inputs`, whose view announced `next_change` (the first
    /// instant time alone may change it; `None`: never).
    pub fn new(inputs: I, now: Timestamp, next_change: Option<Timestamp>) -> Self {
        let cap = now.checked_add(MAX_AGE).unwrap_or(now);
        Kept { inputs, until: next_change.map_or(cap, |at| at.min(cap)) }
    }

    /// Whether the verdict still stands at `now` for `inputs`.
    pub fn holds(&self, inputs: &I, now: Timestamp) -> bool {
        self.inputs == *inputs && now < self.until
    }

    /// How long from `now` until it stops standing by time alone.
    pub fn left(&self, now: Timestamp) -> Duration {
        Duration::try_from(self.until.duration_since(now)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn a_verdict_stands_until_an_input_changes_its_next_change_or_its_age_limit() {
        let k = Kept::new(7u64, t(0), Some(t(60)));
        assert!(k.holds(&7, t(0)) && k.holds(&7, t(59)));
        assert!(!k.holds(&8, t(1)), "an input changed");
        assert!(!k.holds(&7, t(60)), "the view's own change is due");
        assert_eq!(k.left(t(20)), Duration::from_secs(40));
        assert_eq!(k.left(t(90)), Duration::ZERO);
        let never = Kept::new(7u64, t(0), None);
        assert!(never.holds(&7, t(299)) && !never.holds(&7, t(300)), "looked at again after MAX_AGE");
        let far = Kept::new(7u64, t(0), Some(t(10_000)));
        assert!(!far.holds(&7, t(300)), "MAX_AGE caps a far change");
        let past = Kept::new(7u64, t(0), Some(t(0)));
        assert!(!past.holds(&7, t(0)), "a change due now keeps nothing");
    }
}
