//! Conformance suite: one test body per API behaviour the hub (and its tests) rely on, each stating
//! what kube-apiserver does, run on two targets by every `cargo test`:
//! - `emulator::<behaviour>`: a fresh `sim` API emulator of its own;
//! - `real::<behaviour>`: a real kube-apiserver. By default the envtest control plane this test
//!   binary shares (etcd, kube-apiserver and kube-controller-manager from `KUBEBUILDER_ASSETS`,
//!   started once, ~5 s; see [`envtest_options`]); without `KUBEBUILDER_ASSETS` each `real` test
//!   says on stderr that it skipped, and fails instead under `KARPENTER_HUB_REQUIRE_ENVTEST=1` (CI).
//!   `KARPENTER_HUB_CONFORMANCE_KUBECONFIG=<kubeconfig>` runs them on that cluster instead (1.34+,
//!   an identity allowed to create namespaces, CRDs and a Node).
//!
//! `cargo test -p sim --test conformance real::` runs one target, `… <behaviour>` both of one test.
//!
//! Rules that keep it honest on a real server: every test works in its own scratch namespace
//! (`conf-<test>-<random>`) and deletes it at the end; cluster-scoped objects get unique names and
//! are deleted; assertions never compare whole objects (servers add fields: managedFields,
//! defaults); anything a controller does asynchronously (garbage collection, namespace deletion,
//! PDB status, the `kube-root-ca.crt` ConfigMap of each namespace) is waited for with a bounded
//! timeout or tolerated. A test that passes only on the emulator is a bug in the emulator or in the
//! test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::GroupVersionKind;
use kube::{Client, Discovery};
use serde_json::{Value, json};
use sim::apiserver::{ApiServer, ApiServerConfig};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Where one test runs: the emulator or a real server, and the test's scratch namespace.
struct Target {
    client: Client,
    config: kube::Config,
    ns: String,
    _server: Option<ApiServer>,
}

/// Names a user's own cluster to run the `real` tests on instead of the envtest control plane.
const KUBECONFIG_ENV: &str = "KARPENTER_HUB_CONFORMANCE_KUBECONFIG";

/// Unique among this process's tests and (with the process id) among runs on one server.
fn suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{:x}{:x}{:x}", std::process::id() % 0xfff, t % 0xfff, N.fetch_add(1, Ordering::Relaxed))
}

impl Target {
    /// A fresh emulator of its own.
    async fn emulator(test: &str) -> Target {
        let s = ApiServer::start(ApiServerConfig::new(format!("conformance-{test}"))).await.expect("start emulator");
        let mut cfg = s.client_config();
        cfg.default_retry = false;
        Target::with_namespace(test, cfg, Some(s)).await
    }

    /// The real API server: the cluster of `KARPENTER_HUB_CONFORMANCE_KUBECONFIG` when set, else
    /// the envtest control plane this test binary shares. `None` (after a visible skip, or a panic
    /// where envtest is required) when there is neither.
    async fn real(test: &str) -> Option<Target> {
        let cfg = match std::env::var(KUBECONFIG_ENV) {
            Ok(path) if !path.is_empty() => {
                let kc = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
                let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("kubeconfig");
                // kube retries 429/503 by default (for minutes): the tests want to see them.
                cfg.default_retry = false;
                cfg
            }
            _ => match envtest::ControlPlane::shared_with(&envtest_options()) {
                Ok(cp) => cp.config().await.expect("envtest kubeconfig"),
                Err(e) => {
                    envtest::skip(&envtest::current_test(), &e);
                    return None;
                }
            },
        };
        Some(Target::with_namespace(test, cfg, None).await)
    }

    async fn with_namespace(test: &str, config: kube::Config, server: Option<ApiServer>) -> Target {
        let client = Client::try_from(config.clone()).expect("client");
        let ns = format!("conf-{}-{}", test.replace('_', "-").chars().take(40).collect::<String>(), suffix());
        let api: Api<Namespace> = Api::all(client.clone());
        api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
            .await
            .expect("create scratch namespace");
        Target { client, config, ns, _server: server }
    }
}

/// The envtest control plane of the `real` tests: a full one (controller manager included), whose
/// etcd history is compacted every 5 s and whose PersistentVolumeClaim watches bypass the watch
/// cache, so that a watch from a compacted resourceVersion is `410 Gone` within seconds (see
/// [`watch_from_too_old_resource_version_is_410_gone`]).
fn envtest_options() -> envtest::Options {
    envtest::Options {
        apiserver_args: vec![
            "--etcd-compaction-interval=5s".into(),
            "--watch-cache-sizes=persistentvolumeclaims#0".into(),
        ],
        ..envtest::Options::new("conformance")
    }
}

/// Generates every behaviour's two tests: `emulator::<behaviour>` on a fresh `sim` emulator and
/// `real::<behaviour>` on the real API server (see [`Target::real`]), both running the same body.
macro_rules! on_both_targets {
    ($($name:ident),* $(,)?) => {
        mod emulator {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Target::emulator(stringify!($name)).await).await;
                }
            )*
        }
        mod real {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(t) = super::Target::real(stringify!($name)).await {
                        super::$name(t).await;
                    }
                }
            )*
        }
    };
}

on_both_targets! {
    delete_answers_a_status_or_the_object,
    unknown_fields_of_built_in_kinds,
    list_items_carry_type_meta_only_for_custom_resources,
    discovery_serves_builtin_kinds_and_crds,
    create_sets_server_metadata_and_generate_name,
    create_existing_is_409_and_missing_is_404,
    update_with_stale_resource_version_conflicts,
    patch_with_stale_resource_version_conflicts,
    merge_and_json_patches,
    strategic_merge_patch_on_nodes,
    strategic_merge_patch_on_custom_resources_is_415,
    list_with_label_and_field_selectors,
    list_pagination_with_limit_and_continue,
    watch_from_list_resource_version_sees_later_changes_in_order,
    watch_from_too_old_resource_version_is_410_gone,
    watch_bookmarks_when_allowed,
    watch_with_selector_reports_objects_entering_and_leaving,
    runtime_watcher_initial_list_and_updates,
    finalizers_hold_deletion_until_removed,
    delete_precondition_mismatch_conflicts,
    owner_reference_cascade,
    namespace_deletion_removes_its_contents,
    status_subresource_and_generation,
    crd_schema_and_cel_validation,
    pod_binding,
    eviction_honours_pod_disruption_budgets,
    bound_pod_deletion_is_graceful,
    pod_create_defaults,
    server_side_apply_creates_and_updates,
    table_output_has_crd_printer_columns,
    streaming_list_watcher,
    events_recorder_creates_and_counts,
    events_are_one_object_in_both_event_apis,
    openapi_v3_publishes_crd_schemas,
    rbac_limits_service_account_tokens,
    metadata_only_list_get_and_watch,
    crd_scale_subresource,
    crd_lifecycle_serves_and_unserves_the_resource,
    dry_run_writes_store_nothing,
}

impl Target {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn cleanup(self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(&self.ns, &DeleteParams::default()).await;
    }
}

fn cm(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

/// A pod no scheduler of a real cluster picks up (its scheduler does not exist), so it stays
/// Pending and unbound unless a test binds it.
fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "karpenter-hub-conformance-none",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]
        }
    }))
    .unwrap()
}

