//! The exact optimum of a small B2 case (issue 14 item 5), as an integer program solved by microlp
//! (pure Rust, through good_lp): which nodes to launch, of which flavor, and which pods each holds,
//! at the lowest total price. Benches only: the hub never depends on it.
//!
//! Model. Node slots k = 0..K, each of at most one type (z[k][t] binary); pods sorted by decreasing
//! size, pod i only in slots k ≤ i, slots opened in order (both only break the symmetry of equal
//! slots: any packing can be relabelled so; the hub's own packing is relabelled so as the warm
//! start). Each slot's pods fit its type's allocatable (minus the DaemonSet overhead) in cpu, memory
//! and pod slots; pods of one group share no slot (a hostname anti-affinity, a hostname spread of
//! maxSkew 1 from empty nodes, one host port); Σ capacity of the chosen types ≤ the pool's cpu and
//! memory limits. K = the most nodes a packing at most as dear as the hub's can have.

use good_lp::{
    Expression, ProblemVariables, Solution, SolutionStatus, SolverModel, Variable, WithInitialSolution, WithTimeLimit,
    constraint, microlp, variable,
};

/// One flavor as the program sees it.
#[derive(Debug, Clone)]
pub struct Type {
    pub name: String,
    /// Room for pods: allocatable minus the DaemonSet overhead (cpu millis, memory bytes, pods).
    pub room: [i64; 3],
    /// Capacity (cpu millis, memory bytes): what a pool's limits count.
    pub capacity: [i64; 2],
    pub price: f64,
}

/// A small case.
#[derive(Debug, Clone, Default)]
pub struct Case {
    pub types: Vec<Type>,
    /// Requests (cpu millis, memory bytes, 1 pod slot).
    pub pods: Vec<[i64; 3]>,
    /// Sets of pods (indices into `pods`) of which no node holds two.
    pub apart: Vec<Vec<usize>>,
    /// cpu and memory limits on Σ capacity.
    pub limits: Option<[i64; 2]>,
}

/// A feasible packing: per node, its type (index into `types`) and its pods (indices into `pods`).
pub type Packing = Vec<(usize, Vec<usize>)>;

/// What the solver proved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The optimum.
    Optimal(f64),
    /// The time ran out: the best packing found (≥ the optimum), not proven optimal.
    Incumbent(f64),
    /// No packing found in time, or none exists (under limits).
    None,
}

/// Scales cpu millis and bytes to cores and GiB so that the program is well conditioned.
fn scale(r: usize, v: i64) -> f64 {
    match r {
        0 => v as f64 / 1000.0,
        1 => v as f64 / f64::from(1u32 << 30),
        _ => v as f64,
    }
}

