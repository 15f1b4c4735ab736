//! The shared context of every controller in one hub process: the management client, the cluster
//! registry, the settings, the caches, and what several controllers share (the per-cluster
//! capacity memory, registration health, events).
//!
//! Owns: wiring and the persistence of [`CapacityState`] (one ConfigMap per workload cluster in the
//! registering namespace, so cool-downs and back-off survive restarts and leader changes).
//! Must not: contain decisions; those live in the pure modules the controllers call.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, PoisonError},
    time::Duration,
};

use crds::{CapacityBuffer, CleverNodeClass, CleverOrganization, FlavorCatalog, NodeClaim, NodeOverlay, NodePool};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::{
    api::core::v1::{ConfigMap, ObjectReference},
    jiff::Timestamp,
};
use kube::runtime::{WatchStreamExt, reflector, reflector::Store, watcher};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::capacity::{self, CapacityState},
    decisions::conditions,
    infra::metrics::Metrics,
    infra::registry::{ClusterKey, Registry},
};

/// Field manager and event reporter name.
pub const MANAGER: &str = "karpenter-hub";
/// ConfigMap data key holding a cluster's [`CapacityState`] as JSON.
pub const CAPACITY_KEY: &str = "state";
/// The same reason on the same object is published at most once per this window (clever-cloud.md §8).
pub const EVENT_DEDUPE: Duration = Duration::from_secs(120);
/// The window of the warnings re-emitted at every sweep (refused GC, external resizes).
pub const EVENT_DEDUPE_LONG: Duration = Duration::from_secs(3600);

/// Hub-wide settings (flags of `karpenter-hub run`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This hub's identity on NodeGroups (`karpenter.clever-cloud.com/hub`).
    pub hub_id: String,
    /// The management cluster's identity on NodeGroups (`karpenter.clever-cloud.com/management-cluster`):
    /// the UID of its `kube-system` namespace. Empty until [`crate::infra::identity`] reads it
    /// (`run_with` does, before any controller starts); set by hand only by tests.
    pub management_cluster: String,
    /// Zone of CKE's offerings (`par`).
    pub zone: String,
    /// The scheduler's policies every provisioning round and disruption simulation decides under
    /// (`--min-values-policy`).
    pub scheduler: scheduling::model::Settings,
    /// The NodeClaim lifecycle's TTLs and node repair policy.
    pub lifecycle: crate::decisions::lifecycle::Settings,
    /// The time every decision is made at: the wall clock in production, a manual clock in tests
    /// that move time forward instead of waiting for it.
    pub clock: clock::Clock,
    /// How long a launch waits for CKE's verdict before going on optimistically (15 s).
    pub verdict_timeout: Duration,
    pub capacity: capacity::Policy,
    /// Serve only this namespace of the management cluster (`--namespace`); all when `None`.
    pub namespace: Option<String>,
    /// Garbage collection never touches an object younger than this (clever-cloud.md §3.8: 2 min).
    pub gc_min_age: Duration,
    /// Period of the garbage-collection safety sweep (2 min).
    pub gc_period: Duration,
    /// How much one sweep of one cluster may delete (hub.md §5, "the brake").
    pub gc_brake: crate::decisions::garbage::Brake,
    /// How long a consolidation or emptiness command waits before it is validated and started
    /// (karpenter-semantics: 15 s).
    pub disruption_validation: Duration,
    /// This replica's identity (its Lease holder identity; empty outside `run`): names the field
    /// manager of the fleet pool status rows it writes, so replicas' rows do not overwrite each other.
    pub replica: String,
}

impl Settings {
    /// Who this hub is, for the ownership proof.
    pub fn owner(&self) -> crate::decisions::ownership::Owner<'_> {
        crate::decisions::ownership::Owner {
            hub_id: &self.hub_id,
            management_cluster: &self.management_cluster,
            moved_from: None,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            hub_id: "default".to_string(),
            management_cluster: String::new(),
            zone: "par".to_string(),
            scheduler: scheduling::model::Settings::default(),
            lifecycle: crate::decisions::lifecycle::Settings::default(),
            clock: clock::Clock::real(),
            verdict_timeout: Duration::from_secs(15),
            capacity: capacity::Policy::default(),
            namespace: None,
            gc_min_age: crate::decisions::garbage::MIN_AGE,
            gc_period: crate::decisions::garbage::SWEEP_PERIOD,
            gc_brake: crate::decisions::garbage::Brake::default(),
            disruption_validation: crate::decisions::disruption_queue::VALIDATION_DELAY,
            replica: String::new(),
        }
    }
}

/// This hub on one cluster ([`Hub::owner_on`]): holds the declared source its [`Owner`] borrows.
///
/// [`Owner`]: crate::decisions::ownership::Owner
#[derive(Debug, Clone)]
pub struct ClusterOwner<'a> {
    settings: &'a Settings,
    /// The management cluster the cluster's registration declares it moved from.
    pub moved_from: Option<String>,
}