/// Polls `f` until it returns `Some`, for at most [`TIMEOUT`].
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    let mut delay = Duration::from_millis(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

fn api_err(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

// ------------------------------------------------------------------ a test CRD

const WIDGET_CRD: &str = "widgets.conformance.karpenter.clever-cloud.com";

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGET_CRD},
        "spec": {
            "group": "conformance.karpenter.clever-cloud.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.observed"}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                    {"name": "Zone", "type": "string", "jsonPath": ".metadata.labels.topology\\.kubernetes\\.io/zone"},
                    {"name": "Size Text", "type": "string", "jsonPath": ".spec.size"},
                    {"name": "Color Number", "type": "integer", "jsonPath": ".spec.color"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                                "name": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "name is immutable"}]}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "observed": {"type": "integer"},
                                "conditions": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                            }
                        }
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

/// Installs the Widget CRD if missing (never deleted on a real server: tests share it) and waits
/// until it is served.
async fn widgets(t: &Target) -> Api<DynamicObject> {
    let crds: Api<CustomResourceDefinition> = Api::all(t.client.clone());
    // Server-side apply: creates it, or brings an older copy (from an earlier run) up to date.
    let pp = PatchParams::apply("karpenter-hub-conformance").force();
    let mut crd = serde_json::to_value(widget_crd()).unwrap();
    crd["apiVersion"] = json!("apiextensions.k8s.io/v1");
    crd["kind"] = json!("CustomResourceDefinition");
    crds.patch(WIDGET_CRD, &pp, &Patch::Apply(&crd)).await.expect("apply CRD");
    eventually("Widget CRD established", || async {
        let c = crds.get(WIDGET_CRD).await.ok()?;
        let est = c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
        est.then_some(())
    })
    .await;
    let gvk = GroupVersionKind::gvk("conformance.karpenter.clever-cloud.com", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let api: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), &t.ns, &ar);
    // Served once a list succeeds (discovery can lag the Established condition on a real server).
    eventually("widgets served", || async { api.list(&ListParams::default()).await.ok().map(|_| ()) }).await;
    api
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "conformance.karpenter.clever-cloud.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

// ------------------------------------------------------------------ discovery

/// kube-apiserver serves /version, /api, /apis and the group/version resource lists; a CRD's
/// resource appears in discovery once the CRD is established.
async fn discovery_serves_builtin_kinds_and_crds(t: Target) {
    let _ = widgets(&t).await;
    let v = t.client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    let discovery = Discovery::new(t.client.clone()).run().await.unwrap();
    let mut found = std::collections::BTreeSet::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            found.insert(format!("{}/{}", ar.group, ar.plural));
            if ar.plural == "pods" && ar.group.is_empty() {
                assert!(caps.subresources.iter().any(|(s, _)| s.plural == "pods/eviction" || s.plural == "eviction"));
            }
        }
    }
    for want in [
        "/pods",
        "/nodes",
        "/namespaces",
        "/secrets",
        "/configmaps",
        "/events",
        "/serviceaccounts",
        "apps/daemonsets",
        "policy/poddisruptionbudgets",
        "coordination.k8s.io/leases",
        "rbac.authorization.k8s.io/clusterroles",
        "apiextensions.k8s.io/customresourcedefinitions",
        "conformance.karpenter.clever-cloud.com/widgets",
    ] {
        assert!(found.contains(want), "{want} not discovered");
    }
    t.cleanup().await;
}

// ------------------------------------------------------------------ create / get

/// On create the server sets uid, creationTimestamp and resourceVersion; `generateName` gets a
/// random 5-character suffix; a CR starts at generation 1.
async fn create_sets_server_metadata_and_generate_name(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let mut c = cm("", json!({"a": "1"}));
    c.metadata.generate_name = Some("gen-".into());
    let created = cms.create(&PostParams::default(), &c).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(created.metadata.resource_version.is_some());
    assert_eq!(created.metadata.namespace.as_deref(), Some(t.ns.as_str()));
    let w = widgets(&t).await;
    let created = w.create(&PostParams::default(), &widget("w1", json!({"size": 2}))).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // Schema defaults are applied.
    assert_eq!(created.data["spec"]["color"], "red");
    t.cleanup().await;
}

/// Creating an existing name is `409 AlreadyExists`; getting a missing one is `404 NotFound`.
async fn create_existing_is_409_and_missing_is_404(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("x", json!({}))).await.unwrap();
    let s = api_err(cms.create(&PostParams::default(), &cm("x", json!({}))).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    let s = api_err(cms.get("missing").await);
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    assert_eq!(s.message, "configmaps \"missing\" not found");
    // Creating in a namespace that does not exist is 404 too.
    let other: Api<ConfigMap> = Api::namespaced(t.client.clone(), &format!("{}-none", t.ns));
    let s = api_err(other.create(&PostParams::default(), &cm("x", json!({}))).await);
    assert_eq!(s.code, 404);
    t.cleanup().await;
}

// ------------------------------------------------------------------ update / concurrency

/// An update carrying a stale resourceVersion is `409 Conflict`; a current one succeeds and bumps
/// the resourceVersion; an update that changes nothing keeps it.
async fn update_with_stale_resource_version_conflicts(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let v1 = cms.create(&PostParams::default(), &cm("c", json!({"k": "1"}))).await.unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("k".to_string(), "2".to_string())].into());
    let v2 = cms.replace("c", &PostParams::default(), &v2).await.unwrap();
    assert_ne!(v1.metadata.resource_version, v2.metadata.resource_version);
    let mut stale = v1.clone();
    stale.data = Some([("k".to_string(), "3".to_string())].into());
    let s = api_err(cms.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(s.message.contains("the object has been modified"), "{}", s.message);
    // No-op update: same resourceVersion.
    let v3 = cms.replace("c", &PostParams::default(), &v2).await.unwrap();
    assert_eq!(v3.metadata.resource_version, v2.metadata.resource_version);
    t.cleanup().await;
}

/// A merge patch with a stale `metadata.resourceVersion` is a 409 too (optimistic patch).
async fn patch_with_stale_resource_version_conflicts(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let v1 = cms.create(&PostParams::default(), &cm("c", json!({"k": "1"}))).await.unwrap();
    cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    let p = json!({"metadata": {"resourceVersion": v1.metadata.resource_version}, "data": {"k": "3"}});
    let s = api_err(cms.patch("c", &PatchParams::default(), &Patch::Merge(p)).await);
    assert_eq!(s.code, 409);
    t.cleanup().await;
}

// ------------------------------------------------------------------ patches

/// JSON merge patch (RFC 7386) merges maps, replaces lists, and `null` deletes a key; JSON patch
/// (RFC 6902) applies operations, and a failed `test` op rejects the whole patch (422).
async fn merge_and_json_patches(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("c", json!({"a": "1", "b": "2"}))).await.unwrap();
    let out =
        cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": null, "c": "3"}}))).await.unwrap();
    let data = out.data.unwrap();
    assert_eq!(data.get("a"), None);
    assert_eq!(data.get("c").map(String::as_str), Some("3"));
    let jp: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/b", "value": "9"}]),
    )
    .unwrap();
    let out = cms.patch("c", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(out.data.unwrap().get("b").map(String::as_str), Some("9"));
    let bad: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/b", "value": "0"}]),
    )
    .unwrap();
    let s = api_err(cms.patch("c", &PatchParams::default(), &Patch::<()>::Json(bad)).await);
    assert_eq!(s.code, 422);
    t.cleanup().await;
}

