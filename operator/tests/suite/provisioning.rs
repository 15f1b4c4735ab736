//! Provisioning is event-driven (issue 16, performance.md B4): the pod watch wakes the batch window,
//! a round runs for news (and every 10 s while pods wait), and a round reads the watch caches
//! instead of listing the management cluster. Judged by counts (rounds, LISTs), not by timings; the latency is printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use clock::Clock;
use crds::NodeGroup;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use operator::commands::sandbox::world::{World, quick_cke, scale};

use crate::common;
use common::{apply_example, metric, pool_condition_true, rounds, running, wait_for, wait_quiet_over, writes};

/// Health probes the hub has made of every cluster: proof that it is alive and its loops turn.
fn probes(world: &World) -> u64 {
    metric(world, "karpenter_hub_cluster_probes_total", &[]) as u64
}

/// Full or selected LISTs the hub sent to the management cluster for the kinds a round reads.
fn management_lists(world: &World) -> u64 {
    world
        .mgmt
        .requests()
        .snapshot()
        .into_iter()
        .filter(|((verb, resource), _)| {
            verb == "list"
                && ["nodepools", "clevernodeclasses", "flavorcatalogs", "nodeclaims"].contains(&resource.as_str())
        })
        .map(|(_, n)| n)
        .sum()
}

fn unschedulable(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_pod_runs_one_round_reading_caches_and_idle_clusters_run_none() {
    // The hub on a manual clock: consolidateAfter (30 s) passes when the test moves it, not in real time.
    let clock = Clock::manual_now();
    let mut world = World::start_on(&[("team-a", "alpha"), ("team-b", "beta")], |i| quick_cke(i as u64), clock.clone())
        .await
        .unwrap();
    for i in 0..2 {
        apply_example(&world, i).await;
    }
    world.start_hub();
    for c in &world.clusters {
        wait_for("NodePool Ready", Duration::from_secs(30), || async {
            pool_condition_true(&world, &c.namespace, "default", "Ready").await.is_some()
        })
        .await;
    }
    // Idle: the hub is at work (probes), and no round runs anywhere.
    let idle = wait_quiet_over(
        "idle clusters",
        Duration::from_secs(60),
        4,
        || async { (rounds(&world, 0), rounds(&world, 1)) },
        || async { probes(&world) },
    )
    .await;
    assert_eq!(idle, (0, 0), "no pod waits, so no round runs");
    let lists_before = management_lists(&world);

    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    let c = &world.clusters[0];
    let pods: Api<Pod> = Api::namespaced(c.client(), "default");
    let groups: Api<NodeGroup> = Api::all(c.client());
    // Timed from the moment the test sees the scheduler's verdict (itself polled every 10 ms).
    let mut marked = None;
    let mut claimed = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let now = Instant::now();
        if marked.is_none() && pods.list(&ListParams::default()).await.unwrap().items.iter().any(unschedulable) {
            marked = Some(now);
        }
        // The hub's own count: a LIST of claims here would be counted as the hub's.
        if marked.is_some() && metric(&world, "karpenter_nodeclaims_created_total", &[]) >= 1.0 {
            claimed = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (marked, claimed) = (marked.expect("the pod is marked Unschedulable"), claimed.expect("a NodeClaim"));
    wait_for("a NodeGroup", Duration::from_secs(30), || async {
        !groups.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
    let grouped = Instant::now();
    println!(
        "pending -> NodeClaim {:.0} ms, -> NodeGroup seen {:.0} ms (batch idle window 1000 ms)",
        (claimed - marked).as_secs_f64() * 1000.0,
        (grouped - marked).as_secs_f64() * 1000.0
    );
    // The hub's own share of the pod's wait, measured inside it: one pod, within what the test saw
    // from the mark to the NodeGroup, and its stages adding up to it.
    let cluster = c.key().to_string();
    let own = |name: &str, labels: &[(&str, &str)]| {
        let mut l = vec![("cluster", cluster.as_str())];
        l.extend_from_slice(labels);
        metric(&world, name, &l)
    };
    // The hub records the wait once its create request has returned, which the test's LIST can
    // see first (CI at 4c71cda: the count still 0 when the NodeGroup was seen).
    let recorded = common::poll_until(Duration::from_secs(10), || async {
        own("karpenter_hub_pod_provisioning_latency_seconds_count", &[]) >= 1.0
    })
    .await;
    assert!(recorded, "the hub recorded no pod's wait within 10 s of its NodeGroup");
    assert_eq!(own("karpenter_hub_pod_provisioning_latency_seconds_count", &[]), 1.0, "one pod's wait");
    let total = own("karpenter_hub_pod_provisioning_latency_seconds_sum", &[]);
    assert!(total > 0.0 && total <= (grouped - marked).as_secs_f64() + 0.5, "the hub's share {total} s");
    let stages: f64 = ["batch", "decide", "launch"]
        .iter()
        .map(|s| own("karpenter_hub_pod_provisioning_stage_seconds_sum", &[("stage", s)]))
        .sum();
    assert!((stages - total).abs() < 1e-6, "stages {stages} s, total {total} s");
    assert!(
        own("karpenter_hub_pod_provisioning_stage_seconds_sum", &[("stage", "batch")]) >= 0.9,
        "the batch idle window"
    );
    wait_for("the pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    let after = wait_quiet_over(
        "rounds after the pod ran",
        Duration::from_secs(60),
        4,
        || async { (rounds(&world, 0), rounds(&world, 1)) },
        || async { probes(&world) },
    )
    .await;
    assert_eq!(after, (1, 0), "one round for the one new pod (its claim in flight needs no other), none elsewhere");
    assert_eq!(management_lists(&world), lists_before, "rounds read the management caches: no LIST");
    // With the node up and its pod running, the hub writes nothing more (B4's idle target) once the
    // claim has become Consolidatable (consolidateAfter: 30s after its pods last changed, once).
    let claims = Api::<crds::NodeClaim>::namespaced(world.mgmt.client(), &c.namespace);
    // consolidateAfter past the pod's last event, which the emulators stamped on the wall clock (the
    // hub's has stood still meanwhile). Moving the clock re-decides every claim at once.
    clock.set(chrono::Utc::now() + chrono::Duration::seconds(31));
    wait_for("the claim Consolidatable", Duration::from_secs(90), || async {
        claims.list(&ListParams::default()).await.unwrap().items.iter().all(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Consolidatable" && k.status == "True"))
        })
    })
    .await;
    let writes_now = || async {
        let mut w = writes(&world.mgmt, &["nodeclaims", "nodeclaims/status", "nodepools/status"]);
        w.extend(writes(&world.clusters[0].server, &["nodes", "nodegroups", "pods"]));
        w
    };
    let settled =
        wait_quiet_over("writes once the node runs its pod", Duration::from_secs(90), 3, writes_now, || async {
            probes(&world)
        })
        .await;
    let later =
        wait_quiet_over("still no writes", Duration::from_secs(120), 40, writes_now, || async { probes(&world) }).await;
    let conditions: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|c| {
            c.status.iter().flat_map(|s| s.conditions.iter().map(|k| format!("{}={} {}", k.type_, k.status, k.reason)))
        })
        .collect();
    assert_eq!(settled, later, "an idle cluster with a hub node costs no write; the claim: {conditions:?}");
    // And the claim was made.
    assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 1);
    world.shutdown().await;
}

/// The test is the scheduler here (the emulator's binder is off): `pod` marked Unschedulable as
/// kube-scheduler marks it.
async fn mark_unschedulable(pods: &Api<Pod>, name: &str) {
    let status = serde_json::json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available", "lastTransitionTime": chrono::Utc::now().to_rfc3339(),
    }]}});
    pods.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status)).await.unwrap();
}

