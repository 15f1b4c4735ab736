//! B2 — cost quality (performance.md): the hourly price of the NodeClaims the hub would create for
//! seeded random workloads, against the LP lower bound (cheapest fractional mix of flavors covering
//! the total cpu, memory and pod slots) and against first-fit-decreasing on the cheapest fitting
//! flavor. Built-in Clever flavors; 200 / 1,000 / 5,000 pods; cpu-heavy, memory-heavy, mixed; with
//! and without a DaemonSet.
//!
//! `cargo bench -p scheduling --bench b2` prints a table and the summary; `B2_JSON=1` adds one JSON
//! object per case; `B2_NO_REPACK=1` measures the solver without its cost-improving repack.

mod common;

use common::Rng;
use crds::catalog::InstanceType;
use crds::quantity::Resources;
use scheduling::model::{DaemonSet, Input, Pod, Pool};
use scheduling::solve;
use scheduling::testkit::{MI, flavors, pod};

fn workload(profile: &str, n: usize, seed: u64) -> Vec<Pod> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let (cpu, mem) = match profile {
                // cpu-heavy: 250m–4 CPU, 128–1024Mi
                "cpu" => (250 + 250 * rng.below(16) as i64, 128 * (1 + rng.below(8) as i64)),
                // memory-heavy: 100–500m, 1–8Gi
                "memory" => (100 * (1 + rng.below(5) as i64), 512 * (2 + rng.below(15) as i64)),
                // mixed: 100m–2 CPU, 128Mi–4Gi
                _ => (100 * (1 + rng.below(20) as i64), 128 * (1 + rng.below(32) as i64)),
            };
            let mut p = pod(&format!("p{i:05}"), cpu, mem * MI);
            p.created = i as i64;
            p
        })
        .collect()
}

/// Cheapest fractional mix: min Σ price·x s.t. Σ (allocatable − overhead)·x ≥ demand (cpu, memory,
/// pods), x ≥ 0, solved through its dual (3 variables): max d·y s.t. a_i·y ≤ price_i, y ≥ 0, whose
/// optimum lies on a vertex cut by 3 of the n + 3 planes.
fn lp_bound(types: &[InstanceType], overhead: Resources, demand: Resources) -> f64 {
    let rows: Vec<([f64; 3], f64)> = types
        .iter()
        .map(|t| {
            let a = t.allocatable.saturating_sub(overhead);
            ([a.cpu_millis as f64, a.memory_bytes as f64, a.pods as f64], t.offerings[0].price_hourly)
        })
        .chain((0..3).map(|k| {
            let mut v = [0.0; 3];
            v[k] = -1.0;
            (v, 0.0)
        }))
        .collect();
    let d = [demand.cpu_millis as f64, demand.memory_bytes as f64, demand.pods as f64];
    let mut best = 0.0f64;
    let n = rows.len();
    for i in 0..n {
        for j in i + 1..n {
            for k in j + 1..n {
                let (a, b, c) = (rows[i], rows[j], rows[k]);
                let m = [a.0, b.0, c.0];
                let det = det3(m);
                if det.abs() < 1e-18 {
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
                if feasible {
                    best = best.max(d[0] * y[0] + d[1] * y[1] + d[2] * y[2]);
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
fn ffd(types: &[InstanceType], overhead: Resources, pods: &[Pod]) -> f64 {
    let mut order: Vec<&Pod> = pods.iter().collect();
    order.sort_by(|a, b| {
        (b.requests.cpu_millis, b.requests.memory_bytes).cmp(&(a.requests.cpu_millis, a.requests.memory_bytes))
    });
    let mut sorted_types: Vec<&InstanceType> = types.iter().collect();
    sorted_types.sort_by(|a, b| a.offerings[0].price_hourly.total_cmp(&b.offerings[0].price_hourly));
    let mut open: Vec<(Resources, f64)> = Vec::new();
    for p in order {
        if let Some(slot) = open.iter_mut().find(|(room, _)| p.requests.fits(room)) {
            slot.0 = slot.0.saturating_sub(p.requests);
            continue;
        }
        if let Some(t) = sorted_types.iter().find(|t| p.requests.fits(&t.allocatable.saturating_sub(overhead))) {
            open.push((t.allocatable.saturating_sub(overhead).saturating_sub(p.requests), t.offerings[0].price_hourly));
        }
    }
    open.iter().map(|(_, price)| price).sum()
}

fn main() {
    let json = std::env::var_os("B2_JSON").is_some();
    let repack = std::env::var_os("B2_NO_REPACK").is_none();
    let types = flavors();
    println!(
        "{:<8} {:>6} {:<4} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "profile", "pods", "ds", "seed", "LP €/h", "hub €/h", "FFD €/h", "hub/LP", "FFD/LP", "claims"
    );
    let mut ratios: Vec<f64> = Vec::new();
    let mut worst: f64 = 0.0;
    let mut beats_ffd = true;
    for &n in &[200usize, 1000, 5000] {
        for profile in ["cpu", "memory", "mixed"] {
            for ds in [false, true] {
                for seed in 1..=3u64 {
                    let pods = workload(profile, n, seed * 1000 + n as u64);
                    let daemonsets = if ds {
                        vec![DaemonSet {
                            namespace: "kube-system".into(),
                            name: "agent".into(),
                            pod: pod("agent", 200, 256 * MI),
                        }]
                    } else {
                        Vec::new()
                    };
                    let overhead = daemonsets.iter().fold(Resources::ZERO, |a, d| a + d.pod.requests);
                    let demand = pods.iter().fold(Resources::ZERO, |a, p| a + p.requests);
                    let lp = lp_bound(&types, overhead, demand);
                    let base = ffd(&types, overhead, &pods);
                    let mut input = Input {
                        pools: vec![Pool { name: "default".into(), instance_types: types.clone(), ..Pool::default() }],
                        pods,
                        daemonsets,
                        ..Input::default()
                    };
                    input.settings.repack = repack;
                    let d = solve(&input);
                    assert!(d.unschedulable.is_empty(), "unschedulable pods in B2");
                    let hub = d.total_price();
                    let (r, rf) = (hub / lp, base / lp);
                    if n >= 1000 {
                        ratios.push(r);
                        worst = worst.max(r);
                    }
                    beats_ffd &= hub <= base + 1e-9;
                    println!(
                        "{profile:<8} {n:>6} {:<4} {seed:>5} {lp:>10.4} {hub:>10.4} {base:>10.4} {r:>8.4} {rf:>8.4} {:>7}",
                        if ds { "yes" } else { "no" },
                        d.new_claims.len()
                    );
                    if json {
                        println!(
                            "{{\"bench\":\"B2\",\"profile\":\"{profile}\",\"pods\":{n},\"daemonset\":{ds},\"seed\":{seed},\"lp\":{lp:.4},\"hub\":{hub:.4},\"ffd\":{base:.4},\"hub_over_lp\":{r:.4},\"ffd_over_lp\":{rf:.4},\"claims\":{}}}",
                            d.new_claims.len()
                        );
                    }
                }
            }
        }
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    println!(
        "\nat ≥ 1,000 pods: mean hub/LP {mean:.4} (target ≤ 1.05), worst {worst:.4} (target ≤ 1.15); never worse than FFD: {beats_ffd}"
    );
}
