//! The hub's robustness on the simulated world with faults injected (hub.md §3, testing.md §4): a
//! dead or hung cluster does not slow the others down, rotated credentials reconnect one cluster
//! and no other, and a cluster whose reads fail loses nothing — missing data is never evidence of
//! absence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{cell::Cell, collections::BTreeSet, time::Duration};

use crds::{NodeClaim, NodeClaimStatus, NodeGroup, NodePool, labels};
use k8s_openapi::{
    api::core::v1::{Namespace, Secret},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use operator::{
    commands::run,
    commands::sandbox::world::{World, apply_value, quick_cke, scale},
    controllers::nodeclaim::{LAUNCHED, REGISTERED},
    decisions::conditions::{self, TRUE, UNKNOWN},
    decisions::ownership,
    infra::hub,
    infra::metrics::Metrics,
    infra::registry,
};
use serde_json::{Value, json};
use sim::{
    apiserver::{ApiServer, ApiServerConfig, ErrorFault},
    clock::Clock,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common;
use common::{
    EXAMPLE, Writes, apply_example, poll_every, reachable, running, wait_for, wait_quiet, wait_quiet_over,
    wait_reachable, writes,
};

/// Two such pods never share a 2XS (3.63Gi allocatable): every new pod needs a node of its own.
const POD_CPU: &str = "500m";
const POD_MEMORY: &str = "2Gi";
/// How long writes must have stopped to call the world quiet after the hub's deciders were seen
/// refused their reads (their verdict follows the read at once).
const QUIET: Duration = Duration::from_secs(2);

async fn claims(mgmt: &Client, ns: &str) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(mgmt.clone(), ns).list(&ListParams::default()).await.unwrap().items
}

async fn groups(workload: &Client) -> Vec<NodeGroup> {
    Api::<NodeGroup>::all(workload.clone()).list(&ListParams::default()).await.unwrap().items
}

/// One NodeGroup per NodeClaim and back, named after it: no duplicate, no leak.
async fn assert_one_group_per_claim(world: &World, i: usize) {
    let c = &world.clusters[i];
    let claims = claims(&world.mgmt.client(), &c.namespace).await;
    let groups = groups(&c.client()).await;
    let claim_names: BTreeSet<String> = claims.iter().map(ResourceExt::name_any).collect();
    let owners: Vec<String> =
        groups.iter().map(|g| g.labels().get(labels::NODECLAIM).cloned().unwrap_or_default()).collect();
    let distinct: BTreeSet<String> = owners.iter().cloned().collect();
    assert_eq!(distinct.len(), owners.len(), "{}: two NodeGroups for one NodeClaim: {owners:?}", c.name);
    assert_eq!(distinct, claim_names, "{}: NodeGroups and NodeClaims do not pair up", c.name);
    for g in &groups {
        let claim = g.labels().get(labels::NODECLAIM).unwrap();
        assert_eq!(g.name_any(), ownership::nodegroup_name("default", &c.namespace, claim), "{}", c.name);
    }
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    /// Pod created → its NodeClaim exists.
    to_claim: Duration,
    /// Pod created → pod Running on the new node.
    to_running: Duration,
}

/// Add pod `web-<n-1>` to cluster `i` (it needs a node of its own) and time it until a new claim
/// shows up and until `n` pods run.
async fn grow(world: &World, i: usize, n: usize) -> Timing {
    let mgmt = world.mgmt.client();
    let ns = &world.clusters[i].namespace;
    let before = claims(&mgmt, ns).await.len();
    scale(world, i, n, POD_CPU, POD_MEMORY).await.unwrap();
    let t0 = Instant::now();
    let to_claim = Cell::new(None);
    let ran = poll_every(Duration::from_millis(100), Duration::from_secs(60), || async {
        if to_claim.get().is_none() && claims(&mgmt, ns).await.len() > before {
            to_claim.set(Some(t0.elapsed()));
        }
        running(world, i).await == n
    })
    .await;
    assert!(ran, "{}: pod web-{} not running after 60 s", world.clusters[i].name, n - 1);
    let to_running = t0.elapsed();
    Timing { to_claim: to_claim.get().unwrap_or(to_running), to_running }
}

/// Healthy clusters provision at their usual pace while a third one is hung (black hole: requests
/// accepted, never answered) and then unreachable (connections refused); the bad one reports
/// `ClusterReachable=False/Unreachable` and catches up once the fault is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_unreachable_cluster_does_not_delay_the_others() {
    let mut world =
        World::start(&[("team-a", "alpha"), ("team-b", "beta"), ("team-c", "gamma")], |i| quick_cke(i as u64 + 20))
            .await
            .unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    for i in 0..3 {
        apply_example(&world, i).await;
    }
    world.start_hub();
    let mgmt = world.mgmt.client();
    for ns in ["team-a", "team-b", "team-c"] {
        wait_reachable(&mgmt, ns, TRUE, "Connected", Duration::from_secs(30)).await;
    }
    const BAD: usize = 2;
    let bad = world.clusters[BAD].server.faults();

    // Baseline: one pod needing a node in every cluster at once.
    let (a0, b0, c0) = tokio::join!(grow(&world, 0, 1), grow(&world, 1, 1), grow(&world, BAD, 1));
    eprintln!("baseline: alpha {a0:?}, beta {b0:?}, gamma {c0:?}");
    let base_claim = a0.to_claim.max(b0.to_claim).max(c0.to_claim);
    let base_running = a0.to_running.max(b0.to_running).max(c0.to_running);
    let check = |what: &str, t: Timing| {
        assert!(
            t.to_claim <= base_claim + Duration::from_secs(3),
            "{what}: pending → NodeClaim took {:?}, baseline at most {base_claim:?}",
            t.to_claim
        );
        assert!(
            t.to_running <= base_running + Duration::from_secs(5),
            "{what}: pending → Running took {:?}, baseline at most {base_running:?}",
            t.to_running
        );
    };

    // Black hole: gamma gets a pod that needs a node, then stops answering mid-provisioning.
    // (It is black-holed once the hub has made the claim: CKE's scheduler must first have marked the
    // pod unschedulable, and the launch is then under way.)
    let gamma_claims = claims(&mgmt, "team-c").await.len();
    scale(&world, BAD, 2, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a claim for gamma's new pod", Duration::from_secs(20), || async {
        claims(&mgmt, "team-c").await.len() > gamma_claims
    })
    .await;
    bad.set_blackhole(true);
    let (a1, b1) = tokio::join!(grow(&world, 0, 2), grow(&world, 1, 2));
    eprintln!("gamma black-holed: alpha {a1:?}, beta {b1:?}");
    check("alpha while gamma is black-holed", a1);
    check("beta while gamma is black-holed", b1);
    wait_reachable(&mgmt, "team-c", "False", "Unreachable", Duration::from_secs(40)).await;
    for ns in ["team-a", "team-b"] {
        let (s, r, _) = reachable(&mgmt, ns).await.unwrap();
        assert_eq!((s.as_str(), r.as_str()), (TRUE, "Connected"), "{ns} while gamma is down");
    }
    bad.set_blackhole(false);
    wait_reachable(&mgmt, "team-c", TRUE, "Connected", Duration::from_secs(30)).await;
    wait_for("gamma's pods running after the black hole", Duration::from_secs(60), || async {
        running(&world, BAD).await == 2
    })
    .await;

    // Unreachable: connections to gamma are cut and refused.
    // The True condition's transition time from the reconnect above is seconds old by now (pods ran
    // since); the one after this outage must differ from it. (Comparing with the False transition
    // instead would be flaky: times have one-second resolution and the reconnect can follow within it.)
    let (_, _, connected_since) = reachable(&mgmt, "team-c").await.unwrap();
    scale(&world, BAD, 3, POD_CPU, POD_MEMORY).await.unwrap();
    bad.set_unreachable(true);
    let (a2, b2) = tokio::join!(grow(&world, 0, 3), grow(&world, 1, 3));
    eprintln!("gamma unreachable: alpha {a2:?}, beta {b2:?}");
    check("alpha while gamma is unreachable", a2);
    check("beta while gamma is unreachable", b2);
    wait_reachable(&mgmt, "team-c", "False", "Unreachable", Duration::from_secs(30)).await;
    bad.set_unreachable(false);
    wait_reachable(&mgmt, "team-c", TRUE, "Connected", Duration::from_secs(30)).await;
    assert_ne!(
        reachable(&mgmt, "team-c").await.unwrap().2,
        connected_since,
        "Connected again after the outage, with a new transition time"
    );
    wait_for("gamma's pods running after the outage", Duration::from_secs(60), || async {
        running(&world, BAD).await == 3
    })
    .await;

    for i in 0..3 {
        assert_eq!(running(&world, i).await, 3, "{}", world.clusters[i].name);
        assert_one_group_per_claim(&world, i).await;
        assert_eq!(groups(&world.clusters[i].client()).await.len(), 3, "{}: one node per pod", world.clusters[i].name);
    }
    world.shutdown().await;
}

