//! The `WorkloadCluster` report of each cluster this replica serves (fleet.md §6): what
//! `karpenter-hub fleet` and `kubectl get workloadclusters` show without reaching the cluster.
//!
//! Owns: gathering each served cluster's facts (connection phase, node and pending-pod counts from
//! its caches, the hub's claims and their catalogue price from the management cache), and writing
//! the report when [`cluster_report::due`] says so. Must not: write a cluster it does not serve
//! (sharded mode: its owner writes it), nor put anything the cluster's server sent in the report
//! (the registry's message is in the hub's words). The report goes with its registration Secret
//! (owner reference: the management cluster's garbage collector removes it); nothing here deletes.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use crds::{NodeClaim, WorkloadCluster, WorkloadClusterStatus};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::{
        cluster_report::{self, Seen},
        pool_status::price_per_hour,
    },
    infra::{
        errors::{self, ApiError, Category, Reconciler, Step, StepExt},
        hub::{Hub, MANAGER},
        registry::{ClusterKey, Phase},
    },
};

/// How often the served clusters are looked at when nothing in the registry changed (a look is in
/// memory; only a changed report is written).
pub const PERIOD: Duration = Duration::from_secs(5);

/// After a failed write, the cluster's report is not tried again for this long (a refusal by RBAC
/// would otherwise cost a request per cluster per pass).
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Without the WorkloadCluster CRD, no report is tried for this long.
pub const CRD_MISSING_PAUSE: Duration = Duration::from_secs(300);

