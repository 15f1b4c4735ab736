//! One workload cluster registered twice (issue 13 item 8): the hub identifies a cluster by the UID
//! of its `kube-system` namespace, so a second registration of it in the same namespace, under
//! another name, is refused (`ClusterReachable` False / `DuplicateCluster` naming the first, an
//! event on its Secret and on its NodePool) and gets no claims, while the first keeps working;
//! deleting the first registration hands the cluster to the second. On the API emulator and on a
//! real kube-apiserver (envtest) as the workload cluster.
//!
//! And the hijack of issue 23: namespaces never compete for a cluster, so a tenant's older Secret
//! naming a server that answers another tenant's `kube-system` UID takes nothing away from that
//! tenant, and nothing the other tenant sees names the first one's objects.
//!
//! And Cluster API's pause read from a `Cluster` on a real kube-apiserver as the management cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::{core::v1::Pod, events::v1::Event},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use sim::apiserver::{ApiServer, ApiServerConfig};
use tokio_util::sync::CancellationToken;

use common::{EXAMPLE, poll_until, wait_for};
use crds::{NodeClaim, NodePool};
use operator::{
    commands::{
        register_cluster, run,
        sandbox::world::{quick_cke, workload_pod},
    },
    infra::{hub, manifests, metrics::Metrics, registry},
};

const WAIT: Duration = Duration::from_secs(60);
/// A label only the second registration's NodePool gives its nodes.
const SECOND_ONLY: &str = "example.com/registration";

/// The `ClusterReachable` condition of NodePool `pool` as `(status, reason, message)`.
async fn reachable(mgmt: &Client, ns: &str, pool: &str) -> Option<(String, String, String)> {
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), ns).get_opt(pool).await.ok()??;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.status, c.reason, c.message))
}

/// The NodeClaims in `ns` for cluster `cluster`.
async fn claims(mgmt: &Client, ns: &str, cluster: &str) -> Vec<NodeClaim> {
    let all = Api::<NodeClaim>::namespaced(mgmt.clone(), ns).list(&ListParams::default()).await.unwrap().items;
    all.into_iter().filter(|c| c.spec.cluster_name == cluster).collect()
}

