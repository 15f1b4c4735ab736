//! The organisation's quota across clusters (fleet.md §4, §7 rule 5), on emulated clusters whose
//! simulated CKEs share one organisation quota (control planes included): with a
//! `CleverOrganization` declared, the hub never sends a NodeGroup create the organisation has no
//! room for (counted at the emulator: no refusal), whatever the clusters racing for the last
//! headroom; a wrongly declared quota is corrected by the first refusal, and no second follows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, time::Duration};

use crds::CleverOrganization;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use operator::commands::sandbox::world::{World, quick_cke, scale};
use serde_json::{Value, json};
use sim::cke::{OrganizationQuota, Usage};

use crate::common::{self, poll_until, running};

/// Apply the general-purpose example for cluster `i`, without its pool limits (the organisation
/// is what limits here).
async fn apply_pool(world: &World, i: usize) {
    common::apply_example_with(world, i, |spec| {
        spec.remove("limits");
    })
    .await;
}

async fn declare(world: &World, quota: Value) {
    let org: CleverOrganization = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
        "metadata": {"name": "acme"},
        "spec": {"clusterSelector": {}, "quota": quota}
    }))
    .unwrap();
    Api::<CleverOrganization>::all(world.mgmt.client()).create(&PostParams::default(), &org).await.unwrap();
}

async fn organization(world: &World) -> CleverOrganization {
    Api::<CleverOrganization>::all(world.mgmt.client()).get("acme").await.unwrap()
}

async fn groups(world: &World, i: usize) -> usize {
    Api::<crds::NodeGroup>::all(world.clusters[i].client()).list(&ListParams::default()).await.unwrap().items.len()
}

const CLUSTERS: [(&str, &str); 3] = [("team-a", "paris"), ("team-b", "lyon"), ("team-c", "nice")];

/// Three emulated clusters whose simulated CKEs share the organisation quota `org`.
async fn three_clusters(org: &OrganizationQuota) -> World {
    World::start(&CLUSTERS, |i| {
        let mut c = quick_cke(i as u64);
        c.quota.organization = Some(org.member(CLUSTERS[i].1));
        c
    })
    .await
    .unwrap()
}

/// What a burst over three clusters of one organisation cost at the platform.
#[derive(Debug)]
struct Burst {
    stats: sim::cke::OrgStats,
    /// NodeGroups alive at the end, all clusters.
    groups: usize,
    /// Pods running at the end, all clusters.
    running: usize,
    organization: Option<CleverOrganization>,
}

/// Which hubs serve the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hubs {
    /// One hub (the world's).
    One,
    /// Two replicas in sharded mode, each owning at least one of the clusters.
    TwoSharded,
}

/// Three clusters of one organisation (64 vCPU / 96 GB; their control planes take 48 / 72) burst
/// at once, each wanting 8 vCPU of pods while 16 are left; with `declared`, the organisation is
/// declared to the hub. Runs until the hub has launched what fits (or 60 s), then 10 s more.
async fn burst(declared: bool, hubs: Hubs) -> Burst {
    let org = OrganizationQuota::new(Usage { vcpu: 64, ram_gb: 96 });
    let mut world = three_clusters(&org).await;
    for i in 0..CLUSTERS.len() {
        apply_pool(&world, i).await;
    }
    if declared {
        declare(&world, json!({"cpu": "64", "memory": "96G"})).await;
    }
    // Every control plane counts before the burst.
    assert!(poll_until(Duration::from_secs(30), || async { org.members().len() == 3 }).await);
    let mut replicas = Vec::new();
    match hubs {
        Hubs::One => world.start_hub(),
        Hubs::TwoSharded => {
            use crate::sharding::{Replica, ensure_lease_namespace, splitting};
            ensure_lease_namespace(&world.mgmt.client()).await;
            // Buckets that give each replica at least one of the clusters.
            let keys: Vec<String> = world.clusters.iter().map(|c| format!("{}/{}", c.namespace, c.name)).collect();
            let buckets = splitting(&keys, 2);
            for name in ["org-0", "org-1"] {
                replicas.push(Replica::start_in(
                    name,
                    world.mgmt.client_config(),
                    world.hub_settings.clone(),
                    world.registry_settings.clone(),
                    buckets,
                ));
            }
            let owned = poll_until(Duration::from_secs(60), || async {
                replicas.iter().all(|r| r.owned() >= 1) && replicas.iter().map(|r| r.owned()).sum::<usize>() == 3
            })
            .await;
            assert!(owned, "the replicas share the clusters");
        }
    }
    // A 2XS holds three 1-vCPU pods: 24 vCPU wanted, 16 left.
    for i in 0..CLUSTERS.len() {
        scale(&world, i, 8, "1", "512Mi").await.unwrap();
    }
    let running_all = || async {
        let mut n = 0;
        for i in 0..3 {
            n += running(&world, i).await;
        }
        n
    };
    poll_until(Duration::from_secs(60), || async { org.usage().vcpu >= 62 && running_all().await >= 9 }).await;
    // A while longer: whatever the hub does next, the platform counts it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut groups_left = 0;
    for i in 0..3 {
        groups_left += groups(&world, i).await;
    }
    let out = Burst {
        stats: org.stats(),
        groups: groups_left,
        running: running_all().await,
        organization: Api::<CleverOrganization>::all(world.mgmt.client()).get_opt("acme").await.unwrap(),
    };
    println!("burst over 3 clusters, organisation declared: {declared}, hubs: {hubs:?}: {out:?}");
    for r in replicas {
        r.stop().await;
    }
    world.shutdown().await;
    out
}

