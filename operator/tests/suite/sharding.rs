//! Sharded mode (hub.md §6) on the simulated world: workload clusters spread over hub replicas
//! through shard buckets, each bucket owned through a Lease in the management cluster. The tests
//! with several replicas use as few buckets as make every replica own some cluster ([`splitting`]):
//! the clusters' buckets come from their keys, so the scenarios do not depend on timing or ports.
//!
//! Each replica runs `run_sharded_with` on a tokio runtime of its own, so killing one is dropping
//! that runtime: every task of the replica stops where it is, nothing is released (as SIGKILL).
//!
//! - 3 replicas over 30 clusters: every cluster owned by exactly one, each replica owns some, the
//!   Lease writes of a quiet fleet bounded by the buckets and replicas (not the clusters); a
//!   replica killed has its clusters provisioning again on the others within the Lease duration,
//!   with one NodeGroup per NodeClaim across the handover; its membership Lease is deleted after
//!   the grace period; a new replica joining takes a share.
//! - A replica partitioned from the management cluster (a relay black-holing its traffic) fences
//!   its clusters before their Leases expire, makes no NodeGroup or eviction write to them after
//!   the fence, and the other replica takes them over.
//! - A replica whose runtime is frozen past the renew deadline keeps renewing its Leases from its
//!   Lease thread: no fence, its clusters and their connections kept.
//! - A replica partitioned for less than the Lease duration (more than the renew deadline): fenced,
//!   then back on its clusters with the caches it kept (nothing listed again).
//! - The same Lease protocol on a real kube-apiserver (envtest).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use crds::{NodeClaim, NodeGroup, labels};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use operator::{
    commands::run,
    commands::sandbox::world::{World, quick_cke, scale},
    decisions::{
        ownership,
        shard_buckets::{BUCKETS, bucket_lease_name, bucket_of},
        sharding::Timings,
    },
    infra::{hub, metrics::Metrics, registry, sharding},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::common;
use common::{apply_example, metric_in as metric, poll_every, running, wait_for};

/// Short Lease timings, so a handover takes seconds.
pub(crate) const FAST: Timings = Timings {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(500),
};
/// Namespace of the shard Leases.
pub(crate) const LEASES: &str = "karpenter-hub";
/// Two such pods never share a 2XS: every new pod needs a node of its own.
const POD_CPU: &str = "500m";
const POD_MEMORY: &str = "2Gi";

/// One hub replica on a runtime of its own.
pub(crate) struct Replica {
    identity: String,
    buckets: u32,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Replica {
    pub(crate) fn start(
        identity: &str,
        mgmt: kube::Config,
        hub: hub::Settings,
        registry: registry::Settings,
    ) -> Replica {
        Self::start_in(identity, mgmt, hub, registry, BUCKETS)
    }

    /// A replica of a hub whose clusters hash to `buckets` shard buckets.
    pub(crate) fn start_in(
        identity: &str,
        mgmt: kube::Config,
        hub: hub::Settings,
        registry: registry::Settings,
        buckets: u32,
    ) -> Replica {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(identity.to_string())
            .enable_all()
            .build()
            .unwrap();
        let metrics = Arc::new(Metrics::new());
        let stop = CancellationToken::new();
        let mut shard = sharding::Settings::new("default", LEASES, identity, FAST).with_lease_client(mgmt.clone());
        shard.buckets = buckets;
        let (m, s, id) = (metrics.clone(), stop.clone(), identity.to_string());
        runtime.spawn(async move {
            // Built here: its connections belong to this runtime and die with it.
            let client = Client::try_from(mgmt).unwrap();
            if let Err(e) = run::run_sharded_with(client, hub, registry, shard, false, m, s).await {
                eprintln!("replica {id} stopped: {e}");
            }
        });
        Replica { identity: identity.to_string(), buckets, metrics, stop, runtime: Some(runtime) }
    }

    /// A sample of this replica's metrics (summed over the series with these labels).
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric(&self.metrics, name, labels)
    }

    pub(crate) fn owned(&self) -> usize {
        self.metric("karpenter_hub_shard_owned_clusters", &[]) as usize
    }

    /// Clusters this replica has a connection series for (it runs their connection).
    fn connected(&self) -> BTreeSet<String> {
        series_label(&self.metrics, "karpenter_hub_cluster_connected", "cluster")
    }

    /// Freeze the replica's runtime for `d`: its one worker thread blocked, as a saturated runtime
    /// delays every task. Returns a flag set once the freeze has begun.
    fn freeze(&self, d: Duration) -> Arc<AtomicBool> {
        let begun = Arc::new(AtomicBool::new(false));
        let flag = begun.clone();
        self.runtime.as_ref().unwrap().spawn(async move {
            flag.store(true, Ordering::SeqCst);
            std::thread::sleep(d);
        });
        begun
    }

