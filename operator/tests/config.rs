//! The deployment material in `config/hub/` is real: every manifest parses and an API server accepts
//! it; the Deployment's arguments parse as `karpenter-hub run`'s flags and line up with its port and
//! probes; and the RBAC is enough — the hub, running as the ServiceAccounts these manifests create
//! (`rbac.yaml` in the management cluster, `workload-rbac.yaml` in a workload cluster, reached
//! through a kubeconfig holding a bound token as docs/hub.md says), provisions a node and
//! terminates it without a single request refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use clap::Parser;
use crds::{CleverNodeClass, NodeClaim, NodeGroup, NodePool};
use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::Deployment,
        authentication::v1::TokenRequest,
        coordination::v1::Lease,
        core::v1::{ConfigMap, Pod, Secret, ServiceAccount},
        events::v1::Event,
        rbac::v1::ClusterRoleBinding,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use operator::{
    commands::run::{self, RunArgs},
    commands::sandbox::world::{apply_value, quick_cke, workload_pod},
    infra::hub,
    infra::leader,
    infra::metrics::Metrics,
    infra::registry,
};
use serde_json::{Value, json};
use sim::apiserver::{ApiServer, ApiServerConfig};
use tokio_util::sync::CancellationToken;

mod common;
use common::{bound_token_kubeconfig, create_namespace, documents, wait_for, yaml_files};

/// The namespace the bindings' subjects name (and the docs install into).
const NAMESPACE: &str = "karpenter-hub";
const WORKLOAD_FILE: &str = "workload-rbac.yaml";
const EXAMPLE: &str = include_str!("../../examples/general-purpose.yaml");

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("config/hub")
}

fn one<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> T {
    let doc = documents(&dir().join(file))
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {file}"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{file}: {kind}: {e}"))
}

/// `karpenter-hub run <args>`, parsed by the binary's own flag definitions.
#[derive(Debug, Parser)]
struct Run {
    #[command(flatten)]
    args: RunArgs,
}