/// With the organisation declared, the burst spends the headroom and sends no create the platform
/// refuses (fleet.md §7 rule 5: three clusters' rounds race for the last headroom).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_three_clusters_sends_no_create_over_the_organisation_quota() {
    let b = burst(true, Hubs::One).await;
    assert_eq!(b.stats.refusals, 0, "no create was sent over the quota: {b:?}");
    assert!(b.stats.peak.vcpu <= 64 && b.stats.peak.ram_gb <= 96, "{b:?}");
    assert!(b.groups <= 4 && b.running >= 9, "16 vCPU hold at most four nodes, and they are used: {b:?}");
    // The ledger says who uses what: every cluster's control plane and nodes.
    let status = b.organization.and_then(|o| o.status).unwrap();
    assert_eq!(status.cluster_count, 3);
    assert_eq!(status.quota.as_ref().and_then(|q| q.cpu.as_deref()), Some("64"));
    assert!(status.used.as_ref().and_then(|u| u.cpu.as_deref()).is_some_and(|c| c == "64" || c == "62"), "{status:?}");
    for c in &status.clusters {
        assert!(c.nodes >= 2 && c.cpu_millis >= 16_000, "{c:?}");
    }
}

/// The same burst without the organisation declared: the clusters learn the quota by being refused
/// (what the test above is measured against; it also proves that burst does race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_organisation_the_same_burst_is_refused() {
    let b = burst(false, Hubs::One).await;
    assert!(b.stats.refusals > 0, "the clusters race for the same headroom: {b:?}");
    assert!(b.organization.is_none());
}

/// The same burst served by two sharded replicas, each owning some of the clusters: their
/// launches race for the organisation's last room through the ledger's conditional writes, and
/// none is sent over the quota (fleet.md §7 rule 5, several replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sharded_replicas_never_spend_the_same_headroom() {
    let b = burst(true, Hubs::TwoSharded).await;
    assert_eq!(b.stats.refusals, 0, "no create was sent over the quota: {b:?}");
    assert!(b.stats.peak.vcpu <= 64 && b.stats.peak.ram_gb <= 96, "{b:?}");
    assert!(b.groups <= 4 && b.running >= 9, "16 vCPU hold at most four nodes, and they are used: {b:?}");
    let status = b.organization.and_then(|o| o.status).unwrap();
    let replicas: BTreeSet<&str> = status.clusters.iter().filter_map(|c| c.replica.as_deref()).collect();
    assert_eq!(replicas.len(), 2, "each replica writes the entries of its own clusters: {status:?}");
}

/// A quota declared too high: the platform refuses the launch that crosses the real one, the hub
/// learns it from the refusal's message, and with the creation back-off short no second refusal
/// follows (without the learning, the next launch would be refused too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_teaches_the_quota_and_no_second_refusal_follows() {
    // 24 vCPU: the control plane takes 16, leaving two 2XS.
    let org = OrganizationQuota::new(Usage { vcpu: 24, ram_gb: 100 });
    let mut world = World::start(&[("team-a", "paris")], |i| {
        let mut c = quick_cke(i as u64);
        c.quota.organization = Some(org.member("paris"));
        c
    })
    .await
    .unwrap();
    world.hub_settings.capacity.backoff = Duration::from_millis(500);
    world.hub_settings.capacity.max_backoff = Duration::from_secs(1);
    world.hub_settings.capacity.cooldown = Duration::from_secs(1);
    apply_pool(&world, 0).await;
    declare(&world, json!({"cpu": "100", "memory": "100G"})).await;
    assert!(poll_until(Duration::from_secs(30), || async { org.members().len() == 1 }).await);
    world.start_hub();
    // Pods one per 2XS (3 vCPU each): four wanted, two fit.
    scale(&world, 0, 4, "3", "512Mi").await.unwrap();
    let learned = poll_until(Duration::from_secs(60), || async {
        organization(&world).await.status.and_then(|s| s.observed_quota).and_then(|q| q.cpu).as_deref() == Some("24")
    })
    .await;
    assert!(learned, "the refusal's limit is learned: {:?}, sim {:?}", organization(&world).await.status, org.stats());
    // Long enough for several back-offs and cool-downs: the learned quota holds launches back.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let stats = org.stats();
    assert_eq!(stats.refusals, 1, "one refusal taught the quota: {stats:?}");
    assert_eq!(running(&world, 0).await, 2);
    let o = organization(&world).await;
    assert_eq!(o.status.as_ref().and_then(|s| s.quota.as_ref()).and_then(|q| q.cpu.as_deref()), Some("24"));
    world.shutdown().await;
}

