//! The scheduling simulation of disruption (karpenter-semantics §4.8): the provisioning scheduler,
//! unchanged, run without the candidate nodes on their pods plus the pending pods and the pods of
//! nodes already leaving.

use std::collections::{BTreeMap, BTreeSet};

use scheduling::model::{ExistingNode, Input, Pod, RunningPod, Taint, TaintEffect, Toleration, TolerationOperator};

use crate::methods::{Simulation, Simulator};

/// A taint that exists only inside consolidation simulations: it closes nodes that may not receive
/// moved pods (§3.7) while pending pods and pods of leaving nodes, which tolerate it, may still go there.
pub const NO_DESTINATION_TAINT: &str = "karpenter.clever-cloud.com/simulation-no-destination";

/// Pods listed in an `Unplaceable` verdict, at most.
const MAX_LISTED: usize = 5;

/// A scope as the scheduler sees it, with where each disruption node and its pods sit in it.
#[derive(Debug, Clone, Default)]
pub struct ScopeModel {
    /// The round's input as the provisioner builds it: Ready pools, every active node of the workload
    /// cluster (the scope's nodes included, nodes being deleted excluded), pending pods, DaemonSets.
    pub input: Input,
    /// For each node of [`crate::Scope::nodes`] (same index), its index in `input.nodes`, if there.
    pub node_index: Vec<Option<usize>>,
    /// For each node of [`crate::Scope::nodes`] (same index), its reschedulable pods as pods to place.
    pub movable: Vec<Vec<Pod>>,
    /// Pods of nodes already being deleted that need a place (once each, and not those kept there
    /// for good): they are placed with the pending pods.
    pub leaving: Vec<Pod>,
    /// Indices in `input.nodes` of nodes whose claim is being deleted while their Node is not yet:
    /// never a destination (upstream's "marked for deletion"); their pods are in `leaving`.
    pub deleting: Vec<usize>,
    /// Indices in `input.nodes` of managed nodes whose pool has a finite `consolidateAfter` and whose
    /// claim is not `Consolidatable`: no destination for moved pods in consolidation (§3.7).
    pub no_destination: Vec<usize>,
}

impl ScopeModel {
    /// Simulates for drift (no destination rule).
    pub fn for_drift(&self) -> Simulate<'_> {
        Simulate { model: self, consolidation: false, out_of_time: None }
    }

    /// Simulates for consolidation (moved pods avoid nodes not yet consolidatable).
    pub fn for_consolidation(&self) -> Simulate<'_> {
        Simulate { model: self, consolidation: true, out_of_time: None }
    }

    /// [`ScopeModel::for_consolidation`], stopping when `out_of_time` says so (the caller's clock).
    pub fn for_consolidation_until<'a>(&'a self, out_of_time: &'a dyn Fn() -> bool) -> Simulate<'a> {
        Simulate { model: self, consolidation: true, out_of_time: Some(out_of_time) }
    }

    /// Removes `nodes` (indices in the scope) and places their pods, the pending pods and the
    /// leaving pods. Success = every pod that was not already pending has a place, and none of the
    /// moved pods lands on an uninitialized node.
    pub fn simulate(&self, nodes: &[usize], consolidation: bool) -> Simulation {
        self.simulate_without(nodes, &[], consolidation)
    }

    /// [`ScopeModel::simulate`] with the pods named in `left_behind` (`namespace/name`) not moved.
    pub fn simulate_without(&self, nodes: &[usize], left_behind: &[String], consolidation: bool) -> Simulation {
        let mut input = self.input.clone();
        let removed: BTreeSet<usize> =
            nodes.iter().filter_map(|&i| self.node_index.get(i).copied().flatten()).collect();
        let tolerate = Toleration {
            key: NO_DESTINATION_TAINT.to_string(),
            operator: TolerationOperator::Exists,
            value: String::new(),
            effect: None,
        };
        let pending = input.pods.len();
        input.pods.extend(self.leaving.iter().cloned());
        if consolidation {
            for pod in &mut input.pods {
                pod.constraints.tolerations.push(tolerate.clone());
            }
            for &j in &self.no_destination {
                if let Some(node) = input.nodes.get_mut(j) {
                    node.taints.push(Taint {
                        key: NO_DESTINATION_TAINT.to_string(),
                        value: None,
                        effect: TaintEffect::NoSchedule,
                    });
                }
            }
        }
        // The removed nodes no longer count against their pools' limits: a pool at its limit can
        // still replace a node by a smaller one.
        for &j in &removed {
            let Some(node) = input.nodes.get(j) else { continue };
            let (capacity, pool) = (node.capacity, node.nodepool.clone());
            if let Some(pool) = input.pools.iter_mut().find(|p| Some(&p.name) == pool.as_ref()) {
                pool.usage.resources = pool.usage.resources.saturating_sub(capacity);
                pool.usage.nodes = (pool.usage.nodes - 1).max(0);
            }
        }
        let kept: Vec<ExistingNode> = std::mem::take(&mut input.nodes)
            .into_iter()
            .enumerate()
            .filter(|(j, _)| !removed.contains(j) && !self.deleting.contains(j))
            .map(|(_, n)| n)
            .collect();
        input.nodes = kept;
        let pending = pin_placed_first(&mut input, pending);
        let moved_from = input.pods.len();
        for &i in nodes {
            input
                .pods
                .extend(self.movable.get(i).into_iter().flatten().filter(|p| !left_behind.contains(&p.key())).cloned());
        }
        let decision = scheduling::solve(&input);
        let mut failed: Vec<String> = decision
            .unschedulable
            .iter()
            .filter(|u| u.pod >= pending)
            .map(|u| format!("{}: {}", input.pods[u.pod].key(), u.reason))
            .collect();
        for a in &decision.existing {
            let node = &input.nodes[a.node];
            if node.managed && !node.initialized {
                failed.extend(
                    a.pods
                        .iter()
                        .filter(|&&p| p >= moved_from)
                        .map(|&p| format!("{}: would move to {}, not initialized yet", input.pods[p].key(), node.name)),
                );
            }
        }
        if failed.is_empty() {
            Simulation::Placed { new_claims: decision.new_claims }
        } else {
            failed.truncate(MAX_LISTED);
            Simulation::Unplaceable(failed)
        }
    }
}