/// Strategic merge patch on built-in kinds: `metadata.finalizers` merges as a set and
/// `$deleteFromPrimitiveList` removes entries; `status.conditions` merge by `type`; `spec.taints`
/// (no patch strategy) is replaced whole.
async fn strategic_merge_patch_on_nodes(t: Target) {
    let nodes: Api<Node> = Api::all(t.client.clone());
    let name = format!("conf-smp-{}", suffix());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "finalizers": ["example.com/a"]},
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let out = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"finalizers": ["example.com/b"]},
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}
            })),
        )
        .await
        .unwrap();
    // The patch's new entries come first (apimachinery orders patched items before live-only ones).
    assert_eq!(out.metadata.finalizers.clone().unwrap(), vec!["example.com/b", "example.com/a"]);
    // (A real node lifecycle controller may add its own not-ready taint to this kubelet-less node.)
    let taints = out.spec.unwrap().taints.unwrap();
    assert!(taints.iter().any(|t| t.key == "b") && !taints.iter().any(|t| t.key == "a"), "{taints:?}");
    nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "Init"},
                {"type": "MemoryPressure", "status": "False"}
            ]}})),
        )
        .await
        .unwrap();
    let out = nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Up"}]}})),
        )
        .await
        .unwrap();
    let conds = out.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2, "{conds:?}");
    assert!(conds.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let out = nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a", "example.com/b"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(out.metadata.finalizers, None, "an empty list of finalizers is not kept");
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    t.cleanup().await;
}

/// Strategic merge patch is not supported for custom resources: `415 UnsupportedMediaType`.
async fn strategic_merge_patch_on_custom_resources_is_415(t: Target) {
    let w = widgets(&t).await;
    w.create(&PostParams::default(), &widget("w", json!({"size": 1}))).await.unwrap();
    let s = api_err(w.patch("w", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"size": 2}}))).await);
    assert_eq!(s.code, 415);
    t.cleanup().await;
}

// ------------------------------------------------------------------ selectors and pagination

/// Lists honour label selectors (=, !=, in, notin, exists, !exists) and the field selectors
/// metadata.name / metadata.namespace (all kinds), spec.nodeName and status.phase (pods); an
/// unsupported field label is `400 BadRequest`.
async fn list_with_label_and_field_selectors(t: Target) {
    let pods: Api<Pod> = t.api();
    for (n, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        pods.create(&PostParams::default(), &pod(n, json!({"app": app}))).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        let mut v: Vec<String> = l.items.into_iter().filter_map(|p| p.metadata.name).collect();
        v.sort();
        v
    };
    let l = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
    assert_eq!(names(l), ["a", "b"]);
    let l = pods.list(&ListParams::default().labels("app notin (web)")).await.unwrap();
    assert_eq!(names(l), ["c"]);
    let l = pods.list(&ListParams::default().labels("app,!missing")).await.unwrap();
    assert_eq!(names(l), ["a", "b", "c"]);
    let l = pods.list(&ListParams::default().fields("metadata.name=b")).await.unwrap();
    assert_eq!(names(l), ["b"]);
    let l = pods.list(&ListParams::default().fields(&format!("metadata.namespace={}", t.ns))).await.unwrap();
    assert_eq!(l.items.len(), 3);
    let l = pods.list(&ListParams::default().fields("spec.nodeName=")).await.unwrap();
    assert_eq!(l.items.len(), 3, "unscheduled pods have an empty nodeName");
    let l = pods.list(&ListParams::default().fields("status.phase=Pending")).await.unwrap();
    assert_eq!(l.items.len(), 3);
    let l = pods.list(&ListParams::default().fields("status.phase!=Pending")).await.unwrap();
    assert_eq!(l.items.len(), 0);
    let s = api_err(pods.list(&ListParams::default().fields("spec.bogus=x")).await);
    assert_eq!(s.code, 400);
    t.cleanup().await;
}

/// `limit` returns at most that many items and a `continue` token; following the tokens yields
/// every object exactly once; the list's resourceVersion stays the first page's.
async fn list_pagination_with_limit_and_continue(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    for i in 0..7 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), json!({}))).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut rv = None;
    loop {
        let mut lp = ListParams::default().limit(3);
        if let Some(c) = &token {
            lp = lp.continue_token(c);
        }
        let l = cms.list(&lp).await.unwrap();
        pages += 1;
        assert!(l.items.len() <= 3);
        if rv.is_none() {
            rv = l.metadata.resource_version.clone();
        } else {
            assert_eq!(rv, l.metadata.resource_version);
        }
        seen.extend(l.items.into_iter().filter_map(|c| c.metadata.name).filter(|n| n.starts_with('c')));
        match l.metadata.continue_ {
            Some(c) if !c.is_empty() => token = Some(c),
            _ => break,
        }
    }
    // kube-root-ca.crt may exist on a real server: only our seven count.
    seen.sort();
    assert_eq!(seen, (0..7).map(|i| format!("c{i}")).collect::<Vec<_>>());
    assert!(pages >= 3);
    t.cleanup().await;
}

// ------------------------------------------------------------------ watch

async fn next_event<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>> + Unpin,
{
    tokio::time::timeout(TIMEOUT, stream.next()).await.expect("watch event in time").expect("stream open").unwrap()
}

/// A watch from a list's resourceVersion delivers every later change in order (ADDED, MODIFIED,
/// DELETED) and nothing from before.
async fn watch_from_list_resource_version_sees_later_changes_in_order(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("before", json!({}))).await.unwrap();
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().timeout(60), &rv).await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("w", json!({"k": "1"}))).await.unwrap();
    cms.patch("w", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    cms.delete("w", &DeleteParams::default()).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        let (kind, c) = match next_event(&mut stream).await {
            WatchEvent::Added(c) => ("ADDED", c),
            WatchEvent::Modified(c) => ("MODIFIED", c),
            WatchEvent::Deleted(c) => ("DELETED", c),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("{e:?}"),
        };
        // A real controller manager publishes CA bundles in every new namespace meanwhile
        // (kube-root-ca.crt; the envtest 1.36 build also openshift-service-ca.crt).
        let name = c.metadata.name.unwrap();
        if !name.ends_with("ca.crt") {
            got.push((kind, name));
        }
    }
    assert_eq!(got, [("ADDED", "w".into()), ("MODIFIED", "w".into()), ("DELETED", "w".into())]);
    t.cleanup().await;
}

/// A watch from a resourceVersion older than the server's history ends at once with an ERROR
/// event carrying `410 Gone` (reason Expired): the client must re-list. A real server keeps the
/// history etcd has not compacted yet (kube-apiserver compacts every `--etcd-compaction-interval`:
/// 5 min by default, 5 s on the envtest plane), so the test waits for compaction. It watches
/// PersistentVolumeClaims, whose watch cache the envtest plane turns off: kube-apiserver's watch
/// cache serves watches from its own window, whatever etcd has compacted.
async fn watch_from_too_old_resource_version_is_410_gone(t: Target) {
    let pvcs: Api<PersistentVolumeClaim> = t.api();
    let status = eventually("a watch from resourceVersion 1 to be refused", || async {
        let mut stream = pvcs.watch(&WatchParams::default().timeout(5), "1").await.ok()?.boxed();
        match tokio::time::timeout(Duration::from_secs(2), stream.next()).await {
            Ok(Some(Ok(WatchEvent::Error(e)))) => Some(e),
            // Not compacted yet: the server replays the history (nothing in this namespace).
            _ => None,
        }
    })
    .await;
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"), "{status:?}");
    t.cleanup().await;
}

