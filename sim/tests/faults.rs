//! Fault injection on the emulator's API traffic, seen through kube-rs clients: injected 409s on
//! every write kind (worded and shaped as kube-apiserver's, the write applied or not as a real
//! server's would be), watch streams expired with 410 so clients relist, watch churn, slow
//! responses with seeded jitter, several error faults at once, the counts by kind, and the header
//! that keeps a test's observers out of it all. Waits are bounded; only latency is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use sim::apiserver::{
    ApiServer, ApiServerConfig, ConflictFault, ErrorFault, FaultKind, SlowFault, WatchChurn, exempt_from_faults,
};

const TIMEOUT: Duration = Duration::from_secs(30);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// A client that does not retry 429/503, so each answer is seen as the server gave it.
fn no_retry_client(s: &ApiServer) -> Client {
    let mut cfg = s.client_config();
    cfg.default_retry = false;
    Client::try_from(cfg).unwrap()
}

/// A client the faults never touch (a test's observer).
fn exempt_client(s: &ApiServer) -> Client {
    let mut cfg = s.client_config();
    cfg.default_retry = false;
    exempt_from_faults(&mut cfg);
    Client::try_from(cfg).unwrap()
}

fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn all_conflicts(s: &ApiServer) {
    s.faults().set_conflicts(Some(ConflictFault { rate: 1.0, resources: vec!["configmaps".into()] }));
}

const MODIFIED: &str = "the object has been modified; please apply your changes to the latest version and try again";

#[tokio::test]
async fn injected_conflicts_refuse_updates_patches_and_deletes_unapplied_as_a_real_server_words_them() {
    let s = ApiServer::start(ApiServerConfig::new("conflict-writes").with_seed(3)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    let observer: Api<ConfigMap> = Api::default_namespaced(exempt_client(&s));
    let a = cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = a.resource_version().unwrap();
    all_conflicts(&s);

    let mut changed = a.clone();
    changed.data = Some([("k".to_string(), "w".to_string())].into());
    let e = api_error(cms.replace("a", &PostParams::default(), &changed).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(e.message, format!("Operation cannot be fulfilled on configmaps \"a\": {MODIFIED}"));
    let merge = Patch::Merge(json!({"data": {"k": "m"}}));
    let e = api_error(cms.patch("a", &PatchParams::default(), &merge).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"), "{}", e.message);
    let e = api_error(cms.delete("a", &DeleteParams::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"), "{}", e.message);
    // None of them was applied: same object, same resourceVersion.
    let now = observer.get("a").await.unwrap();
    assert_eq!(now.resource_version().unwrap(), rv);
    assert_eq!(now.data.unwrap()["k"], "v");

    // A missing object is 404, as on a real server, never a conflict.
    let e = api_error(cms.patch("missing", &PatchParams::default(), &merge).await);
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    let e = api_error(cms.delete("missing", &DeleteParams::default()).await);
    assert_eq!(e.code, 404);

    // The exempt observer writes through; the faulted client does once conflicts stop.
    observer.patch("a", &PatchParams::default(), &merge).await.unwrap();
    s.faults().set_conflicts(None);
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let kinds = s.faults().injected_by_kind();
    assert_eq!(kinds.get(&FaultKind::Conflict), Some(&3), "{kinds:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn injected_conflicts_on_status_writes_and_targeted_resources_only() {
    let s = ApiServer::start(ApiServerConfig::new("conflict-status").with_seed(4)).await.unwrap();
    let client = no_retry_client(&s);
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    cms.create(&PostParams::default(), &cm("c")).await.unwrap();
    s.faults().set_conflicts(Some(ConflictFault { rate: 1.0, resources: vec!["pods".into()] }));
    let status = Patch::Merge(json!({"status": {"phase": "Running"}}));
    let e = api_error(pods.patch_status("p", &PatchParams::default(), &status).await);
    assert_eq!(e.message, format!("Operation cannot be fulfilled on pods \"p\": {MODIFIED}"));
    // Other resources are untouched.
    cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "x"}}))).await.unwrap();
    s.shutdown().await;
}

#[tokio::test]
async fn an_injected_conflict_on_create_stores_the_object_and_answers_already_exists() {
    let s = ApiServer::start(ApiServerConfig::new("conflict-create").with_seed(5)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    let observer: Api<ConfigMap> = Api::default_namespaced(exempt_client(&s));
    all_conflicts(&s);
    // What a client sees when it retries a create whose first answer was lost.
    let e = api_error(cms.create(&PostParams::default(), &cm("lost-answer")).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "configmaps \"lost-answer\" already exists");
    let stored = observer.get("lost-answer").await.unwrap();
    assert_eq!(stored.data.unwrap()["k"], "v");
    // generateName never gets AlreadyExists (the server picks a fresh name); dry runs are untouched.
    let generated: ConfigMap = serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let made = cms.create(&PostParams::default(), &generated).await.unwrap();
    assert!(made.name_any().starts_with("gen-"));
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    cms.create(&dry, &cm("dry")).await.unwrap();
    assert!(observer.get_opt("dry").await.unwrap().is_none());
    assert_eq!(s.faults().injected_by_kind().get(&FaultKind::AlreadyExists), Some(&1));
    s.shutdown().await;
}

#[tokio::test]
async fn conflicts_hit_the_configured_share_and_the_draws_are_seeded() {
    async fn run(seed: u64) -> Vec<bool> {
        let s = ApiServer::start(ApiServerConfig::new("conflict-share").with_seed(seed)).await.unwrap();
        let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
        cms.create(&PostParams::default(), &cm("a")).await.unwrap();
        s.faults().set_conflicts(Some(ConflictFault { rate: 0.3, resources: Vec::new() }));
        let mut refused = Vec::new();
        for i in 0..100 {
            let r = cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"i": i.to_string()}}))).await;
            refused.push(r.is_err());
        }
        s.shutdown().await;
        refused
    }
    let a = run(11).await;
    let n = a.iter().filter(|r| **r).count();
    assert!((15..=45).contains(&n), "{n} of 100 patches refused at rate 0.3");
    assert_eq!(a, run(11).await, "the same seed refuses the same requests");
    assert_ne!(a, run(12).await, "another seed refuses others");
}

