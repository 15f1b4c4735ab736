//! The provisioning scenarios of clever-cloud.md §9 end to end on the simulated world: the real hub
//! against a management emulator and simulated CKE clusters, each scenario set up through the API
//! (with the real example manifests where one matches) and judged on what the API then shows:
//! flavors, counts, taints, labels, CKE's quota verdicts and the hub's reaction to them, and the
//! negative side (nothing else created, nothing leaked, nothing deleted that is not the hub's).
//!
//! Scenarios that need disruption (consolidation, drift, expiry, budgets, do-not-disrupt, PDB) are
//! not here. To keep the run short, scenarios without special settings share one world, one
//! workload cluster each (the cluster is named after its scenario, so failures say which).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crds::{NodeClaim, NodeGroup, NodePool, labels};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Node, Pod, Secret},
    events::v1::Event,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale, workload_pod};
use serde_json::{Value, json};
use sim::cke::{SimCkeConfig, SimFlavor, Usage};

use crate::common;
use common::{
    EXAMPLE as GENERAL_PURPOSE, Writes, metric, poll_every, poll_until, probes, rounds, running, wait_quiet,
    wait_quiet_over, writes,
};

const TEAM_DEDICATED: &str = include_str!("../../../examples/team-dedicated.yaml");
const WEIGHTED_NODEPOOLS: &str = include_str!("../../../examples/weighted-nodepools.yaml");
const MIN_VALUES: &str = include_str!("../../../examples/min-values.yaml");

/// Pending pod → Running on a new node takes a few seconds with `quick_cke`; this bound only
/// matters on a loaded machine.
const NODE_UP: Duration = Duration::from_secs(60);
/// How long the writes must have stopped before a negative ("still nothing more") is judged where
/// the hub's work shows no count: longer than a provisioning window (1 s idle) and its round.
const QUIET: Duration = Duration::from_secs(2);
/// Bound on reaching quiet: the hub settles in seconds once what it reacts to is done.
const SETTLE: Duration = Duration::from_secs(30);

// ---- setting the world up -------------------------------------------------------------------

/// Apply `text` in cluster `i`'s namespace, every NodePool pointed at cluster `i`, then `edit`ed.
async fn apply(world: &World, i: usize, file: &str, text: &str, edit: impl Fn(&mut Value)) {
    let cluster = world.clusters[i].name.clone();
    world
        .apply_yaml(file, text, &world.clusters[i].namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(cluster.clone());
                edit(doc);
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", world.clusters[i].name));
}

fn as_is(_: &mut Value) {}

/// The pool of general-purpose.yaml without its `limits` (they sit below the organisation quota on
/// purpose; quota scenarios must reach it).
fn without_limits(pool: &mut Value) {
    pool["spec"].as_object_mut().unwrap().remove("limits");
}

/// The pool's flavors restricted to `flavors` (`clever-cloud.com/flavor In ...`), no limits.
fn only_flavors(flavors: &'static [&'static str]) -> impl Fn(&mut Value) {
    move |pool| {
        pool["spec"]["template"]["spec"]["requirements"] =
            json!([{"key": labels::CLEVER_FLAVOR, "operator": "In", "values": flavors}]);
        without_limits(pool);
    }
}

/// The `default` CleverNodeClass of general-purpose.yaml alone (its first document), for examples
/// that reference it without defining it.
fn default_class() -> &'static str {
    GENERAL_PURPOSE.split("\n---\n").next().unwrap()
}

/// The sandbox's workload pod (`app: web`, CKE workers only) with `spec` merged in; a
/// `nodeSelector` given there is added to the worker selector.
fn pod(name: &str, cpu: &str, memory: &str, spec: Value) -> Pod {
    let mut v = serde_json::to_value(workload_pod(name, cpu, memory)).unwrap();
    for (k, val) in spec.as_object().cloned().unwrap_or_default() {
        if k == "nodeSelector" {
            for (sk, sv) in val.as_object().unwrap() {
                v["spec"]["nodeSelector"][sk] = sv.clone();
            }
        } else {
            v["spec"][k] = val;
        }
    }
    serde_json::from_value(v).unwrap()
}

/// `web-0` … `web-<n-1>`.
fn replicas(n: usize, cpu: &str, memory: &str, spec: Value) -> Vec<Pod> {
    (0..n).map(|k| pod(&format!("web-{k}"), cpu, memory, spec.clone())).collect()
}

fn one_per_node() -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": labels::HOSTNAME, "labelSelector": {"matchLabels": {"app": "web"}}}
    ]}}})
}

async fn create_pods(world: &World, i: usize, pods: Vec<Pod>) {
    let api: Api<Pod> = Api::namespaced(world.clusters[i].client(), "default");
    for p in pods {
        api.create(&PostParams::default(), &p).await.unwrap();
    }
}

// ---- reading what the API shows ------------------------------------------------------------

async fn groups(world: &World, i: usize) -> Vec<NodeGroup> {
    Api::<NodeGroup>::all(world.clusters[i].client()).list(&ListParams::default()).await.unwrap().items
}

async fn claims(world: &World, i: usize) -> Vec<NodeClaim> {
    let c = &world.clusters[i];
    Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|claim| claim.spec.cluster_name == c.name)
        .collect()
}

async fn pods(world: &World, i: usize) -> Vec<Pod> {
    Api::<Pod>::namespaced(world.clusters[i].client(), "default").list(&ListParams::default()).await.unwrap().items
}

async fn node(world: &World, i: usize, name: &str) -> Node {
    Api::<Node>::all(world.clusters[i].client()).get(name).await.unwrap()
}

