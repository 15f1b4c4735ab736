//! `karpenter-hub run`: the operator. Builds the management client, the registry and the hub
//! context, then runs every controller until the shutdown token fires.
//!
//! Owns: flags and wiring. Must not: hold logic (the controllers and pure modules do).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use kube::{Client, Config, config::KubeConfigOptions};
use tokio_util::sync::CancellationToken;

use crate::{
    controllers::cluster_status, controllers::disruption, controllers::flavorcatalog, controllers::gc,
    controllers::nodeclaim, controllers::nodeclass, controllers::nodepool, controllers::provisioning,
    decisions::capacity, infra::apierror::plain, infra::hub, infra::kubeconfig, infra::leader, infra::metrics,
    infra::registry,
};

/// Flags of `karpenter-hub run` (each also read from the environment).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster; default: in-cluster, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "KARPENTER_HUB_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// This hub's identity, written on every NodeGroup it creates; two hubs sharing a workload
    /// cluster must use different ids.
    #[arg(long, env = "KARPENTER_HUB_ID", default_value = "default", value_parser = parse_hub_id)]
    pub hub_id: String,
    /// Only serve this namespace of the management cluster: its kubeconfig Secrets, NodePools, node
    /// classes, catalogues and NodeClaims (default: all namespaces).
    #[arg(long, env = "KARPENTER_HUB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Accept kubeconfigs with `insecure-skip-tls-verify` or plain http:// servers (not recommended).
    #[arg(long, env = "KARPENTER_HUB_ALLOW_INSECURE_KUBECONFIG")]
    pub allow_insecure_kubeconfig: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "KARPENTER_HUB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "KARPENTER_HUB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Seconds between health probes of each workload cluster.
    #[arg(long, env = "KARPENTER_HUB_PROBE_INTERVAL", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub probe_interval_seconds: u64,
    /// Run only while holding the Lease `karpenter-hub-<hub-id>` (one active replica, standbys ready
    /// to take over). `--leader-elect=false` only for a single replica you are sure of.
    #[arg(long, env = "KARPENTER_HUB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,
    /// Namespace of the leader election Lease (default: $POD_NAMESPACE, else `karpenter-hub`).
    #[arg(long, env = "KARPENTER_HUB_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Seconds a flavor refused by CKE is not offered again in that cluster.
    #[arg(long, env = "KARPENTER_HUB_FLAVOR_COOLDOWN", default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub flavor_cooldown_seconds: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn parse_hub_id(s: &str) -> Result<String, String> {
    crds::validation::label_value(s)
        .map_err(|e| format!("--hub-id must be a valid label value (it is written as one on NodeGroups): {e}"))?;
    if s.is_empty() {
        return Err("--hub-id must not be empty".to_string());
    }
    Ok(s.to_string())
}

impl RunArgs {
    pub fn hub_settings(&self) -> hub::Settings {
        hub::Settings {
            hub_id: self.hub_id.clone(),
            namespace: self.namespace.clone(),
            capacity: capacity::Policy {
                cooldown: Duration::from_secs(self.flavor_cooldown_seconds),
                ..capacity::Policy::default()
            },
            ..hub::Settings::default()
        }
    }

    pub fn registry_settings(&self) -> registry::Settings {
        registry::Settings {
            kubeconfig_policy: kubeconfig::Policy { allow_insecure: self.allow_insecure_kubeconfig },
            probe_interval: Duration::from_secs(self.probe_interval_seconds),
            namespace: self.namespace.clone(),
            ..registry::Settings::default()
        }
    }
}

/// Errors that stop the operator.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read the management kubeconfig {path}: {source}")]
    Kubeconfig { path: String, source: kube::config::KubeconfigError },
    #[error("cannot configure the management client: {0}")]
    Config(String),
    #[error("cannot reach the management cluster: {}", plain(.0))]
    Client(#[from] kube::Error),
    #[error("cannot serve metrics: {0}")]
    Metrics(#[from] std::io::Error),
    #[error("lost the leader election Lease {0}; stopping so a standby replica takes over")]
    LostLeadership(String),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
}

/// The namespace of the leader election Lease, and whether someone chose it (flag, environment or
/// the pod's own namespace) rather than it being the default of a hub run by hand.
pub fn leader_election_namespace(flag: Option<&str>, pod_namespace: Option<&str>) -> (String, bool) {
    match flag.filter(|n| !n.is_empty()).or(pod_namespace.filter(|n| !n.is_empty())) {
        Some(ns) => (ns.to_string(), true),
        None => ("karpenter-hub".to_string(), false),
    }
}

/// The management cluster's client from `--kubeconfig` or the environment.
pub async fn management_client(path: Option<&PathBuf>) -> Result<Client, RunError> {
    let config = match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|source| RunError::Kubeconfig { path: p.display().to_string(), source })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| RunError::Kubeconfig { path: p.display().to_string(), source })?
        }
        None => Config::infer().await.map_err(|e| RunError::Config(e.to_string()))?,
    };
    Ok(Client::try_from(config)?)
}

