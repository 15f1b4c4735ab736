//! End to end on real API servers (testing.md §1, opt-in), and the same run on emulators in CI.
//!
//! [`run_e2e`] drives the hub exactly as an operator would, through kubeconfig files only:
//! 1. installs the hub's CRDs on the management cluster (what `karpenter-hub crds` prints; created,
//!    or replaced when present) and, on each workload cluster that does not serve NodeGroups, the
//!    stand-in NodeGroup CRD (`crds/testing/`; a cluster that serves NodeGroups is never touched);
//! 2. refuses to go on if the management cluster holds NodePools or NodeClaims of anyone else (the
//!    in-process hub would serve them too);
//! 3. plays CKE on each workload cluster with the simulated CKE (`karpenter-hub sim-cke`), unless
//!    `KARPENTER_HUB_E2E_REAL_CKE=1`;
//! 4. per workload cluster: a management namespace, the registration Secret holding that cluster's
//!    kubeconfig file, `examples/general-purpose.yaml` pointed at the cluster; a namespace with the
//!    workload in the workload cluster;
//! 5. runs the hub in process (`operator::commands::run::run_with`, a hub id of its own) — or, on
//!    envtest, finds it running as the chart installs it (the caller started it) — waits for the pods
//!    to run and asserts what `tests/hub.rs` asserts on the simulated world (one NodeGroup per
//!    NodeClaim, the cheapest fitting flavor, providerID stamped, ownership labels, the pods on the
//!    hub's node);
//! 6. scales the workload to zero, deletes the NodeClaims and checks that no NodeGroup or Node of
//!    this run is left;
//! 7. cleans up whatever it created, also after a failure: workload namespaces, NodeClaims (and, if
//!    the hub cannot release them in time, this run's NodeGroups directly), management namespaces.
//!
//! Names carry a run id (`KARPENTER_HUB_E2E_RUN_ID`, default: from the clock and the pid), so runs
//! never collide; objects are labelled `app.kubernetes.io/created-by=karpenter-hub-e2e` and
//! `karpenter-hub-e2e/run=<id>` for manual cleanup after a killed run. Deadlines on real servers
//! are the suggested ones of clever-cloud.md §9 ("Timing envelope").
//!
//! Variables: `KARPENTER_HUB_E2E_MGMT_KUBECONFIG`, `KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS`
//! (comma-separated), optional `KARPENTER_HUB_E2E_REAL_CKE=1`, `KARPENTER_HUB_E2E_SIM_NO_BINDER=1`
//! (a real kube-scheduler binds pods; like `sim-cke --no-binder`), `KARPENTER_HUB_E2E_RUN_ID`.
//! See docs/hub.md, "End-to-end test".
//!
//! In CI the same [`run_e2e`] runs on emulators and on two envtest control planes (real
//! kube-apiserver, etcd and controller manager), the latter with the identity `karpenter-hub
//! register` minted in the workload plane, under that plane's audit log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    cell::Cell,
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use crds::{CleverNodeClass, NodeClaim, NodeGroup, NodePool, labels};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Node, Pod, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
};
use operator::{commands::run, decisions::ownership, infra::hub, infra::metrics::Metrics, infra::registry};
use serde_json::{Value, json};
use sim::{
    apiserver::{ApiServer, ApiServerConfig},
    cke::SimCkeConfig,
};
use tokio_util::sync::CancellationToken;

use crate::common;
use common::poll_every;

const EXAMPLE: &str = include_str!("../../../examples/general-purpose.yaml");
const CREATED_BY: &str = "app.kubernetes.io/created-by";
const CREATED_BY_VALUE: &str = "karpenter-hub-e2e";
const RUN_LABEL: &str = "karpenter-hub-e2e/run";
/// An image that runs anywhere and does nothing (the pods only need to be Running).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// How long each step may take.
#[derive(Debug, Clone)]
struct Deadlines {
    /// CRDs established, NodeGroup API served, clusters connected, node classes Ready.
    setup: Duration,
    /// Pod pending → Running on a new node.
    running: Duration,
    /// Scale to zero: pods gone, claims gone, NodeGroups and their Nodes gone.
    cleanup: Duration,
    /// Time between two looks at the API.
    poll: Duration,
}

impl Deadlines {
    /// The suggested deadlines of clever-cloud.md §9 (real CKE: pod → Running worst seen ~185 s).
    fn envelope() -> Self {
        Deadlines {
            setup: Duration::from_secs(120),
            running: Duration::from_secs(8 * 60),
            cleanup: Duration::from_secs(12 * 60),
            poll: Duration::from_secs(2),
        }
    }

    /// On emulators with a quick simulated CKE a step takes seconds: fail fast.
    fn emulated() -> Self {
        Deadlines {
            setup: Duration::from_secs(30),
            running: Duration::from_secs(60),
            cleanup: Duration::from_secs(60),
            poll: Duration::from_millis(200),
        }
    }
}

/// One end-to-end run.
#[derive(Debug, Clone)]
struct E2e {
    mgmt_kubeconfig: PathBuf,
    workload_kubeconfigs: Vec<PathBuf>,
    /// One simulated CKE configuration per workload cluster; `None`: CKE itself serves NodeGroups.
    sim_cke: Option<Vec<SimCkeConfig>>,
    /// Per workload cluster, the kubeconfig its registration Secret holds (what the hub uses), when
    /// it is not the workload kubeconfig itself, e.g. the least-privilege one `karpenter-hub
    /// register` minted. The run itself always uses the workload kubeconfig.
    hub_kubeconfigs: Option<Vec<PathBuf>>,
    /// The caller runs the hub (with the hub id `e2e-<run_id>`); else it runs in process.
    external_hub: bool,
    deadlines: Deadlines,
    run_id: String,
}

impl E2e {
    /// The run the environment asks for; `None` when the variables are unset.
    fn from_env() -> Result<Option<E2e>> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let (mgmt, workloads) = match (
            var("KARPENTER_HUB_E2E_MGMT_KUBECONFIG"),
            var("KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS"),
        ) {
            (None, None) => return Ok(None),
            (Some(m), Some(w)) => (m, w),
            _ => bail!(
                "set both KARPENTER_HUB_E2E_MGMT_KUBECONFIG and KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS (comma-separated), or neither"
            ),
        };
        let workload_kubeconfigs: Vec<PathBuf> =
            workloads.split(',').map(str::trim).filter(|p| !p.is_empty()).map(PathBuf::from).collect();
        ensure!(!workload_kubeconfigs.is_empty(), "KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS names no file");
        let flag = |name: &str| var(name).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        let sim_cke = (!flag("KARPENTER_HUB_E2E_REAL_CKE")).then(|| {
            let binder = !flag("KARPENTER_HUB_E2E_SIM_NO_BINDER");
            // What `karpenter-hub sim-cke --seed <i+1>` runs: CKE's typical timings.
            (0..workload_kubeconfigs.len())
                .map(|i| SimCkeConfig { seed: i as u64 + 1, binder, ..SimCkeConfig::default() })
                .collect()
        });
        let run_id = match var("KARPENTER_HUB_E2E_RUN_ID") {
            Some(id) => id,
            None => new_run_id(),
        };
        Ok(Some(E2e {
            mgmt_kubeconfig: PathBuf::from(mgmt),
            workload_kubeconfigs,
            sim_cke,
            hub_kubeconfigs: None,
            external_hub: false,
            deadlines: Deadlines::envelope(),
            run_id,
        }))
    }
}

