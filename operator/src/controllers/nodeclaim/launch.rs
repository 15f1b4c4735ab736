//! The launch sequence of one claim (karpenter-semantics §6.1, clever-cloud.md §3.4–3.5): create or
//! adopt its NodeGroup, await CKE's verdict on the workload cluster's NodeGroup cache with a
//! deadline, and turn the outcome into the claim's writes through [`launch::conclude`].
//!
//! Owns: the launch's I/O (the node class and catalogue, from the hub's caches, the one-at-a-time
//! gate per cluster, the live re-reads, the create, patch and deletes, the verdict wait on the
//! workload cache, the capacity memory) and carrying out the writes [`crate::decisions::launch`]
//! returns, in order. Must not: decide anything between those calls (whether the class launches,
//! adopt or create and with which flavor, what a verdict means, what the claim gets: each is
//! [`crate::decisions::launch`]'s), launch for a claim that is already being deleted, or act on an
//! absence only a cache shows (each live read left says why it is there).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{controller::Action, reflector::ObjectRef},
};
use serde_json::json;

use super::{Claim, Error, write_status};
use crate::{
    decisions::{
        launch::{self, Adoption, Attempt, ClaimWrite, Counter, Creation, End, LaunchError, Launched, Step},
        organization::{self, Launch, Sizer},
        ownership,
    },
    infra::{
        errors::{self, ApiError, StepExt},
        hub::{ClusterOwner, Hub},
        metrics::Metrics,
        organizations::{self, ReserveError},
        registry::Connection,
    },
};
use crds::{
    CleverNodeClass, CleverOrganization, FlavorCatalog, NodeClaimStatus, NodeGroup,
    catalog::{Catalog, InstanceType},
    nodegroup::Verdict,
};

/// Carry out [`crate::decisions::lifecycle::Write::Launch`]: launch (or adopt), then carry out the
/// claim's writes [`launch::conclude`] gives for the outcome, in one status write with `launching`
/// (the `Launched=Unknown(Launching)` status the decision set, if it did). A launch that concludes
/// nothing yet writes `launching` alone: the launch TTL counts from it.
pub(super) async fn launch(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    launching: Option<NodeClaimStatus>,
) -> Result<Action, Error> {
    let now = hub.now();
    let (attempt, failed) = match try_launch(c, hub, conn, now).await {
        Ok(launched) => (Attempt::Launched(Box::new(launched)), None),
        Err(Failure::Launch(e)) => (Attempt::Refused(e), None),
        Err(Failure::Pending(after)) => (Attempt::Pending(after), None),
        // The condition is the tenant's to read; a workload server's words are not (the log gets
        // them through the controller's error line).
        Err(Failure::Kube(e)) => (Attempt::Failed(e.in_own_words()), Some(e)),
    };
    match &attempt {
        Attempt::Refused(e @ LaunchError::Conflict { .. }) => {
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, message = %e, "launch conflict");
        }
        Attempt::Refused(e) => {
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, reason = e.reason(), message = %e, "launch failed; deleting the claim so its pods are re-planned");
        }
        _ => {}
    }
    let group = ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name);
    let conclusion = launch::conclude(c.obj, &group, launching, &attempt, now);
    for write in conclusion.writes {
        write_claim(c, hub, write).await?;
    }
    if let Some(e) = failed {
        return Err(Error::Api(e));
    }
    if let Attempt::Launched(l) = &attempt {
        tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group, flavor = %l.flavor, "launched");
    }
    Ok(conclusion.requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Carry out one of [`launch::conclude`]'s writes on the claim.
async fn write_claim(c: &Claim<'_>, hub: &Hub, write: ClaimWrite) -> Result<(), Error> {
    match write {
        ClaimWrite::Labels { labels, launching } => {
            let patch = json!({"metadata": {"labels": labels}});
            if let Err(e) = c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                // The launch TTL must count from the first attempt even when this write fails.
                if let Some(status) = launching {
                    write_status(c, *status).await?;
                }
                return Err(errors::Step::PatchClaimLabels.failed(e).into());
            }
        }
        ClaimWrite::Status(status) => write_status(c, *status).await?,
        ClaimWrite::Event { reason, note } => hub.event(&c.reference(), true, reason, "Launch", note).await,
        ClaimWrite::Delete => match c.api.delete(&c.name, &ownership::delete_exactly(c.obj)).await {
            // Gone, or (409) replaced by a new claim of that name since it was read.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(errors::Step::DeleteClaim.failed(e).into()),
        },
    }
    Ok(())
}

