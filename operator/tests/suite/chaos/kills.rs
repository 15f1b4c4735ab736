//! Chaos, process kills (issue 17 item 1): the `karpenter-hub` binary, run as a child process
//! against the emulated world (management emulator + two workload emulators with simulated CKE),
//! killed with SIGKILL at seeded-random moments and restarted, while the test drives a workload
//! through every phase of a node's life: pods created (launch, registration), a burst past the
//! organisation quota (rejection, persisted flavor cool-down), pods deleted (emptiness and
//! consolidation: drain under a PodDisruptionBudget, termination), the node class changed (drift),
//! expiry, and claims force-deleted while the hub is down (their NodeGroups orphaned: GC).
//!
//! The invariants of `common/invariants.rs` are checked every 150 ms by a background task and at
//! the end; after the last restart the fleet must converge (every pod Running, one claim per
//! NodeGroup, no empty node, nothing deleting) within [`CONVERGENCE`].
//!
//! Sharded mode (issue 30): two `run --sharding` replicas, one killed at a time (both at once one
//! time in four), each restarted as a new member; every write to a workload cluster is audited
//! against the holder of its shard bucket's Lease ([`super::audit`]).
//!
//! CI runs [`CI_KILLS`] kills, [`CI_SHARDED_KILLS`] in sharded mode. The soak: `KARPENTER_HUB_CHAOS_KILLS=2000 cargo test -p operator
//! --test suite chaos::kills -- --nocapture` (ten times the kills; the workload script repeats). Set
//! `KARPENTER_HUB_CHAOS_SEED` to replay another sequence of lifetimes. Figures: docs/reliability.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crds::nodepool::DisruptionReason;
use crds::{NodeClaim, NodeGroup, labels};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use operator::{
    commands::sandbox::world::{World, quick_cke, workload_pod},
    decisions::{disruption_queue::Recorded, termination},
};
use serde_json::{Value, json};
use sim::{
    cke::{DelayRange, Usage},
    clock::SeededRng,
};

use super::audit::{self, Holders};
use crate::{common, invariants};

use invariants::{Exemptions, Invariants, Settings};

/// Kills in the CI-sized run.
const CI_KILLS: u64 = 200;
/// Kills in the CI-sized sharded run (longer lives: a replica must join and take buckets).
const CI_SHARDED_KILLS: u64 = 60;
/// The sharded replicas' `POD_NAME`s (each life a new member: `<name>-<pid>`).
const REPLICAS: [&str; 2] = ["replica-a", "replica-b"];
/// Sharded mode's Lease timings (also the leader Lease's), short for the test.
const SHARD_LEASE: u64 = 4;
const SHARD_RENEW: u64 = 3;
const SHARD_RETRY: u64 = 1;
/// Where the sharded replicas keep their Leases.
const LEASES: &str = "karpenter-hub";

/// One `karpenter-hub run` process, or two sharded replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Single,
    Sharded,
}
/// How long the fleet may take to converge after the last restart (drift of one cluster's nodes
/// included), on a loaded 2-core machine.
const CONVERGENCE: Duration = Duration::from_secs(120);
/// Hub flags that make every phase happen within seconds.
const GC_MIN_AGE: u64 = 5;
const GC_PERIOD: u64 = 5;
const COOLDOWN: u64 = 20;
/// The disruption loop's validation wait (15 s by default): 1 s lets a consolidation command be
/// decided, validated and started within the longer lives, and killed half-done.
const VALIDATION: u64 = 1;
/// The phases every CI-sized run must have killed the hub in, at least once each.
const REQUIRED_PHASES: [&str; 5] = ["launch", "registration", "drain", "consolidation", "gc"];
/// The same in sharded mode, whose fewer, longer lives land in a consolidation too rarely to
/// require it (it is counted and reported).
const REQUIRED_SHARDED_PHASES: [&str; 4] = ["launch", "registration", "drain", "gc"];
/// Pod size: about two per 2XS.
const CPU: &str = "500m";
const MEMORY: &str = "1200Mi";

/// The hub process of one life.
struct Hub {
    child: std::process::Child,
}