/// What the ledger relies on, on a real kube-apiserver: the CRD is cluster-scoped and established,
/// a status the ledger writes (several clusters keyed by namespace and name, reservations, a
/// waiting mark, a learned quota) is stored as written, and a write carrying a resourceVersion
/// someone else moved past is refused with 409 (the optimistic concurrency that keeps two launches
/// from spending the same headroom), without touching the spec.
#[test]
fn a_ledger_write_on_a_stale_version_is_refused_by_a_real_api_server() {
    use crds::organization::CleverOrganizationStatus;
    use k8s_openapi::{
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition, jiff::Timestamp,
    };
    use operator::decisions::organization::{self as ledger, ClusterId, Counted, Launch, Sizer};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(client) = crate::examples::remote::real_client(&rt) else { return };
    rt.block_on(async {
        let crd: Vec<CustomResourceDefinition> = crds::crd::hub_crds()
            .into_iter()
            .filter(|f| f.crd.spec.names.kind == "CleverOrganization")
            .map(|f| f.crd)
            .collect();
        crate::examples::remote::apply_crds(&client, &crd).await;
        let api: Api<CleverOrganization> = Api::all(client.clone());
        let name = format!("ledger-{}", std::process::id());
        let org: CleverOrganization = serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
            "metadata": {"name": name},
            "spec": {"clusterSelector": {"matchLabels": {"org": "acme"}}, "quota": {"cpu": "48", "memory": "64G"}}
        }))
        .unwrap();
        let created = create_retrying(&api, &org).await;
        // The ledger's own writes, from the decisions the hub makes.
        let now = Timestamp::now();
        let sizer = Sizer::new(&crds::catalog::Catalog::builtin().flavors);
        let paris = ClusterId { namespace: "team-a", name: "paris" };
        let lyon = ClusterId { namespace: "team-b", name: "paris" };
        let counted = Counted {
            nodes: 2,
            unknown: 0,
            usage: ledger::Amount { cpu_millis: 16_000, memory_bytes: 24_000_000_000, price_micros: 0 },
            groups: Default::default(),
        };
        let mut o = created.clone();
        o.status = Some(ledger::record(&o, paris, &counted, "hub-0", now).unwrap());
        o.status = Some(ledger::record(&o, lyon, &counted, "hub-1", now).unwrap());
        let launch =
            Launch { group: "g-1", flavor: "M", pool: "default", size: sizer.of("M").unwrap(), weight: 10, since: now };
        o.status = Some(ledger::reserve(&o, paris, &launch, "hub-0", now).unwrap());
        let refused = ledger::reserve(&o, lyon, &Launch { group: "g-2", ..launch.clone() }, "hub-1", now).unwrap_err();
        o.status = Some(refused.marked);
        o.status =
            Some(ledger::learn(&o, lyon, "Quota exceeded: RAM max: limit = 64.0 GB | actual = 68.0 GB", now).unwrap());
        let written: CleverOrganizationStatus = o.status.clone().unwrap();
        let stored = api.replace_status(&name, &Default::default(), &o).await.unwrap();
        assert_eq!(stored.status.as_ref(), Some(&written), "the ledger is stored as written");
        assert_eq!(stored.spec, created.spec, "a status write leaves the spec alone");
        // A second writer still holding the first version: refused, nothing overwritten.
        let mut stale = created.clone();
        stale.status = Some(CleverOrganizationStatus::default());
        match api.replace_status(&name, &Default::default(), &stale).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
            other => panic!("a stale ledger write must be refused with 409, got {other:?}"),
        }
        assert_eq!(api.get(&name).await.unwrap().status, Some(written));
        api.delete(&name, &Default::default()).await.unwrap();
    });
}

/// A create retried while a freshly established kind is not served yet (404).
pub(crate) async fn create_retrying(api: &Api<CleverOrganization>, org: &CleverOrganization) -> CleverOrganization {
    let mut last = None;
    for _ in 0..200 {
        match api.create(&PostParams::default(), org).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                last = Some(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other.unwrap(),
        }
    }
    panic!("CleverOrganization never served: {last:?}")
}