/// A rotated token makes the hub's client get 401: the cluster reports Unauthorized and gets no
/// decisions until the Secret holds the new token, then reconnects and provisions. Rewriting the
/// Secret without a 401 restarts the cluster's watches mid-provisioning without a duplicate
/// NodeGroup. The other cluster never notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_credentials_reconnect_one_cluster_and_leave_the_other_alone() {
    let mut world =
        World::start(&[("team-a", "alpha"), ("team-b", "beta")], |i| quick_cke(i as u64 + 30)).await.unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    apply_example(&world, 0).await;
    apply_example(&world, 1).await;
    world.start_hub();
    let mgmt = world.mgmt.client();
    scale(&world, 0, 1, POD_CPU, POD_MEMORY).await.unwrap();
    scale(&world, 1, 1, POD_CPU, POD_MEMORY).await.unwrap();
    for i in 0..2 {
        wait_for("first pods running", Duration::from_secs(60), || async { running(&world, i).await == 1 }).await;
    }
    wait_reachable(&mgmt, "team-b", TRUE, "Connected", Duration::from_secs(10)).await;
    let beta = &world.clusters[1].server;
    let beta_condition = reachable(&mgmt, "team-b").await.unwrap();
    let beta_lists = beta.requests().count("list", "daemonsets");
    assert!(beta_lists >= 1, "the hub lists DaemonSets when it syncs a cluster");
    let alpha = &world.clusters[0].server;
    let alpha_requests = alpha.requests();

    // 1. The token is rotated on the cluster: the hub's credentials get 401. (The simulated CKE
    // used the same admin token: a replacement runs on the new one, as CKE has its own identity.)
    alpha.rotate_token();
    let cke = CancellationToken::new();
    let (client, stop) = (alpha.client(), cke.clone());
    tokio::spawn(async move {
        let _ = sim::cke::run(client, quick_cke(40), stop.cancelled_owned()).await;
    });
    wait_reachable(&mgmt, "team-a", "False", "Unauthorized", Duration::from_secs(20)).await;
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), "team-a").get("default").await.unwrap();
    let cond = pool.status.unwrap().conditions.into_iter().find(|c| c.type_ == "ClusterReachable").unwrap();
    assert!(cond.message.contains("401"), "{}", cond.message);
    // No decision on alpha while its credentials are refused; beta provisions meanwhile.
    let alpha_claims = claims(&mgmt, "team-a").await.len();
    scale(&world, 0, 2, POD_CPU, POD_MEMORY).await.unwrap();
    let b = grow(&world, 1, 2).await;
    eprintln!("beta while alpha is unauthorized: {b:?}");
    // Quiet: alpha's NodeClaims unchanged while the hub knocked at alpha again (a reconnection's
    // `/version` probe, refused with 401; no decision may come out of it).
    let knocks = || async { alpha_requests.count("get", "") };
    let alpha_claim_names =
        || async { claims(&mgmt, "team-a").await.iter().map(ResourceExt::name_any).collect::<Vec<_>>() };
    wait_quiet_over("alpha's NodeClaims while unauthorized", Duration::from_secs(30), 1, alpha_claim_names, knocks)
        .await;
    assert_eq!(claims(&mgmt, "team-a").await.len(), alpha_claims, "a claim for alpha while it was unauthorized");
    assert_eq!(reachable(&mgmt, "team-a").await.unwrap().1, "Unauthorized");

    // 2. Re-registering writes the new token: alpha reconnects and its pod is provisioned.
    let lists = alpha_requests.count("list", "daemonsets");
    world.register(0).await.unwrap();
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    assert!(alpha_requests.count("list", "daemonsets") > lists, "the watches were restarted");
    wait_for("alpha's pod running after re-registration", Duration::from_secs(60), || async {
        running(&world, 0).await == 2
    })
    .await;

    // 3. The Secret is rewritten (same credentials, now as YAML) while a launch is under way.
    scale(&world, 0, 3, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a claim for alpha's third pod", Duration::from_secs(20), || async {
        claims(&mgmt, "team-a").await.len() == 3
    })
    .await;
    let lists = alpha_requests.count("list", "daemonsets");
    let yaml = serde_saphyr::to_string(&alpha.kubeconfig()).unwrap();
    world.put_secret("team-a", "alpha", yaml.as_bytes()).await.unwrap();
    wait_for("alpha's watches restarted after the Secret changed", Duration::from_secs(20), || async {
        alpha_requests.count("list", "daemonsets") > lists
    })
    .await;
    wait_for("alpha's third pod running", Duration::from_secs(60), || async { running(&world, 0).await == 3 }).await;
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    assert_one_group_per_claim(&world, 0).await;
    assert_eq!(groups(&alpha.client()).await.len(), 3);
    assert_eq!(alpha_requests.count("delete", "nodegroups"), 0, "no NodeGroup of alpha was deleted");

    // Beta never noticed: its condition never moved, its caches were never re-listed.
    assert_eq!(reachable(&mgmt, "team-b").await.unwrap(), beta_condition);
    assert_eq!(beta.requests().count("list", "daemonsets"), beta_lists, "beta's watches were restarted");
    assert_eq!(beta.requests().count("delete", "nodegroups"), 0);
    assert_eq!(running(&world, 1).await, 2);
    assert_one_group_per_claim(&world, 1).await;
    cke.cancel();
    world.shutdown().await;
}

