//! B3-drift — finishing a drift with one disruption command at a time vs several at once: a pool of
//! 200 nodes of the six built-in flavors carrying 10 pods each at ~40 % utilisation (seeded), every
//! node drifted, a budget of 10 %. Runs [`disruption::drift`] pass after pass on a simulated clock
//! (passes every 10 s, 1 s after one that started a command; a command takes [`COMMAND_SECONDS`])
//! and reports the commands, the nodes replaced and launched, and the simulated time to finish.
//! Target: several commands at once finish ≥ 3× faster; budgets checked at every pass (the bench
//! panics if one is broken), every pod checked to exist exactly once after every change.
//!
//! `cargo bench -p disruption --bench b3_drift`; `B3_DRIFT_NODES=50` another fleet size (10 pods
//! per node either way); `B3_SEED=7` another fleet.

mod common;

use common::{Rng, median};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crds::nodepool::DisruptionReason;
use disruption::{Command, Drift, NodeFacts, PodFacts, Scope, ScopeModel, drift};
use jiff::{SignedDuration, Timestamp};
use scheduling::model::{Pod, RunningPod};
use scheduling::testkit::{flavors, node_of, pod, pool, running};

/// Pods per node at the start.
const PODS_PER_NODE: usize = 10;
/// Target utilisation of each node at the start (cpu and memory).
const UTILISATION: f64 = 0.4;
/// The pool's budget: the API default, 10 % of the nodes.
const BUDGET_PERCENT: usize = 10;
/// Simulated seconds between passes of the loop when the last one started nothing.
const PASS_SECONDS: u64 = 10;
/// Simulated seconds to the next pass after one that started a command (the loop goes again at once).
const PASS_AFTER_COMMAND_SECONDS: u64 = 1;
/// Simulated seconds from a command's start to its end: CKE launches a node in 2–3 min, then it
/// initializes and the candidate drains. Taken for every command, delete-only ones too (they only
/// drain, so this overstates them; both procedures alike).
const COMMAND_SECONDS: u64 = 240;
/// A run gives up after this much simulated time (a stall would otherwise pass forever).
const MAX_SECONDS: u64 = 30 * 24 * 3600;