/// With `allowWatchBookmarks`, the server sends BOOKMARK events carrying only a resourceVersion,
/// at the latest about 2 s before the watch's timeout, once the resource has changed since the
/// watch's start (kube-apiserver's watch cache never sends a bookmark older than the watch).
async fn watch_bookmarks_when_allowed(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream =
        cms.watch(&WatchParams { bookmarks: true, ..WatchParams::default().timeout(6) }, &rv).await.unwrap().boxed();
    let changed = cms.create(&PostParams::default(), &cm("b", json!({}))).await.unwrap();
    let changed_rv: u64 = changed.metadata.resource_version.unwrap().parse().unwrap();
    let mut bookmark = None;
    while let Some(ev) = tokio::time::timeout(TIMEOUT, stream.next()).await.expect("stream ends in time") {
        if let WatchEvent::Bookmark(b) = ev.unwrap() {
            bookmark = Some(b);
        }
    }
    let b = bookmark.expect("a bookmark before the watch timed out");
    let bookmark_rv: u64 = b.metadata.resource_version.parse().unwrap();
    assert!(bookmark_rv >= changed_rv, "bookmark at {bookmark_rv}, change at {changed_rv}");
    t.cleanup().await;
}

/// A label-selected watch turns an object leaving the selector into DELETED and one entering it
/// into ADDED (the watch cache's behaviour).
async fn watch_with_selector_reports_objects_entering_and_leaving(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let mut c = cm("m", json!({}));
    c.metadata.labels = Some([("sel".to_string(), "yes".to_string())].into());
    cms.create(&PostParams::default(), &c).await.unwrap();
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().labels("sel=yes").timeout(60), &rv).await.unwrap().boxed();
    cms.patch("m", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"sel": "no"}}})))
        .await
        .unwrap();
    cms.patch("m", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"sel": "yes"}}})))
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        match next_event(&mut stream).await {
            WatchEvent::Added(_) => got.push("ADDED"),
            WatchEvent::Deleted(_) => got.push("DELETED"),
            WatchEvent::Modified(_) => got.push("MODIFIED"),
            _ => {}
        }
    }
    assert_eq!(got, ["DELETED", "ADDED"]);
    t.cleanup().await;
}

/// kube-runtime's watcher (list + watch) converges on the current state.
async fn runtime_watcher_initial_list_and_updates(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("one", json!({}))).await.unwrap();
    let stream = kube::runtime::watcher(cms.clone(), kube::runtime::watcher::Config::default());
    let mut stream = Box::pin(stream);
    let mut init_done = false;
    let mut seen_two = false;
    let created = tokio::spawn({
        let cms = cms.clone();
        async move { cms.create(&PostParams::default(), &cm("two", json!({}))).await }
    });
    while !(init_done && seen_two) {
        let ev = tokio::time::timeout(TIMEOUT, stream.try_next()).await.expect("in time").unwrap().unwrap();
        match ev {
            kube::runtime::watcher::Event::InitDone => init_done = true,
            kube::runtime::watcher::Event::Apply(c) | kube::runtime::watcher::Event::InitApply(c)
                if c.metadata.name.as_deref() == Some("two") =>
            {
                seen_two = true;
            }
            _ => {}
        }
    }
    created.await.unwrap().unwrap();
    t.cleanup().await;
}

// ------------------------------------------------------------------ delete, finalizers, GC

/// Deleting an object with finalizers only sets deletionTimestamp (the object stays, readable);
/// removing the last finalizer deletes it. No new finalizer may be added meanwhile.
async fn finalizers_hold_deletion_until_removed(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let mut c = cm("f", json!({}));
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &c).await.unwrap();
    cms.delete("f", &DeleteParams::default()).await.unwrap();
    let held = cms.get("f").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let s = api_err(
        cms.patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}})),
        )
        .await,
    );
    assert_eq!(s.code, 422);
    cms.patch("f", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    eventually("deleted after the last finalizer", || async {
        matches!(cms.get("f").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    t.cleanup().await;
}

/// A delete with a UID precondition that does not match is `409 Conflict`.
async fn delete_precondition_mismatch_conflicts(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("p", json!({}))).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let s = api_err(cms.delete("p", &dp).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(s.message.contains("does not match the UID in record"), "{}", s.message);
    assert!(cms.get("p").await.is_ok());
    t.cleanup().await;
}

/// What a delete answers: a success Status naming the object when it is gone at once (most
/// kinds), the object itself for pods, and the object with its deletionTimestamp when the delete
/// only marks it (finalizers).
async fn delete_answers_a_status_or_the_object(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let created = cms.create(&PostParams::default(), &cm("gone", json!({}))).await.unwrap();
    let status = cms.delete("gone", &DeleteParams::default()).await.unwrap().right().expect("a Status, not the object");
    assert_eq!(status.status, Some(kube::core::response::StatusSummary::Success));
    let d = status.details.unwrap();
    assert_eq!((d.name.as_str(), d.kind.as_str()), ("gone", "configmaps"));
    assert_eq!(Some(d.uid), created.metadata.uid);
    let mut held = cm("held", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    let marked = cms.delete("held", &DeleteParams::default()).await.unwrap().left().expect("the object, not a Status");
    assert!(marked.metadata.deletion_timestamp.is_some());
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    let pods: Api<Pod> = t.api();
    pods.create(&PostParams::default(), &pod("p", json!({}))).await.unwrap();
    let deleted = pods.delete("p", &DeleteParams::default()).await.unwrap().left().expect("the pod, not a Status");
    assert_eq!(deleted.metadata.name.as_deref(), Some("p"));
    t.cleanup().await;
}

/// Fields a built-in kind does not have are dropped with a `Warning: unknown field` header, or
/// refused with `fieldValidation=Strict` (400, strict decoding error); a Secret's data must be
/// base64 (400).
async fn unknown_fields_of_built_in_kinds(t: Target) {
    let path = format!("/api/v1/namespaces/{}/configmaps", t.ns);
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "u"}, "data": {"k": "v"}, "bogus": 1});
    let send = |query: &'static str, body: Value| {
        let client = t.client.clone();
        let uri = format!("{path}{query}");
        async move {
            let req = http::Request::post(uri)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap();
            let resp = client.send(req).await.unwrap();
            let warnings: Vec<String> =
                resp.headers().get_all("warning").iter().map(|h| h.to_str().unwrap().to_string()).collect();
            let code = resp.status().as_u16();
            let body: Value = serde_json::from_slice(&resp.into_body().collect_bytes().await.unwrap()).unwrap();
            (code, warnings, body)
        }
    };
    let (code, _, status) = send("?fieldValidation=Strict", body.clone()).await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")), "{status}");
    assert_eq!(
        status["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"bogus\""
    );
    let (code, warnings, created) = send("", body).await;
    assert_eq!(code, 201);
    assert_eq!(warnings, [r#"299 - "unknown field \"bogus\"""#]);
    assert!(created.get("bogus").is_none(), "{created}");
    assert_eq!(created["data"]["k"], "v");
    let bad = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "!!"}});
    let s = api_err(t.client.request_text(http_post(&format!("/api/v1/namespaces/{}/secrets", t.ns), &bad)).await);
    assert_eq!(s.code, 400);
    assert!(s.message.contains("illegal base64 data"), "{}", s.message);
    t.cleanup().await;
}

