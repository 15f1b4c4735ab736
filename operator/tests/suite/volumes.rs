//! The hub reads each workload cluster's storage objects (issue 28 item 4: PersistentVolumeClaims,
//! PersistentVolumes, StorageClasses, CSINodes) for provisioning and disruption; what they decide
//! with them is the middle tier's (`commands::plan::hub_agreement`: the hub and `plan` agree).
//! Here: a cluster whose identity was granted by an earlier release's `workload-rbac.yaml`, without
//! those kinds, is not refused as a whole — it connects, says what it may not read and how to fix
//! it, and its pods still get nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use operator::commands::sandbox::world::{World, apply_value, quick_cke, workload_pod};
use serde_json::{Value, json};

use crate::common::{
    apply_example, bound_token_kubeconfig, create_namespace, documents, pool_condition_true, wait_for,
};

/// `config/hub/workload-rbac.yaml` as releases before issue 28 had it: no storage kind listed or
/// watched, PersistentVolumes only read one by one (the drain's).
fn rbac_without_storage() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/hub/workload-rbac.yaml");
    documents(&path)
        .into_iter()
        .map(|mut d| {
            if d["kind"] == "ClusterRole" {
                let storage = ["persistentvolumeclaims", "storageclasses", "csinodes"];
                let mut rules: Vec<Value> = d["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|r| {
                        !r["resources"].as_array().unwrap().iter().any(|x| storage.contains(&x.as_str().unwrap()))
                    })
                    .cloned()
                    .collect();
                for r in &mut rules {
                    if r["resources"] == json!(["persistentvolumes"]) {
                        r["verbs"] = json!(["get"]);
                    }
                }
                d["rules"] = json!(rules);
            }
            d
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_without_the_storage_kinds_connects_says_so_and_still_provisions() {
    let mut world = World::start(&[("team-c", "gamma")], |i| quick_cke(i as u64)).await.unwrap();
    let c = &world.clusters[0];
    create_namespace(&c.client(), "karpenter-hub").await;
    for doc in rbac_without_storage() {
        apply_value(&c.client(), &doc, "karpenter-hub", "workload-rbac.yaml (without storage)").await.unwrap();
    }
    let kubeconfig = bound_token_kubeconfig(&c.server, "karpenter-hub", "karpenter-hub-workload").await;
    world.put_secret("team-c", "gamma", kubeconfig.as_bytes()).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();

    let reachable = || pool_condition_true(&world, "team-c", "default", "ClusterReachable");
    wait_for("gamma Connected", Duration::from_secs(60), || async { reachable().await.is_some() }).await;
    let message = reachable().await.unwrap().message;
    for kind in ["persistentvolumeclaims", "persistentvolumes", "storageclasses", "csinodes"] {
        assert!(message.contains(kind), "the refused kind {kind} is named: {message}");
    }
    assert!(message.contains("karpenter-hub register"), "the fix is named: {message}");
    assert!(!message.contains("forbidden"), "nothing the server wrote: {message}");

    let c = &world.clusters[0];
    let pods = Api::<Pod>::namespaced(c.client(), "default");
    pods.create(&PostParams::default(), &workload_pod("web-0", "500m", "1Gi")).await.unwrap();
    wait_for("the pod Running on a node the hub provisioned", Duration::from_secs(60), || async {
        pods.get("web-0").await.ok().and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    world.shutdown().await;
}
