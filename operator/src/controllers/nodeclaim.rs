//! The NodeClaim lifecycle controller (karpenter-semantics §6, clever-cloud.md §3.4–3.7): for each
//! claim in the management cluster, launch one NodeGroup in its workload cluster, register and
//! initialize the Node CKE makes of it, enforce the launch and registration TTLs, and on deletion
//! delete the NodeGroup and release the finalizers so nothing is orphaned.
//!
//! Owns: the reconcile loop and its API writes, each idempotent (deterministic NodeGroup name,
//! adoption after a crash, optimistic concurrency on Nodes). Decisions come from [`crate::decisions::launch`],
//! [`crate::decisions::node_registration`], [`crate::decisions::capacity`] and [`crate::decisions::ownership`].
//! On deletion of a registered claim, its Node is drained first: [`crate::decisions::termination`] decides
//! each pass, this controller gathers its facts and carries out its writes.
//! Must not: act on a cluster that is not connected and synced, delete a NodeGroup that fails the
//! ownership proof, or decide which pods go (termination's job).

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Node, ObjectReference, Pod, Taint},
    apimachinery::pkg::api::resource::Quantity,
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{Controller, controller::Action, reflector::ObjectRef, wait::await_condition, watcher},
};
use serde_json::json;

use crate::{
    decisions::conditions::{self, FALSE, TRUE, UNKNOWN},
    decisions::launch::{self, LaunchError},
    decisions::node_registration::{self, NodeMatch},
    decisions::ownership::{self, ClaimIdentity, Ownership},
    decisions::termination::{self, Decision, Expiry, PodFacts, PodRef},
    infra::hub::Hub,
    infra::metrics::{Metrics, PoolLabels, PoolReasonLabels},
    infra::registry::{ClusterKey, Connection},
};
use crds::{
    CleverNodeClass, FlavorCatalog, NodeClaim, NodeClaimStatus, NodeGroup,
    catalog::{Catalog, InstanceType},
    labels,
    nodegroup::Verdict,
    quantity::Resources,
};

pub const LAUNCHED: &str = "Launched";
pub const REGISTERED: &str = "Registered";
pub const INITIALIZED: &str = "Initialized";
pub const READY: &str = "Ready";
pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
pub const CONSISTENT_STATE_FOUND: &str = "ConsistentStateFound";

/// What stops a reconcile; retried with the controller's back-off.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("the NodeClaim has no namespace or name")]
    Unnamed,
}

/// Run the controller until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let claims: Api<NodeClaim> = hub.scoped();
    // A Node or NodeGroup changing in a workload cluster wakes the claim launched as that group
    // (a deleted Node, a vanished group, a node joining) without waiting for its periodic check.
    let cache = hub.cache.clone();
    let touched = hub.registry.touched().filter_map(move |t| {
        let provider_id = ownership::provider_id(&t.group);
        let claim = cache.claims_in(&t.cluster.namespace).into_iter().find(|c| {
            c.spec.cluster_name == t.cluster.name
                && c.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str())
        });
        std::future::ready(claim.map(|c| ObjectRef::from_obj(c.as_ref())))
    });
    Controller::new(claims, watcher::Config::default())
        .reconcile_on(touched)
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, hub)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "nodeclaim reconcile failed");
            }
        })
        .await;
}

