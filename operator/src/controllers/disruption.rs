//! The disruption controller (karpenter-semantics §4.2, §4.13): one loop per workload cluster that
//! removes empty nodes, replaces drifted ones and consolidates under-used ones, within the pools'
//! budgets, never against a PodDisruptionBudget or a `do-not-disrupt`.
//!
//! Each pass gathers the cluster's facts from the watch caches ([`gather`], through
//! [`crate::infra::facts`] as provisioning's), reduces them with [`disruption_scope`] (the same code
//! as `plan --disruption`), asks the `disruption` crate for at most one command ([`methods`]; the
//! gathering, the methods and the validation run synchronously over the caches' stores, and are
//! tested so, without a server), and carries it out: replacements created first, the command recorded on its
//! candidates ([`disruption_queue`]), their Nodes tainted `karpenter.sh/disrupted:NoSchedule`, and
//! the candidates deleted — through the termination drain — only once every replacement is
//! initialized. Several commands per cluster run at once, each decided with the started ones'
//! candidates leaving and charged to the budgets; a restart finds every one on the claims.
//!
//! A pass that decided nothing is kept ([`Kept`]): until something the pass read changes (the
//! caches' change counters, [`crate::infra::changes`]; what the hub holds beside them) or time
//! alone may change the verdict ([`disruption::Scope::next_change`]), later passes build no view.
//!
//! Owns: the loop, the validation delay, the kept verdict, the consolidated short-circuit and the queue's writes
//! (idempotent: deterministic names, optimistic concurrency). Must not: decide anything itself
//! (the `disruption` crate and [`disruption_queue`] do), drain a node (termination does, when a
//! candidate is deleted), or act on a cluster that is not connected and synced.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, PoisonError},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Node, ObjectReference, Taint},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::capacity::CapacityState,
    decisions::input_corrections,
    decisions::kept_verdict::Kept,
    decisions::new_claims::{self, Cluster},
    decisions::organization,
    decisions::{
        conditions,
        disruption_queue::{self, CandidateState, Recorded, ReplacementState, Step},
        disruption_scope, nomination, ownership, rollout,
    },
    infra::{
        changes::Stamp,
        errors::{self, Categorized, Reconciler, StepExt},
        facts,
        hub::{Hub, MgmtCache},
        metrics::{CreatedLabels, DecisionLabels, MethodLabels, PoolReasonLabels, ReasonLabels, ResultLabels},
        organizations,
        registry::{ClusterKey, Connection, WorkloadCache},
    },
};
use crds::{NodeClaim, labels, nodepool::DisruptionReason};
use disruption::{Command, Method};
use scheduling::convert::{PendingRule, Snapshot};

/// The loop's period when nothing happened (§4.2).
pub const PASS_PERIOD: Duration = Duration::from_secs(10);
/// How long a started command may take to show in the management watch cache.
const CACHE_LAG: Duration = Duration::from_secs(10);
/// A scope found consolidated is looked at again after this even if nothing changed (§4.12): the
/// same age limit as a kept verdict's.
const CONSOLIDATED_TTL: Duration = crate::decisions::kept_verdict::MAX_AGE;
/// Event reasons.
pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
pub const DISRUPTION_LAUNCHING: &str = "DisruptionLaunching";
pub const DISRUPTION_TERMINATING: &str = "DisruptionTerminating";
pub const DISRUPTION_ROLLED_BACK: &str = "DisruptionRolledBack";

/// What stops a pass; the next one retries.
pub use crate::infra::errors::PassError as Error;

/// Start and stop one disruption loop per registered cluster until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    crate::infra::hub::per_cluster(hub, shutdown, cluster_loop).await;
}

/// A consolidation or emptiness command waiting out the validation delay. In memory on purpose:
/// nothing was written for it yet, so a restart simply decides again.
struct Pending {
    command: Command,
    decided: Timestamp,
}

#[derive(Default)]
struct LoopState {
    pending: Option<Pending>,
    /// The command this loop started last, until the watch cache shows its record: deciding on a
    /// cache that lags behind our own writes would start it a second time.
    started: Option<(String, std::time::Instant)>,
    /// The scope's fingerprint when emptiness and consolidation last found nothing to do, and when.
    consolidated: Option<(u64, Timestamp)>,
    /// When the next command may be decided while others are in flight: those are carried on every
    /// second, but deciding (building the view, running the methods) keeps its own pace.
    decide_at: Option<Timestamp>,
    /// The inputs of the last pass that found nothing to do: while they stand, the view is not
    /// built again (issue 30).
    kept: Option<Kept<Inputs>>,
}

/// What a pass's verdict reads, in a form cheap to compare: the stamps of the caches it gathers
/// from (the workload cluster's, the management namespace's) and a fingerprint of the rest, each
/// as it stands at `now` (the cluster's labels, the flavors cooling down, the nominated nodes, the
/// organisations' rooms). Time alone changes the last three; comparing them at each pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inputs {
    workload: Stamp,
    mgmt: Stamp,
    rest: u64,
}

