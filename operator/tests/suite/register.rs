//! `karpenter-hub register` on the simulated world: the workload RBAC is applied with the admin
//! kubeconfig, and the hub then provisions using only the minted least-privilege identity — which
//! proves the shipped workload RBAC grants everything the hub calls.
//!
//! And on real API servers (envtest control planes, in every `cargo test`; a visible skip without
//! `KUBEBUILDER_ASSETS`): a workload plane minting bound tokens (TokenRequest) whose controller
//! manager publishes the cluster CA (`kube-root-ca.crt`), and a management plane receiving the
//! registration Secret. There the
//! minted identity is exercised call by call against kube-apiserver's own RBAC: every call the hub
//! makes works, and what it must never do is refused with 403.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crds::NodeGroup;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource, ResourceExt, api::ListParams};
use operator::{
    commands::register_cluster::{self, RegisterArgs, register},
    commands::sandbox::world::{World, quick_cke, scale},
};
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::common;
use common::{apply_example, running, wait_for};

/// A fresh directory for this test's kubeconfig files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-register-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_cluster_is_served_with_the_minted_least_privilege_identity() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let dir = scratch("ok");
    let paths = world.write_kubeconfigs(&dir).unwrap();
    let mgmt_path = paths.iter().find(|p| p.ends_with("management.kubeconfig")).unwrap().clone();
    let admin_path = paths.iter().find(|p| p.ends_with("alpha.kubeconfig")).unwrap().clone();
    let admin_token = world.clusters[0].server.token();

    let args = RegisterArgs {
        cluster: "alpha".into(),
        namespace: "team-a".into(),
        workload_kubeconfig: admin_path,
        workload_context: None,
        kubeconfig: Some(mgmt_path),
        workload_namespace: "karpenter-hub".into(),
        server: None,
        token_duration_days: 365,
        labels: vec![("env".into(), "prod".into())],
    };
    assert_eq!(register(&args).await.unwrap(), "alpha-kubeconfig");
    // Idempotent: a second run converges on the same objects; a run without --label (a token
    // rotation) keeps the labels.
    register(&args).await.unwrap();
    register(&RegisterArgs { labels: Vec::new(), ..args.clone() }).await.unwrap();

    let secret = Api::<Secret>::namespaced(world.mgmt.client(), "team-a").get("alpha-kubeconfig").await.unwrap();
    assert_eq!(secret.labels().get("env").map(String::as_str), Some("prod"), "the cluster's label, kept");
    let kubeconfig = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    assert!(!kubeconfig.contains(&admin_token), "the admin credentials are never copied");
    assert!(kubeconfig.contains("\"token\""));
    // Least privilege for real: the minted identity cannot read Secrets.
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let as_hub = kube::Client::try_from(config).unwrap();
    match Api::<Secret>::all(as_hub).list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("listing Secrets must be forbidden, got {other:?}"),
    }

    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 2, "1", "1Gi").await.unwrap();
    wait_for("pods running through the minted identity", Duration::from_secs(60), || async {
        running(&world, 0).await == 2
    })
    .await;
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert_eq!(groups.items.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_with_an_unusable_kubeconfig_names_the_file_and_writes_nothing() {
    let world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let dir = scratch("bogus");
    let paths = world.write_kubeconfigs(&dir).unwrap();
    let mgmt_path = paths.iter().find(|p| p.ends_with("management.kubeconfig")).unwrap().clone();
    let bogus = dir.join("bogus.kubeconfig");
    std::fs::write(&bogus, "this: is: not a kubeconfig").unwrap();
    let args = RegisterArgs {
        cluster: "beta".into(),
        namespace: "team-a".into(),
        workload_kubeconfig: bogus.clone(),
        workload_context: None,
        kubeconfig: Some(mgmt_path),
        workload_namespace: "karpenter-hub".into(),
        server: None,
        token_duration_days: 365,
        labels: Vec::new(),
    };
    let e = register(&args).await.unwrap_err().to_string();
    assert!(e.contains(&bogus.display().to_string()), "{e}");
    let secrets = Api::<Secret>::namespaced(world.mgmt.client(), "team-a");
    assert!(secrets.get_opt("beta-kubeconfig").await.unwrap().is_none());
    world.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// On real API servers.

/// Eight hex digits from the clock: names of this run never collide with an earlier one.
fn unique() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{:08x}", (nanos as u32) ^ std::process::id())
}

/// The stand-in NodeGroup CRD installed (as on a CKE cluster) and served.
async fn serve_nodegroups(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in crds::crd::testing_crds() {
        match api.create(&PostParams::default(), &file.crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("installing the NodeGroup CRD: {e}"),
        }
    }
    wait_for("nodegroups.api.clever-cloud.com served", Duration::from_secs(30), || async {
        Api::<NodeGroup>::all(client.clone()).list(&ListParams::default().limit(1)).await.is_ok()
    })
    .await;
}

/// A client for the kubeconfig text.
async fn client_for(kubeconfig: &str) -> Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

/// Ok, or the HTTP status code of the refusal (anything else than an API refusal panics).
fn code<T>(what: &str, r: Result<T, kube::Error>) -> Result<T, u16> {
    match r {
        Ok(v) => Ok(v),
        Err(kube::Error::Api(s)) => Err(s.code),
        Err(e) => panic!("{what}: not an API answer: {e}"),
    }
}

#[track_caller]
fn allowed<T>(what: &str, r: Result<T, kube::Error>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("the hub's identity must be allowed to {what}: {e}"),
    }
}