fn error_policy(claim: Arc<NodeClaim>, e: &Error, _: Arc<Hub>) -> Action {
    let ns = claim.namespace().unwrap_or_default();
    if matches!(e, Error::Kube(kube::Error::Api(s)) if s.code == 409) {
        // Optimistic concurrency doing its job (e.g. the kubelet updated the Node meanwhile): retry soon.
        tracing::debug!(nodeclaim = %claim.name_any(), namespace = %ns, error = %e, "write conflict; retrying");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(nodeclaim = %claim.name_any(), namespace = %ns, error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

struct Claim<'a> {
    obj: &'a NodeClaim,
    ns: String,
    name: String,
    key: ClusterKey,
    api: Api<NodeClaim>,
}

impl Claim<'_> {
    fn reference(&self) -> ObjectReference {
        self.obj.object_ref(&())
    }

    fn pool(&self) -> PoolLabels {
        PoolLabels {
            cluster: self.key.to_string(),
            nodepool: self.obj.labels().get(labels::NODEPOOL).cloned().unwrap_or_default(),
        }
    }

    fn disrupted(&self, reason: &str) -> PoolReasonLabels {
        let PoolLabels { cluster, nodepool } = self.pool();
        PoolReasonLabels { cluster, nodepool, reason: reason.to_string() }
    }
}

async fn reconcile(obj: Arc<NodeClaim>, hub: Arc<Hub>) -> Result<Action, Error> {
    let (Some(ns), Some(name)) = (obj.namespace(), obj.metadata.name.clone()) else {
        return Err(Error::Unnamed);
    };
    let c = Claim {
        obj: &obj,
        key: ClusterKey::new(ns.clone(), obj.spec.cluster_name.clone()),
        api: Api::namespaced(hub.mgmt.clone(), &ns),
        ns,
        name,
    };
    if obj.metadata.deletion_timestamp.is_some() {
        return terminate(&c, &hub).await;
    }
    if !obj.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER) {
        // Before anything launches, so a deleted claim always passes through termination.
        c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&with_finalizer(obj.as_ref(), true))).await?;
        return Ok(Action::await_change());
    }
    let Some(conn) = hub.registry.connection(&c.key).filter(|c| c.is_synced()) else {
        // No decisions on a cluster we cannot see.
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let now = Timestamp::now();
    // karpenter-semantics §4.1: expiry is forceful (no budget, no replacement first); the deletion
    // drains the node through `terminate` like any other. Otherwise look again at the expiry time.
    let expiry = match expiry(&c, &hub, now).await? {
        Some(at) => at,
        None => return Ok(Action::await_change()),
    };
    let mut status = obj.status.clone().unwrap_or_default();
    let launched = conditions::get(&status.conditions, LAUNCHED).map(|c| c.status.clone());
    if launched.as_deref() != Some(TRUE) {
        return launch_claim(&c, &hub, &conn, status, now).await;
    }
    let observed = obj.metadata.generation;
    // Registration.
    let provider_id = status.provider_id.clone().unwrap_or_default();
    let group = ownership::parse_provider_id(&provider_id).map(str::to_string).unwrap_or_default();
    stamp_provider_id(&hub, &conn, &group).await?;
    let nodes = conn.cache.nodes.state();
    let mut changed = false;
    let mut requeue = Duration::from_secs(60);
    match node_registration::find_node(nodes.iter().map(|n| n.as_ref()), &provider_id) {
        NodeMatch::NotFound if instance_gone(&hub, &conn, &group).await? => {
            return instance_lost(&c, &hub, status, &group, now).await;
        }
        NodeMatch::NotFound if conditions::is_true(&status.conditions, REGISTERED) => {
            // The Node went away but its group is still there (CKE replacing it): wait, keep Registered.
            requeue = Duration::from_secs(2);
        }
        NodeMatch::NotFound => {
            changed |= conditions::set(
                &mut status.conditions,
                REGISTERED,
                UNKNOWN,
                "NodeNotFound",
                "node not registered with cluster",
                observed,
                now,
            );
            requeue = Duration::from_secs(2);
        }
        NodeMatch::Many(n) => {
            changed |= conditions::set(
                &mut status.conditions,
                REGISTERED,
                FALSE,
                "MultipleNodesFound",
                &format!("{n} nodes carry provider ID {provider_id}"),
                observed,
                now,
            );
        }
        NodeMatch::One(node) if node.metadata.deletion_timestamp.is_some() => {
            // karpenter-semantics §5.2: deleting the Node deletes its claim; termination then
            // deletes the NodeGroup and releases the Node (a user's `kubectl delete node`, or CKE
            // removing the node of a group that went away).
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), "node is being deleted; deleting its claim");
            c.api.delete(&c.name, &DeleteParams::default()).await?;
            return Ok(Action::await_change());
        }
        NodeMatch::One(node) => {
            if !conditions::is_true(&status.conditions, REGISTERED) {
                let desired = node_registration::registered_node(node, c.obj);
                let first = &desired != node;
                if first {
                    let nodes: Api<Node> = Api::all(conn.client.clone());
                    // `replace` carries the resourceVersion: a concurrent change makes it fail and retry.
                    nodes.replace(&node.name_any(), &PostParams::default(), &desired).await?;
                }
                status.node_name = Some(node.name_any());
                changed |= conditions::set(&mut status.conditions, REGISTERED, TRUE, "Registered", "", observed, now);
                // Counted by the pass that registered the Node; a pass reading a claim status that
                // lags behind (the Node change wakes it) only writes the condition.
                if first {
                    hub.metrics.nodes_created.get(&c.pool()).inc();
                    hub.record_registration(&c.ns, &c.pool().nodepool, true);
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), "node registered");
                }
                requeue = Duration::from_secs(1);
            } else {
                match node_registration::initialization_blocker(node, c.obj) {
                    Some((reason, message)) => {
                        changed |= conditions::set(
                            &mut status.conditions,
                            INITIALIZED,
                            UNKNOWN,
                            reason,
                            &message,
                            observed,
                            now,
                        );
                        requeue = Duration::from_secs(2);
                    }
                    None if !conditions::is_true(&status.conditions, INITIALIZED) => {
                        let nodes: Api<Node> = Api::all(conn.client.clone());
                        let patch = json!({"metadata": {"labels": {labels::INITIALIZED: "true"}}});
                        nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
                        changed |= conditions::set(
                            &mut status.conditions,
                            INITIALIZED,
                            TRUE,
                            "Initialized",
                            "",
                            observed,
                            now,
                        );
                        tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), "node initialized");
                    }
                    None => {
                        // karpenter-semantics §6.6: the node CKE made has the shape we paid for.
                        let verdict = node_registration::consistency(node, c.obj);
                        let (st, reason, message) = match &verdict {
                            Ok(()) => (TRUE, "ConsistentStateFound", String::new()),
                            Err(why) => (FALSE, "ConsistencyCheckFailed", why.clone()),
                        };
                        if conditions::set(
                            &mut status.conditions,
                            CONSISTENT_STATE_FOUND,
                            st,
                            reason,
                            &message,
                            observed,
                            now,
                        ) {
                            changed = true;
                            if let Err(why) = verdict {
                                tracing::warn!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), why = %why, "node shape differs from its flavor");
                                hub.event(&c.reference(), true, "FailedConsistencyCheck", "Check", why).await;
                            }
                        }
                    }
                }
            }
        }
    }
    let ready = conditions::is_true(&status.conditions, LAUNCHED)
        && conditions::is_true(&status.conditions, REGISTERED)
        && conditions::is_true(&status.conditions, INITIALIZED);
    changed |= conditions::set(
        &mut status.conditions,
        READY,
        if ready { TRUE } else { UNKNOWN },
        if ready { "Ready" } else { "NotReady" },
        "",
        observed,
        now,
    );
    // Registration TTL, measured from the condition's last transition.
    if !conditions::is_true(&status.conditions, REGISTERED)
        && conditions::age(&status.conditions, REGISTERED, now).is_some_and(|a| a >= hub.settings.registration_ttl)
    {
        tracing::warn!(cluster = %c.key, nodeclaim = %c.name, reason = "registration_timeout", "node did not register in time; deleting the claim");
        hub.metrics.nodeclaims_disrupted.get(&c.disrupted("registration_timeout")).inc();
        hub.record_registration(&c.ns, &c.pool().nodepool, false);
        hub.event(
            &c.reference(),
            true,
            "RegistrationTimeout",
            "Delete",
            format!("no node registered within {:?}", hub.settings.registration_ttl),
        )
        .await;
        write_status(&c, status).await?;
        c.api.delete(&c.name, &DeleteParams::default()).await?;
        return Ok(Action::await_change());
    }
    if changed {
        write_status(&c, status).await?;
    }
    Ok(Action::requeue(expiry.map_or(requeue, |e| requeue.min(e))))
}

