//! Who goes first when an organisation's room is short (fleet.md §4): a cluster whose pods wait for
//! room is marked waiting in its entry of the ledger — by a provisioning round that held pods back
//! for the room ([`held_back`], [`mark`]), or by a launch the ledger refused — and the room goes to
//! the waiting clusters in rank order: one waiting longer than [`STARVATION`] first, then the
//! highest pool weight, then the oldest pending pod. Every other cluster plans with the room less
//! what the clusters ranked before it are owed (one node each), so freed room is not taken by
//! whichever round happens to run first. A mark not renewed within [`WAITING_TTL`] is ignored.
//!
//! Owns: the marks, their rank, what is owed, and the words a NodePool condition shows while its
//! pods wait. Must not: read caches or the clock.

use super::*;
use crds::organization::Waiting;

/// A round holding pods back renews its cluster's mark this often (well within [`WAITING_TTL`]).
pub const RENEW: Duration = Duration::from_secs(30);

/// The most pools a mark lists (the CRD's bound).
const MAX_POOLS: usize = 16;

/// The most clusters a condition's message lists by name.
const MAX_LISTED: usize = 8;

/// What a cluster waits for: one node of `size` for pods of `pools`, ranked by `weight` (the
/// highest of those pools) and `since` (its oldest pod waiting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub weight: i32,
    pub since: Timestamp,
    pub size: Amount,
    pub pools: Vec<String>,
}

/// Rank of a waiting cluster: the longest-starved first, then the highest weight, then the oldest.
pub(super) fn rank(w: &Waiting, now: Timestamp) -> (bool, i32, Timestamp) {
    (age(&w.since, now) < STARVATION, -w.weight, w.since.0)
}

/// Whether a waiting mark still counts: renewed within [`WAITING_TTL`].
pub(super) fn asking(w: &Waiting, now: Timestamp) -> bool {
    age(&w.last, now) <= WAITING_TTL
}

/// What the other waiting clusters that rank before `launch` are owed.
pub(super) fn owed_before(
    status: &CleverOrganizationStatus,
    id: ClusterId<'_>,
    launch: &Launch<'_>,
    now: Timestamp,
) -> Amount {
    let my_rank = (age(&time(launch.since), now) < STARVATION, -launch.weight, launch.since);
    let mut owed = Amount::default();
    for c in &status.clusters {
        if id.is(c) {
            continue;
        }
        let Some(w) = c.waiting.as_ref().filter(|w| asking(w, now)) else { continue };
        if rank(w, now) < my_rank {
            owed += Amount { cpu_millis: w.cpu_millis, memory_bytes: w.memory_bytes, price_micros: 0 };
        }
    }
    owed
}

/// The mark for `want`, keeping the start of a mark still asking (the line does not reset).
pub(super) fn waiting(previous: Option<&Waiting>, want: &Want, now: Timestamp) -> Waiting {
    let since = previous.filter(|w| asking(w, now)).map_or(time(want.since), |w| time(w.since.0.min(want.since)));
    let mut pools = want.pools.clone();
    pools.sort();
    pools.dedup();
    pools.truncate(MAX_POOLS);
    Waiting {
        weight: want.weight,
        since,
        last: time(now),
        cpu_millis: want.size.cpu_millis,
        memory_bytes: want.size.memory_bytes,
        pools,
    }
}

/// What a round held back for want of room: the pods the `limited` decision (planned with
/// `input`, whose shared limits from index `own` on are the organisations' rooms) left
/// unschedulable that a new claim would take without those rooms. Solved again without the rooms
/// and without the pods the decision already launches for, so what is owed is what the pods left
/// need: one node, the cheapest option of the first such claim, sized as the platform counts it.
/// `None` when the rooms held nothing back.
pub fn held_back(input: &scheduling::Input, limited: &scheduling::Decision, own: usize) -> Option<Want> {
    if limited.unschedulable.is_empty() || input.shared.len() <= own {
        return None;
    }
    let launched: BTreeSet<usize> = limited.new_claims.iter().flat_map(|c| c.pods.iter().copied()).collect();
    // A CapacityBuffer's pods never put the cluster in line: the room is for real pods first.
    let left: BTreeSet<usize> = limited
        .unschedulable
        .iter()
        .map(|u| u.pod)
        .filter(|&p| input.pods.get(p).is_some_and(|p| p.buffer.is_none()))
        .collect();
    if left.is_empty() {
        return None;
    }
    // Original index of each pod of the free input.
    let kept: Vec<usize> = (0..input.pods.len()).filter(|i| !launched.contains(i)).collect();
    let mut free = input.clone();
    free.shared.truncate(own);
    free.pods = kept.iter().map(|i| input.pods[*i].clone()).collect();
    let unlimited = scheduling::solve(&free);
    let waits = |c: &&scheduling::model::NewClaim| c.pods.iter().any(|p| left.contains(&kept[*p]));
    let claims: Vec<&scheduling::model::NewClaim> = unlimited.new_claims.iter().filter(waits).collect();
    let first = claims.first()?;
    let pool_of = |name: &str| input.pools.iter().find(|p| p.name == name);
    let option = first.instance_types.first()?;
    let size = pool_of(&first.nodepool)?.instance_types.iter().find(|t| t.name == option.name).map(Sizer::of_type)?;
    let weight = claims.iter().filter_map(|c| pool_of(&c.nodepool)).map(|p| p.weight).max().unwrap_or(0);
    let oldest = claims
        .iter()
        .flat_map(|c| c.pods.iter().map(|p| kept[*p]).filter(|p| left.contains(p)))
        .filter_map(|p| input.pods.get(p))
        .map(|p| p.created)
        .min()?;
    Some(Want {
        weight,
        since: Timestamp::from_second(oldest).unwrap_or_default(),
        size,
        pools: claims.iter().map(|c| c.nodepool.clone()).collect(),
    })
}

