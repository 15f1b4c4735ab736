//! Leader election against the management emulator: one leader at a time, a standby takes over
//! when the leader releases the Lease or stops renewing it, and a deposed leader learns it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Namespace};
use kube::{Api, api::PostParams};
use operator::leader::{Elector, Timings};
use sim::apiserver::{ApiServer, ApiServerConfig};
use tokio_util::sync::CancellationToken;

const FAST: Timings = Timings {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry_period: Duration::from_millis(200),
};

async fn holder(server: &ApiServer) -> Option<String> {
    Api::<Lease>::namespaced(server.client(), "karpenter-hub")
        .get_opt("karpenter-hub-default")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_standby_takes_over() {
    let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "karpenter-hub"}})).unwrap();
    Api::<Namespace>::all(server.client()).create(&PostParams::default(), &ns).await.unwrap();
    let a = Elector::new(server.client(), "karpenter-hub", "karpenter-hub-default", "a", FAST);
    let b = Elector::new(server.client(), "karpenter-hub", "karpenter-hub-default", "b", FAST);

    let never = CancellationToken::new();
    assert!(a.acquire(&never).await);
    assert_eq!(holder(&server).await.as_deref(), Some("a"));
    assert!(!b.try_hold().await.unwrap(), "a live Lease of another replica is not taken");

    // A releases (graceful stop): B takes over at its next attempt, without waiting for expiry.
    a.release().await;
    assert!(b.try_hold().await.unwrap());
    assert_eq!(holder(&server).await.as_deref(), Some("b"));

    // B leads and renews; A, standing by, cannot take it while B renews.
    let (b_lost, b_stop) = (CancellationToken::new(), CancellationToken::new());
    let keeper = tokio::spawn({
        let (b, lost, stop) = (b.clone(), b_lost.clone(), b_stop.clone());
        async move { b.keep(lost, stop).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!a.try_hold().await.unwrap(), "B renews, so the Lease never expires");
    assert!(!b_lost.is_cancelled());

    // B hangs (stops renewing, as a crash would): after the Lease duration A takes over...
    b_stop.cancel();
    keeper.await.unwrap();
    let started = tokio::time::Instant::now();
    let a_wait = CancellationToken::new();
    assert!(tokio::time::timeout(Duration::from_secs(10), a.acquire(&a_wait)).await.unwrap());
    assert!(started.elapsed() >= Duration::from_secs(1), "not before the Lease expired");
    assert_eq!(holder(&server).await.as_deref(), Some("a"));

    // ...and B, coming back, learns at its next renewal that it was deposed.
    let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
    tokio::time::timeout(Duration::from_secs(5), b.keep(lost.clone(), stop)).await.unwrap();
    assert!(lost.is_cancelled());
    server.shutdown().await;
}
