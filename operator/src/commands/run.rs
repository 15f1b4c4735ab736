//! `karpenter-hub run`: the operator. Builds the management client, the registry and the hub
//! context, then runs every controller until the shutdown token fires.
//!
//! Owns: flags and wiring. Must not: hold logic (the controllers and pure modules do).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use kube::{Client, Config, config::KubeConfigOptions};
use tokio_util::sync::CancellationToken;

use crate::{
    controllers::capacity_buffer, controllers::cluster_report, controllers::cluster_status, controllers::disruption,
    controllers::flavorcatalog, controllers::gc, controllers::nodeclaim, controllers::nodeclass, controllers::nodepool,
    controllers::organization, controllers::provisioning, controllers::static_capacity, decisions::capacity,
    decisions::hub_id, decisions::sharding as shard_rules, infra::apierror::plain, infra::clients, infra::hub,
    infra::identity, infra::kubeconfig, infra::leader, infra::metrics, infra::registry, infra::sharding,
};

/// Flags of `karpenter-hub run` (each also read from the environment).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Kubeconfig of the management cluster; default: in-cluster, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "KARPENTER_HUB_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// This hub's identity, written on every NodeGroup it creates and naming its Leases; two hubs
    /// sharing a workload cluster must use different ids. Default: `default` when this management
    /// cluster shows an install that ran under it, else `m-<12 hex digits of the management
    /// cluster's identity>` (docs/hub.md, "The hub id").
    #[arg(long, env = "KARPENTER_HUB_ID", value_parser = parse_hub_id)]
    pub hub_id: Option<String>,
    /// Only serve this namespace of the management cluster: its kubeconfig Secrets, NodePools, node
    /// classes, catalogues and NodeClaims (default: all namespaces).
    #[arg(long, env = "KARPENTER_HUB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Watch kubeconfig Secrets only in these namespaces (comma-separated; one watch each), for a
    /// hub whose Secret and ConfigMap rights are bound per namespace (RoleBindings) rather than
    /// cluster-wide. Its capacity ConfigMaps live there too. Default: every namespace (or the one
    /// of --namespace).
    #[arg(long, env = "KARPENTER_HUB_REGISTRATION_NAMESPACES", value_delimiter = ',', value_parser = parse_namespace)]
    pub registration_namespaces: Vec<String>,
    /// Accept kubeconfigs with `insecure-skip-tls-verify` or plain http:// servers (not recommended).
    #[arg(long, env = "KARPENTER_HUB_ALLOW_INSECURE_KUBECONFIG")]
    pub allow_insecure_kubeconfig: bool,
    /// Accept kubeconfigs whose server is on a link-local address (169.254.0.0/16, fe80::/10),
    /// where cloud metadata endpoints answer (not recommended).
    #[arg(long, env = "KARPENTER_HUB_ALLOW_LINK_LOCAL_SERVERS")]
    pub allow_link_local_servers: bool,
    /// Address of /metrics (and of /healthz and /readyz too). Unauthenticated: every interface by
    /// default so Prometheus can scrape the pod; 127.0.0.1:<port> keeps it inside the pod (then
    /// give the probes --health-probe-bind-address). `--metrics-addr` is the older name.
    #[arg(
        long = "metrics-bind-address",
        alias = "metrics-addr",
        env = "KARPENTER_HUB_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_addr: SocketAddr,
    /// A second listener serving only /healthz and /readyz (the kubelet's probes), so that
    /// --metrics-bind-address can be narrowed. Default: none (the probes use the metrics address).
    #[arg(long, env = "KARPENTER_HUB_HEALTH_PROBE_ADDR")]
    pub health_probe_bind_address: Option<SocketAddr>,
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
    /// Leader election: seconds the leader's Lease holds without renewal (how long a dead
    /// leader's standby waits).
    #[arg(long, env = "KARPENTER_HUB_LEADER_ELECT_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub leader_elect_lease_duration: u64,
    /// Leader election: seconds after which a leader that could not renew its Lease stops acting
    /// (its workload clients refuse every request from then on); shorter than the lease duration.
    #[arg(long, env = "KARPENTER_HUB_LEADER_ELECT_RENEW_DEADLINE", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub leader_elect_renew_deadline: u64,
    /// Leader election: seconds between renewals (and between a standby's attempts).
    #[arg(long, env = "KARPENTER_HUB_LEADER_ELECT_RETRY_PERIOD", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub leader_elect_retry_period: u64,
    /// Spread the workload clusters across every replica running with this flag (hub.md §6): the
    /// clusters are hashed to 32 shard buckets, each owned through a Lease in the leader election
    /// namespace; a replica that dies has its buckets taken over within --shard-lease-duration.
    /// Off: one active replica (--leader-elect).
    #[arg(long, env = "KARPENTER_HUB_SHARDING", default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub sharding: bool,
    /// Sharded mode: seconds a bucket's Lease holds without renewal (how long a dead replica's
    /// clusters wait for another owner).
    #[arg(long, env = "KARPENTER_HUB_SHARD_LEASE_DURATION", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub shard_lease_duration: u64,
    /// Sharded mode: seconds after which a replica that could not renew a bucket's Lease stops
    /// acting on its clusters; must be shorter than --shard-lease-duration.
    #[arg(long, env = "KARPENTER_HUB_SHARD_RENEW_DEADLINE", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub shard_renew_deadline: u64,
    /// Sharded mode: seconds between renewals; each renewal is one write per held bucket and one
    /// for the replica's membership Lease.
    #[arg(long, env = "KARPENTER_HUB_SHARD_RETRY_PERIOD", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub shard_retry_period: u64,
    /// Seconds a flavor refused by CKE is not offered again in that cluster.
    #[arg(long, env = "KARPENTER_HUB_FLAVOR_COOLDOWN", default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub flavor_cooldown_seconds: u64,
    /// Seconds a NodeGroup without its NodeClaim (or a launched claim whose NodeGroup vanished)
    /// must have existed before garbage collection removes it: younger, it may be a launch or a
    /// list still under way.
    #[arg(long, env = "KARPENTER_HUB_GC_MIN_AGE", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub gc_min_age_seconds: u64,
    /// Seconds between garbage-collection sweeps of each cluster (one also runs whenever a
    /// cluster connects or its state changes).
    #[arg(long, env = "KARPENTER_HUB_GC_PERIOD", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub gc_period_seconds: u64,
    /// At most this many orphaned NodeGroups deleted per cluster per garbage-collection sweep; the
    /// rest wait for the next sweep.
    #[arg(long, env = "KARPENTER_HUB_GC_MAX_DELETIONS_PER_SWEEP", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub gc_max_deletions_per_sweep: u64,
    /// A sweep that would delete more than this percentage of a cluster's NodeGroups carrying this
    /// hub's labels (and more than one) deletes none and raises `GarbageCollectionHalted` on the
    /// cluster's NodePools (100: never halt).
    #[arg(long, env = "KARPENTER_HUB_GC_HALT_PERCENT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub gc_halt_percent: u8,
    /// Seconds a consolidation or emptiness command waits before it is validated against the
    /// cluster as it is then and started (drift has no such wait).
    #[arg(long, env = "KARPENTER_HUB_DISRUPTION_VALIDATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub disruption_validation_seconds: u64,
    /// `strict`: a new node whose flavor options would fall below a NodePool requirement's
    /// `minValues` is not made, its pods wait; `best-effort`: the `minValues` is lowered to the
    /// values left and the NodeClaim is annotated `karpenter.sh/nodeclaim-min-values-relaxed`.
    #[arg(long, env = "KARPENTER_HUB_MIN_VALUES_POLICY", value_enum, default_value_t = super::MinValuesArg::Strict)]
    pub min_values_policy: super::MinValuesArg,
}

