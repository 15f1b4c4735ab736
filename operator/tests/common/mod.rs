//! Helpers shared by the operator's end-to-end tests on the simulated world.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use operator::commands::sandbox::world::World;
use serde_json::Value;

pub const EXAMPLE: &str = include_str!("../../../examples/general-purpose.yaml");

/// How often the waiting helpers look again.
const POLL: Duration = Duration::from_millis(200);

/// Poll `check` every 200 ms until it holds; panic naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(poll_until(timeout, check).await, "timed out waiting for {what}");
}

/// Poll `check` every 200 ms until it holds (`true`) or `timeout` has passed (`false`), for callers
/// that fail with a message of their own.
pub async fn poll_until<F, Fut>(timeout: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_every(POLL, timeout, check).await
}

/// [`poll_until`] looking every `every`, for checks that also sample something as they go (a
/// timing, the most seen at once) and need a finer grain.
pub async fn poll_every<F, Fut>(every: Duration, timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
    true
}

/// Wait for quiet, then return what `watched` shows: quiet is `watched` (write counters, resource
/// versions) unchanged while the hub was observably at work — `progress` (a count of its rounds,
/// probes or reads) advanced by `steps` since the last change. A change restarts the count, so a
/// busy hub is waited for, not judged mid-way; the caller then asserts its negative (also on
/// cumulative counters, which a change that came and went still shows). Panics after `timeout`.
pub async fn wait_quiet_over<T, W, WFut, P, PFut>(
    what: &str,
    timeout: Duration,
    steps: u64,
    watched: W,
    mut progress: P,
) -> T
where
    T: PartialEq + std::fmt::Debug,
    W: FnMut() -> WFut,
    WFut: std::future::Future<Output = T>,
    P: FnMut() -> PFut,
    PFut: std::future::Future<Output = u64>,
{
    settle(what, timeout, watched, &mut progress, |_, advanced| advanced >= steps).await
}

/// Wait for quiet where the hub's work shows no count (nothing is pending, it only reacts to
/// changes): quiet is `watched` unchanged for `window`. The caller first waits for what the hub
/// writes once it has processed the trigger (a condition, an event, pods Running).
pub async fn wait_quiet<T, W, WFut>(what: &str, timeout: Duration, window: Duration, watched: W) -> T
where
    T: PartialEq + std::fmt::Debug,
    W: FnMut() -> WFut,
    WFut: std::future::Future<Output = T>,
{
    settle(what, timeout, watched, &mut || async { 0 }, |quiet_for, _| quiet_for >= window).await
}

async fn settle<T, W, WFut, P, PFut>(
    what: &str,
    timeout: Duration,
    mut watched: W,
    progress: &mut P,
    quiet_enough: impl Fn(Duration, u64) -> bool,
) -> T
where
    T: PartialEq + std::fmt::Debug,
    W: FnMut() -> WFut,
    WFut: std::future::Future<Output = T>,
    P: FnMut() -> PFut,
    PFut: std::future::Future<Output = u64>,
{
    let start = tokio::time::Instant::now();
    let (mut last, mut since, mut base) = (watched().await, start, progress().await);
    let mut changes = 0;
    loop {
        tokio::time::sleep(POLL).await;
        let (now, at) = (watched().await, progress().await);
        let t = tokio::time::Instant::now();
        if now != last {
            (last, since, base) = (now, t, at);
            changes += 1;
        } else if quiet_enough(t - since, at.saturating_sub(base)) {
            eprintln!("{what}: quiet after {:?} ({changes} changes waited out)", t - start);
            return last;
        }
        assert!(
            t - start < timeout,
            "{what}: not quiet within {timeout:?} ({changes} changes; quiet for {:?}, progress +{} since): {last:?}",
            t - since,
            at.saturating_sub(base)
        );
    }
}

/// A workload pod (`app: web`) that wants a node of its own: required anti-affinity on the hostname
/// against the other `app: web` pods. As JSON, to edit further before creating it.
pub fn pod_alone_on_its_node(name: &str, cpu: &str, memory: &str) -> Value {
    let mut pod = serde_json::to_value(operator::commands::sandbox::world::workload_pod(name, cpu, memory)).unwrap();
    pod["spec"]["affinity"] = serde_json::json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": crds::labels::HOSTNAME, "labelSelector": {"matchLabels": {"app": "web"}}}
    ]}});
    pod
}

