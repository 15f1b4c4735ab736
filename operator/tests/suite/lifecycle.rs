//! The NodeClaim lifecycle's time-driven transitions end to end on the simulated world, with the
//! hub on a manual clock: the test moves time forward instead of waiting for it (karpenter-semantics
//! §6.4 registration timeout, §6.5 node repair and its 20 % cap; checklist §10.11 items 151, 154,
//! 155). The emulators and the simulated CKE keep the wall clock; the hub's clock starts at the
//! wall clock's now, so the timestamps they write stay comparable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::{NodeClaim, labels};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale};
use serde_json::json;
use sim::{
    cke::{DelayRange, SimCkeConfig},
    clock::Clock,
};

use crate::common;
use common::wait_for;

const UP: Duration = Duration::from_secs(90);
/// Shorter than a settled claim's periodic pass (a minute): what a wait this long sees was woken
/// by the change it waits for.
const SOON: Duration = Duration::from_secs(20);

async fn claim_events(world: &World, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(world.mgmt.client(), &world.clusters[0].namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

fn regarding(e: &Event) -> String {
    e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default()
}

/// §10.11 item 151: no Node 15 min after launch ⇒ the claim is deleted (`registration_timeout`),
/// measured on the hub's clock; one second earlier it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_node_never_registers_is_deleted_at_the_registration_timeout() {
    // CKE accepts the group but its node would take an hour of wall time to join.
    let never = |i: usize| SimCkeConfig {
        node_join_delay: DelayRange::fixed(Duration::from_secs(3600)),
        ..quick_cke(i as u64)
    };
    let mut world = World::start(&[("team-a", "no-join")], never).await.unwrap();
    let clock = Clock::manual_now();
    world.hub_settings.clock = clock.clone();
    common::apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let launched = || async {
        claims.list(&ListParams::default()).await.unwrap().items.into_iter().find(|c| {
            c.status.as_ref().is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Launched" && k.status == "True"))
        })
    };
    wait_for("the claim launched", UP, || async { launched().await.is_some() }).await;
    let first = launched().await.unwrap();
    // Just short of the timeout: re-decided (every claim is, when the clock moves) and kept.
    clock.advance(Duration::from_secs(15 * 60 - 5));
    common::wait_quiet("claims after 14m55s", UP, Duration::from_secs(2), || async {
        claims.list(&ListParams::default()).await.unwrap().items.len()
    })
    .await;
    assert!(claim_events(&world, "RegistrationTimeout").await.is_empty(), "deleted before the timeout");
    assert!(claims.get_opt(&first.name_any()).await.unwrap().is_some_and(|c| c.metadata.deletion_timestamp.is_none()));
    clock.advance(Duration::from_secs(10));
    wait_for("a RegistrationTimeout event on the claim", UP, || async {
        claim_events(&world, "RegistrationTimeout").await.iter().any(|e| regarding(e) == first.name_any())
    })
    .await;
    wait_for("the claim gone", UP, || async {
        claims.get_opt(&first.name_any()).await.unwrap().is_none_or(|c| c.uid() != first.uid())
    })
    .await;
    world.stop_hub().await;
}

/// Stop the simulated kubelet of `node` and report it `Ready=status` since `since` (RFC 3339).
async fn kubelet_reports(world: &World, node: &str, status: &str, since: &str) {
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    // Without the simulation's annotation the kubelet stand-in leaves the Node alone.
    let patch = json!({"metadata": {"annotations": {sim::cke::objects::SIMULATED_ANNOTATION: null}}});
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": "KubeletStopped", "message": "test",
        "lastHeartbeatTime": since, "lastTransitionTime": since,
    }]}});
    nodes.patch_status(node, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

/// §10.11 items 154 and 155: two nodes of a two-node pool NotReady for 30 min: more than
/// ceil(20 % × 2) = 1 unhealthy, so repair is blocked (`NodeRepairBlocked` on both, nothing
/// deleted). One recovers: the other is then repaired — termination deadline = now, the claim
/// deleted (`Unhealthy`), its node drained by force and gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_nodes_are_repaired_at_most_twenty_percent_of_a_pool_at_once() {
    let mut world = World::start(&[("team-a", "repair")], |i| quick_cke(i as u64)).await.unwrap();
    let clock = Clock::manual_now();
    world.hub_settings.clock = clock.clone();
    common::apply_example(&world, 0).await;
    world.start_hub();
    // Two pods that refuse to share a node: two claims, two nodes.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(world.clusters[0].client(), "default");
    for i in 0..2 {
        let mut pod = operator::commands::sandbox::world::workload_pod(&format!("web-{i}"), "500m", "1Gi");
        let spec = pod.spec.as_mut().unwrap();
        spec.affinity = Some(
            serde_json::from_value(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
            ]}}))
            .unwrap(),
        );
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let initialized = || async {
        let mut v: Vec<(String, String)> = claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Initialized" && k.status == "True"))
            })
            .map(|c| (c.name_any(), c.status.and_then(|s| s.node_name).unwrap_or_default()))
            .collect();
        v.sort();
        v
    };
    wait_for("two claims initialized", UP, || async { initialized().await.len() == 2 }).await;
    let both = initialized().await;
    let since = clock.now().to_rfc3339();
    // Both kubelets stop while the hub is down, so that it sees both NotReady at once in its first
    // list: a running hub could see the first node's report, and not yet the second's, when the
    // clock jumps past the toleration, and rightly repair the one unhealthy node it knows of.
    world.stop_hub().await;
    for (_, node) in &both {
        kubelet_reports(&world, node, "False", &since).await;
    }
    world.start_hub();
    clock.advance(Duration::from_secs(31 * 60));
    wait_for("NodeRepairBlocked on both claims", UP, || async {
        let blocked: Vec<String> = claim_events(&world, "NodeRepairBlocked").await.iter().map(regarding).collect();
        both.iter().all(|(claim, _)| blocked.contains(claim))
    })
    .await;
    // The blocked decision is the whole pass: nothing was deleted with it.
    for (claim, _) in &both {
        let c = claims.get(claim).await.unwrap();
        assert!(c.metadata.deletion_timestamp.is_none(), "{claim} deleted although repair was blocked");
    }
    assert!(claim_events(&world, "Unhealthy").await.is_empty());
    // The second node comes back: one unhealthy node of two is within the cap.
    let (repaired, node) = both[0].clone();
    kubelet_reports(&world, &both[1].1, "True", &clock.now().to_rfc3339()).await;
    wait_for("an Unhealthy event on the first claim", UP, || async {
        // A second a poll: a pass that ran before the hub's cache saw the recovery is decided again.
        clock.advance(Duration::from_secs(1));
        claim_events(&world, "Unhealthy").await.iter().any(|e| regarding(e) == repaired)
    })
    .await;
    let c = claims.get_opt(&repaired).await.unwrap();
    if let Some(c) = c {
        assert!(c.metadata.deletion_timestamp.is_some(), "the repaired claim is being deleted");
        assert!(c.annotations().contains_key(labels::TERMINATION_TIMESTAMP), "immediate forced termination");
    }
    assert!(claims.get(&both[1].0).await.unwrap().metadata.deletion_timestamp.is_none(), "the recovered node stays");
    // Its pod is deleted at once (the deadline is now); the dead kubelet never confirms it, so the
    // drain gives up on it after a minute of the hub's time. Move time along while waiting. (The
    // Node object stays: the simulated CKE removes only the Nodes it simulates, and this one's
    // kubelet was "stopped" by taking that mark away; its NodeGroup is what must go.)
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    let group = nodes.get(&node).await.unwrap().spec.and_then(|s| s.provider_id).unwrap();
    let group = group.trim_start_matches("clevercloud://").to_string();
    let groups: Api<crds::NodeGroup> = Api::all(world.clusters[0].client());
    let deadline = tokio::time::Instant::now() + UP;
    loop {
        clock.advance(Duration::from_secs(20));
        let c = claims.get_opt(&repaired).await.unwrap();
        let n = nodes.get_opt(&node).await.unwrap();
        let g = groups.get_opt(&group).await.unwrap();
        if c.is_none() && g.is_none() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let pods = pods.list(&ListParams::default()).await.unwrap().items;
            panic!(
                "the repaired claim and its node are not gone:\nclaim {}\nnode {}\npods {}",
                serde_json::to_string(&c.map(|c| (c.metadata, c.status))).unwrap(),
                serde_json::to_string(&n.map(|n| (n.metadata, n.spec))).unwrap(),
                serde_json::to_string(
                    &pods
                        .iter()
                        .map(|p| (
                            &p.metadata.name,
                            &p.metadata.deletion_timestamp,
                            p.spec.as_ref().and_then(|s| s.node_name.clone())
                        ))
                        .collect::<Vec<_>>()
                )
                .unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    world.stop_hub().await;
}

fn condition(claim: &NodeClaim, type_: &str) -> Option<(String, String)> {
    claim.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.clone(), c.reason.clone()))
}