enum Failure {
    Launch(LaunchError),
    /// Not now: come back after this.
    Pending(Duration),
    Kube(ApiError),
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Kube(e)
    }
}

/// The launch gates, one per cluster: CKE's quota engine judges concurrent creations together, so
/// one NodeGroup at a time awaits its verdict per cluster; clusters never wait on each other.
/// The lifecycle controller's own memory.
#[derive(Debug, Default)]
pub(super) struct Gates(
    std::sync::Mutex<std::collections::BTreeMap<crate::infra::registry::ClusterKey, Arc<tokio::sync::Mutex<()>>>>,
);

impl Gates {
    /// The gate of cluster `key`.
    fn of(&self, key: &crate::infra::registry::ClusterKey) -> Arc<tokio::sync::Mutex<()>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(key.clone()).or_default().clone()
    }
}

/// The class's FlavorCatalog could not be read live.
#[derive(Debug, thiserror::Error)]
#[error("reading FlavorCatalog {namespace}/{name}: {source}")]
pub struct CatalogReadError {
    namespace: String,
    name: String,
    source: kube::Error,
}

/// [`Hub::cached_instance_types`] for a launch, which acts on it: a catalogue the cache does not show is
/// read live before the built-in one is served instead (a catalogue just created, a cache not
/// listed yet), so a launch never picks a flavor on a cache's word that the catalogue is missing.
/// Errors only when it cannot be read.
pub async fn instance_types(
    hub: &Hub,
    ns: &str,
    class: &CleverNodeClass,
) -> Result<Vec<InstanceType>, CatalogReadError> {
    let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
    let found = match reference {
        None => None,
        Some(name) => match hub.cache.catalogs.get(&ObjectRef::new(name).within(ns)) {
            Some(fc) => Some(fc),
            None => Api::<FlavorCatalog>::namespaced(hub.mgmt.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|source| CatalogReadError { namespace: ns.to_string(), name: name.to_string(), source })?
                .map(Arc::new),
        },
    };
    let (catalog, _problem) = crds::catalog::served(&Catalog::builtin(), reference, found.as_deref());
    Ok(catalog.instance_types(&hub.settings.zone))
}

