//! The NodeClaim controller (karpenter-semantics §5, §6; clever-cloud.md §3.4–3.7): for each claim
//! in the management cluster, gather what the hub sees of it (its Node, NodeGroup and pods in the
//! workload cluster, its pool's health, the time), ask [`lifecycle::decide`] what to do, and carry
//! out the writes in order. A claim without its finalizer gets it first, from
//! [`lifecycle::finalizer`], before the facts of its cluster are gathered.
//!
//! Owns: fact gathering and the API writes, each idempotent (deterministic NodeGroup name,
//! adoption after a crash, guarded writes on Nodes, UID preconditions), the claim's status written
//! at most once per pass and only when it differs from the freshest copy known (the cache's, or
//! this controller's own last write while the cache lags). Reads come from the watch caches; the
//! live reads left act on an absence or guard against a duplicate (each says so). The launch
//! sequence's I/O is in `launch`, the Node registration's patch in `register`, the drain's in
//! `drain`, capacity freed by a group gone in `released`. A claim whose cluster is not synced (or
//! not owned here) waits for that cluster's sync, which wakes that cluster's claims only, with a
//! long safety requeue behind it. Besides its own changes, a claim is woken by its Node or
//! NodeGroup changing, a pod event on its node (bound, ended, terminating), and a spec change of its
//! NodePool or CleverNodeClass (or the class's readiness), as the management cache reports them.
//! Must not: decide anything itself (every choice is [`lifecycle`]'s), act on a cluster that is not
//! connected and synced, delete a NodeGroup that fails the ownership proof, or decide which pods go.

mod drain;
mod launch;
mod register;
mod released;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use scheduling::CompactPod;
use serde_json::json;

pub use crate::decisions::lifecycle::{
    CONSISTENT_STATE_FOUND, INITIALIZED, INSTANCE_TERMINATING, LAUNCHED, READY, REGISTERED,
};
pub use drain::evict_exactly;
pub use launch::instance_types;

use crate::{
    decisions::{
        fleet,
        lifecycle::{self, DeleteReason, Facts, Group, NotOurs, PoolHealth, Write},
        node_registration::{self, NodeMatch},
        ownership::{self, Ownership},
        termination::PodFacts,
    },
    infra::{
        errors::{self, ApiError, Categorized, Category, Reconciler, Step, StepExt},
        finalizers,
        hub::{Hub, MgmtCache, SpecChange},
        metrics::{ClaimLabels, Metrics, PoolLabels, PoolReasonLabels},
        registry::{ClusterKey, Connection},
    },
};
use crds::{NodeClaim, NodeClaimStatus, NodeGroup, NodePool, labels};

/// What stops a reconcile; retried with the controller's back-off. A request's failure says its
/// step ([`Step`]); nothing converts from a bare `kube::Error`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("the NodeClaim has no namespace or name")]
    Unnamed,
    #[error("building the Node registration patch: {0}")]
    Patch(serde_json::Error),
}

impl Categorized for Error {
    fn step(&self) -> Step {
        match self {
            Error::Api(e) => e.step,
            Error::Unnamed => Step::IdentifyClaim,
            Error::Patch(_) => Step::BuildRegistrationPatch,
        }
    }

    fn category(&self) -> Category {
        match self {
            Error::Api(e) => e.category,
            Error::Unnamed => Category::InvalidInput,
            Error::Patch(_) => Category::Internal,
        }
    }
}

/// How long the claim this controller's own status write returned is trusted over the cached copy
/// that does not show the write yet (the watch lags behind the write): long enough for any watch to
/// catch up, short enough that a cache that disagrees for another reason is soon believed again.
const WRITTEN_FRESH: Duration = Duration::from_secs(10);

/// The claim each status write of this controller returned, by claim UID, and when. A pass that
/// reads a claim before the watch shows the previous pass's write decides from the written copy
/// instead, so it neither rewrites the same status nor moves a condition's `lastTransitionTime`
/// (see [`lifecycle::freshest`]).
#[derive(Debug, Default)]
struct Written(Mutex<HashMap<String, (Arc<NodeClaim>, Instant)>>);

