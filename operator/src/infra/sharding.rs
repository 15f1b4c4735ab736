//! Sharded mode (hub.md §6, `karpenter-hub run --sharding`): workload clusters spread across hub
//! replicas through a fixed number of shard buckets, each owned through a `coordination.k8s.io/v1`
//! Lease in the management cluster; Kubernetes is the only coordination.
//!
//! Each replica heartbeats a membership Lease; the live members come from a label-selected watch of
//! the hub's Leases. A cluster belongs to the bucket its key hashes to
//! ([`crate::decisions::shard_buckets::bucket_of`]); [`crate::decisions::shard_buckets::place`]
//! says which member should hold each bucket (weighted by the pods its holder counted), and
//! [`crate::decisions::sharding::step`] what to do with the bucket's Lease. Holding a bucket means
//! holding an ownership token per registered cluster of the bucket (children of the bucket's): the
//! registry runs a cluster's connection only under it, and the workload clients it builds refuse
//! every request once it is cancelled ([`crate::infra::fence::FenceLayer`]). A watchdog cancels a
//! bucket's token when its Lease could not be renewed within the renew deadline, which is shorter
//! than the Lease duration: the replica has stopped writing to the bucket's clusters before anyone
//! else may take the bucket. The bucket Leases also carry what their holder publishes for the
//! others: the bucket's weight, and the clusters it identified (for the duplicate check across
//! replicas).
//!
//! The protocol runs on an OS thread of its own with its own management client, so the clusters'
//! work saturating the hub's runtime cannot make the renewals late ([`Sharder::run`]).
//!
//! Owns: the Lease protocol of sharded mode (membership heartbeat, acquire, renew, hand over,
//! fence, deleting dead members' Leases), the grants of clusters under held buckets, its thread,
//! and the shard metrics. Must not: decide anything itself (the decisions modules do), act on a
//! cluster without a live ownership token, or release a bucket's Lease before its token is
//! cancelled.

use std::{
    collections::{BTreeMap, BTreeSet},
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
    decisions::{
        shard_buckets::{self, Bucket},
        sharding::{self, LeaseView, Step, Timings},
    },
    infra::{apierror::plain, metrics::Metrics, registry::ClusterKey, registry::Registry},
};

/// Label on every shard Lease: the hub id (several hubs may share a namespace).
pub const HUB_LABEL: &str = crds::labels::HUB;
/// Label telling membership Leases (`member`) from bucket Leases (`bucket`); `cluster` marks the
/// per-cluster Leases of releases before buckets.
pub const ROLE_LABEL: &str = "karpenter.clever-cloud.com/shard";
/// Label on a bucket Lease: the number of buckets of its scheme.
pub const BUCKETS_LABEL: &str = "karpenter.clever-cloud.com/shard-buckets";
/// Annotation on a bucket Lease: its weight (the quantized pods of its clusters) as its holder
/// last counted them, read by every replica's placement.
pub const WEIGHT_ANNOTATION: &str = "karpenter.clever-cloud.com/shard-weight";
/// Annotation on a bucket Lease: the workload clusters its holder identified (JSON list of
/// namespace, name, UID digest, Secret creation time).
pub const IDENTIFIED_ANNOTATION: &str = "karpenter.clever-cloud.com/shard-identified";
/// Longest identities annotation read from another replica's Lease (Kubernetes allows 256 KiB for
/// all annotations together).
const MAX_IDENTIFIED: usize = 256 * 1024;

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
    /// The number of shard buckets ([`shard_buckets::BUCKETS`]; tests use fewer).
    pub buckets: u32,
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
            .field("buckets", &self.buckets)
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
            buckets: shard_buckets::BUCKETS,
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

/// A bucket Lease this replica holds.
struct Held {
    bucket: u32,
    /// The bucket's ownership; each of its clusters is granted a child of it.
    token: CancellationToken,
    /// When the last successful write of the Lease was *sent*: the renewTime it carries is no
    /// earlier, so fencing at `sent + renew_deadline` is before anyone may see it expired.
    sent: Instant,
    /// The Lease as last written by us (its resourceVersion for the next renewal: the watch may
    /// lag our own writes).
    lease: Lease,
}