/// Events the hub published in cluster `i`'s management namespace.
async fn events(world: &World, i: usize) -> Vec<Event> {
    Api::<Event>::namespaced(world.mgmt.client(), &world.clusters[i].namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Notes of the events with this reason.
async fn notes(world: &World, i: usize, reason: &str) -> Vec<String> {
    events(world, i)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The hub's persisted capacity memory of cluster `i` (`<cluster>-karpenter-hub-capacity`).
async fn capacity_state(world: &World, i: usize) -> Option<Value> {
    let c = &world.clusters[i];
    let cm = Api::<ConfigMap>::namespaced(world.mgmt.client(), &c.namespace)
        .get_opt(&format!("{}-karpenter-hub-capacity", c.name))
        .await
        .unwrap()?;
    let json = cm.data?.get("state")?.clone();
    Some(serde_json::from_str(&json).unwrap())
}

/// Flavors in cool-down in the persisted capacity memory.
async fn cooling(world: &World, i: usize) -> BTreeSet<String> {
    capacity_state(world, i)
        .await
        .and_then(|s| s.get("unavailableUntil").and_then(Value::as_object).map(|m| m.keys().cloned().collect()))
        .unwrap_or_default()
}

/// NodeGroups the last garbage-collection sweep of cluster `i` refused to touch (set as a sweep ends).
fn gc_refused(world: &World, i: usize) -> f64 {
    let c = &world.clusters[i];
    metric(world, "karpenter_hub_gc_refused_nodegroups", &[("cluster", &format!("{}/{}", c.namespace, c.name))])
}

async fn nodegroup_creates(world: &World, i: usize) -> u64 {
    world.clusters[i].server.requests().count("create", "nodegroups")
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

fn named<'a>(pods: &'a [Pod], name: &str) -> &'a Pod {
    pods.iter().find(|p| p.name_any() == name).unwrap_or_else(|| panic!("no pod {name}"))
}

/// Flavors of the groups, sorted.
fn flavors(groups: &[NodeGroup]) -> Vec<&str> {
    let mut f: Vec<&str> = groups.iter().map(|g| g.spec.flavor.as_str()).collect();
    f.sort_unstable();
    f
}

fn condition<'a>(claim: &'a NodeClaim, type_: &str) -> Option<&'a str> {
    claim.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

fn provider_id(claim: &NodeClaim) -> Option<&str> {
    claim.status.as_ref()?.provider_id.as_deref()
}

/// The `node.kubernetes.io/instance-type` requirement of a claim: its values and `minValues`.
fn instance_type_options(claim: &NodeClaim) -> (Vec<String>, Option<i64>) {
    let r = claim.spec.requirements.iter().find(|r| r.key == labels::INSTANCE_TYPE).expect("instance-type requirement");
    (r.values.clone(), r.min_values.map(i64::from))
}

/// What the API shows of cluster `i`, for failure messages.
async fn summary(world: &World, i: usize) -> String {
    let gs: Vec<String> = groups(world, i)
        .await
        .iter()
        .map(|g| {
            let state = if g.is_terminating() { " terminating" } else { "" };
            format!("{} {}{state}", g.name_any(), g.spec.flavor)
        })
        .collect();
    let cs: Vec<String> = claims(world, i)
        .await
        .iter()
        .map(|c| {
            let state = if c.metadata.deletion_timestamp.is_some() { " deleting" } else { "" };
            format!("{} {}{state}", c.name_any(), provider_id(c).unwrap_or("unlaunched"))
        })
        .collect();
    let ps: Vec<String> = pods(world, i)
        .await
        .iter()
        .map(|p| format!("{} {} on {}", p.name_any(), phase(p), node_of(p).unwrap_or("-")))
        .collect();
    format!(
        "{}: NodeGroups {gs:?}; NodeClaims {cs:?}; pods {ps:?}; cooling down {:?}",
        world.clusters[i].name,
        cooling(world, i).await
    )
}

/// Poll `check` until it holds; after `timeout`, fail with what cluster `i` shows.
async fn wait_in<F, Fut>(world: &World, i: usize, what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if !poll_until(timeout, check).await {
        panic!("timed out waiting for {what}\n{}", summary(world, i).await);
    }
}

/// How the hub is seen at work while a negative is judged.
#[derive(Clone, Copy)]
enum Work {
    /// A pod is pending and the cluster does not back off: the hub runs a provisioning round for
    /// it at once, another every 10 s while it waits, and keeps probing the cluster; quiet spans
    /// this many rounds or probes of the cluster after the last write.
    Rounds(u64),
    /// Nothing the hub does shows a count (every pod placed, or creations backing off after a
    /// refusal): quiet spans [`QUIET`].
    Reacting,
}

/// Writes that would contradict a negative about cluster `i`: to its NodeGroups and pods (bindings
/// included) in its workload cluster, and to NodeClaims on the management cluster (shared by the
/// world's clusters, so all of them must settle). Status updates are not counted: the hub may
/// keep conditions current without deciding anything.
fn decisions(world: &World, i: usize) -> Writes {
    let mut w = writes(&world.clusters[i].server, &["nodegroups", "pods", "pods/binding"]);
    w.extend(writes(&world.mgmt, &["nodeclaims"]));
    w
}

/// Wait until cluster `i` is quiet — no write of [`decisions`] while the hub was at work as `work`
/// says — then check that `check` holds; if not, fail with what cluster `i` shows. Callers assert
/// cumulative counters too (a NodeGroup created and deleted again leaves a count).
async fn quiet_then<F, Fut>(world: &World, i: usize, what: &str, work: Work, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let what = format!("{what} (quiet)");
    match work {
        Work::Rounds(n) => {
            wait_quiet_over(
                &what,
                SETTLE,
                n,
                || async { decisions(world, i) },
                || async { rounds(world, i) + probes(world, i) },
            )
            .await
        }
        Work::Reacting => wait_quiet(&what, SETTLE, QUIET, || async { decisions(world, i) }).await,
    };
    if !check().await {
        panic!("{what}: does not hold once quiet\n{}", summary(world, i).await);
    }
}

/// The identity chain holds for every hub-labelled group of cluster `i`: each live group names an
/// existing claim whose UID it carries and whose provider ID names it, each launched claim has its
/// group, and no claim has two groups.
async fn assert_one_group_per_claim(world: &World, i: usize) {
    let scenario = &world.clusters[i].name;
    let gs = groups(world, i).await;
    let cs = claims(world, i).await;
    let by_name: BTreeMap<String, &NodeClaim> = cs.iter().map(|c| (c.name_any(), c)).collect();
    let mut per_claim: BTreeMap<String, usize> = BTreeMap::new();
    for g in gs.iter().filter(|g| !g.is_terminating() && g.labels().contains_key(labels::HUB)) {
        let claim_name = g.labels().get(labels::NODECLAIM).cloned().unwrap_or_default();
        *per_claim.entry(claim_name.clone()).or_default() += 1;
        let claim = by_name
            .get(&claim_name)
            .unwrap_or_else(|| panic!("{scenario}: NodeGroup {} has no NodeClaim (leak)", g.name_any()));
        assert_eq!(
            g.annotations().get(labels::NODECLAIM_UID),
            claim.metadata.uid.as_ref(),
            "{scenario}: NodeGroup {} carries another claim's UID",
            g.name_any()
        );
        assert_eq!(provider_id(claim), Some(format!("clevercloud://{}", g.name_any()).as_str()), "{scenario}");
    }
    assert!(per_claim.values().all(|n| *n == 1), "{scenario}: a claim has several NodeGroups: {per_claim:?}");
    let names: BTreeSet<String> = gs.iter().map(ResourceExt::name_any).collect();
    for c in cs.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        if let Some(p) = provider_id(c) {
            let g = p.strip_prefix("clevercloud://").unwrap();
            assert!(names.contains(g), "{scenario}: launched claim {} has no NodeGroup {g}", c.name_any());
        }
    }
}