/// A world whose API servers stamp objects on a clock that started on 2026-01-01 and runs at wall
/// pace: to the hub (on the wall clock) every object is months old, past garbage collection's
/// minimum age, so the collector's safety rules — not the age rule — are what keep objects alive.
/// Its NodePools never expire their nodes (expiry would otherwise take every claim at once).
struct OldWorld {
    mgmt: ApiServer,
    /// (namespace, cluster name, workload emulator played by a simulated CKE)
    clusters: Vec<(String, String, ApiServer)>,
    stop: CancellationToken,
    hub: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

/// Namespace of the first cluster of an [`OldWorld`].
const NS: &str = "team-a";

impl OldWorld {
    async fn start(clusters: &[(&str, &str)]) -> OldWorld {
        let clock = Clock::manual_default();
        let mgmt = ApiServer::start(ApiServerConfig::management("management").with_clock(clock.clone())).await.unwrap();
        let stop = CancellationToken::new();
        let ticking = stop.clone();
        let ticked = clock.clone();
        tokio::spawn(async move {
            let step = Duration::from_millis(50);
            loop {
                tokio::select! {
                    () = ticking.cancelled() => return,
                    () = tokio::time::sleep(step) => ticked.advance(step),
                }
            }
        });
        let mut world = OldWorld { mgmt, clusters: Vec::new(), stop, hub: None };
        for (i, (ns, name)) in clusters.iter().enumerate() {
            let config = ApiServerConfig::workload(*name).with_seed(i as u64 + 7).with_clock(clock.clone());
            let workload = ApiServer::start(config).await.unwrap();
            let (client, done) = (workload.client(), world.stop.clone());
            tokio::spawn(async move {
                let _ = sim::cke::run(client, quick_cke(i as u64 + 7), done.cancelled_owned()).await;
            });
            let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            Api::<Namespace>::all(world.mgmt.client()).create(&PostParams::default(), &namespace).await.unwrap();
            world.clusters.push((ns.to_string(), name.to_string(), workload));
            world.register(i, &serde_json::to_vec(&world.workload(i).kubeconfig()).unwrap()).await;
            for mut doc in serde_saphyr::from_multiple::<Value>(EXAMPLE).unwrap().into_iter().filter(|d| !d.is_null()) {
                if doc["kind"] == "NodePool" {
                    doc["spec"]["clusterName"] = Value::String(name.to_string());
                    // Months old to the hub, every claim would be past the default expireAfter
                    // (720h) at birth and expire at once: this world tests garbage collection.
                    doc["spec"]["template"]["spec"]["expireAfter"] = Value::String("Never".into());
                }
                apply_value(&world.mgmt.client(), &doc, ns, "general-purpose.yaml").await.unwrap();
            }
        }
        world
    }

    fn workload(&self, i: usize) -> &ApiServer {
        &self.clusters[i].2
    }