/// Expire the claim if its lifetime is over (`Ok(None)`: deleted, nothing more to do this pass);
/// otherwise how long until it is (`None` inside: never).
async fn expiry(c: &Claim<'_>, hub: &Hub, now: Timestamp) -> Result<Option<Option<Duration>>, Error> {
    let expire_after = Some(c.obj.spec.expire_after.as_str()).filter(|e| !e.is_empty());
    let decided = termination::expiration::decide(
        c.obj.metadata.creation_timestamp.as_ref().map(|t| t.0),
        expire_after,
        c.obj.metadata.deletion_timestamp.is_some(),
        now,
    );
    match decided {
        Ok(Expiry::Expire) => {
            let lifetime = expire_after.unwrap_or_default();
            c.api.delete(&c.name, &DeleteParams::default()).await?;
            // Counted once the deletion went through: a failed one is retried, not counted twice.
            hub.metrics.nodeclaims_disrupted.get(&c.disrupted("expired")).inc();
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, expire_after = %lifetime, reason = "expired", "claim expired; deleting it (forceful: no disruption budget); its node is drained");
            hub.event(
                &c.reference(),
                false,
                termination::expiration::EXPIRED,
                "Delete",
                format!("expireAfter {lifetime} reached; the node is drained and its pods re-planned"),
            )
            .await;
            Ok(None)
        }
        Ok(e) => Ok(Some(e.recheck_in(now))),
        Err(why) => {
            // Admission refuses these; one written around it is never expired by guess.
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, error = %why, "claim not expired");
            hub.event(&c.reference(), true, "InvalidExpireAfter", "Expire", why.to_string()).await;
            Ok(Some(None))
        }
    }
}

