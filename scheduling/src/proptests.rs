//! Properties of every decision on random inputs: each pod is decided exactly once; every placed pod
//! really fits (claims: every option's allocatable holds the pods; existing nodes: their remaining
//! room); no pool limit is exceeded, `nodes` counted exactly; host ports and hostname
//! anti-affinity hold on every claim; shared limits hold, each claim drawing its largest option.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use crate::model::{DaemonSet, Input, Limits, Operator, Pod, TaintEffect};
use crate::testkit::*;
use crate::{hostports, solve};
use crds::labels::{HOSTNAME, INSTANCE_TYPE, ZONE};

const FLAVORS: [&str; 6] = ["2XS", "XS", "S", "M", "L", "XL"];

#[derive(Debug, Clone)]
struct PodSpec {
    cpu: i64,
    mem_mi: i64,
    kind: u8,
    group: u8,
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (0i64..9000, 0i64..20_000, 0u8..8, 0u8..3).prop_map(|(cpu, mem_mi, kind, group)| PodSpec {
        cpu,
        mem_mi,
        kind,
        group,
    })
}

#[derive(Debug, Clone)]
struct PoolSpec {
    weight: i32,
    flavors: u8,
    nodes: Option<i64>,
    cpu: Option<i64>,
    used_nodes: i64,
    tainted: bool,
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    (0i32..3, 1u8..64, proptest::option::of(0i64..6), proptest::option::of(0i64..60), 0i64..3, any::<bool>()).prop_map(
        |(weight, flavors, nodes, cpu, used_nodes, tainted)| PoolSpec {
            weight: weight * 10,
            flavors,
            nodes,
            cpu: cpu.map(|c| c * 1000),
            used_nodes,
            tainted,
        },
    )
}

fn build(pools: &[PoolSpec], pods: &[PodSpec], nodes: u8, ds: bool, zones: bool) -> Input {
    let pools = pools
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p = pool(&format!("pool-{i}"));
            if zones {
                p.instance_types = flavors_3_zones();
            }
            p.weight = s.weight;
            let allowed: Vec<&str> =
                FLAVORS.iter().enumerate().filter(|(b, _)| s.flavors & (1 << b) != 0).map(|(_, f)| *f).collect();
            p.requirements = vec![req(INSTANCE_TYPE, Operator::In, &allowed)];
            p.limits = Limits { nodes: s.nodes, cpu_millis: s.cpu, ..Limits::default() };
            p.usage.nodes = s.used_nodes;
            p.usage.resources.cpu_millis = s.used_nodes * 4000;
            if s.tainted {
                p.taints = vec![taint("dedicated", Some("x"), TaintEffect::NoSchedule)];
            }
            p
        })
        .collect();
    let pods: Vec<Pod> = pods
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p = pod(&format!("p{i:03}"), s.cpu, s.mem_mi * MI);
            let app = format!("app-{}", s.group);
            p.labels = labels_of(&[("app", &app)]);
            match s.kind {
                1 => p.constraints.pod_anti_affinity = vec![term(HOSTNAME, &[("app", &app)])],
                2 => p.constraints.host_ports = vec![host_port(8080 + i32::from(s.group), "TCP")],
                3 => {
                    p.constraints.topology_spread =
                        vec![spread(ZONE, 1, crate::model::WhenUnsatisfiable::DoNotSchedule, &[("app", &app)])]
                }
                4 => p.constraints.tolerations = vec![toleration("dedicated", Some("x"))],
                5 => p.constraints.pod_affinity = vec![term(HOSTNAME, &[("app", &app)])],
                _ => {}
            }
            p
        })
        .collect();
    let nodes = (0..nodes)
        .map(|i| {
            node_of(&format!("node-{i}"), FLAVORS[usize::from(i) % 6], vec![running(&format!("r{i}"), 1500, GI, &[])])
        })
        .collect();
    let daemonsets = if ds {
        vec![DaemonSet { namespace: "kube-system".into(), name: "agent".into(), pod: pod("agent", 200, 256 * MI) }]
    } else {
        Vec::new()
    };
    Input { pools, pods, nodes, daemonsets, ..Input::default() }
}