// ---- scenarios -----------------------------------------------------------------------------

/// provisioning: one pod (1 CPU, 1500Mi) gets one `2XS` claim, a NodeGroup of one node with the
/// unregistered taint, and a Node the hub stamps and registers. cheapest packing: three such pods
/// get one `XS` (0.0611 EUR/h), not two `2XS` (0.0666).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_gets_a_registered_2xs_and_three_pack_on_one_xs() {
    let mut world =
        World::start(&[("provisioning", "provisioning"), ("packing", "cheapest-packing")], |i| quick_cke(i as u64))
            .await
            .unwrap();
    for i in 0..2 {
        apply(&world, i, "general-purpose.yaml", GENERAL_PURPOSE, as_is).await;
    }
    world.start_hub();
    create_pods(&world, 0, replicas(1, "1", "1500Mi", json!({}))).await;
    create_pods(&world, 1, replicas(3, "1", "1500Mi", json!({}))).await;

    // provisioning
    wait_in(&world, 0, "provisioning: the pod running", NODE_UP, || async { running(&world, 0).await == 1 }).await;
    wait_in(&world, 0, "provisioning: the claim Ready", NODE_UP, || async {
        claims(&world, 0).await.first().is_some_and(|c| condition(c, "Ready") == Some("True"))
    })
    .await;
    let c = &world.clusters[0];
    let gs = groups(&world, 0).await;
    let cs = claims(&world, 0).await;
    assert_eq!((gs.len(), cs.len()), (1, 1), "provisioning: exactly one NodeGroup and one NodeClaim");
    let (g, claim) = (&gs[0], &cs[0]);
    let ng = g.name_any();
    assert_eq!(g.spec.flavor, "2XS");
    assert_eq!(g.spec.node_count, 1);
    assert_eq!(
        serde_json::to_value(&g.spec.taints).unwrap(),
        json!([{"key": labels::UNREGISTERED_TAINT, "effect": "NoExecute"}]),
        "the NodeGroup carries exactly the unregistered taint"
    );
    let gl = g.labels();
    assert_eq!(gl.get(labels::HUB).map(String::as_str), Some("default"));
    assert_eq!(gl.get(labels::NODECLAIM), Some(&claim.name_any()));
    assert_eq!(gl.get(labels::NODECLAIM_NAMESPACE), Some(&c.namespace));
    assert_eq!(gl.get(labels::HUB_NODEPOOL).map(String::as_str), Some("default"));
    assert_eq!(gl.get(labels::NODECLASS).map(String::as_str), Some("default"));
    assert!(!gl.contains_key(labels::IN_CLUSTER_MANAGED), "never the in-cluster provider's marker");
    assert_eq!(g.annotations().get(labels::NODECLAIM_UID), claim.metadata.uid.as_ref());
    let spec_labels = g.spec.labels.clone().unwrap_or_default();
    assert_eq!(spec_labels.get("team").map(String::as_str), Some("platform"), "the class label: {spec_labels:?}");
    assert_eq!(spec_labels.get(labels::NODEPOOL).map(String::as_str), Some("default"));
    assert!(spec_labels.keys().all(|k| !k.contains("kubernetes.io/") && !k.starts_with("clever-cloud.com/")));

    assert_eq!(provider_id(claim), Some(format!("clevercloud://{ng}").as_str()));
    assert_eq!(claim.labels().get(labels::INSTANCE_TYPE).map(String::as_str), Some("2XS"));
    for t in ["Launched", "Registered", "Initialized", "Ready"] {
        assert_eq!(condition(claim, t), Some("True"), "claim condition {t}");
    }
    let node_name = format!("{ng}-node0");
    assert_eq!(claim.status.as_ref().and_then(|s| s.node_name.as_deref()), Some(node_name.as_str()));
    let n = node(&world, 0, &node_name).await;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("clevercloud://{ng}").as_str()),
        "the hub stamps the provider ID CKE leaves empty"
    );
    let nl = n.labels();
    for (k, v) in [
        (labels::REGISTERED, "true"),
        (labels::INITIALIZED, "true"),
        (labels::NODEPOOL, "default"),
        (labels::INSTANCE_TYPE, "2XS"),
        (labels::CLEVER_NODEGROUP, ng.as_str()),
        ("team", "platform"),
    ] {
        assert_eq!(nl.get(k).map(String::as_str), Some(v), "node label {k}");
    }
    let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(!taints.iter().any(|t| t.key == labels::UNREGISTERED_TAINT), "registration removes the taint: {taints:?}");
    assert!(n.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER));
    assert_eq!(node_of(named(&pods(&world, 0).await, "web-0")), Some(node_name.as_str()));

    // cheapest packing
    wait_in(&world, 1, "cheapest-packing: 3 pods running", NODE_UP, || async { running(&world, 1).await == 3 }).await;
    let gs = groups(&world, 1).await;
    assert_eq!(flavors(&gs), ["XS"], "one XS (0.0611 EUR/h), not two 2XS (0.0666)");
    assert_eq!(claims(&world, 1).await.len(), 1);
    let xs_node = format!("{}-node0", gs[0].name_any());
    assert!(pods(&world, 1).await.iter().all(|p| node_of(p) == Some(xs_node.as_str())), "all three on the XS");

    for i in 0..2 {
        let what = format!("{}: one NodeGroup, one NodeClaim", world.clusters[i].name);
        quiet_then(&world, i, &what, Work::Reacting, || async {
            groups(&world, i).await.len() == 1 && claims(&world, i).await.len() == 1
        })
        .await;
        assert_one_group_per_claim(&world, i).await;
        assert_eq!(nodegroup_creates(&world, i).await, 1, "{}: one create, no retry", world.clusters[i].name);
    }
    world.shutdown().await;
}