    /// As SIGKILL would: every task dropped where it is, no Lease released.
    pub(crate) fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// Graceful stop: the replica releases its Leases, then its runtime goes.
    pub(crate) async fn stop(mut self) {
        self.stop.cancel();
        let metrics = self.metrics.clone();
        common::poll_until(Duration::from_secs(15), || {
            let m = metrics.clone();
            async move { metric(&m, "karpenter_hub_shard_owned_clusters", &[]) == 0.0 }
        })
        .await;
        self.kill();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

fn series_label(metrics: &Metrics, name: &str, label: &str) -> BTreeSet<String> {
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| {
            let pairs = l.split_once('{')?.1.split_once('}')?.0;
            pairs
                .split(',')
                .find_map(|p| p.strip_prefix(&format!("{label}=\"")).map(|v| v.trim_end_matches('"').to_string()))
        })
        .collect()
}

/// Each cluster of `keys` (`namespace/name`) → (the holder of its bucket's Lease, that Lease), for a
/// hub of `buckets` buckets; a cluster whose bucket has no Lease yet is missing.
async fn cluster_leases(mgmt: &Client, keys: &[String], buckets: u32) -> BTreeMap<String, (String, Lease)> {
    let leases: BTreeMap<String, Lease> = Api::<Lease>::namespaced(mgmt.clone(), LEASES)
        .list(&ListParams::default().labels(&format!("{}=bucket", sharding::ROLE_LABEL)))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|l| (l.name_any(), l))
        .collect();
    keys.iter()
        .filter_map(|k| {
            let lease = leases.get(&bucket_lease_name("default", bucket_of(k, buckets), buckets))?;
            let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
            Some((k.clone(), (holder, lease.clone())))
        })
        .collect()
}

/// The fewest buckets (at least `replicas`) into which `keys` hash leaving none empty: as every
/// replica gets a bucket when there are at least as many buckets as replicas, every replica then
/// owns some cluster. Deterministic (the buckets come from the keys).
pub(crate) fn splitting(keys: &[String], replicas: usize) -> u32 {
    (replicas as u32..=keys.len() as u32)
        .find(|b| (0..*b).all(|i| keys.iter().any(|k| bucket_of(k, *b) == i)))
        .unwrap_or_else(|| panic!("no bucket count splits {keys:?} over {replicas} replicas"))
}

async fn member_leases(mgmt: &Client) -> Vec<String> {
    Api::<Lease>::namespaced(mgmt.clone(), LEASES)
        .list(&ListParams::default().labels(&format!("{}=member", sharding::ROLE_LABEL)))
        .await
        .map(|l| l.items.iter().filter_map(|l| l.spec.as_ref()?.holder_identity.clone()).collect())
        .unwrap_or_default()
}

/// Whether every cluster of `keys` is held by one of `live`, and the replicas' own counts agree:
/// none thinks it owns a cluster another holds, none runs a connection of a cluster it does not
/// own. Returns the holders by replica.
async fn settled(mgmt: &Client, keys: &[String], live: &[&Replica]) -> Option<BTreeMap<String, Vec<String>>> {
    let leases = cluster_leases(mgmt, keys, live.first()?.buckets).await;
    let mut by_holder: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in keys {
        let (holder, _) = leases.get(k)?;
        if !live.iter().any(|r| &r.identity == holder) {
            return None;
        }
        by_holder.entry(holder.clone()).or_default().push(k.clone());
    }
    for r in live {
        let held = by_holder.get(&r.identity).map_or(0, Vec::len);
        if r.owned() != held {
            return None;
        }
        let connected = r.connected();
        if !connected.iter().all(|c| by_holder.get(&r.identity).is_some_and(|h| h.contains(c))) {
            return None;
        }
    }
    Some(by_holder)
}

pub(crate) async fn ensure_lease_namespace(mgmt: &Client) {
    ensure_namespace_named(mgmt, LEASES).await;
}

/// One NodeGroup per NodeClaim and back, named after it: no duplicate across a handover.
async fn assert_one_group_per_claim(world: &World, i: usize) {
    let c = &world.clusters[i];
    let claims = Api::<NodeClaim>::namespaced(world.mgmt.client(), &c.namespace).list(&ListParams::default()).await;
    let groups = Api::<NodeGroup>::all(c.client()).list(&ListParams::default()).await;
    let (claims, groups) = (claims.unwrap().items, groups.unwrap().items);
    let claim_names: BTreeSet<String> = claims.iter().map(ResourceExt::name_any).collect();
    let owners: Vec<String> =
        groups.iter().map(|g| g.labels().get(labels::NODECLAIM).cloned().unwrap_or_default()).collect();
    let distinct: BTreeSet<String> = owners.iter().cloned().collect();
    assert_eq!(distinct.len(), owners.len(), "{}: two NodeGroups for one NodeClaim: {owners:?}", c.name);
    assert_eq!(distinct, claim_names, "{}: NodeGroups and NodeClaims do not pair up", c.name);
    for g in &groups {
        let claim = g.labels().get(labels::NODECLAIM).unwrap();
        assert_eq!(g.name_any(), ownership::nodegroup_name("default", &c.namespace, claim), "{}", c.name);
    }
}

/// Writes only the hub makes in a workload cluster (the simulated CKE writes Nodes and pods too):
/// NodeGroup creations, patches and deletions, and evictions.
fn hub_writes(world: &World, i: usize) -> u64 {
    let r = world.clusters[i].server.requests();
    r.count("create", "nodegroups")
        + r.count("patch", "nodegroups")
        + r.count("update", "nodegroups")
        + r.count("delete", "nodegroups")
        + r.count("create", "pods/eviction")
}

fn index_of(world: &World, cluster: &str) -> usize {
    world.clusters.iter().position(|c| format!("{}/{}", c.namespace, c.name) == cluster).unwrap()
}

async fn world_of(n: usize) -> World {
    let names: Vec<(String, String)> = (0..n).map(|i| (format!("team-{i}"), format!("c-{i}"))).collect();
    let refs: Vec<(&str, &str)> = names.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let world = World::start(&refs, |i| quick_cke(i as u64 + 100)).await.unwrap();
    for i in 0..n {
        apply_example(&world, i).await;
    }
    ensure_lease_namespace(&world.mgmt.client()).await;
    world
}