/// Eight lowercase hex digits from the clock and the pid: a DNS label and a label value.
fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
    format!("{:08x}", (mixed ^ (mixed >> 29)) as u32)
}

/// The workload of one cluster and the node it must get (clever-cloud.md §9, measured on live CKE).
#[derive(Debug, Clone, Copy)]
struct Scenario {
    what: &'static str,
    pods: usize,
    cpu: &'static str,
    memory: &'static str,
    flavor: &'static str,
}

const SCENARIOS: [Scenario; 3] = [
    // 3 × 1500Mi do not fit a 2XS (3.63Gi allocatable): one XS (0.0611 EUR/h), not 2 × 2XS (0.0666).
    Scenario { what: "cheapest packing", pods: 3, cpu: "1", memory: "1500Mi", flavor: "XS" },
    Scenario { what: "provisioning", pods: 1, cpu: "1", memory: "1500Mi", flavor: "2XS" },
    // A 2XS cannot hold 5Gi.
    Scenario { what: "small flavors", pods: 1, cpu: "500m", memory: "5Gi", flavor: "XS" },
];

/// One workload cluster of the run.
struct Cluster {
    /// The NodePool's `clusterName` and the registration Secret's `<cluster>-kubeconfig`.
    name: String,
    kubeconfig: PathBuf,
    /// What its registration Secret holds ([`E2e::hub_kubeconfigs`]; by default `kubeconfig`).
    hub_kubeconfig: PathBuf,
    /// Management namespace holding its Secret, node class, NodePool and NodeClaims.
    mgmt_ns: String,
    client: Client,
    scenario: Scenario,
}

struct Ctx<'a> {
    cfg: &'a E2e,
    mgmt: Client,
    clusters: Vec<Cluster>,
    hub_id: String,
    /// Namespace of the workload in every workload cluster.
    workload_ns: String,
    /// Every NodeGroup of this run ever listed (its Nodes are looked up by name at the end).
    seen_groups: std::sync::Mutex<BTreeSet<String>>,
}

/// What a run measured.
#[derive(Debug, Default)]
struct Report {
    clusters: usize,
    setup: Duration,
    connected: Duration,
    running: Duration,
    scaled_down: Duration,
    total: Duration,
    nodegroups: Vec<String>,
    cleanup_notes: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "end-to-end run over {} workload cluster(s):", self.clusters)?;
        writeln!(f, "  CRDs and NodeGroup API ready  {:>7.1}s", self.setup.as_secs_f64())?;
        writeln!(f, "  clusters connected, classes Ready {:>3.1}s", self.connected.as_secs_f64())?;
        writeln!(f, "  pods pending → Running        {:>7.1}s", self.running.as_secs_f64())?;
        writeln!(f, "  scale to zero, nothing left   {:>7.1}s", self.scaled_down.as_secs_f64())?;
        writeln!(f, "  total (cleanup included)      {:>7.1}s", self.total.as_secs_f64())?;
        writeln!(f, "  NodeGroups created: {}", self.nodegroups.join(", "))?;
        for n in &self.cleanup_notes {
            writeln!(f, "  cleanup: {n}")?;
        }
        Ok(())
    }
}

/// Poll `probe` until it returns `Ok(Ok(v))`. `Ok(Err(state))` and API errors mean "not yet"; the
/// last of them is in the timeout's message.
async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, poll: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Result<T, String>>>,
{
    let (got, last) = (Cell::new(None), Cell::new(String::new()));
    let (got_ref, last_ref) = (&got, &last);
    poll_every(poll, timeout, || {
        let probed = probe();
        async move {
            match probed.await {
                Ok(Ok(v)) => {
                    got_ref.set(Some(v));
                    return true;
                }
                Ok(Err(state)) => last_ref.set(state),
                Err(e) => last_ref.set(format!("API error: {e:#}")),
            }
            false
        }
    })
    .await;
    got.into_inner()
        .ok_or_else(|| anyhow!("timed out after {timeout:?} waiting for {what}; last seen: {}", last.take()))
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn show(c: Option<&Condition>) -> String {
    c.map_or_else(|| "no condition".to_string(), |c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
}

fn is_api_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn run_labels(run_id: &str) -> Value {
    json!({CREATED_BY: CREATED_BY_VALUE, RUN_LABEL: run_id})
}

// ---------------------------------------------------------------------------------------------
// Installing what the run needs (idempotent).

/// `karpenter-hub crds | kubectl apply -f -`: each CRD created, or replaced when present; then
/// established and served.
async fn install_hub_crds(mgmt: &Client, d: &Deadlines) -> Result<()> {
    let yaml = crds::crd::render_all().context("rendering the CRDs")?;
    let crds: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&yaml).context("parsing the output of `karpenter-hub crds`")?;
    ensure!(!crds.is_empty(), "`karpenter-hub crds` printed no CRD");
    let api: Api<CustomResourceDefinition> = Api::all(mgmt.clone());
    for crd in &crds {
        let name = crd.name_any();
        match api.create(&PostParams::default(), crd).await {
            Ok(_) => {}
            Err(e) if is_api_status(&e, 409) => {
                let current = api.get(&name).await.with_context(|| format!("reading CRD {name}"))?;
                let mut desired = crd.clone();
                desired.metadata.resource_version = current.resource_version();
                api.replace(&name, &PostParams::default(), &desired)
                    .await
                    .with_context(|| format!("updating CRD {name}"))?;
            }
            Err(e) => return Err(anyhow!(e).context(format!("creating CRD {name}"))),
        }
    }
    for crd in &crds {
        wait_established(mgmt, crd, d).await?;
    }
    Ok(())
}

async fn wait_established(client: &Client, crd: &CustomResourceDefinition, d: &Deadlines) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    let group_version = format!("{}/{}", crd.spec.group, crd.spec.versions.first().map_or("", |v| v.name.as_str()));
    let plural = crd.spec.names.plural.clone();
    wait_until(&format!("CRD {name} established and served"), d.setup, d.poll, || async {
        let live = api.get(&name).await?;
        let established = live
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if !established {
            return Ok(Err("not Established".to_string()));
        }
        let served = client.list_api_group_resources(&group_version).await?;
        Ok(if served.resources.iter().any(|r| r.name == plural) {
            Ok(())
        } else {
            Err(format!("{plural} not in the discovery of {group_version}"))
        })
    })
    .await
}

