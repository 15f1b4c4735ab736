//! The launch sequence of one claim (karpenter-semantics §6.1, clever-cloud.md §3.4–3.5): create or
//! adopt its NodeGroup, await CKE's verdict on the workload cluster's NodeGroup cache with a
//! deadline, and turn the outcome into the claim's status through [`lifecycle::launched`].
//!
//! Owns: the launch's I/O (the node class and catalogue, from the hub's caches, the one-at-a-time
//! gate per cluster, the create, the verdict wait on the workload cache, the capacity memory). Must
//! not: choose a flavor or judge adoption itself ([`crate::decisions::launch`] does), launch for a
//! claim that is already being deleted, or act on an absence only a cache shows (each live read
//! left says why it is there).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;

use k8s_openapi::{apimachinery::pkg::api::resource::Quantity, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{controller::Action, reflector::ObjectRef},
};
use serde_json::json;

use super::{Claim, Error, write_status};
use crate::{
    decisions::{
        conditions, handover,
        launch::{self, LaunchError},
        lifecycle::{self, LaunchOutcome, READY},
        ownership::{self, ClaimIdentity},
    },
    infra::{
        errors::{ApiError, Step, StepExt},
        hub::Hub,
        metrics::Metrics,
        registry::Connection,
    },
};
use crds::{
    CleverNodeClass, FlavorCatalog, NodeClaim, NodeClaimStatus, NodeGroup,
    catalog::{Catalog, InstanceType},
    labels,
    nodegroup::Verdict,
    quantity::Resources,
};

/// Carry out [`lifecycle::Write::Launch`]: launch (or adopt), then write the outcome, in one status
/// write with `launching` (the `Launched=Unknown(Launching)` status the decision set, if it did).
/// A launch that concludes nothing yet writes `launching` alone: the launch TTL counts from it.
pub(super) async fn launch(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    launching: Option<NodeClaimStatus>,
) -> Result<Action, Error> {
    let now = hub.now();
    let result = try_launch(c, hub, conn, now).await;
    // The outcome is set on the status the decision made (Launching included), not the one read.
    let (with_launching, owned);
    let c = match &launching {
        Some(status) if !matches!(result, Err(Failure::Pending(_))) => {
            with_launching = NodeClaim { status: Some(status.clone()), ..c.obj.clone() };
            owned = Claim { obj: &with_launching, ..c.clone() };
            &owned
        }
        _ => c,
    };
    match result {
        Ok(Launched { flavor, offering_zone, capacity_type, instance_type }) => {
            let group = ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name);
            let mut labels_patch = instance_type.labels.clone();
            labels_patch.insert(labels::INSTANCE_TYPE.to_string(), flavor.clone());
            labels_patch.insert(labels::ZONE.to_string(), offering_zone);
            labels_patch.insert(labels::CAPACITY_TYPE.to_string(), capacity_type);
            // The claim's own labels win over resolved ones.
            for (k, v) in c.obj.labels() {
                labels_patch.insert(k.clone(), v.clone());
            }
            if let Err(e) = c
                .api
                .patch(&c.name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": labels_patch}})))
                .await
            {
                // The launch TTL must count from the first attempt even when this write fails.
                if let Some(status) = c.obj.status.clone().filter(|_| launching.is_some()) {
                    write_status(c, status).await?;
                }
                return Err(Step::PatchClaimLabels.failed(e).into());
            }
            let outcome = LaunchOutcome::Launched {
                provider_id: ownership::provider_id(&group),
                capacity: to_map(&instance_type.capacity),
                allocatable: to_map(&instance_type.allocatable),
            };
            write_status(c, lifecycle::launched(c.obj, &outcome, now)).await?;
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group, flavor = %flavor, "launched");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(Failure::Launch(e @ (LaunchError::InsufficientCapacity(_) | LaunchError::NodeClassNotReady(_)))) => {
            let reason = if matches!(e, LaunchError::NodeClassNotReady(_)) {
                "NodeClassNotReady"
            } else {
                "InsufficientCapacity"
            };
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, reason, message = %e, "launch failed; deleting the claim so its pods are re-planned");
            hub.event(&c.reference(), true, reason, "Launch", e.to_string()).await;
            match c.api.delete(&c.name, &ownership::delete_exactly(c.obj)).await {
                // Gone, or (409) replaced by a new claim of that name since it was read.
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(Step::DeleteClaim.failed(e).into()),
            }
            Ok(Action::await_change())
        }
        Err(Failure::Launch(e @ LaunchError::Conflict { .. })) => {
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, message = %e, "launch conflict");
            hub.event(&c.reference(), true, "NodeGroupConflict", "Launch", e.to_string()).await;
            write_status(c, lifecycle::launched(c.obj, &LaunchOutcome::Conflict(e.to_string()), now)).await?;
            Ok(Action::requeue(Duration::from_secs(60)))
        }
        Err(Failure::Pending(why)) => {
            if let Some(status) = launching {
                write_status(c, status).await?;
            }
            Ok(Action::requeue(why))
        }
        Err(Failure::Kube(e)) => {
            // The condition is the tenant's to read; a workload server's words are not (the log
            // gets them through the controller's error line).
            let why = e.in_own_words();
            write_status(c, lifecycle::launched(c.obj, &LaunchOutcome::Failed(why), now)).await?;
            Err(Error::Api(e))
        }
    }
}