impl Written {
    fn get(&self, claim: &NodeClaim) -> Option<(Arc<NodeClaim>, Instant)> {
        let uid = claim.metadata.uid.as_deref()?;
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(uid).cloned()
    }

    fn record(&self, claim: NodeClaim) {
        let Some(uid) = claim.metadata.uid.clone() else { return };
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Only recent writes are ever used: the map stays as small as the claims being worked on.
        all.retain(|_, (_, at)| at.elapsed() < WRITTEN_FRESH);
        all.insert(uid, (Arc::new(claim), Instant::now()));
    }
}

/// The controller's context.
struct Ctx {
    hub: Arc<Hub>,
    written: Written,
    gates: launch::Gates,
    refusals: drain::Refusals,
}

/// How long a claim waits for its cluster (not synced, or owned by another replica) when nothing
/// wakes it: a safety net only, since the cluster syncing (after a restart, a reconnection, or
/// ownership coming here) wakes that cluster's claims at once.
const CLUSTER_NOT_READY_RECHECK: Duration = Duration::from_secs(60);

/// Run the controller until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    tokio::spawn(released::run(hub.clone(), shutdown.clone()));
    let claims: Api<NodeClaim> = hub.scoped();
    // A Node or NodeGroup changing in a workload cluster wakes the claim launched as that group
    // (a deleted Node, a vanished group, a node joining) without waiting for its periodic check.
    let cache = hub.cache.clone();
    let touched = hub.registry.touched().filter_map(move |t| {
        let provider_id = ownership::provider_id(&t.group);
        std::future::ready(claim_of(&cache, &t.cluster, |s| s.provider_id.as_deref() == Some(provider_id.as_str())))
    });
    // A pod bound to a claim's node, ended or terminating changes its lastPodEventTime and Empty
    // (§4.1): the claim looks again at once, as upstream's pod-events controller has it.
    let cache = hub.cache.clone();
    let pod_events = hub.registry.pod_events().filter_map(move |e| {
        std::future::ready(claim_of(&cache, &e.cluster, |s| s.node_name.as_deref() == Some(e.node.as_str())))
    });
    // A test moving a manual clock forward re-decides every claim at once (TTLs, expiry, repair);
    // on the real clock this never fires.
    let ticks = hub.settings.clock.advances();
    let controller = Controller::new(claims, watcher::Config::default());
    // A cluster syncing wakes its own claims only (from the controller's store: every claim a pass
    // ever saw is there), not the fleet's.
    let store = controller.store();
    let synced = hub.registry.synced().flat_map(move |key| {
        let wake: Vec<ObjectRef<NodeClaim>> = store
            .state()
            .iter()
            .filter(|c| {
                c.spec.cluster_name == key.name && c.metadata.namespace.as_deref() == Some(key.namespace.as_str())
            })
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect();
        tracing::debug!(cluster = %key, claims = wake.len(), "cluster synced; waking its claims");
        futures::stream::iter(wake)
    });
    // A NodePool's or CleverNodeClass's spec changing may drift its claims (§4.1): they look
    // again at once. The management cache tells which (its status writes are no change).
    let cache = hub.cache.clone();
    let spec_changes = hub.cache.spec_changes().flat_map(move |change| {
        let wake = match change {
            SpecChange::Pool(pool) => claims_where(&cache, pool.namespace.as_deref(), |c| {
                c.labels().get(labels::NODEPOOL) == Some(&pool.name)
            }),
            SpecChange::Class(class) => {
                claims_where(&cache, class.namespace.as_deref(), |c| c.spec.node_class_ref.name == class.name)
            }
        };
        futures::stream::iter(wake)
    });
    controller
        .reconcile_on(touched)
        .reconcile_on(pod_events)
        .reconcile_on(spec_changes)
        .reconcile_on(synced)
        .reconcile_all_on(ticks)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(
            reconcile,
            error_policy,
            Arc::new(Ctx {
                hub,
                written: Written::default(),
                gates: launch::Gates::default(),
                refusals: drain::Refusals::default(),
            }),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "nodeclaim reconcile failed");
            }
        })
        .await;
}