impl ClusterOwner<'_> {
    /// Who this hub is on the cluster, for the ownership proof.
    pub fn owner(&self) -> crate::decisions::ownership::Owner<'_> {
        self.settings.owner().moved_from(self.moved_from.as_deref())
    }
}

/// Watch caches of the management cluster shared by the controllers that would otherwise LIST
/// periodically (garbage collection, node class status): a steady fleet costs watches only.
/// Readers that act on absence re-read live; the caches only narrow the candidates.
#[derive(Clone)]
pub struct MgmtCache {
    pub claims: Store<NodeClaim>,
    pub pools: Store<NodePool>,
    pub classes: Store<CleverNodeClass>,
    pub catalogs: Store<FlavorCatalog>,
    /// Cluster-scoped, watched whatever `--namespace` says; not part of readiness (an install
    /// without the CRD or the RBAC has none, and a launch reads them live before it acts).
    pub organizations: Store<CleverOrganization>,
    /// CapacityBuffers and the PodTemplates they name: optional as organisations (an install
    /// without the CRD or the RBAC keeps no buffer), not part of readiness.
    pub buffers: Store<CapacityBuffer>,
    pub pod_templates: Store<PodTemplate>,
    /// NodeOverlays: optional as buffers.
    pub overlays: Store<NodeOverlay>,
    /// Every event these caches applied, counted per namespace (a loop tells "nothing changed" by it).
    pub changes: crate::infra::changes::Changes,
    ready: tokio::sync::watch::Receiver<bool>,
    scope: tokio::sync::watch::Receiver<u64>,
    spec_changes: tokio::sync::broadcast::Sender<SpecChange>,
}

/// A NodePool or a CleverNodeClass whose part the decisions read changed (a pool's spec, a class's
/// spec or readiness), or that went: not its status writes, not the initial listing.
#[derive(Debug, Clone)]
pub enum SpecChange {
    Pool(reflector::ObjectRef<NodePool>),
    Class(reflector::ObjectRef<CleverNodeClass>),
}