async fn write_status(c: &Claim<'_>, status: NodeClaimStatus) -> Result<(), Error> {
    let patch = json!({"status": status});
    c.api.patch_status(&c.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// The hub's registration pre-step: CKE leaves `spec.providerID` empty; stamp the Node of a group
/// this scope owns (write-once).
async fn stamp_provider_id(hub: &Hub, conn: &Connection, group: &str) -> Result<(), Error> {
    if group.is_empty() {
        return Ok(());
    }
    let owned = |g: &str| {
        g == group
            && conn.cache.nodegroups.state().iter().any(|ng| {
                ng.name_any() == g
                    && matches!(
                        ownership::prove(ng, &hub.settings.hub_id, &conn.key.namespace),
                        Ownership::Owned { .. }
                    )
            })
    };
    for node in conn.cache.nodes.state() {
        if let Some(id) = node_registration::provider_id_to_stamp(&node, owned) {
            let nodes: Api<Node> = Api::all(conn.client.clone());
            let patch = json!({"spec": {"providerID": id}});
            nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
            tracing::info!(cluster = %conn.key, node = %node.name_any(), provider_id = %id, "stamped provider ID");
        }
    }
    Ok(())
}

async fn launch_claim(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    mut status: NodeClaimStatus,
    now: Timestamp,
) -> Result<Action, Error> {
    let observed = c.obj.metadata.generation;
    if conditions::get(&status.conditions, LAUNCHED).is_none() {
        conditions::set(&mut status.conditions, LAUNCHED, UNKNOWN, "Launching", "", observed, now);
        write_status(c, status.clone()).await?;
    }
    if conditions::age(&status.conditions, LAUNCHED, now).is_some_and(|a| a >= hub.settings.launch_ttl) {
        tracing::warn!(cluster = %c.key, nodeclaim = %c.name, reason = "launch_timeout", "claim did not launch in time; deleting it");
        hub.metrics.nodeclaims_disrupted.get(&c.disrupted("launch_timeout")).inc();
        hub.record_registration(&c.ns, &c.pool().nodepool, false);
        hub.event(
            &c.reference(),
            true,
            "LaunchTimeout",
            "Delete",
            format!("not launched within {:?}", hub.settings.launch_ttl),
        )
        .await;
        c.api.delete(&c.name, &DeleteParams::default()).await?;
        return Ok(Action::await_change());
    }
    match try_launch(c, hub, conn, now).await {
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
            c.api
                .patch(&c.name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": labels_patch}})))
                .await?;
            status.provider_id = Some(ownership::provider_id(&group));
            status.capacity = Some(to_map(&instance_type.capacity));
            status.allocatable = Some(to_map(&instance_type.allocatable));
            conditions::set(&mut status.conditions, LAUNCHED, TRUE, "Launched", "", observed, now);
            conditions::set(
                &mut status.conditions,
                REGISTERED,
                UNKNOWN,
                "NodeNotFound",
                "node not registered with cluster",
                observed,
                now,
            );
            write_status(c, status).await?;
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
            c.api.delete(&c.name, &DeleteParams::default()).await?;
            Ok(Action::await_change())
        }
        Err(Failure::Launch(e @ LaunchError::Conflict { .. })) => {
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, message = %e, "launch conflict");
            hub.event(&c.reference(), true, "NodeGroupConflict", "Launch", e.to_string()).await;
            conditions::set(
                &mut status.conditions,
                LAUNCHED,
                UNKNOWN,
                "NodeGroupConflict",
                &e.to_string(),
                observed,
                now,
            );
            write_status(c, status).await?;
            Ok(Action::requeue(Duration::from_secs(60)))
        }
        Err(Failure::Pending(why)) => Ok(Action::requeue(why)),
        Err(Failure::Kube(e)) => {
            conditions::set(&mut status.conditions, LAUNCHED, UNKNOWN, "LaunchFailed", &e.to_string(), observed, now);
            write_status(c, status).await?;
            Err(Error::Kube(e))
        }
    }
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
    Kube(kube::Error),
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure::Kube(e)
    }
}

/// The instance types a node class offers: the built-in catalogue with its FlavorCatalog merged on,
/// or the built-in alone while the reference dangles or the catalogue is refused (clever-cloud.md
/// §5; the FlavorCatalog and node class controllers report it). Errors only when it cannot be read.
pub async fn instance_types(hub: &Hub, ns: &str, class: &CleverNodeClass) -> Result<Vec<InstanceType>, String> {
    let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
    let found = match reference {
        None => None,
        Some(name) => Api::<FlavorCatalog>::namespaced(hub.mgmt.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading FlavorCatalog {ns}/{name}: {e}"))?,
    };
    let (catalog, _problem) = crds::catalog::served(&Catalog::builtin(), reference, found.as_ref());
    Ok(catalog.instance_types(&hub.settings.zone))
}

async fn try_launch(c: &Claim<'_>, hub: &Hub, conn: &Connection, now: Timestamp) -> Result<Launched, Failure> {
    let class_name = &c.obj.spec.node_class_ref.name;
    let classes: Api<CleverNodeClass> = Api::namespaced(hub.mgmt.clone(), &c.ns);
    let Some(class) = classes.get_opt(class_name).await? else {
        return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
            "CleverNodeClass {}/{class_name} does not exist",
            c.ns
        ))));
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
    let types =
        instance_types(hub, &c.ns, &class).await.map_err(|e| Failure::Launch(LaunchError::InsufficientCapacity(e)))?;
    let group_name = ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name);
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    // CKE's quota engine judges concurrent creations together (clever-cloud.md §3.4 step 5): one
    // NodeGroup of a cluster awaits its verdict at a time. Held until the verdict below.
    let gate = hub.launch_gate(&c.key);
    let _one_at_a_time = gate.lock_owned().await;
    // Waiting may have outlived the claim, and the controller's copy may lag: re-read it live, so a
    // claim already deleted never creates (or re-judges) a group.
    match c.api.get_opt(&c.name).await? {
        Some(live) if live.uid() == c.obj.uid() && live.metadata.deletion_timestamp.is_none() => {}
        _ => return Err(Failure::Pending(Duration::from_secs(1))),
    }
    // Read after the wait: a refusal judged meanwhile must be seen by this launch.
    let capacity = hub.capacity(&c.key).await?;
    let existing = groups.get_opt(&group_name).await?;
    let (flavor, group) = match existing {
        Some(g) if g.is_terminating() => {
            // Ours being deleted (a refusal handled by an earlier pass): nothing to adopt.
            return Err(Failure::Launch(LaunchError::InsufficientCapacity(format!(
                "NodeGroup {group_name} is being deleted"
            ))));
        }
        Some(g) => {
            // A restart after the create: adopt only our own group, described by its own flavor.
            let flavor = launch::adopt(&g, &hub.settings.hub_id, &c.ns, c.obj).map_err(Failure::Launch)?;
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
            let created = match hub
                .metrics
                .cloudprovider(&c.key, "create", groups.create(&PostParams::default(), &desired))
                .await
            {
                Ok(g) => g,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let Some(g) = groups.get_opt(&group_name).await? else {
                        return Err(Failure::Pending(Duration::from_secs(1)));
                    };
                    launch::adopt(&g, &hub.settings.hub_id, &c.ns, c.obj).map_err(Failure::Launch)?;
                    g
                }
                Err(e) => return Err(e.into()),
            };
            tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, price = choice.offering.price_hourly, "created NodeGroup; awaiting CKE's verdict");
            (flavor, created)
        }
    };
    // Wait for the verdict by watch, with a deadline; then go on optimistically.
    let verdict = match group.verdict() {
        Verdict::Pending => {
            let uid = group.uid().unwrap_or_default();
            let settled = |g: Option<&NodeGroup>| {
                g.is_none_or(|g| g.uid().as_deref() != Some(uid.as_str()) || g.verdict() != Verdict::Pending)
            };
            match tokio::time::timeout(
                hub.settings.verdict_timeout,
                await_condition(groups.clone(), &group_name, settled),
            )
            .await
            {
                Ok(Ok(Some(g))) => Some(g.verdict()),
                Ok(Ok(None)) => None,
                Ok(Err(e)) => {
                    tracing::debug!(cluster = %c.key, error = %e, "watching the NodeGroup verdict failed");
                    Some(Verdict::Pending)
                }
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
            if groups.get_opt(&group_name).await?.is_none() {
                hub.update_capacity(&c.key, now, |s| s.record_vanish(&flavor, now, hub.settings.capacity)).await?;
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
            .await?;
            // The rejected group frees nothing; delete it now (never a group still in its first reconcile).
            let dp = ownership::delete_exactly(&group);
            if let Err(e) = hub.metrics.cloudprovider(&c.key, "delete", groups.delete(&group_name, &dp)).await {
                tracing::debug!(cluster = %c.key, nodegroup = %group_name, error = %e, "deleting the rejected NodeGroup failed; GC will retry");
            }
            tracing::warn!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, flavor = %flavor, message = %message, "CKE refused the NodeGroup for quota; flavor cooling down");
            Err(Failure::Launch(LaunchError::InsufficientCapacity(format!("CKE refused flavor {flavor}: {message}"))))
        }
        Some(Verdict::Failed { message, .. }) => Err(Failure::Kube(kube::Error::Service(
            format!("CKE failed to reconcile NodeGroup {group_name}: {}", message.unwrap_or_default()).into(),
        ))),
        Some(Verdict::Accepted | Verdict::Pending) => {
            Ok(Launched { flavor, offering_zone: zone, capacity_type: "on-demand".into(), instance_type: it })
        }
    }
}