fn to_map(r: &Resources) -> std::collections::BTreeMap<String, Quantity> {
    r.to_resource_list()
}

struct Launched {
    flavor: String,
    offering_zone: String,
    capacity_type: String,
    instance_type: InstanceType,
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

async fn try_launch(c: &Claim<'_>, hub: &Hub, conn: &Connection, now: Timestamp) -> Result<Launched, Failure> {
    let class_name = &c.obj.spec.node_class_ref.name;
    let ready = |class: &CleverNodeClass| {
        conditions::is_true(class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(), READY)
    };
    let class = match hub.cache.classes.get(&ObjectRef::new(class_name).within(&c.ns)) {
        Some(class) if ready(&class) => class,
        // Missing or not Ready in the cache: the claim is deleted for it below, so confirm with a
        // live read (a class just created or turned Ready, a cache that has not listed yet).
        _ => {
            let classes: Api<CleverNodeClass> = Api::namespaced(hub.mgmt.clone(), &c.ns);
            let Some(class) = classes.get_opt(class_name).await.step(Step::ReadNodeClass)? else {
                return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                    "CleverNodeClass {}/{class_name} does not exist",
                    c.ns
                ))));
            };
            Arc::new(class)
        }
    };
    let class_conditions = class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    if !conditions::is_true(class_conditions, READY) {
        let why = conditions::get(class_conditions, READY)
            .map_or("its Ready condition is not set yet".to_string(), |c| c.message.clone());
        return Err(Failure::Launch(LaunchError::NodeClassNotReady(format!(
            "CleverNodeClass {}/{class_name}: {why}",
            c.ns
        ))));
    }
    let types = instance_types(hub, &c.ns, &class)
        .await
        .map_err(|e| Failure::Launch(LaunchError::InsufficientCapacity(e.to_string())))?;
    let group_name = ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name);
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    // CKE's quota engine judges concurrent creations together (clever-cloud.md §3.4 step 5): one
    // NodeGroup of a cluster awaits its verdict at a time. Held until the verdict below.
    let gate = c.gates.of(&c.key);
    let _one_at_a_time = gate.lock_owned().await;
    // Waiting may have outlived the claim, and the controller's copy may lag: re-read it live, so a
    // claim already deleted never creates (or re-judges) a group.
    match c.api.get_opt(&c.name).await.step(Step::ReadClaim)? {
        Some(live) if live.uid() == c.obj.uid() && live.metadata.deletion_timestamp.is_none() => {}
        _ => return Err(Failure::Pending(Duration::from_secs(1))),
    }
    // Read after the wait: a refusal judged meanwhile must be seen by this launch.
    let capacity = hub.capacity(&c.key).await.step(Step::ReadCapacity)?;
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
        Some(g) if g.is_terminating() => groups.get_opt(&group_name).await.step(Step::ReadNodeGroup)?,
        Some(g) => Some(NodeGroup::clone(&g)),
        None => None,
    };
    let (flavor, group) = match existing {
        Some(g) if g.is_terminating() => {
            // Ours being deleted (a refusal handled by an earlier pass): nothing to adopt.
            return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                "NodeGroup {group_name} is being deleted"
            ))));
        }
        Some(g) => {
            // A restart after the create, or a group moved with its claim: adopt only our own
            // group, described by its own flavor.
            let (flavor, g) = take_over(c, hub, &groups, g).await?;
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, "adopting the NodeGroup created before a restart");
            (flavor, g)
        }
        None => {
            if let Some(left) = capacity.backoff_remaining(now) {
                return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                    "cluster {} is backing off NodeGroup creations for {}s after a CKE refusal{}",
                    c.key,
                    left.as_secs(),
                    capacity.last_message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
                ))));
            }
            let requests = c.obj.spec.resources.requests.as_ref().map(Resources::from_resource_list).transpose();
            let requests = requests
                .map_err(|e| Failure::Launch(LaunchError::InsufficientCapacity(format!("bad requests: {e}"))))?;
            let choice = launch::choose(&c.obj.spec.requirements, &requests.unwrap_or(Resources::ZERO), &types, |f| {
                capacity.is_available(f, now)
            })
            .map_err(Failure::Launch)?;
            let flavor = choice.instance_type.name.clone();
            let class_labels = class.spec.labels.clone();
            let id = ClaimIdentity {
                hub_id: &hub.settings.hub_id,
                management_cluster: &hub.settings.management_cluster,
                namespace: &c.ns,
                claim: &c.name,
                claim_uid: c.obj.metadata.uid.as_deref().unwrap_or_default(),
                nodepool: c.obj.labels().get(labels::NODEPOOL).map(String::as_str).unwrap_or_default(),
                nodeclass: class_name,
            };
            let desired = launch::desired_nodegroup(
                &id,
                &flavor,
                &class_labels,
                c.obj.labels(),
                &crds::drift::nodeclass_hash(&class.spec),
            );
            match hub.metrics.cloudprovider(&c.key, "create", groups.create(&PostParams::default(), &desired)).await {
                Ok(created) => {
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, price = choice.offering.price_hourly, "created NodeGroup; awaiting CKE's verdict");
                    (flavor, created)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // The name is taken although the cache did not show it: read what holds it.
                    let Some(g) = groups.get_opt(&group_name).await.step(Step::ReadNodeGroup)? else {
                        return Err(Failure::Pending(Duration::from_secs(1)));
                    };
                    if g.is_terminating() {
                        return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                            "NodeGroup {group_name} is being deleted"
                        ))));
                    }
                    // Described by its own flavor, not the one just chosen.
                    let (adopted, g) = take_over(c, hub, &groups, g).await?;
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %adopted, "the name was taken by this claim's group: adopted it");
                    (adopted, g)
                }
                Err(e) => return Err(Step::CreateNodeGroup.failed(e).into()),
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
                    Metrics::inc(&hub.metrics.acceptance_timeouts, &c.key);
                    hub.event(
                        &c.reference(),
                        true,
                        "NodeGroupAcceptanceTimeout",
                        "Launch",
                        format!(
                            "CKE gave no verdict on NodeGroup {group_name} within {:?}; proceeding",
                            hub.settings.verdict_timeout
                        ),
                    )
                    .await;
                    Some(Verdict::Pending)
                }
            }
        }
        v => Some(v),
    };
    let zone = hub.settings.zone.clone();
    let Some(it) = types.iter().find(|t| t.name == flavor).cloned() else {
        Metrics::inc(&hub.metrics.unknown_flavor_lookups, &c.key);
        return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
            "flavor {flavor} is not in the catalogue"
        ))));
    };
    match verdict {
        None => {
            // Seen, then gone: confirm with an uncached read.
            if groups.get_opt(&group_name).await.step(Step::ReadNodeGroup)?.is_none() {
                hub.update_capacity(&c.key, now, |s| s.record_vanish(&flavor, now, hub.settings.capacity))
                    .await
                    .step(Step::WriteCapacity)?;
                Metrics::inc(&hub.metrics.vanished, &c.key);
                hub.event(
                    &c.reference(),
                    true,
                    "NodeGroupVanished",
                    "Launch",
                    format!("NodeGroup {group_name} vanished during acceptance"),
                )
                .await;
                return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                    "NodeGroup {group_name} vanished during acceptance"
                ))));
            }
            Ok(Launched { flavor, offering_zone: zone, capacity_type: "on-demand".into(), instance_type: it })
        }
        Some(Verdict::QuotaRejected(message)) => {
            let message = message.unwrap_or_else(|| "quota exceeded".to_string());
            Metrics::inc(&hub.metrics.quota_rejections, &c.key);
            hub.event(
                &c.reference(),
                true,
                "NodeGroupQuotaExceeded",
                "Launch",
                format!("CKE refused NodeGroup {group_name} (flavor {flavor}): {message}"),
            )
            .await;
            let types_flavors: Vec<_> = types
                .iter()
                .map(|t| crds::catalog::Flavor {
                    name: t.name.clone(),
                    cpu: t.capacity.cpu_millis / 1000,
                    memory_ki: t.capacity.memory_bytes / 1024,
                    price_hourly: t.price().unwrap_or_default(),
                })
                .collect();
            hub.update_capacity(&c.key, now, |s| {
                s.record_rejection(&flavor, &message, &types_flavors, now, hub.settings.capacity)
            })
            .await
            .step(Step::WriteCapacity)?;
            // The rejected group frees nothing; delete it now (never a group still in its first reconcile).
            let dp = ownership::delete_exactly(&group);
            if let Err(e) = hub.metrics.cloudprovider(&c.key, "delete", groups.delete(&group_name, &dp)).await {
                tracing::debug!(cluster = %c.key, nodegroup = %group_name, error = %e, "deleting the rejected NodeGroup failed; GC will retry");
            }
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, message = %message, "CKE refused the NodeGroup for quota; flavor cooling down");
            Err(Failure::Launch(LaunchError::InsufficientCapacity(format!("CKE refused flavor {flavor}: {message}"))))
        }
        Some(Verdict::Failed { message, .. }) => Err(Failure::Kube(ApiError::cloud_provider(
            Step::NodeGroupVerdict,
            kube::Error::Service(
                format!("CKE failed to reconcile NodeGroup {group_name}: {}", message.unwrap_or_default()).into(),
            ),
        ))),
        Some(Verdict::Accepted | Verdict::Pending) => {
            Ok(Launched { flavor, offering_zone: zone, capacity_type: "on-demand".into(), instance_type: it })
        }
    }
}

