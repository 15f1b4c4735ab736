//! The invariants a fleet must keep whatever happens to the hub (issue 17: process kills, API
//! faults, partitions), checked on what the API servers show, observation after observation.
//!
//! Owns: the checks and their bookkeeping (what was seen before, how long a transient state has
//! lasted while the hub was up), counts of checks made and the violations found. Must not: act on
//! the world (it only reads), or judge from wall-clock time while the hub is down (a dead hub
//! cannot collect or finish anything; only its live time counts against a bound).
//!
//! Use: `#[path = "common/invariants.rs"] mod invariants;` next to `mod common;`, then
//! `Invariants::new(settings)`, hand `exemptions()` to the code that kills the hub or deletes pods
//! and claims itself, call `observe(&world).await` every 100-250 ms (a background task), then
//! `observe_final(&world).await` at the end and `report()`.
//!
//! The invariants (names as they appear in violations):
//! - `one-nodegroup-per-claim`: a NodeClaim (by UID) never has had two NodeGroups (by UID), at
//!   once or one after the other.
//! - `orphan-collected`: a NodeGroup of this hub whose claim is gone (or recreated) is collected
//!   within the GC period (+ slack) of hub live time once older than the GC minimum age.
//! - `pdb-respected`: every eviction the API admitted had its budget's leave (emulator's log).
//! - `evicted-not-deleted`: no bound pod is deleted outright by anyone but the test (the hub has no
//!   termination deadline here; the pod GC of a Node that vanished undrained shows up here too).
//! - `drained-before-deletion`: a NodeGroup being deleted has no active, drainable pod on its node
//!   (unless its claim was force-deleted by the test, or its termination deadline has passed).
//! - `deleted-under-live-claim`: a NodeGroup is never deleted while its claim lives on (but for a
//!   group refused for quota, deleted at once and its claim just after).
//! - `cooldown-honoured`: no NodeGroup of a flavor is created while that flavor is in the cluster's
//!   persisted cool-down (its ConfigMap), whatever restarts happened since it was recorded; a
//!   cool-down cleared early (capacity freed, clever-cloud.md §3.5) ends where it was last seen.
//! - `disruption-not-half-done`: a Node carrying `karpenter.sh/disrupted` whose claim is not being
//!   deleted is released (or its claim deleted) within a bound of hub live time.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use crds::{NodeClaim, NodeGroup, labels};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Node, Pod},
    jiff::Timestamp,
};
use kube::{Api, ResourceExt, api::ListParams};
use operator::commands::sandbox::world::World;

/// What the checks need to know about the hub under test.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--hub-id`: only its NodeGroups are judged.
    pub hub_id: String,
    /// `--gc-min-age-seconds`.
    pub gc_min_age: Duration,
    /// `--gc-period-seconds`.
    pub gc_period: Duration,
    /// `--flavor-cooldown-seconds`.
    pub flavor_cooldown: Duration,
    /// Hub live time allowed on top of a bound (connecting, syncing, a pass, a requeue).
    pub slack: Duration,
    /// Hub live time a disruption command may hold a Node tainted before its claim is deleted
    /// (the replacement's launch and initialization, a disruption pass).
    pub command_bound: Duration,
}

/// What the test does itself, or knows of the hub, told to the checks as it happens.
#[derive(Debug, Clone, Default)]
pub struct Exemptions(Arc<Mutex<Exempt>>);

#[derive(Debug, Default)]
struct Exempt {
    pods_deleted_by_test: BTreeSet<String>,
    force_deleted_groups: BTreeSet<(usize, String)>,
    hub_down: bool,
}

impl Exemptions {
    fn with<T>(&self, f: impl FnOnce(&mut Exempt) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The test deletes this pod (by UID) itself: say so before the request.
    pub fn pod_deleted_by_test(&self, uid: &str) {
        self.with(|e| e.pods_deleted_by_test.insert(uid.to_string()));
    }

    /// The test force-deletes the claim of NodeGroup `group` in cluster `cluster` (finalizers
    /// removed): its node goes undrained, by the user's hand.
    pub fn claim_force_deleted(&self, cluster: usize, group: &str) {
        self.with(|e| e.force_deleted_groups.insert((cluster, group.to_string())));
    }

    /// Whether the hub runs (time while it is down does not count against its bounds). Up by default.
    pub fn hub_running(&self, up: bool) {
        self.with(|e| e.hub_down = !up);
    }
}

/// One broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Since [`Invariants::new`].
    pub at: Duration,
    /// `namespace/cluster`.
    pub cluster: String,
    pub invariant: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{:>7.1}s] {} {}: {}", self.at.as_secs_f64(), self.cluster, self.invariant, self.detail)
    }
}