/// Lease writes in flight at once in a round: every held bucket's renewal at once (a round of
/// sequential writes under a management API answering in seconds would miss the renew deadline).
const WRITES_AT_ONCE: usize = 64;

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
    /// By Lease name.
    held: BTreeMap<String, Held>,
    /// The clusters granted under a held bucket: the bucket Lease's name and the cluster's token.
    granted: BTreeMap<ClusterKey, (String, CancellationToken)>,
    /// Our membership Lease as last written, and when that write was sent.
    member: Option<(Lease, Instant)>,
    /// When this replica's first heartbeat succeeded (since then it counts itself live).
    member_since: Option<Instant>,
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

    /// Clusters this replica owns (granted under a bucket it holds), sorted.
    pub fn owned(&self) -> Vec<ClusterKey> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).granted.keys().cloned().collect()
    }

    /// The buckets this replica holds the Lease of, sorted.
    pub fn buckets(&self) -> Vec<u32> {
        let mut out: Vec<u32> =
            self.state.lock().unwrap_or_else(PoisonError::into_inner).held.values().map(|h| h.bucket).collect();
        out.sort_unstable();
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
                let held = {
                    let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                    state.granted.clear();
                    std::mem::take(&mut state.held)
                };
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

    /// One round: heartbeat, then one step per bucket, then the grants of the held buckets'
    /// clusters, then delete dead members' Leases. Without `renewing` (a round woken by a registry
    /// change), only ownership changes (and a changed list of identified clusters) are written: no
    /// heartbeat, no renewal, no cleanup.
    async fn round(&self, store: &Store<Lease>, last_error: &mut Option<String>, renewing: bool) -> RoundStats {
        let timings = self.settings.timings;
        let me = self.settings.identity.clone();
        let stats = std::sync::Mutex::new(RoundStats::default());
        // Not yet a member: the heartbeat first, so this round counts us live. Once a member, the
        // heartbeat goes with the bucket renewals: waiting for it first delayed each of them by
        // its latency (7 s under the 300-cluster burst).
        let beat_first = renewing && self.state.lock().unwrap_or_else(PoisonError::into_inner).member.is_none();
        if beat_first {
            self.beat(&stats, last_error).await;
        }
        let now = Timestamp::now();
        let leases = store.state();
        let member_views: Vec<LeaseView> = leases.iter().filter(|l| role(l, "member")).map(|l| view(l)).collect();
        let mut members = sharding::live_members(&member_views, now);
        // Ourselves only while our own heartbeat holds: a replica cut off from the management
        // cluster must not go on taking buckets.
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

        let count = self.settings.buckets;
        // Another scheme's live Lease (a per-cluster Lease of an earlier release, or a bucket of
        // another count) may stand for any of our clusters: take no bucket until it is gone.
        let foreign = leases.iter().find(|l| self.other_scheme(l) && view(l).live_holder(now).is_some());
        // A replica takes no free bucket in its first retry period as a member: replicas started
        // together (a Deployment's pods) first see each other, instead of the first one taking
        // every bucket, connecting every cluster, then handing three quarters over. Renewing what
        // it holds (a restarted container keeping its identity) is not held back.
        let warming = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .member_since
            .is_none_or(|t| t.elapsed() < timings.retry_period);
        let by_name: BTreeMap<String, Arc<Lease>> = leases.iter().map(|l| (l.name_any(), l.clone())).collect();
        let current: Vec<(String, Option<Lease>)> = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            (0..count)
                .map(|b| {
                    let name = shard_buckets::bucket_lease_name(&self.settings.hub_id, b, count);
                    // Our own last write beats the watch, which may lag it.
                    let lease = state
                        .held
                        .get(&name)
                        .map(|h| h.lease.clone())
                        .or_else(|| by_name.get(&name).map(|l| l.as_ref().clone()));
                    (name, lease)
                })
                .collect()
        };
        let placing: Vec<Bucket> = current
            .iter()
            .map(|(_, l)| Bucket {
                weight: l.as_ref().and_then(weight_of).unwrap_or(1),
                holder: l.as_ref().and_then(|l| view(l).live_holder(now).map(str::to_string)),
            })
            .collect();
        let desired = shard_buckets::place(&placing, &members);
        self.learn_identified(&current, now);

        // The registered clusters by bucket, hashed once per round (every use below reads this).
        let mut in_bucket: Vec<BTreeSet<ClusterKey>> = vec![BTreeSet::new(); count as usize];
        for key in self.registry.registered() {
            let b = bucket_of(&key, count) as usize;
            in_bucket[b].insert(key);
        }
        let mut work = Vec::new();
        for (b, ((name, lease), desired)) in (0u32..).zip(current.into_iter().zip(desired)) {
            let held = self.state.lock().unwrap_or_else(PoisonError::into_inner).held.contains_key(&name);
            let step = sharding::step(lease.as_ref().map(view).as_ref(), &me, desired, now);
            match &step {
                Step::Acquire if foreign.is_some() || warming => continue,
                // A renewal outside the tick only to publish newly identified clusters promptly.
                Step::Renew if !renewing && !self.identified_changed(&in_bucket[b as usize], lease.as_ref()) => {
                    continue;
                }
                Step::Leave { .. } if !held => continue,
                _ => {}
            }
            work.push((b, name, lease, step));
        }
        if let Some(l) = foreign
            && renewing
        {
            tracing::warn!(identity = %me, lease = %l.name_any(), "a live shard Lease of another scheme (an earlier release's per-cluster Lease, or another bucket count) exists: taking no bucket until it is released or expires");
        }
        let since_sent: Vec<Option<Duration>> = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            work.iter().map(|(_, name, _, _)| state.held.get(name).map(|h| h.sent.elapsed())).collect()
        };
        let mut slots: Vec<Option<_>> = work.into_iter().map(Some).collect();
        let work: Vec<_> = sharding::renewal_order(&since_sent).into_iter().filter_map(|i| slots[i].take()).collect();
        if renewing && !beat_first {
            tokio::join!(self.beat(&stats, last_error), self.apply_all(work, &in_bucket, &stats));
        } else {
            self.apply_all(work, &in_bucket, &stats).await;
        }
        self.grant_held(&in_bucket);
        // A cluster whose bucket another replica holds will not come back here soon: drop a
        // connection kept for that (the registry keeps one a while after a fence).
        let held_elsewhere =
            placing.iter().zip(&in_bucket).filter(|(b, _)| b.holder.as_deref().is_some_and(|h| h != me));
        for key in held_elsewhere.flat_map(|(_, keys)| keys) {
            self.registry.disown(key);
        }
        if renewing {
            self.collect(&leases, now).await;
        }
        stats.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `l` is a shard Lease of another scheme than this replica's buckets.
    fn other_scheme(&self, l: &Lease) -> bool {
        role(l, "cluster")
            || (role(l, "bucket")
                && l.labels().get(BUCKETS_LABEL).map(String::as_str)
                    != Some(self.settings.buckets.to_string().as_str()))
    }

    /// Grant every registered cluster of a held bucket that has no token yet; cancel the tokens of
    /// clusters unregistered or whose bucket is no longer held. `in_bucket`: the registered
    /// clusters of each bucket.
    fn grant_held(&self, in_bucket: &[BTreeSet<ClusterKey>]) {
        let (mut grants, mut ended) = (Vec::new(), Vec::new());
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let State { held, granted, .. } = &mut *state;
            granted.retain(|key, (name, token)| {
                // Still registered and its bucket still held.
                let keep =
                    held.get(name).is_some_and(|h| in_bucket[h.bucket as usize].contains(key)) && !token.is_cancelled();
                if !keep {
                    ended.push((key.clone(), name.clone(), token.clone()));
                }
                keep
            });
            for (name, h) in held.iter() {
                for key in &in_bucket[h.bucket as usize] {
                    if granted.contains_key(key) {
                        continue;
                    }
                    let token = h.token.child_token();
                    granted.insert(key.clone(), (name.clone(), token.clone()));
                    grants.push((key.clone(), h.bucket, token));
                }
            }
            self.metrics.shard_owned.set(granted.len() as i64);
        }
        for (key, name, token) in ended {
            if !token.is_cancelled() {
                token.cancel();
                self.metrics.shard_handovers.get_or_create(&direction("released")).inc();
                tracing::info!(cluster = %key, lease = %name, identity = %self.settings.identity, "cluster unregistered: stopped acting on it");
            }
        }
        // On the hub's runtime: the connections' tasks must not run on the Lease thread.
        let _entered = self.parent.as_ref().map(tokio::runtime::Handle::enter);
        for (key, bucket, token) in grants {
            self.metrics.shard_handovers.get_or_create(&direction("acquired")).inc();
            tracing::info!(cluster = %key, bucket, identity = %self.settings.identity, "took ownership of the cluster: this replica holds its bucket's Lease");
            self.registry.grant(&key, token);
        }
    }

    /// Tell the registry which clusters the other replicas identified, from the bucket Leases they
    /// hold live (only entries whose key hashes to that bucket: a Lease speaks for its own bucket).
    fn learn_identified(&self, current: &[(String, Option<Lease>)], now: Timestamp) {
        let count = self.settings.buckets;
        let mut elsewhere = BTreeMap::new();
        for (b, (_, lease)) in (0u32..).zip(current) {
            let Some(lease) = lease else { continue };
            if view(lease).live_holder(now).is_none_or(|h| h == self.settings.identity) {
                continue;
            }
            for i in identified_of(lease) {
                let key = ClusterKey::new(i.namespace, i.name);
                if bucket_of(&key, count) == b {
                    elsewhere.insert(key, (i.uid, i.created));
                }
            }
        }
        self.registry.set_identified_elsewhere(elsewhere);
    }

    /// What this replica publishes on a bucket's Lease, its registered clusters being `keys`: the
    /// bucket's weight (when every one of its clusters owned here has synced; else the Lease's
    /// current weight stays) and the clusters it identified there.
    fn annotations(&self, keys: &BTreeSet<ClusterKey>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::from([(IDENTIFIED_ANNOTATION.to_string(), self.identified_json(keys))]);
        let pods: Option<usize> = keys.iter().map(|k| self.registry.pods(k)).sum();
        if let Some(pods) = pods {
            out.insert(WEIGHT_ANNOTATION.to_string(), shard_buckets::quantize(pods as u64).to_string());
        }
        out
    }

    fn identified_json(&self, keys: &BTreeSet<ClusterKey>) -> String {
        let list: Vec<Identified> = self
            .registry
            .identified(keys)
            .into_iter()
            .map(|(k, (uid, created))| Identified { namespace: k.namespace, name: k.name, uid, created })
            .collect();
        serde_json::to_string(&list).unwrap_or_else(|_| "[]".to_string())
    }

    /// Whether the clusters identified among a bucket's `keys` differ from what its Lease says.
    fn identified_changed(&self, keys: &BTreeSet<ClusterKey>, lease: Option<&Lease>) -> bool {
        let published = lease.and_then(|l| l.annotations().get(IDENTIFIED_ANNOTATION).cloned()).unwrap_or_default();
        self.identified_json(keys) != published
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
        work: Vec<(u32, String, Option<Lease>, Step)>,
        in_bucket: &[BTreeSet<ClusterKey>],
        stats: &std::sync::Mutex<RoundStats>,
    ) {
        futures::stream::iter(work)
            .for_each_concurrent(WRITES_AT_ONCE, |(bucket, name, current, step)| async move {
                let keys = &in_bucket[bucket as usize];
                self.apply(bucket, name, current, step, keys, stats).await;
            })
            .await;
    }

    /// Carry out one bucket's step.
    async fn apply(
        &self,
        bucket: u32,
        name: String,
        current: Option<Lease>,
        step: Step,
        keys: &BTreeSet<ClusterKey>,
        stats: &std::sync::Mutex<RoundStats>,
    ) {
        let me = &self.settings.identity;
        let timeout = self.settings.timings.retry_period;
        let held = self.state.lock().unwrap_or_else(PoisonError::into_inner).held.contains_key(&name);
        match &step {
            Step::Acquire | Step::Renew => {
                let sent = Instant::now();
                let annotations = self.annotations(keys);
                let wrote = match tokio::time::timeout(timeout, self.write_bucket(&name, current, annotations)).await {
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
                            state.held.insert(name.clone(), Held { bucket, token, sent, lease: *lease });
                            drop(state);
                            tracing::info!(bucket, lease = %name, identity = %me, why = step.why(), "took the shard bucket");
                        }
                    }
                    Wrote::Conflict if held => {
                        // Someone else wrote our Lease: it is not ours any more.
                        self.fence(&name, "another replica changed the bucket's Lease");
                    }
                    Wrote::Conflict => {
                        tracing::debug!(bucket, lease = %name, "another replica took the bucket's Lease first");
                    }
                    Wrote::Failed(e) => {
                        // The watchdog fences once the renew deadline has passed.
                        tracing::debug!(bucket, lease = %name, error = %e, "writing the bucket's Lease failed");
                    }
                }
            }
            Step::Release { to } => {
                // Fence first, then release: the Lease is free only once we stopped acting.
                if let Some((h, clusters)) = self.take(&name) {
                    h.token.cancel();
                    let released = tokio::time::timeout(timeout, self.release(h.lease)).await;
                    let how = if matches!(released, Ok(Ok(()))) { "released" } else { "fenced" };
                    self.metrics.shard_handovers.get_or_create(&direction(how)).inc_by(clusters.len() as u64);
                    if how == "released" {
                        tracing::info!(bucket, lease = %name, identity = %me, to = %to, clusters = clusters.len(), why = step.why(), "stopped acting on the bucket's clusters and released its Lease");
                    } else {
                        // Stopped acting all the same; the Lease expires for the next owner.
                        tracing::warn!(bucket, lease = %name, identity = %me, to = %to, clusters = clusters.len(), why = step.why(), "stopped acting on the bucket's clusters; releasing its Lease failed, it will expire");
                    }
                }
            }
            Step::Leave { holder } => {
                if held {
                    // We thought we held it, but another replica holds it live now.
                    tracing::debug!(bucket, holder = ?holder, "another replica holds a bucket this replica thought it held");
                    self.fence(&name, "another replica holds the bucket's Lease");
                }
            }
        }
    }

    /// Forget a held bucket and its clusters' grants (their tokens are children of its token).
    fn take(&self, name: &str) -> Option<(Held, Vec<ClusterKey>)> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = state.held.remove(name)?;
        let clusters: Vec<ClusterKey> =
            state.granted.iter().filter(|(_, (n, _))| n == name).map(|(k, _)| k.clone()).collect();
        for k in &clusters {
            state.granted.remove(k);
        }
        self.metrics.shard_owned.set(state.granted.len() as i64);
        Some((held, clusters))
    }

    /// Stop acting on a bucket's clusters now (its token cancelled: their connections end and
    /// their clients refuse every request).
    fn fence(&self, name: &str, why: &str) {
        if let Some((h, clusters)) = self.take(name) {
            h.token.cancel();
            self.metrics.shard_handovers.get_or_create(&direction("fenced")).inc_by(clusters.len() as u64);
            for key in &clusters {
                tracing::error!(cluster = %key, bucket = h.bucket, lease = %name, identity = %self.settings.identity, why, "fenced: stopped acting on the cluster");
            }
            if clusters.is_empty() {
                tracing::warn!(bucket = h.bucket, lease = %name, identity = %self.settings.identity, why, "fenced a bucket without clusters");
            }
        }
    }

    /// Fence every bucket whose Lease was not renewed within the renew deadline. A task of its
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
                self.fence(&name, "could not renew the bucket's Lease within the renew deadline");
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
        let write = self.write(&name, current, &labels, BTreeMap::new());
        match tokio::time::timeout(timeout, write).await {
            Ok(Wrote::Ok(lease)) => {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.member = Some((*lease, sent));
                state.member_since.get_or_insert(sent);
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

    async fn write_bucket(&self, name: &str, current: Option<Lease>, annotations: BTreeMap<String, String>) -> Wrote {
        let count = self.settings.buckets.to_string();
        let labels = [(ROLE_LABEL, "bucket"), (BUCKETS_LABEL, count.as_str())];
        self.write(name, current, &labels, annotations).await
    }

    /// Write `name` held by us, with `annotations` set: replace `current` (carrying its
    /// resourceVersion, so two replicas racing for it cannot both win), or create it. With no copy
    /// at hand, read it first.
    async fn write(
        &self,
        name: &str,
        current: Option<Lease>,
        labels: &[(&str, &str)],
        annotations: BTreeMap<String, String>,
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
                    lease.metadata.annotations.get_or_insert_default().extend(annotations.clone());
                    self.api.replace(name, &PostParams::default(), &lease).await
                }
                None => {
                    let mut all_labels = BTreeMap::from([(HUB_LABEL.to_string(), self.settings.hub_id.clone())]);
                    all_labels.extend(labels.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())));
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.to_string()),
                            labels: Some(all_labels),
                            annotations: (!annotations.is_empty()).then(|| annotations.clone()),
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

    /// Delete the membership Leases of replicas dead for longer than the grace period, and the
    /// Leases of another scheme (an earlier release's per-cluster Leases, buckets of another count)
    /// free or expired as long, each under a resourceVersion precondition (a replica that came back
    /// in between keeps its Lease).
    async fn collect(&self, leases: &[Arc<Lease>], now: Timestamp) {
        let me = sharding::member_lease_name(&self.settings.hub_id, &self.settings.identity);
        for l in leases {
            let collectable = role(l, "member") || self.other_scheme(l);
            if !collectable || l.name_any() == me || !sharding::stale_member(&view(l), now, self.settings.member_grace)
            {
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
                    "deleted a shard Lease free or expired for longer than the grace period (a replica gone, or another scheme's)"
                ),
                // Gone already or renewed meanwhile: another survivor or the replica itself acted.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::debug!(lease = %l.name_any(), error = %plain(&e), "deleting a stale shard Lease failed")
                }
            }
        }
    }

    /// Graceful stop: fence every cluster, release its Lease, delete the membership Lease.
    async fn stop(&self) {
        let (held, granted, member) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut state.held), std::mem::take(&mut state.granted), state.member.take())
        };
        let timeout = self.settings.timings.retry_period;
        for h in held.values() {
            h.token.cancel();
        }
        self.metrics.shard_handovers.get_or_create(&direction("released")).inc_by(granted.len() as u64);
        tracing::info!(buckets = held.len(), clusters = granted.len(), identity = %self.settings.identity, "hub stopping: stopped acting on every cluster; releasing the bucket Leases");
        futures::future::join_all(held.into_values().map(|h| tokio::time::timeout(timeout, self.release(h.lease))))
            .await;
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

