//! The management cluster's identity (hub.md §5): the UID of its `kube-system` namespace, read
//! once at start and written on every NodeGroup the hub makes, so that ownership is bound to the
//! management cluster and not only to a hub id two installs may share.
//!
//! Owns: reading the identity, retrying until it is known. Must not: let any controller start
//! before it is known (the caller awaits it), or guess one.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::infra::apierror::plain;

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
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build();
    loop {
        match read(mgmt).await {
            Ok(uid) => return Ok(uid),
            Err(e) => {
                let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "the management cluster's identity is not known yet; no controller starts before it is");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(IdentityError::Cancelled),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