/// A list of a built-in kind carries apiVersion and kind once, not in each item; a list of a
/// custom resource has them in every item too.
async fn list_items_carry_type_meta_only_for_custom_resources(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("typed", json!({}))).await.unwrap();
    let w = widgets(&t).await;
    w.create(&PostParams::default(), &widget("typed", json!({"size": 1}))).await.unwrap();
    let get = |path: String| {
        let client = t.client.clone();
        async move { client.request::<Value>(http::Request::get(path).body(Vec::new()).unwrap()).await.unwrap() }
    };
    let list = get(format!("/api/v1/namespaces/{}/configmaps", t.ns)).await;
    assert_eq!((list["kind"].as_str(), list["apiVersion"].as_str()), (Some("ConfigMapList"), Some("v1")));
    let item = list["items"].as_array().unwrap().iter().find(|i| i["metadata"]["name"] == "typed").unwrap();
    assert!(item.get("kind").is_none() && item.get("apiVersion").is_none(), "{item}");
    let list = get(format!("/apis/conformance.karpenter.clever-cloud.com/v1/namespaces/{}/widgets", t.ns)).await;
    assert_eq!(list["items"][0]["kind"], "Widget");
    assert_eq!(list["items"][0]["apiVersion"], "conformance.karpenter.clever-cloud.com/v1");
    t.cleanup().await;
}

/// The garbage collector deletes dependents whose ownerReference points at a deleted owner
/// (background propagation), and leaves them with `propagationPolicy: Orphan`.
async fn owner_reference_cascade(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    for (owner, child) in [("owner1", "child1"), ("owner2", "child2")] {
        let o = cms.create(&PostParams::default(), &cm(owner, json!({}))).await.unwrap();
        let mut c = cm(child, json!({}));
        c.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: owner.into(),
            uid: o.metadata.uid.unwrap(),
            ..Default::default()
        }]);
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    cms.delete("owner1", &DeleteParams::background()).await.unwrap();
    cms.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    eventually("child1 collected", || async {
        matches!(cms.get("child1").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    let orphan = eventually("child2 orphaned", || async {
        let c = cms.get("child2").await.ok()?;
        c.metadata.owner_references.as_ref().is_none_or(|r| r.is_empty()).then_some(c)
    })
    .await;
    assert!(orphan.metadata.deletion_timestamp.is_none());
    t.cleanup().await;
}

/// Deleting a namespace marks it Terminating, deletes everything in it, then removes it.
async fn namespace_deletion_removes_its_contents(t: Target) {
    let ns = format!("{}-x", t.ns);
    let nss: Api<Namespace> = Api::all(t.client.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(t.client.clone(), &ns);
    cms.create(&PostParams::default(), &cm("inside", json!({}))).await.unwrap();
    nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    eventually("namespace gone", || async {
        matches!(nss.get(&ns).await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    let s = api_err(cms.get("inside").await);
    assert_eq!(s.code, 404);
    t.cleanup().await;
}

// ------------------------------------------------------------------ status and generation

/// For a kind with a status subresource: writes to the main resource ignore status, writes to
/// /status ignore everything but status; `metadata.generation` moves only on spec changes.
async fn status_subresource_and_generation(t: Target) {
    let w = widgets(&t).await;
    let mut obj = widget("g", json!({"size": 1}));
    obj.data["status"] = json!({"observed": 5});
    let created = w.create(&PostParams::default(), &obj).await.unwrap();
    assert!(created.data.get("status").is_none_or(|s| s.get("observed").is_none()), "status dropped on create");
    let out = w
        .patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}, "status": {"observed": 1}})))
        .await
        .unwrap();
    assert_eq!(out.metadata.generation, Some(2));
    assert!(out.data.get("status").is_none_or(|s| s.get("observed").is_none()));
    let out = w
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}, "status": {"observed": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(out.data["status"]["observed"], 2);
    assert_eq!(out.data["spec"]["size"], 2);
    assert_eq!(out.metadata.generation, Some(2));
    let out = w
        .patch("g", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert_eq!(out.metadata.generation, Some(2), "metadata changes keep the generation");
    t.cleanup().await;
}

/// Custom resources are validated against the CRD's OpenAPI schema (required, min/max, enum) and
/// its CEL rules (including transition rules): `422 Invalid` with field causes.
async fn crd_schema_and_cel_validation(t: Target) {
    let w = widgets(&t).await;
    let s = api_err(w.create(&PostParams::default(), &widget("bad", json!({"size": 11, "color": "green"}))).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let causes = s.details.unwrap().causes;
    assert!(causes.iter().any(|c| c.field == "spec.size"), "{causes:?}");
    assert!(causes.iter().any(|c| c.field == "spec.color"), "{causes:?}");
    let s = api_err(w.create(&PostParams::default(), &widget("bad", json!({}))).await);
    assert_eq!(s.code, 422);
    w.create(&PostParams::default(), &widget("ok", json!({"size": 1, "name": "a"}))).await.unwrap();
    let s = api_err(w.patch("ok", &PatchParams::default(), &Patch::Merge(json!({"spec": {"name": "b"}}))).await);
    assert_eq!(s.code, 422);
    assert!(s.message.contains("name is immutable"), "{}", s.message);
    t.cleanup().await;
}

// ------------------------------------------------------------------ pods: binding, eviction, graceful deletion

/// `pods/binding` sets spec.nodeName; binding an already bound pod is `409 Conflict`.
async fn pod_binding(t: Target) {
    let pods: Api<Pod> = t.api();
    pods.create(&PostParams::default(), &pod("p", json!({}))).await.unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}});
    let req = http_post(&format!("/api/v1/namespaces/{}/pods/p/binding", t.ns), &binding);
    let r = t.client.request_text(req).await;
    assert!(r.is_ok(), "{r:?}");
    let p = pods.get("p").await.unwrap();
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("node-a"));
    let req = http_post(&format!("/api/v1/namespaces/{}/pods/p/binding", t.ns), &binding);
    let s = api_err(t.client.request_text(req).await);
    assert_eq!(s.code, 409);
    t.cleanup().await;
}