impl Inputs {
    #[allow(clippy::too_many_arguments)]
    fn of(
        mgmt: &MgmtCache,
        workload: &WorkloadCache,
        key: &ClusterKey,
        labels: &facts::ClusterLabels,
        capacity: &CapacityState,
        nominations: &nomination::Nominations,
        rooms: &[(String, organization::Ceiling)],
        now: Timestamp,
    ) -> Self {
        let cooling: Vec<&str> = capacity.unavailable(now).collect();
        let rest = crate::decisions::fingerprint::one((
            &labels.labels,
            labels.settled,
            cooling,
            nominations.active(now),
            rooms,
        ));
        Inputs { workload: workload.changes.stamp(), mgmt: mgmt.changes.stamp_of(&key.namespace), rest }
    }
}

async fn cluster_loop(hub: Arc<Hub>, key: ClusterKey, cancel: CancellationToken) {
    let mut state = LoopState::default();
    // The cluster syncing (after a restart or a reconnection) starts a pass at once rather than at
    // the next poll of a pass that found it not synced.
    let this = key.clone();
    let mut synced = std::pin::pin!(hub.registry.synced().filter(move |k| std::future::ready(*k == this)));
    loop {
        let wait = match pass(&hub, &key, &mut state).await {
            Ok(wait) => wait,
            Err(e) => {
                errors::count(&hub, Reconciler::Disruption, Some(&key), &e);
                tracing::warn!(cluster = %key, step = e.step().label(), category = e.category().as_str(), error = %e, "disruption pass failed; the next pass retries");
                PASS_PERIOD
            }
        };
        // The hub's clock decides; the wall clock also wakes the loop, so a command waiting on a
        // replacement moves on while a test's manual clock stands still.
        tokio::select! {
            () = cancel.cancelled() => return,
            () = hub.settings.clock.sleep(wait) => {}
            () = tokio::time::sleep(wait) => {}
            Some(_) = synced.next() => {}
        }
    }
}

fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// One pass of the loop; returns when to run the next.
async fn pass(hub: &Hub, key: &ClusterKey, state: &mut LoopState) -> Result<Duration, Error> {
    let Some(conn) = hub.registry.connection(key).filter(|c| c.is_synced()) else {
        // §4.2 (1): nothing is decided on a cluster the hub cannot see.
        state.pending = None;
        return Ok(Duration::from_secs(1));
    };
    if !hub.cache.is_ready() {
        return Ok(Duration::from_secs(1));
    }
    let claims = facts::claims(&hub.cache, key);
    let now = hub.now();

    // Commands already started: carry each one step further.
    let commands = recorded_commands(&claims);
    tracing::trace!(cluster = %key, claims = claims.len(), commands = commands.len(), "disruption pass");
    let mut in_progress = false;
    let mut unseen: Vec<&str> = Vec::new();
    for command in commands.values() {
        if !advance(hub, &conn, key, command, &claims, commands.len(), now).await? {
            in_progress = true;
            unseen.extend(disruption_queue::unseen_replacements(command, |name| claim_named(&claims, name).is_some()));
        }
    }
    release_leftover_taints(&conn, key, &claims).await?;
    if let Some((id, at)) = &state.started {
        if commands.contains_key(id) || at.elapsed() > CACHE_LAG {
            state.started = None;
        } else {
            return Ok(disruption_queue::POLL);
        }
    }
    if let Some(name) = unseen.first() {
        tracing::debug!(cluster = %key, nodeclaim = %name, "the next disruption command waits for a started one's replacement to show in the cache");
        return Ok(disruption_queue::POLL);
    }
    // Several commands run at once (upstream's orchestration queue): the next one is decided with
    // the started ones' candidates leaving and charged to their budgets; commands in flight are
    // looked at again soon whatever the decision's own wait.
    if in_progress && let Some(at) = state.decide_at.filter(|at| now < *at) {
        return Ok(elapsed(at, now).min(disruption_queue::POLL));
    }
    let wait = next_command(hub, &conn, key, state, &claims, now).await?;
    state.decide_at = now.checked_add(wait).ok();
    Ok(if in_progress { wait.min(disruption_queue::POLL) } else { wait })
}