/// Adopt an existing group of the claim's derived name: only when the ownership proof says it is
/// this claim's. A group moved with its claim from the management cluster the registration declares
/// is re-stamped as this management cluster's first (guarded by the version it was proven at), so
/// that from then on it is proven like any group of ours. Returns the group's flavor and the group.
async fn take_over(
    c: &Claim<'_>,
    hub: &Hub,
    groups: &Api<NodeGroup>,
    g: NodeGroup,
) -> Result<(String, NodeGroup), Failure> {
    let moved_from = hub.registry.moved_from(&c.key);
    let owner = hub.settings.owner().moved_from(moved_from.as_deref());
    let adopted = launch::adopt(&g, owner, &c.ns, c.obj).map_err(Failure::Launch)?;
    if !adopted.moved {
        return Ok((adopted.flavor, g));
    }
    let name = g.name_any();
    let patch = handover::restamp(
        &hub.settings.management_cluster,
        c.obj.metadata.uid.as_deref().unwrap_or_default(),
        g.metadata.resource_version.as_deref().unwrap_or_default(),
    );
    let restamped =
        groups.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.step(Step::RestampNodeGroup)?;
    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %name, moved_from = ?moved_from, "took over the NodeGroup moved with its NodeClaim from the management cluster the registration names; re-stamped as this management cluster's");
    Ok((adopted.flavor, restamped))
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
