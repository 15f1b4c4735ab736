//! Fleet NodePools (fleet.md §2, §7): one pool serving every registered cluster of its namespace
//! whose labels its `clusterSelector` matches, each cluster as a `clusterName` pool of the same spec
//! would be served; a cluster leaving the selection keeps its nodes until the disruption path and
//! its budgets replace them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::{NodeClaim, NodePool};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale};
use serde_json::{Value, json};

use crate::common;
use common::{EXAMPLE, poll_until, wait_for};

/// Label cluster `name`'s registration Secret in `ns` (how `register --label` labels it).
async fn label(world: &World, ns: &str, name: &str, labels: Value) {
    world.label_cluster(ns, name, labels).await.unwrap();
}

async fn claims(world: &World, ns: &str) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(world.mgmt.client(), ns).list(&ListParams::default()).await.unwrap().items
}

/// The clusters `ns`'s claims are for, sorted, one entry per claim.
async fn claimed_clusters(world: &World, ns: &str) -> Vec<String> {
    let mut c: Vec<String> = claims(world, ns).await.into_iter().map(|c| c.spec.cluster_name).collect();
    c.sort();
    c
}

async fn pool(world: &World, ns: &str) -> NodePool {
    Api::<NodePool>::namespaced(world.mgmt.client(), ns).get("default").await.unwrap()
}

fn condition(pool: &NodePool, type_: &str) -> Option<(String, String, String)> {
    pool.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn drifted(claim: &NodeClaim) -> Option<String> {
    claim
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Drifted" && c.status == "True")
        .map(|c| c.reason.clone())
}

/// Apply the general-purpose example in `ns`, its pool made a fleet pool over `env=prod`, the
/// rest of its spec edited by `edit`.
async fn apply_fleet_pool(world: &World, ns: &str, edit: impl Fn(&mut serde_json::Map<String, Value>)) {
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, ns, |doc| {
            if doc["kind"] == "NodePool" {
                let spec = doc["spec"].as_object_mut().unwrap();
                spec.remove("clusterName");
                spec.insert("clusterSelector".into(), json!({"matchLabels": {"env": "prod"}}));
                edit(spec);
            }
        })
        .await
        .unwrap();
}

/// Each cluster's phase in the pool's rollout, by cluster name.
fn rollout_phases(p: &NodePool) -> Vec<crds::nodepool::RolloutPhase> {
    p.status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .map(|r| r.clusters.iter().map(|c| c.phase).collect())
        .unwrap_or_default()
}

/// Clusters lyon and paris of team-a, labelled `env=prod`, served by a fleet pool rolling out one
/// cluster at a time, paris first, soaking `soak` (only drift moves nodes: no consolidation); the
/// hub running, a node in each cluster, the first revision Done everywhere.
async fn rollout_world(soak: &str) -> World {
    rollout_world_with(soak, |i| quick_cke(i as u64)).await
}

/// [`rollout_world`] with each cluster's simulated CKE configured by `cke` (lyon 0, paris 1).
async fn rollout_world_with(soak: &str, cke: impl Fn(usize) -> sim::cke::SimCkeConfig) -> World {
    let mut world = rollout_setup(soak, cke).await;
    world.start_hub();
    first_revision_done(&world).await;
    world
}

/// [`rollout_world_with`] before any hub runs: the clusters labelled, the pool applied, a pod
/// waiting in each cluster.
async fn rollout_setup(soak: &str, cke: impl Fn(usize) -> sim::cke::SimCkeConfig) -> World {
    let clusters = [("team-a", "lyon"), ("team-a", "paris")];
    let world = World::start(&clusters, cke).await.unwrap();
    for (ns, name) in &clusters {
        label(&world, ns, name, json!({"env": "prod"})).await;
    }
    apply_fleet_pool(&world, "team-a", |spec| {
        spec.insert("rollout".into(), json!({"maxClusters": "1", "order": ["paris"], "soak": soak}));
        spec["disruption"]["consolidateAfter"] = json!("Never");
    })
    .await;
    for i in 0..2 {
        scale(&world, i, 1, "500m", "512Mi").await.unwrap();
    }
    world
}

/// Until each cluster has an initialized node and the first revision is Done everywhere.
async fn first_revision_done(world: &World) {
    use crds::nodepool::RolloutPhase::Done;
    wait_for("a node in each cluster, the first revision Done everywhere", Duration::from_secs(60), || async {
        let initialized = claims(world, "team-a")
            .await
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Initialized" && k.status == "True"))
            })
            .count();
        initialized == 2 && rollout_phases(&pool(world, "team-a").await) == [Done, Done]
    })
    .await;
}

/// The invariants of a rollout with `maxClusters: "1"` over lyon and paris (paris first), checked
/// at every [`RolloutWatch::sample`] until both are Done on the revision: at most one cluster
/// replacing drifted nodes, no cluster's phase going back (none repeated), lyon leaving Pending only
/// once paris is Done (none skipped), never Failed; and, at the end, each cluster's node replaced
/// exactly once.
struct RolloutWatch {
    revision: String,
    highest: [u8; 2],
    replacements: std::collections::BTreeSet<(String, String)>,
    end: std::time::Instant,
}

impl RolloutWatch {
    fn new(revision: String, deadline: Duration) -> Self {
        Self { revision, highest: [0, 0], replacements: Default::default(), end: std::time::Instant::now() + deadline }
    }