/// Whether the cluster serves `nodegroups.api.clever-cloud.com/v1` (what the hub checks too).
async fn serves_nodegroups(client: &Client) -> Result<bool> {
    match client.list_api_group_resources(&NodeGroup::api_version(&())).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "nodegroups")),
        Err(e) if is_api_status(&e, 404) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Make the NodeGroup API served: skip when it is (real CKE, or an earlier run installed it),
/// otherwise install the stand-in CRD — never on real CKE, whose CRD is its own.
async fn ensure_nodegroup_api(c: &Cluster, real_cke: bool, d: &Deadlines) -> Result<()> {
    if serves_nodegroups(&c.client).await.with_context(|| format!("{}: discovery", c.kubeconfig.display()))? {
        return Ok(());
    }
    ensure!(
        !real_cke,
        "{} does not serve nodegroups.api.clever-cloud.com but KARPENTER_HUB_E2E_REAL_CKE=1: is it a CKE cluster?",
        c.kubeconfig.display()
    );
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    for file in crds::crd::testing_crds() {
        match api.create(&PostParams::default(), &file.crd).await {
            Ok(_) => {}
            Err(e) if is_api_status(&e, 409) => {} // being installed by someone else
            Err(e) => {
                return Err(anyhow!(e).context(format!("{}: installing the NodeGroup CRD", c.kubeconfig.display())));
            }
        }
        wait_established(&c.client, &file.crd, d).await?;
    }
    Ok(())
}

/// The in-process hub serves every NodePool and NodeClaim of the management cluster: refuse to run
/// where someone else's exist (on a real fleet it would provision for them, with another hub id).
async fn refuse_foreign_objects(mgmt: &Client, ours: &BTreeSet<String>) -> Result<()> {
    let lp = ListParams::default();
    let mut foreign = Vec::new();
    for p in Api::<NodePool>::all(mgmt.clone()).list(&lp).await.context("listing NodePools")?.items {
        foreign.push(format!("NodePool {}/{}", p.namespace().unwrap_or_default(), p.name_any()));
    }
    for c in Api::<NodeClaim>::all(mgmt.clone()).list(&lp).await.context("listing NodeClaims")?.items {
        foreign.push(format!("NodeClaim {}/{}", c.namespace().unwrap_or_default(), c.name_any()));
    }
    foreign.retain(|f| !ours.iter().any(|ns| f.contains(&format!(" {ns}/"))));
    ensure!(
        foreign.is_empty(),
        "the management cluster already holds {}; the test's hub would serve them too. Use a management \
         cluster of its own (leftovers of a killed run: `kubectl delete ns -l {CREATED_BY}={CREATED_BY_VALUE}`)",
        foreign.join(", ")
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The scenario.

async fn create_namespace(client: &Client, name: &str, run_id: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": run_labels(run_id)}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// The registration Secret of hub.md §1, holding the kubeconfig file as it is.
async fn register(mgmt: &Client, c: &Cluster, run_id: &str) -> Result<()> {
    let bytes = std::fs::read(&c.hub_kubeconfig).with_context(|| format!("reading {}", c.hub_kubeconfig.display()))?;
    let mut labels = run_labels(run_id);
    labels[registry::CLUSTER_NAME_LABEL] = Value::String(c.name.clone());
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-kubeconfig", c.name), "labels": labels},
        "type": "cluster.x-k8s.io/secret",
    }))?;
    secret.data = Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), ByteString(bytes))]));
    Api::<Secret>::namespaced(mgmt.clone(), &c.mgmt_ns)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating the registration Secret in {}", c.mgmt_ns))?;
    Ok(())
}

/// `kubectl create -n <ns> -f examples/general-purpose.yaml`, the NodePool pointed at the cluster.
async fn apply_example(mgmt: &Client, c: &Cluster) -> Result<()> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(EXAMPLE).context("parsing examples/general-purpose.yaml")?;
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        if kind == "NodePool" {
            doc["spec"]["clusterName"] = Value::String(c.name.clone());
        }
        let (group, version) = doc["apiVersion"].as_str().unwrap_or_default().split_once('/').unwrap_or_default();
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let obj: DynamicObject = serde_json::from_value(doc)?;
        Api::<DynamicObject>::namespaced_with(mgmt.clone(), &c.mgmt_ns, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("creating {kind} {} in {}", obj.name_any(), c.mgmt_ns))?;
    }
    Ok(())
}

fn workload_pod(name: &str, ns: &str, s: &Scenario, run_id: &str) -> Result<Pod> {
    let mut labels = run_labels(run_id);
    labels["app"] = Value::String("inflate".into());
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "nodeSelector": {labels::CLEVER_NODE_ROLE: "worker"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "pause",
                "image": PAUSE_IMAGE,
                "resources": {"requests": {"cpu": s.cpu, "memory": s.memory}},
            }],
        },
    }))?)
}

fn pod_state(p: &Pod) -> String {
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Unknown".into());
    let why = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
        .and_then(|c| c.message.clone())
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    format!("{} {phase}{why}", p.name_any())
}

/// This run's NodeGroups in a workload cluster for one management namespace.
async fn owned_groups(ctx: &Ctx<'_>, c: &Cluster) -> Result<Vec<NodeGroup>> {
    let selector = format!("{}={},{}={}", labels::HUB, ctx.hub_id, labels::NODECLAIM_NAMESPACE, c.mgmt_ns);
    let groups = Api::<NodeGroup>::all(c.client.clone()).list(&ListParams::default().labels(&selector)).await?.items;
    ctx.seen_groups.lock().unwrap().extend(groups.iter().map(ResourceExt::name_any));
    Ok(groups)
}

async fn claims(mgmt: &Client, ns: &str) -> Result<Vec<NodeClaim>> {
    Ok(Api::<NodeClaim>::namespaced(mgmt.clone(), ns).list(&ListParams::default()).await?.items)
}

