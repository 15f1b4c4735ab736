//! Fault injection and request counters of one emulator instance.
//!
//! Owns: the fault settings a test turns on ([`Faults`]: failing a share of requests, 409
//! conflicts on writes, latency and slow responses, dropping and expiring watch streams,
//! unreachability, expired credentials), the seeded draws that decide each one, the count of what
//! was injected by kind, and the per-verb, per-resource request counts ([`Requests`]). Must not do:
//! request handling itself; the server consults these and words each fault as kube-apiserver does.

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

/// Request header that exempts a request from the injected faults (errors, conflicts, latency,
/// slow responses, watch churn) — not from unreachability, the black hole or expired credentials,
/// which are the cluster's state. For a test's own observers; kube-apiserver ignores the header.
pub const FAULT_EXEMPT_HEADER: &str = "x-sim-fault-exempt";

/// Makes the clients built from `config` exempt from injected faults ([`FAULT_EXEMPT_HEADER`]).
pub fn exempt_from_faults(config: &mut kube::Config) {
    config
        .headers
        .push((axum::http::HeaderName::from_static(FAULT_EXEMPT_HEADER), axum::http::HeaderValue::from_static("true")));
}

/// 409s on writes: a share of the writes to matching resources that would have succeeded get the
/// 409 a real server answers to a write that lost a race. An update, patch or delete (of the object
/// or its `status`/`scale`) of an existing object is refused unapplied with `Conflict` ("the object
/// has been modified; please apply your changes to the latest version and try again"). A create
/// of a named object is stored and then answered `AlreadyExists`, as a client sees when it retries a
/// create whose first answer was lost. Writes of a missing object (404), creates with
/// `generateName`, other subresources (eviction, binding) and dry runs are never touched.
#[derive(Clone, Debug)]
pub struct ConflictFault {
    /// Share of eligible writes answered 409, in `[0, 1]`.
    pub rate: f64,
    /// Only these resources (`nodegroups`, `nodeclaims`, …); all when empty.
    pub resources: Vec<String>,
}

/// Slow responses: a share of requests waits a seeded random time in `[min, max]` before it is
/// handled (on top of [`Faults::set_latency`]).
#[derive(Clone, Debug)]
pub struct SlowFault {
    /// Share of requests delayed, in `[0, 1]`.
    pub rate: f64,
    /// Shortest delay.
    pub min: Duration,
    /// Longest delay.
    pub max: Duration,
}

/// Watch churn: every watch stream ends after a seeded random lifetime in `[min_life, max_life]`.
/// A share `expired_share` of those ends is an expiry as after an etcd compaction: the stream gets
/// an `ERROR` event `410 Expired` ("The resourceVersion for the provided watch is too old.") and
/// every later watch from an older resourceVersion gets `410 Expired` ("too old resource version"),
/// so clients must relist. The other ends are clean, as when a connection or an apiserver goes
/// away: clients re-watch from their last resourceVersion.
#[derive(Clone, Debug)]
pub struct WatchChurn {
    /// Shortest stream lifetime.
    pub min_life: Duration,
    /// Longest stream lifetime.
    pub max_life: Duration,
    /// Share of stream ends that are expiries (410), in `[0, 1]`.
    pub expired_share: f64,
}

/// What was injected, by kind (the keys of [`Faults::injected_by_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// An injected error status (500, 503, 429, …).
    Error(u16),
    /// `409 Conflict` on an update, patch or delete.
    Conflict,
    /// `409 AlreadyExists` on a create that was stored.
    AlreadyExists,
    /// A slow response.
    Slow,
    /// A watch stream ended cleanly ([`Faults::drop_watches`] or churn).
    WatchDropped,
    /// A watch stream ended with `410 Expired` ([`Faults::expire_watches`] or churn).
    WatchExpired,
    /// A watch request refused with `410 Expired` because an injected expiry compacted its
    /// resourceVersion away.
    WatchRefusedExpired,
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultKind::Error(c) => write!(f, "{c}"),
            FaultKind::Conflict => f.write_str("409 Conflict"),
            FaultKind::AlreadyExists => f.write_str("409 AlreadyExists"),
            FaultKind::Slow => f.write_str("slow"),
            FaultKind::WatchDropped => f.write_str("watch dropped"),
            FaultKind::WatchExpired => f.write_str("watch expired (410)"),
            FaultKind::WatchRefusedExpired => f.write_str("re-watch refused (410)"),
        }
    }
}

