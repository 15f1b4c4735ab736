//! The hub end to end on the simulated world: a management emulator, workload emulators played by
//! the simulated CKE, clusters registered through kubeconfig Secrets, the real hub running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, time::Duration};

use crds::{NodeClaim, NodeGroup, NodePool};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::ListParams};
use operator::sandbox::{World, quick_cke, scale};
use serde_json::Value;

const EXAMPLE: &str = include_str!("../../examples/general-purpose.yaml");

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn apply_example(world: &World, i: usize) {
    let c = &world.clusters[i];
    let name = c.name.clone();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(name.clone());
            }
        })
        .await
        .unwrap();
}

async fn running(world: &World, i: usize) -> usize {
    Api::<Pod>::namespaced(world.clusters[i].client(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clusters_get_the_cheapest_fitting_nodes_and_one_nodegroup_per_claim() {
    let mut world =
        World::start(&[("team-a", "alpha"), ("team-b", "beta"), ("team-c", "gamma")], |i| quick_cke(i as u64))
            .await
            .unwrap();
    for i in 0..3 {
        apply_example(&world, i).await;
    }
    world.start_hub();
    // alpha: 4 × (1 CPU, 1Gi) fit one XS (4Gi > a 2XS's 3.63Gi); beta: one 5Gi pod also needs an XS;
    // gamma: one small pod fits a 2XS.
    scale(&world, 0, 4, "1", "1Gi").await.unwrap();
    scale(&world, 1, 1, "500m", "5Gi").await.unwrap();
    scale(&world, 2, 1, "500m", "1Gi").await.unwrap();
    for (i, want) in [(0, 4), (1, 1), (2, 1)] {
        wait_for("pods running", Duration::from_secs(60), || async { running(&world, i).await == want }).await;
    }
    for (i, flavor) in [(0, "XS"), (1, "XS"), (2, "2XS")] {
        let c = &world.clusters[i];
        let groups = Api::<NodeGroup>::all(c.client()).list(&ListParams::default()).await.unwrap().items;
        let claims: Vec<NodeClaim> = Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert_eq!(groups.len(), 1, "{}: exactly one NodeGroup, nothing else created", c.name);
        assert_eq!(claims.len(), 1, "{}: exactly one NodeClaim", c.name);
        assert_eq!(groups[0].spec.flavor, flavor, "{}", c.name);
        assert_eq!(groups[0].spec.node_count, 1);
        let provider = claims[0].status.as_ref().and_then(|s| s.provider_id.clone()).unwrap();
        assert_eq!(provider, format!("clevercloud://{}", groups[0].name_any()));
        let labels = groups[0].labels();
        assert_eq!(labels.get("karpenter.clever-cloud.com/nodeclaim"), Some(&claims[0].name_any()));
        assert_eq!(labels.get("karpenter.clever-cloud.com/nodeclaim-namespace"), Some(&c.namespace));
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_an_exec_plugin_is_refused_and_reported_on_the_nodepool() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    let hostile = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'touch /tmp/pwned']\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        world.clusters[0].server.url()
    );
    world.put_secret("team-a", "alpha", hostile.as_bytes()).await.unwrap();
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    wait_for("ClusterReachable=False/InvalidKubeconfig", Duration::from_secs(30), || async {
        pools.get("default").await.ok().and_then(|p| p.status).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "ClusterReachable" && c.status == "False" && c.reason == "InvalidKubeconfig")
        })
    })
    .await;
    let pool = pools.get("default").await.unwrap();
    let cond = pool.status.unwrap().conditions.into_iter().find(|c| c.type_ == "ClusterReachable").unwrap();
    assert!(cond.message.contains("exec"), "{}", cond.message);
    assert!(!std::path::Path::new("/tmp/pwned").exists(), "the plugin must never run");
    // Nothing is provisioned for a cluster the hub cannot trust.
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert!(groups.items.is_empty());
    // Fixing the Secret connects the cluster and provisioning proceeds.
    world.register(0).await.unwrap();
    wait_for("pod running after the fix", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_launch_leaves_no_duplicate_and_no_leak() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 3, "1", "1Gi").await.unwrap();
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    wait_for("a NodeGroup", Duration::from_secs(30), || async {
        groups.list(&ListParams::default()).await.is_ok_and(|l| !l.items.is_empty())
    })
    .await;
    world.crash_hub().await;
    world.start_hub();
    wait_for("pods running after the restart", Duration::from_secs(60), || async { running(&world, 0).await == 3 })
        .await;
    let groups = groups.list(&ListParams::default()).await.unwrap().items;
    let claims =
        Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap().items;
    let claim_names: BTreeSet<String> = claims.iter().map(ResourceExt::name_any).collect();
    assert_eq!(groups.len(), claims.len(), "one NodeGroup per NodeClaim");
    for g in &groups {
        let owner = g.labels().get("karpenter.clever-cloud.com/nodeclaim").cloned().unwrap_or_default();
        assert!(claim_names.contains(&owner), "NodeGroup {} has no NodeClaim (leak)", g.name_any());
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_kubeconfig_secret_stops_the_cluster_but_deletes_nothing() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(world.mgmt.client(), "team-a");
    secrets.delete("alpha-kubeconfig", &Default::default()).await.unwrap();
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    wait_for("ClusterReachable=False/SecretMissing", Duration::from_secs(30), || async {
        pools.get("default").await.ok().and_then(|p| p.status).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "ClusterReachable" && c.status == "False" && c.reason == "SecretMissing")
        })
    })
    .await;
    // No mass deletion because a Secret vanished: the claim and its NodeGroup stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let claims =
        Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap();
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert_eq!(claims.items.len(), 1);
    assert!(claims.items[0].metadata.deletion_timestamp.is_none());
    assert_eq!(groups.items.len(), 1);
    assert!(groups.items[0].metadata.deletion_timestamp.is_none());
    world.shutdown().await;
}
