//! Cluster API's `Cluster` objects in the management cluster, read for their pause and their labels
//! only: a `Cluster` named like a registered cluster, in the same namespace, with `spec.paused:
//! true` or the annotation `cluster.x-k8s.io/paused` pauses it (hub.md, "Cluster API pause"), and
//! its labels are the cluster's, under those of its registration Secret (fleet.md §1).
//!
//! Owns: finding whether the management API serves `clusters.cluster.x-k8s.io` (v1beta2 preferred,
//! else v1beta1; looked for again every `recheck` while it is not), and one read-only watch per
//! namespace scope of the registry, turned into [`Registry::set_pause`] and
//! [`Registry::set_labels`] calls. Without Cluster API, or when RBAC refuses the watch (one
//! warning), no cluster is paused by a `Cluster` or labelled by one.
//! Must not: write anything, keep the objects (only each one's pause and labels are kept, by the
//! registry), or put their text anywhere else (the pause is decided by [`crate::decisions::pause`]).

use std::{collections::HashMap, time::Duration};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    discovery,
    runtime::{WatchStreamExt, watcher},
};
use tokio_util::sync::CancellationToken;

use super::{ClusterKey, Registry};
use crate::decisions::pause;

/// Cluster API's group.
pub const GROUP: &str = "cluster.x-k8s.io";
/// Versions of `Cluster` the hub reads, preferred first.
pub const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// The served `Cluster` resource, if any.
async fn served(mgmt: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = match discovery::group(mgmt, GROUP).await {
        Ok(g) => g,
        Err(kube::Error::Discovery(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(VERSIONS.iter().find_map(|v| {
        group
            .versioned_resources(v)
            .into_iter()
            .map(|(ar, _)| ar)
            .find(|ar| ar.kind == "Cluster" && ar.plural == "clusters")
    }))
}

/// How a watch ended.
enum Ended {
    Shutdown,
    /// The resource is no longer served (404): look it up again.
    Gone,
}

/// Follow Cluster API's Clusters in `scopes` (namespaces; `None`: all) until `shutdown`.
pub(super) async fn run(
    registry: Registry,
    mgmt: Client,
    scopes: Vec<Option<String>>,
    recheck: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match served(&mgmt).await {
            Ok(Some(ar)) => {
                tracing::info!(group = GROUP, version = %ar.version, "Cluster API is served: watching Clusters for their pause and labels");
                if let Ended::Shutdown = watch(&registry, &mgmt, &ar, &scopes, &shutdown).await {
                    return;
                }
                tracing::info!(
                    group = GROUP,
                    "Cluster API's Clusters are no longer served; no cluster is paused or labelled by one"
                );
            }
            Ok(None) => {
                registry.settle_labels();
                tracing::debug!(group = GROUP, "Cluster API is not served; looking again later")
            }
            Err(e) => {
                tracing::warn!(group = GROUP, error = %crate::infra::apierror::plain(&e), "looking for Cluster API failed; looking again later")
            }
        }
        clear(&registry, |_| true);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(recheck) => {}
        }
    }
}

/// The HTTP status of a watch failure, when the server answered one.
fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// Forget what the `Cluster`s of the clusters `which` selects said (pause and labels).
fn clear(registry: &Registry, which: impl Fn(&ClusterKey) -> bool) {
    for key in registry.paused_by_cluster().into_iter().filter(|k| which(k)) {
        registry.set_pause(&key, |p| p.cluster = None);
    }
    for key in registry.labelled_by_cluster().into_iter().filter(|k| which(k)) {
        registry.set_labels(&key, |l| l.cluster = None);
    }
}

fn key_of(c: &DynamicObject) -> Option<ClusterKey> {
    Some(ClusterKey::new(c.metadata.namespace.clone()?, c.metadata.name.clone()?))
}

/// Record one Cluster's pause and labels; its key.
fn record(registry: &Registry, c: &DynamicObject) -> Option<ClusterKey> {
    let key = key_of(c)?;
    // Only what the pure reading looks at, not a copy of the whole object (its size is the
    // tenant's choice).
    let seen = serde_json::json!({
        "metadata": {"annotations": c.metadata.annotations.as_ref().map(|a| {
            a.keys().filter(|k| *k == pause::PAUSED_ANNOTATION).map(|k| (k.clone(), serde_json::Value::Null)).collect::<serde_json::Map<_, _>>()
        })},
        "spec": {"paused": c.data.pointer("/spec/paused").cloned()},
    });
    let by = pause::cluster_pauses(&seen);
    registry.set_pause(&key, |p| p.cluster = by);
    // Label keys and values are what the API server validated (a qualified name, 63 characters of
    // a restricted alphabet): safe to keep and to log.
    registry.set_labels(&key, |l| l.cluster = Some(c.metadata.labels.clone().unwrap_or_default()));
    Some(key)
}

async fn watch(
    registry: &Registry,
    mgmt: &Client,
    ar: &ApiResource,
    scopes: &[Option<String>],
    shutdown: &CancellationToken,
) -> Ended {
    let mut events = futures::stream::select_all(scopes.iter().cloned().map(|scope| {
        let api: Api<DynamicObject> = match &scope {
            Some(ns) => Api::namespaced_with(mgmt.clone(), ns, ar),
            None => Api::all_with(mgmt.clone(), ar),
        };
        watcher(api, watcher::Config::default()).default_backoff().map(move |e| (scope.clone(), e)).boxed()
    }));
    let in_scope = |scope: &Option<String>, key: &ClusterKey| scope.as_ref().is_none_or(|ns| *ns == key.namespace);
    let mut listed: HashMap<Option<String>, Vec<ClusterKey>> = HashMap::new();
    // Scopes read once (listed, or refused): once all are, the cluster labels are settled.
    let mut read_once: std::collections::HashSet<Option<String>> = std::collections::HashSet::new();
    let mut settle = |scope: &Option<String>| {
        read_once.insert(scope.clone());
        if read_once.len() == scopes.len() {
            registry.settle_labels();
        }
    };
    let mut warned_forbidden = false;
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return Ended::Shutdown,
            e = events.next() => e,
        };
        let Some((scope, event)) = event else { return Ended::Shutdown };
        match event {
            Err(e) => match status_code(&e) {
                Some(404) => return Ended::Gone,
                Some(403) => {
                    // Not allowed to read Clusters: they pause nothing (the watch keeps retrying,
                    // with back-off, in case the rights are granted later).
                    if !warned_forbidden {
                        warned_forbidden = true;
                        tracing::warn!(namespace = scope.as_deref().unwrap_or("(all)"), error = %crate::infra::apierror::plain_watch(&e), "not allowed to watch Cluster API's Clusters: their pause is not honoured and their labels are not read (grant get, list and watch on clusters.cluster.x-k8s.io)");
                    }
                    clear(registry, |k| in_scope(&scope, k));
                    settle(&scope);
                }
                _ => {
                    tracing::warn!(namespace = scope.as_deref().unwrap_or("(all)"), error = %crate::infra::apierror::plain_watch(&e), "Cluster API Cluster watch failed; retrying")
                }
            },
            Ok(watcher::Event::Init) => {
                listed.insert(scope, Vec::new());
            }
            Ok(watcher::Event::InitApply(c)) => {
                if let Some(key) = record(registry, &c)
                    && let Some(l) = listed.get_mut(&scope)
                {
                    l.push(key);
                }
            }
            Ok(watcher::Event::InitDone) => {
                // A relist: Clusters gone while the watch was down pause nothing any more.
                if let Some(seen) = listed.remove(&scope) {
                    clear(registry, |k| in_scope(&scope, k) && !seen.contains(k));
                }
                settle(&scope);
            }
            Ok(watcher::Event::Apply(c)) => {
                record(registry, &c);
            }
            Ok(watcher::Event::Delete(c)) => {
                if let Some(key) = key_of(&c) {
                    registry.set_pause(&key, |p| p.cluster = None);
                    registry.set_labels(&key, |l| l.cluster = None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::PostParams;
    use sim::apiserver::{ApiServer, ApiServerConfig};

    fn crd(versions: &[(&str, bool)]) -> CustomResourceDefinition {
        let versions: Vec<serde_json::Value> = versions
            .iter()
            .map(|(name, storage)| {
                serde_json::json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "clusters.cluster.x-k8s.io"},
            "spec": {
                "group": GROUP,
                "names": {"kind": "Cluster", "plural": "clusters", "singular": "cluster", "listKind": "ClusterList"},
                "scope": "Namespaced",
                "versions": versions,
            }
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn cluster_api_is_found_when_served_preferring_v1beta2() {
        let mgmt = ApiServer::start(ApiServerConfig::new("management")).await.unwrap();
        assert_eq!(served(&mgmt.client()).await.unwrap(), None, "no Cluster API, nothing served");
        let crds: Api<CustomResourceDefinition> = Api::all(mgmt.client());
        crds.create(&PostParams::default(), &crd(&[("v1beta1", true)])).await.unwrap();
        assert_eq!(served(&mgmt.client()).await.unwrap().map(|ar| ar.version), Some("v1beta1".to_string()));

        let both = ApiServer::start(ApiServerConfig::new("management")).await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(both.client());
        crds.create(&PostParams::default(), &crd(&[("v1beta1", false), ("v1beta2", true)])).await.unwrap();
        assert_eq!(served(&both.client()).await.unwrap().map(|ar| ar.version), Some("v1beta2".to_string()));
    }

    /// RBAC refuses the list of Clusters (403): no cluster is paused by its Cluster, and the watch
    /// keeps trying, so the pause is honoured once the right is granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_cluster_watch_pauses_nothing_and_recovers_when_allowed() {
        use sim::apiserver::ErrorFault;
        let mgmt = ApiServer::start(ApiServerConfig::new("management")).await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(mgmt.client());
        crds.create(&PostParams::default(), &crd(&[("v1beta1", true)])).await.unwrap();
        let ar = served(&mgmt.client()).await.unwrap().unwrap();
        let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "alpha", "namespace": "default"}, "spec": {"paused": true}
        }))
        .unwrap();
        Api::<DynamicObject>::namespaced_with(mgmt.client(), "default", &ar)
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
        let refused = ErrorFault { rate: 1.0, status: 403, verbs: Vec::new(), resources: vec!["clusters".into()] };
        mgmt.faults().set_error(refused);
        let registry = Registry::new(super::super::Settings::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(run(registry.clone(), mgmt.client(), vec![None], Duration::from_secs(300), shutdown.clone()));
        let key = ClusterKey::new("default", "alpha");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        // Refused twice (the watch retried): still not paused.
        while mgmt.faults().injected_errors() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "the Cluster watch was not retried");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(registry.paused_by(&key), None);
        mgmt.faults().clear_errors();
        while registry.paused_by(&key) != Some(pause::PausedBy::ClusterSpec) {
            assert!(tokio::time::Instant::now() < deadline, "the pause was not honoured once allowed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        shutdown.cancel();
    }
}