/// Reasons of the events about object `name` in namespace `ns` of the management cluster.
async fn event_reasons(mgmt: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(mgmt.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

/// Register the workload cluster reached by `kubeconfig` as `<ns>/<cluster>` with the example's
/// node class and a NodePool named after the cluster (`labels` on its nodes).
async fn register(mgmt: &Client, ns: &str, cluster: &str, kubeconfig: &[u8], labels: Value) {
    manifests::ensure_namespace(mgmt, ns).await.unwrap();
    register_cluster::write_secret(mgmt, ns, cluster, kubeconfig.to_vec()).await.unwrap();
    for mut doc in manifests::documents("examples/general-purpose.yaml", EXAMPLE).unwrap() {
        if doc["kind"] == "NodePool" {
            doc["metadata"]["name"] = json!(cluster);
            doc["spec"]["clusterName"] = json!(cluster);
            doc["spec"]["template"]["metadata"] = json!({"labels": labels});
        }
        manifests::apply_value(mgmt, &doc, ns, "examples/general-purpose.yaml").await.unwrap();
    }
}

/// The whole story against one workload cluster, whatever serves it, played by a simulated CKE
/// (which also schedules its pods). `pods_ns` is a namespace of the workload cluster for this
/// run's pods.
async fn registered_twice(workload: Client, kubeconfig: Vec<u8>, pods_ns: &str) {
    let cke = CancellationToken::new();
    let (client, stop) = (workload.clone(), cke.clone());
    tokio::spawn(async move { sim::cke::run(client, quick_cke(1), stop.cancelled_owned()).await });
    let _stop_cke = cke.drop_guard();
    let mgmt_server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let mgmt = mgmt_server.client();
    manifests::ensure_namespace(&workload, pods_ns).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(workload.clone(), pods_ns);
    let mut pod = workload_pod("web-0", "1", "1Gi");
    pod.metadata.namespace = Some(pods_ns.to_string());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // Only the second registration's pool could place this one.
    let mut only_second = workload_pod("only-second", "1", "1Gi");
    only_second.metadata.namespace = Some(pods_ns.to_string());
    if let Some(spec) = only_second.spec.as_mut() {
        spec.node_selector.get_or_insert_default().insert(SECOND_ONLY.to_string(), "second".to_string());
    }
    pods.create(&PostParams::default(), &only_second).await.unwrap();

    register(&mgmt, "team-a", "alpha", &kubeconfig, json!({})).await;
    let shutdown = CancellationToken::new();
    let settings = registry::Settings {
        probe_interval: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(2),
        ..registry::Settings::default()
    };
    let hub = tokio::spawn(run::run_with(
        mgmt.clone(),
        hub::Settings::default(),
        settings,
        Arc::new(Metrics::new()),
        shutdown.clone(),
    ));
    let _stop = shutdown.clone().drop_guard();
    wait_for("team-a/alpha connected", WAIT, || async {
        reachable(&mgmt, "team-a", "alpha").await.is_some_and(|(s, r, _)| s == "True" && r == "Connected")
    })
    .await;

    // The same cluster again, under another name in the same namespace.
    register(&mgmt, "team-a", "alpha-again", &kubeconfig, json!({SECOND_ONLY: "second"})).await;
    let seen = poll_until(WAIT, || async {
        reachable(&mgmt, "team-a", "alpha-again").await.is_some_and(|(s, r, _)| s == "False" && r == "DuplicateCluster")
    })
    .await;
    let refused = reachable(&mgmt, "team-a", "alpha-again").await;
    assert!(seen, "the second registration is refused as a duplicate; its pool shows {refused:?}");
    let (_, _, message) = refused.unwrap();
    assert!(
        message.contains("cluster alpha (Secret alpha-kubeconfig)") && message.contains("kube-system UID"),
        "the refusal names the first registration and what identified the cluster: {message}"
    );
    wait_for("a DuplicateCluster event on the second registration's Secret", WAIT, || async {
        event_reasons(&mgmt, "team-a", "alpha-again-kubeconfig").await.iter().any(|r| r == "DuplicateCluster")
    })
    .await;
    wait_for("a DuplicateCluster event on the second registration's NodePool", WAIT, || async {
        event_reasons(&mgmt, "team-a", "alpha-again").await.iter().any(|r| r == "DuplicateCluster")
    })
    .await;

    // The first keeps working: it provisions for the pending pod it can place.
    wait_for("a claim of the first registration", WAIT, || async {
        !claims(&mgmt, "team-a", "alpha").await.is_empty()
    })
    .await;
    // The second provisions nothing, not even for the pod only its pool could place, and stays
    // refused while the first works (a few probe rounds).
    let refused_throughout = !poll_until(Duration::from_secs(6), || async {
        !claims(&mgmt, "team-a", "alpha-again").await.is_empty()
            || reachable(&mgmt, "team-a", "alpha-again").await.is_none_or(|(_, r, _)| r != "DuplicateCluster")
    })
    .await;
    assert!(refused_throughout, "the duplicate registration made claims or stopped being refused");
    assert_eq!(
        reachable(&mgmt, "team-a", "alpha").await.map(|(s, r, _)| (s, r)),
        Some(("True".into(), "Connected".into())),
        "the first registration stays connected"
    );

    // Removing the first registration hands the cluster over to the second.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(mgmt.clone(), "team-a");
    secrets.delete("alpha-kubeconfig", &DeleteParams::default()).await.unwrap();
    wait_for("the second registration connected after the first was deleted", WAIT, || async {
        reachable(&mgmt, "team-a", "alpha-again").await.is_some_and(|(s, r, _)| s == "True" && r == "Connected")
    })
    .await;
    wait_for("a claim of the second registration for the pod only it can place", WAIT, || async {
        !claims(&mgmt, "team-a", "alpha-again").await.is_empty()
    })
    .await;
    assert_eq!(
        reachable(&mgmt, "team-a", "alpha").await.map(|(s, r, _)| (s, r)),
        Some(("False".into(), "SecretMissing".into())),
        "the first registration's pool reports its Secret gone"
    );

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), hub).await;
    let _ = pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    mgmt_server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_registered_twice_on_the_emulator_gets_claims_from_its_first_registration_only() {
    let workload = ApiServer::start(ApiServerConfig::workload("alpha").with_seed(3)).await.unwrap();
    let kubeconfig = serde_json::to_vec(&workload.kubeconfig()).unwrap();
    registered_twice(workload.client(), kubeconfig, "default").await;
    workload.shutdown().await;
}

/// A hub (re)started with both registrations present: the older Secret speaks for the cluster
/// whichever connects first (here the younger is listed, so started, first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_start_the_older_registration_speaks_for_the_cluster_whichever_connects_first() {
    let workload = ApiServer::start(ApiServerConfig::workload("alpha").with_seed(4)).await.unwrap();
    let kubeconfig = serde_json::to_vec(&workload.kubeconfig()).unwrap();
    let cke = CancellationToken::new();
    let (client, stop) = (workload.client(), cke.clone());
    tokio::spawn(async move { sim::cke::run(client, quick_cke(1), stop.cancelled_owned()).await });
    let _stop_cke = cke.drop_guard();
    let mgmt_server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let mgmt = mgmt_server.client();
    register(&mgmt, "team-z", "older", &kubeconfig, json!({})).await;
    // Creation times have a one-second resolution: the next registration is a second younger.
    common::a_second_after_the_secret(&mgmt, "team-z", "older-kubeconfig").await;
    register(&mgmt, "team-z", "younger", &kubeconfig, json!({})).await;
    let mut pod = workload_pod("web-0", "1", "1Gi");
    pod.metadata.namespace = Some("default".into());
    Api::<Pod>::namespaced(workload.client(), "default").create(&PostParams::default(), &pod).await.unwrap();

    let shutdown = CancellationToken::new();
    let hub = tokio::spawn(run::run_with(
        mgmt.clone(),
        hub::Settings::default(),
        registry::Settings { reconnect_min: Duration::from_millis(200), ..registry::Settings::default() },
        Arc::new(Metrics::new()),
        shutdown.clone(),
    ));
    wait_for("the older registration connected and the younger refused", WAIT, || async {
        let older = reachable(&mgmt, "team-z", "older").await;
        let younger = reachable(&mgmt, "team-z", "younger").await;
        older.is_some_and(|(s, r, _)| s == "True" && r == "Connected")
            && younger.is_some_and(|(_, r, m)| r == "DuplicateCluster" && m.contains("cluster older"))
    })
    .await;
    wait_for("a claim of the older registration", WAIT, || async {
        !claims(&mgmt, "team-z", "older").await.is_empty()
    })
    .await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), hub).await;
    mgmt_server.shutdown().await;
    workload.shutdown().await;
}

