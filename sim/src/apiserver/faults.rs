//! Fault injection and request counters of one emulator instance.
//!
//! Owns: the fault settings a test turns on ([`Faults`]: failing a share of requests, latency,
//! dropping watch streams, unreachability, expired credentials) and the per-verb, per-resource
//! request counts ([`Requests`]). Must not do: request handling itself; the server consults these.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::SeededRng;

use super::lock;

/// Which requests an injected error applies to, and how often.
#[derive(Clone, Debug)]
pub struct ErrorFault {
    /// Share of matching requests that fail, in `[0, 1]`.
    pub rate: f64,
    /// HTTP status of the failure: 500 (InternalError), 503 (ServiceUnavailable), 429
    /// (TooManyRequests, with `Retry-After: 1`), or any other code (reported as InternalError).
    pub status: u16,
    /// Only these verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); all when empty.
    pub verbs: Vec<String>,
    /// Only these resources (`pods`, `nodegroups`, `pods/eviction`); all when empty.
    pub resources: Vec<String>,
}

impl ErrorFault {
    /// Every request fails with `status` at `rate`.
    pub fn all(rate: f64, status: u16) -> ErrorFault {
        ErrorFault { rate, status, verbs: Vec::new(), resources: Vec::new() }
    }

    fn matches(&self, verb: &str, resource: &str) -> bool {
        (self.verbs.is_empty() || self.verbs.iter().any(|v| v == verb))
            && (self.resources.is_empty() || self.resources.iter().any(|r| r == resource))
    }
}

#[derive(Debug)]
pub(crate) struct FaultState {
    error: Mutex<Option<ErrorFault>>,
    rng: Mutex<SeededRng>,
    latency_us: AtomicU64,
    unauthorized: AtomicBool,
    /// `true` while the cluster is unreachable; connections watch it and drop.
    pub(crate) unreachable: tokio::sync::watch::Sender<bool>,
    /// `true` while requests are accepted but never answered.
    pub(crate) blackhole: tokio::sync::watch::Sender<bool>,
    /// Bumped to end every open watch stream.
    pub(crate) watch_drops: tokio::sync::watch::Sender<u64>,
    injected: AtomicU64,
}

impl FaultState {
    pub(crate) fn new(seed: u64) -> FaultState {
        FaultState {
            error: Mutex::new(None),
            rng: Mutex::new(SeededRng::new(seed ^ 0xFA17)),
            latency_us: AtomicU64::new(0),
            unauthorized: AtomicBool::new(false),
            unreachable: tokio::sync::watch::Sender::new(false),
            blackhole: tokio::sync::watch::Sender::new(false),
            watch_drops: tokio::sync::watch::Sender::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// The status to fail this request with, if a fault says so.
    pub(crate) fn injected_error(&self, verb: &str, resource: &str) -> Option<u16> {
        let fault = lock(&self.error).clone()?;
        if !fault.matches(verb, resource) {
            return None;
        }
        let roll = lock(&self.rng).next_f64();
        if roll < fault.rate {
            self.injected.fetch_add(1, Ordering::Relaxed);
            Some(fault.status)
        } else {
            None
        }
    }

    pub(crate) fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Relaxed))
    }

    pub(crate) fn unauthorized(&self) -> bool {
        self.unauthorized.load(Ordering::Relaxed)
    }
}

/// Handle to one emulator's faults. Cheap to clone; every setting takes effect at once.
#[derive(Clone, Debug)]
pub struct Faults {
    pub(crate) state: Arc<FaultState>,
}

impl Faults {
    /// Fails a share `rate` of all requests with `status` (500, 503 or 429).
    pub fn fail_requests(&self, rate: f64, status: u16) {
        self.set_error(ErrorFault::all(rate, status));
    }

    /// Fails matching requests as `fault` says.
    pub fn set_error(&self, fault: ErrorFault) {
        *lock(&self.state.error) = Some(fault);
    }

    /// Stops failing requests.
    pub fn clear_errors(&self) {
        *lock(&self.state.error) = None;
    }

    /// Number of requests failed by injection so far.
    pub fn injected_errors(&self) -> u64 {
        self.state.injected.load(Ordering::Relaxed)
    }

    /// Delays every request (and the start of every watch) by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.state.latency_us.store(d.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Ends every open watch stream now (cleanly, as when an apiserver restarts or a connection
    /// breaks); clients re-watch from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.state.watch_drops.send_modify(|n| *n += 1);
    }

    /// Makes the cluster unreachable (`true`: open connections are cut, new ones closed at once) or
    /// reachable again (`false`).
    pub fn set_unreachable(&self, unreachable: bool) {
        self.state.unreachable.send_replace(unreachable);
    }

    /// Requests are accepted but not answered while `true` (a black-holed network path or a hung
    /// apiserver): clients run into their own timeouts. Held requests proceed once cleared.
    pub fn set_blackhole(&self, on: bool) {
        self.state.blackhole.send_replace(on);
    }

    /// Whether the cluster is currently unreachable.
    pub fn is_unreachable(&self) -> bool {
        *self.state.unreachable.borrow()
    }

    /// Every request gets `401 Unauthorized` until [`Faults::restore_credentials`] (as when a token
    /// has expired or was revoked).
    pub fn expire_credentials(&self) {
        self.state.unauthorized.store(true, Ordering::Relaxed);
    }

    /// Accepts the cluster's tokens again.
    pub fn restore_credentials(&self) {
        self.state.unauthorized.store(false, Ordering::Relaxed);
    }

    /// Clears every fault (errors, latency, unreachability, black hole, expired credentials).
    pub fn clear(&self) {
        self.clear_errors();
        self.set_latency(Duration::ZERO);
        self.set_unreachable(false);
        self.set_blackhole(false);
        self.restore_credentials();
    }
}

/// Request counts by verb and resource (`pods`, `pods/eviction`, `nodegroups`; `""` for
/// non-resource paths such as discovery). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    counts: Arc<Mutex<BTreeMap<(String, String), u64>>>,
}

/// The verbs that write.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

impl Requests {
    pub(crate) fn record(&self, verb: &str, resource: &str) {
        *lock(&self.counts).entry((verb.to_string(), resource.to_string())).or_insert(0) += 1;
    }

    /// Requests with this verb on this resource.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        lock(&self.counts).get(&(verb.to_string(), resource.to_string())).copied().unwrap_or(0)
    }

    /// Requests with this verb on any resource.
    pub fn verb(&self, verb: &str) -> u64 {
        lock(&self.counts).iter().filter(|((v, _), _)| v == verb).map(|(_, n)| n).sum()
    }

    /// All writes (create, update, patch, delete, deletecollection).
    pub fn writes(&self) -> u64 {
        WRITE_VERBS.iter().map(|v| self.verb(v)).sum()
    }

    /// Every request counted.
    pub fn total(&self) -> u64 {
        lock(&self.counts).values().sum()
    }

    /// A copy of every count, keyed by (verb, resource).
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        lock(&self.counts).clone()
    }

    /// Resets every count to zero.
    pub fn reset(&self) {
        lock(&self.counts).clear();
    }
}
