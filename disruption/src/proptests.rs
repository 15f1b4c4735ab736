//! Property tests over random fleets: whatever the fleet, no decision exceeds a budget (in one pass
//! or over passes run to a fixed point), no decision touches a node that is protected
//! (do-not-disrupt, a PDB, nominated, uninitialized, deleting, queued), and every pod a
//! consolidation moves has room to go.

use std::collections::BTreeMap;

use crds::nodepool::{Budget, Disruption, DisruptionReason};
use jiff::SignedDuration;
use proptest::prelude::*;
use scheduling::model::NewClaim;

use crate::candidates::{Method, allowances};
use crate::facts::{DoNotDisrupt, Drift, NodeFacts, Owner, PdbFacts, PodFacts, PoolFacts, Scope};
use crate::methods::{Command, Outcome, Simulation, Simulator, drift, emptiness};
use crate::testkit::{now, pod};

fn arb_budget() -> impl Strategy<Value = Budget> {
    (
        prop_oneof![(0u32..4).prop_map(|n| n.to_string()), (0u32..=100).prop_map(|p| format!("{p}%"))],
        prop::option::of(prop::sample::select(vec![
            DisruptionReason::Empty,
            DisruptionReason::Drifted,
            DisruptionReason::Underutilized,
        ])),
        // A window that is active at `now` (noon) or not.
        prop::option::of(prop::sample::select(vec![("0 9 * * *", "8h"), ("0 22 * * *", "2h")])),
    )
        .prop_map(|(nodes, reason, window)| Budget {
            nodes,
            schedule: window.map(|w| w.0.to_string()),
            duration: window.map(|w| w.1.to_string()),
            reasons: reason.map(|r| vec![r]),
        })
}

fn arb_pool(i: usize) -> impl Strategy<Value = PoolFacts> {
    (prop::collection::vec(arb_budget(), 0..3), prop::bool::weighted(0.9)).prop_map(move |(budgets, consolidates)| {
        let disruption = Disruption {
            budgets,
            consolidate_after: if consolidates { "0s".into() } else { "Never".into() },
            ..Disruption::default()
        };
        PoolFacts::from_spec(&format!("pool{i}"), &disruption, true)
    })
}

fn arb_pod() -> impl Strategy<Value = PodFacts> {
    (
        prop::sample::select(vec![Owner::Other, Owner::Other, Owner::DaemonSet, Owner::StatefulSet, Owner::Node]),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::sample::select(vec![None, None, None, Some("true"), Some("banana"), Some("30m"), Some("false")]),
        prop::collection::vec((0i32..2, any::<bool>()), 0..3),
        prop::sample::select(vec![0, 0, i32::MIN, 1000]),
        0i64..60,
    )
        .prop_map(|(owner, terminal, terminating, dnd, pdbs, deletion_cost, age)| PodFacts {
            owner,
            terminal,
            terminating,
            do_not_disrupt: dnd.map(str::to_string),
            started: Some(now() - SignedDuration::from_mins(age)),
            pdbs: pdbs
                .into_iter()
                .enumerate()
                .map(|(i, (allowed, always))| PdbFacts {
                    name: format!("default/pdb{i}"),
                    disruptions_allowed: allowed,
                    always_allow_unhealthy: always,
                    fully_blocking: false,
                })
                .collect(),
            deletion_cost,
            ..pod("p")
        })
}

fn arb_node(pools: usize) -> impl Strategy<Value = NodeFacts> {
    (
        0..pools,
        prop::collection::vec(any::<bool>(), 10),
        prop::option::of(0i64..100),
        prop::collection::vec(arb_pod(), 0..4),
        1u32..100,
    )
        .prop_map(|(pool, flags, drifted_ago, pods, price)| {
            let mut n = NodeFacts::new("n", &format!("pool{pool}"), now() - SignedDuration::from_hours(5));
            // Mostly healthy nodes, with each protection showing up now and then.
            let rare = |i: usize| flags[i] && flags[(i + 1) % 10] && flags[(i + 2) % 10];
            n.initialized = !rare(0);
            n.node_ready = !rare(1);
            n.marked_for_deletion = rare(2);
            n.nominated = rare(3);
            n.queued = rare(4);
            n.do_not_disrupt = rare(5);
            n.consolidatable = !rare(6);
            n.instance_terminating = rare(7);
            n.termination_grace_period = flags[8].then_some(600);
            n.drifted = drifted_ago
                .map(|m| Drift { reason: "NodePoolDrifted".into(), since: now() - SignedDuration::from_mins(m) });
            n.price = f64::from(price) / 100.0;
            n.pods = pods;
            n
        })
}

fn arb_scope() -> impl Strategy<Value = Scope> {
    (1usize..4).prop_flat_map(|pools| {
        ((0..pools).map(arb_pool).collect::<Vec<_>>(), prop::collection::vec(arb_node(pools), 0..30)).prop_map(
            |(pools, mut nodes)| {
                for (i, n) in nodes.iter_mut().enumerate() {
                    n.claim = format!("n{i}");
                    n.node = Some(n.claim.clone());
                    for (j, p) in n.pods.iter_mut().enumerate() {
                        p.name = format!("default/n{i}-p{j}");
                    }
                }
                Scope { pools, nodes }
            },
        )
    })
}

