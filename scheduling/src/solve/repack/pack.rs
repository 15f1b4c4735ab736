//! The unconstrained packings of a group's items into nodes: by value density (each node of the
//! type packing the most value, at the LP's shadow prices, per euro), balanced (cpu-heavy and
//! memory-heavy items filling a node together), and first-fit decreasing as the classic baseline.
//!
//! Owns the packings on resources alone. Must not know about rules between items (that is `ruled`),
//! limits (that is `within`), nor about pods, pools or topology.

use crds::quantity::Resources;

use super::Bin;
use super::lp::{shadow_prices, vec3};

/// Whether one pod of shape `s` fits in `room` (`fit_count(room, s) > 0`, without dividing).
fn fits_once(room: &Resources, s: &Resources) -> bool {
    let ok = |r: i64, q: i64| q <= 0 || r >= q;
    ok(room.cpu_millis, s.cpu_millis)
        && ok(room.memory_bytes, s.memory_bytes)
        && ok(room.ephemeral_storage_bytes, s.ephemeral_storage_bytes)
        && ok(room.pods, s.pods)
}

/// How many pods of shape `s` fit in `room`.
pub(super) fn fit_count(room: &Resources, s: &Resources) -> i64 {
    // Most calls are for shapes that no longer fit: compare before dividing.
    if !fits_once(room, s) {
        return 0;
    }
    let per = |r: i64, q: i64| if q <= 0 { i64::MAX } else { (r / q).max(0) };
    per(room.cpu_millis, s.cpu_millis)
        .min(per(room.memory_bytes, s.memory_bytes))
        .min(per(room.ephemeral_storage_bytes, s.ephemeral_storage_bytes))
        .min(per(room.pods, s.pods))
}

pub(super) fn times(s: &Resources, k: i64) -> Resources {
    Resources {
        cpu_millis: s.cpu_millis.saturating_mul(k),
        memory_bytes: s.memory_bytes.saturating_mul(k),
        ephemeral_storage_bytes: s.ephemeral_storage_bytes.saturating_mul(k),
        pods: s.pods.saturating_mul(k),
    }
}

/// Packs `items` (pod requests) into nodes: `(bin index, item indices)` per node, or `None` when some
/// item fits no bin.
pub fn pack(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    pack_with(items, bins, false)
}

/// [`pack`], filling each node by value density (see [`fill`]).
pub fn pack_balanced(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    pack_with(items, bins, true)
}