/// The log filter of `karpenter-hub run` when `RUST_LOG` is unset. `kube_client::client` and
/// `kube_runtime::watcher` only from `error`: at `warn` kube logs a whole response body it could
/// not decode, and the watcher a refusal's whole `Status`, and a workload cluster's server, which a
/// tenant's kubeconfig names, chooses both (hub.md, "What a failed connection tells whom"); the
/// hub logs those failures itself, in its own words.
pub const DEFAULT_LOG_FILTER: &str =
    "info,kube=warn,kube_client::client=error,kube_runtime::watcher=error,tower=warn,hyper=warn";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A flag's value refused before `run` starts (clap prints it after the value).
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    /// One of `--registration-namespaces` is not a namespace name.
    #[error("--registration-namespaces takes namespace names separated by commas; {name:?} is not one: {reason}")]
    Namespace { name: String, reason: crds::validation::Reason },
    /// `--hub-id` cannot be a hub id.
    #[error("--hub-id {0}; or leave --hub-id out to have one chosen")]
    HubId(#[from] hub_id::IdError),
}

fn parse_namespace(s: &str) -> Result<String, ArgError> {
    crds::validation::dns1123_label(s).map_err(|reason| ArgError::Namespace { name: s.to_string(), reason })?;
    Ok(s.to_string())
}

