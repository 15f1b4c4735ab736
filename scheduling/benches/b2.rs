//! B2 — cost quality (performance.md): the hourly price of the NodeClaims the hub would create for
//! seeded random workloads, against the LP lower bound (cheapest fractional mix of flavors covering
//! the total cpu, memory and pod slots) and against first-fit-decreasing on the cheapest fitting
//! flavor. Built-in Clever flavors; 200 / 1,000 / 5,000 pods; cpu-heavy, memory-heavy, mixed; with
//! and without a DaemonSet.
//!
//! Family *limits*: the same workloads (no DaemonSet) in a pool whose cpu and memory limits equal the
//! capacity of the FFD packing, so that a packing of every pod exists within them but the hub's own
//! unconstrained choice may not fit; against the LP bound with the limits as constraints, and beside
//! the plain Karpenter loop (no repack).
//!
//! Families of issue 14: the 400 synthetic types, zone spread, hostname spread, hostname
//! anti-affinity, host ports and minValues, each beside the plain loop (no repack).
//!
//! `cargo bench -p scheduling --bench b2` prints the tables and the summaries; `B2_JSON=1` adds one
//! JSON object per case; `B2_NO_REPACK=1` measures the solver without its cost-improving repack;
//! `B2_LIMITS_ONLY=1` runs only the limits families; `B2_FAMILIES=all` (or a comma-separated list of
//! family names) runs only the families. `B2_EXACT=1` adds the small cases' exact optimum (MILP,
//! ≈ 2.5 min; `B2_EXACT_ONLY=1` runs only them; `B2_EXACT_SECONDS` is the solver's budget per
//! case, 3 s by default).

mod common;
mod exact;

use common::Rng;
use crds::catalog::InstanceType;
use crds::labels::{HOSTNAME, INSTANCE_TYPE, ZONE};
use crds::quantity::Resources;
use scheduling::model::{DaemonSet, Input, Limits, Operator, Pod, Pool, WhenUnsatisfiable};
use scheduling::solve;
use scheduling::testkit::{MI, flavors, flavors_3_zones, host_port, labels_of, pod, req, spread, term};

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
/// optimum lies on a vertex cut by 3 of the n + 3 planes. Large catalogues: the vertices of a working
/// set of types, to which every type whose constraint the answer violates is added until none is
/// (then the answer is the optimum over all types).
fn lp_bound(types: &[InstanceType], overhead: Resources, demand: Resources) -> f64 {
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
fn ffd(types: &[InstanceType], overhead: Resources, pods: &[Pod]) -> f64 {
    ffd_nodes(types, overhead, pods).iter().map(|(price, _)| price).sum()
}

/// [`ffd`]'s nodes: price and capacity each.
fn ffd_nodes(types: &[InstanceType], overhead: Resources, pods: &[Pod]) -> Vec<(f64, Resources)> {
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
fn lp_bound_limited(types: &[InstanceType], demand: Resources, limit: [f64; 2]) -> f64 {
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

fn main() {
    let json = std::env::var_os("B2_JSON").is_some();
    let repack = std::env::var_os("B2_NO_REPACK").is_none();
    let types = flavors();
    if std::env::var_os("B2_LIMITS_ONLY").is_some() {
        limits_family(&types, json, repack);
        tight_limits_family(&types, json, repack);
        return;
    }
    if let Ok(only) = std::env::var("B2_FAMILIES") {
        families(&only, json, repack);
        return;
    }
    if std::env::var_os("B2_EXACT_ONLY").is_some() {
        small_cases(json, repack);
        return;
    }
    println!(
        "{:<8} {:>6} {:<4} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>7}",
        "profile",
        "pods",
        "ds",
        "seed",
        "LP €/h",
        "hub €/h",
        "plain €/h",
        "FFD €/h",
        "hub/LP",
        "plain/LP",
        "FFD/LP",
        "claims"
    );
    let mut plain_ratios: Vec<f64> = Vec::new();
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
                    input.settings.repack = false;
                    let plain = solve(&input).total_price();
                    let hub = d.total_price();
                    let (r, rp, rf) = (hub / lp, plain / lp, base / lp);
                    if n >= 1000 {
                        ratios.push(r);
                        plain_ratios.push(rp);
                        worst = worst.max(r);
                    }
                    beats_ffd &= hub <= base + 1e-9;
                    println!(
                        "{profile:<8} {n:>6} {:<4} {seed:>5} {lp:>10.4} {hub:>10.4} {plain:>10.4} {base:>10.4} {r:>8.4} {rp:>8.4} {rf:>8.4} {:>7}",
                        if ds { "yes" } else { "no" },
                        d.new_claims.len()
                    );
                    if json {
                        println!(
                            "{{\"bench\":\"B2\",\"profile\":\"{profile}\",\"pods\":{n},\"daemonset\":{ds},\"seed\":{seed},\"lp\":{lp:.4},\"hub\":{hub:.4},\"plain\":{plain:.4},\"ffd\":{base:.4},\"hub_over_lp\":{r:.4},\"plain_over_lp\":{rp:.4},\"ffd_over_lp\":{rf:.4},\"claims\":{}}}",
                            d.new_claims.len()
                        );
                    }
                }
            }
        }
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    let plain_mean = plain_ratios.iter().sum::<f64>() / plain_ratios.len().max(1) as f64;
    let plain_worst = plain_ratios.iter().copied().fold(0.0, f64::max);
    println!(
        "\nat ≥ 1,000 pods: mean hub/LP {mean:.4} (target ≤ 1.05), worst {worst:.4} (target ≤ 1.15); never worse than FFD: {beats_ffd}; plain loop (no repack) mean {plain_mean:.4}, worst {plain_worst:.4}"
    );
    limits_family(&types, json, repack);
    tight_limits_family(&types, json, repack);
    families("all", json, repack);
    // The exact reference takes ≈ 2.5 min (most of it cases the solver cannot prove in its budget).
    if std::env::var_os("B2_EXACT").is_some() {
        small_cases(json, repack);
    }
}

