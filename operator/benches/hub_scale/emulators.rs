//! The emulator process (`B4_ROLE=emulators`): the management emulator and N workload emulators,
//! each played by a simulated CKE, answering the hub process's commands on stdin.

use super::*;

struct Cluster {
    namespace: String,
    name: String,
    server: ApiServer,
    client: Client,
}

struct World {
    mgmt: ApiServer,
    mgmt_client: Client,
    clusters: Vec<Cluster>,
    observed: Observed,
}

impl World {
    fn side(&self, port: u16) -> &'static str {
        if port == self.mgmt.addr().port() { "mgmt" } else { "workload" }
    }

    fn served(&self) -> Counts {
        let mut out = Counts::new();
        let mut add = |side: &str, s: &ApiServer| {
            for ((v, r), n) in s.requests().snapshot() {
                *out.entry((side.to_string(), v, r)).or_insert(0) += n as i64;
            }
        };
        add("mgmt", &self.mgmt);
        for c in &self.clusters {
            add("workload", &c.server);
        }
        out
    }

    fn own(&self) -> Counts {
        let mut out = Counts::new();
        for ((port, req), n) in lock(&self.observed.0).iter() {
            *out.entry((self.side(*port).to_string(), req.verb.clone(), req.resource.clone())).or_insert(0) +=
                *n as i64;
        }
        out
    }
}

pub fn main() {
    let observed = Observed::default();
    init_tracing(&observed);
    let n = env_usize("B4_CLUSTERS").max(1);
    let dir = PathBuf::from(std::env::var("B4_DIR").unwrap_or_else(|_| ".".into()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(serve(n, &dir, observed));
}

fn node(j: usize, flavor: &SimFlavor, clock: &sim::clock::Clock) -> Value {
    let name = format!("worker-{j:02}");
    let group = format!("static-{}", j / 10);
    let mut v = objects::node_object(
        &objects::NodeSpecInput {
            name: &name,
            flavor,
            group: Some(&group),
            extra_labels: None,
            taints: Vec::new(),
            ready: true,
            kubelet_version: "v1.36.0",
            seed: j as u64,
        },
        clock.now(),
    );
    // Not a node of the simulated CKE (it would remove it: its group does not exist); a node of
    // a group the hub does not manage.
    if let Some(a) = v.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        a.remove(objects::SIMULATED_ANNOTATION);
    }
    v
}

/// A running pod: 20 per node at 480m / 700Mi fill the M nodes (10 CPU), so a pending pod of
/// 1 CPU fits none of them.
pub(super) fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("app-{i}"), "namespace": "default",
                     "labels": {"app": format!("app-{}", i % 20), "team": "a", "pod-template-hash": "7d9f8c6b5"},
                     "annotations": {"example.com/owner": "hub-scale-bench"}},
        "spec": {
            "nodeName": format!("worker-{:02}", i % nodes_per_cluster()),
            "nodeSelector": {crds::labels::CLEVER_NODE_ROLE: "worker"},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "480m", "memory": "700Mi"}, "limits": {"memory": "700Mi"}},
                            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                            "env": [{"name": "MODE", "value": "bench"}]}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": format!("app-{}", i % 20)}}}}]}}
        }
    }))
    .unwrap()
}

fn burst_pod(k: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("burst-{k}"), "namespace": "default", "labels": {"bench": "burst", "app": "burst"}},
        "spec": {
            "nodeSelector": {crds::labels::CLEVER_NODE_ROLE: "worker"},
            "containers": [{"name": "app", "image": "registry.example/web:1",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
        }
    }))
    .unwrap()
}