/// The launch sequence's I/O, each decision between its calls [`launch`]'s: the node class, the
/// gate, the live re-read of the claim, the capacity memory, the group of the claim's name, the
/// create or the take-over, the verdict wait, and the verdict's writes.
async fn try_launch(c: &Claim<'_>, hub: &Hub, conn: &Connection, now: Timestamp) -> Result<Launched, Failure> {
    let class_name = &c.obj.spec.node_class_ref.name;
    let class = match hub.cache.classes.get(&ObjectRef::new(class_name).within(&c.ns)) {
        Some(class) if launch::class_ready(&class) => Some(class),
        // Missing or not Ready in the cache: the claim is deleted for it, so confirm with a live
        // read (a class just created or turned Ready, a cache that has not listed yet).
        _ => {
            let classes: Api<CleverNodeClass> = Api::namespaced(hub.mgmt.clone(), &c.ns);
            classes.get_opt(class_name).await.step(errors::Step::ReadNodeClass)?.map(Arc::new)
        }
    };
    let class = launch::judge_class(&c.ns, class_name, class.as_deref()).map_err(Failure::Launch)?;
    let mut types = instance_types(hub, &c.ns, class)
        .await
        .map_err(|e| Failure::Launch(LaunchError::InsufficientCapacity(e.to_string())))?;
    // Priced as the round that made the claim priced them: with the namespace's NodeOverlays.
    let pool = c.obj.labels().get(crds::labels::NODEPOOL).cloned().unwrap_or_default();
    hub.overlaid(&c.ns, &pool, &mut types);
    let group_name = ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name);
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    // CKE's quota engine judges concurrent creations together (clever-cloud.md §3.4 step 5): one
    // NodeGroup of a cluster awaits its verdict at a time. Held until the verdict below.
    let gate = c.gates.of(&c.key);
    let _one_at_a_time = gate.lock_owned().await;
    // Waiting may have outlived the claim, and the controller's copy may lag: re-read it live, so a
    // claim already deleted never creates (or re-judges) a group.
    if !launch::still_to_launch(c.obj, c.api.get_opt(&c.name).await.step(errors::Step::ReadClaim)?.as_ref()) {
        return Err(Failure::Pending(launch::RETRY_SOON));
    }
    // Read after the wait: a refusal judged meanwhile must be seen by this launch.
    let capacity = hub.capacity(&c.key).await.step(errors::Step::ReadCapacity)?;
    // Subscribed before the create, so that CKE's verdict cannot come between the two.
    let touched = {
        let (key, name) = (c.key.clone(), group_name.clone());
        hub.registry
            .touched()
            .filter_map(move |t| std::future::ready((t.cluster == key && t.group == name).then_some(())))
    };
    // The group from the workload cache: absent, the create below is the real check (AlreadyExists
    // is read live and adopted); shown terminating, it is confirmed live, since the claim is
    // deleted for it.
    let existing = match conn.cache.nodegroups.get(&ObjectRef::new(&group_name)) {
        Some(g) if g.is_terminating() => groups.get_opt(&group_name).await.step(errors::Step::ReadNodeGroup)?,
        Some(g) => Some(NodeGroup::clone(&g)),
        None => None,
    };
    // The cluster's organisations, read live: a create spends their headroom (fleet.md §4).
    let orgs = match existing {
        None => organizations::live(hub, &c.key).await?,
        Some(_) => Vec::new(),
    };
    let whose = orgs.iter().map(|o| format!("organisation {}", o.name_any())).collect::<Vec<_>>().join(", ");
    let headroom = orgs.iter().map(|o| organization::headroom(o)).reduce(|a, b| a.min(&b));
    let who = hub.owner_on(&c.key);
    let cluster = c.key.to_string();
    let facts = launch::Facts {
        claim: c.obj,
        namespace: &c.ns,
        cluster: &cluster,
        owner: who.owner(),
        class,
        types: &types,
        capacity: &capacity,
        headroom: headroom.map(|h| (h, whose.as_str())),
        now,
    };
    let (flavor, group) = match launch::next_step(&facts, existing).map_err(Failure::Launch)? {
        Step::Adopt(adoption) => {
            let (flavor, g) = take_over(c, &groups, &who, *adoption).await?;
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, "adopting the NodeGroup created before a restart");
            (flavor, g)
        }
        Step::Create(new) => {
            let Creation { flavor, price_hourly, group: desired } = *new;
            if !orgs.is_empty() {
                reserve(c, hub, &orgs, &group_name, &flavor, &types).await?;
            }
            let requested = std::time::Instant::now();
            let created =
                hub.metrics.cloudprovider(&c.key, "create", groups.create(&PostParams::default(), &desired)).await;
            if created.is_ok() {
                hub.observe_waits(&c.key, &c.name, requested);
            }
            if let Err(e) = &created
                && !matches!(e, kube::Error::Api(s) if s.code == 409)
                && !orgs.is_empty()
            {
                // Nothing was created: the headroom goes back at once.
                release(c, hub, &group_name, None).await;
            }
            match created {
                Ok(created) => {
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, price = price_hourly, "created NodeGroup; awaiting CKE's verdict");
                    (flavor, created)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // The name is taken although the cache did not show it: read what holds it.
                    let Some(g) = groups.get_opt(&group_name).await.step(errors::Step::ReadNodeGroup)? else {
                        return Err(Failure::Pending(launch::RETRY_SOON));
                    };
                    // Described by its own flavor, not the one just chosen.
                    let adoption = launch::adoption(&facts, g).map_err(Failure::Launch)?;
                    let (adopted, g) = take_over(c, &groups, &who, adoption).await?;
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %adopted, "the name was taken by this claim's group: adopted it");
                    (adopted, g)
                }
                Err(e) => return Err(errors::Step::CreateNodeGroup.failed(e).into()),
            }
        }
    };
    // Wait for the verdict on the workload cache, with a deadline; then go on optimistically.
    let verdict = match group.verdict() {
        Verdict::Pending => {
            let uid = group.uid().unwrap_or_default();
            match tokio::time::timeout(hub.settings.verdict_timeout, await_verdict(conn, &group_name, &uid, touched))
                .await
            {
                Ok(v) => v,
                Err(_) => {
                    for write in launch::acceptance_timeout(&group_name, hub.settings.verdict_timeout) {
                        write_verdict(c, hub, &groups, &group, now, write).await?;
                    }
                    Some(Verdict::Pending)
                }
            }
        }
        v => Some(v),
    };
    let at = launch::VerdictFacts { group: &group_name, flavor: &flavor, types: &types, zone: &hub.settings.zone };
    let mut judged = launch::judge_verdict(&at, verdict.clone(), None);
    if matches!(judged.end, End::ReadLive) {
        // Seen, then gone: confirm with an uncached read.
        let gone = groups.get_opt(&group_name).await.step(errors::Step::ReadNodeGroup)?.is_none();
        judged = launch::judge_verdict(&at, verdict, Some(gone));
    }
    for write in judged.writes {
        write_verdict(c, hub, &groups, &group, now, write).await?;
    }
    match judged.end {
        End::Launched(launched) => Ok(*launched),
        End::Refused(e) => Err(Failure::Launch(e)),
        End::Failed(why) => Err(Failure::Kube(ApiError::cloud_provider(
            errors::Step::NodeGroupVerdict,
            kube::Error::Service(why.into()),
        ))),
        // Judged again with the live read's answer: not asked twice.
        End::ReadLive => Err(Failure::Pending(launch::RETRY_SOON)),
    }
}

