//! `kubectl` (the real binary, v1.32 here) against the emulator, with the kubeconfig it writes:
//! get (table, `-o wide`, `-o yaml`, `-o json`), apply (client-side and `--server-side`), label,
//! delete, and `get -w`. Skipped (with a message) when no kubectl is installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use sim::apiserver::{ApiServer, ApiServerConfig};

fn kubectl_path() -> Option<PathBuf> {
    let candidates = std::env::var_os("KUBECTL").map(PathBuf::from).into_iter().chain(
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join("kubectl")).collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    candidates.into_iter().find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", &self.dir)
            .env("KUBECACHEDIR", self.dir.join("cache"))
            .output()
            .expect("run kubectl")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "kubectl {args:?} failed:\nstdout: {stdout}\nstderr: {stderr}");
        stdout
    }

    fn apply_yaml(&self, args: &[&str], yaml: &str) -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = self.dir.join(format!("m{}.yaml", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, yaml).unwrap();
        let mut a: Vec<&str> = args.to_vec();
        let p = path.to_string_lossy().to_string();
        a.extend(["-f", &p]);
        self.ok(&a)
    }
}

async fn setup(name: &str) -> Option<(ApiServer, Kubectl)> {
    let Some(bin) = kubectl_path() else {
        eprintln!("kubectl not found: skipping");
        return None;
    };
    let server = ApiServer::start(ApiServerConfig::workload(name)).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sim-kubectl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    Some((server, Kubectl { bin, kubeconfig, dir }))
}

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeName: node-a
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  a: "1"
"#;

const NODEGROUP: &str = r#"apiVersion: api.clever-cloud.com/v1
kind: NodeGroup
metadata:
  name: ng-1
