//! B4 — Hub scale (docs/performance.md; targets in ../shared/spec/performance.md): one hub process
//! serving N simulated CKE workload clusters of 50 Ready nodes and 1,000 Running pods each.
//!
//! ```sh
//! cargo bench -p operator --bench hub_scale                           # smoke: 5 clusters, short windows
//! cargo bench -p operator --bench hub_scale -- --clusters 10,50,100 --idle-seconds 120
//! ```
//! Flags: `--clusters LIST` (default 5), `--idle-seconds S` (each idle window, default 15),
//! `--settle-seconds S` (wait after start-up and after provisioning, default 10), `--burst-pods K`
//! (pending pods per cluster in the latency burst, default 3), `--pods-per-cluster P` (default
//! 1,000), `--pods-per-node Q` (default 20), `--json` (one JSON object per N).
//! `B4_LOG=<filter>` shows the hub's and the emulators' logs on stderr (default `warn`).
//!
//! Three processes per N, so that the hub's memory is its own:
//! - the orchestrator (this binary without `B4_ROLE`) runs one hub process per N and prints the
//!   summary;
//! - the hub process (`B4_ROLE=hub`) runs `operator::commands::run::run_with` with the production defaults of
//!   `hub::Settings` and `registry::Settings` against the emulators, and reads its own `VmRSS`;
//! - the emulator process (`B4_ROLE=emulators`, a child of the hub process) serves the management
//!   emulator and N workload emulators, each played by a simulated CKE, and answers commands on
//!   stdin with one JSON line on stdout (`counters`, `waitpools`, `burst K`, `audit`, `quit`).
//!
//! Who made a request: the emulators count every request they serve, by verb and resource. The
//! emulator process also counts, from kube-client's `HTTP` spans, the requests its own clients made
//! (the simulated CKEs and the benchmark's set-up, watches and polls); the hub's requests are the
//! difference, exactly. The hub process counts its own requests from the same spans with the query
//! string (label selectors), which tells a full LIST from a selected one; both views are printed,
//! and whether they agree.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![recursion_limit = "256"]

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};
use sim::{
    apiserver::{ApiServer, ApiServerConfig},
    cke::{DelayRange, SimCkeConfig, SimFlavor, objects},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::{Layer, filter::filter_fn, layer::SubscriberExt, util::SubscriberInitExt};

use crds::{NodeClaim, NodeGroup, NodePool};
use operator::{
    commands::run, commands::sandbox::world as sandbox, decisions::conditions, infra::hub, infra::manifests,
    infra::metrics, infra::registry,
};

/// Running pods per workload cluster (`--pods-per-cluster`, default 1,000), 20 per node.
fn pods_per_cluster() -> usize {
    std::env::var("B4_PODS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(1000)
}

/// Running pods per worker node (`--pods-per-node`, default 20: the M nodes full).
fn pods_per_node() -> usize {
    std::env::var("B4_PODS_PER_NODE").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(20).min(20)
}

/// Worker nodes per workload cluster (50 at 1,000 pods, 20 per node).
fn nodes_per_cluster() -> usize {
    pods_per_cluster().div_ceil(pods_per_node())
}
const EXAMPLE: &str = include_str!("../../../examples/general-purpose.yaml");

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn main() {
    match std::env::var("B4_ROLE").as_deref() {
        Ok("emulators") => emulators::main(),
        Ok("hub") => hub_process::main(),
        Ok("replica") => sharded::replica_main(),
        _ => match Options::parse().sharded {
            Some(n) => sharded::orchestrate(n, &Options::parse()),
            None => orchestrate(),
        },
    }
}

// ------------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Options {
    clusters: Vec<usize>,
    idle_seconds: u64,
    settle_seconds: u64,
    burst_pods: usize,
    json: bool,
    /// `--sharded N`: the sharded run (N clusters over `replicas` hub processes) instead of B4.
    sharded: Option<usize>,
    replicas: usize,
    /// `--pods-per-cluster P` (default 1,000).
    pods: Option<usize>,
    /// `--pods-per-node Q` (default 20, at most 20).
    pods_per_node: Option<usize>,
}

impl Options {
    fn parse() -> Options {
        let mut o = Options {
            clusters: vec![5],
            idle_seconds: 15,
            settle_seconds: 10,
            burst_pods: 3,
            json: false,
            sharded: None,
            replicas: 3,
            pods: None,
            pods_per_node: None,
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let value = args.get(i + 1).cloned().unwrap_or_default();
            match args[i].as_str() {
                "--clusters" => {
                    o.clusters = value.split(',').filter_map(|s| s.trim().parse().ok()).filter(|n| *n > 0).collect();
                    i += 1;
                }
                "--idle-seconds" => {
                    o.idle_seconds = value.parse().unwrap_or(o.idle_seconds);
                    i += 1;
                }
                "--settle-seconds" => {
                    o.settle_seconds = value.parse().unwrap_or(o.settle_seconds);
                    i += 1;
                }
                "--burst-pods" => {
                    o.burst_pods = value.parse().unwrap_or(o.burst_pods).max(1);
                    i += 1;
                }
                "--json" => o.json = true,
                "--sharded" => {
                    o.sharded = value.parse().ok().filter(|n| *n > 0);
                    i += 1;
                }
                "--replicas" => {
                    o.replicas = value.parse().unwrap_or(o.replicas).max(2);
                    i += 1;
                }
                "--pods-per-cluster" => {
                    o.pods = value.parse().ok().filter(|n| *n > 0);
                    i += 1;
                }
                "--pods-per-node" => {
                    o.pods_per_node = value.parse().ok().filter(|n| (1..=20).contains(n));
                    i += 1;
                }
                // `cargo bench` adds `--bench`; anything else is ignored.
                _ => {}
            }
            i += 1;
        }
        if o.clusters.is_empty() {
            o.clusters = vec![5];
        }
        o
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("B4_IDLE_SECONDS", self.idle_seconds.to_string()),
            ("B4_SETTLE_SECONDS", self.settle_seconds.to_string()),
            ("B4_BURST_PODS", self.burst_pods.to_string()),
        ];
        if let Some(p) = self.pods {
            env.push(("B4_PODS", p.to_string()));
        }
        if let Some(q) = self.pods_per_node {
            env.push(("B4_PODS_PER_NODE", q.to_string()));
        }
        env
    }

    fn from_env(clusters: usize) -> Options {
        let get = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        Options {
            clusters: vec![clusters],
            idle_seconds: get("B4_IDLE_SECONDS", 15),
            settle_seconds: get("B4_SETTLE_SECONDS", 10),
            burst_pods: get("B4_BURST_PODS", 3) as usize,
            json: false,
            sharded: None,
            replicas: 3,
            pods: None,
            pods_per_node: None,
        }
    }
}