fn pack_with(items: &[Resources], bins: &[Bin], balanced: bool) -> Option<Vec<(usize, Vec<usize>)>> {
    if items.is_empty() {
        return Some(Vec::new());
    }
    let demand = items.iter().fold(Resources::ZERO, |a, r| a + *r);
    let (y, _) = shadow_prices(bins, &demand);
    let value = |r: &Resources| {
        let v = vec3(r);
        v[0] * y[0] + v[1] * y[1] + v[2] * y[2] + 1e-12 * (v[0] + v[1] / 1e6 + v[2])
    };
    // Distinct shapes, most valuable first.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| value(&items[b]).total_cmp(&value(&items[a])).then_with(|| a.cmp(&b)));
    let mut shapes: Vec<(Resources, f64, Vec<usize>)> = Vec::new();
    let mut index: std::collections::HashMap<Resources, usize> = std::collections::HashMap::new();
    for i in order {
        match index.get(&items[i]) {
            Some(&si) => shapes[si].2.push(i),
            None => {
                index.insert(items[i], shapes.len());
                shapes.push((items[i], value(&items[i]), vec![i]));
            }
        }
    }
    // The balanced fill's order of shapes per bin depends on neither counts nor nodes: sorted once.
    let by_tilt: Vec<Vec<usize>> =
        if balanced { bins.iter().map(|bin| tilt_order(bin, &shapes)).collect() } else { Vec::new() };
    // A bin's fill depends on the counts left only through min(left, most of the shape an empty bin
    // holds): it is kept from one node to the next until a count it may depend on drops below that.
    let most: Vec<Vec<i64>> =
        bins.iter().map(|b| shapes.iter().map(|(s, ..)| fit_count(&b.room, s)).collect()).collect();
    let mut left: Vec<i64> = shapes.iter().map(|(_, _, l)| i64::try_from(l.len()).unwrap_or(i64::MAX)).collect();
    let mut cache: Vec<Option<(Takes, f64)>> = vec![None; bins.len()];
    // A node's value never exceeds its room's (shadow prices are non-negative): `price / value(room)`
    // bounds a bin's score from below, so a bin whose bound is already worse than the best score
    // found need not be filled. Bins are tried best bound first.
    let bound: Vec<f64> = bins.iter().map(|b| b.price / value(&b.room).max(1e-300)).collect();
    let mut tries: Vec<usize> = (0..bins.len()).collect();
    tries.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
    let mut remaining = items.len();
    let mut out = Vec::new();
    while remaining > 0 {
        let mut best: Option<(f64, f64, usize)> = None;
        for &b in &tries {
            let bin = &bins[b];
            if cache[b].is_none() && best.is_some_and(|(bs, ..)| bound[b] > bs) {
                continue;
            }
            let (takes, v) =
                cache[b].get_or_insert_with(|| fill(bin, &shapes, &left, by_tilt.get(b).map(Vec::as_slice)));
            if takes.is_empty() {
                continue;
            }
            let score = bin.price / v.max(1e-300);
            // Ties: the larger value, then the lower index.
            if best.is_none_or(|(bs, bv, bb)| score < bs || (score == bs && (*v > bv || (*v == bv && b < bb)))) {
                best = Some((score, *v, b));
            }
        }
        let (_, _, b) = best?;
        let takes = cache[b].as_ref().map(|(t, _)| t.clone()).unwrap_or_default();
        let mut taken = Vec::new();
        for &(si, k) in &takes {
            let list = &mut shapes[si].2;
            let at = list.len() - usize::try_from(k).unwrap_or(0).min(list.len());
            taken.extend(list.drain(at..));
            left[si] -= k;
            for (c, m) in cache.iter_mut().zip(&most) {
                if left[si] < m[si] {
                    *c = None;
                }
            }
        }
        remaining -= taken.len();
        taken.sort_unstable();
        out.push((b, taken));
    }
    Some(out)
}

/// `(shape index, count)` taken by one node.
pub(super) type Takes = Vec<(usize, i64)>;

/// Shapes ordered by how memory-heavy they are relative to the node (ties: index).
fn tilt_order(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)]) -> Vec<usize> {
    let full = vec3(&bin.room);
    let tilt = |s: &Resources| {
        let x = vec3(s);
        let c = if full[0] > 0.0 { x[0] / full[0] } else { 0.0 };
        let m = if full[1] > 0.0 { x[1] / full[1] } else { 0.0 };
        (m + 1e-12) / (c + 1e-12)
    };
    let keys: Vec<f64> = shapes.iter().map(|(s, ..)| tilt(s)).collect();
    let mut by_tilt: Vec<usize> = (0..shapes.len()).collect();
    by_tilt.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]).then(a.cmp(&b)));
    by_tilt
}

