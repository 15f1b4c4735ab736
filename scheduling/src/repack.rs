//! Cost-aware re-packing of unconstrained pods (a hub addition, `Settings::repack`).
//!
//! Karpenter's loop fills each new claim until its largest option is full and then launches the
//! cheapest option that still fits; with Clever's flavors (a 2XS costs less per vCPU than an XL) that
//! leaves up to 60 % on the table for CPU-heavy workloads, which upstream recovers later through
//! consolidation (churn). The solver therefore re-packs, after the loop, the pods that carry no
//! topology constraint and no host port, claim group by claim group (same pool, same requirements):
//! nodes are opened one at a time with the instance type that packs the most value per euro, where a
//! pod's value is its requests priced at the shadow prices of the LP relaxation (the cheapest
//! fractional mix of types covering the group's demand). The result is kept only when cheaper.
//!
//! Owns the packing arithmetic. Must not know about pools, limits or topology (the solver decides
//! which claims are eligible).

use crds::quantity::Resources;

/// A node type to pack into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bin {
    /// Room for pods: allocatable minus DaemonSet overhead.
    pub room: Resources,
    /// EUR/h.
    pub price: f64,
}

/// Most types for which the LP is solved (vertex enumeration is cubic in it).
pub const MAX_TYPES: usize = 64;

fn vec3(r: &Resources) -> [f64; 3] {
    [r.cpu_millis as f64, r.memory_bytes as f64, r.pods as f64]
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

/// Shadow prices (per millicore, byte, pod slot) of the LP `min Σ price·x, Σ room·x ≥ demand, x ≥ 0`,
/// from its dual `max demand·y, room_i·y ≤ price_i, y ≥ 0` by vertex enumeration; with the optimal
/// value (the LP lower bound).
pub fn shadow_prices(bins: &[Bin], demand: &Resources) -> ([f64; 3], f64) {
    // Scale to comparable magnitudes: cores, GiB, pods.
    let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
    let rows: Vec<([f64; 3], f64)> = bins
        .iter()
        .map(|b| {
            let v = vec3(&b.room);
            ([v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]], b.price)
        })
        .chain((0..3).map(|k| {
            let mut v = [0.0; 3];
            v[k] = -1.0;
            (v, 0.0)
        }))
        .collect();
    let d = vec3(demand);
    let d = [d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]];
    let mut best = ([0.0; 3], 0.0f64);
    let n = rows.len();
    for i in 0..n {
        for j in i + 1..n {
            for k in j + 1..n {
                let m = [rows[i].0, rows[j].0, rows[k].0];
                let det = det3(m);
                if det.abs() < 1e-12 {
                    continue;
                }
                let r = [rows[i].1, rows[j].1, rows[k].1];
                let mut y = [0.0; 3];
                for (col, yc) in y.iter_mut().enumerate() {
                    let mut mc = m;
                    for (row, rr) in r.iter().enumerate() {
                        mc[row][col] = *rr;
                    }
                    *yc = det3(mc) / det;
                }
                if rows.iter().all(|(a, p)| a[0] * y[0] + a[1] * y[1] + a[2] * y[2] <= p + 1e-9) {
                    let v = d[0] * y[0] + d[1] * y[1] + d[2] * y[2];
                    if v > best.1 {
                        best = (y, v);
                    }
                }
            }
        }
    }
    let (y, v) = best;
    ([y[0] * scale[0], y[1] * scale[1], y[2] * scale[2]], v)
}

/// How many pods of shape `s` fit in `room`.
fn fit_count(room: &Resources, s: &Resources) -> i64 {
    let per = |r: i64, q: i64| if q <= 0 { i64::MAX } else { (r / q).max(0) };
    per(room.cpu_millis, s.cpu_millis)
        .min(per(room.memory_bytes, s.memory_bytes))
        .min(per(room.ephemeral_storage_bytes, s.ephemeral_storage_bytes))
        .min(per(room.pods, s.pods))
}