    /// Write cluster `i`'s registration Secret with `kubeconfig`.
    async fn register(&self, i: usize, kubeconfig: &[u8]) {
        let (ns, name, _) = &self.clusters[i];
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-kubeconfig"), "labels": {registry::CLUSTER_NAME_LABEL: name}},
            "type": "cluster.x-k8s.io/secret",
        }))
        .unwrap();
        secret.data =
            Some([(registry::KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(kubeconfig.to_vec()))].into());
        let api = Api::<Secret>::namespaced(self.mgmt.client(), ns);
        match api.get_opt(&secret.name_any()).await.unwrap() {
            None => api.create(&PostParams::default(), &secret).await.map(drop).unwrap(),
            Some(old) => {
                secret.metadata.resource_version = old.resource_version();
                api.replace(&secret.name_any(), &PostParams::default(), &secret).await.map(drop).unwrap();
            }
        }
    }

    fn start_hub(&mut self) {
        let settings = registry::Settings {
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(2),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(2),
            ..registry::Settings::default()
        };
        let (mgmt, token) = (self.mgmt.client(), CancellationToken::new());
        let stop = token.clone();
        let handle = tokio::spawn(async move {
            let _ = run::run_with(mgmt, hub::Settings::default(), settings, std::sync::Arc::new(Metrics::new()), stop)
                .await;
        });
        self.hub = Some((token, handle));
    }

    /// Stop the hub as a crash would: tasks aborted, nothing cleaned up.
    async fn crash_hub(&mut self) {
        if let Some((token, handle)) = self.hub.take() {
            handle.abort();
            token.cancel();
            let _ = handle.await;
        }
    }

    async fn shutdown(mut self) {
        self.crash_hub().await;
        self.stop.cancel();
        for (_, _, server) in self.clusters {
            server.shutdown().await;
        }
        self.mgmt.shutdown().await;
    }

    fn fail(server: &ApiServer, verbs: &[&str], resource: &str) {
        server.faults().set_error(ErrorFault {
            rate: 1.0,
            status: 500,
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            resources: vec![resource.to_string()],
        });
    }
}

/// Writes to NodeClaims (management) and NodeGroups (the first workload cluster), by verb.
fn hub_writes(world: &OldWorld) -> (Writes, Writes) {
    (writes(&world.mgmt, &["nodeclaims"]), writes(world.workload(0), &["nodegroups"]))
}

/// Objects the API holds, by name, with their UID and whether they are being deleted.
fn by_name<K: ResourceExt>(items: &[K]) -> Vec<(String, String, bool)> {
    let mut v: Vec<_> = items
        .iter()
        .map(|o| (o.name_any(), o.uid().unwrap_or_default(), o.meta().deletion_timestamp.is_some()))
        .collect();
    v.sort();
    v
}

/// A cluster whose lists or live reads fail loses nothing, even across hub restarts, although it
/// holds an orphaned NodeGroup (owned by this hub, its NodeClaim never existed) and a vanished
/// launch (a launched claim whose NodeGroup does not exist) — each of which the collector removes
/// as soon as the read that proves it succeeds: only the failed reads kept them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_deleted_while_reads_fail_even_across_restarts() {
    let mut world = OldWorld::start(&[(NS, "alpha")]).await;
    world.start_hub();
    let (mgmt, workload) = (world.mgmt.client(), world.workload(0).client());
    let (mgmt_requests, workload_requests) = (world.mgmt.requests(), world.workload(0).requests());
    let (mgmt_faults, workload_faults) = (world.mgmt.faults(), world.workload(0).faults());
    scale_old(&world, 1).await;
    wait_for("the pod running", Duration::from_secs(60), || async { running_old(&world).await == 1 }).await;
    let real_claims = claims(&mgmt, NS).await;
    let real_groups = groups(&workload).await;
    assert_eq!((real_claims.len(), real_groups.len()), (1, 1));
    let real_claim = (real_claims[0].name_any(), real_claims[0].uid().unwrap(), false);
    let real_group = (real_groups[0].name_any(), real_groups[0].uid().unwrap(), false);

    // Phase 1: listing and watching NodeClaims (management) and NodeGroups (workload) fail, and the
    // hub restarts into it: its caches start empty. An orphan and a vanished launch appear meanwhile
    // (creates do not fail).
    OldWorld::fail(&world.mgmt, &["list", "watch"], "nodeclaims");
    OldWorld::fail(world.workload(0), &["list", "watch"], "nodegroups");
    world.crash_hub().await;
    mgmt_requests.reset();
    workload_requests.reset();
    world.start_hub();
    let ghost = ghost_group(&world, 0, &real_groups[0].spec.flavor).await;
    let vanished = vanished_claim(&world, &real_claims[0]).await;
    // Only the hub lists DaemonSets in the workload cluster, and nothing else reads claims.
    wait_for("the restarted hub hitting the failing lists", Duration::from_secs(20), || async {
        mgmt_requests.count("list", "nodeclaims") >= 1 && workload_requests.count("list", "daemonsets") >= 1
    })
    .await;
    // Quiet: no write to NodeClaims or NodeGroups while the hub retried its failing lists and
    // watches four more times (it is alive and deciding on nothing, its caches still empty).
    let refused_reads = || async { mgmt_faults.injected_errors() + workload_faults.injected_errors() };
    wait_quiet_over(
        "writes while lists fail",
        Duration::from_secs(30),
        4,
        || async { hub_writes(&world) },
        refused_reads,
    )
    .await;
    let sorted = |mut v: Vec<(String, String, bool)>| {
        v.sort();
        v
    };
    let all_claims = sorted(vec![real_claim.clone(), vanished.clone()]);
    let all_groups = sorted(vec![real_group.clone(), ghost.clone()]);
    let deletes = || (mgmt_requests.count("delete", "nodeclaims"), workload_requests.count("delete", "nodegroups"));
    assert_eq!(deletes(), (0, 0), "deletes (claims, groups) while lists fail");

    // Phase 2: lists work, but every live read of a NodeGroup fails — the re-read of the orphan and
    // the check of the vanished launch's group, both made before deleting. The hub restarts again.
    // (The hub is stopped before any fault is lifted: a running hub must never see the world whole.)
    world.crash_hub().await;
    workload_faults.clear();
    mgmt_faults.clear();
    OldWorld::fail(world.workload(0), &["get"], "nodegroups");
    let before = workload_faults.injected_errors();
    world.start_hub();
    wait_reachable(&mgmt, NS, TRUE, "Connected", Duration::from_secs(20)).await;
    // Only the deciders read a NodeGroup by name here: the collector (orphan re-read, vanish check)
    // and the lifecycle controller (vanish check of the launched claim).
    wait_for("the hub's live reads of NodeGroups", Duration::from_secs(20), || async {
        workload_faults.injected_errors() >= before + 2
    })
    .await;
    // Quiet: no write to NodeClaims or NodeGroups for 2 s after both deciders were refused their
    // read (what they do on a refused read follows it at once; their next look is seconds away).
    wait_quiet("writes while NodeGroup reads fail", Duration::from_secs(30), QUIET, || async { hub_writes(&world) })
        .await;
    assert_eq!(deletes(), (0, 0), "deletes (claims, groups) while NodeGroup reads fail");
    assert_eq!(by_name(&claims(&mgmt, NS).await), all_claims);
    assert_eq!(by_name(&groups(&workload).await), all_groups);

    // Phase 3: NodeGroups read fine, but every live read of a NodeClaim fails. The vanished launch
    // is confirmed (its group is really absent) and its claim deleted; the orphan's claim cannot be
    // read, so the orphan stays.
    world.crash_hub().await;
    workload_faults.clear();
    OldWorld::fail(&world.mgmt, &["get"], "nodeclaims");
    let before = mgmt_faults.injected_errors();
    world.start_hub();
    wait_for("the collector's live read of the orphan's NodeClaim", Duration::from_secs(20), || async {
        mgmt_faults.injected_errors() > before
    })
    .await;
    wait_for("the vanished launch collected", Duration::from_secs(20), || async {
        by_name(&claims(&mgmt, NS).await) == vec![real_claim.clone()]
    })
    .await;
    // Quiet: no write to NodeClaims or NodeGroups for 2 s after the collector was refused the
    // orphan's claim and the vanished launch was collected (the collector's verdict on the orphan
    // follows its refused read at once; the next sweep is minutes away).
    wait_quiet("writes while NodeClaim reads fail", Duration::from_secs(30), QUIET, || async { hub_writes(&world) })
        .await;
    // (The collector and the lifecycle controller may both have sent the vanished claim's delete.)
    assert_eq!(deletes().1, 0, "a NodeGroup delete while NodeClaim reads fail");
    assert_eq!(by_name(&groups(&workload).await), all_groups);
    assert_eq!(by_name(&claims(&mgmt, NS).await), vec![real_claim.clone()]);

    // Phase 4: everything reads; after a restart the orphan is collected, and nothing else.
    world.crash_hub().await;
    mgmt_faults.clear();
    world.start_hub();
    wait_for("the orphan collected", Duration::from_secs(30), || async {
        by_name(&groups(&workload).await).iter().all(|(n, _, deleting)| *n != ghost.0 || *deleting)
    })
    .await;
    assert_eq!(deletes().1, 1, "NodeGroup deletes: the orphan's, once");
    assert_eq!(by_name(&claims(&mgmt, NS).await), vec![real_claim.clone()]);
    assert!(by_name(&groups(&workload).await).contains(&real_group));
    assert_eq!(running_old(&world).await, 1);
    world.shutdown().await;
}

