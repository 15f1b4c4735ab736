//! The disruption scenarios of clever-cloud.md §9 end to end on the simulated world (issue 12 item
//! 7): the real hub, on a manual clock the test moves past `consolidateAfter` and the validation
//! delay instead of waiting for them, against a management emulator and simulated CKE clusters.
//! Each scenario is judged on what the API shows: which NodeClaims and NodeGroups go, that
//! replacements are initialized before anything is deleted, and what the hub says (events,
//! metrics) — and, where nothing may happen, that nothing does once the hub has passed by.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::{NodeClaim, NodeGroup, labels};
use k8s_openapi::api::{core::v1::Pod, events::v1::Event};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke, workload_pod};
use serde_json::{Value, json};
use sim::clock::Clock;

use crate::common;
use common::{EXAMPLE, metric, wait_for, wait_quiet_over};

/// Pending pod → Running on a new node takes a few seconds with `quick_cke`; the bound only
/// matters on a loaded machine.
pub(crate) const UP: Duration = Duration::from_secs(90);

pub(crate) async fn world(cluster: &str, edit: impl Fn(&mut Value)) -> (World, Clock) {
    world_with(cluster, quick_cke(0), edit).await
}

pub(crate) async fn world_with(
    cluster: &str,
    cke: sim::cke::SimCkeConfig,
    edit: impl Fn(&mut Value),
) -> (World, Clock) {
    let clock = Clock::manual_now();
    let mut world = World::start_on(&[("team", cluster)], |_| cke.clone(), clock.clone()).await.unwrap();
    let name = cluster.to_string();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, "team", |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = json!(name);
                doc["spec"].as_object_mut().unwrap().remove("limits");
                edit(doc);
            }
        })
        .await
        .unwrap();
    world.start_hub();
    (world, clock)
}

pub(crate) async fn create(world: &World, pods: &[(&str, &str, &str)], extra: Value) {
    let api: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    for (name, cpu, memory) in pods {
        let mut v = serde_json::to_value(workload_pod(name, cpu, memory)).unwrap();
        if let Some(annotations) = extra.get("annotations") {
            v["metadata"]["annotations"] = annotations.clone();
        }
        if let Some(affinity) = extra.get("affinity") {
            v["spec"]["affinity"] = affinity.clone();
        }
        api.create(&PostParams::default(), &serde_json::from_value(v).unwrap()).await.unwrap();
    }
}

async fn delete_pod(world: &World, name: &str) {
    let api: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

pub(crate) async fn claims(world: &World) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(world.mgmt.client(), "team").list(&ListParams::default()).await.unwrap().items
}

async fn groups(world: &World) -> Vec<NodeGroup> {
    Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap().items
}

pub(crate) async fn running(world: &World) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