/// A family of the extended suite: a catalogue, and what it does to the pool and to each pod.
struct Family {
    name: &'static str,
    types: Vec<InstanceType>,
    pool: fn(&mut Pool),
    pod: fn(&mut Pod, usize, usize),
    /// cpu and memory limits at 110 % of the FFD packing's capacity (which ignores the constraints).
    limited: bool,
}

fn app_label(p: &mut Pod, app: &str) {
    p.labels = labels_of(&[("app", app)]);
}

fn family_list() -> Vec<Family> {
    vec![
        Family { name: "400-types", types: common::synthetic_400(), pool: |_| {}, pod: |_, _, _| {}, limited: false },
        Family {
            // 20 apps, each spread over the three zones with maxSkew 1.
            name: "zone-spread",
            types: flavors_3_zones(),
            pool: |_| {},
            pod: |p, i, _| {
                let app = format!("app-{}", i % 20);
                app_label(p, &app);
                p.constraints.topology_spread =
                    vec![spread(ZONE, 1, WhenUnsatisfiable::DoNotSchedule, &[("app", &app)])];
            },
            limited: false,
        },
        Family {
            // Apps of 10 replicas, spread over nodes with maxSkew 1 (at most one replica per node).
            name: "hostname-spread",
            types: flavors(),
            pool: |_| {},
            pod: |p, i, n| {
                let app = format!("app-{}", i % (n / 10).max(1));
                app_label(p, &app);
                p.constraints.topology_spread =
                    vec![spread(HOSTNAME, 1, WhenUnsatisfiable::DoNotSchedule, &[("app", &app)])];
            },
            limited: false,
        },
        Family {
            // Apps of 10 replicas with required hostname anti-affinity to themselves.
            name: "anti-affinity",
            types: flavors(),
            pool: |_| {},
            pod: |p, i, n| {
                let app = format!("app-{}", i % (n / 10).max(1));
                app_label(p, &app);
                p.constraints.pod_anti_affinity = vec![term(HOSTNAME, &[("app", &app)])];
            },
            limited: false,
        },
        Family {
            // One pod in four listens on a host port (five ports in use): at most one per port and node.
            name: "host-ports",
            types: flavors(),
            pool: |_| {},
            pod: |p, i, _| {
                if i % 4 == 0 {
                    p.constraints.host_ports = vec![host_port(9000 + i32::try_from(i / 4 % 5).unwrap_or(0), "TCP")];
                }
            },
            limited: false,
        },
        Family {
            // Every claim must keep at least 3 instance types.
            name: "min-values",
            types: flavors(),
            pool: |p| {
                let mut r = req(INSTANCE_TYPE, Operator::Exists, &[]);
                r.min_values = Some(3);
                p.requirements = vec![r];
            },
            pod: |_, _, _| {},
            limited: false,
        },
        Family {
            // hostname-spread in a pool with cpu and memory limits.
            name: "spread+limits",
            types: flavors(),
            pool: |_| {},
            pod: |p, i, n| {
                let app = format!("app-{}", i % (n / 10).max(1));
                app_label(p, &app);
                p.constraints.topology_spread =
                    vec![spread(HOSTNAME, 1, WhenUnsatisfiable::DoNotSchedule, &[("app", &app)])];
            },
            limited: true,
        },
        Family {
            // host-ports in a pool with cpu and memory limits.
            name: "ports+limits",
            types: flavors(),
            pool: |_| {},
            pod: |p, i, _| {
                if i % 4 == 0 {
                    p.constraints.host_ports = vec![host_port(9000 + i32::try_from(i / 4 % 5).unwrap_or(0), "TCP")];
                }
            },
            limited: true,
        },
    ]
}