    /// The phases of the revision's rollout now (empty before it starts), and whether it is done.
    async fn sample(&mut self, world: &World) -> (Vec<crds::nodepool::RolloutPhase>, bool) {
        use crds::nodepool::RolloutPhase::*;
        let rank = |p: crds::nodepool::RolloutPhase| match p {
            Pending => 0,
            Progressing => 1,
            Soaking => 2,
            Done => 3,
            Failed => 4,
        };
        let revision = self.revision.clone();
        let on_revision = |c: &NodeClaim| {
            c.metadata.annotations.as_ref().and_then(|a| a.get(crds::drift::NODEPOOL_HASH_ANNOTATION))
                == Some(&revision)
        };
        let all = claims(world, "team-a").await;
        let busy: Vec<&str> = ["lyon", "paris"].into_iter().filter(|c| drift_busy(&all, c)).collect();
        assert!(busy.len() <= 1, "two clusters replacing drifted nodes at once: {busy:?}");
        self.replacements.extend(
            all.iter()
                .filter(|c| on_revision(c))
                .map(|c| (c.spec.cluster_name.clone(), c.metadata.name.clone().unwrap_or_default())),
        );
        let p = pool(world, "team-a").await;
        let current = p.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.revision == revision);
        let phases = if current { rollout_phases(&p) } else { Vec::new() };
        let mut done = false;
        if phases.len() == 2 {
            for (i, phase) in phases.iter().enumerate() {
                assert!(rank(*phase) >= self.highest[i], "cluster {i} went back to {phase:?}: {phases:?}");
                assert_ne!(*phase, Failed, "{:?}", p.status);
                self.highest[i] = rank(*phase);
            }
            assert!(phases[0] == Pending || phases[1] == Done, "lyon started before paris was done: {phases:?}");
            done = phases == [Done, Done]
                && all.len() == 2
                && all.iter().all(|c| on_revision(c) && c.metadata.deletion_timestamp.is_none());
        }
        assert!(done || std::time::Instant::now() < self.end, "rollout not finished: {phases:?}, {} claims", all.len());
        (phases, done)
    }

    /// Each cluster's node replaced exactly once.
    fn finish(&self) {
        let per_cluster = |name: &str| self.replacements.iter().filter(|(c, _)| c == name).count();
        assert_eq!(
            (per_cluster("lyon"), per_cluster("paris")),
            (1, 1),
            "each node replaced once: {:?}",
            self.replacements
        );
    }
}

