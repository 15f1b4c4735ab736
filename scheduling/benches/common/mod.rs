//! Workload generators shared by the benchmarks: a seeded PRNG, the 400 synthetic instance types of
//! performance.md B1, and the pod mixes.
#![allow(dead_code)]

use crds::catalog::{CAPACITY_TYPE_ON_DEMAND, InstanceType, NodeShape, Offering, round4};
use crds::labels;
use scheduling::model::{Pod, PodAffinityTerm, WeightedPodAffinityTerm, WhenUnsatisfiable};
use scheduling::testkit::{MI, labels_of, pod, spread, term};

pub use scheduling::testkit::Rng;

/// 400 synthetic instance types: vCPU 1–192, memory 2, 4 or 8 GiB per vCPU, priced by the Clever
/// formula, offered in zones a, b, c.
pub fn synthetic_400() -> Vec<InstanceType> {
    let cpus: Vec<i64> = (0..134).map(|i| 1 + i * 191 / 133).collect();
    let mut out = Vec::new();
    'outer: for &cpu in &cpus {
        for ratio in [2i64, 4, 8] {
            if out.len() == 400 {
                break 'outer;
            }
            let gb = cpu * ratio;
            let memory_ki = gb * 999_312;
            let capacity = NodeShape::capacity(cpu, memory_ki);
            let overhead = NodeShape::overhead();
            let name = format!("c{cpu}-m{gb}");
            let price = round4(cpu as f64 * 0.002_777_777_77 + gb as f64 * 0.005_555_555_55);
            let mut lbls = std::collections::BTreeMap::new();
            lbls.insert(labels::INSTANCE_TYPE.to_string(), name.clone());
            lbls.insert(labels::ARCH.to_string(), "amd64".to_string());
            lbls.insert(labels::OS.to_string(), "linux".to_string());
            lbls.insert(labels::INSTANCE_CPU.to_string(), cpu.to_string());
            out.push(InstanceType {
                name,
                capacity,
                overhead,
                allocatable: capacity.saturating_sub(overhead).floored_at_zero(),
                labels: lbls,
                offerings: ["a", "b", "c"]
                    .iter()
                    .map(|z| Offering {
                        zone: (*z).to_string(),
                        capacity_type: CAPACITY_TYPE_ON_DEMAND.to_string(),
                        price_hourly: price,
                        available: true,
                    })
                    .collect(),
                synthesized: false,
                extended: Default::default(),
            });
        }
    }
    out
}

/// The six built-in flavors in the three-zone fixture.
pub fn flavors_3_zones() -> Vec<InstanceType> {
    scheduling::testkit::flavors_3_zones()
}

/// Plain pods with varied requests (upstream's shape: a few cpu and memory sizes).
pub fn plain(rng: &mut Rng, i: usize) -> Pod {
    let cpu = *rng.pick(&[100i64, 250, 500, 1000, 1500, 2000]);
    let mem = *rng.pick(&[128i64, 256, 512, 1024, 2048, 4096]);
    let mut p = pod(&format!("p{i:06}"), cpu, mem * MI);
    p.created = i64::try_from(i).unwrap_or(0);
    p
}

/// The mixed set: a fifth each of plain, zone spread, hostname spread, zone pod affinity, hostname
/// pod anti-affinity; `preferred` makes every constraint soft.
pub fn mixed(rng: &mut Rng, i: usize, preferred: bool) -> Pod {
    let mut p = plain(rng, i);
    let group = i / 5 % 10;
    let kind = i % 5;
    let app = format!("k{kind}-g{group}");
    p.labels = labels_of(&[("app", &app)]);
    let when = if preferred { WhenUnsatisfiable::ScheduleAnyway } else { WhenUnsatisfiable::DoNotSchedule };
    let soft = |t: PodAffinityTerm| WeightedPodAffinityTerm { weight: 50, term: t };
    let c = &mut p.constraints;
    match kind {
        1 => c.topology_spread = vec![spread(labels::ZONE, 1, when, &[("app", &app)])],
        2 => c.topology_spread = vec![spread(labels::HOSTNAME, 1, when, &[("app", &app)])],
        3 if preferred => c.preferred_pod_affinity = vec![soft(term(labels::ZONE, &[("app", &app)]))],
        3 => c.pod_affinity = vec![term(labels::ZONE, &[("app", &app)])],
        4 if preferred => c.preferred_pod_anti_affinity = vec![soft(term(labels::HOSTNAME, &[("app", &app)]))],
        4 => c.pod_anti_affinity = vec![term(labels::HOSTNAME, &[("app", &app)])],
        _ => {}
    }
    p
}