/// Simulates with a fixed verdict per node: the pods of every third node fit nowhere.
struct Coin;

impl Simulator for Coin {
    fn simulate(&mut self, nodes: &[usize]) -> Simulation {
        if nodes.iter().any(|n| n % 3 == 1) {
            Simulation::Unplaceable(vec!["default/x: no room".into()])
        } else {
            Simulation::Placed { new_claims: Vec::<NewClaim>::new() }
        }
    }
}

/// A node the pod checks protect: an active pod with do-not-disrupt, or an evictable one a PDB blocks.
fn pods_protect(n: &NodeFacts) -> bool {
    n.pods.iter().any(|p| {
        let dnd = p.active() && p.do_not_disrupt_at(now()) == DoNotDisrupt::Yes;
        let pdb = p.evictable()
            && (p.pdbs.len() > 1
                || p.pdbs.iter().any(|b| b.disruptions_allowed <= 0 && (p.ready || !b.always_allow_unhealthy)));
        dnd || pdb
    })
}

fn check_command(scope: &Scope, command: &Command) -> Result<(), TestCaseError> {
    let allowed = allowances(scope, command.reason, now());
    let mut per_pool: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &command.candidates {
        let n = &scope.nodes[c.index];
        *per_pool.entry(c.nodepool.as_str()).or_default() += 1;
        prop_assert!(!n.do_not_disrupt, "{} has do-not-disrupt", n.claim);
        prop_assert!(n.initialized && !n.nominated && !n.queued && !n.marked_for_deletion && !n.instance_terminating);
        let pod_checks_skipped = command.method == Method::Drift && n.termination_grace_period.is_some();
        prop_assert!(pod_checks_skipped || !pods_protect(n), "{} is protected by its pods: {:?}", n.claim, n.pods);
        match command.method {
            Method::Emptiness => prop_assert!(n.is_empty() && n.consolidatable),
            Method::Drift => prop_assert!(n.drifted.is_some()),
            _ => {}
        }
    }
    for (pool, count) in per_pool {
        let budget = allowed.get(pool).copied().unwrap_or(0);
        prop_assert!(count <= budget, "{count} nodes of {pool} for {:?}, budget {budget}", command.reason);
    }
    Ok(())
}

/// Applies a command as the queue would: candidates marked for deletion with the reason.
fn apply(scope: &mut Scope, command: &Command) {
    for c in &command.candidates {
        let n = &mut scope.nodes[c.index];
        n.marked_for_deletion = true;
        n.disruption_reason = Some(command.reason);
    }
}

