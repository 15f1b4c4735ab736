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

/// How often pods still waiting are looked at again (upstream requeues every provisionable pod
/// every 10 s), and how long after a failed round.
pub const RESYNC: Duration = Duration::from_secs(10);

/// Which rounds run (B4): a pod that started waiting since the last round, or a change of what the
/// decision reads in the management cluster (`scope`), opens a window at once; pods a round already
/// saw are looked at again every [`RESYNC`] while they wait — what a round counted on (room on a
/// node, an in-flight claim) may have gone without any news the loop hears of (another pod took the
/// room, a nomination ran out), and upstream re-batches pending pods on that cadence too. A failed
/// or deferred round is retried at its time. Nothing waits: nothing runs.
#[derive(Debug, Clone, Default)]
pub struct Rounds {
    handled: HashSet<String>,
    scope: Option<u64>,
    retry_at: Option<Instant>,
    resync_at: Option<Instant>,
}

/// How a round ended, for [`Rounds::ran`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Decided (claims created or not).
    Done,
    /// Decided what could be, and look again at `until` even without news (CKE's creation
    /// back-off or a flavor's cool-down ends, the caches were not ready).
    Deferred { until: Instant },
    /// The round failed; retried after [`RESYNC`].
    Failed,
}

impl Rounds {
    /// What the loop sees now: the waiting pods and the management scope's counter. Triggers
    /// `batcher` for each piece of news, and for the periodic look at pods still waiting.
    pub fn offer(&mut self, batcher: &mut Batcher, pending: &HashSet<String>, scope: u64, now: Instant) {
        self.handled.retain(|u| pending.contains(u));
        if pending.is_empty() {
            // Nothing waits: nothing to retry or look at again.
            self.retry_at = None;
            self.resync_at = None;
            return;
        }
        for uid in pending {
            if !self.handled.contains(uid) {
                batcher.trigger(uid, now);
            }
        }
        let retry = self.retry_at.is_some_and(|t| now >= t);
        let scope_changed = self.scope != Some(scope);
        let resync = !self.handled.is_empty() && self.resync_at.is_some_and(|t| now >= t);
        if retry || scope_changed || resync {
            batcher.trigger(&format!("resync {scope}"), now);
        }
    }

