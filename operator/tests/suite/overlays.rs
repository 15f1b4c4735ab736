//! NodeOverlays (issue 28 item 3, upstream's NodeOverlay, price part) on the simulated world: the
//! hub evaluates a namespace's overlays (weights, conflicts) into their status, and its rounds
//! price flavors with the accepted ones — a pod a 2XS holds gets an XS once an overlay makes 2XS
//! dearer; an overlay of equal weight on the same flavor is refused, naming the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crds::{NodeGroup, NodeOverlay};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;

use crate::common::wait_for;
use crate::disruption::{UP, create, world};

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
