//! The harness itself, on the real binaries: several control planes at once, each its own cluster;
//! everything stopped on drop, after a panic, and when the test process is killed outright.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use envtest::{Assets, ControlPlane, Error, Options};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

/// The binaries, or a visible skip.
macro_rules! assets_or_skip {
    () => {
        match Assets::from_env() {
            Ok(a) => a,
            Err(e) => {
                envtest::skip(&envtest::current_test(), &e);
                return;
            }
        }
    };
}

/// Pids of the processes whose command line mentions `needle` (the control plane's directory).
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // Zombies have an empty command line; the watchdog shell names the binary, not the directory.
        if cmdline.contains(needle) && !cmdline.starts_with("sh ") {
            found.push(pid);
        }
    }
    found
}

fn wait_gone(dir: &Path) {
    let needle = dir.display().to_string();
    let start = Instant::now();
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "processes of {needle} still run: {:?}",
            processes_mentioning(&needle)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn put(cp: &ControlPlane, name: &str) {
    let client = cp.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
}

async fn names(cp: &ControlPlane) -> Vec<String> {
    let client = cp.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let list = api.list(&Default::default()).await.unwrap();
    let mut names: Vec<String> = list.items.into_iter().filter_map(|c| c.metadata.name).collect();
    // What kube-controller-manager publishes in every namespace (the second only since 1.36's
    // service CA publisher; whether it is there yet depends on timing).
    names.retain(|n| n != "kube-root-ca.crt" && n != "openshift-service-ca.crt");
    names
}

#[tokio::test]
async fn two_control_planes_are_two_clusters_and_stop_on_drop() {
    let assets = assets_or_skip!();
    let mgmt = ControlPlane::start_with(&assets, &Options::new("mgmt")).unwrap();
    let workload =
        ControlPlane::start_with(&assets, &Options { controller_manager: false, ..Options::new("workload") }).unwrap();
    assert_ne!(mgmt.server(), workload.server());
    assert!(mgmt.server().starts_with("https://127.0.0.1:"), "loopback only: {}", mgmt.server());
    assert!(!workload.has_controller_manager());

    put(&mgmt, "only-in-mgmt").await;
    put(&workload, "only-in-workload").await;
    assert_eq!(names(&mgmt).await, ["only-in-mgmt"]);
    assert_eq!(names(&workload).await, ["only-in-workload"]);

    // The kubeconfig file is usable as is (inline CA, bearer token).
    let kc = kube::config::Kubeconfig::read_from(mgmt.kubeconfig_path()).unwrap();
    assert_eq!(kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(), Some(mgmt.server()));

    let (mgmt_dir, workload_dir) = (mgmt.dir().to_path_buf(), workload.dir().to_path_buf());
    assert!(
        !processes_mentioning(&mgmt_dir.display().to_string()).is_empty(),
        "the control plane runs under its directory"
    );
    drop(mgmt);
    wait_gone(&mgmt_dir);
    assert!(!mgmt_dir.exists(), "the scratch directory is removed");
    // The other one is untouched.
    assert_eq!(names(&workload).await, ["only-in-workload"]);
    drop(workload);
    wait_gone(&workload_dir);
}

#[test]
fn a_panicking_test_still_stops_its_control_plane() {
    let assets = assets_or_skip!();
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let cp = ControlPlane::start_with(&assets, &Options { controller_manager: false, ..Options::new("panics") })
            .unwrap();
        tx.send(cp.dir().to_path_buf()).unwrap();
        panic!("the test fails while its control plane runs");
    })
    .join();
    assert!(outcome.is_err());
    wait_gone(&rx.recv().unwrap());
}

/// Run by [`a_killed_test_process_leaves_nothing_running`] in a child process: starts a control
/// plane, prints its directory, and waits to be killed.
#[test]
#[ignore = "a helper: run only as a child process of a_killed_test_process_leaves_nothing_running"]
fn child_that_is_killed() {
    let Some(marker) = std::env::var_os("ENVTEST_CHILD_MARKER") else { return };
    let cp = ControlPlane::start(&Options { controller_manager: false, ..Options::new("killed") }).unwrap();
    std::fs::write(&marker, cp.dir().display().to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_test_process_leaves_nothing_running() {
    let _ = assets_or_skip!();
    let marker = std::env::temp_dir().join(format!("envtest-child-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_that_is_killed", "--ignored", "--nocapture"])
        .env("ENVTEST_CHILD_MARKER", &marker)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let dir = loop {
        if let Ok(dir) = std::fs::read_to_string(&marker) {
            break std::path::PathBuf::from(dir);
        }
        assert!(child.try_wait().unwrap().is_none(), "the child exited before its control plane was ready");
        assert!(start.elapsed() < Duration::from_secs(120), "the child's control plane did not start");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!processes_mentioning(&dir.display().to_string()).is_empty());
    child.kill().unwrap(); // SIGKILL: no destructor runs in the child
    child.wait().unwrap();
    wait_gone(&dir);
    let start = Instant::now();
    while dir.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "{} was not removed", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn missing_binaries_are_named() {
    let dir = std::env::temp_dir().join(format!("envtest-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = Assets::new(dir.clone()).unwrap_err();
    assert!(matches!(err, Error::MissingBinary { binary: "kube-apiserver", .. }), "{err}");
    assert!(err.to_string().contains("must hold kube-apiserver and etcd"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_start_says_which_process_and_shows_its_log() {
    let assets = assets_or_skip!();
    // An etcd that exits at once: the API server never becomes ready, and the error says why.
    let dir = std::env::temp_dir().join(format!("envtest-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let real = Path::new(&std::env::var_os(envtest::ASSETS_ENV).unwrap()).join("kube-apiserver");
    std::os::unix::fs::symlink(real, dir.join("kube-apiserver")).unwrap();
    let etcd = dir.join("etcd");
    std::fs::write(&etcd, "#!/bin/sh\necho 'etcd: refusing to start for this test' >&2\nexit 3\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = assets;
    let err = ControlPlane::start_with(&Assets::new(dir.clone()).unwrap(), &Options::new("broken")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::NotReady { component: "etcd", .. }), "{text}");
    assert!(text.contains("refusing to start for this test"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_shared_control_plane_is_started_once() {
    let a = envtest::shared_or_skip!("shared");
    let b = envtest::shared_or_skip!("shared");
    assert!(std::ptr::eq(a, b));
    assert!(a.client().await.unwrap().apiserver_version().await.unwrap().git_version.starts_with("v1."));
}
