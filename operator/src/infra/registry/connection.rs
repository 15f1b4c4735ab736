//! One workload cluster's connection lifecycle (hub.md §3): take the hardened kubeconfig, refuse a
//! server name resolving to a link-local address, build the client, probe, check that NodeGroups are served, identify the cluster (its `kube-system` UID)
//! and stand aside while an older registration speaks for it, start the trimmed watch caches, wait
//! until they are synced, health-check, and on failure tear everything down and reconnect with
//! back-off.
//!
//! Owns: the task of one cluster and its [`Connection`]. Must not: outlive its cancellation token,
//! log or publish credential bytes, publish anything the server sent (failures are told through
//! [`super::failure`]), or hand out a connection as synced before every cache is.

use std::{sync::Arc, time::Duration};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, Node, Secret},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, Config, Resource,
    config::KubeConfigOptions,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    ClusterKey, ClusterStatus, Identities, KUBECONFIG_KEY, Phase, Rank, Settings,
    failure::{self, Cause, Step},
};
use crate::infra::kubeconfig;
use crds::NodeGroup;
use scheduling::CompactPod;

/// The group/version CKE serves NodeGroups under.
pub const NODEGROUP_API: &str = "api.clever-cloud.com/v1";

/// The watch caches of one workload cluster, trimmed to what the logic reads.
#[derive(Clone)]
pub struct WorkloadCache {
    pub pods: Store<CompactPod>,
    pub nodes: Store<Node>,
    pub nodegroups: Store<NodeGroup>,
    pub daemonsets: Store<DaemonSet>,
    pub pdbs: Store<PodDisruptionBudget>,
    /// PVCs, PVs, StorageClasses and CSINodes, each unknown when the server refuses it.
    pub volumes: super::volumes::VolumeCaches,
    /// Every event any of these caches applied, counted (a loop tells "nothing changed" by it).
    pub changes: crate::infra::changes::Changes,
}

impl std::fmt::Debug for WorkloadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCache")
            .field("pods", &self.pods.len())
            .field("nodes", &self.nodes.len())
            .field("nodegroups", &self.nodegroups.len())
            .field("daemonsets", &self.daemonsets.len())
            .field("pdbs", &self.pdbs.len())
            .field("volumes", &self.volumes)
            .finish()
    }
}