pub(crate) fn is_true(claim: &NodeClaim, type_: &str) -> bool {
    claim.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn flavor(claim: &NodeClaim) -> String {
    claim.labels().get(labels::INSTANCE_TYPE).cloned().unwrap_or_default()
}

async fn events(world: &World, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(world.mgmt.client(), "team");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| format!("{}: {}", e.regarding.and_then(|r| r.name).unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Moves the hub's clock forward a little at a time (each step wakes the lifecycle and the
/// disruption loop) until `check` holds; panics naming `what` after `timeout` of real time.
pub(crate) async fn advance_until<F, Fut>(clock: &Clock, what: &str, step: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for(what, UP, || {
        clock.advance(step);
        check()
    })
    .await;
}

/// The disruption loop's passes over cluster 0 so far.
fn passes(world: &World) -> u64 {
    // Every pass, whether it built the view or kept the last verdict (nothing it reads changed).
    let cluster = world.clusters[0].key().to_string();
    metric(world, "karpenter_hub_disruption_views_total", &[("cluster", &cluster)]) as u64
}

/// Which claims exist and which are being deleted, once the loop has made `passes` passes (the
/// hub's clock moved 5 s before each look) without any change: the negative a test then asserts.
pub(crate) async fn quiet_claims(world: &World, clock: &Clock, what: &str, steps: u64) -> Vec<(String, bool)> {
    wait_quiet_over(
        what,
        UP,
        steps,
        || async {
            claims(world).await.iter().map(|c| (c.name_any(), c.metadata.deletion_timestamp.is_some())).collect()
        },
        || async {
            clock.advance(Duration::from_secs(5));
            passes(world)
        },
    )
    .await
}

/// `pods` pods running on `count` claims, every one initialized.
pub(crate) async fn running_on(world: &World, pods: usize, count: usize) {
    let what = format!("{pods} pods running on {count} initialized claims");
    wait_for(&what, UP, || async {
        let cs = claims(world).await;
        running(world).await.len() == pods && cs.len() == count && cs.iter().all(|c| is_true(c, "Initialized"))
    })
    .await;
}

/// Deletes `pods`, then moves the hub's clock a second at a time (the pods' end is a pod event,
/// written at most every 10 s) until the `count` claims all show `Empty=True`.
async fn empty(world: &World, clock: &Clock, pods: &[&str], count: usize) {
    for pod in pods {
        delete_pod(world, pod).await;
    }
    wait_for(&format!("{count} claims Empty"), UP, || async {
        clock.advance(Duration::from_secs(1));
        let cs = claims(world).await;
        cs.len() == count && cs.iter().all(|c| is_true(c, "Empty"))
    })
    .await;
}

/// One initialized claim holding `pods` running pods; returns it.
async fn settled(world: &World, pods: usize) -> NodeClaim {
    running_on(world, pods, 1).await;
    claims(world).await.into_iter().next().unwrap()
}

/// Emptiness (§4.6, clever-cloud.md §9 scale to zero): once its pods are gone and `consolidateAfter`
/// (30 s) has passed, an empty node is deleted after the 15 s validation delay — its NodeClaim and
/// NodeGroup go, nothing is launched in its place, and the decision is counted and told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_node_goes_after_consolidate_after_and_the_validation_delay() {
    let (world, clock) = world("empty", |_| {}).await;
    create(&world, &[("web-0", "500m", "1Gi"), ("web-1", "500m", "1Gi")], json!({})).await;
    let claim = settled(&world, 2).await;
    empty(&world, &clock, &["web-0", "web-1"], 1).await;
    advance_until(&clock, "the empty claim deleted and its NodeGroup gone", Duration::from_secs(5), || async {
        claims(&world).await.is_empty() && groups(&world).await.is_empty()
    })
    .await;
    let cluster = world.clusters[0].key().to_string();
    assert_eq!(
        metric(
            &world,
            "karpenter_voluntary_disruption_decisions_total",
            &[("cluster", &cluster), ("decision", "delete"), ("reason", "empty")]
        ),
        1.0
    );
    assert_eq!(
        metric(&world, "karpenter_nodeclaims_disrupted_total", &[("cluster", &cluster), ("reason", "empty")]),
        1.0
    );
    let launching = events(&world, "DisruptionLaunching").await;
    assert!(launching.iter().any(|e| e.starts_with(&claim.name_any()) && e.contains("emptiness")), "{launching:?}");
    world.shutdown().await;
}

/// Consolidation-replace (§4.9, §4.13): a node left with one small pod is replaced by a cheaper one;
/// the replacement is initialized before the old claim is deleted, the pod is evicted through the
/// drain and its replacement pod lands on the new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_under_used_node_is_replaced_by_a_cheaper_one_launched_first() {
    let (world, clock) = world("replace", |_| {}).await;
    create(&world, &[("big", "4", "5Gi"), ("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 2).await;
    assert_eq!(flavor(&old), "XS", "the two pods need an XS");
    delete_pod(&world, "big").await;
    // The claim's replacement: a 2XS (0.0333 EUR/h) for the XS (0.0611), 45 % cheaper.
    advance_until(&clock, "a replacement claim", Duration::from_secs(5), || async { claims(&world).await.len() == 2 })
        .await;
    let replacement = claims(&world).await.into_iter().find(|c| c.name_any() != old.name_any()).unwrap();
    assert!(replacement.annotations().contains_key("karpenter.clever-cloud.com/disruption-replacement-for"));
    wait_for("the old claim deleted only after the replacement is initialized", UP, || async {
        // The drain's settle time runs on the hub's clock.
        clock.advance(Duration::from_secs(1));
        let cs = claims(&world).await;
        let old_now = cs.iter().find(|c| c.name_any() == old.name_any());
        let new_now = cs.iter().find(|c| c.name_any() == replacement.name_any());
        if old_now.is_some_and(|c| c.metadata.deletion_timestamp.is_some()) {
            assert!(new_now.is_some_and(|c| is_true(c, "Initialized")), "deleted before its replacement initialized");
        }
        old_now.is_none()
    })
    .await;
    let cs = claims(&world).await;
    assert_eq!(cs.len(), 1);
    assert_eq!(flavor(&cs[0]), "2XS");
    // The evicted pod, recreated as its ReplicaSet would, runs on the new node.
    create(&world, &[("web-0", "500m", "1Gi")], json!({})).await;
    wait_for("web-0 running on the 2XS", UP, || async {
        running(&world).await.iter().any(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                == cs[0].status.as_ref().and_then(|s| s.node_name.as_deref())
        })
    })
    .await;
    wait_for("one NodeGroup left", UP, || async { groups(&world).await.len() == 1 }).await;
    let cluster = world.clusters[0].key().to_string();
    assert_eq!(
        metric(
            &world,
            "karpenter_voluntary_disruption_decisions_total",
            &[("cluster", &cluster), ("decision", "replace"), ("reason", "underutilized")]
        ),
        1.0
    );
    world.shutdown().await;
}

/// Drift (§4.7): a NodePool template change drifts its claim; a replacement is launched first (no
/// validation delay) and the drifted claim goes once it is initialized. A hub crash in the middle
/// of the command neither loses nor repeats it: one replacement, the old claim deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_node_is_replaced_and_a_restart_mid_command_neither_loses_nor_repeats_it() {
    let (mut world, clock) = world("drift", |_| {}).await;
    create(&world, &[("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 1).await;
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), "team");
    let relabel = json!({"spec": {"template": {"metadata": {"labels": {"team": "platform-2"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    advance_until(&clock, "a replacement for the drifted claim", Duration::from_secs(1), || async {
        claims(&world).await.len() == 2
    })
    .await;
    world.crash_hub().await;
    world.start_hub();
    wait_for("the drifted claim gone, its replacement initialized", UP, || async {
        clock.advance(Duration::from_secs(1));
        let cs = claims(&world).await;
        cs.len() == 1 && cs[0].name_any() != old.name_any() && is_true(&cs[0], "Initialized")
    })
    .await;
    let cs = claims(&world).await;
    assert_eq!(cs[0].labels().get("team").map(String::as_str), Some("platform-2"), "launched from the new template");
    wait_for("one NodeGroup: the replacement's", UP, || async { groups(&world).await.len() == 1 }).await;
    world.shutdown().await;
}

/// Budgets and do-not-disrupt (§4.3, §4.5): a pool whose budget allows no disruption keeps its empty
/// node, and a node running a `karpenter.sh/do-not-disrupt` pod is reported blocked and kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_budget_and_a_do_not_disrupt_pod_keep_their_nodes() {
    let (world, clock) = world("blocked", |pool| {
        pool["spec"]["disruption"]["budgets"] = json!([{"nodes": "0", "reasons": ["Empty"]}]);
    })
    .await;
    create(&world, &[("big", "4", "5Gi")], json!({})).await;
    create(&world, &[("web-0", "500m", "1Gi")], json!({"annotations": {labels::DO_NOT_DISRUPT: "true"}})).await;
    let claim = settled(&world, 2).await;
    advance_until(&clock, "DisruptionBlocked naming the do-not-disrupt pod", Duration::from_secs(5), || async {
        events(&world, "DisruptionBlocked")
            .await
            .iter()
            .any(|e| e.starts_with(&claim.name_any()) && e.contains("web-0"))
    })
    .await;
    // Both pods gone: the node is empty, and the budget forbids emptiness.
    empty(&world, &clock, &["big", "web-0"], 1).await;
    let cluster = world.clusters[0].key().to_string();
    // Past consolidateAfter and the validation delay (12 passes, 5 s apart), nothing changes.
    let quiet = quiet_claims(&world, &clock, "the empty node under a zero budget", 12).await;
    assert_eq!(quiet, [(claim.name_any(), false)], "the empty node stays under a zero budget");
    wait_for("the budget gauge at 0 for Empty", UP, || async {
        metric(&world, "karpenter_nodepools_allowed_disruptions", &[("cluster", &cluster), ("reason", "empty")]) == 0.0
            && metric(
                &world,
                "karpenter_voluntary_disruption_eligible_nodes",
                &[("cluster", &cluster), ("reason", "empty")],
            ) == 1.0
    })
    .await;
    wait_for("DisruptionBlocked on the NodePool naming the spent budget", UP, || async {
        events(&world, "DisruptionBlocked").await.iter().any(|e| e.starts_with("default:") && e.contains("Empty"))
    })
    .await;
    let cs = claims(&world).await;
    assert_eq!(cs.len(), 1, "the empty node stays under a zero budget");
    assert!(cs[0].metadata.deletion_timestamp.is_none());
    assert_eq!(
        metric(&world, "karpenter_voluntary_disruption_decisions_total", &[("cluster", &cluster)]),
        0.0,
        "no decision"
    );
    world.shutdown().await;
}

/// Drift of the node class (§4.1, the provider's drift): a label change on the `CleverNodeClass`
/// drifts its claims (`NodeClassDrifted`) and each is replaced by a node carrying the new label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_class_label_change_drifts_its_nodes_and_they_are_replaced() {
    let (world, clock) = world("class-drift", |_| {}).await;
    create(&world, &[("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 1).await;
    let classes: Api<crds::CleverNodeClass> = Api::namespaced(world.mgmt.client(), "team");
    let relabel = json!({"spec": {"labels": {"team": "platform-2"}}});
    classes.patch("default", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    advance_until(&clock, "Drifted=True(NodeClassDrifted) on the claim", Duration::from_secs(1), || async {
        claims(&world).await.iter().any(|c| {
            c.name_any() == old.name_any()
                && c.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|k| k.type_ == "Drifted" && k.status == "True" && k.reason == "NodeClassDrifted")
                })
        }) || claims(&world).await.len() == 2
    })
    .await;
    advance_until(&clock, "the drifted claim replaced", Duration::from_secs(1), || async {
        let cs = claims(&world).await;
        cs.len() == 1 && cs[0].name_any() != old.name_any() && is_true(&cs[0], "Initialized")
    })
    .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.clusters[0].client());
    let node_name = claims(&world).await[0].status.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let node = nodes.get(&node_name).await.unwrap();
    assert_eq!(node.labels().get("team").map(String::as_str), Some("platform-2"), "the new node has the new label");
    world.shutdown().await;
}

/// A PodDisruptionBudget allowing no disruption (§4.3): the under-used node is reported blocked and
/// kept; once the budget allows one, the node is replaced by a cheaper one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_that_allows_nothing_blocks_consolidation_until_it_allows_one() {
    let (world, clock) = world("pdb", |_| {}).await;
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(world.clusters[0].client(), "default");
    let pdb = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    create(&world, &[("big", "4", "5Gi"), ("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 2).await;
    // `big` carries the app label too: remove it, leaving web-0 alone under minAvailable 1.
    delete_pod(&world, "big").await;
    advance_until(&clock, "DisruptionBlocked naming the PodDisruptionBudget", Duration::from_secs(5), || async {
        events(&world, "DisruptionBlocked").await.iter().any(|e| e.starts_with(&old.name_any()) && e.contains("web"))
    })
    .await;
    assert_eq!(claims(&world).await.len(), 1, "no replacement while the budget allows nothing");
    let relax = json!({"spec": {"minAvailable": 0}});
    pdbs.patch("web", &PatchParams::default(), &Patch::Merge(&relax)).await.unwrap();
    advance_until(&clock, "the node replaced once the PDB allows it", Duration::from_secs(2), || async {
        let cs = claims(&world).await;
        cs.len() == 1 && cs[0].name_any() != old.name_any() && is_true(&cs[0], "Initialized")
    })
    .await;
    assert_eq!(flavor(&claims(&world).await[0]), "2XS");
    world.shutdown().await;
}

/// Budgets at runtime (§4.5): a cron window that allows nothing keeps two empty nodes; once only
/// `50%` is left, they go one at a time — never both being deleted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_window_forbids_and_a_percentage_paces_the_removal_of_empty_nodes() {
    let (world, clock) = world("budgets", |pool| {
        pool["spec"]["disruption"]["budgets"] =
            json!([{"nodes": "50%"}, {"nodes": "0", "schedule": "0 0 * * *", "duration": "24h"}]);
    })
    .await;
    let apart = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": labels::HOSTNAME, "labelSelector": {"matchLabels": {"app": "web"}}}
    ]}}});
    create(&world, &[("web-0", "500m", "1Gi"), ("web-1", "500m", "1Gi")], apart).await;
    running_on(&world, 2, 2).await;
    empty(&world, &clock, &["web-0", "web-1"], 2).await;
    let cluster = world.clusters[0].key().to_string();
    // The window is open all day: past consolidateAfter and the validation delay, nothing goes.
    wait_for("the loop seeing both empty nodes with no budget", UP, || async {
        clock.advance(Duration::from_secs(5));
        metric(&world, "karpenter_voluntary_disruption_eligible_nodes", &[("cluster", &cluster), ("reason", "empty")])
            == 2.0
            && metric(&world, "karpenter_nodepools_allowed_disruptions", &[("cluster", &cluster), ("reason", "empty")])
                == 0.0
    })
    .await;
    let quiet = quiet_claims(&world, &clock, "two empty nodes in a window that allows nothing", 12).await;
    assert!(quiet.len() == 2 && quiet.iter().all(|(_, deleting)| !deleting), "the window forbids: {quiet:?}");
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), "team");
    let open = json!({"spec": {"disruption": {"budgets": [{"nodes": "50%"}]}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&open)).await.unwrap();
    let most_at_once = std::cell::Cell::new(0);
    advance_until(&clock, "both empty nodes gone, one at a time", Duration::from_secs(2), || async {
        let cs = claims(&world).await;
        let deleting = cs.iter().filter(|c| c.metadata.deletion_timestamp.is_some()).count();
        most_at_once.set(most_at_once.get().max(deleting));
        cs.is_empty()
    })
    .await;
    assert_eq!(most_at_once.get(), 1, "50% of two nodes: one at a time");
    world.shutdown().await;
}

/// A replacement that fails (§4.13): CKE refuses its flavor for the organisation's quota, the claim
/// goes, and the command is rolled back — the candidate keeps running, untainted, without its
/// record, and the failure is counted and told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_refused_by_the_quota_rolls_the_command_back() {
    // 24 GB of control plane + an XS (8) leave no room for the 2XS (4) under a 32 GB quota.
    let mut cke = quick_cke(0);
    cke.quota.limit = sim::cke::Usage { vcpu: 40, ram_gb: 32 };
    let (world, clock) = world_with("rollback", cke, |_| {}).await;
    create(&world, &[("big", "4", "5Gi"), ("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 2).await;
    delete_pod(&world, "big").await;
    advance_until(&clock, "DisruptionRolledBack on the candidate", Duration::from_secs(5), || async {
        events(&world, "DisruptionRolledBack").await.iter().any(|e| e.starts_with(&old.name_any()))
    })
    .await;
    let cluster = world.clusters[0].key().to_string();
    // Counted right after the event is sent: wait for it rather than race it.
    let failures = || {
        metric(
            &world,
            "karpenter_voluntary_disruption_queue_failures_total",
            &[("cluster", &cluster), ("decision", "replace")],
        )
    };
    wait_for("the failure counted", UP, || async { failures() >= 1.0 }).await;
    assert_eq!(failures(), 1.0);
    wait_for("the candidate untainted, without its record, still running web-0", UP, || async {
        let cs = claims(&world).await;
        let Some(c) = cs.iter().find(|c| c.name_any() == old.name_any()) else { return false };
        let node_name = c.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.clusters[0].client());
        let node = nodes.get(&node_name).await.unwrap();
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT));
        c.metadata.deletion_timestamp.is_none()
            && !c.annotations().contains_key("karpenter.clever-cloud.com/disruption-command")
            && !tainted
            && running(&world).await.iter().any(|p| p.name_any() == "web-0")
    })
    .await;
    world.shutdown().await;
}

/// Consolidation-delete (§4.9, §4.11): two under-used nodes, each left with one small pod; the pod of
/// one fits beside the other's, so that node is deleted without any replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_under_used_node_whose_pods_fit_elsewhere_is_deleted() {
    let (world, clock) = world("consolidate-delete", |_| {}).await;
    create(&world, &[("a", "3", "1Gi"), ("c", "700m", "256Mi")], json!({})).await;
    settled(&world, 2).await;
    create(&world, &[("b", "3", "1Gi"), ("d", "700m", "256Mi")], json!({})).await;
    running_on(&world, 4, 2).await;
    delete_pod(&world, "a").await;
    delete_pod(&world, "b").await;
    advance_until(&clock, "one of the two claims deleted, nothing launched", Duration::from_secs(5), || async {
        let cs = claims(&world).await;
        assert!(cs.len() <= 2, "no replacement is launched for a delete: {}", cs.len());
        cs.len() == 1 && cs[0].metadata.deletion_timestamp.is_none()
    })
    .await;
    let cluster = world.clusters[0].key().to_string();
    assert_eq!(
        metric(
            &world,
            "karpenter_voluntary_disruption_decisions_total",
            &[("cluster", &cluster), ("decision", "delete"), ("reason", "underutilized")]
        ),
        1.0
    );
    wait_for("one NodeGroup left", UP, || async { groups(&world).await.len() == 1 }).await;
    world.shutdown().await;
}