async fn scale_old(world: &OldWorld, n: usize) {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(world.workload(0).client(), "default");
    for i in 0..n {
        let pod = operator::commands::sandbox::world::workload_pod(&format!("web-{i}"), POD_CPU, POD_MEMORY);
        api.create(&PostParams::default(), &pod).await.unwrap();
    }
}

async fn running_old(world: &OldWorld) -> usize {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(world.workload(0).client(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

/// A NodeGroup carrying every proof that this hub made it for NodeClaim `ghost-1`, which never
/// existed: an orphan.
async fn ghost_group(world: &OldWorld, i: usize, flavor: &str) -> (String, String, bool) {
    let client = world.workload(i).client();
    let claim = ("ghost-1", "5a1c0a57-0000-4000-8000-000000000001");
    let me = common::management_cluster(&world.mgmt.client()).await;
    let (name, uid) =
        common::claimed_looking_group(&client, ("default", &me), &world.clusters[i].0, claim, flavor, 1).await;
    (name, uid, false)
}

/// A NodeClaim launched into a NodeGroup that does not exist and whose node never registered: a
/// vanished launch.
async fn vanished_claim(world: &OldWorld, like: &NodeClaim) -> (String, String, bool) {
    let name = "vanished-1";
    let mut claim_labels = like.labels().clone();
    claim_labels.remove(labels::INSTANCE_TYPE);
    let claim = NodeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NS.to_string()),
            labels: Some(claim_labels),
            finalizers: Some(vec![labels::TERMINATION_FINALIZER.to_string()]),
            ..ObjectMeta::default()
        },
        spec: like.spec.clone(),
        status: None,
    };
    let api: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), NS);
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    let now = Timestamp::now();
    let mut status = NodeClaimStatus {
        provider_id: Some(ownership::provider_id(&ownership::nodegroup_name("default", NS, name))),
        ..NodeClaimStatus::default()
    };
    let generation = created.metadata.generation;
    conditions::set(&mut status.conditions, LAUNCHED, TRUE, "Launched", "", generation, now);
    conditions::set(
        &mut status.conditions,
        REGISTERED,
        UNKNOWN,
        "NodeNotFound",
        "node not registered with cluster",
        generation,
        now,
    );
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await.unwrap();
    (name.to_string(), created.uid().unwrap(), false)
}