/// §4.1 (issue 12 item 2) on the hub's manual clock: an initialized claim becomes `Consolidatable`
/// once `consolidateAfter` (10m) has passed since its pod was bound, not before; `Empty` once its
/// pod is gone; `Drifted(NodePoolDrifted)` once its NodePool's template changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shows_consolidatable_empty_and_drifted_as_its_pool_and_pods_change() {
    let clock = Clock::manual_now();
    let mut world = World::start_on(&[("team-a", "conditions")], |i| quick_cke(i as u64), clock.clone()).await.unwrap();
    let c = &world.clusters[0];
    let (name, ns) = (c.name.clone(), c.namespace.clone());
    world
        .apply_yaml("general-purpose.yaml", common::EXAMPLE, &ns, |doc| {
            if doc.get("kind").and_then(serde_json::Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = json!(name);
                doc["spec"]["disruption"]["consolidateAfter"] = json!("10m");
                // The conditions are this test's subject: a zero budget keeps the disruption loop
                // from acting on them (removing the empty or drifted node mid-test).
                doc["spec"]["disruption"]["budgets"] = json!([{"nodes": "0"}]);
            }
        })
        .await
        .unwrap();
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &ns);
    let first = || async {
        claims.list(&ListParams::default()).await.unwrap().items.into_iter().find(|c| {
            condition(c, "Initialized").is_some_and(|(s, _)| s == "True")
                && c.status.as_ref().is_some_and(|s| s.last_pod_event_time.is_some())
        })
    };
    wait_for("an initialized claim with its pod's event time", UP, || async {
        // Moving the hub's clock re-decides every claim at once; a second a poll stays far short of
        // consolidateAfter.
        clock.advance(Duration::from_secs(1));
        first().await.is_some()
    })
    .await;
    let claim = first().await.unwrap();
    assert_eq!(condition(&claim, "Consolidatable"), None, "not before consolidateAfter");
    assert_eq!(condition(&claim, "Empty"), None, "its pod is there");
    clock.advance(Duration::from_secs(11 * 60));
    let get = || async { claims.get(&claim.name_any()).await.unwrap() };
    wait_for("Consolidatable=True 10 min after the pod's binding", UP, || async {
        condition(&get().await, "Consolidatable") == Some(("True".into(), "Consolidatable".into()))
    })
    .await;
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), &ns);
    let relabel = json!({"spec": {"template": {"metadata": {"labels": {"team": "platform-2"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    wait_for(
        "Drifted=True(NodePoolDrifted) after a template change (the pool's change wakes its claims)",
        SOON,
        || async { condition(&get().await, "Drifted") == Some(("True".into(), "NodePoolDrifted".into())) },
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(world.clusters[0].client(), "default");
    pods.delete("web-0", &Default::default()).await.unwrap();
    wait_for("Empty=True once the pod is gone (a pod event)", SOON, || async {
        condition(&get().await, "Empty") == Some(("True".into(), "Empty".into()))
    })
    .await;
    world.stop_hub().await;
}
