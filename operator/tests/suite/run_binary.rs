//! `karpenter-hub run` started as a person starts it: the binary, by hand, with a kubeconfig, its
//! output going to a pipe (as to a file or a log collector). The same scenario runs against the
//! management emulator and against a real kube-apiserver (envtest; a visible skip without
//! `KUBEBUILDER_ASSETS`).
//!
//! - The leader election Lease's namespace, named with `--leader-election-namespace` but missing:
//!   the hub stops at once with one line saying what to do, and creates nothing.
//! - The default namespace (`karpenter-hub`, nobody chose it) missing and the identity may not
//!   create namespaces: the same, saying why it was not created.
//! - The default namespace missing, an identity that may create it: created, the hub leads.
//! - In every case, no ANSI colour codes and no Rust debug formatting in what it writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, Client, api::PostParams, config::Kubeconfig};
use secrecy::SecretString;
use serde_json::json;
use sim::apiserver::{ApiServer, ApiServerConfig};

use crate::common;
use common::poll_until;

/// A fresh directory for this scenario's kubeconfig files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("karpenter-hub-run-binary-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_kubeconfig(kc: &Kubeconfig, path: &Path) {
    // JSON is YAML; the token is written in clear, as in any kubeconfig file.
    let mut value = serde_json::to_value(kc).unwrap();
    if let Some(users) = value.get_mut("users").and_then(|u| u.as_array_mut()) {
        for (i, user) in users.iter_mut().enumerate() {
            if let Some(token) = kc.auth_infos[i].auth_info.as_ref().and_then(|a| a.token.as_ref()) {
                user["user"]["token"] = json!(secrecy::ExposeSecret::expose_secret(token));
            }
        }
    }
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

/// `kc` with its user's credentials replaced by `token`.
fn with_token(kc: &Kubeconfig, token: &str) -> Kubeconfig {
    let mut kc = kc.clone();
    for named in &mut kc.auth_infos {
        let auth = named.auth_info.get_or_insert_with(Default::default);
        *auth = kube::config::AuthInfo { token: Some(SecretString::from(token.to_string())), ..Default::default() };
    }
    kc
}

/// The `karpenter-hub` binary with a clean environment (no `NO_COLOR`, no `POD_NAMESPACE`, no
/// `RUST_LOG`: the defaults a person gets), stdout and stderr to pipes read line by line.
struct Hub {
    child: Child,
    output: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Hub {
    fn start(args: &[&str]) -> Hub {
        let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for pipe in [stdout, stderr] {
            let output = output.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut out = output.lock().unwrap_or_else(PoisonError::into_inner);
                    out.push_str(&line);
                    out.push('\n');
                }
            }));
        }
        Hub { child, output, readers }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Wait (bounded) until the output contains `text`; fail at once if the process exits first.
    async fn wait_for_output(&mut self, text: &str, timeout: Duration) {
        let mut exited = None;
        let written = poll_until(timeout, || {
            exited = self.child.try_wait().unwrap();
            std::future::ready(self.output().contains(text) || exited.is_some())
        })
        .await;
        if let Some(status) = exited.filter(|_| !self.output().contains(text)) {
            panic!("karpenter-hub exited ({status}) before writing {text:?}:\n{}", self.output());
        }
        assert!(written, "karpenter-hub did not write {text:?} within {timeout:?}:\n{}", self.output());
    }

    /// Wait (bounded) for the process to exit; its status and everything it wrote.
    async fn exit(mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let mut exited = None;
        poll_until(timeout, || {
            exited = self.child.try_wait().unwrap();
            std::future::ready(exited.is_some())
        })
        .await;
        let Some(status) = exited else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("karpenter-hub did not exit within {timeout:?}:\n{}", self.output());
        };
        for r in self.readers.drain(..) {
            r.join().unwrap();
        }
        (status, self.output())
    }

    /// SIGTERM, as Kubernetes stops a pod.
    fn terminate(&self) {
        let ok = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success());
    }
}

/// What a person reads: no terminal escape codes, no Rust debug formatting.
#[track_caller]
fn readable(output: &str) {
    assert!(!output.contains('\u{1b}'), "ANSI escape codes written to a pipe:\n{output}");
    for debug in ["Status {", "Some(", "ErrorResponse {"] {
        assert!(!output.contains(debug), "Rust debug formatting ({debug}) in the output:\n{output}");
    }
}

