//! The simulated CKE's NodeGroup side, through the API of the emulator: what the hub sees when it
//! creates and deletes NodeGroups (clever-cloud.md §1.3–§1.7).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::Duration;

use cke_support::{World, node_ready, taint_keys};
use crds::nodegroup::Verdict;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sim::cke::{GroupSelector, SimCkeConfig, VanishRule};

const SEC: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_nodegroup_becomes_a_ready_node_with_cke_labels_and_flavor_capacity() {
    let w = World::start(SimCkeConfig { seed: 7, ..SimCkeConfig::default() }).await;
    let start = w.clock.now();
    w.create_group(
        "ng-a",
        "XS",
        json!({"karpenter.sh/nodepool": "general"}),
        json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]),
    )
    .await;

    // Accepted about 1 s after creation, with CKE's shapes; CKE's finalizer is on it.
    let group = w.until("acceptance", SEC, || async { w.group("ng-a").await.filter(|g| g.is_accepted()) }).await;
    let status = group.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Synced"));
    let ready = status.conditions.as_ref().unwrap().iter().find(|c| c.type_.as_deref() == Some("Ready")).unwrap();
    assert_eq!(ready.reason.as_deref(), Some("Synced"));
    assert!(group.finalizers().iter().any(|f| f.starts_with("api.clever-cloud.com/")));

    // The Node joins ~25 s later and turns Ready.
    let node = w.until("Node ready", SEC, || async { w.node("ng-a-node0").await.filter(node_ready) }).await;
    let created = node.metadata.creation_timestamp.as_ref().unwrap().0.as_second();
    assert!(created - start.timestamp() >= 26, "verdict 1 s + join 25 s");
    let labels = node.labels();
    assert_eq!(labels["clever-cloud.com/flavor"], "XS");
    assert_eq!(labels["clever-cloud.com/nodegroup"], "ng-a");
    assert_eq!(labels["clever-cloud.com/cluster-node-role"], "worker");
    assert_eq!(labels["karpenter.sh/nodepool"], "general");
    assert_eq!(labels["kubernetes.io/hostname"], "ng-a-node0");
    assert!(node.spec.as_ref().unwrap().provider_id.is_none(), "CKE leaves providerID empty");
    let status = node.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "6");
    assert_eq!(status.capacity.as_ref().unwrap()["memory"].0, "7937580Ki");
    assert_eq!(status.allocatable.as_ref().unwrap()["memory"].0, "7835180Ki");
    assert_eq!(status.allocatable.as_ref().unwrap()["pods"].0, "110");

    // The kubelet's not-ready taint goes; the group's taint stays until the hub removes it.
    let node = w
        .until("not-ready taint removed", SEC, || async {
            w.node("ng-a-node0").await.filter(|n| !taint_keys(n).contains(&"node.kubernetes.io/not-ready".to_string()))
        })
        .await;
    assert_eq!(taint_keys(&node), ["karpenter.sh/unregistered"]);
    w.until("status.nodeCount = 1", SEC, || async {
        w.group("ng-a").await.filter(|g| g.status.as_ref().and_then(|s| s.node_count) == Some(1))
    })
    .await;

    // Its kubelet heartbeats through a Lease that keeps being renewed.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(w.client.clone(), "kube-node-lease");
    let renew_time = |l: &k8s_openapi::api::coordination::v1::Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let lease = w.until("node lease", SEC, || async { leases.get_opt("ng-a-node0").await.unwrap() }).await;
    assert_eq!(lease.spec.as_ref().unwrap().holder_identity.as_deref(), Some("ng-a-node0"));
    let first = renew_time(&lease).unwrap();
    w.until("lease renewed", SEC, || async {
        leases.get_opt("ng-a-node0").await.unwrap().filter(|l| renew_time(l).is_some_and(|t| t.0 > first.0))
    })
    .await;

    // Nothing else appeared: the two control-plane nodes and this one.
    assert_eq!(w.node_names().await, ["control-plane-0", "control-plane-1", "ng-a-node0"]);
    let cp = w.node("control-plane-0").await.unwrap();
    assert_eq!(cp.labels()["clever-cloud.com/cluster-node-role"], "control-plane");
    assert!(node_ready(&cp));
    w.stop().await;
}