#[track_caller]
fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("the hub's identity must be forbidden to {what}, got {other:?}"),
    }
}

/// A watch from resourceVersion 0 delivers its first event (the API server's synthetic ADDED of an
/// existing object), or the refusal's status code.
async fn first_watch_event<K>(api: &Api<K>) -> Result<(), u16>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let stream = code("watch", api.watch(&WatchParams::default().timeout(10), "0").await)?;
    let mut stream = stream.boxed();
    match tokio::time::timeout(Duration::from_secs(15), stream.try_next()).await {
        Ok(Ok(Some(WatchEvent::Added(_)))) => Ok(()),
        Ok(Ok(Some(WatchEvent::Error(s)))) => Err(s.code),
        Ok(Err(kube::Error::Api(s))) => Err(s.code),
        other => panic!("watch {}: unexpected first answer {other:?}", K::plural(&Default::default())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_api_servers_register_mints_an_identity_that_can_do_what_the_hub_needs_and_nothing_else() {
    let workload = envtest::shared_or_skip!("register-workload");
    let mgmt = envtest::shared_or_skip!("register-mgmt");
    assert!(workload.has_controller_manager(), "the controller manager publishes kube-root-ca.crt");
    let admin = workload.client().await.unwrap();
    let mgmt_admin = mgmt.client().await.unwrap();
    serve_nodegroups(&admin).await;
    let id = unique();
    let (team, hub_ns, scratch_ns) = (format!("team-{id}"), format!("karpenter-hub-{id}"), format!("apps-{id}"));
    for (client, ns) in [(&mgmt_admin, &team), (&admin, &scratch_ns)] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    }

    let args = RegisterArgs {
        cluster: format!("w-{id}"),
        namespace: team.clone(),
        workload_kubeconfig: workload.kubeconfig_path().to_path_buf(),
        workload_context: None,
        kubeconfig: Some(mgmt.kubeconfig_path().to_path_buf()),
        workload_namespace: hub_ns.clone(),
        server: None,
        token_duration_days: 365,
        labels: Vec::new(),
    };
    let started = Instant::now();
    let secret_name = register(&args).await.unwrap_or_else(|e| panic!("register on a real API server: {e}"));
    let first = started.elapsed();
    assert_eq!(secret_name, format!("w-{id}-kubeconfig"));
    // Idempotent: a second run converges on the same objects.
    register(&args).await.unwrap();
    eprintln!(
        "register on envtest: {:.1}s, again {:.1}s",
        first.as_secs_f64(),
        (started.elapsed() - first).as_secs_f64()
    );

    // The Secret in the management cluster: labelled for the registry, the minted kubeconfig only.
    let secret = Api::<Secret>::namespaced(mgmt_admin.clone(), &team).get(&secret_name).await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(secret.labels().get(operator::infra::registry::CLUSTER_NAME_LABEL), Some(&args.cluster));
    let kubeconfig =
        String::from_utf8(secret.data.clone().unwrap()[operator::infra::registry::KUBECONFIG_KEY].0.clone()).unwrap();
    let admin_kc = workload.kubeconfig().unwrap();
    let admin_token =
        admin_kc.auth_infos[0].auth_info.as_ref().unwrap().token.as_ref().unwrap().expose_secret().to_string();
    assert!(!kubeconfig.contains(&admin_token), "the admin credentials are never copied");
    assert!(kubeconfig.contains(workload.server()), "the hub reaches the workload API server the admin used");
    let as_hub = client_for(&kubeconfig).await;

    // Who the minted identity is, according to the real server.
    let review = k8s_openapi::api::authentication::v1::SelfSubjectReview::default();
    let me = Api::<k8s_openapi::api::authentication::v1::SelfSubjectReview>::all(as_hub.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let me = serde_json::to_value(me).unwrap();
    assert_eq!(
        me["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{hub_ns}:karpenter-hub-workload"),
        "{me}"
    );

    // A bound token with an expiry (a legacy token Secret's token has no `exp`), none of those
    // Secrets made, and the expiry noted on the registration Secret.
    let token = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap().auth_infos[0]
        .auth_info
        .as_ref()
        .unwrap()
        .token
        .as_ref()
        .unwrap()
        .expose_secret()
        .to_string();
    let claims = jwt_claims(&token);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let exp = claims["exp"].as_i64().unwrap_or_else(|| panic!("the token has no expiry: {claims}"));
    assert!((now + 364 * 86_400..=now + 366 * 86_400).contains(&exp), "expires in {} s", exp - now);
    assert!(claims["kubernetes.io"]["serviceaccount"]["name"] == "karpenter-hub-workload", "{claims}");
    let annotated: k8s_openapi::jiff::Timestamp =
        secret.annotations()[register_cluster::TOKEN_EXPIRES_ANNOTATION].parse().unwrap();
    assert!((annotated.as_second() - exp).abs() <= 1, "{annotated} vs exp {exp}");
    let token_secrets: Vec<String> = Api::<Secret>::namespaced(admin.clone(), &hub_ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.type_.as_deref() == Some("kubernetes.io/service-account-token"))
        .map(ResourceExt::name_any)
        .collect();
    assert!(token_secrets.is_empty(), "legacy token Secrets: {token_secrets:?}");

    // World objects made by the admin: a Node, a pod on it, a NodeGroup.
    let admin_nodes: Api<Node> = Api::all(admin.clone());
    let node_name = format!("node-{id}");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
    admin_nodes.create(&PostParams::default(), &node).await.unwrap();
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), &scratch_ns);
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
        }))
        .unwrap()
    };
    for name in ["evicted", "kept"] {
        admin_pods.create(&PostParams::default(), &pod(name)).await.unwrap();
    }

    // Everything the hub does in a workload cluster (config/hub/workload-rbac.yaml).
    let lp = ListParams::default();
    let groups: Api<NodeGroup> = Api::all(as_hub.clone());
    let group: NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": format!("ng-{id}")}, "spec": {"flavor": "XS", "nodeCount": 1},
    }))
    .unwrap();
    let created = allowed("create NodeGroups", groups.create(&PostParams::default(), &group).await);
    allowed("get NodeGroups", groups.get(&created.name_any()).await);
    allowed("list NodeGroups", groups.list(&lp).await);
    assert_eq!(first_watch_event(&groups).await, Ok(()), "the hub's identity must be allowed to watch NodeGroups");
    // The handover re-stamp (decisions::handover::restamp): metadata only.
    let version = created.metadata.resource_version.clone().unwrap_or_default();
    let restamp = operator::decisions::handover::restamp("mgmt-uid", "claim-uid", &version);
    allowed(
        "patch NodeGroups (the re-stamp of a moved group)",
        groups.patch(&created.name_any(), &PatchParams::default(), &Patch::Merge(&restamp)).await,
    );
    let nodes: Api<Node> = Api::all(as_hub.clone());
    allowed("list Nodes", nodes.list(&lp).await);
    assert_eq!(first_watch_event(&nodes).await, Ok(()), "the hub's identity must be allowed to watch Nodes");
    let patch = json!({"metadata": {"labels": {"karpenter.sh/registered": "true"}}});
    allowed("patch Nodes", nodes.patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch)).await);
    let mut live = admin_nodes.get(&node_name).await.unwrap();
    live.spec.get_or_insert_with(Default::default).provider_id = Some(format!("clevercloud://ng-{id}"));
    forbidden("update Nodes (every write is a patch)", nodes.replace(&node_name, &PostParams::default(), &live).await);
    let pods: Api<Pod> = Api::all(as_hub.clone());
    allowed("list Pods", pods.list(&lp).await);
    assert_eq!(first_watch_event(&pods).await, Ok(()), "the hub's identity must be allowed to watch Pods");
    let ns_pods: Api<Pod> = Api::namespaced(as_hub.clone(), &scratch_ns);
    allowed("evict Pods (pods/eviction)", ns_pods.evict("evicted", &EvictParams::default()).await);
    allowed("list DaemonSets", Api::<DaemonSet>::all(as_hub.clone()).list(&lp).await);
    allowed("list PodDisruptionBudgets", Api::<PodDisruptionBudget>::all(as_hub.clone()).list(&lp).await);
    // Storage, read by provisioning and disruption (watch caches).
    use k8s_openapi::api::{
        core::v1::{PersistentVolume, PersistentVolumeClaim},
        storage::v1::{CSINode, StorageClass},
    };
    let admin_pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &scratch_ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    admin_pvcs.create(&PostParams::default(), &claim).await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::all(as_hub.clone());
    allowed("list PersistentVolumeClaims", pvcs.list(&lp).await);
    assert_eq!(first_watch_event(&pvcs).await, Ok(()), "the hub's identity must be allowed to watch PVCs");
    allowed("list PersistentVolumes", Api::<PersistentVolume>::all(as_hub.clone()).list(&lp).await);
    allowed("list StorageClasses", Api::<StorageClass>::all(as_hub.clone()).list(&lp).await);
    allowed("list CSINodes", Api::<CSINode>::all(as_hub.clone()).list(&lp).await);
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": format!("ng-{id}.e2e")},
        "eventTime": chrono_now(),
        "reportingController": "karpenter.clever-cloud.com/hub",
        "reportingInstance": "e2e",
        "action": "Launch",
        "reason": "Launched",
        "type": "Normal",
        "note": "register test",
        "regarding": {"apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup", "name": format!("ng-{id}")},
    }))
    .unwrap();
    let events: Api<Event> = Api::namespaced(as_hub.clone(), "default");
    allowed("create events.k8s.io Events", events.create(&PostParams::default(), &event).await);
    let patch = json!({"series": {"count": 2, "lastObservedTime": chrono_now()}});
    allowed(
        "patch events.k8s.io Events",
        events.patch(&format!("ng-{id}.e2e"), &PatchParams::default(), &Patch::Merge(&patch)).await,
    );
    allowed(
        "delete NodeGroups",
        groups
            .delete(
                &created.name_any(),
                &DeleteParams::default()
                    .preconditions(kube::api::Preconditions { uid: created.uid(), resource_version: None }),
            )
            .await,
    );

    // What it must never do.
    forbidden("list Secrets", Api::<Secret>::all(as_hub.clone()).list(&lp).await);
    forbidden("read Secrets of its own namespace", Api::<Secret>::namespaced(as_hub.clone(), &hub_ns).list(&lp).await);
    forbidden(
        "mint tokens for itself (serviceaccounts/token)",
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(as_hub.clone(), &hub_ns)
            .create_token_request("karpenter-hub-workload", &PostParams::default(), &Default::default())
            .await,
    );
    forbidden(
        "delete Pods by collection",
        ns_pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await,
    );
    forbidden(
        "patch Pods",
        ns_pods
            .patch("kept", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
            .await,
    );
    assert_eq!(first_watch_event(&Api::<Secret>::all(as_hub.clone())).await, Err(403), "watching Secrets");
    forbidden("list ConfigMaps", Api::<ConfigMap>::all(as_hub.clone()).list(&lp).await);
    forbidden("create Pods", ns_pods.create(&PostParams::default(), &pod("mine")).await);
    forbidden("delete Nodes", nodes.delete(&node_name, &DeleteParams::default()).await);
    forbidden(
        "delete Namespaces",
        Api::<Namespace>::all(as_hub.clone()).delete(&scratch_ns, &DeleteParams::default()).await,
    );
    forbidden(
        "delete CRDs",
        Api::<CustomResourceDefinition>::all(as_hub.clone())
            .delete("nodegroups.api.clever-cloud.com", &DeleteParams::default())
            .await,
    );

    // A pod deleted the way a drain's deadline deletes it: UID precondition, shortened grace.
    let kept_uid = admin_pods.get("kept").await.unwrap().uid();
    allowed(
        "delete Pods (UID precondition; only at a drain's deadline)",
        ns_pods
            .delete(
                "kept",
                &DeleteParams::default()
                    .grace_period(1)
                    .preconditions(kube::api::Preconditions { uid: kept_uid, resource_version: None }),
            )
            .await,
    );

    // The eviction and the deletion really happened.
    for name in ["evicted", "kept"] {
        wait_for(&format!("pod {name} gone"), Duration::from_secs(30), || async {
            admin_pods.get_opt(name).await.unwrap().is_none()
        })
        .await;
    }
    assert!(admin_nodes.get_opt(&node_name).await.unwrap().is_some());

    let _ = admin_nodes.delete(&node_name, &DeleteParams::default()).await;
    for (client, ns) in [(&mgmt_admin, &team), (&admin, &scratch_ns), (&admin, &hub_ns)] {
        let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::default()).await;
    }
}

