//! The sandbox says why a run does not settle and keeps reporting with `--follow` (issue 13
//! item 4), on the simulated world with the real hub: a pool whose memory limit is too small for
//! the workload names the pods left pending with the hub's reason and the pool's limits; once the
//! limit is raised the same workload settles and nothing is left to explain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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