/// The extended families (issue 14 item 4): per family, the cpu / memory / mixed workloads of 1,000
/// and 5,000 pods, 3 seeds, against the LP bound (which ignores topology, so a gap is integrality,
/// constraint or solver; with the limits as constraints for the limited families), with the plain
/// loop (no repack) beside the hub.
fn families(only: &str, json: bool, repack: bool) {
    println!(
        "\nfamilies\n{:<16} {:<8} {:>6} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "family",
        "profile",
        "pods",
        "seed",
        "LP €/h",
        "hub €/h",
        "plain €/h",
        "hub/LP",
        "plain/LP",
        "pending",
        "pl.pend",
        "hub ms"
    );
    let mut summary: Vec<(String, f64, f64, f64, f64, usize, f64)> = Vec::new();
    for f in family_list() {
        if only != "all" && !only.split(',').any(|o| o == f.name) {
            continue;
        }
        let (mut ratios, mut plain_ratios, mut pending, mut slowest) = (Vec::new(), Vec::new(), 0usize, 0.0f64);
        for &n in &[1000usize, 5000] {
            for profile in ["cpu", "memory", "mixed"] {
                for seed in 1..=3u64 {
                    let mut pods = workload(profile, n, seed * 1000 + n as u64);
                    for (i, p) in pods.iter_mut().enumerate() {
                        (f.pod)(p, i, n);
                    }
                    let demand = pods.iter().fold(Resources::ZERO, |a, p| a + p.requests);
                    let mut pool = Pool { name: "default".into(), instance_types: f.types.clone(), ..Pool::default() };
                    (f.pool)(&mut pool);
                    let lp = if f.limited {
                        let cap = ffd_nodes(&f.types, Resources::ZERO, &pods)
                            .iter()
                            .fold(Resources::ZERO, |a, (_, c)| a + *c);
                        let limit = [cap.cpu_millis * 11 / 10, cap.memory_bytes * 11 / 10];
                        pool.limits =
                            Limits { cpu_millis: Some(limit[0]), memory_bytes: Some(limit[1]), ..Limits::default() };
                        lp_bound_limited(&f.types, demand, [limit[0] as f64, limit[1] as f64])
                    } else {
                        lp_bound(&f.types, Resources::ZERO, demand)
                    };
                    let mut input = Input { pools: vec![pool], pods, ..Input::default() };
                    input.settings.repack = repack;
                    let started = std::time::Instant::now();
                    let d = solve(&input);
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    input.settings.repack = false;
                    let plain = solve(&input);
                    let (hub, base) = (d.total_price(), plain.total_price());
                    let (r, rp) = (hub / lp, base / lp);
                    ratios.push(r);
                    plain_ratios.push(rp);
                    pending += d.unschedulable.len();
                    slowest = slowest.max(ms);
                    println!(
                        "{:<16} {profile:<8} {n:>6} {seed:>5} {lp:>10.4} {hub:>10.4} {base:>10.4} {r:>8.4} {rp:>8.4} {:>8} {:>8} {ms:>8.1}",
                        f.name,
                        d.unschedulable.len(),
                        plain.unschedulable.len()
                    );
                    if json {
                        println!(
                            "{{\"bench\":\"B2-family\",\"family\":\"{}\",\"profile\":\"{profile}\",\"pods\":{n},\"seed\":{seed},\"lp\":{lp:.4},\"hub\":{hub:.4},\"plain\":{base:.4},\"hub_pending\":{},\"plain_pending\":{},\"hub_ms\":{ms:.1}}}",
                            f.name,
                            d.unschedulable.len(),
                            plain.unschedulable.len()
                        );
                    }
                }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        summary.push((
            f.name.to_string(),
            mean(&ratios),
            worst(&ratios),
            mean(&plain_ratios),
            worst(&plain_ratios),
            pending,
            slowest,
        ));
    }
    println!(
        "\n{:<16} {:>12} {:>12} {:>12} {:>12} {:>8} {:>10}",
        "family", "hub/LP mean", "hub/LP worst", "plain mean", "plain worst", "pending", "slowest ms"
    );
    for (name, m, w, pm, pw, pending, slowest) in summary {
        println!("{name:<16} {m:>12.4} {w:>12.4} {pm:>12.4} {pw:>12.4} {pending:>8} {slowest:>10.1}");
    }
}

/// An upper bound on the pods any packing places within capacity limits: per limited resource, the
/// most pods whose requests (smallest first) fit in the limit scaled by the best allocatable /
/// capacity ratio among the types; the least over the resources.
fn pods_bound(types: &[InstanceType], pods: &[Pod], limit: [i64; 2]) -> usize {
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

/// Family *tight limits*: the limits at 60 % of the FFD packing's capacity, so some pods must stay
/// pending: pods placed by the hub and by the plain loop against [`pods_bound`].
fn tight_limits_family(types: &[InstanceType], json: bool, repack: bool) {
    println!(
        "\ntight limits: cpu and memory = 60 % of the FFD packing's capacity\n{:<8} {:>6} {:>5} {:>9} {:>9} {:>8} {:>10} {:>10} {:>9} {:>8}",
        "profile", "pods", "seed", "cpu lim", "mem GiB", "bound", "hub placed", "plain pl.", "hub/bound", "hub €/h"
    );
    let (mut worst, mut sum, mut count) = (f64::INFINITY, 0.0, 0usize);
    for &n in &[200usize, 1000, 5000] {
        for profile in ["cpu", "memory", "mixed"] {
            for seed in 1..=3u64 {
                let pods = workload(profile, n, seed * 1000 + n as u64);
                let cap = ffd_nodes(types, Resources::ZERO, &pods).iter().fold(Resources::ZERO, |a, (_, c)| a + *c);
                let limit = [cap.cpu_millis * 6 / 10, cap.memory_bytes * 6 / 10];
                let bound = pods_bound(types, &pods, limit);
                let pool = Pool {
                    name: "default".into(),
                    instance_types: types.to_vec(),
                    limits: Limits { cpu_millis: Some(limit[0]), memory_bytes: Some(limit[1]), ..Limits::default() },
                    ..Pool::default()
                };
                let mut input = Input { pools: vec![pool], pods, ..Input::default() };
                input.settings.repack = repack;
                let d = solve(&input);
                input.settings.repack = false;
                let plain = solve(&input);
                let (hub, base) = (n - d.unschedulable.len(), n - plain.unschedulable.len());
                let r = hub as f64 / bound.max(1) as f64;
                if n >= 1000 {
                    worst = worst.min(r);
                    sum += r;
                    count += 1;
                }
                println!(
                    "{profile:<8} {n:>6} {seed:>5} {:>9} {:>9.1} {bound:>8} {hub:>10} {base:>10} {r:>9.4} {:>8.4}",
                    limit[0] / 1000,
                    limit[1] as f64 / f64::from(1u32 << 30),
                    d.total_price()
                );
                if json {
                    println!(
                        "{{\"bench\":\"B2-tight-limits\",\"profile\":\"{profile}\",\"pods\":{n},\"seed\":{seed},\"bound\":{bound},\"hub_placed\":{hub},\"plain_placed\":{base},\"hub_price\":{:.4}}}",
                        d.total_price()
                    );
                }
            }
        }
    }
    println!(
        "\ntight limits, at ≥ 1,000 pods: pods placed / bound mean {:.4}, worst {worst:.4}",
        sum / count.max(1) as f64
    );
}

/// Family *limits* (see the module documentation).
fn limits_family(types: &[InstanceType], json: bool, repack: bool) {
    println!(
        "\nlimits: cpu and memory = the FFD packing's capacity\n{:<8} {:>6} {:>5} {:>9} {:>9} {:>10} {:>8} {:>8} {:>10} {:>8} {:>9} {:>8} {:>8}",
        "profile",
        "pods",
        "seed",
        "cpu lim",
        "mem GiB",
        "LP €/h",
        "hub €/h",
        "pending",
        "plain €/h",
        "pending",
        "hub/LP",
        "hub ms",
        "plain ms"
    );
    let mut ratios: Vec<f64> = Vec::new();
    let mut worst: f64 = 0.0;
    let mut pending_total = 0usize;
    let mut slowest = std::time::Duration::ZERO;
    for &n in &[200usize, 1000, 5000] {
        for profile in ["cpu", "memory", "mixed"] {
            for seed in 1..=3u64 {
                let pods = workload(profile, n, seed * 1000 + n as u64);
                let cap = ffd_nodes(types, Resources::ZERO, &pods).iter().fold(Resources::ZERO, |a, (_, c)| a + *c);
                let demand = pods.iter().fold(Resources::ZERO, |a, p| a + p.requests);
                let lp = lp_bound_limited(types, demand, [cap.cpu_millis as f64, cap.memory_bytes as f64]);
                let pool = Pool {
                    name: "default".into(),
                    instance_types: types.to_vec(),
                    limits: Limits {
                        cpu_millis: Some(cap.cpu_millis),
                        memory_bytes: Some(cap.memory_bytes),
                        ..Limits::default()
                    },
                    ..Pool::default()
                };
                let mut input = Input { pools: vec![pool], pods, ..Input::default() };
                input.settings.repack = repack;
                let started = std::time::Instant::now();
                let d = solve(&input);
                let hub_ms = started.elapsed();
                slowest = slowest.max(hub_ms);
                input.settings.repack = false;
                let started = std::time::Instant::now();
                let plain = solve(&input);
                let plain_ms = started.elapsed().as_secs_f64() * 1e3;
                let hub_ms = hub_ms.as_secs_f64() * 1e3;
                let (hub, base) = (d.total_price(), plain.total_price());
                let r = hub / lp;
                pending_total += d.unschedulable.len();
                if n >= 1000 {
                    ratios.push(r);
                    worst = worst.max(r);
                }
                println!(
                    "{profile:<8} {n:>6} {seed:>5} {:>9} {:>9.1} {lp:>10.4} {hub:>8.4} {:>8} {base:>10.4} {:>8} {r:>9.4} {hub_ms:>8.1} {plain_ms:>8.1}",
                    cap.cpu_millis / 1000,
                    cap.memory_bytes as f64 / f64::from(1u32 << 30),
                    d.unschedulable.len(),
                    plain.unschedulable.len()
                );
                if json {
                    println!(
                        "{{\"bench\":\"B2-limits\",\"profile\":\"{profile}\",\"pods\":{n},\"seed\":{seed},\"lp\":{lp:.4},\"hub\":{hub:.4},\"hub_pending\":{},\"plain\":{base:.4},\"plain_pending\":{},\"hub_over_lp\":{r:.4}}}",
                        d.unschedulable.len(),
                        plain.unschedulable.len()
                    );
                }
            }
        }
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
    println!(
        "\nlimits, at ≥ 1,000 pods: mean hub/LP {mean:.4}, worst {worst:.4}; pods left pending by the hub {pending_total} \
         (a packing of every pod exists within the limits); slowest solve {:.1} ms",
        slowest.as_secs_f64() * 1e3
    );
}

/// A family of small cases: what it does to the pods and the pool, and what the exact program
/// must add for it.
struct SmallFamily {
    name: &'static str,
    daemonset: bool,
    pod: fn(&mut Pod, usize, usize),
    /// Pods (by index) of which no node may hold two, given the pods.
    apart: fn(&[Pod]) -> Vec<Vec<usize>>,
    /// The pool requires `instance-type Exists, minValues: 3`.
    min_values: bool,
    /// cpu and memory limits as a share (percent) of the FFD packing's capacity.
    limits_percent: Option<i64>,
}

/// Pods grouped by their `app` label (hostname spread of maxSkew 1 from empty nodes, or hostname
/// anti-affinity to themselves: at most one per node).
fn apart_by_app(pods: &[Pod]) -> Vec<Vec<usize>> {
    let mut groups: std::collections::BTreeMap<&str, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        if let Some(app) = p.labels.get("app") {
            groups.entry(app.as_str()).or_default().push(i);
        }
    }
    groups.into_values().filter(|g| g.len() > 1).collect()
}

/// Pods grouped by host port (at most one per port and node).
fn apart_by_port(pods: &[Pod]) -> Vec<Vec<usize>> {
    let mut groups: std::collections::BTreeMap<i32, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        for hp in &p.constraints.host_ports {
            groups.entry(hp.port).or_default().push(i);
        }
    }
    groups.into_values().filter(|g| g.len() > 1).collect()
}

fn small_family_list() -> Vec<SmallFamily> {
    let none: fn(&[Pod]) -> Vec<Vec<usize>> = |_| Vec::new();
    let spread_pod: fn(&mut Pod, usize, usize) = |p, i, n| {
        let app = format!("app-{}", i % (n / 10).max(1));
        app_label(p, &app);
        p.constraints.topology_spread = vec![spread(HOSTNAME, 1, WhenUnsatisfiable::DoNotSchedule, &[("app", &app)])];
    };
    let ports_pod: fn(&mut Pod, usize, usize) = |p, i, _| {
        if i % 4 == 0 {
            p.constraints.host_ports = vec![host_port(9000 + i32::try_from(i / 4 % 5).unwrap_or(0), "TCP")];
        }
    };
    let plain = SmallFamily {
        name: "suite",
        daemonset: false,
        pod: |_, _, _| {},
        apart: none,
        min_values: false,
        limits_percent: None,
    };
    vec![
        SmallFamily { name: "suite", ..plain },
        SmallFamily { name: "suite+ds", daemonset: true, ..plain },
        SmallFamily { name: "limits", limits_percent: Some(100), ..plain },
        SmallFamily { name: "hostname-spread", pod: spread_pod, apart: apart_by_app, ..plain },
        SmallFamily { name: "host-ports", pod: ports_pod, apart: apart_by_port, ..plain },
        SmallFamily { name: "min-values", min_values: true, ..plain },
    ]
}

/// The program's flavors: room = allocatable minus the DaemonSet overhead (flavors it does not fit
/// dropped). Under minValues 3 only flavors with at least two others at least as roomy in every
/// dimension: a node on such a flavor fits two more, and a node on any other one fits fewer than
/// three (exact for nested catalogues such as the built-in one, whose flavors grow in cpu and
/// memory together).
fn exact_types(types: &[InstanceType], overhead: Resources, min_values: bool) -> Vec<exact::Type> {
    let room = |t: &InstanceType| {
        let a = t.allocatable.saturating_sub(overhead);
        [a.cpu_millis, a.memory_bytes, a.pods]
    };
    types
        .iter()
        .filter(|t| overhead.fits(&t.allocatable))
        .filter(|t| {
            !min_values || {
                let r = room(t);
                types.iter().filter(|o| o.name != t.name && (0..3).all(|k| room(o)[k] >= r[k])).count() >= 2
            }
        })
        .map(|t| exact::Type {
            name: t.name.clone(),
            room: room(t),
            capacity: [t.capacity.cpu_millis, t.capacity.memory_bytes],
            price: t.offerings[0].price_hourly,
        })
        .collect()
}

/// Small cases (issue 14 item 5): 12 and 24 pods of the suite's profiles, 3 seeds, in the
/// families the exact program models; the hub and the plain loop against the exact optimum and the
/// LP bound, so that the gap to the bound splits into integrality (bound → optimum: the fractional
/// relaxation, and for the constrained families the constraint's own price too) and solver
/// (optimum → hub).
fn small_cases(json: bool, repack: bool) {
    // Seconds the branch and bound may take per case before its best packing is reported unproven.
    let budget: f64 = std::env::var("B2_EXACT_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let started_all = std::time::Instant::now();
    println!(
        "\nsmall cases: exact optimum (MILP, microlp)\n{:<16} {:<8} {:>5} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8}",
        "family",
        "profile",
        "pods",
        "seed",
        "LP €/h",
        "opt €/h",
        "hub €/h",
        "plain €/h",
        "opt/LP",
        "hub/opt",
        "pl/opt",
        "proven",
        "milp ms"
    );
    let types = flavors();
    let mut summary = Vec::new();
    for f in small_family_list() {
        let (mut int_gap, mut hub_gap, mut plain_gap, mut hub_lp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut proven, mut cases, mut pending, mut plain_pending, mut at_opt, mut slowest) =
            (0usize, 0usize, 0usize, 0usize, 0usize, 0.0f64);
        for &n in &[12usize, 24] {
            for profile in ["cpu", "memory", "mixed"] {
                for seed in 1..=3u64 {
                    let mut pods = workload(profile, n, seed * 1000 + n as u64);
                    for (i, p) in pods.iter_mut().enumerate() {
                        (f.pod)(p, i, n);
                    }
                    let daemonsets = if f.daemonset {
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
                    let mut pool = Pool { name: "default".into(), instance_types: types.clone(), ..Pool::default() };
                    if f.min_values {
                        let mut r = req(INSTANCE_TYPE, Operator::Exists, &[]);
                        r.min_values = Some(3);
                        pool.requirements = vec![r];
                    }
                    let limits = f.limits_percent.map(|pct| {
                        let cap = ffd_nodes(&types, overhead, &pods).iter().fold(Resources::ZERO, |a, (_, c)| a + *c);
                        [cap.cpu_millis * pct / 100, cap.memory_bytes * pct / 100]
                    });
                    let lp = match limits {
                        Some(l) => lp_bound_limited(&types, demand, [l[0] as f64, l[1] as f64]),
                        None => lp_bound(&types, overhead, demand),
                    };
                    if let Some(l) = limits {
                        pool.limits = Limits { cpu_millis: Some(l[0]), memory_bytes: Some(l[1]), ..Limits::default() };
                    }
                    let case = exact::Case {
                        types: exact_types(&types, overhead, f.min_values),
                        pods: pods.iter().map(|p| [p.requests.cpu_millis, p.requests.memory_bytes, 1]).collect(),
                        apart: (f.apart)(&pods),
                        limits,
                    };
                    let mut input = Input { pools: vec![pool], pods, daemonsets, ..Input::default() };
                    input.settings.repack = repack;
                    let d = solve(&input);
                    input.settings.repack = false;
                    let plain = solve(&input);
                    // The hub's packing as the warm start, when it places every pod on flavors the
                    // program knows.
                    let start: Option<exact::Packing> = d
                        .unschedulable
                        .is_empty()
                        .then(|| {
                            d.new_claims
                                .iter()
                                .map(|c| {
                                    let t = c
                                        .instance_types
                                        .first()
                                        .and_then(|o| case.types.iter().position(|t| t.name == o.name));
                                    t.map(|t| (t, c.pods.clone()))
                                })
                                .collect::<Option<Vec<_>>>()
                        })
                        .flatten();
                    let started = std::time::Instant::now();
                    let outcome = exact::optimum(&case, start.as_ref(), budget);
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    slowest = slowest.max(ms);
                    let (opt, is_proven) = match outcome {
                        exact::Outcome::Optimal(p) => (p, true),
                        exact::Outcome::Incumbent(p) => (p, false),
                        exact::Outcome::None => (f64::NAN, false),
                    };
                    let (hub, base) = (d.total_price(), plain.total_price());
                    cases += 1;
                    proven += usize::from(is_proven);
                    pending += d.unschedulable.len();
                    plain_pending += plain.unschedulable.len();
                    if is_proven {
                        int_gap.push(opt / lp);
                        hub_gap.push(hub / opt);
                        hub_lp.push(hub / lp);
                        if plain.unschedulable.is_empty() {
                            plain_gap.push(base / opt);
                        }
                        at_opt += usize::from(hub <= opt + 1e-6);
                    }
                    println!(
                        "{:<16} {profile:<8} {n:>5} {seed:>5} {lp:>8.4} {opt:>8.4} {hub:>8.4} {base:>8.4} {:>8.4} {:>8.4} {:>8.4} {:>7} {ms:>8.0}",
                        f.name,
                        opt / lp,
                        hub / opt,
                        base / opt,
                        if is_proven { "yes" } else { "no" },
                    );
                    if json {
                        println!(
                            "{{\"bench\":\"B2-exact\",\"family\":\"{}\",\"profile\":\"{profile}\",\"pods\":{n},\"seed\":{seed},\"lp\":{lp:.4},\"optimum\":{opt:.4},\"proven\":{is_proven},\"hub\":{hub:.4},\"plain\":{base:.4},\"hub_pending\":{},\"plain_pending\":{},\"milp_ms\":{ms:.0}}}",
                            f.name,
                            d.unschedulable.len(),
                            plain.unschedulable.len()
                        );
                    }
                }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        summary.push((
            f.name,
            mean(&int_gap),
            worst(&int_gap),
            mean(&hub_gap),
            worst(&hub_gap),
            mean(&hub_lp),
            worst(&hub_lp),
            mean(&plain_gap),
            at_opt,
            proven,
            cases,
            pending,
            plain_pending,
            slowest,
        ));
    }
    println!(
        "\n{:<16} {:>14} {:>14} {:>14} {:>10} {:>9} {:>8} {:>8} {:>10}",
        "small cases",
        "opt/LP m, w",
        "hub/opt m, w",
        "hub/LP m, w",
        "plain/opt",
        "hub=opt",
        "proven",
        "pending",
        "slowest ms"
    );
    for (name, im, iw, hm, hw, lm, lw, pm, at, pr, c, pend, ppend, slow) in summary {
        println!(
            "{name:<16} {im:>6.4}, {iw:>6.4} {hm:>6.4}, {hw:>6.4} {lm:>6.4}, {lw:>6.4} {pm:>10.4} {at:>4} of {pr:<2} {pr:>3}/{c:<3} {pend:>3},{ppend:>4} {slow:>10.0}"
        );
    }
    println!("small cases: {:.1} s in all", started_all.elapsed().as_secs_f64());
}
