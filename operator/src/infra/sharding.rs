//! Sharded mode (hub.md §6, `karpenter-hub run --sharding`): workload clusters spread across hub
//! replicas, each cluster owned through a `coordination.k8s.io/v1` Lease of its own in the
//! management cluster; Kubernetes is the only coordination.
//!
//! Each replica heartbeats a membership Lease; the live members come from a label-selected watch of
//! the hub's Leases; [`crate::decisions::sharding`] says which member should own each registered
//! cluster and what to do with its Lease. Owning a cluster means holding an ownership token: the
//! registry runs the cluster's connection only under it, and the workload clients it builds refuse
//! every request once it is cancelled ([`crate::infra::fence::FenceLayer`]). A watchdog cancels the token when the
//! Lease could not be renewed within the renew deadline, which is shorter than the Lease duration:
//! the replica has stopped writing to the cluster before anyone else may take it.
//!
//! The protocol runs on an OS thread of its own with its own management client, so the clusters'
//! work saturating the hub's runtime cannot make the renewals late ([`Sharder::run`]).
//!
//! Owns: the Lease protocol of sharded mode (membership heartbeat, acquire, renew, hand over,
//! fence, deleting dead members' Leases), its thread, and the shard metrics. Must not: decide anything itself
//! (the decisions module does), act on a cluster without a live ownership token, or release a
//! cluster's Lease before its token is cancelled.

use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams, Preconditions},
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::sharding::{self, LeaseView, Step, Timings},
    infra::{apierror::plain, metrics::Metrics, registry::ClusterKey, registry::Registry},
};

/// Label on every shard Lease: the hub id (several hubs may share a namespace).
pub const HUB_LABEL: &str = crds::labels::HUB;
/// Label telling membership Leases (`member`) from cluster Leases (`cluster`).
pub const ROLE_LABEL: &str = "karpenter.clever-cloud.com/shard";
/// Annotation naming the cluster (`namespace/name`) a cluster Lease is for, for people.
pub const CLUSTER_ANNOTATION: &str = "karpenter.clever-cloud.com/cluster";

/// Settings of sharded mode.
#[derive(Clone)]
pub struct Settings {
    pub hub_id: String,
    /// Namespace of the Leases (the leader election namespace).
    pub namespace: String,
    /// This replica's identity (pod name and process id).
    pub identity: String,
    pub timings: Timings,
    /// How long a dead member's expired Lease stays before a survivor deletes it.
    pub member_grace: Duration,
    /// The management cluster's client configuration for the Lease thread's own client (see
    /// [`Sharder::run`]); without it the Lease thread shares the process's management client,
    /// whose requests are driven by the process's runtime and queue with everything else.
    pub lease_client: Option<kube::Config>,
}

impl std::fmt::Debug for Settings {
    // By hand: the client configuration may carry credentials, which are never logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("hub_id", &self.hub_id)
            .field("namespace", &self.namespace)
            .field("identity", &self.identity)
            .field("timings", &self.timings)
            .field("member_grace", &self.member_grace)
            .field("lease_client", &self.lease_client.as_ref().map(|c| c.cluster_url.to_string()))
            .finish()
    }
}

impl Settings {
    pub fn new(hub_id: &str, namespace: &str, identity: &str, timings: Timings) -> Self {
        Self {
            hub_id: hub_id.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            timings,
            // Long enough that a replica paused (GC, node pressure) for a few renewals is not
            // deleted under its feet; short enough that Leases of rolled pods do not pile up.
            member_grace: timings.lease_duration * 4,
            lease_client: None,
        }
    }

    /// Give the Lease thread a management client of its own, built from `config`.
    #[must_use]
    pub fn with_lease_client(mut self, config: kube::Config) -> Self {
        self.lease_client = Some(config);
        self
    }
}

// ---- the runtime ----

/// A cluster Lease this replica holds.
struct Held {
    key: ClusterKey,
    token: CancellationToken,
    /// When the last successful write of the Lease was *sent*: the renewTime it carries is no
    /// earlier, so fencing at `sent + renew_deadline` is before anyone may see it expired.
    sent: Instant,
    /// The Lease as last written by us (its resourceVersion for the next renewal: the watch may
    /// lag our own writes).
    lease: Lease,
}