/// The cached claims in namespace `ns` that `matches` selects.
fn claims_where(
    cache: &MgmtCache,
    ns: Option<&str>,
    matches: impl Fn(&NodeClaim) -> bool,
) -> Vec<ObjectRef<NodeClaim>> {
    let Some(ns) = ns else { return Vec::new() };
    cache.claims_in(ns).iter().filter(|c| matches(c)).map(|c| ObjectRef::from_obj(c.as_ref())).collect()
}

/// The cached claim of workload cluster `cluster` whose status `matches` (its provider ID, its
/// Node), if any.
fn claim_of(
    cache: &MgmtCache,
    cluster: &ClusterKey,
    matches: impl Fn(&NodeClaimStatus) -> bool,
) -> Option<ObjectRef<NodeClaim>> {
    cache
        .claims_in(&cluster.namespace)
        .into_iter()
        .find(|c| c.spec.cluster_name == cluster.name && c.status.as_ref().is_some_and(&matches))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
}

fn error_policy(claim: Arc<NodeClaim>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let ns = claim.namespace().unwrap_or_default();
    let (step, category) = (e.step().label(), e.category());
    let key = ClusterKey::new(ns.clone(), claim.spec.cluster_name.clone());
    errors::count(&ctx.hub, Reconciler::NodeClaim, Some(&key), e);
    if category == Category::KubernetesConflict {
        // Optimistic concurrency doing its job (e.g. the kubelet updated the Node meanwhile): retry soon.
        tracing::debug!(nodeclaim = %claim.name_any(), namespace = %ns, step, category = category.as_str(), error = %e, "write conflict; retrying");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(nodeclaim = %claim.name_any(), namespace = %ns, step, category = category.as_str(), error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[derive(Clone)]
struct Claim<'a> {
    obj: &'a NodeClaim,
    written: &'a Written,
    gates: &'a launch::Gates,
    refusals: &'a drain::Refusals,
    ns: String,
    name: String,
    key: ClusterKey,
    api: Api<NodeClaim>,
}

impl Claim<'_> {
    fn reference(&self) -> ObjectReference {
        self.obj.object_ref(&())
    }

    fn pool(&self) -> PoolLabels {
        PoolLabels {
            cluster: self.key.to_string(),
            nodepool: self.obj.labels().get(labels::NODEPOOL).cloned().unwrap_or_default(),
        }
    }

    fn claim_labels(&self) -> ClaimLabels {
        let PoolLabels { cluster, nodepool } = self.pool();
        ClaimLabels { cluster, nodepool, nodeclaim: self.name.clone() }
    }

    fn disrupted(&self, reason: &str) -> PoolReasonLabels {
        let PoolLabels { cluster, nodepool } = self.pool();
        PoolReasonLabels { cluster, nodepool, reason: reason.to_string() }
    }

    /// The claim's NodeGroup: from its provider ID, or the deterministic name before launch.
    fn group_name(&self, hub: &Hub) -> String {
        self.obj
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| ownership::parse_provider_id(p).ok().map(str::to_string))
            .unwrap_or_else(|| ownership::nodegroup_name(&hub.settings.hub_id, &self.ns, &self.name))
    }
}