fn http_post(path: &str, body: &Value) -> http::Request<Vec<u8>> {
    http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

/// `pods/eviction` is refused with `429 TooManyRequests` when a PodDisruptionBudget allows no
/// disruption, and deletes the pod when no budget covers it (or the budget allows it).
async fn eviction_honours_pod_disruption_budgets(t: Target) {
    let pods: Api<Pod> = t.api();
    let pdbs: Api<PodDisruptionBudget> = t.api();
    for n in ["guarded-1", "guarded-2"] {
        pods.create(&PostParams::default(), &pod(n, json!({"app": "guarded"}))).await.unwrap();
        // Mark Running and Ready, as a kubelet would.
        pods.patch_status(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    }
    pods.create(&PostParams::default(), &pod("free", json!({"app": "free"}))).await.unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("PDB status computed", || async {
        let p = pdbs.get("guard").await.ok()?;
        (p.status?.disruptions_allowed == 1).then_some(())
    })
    .await;
    let evict = kube::api::EvictParams::default();
    pods.evict("free", &evict).await.unwrap();
    pods.evict("guarded-1", &evict).await.unwrap();
    eventually("PDB exhausted", || async {
        let p = pdbs.get("guard").await.ok()?;
        (p.status?.disruptions_allowed == 0).then_some(())
    })
    .await;
    let s = api_err(pods.evict("guarded-2", &evict).await);
    assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
    assert!(pods.get("guarded-2").await.unwrap().metadata.deletion_timestamp.is_none());
    eventually("free pod gone", || async {
        matches!(pods.get("free").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    t.cleanup().await;
}

/// Deleting a pod bound to a node is graceful: deletionTimestamp and deletionGracePeriodSeconds
/// are set and the pod stays until deleted with grace 0 (the kubelet's job); an unbound pod goes
/// at once.
async fn bound_pod_deletion_is_graceful(t: Target) {
    let pods: Api<Pod> = t.api();
    let mut p = pod("bound", json!({}));
    p.spec.as_mut().unwrap().node_name = Some(format!("conf-nonexistent-{}", suffix()));
    pods.create(&PostParams::default(), &p).await.unwrap();
    pods.create(&PostParams::default(), &pod("unbound", json!({}))).await.unwrap();
    pods.delete("unbound", &DeleteParams::default()).await.unwrap();
    let s = api_err(pods.get("unbound").await);
    assert_eq!(s.code, 404);
    pods.delete("bound", &DeleteParams::default()).await.unwrap();
    let held = pods.get("bound").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete("bound", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    eventually("bound pod gone after grace 0", || async {
        matches!(pods.get("bound").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    t.cleanup().await;
}

/// Pods are created Pending with a QoS class; the server defaults the NoExecute tolerations for
/// not-ready/unreachable nodes (DefaultTolerationSeconds) and the scheduler name.
async fn pod_create_defaults(t: Target) {
    let pods: Api<Pod> = t.api();
    let mut d = pod("d", json!({}));
    d.spec.as_mut().unwrap().scheduler_name = None;
    let p = pods.create(&PostParams::default(), &d).await.unwrap();
    let status = p.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let spec = p.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    let tol = spec.tolerations.unwrap();
    assert!(
        tol.iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/not-ready") && t.toleration_seconds == Some(300))
    );
    // A tagged image is pulled if not present.
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(p.metadata.generation, Some(1), "pods have a generation (Kubernetes 1.34+)");
    // Requests default to limits (what the scheduler, and the hub, count); an untagged image is
    // always pulled.
    let limited: Pod = serde_json::from_value(json!({
        "metadata": {"name": "limited"},
        "spec": {
            "schedulerName": "karpenter-hub-conformance-none",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]
        }
    }))
    .unwrap();
    let p = pods.create(&PostParams::default(), &limited).await.unwrap();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let requests = c.resources.as_ref().and_then(|r| r.requests.clone()).expect("requests defaulted");
    assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("1"));
    assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("1Gi"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(p.status.unwrap().qos_class.as_deref(), Some("Guaranteed"));
    t.cleanup().await;
}

/// Server-side apply creates a missing object and updates an existing one (field manager given).
async fn server_side_apply_creates_and_updates(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let pp = PatchParams::apply("conformance");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "1"}});
    cms.patch("a", &pp, &Patch::Apply(&body)).await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "2"}});
    let out = cms.patch("a", &pp, &Patch::Apply(&body)).await.unwrap();
    assert_eq!(out.data.unwrap().get("k").map(String::as_str), Some("2"));
    t.cleanup().await;
}

// ------------------------------------------------------------------ tables, streaming lists, events

/// `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` returns a Table: Name first, then the
/// CRD's additionalPrinterColumns (JSONPath evaluated per row), as `kubectl get` shows them: a
/// label key's dots escaped with `\.`, a `string` column prints a number, a column of another
/// type whose value is not of it stays empty; undescribed columns name their JSONPath.
async fn table_output_has_crd_printer_columns(t: Target) {
    let w = widgets(&t).await;
    let mut tw = widget("tw", json!({"size": 4}));
    tw.metadata.labels = Some([("topology.kubernetes.io/zone".to_string(), "par".to_string())].into());
    w.create(&PostParams::default(), &tw).await.unwrap();
    w.patch_status(
        "tw",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    let req =
        http::Request::get(format!("/apis/conformance.karpenter.clever-cloud.com/v1/namespaces/{}/widgets", t.ns))
            .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
            .body(Vec::new())
            .unwrap();
    let table: Value = t.client.request(req).await.unwrap();
    assert_eq!(table["kind"], "Table");
    let cols: Vec<&str> =
        table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(cols, ["Name", "Size", "Ready", "Zone", "Size Text", "Color Number"]);
    assert_eq!(
        table["columnDefinitions"][1]["description"],
        "Custom resource definition column (in JSONPath format): .spec.size"
    );
    let row = &table["rows"][0]["cells"];
    assert_eq!(row[0], "tw");
    assert_eq!(row[1], 4);
    assert_eq!(row[2], "True");
    assert_eq!(row[3], "par");
    assert_eq!(row[4], "4");
    assert_eq!(row[5], Value::Null, "color is a string, the column an integer");
    t.cleanup().await;
}

/// A streaming list (`sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`) sends the current
/// objects as ADDED, then a BOOKMARK annotated `k8s.io/initial-events-end`, then changes.
async fn streaming_list_watcher(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("s1", json!({}))).await.unwrap();
    let mut stream =
        Box::pin(kube::runtime::watcher(cms.clone(), kube::runtime::watcher::Config::default().streaming_lists()));
    let mut saw_s1 = false;
    loop {
        match tokio::time::timeout(TIMEOUT, stream.try_next()).await.expect("in time").unwrap().unwrap() {
            kube::runtime::watcher::Event::InitApply(c) if c.metadata.name.as_deref() == Some("s1") => saw_s1 = true,
            kube::runtime::watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert!(saw_s1);
    cms.create(&PostParams::default(), &cm("s2", json!({}))).await.unwrap();
    loop {
        if let kube::runtime::watcher::Event::Apply(c) =
            tokio::time::timeout(TIMEOUT, stream.try_next()).await.expect("in time").unwrap().unwrap()
            && c.metadata.name.as_deref() == Some("s2")
        {
            break;
        }
    }
    t.cleanup().await;
}

/// kube-runtime's event Recorder creates an events.k8s.io/v1 Event, and a repeat becomes a
/// merge patch of the same Event with a `series` count.
async fn events_recorder_creates_and_counts(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let c = cms.create(&PostParams::default(), &cm("evented", json!({}))).await.unwrap();
    let recorder = kube::runtime::events::Recorder::new(t.client.clone(), "karpenter-hub-conformance".into());
    let reference = kube::Resource::object_ref(&c, &());
    let ev = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Tested".into(),
        note: Some("conformance".into()),
        action: "Test".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = t.api();
    let list = events.list(&ListParams::default()).await.unwrap();
    let ours: Vec<_> = list.items.iter().filter(|e| e.reason.as_deref() == Some("Tested")).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].series.as_ref().map(|s| s.count), Some(2));
    t.cleanup().await;
}

/// An Event is one object under both APIs: written through events.k8s.io/v1 (kube-runtime's
/// Recorder, as the hub does) it reads through core/v1 with `involvedObject` and `message`, and
/// `kubectl describe`'s field selector (involvedObject name, namespace, kind, uid) finds it; one
/// written through core/v1 reads through events.k8s.io/v1 with `regarding`, `note` and the
/// `deprecated*` fields. Each API takes only its own field names in selectors, and both Tables
/// show kube's Event columns (no leading Name).
async fn events_are_one_object_in_both_event_apis(t: Target) {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    let cms: Api<ConfigMap> = t.api();
    let c = cms.create(&PostParams::default(), &cm("evented", json!({}))).await.unwrap();
    let uid = c.metadata.uid.clone().unwrap();
    let recorder = kube::runtime::events::Recorder::new(t.client.clone(), "karpenter-hub-conformance".into());
    let ev = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: "Tested".into(),
        note: Some("through events.k8s.io".into()),
        action: "Test".into(),
        secondary: None,
    };
    let reference = kube::Resource::object_ref(&c, &());
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();

    let core: Api<CoreEvent> = t.api();
    let selector = format!(
        "involvedObject.name=evented,involvedObject.namespace={},involvedObject.kind=ConfigMap,involvedObject.uid={uid}",
        t.ns
    );
    let found = core.list(&ListParams::default().fields(&selector)).await.unwrap().items;
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(e.message.as_deref(), Some("through events.k8s.io"));
    assert_eq!(e.reason.as_deref(), Some("Tested"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_component.as_deref(), Some("karpenter-hub-conformance"));
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
    assert!(e.event_time.is_some());
    // `source` is the component, or else the reporting controller.
    let by_source = core.list(&ListParams::default().fields("source=karpenter-hub-conformance")).await.unwrap();
    assert_eq!(by_source.items.len(), 1, "{by_source:?}");
    let other = format!("involvedObject.name=evented,involvedObject.uid={uid}x");
    assert!(core.list(&ListParams::default().fields(&other)).await.unwrap().items.is_empty());

    let old_style: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "evented.core"},
        "involvedObject": {"kind": "ConfigMap", "name": "evented", "namespace": t.ns, "uid": uid},
        "reason": "Legacy", "message": "through core/v1", "type": "Normal", "count": 3,
        "source": {"component": "tester", "host": "h1"},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z",
    }))
    .unwrap();
    core.create(&PostParams::default(), &old_style).await.unwrap();
    let new: Api<NewEvent> = t.api();
    let n = new.get("evented.core").await.unwrap();
    assert_eq!(n.note.as_deref(), Some("through core/v1"));
    assert_eq!(n.regarding.as_ref().and_then(|r| r.uid.as_deref()), Some(uid.as_str()));
    assert_eq!(n.deprecated_count, Some(3));
    assert_eq!(n.deprecated_source.as_ref().and_then(|s| s.host.as_deref()), Some("h1"));
    assert_eq!(n.reporting_controller, None);
    let by_regarding = new.list(&ListParams::default().fields("regarding.name=evented")).await.unwrap().items;
    assert_eq!(by_regarding.len(), 2);
    let by_source = core.list(&ListParams::default().fields("source=tester")).await.unwrap().items;
    assert_eq!(by_source.len(), 1);
    let refused = api_err(new.list(&ListParams::default().fields("involvedObject.name=evented")).await);
    assert_eq!((refused.code, refused.message.as_str()), (400, "field label not supported: involvedObject.name"));

    for path in
        [format!("/api/v1/namespaces/{}/events", t.ns), format!("/apis/events.k8s.io/v1/namespaces/{}/events", t.ns)]
    {
        let req = http::Request::get(path.as_str())
            .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
            .body(Vec::new())
            .unwrap();
        let table: Value = t.client.request(req).await.unwrap();
        let cols: Vec<&str> =
            table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            cols,
            ["Last Seen", "Type", "Reason", "Object", "Subobject", "Source", "Message", "First Seen", "Count", "Name"],
            "{path}"
        );
        let rows = table["rows"].as_array().unwrap();
        let row = rows.iter().find(|r| r["cells"][9] == "evented.core").expect("the core event's row");
        assert_eq!(row["cells"][3], "configmap/evented");
        assert_eq!(row["cells"][5], "tester, h1");
        assert_eq!(row["cells"][8], 3);
        let row = rows.iter().find(|r| r["cells"][2] == "Tested").expect("the recorder's row");
        // The reporter, then its instance (kube-runtime's Recorder: the host name).
        assert!(row["cells"][5].as_str().unwrap().starts_with("karpenter-hub-conformance, "), "{row}");
        assert_eq!(row["cells"][6], "through events.k8s.io");
        assert_eq!(row["cells"][8], 2);
    }
    t.cleanup().await;
}

