//! The hub end to end on the simulated world: a management emulator, workload emulators played by
//! the simulated CKE, clusters registered through kubeconfig Secrets, the real hub running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, time::Duration};

use crds::{NodeClaim, NodeGroup, NodePool};
use kube::{Api, ResourceExt, api::ListParams};
use operator::commands::sandbox::world::{World, quick_cke, scale};

mod claim_names;
use crate::common;
mod hub_id;
mod ownership;
mod wakeups;
use common::{apply_example, running, wait_for, wait_quiet, wait_reachable, writes};

/// How long writes must have stopped to call the world quiet where the hub's work shows no count.
const QUIET: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clusters_get_the_cheapest_fitting_nodes_and_one_nodegroup_per_claim() {
    let mut world =
        World::start(&[("team-a", "alpha"), ("team-b", "beta"), ("team-c", "gamma")], |i| quick_cke(i as u64))
            .await
            .unwrap();
    for i in 0..3 {
        apply_example(&world, i).await;
    }
    world.start_hub();
    // alpha: 4 × (1 CPU, 1Gi) fit one XS (4Gi > a 2XS's 3.63Gi); beta: one 5Gi pod also needs an XS;
    // gamma: one small pod fits a 2XS.
    scale(&world, 0, 4, "1", "1Gi").await.unwrap();
    scale(&world, 1, 1, "500m", "5Gi").await.unwrap();
    scale(&world, 2, 1, "500m", "1Gi").await.unwrap();
    for (i, want) in [(0, 4), (1, 1), (2, 1)] {
        wait_for("pods running", Duration::from_secs(60), || async { running(&world, i).await == want }).await;
    }
    for (i, flavor) in [(0, "XS"), (1, "XS"), (2, "2XS")] {
        let c = &world.clusters[i];
        let groups = Api::<NodeGroup>::all(c.client()).list(&ListParams::default()).await.unwrap().items;
        let claims: Vec<NodeClaim> = Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        assert_eq!(groups.len(), 1, "{}: exactly one NodeGroup, nothing else created", c.name);
        assert_eq!(claims.len(), 1, "{}: exactly one NodeClaim", c.name);
        assert_eq!(groups[0].spec.flavor, flavor, "{}", c.name);
        assert_eq!(groups[0].spec.node_count, 1);
        let provider = claims[0].status.as_ref().and_then(|s| s.provider_id.clone()).unwrap();
        assert_eq!(provider, format!("clevercloud://{}", groups[0].name_any()));
        let labels = groups[0].labels();
        assert_eq!(labels.get("karpenter.clever-cloud.com/nodeclaim"), Some(&claims[0].name_any()));
        assert_eq!(labels.get("karpenter.clever-cloud.com/nodeclaim-namespace"), Some(&c.namespace));
        // The pool's conditions: valid, its class Ready, its cluster reachable, its launches registering.
        let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), &c.namespace);
        wait_for("NodeRegistrationHealthy=True", Duration::from_secs(20), || async {
            pools.get("default").await.ok().and_then(|p| p.status).is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "NodeRegistrationHealthy" && c.status == "True")
            })
        })
        .await;
        let claim_api: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), &c.namespace);
        let claim_name = claims[0].name_any();
        wait_for("ConsistentStateFound=True", Duration::from_secs(20), || async {
            claim_api
                .get(&claim_name)
                .await
                .ok()
                .and_then(|c| c.status)
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ConsistentStateFound" && c.status == "True"))
        })
        .await;
        let status = pools.get("default").await.unwrap().status.unwrap();
        for t in ["ValidationSucceeded", "NodeClassReady", "ClusterReachable", "Ready"] {
            let cond = status.conditions.iter().find(|c| c.type_ == t).unwrap_or_else(|| panic!("no {t}"));
            assert_eq!(cond.status, "True", "{t}: {}", cond.message);
        }
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_an_exec_plugin_is_refused_and_reported_on_the_nodepool() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    let hostile = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [-c, 'touch /tmp/pwned']\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        world.clusters[0].server.url()
    );
    world.put_secret("team-a", "alpha", hostile.as_bytes()).await.unwrap();
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    let pools: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-a");
    wait_reachable(&world.mgmt.client(), "team-a", "False", "InvalidKubeconfig", Duration::from_secs(30)).await;
    let pool = pools.get("default").await.unwrap();
    let cond = pool.status.unwrap().conditions.into_iter().find(|c| c.type_ == "ClusterReachable").unwrap();
    assert!(cond.message.contains("exec"), "{}", cond.message);
    assert!(!std::path::Path::new("/tmp/pwned").exists(), "the plugin must never run");
    // Nothing is provisioned for a cluster the hub cannot trust.
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert!(groups.items.is_empty());
    // Fixing the Secret connects the cluster and provisioning proceeds.
    world.register(0).await.unwrap();
    wait_for("pod running after the fix", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_launch_leaves_no_duplicate_and_no_leak() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 3, "1", "1Gi").await.unwrap();
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    wait_for("a NodeGroup", Duration::from_secs(30), || async {
        groups.list(&ListParams::default()).await.is_ok_and(|l| !l.items.is_empty())
    })
    .await;
    world.crash_hub().await;
    world.start_hub();
    wait_for("pods running after the restart", Duration::from_secs(60), || async { running(&world, 0).await == 3 })
        .await;
    let groups = groups.list(&ListParams::default()).await.unwrap().items;
    let claims =
        Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap().items;
    let claim_names: BTreeSet<String> = claims.iter().map(ResourceExt::name_any).collect();
    assert_eq!(groups.len(), claims.len(), "one NodeGroup per NodeClaim");
    for g in &groups {
        let owner = g.labels().get("karpenter.clever-cloud.com/nodeclaim").cloned().unwrap_or_default();
        assert!(claim_names.contains(&owner), "NodeGroup {} has no NodeClaim (leak)", g.name_any());
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_kubeconfig_secret_stops_the_cluster_but_deletes_nothing() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    let deletes = || {
        (
            world.mgmt.requests().count("delete", "nodeclaims"),
            world.clusters[0].server.requests().count("delete", "nodegroups"),
        )
    };
    let before = deletes();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(world.mgmt.client(), "team-a");
    secrets.delete("alpha-kubeconfig", &Default::default()).await.unwrap();
    wait_reachable(&world.mgmt.client(), "team-a", "False", "SecretMissing", Duration::from_secs(30)).await;
    // No mass deletion because a Secret vanished: the claim and its NodeGroup stay. Quiet here: no
    // write to NodeClaims (management) or NodeGroups (workload) for 2 s after the hub reported the
    // Secret missing (it has dropped the cluster by then; nothing it does is pending a count).
    wait_quiet("NodeClaim and NodeGroup writes after the Secret went", Duration::from_secs(30), QUIET, || async {
        (writes(&world.mgmt, &["nodeclaims"]), writes(&world.clusters[0].server, &["nodegroups"]))
    })
    .await;
    assert_eq!(deletes(), before, "deletes of (NodeClaims, NodeGroups) after the Secret went");
    let claims =
        Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-a").list(&ListParams::default()).await.unwrap();
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert_eq!(claims.items.len(), 1);
    assert!(claims.items[0].metadata.deletion_timestamp.is_none());
    assert_eq!(groups.items.len(), 1);
    assert!(groups.items[0].metadata.deletion_timestamp.is_none());
    world.shutdown().await;
}

