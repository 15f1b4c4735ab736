//! B4 — Hub scale (docs/performance.md; targets in ../shared/spec/performance.md): one hub process
//! serving N simulated CKE workload clusters of 50 Ready nodes and 1,000 Running pods each.
//!
//! ```sh
//! cargo bench -p operator --bench hub_scale                           # smoke: 5 clusters, short windows
//! cargo bench -p operator --bench hub_scale -- --clusters 10,50,100 --idle-seconds 120
//! ```
//! Flags: `--clusters LIST` (default 5), `--idle-seconds S` (each idle window, default 15),
//! `--settle-seconds S` (wait after start-up and after provisioning, default 10), `--burst-pods K`
//! (pending pods per cluster in the latency burst, default 3), `--json` (one JSON object per N).
//! `B4_LOG=<filter>` shows the hub's and the emulators' logs on stderr (default `warn`).
//!
//! Three processes per N, so that the hub's memory is its own:
//! - the orchestrator (this binary without `B4_ROLE`) runs one hub process per N and prints the
//!   summary;
//! - the hub process (`B4_ROLE=hub`) runs `operator::commands::run::run_with` with the production defaults of
//!   `hub::Settings` and `registry::Settings` against the emulators, and reads its own `VmRSS`;
//! - the emulator process (`B4_ROLE=emulators`, a child of the hub process) serves the management
//!   emulator and N workload emulators, each played by a simulated CKE, and answers commands on
//!   stdin with one JSON line on stdout (`counters`, `waitpools`, `burst K`, `quit`).
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

/// Worker nodes per workload cluster: full with 20 pods each (50 at 1,000 pods).
fn nodes_per_cluster() -> usize {
    pods_per_cluster().div_ceil(20)
}
const EXAMPLE: &str = include_str!("../../examples/general-purpose.yaml");

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

// ------------------------------------------------------------------------------------------------
// Sharded run
// ------------------------------------------------------------------------------------------------

