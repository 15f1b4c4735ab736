//! Termination end to end on the simulated world (karpenter-semantics §5, §10.10): deleting a
//! NodeClaim drains its Node before the NodeGroup goes. The emulator answers evictions by
//! PodDisruptionBudget (429 while the budget allows none) and its kubelet stand-in finishes a
//! deleted pod 200 ms later, so what the hub does shows in the API: the taint, the label, the
//! claim's `Drained` condition, pods going tier by tier, `FailedDraining` on the Node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crds::{NodeClaim, NodeGroup, labels};
use k8s_openapi::{
    api::{
        core::v1::{Node, Pod},
        events::v1::Event,
        policy::v1::PodDisruptionBudget,
    },
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use operator::{
    commands::sandbox::world::{World, quick_cke, scale},
    controllers::nodeclaim::evict_exactly,
    decisions::termination::PodRef,
    infra::metrics::Metrics,
};
use serde_json::{Value, json};

use crate::common;
use common::{EXAMPLE, poll_every, running, wait_for, wait_quiet_over};

const NODE_UP: Duration = Duration::from_secs(60);
const DRAIN: Duration = Duration::from_secs(60);
/// How many more times the hub must have been seen at work (eviction retries, connection attempts)
/// with nothing changing before a negative ("still blocked", "nothing sent") is judged.
const QUIET_STEPS: u64 = 3;

/// The cluster's NodePool from general-purpose.yaml, `edit`ed.
async fn apply_pool(world: &World, edit: impl Fn(&mut Value)) {
    let c = &world.clusters[0];
    let name = c.name.clone();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(name.clone());
                edit(doc);
            }
        })
        .await
        .unwrap();
}

/// One pod up on one new node: the claim and its Node's name once registered.
async fn one_node(world: &World) -> (NodeClaim, String) {
    scale(world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("the pod running", NODE_UP, || async { running(world, 0).await == 1 }).await;
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    registered_claim(&claims).await
}

/// The first claim in `claims` whose Node registered, once there is one, and its Node's name.
async fn registered_claim(claims: &Api<NodeClaim>) -> (NodeClaim, String) {
    // A real API server may answer 429 while a watch cache (re)initializes: not yet, look again.
    let registered = || async {
        let list = claims.list(&ListParams::default()).await.ok()?.items;
        list.into_iter().find(|c| c.status.as_ref().is_some_and(|s| s.node_name.is_some()))
    };
    wait_for("a registered claim", NODE_UP, || async { registered().await.is_some() }).await;
    let claim = registered().await.unwrap();
    let node = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    (claim, node)
}

/// A pod bound to `node` (no scheduler involved), `extra` merged into it.
fn bound(name: &str, node: &str, extra: Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/app:1"}]}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn daemonset_owned() -> Value {
    json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "5f0c8f3e-0000-4000-8000-000000000001", "controller": true}]}})
}

fn deleting_or_gone(pods: &[Pod], name: &str) -> bool {
    pods.iter().find(|p| p.name_any() == name).is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

fn condition(claim: &NodeClaim, type_: &str) -> Option<(String, String)> {
    claim.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.clone(), c.reason.clone()))
}

/// The notes of the events `reason` in the workload cluster's `default` namespace about the
/// object named `name` (a Node or a pod).
async fn events_on(workload: &kube::Client, name: &str, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(workload.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The pods of [`deleting_a_nodeclaim_drains_its_node_in_tier_order_within_budgets`] besides the
/// one that brought the node up: its drain tiers in order, then the one tolerating the taint.
const TIERED: [&str; 5] = ["guarded", "agent", "critical", "critical-agent", "tolerating"];

/// §10.10 items 135–138 and a hub restart mid-drain: the Node is tainted and labelled, pods go tier
/// by tier (ordinary workload, DaemonSet, critical, critical DaemonSet), a PDB that allows nothing
/// holds the drain (FailedDraining on the Node, Node and NodeGroup kept) across a restart of the
/// hub until it is relaxed; a pod tolerating the taint is never evicted; then the Node and
/// NodeGroup go and the claim is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_nodeclaim_drains_its_node_in_tier_order_within_budgets() {
    let mut world = World::start(&[("team-a", "drain")], |i| quick_cke(i as u64)).await.unwrap();
    apply_pool(&world, |_| {}).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    let wl = world.clusters[0].client();
    let pods: Api<Pod> = Api::namespaced(wl.clone(), "default");
    let critical = json!({"spec": {"priorityClassName": "system-node-critical"}});
    let mut critical_ds = daemonset_owned();
    merge(&mut critical_ds, critical.clone());
    for p in [
        bound("guarded", &node, json!({})),
        bound("agent", &node, daemonset_owned()),
        bound("critical", &node, critical),
        bound("critical-agent", &node, critical_ds),
        bound(
            "tolerating",
            &node,
            json!({"spec": {"tolerations": [{"key": labels::DISRUPTED_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}}),
        ),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(wl.clone(), "default");
    let pdb = json!({"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    wait_for("the bound pods running", NODE_UP, || async { running(&world, 0).await == 6 }).await;

    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let nodes: Api<Node> = Api::all(wl.clone());
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let group = claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap()
        .trim_start_matches("clevercloud://")
        .to_string();
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();

    wait_for("the node tainted and labelled", DRAIN, || async {
        nodes.get_opt(&node).await.unwrap().is_some_and(|n| {
            let tainted = n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
                ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT && t.effect == "NoSchedule" && t.value.is_none())
            });
            tainted && n.labels().get(labels::EXCLUDE_FROM_LB).map(String::as_str) == Some("karpenter")
        })
    })
    .await;
    wait_for("Drained=Unknown(Draining)", DRAIN, || async {
        claims.get_opt(&claim.name_any()).await.unwrap().and_then(|c| condition(&c, "Drained"))
            == Some(("Unknown".into(), "Draining".into()))
    })
    .await;
    wait_for("the ordinary pod evicted", DRAIN, || async {
        deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "web-0")
    })
    .await;
    wait_for("FailedDraining on the node", DRAIN, || async {
        !events_on(&world.clusters[0].client(), &node, "FailedDraining").await.is_empty()
    })
    .await;
    let note = events_on(&world.clusters[0].client(), &node, "FailedDraining").await.join(" ");
    assert!(note.contains("default/guarded"), "{note}");

    // The budget holds the drain, across a restart of the hub: nothing of a later tier goes, and
    // the Node and NodeGroup stay. Judged once the restarted hub has retried the refused eviction
    // QUIET_STEPS more times with nothing changing (each retry is a drain pass that could have
    // moved on).
    let requests = world.clusters[0].server.requests();
    world.crash_hub().await;
    let refused = requests.count("create", "pods/eviction");
    world.start_hub();
    wait_for("the restarted hub retrying the refused eviction", DRAIN, || async {
        requests.count("create", "pods/eviction") > refused
    })
    .await;
    let drain_state = || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let gone: Vec<&str> = TIERED.into_iter().filter(|name| deleting_or_gone(&list, name)).collect();
        let node_there = nodes.get_opt(&node).await.unwrap().is_some();
        let group_there =
            groups.get_opt(&group).await.unwrap().is_some_and(|g| g.metadata.deletion_timestamp.is_none());
        (gone, node_there, group_there)
    };
    let (gone, node_there, group_there) =
        wait_quiet_over("the drain held by the budget after a restart", DRAIN, QUIET_STEPS, drain_state, || async {
            requests.count("create", "pods/eviction")
        })
        .await;
    assert!(gone.is_empty(), "{gone:?} went while the budget allowed nothing");
    assert!(node_there, "the node went before its drain");
    assert!(group_there, "the NodeGroup went (or is going) before the drain");
    let waiting = format!(
        "karpenter_hub_nodeclaims_drain_waiting_pods{{cluster=\"team-a/drain\",nodepool=\"default\",nodeclaim=\"{}\"}}",
        claim.name_any()
    );
    // The restarted hub's own series: the drain it resumed waits for pods.
    wait_for("the blocked drain's waiting pods in the hub's metrics", DRAIN, || async {
        let shown = world.metrics.render();
        shown.lines().find_map(|l| l.strip_prefix(waiting.as_str())).map(str::trim).is_some_and(|v| v != "0")
    })
    .await;

    // Relax the budget: the tiers go in order, then the Node and the NodeGroup. Sampled every 50 ms
    // for the order in which they go.
    pdbs.patch("guard", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    let went: RefCell<BTreeMap<String, tokio::time::Instant>> = RefCell::default();
    let drained = poll_every(Duration::from_millis(50), DRAIN, || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let node_there = nodes.get_opt(&node).await.unwrap().is_some();
        for name in TIERED {
            if deleting_or_gone(&list, name) && !went.borrow().contains_key(name) {
                went.borrow_mut().insert(name.to_string(), tokio::time::Instant::now());
                assert!(name != "tolerating" || !node_there, "the tolerating pod was evicted");
            }
        }
        !node_there && groups.get_opt(&group).await.unwrap().is_none()
    })
    .await;
    let went = went.into_inner();
    assert!(drained, "timed out draining; gone so far: {went:?}");
    let order = ["guarded", "agent", "critical", "critical-agent"];
    for pair in order.windows(2) {
        let (a, b) = (went.get(pair[0]), went.get(pair[1]));
        assert!(a.is_some() && b.is_some() && a < b, "{} must go before {}: {went:?}", pair[0], pair[1]);
    }
    wait_for("the claim released", DRAIN, || async { claims.get_opt(&claim.name_any()).await.unwrap().is_none() })
        .await;
    let shown = world.metrics.render();
    assert!(!shown.contains(&waiting), "the waiting-pods series goes with the drain");
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("karpenter_nodeclaims_termination_duration_seconds_count{") && l.ends_with(" 1")),
        "one termination measured"
    );
    world.shutdown().await;
}

