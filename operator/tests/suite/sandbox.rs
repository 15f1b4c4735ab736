//! The sandbox says why a run does not settle and keeps reporting with `--follow` (issue 13
//! item 4), on the simulated world with the real hub: a pool whose memory limit is too small for
//! the workload names the pods left pending with the hub's reason and the pool's limits; once the
//! limit is raised the same workload settles and nothing is left to explain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::events::v1::Event;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use common::{EXAMPLE, wait_for};
use crds::NodePool;
use operator::commands::sandbox::{
    follow, settle,
    world::{World, quick_cke, scale},
};

/// Output the test can read while the sandbox writes it.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// One cluster with the example's pool, its memory limit set to `memory`, and the hub running.
async fn world_with_limit(memory: &str) -> World {
    let mut world = World::start(&[("team-a", "prod-paris")], |i| quick_cke(i as u64 + 1)).await.unwrap();
    let memory = memory.to_string();
    world
        .apply_yaml("examples/general-purpose.yaml", EXAMPLE, "team-a", |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = json!("prod-paris");
                doc["spec"]["limits"] = json!({"memory": memory});
            }
        })
        .await
        .unwrap();
    world.start_hub();
    world
}

/// Whether the hub has recorded a FailedScheduling event on one of cluster 0's pods.
async fn hub_refused_a_pod(world: &World) -> bool {
    let events = Api::<Event>::namespaced(world.clusters[0].client(), "default");
    events.list(&ListParams::default()).await.is_ok_and(|l| {
        l.items.iter().any(|e| {
            e.reason.as_deref() == Some("FailedScheduling")
                && e.reporting_controller.as_deref() == Some("karpenter-hub")
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_cannot_settle_names_its_pending_pods_and_the_pools_limit() {
    // 6 pods of 1 CPU / 1Gi under a 4Gi memory limit: some must stay pending.
    let world = world_with_limit("4Gi").await;
    scale(&world, 0, 6, "1", "1Gi").await.unwrap();
    wait_for("the hub to record why a pod waits", Duration::from_secs(60), || hub_refused_a_pod(&world)).await;
    let out = Shared::default();
    let stop = CancellationToken::new();
    let settled = settle(&world, &mut out.clone(), Duration::from_secs(3), &stop, 6).await.unwrap();
    let text = out.text();
    assert!(!settled, "{text}");
    assert!(text.contains("Not settled after 3s"), "{text}");
    let pending: Vec<&str> = text.lines().filter(|l| l.contains(" pending: ")).collect();
    assert!(!pending.is_empty(), "the pending pods are listed: {text}");
    assert!(
        pending.iter().any(|l| l.contains("the hub cannot provision a node:") && l.contains("limits")),
        "a pending pod's reason is the hub's, naming the pool's limits: {text}"
    );
    assert!(text.contains("NodePool team-a/default limits: memory "), "the pool's limit is shown: {text}");
    assert!(text.contains("used of 4Gi"), "{text}");
    assert!(!text.contains("see the log above"), "{text}");

    // Raise the limit: the same workload settles, and there is nothing left to explain.
    Api::<NodePool>::namespaced(world.mgmt.client(), "team-a")
        .patch("default", &PatchParams::default(), &Patch::Merge(json!({"spec": {"limits": {"memory": "64Gi"}}})))
        .await
        .unwrap();
    let out = Shared::default();
    let settled = settle(&world, &mut out.clone(), Duration::from_secs(90), &stop, 6).await.unwrap();
    let text = out.text();
    assert!(settled, "{text}");
    assert!(!text.contains("Not settled") && !text.contains(" pending: "), "{text}");
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_keeps_reporting_progress_and_reasons_after_the_script() {
    let world = world_with_limit("4Gi").await;
    let out = Shared::default();
    let stop = CancellationToken::new();
    let mut writer = out.clone();
    let following = follow(&world, &mut writer, &stop);
    let driving = async {
        // The script is over; someone scales the workload by hand.
        wait_for("the first progress line", Duration::from_secs(10), || async { out.text().contains("prod-paris") })
            .await;
        scale(&world, 0, 6, "1", "1Gi").await.unwrap();
        wait_for("progress with pods running", Duration::from_secs(60), || async {
            out.text().lines().any(|l| l.contains("prod-paris") && !l.contains("running   0"))
        })
        .await;
        wait_for("the reason pods wait", Duration::from_secs(60), || async {
            out.text().lines().any(|l| l.contains(" pending: the hub cannot provision a node:"))
        })
        .await;
        stop.cancel();
    };
    let (followed, ()) = tokio::time::timeout(Duration::from_secs(150), async { tokio::join!(following, driving) })
        .await
        .expect("follow returns once stopped");
    followed.unwrap();
    let text = out.text();
    assert!(text.contains("NodePool team-a/default limits: memory "), "{text}");
    world.shutdown().await;
}

/// The README's first command, as a new user runs it (issue 11 and 12 done-when): the binary's
/// `sandbox` scales each cluster's workload up, then down, and the hub consolidates by itself —
/// each S replaced by a cheaper XS, launched first, the cost per hour falling — then a deleted
/// NodeClaim's node is drained visibly (taint, each pod evicted, NodeGroup and Node gone); last, a
/// change of the fleet pool rolls out one cluster at a time, and the fleet view lists the three.
#[test]
fn the_sandbox_scales_down_by_itself_and_shows_a_drain() {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-sandbox-test-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
        .args(["sandbox", "--dir"])
        .arg(&dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sandbox failed: {}\n{stdout}\n{stderr}", out.status);
    for expected in [
        "Scaled each workload down to 4 pods.",
        "Consolidated: every cluster runs its 4 pods on cheaper capacity.",
        "tainted karpenter.sh/disrupted:NoSchedule; evicting its pods",
        "evicted",
        "released",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}\n{stderr}");
    }
    // The consolidation shows live: some progress line has the cheaper XS price while the S still
    // runs (the replacement launched first: 0.0889 + 0.0611 = 0.1500 EUR/h), then 0.0611 alone.
    let after_scale_down = stdout.split("Scaled each workload down").nth(1).unwrap();
    assert!(after_scale_down.contains("0.1500 EUR/h"), "the replacement before the old node goes:\n{stdout}");
    let summary = stdout.split("Summary:").nth(1).unwrap();
    assert_eq!(summary.matches("0.0611 EUR/h").count(), 3, "each cluster on one XS at the end:\n{stdout}");
    assert!(!stderr.contains("rolled back"), "no command rolled back:\n{stderr}");
    // The fleet pool's template change, rolled out one cluster at a time in its order, the phases
    // in the progress lines (fleet.md §3).
    let rollout = stdout.split("Changed the fleet pool's template").nth(1).unwrap();
    for phase in ["rollout Pending", "rollout Progressing", "rollout Done"] {
        assert!(rollout.contains(phase), "no {phase:?} in the rollout's progress lines:\n{stdout}");
    }
    assert!(
        rollout.contains(
            "Rolled out cluster by cluster: dev-paris -> staging-paris -> prod-paris (at most 1 cluster progressing"
        ),
        "the rollout in its order, one cluster at a time:\n{stdout}"
    );
    // The fleet view, read from the management cluster: the three clusters, each served by the fleet pool.
    let view = summary.split("The fleet view").nth(1).unwrap();
    for cluster in ["dev-paris", "prod-paris", "staging-paris"] {
        assert!(
            view.lines()
                .any(|l| l.trim_start().starts_with(cluster) && l.contains("Connected") && l.contains("default*")),
            "{cluster} in the fleet view:\n{stdout}"
        );
    }
}

/// Every kubectl command the sandbox's banner suggests works as written against a running sandbox
/// world (issue 13 done-when): run exactly as printed, it succeeds and shows what it promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_command_the_banner_suggests_works_as_written() {
    let mut world = World::start(&[("team-a", "prod-paris"), ("team-b", "staging-paris")], |i| quick_cke(i as u64 + 1))
        .await
        .unwrap();
    for (ns, cluster) in [("team-a", "prod-paris"), ("team-b", "staging-paris")] {
        world
            .apply_yaml("examples/general-purpose.yaml", EXAMPLE, ns, |doc| {
                if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                    doc["spec"]["clusterName"] = json!(cluster);
                }
            })
            .await
            .unwrap();
    }
    world.start_hub();
    scale(&world, 0, 2, "1", "1Gi").await.unwrap();
    wait_for("two pods running in prod-paris", Duration::from_secs(90), || async {
        common::running(&world, 0).await == 2
    })
    .await;
    let dir = std::env::temp_dir().join(format!("karpenter-hub-banner-test-{}", std::process::id()));
    let files = world.write_kubeconfigs(&dir).unwrap();
    let commands = operator::commands::sandbox::banner(&world, &files, &dir.join("management.kubeconfig"));
    assert_eq!(commands.len(), 7, "{commands:?}");
    for command in commands {
        let line = command.join(" ");
        let out = std::process::Command::new(&command[0]).args(&command[1..]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{line}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
        let needles: &[&str] = if line.contains("get nodes,nodegroups,pods") {
            &["node/"]
        } else if line.contains("get nodepools,nodeclaims") {
            &["nodepool.karpenter.clever-cloud.com/default", "nodeclaim.karpenter.clever-cloud.com/default-"]
        } else if line.contains("get events") {
            &["Connected"]
        } else if line.contains("describe nodeclaims") {
            &["Name:", "Launched"]
        } else if line.contains("get workloadclusters") {
            &["prod-paris", "Connected"]
        } else {
            &["FIELDS"]
        };
        for needle in needles {
            assert!(stdout.contains(needle), "{line}: no {needle:?} in\n{stdout}");
        }
    }
    // prod-paris shows its NodeGroup and the pods on its node.
    let first = std::process::Command::new("kubectl")
        .args(["--kubeconfig", &files[1].display().to_string(), "get", "nodes,nodegroups,pods", "-o", "wide"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(text.contains("nodegroup.api.clever-cloud.com/default-") && text.contains("pod/web-0"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
    world.shutdown().await;
}