/// Serve the NodeGroup API on a real control plane (the test CRD, as on a cluster without CKE).
async fn serve_nodegroups(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in crds::crd::testing_crds() {
        match crds.create(&PostParams::default(), &file.crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating CRD {}: {e}", file.crd.name_any()),
        }
    }
    wait_for("nodegroups served", WAIT, || async {
        client
            .list_api_group_resources("api.clever-cloud.com/v1")
            .await
            .is_ok_and(|l| l.resources.iter().any(|r| r.name == "nodegroups"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_registered_twice_on_a_real_api_server_gets_claims_from_its_first_registration_only() {
    let cp = envtest::shared_or_skip!("registry");
    let admin = cp.client().await.unwrap();
    serve_nodegroups(&admin).await;
    let kubeconfig = std::fs::read(cp.kubeconfig_path()).unwrap();
    registered_twice(admin, kubeconfig, "registered-twice").await;
}

/// The events in namespace `ns` of the management cluster, as `(regarding name, reason, note)`.
async fn events(mgmt: &Client, ns: &str) -> Vec<(String, String, String)> {
    Api::<Event>::namespaced(mgmt.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            let regarding = e.regarding.and_then(|r| r.name).unwrap_or_default();
            (regarding, e.reason.unwrap_or_default(), e.note.unwrap_or_default())
        })
        .collect()
}

/// The hijack of issue 23: team-a's Secret, older than team-b's, names a server of its own that
/// answers with the `kube-system` UID of team-b's cluster (here an emulator started with the same
/// seed, so its UID is the same). Before, the one-registration-per-cluster table was shared by
/// every namespace: team-b's real registration became `DuplicateCluster`, and its message named
/// team-a's namespace and Secret. Namespaces do not compete: team-b's registration connects and
/// stays connected, and nothing team-b can read names team-a's objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_take_another_namespaces_cluster_by_answering_its_uid() {
    let real = ApiServer::start(ApiServerConfig::workload("prod").with_seed(23)).await.unwrap();
    let fake = ApiServer::start(ApiServerConfig::workload("fake").with_seed(23)).await.unwrap();
    let uid = |server: &ApiServer| {
        let client = server.client();
        async move {
            Api::<k8s_openapi::api::core::v1::Namespace>::all(client).get("kube-system").await.unwrap().metadata.uid
        }
    };
    let victim_uid = uid(&real).await;
    assert!(victim_uid.is_some() && victim_uid == uid(&fake).await, "the fake server answers the victim's UID");

    let mgmt_server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let mgmt = mgmt_server.client();
    register(&mgmt, "team-a", "fake", &serde_json::to_vec(&fake.kubeconfig()).unwrap(), json!({})).await;
    // Creation times have a one-second resolution: team-b's Secret is a second younger.
    common::a_second_after_the_secret(&mgmt, "team-a", "fake-kubeconfig").await;
    register(&mgmt, "team-b", "prod", &serde_json::to_vec(&real.kubeconfig()).unwrap(), json!({})).await;

    let shutdown = CancellationToken::new();
    let hub = tokio::spawn(run::run_with(
        mgmt.clone(),
        hub::Settings::default(),
        registry::Settings {
            probe_interval: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(2),
            ..registry::Settings::default()
        },
        Arc::new(Metrics::new()),
        shutdown.clone(),
    ));
    let _stop = shutdown.clone().drop_guard();
    let connected = |ns: &'static str, pool: &'static str| {
        let mgmt = mgmt.clone();
        async move { reachable(&mgmt, ns, pool).await.is_some_and(|(s, r, _)| s == "True" && r == "Connected") }
    };
    let both =
        poll_until(WAIT, || async { connected("team-b", "prod").await && connected("team-a", "fake").await }).await;
    assert!(
        both,
        "team-b's registration (and team-a's, to its own server) connected; team-b's pool shows {:?}",
        reachable(&mgmt, "team-b", "prod").await
    );
    // And stays so over several probe rounds and identity checks.
    let lost = poll_until(Duration::from_secs(5), || async { !connected("team-b", "prod").await }).await;
    assert!(!lost, "team-b's registration lost its cluster: {:?}", reachable(&mgmt, "team-b", "prod").await);

    // Nothing team-b reads names team-a's namespace or objects.
    let (_, _, message) = reachable(&mgmt, "team-b", "prod").await.unwrap();
    let seen = events(&mgmt, "team-b").await;
    assert!(seen.iter().any(|(_, r, _)| r == "Connected"), "team-b's events were read: {seen:?}");
    for text in std::iter::once(&message).chain(seen.iter().map(|(_, _, note)| note)) {
        assert!(!text.contains("team-a") && !text.contains("fake"), "team-b is shown team-a's objects: {text}");
    }
    assert!(
        !seen.iter().any(|(_, r, _)| r == "DuplicateCluster"),
        "team-b's registration was refused as a duplicate at some point: {seen:?}"
    );

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), hub).await;
    mgmt_server.shutdown().await;
    real.shutdown().await;
    fake.shutdown().await;
}

/// Cluster API's `Cluster` served by the real server of `admin` (the CRD installed once for the
/// binary's shared control plane), namespace `ns` there, and an emulated workload cluster registered
/// there as `cluster`: the `Cluster`s of `ns`, and the workload server (dropped, it stops).
async fn registered_beside_cluster_api(
    admin: &Client,
    ns: &str,
    cluster: &str,
) -> (Api<kube::api::DynamicObject>, ApiServer) {
    use kube::api::{ApiResource, GroupVersionKind};
    let crd: CustomResourceDefinition = serde_json::from_value(common::cluster_api_cluster_crd()).unwrap();
    match Api::<CustomResourceDefinition>::all(admin.clone()).create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the Cluster CRD: {e}"),
    }
    wait_for("clusters.cluster.x-k8s.io served", WAIT, || async {
        admin
            .list_api_group_resources("cluster.x-k8s.io/v1beta1")
            .await
            .is_ok_and(|l| l.resources.iter().any(|r| r.name == "clusters"))
    })
    .await;
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    match Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {ns}: {e}"),
    }
    let workload = ApiServer::start(ApiServerConfig::workload(cluster)).await.unwrap();
    register_cluster::write_secret(admin, ns, cluster, serde_json::to_vec(&workload.kubeconfig()).unwrap())
        .await
        .unwrap();
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster"), "clusters");
    (Api::namespaced_with(admin.clone(), ns, &ar), workload)
}