/// §10.10 items 138 and 139 and §5.1.1, on the hub's manual clock: with a terminationGracePeriod
/// (10 s) the claim gets its deadline once; an ordinary pod is evicted at once, while a
/// do-not-disrupt pod and a pod whose budget never allows an eviction (refused, retried with
/// back-off, `FailedDraining`) are kept until deadline − their grace (2 s), then deleted (not
/// evicted) with their grace shortened so they end by the deadline; then the node goes. The clock is
/// moved to each instant that matters; nothing waits for the grace period to pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_pods_are_deleted_at_the_termination_grace_period() {
    use k8s_openapi::jiff::SignedDuration;
    let clock = sim::clock::Clock::manual_now();
    let mut world = World::start_on(&[("team-a", "deadline")], |i| quick_cke(i as u64), clock.clone()).await.unwrap();
    apply_pool(&world, |pool| pool["spec"]["template"]["spec"]["terminationGracePeriod"] = json!("10s")).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    let wl = world.clusters[0].client();
    let pods: Api<Pod> = Api::namespaced(wl.clone(), "default");
    // An ordinary pod that ends within 3 s, and a protected one that ends within 2 s; the pod that
    // brought the node up goes first (its default 30 s grace would be forced at once).
    let precious = json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}, "spec": {"terminationGracePeriodSeconds": 2}});
    pods.create(&PostParams::default(), &bound("precious", &node, precious)).await.unwrap();
    let ordinary = json!({"spec": {"terminationGracePeriodSeconds": 3}});
    pods.create(&PostParams::default(), &bound("ordinary", &node, ordinary)).await.unwrap();
    // And one whose budget never allows an eviction: refused until the deadline, then deleted.
    let guarded = json!({"spec": {"terminationGracePeriodSeconds": 2}});
    pods.create(&PostParams::default(), &bound("guarded", &node, guarded)).await.unwrap();
    let pdb = json!({"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    Api::<PodDisruptionBudget>::namespaced(wl.clone(), "default")
        .create(&PostParams::default(), &serde_json::from_value(pdb).unwrap())
        .await
        .unwrap();
    scale(&world, 0, 0, "500m", "1Gi").await.unwrap();
    wait_for("the pods running", NODE_UP, || async { running(&world, 0).await == 3 }).await;

    // The hub's clock to the wall's (the workload emulator stamps pods on the wall clock), then
    // held there: the claim is deleted, and drained, at that instant.
    clock.set(chrono::Utc::now());
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let requests = world.clusters[0].server.requests();
    let evictions = || requests.count("create", "pods/eviction");
    let evictions_before = evictions();
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    let name = claim.name_any();
    wait_for("the deadline annotation", DRAIN, || async {
        claims
            .get_opt(&name)
            .await
            .unwrap()
            .is_some_and(|c| c.annotations().contains_key(labels::TERMINATION_TIMESTAMP))
    })
    .await;
    let live = claims.get(&name).await.unwrap();
    let deadline: Timestamp = live.annotations()[labels::TERMINATION_TIMESTAMP].parse().unwrap();
    let deleted: Timestamp = live.metadata.deletion_timestamp.unwrap().0;
    assert_eq!(deadline.duration_since(deleted).as_secs(), 10, "deletion + terminationGracePeriod");
    let nodes: Api<Node> = Api::all(wl.clone());
    let going = |list: &[Pod]| -> Vec<&'static str> {
        ["precious", "guarded"].into_iter().filter(|name| deleting_or_gone(list, name)).collect()
    };

    // At the deletion's instant: the ordinary pod is evicted at once (10 s before the deadline,
    // more than its 3 s grace), the guarded one refused, the precious one waited for.
    wait_for("the ordinary pod evicted and the guarded one refused", DRAIN, || async {
        deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "ordinary")
            && !events_on(&wl, &node, "FailedDraining").await.is_empty()
    })
    .await;
    // Up to deadline − 2 s (the protected pods' grace), 2 s at a time: at each instant the hub
    // retries the refused eviction (its back-off, 100 ms doubling, is below 2 s for the first four
    // refusals), and forces nothing. (A pass sends its forced deletions before its evictions: the
    // retry seen, that pass had nothing to force.)
    let to_chrono = |t: Timestamp| chrono_like(t.as_second(), t.subsec_nanosecond());
    for before in [8, 6, 4, 2] {
        let asked = evictions();
        clock.set(to_chrono(deadline - SignedDuration::from_secs(before)));
        wait_for(&format!("the refused eviction retried {before} s before the deadline"), DRAIN, || async {
            evictions() > asked
        })
        .await;
        let went = going(&pods.list(&ListParams::default()).await.unwrap().items);
        assert!(went.is_empty(), "{went:?} forced {before} s before the deadline, before deadline − their 2 s grace");
        assert!(nodes.get_opt(&node).await.unwrap().is_some(), "the node went with protected pods on it");
    }
    // Past deadline − 2 s: both are deleted, with the 1 s left as their grace, before the node goes.
    clock.set(to_chrono(deadline - SignedDuration::from_secs(1)));
    wait_for("the protected pods deleted 1 s before the deadline", DRAIN, || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let went = going(&list).len() == 2;
        assert!(went || nodes.get_opt(&node).await.unwrap().is_some(), "the node went with protected pods on it");
        went
    })
    .await;
    for name in ["precious", "guarded"] {
        wait_for(&format!("ForceDeleted on {name}"), DRAIN, || async {
            !events_on(&wl, name, "ForceDeleted").await.is_empty()
        })
        .await;
        let note = events_on(&wl, name, "ForceDeleted").await.join(" ");
        assert!(note.contains("grace period of 1s"), "{name}: {note}");
    }
    let refused = events_on(&wl, &node, "FailedDraining").await.join(" ");
    assert!(refused.contains("default/guarded"), "the budget's refusals are reported on the node: {refused}");
    // The annotation is never rewritten.
    let c = claims.get_opt(&claim.name_any()).await.unwrap();
    if let Some(c) = c {
        assert_eq!(c.annotations().get(labels::TERMINATION_TIMESTAMP).unwrap().parse::<Timestamp>().unwrap(), deadline);
    }
    wait_for("node and claim gone", DRAIN, || async {
        nodes.get_opt(&node).await.unwrap().is_none() && claims.get_opt(&claim.name_any()).await.unwrap().is_none()
    })
    .await;
    // The protected pods were deleted, never evicted: the only successful eviction is the
    // ordinary pod's, the others are the guarded pod's refusals (one at the deletion, one at
    // each of the four instants).
    let evicted = evicted_pods(&wl).await;
    assert_eq!(evicted, ["ordinary"]);
    let asked = evictions() - evictions_before;
    assert!(asked >= 6, "the refused eviction is retried until the deadline ({asked} requests)");
    world.shutdown().await;
}

