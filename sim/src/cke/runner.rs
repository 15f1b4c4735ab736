//! `sim::cke::runner`: runs the simulated CKE's planners against a Kubernetes API.
//!
//! Owns: start-up (stand-in NodeGroup CRD, control-plane Nodes), the reflectors (NodeGroups, Nodes,
//! Pods), one loop per role (NodeGroup controller, kubelet stand-in, binder) that runs its planner
//! when a watch event arrives or a simulated delay expires, and the API writes. All simulated time
//! goes through [`Clock`]; only the retry pause after a failed write is wall time (API-level).
//!
//! Must not: decide anything itself (the planners do), block on a manual clock nobody advances
//! (every wait also wakes on watch events and cancellation), or end on an API error after start-up.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use crds::nodegroup::NodeGroup;
use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::CkeError;
use super::binder::{self, BinderAction, BinderTracker};
use super::config::SimCkeConfig;
use super::kubelet::{self, KubeletAction, KubeletTracker};
use super::nodegroup::{self, GroupAction, GroupTracker};
use super::objects::{self, NodeSpecInput};
use crate::clock::Clock;

/// Pause before retrying after a failed write (wall time: it waits on the API, not on the simulation).
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// Concurrent writes of the kubelet stand-in and the binder.
const WRITE_CONCURRENCY: usize = 16;
/// How long start-up waits for a freshly installed NodeGroup CRD to be served.
const CRD_WAIT: Duration = Duration::from_secs(30);
/// Wall-time pause after a watch event before a pass, so a burst of events makes one pass.
const COALESCE: Duration = Duration::from_millis(5);

/// A simulated CKE, ready to run against one cluster.
pub struct SimCke {
    client: Client,
    config: SimCkeConfig,
    clock: Clock,
}

impl Debug for SimCke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCke").field("config", &self.config).field("clock", &self.clock).finish_non_exhaustive()
    }
}

/// State shared between a running simulator and its handle.
#[derive(Debug)]
struct Shared {
    config: RwLock<SimCkeConfig>,
    vanished: Mutex<Vec<String>>,
    poke_groups: Notify,
    poke_kubelet: Notify,
    poke_binder: Notify,
}

impl Shared {
    fn config(&self) -> SimCkeConfig {
        self.config.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn poke_all(&self) {
        self.poke_groups.notify_one();
        self.poke_kubelet.notify_one();
        self.poke_binder.notify_one();
    }
}

/// A simulated CKE running in the background ([`SimCke::spawn`]).
#[derive(Debug)]
pub struct SimCkeHandle {
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), CkeError>>,
    shared: Arc<Shared>,
}

impl SimCkeHandle {
    /// Stops the simulator and waits for it; returns its start-up error if it had one. A member of
    /// a shared organisation (`quota.organization`) no longer counts there once this returns.
    pub async fn stop(self) -> Result<(), CkeError> {
        self.token.cancel();
        self.task.await.map_err(|e| CkeError::Task(e.to_string()))?
    }

    /// Changes the configuration of the running simulator (quota, delays, vanish rules, …); the
    /// next pass of every loop uses it. Roles (`nodegroups`, `kubelet`, `binder`) and start-up
    /// settings are fixed at start.
    pub fn update_config(&self, f: impl FnOnce(&mut SimCkeConfig)) {
        {
            let mut cfg = self.shared.config.write().unwrap_or_else(PoisonError::into_inner);
            f(&mut cfg);
        }
        self.shared.poke_all();
    }

    /// Names of the NodeGroups the simulator made vanish, in order.
    pub fn vanished(&self) -> Vec<String> {
        self.shared.vanished.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether the simulator has stopped (cancelled, or failed at start-up).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl SimCke {
    /// A simulator for the cluster `client` talks to, on the wall clock.
    pub fn new(client: Client, config: SimCkeConfig) -> SimCke {
        SimCke { client, config, clock: Clock::real() }
    }

    /// Uses `clock` for every simulated delay (a manual clock makes them free in tests).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> SimCke {
        self.clock = clock;
        self
    }

    /// Runs until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), CkeError> {
        let token = CancellationToken::new();
        let shared = Arc::new(shared(self.config));
        let run = run_inner(self.client, shared, self.clock, token.clone());
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            () = shutdown => {
                token.cancel();
                run.await
            }
        }
    }

    /// Starts the simulator on the current tokio runtime.
    pub fn spawn(self) -> SimCkeHandle {
        let token = CancellationToken::new();
        let shared = Arc::new(shared(self.config));
        let task = tokio::spawn(run_inner(self.client, shared.clone(), self.clock, token.clone()));
        SimCkeHandle { token, task, shared }
    }
}