/// Decides (and, for drift, starts) the next command of cluster `key` beside those in flight, or
/// starts the one that waited out its validation delay; returns when to pass again.
async fn next_command(
    hub: &Hub,
    conn: &Connection,
    key: &ClusterKey,
    state: &mut LoopState,
    claims: &[Arc<NodeClaim>],
    now: Timestamp,
) -> Result<Duration, Error> {
    let labels = facts::ClusterLabels::of(&hub.registry, key);
    let capacity = hub.capacity(key).await.step(errors::Step::ReadCapacity)?;
    let rooms = organizations::rooms(hub, key, now).await?;
    // What the verdict reads, stamped before anything is read: a change landing while the view is
    // built shows at the next pass.
    let inputs = {
        let nominations = conn.nominations.lock().unwrap_or_else(PoisonError::into_inner);
        Inputs::of(&hub.cache, &conn.cache, key, &labels, &capacity, &nominations, &rooms, now)
    };
    if let Some(pending) = &state.pending {
        let due = pending.decided + hub.settings.disruption_validation;
        if now < due {
            return Ok(elapsed(due, now));
        }
    } else if let Some(kept) = state.kept.as_ref().filter(|k| k.holds(&inputs, now)) {
        hub.metrics.disruption_views.get(&ResultLabels { cluster: key.to_string(), result: "kept".into() }).inc();
        tracing::trace!(cluster = %key, "disruption inputs unchanged; the last verdict stands");
        return Ok(kept.left(now).min(PASS_PERIOD));
    }
    state.kept = None;
    hub.metrics.disruption_views.get(&ResultLabels { cluster: key.to_string(), result: "built".into() }).inc();
    // From the gathering to the verdict nothing awaits, and the view's scheduling model (every pod
    // of the cluster, converted) is dropped before the pass's requests: however many clusters'
    // passes are under way, at most one model per runtime thread exists at once.
    let (snapshot, mut view) = gather(&hub.cache, &conn.cache, key, &labels, &hub.settings, claims, now)?;
    let fingerprint = fingerprint(&snapshot);
    for note in &view.notes {
        tracing::debug!(cluster = %key, note = %note, "disruption input note");
    }
    tracing::trace!(cluster = %key, nodes = view.scope.nodes.len(), "disruption view built");
    let nominated = {
        let nominations = conn.nominations.lock().unwrap_or_else(PoisonError::into_inner);
        corrected(&mut view, &snapshot, &capacity, &nominations, now)
    };
    // Replacements spend the organisation's room while the candidates still run (fleet.md §4): a
    // command whose replacements do not fit is not viable, so a delete-only one or none is chosen.
    organization::limit_input(&mut view.model.input, &rooms);

    if let Some(pending) = state.pending.take() {
        let validated = validate(&pending.command, &view, now);
        let scope = view.into_scope();
        publish_budgets(hub, key, &scope, now).await;
        return match validated {
            Ok(command) => {
                state.started =
                    start(hub, conn, key, &command, &snapshot, now).await?.map(|id| (id, std::time::Instant::now()));
                Ok(Duration::ZERO)
            }
            Err(why) => {
                hub.metrics
                    .disruption_failed_validations
                    .get(&ReasonLabels { cluster: key.to_string(), reason: reason_label(pending.command.reason) })
                    .inc();
                tracing::info!(
                    cluster = %key, method = %pending.command.method, nodeclaims = %pending.command.claims().join(","),
                    "disruption command dropped at validation: {why}"
                );
                Ok(PASS_PERIOD)
            }
        };
    }

    let skip = state.consolidated.is_some_and(|(f, at)| f == fingerprint && elapsed(now, at) < CONSOLIDATED_TTL);
    let pass = methods(&view, skip, now, |method, seconds| {
        hub.metrics
            .disruption_evaluation
            .get(&MethodLabels { cluster: key.to_string(), method: method_label(method).to_string() })
            .observe(seconds);
    });
    let scope = view.into_scope();
    tracing::trace!(cluster = %key, skip, methods = pass.methods.len(), "disruption methods ran");
    for (method, _) in pass.methods.iter().filter(|(_, o)| o.timed_out) {
        tracing::info!(cluster = %key, method = %method, "disruption method stopped at its time limit; the next pass tries again");
    }
    publish_budgets(hub, key, &scope, now).await;
    report(hub, key, &scope, &pass).await;
    let consolidated =
        pass.methods.iter().filter(|(m, _)| *m != Method::Drift).all(|(_, o)| o.consolidated && o.command.is_none());
    if !skip {
        // Nothing found while nodes were nominated may change when the nominations end, which the
        // fingerprint does not see: not remembered then.
        state.consolidated = (consolidated && nominated == 0).then_some((fingerprint, now));
    }
    let Some(command) = pass.command().cloned() else {
        // Nothing to do: kept until something read changes, unless a method ran out of time (the
        // next pass goes on where it stopped).
        if pass.methods.iter().all(|(_, o)| !o.timed_out) {
            state.kept = Some(Kept::new(inputs, now, scope.next_change(now)));
        }
        return Ok(PASS_PERIOD);
    };
    if command.method == Method::Drift {
        // §4.7: no validation delay; budgets bound how many run at once.
        state.started =
            start(hub, conn, key, &command, &snapshot, now).await?.map(|id| (id, std::time::Instant::now()));
        return Ok(Duration::ZERO);
    }
    tracing::info!(
        cluster = %key, method = %command.method, nodeclaims = %command.claims().join(","),
        "disruption decided, validating after {} s: {command}", hub.settings.disruption_validation.as_secs()
    );
    state.pending = Some(Pending { command, decided: now });
    Ok(hub.settings.disruption_validation)
}

