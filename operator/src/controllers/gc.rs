//! The garbage-collection sweep: applies the rules of [`crate::decisions::garbage`] to every connected, synced
//! cluster every period (2 min) and whenever a cluster's state changes. Each candidate is re-read
//! live before anything is deleted, every delete carries a UID precondition, and the brake
//! ([`crate::decisions::garbage::Brake`]) bounds what one sweep deletes, or halts it. A reaped group
//! whose node registered is recorded as freeing capacity, as a claim's termination records its own.
//! A group moved with its claim from the management cluster the registration declares
//! ([`crate::decisions::handover`]) is re-stamped as this management cluster's once its claim is here.
//!
//! Must not: sweep a cluster whose list of claims failed, delete past the brake, or stop a sweep
//! because one object failed.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use tokio_util::sync::CancellationToken;

use crate::decisions::garbage::{
    BrakeVerdict, ClaimFacts, ClusterView, LiveClaim, LiveGroup, Verdict, is_vanish_candidate, judge_orphan,
    judge_vanished, orphan_candidates,
};
use crate::{
    decisions::conditions,
    decisions::handover,
    decisions::lifecycle::{LAUNCHED, REGISTERED},
    decisions::ownership::{self, Ownership},
    infra::apierror::plain,
    infra::hub::{EVENT_DEDUPE, EVENT_DEDUPE_LONG, Hub},
    infra::metrics::Metrics,
    infra::registry::{ClusterKey, Connection},
};
use crds::{NodeClaim, NodeGroup, labels};

/// Why a sweep did nothing.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("the management cache of NodeClaims has not synced yet")]
    NotSynced,
}

/// What one sweep of one cluster did (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub groups_collected: Vec<String>,
    pub claims_collected: Vec<String>,
    pub refused: Vec<String>,
    pub foreign: usize,
    /// Groups of the management cluster the registration declares a move from, not re-stamped
    /// when the sweep began.
    pub moved: usize,
    /// Moved groups re-stamped by this sweep (their claims came across).
    pub restamped: Vec<String>,
    pub resized: Vec<String>,
    /// Orphans left for a later sweep by the per-sweep cap.
    pub deferred: usize,
    /// The brake halted the sweep: this many orphans were found and none deleted.
    pub halted: Option<usize>,
}

pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut changes = hub.registry.changes();
    let period = hub.settings.gc_period;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One sweep in flight per cluster, each in its own task: a hung cluster (reads waiting on
    // kube's 295 s read timeout) must not hold back the others' sweeps (hub.md §3 "Isolation").
    let mut in_flight: BTreeMap<ClusterKey, tokio::task::JoinHandle<()>> = BTreeMap::new();
    loop {
        // The period counts on the hub's clock too: a test moving a manual clock past it (an orphan
        // the last sweep found too young is old enough now) gets its sweep without waiting for the
        // wall clock. Not on every move of the clock: a sweep reads the workload cluster live.
        let on_clock = async {
            if hub.settings.clock.is_manual() {
                hub.settings.clock.sleep(period).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { break },
            () = on_clock => {}
        }
        in_flight.retain(|_, h| !h.is_finished());
        for key in hub.registry.clusters() {
            if in_flight.contains_key(&key) {
                continue;
            }
            let Some(conn) = hub.registry.connection(&key).filter(|c| c.is_synced()) else { continue };
            let (hub, stop) = (hub.clone(), shutdown.clone());
            let task_key = key.clone();
            let handle = tokio::spawn(async move {
                let key = task_key;
                let sweep = tokio::time::timeout(period, sweep(&hub, &conn, &key, hub.now()));
                tokio::select! {
                    () = stop.cancelled() => {}
                    r = sweep => match r {
                        Ok(Ok(o)) if o != Outcome::default() => tracing::info!(
                            cluster = %key,
                            nodegroups_collected = %o.groups_collected.join(", "),
                            nodeclaims_collected = %o.claims_collected.join(", "),
                            refused = %o.refused.join(", "),
                            foreign = o.foreign,
                            resized = %o.resized.join(", "),
                            deferred = o.deferred,
                            halted = o.halted.unwrap_or_default(),
                            "garbage collection sweep"
                        ),
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::warn!(cluster = %key, error = %e, "garbage collection skipped"),
                        Err(_) => tracing::warn!(cluster = %key, "garbage collection sweep gave up after {} s; the cluster is slow or hung", period.as_secs()),
                    },
                }
            });
            in_flight.insert(key, handle);
        }
    }
    for (_, h) in in_flight {
        h.abort();
    }
}

/// One sweep of one cluster. Errors (and does nothing) while the management cache of NodeClaims
/// has not listed once: missing data is never evidence of absence.
pub async fn sweep(hub: &Hub, conn: &Connection, key: &ClusterKey, now: Timestamp) -> Result<Outcome, SweepError> {
    let mut out = Outcome::default();
    let hub_id = &hub.settings.hub_id;
    let moved_from = hub.registry.moved_from(key);
    let owner = hub.settings.owner().moved_from(moved_from.as_deref());
    if !hub.cache.is_ready() {
        return Err(SweepError::NotSynced);
    }
    let claims_api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    // The cache narrows the candidates; every absence is confirmed by a live read below.
    let claims: Vec<Arc<NodeClaim>> = hub.cache.claims_in(&key.namespace);
    let view =
        ClusterView { connected: true, synced: conn.is_synced(), lists_ok: true, min_age: hub.settings.gc_min_age };
    let by_name: BTreeMap<String, &NodeClaim> = claims.iter().map(|c| (c.name_any(), c.as_ref())).collect();
    let groups: Vec<NodeGroup> = conn.cache.nodegroups.state().iter().map(|g| g.as_ref().clone()).collect();
    let groups_api: Api<NodeGroup> = Api::all(conn.client.clone());

    // The brake's population: groups carrying this hub's and namespace's labels, not going.
    let mut labelled = 0;
    for g in &groups {
        let proof = ownership::prove(g, owner, &key.namespace);
        if proof.is_labelled_ours() && !g.is_terminating() {
            labelled += 1;
        }
        match proof {
            Ownership::Foreign => out.foreign += 1,
            Ownership::Moved { .. } => out.moved += 1,
            Ownership::Owned { .. } | Ownership::Legacy { .. } if g.spec.node_count != 1 => {
                out.resized.push(g.name_any())
            }
            _ => {}
        }
    }
    let m = &hub.metrics;
    Metrics::set(&m.unmanaged, key, out.foreign as i64);
    Metrics::set(&m.awaiting_handover, key, out.moved as i64);
    Metrics::set(&m.external_resizes, key, out.resized.len() as i64);
    let now_capacity = hub.capacity(key).await.map(|s| s.unavailable(now).count()).unwrap_or_default();
    Metrics::set(&m.cooldown_flavors, key, now_capacity as i64);
    // clever-cloud.md §3.9: another Karpenter (the in-cluster provider) also manages this cluster.
    for g in groups.iter().filter(|g| {
        g.labels().get(labels::IN_CLUSTER_MANAGED).map(String::as_str) == Some("true")
            && matches!(ownership::prove(g, owner, &key.namespace), Ownership::Foreign)
    }) {
        let note = format!(
            "NodeGroup {} is managed by the in-cluster Karpenter provider ({}=true): two autoscalers on one cluster fight over capacity; the hub never touches it",
            g.name_any(),
            labels::IN_CLUSTER_MANAGED
        );
        // Only on the group: its pool labels name another autoscaler's pools, not ours.
        let ev = crate::infra::hub::event(true, "ForeignAutoscalerDetected", "GarbageCollect", note.clone());
        if hub.workload_event(&conn.client, &nodegroup_ref(g), ev, EVENT_DEDUPE_LONG).await {
            tracing::warn!(cluster = %key, nodegroup = %g.name_any(), "ForeignAutoscalerDetected: {note}");
        }
    }
    for g in groups.iter().filter(|g| out.resized.contains(&g.name_any())) {
        let note = format!(
            "NodeGroup {} has nodeCount {} instead of 1: check the cluster's autoscalingEnabled and who holds nodegroups/scale; the hub never scales it back and does not track its extra nodes",
            g.name_any(),
            g.spec.node_count
        );
        if report(hub, conn, g, true, "NodeGroupExternallyResized", note.clone(), EVENT_DEDUPE_LONG).await {
            tracing::warn!(cluster = %key, nodegroup = %g.name_any(), node_count = g.spec.node_count, "NodeGroupExternallyResized: {note}");
        }
    }

    let cached_uid = |name: &str| by_name.get(name).and_then(|c| c.metadata.uid.clone());
    let candidates = orphan_candidates(view, &groups, owner, &key.namespace, now, cached_uid);
    // Judge every candidate first, delete after: the brake weighs the whole sweep.
    let mut collectable: Vec<(NodeGroup, String)> = Vec::new();
    for (cached, _) in candidates {
        let name = cached.name_any();
        // Re-read both live: the cache may lag, and labels may have changed.
        let live = match groups_api.get_opt(&name).await {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(cluster = %key, nodegroup = %name, error = %plain(&e), "live read failed; kept");
                continue;
            }
        };
        if live.is_terminating() {
            continue;
        }
        let proof = ownership::prove(&live, owner, &key.namespace);
        let claim = match &proof {
            Ownership::Owned { claim, .. } | Ownership::Legacy { claim, .. } | Ownership::Moved { claim, .. } => {
                match claims_api.get_opt(claim).await {
                    Ok(None) => LiveClaim::Absent,
                    Ok(Some(c)) => LiveClaim::Present { uid: c.metadata.uid.unwrap_or_default() },
                    Err(_) => LiveClaim::Unknown,
                }
            }
            _ => LiveClaim::Unknown,
        };
        match judge_orphan(view, &proof, &claim) {
            Verdict::Collect { why } => collectable.push((live, why)),
            Verdict::Refuse { why } => {
                let note = format!(
                    "NodeGroup {name} carries this hub's labels but fails the ownership proof ({why}); kept, never deleted: remove the labels or delete it by hand"
                );
                if report(hub, conn, &live, true, "GarbageCollectionRefused", note, EVENT_DEDUPE_LONG).await {
                    tracing::warn!(cluster = %key, nodegroup = %name, why = %why, "GarbageCollectionRefused: NodeGroup carries this hub's labels but fails the ownership proof; kept");
                }
                out.refused.push(name);
            }
            Verdict::Restamp { claim_uid } => {
                // Not a deletion: the brake does not weigh it. Guarded by the version proven.
                let patch = handover::restamp(
                    &hub.settings.management_cluster,
                    &claim_uid,
                    live.metadata.resource_version.as_deref().unwrap_or_default(),
                );
                match groups_api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        tracing::info!(cluster = %key, nodegroup = %name, moved_from = ?moved_from, "took over the NodeGroup moved with its NodeClaim from the management cluster the registration names; re-stamped as this management cluster's");
                        out.restamped.push(name);
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %key, nodegroup = %name, error = %plain(&e), "re-stamping a moved NodeGroup failed (on 403: re-run `karpenter-hub register` so the workload identity may patch NodeGroups); it stays its claim's by the declared move; next sweep retries")
                    }
                }
            }
            Verdict::Keep => {}
        }
    }
    let allowed = match hub.settings.gc_brake.judge(collectable.len(), labelled) {
        BrakeVerdict::Halt { would, of } => {
            halt(hub, key, would, of).await;
            out.halted = Some(would);
            0
        }
        BrakeVerdict::Proceed { now } => {
            if hub.set_gc_halt(key, None) {
                tracing::info!(cluster = %key, "garbage collection resumed: the orphans found are within the brake's share");
            }
            now
        }
    };
    out.deferred = collectable.len().saturating_sub(allowed);
    for (live, why) in collectable.into_iter().take(allowed) {
        let name = live.name_any();
        let dp = ownership::delete_exactly(&live);
        match groups_api.delete(&name, &dp).await {
            Ok(_) => {
                tracing::info!(cluster = %key, nodegroup = %name, why = %why, "GarbageCollected: deleted orphaned NodeGroup");
                Metrics::inc(&m.gc_reaped, key);
                // A group whose node registered frees capacity once gone (clever-cloud.md
                // §3.5), as a claim's own termination records it: no claim is left to.
                if conn.cache.nodes.state().iter().any(|n| ownership::is_node_of(n, &name)) {
                    match hub.release_capacity(key, &name, false, now).await {
                        Ok(true) => {
                            tracing::info!(cluster = %key, nodegroup = %name, "a reaped NodeGroup whose node registered is going: the flavor cool-downs and the creation back-off end when it is gone")
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(cluster = %key, nodegroup = %name, error = %plain(&e), "recording the reaped group as freeing capacity failed")
                        }
                    }
                }
                // No claim is left to terminate it: free its Node for CKE, or it hangs.
                if let Err(e) = crate::infra::finalizers::release_from_nodes(conn, &name).await {
                    tracing::warn!(cluster = %key, nodegroup = %name, error = %crate::infra::apierror::plain(&e), "releasing the reaped group's node finalizer failed; the next sweep retries");
                }
                let note = format!("deleted orphaned NodeGroup {name}: {why}");
                let _ = report(hub, conn, &live, false, "GarbageCollected", note, EVENT_DEDUPE).await;
                out.groups_collected.push(name);
            }
            Err(e) => {
                tracing::warn!(cluster = %key, nodegroup = %name, error = %plain(&e), "deleting orphaned NodeGroup failed")
            }
        }
    }
    if out.deferred > 0 {
        tracing::info!(cluster = %key, deferred = out.deferred, max_per_sweep = hub.settings.gc_brake.max_per_sweep, "more orphaned NodeGroups than one sweep deletes; the next sweep goes on");
    }

    release_stuck_nodes(conn, owner, &groups, &claims).await;

    for c in claims.iter().filter(|c| c.spec.cluster_name == key.name) {
        let conds = c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let facts = ClaimFacts {
            deleting: c.metadata.deletion_timestamp.is_some(),
            launched: conditions::is_true(conds, LAUNCHED),
            registered: conditions::is_true(conds, REGISTERED),
            clever: c.spec.node_class_ref.kind == labels::NODECLASS_KIND
                && c.spec.node_class_ref.group == labels::GROUP,
            created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
        };
        if !is_vanish_candidate(view, &facts, now) {
            continue;
        }
        let group = c
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| ownership::parse_provider_id(p).ok().map(str::to_string))
            .unwrap_or_else(|| ownership::nodegroup_name(hub_id, &key.namespace, &c.name_any()));
        let live = match groups_api.get_opt(&group).await {
            Ok(None) => LiveGroup::Absent,
            Ok(Some(_)) => LiveGroup::Present,
            Err(_) => LiveGroup::Unknown,
        };
        if let Verdict::Collect { why } = judge_vanished(view, &live) {
            let name = c.name_any();
            let dp = ownership::delete_exactly(c.as_ref());
            if let Err(e) = claims_api.delete(&name, &dp).await {
                tracing::warn!(cluster = %key, nodeclaim = %name, error = %plain(&e), "deleting vanished claim failed");
                continue;
            }
            let flavor = c.labels().get(labels::INSTANCE_TYPE).cloned().unwrap_or_default();
            if !flavor.is_empty() {
                let policy = hub.settings.capacity;
                if let Err(e) = hub.update_capacity(key, now, |s| s.record_vanish(&flavor, now, policy)).await {
                    tracing::warn!(cluster = %key, error = %plain(&e), "persisting the vanish cool-down failed");
                }
            }
            tracing::warn!(cluster = %key, nodeclaim = %name, nodegroup = %group, why = %why, "NodeGroupVanished: deleted the claim so its pods are re-planned");
            Metrics::inc(&m.vanished, key);
            hub.event(
                &c.object_ref(&()),
                true,
                "NodeGroupVanished",
                "GarbageCollect",
                format!("NodeGroup {group} is gone ({why}); the claim is replaced"),
            )
            .await;
            out.claims_collected.push(name);
        }
    }
    Metrics::set(&m.gc_refused, key, out.refused.len() as i64);
    Ok(out)
}

