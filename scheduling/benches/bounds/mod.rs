//! The references B2 measures the hub against: the LP lower bound (the cheapest fractional mix of
//! flavors covering the demand), the same with cpu and memory limits on capacity, first-fit
//! decreasing on the cheapest fitting flavor, and an upper bound on the pods any packing places
//! within limits. Benches only.
//!
//! Owns these bounds, computed independently of the crate's own LP and packings. Must not call the
//! solver (b2 compares its answers against these).

use crds::catalog::InstanceType;
use crds::quantity::Resources;
use scheduling::model::Pod;

/// Cheapest fractional mix: min Σ price·x s.t. Σ (allocatable − overhead)·x ≥ demand (cpu, memory,
/// pods), x ≥ 0, solved through its dual (3 variables): max d·y s.t. a_i·y ≤ price_i, y ≥ 0, whose
/// optimum lies on a vertex cut by 3 of the n + 3 planes. Large catalogues: the vertices of a working
/// set of types, to which every type whose constraint the answer violates is added until none is
/// (then the answer is the optimum over all types).
pub fn lp_bound(types: &[InstanceType], overhead: Resources, demand: Resources) -> f64 {
    // Cores and GiB keep the systems well conditioned.
    let (c, g) = (1e-3, 1.0 / f64::from(1u32 << 30));
    let rows: Vec<([f64; 3], f64)> = types
        .iter()
        .map(|t| {
            let a = t.allocatable.saturating_sub(overhead);
            ([a.cpu_millis as f64 * c, a.memory_bytes as f64 * g, a.pods as f64], t.offerings[0].price_hourly)
        })
        .collect();
    let d = [demand.cpu_millis as f64 * c, demand.memory_bytes as f64 * g, demand.pods as f64];
    let mut set: Vec<usize> = if rows.len() <= 20 {
        (0..rows.len()).collect()
    } else {
        let mut s = Vec::new();
        for k in 0..3 {
            let mut by: Vec<usize> = (0..rows.len()).collect();
            by.sort_by(|&a, &b| (rows[b].0[k] / rows[b].1).total_cmp(&(rows[a].0[k] / rows[a].1)));
            s.extend(by.into_iter().take(4));
        }
        s.sort_unstable();
        s.dedup();
        s
    };
    loop {
        let (y, v) = lp_vertices(&rows, &set, d);
        let violated: Vec<usize> = (0..rows.len())
            .filter(|i| !set.contains(i))
            .filter(|&i| rows[i].0.iter().zip(&y).map(|(a, y)| a * y).sum::<f64>() > rows[i].1 * (1.0 + 1e-9))
            .collect();
        if violated.is_empty() {
            return v;
        }
        set.extend(violated);
    }
}

/// The best vertex of the dual over the types `set` (and y ≥ 0).
fn lp_vertices(all: &[([f64; 3], f64)], set: &[usize], d: [f64; 3]) -> ([f64; 3], f64) {
    let rows: Vec<([f64; 3], f64)> = set
        .iter()
        .map(|&i| all[i])
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
                let (a, b, c) = (rows[i], rows[j], rows[k]);
                let m = [a.0, b.0, c.0];
                let det = det3(m);
                if det.abs() < 1e-12 {
                    continue;
                }
                let r = [a.1, b.1, c.1];
                let mut y = [0.0; 3];
                for col in 0..3 {
                    let mut mc = m;
                    for row in 0..3 {
                        mc[row][col] = r[row];
                    }
                    y[col] = det3(mc) / det;
                }
                let feasible = rows.iter().all(|(ai, pi)| ai[0] * y[0] + ai[1] * y[1] + ai[2] * y[2] <= pi + 1e-9);
                let v = d[0] * y[0] + d[1] * y[1] + d[2] * y[2];
                if feasible && v > best.1 {
                    best = (y, v);
                }
            }
        }
    }
    best
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

/// First-fit decreasing (by cpu, then memory) into open nodes; a pod that fits none opens the
/// cheapest flavor it fits.
pub fn ffd(types: &[InstanceType], overhead: Resources, pods: &[Pod]) -> f64 {
    ffd_nodes(types, overhead, pods).iter().map(|(price, _)| price).sum()
}

/// [`ffd`]'s nodes: price and capacity each.
pub fn ffd_nodes(types: &[InstanceType], overhead: Resources, pods: &[Pod]) -> Vec<(f64, Resources)> {
    let mut order: Vec<&Pod> = pods.iter().collect();
    order.sort_by(|a, b| {
        (b.requests.cpu_millis, b.requests.memory_bytes).cmp(&(a.requests.cpu_millis, a.requests.memory_bytes))
    });
    let mut sorted_types: Vec<&InstanceType> = types.iter().collect();
    sorted_types.sort_by(|a, b| a.offerings[0].price_hourly.total_cmp(&b.offerings[0].price_hourly));
    let mut open: Vec<(Resources, f64, Resources)> = Vec::new();
    for p in order {
        if let Some(slot) = open.iter_mut().find(|(room, ..)| p.requests.fits(room)) {
            slot.0 = slot.0.saturating_sub(p.requests);
            continue;
        }
        if let Some(t) = sorted_types.iter().find(|t| p.requests.fits(&t.allocatable.saturating_sub(overhead))) {
            open.push((
                t.allocatable.saturating_sub(overhead).saturating_sub(p.requests),
                t.offerings[0].price_hourly,
                t.capacity,
            ));
        }
    }
    open.into_iter().map(|(_, price, cap)| (price, cap)).collect()
}

