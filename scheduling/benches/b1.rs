//! B1 — scheduling throughput (performance.md): wall time per solve, pods/s and NodeClaims for 1 to
//! 20,000 pods, plain / mixed / mixed-preferred workloads, over the 6 Clever flavors and 400 synthetic
//! instance types. Single thread.
//!
//! `cargo bench -p scheduling --bench b1` prints a table; `B1_JSON=1` adds one JSON object per case;
//! `B1_QUICK=1` stops at 5,000 pods; `B1_CASE=<types>/<mix>/<pods>` runs one case once (for callgrind).

mod common;

use std::time::{Duration, Instant};

use common::{Rng, mixed, plain, synthetic_400};
use scheduling::model::{Input, Pod, Pool};
use scheduling::solve;

fn input(types: &str, mix: &str, n: usize) -> Input {
    let mut rng = Rng::new(42);
    let instance_types = match types {
        "6" if mix == "plain" => scheduling::testkit::flavors(),
        "6" => common::flavors_3_zones(),
        _ => synthetic_400(),
    };
    let pods: Vec<Pod> = (0..n)
        .map(|i| match mix {
            "plain" => plain(&mut rng, i),
            "mixed" => mixed(&mut rng, i, false),
            _ => mixed(&mut rng, i, true),
        })
        .collect();
    let pool = Pool { name: "default".into(), instance_types, ..Pool::default() };
    Input { pools: vec![pool], pods, ..Input::default() }
}

fn main() {
    let json = std::env::var_os("B1_JSON").is_some();
    let quick = std::env::var_os("B1_QUICK").is_some();
    if let Ok(case) = std::env::var("B1_CASE") {
        let parts: Vec<&str> = case.split('/').collect();
        let (types, mix, n) = (parts[0], parts[1], parts[2].parse().unwrap_or(1000));
        let input = input(types, mix, n);
        let d = solve(&input);
        println!("{case}: {} claims, {} unschedulable", d.new_claims.len(), d.unschedulable.len());
        return;
    }
    let sizes: &[usize] = if quick { &[1, 100, 1000, 5000] } else { &[1, 100, 1000, 5000, 20000] };
    println!(
        "{:<6} {:<16} {:>7} {:>12} {:>12} {:>8} {:>8} {:>10}",
        "types", "mix", "pods", "median ms", "pods/s", "claims", "pending", "µs/claim"
    );
    for types in ["6", "400"] {
        for mix in ["plain", "mixed", "mixed-preferred"] {
            for &n in sizes {
                let input = input(types, mix, n);
                // Repeat until ~1 s or 11 runs, whichever first (at least 3), and take the median.
                let mut times: Vec<Duration> = Vec::new();
                let mut last = None;
                let started = Instant::now();
                while times.len() < 11 && (times.len() < 3 || started.elapsed() < Duration::from_secs(1)) {
                    let t = Instant::now();
                    let d = solve(&input);
                    times.push(t.elapsed());
                    last = Some(d);
                }
                times.sort();
                let median = times[times.len() / 2];
                let d = last.unwrap_or_default();
                let secs = median.as_secs_f64();
                let rate = n as f64 / secs;
                let per_claim = if d.new_claims.is_empty() { 0.0 } else { secs * 1e6 / d.new_claims.len() as f64 };
                println!(
                    "{types:<6} {mix:<16} {n:>7} {:>12.3} {:>12.0} {:>8} {:>8} {:>10.1}",
                    secs * 1e3,
                    rate,
                    d.new_claims.len(),
                    d.unschedulable.len(),
                    per_claim
                );
                if json {
                    println!(
                        "{{\"bench\":\"B1\",\"types\":{types},\"mix\":\"{mix}\",\"pods\":{n},\"median_ms\":{:.3},\"pods_per_s\":{rate:.0},\"claims\":{},\"unschedulable\":{},\"runs\":{}}}",
                        secs * 1e3,
                        d.new_claims.len(),
                        d.unschedulable.len(),
                        times.len()
                    );
                }
            }
        }
    }
}