async fn reconcile(obj: Arc<NodeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let hub = ctx.hub.clone();
    let (Some(ns), Some(name)) = (obj.namespace(), obj.metadata.name.clone()) else {
        return Err(Error::Unnamed);
    };
    let obj = match ctx.written.get(&obj) {
        Some((written, at))
            if std::ptr::eq(
                lifecycle::freshest(&obj, Some((&written, at.elapsed())), WRITTEN_FRESH),
                written.as_ref(),
            ) =>
        {
            written
        }
        _ => obj,
    };
    let c = Claim {
        obj: &obj,
        written: &ctx.written,
        gates: &ctx.gates,
        refusals: &ctx.refusals,
        key: ClusterKey::new(ns.clone(), obj.spec.cluster_name.clone()),
        api: Api::namespaced(hub.mgmt.clone(), &ns),
        ns,
        name,
    };
    // Sharded mode (hub.md §6): only the replica owning the claim's cluster acts on the claim.
    if !hub.registry.writes_for(&c.key) {
        // Woken when ownership comes here (its connection syncs).
        return Ok(Action::requeue(CLUSTER_NOT_READY_RECHECK));
    }
    // Cluster API pause (hub.md): nothing is written for a paused cluster, a claim's finalizer
    // included — `clusterctl move` drops the claims' finalizers and deletes them, and a finalizer
    // added back meanwhile would keep a claim forever. The resume wakes the cluster's claims.
    if hub.registry.paused_by(&c.key).is_some() {
        return Ok(Action::requeue(CLUSTER_NOT_READY_RECHECK));
    }
    // Nothing to do for a claim already released; a new one gets the finalizer before anything
    // else, whatever the state of its (unpaused) cluster.
    if let Some(decision) = lifecycle::finalizer(&obj) {
        for write in decision.writes {
            if let Some(action) = carry_out_on_claim(&c, &hub, write).await? {
                return Ok(action);
            }
        }
        return Ok(decision.requeue.map_or_else(Action::await_change, Action::requeue));
    }
    let deleting = obj.metadata.deletion_timestamp.is_some();
    let Some(conn) = hub.registry.connection(&c.key).filter(|c| c.is_synced()) else {
        // No decisions, and no writes, on a cluster we cannot see; woken when it syncs.
        tracing::debug!(cluster = %c.key, nodeclaim = %c.name, "cluster not synced; waiting for it");
        return Ok(Action::requeue(CLUSTER_NOT_READY_RECHECK));
    };
    let group_name = c.group_name(&hub);
    let launched = obj.status.as_ref().and_then(|s| s.provider_id.as_deref()).is_some();
    if launched && !deleting {
        stamp_provider_id(&hub, &conn, &group_name).await?;
    }
    let provider_id = obj.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    let nodes = conn.cache.nodes.state();
    let node = if provider_id.is_empty() {
        NodeMatch::NotFound
    } else {
        node_registration::find_node(nodes.iter().map(|n| n.as_ref()), &provider_id)
    };
    // The pods bound to the claim's Node: drained when leaving, and the source of Empty,
    // Consolidatable and lastPodEventTime otherwise.
    let bound: Vec<Arc<CompactPod>> = match &node {
        NodeMatch::One(n) => {
            let node_name = n.name_any();
            conn.cache
                .pods
                .state()
                .into_iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str()))
                .collect()
        }
        _ => Vec::new(),
    };
    let pods: Vec<PodFacts> = if deleting { bound.iter().map(|p| PodFacts::from_pod(p)).collect() } else { Vec::new() };
    let node_pods: Vec<&CompactPod> = bound.iter().map(AsRef::as_ref).collect();
    let nodepool = obj
        .labels()
        .get(labels::NODEPOOL)
        .and_then(|pool| hub.cache.pools.get(&ObjectRef::<NodePool>::new(pool).within(&c.ns)));
    let nodeclass =
        hub.cache.classes.get(&ObjectRef::<crds::CleverNodeClass>::new(&obj.spec.node_class_ref.name).within(&c.ns));
    // The flavors its class serves now, from the cached catalogue (a FlavorCatalog may have dropped
    // the claim's flavor: InstanceTypeNotFound drift). A catalogue missing or refused is a problem
    // to fix, not a verdict on the flavors: not known, so no drift.
    let offered: Option<Vec<String>> = nodeclass.as_deref().and_then(|class| {
        let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
        let found = reference
            .and_then(|name| hub.cache.catalogs.get(&ObjectRef::<crds::FlavorCatalog>::new(name).within(&c.ns)));
        match crds::catalog::served(&crds::catalog::Catalog::builtin(), reference, found.as_deref()) {
            (catalog, None) => Some(catalog.instance_types(&hub.settings.zone).into_iter().map(|t| t.name).collect()),
            (_, Some(_problem)) => None,
        }
    });
    let departed = nodepool.as_deref().is_some_and(|p| {
        let key = ClusterKey::new(c.ns.clone(), obj.spec.cluster_name.clone());
        fleet::departed(p, &key.name, &hub.registry.labels(&key), hub.registry.labels_settled())
    });
    let now = hub.now();
    let settings = hub.settings.lifecycle;
    // Termination acts on the group's absence and ownership: always read live. The object read is
    // kept for the deletion's UID precondition.
    let (group, mut live_group) = if deleting {
        group_live(&c, &hub, &conn, &group_name).await?
    } else {
        (group_cached(&conn, &group_name), None)
    };
    let mut facts = Facts {
        claim: &obj,
        node,
        group,
        pods: &pods,
        attachments: None,
        pool: pool_health(&c, &hub, &nodes, now),
        nodepool: nodepool.as_deref(),
        departed,
        nodeclass: nodeclass.as_deref(),
        offered: offered.as_deref(),
        node_pods: &node_pods,
        now,
    };
    let mut decision = lifecycle::decide(&facts, &settings);
    // Each extra read is made only when the decision rests on it (at most one of each).
    let attachments = std::cell::OnceCell::new();
    for _ in 0..2 {
        if decision.needs_live_group {
            (facts.group, live_group) = group_live(&c, &hub, &conn, &group_name).await?;
        } else if decision.needs_attachments {
            let list = match &facts.node {
                NodeMatch::One(n) => {
                    drain::volume_attachments(&conn, &n.name_any()).await.step(Step::ListVolumeAttachments)?
                }
                _ => Vec::new(),
            };
            facts.attachments = Some(attachments.get_or_init(|| list).as_slice());
        } else {
            break;
        }
        decision = lifecycle::decide(&facts, &settings);
    }
    if !decision.why.is_empty() {
        tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, "{}", decision.why);
    }
    let node = match &facts.node {
        NodeMatch::One(n) => Some(*n),
        _ => None,
    };
    for write in decision.writes {
        if let Some(action) = carry_out(&c, &hub, &conn, node, live_group.as_ref(), &group_name, write).await? {
            return Ok(action);
        }
    }
    Ok(decision.requeue.map_or_else(Action::await_change, Action::requeue))
}