/// A new revision of team-a's pool: a template label.
async fn change_template(world: &World) -> String {
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    let change = json!({"spec": {"template": {"metadata": {"labels": {"rollout": "two"}}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&change)).await.unwrap();
    crds::drift::nodepool_hash(&pools.get("default").await.unwrap().spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_pool_serves_its_namespace_s_matching_clusters_and_a_departed_cluster_keeps_its_nodes_within_budgets() {
    // team-a: paris and lyon are prod, dev is not; team-b's paris is prod too, in another namespace.
    let clusters = [("team-a", "paris"), ("team-a", "lyon"), ("team-a", "dev"), ("team-b", "paris")];
    let mut world = World::start(&clusters, |i| quick_cke(i as u64)).await.unwrap();
    for (ns, name) in &clusters[..2] {
        label(&world, ns, name, json!({"env": "prod"})).await;
    }
    label(&world, "team-a", "dev", json!({"env": "dev"})).await;
    label(&world, "team-b", "paris", json!({"env": "prod"})).await;
    // The general-purpose example in team-a, its pool made a fleet pool over env=prod, with a
    // budget of no disruption at all: a departed cluster's nodes must then stay.
    apply_fleet_pool(&world, "team-a", |spec| spec["disruption"]["budgets"] = json!([{"nodes": "0"}])).await;
    // team-b has the node class only: nothing of team-a's may serve its cluster.
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, "team-b", |doc| {
            if doc["kind"] == "NodePool" {
                doc["spec"]["clusterName"] = json!("unregistered");
            }
        })
        .await
        .unwrap();
    world.start_hub();

    wait_for("the fleet pool Ready over its two clusters", Duration::from_secs(60), || async {
        let p = pool(&world, "team-a").await;
        p.status.as_ref().and_then(|s| s.clusters_ready.clone()).as_deref() == Some("2/2")
            && condition(&p, "Ready").is_some_and(|c| c.0 == "True")
    })
    .await;
    let p = pool(&world, "team-a").await;
    let rows: Vec<&str> = p.status.as_ref().unwrap().clusters.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(rows, ["lyon", "paris"], "one row per selected cluster, dev and team-b's paris not among them");
    assert_eq!(condition(&p, "ClustersReady").unwrap().0, "True");
    assert!(condition(&p, "ClusterReachable").is_none(), "a fleet pool reports reachability per cluster row");

    // A pod in every cluster: only team-a's prod clusters get a node, each from the fleet pool.
    for i in 0..clusters.len() {
        scale(&world, i, 1, "500m", "512Mi").await.unwrap();
    }
    wait_for("a claim in paris and in lyon", Duration::from_secs(60), || async {
        claimed_clusters(&world, "team-a").await == ["lyon", "paris"]
    })
    .await;
    for c in claims(&world, "team-a").await {
        assert_eq!(c.metadata.labels.as_ref().unwrap()["karpenter.sh/nodepool"], "default");
    }
    wait_for("both nodes counted in their rows", Duration::from_secs(60), || async {
        let p = pool(&world, "team-a").await;
        let s = p.status.unwrap_or_default();
        s.nodes == Some(2) && s.clusters.iter().all(|r| r.nodes == 1)
    })
    .await;
    // The fleet view (fleet.md §6), from the management cluster only: a row per registered cluster
    // of team-a, the fleet pool on the two it serves, the nodes and price the hub reported.
    let fleet_view =
        || async { operator::commands::fleet::gather(&world.mgmt.client(), Some("team-a")).await.unwrap() };
    let reported = poll_until(Duration::from_secs(30), || async {
        let v = fleet_view().await;
        v.clusters.len() == 3
            && v.clusters.iter().all(|c| c.reachability == "Connected" && c.nodes.all.is_some())
            && v.clusters.iter().filter(|c| c.nodes.hub == 1).count() == 2
    })
    .await;
    let v = fleet_view().await;
    assert!(reported, "every team-a cluster reported, paris and lyon with their node: {v:#?}");
    let names: Vec<&str> = v.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["dev", "lyon", "paris"], "team-b's cluster is not in team-a's view");
    for c in &v.clusters {
        let fleet_pools: Vec<(&str, bool)> = c.pools.iter().map(|p| (p.name.as_str(), p.fleet)).collect();
        if c.name == "dev" {
            assert!(fleet_pools.is_empty(), "{c:#?}");
            assert_eq!(c.eur_per_hour.as_deref(), Some("0.0000"));
        } else {
            assert_eq!(fleet_pools, [("default", true)], "{c:#?}");
            assert!(c.eur_per_hour.as_deref().and_then(|e| e.parse::<f64>().ok()).is_some_and(|e| e > 0.0), "{c:#?}");
            assert!(!c.stale && c.disrupting == 0, "{c:#?}");
        }
    }
    let table = operator::commands::fleet::table(&v, false);
    assert!(table.lines().nth(3).is_some_and(|l| l.starts_with("paris") && l.contains("default*")), "{table}");

    // Over a few seconds more, dev and team-b's paris stay without a claim (fleet.md §7.1).
    assert!(
        !poll_until(Duration::from_secs(5), || async {
            claimed_clusters(&world, "team-a").await.len() != 2 || !claims(&world, "team-b").await.is_empty()
        })
        .await,
        "only the selected clusters of the pool's namespace are served"
    );

    // lyon leaves the selection: no new node for it from the pool, its node drifted
    // ClusterNotSelected, and kept (the budget allows no disruption): never deleted en masse.
    label(&world, "team-a", "lyon", json!({"env": "staging"})).await;
    wait_for("lyon's claim drifted ClusterNotSelected", Duration::from_secs(30), || async {
        claims(&world, "team-a")
            .await
            .iter()
            .any(|c| c.spec.cluster_name == "lyon" && drifted(c).as_deref() == Some("ClusterNotSelected"))
    })
    .await;
    wait_for("the pool's rows without lyon, its node shown as departed", Duration::from_secs(30), || async {
        let p = pool(&world, "team-a").await;
        let rows: Vec<String> =
            p.status.as_ref().map(|s| s.clusters.iter().map(|r| r.name.clone()).collect()).unwrap_or_default();
        rows == ["paris"]
            && condition(&p, "NodesInDepartedClusters").is_some_and(|c| c.0 == "True" && c.2.contains("lyon: 1"))
            && p.status.as_ref().and_then(|s| s.clusters_ready.clone()).as_deref() == Some("1/1")
    })
    .await;
    assert_eq!(
        condition(&pool(&world, "team-a").await, "Ready").unwrap().0,
        "True",
        "a departed node is informational"
    );
    // Pods too big for the node it has: only a new node would run them.
    scale(&world, 1, 3, "3", "1Gi").await.unwrap();
    assert!(
        !poll_until(Duration::from_secs(8), || async {
            let all = claims(&world, "team-a").await;
            all.iter().filter(|c| c.spec.cluster_name == "lyon").count() != 1
                || all.iter().any(|c| c.metadata.deletion_timestamp.is_some())
        })
        .await,
        "lyon gets no new node from the pool it left, and keeps the one it has (budget 0)"
    );
    // paris is still served.
    scale(&world, 0, 3, "3", "1Gi").await.unwrap();
    wait_for("paris served after lyon left", Duration::from_secs(60), || async {
        let all = claims(&world, "team-a").await;
        all.iter().filter(|c| c.spec.cluster_name == "paris").count() > 1
    })
    .await;

    // lyon comes back: its node is no longer drifted and it is served again.
    label(&world, "team-a", "lyon", json!({"env": "prod"})).await;
    let back = poll_until(Duration::from_secs(60), || async {
        let all = claims(&world, "team-a").await;
        let lyon: Vec<&NodeClaim> = all.iter().filter(|c| c.spec.cluster_name == "lyon").collect();
        lyon.len() > 1 && lyon.iter().all(|c| drifted(c).is_none())
    })
    .await;
    let lyon: Vec<(String, Option<String>)> = claims(&world, "team-a")
        .await
        .iter()
        .filter(|c| c.spec.cluster_name == "lyon")
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), drifted(c)))
        .collect();
    assert!(back, "lyon selected again: served, its node not drifted; its claims (name, drift): {lyon:?}");
    world.stop_hub().await;
}

