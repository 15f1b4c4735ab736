//! Reading the objects a reviewed object refers to: a NodePool's `CleverNodeClass`, a class's
//! `FlavorCatalog`, always in the reviewed object's namespace (there are no cross-namespace
//! references).
//!
//! [`ApiReferences`] reads them from the management cluster with a short timeout; [`NoReferences`]
//! reads nothing (every cross-object check becomes a warning); [`StaticReferences`] serves fixed
//! objects, for tests and benchmarks. A failed read is never a denial by itself: the validators
//! turn [`Lookup::Unchecked`] into a warning.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crds::admission::Lookup;
use crds::{CleverNodeClass, FlavorCatalog};
use kube::Api;
use serde::de::DeserializeOwned;

use crate::metrics::{LookupOutcome, Metrics};
use crate::review::Kind;

/// A lookup in progress.
pub type LookupFuture<'a, T> = Pin<Box<dyn Future<Output = Lookup<T>> + Send + 'a>>;

/// Reads referenced objects by namespace and name.
pub trait References: Send + Sync + fmt::Debug {
    /// The `CleverNodeClass` `name` in `namespace`.
    fn node_class<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, CleverNodeClass>;
    /// The `FlavorCatalog` `name` in `namespace`.
    fn flavor_catalog<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, FlavorCatalog>;
}

/// Reads nothing: every reference is unchecked (`--lookups=off`).
#[derive(Debug, Clone, Default)]
pub struct NoReferences;

/// Why [`NoReferences`] checked nothing, as the warnings say it.
pub const NO_LOOKUPS: &str = "the webhook runs without API lookups (--lookups=off)";

impl References for NoReferences {
    fn node_class<'a>(&'a self, _: &'a str, _: &'a str) -> LookupFuture<'a, CleverNodeClass> {
        Box::pin(std::future::ready(Lookup::Unchecked(NO_LOOKUPS.to_string())))
    }

    fn flavor_catalog<'a>(&'a self, _: &'a str, _: &'a str) -> LookupFuture<'a, FlavorCatalog> {
        Box::pin(std::future::ready(Lookup::Unchecked(NO_LOOKUPS.to_string())))
    }
}

/// Fixed objects by (namespace, name); anything else is missing, or unchecked when `failing` is set.
#[derive(Debug, Clone, Default)]
pub struct StaticReferences {
    node_classes: BTreeMap<(String, String), CleverNodeClass>,
    flavor_catalogs: BTreeMap<(String, String), FlavorCatalog>,
    failing: Option<String>,
}

impl StaticReferences {
    /// Serves `class` in its namespace (`default` when it has none).
    pub fn with_node_class(mut self, class: CleverNodeClass) -> Self {
        self.node_classes.insert(key(&class.metadata), class);
        self
    }

    /// Serves `catalog` in its namespace (`default` when it has none).
    pub fn with_flavor_catalog(mut self, catalog: FlavorCatalog) -> Self {
        self.flavor_catalogs.insert(key(&catalog.metadata), catalog);
        self
    }

    /// Every read fails with `why` (an unreachable API server).
    pub fn failing(why: &str) -> Self {
        StaticReferences { failing: Some(why.to_string()), ..Default::default() }
    }

    fn get<T: Clone>(&self, map: &BTreeMap<(String, String), T>, namespace: &str, name: &str) -> Lookup<T> {
        if let Some(why) = &self.failing {
            return Lookup::Unchecked(why.clone());
        }
        match map.get(&(namespace.to_string(), name.to_string())) {
            Some(found) => Lookup::Found(found.clone()),
            None => Lookup::Missing,
        }
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_else(|| "default".to_string()), meta.name.clone().unwrap_or_default())
}

impl References for StaticReferences {
    fn node_class<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, CleverNodeClass> {
        Box::pin(std::future::ready(self.get(&self.node_classes, namespace, name)))
    }

    fn flavor_catalog<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, FlavorCatalog> {
        Box::pin(std::future::ready(self.get(&self.flavor_catalogs, namespace, name)))
    }
}

/// Reads from the management cluster: one GET per reference, bounded by `timeout`, so a slow API
/// server makes a warning rather than a webhook timeout (which the failure policy would turn into a
/// refusal of every write).
#[derive(Clone)]
pub struct ApiReferences {
    client: kube::Client,
    timeout: Duration,
}