/// Carry out one write of the verdict step, on the group the verdict was read on.
async fn write_verdict(
    c: &Claim<'_>,
    hub: &Hub,
    groups: &Api<NodeGroup>,
    group: &NodeGroup,
    now: Timestamp,
    write: launch::Write,
) -> Result<(), Failure> {
    match write {
        launch::Write::Count(counter) => {
            let m = &hub.metrics;
            let family = match counter {
                Counter::AcceptanceTimeout => &m.acceptance_timeouts,
                Counter::UnknownFlavor => &m.unknown_flavor_lookups,
                Counter::Vanished => &m.vanished,
                Counter::QuotaRejection => &m.quota_rejections,
            };
            Metrics::inc(family, &c.key);
        }
        launch::Write::Event { reason, note } => hub.event(&c.reference(), true, reason, "Launch", note).await,
        launch::Write::RecordVanish { flavor } => {
            hub.update_capacity(&c.key, now, |s| s.record_vanish(&flavor, now, hub.settings.capacity))
                .await
                .step(errors::Step::WriteCapacity)?;
            release(c, hub, &group.name_any(), None).await;
        }
        launch::Write::RecordRejection { flavor, message, flavors } => {
            hub.update_capacity(&c.key, now, |s| {
                s.record_rejection(&flavor, &message, &flavors, now, hub.settings.capacity)
            })
            .await
            .step(errors::Step::WriteCapacity)?;
            // A refused reservation goes back at once, and the refusal teaches the quota.
            release(c, hub, &group.name_any(), Some(&message)).await;
        }
        launch::Write::DeleteRefusedGroup { flavor, message } => {
            // Never a group still in its first reconcile: this one has CKE's verdict.
            let name = group.name_any();
            let dp = ownership::delete_exactly(group);
            if let Err(e) = hub.metrics.cloudprovider(&c.key, "delete", groups.delete(&name, &dp)).await {
                tracing::debug!(cluster = %c.key, nodegroup = %name, error = %e, "deleting the rejected NodeGroup failed; GC will retry");
            }
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %name, flavor = %flavor, message = %message, "CKE refused the NodeGroup for quota; flavor cooling down");
        }
    }
    Ok(())
}