/// Five clusters of team-a, four labelled `env=prod` and served by the fleet pool: c5 labelled in
/// later is served (its waiting pod gets a node of the pool, none before); c4 labelled out gets no
/// new node from the pool and its nodes of the pool drift `ClusterNotSelected` and move to the
/// pool still serving it, at most one at a time (the fleet pool's budget), never en masse; the
/// other clusters are untouched (fleet.md §2, §7.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_clusters_one_joining_and_one_leaving_within_budgets() {
    let names = ["c1", "c2", "c3", "c4", "c5"];
    let clusters: Vec<(&str, &str)> = names.iter().map(|n| ("team-a", *n)).collect();
    let mut world = World::start(&clusters, |i| {
        let mut cke = quick_cke(i as u64 + 50);
        // Room for c4's three nodes and a replacement beside them (the default quota holds two).
        cke.quota.limit = sim::cke::Usage { vcpu: 64, ram_gb: 64 };
        cke
    })
    .await
    .unwrap();
    for name in &names[..4] {
        label(&world, "team-a", name, json!({"env": "prod"})).await;
    }
    apply_fleet_pool(&world, "team-a", |spec| {
        spec.insert("weight".into(), json!(50));
        spec.insert("limits".into(), json!({"cpu": "64", "memory": "64Gi"}));
        spec["disruption"]["budgets"] = json!([{"nodes": "1"}]);
        spec["disruption"]["consolidateAfter"] = json!("Never");
    })
    .await;
    // c4's other pool, preferred less while the fleet pool serves it.
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, "team-a", |doc| {
            if doc["kind"] == "NodePool" {
                doc["metadata"]["name"] = json!("fallback");
                doc["spec"]["clusterName"] = json!("c4");
                doc["spec"]["limits"] = json!({"cpu": "64", "memory": "64Gi"});
                doc["spec"]["disruption"]["consolidateAfter"] = json!("Never");
            }
        })
        .await
        .unwrap();
    world.start_hub();
    for i in 0..3 {
        scale(&world, i, 1, "500m", "512Mi").await.unwrap();
    }
    // Three pods in c4 needing more than one node; one in c5, not selected yet.
    scale(&world, 3, 3, "5", "1Gi").await.unwrap();
    scale(&world, 4, 1, "500m", "512Mi").await.unwrap();
    let of = |all: &[NodeClaim], cluster: &str, pool: &str| -> Vec<String> {
        let mut v: Vec<String> = all
            .iter()
            .filter(|c| {
                c.spec.cluster_name == cluster && c.metadata.labels.as_ref().unwrap()["karpenter.sh/nodepool"] == pool
            })
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        v.sort();
        v
    };
    let ready = poll_until(Duration::from_secs(90), || async {
        let all = claims(&world, "team-a").await;
        (0..3).all(|i| of(&all, names[i], "default").len() == 1)
            && of(&all, "c4", "default").len() >= 2
            && common::running(&world, 3).await == 3
    })
    .await;
    let all = claims(&world, "team-a").await;
    let by: Vec<(String, String)> = all
        .iter()
        .map(|c| (c.spec.cluster_name.clone(), c.metadata.labels.as_ref().unwrap()["karpenter.sh/nodepool"].clone()))
        .collect();
    assert!(ready, "c1-c3 one node each, c4 several, all from the fleet pool; claims (cluster, pool): {by:?}");
    let all = claims(&world, "team-a").await;
    let steady: Vec<Vec<String>> = (0..3).map(|i| of(&all, names[i], "default")).collect();
    assert!(of(&all, "c5", "default").is_empty(), "c5 is not selected yet");
    let c4_nodes = of(&all, "c4", "default").len();
    assert!(of(&all, "c4", "fallback").is_empty(), "the fleet pool is preferred in c4");

    // c5 joins, c4 leaves.
    label(&world, "team-a", "c5", json!({"env": "prod"})).await;
    label(&world, "team-a", "c4", json!({"env": "retired"})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        // A ReplicaSet's part: c4's pods evicted by a drain are created again.
        scale(&world, 3, 3, "5", "1Gi").await.unwrap();
        let all = claims(&world, "team-a").await;
        let leaving: Vec<&NodeClaim> = all
            .iter()
            .filter(|c| {
                c.spec.cluster_name == "c4" && c.metadata.labels.as_ref().unwrap()["karpenter.sh/nodepool"] == "default"
            })
            .collect();
        let disrupted = leaving
            .iter()
            .filter(|c| {
                c.metadata.deletion_timestamp.is_some()
                    || c.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(operator::decisions::disruption_queue::COMMAND_ANNOTATION))
            })
            .count();
        assert!(disrupted <= 1, "c4's fleet nodes disrupted {disrupted} at once (budget 1)");
        assert!(leaving.len() <= c4_nodes, "the pool left gives c4 no new node");
        for (i, before) in steady.iter().enumerate() {
            assert_eq!(&of(&all, names[i], "default"), before, "{} untouched", names[i]);
        }
        let moved = leaving.is_empty() && !of(&all, "c4", "fallback").is_empty();
        let joined = of(&all, "c5", "default").len() == 1;
        if moved && joined && common::running(&world, 3).await == 3 && common::running(&world, 4).await == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "c4 not moved or c5 not served: c4 fleet {:?}, c4 fallback {:?}, c5 {:?}",
            of(&all, "c4", "default"),
            of(&all, "c4", "fallback"),
            of(&all, "c5", "default")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world.stop_hub().await;
}