/// §10.10 item 142: a drained node's NodeGroup is kept while a VolumeAttachment of a
/// PersistentVolume remains on it (`VolumesDetached=Unknown(AwaitingVolumeDetachment)`), and goes
/// once the attachment does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodegroup_waits_for_the_volumes_of_a_drained_node_to_detach() {
    use k8s_openapi::api::{core::v1::PersistentVolume, storage::v1::VolumeAttachment};
    let mut world = World::start(&[("team-a", "volumes")], |i| quick_cke(i as u64)).await.unwrap();
    apply_pool(&world, |_| {}).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    let wl = world.clusters[0].client();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-data"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "csi.example", "volumeHandle": "vol-1"},
                 "claimRef": {"namespace": "default", "name": "data"}}
    }))
    .unwrap();
    Api::<PersistentVolume>::all(wl.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": "va-data"},
        "spec": {"attacher": "csi.example", "nodeName": node, "source": {"persistentVolumeName": "pv-data"}}
    }))
    .unwrap();
    let attachments: Api<VolumeAttachment> = Api::all(wl.clone());
    attachments.create(&PostParams::default(), &va).await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    wait_for("VolumesDetached=Unknown(AwaitingVolumeDetachment)", DRAIN, || async {
        claims.get_opt(&claim.name_any()).await.unwrap().and_then(|c| condition(&c, "VolumesDetached"))
            == Some(("Unknown".into(), "AwaitingVolumeDetachment".into()))
    })
    .await;
    // (The claim is kept while the volume is attached: it is still there to read.)
    let live = claims.get(&claim.name_any()).await.unwrap();
    assert_eq!(condition(&live, "Drained"), Some(("True".into(), "Drained".into())), "drained first");
    let group = group_of(&claim);
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let g = groups.get(&group).await.unwrap();
    assert!(g.metadata.deletion_timestamp.is_none(), "the NodeGroup is kept while the volume is attached");
    attachments.delete("va-data", &DeleteParams::default()).await.unwrap();
    wait_for("the NodeGroup and the claim gone once the volume detached", DRAIN, || async {
        groups.get_opt(&group).await.unwrap().is_none_or(|g| g.metadata.deletion_timestamp.is_some())
            && claims.get_opt(&claim.name_any()).await.unwrap().is_none()
    })
    .await;
    world.shutdown().await;
}

/// §10.10 item 145: a claim deleted before its node registered is not drained (no condition, no
/// eviction); its NodeGroup is deleted and the claim released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_claim_is_released_without_a_drain() {
    // CKE accepts the group but its node would join only after the test.
    let slow_node = |i: usize| sim::cke::SimCkeConfig {
        node_join_delay: sim::cke::DelayRange::fixed(Duration::from_secs(600)),
        ..quick_cke(i as u64)
    };
    let mut world = World::start(&[("team-a", "unregistered")], slow_node).await.unwrap();
    let (claims, claim) = one_pod_one_claim(&mut world, "Launched").await;
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    assert_eq!(groups.list(&ListParams::default()).await.unwrap().items.len(), 1);
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    wait_for("the NodeGroup deleted and the claim released", DRAIN, || async {
        let group_gone = groups.list(&ListParams::default()).await.unwrap().items.iter().all(|g| {
            g.annotations().get(labels::NODECLAIM_UID) != claim.metadata.uid.as_ref()
                || g.metadata.deletion_timestamp.is_some()
        });
        let claim_gone = claims.get_opt(&claim.name_any()).await.unwrap().is_none_or(|c| c.uid() != claim.uid());
        group_gone && claim_gone
    })
    .await;
    assert_eq!(world.clusters[0].server.requests().count("create", "pods/eviction"), 0, "nothing evicted");
    world.shutdown().await;
}

// ---- the API answers the drain relies on, on the emulator and on a real kube-apiserver --------

