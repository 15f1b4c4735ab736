//! What the disruption benchmarks share: a seeded PRNG, the shape of a node's pods at a given
//! utilisation, and the median of timings.
#![allow(dead_code)]

use std::time::Duration;

use crds::catalog::InstanceType;

pub use scheduling::testkit::Rng;

/// The requests (cpu millis, memory bytes) of `pods` pods that together use about `utilisation` of
/// flavor `t`'s allocatable cpu and memory, each drawn within ±50 % of its share.
pub fn pod_requests(rng: &mut Rng, t: &InstanceType, pods: usize, utilisation: f64) -> Vec<(i64, i64)> {
    let per_cpu = t.allocatable.cpu_millis as f64 * utilisation / pods as f64;
    let per_mem = t.allocatable.memory_bytes as f64 * utilisation / pods as f64;
    (0..pods)
        .map(|_| {
            let cpu = (per_cpu * rng.float(0.5, 1.5)) as i64 / 10 * 10;
            let mem = (per_mem * rng.float(0.5, 1.5)) as i64 >> 20 << 20;
            (cpu, mem)
        })
        .collect()
}

/// One pool's disruption facts under a budget of `percent` % of its nodes.
pub fn budgeted_pool(name: &str, percent: usize) -> disruption::PoolFacts {
    let spec = crds::nodepool::Disruption {
        budgets: vec![crds::nodepool::Budget {
            nodes: format!("{percent}%"),
            schedule: None,
            duration: None,
            reasons: None,
        }],
        ..crds::nodepool::Disruption::default()
    };
    disruption::PoolFacts::from_spec(name, &spec, true)
}

/// The simulation a command was decided on, run again (the scheduler is deterministic) for where
/// each moved pod went; panics, naming `procedure`, when a moved pod has no place.
pub fn replay(input: &scheduling::Input, procedure: &str) -> scheduling::Decision {
    let decision = scheduling::solve(input);
    assert!(
        decision.unschedulable.is_empty(),
        "{procedure}: a moved pod has no place: {:?}",
        decision.unschedulable.first().map(|u| &u.reason)
    );
    decision
}

/// The median of `xs` (zero when empty).
pub fn median(xs: &[Duration]) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