/// The status rows of a fleet pool on a real kube-apiserver, in sharded mode: each replica applies
/// the rows of the clusters it owns under a field manager of its own, and the server's list-map
/// merge keeps both replicas' rows (the emulator's simplified apply replaces lists, so only a real
/// server proves this); a cluster leaving the selection loses its row, including after its
/// replica was killed (the namespace writer removes rows no live writer drops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_rows_merge_and_follow_the_selection_on_a_real_api_server() {
    use crate::sharding::{Replica, ensure_lease_namespace};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    use operator::infra::{hub, registry};

    let cp = envtest::shared_or_skip!("fleet");
    let mgmt = cp.client().await.unwrap();
    common::install_hub_crds(&mgmt).await;
    ensure_lease_namespace(&mgmt).await;
    let ns = "fleet-real";
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    let _ = Api::<Namespace>::all(mgmt.clone()).create(&PostParams::default(), &namespace).await;
    let secrets: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let relabel = |name: String, env: &'static str| {
        let secrets = secrets.clone();
        async move {
            let labels = json!({"metadata": {"labels": {"env": env}}});
            secrets.patch(&format!("{name}-kubeconfig"), &PatchParams::default(), &Patch::Merge(labels)).await.unwrap();
        }
    };
    let mut workloads = Vec::new();
    for i in 0..4 {
        let name = format!("w-{i}");
        let server =
            // Seeded apart: each its own kube-system UID (one UID twice in a namespace is one cluster
            // registered twice, which the registry serves once and sharding places on one replica).
            sim::apiserver::ApiServer::start(
                sim::apiserver::ApiServerConfig::workload(name.as_str()).with_seed(i as u64 + 1),
            )
            .await
            .unwrap();
        let kubeconfig = serde_json::to_vec(&server.kubeconfig()).unwrap();
        operator::commands::register_cluster::write_secret(&mgmt, ns, &name, kubeconfig).await.unwrap();
        relabel(name, "prod").await;
        workloads.push(server);
    }
    for doc in common::documents(&common::repo().join("examples/general-purpose.yaml")) {
        let mut doc = doc;
        doc["metadata"]["namespace"] = json!(ns);
        if doc["kind"] == "NodePool" {
            let spec = doc["spec"].as_object_mut().unwrap();
            spec.remove("clusterName");
            spec.insert("clusterSelector".into(), json!({"matchLabels": {"env": "prod"}}));
            // status.rollout written and merged by the real server too.
            spec.insert("rollout".into(), json!({"maxClusters": "1", "soak": "1s"}));
            let pool: NodePool = serde_json::from_value(doc).unwrap();
            Api::<NodePool>::namespaced(mgmt.clone(), ns).create(&PostParams::default(), &pool).await.unwrap();
        } else {
            let class: crds::CleverNodeClass = serde_json::from_value(doc).unwrap();
            Api::<crds::CleverNodeClass>::namespaced(mgmt.clone(), ns)
                .create(&PostParams::default(), &class)
                .await
                .unwrap();
        }
    }
    let registry = registry::Settings {
        probe_interval: Duration::from_secs(2),
        probe_timeout: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(5),
        ..registry::Settings::default()
    };
    let config = cp.config().await.unwrap();
    let hub_settings = hub::Settings::default();
    // Buckets that share the four clusters between the two replicas.
    let keys: Vec<String> = (0..4).map(|i| format!("{ns}/w-{i}")).collect();
    let buckets = crate::sharding::splitting(&keys, 2);
    let start = |id: &str| Replica::start_in(id, config.clone(), hub_settings.clone(), registry.clone(), buckets);
    let names = ["fleet-0", "fleet-1"];
    let mut replicas = vec![start(names[0]), start(names[1])];
    let pools: Api<NodePool> = Api::namespaced(mgmt.clone(), ns);
    // Who wrote which rows, from the server's managedFields.
    let row_managers = |p: &NodePool| -> Vec<String> {
        let mut m: Vec<String> = p
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|f| f.subresource.as_deref() == Some("status"))
            .filter(|f| f.fields_v1.as_ref().is_some_and(|v| v.0.pointer("/f:status/f:clusters").is_some()))
            .map(|f| f.manager.clone().unwrap_or_default())
            .collect();
        m.sort();
        m
    };
    // Sorted: the server keeps a list-map's entries in the order its appliers added them.
    let rows = |p: &NodePool| -> Vec<String> {
        let mut r: Vec<String> =
            p.status.as_ref().map(|s| s.clusters.iter().map(|r| r.name.clone()).collect()).unwrap_or_default();
        r.sort();
        r
    };
    let seen = std::cell::RefCell::new(None);
    let both = poll_until(Duration::from_secs(60), || async {
        let p = pools.get("default").await.unwrap();
        let ok = rows(&p) == ["w-0", "w-1", "w-2", "w-3"]
            && row_managers(&p) == names.iter().map(|n| format!("karpenter-hub-rows-{n}")).collect::<Vec<_>>()
            && p.status.as_ref().and_then(|s| s.clusters_ready.as_deref()).is_some_and(|r| r.ends_with("/4"));
        *seen.borrow_mut() = Some((rows(&p), row_managers(&p), p.status.and_then(|s| s.clusters_ready)));
        ok
    })
    .await;
    assert!(
        both,
        "both replicas' rows kept side by side, the summary over four clusters; last seen: {:?}",
        seen.borrow()
    );

    // Each cluster's WorkloadCluster report is written by the replica that owns it: the fleet
    // view shows all four, from both replicas.
    let reporters = poll_until(Duration::from_secs(60), || async {
        let v = operator::commands::fleet::gather(&mgmt, Some(ns)).await.unwrap();
        let mut by: Vec<String> = v.clusters.iter().filter_map(|c| c.reported_by.clone()).collect();
        by.sort();
        by.dedup();
        v.clusters.len() == 4
            && v.clusters.iter().all(|c| c.reachability == "Connected" && c.pools.len() == 1 && c.pools[0].fleet)
            && by == names
    })
    .await;
    assert!(
        reporters,
        "four reports, each by its owner; last view: {:#?}",
        operator::commands::fleet::gather(&mgmt, Some(ns)).await.unwrap()
    );
    // The rollout's status, by the namespace writer: the four clusters, Done (no node to replace).
    let p = pools.get("default").await.unwrap();
    let rollout = p.status.as_ref().and_then(|s| s.rollout.clone()).expect("status.rollout");
    assert_eq!(rollout.revision, crds::drift::nodepool_hash(&p.spec));
    let phases: Vec<(String, crds::nodepool::RolloutPhase)> =
        rollout.clusters.iter().map(|c| (c.name.clone(), c.phase)).collect();
    assert_eq!(phases.len(), 4, "{phases:?}");
    assert!(phases.iter().all(|(_, phase)| *phase == crds::nodepool::RolloutPhase::Done), "{phases:?}");
    // The command itself, as a user runs it against this management cluster.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
        .args(["fleet", "-n", ns, "-o", "json", "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["apiVersion"], operator::commands::fleet::JSON_VERSION);
    let listed = view["clusters"].as_array().unwrap();
    assert_eq!(listed.len(), 4, "{view:#}");
    assert!(listed.iter().all(|r| r["reachability"] == "Connected" && r["rollouts"][0]["phase"] == "Done"), "{view:#}");

    // A cluster leaves: its row goes.
    relabel("w-3".into(), "dev").await;
    wait_for("w-3's row gone", Duration::from_secs(30), || async {
        let p = pools.get("default").await.unwrap();
        rows(&p) == ["w-0", "w-1", "w-2"]
            && p.status.as_ref().and_then(|s| s.clusters_ready.as_deref()).is_some_and(|r| r.ends_with("/3"))
    })
    .await;

    // One replica killed: the survivor holds every cluster; a cluster leaving now loses its row
    // whoever wrote it.
    replicas[0].kill();
    wait_for("the survivor owns the four clusters", Duration::from_secs(30), || async { replicas[1].owned() == 4 })
        .await;
    relabel("w-0".into(), "dev").await;
    relabel("w-1".into(), "dev").await;
    wait_for("w-0's and w-1's rows gone", Duration::from_secs(30), || async {
        let p = pools.get("default").await.unwrap();
        rows(&p) == ["w-2"]
            && p.status.as_ref().and_then(|s| s.clusters_ready.as_deref()).is_some_and(|r| r.ends_with("/1"))
    })
    .await;
    for r in replicas.drain(..) {
        r.stop().await;
    }
    let _ = Api::<Namespace>::all(mgmt.clone()).delete(ns, &Default::default()).await;
    for s in workloads {
        s.shutdown().await;
    }
}

/// The typo case (fleet.md §2): a selector edited into matching nothing makes every cluster leave at
/// once; with the default budget and no other pool serving the clusters, their nodes are drifted
/// but none is removed (their pods fit nowhere else), the pool says `NoClusterSelected`, and fixing
/// the selector clears the drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_typo_drifts_the_fleet_s_nodes_but_removes_none_and_fixing_it_clears_the_drift() {
    let clusters = [("team-a", "paris"), ("team-a", "lyon")];
    let mut world = World::start(&clusters, |i| quick_cke(i as u64)).await.unwrap();
    for (ns, name) in &clusters {
        label(&world, ns, name, json!({"env": "prod"})).await;
    }
    apply_fleet_pool(&world, "team-a", |_| {}).await;
    world.start_hub();
    for i in 0..2 {
        scale(&world, i, 2, "500m", "512Mi").await.unwrap();
    }
    wait_for("every pod running on the fleet pool's nodes", Duration::from_secs(60), || async {
        common::running(&world, 0).await == 2 && common::running(&world, 1).await == 2
    })
    .await;
    let before: Vec<String> = claims(&world, "team-a").await.into_iter().filter_map(|c| c.metadata.name).collect();

    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    let typo = json!({"spec": {"clusterSelector": {"matchLabels": {"env": "prdo"}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&typo)).await.unwrap();
    wait_for(
        "every node drifted ClusterNotSelected, the pool saying NoClusterSelected",
        Duration::from_secs(30),
        || async {
            let all = claims(&world, "team-a").await;
            all.len() == before.len()
                && all.iter().all(|c| drifted(c).as_deref() == Some("ClusterNotSelected"))
                && condition(&pool(&world, "team-a").await, "ClustersReady").is_some_and(|c| c.1 == "NoClusterSelected")
        },
    )
    .await;
    // Several disruption passes (one every few seconds): no node removed, every pod still running.
    assert!(
        !poll_until(Duration::from_secs(12), || async {
            claims(&world, "team-a").await.iter().any(|c| c.metadata.deletion_timestamp.is_some())
        })
        .await,
        "a typo drains nothing when no other pool serves the clusters"
    );
    let after: Vec<String> = claims(&world, "team-a").await.into_iter().filter_map(|c| c.metadata.name).collect();
    assert_eq!(after, before);
    assert_eq!((common::running(&world, 0).await, common::running(&world, 1).await), (2, 2));

    let fixed = json!({"spec": {"clusterSelector": {"matchLabels": {"env": "prod"}}}});
    pools.patch("default", &PatchParams::default(), &Patch::Merge(&fixed)).await.unwrap();
    wait_for("the drift cleared and the pool Ready again", Duration::from_secs(30), || async {
        claims(&world, "team-a").await.iter().all(|c| drifted(c).is_none())
            && condition(&pool(&world, "team-a").await, "Ready").is_some_and(|c| c.0 == "True")
    })
    .await;
    world.stop_hub().await;
}

/// A cluster is busy with a drift command while one of its claims is a candidate of a started
/// command, is being deleted, or is a replacement not initialized yet (a replacement keeps its
/// annotation for life).
fn drift_busy(claims: &[NodeClaim], cluster: &str) -> bool {
    use operator::decisions::disruption_queue::{COMMAND_ANNOTATION, REPLACES_ANNOTATION};
    claims.iter().filter(|c| c.spec.cluster_name == cluster).any(|c| {
        let annotated = |k: &str| c.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(k));
        let initialized = c
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Initialized" && k.status == "True"));
        annotated(COMMAND_ANNOTATION)
            || c.metadata.deletion_timestamp.is_some()
            || (annotated(REPLACES_ANNOTATION) && !initialized)
    })
}

/// fleet.md §3 and §7.3: with `rollout.maxClusters: "1"`, a template change is replaced cluster by
/// cluster, `order` first: at no instant sampled do two clusters replace drifted nodes, and the
/// rollout ends with every cluster Done on the new revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_rolls_out_one_cluster_at_a_time_in_order() {
    use crds::nodepool::RolloutPhase::Done;
    let mut world = rollout_world("2s").await;
    let revision = change_template(&world).await;
    let on_revision = |c: &NodeClaim| {
        c.metadata.annotations.as_ref().and_then(|a| a.get(crds::drift::NODEPOOL_HASH_ANNOTATION)) == Some(&revision)
    };
    let mut first_busy: Vec<(String, std::time::Instant)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    loop {
        let all = claims(&world, "team-a").await;
        let busy: Vec<&str> = ["lyon", "paris"].into_iter().filter(|c| drift_busy(&all, c)).collect();
        assert!(busy.len() <= 1, "two clusters replacing drifted nodes at once: {busy:?}");
        for c in busy {
            if !first_busy.iter().any(|(n, _)| n == c) {
                first_busy.push((c.to_string(), std::time::Instant::now()));
            }
        }
        let p = pool(&world, "team-a").await;
        let done = all.len() == 2
            && all.iter().all(|c| on_revision(c) && c.metadata.deletion_timestamp.is_none())
            && p.status.as_ref().and_then(|s| s.rollout.as_ref()).is_some_and(|r| r.revision == revision)
            && rollout_phases(&p).iter().all(|phase| *phase == Done);
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rollout not finished: phases {:?}, claims {:?}",
            rollout_phases(&p),
            all.iter()
                .map(|c| (c.spec.cluster_name.clone(), on_revision(c), c.metadata.deletion_timestamp.is_some()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let order: Vec<&str> = first_busy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(order, ["paris", "lyon"], "order first, then by name, one after the other");
    // The dashboard's rollout series follow the status: each cluster Done, no other phase left.
    let rollout_series = || -> Vec<String> {
        let mut s: Vec<String> = world
            .metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("karpenter_hub_nodepool_rollout_phase{"))
            .map(str::to_string)
            .collect();
        s.sort();
        s
    };
    let done = poll_until(Duration::from_secs(10), || async {
        rollout_series().iter().all(|l| l.contains("phase=\"Done\"")) && rollout_series().len() == 2
    })
    .await;
    assert!(done, "one series per cluster, Done: {:?}", rollout_series());
    // Each cluster's row says the revision its nodes run.
    let on_revision = poll_until(Duration::from_secs(10), || async {
        let p = pool(&world, "team-a").await;
        let rows = p.status.map(|s| s.clusters).unwrap_or_default();
        rows.len() == 2 && rows.iter().all(|r| r.revisions == [revision.clone()])
    })
    .await;
    assert!(on_revision, "rows' revisions: {:?}", pool(&world, "team-a").await.status.map(|s| s.clusters));
    world.stop_hub().await;
}

/// The halt: with `maxClusters: "1"`, paris's replacement is refused by CKE (its organisation
/// has room for the control plane and one worker), so its drift command is rolled back; that fails
/// paris and halts the rollout (`RolloutHalted`, a `RolloutFailed` event naming the cluster), and
/// lyon, waiting its turn, is untouched: still Pending, its node the same, on the old revision.
/// Fails without the record the rolled-back command leaves for the rollout (paris would stay
/// Progressing, retrying for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_cke_refuses_fails_its_cluster_and_halts_the_rollout_leaving_the_others_untouched() {
    use crds::nodepool::RolloutPhase::*;
    use k8s_openapi::api::events::v1::Event;
    let mut world = rollout_world_with("2s", |i| {
        let mut cke = quick_cke(i as u64);
        if i == 1 {
            // The control plane (16 vCPU, 24 GB) and one node of at most 6 vCPU and 8 GB.
            cke.quota.limit = sim::cke::Usage { vcpu: 22, ram_gb: 32 };
        }
        cke
    })
    .await;
    let lyon_before: Vec<String> = claims(&world, "team-a")
        .await
        .iter()
        .filter(|c| c.spec.cluster_name == "lyon")
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(lyon_before.len(), 1);
    change_template(&world).await;
    let halted = poll_until(Duration::from_secs(120), || async {
        let p = pool(&world, "team-a").await;
        rollout_phases(&p) == [Pending, Failed] && condition(&p, "RolloutHalted").is_some_and(|c| c.0 == "True")
    })
    .await;
    let p = pool(&world, "team-a").await;
    assert!(halted, "paris failed, the rollout halted: {:#?}", p.status);
    let failed = p.status.as_ref().and_then(|s| s.rollout.as_ref()).map(|r| r.clusters[1].clone()).unwrap();
    let message = failed.message.unwrap_or_default();
    assert!(message.contains("was rolled back") && message.contains("replacement"), "{message}");
    let halted_condition = condition(&p, "RolloutHalted").unwrap().2;
    assert!(halted_condition.contains("cluster paris failed"), "{halted_condition}");
    let events = Api::<Event>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("RolloutFailed")
            && e.note.as_deref().is_some_and(|n| n.contains("cluster paris"))),
        "a RolloutFailed event names paris"
    );
    // Over a while, lyon does not start, and keeps its node on the old revision.
    let touched = poll_until(Duration::from_secs(10), || async {
        let all = claims(&world, "team-a").await;
        let lyon: Vec<String> = all
            .iter()
            .filter(|c| c.spec.cluster_name == "lyon")
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        lyon != lyon_before || drift_busy(&all, "lyon") || rollout_phases(&pool(&world, "team-a").await)[0] != Pending
    })
    .await;
    assert!(!touched, "a halted rollout starts no other cluster (fleet.md §7.4)");
    world.stop_hub().await;
}