async fn scenario(ctx: &Ctx<'_>, report: &mut Report) -> Result<()> {
    let d = &ctx.cfg.deadlines;
    let run_id = &ctx.cfg.run_id;
    let started = Instant::now();
    let mut workload_namespaces = BTreeSet::new();
    for c in &ctx.clusters {
        create_namespace(&ctx.mgmt, &c.mgmt_ns, run_id).await?;
        register(&ctx.mgmt, c, run_id).await?;
        apply_example(&ctx.mgmt, c).await?;
        // The same cluster may be listed twice; its workload namespace is made once.
        if workload_namespaces.insert(c.kubeconfig.clone()) {
            create_namespace(&c.client, &ctx.workload_ns, run_id).await?;
        }
    }

    // Registration: every NodePool reports its cluster connected, every node class is Ready.
    for c in &ctx.clusters {
        let pools: Api<NodePool> = Api::namespaced(ctx.mgmt.clone(), &c.mgmt_ns);
        wait_until(&format!("NodePool {}/default: ClusterReachable=True", c.mgmt_ns), d.setup, d.poll, || async {
            let pool = pools.get("default").await?;
            let conds = pool.status.map(|s| s.conditions).unwrap_or_default();
            let reachable = find(&conds, "ClusterReachable");
            Ok(if reachable.is_some_and(|r| r.status == "True") { Ok(()) } else { Err(show(reachable)) })
        })
        .await?;
        let classes: Api<CleverNodeClass> = Api::namespaced(ctx.mgmt.clone(), &c.mgmt_ns);
        wait_until(&format!("CleverNodeClass {}/default: Ready=True", c.mgmt_ns), d.setup, d.poll, || async {
            let class = classes.get("default").await?;
            let conds = class.status.map(|s| s.conditions).unwrap_or_default();
            let ready = find(&conds, "Ready");
            Ok(if ready.is_some_and(|r| r.status == "True") { Ok(()) } else { Err(show(ready)) })
        })
        .await?;
    }
    report.connected = started.elapsed();

    // Scale up.
    let scaled = Instant::now();
    for c in &ctx.clusters {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ctx.workload_ns);
        for n in 0..c.scenario.pods {
            let name = format!("{}-inflate-{n}", c.name);
            pods.create(&PostParams::default(), &workload_pod(&name, &ctx.workload_ns, &c.scenario, run_id)?)
                .await
                .with_context(|| format!("{}: creating pod {name}", c.name))?;
        }
    }
    for c in &ctx.clusters {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ctx.workload_ns);
        let prefix = format!("{}-inflate-", c.name);
        let want = c.scenario.pods;
        wait_until(&format!("{}: {want} pod(s) Running ({})", c.name, c.scenario.what), d.running, d.poll, || async {
            let mine: Vec<Pod> = pods.list(&ListParams::default()).await?.items;
            let mine: Vec<&Pod> = mine.iter().filter(|p| p.name_any().starts_with(&prefix)).collect();
            let running =
                mine.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count();
            let claims = claims(&ctx.mgmt, &c.mgmt_ns).await.map_or(0, |l| l.len());
            Ok(if running == want {
                Ok(())
            } else {
                Err(format!(
                    "{running}/{want} Running, {claims} NodeClaim(s): {}",
                    mine.iter().map(|p| pod_state(p)).collect::<Vec<_>>().join("; ")
                ))
            })
        })
        .await?;
    }
    report.running = scaled.elapsed();

    // The facts of tests/hub.rs, on whatever servers these are.
    for c in &ctx.clusters {
        let claims = claims(&ctx.mgmt, &c.mgmt_ns).await?;
        let groups = owned_groups(ctx, c).await?;
        let where_ = format!("{} ({}, {})", c.name, c.kubeconfig.display(), c.scenario.what);
        ensure!(claims.len() == 1, "{where_}: {} NodeClaims, want exactly one", claims.len());
        ensure!(groups.len() == 1, "{where_}: {} NodeGroups of this run, want exactly one per claim", groups.len());
        let (claim, group) = (&claims[0], &groups[0]);
        let group_name = group.name_any();
        ensure!(
            group.spec.flavor == c.scenario.flavor,
            "{where_}: flavor {}, want {}",
            group.spec.flavor,
            c.scenario.flavor
        );
        ensure!(group.spec.node_count == 1, "{where_}: nodeCount {}, want 1", group.spec.node_count);
        let provider = claim.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        ensure!(
            provider == ownership::provider_id(&group_name),
            "{where_}: claim providerID {provider:?}, want clevercloud://{group_name}"
        );
        let l = group.labels();
        ensure!(
            l.get(labels::NODECLAIM) == Some(&claim.name_any()),
            "{where_}: NodeGroup labels {l:?} do not name the claim"
        );
        ensure!(
            l.get(labels::NODECLAIM_NAMESPACE) == Some(&c.mgmt_ns),
            "{where_}: NodeGroup labels {l:?} do not name the namespace"
        );
        ensure!(l.get(labels::HUB) == Some(&ctx.hub_id), "{where_}: NodeGroup labels {l:?} do not name the hub");
        // The pods run on the node CKE made for this NodeGroup.
        let nodes = Api::<Node>::all(c.client.clone())
            .list(&ListParams::default().labels(&format!("{}={group_name}", labels::CLEVER_NODEGROUP)))
            .await?
            .items;
        let node_names: BTreeSet<String> = nodes.iter().map(ResourceExt::name_any).collect();
        ensure!(!node_names.is_empty(), "{where_}: no Node labelled {}={group_name}", labels::CLEVER_NODEGROUP);
        let prefix = format!("{}-inflate-", c.name);
        for p in Api::<Pod>::namespaced(c.client.clone(), &ctx.workload_ns).list(&ListParams::default()).await?.items {
            if p.name_any().starts_with(&prefix) {
                let on = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                ensure!(
                    node_names.contains(&on),
                    "{where_}: pod {} runs on {on:?}, not on {node_names:?}",
                    p.name_any()
                );
            }
        }
        report.nodegroups.push(format!("{}:{group_name}={}", c.name, group.spec.flavor));
    }

    // Scale to zero, then delete the claims: nothing of this run may be left.
    let down = Instant::now();
    for c in &ctx.clusters {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ctx.workload_ns);
        let prefix = format!("{}-inflate-", c.name);
        for n in 0..c.scenario.pods {
            match pods.delete(&format!("{prefix}{n}"), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_api_status(&e, 404) => {}
                Err(e) => return Err(anyhow!(e).context(format!("{}: deleting pods", c.name))),
            }
        }
        wait_until(&format!("{}: workload pods gone", c.name), d.cleanup, d.poll, || async {
            let left: Vec<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(ResourceExt::name_any)
                .filter(|n| n.starts_with(&prefix))
                .collect();
            Ok(if left.is_empty() { Ok(()) } else { Err(format!("left: {left:?}")) })
        })
        .await?;
    }
    delete_claims(ctx).await?;
    wait_nothing_left(ctx, d.cleanup).await?;
    report.scaled_down = down.elapsed();
    Ok(())
}

async fn delete_claims(ctx: &Ctx<'_>) -> Result<()> {
    for c in &ctx.clusters {
        let api: Api<NodeClaim> = Api::namespaced(ctx.mgmt.clone(), &c.mgmt_ns);
        for claim in claims(&ctx.mgmt, &c.mgmt_ns).await? {
            match api.delete(&claim.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_api_status(&e, 404) => {}
                Err(e) => {
                    return Err(anyhow!(e).context(format!("deleting NodeClaim {}/{}", c.mgmt_ns, claim.name_any())));
                }
            }
        }
    }
    Ok(())
}