/// What the checks did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub observations: u64,
    /// Observations given up because a read failed (not counted as checks).
    pub failed_observations: u64,
    /// Individual checks (one invariant on one object in one observation).
    pub checks: u64,
    /// Evictions and pod deletions read from the emulators' logs.
    pub pod_disruptions: u64,
    pub violations: Vec<Violation>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} observations ({} failed reads), {} invariant checks, {} pod disruptions logged, violations: {}",
            self.observations,
            self.failed_observations,
            self.checks,
            self.pod_disruptions,
            self.violations.len()
        )?;
        for v in &self.violations {
            write!(f, "\n  {v}")?;
        }
        Ok(())
    }
}

/// The checker. Observations must come from one task at a time (`&mut self`).
#[derive(Debug)]
pub struct Invariants {
    settings: Settings,
    exemptions: Exemptions,
    start: Instant,
    last: Option<Instant>,
    clusters: Vec<Track>,
    report: Report,
    reported: BTreeSet<String>,
}

/// What has been seen of one cluster so far.
#[derive(Debug, Default)]
struct Track {
    log_cursor: u64,
    /// Claim UID → the UIDs of every NodeGroup made for it.
    groups_of_claim: BTreeMap<String, BTreeSet<String>>,
    /// Group UID → hub live time spent as an old-enough orphan.
    orphan_live: BTreeMap<String, Duration>,
    /// Node name → hub live time spent tainted with its claim not deleting.
    tainted_live: BTreeMap<String, Duration>,
    /// Node name → its NodeGroup (nodes outlive nothing, but the log outlives nodes).
    group_of_node: BTreeMap<String, String>,
    /// (flavor, end) of every cool-down seen in the persisted capacity state → when it was last
    /// seen there, and whether it was lifted early (gone before its end: capacity freed, §3.5).
    cooldowns: BTreeMap<(String, Timestamp), (Timestamp, bool)>,
    /// Group UID → (name, flavor, creation) of every group seen.
    created: BTreeMap<String, (String, String, Timestamp)>,
}

/// One cluster's objects, read at one observation.
struct Snapshot {
    claims: Vec<NodeClaim>,
    groups: Vec<NodeGroup>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    capacity: Option<ConfigMap>,
}

impl Invariants {
    pub fn new(settings: Settings) -> Invariants {
        Invariants {
            settings,
            exemptions: Exemptions::default(),
            start: Instant::now(),
            last: None,
            clusters: Vec::new(),
            report: Report::default(),
            reported: BTreeSet::new(),
        }
    }

    /// The handle through which the test tells what it does itself.
    pub fn exemptions(&self) -> Exemptions {
        self.exemptions.clone()
    }

    pub fn report(&self) -> Report {
        self.report.clone()
    }

    /// One observation of every cluster of `world`.
    pub async fn observe(&mut self, world: &World) {
        let now = Instant::now();
        let live = match self.last.replace(now) {
            Some(prev) if !self.exemptions.with(|e| e.hub_down) => now - prev,
            _ => Duration::ZERO,
        };
        self.report.observations += 1;
        for i in 0..world.clusters.len() {
            if self.clusters.len() <= i {
                self.clusters.push(Track::default());
            }
            match snapshot(world, i).await {
                Ok(s) => self.check(world, i, &s, live),
                Err(e) => {
                    self.report.failed_observations += 1;
                    eprintln!("invariants: reading cluster {i} failed: {e}");
                }
            }
        }
    }

    /// The last observation, once the test is done with the world (the hub may still be at work:
    /// a command begun after convergence is not half-done, so the bounds stay those of the run).
    pub async fn observe_final(&mut self, world: &World) {
        self.observe(world).await;
    }

    fn violation(&mut self, world: &World, i: usize, invariant: &'static str, key: &str, detail: String) {
        if !self.reported.insert(format!("{i}/{invariant}/{key}")) {
            return;
        }
        let c = &world.clusters[i];
        let v =
            Violation { at: self.start.elapsed(), cluster: format!("{}/{}", c.namespace, c.name), invariant, detail };
        eprintln!("INVARIANT VIOLATED {v}");
        self.report.violations.push(v);
    }

