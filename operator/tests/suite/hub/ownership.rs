//! Ownership across management clusters on real API servers (hub.md §5; issue 23's first
//! finding): two management clusters, each with a hub on the same hub id (`default`) and a
//! registration of the same workload cluster in a namespace of the same name. Each hub's NodeGroups
//! carry every proof the other's hub checked before management identities existed; neither hub
//! deletes the other's, while each still collects an orphan of its own. And the declared move of a
//! cluster from one management cluster to the other (hub.md, "Moving a fleet").

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crds::{CleverNodeClass, NodeClaim, NodeGroup};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
};
use operator::{
    commands::run,
    decisions::{handover, ownership},
    infra::hub,
    infra::metrics::Metrics,
    infra::registry,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::{self, EXAMPLE, wait_for};

const NS: &str = "team-a";
const UP: Duration = Duration::from_secs(60);

async fn install(client: &Client, crds: Vec<CustomResourceDefinition>) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        api.create(&PostParams::default(), crd).await.unwrap();
    }
    for crd in &crds {
        let gv = format!("{}/{}", crd.spec.group, crd.spec.versions[0].name);
        let plural = crd.spec.names.plural.clone();
        wait_for(&format!("{plural} served"), UP, || async {
            client.list_api_group_resources(&gv).await.is_ok_and(|s| s.resources.iter().any(|r| r.name == plural))
        })
        .await;
    }
}

/// A management plane registering workload cluster `w0` (kubeconfig bytes) in [`NS`], with the
/// example pool and class.
async fn management(mgmt: &Client, kubeconfig: Vec<u8>) {
    fleet_objects(mgmt).await;
    register(mgmt, kubeconfig, json!({})).await;
}

/// The CRDs, namespace [`NS`] and the example pool (for `w0`) and class, without a registration.
async fn fleet_objects(mgmt: &Client) {
    install(mgmt, crds::crd::hub_crds().into_iter().map(|f| f.crd).collect()).await;
    Api::<Namespace>::all(mgmt.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap())
        .await
        .unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(EXAMPLE).unwrap();
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = doc["kind"].as_str().unwrap().to_string();
        if kind == "NodePool" {
            doc["spec"]["clusterName"] = json!("w0");
        }
        let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        Api::<DynamicObject>::namespaced_with(mgmt.clone(), NS, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
    }
}

/// The registration Secret of `w0` in [`NS`], with `annotations`.
async fn register(mgmt: &Client, kubeconfig: Vec<u8>, annotations: Value) {
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "w0-kubeconfig", "labels": {registry::CLUSTER_NAME_LABEL: "w0"}, "annotations": annotations},
        "type": "cluster.x-k8s.io/secret",
    }))
    .unwrap();
    secret.data = Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig))]));
    Api::<Secret>::namespaced(mgmt.clone(), NS).create(&PostParams::default(), &secret).await.unwrap();
}