/// Drift of a flavor removed from the catalogue (§4.1, `InstanceTypeNotFound`): a node of a flavor a
/// FlavorCatalog added is drifted once that entry is removed and the claim is over an hour old, and
/// it is replaced by a node of a flavor still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flavor_removed_from_the_catalogue_drifts_its_nodes_after_an_hour() {
    let mut cke = quick_cke(0);
    cke.flavors.push(sim::cke::SimFlavor::new("CUSTOM", 2, 2_097_152));
    let (world, clock) = world_with("flavor-gone", cke, |pool| {
        pool["spec"]["template"]["spec"]["requirements"][0]["values"] = json!(["CUSTOM", "2XS", "XS"]);
    })
    .await;
    let catalogs: Api<crds::FlavorCatalog> = Api::namespaced(world.mgmt.client(), "team");
    let catalog = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
        "metadata": {"name": "custom", "namespace": "team"},
        "spec": {"flavors": [{"name": "CUSTOM", "cpu": 2, "memoryKi": 2_097_152, "priceHourly": 0.01}]}
    }))
    .unwrap();
    catalogs.create(&PostParams::default(), &catalog).await.unwrap();
    let classes: Api<crds::CleverNodeClass> = Api::namespaced(world.mgmt.client(), "team");
    let reference = json!({"spec": {"flavorCatalogRef": {"name": "custom"}}});
    classes.patch("default", &PatchParams::default(), &Patch::Merge(&reference)).await.unwrap();
    create(&world, &[("web-0", "500m", "1Gi")], json!({})).await;
    let old = settled(&world, 1).await;
    assert_eq!(flavor(&old), "CUSTOM", "the catalogue's cheap flavor");
    let without = json!({"spec": {"flavors": [{"name": "M", "priceHourly": 0.105}]}});
    catalogs.patch("custom", &PatchParams::default(), &Patch::Merge(&without)).await.unwrap();
    // An hour on (in one step: the replacement's launch timeouts run on the same clock afterwards).
    clock.advance(Duration::from_secs(3660));
    let seen = std::cell::Cell::new(false);
    advance_until(&clock, "the CUSTOM node replaced by a served flavor", Duration::from_secs(1), || async {
        let cs = claims(&world).await;
        seen.set(
            seen.get()
                || cs.iter().any(|c| {
                    c.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|k| k.type_ == "Drifted" && k.status == "True" && k.reason == "InstanceTypeNotFound")
                    })
                }),
        );
        cs.len() == 1 && cs[0].name_any() != old.name_any() && is_true(&cs[0], "Initialized")
    })
    .await;
    assert!(seen.get(), "the old claim showed Drifted=True(InstanceTypeNotFound)");
    assert_eq!(flavor(&claims(&world).await[0]), "2XS");
    world.shutdown().await;
}

