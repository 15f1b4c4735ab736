//! API requests per provisioned node (issue 16; docs/performance.md B4, "Requests per node after
//! issue 16"): the real hub on the simulated world provisions one node in each of a few workload
//! clusters, and the requests the hub made for it, management and workload side, are counted by
//! verb and resource, printed, and held to a budget per node.
//!
//! Who made a request is exact: every emulator counts every request it serves by verb, resource and
//! `User-Agent` (`sim::apiserver::Requests`). The hub's clients name themselves
//! (`operator::infra::USER_AGENT`); this test's and each simulated CKE's get a name of their own
//! through a tower layer, so a request without one of the three names shows a hub client that does
//! not name itself, and fails the test. The hub's own management client also counts its requests
//! as it sends them, and the two views must agree once the hub is quiet, which checks the
//! accounting itself. (Counting the others on the client side and taking the hub's as the
//! difference raced: a CKE lease renewal counted at send but not yet served made the difference
//! negative.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crds::NodeClaim;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
    client::ClientBuilder,
};
use operator::{
    commands::{register_cluster, run, sandbox::world::workload_pod},
    infra::{hub, manifests, metrics::Metrics, registry},
};
use serde_json::Value;
use sim::{
    apiserver::{ApiServer, ApiServerConfig},
    cke::SimCkeConfig,
};
use tokio_util::sync::CancellationToken;

use crate::common;
use common::{EXAMPLE, wait_for, wait_quiet};

/// The budget of issue 16: hub API requests (both sides) per provisioned node.
const BUDGET_PER_NODE: f64 = 25.0;
/// Workload clusters, one node provisioned in each.
const CLUSTERS: usize = 4;
/// Pending pods per cluster; together they fit one node of the example pool.
const PODS: usize = 2;

/// Requests by (verb, resource), as `sim::apiserver` names them.
type Counts = BTreeMap<(String, String), u64>;

/// A request counter shared by the clients of one party on one side.
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<Counts>>);

impl Tally {
    fn record(&self, method: &http::Method, path: &str, query: &str) {
        let key = classify(method, path, query);
        *self.0.lock().unwrap().entry(key).or_insert(0) += 1;
    }

    fn snapshot(&self) -> Counts {
        self.0.lock().unwrap().clone()
    }
}

/// (verb, resource) exactly as the emulator's router counts a request (sim/src/apiserver/server.rs).
fn classify(method: &http::Method, path: &str, query: &str) -> (String, String) {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", _, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _, _, rest @ ..] if !rest.is_empty() => rest,
        _ => return ("get".into(), String::new()),
    };
    let (legacy_watch, rest) = match rest.first() {
        Some(&"watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    let rest = if rest.len() >= 3 && rest[0] == "namespaces" { &rest[2..] } else { rest };
    if rest.is_empty() || rest.len() > 3 {
        return ("get".into(), String::new());
    }
    let watch = legacy_watch || query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let named = rest.len() >= 2;
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "unknown",
    };
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    (verb.into(), resource)
}

/// The `User-Agent` of this test's own clients.
const TEST_AGENT: &str = "requests-test";
/// The `User-Agent` of the simulated CKEs' clients.
const CKE_AGENT: &str = "requests-test-cke";

/// A client of `server` that names itself `agent` (a `User-Agent` the emulator counts by).
fn named(server: &ApiServer, agent: &'static str) -> Client {
    let mut config = server.client_config();
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(agent)));
    Client::try_from(config).unwrap()
}

/// The hub's management client, as `run` identifies it, whose every request is also counted in
/// `tally` as it is sent.
fn counted(server: &ApiServer, tally: &Tally) -> Client {
    let tally = tally.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        tally.record(req.method(), req.uri().path(), req.uri().query().unwrap_or_default());
        req
    });
    let mut config = server.client_config();
    operator::infra::identify(&mut config);
    ClientBuilder::try_from(config).unwrap().with_layer(&layer).build()
}

fn minus(a: &Counts, b: &Counts) -> Counts {
    let mut out = a.clone();
    for (k, n) in b {
        let e = out.entry(k.clone()).or_insert(0);
        *e = e.checked_sub(*n).unwrap_or_else(|| panic!("{k:?}: {n} before, {e} after: a count went down"));
    }
    out.retain(|_, n| *n > 0);
    out
}