impl std::fmt::Debug for MgmtCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MgmtCache")
            .field("claims", &self.claims.len())
            .field("pools", &self.pools.len())
            .field("classes", &self.classes.len())
            .field("catalogs", &self.catalogs.len())
            .field("organizations", &self.organizations.len())
            .field("buffers", &self.buffers.len())
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl MgmtCache {
    /// Start the watches; they stop with `shutdown`.
    pub fn start(mgmt: &Client, namespace: Option<&str>, shutdown: &CancellationToken) -> Self {
        let (scope_tx, scope) = tokio::sync::watch::channel(0u64);
        let scope_tx = Arc::new(scope_tx);
        let spec_changes = tokio::sync::broadcast::channel(256).0;
        let changes = crate::infra::changes::Changes::per_namespace();
        // What provisioning's decision depends on, per kind: a pool's or catalogue's spec, a class's
        // spec and readiness, a claim going away (its capacity with it). A claim's creation or
        // status is not: provisioning made it, or it changes nothing a pending pod waits for.
        let claims = spawn_reflector(
            scoped::<NodeClaim>(mgmt, namespace),
            (shutdown, &changes),
            Some((scope_tx.clone(), |c: &NodeClaim| u64::from(c.metadata.deletion_timestamp.is_some()), false)),
            None,
        );
        let pools = spawn_reflector(
            scoped::<NodePool>(mgmt, namespace),
            (shutdown, &changes),
            Some((scope_tx.clone(), |p: &NodePool| generation(p.metadata.generation), true)),
            Some((spec_changes.clone(), |p: &NodePool| SpecChange::Pool(reflector::ObjectRef::from_obj(p)))),
        );
        let classes = spawn_reflector(
            scoped::<CleverNodeClass>(mgmt, namespace),
            (shutdown, &changes),
            Some((scope_tx.clone(), class_scope, true)),
            Some((spec_changes.clone(), |c: &CleverNodeClass| SpecChange::Class(reflector::ObjectRef::from_obj(c)))),
        );
        let catalogs = spawn_reflector(
            scoped::<FlavorCatalog>(mgmt, namespace),
            (shutdown, &changes),
            Some((scope_tx.clone(), |f: &FlavorCatalog| generation(f.metadata.generation), true)),
            None,
        );
        // An organisation's headroom is news for the pods that wait: its spec, and the usage and
        // quota its status sums up.
        let organizations = spawn_reflector(
            Api::<CleverOrganization>::all(mgmt.clone()),
            (shutdown, &changes),
            Some((scope_tx.clone(), organization_scope, true)),
            None,
        );
        // A buffer's spec or its template is news for the rounds (its pods change).
        let buffers = spawn_reflector(
            scoped::<CapacityBuffer>(mgmt, namespace),
            (shutdown, &changes),
            Some((scope_tx.clone(), |b: &CapacityBuffer| generation(b.metadata.generation), true)),
            None,
        );
        // An overlay's spec, or its acceptance (the status controller's verdict), changes prices.
        let overlays = spawn_reflector(
            scoped::<NodeOverlay>(mgmt, namespace),
            (shutdown, &changes),
            Some((
                scope_tx.clone(),
                |o: &NodeOverlay| crate::decisions::fingerprint::one((o.metadata.generation, overlay_accepted(o))),
                true,
            )),
            None,
        );
        let pod_templates = spawn_reflector(
            scoped::<PodTemplate>(mgmt, namespace),
            (shutdown, &changes),
            Some((
                scope_tx,
                |t: &PodTemplate| {
                    crate::decisions::fingerprint::one(serde_json::to_string(&t.template).unwrap_or_default())
                },
                true,
            )),
            None,
        );
        let (tx, ready) = tokio::sync::watch::channel(false);
        let (c, p, k, f) = (claims.clone(), pools.clone(), classes.clone(), catalogs.clone());
        tokio::spawn(async move {
            // One waiter per store (kube's Store wakes one waiter at a time).
            if c.wait_until_ready().await.is_ok()
                && p.wait_until_ready().await.is_ok()
                && k.wait_until_ready().await.is_ok()
                && f.wait_until_ready().await.is_ok()
            {
                let _ = tx.send(true);
            }
        });
        Self {
            claims,
            pools,
            classes,
            catalogs,
            organizations,
            buffers,
            pod_templates,
            overlays,
            changes,
            ready,
            scope,
            spec_changes,
        }
    }

    /// Each NodePool and CleverNodeClass change the decisions read ([`SpecChange`]; lossy under
    /// bursts: the claims' periodic passes remain the backstop).
    pub fn spec_changes(&self) -> impl futures::Stream<Item = SpecChange> + Send + use<> {
        crate::infra::registry::lossy(self.spec_changes.subscribe())
    }

    /// A counter bumped whenever something provisioning decides from changes (see [`Self::start`]);
    /// the provisioning loops re-run a round for pods still waiting when it moves.
    pub fn scope_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.scope.clone()
    }

    /// Whether every cache has listed once. Before that, absence means nothing.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// NodeClaims of a namespace.
    pub fn claims_in(&self, ns: &str) -> Vec<Arc<NodeClaim>> {
        self.claims.state().into_iter().filter(|c| c.metadata.namespace.as_deref() == Some(ns)).collect()
    }

    /// NodePools of a namespace.
    pub fn pools_in(&self, ns: &str) -> Vec<Arc<NodePool>> {
        self.pools.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(ns)).collect()
    }

    /// Node classes of a namespace.
    pub fn classes_in(&self, ns: &str) -> Vec<Arc<CleverNodeClass>> {
        self.classes.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(ns)).collect()
    }

    /// The NodeOverlays of a namespace that apply: accepted by the status controller for their
    /// current generation ([`overlay_accepted`]).
    pub fn overlays_in(&self, ns: &str) -> Vec<NodeOverlay> {
        self.overlays
            .state()
            .into_iter()
            .filter(|o| o.metadata.namespace.as_deref() == Some(ns) && overlay_accepted(o))
            .map(|o| o.as_ref().clone())
            .collect()
    }

    /// CapacityBuffers of a namespace.
    pub fn buffers_in(&self, ns: &str) -> Vec<Arc<CapacityBuffer>> {
        self.buffers.state().into_iter().filter(|b| b.metadata.namespace.as_deref() == Some(ns)).collect()
    }

    /// Flavor catalogues of a namespace.
    pub fn catalogs_in(&self, ns: &str) -> Vec<Arc<FlavorCatalog>> {
        self.catalogs.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(ns)).collect()
    }
}

/// `K` in `namespace`, or in every namespace.
pub fn scoped<K>(mgmt: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(mgmt.clone(), ns),
        None => Api::all(mgmt.clone()),
    }
}

/// Whether the overlay's `ValidationSucceeded` is True for its current generation: only then do
/// rounds apply it (a new or changed overlay waits for its evaluation, as upstream's).
pub fn overlay_accepted(o: &NodeOverlay) -> bool {
    o.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == crds::overlay::VALIDATION_SUCCEEDED
                && c.status == "True"
                && c.observed_generation == o.metadata.generation
        })
    })
}

fn generation(g: Option<i64>) -> u64 {
    g.and_then(|g| u64::try_from(g).ok()).unwrap_or(0)
}

fn class_scope(c: &CleverNodeClass) -> u64 {
    let ready = conditions::is_true(c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), "Ready");
    generation(c.metadata.generation) << 1 | u64::from(ready)
}

fn organization_scope(o: &CleverOrganization) -> u64 {
    let s = o.status.as_ref();
    crate::decisions::fingerprint::one((
        o.metadata.generation,
        s.and_then(|s| s.used.as_ref()).map(|u| (&u.cpu, &u.memory)),
        s.and_then(|s| s.quota.as_ref()).map(|q| (&q.cpu, &q.memory)),
        s.and_then(|s| s.price_per_hour.as_ref()),
        // Who waits, for what and for which pools (the line; a renewal alone changes nothing).
        s.map(|s| {
            s.clusters
                .iter()
                .map(|c| {
                    c.waiting
                        .as_ref()
                        .map(|w| (w.weight, w.since.0.as_second(), w.cpu_millis, w.memory_bytes, &w.pools))
                })
                .collect::<Vec<_>>()
        }),
    ))
}