/// A registry watching the registrations of namespace `ns` of `admin`'s management cluster, and
/// the token that stops it.
fn watching(admin: &Client, ns: &str) -> (registry::Registry, CancellationToken) {
    let registry = registry::Registry::new(registry::Settings {
        namespace: Some(ns.to_string()),
        reconnect_min: Duration::from_millis(200),
        ..registry::Settings::default()
    });
    let shutdown = CancellationToken::new();
    let (r, client, stop) = (registry.clone(), admin.clone(), shutdown.clone());
    tokio::spawn(async move { r.run(client, stop).await });
    (registry, shutdown)
}

/// Cluster API's pause with a real kube-apiserver as the management cluster (envtest): a minimal
/// `clusters.cluster.x-k8s.io` (v1beta1, any fields) installed there, a registration of an emulated
/// workload cluster and a `Cluster` of the same name. `spec.paused: true`: `Paused` naming the
/// Cluster and no connection for controllers; `false`: connected; the annotation pauses it again,
/// and deleting the Cluster resumes it. Real discovery and a real watch of a custom resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_api_cluster_pauses_its_cluster_on_a_real_api_server() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    let cp = envtest::shared_or_skip!("registry");
    let admin = cp.client().await.unwrap();
    let ns = "capi-pause";
    let (clusters, _workload) = registered_beside_cluster_api(&admin, ns, "alpha").await;
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "alpha", "namespace": ns}, "spec": {"paused": true}
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &cluster).await.unwrap();

    let (registry, shutdown) = watching(&admin, ns);
    let key = registry::ClusterKey::new(ns, "alpha");
    let paused = |registry: &registry::Registry, what: &str| {
        let s = registry.status(&key);
        s.phase == registry::Phase::Paused && s.message.contains(what) && registry.connection(&key).is_none()
    };
    let connected = |registry: &registry::Registry| {
        registry.status(&key).phase == registry::Phase::Connected
            && registry.connection(&key).is_some_and(|c| c.is_synced())
    };
    wait_for("paused by spec.paused", WAIT, || async { paused(&registry, "Cluster capi-pause/alpha has spec.paused") })
        .await;
    clusters.patch("alpha", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}}))).await.unwrap();
    wait_for("resumed", WAIT, || async { connected(&registry) }).await;
    clusters
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
        )
        .await
        .unwrap();
    wait_for("paused by the annotation", WAIT, || async { paused(&registry, "carries the annotation") }).await;
    clusters.delete("alpha", &DeleteParams::default()).await.unwrap();
    wait_for("resumed once the Cluster is deleted", WAIT, || async { connected(&registry) }).await;
    shutdown.cancel();
}