fn sum(c: &Counts) -> u64 {
    c.values().sum()
}

/// The world, with the hub's own count of its management requests.
struct Counted {
    mgmt: ApiServer,
    clusters: Vec<ApiServer>,
    hub_mgmt: Tally,
}

impl Counted {
    /// Requests the hub made, by side, since the start, as the emulators counted them.
    fn hub(&self) -> (Counts, Counts) {
        let mgmt = self.mgmt.requests().snapshot_of(operator::infra::USER_AGENT);
        let mut workload = Counts::new();
        for server in &self.clusters {
            for (k, n) in server.requests().snapshot_of(operator::infra::USER_AGENT) {
                *workload.entry(k).or_insert(0) += n;
            }
        }
        (mgmt, workload)
    }

    /// Requests from a client that is neither the hub's, this test's nor a simulated CKE's, by
    /// server: a hub client that does not name itself would hide its requests from [`Counted::hub`].
    fn unnamed(&self) -> Vec<(String, BTreeMap<String, u64>)> {
        let known = [operator::infra::USER_AGENT, TEST_AGENT, CKE_AGENT];
        std::iter::once(("management", &self.mgmt))
            .chain(self.clusters.iter().map(|s| ("workload", s)))
            .map(|(side, server)| {
                let mut agents = server.requests().agents();
                agents.retain(|agent, _| !known.contains(&agent.as_str()));
                (side.to_string(), agents)
            })
            .filter(|(_, agents)| !agents.is_empty())
            .collect()
    }
}

fn print(title: &str, c: &Counts, nodes: u64) {
    println!("{title}: {} requests, {:.2} per node", sum(c), sum(c) as f64 / nodes as f64);
    for ((verb, resource), n) in c {
        let resource = if resource.is_empty() { "(non-resource)" } else { resource };
        println!("  {verb:<8} {resource:<32} {n:>5}  {:>6.2} per node", *n as f64 / nodes as f64);
    }
}

/// The NodeClaims of every cluster's namespace that are Initialized.
async fn initialized(mgmt: &Client) -> usize {
    let claims = Api::<NodeClaim>::all(mgmt.clone()).list(&ListParams::default()).await.map(|l| l.items);
    claims
        .unwrap_or_default()
        .iter()
        .filter(|c| c.status.as_ref().is_some_and(|s| is_true(&s.conditions, "Initialized")))
        .count()
}