/// The cheapest packing of every pod, `start` (a feasible packing, the hub's) as the warm start
/// and its price as the ceiling; `seconds` bounds the branch and bound.
pub fn optimum(case: &Case, start: Option<&Packing>, seconds: f64) -> Outcome {
    let n = case.pods.len();
    let types = &case.types;
    if n == 0 {
        return Outcome::Optimal(0.0);
    }
    let start_price = start.map(|s| s.iter().map(|(t, _)| types[*t].price).sum::<f64>());
    // Pods by decreasing size (cpu and memory as shares of the largest room), so that the slot
    // bound k ≤ i keeps large pods early where they open the slots.
    let big = [0, 1].map(|r| types.iter().map(|t| t.room[r]).max().unwrap_or(1).max(1) as f64);
    let mut order: Vec<usize> = (0..n).collect();
    let size = |p: usize| case.pods[p][0] as f64 / big[0] + case.pods[p][1] as f64 / big[1];
    order.sort_by(|&a, &b| size(b).total_cmp(&size(a)).then(a.cmp(&b)));
    let mut rank = vec![0usize; n];
    for (i, &p) in order.iter().enumerate() {
        rank[p] = i;
    }
    let cheapest = types.iter().map(|t| t.price).fold(f64::INFINITY, f64::min);
    let slots = match start_price {
        Some(ub) => n.min(((ub + 1e-9) / cheapest).floor() as usize).max(1),
        None => n,
    };

    let mut vars = ProblemVariables::new();
    let z: Vec<Vec<Variable>> =
        (0..slots).map(|_| (0..types.len()).map(|_| vars.add(variable().binary())).collect()).collect();
    // x[p][k] for k ≤ rank[p] only.
    let x: Vec<Vec<Variable>> =
        (0..n).map(|p| (0..slots.min(rank[p] + 1)).map(|_| vars.add(variable().binary())).collect()).collect();
    let cost: Expression = z.iter().flat_map(|row| row.iter().zip(types).map(|(v, t)| t.price * *v)).sum();
    let mut model = vars.minimise(cost.clone()).using(microlp);
    if let Some(ub) = start_price {
        model = model.with(constraint!(cost <= ub + 1e-6));
    }
    for k in 0..slots {
        let open: Expression = z[k].iter().copied().sum();
        model = model.with(constraint!(open.clone() <= 1));
        if k + 1 < slots {
            let next: Expression = z[k + 1].iter().copied().sum();
            model = model.with(constraint!(next <= open.clone()));
        }
        for r in 0..3 {
            let load: Expression =
                (0..n).filter(|&p| k < x[p].len()).map(|p| scale(r, case.pods[p][r]) * x[p][k]).sum();
            let room: Expression = z[k].iter().zip(types).map(|(v, t)| scale(r, t.room[r]) * *v).sum();
            model = model.with(constraint!(load <= room));
        }
        for group in &case.apart {
            let on: Expression = group.iter().filter(|&&p| k < x[p].len()).map(|&p| x[p][k]).sum();
            model = model.with(constraint!(on <= 1));
        }
    }
    for row in &x {
        let placed: Expression = row.iter().copied().sum();
        model = model.with(constraint!(placed == 1));
    }
    if let Some(limit) = case.limits {
        for (r, l) in limit.iter().enumerate() {
            let used: Expression =
                z.iter().flat_map(|row| row.iter().zip(types).map(move |(v, t)| scale(r, t.capacity[r]) * *v)).sum();
            model = model.with(constraint!(used <= scale(r, *l)));
        }
    }
    if let Some(packing) = start {
        // Relabel the hub's nodes by their earliest pod: the j-th node's earliest rank is ≥ j.
        let mut nodes: Vec<(usize, &(usize, Vec<usize>))> =
            packing.iter().map(|node| (node.1.iter().map(|&p| rank[p]).min().unwrap_or(usize::MAX), node)).collect();
        nodes.sort_by_key(|(first, _)| *first);
        if nodes.len() <= slots {
            let mut values: Vec<(Variable, f64)> = Vec::new();
            for (k, row) in z.iter().enumerate() {
                for (t, v) in row.iter().enumerate() {
                    values.push((*v, f64::from(u8::from(nodes.get(k).is_some_and(|(_, node)| node.0 == t)))));
                }
            }
            let slot_of: Vec<usize> = {
                let mut s = vec![usize::MAX; n];
                for (k, (_, node)) in nodes.iter().enumerate() {
                    for &p in &node.1 {
                        s[p] = k;
                    }
                }
                s
            };
            for (p, row) in x.iter().enumerate() {
                for (k, v) in row.iter().enumerate() {
                    values.push((*v, f64::from(u8::from(slot_of[p] == k))));
                }
            }
            model = model.with_initial_solution(values);
        }
    }
    match model.with_time_limit(seconds).solve() {
        Ok(solution) => {
            let price: f64 =
                z.iter().flat_map(|row| row.iter().zip(types).map(|(v, t)| t.price * solution.value(*v).round())).sum();
            match solution.status() {
                SolutionStatus::Optimal => Outcome::Optimal(price),
                _ => Outcome::Incumbent(price),
            }
        }
        Err(_) => match start_price {
            Some(p) => Outcome::Incumbent(p),
            None => Outcome::None,
        },
    }
}