impl Hub {
    /// `replica`: a sharded replica of that `POD_NAME`; `None`, the one process.
    fn start(bin: &Path, kubeconfig: &Path, log: &Path, life: u64, replica: Option<&str>) -> Hub {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        writeln!(file, "===== life {life} ({}) =====", replica.unwrap_or("the hub")).unwrap();
        let mut command = std::process::Command::new(bin);
        command.env_clear();
        match replica {
            // One replica: a SIGKILLed leader's Lease would hold its successor off for the
            // Lease duration at every one of hundreds of restarts.
            None => {
                command.arg("run").arg("--leader-elect=false");
            }
            Some(name) => {
                command.arg("run").env("POD_NAME", name).args([
                    "--sharding".to_string(),
                    format!("--leader-election-namespace={LEASES}"),
                    format!("--shard-lease-duration={SHARD_LEASE}"),
                    format!("--shard-renew-deadline={SHARD_RENEW}"),
                    format!("--shard-retry-period={SHARD_RETRY}"),
                ]);
            }
        }
        let child = command
            .arg("--hub-id=default")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--metrics-addr=127.0.0.1:0")
            .arg("--probe-interval-seconds=2")
            .arg(format!("--flavor-cooldown-seconds={COOLDOWN}"))
            .arg(format!("--gc-min-age-seconds={GC_MIN_AGE}"))
            .arg(format!("--gc-period-seconds={GC_PERIOD}"))
            .arg(format!("--disruption-validation-seconds={VALIDATION}"))
            .env("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn")
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Hub { child }
    }

    /// SIGKILL: nothing released, nothing flushed, no shutdown path.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process died on its own (it must not).
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// Seeded lifetimes. Most are short (kills during start-up, relists and a claim's first steps:
/// a claim acts as soon as its cluster syncs); some last 1-2.5 s (a provisioning batch, launches,
/// registrations, drain passes); a few last 2.5-4 s, past the disruption loop's first pass plus
/// its validation wait, so consolidation and emptiness commands start and are killed half-done.
fn lifetime(rng: &mut SeededRng) -> Duration {
    let ms = match rng.below(100) {
        0..=2 => 2_500 + rng.below(1_500),
        3..=11 => 1_200 + rng.below(1_300),
        _ => 100 + rng.below(200),
    };
    Duration::from_millis(ms)
}

/// Each cluster's pods: named `web-<n>` with `n` never reused, the newest deleted first.
#[derive(Default)]
struct Pods {
    next: Vec<usize>,
}

impl Pods {
    async fn set(&mut self, world: &World, ex: &Exemptions, i: usize, count: usize) {
        if self.next.len() <= i {
            self.next.resize(i + 1, 0);
        }
        let api: Api<Pod> = Api::namespaced(world.clusters[i].client(), "default");
        let mut live: Vec<(usize, Pod)> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| Some((p.name_any().strip_prefix("web-")?.parse().ok()?, p)))
            .collect();
        live.sort_by_key(|(n, _)| *n);
        while live.len() > count {
            let (_, pod) = live.pop().unwrap();
            ex.pod_deleted_by_test(&pod.uid().unwrap());
            let _ = api.delete(&pod.name_any(), &DeleteParams::default()).await;
        }
        for _ in live.len()..count {
            let n = self.next[i];
            self.next[i] += 1;
            let mut pod = workload_pod(&format!("web-{n}"), CPU, MEMORY);
            // The drain's tier and the budget see an ordinary workload pod of one app.
            pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
            api.create(&PostParams::default(), &pod).await.unwrap();
        }
    }
}

/// One step of the workload script, at an offset of its cycle.
#[derive(Debug, Clone, Copy)]
enum Step {
    Pods(usize, usize),
    /// Change cluster `i`'s node class labels: every node drifts.
    Drift(usize),
    /// Force-delete one launched claim of cluster `i` (finalizers dropped) while the hub is down.
    ForceDelete(usize),
}

const ALPHA: usize = 0;
const BETA: usize = 1;