fn is_true(conditions: &[crds::common::Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

async fn running(client: &Client) -> usize {
    let pods = Api::<Pod>::namespaced(client.clone(), "default").list(&ListParams::default()).await;
    pods.map(|l| {
        l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
    })
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_costs_at_most_the_budget_of_hub_requests_per_node() {
    let stop = CancellationToken::new();
    let mgmt = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let hub_mgmt = Tally::default();
    let admin = named(&mgmt, TEST_AGENT);
    let mut clusters = Vec::new();
    let mut workload_clients = Vec::new();
    for i in 0..CLUSTERS {
        let (ns, name) = (format!("team-{i}"), format!("cluster-{i}"));
        let server = ApiServer::start(ApiServerConfig::workload(&name).with_seed(i as u64 + 1)).await.unwrap();
        let cke = named(&server, CKE_AGENT);
        let config = SimCkeConfig { seed: i as u64, ..operator::commands::sandbox::world::quick_cke(i as u64) };
        let cke_stop = stop.clone();
        tokio::spawn(async move { sim::cke::run(cke, config, cke_stop.cancelled_owned()).await });
        manifests::ensure_namespace(&admin, &ns).await.unwrap();
        let kubeconfig = serde_json::to_vec(&server.kubeconfig()).unwrap();
        register_cluster::write_secret(&admin, &ns, &name, kubeconfig).await.unwrap();
        for mut doc in manifests::documents("general-purpose.yaml", EXAMPLE).unwrap() {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(name.clone());
            }
            manifests::apply_value(&admin, &doc, &ns, "general-purpose.yaml").await.unwrap();
        }
        workload_clients.push(named(&server, TEST_AGENT));
        clusters.push(server);
    }
    let world = Counted { mgmt, clusters, hub_mgmt: hub_mgmt.clone() };
    // The hub as `run` starts it, the registry probing as in the other emulator tests.
    let registry_settings = registry::Settings {
        probe_interval: Duration::from_secs(2),
        probe_timeout: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(5),
        ..registry::Settings::default()
    };
    let hub_client = counted(&world.mgmt, &hub_mgmt);
    let hub_stop = stop.clone();
    let metrics = Arc::new(Metrics::new());
    tokio::spawn(async move {
        run::run_with(hub_client, hub::Settings::default(), registry_settings, metrics, hub_stop).await
    });
    // Start-up is not provisioning: wait until every pool is Ready and the hub is quiet.
    wait_for("every NodePool Ready", Duration::from_secs(60), || async {
        let pools = Api::<crds::NodePool>::all(admin.clone()).list(&ListParams::default()).await;
        pools.is_ok_and(|l| {
            l.items.len() == CLUSTERS
                && l.items.iter().all(|p| p.status.as_ref().is_some_and(|s| is_true(&s.conditions, "Ready")))
        })
    })
    .await;
    let no_probes = |c: Counts| -> Counts { c.into_iter().filter(|((_, r), _)| !r.is_empty()).collect() };
    let quiet_hub = || async { (no_probes(world.hub().0), no_probes(world.hub().1)) };
    let (mgmt_before, workload_before) =
        wait_quiet("start-up", Duration::from_secs(60), Duration::from_secs(3), quiet_hub).await;
    let (mgmt_all_before, workload_all_before) = world.hub();

    // The burst: PODS pending pods in every cluster at once.
    for client in &workload_clients {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        for k in 0..PODS {
            pods.create(&PostParams::default(), &workload_pod(&format!("web-{k}"), "500m", "1Gi")).await.unwrap();
        }
    }
    for (i, client) in workload_clients.iter().enumerate() {
        wait_for(&format!("cluster-{i}: pods running"), Duration::from_secs(90), || async {
            running(client).await == PODS
        })
        .await;
    }
    wait_for("every claim Initialized", Duration::from_secs(30), || async { initialized(&admin).await >= CLUSTERS })
        .await;
    // Trailing writes (lastPodEventTime is written at most every 10 s, POD_EVENT_DEDUPE): the hub
    // must have been quiet for longer than that.
    let (mgmt_after, workload_after) =
        wait_quiet("after provisioning", Duration::from_secs(90), Duration::from_secs(12), quiet_hub).await;
    let (mgmt_all_after, workload_all_after) = world.hub();

    let claims = Api::<NodeClaim>::all(admin.clone()).list(&ListParams::default()).await.unwrap().items;
    let nodes = claims.len() as u64;
    assert_eq!(
        nodes,
        CLUSTERS as u64,
        "one node per cluster: {:?}",
        claims.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let mgmt = minus(&mgmt_after, &mgmt_before);
    let workload = minus(&workload_after, &workload_before);
    // The health probe (`/version`, every 2 s here, 10 s in production) costs time, not nodes.
    let probes = sum(&minus(&mgmt_all_after, &mgmt_all_before))
        + sum(&minus(&workload_all_after, &workload_all_before))
        - sum(&mgmt)
        - sum(&workload);
    println!(
        "hub requests while provisioning {nodes} nodes ({CLUSTERS} clusters, {PODS} pods each; health probes left out: {probes}):"
    );
    print("management", &mgmt, nodes);
    print("workload", &workload, nodes);
    let per_node = (sum(&mgmt) + sum(&workload)) as f64 / nodes as f64;
    println!("total: {per_node:.2} per node (budget {BUDGET_PER_NODE})");
    // The accounting itself: the hub's own management client agrees with the difference.
    assert_eq!(
        no_probes(world.hub_mgmt.snapshot()),
        no_probes(world.hub().0),
        "the hub's management requests as its client sent them and as the emulator served them"
    );
    assert_eq!(world.unnamed(), Vec::new(), "requests from a client that did not name itself");
    assert!(per_node <= BUDGET_PER_NODE, "{per_node:.2} hub requests per node, budget {BUDGET_PER_NODE}");
    // Registration patches what the hub owns instead of replacing the Node (a replace conflicts
    // with the kubelet's own writes).
    assert_eq!(workload.get(&("update".to_string(), "nodes".to_string())), None, "a Node replaced");
    stop.cancel();
}