fn check(input: &Input) {
    let d = solve(input);
    // Each pod decided exactly once.
    let mut seen = vec![0u8; input.pods.len()];
    for c in &d.new_claims {
        for &p in &c.pods {
            seen[p] += 1;
        }
    }
    for a in &d.existing {
        for &p in &a.pods {
            seen[p] += 1;
        }
    }
    for u in &d.unschedulable {
        seen[u.pod] += 1;
        assert!(!u.reason.is_empty());
    }
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    // Claims: every option holds the pods plus (at least) the minimum DaemonSet overhead.
    for c in &d.new_claims {
        let pool = input.pools.iter().find(|p| p.name == c.nodepool).unwrap();
        let sum = c.pods.iter().fold(crds::quantity::Resources::ZERO, |acc, &p| acc + input.pods[p].requests);
        assert!(
            c.requests.fits(
                &(sum + input.daemonsets.iter().fold(crds::quantity::Resources::ZERO, |a, d| a + d.pod.requests))
            )
        );
        assert!(!c.instance_types.is_empty());
        for o in &c.instance_types {
            let t = pool.instance_types.iter().find(|t| t.name == o.name).unwrap();
            assert!(c.requests.fits(&t.allocatable), "{} does not hold {:?}", o.name, c.requests);
        }
        assert!(c.instance_types.windows(2).all(|w| w[0].price <= w[1].price));
        // Host ports and hostname anti-affinity hold within the claim.
        for (i, &a) in c.pods.iter().enumerate() {
            for &b in &c.pods[i + 1..] {
                let (pa, pb) = (&input.pods[a], &input.pods[b]);
                assert!(hostports::first_clash(&pa.constraints.host_ports, &pb.constraints.host_ports).is_none());
                let anti = |x: &Pod, y: &Pod| !x.constraints.pod_anti_affinity.is_empty() && x.labels == y.labels;
                assert!(!anti(pa, pb) && !anti(pb, pa), "{} and {} share a claim", pa.name, pb.name);
            }
        }
    }
    // Existing nodes: running pods + new pods within allocatable.
    for a in &d.existing {
        let n = &input.nodes[a.node];
        let sum = n
            .pods
            .iter()
            .map(|p| p.requests)
            .chain(a.pods.iter().map(|&p| input.pods[p].requests))
            .fold(crds::quantity::Resources::ZERO, |x, y| x + y);
        assert!(sum.fits(&n.allocatable), "{} overcommitted", n.name);
    }
    // Limits: nodes exact, cpu with the largest option of each claim.
    for p in &input.pools {
        let claims: Vec<_> = d.new_claims.iter().filter(|c| c.nodepool == p.name).collect();
        if let Some(max) = p.limits.nodes {
            assert!(
                p.usage.nodes + i64::try_from(claims.len()).unwrap() <= max.max(p.usage.nodes),
                "{}: node limit",
                p.name
            );
        }
        if let Some(max) = p.limits.cpu_millis {
            let largest: i64 = claims
                .iter()
                .map(|c| {
                    c.instance_types
                        .iter()
                        .map(|o| p.instance_types.iter().find(|t| t.name == o.name).unwrap().capacity.cpu_millis)
                        .max()
                        .unwrap_or(0)
                })
                .sum();
            if !claims.is_empty() {
                assert!(p.usage.resources.cpu_millis + largest <= max, "{}: cpu limit", p.name);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn decisions_are_sound(
        pools in proptest::collection::vec(pool_spec(), 0..4),
        pods in proptest::collection::vec(pod_spec(), 0..60),
        nodes in 0u8..4,
        ds in any::<bool>(),
        zones in any::<bool>(),
    ) {
        check(&build(&pools, &pods, nodes, ds, zones));
    }
}

/// Free pods (and a few with hostname anti-affinity) in one pool with random cpu, memory and node
/// limits and some usage.
fn limited_input(
    pods: &[(i64, i64, bool)],
    cpu: Option<i64>,
    mem_gi: Option<i64>,
    nodes: Option<i64>,
    used: i64,
) -> Input {
    let mut p = pool("default");
    p.limits =
        Limits { cpu_millis: cpu.map(|c| c * 1000), memory_bytes: mem_gi.map(|m| m * GI), nodes, ..Limits::default() };
    p.usage.nodes = used;
    p.usage.resources.cpu_millis = used * 4000;
    p.usage.resources.memory_bytes = used * 4 * GI;
    let pods = pods
        .iter()
        .enumerate()
        .map(|(i, &(cpu, mem_mi, anti))| {
            let mut x = pod(&format!("p{i:03}"), cpu, mem_mi * MI);
            if anti {
                x.labels = labels_of(&[("app", "a")]);
                x.constraints.pod_anti_affinity = vec![term(HOSTNAME, &[("app", "a")])];
            }
            x
        })
        .collect();
    Input { pools: vec![p], pods, ..Input::default() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Under cpu / memory / node limits: no decision goes beyond a limit (each claim charged its
    /// largest option's capacity, nodes counted exactly), and the packing never places fewer pods
    /// than the plain loop.
    #[test]
    fn limits_hold_and_the_packing_places_no_fewer_pods(
        pods in proptest::collection::vec((1i64..6000, 64i64..12_000, proptest::bool::weighted(0.1)), 0..50),
        cpu in proptest::option::of(0i64..80),
        mem_gi in proptest::option::of(0i64..80),
        nodes in proptest::option::of(0i64..8),
        used in 0i64..3,
    ) {
        let input = limited_input(&pods, cpu, mem_gi, nodes, used);
        check(&input);
        let d = solve(&input);
        let p = &input.pools[0];
        let largest = |f: fn(&crds::quantity::Resources) -> i64| -> i64 {
            d.new_claims
                .iter()
                .map(|c| {
                    c.instance_types
                        .iter()
                        .map(|o| f(&p.instance_types.iter().find(|t| t.name == o.name).unwrap().capacity))
                        .max()
                        .unwrap_or(0)
                })
                .sum()
        };
        if let Some(max) = p.limits.cpu_millis {
            prop_assert!(d.new_claims.is_empty() || p.usage.resources.cpu_millis + largest(|r| r.cpu_millis) <= max);
        }
        if let Some(max) = p.limits.memory_bytes {
            prop_assert!(d.new_claims.is_empty() || p.usage.resources.memory_bytes + largest(|r| r.memory_bytes) <= max);
        }
        if let Some(max) = p.limits.nodes {
            prop_assert!(d.new_claims.is_empty() || p.usage.nodes + i64::try_from(d.new_claims.len()).unwrap() <= max);
        }
        let plain = solve(&Input { settings: crate::model::Settings { repack: false, ..Default::default() }, ..input.clone() });
        prop_assert!(
            d.unschedulable.len() <= plain.unschedulable.len(),
            "packing leaves {} pending, the plain loop {}",
            d.unschedulable.len(),
            plain.unschedulable.len()
        );
    }
}

/// One pod of [`constrained_input`]: requests and a kind of constraint, within one of a few apps.
#[derive(Debug, Clone)]
struct Constrained {
    cpu: i64,
    mem_mi: i64,
    kind: u8,
    app: u8,
}

fn constrained_spec() -> impl Strategy<Value = Constrained> {
    (1i64..4000, 64i64..8000, 0u8..8, 0u8..3).prop_map(|(cpu, mem_mi, kind, app)| Constrained {
        cpu,
        mem_mi,
        kind,
        app,
    })
}

/// Pods of every constraint kind the cost repack handles, on the three-zone flavors. Only pods of the
/// same kind share an app label, so each app's pods all carry the constraint that selects them.
fn constrained_input(specs: &[Constrained], min_values: bool, soft: bool, limits: Option<(i64, i64)>) -> Input {
    use crate::model::{WeightedPodAffinityTerm, WhenUnsatisfiable};
    let mut p = pool("default");
    p.instance_types = flavors_3_zones();
    if let Some((cpu, mem_gi)) = limits {
        p.limits = Limits { cpu_millis: Some(cpu * 1000), memory_bytes: Some(mem_gi * GI), ..Limits::default() };
    }
    if min_values {
        let mut r = req(INSTANCE_TYPE, Operator::Exists, &[]);
        r.min_values = Some(3);
        p.requirements = vec![r];
    }
    let when = if soft { WhenUnsatisfiable::ScheduleAnyway } else { WhenUnsatisfiable::DoNotSchedule };
    let pods = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut x = pod(&format!("p{i:03}"), s.cpu, s.mem_mi * MI);
            let app = format!("k{}-a{}", s.kind, s.app);
            x.labels = labels_of(&[("app", &app)]);
            let c = &mut x.constraints;
            match s.kind {
                1 => c.topology_spread = vec![spread(ZONE, 1, when, &[("app", &app)])],
                2 => c.topology_spread = vec![spread(HOSTNAME, 1 + i32::from(s.app), when, &[("app", &app)])],
                3 => c.pod_anti_affinity = vec![term(HOSTNAME, &[("app", &app)])],
                4 => c.pod_affinity = vec![term(ZONE, &[("app", &app)])],
                5 => c.pod_affinity = vec![term(HOSTNAME, &[("app", &app)])],
                6 => c.host_ports = vec![host_port(9000 + i32::from(s.app), "TCP")],
                7 if soft => {
                    c.preferred_pod_anti_affinity =
                        vec![WeightedPodAffinityTerm { weight: 10, term: term(HOSTNAME, &[("app", &app)]) }]
                }
                _ => {}
            }
            x
        })
        .collect();
    Input { pools: vec![p], pods, ..Input::default() }
}

/// Checks every placement of a decision of [`constrained_input`] against its constraints (the hard
/// ones; soft ones only when `soft` is false, where there are none).
fn check_constraints(input: &Input, d: &crate::Decision) {
    check(input);
    let zone_of = |c: &crate::model::NewClaim| -> Option<String> {
        let z: Vec<&String> = c.requirements.iter().filter(|r| r.key == ZONE).flat_map(|r| r.values.iter()).collect();
        (z.len() == 1).then(|| z[0].clone())
    };
    let app = |p: usize| input.pods[p].labels.get("app").cloned().unwrap_or_default();
    let kind = |p: usize| app(p).chars().nth(1).and_then(|k| k.to_digit(10)).unwrap_or(0);
    let hard = |p: usize| {
        !input.pods[p]
            .constraints
            .topology_spread
            .iter()
            .any(|s| s.when_unsatisfiable == crate::model::WhenUnsatisfiable::ScheduleAnyway)
    };
    let mut zones: std::collections::BTreeMap<String, std::collections::BTreeMap<String, i32>> = Default::default();
    let mut claim_of_app: std::collections::BTreeMap<String, std::collections::BTreeSet<usize>> = Default::default();
    // Limits: each claim charged its largest option's capacity.
    let pool = &input.pools[0];
    let largest = |f: fn(&crds::quantity::Resources) -> i64| -> i64 {
        d.new_claims
            .iter()
            .map(|c| {
                c.instance_types
                    .iter()
                    .map(|o| f(&pool.instance_types.iter().find(|t| t.name == o.name).unwrap().capacity))
                    .max()
                    .unwrap_or(0)
            })
            .sum()
    };
    if let Some(max) = pool.limits.cpu_millis {
        assert!(largest(|r| r.cpu_millis) <= max, "cpu limit");
    }
    if let Some(max) = pool.limits.memory_bytes {
        assert!(largest(|r| r.memory_bytes) <= max, "memory limit");
    }
    for (ci, c) in d.new_claims.iter().enumerate() {
        if let Some(m) = input.pools[0].requirements.iter().find_map(|r| r.min_values) {
            assert!(
                c.instance_types.len() >= usize::try_from(m).unwrap(),
                "claim {ci} has {} options",
                c.instance_types.len()
            );
        }
        let mut per_app: std::collections::BTreeMap<String, i32> = Default::default();
        for &p in &c.pods {
            *per_app.entry(app(p)).or_default() += 1;
            claim_of_app.entry(app(p)).or_default().insert(ci);
            if matches!(kind(p), 1 | 4) {
                let z = zone_of(c).unwrap_or_else(|| panic!("claim {ci} of a zone-constrained pod spans zones"));
                *zones.entry(app(p)).or_default().entry(z).or_default() += 1;
            }
        }
        for &p in &c.pods {
            let n = per_app[&app(p)];
            match kind(p) {
                2 if hard(p) => {
                    let skew = input.pods[p].constraints.topology_spread[0].max_skew;
                    assert!(n <= skew, "claim {ci}: {n} pods of {} (maxSkew {skew})", app(p));
                }
                3 | 6 => assert!(n <= 1, "claim {ci}: {n} pods of {} share a node", app(p)),
                _ => {}
            }
        }
    }
    for (a, per_zone) in &zones {
        if a.starts_with("k1") && hard(input.pods.iter().position(|p| p.labels.get("app") == Some(a)).unwrap()) {
            let counts: Vec<i32> = ["a", "b", "c"].iter().map(|z| per_zone.get(*z).copied().unwrap_or(0)).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{a}: zone counts {counts:?}");
        }
        if a.starts_with("k4") {
            assert_eq!(per_zone.len(), 1, "{a}: in zones {per_zone:?}");
        }
    }
    for (a, claims) in &claim_of_app {
        if a.starts_with("k5") {
            assert_eq!(claims.len(), 1, "{a}: on claims {claims:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The cost repack keeps every constraint exact: zone and hostname spread, zone and hostname
    /// (self-)affinity, hostname anti-affinity, host ports, minValues, cpu and memory limits; it
    /// places no fewer pods than the plain loop, and as many never for more.
    #[test]
    fn the_repack_keeps_every_constraint(
        specs in proptest::collection::vec(constrained_spec(), 0..60),
        min_values in any::<bool>(),
        soft in any::<bool>(),
        limits in proptest::option::weighted(0.3, (8i64..120, 8i64..160)),
    ) {
        let input = constrained_input(&specs, min_values, soft, limits);
        let d = solve(&input);
        check_constraints(&input, &d);
        let plain_input = Input { settings: crate::model::Settings { repack: false, ..Default::default() }, ..input.clone() };
        let plain = solve(&plain_input);
        check_constraints(&plain_input, &plain);
        prop_assert!(d.unschedulable.len() <= plain.unschedulable.len());
        if d.unschedulable.len() == plain.unschedulable.len() {
            prop_assert!(d.total_price() <= plain.total_price() + 1e-9, "repack {} > loop {}", d.total_price(), plain.total_price());
        }
    }
}

/// A random shared limit over [`build`]'s pools: what is left per dimension (or unlimited), which
/// pools draw on it (a bit per pool; 0: all), and per flavor an optional draw of its own.
#[derive(Debug, Clone)]
struct SharedSpec {
    cpu: Option<i64>,
    mem_gi: Option<i64>,
    price_micros: Option<i64>,
    pools: u8,
    sizes: Vec<Option<(i64, i64, i64)>>,
}

fn shared_spec() -> impl Strategy<Value = SharedSpec> {
    (
        proptest::option::of(0i64..60_000),
        proptest::option::of(0i64..80),
        proptest::option::of(0i64..700_000),
        0u8..16,
        proptest::collection::vec(proptest::option::weighted(0.2, (0i64..20_000, 0i64..40, 0i64..300_000)), 6),
    )
        .prop_map(|(cpu, mem_gi, price_micros, pools, sizes)| SharedSpec {
            cpu,
            mem_gi,
            price_micros,
            pools,
            sizes,
        })
}

fn shared_of(spec: &SharedSpec, n_pools: usize, k: usize) -> crate::model::SharedLimit {
    let pools = (spec.pools != 0)
        .then(|| (0..n_pools).filter(|i| spec.pools & (1 << i) != 0).map(|i| format!("pool-{i}")).collect());
    let sizes = FLAVORS
        .iter()
        .zip(&spec.sizes)
        .filter_map(|(f, s)| {
            s.map(|(cpu, gb, price)| {
                let draw =
                    crate::model::Draw { cpu_millis: cpu, memory_bytes: gb * 1_000_000_000, price_micros: price };
                ((*f).to_string(), draw)
            })
        })
        .collect();
    crate::model::SharedLimit {
        name: format!("limit {k}"),
        pools,
        remaining: crate::model::Headroom {
            cpu_millis: spec.cpu,
            memory_bytes: spec.mem_gi.map(|g| g * 1_000_000_000),
            price_micros: spec.price_micros,
        },
        sizes,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Under random shared limits (one or two, over all or some pools): per limit and limited
    /// dimension, Σ over the new claims of their largest option's draw stays within what is left;
    /// the decision reports exactly those draws; the repack places no fewer pods than the loop.
    #[test]
    fn shared_limits_hold(
        pools in proptest::collection::vec(pool_spec(), 1..4),
        pods in proptest::collection::vec(pod_spec(), 0..50),
        nodes in 0u8..3,
        ds in any::<bool>(),
        zones in any::<bool>(),
        shared in proptest::collection::vec(shared_spec(), 1..3),
    ) {
        let mut input = build(&pools, &pods, nodes, ds, zones);
        input.shared = shared.iter().enumerate().map(|(k, s)| shared_of(s, pools.len(), k)).collect();
        check(&input);
        let d = solve(&input);
        let drawn = crate::testkit::drawn(&input, &d);
        prop_assert_eq!(&d.shared_drawn, &drawn);
        for (l, got) in input.shared.iter().zip(&drawn) {
            let r = &l.remaining;
            prop_assert!(r.cpu_millis.is_none_or(|m| got.cpu_millis <= m), "{}: cpu {:?} of {:?}", l.name, got, r);
            prop_assert!(r.memory_bytes.is_none_or(|m| got.memory_bytes <= m), "{}: memory {:?} of {:?}", l.name, got, r);
            prop_assert!(r.price_micros.is_none_or(|m| got.price_micros <= m), "{}: price {:?} of {:?}", l.name, got, r);
        }
        let plain = solve(&Input { settings: crate::model::Settings { repack: false, ..Default::default() }, ..input.clone() });
        prop_assert!(
            d.unschedulable.len() <= plain.unschedulable.len(),
            "packing leaves {} pending, the plain loop {}",
            d.unschedulable.len(),
            plain.unschedulable.len()
        );
    }
}