#[tokio::test]
async fn expired_watches_end_with_410_and_rewatching_from_before_is_refused() {
    let s = ApiServer::start(ApiServerConfig::new("expire-raw").with_seed(6)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default().timeout(60), &rv).await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("b")).await.unwrap();
    match tokio::time::timeout(TIMEOUT, stream.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(c) => assert_eq!(c.name_any(), "b"),
        other => panic!("expected b, got {other:?}"),
    }
    s.faults().expire_watches();
    match tokio::time::timeout(TIMEOUT, stream.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert_eq!(e.message, "The resourceVersion for the provided watch is too old.");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(tokio::time::timeout(TIMEOUT, stream.next()).await.unwrap().is_none(), "the stream ends");
    // Re-watching from the old version is refused as after a compaction; from a fresh list it works.
    let mut again = cms.watch(&WatchParams::default().timeout(60), &rv).await.unwrap().boxed();
    match tokio::time::timeout(TIMEOUT, again.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(e.message.starts_with(&format!("too old resource version: {rv} (")), "{}", e.message);
        }
        other => panic!("expected 410, got {other:?}"),
    }
    let fresh = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut ok = cms.watch(&WatchParams::default().timeout(60), &fresh).await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("c")).await.unwrap();
    match tokio::time::timeout(TIMEOUT, ok.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(c) => assert_eq!(c.name_any(), "c"),
        other => panic!("expected c, got {other:?}"),
    }
    let kinds = s.faults().injected_by_kind();
    assert_eq!(kinds.get(&FaultKind::WatchExpired), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get(&FaultKind::WatchRefusedExpired), Some(&1), "{kinds:?}");
    s.shutdown().await;
}

