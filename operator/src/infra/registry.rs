//! The cluster registry (hub.md §1, §3): the set of workload clusters, each registered by a
//! `<cluster>-kubeconfig` Secret labelled `cluster.x-k8s.io/cluster-name` in the management cluster.
//!
//! Owns: the label-selected Secret watch, one connection task per (namespace, cluster) started,
//! restarted when its kubeconfig changes (not when only its labels or annotations do) and stopped
//! on removal, and the published [`ClusterStatus`] and
//! [`Connection`] of each. Each cluster's task runs under its own cancellation token, so a slow or
//! dead cluster never delays another. Also which registration speaks for a workload cluster
//! registered more than once in one namespace (identified by the UID of its `kube-system`
//! namespace): the oldest Secret; the others stay `DuplicateCluster` and get no connection until it
//! goes. Namespaces never compete for a cluster (see [`Identities`]).
//! Also Cluster API's pause (hub.md, "Cluster API pause"): the Secret's annotation, and the
//! `Cluster` of the same name followed by [`capi`]; a paused cluster keeps its connection but
//! [`Registry::connection`] hands it to no controller, and its status is `Paused`.
//! Also each cluster's labels (fleet.md §1, [`labels`]): its Secret's over its `Cluster`'s.
//! In sharded mode (hub.md §6) a registered cluster gets a connection only once this replica
//! owns it ([`Registry::grant`]), and controllers get it only while it does: its write clients
//! are fenced by the ownership token, so when ownership ends every write is refused at once; the
//! connection's watches (on a client of their own) are kept a while, unused, for the replica taking
//! it back ([`Settings::keep_unowned`]).
//!
//! Must not: make decisions about nodes (controllers read the connection and decide), delete
//! anything when a Secret disappears (claims and groups stay; NodePools report the cluster
//! missing), keep kubeconfig bytes (only their hardened form, credentials in `secrecy` wrappers),
//! parse a Secret version more than once ([`parsed`]), or let anything a workload cluster's server
//! sent reach a [`ClusterStatus`] message (see [`failure`]).

mod capi;
mod connection;
mod failure;
mod identities;
mod labels;
mod parsed;
pub mod pending;
mod pod_events;
pub mod specs;
mod volumes;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use capi::{GROUP as CLUSTER_API_GROUP, VERSIONS as CLUSTER_API_VERSIONS};
pub use connection::{Connection, WorkloadCache};
pub use failure::Cause;
pub(crate) use identities::{Identities, Rank};
pub use labels::Labels;
pub(crate) use labels::Sources as LabelSources;
pub use pod_events::NodePods;
pub use volumes::{OptionalStore, VolumeCaches};

use crate::{
    decisions::handover::{self, HandoverError},
    decisions::pause::{self, Pause, PausedBy},
    infra::kubeconfig,
};

/// Cluster API's label naming the cluster a kubeconfig Secret is for.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The data key holding the kubeconfig.
pub const KUBECONFIG_KEY: &str = "value";

/// A registered workload cluster: the Secret's namespace and the cluster name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl ClusterKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// The registration Secret's name.
    pub fn secret_name(&self) -> String {
        format!("{}-kubeconfig", self.name)
    }
}

/// The `ClusterReachable` reasons of hub.md §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    SecretMissing,
    InvalidKubeconfig,
    Unauthorized,
    Unreachable,
    NodeGroupApiNotServed,
    /// The same workload cluster (same `kube-system` UID) is registered by an older Secret: this
    /// registration gets no connection, so no controller acts on it twice.
    DuplicateCluster,
    /// Cluster API's pause (the registration Secret's annotation, or the Cluster's): the hub takes
    /// no action on the cluster, whatever the state of its connection.
    Paused,
    /// The registration declares a move ([`crate::decisions::handover`]) this hub cannot honour
    /// (malformed, or from another hub id): no action is taken on the cluster until it is fixed.
    HandoverRefused,
    Syncing,
    Connected,
}

impl Phase {
    pub const ALL: [Phase; 10] = [
        Phase::SecretMissing,
        Phase::InvalidKubeconfig,
        Phase::Unauthorized,
        Phase::Unreachable,
        Phase::NodeGroupApiNotServed,
        Phase::DuplicateCluster,
        Phase::Paused,
        Phase::HandoverRefused,
        Phase::Syncing,
        Phase::Connected,
    ];

    /// The phase a condition reason names.
    pub fn from_reason(reason: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.reason() == reason)
    }

    /// The condition reason.
    pub fn reason(self) -> &'static str {
        match self {
            Phase::SecretMissing => "SecretMissing",
            Phase::InvalidKubeconfig => "InvalidKubeconfig",
            Phase::Unauthorized => "Unauthorized",
            Phase::Unreachable => "Unreachable",
            Phase::NodeGroupApiNotServed => "NodeGroupAPINotServed",
            Phase::DuplicateCluster => "DuplicateCluster",
            Phase::Paused => "Paused",
            Phase::HandoverRefused => "HandoverRefused",
            Phase::Syncing => "Syncing",
            Phase::Connected => "Connected",
        }
    }
}

/// What a user sees about one cluster. Never holds credentials, nor anything the cluster's server
/// sent: the message is the hub's own words, the kubeconfig's server and at most an HTTP status
/// code, as it reaches the tenant (NodePool condition, events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    pub phase: Phase,
    pub message: String,
    /// Why the last request failed, for the hub's log only: the tenant is not told which of the
    /// failures below HTTP it was ([`failure`]'s comment says why).
    pub cause: Option<Cause>,
}

impl ClusterStatus {
    fn new(phase: Phase, message: impl Into<String>) -> Self {
        Self { phase, message: message.into(), cause: None }
    }
}

