//! Time and randomness of the simulated CKE: nothing moves until the (manual) clock does, simulated
//! delays cost no wall time, and a seed reproduces what the platform "draws".

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::Duration;

use cke_support::World;
use crds::nodegroup::Verdict;
use kube::ResourceExt;
use serde_json::json;
use sim::cke::{DelayRange, SimCkeConfig};

#[tokio::test]
async fn nothing_happens_until_the_clock_moves() {
    let w = World::start(SimCkeConfig::default()).await;
    w.create_group("ng", "2XS", json!({}), json!([])).await;
    // CKE sees the group at once (finalizer, in-progress status) but gives no verdict: that takes a
    // simulated second, and the clock stands still.
    let group = w
        .until("in progress", Duration::ZERO, || async {
            w.group("ng").await.filter(|g| g.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some())
        })
        .await;
    let conditions = group.status.as_ref().unwrap().conditions.clone().unwrap();
    assert_eq!(conditions[0].type_.as_deref(), Some("ReconcileInProgress"));
    assert!(!group.finalizers().is_empty());
    w.settle().await;
    assert_eq!(w.group("ng").await.unwrap().verdict(), Verdict::Pending);

    // One simulated second later: accepted. The 25 s join then costs no wall time either.
    w.clock.advance(Duration::from_secs(1));
    w.until("accepted", Duration::ZERO, || async { w.group("ng").await.filter(|g| g.is_accepted()) }).await;
    w.clock.advance(Duration::from_secs(24));
    w.settle().await;
    assert!(w.node("ng-node0").await.is_none(), "not before 25 s");
    w.clock.advance(Duration::from_secs(1));
    w.until("node joined", Duration::ZERO, || async { w.node("ng-node0").await }).await;
    w.stop().await;
}

/// What a run draws: the group's upstream id, the node's address and machine id.
async fn draws(seed: u64) -> (String, String, String) {
    let config = SimCkeConfig {
        seed,
        node_join_delay: DelayRange::between(Duration::from_secs(20), Duration::from_secs(40)),
        ..SimCkeConfig::default()
    };
    let w = World::start(config).await;
    w.create_group("ng", "XS", json!({}), json!([])).await;
    let node = w.until("node", Duration::from_secs(1), || async { w.node("ng-node0").await }).await;
    let group = w.group("ng").await.unwrap();
    let status = node.status.clone().unwrap();
    let ip = status.addresses.unwrap()[0].address.clone();
    let machine = status.node_info.unwrap().machine_id;
    let id = group.status.unwrap().upstream_id.unwrap();
    w.stop().await;
    (id, ip, machine)
}

#[tokio::test]
async fn a_seed_reproduces_the_platforms_draws() {
    let a = draws(11).await;
    assert_eq!(a, draws(11).await);
    let b = draws(12).await;
    assert_ne!(a.0, b.0);
    assert_ne!(a.2, b.2);
}