/// The script of one cycle (seconds into the cycle). Alpha's quota leaves room for ~12 GB of
/// workers: its burst to 12 pods is refused (a cool-down and a creation back-off), once.
fn cycle(first: bool) -> Vec<(u64, Step)> {
    let mut steps = vec![(0, Step::Pods(ALPHA, 5)), (0, Step::Pods(BETA, 5))];
    if first {
        steps.push((10, Step::Pods(ALPHA, 12)));
        steps.push((22, Step::Pods(ALPHA, 4)));
    } else {
        steps.push((22, Step::Pods(ALPHA, 3)));
    }
    steps.extend([
        (14, Step::ForceDelete(BETA)),
        (20, Step::Pods(BETA, 2)),
        (30, Step::Drift(BETA)),
        (36, Step::ForceDelete(ALPHA)),
        (40, Step::Pods(BETA, 6)),
        (50, Step::Pods(ALPHA, 5)),
        (55, Step::Pods(BETA, 3)),
    ]);
    if !first {
        steps.push((45, Step::Drift(ALPHA)));
    }
    steps.sort_by_key(|(t, _)| *t);
    steps
}
const CYCLE: u64 = 60;

async fn run_step(
    world: &World,
    ex: &Exemptions,
    pods: &mut Pods,
    desired: &mut [usize],
    step: Step,
    generation: usize,
    forced: &mut BTreeSet<(usize, String)>,
) -> String {
    match step {
        Step::Pods(i, n) => {
            desired[i] = n;
            pods.set(world, ex, i, n).await;
            format!("{}: {n} pods", world.clusters[i].name)
        }
        Step::Drift(i) => {
            let c = &world.clusters[i];
            let api: Api<crds::CleverNodeClass> = Api::namespaced(world.mgmt.client(), &c.namespace);
            let patch = json!({"spec": {"labels": {"team": format!("platform-{generation}")}}});
            api.patch("default", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            format!("{}: node class changed (drift)", c.name)
        }
        Step::ForceDelete(i) => {
            let c = &world.clusters[i];
            let api: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &c.namespace);
            let claims = api.list(&ListParams::default()).await.unwrap().items;
            let Some(claim) = claims.iter().find(|cl| {
                cl.spec.cluster_name == c.name
                    && cl.metadata.deletion_timestamp.is_none()
                    && cl.status.as_ref().and_then(|s| s.provider_id.as_ref()).is_some()
            }) else {
                return format!("{}: no launched claim to force-delete", c.name);
            };
            let group = claim
                .status
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|p| p.strip_prefix("clevercloud://"))
                .unwrap()
                .to_string();
            ex.claim_force_deleted(i, &group);
            forced.insert((i, group.clone()));
            let name = claim.name_any();
            let drop = json!({"metadata": {"finalizers": null}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&drop)).await.unwrap();
            let _ = api.delete(&name, &DeleteParams::default()).await;
            format!("{}: claim {name} force-deleted (NodeGroup {group} orphaned)", c.name)
        }
    }
}