/// How a watch stream's injected end looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchEnd {
    Clean,
    Expired,
}

#[derive(Debug)]
pub(crate) struct FaultState {
    errors: Mutex<Vec<ErrorFault>>,
    conflict: Mutex<Option<ConflictFault>>,
    slow: Mutex<Option<SlowFault>>,
    churn: Mutex<Option<WatchChurn>>,
    rng: Mutex<SeededRng>,
    latency_us: AtomicU64,
    unauthorized: AtomicBool,
    /// `true` while the cluster is unreachable; connections watch it and drop.
    pub(crate) unreachable: tokio::sync::watch::Sender<bool>,
    /// `true` while requests are accepted but never answered.
    pub(crate) blackhole: tokio::sync::watch::Sender<bool>,
    /// Bumped to end every open watch stream.
    pub(crate) watch_drops: tokio::sync::watch::Sender<u64>,
    /// Bumped to expire every open watch stream (410).
    pub(crate) watch_expiries: tokio::sync::watch::Sender<u64>,
    /// Watches from a resourceVersion below this one get 410 (an injected compaction).
    expired_below: AtomicU64,
    injected: AtomicU64,
    by_kind: Mutex<BTreeMap<FaultKind, u64>>,
}

impl FaultState {
    pub(crate) fn new(seed: u64) -> FaultState {
        FaultState {
            errors: Mutex::new(Vec::new()),
            conflict: Mutex::new(None),
            slow: Mutex::new(None),
            churn: Mutex::new(None),
            rng: Mutex::new(SeededRng::new(seed ^ 0xFA17)),
            latency_us: AtomicU64::new(0),
            unauthorized: AtomicBool::new(false),
            unreachable: tokio::sync::watch::Sender::new(false),
            blackhole: tokio::sync::watch::Sender::new(false),
            watch_drops: tokio::sync::watch::Sender::new(0),
            watch_expiries: tokio::sync::watch::Sender::new(0),
            expired_below: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            by_kind: Mutex::new(BTreeMap::new()),
        }
    }

    fn roll(&self) -> f64 {
        lock(&self.rng).next_f64()
    }

    pub(crate) fn record(&self, kind: FaultKind) {
        *lock(&self.by_kind).entry(kind).or_insert(0) += 1;
    }

    /// The status to fail this request with, if a fault says so (the first matching fault whose
    /// draw hits).
    pub(crate) fn injected_error(&self, verb: &str, resource: &str) -> Option<u16> {
        let faults = lock(&self.errors).clone();
        for fault in faults.iter().filter(|f| f.matches(verb, resource)) {
            if self.roll() < fault.rate {
                self.injected.fetch_add(1, Ordering::Relaxed);
                self.record(FaultKind::Error(fault.status));
                return Some(fault.status);
            }
        }
        None
    }

    /// Whether this eligible write to `resource` gets a 409 (`create`: AlreadyExists after storing
    /// it; other verbs: Conflict, unapplied). The caller checks eligibility ([`ConflictFault`]).
    pub(crate) fn injected_conflict(&self, verb: &str, resource: &str) -> bool {
        let Some(fault) = lock(&self.conflict).clone() else { return false };
        if !(fault.resources.is_empty() || fault.resources.iter().any(|r| r == resource)) {
            return false;
        }
        let hit = self.roll() < fault.rate;
        if hit {
            self.record(if verb == "create" { FaultKind::AlreadyExists } else { FaultKind::Conflict });
        }
        hit
    }