/// Issue 28 item 6: a round counted a pending pod on an existing node's room; then another pod
/// took that room (bound straight to the node: no pod started waiting, no node came or went, no
/// pool changed). The pod is looked at again within the periodic resync and gets a node of its own
/// — before, the hub had no news to run a round for, and the pod waited forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_counted_on_room_another_pod_took_gets_a_node_without_news() {
    let mut world = World::start(&[("team-a", "alpha")], |i| {
        let mut cke = quick_cke(i as u64);
        cke.binder = false;
        cke.control_plane.count = 1;
        cke
    })
    .await
    .unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    let c = &world.clusters[0];
    wait_for("NodePool Ready", Duration::from_secs(30), || async {
        pool_condition_true(&world, &c.namespace, "default", "Ready").await.is_some()
    })
    .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client());
    let node =
        nodes.list(&ListParams::default()).await.unwrap().items.into_iter().next().expect("the control-plane node");
    let node_name = node.metadata.name.clone().unwrap();
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(c.client(), "default");
    // A small pod with no node selector: the control-plane node (schedulable on CKE) has room.
    let waiting: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waiting", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/web:1",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &waiting).await.unwrap();
    mark_unschedulable(&pods, "waiting").await;
    wait_for("a round over the waiting pod", Duration::from_secs(30), || async { rounds(&world, 0) >= 1 }).await;
    assert_eq!(
        metric(&world, "karpenter_nodeclaims_created_total", &[]),
        0.0,
        "the round counts the pod on the control-plane node's room"
    );
    // Another pod takes all of that room, bound by name (as a DaemonSet's or a static pod would be).
    let hog: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hog", "namespace": "default"},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "registry.example/hog:1",
            "resources": {"requests": {"cpu": allocatable["cpu"], "memory": allocatable["memory"]}}}]}
    }))
    .unwrap();
    pods.create(&kube::api::PostParams::default(), &hog).await.unwrap();
    // Nothing else changes. Within the periodic look (10 s after the last round, plus the batch
    // window and a margin for a loaded machine), a round sees the room gone and makes a claim.
    wait_for("a NodeClaim for the pod whose room was taken", Duration::from_secs(25), || async {
        metric(&world, "karpenter_nodeclaims_created_total", &[]) >= 1.0
    })
    .await;
    let groups: Api<NodeGroup> = Api::all(c.client());
    wait_for("its NodeGroup", Duration::from_secs(30), || async {
        !groups.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
    world.shutdown().await;
}