spec:
  flavor: XS
  nodeCount: 1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_apply_label_delete() {
    let Some((server, k)) = setup("kubectl").await else { return };
    let out = tokio::task::spawn_blocking(move || {
        let mut log = String::new();
        log += &k.apply_yaml(&["apply"], PODS);
        log += &k.ok(&["get", "pods"]);
        let wide = k.ok(&["get", "pods", "-o", "wide"]);
        assert!(wide.contains("NODE") && wide.contains("node-a"), "{wide}");
        let yaml = k.ok(&["get", "pod", "web", "-o", "yaml"]);
        assert!(yaml.contains("uid:") && yaml.contains("app: web"), "{yaml}");
        // Re-apply with a change: a client-side apply patch.
        let changed = PODS.replace("a: \"1\"", "a: \"2\"");
        k.apply_yaml(&["apply"], &changed);
        let json = k.ok(&["get", "configmap", "settings", "-o", "json"]);
        assert!(json.contains("\"a\": \"2\""), "{json}");
        // Generators send protobuf bodies.
        k.ok(&["create", "namespace", "made-by-generator"]);
        k.ok(&["create", "configmap", "gen-cm", "-n", "made-by-generator", "--from-literal=k=v"]);
        k.ok(&["create", "secret", "generic", "gen-secret", "-n", "made-by-generator", "--from-literal=p=s"]);
        k.ok(&["create", "serviceaccount", "gen-sa", "-n", "made-by-generator"]);
        let cm = k.ok(&["get", "configmap", "gen-cm", "-n", "made-by-generator", "-o", "jsonpath={.data.k}"]);
        assert_eq!(cm, "v");
        let sec = k.ok(&["get", "secret", "gen-secret", "-n", "made-by-generator", "-o", "jsonpath={.data.p}"]);
        assert_eq!(sec, "cw==");
        let described = k.ok(&["describe", "pod", "web"]);
        assert!(described.contains("node-a") && described.contains("Events:"), "{described}");
        k.ok(&["label", "pod", "web", "tier=frontend"]);
        let shown = k.ok(&["get", "pods", "-l", "tier=frontend", "--show-labels"]);
        assert!(shown.contains("web") && shown.contains("tier=frontend"), "{shown}");
        // A CRD-defined kind with its printer columns, by short name or plural.
        k.apply_yaml(&["apply", "--server-side"], NODEGROUP);
        let ngs = k.ok(&["get", "nodegroups", "-o", "wide"]);
        log += &ngs;
        log += &wide;
        assert!(ngs.contains("ng-1"), "{ngs}");
        let nss = k.ok(&["get", "ns"]);
        assert!(nss.contains("default") && nss.contains("Active"), "{nss}");
        log += &nss;
        log += &k.ok(&["get", "all"]);
        log += &k.ok(&["get", "crd"]);
        k.ok(&["delete", "configmap", "settings"]);
        let after = k.run(&["get", "configmap", "settings"]);
        assert!(!after.status.success());
        assert!(String::from_utf8_lossy(&after.stderr).contains("NotFound"));
        k.ok(&["delete", "nodegroup", "ng-1"]);
        log
    })
    .await
    .unwrap();
    eprintln!("{out}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_streams_changes() {
    let Some((server, k)) = setup("kubectl-watch").await else { return };
    let client = server.client();
    let mut child = Command::new(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args(["get", "configmaps", "-w", "--request-timeout=30s"])
        .env("HOME", &k.dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::default_namespaced(client);
    let cm = serde_json::from_value(serde_json::json!({"metadata": {"name": "watched"}})).unwrap();
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut created = false;
    while !seen.contains("watched") {
        // Create once kubectl has printed its header (the watch is open by then) or after 3 s.
        if !created && (seen.contains("NAME") || tokio::time::Instant::now() + Duration::from_secs(27) > deadline) {
            cms.create(&Default::default(), &cm).await.unwrap();
            created = true;
        }
        match tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)), rx.recv())
            .await
        {
            Ok(Some(line)) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Ok(None) => break,
            Err(_) => assert!(tokio::time::Instant::now() < deadline, "kubectl -w printed: {seen}"),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.contains("watched"), "{seen}");
    server.shutdown().await;
}

/// The README's install steps work on an empty emulator: `kubectl apply --server-side -f crds/`,
/// then `kubectl apply -f` of every valid example; `kubectl get nodepools -A` shows the printer
/// columns; an invalid example is refused with the CRD's validation message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_installs_the_crds_and_applies_the_examples() {
    let Some(bin) = kubectl_path() else {
        eprintln!("kubectl not found: skipping");
        return;
    };
    let server = ApiServer::start(ApiServerConfig::new("mgmt")).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sim-kubectl-mgmt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let k = Kubectl { bin, kubeconfig, dir };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        let crds = root.join("crds");
        let crds = crds.to_string_lossy();
        let mut log = k.ok(&["apply", "--server-side", "-f", &crds]);
        let examples = root.join("examples");
        let mut files: Vec<_> = std::fs::read_dir(&examples)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in &files {
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            let ns = format!("ex-{}", name.trim_end_matches(".yaml"));
            k.ok(&["create", "namespace", &ns]);
            log += &k.ok(&["apply", "-n", &ns, "-f", &f.to_string_lossy()]);
        }
        let pools = k.ok(&["get", "nodepools", "-A"]);
        assert!(pools.contains("ex-general-purpose") && pools.contains("prod-paris"), "{pools}");
        log += &pools;
        let invalid = root.join("examples").join("invalid");
        if let Some(bad) = std::fs::read_dir(&invalid).ok().and_then(|d| {
            d.filter_map(Result::ok).map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "yaml"))
        }) {
            k.apply_yaml(&["apply"], "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ex-invalid\n");
            let out = k.run(&["apply", "-n", "ex-invalid", "-f", &bad.to_string_lossy()]);
            assert!(!out.status.success(), "{} was accepted", bad.display());
            log += &String::from_utf8_lossy(&out.stderr);
        }
        log
    })
    .await
    .unwrap();
    eprintln!("{out}");
    server.shutdown().await;
}
