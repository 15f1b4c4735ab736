//! Two things the hub must notice at once rather than at its next periodic look (issue 17,
//! found by the process-kill chaos test): a workload cluster syncing wakes that cluster's claims
//! (after a restart they used to wait 5 s each), and an accepted NodeGroup fully gone clears the
//! cluster's flavor cool-downs and creation back-off (clever-cloud.md §3.5), so a launch refused
//! for quota proceeds as soon as capacity is freed instead of after the back-off.

use std::time::{Duration, Instant};

use crds::{NodeClaim, labels};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use operator::{
    commands::sandbox::world::{World, quick_cke, scale},
    decisions::capacity::CapacityState,
    infra::hub::{CAPACITY_KEY, capacity_configmap},
    infra::metrics::ClusterLabels,
};
use serde_json::{Value, json};
use sim::cke::Usage;

use crate::common;
use common::{EXAMPLE, running, wait_for, wait_reachable};

/// One pod per 2XS node (the pool offers 2XS only).
const CPU: &str = "1";
const MEMORY: &str = "2500Mi";

/// The example pool restricted to 2XS, never consolidated (nothing but the test moves a node).
async fn apply_pool(world: &World) {
    let c = &world.clusters[0];
    let name = c.name.clone();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = json!(name);
                doc["spec"]["template"]["spec"]["requirements"] =
                    json!([{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS"]}]);
                doc["spec"]["disruption"]["consolidateAfter"] = json!("Never");
            }
        })
        .await
        .unwrap();
}

fn tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT))
}

/// After a restart, a claim whose cluster is not connected yet is acted upon as soon as the cluster
/// syncs. Here the cluster's Secret is gone while the hub restarts, so the claim (deleted meanwhile)
/// is certainly seen before its cluster; the Secret is then written again, and the claim's next
/// step (its Node tainted for the drain) must follow within 2 s of that write, connection and
/// watch sync included. Before the fix it came up to 5 s after the claim's first look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_acted_upon_as_soon_as_its_cluster_syncs_after_a_restart() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_pool(&world).await;
    world.start_hub();
    scale(&world, 0, 1, CPU, MEMORY).await.unwrap();
    wait_for("the pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;

    world.crash_hub().await;
    let secrets: Api<Secret> = Api::namespaced(world.mgmt.client(), "team-a");
    secrets.delete("alpha-kubeconfig", &DeleteParams::default()).await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let claim = claims.list(&ListParams::default()).await.unwrap().items.remove(0);
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    world.start_hub();
    // The new hub is up and has found the cluster missing (its claim has been looked at by then).
    wait_reachable(&world.mgmt.client(), "team-a", "False", "SecretMissing", Duration::from_secs(30)).await;
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    assert!(
        !nodes.list(&ListParams::default()).await.unwrap().items.iter().any(tainted),
        "nothing is done on a cluster the hub cannot see"
    );

    world.register(0).await.unwrap();
    let registered = Instant::now();
    let mut step = None;
    let deadline = registered + Duration::from_secs(30);
    while Instant::now() < deadline {
        if nodes.list(&ListParams::default()).await.is_ok_and(|l| l.items.iter().any(tainted)) {
            step = Some(registered.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let step = step.expect("the deleted claim's node was never tainted for its drain");
    eprintln!("claim's first step {:.0} ms after its cluster's Secret was written again", step.as_secs_f64() * 1000.0);
    assert!(step < Duration::from_secs(2), "the claim waited {step:?} for its cluster to sync");
    world.shutdown().await;
}

/// The cluster's capacity memory as persisted.
async fn capacity(world: &World) -> CapacityState {
    let c = &world.clusters[0];
    Api::<ConfigMap>::namespaced(world.mgmt.client(), &c.namespace)
        .get_opt(&capacity_configmap(&c.key()))
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .and_then(|d| d.get(CAPACITY_KEY).cloned())
        .map(|j| serde_json::from_str(&j).unwrap())
        .unwrap_or_default()
}

/// The cool-downs and the back-off a quota refusal arms here.
const LONG: Duration = Duration::from_secs(600);

/// Two 2XS nodes running a pod each, a third pod refused for quota: a 10-minute back-off armed and
/// every flavor cooled down (a RAM refusal of the smallest). Returns the world and one registered
/// claim.
async fn refused_for_quota(gc: Option<Duration>) -> (World, NodeClaim) {
    let mut world = World::start(&[("team-a", "alpha")], |i| {
        let mut cke = quick_cke(i as u64);
        // Room for two 2XS workers (4 GB each) beside the control plane's 24 GB.
        cke.quota.limit = Usage { vcpu: 40, ram_gb: 32 };
        cke
    })
    .await
    .unwrap();
    world.hub_settings.capacity.cooldown = LONG;
    world.hub_settings.capacity.backoff = LONG;
    world.hub_settings.capacity.max_backoff = LONG;
    if let Some(gc) = gc {
        world.hub_settings.gc_min_age = gc;
        world.hub_settings.gc_period = gc;
    }
    apply_pool(&world).await;
    world.start_hub();
    for n in 1..=2 {
        scale(&world, 0, n, CPU, MEMORY).await.unwrap();
        wait_for("pods running", Duration::from_secs(60), || async { running(&world, 0).await == n }).await;
    }
    // A third node is past the quota: refused, every flavor cooled down, creations backed off.
    scale(&world, 0, 3, CPU, MEMORY).await.unwrap();
    wait_for("the quota refusal remembered", Duration::from_secs(60), || async {
        capacity(&world).await.backoff_until.is_some()
    })
    .await;
    let refused = capacity(&world).await;
    assert!(refused.unavailable_until.contains_key("2XS"), "{refused:?}");
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let registered = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|x| x.type_ == "Registered" && x.status == "True"))
        })
        .expect("a registered claim");
    (world, registered)
}