#[tokio::test]
async fn the_quota_counts_the_control_plane_and_rejects_with_ckes_message() {
    let w = World::start(SimCkeConfig::default()).await;
    w.create_group("big", "L", json!({}), json!([])).await;
    let big =
        w.until("verdict", SEC, || async { w.group("big").await.filter(|g| g.verdict() != Verdict::Pending) }).await;
    assert!(big.is_quota_rejected());
    assert_eq!(big.status.as_ref().unwrap().phase.as_deref(), Some("QuotaExceeded"));
    assert_eq!(
        big.verdict(),
        Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB".to_string()))
    );

    // An M fits exactly (24 + 16 GB); then even a 2XS does not.
    w.create_group("m", "M", json!({}), json!([])).await;
    w.until("M accepted", SEC, || async { w.group("m").await.filter(|g| g.is_accepted()) }).await;
    w.create_group("small", "2XS", json!({}), json!([])).await;
    let small = w
        .until("2XS verdict", SEC, || async { w.group("small").await.filter(|g| g.verdict() != Verdict::Pending) })
        .await;
    assert_eq!(
        small.verdict(),
        Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 40.0 GB | actual = 44.0 GB".to_string()))
    );

    // Rejected groups never get a Node.
    w.until("M node", SEC, || async { w.node("m-node0").await }).await;
    w.clock.advance(Duration::from_secs(120));
    w.settle().await;
    assert_eq!(w.node_names().await, ["control-plane-0", "control-plane-1", "m-node0"]);
    w.stop().await;
}