/// The claims of a JWT (its middle part, base64url without padding).
fn jwt_claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).unwrap_or_else(|| panic!("not a JWT"));
    let (mut bits, mut n, mut out) = (0u32, 0u32, Vec::new());
    for c in payload.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("not base64url: {c}"),
        };
        bits = (bits << 6) | u32::from(v);
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    serde_json::from_slice(&out).unwrap()
}

/// Now in the MicroTime format the events API wants.
fn chrono_now() -> String {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Everything checked before anything changes; running again after a failure is safe.

/// What a failed registration must have left alone in the workload cluster: no namespace for the
/// hub's ServiceAccount, and the hub's ClusterRoleBinding (if another registration made it) not
/// pointed at this run's ServiceAccount.
async fn workload_untouched(admin: &Client, hub_ns: &str) {
    assert!(
        Api::<Namespace>::all(admin.clone()).get_opt(hub_ns).await.unwrap().is_none(),
        "the hub's namespace {hub_ns} was created in the workload cluster before the checks"
    );
    let binding = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .get_opt("karpenter-hub-workload")
        .await
        .unwrap();
    let subjects = binding.and_then(|b| b.subjects).unwrap_or_default();
    assert!(
        subjects.iter().all(|s| s.namespace.as_deref() != Some(hub_ns)),
        "the workload RBAC was applied before the checks: {subjects:?}"
    );
}

#[track_caller]
fn plain_and_actionable(e: &str, must_say: &[&str]) {
    assert!(!e.contains("Status {") && !e.contains("Some("), "Rust debug formatting in: {e}");
    assert!(e.contains("nothing was changed"), "{e}");
    for s in must_say {
        assert!(e.contains(s), "the error says {s:?}: {e}");
    }
}

/// The scenario on one pair of clusters: `workload` a CKE cluster (NodeGroups served), `mgmt` the
/// management cluster (no NodeGroups), both given by admin kubeconfig files.
async fn checks_come_first_and_a_rerun_completes(
    workload: (Client, std::path::PathBuf),
    mgmt: (Client, std::path::PathBuf),
    id: &str,
    keeps_managed_fields: bool,
) {
    let (admin, workload_path) = workload;
    let (mgmt_admin, mgmt_path) = mgmt;
    let (team, hub_ns) = (format!("team-{id}"), format!("karpenter-hub-{id}"));
    let args = RegisterArgs {
        cluster: format!("w-{id}"),
        namespace: team.clone(),
        workload_kubeconfig: workload_path.clone(),
        workload_context: None,
        kubeconfig: Some(mgmt_path.clone()),
        workload_namespace: hub_ns.clone(),
        server: None,
        token_duration_days: 365,
        labels: Vec::new(),
    };

    // The Helm chart's ClusterRole, as on a management cluster that is also a workload cluster:
    // register never touches it (the workload identity has names of its own).
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let chart_role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "karpenter-hub", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "rules": [{"apiGroups": ["karpenter.clever-cloud.com"], "resources": ["nodepools"], "verbs": ["get", "list", "watch"]}],
    }))
    .unwrap();
    let chart_role = match roles.get_opt("karpenter-hub").await.unwrap() {
        Some(existing) => existing,
        None => roles.create(&PostParams::default(), &chart_role).await.unwrap(),
    };

    // The management namespace does not exist yet: said plainly, with what to do, and the
    // workload cluster is left as it was.
    let e = register(&args).await.expect_err("the management namespace is missing").to_string();
    eprintln!("{e}");
    plain_and_actionable(
        &e,
        &[&format!("namespace {team} does not exist"), &format!("kubectl create namespace {team}")],
    );
    workload_untouched(&admin, &hub_ns).await;

    // The management cluster given as the workload cluster (a wrong context): refused before
    // anything is applied to it.
    // (The management namespace now exists, so the NodeGroup check is the one that speaks.)
    let wrong = RegisterArgs { workload_kubeconfig: mgmt_path.clone(), ..args.clone() };
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": team}})).unwrap();
    Api::<Namespace>::all(mgmt_admin.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let e = register(&wrong).await.expect_err("the management cluster is not a CKE cluster").to_string();
    eprintln!("{e}");
    plain_and_actionable(&e, &["serves no NodeGroups", "CKE cluster"]);
    workload_untouched(&mgmt_admin, &hub_ns).await;
    workload_untouched(&admin, &hub_ns).await;

    // A ClusterRole of the workload identity's name that register did not make (no ownership
    // label): refused before anything changes, naming the object and the fix; left as it was.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let foreign: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "karpenter-hub-workload"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }))
    .unwrap();
    let foreign = roles.create(&PostParams::default(), &foreign).await.unwrap();
    let e = register(&args).await.expect_err("a foreign ClusterRole of our name").to_string();
    eprintln!("{e}");
    plain_and_actionable(
        &e,
        &[
            "ClusterRole karpenter-hub-workload",
            "was not made by `karpenter-hub register`",
            "app.kubernetes.io/managed-by=karpenter-hub-register",
            "kubectl delete clusterrole karpenter-hub-workload",
        ],
    );
    let after = roles.get("karpenter-hub-workload").await.unwrap();
    assert_eq!(after.resource_version(), foreign.resource_version(), "the foreign ClusterRole was modified");
    assert_eq!(after.rules, foreign.rules);
    workload_untouched(&admin, &hub_ns).await;
    roles.delete("karpenter-hub-workload", &DeleteParams::default()).await.unwrap();
    wait_for("the foreign ClusterRole gone", Duration::from_secs(10), || async {
        roles.get_opt("karpenter-hub-workload").await.unwrap().is_none()
    })
    .await;

    // The namespace created, the same command again: it completes.
    let name = register(&args).await.unwrap_or_else(|e| panic!("register after fixing the namespace: {e}"));
    assert_eq!(name, format!("w-{id}-kubeconfig"));
    let secret = Api::<Secret>::namespaced(mgmt_admin.clone(), &team).get(&name).await.unwrap();
    assert_eq!(secret.labels().get(operator::infra::registry::CLUSTER_NAME_LABEL), Some(&args.cluster));
    assert!(Api::<Namespace>::all(admin.clone()).get_opt(&hub_ns).await.unwrap().is_some());
    // And once more: converges, same Secret.
    assert_eq!(register(&args).await.unwrap(), name);
    let after = roles.get("karpenter-hub").await.unwrap();
    assert_eq!(after.resource_version(), chart_role.resource_version(), "register modified the chart's ClusterRole");
    // What it applied carries its ownership label, and (where the server records them, not in
    // the emulator) its field manager.
    let ours = roles.get("karpenter-hub-workload").await.unwrap();
    assert_eq!(ours.labels()[register_cluster::MANAGED_BY_LABEL], register_cluster::MANAGED_BY);
    if keeps_managed_fields {
        let managers: Vec<String> = ours.managed_fields().iter().filter_map(|m| m.manager.clone()).collect();
        assert!(managers.contains(&register_cluster::FIELD_MANAGER.to_string()), "{managers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_checks_everything_before_changing_anything_and_a_rerun_completes() {
    let world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let dir = scratch("checks");
    let paths = world.write_kubeconfigs(&dir).unwrap();
    let mgmt_path = paths.iter().find(|p| p.ends_with("management.kubeconfig")).unwrap().clone();
    let admin_path = paths.iter().find(|p| p.ends_with("alpha.kubeconfig")).unwrap().clone();
    checks_come_first_and_a_rerun_completes(
        (world.clusters[0].client(), admin_path),
        (world.mgmt.client(), mgmt_path),
        &unique(),
        false,
    )
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_api_servers_register_checks_everything_before_changing_anything_and_a_rerun_completes() {
    // A workload plane of its own: the hub's ClusterRoleBinding has one name per cluster, and the
    // other real-server test of this file relies on it pointing at its ServiceAccount.
    let workload = envtest::shared_or_skip!("register-checks-workload");
    let mgmt = envtest::shared_or_skip!("register-mgmt");
    let admin = workload.client().await.unwrap();
    serve_nodegroups(&admin).await;
    checks_come_first_and_a_rerun_completes(
        (admin, workload.kubeconfig_path().to_path_buf()),
        (mgmt.client().await.unwrap(), mgmt.kubeconfig_path().to_path_buf()),
        &unique(),
        true,
    )
    .await;
}
