//! `kubectl` (the real binary, v1.32 here) against the emulator, with the kubeconfig it writes:
//! get (table, `-o wide`, `-o yaml`, `-o json`), apply (client-side and `--server-side`), label,
//! delete, and `get -w`; `explain`, printer columns, `get events` and `describe` of the hub's
//! resources as on a real server. Skipped (with a message) when no kubectl is installed, except
//! under `KARPENTER_HUB_REQUIRE_ENVTEST=1` (CI), where that fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
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

/// Without kubectl these tests skip visibly, except where the full environment is required (CI
/// sets `KARPENTER_HUB_REQUIRE_ENVTEST=1`): there a missing kubectl fails them.
fn no_kubectl() {
    let test = std::thread::current().name().unwrap_or("kubectl test").to_string();
    assert!(
        std::env::var("KARPENTER_HUB_REQUIRE_ENVTEST").as_deref() != Ok("1"),
        "{test}: kubectl is not on PATH (nor named by KUBECTL), and KARPENTER_HUB_REQUIRE_ENVTEST=1 requires it"
    );
    // Straight to stderr (not captured by the test harness), so the skip is seen.
    let line = format!("{test}: skipped: kubectl is not on PATH (nor named by KUBECTL)\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
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
        no_kubectl();
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
        // The sandbox banner's command for a workload cluster, as written.
        let all = k.ok(&["get", "nodes,nodegroups,pods", "-o", "wide"]);
        assert!(all.contains("nodegroup.api.clever-cloud.com/ng-1") && all.contains("pod/web"), "{all}");
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
        no_kubectl();
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

// ------------------------------------------------------------------ what a person sees on the
// management cluster: the same as on a real one (compare operator/tests/suite/kubectl.rs and the
// conformance suite's `table_output_has_crd_printer_columns`, `events_are_one_object_in_both_event_apis`
// and `openapi_v3_publishes_crd_schemas`, which run on a real kube-apiserver too).

/// A management-cluster emulator (the hub's CRDs installed) with a namespace `team-a`.
async fn management(name: &str) -> Option<(ApiServer, Kubectl)> {
    let Some(bin) = kubectl_path() else {
        no_kubectl();
        return None;
    };
    let server = ApiServer::start(ApiServerConfig::management(name)).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sim-kubectl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let ns = serde_json::from_value(serde_json::json!({"metadata": {"name": "team-a"}})).unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(server.client())
        .create(&Default::default(), &ns)
        .await
        .unwrap();
    Some((server, Kubectl { bin, kubeconfig, dir }))
}

/// `kubectl <args>` printing a table: one map per row, column name → cell ("" when empty). Cells
/// are cut at the header's column offsets, as kubectl aligns them (an empty cell prints nothing).
fn table(k: &Kubectl, args: &[&str]) -> Vec<std::collections::BTreeMap<String, String>> {
    let stdout = k.ok(args);
    eprintln!("kubectl {}\n{stdout}", args.join(" "));
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts: Vec<(usize, String)> = Vec::new();
    for (i, c) in header.char_indices() {
        if c != ' ' && (i == 0 || header[..i].ends_with("  ")) {
            let name: String = header[i..].split("  ").next().unwrap_or_default().trim().to_string();
            starts.push((i, name));
        }
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(n, (start, name))| {
                    let end = starts.get(n + 1).map_or(line.len(), |(s, _)| (*s).min(line.len()));
                    (name.clone(), line.get((*start).min(line.len())..end).unwrap_or_default().trim().to_string())
                })
                .collect()
        })
        .collect()
}

fn dynamic_api(server: &ApiServer, kind: &str, plural: &str) -> kube::Api<kube::api::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk("karpenter.clever-cloud.com", "v1alpha1", kind);
    kube::Api::namespaced_with(server.client(), "team-a", &kube::api::ApiResource::from_gvk_with_plural(&gvk, plural))
}

/// A NodeClaim with the labels and status the hub writes (operator/src/controllers/nodeclaim.rs).
async fn launched_claim(server: &ApiServer) -> kube::api::DynamicObject {
    let claims = dynamic_api(server, "NodeClaim", "nodeclaims");
    let claim: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "default-x7k2p", "labels": {
            "node.kubernetes.io/instance-type": "XS", "karpenter.sh/capacity-type": "on-demand",
            "topology.kubernetes.io/zone": "par", "karpenter.sh/nodepool": "default",
        }},
        "spec": {
            "clusterName": "prod-paris",
            "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XS"]}],
        },
    }))
    .unwrap();
    claims.create(&Default::default(), &claim).await.unwrap();
    let status = serde_json::json!({"status": {
        "nodeName": "ng-x7k2p-node0", "providerID": "clevercloud://ng-x7k2p",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }});
    claims.patch_status("default-x7k2p", &Default::default(), &kube::api::Patch::Merge(&status)).await.unwrap()
}

