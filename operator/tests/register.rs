//! `karpenter-hub register` on the simulated world: the workload RBAC is applied with the admin
//! kubeconfig, and the hub then provisions using only the minted least-privilege identity — which
//! proves the shipped workload RBAC grants everything the hub calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::NodeGroup;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, api::ListParams};
use operator::{
    register::{RegisterArgs, register},
    sandbox::{World, quick_cke, scale},
};

mod common;
use common::{apply_example, running, wait_for};

/// A fresh directory for this test's kubeconfig files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-register-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_cluster_is_served_with_the_minted_least_privilege_identity() {
    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let dir = scratch("ok");
    let paths = world.write_kubeconfigs(&dir).unwrap();
    let mgmt_path = paths.iter().find(|p| p.ends_with("management.kubeconfig")).unwrap().clone();
    let admin_path = paths.iter().find(|p| p.ends_with("alpha.kubeconfig")).unwrap().clone();
    let admin_token = world.clusters[0].server.token();

    let args = RegisterArgs {
        cluster: "alpha".into(),
        namespace: "team-a".into(),
        workload_kubeconfig: admin_path,
        workload_context: None,
        kubeconfig: Some(mgmt_path),
        workload_namespace: "karpenter-hub".into(),
        server: None,
    };
    assert_eq!(register(&args).await.unwrap(), "alpha-kubeconfig");
    // Idempotent: a second run converges on the same objects.
    register(&args).await.unwrap();

    let secret = Api::<Secret>::namespaced(world.mgmt.client(), "team-a").get("alpha-kubeconfig").await.unwrap();
    let kubeconfig = String::from_utf8(secret.data.unwrap()["value"].0.clone()).unwrap();
    assert!(!kubeconfig.contains(&admin_token), "the admin credentials are never copied");
    assert!(kubeconfig.contains("\"token\""));
    // Least privilege for real: the minted identity cannot read Secrets.
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let as_hub = kube::Client::try_from(config).unwrap();
    match Api::<Secret>::all(as_hub).list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("listing Secrets must be forbidden, got {other:?}"),
    }

    apply_example(&world, 0).await;
    world.start_hub();
    scale(&world, 0, 2, "1", "1Gi").await.unwrap();
    wait_for("pods running through the minted identity", Duration::from_secs(60), || async {
        running(&world, 0).await == 2
    })
    .await;
    let groups = Api::<NodeGroup>::all(world.clusters[0].client()).list(&ListParams::default()).await.unwrap();
    assert_eq!(groups.items.len(), 1);
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_with_an_unusable_kubeconfig_names_the_file_and_writes_nothing() {
    let world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64)).await.unwrap();
    let dir = scratch("bogus");
    let paths = world.write_kubeconfigs(&dir).unwrap();
    let mgmt_path = paths.iter().find(|p| p.ends_with("management.kubeconfig")).unwrap().clone();
    let bogus = dir.join("bogus.kubeconfig");
    std::fs::write(&bogus, "this: is: not a kubeconfig").unwrap();
    let args = RegisterArgs {
        cluster: "beta".into(),
        namespace: "team-a".into(),
        workload_kubeconfig: bogus.clone(),
        workload_context: None,
        kubeconfig: Some(mgmt_path),
        workload_namespace: "karpenter-hub".into(),
        server: None,
    };
    let e = register(&args).await.unwrap_err().to_string();
    assert!(e.contains(&bogus.display().to_string()), "{e}");
    let secrets = Api::<Secret>::namespaced(world.mgmt.client(), "team-a");
    assert!(secrets.get_opt("beta-kubeconfig").await.unwrap().is_none());
    world.shutdown().await;
}