/// Write the reports of the clusters this replica serves until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut written: BTreeMap<ClusterKey, WorkloadClusterStatus> = BTreeMap::new();
    let mut retry_at: BTreeMap<ClusterKey, tokio::time::Instant> = BTreeMap::new();
    let mut paused_until: Option<tokio::time::Instant> = None;
    let mut changes = hub.registry.changes();
    let mut crd_missing_told = false;
    loop {
        let now = tokio::time::Instant::now();
        if hub.cache.is_ready() && paused_until.is_none_or(|t| now >= t) {
            let served: BTreeSet<ClusterKey> = hub.registry.clusters().into_iter().collect();
            // A cluster served again later (sharded hand-over) is written afresh: another replica
            // may have written it meanwhile.
            written.retain(|k, _| served.contains(k));
            // One scan of the claims per pass, whatever the number of clusters.
            let mut claims: BTreeMap<ClusterKey, Vec<Arc<NodeClaim>>> = BTreeMap::new();
            for c in hub.cache.claims.state() {
                let key =
                    ClusterKey::new(c.metadata.namespace.clone().unwrap_or_default(), c.spec.cluster_name.clone());
                if served.contains(&key) {
                    claims.entry(key).or_default().push(c);
                }
            }
            retry_at.retain(|k, t| served.contains(k) && now < *t);
            let due: Vec<&ClusterKey> =
                served.iter().filter(|k| hub.registry.writes_for(k) && !retry_at.contains_key(*k)).collect();
            for key in due {
                let report = gather(&hub, key, claims.get(key).map(Vec::as_slice).unwrap_or_default());
                if !cluster_report::due(written.get(key), &report) {
                    continue;
                }
                match write(&hub, key, &report).await {
                    Ok(()) => {
                        written.insert(key.clone(), report);
                    }
                    Err(e) if e.category == Category::KubernetesNotFound && e.step == Step::WriteWorkloadCluster => {
                        if !crd_missing_told {
                            tracing::warn!(error = %e, "cannot write WorkloadCluster reports: is the CRD installed? (upgrade the karpenter-hub-crds chart, or `karpenter-hub crds | kubectl apply --server-side -f -`); retrying every 5 minutes");
                            crd_missing_told = true;
                        }
                        paused_until = Some(now + CRD_MISSING_PAUSE);
                        break;
                    }
                    Err(e) => {
                        errors::count(&hub, Reconciler::ClusterReport, Some(key), &e);
                        tracing::warn!(cluster = %key, step = e.step.label(), category = e.category.as_str(), error = %e, "writing the cluster's WorkloadCluster report failed; retrying in a minute");
                        retry_at.insert(key.clone(), now + RETRY_AFTER);
                    }
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PERIOD) => {}
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

/// The report of `key` from the registry, its caches and its `claims`.
fn gather(hub: &Hub, key: &ClusterKey, claims: &[Arc<NodeClaim>]) -> WorkloadClusterStatus {
    let status = hub.registry.status(key);
    let connection = hub.registry.connection(key).filter(|c| c.is_synced());
    let synced = connection.map(|c| (c.cache.nodes.len(), c.pending.len()));
    let message = if status.phase == Phase::Connected { "" } else { status.message.as_str() };
    let seen = Seen {
        phase: status.phase.reason(),
        message,
        synced,
        eur_per_hour: price(hub, &key.namespace, claims),
        replica: &hub.settings.replica,
    };
    cluster_report::report(&seen, cluster_report::claim_counts(claims.iter().map(AsRef::as_ref)), hub.now())
}

/// Σ price of `claims`, each priced by its own node class's catalogue (the built-in one when the
/// class is gone) with the namespace's NodeOverlays for its pool, as its pool's cost is.
fn price(hub: &Hub, namespace: &str, claims: &[Arc<NodeClaim>]) -> f64 {
    let mut by_class_and_pool: BTreeMap<(&str, &str), Vec<&NodeClaim>> = BTreeMap::new();
    for c in claims {
        let pool = c.metadata.labels.as_ref().and_then(|l| l.get(crds::labels::NODEPOOL)).map_or("", String::as_str);
        by_class_and_pool.entry((c.spec.node_class_ref.name.as_str(), pool)).or_default().push(c);
    }
    by_class_and_pool
        .into_iter()
        .map(|((class, pool), claims)| {
            let class = hub.cache.classes.get(&kube::runtime::reflector::ObjectRef::new(class).within(namespace));
            let mut types = hub.cached_instance_types(namespace, class.as_deref());
            hub.overlaid(namespace, pool, &mut types);
            price_per_hour(claims, &types).eur_per_hour
        })
        .sum()
}

/// Create or update `key`'s report: the object (owned by the registration Secret) on the first write
/// or when it is gone, then its status.
async fn write(hub: &Hub, key: &ClusterKey, report: &WorkloadClusterStatus) -> Result<(), ApiError> {
    let api = Api::<WorkloadCluster>::namespaced(hub.mgmt.clone(), &key.namespace);
    let status = json!({
        "apiVersion": WorkloadCluster::api_version(&()), "kind": WorkloadCluster::kind(&()),
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": report,
    });
    let params = PatchParams::apply(MANAGER).force();
    match api.patch_status(&key.name, &params, &Patch::Apply(&status)).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Step::WriteWorkloadClusterStatus.failed(e)),
    }
    // Owned by the registration Secret, so that it goes when the cluster is unregistered, whoever
    // runs then.
    let secret = Api::<Secret>::namespaced(hub.mgmt.clone(), &key.namespace)
        .get_metadata(&key.secret_name())
        .await
        .step(Step::ReadRegistrationSecret)?;
    let object = json!({
        "apiVersion": WorkloadCluster::api_version(&()), "kind": WorkloadCluster::kind(&()),
        "metadata": {
            "name": key.name, "namespace": key.namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGER},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Secret", "name": key.secret_name(),
                "uid": secret.metadata.uid.unwrap_or_default(),
            }],
        },
        "spec": {},
    });
    api.patch(&key.name, &params, &Patch::Apply(&object)).await.step(Step::WriteWorkloadCluster)?;
    api.patch_status(&key.name, &params, &Patch::Apply(&status)).await.step(Step::WriteWorkloadClusterStatus)?;
    tracing::info!(cluster = %key, "created the cluster's WorkloadCluster report");
    Ok(())
}
