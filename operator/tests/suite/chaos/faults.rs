//! Chaos, API faults (issue 17 item 2): the hub (in process, on a manual clock) works through
//! launch, registration, emptiness, drift with a drain under a PodDisruptionBudget, garbage
//! collection and a second launch while every API it talks to — the management emulator and both
//! workload emulators — fails 5 % of requests with 5xx and 5 % with 429 (Retry-After: 1), answers
//! 5 % of writes with a 409 (Conflict, or AlreadyExists after storing a create), holds 10 % of
//! requests 50-400 ms, and ends watch streams after 1-6 s, a third of them expired (410, relist).
//! The simulated CKEs talk to the same faulty servers. The test's own reads are exempt
//! (`x-sim-fault-exempt`), so what it sees is the truth, and it checks the invariants at every
//! observation: never two NodeGroups for one claim, no NodeGroup of this hub without its claim
//! past the GC grace, no pod evicted outside its budget, no pod deleted but by the test (a node
//! deleted undrained shows as its pods deleted), no foreign NodeGroup touched; plus progress:
//! every pod that can be placed runs within `PLACE_BOUND`. A summary line gives the figures.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crds::{NodeClaim, NodeGroup, NodePool, labels};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke};
use serde_json::{Value, json};
use sim::{
    apiserver::{ApiServer, ConflictFault, ErrorFault, FaultKind, SlowFault, Via, WatchChurn, exempt_from_faults},
    clock::Clock,
};
use tokio::time::Instant;

use crate::{common, invariants};
use common::EXAMPLE;
use invariants::{Invariants, Settings};

/// A pod that can be placed runs within this (wall time, under faults, on a loaded 2-core
/// machine; a launch takes 3-6 s without faults).
const PLACE_BOUND: Duration = Duration::from_secs(90);
/// A step of the whole scenario (emptiness, drift) completes within this.
const STEP_BOUND: Duration = Duration::from_secs(90);
/// The hub's GC minimum age and period (of its clock, which the test moves faster than the wall
/// clock the invariants judge by, so their bound is the looser one).
const GC: Duration = Duration::from_secs(10);
/// Hub clock moved per look while the scenario waits for pods to be placed, and while it waits
/// for disruption (`consolidateAfter` 30 s, the 15 s validation, the GC).
const PLACING_STEP: Duration = Duration::from_secs(1);
const DISRUPTING_STEP: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(200);
/// Small pods, one per node (required anti-affinity on the hostname), so the node count is known.
const CPU: &str = "500m";
const MEMORY: &str = "2Gi";
const CLUSTERS: [(&str, &str); 2] = [("team-a", "alpha"), ("team-b", "beta")];

fn exempt(server: &ApiServer) -> Client {
    let mut config = server.client_config();
    exempt_from_faults(&mut config);
    Client::try_from(config).unwrap()
}

/// The faults of the brief on one emulator.
fn inject(server: &ApiServer) {
    let f = server.faults();
    f.set_errors(vec![ErrorFault::all(0.03, 500), ErrorFault::all(0.02, 503), ErrorFault::all(0.05, 429)]);
    f.set_conflicts(Some(ConflictFault { rate: 0.05, resources: Vec::new() }));
    f.set_slow(Some(SlowFault { rate: 0.10, min: Duration::from_millis(50), max: Duration::from_millis(400) }));
    f.set_watch_churn(Some(WatchChurn {
        min_life: Duration::from_secs(1),
        max_life: Duration::from_secs(6),
        expired_share: 1.0 / 3.0,
    }));
}

/// What the test reads, through exempt clients. Cheap to clone.
#[derive(Clone)]
struct View {
    mgmt: Client,
    workloads: Vec<Client>,
    namespaces: Vec<String>,
}