/// small-flavors (pool of `2XS`/`XS`, a 5Gi pod: `XS`, a `2XS` cannot hold 5Gi), large-instances
/// (pool of `M`/`L`/`XL`, a 10Gi pod: `M`, the cheapest, so CKE's quota never refuses `L`/`XL`)
/// and flavor-pinned (pool of `XS` only: a pod a `2XS` would hold still gets an `XS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_limited_to_some_flavors_get_the_cheapest_of_theirs() {
    let cases: [(&str, &'static [&'static str], &str, &str); 3] = [
        ("small-flavors", &["2XS", "XS"], "5Gi", "XS"),
        ("large-instances", &["M", "L", "XL"], "10Gi", "M"),
        ("flavor-pinned", &["XS"], "1Gi", "XS"),
    ];
    let specs: Vec<(&str, &str)> = cases.iter().map(|(name, ..)| (*name, *name)).collect();
    let mut world = World::start(&specs, |i| quick_cke(i as u64)).await.unwrap();
    for (i, (_, allowed, ..)) in cases.iter().enumerate() {
        apply(&world, i, "general-purpose.yaml", GENERAL_PURPOSE, only_flavors(allowed)).await;
    }
    world.start_hub();
    for (i, (_, _, memory, _)) in cases.iter().enumerate() {
        create_pods(&world, i, replicas(1, "500m", memory, json!({}))).await;
    }
    for (i, (name, allowed, _, flavor)) in cases.iter().enumerate() {
        wait_in(&world, i, &format!("{name}: pod running"), NODE_UP, || async { running(&world, i).await == 1 }).await;
        let gs = groups(&world, i).await;
        assert_eq!(flavors(&gs), [*flavor], "{name}");
        let cs = claims(&world, i).await;
        assert_eq!(cs.len(), 1, "{name}");
        let (options, _) = instance_type_options(&cs[0]);
        assert!(options.iter().all(|o| allowed.contains(&o.as_str())), "{name}: options {options:?} outside the pool");
        assert_eq!(options.first().map(String::as_str), Some(*flavor), "{name}: cheapest option first");
        assert_eq!(nodegroup_creates(&world, i).await, 1, "{name}: no refused attempt before");
        assert!(cooling(&world, i).await.is_empty(), "{name}: nothing cooling down");
        assert_one_group_per_claim(&world, i).await;
    }
    world.shutdown().await;
}

/// flavor-selector (a pod selecting `clever-cloud.com/flavor: XS` gets an `XS`), prefer-small (a
/// preferred node affinity for `2XS` wins over price: three pods get two `2XS`, not the cheaper
/// `XS`), one-pod-per-node (required anti-affinity on the hostname: three replicas, three nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_constraints_choose_the_flavor_and_the_node_count() {
    let mut world = World::start(
        &[("selector", "flavor-selector"), ("prefer", "prefer-small"), ("spread", "one-pod-per-node")],
        |i| quick_cke(i as u64),
    )
    .await
    .unwrap();
    for i in 0..3 {
        apply(&world, i, "general-purpose.yaml", GENERAL_PURPOSE, as_is).await;
    }
    world.start_hub();
    create_pods(&world, 0, replicas(1, "1", "1Gi", json!({"nodeSelector": {labels::CLEVER_FLAVOR: "XS"}}))).await;
    let prefer_2xs = json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": labels::CLEVER_FLAVOR, "operator": "In", "values": ["2XS"]}]}}
    ]}}});
    create_pods(&world, 1, replicas(3, "1", "1500Mi", prefer_2xs)).await;
    create_pods(&world, 2, replicas(3, "1", "1Gi", one_per_node())).await;

    wait_in(&world, 0, "flavor-selector: pod running", NODE_UP, || async { running(&world, 0).await == 1 }).await;
    assert_eq!(flavors(&groups(&world, 0).await), ["XS"], "flavor-selector");

    wait_in(&world, 1, "prefer-small: 3 pods running", NODE_UP, || async { running(&world, 1).await == 3 }).await;
    assert_eq!(flavors(&groups(&world, 1).await), ["2XS", "2XS"], "prefer-small: the preference beats price");

    wait_in(&world, 2, "one-pod-per-node: 3 pods running", NODE_UP, || async { running(&world, 2).await == 3 }).await;
    let gs = groups(&world, 2).await;
    assert_eq!(flavors(&gs), ["2XS", "2XS", "2XS"], "one-pod-per-node: each pod alone on the cheapest node");
    let used: BTreeSet<String> = pods(&world, 2).await.iter().filter_map(node_of).map(str::to_string).collect();
    let expected: BTreeSet<String> = gs.iter().map(|g| format!("{}-node0", g.name_any())).collect();
    assert_eq!(used, expected, "one pod on each of the three nodes");

    for (i, n) in [(0, 1), (1, 2), (2, 3)] {
        let name = world.clusters[i].name.clone();
        quiet_then(&world, i, &format!("{name}: {n} NodeGroups"), Work::Reacting, || async {
            groups(&world, i).await.len() == n && claims(&world, i).await.len() == n
        })
        .await;
        assert_one_group_per_claim(&world, i).await;
    }
    world.shutdown().await;
}

/// weighted-nodepools: the pod goes to `preferred-small` (weight 50); a pod it cannot hold
/// (7 CPU > an `XS`) falls back to `any-size`. min-values: the claim keeps at least two flavor
/// options (`S`, `M` for a 10Gi pod), and a pod only one flavor can hold (12Gi) gets no claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_pools_and_min_values_shape_the_claims() {
    let mut world =
        World::start(&[("weighted", "weighted-nodepools"), ("flexible", "min-values")], |i| quick_cke(i as u64))
            .await
            .unwrap();
    for i in 0..2 {
        apply(&world, i, "general-purpose.yaml (class)", default_class(), as_is).await;
    }
    apply(&world, 0, "weighted-nodepools.yaml", WEIGHTED_NODEPOOLS, as_is).await;
    apply(&world, 1, "min-values.yaml", MIN_VALUES, as_is).await;
    world.start_hub();
    create_pods(&world, 0, vec![pod("small", "1", "1Gi", json!({}))]).await;
    create_pods(
        &world,
        1,
        vec![pod("fits-two-flavors", "1", "10Gi", json!({})), pod("fits-one-flavor", "1", "12Gi", json!({}))],
    )
    .await;

    wait_in(&world, 0, "weighted-nodepools: small pod running", NODE_UP, || async { running(&world, 0).await == 1 })
        .await;
    let gs = groups(&world, 0).await;
    assert_eq!(flavors(&gs), ["2XS"]);
    assert_eq!(gs[0].labels().get(labels::HUB_NODEPOOL).map(String::as_str), Some("preferred-small"));
    let cs = claims(&world, 0).await;
    assert_eq!(cs[0].labels().get(labels::NODEPOOL).map(String::as_str), Some("preferred-small"));
    create_pods(&world, 0, vec![pod("big", "7", "1Gi", json!({}))]).await;
    wait_in(&world, 0, "weighted-nodepools: big pod running", NODE_UP, || async { running(&world, 0).await == 2 })
        .await;
    let gs = groups(&world, 0).await;
    let by_pool: BTreeMap<String, String> = gs
        .iter()
        .map(|g| (g.labels().get(labels::HUB_NODEPOOL).cloned().unwrap_or_default(), g.spec.flavor.clone()))
        .collect();
    assert_eq!(
        by_pool,
        BTreeMap::from([("any-size".into(), "S".into()), ("preferred-small".into(), "2XS".into())]),
        "weighted-nodepools"
    );

    wait_in(&world, 1, "min-values: the 10Gi pod running", NODE_UP, || async { running(&world, 1).await == 1 }).await;
    let cs = claims(&world, 1).await;
    assert_eq!(cs.len(), 1, "min-values: one claim, none for the 12Gi pod");
    let (options, min) = instance_type_options(&cs[0]);
    assert_eq!((options, min), (vec!["S".to_string(), "M".to_string()], Some(2)), "min-values");
    assert_eq!(flavors(&groups(&world, 1).await), ["S"]);
    quiet_then(&world, 1, "min-values: the 12Gi pod stays Pending with no claim", Work::Rounds(2), || async {
        phase(named(&pods(&world, 1).await, "fits-one-flavor")) == "Pending" && claims(&world, 1).await.len() == 1
    })
    .await;
    for i in 0..2 {
        assert_one_group_per_claim(&world, i).await;
    }
    world.shutdown().await;
}