/// Garbage collection of a healthy cluster does not wait for a hung one (hub.md §3, Isolation):
/// alpha stops answering while the hub's cache holds an orphan of alpha's; beta's orphan is still
/// collected as soon as beta (re)connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_cluster_does_not_hold_up_garbage_collection_of_the_others() {
    let mut world = OldWorld::start(&[("team-a", "alpha"), ("team-b", "beta")]).await;
    // An orphan in alpha before the hub starts, so the listing that syncs alpha holds it; the
    // collector's live re-read of it fails until alpha hangs, which keeps it (a failed read is no
    // evidence) and shows that it was a candidate, i.e. in the hub's cache.
    let alpha_ghost = ghost_group(&world, 0, "2XS").await;
    let alpha_faults = world.workload(0).faults();
    OldWorld::fail(world.workload(0), &["get"], "nodegroups");
    world.start_hub();
    let mgmt = world.mgmt.client();
    for ns in ["team-a", "team-b"] {
        wait_reachable(&mgmt, ns, TRUE, "Connected", Duration::from_secs(30)).await;
    }
    wait_for("the collector's re-read of alpha's orphan", Duration::from_secs(20), || async {
        alpha_faults.injected_errors() >= 1
    })
    .await;
    // Then alpha hangs (a black hole holds every request before any error is injected).
    alpha_faults.set_blackhole(true);
    alpha_faults.clear_errors();
    assert_eq!(world.workload(0).object_count("api.clever-cloud.com", "nodegroups"), 1, "alpha's orphan is there");
    let alpha_reads = world.workload(0).requests().count("get", "nodegroups");
    // An orphan in beta, and beta's Secret rewritten: its reconnection prompts sweeps.
    let beta_ghost = ghost_group(&world, 1, "2XS").await;
    let yaml = serde_saphyr::to_string(&world.workload(1).kubeconfig()).unwrap();
    let beta_requests = world.workload(1).requests();
    let lists = beta_requests.count("list", "daemonsets");
    world.register(1, yaml.as_bytes()).await;
    wait_for("beta's watches restarted", Duration::from_secs(10), || async {
        beta_requests.count("list", "daemonsets") > lists
    })
    .await;
    wait_reachable(&mgmt, "team-b", TRUE, "Connected", Duration::from_secs(10)).await;
    let beta = world.workload(1).client();
    wait_for("beta's orphan collected while alpha hangs", Duration::from_secs(20), || async {
        groups(&beta).await.iter().all(|g| g.name_any() != beta_ghost.0 || g.metadata.deletion_timestamp.is_some())
    })
    .await;
    // Alpha's sweep was held up meanwhile: it re-read the orphan and got no answer.
    let held = world.workload(0).requests().count("get", "nodegroups");
    assert!(held > alpha_reads, "no sweep of alpha re-read its orphan while it hung ({held} reads)");
    // Alpha answers again: its orphan goes too.
    world.workload(0).faults().set_blackhole(false);
    let alpha = world.workload(0).client();
    wait_for("alpha's orphan collected after the black hole", Duration::from_secs(30), || async {
        groups(&alpha).await.iter().all(|g| g.name_any() != alpha_ghost.0 || g.metadata.deletion_timestamp.is_some())
    })
    .await;
    world.shutdown().await;
}

/// Another management cluster's NodeGroups are not this hub's garbage (hub.md §5), the incident of
/// issue 23: three groups made by a hub of another management cluster on the same hub id
/// (`default`) and namespace name, carrying every proof but the management cluster, are never
/// collected; nor is a group from before management identities whose claim is not here (it is
/// reported instead); an orphan of this very hub is, which shows the sweeps ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_management_cluster_s_groups_and_unproven_old_groups_are_never_collected() {
    let mut world = OldWorld::start(&[(NS, "alpha")]).await;
    let (mgmt, workload) = (world.mgmt.client(), world.workload(0).client());
    let me = common::management_cluster(&mgmt).await;
    let theirs_id = "0b7e2c1d-9f3a-4c55-8e21-6d0f4a9b7c31";
    assert_ne!(me, theirs_id);
    let mut theirs = Vec::new();
    for n in 0..3 {
        let claim = (format!("general-theirs{n}"), format!("5a1c0a57-0000-4000-8000-00000000010{n}"));
        let made = common::claimed_looking_group(&workload, ("default", theirs_id), NS, (&claim.0, &claim.1), "2XS", 1);
        theirs.push(made.await);
    }
    let legacy_claim = ("general-legacy", "5a1c0a57-0000-4000-8000-000000000200");
    let legacy = common::claimed_looking_group(&workload, ("default", ""), NS, legacy_claim, "2XS", 1).await;
    let ghost_claim = ("ghost-1", "5a1c0a57-0000-4000-8000-000000000001");
    let ghost = common::claimed_looking_group(&workload, ("default", &me), NS, ghost_claim, "2XS", 1).await;
    world.start_hub();
    wait_reachable(&mgmt, NS, TRUE, "Connected", Duration::from_secs(30)).await;
    wait_for("this hub's own orphan collected", Duration::from_secs(30), || async {
        groups(&workload).await.iter().all(|g| g.name_any() != ghost.0 || g.metadata.deletion_timestamp.is_some())
    })
    .await;
    // The old group is judged in the same sweep as the orphan: refused, and said so.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(workload.clone(), "default");
    wait_for("the old group reported, not collected", Duration::from_secs(30), || async {
        events.list(&ListParams::default()).await.unwrap().items.iter().any(|e| {
            e.reason.as_deref() == Some("GarbageCollectionRefused")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(legacy.0.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains("another management cluster"))
        })
    })
    .await;
    let left = groups(&workload).await;
    for (name, uid) in theirs.iter().chain([&legacy]) {
        let g = left.iter().find(|g| &g.name_any() == name);
        assert!(
            g.is_some_and(|g| g.uid().as_ref() == Some(uid) && g.metadata.deletion_timestamp.is_none()),
            "NodeGroup {name} was touched: {g:?}"
        );
    }
    assert_eq!(world.workload(0).requests().count("delete", "nodegroups"), 1, "only the orphan was deleted");
    world.shutdown().await;
}