/// Binds the pods placed before the candidates' (the pending pods, then from index `pending` on the
/// pods of nodes already leaving) that the scheduler puts on an in-flight node (managed, not
/// initialized yet) to that node, and takes them off the pods to place; returns how many pending
/// pods are left to place. Those nodes were launched for these very pods: by provisioning for the
/// pending ones, by a started command for the leaving ones (upstream exempts those from its
/// uninitialized-node check for that reason; a leaving node's pods also show as pending once its
/// node is tainted `karpenter.sh/disrupted`). Placed first, they keep their room: otherwise a
/// candidate's pod of the same size could take it, whichever pod sorts first (by UID), and the
/// command would be refused for moving a pod onto a node not initialized yet while the new nodes it
/// launches would have held both (drift of one anti-affine pod per node, several commands at once).
fn pin_placed_first(input: &mut Input, pending: usize) -> usize {
    if input.pods.is_empty() || !input.nodes.iter().any(|n| n.managed && !n.initialized) {
        return pending;
    }
    let first = scheduling::solve(input);
    // Pod index -> the in-flight node it is bound to.
    let mut bound: BTreeMap<usize, usize> = BTreeMap::new();
    for a in &first.existing {
        if input.nodes.get(a.node).is_some_and(|n| n.managed && !n.initialized) {
            bound.extend(a.pods.iter().map(|&p| (p, a.node)));
        }
    }
    for (i, pod) in std::mem::take(&mut input.pods).into_iter().enumerate() {
        match bound.get(&i).and_then(|&n| input.nodes.get_mut(n)) {
            Some(node) => node.pods.push(RunningPod::from(pod)),
            None => input.pods.push(pod),
        }
    }
    pending - bound.range(..pending).count()
}

/// A [`ScopeModel`] simulating for one kind of method.
#[derive(Clone, Copy)]
pub struct Simulate<'a> {
    model: &'a ScopeModel,
    consolidation: bool,
    out_of_time: Option<&'a dyn Fn() -> bool>,
}

impl std::fmt::Debug for Simulate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulate")
            .field("consolidation", &self.consolidation)
            .field("time_limited", &self.out_of_time.is_some())
            .finish()
    }
}

impl Simulator for Simulate<'_> {
    fn simulate(&mut self, nodes: &[usize]) -> Simulation {
        self.model.simulate(nodes, self.consolidation)
    }

    fn simulate_without(&mut self, nodes: &[usize], left_behind: &[String]) -> Simulation {
        self.model.simulate_without(nodes, left_behind, self.consolidation)
    }

    fn out_of_time(&mut self) -> bool {
        self.out_of_time.is_some_and(|f| f())
    }
}