fn keys(world: &World) -> Vec<String> {
    world.clusters.iter().map(|c| format!("{}/{}", c.namespace, c.name)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_spread_over_replicas_move_off_a_killed_one_and_onto_a_new_one() {
    let world = world_of(30).await;
    let mgmt = world.mgmt.client();
    let all = keys(&world);
    let buckets = splitting(&all, 3);
    let start = |id: &str| {
        let (hub, registry) = (world.hub_settings.clone(), world.registry_settings.clone());
        Replica::start_in(id, world.mgmt.client_config(), hub, registry, buckets)
    };
    let names = ["replica-0", "replica-1", "replica-2", "replica-3"].map(String::from);
    let mut replicas = vec![start(&names[0]), start(&names[1]), start(&names[2])];

    // Spread: every cluster held by exactly one replica, each replica some.
    let t = Instant::now();
    let spread = RefCell::new(None);
    let ok = common::poll_until(Duration::from_secs(60), || async {
        let live: Vec<&Replica> = replicas.iter().collect();
        let s = settled(&mgmt, &all, &live).await.filter(|s| s.len() == 3);
        *spread.borrow_mut() = s;
        spread.borrow().is_some()
    })
    .await;
    assert!(
        ok,
        "30 clusters not spread over 3 replicas within 60 s: {:?}",
        cluster_leases(&mgmt, &all, buckets).await.values().map(|v| &v.0).collect::<Vec<_>>()
    );
    let spread = spread.into_inner().unwrap();
    eprintln!(
        "spread after {:?}: {:?}",
        t.elapsed(),
        spread.iter().map(|(k, v)| (k.clone(), v.len())).collect::<BTreeMap<_, _>>()
    );

    // The write cost of a settled fleet: at most one Lease write per bucket, per replica
    // (membership) and for the leader Lease per retry period, however many clusters, and ownership
    // holds throughout.
    let lease_writes = || {
        let r = world.mgmt.requests();
        r.count("update", "leases") + r.count("create", "leases") + r.count("delete", "leases")
    };
    // Measured once the placement is quiet (the same holders three retry periods apart): replicas
    // starting together may still move a bucket or two right after every one of them owns some.
    let last = RefCell::new(spread);
    let quiet = common::poll_until(Duration::from_secs(30), || async {
        tokio::time::sleep(FAST.retry_period * 3).await;
        let live: Vec<&Replica> = replicas.iter().collect();
        let now = settled(&mgmt, &all, &live).await;
        let same = now.as_ref() == Some(&*last.borrow());
        if let Some(now) = now {
            *last.borrow_mut() = now;
        }
        same
    })
    .await;
    assert!(quiet, "the placement did not settle within 30 s");
    let spread = last.into_inner();
    let (w0, t0) = (lease_writes(), Instant::now());
    wait_for("five retry periods", Duration::from_secs(10), || async { t0.elapsed() >= FAST.retry_period * 5 }).await;
    let (writes, window) = (lease_writes() - w0, t0.elapsed());
    let periods = (window.as_secs_f64() / FAST.retry_period.as_secs_f64()).ceil() as u64 + 1;
    let leases = u64::from(buckets) + 3 + 1;
    let bound = leases * periods;
    eprintln!(
        "{writes} Lease writes in {window:?} ({bound} at most: {leases} Leases x {periods} periods, for 30 clusters)"
    );
    assert!(writes <= bound, "{writes} Lease writes in {window:?}, more than one per Lease per retry period ({bound})");
    // The same holders as at the spread (a replica's own counters may lag its Leases for a moment).
    let live: Vec<&Replica> = replicas.iter().collect();
    let held = common::poll_until(Duration::from_secs(5), || async {
        settled(&mgmt, &all, &live).await.as_ref() == Some(&spread)
    })
    .await;
    assert!(
        held,
        "ownership moved in a quiet fleet: {:?}",
        cluster_leases(&mgmt, &all, buckets).await.values().map(|v| &v.0).collect::<Vec<_>>()
    );

    // The victim's clusters provision before the kill (its replica acts on them).
    let victim = &replicas[1].identity.clone();
    assert!(spread.contains_key(victim));
    let theirs: Vec<usize> = spread[victim].iter().take(3).map(|k| index_of(&world, k)).collect();
    for &i in &theirs {
        scale(&world, i, 1, POD_CPU, POD_MEMORY).await.unwrap();
    }
    for &i in &theirs {
        wait_for(&format!("{}: a pod running", world.clusters[i].name), Duration::from_secs(90), || async {
            running(&world, i).await == 1
        })
        .await;
    }

    // Kill it: nothing released. Its clusters get a pending pod each at once.
    replicas[1].kill();
    let killed = Instant::now();
    for &i in &theirs {
        scale(&world, i, 2, POD_CPU, POD_MEMORY).await.unwrap();
    }
    let survivors = [&replicas[0], &replicas[2]];
    let ok = poll_every(Duration::from_millis(100), Duration::from_secs(30), || async {
        settled(&mgmt, &all, &survivors).await.is_some()
    })
    .await;
    assert!(ok, "the killed replica's clusters not taken over within 30 s");
    let handover = killed.elapsed();
    eprintln!("handover of {} clusters after the kill: {handover:?}", spread[victim].len());
    // Within the Lease duration of the last renewal, plus a retry period for the survivors to look.
    assert!(
        handover <= FAST.lease_duration + FAST.retry_period * 2 + Duration::from_secs(1),
        "handover took {handover:?} (lease {:?})",
        FAST.lease_duration
    );
    for &i in &theirs {
        wait_for(
            &format!("{}: the pending pod running on a new node", world.clusters[i].name),
            Duration::from_secs(90),
            || async { running(&world, i).await == 2 },
        )
        .await;
    }
    eprintln!("pending pods of the killed replica's clusters running {:?} after the kill", killed.elapsed());
    for &i in &theirs {
        assert_one_group_per_claim(&world, i).await;
    }

    // Its membership Lease goes after the grace period (4 × the Lease duration).
    wait_for("the dead replica's membership Lease deleted", Duration::from_secs(40), || async {
        !member_leases(&mgmt).await.contains(victim)
    })
    .await;
    eprintln!("dead member's Lease deleted {:?} after the kill", killed.elapsed());

    // A new replica joins and takes a share; the others hand it over.
    replicas.push(start(&names[3]));
    let joined = Instant::now();
    let after = RefCell::new(None);
    let ok = common::poll_until(Duration::from_secs(30), || async {
        let live = [&replicas[0], &replicas[2], &replicas[3]];
        let s = settled(&mgmt, &all, &live).await.filter(|s| s.contains_key(&names[3]));
        *after.borrow_mut() = s;
        after.borrow().is_some()
    })
    .await;
    assert!(ok, "the new replica took no share within 30 s");
    let after = after.into_inner().unwrap();
    eprintln!(
        "new replica's share after {:?}: {:?}",
        joined.elapsed(),
        after.iter().map(|(k, v)| (k.clone(), v.len())).collect::<BTreeMap<_, _>>()
    );
    let released: f64 = [&replicas[0], &replicas[2]]
        .iter()
        .map(|r| r.metric("karpenter_hub_shard_handovers_total", &[("direction", "released")]))
        .sum();
    assert!(
        released >= after[&names[3]].len() as f64,
        "handed over {released}, new replica owns {}",
        after[&names[3]].len()
    );
    // And it acts on them: a pod in one of its clusters gets a node.
    let new_one = index_of(&world, &after[&names[3]][0]);
    let before = running(&world, new_one).await;
    scale(&world, new_one, before + 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a pod in a cluster of the new replica running", Duration::from_secs(90), || async {
        running(&world, new_one).await == before + 1
    })
    .await;
    for &i in theirs.iter().chain([new_one].iter()) {
        assert_one_group_per_claim(&world, i).await;
    }
    for r in replicas.drain(..) {
        r.stop().await;
    }
    world.shutdown().await;
}

/// A TCP relay to `upstream` that can black-hole: while on, bytes are no longer passed either way
/// and new connections are accepted but never forwarded (as a network partition looks to a client).
struct Relay {
    addr: SocketAddr,
    holed: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    accepting: tokio::task::JoinHandle<()>,
    stalled: Arc<Mutex<Vec<tokio::net::TcpStream>>>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let holed = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let stalled: Arc<Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
        let (h, w, s) = (holed.clone(), wake.clone(), stalled.clone());
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if h.load(Ordering::SeqCst) {
                    // Held open, never answered.
                    s.lock().unwrap_or_else(PoisonError::into_inner).push(client);
                    continue;
                }
                let (h, w) = (h.clone(), w.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else { return };
                    let hole = async {
                        while !h.load(Ordering::SeqCst) {
                            w.notified().await;
                        }
                    };
                    let (mut from_client, mut to_client) = client.split();
                    let (mut from_server, mut to_server) = server.split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut from_client, &mut to_server) => return,
                        _ = tokio::io::copy(&mut from_server, &mut to_client) => return,
                        () = hole => {}
                    }
                    // Black-holed: keep both ends open and silent until the test ends.
                    std::future::pending::<()>().await;
                });
            }
        });
        Relay { addr, holed, wake, accepting, stalled }
    }

    fn black_hole(&self, on: bool) {
        self.holed.store(on, Ordering::SeqCst);
        self.wake.notify_waiters();
        if !on {
            // Stalled connections never get through; the client gives up on them and dials again.
            self.stalled.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }
}