/// Issue 27 item 2: several commands at once. Three drifted nodes, each holding a pod no other node
/// may take, under a budget of two: two drift commands run side by side (each waiting for its own
/// replacement), never a third node leaving while they do; a restart with both in flight resumes
/// both (their replacements are kept and initialized, nothing is launched twice); in the end no old
/// node is left and every NodeGroup is a claim's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_commands_run_side_by_side_within_the_budget_and_a_restart_resumes_them_all() {
    // Nodes take a few seconds to join: the commands overlap while their replacements launch.
    let mut cke =
        sim::cke::SimCkeConfig { node_join_delay: sim::cke::DelayRange::fixed(Duration::from_secs(4)), ..quick_cke(0) };
    cke.quota.limit = sim::cke::Usage { vcpu: 400, ram_gb: 800 };
    let (mut world, clock) = world_with("side-by-side", cke, |pool| {
        pool["spec"]["disruption"]["budgets"] = json!([{"nodes": "2"}]);
        // The evicted pods are bare (nothing recreates them): the replacements end up empty, and
        // emptiness must not take them before the test has looked.
        pool["spec"]["disruption"]["consolidateAfter"] = json!("Never");
    })
    .await;
    let apart = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}});
    create(&world, &[("web-0", "500m", "1Gi"), ("web-1", "500m", "1Gi"), ("web-2", "500m", "1Gi")], apart).await;
    running_on(&world, 3, 3).await;
    let old: Vec<String> = claims(&world).await.iter().map(ResourceExt::name_any).collect();
    let pools: Api<crds::NodePool> = Api::namespaced(world.mgmt.client(), "team");
    let relabel = json!({"spec": {"template": {"metadata": {"labels": {"team": "platform-2"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    wait_for("two drift commands waiting for their replacements at once", UP, || async {
        in_flight(&world, &old).await == 2
    })
    .await;
    let replacements = || async {
        let mut names: Vec<String> = claims(&world)
            .await
            .iter()
            .filter(|c| c.annotations().contains_key(operator::decisions::disruption_queue::REPLACES_ANNOTATION))
            .map(ResourceExt::name_any)
            .collect();
        names.sort();
        names
    };
    wait_for("both commands' replacements created", UP, || async { replacements().await.len() == 2 }).await;
    let launched = replacements().await;
    world.crash_hub().await;
    world.start_hub();
    wait_for("no drifted node left, every claim initialized", UP, || async {
        clock.advance(Duration::from_secs(1));
        in_flight(&world, &old).await;
        let cs = claims(&world).await;
        !cs.is_empty() && cs.iter().all(|c| !old.contains(&c.name_any()) && is_true(c, "Initialized"))
    })
    .await;
    let cs = claims(&world).await;
    for name in &launched {
        assert!(cs.iter().any(|c| &c.name_any() == name), "replacement {name} kept through the restart: {cs:?}");
    }
    assert!(
        cs.len() <= 3,
        "one replacement per drifted node at most: {:?}",
        cs.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    assert!(events(&world, "DisruptionRolledBack").await.is_empty(), "no command rolled back");
    for c in &cs {
        assert_eq!(
            c.labels().get("team").map(String::as_str),
            Some("platform-2"),
            "{} from the new template",
            c.name_any()
        );
    }
    let count = cs.len();
    wait_for("one NodeGroup per claim", UP, || async { groups(&world).await.len() == count }).await;
    world.shutdown().await;
}

/// How many commands wait for their replacements now (their `old` candidates recorded, not yet
/// deleting); panics when more than two old nodes leave at once (recorded in a command, or
/// deleting once their replacement is up): the budget of 2 broken.
async fn in_flight(world: &World, old: &[String]) -> usize {
    let mut ids = std::collections::BTreeSet::new();
    let mut leaving = 0;
    for c in claims(world).await.iter().filter(|c| old.contains(&c.name_any())) {
        let record = c.annotations().get(operator::decisions::disruption_queue::COMMAND_ANNOTATION).cloned();
        let deleting = c.metadata.deletion_timestamp.is_some();
        if record.is_some() || deleting {
            leaving += 1;
        }
        if !deleting {
            ids.extend(record);
        }
    }
    assert!(leaving <= 2, "the budget of 2 is broken: {leaving} old nodes leave at once");
    ids.len()
}