/// Events of the management cluster about an object of `kind` named `name` in `ns`, as
/// (reason, note) pairs.
async fn events_about(world: &World, ns: &str, kind: &str, name: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(world.mgmt.client(), ns);
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| {
                    e.regarding
                        .as_ref()
                        .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
                })
                .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodegroup_that_vanishes_before_registration_is_replaced_within_seconds_by_another_flavor() {
    use sim::cke::config::{GroupSelector, VanishRule};
    // Every accepted group vanishes 300 ms after acceptance, long before its node joins (1.5-3 s).
    let mut world = World::start(&[("team-a", "alpha")], |i| {
        let mut c = quick_cke(i as u64);
        c.vanish =
            vec![VanishRule { selector: GroupSelector::All, probability: 1.0, after: Duration::from_millis(300) }];
        c
    })
    .await
    .unwrap();
    // A short creation back-off so the replacement follows at once; the cool-down stays 3 min.
    world.hub_settings.capacity.backoff = Duration::from_millis(500);
    world.hub_settings.capacity.max_backoff = Duration::from_secs(1);
    apply_example(&world, 0).await;
    world.start_hub();
    // 5Gi does not fit a 2XS: the first choice is an XS.
    scale(&world, 0, 1, "1", "5Gi").await.unwrap();
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let xs = |c: &NodeClaim| c.labels().get("node.kubernetes.io/instance-type").map(String::as_str) == Some("XS");
    wait_for("a launched XS claim", Duration::from_secs(30), || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| l.items.iter().any(xs))
    })
    .await;
    let first_claim = claims.list(&ListParams::default()).await.unwrap().items.into_iter().find(xs).unwrap();
    let (first, first_uid) = (first_claim.name_any(), first_claim.uid());
    // Detected by the lifecycle within seconds (the GC sweep's period is 2 min).
    let started = tokio::time::Instant::now();
    wait_for("the vanished claim gone", Duration::from_secs(15), || async {
        claims.get_opt(&first).await.is_ok_and(|c| c.is_none_or(|c| c.uid() != first_uid))
    })
    .await;
    let detected = started.elapsed();
    assert!(detected < Duration::from_secs(15), "{detected:?}");
    wait_for("NodeGroupVanished event", Duration::from_secs(10), || async {
        events_about(&world, "team-a", "NodeClaim", &first).await.iter().any(|(r, _)| r == "NodeGroupVanished")
    })
    .await;
    // The replacement avoids the flavor cooling down.
    wait_for("a replacement claim with another flavor", Duration::from_secs(30), || async {
        claims.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|c| {
                c.uid() != first_uid && c.labels().get("node.kubernetes.io/instance-type").is_some_and(|f| f != "XS")
            })
        })
    })
    .await;
    let text = world.metrics.render();
    let vanished = text
        .lines()
        .find(|l| l.starts_with("karpenter_hub_nodegroup_vanished_total{cluster=\"team-a/alpha\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_default();
    assert!(vanished >= 1.0, "{text}");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_state_changes_show_as_events_on_the_secret_and_the_nodepool_and_as_metrics() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    wait_for("Connected event on the Secret", Duration::from_secs(30), || async {
        events_about(&world, "team-a", "Secret", "alpha-kubeconfig").await.iter().any(|(r, _)| r == "Connected")
    })
    .await;
    wait_for("Connected event on the NodePool", Duration::from_secs(30), || async {
        events_about(&world, "team-a", "NodePool", "default").await.iter().any(|(r, _)| r == "Connected")
    })
    .await;
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    // The cluster goes dark: the Secret and the pool say why.
    world.clusters[0].server.faults().set_unreachable(true);
    wait_for("Unreachable event on the Secret", Duration::from_secs(30), || async {
        events_about(&world, "team-a", "Secret", "alpha-kubeconfig").await.iter().any(|(r, _)| r == "Unreachable")
    })
    .await;
    wait_for("Unreachable event on the NodePool", Duration::from_secs(30), || async {
        events_about(&world, "team-a", "NodePool", "default").await.iter().any(|(r, _)| r == "Unreachable")
    })
    .await;
    let text = world.metrics.render();
    for want in [
        "karpenter_hub_cluster_connected{cluster=\"team-a/alpha\"} 0",
        "karpenter_hub_cluster_phase{cluster=\"team-a/alpha\",phase=\"Unreachable\"} 1",
        "karpenter_nodeclaims_created_total{cluster=\"team-a/alpha\",nodepool=\"default\",reason=\"provisioning\",min_values_relaxed=\"false\"} 1",
        "karpenter_nodes_created_total{cluster=\"team-a/alpha\",nodepool=\"default\"} 1",
        "karpenter_hub_nodegroup_quota_rejections_total{cluster=\"team-a/alpha\"} 0",
        "karpenter_cloudprovider_duration_seconds_count{cluster=\"team-a/alpha\",method=\"create\"} 1",
    ] {
        assert!(text.contains(want), "missing {want} in:\n{text}");
    }
    for want in [
        "karpenter_hub_cluster_probes_total{cluster=\"team-a/alpha\",result=\"ok\"}",
        "karpenter_hub_cluster_probes_total{cluster=\"team-a/alpha\",result=\"failed\"}",
    ] {
        assert!(text.contains(want), "missing {want} in:\n{text}");
    }
    world.clusters[0].server.faults().set_unreachable(false);
    wait_for("connected again", Duration::from_secs(30), || async {
        world.metrics.render().contains("karpenter_hub_cluster_connected{cluster=\"team-a/alpha\"} 1")
    })
    .await;
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dangling_catalogue_reference_serves_the_built_ins_and_says_so_until_the_catalogue_exists() {
    use crds::{CleverNodeClass, FlavorCatalog};
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let name = world.clusters[0].name.clone();
    world
        .apply_yaml("general-purpose.yaml", common::EXAMPLE, "team-a", |doc| {
            match doc.get("kind").and_then(serde_json::Value::as_str) {
                Some("NodePool") => doc["spec"]["clusterName"] = serde_json::Value::String(name.clone()),
                Some("CleverNodeClass") => doc["spec"]["flavorCatalogRef"] = serde_json::json!({"name": "prices"}),
                _ => {}
            }
        })
        .await
        .unwrap();
    world.start_hub();
    let classes: Api<CleverNodeClass> = Api::namespaced(world.mgmt.client(), "team-a");
    let condition = |c: &CleverNodeClass, t: &str| {
        c.status.as_ref().and_then(|s| s.conditions.iter().find(|x| x.type_ == t).cloned())
    };
    wait_for("FlavorCatalogResolved=False", Duration::from_secs(30), || async {
        classes.get("default").await.ok().and_then(|c| condition(&c, "FlavorCatalogResolved")).is_some_and(|c| {
            c.status == "False" && c.reason == "FlavorCatalogNotFound" && c.message.contains("built-in")
        })
    })
    .await;
    // Informational: the class stays Ready and nodes are provisioned from the built-in catalogue.
    let class = classes.get("default").await.unwrap();
    assert_eq!(condition(&class, "Ready").unwrap().status, "True");
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    // The catalogue arrives: it is Ready with its flavor count and the class resolves it.
    let fc: FlavorCatalog = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
        "metadata": {"name": "prices", "namespace": "team-a"},
        "spec": {"flavors": [{"name": "M", "priceHourly": 0.12}]}
    }))
    .unwrap();
    let catalogs: Api<FlavorCatalog> = Api::namespaced(world.mgmt.client(), "team-a");
    catalogs.create(&Default::default(), &fc).await.unwrap();
    wait_for("FlavorCatalog Ready with 6 flavors", Duration::from_secs(30), || async {
        catalogs.get("prices").await.ok().and_then(|c| c.status).is_some_and(|s| {
            s.flavor_count == Some(6) && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    wait_for("FlavorCatalogResolved=True", Duration::from_secs(30), || async {
        classes
            .get("default")
            .await
            .ok()
            .and_then(|c| condition(&c, "FlavorCatalogResolved"))
            .is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(
        world
            .metrics
            .render()
            .contains("karpenter_hub_instancetype_flavors_config_invalid{flavorcatalog=\"team-a/prices\"} 0")
    );
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_scoped_to_one_namespace_leaves_the_others_alone() {
    let mut world = World::start(&[("team-a", "alpha"), ("team-b", "beta")], |i| quick_cke(i as u64)).await.unwrap();
    world.hub_settings.namespace = Some("team-a".into());
    world.registry_settings.namespace = Some("team-a".into());
    apply_example(&world, 0).await;
    apply_example(&world, 1).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    scale(&world, 1, 1, "500m", "1Gi").await.unwrap();
    wait_for("team-a's pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    let pools_b: Api<NodePool> = Api::namespaced(world.mgmt.client(), "team-b");
    let pool_b = pools_b.get("default").await.unwrap();
    assert!(pool_b.status.is_none_or(|s| s.conditions.is_empty()), "another namespace's pool is never written");
    let classes_b: Api<crds::CleverNodeClass> = Api::namespaced(world.mgmt.client(), "team-b");
    assert!(classes_b.get("default").await.unwrap().status.is_none_or(|s| s.conditions.is_empty()));
    let claims_b =
        Api::<NodeClaim>::namespaced(world.mgmt.client(), "team-b").list(&ListParams::default()).await.unwrap();
    assert!(claims_b.items.is_empty());
    assert_eq!(running(&world, 1).await, 0);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_node_deletes_its_claim_and_nodegroup_and_nothing_hangs() {
    use k8s_openapi::api::core::v1::Node;
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 1, "500m", "1Gi").await.unwrap();
    wait_for("pod running", Duration::from_secs(60), || async { running(&world, 0).await == 1 }).await;
    let claims: Api<NodeClaim> = Api::namespaced(world.mgmt.client(), "team-a");
    let claim = claims.list(&ListParams::default()).await.unwrap().items.remove(0);
    let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let nodes: Api<Node> = Api::all(world.clusters[0].client());
    let groups: Api<NodeGroup> = Api::all(world.clusters[0].client());
    nodes.delete(&node_name, &Default::default()).await.unwrap();
    wait_for("claim, group and node gone", Duration::from_secs(30), || async {
        let claim_gone = claims.get_opt(&claim.name_any()).await.unwrap().is_none_or(|c| c.uid() != claim.uid());
        let node_gone = nodes.get_opt(&node_name).await.unwrap().is_none();
        let groups_left = groups.list(&ListParams::default()).await.unwrap().items;
        let group_gone = !groups_left
            .iter()
            .any(|g| g.annotations().get("karpenter.clever-cloud.com/nodeclaim-uid") == claim.uid().as_ref());
        claim_gone && node_gone && group_gone
    })
    .await;
    world.shutdown().await;
}