/// Release the hub's finalizer on the Nodes of a NodeGroup that is going (clever-cloud.md §3.6:
/// waiting for the group to disappear first deadlocks with CKE's own finalizer). Used by
/// termination and by garbage collection after it reaps an orphan.
pub async fn release_node_finalizers(conn: &Connection, group_name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(conn.client.clone());
    for node in conn.cache.nodes.state() {
        let ours = node.labels().get(labels::CLEVER_NODEGROUP).map(String::as_str) == Some(group_name)
            || node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
                == Some(ownership::provider_id(group_name).as_str());
        if ours && node.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER) {
            let patch = with_finalizer(node.as_ref(), false);
            match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                // Gone or changed meanwhile: the next pass sees the new state.
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Whether a launched claim's NodeGroup is gone: absent from the cache *and* from an uncached read
/// (clever-cloud.md §3.7: a group whose labels were stripped is never read as vanished), or
/// terminating without the claim being deleted.
async fn instance_gone(hub: &Hub, conn: &Connection, group: &str) -> Result<bool, Error> {
    if group.is_empty() {
        return Ok(false);
    }
    if conn.cache.nodegroups.state().iter().any(|g| g.name_any() == group && !g.is_terminating()) {
        return Ok(false);
    }
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    let live = hub.metrics.cloudprovider(&conn.key, "get", groups.get_opt(group)).await?;
    Ok(live.is_none_or(|g| g.is_terminating()))
}

/// The claim's NodeGroup went away without the hub deleting it. Before registration it is a
/// vanish (clever-cloud.md §3.7): counted, cool-down armed, event; either way the claim is deleted
/// so its pods are re-planned at once instead of at the registration timeout.
async fn instance_lost(
    c: &Claim<'_>,
    hub: &Hub,
    status: NodeClaimStatus,
    group: &str,
    now: Timestamp,
) -> Result<Action, Error> {
    if conditions::is_true(&status.conditions, REGISTERED) {
        tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group, "instance gone: NodeGroup and Node are gone; deleting the claim");
    } else {
        let flavor = c.obj.labels().get(labels::INSTANCE_TYPE).cloned().unwrap_or_default();
        if !flavor.is_empty() {
            hub.update_capacity(&c.key, now, |s| s.record_vanish(&flavor, now, hub.settings.capacity)).await?;
        }
        Metrics::inc(&hub.metrics.vanished, &c.key);
        tracing::warn!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group, flavor = %flavor, "NodeGroupVanished: the NodeGroup disappeared before its node registered; deleting the claim so its pods are re-planned");
        hub.event(
            &c.reference(),
            true,
            "NodeGroupVanished",
            "Register",
            format!("NodeGroup {group} disappeared before its node registered; the claim is replaced"),
        )
        .await;
    }
    c.api.delete(&c.name, &DeleteParams::default()).await?;
    Ok(Action::await_change())
}

