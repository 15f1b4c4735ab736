//! Leader election: one leader at a time, a standby takes over when the leader releases the Lease or
//! stops renewing it, and a deposed leader learns it. The same scenario runs against the management
//! emulator and against a real kube-apiserver (envtest; skipped visibly without `KUBEBUILDER_ASSETS`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Namespace},
    jiff::SignedDuration,
};
use kube::{Api, Client, api::PostParams};
use operator::infra::leader::{Elector, Timings};
use sim::apiserver::{ApiServer, ApiServerConfig};
use tokio_util::sync::CancellationToken;

use crate::common;
use common::wait_for;

const FAST: Timings = Timings {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry_period: Duration::from_millis(200),
};

async fn lease(client: &Client, ns: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), ns).get_opt("karpenter-hub-default").await.unwrap()
}

async fn holder(client: &Client, ns: &str) -> Option<String> {
    lease(client, ns).await.and_then(|l| l.spec).and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_standby_takes_over_on_the_emulator() {
    let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    one_leader_at_a_time_and_a_standby_takes_over(server.client(), "karpenter-hub").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_standby_takes_over_on_a_real_api_server() {
    let cp = envtest::shared_or_skip!("leader");
    let ns = format!("karpenter-hub-{}", std::process::id());
    one_leader_at_a_time_and_a_standby_takes_over(cp.client().await.unwrap(), &ns).await;
}

async fn one_leader_at_a_time_and_a_standby_takes_over(client: Client, ns: &str) {
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let a = Elector::new(client.clone(), ns, "karpenter-hub-default", "a", FAST);
    let b = Elector::new(client.clone(), ns, "karpenter-hub-default", "b", FAST);

    let never = CancellationToken::new();
    assert!(a.acquire(&never).await);
    assert_eq!(holder(&client, ns).await.as_deref(), Some("a"));
    assert!(!b.try_hold().await.unwrap(), "a live Lease of another replica is not taken");

    // A releases (graceful stop): B takes over at its next attempt, without waiting for expiry.
    a.release().await;
    assert!(b.try_hold().await.unwrap());
    assert_eq!(holder(&client, ns).await.as_deref(), Some("b"));

    // B leads and renews; A, standing by, cannot take it while B renews.
    let (b_lost, b_stop) = (CancellationToken::new(), CancellationToken::new());
    let keeper = tokio::spawn({
        let (b, lost, stop) = (b.clone(), b_lost.clone(), b_stop.clone());
        async move { b.keep(lost, stop).await }
    });
    // Waited for: B's renewals carrying the Lease past the point where, unrenewed since B took
    // it, it would have expired (acquireTime + leaseDuration); A is then refused on a Lease that
    // only B's renewals keep alive.
    let renewed_past_expiry = || async {
        let spec = lease(&client, ns).await.and_then(|l| l.spec);
        spec.is_some_and(|s| {
            let (Some(acquired), Some(renewed)) = (s.acquire_time, s.renew_time) else { return false };
            s.holder_identity.as_deref() == Some("b")
                && renewed.0.duration_since(acquired.0) > SignedDuration::try_from(FAST.lease_duration).unwrap()
        })
    };
    wait_for("B renewing past one lease duration", Duration::from_secs(10), renewed_past_expiry).await;
    assert!(!a.try_hold().await.unwrap(), "B renews, so the Lease never expires");
    assert!(!b_lost.is_cancelled());

    // B hangs (stops renewing, as a crash would): after the Lease duration A takes over...
    b_stop.cancel();
    keeper.await.unwrap();
    let started = tokio::time::Instant::now();
    let a_wait = CancellationToken::new();
    assert!(tokio::time::timeout(Duration::from_secs(10), a.acquire(&a_wait)).await.unwrap());
    assert!(started.elapsed() >= Duration::from_secs(1), "not before the Lease expired");
    assert_eq!(holder(&client, ns).await.as_deref(), Some("a"));

    // ...and B, coming back, learns at its next renewal that it was deposed.
    let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
    tokio::time::timeout(Duration::from_secs(5), b.keep(lost.clone(), stop)).await.unwrap();
    assert!(lost.is_cancelled());
    let _ = Api::<Namespace>::all(client).delete(ns, &Default::default()).await;
}

/// A partition that drops packets (the management emulator accepts requests and never answers):
/// the leader stops by its renew deadline, not after the client's read timeout (kube's is 295 s,
/// and each hung renewal used to block the deadline check for that long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_renewals_hang_stops_by_its_renew_deadline() {
    let server = ApiServer::start(ApiServerConfig::management("management")).await.unwrap();
    let client = server.client();
    let ns = "karpenter-hub";
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let leader = Elector::new(client.clone(), ns, "karpenter-hub-default", "a", FAST);
    assert!(leader.acquire(&CancellationToken::new()).await);
    let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
    let keeper = tokio::spawn({
        let (leader, lost, stop) = (leader.clone(), lost.clone(), stop.clone());
        async move { leader.keep(lost, stop).await }
    });
    // A few renewals go through, then the black hole.
    tokio::time::sleep(FAST.retry_period * 3).await;
    assert!(!lost.is_cancelled(), "renewals answered: still leading");
    server.faults().set_blackhole(true);
    let cut = tokio::time::Instant::now();
    // The last renewal that succeeded began at most one retry period before the cut.
    let bound = FAST.renew_deadline + Duration::from_secs(1);
    let stopped = tokio::time::timeout(Duration::from_secs(30), lost.cancelled()).await;
    let after = cut.elapsed();
    assert!(stopped.is_ok(), "still leading 30 s into the partition");
    assert!(after <= bound, "stopped leading {after:?} after the cut; the renew deadline is {:?}", FAST.renew_deadline);
    eprintln!(
        "leader stopped {after:?} after its management cluster stopped answering (renew deadline {:?})",
        FAST.renew_deadline
    );
    keeper.await.unwrap();
    stop.cancel();
    server.faults().set_blackhole(false);
    server.shutdown().await;
}