#[tokio::test]
async fn deletion_is_asynchronous_behind_ckes_finalizer_and_waits_for_the_node() {
    let w = World::start(SimCkeConfig::default()).await;
    w.create_group("gone", "2XS", json!({}), json!([])).await;
    w.until("node", SEC, || async { w.node("gone-node0").await }).await;
    // The hub holds a finalizer on its Nodes.
    let pp = PatchParams::default();
    w.nodes()
        .patch("gone-node0", &pp, &Patch::Merge(json!({"metadata": {"finalizers": ["karpenter.sh/termination"]}})))
        .await
        .unwrap();

    w.groups().delete("gone", &DeleteParams::default()).await.unwrap();
    let group = w
        .until("terminating", Duration::ZERO, || async {
            w.group("gone").await.filter(|g| {
                let conditions = g.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                g.is_terminating() && conditions.iter().any(|c| c.type_.as_deref() == Some("Terminating"))
            })
        })
        .await;
    assert!(group.is_accepted(), "a terminating group keeps its verdict");

    // The VM is torn down ~35 s after the delete: not before.
    w.clock.advance(Duration::from_secs(30));
    w.settle().await;
    assert!(w.node("gone-node0").await.unwrap().metadata.deletion_timestamp.is_none());
    w.until("Node deletion requested", SEC, || async {
        w.node("gone-node0").await.filter(|n| n.metadata.deletion_timestamp.is_some())
    })
    .await;

    // CKE's finalizer waits for the Node object to be gone.
    w.clock.advance(Duration::from_secs(60));
    w.settle().await;
    assert!(w.group("gone").await.is_some(), "the group waits for its Node");

    // The hub releases its Node finalizer: Node gone, then the group.
    w.nodes().patch("gone-node0", &pp, &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    w.until("group gone", SEC, || async { w.group("gone").await.is_none().then_some(()) }).await;
    assert!(w.node("gone-node0").await.is_none());
    w.stop().await;
}

#[tokio::test]
async fn an_accepted_group_can_vanish() {
    let config = SimCkeConfig {
        vanish: vec![VanishRule {
            selector: GroupSelector::NamePrefix("doomed".to_string()),
            probability: 1.0,
            after: Duration::from_secs(3),
        }],
        ..SimCkeConfig::default()
    };
    let w = World::start(config).await;
    w.create_group("doomed-1", "2XS", json!({}), json!([])).await;
    w.create_group("safe", "2XS", json!({}), json!([])).await;
    w.until("vanished", SEC, || async { w.group("doomed-1").await.is_none().then_some(()) }).await;
    // Only accepted groups vanish.
    assert_eq!(w.cke.vanished(), ["doomed-1"]);

    w.until("the other group's node", SEC, || async { w.node("safe-node0").await }).await;
    assert!(w.group("safe").await.unwrap().is_accepted());
    assert_eq!(
        w.node_names().await,
        ["control-plane-0", "control-plane-1", "safe-node0"],
        "no node for the vanished group"
    );
    w.stop().await;
}

#[tokio::test]
async fn an_unknown_flavor_fails_without_a_node() {
    let w = World::start(SimCkeConfig::default()).await;
    w.create_group("odd", "XXL", json!({}), json!([])).await;
    let odd =
        w.until("verdict", SEC, || async { w.group("odd").await.filter(|g| g.verdict() != Verdict::Pending) }).await;
    assert!(matches!(odd.verdict(), Verdict::Failed { reason: Some(r), .. } if r == "InvalidFlavor"));
    w.clock.advance(Duration::from_secs(60));
    w.settle().await;
    assert_eq!(w.node_names().await, ["control-plane-0", "control-plane-1"]);
    w.stop().await;
}

#[tokio::test]
async fn sim_cke_entry_point_installs_the_crd_and_stops_on_shutdown() {
    // A bare API server (no NodeGroup CRD), the wall clock and no delays: what `sim-cke` does.
    let server = sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::new("bare")).await.unwrap();
    let client = server.client();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(sim::cke::run(client.clone(), SimCkeConfig::instant(), async move {
        let _ = rx.await;
    }));
    let groups: Api<crds::nodegroup::NodeGroup> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + cke_support::WALL_TIMEOUT;
    let group: crds::nodegroup::NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": "quick"}, "spec": {"flavor": "2XS", "nodeCount": 1},
    }))
    .unwrap();
    // The CRD appears once the simulator is up.
    while groups.create(&Default::default(), &group).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "NodeGroups never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    while !nodes.get_opt("quick-node0").await.unwrap().as_ref().is_some_and(node_ready) {
        assert!(tokio::time::Instant::now() < deadline, "node never Ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tx.send(()).unwrap();
    tokio::time::timeout(cke_support::WALL_TIMEOUT, run).await.unwrap().unwrap().unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn node_count_is_honoured_including_a_scale_down() {
    let w = World::start(SimCkeConfig::default()).await;
    let group: crds::nodegroup::NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": "pair"}, "spec": {"flavor": "2XS", "nodeCount": 2},
    }))
    .unwrap();
    w.groups().create(&Default::default(), &group).await.unwrap();
    w.until("two nodes", SEC, || async {
        let names = w.node_names().await;
        (names.iter().filter(|n| n.starts_with("pair-node")).count() == 2).then_some(())
    })
    .await;
    assert_eq!(w.node_names().await, ["control-plane-0", "control-plane-1", "pair-node0", "pair-node1"]);
    w.until("status.nodeCount = 2", SEC, || async {
        w.group("pair").await.filter(|g| g.status.as_ref().and_then(|s| s.node_count) == Some(2))
    })
    .await;

    // Resized from outside (as CKE's autoscaler would): the highest node goes.
    w.groups().patch("pair", &PatchParams::default(), &Patch::Merge(json!({"spec": {"nodeCount": 1}}))).await.unwrap();
    w.until("pair-node1 gone", SEC, || async { w.node("pair-node1").await.is_none().then_some(()) }).await;
    w.until("status.nodeCount = 1", SEC, || async {
        w.group("pair").await.filter(|g| g.status.as_ref().and_then(|s| s.node_count) == Some(1))
    })
    .await;
    assert!(w.node("pair-node0").await.is_some());
    w.stop().await;
}