/// The value of the sample `name` with (at least) these labels in the hub's metrics, summed over
/// the series that match; 0 when there is none.
pub fn metric(world: &World, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_in(&world.metrics, name, labels)
}

/// [`metric`] in any hub's metrics (a replica of its own, say).
pub fn metric_in(metrics: &operator::infra::metrics::Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = metrics.render();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            let pairs = rest.strip_suffix('}')?;
            let matches =
                n == name && labels.iter().all(|(k, v)| pairs.split(',').any(|p| p == format!("{k}=\"{v}\"")));
            if matches { value.parse::<f64>().ok() } else { None }
        })
        .sum()
}

/// Provisioning rounds the hub has run for cluster `i` (each observes the scheduling duration;
/// a round runs for news: a pod that started waiting, a change of pools, classes, catalogues or a
/// claim going away; and every 10 s while pods still wait).
pub fn rounds(world: &World, i: usize) -> u64 {
    let c = &world.clusters[i];
    let cluster = format!("{}/{}", c.namespace, c.name);
    metric(world, "karpenter_provisioner_scheduling_duration_seconds_count", &[("cluster", &cluster)]) as u64
}

/// Health probes the hub has made of cluster `i` (every probe interval while it is connected):
/// the hub seen at work when nothing else it does shows a count.
pub fn probes(world: &World, i: usize) -> u64 {
    let c = &world.clusters[i];
    let cluster = format!("{}/{}", c.namespace, c.name);
    metric(world, "karpenter_hub_cluster_probes_total", &[("cluster", &cluster)]) as u64
}

/// Write counts by (verb, resource, count).
pub type Writes = Vec<(String, String, u64)>;

/// Writes (create, update, patch, delete) `server` has answered on each of `resources`, by (verb,
/// resource): a change that came and went still shows here.
pub fn writes(server: &sim::apiserver::ApiServer, resources: &[&str]) -> Writes {
    server
        .requests()
        .snapshot()
        .into_iter()
        .filter(|((verb, resource), _)| {
            ["create", "update", "patch", "delete", "deletecollection"].contains(&verb.as_str())
                && resources.contains(&resource.as_str())
        })
        .map(|((verb, resource), n)| (verb, resource, n))
        .collect()
}

/// Apply `examples/general-purpose.yaml` in cluster `i`'s namespace, its NodePool pointed at it.
pub async fn apply_example(world: &World, i: usize) {
    apply_example_with(world, i, |_| {}).await;
}

/// [`apply_example`] with the NodePool's spec edited by `edit` too.
pub async fn apply_example_with(world: &World, i: usize, edit: impl Fn(&mut serde_json::Map<String, Value>)) {
    let c = &world.clusters[i];
    let name = c.name.clone();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(name.clone());
                if let Some(spec) = doc["spec"].as_object_mut() {
                    edit(spec);
                }
            }
        })
        .await
        .unwrap();
}