    fn check(&mut self, world: &World, i: usize, s: &Snapshot, live: Duration) {
        let st = self.settings.clone();
        let now = Timestamp::now();
        let claim_of = |g: &NodeGroup| -> Option<&NodeClaim> {
            let (ns, name) = (g.labels().get(labels::NODECLAIM_NAMESPACE)?, g.labels().get(labels::NODECLAIM)?);
            s.claims.iter().find(|c| c.namespace().as_ref() == Some(ns) && &c.name_any() == name)
        };
        let owned: Vec<&NodeGroup> =
            s.groups.iter().filter(|g| g.labels().get(labels::HUB) == Some(&st.hub_id)).collect();
        let mut checks = 0u64;
        let mut found: Vec<(&'static str, String, String)> = Vec::new();

        // Remember nodes' groups and groups' creations (for the log and the cool-down check).
        for n in &s.nodes {
            if let Some(g) = n.labels().get(labels::CLEVER_NODEGROUP) {
                self.clusters[i].group_of_node.insert(n.name_any(), g.clone());
            }
        }
        for g in &owned {
            if let Some(created) = g.metadata.creation_timestamp.as_ref() {
                self.clusters[i]
                    .created
                    .insert(g.uid().unwrap_or_default(), (g.name_any(), g.spec.flavor.clone(), created.0));
            }
        }
        let forced = |group: &str| self.exemptions.with(|e| e.force_deleted_groups.contains(&(i, group.to_string())));

        for g in &owned {
            let (gname, guid) = (g.name_any(), g.uid().unwrap_or_default());
            let claim_uid = g.annotations().get(labels::NODECLAIM_UID).cloned().unwrap_or_default();
            let claim = claim_of(g);
            let claim_alive = claim.filter(|c| c.uid().as_deref() == Some(claim_uid.as_str()));

            // One NodeGroup per claim, over all time.
            checks += 1;
            let seen = self.clusters[i].groups_of_claim.entry(claim_uid.clone()).or_default();
            seen.insert(guid.clone());
            if seen.len() > 1 {
                found.push((
                    "one-nodegroup-per-claim",
                    claim_uid.clone(),
                    format!(
                        "claim {}/{} (UID {claim_uid}) has had {} NodeGroups (UIDs {:?}), the latest {gname}",
                        g.labels().get(labels::NODECLAIM_NAMESPACE).cloned().unwrap_or_default(),
                        g.labels().get(labels::NODECLAIM).cloned().unwrap_or_default(),
                        seen.len(),
                        seen
                    ),
                ));
            }

            if !g.is_terminating() {
                // Orphans are collected within the period once old enough.
                checks += 1;
                let created = g.metadata.creation_timestamp.as_ref().map(|t| t.0);
                let old = created.is_some_and(|c| now.duration_since(c).as_secs_f64() >= st.gc_min_age.as_secs_f64());
                if claim_alive.is_none() && old {
                    let spent = self.clusters[i].orphan_live.entry(guid.clone()).or_default();
                    *spent += live;
                    let spent = *spent;
                    if spent > st.gc_period + st.slack {
                        found.push((
                            "orphan-collected",
                            guid.clone(),
                            format!(
                                "NodeGroup {gname} has no claim (UID {claim_uid} gone) and was not collected after {spent:?} of hub live time past its minimum age"
                            ),
                        ));
                    }
                } else {
                    self.clusters[i].orphan_live.remove(&guid);
                }
                continue;
            }

            // Deleting: never under a live claim (but a group CKE refused for quota is deleted at
            // once, its claim just after: clever-cloud.md §3.5), never with pods left on its node.
            checks += 1;
            if let Some(c) = claim_alive.filter(|c| c.metadata.deletion_timestamp.is_none() && !g.is_quota_rejected()) {
                found.push((
                    "deleted-under-live-claim",
                    guid.clone(),
                    format!("NodeGroup {gname} is being deleted while its claim {} lives on", c.name_any()),
                ));
            }
            checks += 1;
            let deadline_passed = claim_alive
                .and_then(|c| c.annotations().get(labels::TERMINATION_TIMESTAMP).cloned())
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|t| t <= now);
            if forced(&gname) || deadline_passed {
                continue;
            }
            let nodes: BTreeSet<String> = s
                .nodes
                .iter()
                .filter(|n| n.labels().get(labels::CLEVER_NODEGROUP) == Some(&gname))
                .map(ResourceExt::name_any)
                .collect();
            let left: Vec<String> = s
                .pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|sp| sp.node_name.as_ref()).is_some_and(|n| nodes.contains(n)))
                .filter(|p| drainable(p))
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect();
            if !left.is_empty() {
                found.push((
                    "drained-before-deletion",
                    guid.clone(),
                    format!("NodeGroup {gname} is being deleted with pods still on its node: {}", left.join(", ")),
                ));
            }
        }
        let live_groups: BTreeSet<String> = owned.iter().filter_map(|g| g.uid()).collect();
        self.clusters[i].orphan_live.retain(|uid, _| live_groups.contains(uid));

        // The emulator's log of pods whose termination began.
        let log = world.clusters[i].server.disruptions().since(self.clusters[i].log_cursor);
        for d in &log {
            self.clusters[i].log_cursor = d.seq + 1;
            self.report.pod_disruptions += 1;
            checks += 1;
            let Some(node) = d.node.as_deref() else { continue };
            let pdb = d.pdb.as_ref().map_or("none".to_string(), |p| {
                format!(
                    "{} (allowed {}, healthy {}/{} desired)",
                    p.name, p.disruptions_allowed, p.current_healthy, p.desired_healthy
                )
            });
            match d.via {
                sim::apiserver::Via::Eviction => {
                    if d.ready && d.pdb.as_ref().is_some_and(|p| p.disruptions_allowed <= 0) {
                        found.push((
                            "pdb-respected",
                            d.uid.clone(),
                            format!(
                                "pod {}/{} evicted from {node} at {} beyond its budget {pdb}",
                                d.namespace, d.name, d.at
                            ),
                        ));
                    }
                }
                sim::apiserver::Via::Delete { grace_seconds } => {
                    let by_test = self.exemptions.with(|e| e.pods_deleted_by_test.contains(&d.uid));
                    let group = self.clusters[i].group_of_node.get(node).cloned().unwrap_or_default();
                    if !by_test && !forced(&group) {
                        found.push((
                            "evicted-not-deleted",
                            d.uid.clone(),
                            format!(
                                "pod {}/{} on {node} (NodeGroup {group}) deleted outright (grace {grace_seconds}s) at {}, not evicted; budget {pdb}",
                                d.namespace, d.name, d.at
                            ),
                        ));
                    }
                }
            }
        }

        // Disruption commands are finished or released, not left half-done.
        let mut tainted_now = BTreeSet::new();
        for n in &s.nodes {
            let tainted = n
                .spec
                .as_ref()
                .and_then(|sp| sp.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT));
            if !tainted || n.metadata.deletion_timestamp.is_some() {
                continue;
            }
            checks += 1;
            let group = n.labels().get(labels::CLEVER_NODEGROUP);
            let claim = group.and_then(|g| s.groups.iter().find(|x| &x.name_any() == g)).and_then(&claim_of);
            if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
                continue; // terminating: the drain holds the taint
            }
            let name = n.name_any();
            tainted_now.insert(name.clone());
            let spent = self.clusters[i].tainted_live.entry(name.clone()).or_default();
            *spent += live;
            let spent = *spent;
            if spent > st.command_bound {
                found.push((
                    "disruption-not-half-done",
                    name.clone(),
                    format!(
                        "Node {name} tainted {} for {spent:?} of hub live time while its claim {} is not being deleted",
                        labels::DISRUPTED_TAINT,
                        claim.map(ResourceExt::name_any).unwrap_or_default(),
                    ),
                ));
            }
        }
        self.clusters[i].tainted_live.retain(|n, _| tainted_now.contains(n));

        // Persisted cool-downs are honoured: no group of a cooling flavor created inside the window.
        if let Some(state) = s
            .capacity
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get(operator::infra::hub::CAPACITY_KEY))
            .and_then(|j| serde_json::from_str::<operator::decisions::capacity::CapacityState>(j).ok())
        {
            let seen_at = Timestamp::now();
            for ((flavor, until), (_, lifted)) in &mut self.clusters[i].cooldowns {
                if !*lifted && *until > seen_at && state.unavailable_until.get(flavor) != Some(until) {
                    // Cleared early (an accepted group fully gone): the window ended after it was last seen.
                    *lifted = true;
                }
            }
            for (flavor, until) in state.unavailable_until {
                let e = self.clusters[i].cooldowns.entry((flavor, until)).or_insert((seen_at, false));
                e.0 = seen_at;
            }
        }
        // CKE stamps whole seconds; the hub records the cool-down just after the refusal.
        let margin = k8s_openapi::jiff::SignedDuration::from_secs(2);
        let cooldown = k8s_openapi::jiff::SignedDuration::try_from(st.flavor_cooldown).unwrap_or_default();
        let mut breaches = Vec::new();
        for (uid, (name, flavor, created)) in &self.clusters[i].created {
            for ((f, until), (last_seen, lifted)) in &self.clusters[i].cooldowns {
                checks += 1;
                let from = *until - cooldown;
                // A window lifted early ends where it was last seen (a group created between that
                // observation and the clear goes unjudged: one observation period).
                let end = if *lifted { (*last_seen).min(*until) } else { *until };
                if f == flavor && *created > from + margin && *created < end - margin {
                    breaches.push((
                        uid.clone(),
                        format!("NodeGroup {name} ({flavor}) created at {created}, inside the cool-down of {flavor} recorded at ~{from} until {until}"),
                    ));
                }
            }
        }
        for (uid, detail) in breaches {
            found.push(("cooldown-honoured", uid, detail));
        }

        self.report.checks += checks;
        for (invariant, key, detail) in found {
            self.violation(world, i, invariant, &key, detail);
        }
    }
}