#[test]
fn the_manifests_are_namespace_agnostic_and_the_deployment_lines_up_with_the_binary() {
    let files = yaml_files(&dir());
    let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["rbac.yaml", "sharding-rbac.yaml", "deployment.yaml", WORKLOAD_FILE] {
        assert!(names.iter().any(|n| n == want), "config/hub/{want} is missing: {names:?}");
    }
    for f in &files {
        for doc in documents(f) {
            assert!(doc["metadata"].get("namespace").is_none(), "{}: {} names a namespace", f.display(), doc["kind"]);
        }
    }
    let deployment: Deployment = one("deployment.yaml", "Deployment");
    let spec = deployment.spec.unwrap();
    let replicas = spec.replicas.unwrap_or(1);
    let strategy = spec.strategy.clone().unwrap_or_default();
    let pod = spec.template.spec.unwrap();
    let sa: ServiceAccount = one("rbac.yaml", "ServiceAccount");
    assert_eq!(pod.service_account_name.as_deref(), Some(sa.name_any().as_str()));
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert_eq!(args[0], "run", "the Deployment runs `karpenter-hub run`");
    let parsed = Run::try_parse_from(std::iter::once("karpenter-hub".to_string()).chain(args[1..].iter().cloned()))
        .unwrap_or_else(|e| panic!("deployment.yaml args do not parse as `karpenter-hub run` flags: {e}"))
        .args;
    assert!(parsed.kubeconfig.is_none(), "in cluster, the hub uses its ServiceAccount");
    if replicas > 1 {
        assert!(parsed.leader_elect, "{replicas} replicas need leader election");
        // Only the leader is Ready: a rollout that may not take one down would never finish.
        let unavailable = strategy.rolling_update.clone().and_then(|r| r.max_unavailable);
        assert!(
            strategy.type_.as_deref() == Some("Recreate") || unavailable == Some(IntOrString::Int(1)),
            "{strategy:?}"
        );
    } else {
        assert_eq!(strategy.type_.as_deref(), Some("Recreate"), "a single hub is replaced, never doubled");
    }
    if parsed.leader_elect {
        // The Lease lives in the pod's namespace, where rbac.yaml's Role grants it.
        let env = container.env.clone().unwrap_or_default();
        let from = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value_from.as_ref())
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.clone())
        };
        assert!(parsed.leader_election_namespace.is_none(), "the Lease follows the namespace applied into");
        assert_eq!(from("POD_NAMESPACE").as_deref(), Some("metadata.namespace"));
        assert_eq!(from("POD_NAME").as_deref(), Some("metadata.name"));
    }
    let port = |name: &str| {
        container.ports.as_ref().unwrap().iter().find(|p| p.name.as_deref() == Some(name)).unwrap().container_port
    };
    assert_eq!(i32::from(parsed.metrics_addr.port()), port("http-metrics"));
    // The probes have a listener of their own, so /metrics could be narrowed to the loopback one.
    let probes = parsed.health_probe_bind_address.expect("deployment.yaml gives the probes their own listener");
    assert!(probes.ip().is_unspecified(), "the kubelet probes the pod's IP: {probes}");
    assert_eq!(i32::from(probes.port()), port("http-probes"));
    for (probe, path) in [(&container.liveness_probe, "/healthz"), (&container.readiness_probe, "/readyz")] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("http-probes".into()));
    }
    // Every binding names the ServiceAccount of its file, in the documented namespace.
    for (file, sa_file) in
        [("rbac.yaml", "rbac.yaml"), ("sharding-rbac.yaml", "rbac.yaml"), (WORKLOAD_FILE, WORKLOAD_FILE)]
    {
        let sa: ServiceAccount = one(sa_file, "ServiceAccount");
        let bindings = documents(&dir().join(file))
            .into_iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
            .collect::<Vec<_>>();
        assert!(!bindings.is_empty(), "{file} binds nothing");
        for doc in bindings {
            let subjects: Vec<k8s_openapi::api::rbac::v1::Subject> =
                serde_json::from_value(doc["subjects"].clone()).unwrap();
            for s in subjects {
                assert_eq!(
                    (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
                    ("ServiceAccount", sa.name_any().as_str(), Some(NAMESPACE)),
                    "{file}: {} {}",
                    doc["kind"],
                    doc["metadata"]["name"]
                );
            }
        }
    }
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
    serde_json::to_value(serde_json::from_value::<T>(doc.clone()).unwrap()).unwrap()
}

/// A misspelt or misplaced field would be dropped silently by an API server: every document must
/// survive a round trip through its Kubernetes type unchanged.
#[test]
fn every_document_is_exactly_a_kubernetes_object_of_its_kind() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
    for f in yaml_files(&dir()) {
        for doc in documents(&f) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let back = match kind.as_str() {
                "ServiceAccount" => round_trip::<ServiceAccount>(&doc),
                "Secret" => round_trip::<Secret>(&doc),
                "ClusterRole" => round_trip::<ClusterRole>(&doc),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(&doc),
                "Role" => round_trip::<Role>(&doc),
                "RoleBinding" => round_trip::<RoleBinding>(&doc),
                "Deployment" => round_trip::<Deployment>(&doc),
                other => panic!("{}: kind {other} is not checked here; add it", f.display()),
            };
            assert_eq!(
                back,
                doc,
                "{}: {kind} {} has fields its type does not know",
                f.display(),
                doc["metadata"]["name"]
            );
        }
    }
}

/// Log lines of this test binary, to look for refused requests.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Kinds the API emulator does not serve (docs/emulator.md): checked by the typed round trip of
/// [`every_document_is_exactly_a_kubernetes_object_of_its_kind`] only.
const NOT_SERVED: [&str; 1] = ["Deployment"];