/// The invariants checked at every look (`common/invariants.rs`, through the exempt clients),
/// plus this test's own: the foreign NodeGroup is never touched.
struct Observer {
    view: View,
    invariants: Invariants,
    /// The foreign NodeGroup of each cluster: (name, uid), never to be touched.
    foreign: Vec<(String, String)>,
    /// Checks of the foreign NodeGroups, and what they found.
    foreign_checks: u64,
    violations: Vec<String>,
}

impl View {
    async fn claims(&self, i: usize) -> Vec<NodeClaim> {
        Api::<NodeClaim>::namespaced(self.mgmt.clone(), &self.namespaces[i])
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    async fn groups(&self, i: usize) -> Vec<NodeGroup> {
        Api::<NodeGroup>::all(self.workloads[i].clone()).list(&ListParams::default()).await.unwrap().items
    }

    /// This hub's NodeGroups (hub id `default`), not the foreign ones planted beside them.
    async fn ours(&self, i: usize) -> Vec<NodeGroup> {
        let mut groups = self.groups(i).await;
        groups.retain(|g| g.labels().get(labels::HUB).map(String::as_str) == Some("default"));
        groups
    }

    /// The claims this hub's NodeGroups name.
    async fn owners(&self, i: usize) -> BTreeSet<String> {
        self.ours(i).await.iter().filter_map(|g| g.labels().get(labels::NODECLAIM).cloned()).collect()
    }

    async fn pods(&self, i: usize) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.workloads[i].clone(), "default").list(&ListParams::default()).await.unwrap().items
    }

    async fn running(&self, i: usize) -> BTreeSet<String> {
        self.pods(i)
            .await
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .map(|p| p.name_any())
            .collect()
    }

    /// Nodes tainted by a disruption command.
    async fn tainted(&self, i: usize) -> usize {
        Api::<Node>::all(self.workloads[i].clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT))
            })
            .count()
    }

    /// The world in a line per cluster, for a failure's message.
    async fn describe(&self) -> String {
        let mut out = String::new();
        for i in 0..self.workloads.len() {
            let claims: Vec<String> = self
                .claims(i)
                .await
                .iter()
                .map(|c| {
                    let conds: Vec<&str> = c
                        .status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .filter(|c| c.status == "True")
                        .map(|c| c.type_.as_str())
                        .collect();
                    format!(
                        "{}{}{conds:?}",
                        c.name_any(),
                        if c.metadata.deletion_timestamp.is_some() { "(deleting)" } else { "" }
                    )
                })
                .collect();
            let groups: Vec<String> = self.groups(i).await.iter().map(ResourceExt::name_any).collect();
            let pods: Vec<String> = self
                .pods(i)
                .await
                .iter()
                .map(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    format!(
                        "{}:{phase}@{}",
                        p.name_any(),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
                    )
                })
                .collect();
            out.push_str(&format!("\n  cluster {i}: claims {claims:?}\n    groups {groups:?}\n    pods {pods:?}"));
        }
        out
    }
}

impl Observer {
    fn violation(&mut self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.push(what);
    }

    /// One look at the world: every invariant checked once per cluster.
    async fn check(&mut self, world: &World) {
        self.invariants.observe_through(world, &self.view.mgmt, &self.view.workloads).await;
        for i in 0..self.view.workloads.len() {
            self.foreign_checks += 1;
            let (name, uid) = self.foreign[i].clone();
            let intact = self.view.groups(i).await.iter().any(|g| {
                g.name_any() == name
                    && g.uid().as_deref() == Some(uid.as_str())
                    && g.metadata.deletion_timestamp.is_none()
            });
            if !intact {
                self.violation(format!("cluster {i}: foreign NodeGroup {name} touched"));
            }
        }
    }