/// Tunables of the connection lifecycle (hub flags).
#[derive(Debug, Clone)]
pub struct Settings {
    pub kubeconfig_policy: kubeconfig::Policy,
    /// Time between health probes (default 10 s).
    pub probe_interval: Duration,
    /// Timeout of one probe and of connect/read on the client (default 5 s).
    pub probe_timeout: Duration,
    /// Consecutive failed probes before the cluster is marked unreachable (default 5).
    pub failure_threshold: u32,
    /// Reconnect back-off bounds.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Only watch Secrets in this namespace (default: all namespaces).
    pub namespace: Option<String>,
    /// Without `namespace`: watch Secrets in these namespaces only, one watch each (the hub's
    /// Secret rights bound per namespace). Empty: all namespaces.
    pub registration_namespaces: Vec<String>,
    /// Sharded mode: connect only to the clusters this replica is granted (hub.md §6).
    pub sharded: bool,
    /// Fence every workload client by the registry's shutdown token (leader election: once the
    /// leader stops, a request already under way in a finishing reconcile is refused too).
    pub fence_on_shutdown: bool,
    /// Sharded mode: how long a cluster's connection and caches are kept, fenced and unused, after
    /// its ownership ended, so that the same replica taking it back (a renewal late past the renew
    /// deadline, then on time again) does not list the cluster anew (default 30 s: the shard Lease
    /// duration, after which another replica may have taken it).
    pub keep_unowned: Duration,
    /// While the management API does not serve Cluster API's `Cluster`, how often to look again
    /// (default 5 min).
    pub cluster_api_recheck: Duration,
    /// Sharded mode: this replica's identity, named in the workload clients' `User-Agent`
    /// ([`crate::infra::identify_replica`]).
    pub replica: Option<String>,
    /// This hub's id and management cluster, against which a registration's declared move is
    /// checked ([`handover::honoured`]).
    pub hub_id: String,
    pub management_cluster: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            kubeconfig_policy: kubeconfig::Policy::default(),
            probe_interval: Duration::from_secs(10),
            probe_timeout: Duration::from_secs(5),
            failure_threshold: 5,
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(60),
            namespace: None,
            registration_namespaces: Vec::new(),
            sharded: false,
            fence_on_shutdown: false,
            keep_unowned: Duration::from_secs(30),
            replica: None,
            cluster_api_recheck: Duration::from_secs(300),
            hub_id: "default".to_string(),
            management_cluster: String::new(),
        }
    }
}

/// Errors that stop the registry itself (never a single cluster's problem).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("watching kubeconfig Secrets in the management cluster failed: {}", crate::infra::apierror::plain_watch(.0))]
    Watch(#[from] watcher::Error),
}

struct Entry {
    /// The kubeconfig the connection was made with ([`fingerprint`]): a Secret changed elsewhere
    /// (labels, annotations) keeps its connection.
    secret_data: Fingerprint,
    cancel: CancellationToken,
    status: watch::Receiver<ClusterStatus>,
    connection: watch::Receiver<Option<Arc<Connection>>>,
    /// The token the connection's write clients are fenced by; sharded mode sends a new one when
    /// ownership is granted again while the connection is kept.
    fence: Option<watch::Sender<CancellationToken>>,
}

/// The registry: cheap to clone, shared by every controller.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

/// A registration Secret as last seen, kept in sharded mode so a cluster can be connected when
/// ownership is granted later.
struct Known {
    fingerprint: Fingerprint,
    kubeconfig: Option<parsed::Parsed>,
    rank: Rank,
}

struct Inner {
    settings: Settings,
    /// Every registration Secret seen (all of them, owned or not).
    known: RwLock<BTreeMap<ClusterKey, Known>>,
    /// Sharded mode: the clusters this replica owns, by ownership token.
    owned: RwLock<BTreeMap<ClusterKey, CancellationToken>>,
    /// The management client and the registry's shutdown token, once [`Registry::run`] started.
    context: RwLock<Option<(Client, CancellationToken)>>,
    /// Sharded mode: whether this replica writes what belongs to no registered cluster (it holds
    /// the hub's leader Lease).
    namespace_writer: std::sync::atomic::AtomicBool,
    metrics: Arc<crate::infra::metrics::Metrics>,
    clusters: RwLock<BTreeMap<ClusterKey, Entry>>,
    /// Cluster API's pause of each cluster, from its Secret and its `Cluster` ([`capi`]). A paused
    /// cluster keeps its connection (caches stay warm, so resuming is immediate) but no controller
    /// gets it: [`Registry::connection`] answers `None`.
    pauses: RwLock<BTreeMap<ClusterKey, Pause>>,
    /// Each cluster's labels, from its Secret and its `Cluster` ([`labels`]).
    labels: RwLock<BTreeMap<ClusterKey, labels::Sources>>,
    /// Whether the Cluster API `Cluster`s' labels have been read once in every scope (or are known
    /// not to be there): before that, a cluster missing a label may only not have it *yet*.
    labels_settled: std::sync::atomic::AtomicBool,
    /// Each registration's declared move, when it matters: the source management cluster whose
    /// groups the cluster's controllers take over, or why the declaration is refused (then, like a
    /// pause, no controller gets the cluster).
    handovers: RwLock<BTreeMap<ClusterKey, Result<String, HandoverError>>>,
    identities: Arc<Identities>,
    /// Each registration's kubeconfig, hardened once per Secret version.
    parses: Arc<parsed::Parses>,
    /// Order in which this process first saw each registration (ties of creation time).
    seen: std::sync::atomic::AtomicU64,
    /// Bumped on every status or connection change of any cluster, so controllers can wake up.
    changes: watch::Sender<u64>,
    touched: tokio::sync::broadcast::Sender<connection::Touched>,
    pod_events: tokio::sync::broadcast::Sender<NodePods>,
    /// The key of each cluster whose connection just became synced (see [`Registry::synced`]).
    synced: tokio::sync::broadcast::Sender<ClusterKey>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("clusters", &self.clusters()).finish()
    }
}

impl Registry {
    pub fn new(settings: Settings) -> Self {
        Self::with_metrics(settings, Arc::new(crate::infra::metrics::Metrics::new()))
    }

