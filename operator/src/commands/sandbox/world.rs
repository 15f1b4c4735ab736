//! The simulated world the sandbox and the hub's integration tests run on: a management API
//! emulator plus N workload emulators each played by a simulated CKE, registered through kubeconfig
//! Secrets exactly as a user would, with the real hub running against them.
//!
//! Owns: starting and stopping that world and applying manifests to it. Public only with the
//! `testing` feature (the crate's own tests and benchmarks turn it on), so it is not part of the
//! production library. Must not: reach into the hub's internals — everything goes through the
//! Kubernetes API, so what works here works against real API servers.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use sim::{
    apiserver::{ApiServer, ApiServerConfig},
    cke::{DelayRange, SimCkeConfig},
};
use tokio_util::sync::CancellationToken;

use crate::{commands::run, infra::hub, infra::manifests, infra::metrics::Metrics, infra::registry};
use crds::{NodeClaim, NodeGroup};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("starting an API emulator: {0}")]
    Start(String),
    #[error("Kubernetes API error: {}", crate::infra::apierror::plain(.0))]
    Kube(#[from] kube::Error),
    #[error("{file}: {message}")]
    Manifest { file: String, message: String },
    #[error(transparent)]
    Apply(#[from] manifests::ManifestError),
    #[error("writing {path}: {message}")]
    Write { path: String, message: String },
    #[error("{0}")]
    Timeout(String),
    #[error(transparent)]
    Fleet(#[from] crate::commands::fleet::FleetError),
}

/// One simulated workload cluster.
pub struct WorkloadCluster {
    /// Namespace of the management cluster that registers it (and holds its NodePools).
    pub namespace: String,
    pub name: String,
    pub server: ApiServer,
    cke: CancellationToken,
}

impl std::fmt::Debug for WorkloadCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCluster").field("namespace", &self.namespace).field("name", &self.name).finish()
    }
}

impl WorkloadCluster {
    pub fn client(&self) -> Client {
        self.server.client()
    }

    pub fn key(&self) -> registry::ClusterKey {
        registry::ClusterKey::new(&self.namespace, &self.name)
    }
}

/// The whole simulated world.
pub struct World {
    pub mgmt: ApiServer,
    pub clusters: Vec<WorkloadCluster>,
    hub: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    pub hub_settings: hub::Settings,
    pub registry_settings: registry::Settings,
    /// The metrics of the running hub (a fresh set at every start, as a new process would have).
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("clusters", &self.clusters).finish()
    }
}

/// CKE delays for a world that should move fast but still show each step.
pub fn quick_cke(seed: u64) -> SimCkeConfig {
    let ms = Duration::from_millis;
    SimCkeConfig {
        seed,
        verdict_delay: DelayRange::between(ms(300), ms(800)),
        node_join_delay: DelayRange::between(ms(1500), ms(3000)),
        node_ready_delay: DelayRange::between(ms(500), ms(1500)),
        node_removal_delay: DelayRange::between(ms(1000), ms(2000)),
        empty_group_removal_delay: DelayRange::fixed(ms(200)),
        pod_start_delay: DelayRange::between(ms(200), ms(600)),
        pod_termination_delay: DelayRange::fixed(ms(200)),
        ..SimCkeConfig::default()
    }
}

impl World {
    /// Start a management emulator and one workload emulator (with a simulated CKE configured by
    /// `cke(i)`) per `(namespace, cluster)`, create the namespaces and register every cluster
    /// through its `<cluster>-kubeconfig` Secret. The hub is not started: see [`World::start_hub`].
    pub async fn start(clusters: &[(&str, &str)], cke: impl Fn(usize) -> SimCkeConfig) -> Result<World, SandboxError> {
        World::start_on(clusters, cke, clock::Clock::real()).await
    }