/// The brake halted a sweep of `key`: nothing was deleted. Say so on the cluster's NodePools (a
/// condition through [`Hub::set_gc_halt`] and an event) and in one warning line.
async fn halt(hub: &Hub, key: &ClusterKey, would: usize, of: usize) {
    let percent = hub.settings.gc_brake.halt_percent;
    let why = format!(
        "garbage collection of cluster {} is halted: {would} of the {of} NodeGroups this hub labelled there look orphaned (their NodeClaims are gone from this management cluster), more than the {percent}% one sweep may delete, so none was deleted. If this management cluster lost its NodeClaims (a restore, a move), bring them back; if the groups really are leaked, delete them by hand or raise --gc-halt-percent",
        key.name
    );
    if hub.set_gc_halt(key, Some(why.clone())) {
        tracing::warn!(cluster = %key, would_delete = would, labelled = of, halt_percent = percent, "GarbageCollectionHalted: too many NodeGroups look orphaned at once; none deleted");
    }
    for pool in hub.cache.pools_in(&key.namespace).iter().filter(|p| p.spec.cluster_name == key.name) {
        hub.event(&pool.object_ref(&()), true, "GarbageCollectionHalted", "GarbageCollect", why.clone()).await;
    }
}

/// An event on a NodeGroup (in the workload cluster's `default` namespace) mirrored onto its
/// NodePool, since management users may not read the workload cluster (clever-cloud.md §8).
async fn report(
    hub: &Hub,
    conn: &Connection,
    group: &NodeGroup,
    warning: bool,
    reason: &str,
    note: String,
    window: Duration,
) -> bool {
    let reference = nodegroup_ref(group);
    let ev = crate::infra::hub::event(warning, reason, "GarbageCollect", note.clone());
    let published = hub.workload_event(&conn.client, &reference, ev, window).await;
    if let Some(pool) = group.labels().get(labels::HUB_NODEPOOL).or_else(|| group.labels().get(labels::NODEPOOL)) {
        let pool_ref = ObjectReference {
            api_version: Some(crds::NodePool::api_version(&()).to_string()),
            kind: Some("NodePool".to_string()),
            namespace: Some(conn.key.namespace.clone()),
            name: Some(pool.clone()),
            ..Default::default()
        };
        hub.event(&pool_ref, warning, reason, "GarbageCollect", format!("cluster {}: {note}", conn.key.name)).await;
    }
    published
}

