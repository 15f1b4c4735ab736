//! NodeOverlays (issue 28 item 3, upstream's NodeOverlay) on the simulated world: the hub evaluates
//! a namespace's overlays (weights, conflicts) into their status, and its rounds price flavors with
//! the accepted ones — a pod a 2XS holds gets an XS once an overlay makes 2XS dearer; an overlay of
//! equal weight on the same flavor is refused, naming the other — and give flavors the extended
//! resources of their `capacity`: a GPU pod no flavor could hold gets a node of the flavor the
//! overlay gives a GPU, which counts as initialized once its device plugin reports it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crds::{NodeGroup, NodeOverlay};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use operator::commands::sandbox::world::{quick_cke, workload_pod};
use serde_json::json;

use crate::common::wait_for;
use crate::disruption::{UP, claims, create, is_true, running, world, world_with};

fn condition(o: &NodeOverlay, type_: &str) -> Option<(String, String, String)> {
    o.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accepted_overlay_prices_flavors_and_an_equal_weight_one_is_refused() {
    let (world, _clock) = world("priced", |_| {}).await;
    let overlays: Api<NodeOverlay> = Api::namespaced(world.mgmt.client(), "team");
    let make = |name: &str, spec: serde_json::Value| -> NodeOverlay {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": name, "namespace": "team"}, "spec": spec
        }))
        .unwrap()
    };
    let avoid = make(
        "avoid-2xs",
        json!({"weight": 10, "price": "0.07",
            "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS"]}]}),
    );
    let also = make(
        "also-2xs",
        json!({"weight": 10, "price": "0.01",
            "requirements": [{"key": "karpenter.clever-cloud.com/instance-cpu", "operator": "Lte", "values": ["4"]}]}),
    );
    overlays.create(&PostParams::default(), &avoid).await.unwrap();
    overlays.create(&PostParams::default(), &also).await.unwrap();
    wait_for("avoid-2xs accepted, also-2xs refused for the conflict", UP, || async {
        let a = overlays.get("avoid-2xs").await.unwrap();
        let b = overlays.get("also-2xs").await.unwrap();
        condition(&a, "Ready").is_some_and(|(s, ..)| s == "True")
            && condition(&b, "ValidationSucceeded")
                .is_some_and(|(s, r, m)| s == "False" && r == "Conflict" && m.contains("avoid-2xs"))
            && condition(&b, "Ready").is_some_and(|(s, ..)| s == "False")
    })
    .await;

    // A 3-CPU pod: a 2XS (0.0333 EUR/h) holds it, but the overlay prices 2XS at 0.07, above XS.
    create(&world, &[("web-0", "3", "2Gi")], json!({})).await;
    wait_for("a NodeGroup for the pod", UP, || async {
        let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
        !groups.items.is_empty()
    })
    .await;
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    let flavors: Vec<&str> = groups.items.iter().map(|g| g.spec.flavor.as_str()).collect();
    assert_eq!(flavors, ["XS"], "the overlaid price decides");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlay_capacity_gives_a_gpu_pod_a_node_of_the_flavor_it_names() {
    // The emulated device plugin: a node of flavor M reports one GPU once Ready.
    let mut cke = quick_cke(0);
    for f in cke.flavors.iter_mut().filter(|f| f.name == "M") {
        f.devices.insert("nvidia.com/gpu".to_string(), 1);
    }
    // The pool may have one GPU.
    let (world, _clock) = world_with("gpus", cke, |pool| pool["spec"]["limits"] = json!({"nvidia.com/gpu": "1"})).await;
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    let gpu_pod = |name: &str| {
        let mut pod = serde_json::to_value(workload_pod(name, "1", "1Gi")).unwrap();
        pod["spec"]["containers"][0]["resources"]["limits"] = json!({"nvidia.com/gpu": "1"});
        serde_json::from_value::<Pod>(pod).unwrap()
    };
    pods.create(&PostParams::default(), &gpu_pod("train")).await.unwrap();

    // No flavor offers a GPU: the hub says so on the pod, and creates nothing.
    let events: Api<Event> = Api::namespaced(world.clusters[0].client(), "default");
    wait_for("the hub to say no flavor offers a GPU", UP, || async {
        events.list(&ListParams::default()).await.unwrap().items.iter().any(|e| {
            e.reason.as_deref() == Some("FailedScheduling")
                && e.note.as_deref().is_some_and(|n| n.contains("no instance type offers nvidia.com/gpu=1"))
        })
    })
    .await;
    assert!(claims(&world).await.is_empty());

    // An overlay gives M its GPU: a claim asking for it, an M NodeGroup, the pod running there.
    let overlay: NodeOverlay = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeOverlay",
        "metadata": {"name": "m-has-a-gpu", "namespace": "team"},
        "spec": {"capacity": {"nvidia.com/gpu": "1"},
            "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["M"]}]}
    }))
    .unwrap();
    Api::<NodeOverlay>::namespaced(world.mgmt.client(), "team").create(&PostParams::default(), &overlay).await.unwrap();
    wait_for("the GPU pod running", UP, || async {
        running(&world).await.iter().any(|p| p.metadata.name.as_deref() == Some("train"))
    })
    .await;
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    let flavors: Vec<&str> = groups.items.iter().map(|g| g.spec.flavor.as_str()).collect();
    assert_eq!(flavors, ["M"], "the only flavor the overlay gives a GPU");
    let claims = claims(&world).await;
    assert_eq!(claims.len(), 1);
    let requests = claims[0].spec.resources.requests.clone().unwrap_or_default();
    assert_eq!(requests.get("nvidia.com/gpu").map(|q| q.0.as_str()), Some("1"), "{requests:?}");
    let allocatable = claims[0].status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
    assert_eq!(allocatable.get("nvidia.com/gpu").map(|q| q.0.as_str()), Some("1"), "{allocatable:?}");
    wait_for("the claim initialized once its node reports the GPU", UP, || async {
        super::disruption::claims(&world).await.iter().all(|c| is_true(c, "Initialized"))
    })
    .await;

    // The pool's one GPU is taken: a second GPU pod waits, the reason naming the limit, and the
    // pool's status counts the GPU.
    pods.create(&PostParams::default(), &gpu_pod("train-2")).await.unwrap();
    wait_for("the hub to say the pool's GPU limit is reached", UP, || async {
        events.list(&ListParams::default()).await.unwrap().items.iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("train-2")
                && e.note.as_deref().is_some_and(|n| n.contains("remaining limits nvidia.com/gpu=0"))
        })
    })
    .await;
    assert_eq!(super::disruption::claims(&world).await.len(), 1);
    let pools = Api::<crds::NodePool>::namespaced(world.mgmt.client(), "team");
    wait_for("the pool's status to count the GPU", UP, || async {
        pools.list(&ListParams::default()).await.unwrap().items.iter().any(|p| {
            let resources = p.status.as_ref().and_then(|s| s.resources.clone()).unwrap_or_default();
            resources.get("nvidia.com/gpu").is_some_and(|q| q.0 == "1")
        })
    })
    .await;
    world.shutdown().await;
}