fn parse_hub_id(s: &str) -> Result<String, ArgError> {
    hub_id::check(s)?;
    Ok(s.to_string())
}

impl RunArgs {
    /// The hub's settings; `hub_id` is empty when `--hub-id` is not given (`run` chooses it).
    pub fn hub_settings(&self) -> hub::Settings {
        hub::Settings {
            hub_id: self.hub_id.clone().unwrap_or_default(),
            namespace: self.namespace.clone(),
            capacity: capacity::Policy {
                cooldown: Duration::from_secs(self.flavor_cooldown_seconds),
                ..capacity::Policy::default()
            },
            gc_min_age: Duration::from_secs(self.gc_min_age_seconds),
            gc_period: Duration::from_secs(self.gc_period_seconds),
            gc_brake: crate::decisions::garbage::Brake {
                max_per_sweep: usize::try_from(self.gc_max_deletions_per_sweep).unwrap_or(usize::MAX),
                halt_percent: self.gc_halt_percent,
            },
            disruption_validation: Duration::from_secs(self.disruption_validation_seconds),
            scheduler: scheduling::model::Settings {
                min_values_policy: self.min_values_policy.into(),
                ..scheduling::model::Settings::default()
            },
            ..hub::Settings::default()
        }
    }

    pub fn registry_settings(&self) -> registry::Settings {
        registry::Settings {
            kubeconfig_policy: kubeconfig::Policy {
                allow_insecure: self.allow_insecure_kubeconfig,
                allow_link_local: self.allow_link_local_servers,
            },
            probe_interval: Duration::from_secs(self.probe_interval_seconds),
            namespace: self.namespace.clone(),
            registration_namespaces: self.registration_namespaces.clone(),
            sharded: self.sharding,
            ..registry::Settings::default()
        }
    }

    /// The leader election timings, validated (the error names the flags and the fix).
    pub fn leader_timings(&self) -> Result<leader::Timings, leader::TimingsError> {
        leader::Timings::new(
            Duration::from_secs(self.leader_elect_lease_duration),
            Duration::from_secs(self.leader_elect_renew_deadline),
            Duration::from_secs(self.leader_elect_retry_period),
        )
    }

    /// The shard Lease timings, validated (the error names the flags and the fix).
    pub fn shard_timings(&self) -> Result<shard_rules::Timings, shard_rules::TimingsError> {
        shard_rules::Timings::new(
            Duration::from_secs(self.shard_lease_duration),
            Duration::from_secs(self.shard_renew_deadline),
            Duration::from_secs(self.shard_retry_period),
        )
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
    #[error(transparent)]
    Identity(identity::IdentityError),
    #[error("cannot choose the hub id: {0}")]
    HubId(hub_id::IdError),
    #[error(transparent)]
    HubIdFacts(identity::FactsError),
    #[error("cannot serve metrics: {0}")]
    Metrics(#[from] std::io::Error),
    #[error("lost the leader election Lease {0}; stopping so a standby replica takes over")]
    LostLeadership(String),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    /// Not a `source`: the message already says it all, once.
    #[error("invalid leader election flags: {0}")]
    LeaderTimings(leader::TimingsError),
    /// Not a `source`: the message already says it all, once.
    #[error("invalid sharding flags: {0}")]
    ShardTimings(shard_rules::TimingsError),
    #[error(
        "--registration-namespaces {listed} does not hold --namespace {namespace}: a hub serving one namespace reads registrations there only; drop --registration-namespaces or make it {namespace}"
    )]
    RegistrationNamespaces { listed: String, namespace: String },
    #[error(
        "--sharding needs leader election: one replica at a time writes the namespace-wide status (node classes, flavor catalogues) under the leader Lease; drop --leader-elect=false"
    )]
    ShardingWithoutLeaderElection,
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
    Ok(Client::try_from(management_config(path).await?)?)
}

/// The management cluster's client configuration: the kubeconfig at `path`, else in-cluster or
/// `$KUBECONFIG` (sharded mode builds a second client from it for its Lease thread).
pub async fn management_config(path: Option<&PathBuf>) -> Result<Config, RunError> {
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
    let mut config = config;
    crate::infra::identify(&mut config);
    Ok(config)
}

