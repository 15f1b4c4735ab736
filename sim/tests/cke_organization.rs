//! Two simulated CKE clusters of one organisation, each against its own emulated API server: the
//! quota belongs to the organisation on Clever Cloud, so every cluster's control plane and groups
//! count against one limit (clever-cloud.md §1.5, §1.7).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cke_support;

use std::time::Duration;

use cke_support::{WALL_TIMEOUT, World};
use crds::nodegroup::{NodeGroup, Verdict};
use serde_json::json;
use sim::cke::{OrgStats, OrganizationQuota, SimCkeConfig, Usage};

const SEC: Duration = Duration::from_secs(1);
const LIMIT: Usage = Usage { vcpu: 64, ram_gb: 64 };

/// A cluster of `org` as member `id`, with CKE's default control plane (16 vCPU / 24 GB).
async fn member(org: &OrganizationQuota, id: &str, seed: u64) -> World {
    let mut config = SimCkeConfig { seed, ..SimCkeConfig::default() };
    config.quota.organization = Some(org.member(id));
    World::start(config).await
}

/// Waits until both clusters' NodeGroup controllers run (each counts from its first pass).
async fn both_counted(org: &OrganizationQuota, w: &World) {
    w.until("both members counted", Duration::ZERO, || async { (org.members() == ["lyon", "paris"]).then_some(()) })
        .await;
}

async fn verdict(w: &World, name: &str) -> NodeGroup {
    w.until("verdict", SEC, || async { w.group(name).await.filter(|g| g.verdict() != Verdict::Pending) }).await
}

#[tokio::test]
async fn clusters_of_one_organisation_share_its_quota() {
    let org = OrganizationQuota::new(LIMIT);
    let paris = member(&org, "paris", 1).await;
    let lyon = member(&org, "lyon", 2).await;
    both_counted(&org, &paris).await;
    // Two control planes: 32 vCPU / 48 GB of 64 / 64.
    assert_eq!(org.usage(), Usage { vcpu: 32, ram_gb: 48 });

    // Paris takes the last 16 GB with an M; a 2XS in Lyon no longer fits, though Lyon alone uses
    // only its control plane.
    paris.create_group("m", "M", json!({}), json!([])).await;
    assert!(verdict(&paris, "m").await.is_accepted());
    lyon.create_group("tiny", "2XS", json!({}), json!([])).await;
    let tiny = verdict(&lyon, "tiny").await;
    assert_eq!(
        tiny.verdict(),
        Verdict::QuotaRejected(Some("Quota exceeded: RAM max: limit = 64.0 GB | actual = 68.0 GB".to_string()))
    );
    assert_eq!(tiny.status.as_ref().unwrap().phase.as_deref(), Some("QuotaExceeded"));
    assert_eq!(org.usage(), Usage { vcpu: 42, ram_gb: 64 });
    assert_eq!(org.usage_of("lyon"), Some(Usage { vcpu: 16, ram_gb: 24 }));
    assert_eq!(
        org.stats(),
        OrgStats {
            verdicts: 2,
            refusals: 1,
            refusals_by_member: [("lyon".to_string(), 1)].into(),
            peak: Usage { vcpu: 42, ram_gb: 64 },
        }
    );
    paris.until("paris's node", SEC, || async { paris.node("m-node0").await }).await;

    // A higher limit applies to the next verdicts.
    org.set_limit(Usage { vcpu: 64, ram_gb: 72 });
    lyon.create_group("tiny-2", "2XS", json!({}), json!([])).await;
    assert!(verdict(&lyon, "tiny-2").await.is_accepted());
    assert_eq!(org.stats().peak, Usage { vcpu: 46, ram_gb: 68 });

    // Paris is deleted: its control plane and its M no longer count.
    paris.stop().await;
    assert_eq!(org.members(), ["lyon"]);
    assert_eq!(org.usage(), Usage { vcpu: 20, ram_gb: 28 });
    lyon.create_group("big", "XL", json!({}), json!([])).await;
    assert!(verdict(&lyon, "big").await.is_accepted());
    assert_eq!(org.usage(), Usage { vcpu: 36, ram_gb: 60 });
    lyon.stop().await;
    assert!(org.members().is_empty());
    assert_eq!(org.usage(), Usage::default());
}

#[tokio::test]
async fn simultaneous_creations_in_two_clusters_never_both_take_the_last_headroom() {
    let org = OrganizationQuota::new(LIMIT);
    let paris = member(&org, "paris", 3).await;
    let lyon = member(&org, "lyon", 4).await;
    both_counted(&org, &paris).await;
    // Room for one M (48 + 16 = 64 GB), asked for in both clusters at once.
    paris.create_group("m", "M", json!({}), json!([])).await;
    lyon.create_group("m", "M", json!({}), json!([])).await;
    let deadline = tokio::time::Instant::now() + WALL_TIMEOUT;
    let (a, b) = loop {
        if let (Some(a), Some(b)) = (paris.group("m").await, lyon.group("m").await)
            && a.verdict() != Verdict::Pending
            && b.verdict() != Verdict::Pending
        {
            break (a, b);
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for both verdicts");
        paris.clock.advance(SEC);
        lyon.clock.advance(SEC);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let accepted = [&a, &b].iter().filter(|g| g.is_accepted()).count();
    assert!(accepted <= 1, "both took the last headroom");
    // Judged together, both may be refused; never over the limit.
    assert!(a.is_accepted() || a.is_quota_rejected());
    assert!(b.is_accepted() || b.is_quota_rejected());
    let stats = org.stats();
    assert_eq!(stats.verdicts, 2);
    assert_eq!(stats.refusals, 2 - accepted as u64);
    assert!(stats.peak.ram_gb <= LIMIT.ram_gb && stats.peak.vcpu <= LIMIT.vcpu, "{stats:?}");
    paris.stop().await;
    lyon.stop().await;
}