/// What the controller branches on, as the server answers it: an eviction a PodDisruptionBudget
/// forbids is 429 (answered at once by a client without kube's retry, as the hub's eviction
/// client is built), a stale UID precondition 409, a missing pod 404, an allowed eviction
/// succeeds and a bound pod then terminates gracefully; relaxing the budget lets the eviction
/// through; a forced deletion keeps the shortened grace it was given.
async fn eviction_answers(client: kube::Client, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::Preconditions;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    // Bound to a node that has no kubelet: deletions stay graceful (the pod stays, terminating).
    let node = format!("{ns}-no-kubelet");
    let mut uids = BTreeMap::new();
    for name in ["guarded", "free", "forced"] {
        let mut p = bound(name, &node, json!({}));
        p.metadata.namespace = Some(ns.to_string());
        let p = pods.create(&PostParams::default(), &p).await.unwrap();
        uids.insert(name, p.metadata.uid.unwrap());
        // Running and Ready, as a kubelet would report: kube-apiserver evicts a Pending pod
        // regardless of its budget (the emulator does not: it answers 429 there too).
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    }
    let pdb = json!({"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    let exactly = |name: &str| PodRef { namespace: ns.to_string(), name: name.to_string(), uid: uids[name].clone() };
    let code = |r: Result<(), kube::Error>| match r {
        Ok(()) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("no answer: {e}"),
    };
    let asked = std::time::Instant::now();
    assert_eq!(code(evict_exactly(&client, &exactly("guarded")).await), 429, "the budget allows nothing");
    assert!(asked.elapsed() < Duration::from_secs(5), "the 429 comes back at once, not after client retries");
    let stale = PodRef { uid: "00000000-0000-4000-8000-000000000000".into(), ..exactly("free") };
    assert_eq!(code(evict_exactly(&client, &stale).await), 409, "a stale UID precondition");
    assert_eq!(code(evict_exactly(&client, &PodRef { name: "missing".into(), ..exactly("free") }).await), 404);
    assert_eq!(code(evict_exactly(&client, &exactly("free")).await), 200);
    let free = pods.get("free").await.unwrap();
    assert!(free.metadata.deletion_timestamp.is_some(), "an evicted bound pod terminates gracefully");
    // Evicting a pod already terminating is not refused (the hub does not ask, but a restart may).
    assert_eq!(code(evict_exactly(&client, &exactly("free")).await), 200);
    // The budget relaxed: the guarded pod may go once the disruption controller has seen the
    // change. (`minAvailable`, because kube-controller-manager computes no budget from
    // `maxUnavailable` for pods without a scalable controller.)
    pdbs.patch("guard", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    wait_for("the relaxed budget letting the eviction through", Duration::from_secs(30), || async {
        code(evict_exactly(&client, &exactly("guarded")).await) == 200
    })
    .await;
    // Forced deletion at the deadline: DELETE with the UID precondition and a shortened grace.
    let dp = DeleteParams {
        grace_period_seconds: Some(1),
        preconditions: Some(Preconditions { uid: Some(uids["forced"].clone()), resource_version: None }),
        ..DeleteParams::default()
    };
    pods.delete("forced", &dp).await.unwrap();
    let forced = pods.get("forced").await.unwrap();
    assert_eq!(forced.metadata.deletion_grace_period_seconds, Some(1));
    let _ = nss.delete(ns, &DeleteParams::default()).await;
}

fn suffix() -> String {
    format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
}

/// The API side of §10.10 items 138 (429 while a budget refuses) and 139 (a forced deletion keeps
/// its shortened grace), on the emulator: [`eviction_answers`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulator_answers_evictions_as_the_drain_expects() {
    let server =
        sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::workload("drain-api")).await.unwrap();
    let mut config = server.client_config();
    config.default_retry = false;
    eviction_answers(kube::Client::try_from(config).unwrap(), &format!("drain-{}", suffix())).await;
}

/// The same ([`eviction_answers`], §10.10 items 138 and 139) on a real kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_api_server_answers_evictions_as_the_drain_expects() {
    let cp = envtest::shared_or_skip!("termination");
    // default_retry is off in envtest's config, as in the hub's eviction client.
    eviction_answers(cp.client().await.unwrap(), &format!("drain-{}", suffix())).await;
}

/// Karpenter-semantics §4.1 and the max-node-lifetime scenario (clever-cloud.md §9), on the hub's
/// manual clock: a claim whose age reaches its pool's `expireAfter` (1h) is kept one second before
/// and deleted at its expiry, forcefully, and drained like any deletion: its pod is evicted, its
/// NodeGroup deleted, the claim released, an `Expired` event on it. The pod, recreated as its
/// ReplicaSet would, runs on a new node of a new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claim_is_drained_and_its_node_replaced() {
    let clock = sim::clock::Clock::manual_now();
    let mut world = World::start_on(&[("team-a", "expiry")], |i| quick_cke(i as u64), clock.clone()).await.unwrap();
    apply_pool(&world, |doc| doc["spec"]["template"]["spec"]["expireAfter"] = json!("1h")).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    assert_eq!(claim.spec.expire_after, "1h", "the claim carries its pool's expireAfter");
    let ns = world.clusters[0].namespace.clone();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &ns);
    // The world's clock to one second before the claim's expiry (every claim is re-decided when the
    // clock moves).
    let created = claim.metadata.creation_timestamp.clone().unwrap().0;
    let expiry = created + k8s_openapi::jiff::SignedDuration::from_hours(1);
    let to_chrono = |t: Timestamp| chrono_like(t.as_second(), t.subsec_nanosecond());
    clock.set(to_chrono(expiry - k8s_openapi::jiff::SignedDuration::from_secs(1)));
    common::wait_quiet("the claim one second before its expiry", DRAIN, Duration::from_secs(2), || async {
        claims.get(&claim.name_any()).await.unwrap().metadata.deletion_timestamp.is_some()
    })
    .await;
    let live = claims.get(&claim.name_any()).await.unwrap();
    assert!(live.metadata.deletion_timestamp.is_none(), "deleted before its expiry");
    clock.set(to_chrono(expiry));
    wait_for("the claim deleted at its expiry", DRAIN, || async {
        claims.get_opt(&claim.name_any()).await.unwrap().is_none_or(|c| c.metadata.deletion_timestamp.is_some())
    })
    .await;
    // The drain waits 5 s of the hub's time after it began, and the replacement comes up: the
    // hub's clock moves 1 s at each look while they go.
    let advancing = || clock.advance(Duration::from_secs(1));
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    wait_for("the pod evicted, the NodeGroup and the claim gone", DRAIN, || async {
        advancing();
        let group_gone = groups.list(&ListParams::default()).await.unwrap().items.iter().all(|g| {
            g.annotations().get(labels::NODECLAIM_UID) != claim.metadata.uid.as_ref()
                || g.metadata.deletion_timestamp.is_some()
        });
        let claim_gone = claims.get_opt(&claim.name_any()).await.unwrap().is_none_or(|c| c.uid() != claim.uid());
        let pod_gone = deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "web-0");
        group_gone && claim_gone && pod_gone
    })
    .await;
    assert!(
        world.clusters[0].server.requests().count("create", "pods/eviction") >= 1,
        "the pod left through the Eviction API"
    );
    assert!(!events_on(&world.clusters[0].client(), "web-0", "Evicted").await.is_empty(), "Evicted event on the pod");
    let expired: Vec<_> = Api::<Event>::namespaced(world.mgmt.client(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Expired")
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == claim.metadata.uid.as_deref()
        })
        .collect();
    assert_eq!(expired.len(), 1, "one Expired event on the claim");
    // The workload comes back (as a ReplicaSet would recreate it) and lands on a new node.
    wait_for("web-0 gone for good", DRAIN, || async {
        advancing();
        pods.get_opt("web-0").await.unwrap().is_none()
    })
    .await;
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("web-0 running on a new node", NODE_UP, || async {
        advancing();
        pods.get_opt("web-0").await.unwrap().and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    let new_node = pods.get("web-0").await.unwrap().spec.and_then(|s| s.node_name).expect("web-0 runs on a node");
    // Node names follow the claim's name (which may be reused): tell the claims apart by UID.
    let owner = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(new_node.as_str()));
    let owner = owner.expect("the new node belongs to a claim");
    assert_ne!(owner.uid(), claim.uid(), "the replacement node {new_node} (old: {node}) is a new claim's");
    world.shutdown().await;
}