impl fmt::Debug for ApiReferences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiReferences").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl ApiReferences {
    /// Reads through `client`, each GET bounded by `timeout`.
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        ApiReferences { client, timeout }
    }

    async fn get<K>(&self, namespace: &str, name: &str) -> Lookup<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone
            + fmt::Debug,
    {
        let kind = K::kind(&());
        if namespace.is_empty() {
            return Lookup::Unchecked(format!("the request names no namespace to read {kind} {name} in"));
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(self.timeout, api.get_opt(name)).await {
            Ok(Ok(Some(found))) => Lookup::Found(found),
            Ok(Ok(None)) => Lookup::Missing,
            Ok(Err(error)) => {
                tracing::warn!(%kind, namespace, name, %error, "reading a referenced object failed");
                let hint = match &error {
                    kube::Error::Api(status) if status.code == 403 => {
                        " (the webhook's ServiceAccount needs get on it: see config/webhook/rbac.yaml)"
                    }
                    _ => "",
                };
                Lookup::Unchecked(format!("reading {kind} {namespace}/{name} failed: {error}{hint}"))
            }
            Err(_) => {
                tracing::warn!(%kind, namespace, name, timeout = ?self.timeout, "reading a referenced object timed out");
                Lookup::Unchecked(format!("reading {kind} {namespace}/{name} timed out after {:?}", self.timeout))
            }
        }
    }
}

impl References for ApiReferences {
    fn node_class<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, CleverNodeClass> {
        Box::pin(self.get(namespace, name))
    }

    fn flavor_catalog<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, FlavorCatalog> {
        Box::pin(self.get(namespace, name))
    }
}

/// Counts every lookup of `inner` by kind and outcome (`karpenter_hub_webhook_lookups_total`): a
/// rising `unchecked` count means cross-object checks are only warnings (RBAC, API server, timeout).
#[derive(Debug)]
pub struct Metered {
    inner: Arc<dyn References>,
    metrics: Arc<Metrics>,
}

impl Metered {
    /// Counts the lookups of `inner` into `metrics`.
    pub fn new(inner: Arc<dyn References>, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    fn count<T>(&self, kind: Kind, lookup: &Lookup<T>) {
        let outcome = match lookup {
            Lookup::Found(_) => LookupOutcome::Found,
            Lookup::Missing => LookupOutcome::Missing,
            Lookup::Unchecked(_) => LookupOutcome::Unchecked,
        };
        self.metrics.lookup(kind, outcome);
    }
}

impl References for Metered {
    fn node_class<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, CleverNodeClass> {
        Box::pin(async move {
            let lookup = self.inner.node_class(namespace, name).await;
            self.count(Kind::CleverNodeClass, &lookup);
            lookup
        })
    }

    fn flavor_catalog<'a>(&'a self, namespace: &'a str, name: &'a str) -> LookupFuture<'a, FlavorCatalog> {
        Box::pin(async move {
            let lookup = self.inner.flavor_catalog(namespace, name).await;
            self.count(Kind::FlavorCatalog, &lookup);
            lookup
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crds::{CleverNodeClassSpec, FlavorCatalogSpec};

    #[tokio::test]
    async fn static_references_serve_by_namespace_and_name() {
        let mut class = CleverNodeClass::new("default", CleverNodeClassSpec::default());
        class.metadata.namespace = Some("team-a".into());
        let catalog = FlavorCatalog::new("c", FlavorCatalogSpec { flavors: vec![] });
        let refs = StaticReferences::default().with_node_class(class).with_flavor_catalog(catalog);
        let found = refs.node_class("team-a", "default").await;
        assert!(matches!(&found, Lookup::Found(c) if c.metadata.name.as_deref() == Some("default")), "{found:?}");
        assert!(matches!(refs.node_class("team-b", "default").await, Lookup::Missing));
        assert!(matches!(refs.flavor_catalog("default", "c").await, Lookup::Found(_)));
        let failing = StaticReferences::failing("down");
        assert!(matches!(failing.node_class("team-a", "default").await, Lookup::Unchecked(why) if why == "down"));
        assert!(matches!(NoReferences.flavor_catalog("a", "b").await, Lookup::Unchecked(_)));
    }
}
