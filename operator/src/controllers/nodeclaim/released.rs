//! Capacity freed (clever-cloud.md §3.5): the cool-downs and the creation back-off of a workload
//! cluster are cleared early once an accepted NodeGroup whose node registered is fully gone.
//! Termination records such a group as `freeing` in the cluster's capacity memory while it is
//! terminating ([`super::carry_out`], `Write::ReleaseCapacity`), and so does the garbage collection
//! of an orphan whose node registered; this task notices when it is gone.
//!
//! Owns: gathering that fact (the group's absence from the synced NodeGroup cache, on each
//! NodeGroup change the watch announces and whenever the cluster syncs, which covers a deletion
//! missed while the hub was down or the watch relisted) and the write, made only when the state
//! changes. Must not: decide what a disappearance means ([`CapacityState::group_gone`] does), act
//! on a cluster that is not synced or that another replica owns, or read the API for it.
//!
//! [`CapacityState::group_gone`]: crate::decisions::capacity::CapacityState::group_gone

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::infra::{hub::Hub, registry::ClusterKey};

/// Watch until `shutdown`.
pub(super) async fn run(hub: Arc<Hub>, shutdown: CancellationToken) {
    let touched = hub.registry.touched().map(|t| t.cluster);
    let mut keys = std::pin::pin!(futures::stream::select(touched, hub.registry.synced()));
    loop {
        let key = tokio::select! {
            () = shutdown.cancelled() => return,
            k = keys.next() => match k {
                Some(k) => k,
                None => return,
            },
        };
        if let Err(e) = check(&hub, &key).await {
            // The group stays `freeing`: the next change or sync of the cluster looks again.
            tracing::warn!(cluster = %key, error = %crate::infra::apierror::plain(&e), "recording freed capacity failed; retried on the next change");
        }
    }
}

/// Clear the cluster's cool-downs and back-off if a group it remembers as freeing is gone.
async fn check(hub: &Hub, key: &ClusterKey) -> Result<(), kube::Error> {
    if !hub.registry.writes_for(key) {
        return Ok(());
    }
    let Some(conn) = hub.registry.connection(key).filter(|c| c.is_synced()) else { return Ok(()) };
    let state = hub.capacity(key).await?;
    if state.freeing.is_empty() {
        return Ok(());
    }
    let present: Vec<String> = conn.cache.nodegroups.state().iter().map(|g| g.name_any()).collect();
    let Some(gone) = state.freeing.iter().find(|g| !present.contains(g)).cloned() else { return Ok(()) };
    let now = hub.now();
    let mut changed = false;
    hub.update_capacity(key, now, |s| changed = s.group_gone(&gone)).await?;
    if changed {
        tracing::info!(cluster = %key, nodegroup = %gone, "capacity freed: an accepted NodeGroup is fully gone; flavor cool-downs and the creation back-off cleared");
    }
    Ok(())
}
