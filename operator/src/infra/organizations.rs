//! The organisations a cluster belongs to, and their ledger (fleet.md §4), as the controllers use
//! them: provisioning reads the headroom from the cache, a launch reserves and releases live under
//! optimistic concurrency, the ledger writer records counts. The rules are
//! [`crate::decisions::organization`]'s.
//!
//! Owns: finding a cluster's organisations (cluster labels, namespace labels), the sizes of the
//! flavors the hub knows, and the conditional writes of an organisation's status (each carries the
//! resourceVersion it read: a conflict is judged again on the newer object, never overwritten).
//! Must not: decide whether a launch fits, or write anything but an organisation's status.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt, api::PostParams};

use crate::{
    decisions::organization::{self, Ceiling, ClusterId, Launch, Short, Sizer, Want},
    infra::{
        errors::{ApiError, Step, StepExt},
        hub::Hub,
        registry::ClusterKey,
    },
};
use crds::{CleverOrganization, FlavorCatalog, organization::CleverOrganizationStatus};

/// How many times a ledger write judges again after losing a race, before it gives up (the
/// launch is retried; nothing was reserved).
const ATTEMPTS: usize = 8;

/// The cluster's id in the ledger.
pub fn id(key: &ClusterKey) -> ClusterId<'_> {
    ClusterId { namespace: &key.namespace, name: &key.name }
}

/// Whether organisation `org` selects cluster `key` (reading the namespace's labels only when it
/// selects namespaces by label).
pub async fn selects(hub: &Hub, key: &ClusterKey, org: &CleverOrganization) -> Result<bool, ApiError> {
    let ns_labels = if organization::needs_namespace_labels(org) {
        hub.namespace_labels(&key.namespace).await.step(Step::ReadNamespace)?
    } else {
        Default::default()
    };
    Ok(organization::selects(org, &ns_labels, &hub.registry.labels(key)))
}

/// The organisations of `orgs` that select cluster `key`.
pub async fn selecting(
    hub: &Hub,
    key: &ClusterKey,
    orgs: Vec<Arc<CleverOrganization>>,
) -> Result<Vec<Arc<CleverOrganization>>, ApiError> {
    let mut out = Vec::with_capacity(orgs.len());
    for org in orgs {
        if selects(hub, key, &org).await? {
            out.push(org);
        }
    }
    Ok(out)
}

/// The cluster's organisations as the cache shows them (rounds plan with these).
pub async fn cached(hub: &Hub, key: &ClusterKey) -> Result<Vec<Arc<CleverOrganization>>, ApiError> {
    selecting(hub, key, hub.cache.organizations.state()).await
}

/// The room each organisation of the cluster leaves it for planning (the cache; a launch reserves
/// live): name and room, only organisations that limit something. Provisioning rounds and the
/// disruption loop's replacements plan with these.
pub async fn rooms(hub: &Hub, key: &ClusterKey, now: Timestamp) -> Result<Vec<(String, Ceiling)>, ApiError> {
    Ok(cached(hub, key)
        .await?
        .iter()
        .map(|o| (o.name_any(), organization::headroom_for(o, id(key), now)))
        .filter(|(_, left)| left.is_limited())
        .collect())
}

/// The cluster's organisations read live (a launch acts on these). Without the CRD or the right
/// to read it there are none (the hub warns once through the ledger writer).
pub async fn live(hub: &Hub, key: &ClusterKey) -> Result<Vec<Arc<CleverOrganization>>, ApiError> {
    let api: Api<CleverOrganization> = Api::all(hub.mgmt.clone());
    let all = match api.list(&Default::default()).await {
        Ok(list) => list.items.into_iter().map(Arc::new).collect(),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Vec::new(),
        Err(e) => return Err(Step::ReadOrganization.failed(e)),
    };
    selecting(hub, key, all).await
}

/// Every flavor the hub knows, sized: the built-in ones, then the cached catalogues' own.
pub fn sizer(hub: &Hub) -> Sizer {
    let catalogs: Vec<Arc<FlavorCatalog>> = hub.cache.catalogs.state();
    Sizer::of_catalogs(catalogs.iter().map(AsRef::as_ref))
}