/// A relay to the management emulator, and a client configuration going through it.
async fn behind_relay(world: &World) -> (Relay, kube::Config) {
    let relay = Relay::start(world.mgmt.addr()).await;
    let mut config = world.mgmt.client_config();
    config.cluster_url = format!("https://{}", relay.addr).parse().unwrap();
    // The partitioned replica's requests to the management cluster must not wait 295 s either.
    config.read_timeout = Some(Duration::from_secs(5));
    (relay, config)
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Two replica names under which each replica of the pair should own some clusters of `world`
/// (at least a third of them), computed with the hub's own placement rule over the clusters' API
/// server URLs, so the scenario does not depend on the ports the emulators got.
/// The renewals do not wait on the hub's runtime: with its only worker thread blocked for twice
/// the renew deadline (what a saturated runtime does to every task, only longer), the replica's
/// Lease thread and its own management client go on renewing, nothing is fenced, and the replica
/// still owns and is connected to its clusters afterwards. Before the Lease thread, the watchdog
/// (on the frozen runtime) fenced every cluster as soon as the runtime woke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_runtime_is_frozen_past_the_renew_deadline_keeps_its_leases() {
    let world = world_of(2).await;
    let mgmt = world.mgmt.client();
    let all = keys(&world);
    let r = Replica::start(
        "frozen",
        world.mgmt.client_config(),
        world.hub_settings.clone(),
        world.registry_settings.clone(),
    );
    wait_for("both clusters held and connected", Duration::from_secs(60), || async {
        settled(&mgmt, &all, &[&r]).await.is_some() && r.connected().len() == 2
    })
    .await;
    let fenced = || r.metric("karpenter_hub_shard_handovers_total", &[("direction", "fenced")]);
    let acquired = r.metric("karpenter_hub_shard_handovers_total", &[("direction", "acquired")]);
    assert_eq!(fenced(), 0.0);

    let freeze = FAST.renew_deadline * 2;
    let begun = r.freeze(freeze);
    wait_for("the freeze begun", Duration::from_secs(10), || async { begun.load(Ordering::SeqCst) }).await;
    let (frozen_at, frozen_wall) = (Instant::now(), k8s_openapi::jiff::Timestamp::now());
    // Past the renew deadline and the Lease duration, still frozen: every Lease renewed since.
    tokio::time::sleep(FAST.lease_duration + FAST.retry_period).await;
    assert!(frozen_at.elapsed() < freeze, "the check must fall inside the freeze");
    let leases = cluster_leases(&mgmt, &all, BUCKETS).await;
    for k in &all {
        let (holder, lease) = &leases[k];
        assert_eq!(holder, "frozen", "{k}");
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0).unwrap();
        assert!(renewed > frozen_wall, "{k}: last renewed {renewed}, before the freeze began at {frozen_wall}");
    }
    // After the freeze: nothing fenced, nothing re-acquired, both clusters still connected.
    tokio::time::sleep(freeze.saturating_sub(frozen_at.elapsed()) + FAST.retry_period * 2).await;
    assert_eq!(fenced(), 0.0, "a renewal on time was counted late");
    assert_eq!(r.metric("karpenter_hub_shard_handovers_total", &[("direction", "acquired")]), acquired);
    assert_eq!(r.owned(), 2);
    assert_eq!(r.connected().len(), 2);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_management_cluster_stops_writing_before_its_leases_expire() {
    let world = world_of(6).await;
    let mgmt = world.mgmt.client();
    let all = keys(&world);
    let (relay, via_relay) = behind_relay(&world).await;
    let buckets = splitting(&all, 2);
    let (pid, qid) = ("replica-p".to_string(), "replica-q".to_string());
    let (hub, registry) = (world.hub_settings.clone(), world.registry_settings.clone());
    let p = Replica::start_in(&pid, via_relay, hub.clone(), registry.clone(), buckets);
    let q = Replica::start_in(&qid, world.mgmt.client_config(), hub, registry, buckets);
    let spread = RefCell::new(None);
    let ok = common::poll_until(Duration::from_secs(60), || async {
        let s = settled(&mgmt, &all, &[&p, &q]).await.filter(|s| s.len() == 2);
        *spread.borrow_mut() = s;
        spread.borrow().is_some()
    })
    .await;
    assert!(ok, "6 clusters not spread over 2 replicas within 60 s");
    let spread = spread.into_inner().unwrap();
    let ps: Vec<usize> = spread[&pid].iter().map(|k| index_of(&world, k)).collect();
    eprintln!("replica-p owns {:?}, replica-q {:?}", spread[&pid], spread[&qid]);
    // P is at work on its clusters.
    scale(&world, ps[0], 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a pod running in a cluster of replica-p", Duration::from_secs(90), || async {
        running(&world, ps[0]).await == 1
    })
    .await;

    // The partition. P's last renewal of each cluster's bucket Lease is what the Lease shows from
    // now on, until Q takes it.
    let last: BTreeMap<String, Lease> =
        cluster_leases(&mgmt, &all, buckets).await.into_iter().map(|(k, (_, l))| (k, l)).collect();
    relay.black_hole(true);
    let cut = Instant::now();
    for &i in &ps {
        let n = running(&world, i).await;
        scale(&world, i, n + 1, POD_CPU, POD_MEMORY).await.unwrap();
    }
    let last_renewal: RefCell<BTreeMap<String, k8s_openapi::jiff::Timestamp>> = RefCell::default();
    let fenced_at: RefCell<Option<(Instant, SystemTime, Vec<u64>)>> = RefCell::default();
    let taken = Cell::new(false);
    let ok = poll_every(Duration::from_millis(20), Duration::from_secs(30), || async {
        let leases = cluster_leases(&mgmt, &all, buckets).await;
        for k in &spread[&pid] {
            if let Some((holder, l)) = leases.get(k)
                && *holder == pid
                && let Some(t) = l.spec.as_ref().and_then(|s| s.renew_time.as_ref())
            {
                last_renewal.borrow_mut().insert(k.clone(), t.0);
            }
        }
        if fenced_at.borrow().is_none() && p.owned() == 0 {
            let writes = ps.iter().map(|&i| hub_writes(&world, i)).collect();
            *fenced_at.borrow_mut() = Some((Instant::now(), SystemTime::now(), writes));
        }
        taken.set(spread[&pid].iter().all(|k| leases.get(k).is_some_and(|(h, _)| *h == qid)));
        fenced_at.borrow().is_some() && taken.get()
    })
    .await;
    assert!(ok, "fenced: {:?}, taken over: {}", fenced_at.borrow().as_ref().map(|f| f.0 - cut), taken.get());
    let (fence, fence_wall, writes_at_fence) = fenced_at.into_inner().unwrap();
    let last_renewal = last_renewal.into_inner();
    let takeover = cut.elapsed();
    eprintln!("replica-p fenced {:?} after the cut; replica-q holds all its clusters {takeover:?} after", fence - cut);
    assert!(fence - cut <= FAST.renew_deadline + Duration::from_secs(1), "fence after {:?}", fence - cut);
    // No hub write reached P's clusters between its fence and the takeover (only P could write).
    let writes_at_takeover: Vec<u64> = ps.iter().map(|&i| hub_writes(&world, i)).collect();
    assert_eq!(
        writes_at_takeover, writes_at_fence,
        "NodeGroup or eviction writes after the fence, before the takeover"
    );
    // Q took each Lease only once expired, and P had stopped before: P's last renewal + duration.
    let leases = cluster_leases(&mgmt, &all, buckets).await;
    for k in &spread[&pid] {
        let renewed = last_renewal
            .get(k)
            .copied()
            .or_else(|| last.get(k).and_then(|l| l.spec.as_ref()?.renew_time.as_ref()).map(|t| t.0));
        let acquired = leases[k].1.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0).unwrap();
        let renewed = renewed.expect("P's renewal seen");
        let expiry = renewed + FAST.lease_duration;
        assert!(acquired >= expiry, "{k}: taken at {acquired}, before the expiry {expiry}");
        let fence_ts = k8s_openapi::jiff::Timestamp::try_from(fence_wall).unwrap();
        assert!(fence_ts < acquired, "{k}: replica-p fenced at {fence_ts}, after replica-q took it at {acquired}");
    }
    // Cut off, it could neither renew nor release: every cluster counted fenced.
    assert_eq!(
        p.metric("karpenter_hub_shard_handovers_total", &[("direction", "fenced")]) as usize,
        ps.len(),
        "every cluster of replica-p fenced"
    );
    assert!(p.connected().is_empty(), "replica-p still runs connections: {:?}", p.connected());
    // Q provisions the pods that went pending at the cut.
    for &i in &ps {
        wait_for(
            &format!("{}: the pending pod running under replica-q", world.clusters[i].name),
            Duration::from_secs(90),
            || async {
                running(&world, i).await >= 1
                    && Api::<k8s_openapi::api::core::v1::Pod>::namespaced(world.clusters[i].client(), "default")
                        .list(&ListParams::default())
                        .await
                        .unwrap()
                        .items
                        .len()
                        == running(&world, i).await
            },
        )
        .await;
        assert_one_group_per_claim(&world, i).await;
    }

    // The partition heals: P rejoins and gets its share back, handed over by Q.
    relay.black_hole(false);
    let healed = Instant::now();
    let ok = common::poll_until(Duration::from_secs(60), || async {
        settled(&mgmt, &all, &[&p, &q]).await.is_some_and(|s| s.get(&pid).is_some_and(|c| c.len() == ps.len()))
    })
    .await;
    assert!(ok, "replica-p did not get its share back after the partition healed");
    eprintln!("replica-p owns its share again {:?} after the partition healed", healed.elapsed());
    for &i in &ps {
        assert_one_group_per_claim(&world, i).await;
    }
    p.stop().await;
    q.stop().await;
    world.shutdown().await;
}