/// Lease writes in flight at once in a round. A round lasts about (owned / this) × one write's
/// latency, and the next round (every Lease's next renewal) waits for it: under a management API
/// answering in seconds (the 300-cluster bench's burst), 150 Leases 32 at a time made rounds of
/// 40-50 s, and the Leases late in a round missed the 20 s deadline. So every owned cluster's
/// renewal at once, up to a bound that only a fleet of thousands per replica reaches.
const WRITES_AT_ONCE: usize = 512;

/// Where one round's time went (for its log line).
#[derive(Default)]
struct RoundStats {
    heartbeat: Duration,
    writes: usize,
    failed: usize,
    slowest: Duration,
    /// The longest time between two successful renewals of one Lease (sent to sent).
    widest_gap: Duration,
}

#[derive(Default)]
struct State {
    held: BTreeMap<String, Held>,
    /// Our membership Lease as last written, and when that write was sent.
    member: Option<(Lease, Instant)>,
}

/// One replica's part in sharded mode.
#[derive(Clone)]
pub struct Sharder {
    api: Api<Lease>,
    settings: Arc<Settings>,
    registry: Registry,
    metrics: Arc<Metrics>,
    state: Arc<std::sync::Mutex<State>>,
    /// The runtime [`Sharder::run`] was called on, where a granted cluster's connection runs
    /// (never the Lease thread's).
    parent: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Sharder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharder").field("settings", &self.settings).finish()
    }
}

/// The outcome of one write to one cluster Lease.
enum Wrote {
    Ok(Box<Lease>),
    /// Someone else changed it first (409): re-decide from a fresh read next round.
    Conflict,
    Failed(WriteFailed),
}

/// Why a Lease write failed (logged; a cluster Lease is fenced once its renew deadline passes).
#[derive(Debug, thiserror::Error)]
enum WriteFailed {
    /// The API server's error, in words safe to log.
    #[error("{}", plain(.0))]
    Api(kube::Error),
    /// No answer within the retry period.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Why renewing the membership Lease failed this round.
#[derive(Debug, thiserror::Error)]
enum HeartbeatError {
    /// A stale copy: the next round starts from a fresh read.
    #[error("the membership Lease changed under us; re-reading it")]
    Conflict,
    #[error(transparent)]
    Write(#[from] WriteFailed),
}

impl Sharder {
    pub fn new(mgmt: Client, settings: Settings, registry: Registry, metrics: Arc<Metrics>) -> Self {
        Self {
            api: Api::namespaced(mgmt, &settings.namespace),
            settings: Arc::new(settings),
            registry,
            metrics,
            state: Arc::default(),
            parent: None,
        }
    }

    fn selector(&self) -> String {
        format!("{HUB_LABEL}={},{ROLE_LABEL}", self.settings.hub_id)
    }

    /// Clusters this replica holds the Lease of, sorted.
    pub fn owned(&self) -> Vec<ClusterKey> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<ClusterKey> = state.held.values().map(|h| h.key.clone()).collect();
        out.sort();
        out
    }

    /// Run until `shutdown`; then stop acting on every cluster, release their Leases and delete
    /// the membership Lease, so the others take over at once.
    ///
    /// The Lease protocol (watch, renewals, watchdog) runs on an OS thread of its own with a
    /// current-thread runtime and, given [`Settings::lease_client`], a management client of its
    /// own: the clusters' caches and decisions can saturate the process's runtime (a burst over
    /// hundreds of clusters did, and the renewals then missed the deadline by seconds), but the
    /// kernel still schedules this thread, so a busy replica keeps its Leases. Dropping this future
    /// without `shutdown` (the runtime it runs on going away, as in a crash) stops the thread
    /// without releasing anything: every ownership token is cancelled and the Leases expire.
    pub async fn run(&self, shutdown: CancellationToken) {
        let parent = tokio::runtime::Handle::current();
        let alive = CancellationToken::new();
        let _alive = alive.clone().drop_guard();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let mut me = self.clone();
        me.parent = Some(parent);
        let spawned = runtime.and_then(|rt| {
            let (me, shutdown) = (me.clone(), shutdown.clone());
            std::thread::Builder::new().name("shard-leases".to_string()).spawn(move || {
                rt.block_on(me.on_lease_thread(shutdown, alive));
                let _ = done_tx.send(());
            })
        });
        match spawned {
            Ok(_) => {
                let _ = done_rx.await;
            }
            Err(e) => {
                tracing::error!(error = %e, identity = %self.settings.identity, "cannot start the shard Lease thread; renewing the Leases on the hub's runtime instead, where a busy hub may renew late and fence its clusters");
                me.protocol(shutdown).await;
            }
        }
    }