/// `/openapi/v3` lists each group-version; a CRD's document holds its schema under kube's name
/// (group reversed, version, kind) with the group-version-kind extension, `metadata` referring
/// to ObjectMeta (which the document defines), and the List kind: what `kubectl explain` reads.
async fn openapi_v3_publishes_crd_schemas(t: Target) {
    let _ = widgets(&t).await;
    let get = |path: String| {
        let client = t.client.clone();
        async move {
            let req = http::Request::get(path.as_str()).header("accept", "application/json").body(Vec::new()).unwrap();
            client.request::<Value>(req).await
        }
    };
    // The document is published some time after the CRD is established, and its hash changes as
    // other CRDs of the group are written (the conformance tests run side by side): the listed URL
    // and its document are read again together until the document holds the schema.
    let (url, doc) = eventually("the CRD's schema in its /openapi/v3 document", || async {
        let root = get("/openapi/v3".to_string()).await.ok()?;
        let url =
            root["paths"]["apis/conformance.karpenter.clever-cloud.com/v1"]["serverRelativeURL"].as_str()?.to_string();
        let doc = get(url.clone()).await.ok()?;
        doc["components"]["schemas"]
            .get("com.clever-cloud.karpenter.conformance.v1.Widget")
            .is_some()
            .then_some((url, doc))
    })
    .await;
    assert!(url.starts_with("/openapi/v3/apis/conformance.karpenter.clever-cloud.com/v1?hash="), "{url}");
    let schemas = &doc["components"]["schemas"];
    let w = &schemas["com.clever-cloud.karpenter.conformance.v1.Widget"];
    assert_eq!(
        w["x-kubernetes-group-version-kind"],
        json!([{"group": "conformance.karpenter.clever-cloud.com", "kind": "Widget", "version": "v1"}])
    );
    assert_eq!(w["properties"]["spec"]["properties"]["size"]["type"], "integer");
    assert_eq!(w["properties"]["spec"]["required"], json!(["size"]));
    assert_eq!(w["properties"]["apiVersion"]["type"], "string");
    assert_eq!(
        w["properties"]["metadata"]["allOf"][0]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["name"]["type"], "string");
    assert_eq!(
        schemas["com.clever-cloud.karpenter.conformance.v1.WidgetList"]["properties"]["items"]["items"]["$ref"],
        "#/components/schemas/com.clever-cloud.karpenter.conformance.v1.Widget"
    );
    assert!(get("/openapi/v3/apis/conformance.karpenter.clever-cloud.com/v9".into()).await.is_err());
    t.cleanup().await;
}

