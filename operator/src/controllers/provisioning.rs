//! Provisioning (karpenter-semantics §3): per workload cluster, collect pending pods into a batch
//! window, and when it closes on a synced cluster, run the scheduling core over the cluster's
//! caches and the namespace's NodePools, node classes, catalogues and claims, then create the
//! NodeClaims it decides. Event-driven: the loop sleeps until the pod watch reports a pod that
//! started waiting, the management caches change what the decision reads, a retry is due, or the
//! pods still waiting are due their periodic look ([`RESYNC`]);
//! a round reads watch caches only (its requests are the claims it creates). A round's facts are
//! gathered ([`gather`], through [`crate::infra::facts`] as disruption's) and decided ([`decide`])
//! synchronously over the caches' stores, so they are tested without a server.
//!
//! Owns: one task per registered cluster (started and stopped with the registry), the batch
//! window, and the creation of NodeClaims (deterministic names: a retried create after a lost
//! response finds its claim instead of making a second). Must not: decide on an unsynced cluster,
//! launch anything itself (the lifecycle controller does), or touch the workload cluster.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use kube::{Api, ResourceExt, api::PostParams, runtime::reflector::ObjectRef};
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::batcher::{Batcher, Outcome, RESYNC, Rounds},
    decisions::capacity::CapacityState,
    decisions::capacity_buffer,
    decisions::fingerprint,
    decisions::input_corrections::{correct_from_nodes, mark_unavailable},
    decisions::new_claims::{BuildError, Cluster, candidate_names, node_claim},
    decisions::nomination,
    decisions::organization::{self, Ceiling},
    infra::errors::{self, ApiError, Categorized, Reconciler, Step, StepExt},
    infra::facts,
    infra::hub::{Hub, MgmtCache},
    infra::metrics::{ClusterLabels, CreatedLabels},
    infra::organizations,
    infra::registry::{ClusterKey, Connection, WorkloadCache},
};
use crds::{NodeClaim, labels};
use k8s_openapi::jiff::Timestamp;
use scheduling::convert::{PendingRule, Snapshot, build_input_with_volumes};

/// Errors of one round; logged, and the next window retries.
pub use crate::infra::errors::PassError as Error;

/// Start and stop one provisioning task per registered cluster until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    crate::infra::hub::per_cluster(hub, shutdown, cluster_loop).await;
}