    /// The Lease thread: its own client, then the protocol until `shutdown` (releasing), or until
    /// `alive` falls without it (the hub's runtime is gone: fence everything, release nothing).
    async fn on_lease_thread(mut self, shutdown: CancellationToken, alive: CancellationToken) {
        if let Some(config) = self.settings.lease_client.clone() {
            // Built on this runtime: its request queue and connections are driven here.
            match Client::try_from(config) {
                Ok(client) => self.api = Api::namespaced(client, &self.settings.namespace),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot build the shard Lease thread's own management client; sharing the hub's")
                }
            }
        }
        tokio::select! {
            () = self.protocol(shutdown) => {}
            () = alive.cancelled() => {
                let held = std::mem::take(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner).held);
                for h in held.into_values() {
                    h.token.cancel();
                }
                tracing::warn!(identity = %self.settings.identity, "the hub's runtime stopped without a shutdown: stopped acting on every cluster without releasing their Leases");
            }
        }
    }

    /// The Lease protocol until `shutdown`, then the graceful stop.
    async fn protocol(&self, shutdown: CancellationToken) {
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().labels(&self.selector());
        let stream = reflector::reflector(writer, watcher(self.api.clone(), config).default_backoff());
        let watch_stop = shutdown.child_token();
        tokio::spawn({
            let stop = watch_stop.clone();
            async move {
                let mut stream = std::pin::pin!(stream);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        next = stream.next() => match next {
                            None => return,
                            Some(Err(e)) => tracing::debug!(error = %crate::infra::apierror::plain_watch(&e), "shard Lease watch error; retrying"),
                            Some(Ok(_)) => {}
                        },
                    }
                }
            }
        });
        let watchdog = tokio::spawn({
            let (me, stop) = (self.clone(), shutdown.clone());
            async move { me.watchdog(stop).await }
        });
        let mut tick = tokio::time::interval(self.settings.timings.retry_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut registry_changes = self.registry.changes();
        let mut last_error: Option<String> = None;
        loop {
            // Renewals (and the heartbeat) only at the tick, so their write cost stays one per
            // Lease per retry period however often the registry changes.
            let late = tokio::select! {
                () = shutdown.cancelled() => break,
                at = tick.tick() => Some(at.elapsed()),
                // A cluster registered or removed: decide for it now, not at the next tick.
                r = registry_changes.changed() => if r.is_err() { break } else { None },
            };
            // Before the Leases have been listed once, absence means nothing: take nothing.
            if futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok()) {
                let started = Instant::now();
                let stats = self.round(&store, &mut last_error, late.is_some()).await;
                self.report(late, started.elapsed(), &stats);
            }
        }
        watch_stop.cancel();
        let _ = watchdog.await;
        self.stop().await;
    }

    /// One round: heartbeat, then one step per registered cluster, then delete dead members'
    /// Leases. Without `renewing` (a round woken by a registry change), only ownership changes are
    /// written: no heartbeat, no renewal, no cleanup.
    async fn round(&self, store: &Store<Lease>, last_error: &mut Option<String>, renewing: bool) -> RoundStats {
        let timings = self.settings.timings;
        let me = self.settings.identity.clone();
        let stats = std::sync::Mutex::new(RoundStats::default());
        // Not yet a member: the heartbeat first, so this round counts us live. Once a member, the
        // heartbeat goes with the cluster renewals: waiting for it first delayed each of them by
        // its latency (7 s under the 300-cluster burst).
        let beat_first = renewing && self.state.lock().unwrap_or_else(PoisonError::into_inner).member.is_none();
        if beat_first {
            self.beat(&stats, last_error).await;
        }
        let now = Timestamp::now();
        let leases = store.state();
        let role = |l: &Lease, r: &str| l.labels().get(ROLE_LABEL).map(String::as_str) == Some(r);
        let member_views: Vec<LeaseView> = leases.iter().filter(|l| role(l, "member")).map(|l| view(l)).collect();
        let mut members = sharding::live_members(&member_views, now);
        // Ourselves only while our own heartbeat holds: a replica cut off from the management
        // cluster must not go on taking clusters.
        let self_live = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.member.as_ref().is_some_and(|(_, sent)| sent.elapsed() < timings.renew_deadline)
        };
        members.retain(|m| *m != me);
        if self_live {
            members.push(me.clone());
            members.sort();
        }
        self.metrics.shard_members.set(members.len() as i64);

        let by_name: BTreeMap<String, Arc<Lease>> = leases.iter().map(|l| (l.name_any(), l.clone())).collect();
        let registered = self.registry.registered();
        let mut work = Vec::new();
        for key in &registered {
            let name = sharding::cluster_lease_name(&self.settings.hub_id, &key.namespace, &key.name);
            // Placed by API server URL (see `Registry::placement`): registrations of one
            // workload cluster meet on one replica, where the duplicate check sees them.
            let placement = self.registry.placement(key).unwrap_or_else(|| key.to_string());
            let desired = sharding::desired_owner(&placement, &members).map(str::to_string);
            // Our own last write beats the watch, which may lag it.
            let ours =
                self.state.lock().unwrap_or_else(PoisonError::into_inner).held.get(&name).map(|h| h.lease.clone());
            let current = ours.or_else(|| by_name.get(&name).map(|l| l.as_ref().clone()));
            let step = sharding::step(current.as_ref().map(view).as_ref(), &me, desired.as_deref(), now);
            if step == Step::Renew && !renewing {
                continue;
            }
            work.push((key.clone(), name, current, step));
        }
        // Clusters held but no longer registered: stop and release.
        let stale: Vec<(String, Held)> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let names: Vec<String> =
                state.held.iter().filter(|(_, h)| !registered.contains(&h.key)).map(|(n, _)| n.clone()).collect();
            names.into_iter().filter_map(|n| state.held.remove(&n).map(|h| (n, h))).collect()
        };
        for (name, held) in stale {
            held.token.cancel();
            self.metrics.shard_handovers.get_or_create(&direction("released")).inc();
            tracing::info!(cluster = %held.key, lease = %name, identity = %me, "cluster unregistered: stopped acting on it and releasing its Lease");
            let _ = tokio::time::timeout(timings.retry_period, self.release(held.lease)).await;
        }
        let since_sent: Vec<Option<Duration>> = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            work.iter().map(|(_, name, _, _)| state.held.get(name).map(|h| h.sent.elapsed())).collect()
        };
        let mut slots: Vec<Option<_>> = work.into_iter().map(Some).collect();
        let work: Vec<_> = sharding::renewal_order(&since_sent).into_iter().filter_map(|i| slots[i].take()).collect();
        if renewing && !beat_first {
            tokio::join!(self.beat(&stats, last_error), self.apply_all(work, &stats));
        } else {
            self.apply_all(work, &stats).await;
        }
        if renewing {
            self.collect_members(&leases, now).await;
        }
        let owned = self.state.lock().unwrap_or_else(PoisonError::into_inner).held.len();
        self.metrics.shard_owned.set(owned as i64);
        stats.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renew the membership Lease, timing it for the round's line; its failure logged once per
    /// distinct error.
    async fn beat(&self, stats: &std::sync::Mutex<RoundStats>, last_error: &mut Option<String>) {
        let sent = Instant::now();
        let beat = self.heartbeat().await;
        stats.lock().unwrap_or_else(PoisonError::into_inner).heartbeat = sent.elapsed();
        match beat {
            Ok(()) => *last_error = None,
            Err(e) if last_error.as_deref() != Some(e.to_string().as_str()) => {
                tracing::warn!(identity = %self.settings.identity, error = %e, "renewing this replica's membership Lease failed; retrying every {} s (logged again only if the error changes)", self.settings.timings.retry_period.as_secs_f64());
                *last_error = Some(e.to_string());
            }
            Err(_) => {}
        }
    }

    /// One line per round: at debug always, at warn when a write failed or a Lease came close to
    /// its renew deadline (two renewals of one Lease further apart than the retry period plus half
    /// the margin left before the deadline: 15 s by default), saying where the time went.
    fn report(&self, late: Option<Duration>, took: Duration, stats: &RoundStats) {
        let ms = |d: Duration| d.as_millis() as u64;
        let deadline = self.settings.timings.renew_deadline;
        let (tick_late_ms, round_ms, heartbeat_ms) = (late.map(ms), ms(took), ms(stats.heartbeat));
        let (writes, failed, slowest_write_ms, widest_gap_ms) =
            (stats.writes, stats.failed, ms(stats.slowest), ms(stats.widest_gap));
        let close = deadline - deadline.saturating_sub(self.settings.timings.retry_period) / 2;
        if stats.widest_gap > close || stats.failed > 0 {
            tracing::warn!(identity = %self.settings.identity, tick_late_ms, round_ms, heartbeat_ms, writes, failed, slowest_write_ms, widest_gap_ms, deadline_ms = ms(deadline), "a shard Lease write failed or a cluster Lease came close to its renew deadline");
        } else {
            tracing::debug!(identity = %self.settings.identity, tick_late_ms, round_ms, heartbeat_ms, writes, failed, slowest_write_ms, widest_gap_ms, "shard round");
        }
    }

    /// Carry out the round's steps, [`WRITES_AT_ONCE`] at a time.
    async fn apply_all(
        &self,
        work: Vec<(ClusterKey, String, Option<Lease>, Step)>,
        stats: &std::sync::Mutex<RoundStats>,
    ) {
        futures::stream::iter(work)
            .for_each_concurrent(WRITES_AT_ONCE, |(key, name, current, step)| async move {
                self.apply(key, name, current, step, stats).await;
            })
            .await;
    }

    /// Carry out one cluster's step.
    async fn apply(
        &self,
        key: ClusterKey,
        name: String,
        current: Option<Lease>,
        step: Step,
        stats: &std::sync::Mutex<RoundStats>,
    ) {
        let me = &self.settings.identity;
        let timeout = self.settings.timings.retry_period;
        let held = self.state.lock().unwrap_or_else(PoisonError::into_inner).held.contains_key(&name);
        match &step {
            Step::Acquire | Step::Renew => {
                let sent = Instant::now();
                let wrote = match tokio::time::timeout(timeout, self.write_cluster(&key, &name, current)).await {
                    Ok(w) => w,
                    Err(_) => Wrote::Failed(WriteFailed::Timeout(timeout)),
                };
                {
                    let mut s = stats.lock().unwrap_or_else(PoisonError::into_inner);
                    s.writes += 1;
                    s.slowest = s.slowest.max(sent.elapsed());
                    s.failed += usize::from(!matches!(wrote, Wrote::Ok(_)));
                }
                match wrote {
                    Wrote::Ok(lease) => {
                        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                        if let Some(h) = state.held.get_mut(&name) {
                            let mut s = stats.lock().unwrap_or_else(PoisonError::into_inner);
                            s.widest_gap = s.widest_gap.max(sent.saturating_duration_since(h.sent));
                            drop(s);
                            // Never move `sent` back: a slow answer to an older write must not
                            // extend the fence past what the Lease says.
                            if sent > h.sent {
                                h.sent = sent;
                            }
                            h.lease = *lease;
                        } else {
                            let token = CancellationToken::new();
                            state.held.insert(
                                name.clone(),
                                Held { key: key.clone(), token: token.clone(), sent, lease: *lease },
                            );
                            self.metrics.shard_owned.set(state.held.len() as i64);
                            drop(state);
                            self.metrics.shard_handovers.get_or_create(&direction("acquired")).inc();
                            tracing::info!(cluster = %key, lease = %name, identity = %me, why = step.why(), "took ownership of the cluster");
                            // On the hub's runtime: the connection's tasks must not run here.
                            let _entered = self.parent.as_ref().map(tokio::runtime::Handle::enter);
                            self.registry.grant(&key, token);
                        }
                    }
                    Wrote::Conflict if held => {
                        // Someone else wrote our Lease: it is not ours any more.
                        self.fence(&name, "another replica changed the cluster's Lease");
                    }
                    Wrote::Conflict => {
                        tracing::debug!(cluster = %key, lease = %name, "another replica took the cluster's Lease first");
                    }
                    Wrote::Failed(e) => {
                        // The watchdog fences once the renew deadline has passed.
                        tracing::debug!(cluster = %key, lease = %name, error = %e, "writing the cluster's Lease failed");
                    }
                }
            }
            Step::Release { to } => {
                // Fence first, then release: the Lease is free only once we stopped acting.
                if let Some(h) = self.take(&name) {
                    h.token.cancel();
                    let released = tokio::time::timeout(timeout, self.release(h.lease)).await;
                    if matches!(released, Ok(Ok(()))) {
                        self.metrics.shard_handovers.get_or_create(&direction("released")).inc();
                        tracing::info!(cluster = %key, lease = %name, identity = %me, to = %to, why = step.why(), "stopped acting on the cluster and released its Lease");
                    } else {
                        // Stopped acting all the same; the Lease expires for the next owner.
                        self.metrics.shard_handovers.get_or_create(&direction("fenced")).inc();
                        tracing::warn!(cluster = %key, lease = %name, identity = %me, to = %to, why = step.why(), "stopped acting on the cluster; releasing its Lease failed, it will expire");
                    }
                }
            }
            Step::Leave { holder } => {
                if held {
                    // We thought we held it, but another replica holds it live now.
                    self.fence(&name, "another replica holds the cluster's Lease");
                } else {
                    tracing::trace!(cluster = %key, holder = ?holder, why = step.why(), "leaving the cluster to another replica");
                }
            }
        }
    }

    fn take(&self, name: &str) -> Option<Held> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = state.held.remove(name);
        self.metrics.shard_owned.set(state.held.len() as i64);
        held
    }

    /// Stop acting on a cluster now (its token cancelled: its connection ends and its clients
    /// refuse every request).
    fn fence(&self, name: &str, why: &str) {
        if let Some(h) = self.take(name) {
            h.token.cancel();
            self.metrics.shard_handovers.get_or_create(&direction("fenced")).inc();
            tracing::error!(cluster = %h.key, lease = %name, identity = %self.settings.identity, why, "fenced: stopped acting on the cluster");
        }
    }

    /// Fence every cluster whose Lease was not renewed within the renew deadline. A task of its
    /// own, so a hung management API cannot hold the fence back.
    async fn watchdog(&self, shutdown: CancellationToken) {
        let timings = self.settings.timings;
        let every =
            (self.settings.timings.retry_period / 10).clamp(Duration::from_millis(20), Duration::from_millis(500));
        loop {
            let slept = Instant::now();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            // How late this task woke: the runtime's scheduling delay, logged with any fence.
            let woke_late_ms = slept.elapsed().saturating_sub(every).as_millis() as u64;
            let late: Vec<(String, u64)> = {
                let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state
                    .held
                    .iter()
                    .filter(|(_, h)| sharding::overdue(h.sent.elapsed(), timings))
                    .map(|(n, h)| (n.clone(), h.sent.elapsed().as_millis() as u64))
                    .collect()
            };
            for (name, since_sent_ms) in late {
                tracing::warn!(lease = %name, since_sent_ms, woke_late_ms, "renew deadline passed since the last renewal was sent");
                self.fence(&name, "could not renew the cluster's Lease within the renew deadline");
            }
        }
    }

    /// Create or renew our membership Lease.
    async fn heartbeat(&self) -> Result<(), HeartbeatError> {
        let name = sharding::member_lease_name(&self.settings.hub_id, &self.settings.identity);
        let current = self.state.lock().unwrap_or_else(PoisonError::into_inner).member.as_ref().map(|(l, _)| l.clone());
        let sent = Instant::now();
        let timeout = self.settings.timings.retry_period;
        let labels = [(ROLE_LABEL, "member")];
        let write = self.write(&name, current, &labels, None);
        match tokio::time::timeout(timeout, write).await {
            Ok(Wrote::Ok(lease)) => {
                self.state.lock().unwrap_or_else(PoisonError::into_inner).member = Some((*lease, sent));
                Ok(())
            }
            Ok(Wrote::Conflict) => {
                // A stale copy (restarted watch, a survivor's cleanup): start from a fresh read.
                self.state.lock().unwrap_or_else(PoisonError::into_inner).member = None;
                Err(HeartbeatError::Conflict)
            }
            Ok(Wrote::Failed(e)) => Err(e.into()),
            Err(_) => Err(WriteFailed::Timeout(timeout).into()),
        }
    }

    async fn write_cluster(&self, key: &ClusterKey, name: &str, current: Option<Lease>) -> Wrote {
        let labels = [(ROLE_LABEL, "cluster")];
        self.write(name, current, &labels, Some(key.to_string())).await
    }

    /// Write `name` held by us: replace `current` (carrying its resourceVersion, so two replicas
    /// racing for it cannot both win), or create it. With no copy at hand, read it first.
    async fn write(
        &self,
        name: &str,
        current: Option<Lease>,
        labels: &[(&str, &str)],
        cluster: Option<String>,
    ) -> Wrote {
        let me = &self.settings.identity;
        let mut current = match current {
            Some(c) => Some(c),
            None => match self.api.get_opt(name).await {
                Ok(c) => c,
                Err(e) => return Wrote::Failed(WriteFailed::Api(e)),
            },
        };
        // Two attempts: the second from a fresh read, when our copy was stale (a write whose
        // answer we gave up on went through, or the watch lagged) but the Lease may still be ours.
        for attempt in 0..2 {
            let now = Timestamp::now();
            // Never over another replica's live Lease, whatever the copy we decided on said.
            if current.as_ref().map(view).and_then(|v| v.live_holder(now).map(str::to_string)).is_some_and(|h| h != *me)
            {
                return Wrote::Conflict;
            }
            let spec = lease_spec(current.as_ref().and_then(|l| l.spec.as_ref()), me, now, self.settings.timings);
            let result = match current.clone() {
                Some(mut lease) => {
                    lease.spec = Some(spec);
                    self.api.replace(name, &PostParams::default(), &lease).await
                }
                None => {
                    let mut all_labels = BTreeMap::from([(HUB_LABEL.to_string(), self.settings.hub_id.clone())]);
                    all_labels.extend(labels.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())));
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.to_string()),
                            labels: Some(all_labels),
                            annotations: cluster.clone().map(|c| BTreeMap::from([(CLUSTER_ANNOTATION.to_string(), c)])),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
            };
            match result {
                Ok(l) => return Wrote::Ok(Box::new(l)),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt == 0 => match self.api.get_opt(name).await {
                    Ok(fresh) => current = fresh,
                    Err(e) => return Wrote::Failed(WriteFailed::Api(e)),
                },
                Err(kube::Error::Api(s)) if s.code == 409 => return Wrote::Conflict,
                Err(e) => return Wrote::Failed(WriteFailed::Api(e)),
            }
        }
        Wrote::Conflict
    }

    /// Release a Lease we held (its holder emptied), so the next owner need not wait for expiry.
    async fn release(&self, mut lease: Lease) -> Result<(), kube::Error> {
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
        }
        self.api.replace(&lease.name_any(), &PostParams::default(), &lease).await.map(|_| ())
    }

    /// Delete the membership Leases of replicas dead for longer than the grace period, each under
    /// a resourceVersion precondition (a replica that came back in between keeps its Lease).
    async fn collect_members(&self, leases: &[Arc<Lease>], now: Timestamp) {
        let me = sharding::member_lease_name(&self.settings.hub_id, &self.settings.identity);
        for l in leases {
            let is_member = l.labels().get(ROLE_LABEL).map(String::as_str) == Some("member");
            if !is_member || l.name_any() == me || !sharding::stale_member(&view(l), now, self.settings.member_grace) {
                continue;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions { resource_version: l.resource_version(), uid: l.uid() }),
                ..DeleteParams::default()
            };
            match self.api.delete(&l.name_any(), &dp).await {
                Ok(_) => tracing::info!(
                    lease = %l.name_any(),
                    holder = ?l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
                    grace_seconds = self.settings.member_grace.as_secs(),
                    "deleted the membership Lease of a replica gone for longer than the grace period"
                ),
                // Gone already or renewed meanwhile: another survivor or the replica itself acted.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::debug!(lease = %l.name_any(), error = %plain(&e), "deleting a stale membership Lease failed")
                }
            }
        }
    }

    /// Graceful stop: fence every cluster, release its Lease, delete the membership Lease.
    async fn stop(&self) {
        let (held, member) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut state.held), state.member.take())
        };
        let timeout = self.settings.timings.retry_period;
        for (name, h) in held {
            h.token.cancel();
            self.metrics.shard_handovers.get_or_create(&direction("released")).inc();
            tracing::info!(cluster = %h.key, lease = %name, "hub stopping: stopped acting on the cluster; releasing its Lease");
            let _ = tokio::time::timeout(timeout, self.release(h.lease)).await;
        }
        if let Some((lease, _)) = member {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { resource_version: lease.resource_version(), uid: lease.uid() }),
                ..DeleteParams::default()
            };
            let _ = tokio::time::timeout(timeout, self.api.delete(&lease.name_any(), &dp)).await;
        }
        self.metrics.shard_owned.set(0);
    }
}

