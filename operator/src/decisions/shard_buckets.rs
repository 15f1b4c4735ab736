//! Shard buckets (hub.md §6), as pure functions: workload clusters hashed by key to a fixed number
//! of buckets, and the buckets placed on the live replicas by size. A replica owns a cluster while
//! it holds the Lease of the cluster's bucket, so the Lease writes of sharded mode grow with the
//! buckets and the replicas, not with the fleet.
//!
//! Placement is rendezvous hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
//! "Consistent Hashing with Bounded Loads", 2018), made sticky: a bucket stays with its live holder
//! unless a replica is out of bounds. Weights are quantized ([`quantize`]) so that a cluster's pod
//! count moving a little moves no bucket. Placement only decides who *should* own a bucket; who
//! does is the bucket's Lease, so replicas that disagree for a moment (reading different Lease
//! versions) can delay a move, never make two owners.
//!
//! Owns: those rules. Must not: read a clock, the API or the environment.

use sha2::{Digest, Sha256};

use crate::decisions::sharding;

/// The number of buckets: 8 for each of 4 replicas (a bucket, 1/32 of the fleet, is the unit by
/// which load moves), and at a 10 s retry period 3.2 Lease writes/s whatever the fleet's size (plus
/// one membership Lease per replica). Up to 32 replicas get a share. Fixed: replicas that disagreed
/// on it would put one cluster in two buckets, so it is part of the bucket Leases' names (a
/// different count never shares a Lease) and a replica takes no bucket while a live Lease of
/// another scheme exists (infra/sharding.rs).
pub const BUCKETS: u32 = 32;

/// How far above the average load a replica may be filled before a bucket goes to its next
/// choice: the price of balance in movement (the paper's ε).
pub const SLACK: f64 = 0.25;