/// Every controller of the hub over an existing management client, until `shutdown`.
pub async fn run_with(
    mgmt: Client,
    hub_settings: hub::Settings,
    registry_settings: registry::Settings,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let Some(hub_settings) = with_identity(&mgmt, hub_settings, &shutdown).await? else { return Ok(()) };
    let registry = registry::Registry::with_metrics(for_hub(registry_settings, &hub_settings), metrics.clone());
    let cache = hub::MgmtCache::start(&mgmt, hub_settings.namespace.as_deref(), &shutdown);
    let hub = hub::Hub::new(mgmt.clone(), registry.clone(), hub_settings, metrics.clone(), cache);
    tracing::info!(hub_id = %hub.settings.hub_id, "starting the hub");
    let mut tasks = tokio::task::JoinSet::new();
    spawn_registry(&mut tasks, &registry, &mgmt, &shutdown);
    spawn_per_cluster(&mut tasks, &hub, &shutdown);
    tasks.spawn(nodeclass::run(hub.clone(), shutdown.clone()));
    tasks.spawn(flavorcatalog::run(hub.clone(), shutdown.clone()));
    metrics.leader.set(1);
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    shutdown.cancelled().await;
    finish(tasks, &metrics).await;
    Ok(())
}

/// The registry's settings, told who the hub is (a registration's declared move is checked
/// against it).
fn for_hub(registry: registry::Settings, hub: &hub::Settings) -> registry::Settings {
    registry::Settings { hub_id: hub.hub_id.clone(), management_cluster: hub.management_cluster.clone(), ..registry }
}

/// The hub id (`--hub-id`, else chosen by [`hub_id::choose`] from what the management cluster
/// shows) and, when it had to be read for that, the management cluster's identity (else empty:
/// [`with_identity`] reads it); `None` when `shutdown` fired first. One line says which id and why.
async fn settle_hub_id(
    mgmt: &Client,
    given: Option<&str>,
    place: identity::Place<'_>,
    shutdown: &CancellationToken,
) -> Result<Option<(String, String)>, RunError> {
    if let Some(id) = given {
        tracing::info!(hub_id = %id, reason = %hub_id::Reason::Given, "hub id chosen");
        return Ok(Some((id.to_string(), String::new())));
    }
    let uid = match identity::wait(mgmt, shutdown).await {
        Ok(uid) => uid,
        Err(identity::IdentityError::Cancelled) => return Ok(None),
        Err(e) => return Err(RunError::Identity(e)),
    };
    let facts = match identity::wait_hub_id_facts(mgmt, place, shutdown).await {
        Ok(facts) => facts,
        Err(identity::FactsError::Cancelled) => return Ok(None),
        Err(e) => return Err(RunError::HubIdFacts(e)),
    };
    let choice = hub_id::choose(&facts, &uid).map_err(RunError::HubId)?;
    tracing::info!(hub_id = %choice.id, reason = %choice.reason, management_cluster = %uid, "hub id chosen");
    Ok(Some((choice.id, uid)))
}

/// The settings with the management cluster's identity (hub.md §5), read unless given; `None`
/// when `shutdown` fired first. No controller starts without it.
async fn with_identity(
    mgmt: &Client,
    mut settings: hub::Settings,
    shutdown: &CancellationToken,
) -> Result<Option<hub::Settings>, RunError> {
    if settings.management_cluster.is_empty() {
        settings.management_cluster = match identity::wait(mgmt, shutdown).await {
            Ok(uid) => uid,
            Err(identity::IdentityError::Cancelled) => return Ok(None),
            Err(e) => return Err(RunError::Identity(e)),
        };
    }
    tracing::info!(hub_id = %settings.hub_id, management_cluster = %settings.management_cluster, "this hub's NodeGroups carry its hub id and its management cluster's identity");
    Ok(Some(settings))
}

fn spawn_registry(
    tasks: &mut tokio::task::JoinSet<()>,
    registry: &registry::Registry,
    mgmt: &Client,
    shutdown: &CancellationToken,
) {
    let (registry, mgmt, shutdown) = (registry.clone(), mgmt.clone(), shutdown.clone());
    tasks.spawn(async move {
        if let Err(e) = registry.run(mgmt, shutdown).await {
            tracing::error!(error = %e, "cluster registry stopped");
        }
    });
}