/// fleet.md §7.4: a hub killed as SIGKILL would (every task dropped where it is, nothing released)
/// while clusters are in each phase of a rollout — Pending, Progressing, Soaking, Done — and
/// started again neither repeats nor skips a cluster: one at a time, paris then lyon, each node
/// replaced once ([`RolloutWatch`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_killed_in_each_phase_of_a_rollout_neither_repeats_nor_skips() {
    use crds::nodepool::RolloutPhase::*;
    let mut world = rollout_world("5s").await;
    let revision = change_template(&world).await;
    let mut watch = RolloutWatch::new(revision, Duration::from_secs(240));
    // The states a rollout of two clusters goes through; a kill in each.
    let mut states =
        vec![vec![Pending, Progressing], vec![Pending, Soaking], vec![Progressing, Done], vec![Soaking, Done]];
    let mut killed_in: Vec<Vec<crds::nodepool::RolloutPhase>> = Vec::new();
    loop {
        let (phases, done) = watch.sample(&world).await;
        if done {
            break;
        }
        if let Some(i) = states.iter().position(|s| *s == phases) {
            states.remove(i);
            world.crash_hub().await;
            world.start_hub();
            killed_in.push(phases);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.finish();
    let phases_killed_in: std::collections::BTreeSet<String> =
        killed_in.iter().flatten().map(|p| format!("{p:?}")).collect();
    assert_eq!(
        phases_killed_in.into_iter().collect::<Vec<_>>(),
        ["Done", "Pending", "Progressing", "Soaking"],
        "a kill while clusters were in every phase; killed in {killed_in:?}"
    );
    world.stop_hub().await;
}

/// Sharded mode (hub.md §6) with two replicas owning one cluster each of one fleet pool: the
/// rollout, advanced by the replica holding the leader Lease and gated by each cluster's owner
/// reading the pool's status, goes one cluster at a time in order, each node replaced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_owning_a_fleet_s_clusters_roll_it_out_one_cluster_at_a_time() {
    use crate::sharding::{Replica, ensure_lease_namespace, splitting};
    let world = rollout_setup("3s", |i| quick_cke(i as u64)).await;
    ensure_lease_namespace(&world.mgmt.client()).await;
    // Buckets that place lyon and paris on different replicas.
    let keys: Vec<String> = world.clusters.iter().map(|c| format!("{}/{}", c.namespace, c.name)).collect();
    let buckets = splitting(&keys, 2);
    let start = |id: &str| {
        let (hub, registry) = (world.hub_settings.clone(), world.registry_settings.clone());
        Replica::start_in(id, world.mgmt.client_config(), hub, registry, buckets)
    };
    let replicas = vec![start("rollout-0"), start("rollout-1")];
    wait_for("each replica owns one cluster", Duration::from_secs(60), || async {
        replicas.iter().all(|r| r.owned() == 1)
    })
    .await;
    first_revision_done(&world).await;
    let revision = change_template(&world).await;
    let mut watch = RolloutWatch::new(revision, Duration::from_secs(180));
    while !watch.sample(&world).await.1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.finish();
    assert!(replicas.iter().all(|r| r.owned() == 1), "ownership stayed split");
    for r in replicas {
        r.stop().await;
    }
    world.shutdown().await;
}