/// No NodeClaim in this run's namespaces, no NodeGroup of this run, no Node of those NodeGroups.
async fn wait_nothing_left(ctx: &Ctx<'_>, timeout: Duration) -> Result<()> {
    let poll = ctx.cfg.deadlines.poll;
    for c in &ctx.clusters {
        wait_until(&format!("{}: no NodeClaim, NodeGroup or Node of this run left", c.name), timeout, poll, || async {
            let claims: Vec<String> = claims(&ctx.mgmt, &c.mgmt_ns).await?.iter().map(ResourceExt::name_any).collect();
            let groups: Vec<String> = owned_groups(ctx, c).await?.iter().map(ResourceExt::name_any).collect();
            // CKE labels each Node with its NodeGroup's name.
            let seen = ctx.seen_groups.lock().unwrap().clone();
            let nodes: Vec<String> = Api::<Node>::all(c.client.clone())
                .list(&ListParams::default().labels(labels::CLEVER_NODEGROUP))
                .await?
                .items
                .iter()
                .filter(|n| n.labels().get(labels::CLEVER_NODEGROUP).is_some_and(|g| seen.contains(g)))
                .map(ResourceExt::name_any)
                .collect();
            Ok(if claims.is_empty() && groups.is_empty() && nodes.is_empty() {
                Ok(())
            } else {
                Err(format!("NodeClaims {claims:?}, NodeGroups {groups:?}, Nodes {nodes:?}"))
            })
        })
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cleanup, run whatever happened before. Returns notes on what needed force or failed.

async fn cleanup(ctx: &Ctx<'_>) -> Vec<String> {
    let mut notes = Vec::new();
    let d = &ctx.cfg.deadlines;
    // The workload first (pods in the workload cluster), so nothing asks for new nodes.
    let mut done = BTreeSet::new();
    for c in &ctx.clusters {
        if done.insert(c.kubeconfig.clone()) {
            match Api::<Namespace>::all(c.client.clone()).delete(&ctx.workload_ns, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_api_status(&e, 404) => {}
                Err(e) => notes.push(format!("{}: deleting namespace {}: {e}", c.name, ctx.workload_ns)),
            }
        }
    }
    // Claims through the hub, which deletes their NodeGroups.
    if let Err(e) = delete_claims(ctx).await {
        notes.push(format!("{e:#}"));
    }
    if let Err(e) = wait_nothing_left(ctx, d.cleanup).await {
        notes.push(format!("the hub did not clean up: {e:#}; deleting this run's NodeGroups directly"));
        for c in &ctx.clusters {
            let groups: Api<NodeGroup> = Api::all(c.client.clone());
            for g in owned_groups(ctx, c).await.unwrap_or_default() {
                if let Err(e) = groups.delete(&g.name_any(), &DeleteParams::default()).await
                    && !is_api_status(&e, 404)
                {
                    notes.push(format!("{}: deleting NodeGroup {}: {e}", c.name, g.name_any()));
                }
            }
            let api: Api<NodeClaim> = Api::namespaced(ctx.mgmt.clone(), &c.mgmt_ns);
            for claim in claims(&ctx.mgmt, &c.mgmt_ns).await.unwrap_or_default() {
                let patch = json!({"metadata": {"finalizers": null}});
                if let Err(e) = api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await
                    && !is_api_status(&e, 404)
                {
                    notes.push(format!("{}: releasing NodeClaim {}: {e}", c.mgmt_ns, claim.name_any()));
                }
            }
        }
        if let Err(e) = wait_nothing_left(ctx, d.cleanup).await {
            notes.push(format!("still left after deleting them directly: {e:#}"));
        }
    }
    notes
}

/// Delete the management namespaces (Secrets, pools, classes, capacity ConfigMaps go with them)
/// and wait a bounded time for them to go.
async fn delete_mgmt_namespaces(ctx: &Ctx<'_>, notes: &mut Vec<String>) {
    let d = &ctx.cfg.deadlines;
    let api: Api<Namespace> = Api::all(ctx.mgmt.clone());
    for c in &ctx.clusters {
        match api.delete(&c.mgmt_ns, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_api_status(&e, 404) => {}
            Err(e) => notes.push(format!("deleting namespace {}: {e}", c.mgmt_ns)),
        }
    }
    let names: Vec<String> = ctx.clusters.iter().map(|c| c.mgmt_ns.clone()).collect();
    let gone = wait_until("management namespaces deleted", d.setup, d.poll, || async {
        let mut left = Vec::new();
        for n in &names {
            if api.get_opt(n).await?.is_some() {
                left.push(n.clone());
            }
        }
        Ok(if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) })
    })
    .await;
    if let Err(e) = gone {
        notes.push(format!("{e:#}"));
    }
}