/// What one node of `bin` would take from the remaining shapes (`left` of each): `(shape, count)`
/// and their value. Plain: shapes in value order, as many of each as fit. Balanced: one pod at a
/// time, from the memory-heavy or the cpu-heavy end, whichever keeps cpu and memory filling
/// together. `by_tilt`: the balanced fill's shape order for this bin ([`tilt_order`]); `None`: plain.
fn fill(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)], left: &[i64], by_tilt: Option<&[usize]>) -> (Takes, f64) {
    let mut room = bin.room;
    let mut takes: Takes = Vec::new();
    let mut v = 0.0;
    let Some(by_tilt) = by_tilt else {
        for (si, (s, sv, _)) in shapes.iter().enumerate() {
            // All that is left of a shape often fits: a product is cheaper than four divisions.
            let k = if left[si] > 0 && fits_once(&room, &times(s, left[si])) {
                left[si]
            } else {
                fit_count(&room, s).min(left[si])
            };
            if k > 0 {
                room = room.saturating_sub(times(s, k));
                v += sv * k as f64;
                takes.push((si, k));
            }
        }
        return (takes, v);
    };
    // Two-pointer balance: shapes ordered by how memory-heavy they are relative to the node; add
    // from the memory-heavy end while memory is the less filled resource, else from the cpu-heavy end.
    // A shape that is used up or no longer fits stays so (room only shrinks): each end's pointer
    // only moves inwards, so a fill costs O(shapes + pods).
    let full = vec3(&bin.room);
    let (mut used_c, mut used_m) = (0.0f64, 0.0f64);
    let mut taken: Vec<i64> = vec![0; shapes.len()];
    let (mut lo, mut hi) = (0usize, by_tilt.len());
    let alive = |si: usize, room: &Resources, taken: &[i64]| left[si] > taken[si] && fits_once(room, &shapes[si].0);
    while lo < hi {
        let memory_first = used_m / full[1].max(1.0) < used_c / full[0].max(1.0);
        let si = if memory_first {
            while lo < hi && !alive(by_tilt[hi - 1], &room, &taken) {
                hi -= 1;
            }
            if lo == hi {
                break;
            }
            by_tilt[hi - 1]
        } else {
            while lo < hi && !alive(by_tilt[lo], &room, &taken) {
                lo += 1;
            }
            if lo == hi {
                break;
            }
            by_tilt[lo]
        };
        let s = &shapes[si].0;
        room = room.saturating_sub(*s);
        used_c += s.cpu_millis as f64;
        used_m += s.memory_bytes as f64;
        v += shapes[si].1;
        if taken[si] == 0 {
            takes.push((si, 0));
        }
        taken[si] += 1;
    }
    for t in &mut takes {
        t.1 = taken[t.0];
    }
    (takes, v)
}

/// First-fit decreasing (cpu, then memory) into open nodes; an item that fits none opens the cheapest
/// bin it fits. A second candidate beside [`pack`]: the solver keeps the cheaper, so re-packing is
/// never worse than this classic baseline.
pub fn pack_ffd(items: &[Resources], bins: &[Bin]) -> Option<Vec<(usize, Vec<usize>)>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        (items[b].cpu_millis, items[b].memory_bytes).cmp(&(items[a].cpu_millis, items[a].memory_bytes)).then(a.cmp(&b))
    });
    let mut by_price: Vec<usize> = (0..bins.len()).collect();
    by_price.sort_by(|&a, &b| bins[a].price.total_cmp(&bins[b].price).then(a.cmp(&b)));
    let mut open: Vec<(Resources, usize, Vec<usize>)> = Vec::new();
    for i in order {
        if let Some(node) = open.iter_mut().find(|(room, ..)| items[i].fits(room)) {
            node.0 = node.0.saturating_sub(items[i]);
            node.2.push(i);
            continue;
        }
        let b = *by_price.iter().find(|&&b| items[i].fits(&bins[b].room))?;
        open.push((bins[b].room.saturating_sub(items[i]), b, vec![i]));
    }
    Some(
        open.into_iter()
            .map(|(_, b, mut list)| {
                list.sort_unstable();
                (b, list)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{bin, r};
    use super::*;

    #[test]
    fn packs_cpu_heavy_pods_into_small_cheap_bins() {
        let bins = [bin(4000, 4, 1.0), bin(16000, 32, 5.0)];
        let items = vec![r(1000, 0); 16];
        let p = pack(&items, &bins).unwrap_or_default();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|(b, items)| *b == 0 && items.len() == 4));
    }

    #[test]
    fn balanced_fill_pairs_cpu_heavy_with_memory_heavy_pods() {
        // One 8-CPU/8-GiB type: 8 pods of (1 CPU, 0) and 8 of (0, 1 GiB) fit exactly in one node
        // when mixed, and the balanced fill finds it.
        let bins = [bin(8000, 8, 1.0)];
        let mut items = vec![r(1000, 0); 8];
        items.extend(vec![r(0, 1); 8]);
        let p = pack_balanced(&items, &bins).unwrap_or_default();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].1.len(), 16);
    }

    #[test]
    fn an_item_too_large_for_every_bin_fails() {
        assert!(pack(&[r(99_000, 0)], &[bin(4000, 4, 1.0)]).is_none());
    }
}