/// The brake (hub.md §5): a sweep that finds most of a cluster's hub-labelled groups orphaned (a
/// management cluster restored without its NodeClaims) deletes none, and says so on the pool as
/// the condition `GarbageCollectionHalted` and an event; once the orphans are within the share (a
/// person deleted two by hand), the next sweep collects the last one and the condition goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brake_halts_a_sweep_that_would_delete_most_of_a_cluster() {
    let mut world = OldWorld::start(&[(NS, "alpha")]).await;
    let (mgmt, workload) = (world.mgmt.client(), world.workload(0).client());
    let me = common::management_cluster(&mgmt).await;
    let mut ghosts = Vec::new();
    for n in 0..3 {
        let claim = (format!("general-gone{n}"), format!("5a1c0a57-0000-4000-8000-00000000030{n}"));
        let made = common::claimed_looking_group(&workload, ("default", &me), NS, (&claim.0, &claim.1), "2XS", 1);
        ghosts.push(made.await);
    }
    world.start_hub();
    wait_reachable(&mgmt, NS, TRUE, "Connected", Duration::from_secs(30)).await;
    let pools: Api<NodePool> = Api::namespaced(mgmt.clone(), NS);
    let halted = || async {
        pools.list(&ListParams::default()).await.unwrap().items.iter().find_map(|p| {
            let conds = p.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            conditions::get(&conds, "GarbageCollectionHalted").cloned()
        })
    };
    wait_for("the halt shown on the pool", Duration::from_secs(30), || async { halted().await.is_some() }).await;
    let condition = halted().await.unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "TooManyOrphans"));
    assert!(condition.message.contains("3 of the 3 NodeGroups"), "{}", condition.message);
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(mgmt.clone(), NS);
    let listed = events.list(&ListParams::default()).await.unwrap();
    assert!(listed.items.iter().any(|e| e.reason.as_deref() == Some("GarbageCollectionHalted")), "no event");
    assert_eq!(world.workload(0).requests().count("delete", "nodegroups"), 0, "the halted sweep deleted nothing");
    assert_eq!(groups(&workload).await.len(), 3);
    // A person deletes two by hand; the third is within the share and goes.
    let api: Api<NodeGroup> = Api::all(workload.clone());
    for (name, _) in &ghosts[..2] {
        api.delete(name, &Default::default()).await.unwrap();
    }
    // The Secret rewritten: the reconnection prompts a sweep (else the next is 2 minutes away).
    let yaml = serde_saphyr::to_string(&world.workload(0).kubeconfig()).unwrap();
    world.register(0, yaml.as_bytes()).await;
    wait_for("the last orphan collected and the halt lifted", Duration::from_secs(60), || async {
        groups(&workload).await.iter().all(|g| g.metadata.deletion_timestamp.is_some()) && halted().await.is_none()
    })
    .await;
    world.shutdown().await;
}

const PAUSED: &str = "cluster.x-k8s.io/paused";

/// The names of cluster `i`'s NodeClaims, each with whether it is being deleted, and the
/// NodeGroup writes its emulator answered: what a paused cluster must not see change.
async fn claims_and_group_writes(world: &World, i: usize) -> (Vec<(String, bool)>, Writes) {
    let c = &world.clusters[i];
    let claims = claims(&world.mgmt.client(), &c.namespace)
        .await
        .iter()
        .map(|c| (c.name_any(), c.metadata.deletion_timestamp.is_some()))
        .collect();
    (claims, writes(&c.server, &["nodegroups"]))
}

/// Whether pod `name` of cluster `i` runs.
async fn pod_running(world: &World, i: usize, name: &str) -> bool {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(world.clusters[i].client(), "default")
        .get(name)
        .await
        .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
}