    /// Looks every `POLL`, advancing the hub's clock by `step` each time, until `done` holds;
    /// panics naming `what` after `bound`. Returns the wall time it took.
    async fn until<F, Fut>(
        &mut self,
        world: &World,
        step: Duration,
        what: &str,
        bound: Duration,
        mut done: F,
    ) -> Duration
    where
        F: FnMut(View) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            self.check(world).await;
            if done(self.view.clone()).await {
                let took = start.elapsed();
                eprintln!("{what}: {took:?}");
                return took;
            }
            if start.elapsed() >= bound {
                panic!(
                    "{what}: not within {bound:?}; {}; {:?}; world: {}",
                    self.invariants.report(),
                    self.violations,
                    self.view.describe().await
                );
            }
            world.hub_settings.clock.advance(step);
            tokio::time::sleep(POLL).await;
        }
    }
}

async fn create_pods(client: &Client, names: &[String]) {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    for n in names {
        let pod = common::pod_alone_on_its_node(n, CPU, MEMORY);
        api.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    }
}

/// A NodeGroup of `hub` for a claim that never existed, whose node never came (no node, so no
/// pod lands on it): an orphan for this hub (`default`), or a foreign one (another hub's) that
/// this hub must never touch.
async fn stray_group(client: &Client, ns: &str, owner: (&str, &str), claim: &str) -> (String, String) {
    common::claimed_looking_group(client, owner, ns, (claim, "5a1c0a57-0000-4000-8000-000000000017"), "2XS", 0).await
}

/// `karpenter_hub_api_retries_total` in the hub's metrics, by (api, code), summed over clusters.
fn hub_retries(world: &World) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for api in ["management", "workload"] {
        for code in ["429", "503", "504"] {
            let n = common::metric(world, "karpenter_hub_api_retries_total", &[("api", api), ("code", code)]);
            out.insert((api.to_string(), code.to_string()), n as u64);
        }
    }
    out
}