/// Gathers a pass's facts for cluster `key` from the management cache `mgmt` and the cluster's
/// workload cache (a synced connection's), given the cluster's `claims` ([`facts::claims`]), in the
/// hub's zone and under its scheduler policies (`settings`): the snapshot and the view the methods
/// decide on at `now` ([`disruption_scope::view`], the same reduction as `plan --disruption`). No
/// request; the caller checks that `mgmt` has listed.
pub(crate) fn gather(
    mgmt: &MgmtCache,
    workload: &WorkloadCache,
    key: &ClusterKey,
    labels: &facts::ClusterLabels,
    settings: &crate::infra::hub::Settings,
    claims: &[Arc<NodeClaim>],
    now: Timestamp,
) -> Result<(Snapshot, disruption_scope::View), Error> {
    let mut snapshot =
        facts::snapshot(mgmt, workload, key, labels, &settings.zone, claims, facts::Workload::WithClaims);
    snapshot.now = Some(now);
    let view = disruption_scope::view(
        &snapshot,
        &workload.volumes.volumes(),
        &key.name,
        PendingRule::Unschedulable,
        settings.scheduler,
        now,
    )?;
    Ok((snapshot, view))
}

/// The view's scheduling model corrected as provisioning's is: flavors cooling down after a CKE
/// refusal are not offered to replacements, and node capacities are those the nodes report. The
/// nodes provisioning nominated are marked (§4.2: no candidate for the nomination window); returns
/// how many are.
pub(crate) fn corrected(
    view: &mut disruption_scope::View,
    snapshot: &Snapshot,
    capacity: &CapacityState,
    nominations: &nomination::Nominations,
    now: Timestamp,
) -> usize {
    let cooling: BTreeSet<String> = capacity.unavailable(now).map(str::to_string).collect();
    input_corrections::mark_unavailable(&mut view.model.input, &cooling);
    input_corrections::correct_from_nodes(&mut view.model.input, snapshot.nodes.iter().map(AsRef::as_ref));
    nomination::mark(&mut view.scope, nominations, now)
}

/// The loop's methods in order over `view` at `now` ([`disruption_scope::decide`]); `skip` leaves
/// out consolidation that found nothing since the scope last changed. `timed` is told how long each
/// method took (Karpenter's evaluation duration).
pub(crate) fn methods(
    view: &disruption_scope::View,
    skip: bool,
    now: Timestamp,
    mut timed: impl FnMut(Method, f64),
) -> disruption_scope::Pass {
    let settings = disruption::Settings::default();
    disruption_scope::decide(skip, |method| {
        let started = std::time::Instant::now();
        // Upstream's consolidation timeouts, on the process's own time (what a huge cluster's
        // simulations cost), not the hub's clock.
        let limit = disruption_scope::time_limit(method);
        let out_of_time = || limit.is_some_and(|l| started.elapsed() >= l);
        let outcome = disruption_scope::evaluate(method, &view.scope, &view.model, now, settings, &out_of_time);
        timed(method, started.elapsed().as_secs_f64());
        outcome
    })
}

/// What the consolidation methods' verdict rests on (§4.12's change stamp): claims, pools, nodes
/// and where pods are. Two equal fingerprints mean nothing a decision reads has changed.
fn fingerprint(s: &Snapshot) -> u64 {
    use crate::decisions::fingerprint::one;
    let pools = s.node_pools.iter().map(|p| one(("pool", &p.metadata.name, &p.metadata.resource_version)));
    let claims = s.node_claims.iter().map(|c| one(("claim", &c.metadata.name, &c.metadata.resource_version)));
    let pdbs = s.pdbs.iter().map(|p| one(("pdb", &p.metadata.name, p.status.as_ref().map(|s| s.disruptions_allowed))));
    let nodes = s.nodes.iter().map(|n| {
        one((
            "node",
            &n.metadata.name,
            n.labels().get(labels::INITIALIZED),
            n.metadata.deletion_timestamp.is_some(),
            n.spec.as_ref().and_then(|s| s.taints.as_ref()).map(Vec::len),
        ))
    });
    let pods = s.pods.iter().map(|p| {
        one((
            "pod",
            &p.metadata.uid,
            p.spec.as_ref().and_then(|s| s.node_name.as_ref()),
            p.status.as_ref().and_then(|s| s.phase.as_ref()),
            p.metadata.deletion_timestamp.is_some(),
        ))
    });
    crate::decisions::fingerprint::sum(pools.chain(claims).chain(pdbs).chain(nodes).chain(pods))
}

