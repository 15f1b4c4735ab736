//! The LP relaxation of a group's packing: shadow prices (what a millicore, a byte and a pod slot
//! are worth when the cheapest fractional mix of types covers the demand) and, for catalogues above
//! [`MAX_TYPES`], the candidate types worth packing into.
//!
//! Owns the LP and the cut of large catalogues. Must not pack (that is `pack`), nor know about pods,
//! pools or topology.

use crds::quantity::Resources;

use super::{Bin, MAX_TYPES};

pub(super) fn vec3(r: &Resources) -> [f64; 3] {
    [r.cpu_millis as f64, r.memory_bytes as f64, r.pods as f64]
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

/// Shadow prices (per millicore, byte, pod slot) of the LP `min Σ price·x, Σ room·x ≥ demand, x ≥ 0`,
/// from its dual `max demand·y, room_i·y ≤ price_i, y ≥ 0` by vertex enumeration; with the optimal
/// value (the LP lower bound). Above 16 bins the enumeration (quartic in the bins) runs on a working
/// set of bins, to which the bins whose constraint the answer violates are added until none is (the
/// answer is then optimal for all of them).
pub fn shadow_prices(bins: &[Bin], demand: &Resources) -> ([f64; 3], f64) {
    // Scale to comparable magnitudes: cores, GiB, pods.
    let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
    let rows: Vec<[f64; 3]> = bins
        .iter()
        .map(|b| {
            let v = vec3(&b.room);
            [v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]]
        })
        .collect();
    let d = vec3(demand);
    let d = [d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]];
    let unscale = |(y, v): ([f64; 3], f64)| ([y[0] * scale[0], y[1] * scale[1], y[2] * scale[2]], v);
    let all: Vec<usize> = (0..bins.len()).collect();
    if bins.len() <= 16 {
        return unscale(dual_vertices(&rows, bins, &all, &d));
    }
    // Working set: per resource, the bins offering the most of it per euro.
    let mut set: Vec<usize> = Vec::new();
    for k in [0usize, 1, 2] {
        let mut by: Vec<usize> = all.clone();
        by.sort_by(|&a, &b| (rows[b][k] / bins[b].price).total_cmp(&(rows[a][k] / bins[a].price)).then(a.cmp(&b)));
        for &i in by.iter().take(4) {
            if !set.contains(&i) {
                set.push(i);
            }
        }
    }
    let mut best = dual_vertices(&rows, bins, &set, &d);
    // Each round adds the most violated constraints; bounded so that a degenerate catalogue cannot
    // make it loop (the last answer is then a slight over-estimate of the prices, never unsafe).
    for _ in 0..12 {
        let y = best.0;
        let mut violated: Vec<(f64, usize)> = all
            .iter()
            .filter(|i| !set.contains(i))
            .map(|&i| ((rows[i][0] * y[0] + rows[i][1] * y[1] + rows[i][2] * y[2]) / bins[i].price, i))
            .filter(|(r, _)| *r > 1.0 + 1e-9)
            .collect();
        if violated.is_empty() {
            break;
        }
        violated.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        set.extend(violated.iter().take(8).map(|&(_, i)| i));
        best = dual_vertices(&rows, bins, &set, &d);
    }
    unscale(best)
}

/// The dual's best vertex over the bins `set` (and `y ≥ 0`), in scaled units.
fn dual_vertices(scaled: &[[f64; 3]], bins: &[Bin], set: &[usize], d: &[f64; 3]) -> ([f64; 3], f64) {
    let rows: Vec<([f64; 3], f64)> = set
        .iter()
        .map(|&i| (scaled[i], bins[i].price))
        .chain((0..3).map(|k| {
            let mut v = [0.0; 3];
            v[k] = -1.0;
            (v, 0.0)
        }))
        .collect();
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
    best
}

