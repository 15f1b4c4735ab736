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

mod bounds;
mod common;
mod exact;

use bounds::{ffd, ffd_nodes, lp_bound, lp_bound_limited, pods_bound};
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