/// The claim's group as the cache sees it (enough to know it is there; absence is confirmed live).
fn group_cached(conn: &Connection, group_name: &str) -> Group {
    if conn.cache.nodegroups.state().iter().any(|g| g.name_any() == group_name && !g.is_terminating()) {
        Group::Cached
    } else {
        Group::MissingFromCache
    }
}

/// An uncached read of the claim's group, with its ownership proof.
async fn group_live(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    group_name: &str,
) -> Result<(Group, Option<NodeGroup>), Error> {
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    let live = hub.metrics.cloudprovider(&c.key, "get", groups.get_opt(group_name)).await.step(Step::ReadNodeGroup)?;
    let who = hub.owner_on(&c.key);
    let group = match &live {
        None => Group::NotFound,
        Some(g) if g.is_terminating() => Group::Terminating,
        Some(g) => Group::Present {
            ours: match ownership::prove(g, who.owner(), &c.ns) {
                p if p.is_claims(&c.name, c.obj.metadata.uid.as_deref().unwrap_or_default()) => Ok(()),
                Ownership::Refused(why) => Err(NotOurs(why)),
                _ => Err(NotOurs("it is not this claim's".to_string())),
            },
        },
    };
    Ok((group, live))
}

/// The repair cap's inputs (§6.5): the Nodes of the claim's pool in its cluster, and how many of
/// them are unhealthy past the toleration. Pool-less claims count the whole cluster.
fn pool_health(c: &Claim<'_>, hub: &Hub, nodes: &[Arc<Node>], now: k8s_openapi::jiff::Timestamp) -> PoolHealth {
    let pool = c.obj.labels().get(labels::NODEPOOL);
    let members = nodes.iter().filter(|n| {
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|p| p.starts_with("clevercloud://"))
            && (pool.is_none() || n.labels().get(labels::NODEPOOL) == pool)
    });
    let mut health = PoolHealth::default();
    for n in members {
        health.nodes += 1;
        if lifecycle::past_toleration(n, &hub.settings.lifecycle.repair, now) {
            health.unhealthy += 1;
        }
    }
    health
}

