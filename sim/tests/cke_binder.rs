//! The simulated CKE's binder and kubelet stand-in, through the API of the emulator: pending pods
//! land on nodes they fit and run; the others are marked Unschedulable the way kube-scheduler does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::Duration;

use cke_support::{World, node_ready};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sim::cke::SimCkeConfig;

const SEC: Duration = Duration::from_secs(1);
const NS: &str = "apps";

async fn create_pod(w: &World, name: &str, cpu: &str, memory: &str, node_selector: Value) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {
            "nodeSelector": node_selector,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
    }))
    .unwrap();
    w.pods(NS).create(&PostParams::default(), &pod).await.expect("create pod")
}

/// `(status, reason, message)` of the pod's PodScheduled condition.
fn scheduled(pod: &Pod) -> Option<(String, Option<String>, Option<String>)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn unschedulable_message(pod: &Pod) -> Option<String> {
    match scheduled(pod)? {
        (s, Some(r), Some(m)) if s == "False" && r == "Unschedulable" => Some(m),
        _ => None,
    }
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

#[tokio::test]
async fn binder_binds_fitting_pods_marks_the_rest_unschedulable_and_kubelet_runs_them() {
    let w = World::start(SimCkeConfig::default()).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(w.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let worker = json!({"clever-cloud.com/cluster-node-role": "worker"});

    // No worker yet: only the two control-plane nodes, which these pods do not select.
    create_pod(&w, "inflate", "1", "1500Mi", worker.clone()).await;
    create_pod(
        &w,
        "too-big",
        "1",
        "5Gi",
        json!({"clever-cloud.com/cluster-node-role": "worker", "clever-cloud.com/flavor": "2XS"}),
    )
    .await;
    let message = w
        .until("inflate unschedulable", Duration::ZERO, || async {
            unschedulable_message(&w.pods(NS).get("inflate").await.unwrap())
        })
        .await;
    assert_eq!(
        message,
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are \
         available: 2 Preemption is not helpful for scheduling."
    );

    // A pod without selector lands on a (schedulable) control-plane node and runs.
    create_pod(&w, "anywhere", "100m", "64Mi", json!({})).await;
    let anywhere = w
        .until("anywhere running", SEC, || async {
            Some(w.pods(NS).get("anywhere").await.unwrap()).filter(|p| phase(p) == Some("Running"))
        })
        .await;
    assert!(node_name(&anywhere).unwrap().starts_with("control-plane-"));

    // A worker arrives, tainted until the hub registers it: still no room for the pods.
    w.create_group("w", "2XS", json!({}), json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}])).await;
    w.until("worker Ready", SEC, || async { w.node("w-node0").await.filter(node_ready) }).await;
    let message = w
        .until("untolerated taint reported", Duration::ZERO, || async {
            let m = unschedulable_message(&w.pods(NS).get("inflate").await.unwrap())?;
            m.contains("untolerated taint {karpenter.sh/unregistered: }").then_some(m)
        })
        .await;
    assert!(message.starts_with("0/3 nodes are available: "), "{message}");
    assert!(node_name(&w.pods(NS).get("inflate").await.unwrap()).is_none());

    // The hub registers the node (removes the taint once the kubelet's not-ready taint is gone):
    // the fitting pod binds and runs there.
    w.until("only the unregistered taint left", SEC, || async {
        w.node("w-node0").await.filter(|n| cke_support::taint_keys(n) == ["karpenter.sh/unregistered"])
    })
    .await;
    w.nodes()
        .patch("w-node0", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": null}})))
        .await
        .unwrap();
    let inflate = w
        .until("inflate running on the worker", SEC, || async {
            Some(w.pods(NS).get("inflate").await.unwrap()).filter(|p| phase(p) == Some("Running"))
        })
        .await;
    assert_eq!(node_name(&inflate), Some("w-node0"));
    let node = w.node("w-node0").await.unwrap();
    let internal_ip = node.status.as_ref().unwrap().addresses.as_ref().unwrap()[0].address.clone();
    assert_eq!(inflate.status.as_ref().unwrap().host_ip.as_deref(), Some(internal_ip.as_str()));
    assert!(inflate.status.as_ref().unwrap().pod_ip.is_some());
    let ready =
        inflate.status.as_ref().unwrap().conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");

    // 5Gi does not fit a 2XS (3.63 GiB allocatable): stays Pending with kube-scheduler's reasons.
    let message = w
        .until("too-big insufficient memory", SEC, || async {
            let m = unschedulable_message(&w.pods(NS).get("too-big").await.unwrap())?;
            m.contains("Insufficient memory").then_some(m)
        })
        .await;
    assert_eq!(
        message,
        "0/3 nodes are available: 1 Insufficient memory, 2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not \
         helpful for scheduling."
    );
    let too_big = w.pods(NS).get("too-big").await.unwrap();
    assert!(node_name(&too_big).is_none());
    assert_eq!(phase(&too_big), Some("Pending"));
    w.stop().await;
}