async fn cluster_loop(hub: Arc<Hub>, key: ClusterKey, cancel: CancellationToken) {
    let mut batcher = Batcher::default();
    let mut rounds = Rounds::default();
    let mut changes = hub.registry.changes();
    let mut scope = hub.cache.scope_changes();
    // A manual clock moved forward (tests): a round deferred to a time on the hub's clock (the end
    // of a creation back-off or a flavor's cool-down) may be due now. Never fires on the real clock.
    let mut ticks = std::pin::pin!(hub.settings.clock.advances());
    let labels = ClusterLabels { cluster: key.to_string() };
    loop {
        let conn = hub.registry.connection(&key);
        let mut wake = None;
        match conn.as_ref().filter(|c| c.is_synced()) {
            None => {
                // The hub cannot see the cluster's pods: no series rather than a stale count.
                hub.metrics.queue_depth.remove(&labels);
                hub.metrics.unschedulable_pods.remove(&labels);
            }
            Some(conn) => {
                let now = tokio::time::Instant::now();
                let real = conn.pending.snapshot();
                hub.metrics.queue_depth.get(&labels).set(i64::try_from(real.len()).unwrap_or(i64::MAX));
                if real.is_empty() {
                    // The unschedulable pods are some of those waiting; with none waiting no round
                    // runs to say so, and the last decision's count would stay.
                    hub.metrics.unschedulable_pods.get(&labels).set(0);
                }
                // The cluster's labels are part of its scope: a fleet pool starting to serve it is
                // news for the pods that wait.
                let scope_now = fingerprint::one((*scope.borrow_and_update(), hub.registry.labels(&key)));
                // CapacityBuffers' pods wait as pending pods do: a new one opens a round at once,
                // and they are looked at again on the same cadence (their room may have been taken).
                let mut pending = real;
                let cluster_labels = facts::ClusterLabels::of(&hub.registry, &key);
                pending.extend(
                    facts::buffer_pods(&hub.cache, &key, &cluster_labels)
                        .into_iter()
                        .filter_map(|b| b.pod.metadata.uid.clone()),
                );
                rounds.offer(&mut batcher, &pending, scope_now, now);
                if batcher.is_due(now) {
                    let batch = batcher.take();
                    let outcome = match round(&hub, conn, &key).await {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            errors::count(&hub, Reconciler::Provisioning, Some(&key), &e);
                            tracing::warn!(cluster = %key, pods = batch.len(), step = e.step().label(), category = e.category().as_str(), error = %e, "provisioning round failed; retrying");
                            Outcome::Failed
                        }
                    };
                    tracing::debug!(cluster = %key, triggers = ?batch, outcome = ?outcome, "provisioning round ran");
                    rounds.ran(&pending, scope_now, outcome, tokio::time::Instant::now());
                    continue;
                }
                wake = rounds.next_wake(&batcher);
            }
        }
        let joined = async {
            match &conn {
                // Woken by the pod watch when a pod starts waiting, or when the caches are synced.
                Some(c) if c.is_synced() => c.pending.joined().await,
                Some(c) => {
                    c.wait_synced().await;
                }
                None => std::future::pending().await,
            }
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => {
                // The cluster was removed: a round that ran meanwhile may have set these again.
                hub.metrics.queue_depth.remove(&labels);
                hub.metrics.unschedulable_pods.remove(&labels);
                return;
            }
            _ = changes.changed() => {}
            _ = scope.changed() => {}
            Some(()) = ticks.next() => rounds.clock_moved(tokio::time::Instant::now()),
            () = joined => {}
            () = sleep => {}
        }
    }
}

/// How long to wait for the management cache to show the claims a round created, before the next
/// round may decide (it would otherwise not count them and decide them again).
const CREATED_VISIBLE: Duration = Duration::from_secs(5);

/// What a round decides over, gathered from the watch caches alone.
#[derive(Debug)]
pub(crate) enum Gathered {
    /// The management caches have not listed yet: absence in them means nothing.
    NotListed,
    /// No NodePool of the cluster takes part (none, or their node class is not Ready).
    NoPool,
    /// No pod for the hub to place; `notes` as in [`Round::notes`].
    NoPod { notes: Vec<String> },
    /// Pods to place.
    Round(Box<Round>),
}

/// The facts of a round with pods to place.
#[derive(Debug)]
pub(crate) struct Round {
    pub snapshot: Snapshot,
    pub input: scheduling::Input,
    /// Things the conversion ignored or assumed (logged).
    pub notes: Vec<String>,
}

/// Gathers a round's facts for cluster `key` from the management cache `mgmt` and the cluster's
/// workload cache (that of a synced connection), in the hub's zone and under its scheduler policies
/// (`settings`): the pools that take part and the scheduling input built from the caches. No
/// request, no clock.
pub(crate) fn gather(
    mgmt: &MgmtCache,
    workload: &WorkloadCache,
    key: &ClusterKey,
    labels: &facts::ClusterLabels,
    settings: &crate::infra::hub::Settings,
    now: Timestamp,
) -> Result<Gathered, Error> {
    if !mgmt.is_ready() {
        return Ok(Gathered::NotListed);
    }
    let claims = facts::claims(mgmt, key);
    let mut snapshot =
        facts::snapshot(mgmt, workload, key, labels, &settings.zone, &claims, facts::Workload::Everything);
    snapshot.now = Some(now);
    // Pools the cluster departed from are in the snapshot for disruption's sake only.
    if !snapshot.node_pools.iter().any(|p| snapshot.serves(p, &key.name)) {
        return Ok(Gathered::NoPool);
    }
    // The cluster's storage objects, as `plan` reads a snapshot's: volume zones and attach limits.
    let volumes = workload.volumes.volumes();
    let converted =
        build_input_with_volumes(&snapshot, &volumes, &key.name, PendingRule::Unschedulable, settings.scheduler)?;
    if converted.input.pods.is_empty() {
        return Ok(Gathered::NoPod { notes: converted.notes });
    }
    Ok(Gathered::Round(Box::new(Round { snapshot, input: converted.input, notes: converted.notes })))
}

