//! Helpers shared by the operator's end-to-end tests on the simulated world.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use operator::commands::sandbox::world::World;
use serde_json::Value;

pub const EXAMPLE: &str = include_str!("../../../examples/general-purpose.yaml");

/// Poll `check` every 200 ms until it holds; panic naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Apply `examples/general-purpose.yaml` in cluster `i`'s namespace, its NodePool pointed at it.
pub async fn apply_example(world: &World, i: usize) {
    let c = &world.clusters[i];
    let name = c.name.clone();
    world
        .apply_yaml("general-purpose.yaml", EXAMPLE, &c.namespace, |doc| {
            if doc.get("kind").and_then(Value::as_str) == Some("NodePool") {
                doc["spec"]["clusterName"] = Value::String(name.clone());
            }
        })
        .await
        .unwrap();
}

/// Pods Running in cluster `i`'s `default` namespace (0 when the list fails).
pub async fn running(world: &World, i: usize) -> usize {
    Api::<Pod>::namespaced(world.clusters[i].client(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The `.yaml`/`.yml` files directly in `dir`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// The non-empty documents of a YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", path.display()))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}