/// A connected workload cluster: its client (for writes and uncached reads) and its caches.
pub struct Connection {
    pub key: ClusterKey,
    pub client: Client,
    /// The same identity without kube's client-side retry of 429/503/504: an eviction refused by a
    /// PodDisruptionBudget answers 429 by design, and termination backs off itself.
    pub evictions: Client,
    pub cache: WorkloadCache,
    /// The pods waiting for capacity, from the pod watch (wakes provisioning).
    pub pending: Arc<super::pending::PendingPods>,
    /// The nodes provisioning expects pending pods on (disruption leaves them be for a while).
    pub nominations: std::sync::Mutex<crate::decisions::nomination::Nominations>,
    synced: watch::Receiver<bool>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("key", &self.key)
            .field("cache", &self.cache)
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl Connection {
    /// Every cache has listed and is being watched. Only then may anything be decided.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Wait until synced (or the connection ends: returns false).
    pub async fn wait_synced(&self) -> bool {
        let mut rx = self.synced.clone();
        rx.wait_for(|s| *s).await.is_ok()
    }
}

pub(super) struct Task {
    pub key: ClusterKey,
    /// The Secret's kubeconfig, hardened (`None`: no key `value`).
    pub kubeconfig: Option<super::parsed::Parsed>,
    /// Where a re-read Secret is hardened (once per version).
    pub parses: Arc<super::parsed::Parses>,
    pub settings: Settings,
    pub mgmt: Client,
    pub metrics: Arc<crate::infra::metrics::Metrics>,
    pub status: watch::Sender<ClusterStatus>,
    pub connection: watch::Sender<Option<Arc<Connection>>>,
    pub changes: watch::Sender<u64>,
    pub touched: tokio::sync::broadcast::Sender<Touched>,
    /// Told each node whose pods had a pod event (wakes its claim).
    pub pod_events: tokio::sync::broadcast::Sender<super::NodePods>,
    /// Told this cluster's key once its caches are synced (wakes its claims).
    pub synced: tokio::sync::broadcast::Sender<ClusterKey>,
    pub identities: Arc<Identities>,
    pub rank: Rank,
    pub cancel: CancellationToken,
    /// The token the write clients are fenced by (sharded mode: this replica's ownership of the
    /// cluster; they refuse every request once it is cancelled), and a new one when the cluster is
    /// owned again while this connection is kept.
    pub fence: Option<watch::Receiver<CancellationToken>>,
}

/// How a session ended.
enum Ended {
    /// The hub stops or the Secret changed: end quietly.
    Cancelled,
    /// Nothing will change until the Secret does.
    Fatal(ClusterStatus),
    /// Try again after a back-off.
    Retry(ClusterStatus),
    /// The cluster (`kube-system` UID `uid`) is registered by an older Secret too: wait until
    /// that registration goes, then connect.
    Duplicate { uid: String, first: ClusterKey },
}

impl Task {
    pub async fn run(mut self) {
        let mut backoff = self.backoff();
        loop {
            let ended = self.session().await;
            self.connection.send_replace(None);
            let status = match ended {
                Ended::Cancelled => return,
                Ended::Fatal(s) => {
                    tracing::warn!(cluster = %self.key, reason = s.phase.reason(), message = %s.message, cause = s.cause.map(tracing::field::display), "workload cluster unusable until its Secret changes");
                    // It reaches no cluster now: a duplicate registration may take over.
                    self.identities.release(&self.key);
                    self.publish(s);
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                    self.cancel.cancelled().await;
                    return;
                }
                Ended::Duplicate { uid, first } => {
                    if !self.stand_aside(&uid, &first).await {
                        return;
                    }
                    backoff = self.backoff();
                    continue;
                }
                Ended::Retry(s) => s,
            };
            let was_connected = self.status.borrow().phase == Phase::Connected;
            if was_connected {
                backoff = self.backoff();
            }
            let delay = backoff.next().unwrap_or(self.settings.reconnect_max);
            // Say which it was: a session that never connected did not disconnect.
            let what = if was_connected {
                "workload cluster disconnected; reconnecting"
            } else {
                "could not connect to the workload cluster; retrying"
            };
            tracing::warn!(cluster = %self.key, reason = status.phase.reason(), message = %status.message, cause = status.cause.map(tracing::field::display), retry_in_seconds = delay.as_secs_f64(), "{what}");
            let unauthorized = status.phase == Phase::Unauthorized;
            self.publish(status);
            // A 401 may mean the credentials were rotated: re-read the Secret before retrying.
            if unauthorized {
                self.reread_secret().await;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Report the duplicate and wait until this registration speaks for cluster `uid` (the first
    /// one, of the same namespace, was removed or broke). False when cancelled.
    async fn stand_aside(&self, uid: &str, first: &ClusterKey) -> bool {
        self.publish(duplicate(&self.key, first));
        tracing::warn!(cluster = %self.key, first = %first, uid, "workload cluster already registered under another name in this namespace; standing aside");
        let mut changes = self.changes.subscribe();
        loop {
            if self.identities.owner(&self.key.namespace, uid).is_none_or(|o| o == self.key) {
                tracing::info!(cluster = %self.key, uid, "the first registration of this workload cluster is gone; connecting");
                return true;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return false,
                r = changes.changed() => if r.is_err() { return false },
            }
        }
    }

    /// Whether an older registration of cluster `uid` now speaks for it (it identified the cluster
    /// after this one did, as after a restart of the hub).
    fn outranked(&self, uid: &str) -> Option<ClusterKey> {
        self.identities.owner(&self.key.namespace, uid).filter(|o| *o != self.key)
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::new()
            .with_min_delay(self.settings.reconnect_min)
            .with_max_delay(self.settings.reconnect_max)
            .with_jitter()
            .without_max_times()
            .build()
    }

    fn publish(&self, status: ClusterStatus) {
        let changed = self.status.send_if_modified(|s| {
            if *s == status {
                false
            } else {
                *s = status;
                true
            }
        });
        if changed {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    async fn reread_secret(&mut self) {
        let api: Api<Secret> = Api::namespaced(self.mgmt.clone(), &self.key.namespace);
        match api.get_opt(&self.key.secret_name()).await {
            Ok(Some(s)) => {
                let fresh = self.parses.get(&self.key, &s, self.settings.kubeconfig_policy);
                let differs = match (&fresh, &self.kubeconfig) {
                    (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                    (a, b) => a.is_some() != b.is_some(),
                };
                if differs {
                    tracing::info!(cluster = %self.key, "kubeconfig Secret changed after a 401; using the new credentials");
                    self.kubeconfig = fresh;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(cluster = %self.key, error = %crate::infra::apierror::plain(&e), "re-reading the kubeconfig Secret failed")
            }
        }
    }

    async fn session(&self) -> Ended {
        let Some(parsed) = &self.kubeconfig else {
            return Ended::Fatal(ClusterStatus::new(
                Phase::InvalidKubeconfig,
                format!(
                    "Secret {}/{} has no data key `{KUBECONFIG_KEY}`; put the kubeconfig there",
                    self.key.namespace,
                    self.key.secret_name()
                ),
            ));
        };
        let hardened = match parsed.as_ref() {
            Ok(h) => h,
            Err(e) => return Ended::Fatal(ClusterStatus::new(Phase::InvalidKubeconfig, e.to_string())),
        };
        let server = hardened.server.clone();
        if let Err(s) = self.refuse_link_local_name(hardened).await {
            return Ended::Retry(s);
        }
        let options = KubeConfigOptions { context: Some(hardened.context.clone()), ..KubeConfigOptions::default() };
        let mut config = match Config::from_custom_kubeconfig(hardened.kubeconfig.clone(), &options).await {
            Ok(c) => c,
            Err(e) => {
                return Ended::Fatal(ClusterStatus::new(
                    Phase::InvalidKubeconfig,
                    format!("cannot build a client from the kubeconfig: {}", kubeconfig::redact_urls(&e.to_string())),
                ));
            }
        };
        // kube falls back to $HTTPS_PROXY when the kubeconfig names no proxy; the hub connects
        // directly (a `proxy-url` is refused, and this build has no proxy support: docs/hub.md).
        config.proxy_url = None;
        // Connect fast or fail; reads keep kube's default (watches are long polls).
        config.connect_timeout = Some(self.settings.probe_timeout);
        if let Some(replica) = &self.settings.replica {
            crate::infra::identify_replica(&mut config, replica);
        }
        let mut fence = self.fence.clone();
        let mut fenced_by = fence.as_mut().map(|f| f.borrow_and_update().clone());
        let writers = self.writers(&config, fenced_by.as_ref());
        // Sharded mode: the watches, probes and identity read on a client of their own, not fenced,
        // so the caches can outlive one ownership; writes only through the fenced clients.
        let reader = if self.settings.sharded {
            crate::infra::clients::build(
                config.clone(),
                &self.metrics,
                crate::infra::clients::Side::Workload(&self.key.to_string()),
            )
            .map(Some)
        } else {
            Ok(None)
        };
        let (client, evictions, reader) = match writers.and_then(|(c, e)| reader.map(|r| (c, e, r))) {
            Ok(c) => c,
            Err(e) => {
                return Ended::Fatal(ClusterStatus::new(
                    Phase::InvalidKubeconfig,
                    format!("cannot build a client from the kubeconfig: {}", crate::infra::apierror::plain(&e)),
                ));
            }
        };
        let reader = reader.unwrap_or_else(|| client.clone());
        if let Err(s) = self.probe(&reader, &server).await {
            return Ended::Retry(s);
        }
        if let Err(s) = self.nodegroups_served(&reader, &server).await {
            return Ended::Retry(s);
        }
        let uid = match self.identify(&reader, &server).await {
            Ok(uid) => uid,
            Err(s) => return Ended::Retry(s),
        };
        let first = self.identities.claim(&self.key, &uid, &self.rank);
        if first != self.key {
            return Ended::Duplicate { uid, first };
        }
        let mut identity_changes = self.changes.subscribe();
        self.publish(ClusterStatus::new(Phase::Syncing, format!("connected to {server}; syncing watches")));

        let watches = self.cancel.child_token();
        let _stop_watches = watches.clone().drop_guard();
        let (failures_tx, mut failures) = mpsc::channel::<(String, kube::Error)>(16);
        let (synced_tx, synced_rx) = watch::channel(false);
        let pending = Arc::new(super::pending::PendingPods::default());
        let observe_pods = {
            let (pending, events) = (pending.clone(), super::pod_events::PodEvents::default());
            let (tx, key) = (self.pod_events.clone(), self.key.clone());
            move |ev: &watcher::Event<CompactPod>| {
                pending.observe(ev);
                if let Some(node) = events.observe(ev) {
                    // No subscriber (no controller running yet) is not an error.
                    let _ = tx.send(super::NodePods { cluster: key.clone(), node });
                }
            }
        };
        let changes = crate::infra::changes::Changes::new();
        let w = Watching { cancel: &watches, failures: &failures_tx, changes: &changes, key: &self.key };
        let cache = WorkloadCache {
            pods: spawn_cache(Api::all(reader.clone()), intern_pod_specs(), &w, observe_pods, None),
            nodes: spawn_cache(
                Api::all(reader.clone()),
                trim_node,
                &w,
                announce(&self.touched, &self.key, crate::decisions::ownership::node_group),
                None,
            ),
            nodegroups: spawn_cache(
                Api::all(reader.clone()),
                trim_meta,
                &w,
                announce(&self.touched, &self.key, |g: &NodeGroup| g.metadata.name.clone()),
                None,
            ),
            daemonsets: spawn_cache(Api::all(reader.clone()), trim_meta, &w, |_| {}, None),
            pdbs: spawn_cache(Api::all(reader.clone()), trim_meta, &w, |_| {}, None),
            volumes: super::volumes::VolumeCaches::start(&reader, &w),
            changes: changes.clone(),
        };
        let connection = |client: Client, evictions: Client| {
            Arc::new(Connection {
                key: self.key.clone(),
                client,
                evictions,
                cache: cache.clone(),
                pending: pending.clone(),
                nominations: std::sync::Mutex::default(),
                synced: synced_rx.clone(),
            })
        };
        self.connection.send_replace(Some(connection(client, evictions)));
        self.changes.send_modify(|n| *n = n.wrapping_add(1));

        let ready = async {
            let (a, b, c, d, e, f) = tokio::join!(
                cache.pods.wait_until_ready(),
                cache.nodes.wait_until_ready(),
                cache.nodegroups.wait_until_ready(),
                cache.daemonsets.wait_until_ready(),
                cache.pdbs.wait_until_ready(),
                cache.volumes.settled()
            );
            a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok() && e.is_ok() && f
        };
        let mut ready = std::pin::pin!(ready);
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return Ended::Cancelled,
                Some((kind, e)) = failures.recv() => return Ended::Retry(self.failed(&e, &server, &Step::Watch(kind))),
                _ = identity_changes.changed() => if let Some(first) = self.outranked(&uid) {
                    return Ended::Duplicate { uid, first };
                },
                ok = &mut ready => if ok {
                    break;
                } else {
                    return Ended::Retry(ClusterStatus::new(Phase::Unreachable, "watch caches stopped before syncing"));
                },
            }
        }
        if let Some(first) = self.outranked(&uid) {
            return Ended::Duplicate { uid, first };
        }
        synced_tx.send_replace(true);
        // No subscriber (no controller running yet) is not an error.
        let _ = self.synced.send(self.key.clone());
        let refused = cache.volumes.refused();
        let connected = if refused.is_empty() {
            format!("connected to {server}; watches synced")
        } else {
            tracing::warn!(cluster = %self.key, kinds = %refused.join(","), "the cluster's identity may not list these storage kinds; volumes are not considered until it may");
            format!(
                "connected to {server}; watches synced, but the identity may not list {}: pods' volume zones and nodes' attach \
                 limits are not considered — apply this release's workload RBAC (`karpenter-hub register` does)",
                refused.join(", ")
            )
        };
        self.publish(ClusterStatus::new(Phase::Connected, connected));
        tracing::info!(cluster = %self.key, "workload cluster connected and synced");

        let mut consecutive = 0u32;
        let mut ticker = tokio::time::interval(self.settings.probe_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            // Sharded mode: owned again while kept (a new fence token): new write clients over the
            // same caches. The old ones stay fenced, so a round begun before the fence writes nothing.
            if let Some(f) = fence.as_mut()
                && fenced_by.as_ref().is_none_or(|t| t.is_cancelled())
                && !f.borrow().is_cancelled()
            {
                let token = f.borrow_and_update().clone();
                match self.writers(&config, Some(&token)) {
                    Ok((client, evictions)) => {
                        self.connection.send_replace(Some(connection(client, evictions)));
                        self.changes.send_modify(|n| *n = n.wrapping_add(1));
                        tracing::info!(cluster = %self.key, "owned again: new write clients over the kept caches");
                        fenced_by = Some(token);
                        // As a new sync would: the cluster's claims and loops that found it fenced
                        // (and backed off) act again now, not at their next safety requeue.
                        let _ = self.synced.send(self.key.clone());
                    }
                    Err(e) => {
                        return Ended::Retry(ClusterStatus::new(
                            Phase::Unreachable,
                            format!("cannot build a client from the kubeconfig: {}", crate::infra::apierror::plain(&e)),
                        ));
                    }
                }
            }
            let fence_changed = async {
                match fence.as_mut() {
                    Some(f) => f.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.cancel.cancelled() => return Ended::Cancelled,
                alive = fence_changed => if !alive {
                    return Ended::Cancelled;
                },
                _ = identity_changes.changed() => if let Some(first) = self.outranked(&uid) {
                    tracing::warn!(cluster = %self.key, first = %first, "an older registration of this workload cluster appeared; handing it over");
                    return Ended::Duplicate { uid, first };
                },
                Some((kind, e)) = failures.recv() => {
                    crate::infra::metrics::Metrics::inc(&self.metrics.watch_restarts, &self.key);
                    let s = self.failed(&e, &server, &Step::Watch(kind));
                    if s.phase == Phase::Unauthorized {
                        return Ended::Retry(s);
                    }
                    // Other watch errors are retried by the watcher itself; the probe judges health.
                    tracing::debug!(cluster = %self.key, message = %s.message, "watch error; the watcher retries");
                }
                _ = ticker.tick() => match self.counted_probe(&reader, &server).await {
                    Ok(()) => consecutive = 0,
                    Err(s) if s.phase == Phase::Unauthorized => return Ended::Retry(s),
                    Err(s) => {
                        consecutive += 1;
                        tracing::debug!(cluster = %self.key, consecutive, message = %s.message, cause = s.cause.map(tracing::field::display), "health probe failed");
                        if consecutive >= self.settings.failure_threshold {
                            return Ended::Retry(s);
                        }
                    }
                },
            }
        }
    }

    /// Refuse a server host name that resolves to a link-local address (169.254.0.0/16, fe80::/10:
    /// cloud metadata endpoints) unless the hub allows them; an address written in the URL was
    /// checked with the kubeconfig. The client resolves the name again when it connects, so a DNS
    /// server answering differently the second time is not stopped here (docs/hub.md).
    async fn refuse_link_local_name(&self, hardened: &kubeconfig::HardenedKubeconfig) -> Result<(), ClusterStatus> {
        if self.settings.kubeconfig_policy.allow_link_local {
            return Ok(());
        }
        let Some((host, port)) = hardened.server_host_name() else { return Ok(()) };
        let lookup = tokio::time::timeout(self.settings.probe_timeout, tokio::net::lookup_host((host.as_str(), port)));
        // A name that does not resolve is the client's to report (Unreachable).
        let Ok(Ok(addresses)) = lookup.await else { return Ok(()) };
        if let Some(ip) = addresses.map(|a| a.ip()).find(|ip| kubeconfig::is_link_local(*ip)) {
            tracing::warn!(cluster = %self.key, host, address = %ip, "the server's host name resolves to a link-local address; not connecting");
            return Err(ClusterStatus::new(
                Phase::InvalidKubeconfig,
                format!(
                    "the server's host name {host} resolves to {ip}, a link-local address (169.254.0.0/16 or fe80::/10), \
                     where cloud metadata services answer; point the kubeconfig at the API server (or start the hub \
                     with --allow-link-local-servers if the API server really is there)"
                ),
            ));
        }
        Ok(())
    }

    /// The write clients from `config` (the ordinary one, retries counted under this cluster, and
    /// the evictions one), fenced by `token` when given (hub.md §6): once it is cancelled every
    /// request is refused, even one from a round already under way.
    fn writers(&self, config: &Config, token: Option<&CancellationToken>) -> Result<(Client, Client), kube::Error> {
        let key = self.key.to_string();
        let side = crate::infra::clients::Side::Workload(&key);
        let fence = token.map(|t| crate::infra::fence::FenceLayer { token: t.clone(), cluster: key.clone() });
        let client = match &fence {
            Some(fence) => crate::infra::clients::build_fenced(config.clone(), &self.metrics, side, fence),
            None => crate::infra::clients::build(config.clone(), &self.metrics, side),
        }?;
        let evictions = crate::infra::clients::evictions(config.clone(), fence.as_ref())?;
        Ok((client, evictions))
    }

    /// A health probe, counted by result (`karpenter_hub_cluster_probes_total`).
    async fn counted_probe(&self, client: &Client, server: &str) -> Result<(), ClusterStatus> {
        let r = self.probe(client, server).await;
        let result = match &r {
            Ok(()) => "ok",
            Err(s) if s.phase == Phase::Unauthorized => "unauthorized",
            Err(_) => "failed",
        };
        self.metrics
            .cluster_probes
            .get(&crate::infra::metrics::ResultLabels { cluster: self.key.to_string(), result: result.to_string() })
            .inc();
        r
    }

    /// The cluster's identity: the UID of its `kube-system` namespace, which every Kubernetes
    /// cluster has and keeps for its lifetime, whatever name or server a kubeconfig gives it. The
    /// server's word only, which is why it is compared within one namespace (see [`Identities`]).
    async fn identify(&self, client: &Client, server: &str) -> Result<String, ClusterStatus> {
        let api: Api<Namespace> = Api::all(client.clone());
        match tokio::time::timeout(self.settings.probe_timeout, api.get("kube-system")).await {
            Ok(Ok(ns)) => ns.metadata.uid.filter(|u| is_uid(u)).ok_or_else(|| {
                ClusterStatus::new(
                    Phase::Unreachable,
                    format!(
                        "{server}: namespace kube-system has no UID of the form Kubernetes gives (up to 64 letters, digits and dashes)"
                    ),
                )
            }),
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(ClusterStatus::new(
                Phase::Unauthorized,
                format!(
                    "{server} does not let the hub read namespace kube-system, whose UID identifies the cluster \
                     (403): apply the current config/hub/workload-rbac.yaml, or re-run `karpenter-hub register`"
                ),
            )),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(ClusterStatus::new(
                Phase::Unreachable,
                format!(
                    "{server} has no namespace kube-system, whose UID identifies the cluster: is it a Kubernetes cluster?"
                ),
            )),
            Ok(Err(e)) => Err(self.failed(&e, server, &Step::KubeSystem)),
            Err(_) => Err(failure::timed_out(server, &Step::KubeSystem)),
        }
    }

    async fn probe(&self, client: &Client, server: &str) -> Result<(), ClusterStatus> {
        match tokio::time::timeout(self.settings.probe_timeout, client.apiserver_version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.failed(&e, server, &Step::Version)),
            Err(_) => Err(failure::timed_out(server, &Step::Version)),
        }
    }

    async fn nodegroups_served(&self, client: &Client, server: &str) -> Result<(), ClusterStatus> {
        let missing = || {
            ClusterStatus::new(
                Phase::NodeGroupApiNotServed,
                format!("the cluster does not serve nodegroups.{NODEGROUP_API}: is it a CKE cluster?"),
            )
        };
        let step = Step::NodeGroupApi;
        match tokio::time::timeout(self.settings.probe_timeout, client.list_api_group_resources(NODEGROUP_API)).await {
            Ok(Ok(list)) if list.resources.iter().any(|r| r.name == "nodegroups") => Ok(()),
            Ok(Ok(_)) => Err(missing()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(missing()),
            Ok(Err(e)) => Err(self.failed(&e, server, &step)),
            Err(_) => Err(failure::timed_out(server, &step)),
        }
    }

    /// The status of `step` failing with `e`: the hub's own words for the tenant; what the server
    /// said, cut and escaped, at debug level only.
    fn failed(&self, e: &kube::Error, server: &str, step: &Step) -> ClusterStatus {
        let cause = Cause::of(e);
        tracing::debug!(cluster = %self.key, %step, %cause, error = %crate::infra::apierror::remote(&crate::infra::apierror::chain(e)), "request to the workload cluster failed");
        failure::status(server, step, cause)
    }
}

/// The status of registration `key` standing aside for `first`, of the same namespace: it names
/// nothing but that namespace's own Secrets (nor the UID, which the server chose).
fn duplicate(key: &ClusterKey, first: &ClusterKey) -> ClusterStatus {
    debug_assert_eq!(key.namespace, first.namespace, "namespaces never compete for a cluster");
    ClusterStatus::new(
        Phase::DuplicateCluster,
        format!(
            "this workload cluster (the same kube-system UID) is already registered in this namespace as cluster {} \
             (Secret {}), which speaks for it: one cluster gets decisions from one registration only. Delete Secret {} \
             if it is a mistake; it takes over when Secret {} is deleted",
            first.name,
            first.secret_name(),
            key.secret_name(),
            first.secret_name(),
        ),
    )
}

/// Whether `uid` looks like a Kubernetes UID (a UUID, in practice): the server chose it, and it
/// is kept in the duplicate table and logged.
fn is_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Objects per page of a cache's initial LIST (kube's default is 500).
const LIST_PAGE: u32 = 100;

/// What every watch of one connection shares.
pub(super) struct Watching<'a> {
    /// Stops them.
    pub cancel: &'a CancellationToken,
    /// Where their errors go.
    pub failures: &'a mpsc::Sender<(String, kube::Error)>,
    /// Counts the events they apply.
    pub changes: &'a crate::infra::changes::Changes,
    /// Their cluster.
    pub key: &'a ClusterKey,
}

/// Start a reflector for `K` under `w.cancel`, counting every event in `w.changes` and calling
/// `observe` with it once the store holds it; its errors are forwarded to `w.failures`, except,
/// with `refused` given, a refusal (HTTP 403), which sets `refused` and ends this watch alone (an
/// optional cache).
pub(super) fn spawn_cache<K>(
    api: Api<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
    w: &Watching<'_>,
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
    refused: Option<watch::Sender<bool>>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    // Small pages: a page is decoded whole (full objects, before `trim`) while it is applied, and
    // that transient, times every cluster listing at once, is what the process's memory keeps.
    let config = watcher::Config::default().page_size(LIST_PAGE);
    let stream = reflector::reflector(writer, watcher(api, config).modify(trim).default_backoff());
    let cancel = w.cancel.clone();
    let failures = w.failures.clone();
    let changes = w.changes.clone();
    let kind = K::kind(&()).to_string();
    let key = w.key.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                next = stream.next() => match next {
                    None => return,
                    Some(Ok(ev)) => {
                        changes.observe(&ev);
                        observe(&ev);
                    }
                    Some(Err(e)) => {
                        // The server's words: cut and escaped, and at debug only.
                        tracing::debug!(cluster = %key, kind, error = %crate::infra::apierror::remote(&crate::infra::apierror::plain_watch(&e).to_string()), "watch error");
                        if let Some(e) = into_client_error(e) {
                            if let (Some(refused), kube::Error::Api(s)) = (&refused, &e)
                                && s.code == 403
                            {
                                refused.send_replace(true);
                                return;
                            }
                            let _ = failures.try_send((kind.clone(), e));
                        }
                    }
                },
            }
        }
    });
    store
}

/// An observer announcing changes (not the initial listing) of the objects claims depend on on
/// `tx`, naming the NodeGroup each belongs to with `group_of`.
fn announce<K>(
    tx: &tokio::sync::broadcast::Sender<Touched>,
    key: &ClusterKey,
    group_of: fn(&K) -> Option<String>,
) -> impl Fn(&watcher::Event<K>) + Send + 'static
where
    K: 'static,
{
    let (tx, key) = (tx.clone(), key.clone());
    move |ev| {
        if let watcher::Event::Apply(obj) | watcher::Event::Delete(obj) = ev
            && let Some(group) = group_of(obj)
        {
            let _ = tx.send(Touched { cluster: key.clone(), group });
        }
    }
}

/// A Node or NodeGroup of a workload cluster changed: the NodeGroup it belongs to, so the claim
/// launched as that group is reconciled at once instead of at its next periodic check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touched {
    pub cluster: ClusterKey,
    pub group: String,
}

fn into_client_error(e: watcher::Error) -> Option<kube::Error> {
    match e {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            Some(e)
        }
        watcher::Error::WatchError(s) => Some(kube::Error::Api(s)),
        watcher::Error::NoResourceVersion => None,
    }
}