/// A merge patch adding or removing the termination finalizer, guarded by the object's
/// resourceVersion so a concurrent change to the list makes it fail and retry instead of being lost.
fn with_finalizer<K: Resource>(obj: &K, present: bool) -> serde_json::Value {
    let mut finalizers: Vec<String> =
        obj.finalizers().iter().filter(|f| *f != labels::TERMINATION_FINALIZER).cloned().collect();
    if present {
        finalizers.push(labels::TERMINATION_FINALIZER.to_string());
    }
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}})
}

fn to_map(r: &Resources) -> std::collections::BTreeMap<String, Quantity> {
    r.to_resource_list()
}

/// Deletion: delete the NodeGroup (terminating counts as gone), release the Node's finalizer once
/// the group is going, then the claim's. Nothing is orphaned: the claim stays until its group is
/// gone or terminating.
async fn terminate(c: &Claim<'_>, hub: &Hub) -> Result<Action, Error> {
    if !c.obj.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER) {
        return Ok(Action::await_change());
    }
    let Some(conn) = hub.registry.connection(&c.key).filter(|c| c.is_synced()) else {
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // karpenter-semantics §5.1.1: the deadline, written once.
    let annotation = c.obj.annotations().get(labels::TERMINATION_TIMESTAMP).cloned();
    match termination::deadline_to_write(
        c.obj.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        c.obj.spec.termination_grace_period.as_deref(),
        annotation.as_deref(),
    ) {
        Ok(Some(deadline)) => {
            let patch = json!({"metadata": {"annotations": {labels::TERMINATION_TIMESTAMP: deadline.to_string()}}});
            c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            hub.event(
                &c.reference(),
                false,
                "TerminationGracePeriodSet",
                "Terminate",
                format!("pods left on the node at {deadline} are deleted regardless of budgets"),
            )
            .await;
            // The annotation change wakes the next pass, which reads it back.
            return Ok(Action::await_change());
        }
        Ok(None) => {}
        Err(why) => {
            hub.event(&c.reference(), true, "InvalidTerminationGracePeriod", "Terminate", why).await;
        }
    }
    let deadline = termination::parse_deadline(annotation.as_deref());
    // Unregistered claims never drain (§5.1.2, §10.10 item 145); a Node already gone has nothing left.
    let registered = c.obj.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, REGISTERED));
    let provider_id = c.obj.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    let group_name = c
        .obj
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| ownership::parse_provider_id(p).ok().map(str::to_string))
        .unwrap_or_else(|| ownership::nodegroup_name(&hub.settings.hub_id, &c.ns, &c.name));
    let groups: Api<NodeGroup> = Api::all(conn.client.clone());
    if registered && !provider_id.is_empty() {
        let nodes = conn.cache.nodes.state();
        if let NodeMatch::One(node) = node_registration::find_node(nodes.iter().map(|n| n.as_ref()), &provider_id)
            && must_drain(c, hub, &groups, &group_name, node).await?
            && let Some(action) = drain_node(c, hub, &conn, node, deadline).await?
        {
            return Ok(action);
        }
    }
    let gone = match groups.get_opt(&group_name).await? {
        None => true,
        Some(g) if g.is_terminating() => true,
        Some(g) => match ownership::prove(&g, &hub.settings.hub_id, &c.ns) {
            Ownership::Owned { claim, uid }
                if claim == c.name && Some(uid.as_str()) == c.obj.metadata.uid.as_deref() =>
            {
                let dp = ownership::delete_exactly(&g);
                match hub.metrics.cloudprovider(&c.key, "delete", groups.delete(&group_name, &dp)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, "deleting NodeGroup");
                false
            }
            other => {
                let why = match other {
                    Ownership::Refused(w) => w,
                    _ => "it is not this claim's".to_string(),
                };
                hub.event(
                    &c.reference(),
                    true,
                    "NodeGroupConflict",
                    "Terminate",
                    format!("NodeGroup {group_name} was not deleted: {why}"),
                )
                .await;
                // Not ours: never delete it; the claim itself may go.
                true
            }
        },
    };
    if !gone {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // The group is going: release our Node finalizer so CKE's finalizer can delete the Node.
    release_node_finalizers(&conn, &group_name).await?;
    let now = Timestamp::now();
    let mut status = c.obj.status.clone().unwrap_or_default();
    if conditions::set(
        &mut status.conditions,
        INSTANCE_TERMINATING,
        TRUE,
        "InstanceTerminating",
        "",
        c.obj.metadata.generation,
        now,
    ) {
        write_status(c, status).await?;
    }
    match c.api.patch(&c.name, &PatchParams::default(), &Patch::Merge(&with_finalizer(c.obj, false))).await {
        Ok(_) => {
            hub.metrics.nodeclaims_terminated.get(&c.pool()).inc();
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(cluster = %c.key, nodeclaim = %c.name, nodegroup = %group_name, "NodeClaim terminated");
    Ok(Action::await_change())
}

/// Whether the leaving claim's Node is drained (§5.2 step 2, §10.10 item 143): not when it is
/// NotReady and its NodeGroup is NotFound (an uncached read, only made for a NotReady Node): the
/// instance is gone, nothing would finish an eviction, the claim is released at once.
async fn must_drain(
    c: &Claim<'_>,
    hub: &Hub,
    groups: &Api<NodeGroup>,
    group_name: &str,
    node: &Node,
) -> Result<bool, Error> {
    let ready = termination::node_ready(node);
    if ready {
        return Ok(true);
    }
    let group = match hub.metrics.cloudprovider(&c.key, "get", groups.get_opt(group_name)).await? {
        None => termination::GroupState::NotFound,
        Some(g) if g.is_terminating() => termination::GroupState::Terminating,
        Some(_) => termination::GroupState::Present,
    };
    let drain = termination::must_drain(ready, group);
    if !drain {
        tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), nodegroup = %group_name, "node is NotReady and its NodeGroup is gone; releasing the claim without a drain");
        hub.event(
            &c.reference(),
            false,
            termination::DRAIN_SKIPPED,
            "Terminate",
            format!("node {} is NotReady and NodeGroup {group_name} is gone: no pod evicted", node.name_any()),
        )
        .await;
    }
    Ok(drain)
}