fn direction(d: &str) -> crate::infra::metrics::DirectionLabels {
    crate::infra::metrics::DirectionLabels { direction: d.to_string() }
}

/// The decisions' view of a Lease.
fn view(l: &Lease) -> LeaseView {
    let spec = l.spec.as_ref();
    LeaseView {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        renewed: spec.and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref())).map(|t| t.0),
        duration: Duration::from_secs(
            spec.and_then(|s| s.lease_duration_seconds).and_then(|d| u64::try_from(d).ok()).unwrap_or(0),
        ),
    }
}

/// The spec we write when taking or renewing a Lease.
fn lease_spec(current: Option<&LeaseSpec>, me: &str, now: Timestamp, timings: Timings) -> LeaseSpec {
    let ours = current.and_then(|s| s.holder_identity.as_deref()) == Some(me);
    let transitions = current.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(timings.lease_duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if ours { current.and_then(|s| s.acquire_time.clone()) } else { Some(MicroTime(now)) },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
        ..LeaseSpec::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The Lease writes against the API emulator: never over another replica's live Lease, even
    /// when the copy a step was decided on (or the lack of one) said it was free; a stale copy of
    /// our own Lease renewed from a fresh read instead of counting as lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lease_writes_never_take_a_live_lease_and_survive_a_stale_copy() {
        use sim::apiserver::{ApiServer, ApiServerConfig};
        let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
        let client = server.client();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "leases"}})).unwrap();
        Api::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        let registry = Registry::new(crate::infra::registry::Settings::default());
        let settings = |id: &str| Settings::new("default", "leases", id, Timings::DEFAULT);
        let a = Sharder::new(client.clone(), settings("a"), registry.clone(), Arc::new(Metrics::new()));
        let b = Sharder::new(client.clone(), settings("b"), registry, Arc::new(Metrics::new()));
        let key = ClusterKey::new("team-a", "prod");
        let name = sharding::cluster_lease_name("default", "team-a", "prod");
        let holder = |w: &Wrote| match w {
            Wrote::Ok(l) => l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
            _ => None,
        };
        let api = Api::<Lease>::namespaced(client.clone(), "leases");
        // A takes it (no Lease yet), releases it, and takes it again.
        assert_eq!(holder(&a.write_cluster(&key, &name, None).await), Some("a".to_string()));
        a.release(api.get(&name).await.unwrap()).await.unwrap();
        let free = api.get(&name).await.unwrap();
        let retaken = a.write_cluster(&key, &name, Some(free.clone())).await;
        assert_eq!(holder(&retaken), Some("a".to_string()));
        // B, deciding on no copy (a watch that has not listed it yet), must not take A's live Lease.
        assert!(matches!(b.write_cluster(&key, &name, None).await, Wrote::Conflict));
        // Nor from the older copy that showed it free (the fresh read shows A).
        assert!(matches!(b.write_cluster(&key, &name, Some(free)).await, Wrote::Conflict));
        // A renews twice from the same copy: the second, stale, goes through a fresh read.
        let Wrote::Ok(copy) = retaken else { unreachable!() };
        assert_eq!(holder(&a.write_cluster(&key, &name, Some(copy.as_ref().clone())).await), Some("a".into()));
        assert_eq!(holder(&a.write_cluster(&key, &name, Some(*copy)).await), Some("a".into()));
        let lease = api.get(&name).await.unwrap();
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("a"));
        server.shutdown().await;
    }
}