/// fleet.md §7.4: the rollout's only memory is the pool's status, so a hub restarted while a cluster
/// soaks resumes it there: the soaking cluster keeps its phase and its start time and replaces
/// nothing again, and the next cluster starts only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restarted_mid_rollout_resumes_it_neither_repeating_nor_skipping() {
    use crds::nodepool::RolloutPhase::*;
    let mut world = rollout_world("20s").await;
    let rollout = |p: &NodePool| p.status.as_ref().and_then(|s| s.rollout.clone());
    change_template(&world).await;
    // lyon Pending, paris (first by order) soaking after its replacement.
    wait_for("paris soaking, lyon waiting", Duration::from_secs(90), || async {
        rollout_phases(&pool(&world, "team-a").await) == [Pending, Soaking]
    })
    .await;
    let before = rollout(&pool(&world, "team-a").await).unwrap();
    let paris_claims = |all: &[NodeClaim]| -> Vec<String> {
        // Those staying: the replaced one may still be terminating when the soak starts.
        let mut names: Vec<String> = all
            .iter()
            .filter(|c| c.spec.cluster_name == "paris" && c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    let paris_before = paris_claims(&claims(&world, "team-a").await);

    world.stop_hub().await;
    world.start_hub();
    // The restarted hub keeps paris soaking from the same instant and lyon waiting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = rollout(&pool(&world, "team-a").await).unwrap();
    assert_eq!(after.revision, before.revision);
    assert_eq!(after.clusters[0].phase, Pending, "lyon skipped ahead: {after:?}");
    let (was, is) = (&before.clusters[1], &after.clusters[1]);
    assert!(
        is.phase == Done || (is.phase == Soaking && is.since == was.since),
        "paris's soak restarted or reverted: {was:?} → {is:?}"
    );
    wait_for("lyon's turn, then both Done", Duration::from_secs(120), || async {
        rollout_phases(&pool(&world, "team-a").await) == [Done, Done]
    })
    .await;
    assert_eq!(paris_claims(&claims(&world, "team-a").await), paris_before, "paris replaced nothing again");
    world.stop_hub().await;
}
