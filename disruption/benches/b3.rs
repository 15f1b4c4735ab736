//! B3 — consolidation (performance.md): 1,000 nodes of the six built-in flavors carrying 10,000 pods
//! at ~40 % utilisation (seeded). Measures (a) the time to one consolidation decision, (b) the fleet
//! price once consolidation has run to a fixed point (each command applied: candidates removed,
//! replacements added, moved pods placed where the simulation put them) against the LP bound of the
//! remaining pods, (c) the same for Karpenter's procedure (θ = 0, and its scheduler without the hub's
//! cost repack, so replacements are what upstream would launch; the hub at θ = 0 between the two
//! separates the effects), and (d) checks at every step that
//! no command breaks a budget, a PDB or a do-not-disrupt (the bench panics if one does).
//!
//! Two fleets: the uniform one above, and one that starts on the wrong flavors (80 % `XL`, ~15 %
//! used), where replacements matter.
//!
//! `cargo bench -p disruption --bench b3`; `B3_JSON=1` adds one JSON object per procedure;
//! `B3_NODES=200` runs smaller fleets (10 pods per node either way); `B3_SEED=7` other fleets.

mod common;

use common::{Rng, median};

use std::time::{Duration, Instant};

use crds::catalog::InstanceType;
use crds::quantity::Resources;
use disruption::{
    Command, Method, NodeFacts, PdbFacts, PodFacts, Scope, ScopeModel, Settings, multi_node, single_node,
};
use jiff::Timestamp;
use scheduling::model::{Pod, RunningPod, Toleration, TolerationOperator};
use scheduling::testkit::{flavors, node_of, pod, pool, running};

/// Pods per node at the start.
const PODS_PER_NODE: usize = 10;
/// Target utilisation of each node at the start (cpu and memory), uniform fleet.
const UTILISATION: f64 = 0.4;
/// The wrong-flavor fleet: this share of the nodes are `XL`, the rest drawn uniformly...
const WRONG_XL_SHARE: u64 = 80;
/// ...each node at this utilisation: a fleet launched for a peak that has passed, where only
/// replacements (not deletes into other nodes' room) reach a good price.
const WRONG_UTILISATION: f64 = 0.15;

/// Which fleet a run starts from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    /// Flavors drawn uniformly, ~40 % used.
    Uniform,
    /// Mostly `XL` at ~15 % use, no do-not-disrupt and no PDB.
    WrongFlavors,
}

impl Family {
    fn utilisation(self) -> f64 {
        match self {
            Family::Uniform => UTILISATION,
            Family::WrongFlavors => WRONG_UTILISATION,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Family::Uniform => "uniform",
            Family::WrongFlavors => "wrong flavors",
        }
    }
}
/// The pool's budget: the API default, 10 % of the nodes.
const BUDGET_PERCENT: usize = 10;
/// A run stops after this many commands even if not at a fixed point (none got near it so far).
const MAX_STEPS: usize = 400;