/// The whole run: install, scenario, cleanup. Errors name the step and what the API showed.
async fn run_e2e(cfg: &E2e) -> Result<Report> {
    let started = Instant::now();
    let d = &cfg.deadlines;
    let mgmt = run::management_client(Some(&cfg.mgmt_kubeconfig))
        .await
        .with_context(|| format!("management kubeconfig {}", cfg.mgmt_kubeconfig.display()))?;
    mgmt.apiserver_version().await.context("reaching the management cluster")?;
    let prefix = format!("khub-e2e-{}", cfg.run_id);
    let mut clusters = Vec::new();
    for (i, path) in cfg.workload_kubeconfigs.iter().enumerate() {
        let client = run::management_client(Some(path))
            .await
            .with_context(|| format!("workload kubeconfig {}", path.display()))?;
        client.apiserver_version().await.with_context(|| format!("reaching the cluster of {}", path.display()))?;
        clusters.push(Cluster {
            name: format!("w{i}"),
            kubeconfig: path.clone(),
            hub_kubeconfig: cfg.hub_kubeconfigs.as_ref().and_then(|h| h.get(i)).unwrap_or(path).clone(),
            mgmt_ns: format!("{prefix}-{i}"),
            client,
            scenario: SCENARIOS[i % SCENARIOS.len()],
        });
    }
    install_hub_crds(&mgmt, d).await?;
    for c in &clusters {
        ensure_nodegroup_api(c, cfg.sim_cke.is_none(), d).await?;
    }
    let ours: BTreeSet<String> = clusters.iter().map(|c| c.mgmt_ns.clone()).collect();
    refuse_foreign_objects(&mgmt, &ours).await?;
    let mut report = Report { clusters: clusters.len(), setup: started.elapsed(), ..Report::default() };

    // CKE where there is none: `karpenter-hub sim-cke` against each workload kubeconfig.
    let cke_stop = CancellationToken::new();
    let mut cke_tasks = Vec::new();
    if let Some(configs) = &cfg.sim_cke {
        let mut started_for = BTreeSet::new();
        for (c, config) in clusters.iter().zip(configs) {
            if !started_for.insert(c.kubeconfig.clone()) {
                continue;
            }
            let (client, config, stop) = (c.client.clone(), config.clone(), cke_stop.clone());
            cke_tasks.push(tokio::spawn(async move { sim::cke::run(client, config, stop.cancelled_owned()).await }));
        }
    }
    // The hub, in process, with an id of its own: it can never touch another hub's NodeGroups.
    let ctx = Ctx {
        cfg,
        mgmt: mgmt.clone(),
        clusters,
        hub_id: format!("e2e-{}", cfg.run_id),
        workload_ns: prefix.clone(),
        seen_groups: std::sync::Mutex::new(BTreeSet::new()),
    };
    let hub_stop = CancellationToken::new();
    let hub_task = (!cfg.external_hub).then(|| {
        tokio::spawn(run::run_with(
            mgmt.clone(),
            hub::Settings { hub_id: ctx.hub_id.clone(), ..hub::Settings::default() },
            registry::Settings::default(),
            Arc::new(Metrics::new()),
            hub_stop.clone(),
        ))
    });

    let outcome = scenario(&ctx, &mut report).await;
    let mut notes = cleanup(&ctx).await;
    hub_stop.cancel();
    if let Some(task) = hub_task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => notes.push(format!("the hub stopped with an error: {e}")),
            Err(e) => notes.push(format!("the hub task failed: {e}")),
        }
    }
    delete_mgmt_namespaces(&ctx, &mut notes).await;
    cke_stop.cancel();
    for t in cke_tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => notes.push(format!("simulated CKE: {e}")),
            Err(e) => notes.push(format!("simulated CKE task: {e}")),
        }
    }
    report.total = started.elapsed();
    report.cleanup_notes = notes;
    match outcome {
        Err(e) => {
            let mut msg = format!("{e:#}");
            for n in &report.cleanup_notes {
                let _ = write!(msg, "\n  cleanup: {n}");
            }
            Err(anyhow!(msg))
        }
        Ok(()) if !report.cleanup_notes.is_empty() => {
            bail!("the scenario passed but cleanup did not go cleanly:\n{report}")
        }
        Ok(()) => Ok(report),
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// On clusters of your own (real CKE or any API server with `sim-cke`): ignored unless asked for,
/// since it needs kubeconfigs; the envtest run above covers real API servers in every `cargo test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs KARPENTER_HUB_E2E_MGMT_KUBECONFIG and KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS (docs/hub.md); run with --ignored"]
async fn end_to_end_on_real_clusters_when_configured() {
    let cfg = match E2e::from_env() {
        Ok(Some(cfg)) => cfg,
        Ok(None) => panic!(
            "set KARPENTER_HUB_E2E_MGMT_KUBECONFIG and KARPENTER_HUB_E2E_WORKLOAD_KUBECONFIGS to run the end-to-end test on real clusters (docs/hub.md)"
        ),
        Err(e) => panic!("{e:#}"),
    };
    println!(
        "end-to-end run {} on {} workload cluster(s), CKE {}",
        cfg.run_id,
        cfg.workload_kubeconfigs.len(),
        if cfg.sim_cke.is_some() { "simulated (sim-cke)" } else { "real" }
    );
    match run_e2e(&cfg).await {
        Ok(report) => println!("{report}"),
        Err(e) => panic!("end-to-end run {} failed: {e:#}", cfg.run_id),
    }
}

/// A directory of its own under Cargo's scratch space for integration tests.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", new_run_id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The opt-in path above, on every CI run: the very same [`run_e2e`], given kubeconfig files of a
/// management emulator and two workload emulators. One workload emulator serves NodeGroups
/// already (the install is skipped), the other does not (the test installs the stand-in CRD); the
/// management emulator has the hub's CRDs already (they are replaced, as `kubectl apply` would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_to_end_run_passes_on_emulators_through_kubeconfig_files_only() {
    let mgmt = ApiServer::start(ApiServerConfig::management("e2e-management")).await.unwrap();
    let alpha = ApiServer::start(ApiServerConfig::workload("e2e-alpha").with_seed(1)).await.unwrap();
    let beta = ApiServer::start(ApiServerConfig::new("e2e-beta").with_seed(2)).await.unwrap();
    let dir = scratch("e2e");
    let path = |s: &ApiServer| {
        let p = dir.join(format!("{}.kubeconfig", s.name()));
        s.write_kubeconfig(&p).unwrap();
        p
    };
    let cfg = E2e {
        mgmt_kubeconfig: path(&mgmt),
        workload_kubeconfigs: vec![path(&alpha), path(&beta)],
        sim_cke: Some(vec![
            operator::commands::sandbox::world::quick_cke(1),
            operator::commands::sandbox::world::quick_cke(2),
        ]),
        hub_kubeconfigs: None,
        external_hub: false,
        deadlines: Deadlines::emulated(),
        run_id: new_run_id(),
    };
    let report = run_e2e(&cfg).await.unwrap_or_else(|e| panic!("{e:#}"));
    println!("{report}");
    assert_eq!(report.nodegroups.len(), 2, "{report}");
    assert!(report.nodegroups[0].ends_with("=XS") && report.nodegroups[1].ends_with("=2XS"), "{report}");
    // Nothing of the run is left: no namespace, pod, claim or NodeGroup.
    let run_ns = |ns: &Namespace| ns.labels().get(RUN_LABEL) == Some(&cfg.run_id);
    let lp = ListParams::default();
    let left = Api::<Namespace>::all(mgmt.client()).list(&lp).await.unwrap().items;
    assert!(!left.iter().any(run_ns), "management namespaces left");
    assert!(Api::<NodeClaim>::all(mgmt.client()).list(&lp).await.unwrap().items.is_empty());
    for w in [&alpha, &beta] {
        assert!(Api::<NodeGroup>::all(w.client()).list(&lp).await.unwrap().items.is_empty(), "{}", w.name());
        let pods = Api::<Pod>::all(w.client()).list(&lp).await.unwrap().items;
        assert!(!pods.iter().any(|p| p.labels().get(RUN_LABEL) == Some(&cfg.run_id)), "{}: pods left", w.name());
        assert!(serves_nodegroups(&w.client()).await.unwrap());
    }
    let _ = std::fs::remove_dir_all(&dir);
    for s in [mgmt, alpha, beta] {
        s.shutdown().await;
    }
}

