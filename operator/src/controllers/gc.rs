//! The garbage-collection sweep: applies the rules of [`crate::decisions::garbage`] to every connected, synced
//! cluster every period (2 min) and whenever a cluster's state changes. Each candidate is re-read
//! live before anything is deleted, every delete carries a UID precondition, and the brake
//! ([`crate::decisions::garbage::Brake`]) bounds what one sweep deletes, or halts it. A reaped group
//! whose node registered is recorded as freeing capacity, as a claim's termination records its own.
//! A group moved with its claim from the management cluster the registration declares
//! ([`crate::decisions::handover`]) is re-stamped as this management cluster's once its claim is here.
//!
//! Owns: the sweep's I/O: gathering its facts (the caches, then the live re-reads of the candidates
//! the rules name) and carrying out, in its order, the plan [`crate::decisions::garbage::plan_sweep`]
//! makes of them. Must not: decide itself what to report, re-stamp, delete or release (the plan
//! does), sweep a cluster whose list of claims failed, delete past the brake, or stop a sweep
//! because one object failed.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::garbage::{
        self, Candidate, ClusterView, Halt, Judgement, LiveClaim, LiveGroup, Reap, Report, StuckNode, SweepFacts,
        SweepPlan, VanishRead, VanishedClaim,
    },
    decisions::{fleet, ownership},
    infra::apierror::plain,
    infra::hub::{ClusterOwner, EVENT_DEDUPE, EVENT_DEDUPE_LONG, Hub},
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

/// One sweep of one cluster: gather (the caches, then a live re-read of every orphan candidate and
/// of the claim it names, and of every vanish candidate's group), plan
/// ([`garbage::plan_sweep`]), carry the plan out. Errors (and does nothing) while the management
/// cache of NodeClaims has not listed once: missing data is never evidence of absence.
pub async fn sweep(hub: &Hub, conn: &Connection, key: &ClusterKey, now: Timestamp) -> Result<Outcome, SweepError> {
    let who = hub.owner_on(key);
    let owner = who.owner();
    if !hub.cache.is_ready() {
        return Err(SweepError::NotSynced);
    }
    let claims_api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    let groups_api: Api<NodeGroup> = Api::all(conn.client.clone());
    // The cache narrows the candidates; every absence is confirmed by a live read below.
    let claims: Vec<Arc<NodeClaim>> = hub.cache.claims_in(&key.namespace);
    let view =
        ClusterView { connected: true, synced: conn.is_synced(), lists_ok: true, min_age: hub.settings.gc_min_age };
    let by_name: BTreeMap<String, &NodeClaim> = claims.iter().map(|c| (c.name_any(), c.as_ref())).collect();
    let groups: Vec<NodeGroup> = conn.cache.nodegroups.state().iter().map(|g| g.as_ref().clone()).collect();
    let nodes = conn.cache.nodes.state();
    let capacity = hub.capacity(key).await.ok();

    let cached_uid = |name: &str| by_name.get(name).and_then(|c| c.metadata.uid.clone());
    let mut candidates = Vec::new();
    for (cached, _) in garbage::orphan_candidates(view, &groups, owner, &key.namespace, now, cached_uid) {
        let name = cached.name_any();
        // Re-read both live: the cache may lag, and labels may have changed.
        let group = match groups_api.get_opt(&name).await {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(cluster = %key, nodegroup = %name, error = %plain(&e), "live read failed; kept");
                continue;
            }
        };
        if group.is_terminating() {
            continue;
        }
        let proof = ownership::prove(&group, owner, &key.namespace);
        let claim = match garbage::claim_to_read(&proof) {
            Some(claim) => match claims_api.get_opt(claim).await {
                Ok(None) => LiveClaim::Absent,
                Ok(Some(c)) => LiveClaim::Present { uid: c.metadata.uid.unwrap_or_default() },
                Err(_) => LiveClaim::Unknown,
            },
            None => LiveClaim::Unknown,
        };
        candidates.push(Candidate { group, ownership: proof, claim });
    }
    let mut vanish = Vec::new();
    for (claim, group) in garbage::vanish_candidates(view, &claims, owner, &key.namespace, &key.name, now) {
        let live = match groups_api.get_opt(&group).await {
            Ok(None) => LiveGroup::Absent,
            Ok(Some(_)) => LiveGroup::Present,
            Err(_) => LiveGroup::Unknown,
        };
        vanish.push(VanishRead { claim, group, live });
    }

    let plan = garbage::plan_sweep(&SweepFacts {
        view,
        owner,
        namespace: &key.namespace,
        cluster: &key.name,
        groups: &groups,
        claims: &claims,
        nodes: &nodes,
        candidates: &candidates,
        vanish: &vanish,
        capacity: capacity.as_ref(),
        brake: hub.settings.gc_brake,
        now,
    });
    Ok(carry_out(hub, conn, key, &who, plan, now).await)
}