/// Pods Running in cluster `i`'s `default` namespace (0 when the list fails).
pub async fn running(world: &World, i: usize) -> usize {
    Api::<Pod>::namespaced(world.clusters[i].client(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The `.yaml`/`.yml` files directly in `dir`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// The non-empty documents of a YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", path.display()))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// `ClusterReachable` of the pool `default` in `ns`: (status, reason, lastTransitionTime).
pub async fn reachable(mgmt: &kube::Client, ns: &str) -> Option<(String, String, String)> {
    let pool = Api::<crds::NodePool>::namespaced(mgmt.clone(), ns).get("default").await.ok()?;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.status, c.reason, c.last_transition_time.0.to_string()))
}

/// Wait until the pool `default` in `ns` says `ClusterReachable={status}` for `reason`.
pub async fn wait_reachable(mgmt: &kube::Client, ns: &str, status: &str, reason: &str, timeout: Duration) {
    wait_for(&format!("{ns}: ClusterReachable={status}/{reason}"), timeout, || async {
        reachable(mgmt, ns).await.is_some_and(|(s, r, _)| s == status && r == reason)
    })
    .await;
}

/// The identity a hub on management cluster `mgmt` writes on its NodeGroups: the UID of its
/// `kube-system` namespace.
pub async fn management_cluster(mgmt: &kube::Client) -> String {
    operator::infra::identity::read(mgmt).await.expect("the management cluster's kube-system namespace")
}

/// Create in a workload cluster a NodeGroup carrying every label and annotation hub `hub_id` of
/// management cluster `management_cluster` puts on the group of NodeClaim `namespace/claim` (UID
/// `claim_uid`), without that claim existing: an orphan of that hub (or, for another hub id or
/// management cluster, a group this hub must never touch). Returns its name and UID.
pub async fn claimed_looking_group(
    client: &kube::Client,
    (hub_id, management_cluster): (&str, &str),
    namespace: &str,
    (claim, claim_uid): (&str, &str),
    flavor: &str,
    node_count: i32,
) -> (String, String) {
    use kube::ResourceExt;
    let id = operator::decisions::ownership::ClaimIdentity {
        hub_id,
        management_cluster,
        namespace,
        claim,
        claim_uid,
        nodepool: "default",
        nodeclass: "default",
    };
    let group = crds::NodeGroup {
        metadata: kube::api::ObjectMeta {
            name: Some(id.nodegroup_name()),
            labels: Some(id.labels()),
            annotations: Some(id.annotations("0")),
            ..Default::default()
        },
        spec: crds::nodegroup::NodeGroupSpec { flavor: flavor.into(), node_count, labels: None, taints: None },
        status: None,
    };
    let created = Api::<crds::NodeGroup>::all(client.clone())
        .create(&kube::api::PostParams::default(), &group)
        .await
        .expect("create the NodeGroup");
    (created.name_any(), created.uid().expect("a created object has a UID"))
}

/// Everything a log subscriber writes to it, shared with that subscriber (tests that search a run's
/// whole output for what must never be printed).
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

/// Wait until the clock has passed the second in which the Secret `ns/name` was created: a Secret
/// written after this is a second younger (creation times have a one-second resolution), so which
/// of two registrations is older is settled.
pub async fn a_second_after_the_secret(mgmt: &kube::Client, ns: &str, name: &str) {
    let created = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(mgmt.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .unwrap()
        .0
        .as_second();
    wait_for("the next second", Duration::from_secs(3), || async move {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 > created
    })
    .await;
}

/// A minimal `clusters.cluster.x-k8s.io` (v1beta1, any fields), as Cluster API installs it.
pub fn cluster_api_cluster_crd() -> Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "names": {"kind": "Cluster", "plural": "clusters", "singular": "cluster", "listKind": "ClusterList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1beta1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    })
}

/// Create the hub's CRDs on a real API server (those already there are kept) and wait until
/// NodePools are served.
pub async fn install_hub_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in crds::crd::hub_crds() {
        match api.create(&kube::api::PostParams::default(), &file.crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("installing {}: {e}", file.file_name),
        }
    }
    wait_for("nodepools served", Duration::from_secs(30), || async {
        Api::<crds::NodePool>::all(client.clone()).list(&ListParams::default().limit(1)).await.is_ok()
    })
    .await;
}

/// Create namespace `name`.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await
        .unwrap();
}

/// A kubeconfig for `workload` holding a bound token (a TokenRequest, valid a day) of the
/// ServiceAccount `sa` of namespace `ns`, as `kubectl create token` gives one: the emulator
/// enforces RBAC for it.
pub async fn bound_token_kubeconfig(workload: &sim::apiserver::ApiServer, ns: &str, sa: &str) -> String {
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": [], "expirationSeconds": 86_400}})).unwrap();
    let token = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(workload.client(), ns)
        .create_token_request(sa, &kube::api::PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    // A ByteString serialises as base64: certificate-authority-data without a base64 dependency.
    let ca = serde_json::to_value(k8s_openapi::ByteString(workload.ca_pem().as_bytes().to_vec())).unwrap();
    let name = workload.name();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: karpenter-hub\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: karpenter-hub\ncurrent-context: {name}\n",
        workload.url(),
        ca.as_str().unwrap()
    )
}

/// NodePool `name` of namespace `ns` in `world`'s management cluster, its condition `type_` if it
/// is `True` (None while the pool or the condition is missing or not True).
pub async fn pool_condition_true(
    world: &World,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    Api::<crds::NodePool>::namespaced(world.mgmt.client(), ns)
        .get(name)
        .await
        .ok()
        .and_then(|p| p.status)
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_ && c.status == "True"))
}