/// A pod the drain must see gone before the node goes (karpenter-semantics.md §5.3, §5.5): bound,
/// active, not a DaemonSet's or a mirror pod, not tolerating the disrupted taint.
fn drainable(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
    let tolerates = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.as_deref() == Some(labels::DISRUPTED_TAINT) || t.key.is_none()));
    p.metadata.deletion_timestamp.is_none()
        && phase != "Succeeded"
        && phase != "Failed"
        && !daemon
        && !mirror
        && !tolerates
}

async fn snapshot(world: &World, i: usize) -> Result<Snapshot, kube::Error> {
    snapshot_through(world, i, &world.mgmt.client(), &world.clusters[i].client()).await
}

impl Invariants {
    /// [`Invariants::observe`] reading through the given clients instead of the world's (say,
    /// clients exempt from the faults injected into the hub's traffic, so that the checks neither
    /// fail their reads nor add to the fault counts): `mgmt` for the management cluster,
    /// `workloads[i]` for cluster `i`.
    pub async fn observe_through(&mut self, world: &World, mgmt: &kube::Client, workloads: &[kube::Client]) {
        let now = Instant::now();
        let live = match self.last.replace(now) {
            Some(prev) if !self.exemptions.with(|e| e.hub_down) => now - prev,
            _ => Duration::ZERO,
        };
        self.report.observations += 1;
        for (i, workload) in workloads.iter().enumerate().take(world.clusters.len()) {
            if self.clusters.len() <= i {
                self.clusters.push(Track::default());
            }
            match snapshot_through(world, i, mgmt, workload).await {
                Ok(s) => self.check(world, i, &s, live),
                Err(e) => {
                    self.report.failed_observations += 1;
                    eprintln!("invariants: reading cluster {i} failed: {e}");
                }
            }
        }
    }