async fn fill(c: &Cluster) {
    let flavor = SimFlavor::builtins().into_iter().find(|f| f.name == "M").expect("flavor M");
    let clock = sim::clock::Clock::real();
    let napi: Api<Node> = Api::all(c.client.clone());
    for j in 0..nodes_per_cluster() {
        let n: Node = serde_json::from_value(node(j, &flavor, &clock)).unwrap();
        napi.create(&PostParams::default(), &n).await.unwrap();
    }
    let papi: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let mut writers = Vec::new();
    for w in 0..4 {
        let papi = papi.clone();
        let clock = clock.clone();
        writers.push(tokio::spawn(async move {
            let nodes = nodes_per_cluster();
            for i in (w..pods_per_cluster()).step_by(4) {
                let created = papi.create(&PostParams::default(), &pod(i)).await.unwrap();
                let host = format!("10.0.{}.{}", (i % nodes) / 250, (i % nodes) % 250 + 1);
                let ip = format!("10.1.{}.{}", i / 250, i % 250 + 1);
                let status = objects::pod_running_status(&created, &host, &ip, clock.now());
                papi.patch_status(
                    &created.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": status})),
                )
                .await
                .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
}

async fn register(world: &World, c: &Cluster) {
    let client = &world.mgmt_client;
    manifests::ensure_namespace(client, &c.namespace).await.unwrap();
    for mut doc in manifests::documents("examples/general-purpose.yaml", EXAMPLE).unwrap() {
        if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
            doc["spec"]["clusterName"] = Value::String(c.name.clone());
        }
        sandbox::apply_value(client, &doc, &c.namespace, "examples/general-purpose.yaml").await.unwrap();
    }
    let kubeconfig = serde_json::to_vec(&c.server.kubeconfig()).unwrap();
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-kubeconfig", c.name), "labels": {registry::CLUSTER_NAME_LABEL: c.name}},
        "type": "cluster.x-k8s.io/secret",
    }))
    .unwrap();
    secret.data = Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(kubeconfig))]));
    Api::<Secret>::namespaced(client.clone(), &c.namespace).create(&PostParams::default(), &secret).await.unwrap();
}