/// A jiff instant (the hub's) as a chrono one (the sim clock's).
fn chrono_like(secs: i64, nanos: i32) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(secs, u32::try_from(nanos).unwrap()).unwrap()
}

/// §10.10 item 143 (§5.2 step 2): a claim deleted while its Node is NotReady and its NodeGroup is
/// NotFound has no instance left to drain: it is released at once, nothing evicted, the Node never
/// tainted, a `DrainSkipped` event on the claim. (A Ready Node is drained whatever its group says:
/// the pure rule's table test, `termination::must_drain`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_ready_node_whose_nodegroup_is_gone_is_released_without_a_drain() {
    // The node joins but its kubelet never reports Ready; CKE would remove it only after the test.
    let never_ready = |i: usize| sim::cke::SimCkeConfig {
        node_ready_delay: sim::cke::DelayRange::fixed(Duration::from_secs(600)),
        node_removal_delay: sim::cke::DelayRange::fixed(Duration::from_secs(600)),
        ..quick_cke(i as u64)
    };
    let mut world = World::start(&[("team-a", "notready")], never_ready).await.unwrap();
    let (claims, claim) = one_pod_one_claim(&mut world, "Registered").await;
    let node = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    pods.create(&PostParams::default(), &bound("stranded", &node, json!({}))).await.unwrap();
    // The platform loses the instance: the NodeGroup goes without the hub asking (finalizers
    // dropped, as a vanish ends).
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    let group = groups
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|g| g.annotations().get(labels::NODECLAIM_UID) == claim.metadata.uid.as_ref())
        .expect("the claim's NodeGroup");
    groups
        .patch(&group.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    groups.delete(&group.name_any(), &DeleteParams::default()).await.unwrap();
    wait_for("the NodeGroup NotFound", DRAIN, || async { groups.get_opt(&group.name_any()).await.unwrap().is_none() })
        .await;
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    let n = nodes.get(&node).await.unwrap();
    assert!(!operator::decisions::termination::node_ready(&n), "the Node is NotReady");
    // The hub may have deleted the claim itself already (a NotReady node whose NodeGroup is gone
    // deletes its claim): the release below is the same either way.
    match claims.delete(&claim.name_any(), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("deleting the claim: {e}"),
    }
    wait_for("the claim released", DRAIN, || async {
        claims.get_opt(&claim.name_any()).await.unwrap().is_none_or(|c| c.uid() != claim.uid())
    })
    .await;
    assert_eq!(world.clusters[0].server.requests().count("create", "pods/eviction"), 0, "nothing evicted");
    let stranded = pods.get("stranded").await.unwrap();
    assert!(stranded.metadata.deletion_timestamp.is_none(), "the pod was not deleted either");
    let n = nodes.get(&node).await.unwrap();
    let tainted =
        n.spec.clone().and_then(|s| s.taints).unwrap_or_default().iter().any(|t| t.key == labels::DISRUPTED_TAINT);
    assert!(!tainted, "the Node was never tainted for a drain");
    assert!(!n.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER), "the hub released the Node");
    let skipped = Api::<Event>::namespaced(world.mgmt.client(), &world.clusters[0].namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(operator::decisions::termination::DRAIN_SKIPPED)
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == claim.metadata.uid.as_deref()
        })
        .count();
    assert_eq!(skipped, 1, "one DrainSkipped event on the claim");
    world.shutdown().await;
}

/// The claim's NodeGroup name (its provider ID without the scheme).
fn group_of(claim: &NodeClaim) -> String {
    claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap()
        .trim_start_matches("clevercloud://")
        .to_string()
}

fn ready_and_not_deleting(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// §10.10 item 138: three replicas behind a PodDisruptionBudget with `minAvailable: 2` leave the
/// drained node one at a time (on the emulator, which answers evictions by the budget). See
/// [`one_eviction_at_a_time`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allowing_one_eviction_at_a_time_serializes_the_drain() {
    let mut world = World::start(&[("team-a", "onebyone")], |i| quick_cke(i as u64)).await.unwrap();
    apply_pool(&world, |_| {}).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let requests = world.clusters[0].server.requests();
    one_eviction_at_a_time(&world.clusters[0].client(), &claims, &claim, &node, || {
        requests.count("create", "pods/eviction")
    })
    .await;
    world.shutdown().await;
}

/// §10.10 item 138, the same on real control planes ([`RealPlanes`]): kube-apiserver answers the
/// evictions by the budget whose status kube-controller-manager keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_allowing_one_eviction_at_a_time_serializes_the_drain_on_real_api_servers() {
    let Some(planes) = RealPlanes::start("onebyone").await else { return };
    let (claim, node) = planes.one_node().await;
    let claims: Api<NodeClaim> = Api::namespaced(planes.mgmt.clone(), RealPlanes::NS);
    one_eviction_at_a_time(&planes.wl, &claims, &claim, &node, || {
        eviction_requests(&planes.metrics, RealPlanes::CLUSTER, None)
    })
    .await;
    planes.stop().await;
}