/// cpu-limit: a pool with `limits.cpu: 8` and one pod per node gets exactly two `2XS` (8 vCPU);
/// the third pod stays Pending and the pool reports `resources.cpu: 8`. team-dedicated: the node
/// carries the pool's taint, the pool's label and the class label; only the tolerating pod lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_limit_caps_the_pool_and_a_dedicated_pool_takes_only_tolerating_pods() {
    let mut world =
        World::start(&[("limited", "cpu-limit"), ("team", "team-dedicated")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, |pool| pool["spec"]["limits"]["cpu"] = json!("8")).await;
    apply(&world, 1, "team-dedicated.yaml", TEAM_DEDICATED, as_is).await;
    world.start_hub();
    create_pods(&world, 0, replicas(3, "1", "1Gi", one_per_node())).await;
    let tolerate =
        json!({"tolerations": [{"key": "team", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}]});
    create_pods(&world, 1, vec![pod("tolerant", "1", "1Gi", tolerate), pod("intolerant", "1", "1Gi", json!({}))]).await;

    // cpu-limit
    wait_in(&world, 0, "cpu-limit: two pods running", NODE_UP, || async { running(&world, 0).await == 2 }).await;
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "limited");
    wait_in(&world, 0, "cpu-limit: the pool reports 8 CPUs on 2 nodes", Duration::from_secs(20), || async {
        pools.get("default").await.ok().and_then(|p| p.status).is_some_and(|s| {
            s.resources.as_ref().and_then(|r| r.get("cpu")).map(|q| q.0.as_str()) == Some("8") && s.nodes == Some(2)
        })
    })
    .await;
    quiet_then(&world, 0, "cpu-limit: exactly two 2XS, the third pod Pending", Work::Rounds(2), || async {
        let gs = groups(&world, 0).await;
        let ps = pods(&world, 0).await;
        flavors(&gs) == ["2XS", "2XS"]
            && claims(&world, 0).await.len() == 2
            && ps.iter().filter(|p| phase(p) == "Pending" && node_of(p).is_none()).count() == 1
    })
    .await;
    assert_one_group_per_claim(&world, 0).await;
    // The Pending pod says why where its owner looks (`kubectl describe pod`).
    let pod_events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(world.clusters[0].client(), "default");
    let why: Vec<String> = pod_events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter(|e| e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some("Pod")))
        .map(|e| e.note.unwrap_or_default())
        .collect();
    assert!(why.iter().any(|n| n.contains("limit")), "a FailedScheduling event names the limit: {why:?}");

    // team-dedicated
    wait_in(&world, 1, "team-dedicated: the tolerating pod running", NODE_UP, || async {
        running(&world, 1).await == 1
    })
    .await;
    let gs = groups(&world, 1).await;
    assert_eq!(flavors(&gs), ["XS"], "the pool's cheapest flavor");
    let ng = gs[0].name_any();
    let ps = pods(&world, 1).await;
    let team_node = format!("{ng}-node0");
    assert_eq!(node_of(named(&ps, "tolerant")), Some(team_node.as_str()));
    let n = node(&world, 1, &team_node).await;
    let taints = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "team" && t.value.as_deref() == Some("platform") && t.effect == "NoSchedule"),
        "the pool's taint on the node: {taints:?}"
    );
    assert_eq!(n.labels().get("team").map(String::as_str), Some("platform"), "the pool's label");
    assert_eq!(n.labels().get("billing/cost-center").map(String::as_str), Some("platform-42"), "the class label");
    assert_eq!(
        gs[0].spec.labels.as_ref().and_then(|l| l.get("billing/cost-center")).map(String::as_str),
        Some("platform-42"),
        "the class label is on the NodeGroup itself, so on the node from its first second"
    );
    quiet_then(
        &world,
        1,
        "team-dedicated: the intolerant pod stays Pending, no second claim",
        Work::Rounds(2),
        || async {
            let ps = pods(&world, 1).await;
            let p = named(&ps, "intolerant");
            phase(p) == "Pending" && node_of(p).is_none() && claims(&world, 1).await.len() == 1
        },
    )
    .await;
    assert_one_group_per_claim(&world, 1).await;
    world.shutdown().await;
}