    /// How long this request is held back by a slow-response fault, if at all.
    pub(crate) fn slow_delay(&self) -> Option<Duration> {
        let fault = lock(&self.slow).clone()?;
        if self.roll() >= fault.rate {
            return None;
        }
        self.record(FaultKind::Slow);
        let span = fault.max.saturating_sub(fault.min);
        Some(fault.min + span.mul_f64(self.roll()))
    }

    /// The injected end of a new watch stream under churn: after how long, and how.
    pub(crate) fn watch_end(&self) -> Option<(Duration, WatchEnd)> {
        let churn = lock(&self.churn).clone()?;
        let span = churn.max_life.saturating_sub(churn.min_life);
        let life = churn.min_life + span.mul_f64(self.roll());
        let end = if self.roll() < churn.expired_share { WatchEnd::Expired } else { WatchEnd::Clean };
        Some((life, end))
    }

    /// Records an expiry at resourceVersion `rv`: later watches from before it get 410.
    pub(crate) fn expire_below(&self, rv: u64) {
        self.expired_below.fetch_max(rv, Ordering::Relaxed);
    }

    /// The oldest resourceVersion a watch may start from, when a watch from `rv` falls before an
    /// injected expiry.
    pub(crate) fn expired(&self, rv: u64) -> Option<u64> {
        let below = self.expired_below.load(Ordering::Relaxed);
        (rv < below).then_some(below)
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

    /// Fails matching requests as `fault` says (replacing any other error fault).
    pub fn set_error(&self, fault: ErrorFault) {
        self.set_errors(vec![fault]);
    }

    /// Several error faults at once (say 5xx and 429): each matching one draws in turn, the first
    /// hit answers.
    pub fn set_errors(&self, faults: Vec<ErrorFault>) {
        *lock(&self.state.errors) = faults;
    }

    /// Stops failing requests.
    pub fn clear_errors(&self) {
        lock(&self.state.errors).clear();
    }

    /// Number of requests failed by an injected error status so far (not conflicts).
    pub fn injected_errors(&self) -> u64 {
        self.state.injected.load(Ordering::Relaxed)
    }

    /// Everything injected so far, by kind (kinds never injected are absent).
    pub fn injected_by_kind(&self) -> BTreeMap<FaultKind, u64> {
        lock(&self.state.by_kind).clone()
    }

    /// Answers a share of writes with 409 as `fault` says (`None`: no more conflicts).
    pub fn set_conflicts(&self, fault: Option<ConflictFault>) {
        *lock(&self.state.conflict) = fault;
    }

    /// Holds a share of requests back as `fault` says (`None`: no more slow responses).
    pub fn set_slow(&self, fault: Option<SlowFault>) {
        *lock(&self.state.slow) = fault;
    }

    /// Ends watch streams after a seeded lifetime as `churn` says (`None`: streams live until the
    /// client's timeout). Applies to streams opened from now on.
    pub fn set_watch_churn(&self, churn: Option<WatchChurn>) {
        *lock(&self.state.churn) = churn;
    }

    /// Expires every open watch stream now, as an etcd compaction does: each gets an `ERROR` event
    /// `410 Expired` and ends, and a watch from any resourceVersion before now gets `410` too, so
    /// clients relist.
    pub fn expire_watches(&self) {
        self.state.watch_expiries.send_modify(|n| *n += 1);
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

    /// Clears every fault (errors, conflicts, latency, slow responses, watch churn,
    /// unreachability, black hole, expired credentials). Expiries already injected stay (a
    /// compaction is not undone).
    pub fn clear(&self) {
        self.clear_errors();
        self.set_conflicts(None);
        self.set_slow(None);
        self.set_watch_churn(None);
        self.set_latency(Duration::ZERO);
        self.set_unreachable(false);
        self.set_blackhole(false);
        self.restore_credentials();
    }
}

/// Request counts by verb and resource (`pods`, `pods/eviction`, `nodegroups`; `""` for
/// non-resource paths such as discovery), also by the client's `User-Agent` (`""` when it sends
/// none), so a test can tell the traffic of the client under test from its own and the simulated
/// CKE's. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    counts: Arc<Mutex<Counts>>,
    by_agent: Arc<Mutex<BTreeMap<String, Counts>>>,
    /// The writes, in arrival order, up to [`MAX_WRITE_LOG`] (an audit log: who wrote, and when).
    writes: Arc<Mutex<std::collections::VecDeque<Written>>>,
}

/// One write request as the audit log keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// Wall-clock arrival, milliseconds since the Unix epoch (comparable across processes).
    pub at_ms: u64,
    pub verb: String,
    pub resource: String,
    /// The client's `User-Agent` (`""` when it sends none).
    pub agent: String,
}