    /// A registry whose connections report probe results and watch restarts into `metrics`.
    pub fn with_metrics(settings: Settings, metrics: Arc<crate::infra::metrics::Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                metrics,
                known: RwLock::new(BTreeMap::new()),
                owned: RwLock::new(BTreeMap::new()),
                context: RwLock::new(None),
                namespace_writer: std::sync::atomic::AtomicBool::new(false),
                clusters: RwLock::new(BTreeMap::new()),
                pauses: RwLock::new(BTreeMap::new()),
                labels: RwLock::new(BTreeMap::new()),
                labels_settled: std::sync::atomic::AtomicBool::new(false),
                handovers: RwLock::new(BTreeMap::new()),
                identities: Arc::new(Identities::default()),
                parses: Arc::new(parsed::Parses::default()),
                seen: std::sync::atomic::AtomicU64::new(0),
                changes: watch::channel(0).0,
                touched: tokio::sync::broadcast::channel(1024).0,
                pod_events: tokio::sync::broadcast::channel(1024).0,
                synced: tokio::sync::broadcast::channel(1024).0,
            }),
        }
    }

    /// Nodes and NodeGroups changing in any cluster (lossy under bursts: the periodic checks of
    /// the controllers remain the backstop).
    pub fn touched(&self) -> impl futures::Stream<Item = connection::Touched> + Send + use<> {
        lossy(self.inner.touched.subscribe())
    }

    /// Pods bound to a node, ended or starting to terminate in any cluster, by node (lossy as
    /// [`Registry::touched`]; a channel of their own, so a burst of pods never crowds out the
    /// NodeGroup verdicts a launch waits for).
    pub fn pod_events(&self) -> impl futures::Stream<Item = NodePods> + Send + use<> {
        lossy(self.inner.pod_events.subscribe())
    }

    /// Each cluster whose connection just became synced: connected first, reconnected after a
    /// failure or a rotation, or (sharded mode) newly owned by this replica, since ownership starts
    /// a connection, or owned again over kept caches (new write clients); and each registered
    /// cluster whose labels changed (fleet pools may have begun or stopped serving it). Lets a controller wake only that cluster's objects, where
    /// [`Registry::change_stream`] would wake the whole fleet's. Should the subscriber lag behind,
    /// every cluster synced at that moment is yielded instead: a wake too many, never one lost.
    pub fn synced(&self) -> impl futures::Stream<Item = ClusterKey> + Send + use<> {
        let rx = self.inner.synced.subscribe();
        let registry = self.clone();
        futures::stream::unfold(rx, move |mut rx| {
            let registry = registry.clone();
            async move {
                match rx.recv().await {
                    Ok(key) => Some((vec![key], rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let all = registry
                            .clusters()
                            .into_iter()
                            .filter(|k| registry.connection(k).is_some_and(|c| c.is_synced()))
                            .collect();
                        Some((all, rx))
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
                }
            }
        })
        .flat_map(futures::stream::iter)
    }

    /// The clusters this replica serves, sorted: every registered cluster, or in sharded mode
    /// those it owns. Per-cluster controllers iterate these.
    pub fn clusters(&self) -> Vec<ClusterKey> {
        let clusters = self.inner.clusters.read().unwrap_or_else(PoisonError::into_inner);
        // Sharded mode keeps an unowned cluster's connection a while (see `keep_unowned`): it is
        // no cluster of this replica's then.
        clusters.keys().filter(|k| !self.is_sharded() || self.owns(k)).cloned().collect()
    }

    /// Every registered cluster (a registration Secret exists), owned here or not, sorted.
    pub fn registered(&self) -> Vec<ClusterKey> {
        self.inner.known.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Pods in a connected cluster's cache (paused or not), `None` until its caches synced: the
    /// weight sharded mode places the cluster's bucket by.
    pub fn pods(&self, key: &ClusterKey) -> Option<usize> {
        let clusters = self.inner.clusters.read().unwrap_or_else(PoisonError::into_inner);
        let conn = clusters.get(key)?.connection.borrow().clone()?;
        conn.is_synced().then(|| conn.cache.pods.len())
    }

    /// Sharded mode: the workload clusters this replica identified among `keys` (a digest of each
    /// one's `kube-system` UID, and its Secret's creation time), to publish on their bucket's Lease
    /// so that registrations of one cluster on different replicas meet in the duplicate check.
    pub fn identified(&self, keys: &BTreeSet<ClusterKey>) -> BTreeMap<ClusterKey, (String, Option<Time>)> {
        self.inner.identities.claimed(|k| keys.contains(k)).into_iter().map(|(k, (d, r))| (k, (d, r.created))).collect()
    }

    /// Sharded mode: what the other replicas published (see [`Registry::identified`]); the
    /// connections re-check whether an older registration now speaks for their cluster.
    pub fn set_identified_elsewhere(&self, remote: BTreeMap<ClusterKey, (String, Option<Time>)>) {
        let remote = remote.into_iter().map(|(k, (d, created))| (k, (d, Rank { created, seen: 0 }))).collect();
        if self.inner.identities.set_remote(remote) {
            self.notify();
        }
    }

    /// Whether the registry runs in sharded mode.
    pub fn is_sharded(&self) -> bool {
        self.inner.settings.sharded
    }

    /// Whether this replica acts for cluster `key` (its claims, pools, NodeGroups): always in
    /// single-leader mode; in sharded mode while it owns the cluster, or, for a cluster nobody
    /// registered (its pools only report it missing), while it is the namespace-wide writer.
    pub fn writes_for(&self, key: &ClusterKey) -> bool {
        if !self.is_sharded() {
            return true;
        }
        if self.inner.known.read().unwrap_or_else(PoisonError::into_inner).contains_key(key) {
            self.owns(key)
        } else {
            self.is_namespace_writer()
        }
    }

    /// Sharded mode: whether this replica owns `key` now (its ownership token is live).
    pub fn owns(&self, key: &ClusterKey) -> bool {
        self.inner.owned.read().unwrap_or_else(PoisonError::into_inner).get(key).is_some_and(|t| !t.is_cancelled())
    }

    /// Whether this replica writes the namespace-wide state: always in single-leader mode (the
    /// whole process runs under the leader Lease), in sharded mode while it holds the leader Lease.
    pub fn is_namespace_writer(&self) -> bool {
        !self.is_sharded() || self.inner.namespace_writer.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sharded mode: this replica became (or stopped being) the namespace-wide writer.
    pub fn set_namespace_writer(&self, writer: bool) {
        self.inner.namespace_writer.store(writer, std::sync::atomic::Ordering::Relaxed);
        self.notify();
    }

    /// The connection phase of `key` as this replica knows it, else as its owner reported it
    /// (`reported`: the `ClusterReachable` reason of one of its NodePools), for readers of
    /// clusters owned by another replica in sharded mode.
    pub fn phase_or_reported(&self, key: &ClusterKey, reported: Option<&str>) -> Phase {
        let known_elsewhere = self.is_sharded()
            && !self.owns(key)
            && self.inner.known.read().unwrap_or_else(PoisonError::into_inner).contains_key(key);
        if known_elsewhere {
            return reported.and_then(Phase::from_reason).unwrap_or(Phase::Syncing);
        }
        self.status(key).phase
    }

    /// Sharded mode: this replica now owns `key` until `ownership` is cancelled. The cluster's
    /// write clients are fenced by that token; when it is cancelled, the cluster leaves
    /// [`Registry::clusters`] at once and its connection is kept, unused, for
    /// [`Settings::keep_unowned`]: granted again within that time, the connection carries on with
    /// its caches as they are and new write clients fenced by the new token; else it ends.
    pub fn grant(&self, key: &ClusterKey, ownership: CancellationToken) {
        self.inner.owned.write().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), ownership.clone());
        let kept = {
            let clusters = self.inner.clusters.read().unwrap_or_else(PoisonError::into_inner);
            clusters
                .get(key)
                .filter(|e| !e.cancel.is_cancelled())
                .and_then(|e| e.fence.as_ref())
                .map(|fence| fence.send_replace(ownership.clone()))
                .is_some()
        };
        if kept {
            tracing::info!(cluster = %key, "owned again: the kept connection and its caches carry on under the new ownership");
            self.notify();
        } else {
            let context = self.inner.context.read().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some((mgmt, shutdown)) = context {
                self.connect(&mgmt, key, &shutdown);
            }
        }
        let (registry, key) = (self.clone(), key.clone());
        tokio::spawn(async move {
            ownership.cancelled().await;
            registry.ownership_ended(&key);
        });
    }

    /// The ownership of `key` was cancelled (its write clients refuse every request already):
    /// the cluster leaves [`Registry::clusters`]; its connection ends after
    /// [`Settings::keep_unowned`] unless a newer grant came meanwhile.
    fn ownership_ended(&self, key: &ClusterKey) {
        {
            let mut owned = self.inner.owned.write().unwrap_or_else(PoisonError::into_inner);
            if owned.get(key).is_some_and(CancellationToken::is_cancelled) {
                owned.remove(key);
            }
        }
        tracing::info!(cluster = %key, keep_seconds = self.inner.settings.keep_unowned.as_secs_f64(), "no longer owned by this replica: its clients refuse every write; its caches are kept a while in case it comes back");
        self.notify();
        let (registry, key) = (self.clone(), key.clone());
        let keep = self.inner.settings.keep_unowned;
        tokio::spawn(async move {
            tokio::time::sleep(keep).await;
            registry.disown(&key);
        });
    }

    /// Sharded mode: end the kept connection of `key` now, unless this replica owns it again (the
    /// sharder calls this once another replica holds the cluster's bucket).
    pub fn disown(&self, key: &ClusterKey) {
        let removed = {
            let mut clusters = self.inner.clusters.write().unwrap_or_else(PoisonError::into_inner);
            // Under the clusters lock: a grant checks ownership first, then this table.
            if self.owns(key) { None } else { clusters.remove(key) }
        };
        if let Some(e) = removed {
            e.cancel.cancel();
            self.inner.identities.release(key);
            tracing::info!(cluster = %key, "not owned by this replica: its connection is closed");
            self.notify();
        }
    }

    /// The status of a cluster; `SecretMissing` when it is not registered, `Paused` while Cluster
    /// API pauses it (whatever its connection's state).
    pub fn status(&self, key: &ClusterKey) -> ClusterStatus {
        let clusters = self.inner.clusters.read().unwrap_or_else(PoisonError::into_inner);
        if clusters.contains_key(key)
            && let Some(by) = self.paused_by(key)
        {
            return ClusterStatus::new(
                Phase::Paused,
                by.describe(&format!("{}/{}", key.namespace, key.secret_name()), &key.to_string()),
            );
        }
        if clusters.contains_key(key)
            && let Some(Err(e)) = self.inner.handovers.read().unwrap_or_else(PoisonError::into_inner).get(key)
        {
            return ClusterStatus::new(
                Phase::HandoverRefused,
                format!("no action is taken on this cluster: the Secret {}/{}: {e}", key.namespace, key.secret_name()),
            );
        }
        clusters.get(key).map_or_else(
            || {
                ClusterStatus::new(
                    Phase::SecretMissing,
                    format!(
                        "no Secret {}/{} labelled {CLUSTER_NAME_LABEL}={} with the kubeconfig under key `{KUBECONFIG_KEY}`",
                        key.namespace,
                        key.secret_name(),
                        key.name
                    ),
                )
            },
            |e| e.status.borrow().clone(),
        )
    }

    /// The live connection of a cluster, when it is connected (it may still be syncing: check
    /// [`Connection::is_synced`] before deciding anything) and not paused: every controller reaches
    /// a workload cluster through this, so a paused cluster gets no decision and no write.
    pub fn connection(&self, key: &ClusterKey) -> Option<Arc<Connection>> {
        if (self.is_sharded() && !self.owns(key))
            || self.paused_by(key).is_some()
            || self.inner.handovers.read().unwrap_or_else(PoisonError::into_inner).get(key).is_some_and(Result::is_err)
        {
            return None;
        }
        self.inner
            .clusters
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .and_then(|e| e.connection.borrow().clone())
    }

    /// The management cluster `key` was declared moved from, when this hub honours it: its
    /// NodeGroups are taken over ([`crate::decisions::ownership::Ownership::Moved`]).
    pub fn moved_from(&self, key: &ClusterKey) -> Option<String> {
        self.inner.handovers.read().unwrap_or_else(PoisonError::into_inner).get(key).and_then(|h| h.clone().ok())
    }

    /// Record `key`'s declared move from its Secret's annotations; one log line when it changes.
    fn set_handover(&self, key: &ClusterKey, annotations: Option<&BTreeMap<String, String>>) {
        let settings = &self.inner.settings;
        let parsed = handover::parse(annotations);
        let now = match &parsed {
            Ok(moved) => handover::honoured(moved.as_ref(), &settings.hub_id, &settings.management_cluster)
                .map(|source| source.map(str::to_string))
                .transpose(),
            Err(e) => Some(Err(e.clone())),
        };
        let before = {
            let mut handovers = self.inner.handovers.write().unwrap_or_else(PoisonError::into_inner);
            match now.clone() {
                Some(h) => handovers.insert(key.clone(), h),
                None => handovers.remove(key),
            }
        };
        if before == now {
            return;
        }
        match &now {
            Some(Ok(source)) => {
                tracing::info!(cluster = %key, moved_from = %source, "the registration declares the cluster moved from another management cluster: its NodeGroups are taken over as their NodeClaims arrive")
            }
            Some(Err(e)) => {
                tracing::warn!(cluster = %key, error = %e, "HandoverRefused: no action is taken on the cluster")
            }
            None => tracing::info!(cluster = %key, "the registration declares no move (any more)"),
        }
        self.notify();
    }

    /// Why Cluster API pauses cluster `key`, if it does.
    pub fn paused_by(&self, key: &ClusterKey) -> Option<PausedBy> {
        self.inner.pauses.read().unwrap_or_else(PoisonError::into_inner).get(key).and_then(|p| p.paused_by())
    }

    /// Update what is known of `key`'s pause. When that pauses or resumes the cluster: one log
    /// line, every controller woken, and on resume its claims too (as when it syncs), so decisions
    /// start again at once on the connection kept warm meanwhile.
    pub(crate) fn set_pause(&self, key: &ClusterKey, update: impl FnOnce(&mut Pause)) {
        let (before, after) = {
            let mut pauses = self.inner.pauses.write().unwrap_or_else(PoisonError::into_inner);
            let mut p = pauses.get(key).copied().unwrap_or_default();
            let before = p.paused_by();
            update(&mut p);
            if p == Pause::default() {
                pauses.remove(key);
            } else {
                pauses.insert(key.clone(), p);
            }
            (before, p.paused_by())
        };
        if before == after {
            return;
        }
        match after {
            Some(by) => {
                tracing::info!(cluster = %key, by = ?by, "workload cluster paused by Cluster API; no action is taken on it")
            }
            None => tracing::info!(cluster = %key, "workload cluster resumed by Cluster API"),
        }
        self.notify();
        if after.is_none() && self.connection(key).is_some_and(|c| c.is_synced()) {
            let _ = self.inner.synced.send(key.clone());
        }
    }

    /// The clusters whose `Cluster` pauses them, for the Cluster watch's relists.
    pub(crate) fn paused_by_cluster(&self) -> Vec<ClusterKey> {
        self.inner
            .pauses
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, p)| p.cluster.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Cluster `key`'s labels (fleet.md §1): its registration Secret's over its Cluster API
    /// `Cluster`'s.
    pub fn labels(&self, key: &ClusterKey) -> Labels {
        self.inner
            .labels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(labels::Sources::merged)
            .unwrap_or_default()
    }

    /// Update what a source says of `key`'s labels. When that changes them: one log line (for a
    /// registered cluster) and every controller woken.
    pub(crate) fn set_labels(&self, key: &ClusterKey, update: impl FnOnce(&mut labels::Sources)) {
        let (before, after) = {
            let mut all = self.inner.labels.write().unwrap_or_else(PoisonError::into_inner);
            let mut sources = all.get(key).cloned().unwrap_or_default();
            let before = sources.merged();
            update(&mut sources);
            let after = sources.merged();
            if sources == labels::Sources::default() {
                all.remove(key);
            } else {
                all.insert(key.clone(), sources);
            }
            (before, after)
        };
        if before == after {
            return;
        }
        if self.inner.known.read().unwrap_or_else(PoisonError::into_inner).contains_key(key) {
            tracing::info!(cluster = %key, labels = %labels::render(&after), "workload cluster labels changed");
            // Fleet pools may serve it now, or no longer: its claims and its disruption loop look
            // again at once, as after a sync.
            let _ = self.inner.synced.send(key.clone());
        }
        self.notify();
    }

    /// Whether every source of cluster labels has been read once: Secrets are (a cluster is known
    /// only from its Secret), and Cluster API's `Cluster`s have been listed in every scope, or are
    /// not served, or may not be read. Until then no cluster counts as having left a fleet pool's
    /// selection (its `Cluster`'s labels may be about to arrive).
    pub fn labels_settled(&self) -> bool {
        self.inner.labels_settled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The Cluster watch has read every scope once (or found it has nothing to read).
    pub(crate) fn settle_labels(&self) {
        if !self.inner.labels_settled.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.notify();
        }
    }

    /// The clusters whose `Cluster` gives them labels, for the Cluster watch's relists.
    pub(crate) fn labelled_by_cluster(&self) -> Vec<ClusterKey> {
        self.inner
            .labels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, l)| l.cluster.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A receiver that changes whenever any cluster's status or connection changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// A stream yielding once per change of any cluster, for controllers that re-check every object
    /// when a cluster connects or fails (`Controller::reconcile_all_on`).
    pub fn change_stream(&self) -> impl futures::Stream<Item = ()> + Send + use<> {
        futures::stream::unfold(self.changes(), |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) })
    }

    /// Watch registration Secrets until `shutdown`, then stop every cluster.
    pub async fn run(&self, mgmt: Client, shutdown: CancellationToken) -> Result<(), RegistryError> {
        // One watch over all namespaces, or one per namespace served (each relists on its own).
        let settings = &self.inner.settings;
        let scopes: Vec<Option<String>> = match &settings.namespace {
            Some(ns) => vec![Some(ns.clone())],
            None if !settings.registration_namespaces.is_empty() => {
                settings.registration_namespaces.iter().cloned().map(Some).collect()
            }
            None => vec![None],
        };
        // Label-selected: the hub never caches other Secrets, and holds none of them after an event.
        *self.inner.context.write().unwrap_or_else(PoisonError::into_inner) = Some((mgmt.clone(), shutdown.clone()));
        let config = watcher::Config::default().labels(CLUSTER_NAME_LABEL);
        // Cluster API's Clusters, read-only, in the same namespaces (a child task: it ends with
        // the hub even when this one is aborted).
        tokio::spawn(capi::run(
            self.clone(),
            mgmt.clone(),
            scopes.clone(),
            settings.cluster_api_recheck,
            shutdown.child_token(),
        ));
        let mut events = futures::stream::select_all(scopes.into_iter().map(|scope| {
            let secrets: Api<Secret> = match &scope {
                Some(ns) => Api::namespaced(mgmt.clone(), ns),
                None => Api::all(mgmt.clone()),
            };
            watcher(secrets, config.clone()).default_backoff().map(move |e| (scope.clone(), e)).boxed()
        }));
        let mut listed: HashMap<Option<String>, Vec<ClusterKey>> = HashMap::new();
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => break,
                e = events.next() => e,
            };
            let Some((scope, event)) = event else { break };
            match event {
                Err(e) => {
                    tracing::warn!(namespace = scope.as_deref().unwrap_or("(all)"), error = %crate::infra::apierror::plain_watch(&e), "kubeconfig Secret watch failed; retrying")
                }
                Ok(watcher::Event::Init) => {
                    listed.insert(scope, Vec::new());
                }
                Ok(watcher::Event::InitApply(s)) => {
                    if let Some(key) = self.apply(&mgmt, &s, &shutdown)
                        && let Some(l) = listed.get_mut(&scope)
                    {
                        l.push(key);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    // A relist: clusters of this watch's scope whose Secret is no longer there were
                    // removed while the watch was down.
                    if let Some(seen) = listed.remove(&scope) {
                        let in_scope = |key: &ClusterKey| scope.as_ref().is_none_or(|ns| *ns == key.namespace);
                        for key in self.registered() {
                            if in_scope(&key) && !seen.contains(&key) {
                                self.remove(&key, "its Secret is gone");
                            }
                        }
                    }
                }
                Ok(watcher::Event::Apply(s)) => {
                    self.apply(&mgmt, &s, &shutdown);
                }
                Ok(watcher::Event::Delete(s)) => {
                    if let Some(key) = registration_key(&s) {
                        self.remove(&key, "its Secret was deleted");
                    }
                }
            }
        }
        for key in self.registered() {
            self.remove(&key, "the hub is stopping");
        }
        Ok(())
    }

    /// Start or restart the cluster a Secret registers. Returns its key when the Secret is a registration.
    /// The cluster's task runs under a child of `shutdown`, so it ends with the hub even when
    /// [`Registry::run`] itself is aborted rather than left through its own shutdown path.
    fn apply(&self, mgmt: &Client, secret: &Secret, shutdown: &CancellationToken) -> Option<ClusterKey> {
        let key = registration_key(secret)?;
        let paused = pause::secret_pauses(secret.metadata.annotations.as_ref());
        self.set_pause(&key, |p| p.secret = paused);
        self.set_handover(&key, secret.metadata.annotations.as_ref());
        let fingerprint = fingerprint(secret);
        let parsed = self.inner.parses.get(&key, secret, self.inner.settings.kubeconfig_policy);
        {
            let mut known = self.inner.known.write().unwrap_or_else(PoisonError::into_inner);
            let rank = known.get(&key).map_or_else(
                || Rank {
                    created: secret.metadata.creation_timestamp.clone(),
                    // Sharded mode ranks registrations across replicas, which do not share this
                    // count: ties of creation time then go by key, alike on every replica.
                    seen: if self.is_sharded() {
                        0
                    } else {
                        self.inner.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    },
                },
                |k| k.rank.clone(),
            );
            let added = !known.contains_key(&key);
            known.insert(key.clone(), Known { fingerprint, kubeconfig: parsed, rank });
            if added && self.is_sharded() {
                // The sharder decides who owns it.
                self.notify();
            }
        }
        // After `known` (the log line of a change names registered clusters only).
        self.set_labels(&key, |l| l.secret = secret.metadata.labels.clone().unwrap_or_default());
        if let Some(e) = self.inner.clusters.read().unwrap_or_else(PoisonError::into_inner).get(&key)
            && e.secret_data == fingerprint
        {
            return Some(key);
        }
        self.connect(mgmt, &key, shutdown);
        Some(key)
    }

    /// Start or restart the connection of a known cluster: under `shutdown`, or in sharded mode
    /// only while owned, under the ownership token (and fenced by it).
    fn connect(&self, mgmt: &Client, key: &ClusterKey, shutdown: &CancellationToken) {
        let fence = if self.is_sharded() {
            let owned = self.inner.owned.read().unwrap_or_else(PoisonError::into_inner).get(key).cloned();
            match owned.filter(|t| !t.is_cancelled()) {
                Some(t) => Some(t),
                None => {
                    // Not owned: a connection kept from before (its Secret changed since) goes.
                    self.disown(key);
                    return;
                }
            }
        } else {
            self.inner.settings.fence_on_shutdown.then(|| shutdown.clone())
        };
        let Some((fingerprint, parsed, rank)) = self
            .inner
            .known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|k| (k.fingerprint, k.kubeconfig.clone(), k.rank.clone()))
        else {
            return;
        };
        let key = key.clone();
        // The connection lives until the hub stops, its Secret changes or goes, or (sharded
        // mode) its kept time after the ownership ended runs out; the fence only stops writes.
        let cancel = shutdown.child_token();
        let (fence_tx, fence_rx) = match fence {
            Some(t) => {
                let (tx, rx) = watch::channel(t);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let (status_tx, status_rx) = watch::channel(ClusterStatus::new(Phase::Syncing, "connecting"));
        let (conn_tx, conn_rx) = watch::channel(None);
        let replaced = self.inner.clusters.write().unwrap_or_else(PoisonError::into_inner).insert(
            key.clone(),
            Entry {
                secret_data: fingerprint,
                cancel: cancel.clone(),
                status: status_rx,
                connection: conn_rx,
                fence: fence_tx,
            },
        );
        let rotated = replaced.is_some();
        if let Some(old) = replaced {
            old.cancel.cancel();
        }
        tracing::info!(cluster = %key, rotated, "workload cluster registered; connecting");
        let task = connection::Task {
            key: key.clone(),
            kubeconfig: parsed,
            parses: self.inner.parses.clone(),
            settings: self.inner.settings.clone(),
            metrics: self.inner.metrics.clone(),
            mgmt: mgmt.clone(),
            status: status_tx,
            connection: conn_tx,
            changes: self.inner.changes.clone(),
            touched: self.inner.touched.clone(),
            pod_events: self.inner.pod_events.clone(),
            synced: self.inner.synced.clone(),
            identities: self.inner.identities.clone(),
            rank,
            cancel,
            fence: fence_rx,
        };
        tokio::spawn(task.run());
        self.notify();
    }

    fn remove(&self, key: &ClusterKey, why: &str) {
        let known = self.inner.known.write().unwrap_or_else(PoisonError::into_inner).remove(key);
        self.inner.parses.forget(key);
        self.set_pause(key, |p| p.secret = false);
        self.set_handover(key, None);
        self.set_labels(key, |l| l.secret = Labels::new());
        let removed = self.inner.clusters.write().unwrap_or_else(PoisonError::into_inner).remove(key);
        if known.is_some() && removed.is_none() {
            // Registered but not owned here (sharded mode): the sharder releases nothing of it.
            self.notify();
        }
        if let Some(e) = removed {
            e.cancel.cancel();
            // A duplicate registration of the same cluster may take over now.
            self.inner.identities.release(key);
            tracing::info!(cluster = %key, why, "workload cluster unregistered; its NodeClaims and NodeGroups are left in place");
            self.notify();
        }
    }

    fn notify(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// What of a registration Secret its connection is made from: a digest of its kubeconfig (`None`
/// when it has none), and of its UID, so a Secret deleted and created again connects anew.
type Fingerprint = Option<[u8; 32]>;

fn fingerprint(secret: &Secret) -> Fingerprint {
    use sha2::Digest;
    let value = secret.data.as_ref()?.get(KUBECONFIG_KEY)?;
    let mut digest = sha2::Sha256::new();
    digest.update(secret.metadata.uid.as_deref().unwrap_or_default().as_bytes());
    digest.update([0]);
    digest.update(&value.0);
    Some(digest.finalize().into())
}

/// The cluster a Secret registers: labelled, and named `<cluster>-kubeconfig` (Cluster API's
/// convention; a labelled Secret with another name is someone else's and is ignored).
fn registration_key(secret: &Secret) -> Option<ClusterKey> {
    registered_by(&secret.metadata)
}

/// [`registration_key`] from the Secret's metadata alone (what a reader that must not fetch
/// kubeconfigs lists).
pub fn registered_by(metadata: &kube::api::ObjectMeta) -> Option<ClusterKey> {
    let cluster = metadata.labels.as_ref()?.get(CLUSTER_NAME_LABEL)?;
    let name = metadata.name.as_deref()?;
    let namespace = metadata.namespace.as_deref()?;
    if name != format!("{cluster}-kubeconfig") {
        tracing::debug!(namespace, secret = name, cluster = %cluster, "labelled Secret is not a registration (name is not <cluster>-kubeconfig)");
        return None;
    }
    Some(ClusterKey::new(namespace, cluster.clone()))
}

/// A broadcast receiver as a stream that skips what it missed while lagging.
pub(crate) fn lossy<T: Clone + Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(t) => return Some((t, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn secret(name: &str, cluster: Option<&str>) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team-a".into()),
                labels: cluster.map(|c| BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), c.to_string())])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_labelled_secrets_named_after_their_cluster_register_it() {
        assert_eq!(registration_key(&secret("prod-kubeconfig", Some("prod"))), Some(ClusterKey::new("team-a", "prod")));
        assert_eq!(registration_key(&secret("prod-kubeconfig", None)), None);
        assert_eq!(registration_key(&secret("prod-ca", Some("prod"))), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_tasks_end_with_the_hub_even_when_the_registry_task_is_aborted() {
        use kube::api::PostParams;
        use sim::apiserver::{ApiServer, ApiServerConfig};
        let mgmt = ApiServer::start(ApiServerConfig::new("management")).await.unwrap();
        let workload = ApiServer::start(ApiServerConfig::workload("alpha")).await.unwrap();
        let mut s = secret("alpha-kubeconfig", Some("alpha"));
        s.metadata.namespace = Some("default".into());
        let kubeconfig = serde_json::to_vec(&workload.kubeconfig()).unwrap();
        s.data = Some(BTreeMap::from([(KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(kubeconfig))]));
        Api::<Secret>::namespaced(mgmt.client(), "default").create(&PostParams::default(), &s).await.unwrap();
        let registry = Registry::new(Settings::default());
        let shutdown = CancellationToken::new();
        let (r, client, stop) = (registry.clone(), mgmt.client(), shutdown.clone());
        let task = tokio::spawn(async move { r.run(client, stop).await });
        let key = ClusterKey::new("default", "alpha");
        let until = |connected: bool| {
            let registry = registry.clone();
            let key = key.clone();
            async move {
                while registry.connection(&key).is_some_and(|c| c.is_synced()) != connected {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), until(true)).await.expect("the cluster connects");
        // A crash of the registry's own task, then the hub's shutdown.
        task.abort();
        let _ = task.await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), until(false)).await.expect("the cluster's task outlived the hub");
    }

    /// Wait (woken by the registry's changes) until `check` holds; panics after 20 s.
    async fn until(registry: &Registry, what: &str, check: impl Fn(&Registry) -> bool) {
        let mut changes = registry.changes();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !check(registry) {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            // Some changes (a watch syncing) do not bump the counter: look again now and then.
            let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
        }
    }

    /// Sharded mode, structurally: no connection before ownership is granted, one while it lasts,
    /// none handed out after, and the client a controller still holds refuses every request once
    /// ownership ended (the fence), while the cluster itself answers as before. Owned again within
    /// the keep time: new write clients over the same caches, nothing listed again, the old client
    /// still refused. Owned again after it: a new connection, listing again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sharded_registry_connects_only_while_owning_fences_the_old_client_and_keeps_caches_a_while() {
        use kube::api::PostParams;
        use sim::apiserver::{ApiServer, ApiServerConfig};
        let mgmt = ApiServer::start(ApiServerConfig::new("management")).await.unwrap();
        let workload = ApiServer::start(ApiServerConfig::workload("alpha")).await.unwrap();
        let mut s = secret("alpha-kubeconfig", Some("alpha"));
        s.metadata.namespace = Some("default".into());
        let kubeconfig = serde_json::to_vec(&workload.kubeconfig()).unwrap();
        s.data = Some(BTreeMap::from([(KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(kubeconfig))]));
        Api::<Secret>::namespaced(mgmt.client(), "default").create(&PostParams::default(), &s).await.unwrap();
        let keep = Duration::from_secs(2);
        let registry = Registry::new(Settings { sharded: true, keep_unowned: keep, ..Settings::default() });
        let shutdown = CancellationToken::new();
        let (r, client, stop) = (registry.clone(), mgmt.client(), shutdown.clone());
        tokio::spawn(async move { r.run(client, stop).await });
        let key = ClusterKey::new("default", "alpha");
        until(&registry, "the Secret seen", |r| r.registered() == vec![key.clone()]).await;
        // Registered, not owned: no connection, not served, nobody writes for it here.
        assert!(registry.clusters().is_empty() && registry.connection(&key).is_none());
        assert!(!registry.writes_for(&key) && !registry.owns(&key));

        let ownership = CancellationToken::new();
        registry.grant(&key, ownership.clone());
        until(&registry, "the owned cluster synced", |r| r.connection(&key).is_some_and(|c| c.is_synced())).await;
        assert!(registry.writes_for(&key) && registry.clusters() == vec![key.clone()]);
        let held = registry.connection(&key).unwrap();
        held.client.apiserver_version().await.expect("the owner's client works");
        let pod_lists = || workload.requests().count("list", "pods");
        let listed = pod_lists();

        // Ownership ends: no connection handed out, and the client held by a round under way refuses.
        ownership.cancel();
        until(&registry, "the cluster no longer served", |r| r.connection(&key).is_none() && r.clusters().is_empty())
            .await;
        assert!(!registry.writes_for(&key));
        let refused = async |c: &Arc<Connection>| {
            for e in
                [c.client.apiserver_version().await.unwrap_err(), c.evictions.apiserver_version().await.unwrap_err()]
            {
                assert!(crate::infra::fence::is_fenced(&e), "not the fence: {e}");
            }
        };
        refused(&held).await;
        workload.client().apiserver_version().await.expect("the cluster itself still answers");

        // Owned again within the keep time: the same caches, new write clients, no new list.
        let ownership = CancellationToken::new();
        registry.grant(&key, ownership.clone());
        until(&registry, "served again", |r| r.connection(&key).is_some_and(|c| !Arc::ptr_eq(&c, &held))).await;
        let again = registry.connection(&key).unwrap();
        assert!(Arc::ptr_eq(&again.pending, &held.pending), "not the kept caches");
        again.client.apiserver_version().await.expect("the new client works");
        refused(&held).await;
        assert_eq!(pod_lists(), listed, "the kept caches listed the pods again");

        // Ownership ends and the keep time runs out: the connection goes; owned again, it lists anew.
        ownership.cancel();
        tokio::time::sleep(keep + Duration::from_millis(500)).await;
        registry.grant(&key, CancellationToken::new());
        until(&registry, "connected anew", |r| {
            r.connection(&key).is_some_and(|c| c.is_synced() && !Arc::ptr_eq(&c.pending, &held.pending))
        })
        .await;
        assert!(pod_lists() > listed, "a new connection lists the pods");
        shutdown.cancel();
    }

    #[test]
    fn an_unregistered_cluster_reports_the_secret_it_needs() {
        let r = Registry::new(Settings::default());
        let s = r.status(&ClusterKey::new("team-a", "prod"));
        assert_eq!(s.phase, Phase::SecretMissing);
        assert!(s.message.contains("team-a/prod-kubeconfig"), "{}", s.message);
    }
}
