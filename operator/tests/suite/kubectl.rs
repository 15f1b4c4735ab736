//! What `kubectl` shows a person, run for real against a real kube-apiserver (envtest; a visible
//! skip without `KUBEBUILDER_ASSETS`) holding the hub's CRDs and objects whose status is written
//! the way the hub writes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use crds::NodePool;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::common;

/// `kubectl <args>` printing a table: one map per row, column name → cell ("" when empty). Cells
/// are cut at the header's column offsets, as kubectl aligns them (an empty cell prints nothing).
fn kubectl_table(kubeconfig: &std::path::Path, args: &[&str]) -> Vec<std::collections::BTreeMap<String, String>> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl (it must be on PATH for this test): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "kubectl {args:?}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    eprintln!("kubectl {}\n{stdout}", args.join(" "));
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts: Vec<(usize, String)> = Vec::new();
    for (i, c) in header.char_indices() {
        if c != ' ' && (i == 0 || header[..i].ends_with(' ')) {
            let name: String = header[i..].chars().take_while(|c| *c != ' ').collect();
            starts.push((i, name));
        }
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(k, (start, name))| {
                    let end = starts.get(k + 1).map_or(line.len(), |(s, _)| (*s).min(line.len()));
                    (name.clone(), line.get((*start).min(line.len())..end).unwrap_or_default().trim().to_string())
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_nodepools_shows_the_nodes_and_resources_the_hub_writes_on_a_real_api_server() {
    let cp = envtest::shared_or_skip!("kubectl");
    let client = cp.client().await.unwrap();
    common::install_hub_crds(&client).await;
    let ns = format!("kubectl-{}", std::process::id());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();

    let pools: Api<NodePool> = Api::namespaced(client.clone(), &ns);
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "default"},
        "spec": {
            "clusterName": "prod-paris",
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": [],
            }},
        },
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    // The status exactly as the hub's NodePool controller writes it (operator/src/controllers/nodepool.rs): two
    // nodes, their summed capacity as a resource list.
    let mut total = crds::quantity::Resources::ZERO;
    total.cpu_millis = 4000;
    total.memory_bytes = 8 << 30;
    total.pods = 220;
    let status = json!({"status": {"nodes": 2, "resources": total.to_resource_list()}});
    pools.patch_status("default", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let table = kubectl_table(cp.kubeconfig_path(), &["get", "nodepools", "-n", &ns]);
    assert_eq!(table.len(), 1, "{table:?}");
    let row = &table[0];
    assert_eq!(row["NAME"], "default");
    assert_eq!(row["CLUSTER"], "prod-paris");
    assert_eq!(row["NODES"], "2", "{row:?}");
    assert_eq!(row["CPU"], "4", "{row:?}");
    assert_eq!(row["MEMORY"], "8Gi", "{row:?}");
    let _ = Api::<Namespace>::all(client).delete(&ns, &Default::default()).await;
}

/// Issue 28 item 1's leftover: `kubectl scale nodepool` sets a static pool's `spec.replicas`
/// through the scale subresource (reporting `status.nodes`), and a dynamic pool refuses it by its
/// replicas rule, on a real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_sets_a_static_pools_replicas_and_a_dynamic_pool_refuses_it() {
    let cp = envtest::shared_or_skip!("kubectl");
    let client = cp.client().await.unwrap();
    common::install_hub_crds(&client).await;
    let ns = format!("kubectl-scale-{}", std::process::id());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let pools: Api<NodePool> = Api::namespaced(client.clone(), &ns);
    let pool = |name: &str, replicas: Option<i64>| -> NodePool {
        let mut spec = json!({
            "clusterName": "prod-paris",
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
                "requirements": [],
            }},
        });
        if let Some(r) = replicas {
            spec["replicas"] = json!(r);
        }
        serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    };
    pools.create(&PostParams::default(), &pool("ingress", Some(3))).await.unwrap();
    pools.create(&PostParams::default(), &pool("default", None)).await.unwrap();
    pools
        .patch_status("ingress", &PatchParams::default(), &Patch::Merge(&json!({"status": {"nodes": 3}})))
        .await
        .unwrap();
    let kubectl = |args: &[&str]| {
        Command::new("kubectl").arg("--kubeconfig").arg(cp.kubeconfig_path()).args(args).output().unwrap()
    };
    let scaled = kubectl(&["scale", "nodepool", "ingress", "--replicas=5", "-n", &ns]);
    assert!(scaled.status.success(), "{}", String::from_utf8_lossy(&scaled.stderr));
    assert_eq!(pools.get("ingress").await.unwrap().spec.replicas, Some(5));
    let scale = kubectl(&[
        "get",
        "nodepool",
        "ingress",
        "-n",
        &ns,
        "--subresource=scale",
        "-o",
        "jsonpath={.spec.replicas}/{.status.replicas}",
    ]);
    assert_eq!(String::from_utf8_lossy(&scale.stdout), "5/3", "{}", String::from_utf8_lossy(&scale.stderr));
    let refused = kubectl(&["scale", "nodepool", "default", "--replicas=2", "-n", &ns]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a dynamic pool took replicas");
    assert!(stderr.contains("replicas cannot be added or removed") || stderr.contains("spec.replicas"), "{stderr}");
    assert_eq!(pools.get("default").await.unwrap().spec.replicas, None);
    let _ = Api::<Namespace>::all(client).delete(&ns, &Default::default()).await;
}