/// How a conditional write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored.
    Stored,
    /// Someone wrote since it was read: read it again and judge again.
    Conflict,
    /// The organisation is gone.
    Gone,
}

/// Writes `status` on `org` if nobody wrote since it was read.
pub async fn write(hub: &Hub, org: &CleverOrganization, status: CleverOrganizationStatus) -> Result<Written, ApiError> {
    let api: Api<CleverOrganization> = Api::all(hub.mgmt.clone());
    let mut obj = org.clone();
    obj.metadata.managed_fields = None;
    obj.status = Some(status);
    match api.replace_status(&org.name_any(), &PostParams::default(), &obj).await {
        Ok(_) => Ok(Written::Stored),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Written::Gone),
        Err(e) => Err(Step::WriteOrganizationStatus.failed(e)),
    }
}

/// Writes the status `change` makes of `current` (at the hub's now) under the resourceVersion read;
/// on a conflict, reads the organisation again and applies `change` again, at most `attempts`
/// times. `Stored` when the ledger holds the change (written, or nothing to write), `Gone`, or
/// `Conflict` when every attempt lost the race.
pub async fn update(
    hub: &Hub,
    mut current: CleverOrganization,
    attempts: usize,
    mut change: impl FnMut(&CleverOrganization, Timestamp) -> Option<CleverOrganizationStatus>,
) -> Result<Written, ApiError> {
    let name = current.name_any();
    for _ in 0..attempts {
        let Some(status) = change(&current, hub.now()) else { return Ok(Written::Stored) };
        match write(hub, &current, status).await? {
            Written::Conflict => match reread(hub, &name).await? {
                Some(o) => current = o,
                None => return Ok(Written::Gone),
            },
            done => return Ok(done),
        }
    }
    Ok(Written::Conflict)
}

/// The organisation read live; `None` once gone.
pub async fn reread(hub: &Hub, name: &str) -> Result<Option<CleverOrganization>, ApiError> {
    Api::<CleverOrganization>::all(hub.mgmt.clone()).get_opt(name).await.step(Step::ReadOrganization)
}

/// Marks cluster `key` waiting for `want` (fairness, fleet.md §4) in the organisations whose room
/// (`rooms`, as the round planned with) does not admit it — in every limiting one when each alone
/// would (the pods were held back by their rooms together).
pub async fn mark(hub: &Hub, key: &ClusterKey, rooms: &[(String, Ceiling)], want: &Want) -> Result<(), ApiError> {
    let short: Vec<&str> =
        rooms.iter().filter(|(_, room)| !room.admits(want.size)).map(|(name, _)| name.as_str()).collect();
    for org in cached(hub, key).await? {
        let name = org.name_any();
        let limited = rooms.iter().any(|(n, _)| *n == name);
        if !limited || (!short.is_empty() && !short.contains(&name.as_str())) {
            continue;
        }
        if organization::mark(&org, id(key), want, hub.now()).is_none() {
            continue;
        }
        let outcome =
            update(hub, Arc::unwrap_or_clone(org), ATTEMPTS, |o, now| organization::mark(o, id(key), want, now))
                .await?;
        tracing::debug!(cluster = %key, organization = %name, written = ?outcome, cpu_millis = want.size.cpu_millis, "pods wait for the organisation's room: the cluster is in line");
    }
    Ok(())
}

/// Takes cluster `key` out of its organisations' lines (no pod of it waits any more).
pub async fn unmark(hub: &Hub, key: &ClusterKey) -> Result<(), ApiError> {
    for org in cached(hub, key).await? {
        if organization::unmark(&org, id(key)).is_none() {
            continue;
        }
        let name = org.name_any();
        let outcome = update(hub, Arc::unwrap_or_clone(org), ATTEMPTS, |o, _| organization::unmark(o, id(key))).await?;
        tracing::debug!(cluster = %key, organization = %name, written = ?outcome, "no pod waits any more: the cluster leaves the line");
    }
    Ok(())
}