/// Writes an audit log keeps (the oldest are dropped past it).
pub const MAX_WRITE_LOG: usize = 100_000;

/// Counts by (verb, resource).
type Counts = BTreeMap<(String, String), u64>;

/// The verbs that write.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

impl Requests {
    pub(crate) fn record(&self, verb: &str, resource: &str, agent: &str) {
        if WRITE_VERBS.contains(&verb) {
            let at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let mut log = lock(&self.writes);
            if log.len() >= MAX_WRITE_LOG {
                log.pop_front();
            }
            log.push_back(Written {
                at_ms,
                verb: verb.to_string(),
                resource: resource.to_string(),
                agent: agent.to_string(),
            });
        }
        let key = (verb.to_string(), resource.to_string());
        *lock(&self.by_agent).entry(agent.to_string()).or_default().entry(key.clone()).or_insert(0) += 1;
        *lock(&self.counts).entry(key).or_insert(0) += 1;
    }

    /// [`Requests::snapshot`] of the requests whose `User-Agent` starts with `prefix`.
    pub fn snapshot_of(&self, prefix: &str) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for (_, counts) in lock(&self.by_agent).iter().filter(|(agent, _)| agent.starts_with(prefix)) {
            for (key, n) in counts {
                *out.entry(key.clone()).or_insert(0) += n;
            }
        }
        out
    }

    /// The user agents seen, each with its number of requests.
    pub fn agents(&self) -> BTreeMap<String, u64> {
        lock(&self.by_agent).iter().map(|(agent, counts)| (agent.clone(), counts.values().sum())).collect()
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

    /// The audit log: every write since the start (or the last reset), oldest first.
    pub fn written(&self) -> Vec<Written> {
        lock(&self.writes).iter().cloned().collect()
    }

    /// Resets every count to zero and empties the audit log.
    pub fn reset(&self) {
        lock(&self.counts).clear();
        lock(&self.by_agent).clear();
        lock(&self.writes).clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn requests_are_counted_in_all_and_by_user_agent_prefix() {
        let r = Requests::default();
        r.record("list", "nodegroups", "karpenter-hub/0.1.0");
        r.record("list", "nodegroups", "");
        r.record("create", "nodegroups", "karpenter-hub/0.1.0");
        assert_eq!(r.count("list", "nodegroups"), 2);
        let hub = r.snapshot_of("karpenter-hub/");
        assert_eq!(hub.get(&("list".into(), "nodegroups".into())), Some(&1));
        assert_eq!(hub.get(&("create".into(), "nodegroups".into())), Some(&1));
        assert_eq!(r.agents(), BTreeMap::from([(String::new(), 1), ("karpenter-hub/0.1.0".into(), 2)]));
        // The audit log: the write only, with its agent.
        let log = r.written();
        assert_eq!(log.len(), 1);
        assert_eq!((log[0].verb.as_str(), log[0].agent.as_str()), ("create", "karpenter-hub/0.1.0"));
        assert!(log[0].at_ms > 1_700_000_000_000);
        r.reset();
        assert!(r.snapshot_of("").is_empty() && r.agents().is_empty() && r.written().is_empty());
    }
}