/// The LP bound with cpu and memory limits on capacity: min Σ price·x s.t. Σ allocatable·x ≥ demand
/// (cpu, memory, pods), Σ capacity·x ≤ limit (cpu, memory), x ≥ 0; through its dual (5 variables:
/// max d·y − l·z s.t. a_i·y − c_i·z ≤ price_i, y, z ≥ 0) by vertex enumeration. The primal must be
/// feasible (the family's limits hold the FFD packing), so the dual is bounded.
pub fn lp_bound_limited(types: &[InstanceType], demand: Resources, limit: [f64; 2]) -> f64 {
    const N: usize = 5;
    // Cores and GiB keep the systems well conditioned.
    let (c, g) = (1e-3, 1.0 / f64::from(1u32 << 30));
    let mut rows: Vec<([f64; N], f64)> = types
        .iter()
        .map(|t| {
            let (a, k) = (t.allocatable, t.capacity);
            (
                [
                    a.cpu_millis as f64 * c,
                    a.memory_bytes as f64 * g,
                    a.pods as f64,
                    -(k.cpu_millis as f64) * c,
                    -(k.memory_bytes as f64) * g,
                ],
                t.offerings[0].price_hourly,
            )
        })
        .collect();
    for k in 0..N {
        let mut v = [0.0; N];
        v[k] = -1.0;
        rows.push((v, 0.0));
    }
    let obj = [
        demand.cpu_millis as f64 * c,
        demand.memory_bytes as f64 * g,
        demand.pods as f64,
        -limit[0] * c,
        -limit[1] * g,
    ];
    let mut best = 0.0f64;
    let n = rows.len();
    let mut pick = [0usize; N];
    fn next(pick: &mut [usize; 5], n: usize) -> bool {
        let mut i = 5;
        while i > 0 {
            i -= 1;
            if pick[i] < n - 5 + i {
                pick[i] += 1;
                for j in i + 1..5 {
                    pick[j] = pick[j - 1] + 1;
                }
                return true;
            }
        }
        false
    }
    for (i, p) in pick.iter_mut().enumerate() {
        *p = i;
    }
    loop {
        // Solve rows[pick]·y = prices by Gaussian elimination with partial pivoting.
        let mut m = [[0.0f64; N + 1]; N];
        for (r, &k) in pick.iter().enumerate() {
            m[r][..N].copy_from_slice(&rows[k].0);
            m[r][N] = rows[k].1;
        }
        let mut ok = true;
        for col in 0..N {
            let piv = (col..N).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs())).unwrap_or(col);
            if m[piv][col].abs() < 1e-12 {
                ok = false;
                break;
            }
            m.swap(col, piv);
            let pivot = m[col];
            for (r, row) in m.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot[col];
                    for (x, p) in row.iter_mut().zip(pivot).skip(col) {
                        *x -= f * p;
                    }
                }
            }
        }
        if ok {
            let y: Vec<f64> = (0..N).map(|k| m[k][N] / m[k][k]).collect();
            let feasible = rows.iter().all(|(a, p)| a.iter().zip(&y).map(|(x, y)| x * y).sum::<f64>() <= p + 1e-9);
            if feasible {
                best = best.max(obj.iter().zip(&y).map(|(o, y)| o * y).sum());
            }
        }
        if !next(&mut pick, n) {
            break;
        }
    }
    best
}

/// An upper bound on the pods any packing places within capacity limits: per limited resource, the
/// most pods whose requests (smallest first) fit in the limit scaled by the best allocatable /
/// capacity ratio among the types; the least over the resources.
pub fn pods_bound(types: &[InstanceType], pods: &[Pod], limit: [i64; 2]) -> usize {
    let dims: [fn(&Resources) -> i64; 2] = [|r| r.cpu_millis, |r| r.memory_bytes];
    dims.iter()
        .zip(limit)
        .map(|(f, l)| {
            let ratio =
                types.iter().map(|t| f(&t.allocatable) as f64 / f(&t.capacity).max(1) as f64).fold(0.0, f64::max);
            let room = l as f64 * ratio;
            let mut sizes: Vec<i64> = pods.iter().map(|p| f(&p.requests)).collect();
            sizes.sort_unstable();
            let mut sum = 0.0;
            sizes
                .iter()
                .take_while(|&&x| {
                    sum += x as f64;
                    sum <= room
                })
                .count()
        })
        .min()
        .unwrap_or(0)
}