    /// A round ran over `pending` (the set it was offered) at `scope`.
    pub fn ran(&mut self, pending: &HashSet<String>, scope: u64, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Done | Outcome::Deferred { .. } => {
                self.handled.extend(pending.iter().cloned());
                self.scope = Some(scope);
                // A deferred round names its next look; the periodic one waits for it.
                (self.retry_at, self.resync_at) = match outcome {
                    Outcome::Deferred { until } => (Some(until), None),
                    _ => (None, Some(now + RESYNC)),
                };
            }
            // Not handled: the pods open a window again at the next wake, or at the retry.
            Outcome::Failed => self.retry_at = Some(now + RESYNC),
        }
    }

    /// The hub's clock was moved forward (a test's manual clock): a round deferred until a time on
    /// that clock (a creation back-off or a cool-down ending) may be due, so the retry is due `now`.
    pub fn clock_moved(&mut self, now: Instant) {
        if let Some(at) = &mut self.retry_at {
            *at = (*at).min(now);
        }
    }

    /// When to look again without news: a retry, or the periodic look at pods still waiting.
    pub fn next_wake(&self, batcher: &Batcher) -> Option<Instant> {
        [batcher.deadline(), self.retry_at, self.resync_at.filter(|_| !self.handled.is_empty())]
            .into_iter()
            .flatten()
            .min()
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

    fn set(uids: &[&str]) -> HashSet<String> {
        uids.iter().map(|u| u.to_string()).collect()
    }

    /// Offer, and run the round if the window is due; returns whether a round ran.
    fn step(r: &mut Rounds, b: &mut Batcher, pending: &HashSet<String>, scope: u64, now: Instant) -> bool {
        r.offer(b, pending, scope, now);
        if b.is_due(now) {
            b.take();
            r.ran(pending, scope, Outcome::Done, now);
            true
        } else {
            false
        }
    }

    #[test]
    fn news_runs_a_round_at_once_and_waiting_pods_are_looked_at_every_resync() {
        let t0 = Instant::now();
        let (mut r, mut b) = (Rounds::default(), Batcher::default());
        assert!(!step(&mut r, &mut b, &set(&[]), 0, t0), "nothing waits");
        assert_eq!(r.next_wake(&b), None, "and nothing to wake for");
        assert!(!step(&mut r, &mut b, &set(&["a"]), 0, t0));
        assert!(step(&mut r, &mut b, &set(&["a"]), 0, ms(t0, 1000)), "the window closed");
        // The same pod still waits, nothing else changes: no round before RESYNC...
        assert_eq!(r.next_wake(&b), Some(ms(t0, 11_000)));
        for i in 1..10 {
            assert!(!step(&mut r, &mut b, &set(&["a"]), 0, ms(t0, 1000 + i * 1000)));
        }
        // ...then one (what the last round counted on may be gone), and again every RESYNC.
        assert!(!step(&mut r, &mut b, &set(&["a"]), 0, ms(t0, 11_000)), "the window opens");
        assert!(step(&mut r, &mut b, &set(&["a"]), 0, ms(t0, 12_000)));
        assert_eq!(r.next_wake(&b), Some(ms(t0, 22_000)));
        // A new pod: a round after the idle window, not at the next resync.
        assert!(!step(&mut r, &mut b, &set(&["a", "b"]), 0, ms(t0, 13_000)));
        assert!(step(&mut r, &mut b, &set(&["a", "b"]), 0, ms(t0, 14_000)));
        // A NodePool became ready (scope): a round for the pods still waiting.
        assert!(!step(&mut r, &mut b, &set(&["a", "b"]), 1, ms(t0, 15_000)));
        assert!(step(&mut r, &mut b, &set(&["a", "b"]), 1, ms(t0, 16_000)));
        // Nothing waits any more: no look again.
        assert!(!step(&mut r, &mut b, &set(&[]), 1, ms(t0, 17_000)));
        assert_eq!(r.next_wake(&b), None);
    }

    #[test]
    fn failed_and_deferred_rounds_are_retried_at_their_time_and_forgotten_when_nothing_waits() {
        let t0 = Instant::now();
        let (mut r, mut b) = (Rounds::default(), Batcher::default());
        let p = set(&["a"]);
        r.offer(&mut b, &p, 0, t0);
        b.take();
        r.ran(&p, 0, Outcome::Failed, ms(t0, 1000));
        assert_eq!(r.next_wake(&b), Some(ms(t0, 11_000)));
        assert!(!step(&mut r, &mut b, &p, 0, ms(t0, 10_999)));
        r.offer(&mut b, &p, 0, ms(t0, 11_000));
        assert!(b.deadline().is_some(), "the retry opens a window");
        b.take();
        r.ran(&p, 0, Outcome::Deferred { until: ms(t0, 60_000) }, ms(t0, 12_000));
        assert!(!step(&mut r, &mut b, &p, 0, ms(t0, 59_999)), "deferred: the pod is not news meanwhile");
        assert_eq!(b.deadline(), None);
        r.offer(&mut b, &p, 0, ms(t0, 60_000));
        assert!(b.deadline().is_some(), "looked at again when the back-off ends");
        b.take();
        r.offer(&mut b, &set(&[]), 0, ms(t0, 61_000));
        assert_eq!(r.next_wake(&b), None, "the pod went: no retry");
    }

    #[test]
    fn a_deferred_round_is_due_when_the_clock_is_moved_and_nothing_else_is() {
        let t0 = Instant::now();
        let (mut r, mut b) = (Rounds::default(), Batcher::default());
        let p = set(&["a"]);
        r.clock_moved(t0);
        assert_eq!(r.next_wake(&b), None, "no retry made up by a clock move");
        r.offer(&mut b, &p, 0, t0);
        b.take();
        r.ran(&p, 0, Outcome::Deferred { until: ms(t0, 60_000) }, ms(t0, 1000));
        assert!(!step(&mut r, &mut b, &p, 0, ms(t0, 2000)), "deferred");
        r.clock_moved(ms(t0, 3000));
        assert_eq!(r.next_wake(&b), Some(ms(t0, 3000)), "the back-off may have ended on the hub's clock");
        r.offer(&mut b, &p, 0, ms(t0, 3000));
        assert!(b.deadline().is_some(), "the retry opens a window");
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