fn role(l: &Lease, r: &str) -> bool {
    l.labels().get(ROLE_LABEL).map(String::as_str) == Some(r)
}

fn bucket_of(key: &ClusterKey, buckets: u32) -> u32 {
    shard_buckets::bucket_of(&key.to_string(), buckets)
}

/// A bucket Lease's published weight.
fn weight_of(l: &Lease) -> Option<u64> {
    l.annotations().get(WEIGHT_ANNOTATION).and_then(|w| w.parse().ok())
}

/// One workload cluster a replica identified, as published on its bucket's Lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Identified {
    namespace: String,
    name: String,
    /// [`crate::infra::registry`]'s digest of the cluster's `kube-system` UID.
    uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// The clusters a bucket Lease's holder published; nothing when the annotation is missing, too
/// long or malformed (the holder's next renewal writes it again).
fn identified_of(l: &Lease) -> Vec<Identified> {
    let Some(raw) = l.annotations().get(IDENTIFIED_ANNOTATION) else { return Vec::new() };
    if raw.len() > MAX_IDENTIFIED {
        return Vec::new();
    }
    serde_json::from_str(raw).unwrap_or_default()
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
        let name = shard_buckets::bucket_lease_name("default", 3, shard_buckets::BUCKETS);
        let none = BTreeMap::new;
        let holder = |w: &Wrote| match w {
            Wrote::Ok(l) => l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
            _ => None,
        };
        let api = Api::<Lease>::namespaced(client.clone(), "leases");
        // A takes it (no Lease yet), releases it, and takes it again.
        assert_eq!(holder(&a.write_bucket(&name, None, none()).await), Some("a".to_string()));
        a.release(api.get(&name).await.unwrap()).await.unwrap();
        let free = api.get(&name).await.unwrap();
        let retaken = a.write_bucket(&name, Some(free.clone()), none()).await;
        assert_eq!(holder(&retaken), Some("a".to_string()));
        // B, deciding on no copy (a watch that has not listed it yet), must not take A's live Lease.
        assert!(matches!(b.write_bucket(&name, None, none()).await, Wrote::Conflict));
        // Nor from the older copy that showed it free (the fresh read shows A).
        assert!(matches!(b.write_bucket(&name, Some(free), none()).await, Wrote::Conflict));
        // A renews twice from the same copy: the second, stale, goes through a fresh read.
        let Wrote::Ok(copy) = retaken else { unreachable!() };
        assert_eq!(holder(&a.write_bucket(&name, Some(copy.as_ref().clone()), none()).await), Some("a".into()));
        assert_eq!(holder(&a.write_bucket(&name, Some(*copy), none()).await), Some("a".into()));
        let lease = api.get(&name).await.unwrap();
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("a"));
        server.shutdown().await;
    }
}