    /// [`Invariants::observe_final`] through the given clients (see [`Invariants::observe_through`]).
    pub async fn observe_final_through(&mut self, world: &World, mgmt: &kube::Client, workloads: &[kube::Client]) {
        self.observe_through(world, mgmt, workloads).await;
    }
}

/// One cluster's state read through the given clients, in an order that makes the checks sound.
async fn snapshot_through(
    world: &World,
    i: usize,
    mgmt: &kube::Client,
    workload: &kube::Client,
) -> Result<Snapshot, kube::Error> {
    let c = &world.clusters[i];
    let lp = ListParams::default();
    // The capacity state first: a cool-down recorded is seen before any group created inside it.
    let capacity = Api::<ConfigMap>::namespaced(mgmt.clone(), &c.namespace)
        .get_opt(&operator::infra::hub::capacity_configmap(&c.key()))
        .await?;
    let groups = Api::<NodeGroup>::all(workload.clone()).list(&lp).await?.items;
    let nodes = Api::<Node>::all(workload.clone()).list(&lp).await?.items;
    let pods = Api::<Pod>::all(workload.clone()).list(&lp).await?.items;
    // Claims last: a claim's deletion precedes its group's, so a group seen deleting whose claim
    // is read alive afterwards was deleted under it; the reverse order would see a claim deleted
    // just after it was read as alive.
    let claims = Api::<NodeClaim>::namespaced(mgmt.clone(), &c.namespace)
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|claim| claim.spec.cluster_name == c.name)
        .collect();
    Ok(Snapshot { claims, groups, nodes, pods, capacity })
}
