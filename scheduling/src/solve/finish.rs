//! Finishing (§3.13–§3.15): each claim's options, cheapest first and truncated to
//! `maxInstanceTypes` (a claim with no offering left, or whose minValues the truncation breaks under
//! the strict policy, drops its pods), its requirements and labels, its requests with the smallest
//! DaemonSet overhead among its options, and what it draws on the shared limits; then the pods
//! placed on existing nodes and the pods left pending with their reasons.
//!
//! Owns the decision's shape. Must not change where a pod goes, except to drop the pods of a claim
//! that cannot launch.

use std::collections::BTreeMap;

use crds::labels;
use crds::quantity::Resources;

use super::Solver;
use crate::bitset::Bits;
use crate::model::{
    ClaimOption, Decision, Draw, MinValuesPolicy, NewClaim, NodeAssignment, NodeSelectorRequirement, Operator,
    Unschedulable,
};
use crate::requirements::{Requirements, ValueSet};

impl Solver<'_> {
    pub(super) fn finish(mut self) -> Decision {
        let mut decision = Decision { shared_drawn: vec![Draw::default(); self.shared.len()], ..Decision::default() };
        let max_types = self.input.settings.max_instance_types.max(1);
        let instance_type_key = self.ints.key(labels::INSTANCE_TYPE);
        let nodepool_key = self.ints.key(labels::NODEPOOL);
        let mut dropped: Vec<(usize, String)> = Vec::new();
        for claim in &self.claims {
            let pool = &self.pools[claim.pool];
            let table = &pool.table;
            let mut options: Vec<(f64, usize)> =
                claim.types.iter().map(|i| (table.price_under(i, &claim.reqs, &self.ints), i)).collect();
            options.retain(|(p, _)| p.is_finite());
            options.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| table.types[a.1].name.cmp(&table.types[b.1].name)));
            options.truncate(max_types);
            let mut kept = Bits::empty(table.len());
            for &(_, i) in &options {
                kept.set(i);
            }
            if options.is_empty() {
                for &p in &claim.pods {
                    dropped.push((p, format!("nodepool {}: no instance type has an available offering", pool.name)));
                }
                continue;
            }
            if self.input.settings.min_values_policy == MinValuesPolicy::Strict
                && let Some((key, wanted, reached)) = table.min_values_unmet(&kept, &claim.reqs, &self.ints)
            {
                for &p in &claim.pods {
                    dropped.push((
                        p,
                        format!(
                            "nodepool {}: minValues {wanted} of {} not met after keeping the {max_types} cheapest \
                             instance types ({reached} values)",
                            pool.name,
                            self.ints.key_name(key)
                        ),
                    ));
                }
                continue;
            }
            let overhead = (0..pool.groups.len())
                .filter(|&g| options.iter().any(|&(_, i)| table.types[i].ds_group == g))
                .map(|g| pool.groups[g].overhead)
                .min_by_key(|o| (o.cpu_millis, o.memory_bytes, o.ephemeral_storage_bytes, o.pods))
                .unwrap_or(Resources::ZERO);
            let capacity_types = table.capacity_types(&kept, &claim.reqs, &self.ints);
            let mut requirements: Vec<NodeSelectorRequirement> = Vec::new();
            let mut claim_labels: BTreeMap<String, String> = self.input.pools[pool.input].labels.clone();
            for (k, set) in claim.reqs.iter() {
                if k == self.hostname_key || k == instance_type_key || k == self.capacity_type_key {
                    continue;
                }
                let name = self.ints.key_name(k).to_string();
                let mut single = set.clone();
                // One value per custom label (well-known keys keep their sets).
                if k >= self.n_well_known && !set.is_complement() && set.values().len() > 1 {
                    let mut vals: Vec<&str> = set.values().iter().map(|&v| self.ints.val_name(v)).collect();
                    vals.sort_unstable();
                    if let Some(first) = vals.first()
                        && let Some(v) = self.ints.lookup_val(first)
                    {
                        single = ValueSet::single(v).with_min_values(set.min_values());
                    }
                }
                if (k >= self.n_well_known || k == nodepool_key)
                    && !single.is_complement()
                    && let [v] = single.values()
                {
                    claim_labels.insert(name.clone(), self.ints.val_name(*v).to_string());
                }
                let mut one = Requirements::new();
                one.add(k, single, &self.ints);
                requirements.extend(one.to_api(&self.ints));
            }
            let it_min = claim.reqs.get(instance_type_key).and_then(ValueSet::min_values);
            requirements.push(NodeSelectorRequirement {
                key: labels::INSTANCE_TYPE.to_string(),
                operator: Operator::In,
                values: options.iter().map(|&(_, i)| table.types[i].name.clone()).collect(),
                min_values: it_min.and_then(|m| i32::try_from(m).ok()),
            });
            requirements.push(NodeSelectorRequirement {
                key: labels::CAPACITY_TYPE.to_string(),
                operator: Operator::In,
                values: capacity_types.iter().map(|&v| self.ints.val_name(v).to_string()).collect(),
                min_values: claim
                    .reqs
                    .get(self.capacity_type_key)
                    .and_then(ValueSet::min_values)
                    .and_then(|m| i32::try_from(m).ok()),
            });
            requirements.sort_by(|a, b| a.key.cmp(&b.key));
            // Each shared limit is drawn by the largest of the options kept: the launch picks one.
            for share in &pool.shared {
                let mut most = [0i64; 3];
                for &(_, i) in &options {
                    for (m, d) in most.iter_mut().zip(share.draws[i]) {
                        *m = (*m).max(d);
                    }
                }
                let drawn = &mut decision.shared_drawn[share.limit];
                drawn.cpu_millis = drawn.cpu_millis.saturating_add(most[0]);
                drawn.memory_bytes = drawn.memory_bytes.saturating_add(most[1]);
                drawn.price_micros = drawn.price_micros.saturating_add(most[2]);
            }
            let input_pool = &self.input.pools[pool.input];
            let mut pods = claim.pods.clone();
            pods.sort_unstable();
            decision.new_claims.push(NewClaim {
                nodepool: pool.name.clone(),
                price: options[0].0,
                instance_types: options
                    .iter()
                    .map(|&(price, i)| ClaimOption { name: table.types[i].name.clone(), price })
                    .collect(),
                pods,
                requests: claim.used + overhead,
                extended: claim.extended.clone(),
                requirements,
                labels: claim_labels,
                taints: input_pool.taints.clone(),
                startup_taints: input_pool.startup_taints.clone(),
                min_values_relaxed: claim.min_values_relaxed,
            });
        }
        for n in &self.nodes {
            if !n.pods.is_empty() {
                let mut pods = n.pods.clone();
                pods.sort_unstable();
                decision.existing.push(NodeAssignment { node: n.input, pods });
            }
        }
        decision.existing.sort_by_key(|a| a.node);
        for (p, why) in dropped {
            self.placed[p] = false;
            self.errors[p] = Some(why);
        }
        for p in 0..self.input.pods.len() {
            if !self.placed[p] {
                let reason = self.errors[p].take().unwrap_or_else(|| "not attempted".to_string());
                decision.unschedulable.push(Unschedulable { pod: p, reason });
            }
        }
        decision
    }
}