/// The commands recorded on the cluster's claims, by id.
fn recorded_commands(claims: &[Arc<NodeClaim>]) -> BTreeMap<String, Recorded> {
    let mut out = BTreeMap::new();
    for c in claims {
        if let Some(r) = Recorded::on(c.annotations()) {
            out.entry(r.id.clone()).or_insert(r);
        }
    }
    out
}

fn claim_named<'a>(claims: &'a [Arc<NodeClaim>], name: &str) -> Option<&'a Arc<NodeClaim>> {
    claims.iter().find(|c| c.metadata.name.as_deref() == Some(name))
}

fn node_of(conn: &Connection, claim: &NodeClaim) -> Option<Arc<Node>> {
    let name = claim.status.as_ref()?.node_name.as_deref()?;
    conn.cache.nodes.state().into_iter().find(|n| n.metadata.name.as_deref() == Some(name))
}

/// Karpenter's `method` label values.
fn method_label(method: Method) -> &'static str {
    match method {
        Method::Emptiness => "emptiness",
        Method::Drift => "drift",
        Method::MultiNodeConsolidation => "multi_node_consolidation",
        Method::SingleNodeConsolidation => "single_node_consolidation",
    }
}

fn reason_label(reason: DisruptionReason) -> String {
    format!("{reason:?}").to_lowercase()
}

fn decision_labels(key: &ClusterKey, method: &str, reason: DisruptionReason, replaces: bool) -> DecisionLabels {
    let consolidation_type = match method {
        m if m == Method::Emptiness.to_string() => "empty",
        m if m == Method::MultiNodeConsolidation.to_string() => "multi",
        m if m == Method::SingleNodeConsolidation.to_string() => "single",
        _ => "",
    };
    DecisionLabels {
        cluster: key.to_string(),
        decision: if replaces { "replace" } else { "delete" }.to_string(),
        reason: reason_label(reason),
        consolidation_type: consolidation_type.to_string(),
    }
}

/// Carries a started command one step further; `true` when it is over.
async fn advance(
    hub: &Hub,
    conn: &Connection,
    key: &ClusterKey,
    command: &Recorded,
    claims: &[Arc<NodeClaim>],
    queued: usize,
    now: Timestamp,
) -> Result<bool, Error> {
    // A candidate counts only while it carries this very record: one rolled back or annotated
    // again by another command is not this command's any more.
    let candidates: Vec<CandidateState> = command
        .candidates
        .iter()
        .map(|name| {
            let claim =
                claim_named(claims, name).filter(|c| Recorded::on(c.annotations()).is_some_and(|r| r.id == command.id));
            CandidateState {
                name: name.clone(),
                exists: claim.is_some(),
                deleting: claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
            }
        })
        .collect();
    let api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    let mut replacements: Vec<ReplacementState> = Vec::new();
    for name in &command.replacements {
        // Absence decides a rollback: a replacement the cache does not show (yet) is read live.
        let live = match claim_named(claims, name) {
            Some(c) => Some(c.as_ref().clone()),
            None => api.get_opt(name).await.step(errors::Step::ReadClaim)?,
        };
        replacements.push(ReplacementState {
            name: name.clone(),
            present: live.as_ref().is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
            initialized: live.as_ref().is_some_and(|c| {
                conditions::is_true(
                    c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default(),
                    crate::decisions::lifecycle::INITIALIZED,
                )
            }),
        });
    }
    match disruption_queue::process(command, &candidates, &replacements, queued, now) {
        Step::Done => Ok(true),
        Step::Wait { why, .. } => {
            // A crash between the record and the taint leaves a candidate open to new pods.
            for name in &command.candidates {
                if let Some(claim) = claim_named(claims, name)
                    && let Some(node) = node_of(conn, claim)
                    && !tainted(&node)
                {
                    set_taint(conn, &node, true).await?;
                }
            }
            tracing::debug!(cluster = %key, command = %command.id, "{why}");
            Ok(false)
        }
        Step::Delete { claims: names } => {
            for name in &names {
                // Only the incarnation the command chose (a UID precondition); one the cache no
                // longer shows is gone already.
                let Some(claim) = claim_named(claims, name) else { continue };
                match api.delete(name, &ownership::delete_exactly(claim.as_ref())).await {
                    Ok(_) => {}
                    // Gone, or (409) replaced by a new claim of that name, which is not ours to delete.
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(errors::Step::DeleteClaim.failed(e).into()),
                }
                let pool = claim_named(claims, name).and_then(|c| c.labels().get(labels::NODEPOOL).cloned());
                hub.metrics
                    .nodeclaims_disrupted
                    .get(&PoolReasonLabels {
                        cluster: key.to_string(),
                        nodepool: pool.unwrap_or_default(),
                        reason: reason_label(command.reason),
                    })
                    .inc();
                if let Some(claim) = claim_named(claims, name) {
                    let note = format!(
                        "{}: deleting the node; its pods are evicted within their PodDisruptionBudgets{}",
                        command.method,
                        if command.replacements.is_empty() {
                            String::new()
                        } else {
                            format!(" onto {}", command.replacements.join(", "))
                        }
                    );
                    hub.event(&claim.object_ref(&()), false, DISRUPTION_TERMINATING, "Disrupt", note).await;
                }
            }
            tracing::info!(
                cluster = %key, command = %command.id, method = %command.method, nodeclaims = %names.join(","),
                replacements = %command.replacements.join(","),
                "disruption: replacements initialized, deleting the candidates (each node is drained first)"
            );
            Ok(false)
        }
        Step::RollBack { why, claims: names } => {
            let now = hub.now();
            for name in &names {
                let mut patch = Recorded::removal();
                // A drift command of a rollout: the failure is the rollout's news too (it halts it).
                if command.reason == DisruptionReason::Drifted
                    && let Some(claim) = claim_named(claims, name)
                {
                    let ns = claim.namespace().unwrap_or_default();
                    let pool = claim
                        .labels()
                        .get(labels::NODEPOOL)
                        .and_then(|p| hub.cache.pools.get(&kube::runtime::reflector::ObjectRef::new(p).within(&ns)));
                    if let Some(record) = rollout::rollback_record(claim, pool.as_deref(), &why, now) {
                        patch["metadata"]["annotations"][rollout::FAILURE_ANNOTATION] = json!(record);
                    }
                }
                match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(errors::Step::RemoveDisruptionRecord.failed(e).into()),
                }
                if let Some(claim) = claim_named(claims, name) {
                    if let Some(node) = node_of(conn, claim)
                        && tainted(&node)
                    {
                        set_taint(conn, &node, false).await?;
                    }
                    hub.event(&claim.object_ref(&()), true, DISRUPTION_ROLLED_BACK, "Disrupt", why.clone()).await;
                }
            }
            hub.metrics
                .disruption_queue_failures
                .get(&decision_labels(key, &command.method, command.reason, !command.replacements.is_empty()))
                .inc();
            tracing::warn!(
                cluster = %key, command = %command.id, method = %command.method, nodeclaims = %names.join(","),
                "disruption command rolled back: {why}; the nodes stay and the replacements are ordinary capacity"
            );
            Ok(true)
        }
    }
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT))
}