/// Every controller of the hub over an existing management client, until `shutdown`.
pub async fn run_with(
    mgmt: Client,
    hub_settings: hub::Settings,
    registry_settings: registry::Settings,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let registry = registry::Registry::with_metrics(registry_settings, metrics.clone());
    let cache = hub::MgmtCache::start(&mgmt, hub_settings.namespace.as_deref(), &shutdown);
    let hub = hub::Hub::new(mgmt.clone(), registry.clone(), hub_settings, metrics.clone(), cache);
    tracing::info!(hub_id = %hub.settings.hub_id, "starting the hub");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (registry, mgmt, shutdown) = (registry.clone(), mgmt.clone(), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = registry.run(mgmt, shutdown).await {
                tracing::error!(error = %e, "cluster registry stopped");
            }
        });
    }
    tasks.spawn(nodeclaim::run(hub.clone(), shutdown.clone()));
    tasks.spawn(nodeclass::run(hub.clone(), shutdown.clone()));
    tasks.spawn(flavorcatalog::run(hub.clone(), shutdown.clone()));
    tasks.spawn(nodepool::run(hub.clone(), shutdown.clone()));
    tasks.spawn(provisioning::run(hub.clone(), shutdown.clone()));
    tasks.spawn(disruption::run(hub.clone(), shutdown.clone()));
    tasks.spawn(gc::run(hub.clone(), shutdown.clone()));
    tasks.spawn(cluster_status::run(hub.clone(), shutdown.clone()));
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    shutdown.cancelled().await;
    metrics.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    // Controllers finish their current reconcile; give them a bounded time.
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
    Ok(())
}

/// `karpenter-hub run`.
pub async fn run(args: RunArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let mgmt = management_client(args.kubeconfig.as_ref()).await?;
    mgmt.apiserver_version().await?;
    let metrics = Arc::new(metrics::Metrics::new());
    let server = tokio::spawn(metrics::serve(metrics.clone(), args.metrics_addr, shutdown.clone()));
    if args.leader_elect {
        let pod_namespace = std::env::var("POD_NAMESPACE").ok();
        let (namespace, chosen) =
            leader_election_namespace(args.leader_election_namespace.as_deref(), pod_namespace.as_deref());
        let lease = format!("karpenter-hub-{}", args.hub_id);
        let identity = format!(
            "{}-{}",
            std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_else(|_| "karpenter-hub".into()),
            std::process::id()
        );
        // A namespace someone named and that does not exist is more likely a mistake than a wish:
        // only the default one is created (a first run by hand, before installing the manifests).
        let elector = leader::Elector::new(mgmt.clone(), &namespace, &lease, &identity, leader::Timings::default())
            .creating_namespace(!chosen);
        if !elector.campaign(&shutdown).await? {
            return Ok(());
        }
        let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
        let keeper = {
            let (elector, lost, stop) = (elector.clone(), lost.clone(), stop.clone());
            tokio::spawn(async move { elector.keep(lost, stop).await })
        };
        // The controllers stop on shutdown or as soon as the Lease cannot be kept.
        let controllers = CancellationToken::new();
        {
            let (controllers, shutdown, lost) = (controllers.clone(), shutdown.clone(), lost.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = lost.cancelled() => {}
                }
                controllers.cancel();
            });
        }
        run_with(mgmt, args.hub_settings(), args.registry_settings(), metrics, controllers).await?;
        stop.cancel();
        let _ = keeper.await;
        if lost.is_cancelled() {
            return Err(RunError::LostLeadership(format!("{namespace}/{lease}")));
        }
        // Stopped acting: hand over at once instead of letting the Lease expire.
        elector.release().await;
    } else {
        run_with(mgmt, args.hub_settings(), args.registry_settings(), metrics, shutdown.clone()).await?;
    }
    if let Ok(Err(e)) = server.await {
        return Err(e.into());
    }
    Ok(())
}
