//! The management cluster's identity (hub.md §5): the UID of its `kube-system` namespace, read
//! once at start and written on every NodeGroup the hub makes, so that ownership is bound to the
//! management cluster and not only to a hub id two installs may share. And, when `--hub-id` is not
//! given, the facts from which [`crate::decisions::hub_id`] chooses the hub id (hub.md, "The hub id").
//!
//! Owns: reading the identity and those facts, retrying until they are known. Must not: let any
//! controller start, or a Lease be campaigned for, before they are known (the caller awaits
//! them), or guess either.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use crds::{NodeClaim, labels};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Namespace};
use kube::{Api, Client, ResourceExt, api::ListParams};
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::hub_id::{self, Facts},
    infra::apierror::plain,
};

/// Longest wait between two attempts.
const MAX_DELAY: Duration = Duration::from_secs(30);

fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(MAX_DELAY)
        .without_max_times()
        .build()
}

/// Why the management cluster's identity is not known.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read namespace kube-system of the management cluster: {}; the hub needs `get` on it to tell its NodeGroups from another management cluster's", plain(.0))]
    Read(#[source] kube::Error),
    #[error("namespace kube-system of the management cluster has no UID")]
    NoUid,
    #[error("stopped before the management cluster's identity was read")]
    Cancelled,
}

/// The management cluster's identity, once.
pub async fn read(mgmt: &Client) -> Result<String, IdentityError> {
    let ns = Api::<Namespace>::all(mgmt.clone()).get("kube-system").await.map_err(IdentityError::Read)?;
    ns.metadata.uid.filter(|u| !u.is_empty()).ok_or(IdentityError::NoUid)
}

/// The management cluster's identity, retried with back-off (a management API briefly away at
/// start must not stop the hub) until it is read or `shutdown` fires.
pub async fn wait(mgmt: &Client, shutdown: &CancellationToken) -> Result<String, IdentityError> {
    let mut backoff = backoff();
    loop {
        match read(mgmt).await {
            Ok(uid) => return Ok(uid),
            Err(e) => {
                let delay = backoff.next().unwrap_or(MAX_DELAY);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "the management cluster's identity is not known yet; no controller starts before it is");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(IdentityError::Cancelled),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Where the facts of the hub id rule are read ([`crate::decisions::hub_id`]).
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The leader election namespace; `None` without leader election (no Lease was ever taken
    /// then, and the hub is given no right on Leases).
    pub lease_namespace: Option<&'a str>,
    /// The namespaces whose NodeClaims the hub serves; empty: every namespace.
    pub claim_namespaces: &'a [String],
}

/// Why the facts of the hub id rule are not known.
#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("cannot read the Leases of namespace {namespace} of the management cluster: {}; without --hub-id the hub looks there for an install that ran under hub id `default`, and needs `get` and `list` on leases there (or give --hub-id)", plain(.source))]
    Leases {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot list the NodeClaims of {scope} in the management cluster: {}; without --hub-id the hub looks for NodeClaims launched under hub id `default` (are the karpenter-hub CRDs installed? or give --hub-id)", plain(.source))]
    Claims {
        scope: String,
        #[source]
        source: kube::Error,
    },
    #[error("stopped before the hub id was chosen")]
    Cancelled,
}

/// NodeClaims read per page: the search stops at the first claim launched under `default`, and
/// never holds more than a page.
const CLAIMS_PAGE: u32 = 500;

/// The facts of the hub id rule, once.
pub async fn hub_id_facts(mgmt: &Client, place: Place<'_>) -> Result<Facts, FactsError> {
    let mut facts = Facts::default();
    if let Some(ns) = place.lease_namespace {
        let leases = Api::<Lease>::namespaced(mgmt.clone(), ns);
        let failed = |source| FactsError::Leases { namespace: ns.to_string(), source };
        if leases.get_opt(&hub_id::leader_lease_name(hub_id::DEFAULT)).await.map_err(failed)?.is_some() {
            facts.leader_lease = Some(ns.to_string());
        }
        let labelled = ListParams::default().labels(&format!("{}={}", labels::HUB, hub_id::DEFAULT)).limit(1);
        facts.labelled_lease = leases.list(&labelled).await.map_err(failed)?.items.first().map(ResourceExt::name_any);
    }
    let apis: Vec<(String, Api<NodeClaim>)> = if place.claim_namespaces.is_empty() {
        vec![("every namespace".to_string(), Api::all(mgmt.clone()))]
    } else {
        place.claim_namespaces.iter().map(|ns| (format!("namespace {ns}"), Api::namespaced(mgmt.clone(), ns))).collect()
    };
    for (scope, api) in apis {
        let mut params = ListParams::default().limit(CLAIMS_PAGE);
        loop {
            let page = api.list(&params).await.map_err(|source| FactsError::Claims { scope: scope.clone(), source })?;
            facts.claim = page.items.iter().find_map(|c| {
                let (ns, name) = (c.namespace()?, c.name_any());
                let provider = c.status.as_ref().and_then(|s| s.provider_id.as_deref());
                hub_id::launched_under_default(&ns, &name, provider).then(|| format!("{ns}/{name}"))
            });
            match page.metadata.continue_ {
                Some(token) if facts.claim.is_none() && !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        if facts.claim.is_some() {
            break;
        }
    }
    Ok(facts)
}

/// The facts of the hub id rule, retried with back-off (a management API briefly away, or a
/// right still being granted, must not stop the hub, nor make it guess) until read or `shutdown`.
pub async fn wait_hub_id_facts(
    mgmt: &Client,
    place: Place<'_>,
    shutdown: &CancellationToken,
) -> Result<Facts, FactsError> {
    let mut backoff = backoff();
    loop {
        match hub_id_facts(mgmt, place).await {
            Ok(facts) => return Ok(facts),
            Err(e) => {
                let delay = backoff.next().unwrap_or(MAX_DELAY);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "the hub id is not chosen yet; nothing starts before it is");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(FactsError::Cancelled),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