/// Three replicas behind a PodDisruptionBudget with `minAvailable: 2`, bound to `node` (of `claim`,
/// in the workload cluster `wl`), leave it one at a time when the claim is deleted. The test plays
/// their ReplicaSet: once an evicted replica is gone it starts a replacement elsewhere and reports
/// it Ready, which is what frees the budget for the next eviction. At no observation are two
/// replicas missing; the refused evictions (`evictions` counts the hub's eviction requests) are
/// retried until the three have gone, then the Node and the NodeGroup go.
async fn one_eviction_at_a_time(
    wl: &kube::Client,
    claims: &Api<NodeClaim>,
    claim: &NodeClaim,
    node: &str,
    evictions: impl Fn() -> u64,
) {
    const REPLICAS: usize = 3;
    let pods: Api<Pod> = Api::namespaced(wl.clone(), "default");
    let replica = json!({"metadata": {"labels": {"app": "replicated"}}});
    let originals: Vec<String> = (0..REPLICAS).map(|i| format!("replica-{i}")).collect();
    for name in &originals {
        pods.create(&PostParams::default(), &bound(name, node, replica.clone())).await.unwrap();
    }
    let pdb = json!({"metadata": {"name": "replicas"}, "spec": {"minAvailable": REPLICAS - 1, "selector": {"matchLabels": {"app": "replicated"}}}});
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(wl.clone(), "default");
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    let selector = ListParams::default().labels("app=replicated");
    wait_for("the replicas running and Ready", NODE_UP, || async {
        pods.list(&selector).await.unwrap().items.iter().filter(|p| ready_and_not_deleting(p)).count() == REPLICAS
    })
    .await;
    wait_for("the budget allowing one disruption", NODE_UP, || async {
        pdbs.get("replicas").await.unwrap().status.is_some_and(|s| s.disruptions_allowed == 1)
    })
    .await;

    let nodes: Api<Node> = Api::all(wl.clone());
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let group = group_of(claim);
    let evictions_before = evictions();
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();

    // Sampled every 50 ms, to catch a replica on its way and to replace it soon after it is gone.
    let replaced: RefCell<Vec<String>> = RefCell::default();
    let saw_one_missing = Cell::new(0);
    let drained = poll_every(Duration::from_millis(50), DRAIN, || async {
        let list = pods.list(&selector).await.unwrap().items;
        let healthy = list.iter().filter(|p| ready_and_not_deleting(p)).count();
        let missing: Vec<&String> = originals.iter().filter(|o| deleting_or_gone(&list, o)).collect();
        assert!(
            healthy >= REPLICAS - 1,
            "two replicas missing at once: {healthy} healthy, originals going or gone: {missing:?}, replaced: {:?}",
            replaced.borrow()
        );
        if healthy == REPLICAS - 1 {
            saw_one_missing.set(saw_one_missing.get() + 1);
        }
        // The ReplicaSet's part: a replica fully gone is replaced, Ready at once, off the node.
        for name in &originals {
            let gone = list.iter().all(|p| &p.name_any() != name);
            if gone && !replaced.borrow().contains(name) {
                let p = bound(&format!("{name}-new"), &format!("{node}-elsewhere"), replica.clone());
                pods.create(&PostParams::default(), &p).await.unwrap();
                let status =
                    json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
                pods.patch_status(&format!("{name}-new"), &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .unwrap();
                replaced.borrow_mut().push(name.clone());
            }
        }
        nodes.get_opt(node).await.unwrap().is_none() && groups.get_opt(&group).await.unwrap().is_none()
    })
    .await;
    let replaced = replaced.into_inner();
    assert!(drained, "timed out draining; replaced so far: {replaced:?}");
    let list = pods.list(&selector).await.unwrap().items;
    for name in &originals {
        assert!(deleting_or_gone(&list, name), "{name} is still there after the node went");
    }
    // The node went only after the third replica had left, so it was evicted only after the
    // second replacement became Ready: all three waited their turn.
    assert!(replaced.len() >= REPLICAS - 1, "replaced: {replaced:?}");
    assert!(saw_one_missing.get() > 0, "no observation caught a replica on its way: the check above saw nothing");
    let evictions = evictions() - evictions_before;
    assert!(
        evictions > REPLICAS as u64 + 1,
        "{evictions} eviction requests: the budget refused some, and they were retried"
    );
    let refused = events_on(wl, node, "FailedDraining").await.join(" ");
    assert!(refused.contains("default/replica-"), "the budget's refusals are reported on the node: {refused}");
    wait_for("the claim released", DRAIN, || async { claims.get_opt(&claim.name_any()).await.unwrap().is_none() })
        .await;
}

/// ClusterReachable of the cluster's NodePool ("default"): (status, reason).
async fn reachable(world: &World) -> Option<(String, String)> {
    let pool = Api::<crds::NodePool>::namespaced(world.mgmt.client(), &world.clusters[0].namespace)
        .get_opt("default")
        .await
        .unwrap()?;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.status, c.reason))
}

/// Issue 11 item 3 (a lost connection mid-drain) and §10.10 item 138 (finalizer kept): a drain
/// held by a budget, then the cluster becomes unreachable. While it is, the hub evicts nothing and
/// deletes nothing there (the emulator's request counters and objects do not move, judged once
/// the hub has tried to reach the cluster again several times) and does not take the unreachable
/// Node for gone: the claim keeps its finalizer and is not `Drained`. Once the cluster is back, the
/// drain resumes where it was: still held by the budget, then, relaxed, through to the Node and
/// the NodeGroup, and the claim is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_disconnects_mid_drain_is_drained_only_once_it_is_back() {
    // Refused at once: five attempts (backing off from 200 ms) span more than 6 s.
    disconnect_mid_drain("cutoff", 5, |f, on| f.set_unreachable(on)).await;
}

/// The same with a black hole (requests accepted, never answered, until the path is back): once
/// the hub sees the cluster unreachable it sends nothing more there (the emulator counts a
/// request on arrival, so a held eviction would show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_black_holed_mid_drain_is_drained_only_once_it_is_back() {
    // Each attempt waits out the 2 s probe timeout: three span more than 6 s.
    disconnect_mid_drain("blackhole", 3, |f, on| f.set_blackhole(on)).await;
}

/// The drain of [`a_cluster_that_disconnects_mid_drain_is_drained_only_once_it_is_back`], the
/// cluster cut off by `cut`; the negative is judged once the hub has made `attempts` more attempts
/// to reach the cluster with nothing changing, enough to span more than the 5 s after which the
/// claim, held back while its cluster is not synced, is looked at again.
async fn disconnect_mid_drain(cluster: &str, attempts: u64, cut: impl Fn(&sim::apiserver::Faults, bool)) {
    let mut world = World::start(&[("team-a", cluster)], |i| quick_cke(i as u64)).await.unwrap();
    // The hub reaches the cluster through a relay that counts its connections: while the cluster
    // is cut off, each attempt of the hub to reach it again (a new client, so a new connection)
    // shows there, where the emulator sees none (refused connections) or only some (black hole).
    let relay = Relay::start(world.clusters[0].server.addr()).await;
    let mut kubeconfig = world.clusters[0].server.kubeconfig();
    kubeconfig.clusters[0].cluster.as_mut().unwrap().server = Some(format!("https://{}", relay.addr));
    world.put_secret("team-a", cluster, &serde_json::to_vec(&kubeconfig).unwrap()).await.unwrap();
    apply_pool(&world, |_| {}).await;
    world.start_hub();
    let (claim, node) = one_node(&world).await;
    let wl = world.clusters[0].client();
    let pods: Api<Pod> = Api::namespaced(wl.clone(), "default");
    pods.create(&PostParams::default(), &bound("guarded", &node, json!({}))).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(wl.clone(), "default");
    let pdb = json!({"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    wait_for("the pods running", NODE_UP, || async { running(&world, 0).await == 2 }).await;
    wait_for("the cluster reachable", NODE_UP, || async { reachable(&world).await.is_some_and(|(s, _)| s == "True") })
        .await;

    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let nodes: Api<Node> = Api::all(wl.clone());
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let group = group_of(&claim);
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    wait_for("the drain held by the budget", DRAIN, || async {
        !events_on(&world.clusters[0].client(), &node, "FailedDraining").await.is_empty()
            && deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "web-0")
    })
    .await;

    // The cut: once the hub has seen it, nothing more reaches the cluster.
    let server = &world.clusters[0].server;
    cut(&server.faults(), true);
    wait_for("the hub seeing the cluster unreachable", DRAIN, || async {
        reachable(&world).await.is_some_and(|(s, _)| s == "False")
    })
    .await;
    let requests = server.requests();
    let drain_writes = |r: &sim::apiserver::Requests| {
        (
            r.count("create", "pods/eviction"),
            r.count("delete", "pods"),
            r.count("delete", "nodegroups"),
            r.count("delete", "nodes"),
            r.count("patch", "nodes") + r.count("update", "nodes"),
        )
    };
    let before = drain_writes(&requests);
    let objects = || (server.object_count("api.clever-cloud.com", "nodegroups"), server.object_count("", "nodes"));
    let objects_before = objects();
    // Quiet: nothing moves there while the hub tried to reach the cluster `attempts` more times.
    let standing = || async {
        let c = claims.get_opt(&claim.name_any()).await.unwrap();
        let held = c.map(|c| {
            let finalizer = c.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER);
            (finalizer, condition(&c, "Drained").map(|(s, _)| s))
        });
        (drain_writes(&requests), objects(), held)
    };
    let (writes, objects_now, held) =
        wait_quiet_over("the cluster while it is cut off", DRAIN, attempts, standing, || async { relay.connections() })
            .await;
    assert_eq!(writes, before, "(evictions, pod, NodeGroup, Node deletions, Node writes) while unreachable");
    assert_eq!(objects_now, objects_before, "(NodeGroups, Nodes) while unreachable");
    let (finalizer, drained) = held.expect("the claim is not released while unreachable");
    assert!(finalizer, "the claim keeps its finalizer");
    assert_ne!(drained.as_deref(), Some("True"), "not Drained while unreachable");

    // Back: the drain picks up where it was (still held by the budget), then completes.
    cut(&server.faults(), false);
    wait_for("the hub seeing the cluster back", DRAIN, || async {
        reachable(&world).await.is_some_and(|(s, _)| s == "True")
    })
    .await;
    let evictions = requests.count("create", "pods/eviction");
    wait_for("the refused eviction retried after the outage", DRAIN, || async {
        requests.count("create", "pods/eviction") > evictions
    })
    .await;
    assert!(!deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "guarded"), "budget ignored");
    assert!(groups.get_opt(&group).await.unwrap().is_some_and(|g| g.metadata.deletion_timestamp.is_none()));
    pdbs.patch("guard", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    wait_for("the pod evicted, the Node and NodeGroup gone, the claim released", DRAIN, || async {
        deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "guarded")
            && nodes.get_opt(&node).await.unwrap().is_none()
            && groups.get_opt(&group).await.unwrap().is_none()
            && claims.get_opt(&claim.name_any()).await.unwrap().is_none()
    })
    .await;
    world.shutdown().await;
}