/// Kills by the phase under way at that moment in either cluster (a kill counts once in each
/// phase under way, so in several at once).
#[derive(Debug, Default)]
struct Phases(BTreeMap<&'static str, u64>);

/// The phases under way now, read from the API: `launch` (a claim not launched yet),
/// `registration` (launched, not initialized), `drain` (a deleting claim whose node is there and
/// not drained), `consolidation` (a started consolidation or emptiness command recorded on a claim
/// still there), `drift/expiry` (the same for drift), `gc` (a NodeGroup orphaned by a force-deleted claim
/// still there: not reaped yet, or reaped and its nodes' finalizers still to be released),
/// `provisioning` (pods pending), else `steady`.
async fn phases_under_way(world: &World, forced: &BTreeSet<(usize, String)>) -> BTreeSet<&'static str> {
    let mut seen = BTreeSet::new();
    for (i, c) in world.clusters.iter().enumerate() {
        let claims: Vec<NodeClaim> = Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let groups: Vec<NodeGroup> = Api::all(c.client()).list(&ListParams::default()).await.unwrap().items;
        let nodes: Vec<Node> = Api::all(c.client()).list(&ListParams::default()).await.unwrap().items;
        let cond = |cl: &NodeClaim, t: &str| {
            cl.status.as_ref().is_some_and(|s| s.conditions.iter().any(|x| x.type_ == t && x.status == "True"))
        };
        let mine: Vec<&NodeClaim> = claims.iter().filter(|cl| cl.spec.cluster_name == c.name).collect();
        let pods: Vec<Pod> = Api::namespaced(c.client(), "default").list(&ListParams::default()).await.unwrap().items;
        if pods.iter().any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")) {
            seen.insert("provisioning");
        }
        let live = |cl: &&&NodeClaim| cl.metadata.deletion_timestamp.is_none();
        if mine.iter().filter(live).any(|cl| !cond(cl, "Launched")) {
            seen.insert("launch");
        }
        if mine.iter().filter(live).any(|cl| cond(cl, "Launched") && !cond(cl, "Initialized")) {
            seen.insert("registration");
        }
        let node_of = |cl: &NodeClaim| {
            let id = cl.status.as_ref().and_then(|s| s.provider_id.clone())?;
            nodes.iter().find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_ref()) == Some(&id))
        };
        if mine.iter().any(|cl| {
            cl.metadata.deletion_timestamp.is_some() && node_of(cl).is_some() && !cond(cl, termination::DRAINED)
        }) {
            seen.insert("drain");
        }
        for cl in &mine {
            match Recorded::on(cl.annotations()).map(|r| r.reason) {
                Some(DisruptionReason::Empty | DisruptionReason::Underutilized) => seen.insert("consolidation"),
                Some(DisruptionReason::Drifted) => seen.insert("drift/expiry"),
                None => false,
            };
        }
        let orphan = groups.iter().any(|g| forced.contains(&(i, g.name_any())));
        if orphan {
            seen.insert("gc");
        }
    }
    if seen.is_empty() {
        seen.insert("steady");
    }
    seen
}

/// The end state a user expects, per cluster: every pod Running, every claim with its one
/// NodeGroup and every hub NodeGroup with its claim, nothing deleting or tainted, no empty node.
async fn converged(world: &World, expected: &[usize]) -> Result<(), String> {
    for (i, c) in world.clusters.iter().enumerate() {
        let pods: Vec<Pod> =
            Api::namespaced(c.client(), "default").list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
        let running =
            pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count();
        if pods.len() != expected[i] || running != expected[i] {
            return Err(format!("{}: {running} of {} pods Running, {} expected", c.name, pods.len(), expected[i]));
        }
        let claims: Vec<NodeClaim> = Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace)
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|cl| cl.spec.cluster_name == c.name)
            .collect();
        let groups: Vec<NodeGroup> =
            Api::all(c.client()).list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
        let nodes: Vec<Node> =
            Api::all(c.client()).list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
        if let Some(cl) = claims.iter().find(|cl| cl.metadata.deletion_timestamp.is_some()) {
            return Err(format!("{}: claim {} still deleting", c.name, cl.name_any()));
        }
        if let Some(g) = groups.iter().find(|g| g.is_terminating()) {
            return Err(format!("{}: NodeGroup {} still deleting", c.name, g.name_any()));
        }
        let group_claims: Vec<(String, String)> = groups
            .iter()
            .map(|g| {
                (
                    g.labels().get(labels::NODECLAIM).cloned().unwrap_or_default(),
                    g.annotations().get(labels::NODECLAIM_UID).cloned().unwrap_or_default(),
                )
            })
            .collect();
        let claim_ids: Vec<(String, String)> =
            claims.iter().map(|cl| (cl.name_any(), cl.uid().unwrap_or_default())).collect();
        if group_claims.len() != claim_ids.len() || !claim_ids.iter().all(|id| group_claims.contains(id)) {
            return Err(format!("{}: claims {claim_ids:?} vs NodeGroups for {group_claims:?}", c.name));
        }
        let workers: Vec<&Node> = nodes.iter().filter(|n| n.labels().get(labels::CLEVER_NODEGROUP).is_some()).collect();
        if workers.len() != groups.len() {
            return Err(format!("{}: {} worker nodes for {} NodeGroups", c.name, workers.len(), groups.len()));
        }
        for n in &workers {
            let name = n.name_any();
            if n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT))
            {
                return Err(format!("{}: node {name} still tainted for disruption", c.name));
            }
            if !pods.iter().any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())) {
                return Err(format!("{}: node {name} is empty", c.name));
            }
        }
    }
    Ok(())
}