fn run(scope: &mut Scope, method: Method) -> Outcome {
    match method {
        Method::Drift => drift(scope, now(), &mut Coin),
        _ => emptiness(scope, now()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_decision_breaks_a_budget_or_a_protection(scope in arb_scope()) {
        for method in [Method::Emptiness, Method::Drift] {
            if let Some(command) = run(&mut scope.clone(), method).command {
                check_command(&scope, &command)?;
            }
        }
    }

    #[test]
    fn budgets_hold_over_passes_to_a_fixed_point(mut scope in arb_scope()) {
        let reasons = [DisruptionReason::Empty, DisruptionReason::Drifted];
        let initial: BTreeMap<DisruptionReason, BTreeMap<String, usize>> =
            reasons.iter().map(|r| (*r, allowances(&scope, *r, now()))).collect();
        let mut taken: BTreeMap<(DisruptionReason, String), usize> = BTreeMap::new();
        for _pass in 0..60 {
            let mut started = false;
            for method in [Method::Emptiness, Method::Drift] {
                if let Some(command) = run(&mut scope, method).command {
                    check_command(&scope, &command)?;
                    // A NotReady node is already charged to the budgets: taking it costs nothing more.
                    for c in command.candidates.iter().filter(|c| scope.nodes[c.index].node_ready) {
                        *taken.entry((command.reason, c.nodepool.clone())).or_default() += 1;
                    }
                    apply(&mut scope, &command);
                    started = true;
                    break;
                }
            }
            if !started {
                break;
            }
        }
        for ((reason, pool), count) in taken {
            let budget = initial[&reason].get(&pool).copied().unwrap_or(0);
            prop_assert!(count <= budget, "{count} nodes of {pool} for {reason:?} over all passes, budget {budget}");
        }
    }
}

/// A small fleet of pool `default` on the built-in flavors, with the scheduler's view of it: each
/// node `(flavor, pods as (millicores, MiB), protection flags)`.
fn arb_consolidation_fleet() -> impl Strategy<Value = (Scope, crate::simulation::ScopeModel)> {
    let node = (
        0usize..6,
        prop::collection::vec((100i64..2500, 100i64..2048), 0..4),
        prop::collection::vec(prop::bool::weighted(0.1), 4),
    );
    (prop::collection::vec(node, 1..8), arb_budget()).prop_map(|(nodes, budget)| {
        use scheduling::testkit::{MI, flavors, node_of, pod as sched_pod, pool as sched_pool, running};
        let types = flavors();
        let mut scope = Scope {
            pools: vec![PoolFacts::from_spec(
                "default",
                &Disruption { budgets: vec![budget], ..Disruption::default() },
                true,
            )],
            nodes: Vec::new(),
        };
        let mut model = crate::simulation::ScopeModel::default();
        model.input.pools = vec![sched_pool("default")];
        for (i, (flavor, pods, flags)) in nodes.into_iter().enumerate() {
            let t = &types[flavor];
            let name = format!("n{i}");
            let mut facts = crate::testkit::node(&name, t.price().unwrap_or(0.0));
            facts.instance_type = Some(t.name.clone());
            facts.do_not_disrupt = flags[0];
            facts.nominated = flags[1];
            let (mut cpu, mut mem) = (0, 0);
            let mut running_pods = Vec::new();
            let mut movable = Vec::new();
            for (j, (millis, mib)) in pods.into_iter().enumerate() {
                // Only pods that fit: a node never runs more than it has.
                if cpu + millis > t.allocatable.cpu_millis || mem + mib * MI > t.allocatable.memory_bytes {
                    continue;
                }
                cpu += millis;
                mem += mib * MI;
                let pod_name = format!("{name}-{j}");
                let mut p = pod(&pod_name);
                if flags[2] && j == 0 {
                    p.do_not_disrupt = Some("true".into());
                }
                if flags[3] && j == 0 {
                    p.pdbs = vec![PdbFacts {
                        name: "default/pdb".into(),
                        disruptions_allowed: 0,
                        always_allow_unhealthy: false,
                        fully_blocking: false,
                    }];
                }
                facts.pods.push(p);
                running_pods.push(running(&pod_name, millis, mib * MI, &[]));
                movable.push(sched_pod(&pod_name, millis, mib * MI));
            }
            let mut existing = node_of(&name, &t.name, running_pods);
            existing.managed = true;
            existing.nodepool = Some("default".into());
            model.input.nodes.push(existing);
            model.node_index.push(Some(i));
            model.movable.push(movable);
            scope.nodes.push(facts);
        }
        (scope, model)
    })
}

/// Independent of the scheduler: the moved pods' requests fit in what the remaining nodes have free
/// plus the replacement's cheapest option.
fn moved_pods_fit(model: &crate::simulation::ScopeModel, command: &Command) -> Result<(), TestCaseError> {
    let gone: Vec<usize> = command.candidates.iter().filter_map(|c| model.node_index[c.index]).collect();
    let (mut need_cpu, mut need_mem) = (0i64, 0i64);
    for c in &command.candidates {
        for p in &model.movable[c.index] {
            need_cpu += p.requests.cpu_millis;
            need_mem += p.requests.memory_bytes;
        }
    }
    let (mut free_cpu, mut free_mem) = (0i64, 0i64);
    for (_, n) in model.input.nodes.iter().enumerate().filter(|(j, _)| !gone.contains(j)) {
        let used_cpu: i64 = n.pods.iter().map(|p| p.requests.cpu_millis).sum();
        let used_mem: i64 = n.pods.iter().map(|p| p.requests.memory_bytes).sum();
        free_cpu += n.allocatable.cpu_millis - used_cpu;
        free_mem += n.allocatable.memory_bytes - used_mem;
    }
    for r in &command.replacements {
        let cheapest = r.instance_types.first().map(|o| o.name.clone()).unwrap_or_default();
        let t = scheduling::testkit::flavors().into_iter().find(|t| t.name == cheapest);
        prop_assert!(t.is_some(), "replacement {cheapest} unknown");
        if let Some(t) = t {
            free_cpu += t.allocatable.cpu_millis;
            free_mem += t.allocatable.memory_bytes;
        }
    }
    prop_assert!(
        need_cpu <= free_cpu && need_mem <= free_mem,
        "moved pods need {need_cpu}m/{need_mem}B, {free_cpu}m/{free_mem}B free"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn consolidation_keeps_budgets_protections_and_finds_every_moved_pod_a_place(
        (scope, model) in arb_consolidation_fleet()
    ) {
        let settings = crate::consolidation::Settings::default();
        for method in [Method::SingleNodeConsolidation, Method::MultiNodeConsolidation] {
            let out = match method {
                Method::SingleNodeConsolidation =>
                    crate::consolidation::single_node(&scope, now(), &mut model.for_consolidation(), settings),
                _ => crate::consolidation::multi_node(&scope, now(), &mut model.for_consolidation(), settings),
            };
            if let Some(command) = out.command {
                check_command(&scope, &command)?;
                moved_pods_fit(&model, &command)?;
                prop_assert!(command.replacements.len() <= 1);
                let price: f64 = command.candidates.iter().map(|c| scope.nodes[c.index].price).sum();
                for r in &command.replacements {
                    prop_assert!(r.price < price * (1.0 - settings.min_replace_savings), "{} not 10 % below {price}", r.price);
                }
            }
        }
    }
}