/// A TCP relay to `upstream` (an emulator: TLS passes through, its certificate names 127.0.0.1
/// whatever the port) that counts the connections made through it. A connection ends when either
/// side closes it, so the emulator's faults reach the client as they are.
struct Relay {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicU64::new(0));
        let counted = connections.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else { return };
                    let (mut from_client, mut to_client) = client.split();
                    let (mut from_server, mut to_server) = server.split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
                        _ = tokio::io::copy(&mut from_server, &mut to_client) => {}
                    }
                });
            }
        });
        Relay { addr, connections, accepting }
    }

    /// Connections accepted so far.
    fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// The hub on real control planes (issue 11 item 6): a management and a workload kube-apiserver
/// (kube-controller-manager computing PodDisruptionBudget status), `sim-cke` standing in for CKE
/// and the kubelets in the workload plane, registered as cluster `w0` of namespace `team-a` with
/// the example NodePool. Dropping it stops the planes.
struct RealPlanes {
    mgmt: kube::Client,
    wl: kube::Client,
    metrics: Arc<Metrics>,
    stop: tokio_util::sync::CancellationToken,
    hub: tokio::task::JoinHandle<()>,
    cke: tokio::task::JoinHandle<()>,
    _planes: (envtest::ControlPlane, envtest::ControlPlane),
}

impl RealPlanes {
    const NS: &str = "team-a";
    /// The cluster's key in the hub's metrics.
    const CLUSTER: &str = "team-a/w0";

    /// `None` when the test is skipped (no envtest assets, unless they are required).
    async fn start(name: &str) -> Option<RealPlanes> {
        use k8s_openapi::{
            ByteString,
            api::core::v1::{Namespace, Secret},
            apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        };
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        use operator::{commands::run, infra::hub, infra::registry};

        let start = |options: envtest::Options| match envtest::ControlPlane::start(&options) {
            Ok(cp) => Some(cp),
            Err(e) => {
                envtest::skip(&envtest::current_test(), &e);
                None
            }
        };
        let mgmt_plane = start(envtest::Options::new(format!("{name}-mgmt")))?;
        let workload_plane = start(envtest::Options::new(format!("{name}-workload")))?;
        let mgmt = mgmt_plane.client().await.unwrap();
        let wl = workload_plane.client().await.unwrap();

        // The hub's CRDs in the management plane, the NodeGroup stand-in CRD in the workload plane.
        let install = |client: kube::Client, crds: Vec<CustomResourceDefinition>| async move {
            let api: Api<CustomResourceDefinition> = Api::all(client.clone());
            for crd in &crds {
                api.create(&PostParams::default(), crd).await.unwrap();
            }
            for crd in &crds {
                let gv = format!("{}/{}", crd.spec.group, crd.spec.versions[0].name);
                let plural = crd.spec.names.plural.clone();
                wait_for(&format!("{plural} served"), NODE_UP, || async {
                    client
                        .list_api_group_resources(&gv)
                        .await
                        .is_ok_and(|s| s.resources.iter().any(|r| r.name == plural))
                })
                .await;
            }
        };
        install(mgmt.clone(), crds::crd::hub_crds().into_iter().map(|f| f.crd).collect()).await;
        install(wl.clone(), crds::crd::testing_crds().into_iter().map(|f| f.crd).collect()).await;

        // Registration (the workload plane's admin kubeconfig) and the example NodePool.
        Api::<Namespace>::all(mgmt.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": Self::NS}})).unwrap())
            .await
            .unwrap();
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "w0-kubeconfig", "labels": {registry::CLUSTER_NAME_LABEL: "w0"}},
            "type": "cluster.x-k8s.io/secret",
        }))
        .unwrap();
        let kubeconfig = std::fs::read(workload_plane.kubeconfig_path()).unwrap();
        secret.data = Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig))]));
        Api::<Secret>::namespaced(mgmt.clone(), Self::NS).create(&PostParams::default(), &secret).await.unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(EXAMPLE).unwrap();
        for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
            let kind = doc["kind"].as_str().unwrap().to_string();
            if kind == "NodePool" {
                doc["spec"]["clusterName"] = json!("w0");
            }
            let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
            let obj: DynamicObject = serde_json::from_value(doc).unwrap();
            Api::<DynamicObject>::namespaced_with(mgmt.clone(), Self::NS, &ar)
                .create(&PostParams::default(), &obj)
                .await
                .unwrap();
        }

        let stop = tokio_util::sync::CancellationToken::new();
        let (client, done) = (wl.clone(), stop.clone());
        let cke =
            tokio::spawn(async move { sim::cke::run(client, quick_cke(1), done.cancelled_owned()).await.unwrap() });
        let metrics = Arc::new(Metrics::new());
        let settings = hub::Settings { hub_id: format!("{name}-envtest"), ..hub::Settings::default() };
        let (client, shown, done) = (mgmt.clone(), metrics.clone(), stop.clone());
        let hub = tokio::spawn(async move {
            run::run_with(client, settings, registry::Settings::default(), shown, done).await.unwrap();
        });
        Some(RealPlanes { mgmt, wl, metrics, stop, hub, cke, _planes: (mgmt_plane, workload_plane) })
    }

    /// A pending pod (`web-0`) brings a node up: its claim once registered, and the Node's name.
    async fn one_node(&self) -> (NodeClaim, String) {
        let pods: Api<Pod> = Api::namespaced(self.wl.clone(), "default");
        let web = operator::commands::sandbox::world::workload_pod("web-0", "500m", "1Gi");
        pods.create(&PostParams::default(), &web).await.unwrap();
        registered_claim(&Api::namespaced(self.mgmt.clone(), Self::NS)).await
    }

    /// Stop the hub and `sim-cke` (both must end cleanly), then the planes.
    async fn stop(self) {
        self.stop.cancel();
        self.hub.await.unwrap();
        self.cke.await.unwrap();
    }
}