fn shared(config: SimCkeConfig) -> Shared {
    Shared {
        config: RwLock::new(config),
        vanished: Mutex::new(Vec::new()),
        poke_groups: Notify::new(),
        poke_kubelet: Notify::new(),
        poke_binder: Notify::new(),
    }
}

async fn run_inner(
    client: Client,
    shared: Arc<Shared>,
    clock: Clock,
    token: CancellationToken,
) -> Result<(), CkeError> {
    let cfg = shared.config();
    info!(
        seed = cfg.seed,
        nodegroups = cfg.nodegroups,
        kubelet = cfg.kubelet,
        binder = cfg.binder,
        "simulated CKE starting"
    );
    if cfg.nodegroups && cfg.install_crd {
        ensure_crd(&client, &token).await?;
    }
    if cfg.control_plane.create_nodes {
        ensure_control_plane(&client, &cfg, &clock, &token).await?;
    }

    let mut tasks = JoinSet::new();
    let (groups, groups_writer) = reflector::store::<NodeGroup>();
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (pods, pods_writer) = reflector::store::<Pod>();
    if cfg.nodegroups {
        let api = Api::<NodeGroup>::all(client.clone());
        tasks.spawn(watch(api, groups_writer, shared.clone(), Role::Groups, token.clone()));
    }
    tasks.spawn(watch(Api::<Node>::all(client.clone()), nodes_writer, shared.clone(), Role::Nodes, token.clone()));
    if cfg.kubelet || cfg.binder {
        tasks.spawn(watch(Api::<Pod>::all(client.clone()), pods_writer, shared.clone(), Role::Pods, token.clone()));
    }

    // Each loop starts once its own caches are synced (a missing NodeGroup API must not hold the
    // kubelet and the binder back). One task waits per store: a store wakes a single waiter.
    let groups_synced = sync_flag(&mut tasks, groups.clone(), token.clone());
    let nodes_synced = sync_flag(&mut tasks, nodes.clone(), token.clone());
    let pods_synced = sync_flag(&mut tasks, pods.clone(), token.clone());
    let ctx = || LoopCtx { client: client.clone(), shared: shared.clone(), clock: clock.clone(), token: token.clone() };
    if cfg.nodegroups {
        let (ctx, groups, nodes) = (ctx(), groups, nodes.clone());
        let flags = vec![groups_synced, nodes_synced.clone()];
        tasks.spawn(async move {
            if synced(&ctx.token, "NodeGroup controller", flags).await {
                nodegroup_loop(ctx, groups, nodes).await;
            }
        });
    }
    if cfg.kubelet {
        let (kubelet_ctx, kubelet_nodes, kubelet_pods) = (ctx(), nodes.clone(), pods.clone());
        let flags = vec![nodes_synced.clone(), pods_synced.clone()];
        tasks.spawn(async move {
            if synced(&kubelet_ctx.token, "kubelet", flags).await {
                kubelet_loop(kubelet_ctx, kubelet_nodes, kubelet_pods).await;
            }
        });
        let (lease_ctx, lease_nodes) = (ctx(), nodes.clone());
        let flags = vec![nodes_synced.clone()];
        tasks.spawn(async move {
            if synced(&lease_ctx.token, "node leases", flags).await {
                lease_loop(lease_ctx, lease_nodes).await;
            }
        });
    }
    if cfg.binder {
        let ctx = ctx();
        let flags = vec![nodes_synced, pods_synced];
        tasks.spawn(async move {
            if synced(&ctx.token, "binder", flags).await {
                binder_loop(ctx, nodes, pods).await;
            }
        });
    }

    loop {
        tokio::select! {
            () = token.cancelled() => break,
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    token.cancel();
                    return Err(CkeError::Task(e.to_string()));
                }
            }
        }
    }
    tasks.shutdown().await;
    info!("simulated CKE stopped");
    Ok(())
}

/// Starts a task that waits for `store` to be synced and raises the returned flag (false stays if
/// the writer is gone).
fn sync_flag<K>(tasks: &mut JoinSet<()>, store: Store<K>, token: CancellationToken) -> watch::Receiver<bool>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (tx, rx) = watch::channel(false);
    tasks.spawn(async move {
        tokio::select! {
            () = token.cancelled() => {}
            ready = store.wait_until_ready() => {
                tx.send_replace(ready.is_ok());
                // Keep the sender: receivers read the flag until shutdown.
                token.cancelled().await;
            }
        }
    });
    rx
}