/// Waits for the back-off and cool-downs to be cleared, then for the refused pod to run on a new
/// node; returns how long each took from `freed`.
async fn cleared_and_launched(world: &World, freed: Instant) -> (Duration, Duration) {
    wait_for("the back-off and cool-downs cleared", Duration::from_secs(60), || async {
        let s = capacity(world).await;
        s.backoff_until.is_none() && s.unavailable_until.is_empty()
    })
    .await;
    let cleared = freed.elapsed();
    // The freed node's pod is gone (a bare pod); the one refused before now gets the freed room.
    wait_for("the waiting pod running on a new node", Duration::from_secs(60), || async {
        running(world, 0).await == 2
            && Api::<k8s_openapi::api::core::v1::Pod>::namespaced(world.clusters[0].client(), "default")
                .get_opt("web-2")
                .await
                .ok()
                .flatten()
                .is_some_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await;
    (cleared, freed.elapsed())
}

/// A quota refusal arms a 10-minute back-off and cools every flavor down; deleting a registered
/// claim frees its NodeGroup's capacity, and once that group is fully gone the back-off and
/// cool-downs are cleared and the waiting pod gets its node within seconds, not after 600 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_nodegroup_fully_gone_clears_the_backoff_and_the_next_launch_proceeds() {
    let (world, registered) = refused_for_quota(None).await;
    // Free one node's capacity: its claim deleted (drained, its NodeGroup deleted, then gone).
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let freed = Instant::now();
    claims.delete(&registered.name_any(), &DeleteParams::default()).await.unwrap();
    let (cleared, launched) = cleared_and_launched(&world, freed).await;
    eprintln!(
        "capacity freed: back-off cleared {:.1} s after the claim's deletion, the refused pod Running after {:.1} s (back-off was {LONG:?})",
        cleared.as_secs_f64(),
        launched.as_secs_f64()
    );
    assert!(launched < Duration::from_secs(60), "{launched:?}");
    world.shutdown().await;
}

/// The same freed capacity when no claim is left to terminate the group: a registered claim is
/// force-deleted (finalizers dropped) while the hub is down, so its NodeGroup, node and all, is an
/// orphan the garbage collection reaps after the restart. The reaped group is remembered as
/// freeing, and once gone the back-off and cool-downs are cleared as for a terminated claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_orphan_whose_node_registered_clears_the_backoff_once_gone() {
    let gc = Duration::from_secs(2);
    let (mut world, registered) = refused_for_quota(Some(gc)).await;
    world.stop_hub().await;
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let name = registered.name_any();
    claims
        .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    claims.delete(&name, &DeleteParams::default()).await.unwrap();
    assert!(claims.get_opt(&name).await.unwrap().is_none(), "the claim is gone without its termination");
    let freed = Instant::now();
    world.start_hub();
    let (cleared, launched) = cleared_and_launched(&world, freed).await;
    let reaped = world.metrics.gc_reaped.get(&ClusterLabels { cluster: world.clusters[0].key().to_string() }).get();
    assert_eq!(reaped, 1, "the orphan went by the garbage collection");
    eprintln!(
        "capacity freed by GC: back-off cleared {:.1} s after the restart (GC min age and period {gc:?}), the refused pod Running after {:.1} s",
        cleared.as_secs_f64(),
        launched.as_secs_f64()
    );
    world.shutdown().await;
}