/// The controllers whose every write is about one workload cluster: they act only on the clusters
/// the registry serves (in sharded mode, those this replica owns).
fn spawn_per_cluster(tasks: &mut tokio::task::JoinSet<()>, hub: &Arc<hub::Hub>, shutdown: &CancellationToken) {
    tasks.spawn(nodeclaim::run(hub.clone(), shutdown.clone()));
    tasks.spawn(nodepool::run(hub.clone(), shutdown.clone()));
    tasks.spawn(provisioning::run(hub.clone(), shutdown.clone()));
    tasks.spawn(static_capacity::run(hub.clone(), shutdown.clone()));
    tasks.spawn(capacity_buffer::run(hub.clone(), shutdown.clone()));
    tasks.spawn(crate::controllers::node_overlay::run(hub.clone(), shutdown.clone()));
    tasks.spawn(disruption::run(hub.clone(), shutdown.clone()));
    tasks.spawn(gc::run(hub.clone(), shutdown.clone()));
    tasks.spawn(cluster_status::run(hub.clone(), shutdown.clone()));
    tasks.spawn(cluster_report::run(hub.clone(), shutdown.clone()));
    tasks.spawn(organization::run(hub.clone(), shutdown.clone()));
}

async fn finish(mut tasks: tokio::task::JoinSet<()>, metrics: &metrics::Metrics) {
    metrics.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    metrics.leader.set(0);
    // Controllers finish their current reconcile; give them a bounded time.
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
}

/// Sharded mode (hub.md §6) over an existing management client, until `shutdown`: this replica
/// owns the clusters the shard Leases give it and runs the per-cluster controllers for those only;
/// the namespace-wide status writers (node classes, flavor catalogues, and the NodePools of
/// clusters nobody registered) run only while it holds the leader Lease `karpenter-hub-<hub-id>`,
/// so each of those objects has one writer whatever the number of replicas.
pub async fn run_sharded_with(
    mgmt: Client,
    hub_settings: hub::Settings,
    mut registry_settings: registry::Settings,
    shard: sharding::Settings,
    create_namespace: bool,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    registry_settings.sharded = true;
    // A fenced cluster's caches are kept as long as its bucket's Lease may still be ours.
    registry_settings.keep_unowned = shard.timings.lease_duration;
    registry_settings.replica = Some(shard.identity.clone());
    let Some(mut hub_settings) = with_identity(&mgmt, hub_settings, &shutdown).await? else { return Ok(()) };
    // Each replica writes its own fleet pool rows, under a field manager named for it.
    hub_settings.replica = shard.identity.clone();
    let registry = registry::Registry::with_metrics(for_hub(registry_settings, &hub_settings), metrics.clone());
    let cache = hub::MgmtCache::start(&mgmt, hub_settings.namespace.as_deref(), &shutdown);
    let hub = hub::Hub::new(mgmt.clone(), registry.clone(), hub_settings, metrics.clone(), cache);
    tracing::info!(hub_id = %hub.settings.hub_id, identity = %shard.identity, namespace = %shard.namespace, "starting the hub in sharded mode");
    let mut tasks = tokio::task::JoinSet::new();
    spawn_registry(&mut tasks, &registry, &mgmt, &shutdown);
    let sharder = sharding::Sharder::new(mgmt.clone(), shard.clone(), registry.clone(), metrics.clone());
    {
        let (sharder, shutdown) = (sharder.clone(), shutdown.clone());
        tasks.spawn(async move { sharder.run(shutdown).await });
    }
    spawn_per_cluster(&mut tasks, &hub, &shutdown);
    let timings = leader::Timings {
        lease_duration: shard.timings.lease_duration,
        renew_deadline: shard.timings.renew_deadline,
        retry_period: shard.timings.retry_period,
    };
    let lease = hub_id::leader_lease_name(&hub.settings.hub_id);
    let elector = leader::Elector::new(mgmt.clone(), &shard.namespace, &lease, &shard.identity, timings)
        .creating_namespace(create_namespace);
    let namespace_wide = tokio::spawn(namespace_wide(hub.clone(), elector, shutdown.clone()));
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let result = tokio::select! {
        () = shutdown.cancelled() => Ok(()),
        r = namespace_wide => match r {
            Ok(Err(e)) => Err(RunError::Leader(e)),
            _ => Ok(()),
        },
    };
    finish(tasks, &metrics).await;
    result
}