/// A registered cluster's labels (fleet.md §1) with a real kube-apiserver as the management
/// cluster: its Secret's, over those of the Cluster API `Cluster` of the same name (the Secret's
/// value wins on a key both set); each change is seen within seconds and keeps the cluster's
/// connection (only a new kubeconfig makes a new one); the `Cluster` deleted, its labels go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_s_labels_are_its_secret_s_over_its_cluster_s_and_change_without_a_reconnect_on_a_real_api_server() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{DynamicObject, Patch, PatchParams};
    let cp = envtest::shared_or_skip!("registry");
    let admin = cp.client().await.unwrap();
    let ns = "capi-labels";
    let (clusters, _workload) = registered_beside_cluster_api(&admin, ns, "beta").await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let label_secret = |labels: Value| {
        let secrets = secrets.clone();
        async move {
            let patch = Patch::Merge(json!({"metadata": {"labels": labels}}));
            secrets.patch("beta-kubeconfig", &PatchParams::default(), &patch).await.unwrap();
        }
    };
    label_secret(json!({"env": "prod", "tier": "gold"})).await;

    let (registry, shutdown) = watching(&admin, ns);
    let key = registry::ClusterKey::new(ns, "beta");
    let expect = |pairs: &[(&str, &str)]| -> registry::Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([(registry::CLUSTER_NAME_LABEL.to_string(), "beta".to_string())])
            .collect()
    };
    wait_for("the Secret's labels", WAIT, || async {
        registry.labels(&key) == expect(&[("env", "prod"), ("tier", "gold")])
    })
    .await;
    wait_for("connected", WAIT, || async { registry.connection(&key).is_some_and(|c| c.is_synced()) }).await;
    let connection = registry.connection(&key).unwrap();

    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "beta", "namespace": ns, "labels": {"env": "staging", "region": "par"}}, "spec": {}
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &cluster).await.unwrap();
    wait_for("the Cluster's labels under the Secret's", WAIT, || async {
        registry.labels(&key) == expect(&[("env", "prod"), ("region", "par"), ("tier", "gold")])
    })
    .await;
    label_secret(json!({"tier": "silver"})).await;
    wait_for("a label changed on the Secret", WAIT, || async {
        registry.labels(&key) == expect(&[("env", "prod"), ("region", "par"), ("tier", "silver")])
    })
    .await;
    clusters
        .patch("beta", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"region": "rbx"}}})))
        .await
        .unwrap();
    wait_for("a label changed on the Cluster", WAIT, || async {
        registry.labels(&key) == expect(&[("env", "prod"), ("region", "rbx"), ("tier", "silver")])
    })
    .await;
    let now = registry.connection(&key).unwrap();
    assert!(Arc::ptr_eq(&connection, &now), "a label change made a new connection");

    clusters.delete("beta", &DeleteParams::default()).await.unwrap();
    wait_for("the Cluster's labels gone with it", WAIT, || async {
        registry.labels(&key) == expect(&[("env", "prod"), ("tier", "silver")])
    })
    .await;
    shutdown.cancel();
}