/// Apply a config/hub file into [`NAMESPACE`]; returns the number of objects created.
async fn apply_file(client: &Client, path: &Path) -> usize {
    let docs: Vec<Value> =
        documents(path).into_iter().filter(|d| !NOT_SERVED.contains(&d["kind"].as_str().unwrap_or_default())).collect();
    for doc in &docs {
        apply_value(client, doc, NAMESPACE, &path.display().to_string())
            .await
            .unwrap_or_else(|e| panic!("{} was refused: {e}", path.display()));
    }
    docs.len()
}

/// Apply `workload-rbac.yaml` to a workload cluster and build the registration kubeconfig from a
/// bound token of its ServiceAccount (`kubectl create token`, i.e. a TokenRequest), as docs/hub.md
/// describes.
async fn workload_identity(workload: &ApiServer) -> String {
    create_namespace(&workload.client(), NAMESPACE).await;
    apply_file(&workload.client(), &dir().join(WORKLOAD_FILE)).await;
    bound_token_kubeconfig(workload, NAMESPACE, "karpenter-hub-workload").await
}

/// Register a workload cluster in namespace `ns` (the management admin's job) and apply the example.
async fn register(mgmt: &Client, ns: &str, cluster: &str, kubeconfig: String) {
    create_namespace(mgmt, ns).await;
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{cluster}-kubeconfig"), "labels": {registry::CLUSTER_NAME_LABEL: cluster}},
        "type": "cluster.x-k8s.io/secret",
    }))
    .unwrap();
    secret.data = Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(kubeconfig.into_bytes()))]));
    Api::<Secret>::namespaced(mgmt.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    for mut doc in serde_saphyr::from_multiple::<Value>(EXAMPLE).unwrap().into_iter().filter(|d| !d.is_null()) {
        if doc["kind"] == "NodePool" {
            doc["spec"]["clusterName"] = json!(cluster);
        }
        apply_value(mgmt, &doc, ns, "general-purpose.yaml").await.unwrap();
    }
}