/// Sharded mode: campaign for the leader Lease; while held, run the namespace-wide status writers;
/// when lost, stop them and campaign again (the per-cluster work goes on meanwhile).
async fn namespace_wide(
    hub: Arc<hub::Hub>,
    elector: leader::Elector,
    shutdown: CancellationToken,
) -> Result<(), leader::LeaderError> {
    loop {
        if !elector.campaign(&shutdown).await? {
            return Ok(());
        }
        tracing::info!(hub_id = %hub.settings.hub_id, "holding the leader Lease: writing node class and flavor catalogue status");
        hub.metrics.leader.set(1);
        let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
        let keeper = {
            let (elector, lost, stop) = (elector.clone(), lost.clone(), stop.clone());
            tokio::spawn(async move { elector.keep(lost, stop).await })
        };
        let writers = shutdown.child_token();
        hub.registry.set_namespace_writer(true);
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(nodeclass::run(hub.clone(), writers.clone()));
        tasks.spawn(flavorcatalog::run(hub.clone(), writers.clone()));
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = lost.cancelled() => {}
        }
        hub.registry.set_namespace_writer(false);
        hub.metrics.leader.set(0);
        writers.cancel();
        while tasks.join_next().await.is_some() {}
        stop.cancel();
        let _ = keeper.await;
        if shutdown.is_cancelled() {
            elector.release().await;
            return Ok(());
        }
        tracing::warn!(hub_id = %hub.settings.hub_id, "lost the leader Lease: stopped writing node class and flavor catalogue status; campaigning again");
    }
}