/// Where a watch reports changes of its objects' relevant part: the counter, the part (a
/// fingerprint), and whether a new object counts as a change.
type ScopeHook<K> = (Arc<tokio::sync::watch::Sender<u64>>, fn(&K) -> u64, bool);

/// Where a watch announces which object's relevant part changed (or which object went).
type ChangeHook<K> = (tokio::sync::broadcast::Sender<SpecChange>, fn(&K) -> SpecChange);

fn spawn_reflector<K>(
    api: Api<K>,
    (shutdown, changes): (&CancellationToken, &crate::infra::changes::Changes),
    scope: Option<ScopeHook<K>>,
    announce: Option<ChangeHook<K>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    let stop = shutdown.clone();
    let changes = changes.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // The last fingerprint per object (uid), to tell a relevant change from a status write.
        let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                next = stream.next() => match next {
                    None => return,
                    Some(Err(e)) => tracing::debug!(kind = %K::kind(&()), error = %crate::infra::apierror::plain_watch(&e), "management watch error; retrying"),
                    Some(Ok(ev)) => {
                        changes.observe(&ev);
                        let Some((tx, fingerprint, new_counts)) = &scope else { continue };
                        let changed = match &ev {
                            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                                let (uid, now) = (o.meta().uid.clone().unwrap_or_default(), fingerprint(o));
                                let before = seen.insert(uid, now);
                                matches!(ev, watcher::Event::Apply(_)) && before.map_or(*new_counts, |b| b != now)
                            }
                            watcher::Event::Delete(o) => {
                                seen.remove(o.meta().uid.as_deref().unwrap_or_default());
                                true
                            }
                            watcher::Event::Init => {
                                seen.clear();
                                false
                            }
                            // A relist: whatever happened while the watch was down.
                            watcher::Event::InitDone => true,
                        };
                        if changed {
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                            if let (Some((announced, of)), watcher::Event::Apply(o) | watcher::Event::Delete(o)) = (&announce, &ev) {
                                // No subscriber (no controller running yet) is not an error.
                                let _ = announced.send(of(o));
                            }
                        }
                    },
                },
            }
        }
    });
    store
}

/// Everything a controller needs. Cheap to share (`Arc`).
pub struct Hub {
    pub mgmt: Client,
    pub registry: Registry,
    pub settings: Settings,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub cache: MgmtCache,
    capacity: std::sync::Mutex<BTreeMap<ClusterKey, CapacityState>>,
    events: std::sync::Mutex<EventDedupe>,
    health: std::sync::Mutex<BTreeMap<(String, String), crate::decisions::node_registration::RegistrationHealth>>,
    class_generations: std::sync::Mutex<BTreeMap<(String, String), i64>>,
    /// Clusters whose last garbage-collection sweep the brake halted, with what it would have
    /// deleted (shown on their NodePools as `GarbageCollectionHalted`); a counter of changes.
    gc_halts: std::sync::Mutex<BTreeMap<ClusterKey, String>>,
    gc_halt_changes: tokio::sync::watch::Sender<u64>,
    /// Namespace labels read for organisations' namespace selectors, with when they were read.
    namespace_labels: std::sync::Mutex<NamespaceLabels>,
    /// Where each cluster's last provisioning round put its CapacityBuffers' pods (by buffer
    /// `namespace/name`), and a counter of changes (the buffer status controller's wake-up).
    buffer_placements: std::sync::Mutex<BTreeMap<ClusterKey, BufferPlacements>>,
    buffer_changes: tokio::sync::watch::Sender<u64>,
    /// For each NodeClaim provisioning created and not yet launched (`namespace/name`), the
    /// stages of its pods' wait so far.
    waits: std::sync::Mutex<HashMap<String, Waits>>,
}

/// The stages of the wait of the pods a claim was created for, on the process's clock.
#[derive(Debug, Clone)]
pub struct Waits {
    /// When the hub's cache first held each pod pending.
    pub since: Vec<std::time::Instant>,
    /// When the round that decided the claim started.
    pub round: std::time::Instant,
    /// When the claim was created.
    pub created: std::time::Instant,
}

/// How long a claim's pods' waits are remembered for its launch (a claim never launched, deleted
/// first, is forgotten after this).
const WAITS_TTL: Duration = Duration::from_secs(3600);

/// A cluster's CapacityBuffer placements, by buffer `namespace/name`.
pub type BufferPlacements = BTreeMap<String, crate::decisions::capacity_buffer::Placement>;

/// Namespace labels by namespace, with when they were read.
type NamespaceLabels = BTreeMap<String, (tokio::time::Instant, BTreeMap<String, String>)>;

