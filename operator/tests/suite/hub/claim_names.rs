//! NodeClaim names (found by the API-fault chaos test): a claim's name comes from the pods it was
//! made for, so a create whose answer was lost finds its claim again; a claim the round already
//! counted as capacity must never be taken for such a replay.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use operator::commands::sandbox::world::{World, quick_cke};

use crate::common::{apply_example, pod_alone_on_its_node, running, wait_for};

/// A pod whose claim another pod took gets a claim of its own (found by the API-fault chaos test).
/// A claim's name comes from the pods it was made for, so a create that lost its answer finds its
/// claim again; but the solver may give an in-flight claim to another pod (an older one that began
/// waiting since), and the first pod's new claim then has the very name of the claim it lost. The
/// hub took that for a replay of its own create and never made it: the pod waited forever. A
/// claim the decision counted as capacity is now never a replay: the next name is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_in_flight_claim_went_to_an_older_pod_gets_a_claim_of_its_own() {
    let mut world = World::start(&[("team-a", "alpha")], |i| {
        let mut cke = quick_cke(i as u64 + 40);
        // The first claim stays in flight (no node) while the second pod arrives and is decided.
        cke.verdict_delay = sim::cke::DelayRange::fixed(Duration::from_secs(8));
        cke
    })
    .await
    .unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    let claims: Api<crds::NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    // Equal pods, one per node (required anti-affinity): the solver places the older first. The
    // older is held back by a scheduling gate, so the younger waits (and gets a claim) first.
    for (name, gated) in [("older", true), ("younger", false)] {
        let mut pod = pod_alone_on_its_node(name, "500m", "1Gi");
        if gated {
            pod["spec"]["schedulingGates"] = serde_json::json!([{"name": "example.com/later"}]);
        }
        pods.create(&Default::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await; // creation times one second apart
    }
    wait_for("the younger pod's claim", Duration::from_secs(30), || async {
        claims.list(&ListParams::default()).await.unwrap().items.len() == 1
    })
    .await;
    // The older pod now waits too and takes the younger's claim, still in flight.
    pods.patch(
        "older",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"schedulingGates": null}})),
    )
    .await
    .unwrap();
    wait_for("both pods running, each on a node of its own", Duration::from_secs(60), || async {
        running(&world, 0).await == 2
    })
    .await;
    let names: Vec<String> =
        claims.list(&ListParams::default()).await.unwrap().items.iter().map(kube::ResourceExt::name_any).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    world.shutdown().await;
}
