//! `sim::apiserver`: an in-process Kubernetes API server, one instance per simulated cluster and
//! many per process, served over HTTPS (a CA generated per instance, bearer-token auth) so that
//! clients use their production stack (`kube::Client`, `kubectl`).
//!
//! Owns: the listener and connections ([`ApiServer`]), request routing and rendering (`server`),
//! storage and the generic write path (`store`), what kube-apiserver and the controllers do with
//! built-in kinds beyond storing them (`behaviour`, one module per behaviour), discovery,
//! selectors, patches, tables, fault injection and request counters. Must not do: anything a
//! controller of the simulated world does beyond what kube-apiserver and kube-controller-manager
//! do on their own (namespace, garbage, pod and disruption controllers); CKE, kubelets and the
//! scheduler are clients (`sim::cke`).
//!
//! What is simplified, and how, is written down in `docs/emulator.md`.

mod behaviour;
mod builtin;
mod disruptions;
mod events;
mod faults;
mod jsonpath;
mod object;
mod openapi;
mod patch;
mod protobuf;
mod rbac;
mod resources;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::config::{AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

pub use faults::{
    ConflictFault, ErrorFault, FAULT_EXEMPT_HEADER, FaultKind, Faults, MAX_WRITE_LOG, Requests, SlowFault, WatchChurn,
    Written, exempt_from_faults,
};

pub use disruptions::{DisruptionLog, PdbState, PodDisruption, Via};

use crate::clock::{Clock, SeededRng};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Errors starting an emulator.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Binding the listener failed.
    #[error("cannot bind the API emulator listener: {0}")]
    Bind(#[from] std::io::Error),
    /// Generating the TLS material failed.
    #[error("cannot generate the API emulator's TLS material: {0}")]
    Tls(String),
    /// A preinstalled CRD was rejected.
    #[error("cannot install CRD {name}: {message}")]
    Crd {
        /// CRD name.
        name: String,
        /// The apiserver's message.
        message: String,
    },
}

/// Errors writing a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Serialising.
    #[error("cannot render kubeconfig: {0}")]
    Render(String),
    /// Writing the file.
    #[error("cannot write kubeconfig: {0}")]
    Io(#[from] std::io::Error),
}

/// How to start an emulator.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// The cluster's name (kubeconfig cluster/context/user names, CA common name).
    pub cluster_name: String,
    /// Seed of everything random (uids, generated names, tokens, injected faults).
    pub seed: u64,
    /// CRDs installed before the server accepts requests.
    pub crds: Vec<CustomResourceDefinition>,
    /// Time source for timestamps (creation, deletion); a manual clock makes them deterministic.
    pub clock: Clock,
    /// Number of watch events kept: a watch from an older resourceVersion gets `410 Gone`.
    pub watch_history: usize,
    /// Period of watch bookmarks (kube-apiserver: about a minute).
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds` (kube-apiserver: 30–60 min).
    pub watch_timeout: Duration,
}

impl ApiServerConfig {
    /// A cluster named `name` with no CRDs, seed 0, the real clock.
    pub fn new(name: impl Into<String>) -> ApiServerConfig {
        ApiServerConfig {
            cluster_name: name.into(),
            seed: 0,
            crds: Vec::new(),
            clock: Clock::real(),
            watch_history: 4_000,
            bookmark_interval: Duration::from_secs(60),
            watch_timeout: Duration::from_secs(1800),
        }
    }

    /// A workload (CKE) cluster: the NodeGroup test CRD preinstalled.
    pub fn workload(name: impl Into<String>) -> ApiServerConfig {
        ApiServerConfig::new(name).with_crds(crds::crd::testing_crds().into_iter().map(|f| f.crd))
    }

    /// A management cluster: the hub's CRDs preinstalled.
    pub fn management(name: impl Into<String>) -> ApiServerConfig {
        ApiServerConfig::new(name).with_crds(crds::crd::hub_crds().into_iter().map(|f| f.crd))
    }

    /// Adds CRDs to preinstall.
    pub fn with_crds(mut self, crds: impl IntoIterator<Item = CustomResourceDefinition>) -> ApiServerConfig {
        self.crds.extend(crds);
        self
    }

    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> ApiServerConfig {
        self.seed = seed;
        self
    }

    /// Sets the clock.
    pub fn with_clock(mut self, clock: Clock) -> ApiServerConfig {
        self.clock = clock;
        self
    }
}

/// State shared by the listener, connections and handles.
pub(crate) struct Shared {
    pub cluster: String,
    pub store: Mutex<store::State>,
    pub faults: Arc<faults::FaultState>,
    pub requests: Requests,
    pub token: RwLock<String>,
    pub clock: Clock,
    pub bookmark_interval: Duration,
    pub watch_timeout: Duration,
    pub addr: SocketAddr,
    pub shutdown: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("cluster", &self.cluster).field("addr", &self.addr).finish()
    }
}

/// A running emulator. Dropping it stops the server (like [`ApiServer::shutdown`], without waiting).
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    ca_pem: String,
    task: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Starts an emulator on `127.0.0.1:<random port>`.
    pub async fn start(config: ApiServerConfig) -> Result<ApiServer, StartError> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let tls = tls::generate(&config.cluster_name)?;
        let (events, _) = broadcast::channel(16_384);
        let mut state = store::State::new(config.clock.clone(), config.seed, config.watch_history, events);
        state.ca_pem = tls.ca_pem.clone();
        let token = SeededRng::new(config.seed ^ 0x70CE).next_u64();
        let token = format!(
            "{}-{token:016x}",
            config.cluster_name.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        );
        if let Some(crd_res) = state.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions") {
            for crd in &config.crds {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let body = serde_json::to_value(crd)
                    .map_err(|e| StartError::Crd { name: name.clone(), message: e.to_string() })?;
                state.create(&crd_res, None, body).map_err(|e| StartError::Crd { name, message: e.message })?;
            }
        }
        let shared = Arc::new(Shared {
            cluster: config.cluster_name.clone(),
            store: Mutex::new(state),
            faults: Arc::new(faults::FaultState::new(config.seed)),
            requests: Requests::default(),
            token: RwLock::new(token),
            clock: config.clock.clone(),
            bookmark_interval: config.bookmark_interval,
            watch_timeout: config.watch_timeout,
            addr,
            shutdown: tokio::sync::watch::Sender::new(false),
        });
        let task = tokio::spawn(server::serve(listener, tls.server_config, shared.clone()));
        Ok(ApiServer { shared, ca_pem: tls.ca_pem, task: Some(task) })
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.shared.cluster
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.shared.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The CA certificate (PEM) that signed the server certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The current admin bearer token.
    pub fn token(&self) -> String {
        self.shared.token.read().map(|t| t.clone()).unwrap_or_default()
    }

    /// Replaces the admin token (the old one gets 401 from now on) and returns the new one.
    pub fn rotate_token(&self) -> String {
        let new = {
            let mut st = lock(&self.shared.store);
            format!("{}-{}", self.shared.cluster.to_lowercase(), st.token())
        };
        if let Ok(mut t) = self.shared.token.write() {
            *t = new.clone();
        }
        new
    }

    /// A kubeconfig for this cluster with the admin token (one cluster, user and context, all
    /// named after the cluster; the CA inline).
    pub fn kubeconfig(&self) -> Kubeconfig {
        self.kubeconfig_with_token(&self.token())
    }

    /// A kubeconfig for this cluster authenticating with `token`.
    pub fn kubeconfig_with_token(&self, token: &str) -> Kubeconfig {
        use base64::Engine;
        let name = self.shared.cluster.clone();
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: name.clone(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    certificate_authority_data: Some(
                        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes()),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: name.clone(),
                auth_info: Some(AuthInfo { token: Some(token.to_string().into()), ..Default::default() }),
                ..Default::default()
            }],
            contexts: vec![NamedContext {
                name: name.clone(),
                context: Some(Context { cluster: name.clone(), user: Some(name.clone()), ..Default::default() }),
                ..Default::default()
            }],
            current_context: Some(name),
            kind: Some("Config".into()),
            api_version: Some("v1".into()),
            ..Default::default()
        }
    }

    /// Writes [`ApiServer::kubeconfig`] as YAML to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<std::path::Path>) -> Result<(), KubeconfigError> {
        let yaml = serde_saphyr::to_string(&self.kubeconfig()).map_err(|e| KubeconfigError::Render(e.to_string()))?;
        std::fs::write(path, yaml)?;
        Ok(())
    }

    /// A `kube::Client` for this cluster with the admin token (must be called inside a tokio runtime).
    pub fn client(&self) -> kube::Client {
        self.client_with_token(&self.token())
    }

    /// A `kube::Client` authenticating with `token`.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let config = self.client_config_with_token(token);
        // The only failure of try_from is a TLS configuration error, which a generated CA cannot cause.
        match kube::Client::try_from(config) {
            Ok(c) => c,
            Err(e) => unreachable!("client for a generated CA: {e}"),
        }
    }

    /// The `kube::Config` behind [`ApiServer::client`], to adjust before building a client (note
    /// that kube's `default_retry` retries 429/503/504 up to 15 times with exponential backoff).
    pub fn client_config(&self) -> kube::Config {
        self.client_config_with_token(&self.token())
    }

    fn client_config_with_token(&self, token: &str) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().unwrap_or_default());
        let ca = rustls::pki_types::pem::PemObject::from_pem_slice(self.ca_pem.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap_or_default();
        config.root_cert = Some(vec![ca]);
        config.auth_info.token = Some(token.to_string().into());
        config.default_namespace = "default".into();
        config.read_timeout = Some(Duration::from_secs(300));
        config
    }

    /// Fault injection for this cluster.
    pub fn faults(&self) -> Faults {
        Faults { state: self.shared.faults.clone() }
    }

    /// Request counters of this cluster.
    pub fn requests(&self) -> Requests {
        self.shared.requests.clone()
    }

    /// Every pod whose termination began on this cluster, how (eviction or DELETE), on which
    /// node, and under what PodDisruptionBudget state.
    pub fn disruptions(&self) -> DisruptionLog {
        lock(&self.shared.store).disruptions.clone()
    }

    /// The clock this cluster stamps objects with.
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// The current resourceVersion (the last write's).
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv
    }

    /// Number of stored objects of `(group, plural)` (e.g. `("", "pods")`).
    pub fn object_count(&self, group: &str, plural: &str) -> usize {
        let st = lock(&self.shared.store);
        // The storage key (events.k8s.io Events are stored as core/v1 Events).
        let key = st.registry.any_version(group, plural).map_or((group.to_string(), plural.to_string()), |r| r.key());
        st.count(&key)
    }

    /// Stops accepting requests, cuts open connections and waits for the listener to end.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}