/// What a round decided, before any write.
#[derive(Debug)]
pub(crate) enum Decided {
    /// CKE refused a launch lately: no new claim until the back-off ends (`left` from now).
    BackingOff { left: Duration },
    /// The scheduling decision.
    Solved(Box<Solved>),
}

/// A round's scheduling decision and the NodeClaims it makes.
#[derive(Debug)]
pub(crate) struct Solved {
    pub decision: scheduling::Decision,
    /// The flavors cooling down after a CKE refusal, left out of the decision.
    pub cooling: BTreeSet<String>,
    /// The claim to create for each new claim of the decision (by index) whose pool is there.
    pub claims: Vec<(usize, Result<NodeClaim, BuildError>)>,
    /// How long the scheduling core took (the metric).
    pub seconds: f64,
    /// What the organisations' room held back: the cluster waits for it (fairness, fleet.md §4).
    pub waiting: Option<organization::Want>,
}

/// Decides a gathered round under the cluster's capacity memory at `now`: CKE's refusals
/// (clever-cloud.md §3.5) first — no new claims while the cluster backs off, and flavors cooling
/// down are not offered, so the decision picks another flavor —, then the node capacities the
/// cluster reports, then the room its organisations leave it (`organizations`: name and room, a
/// limit every pool draws on), then the scheduling core, and the NodeClaims of its new claims.
pub(crate) fn decide(
    round: &mut Round,
    key: &ClusterKey,
    capacity: &CapacityState,
    organizations: &[(String, Ceiling)],
    now: Timestamp,
) -> Decided {
    if let Some(left) = capacity.backoff_remaining(now) {
        return Decided::BackingOff { left };
    }
    let cooling: BTreeSet<String> = capacity.unavailable(now).map(str::to_string).collect();
    let input = &mut round.input;
    mark_unavailable(input, &cooling);
    for (flavor, e) in correct_from_nodes(input, round.snapshot.nodes.iter().map(AsRef::as_ref)) {
        tracing::debug!(cluster = %key, flavor = %flavor, error = %e, "observed node capacity ignored");
    }
    let own = input.shared.len();
    organization::limit_input(input, organizations);
    let started = std::time::Instant::now();
    let decision = scheduling::solve(input);
    let seconds = started.elapsed().as_secs_f64();
    // Pods the room left waiting: what they would need without it is what the cluster waits for.
    let waiting = organization::held_back(input, &decision, own);
    let cluster = Cluster { namespace: &key.namespace, name: &key.name };
    let snapshot = &round.snapshot;
    let claims = decision
        .new_claims
        .iter()
        .enumerate()
        .filter_map(|(i, claim)| {
            let pool = snapshot.node_pools.iter().find(|p| p.name_any() == claim.nodepool)?;
            // Pod incarnations, not names: a pod deleted and recreated under its name (a
            // StatefulSet's) must not meet the claim made for its predecessor.
            let pod_ids: Vec<String> = claim
                .pods
                .iter()
                .map(|i| &input.pods[*i])
                .map(|p| if p.uid.is_empty() { p.key() } else { p.uid.clone() })
                .collect();
            let class =
                snapshot.node_classes.iter().find(|c| c.name_any() == pool.spec.template.spec.node_class_ref.name);
            Some((i, node_claim(pool, class, claim, &cluster, &pod_ids)))
        })
        .collect();
    Decided::Solved(Box::new(Solved { decision, cooling, claims, seconds, waiting }))
}

fn log_notes(key: &ClusterKey, notes: &[String]) {
    for note in notes {
        tracing::debug!(cluster = %key, note = %note, "scheduling input note");
    }
}