/// A partition shorter than the Lease duration but longer than the renew deadline: the replica
/// fences its clusters (nothing written to them meanwhile), then, its bucket Leases still its own,
/// renews them and takes the clusters back with the caches it kept: no pod listed again, no other
/// connection made, and it provisions as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_fenced_by_a_short_partition_takes_its_clusters_back_with_the_caches_it_kept() {
    let world = world_of(2).await;
    let mgmt = world.mgmt.client();
    let all = keys(&world);
    let (relay, via_relay) = behind_relay(&world).await;
    let p = Replica::start("replica-p", via_relay, world.hub_settings.clone(), world.registry_settings.clone());
    wait_for("both clusters held and connected", Duration::from_secs(60), || async {
        settled(&mgmt, &all, &[&p]).await.is_some() && p.connected().len() == 2
    })
    .await;
    let pod_lists = || (0..2).map(|i| world.clusters[i].server.requests().count("list", "pods")).sum::<u64>();
    let (listed, writes) = (pod_lists(), (0..2).map(|i| hub_writes(&world, i)).sum::<u64>());
    let fenced = || p.metric("karpenter_hub_shard_handovers_total", &[("direction", "fenced")]);
    assert_eq!(fenced(), 0.0);

    relay.black_hole(true);
    let cut = Instant::now();
    wait_for("both clusters fenced", FAST.lease_duration, || async { fenced() >= 2.0 }).await;
    let fence = cut.elapsed();
    assert!(p.owned() == 0 && p.connected().is_empty(), "still serving after the fence");
    // Healed before the Lease duration has passed since the last renewal: the Leases are still P's.
    tokio::time::sleep((FAST.renew_deadline + FAST.lease_duration) / 2 - fence.min(FAST.renew_deadline)).await;
    relay.black_hole(false);
    wait_for("both clusters served again", Duration::from_secs(10), || async {
        p.owned() == 2 && p.connected().len() == 2
    })
    .await;
    eprintln!("fenced {fence:?} after the cut, serving again {:?} after it", cut.elapsed());
    assert_eq!(pod_lists(), listed, "the pods were listed again: the caches were not kept");
    assert_eq!((0..2).map(|i| hub_writes(&world, i)).sum::<u64>(), writes, "a write while fenced");
    // And it acts on them with its new clients.
    scale(&world, 0, 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a pod running after the partition", Duration::from_secs(90), || async { running(&world, 0).await == 1 })
        .await;
    assert_one_group_per_claim(&world, 0).await;
    p.stop().await;
    world.shutdown().await;
}