/// quota: ten pods fill the organisation quota with one `M` (40 GB of 40 with the control plane);
/// two more make a `2XS` CKE refuses. The refused group is deleted, its claim deleted as
/// insufficient capacity, every flavor at least as large in RAM cools down (persisted in the
/// capacity ConfigMap), retries fail fast without creating groups, the two pods stay Pending, and
/// no NodeGroup leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_refusal_deletes_the_claim_cools_the_flavor_and_retries_fail_fast() {
    let mut world = World::start(&[("quota", "quota")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, without_limits).await;
    world.start_hub();
    scale(&world, 0, 10, "1", "1500Mi").await.unwrap();
    wait_in(&world, 0, "quota: 10 pods running", NODE_UP, || async { running(&world, 0).await == 10 }).await;
    let gs = groups(&world, 0).await;
    assert_eq!(flavors(&gs), ["M"], "ten pods fit one M exactly");
    let m_group = gs[0].name_any();
    assert!(cooling(&world, 0).await.is_empty());

    scale(&world, 0, 12, "1", "1500Mi").await.unwrap();
    wait_in(&world, 0, "quota: 2XS cooling down", Duration::from_secs(30), || async {
        cooling(&world, 0).await.contains("2XS")
    })
    .await;
    let state = capacity_state(&world, 0).await.unwrap();
    let refusal = "Quota exceeded: RAM max: limit = 40.0 GB | actual = 44.0 GB";
    assert_eq!(state["lastMessage"], refusal, "{state}");
    assert!(state["backoffUntil"].is_string(), "creations back off: {state}");
    assert_eq!(
        cooling(&world, 0).await,
        ["2XS", "XS", "S", "M", "L", "XL"].into_iter().map(String::from).collect(),
        "a RAM refusal of the smallest flavor cools every flavor at least as large in RAM"
    );
    wait_in(&world, 0, "quota: the claim deleted as insufficient capacity", Duration::from_secs(10), || async {
        events(&world, 0).await.iter().any(|e| {
            e.reason.as_deref() == Some("InsufficientCapacity")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("NodeClaim")
                && e.note.as_deref().is_some_and(|n| n.contains(&format!("CKE refused flavor 2XS: {refusal}")))
        })
    })
    .await;
    wait_in(&world, 0, "quota: the refused NodeGroup deleted", Duration::from_secs(10), || async {
        groups(&world, 0).await.iter().map(ResourceExt::name_any).collect::<Vec<_>>() == [m_group.clone()]
    })
    .await;
    let creates = nodegroup_creates(&world, 0).await;
    assert_eq!(creates, 2, "the M, then the refused 2XS");
    // The two pending pods get no NodeGroup and stay Pending. Creations back off after the refusal
    // (60 s), so no round shows: quiet is a stretch without writes.
    quiet_then(&world, 0, "quota: no new NodeGroup, two pods stay Pending", Work::Reacting, || async {
        let ps = pods(&world, 0).await;
        nodegroup_creates(&world, 0).await == creates
            && groups(&world, 0).await.len() == 1
            && ps.iter().filter(|p| phase(p) == "Pending" && node_of(p).is_none()).count() == 2
    })
    .await;
    // The refused claim is gone (a retry may come and go, but never launches): only the M's is left.
    let m_claim = gs[0].labels().get(labels::NODECLAIM).cloned().unwrap();
    wait_in(&world, 0, "quota: only the M's claim left", Duration::from_secs(10), || async {
        claims(&world, 0).await.iter().map(ResourceExt::name_any).collect::<Vec<_>>() == [m_claim.clone()]
    })
    .await;
    assert_one_group_per_claim(&world, 0).await;
    world.shutdown().await;
}

/// quota fallback: a FlavorCatalog adds `CPU16` (16 vCPU, 4 GB) at a price below `2XS`; the
/// organisation's 30-vCPU quota (16 taken by the control plane) refuses it. The refused flavor
/// cools down and the next decision picks another flavor, `2XS`, which CKE accepts: the pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flavor_cke_refuses_cools_down_and_the_next_claim_falls_back_to_another() {
    const CATALOG: &str = "
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: FlavorCatalog
metadata: {name: high-cpu}
spec:
  flavors:
    - {name: CPU16, cpu: 16, memoryKi: 3911884, priceHourly: 0.02}
---
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: CleverNodeClass
metadata: {name: high-cpu}
spec:
  flavorCatalogRef: {name: high-cpu}
---
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  clusterName: set-by-the-test
  template:
    spec:
      nodeClassRef: {group: karpenter.clever-cloud.com, kind: CleverNodeClass, name: high-cpu}
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
";
    let cke = |i: usize| {
        let mut c: SimCkeConfig = quick_cke(i as u64);
        // The platform offers CPU16 to this organisation, whose quota is 30 vCPU.
        c.flavors.push(SimFlavor::new("CPU16", 16, 3_911_884));
        c.quota.limit = Usage { vcpu: 30, ram_gb: 40 };
        c
    };
    let mut world = World::start(&[("fallback", "quota-fallback")], cke).await.unwrap();
    // The first creation back-off (60 s by default) would only delay the fallback.
    world.hub_settings.capacity.backoff = Duration::from_secs(1);
    apply(&world, 0, "high-cpu catalog", CATALOG, as_is).await;
    world.start_hub();
    create_pods(&world, 0, replicas(1, "1", "1500Mi", json!({}))).await;
    wait_in(&world, 0, "quota-fallback: pod running", NODE_UP, || async { running(&world, 0).await == 1 }).await;

    let refused = notes(&world, 0, "InsufficientCapacity").await;
    assert!(
        refused
            .iter()
            .any(|n| n.contains("CKE refused flavor CPU16: Quota exceeded: CPU max: limit = 30 | actual = 32")),
        "CPU16 was tried first (cheapest) and refused: {refused:?}"
    );
    let gs = groups(&world, 0).await;
    assert_eq!(flavors(&gs), ["2XS"], "the fallback is the next cheapest flavor CKE accepts");
    assert_eq!(nodegroup_creates(&world, 0).await, 2, "one refused CPU16, then the 2XS");
    let state = capacity_state(&world, 0).await.unwrap();
    let down = cooling(&world, 0).await;
    assert!(down.contains("CPU16") && down.contains("XL"), "a CPU refusal cools flavors with as many vCPUs: {state}");
    assert!(!down.contains("2XS") && !down.contains("M"), "smaller flavors stay available: {state}");
    assert_one_group_per_claim(&world, 0).await;
    world.shutdown().await;
}

/// quota fast-fail: an `XL`-only pool (cpu limit 400) and four pods one per node. CKE refuses every
/// `XL` (32 GB + 24 GB of control plane > 40 GB): at least one refusal, the pods stay Pending, no
/// refused group stays; deleting the workload leaves no claims and no groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xl_only_pool_over_quota_fails_fast_and_cleans_up() {
    let mut world = World::start(&[("fast-fail", "quota-fast-fail")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, |pool| {
        only_flavors(&["XL"])(pool);
        pool["spec"]["limits"] = json!({"cpu": "400"});
    })
    .await;
    world.start_hub();
    create_pods(&world, 0, replicas(4, "1", "1Gi", one_per_node())).await;
    wait_in(&world, 0, "quota-fast-fail: XL refused and cooling down", NODE_UP, || async {
        cooling(&world, 0).await.contains("XL")
    })
    .await;
    wait_in(&world, 0, "quota-fast-fail: a claim deleted for the refusal", Duration::from_secs(10), || async {
        notes(&world, 0, "InsufficientCapacity")
            .await
            .iter()
            .any(|n| n.contains("CKE refused flavor XL: Quota exceeded: RAM max: limit = 40.0 GB | actual = 56.0 GB"))
    })
    .await;
    wait_in(&world, 0, "quota-fast-fail: refused groups deleted", Duration::from_secs(10), || async {
        groups(&world, 0).await.is_empty()
    })
    .await;
    let creates = nodegroup_creates(&world, 0).await;
    // Launches are paced: the first refusal arms the back-off before the next claim may create.
    assert_eq!(creates, 1, "one refused attempt, the other claims fail fast");
    // Creations back off after the refusal (60 s): no round shows, so quiet is a stretch without writes.
    quiet_then(&world, 0, "quota-fast-fail: all four pods Pending, no new attempt", Work::Reacting, || async {
        let ps = pods(&world, 0).await;
        ps.len() == 4
            && ps.iter().all(|p| phase(p) == "Pending" && node_of(p).is_none())
            && nodegroup_creates(&world, 0).await == creates
            && groups(&world, 0).await.is_empty()
    })
    .await;

    let api: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    for p in pods(&world, 0).await {
        api.delete(&p.name_any(), &DeleteParams::default()).await.unwrap();
    }
    wait_in(&world, 0, "quota-fast-fail: workload gone", Duration::from_secs(10), || async {
        pods(&world, 0).await.is_empty()
    })
    .await;
    wait_in(&world, 0, "quota-fast-fail: no claims left", Duration::from_secs(10), || async {
        claims(&world, 0).await.is_empty()
    })
    .await;
    quiet_then(&world, 0, "quota-fast-fail: no claims and no groups", Work::Reacting, || async {
        claims(&world, 0).await.is_empty() && groups(&world, 0).await.is_empty()
    })
    .await;
    world.shutdown().await;
}