/// `karpenter-hub run`.
pub async fn run(args: RunArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    // Flags first: a wrong combination is refused before anything is reached.
    if let Some(ns) = &args.namespace
        && !args.registration_namespaces.is_empty()
        && !args.registration_namespaces.contains(ns)
    {
        return Err(RunError::RegistrationNamespaces {
            listed: args.registration_namespaces.join(","),
            namespace: ns.clone(),
        });
    }
    let shard_timings = if args.sharding {
        if !args.leader_elect {
            return Err(RunError::ShardingWithoutLeaderElection);
        }
        Some(args.shard_timings().map_err(RunError::ShardTimings)?)
    } else {
        None
    };
    // Sharded mode's leader Lease follows the shard timings; these are for one active replica.
    let leader_timings = if args.leader_elect && !args.sharding {
        args.leader_timings().map_err(RunError::LeaderTimings)?
    } else {
        leader::Timings::default()
    };
    let mgmt_config = management_config(args.kubeconfig.as_ref()).await?;
    let metrics = Arc::new(metrics::Metrics::new());
    let mgmt = clients::build(mgmt_config.clone(), &metrics, clients::Side::Management)?;
    mgmt.apiserver_version().await?;
    let server = tokio::spawn(metrics::serve(metrics.clone(), args.metrics_addr, shutdown.clone()));
    let probes = args
        .health_probe_bind_address
        .map(|addr| tokio::spawn(metrics::serve_probes(metrics.clone(), addr, shutdown.clone())));
    let pod_namespace = std::env::var("POD_NAMESPACE").ok();
    let (namespace, chosen) =
        leader_election_namespace(args.leader_election_namespace.as_deref(), pod_namespace.as_deref());
    // The process id too: two processes on one host differ. A restarted container (same pod name,
    // usually pid 1) comes back as the same member and renews the Leases it held, which is safe:
    // its previous process is gone.
    let identity = format!(
        "{}-{}",
        std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_else(|_| "karpenter-hub".into()),
        std::process::id()
    );
    // The hub id names the Leases: settled before any is campaigned for.
    let mut hub_settings = args.hub_settings();
    let place = identity::Place {
        lease_namespace: args.leader_elect.then_some(namespace.as_str()),
        claim_namespaces: match &args.namespace {
            Some(ns) => std::slice::from_ref(ns),
            None => &args.registration_namespaces,
        },
    };
    let Some((hub_id, management_cluster)) = settle_hub_id(&mgmt, args.hub_id.as_deref(), place, &shutdown).await?
    else {
        return Ok(());
    };
    hub_settings.hub_id = hub_id;
    hub_settings.management_cluster = management_cluster;
    hub_settings.replica = identity.clone();
    if let Some(timings) = shard_timings {
        tracing::info!(
            lease_duration_seconds = timings.lease_duration.as_secs(),
            renew_deadline_seconds = timings.renew_deadline.as_secs(),
            retry_period_seconds = timings.retry_period.as_secs(),
            "sharded mode: each held shard bucket and the membership cost one Lease write every {} s",
            timings.retry_period.as_secs()
        );
        let shard = sharding::Settings::new(&hub_settings.hub_id, &namespace, &identity, timings)
            .with_lease_client(mgmt_config);
        run_sharded_with(mgmt, hub_settings, args.registry_settings(), shard, !chosen, metrics, shutdown.clone())
            .await?;
    } else if args.leader_elect {
        let lease = hub_id::leader_lease_name(&hub_settings.hub_id);
        // A namespace someone named and that does not exist is more likely a mistake than a wish:
        // only the default one is created (a first run by hand, before installing the manifests).
        let elector = leader::Elector::new(mgmt.clone(), &namespace, &lease, &identity, leader_timings)
            .creating_namespace(!chosen);
        // A standby is ready: healthy and waiting for the Lease (karpenter_hub_leader says 0).
        metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
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
        // Fenced: once the Lease is lost, a reconcile still finishing reaches no workload cluster
        // (a standby may take over one lease duration after the last renewal).
        let registry_settings = registry::Settings { fence_on_shutdown: true, ..args.registry_settings() };
        run_with(mgmt, hub_settings, registry_settings, metrics, controllers).await?;
        stop.cancel();
        let _ = keeper.await;
        if lost.is_cancelled() {
            return Err(RunError::LostLeadership(format!("{namespace}/{lease}")));
        }
        // Stopped acting: hand over at once instead of letting the Lease expire.
        elector.release().await;
    } else {
        run_with(mgmt, hub_settings, args.registry_settings(), metrics, shutdown.clone()).await?;
    }
    if let Ok(Err(e)) = server.await {
        return Err(e.into());
    }
    if let Some(probes) = probes
        && let Ok(Err(e)) = probes.await
    {
        return Err(e.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> RunArgs {
        Cli::try_parse_from(std::iter::once("karpenter-hub").chain(args.iter().copied())).unwrap().run
    }

    #[test]
    fn sharding_is_off_by_default_and_its_timings_are_validated_naming_the_flags() {
        let default = parse(&[]);
        assert!(!default.sharding && !default.registry_settings().sharded);
        assert_eq!(default.shard_timings(), Ok(shard_rules::Timings::DEFAULT));
        let on =
            parse(&["--sharding", "--shard-lease-duration=15", "--shard-renew-deadline=10", "--shard-retry-period=5"]);
        assert!(on.sharding && on.registry_settings().sharded);
        assert_eq!(on.shard_timings().unwrap().renew_deadline, Duration::from_secs(10));
        assert!(parse(&["--sharding=false"]).sharding.eq(&false));
        let e = parse(&["--sharding", "--shard-renew-deadline=30"]).shard_timings().unwrap_err().to_string();
        assert!(e.contains("--shard-renew-deadline (30s)") && e.contains("--shard-lease-duration (30s)"), "{e}");
        let e = parse(&["--sharding", "--shard-retry-period=20"]).shard_timings().unwrap_err().to_string();
        assert!(e.contains("--shard-retry-period") && e.contains("raise the deadline"), "{e}");
        assert!(Cli::try_parse_from(["karpenter-hub", "--shard-lease-duration=0"]).is_err(), "below the range");
    }

    #[test]
    fn leader_election_timings_default_to_client_go_s_and_are_validated_naming_the_flags() {
        assert_eq!(parse(&[]).leader_timings(), Ok(leader::Timings::default()));
        let short = parse(&[
            "--leader-elect-lease-duration=3",
            "--leader-elect-renew-deadline=2",
            "--leader-elect-retry-period=1",
        ]);
        assert_eq!(short.leader_timings().unwrap().renew_deadline, Duration::from_secs(2));
        let e = parse(&["--leader-elect-renew-deadline=15"]).leader_timings().unwrap_err().to_string();
        assert!(
            e.contains("--leader-elect-renew-deadline (15s)") && e.contains("--leader-elect-lease-duration (15s)"),
            "{e}"
        );
        let e = parse(&["--leader-elect-retry-period=10"]).leader_timings().unwrap_err().to_string();
        assert!(e.contains("--leader-elect-retry-period") && e.contains("raise the deadline"), "{e}");
    }

    #[test]
    fn the_metrics_and_probe_listeners_take_the_addresses_given() {
        let default = parse(&[]);
        assert_eq!(default.metrics_addr, "0.0.0.0:8080".parse().unwrap(), "today's default");
        assert_eq!(default.health_probe_bind_address, None);
        let narrowed = parse(&["--metrics-bind-address=127.0.0.1:9090", "--health-probe-bind-address=0.0.0.0:8081"]);
        assert_eq!(narrowed.metrics_addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(narrowed.health_probe_bind_address, Some("0.0.0.0:8081".parse().unwrap()));
        assert_eq!(parse(&["--metrics-addr=[::1]:8080"]).metrics_addr, "[::1]:8080".parse().unwrap(), "older name");
        assert!(Cli::try_parse_from(["karpenter-hub", "--metrics-bind-address=localhost"]).is_err());
    }

    #[test]
    fn the_hub_id_is_optional_and_when_given_must_fit_a_label_value_and_the_lease_name() {
        assert_eq!(parse(&[]).hub_id, None, "chosen at start (decisions::hub_id)");
        assert_eq!(parse(&[]).hub_settings().hub_id, "");
        assert_eq!(parse(&["--hub-id=eu-west"]).hub_settings().hub_id, "eu-west");
        assert_eq!(parse(&["--hub-id", &"a".repeat(63)]).hub_id.unwrap().len(), 63);
        // `Prod_1` is a label value, but the Lease karpenter-hub-Prod_1 could never be created.
        for bad in ["Prod_1", "team_a.eu-1", "", "-a", &"a".repeat(64)] {
            let e = Cli::try_parse_from(["karpenter-hub", &format!("--hub-id={bad}")]).unwrap_err().to_string();
            assert!(e.contains("--hub-id") && e.contains("lowercase letters, digits and '-'"), "{bad}: {e}");
            assert!(e.contains("leave --hub-id out"), "{e}");
        }
    }

    #[test]
    fn registration_namespaces_are_listed_names_passed_to_the_registry() {
        assert!(parse(&[]).registry_settings().registration_namespaces.is_empty());
        let two = parse(&["--registration-namespaces=team-a,team-b"]).registry_settings();
        assert_eq!(two.registration_namespaces, ["team-a", "team-b"]);
        let e = Cli::try_parse_from(["karpenter-hub", "--registration-namespaces=team-a,Team_B"]).unwrap_err();
        assert!(e.to_string().contains("\"Team_B\" is not one"), "{e}");
    }

    #[tokio::test]
    async fn registration_namespaces_must_hold_the_served_namespace_and_are_checked_first() {
        // Refused before any connection is tried (no management cluster here).
        let args = parse(&["--namespace=team-a", "--registration-namespaces=team-b,team-c"]);
        let e = run(args, CancellationToken::new()).await.unwrap_err().to_string();
        assert!(e.contains("--registration-namespaces team-b,team-c does not hold --namespace team-a"), "{e}");
    }

    #[test]
    fn garbage_collection_timings_default_to_two_minutes_and_are_passed_on() {
        let default = parse(&[]).hub_settings();
        assert_eq!((default.gc_min_age, default.gc_period), (Duration::from_secs(120), Duration::from_secs(120)));
        let short = parse(&["--gc-min-age-seconds=5", "--gc-period-seconds=10"]).hub_settings();
        assert_eq!((short.gc_min_age, short.gc_period), (Duration::from_secs(5), Duration::from_secs(10)));
        assert!(Cli::try_parse_from(["karpenter-hub", "--gc-min-age-seconds=0"]).is_err(), "below the range");
    }

    #[test]
    fn the_garbage_collection_brake_defaults_to_ten_a_sweep_and_half_a_cluster_and_is_passed_on() {
        use crate::decisions::garbage::Brake;
        assert_eq!(parse(&[]).hub_settings().gc_brake, Brake { max_per_sweep: 10, halt_percent: 50 });
        let set = parse(&["--gc-max-deletions-per-sweep=3", "--gc-halt-percent=100"]).hub_settings();
        assert_eq!(set.gc_brake, Brake { max_per_sweep: 3, halt_percent: 100 });
        for bad in ["--gc-max-deletions-per-sweep=0", "--gc-halt-percent=0", "--gc-halt-percent=101"] {
            assert!(Cli::try_parse_from(["karpenter-hub", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_disruption_validation_delay_defaults_to_fifteen_seconds_and_is_passed_on() {
        assert_eq!(parse(&[]).hub_settings().disruption_validation, Duration::from_secs(15));
        let short = parse(&["--disruption-validation-seconds=2"]).hub_settings();
        assert_eq!(short.disruption_validation, Duration::from_secs(2));
        assert!(
            Cli::try_parse_from(["karpenter-hub", "--disruption-validation-seconds=0"]).is_err(),
            "below the range"
        );
    }
}