/// The Lease protocol on a real kube-apiserver (resourceVersion conflicts, MicroTime, label
/// selectors, deletion preconditions as the real server applies them): 2 replicas over 4 clusters
/// (workload emulators registered through Secrets in the real management plane), one killed, the
/// other holding all four within the Lease duration, the dead one's membership Lease deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_spread_and_survive_a_killed_replica_on_a_real_api_server() {
    let cp = envtest::shared_or_skip!("sharding");
    let mgmt = cp.client().await.unwrap();
    common::install_hub_crds(&mgmt).await;
    ensure_lease_namespace(&mgmt).await;
    let mut workloads = Vec::new();
    let mut all = Vec::new();
    for i in 0..4 {
        let (ns, name) = (format!("real-{i}"), format!("w-{i}"));
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        let _ = Api::<Namespace>::all(mgmt.clone()).create(&PostParams::default(), &namespace).await;
        let server =
            sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::workload(name.as_str())).await.unwrap();
        let kubeconfig = serde_json::to_vec(&server.kubeconfig()).unwrap();
        operator::commands::register_cluster::write_secret(&mgmt, &ns, &name, kubeconfig).await.unwrap();
        all.push(format!("{ns}/{name}"));
        workloads.push(server);
    }
    let registry = registry::Settings {
        probe_interval: Duration::from_secs(2),
        probe_timeout: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(5),
        ..registry::Settings::default()
    };
    let config = cp.config().await.unwrap();
    let buckets = splitting(&all, 2);
    let start = |id: &str| Replica::start_in(id, config.clone(), hub::Settings::default(), registry.clone(), buckets);
    let mut replicas = vec![start("real-0"), start("real-1")];
    // Kept as seen when it settled: a second look may catch a replica between two states.
    let settled_once = RefCell::new(None);
    wait_for("4 clusters held by the 2 replicas", Duration::from_secs(60), || async {
        let live: Vec<&Replica> = replicas.iter().collect();
        *settled_once.borrow_mut() = settled(&mgmt, &all, &live).await;
        settled_once.borrow().is_some()
    })
    .await;
    let before = settled_once.into_inner().expect("settled: wait_for returned");
    eprintln!(
        "on the real API server: {:?}",
        before.iter().map(|(k, v)| (k.clone(), v.len())).collect::<BTreeMap<_, _>>()
    );

    replicas[0].kill();
    let killed = Instant::now();
    let ok = poll_every(Duration::from_millis(100), Duration::from_secs(30), || async {
        settled(&mgmt, &all, &[&replicas[1]]).await.is_some()
    })
    .await;
    assert!(ok, "the killed replica's clusters not taken over within 30 s");
    let handover = killed.elapsed();
    eprintln!("on the real API server: all 4 clusters held by real-1 {handover:?} after the kill");
    assert!(handover <= FAST.lease_duration + FAST.retry_period * 2 + Duration::from_secs(1), "{handover:?}");
    wait_for("the dead replica's membership Lease deleted", Duration::from_secs(40), || async {
        !member_leases(&mgmt).await.contains(&"real-0".to_string())
    })
    .await;
    for r in replicas.drain(..) {
        r.stop().await;
    }
    // Stopped gracefully: every bucket Lease released, the membership Lease gone.
    let leases = cluster_leases(&mgmt, &all, buckets).await;
    assert!(all.iter().all(|k| leases.get(k).is_some_and(|(h, _)| h.is_empty())), "{leases:?}");
    assert!(member_leases(&mgmt).await.is_empty());
    for i in 0..4 {
        let _ = Api::<Namespace>::all(mgmt.clone()).delete(&format!("real-{i}"), &Default::default()).await;
    }
    for s in workloads {
        s.shutdown().await;
    }
}