/// Why a launch was not reserved.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// No headroom: the organisation's words.
    #[error(transparent)]
    Short(#[from] Short),
    /// The cluster's own nodes are not in the ledger yet (just connected): the launch waits.
    #[error("organisation {0}: this cluster has not been counted yet; retrying the launch")]
    NotCounted(String),
    /// Lost the race [`ATTEMPTS`] times in a row.
    #[error("organisation {0}: its ledger changed under every attempt to reserve; retrying the launch")]
    Contended(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Reserves `launch` of cluster `key` in every organisation of `orgs` (read live), in name order;
/// on a refusal, the reservations already taken are returned. Returns the organisations reserved in.
pub async fn reserve(
    hub: &Hub,
    key: &ClusterKey,
    orgs: &[Arc<CleverOrganization>],
    launch: &Launch<'_>,
) -> Result<Vec<String>, ReserveError> {
    let mut done: Vec<String> = Vec::new();
    for org in orgs {
        match reserve_one(hub, key, org, launch).await {
            Ok(true) => done.push(org.name_any()),
            Ok(false) => {}
            Err(e) => {
                for name in &done {
                    if let Err(r) = release_one(hub, key, name, launch.group, None).await {
                        tracing::warn!(cluster = %key, organization = %name, nodegroup = %launch.group, error = %r, "returning a reservation failed; it expires on its own");
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Reserves in one organisation; false when it is gone meanwhile.
async fn reserve_one(
    hub: &Hub,
    key: &ClusterKey,
    org: &CleverOrganization,
    launch: &Launch<'_>,
) -> Result<bool, ReserveError> {
    let name = org.name_any();
    let mut current = org.clone();
    for _ in 0..ATTEMPTS {
        let now = hub.now();
        if !organization::counted(&current, id(key)) {
            return Err(ReserveError::NotCounted(name));
        }
        let outcome = match organization::reserve(&current, id(key), launch, &hub.settings.replica, now) {
            Ok(status) if current.status.as_ref() == Some(&status) => return Ok(true),
            Ok(status) => write(hub, &current, status).await?,
            Err(refused) => {
                // The mark is what fairness reads; losing it to a race only delays the line.
                let _ = write(hub, &current, refused.marked).await?;
                return Err(ReserveError::Short(refused.short));
            }
        };
        match outcome {
            Written::Stored => return Ok(true),
            Written::Gone => return Ok(false),
            Written::Conflict => match reread(hub, &name).await? {
                Some(o) => current = o,
                None => return Ok(false),
            },
        }
    }
    Err(ReserveError::Contended(name))
}

/// Returns cluster `key`'s reservation for `group` to every organisation holding it, and learns the
/// quota from CKE's `refusal` message when there is one.
pub async fn release(hub: &Hub, key: &ClusterKey, group: &str, refusal: Option<&str>) -> Result<(), ApiError> {
    for org in live(hub, key).await? {
        release_one(hub, key, &org.name_any(), group, refusal).await?;
    }
    Ok(())
}

async fn release_one(
    hub: &Hub,
    key: &ClusterKey,
    name: &str,
    group: &str,
    refusal: Option<&str>,
) -> Result<(), ApiError> {
    let Some(current) = reread(hub, name).await? else {
        return Ok(());
    };
    let outcome = update(hub, current, ATTEMPTS, |org, now| {
        let released = organization::release(org, id(key), group);
        let Some(message) = refusal else { return released };
        let mut with = org.clone();
        if let Some(s) = &released {
            with.status = Some(s.clone());
        }
        match organization::learn(&with, id(key), message, now) {
            Some(learned) => {
                tracing::info!(cluster = %key, organization = %name, "learned the organisation's quota from CKE's refusal");
                Some(learned)
            }
            None => released,
        }
    })
    .await?;
    if outcome == Written::Conflict {
        tracing::warn!(cluster = %key, organization = %name, nodegroup = %group, "the organisation's ledger changed under every attempt to return a reservation; it expires on its own");
    }
    Ok(())
}