/// `--sharded N`: N clusters over `--replicas R` hub processes in sharded mode (production shard
/// timings), each process reporting its owned and connected clusters, RSS and CPU twice a second;
/// then one replica is killed with SIGKILL and the time until the survivors have connected every
/// cluster again is the hand-over; then a burst checks that every cluster provisions, with one
/// NodeGroup per NodeClaim (listed and paired at the end, not inferred from event counts). Per
/// phase: each replica's fences and the worst lag of its runtime (how late a 50 ms timer woke).
mod sharded {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug, Clone, Default)]
    struct Status {
        owned: f64,
        connected: usize,
        rss: f64,
        cpu: f64,
        /// Fences so far (`karpenter_hub_shard_handovers_total{direction="fenced"}`).
        fenced: u64,
        /// The worst scheduling delay of the replica's runtime since the phase began.
        lag_ms: u64,
    }

    /// Per replica: fences since the last call and the worst scheduling delay of its runtime
    /// (then reset); returns the fences of the phase, summed.
    fn phase(title: &str, statuses: &Mutex<Vec<Status>>, fenced_before: &mut [u64], live: &[usize]) -> (u64, u64) {
        let mut s = lock(statuses);
        let (mut fences, mut worst) = (0, 0);
        let mut parts = Vec::new();
        for r in live {
            let f = s[*r].fenced.saturating_sub(fenced_before[*r]);
            fenced_before[*r] = s[*r].fenced;
            parts.push(format!("replica {r}: {f} fences, runtime lag ≤ {} ms", s[*r].lag_ms));
            fences += f;
            worst = worst.max(s[*r].lag_ms);
            s[*r].lag_ms = 0;
        }
        println!("  {title}: {}", parts.join("; "));
        (fences, worst)
    }

    fn cluster_keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("team-{i:03}/cke-{i:03}")).collect()
    }

    pub fn orchestrate(n: usize, opts: &Options) {
        let replicas = opts.replicas;
        println!(
            "B4 sharded run: {n} clusters of {} Running pods over {replicas} hub processes (sharded mode, production timings)",
            opts.pods.unwrap_or(1000)
        );
        let dir = std::env::temp_dir().join(format!("b4-sharded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let exe = std::env::current_exe().expect("own executable");
        let mut emu = Command::new(&exe);
        emu.env("B4_ROLE", "emulators")
            .env("B4_CLUSTERS", n.to_string())
            .env("B4_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in opts.env() {
            emu.env(k, v);
        }
        let mut emu = emu.spawn().expect("start the emulator process");
        let mut emu_in = emu.stdin.take().expect("stdin");
        let mut emu_out = BufReader::new(emu.stdout.take().expect("stdout")).lines();
        let mut ask = |cmd: Option<&str>| -> Value {
            if let Some(cmd) = cmd {
                writeln!(emu_in, "{cmd}").expect("emulator stdin");
                emu_in.flush().expect("emulator stdin");
            }
            let line = emu_out.next().and_then(Result::ok).unwrap_or_default();
            serde_json::from_str(&line).unwrap_or(Value::Null)
        };
        let ready = ask(None);
        println!(
            "emulators: {n} workload clusters filled in {:.1} s ({} objects); emulator process RSS {:.0} MiB",
            f(&ready, "fill_s"),
            ready["objects"].as_u64().unwrap_or(0),
            f(&ready, "rss_mib")
        );
        let kubeconfig = ready["mgmt_kubeconfig"].as_str().unwrap_or_default().to_string();

        let statuses: Arc<Mutex<Vec<Status>>> = Arc::new(Mutex::new(vec![Status::default(); replicas]));
        let alive: Vec<Arc<AtomicBool>> = (0..replicas).map(|_| Arc::new(AtomicBool::new(true))).collect();
        let mut children = Vec::new();
        let t0 = Instant::now();
        for r in 0..replicas {
            let mut child = Command::new(&exe)
                .env("B4_ROLE", "replica")
                .env("B4_CLUSTERS", n.to_string())
                .env("B4_REPLICA", r.to_string())
                .env("B4_MGMT_KUBECONFIG", &kubeconfig)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start a replica");
            let out = child.stdout.take().expect("replica stdout");
            let (statuses, alive) = (statuses.clone(), alive[r].clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(j) = line.strip_prefix("B4_REPLICA ")
                        && let Ok(v) = serde_json::from_str::<Value>(j)
                    {
                        let mut s = lock(&statuses);
                        let lag_ms = s[r].lag_ms.max(v["lag_ms"].as_u64().unwrap_or(0));
                        s[r] = Status {
                            owned: f(&v, "owned"),
                            connected: v["connected"].as_u64().unwrap_or(0) as usize,
                            rss: f(&v, "rss_mib"),
                            cpu: f(&v, "cpu_s"),
                            fenced: v["fenced"].as_u64().unwrap_or(0),
                            lag_ms,
                        };
                    }
                }
                alive.store(false, Ordering::SeqCst);
            });
            children.push(child);
        }
        let wait_connected = |live: &[usize], limit: Duration| -> Option<Duration> {
            let start = Instant::now();
            loop {
                let connected: usize = {
                    let s = lock(&statuses);
                    live.iter().map(|r| s[*r].connected).sum()
                };
                if connected == n {
                    return Some(start.elapsed());
                }
                if start.elapsed() > limit {
                    println!("only {connected}/{n} clusters connected after {limit:?}");
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let all: Vec<usize> = (0..replicas).collect();
        let startup = wait_connected(&all, Duration::from_secs(900));
        let pools = ask(Some("waitpools"));
        println!(
            "start-up: every cluster connected by one replica in {:.1} s; every NodePool Ready {:.1} s after start ({})",
            startup.map_or(f64::NAN, |d| d.as_secs_f64()),
            t0.elapsed().as_secs_f64(),
            if pools["ok"].as_bool() == Some(true) { "all" } else { "NOT all" }
        );
        std::thread::sleep(Duration::from_secs(opts.settle_seconds));
        let before = lock(&statuses).clone();
        for (r, s) in before.iter().enumerate() {
            println!(
                "  replica {r}: owns {:.0} clusters, connected {}; RSS {:.0} MiB ({:.2} MiB per owned cluster); CPU {:.1} s",
                s.owned,
                s.connected,
                s.rss,
                s.rss / s.owned.max(1.0),
                s.cpu
            );
        }
        let mut fenced_before = vec![0u64; replicas];
        let (startup_fences, startup_lag) = phase("start-up and settle", &statuses, &mut fenced_before, &all);
        // Kill one replica as a node failure would: no release of its Leases.
        let victim = 0;
        let lost = before[victim].connected;
        let t_kill = Instant::now();
        children[victim].kill().expect("SIGKILL the replica");
        let _ = children[victim].wait();
        while alive[victim].load(Ordering::SeqCst) && t_kill.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        lock(&statuses)[victim] = Status::default();
        let survivors: Vec<usize> = (0..replicas).filter(|r| *r != victim).collect();
        let handover = wait_connected(&survivors, Duration::from_secs(300));
        println!(
            "hand-over: replica {victim} (owning {lost} clusters) killed with SIGKILL; the {} survivors connected every cluster {:.1} s later (shard Lease duration {} s)",
            survivors.len(),
            handover.map_or(f64::NAN, |d| d.as_secs_f64()),
            operator::decisions::sharding::Timings::DEFAULT.lease_duration.as_secs()
        );
        std::thread::sleep(Duration::from_secs(opts.settle_seconds));
        for r in &survivors {
            let s = lock(&statuses)[*r].clone();
            println!(
                "  replica {r}: owns {:.0} clusters, connected {}; RSS {:.0} MiB ({:.2} MiB per owned cluster)",
                s.owned,
                s.connected,
                s.rss,
                s.rss / s.owned.max(1.0)
            );
        }
        let (handover_fences, handover_lag) = phase("hand-over and settle", &statuses, &mut fenced_before, &survivors);
        let b = ask(Some(&format!("burst {}", opts.burst_pods)));
        let (burst_fences, burst_lag) = phase("burst", &statuses, &mut fenced_before, &survivors);
        let p = &b["pairing"];
        println!(
            "NodeGroups against NodeClaims after the burst (listed): at most {} live NodeGroup(s) per claim; {} NodeGroups without a live claim; {} claims without a NodeGroup; {} NodeGroups and {} claims added again under a name seen before; {} NodeGroups and {} claims deleted during the burst",
            p["max_nodegroups_per_claim"],
            p["nodegroups_without_claim"],
            p["claims_without_nodegroup"],
            p["nodegroups_readded"],
            p["claims_readded"],
            p["nodegroups_deleted"],
            p["claims_deleted"]
        );
        for c in p["clusters"].as_array().into_iter().flatten().take(20) {
            println!("  {c}");
        }
        let groups: Vec<i64> =
            b["nodegroups_per_cluster"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_i64).collect());
        let claims: Vec<i64> =
            b["claims_per_cluster"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_i64).collect());
        let without = groups.iter().filter(|g| **g == 0).count();
        let mismatched = groups.iter().zip(&claims).filter(|(g, c)| g != c).count();
        let rows = b["pods"].as_array().cloned().unwrap_or_default();
        let mut lat: Vec<f64> = rows.iter().filter_map(|r| Some(r.get(4)?.as_f64()? - r.get(2)?.as_f64()?)).collect();
        lat.sort_by(f64::total_cmp);
        let pct =
            |q: f64| lat.get(((lat.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
        println!(
            "burst after the hand-over: {} pending pods per cluster; {} NodeClaims, {} NodeGroups; clusters without a NodeGroup: {without}; clusters whose NodeGroups differ from their claims in number: {mismatched}; Unschedulable -> NodeGroup p50 {:.0} ms, p99 {:.0} ms",
            opts.burst_pods,
            claims.iter().sum::<i64>(),
            groups.iter().sum::<i64>(),
            pct(0.5),
            pct(0.99)
        );
        let result = json!({
            "bench": "hub_scale_sharded",
            "clusters": n,
            "replicas": replicas,
            "startup_s": startup.map(|d| d.as_secs_f64()),
            "rss_mib": before.iter().map(|s| s.rss).collect::<Vec<_>>(),
            "owned": before.iter().map(|s| s.owned).collect::<Vec<_>>(),
            "handover_s": handover.map(|d| d.as_secs_f64()),
            "killed_owned": lost,
            "clusters_without_nodegroup": without,
            "clusters_mismatched": mismatched,
            "latency_p50_ms": pct(0.5),
            "latency_p99_ms": pct(0.99),
            "fences": {"startup": startup_fences, "handover": handover_fences, "burst": burst_fences},
            "runtime_lag_ms": {"startup": startup_lag, "handover": handover_lag, "burst": burst_lag},
            "max_nodegroups_per_claim": p["max_nodegroups_per_claim"],
            "nodegroups_without_claim": p["nodegroups_without_claim"],
            "nodegroups_readded": p["nodegroups_readded"],
            "claims_readded": p["claims_readded"],
        });
        println!("B4_SHARDED {result}");
        let _ = ask(Some("quit"));
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = emu.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }

    pub fn replica_main() {
        let observed = Observed::default();
        init_tracing(&observed);
        let n = env_usize("B4_CLUSTERS").max(1);
        let r = env_usize("B4_REPLICA");
        let path = PathBuf::from(std::env::var("B4_MGMT_KUBECONFIG").unwrap_or_default());
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let config = run::management_config(Some(&path)).await.expect("management client configuration");
            let mgmt = Client::try_from(config.clone()).expect("management client");
            let metrics = Arc::new(metrics::Metrics::new());
            let shard = operator::infra::sharding::Settings::new(
                "default",
                "karpenter-hub",
                &format!("replica-{r}-{}", std::process::id()),
                operator::decisions::sharding::Timings::DEFAULT,
            )
            .with_lease_client(config);
            let shutdown = CancellationToken::new();
            {
                let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
                tokio::spawn(async move {
                    if let Err(e) = run::run_sharded_with(
                        mgmt,
                        hub::Settings::default(),
                        registry::Settings::default(),
                        shard,
                        true,
                        metrics,
                        shutdown,
                    )
                    .await
                    {
                        eprintln!("replica stopped: {e}");
                    }
                });
            }
            // The runtime's scheduling delay: how late a 50 ms sleep wakes, worst per report.
            let lag = Arc::new(std::sync::atomic::AtomicU64::new(0));
            tokio::spawn({
                let lag = lag.clone();
                async move {
                    loop {
                        let t = Instant::now();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let late = t.elapsed().saturating_sub(Duration::from_millis(50)).as_millis() as u64;
                        lag.fetch_max(late, Ordering::Relaxed);
                    }
                }
            });
            let keys = cluster_keys(n);
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let connected = keys
                    .iter()
                    .filter(|k| {
                        metrics.cluster_connected.get(&metrics::ClusterLabels { cluster: (*k).clone() }).get() == 1
                    })
                    .count();
                let owned = metric_value(&metrics, "karpenter_hub_shard_owned_clusters");
                let fenced = metrics
                    .shard_handovers
                    .get_or_create(&metrics::DirectionLabels { direction: "fenced".to_string() })
                    .get();
                let line = json!({
                    "owned": owned, "connected": connected, "rss_mib": rss_mib().0, "cpu_s": cpu_seconds(),
                    "fenced": fenced, "lag_ms": lag.swap(0, Ordering::Relaxed),
                });
                let mut out = std::io::stdout().lock();
                if writeln!(out, "B4_REPLICA {line}").and_then(|()| out.flush()).is_err() {
                    shutdown.cancel();
                    return;
                }
            }
        });
    }

    /// The sum of a family's samples in the rendered metrics.
    fn metric_value(metrics: &metrics::Metrics, name: &str) -> f64 {
        metrics
            .render()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let family = series.split('{').next()?;
                (family == name).then(|| value.parse::<f64>().ok()).flatten()
            })
            .sum()
    }
}

