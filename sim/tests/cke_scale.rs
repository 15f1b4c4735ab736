//! The simulated CKE at a thousand pods: every pod bound and Running within the wall-time bound,
//! with about one write per pod and purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::{Duration, Instant};

use cke_support::World;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use sim::cke::{SimCkeConfig, Usage};

#[tokio::test]
async fn a_thousand_pods_are_bound_and_run() {
    let mut config = SimCkeConfig::instant();
    config.quota.limit = Usage { vcpu: 10_000, ram_gb: 10_000 };
    let w = World::start(config).await;
    let group: crds::nodegroup::NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": "big"}, "spec": {"flavor": "XL", "nodeCount": 16},
    }))
    .unwrap();
    w.groups().create(&PostParams::default(), &group).await.unwrap();
    let started = Instant::now();
    let pods = w.pods("default");
    for i in 0..1000 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}"), "namespace": "default"},
            "spec": {"nodeSelector": {"clever-cloud.com/cluster-node-role": "worker"},
                     "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let created = started.elapsed();
    w.until("all running", Duration::ZERO, || async {
        let list = pods.list(&ListParams::default().fields("status.phase=Running")).await.ok()?;
        (list.items.len() == 1000).then_some(())
    })
    .await;
    eprintln!("1000 pods: created in {created:?}, all Running after {:?}", started.elapsed());
    // API efficiency: one binding per pod, about one status write per pod.
    let requests = w.server.requests();
    assert_eq!(requests.count("create", "pods/binding"), 1000);
    assert!(requests.count("patch", "pods/status") < 1100, "{:?}", requests.snapshot());
    assert_eq!(requests.count("create", "nodes"), 18, "two control-plane nodes and sixteen workers");
    w.stop().await;
}