/// One scheduling round for one cluster, over the watch caches (no request but the creates).
///
/// From the gathering to [`Writes::of`] nothing awaits: the large part of a round (the snapshot
/// and the scheduling input built from every pod of the cluster) lives only while a runtime thread
/// works on it, and is dropped before the round's requests. However many clusters' rounds are under
/// way, at most one input per runtime thread exists at once (issue 30: a burst's rounds used to
/// hold theirs across their creates, a hundred at once).
pub async fn round(hub: &Hub, conn: &Connection, key: &ClusterKey) -> Result<Outcome, Error> {
    // Absence in an unlisted cache means nothing; look again shortly.
    let unlisted = || Outcome::Deferred { until: tokio::time::Instant::now() + Duration::from_millis(200) };
    let now = hub.now();
    let started = std::time::Instant::now();
    let capacity = hub.capacity(key).await.step(Step::ReadCapacity)?;
    // The room each organisation of the cluster leaves it (the cache: a launch reserves live).
    let orgs = organizations::rooms(hub, key, now).await?;
    let gathered =
        gather(&hub.cache, &conn.cache, key, &facts::ClusterLabels::of(&hub.registry, key), &hub.settings, now);
    if matches!(gathered, Ok(Gathered::NotListed)) {
        return Ok(unlisted());
    }
    // The cluster's gauge exists from the first round on listed caches, whatever it finds.
    let unschedulable = hub.metrics.unschedulable_pods.get(&ClusterLabels { cluster: key.to_string() });
    let mut round = match gathered? {
        Gathered::NotListed => return Ok(unlisted()),
        Gathered::NoPool => {
            hub.record_buffer_placements(key, BTreeMap::new());
            tracing::debug!(cluster = %key, "no ready NodePool for this cluster; nothing to provision");
            // No pool can take any of them: every pending pod is unschedulable for the hub.
            unschedulable.set(i64::try_from(conn.pending.len()).unwrap_or(i64::MAX));
            return Ok(Outcome::Done);
        }
        Gathered::NoPod { notes } => {
            hub.record_buffer_placements(key, BTreeMap::new());
            log_notes(key, &notes);
            unschedulable.set(0);
            // No pod waits: the cluster is no longer in an organisation's line.
            organizations::unmark(hub, key).await?;
            return Ok(Outcome::Done);
        }
        Gathered::Round(round) => *round,
    };
    log_notes(key, &round.notes);
    let solved = match decide(&mut round, key, &capacity, &orgs, now) {
        Decided::BackingOff { left } => {
            tracing::debug!(cluster = %key, pods = round.input.pods.len(), seconds = left.as_secs(), "creation back-off after a CKE refusal; pods wait");
            return Ok(Outcome::Deferred { until: tokio::time::Instant::now() + left.min(RESYNC) });
        }
        Decided::Solved(solved) => *solved,
    };
    hub.metrics.scheduling_duration.get(&ClusterLabels { cluster: key.to_string() }).observe(solved.seconds);
    hub.record_buffer_placements(key, capacity_buffer::placements(&round.input, &solved.decision));
    let writes = Writes::of(&round, solved, conn, key, now);
    drop(round);
    unschedulable.set(i64::try_from(writes.events.len()).unwrap_or(i64::MAX));
    for (reference, pod, reason) in writes.events {
        // Where the pod's owner looks (`kubectl describe pod`), once per pod and reason window.
        let note = format!("karpenter-hub cannot provision a node for this pod: {reason}");
        let ev = crate::infra::hub::event(true, "FailedScheduling", "Provision", note);
        if hub.workload_event(&conn.client, &reference, ev, crate::infra::hub::EVENT_DEDUPE).await {
            tracing::info!(cluster = %key, pod = %pod, reason = %reason, "pod cannot be scheduled");
        }
    }
    let ns = &key.namespace;
    let api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), ns);
    let mut created = Vec::new();
    for (about, built) in writes.creates {
        let mut nc = built?;
        let Some(name) = create_claim(hub, &api, key, &mut nc, &writes.counted).await? else {
            continue;
        };
        created.push(name.clone());
        // Only a create made by this call counts and is announced (a replayed one was, before).
        if nc.metadata.uid.is_some() {
            let since = conn.pending.since(about.uids.iter().map(String::as_str));
            let created = std::time::Instant::now();
            hub.record_waits(ns, &name, crate::infra::hub::Waits { since, round: started, created });
            hub.metrics.nodeclaims_created.get(&CreatedLabels::of(&key.to_string(), "provisioning", &nc)).inc();
            tracing::info!(
                cluster = %key, nodeclaim = %name, nodepool = %about.nodepool, flavor = %about.flavor,
                candidates = about.candidates, pods = about.pods, buffer_pods = about.buffer_pods,
                price_per_hour = about.price, min_values_relaxed = about.min_values_relaxed,
                "created NodeClaim: cheapest flavor fitting the batch"
            );
        }
    }
    if !created.is_empty() && !hub.claims_visible(ns, &created, CREATED_VISIBLE).await {
        tracing::warn!(cluster = %key, claims = created.len(), "the management cache does not show the new NodeClaims yet; the next round may repeat work");
    }
    let mut look_again: Option<Duration> = None;
    if let Some(want) = &writes.waiting {
        // In line for the room (fleet.md §4): the mark is renewed while the pods wait.
        organizations::mark(hub, key, &orgs, want).await?;
        look_again = Some(organization::RENEW);
    }
    if writes.left_out && writes.cooling {
        // Pods left out while flavors cool down: nothing in the caches will announce the end of a
        // cool-down, so look again then (at the latest after RESYNC: the hub's clock may be moved).
        let until = capacity.next_expiry(now).unwrap_or(RESYNC).min(RESYNC);
        look_again = Some(look_again.map_or(until, |l| l.min(until)));
    }
    if let Some(after) = look_again {
        return Ok(Outcome::Deferred { until: tokio::time::Instant::now() + after });
    }
    Ok(Outcome::Done)
}

