//! The organisations' ledger entries of the clusters this replica serves (fleet.md §4): every few
//! seconds, each cluster an organisation selects is counted from the hub's caches of it (every Node
//! by its flavor's size, control plane and foreign nodes included; the hub's NodeGroups not yet a
//! Node), and the count written in the organisation's status when it changed — in the same write,
//! the reservations of launches whose NodeGroup the count now shows are settled. An entry of a
//! served cluster the organisation no longer selects is removed; one no replica refreshed for long
//! is dropped, with a warning (its nodes may still exist).
//!
//! Owns: when to count and write. Must not: count or settle anything itself (that is
//! [`crate::decisions::organization`]), reserve (launches do), or write an entry of a cluster
//! another replica serves.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::{
    decisions::organization::{self, Counted, Sizer},
    infra::{
        errors::{self, ApiError, Reconciler},
        hub::Hub,
        metrics::OrganizationLabels,
        organizations,
        registry::ClusterKey,
    },
};
use crds::CleverOrganization;

/// How often the served clusters are counted.
pub const PERIOD: Duration = Duration::from_secs(5);

/// Write the ledger entries of the clusters this replica serves until `shutdown`.
pub async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut ticks = std::pin::pin!(hub.settings.clock.advances());
    // A cluster connecting is counted at once: its launches wait for its count.
    let mut changes = hub.registry.changes();
    loop {
        if hub.cache.is_ready() {
            let orgs = hub.cache.organizations.state();
            export(&hub, &orgs);
            if !orgs.is_empty() {
                let sizer = organizations::sizer(&hub);
                let served: Vec<ClusterKey> =
                    hub.registry.clusters().into_iter().filter(|k| hub.registry.writes_for(k)).collect();
                for org in orgs {
                    if let Err(e) = pass(&hub, &org, &served, &sizer).await {
                        errors::count(&hub, Reconciler::Organization, None, &e);
                        tracing::warn!(organization = %org.name_any(), step = e.step.label(), category = e.category.as_str(), error = %e, "writing the organisation's ledger failed; retrying");
                    }
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PERIOD) => {}
            Some(()) = ticks.next() => {}
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

/// The organisations' figures as the cache shows them (every replica exports the same).
fn export(hub: &Hub, orgs: &[Arc<CleverOrganization>]) {
    let m = &hub.metrics.organization_quota;
    let names: BTreeSet<String> = orgs.iter().map(|o| o.name_any()).collect();
    m.forget_where(|l| !names.contains(&l.organization));
    for org in orgs {
        let (used, reserved) = organization::used(org.status.as_ref());
        let limit = organization::effective(org);
        let set = |resource: &str, kind: &str, v: Option<f64>| {
            let labels = OrganizationLabels {
                organization: org.name_any(),
                resource: resource.to_string(),
                kind: kind.to_string(),
            };
            match v {
                Some(v) => {
                    m.get(&labels).set(v);
                }
                None => m.remove(&labels),
            }
        };
        let cpu = |millis: i64| millis as f64 / 1000.0;
        let eur = |micros: i64| micros as f64 / 1e6;
        set("cpu", "limit", limit.cpu_millis.map(cpu));
        set("memory", "limit", limit.memory_bytes.map(|b| b as f64));
        set("price_per_hour", "limit", limit.price_micros.map(eur));
        for (kind, a) in [("used", used), ("reserved", reserved)] {
            set("cpu", kind, Some(cpu(a.cpu_millis)));
            set("memory", kind, Some(a.memory_bytes as f64));
            set("price_per_hour", kind, Some(eur(a.price_micros)));
        }
    }
}

/// One pass over one organisation: count its served clusters, write what changed.
async fn pass(hub: &Hub, org: &CleverOrganization, served: &[ClusterKey], sizer: &Sizer) -> Result<(), ApiError> {
    let mut counts: Vec<(&ClusterKey, Counted)> = Vec::new();
    let mut left: BTreeSet<(String, String)> = BTreeSet::new();
    for key in served {
        if !organizations::selects(hub, key, org).await? {
            left.insert((key.namespace.clone(), key.name.clone()));
            continue;
        }
        // An unsynced cluster keeps its last count: its nodes did not go away with the connection.
        let Some(conn) = hub.registry.connection(key).filter(|c| c.is_synced()) else { continue };
        let (nodes, groups) = (conn.cache.nodes.state(), conn.cache.nodegroups.state());
        counts.push((
            key,
            organization::count_cluster(nodes.iter().map(AsRef::as_ref), groups.iter().map(AsRef::as_ref), sizer),
        ));
    }
    let keep = |ns: &str, n: &str| !left.contains(&(ns.to_string(), n.to_string()));
    let mut stale = Vec::new();
    // Lost the race every time: the next pass counts again.
    organizations::update(hub, org.clone(), 3, |current, now| {
        let mut next = current.clone();
        let mut changed = false;
        for (key, counted) in &counts {
            if let Some(status) =
                organization::record(&next, organizations::id(key), counted, &hub.settings.replica, now)
            {
                next.status = Some(status);
                changed = true;
            }
        }
        stale.clear();
        if let Some((status, dropped)) = organization::prune(&next, keep, now) {
            stale = dropped;
            next.status = Some(status);
            changed = true;
        }
        next.status.filter(|_| changed)
    })
    .await?;
    for cluster in stale {
        tracing::warn!(organization = %org.name_any(), cluster = %cluster, "no replica counted this cluster for 10 minutes: its entry is dropped from the organisation's usage (its nodes, if any, no longer count until a replica serves it again)");
    }
    Ok(())
}