fn reply(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

async fn serve(n: usize, dir: &Path, observed: Observed) {
    let mgmt = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let mut clusters = Vec::new();
    for i in 0..n {
        let name = format!("cke-{i:03}");
        let server = ApiServer::start(ApiServerConfig::workload(&name).with_seed(i as u64 + 1)).await.unwrap();
        let client = server.client();
        clusters.push(Cluster { namespace: format!("team-{i:03}"), name, server, client });
    }
    let world = Arc::new(World { mgmt_client: mgmt.client(), mgmt, clusters, observed });

    // Fill every workload cluster at once, then register each in the management cluster.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let w = world.clone();
        tasks.push(tokio::spawn(async move { fill(&w.clusters[i]).await }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let fill_s = t.elapsed().as_secs_f64();
    for c in &world.clusters {
        register(&world, c).await;
    }

    // One simulated CKE per cluster: default behaviour, shorter boot (join 3 s, ready 1 s) so the
    // burst's nodes come up quickly, and no node heartbeat Leases (writes nobody reads here).
    let stop = CancellationToken::new();
    for (i, c) in world.clusters.iter().enumerate() {
        let config = SimCkeConfig {
            seed: i as u64 + 1,
            node_join_delay: DelayRange::fixed(Duration::from_secs(3)),
            node_ready_delay: DelayRange::fixed(Duration::from_secs(1)),
            pod_start_delay: DelayRange::fixed(Duration::from_millis(500)),
            node_lease_interval: None,
            ..SimCkeConfig::default()
        };
        let (client, stop) = (c.client.clone(), stop.clone());
        tokio::spawn(async move {
            let result = sim::cke::run(client, config, stop.clone().cancelled_owned()).await;
            if let Err(e) = result
                && !stop.is_cancelled()
            {
                eprintln!("simulated CKE stopped: {e}");
            }
        });
    }
    // The CKEs are up when their control-plane nodes exist; then give their caches a moment.
    let deadline = Instant::now() + Duration::from_secs(300);
    while world.clusters.iter().any(|c| c.server.object_count("", "nodes") < nodes_per_cluster() + 2)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let path = dir.join("management.kubeconfig");
    world.mgmt.write_kubeconfig(&path).unwrap();
    let objects_total = n * (nodes_per_cluster() + pods_per_cluster());
    reply(&json!({
        "ready": true,
        "mgmt_kubeconfig": path.display().to_string(),
        "mgmt_port": world.mgmt.addr().port(),
        "clusters": world.clusters.iter().map(|c| format!("{}/{}", c.namespace, c.name)).collect::<Vec<_>>(),
        "fill_s": fill_s,
        "objects": objects_total,
        "writes_per_s": (n * (nodes_per_cluster() + 2 * pods_per_cluster())) as f64 / fill_s,
        "rss_mib": rss_mib().0,
    }));

    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("counters") => reply(&json!({
                "served": counts_to_json(&world.served()),
                "own": counts_to_json(&world.own()),
                "cpu_s": cpu_seconds(),
            })),
            Some("waitpools") => reply(&wait_pools(&world).await),
            Some("burst") => {
                let k = words.next().and_then(|w| w.parse().ok()).unwrap_or(3);
                reply(&burst(&world, k).await);
            }
            Some("audit") => reply(&audit(&world)),
            Some("quit") | None => break,
            Some(other) => reply(&json!({"error": format!("unknown command {other}")})),
        }
    }
    stop.cancel();
    reply(&json!({"bye": true}));
}

/// The audit of the hub replicas' writes to each workload cluster: per cluster, per replica (the
/// `(replica …)` of its `User-Agent`), the first and last write's wall-clock time (ms) and the
/// number of writes. The simulated CKEs' writes (no replica named) are left out.
fn audit(world: &World) -> Value {
    let clusters: Vec<Value> = world
        .clusters
        .iter()
        .map(|c| {
            let mut by: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
            for w in c.server.requests().written() {
                let Some(replica) = operator::infra::replica_of(&w.agent).map(str::to_string) else {
                    continue;
                };
                let e = by.entry(replica).or_insert((w.at_ms, w.at_ms, 0));
                e.0 = e.0.min(w.at_ms);
                e.1 = e.1.max(w.at_ms);
                e.2 += 1;
            }
            json!([
                format!("{}/{}", c.namespace, c.name),
                by.iter().map(|(r, (a, b, n))| json!([r, a, b, n])).collect::<Vec<_>>()
            ])
        })
        .collect();
    json!({"clusters": clusters})
}

/// Until every NodePool is Ready (its cluster reachable, its class ready).
async fn wait_pools(world: &World) -> Value {
    let api: Api<NodePool> = Api::all(world.mgmt_client.clone());
    let t = Instant::now();
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            let ready = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, "Ready")))
                .count();
            if ready == world.clusters.len() {
                return json!({"ok": true, "seconds": t.elapsed().as_secs_f64()});
            }
            if t.elapsed() > Duration::from_secs(900) {
                return json!({"ok": false, "ready": ready, "seconds": t.elapsed().as_secs_f64()});
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Default)]
struct Seen {
    unschedulable: HashMap<(usize, String), Instant>,
    running: HashMap<(usize, String), Instant>,
    groups: Vec<Vec<Instant>>,
    claims: Vec<Vec<Instant>>,
    /// Per cluster, every NodeGroup and NodeClaim event by name (`+` added, `-` deleted), to
    /// tell a duplicate from a re-creation under the same name.
    group_events: Vec<Vec<(char, String)>>,
    claim_events: Vec<Vec<(char, String)>>,
}