#[tokio::test]
async fn pods_deleted_on_a_simulated_node_are_removed_by_its_kubelet() {
    let w = World::start(SimCkeConfig::default()).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(w.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    create_pod(&w, "p", "100m", "64Mi", json!({})).await;
    w.until("p running", SEC, || async {
        Some(w.pods(NS).get("p").await.unwrap()).filter(|p| phase(p) == Some("Running"))
    })
    .await;
    w.pods(NS).delete("p", &Default::default()).await.unwrap();
    w.until("p gone", SEC, || async { w.pods(NS).get_opt("p").await.unwrap().is_none().then_some(()) }).await;
    w.stop().await;
}

#[tokio::test]
async fn binder_and_kubelet_work_where_no_nodegroup_api_is_served() {
    // A bare API server, CRD installation off: the NodeGroup controller cannot sync, the rest runs.
    let server = sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::new("bare")).await.unwrap();
    let client = server.client();
    let config = SimCkeConfig { install_crd: false, ..SimCkeConfig::instant() };
    let cke = sim::cke::SimCke::new(client.clone(), config).spawn();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "pause"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = tokio::time::Instant::now() + cke_support::WALL_TIMEOUT;
    loop {
        let p = pods.get("p").await.unwrap();
        if phase(&p) == Some("Running") {
            assert!(node_name(&p).unwrap().starts_with("control-plane-"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "pod never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cke.stop().await.unwrap();
    server.shutdown().await;
}

/// With `control_plane.no_schedule` (kubeadm's convention), the control-plane Nodes carry the
/// `node-role.kubernetes.io/control-plane` label and `NoSchedule` taint: a workload pod that
/// selects nothing stays Unschedulable with kube-scheduler's reason, and only a pod that
/// tolerates the taint runs there. The default (CKE as measured, clever-cloud.md §1.7) keeps them
/// schedulable.
#[tokio::test]
async fn control_plane_nodes_refuse_untolerating_pods_when_configured_no_schedule() {
    let mut config = SimCkeConfig::default();
    config.control_plane.no_schedule = true;
    let w = World::start(config).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(w.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let cp = w.until("control-plane-0 ready", Duration::ZERO, || async { w.node("control-plane-0").await }).await;
    assert!(cp.metadata.labels.as_ref().unwrap().contains_key("node-role.kubernetes.io/control-plane"));
    assert_eq!(cke_support::taint_keys(&cp), vec!["node-role.kubernetes.io/control-plane".to_string()]);

    create_pod(&w, "plain", "100m", "64Mi", json!({})).await;
    let message = w
        .until("plain unschedulable", Duration::ZERO, || async {
            unschedulable_message(&w.pods(NS).get("plain").await.unwrap())
        })
        .await;
    assert!(
        message.starts_with(
            "0/2 nodes are available: 2 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }."
        ),
        "{message}"
    );

    let tolerating: Pod = serde_json::from_value(json!({
        "metadata": {"name": "tolerating", "namespace": NS},
        "spec": {
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .unwrap();
    w.pods(NS).create(&PostParams::default(), &tolerating).await.unwrap();
    let p = w
        .until("tolerating running", SEC, || async {
            Some(w.pods(NS).get("tolerating").await.unwrap()).filter(|p| phase(p) == Some("Running"))
        })
        .await;
    assert!(node_name(&p).unwrap().starts_with("control-plane-"));
    assert!(node_name(&w.pods(NS).get("plain").await.unwrap()).is_none(), "the plain pod was bound");
    w.stop().await;
}