fn now() -> Timestamp {
    Timestamp::from_second(1_795_608_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// One pod of the fleet: its scheduling shape and its disruption facts.
#[derive(Clone)]
struct FleetPod {
    sched: Pod,
    facts: PodFacts,
}

/// One node of the fleet.
#[derive(Clone)]
struct FleetNode {
    name: String,
    flavor: String,
    price: f64,
    do_not_disrupt: bool,
    pods: Vec<FleetPod>,
}

struct Fleet {
    nodes: Vec<FleetNode>,
    next_node: usize,
}

fn flavor(name: &str) -> InstanceType {
    flavors().into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no built-in flavor {name}"))
}

/// The seeded fleet: flavors drawn uniformly; each node's pods sum to about 40 % of its allocatable
/// cpu and memory; 2 % of nodes do-not-disrupt; 2 % of pods do-not-disrupt, 2 % under a PDB that
/// allows no disruption.
fn fleet(nodes: usize, seed: u64, family: Family) -> Fleet {
    let types = flavors();
    let xl = types.iter().position(|t| t.name == "XL").unwrap_or_else(|| panic!("no built-in flavor XL"));
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut k = 0;
    for i in 0..nodes {
        let pick = match family {
            Family::WrongFlavors if rng.below(100) < WRONG_XL_SHARE => xl,
            _ => rng.below(types.len() as u64) as usize,
        };
        let t = &types[pick];
        let price = t.price().unwrap_or_else(|| panic!("flavor {} has no price", t.name));
        let per_cpu = t.allocatable.cpu_millis as f64 * family.utilisation() / PODS_PER_NODE as f64;
        let per_mem = t.allocatable.memory_bytes as f64 * family.utilisation() / PODS_PER_NODE as f64;
        let pods = (0..PODS_PER_NODE)
            .map(|_| {
                k += 1;
                let name = format!("p{k:05}");
                let cpu = (per_cpu * rng.float(0.5, 1.5)) as i64 / 10 * 10;
                let mem = (per_mem * rng.float(0.5, 1.5)) as i64 >> 20 << 20;
                let mut facts = PodFacts { name: format!("default/{name}"), ready: true, ..PodFacts::default() };
                // The wrong-flavor fleet measures what replacements reach: no protection pins a
                // node there (a pinned XL at 15 % would be the whole gap to the LP bound).
                let draw = rng.below(50);
                match if family == Family::WrongFlavors { 50 } else { draw } {
                    0 => facts.do_not_disrupt = Some("true".into()),
                    1 => {
                        facts.pdbs = vec![PdbFacts {
                            name: format!("default/pdb-{name}"),
                            disruptions_allowed: 0,
                            always_allow_unhealthy: false,
                            fully_blocking: false,
                        }]
                    }
                    _ => {}
                }
                FleetPod { sched: pod(&name, cpu, mem), facts }
            })
            .collect();
        out.push(FleetNode {
            name: format!("n{i:04}"),
            flavor: t.name.clone(),
            price,
            do_not_disrupt: rng.below(50) == 0 && family == Family::Uniform,
            pods,
        });
    }
    Fleet { next_node: nodes, nodes: out }
}

impl Fleet {
    fn price(&self) -> f64 {
        self.nodes.iter().map(|n| n.price).sum()
    }

    /// Σ requests / Σ allocatable, for cpu and memory.
    fn utilisation(&self) -> (f64, f64) {
        let (mut used, mut alloc) = (Resources::ZERO, Resources::ZERO);
        for n in &self.nodes {
            alloc += flavor(&n.flavor).allocatable;
            used = n.pods.iter().fold(used, |acc, p| acc + p.sched.requests);
        }
        (used.cpu_millis as f64 / alloc.cpu_millis as f64, used.memory_bytes as f64 / alloc.memory_bytes as f64)
    }

    fn pods(&self) -> usize {
        self.nodes.iter().map(|n| n.pods.len()).sum()
    }

    /// The disruption facts and the scheduling model of the fleet, node `i` at index `i` of both.
    fn model(&self, repack: bool) -> (Scope, ScopeModel) {
        let mut scope = Scope { pools: vec![common::budgeted_pool("default", BUDGET_PERCENT)], nodes: Vec::new() };
        let mut model = ScopeModel::default();
        model.input.pools = vec![pool("default")];
        model.input.settings.repack = repack;
        for (i, n) in self.nodes.iter().enumerate() {
            let mut f = NodeFacts::new(&n.name, "default", now() - jiff::SignedDuration::from_hours(24));
            f.price = n.price;
            f.instance_type = Some(n.flavor.clone());
            f.zone = Some(crds::catalog::DEFAULT_ZONE.to_string());
            f.capacity_type = Some("on-demand".into());
            f.do_not_disrupt = n.do_not_disrupt;
            f.pods = n.pods.iter().map(|p| p.facts.clone()).collect();
            scope.nodes.push(f);
            let pods: Vec<RunningPod> = n
                .pods
                .iter()
                .map(|p| running(&p.sched.name, p.sched.requests.cpu_millis, p.sched.requests.memory_bytes, &[]))
                .collect();
            let mut existing = node_of(&n.name, &n.flavor, pods);
            existing.managed = true;
            existing.nodepool = Some("default".into());
            model.input.nodes.push(existing);
            model.node_index.push(Some(i));
            model.movable.push(n.pods.iter().map(|p| p.sched.clone()).collect());
        }
        (scope, model)
    }

    /// Checks the command against the rules (panics loudly on a breach), then applies it: the
    /// candidates go, the replacements come, and each moved pod lands where the simulation put it.
    fn apply(&mut self, command: &Command, model: &ScopeModel, procedure: &str) {
        let idx: Vec<usize> = command.candidates.iter().map(|c| c.index).collect();
        // (d) Budgets: the pool allows 10 % of its nodes at once, rounded up; nothing is leaving
        // between commands (replacements are instant), so one command may take at most that.
        let allowed = (self.nodes.len() * BUDGET_PERCENT).div_ceil(100);
        assert!(
            idx.len() <= allowed,
            "{procedure}: BUDGET BROKEN: {} candidates, the budget allows {allowed}: {command}",
            idx.len()
        );
        for &i in &idx {
            let n = &self.nodes[i];
            assert!(!n.do_not_disrupt, "{procedure}: DO-NOT-DISRUPT BROKEN: node {} is a candidate", n.name);
            for p in &n.pods {
                assert!(
                    p.facts.do_not_disrupt.as_deref() != Some("true"),
                    "{procedure}: DO-NOT-DISRUPT BROKEN: pod {} on candidate {}",
                    p.facts.name,
                    n.name
                );
                assert!(
                    p.facts.pdbs.iter().all(|b| b.disruptions_allowed > 0),
                    "{procedure}: PDB BROKEN: pod {} on candidate {} under a PDB allowing 0",
                    p.facts.name,
                    n.name
                );
            }
        }
        assert!(command.savings_per_hour > 0.0, "{procedure}: a consolidation that saves nothing: {command}");
        // The simulation the method ran, again (the scheduler is deterministic), for where each pod went.
        let mut input = model.input.clone();
        let tolerate = Toleration {
            key: disruption::simulation::NO_DESTINATION_TAINT.to_string(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect: None,
        };
        let moved: Vec<FleetPod> = idx.iter().flat_map(|&i| self.nodes[i].pods.iter().cloned()).collect();
        input.pods = moved
            .iter()
            .map(|p| {
                let mut s = p.sched.clone();
                s.constraints.tolerations.push(tolerate.clone());
                s
            })
            .collect();
        let kept: Vec<usize> = (0..self.nodes.len()).filter(|i| !idx.contains(i)).collect();
        input.nodes = kept.iter().map(|&i| model.input.nodes[i].clone()).collect();
        let decision = common::replay(&input, procedure);
        assert_eq!(
            decision.new_claims.len(),
            command.replacements.len(),
            "{procedure}: the re-run simulation disagrees with the command {command}"
        );
        let mut nodes: Vec<FleetNode> = kept.iter().map(|&i| self.nodes[i].clone()).collect();
        for a in &decision.existing {
            nodes[a.node].pods.extend(a.pods.iter().map(|&p| moved[p].clone()));
        }
        for (claim, replacement) in decision.new_claims.iter().zip(&command.replacements) {
            let option = replacement
                .instance_types
                .first()
                .unwrap_or_else(|| panic!("{procedure}: a replacement without options: {command}"));
            let t = flavor(&option.name);
            let fits = claim.pods.iter().fold(Resources::ZERO, |acc, &p| acc + moved[p].sched.requests);
            assert!(fits.fits(&t.allocatable), "{procedure}: the replacement {} cannot hold its pods", t.name);
            nodes.push(FleetNode {
                name: format!("n{:04}", self.next_node),
                flavor: t.name.clone(),
                price: option.price,
                do_not_disrupt: false,
                pods: claim.pods.iter().map(|&p| moved[p].clone()).collect(),
            });
            self.next_node += 1;
        }
        self.nodes = nodes;
    }
}

/// One procedure run to its fixed point.
struct Run {
    name: &'static str,
    decisions: Vec<Duration>,
    commands: usize,
    deleted: usize,
    launched: usize,
    by_method: [usize; 2],
    start_price: f64,
    end_price: f64,
    end_nodes: usize,
    lp: f64,
    utilisation_before: (f64, f64),
    utilisation_after: (f64, f64),
    first_model: Duration,
    fixed_point: bool,
    wall: Duration,
}

fn run(name: &'static str, nodes: usize, seed: u64, family: Family, settings: Settings, repack: bool) -> Run {
    let started = Instant::now();
    let mut f = fleet(nodes, seed, family);
    let pods_before = f.pods();
    let start_price = f.price();
    let mut r = Run {
        name,
        decisions: Vec::new(),
        commands: 0,
        deleted: 0,
        launched: 0,
        by_method: [0, 0],
        start_price,
        end_price: start_price,
        end_nodes: nodes,
        lp: 0.0,
        utilisation_before: f.utilisation(),
        utilisation_after: (0.0, 0.0),
        first_model: Duration::ZERO,
        fixed_point: false,
        wall: Duration::ZERO,
    };
    for _ in 0..MAX_STEPS {
        let t = Instant::now();
        let (scope, model) = f.model(repack);
        if r.decisions.is_empty() {
            r.first_model = t.elapsed();
        }
        // One decision = one pass of the loop's consolidation methods: multi-node, then single-node
        // if multi-node found nothing.
        let t = Instant::now();
        let mut command = multi_node(&scope, now(), &mut model.for_consolidation(), settings).command;
        if command.is_none() {
            command = single_node(&scope, now(), &mut model.for_consolidation(), settings).command;
        }
        r.decisions.push(t.elapsed());
        let Some(command) = command else {
            r.fixed_point = true;
            break;
        };
        r.commands += 1;
        r.deleted += command.candidates.len();
        r.launched += command.replacements.len();
        r.by_method[usize::from(command.method == Method::SingleNodeConsolidation)] += 1;
        f.apply(&command, &model, name);
        assert_eq!(f.pods(), pods_before, "{name}: pods lost or duplicated by {command}");
    }
    r.end_price = f.price();
    r.end_nodes = f.nodes.len();
    r.utilisation_after = f.utilisation();
    let demand = f.nodes.iter().flat_map(|n| &n.pods).fold(Resources::ZERO, |acc, p| acc + p.sched.requests);
    r.lp = lp_bound(&flavors(), demand);
    r.wall = started.elapsed();
    r
}

/// Cheapest fractional mix of flavors covering the total cpu, memory and pod slots: the minimum over
/// the vertices of the dual (3 variables, one plane per flavor plus y ≥ 0), as in B2.
fn lp_bound(types: &[InstanceType], demand: Resources) -> f64 {
    let (c, g) = (1e-3, 1.0 / f64::from(1u32 << 30));
    let mut rows: Vec<([f64; 3], f64)> = types
        .iter()
        .map(|t| {
            let a = t.allocatable;
            ([a.cpu_millis as f64 * c, a.memory_bytes as f64 * g, a.pods as f64], t.price().unwrap_or(f64::MAX))
        })
        .collect();
    for k in 0..3 {
        let mut v = [0.0; 3];
        v[k] = -1.0;
        rows.push((v, 0.0));
    }
    let d = [demand.cpu_millis as f64 * c, demand.memory_bytes as f64 * g, demand.pods as f64];
    let det3 = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let n = rows.len();
    let mut best = 0.0f64;
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
                for col in 0..3 {
                    let mut mc = m;
                    for row in 0..3 {
                        mc[row][col] = r[row];
                    }
                    y[col] = det3(mc) / det;
                }
                let feasible = rows.iter().all(|(a, p)| a[0] * y[0] + a[1] * y[1] + a[2] * y[2] <= p + 1e-9);
                let v = d[0] * y[0] + d[1] * y[1] + d[2] * y[2];
                if feasible && v > best {
                    best = v;
                }
            }
        }
    }
    best
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let nodes: usize = std::env::var("B3_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let seed: u64 = std::env::var("B3_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let json = std::env::var("B3_JSON").is_ok_and(|v| v == "1");
    let started = Instant::now();
    let procedures = [
        ("hub (θ = 0.10, repack)", Settings::default(), true),
        ("hub, θ = 0", Settings { min_replace_savings: 0.0 }, true),
        ("karpenter (θ = 0, no repack)", Settings { min_replace_savings: 0.0 }, false),
    ];
    for family in [Family::Uniform, Family::WrongFlavors] {
        println!(
            "\nB3 ({}): {nodes} nodes, {} pods, ~{:.0} % utilisation{}, seed {seed}, budget {BUDGET_PERCENT} %",
            family.label(),
            nodes * PODS_PER_NODE,
            family.utilisation() * 100.0,
            if family == Family::WrongFlavors { format!(", {WRONG_XL_SHARE} % XL") } else { String::new() },
        );
        table(&procedures, nodes, seed, family, json);
    }
    println!(
        "budgets, PDBs and do-not-disrupt checked at every command: no breach. Whole run {:.1} s.",
        started.elapsed().as_secs_f64()
    );
}

/// One table: every procedure on one family's fleet.
fn table(procedures: &[(&'static str, Settings, bool)], nodes: usize, seed: u64, family: Family, json: bool) {
    println!(
        "| procedure | first decision ms | median ms | max ms | commands (multi/single) | nodes deleted / launched | fixed point | nodes after | price before €/h | after €/h | LP €/h | after / LP | run s |"
    );
    println!("|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|");
    for &(name, settings, repack) in procedures {
        let r = run(name, nodes, seed, family, settings, repack);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let first = r.decisions.first().copied().unwrap_or_default();
        let max = r.decisions.iter().max().copied().unwrap_or_default();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {} ({}/{}) | {} / {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.1} |",
            r.name,
            ms(first),
            ms(median(&r.decisions)),
            ms(max),
            r.commands,
            r.by_method[0],
            r.by_method[1],
            r.deleted,
            r.launched,
            if r.fixed_point { "yes" } else { "no (step cap)" },
            r.end_nodes,
            r.start_price,
            r.end_price,
            r.lp,
            r.end_price / r.lp,
            r.wall.as_secs_f64()
        );
        println!(
            "  {}: cpu/memory utilisation {:.0} %/{:.0} % before, {:.0} %/{:.0} % after; building the facts and model from the fleet {:.0} ms (not in the decision time)",
            r.name,
            r.utilisation_before.0 * 100.0,
            r.utilisation_before.1 * 100.0,
            r.utilisation_after.0 * 100.0,
            r.utilisation_after.1 * 100.0,
            ms(r.first_model)
        );
        if json {
            println!(
                "{{\"bench\":\"b3\",\"family\":{:?},\"procedure\":{:?},\"nodes\":{nodes},\"seed\":{seed},\"first_decision_ms\":{:.1},\"median_decision_ms\":{:.1},\"max_decision_ms\":{:.1},\"commands\":{},\"deleted\":{},\"launched\":{},\"fixed_point\":{},\"nodes_after\":{},\"price_before\":{:.4},\"price_after\":{:.4},\"lp\":{:.4},\"ratio\":{:.4}}}",
                family.label(),
                r.name,
                ms(first),
                ms(median(&r.decisions)),
                ms(max),
                r.commands,
                r.deleted,
                r.launched,
                r.fixed_point,
                r.end_nodes,
                r.start_price,
                r.end_price,
                r.lp,
                r.end_price / r.lp
            );
        }
    }
}