/// Adds or removes the `karpenter.sh/disrupted:NoSchedule` taint, guarded by the Node's
/// resourceVersion (a concurrent change fails the write and the next pass retries).
async fn set_taint(conn: &Connection, node: &Node, present: bool) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(conn.client.clone());
    let mut taints: Vec<Taint> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.retain(|t| t.key != labels::DISRUPTED_TAINT);
    if present {
        taints.push(Taint { key: labels::DISRUPTED_TAINT.into(), effect: "NoSchedule".into(), ..Taint::default() });
    }
    let patch = json!({"metadata": {"resourceVersion": node.resource_version()}, "spec": {"taints": taints}});
    match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(if present { errors::Step::TaintNode } else { errors::Step::UntaintNode }.failed(e).into()),
    }
}

/// §4.2 (2): a disrupted taint on the Node of a claim that is neither deleting nor in a command is
/// a leftover of a command that never finished (a crash, a rollback cut short): removed.
async fn release_leftover_taints(conn: &Connection, key: &ClusterKey, claims: &[Arc<NodeClaim>]) -> Result<(), Error> {
    for claim in claims {
        // A claim carrying a record that reads is one of its command's candidates.
        if Recorded::on(claim.annotations()).is_some() || claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = node_of(conn, claim)
            && node.metadata.deletion_timestamp.is_none()
            && tainted(&node)
        {
            tracing::info!(cluster = %key, nodeclaim = %claim.name_any(), node = %node.name_any(), "removing a leftover karpenter.sh/disrupted taint (no disruption command holds this node)");
            set_taint(conn, &node, false).await?;
        }
    }
    Ok(())
}