/// `kubectl get nodeclaims` fills every printer column the CRD declares, including those that
/// read a label (`.metadata.labels.node\.kubernetes\.io/instance-type`: dots escaped), with
/// `-o wide` adding the priority-1 ones, as kube-apiserver's table convertor does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_nodeclaims_fills_every_printer_column() {
    let Some((server, k)) = management("kubectl-columns").await else { return };
    launched_claim(&server).await;
    let pools = dynamic_api(&server, "NodePool", "nodepools");
    let pool: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
        "metadata": {"name": "default"},
        "spec": {"clusterName": "prod-paris", "template": {"spec": {
            "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
            "requirements": [],
        }}},
    }))
    .unwrap();
    pools.create(&Default::default(), &pool).await.unwrap();
    // The status as the hub's NodePool controller writes it: two nodes, their summed capacity.
    let status = serde_json::json!({"status": {"nodes": 2, "resources": {"cpu": "4", "memory": "8Gi", "pods": "220"}}});
    pools.patch_status("default", &Default::default(), &kube::api::Patch::Merge(&status)).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let rows = table(&k, &["get", "nodeclaims", "-n", "team-a", "-o", "wide"]);
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        for (column, want) in [
            ("NAME", "default-x7k2p"),
            ("CLUSTER", "prod-paris"),
            ("TYPE", "XS"),
            ("CAPACITY", "on-demand"),
            ("ZONE", "par"),
            ("NODE", "ng-x7k2p-node0"),
            ("READY", "True"),
            ("ID", "clevercloud://ng-x7k2p"),
            ("NODEPOOL", "default"),
            ("NODECLASS", "default"),
        ] {
            assert_eq!(row.get(column).map(String::as_str), Some(want), "{column}: {row:?}");
        }
        assert!(row["AGE"].ends_with('s') || row["AGE"].ends_with('m'), "{row:?}");
        let narrow = table(&k, &["get", "nc", "-n", "team-a"]);
        assert!(!narrow[0].contains_key("ID") && narrow[0]["TYPE"] == "XS", "{narrow:?}");
        // The NodePool columns operator/tests/suite/kubectl.rs checks on a real server, from the same status.
        let pools = table(&k, &["get", "nodepools", "-n", "team-a"]);
        assert_eq!(pools.len(), 1, "{pools:?}");
        for (column, want) in
            [("NAME", "default"), ("CLUSTER", "prod-paris"), ("NODES", "2"), ("CPU", "4"), ("MEMORY", "8Gi")]
        {
            assert_eq!(pools[0].get(column).map(String::as_str), Some(want), "{column}: {pools:?}");
        }
        // The sandbox banner's command for the management cluster, as written.
        let both = k.ok(&["get", "nodepools,nodeclaims", "-A"]);
        assert!(both.contains("nodeclaim.karpenter.clever-cloud.com/default-x7k2p") && both.contains("XS"), "{both}");
    })
    .await
    .unwrap();
    server.shutdown().await;
}

/// `kubectl explain` renders the CRDs' schemas (`/openapi/v3`): the field's type, description and
/// sub-fields with `-required-`, `metadata` as ObjectMeta, and an unknown field is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_renders_the_crd_schemas() {
    let Some((server, k)) = management("kubectl-explain").await else { return };
    tokio::task::spawn_blocking(move || {
        let spec = k.ok(&["explain", "nodepool.spec"]);
        eprintln!("{spec}");
        assert!(spec.contains("KIND:       NodePool") && spec.contains("VERSION:    v1alpha1"), "{spec}");
        assert!(spec.contains("FIELD: spec <Object>"), "{spec}");
        // Exactly one of clusterName and clusterSelector (a CEL rule): neither is required alone.
        assert!(spec.contains("clusterName\t<string>\n") && spec.contains("clusterSelector\t<Object>\n"), "{spec}");
        assert!(spec.contains("template\t<Object> -required-") && spec.contains("weight\t<integer>"), "{spec}");
        let reqs = k.ok(&["explain", "nodeclaims.spec.requirements.operator"]);
        assert!(reqs.contains("FIELD: operator <string>") && reqs.contains("ENUM:\n    In\n    NotIn"), "{reqs}");
        let class = k.ok(&["explain", "clevernodeclasses"]);
        assert!(class.contains("KIND:       CleverNodeClass") && class.contains("metadata\t<ObjectMeta>"), "{class}");
        let labels = k.ok(&["explain", "nodeclaim.metadata.labels"]);
        assert!(labels.contains("FIELD: labels <map[string]string>"), "{labels}");
        let missing = k.run(&["explain", "nodepool.spec.nosuchfield"]);
        assert!(!missing.status.success());
        let err = String::from_utf8_lossy(&missing.stderr);
        assert!(err.contains("nosuchfield") && err.contains("does not exist"), "{err}");
    })
    .await
    .unwrap();
    server.shutdown().await;
}