/// Eviction refusals per pod (cluster, namespace, name, UID): how many so far and when the next
/// attempt may go. In memory on purpose: after a restart the first attempt simply comes sooner.
type Refusals = std::collections::HashMap<(String, PodRef), (u32, std::time::Instant)>;
static EVICTION_REFUSALS: std::sync::LazyLock<std::sync::Mutex<Refusals>> = std::sync::LazyLock::new(Default::default);

fn refusals() -> std::sync::MutexGuard<'static, Refusals> {
    EVICTION_REFUSALS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Drain the claim's Node (karpenter-semantics §5.2–5.4): taint and label it, mark the claim
/// `Drained=Unknown(Draining)`, carry out one pass of [`termination::decide`], and once complete
/// set `Drained=True`. Returns the action while draining, `None` once drained (the caller then
/// deletes the NodeGroup). Every write is idempotent; the state lives in the API (taint, label,
/// condition, the pods), so a restarted hub resumes where it was.
async fn drain_node(
    c: &Claim<'_>,
    hub: &Hub,
    conn: &Connection,
    node: &Node,
    deadline: Option<Timestamp>,
) -> Result<Option<Action>, Error> {
    let mut status = c.obj.status.clone().unwrap_or_default();
    if conditions::is_true(&status.conditions, termination::DRAINED) {
        return Ok(None);
    }
    let node_name = node.name_any();
    let nodes: Api<Node> = Api::all(conn.client.clone());
    let tainted = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT && t.effect == "NoSchedule" && t.value.is_none())
    });
    let labelled =
        node.labels().get(labels::EXCLUDE_FROM_LB).map(String::as_str) == Some(termination::EXCLUDE_FROM_LB_VALUE);
    if !tainted || !labelled {
        // Overwrite any taint of that key; the resourceVersion makes a concurrent change retry.
        let mut taints: Vec<Taint> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.retain(|t| t.key != labels::DISRUPTED_TAINT);
        taints.push(Taint { key: labels::DISRUPTED_TAINT.into(), effect: "NoSchedule".into(), ..Taint::default() });
        let patch = json!({
            "metadata": {
                "labels": {labels::EXCLUDE_FROM_LB: termination::EXCLUDE_FROM_LB_VALUE},
                "resourceVersion": node.resource_version(),
            },
            "spec": {"taints": taints},
        });
        match nodes.patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            // Gone meanwhile: nothing left to drain.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node_name, "node tainted karpenter.sh/disrupted; draining");
    }
    let now = Timestamp::now();
    let started = conditions::get(&status.conditions, termination::DRAINED)
        .filter(|d| d.status == UNKNOWN && d.reason == termination::DRAINING)
        .map(|d| d.last_transition_time.0);
    if started.is_none() {
        conditions::set(
            &mut status.conditions,
            termination::DRAINED,
            UNKNOWN,
            termination::DRAINING,
            "",
            c.obj.metadata.generation,
            now,
        );
        write_status(c, status).await?;
        // The status change wakes the next pass, which reads when draining began back.
        return Ok(Some(Action::requeue(termination::DRAIN_REQUEUE)));
    }
    // The cache holds every pod of the workload cluster (trimmed); those bound to this node.
    let pods: Vec<PodFacts> = conn
        .cache
        .pods
        .state()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str()))
        .map(|p| PodFacts::from_pod(p))
        .collect();
    let decision = termination::decide(&pods, deadline, started, now);
    carry_out(c, hub, conn, node, &decision).await;
    if !decision.complete {
        return Ok(Some(Action::requeue(decision.requeue.unwrap_or(termination::DRAIN_REQUEUE))));
    }
    conditions::set(&mut status.conditions, termination::DRAINED, TRUE, "Drained", "", c.obj.metadata.generation, now);
    write_status(c, status).await?;
    hub.metrics.nodes_drained.get(&c.pool()).inc();
    tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node_name, "node drained");
    // The next pass reads Drained=True back and deletes the NodeGroup (writing from this stale
    // copy of the claim would undo the condition).
    Ok(Some(Action::requeue(Duration::from_millis(100))))
}