/// The bucket of the cluster `key` (`namespace/name` of its registration): the first 8 bytes of
/// SHA-256, modulo `buckets` (at least 1). Every replica of any build computes the same. The key,
/// never the API server URL: a URL changes with its Secret, and two replicas reading the Secret at
/// different times would put the cluster in two buckets held by two owners. (Registrations of one
/// workload cluster therefore meet through the identities published on the bucket Leases instead.)
pub fn bucket_of(key: &str, buckets: u32) -> u32 {
    let digest = Sha256::digest(format!("bucket\0{key}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u32::try_from(u64::from_be_bytes(bytes) % u64::from(buckets.max(1))).unwrap_or(0)
}

/// A bucket's weight as published: its clusters' pods, at least 1, rounded up to three significant
/// bits (1, 2, …, 8, 9, …, 15, 16, 18, …, 30, 32, 36, …): at most an eighth above the truth, so
/// the placement balances what is there, and unchanged by the small moves of a steady fleet (a few
/// pods more or less rarely cross a step; when they do, the sticky placement moves nothing unless
/// a replica goes out of bounds).
pub fn quantize(pods: u64) -> u64 {
    let pods = pods.max(1);
    let bits = u64::BITS - pods.leading_zeros();
    if bits <= 4 {
        return pods;
    }
    // Keep the top three bits below the leading one, round the rest up.
    let shift = bits - 4;
    let unit = 1u64 << shift;
    pods.div_ceil(unit).saturating_mul(unit)
}

/// One bucket as the placement reads it: its weight ([`quantize`]d pods of its clusters; 0 counts
/// as 1) and the replica holding its Lease now, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub weight: u64,
    pub holder: Option<String>,
}

/// The replica each bucket should go to, over the live `members` (`None` for every bucket without
/// members). Sticky: a bucket stays with its live holder unless a replica carries nothing or less
/// than the average less [`SLACK`] (one that just joined takes buckets until it does not) or more
/// than the bound (the average plus the slack, at least one bucket). With at least as many buckets
/// as members, every member gets one. So a replica joining takes about its
/// share and a replica leaving moves only its own buckets. Free buckets go, heaviest first, to the
/// first replica of their rendezvous order with room. The answer placed again is itself (a fixed
/// point): replicas reading the same Leases agree, and nothing moves back and forth.
/// Deterministic, whatever order `members` come in.
pub fn place<'a>(buckets: &[Bucket], members: &'a [String]) -> Vec<Option<&'a str>> {
    let mut sorted: Vec<&'a str> = members.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let n = sorted.len();
    if n == 0 {
        return vec![None; buckets.len()];
    }
    let w: Vec<u64> = buckets.iter().map(|b| b.weight.max(1)).collect();
    let total: u64 = w.iter().sum();
    let heaviest = w.iter().copied().max().unwrap_or(1);
    let average = total as f64 / n as f64;
    let cap = ((average * (1.0 + SLACK)).ceil() as u64).max(heaviest);
    let floor = (average * (1.0 - SLACK)).floor() as u64;
    // Rendezvous rank of member `m` for bucket `b` (higher: preferred).
    let rank = |b: usize, m: usize| sharding::weight(&format!("bucket-{b}"), sorted[m]);
    let mut owner: Vec<Option<usize>> =
        buckets.iter().map(|b| b.holder.as_deref().and_then(|h| sorted.binary_search(&h).ok())).collect();
    let mut load = vec![0u64; n];
    for (b, o) in owner.iter().enumerate() {
        if let Some(m) = o {
            load[*m] += w[b];
        }
    }
    // 1. Free buckets (no live holder), heaviest first: to the least loaded replica below the
    //    floor if one has room (so a replica leaving does not make the others trade buckets),
    //    else to their first choice with room, else to the least loaded.
    let mut free: Vec<usize> = (0..w.len()).filter(|b| owner[*b].is_none()).collect();
    free.sort_by(|a, b| w[*b].cmp(&w[*a]).then(a.cmp(b)));
    for b in free {
        let mut prefs: Vec<usize> = (0..n).collect();
        prefs.sort_by(|x, y| rank(b, *y).cmp(&rank(b, *x)).then(x.cmp(y)));
        let short =
            prefs.iter().copied().filter(|m| load[*m] < floor && load[*m] + w[b] <= cap).min_by_key(|m| load[*m]);
        let chosen = short
            .or_else(|| prefs.iter().copied().find(|m| load[*m] + w[b] <= cap))
            .or_else(|| prefs.iter().copied().min_by_key(|m| load[*m]))
            .unwrap_or(0);
        owner[b] = Some(chosen);
        load[chosen] += w[b];
    }
    // 2. A replica below the average less the slack (one that just joined), or with nothing at all
    //    (in a small fleet the floor rounds down to 0), takes buckets from the most loaded, those
    //    that prefer it most, while each move narrows the gap between the two (so this ends).
    let mut blocked = vec![false; n];
    while let Some(m) =
        (0..n).filter(|m| !blocked[*m] && (load[*m] < floor || load[*m] == 0)).min_by_key(|m| (load[*m], *m))
    {
        let candidates = (0..w.len()).filter_map(|b| {
            let o = owner[b]?;
            (o != m && load[o] > load[m] + w[b] && load[m] + w[b] <= cap).then_some((b, o))
        });
        let Some((b, o)) = candidates.max_by(|(b1, o1), (b2, o2)| {
            load[*o1].cmp(&load[*o2]).then_with(|| rank(*b1, m).cmp(&rank(*b2, m))).then_with(|| b2.cmp(b1))
        }) else {
            // Nothing it can take narrows a gap: leave it, and let the others below the floor try.
            blocked[m] = true;
            continue;
        };
        owner[b] = Some(m);
        load[o] -= w[b];
        load[m] += w[b];
    }
    // 3. A replica still above the bound gives the buckets that least prefer it to the least
    //    loaded replica, while that one stays within the bound and the move narrows the gap.
    for m in 0..n {
        let mut held: Vec<usize> = (0..w.len()).filter(|b| owner[*b] == Some(m)).collect();
        held.sort_by(|a, b| rank(*a, m).cmp(&rank(*b, m)).then(a.cmp(b)));
        for b in held {
            if load[m] <= cap {
                break;
            }
            let Some(to) = (0..n).filter(|t| *t != m).min_by_key(|t| (load[*t], *t)) else { break };
            if load[to] + w[b] > cap || load[m] <= load[to] + w[b] {
                continue;
            }
            owner[b] = Some(to);
            load[m] -= w[b];
            load[to] += w[b];
        }
    }
    owner.into_iter().map(|o| o.map(|m| sorted[m])).collect()
}