    /// [`World::start`] with the management emulator and the hub on `clock`: a manual clock lets a
    /// test move the hub's time forward, and the claims' creation and deletion timestamps agree
    /// with it. The workload emulators and the simulated CKEs keep the wall clock (CKE's delays
    /// count from the timestamps of the objects it watches).
    pub async fn start_on(
        clusters: &[(&str, &str)],
        cke: impl Fn(usize) -> SimCkeConfig,
        clock: clock::Clock,
    ) -> Result<World, SandboxError> {
        let mgmt = ApiServer::start(ApiServerConfig::management("management").with_clock(clock.clone()))
            .await
            .map_err(|e| SandboxError::Start(e.to_string()))?;
        let mut world = World {
            mgmt,
            clusters: Vec::new(),
            hub: None,
            hub_settings: hub::Settings { clock: clock.clone(), ..hub::Settings::default() },
            registry_settings: registry::Settings {
                probe_interval: Duration::from_secs(2),
                probe_timeout: Duration::from_secs(2),
                reconnect_min: Duration::from_millis(200),
                reconnect_max: Duration::from_secs(5),
                ..registry::Settings::default()
            },
            metrics: Arc::new(Metrics::new()),
        };
        for (i, (ns, name)) in clusters.iter().enumerate() {
            let server = ApiServer::start(ApiServerConfig::workload(*name).with_seed(i as u64 + 1))
                .await
                .map_err(|e| SandboxError::Start(e.to_string()))?;
            let token = CancellationToken::new();
            let client = server.client();
            let config = cke(i);
            let stop = token.clone();
            tokio::spawn(async move {
                if let Err(e) = sim::cke::run(client, config, stop.cancelled_owned()).await {
                    tracing::error!(error = %e, "simulated CKE stopped");
                }
            });
            ensure_namespace(&world.mgmt.client(), ns).await?;
            world.clusters.push(WorkloadCluster {
                namespace: ns.to_string(),
                name: name.to_string(),
                server,
                cke: token,
            });
            world.register(i).await?;
        }
        Ok(world)
    }

    /// (Re)write cluster `i`'s registration Secret from its emulator's current kubeconfig.
    pub async fn register(&self, i: usize) -> Result<(), SandboxError> {
        let c = &self.clusters[i];
        let kubeconfig = serde_json::to_string(&c.server.kubeconfig())
            .map_err(|e| SandboxError::Start(format!("serialising a kubeconfig: {e}")))?;
        self.put_secret(&c.namespace, &c.name, kubeconfig.as_bytes()).await
    }

    /// Merge `labels` (a JSON object, `null` removing a key) into the registration Secret of cluster
    /// `ns/name`, as `register --label` or `kubectl label` would: the cluster's labels, which fleet
    /// pools select on.
    pub async fn label_cluster(&self, ns: &str, name: &str, labels: Value) -> Result<(), SandboxError> {
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.mgmt.client(), ns)
            .patch(
                &format!("{name}-kubeconfig"),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await?;
        Ok(())
    }

    /// Write `<cluster>-kubeconfig` with arbitrary bytes (tests use it for hostile kubeconfigs).
    pub async fn put_secret(&self, ns: &str, cluster: &str, bytes: &[u8]) -> Result<(), SandboxError> {
        crate::commands::register_cluster::write_secret(&self.mgmt.client(), ns, cluster, bytes.to_vec()).await?;
        Ok(())
    }

    /// Start the hub against this world (or restart it after [`World::stop_hub`]).
    pub fn start_hub(&mut self) {
        let token = CancellationToken::new();
        self.metrics = Arc::new(Metrics::new());
        // Built as the binary builds it: identified, its retries counted.
        let mgmt = crate::infra::clients::build(
            self.mgmt.client_config(),
            &self.metrics,
            crate::infra::clients::Side::Management,
        )
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot build the hub's management client; using the emulator's own");
            self.mgmt.client()
        });
        let (mgmt, hs, rs, stop, metrics) =
            (mgmt, self.hub_settings.clone(), self.registry_settings.clone(), token.clone(), self.metrics.clone());
        let handle = tokio::spawn(async move {
            if let Err(e) = run::run_with(mgmt, hs, rs, metrics, stop).await {
                tracing::error!(error = %e, "hub stopped");
            }
        });
        self.hub = Some((token, handle));
    }

    /// Stop the hub as a crash would: tasks aborted, nothing cleaned up.
    pub async fn crash_hub(&mut self) {
        if let Some((token, handle)) = self.hub.take() {
            handle.abort();
            token.cancel();
            let _ = handle.await;
        }
    }

    /// Stop the hub gracefully.
    pub async fn stop_hub(&mut self) {
        if let Some((token, handle)) = self.hub.take() {
            token.cancel();
            let _ = handle.await;
        }
    }

    /// Apply YAML manifests to the management cluster in namespace `ns`, after `edit` (e.g. to set
    /// `clusterName`). Unknown kinds are an error naming the document.
    pub async fn apply_yaml(
        &self,
        file: &str,
        text: &str,
        ns: &str,
        edit: impl Fn(&mut Value),
    ) -> Result<usize, SandboxError> {
        let mut applied = 0;
        for mut doc in manifests::documents(file, text)? {
            edit(&mut doc);
            apply_value(&self.mgmt.client(), &doc, ns, file).await?;
            applied += 1;
        }
        Ok(applied)
    }

    /// Write each cluster's kubeconfig (and the management one) into `dir`.
    pub fn write_kubeconfigs(&self, dir: &Path) -> Result<Vec<PathBuf>, SandboxError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| SandboxError::Write { path: dir.display().to_string(), message: e.to_string() })?;
        let mut out = Vec::new();
        let mut write = |name: &str, server: &ApiServer| -> Result<(), SandboxError> {
            let path = dir.join(format!("{name}.kubeconfig"));
            server
                .write_kubeconfig(&path)
                .map_err(|e| SandboxError::Write { path: path.display().to_string(), message: e.to_string() })?;
            out.push(path);
            Ok(())
        };
        write("management", &self.mgmt)?;
        for c in &self.clusters {
            write(&c.name, &c.server)?;
        }
        Ok(out)
    }

    pub async fn shutdown(mut self) {
        self.stop_hub().await;
        for c in self.clusters {
            c.cke.cancel();
            c.server.shutdown().await;
        }
        self.mgmt.shutdown().await;
    }
}