/// Carry out one write. `Some(action)` ends the pass there (a write whose effect the next pass must
/// read back first). The writes on the workload cluster are here; those on the claim and the hub's
/// own state are [`carry_out_on_claim`]'s.
async fn carry_out(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    node: Option<&Node>,
    live_group: Option<&NodeGroup>,
    group_name: &str,
    write: Write,
) -> Result<Option<Action>, Error> {
    let nodes: Api<Node> = Api::all(conn.client.clone());
    match write {
        Write::Launch(launching) => return launch::launch(c, hub, conn, launching.map(|s| *s)).await.map(Some),
        Write::RegisterNode(desired) => {
            // Only the fields the hub owns, the taints guarded by a test (see `register`): the
            // kubelet's writes to the Node do not conflict.
            let Some(read) = node else { return Ok(Some(Action::requeue(Duration::from_millis(100)))) };
            if !register::register(&nodes, read, &desired).await? {
                // The taints test failed: the kubelet changed them meanwhile; the next pass
                // registers on the list it sees then.
                tracing::debug!(cluster = %c.key, nodeclaim = %c.name, node = %desired.name_any(), "node taints changed during registration; retrying");
                return Ok(Some(Action::requeue(Duration::from_millis(500))));
            }
        }
        Write::LabelInitialized { node } => {
            let patch = json!({"metadata": {"labels": {labels::INITIALIZED: "true"}}});
            nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .step(Step::LabelNodeInitialized)?;
        }
        Write::ReleaseCapacity { gone } => {
            if hub.release_capacity(&c.key, group_name, gone, hub.now()).await.step(Step::WriteCapacity)? {
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, gone, "an accepted NodeGroup is going: the flavor cool-downs and the creation back-off end when it is gone");
            }
        }
        Write::TaintNode => {
            if let Some(node) = node
                && !drain::taint(conn, node).await.step(Step::CordonNode)?
            {
                // Gone meanwhile: the next pass sees it.
                return Ok(Some(Action::requeue(Duration::from_millis(100))));
            }
        }
        Write::Drain(pass) => {
            let waiting = i64::try_from(pass.waiting.len()).unwrap_or(i64::MAX);
            hub.metrics.drain_waiting_pods.get(&c.claim_labels()).set(waiting);
            if let Some(node) = node {
                drain::carry_out(c, hub, conn, node, &pass).await;
            }
        }
        Write::DeleteGroup => {
            // Decided on a live read of this pass (the decision asks for one first).
            if let Some(g) = live_group {
                let groups: Api<NodeGroup> = Api::all(conn.client.clone());
                let dp = ownership::delete_exactly(g);
                match hub.metrics.cloudprovider(&c.key, "delete", groups.delete(group_name, &dp)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(Step::DeleteNodeGroup.failed(e).into()),
                }
            }
        }
        Write::ReleaseNodeFinalizers => {
            finalizers::release_from_nodes(conn, group_name).await.step(Step::ReleaseNodeFinalizers)?;
        }
        on_claim => return carry_out_on_claim(c, hub, on_claim).await,
    }
    Ok(None)
}