/// The hub writes events.k8s.io/v1 Events (kube-runtime's Recorder); `kubectl get events` (core/v1)
/// lists them and `kubectl describe nodeclaim` shows them in its Events section, a repeat as
/// `(x2 over …)`; an Event written through core/v1 reads through events.k8s.io/v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_events_and_describe_show_the_hubs_events() {
    let Some((server, k)) = management("kubectl-events").await else { return };
    let claim = launched_claim(&server).await;
    let recorder = kube::runtime::events::Recorder::new(server.client(), "karpenter-hub".into());
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("karpenter.clever-cloud.com", "v1alpha1", "NodeClaim"),
        "nodeclaims",
    );
    let reference = kube::Resource::object_ref(&claim, &ar);
    let launched = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Launched".into(),
        note: Some("Launched NodeGroup ng-x7k2p (XS)".into()),
        action: "Launch".into(),
        secondary: None,
    };
    let registered = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Registered".into(),
        note: Some("Node ng-x7k2p-node0 registered".into()),
        action: "Register".into(),
        secondary: None,
    };
    recorder.publish(&launched, &reference).await.unwrap();
    recorder.publish(&registered, &reference).await.unwrap();
    recorder.publish(&registered, &reference).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let rows = table(&k, &["get", "events", "-n", "team-a"]);
        assert_eq!(rows.len(), 2, "{rows:?}");
        for row in &rows {
            assert_eq!(row["OBJECT"], "nodeclaim/default-x7k2p", "{row:?}");
            assert_eq!(row["TYPE"], "Normal", "{row:?}");
        }
        assert!(rows.iter().any(|r| r["REASON"] == "Launched" && r["MESSAGE"] == "Launched NodeGroup ng-x7k2p (XS)"));
        let wide = table(&k, &["get", "events", "-n", "team-a", "-o", "wide"]);
        let reg = wide.iter().find(|r| r["REASON"] == "Registered").expect("the Registered event");
        assert_eq!(reg["COUNT"], "2", "{reg:?}");
        assert!(reg["SOURCE"].starts_with("karpenter-hub"), "{reg:?}");

        // kubectl's newer `events` command, as a person filters by object.
        let for_claim = k.ok(&["events", "-n", "team-a", "--for", "nodeclaim/default-x7k2p"]);
        assert!(for_claim.contains("Launched") && for_claim.contains("NodeClaim/default-x7k2p"), "{for_claim}");
        let all = table(&k, &["get", "events", "-A"]);
        assert!(all.iter().filter(|r| r["NAMESPACE"] == "team-a").count() == 2, "{all:?}");

        let described = k.ok(&["describe", "nodeclaim", "default-x7k2p", "-n", "team-a"]);
        eprintln!("{described}");
        let events = described.split("Events:").nth(1).expect("an Events section");
        assert!(!events.contains("<none>"), "{events}");
        assert!(events.contains("Launched") && events.contains("karpenter-hub"), "{events}");
        assert!(events.contains("Launched NodeGroup ng-x7k2p (XS)"), "{events}");
        assert!(events.contains("Registered") && events.contains("(x2 over"), "{events}");

        k.apply_yaml(
            &["apply", "-n", "team-a"],
            "apiVersion: v1\nkind: Event\nmetadata:\n  name: by-hand\ninvolvedObject:\n  kind: NodeClaim\n  name: default-x7k2p\n  namespace: team-a\nreason: ByHand\nmessage: written through core/v1\ntype: Warning\n",
        );
        let note = k.ok(&["get", "events.events.k8s.io", "by-hand", "-n", "team-a", "-o", "jsonpath={.note}/{.regarding.name}"]);
        assert_eq!(note, "written through core/v1/default-x7k2p");
    })
    .await
    .unwrap();
    server.shutdown().await;
}
