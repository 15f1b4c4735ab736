//! The emulator's own features, beyond kube-apiserver conformance: fault injection (500s, 429/503,
//! latency, dropped watches, 401, unreachability), request counters, kubeconfigs, manual clock,
//! service-account tokens, a small watch history, and twenty clusters in one process.
//! Waits are bounded; nothing sleeps on wall time except where latency itself is measured.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use sim::apiserver::{ApiServer, ApiServerConfig, ErrorFault};
use sim::clock::Clock;

const TIMEOUT: Duration = Duration::from_secs(30);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// A client that does not retry 429/503 (kube's default does, for minutes).
fn no_retry_client(s: &ApiServer) -> Client {
    let mut cfg = s.client_config();
    cfg.default_retry = false;
    Client::try_from(cfg).unwrap()
}

fn api_code(r: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn injected_500s_fail_the_configured_share_then_clear() {
    let s = ApiServer::start(ApiServerConfig::new("faults-500").with_seed(7)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    s.faults().fail_requests(1.0, 500);
    assert_eq!(api_code(cms.get("a").await), 500);
    s.faults().fail_requests(0.5, 500);
    let mut failed = 0;
    for _ in 0..100 {
        if cms.get("a").await.is_err() {
            failed += 1;
        }
    }
    assert!((30..=70).contains(&failed), "{failed} of 100 failed at rate 0.5");
    assert!(s.faults().injected_errors() >= 31);
    s.faults().clear();
    cms.get("a").await.unwrap();
    s.shutdown().await;
}

#[tokio::test]
async fn injected_errors_can_target_verbs_and_resources() {
    let s = ApiServer::start(ApiServerConfig::new("faults-target")).await.unwrap();
    let client = no_retry_client(&s);
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    s.faults().set_error(ErrorFault {
        rate: 1.0,
        status: 503,
        verbs: vec!["create".into()],
        resources: vec!["configmaps".into()],
    });
    assert_eq!(api_code(cms.create(&PostParams::default(), &cm("x")).await), 503);
    cms.list(&ListParams::default()).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.list(&ListParams::default()).await.unwrap();
    s.faults().set_error(ErrorFault::all(1.0, 429));
    assert_eq!(api_code(cms.list(&ListParams::default()).await), 429);
    s.shutdown().await;
}

#[tokio::test]
async fn default_client_retries_through_transient_429s() {
    let s = ApiServer::start(ApiServerConfig::new("faults-retry").with_seed(1)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    s.faults().fail_requests(0.3, 429);
    for i in 0..4 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"))).await.unwrap();
    }
    assert!(s.requests().count("create", "configmaps") > 4, "some creates were retried");
    s.shutdown().await;
}

#[tokio::test]
async fn latency_delays_every_request() {
    let s = ApiServer::start(ApiServerConfig::new("faults-latency")).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.list(&ListParams::default()).await.unwrap();
    s.faults().set_latency(Duration::from_millis(150));
    let t = Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    s.shutdown().await;
}

#[tokio::test]
async fn expired_credentials_get_401_until_restored_and_rotation_locks_out_old_tokens() {
    let s = ApiServer::start(ApiServerConfig::new("faults-401")).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.list(&ListParams::default()).await.unwrap();
    s.faults().expire_credentials();
    assert_eq!(api_code(cms.list(&ListParams::default()).await), 401);
    s.faults().restore_credentials();
    cms.list(&ListParams::default()).await.unwrap();
    let old = s.token();
    let new = s.rotate_token();
    assert_ne!(old, new);
    assert_eq!(api_code(cms.list(&ListParams::default()).await), 401);
    let fresh: Api<ConfigMap> = Api::default_namespaced(s.client());
    fresh.list(&ListParams::default()).await.unwrap();
    // A wrong token is 401 too.
    let wrong: Api<ConfigMap> = Api::default_namespaced(s.client_with_token("nope"));
    assert_eq!(api_code(wrong.list(&ListParams::default()).await), 401);
    s.shutdown().await;
}

#[tokio::test]
async fn unreachable_cluster_fails_fast_and_recovers() {
    let s = ApiServer::start(ApiServerConfig::new("faults-unreachable")).await.unwrap();
    let client = s.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().timeout(60), &rv).await.unwrap().boxed();
    s.faults().set_unreachable(true);
    assert!(s.faults().is_unreachable());
    // The open watch is cut.
    let cut = tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "watch was not cut");
    let t = Instant::now();
    let r = cms.get("a").await;
    assert!(matches!(r, Err(ref e) if !matches!(e, kube::Error::Api(_))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "unreachable requests fail fast");
    s.faults().set_unreachable(false);
    let back = tokio::time::timeout(TIMEOUT, async {
        loop {
            if cms.get("a").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "reachable again");
    s.shutdown().await;
}

#[tokio::test]
async fn blackholed_cluster_hangs_requests_until_cleared() {
    let s = ApiServer::start(ApiServerConfig::new("faults-blackhole")).await.unwrap();
    let mut cfg = s.client_config();
    cfg.read_timeout = Some(Duration::from_millis(300));
    let cms: Api<ConfigMap> = Api::default_namespaced(Client::try_from(cfg).unwrap());
    cms.list(&ListParams::default()).await.unwrap();
    s.faults().set_blackhole(true);
    // No answer at all: the client's read timeout ends the request (not an error answer, not a
    // refused connection). The timer may have started on the pooled connection before the request,
    // so the time it took says less than the kind of error.
    let err = cms.list(&ListParams::default()).await.expect_err("the client's read timeout fires");
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut timed_out = false;
    while let Some(e) = source {
        timed_out |= e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        source = e.source();
    }
    assert!(timed_out, "the request hung until the client's read timeout: {err:?}");
    // A held request completes once the black hole is cleared.
    let patient: Api<ConfigMap> = Api::default_namespaced(s.client());
    let held = tokio::spawn(async move { patient.list(&ListParams::default()).await.map(|l| l.items.len()) });
    s.faults().set_blackhole(false);
    tokio::time::timeout(TIMEOUT, held).await.unwrap().unwrap().unwrap();
    s.shutdown().await;
}

#[tokio::test]
async fn version_and_health_are_public_but_bad_tokens_are_not() {
    let s = ApiServer::start(ApiServerConfig::new("public")).await.unwrap();
    let http = |token: Option<&str>, path: &str| {
        let mut cfg = s.client_config();
        cfg.auth_info = Default::default();
        if let Some(t) = token {
            cfg.auth_info.token = Some(t.to_string().into());
        }
        let client = Client::try_from(cfg).unwrap();
        let req = http::Request::get(path.to_string()).body(Vec::new()).unwrap();
        async move { client.request_text(req).await }
    };
    assert!(http(None, "/version").await.is_ok());
    assert!(http(None, "/readyz").await.is_ok());
    assert!(http(None, "/api/v1/namespaces").await.is_err());
    assert!(http(Some("bad"), "/version").await.is_err());
    s.shutdown().await;
}

#[tokio::test]
async fn dropped_watches_resume_from_the_last_resource_version_without_relisting() {
    let s = ApiServer::start(ApiServerConfig::new("faults-watch")).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut stream = Box::pin(watcher(cms.clone(), watcher::Config::default()));
    let mut names = std::collections::BTreeSet::new();
    let mut next = async |names: &mut std::collections::BTreeSet<String>| {
        let ev = tokio::time::timeout(TIMEOUT, stream.try_next()).await.expect("event in time").unwrap().unwrap();
        if let watcher::Event::Apply(c) | watcher::Event::InitApply(c) = ev {
            names.insert(c.name_any());
        }
    };
    // Initial list done.
    cms.create(&PostParams::default(), &cm("first")).await.unwrap();
    while !names.contains("first") {
        next(&mut names).await;
    }
    for i in 0..3 {
        s.faults().drop_watches();
        let name = format!("after-drop-{i}");
        cms.create(&PostParams::default(), &cm(&name)).await.unwrap();
        while !names.contains(&name) {
            next(&mut names).await;
        }
    }
    let req = s.requests();
    assert_eq!(req.count("list", "configmaps"), 1, "{:?}", req.snapshot());
    assert!(req.count("watch", "configmaps") >= 2, "{:?}", req.snapshot());
    s.shutdown().await;
}

#[tokio::test]
async fn small_watch_history_answers_410_for_old_versions_and_continue_tokens() {
    let mut cfg = ApiServerConfig::new("history");
    cfg.watch_history = 16;
    let s = ApiServer::start(cfg).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    for i in 0..40 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"))).await.unwrap();
    }
    let mut stream = cms.watch(&WatchParams::default().timeout(30), &rv).await.unwrap().boxed();
    match tokio::time::timeout(TIMEOUT, stream.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    // A continue token from before the history window is 410 too.
    let page = cms.list(&ListParams::default().limit(5)).await.unwrap();
    let token = page.metadata.continue_.clone().unwrap();
    for i in 40..60 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"))).await.unwrap();
    }
    assert_eq!(api_code(cms.list(&ListParams::default().limit(5).continue_token(&token)).await), 410);
    s.shutdown().await;
}

#[tokio::test]
async fn request_counters_by_verb_and_resource() {
    let s = ApiServer::start(ApiServerConfig::new("counters")).await.unwrap();
    let client = s.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    cms.get("a").await.unwrap();
    cms.list(&ListParams::default()).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "w"}}))).await.unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.evict("p", &Default::default()).await.unwrap();
    let r = s.requests();
    for (verb, res) in [
        ("create", "configmaps"),
        ("get", "configmaps"),
        ("list", "configmaps"),
        ("patch", "configmaps"),
        ("delete", "configmaps"),
        ("create", "pods/eviction"),
    ] {
        assert_eq!(r.count(verb, res), 1, "{verb} {res}: {:?}", r.snapshot());
    }
    assert_eq!(r.writes(), 5);
    r.reset();
    assert_eq!(r.total(), 0);
    s.shutdown().await;
}