/// Fields no decision reads: server bookkeeping and the last-applied copy of the object.
fn trim_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Nodes: the image list (often the largest part of a Node) and volume bookkeeping are not read.
fn trim_node(node: &mut k8s_openapi::api::core::v1::Node) {
    trim_meta(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
    }
}

/// Pods dominate a cluster's cache (performance.md B4): the watch decodes each straight into the
/// projection the decisions read ([`CompactPod`]); its spec is then shared with every cached pod
/// of the cluster that has an equal one.
fn intern_pod_specs() -> impl FnMut(&mut CompactPod) + Send + 'static {
    let mut specs = super::specs::SpecTable::default();
    move |pod| {
        if let Some(spec) = pod.spec.take() {
            pod.spec = Some(specs.intern(spec));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn pod(name: &str, node: &str) -> CompactPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"nodeName": node, "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": "nginx", "env": [{"name": "PASSWORD", "value": "x"}],
                    "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn cached_pods_of_one_spec_on_one_node_share_it_and_keep_their_own_node() {
        let (mut a, mut b, mut c) = (pod("a", "n1"), pod("b", "n1"), pod("c", "n2"));
        let mut intern = intern_pod_specs();
        for p in [&mut a, &mut b, &mut c] {
            intern(p);
        }
        let spec = |p: &CompactPod| p.spec.clone().unwrap();
        assert!(Arc::ptr_eq(&spec(&a), &spec(&b)));
        assert!(!Arc::ptr_eq(&spec(&a), &spec(&c)));
        assert_eq!((a.node_name(), c.node_name()), (Some("n1"), Some("n2")));
        assert!(spec(&a).containers[0].env.is_none(), "what no decision reads is not cached");
    }

    #[test]
    fn the_drain_reads_the_cached_pod_as_the_full_one() {
        use crate::decisions::termination::PodFacts;
        let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "shop", "annotations": {"kubernetes.io/config.mirror": "x", "other": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}]},
            "spec": {"nodeName": "n1", "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "app", "image": "nginx"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "message": "m"}]}
        }))
        .unwrap();
        let whole = CompactPod {
            metadata: full.metadata.clone(),
            spec: full.spec.clone().map(Arc::new),
            status: full.status.clone(),
        };
        // Decoded as the watch decodes it.
        let cached: CompactPod = serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        let (before, after) = (PodFacts::from_pod(&whole), PodFacts::from_pod(&cached));
        assert!(before.critical && before.mirror, "the fixture exercises both");
        assert_eq!(format!("{before:?}"), format!("{after:?}"));
    }

    #[test]
    fn credentials_errors_are_unauthorized_and_others_unreachable() {
        let of = |code: u16| {
            let s = kube::core::Status::failure("boom", "InternalError").with_code(code);
            failure::status("https://x", &Step::Version, Cause::of(&kube::Error::Api(s.boxed()))).phase
        };
        assert_eq!(of(401), Phase::Unauthorized);
        assert_eq!(of(403), Phase::Unauthorized);
        assert_eq!(of(500), Phase::Unreachable);
    }

    #[test]
    fn a_duplicate_names_only_secrets_of_its_own_namespace_and_not_the_uid() {
        let s = duplicate(&ClusterKey::new("team-b", "copy"), &ClusterKey::new("team-b", "prod"));
        assert_eq!(s.phase, Phase::DuplicateCluster);
        assert!(s.message.contains("prod-kubeconfig") && s.message.contains("copy-kubeconfig"), "{}", s.message);
        assert!(!s.message.contains("team-"), "{}", s.message);
    }

    #[test]
    fn only_a_uid_shaped_answer_identifies_a_cluster() {
        assert!(is_uid("0b3c1a5e-5c1d-4d6b-9a0e-1f2e3d4c5b6a"));
        for bad in ["", "INTERNAL-ADMIN-PANEL: db_password=hunter2", &"a".repeat(65), "uid\nforged"] {
            assert!(!is_uid(bad), "{bad:?}");
        }
    }
}