/// The name of bucket `bucket` (of `buckets`)'s Lease for hub `hub_id`.
pub fn bucket_lease_name(hub_id: &str, bucket: u32, buckets: u32) -> String {
    sharding::named(
        &format!("kh-{hub_id}-bucket-{bucket}-of-{buckets}"),
        &format!("bucket\0{hub_id}\0{bucket}\0{buckets}"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn members(salt: u32, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("hub-{salt}-{i}")).collect()
    }

    fn loads<'a>(weights: &[u64], placed: &[Option<&'a str>]) -> BTreeMap<&'a str, u64> {
        let mut out = BTreeMap::new();
        for (w, m) in weights.iter().zip(placed) {
            *out.entry(m.unwrap()).or_default() += (*w).max(1);
        }
        out
    }

    /// Weight moved between two placements.
    fn moved(weights: &[u64], a: &[Option<&str>], b: &[Option<&str>]) -> u64 {
        weights.iter().zip(a.iter().zip(b)).filter(|(_, (x, y))| x != y).map(|(w, _)| (*w).max(1)).sum()
    }

    #[test]
    fn clusters_hash_to_every_bucket_and_always_the_same() {
        let mut counts = vec![0usize; 64];
        for c in 0..6400 {
            let b = bucket_of(&format!("https://c-{c}.example:6443"), 64);
            assert_eq!(b, bucket_of(&format!("https://c-{c}.example:6443"), 64));
            counts[b as usize] += 1;
        }
        assert!(counts.iter().all(|n| (50..=150).contains(n)), "{counts:?}");
        assert_eq!(bucket_of("x", 0), 0, "no bucket count is one bucket");
    }

    #[test]
    fn weights_are_quantized_to_within_an_eighth_and_steady_under_small_moves() {
        let table =
            [(0, 1), (1, 1), (7, 7), (15, 15), (16, 16), (17, 18), (31, 32), (33, 36), (1000, 1024), (3100, 3328)];
        for (pods, want) in table {
            assert_eq!(quantize(pods), want, "{pods}");
        }
        for pods in 1..200_000u64 {
            let q = quantize(pods);
            assert!(q >= pods && q as f64 <= pods as f64 * 1.125 + 1.0, "{pods} -> {q}");
        }
        assert_eq!(quantize(1000), quantize(1010), "a few pods more moves nothing");
        assert_eq!(quantize(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_bucket_lease_name_is_a_dns_label() {
        let n = bucket_lease_name("default", 7, 32);
        assert!(n.starts_with("kh-default-bucket-7-of-32-") && n.len() <= 63, "{n}");
        assert_ne!(n, bucket_lease_name("default", 70, 32));
        assert_ne!(n, bucket_lease_name("default", 7, 64), "another count, another Lease");
        assert!(bucket_lease_name(&"h".repeat(80), 63, 64).len() <= 63);
    }

    /// Placement from scratch (no holder), then as the Leases would show it after.
    fn fresh(weights: &[u64]) -> Vec<Bucket> {
        weights.iter().map(|w| Bucket { weight: *w, holder: None }).collect()
    }

    fn held(weights: &[u64], placed: &[Option<&str>]) -> Vec<Bucket> {
        weights.iter().zip(placed).map(|(w, h)| Bucket { weight: *w, holder: h.map(str::to_string) }).collect()
    }

    #[test]
    fn no_member_no_owner_and_member_order_does_not_matter() {
        let w = vec![5u64; 16];
        assert!(place(&fresh(&w), &[]).iter().all(Option::is_none));
        let m = members(1, 4);
        let mut r = m.clone();
        r.reverse();
        assert_eq!(place(&fresh(&w), &m), place(&fresh(&w), &r));
        // A holder that is no live member holds nothing.
        let stale = vec![Bucket { weight: 5, holder: Some("gone".into()) }; 16];
        assert_eq!(place(&stale, &m), place(&fresh(&w), &m));
    }

    /// Small fleets, where the floor rounds down to nothing: with at least as many buckets as
    /// replicas, every replica gets one, also when one replica held them all first (a replica
    /// starting alone takes every bucket, then the others join); with as many, one each.
    #[test]
    fn every_replica_gets_a_bucket_when_there_are_enough() {
        for n in 1..6usize {
            for b in n..12 {
                for salt in 0..20u32 {
                    let weights: Vec<u64> = (0..b).map(|i| 1 + (i as u64 * 7 + u64::from(salt)) % 3).collect();
                    let m = members(salt, n);
                    let all_on_first =
                        weights.iter().map(|w| Bucket { weight: *w, holder: Some(m[0].clone()) }).collect::<Vec<_>>();
                    for start in [fresh(&weights), all_on_first] {
                        let placed = place(&start, &m);
                        let l = loads(&weights, &placed);
                        assert_eq!(l.len(), n, "{b} buckets over {n}: {l:?}");
                        if b == n {
                            assert!(m.iter().all(|x| placed.iter().filter(|p| **p == Some(x.as_str())).count() == 1));
                        }
                        assert_eq!(place(&held(&weights, &placed), &m), placed, "not a fixed point");
                    }
                }
            }
        }
    }

    proptest! {
        /// Balance, and a fixed point: no replica above the bound plus one bucket, none below the
        /// floor less one bucket, every replica with a share; placing the answer again changes
        /// nothing.
        #[test]
        fn placement_is_balanced_and_stable(n in 1usize..9, salt in 0u32..10_000, sizes in prop::collection::vec(0u64..5_000, 64)) {
            let weights: Vec<u64> = sizes.iter().map(|p| quantize(*p)).collect();
            let m = members(salt, n);
            let placed = place(&fresh(&weights), &m);
            let l = loads(&weights, &placed);
            let total: u64 = weights.iter().sum();
            let heaviest = *weights.iter().max().unwrap();
            let average = total as f64 / n as f64;
            let bound = ((average * (1.0 + SLACK)).ceil() as u64).max(heaviest);
            let floor = (average * (1.0 - SLACK)).floor() as u64;
            for (member, load) in &l {
                prop_assert!(*load <= bound + heaviest, "{} carries {} over the bound {}", member, load, bound);
                prop_assert!(*load + heaviest >= floor, "{} carries {} under the floor {}", member, load, floor);
            }
            prop_assert_eq!(l.len(), n, "a member with nothing: {:?}", l);
            prop_assert_eq!(place(&held(&weights, &placed), &m), placed, "not a fixed point");
        }

        /// Minimal movement: a replica joining takes buckets for itself only (nothing moves between
        /// the others), no more than its fair share plus one bucket; a replica leaving moves its
        /// own buckets only.
        #[test]
        fn joining_or_leaving_moves_only_that_replicas_buckets(n in 1usize..8, salt in 0u32..10_000, sizes in prop::collection::vec(0u64..5_000, 64)) {
            let weights: Vec<u64> = sizes.iter().map(|p| quantize(*p)).collect();
            let total: u64 = weights.iter().sum();
            let heaviest = *weights.iter().max().unwrap();
            let before = members(salt, n);
            let a = place(&fresh(&weights), &before);
            let mut after = before.clone();
            let newcomer = format!("hub-{salt}-new");
            after.push(newcomer.clone());
            let b = place(&held(&weights, &a), &after);
            for (x, y) in a.iter().zip(&b) {
                prop_assert!(x == y || *y == Some(newcomer.as_str()), "a join moved a bucket from {:?} to {:?}", x, y);
            }
            let share = total / (n as u64 + 1);
            let m = moved(&weights, &a, &b);
            prop_assert!(m <= share + heaviest, "a join moved {} (fair share {}, heaviest {})", m, share, heaviest);
            let gone = after[salt as usize % after.len()].clone();
            let left: Vec<String> = after.iter().filter(|x| **x != gone).cloned().collect();
            let c = place(&held(&weights, &b), &left);
            for (x, y) in b.iter().zip(&c) {
                prop_assert!(x == y || *x == Some(gone.as_str()), "{} leaving moved a bucket of {:?}", gone, x);
            }
        }
    }
}