/// How long a namespace's labels read for an organisation's namespace selector are trusted.
const NAMESPACE_LABELS_TTL: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("settings", &self.settings).field("registry", &self.registry).finish()
    }
}

impl Hub {
    /// The instance types a node class offers: the built-in catalogue with its FlavorCatalog merged
    /// on, or the built-in alone while the reference dangles or the catalogue is refused
    /// (clever-cloud.md §5; the FlavorCatalog and node class controllers report it), or while the
    /// class is missing (`None`), as the hub's cache shows it. For what only reports (a price): no read.
    pub fn cached_instance_types(&self, ns: &str, class: Option<&CleverNodeClass>) -> Vec<crds::catalog::InstanceType> {
        let reference = class.and_then(|c| c.spec.flavor_catalog_ref.as_ref()).map(|r| r.name.as_str());
        let found = reference.and_then(|name| self.cache.catalogs.get(&reflector::ObjectRef::new(name).within(ns)));
        crds::catalog::served(&crds::catalog::Catalog::builtin(), reference, found.as_deref())
            .0
            .instance_types(&self.settings.zone)
    }

    /// The server-side-apply field manager of the status rows this replica writes for `kind`
    /// (`rows`: fleet pools', `buffer-rows`: buffers'): one per replica, so that in sharded mode each
    /// owner's rows of a list-map are its own.
    pub fn rows_manager(&self, kind: &str) -> String {
        let mut m = format!("karpenter-hub-{kind}-{}", self.settings.replica);
        m.truncate(128);
        m
    }

    /// The prices the namespace's accepted NodeOverlays give `types` in the pool named `pool` (its
    /// template labels from the cache): what rounds price with, for a launch's choice and a
    /// pool's cost.
    pub fn overlaid(&self, ns: &str, pool: &str, types: &mut [crds::catalog::InstanceType]) {
        let overlays = self.cache.overlays_in(ns);
        if overlays.is_empty() {
            return;
        }
        let cached = self.cache.pools.get(&reflector::ObjectRef::new(pool).within(ns));
        let labels = cached.as_deref().map(NodePool::template_labels).cloned().unwrap_or_default();
        crds::overlay::apply(&overlays, pool, &labels, types);
    }

    pub fn new(
        mgmt: Client,
        registry: Registry,
        settings: Settings,
        metrics: Arc<Metrics>,
        cache: MgmtCache,
    ) -> Arc<Self> {
        let recorder = Recorder::new(mgmt.clone(), Reporter { controller: MANAGER.to_string(), instance: None });
        Arc::new(Self {
            mgmt,
            registry,
            settings,
            recorder,
            metrics,
            cache,
            capacity: std::sync::Mutex::new(BTreeMap::new()),
            events: std::sync::Mutex::new(EventDedupe::default()),
            health: std::sync::Mutex::new(BTreeMap::new()),
            class_generations: std::sync::Mutex::new(BTreeMap::new()),
            gc_halts: std::sync::Mutex::new(BTreeMap::new()),
            gc_halt_changes: tokio::sync::watch::Sender::new(0),
            namespace_labels: std::sync::Mutex::new(BTreeMap::new()),
            buffer_placements: std::sync::Mutex::new(BTreeMap::new()),
            buffer_changes: tokio::sync::watch::Sender::new(0),
            waits: std::sync::Mutex::default(),
        })
    }