/// Carry out one write that touches no workload cluster: on the claim itself, the hub's own state,
/// its metrics and events. `Some(action)` ends the pass there. Also what carries out the
/// [`lifecycle::finalizer`] phase, before the claim's cluster is looked at: a write that needs that
/// cluster is not made then (none is asked for there), and the claim waits for the cluster's sync.
async fn carry_out_on_claim(c: &Claim<'_>, hub: &Hub, write: Write) -> Result<Option<Action>, Error> {
    match write {
        Write::AddFinalizer => {
            c.api
                .patch(&c.name, &PatchParams::default(), &Patch::Merge(&finalizers::patch(c.obj, true)))
                .await
                .step(Step::AddClaimFinalizer)?;
            return Ok(Some(Action::await_change()));
        }
        Write::Status(status) => write_status(c, *status).await?,
        Write::TerminationTimestamp(at) => {
            let patch = json!({"metadata": {"annotations": {labels::TERMINATION_TIMESTAMP: at.to_string()}}});
            c.api
                .patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .step(Step::StampTerminationTimestamp)?;
        }
        Write::RestampPoolHash { hash, version } => {
            let patch = json!({"metadata": {"annotations": {
                crds::drift::NODEPOOL_HASH_ANNOTATION: hash,
                crds::drift::NODEPOOL_HASH_VERSION_ANNOTATION: version,
            }}});
            c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch)).await.step(Step::RestampPoolHash)?;
        }
        Write::DeleteClaim(reason) => {
            match c.api.delete(&c.name, &ownership::delete_exactly(c.obj)).await {
                Ok(_) => {}
                // Gone, or (409) replaced by a new claim of that name since it was read.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Step::DeleteClaim.failed(e).into()),
            }
            // Counted once the deletion went through: a failed one is retried, not counted twice.
            if let Some(label) = reason.disrupted_label() {
                hub.metrics.nodeclaims_disrupted.get(&c.disrupted(label)).inc();
            }
            if reason == DeleteReason::Vanished {
                Metrics::inc(&hub.metrics.vanished, &c.key);
            }
        }
        Write::RecordVanish { flavor } => {
            let now = hub.now();
            hub.update_capacity(&c.key, now, |s| s.record_vanish(&flavor, now, hub.settings.capacity))
                .await
                .step(Step::WriteCapacity)?;
        }
        Write::RegistrationOutcome { registered } => hub.record_registration(&c.ns, &c.pool().nodepool, registered),
        Write::NodeCreated => {
            hub.metrics.nodes_created.get(&c.pool()).inc();
        }
        Write::NodeDrained => {
            hub.metrics.nodes_drained.get(&c.pool()).inc();
            hub.metrics.drain_waiting_pods.remove(&c.claim_labels());
        }
        Write::RemoveFinalizer => {
            match c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&finalizers::patch(c.obj, false))).await {
                Ok(_) => {
                    hub.metrics.nodeclaims_terminated.get(&c.pool()).inc();
                    hub.metrics.drain_waiting_pods.remove(&c.claim_labels());
                    if let Some(deleted) = c.obj.metadata.deletion_timestamp.as_ref() {
                        let took = hub.now().duration_since(deleted.0).as_secs_f64().max(0.0);
                        hub.metrics.termination_duration.get(&c.pool()).observe(took);
                    }
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %c.group_name(hub), "NodeClaim terminated");
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Step::RemoveClaimFinalizer.failed(e).into()),
            }
        }
        Write::Event(e) => hub.event(&c.reference(), e.warning, e.reason, e.action, e.note).await,
        Write::Launch(_)
        | Write::RegisterNode(_)
        | Write::LabelInitialized { .. }
        | Write::ReleaseCapacity { .. }
        | Write::TaintNode
        | Write::Drain(_)
        | Write::DeleteGroup
        | Write::ReleaseNodeFinalizers => {
            // No writes on a cluster we cannot see; woken when it syncs.
            return Ok(Some(Action::requeue(CLUSTER_NOT_READY_RECHECK)));
        }
    }
    Ok(None)
}

/// Write the claim's whole status (one patch per pass) and remember what the API returned.
async fn write_status(c: &Claim<'_>, status: NodeClaimStatus) -> Result<(), Error> {
    let patch = json!({"status": status});
    let written = c
        .api
        .patch_status(&c.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .step(Step::WriteClaimStatus)?;
    c.written.record(written);
    Ok(())
}

/// The hub's registration pre-step: CKE leaves `spec.providerID` empty; stamp the Node of a group
/// this scope owns (write-once).
async fn stamp_provider_id(hub: &Hub, conn: &Connection, group: &str) -> Result<(), Error> {
    if group.is_empty() {
        return Ok(());
    }
    let who = hub.owner_on(&conn.key);
    let owner = who.owner();
    let owned = |g: &str| {
        g == group
            && conn.cache.nodegroups.state().iter().any(|ng| {
                ng.name_any() == g
                    && matches!(
                        ownership::prove(ng, owner, &conn.key.namespace),
                        Ownership::Owned { .. } | Ownership::Legacy { .. } | Ownership::Moved { .. }
                    )
            })
    };
    for node in conn.cache.nodes.state() {
        if let Some(id) = node_registration::provider_id_to_stamp(&node, owned) {
            let nodes: Api<Node> = Api::all(conn.client.clone());
            let patch = json!({"spec": {"providerID": id}});
            nodes
                .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .step(Step::StampProviderId)?;
            tracing::info!(cluster = %conn.key, node = %node.name_any(), provider_id = %id, "stamped provider ID");
        }
    }
    Ok(())
}