/// The status with cluster `id` marked waiting for `want`; `None` when the cluster is not counted
/// yet (a mark must not stand for its count) or its mark already says so and was renewed within
/// [`RENEW`].
pub fn mark(
    org: &CleverOrganization,
    id: ClusterId<'_>,
    want: &Want,
    now: Timestamp,
) -> Option<CleverOrganizationStatus> {
    with_entry(org, id, |entry| {
        let next = waiting(entry.waiting.as_ref(), want, now);
        let renewed = entry
            .waiting
            .as_ref()
            .filter(|w| asking(w, now))
            .is_some_and(|w| (Waiting { last: w.last.clone(), ..next.clone() }) == *w && age(&w.last, now) < RENEW);
        if !renewed {
            entry.waiting = Some(next);
        }
        !renewed
    })
}

/// The status without cluster `id`'s waiting mark (its pods no longer wait); `None` when it has none.
pub fn unmark(org: &CleverOrganization, id: ClusterId<'_>) -> Option<CleverOrganizationStatus> {
    with_entry(org, id, |entry| entry.waiting.take().is_some())
}

/// Why pods of NodePool `pool` in cluster `id` wait, in the words a pool condition shows: the
/// organisation, what is in use against what it allows, the clusters using it, and what the cluster
/// waits for. `None` when the cluster's mark (still asking) does not list the pool.
pub fn waits_for(org: &CleverOrganization, id: ClusterId<'_>, pool: &str, now: Timestamp) -> Option<String> {
    let status = org.status.as_ref()?;
    let mine = status.clusters.iter().find(|c| id.is(c))?;
    let w = mine.waiting.as_ref().filter(|w| asking(w, now) && w.pools.iter().any(|p| p == pool))?;
    let quota = effective(org);
    let (used, _) = used(Some(status));
    let mut limits = Vec::new();
    if let Some(c) = quota.cpu_millis {
        limits.push(format!("{}/{} vCPU", format_millis_cpu(used.cpu_millis), format_millis_cpu(c)));
    }
    if let Some(m) = quota.memory_bytes {
        limits.push(format!("{}/{} memory", format_decimal_bytes(used.memory_bytes), format_decimal_bytes(m)));
    }
    if let Some(p) = quota.price_micros {
        limits.push(format!("{}/{} EUR/h", format_price(used.price_micros), format_price(p)));
    }
    let mut using: Vec<&OrganizationCluster> = status.clusters.iter().collect();
    using.sort_by_key(|c| std::cmp::Reverse(entry_usage(c).cpu_millis));
    let mut listed: Vec<String> = using
        .iter()
        .take(MAX_LISTED)
        .map(|c| {
            let u = entry_usage(c);
            format!("{}/{} {}", c.namespace, c.name, format_millis_cpu(u.cpu_millis))
        })
        .collect();
    if using.len() > MAX_LISTED {
        listed.push(format!("and {} more", using.len() - MAX_LISTED));
    }
    let before = status
        .clusters
        .iter()
        .filter(|c| !id.is(c))
        .filter_map(|c| c.waiting.as_ref())
        .filter(|o| asking(o, now) && rank(o, now) < rank(w, now))
        .count();
    let line = if before == 0 {
        "first in line".to_string()
    } else {
        format!("{before} cluster{} before it in line", if before == 1 { "" } else { "s" })
    };
    // Conditions keep 300 characters: the numbers first, the clusters using the room last.
    Some(format!(
        "organisation {}: {} in use across {} cluster{}; {}/{} waits for {} vCPU, {} memory since {} ({line}); \
         vCPU in use by cluster: {}",
        org.metadata.name.as_deref().unwrap_or_default(),
        limits.join(", "),
        status.clusters.len(),
        if status.clusters.len() == 1 { "" } else { "s" },
        id.namespace,
        id.name,
        format_millis_cpu(w.cpu_millis),
        format_decimal_bytes(w.memory_bytes),
        w.since.0,
        listed.join(", "),
    ))
}