/// The writes of one drain pass: forced deletions, then evictions (each with a UID precondition).
/// Failures are reported and retried by the next pass, never fatal to it.
async fn carry_out(c: &Claim<'_>, hub: &Hub, conn: &Connection, node: &Node, decision: &Decision) {
    let node_ref = node.object_ref(&());
    let pod_ref = |p: &PodRef| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(p.namespace.clone()),
        name: Some(p.name.clone()),
        uid: Some(p.uid.clone()),
        ..ObjectReference::default()
    };
    let exactly = |p: &PodRef| Some(Preconditions { uid: Some(p.uid.clone()), resource_version: None });
    let reason = "Forceful Termination";
    for (p, grace) in &decision.force {
        let pods: Api<Pod> = Api::namespaced(conn.client.clone(), &p.namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(u32::try_from(*grace).unwrap_or(u32::MAX)),
            preconditions: exactly(p),
            ..DeleteParams::default()
        };
        match pods.delete(&p.name, &dp).await {
            Ok(_) => {
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, pod = %p, grace_seconds = grace, "termination grace period reached; pod deleted");
                hub.metrics.pods_drained.get(&c.disrupted(reason)).inc();
                let note = format!("deleted with a grace period of {grace}s: the node's termination grace period ends");
                hub.workload_event(
                    &conn.client,
                    &pod_ref(p),
                    crate::infra::hub::event(true, "ForceDeleted", "Delete", note),
                    crate::infra::hub::EVENT_DEDUPE,
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(cluster = %c.key, nodeclaim = %c.name, pod = %p, error = %e, "deleting a pod at the termination deadline failed; retrying");
            }
        }
    }
    let now = std::time::Instant::now();
    // Entries not refreshed for a minute belong to pods that went some other way (a refused pod is
    // retried every 10 s at most).
    refusals().retain(|_, (_, next)| *next + Duration::from_secs(60) > now);
    for p in &decision.evict {
        let key = (c.key.to_string(), p.clone());
        if refusals().get(&key).is_some_and(|(_, next)| *next > now) {
            continue;
        }
        let result = evict_exactly(&conn.evictions, p).await;
        let code = match &result {
            Ok(_) => 200,
            Err(kube::Error::Api(s)) => s.code,
            Err(_) => 0,
        };
        hub.metrics
            .eviction_requests
            .get(&crate::infra::metrics::ResultLabels { cluster: c.key.to_string(), result: code.to_string() })
            .inc();
        match result {
            Ok(_) => {
                refusals().remove(&key);
                tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), pod = %p, "pod evicted");
                hub.metrics.pods_drained.get(&c.disrupted(reason)).inc();
                let note = format!("evicted from node {} (NodeClaim {})", node.name_any(), c.name);
                hub.workload_event(
                    &conn.client,
                    &pod_ref(p),
                    crate::infra::hub::event(false, termination::EVICTED, "Evict", note),
                    crate::infra::hub::EVENT_DEDUPE,
                )
                .await;
            }
            // Already gone, or a newer pod of that name: done with this one.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                refusals().remove(&key);
            }
            // A PodDisruptionBudget refuses (429), or the pod has more than one (500 with that message).
            Err(kube::Error::Api(s)) if s.code == 429 || s.message.contains("more than one PodDisruptionBudget") => {
                let failures = {
                    let mut r = refusals();
                    let entry = r.entry(key).or_insert((0, now));
                    entry.0 = entry.0.saturating_add(1);
                    entry.1 = now + termination::eviction_backoff(entry.0);
                    entry.0
                };
                let note = format!("cannot evict pod {p}: {}", s.message);
                if hub
                    .workload_event(
                        &conn.client,
                        &node_ref,
                        crate::infra::hub::event(true, termination::FAILED_DRAINING, "Drain", note),
                        crate::infra::hub::EVENT_DEDUPE,
                    )
                    .await
                {
                    tracing::info!(cluster = %c.key, nodeclaim = %c.name, node = %node.name_any(), pod = %p, failures, message = %s.message, "eviction refused; backing off");
                }
            }
            Err(e) => {
                tracing::warn!(cluster = %c.key, nodeclaim = %c.name, pod = %p, error = %e, "eviction failed; retrying");
            }
        }
    }
}

/// POST an Eviction for exactly this pod (UID precondition), so a PodDisruptionBudget is honoured
/// and a newer pod of the same name is never hit. Written out rather than through kube's
/// `Api::evict`, whose body names the field `delete_options` where the API expects
/// `deleteOptions`: the server drops it, and the precondition with it.
pub async fn evict_exactly(client: &kube::Client, p: &PodRef) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let eviction = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": p.name, "namespace": p.namespace},
        "deleteOptions": {"preconditions": {"uid": p.uid}},
    });
    pods.create_subresource::<_, serde_json::Value>("eviction", &p.name, &PostParams::default(), &eviction).await?;
    Ok(())
}
