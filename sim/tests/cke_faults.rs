//! The simulated CKE under API faults: failed writes are made again and dropped watches resume,
//! so a NodeGroup still becomes a Ready node and a pod still runs on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::Duration;

use cke_support::{World, node_ready};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;
use sim::apiserver::ErrorFault;
use sim::cke::SimCkeConfig;

const SEC: Duration = Duration::from_secs(1);

#[tokio::test]
async fn converges_despite_failed_writes_and_dropped_watches() {
    let w = World::start(SimCkeConfig { seed: 3, ..SimCkeConfig::default() }).await;
    // Let start-up finish (control-plane nodes) before injecting faults.
    w.until("control plane", Duration::ZERO, || async { w.node("control-plane-1").await }).await;
    let faults = w.server.faults();
    faults.set_error(ErrorFault {
        rate: 0.4,
        status: 500,
        verbs: ["create", "patch", "delete"].map(String::from).to_vec(),
        resources: Vec::new(),
    });

    // The test's own writes retry until they pass.
    let mut attempts = 0;
    while w.create_group_opt("ng", "2XS").await.is_none() {
        attempts += 1;
        assert!(attempts < 50, "could not create the NodeGroup through the faults");
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeSelector": {"clever-cloud.com/cluster-node-role": "worker"},
                 "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "1"}}}]},
    }))
    .unwrap();
    let mut attempts = 0;
    loop {
        match w.pods("default").create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.is_already_exists() => break,
            Err(_) => {}
        }
        attempts += 1;
        assert!(attempts < 50, "could not create the pod through the faults");
    }

    w.until("accepted", SEC, || async { w.group("ng").await.filter(|g| g.is_accepted()) }).await;
    faults.drop_watches();
    w.until("node Ready", SEC, || async { w.node("ng-node0").await.filter(node_ready) }).await;
    faults.drop_watches();
    let pod = w
        .until("pod running", SEC, || async {
            let p = w.pods("default").get_opt("p").await.ok().flatten()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
        })
        .await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("ng-node0"));
    assert!(faults.injected_errors() > 0, "faults were injected");
    faults.clear();
    assert_eq!(w.node_names().await, ["control-plane-0", "control-plane-1", "ng-node0"], "no duplicate nodes");
    w.stop().await;
}

#[tokio::test]
async fn starts_up_through_failing_writes() {
    // Half the writes fail from the very start: installing the CRD and creating the control plane
    // are retried instead of stopping the simulator.
    let server =
        sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::new("flaky").with_seed(5)).await.unwrap();
    server.faults().set_error(ErrorFault {
        rate: 0.5,
        status: 503,
        verbs: ["create", "patch"].map(String::from).to_vec(),
        resources: Vec::new(),
    });
    let cke = sim::cke::SimCke::new(server.client(), SimCkeConfig::instant()).spawn();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(server.client());
    let deadline = tokio::time::Instant::now() + cke_support::WALL_TIMEOUT;
    loop {
        let ready = nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|n| {
                node_ready(n)
                    && n.status.as_ref().and_then(|s| s.capacity.as_ref()).is_some_and(|c| c.contains_key("cpu"))
            })
            .count();
        if ready == 2 {
            break;
        }
        assert!(!cke.is_finished(), "the simulator gave up");
        assert!(tokio::time::Instant::now() < deadline, "control plane never came up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.faults().injected_errors() > 0);
    cke.stop().await.unwrap();
    server.shutdown().await;
}