#[tokio::test]
async fn written_kubeconfig_works_with_kube() {
    let s = ApiServer::start(ApiServerConfig::workload("kubeconfig")).await.unwrap();
    let path = std::env::temp_dir().join(format!("sim-kubeconfig-{}.yaml", std::process::id()));
    s.write_kubeconfig(&path).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(kc.current_context.as_deref(), Some("kubeconfig"));
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let client = Client::try_from(cfg).unwrap();
    let groups: Api<crds::nodegroup::NodeGroup> = Api::all(client);
    assert!(groups.list(&ListParams::default()).await.unwrap().items.is_empty());
    s.shutdown().await;
}

#[tokio::test]
async fn manual_clock_stamps_objects() {
    let clock = Clock::manual_default();
    let s = ApiServer::start(ApiServerConfig::new("clock").with_clock(clock.clone())).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert_eq!(a.metadata.creation_timestamp.unwrap().0.as_second(), clock.now().timestamp());
    clock.advance(Duration::from_secs(3600));
    let b = cms.create(&PostParams::default(), &cm("b")).await.unwrap();
    assert_eq!(b.metadata.creation_timestamp.unwrap().0.as_second(), clock.now().timestamp());
    s.shutdown().await;
}

#[tokio::test]
async fn service_account_tokens_authenticate() {
    let s = ApiServer::start(ApiServerConfig::new("tokens")).await.unwrap();
    let client = s.client();
    let req = http::Request::post("/api/v1/namespaces/default/serviceaccounts/default/token")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}))
                .unwrap(),
        )
        .unwrap();
    let tr: serde_json::Value = client.request(req).await.unwrap();
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    let as_sa: Api<ConfigMap> = Api::default_namespaced(s.client_with_token(&token));
    // Authenticated, but RBAC grants nothing yet: 403, not 401.
    assert_eq!(api_code(as_sa.list(&ListParams::default()).await), 403);
    let crbs: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(client.clone());
    let crb = serde_json::from_value(json!({
        "metadata": {"name": "default-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]
    }))
    .unwrap();
    crbs.create(&PostParams::default(), &crb).await.unwrap();
    as_sa.list(&ListParams::default()).await.unwrap();
    // A token Secret gets its token filled in, usable as well.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::default_namespaced(client);
    let sec = serde_json::from_value(json!({
        "metadata": {"name": "sa-token", "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token"
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &sec).await.unwrap();
    let sec = secrets.get("sa-token").await.unwrap();
    let tok = String::from_utf8(sec.data.unwrap()["token"].0.clone()).unwrap();
    let as_sa: Api<ConfigMap> = Api::default_namespaced(s.client_with_token(&tok));
    as_sa.list(&ListParams::default()).await.unwrap();
    s.shutdown().await;
}

/// Twenty clusters in one process: each has its own state, tokens and faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_clusters_in_one_process_are_isolated() {
    let start = Instant::now();
    let mut servers = Vec::new();
    for i in 0..20 {
        servers.push(ApiServer::start(ApiServerConfig::workload(format!("cluster-{i}")).with_seed(i)).await.unwrap());
    }
    let mut tasks = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let client = s.client();
        tasks.push(tokio::spawn(async move {
            let cms: Api<ConfigMap> = Api::default_namespaced(client);
            for j in 0..10 {
                cms.create(&PostParams::default(), &cm(&format!("c{i}-{j}"))).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // One cluster down does not affect the others.
    servers[3].faults().set_unreachable(true);
    servers[4].faults().expire_credentials();
    for (i, s) in servers.iter().enumerate() {
        let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
        let r = cms.list(&ListParams::default()).await;
        match i {
            3 => assert!(r.is_err()),
            4 => assert_eq!(api_code(r), 401),
            _ => {
                let names: Vec<String> =
                    r.unwrap().items.iter().map(|c| c.name_any()).filter(|n| n.starts_with('c')).collect();
                assert_eq!(names.len(), 10);
                assert!(names.iter().all(|n| n.starts_with(&format!("c{i}-"))), "{names:?}");
            }
        }
    }
    // Tokens are per cluster.
    let cross: Api<ConfigMap> = Api::default_namespaced(servers[0].client_with_token(&servers[1].token()));
    assert_eq!(api_code(cross.list(&ListParams::default()).await), 401);
    for s in servers {
        s.shutdown().await;
    }
    assert!(start.elapsed() < Duration::from_secs(60));
}