/// Starts a process in every slot of `running` that has none, each a new life (`start(slot, life)`).
fn restart_dead(running: &mut [Option<Hub>], life: &mut u64, start: impl Fn(usize, u64) -> Hub) {
    for (slot, hub) in running.iter_mut().enumerate() {
        if hub.is_none() {
            *life += 1;
            *hub = Some(start(slot, *life));
        }
    }
}

fn kills_wanted(mode: Mode) -> u64 {
    let ci = if mode == Mode::Sharded { CI_SHARDED_KILLS } else { CI_KILLS };
    std::env::var("KARPENTER_HUB_CHAOS_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(ci)
}

/// Seeded lives of a sharded replica: long enough, most of them, to join, take buckets (a new
/// member takes none in its first retry period) and act; some cut while it joins or hands over.
fn sharded_lifetime(rng: &mut SeededRng) -> Duration {
    let ms = match rng.below(100) {
        0..=39 => 500 + rng.below(1_500),
        40..=89 => 2_000 + rng.below(3_000),
        _ => 5_000 + rng.below(3_000),
    };
    Duration::from_millis(ms)
}

fn scratch(mode: Mode) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-chaos-kills-{mode:?}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_keeps_its_invariants_through_sigkills_and_converges_after_the_last_restart() {
    chaos(Mode::Single).await;
}

/// The same workload and invariants with two sharded replicas killed in turn: the clusters move
/// between them and back, no write reaches a cluster from a replica that did not hold its bucket,
/// and the fleet converges once both run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_killed_in_turn_keep_the_invariants_and_never_write_to_a_cluster_they_do_not_own() {
    chaos(Mode::Sharded).await;
}