/// An identity that may do everything with Leases but nothing with Namespaces: a ServiceAccount's
/// token, bound by a ClusterRole.
async fn lease_only_token(admin: &Client, tag: &str) -> String {
    let home = format!("leaser-{tag}");
    create_namespace(admin, &home).await;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "leaser"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), &home).create(&PostParams::default(), &sa).await.unwrap();
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": format!("leases-{tag}")},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("leases-{tag}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("leases-{tag}")},
        "subjects": [{"kind": "ServiceAccount", "name": "leaser", "namespace": home}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), &home)
        .create_token_request("leaser", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

async fn namespace_exists(client: &Client, name: &str) -> bool {
    Api::<Namespace>::all(client.clone()).get_opt(name).await.unwrap().is_some()
}

/// The whole scenario against one management API server whose `karpenter-hub` namespace does not
/// exist yet.
async fn a_missing_lease_namespace_is_explained_once_or_created(admin: Client, admin_kc: Kubeconfig, tag: &str) {
    assert!(!namespace_exists(&admin, "karpenter-hub").await, "the scenario starts without the namespace");
    let dir = scratch(tag);
    let admin_path = dir.join("admin.kubeconfig");
    write_kubeconfig(&admin_kc, &admin_path);
    let admin_arg = admin_path.to_str().unwrap();
    // The Lease of a given id (without --hub-id the id is chosen first, which reads kube-system).
    let common = ["--metrics-addr", "127.0.0.1:0", "--hub-id=default"];

    // Named but missing: probably a typo; explained in one line, nothing created, exit non-zero.
    let missing = format!("nowhere-{tag}");
    let started = Instant::now();
    let hub = Hub::start(
        &[&["run", "--kubeconfig", admin_arg, "--leader-election-namespace", &missing][..], &common[..]].concat(),
    );
    let (status, output) = hub.exit(Duration::from_secs(30)).await;
    eprintln!("a named missing namespace: exit after {:.1}s", started.elapsed().as_secs_f64());
    assert!(!status.success(), "{output}");
    readable(&output);
    let about: Vec<&str> = output.lines().filter(|l| l.contains(&missing)).collect();
    assert_eq!(about.len(), 1, "one line about the namespace:\n{output}");
    eprintln!("{}", about[0]);
    for what_to_do in [
        format!("kubectl create namespace {missing}"),
        "--leader-election-namespace".into(),
        "--leader-elect=false".into(),
    ] {
        assert!(about[0].contains(&what_to_do), "the line says {what_to_do:?}: {}", about[0]);
    }
    assert!(!namespace_exists(&admin, &missing).await, "a namespace someone named is not created behind their back");

    // The default namespace, an identity that may not create namespaces: why, and what to do.
    let token = lease_only_token(&admin, tag).await;
    let leaser_path = dir.join("leaser.kubeconfig");
    write_kubeconfig(&with_token(&admin_kc, &token), &leaser_path);
    let hub = Hub::start(&[&["run", "--kubeconfig", leaser_path.to_str().unwrap()][..], &common[..]].concat());
    let (status, output) = hub.exit(Duration::from_secs(30)).await;
    assert!(!status.success(), "{output}");
    readable(&output);
    let about: Vec<&str> = output.lines().filter(|l| l.contains("karpenter-hub does not exist")).collect();
    assert_eq!(about.len(), 1, "one line about the namespace:\n{output}");
    eprintln!("{}", about[0]);
    assert!(about[0].contains("creating it failed") && about[0].contains("403"), "{}", about[0]);
    assert!(about[0].contains("--leader-elect=false"), "{}", about[0]);
    assert!(!namespace_exists(&admin, "karpenter-hub").await);

    // The default namespace, an identity that may create it: it just works.
    let started = Instant::now();
    let mut hub = Hub::start(&[&["run", "--kubeconfig", admin_arg][..], &common[..]].concat());
    hub.wait_for_output("became the leader", Duration::from_secs(30)).await;
    eprintln!("the default namespace created and led after {:.1}s", started.elapsed().as_secs_f64());
    assert!(namespace_exists(&admin, "karpenter-hub").await);
    let lease = Api::<Lease>::namespaced(admin.clone(), "karpenter-hub").get("karpenter-hub-default").await.unwrap();
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    assert!(hub.output().contains("created namespace karpenter-hub"), "{}", hub.output());
    hub.terminate();
    let (status, output) = hub.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "a SIGTERM stops the hub cleanly:\n{output}");
    readable(&output);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_namespace_is_explained_once_or_created_on_the_emulator() {
    let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    a_missing_lease_namespace_is_explained_once_or_created(server.client(), server.kubeconfig(), "emulator").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_namespace_is_explained_once_or_created_on_a_real_api_server() {
    // A plane of its own: the scenario needs the default namespace `karpenter-hub` absent.
    let cp = envtest::shared_or_skip!("run-binary");
    let kc = cp.kubeconfig().unwrap();
    a_missing_lease_namespace_is_explained_once_or_created(cp.client().await.unwrap(), kc, "real").await;
}

/// An identity the Lease's namespace exists for but that may not touch Leases (RBAC not applied
/// yet): the hub keeps trying, as a standby would, but says so once, not at every 2 s retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_leader_election_is_logged_once_while_retrying_on_the_emulator() {
    let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let admin = server.client();
    create_namespace(&admin, "hub-home").await;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "nobody"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "hub-home").create(&PostParams::default(), &sa).await.unwrap();
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), "hub-home")
        .create_token_request("nobody", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let dir = scratch("refused");
    let path = dir.join("nobody.kubeconfig");
    write_kubeconfig(&with_token(&server.kubeconfig(), &token), &path);

    let hub = Hub::start(&[
        "run",
        "--kubeconfig",
        path.to_str().unwrap(),
        "--leader-election-namespace",
        "hub-home",
        "--metrics-addr",
        "127.0.0.1:0",
        "--hub-id=default",
    ]);
    // Four attempts (three retries) seen by the API server.
    let requests = server.requests();
    let tried = poll_until(Duration::from_secs(30), || std::future::ready(requests.count("get", "leases") >= 4)).await;
    assert!(tried, "the hub stopped trying to take the Lease:\n{}", hub.output());
    hub.terminate();
    let (status, output) = hub.exit(Duration::from_secs(30)).await;
    assert!(status.success(), "a SIGTERM while standing by stops the hub cleanly:\n{output}");
    readable(&output);
    let warned: Vec<&str> = output.lines().filter(|l| l.contains("cannot take part in leader election")).collect();
    assert_eq!(warned.len(), 1, "one line for {} refused attempts:\n{output}", requests.count("get", "leases"));
    assert!(warned[0].contains("403 Forbidden") && warned[0].contains("hub-home"), "{}", warned[0]);
    eprintln!("{}", warned[0]);
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await;
}

