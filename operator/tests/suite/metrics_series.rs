//! The pending-pod and cost series on the simulated world, as a dashboard reads them: the queue of
//! pods waiting for capacity, the pods a decision could not place, and each pool's cost per hour by
//! its node class's catalogue; all three go with the cluster's registration Secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::NodeClaim;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale, workload_pod};
use serde_json::{Value, json};

use crate::common;
use common::{EXAMPLE, running, wait_for};

const CLUSTER: &str = "team-a/alpha";
/// The negotiated XS price of the test's FlavorCatalog (the built-in one is 0.0611 EUR/h).
const XS_PRICE: f64 = 0.0577;
const WAIT: Duration = Duration::from_secs(60);

/// The value of `name`'s series for `CLUSTER` (and `nodepool` when given), `None` when absent.
fn series(world: &World, name: &str, nodepool: Option<&str>) -> Option<f64> {
    let mut labels = format!("cluster=\"{CLUSTER}\"");
    if let Some(p) = nodepool {
        labels.push_str(&format!(",nodepool=\"{p}\""));
    }
    let prefix = format!("{name}{{{labels}}} ");
    world.metrics.render().lines().find_map(|l| l.strip_prefix(&prefix).map(|v| v.parse::<f64>().unwrap()))
}

fn queue(world: &World) -> Option<f64> {
    series(world, "karpenter_scheduler_queue_depth", None)
}

fn unschedulable(world: &World) -> Option<f64> {
    series(world, "karpenter_scheduler_unschedulable_pods_count", None)
}

fn price(world: &World) -> Option<f64> {
    series(world, "karpenter_hub_nodepool_price_per_hour", Some("default"))
}

fn near(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() < 1e-9)
}

async fn claims(world: &World) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap().items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_unschedulable_pods_and_pool_cost_follow_the_cluster() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    // The example's node class with a catalogue that prices XS differently from the built-in one:
    // the pool's cost must come from the class's catalogue.
    let catalogue = format!(
        "apiVersion: karpenter.clever-cloud.com/v1alpha1\nkind: FlavorCatalog\nmetadata:\n  name: negotiated\n\
         spec:\n  flavors:\n    - name: XS\n      priceHourly: {XS_PRICE}\n"
    );
    world.apply_yaml("negotiated.yaml", &catalogue, "team-a", |_| {}).await.unwrap();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, "team-a", |doc| match doc["kind"].as_str() {
            Some("NodePool") => doc["spec"]["clusterName"] = Value::String("alpha".into()),
            Some("CleverNodeClass") => doc["spec"]["flavorCatalogRef"] = json!({"name": "negotiated"}),
            _ => {}
        })
        .await
        .unwrap();
    world.start_hub();

    // Nothing pending: the queue is 0, not absent; the pool has no claim, so it costs 0.
    wait_for("queue depth 0 and pool cost 0", WAIT, || async {
        queue(&world) == Some(0.0) && price(&world) == Some(0.0)
    })
    .await;

    // 4 × (1 CPU, 1Gi) fit one XS: the pods wait in the queue until their node is up.
    scale(&world, 0, 4, "1", "1Gi").await.unwrap();
    wait_for("the 4 pods in the queue", WAIT, || async { queue(&world) == Some(4.0) }).await;
    wait_for("4 pods running", WAIT, || async { running(&world, 0).await == 4 }).await;
    wait_for("queue empty, nothing unschedulable, one XS paid", WAIT, || async {
        queue(&world) == Some(0.0) && unschedulable(&world) == Some(0.0) && near(price(&world), XS_PRICE)
    })
    .await;
    assert_eq!(claims(&world).await.len(), 1);

    // A pod no flavor can hold: it waits and the decision cannot place it; nothing is bought for it.
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    pods.create(&PostParams::default(), &workload_pod("huge", "500", "1Gi")).await.unwrap();
    wait_for("the huge pod queued and unschedulable", WAIT, || async {
        queue(&world) == Some(1.0) && unschedulable(&world) == Some(1.0)
    })
    .await;
    assert!(near(price(&world), XS_PRICE), "cost after an unschedulable pod: {:?}", price(&world));
    assert_eq!(claims(&world).await.len(), 1, "no claim for a pod no flavor holds");
    pods.delete("huge", &Default::default()).await.unwrap();
    wait_for("the queue and the unschedulable count back to 0", WAIT, || async {
        queue(&world) == Some(0.0) && unschedulable(&world) == Some(0.0)
    })
    .await;

    // A claim being deleted is no longer paid for (no pods left, so none replaces it).
    scale(&world, 0, 0, "1", "1Gi").await.unwrap();
    let claim = claims(&world).await.remove(0).name_any();
    Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").delete(&claim, &Default::default()).await.unwrap();
    wait_for("pool cost 0 once its claim is deleted", WAIT, || async { price(&world) == Some(0.0) }).await;

    // The cluster's Secret goes: its three series go with it and do not come back.
    let secrets: Api<Secret> = Api::namespaced(world.mgmt.client(), "team-a");
    secrets.delete("alpha-kubeconfig", &Default::default()).await.unwrap();
    wait_for("the cluster's series removed", WAIT, || async {
        queue(&world).is_none() && unschedulable(&world).is_none() && price(&world).is_none()
    })
    .await;
    // A later reconcile of the pool (its status still says SecretMissing) must not write them back.
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    // A change the reconcile must write (its class now missing) proves the reconcile ran.
    let touch = json!({"spec": {"template": {"spec": {"nodeClassRef": {"name": "missing"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    wait_for("the pool reconciled after the touch", WAIT, || async {
        pools
            .get("default")
            .await
            .ok()
            .and_then(|p| p.status)
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "NodeClassReady" && c.status != "True"))
    })
    .await;
    let text = world.metrics.render();
    assert!(!text.contains(CLUSTER), "series of the removed cluster:\n{text}");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodepool_leaves_no_cost_or_usage_behind() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    common::apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    // No FlavorCatalog here: the built-in price.
    let two_xs = crds::catalog::builtin("2XS").unwrap().price_hourly;
    wait_for("one pod running and its 2XS paid", WAIT, || async {
        running(&world, 0).await == 1 && near(price(&world), two_xs)
    })
    .await;
    let usage =
        || world.metrics.render().contains("karpenter_nodepools_usage{cluster=\"team-a/alpha\",nodepool=\"default\"");
    assert!(usage(), "usage series before the deletion");
    scale(&world, 0, 0, "500m", "1Gi").await.unwrap();
    // The pool goes; its claim goes with it (owner cascade), and so do the pool's gauges, although
    // the hub never reconciles a pool that no longer exists.
    Api::<crds::NodePool>::namespaced(world.mgmt.client(), "team-a")
        .delete("default", &Default::default())
        .await
        .unwrap();
    wait_for("the deleted pool's cost and usage series gone", WAIT, || async { price(&world).is_none() && !usage() })
        .await;
    // Only the pool's: the cluster's own series stay.
    assert_eq!(queue(&world), Some(0.0), "{}", world.metrics.render());
    world.shutdown().await;
}