/// Waits until every flag is raised; false if cancelled first.
async fn synced(token: &CancellationToken, role: &str, flags: Vec<watch::Receiver<bool>>) -> bool {
    let all =
        futures::future::join_all(flags.into_iter().map(|mut rx| async move { rx.wait_for(|ok| *ok).await.is_ok() }));
    tokio::select! {
        () = token.cancelled() => false,
        results = all => {
            let ok = results.iter().all(|synced| *synced);
            if ok {
                info!(role, "simulated CKE caches synced");
            }
            ok
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Groups,
    Nodes,
    Pods,
}

async fn watch<K>(api: Api<K>, writer: Writer<K>, shared: Arc<Shared>, role: Role, token: CancellationToken)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let events = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::pin!(events);
    loop {
        let next = tokio::select! {
            () = token.cancelled() => return,
            next = events.next() => next,
        };
        match next {
            None => return,
            Some(Ok(_)) => match role {
                Role::Groups => shared.poke_groups.notify_one(),
                Role::Nodes => shared.poke_all(),
                Role::Pods => {
                    shared.poke_kubelet.notify_one();
                    shared.poke_binder.notify_one();
                }
            },
            Some(Err(error)) => warn!(?role, %error, "simulated CKE watch error (retrying)"),
        }
    }
}

/// What every loop needs.
struct LoopCtx {
    client: Client,
    shared: Arc<Shared>,
    clock: Clock,
    token: CancellationToken,
}

/// Waits between passes: for a watch event, the earliest simulated deadline, a retry pause or
/// cancellation. Keeps one clock sleeper per deadline across waits.
struct Waiter {
    clock: Clock,
    sleep: Option<(DateTime<Utc>, BoxedSleep)>,
}

/// A pending clock sleep.
type BoxedSleep = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Waiter {
    fn new(clock: Clock) -> Waiter {
        Waiter { clock, sleep: None }
    }

    /// Returns false once cancelled.
    async fn wait(
        &mut self,
        poke: &Notify,
        token: &CancellationToken,
        wake_at: Option<DateTime<Utc>>,
        retry: bool,
    ) -> bool {
        match wake_at {
            Some(at) if self.sleep.as_ref().is_none_or(|(t, _)| *t != at) => {
                let clock = self.clock.clone();
                self.sleep = Some((at, Box::pin(async move { clock.sleep_until(at).await })));
            }
            Some(_) => {}
            None => self.sleep = None,
        }
        let timer = async {
            match self.sleep.as_mut() {
                Some((_, f)) => f.as_mut().await,
                None => std::future::pending().await,
            }
        };
        let retry_pause = async {
            if retry {
                tokio::time::sleep(RETRY_AFTER).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let (cancelled, timer_fired, poked) = tokio::select! {
            () = token.cancelled() => (true, false, false),
            () = poke.notified() => (false, false, true),
            () = timer => (false, true, false),
            () = retry_pause => (false, false, false),
        };
        if timer_fired {
            self.sleep = None;
        }
        if poked {
            // Let the rest of a burst of events arrive: one pass for all of them.
            tokio::time::sleep(COALESCE).await;
        }
        !cancelled
    }
}

fn snapshot<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

async fn nodegroup_loop(ctx: LoopCtx, groups: Store<NodeGroup>, nodes: Store<Node>) {
    let mut tracker = GroupTracker::default();
    let mut waiter = Waiter::new(ctx.clock.clone());
    loop {
        let cfg = ctx.shared.config();
        let now = ctx.clock.now();
        let plan = nodegroup::plan(&cfg, now, &snapshot(&groups), &snapshot(&nodes), &mut tracker);
        let mut failed = false;
        for action in &plan.actions {
            if let Err(error) = exec_group(&ctx.client, action).await {
                failed = true;
                tracker.failed(action);
                warn!(action = %action.summary(), %error, "simulated CKE: NodeGroup controller write failed (retrying)");
            }
        }
        {
            let mut vanished = ctx.shared.vanished.lock().unwrap_or_else(PoisonError::into_inner);
            vanished.clone_from(&tracker.vanished().to_vec());
        }
        if !waiter.wait(&ctx.shared.poke_groups, &ctx.token, plan.wake_at, failed).await {
            return;
        }
    }
}

async fn kubelet_loop(ctx: LoopCtx, nodes: Store<Node>, pods: Store<Pod>) {
    let mut tracker = KubeletTracker::default();
    let mut waiter = Waiter::new(ctx.clock.clone());
    loop {
        let cfg = ctx.shared.config();
        let now = ctx.clock.now();
        let plan = kubelet::plan(&cfg, now, &snapshot(&nodes), &snapshot(&pods), &mut tracker);
        let results: Vec<(String, Result<(), kube::Error>)> = stream::iter(plan.actions)
            .map(|action| {
                let client = ctx.client.clone();
                async move { (action.key(), exec_kubelet(&client, &action).await) }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        let mut failed = false;
        for (key, result) in results {
            if let Err(error) = result {
                failed = true;
                tracker.failed(&key);
                warn!(%key, %error, "simulated kubelet: write failed (retrying)");
            }
        }
        if !waiter.wait(&ctx.shared.poke_kubelet, &ctx.token, plan.wake_at, failed).await {
            return;
        }
    }
}

/// Renews the heartbeat Lease of every simulated node each `node_lease_interval` of clock time.
async fn lease_loop(ctx: LoopCtx, nodes: Store<Node>) {
    const LEASE_DURATION: Duration = Duration::from_secs(40);
    loop {
        let interval = ctx.shared.config().node_lease_interval;
        if let Some(interval) = interval {
            let now = ctx.clock.now();
            let live: Vec<(String, String)> = nodes
                .state()
                .iter()
                .filter(|n| kubelet::is_simulated(n) && n.metadata.deletion_timestamp.is_none())
                .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.uid.clone()?)))
                .collect();
            let failures = stream::iter(live)
                .map(|(name, uid)| {
                    let client = ctx.client.clone();
                    async move { renew_lease(&client, &name, &uid, LEASE_DURATION, now).await.err().map(|e| (name, e)) }
                })
                .buffer_unordered(WRITE_CONCURRENCY)
                .filter_map(|failure| async move { failure })
                .collect::<Vec<_>>()
                .await;
            for (node, error) in failures {
                warn!(%node, %error, "simulated kubelet: node lease renewal failed");
            }
            let next = now + chrono::Duration::from_std(interval).unwrap_or(chrono::Duration::MAX);
            tokio::select! {
                () = ctx.token.cancelled() => return,
                () = ctx.clock.sleep_until(next) => {}
            }
        } else {
            // Renewals off: look again later (the setting can change at run time).
            tokio::select! {
                () = ctx.token.cancelled() => return,
                () = ctx.clock.sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// Renews (or creates) a node's heartbeat Lease.
async fn renew_lease(
    client: &Client,
    node: &str,
    uid: &str,
    duration: Duration,
    now: DateTime<Utc>,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), objects::NODE_LEASE_NAMESPACE);
    let object = objects::node_lease(node, uid, duration, now);
    let patch = json!({"spec": object.get("spec").cloned().unwrap_or(Value::Null)});
    match leases.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            let lease: Lease = match serde_json::from_value(object) {
                Ok(l) => l,
                Err(error) => {
                    warn!(%node, %error, "simulated kubelet: built an invalid Lease (bug)");
                    return Ok(());
                }
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

async fn binder_loop(ctx: LoopCtx, nodes: Store<Node>, pods: Store<Pod>) {
    let mut tracker = BinderTracker::default();
    let mut waiter = Waiter::new(ctx.clock.clone());
    loop {
        let now = ctx.clock.now();
        let actions = binder::plan(now, &snapshot(&nodes), &snapshot(&pods), &mut tracker);
        let results: Vec<(BinderAction, Result<(), kube::Error>)> = stream::iter(actions)
            .map(|action| {
                let client = ctx.client.clone();
                let clock = ctx.clock.clone();
                async move {
                    let result = exec_binder(&client, &action, clock.now()).await;
                    (action, result)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        let mut failed = false;
        for (action, result) in results {
            if let Err(error) = result {
                failed = true;
                tracker.failed(&action);
                warn!(?action, %error, "simulated binder: write failed (retrying)");
            }
        }
        if !waiter.wait(&ctx.shared.poke_binder, &ctx.token, None, failed).await {
            return;
        }
    }
}

/// Treats "already gone" (404) as done.
fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

async fn exec_group(client: &Client, action: &GroupAction) -> Result<(), kube::Error> {
    let groups: Api<NodeGroup> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::default();
    match action {
        GroupAction::SetFinalizers { group, resource_version, finalizers } => {
            let list = if finalizers.is_empty() { Value::Null } else { json!(finalizers) };
            let patch = json!({"metadata": {"finalizers": list, "resourceVersion": resource_version}});
            ignore_not_found(groups.patch(group, &pp, &Patch::Merge(&patch)).await)?;
            debug!(%group, ?finalizers, "simulated CKE: NodeGroup finalizers set");
        }
        GroupAction::PatchStatus { group, status } => {
            let patch = json!({"status": status});
            ignore_not_found(groups.patch_status(group, &pp, &Patch::Merge(&patch)).await)?;
            info!(%group, phase = status.phase.as_deref().unwrap_or_default(), nodes = status.node_count.unwrap_or_default(), "simulated CKE: NodeGroup status written");
        }
        GroupAction::CreateNode { name, node, .. } => {
            create_node(&nodes, name, node).await?;
            info!(node = %name, "simulated CKE: Node joined");
        }
        GroupAction::DeleteNode { name } => {
            ignore_not_found(nodes.delete(name, &DeleteParams::default()).await)?;
            info!(node = %name, "simulated CKE: Node deleted (VM torn down)");
        }
        GroupAction::Vanish { group, uid } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            ignore_not_found(groups.delete(group, &dp).await)?;
            info!(%group, "simulated CKE: NodeGroup vanished");
        }
    }
    Ok(())
}

/// Creates a Node with its status; writes the status separately when the server dropped it on
/// create. An existing Node of that name counts as created (its status completed if it is one of
/// the simulator's and lacks it).
async fn create_node(nodes: &Api<Node>, name: &str, object: &Value) -> Result<(), kube::Error> {
    let node: Node = match serde_json::from_value(object.clone()) {
        Ok(n) => n,
        Err(error) => {
            // Built by `objects::node_object`; decoding cannot fail unless that is broken.
            warn!(node = %name, %error, "simulated CKE: built an invalid Node (bug)");
            return Ok(());
        }
    };
    let created = match nodes.create(&PostParams::default(), &node).await {
        Ok(created) => created,
        // Made earlier (a retry after a failed status write, or a previous run): finish it if it
        // is ours.
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let existing = nodes.get(name).await?;
            if !kubelet::is_simulated(&existing) {
                return Ok(());
            }
            existing
        }
        Err(e) => return Err(e),
    };
    let has_capacity = created.status.as_ref().and_then(|s| s.capacity.as_ref()).is_some_and(|c| !c.is_empty());
    if !has_capacity {
        let patch = json!({"status": object.get("status").cloned().unwrap_or(Value::Null)});
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}

async fn exec_kubelet(client: &Client, action: &KubeletAction) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::default();
    match action {
        KubeletAction::NodeReady { name, conditions, devices } => {
            let mut patch = json!({"status": {"conditions": conditions}});
            if !devices.is_empty() {
                // As a device plugin registers with the kubelet: capacity and allocatable alike.
                let list: BTreeMap<String, String> = devices.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
                patch["status"]["capacity"] = json!(list);
                patch["status"]["allocatable"] = json!(list);
            }
            ignore_not_found(nodes.patch_status(name, &pp, &Patch::Merge(&patch)).await)?;
            info!(node = %name, "simulated kubelet: Node Ready");
        }
        KubeletAction::SetNodeTaints { name, resource_version, taints } => {
            let list = if taints.is_empty() { Value::Null } else { json!(taints) };
            let patch = json!({"metadata": {"resourceVersion": resource_version}, "spec": {"taints": list}});
            ignore_not_found(nodes.patch(name, &pp, &Patch::Merge(&patch)).await)?;
            debug!(node = %name, "simulated kubelet: not-ready taint removed");
        }
        KubeletAction::PodRunning { namespace, name, status } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let patch = json!({"status": status});
            ignore_not_found(pods.patch_status(name, &pp, &Patch::Merge(&patch)).await)?;
            debug!(%namespace, pod = %name, "simulated kubelet: pod Running");
        }
        KubeletAction::DeletePod { namespace, name, uid } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match pods.delete(name, &dp).await {
                Ok(_) => {}
                // Gone, or replaced by a pod of the same name (UID precondition failed).
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(e),
            }
            debug!(%namespace, pod = %name, "simulated kubelet: pod removed");
        }
    }
    Ok(())
}

async fn exec_binder(client: &Client, action: &BinderAction, now: DateTime<Utc>) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    match action {
        BinderAction::Bind { namespace, name, uid, node } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let binding = json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            });
            match pods.create_subresource::<_, Value>("binding", name, &PostParams::default(), &binding).await {
                Ok(_) => info!(%namespace, pod = %name, %node, "simulated binder: pod bound"),
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        BinderAction::Unschedulable { namespace, name, message, since, .. } => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let patch =
                json!({"status": {"conditions": [objects::unschedulable_condition(message, since.as_deref(), now)]}});
            ignore_not_found(pods.patch_status(name, &pp, &Patch::Merge(&patch)).await)?;
            debug!(%namespace, pod = %name, %message, "simulated binder: pod unschedulable");
        }
    }
    Ok(())
}

/// Makes sure NodeGroups are served: installs the stand-in CRD when they are not, then waits (wall
/// time, bounded) until the API serves them.
async fn ensure_crd(client: &Client, token: &CancellationToken) -> Result<(), CkeError> {
    let groups: Api<NodeGroup> = Api::all(client.clone());
    let probe = ListParams::default().limit(1);
    if groups.list(&probe).await.is_ok() {
        return Ok(());
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds::nodegroup::test_crd();
    let installed = with_retries(token, "install the NodeGroup CRD", || async {
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        }
    })
    .await?;
    match installed {
        Some(true) => info!("simulated CKE: stand-in NodeGroup CRD installed"),
        Some(false) => {}
        None => return Ok(()), // cancelled
    }
    let deadline = tokio::time::Instant::now() + CRD_WAIT;
    loop {
        if groups.list(&probe).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CkeError::CrdNotServed(CRD_WAIT));
        }
        tokio::select! {
            () = token.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Creates the control-plane Nodes (Ready from the start, role `control-plane`; tainted
/// `NoSchedule` when `control_plane.no_schedule` is set).
async fn ensure_control_plane(
    client: &Client,
    cfg: &SimCkeConfig,
    clock: &Clock,
    token: &CancellationToken,
) -> Result<(), CkeError> {
    let Some(flavor) = cfg.flavor(&cfg.control_plane.flavor) else {
        warn!(flavor = %cfg.control_plane.flavor, "simulated CKE: unknown control-plane flavor, no control-plane Nodes");
        return Ok(());
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let (labels, taints) = if cfg.control_plane.no_schedule {
        (
            BTreeMap::from([(objects::CONTROL_PLANE_ROLE_LABEL.to_string(), String::new())]),
            vec![json!({"key": objects::CONTROL_PLANE_ROLE_LABEL, "effect": "NoSchedule"})],
        )
    } else {
        (BTreeMap::new(), Vec::new())
    };
    for i in 0..cfg.control_plane.count {
        let name = format!("control-plane-{i}");
        let input = NodeSpecInput {
            name: &name,
            flavor,
            group: None,
            extra_labels: Some(&labels),
            taints: taints.clone(),
            ready: true,
            kubelet_version: &cfg.kubelet_version,
            seed: cfg.seed,
        };
        let object = objects::node_object(&input, clock.now());
        if let Err(source) = serde_json::from_value::<Node>(object.clone()) {
            return Err(CkeError::Build { what: format!("Node {name}"), source });
        }
        let what = format!("create control-plane Node {name}");
        if with_retries(token, &what, || create_node(&nodes, &name, &object)).await?.is_none() {
            return Ok(()); // cancelled
        }
    }
    Ok(())
}

/// Start-up attempts of one write before giving up: an API failing for a while (injected faults,
/// a server starting) must not stop the simulator.
const STARTUP_ATTEMPTS: u32 = 20;

/// Runs `f` until it succeeds, at most [`STARTUP_ATTEMPTS`] times, [`RETRY_AFTER`] apart; `None`
/// when cancelled meanwhile.
async fn with_retries<T, F, Fut>(token: &CancellationToken, what: &str, mut f: F) -> Result<Option<T>, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 1;
    loop {
        match f().await {
            Ok(v) => return Ok(Some(v)),
            Err(error) if attempt < STARTUP_ATTEMPTS => {
                warn!(what, attempt, %error, "simulated CKE start-up: retrying");
                attempt += 1;
                tokio::select! {
                    () = token.cancelled() => return Ok(None),
                    () = tokio::time::sleep(RETRY_AFTER) => {}
                }
            }
            Err(error) => return Err(error),
        }
    }
}