/// Cluster `i`'s entry in the organisation's ledger is marked waiting.
async fn waits(world: &World, name: &str) -> bool {
    organization(world).await.status.is_some_and(|s| s.clusters.iter().any(|c| c.name == name && c.waiting.is_some()))
}

/// The `WaitingForOrganization` condition of cluster `i`'s pool, if set.
async fn waiting_condition(world: &World, i: usize) -> Option<crds::common::Condition> {
    let c = &world.clusters[i];
    let pool = Api::<crds::NodePool>::namespaced(world.mgmt.client(), &c.namespace).get("default").await.ok()?;
    pool.status?.conditions.into_iter().find(|c| c.type_ == "WaitingForOrganization")
}

/// Deletes cluster `i`'s NodeClaims (as a user would) after its pods are gone, freeing the room its
/// nodes held.
async fn remove_nodes(world: &World, i: usize) {
    scale(world, i, 0, "1", "512Mi").await.unwrap();
    let c = &world.clusters[i];
    let api = Api::<crds::NodeClaim>::namespaced(world.mgmt.client(), &c.namespace);
    for nc in api.list(&ListParams::default()).await.unwrap().items {
        if nc.spec.cluster_name == c.name {
            let _ = api.delete(&nc.metadata.name.unwrap(), &Default::default()).await;
        }
    }
}

/// Three clusters compete for an organisation's room, which frees one node at a time (fleet.md §4,
/// item 4 of the issue): rounds that hold pods back for the room put their cluster in line (the
/// ledger's waiting marks) and the freed room goes by pool weight, then by the oldest pending pod —
/// not to whichever round runs first —, the pools that wait say why, and the platform refuses
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clusters_competing_for_the_room_are_served_by_weight_then_age() {
    // The control planes take 48 vCPU: room for one 2XS (4 vCPU) at a time.
    let org = OrganizationQuota::new(Usage { vcpu: 52, ram_gb: 96 });
    let mut world = three_clusters(&org).await;
    apply_pool(&world, 0).await;
    for (i, weight) in [(1, 10), (2, 50)] {
        common::apply_example_with(&world, i, |spec| {
            spec.remove("limits");
            spec.insert("weight".into(), json!(weight));
        })
        .await;
    }
    declare(&world, json!({"cpu": "52", "memory": "96G"})).await;
    assert!(poll_until(Duration::from_secs(30), || async { org.members().len() == 3 }).await);
    world.start_hub();
    // Paris takes the room: three 1-vCPU pods on one 2XS.
    scale(&world, 0, 3, "1", "512Mi").await.unwrap();
    assert!(poll_until(Duration::from_secs(60), || async { running(&world, 0).await == 3 }).await, "{:?}", org.stats());
    // Lyon's pods (weight 10) wait first, then Nice's (weight 50): both clusters are in line.
    scale(&world, 1, 3, "1", "512Mi").await.unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || waits(&world, "lyon")).await,
        "{:?}",
        organization(&world).await.status
    );
    let condition =
        poll_until(Duration::from_secs(30), || async { waiting_condition(&world, 1).await.is_some() }).await;
    assert!(condition, "lyon's pool says it waits");
    let why = waiting_condition(&world, 1).await.unwrap();
    assert_eq!((why.status.as_str(), why.reason.as_str()), ("True", "HeadroomExhausted"));
    assert!(why.message.contains("organisation acme: 52/52 vCPU"), "{}", why.message);
    assert!(why.message.contains("team-b/lyon waits for 4 vCPU"), "{}", why.message);
    scale(&world, 2, 3, "1", "512Mi").await.unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || waits(&world, "nice")).await,
        "{:?}",
        organization(&world).await.status
    );
    // Paris's node goes: Nice, the higher weight, gets the room though Lyon asked first.
    remove_nodes(&world, 0).await;
    let nice = poll_until(Duration::from_secs(60), || async { running(&world, 2).await == 3 }).await;
    assert!(nice, "nice runs: {:?}, ledger {:?}", org.stats(), organization(&world).await.status);
    assert_eq!(groups(&world, 1).await, 0, "lyon was not launched for: the room went to nice");
    assert!(waits(&world, "lyon").await);
    // Nice's node goes: Lyon's turn.
    remove_nodes(&world, 2).await;
    let lyon = poll_until(Duration::from_secs(60), || async { running(&world, 1).await == 3 }).await;
    assert!(lyon, "lyon runs: {:?}, ledger {:?}", org.stats(), organization(&world).await.status);
    assert!(
        poll_until(Duration::from_secs(30), || async { waiting_condition(&world, 1).await.is_none() }).await,
        "lyon's pool no longer waits"
    );
    let stats = org.stats();
    assert_eq!(stats.refusals, 0, "no create was sent over the quota: {stats:?}");
    assert!(stats.peak.vcpu <= 52, "{stats:?}");
    world.shutdown().await;
}
