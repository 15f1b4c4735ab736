//! Who wrote to each workload cluster, against who held its shard bucket (sharded mode, issue 30):
//! the bucket Leases' holders as a watch sees them change, and every write the workload emulators
//! logged with the replica its `User-Agent` names. A replica writing to a cluster whose bucket
//! another replica held (seen a second before the write, and the writer not seen taking it back
//! within two seconds after) is a double owner. The margins are the watch's lag on a loaded
//! machine; the fence stops a replica a whole second (lease duration minus renew deadline) before
//! anyone else may take its bucket, so a hub keeping the protocol never comes near them.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use operator::{
    commands::sandbox::world::World,
    decisions::shard_buckets::{BUCKETS, bucket_lease_name, bucket_of},
    infra::sharding::ROLE_LABEL,
};
use tokio_util::sync::CancellationToken;

/// A holder seen this long before a write speaks for the moment of the write.
const BEFORE_MS: u64 = 1_000;
/// The writer's own acquisition may be seen this late.
const AFTER_MS: u64 = 2_000;

/// Every holder change of the hub's bucket Leases, as seen: (wall-clock ms, Lease, holder).
#[derive(Clone, Default)]
pub(crate) struct Holders(Arc<Mutex<Vec<(u64, String, String)>>>);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Holders {
    /// Watches the bucket Leases in `namespace` until `stop`.
    pub(crate) fn watch(mgmt: Client, namespace: &str, stop: CancellationToken) -> Holders {
        let holders = Holders::default();
        let api: Api<Lease> = Api::namespaced(mgmt, namespace);
        let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=bucket"));
        let out = holders.clone();
        tokio::spawn(async move {
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            let mut events = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            loop {
                let lease = tokio::select! {
                    () = stop.cancelled() => return,
                    next = events.next() => match next {
                        Some(Ok(lease)) => lease,
                        Some(Err(_)) => continue,
                        None => return,
                    },
                };
                let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                let name = lease.metadata.name.unwrap_or_default();
                if last.get(&name) != Some(&holder) {
                    last.insert(name.clone(), holder.clone());
                    out.0.lock().unwrap().push((now_ms(), name, holder));
                }
            }
        });
        holders
    }

    /// Holder changes seen so far.
    pub(crate) fn changes(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// What the audit found: writes by a replica audited, and those made while another held the bucket.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    pub writes: usize,
    pub writers: usize,
    pub double: Vec<String>,
}

/// Audits every hub write the workload emulators of `world` logged against `holders`.
pub(crate) fn audit(world: &World, holders: &Holders) -> Audit {
    let seen = holders.0.lock().unwrap().clone();
    let mut out = Audit::default();
    let mut writers = std::collections::BTreeSet::new();
    for c in &world.clusters {
        let key = format!("{}/{}", c.namespace, c.name);
        let lease = bucket_lease_name("default", bucket_of(&key, BUCKETS), BUCKETS);
        let changes: Vec<(u64, String)> =
            seen.iter().filter(|(_, l, _)| *l == lease).map(|(at, _, holder)| (*at, holder.clone())).collect();
        for w in c.server.requests().written() {
            let Some(replica) = operator::infra::replica_of(&w.agent) else { continue };
            out.writes += 1;
            writers.insert(replica.to_string());
            if let Some((at, holder)) = held_elsewhere(&changes, replica, w.at_ms) {
                out.double.push(format!(
                    "{key}: {} {} by {replica} at {} ms while {lease} was held by {holder:?} (seen at {at} ms)",
                    w.verb, w.resource, w.at_ms
                ));
            }
        }
    }
    out.writers = writers.len();
    out
}

/// The holder change that says another replica held the bucket when `replica` wrote at `at_ms`:
/// the last change seen [`BEFORE_MS`] or more before the write names someone else, and `replica`
/// is not seen taking the bucket back up to [`AFTER_MS`] after the write. `changes` oldest first.
fn held_elsewhere<'a>(changes: &'a [(u64, String)], replica: &str, at_ms: u64) -> Option<&'a (u64, String)> {
    let before = changes.iter().rev().find(|(at, _)| at + BEFORE_MS <= at_ms)?;
    if before.1 == replica {
        return None;
    }
    let taken_back = changes.iter().any(|(at, holder)| *at > before.0 && *at <= at_ms + AFTER_MS && holder == replica);
    (!taken_back).then_some(before)
}

#[test]
fn a_write_is_a_double_owner_s_only_when_another_replica_held_the_bucket_well_before_it() {
    let changes =
        |list: &[(u64, &str)]| -> Vec<(u64, String)> { list.iter().map(|(t, h)| (*t, h.to_string())).collect() };
    // a holds from 1 s, b from 10 s (a's Lease expired).
    let seen = changes(&[(1_000, "a"), (10_000, "b")]);
    assert_eq!(held_elsewhere(&seen, "a", 9_900), None, "a writing before b took over");
    assert_eq!(held_elsewhere(&seen, "a", 10_500), None, "within the watch's lag of the takeover");
    assert_eq!(held_elsewhere(&seen, "a", 12_000), Some(&(10_000, "b".to_string())), "a writing 2 s into b's hold");
    assert_eq!(held_elsewhere(&seen, "b", 12_000), None);
    // b's own acquisition seen late (after its first write): not a double owner.
    let late = changes(&[(1_000, "a"), (5_000, ""), (8_500, "b")]);
    assert_eq!(held_elsewhere(&late, "b", 7_000), None, "b's Lease seen 1.5 s after its write");
    assert!(held_elsewhere(&late, "b", 4_000).is_some(), "b writing while a held the bucket");
    // Nothing seen yet: nothing to say.
    assert_eq!(held_elsewhere(&[], "a", 5_000), None);
}