/// The same [`run_e2e`] on real API servers in every CI run: a management envtest control plane and
/// a workload one (kube-apiserver, etcd and the controller manager: garbage collection, namespace
/// deletion, node lifecycle, ServiceAccount tokens), given as kubeconfig files, with the simulated
/// CKE playing CKE on the workload plane. The hub serves the workload cluster with the
/// least-privilege identity `karpenter-hub register` minted there, so kube-apiserver's own RBAC
/// proves that `config/hub/workload-rbac.yaml` grants every call of the whole scenario. The hub is
/// the one the chart installs (issue 29 item 5): `karpenter-hub` started with the command line and
/// environment of the chart's Deployment as rendered by a real helm (only its listeners moved to
/// the loopback interface), as the chart's ServiceAccount (a TokenRequest token) with only the
/// chart's management RBAC, so the chart's flags, settings and roles are what the scenario runs on.
/// Owned planes, not shared ones: the run refuses a management cluster holding anyone else's
/// NodePools, and the other tests of this binary must not see this hub's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_to_end_run_passes_on_real_api_servers_with_the_chart_installed_hub_and_the_registered_identity() {
    let Some(helm) = crate::charts::helm() else { return };
    let start = |options: envtest::Options| match envtest::ControlPlane::start(&options) {
        Ok(cp) => Some(cp),
        Err(e) => {
            envtest::skip(&envtest::current_test(), &e);
            None
        }
    };
    let started = Instant::now();
    let Some(mgmt) = start(envtest::Options::new("e2e-mgmt")) else { return };
    let dir = scratch("e2e-envtest");
    let (policy, audit_log) = (dir.join("audit-policy.yaml"), dir.join("audit.log"));
    std::fs::write(&policy, HUB_AUDIT_POLICY).unwrap();
    let Some(workload) = start(envtest::Options {
        apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
        ],
        ..envtest::Options::new("e2e-workload")
    }) else {
        return;
    };
    let planes = started.elapsed();
    let run_id = new_run_id();

    // `karpenter-hub register` against the workload plane (it checks the minted identity on the
    // NodeGroup API, so that API is served first, as on CKE); its Secret's kubeconfig is kept.
    let registered = Instant::now();
    let admin = workload.client().await.unwrap();
    let d = Deadlines::emulated();
    let w = Cluster {
        name: "w0".into(),
        kubeconfig: workload.kubeconfig_path().to_path_buf(),
        hub_kubeconfig: workload.kubeconfig_path().to_path_buf(),
        mgmt_ns: String::new(),
        client: admin.clone(),
        scenario: SCENARIOS[0],
    };
    ensure_nodegroup_api(&w, false, &d).await.unwrap();
    let scratch_ns = format!("khub-e2e-{run_id}-register");
    create_namespace(&mgmt.client().await.unwrap(), &scratch_ns, &run_id).await.unwrap();
    let args = operator::commands::register_cluster::RegisterArgs {
        cluster: "w0".into(),
        namespace: scratch_ns.clone(),
        workload_kubeconfig: workload.kubeconfig_path().to_path_buf(),
        workload_context: None,
        kubeconfig: Some(mgmt.kubeconfig_path().to_path_buf()),
        workload_namespace: "karpenter-hub".into(),
        server: None,
        token_duration_days: 1,
        labels: Vec::new(),
    };
    let secret =
        operator::commands::register_cluster::register(&args).await.unwrap_or_else(|e| panic!("register: {e}"));
    let mgmt_client = mgmt.client().await.unwrap();
    let secret = Api::<Secret>::namespaced(mgmt_client.clone(), &scratch_ns).get(&secret).await.unwrap();
    let minted = dir.join("w0-minted.kubeconfig");
    std::fs::write(&minted, &secret.data.unwrap()[registry::KUBECONFIG_KEY].0).unwrap();
    Api::<Namespace>::all(mgmt_client.clone()).delete(&scratch_ns, &DeleteParams::default()).await.unwrap();
    // Gone before the hub starts: it would otherwise serve the registration there while the
    // namespace terminates.
    let namespaces = Api::<Namespace>::all(mgmt_client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces.get_opt(&scratch_ns).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "namespace {scratch_ns} not gone within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let registered = registered.elapsed();

    // The hub as the chart installs it: rendered for the release namespace with this run's hub id,
    // its ServiceAccount, roles and bindings applied, its container's command line and environment.
    let release_ns = "karpenter-hub";
    Api::<Namespace>::all(mgmt_client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": release_ns}})).unwrap())
        .await
        .unwrap();
    let (port, probe_port) = (crate::charts::free_port(), crate::charts::free_port());
    let sets = [
        format!("hub.hubId=e2e-{run_id}"),
        format!("hub.metrics.port={port}"),
        format!("hub.healthProbe.port={probe_port}"),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let rendered = crate::charts::template_in(&helm, release_ns, None, &sets).unwrap_or_else(|e| panic!("{e}"));
    crate::charts::apply_hub_rbac(&mgmt_client, &rendered).await;
    let deployment = rendered.get("Deployment", "karpenter-hub");
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
    let sa_kubeconfig = crate::charts::service_account_kubeconfig(&mgmt_client, &mgmt, release_ns, sa, &dir).await;
    let mut hub_args = crate::charts::args(deployment);
    crate::charts::to_loopback(&mut hub_args, "--metrics-bind-address", port);
    crate::charts::to_loopback(&mut hub_args, "--health-probe-bind-address", probe_port);
    hub_args.push(format!("--kubeconfig={}", sa_kubeconfig.display()));
    let rust_log = crate::charts::env(deployment, "RUST_LOG").unwrap();
    let mut hub_process =
        crate::charts::Running::hub(&hub_args, release_ns, "karpenter-hub-0", &rust_log, dir.join("hub.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::charts::http_status(probe_port, "/readyz").await != Some(200) {
        hub_process.assert_alive();
        assert!(Instant::now() < deadline, "the chart's hub is not Ready within 30 s:\n{}", hub_process.output());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let cfg = E2e {
        mgmt_kubeconfig: mgmt.kubeconfig_path().to_path_buf(),
        workload_kubeconfigs: vec![workload.kubeconfig_path().to_path_buf()],
        sim_cke: Some(vec![operator::commands::sandbox::world::quick_cke(1)]),
        hub_kubeconfigs: Some(vec![minted]),
        external_hub: true,
        deadlines: d,
        run_id,
    };
    let report = run_e2e(&cfg)
        .await
        .unwrap_or_else(|e| panic!("end-to-end run on envtest: {e:#}\nthe hub's log:\n{}", hub_process.output()));
    hub_process.assert_alive();
    // The chart's management RBAC refused the hub nothing through the whole scenario (RBAC's
    // refusals name the user; a namespace being deleted refuses writes with 403 too).
    let output = hub_process.output();
    assert!(!output.contains("forbidden: User"), "the chart's RBAC refused the hub something:\n{output}");
    assert!(output.contains(&format!("e2e-{}", cfg.run_id)), "the hub ran with the run's hub id:\n{output}");
    drop(hub_process);
    println!(
        "control planes started in {:.1}s, registered in {:.1}s\n{report}",
        planes.as_secs_f64(),
        registered.as_secs_f64()
    );
    assert_eq!(report.nodegroups.len(), 1, "{report}");
    assert!(report.nodegroups[0].ends_with("=XS"), "cheapest packing: one XS, {report}");
    // Every call the hub made in the workload cluster went through the minted identity, and the
    // real server's RBAC refused none of them (the audit log of the workload plane says so).
    let audited = audited_requests(&audit_log);
    println!("the hub's requests in the workload cluster (verb resource code: count): {audited:?}");
    assert!(audited.keys().any(|k| k.starts_with("create nodegroups 201")), "{audited:?}");
    assert!(audited.keys().any(|k| k.starts_with("delete nodegroups 200")), "{audited:?}");
    let refused: Vec<&String> = audited.keys().filter(|k| k.ends_with(" 403") || k.ends_with(" 401")).collect();
    assert!(refused.is_empty(), "requests of the hub refused by the real server's RBAC: {refused:?}");
    // Nothing of the run is left, as the real servers show it.
    let lp = ListParams::default();
    let run_ns = |ns: &Namespace| ns.labels().get(RUN_LABEL) == Some(&cfg.run_id);
    let namespaces = Api::<Namespace>::all(mgmt_client.clone()).list(&lp).await.unwrap().items;
    assert!(!namespaces.iter().any(|ns| run_ns(ns) && ns.name_any() != scratch_ns), "management namespaces left");
    assert!(Api::<NodeClaim>::all(mgmt_client).list(&lp).await.unwrap().items.is_empty());
    assert!(Api::<NodeGroup>::all(admin.clone()).list(&lp).await.unwrap().items.is_empty());
    let pods = Api::<Pod>::all(admin.clone()).list(&lp).await.unwrap().items;
    assert!(!pods.iter().any(|p| p.labels().get(RUN_LABEL) == Some(&cfg.run_id)), "pods left");
    let nodes = Api::<Node>::all(admin).list(&lp.labels(labels::CLEVER_NODEGROUP)).await.unwrap().items;
    let nodes: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();
    assert!(nodes.is_empty(), "Nodes of NodeGroups left: {nodes:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The audit policy of the workload plane: every request of the hub's identity, metadata only.
const HUB_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [\"system:serviceaccount:karpenter-hub:karpenter-hub-workload\"]
  - level: None
";

/// The hub identity's requests in the audit log, by `verb resource[/subresource] code`.
fn audited_requests(log: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        let r = &event["objectRef"];
        let sub = r["subresource"].as_str().map(|s| format!("/{s}")).unwrap_or_default();
        let key = format!(
            "{} {}{sub} {}",
            event["verb"].as_str().unwrap_or("?"),
            r["resource"].as_str().unwrap_or("?"),
            event["responseStatus"]["code"]
        );
        *seen.entry(key).or_default() += 1;
    }
    seen
}

/// The install steps alone, on bare emulators: CRDs created on a cluster without them, replaced on
/// a second run; the NodeGroup CRD installed where missing, left alone where served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_steps_are_idempotent() {
    let bare = ApiServer::start(ApiServerConfig::new("bare")).await.unwrap();
    let d = Deadlines::emulated();
    install_hub_crds(&bare.client(), &d).await.unwrap();
    install_hub_crds(&bare.client(), &d).await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(bare.client()).list(&ListParams::default()).await.unwrap().items;
    let names: BTreeSet<String> = crds.iter().map(ResourceExt::name_any).collect();
    for f in crds::crd::hub_crds() {
        assert!(names.contains(&f.crd.name_any()), "{} not installed", f.crd.name_any());
    }
    let cluster = |server: &ApiServer| Cluster {
        name: server.name().to_string(),
        kubeconfig: PathBuf::from(server.name()),
        hub_kubeconfig: PathBuf::from(server.name()),
        mgmt_ns: String::new(),
        client: server.client(),
        scenario: SCENARIOS[0],
    };
    // Real CKE must serve NodeGroups itself: the test never installs a CRD there.
    let refused = ensure_nodegroup_api(&cluster(&bare), true, &d).await.unwrap_err();
    assert!(format!("{refused:#}").contains("is it a CKE cluster?"), "{refused:#}");
    assert!(!serves_nodegroups(&bare.client()).await.unwrap());
    ensure_nodegroup_api(&cluster(&bare), false, &d).await.unwrap();
    assert!(serves_nodegroups(&bare.client()).await.unwrap());
    let workload = ApiServer::start(ApiServerConfig::workload("served")).await.unwrap();
    let before = workload.requests().writes();
    ensure_nodegroup_api(&cluster(&workload), true, &d).await.unwrap();
    ensure_nodegroup_api(&cluster(&workload), false, &d).await.unwrap();
    assert_eq!(workload.requests().writes(), before, "a served NodeGroup API is left alone");
    // Someone else's NodePool on the management cluster stops the run before it creates anything.
    let mgmt = ApiServer::start(ApiServerConfig::management("mgmt")).await.unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    Api::<Namespace>::all(mgmt.client()).create(&PostParams::default(), &ns).await.unwrap();
    let c = Cluster { mgmt_ns: "team-a".into(), ..cluster(&workload) };
    apply_example(&mgmt.client(), &c).await.unwrap();
    let ours = BTreeSet::from(["khub-e2e-x-0".to_string()]);
    let e = refuse_foreign_objects(&mgmt.client(), &ours).await.unwrap_err();
    assert!(format!("{e}").contains("NodePool team-a/default"), "{e}");
    refuse_foreign_objects(&mgmt.client(), &BTreeSet::from(["team-a".to_string()])).await.unwrap();
    for s in [bare, workload, mgmt] {
        s.shutdown().await;
    }
}

/// A run that fails (here: nothing plays the NodeGroups, so no node ever comes) still removes what
/// it created — namespaces, pods, claims and the NodeGroups the hub made — and says what failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_still_cleans_up_after_itself() {
    let mgmt = ApiServer::start(ApiServerConfig::management("e2e-management")).await.unwrap();
    let alpha = ApiServer::start(ApiServerConfig::workload("e2e-alpha").with_seed(1)).await.unwrap();
    let dir = scratch("e2e-failed");
    let (mgmt_path, alpha_path) = (dir.join("management.kubeconfig"), dir.join("alpha.kubeconfig"));
    mgmt.write_kubeconfig(&mgmt_path).unwrap();
    alpha.write_kubeconfig(&alpha_path).unwrap();
    let cfg = E2e {
        mgmt_kubeconfig: mgmt_path,
        workload_kubeconfigs: vec![alpha_path],
        // The binder marks the pods unschedulable (so the hub provisions), but nothing serves NodeGroups.
        sim_cke: Some(vec![SimCkeConfig { nodegroups: false, ..operator::commands::sandbox::world::quick_cke(1) }]),
        hub_kubeconfigs: None,
        external_hub: false,
        deadlines: Deadlines { running: Duration::from_secs(5), ..Deadlines::emulated() },
        run_id: new_run_id(),
    };
    let e = format!("{:#}", run_e2e(&cfg).await.unwrap_err());
    println!("{e}");
    assert!(e.contains("timed out") && e.contains("Running"), "{e}");
    assert!(!e.contains("cleanup:"), "cleanup went cleanly: {e}");
    // The hub had launched a NodeGroup that never got a node: the cleanup had it deleted.
    assert!(alpha.requests().count("create", "nodegroups") >= 1, "{:?}", alpha.requests().snapshot());
    assert!(alpha.requests().count("delete", "nodegroups") >= 1, "{:?}", alpha.requests().snapshot());
    let lp = ListParams::default();
    let namespaces = Api::<Namespace>::all(mgmt.client()).list(&lp).await.unwrap().items;
    assert!(!namespaces.iter().any(|n| n.labels().get(RUN_LABEL) == Some(&cfg.run_id)), "management namespaces left");
    let namespaces = Api::<Namespace>::all(alpha.client()).list(&lp).await.unwrap().items;
    assert!(!namespaces.iter().any(|n| n.labels().get(RUN_LABEL) == Some(&cfg.run_id)), "workload namespace left");
    assert!(Api::<NodeClaim>::all(mgmt.client()).list(&lp).await.unwrap().items.is_empty());
    assert!(Api::<NodeGroup>::all(alpha.client()).list(&lp).await.unwrap().items.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    mgmt.shutdown().await;
    alpha.shutdown().await;
}