/// The bins worth packing into when there are more than [`MAX_TYPES`]: at most that many (plus, rarely,
/// one per item shape that none of them holds). Ranked by how much of the items' LP value (shadow
/// prices of their total demand) a euro buys; first the best of each size class (cpu by powers of
/// two × memory per cpu by powers of two), so that small nodes for the remainder and shapes for
/// memory- or cpu-heavy mixes stay available, then the best of the rest. Indices into `bins`,
/// ascending.
pub fn candidates(bins: &[Bin], items: &[Resources]) -> Vec<usize> {
    if bins.len() <= MAX_TYPES {
        return (0..bins.len()).collect();
    }
    let demand = items.iter().fold(Resources::ZERO, |a, r| a + *r);
    let (y, _) = shadow_prices(bins, &demand);
    let efficiency = |b: &Bin| {
        let v = vec3(&b.room);
        (v[0] * y[0] + v[1] * y[1] + v[2] * y[2]) / b.price.max(1e-12)
    };
    let eff: Vec<f64> = bins.iter().map(efficiency).collect();
    let mut order: Vec<usize> = (0..bins.len()).collect();
    order.sort_by(|&a, &b| eff[b].total_cmp(&eff[a]).then(bins[a].price.total_cmp(&bins[b].price)).then(a.cmp(&b)));
    let class = |b: &Bin| {
        let cpu = b.room.cpu_millis.max(1) as f64;
        let per_cpu = b.room.memory_bytes.max(1) as f64 / cpu;
        (cpu.log2().floor() as i64, per_cpu.log2().round() as i64)
    };
    let mut chosen: Vec<usize> = Vec::new();
    let mut classes: Vec<(i64, i64)> = Vec::new();
    for &i in &order {
        let c = class(&bins[i]);
        if !classes.contains(&c) {
            classes.push(c);
            chosen.push(i);
        }
    }
    chosen.truncate(MAX_TYPES);
    for &i in &order {
        if chosen.len() >= MAX_TYPES {
            break;
        }
        if !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    // Every item some bin holds keeps a bin holding it: the most efficient one.
    let mut shapes: Vec<Resources> = items.to_vec();
    shapes.sort_by_key(|r| (r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods));
    shapes.dedup();
    for s in shapes {
        if chosen.iter().any(|&i| s.fits(&bins[i].room)) {
            continue;
        }
        if let Some(&i) = order.iter().find(|&&i| s.fits(&bins[i].room)) {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::super::testing::{bin, r};
    use super::*;

    #[test]
    fn lp_prefers_the_cheapest_per_unit_type() {
        // 4-CPU bins at 1 € beat 16-CPU bins at 5 €: 16 CPU of demand costs 4 €.
        let bins = [bin(4000, 4, 1.0), bin(16000, 32, 5.0)];
        let (_, v) = shadow_prices(&bins, &Resources { pods: 16, ..r(16000, 1) });
        assert!((v - 4.0).abs() < 1e-6, "{v}");
    }

    /// Deterministic pseudo-random bins of 1–64 CPU, 1–8 GiB per CPU, priced with some noise.
    fn many_bins(n: usize) -> Vec<Bin> {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        (0..n)
            .map(|_| {
                let cpu = 1 + next(64) as i64;
                let mem = cpu * (1 + next(8) as i64);
                let price = cpu as f64 * 0.01 + mem as f64 * 0.004 + next(100) as f64 * 1e-4;
                bin(cpu * 1000, mem, price)
            })
            .collect()
    }

    #[test]
    fn the_lp_over_a_large_catalogue_is_the_full_enumerations_optimum() {
        for n in [17, 80, 400] {
            let bins = many_bins(n);
            let demand = Resources { pods: 900, ..r(700_000, 2000) };
            let (_, v) = shadow_prices(&bins, &demand);
            let scale = [1e-3, 1.0 / f64::from(1u32 << 30), 1.0];
            let rows: Vec<[f64; 3]> = bins
                .iter()
                .map(|b| {
                    let v = vec3(&b.room);
                    [v[0] * scale[0], v[1] * scale[1], v[2] * scale[2]]
                })
                .collect();
            let d = vec3(&demand);
            let all: Vec<usize> = (0..n).collect();
            let (_, full) = dual_vertices(&rows, &bins, &all, &[d[0] * scale[0], d[1] * scale[1], d[2] * scale[2]]);
            assert!((v - full).abs() <= 1e-9 * full.max(1.0), "{n} bins: {v} vs {full}");
        }
    }

    #[test]
    fn a_large_catalogue_is_cut_to_a_bounded_set_holding_every_item() {
        let bins = many_bins(400);
        let mut items: Vec<Resources> = (0..200).map(|i| r(100 + 37 * (i % 40), 1 + i % 7)).collect();
        items.push(r(60_000, 100)); // held only by some of the largest bins
        let cand = candidates(&bins, &items);
        assert!(cand.len() <= MAX_TYPES + 1, "{}", cand.len());
        assert!(cand.windows(2).all(|w| w[0] < w[1]));
        for it in &items {
            if bins.iter().any(|b| it.fits(&b.room)) {
                assert!(cand.iter().any(|&k| it.fits(&bins[k].room)), "{it:?} fits no candidate");
            }
        }
    }
}
