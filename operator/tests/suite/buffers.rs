//! CapacityBuffers (issue 28 item 2, upstream's CapacityBuffer) on the simulated world: the real
//! hub keeps room for a buffer's pods with no pod pending; emptiness leaves that room alone; real
//! pods take it at once and the hub makes room for the buffer again; without the buffer the room
//! goes. The status and the gauge say where the buffer's pods stand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::CapacityBuffer;
use k8s_openapi::api::core::v1::PodTemplate;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use crate::common::{metric, wait_for};
use crate::disruption::{UP, advance_until, claims, create, is_true, quiet_claims, running, running_on, world};

fn buffer_condition(b: &CapacityBuffer, type_: &str) -> Option<(String, String)> {
    b.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_keeps_room_that_real_pods_take_at_once_and_emptiness_leaves_alone() {
    let (world, clock) = world("warm", |_| {}).await;
    let mgmt = world.mgmt.client();
    let template: PodTemplate = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "web", "namespace": "team"},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "nodeSelector": {"clever-cloud.com/cluster-node-role": "worker"},
            "containers": [
            {"name": "app", "image": "nginx", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    }))
    .unwrap();
    Api::<PodTemplate>::namespaced(mgmt.clone(), "team").create(&PostParams::default(), &template).await.unwrap();
    let buffers: Api<CapacityBuffer> = Api::namespaced(mgmt.clone(), "team");
    let buffer: CapacityBuffer = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CapacityBuffer",
        "metadata": {"name": "warm", "namespace": "team"},
        "spec": {"clusterName": "warm", "podTemplateRef": {"name": "web"}, "replicas": 2}
    }))
    .unwrap();
    buffers.create(&PostParams::default(), &buffer).await.unwrap();

    // No pod pending: one node for the buffer's two pods, and the status says the room exists.
    running_on(&world, 0, 1).await;
    let first = claims(&world).await.remove(0).name_any();
    wait_for("the buffer Resolved and fitting existing capacity", UP, || async {
        let b = buffers.get("warm").await.unwrap();
        buffer_condition(&b, "ReadyForProvisioning") == Some(("True".into(), "Resolved".into()))
            && buffer_condition(&b, "Provisioning") == Some(("True".into(), "FitsExistingCapacity".into()))
            && b.status.as_ref().and_then(|s| s.replicas) == Some(2)
    })
    .await;
    let cluster = world.clusters[0].key().to_string();
    let gauge = |placement: &str| {
        metric(
            &world,
            "karpenter_hub_capacity_buffer_pods",
            &[("cluster", &cluster), ("capacitybuffer", "warm"), ("placement", placement)],
        )
    };
    wait_for("the gauge: two buffer pods on existing capacity", UP, || async { gauge("existing") == 2.0 }).await;

    // The node has no pod: past consolidateAfter (30 s) and the validation delay, emptiness
    // would delete it (disruption::an_empty_node_goes_…); the buffer keeps it.
    let quiet = quiet_claims(&world, &clock, "passes over the buffer's empty node", 12).await;
    assert_eq!(quiet, vec![(first.clone(), false)], "the buffer's room is not emptiness's to take");

    // A burst of real pods of the template's shape runs at once on that room, and the hub makes
    // room for the buffer again without any pod pending.
    create(&world, &[("web-0", "1", "1Gi"), ("web-1", "1", "1Gi")], json!({})).await;
    wait_for("the real pods running on the buffer's node", UP, || async { running(&world).await.len() == 2 }).await;
    let node = claims(&world).await.iter().find(|c| c.name_any() == first).and_then(|c| c.status.clone()?.node_name);
    let on: Vec<Option<String>> = running(&world).await.iter().map(|p| p.spec.clone()?.node_name).collect();
    assert_eq!(on, vec![node.clone(), node], "the burst ran on the buffer's room, no new node needed");
    running_on(&world, 2, 2).await;
    wait_for("the buffer fitting again", UP, || async {
        let b = buffers.get("warm").await.unwrap();
        buffer_condition(&b, "Provisioning") == Some(("True".into(), "FitsExistingCapacity".into()))
    })
    .await;

    // Without the buffer, its new empty node goes; the real pods' node stays.
    buffers.delete("warm", &DeleteParams::default()).await.unwrap();
    advance_until(&clock, "the buffer's second node deleted", Duration::from_secs(5), || async {
        let cs = claims(&world).await;
        cs.iter().filter(|c| c.metadata.deletion_timestamp.is_none()).count() == 1
            && cs.iter().any(|c| c.name_any() == first && is_true(c, "Initialized"))
    })
    .await;
    wait_for("the buffer's series gone", UP, || async { gauge("existing") == 0.0 }).await;
    world.shutdown().await;
}