/// Names a kube-runtime watcher has seen, and whether it got through `names`.
async fn watch_until(
    stream: &mut (impl futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin),
    seen: &mut BTreeSet<String>,
    name: &str,
) {
    tokio::time::timeout(TIMEOUT, async {
        while !seen.contains(name) {
            // A 410 surfaces as one error item; the watcher then relists by itself.
            if let Ok(Some(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) = stream.try_next().await {
                seen.insert(c.name_any());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} not seen in time"));
}

#[tokio::test]
async fn a_kube_runtime_watcher_relists_after_an_expiry_and_resumes_after_a_drop() {
    let s = ApiServer::start(ApiServerConfig::new("expire-watcher").with_seed(8)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let writer: Api<ConfigMap> = Api::default_namespaced(exempt_client(&s));
    let mut stream = Box::pin(watcher(cms, watcher::Config::default()));
    let mut seen = BTreeSet::new();
    writer.create(&PostParams::default(), &cm("first")).await.unwrap();
    watch_until(&mut stream, &mut seen, "first").await;
    assert_eq!(s.requests().count("list", "configmaps"), 1);
    s.faults().drop_watches();
    writer.create(&PostParams::default(), &cm("after-drop")).await.unwrap();
    watch_until(&mut stream, &mut seen, "after-drop").await;
    assert_eq!(s.requests().count("list", "configmaps"), 1, "a drop resumes without a relist");
    s.faults().expire_watches();
    writer.create(&PostParams::default(), &cm("after-expiry")).await.unwrap();
    watch_until(&mut stream, &mut seen, "after-expiry").await;
    assert_eq!(s.requests().count("list", "configmaps"), 2, "an expiry makes the watcher relist once");
    s.shutdown().await;
}

#[tokio::test]
async fn watch_churn_ends_streams_after_seeded_lifetimes_some_expired() {
    let s = ApiServer::start(ApiServerConfig::new("churn").with_seed(9)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let writer: Api<ConfigMap> = Api::default_namespaced(exempt_client(&s));
    s.faults().set_watch_churn(Some(WatchChurn {
        min_life: Duration::from_millis(50),
        max_life: Duration::from_millis(150),
        expired_share: 0.5,
    }));
    let mut stream = Box::pin(watcher(cms, watcher::Config::default()));
    let mut seen = BTreeSet::new();
    for i in 0..12 {
        let name = format!("c{i}");
        writer.create(&PostParams::default(), &cm(&name)).await.unwrap();
        watch_until(&mut stream, &mut seen, &name).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kinds = s.faults().injected_by_kind();
    let dropped = kinds.get(&FaultKind::WatchDropped).copied().unwrap_or(0);
    let expired = kinds.get(&FaultKind::WatchExpired).copied().unwrap_or(0);
    assert!(dropped >= 1 && expired >= 1, "both kinds of end: {kinds:?}");
    let lists = s.requests().count("list", "configmaps");
    // Every expiry (and only an expiry) costs the watcher a relist.
    assert!(lists > 1 && lists <= 1 + expired, "{lists} lists for {expired} expiries: {kinds:?}");
    s.faults().set_watch_churn(None);
    s.shutdown().await;
}

#[tokio::test]
async fn slow_responses_wait_within_the_jitter_range_for_the_configured_share() {
    let s = ApiServer::start(ApiServerConfig::new("slow").with_seed(10)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let observer: Api<ConfigMap> = Api::default_namespaced(exempt_client(&s));
    cms.list(&ListParams::default()).await.unwrap();
    s.faults().set_slow(Some(SlowFault {
        rate: 1.0,
        min: Duration::from_millis(100),
        max: Duration::from_millis(200),
    }));
    let t = Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100), "{:?}", t.elapsed());
    // Only lower bounds of time are asserted (a loaded machine stretches every request); the share
    // is checked on the count, which the exempt observer's request does not add to.
    s.faults().set_slow(Some(SlowFault { rate: 0.25, min: Duration::ZERO, max: Duration::from_millis(5) }));
    for _ in 0..40 {
        cms.list(&ListParams::default()).await.unwrap();
    }
    observer.list(&ListParams::default()).await.unwrap();
    let slow = s.faults().injected_by_kind()[&FaultKind::Slow];
    assert!((1 + 3..=1 + 20).contains(&slow), "{slow} slow of 1 + 40 at rate 1 then 0.25");
    s.shutdown().await;
}

#[tokio::test]
async fn several_error_faults_at_once_answer_5xx_and_429_with_retry_after() {
    let s = ApiServer::start(ApiServerConfig::new("errors").with_seed(13)).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    s.faults().set_errors(vec![ErrorFault::all(0.2, 500), ErrorFault::all(0.2, 429)]);
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let code = match cms.list(&ListParams::default()).await {
            Ok(_) => 200,
            Err(kube::Error::Api(e)) => e.code,
            Err(e) => panic!("{e}"),
        };
        *codes.entry(code).or_insert(0u64) += 1;
    }
    let kinds = s.faults().injected_by_kind();
    assert_eq!(codes.get(&500), kinds.get(&FaultKind::Error(500)), "{codes:?} {kinds:?}");
    assert_eq!(codes.get(&429), kinds.get(&FaultKind::Error(429)), "{codes:?} {kinds:?}");
    assert!((20..=60).contains(&codes[&500]) && (12..=60).contains(&codes[&429]), "{codes:?}");
    assert_eq!(s.faults().injected_errors(), codes[&500] + codes[&429]);
    // A 429 carries Retry-After: 1, as kube-apiserver's max-in-flight filter sends.
    s.faults().set_errors(vec![ErrorFault::all(1.0, 429)]);
    let req = http::Request::get("/api/v1/namespaces/default/configmaps").body(Vec::new()).unwrap();
    let resp = no_retry_client(&s).send(req.map(Into::into)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    s.shutdown().await;
}