// ------------------------------------------------------------------------------------------------
// Hub process
// ------------------------------------------------------------------------------------------------

mod hub_process {
    use super::*;

    struct Emulators {
        child: std::process::Child,
        stdin: std::process::ChildStdin,
        lines: mpsc::UnboundedReceiver<String>,
    }

    impl Emulators {
        async fn reply(&mut self, timeout: Duration) -> Value {
            loop {
                let line = tokio::time::timeout(timeout, self.lines.recv())
                    .await
                    .expect("the emulator process answers in time")
                    .expect("the emulator process is alive");
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    return v;
                }
            }
        }

        fn send(&mut self, cmd: &str) {
            writeln!(self.stdin, "{cmd}").expect("write to the emulator process");
            self.stdin.flush().expect("flush");
        }

        async fn ask(&mut self, cmd: &str, timeout: Duration) -> Value {
            self.send(cmd);
            self.reply(timeout).await
        }

        /// The hub's requests since the emulators started, by side (served minus the emulator
        /// process's own), and both processes' CPU time.
        async fn snap(&mut self) -> Snap {
            let v = self.ask("counters", Duration::from_secs(60)).await;
            Snap {
                counts: sub(&counts_from_json(&v["served"]), &counts_from_json(&v["own"])),
                hub_cpu: cpu_seconds(),
                emu_cpu: f(&v, "cpu_s"),
            }
        }
    }

    struct Snap {
        counts: Counts,
        hub_cpu: f64,
        emu_cpu: f64,
    }

    impl Snap {
        /// (requests, hub CPU s, emulator CPU s) since `before`.
        fn since(&self, before: &Snap) -> (Counts, f64, f64) {
            (sub(&self.counts, &before.counts), self.hub_cpu - before.hub_cpu, self.emu_cpu - before.emu_cpu)
        }
    }

    /// Sum and count of the hub's scheduling-duration histogram, over every cluster.
    fn scheduling(metrics: &metrics::Metrics) -> (f64, f64) {
        let text = metrics.render();
        let total = |suffix: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(&format!("karpenter_provisioner_scheduling_duration_seconds_{suffix}")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (total("sum"), total("count"))
    }

    impl Emulators {}

    /// The hub's own view of its requests (from its kube-client spans), by side and detail.
    fn hub_view(observed: &Observed, mgmt_port: u16) -> BTreeMap<(String, Req), i64> {
        let mut out = BTreeMap::new();
        for ((port, req), n) in lock(&observed.0).iter() {
            let side = if *port == mgmt_port { "mgmt" } else { "workload" };
            *out.entry((side.to_string(), req.clone())).or_insert(0) += *n as i64;
        }
        out
    }

    fn view_sub(a: &BTreeMap<(String, Req), i64>, b: &BTreeMap<(String, Req), i64>) -> BTreeMap<(String, Req), i64> {
        let mut out = a.clone();
        for (k, n) in b {
            *out.entry(k.clone()).or_insert(0) -= n;
        }
        out.retain(|_, n| *n != 0);
        out
    }

    fn print_totals(title: &str, c: &Counts, clusters: usize) {
        let total: i64 = c.values().sum();
        println!(
            "{title}: {total} requests ({:.1} per cluster); by (side, verb, resource):",
            total as f64 / clusters as f64
        );
        for ((s, v, r), n) in c {
            let r = if r.is_empty() { "(non-resource)" } else { r.as_str() };
            println!("    {s:<9} {v:<7} {r:<28} {n:>7}  {:>9.1} per cluster", *n as f64 / clusters as f64);
        }
    }

    fn print_counts(title: &str, c: &Counts, seconds: f64, clusters: usize) {
        let total: i64 = c.values().sum();
        println!(
            "{title}: {total} requests in {seconds:.0} s = {:.1}/min ({:.2}/min per cluster); by (side, verb, resource):",
            total as f64 * 60.0 / seconds,
            total as f64 * 60.0 / seconds / clusters as f64
        );
        for ((s, v, r), n) in c {
            let r = if r.is_empty() { "(non-resource)" } else { r.as_str() };
            println!("    {s:<9} {v:<7} {r:<28} {n:>7}  {:>9.1}/min", *n as f64 * 60.0 / seconds);
        }
    }

    fn print_view(title: &str, v: &BTreeMap<(String, Req), i64>, counted: &Counts, seconds: f64) {
        let mut folded = Counts::new();
        for ((side, r), n) in v {
            *folded.entry((side.clone(), r.verb.clone(), r.resource.clone())).or_insert(0) += n;
        }
        let differ: i64 = sub(&folded, counted).values().map(|n| n.abs()).sum();
        let agree = if differ == 0 {
            "they agree with the emulator counters".to_string()
        } else {
            format!("{differ} requests differ from the emulator counters (requests in flight at a snapshot)")
        };
        println!("{title} (the hub's kube-client spans, with the path or selector; {agree}):");
        for ((side, r), n) in v {
            let res = if r.resource.is_empty() { "(non-resource)" } else { r.resource.as_str() };
            println!(
                "    {side:<9} {:<7} {res:<28} {:<52} {n:>7}  {:>9.1}/min",
                r.verb,
                r.detail,
                *n as f64 * 60.0 / seconds
            );
        }
    }

    fn percentile(sorted: &[f64], q: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn stats(mut v: Vec<f64>) -> (usize, f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        (v.len(), percentile(&v, 0.5), percentile(&v, 0.99), v.last().copied().unwrap_or(f64::NAN))
    }

    pub fn main() {
        let clusters = env_usize("B4_CLUSTERS").max(1);
        let opts = Options::from_env(clusters);
        let observed = Observed::default();
        init_tracing(&observed);
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        rt.block_on(run_hub(clusters, &opts, observed));
    }

    async fn run_hub(n: usize, opts: &Options, observed: Observed) {
        let dir = std::env::temp_dir().join(format!("b4-hub-scale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut child = Command::new(std::env::current_exe().expect("own executable"))
            .env("B4_ROLE", "emulators")
            .env("B4_CLUSTERS", n.to_string())
            .env("B4_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the emulator process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut emu = Emulators { child, stdin, lines };
        println!("\n--- N = {n} clusters: hub pid {}, emulator pid {} ---", std::process::id(), emu.child.id());
        let ready = emu.reply(Duration::from_secs(1800)).await;
        let mgmt_port = ready["mgmt_port"].as_u64().unwrap_or(0) as u16;
        let cluster_keys: Vec<String> = ready["clusters"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        println!(
            "emulators: {n} workload clusters filled in {:.1} s ({} objects, {:.0} writes/s); emulator process RSS {:.0} MiB",
            f(&ready, "fill_s"),
            ready["objects"].as_u64().unwrap_or(0),
            f(&ready, "writes_per_s"),
            f(&ready, "rss_mib")
        );
        let path = PathBuf::from(ready["mgmt_kubeconfig"].as_str().unwrap_or_default());
        let mgmt = run::management_client(Some(&path)).await.expect("management client");
        let c0 = emu.snap().await;
        let (rss_base, _) = rss_mib();

        // Start-up.
        let metrics = Arc::new(metrics::Metrics::new());
        let shutdown = CancellationToken::new();
        let t0 = Instant::now();
        let hub_task = {
            let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) =
                    run::run_with(mgmt, hub::Settings::default(), registry::Settings::default(), metrics, shutdown)
                        .await
                {
                    eprintln!("hub stopped: {e}");
                }
            })
        };
        emu.send("waitpools");
        let synced_at = loop {
            let connected = cluster_keys
                .iter()
                .filter(|k| metrics.cluster_connected.get(&metrics::ClusterLabels { cluster: (*k).clone() }).get() == 1)
                .count();
            if connected == cluster_keys.len() {
                break t0.elapsed();
            }
            if t0.elapsed() > Duration::from_secs(900) {
                println!("start-up: only {connected}/{n} clusters synced after 900 s");
                break t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let pools = emu.reply(Duration::from_secs(900)).await;
        let pools_ready_at = t0.elapsed();
        let (rss_started, _) = rss_mib();
        let c1 = emu.snap().await;
        println!(
            "start-up: all {n} clusters connected and synced (watch caches listed) in {:.2} s; all NodePools Ready (ClusterReachable) in {:.2} s{}",
            synced_at.as_secs_f64(),
            pools_ready_at.as_secs_f64(),
            if pools["ok"].as_bool() == Some(true) { String::new() } else { format!(" — NOT all: {pools}") }
        );
        let (startup, startup_hub_cpu, startup_emu_cpu) = c1.since(&c0);
        println!("start-up CPU: hub {startup_hub_cpu:.1} s, emulator process {startup_emu_cpu:.1} s");
        print_totals("start-up requests (hub, until every NodePool is Ready)", &startup, n);

        // Idle #1: the steady fleet, no hub-managed nodes.
        tokio::time::sleep(Duration::from_secs(opts.settle_seconds)).await;
        let c2 = emu.snap().await;
        let v2 = hub_view(&observed, mgmt_port);
        let idle_t = Instant::now();
        tokio::time::sleep(Duration::from_secs(opts.idle_seconds)).await;
        let c3 = emu.snap().await;
        let v3 = hub_view(&observed, mgmt_port);
        let idle_s = idle_t.elapsed().as_secs_f64();
        let (rss_idle, _) = rss_mib();
        let (idle, idle_hub_cpu, idle_emu_cpu) = c3.since(&c2);
        let idle_view = view_sub(&v3, &v2);
        println!(
            "\nidle #1 (steady fleet, no hub-managed node), {idle_s:.0} s starting {:.0} s after start-up:",
            opts.settle_seconds
        );
        println!("  CPU: hub {idle_hub_cpu:.2} s, emulator process {idle_emu_cpu:.2} s");
        print_counts("  hub requests (emulator counters minus the emulator process's own)", &idle, idle_s, n);
        print_view("  the same", &idle_view, &idle, idle_s);

        // Latency burst.
        let sched0 = scheduling(&metrics);
        let burst_t = Instant::now();
        let b = emu.ask(&format!("burst {}", opts.burst_pods), Duration::from_secs(900)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let c4 = emu.snap().await;
        let v4 = hub_view(&observed, mgmt_port);
        let burst_s = burst_t.elapsed().as_secs_f64();
        let (rss_burst, _) = rss_mib();
        let rows = b["pods"].as_array().cloned().unwrap_or_default();
        let lat = |a: usize, z: usize| -> Vec<f64> {
            rows.iter().filter_map(|r| Some(r.get(z)?.as_f64()? - r.get(a)?.as_f64()?)).collect::<Vec<f64>>()
        };
        // Row: [cluster, created, unschedulable, claim, nodegroup, running] in ms from the burst start.
        let ng = stats(lat(1, 4));
        let unsched = stats(lat(1, 2));
        let claim = stats(lat(2, 3));
        let launch = stats(lat(3, 4));
        let hub_share = stats(lat(2, 4));
        let running = stats(lat(1, 5));
        let created = stats(rows.iter().filter_map(|r| r.get(1)?.as_f64()).collect());
        let groups: i64 =
            b["nodegroups_per_cluster"].as_array().map_or(0, |a| a.iter().filter_map(Value::as_i64).sum());
        let claims: i64 = b["claims_per_cluster"].as_array().map_or(0, |a| a.iter().filter_map(Value::as_i64).sum());
        let without_group =
            b["nodegroups_per_cluster"].as_array().map_or(0, |a| a.iter().filter(|g| g.as_i64() == Some(0)).count());
        println!(
            "\nlatency burst: {} pending pods in each of the {n} clusters at once ({} pods; the creates took {:.0} ms); {claims} NodeClaims, {groups} NodeGroups{}",
            opts.burst_pods,
            rows.len(),
            created.3,
            if without_group > 0 { format!(", {without_group} clusters got NO NodeGroup") } else { String::new() }
        );
        println!("    {:<46} {:>6} {:>9} {:>9} {:>9}", "interval (ms)", "n", "p50", "p99", "max");
        for (name, s) in [
            ("pod created -> NodeGroup created (B4)", ng),
            ("pod created -> PodScheduled=False (sim binder)", unsched),
            ("Unschedulable -> NodeGroup created (hub)", hub_share),
            ("  Unschedulable -> NodeClaim created", claim),
            ("  NodeClaim -> NodeGroup created", launch),
            ("pod created -> Running (incl. simulated boot)", running),
        ] {
            println!("    {name:<46} {:>6} {:>9.0} {:>9.0} {:>9.0}", s.0, s.1, s.2, s.3);
        }
        let (prov, prov_hub_cpu, prov_emu_cpu) = c4.since(&c3);
        let sched1 = scheduling(&metrics);
        let (solve_s, rounds) = (sched1.0 - sched0.0, sched1.1 - sched0.1);
        println!(
            "    {rounds:.0} scheduling rounds solved ({:.1} per cluster), solver time {:.0} ms in all ({:.1} ms per round); CPU over the window: hub {prov_hub_cpu:.1} s, emulator process {prov_emu_cpu:.1} s",
            rounds / n as f64,
            solve_s * 1000.0,
            if rounds > 0.0 { solve_s * 1000.0 / rounds } else { f64::NAN }
        );
        let prov_view = view_sub(&v4, &v3);
        let prov_total: i64 = prov.values().sum();
        let idle_total: i64 = idle.values().sum();
        let expected_idle = idle_total as f64 * burst_s / idle_s;
        let per_node = if groups > 0 { (prov_total as f64 - expected_idle) / groups as f64 } else { f64::NAN };
        println!(
            "provisioning: {prov_total} hub requests from the burst to 10 s after every pod ran ({burst_s:.0} s; idle rate would give {expected_idle:.0}) = {per_node:.1} per provisioned node ({groups} nodes)"
        );
        print_counts("  hub requests during provisioning", &prov, burst_s, n);
        print_view("  the same", &prov_view, &prov, burst_s);

        // Idle #2: the same fleet plus one hub-managed node per cluster.
        tokio::time::sleep(Duration::from_secs(opts.settle_seconds)).await;
        let c5 = emu.snap().await;
        let v5 = hub_view(&observed, mgmt_port);
        let idle2_t = Instant::now();
        tokio::time::sleep(Duration::from_secs(opts.idle_seconds)).await;
        let c6 = emu.snap().await;
        let v6 = hub_view(&observed, mgmt_port);
        let idle2_s = idle2_t.elapsed().as_secs_f64();
        let (rss_end, rss_peak) = rss_mib();
        let (idle2, idle2_hub_cpu, idle2_emu_cpu) = c6.since(&c5);
        let idle2_view = view_sub(&v6, &v5);
        println!("\nidle #2 (the same fleet plus the {groups} hub-managed nodes of the burst), {idle2_s:.0} s:");
        println!("  CPU: hub {idle2_hub_cpu:.2} s, emulator process {idle2_emu_cpu:.2} s");
        print_counts("  hub requests", &idle2, idle2_s, n);
        print_view("  the same", &idle2_view, &idle2, idle2_s);

        shutdown.cancel();
        let _ = hub_task.await;

        let per_min =
            |c: &Counts, s: f64, pred: &dyn Fn(&str, &str, &str) -> bool| total_where(c, pred) as f64 * 60.0 / s;
        let is_write = |_: &str, v: &str, _: &str| WRITE_VERBS.contains(&v);
        let is_list = |_: &str, v: &str, _: &str| v == "list";
        let full_lists = |v: &BTreeMap<(String, Req), i64>, s: f64| {
            v.iter().filter(|((_, r), _)| r.verb == "list" && r.detail == "full").map(|(_, n)| n).sum::<i64>() as f64
                * 60.0
                / s
        };
        println!(
            "\nN={n}: hub RSS {rss_base:.1} MiB before start, {rss_started:.1} after start-up, {rss_idle:.1} idle, {rss_burst:.1} after the burst, {rss_end:.1} at the end, peak {rss_peak:.1} (VmHWM); ({rss_idle:.1} - {rss_base:.1}) / {n} = {:.2} MiB per cluster",
            (rss_idle - rss_base) / n as f64
        );
        println!(
            "N={n}: idle #1 per minute: {:.1} writes, {:.1} LISTs ({:.1} full), {:.1} requests in all; idle #2: {:.1} writes, {:.1} LISTs ({:.1} full), {:.1} in all",
            per_min(&idle, idle_s, &is_write),
            per_min(&idle, idle_s, &is_list),
            full_lists(&idle_view, idle_s),
            idle_total as f64 * 60.0 / idle_s,
            per_min(&idle2, idle2_s, &is_write),
            per_min(&idle2, idle2_s, &is_list),
            full_lists(&idle2_view, idle2_s),
            idle2.values().sum::<i64>() as f64 * 60.0 / idle2_s,
        );
        let result = json!({
            "bench": "hub_scale",
            "clusters": n,
            "rss_base_mib": rss_base,
            "rss_started_mib": rss_started,
            "rss_idle_mib": rss_idle,
            "rss_burst_mib": rss_burst,
            "rss_end_mib": rss_end,
            "rss_peak_mib": rss_peak,
            "rss_per_cluster_mib": (rss_idle - rss_base) / n as f64,
            "startup_synced_s": synced_at.as_secs_f64(),
            "startup_pools_ready_s": pools_ready_at.as_secs_f64(),
            "startup_requests": startup.values().sum::<i64>(),
            "startup_hub_cpu_s": startup_hub_cpu,
            "idle_hub_cpu_s": idle_hub_cpu,
            "idle2_hub_cpu_s": idle2_hub_cpu,
            "provisioning_hub_cpu_s": prov_hub_cpu,
            "provisioning_emulator_cpu_s": prov_emu_cpu,
            "scheduling_rounds": rounds,
            "solver_ms": solve_s * 1000.0,
            "idle_seconds": idle_s,
            "idle_writes_per_min": per_min(&idle, idle_s, &is_write),
            "idle_lists_per_min": per_min(&idle, idle_s, &is_list),
            "idle_full_lists_per_min": full_lists(&idle_view, idle_s),
            "idle_requests_per_min": idle_total as f64 * 60.0 / idle_s,
            "idle2_writes_per_min": per_min(&idle2, idle2_s, &is_write),
            "idle2_lists_per_min": per_min(&idle2, idle2_s, &is_list),
            "idle2_full_lists_per_min": full_lists(&idle2_view, idle2_s),
            "idle2_requests_per_min": idle2.values().sum::<i64>() as f64 * 60.0 / idle2_s,
            "idle": counts_to_json(&idle),
            "idle2": counts_to_json(&idle2),
            "burst_pods": rows.len(),
            "nodegroups": groups,
            "nodeclaims": claims,
            "clusters_without_nodegroup": without_group,
            "latency_ng_p50_ms": ng.1,
            "latency_ng_p99_ms": ng.2,
            "latency_ng_max_ms": ng.3,
            "latency_unschedulable_ng_p50_ms": hub_share.1,
            "latency_unschedulable_ng_p99_ms": hub_share.2,
            "latency_unschedulable_ng_max_ms": hub_share.3,
            "latency_binder_p99_ms": unsched.2,
            "latency_claim_p99_ms": claim.2,
            "latency_launch_p99_ms": launch.2,
            "requests_per_node": per_node,
            "provisioning": counts_to_json(&prov),
        });
        println!("B4_RESULT {result}");
        let _ = emu.ask("quit", Duration::from_secs(60)).await;
        let _ = emu.child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        // Tasks of the stopped hub may still be retrying against the emulators that just left.
        std::process::exit(0);
    }
}

// ------------------------------------------------------------------------------------------------
// Emulator process
// ------------------------------------------------------------------------------------------------

mod emulators {
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
        secret.data =
            Some(BTreeMap::from([(registry::KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(kubeconfig))]));
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
                Some("quit") | None => break,
                Some(other) => reply(&json!({"error": format!("unknown command {other}")})),
            }
        }
        stop.cancel();
        reply(&json!({"bye": true}));
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
            cs.iter().any(|c| {
                c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
            })
        })
    }

    /// `k` pending pods in every cluster at once; times of each step, from watches opened before.
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
        for (i, c) in world.clusters.iter().enumerate() {
            let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
            let mut stream = pods.watch(&wp.clone().labels("bench=burst"), "0").await.unwrap().boxed();
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
            let mut stream = groups.watch(&wp, "0").await.unwrap().boxed();
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
                    api.create(&PostParams::default(), &burst_pod(j)).await.unwrap();
                    (i, format!("burst-{j}"), Instant::now())
                }));
            }
        }
        let mut created = Vec::new();
        for c in creates {
            created.push(c.await.unwrap());
        }
        let deadline = t0 + Duration::from_secs(300);
        loop {
            {
                let s = lock(&seen);
                if s.groups.iter().all(|g| !g.is_empty()) && s.running.len() == created.len() {
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
        let rows: Vec<Value> = created
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
            "nodegroups_per_cluster": s.groups.iter().map(Vec::len).collect::<Vec<_>>(),
            "claims_per_cluster": s.claims.iter().map(Vec::len).collect::<Vec<_>>(),
            "pairing": pairing,
        })
    }

    /// NodeGroups against NodeClaims at the end of the burst, read from the clusters (not inferred
    /// from event counts): the most live NodeGroups naming one claim (2 or more is a duplicate),
    /// live NodeGroups whose claim is gone, live claims without a NodeGroup, and, from the
    /// watches, NodeGroups or claims added again under a name already seen (a re-creation) and
    /// deletions; with the clusters where anything differs.
    async fn pairing(
        world: &World,
        group_events: &[Vec<(char, String)>],
        claim_events: &[Vec<(char, String)>],
    ) -> Value {
        let claims = Api::<NodeClaim>::all(world.mgmt_client.clone()).list(&ListParams::default()).await;
        let claims = claims.map(|l| l.items).unwrap_or_default();
        let (mut max_per_claim, mut orphans, mut unlaunched, mut regroups, mut reclaims) = (0usize, 0, 0, 0, 0);
        let (mut group_deletes, mut claim_deletes) = (0, 0);
        let mut odd = Vec::new();
        for (i, c) in world.clusters.iter().enumerate() {
            let live: Vec<NodeGroup> = Api::<NodeGroup>::all(c.client.clone())
                .list(&ListParams::default())
                .await
                .map_or(Vec::new(), |l| l.items);
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
                    (!live_claims.contains(claim))
                        .then(|| format!("{} (claim {claim}, created {created})", g.name_any()))
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
}