/// `karpenter-hub run --sharding` as an OS process, its output in a file; SIGKILL when dropped.
struct Process {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Process {
    fn start(name: &str, kubeconfig: &std::path::Path, dir: &std::path::Path) -> Process {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
            .args([
                "run",
                "--hub-id=default",
                "--sharding",
                "--shard-lease-duration=3",
                "--shard-renew-deadline=2",
                "--shard-retry-period=1",
            ])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .arg(format!("--leader-election-namespace={LEASES}"))
            .arg("--probe-interval-seconds=2")
            .env_clear()
            .env("POD_NAME", name)
            .env("RUST_LOG", "info,kube=warn,tower=warn,hyper=warn")
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Process { child, log }
    }

    /// The identity it holds Leases under: `<POD_NAME>-<pid>`.
    fn identity(&self, name: &str) -> String {
        format!("{name}-{}", self.child.id())
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: nothing released, nothing flushed.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Each of `keys` held by one of `holders` (`None` when not).
async fn holders(mgmt: &Client, keys: &[String], live: &[String]) -> Option<BTreeMap<String, Vec<String>>> {
    let leases = cluster_leases(mgmt, keys, BUCKETS).await;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in keys {
        let (holder, _) = leases.get(k)?;
        if !live.contains(holder) {
            return None;
        }
        out.entry(holder.clone()).or_default().push(k.clone());
    }
    Some(out)
}

/// Two `karpenter-hub run --sharding` processes over 8 clusters; one killed with SIGKILL: the other
/// holds all 8 within the Lease duration and provisions a pod gone pending in a cluster of the
/// dead one, one NodeGroup per NodeClaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_process_killed_with_sigkill_hands_its_clusters_over() {
    let world = world_of(8).await;
    let mgmt = world.mgmt.client();
    let all = keys(&world);
    let dir = std::env::temp_dir().join(format!("karpenter-hub-sharding-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("management.kubeconfig");
    world.mgmt.write_kubeconfig(&kubeconfig).unwrap();
    let mut procs = [Process::start("proc-a", &kubeconfig, &dir), Process::start("proc-b", &kubeconfig, &dir)];
    let ids = [procs[0].identity("proc-a"), procs[1].identity("proc-b")];
    let spread = RefCell::new(None);
    let ok = common::poll_until(Duration::from_secs(60), || async {
        let s = holders(&mgmt, &all, &ids).await;
        *spread.borrow_mut() = s;
        spread.borrow().is_some()
    })
    .await;
    assert!(ok, "8 clusters not held by the 2 processes within 60 s:\n{}\n{}", procs[0].output(), procs[1].output());
    let spread = spread.into_inner().unwrap();
    let owned = |i: usize| spread.get(&ids[i]).map_or(0, Vec::len);
    eprintln!("proc-a owns {}, proc-b {}", owned(0), owned(1));
    // The one owning more dies (the emulators' ports decide the placement: either may have none).
    let (dead, alive) = if owned(0) >= owned(1) { (0, 1) } else { (1, 0) };
    let victim = index_of(&world, &spread[&ids[dead]][0]);
    scale(&world, victim, 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("a pod running in a cluster of the process to kill", Duration::from_secs(90), || async {
        running(&world, victim).await == 1
    })
    .await;

    procs[dead].kill();
    let killed = Instant::now();
    scale(&world, victim, 2, POD_CPU, POD_MEMORY).await.unwrap();
    let ok = poll_every(Duration::from_millis(100), Duration::from_secs(30), || async {
        holders(&mgmt, &all, std::slice::from_ref(&ids[alive])).await.is_some()
    })
    .await;
    assert!(ok, "the killed process's clusters not taken over within 30 s:\n{}", procs[alive].output());
    let handover = killed.elapsed();
    eprintln!("after SIGKILL: all 8 clusters held by the survivor {handover:?} later");
    // The Lease duration after the last renewal (at most a retry period before the kill), and a
    // retry period for the survivor to look.
    assert!(handover <= Duration::from_secs(3 + 1 + 1) + Duration::from_secs(1), "handover took {handover:?}");
    wait_for("the pending pod running under the survivor", Duration::from_secs(90), || async {
        running(&world, victim).await == 2
    })
    .await;
    eprintln!("the pending pod of a cluster of the killed process running {:?} after the SIGKILL", killed.elapsed());
    assert_one_group_per_claim(&world, victim).await;
    let log = procs[alive].output();
    assert!(log.contains("took ownership of the cluster"), "the survivor's log says nothing of the takeover:\n{log}");
    drop(procs);
    world.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A workload cluster registered twice in one namespace (two Secrets, one API server), the two
/// registrations in buckets held by different replicas: each replica publishes the clusters it
/// identified on its bucket's Lease, so the duplicate check (per namespace) meets across replicas.
/// The older registration speaks (`Connected` on its owner), the copy stands aside
/// (`DuplicateCluster` on the other), and only the older one's owner writes to the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_registrations_of_one_cluster_on_two_replicas_meet_in_the_duplicate_check() {
    let world = world_of(6).await;
    let mgmt = world.mgmt.client();
    let copy = serde_json::to_vec(&world.clusters[0].server.kubeconfig()).unwrap();
    // The copy's Secret a second younger (creation times have a one-second resolution; within a
    // second, the lower key speaks, and `c-0-copy` sorts before `c-0`).
    common::a_second_after_the_secret(&mgmt, "team-0", "c-0-kubeconfig").await;
    world.put_secret("team-0", "c-0-copy", &copy).await.unwrap();
    let mut all = keys(&world);
    all.push("team-0/c-0-copy".to_string());
    let buckets = splitting(&all, 2);
    assert_eq!(buckets, 2);
    assert_ne!(bucket_of("team-0/c-0", 2), bucket_of("team-0/c-0-copy", 2), "the scenario needs two buckets");
    let start = |id: &str| {
        let (hub, registry) = (world.hub_settings.clone(), world.registry_settings.clone());
        Replica::start_in(id, world.mgmt.client_config(), hub, registry, buckets)
    };
    let replicas = [start("replica-0"), start("replica-1")];
    let live: Vec<&Replica> = replicas.iter().collect();
    let phase = |r: &Replica, cluster: &str, phase: &str| {
        r.metric("karpenter_hub_cluster_phase", &[("cluster", cluster), ("phase", phase)]) == 1.0
    };
    let owners = RefCell::new(None);
    let ok = common::poll_until(Duration::from_secs(60), || async {
        let Some(s) = settled(&mgmt, &all, &live).await else { return false };
        let holder = |k: &str| {
            let id = s.iter().find(|(_, v)| v.iter().any(|c| c == k)).map(|(r, _)| r.clone());
            replicas.iter().find(|r| Some(&r.identity) == id.as_ref())
        };
        let (Some(first), Some(second)) = (holder("team-0/c-0"), holder("team-0/c-0-copy")) else { return false };
        *owners.borrow_mut() = Some((first.identity.clone(), second.identity.clone()));
        first.identity != second.identity
            && phase(first, "team-0/c-0", "Connected")
            && phase(second, "team-0/c-0-copy", "DuplicateCluster")
    })
    .await;
    assert!(
        ok,
        "the older registration of c-0 not Connected on its replica and the copy DuplicateCluster on the other: {:?}",
        owners.borrow()
    );
    eprintln!("c-0 and its copy owned by {:?}", owners.borrow());
    // The older registration's owner provisions for the cluster while the copy stands aside.
    scale(&world, 0, 1, POD_CPU, POD_MEMORY).await.unwrap();
    wait_for("the pod in c-0 running", Duration::from_secs(90), || async { running(&world, 0).await == 1 }).await;
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        groups.len(),
        1,
        "one NodeGroup for the one pod: {:?}",
        groups.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    assert_one_group_per_claim(&world, 0).await;
    for r in replicas {
        r.stop().await;
    }
    world.shutdown().await;
}

async fn ensure_namespace_named(mgmt: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match Api::<Namespace>::all(mgmt.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}