/// Launch pacing (clever-cloud.md §3.4 step 5): CKE's quota engine judges concurrent creations
/// together, so per workload cluster at most one NodeGroup awaits its verdict at a time. Three
/// claims decided in one round (one pod per node, no pool limits) are created one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_one_cluster_await_their_verdicts_one_at_a_time() {
    let mut world = World::start(&[("paced", "launch-pacing")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, without_limits).await;
    world.start_hub();
    create_pods(&world, 0, replicas(3, "1", "1Gi", one_per_node())).await;
    // Sampled every 50 ms: a verdict comes within a second, two overlapping ones must not slip by.
    let most = std::cell::Cell::new(0);
    let ran = poll_every(Duration::from_millis(50), NODE_UP, || async {
        let awaiting = groups(&world, 0)
            .await
            .iter()
            .filter(|g| !g.is_terminating() && g.verdict() == crds::nodegroup::Verdict::Pending)
            .count();
        most.set(most.get().max(awaiting));
        running(&world, 0).await == 3
    })
    .await;
    assert!(ran, "launch-pacing: 3 pods running\n{}", summary(&world, 0).await);
    assert_eq!(flavors(&groups(&world, 0).await), ["2XS", "2XS", "2XS"]);
    assert_eq!(most.get(), 1, "NodeGroups awaiting CKE's verdict at the same time in one cluster");
    world.shutdown().await;
}

/// A NodeGroup carrying this hub's labels for the namespace but no UID annotation (a copy, or a
/// hand-made group): the ownership proof fails, so nothing may touch it.
fn decoy(namespace: &str) -> NodeGroup {
    serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1",
        "kind": "NodeGroup",
        "metadata": {"name": "decoy", "labels": {
            labels::HUB: "default",
            labels::NODECLAIM_NAMESPACE: namespace,
            labels::NODECLAIM: "decoy",
            labels::HUB_NODEPOOL: "default",
            labels::NODECLASS: "default",
        }},
        "spec": {"flavor": "2XS", "nodeCount": 1, "taints": [{"key": "decoy", "value": "true", "effect": "NoSchedule"}]}
    }))
    .unwrap()
}

/// Force-delete a claim as a user would while the hub is down (a running hub puts its finalizer
/// back at once, and its termination would then delete the group): stop the hub, drop the claim's
/// finalizers, delete it, start the hub again.
async fn force_delete(world: &mut World, i: usize, claim: &str) {
    world.stop_hub().await;
    let api: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &world.clusters[i].namespace);
    api.patch(claim, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();
    api.delete(claim, &DeleteParams::default()).await.unwrap();
    wait_in(world, i, "the force-deleted claim gone", Duration::from_secs(10), || async {
        api.get_opt(claim).await.unwrap().is_none()
    })
    .await;
    world.start_hub();
}

