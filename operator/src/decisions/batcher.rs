//! The provisioning batch window (karpenter-semantics §3.1): pending pods arrive one watch event at a
//! time, but one scheduling round should see them together. A window opens at the first trigger and
//! closes when no *new* pod has arrived for `idle`, or `max` after it opened, whichever is first.
//! Re-triggers of pods already in the window never extend it (a pod re-checked every 10 s must not
//! hold a round back forever).
//!
//! Owns: the window arithmetic, with time passed in. Must not: sleep or read the clock; the caller
//! sleeps until [`Batcher::deadline`].

use std::{collections::HashSet, time::Duration};

use tokio::time::Instant;

/// Default idle window (`BATCH_IDLE_DURATION`).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);
/// Default longest window (`BATCH_MAX_DURATION`).
pub const DEFAULT_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    opened: Option<Instant>,
    last_new: Option<Instant>,
    seen: HashSet<String>,
}

impl Batcher {
    pub fn new(idle: Duration, max: Duration) -> Self {
        Self { idle, max, opened: None, last_new: None, seen: HashSet::new() }
    }

    /// A pod (or node) `key` asks for a round. Returns whether it was new to this window.
    pub fn trigger(&mut self, key: &str, now: Instant) -> bool {
        let opened = *self.opened.get_or_insert(now);
        if now < opened {
            return false;
        }
        if self.seen.insert(key.to_string()) {
            self.last_new = Some(now);
            true
        } else {
            false
        }
    }

    /// When the open window closes, if one is open.
    pub fn deadline(&self) -> Option<Instant> {
        let opened = self.opened?;
        let last = self.last_new.unwrap_or(opened);
        Some((last + self.idle).min(opened + self.max))
    }

    /// Whether the open window has closed at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// Close the window: the keys it saw, and a fresh window.
    pub fn take(&mut self) -> Vec<String> {
        self.opened = None;
        self.last_new = None;
        let mut keys: Vec<String> = self.seen.drain().collect();
        keys.sort();
        keys
    }
}

impl Default for Batcher {
    fn default() -> Self {
        Self::new(DEFAULT_IDLE, DEFAULT_MAX)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_window_closes_after_one_idle_second() {
        let t0 = Instant::now();
        let mut b = Batcher::default();
        assert_eq!(b.deadline(), None);
        assert!(b.trigger("a", t0));
        assert!(b.trigger("b", ms(t0, 500)));
        assert_eq!(b.deadline(), Some(ms(t0, 1500)));
        assert!(!b.is_due(ms(t0, 1499)));
        assert!(b.is_due(ms(t0, 1500)));
        assert_eq!(b.take(), ["a", "b"]);
        assert_eq!(b.deadline(), None);
    }

    #[test]
    fn known_pods_do_not_extend_the_window() {
        let t0 = Instant::now();
        let mut b = Batcher::default();
        b.trigger("a", t0);
        assert!(!b.trigger("a", ms(t0, 900)));
        assert_eq!(b.deadline(), Some(ms(t0, 1000)));
    }

    #[test]
    fn a_steady_stream_of_new_pods_is_cut_at_the_max_window() {
        let t0 = Instant::now();
        let mut b = Batcher::default();
        for i in 0..100 {
            b.trigger(&format!("p{i}"), ms(t0, i * 500));
        }
        assert_eq!(b.deadline(), Some(ms(t0, 10_000)));
    }
}
