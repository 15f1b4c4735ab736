//! Metrics and health endpoints of `karpenter-hub run`: `/metrics` (Prometheus text, Karpenter's
//! names where one exists, ours under `karpenter_hub_`, each with a `cluster` label), `/healthz` and
//! `/readyz`.
//!
//! Owns: the metric families and the HTTP server. Must not: put anything secret in a label (the
//! cluster label is `<namespace>/<name>`, never a server URL or a token).

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry as PromRegistry,
};
use tokio_util::sync::CancellationToken;

use crate::registry::{Phase, Registry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub cluster: String,
    pub phase: String,
}

/// Every metric of the process.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<PromRegistry>,
    /// 1 while the cluster is connected and synced.
    pub cluster_connected: Family<ClusterLabels, Gauge>,
    /// 1 for the cluster's current connection phase, 0 for the others.
    pub cluster_phase: Family<PhaseLabels, Gauge>,
    /// Connection state changes seen (reconnects, rotations, failures).
    pub cluster_transitions: Family<ClusterLabels, Counter>,
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = PromRegistry::default();
        let cluster_connected = Family::<ClusterLabels, Gauge>::default();
        let cluster_phase = Family::<PhaseLabels, Gauge>::default();
        let cluster_transitions = Family::<ClusterLabels, Counter>::default();
        registry.register(
            "karpenter_hub_cluster_connected",
            "Whether the workload cluster is connected and its watches synced",
            cluster_connected.clone(),
        );
        registry.register(
            "karpenter_hub_cluster_phase",
            "Connection phase of the workload cluster (1 for the current one)",
            cluster_phase.clone(),
        );
        registry.register(
            "karpenter_hub_cluster_transitions",
            "Connection state changes of the workload cluster",
            cluster_transitions.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            cluster_connected,
            cluster_phase,
            cluster_transitions,
            ready: AtomicBool::new(false),
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }

    /// Mirror the registry's cluster states into the gauges until `shutdown`.
    pub async fn follow(self: Arc<Self>, registry: Registry, shutdown: CancellationToken) {
        const PHASES: [Phase; 7] = [
            Phase::SecretMissing,
            Phase::InvalidKubeconfig,
            Phase::Unauthorized,
            Phase::Unreachable,
            Phase::NodeGroupApiNotServed,
            Phase::Syncing,
            Phase::Connected,
        ];
        let mut changes = registry.changes();
        let mut last: std::collections::BTreeMap<String, Phase> = Default::default();
        loop {
            let clusters = registry.clusters();
            let names: std::collections::BTreeSet<String> = clusters.iter().map(ToString::to_string).collect();
            // A removed cluster's series disappear with it (hub.md §3 "Removal").
            for gone in last.keys().filter(|k| !names.contains(*k)).cloned().collect::<Vec<_>>() {
                last.remove(&gone);
                self.cluster_connected.remove(&ClusterLabels { cluster: gone.clone() });
                self.cluster_transitions.remove(&ClusterLabels { cluster: gone.clone() });
                for p in PHASES {
                    self.cluster_phase.remove(&PhaseLabels { cluster: gone.clone(), phase: p.reason().to_string() });
                }
            }
            for key in clusters {
                let name = key.to_string();
                let status = registry.status(&key);
                let synced = registry.connection(&key).is_some_and(|c| c.is_synced());
                let labels = ClusterLabels { cluster: name.clone() };
                self.cluster_connected
                    .get_or_create(&labels)
                    .set(i64::from(status.phase == Phase::Connected && synced));
                for p in PHASES {
                    self.cluster_phase
                        .get_or_create(&PhaseLabels { cluster: name.clone(), phase: p.reason().to_string() })
                        .set(i64::from(p == status.phase));
                }
                if last.insert(name, status.phase) != Some(status.phase) {
                    self.cluster_transitions.get_or_create(&labels).inc();
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`.
pub async fn serve(metrics: Arc<Metrics>, addr: SocketAddr, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], m.render())
}

async fn ready_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_cluster_labels() {
        let m = Metrics::new();
        m.cluster_connected.get_or_create(&ClusterLabels { cluster: "team-a/prod".into() }).set(1);
        let text = m.render();
        assert!(text.contains("karpenter_hub_cluster_connected{cluster=\"team-a/prod\"} 1"), "{text}");
    }
}
