//! CapacityBuffer latency (issue 28 item 2; docs/performance.md, "CapacityBuffer latency"): how long
//! a burst of pods waits for room, without and with a buffer of the same size, on the simulated
//! world with sim-cke's default delays — CKE's measured typical ones (clever-cloud.md §1.5: a
//! verdict in about 1 s, the Node joins 25 s later and is Ready 5 s after that).
//!
//! ```sh
//! cargo bench -p operator --bench buffer_latency                       # 50 pods, CKE's delays
//! cargo bench -p operator --bench buffer_latency -- --pods 50 --join-seconds 60
//! ```
//! Flags: `--pods N` (burst size and buffer replicas, default 50), `--join-seconds S` (sim-cke's
//! node join delay, default 25: CKE's typical; the spec's range is 26–60 s, up to ~3 min),
//! `--cpu Q`, `--memory Q` (each pod's requests, default 500m and 512Mi), `--json`.
//!
//! One process: the real hub (`run_with`, production settings) and the emulators share the
//! machine, as in every emulator test. Each scenario starts a fresh world: one workload cluster, the
//! example NodePool without limits, an organisation quota far above the burst. With a buffer, the
//! burst starts once the buffer's room exists (`Provisioning=True`, every claim initialized); the
//! clock then runs from the moment the pods are created to the moment each is `Running`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crds::{CapacityBuffer, NodeClaim};
use k8s_openapi::api::core::v1::{Pod, PodTemplate};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use operator::commands::sandbox::world::{World, workload_pod};
use serde_json::{Value, json};
use sim::cke::{DelayRange, SimCkeConfig};

const EXAMPLE: &str = include_str!("../../examples/general-purpose.yaml");
/// Most a scenario may take, set-up included.
const DEADLINE: Duration = Duration::from_secs(900);

struct Args {
    pods: usize,
    join: Duration,
    cpu: String,
    memory: String,
    json: bool,
}

fn args() -> Args {
    let mut a =
        Args { pods: 50, join: Duration::from_secs(25), cpu: "500m".into(), memory: "512Mi".into(), json: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--pods" => a.pods = value().parse().expect("--pods: a number of pods, e.g. 50"),
            "--join-seconds" => {
                a.join = Duration::from_secs(value().parse().expect("--join-seconds: whole seconds, e.g. 25"));
            }
            "--cpu" => a.cpu = value(),
            "--memory" => a.memory = value(),
            "--json" => a.json = true,
            // cargo bench passes --bench.
            "--bench" => {}
            other => panic!("unknown flag {other}: --pods N, --join-seconds S, --cpu Q, --memory Q, --json"),
        }
    }
    a
}

/// What one scenario measured.
struct Measured {
    buffer: bool,
    /// From the buffer's creation to its room existing.
    ready_after: Option<Duration>,
    /// From the burst to the first, the median and the last pod Running.
    first: Duration,
    median: Duration,
    last: Duration,
    /// NodeClaims when the burst started, and when its last pod ran.
    claims_before: usize,
    claims_after: usize,
    /// From the burst to the buffer's room existing again.
    refilled: Option<Duration>,
}

fn cke(join: Duration) -> SimCkeConfig {
    let mut c = SimCkeConfig { node_join_delay: DelayRange::fixed(join), ..SimCkeConfig::default() };
    // Far above the burst and the buffer together: the quota is not what is measured.
    c.quota.limit = sim::cke::quota::Usage { vcpu: 1000, ram_gb: 2000 };
    c
}

async fn live_claims(world: &World) -> Vec<NodeClaim> {
    Api::<NodeClaim>::namespaced(world.mgmt.client(), "team")
        .list(&ListParams::default())
        .await
        .map(|l| l.items.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()).collect())
        .unwrap_or_default()
}

fn initialized(c: &NodeClaim) -> bool {
    c.status.as_ref().is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Initialized" && k.status == "True"))
}