fn kinds(server: &ApiServer) -> BTreeMap<FaultKind, u64> {
    server.faults().injected_by_kind()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_keeps_its_invariants_and_makes_progress_under_api_faults() {
    // The hub's decisions, shown when the test fails (RUST_LOG for more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,operator=info")),
        )
        .with_ansi(false)
        .with_test_writer()
        .try_init();
    let started = Instant::now();
    let clock = Clock::manual_now();
    let mut world = World::start_on(&CLUSTERS, |i| quick_cke(i as u64 + 170), clock.clone()).await.unwrap();
    world.hub_settings.gc_min_age = GC;
    world.hub_settings.gc_period = GC;
    world.registry_settings.probe_interval = Duration::from_secs(1);
    for (ns, name) in CLUSTERS {
        world
            .apply_yaml("general-purpose.yaml", EXAMPLE, ns, |doc| {
                if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                    doc["spec"]["clusterName"] = json!(name);
                    doc["spec"].as_object_mut().unwrap().remove("limits");
                }
            })
            .await
            .unwrap();
    }
    let mut obs = Observer {
        view: View {
            mgmt: exempt(&world.mgmt),
            workloads: world.clusters.iter().map(|c| exempt(&c.server)).collect(),
            namespaces: CLUSTERS.iter().map(|(ns, _)| ns.to_string()).collect(),
        },
        invariants: Invariants::new(Settings {
            hub_id: "default".into(),
            gc_min_age: GC,
            gc_period: GC,
            flavor_cooldown: Duration::from_secs(180),
            slack: Duration::from_secs(30),
            command_bound: Duration::from_secs(60),
        }),
        foreign: Vec::new(),
        foreign_checks: 0,
        violations: Vec::new(),
    };
    let exemptions = obs.invariants.exemptions();
    let me = common::management_cluster(&world.mgmt.client()).await;
    for (i, (ns, _)) in CLUSTERS.iter().enumerate() {
        let pdb = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
        }))
        .unwrap();
        Api::<PodDisruptionBudget>::namespaced(obs.view.workloads[i].clone(), "default")
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
        obs.foreign.push(stray_group(&obs.view.workloads[i], ns, ("another-hub", &me), "theirs-1").await);
    }
    inject(&world.mgmt);
    for c in &world.clusters {
        inject(&c.server);
    }
    world.start_hub();

    // 1. Launch and registration: four pods per cluster, a node each.
    let first: Vec<String> = (0..4).map(|n| format!("web-{n}")).collect();
    for i in 0..CLUSTERS.len() {
        create_pods(&obs.view.workloads[i], &first).await;
    }
    let placed = obs
        .until(&world, PLACING_STEP, "8 pods placed (launch, registration)", PLACE_BOUND, |o| async move {
            for i in 0..CLUSTERS.len() {
                if o.running(i).await.len() != 4 || o.claims(i).await.len() != 4 {
                    return false;
                }
            }
            true
        })
        .await;

    // 2. GC: an orphan of this hub appears in each cluster (as a crash mid-launch would leave).
    let mut orphans = Vec::new();
    for (i, (ns, _)) in CLUSTERS.iter().enumerate() {
        orphans.push(stray_group(&obs.view.workloads[i], ns, ("default", &me), "ghost-1").await);
    }

    // 3. Emptiness: two pods go in each cluster; their nodes are removed, and the orphans with them.
    for i in 0..CLUSTERS.len() {
        let api: Api<Pod> = Api::namespaced(obs.view.workloads[i].clone(), "default");
        for name in ["web-0", "web-1"] {
            let pod = api.get(name).await.unwrap();
            exemptions.pod_deleted_by_test(&pod.uid().unwrap());
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
    }
    obs.until(&world, DISRUPTING_STEP, "empty nodes and orphans removed", STEP_BOUND, |o| {
        let orphans = orphans.clone();
        async move {
            for (i, (orphan, _)) in orphans.iter().enumerate() {
                let groups = o.groups(i).await;
                // Two nodes left, the orphan gone, the foreign NodeGroup kept.
                if o.claims(i).await.len() != 2 || groups.iter().any(|g| &g.name_any() == orphan) || groups.len() != 3 {
                    return false;
                }
            }
            true
        }
    })
    .await;

    // 4. Drift with a drain under the budget (minAvailable 1 of 2): the pool's template changes, each
    // node is replaced, its pod evicted only while the budget allows; once the budget is lifted
    // the rest follows.
    let old: Vec<BTreeSet<String>> = {
        let mut v = Vec::new();
        for i in 0..CLUSTERS.len() {
            v.push(obs.view.claims(i).await.iter().map(ResourceExt::name_any).collect());
        }
        v
    };
    let relabel = json!({"spec": {"template": {"metadata": {"labels": {"team": "chaos-2"}}}}});
    for (ns, _) in CLUSTERS {
        Api::<NodePool>::namespaced(obs.view.mgmt.clone(), ns)
            .patch("default", &PatchParams::default(), &Patch::Merge(&relabel))
            .await
            .unwrap();
    }
    let logs: Vec<_> = world.clusters.iter().map(|c| c.server.disruptions()).collect();
    obs.until(&world, DISRUPTING_STEP, "one pod per cluster evicted by a drain", STEP_BOUND, |_| {
        let logs = logs.clone();
        async move {
            for log in &logs {
                if !log.entries().iter().any(|d| d.via == Via::Eviction) {
                    return false;
                }
            }
            true
        }
    })
    .await;
    for i in 0..CLUSTERS.len() {
        Api::<PodDisruptionBudget>::namespaced(obs.view.workloads[i].clone(), "default")
            .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}})))
            .await
            .unwrap();
    }
    obs.until(&world, DISRUPTING_STEP, "every drifted node replaced and gone", STEP_BOUND, |o| {
        let old = old.clone();
        async move {
            for (i, old) in old.iter().enumerate() {
                let claims = o.claims(i).await;
                if claims.iter().any(|c| old.contains(&c.name_any())) {
                    return false;
                }
                let groups = o.owners(i).await;
                let names: BTreeSet<String> = claims.iter().map(ResourceExt::name_any).collect();
                if groups != names {
                    return false;
                }
            }
            true
        }
    })
    .await;

    // The replacements' pods were evicted (bare pods, nothing recreates them): the empty
    // replacements go too, and the next pods need fresh launches (a pod landing on a node whose
    // emptiness was already decided may be evicted with it, as upstream allows).
    obs.until(&world, DISRUPTING_STEP, "the empty replacements consolidated away", STEP_BOUND, |o| async move {
        for i in 0..CLUSTERS.len() {
            if !o.claims(i).await.is_empty() || !o.ours(i).await.is_empty() {
                return false;
            }
        }
        true
    })
    .await;

    // 5. Progress again: two new pods per cluster, placed within the bound.
    let second: Vec<String> = (4..6).map(|n| format!("web-{n}")).collect();
    for i in 0..CLUSTERS.len() {
        create_pods(&obs.view.workloads[i], &second).await;
    }
    let placed_again = obs
        .until(&world, PLACING_STEP, "4 new pods placed", PLACE_BOUND, |o| {
            let second = second.clone();
            async move {
                for i in 0..CLUSTERS.len() {
                    let running = o.running(i).await;
                    if !second.iter().all(|n| running.contains(n)) {
                        return false;
                    }
                }
                true
            }
        })
        .await;

    // Converged: the empty replacements consolidated away, one claim per running pod, each with its
    // NodeGroup, no node left tainted by a disruption command.
    obs.until(&world, DISRUPTING_STEP, "the fleet converged", STEP_BOUND, |o| async move {
        for i in 0..CLUSTERS.len() {
            let claims: BTreeSet<String> = o.claims(i).await.iter().map(ResourceExt::name_any).collect();
            let owners = o.owners(i).await;
            if claims.len() != 2 || claims != owners || o.running(i).await.len() != 2 || o.tainted(i).await > 0 {
                return false;
            }
        }
        true
    })
    .await;
    obs.invariants.observe_final_through(&world, &obs.view.mgmt, &obs.view.workloads).await;
    let report = obs.invariants.report();

    let refused = |s: &ApiServer| -> u64 {
        s.faults()
            .injected_by_kind()
            .iter()
            .filter(|(k, _)| matches!(k, FaultKind::Error(_) | FaultKind::Conflict | FaultKind::AlreadyExists))
            .map(|(_, n)| n)
            .sum()
    };
    let mut all: BTreeMap<String, u64> = BTreeMap::new();
    for s in std::iter::once(&world.mgmt).chain(world.clusters.iter().map(|c| &c.server)) {
        for (k, n) in kinds(s) {
            *all.entry(k.to_string()).or_insert(0) += n;
        }
    }
    let workload_refused: u64 = world.clusters.iter().map(|c| refused(&c.server)).sum();
    let retries = hub_retries(&world);
    eprintln!(
        "chaos faults summary: faults injected (all servers) {all:?}; requests refused on the management side {} (only the hub talks to it); workload requests refused {workload_refused} (hub and simulated CKE together); requests the hub's clients sent again (karpenter_hub_api_retries_total, by api and code) {retries:?} (the rest of the refusals went back to the controllers, which read again and requeued); invariants: {report}; foreign NodeGroup checks {}, violations {}; placement {placed:?} then {placed_again:?}; wall {:?}",
        refused(&world.mgmt),
        obs.foreign_checks,
        obs.violations.len(),
        started.elapsed()
    );
    assert!(report.violations.is_empty(), "invariants violated: {report}");
    assert!(obs.violations.is_empty(), "violations: {:#?}", obs.violations);
    assert!(report.pod_disruptions >= 6, "the drains and the test's deletes were logged: {report}");
    assert!(all.values().sum::<u64>() > 100, "faults were injected: {all:?}");
    for api in ["management", "workload"] {
        assert!(
            retries.iter().any(|((a, code), n)| a == api && code == "429" && *n > 0),
            "the hub's {api} clients retried the 429s asked of them, and counted it: {retries:?}"
        );
    }
    world.shutdown().await;
}