/// Wait until the example node class in `mgmt` is Ready.
async fn class_ready(mgmt: &Client) {
    let classes = Api::<CleverNodeClass>::namespaced(mgmt.clone(), NS);
    wait_for("the node class Ready", UP, || async {
        classes
            .get("default")
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
    .await;
}

/// A NodeClaim in `mgmt`, launched by that management cluster's hub: the NodeGroup it made for
/// it, (name, UID).
async fn launched_group(mgmt: &Client, wl: &Client, name: &str) -> (String, String) {
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": NS, "labels": {"karpenter.sh/nodepool": "default"}},
        "spec": {"clusterName": "w0", "requirements": [], "resources": {},
                 "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}
    }))
    .unwrap();
    let claims = Api::<NodeClaim>::namespaced(mgmt.clone(), NS);
    claims.create(&PostParams::default(), &claim).await.unwrap();
    // The launch waits for CKE's verdict (none comes here) up to 15 s, then goes on.
    let launched = || async { claims.get(name).await.ok().and_then(|c| c.status.and_then(|s| s.provider_id)) };
    wait_for(&format!("{name} launched"), UP, || async { launched().await.is_some() }).await;
    let group = ownership::parse_provider_id(&launched().await.unwrap()).unwrap().to_string();
    let uid = Api::<NodeGroup>::all(wl.clone()).get(&group).await.unwrap().uid().unwrap();
    (group, uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_management_clusters_hubs_on_one_hub_id_never_collect_each_other_s_groups_on_real_api_servers() {
    let start = |name: &str| match envtest::ControlPlane::start(&envtest::Options::new(name)) {
        Ok(cp) => Some(cp),
        Err(e) => {
            envtest::skip(&envtest::current_test(), &e);
            None
        }
    };
    let Some(workload_plane) = start("owners-workload") else { return };
    let Some(first_plane) = start("owners-mgmt-1") else { return };
    let Some(second_plane) = start("owners-mgmt-2") else { return };
    let wl = workload_plane.client().await.unwrap();
    install(&wl, crds::crd::testing_crds().into_iter().map(|f| f.crd).collect()).await;
    let kubeconfig = std::fs::read(workload_plane.kubeconfig_path()).unwrap();
    let planes = [first_plane.client().await.unwrap(), second_plane.client().await.unwrap()];
    let mut ids = Vec::new();
    for mgmt in &planes {
        management(mgmt, kubeconfig.clone()).await;
        ids.push(common::management_cluster(mgmt).await);
    }
    assert_ne!(ids[0], ids[1], "two control planes, two identities");

    // Both hubs on hub id `default`, sweeping every second for groups older than a second.
    let stop = CancellationToken::new();
    let mut hubs = Vec::new();
    for mgmt in &planes {
        let settings = hub::Settings {
            gc_min_age: Duration::from_secs(1),
            gc_period: Duration::from_secs(1),
            ..hub::Settings::default()
        };
        let (client, done) = (mgmt.clone(), stop.clone());
        hubs.push(tokio::spawn(async move {
            run::run_with(client, settings, registry::Settings::default(), Arc::new(Metrics::new()), done)
                .await
                .unwrap();
        }));
    }
    // Each hub's groups: one it launched for a claim of its own, and an orphan (its claim never
    // was). Claim names differ between the two sides: equal ones would derive one group name.
    let mut live = Vec::new();
    let mut orphans = Vec::new();
    for (i, mgmt) in planes.iter().enumerate() {
        class_ready(mgmt).await;
        live.push(launched_group(mgmt, &wl, &format!("default-live{i}")).await);
    }
    // Then the orphans: the sweep that collects one judges both hubs' launched groups too.
    for (i, me) in ids.iter().enumerate() {
        let orphan = (format!("default-gone{i}"), format!("5a1c0a57-0000-4000-8000-00000000040{i}"));
        orphans.push(common::claimed_looking_group(&wl, ("default", me), NS, (&orphan.0, &orphan.1), "2XS", 1).await);
    }
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let present =
        |name: String, uid: String| {
            let groups = groups.clone();
            async move {
                groups.get_opt(&name).await.unwrap().is_some_and(|g| {
                    g.uid().as_deref() == Some(uid.as_str()) && g.metadata.deletion_timestamp.is_none()
                })
            }
        };
    // Each hub collects its own orphan: the sweep that did judged every group of the cluster, the
    // other hub's included (older than the orphan, so past the minimum age too).
    for (name, uid) in &orphans {
        wait_for(&format!("{name} collected"), UP, || async { !present(name.clone(), uid.clone()).await }).await;
    }
    for (name, uid) in &live {
        assert!(present(name.clone(), uid.clone()).await, "NodeGroup {name} was deleted or replaced");
    }
    let left = groups.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(left.len(), 2, "{:?}", left.iter().map(|g| g.name_any()).collect::<Vec<_>>());
    for (g, me) in left.iter().map(|g| (g, g.labels().get(crds::labels::MANAGEMENT_CLUSTER))) {
        assert!(me.is_some_and(|m| ids.contains(m)), "{} names no management cluster of this test", g.name_any());
    }
    stop.cancel();
    for h in hubs {
        h.await.unwrap();
    }
}

/// The value of gauge `name` for cluster `team-a/w0` in `metrics`, if exported.
fn gauge(metrics: &Metrics, name: &str) -> Option<i64> {
    metrics
        .render()
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("\"{NS}/w0\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// hub.md, "Moving a fleet to another management cluster", step by step on three real API servers:
/// the source's hub pauses, its NodeClaim leaves it as `clusterctl move` removes objects
/// (finalizers dropped, deleted); the target's registration names the source, is refused while it
/// names another hub id, then keeps the moved group untouched until the claim's copy arrives, and
/// takes it over by re-stamping it. One NodeGroup, same UID, from start to end: nothing deleted,
/// nothing duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_moved_to_another_management_cluster_keeps_its_node_groups_on_real_api_servers() {
    let start = |name: &str| match envtest::ControlPlane::start(&envtest::Options::new(name)) {
        Ok(cp) => Some(cp),
        Err(e) => {
            envtest::skip(&envtest::current_test(), &e);
            None
        }
    };
    let Some(workload_plane) = start("move-workload") else { return };
    let Some(source_plane) = start("move-source") else { return };
    let Some(target_plane) = start("move-target") else { return };
    let wl = workload_plane.client().await.unwrap();
    install(&wl, crds::crd::testing_crds().into_iter().map(|f| f.crd).collect()).await;
    let kubeconfig = std::fs::read(workload_plane.kubeconfig_path()).unwrap();
    let (source, target) = (source_plane.client().await.unwrap(), target_plane.client().await.unwrap());
    management(&source, kubeconfig.clone()).await;
    fleet_objects(&target).await;
    let (source_id, target_id) = (common::management_cluster(&source).await, common::management_cluster(&target).await);

    // Both hubs on hub id `default` (a moved fleet keeps its hub id), sweeping every second for
    // groups older than a second: an orphan would be collected within seconds.
    let stop = CancellationToken::new();
    let settings = || hub::Settings {
        gc_min_age: Duration::from_secs(1),
        gc_period: Duration::from_secs(1),
        verdict_timeout: Duration::from_secs(2),
        ..hub::Settings::default()
    };
    let target_metrics = Arc::new(Metrics::new());
    let mut hubs = Vec::new();
    for (mgmt, metrics) in [(source.clone(), Arc::new(Metrics::new())), (target.clone(), target_metrics.clone())] {
        let (done, settings) = (stop.clone(), settings());
        hubs.push(tokio::spawn(async move {
            run::run_with(mgmt, settings, registry::Settings::default(), metrics, done).await.unwrap();
        }));
    }
    class_ready(&source).await;
    let (group, group_uid) = launched_group(&source, &wl, "default-moving").await;
    let groups: Api<NodeGroup> = Api::all(wl.clone());
    let the_one_group = || async {
        let all = groups.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(all.len(), 1, "one NodeGroup: {:?}", all.iter().map(|g| g.name_any()).collect::<Vec<_>>());
        let g = all.into_iter().next().unwrap();
        assert_eq!((g.name_any(), g.uid().unwrap()), (group.clone(), group_uid.clone()), "the same NodeGroup");
        assert!(g.metadata.deletion_timestamp.is_none(), "{group} is being deleted");
        g
    };

    // 1. Pause the source (the Secret's annotation; clusterctl sets the Cluster's spec.paused).
    let source_secrets = Api::<Secret>::namespaced(source.clone(), NS);
    let pause = json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": "true"}}});
    source_secrets.patch("w0-kubeconfig", &PatchParams::default(), &Patch::Merge(&pause)).await.unwrap();
    common::wait_reachable(&source, NS, "False", "Paused", UP).await;
    // 2. The claim leaves the source as clusterctl removes what it moved: finalizers dropped, then
    //    deleted. A running hub would now collect the group as an orphan; a paused one does not.
    let source_claims = Api::<NodeClaim>::namespaced(source.clone(), NS);
    let copy = source_claims.get("default-moving").await.unwrap();
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    source_claims.patch("default-moving", &PatchParams::default(), &Patch::Merge(&no_finalizers)).await.unwrap();
    source_claims.delete("default-moving", &DeleteParams::default()).await.unwrap();
    wait_for("the source's claim gone", UP, || async {
        source_claims.get_opt("default-moving").await.unwrap().is_none()
    })
    .await;

    // 3. The target's registration names the source, first with the wrong hub id: refused, no action.
    register(&target, kubeconfig, json!({handover::MOVED_FROM_ANNOTATION: format!("other-hub/{source_id}")})).await;
    common::wait_reachable(&target, NS, "False", "HandoverRefused", UP).await;
    let target_secrets = Api::<Secret>::namespaced(target.clone(), NS);
    let right = json!({"metadata": {"annotations": {handover::MOVED_FROM_ANNOTATION: format!("default/{source_id}")}}});
    target_secrets.patch("w0-kubeconfig", &PatchParams::default(), &Patch::Merge(&right)).await.unwrap();
    // Its sweeps see the group awaiting its claim, and keep it.
    wait_for("the target's sweep sees the moved group", UP, || async {
        gauge(&target_metrics, "karpenter_hub_nodegroup_awaiting_handover") == Some(1)
    })
    .await;
    the_one_group().await;

    // 4. The claim's copy arrives (no status: a create drops it): the target takes the group over.
    let target_claims = Api::<NodeClaim>::namespaced(target.clone(), NS);
    let arrived: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "default-moving", "namespace": NS, "labels": copy.metadata.labels},
        "spec": copy.spec,
    }))
    .unwrap();
    let new_uid = target_claims.create(&PostParams::default(), &arrived).await.unwrap().uid().unwrap();
    assert_ne!(new_uid, copy.uid().unwrap());
    wait_for("the group re-stamped as the target's", UP, || async {
        let g = groups.get(&group).await.unwrap();
        g.labels().get(crds::labels::MANAGEMENT_CLUSTER) == Some(&target_id)
            && g.annotations().get(crds::labels::NODECLAIM_UID) == Some(&new_uid)
    })
    .await;
    wait_for("the claim's copy launched on the moved group", UP, || async {
        target_claims.get("default-moving").await.ok().and_then(|c| c.status).and_then(|s| s.provider_id)
            == Some(ownership::provider_id(&group))
    })
    .await;

    // 5. The source's registration goes; the target's sweeps find nothing left to take over.
    source_secrets.delete("w0-kubeconfig", &DeleteParams::default()).await.unwrap();
    wait_for("nothing awaits a handover", UP, || async {
        gauge(&target_metrics, "karpenter_hub_nodegroup_awaiting_handover") == Some(0)
    })
    .await;
    let g = the_one_group().await;
    assert_eq!(g.labels().get(crds::labels::MANAGEMENT_CLUSTER), Some(&target_id));
    stop.cancel();
    for h in hubs {
        h.await.unwrap();
    }
}