/// The README's `karpenter-hub sim-cke --kubeconfig workload.kubeconfig`, as written: the binary
/// plays CKE on a cluster without it — a NodeGroup it is given is judged (Synced; its node joins
/// after CKE's 25 s, which sim/tests cover) — and stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_cke_plays_cke_on_a_workload_cluster_and_stops_on_sigterm() {
    let server = ApiServer::start(ApiServerConfig::workload("sim-cke-binary")).await.unwrap();
    let dir = scratch("sim-cke");
    let file = dir.join("workload.kubeconfig");
    write_kubeconfig(&server.kubeconfig(), &file);
    let cke = Hub::start(&["sim-cke", "--kubeconfig", &file.display().to_string()]);
    let groups: Api<crds::NodeGroup> = Api::all(server.client());
    let group: crds::NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": "readme-group"},
        "spec": {"flavor": "2XS", "nodeCount": 1}
    }))
    .unwrap();
    groups.create(&PostParams::default(), &group).await.unwrap();
    let synced = poll_until(Duration::from_secs(30), || async {
        groups.get("readme-group").await.ok().and_then(|g| g.status).and_then(|s| s.phase).as_deref() == Some("Synced")
    })
    .await;
    assert!(synced, "the NodeGroup was not judged:\n{}", cke.output());
    cke.terminate();
    let (status, output) = cke.exit(Duration::from_secs(20)).await;
    assert!(status.success(), "sim-cke did not stop cleanly ({status}):\n{output}");
    readable(&output);
    let _ = std::fs::remove_dir_all(&dir);
}