/// Why a command is dropped after the delay (logged).
#[derive(Debug, thiserror::Error)]
enum Dropped {
    /// A candidate's NodeClaim is no longer in the view.
    #[error("{claim} is gone")]
    Gone { claim: String },
    /// An emptiness command with no node left to delete.
    #[error("none of its nodes is still an empty candidate within the budget")]
    NoEmptyNode,
    /// A consolidation command the fresh view no longer supports.
    #[error(transparent)]
    Consolidation(#[from] disruption::Invalidated),
}

/// A consolidation command after the delay, on a fresh view: its candidates found again by name.
fn validate(command: &Command, view: &disruption_scope::View, now: Timestamp) -> Result<Command, Dropped> {
    let mut command = command.clone();
    for cand in &mut command.candidates {
        cand.index = view
            .scope
            .nodes
            .iter()
            .position(|n| n.claim == cand.claim)
            .ok_or_else(|| Dropped::Gone { claim: cand.claim.clone() })?;
    }
    match command.method {
        Method::Emptiness => disruption::validate_emptiness(&command, &view.scope, now).ok_or(Dropped::NoEmptyNode),
        _ => disruption::validate_consolidation(&command, &view.scope, now, &mut view.model.for_consolidation())
            .map(|()| command)
            .map_err(Dropped::from),
    }
}

/// Starts a command (§4.13): the command recorded on every candidate (each read live, so the
/// record's optimistic concurrency works on the newest version), then the replacements created
/// under the names the record gives, then the candidates' Nodes tainted. A failure before the
/// replacements exist undoes the records; a crash between the two leaves a record whose
/// replacement is missing, which the next pass rolls back.
async fn start(
    hub: &Hub,
    conn: &Connection,
    key: &ClusterKey,
    command: &Command,
    snapshot: &Snapshot,
    now: Timestamp,
) -> Result<Option<String>, Error> {
    let api: Api<NodeClaim> = Api::namespaced(hub.mgmt.clone(), &key.namespace);
    let mut candidates: Vec<NodeClaim> = Vec::new();
    for c in &command.candidates {
        match api.get_opt(&c.claim).await.step(errors::Step::ReadClaim)? {
            Some(live)
                if live.metadata.deletion_timestamp.is_none()
                    && !live.annotations().contains_key(disruption_queue::COMMAND_ANNOTATION) =>
            {
                candidates.push(live);
            }
            _ => {
                tracing::info!(cluster = %key, nodeclaim = %c.claim, "disruption command not started: a candidate is gone, deleting or already in a command; the next pass decides again");
                return Ok(None);
            }
        }
    }
    let uids: Vec<&str> = candidates.iter().filter_map(|c| c.metadata.uid.as_deref()).collect();
    let method = command.method.to_string();
    let id = disruption_queue::command_id(&method, &uids);
    let mut planned = Vec::new();
    for (i, new) in command.replacements.iter().enumerate() {
        let Some(pool) = snapshot.node_pools.iter().find(|p| p.name_any() == new.nodepool) else {
            tracing::info!(cluster = %key, nodepool = %new.nodepool, "disruption command dropped: its replacement's NodePool is gone");
            return Ok(None);
        };
        let class = snapshot.node_classes.iter().find(|c| c.name_any() == pool.spec.template.spec.node_class_ref.name);
        let mut claim =
            new_claims::node_claim(pool, class, new, &Cluster { namespace: &key.namespace, name: &key.name }, &[])?;
        claim.metadata.name = Some(disruption_queue::replacement_name(&new.nodepool, &id, i));
        claim.annotations_mut().insert(disruption_queue::REPLACES_ANNOTATION.to_string(), id.clone());
        planned.push(claim);
    }
    let replacements: Vec<String> = planned.iter().map(ResourceExt::name_any).collect();
    let record = Recorded {
        id: id.clone(),
        method: method.clone(),
        reason: command.reason,
        started: Time(now),
        candidates: command.claims().into_iter().map(str::to_string).collect(),
        replacements: replacements.clone(),
        savings_per_hour: command.savings_per_hour,
    };

    let mut recorded: Vec<String> = Vec::new();
    for claim in &candidates {
        let name = claim.name_any();
        // The resourceVersion read: a claim changed meanwhile (deleted, annotated) fails the write.
        let patch = json!({"metadata": {
            "annotations": {disruption_queue::COMMAND_ANNOTATION: record.to_annotation()},
            "resourceVersion": claim.resource_version(),
        }});
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => recorded.push(name),
            Err(e) => {
                tracing::info!(cluster = %key, nodeclaim = %name, error = %crate::infra::apierror::plain(&e), "disruption command not started: a candidate changed meanwhile; the next pass decides again");
                undo(&api, &[], &recorded).await;
                return Ok(None);
            }
        }
    }
    let mut created: Vec<NodeClaim> = Vec::new();
    for claim in &planned {
        match api.create(&PostParams::default(), claim).await {
            Ok(made) => {
                hub.metrics
                    .nodeclaims_created
                    .get(&CreatedLabels::of(&key.to_string(), &reason_label(command.reason), claim))
                    .inc();
                created.push(made);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                undo(&api, &created, &recorded).await;
                return Err(errors::Step::CreateClaim.failed(e).into());
            }
        }
    }
    let node_note = format!("{method}: tainted karpenter.sh/disrupted:NoSchedule; {command}");
    for claim in &candidates {
        if let Some(node) = node_of(conn, claim)
            && node.metadata.deletion_timestamp.is_none()
        {
            set_taint(conn, &node, true).await?;
            let ev = crate::infra::hub::event(false, DISRUPTION_LAUNCHING, "Disrupt", node_note.clone());
            hub.workload_event(&conn.client, &node.object_ref(&()), ev, crate::infra::hub::EVENT_DEDUPE).await;
        }
    }
    hub.metrics
        .disruption_decisions
        .get(&decision_labels(key, &method, command.reason, !replacements.is_empty()))
        .inc();
    tracing::info!(
        cluster = %key, command = %id, method = %method, reason = ?command.reason,
        nodeclaims = %record.candidates.join(","), replacements = %replacements.join(","),
        savings_per_hour = command.savings_per_hour,
        "disruption started: {command}"
    );
    let note = if replacements.is_empty() {
        format!("{method}: this node goes ({command})")
    } else {
        format!("{method}: this node goes once {} is initialized ({command})", replacements.join(", "))
    };
    for claim in &candidates {
        hub.event(&claim.object_ref(&()), false, DISRUPTION_LAUNCHING, "Disrupt", note.clone()).await;
    }
    Ok(Some(id))
}