fn env_usize(k: &str) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// (VmRSS, VmHWM) of this process in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system) of this process, in seconds (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn init_tracing(observed: &Observed) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("B4_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let counting = CountLayer(observed.clone()).with_filter(
        filter_fn(|m| m.is_span() && m.name() == "HTTP" && m.target().starts_with("kube_client"))
            .with_max_level_hint(tracing::Level::DEBUG),
    );
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    tracing_subscriber::registry().with(counting).with(fmt).init();
}

// ------------------------------------------------------------------------------------------------
// Requests: the emulator's classification (verb, resource), from a client span's method and URL
// ------------------------------------------------------------------------------------------------

/// A request as the emulator counts it (`verb`, `resource`), plus what the counter cannot show:
/// the path of non-resource requests and the selectors of LISTs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Req {
    verb: String,
    resource: String,
    detail: String,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The port a request went to and the request, classified exactly as `sim::apiserver` counts it.
fn classify(method: &str, url: &str) -> (u16, Req) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (authority, path_query) = rest.split_once('/').unwrap_or((rest, ""));
    let port = authority.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0);
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), percent_decode(v))
        })
        .collect();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let resource_rest: Option<&[&str]> = match segs.as_slice() {
        ["api", _, rest @ ..] if !rest.is_empty() => Some(rest),
        ["apis", _, _, rest @ ..] if !rest.is_empty() => Some(rest),
        _ => None,
    };
    let non_resource = || Req { verb: "get".into(), resource: String::new(), detail: format!("/{path}") };
    let Some(rest) = resource_rest else { return (port, non_resource()) };
    let (legacy_watch, rest) = match rest.first() {
        Some(&"watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    let rest = if rest.len() >= 3 && rest[0] == "namespaces" { &rest[2..] } else { rest };
    if rest.is_empty() || rest.len() > 3 {
        return (port, non_resource());
    }
    let watch = legacy_watch || params.get("watch").is_some_and(|v| v == "true" || v == "1");
    let named = rest.len() >= 2;
    let verb = match method {
        "GET" if watch => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if named => "delete",
        "DELETE" => "deletecollection",
        _ => "unknown",
    };
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    let selectors: Vec<String> = ["labelSelector", "fieldSelector"]
        .iter()
        .filter_map(|k| params.get(*k).filter(|v| !v.is_empty()).map(|v| format!("{k}={}", generic_name(v))))
        .collect();
    let detail = match verb {
        "list" if selectors.is_empty() => "full".to_string(),
        "list" | "watch" => selectors.join(","),
        _ => String::new(),
    };
    (port, Req { verb: verb.into(), resource, detail })
}

/// `metadata.name=<one object>` selectors (a watch for one object) folded into one row.
fn generic_name(selector: &str) -> String {
    selector
        .split(',')
        .map(|term| match term.split_once("metadata.name=") {
            Some((pre, _)) => format!("{pre}metadata.name=<name>"),
            None => term.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Requests made by this process's kube clients, by port and request.
#[derive(Clone, Default)]
struct Observed(Arc<Mutex<BTreeMap<(u16, Req), u64>>>);

struct CountLayer(Observed);

#[derive(Default)]
struct HttpFields {
    method: Option<String>,
    url: Option<String>,
}

impl tracing::field::Visit for HttpFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "http.method" => self.method = Some(format!("{value:?}")),
            "http.url" => self.url = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for CountLayer {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut f = HttpFields::default();
        attrs.record(&mut f);
        if let (Some(m), Some(u)) = (f.method, f.url) {
            *lock(&self.0.0).entry(classify(&m, &u)).or_insert(0) += 1;
        }
    }
}

/// Counts by (side, verb, resource) where side is `mgmt` or `workload`.
type Counts = BTreeMap<(String, String, String), i64>;

fn counts_to_json(c: &Counts) -> Value {
    Value::Array(c.iter().map(|((s, v, r), n)| json!([s, v, r, n])).collect())
}

fn counts_from_json(v: &Value) -> Counts {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    Some((
                        (e[0].as_str()?.to_string(), e[1].as_str()?.to_string(), e[2].as_str()?.to_string()),
                        e[3].as_i64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn sub(a: &Counts, b: &Counts) -> Counts {
    let mut out = a.clone();
    for (k, n) in b {
        *out.entry(k.clone()).or_insert(0) -= n;
    }
    out.retain(|_, n| *n != 0);
    out
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

fn total_where(c: &Counts, f: impl Fn(&str, &str, &str) -> bool) -> i64 {
    c.iter().filter(|((s, v, r), _)| f(s, v, r)).map(|(_, n)| n).sum()
}

// ------------------------------------------------------------------------------------------------
// Orchestrator
// ------------------------------------------------------------------------------------------------

fn orchestrate() {
    let opts = Options::parse();
    println!(
        "B4 hub scale: clusters {:?}, each 50 Ready nodes + 1,000 Running pods; idle windows {} s, settle {} s, {} pending pods per cluster in the burst",
        opts.clusters, opts.idle_seconds, opts.settle_seconds, opts.burst_pods
    );
    typed_pod_footprint();
    let exe = std::env::current_exe().expect("own executable");
    let mut results: Vec<Value> = Vec::new();
    for &n in &opts.clusters {
        let mut cmd = Command::new(&exe);
        cmd.env("B4_ROLE", "hub").env("B4_CLUSTERS", n.to_string()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (k, v) in opts.env() {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the hub process");
        let stdout = child.stdout.take().expect("hub stdout");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match line.strip_prefix("B4_RESULT ") {
                Some(j) => {
                    if let Ok(v) = serde_json::from_str::<Value>(j) {
                        results.push(v);
                    }
                }
                None => println!("{line}"),
            }
        }
        let status = child.wait().expect("hub process");
        if !status.success() {
            eprintln!("the hub process for N={n} failed: {status}");
        }
    }
    summary(&results);
    if opts.json {
        for r in &results {
            println!("{r}");
        }
    }
}

/// What one cached pod of the benchmark's shape costs as a `k8s_openapi` `Pod` (the type the hub's
/// watch caches hold), measured in this process (which holds nothing else).
fn typed_pod_footprint() {
    const COUNT: usize = 20_000;
    let clock = sim::clock::Clock::real();
    let texts: Vec<String> = (0..COUNT)
        .map(|i| {
            let mut pod = emulators::pod(i);
            pod.metadata.uid = Some(format!("{i:08x}-0000-4000-8000-000000000000"));
            pod.metadata.resource_version = Some((1000 + i).to_string());
            let status = objects::pod_running_status(&pod, "10.0.0.1", "10.1.0.1", clock.now());
            pod.status = serde_json::from_value(status).ok();
            serde_json::to_string(&pod).unwrap()
        })
        .collect();
    let json_bytes: usize = texts.iter().map(String::len).sum();
    // As the hub's pod cache holds them (first, while the heap is fresh): decoded into the
    // projection, specs shared within a cluster (one table per 1,000 pods, as per cluster in B4).
    let before = rss_mib().0;
    let mut specs = operator::infra::registry::specs::SpecTable::default();
    let projected: Vec<Arc<scheduling::CompactPod>> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if i % pods_per_cluster() == 0 {
                specs = Default::default();
            }
            let mut pod: scheduling::CompactPod = serde_json::from_str(t).unwrap();
            pod.spec = pod.spec.map(|s| specs.intern(s));
            Arc::new(pod)
        })
        .collect();
    let cached = rss_mib().0;
    // The worst case for sharing: every pod's spec its own (StatefulSet claims, bare pods).
    let unshared: Vec<Arc<scheduling::CompactPod>> =
        texts.iter().map(|t| Arc::new(serde_json::from_str(t).unwrap())).collect();
    let cached_unshared = rss_mib().0;
    let pods: Vec<Arc<Pod>> = texts.iter().map(|t| Arc::new(serde_json::from_str(t).unwrap())).collect();
    let after = rss_mib().0;
    println!(
        "one pod of this shape: {:.1} KiB as JSON, {:.1} KiB as a decoded k8s_openapi Pod, {:.1} KiB as the hub caches it (CompactPod, {} specs per {} pods), {:.1} KiB with no spec shared ({COUNT} of each decoded here; size_of::<Pod>() = {} B, size_of::<Container>() = {} B, size_of::<CompactPod>() = {} B)",
        json_bytes as f64 / COUNT as f64 / 1024.0,
        (after - cached_unshared) * 1024.0 / pods.len() as f64,
        (cached - before) * 1024.0 / projected.len() as f64,
        specs.len(),
        pods_per_cluster(),
        (cached_unshared - cached) * 1024.0 / unshared.len() as f64,
        std::mem::size_of::<Pod>(),
        std::mem::size_of::<k8s_openapi::api::core::v1::Container>(),
        std::mem::size_of::<scheduling::CompactPod>()
    );
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn summary(results: &[Value]) {
    if results.is_empty() {
        return;
    }
    println!("\n=== B4 summary (hub process only; emulators in a child process) ===");
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "N",
        "RSS base",
        "RSS idle",
        "RSS peak",
        "MiB/cl",
        "synced s",
        "ready s",
        "idle wr/min",
        "idle LIST/m",
        "lat p50 ms",
        "lat p99 ms",
        "lat max ms",
        "hub p99 ms",
        "req/node"
    );
    for r in results {
        println!(
            "{:>5} {:>10.1} {:>10.1} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>11.1} {:>11.1} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>9.1}",
            r["clusters"].as_u64().unwrap_or(0),
            f(r, "rss_base_mib"),
            f(r, "rss_idle_mib"),
            f(r, "rss_peak_mib"),
            f(r, "rss_per_cluster_mib"),
            f(r, "startup_synced_s"),
            f(r, "startup_pools_ready_s"),
            f(r, "idle_writes_per_min"),
            f(r, "idle_lists_per_min"),
            f(r, "latency_ng_p50_ms"),
            f(r, "latency_ng_p99_ms"),
            f(r, "latency_ng_max_ms"),
            f(r, "latency_unschedulable_ng_p99_ms"),
            f(r, "requests_per_node"),
        );
    }
    println!(
        "(RSS in MiB; MiB/cl = (idle - base) / N; synced = every cluster's watch caches listed; ready = every NodePool Ready; LIST/m = LISTs per minute, full or selected; lat = pod created -> NodeGroup created; hub = PodScheduled=False -> NodeGroup created)"
    );
    // Growth per added cluster: least-squares slope of the idle RSS against N.
    let pts: Vec<(f64, f64)> =
        results.iter().map(|r| (r["clusters"].as_f64().unwrap_or(0.0), f(r, "rss_idle_mib"))).collect();
    if pts.len() >= 2 {
        let n = pts.len() as f64;
        let (sx, sy) = pts.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let num: f64 = pts.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
        let den: f64 = pts.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
        if den > 0.0 {
            let slope = num / den;
            println!(
                "RSS growth per added cluster (least squares over N): {slope:.2} MiB; intercept {:.1} MiB",
                my - slope * mx
            );
        }
    }
}

// One file per process role: the sharded orchestration, the hub process, the emulator process.
mod emulators;
mod hub_process;
mod sharded;