/// The hub's eviction requests for `cluster` (`karpenter_nodes_eviction_requests_total`), those
/// answered `result` (an HTTP status) or all of them.
fn eviction_requests(metrics: &Metrics, cluster: &str, result: Option<&str>) -> u64 {
    let prefix = format!("karpenter_nodes_eviction_requests_total{{cluster=\"{cluster}\",result=\"");
    metrics
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.split_once("\"} "))
        .filter(|(code, _)| result.is_none_or(|r| r == *code))
        .filter_map(|(_, n)| n.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The drain on real control planes ([`RealPlanes`]); §10.10 items 136 and 138. A NodeClaim
/// deleted: the ordinary pod is evicted, a budget with `minAvailable: 1` holds the guarded pod and
/// `karpenter.sh/do-not-disrupt` the precious one (and both the critical pod behind them, a later
/// tier) until they are relaxed, then those two go before the critical one, then the Node and the
/// NodeGroup, and the claim is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_runs_in_tier_order_within_budgets_on_real_api_servers() {
    let Some(planes) = RealPlanes::start("drain").await else { return };
    let (claim, node) = planes.one_node().await;
    let (wl, claims) = (planes.wl.clone(), Api::<NodeClaim>::namespaced(planes.mgmt.clone(), RealPlanes::NS));
    // The pods of the drain, bound to the node.
    let pods: Api<Pod> = Api::namespaced(wl.clone(), "default");
    pods.create(&PostParams::default(), &bound("guarded", &node, json!({}))).await.unwrap();
    let precious = json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}});
    pods.create(&PostParams::default(), &bound("precious", &node, precious)).await.unwrap();
    let critical = json!({"spec": {"priorityClassName": "system-node-critical"}});
    pods.create(&PostParams::default(), &bound("critical", &node, critical)).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(wl.clone(), "default");
    let pdb = json!({"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    let is_running = |list: &[Pod], name: &str| {
        list.iter()
            .any(|p| p.name_any() == name && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    };
    wait_for("the pods running", NODE_UP, || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        ["web-0", "guarded", "precious", "critical"].iter().all(|n| is_running(&list, n))
    })
    .await;
    wait_for("kube-controller-manager's budget status: one healthy, none allowed", NODE_UP, || async {
        pdbs.get("guard").await.unwrap().status.is_some_and(|s| s.current_healthy == 1 && s.disruptions_allowed == 0)
    })
    .await;

    let nodes: Api<Node> = Api::all(wl.clone());
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let group = group_of(&claim);
    assert!(groups.get_opt(&group).await.unwrap().is_some(), "the claim's NodeGroup {group}");
    claims.delete(&claim.name_any(), &DeleteParams::default()).await.unwrap();
    wait_for("the ordinary pod evicted", DRAIN, || async {
        deleting_or_gone(&pods.list(&ListParams::default()).await.unwrap().items, "web-0")
    })
    .await;
    // The budget holds the drain, and so does the do-not-disrupt pod: both stay with the later
    // tier, and so do the Node and the NodeGroup. Judged once the hub's own count of refused
    // evictions (kube-apiserver's 429s, one per drain pass that retried the guarded pod) has
    // grown QUIET_STEPS more times with nothing changing.
    let drain_state = || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let gone: Vec<&str> =
            ["guarded", "precious", "critical"].into_iter().filter(|n| deleting_or_gone(&list, n)).collect();
        let node_there = nodes.get_opt(&node).await.unwrap().is_some();
        let group_there =
            groups.get_opt(&group).await.unwrap().is_some_and(|g| g.metadata.deletion_timestamp.is_none());
        (gone, node_there, group_there)
    };
    let refused = || async { eviction_requests(&planes.metrics, RealPlanes::CLUSTER, Some("429")) };
    let (gone, node_there, group_there) =
        wait_quiet_over("the drain held on real API servers", DRAIN, QUIET_STEPS, drain_state, refused).await;
    assert!(gone.is_empty(), "{gone:?} went while the budget and do-not-disrupt allowed nothing");
    assert!(node_there, "the node went before its drain");
    assert!(group_there, "the NodeGroup went (or is going) before the drain");
    let blocking = Api::<Event>::namespaced(wl.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("FailedDraining"));
    assert!(blocking, "FailedDraining reported while the budget refuses");

    pdbs.patch("guard", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 0}}))).await.unwrap();
    let unprotect = json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: null}}});
    pods.patch("precious", &PatchParams::default(), &Patch::Merge(unprotect)).await.unwrap();
    // Sampled every 50 ms for the order in which they go.
    let went: RefCell<BTreeMap<String, tokio::time::Instant>> = RefCell::default();
    let drained = poll_every(Duration::from_millis(50), DRAIN, || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        for name in ["guarded", "precious", "critical"] {
            if deleting_or_gone(&list, name) {
                went.borrow_mut().entry(name.to_string()).or_insert_with(tokio::time::Instant::now);
            }
        }
        nodes.get_opt(&node).await.unwrap().is_none() && groups.get_opt(&group).await.unwrap().is_none()
    })
    .await;
    let went = went.into_inner();
    assert!(drained, "timed out draining; gone so far: {went:?}");
    let (g, p, c) = (went.get("guarded"), went.get("precious"), went.get("critical"));
    assert!(g.is_some() && c.is_some() && g < c, "the ordinary tier goes before the critical one: {went:?}");
    assert!(p.is_some() && p < c, "the released do-not-disrupt pod goes with its tier: {went:?}");
    // Evicted, not deleted: the hub's `Evicted` event on each pod.
    let evicted = evicted_pods(&wl).await;
    for name in ["web-0", "guarded", "precious", "critical"] {
        assert!(evicted.iter().any(|n| n == name), "no Evicted event on {name}: {evicted:?}");
    }
    wait_for("the claim released", DRAIN, || async { claims.get_opt(&claim.name_any()).await.unwrap().is_none() })
        .await;
    planes.stop().await;
}

/// The example pool, the hub, one pending pod, and the claim made for it once its `condition` is
/// True; with the claims' API.
async fn one_pod_one_claim(world: &mut World, condition_type: &str) -> (Api<NodeClaim>, NodeClaim) {
    apply_pool(world, |_| {}).await;
    world.start_hub();
    scale(world, 0, 1, "500m", "1Gi").await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[0].namespace);
    let with_condition = || async {
        let list = claims.list(&ListParams::default()).await.unwrap().items;
        list.into_iter().find(|c| condition(c, condition_type).is_some_and(|(s, _)| s == "True"))
    };
    wait_for(&format!("a claim with {condition_type}=True"), NODE_UP, || async { with_condition().await.is_some() })
        .await;
    let claim = with_condition().await.unwrap();
    (claims, claim)
}

/// The pods the hub's `Evicted` events name, in the workload cluster's `default` namespace.
async fn evicted_pods(workload: &kube::Client) -> Vec<String> {
    Api::<Event>::namespaced(workload.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect()
}