/// Undoes a start cut short: replacements it created are deleted, records it wrote removed.
async fn undo(api: &Api<NodeClaim>, replacements: &[NodeClaim], recorded: &[String]) {
    for claim in replacements {
        let _ = api.delete(&claim.name_any(), &ownership::delete_exactly(claim)).await;
    }
    for name in recorded {
        let _ = api.patch(name, &PatchParams::default(), &Patch::Merge(&Recorded::removal())).await;
    }
}

/// Budgets and eligible nodes per reason (§4.5), each computed once: the gauges, and a
/// `DisruptionBlocked` event on a pool whose budgets allow no disruption for a reason while some of
/// its nodes are candidates for it (deduplicated).
async fn publish_budgets(hub: &Hub, key: &ClusterKey, scope: &disruption::Scope, now: Timestamp) {
    for method in [Method::Emptiness, Method::Drift, Method::SingleNodeConsolidation] {
        let reason = method.reason();
        let eligible = eligible(scope, method, now);
        hub.metrics
            .disruption_eligible_nodes
            .get(&ReasonLabels { cluster: key.to_string(), reason: reason_label(reason) })
            .set(i64::try_from(eligible.len()).unwrap_or(i64::MAX));
        for (pool, left) in disruption::allowances(scope, reason, now) {
            hub.metrics
                .disruption_allowed
                .get(&PoolReasonLabels {
                    cluster: key.to_string(),
                    nodepool: pool.clone(),
                    reason: reason_label(reason),
                })
                .set(i64::try_from(left).unwrap_or(i64::MAX));
            if left > 0 || !eligible.iter().any(|c| c.nodepool == pool) {
                continue;
            }
            let Some(p) = hub.cache.pools.get(&kube::runtime::reflector::ObjectRef::new(&pool).within(&key.namespace))
            else {
                continue;
            };
            let note = format!(
                "the disruption budgets of NodePool {pool} allow no {reason:?} disruption now; its candidate nodes wait"
            );
            hub.event(&p.object_ref(&()), false, DISRUPTION_BLOCKED, "Disrupt", note).await;
        }
    }
}

/// The candidates a method would consider for its reason: empty and consolidatable (emptiness),
/// drifted (drift), consolidatable and not empty (consolidation).
fn eligible(scope: &disruption::Scope, method: Method, now: Timestamp) -> Vec<disruption::Candidate> {
    let wanted = |c: &&disruption::Candidate| {
        let n = &scope.nodes[c.index];
        match method {
            Method::Emptiness => n.consolidatable && n.is_empty(),
            Method::Drift => n.drifted.is_some(),
            _ => n.consolidatable && !n.is_empty(),
        }
    };
    disruption::candidates(scope, method, now).eligible.iter().filter(wanted).cloned().collect()
}

/// `DisruptionBlocked` events on the claims a user would expect to go (deduplicated per claim),
/// and warnings for unreadable settings.
async fn report(hub: &Hub, key: &ClusterKey, scope: &disruption::Scope, pass: &disruption_scope::Pass) {
    let mut seen = BTreeSet::new();
    for (_, outcome) in &pass.methods {
        for (claim, why) in outcome.blocked.iter().chain(outcome.warnings.iter()) {
            if !seen.insert(claim.clone()) {
                continue;
            }
            let Some(node) = scope.nodes.iter().find(|n| &n.claim == claim) else { continue };
            let reference = ObjectReference {
                api_version: Some(NodeClaim::api_version(&()).to_string()),
                kind: Some(NodeClaim::kind(&()).to_string()),
                namespace: Some(key.namespace.clone()),
                name: Some(node.claim.clone()),
                ..ObjectReference::default()
            };
            hub.event(&reference, false, DISRUPTION_BLOCKED, "Disrupt", why.clone()).await;
        }
    }
}

#[cfg(test)]
mod tests;