fn times(s: &Resources, k: i64) -> Resources {
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
    for i in order {
        match shapes.iter_mut().find(|(s, ..)| *s == items[i]) {
            Some((_, _, list)) => list.push(i),
            None => shapes.push((items[i], value(&items[i]), vec![i])),
        }
    }
    let mut left = items.len();
    let mut out = Vec::new();
    while left > 0 {
        let mut best: Option<(f64, f64, usize, Takes)> = None;
        for (b, bin) in bins.iter().enumerate() {
            let (takes, v) = fill(bin, &shapes, balanced);
            if takes.is_empty() {
                continue;
            }
            let score = bin.price / v.max(1e-300);
            if best.as_ref().is_none_or(|(bs, bv, ..)| score < *bs || (score == *bs && v > *bv)) {
                best = Some((score, v, b, takes));
            }
        }
        let (_, _, b, takes) = best?;
        let mut taken = Vec::new();
        for (si, k) in takes {
            let list = &mut shapes[si].2;
            let at = list.len() - usize::try_from(k).unwrap_or(0).min(list.len());
            taken.extend(list.drain(at..));
        }
        left -= taken.len();
        taken.sort_unstable();
        out.push((b, taken));
    }
    Some(out)
}

/// `(shape index, count)` taken by one node.
type Takes = Vec<(usize, i64)>;

/// What one node of `bin` would take from the remaining shapes: `(shape, count)` and their value.
/// Plain: shapes in value order, as many of each as fit. Balanced: one pod at a time, from the
/// memory-heavy or the cpu-heavy end, whichever keeps cpu and memory filling together.
fn fill(bin: &Bin, shapes: &[(Resources, f64, Vec<usize>)], balanced: bool) -> (Takes, f64) {
    let mut room = bin.room;
    let mut takes: Takes = Vec::new();
    let mut v = 0.0;
    let mut left: Vec<i64> = shapes.iter().map(|(_, _, l)| i64::try_from(l.len()).unwrap_or(i64::MAX)).collect();
    if !balanced {
        for (si, (s, sv, _)) in shapes.iter().enumerate() {
            let k = fit_count(&room, s).min(left[si]);
            if k > 0 {
                room = room.saturating_sub(times(s, k));
                v += sv * k as f64;
                takes.push((si, k));
            }
        }
        return (takes, v);
    }
    // Two-pointer balance: shapes ordered by how memory-heavy they are relative to the node; add
    // from the memory-heavy end while memory is the less filled resource, else from the cpu-heavy end.
    let full = vec3(&bin.room);
    let tilt = |s: &Resources| {
        let x = vec3(s);
        let c = if full[0] > 0.0 { x[0] / full[0] } else { 0.0 };
        let m = if full[1] > 0.0 { x[1] / full[1] } else { 0.0 };
        (m + 1e-12) / (c + 1e-12)
    };
    let mut by_tilt: Vec<usize> = (0..shapes.len()).collect();
    by_tilt.sort_by(|&a, &b| tilt(&shapes[a].0).total_cmp(&tilt(&shapes[b].0)).then(a.cmp(&b)));
    let (mut used_c, mut used_m) = (0.0f64, 0.0f64);
    loop {
        let memory_first = used_m / full[1].max(1.0) < used_c / full[0].max(1.0);
        let mut iter: Box<dyn Iterator<Item = &usize>> =
            if memory_first { Box::new(by_tilt.iter().rev()) } else { Box::new(by_tilt.iter()) };
        let Some(&si) = iter.find(|&&si| left[si] > 0 && fit_count(&room, &shapes[si].0) > 0) else { break };
        let s = &shapes[si].0;
        room = room.saturating_sub(*s);
        used_c += s.cpu_millis as f64;
        used_m += s.memory_bytes as f64;
        v += shapes[si].1;
        left[si] -= 1;
        match takes.iter_mut().find(|(x, _)| *x == si) {
            Some(t) => t.1 += 1,
            None => takes.push((si, 1)),
        }
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
    use super::*;

    fn r(cpu: i64, mem_gi: i64) -> Resources {
        Resources { cpu_millis: cpu, memory_bytes: mem_gi << 30, ephemeral_storage_bytes: 0, pods: 1 }
    }

    fn bin(cpu: i64, mem_gi: i64, price: f64) -> Bin {
        Bin { room: Resources { pods: 110, ..r(cpu, mem_gi) }, price }
    }

    #[test]
    fn lp_prefers_the_cheapest_per_unit_type() {
        // 4-CPU bins at 1 € beat 16-CPU bins at 5 €: 16 CPU of demand costs 4 €.
        let bins = [bin(4000, 4, 1.0), bin(16000, 32, 5.0)];
        let (_, v) = shadow_prices(&bins, &Resources { pods: 16, ..r(16000, 1) });
        assert!((v - 4.0).abs() < 1e-6, "{v}");
    }

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