/// Carry out a sweep's plan in its order; one object failing never stops the sweep.
async fn carry_out(
    hub: &Hub,
    conn: &Connection,
    key: &ClusterKey,
    who: &ClusterOwner<'_>,
    plan: SweepPlan<'_>,
    now: Timestamp,
) -> Outcome {
    let claims_api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    let groups_api: Api<NodeGroup> = Api::all(conn.client.clone());
    let mut out = Outcome {
        foreign: plan.gauges.unmanaged,
        moved: plan.gauges.awaiting_handover,
        resized: plan.resized.iter().map(|r| r.group.name_any()).collect(),
        deferred: plan.deferred,
        halted: plan.halt.as_ref().map(|h| h.would),
        ..Outcome::default()
    };
    let m = &hub.metrics;
    Metrics::set(&m.unmanaged, key, plan.gauges.unmanaged as i64);
    Metrics::set(&m.awaiting_handover, key, plan.gauges.awaiting_handover as i64);
    Metrics::set(&m.external_resizes, key, plan.gauges.external_resizes as i64);
    Metrics::set(&m.cooldown_flavors, key, plan.gauges.cooldown_flavors as i64);
    for Report { group, note } in plan.foreign_autoscalers {
        // Only on the group: its pool labels name another autoscaler's pools, not ours.
        let ev = crate::infra::hub::event(true, "ForeignAutoscalerDetected", "GarbageCollect", note.clone());
        if hub.workload_event(&conn.client, &nodegroup_ref(group), ev, EVENT_DEDUPE_LONG).await {
            tracing::warn!(cluster = %key, nodegroup = %group.name_any(), "ForeignAutoscalerDetected: {note}");
        }
    }
    for Report { group, note } in plan.resized {
        if report(hub, conn, group, true, "NodeGroupExternallyResized", note.clone(), EVENT_DEDUPE_LONG).await {
            tracing::warn!(cluster = %key, nodegroup = %group.name_any(), node_count = group.spec.node_count, "NodeGroupExternallyResized: {note}");
        }
    }
    for judged in plan.judged {
        match judged {
            Judgement::Refuse { report: Report { group, note }, why } => {
                let name = group.name_any();
                if report(hub, conn, group, true, "GarbageCollectionRefused", note, EVENT_DEDUPE_LONG).await {
                    tracing::warn!(cluster = %key, nodegroup = %name, why = %why, "GarbageCollectionRefused: NodeGroup carries this hub's labels but fails the ownership proof; kept");
                }
                out.refused.push(name);
            }
            Judgement::Restamp { group, patch } => {
                let name = group.name_any();
                match groups_api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        tracing::info!(cluster = %key, nodegroup = %name, moved_from = ?who.moved_from, "took over the NodeGroup moved with its NodeClaim from the management cluster the registration names; re-stamped as this management cluster's");
                        out.restamped.push(name);
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %key, nodegroup = %name, error = %plain(&e), "re-stamping a moved NodeGroup failed (on 403: re-run `karpenter-hub register` so the workload identity may patch NodeGroups); it stays its claim's by the declared move; next sweep retries")
                    }
                }
            }
        }
    }
    match plan.halt {
        Some(h) => halt(hub, key, h).await,
        None => {
            if hub.set_gc_halt(key, None) {
                tracing::info!(cluster = %key, "garbage collection resumed: the orphans found are within the brake's share");
            }
        }
    }
    for Reap { group, why, note } in plan.deletes {
        let name = group.name_any();
        let dp = ownership::delete_exactly(group);
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
                    tracing::warn!(cluster = %key, nodegroup = %name, error = %plain(&e), "releasing the reaped group's node finalizer failed; the next sweep retries");
                }
                let _ = report(hub, conn, group, false, "GarbageCollected", note, EVENT_DEDUPE).await;
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
    for StuckNode { node, group } in plan.stuck {
        match crate::infra::finalizers::release_from_nodes(conn, &group).await {
            Ok(()) => {
                tracing::info!(cluster = %conn.key, node = %node, nodegroup = %group, "released the finalizer of a node no claim owns any more")
            }
            Err(e) => {
                tracing::warn!(cluster = %conn.key, node = %node, error = %plain(&e), "releasing a stuck node's finalizer failed")
            }
        }
    }
    for VanishedClaim { claim, group, why, flavor, note } in plan.vanished {
        let name = claim.name_any();
        if let Err(e) = claims_api.delete(&name, &ownership::delete_exactly(claim)).await {
            tracing::warn!(cluster = %key, nodeclaim = %name, error = %plain(&e), "deleting vanished claim failed");
            continue;
        }
        if let Some(flavor) = flavor {
            let policy = hub.settings.capacity;
            if let Err(e) = hub.update_capacity(key, now, |s| s.record_vanish(&flavor, now, policy)).await {
                tracing::warn!(cluster = %key, error = %plain(&e), "persisting the vanish cool-down failed");
            }
        }
        tracing::warn!(cluster = %key, nodeclaim = %name, nodegroup = %group, why = %why, "NodeGroupVanished: deleted the claim so its pods are re-planned");
        Metrics::inc(&m.vanished, key);
        hub.event(&claim.object_ref(&()), true, "NodeGroupVanished", "GarbageCollect", note).await;
        out.claims_collected.push(name);
    }
    Metrics::set(&m.gc_refused, key, plan.gauges.refused as i64);
    out
}

/// The brake halted a sweep of `key`: nothing was deleted. Say so on the cluster's NodePools (a
/// condition through [`Hub::set_gc_halt`] and an event) and in one warning line.
async fn halt(hub: &Hub, key: &ClusterKey, Halt { would, of, why }: Halt) {
    let percent = hub.settings.gc_brake.halt_percent;
    if hub.set_gc_halt(key, Some(why.clone())) {
        tracing::warn!(cluster = %key, would_delete = would, labelled = of, halt_percent = percent, "GarbageCollectionHalted: too many NodeGroups look orphaned at once; none deleted");
    }
    let labels = hub.registry.labels(key);
    for pool in
        hub.cache.pools_in(&key.namespace).iter().filter(|p| fleet::serves(p, &key.namespace, &key.name, &labels))
    {
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