async fn wait(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < DEADLINE, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn scenario(a: &Args, buffer: bool) -> Measured {
    let mut world = World::start(&[("team", "burst")], |_| cke(a.join)).await.unwrap();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, "team", |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = json!("burst");
                doc["spec"].as_object_mut().unwrap().remove("limits");
            }
        })
        .await
        .unwrap();
    world.start_hub();
    let mgmt = world.mgmt.client();
    let mut ready_after = None;
    if buffer {
        let started = Instant::now();
        let template = workload_pod("template", &a.cpu, &a.memory);
        let template: PodTemplate = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "web", "namespace": "team"},
            "template": {"metadata": {"namespace": "default", "labels": {"app": "web"}}, "spec": template.spec},
        }))
        .unwrap();
        Api::<PodTemplate>::namespaced(mgmt.clone(), "team").create(&PostParams::default(), &template).await.unwrap();
        let buffers: Api<CapacityBuffer> = Api::namespaced(mgmt.clone(), "team");
        let b: CapacityBuffer = serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CapacityBuffer",
            "metadata": {"name": "web", "namespace": "team"},
            "spec": {"clusterName": "burst", "podTemplateRef": {"name": "web"}, "replicas": a.pods}
        }))
        .unwrap();
        buffers.create(&PostParams::default(), &b).await.unwrap();
        wait("the buffer's room", async || {
            let fits = buffers.get("web").await.ok().and_then(|b| b.status).is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "Provisioning" && c.reason == "FitsExistingCapacity")
            });
            let claims = live_claims(&world).await;
            fits && !claims.is_empty() && claims.iter().all(initialized)
        })
        .await;
        ready_after = Some(started.elapsed());
    }
    let claims_before = live_claims(&world).await.len();
    let pods: Api<Pod> = Api::namespaced(world.clusters[0].client(), "default");
    let burst = Instant::now();
    for i in 0..a.pods {
        pods.create(&PostParams::default(), &workload_pod(&format!("web-{i}"), &a.cpu, &a.memory)).await.unwrap();
    }
    let mut ran: Vec<Duration> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    wait("every pod of the burst Running", async || {
        let list = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        for p in list {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running && seen.insert(p.metadata.name.clone().unwrap_or_default()) {
                ran.push(burst.elapsed());
            }
        }
        seen.len() >= a.pods
    })
    .await;
    let claims_after = live_claims(&world).await.len();
    let mut refilled = None;
    if buffer {
        let buffers: Api<CapacityBuffer> = Api::namespaced(mgmt.clone(), "team");
        // The burst took the room; the hub makes it again without any pod pending.
        wait("the buffer's room made again", async || {
            let fits = buffers.get("web").await.ok().and_then(|b| b.status).is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "Provisioning" && c.reason == "FitsExistingCapacity")
            });
            let claims = live_claims(&world).await;
            fits && claims.len() > claims_before && claims.iter().all(initialized)
        })
        .await;
        refilled = Some(burst.elapsed());
    }
    world.shutdown().await;
    ran.sort();
    Measured {
        buffer,
        ready_after,
        first: ran[0],
        median: ran[ran.len() / 2],
        last: ran[ran.len() - 1],
        claims_before,
        claims_after,
        refilled,
    }
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let results: Vec<Measured> = [false, true].iter().map(|&b| rt.block_on(scenario(&a, b))).collect();
    let s = |d: Duration| format!("{:.1}", d.as_secs_f64());
    if a.json {
        for m in &results {
            println!(
                "{}",
                json!({"buffer": m.buffer, "pods": a.pods, "joinSeconds": a.join.as_secs(),
                    "bufferReadySeconds": m.ready_after.map(|d| d.as_secs_f64()),
                    "firstSeconds": m.first.as_secs_f64(), "medianSeconds": m.median.as_secs_f64(),
                    "lastSeconds": m.last.as_secs_f64(), "claimsBefore": m.claims_before, "claimsAfter": m.claims_after,
                    "refilledSeconds": m.refilled.map(|d| d.as_secs_f64())})
            );
        }
        return;
    }
    println!(
        "{} pods of {} CPU / {} each, sim-cke node join {} s (+1 s verdict, +5 s Ready):",
        a.pods,
        a.cpu,
        a.memory,
        a.join.as_secs()
    );
    println!(
        "scenario          buffer ready (s)  first Running (s)  median (s)  all Running (s)  claims before/after  room again (s)"
    );
    for m in &results {
        println!(
            "{:<17} {:>16}  {:>17}  {:>10}  {:>15}  {:>13}/{:<5}  {:>14}",
            if m.buffer { "with buffer" } else { "without buffer" },
            m.ready_after.map(s).unwrap_or_else(|| "-".into()),
            s(m.first),
            s(m.median),
            s(m.last),
            m.claims_before,
            m.claims_after,
            m.refilled.map(s).unwrap_or_else(|| "-".into())
        );
    }
}