/// What a round still has to write once its facts are dropped: small, owned, no pod list.
struct Writes {
    /// The cluster's pods the decision could not place (not the buffers'): the `FailedScheduling`
    /// event's object, the pod's key and why.
    events: Vec<(k8s_openapi::api::core::v1::ObjectReference, String, String)>,
    /// The claims to create, with what their creation logs.
    creates: Vec<(ClaimAbout, Result<NodeClaim, BuildError>)>,
    /// The claims the decision saw: new claims come on top of them.
    counted: BTreeSet<String>,
    /// Whether some pod (a buffer's included) was left out, and whether flavors were cooling down.
    left_out: bool,
    cooling: bool,
    /// What the organisations' room held back.
    waiting: Option<organization::Want>,
}

/// What the log says of a created claim.
struct ClaimAbout {
    nodepool: String,
    flavor: String,
    candidates: usize,
    pods: usize,
    buffer_pods: usize,
    price: f64,
    min_values_relaxed: bool,
    /// Its pods' UIDs (the start of their wait is measured from the pod watch).
    uids: Vec<String>,
}

impl Writes {
    /// Reduces `round`'s decision to its writes; the nominations (in memory) are made here.
    fn of(round: &Round, solved: Solved, conn: &Connection, key: &ClusterKey, now: Timestamp) -> Self {
        let Solved { decision, cooling, claims, waiting, .. } = solved;
        let (input, snapshot) = (&round.input, &round.snapshot);
        // The buffers' pods are no pods of the cluster: no event, not counted as unschedulable.
        let real = |pod: usize| input.pods.get(pod).is_some_and(|p| p.buffer.is_none());
        tracing::debug!(
            cluster = %key,
            pods = input.pods.len(),
            new_claims = ?decision.new_claims.iter().map(|c| c.pods.iter().map(|i| input.pods[*i].name.as_str()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "scheduling decision"
        );
        let events = decision
            .unschedulable
            .iter()
            .filter(|u| real(u.pod))
            .map(|u| {
                let pod = &input.pods[u.pod];
                let reference = crate::infra::hub::pod_reference(&pod.namespace, &pod.name, &pod.uid);
                (reference, pod.key(), u.reason.clone())
            })
            .collect();
        let creates = claims
            .into_iter()
            .map(|(i, built)| {
                let claim = &decision.new_claims[i];
                let about = ClaimAbout {
                    nodepool: claim.nodepool.clone(),
                    flavor: claim.instance_types.first().map(|o| o.name.clone()).unwrap_or_default(),
                    candidates: claim.instance_types.len(),
                    pods: claim.pods.len(),
                    buffer_pods: claim.pods.iter().filter(|&&p| !real(p)).count(),
                    price: claim.price,
                    min_values_relaxed: claim.min_values_relaxed,
                    uids: claim.pods.iter().filter(|&&p| real(p)).map(|&p| input.pods[p].uid.clone()).collect(),
                };
                (about, built)
            })
            .collect();
        if !decision.existing.is_empty() {
            // Nominated: the disruption loop leaves these nodes be for the nomination window.
            conn.nominations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .nominate(nomination::targets(input, &decision), now);
            let nominated: usize = decision.existing.iter().map(|a| a.pods.len()).sum();
            let on: Vec<String> = decision
                .existing
                .iter()
                .map(|a| {
                    let pods: Vec<&str> = a.pods.iter().map(|p| input.pods[*p].name.as_str()).collect();
                    format!("{} <- {}", input.nodes.get(a.node).map(|n| n.name.as_str()).unwrap_or("?"), pods.join(","))
                })
                .collect();
            tracing::debug!(cluster = %key, pods = nominated, on = ?on, "pods expected on existing or in-flight capacity");
        }
        Writes {
            events,
            creates,
            counted: snapshot.node_claims.iter().map(ResourceExt::name_any).collect(),
            left_out: !decision.unschedulable.is_empty(),
            cooling: !cooling.is_empty(),
            waiting,
        }
    }
}

/// How many names a decided claim may try when others hold them (a 20-bit suffix collides with
/// another live claim of the namespace about once per million pairs).
/// Create the decided claim under the first of its [`candidate_names`] that is free or already
/// holds this very claim (same [`labels::PROVISIONING_DIGEST`]: the hub's own create, retried after
/// a lost answer, which the decision did not count). Returns the name, with `claim`'s uid set when
/// this call created it; `None` when every name is held by other claims (the pods wait for the
/// next round).
async fn create_claim(
    hub: &Hub,
    api: &Api<NodeClaim>,
    key: &ClusterKey,
    claim: &mut NodeClaim,
    counted: &BTreeSet<String>,
) -> Result<Option<String>, ApiError> {
    let digest = claim.annotations().get(labels::PROVISIONING_DIGEST).cloned().unwrap_or_default();
    let pool = claim.labels().get(labels::NODEPOOL).cloned().unwrap_or_default();
    for (attempt, name) in candidate_names(&pool, &digest, counted) {
        claim.metadata.name = Some(name.clone());
        match api.create(&PostParams::default(), claim).await {
            Ok(made) => {
                claim.metadata.uid = made.metadata.uid;
                return Ok(Some(name));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let ns = key.namespace.as_str();
                let holder = match hub.cache.claims.get(&ObjectRef::<NodeClaim>::new(&name).within(ns)) {
                    Some(held) => Some(held.annotations().get(labels::PROVISIONING_DIGEST).cloned()),
                    None => api
                        .get_opt(&name)
                        .await
                        .step(Step::ReadClaim)?
                        .map(|held| held.annotations().get(labels::PROVISIONING_DIGEST).cloned()),
                };
                if holder.as_ref().is_some_and(|d| d.as_deref() == Some(digest.as_str())) {
                    tracing::debug!(cluster = %key, nodeclaim = %name, "NodeClaim already exists (a retried create of this decision)");
                    return Ok(Some(name));
                }
                tracing::info!(cluster = %key, nodeclaim = %name, attempt, "NodeClaim name held by another claim; trying the decision's next name");
            }
            Err(e) => return Err(Step::CreateClaim.failed(e)),
        }
    }
    tracing::warn!(cluster = %key, nodepool = %pool, "every name of a decided NodeClaim is held by other claims; its pods wait for the next round");
    Ok(None)
}

#[cfg(test)]
mod tests;
