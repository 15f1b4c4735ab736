//! Static pools (issue 28 item 1, upstream's static capacity) on the simulated world: a NodePool
//! with `spec.replicas` keeps that many nodes with no pod asking for them; a pending pod gets no
//! node through it; scaling down deletes the surplus (empty nodes first), a claim deleted by hand
//! is replaced, and a crash never makes a second claim for a slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::{NodeClaim, NodeGroup, NodePool};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale};
use serde_json::{Value, json};

use crate::common::{apply_example_with, wait_for};

async fn live_claims(api: &Api<NodeClaim>) -> Vec<NodeClaim> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect()
}

async fn groups(world: &World) -> usize {
    Api::<NodeGroup>::all(world.clusters[0].client())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().filter(|g| g.metadata.deletion_timestamp.is_none()).count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_keeps_its_count_without_pods_scales_and_replaces_what_goes() {
    let mut world = World::start(&[("team-s", "static")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example_with(&world, 0, |spec| {
        spec.insert("replicas".to_string(), json!(2));
        spec.remove("limits");
        spec.insert("limits".to_string(), json!({"nodes": 3}));
        spec["template"]["spec"]["requirements"] =
            json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS", "XS"]}]);
    })
    .await;
    world.start_hub();
    let c = &world.clusters[0];
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &c.namespace);

    // No pod asks: two claims, the pool's cheapest flavor, each in a slot of its own; two groups.
    wait_for("two static claims and their NodeGroups", Duration::from_secs(60), || async {
        live_claims(&claims).await.len() == 2 && groups(&world).await == 2
    })
    .await;
    let made = live_claims(&claims).await;
    let mut slots: Vec<String> = made
        .iter()
        .map(|c| c.annotations().get("karpenter.clever-cloud.com/static-slot").cloned().unwrap_or_default())
        .collect();
    slots.sort();
    assert_eq!(slots, ["0", "1"]);
    // The pool's cheapest flavor that holds the cluster's DaemonSets.
    let flavors: Vec<String> = Api::<NodeGroup>::all(world.clusters[0].client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|g| g.spec.flavor.clone())
        .collect();
    assert_eq!(flavors, ["2XS", "2XS"]);

    // A pending pod too big for the pool's 2XS nodes, which an XS of the pool would hold, gets no
    // node from it: the only pool is static, so it waits.
    scale(&world, 0, 1, "5", "512Mi").await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(live_claims(&claims).await.len(), 2, "no claim for a pending pod through a static pool");

    // A claim deleted by hand is replaced (in a free slot).
    let victim = made[0].name_any();
    claims.delete(&victim, &DeleteParams::default()).await.unwrap();
    wait_for("the deleted claim replaced", Duration::from_secs(60), || async {
        let live = live_claims(&claims).await;
        live.len() == 2 && live.iter().all(|c| c.name_any() != victim)
    })
    .await;

    // Scaled down to one: one goes; up to five: limits.nodes (3) caps it.
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), &c.namespace);
    let patch = |n: i64| -> Value { json!({"spec": {"replicas": n}}) };
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&patch(1))).await.unwrap();
    wait_for("one static claim left", Duration::from_secs(60), || async { live_claims(&claims).await.len() == 1 })
        .await;
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&patch(5))).await.unwrap();
    wait_for("three claims: limits.nodes", Duration::from_secs(60), || async { live_claims(&claims).await.len() == 3 })
        .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let all = claims.list(&ListParams::default()).await.unwrap().items;
    let seen: Vec<String> = all
        .iter()
        .map(|c| {
            format!(
                "{} del={:?} {:?}",
                c.name_any(),
                c.metadata.deletion_timestamp.is_some(),
                c.status.as_ref().map(|s| s
                    .conditions
                    .iter()
                    .map(|k| format!("{}={}:{}", k.type_, k.status, k.reason))
                    .collect::<Vec<_>>())
            )
        })
        .collect();
    assert_eq!(live_claims(&claims).await.len(), 3, "never above limits.nodes: {seen:#?}");

    // A restart changes nothing: the count is kept, no slot gets a second claim.
    world.stop_hub().await;
    world.start_hub();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let live = live_claims(&claims).await;
    assert_eq!(live.len(), 3);
    let mut slots: Vec<String> = live
        .iter()
        .map(|c| c.annotations().get("karpenter.clever-cloud.com/static-slot").cloned().unwrap_or_default())
        .collect();
    slots.sort();
    slots.dedup();
    assert!(!slots.contains(&String::new()), "only the static pool's own claims: {slots:?}");
    assert_eq!(slots.len(), 3, "one claim per slot");
    world.shutdown().await;
}

/// A static pool whose template changes: its nodes drift, and each is replaced one at a time, the
/// replacement first — the pool never has fewer live nodes than its count, nor more than one
/// above it, and ends with its count of nodes of the new template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_replaces_its_drifted_nodes_one_at_a_time_replacement_first() {
    let mut world = World::start(&[("team-d", "drift")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example_with(&world, 0, |spec| {
        spec.insert("replicas".to_string(), json!(2));
        spec.remove("limits");
        spec["template"]["spec"]["requirements"] =
            json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS"]}]);
    })
    .await;
    world.start_hub();
    let c = &world.clusters[0];
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &c.namespace);
    let initialized = |c: &NodeClaim| {
        c.status.as_ref().is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Initialized" && k.status == "True"))
    };
    wait_for("two initialized static claims", Duration::from_secs(60), || async {
        let live = live_claims(&claims).await;
        live.len() == 2 && live.iter().all(initialized)
    })
    .await;
    let first: Vec<String> = live_claims(&claims).await.iter().map(ResourceExt::name_any).collect();

    // A template label: a new drift hash for the pool, both nodes drifted.
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), &c.namespace);
    let patch = json!({"spec": {"template": {"metadata": {"labels": {"revision": "2"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut most = 0;
    loop {
        let live = live_claims(&claims).await;
        most = most.max(live.len());
        let serving = live.iter().filter(|c| initialized(c)).count();
        assert!(
            live.len() <= 3,
            "at most one replacement at a time: {:?}",
            live.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
        );
        assert!(serving >= 2 || live.len() > 2, "a drifted node left before its replacement was up");
        let replaced = live.len() == 2 && live.iter().all(|c| !first.contains(&c.name_any()) && initialized(c));
        if replaced {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the drifted nodes were not replaced within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(most, 3, "each replacement came before the node it replaced went");
    for claim in live_claims(&claims).await {
        assert_eq!(claim.labels().get("revision").map(String::as_str), Some("2"), "the new template");
    }
    world.shutdown().await;
}