/// Cluster API's pause on the registration Secret (hub.md, "Cluster API pause"): while
/// `cluster.x-k8s.io/paused` is on it, the pool says `ClusterReachable=False/Paused` naming the
/// Secret, a pending pod gets no NodeClaim, and a NodeClaim deleted meanwhile keeps its NodeGroup
/// (no NodeGroup write at all) although the hub keeps probing the cluster. Removed: `Connected`
/// again, the pod gets its node and the deleted claim's group goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_paused_by_its_secret_gets_no_decision_until_resumed() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64 + 60)).await.unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    apply_example(&world, 0).await;
    world.start_hub();
    let mgmt = world.mgmt.client();
    scale(&world, 0, 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("web-0 running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    let secrets = Api::<Secret>::namespaced(mgmt.clone(), "team-a");
    let annotate = |value: Value| {
        let secrets = secrets.clone();
        async move {
            let patch = json!({"metadata": {"annotations": {PAUSED: value}}});
            secrets.patch("alpha-kubeconfig", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };

    // Paused (any value counts, even "false", as in Cluster API).
    annotate(json!("false")).await;
    wait_reachable(&mgmt, "team-a", "False", "Paused", Duration::from_secs(20)).await;
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), "team-a").get("default").await.unwrap();
    let cond = pool.status.unwrap().conditions.into_iter().find(|c| c.type_ == "ClusterReachable").unwrap();
    assert!(
        cond.message.contains("Secret team-a/alpha-kubeconfig") && cond.message.contains(PAUSED),
        "{}",
        cond.message
    );
    let alpha = &world.clusters[0].server;
    let deletes = alpha.requests().count("delete", "nodegroups");
    let (claims_before, _) = claims_and_group_writes(&world, 0).await;
    assert_eq!(claims_before.len(), 1);
    scale(&world, 0, 2, POD_CPU, POD_MEMORY).await.unwrap();
    Api::<NodeClaim>::namespaced(mgmt.clone(), "team-a")
        .delete(&claims_before[0].0, &Default::default())
        .await
        .unwrap();
    // Quiet while the hub keeps probing alpha (its connection is kept): no claim, no group write.
    let probes = || async { common::probes(&world, 0) };
    let (claims_paused, group_writes) = wait_quiet_over(
        "alpha while paused",
        Duration::from_secs(60),
        5,
        || claims_and_group_writes(&world, 0),
        probes,
    )
    .await;
    assert_eq!(claims_paused, vec![(claims_before[0].0.clone(), true)], "a claim made, or the deleted one released");
    assert_eq!(alpha.requests().count("delete", "nodegroups"), deletes, "a NodeGroup deleted while paused");
    assert_eq!(groups(&alpha.client()).await.len(), 1, "the deleted claim's NodeGroup is kept while paused");
    assert!(!pod_running(&world, 0, "web-1").await);
    assert_eq!(reachable(&mgmt, "team-a").await.unwrap().1, "Paused");
    // A claim arriving without its finalizer (`clusterctl move` drops them) gets none while paused:
    // nothing is written for a paused cluster.
    let claims_api = Api::<NodeClaim>::namespaced(mgmt.clone(), "team-a");
    let template = claims_api.get(&claims_before[0].0).await.unwrap();
    let arrived: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "moved-in", "namespace": "team-a", "labels": template.metadata.labels},
        "spec": template.spec,
    }))
    .unwrap();
    claims_api.create(&Default::default(), &arrived).await.unwrap();
    let finalizers = wait_quiet_over(
        "the arrived claim while paused",
        Duration::from_secs(60),
        5,
        || async { claims_api.get("moved-in").await.unwrap().metadata.finalizers.unwrap_or_default() },
        probes,
    )
    .await;
    assert!(finalizers.is_empty(), "a finalizer written on a paused cluster's claim: {finalizers:?}");

    // Resumed: decisions again.
    let resumed = Instant::now();
    annotate(Value::Null).await;
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    let connected = resumed.elapsed();
    wait_for("web-1 running after the pause", Duration::from_secs(60), || async {
        pod_running(&world, 0, "web-1").await
    })
    .await;
    eprintln!("resumed from the Secret: Connected after {connected:?}, web-1 running after {:?}", resumed.elapsed());
    wait_for("the claim deleted while paused gone with its NodeGroup", Duration::from_secs(60), || async {
        !claims(&mgmt, "team-a").await.iter().any(|c| c.name_any() == claims_before[0].0)
    })
    .await;
    assert!(alpha.requests().count("delete", "nodegroups") > deletes, "{group_writes:?}");
    wait_for("the deleted claim's NodeGroup gone", Duration::from_secs(60), || async {
        groups(&alpha.client()).await.len() == claims(&mgmt, "team-a").await.len()
    })
    .await;
    assert_one_group_per_claim(&world, 0).await;
    world.shutdown().await;
}

/// Cluster API's `Cluster` of the same name in the registration's namespace (the management
/// emulator serving a minimal `clusters.cluster.x-k8s.io`): `spec.paused: true` pauses the cluster,
/// `false` resumes it, the annotation pauses it too, and deleting the Cluster resumes it. While
/// paused by the Cluster a pending pod gets no NodeClaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_paused_by_its_cluster_api_cluster_gets_no_decision_until_resumed() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64 + 70)).await.unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    let mgmt = world.mgmt.client();
    let crd: CustomResourceDefinition = serde_json::from_value(common::cluster_api_cluster_crd()).unwrap();
    Api::<CustomResourceDefinition>::all(mgmt.clone()).create(&PostParams::default(), &crd).await.unwrap();
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster"), "clusters");
    let capi: Api<DynamicObject> = Api::namespaced_with(mgmt.clone(), "team-a", &ar);
    // The Cluster exists, paused, before the hub starts: it never acts on alpha.
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "alpha", "namespace": "team-a"},
        "spec": {"paused": true, "clusterNetwork": {"pods": {"cidrBlocks": ["10.0.0.0/16"]}}}
    }))
    .unwrap();
    capi.create(&PostParams::default(), &cluster).await.unwrap();
    apply_example(&world, 0).await;
    scale(&world, 0, 1, POD_CPU, POD_MEMORY).await.unwrap();
    world.start_hub();
    wait_reachable(&mgmt, "team-a", "False", "Paused", Duration::from_secs(20)).await;
    let message = || async {
        let pool = Api::<NodePool>::namespaced(mgmt.clone(), "team-a").get("default").await.unwrap();
        pool.status.unwrap().conditions.into_iter().find(|c| c.type_ == "ClusterReachable").unwrap().message
    };
    let m = message().await;
    assert!(m.contains("Cluster team-a/alpha") && m.contains("spec.paused"), "{m}");
    let probes = || async { common::probes(&world, 0) };
    let (claims_paused, group_writes) = wait_quiet_over(
        "alpha while paused",
        Duration::from_secs(60),
        5,
        || claims_and_group_writes(&world, 0),
        probes,
    )
    .await;
    assert!(claims_paused.is_empty() && group_writes.is_empty(), "{claims_paused:?} {group_writes:?}");

    // spec.paused false: resumed, the pod gets its node.
    let merge = |patch: Value| {
        let capi = capi.clone();
        async move { capi.patch("alpha", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap() }
    };
    let resumed = Instant::now();
    merge(json!({"spec": {"paused": false}})).await;
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    let connected = resumed.elapsed();
    wait_for("web-0 running after the pause", Duration::from_secs(60), || async { running(&world, 0).await == 1 })
        .await;
    eprintln!("resumed from the Cluster: Connected after {connected:?}, web-0 running after {:?}", resumed.elapsed());

    // The annotation pauses it too; deleting the Cluster resumes it.
    merge(json!({"metadata": {"annotations": {PAUSED: ""}}})).await;
    wait_reachable(&mgmt, "team-a", "False", "Paused", Duration::from_secs(20)).await;
    let m = message().await;
    assert!(m.contains("Cluster team-a/alpha") && m.contains(PAUSED), "{m}");
    capi.delete("alpha", &Default::default()).await.unwrap();
    wait_reachable(&mgmt, "team-a", TRUE, "Connected", Duration::from_secs(20)).await;
    world.shutdown().await;
}