async fn chaos(mode: Mode) {
    let wanted = kills_wanted(mode);
    let seed: u64 = std::env::var("KARPENTER_HUB_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(17);
    let started = Instant::now();
    let world = World::start(&[("team-a", "alpha"), ("team-b", "beta")], |i| {
        let mut cke = quick_cke(seed + i as u64);
        if i == ALPHA {
            // Workers get 12 GB beside the control plane's 24.
            cke.quota.limit = Usage { vcpu: 40, ram_gb: 36 };
        }
        cke.node_removal_delay = DelayRange::between(Duration::from_millis(800), Duration::from_millis(1500));
        // CKE's verdict takes seconds, as on the platform: launches stay under way across lives.
        cke.verdict_delay = DelayRange::between(Duration::from_millis(1500), Duration::from_millis(3000));
        cke
    })
    .await
    .unwrap();
    for (i, c) in world.clusters.iter().enumerate() {
        let name = c.name.clone();
        world
            .apply_yaml("general-purpose.yaml", common::EXAMPLE, &c.namespace, |doc| {
                if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                    doc["spec"]["clusterName"] = json!(name);
                    doc["spec"].as_object_mut().unwrap().remove("limits");
                    doc["spec"]["disruption"]["consolidateAfter"] = json!("2s");
                    doc["spec"]["disruption"]["budgets"] = json!([{"nodes": "50%"}]);
                    if i == BETA {
                        doc["spec"]["template"]["spec"]["expireAfter"] = json!("45s");
                    }
                }
            })
            .await
            .unwrap();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}
        }))
        .unwrap();
        Api::<PodDisruptionBudget>::namespaced(c.client(), "default")
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
    }
    let world = Arc::new(world);
    let dir = scratch(mode);
    let kubeconfig = dir.join("management.kubeconfig");
    world.mgmt.write_kubeconfig(&kubeconfig).unwrap();
    // The process's log; in sharded mode, one per replica.
    let logs: Vec<PathBuf> = match mode {
        Mode::Single => vec![dir.join("hub.log")],
        Mode::Sharded => REPLICAS.iter().map(|r| dir.join(format!("{r}.log"))).collect(),
    };
    let names: Vec<Option<&str>> = match mode {
        Mode::Single => vec![None],
        Mode::Sharded => REPLICAS.iter().map(|r| Some(*r)).collect(),
    };
    let audit_stop = tokio_util::sync::CancellationToken::new();
    let holders = (mode == Mode::Sharded).then(|| Holders::watch(world.mgmt.client(), LEASES, audit_stop.clone()));
    if mode == Mode::Sharded {
        operator::infra::manifests::ensure_namespace(&world.mgmt.client(), LEASES).await.unwrap();
    }
    // The binary as built now, kept for the whole run: a build relinking it meanwhile (a shared
    // target directory) must not make one of hundreds of restarts fail.
    let bin = dir.join("karpenter-hub");
    let built = Path::new(env!("CARGO_BIN_EXE_karpenter-hub"));
    if std::fs::hard_link(built, &bin).is_err() {
        std::fs::copy(built, &bin).unwrap();
    }

    let mut inv = Invariants::new(Settings {
        hub_id: "default".into(),
        gc_min_age: Duration::from_secs(GC_MIN_AGE),
        gc_period: Duration::from_secs(GC_PERIOD),
        flavor_cooldown: Duration::from_secs(COOLDOWN),
        slack: Duration::from_secs(20),
        command_bound: Duration::from_secs(60),
    });
    let ex = inv.exemptions();
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let (world, stop) = (world.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                inv.observe(&world).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            inv
        })
    };

    // The kill loop; the script's steps run while the hub is down (a force-deleted claim needs it).
    let mut rng = SeededRng::new(seed);
    let mut pods = Pods::default();
    let mut phases = Phases::default();
    // The NodeGroups orphaned by force-deleted claims, by cluster: garbage collection's work.
    let mut forced: BTreeSet<(usize, String)> = BTreeSet::new();
    let (mut kills, mut life, mut generation) = (0u64, 0u64, 0usize);
    let mut script: Vec<(u64, Step)> = Vec::new();
    // The test plays the ReplicaSet: evicted pods are replaced (bare pods do not come back).
    let mut desired = [0usize; 2];
    let chaos = Instant::now();
    // The processes running, by slot (one, or one per replica).
    let mut running: Vec<Option<Hub>> = names.iter().map(|_| None).collect();
    let start = |slot: usize, life: u64| Hub::start(&bin, &kubeconfig, &logs[slot], life, names[slot]);
    loop {
        if kills >= wanted {
            break;
        }
        // The script, a cycle at a time.
        if script.is_empty() {
            let base = generation as u64 * CYCLE;
            script = cycle(generation == 0).into_iter().map(|(t, s)| (base + t, s)).rev().collect();
            generation += 1;
        }
        let all_down = running.iter().all(Option::is_none);
        while let Some(&(at, step)) = script.last() {
            // A claim is force-deleted only while no hub runs (the script waits for an outage).
            if chaos.elapsed() < Duration::from_secs(at) || (matches!(step, Step::ForceDelete(_)) && !all_down) {
                break;
            }
            script.pop();
            let said = run_step(&world, &ex, &mut pods, &mut desired, step, generation, &mut forced).await;
            eprintln!("[{:>6.1}s] {said}", chaos.elapsed().as_secs_f64());
        }
        ex.hub_running(true);
        restart_dead(&mut running, &mut life, start);
        let wait = match mode {
            Mode::Single => lifetime(&mut rng),
            Mode::Sharded => sharded_lifetime(&mut rng),
        };
        tokio::time::sleep(wait).await;
        for (slot, hub) in running.iter_mut().enumerate() {
            if let Some(status) = hub.as_mut().and_then(Hub::exited) {
                panic!("the hub exited on its own ({status}) before life {life}; log: {}", logs[slot].display());
            }
        }
        // Sharded: one replica at a time, both one time in four (an outage: every bucket waits for
        // its Lease to expire).
        let victims: Vec<usize> = match mode {
            Mode::Single => vec![0],
            Mode::Sharded if rng.below(4) == 0 => vec![0, 1],
            Mode::Sharded => vec![rng.below(2) as usize],
        };
        for v in victims {
            if let Some(hub) = running[v].take() {
                hub.kill();
                kills += 1;
            }
        }
        if running.iter().all(Option::is_none) {
            ex.hub_running(false);
        }
        for p in phases_under_way(&world, &forced).await {
            *phases.0.entry(p).or_default() += 1;
        }
        for (i, n) in desired.iter().enumerate() {
            pods.set(&world, &ex, i, *n).await;
        }
        // Down for a moment, sometimes longer (a pod rescheduled elsewhere, a slow restart).
        let longest = if rng.below(10) == 0 { 1000 } else { 150 };
        tokio::time::sleep(Duration::from_millis(rng.below(longest))).await;
    }
    let chaos_time = chaos.elapsed();

    // The last restart: the fleet converges.
    ex.hub_running(true);
    restart_dead(&mut running, &mut life, start);
    // Sharded: alpha ends with 4 pods, what its quota holds while a consolidation command is in
    // flight there (its old node draining beside the replacement). A fifth pod would wait for
    // quota the draining node holds, and the PodDisruptionBudget (`maxUnavailable: 1`, the pending
    // pod already unavailable) would refuse that node's last eviction: a deadlock the hub must not
    // break (it never evicts against a budget), which the longer sharded lives reach at the end.
    let expected = if mode == Mode::Sharded { [4, 3] } else { [5, 3] };
    pods.set(&world, &ex, ALPHA, expected[ALPHA]).await;
    pods.set(&world, &ex, BETA, expected[BETA]).await;
    let calm = Instant::now();
    let mut last = String::new();
    let mut ok = false;
    while calm.elapsed() < CONVERGENCE {
        for (i, n) in expected.iter().enumerate() {
            pods.set(&world, &ex, i, *n).await;
        }
        match converged(&world, &expected).await {
            Ok(()) => {
                ok = true;
                break;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let convergence = calm.elapsed();
    for (slot, hub) in running.iter_mut().enumerate() {
        let hub = hub.as_mut().unwrap();
        assert!(hub.exited().is_none(), "the hub exited after the last restart; log: {}", logs[slot].display());
    }
    stop.store(true, Ordering::Relaxed);
    let mut inv = observer.await.unwrap();
    inv.observe_final(&world).await;
    let report = inv.report();
    let audited = holders.as_ref().map(|h| (h.changes(), audit::audit(&world, h)));
    audit_stop.cancel();
    eprintln!(
        "chaos kills ({mode:?}): seed {seed}, {kills} SIGKILLs, {life} starts over {:.0}s; kills by phase under way: {:?}; convergence after the last restart: {}; {report}; {}wall time {:.0}s",
        chaos_time.as_secs_f64(),
        phases.0,
        if ok { format!("{:.1}s", convergence.as_secs_f64()) } else { format!("NOT within {CONVERGENCE:?} ({last})") },
        audited.as_ref().map_or(String::new(), |(changes, a)| format!(
            "bucket holder changes seen {changes}, hub writes to the workload clusters audited {} from {} replica lives, written without the bucket {}; ",
            a.writes,
            a.writers,
            a.double.len()
        )),
        started.elapsed().as_secs_f64(),
    );
    assert!(kills >= wanted, "{kills} kills, {wanted} wanted");
    let required: &[&str] = if mode == Mode::Sharded { &REQUIRED_SHARDED_PHASES } else { &REQUIRED_PHASES };
    let missing: Vec<&str> = required.iter().copied().filter(|p| !phases.0.contains_key(p)).collect();
    assert!(missing.is_empty(), "no kill landed during {missing:?}; kills by phase: {:?}", phases.0);
    assert!(
        ok,
        "the fleet did not converge within {CONVERGENCE:?} after the last restart: {last}; logs in {}",
        dir.display()
    );
    assert!(report.violations.is_empty(), "invariants violated:\n{report}\nlogs in {}", dir.display());
    assert!(report.checks > 0 && report.pod_disruptions > 0, "the invariants were not exercised: {report}");
    if let Some((changes, a)) = &audited {
        assert!(
            a.double.is_empty(),
            "writes to a cluster by a replica not holding its bucket:\n{}",
            a.double.join("\n")
        );
        assert!(
            *changes > REPLICAS.len() && a.writers > REPLICAS.len() && a.writes > 0,
            "the audit saw too little to say anything: {changes} holder changes, {a:?}"
        );
    }
    for hub in running.into_iter().flatten() {
        hub.kill();
    }
    let world = Arc::try_unwrap(world).expect("the observer is done");
    world.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