fn nodegroup_ref(group: &NodeGroup) -> ObjectReference {
    ObjectReference {
        api_version: Some(NodeGroup::api_version(&()).to_string()),
        kind: Some("NodeGroup".to_string()),
        name: group.metadata.name.clone(),
        uid: group.metadata.uid.clone(),
        ..Default::default()
    }
}

/// Nodes being deleted that still carry the hub's finalizer although no claim will ever terminate
/// them (their claim is gone, their owned group going): release the finalizer, or the Node and
/// CKE's NodeGroup wait on each other forever. This also retries a release that failed after a reap.
async fn release_stuck_nodes(
    conn: &Connection,
    owner: ownership::Owner<'_>,
    groups: &[NodeGroup],
    claims: &[Arc<NodeClaim>],
) {
    for node in conn.cache.nodes.state() {
        if node.metadata.deletion_timestamp.is_none()
            || !node.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER)
        {
            continue;
        }
        let Some(group) = ownership::node_group(&node) else { continue };
        // Only our own group, proven by its labels: another Karpenter uses the same finalizer name.
        let group_going = groups.iter().find(|g| g.name_any() == group).is_some_and(|g| {
            g.is_terminating() && matches!(ownership::prove(g, owner, &conn.key.namespace), Ownership::Owned { .. })
        });
        let provider_id = ownership::provider_id(&group);
        let claimed = claims
            .iter()
            .any(|c| c.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id.as_str()));
        if group_going && !claimed {
            match crate::infra::finalizers::release_from_nodes(conn, &group).await {
                Ok(()) => {
                    tracing::info!(cluster = %conn.key, node = %node.name_any(), nodegroup = %group, "released the finalizer of a node no claim owns any more")
                }
                Err(e) => {
                    tracing::warn!(cluster = %conn.key, node = %node.name_any(), error = %crate::infra::apierror::plain(&e), "releasing a stuck node's finalizer failed")
                }
            }
        }
    }
}