/// Simulated time 0.
fn start() -> Timestamp {
    Timestamp::from_second(1_795_608_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn at(t: u64) -> Timestamp {
    start() + SignedDuration::from_secs(i64::try_from(t).unwrap_or(i64::MAX))
}

/// Where a node is in the life of the commands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Initialized: in the budget base, a candidate if drifted, a destination for moved pods.
    Live,
    /// A candidate of an in-flight command: still in the budget base and charged to it, its pods
    /// already placed elsewhere (so each pod is counted once), no destination.
    Leaving,
    /// A replacement of an in-flight command: holds its pods, not initialized (neither a
    /// candidate nor in the budget base, and no destination for the next commands' moved pods).
    Launching,
}

#[derive(Clone)]
struct FleetNode {
    name: String,
    flavor: String,
    price: f64,
    drifted: Option<Timestamp>,
    state: State,
    pods: Vec<Pod>,
}

/// A started command: its nodes by name, and when it ends.
struct InFlight {
    ends: u64,
    candidates: Vec<String>,
    replacements: Vec<String>,
}

struct Fleet {
    nodes: Vec<FleetNode>,
    next_node: usize,
    /// Every pod's key, from the start: each must be on exactly one node at all times.
    pods: BTreeSet<String>,
}

/// The seeded fleet: flavors drawn uniformly; each node's pods sum to about 40 % of its allocatable
/// cpu and memory; every node drifted, at distinct times (n0000 first).
fn fleet(nodes: usize, seed: u64) -> Fleet {
    let types = flavors();
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut k = 0;
    for i in 0..nodes {
        let t = &types[rng.below(types.len() as u64) as usize];
        let price = t.price().unwrap_or_else(|| panic!("flavor {} has no price", t.name));
        let pods = common::pod_requests(&mut rng, t, PODS_PER_NODE, UTILISATION)
            .into_iter()
            .map(|(cpu, mem)| {
                k += 1;
                pod(&format!("p{k:05}"), cpu, mem)
            })
            .collect();
        let ago = i64::try_from(nodes - i).unwrap_or(i64::MAX) * 60;
        out.push(FleetNode {
            name: format!("n{i:04}"),
            flavor: t.name.clone(),
            price,
            drifted: Some(start() - SignedDuration::from_secs(ago)),
            state: State::Live,
            pods,
        });
    }
    let pods = out.iter().flat_map(|n| n.pods.iter().map(Pod::key)).collect();
    Fleet { next_node: nodes, nodes: out, pods }
}

impl Fleet {
    fn price(&self) -> f64 {
        self.nodes.iter().map(|n| n.price).sum()
    }

    /// Panics unless every pod of the start is on exactly one node.
    fn check_pods(&self, procedure: &str, after: &str) {
        let mut seen = BTreeSet::new();
        for n in &self.nodes {
            for p in &n.pods {
                assert!(seen.insert(p.key()), "{procedure}: pod {} twice, after {after}", p.key());
            }
        }
        assert!(seen == self.pods, "{procedure}: pods lost or added, after {after}");
    }

    fn drifted(&self) -> usize {
        self.nodes.iter().filter(|n| n.drifted.is_some() && n.state == State::Live).count()
    }

    /// The budget base and the nodes leaving, counted from the fleet (not by the crate) as
    /// `pool_counts` does: initialized nodes, of which the in-flight candidates are leaving.
    fn base_and_leaving(&self) -> (usize, usize) {
        let base = self.nodes.iter().filter(|n| n.state != State::Launching).count();
        let leaving = self.nodes.iter().filter(|n| n.state == State::Leaving).count();
        (base, leaving)
    }

    /// The disruption facts and the scheduling model, node `i` of the fleet at index `i` of the
    /// scope. Leaving nodes are not in the scheduling input (a deleting node is no destination).
    fn model(&self) -> (Scope, ScopeModel) {
        let mut scope = Scope { pools: vec![common::budgeted_pool("default", BUDGET_PERCENT)], nodes: Vec::new() };
        let mut model = ScopeModel::default();
        model.input.pools = vec![pool("default")];
        for n in &self.nodes {
            let mut f = NodeFacts::new(&n.name, "default", start() - SignedDuration::from_hours(24));
            f.price = n.price;
            f.instance_type = Some(n.flavor.clone());
            f.zone = Some(crds::catalog::DEFAULT_ZONE.to_string());
            f.capacity_type = Some("on-demand".into());
            f.drifted = n.drifted.map(|since| Drift { reason: "NodePoolDrifted".into(), since });
            f.initialized = n.state != State::Launching;
            f.queued = n.state == State::Leaving;
            f.disruption_reason = f.queued.then_some(DisruptionReason::Drifted);
            f.pods = n.pods.iter().map(|p| PodFacts { name: p.key(), ready: true, ..PodFacts::default() }).collect();
            scope.nodes.push(f);
            if n.state == State::Leaving {
                model.node_index.push(None);
                model.movable.push(Vec::new());
                continue;
            }
            let pods: Vec<RunningPod> =
                n.pods.iter().map(|p| running(&p.name, p.requests.cpu_millis, p.requests.memory_bytes, &[])).collect();
            let mut existing = node_of(&n.name, &n.flavor, pods);
            existing.managed = true;
            existing.initialized = n.state == State::Live;
            existing.nodepool = Some("default".into());
            model.node_index.push(Some(model.input.nodes.len()));
            model.input.nodes.push(existing);
            model.movable.push(n.pods.clone());
        }
        (scope, model)
    }

    /// Starts `command` at `t`: its candidates leave (their pods placed where the drift's
    /// simulation put them, found by running it again: the scheduler is deterministic), its
    /// replacements launch with their pods.
    fn start(&mut self, command: &Command, model: &ScopeModel, t: u64, procedure: &str) -> InFlight {
        let idx: Vec<usize> = command.candidates.iter().map(|c| c.index).collect();
        let moved: Vec<Pod> = idx.iter().flat_map(|&i| std::mem::take(&mut self.nodes[i].pods)).collect();
        for &i in &idx {
            assert_eq!(self.nodes[i].state, State::Live, "{procedure}: candidate {} is not live", self.nodes[i].name);
            self.nodes[i].state = State::Leaving;
        }
        let mut replacements = Vec::new();
        if moved.is_empty() {
            assert!(command.replacements.is_empty(), "{procedure}: replacements for empty nodes: {command}");
        } else {
            // As `ScopeModel::simulate_without` for drift: the candidates' model nodes removed, their
            // pods to place (the pool has no limits, so its usage needs no adjusting).
            let removed: Vec<usize> = idx.iter().filter_map(|&i| model.node_index[i]).collect();
            let fleet_of: Vec<usize> =
                (0..self.nodes.len()).filter(|&i| model.node_index[i].is_some_and(|j| !removed.contains(&j))).collect();
            let mut input = model.input.clone();
            input.nodes = model
                .input
                .nodes
                .iter()
                .enumerate()
                .filter(|(j, _)| !removed.contains(j))
                .map(|(_, n)| n.clone())
                .collect();
            input.pods = moved.clone();
            let decision = common::replay(&input, procedure);
            assert_eq!(
                decision.new_claims, command.replacements,
                "{procedure}: the re-run simulation disagrees with the command {command}"
            );
            for a in &decision.existing {
                let node = &mut self.nodes[fleet_of[a.node]];
                assert_eq!(
                    node.state,
                    State::Live,
                    "{procedure}: a moved pod lands on {} ({:?})",
                    node.name,
                    node.state
                );
                node.pods.extend(a.pods.iter().map(|&p| moved[p].clone()));
            }
            for claim in &decision.new_claims {
                let option = claim
                    .instance_types
                    .first()
                    .unwrap_or_else(|| panic!("{procedure}: a replacement without options: {command}"));
                let name = format!("n{:04}", self.next_node);
                self.next_node += 1;
                self.nodes.push(FleetNode {
                    name: name.clone(),
                    flavor: option.name.clone(),
                    price: option.price,
                    drifted: None,
                    state: State::Launching,
                    pods: claim.pods.iter().map(|&p| moved[p].clone()).collect(),
                });
                replacements.push(name);
            }
        }
        self.check_pods(procedure, &command.to_string());
        InFlight {
            ends: t + COMMAND_SECONDS,
            candidates: idx.iter().map(|&i| self.nodes[i].name.clone()).collect(),
            replacements,
        }
    }

    /// Ends a command: its candidates are gone, its replacements initialized.
    fn complete(&mut self, done: &InFlight, procedure: &str) {
        self.nodes.retain(|n| !done.candidates.contains(&n.name));
        for n in &mut self.nodes {
            if done.replacements.contains(&n.name) {
                n.state = State::Live;
            }
        }
        self.check_pods(procedure, "a command's end");
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Procedure {
    /// A pass decides only when no command is in flight.
    OneAtATime,
    /// A pass always decides; in-flight commands' candidates are queued.
    Several,
}

impl Procedure {
    fn name(self) -> &'static str {
        match self {
            Procedure::OneAtATime => "one at a time",
            Procedure::Several => "several",
        }
    }
}

#[derive(Default)]
struct Run {
    /// Wall time of each decision computed (replayed passes excluded).
    decisions: Vec<Duration>,
    /// Passes that decided (computed or replayed).
    passes: usize,
    commands: usize,
    delete_only: usize,
    replaced: usize,
    launched: usize,
    /// Pods evicted, over all commands (a pod moved twice counts twice).
    moved: usize,
    /// Simulated seconds to the end of the drift (`None`: it stalled or hit the cap).
    finished: Option<u64>,
    max_in_flight: usize,
    max_leaving: usize,
    /// Passes that decided nothing while drifted nodes were left.
    idle_passes: usize,
    /// ... of which the budget was what stopped them.
    budget_passes: usize,
    /// Drifted nodes reported blocked (pods fit nowhere), over all passes.
    blocked: usize,
    start_price: f64,
    end_price: f64,
    end_nodes: usize,
    wall: Duration,
}

fn run(procedure: Procedure, nodes: usize, seed: u64) -> Run {
    let started = Instant::now();
    let name = procedure.name();
    let mut f = fleet(nodes, seed);
    f.check_pods(name, "the start");
    let mut r = Run { start_price: f.price(), ..Run::default() };
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut next_pass = 0;
    // The last pass's idle outcome (blocked nodes, budget-constrained) while the fleet is unchanged
    // since: drift is deterministic and nothing here depends on the clock, so a pass on the same
    // fleet decides the same and is replayed rather than recomputed (it would cost one simulation
    // per blocked node, every 10 s).
    let mut idle: Option<(usize, bool)> = None;
    if f.drifted() == 0 {
        r.finished = Some(0);
    }
    while r.finished.is_none() && next_pass <= MAX_SECONDS {
        // Ends due by the next pass come first, in time order (the drift may finish at one).
        if let Some(k) =
            (0..in_flight.len()).filter(|&k| in_flight[k].ends <= next_pass).min_by_key(|&k| in_flight[k].ends)
        {
            let done = in_flight.swap_remove(k);
            f.complete(&done, name);
            idle = None;
            if in_flight.is_empty() && f.drifted() == 0 {
                r.finished = Some(done.ends);
            }
            continue;
        }
        let t = next_pass;
        if procedure == Procedure::OneAtATime && !in_flight.is_empty() {
            next_pass = t + PASS_SECONDS;
            continue;
        }
        r.passes += 1;
        let started_one = match idle {
            Some((blocked, budget)) => {
                r.idle_passes += 1;
                r.budget_passes += usize::from(budget);
                r.blocked += blocked;
                false
            }
            None => {
                let (scope, model) = f.model();
                let clock = Instant::now();
                let outcome = drift(&scope, at(t), &mut model.for_drift());
                r.decisions.push(clock.elapsed());
                r.blocked += outcome.blocked.len();
                match &outcome.command {
                    Some(command) => {
                        r.commands += 1;
                        r.replaced += command.candidates.len();
                        r.launched += command.replacements.len();
                        r.delete_only += usize::from(command.replacements.is_empty());
                        r.moved += command.candidates.iter().map(|c| scope.nodes[c.index].pods.len()).sum::<usize>();
                        in_flight.push(f.start(command, &model, t, name));
                        true
                    }
                    None => {
                        r.idle_passes += 1;
                        r.budget_passes += usize::from(outcome.budget_constrained);
                        idle = Some((outcome.blocked.len(), outcome.budget_constrained));
                        false
                    }
                }
            }
        };
        next_pass = t + if started_one { PASS_AFTER_COMMAND_SECONDS } else { PASS_SECONDS };
        // Independently of the crate: the nodes leaving at once stay within 10 % of the base, rounded up.
        let (base, leaving) = f.base_and_leaving();
        let allowed = (base * BUDGET_PERCENT).div_ceil(100);
        assert!(
            leaving <= allowed,
            "{name}: BUDGET BROKEN at {t} s: {leaving} nodes leaving, the budget allows {allowed} of {base}"
        );
        r.max_in_flight = r.max_in_flight.max(in_flight.len());
        r.max_leaving = r.max_leaving.max(leaving);
        if !started_one && in_flight.is_empty() {
            // Nothing in flight and nothing decided: nothing will change any more.
            eprintln!("{name}: stalled at {t} s with {} drifted nodes left", f.drifted());
            break;
        }
    }
    r.end_price = f.price();
    r.end_nodes = f.nodes.len();
    r.wall = started.elapsed();
    r
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let nodes: usize = std::env::var("B3_DRIFT_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let seed: u64 = std::env::var("B3_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let started = Instant::now();
    println!(
        "B3-drift: {nodes} nodes, all drifted, {} pods, ~{:.0} % utilisation, seed {seed}, budget {BUDGET_PERCENT} %, \
         a pass every {PASS_SECONDS} s ({PASS_AFTER_COMMAND_SECONDS} s after a command), a command takes {COMMAND_SECONDS} s",
        nodes * PODS_PER_NODE,
        UTILISATION * 100.0
    );
    println!(
        "| procedure | commands (delete-only) | nodes replaced | replacements launched | pods moved | simulated min | mean / max commands in flight | max nodes leaving | passes (computed) | decision median ms | max ms | idle passes (budget-limited) | blocked reports | nodes after | €/h before → after | run s |"
    );
    println!("|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|---|---:|---:|---|---:|");
    let mut minutes = Vec::new();
    for procedure in [Procedure::OneAtATime, Procedure::Several] {
        let r = run(procedure, nodes, seed);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let simulated = r.finished.map(|s| s as f64 / 60.0);
        // Σ command durations / time to finish.
        let mean_in_flight = r.finished.map_or(0.0, |s| (r.commands as u64 * COMMAND_SECONDS) as f64 / s.max(1) as f64);
        minutes.push(simulated);
        println!(
            "| {} | {} ({}) | {} | {} | {} | {} | {:.1} / {} | {} | {} ({}) | {:.1} | {:.1} | {} ({}) | {} | {} | {:.2} → {:.2} | {:.1} |",
            procedure.name(),
            r.commands,
            r.delete_only,
            r.replaced,
            r.launched,
            r.moved,
            simulated.map_or("not finished".to_string(), |m| format!("{m:.1}")),
            mean_in_flight,
            r.max_in_flight,
            r.max_leaving,
            r.passes,
            r.decisions.len(),
            ms(median(&r.decisions)),
            ms(r.decisions.iter().max().copied().unwrap_or_default()),
            r.idle_passes,
            r.budget_passes,
            r.blocked,
            r.end_nodes,
            r.start_price,
            r.end_price,
            r.wall.as_secs_f64()
        );
    }
    match (minutes[0], minutes[1]) {
        (Some(one), Some(several)) if several > 0.0 => {
            let ratio = one / several;
            println!(
                "one at a time / several: {one:.1} / {several:.1} min = {ratio:.1}×; target ≥ 3×: {}",
                if ratio >= 3.0 { "met" } else { "NOT met" }
            );
        }
        _ => println!("one at a time / several: a procedure did not finish; target ≥ 3×: NOT met"),
    }
    println!(
        "budgets checked at every pass, pods checked after every start and end: no breach. Whole run {:.1} s.",
        started.elapsed().as_secs_f64()
    );
}