// ------------------------------------------------------------------ RBAC

/// A service account's token (TokenRequest) authenticates; RBAC lets it do what a RoleBinding
/// grants (here: get/list ConfigMaps and create pods/eviction in its namespace) and answers
/// `403 Forbidden` for anything else.
async fn rbac_limits_service_account_tokens(t: Target) {
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = t.api();
    sas.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "limited"}})).unwrap())
        .await
        .unwrap();
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = t.api();
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "read-cm"}, "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
            ]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let rbs: Api<k8s_openapi::api::rbac::v1::RoleBinding> = t.api();
    rbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "read-cm"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cm"},
            "subjects": [{"kind": "ServiceAccount", "name": "limited", "namespace": t.ns}]
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let tr: k8s_openapi::api::authentication::v1::TokenRequest = sas
        .create_token_request("limited", &PostParams::default(), &serde_json::from_value(json!({"spec": {}})).unwrap())
        .await
        .unwrap();
    let token = tr.status.unwrap().token;
    let mut cfg = t.config.clone();
    cfg.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };
    let limited = Client::try_from(cfg).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(limited.clone(), &t.ns);
    // Roles take effect at once in the emulator, within a moment on a real server.
    eventually("role effective", || async { cms.list(&ListParams::default()).await.ok() }).await;
    let s = api_err(cms.create(&PostParams::default(), &cm("nope", json!({}))).await);
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert!(s.message.contains(&format!("system:serviceaccount:{}:limited", t.ns)), "{}", s.message);
    let pods: Api<Pod> = Api::namespaced(limited.clone(), &t.ns);
    assert_eq!(api_err(pods.list(&ListParams::default()).await).code, 403);
    let nodes: Api<Node> = Api::all(limited);
    assert_eq!(api_err(nodes.list(&ListParams::default()).await).code, 403);
    t.cleanup().await;
}

/// Metadata-only requests (`as=PartialObjectMetadata`) return `PartialObjectMetadata` objects and
/// lists (kube's `list_metadata`, `metadata_watcher`): just the metadata, no spec or data.
async fn metadata_only_list_get_and_watch(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    cms.create(&PostParams::default(), &cm("m1", json!({"big": "x"}))).await.unwrap();
    let list = cms.list_metadata(&ListParams::default()).await.unwrap();
    let m1 = list.items.iter().find(|o| o.metadata.name.as_deref() == Some("m1")).expect("m1 listed");
    assert_eq!(m1.types.as_ref().map(|t| t.kind.as_str()), Some("PartialObjectMetadata"));
    let one = cms.get_metadata("m1").await.unwrap();
    assert!(one.metadata.uid.is_some());
    let metas: Api<kube::core::PartialObjectMeta<ConfigMap>> = Api::namespaced(t.client.clone(), &t.ns);
    let mut stream = Box::pin(kube::runtime::watcher(metas, kube::runtime::watcher::Config::default()));
    cms.create(&PostParams::default(), &cm("m2", json!({}))).await.unwrap();
    loop {
        match tokio::time::timeout(TIMEOUT, stream.try_next()).await.expect("in time").unwrap().unwrap() {
            kube::runtime::watcher::Event::Apply(o) | kube::runtime::watcher::Event::InitApply(o)
                if o.metadata.name.as_deref() == Some("m2") =>
            {
                break;
            }
            _ => {}
        }
    }
    t.cleanup().await;
}

/// A CRD's scale subresource maps `spec.replicas`/`status.replicas` of an `autoscaling/v1` Scale to
/// the declared paths; writing the Scale writes the object.
async fn crd_scale_subresource(t: Target) {
    let w = widgets(&t).await;
    w.create(&PostParams::default(), &widget("sc", json!({"size": 2}))).await.unwrap();
    w.patch_status("sc", &PatchParams::default(), &Patch::Merge(json!({"status": {"observed": 2}}))).await.unwrap();
    let scale = w.get_scale("sc").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().replicas, 2);
    w.patch_scale("sc", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}}))).await.unwrap();
    let obj = w.get("sc").await.unwrap();
    assert_eq!(obj.data["spec"]["size"], 5);
    assert_eq!(obj.metadata.generation, Some(2));
    t.cleanup().await;
}

/// Posting a CRD makes its resource served (list works once Established); deleting the CRD
/// removes its objects and stops serving the resource (list is `404 NotFound`), which is how a
/// client tells that an API (e.g. NodeGroups) is not served.
async fn crd_lifecycle_serves_and_unserves_the_resource(t: Target) {
    let id = suffix();
    let plural = format!("gadgets{id}");
    let singular = format!("gadget{id}");
    let group = "conformance.karpenter.clever-cloud.com";
    let name = format!("{plural}.{group}");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": plural, "kind": format!("Gadget{id}"), "singular": singular},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    let kind = crd.spec.names.kind.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(t.client.clone());
    let gvk = GroupVersionKind::gvk(group, "v1", &kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    let api: Api<DynamicObject> = Api::all_with(t.client.clone(), &ar);
    assert_eq!(api_err(api.list(&ListParams::default()).await).code, 404, "not served before the CRD exists");
    crds.create(&PostParams::default(), &crd).await.unwrap();
    eventually("served", || async { api.list(&ListParams::default()).await.ok().map(|_| ()) }).await;
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": kind, "metadata": {"name": "one"}, "anything": {"goes": true}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    crds.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually("unserved", || async {
        matches!(api.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    eventually("CRD gone", || async {
        matches!(crds.get(&name).await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    t.cleanup().await;
}

/// `dryRun=All` on create, patch and delete returns what the write would produce (validated like
/// a real write) and stores nothing.
async fn dry_run_writes_store_nothing(t: Target) {
    let cms: Api<ConfigMap> = t.api();
    let pp = PostParams { dry_run: true, ..Default::default() };
    let out = cms.create(&pp, &cm("dry", json!({"k": "1"}))).await.unwrap();
    assert_eq!(out.metadata.name.as_deref(), Some("dry"));
    assert_eq!(api_err(cms.get("dry").await).code, 404);
    cms.create(&PostParams::default(), &cm("real", json!({"k": "1"}))).await.unwrap();
    let dry_patch = PatchParams { dry_run: true, ..Default::default() };
    let out = cms.patch("real", &dry_patch, &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    assert_eq!(out.data.unwrap()["k"], "2");
    assert_eq!(cms.get("real").await.unwrap().data.unwrap()["k"], "1");
    cms.delete("real", &DeleteParams { dry_run: true, ..Default::default() }).await.unwrap();
    assert!(cms.get("real").await.is_ok());
    // Validation still applies.
    let w = widgets(&t).await;
    let s = api_err(w.create(&pp, &widget("bad", json!({"size": 0}))).await);
    assert_eq!(s.code, 422);
    t.cleanup().await;
}
