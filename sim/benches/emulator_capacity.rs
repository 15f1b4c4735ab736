//! Emulator capacity: N clusters × (50 nodes, 1,000 pods) in one process, through HTTPS and
//! `kube::Client`s as the hub would talk to them. Reports start-up time, fill time (creates/s),
//! resident memory (total and per cluster), and the latency of a full pod LIST and of a watch's
//! initial events per cluster.
//!
//! `cargo bench -p sim --bench emulator_capacity` (defaults: 50 clusters, 1,000 pods, 50 nodes).
//! Env: `CLUSTERS`, `PODS`, `NODES` to change the shape; `BENCH_JSON=1` adds one JSON object per
//! line. Results go in docs/performance.md, "Emulator capacity".

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use sim::apiserver::{ApiServer, ApiServerConfig};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i}"), "labels": {
            "kubernetes.io/hostname": format!("node-{i}"),
            "node.kubernetes.io/instance-type": "M",
            "topology.kubernetes.io/zone": "par",
            "karpenter.sh/nodepool": "default",
            "karpenter.clever-cloud.com/nodeclaim": format!("default-{i}"),
        }},
        "spec": {"providerID": format!("clevercloud://ng-{i}")},
        "status": {
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "7800m", "memory": "15Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://2.0", "kernelVersion": "6.8", "architecture": "amd64", "operatingSystem": "linux", "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}
        }
    }))
    .unwrap()
}

fn pod(i: usize, nodes: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("app-{i}"), "labels": {"app": format!("app-{}", i % 20), "team": "a"},
                     "annotations": {"example.com/owner": "capacity-bench"}},
        "spec": {
            "nodeName": format!("node-{}", i % nodes.max(1)),
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
                            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                            "env": [{"name": "MODE", "value": "bench"}]}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": format!("app-{}", i % 20)}}}}]}}
        }
    }))
    .unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too: keep that quick.
    let quick = std::env::args().any(|a| a == "--test") || std::env::var_os("CAPACITY_QUICK").is_some();
    let clusters = env("CLUSTERS", if quick { 2 } else { 50 });
    let pods = env("PODS", if quick { 50 } else { 1000 });
    let nodes = env("NODES", if quick { 5 } else { 50 });
    let json_out = std::env::var_os("BENCH_JSON").is_some();
    let rss0 = rss_mib();

    let t = Instant::now();
    let mut servers = Vec::new();
    for i in 0..clusters {
        servers
            .push(ApiServer::start(ApiServerConfig::workload(format!("cap-{i}")).with_seed(i as u64)).await.unwrap());
    }
    let start_time = t.elapsed();
    let rss_started = rss_mib();

    let t = Instant::now();
    let mut tasks = Vec::new();
    for s in &servers {
        let client = s.client();
        tasks.push(tokio::spawn(async move {
            let napi: Api<Node> = Api::all(client.clone());
            for i in 0..nodes {
                napi.create(&PostParams::default(), &node(i)).await.unwrap();
            }
            let papi: Api<Pod> = Api::namespaced(client, "default");
            // A few writers per cluster, like controllers do.
            let mut writers = Vec::new();
            for w in 0..4 {
                let papi = papi.clone();
                writers.push(tokio::spawn(async move {
                    for i in (w..pods).step_by(4) {
                        papi.create(&PostParams::default(), &pod(i, nodes)).await.unwrap();
                    }
                }));
            }
            for w in writers {
                w.await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let fill_time = t.elapsed();
    let objects = clusters * (pods + nodes);
    let rss_filled = rss_mib();

    // A full LIST of pods and the initial events of a pod watch, per cluster (sequential).
    let mut lists = Vec::new();
    let mut watches = Vec::new();
    for s in &servers {
        let papi: Api<Pod> = Api::all(s.client());
        let t = Instant::now();
        let l = papi.list(&ListParams::default()).await.unwrap();
        lists.push(t.elapsed());
        assert_eq!(l.items.len(), pods);
        let t = Instant::now();
        let mut stream = papi.watch(&WatchParams::default().timeout(30), "0").await.unwrap().boxed();
        let mut n = 0;
        while n < pods {
            if let Some(Ok(WatchEvent::Added(_))) = stream.next().await {
                n += 1;
            }
        }
        watches.push(t.elapsed());
    }
    // Steady churn: every pod's status patched twice (as kubelets do), which fills each cluster's
    // watch history with new object versions.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for s in &servers {
        let papi: Api<Pod> = Api::namespaced(s.client(), "default");
        tasks.push(tokio::spawn(async move {
            for round in 0..2 {
                for i in 0..pods {
                    let patch = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "podIP": format!("10.0.{round}.{}", i % 250)}});
                    papi.patch_status(&format!("app-{i}"), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let churn_time = t.elapsed();
    let rss_end = rss_mib();
    let per_cluster = (rss_filled - rss0) / clusters as f64;

    println!("emulator capacity: {clusters} clusters x ({nodes} nodes, {pods} pods)");
    println!("{:<44} {:>12}", "metric", "value");
    let rows = [
        ("start all servers (s)", start_time.as_secs_f64()),
        ("fill: create nodes + pods (s)", fill_time.as_secs_f64()),
        ("fill: creates per second", objects as f64 / fill_time.as_secs_f64()),
        ("RSS before (MiB)", rss0),
        ("RSS after start (MiB)", rss_started),
        ("RSS after fill (MiB)", rss_filled),
        ("RSS after churn (MiB)", rss_end),
        ("RSS per cluster, filled (MiB)", per_cluster),
        ("LIST all pods of a cluster, median (ms)", median(lists).as_secs_f64() * 1000.0),
        ("watch initial events of a cluster, median (ms)", median(watches).as_secs_f64() * 1000.0),
        ("churn: 2 status patches per pod (s)", churn_time.as_secs_f64()),
        ("churn: patches per second", (2 * pods * clusters) as f64 / churn_time.as_secs_f64()),
    ];
    for (k, v) in rows {
        println!("{k:<44} {v:>12.2}");
    }
    if json_out {
        let obj: serde_json::Map<String, serde_json::Value> =
            rows.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        println!(
            "{}",
            json!({"bench": "emulator_capacity", "clusters": clusters, "pods": pods, "nodes": nodes, "results": obj})
        );
    }
    for s in servers {
        s.shutdown().await;
    }
}