fn unschedulable(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

/// `k` pending pods in every cluster at once; times of each step, from watches opened before.
/// Clusters whose burst is timed by watches (see [`burst`]).
const WATCHED: usize = 300;

async fn burst(world: &World, k: usize) -> Value {
    let n = world.clusters.len();
    let seen = Arc::new(Mutex::new(Seen {
        groups: vec![Vec::new(); n],
        claims: vec![Vec::new(); n],
        group_events: vec![Vec::new(); n],
        claim_events: vec![Vec::new(); n],
        ..Seen::default()
    }));
    let wp = WatchParams::default().timeout(290);
    let mut watchers = Vec::new();
    // Timed by watches on the first `WATCHED` clusters only: two watches per cluster, client and
    // server ends in this one process, would pass the file descriptor limit at 1,000 clusters.
    let watched = n.min(WATCHED);
    let mut unwatched = 0usize;
    for (i, c) in world.clusters.iter().enumerate().take(watched) {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
        let Ok(stream) = pods.watch(&wp.clone().labels("bench=burst"), "0").await else {
            unwatched += 1;
            continue;
        };
        let mut stream = stream.boxed();
        let s = seen.clone();
        watchers.push(tokio::spawn(async move {
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) = ev {
                    let now = Instant::now();
                    let key = (i, p.name_any());
                    let mut s = lock(&s);
                    if unschedulable(&p) {
                        s.unschedulable.entry(key.clone()).or_insert(now);
                    }
                    if p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running") {
                        s.running.entry(key).or_insert(now);
                    }
                }
            }
        }));
        let groups: Api<NodeGroup> = Api::all(c.client.clone());
        let Ok(stream) = groups.watch(&wp, "0").await else {
            unwatched += 1;
            continue;
        };
        let mut stream = stream.boxed();
        let s = seen.clone();
        watchers.push(tokio::spawn(async move {
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Added(g)) => {
                        let mut s = lock(&s);
                        s.groups[i].push(Instant::now());
                        s.group_events[i].push(('+', g.name_any()));
                    }
                    Ok(WatchEvent::Deleted(g)) => lock(&s).group_events[i].push(('-', g.name_any())),
                    _ => {}
                }
            }
        }));
    }
    let index: HashMap<String, usize> =
        world.clusters.iter().enumerate().map(|(i, c)| (c.namespace.clone(), i)).collect();
    let claims: Api<NodeClaim> = Api::all(world.mgmt_client.clone());
    let mut stream = claims.watch(&wp, "0").await.unwrap().boxed();
    let s = seen.clone();
    watchers.push(tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            let (sign, c) = match ev {
                Ok(WatchEvent::Added(c)) => ('+', c),
                Ok(WatchEvent::Deleted(c)) => ('-', c),
                _ => continue,
            };
            if let Some(i) = c.namespace().and_then(|ns| index.get(&ns).copied()) {
                let mut s = lock(&s);
                if sign == '+' {
                    s.claims[i].push(Instant::now());
                }
                s.claim_events[i].push((sign, c.name_any()));
            }
        }
    }));

    let t0 = Instant::now();
    let mut creates = Vec::new();
    for (i, c) in world.clusters.iter().enumerate() {
        for j in 0..k {
            let api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
            creates.push(tokio::spawn(async move {
                // Tried again a few times: under load a connection may be refused for a moment.
                for _ in 0..5 {
                    if api.create(&PostParams::default(), &burst_pod(j)).await.is_ok() {
                        return Some((i, format!("burst-{j}"), Instant::now()));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                None
            }));
        }
    }
    let mut created = Vec::new();
    let mut not_created = 0usize;
    for c in creates {
        match c.await.ok().flatten() {
            Some(c) => created.push(c),
            None => not_created += 1,
        }
    }
    let timed: Vec<_> = created.iter().filter(|(i, _, _)| *i < watched).cloned().collect();
    let deadline = t0 + Duration::from_secs(300);
    loop {
        {
            let s = lock(&seen);
            if s.groups.iter().take(watched).all(|g| !g.is_empty()) && s.running.len() >= timed.len() {
                break;
            }
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in watchers {
        w.abort();
    }
    let events = {
        let s = lock(&seen);
        (s.group_events.clone(), s.claim_events.clone())
    };
    let pairing = pairing(world, &events.0, &events.1).await;
    let s = lock(&seen);
    let ms = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(t0).as_secs_f64() * 1000.0);
    let rows: Vec<Value> = timed
        .iter()
        .map(|(i, name, at)| {
            let key = (*i, name.clone());
            json!([
                i,
                ms(Some(*at)),
                ms(s.unschedulable.get(&key).copied()),
                ms(s.claims[*i].first().copied()),
                ms(s.groups[*i].first().copied()),
                ms(s.running.get(&key).copied()),
            ])
        })
        .collect();
    json!({
        "pods": rows,
        "nodegroups_per_cluster": s.groups.iter().take(watched).map(Vec::len).collect::<Vec<_>>(),
        "claims_per_cluster": s.claims.iter().take(watched).map(Vec::len).collect::<Vec<_>>(),
        "pairing": pairing,
        "watched_clusters": watched,
        "watches_refused": unwatched,
        "pods_not_created": not_created,
    })
}

/// NodeGroups against NodeClaims at the end of the burst, read from the clusters (not inferred
/// from event counts): the most live NodeGroups naming one claim (2 or more is a duplicate),
/// live NodeGroups whose claim is gone, live claims without a NodeGroup, and, from the
/// watches, NodeGroups or claims added again under a name already seen (a re-creation) and
/// deletions; with the clusters where anything differs.
async fn pairing(world: &World, group_events: &[Vec<(char, String)>], claim_events: &[Vec<(char, String)>]) -> Value {
    let claims = Api::<NodeClaim>::all(world.mgmt_client.clone()).list(&ListParams::default()).await;
    let claims = claims.map(|l| l.items).unwrap_or_default();
    let (mut max_per_claim, mut orphans, mut unlaunched, mut regroups, mut reclaims) = (0usize, 0, 0, 0, 0);
    let (mut group_deletes, mut claim_deletes) = (0, 0);
    let mut odd = Vec::new();
    for (i, c) in world.clusters.iter().enumerate() {
        let live: Vec<NodeGroup> =
            Api::<NodeGroup>::all(c.client.clone()).list(&ListParams::default()).await.map_or(Vec::new(), |l| l.items);
        let live_claims: std::collections::BTreeSet<String> = claims
            .iter()
            .filter(|k| k.namespace().as_deref() == Some(c.namespace.as_str()))
            .map(ResourceExt::name_any)
            .collect();
        let mut per_claim: BTreeMap<String, usize> = BTreeMap::new();
        for g in &live {
            if let Some(claim) = g.labels().get(crds::labels::NODECLAIM) {
                *per_claim.entry(claim.clone()).or_default() += 1;
            }
        }
        let most = per_claim.values().copied().max().unwrap_or(0);
        let orphan_groups: Vec<String> = live
            .iter()
            .filter_map(|g| {
                let claim = g.labels().get(crds::labels::NODECLAIM)?;
                let created = g.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                (!live_claims.contains(claim)).then(|| format!("{} (claim {claim}, created {created})", g.name_any()))
            })
            .collect();
        let orphan = orphan_groups.len();
        let without = live_claims.iter().filter(|k| !per_claim.contains_key(*k)).count();
        let again = |events: &[(char, String)]| {
            let mut added = std::collections::BTreeSet::new();
            events.iter().filter(|(sign, name)| *sign == '+' && !added.insert(name.clone())).count()
        };
        let deleted = |events: &[(char, String)]| events.iter().filter(|(sign, _)| *sign == '-').count();
        let (rg, rc) = (again(&group_events[i]), again(&claim_events[i]));
        let (dg, dc) = (deleted(&group_events[i]), deleted(&claim_events[i]));
        max_per_claim = max_per_claim.max(most);
        orphans += orphan;
        unlaunched += without;
        regroups += rg;
        reclaims += rc;
        group_deletes += dg;
        claim_deletes += dc;
        if most > 1 || orphan + without + rg + rc + dg + dc > 0 {
            odd.push(json!({
                "cluster": format!("{}/{}", c.namespace, c.name),
                "live_nodegroups": live.len(), "live_claims": live_claims.len(), "most_per_claim": most,
                "orphans": orphan, "claims_without": without, "nodegroups_readded": rg, "claims_readded": rc,
                "nodegroups_deleted": dg, "claims_deleted": dc, "orphan_groups": orphan_groups,
                "live_claim_names": live_claims.iter().collect::<Vec<_>>(),
                "group_events": group_events[i].iter().map(|(s, n)| format!("{s}{n}")).collect::<Vec<_>>(),
                "claim_events": claim_events[i].iter().map(|(s, n)| format!("{s}{n}")).collect::<Vec<_>>(),
            }));
        }
    }
    json!({
        "max_nodegroups_per_claim": max_per_claim, "nodegroups_without_claim": orphans,
        "claims_without_nodegroup": unlaunched, "nodegroups_readded": regroups, "claims_readded": reclaims,
        "nodegroups_deleted": group_deletes, "claims_deleted": claim_deletes, "clusters": odd,
    })
}