fn condition_true(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Two workload clusters: `alpha` provisions and terminates a node; `beta`'s organisation quota is
/// exhausted by its control plane, so CKE refuses every NodeGroup and the hub records the refusals
/// in its capacity ConfigMap. Between them every permission of both files is exercised, and each
/// write the hub makes is checked where it lands (a refused status patch is not always logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_runs_with_exactly_the_rbac_of_config_hub() {
    let logs = Captured::default();
    let writer = logs.clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,operator=debug"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init();

    let mgmt = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let alpha = ApiServer::start(ApiServerConfig::workload("alpha").with_seed(1)).await.unwrap();
    let beta = ApiServer::start(ApiServerConfig::workload("beta").with_seed(2)).await.unwrap();
    create_namespace(&mgmt.client(), NAMESPACE).await;
    let mut applied = 0;
    for f in yaml_files(&dir()).iter().filter(|f| !f.ends_with(WORKLOAD_FILE)) {
        applied += apply_file(&mgmt.client(), f).await;
    }
    assert!(applied >= 5, "{applied} objects applied");

    // The management identity: a token of the hub's ServiceAccount, as its pod would get.
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let token = Api::<ServiceAccount>::namespaced(mgmt.client(), NAMESPACE)
        .create_token_request("karpenter-hub", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    // Leader election as that identity: acquire (create), renew (update), release (update).
    let elector = leader::Elector::new(
        mgmt.client_with_token(&token),
        NAMESPACE,
        "karpenter-hub-default",
        "config-test",
        leader::Timings::default(),
    );
    assert!(elector.try_hold().await.unwrap(), "the Lease is acquired");
    assert!(elector.try_hold().await.unwrap(), "the Lease is renewed");
    elector.release().await;
    let lease = Api::<Lease>::namespaced(mgmt.client(), NAMESPACE).get("karpenter-hub-default").await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None, "the Lease is released");
    register(&mgmt.client(), "team-a", "alpha", workload_identity(&alpha).await).await;
    register(&mgmt.client(), "team-b", "beta", workload_identity(&beta).await).await;

    // CKE (admin: it is the platform), then the hub with the least-privilege identities.
    let cke_stop = CancellationToken::new();
    let mut exhausted = quick_cke(2);
    exhausted.quota.limit = exhausted.quota.control_plane;
    let ckes = [(alpha.client(), quick_cke(1)), (beta.client(), exhausted)]
        .map(|(client, config)| tokio::spawn(sim::cke::run(client, config, cke_stop.clone().cancelled_owned())));
    let hub_stop = CancellationToken::new();
    let hub_task = tokio::spawn(run::run_with(
        mgmt.client_with_token(&token),
        hub::Settings::default(),
        registry::Settings::default(),
        Arc::new(Metrics::new()),
        hub_stop.clone(),
    ));

    let lp = ListParams::default();
    let pods = |w: &ApiServer| Api::<Pod>::namespaced(w.client(), "default");
    for w in [&alpha, &beta] {
        pods(w).create(&PostParams::default(), &workload_pod("web-0", "500m", "1Gi")).await.unwrap();
    }
    wait_for("alpha's pod Running on a node the hub provisioned", Duration::from_secs(60), || async {
        pods(&alpha).get("web-0").await.ok().and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    let capacity: Api<ConfigMap> = Api::namespaced(mgmt.client(), "team-b");
    wait_for("beta's capacity memory written after CKE's refusal", Duration::from_secs(60), || async {
        capacity.get_opt("beta-karpenter-hub-capacity").await.unwrap().is_some()
    })
    .await;
    // Status writes landed.
    let claims: Api<NodeClaim> = Api::namespaced(mgmt.client(), "team-a");
    let claim = claims.list(&lp).await.unwrap().items.remove(0);
    assert!(claim.status.and_then(|s| s.provider_id).is_some(), "NodeClaim status written");
    wait_for("NodePool and CleverNodeClass status written", Duration::from_secs(30), || async {
        let pool = Api::<NodePool>::namespaced(mgmt.client(), "team-a").get("default").await.unwrap();
        let class = Api::<CleverNodeClass>::namespaced(mgmt.client(), "team-a").get("default").await.unwrap();
        condition_true(&pool.status.map(|s| s.conditions).unwrap_or_default(), "ClusterReachable")
            && condition_true(&class.status.map(|s| s.conditions).unwrap_or_default(), "Ready")
    })
    .await;

    // Termination: the hub deletes the NodeGroups and releases its finalizers.
    for w in [&alpha, &beta] {
        pods(w).delete("web-0", &DeleteParams::default()).await.unwrap();
    }
    for ns in ["team-a", "team-b"] {
        let api: Api<NodeClaim> = Api::namespaced(mgmt.client(), ns);
        for c in api.list(&lp).await.unwrap().items {
            api.delete(&c.name_any(), &DeleteParams::default()).await.unwrap();
        }
    }
    wait_for("every claim and NodeGroup gone", Duration::from_secs(60), || async {
        let claims = Api::<NodeClaim>::all(mgmt.client()).list(&lp).await.is_ok_and(|l| l.items.is_empty());
        let mut groups = true;
        for w in [&alpha, &beta] {
            groups &= Api::<NodeGroup>::all(w.client()).list(&lp).await.is_ok_and(|l| l.items.is_empty());
        }
        claims && groups
    })
    .await;
    // The hub wrote events with its identity (e.g. on the kubeconfig Secret when it connected).
    let events = Api::<Event>::namespaced(mgmt.client(), "team-a").list(&lp).await.unwrap().items;
    assert!(events.iter().any(|e| e.reporting_controller.as_deref() == Some(hub::MANAGER)), "no event from the hub");

    hub_stop.cancel();
    hub_task.await.unwrap().unwrap();
    cke_stop.cancel();
    for c in ckes {
        c.await.unwrap().unwrap();
    }
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    let refused: Vec<&str> = text.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
    assert!(refused.is_empty(), "requests refused by RBAC:\n{}", refused.join("\n"));
    assert!(text.contains("NodeClaim terminated"), "the hub's logs were not captured:\n{text}");
    for s in [mgmt, alpha, beta] {
        s.shutdown().await;
    }
}