    /// Remember the wait so far of the pods claim `namespace/name` was created for.
    pub fn record_waits(&self, namespace: &str, claim: &str, waits: Waits) {
        if waits.since.is_empty() {
            return;
        }
        let mut all = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, w| w.created.elapsed() < WAITS_TTL);
        all.insert(format!("{namespace}/{claim}"), waits);
    }

    /// Observe the hub's share of the wait of the pods claim `namespace/name` of cluster `key` was
    /// created for, ended by its NodeGroup's create request sent at `requested`; once per claim.
    pub fn observe_waits(&self, key: &ClusterKey, claim: &str, requested: std::time::Instant) {
        let Some(waits) =
            self.waits.lock().unwrap_or_else(PoisonError::into_inner).remove(&format!("{}/{claim}", key.namespace))
        else {
            return;
        };
        let cluster = key.to_string();
        let total = self
            .metrics
            .pod_provisioning_latency
            .get(&crate::infra::metrics::ClusterLabels { cluster: cluster.clone() });
        let stage = |name: &str| {
            self.metrics
                .pod_provisioning_stages
                .get(&crate::infra::metrics::StageLabels { cluster: cluster.clone(), stage: name.to_string() })
        };
        let (batch, decide, launch) = (stage("batch"), stage("decide"), stage("launch"));
        for t in waits.since {
            total.observe(requested.saturating_duration_since(t).as_secs_f64());
            batch.observe(waits.round.saturating_duration_since(t).as_secs_f64());
            decide.observe(waits.created.saturating_duration_since(waits.round.max(t)).as_secs_f64());
            launch.observe(requested.saturating_duration_since(waits.created).as_secs_f64());
        }
    }

    /// Record where the last round of `key` put its buffers' pods (empty: none, or the cluster
    /// went); wakes the buffer status controller when that changed.
    pub fn record_buffer_placements(&self, key: &ClusterKey, placements: BufferPlacements) {
        let mut all = self.buffer_placements.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = if placements.is_empty() {
            all.remove(key).is_some()
        } else {
            all.insert(key.clone(), placements.clone()).as_ref() != Some(&placements)
        };
        drop(all);
        if changed {
            self.buffer_changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Where the last round of `key` put buffer `buffer`'s (`namespace/name`) pods, if it had any.
    pub fn buffer_placement(
        &self,
        key: &ClusterKey,
        buffer: &str,
    ) -> Option<crate::decisions::capacity_buffer::Placement> {
        self.buffer_placements.lock().unwrap_or_else(PoisonError::into_inner).get(key)?.get(buffer).copied()
    }

    /// A counter moved by every change [`Self::record_buffer_placements`] sees.
    pub fn buffer_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.buffer_changes.subscribe()
    }

    /// Record whether the brake halted the last sweep of `key` (`Some(message)`) or not; true
    /// when that changed (then the cluster's NodePools are reconciled again).
    pub fn set_gc_halt(&self, key: &ClusterKey, halt: Option<String>) -> bool {
        let mut halts = self.gc_halts.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = match &halt {
            Some(m) => halts.insert(key.clone(), m.clone()).as_ref() != Some(m),
            None => halts.remove(key).is_some(),
        };
        drop(halts);
        if changed {
            self.gc_halt_changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        changed
    }

    /// Why the brake halted the last sweep of `key`, if it did.
    pub fn gc_halt(&self, key: &ClusterKey) -> Option<String> {
        self.gc_halts.lock().unwrap_or_else(PoisonError::into_inner).get(key).cloned()
    }

    /// A tick whenever a cluster's halt starts, changes or ends.
    pub fn gc_halt_changes(&self) -> impl futures::Stream<Item = ()> + Send + use<> {
        futures::stream::unfold(self.gc_halt_changes.subscribe(), |mut rx| async move {
            rx.changed().await.ok().map(|()| ((), rx))
        })
    }

    /// The labels of management namespace `ns` (for organisations' namespace selectors), read at
    /// most every [`NAMESPACE_LABELS_TTL`]; a namespace gone has none.
    pub async fn namespace_labels(&self, ns: &str) -> Result<BTreeMap<String, String>, kube::Error> {
        let now = tokio::time::Instant::now();
        if let Some((at, labels)) = self.namespace_labels.lock().unwrap_or_else(PoisonError::into_inner).get(ns)
            && now.duration_since(*at) < NAMESPACE_LABELS_TTL
        {
            return Ok(labels.clone());
        }
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.mgmt.clone());
        let labels = api.get_metadata_opt(ns).await?.and_then(|m| m.metadata.labels).unwrap_or_default();
        self.namespace_labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ns.to_string(), (now, labels.clone()));
        Ok(labels)
    }

    /// Who this hub is on cluster `key`, for the ownership proof: [`Settings::owner`] with the move
    /// the cluster's registration declares, if any ([`ClusterOwner::owner`]).
    pub fn owner_on(&self, key: &ClusterKey) -> ClusterOwner<'_> {
        ClusterOwner { settings: &self.settings, moved_from: self.registry.moved_from(key) }
    }

    /// Now, on the hub's clock.
    pub fn now(&self) -> Timestamp {
        let now = self.settings.clock.now();
        Timestamp::new(now.timestamp(), i32::try_from(now.timestamp_subsec_nanos()).unwrap_or(0))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// `K` in the hub's namespace (`--namespace`), or in every namespace: every management watch
    /// goes through this, so a namespaced hub never serves another namespace's pools.
    pub fn scoped<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        scoped(&self.mgmt, self.settings.namespace.as_deref())
    }

    /// Record a launch outcome of a NodePool (karpenter-semantics §6.4); in memory, as upstream.
    pub fn record_registration(&self, ns: &str, pool: &str, registered: bool) {
        let Some(p) = self
            .cache
            .pools
            .state()
            .into_iter()
            .find(|p| p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(pool))
        else {
            return;
        };
        let class_gen = self.class_generation(ns, &p.spec.template.spec.node_class_ref.name);
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((ns.to_string(), pool.to_string()))
            .or_default()
            .record(registered, (p.metadata.generation, class_gen));
    }

    /// The registration health of a NodePool under the given (pool, class) generations.
    pub fn registration_healthy(&self, ns: &str, pool: &str, generations: (Option<i64>, Option<i64>)) -> Option<bool> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((ns.to_string(), pool.to_string()))
            .or_default()
            .healthy(generations)
    }

    fn class_generation(&self, ns: &str, class: &str) -> Option<i64> {
        self.class_generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(ns.to_string(), class.to_string()))
            .copied()
    }

    /// Remember a node class's generation (the NodePool controller reads classes anyway).
    pub fn observe_class_generation(&self, ns: &str, class: &str, generation: Option<i64>) {
        if let Some(g) = generation {
            self.class_generations
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((ns.to_string(), class.to_string()), g);
        }
    }

    /// Drop the in-memory copy of a cluster's capacity memory.
    pub fn forget_capacity(&self, key: &ClusterKey) {
        self.capacity.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    /// The capacity memory of a cluster, loaded from the management cluster the first time.
    /// Wait until the management cache shows every NodeClaim of `names` in `ns` (true), or
    /// `within` passed (false): a decision made before would not count the claims just created and
    /// make them again.
    pub async fn claims_visible(&self, ns: &str, names: &[String], within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let shown = names
                .iter()
                .all(|n| self.cache.claims.get(&reflector::ObjectRef::<NodeClaim>::new(n).within(ns)).is_some());
            if shown {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn capacity(&self, key: &ClusterKey) -> Result<CapacityState, kube::Error> {
        if let Some(s) = self.capacity.lock().unwrap_or_else(PoisonError::into_inner).get(key) {
            return Ok(s.clone());
        }
        let api: Api<ConfigMap> = Api::namespaced(self.mgmt.clone(), &key.namespace);
        let loaded = api
            .get_opt(&capacity_configmap(key))
            .await?
            .and_then(|cm| cm.data)
            .and_then(|d| d.get(CAPACITY_KEY).cloned())
            .and_then(|json| match serde_json::from_str::<CapacityState>(&json) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(cluster = %key, error = %e, "stored capacity state is unreadable; starting afresh");
                    None
                }
            })
            .unwrap_or_default();
        Ok(self.capacity.lock().unwrap_or_else(PoisonError::into_inner).entry(key.clone()).or_insert(loaded).clone())
    }

    /// The accepted group `group`, whose node registered, is going (`gone`: already gone): record
    /// it in the cluster's capacity memory ([`CapacityState::group_released`]), written only when
    /// that changes something (most groups go while nothing restricts launches). Returns whether
    /// it did.
    pub async fn release_capacity(
        &self,
        key: &ClusterKey,
        group: &str,
        gone: bool,
        now: Timestamp,
    ) -> Result<bool, kube::Error> {
        if !self.capacity(key).await?.group_released(group, gone, now) {
            return Ok(false);
        }
        let mut changed = false;
        self.update_capacity(key, now, |s| changed = s.group_released(group, gone, now)).await?;
        Ok(changed)
    }

    /// Change a cluster's capacity memory and persist it before returning.
    pub async fn update_capacity(
        &self,
        key: &ClusterKey,
        now: Timestamp,
        change: impl FnOnce(&mut CapacityState),
    ) -> Result<CapacityState, kube::Error> {
        let mut state = self.capacity(key).await?;
        change(&mut state);
        state.prune(now);
        Metrics::set(&self.metrics.cooldown_flavors, key, state.unavailable(now).count() as i64);
        self.capacity.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), state.clone());
        let api: Api<ConfigMap> = Api::namespaced(self.mgmt.clone(), &key.namespace);
        let json = serde_json::to_string(&state).unwrap_or_else(|_| "{}".to_string());
        let name = capacity_configmap(key);
        let patch = serde_json::json!({ "data": { CAPACITY_KEY: json } });
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": name,
                        "labels": {
                            crate::infra::registry::CLUSTER_NAME_LABEL: key.name,
                            "app.kubernetes.io/managed-by": MANAGER,
                        },
                    },
                    "data": { CAPACITY_KEY: json },
                }))
                .unwrap_or_default();
                match api.create(&PostParams::default(), &cm).await {
                    // Lost a race with another writer: apply our change on top of theirs.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                    r => {
                        r?;
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(state)
    }

    /// Publish an event in the management cluster (deduplicated by reason and object), logging,
    /// not failing, when the API refuses it.
    pub async fn event(&self, reference: &ObjectReference, warning: bool, reason: &str, action: &str, note: String) {
        if self.first_in_window(reference, reason, EVENT_DEDUPE) {
            publish(&self.recorder, reference, event(warning, reason, action, note)).await;
        }
    }

    /// Publish an event about a workload-cluster object (a NodeGroup's land in `default`) through
    /// that cluster's client, deduplicated over `window`.
    /// Returns whether it was published (not deduplicated), so callers log it once per window too.
    pub async fn workload_event(
        &self,
        client: &Client,
        reference: &ObjectReference,
        ev: Event,
        window: Duration,
    ) -> bool {
        if !self.first_in_window(reference, &ev.reason, window) {
            return false;
        }
        let recorder = Recorder::new(client.clone(), Reporter { controller: MANAGER.to_string(), instance: None });
        publish(&recorder, reference, ev).await;
        true
    }

    fn first_in_window(&self, reference: &ObjectReference, reason: &str, window: Duration) -> bool {
        let key = format!(
            "{}/{}/{}/{}/{reason}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default(),
            reference.uid.as_deref().unwrap_or_default(),
        );
        self.events.lock().unwrap_or_else(PoisonError::into_inner).first_in_window(
            key,
            std::time::Instant::now(),
            window,
        )
    }
}