/// Make the hub reconnect cluster `i` (its Secret changed), which triggers a garbage-collection
/// sweep once the watches are synced again.
async fn touch_secret(world: &World, i: usize, value: &str) {
    let c = &world.clusters[i];
    let api: Api<Secret> = Api::namespaced(world.mgmt.client(), &c.namespace);
    let patch = json!({"metadata": {"annotations": {"scenarios.test/touched": value}}});
    api.patch(&format!("{}-kubeconfig", c.name), &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// garbage collection, the part that fits in seconds: a decoy group with hub labels and no UID is
/// neither stamped, adopted nor deleted; the group of a force-deleted claim (finalizer removed by
/// hand) is not reaped while younger than the GC minimum age (2 min), even across sweeps, and its
/// node keeps serving its pod. The reaping itself is
/// `the_group_of_a_force_deleted_claim_is_reaped_after_the_minimum_age`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_keeps_a_decoy_and_young_orphans() {
    let mut world = World::start(&[("gc", "garbage-collection")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, as_is).await;
    let ng_api: Api<NodeGroup> = Api::all(world.clusters[0].client());
    ng_api.create(&PostParams::default(), &decoy("gc")).await.unwrap();
    world.start_hub();
    create_pods(&world, 0, replicas(1, "1", "1Gi", json!({}))).await;
    wait_in(&world, 0, "garbage-collection: pod running", NODE_UP, || async { running(&world, 0).await == 1 }).await;
    let cs = claims(&world, 0).await;
    assert_eq!(cs.len(), 1);
    let orphan = provider_id(&cs[0]).unwrap().strip_prefix("clevercloud://").unwrap().to_string();
    let decoy_node = node(&world, 0, "decoy-node0").await;
    assert_eq!(
        decoy_node.spec.as_ref().and_then(|s| s.provider_id.clone()),
        None,
        "the decoy's node is not the hub's to stamp"
    );
    assert_ne!(node_of(named(&pods(&world, 0).await, "web-0")), Some("decoy-node0"));

    force_delete(&mut world, 0, &cs[0].name_any()).await;
    // A reconnection prompts a sweep once synced (both are younger than the minimum age, so no sweep
    // reports on them): judged once the re-list is seen and writes are quiet.
    let lists = world.clusters[0].server.requests().count("list", "daemonsets");
    touch_secret(&world, 0, "1").await;
    wait_in(&world, 0, "garbage-collection: the cluster re-listed after the Secret changed", SETTLE, || async {
        world.clusters[0].server.requests().count("list", "daemonsets") > lists
    })
    .await;
    quiet_then(&world, 0, "garbage-collection: the decoy and the young orphan are kept", Work::Reacting, || async {
        let gs = groups(&world, 0).await;
        let kept = |name: &str| gs.iter().any(|g| g.name_any() == name && !g.is_terminating());
        kept("decoy") && kept(&orphan) && running(&world, 0).await == 1 && claims(&world, 0).await.is_empty()
    })
    .await;
    assert_eq!(world.clusters[0].server.requests().count("delete", "nodegroups"), 0, "no NodeGroup deleted");
    assert_eq!(nodegroup_creates(&world, 0).await, 2, "the decoy and the claim's group; no replacement");
    world.shutdown().await;
}

/// garbage collection, the reaping: once older than the GC minimum age (2 min) on the hub's clock,
/// the group of a force-deleted claim is reaped at the next sweep, its Node released, and the decoy
/// still kept. The hub runs on a manual clock the test advances past the minimum age (no waiting);
/// sweeps come every second (`gc_period`, 2 min by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_of_a_force_deleted_claim_is_reaped_after_the_minimum_age() {
    let mut world = World::start(&[("gc", "garbage-collection")], |i| quick_cke(i as u64)).await.unwrap();
    let clock = sim::clock::Clock::manual_now();
    world.hub_settings.clock = clock.clone();
    world.hub_settings.gc_period = Duration::from_secs(1);
    let min_age = world.hub_settings.gc_min_age;
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, as_is).await;
    let ng_api: Api<NodeGroup> = Api::all(world.clusters[0].client());
    ng_api.create(&PostParams::default(), &decoy("gc")).await.unwrap();
    world.start_hub();
    create_pods(&world, 0, replicas(1, "1", "1Gi", json!({}))).await;
    wait_in(&world, 0, "garbage-collection: pod running", NODE_UP, || async { running(&world, 0).await == 1 }).await;
    let cs = claims(&world, 0).await;
    let orphan = provider_id(&cs[0]).unwrap().strip_prefix("clevercloud://").unwrap().to_string();
    let orphan_group = ng_api.get(&orphan).await.unwrap();
    let created = orphan_group.metadata.creation_timestamp.clone().unwrap().0;
    let (orphan_uid, old_claim_uid) = (orphan_group.uid(), cs[0].uid());
    force_delete(&mut world, 0, &cs[0].name_any()).await;
    let orphan_kept = || async { ng_api.get_opt(&orphan).await.unwrap().is_some_and(|g| !g.is_terminating()) };
    quiet_then(&world, 0, "garbage-collection: the orphan kept while young", Work::Reacting, orphan_kept).await;

    // The hub's clock past the orphan's minimum age (the API servers stamp on the wall clock, ahead
    // of the hub's, which only moves when told): the next sweep reaps it.
    let behind = u64::try_from(created.as_second() - clock.now().timestamp()).unwrap_or(0);
    clock.advance(Duration::from_secs(behind + 1) + min_age);
    wait_in(&world, 0, "garbage-collection: the orphan reaped", Duration::from_secs(30), || async {
        ng_api.get_opt(&orphan).await.unwrap().is_none_or(|g| g.is_terminating())
    })
    .await;
    // A sweep past the minimum age has judged the decoy once it reports it refused (the gauge is
    // set as a sweep ends).
    wait_in(&world, 0, "garbage-collection: a sweep refusing the decoy", SETTLE, || async {
        gc_refused(&world, 0) == 1.0
    })
    .await;
    quiet_then(&world, 0, "garbage-collection: the decoy is kept", Work::Reacting, || async {
        ng_api.get_opt("decoy").await.unwrap().is_some_and(|g| !g.is_terminating())
    })
    .await;
    let deleted = world.clusters[0].server.requests().count("delete", "nodegroups");
    assert_eq!(deleted, 1, "NodeGroup deletes: the orphan's, once");
    // Both are reported on the NodePool their labels name (management users may not read the
    // workload cluster).
    let collected = notes(&world, 0, "GarbageCollected").await;
    assert!(collected.iter().any(|n| n.contains(&orphan)), "GarbageCollected names the orphan: {collected:?}");
    let refused = notes(&world, 0, "GarbageCollectionRefused").await;
    assert!(refused.iter().any(|n| n.contains("decoy")), "GarbageCollectionRefused names the decoy: {refused:?}");
    // The reaped group's node goes (the hub must release the finalizer it put on the node, as no
    // claim termination will), and its pod with it.
    let orphan_node = format!("{orphan}-node0");
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    if !poll_until(SETTLE, || async { nodes.get_opt(&orphan_node).await.unwrap().is_none() }).await {
        let n = nodes.get(&orphan_node).await.unwrap();
        panic!(
            "the reaped group's Node {orphan_node} is stuck: deletionTimestamp {:?}, finalizers {:?}",
            n.metadata.deletion_timestamp,
            n.finalizers()
        );
    }
    // Its pod's controller would recreate the pod (there is none here: recreate it by hand), and
    // a replacement node registers.
    wait_in(&world, 0, "garbage-collection: the orphan's pod collected", Duration::from_secs(30), || async {
        pods(&world, 0).await.is_empty()
    })
    .await;
    create_pods(&world, 0, replicas(1, "1", "1Gi", json!({}))).await;
    wait_in(&world, 0, "garbage-collection: the replacement running", NODE_UP, || async {
        running(&world, 0).await == 1
    })
    .await;
    let cs = claims(&world, 0).await;
    assert_eq!(cs.len(), 1);
    assert_eq!(condition(&cs[0], "Registered"), Some("True"));
    // Names are deterministic (the same pod makes the same claim and group names): what must
    // differ are the objects themselves.
    assert_ne!(cs[0].uid(), old_claim_uid, "a new claim");
    let group = provider_id(&cs[0]).unwrap().strip_prefix("clevercloud://").unwrap().to_string();
    assert_ne!(ng_api.get(&group).await.unwrap().uid(), orphan_uid, "the orphan is gone for good");
    world.shutdown().await;
}

/// Issue 14's "done when", on the hub itself: the sandbox's 12 pods of 1 CPU / 1Gi under the
/// example pool's limits (24 CPU, 16Gi) all run, on two XS (0.1222 EUR/h), as `plan` decides for
/// examples/plan/limits-sandbox-12-pods.yaml; none is left pending by the memory limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_pool_places_the_sandbox_twelve_pods_within_its_limits() {
    let mut world = World::start(&[("limits", "sandbox-twelve")], |i| quick_cke(i as u64)).await.unwrap();
    apply(&world, 0, "general-purpose.yaml", GENERAL_PURPOSE, as_is).await;
    world.start_hub();
    create_pods(&world, 0, replicas(12, "1", "1Gi", json!({}))).await;
    wait_in(&world, 0, "the 12 pods running", NODE_UP, || async { running(&world, 0).await == 12 }).await;
    let mut fl: Vec<String> = flavors(&groups(&world, 0).await).into_iter().map(str::to_string).collect();
    fl.sort();
    assert_eq!(fl, ["XS", "XS"], "{}", summary(&world, 0).await);
    assert_one_group_per_claim(&world, 0).await;
    world.shutdown().await;
}