async fn ensure_namespace(client: &Client, ns: &str) -> Result<(), SandboxError> {
    Ok(manifests::ensure_namespace(client, ns).await?)
}

/// Create or merge one object given as JSON (see [`manifests::apply_value`]).
pub async fn apply_value(client: &Client, doc: &Value, ns: &str, file: &str) -> Result<(), SandboxError> {
    Ok(manifests::apply_value(client, doc, ns, file).await?)
}

/// One line of progress for one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub pending: usize,
    pub running: usize,
    pub claims: usize,
    pub groups: usize,
    pub nodes_ready: usize,
    pub price_per_hour: f64,
    /// The cluster's phase in the rollout of a fleet pool of its namespace, if one rolls out.
    pub rollout: Option<crds::nodepool::RolloutPhase>,
}

impl World {
    /// What the API shows for cluster `i` now.
    pub async fn progress(&self, i: usize) -> Result<Progress, SandboxError> {
        let c = &self.clusters[i];
        let lp = ListParams::default();
        let pods = Api::<Pod>::namespaced(c.client(), "default").list(&lp).await?.items;
        let nodes = Api::<Node>::all(c.client()).list(&lp).await?.items;
        let groups = Api::<NodeGroup>::all(c.client()).list(&lp).await?.items;
        let claims = Api::<NodeClaim>::namespaced(self.mgmt.client(), &c.namespace).list(&lp).await?.items;
        let pools = Api::<crds::NodePool>::namespaced(self.mgmt.client(), &c.namespace).list(&lp).await?.items;
        let rollout = pools.iter().find_map(|p| {
            let r = p.status.as_ref()?.rollout.as_ref()?;
            r.clusters.iter().find(|r| r.name == c.name).map(|r| r.phase)
        });
        let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let catalog = crds::catalog::Catalog::builtin();
        let price = groups
            .iter()
            .filter(|g| g.metadata.deletion_timestamp.is_none())
            .filter_map(|g| catalog.flavors.iter().find(|f| f.name == g.spec.flavor).map(|f| f.price_hourly))
            .fold(0.0, |a, b| a + b);
        Ok(Progress {
            pending: pods.iter().filter(|p| phase(p) == "Pending").count(),
            running: pods.iter().filter(|p| phase(p) == "Running").count(),
            claims: claims.iter().filter(|claim| claim.spec.cluster_name == c.name).count(),
            groups: groups.len(),
            nodes_ready: nodes
                .iter()
                .filter(|n| n.labels().get(crds::labels::CLEVER_NODE_ROLE).map(String::as_str) == Some("worker"))
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count(),
            price_per_hour: price,
            rollout,
        })
    }
}

/// A workload pod that only fits on CKE worker nodes.
pub fn workload_pod(name: &str, cpu: &str, memory: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "nodeSelector": {crds::labels::CLEVER_NODE_ROLE: "worker"},
            "containers": [{"name": "app", "image": "registry.example/web:1", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
        }
    }))
    .unwrap_or_default()
}

/// Create `count` pods `web-<i>` in cluster `i`'s `default` namespace.
pub async fn scale(world: &World, i: usize, count: usize, cpu: &str, memory: &str) -> Result<(), SandboxError> {
    let api: Api<Pod> = Api::namespaced(world.clusters[i].client(), "default");
    let existing: Vec<String> =
        api.list(&ListParams::default()).await?.items.iter().map(ResourceExt::name_any).collect();
    for n in 0..count {
        let name = format!("web-{n}");
        if !existing.contains(&name) {
            api.create(&PostParams::default(), &workload_pod(&name, cpu, memory)).await?;
        }
    }
    for name in existing {
        let index: Option<usize> = name.strip_prefix("web-").and_then(|n| n.parse().ok());
        if index.is_some_and(|n| n >= count) {
            api.delete(&name, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}