/// Remembers when each (object, reason) was last published, to publish it once per window.
#[derive(Debug, Default)]
pub struct EventDedupe {
    last: BTreeMap<String, std::time::Instant>,
}

impl EventDedupe {
    /// Whether an event under `key` may be published at `now`; records it if so.
    pub fn first_in_window(&mut self, key: String, now: std::time::Instant, window: Duration) -> bool {
        // Forget what no window can suppress any more, so the map stays small.
        self.last.retain(|_, t| now.saturating_duration_since(*t) < EVENT_DEDUPE_LONG);
        match self.last.get(&key) {
            Some(t) if now.saturating_duration_since(*t) < window => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }
}

/// The reference of pod `namespace/name` (incarnation `uid`): where an event about it goes.
pub fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}

/// An event to publish (the note is bounded: events are not logs).
pub fn event(warning: bool, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: action.to_string(),
        secondary: None,
    }
}

async fn publish(recorder: &Recorder, reference: &ObjectReference, ev: Event) {
    if let Err(e) = recorder.publish(&ev, reference).await {
        tracing::debug!(error = %crate::infra::apierror::plain(&e), reason = %ev.reason, "publishing an event failed");
    }
}
/// Name of the ConfigMap holding a cluster's capacity memory.
pub fn capacity_configmap(key: &ClusterKey) -> String {
    format!("{}-karpenter-hub-capacity", key.name)
}

