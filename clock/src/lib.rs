//! `clock`: the time every decision of the hub is made at, and the time of the simulated world.
//! The operator and the emulators (`sim`) share this one type, so a test can run the hub and the
//! management API emulator on one manual clock.
//!
//! Owns: [`Clock`], either real (wall clock + `tokio::time::sleep`) or manual (time moves only when a
//! test calls [`Clock::advance`] / [`Clock::set`], sleepers wake when it passes their deadline, and
//! [`Clock::advances`] tells whoever re-decides on time that it moved).
//! Must not do: scheduling of work, randomness or anything else with side effects; it only tells
//! the time and waits for it. It depends on no crate of this workspace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

/// A clock: real or manual. Cheap to clone; clones share the same time.
#[derive(Clone, Debug)]
pub struct Clock {
    inner: Arc<Inner>,
    /// Bumped each time a manual clock moves, for [`Clock::advances`].
    ticks: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug)]
enum Inner {
    Real,
    Manual(Mutex<Manual>),
}

#[derive(Debug)]
struct Manual {
    now: DateTime<Utc>,
    /// Sleepers keyed by (deadline, sequence number).
    sleepers: BTreeMap<(DateTime<Utc>, u64), oneshot::Sender<()>>,
    seq: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::real()
    }
}

impl Clock {
    /// The wall clock.
    pub fn real() -> Clock {
        Clock { inner: Arc::new(Inner::Real), ticks: Arc::new(tokio::sync::watch::Sender::new(0)) }
    }

    /// A manual clock starting at `start`: time only moves with [`Clock::advance`] or [`Clock::set`].
    pub fn manual(start: DateTime<Utc>) -> Clock {
        Clock {
            inner: Arc::new(Inner::Manual(Mutex::new(Manual { now: start, sleepers: BTreeMap::new(), seq: 0 }))),
            ticks: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// A manual clock starting at the wall clock's current time: timestamps written by parts of a
    /// test world that run on the real clock stay close to it.
    pub fn manual_now() -> Clock {
        Clock::manual(Utc::now())
    }

    /// A manual clock starting at a fixed, arbitrary instant (2026-01-01T00:00:00Z), for deterministic tests.
    pub fn manual_default() -> Clock {
        Clock::manual(DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap_or_default())
    }

    /// Whether this clock is manual.
    pub fn is_manual(&self) -> bool {
        matches!(*self.inner, Inner::Manual(_))
    }

    /// The current time.
    pub fn now(&self) -> DateTime<Utc> {
        match &*self.inner {
            Inner::Real => Utc::now(),
            Inner::Manual(m) => lock(m).now,
        }
    }

    /// Waits until `d` has elapsed on this clock. With a manual clock this returns once the clock has
    /// been advanced past the deadline (immediately for a zero duration).
    pub async fn sleep(&self, d: Duration) {
        match &*self.inner {
            Inner::Real => tokio::time::sleep(d).await,
            Inner::Manual(m) => {
                let (rx, key) = {
                    let mut g = lock(m);
                    let deadline = g.now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
                    if deadline <= g.now {
                        return;
                    }
                    let (tx, rx) = oneshot::channel();
                    g.seq += 1;
                    let key = (deadline, g.seq);
                    g.sleepers.insert(key, tx);
                    (rx, key)
                };
                // A sleep given up (dropped by a `select!` that took another branch) stops counting
                // as a sleeper at once, rather than when the clock passes its deadline.
                let _unregister = Unregister { manual: m, key };
                // A dropped sender (clock dropped) also ends the wait.
                let _ = rx.await;
            }
        }
    }

    /// Waits until the clock reads `at` or later.
    pub async fn sleep_until(&self, at: DateTime<Utc>) {
        let now = self.now();
        if at > now {
            self.sleep((at - now).to_std().unwrap_or_default()).await;
        }
    }

    /// Moves a manual clock forward by `d`, waking every sleeper whose deadline has passed.
    /// No effect on a real clock.
    pub fn advance(&self, d: Duration) {
        if let Inner::Manual(m) = &*self.inner {
            let now = lock(m).now;
            self.set(now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX));
        }
    }

    /// Sets a manual clock to `t` (never backwards), waking every sleeper whose deadline has passed.
    /// No effect on a real clock.
    pub fn set(&self, t: DateTime<Utc>) {
        if let Inner::Manual(m) = &*self.inner {
            let mut g = lock(m);
            let moved = t > g.now;
            if moved {
                g.now = t;
            }
            let now = g.now;
            let later = g.sleepers.split_off(&(now, u64::MAX));
            let due = std::mem::replace(&mut g.sleepers, later);
            drop(g);
            for (_, tx) in due {
                let _ = tx.send(());
            }
            if moved {
                self.ticks.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// A stream that yields each time a manual clock moves forward (never for a real clock): lets a
    /// controller re-decide everything that depends on time when a test advances it.
    pub fn advances(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(
            self.ticks.subscribe(),
            |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) },
        )
    }

    /// Number of tasks currently sleeping on a manual clock (0 for a real clock): lets a test wait
    /// until the simulation is idle before advancing time.
    pub fn sleepers(&self) -> usize {
        match &*self.inner {
            Inner::Real => 0,
            Inner::Manual(m) => lock(m).sleepers.len(),
        }
    }

    /// The earliest deadline anyone sleeps until on a manual clock.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        match &*self.inner {
            Inner::Real => None,
            Inner::Manual(m) => lock(m).sleepers.keys().next().map(|(t, _)| *t),
        }
    }
}

/// Removes a manual sleeper's entry when its wait ends or is given up.
struct Unregister<'a> {
    manual: &'a Mutex<Manual>,
    key: (DateTime<Utc>, u64),
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        lock(self.manual).sleepers.remove(&self.key);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_sleep_wakes_only_when_advanced_past_deadline() {
        let clock = Clock::manual_default();
        let start = clock.now();
        let c = clock.clone();
        let task = tokio::spawn(async move {
            c.sleep(Duration::from_secs(10)).await;
            c.now()
        });
        // Wait (bounded) until the task is registered as a sleeper.
        for _ in 0..1000 {
            if clock.sleepers() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(clock.sleepers(), 1);
        clock.advance(Duration::from_secs(9));
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        clock.advance(Duration::from_secs(1));
        let woke = tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
        assert_eq!(woke - start, chrono::Duration::seconds(10));
        assert_eq!(clock.sleepers(), 0);
    }

    #[tokio::test]
    async fn a_sleep_given_up_is_no_longer_a_sleeper() {
        let clock = Clock::manual_default();
        let c = clock.clone();
        let task = tokio::spawn(async move { c.sleep(Duration::from_secs(10)).await });
        for _ in 0..1000 {
            if clock.sleepers() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(clock.sleepers(), 1);
        task.abort();
        let _ = task.await;
        assert_eq!(clock.sleepers(), 0);
        assert_eq!(clock.next_deadline(), None);
    }

    #[tokio::test]
    async fn zero_sleep_returns_immediately_and_set_never_goes_back() {
        let clock = Clock::manual_default();
        clock.sleep(Duration::ZERO).await;
        let t = clock.now();
        clock.set(t - chrono::Duration::seconds(5));
        assert_eq!(clock.now(), t);
    }
}