/// Reserve the group's flavor in the cluster's organisations before its create (fleet.md §4): a
/// launch the organisation has no headroom for fails as insufficient capacity with its words (the
/// claim is deleted and its pods planned again against the headroom), a ledger too busy to write
/// retries soon.
async fn reserve(
    c: &Claim<'_>,
    hub: &Hub,
    orgs: &[Arc<CleverOrganization>],
    group: &str,
    flavor: &str,
    types: &[InstanceType],
) -> Result<(), Failure> {
    let Some(t) = types.iter().find(|t| t.name == flavor) else { return Ok(()) };
    let pool = c.obj.labels().get(crds::labels::NODEPOOL).cloned().unwrap_or_default();
    let weight = hub.cache.pools.get(&ObjectRef::new(&pool).within(&c.ns)).and_then(|p| p.spec.weight).unwrap_or(0);
    // The claim was made for pods that waited: its creation is when they started waiting, near enough.
    let since = c.obj.metadata.creation_timestamp.as_ref().map_or_else(|| hub.now(), |t| t.0);
    let launch = Launch { group, flavor, pool: &pool, size: Sizer::of_type(t), weight, since };
    match organizations::reserve(hub, &c.key, orgs, &launch).await {
        Ok(names) => {
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group, flavor = %flavor, organizations = ?names, "reserved the flavor in the organisation's quota");
            Ok(())
        }
        Err(ReserveError::Short(short)) => {
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, flavor = %flavor, reason = %short, "the organisation has no headroom for this launch; not sent");
            Err(Failure::Launch(LaunchError::InsufficientCapacity(short.message)))
        }
        Err(e @ (ReserveError::Contended(_) | ReserveError::NotCounted(_))) => {
            tracing::debug!(cluster = %c.key, nodeclaim = %c.name, reason = %e, "not reserved yet; retrying the launch");
            Err(Failure::Pending(launch::RETRY_SOON))
        }
        Err(ReserveError::Api(e)) => Err(Failure::Kube(e)),
    }
}

/// Return the group's reservation to the cluster's organisations (and learn from CKE's `refusal`);
/// a failure leaves it to expire ([`crate::decisions::organization::RESERVATION_TTL`]).
async fn release(c: &Claim<'_>, hub: &Hub, group: &str, refusal: Option<&str>) {
    if let Err(e) = organizations::release(hub, &c.key, group, refusal).await {
        tracing::warn!(cluster = %c.key, nodegroup = %group, step = e.step.label(), error = %e, "returning the organisation reservation failed; it expires on its own");
    }
}

/// Go on with an adopted group: as it is, or first re-stamped as this management cluster's when it
/// moved with its claim from the management cluster the registration declares (the patch is
/// guarded by the version it was proven at), so that from then on it is proven like any group of
/// ours. Returns the group's flavor and the group.
async fn take_over(
    c: &Claim<'_>,
    groups: &Api<NodeGroup>,
    who: &ClusterOwner<'_>,
    adoption: Adoption,
) -> Result<(String, NodeGroup), Failure> {
    let Adoption { flavor, group, restamp } = adoption;
    let Some(patch) = restamp else {
        return Ok((flavor, group));
    };
    let name = group.name_any();
    let restamped = groups
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .step(errors::Step::RestampNodeGroup)?;
    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %name, moved_from = ?who.moved_from, "took over the NodeGroup moved with its NodeClaim from the management cluster the registration names; re-stamped as this management cluster's");
    Ok((flavor, restamped))
}

/// How often the verdict wait looks at the cache without a change announced (the announcements are
/// lossy under bursts).
const VERDICT_RECHECK: Duration = Duration::from_secs(1);

/// CKE's verdict on the group `name` of UID `uid`, from the workload cluster's NodeGroup cache, woken
/// by the announcements of its changes (`touched`, subscribed before the group was created): no request of
/// its own. `None` once the group was seen and is gone (or replaced by another of the same name);
/// the caller confirms that with a live read. A group not cached yet is waited for. Unbounded: the
/// caller sets the deadline.
async fn await_verdict(
    conn: &Connection,
    name: &str,
    uid: &str,
    touched: impl futures::Stream<Item = ()>,
) -> Option<Verdict> {
    let mut touched = std::pin::pin!(touched);
    let mut seen = false;
    loop {
        match conn.cache.nodegroups.get(&ObjectRef::new(name)) {
            Some(g) if g.uid().as_deref() == Some(uid) => {
                seen = true;
                let v = g.verdict();
                if v != Verdict::Pending {
                    return Some(v);
                }
            }
            Some(_) => return None,
            None if seen => return None,
            None => {}
        }
        // The next change of this group, or a periodic look.
        let _ = tokio::time::timeout(VERDICT_RECHECK, async {
            if touched.next().await.is_none() {
                // The registry is gone: only the deadline ends the wait.
                std::future::pending::<()>().await;
            }
        })
        .await;
    }
}