/// Runs `task` once per registered workload cluster until `shutdown`: started when a cluster is
/// registered, cancelled (its token) when it is removed. The per-cluster loops of provisioning and
/// disruption run on this.
pub async fn per_cluster<F, Fut>(hub: Arc<Hub>, shutdown: CancellationToken, task: F)
where
    F: Fn(Arc<Hub>, ClusterKey, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks: BTreeMap<ClusterKey, CancellationToken> = BTreeMap::new();
    let mut changes = hub.registry.changes();
    loop {
        let registered: std::collections::BTreeSet<ClusterKey> = hub.registry.clusters().into_iter().collect();
        tasks.retain(|k, t| {
            let keep = registered.contains(k);
            if !keep {
                t.cancel();
                // Unregistered, or (sharded mode) owned by another replica now, which may change
                // it: read it again from its ConfigMap if it comes back.
                hub.forget_capacity(k);
            }
            keep
        });
        for key in registered {
            if !tasks.contains_key(&key) {
                let token = shutdown.child_token();
                tasks.insert(key.clone(), token.clone());
                tokio::spawn(task(hub.clone(), key, token));
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
impl MgmtCache {
    /// The cache over stores a test fills from watcher events ([`crate::infra::cache_fixture`]),
    /// `ready` once every one of them has listed. Nothing announces scope changes.
    pub(crate) fn from_stores(
        claims: Store<NodeClaim>,
        pools: Store<NodePool>,
        classes: Store<CleverNodeClass>,
        catalogs: Store<FlavorCatalog>,
        (buffers, pod_templates, overlays): (Store<CapacityBuffer>, Store<PodTemplate>, Store<NodeOverlay>),
        changes: crate::infra::changes::Changes,
        ready: bool,
    ) -> Self {
        let (_, ready) = tokio::sync::watch::channel(ready);
        let (_, scope) = tokio::sync::watch::channel(0u64);
        let (organizations, _) = reflector::store();
        let spec_changes = tokio::sync::broadcast::channel(256).0;
        Self {
            claims,
            pools,
            classes,
            catalogs,
            organizations,
            buffers,
            pod_templates,
            overlays,
            changes,
            ready,
            scope,
            spec_changes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_reason_on_the_same_object_is_published_once_per_window() {
        let mut d = EventDedupe::default();
        let t0 = std::time::Instant::now();
        assert!(d.first_in_window("NodeClaim/a/x//Quota".into(), t0, EVENT_DEDUPE));
        assert!(!d.first_in_window("NodeClaim/a/x//Quota".into(), t0 + Duration::from_secs(60), EVENT_DEDUPE));
        // Another object or another reason is not suppressed.
        assert!(d.first_in_window("NodeClaim/a/y//Quota".into(), t0, EVENT_DEDUPE));
        assert!(d.first_in_window("NodeClaim/a/x//Vanished".into(), t0, EVENT_DEDUPE));
        assert!(d.first_in_window("NodeClaim/a/x//Quota".into(), t0 + Duration::from_secs(121), EVENT_DEDUPE));
        // The long window holds for an hour.
        assert!(d.first_in_window("NodeGroup//g//Refused".into(), t0, EVENT_DEDUPE_LONG));
        assert!(!d.first_in_window("NodeGroup//g//Refused".into(), t0 + Duration::from_secs(3000), EVENT_DEDUPE_LONG));
        assert!(d.first_in_window("NodeGroup//g//Refused".into(), t0 + Duration::from_secs(3601), EVENT_DEDUPE_LONG));
    }
}
