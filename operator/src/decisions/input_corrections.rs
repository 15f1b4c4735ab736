//! Corrections of a scheduling input from what the hub has seen of CKE, applied by provisioning and
//! by disruption's simulation alike: flavors in cool-down after a refusal are not offered, and the
//! first Ready worker Node of a flavor gives it its real capacity (clever-cloud.md §4).
//!
//! Owns: those two pure edits of a [`scheduling::Input`]. Must not: read caches or the clock (the
//! callers pass the flavors and Nodes).

use std::collections::{BTreeMap, BTreeSet};

use crds::{labels, quantity::Resources};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

/// Take the offerings of flavors CKE refused recently out of every pool's catalogue.
pub fn mark_unavailable(input: &mut scheduling::Input, flavors: &BTreeSet<String>) {
    if flavors.is_empty() {
        return;
    }
    for it in input.pools.iter_mut().flat_map(|p| p.instance_types.iter_mut()) {
        if flavors.contains(&it.name) {
            for o in &mut it.offerings {
                o.available = false;
            }
        }
    }
}

/// Runtime self-correction of the catalogue (clever-cloud.md §4): the first Ready-reported worker
/// Node of each flavor gives that flavor its real capacity and allocatable in every pool. Returns
/// the observations refused (too far from the catalogue), for the log.
pub fn correct_from_nodes<'a>(
    input: &mut scheduling::Input,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Vec<(String, String)> {
    let mut observed: BTreeMap<String, (Resources, Resources)> = BTreeMap::new();
    for node in nodes {
        let labels = node.labels();
        let Some(flavor) = labels.get(labels::CLEVER_FLAVOR).or_else(|| labels.get(labels::INSTANCE_TYPE)) else {
            continue;
        };
        let Some(status) = node.status.as_ref() else { continue };
        let (Some(cap), Some(alloc)) = (status.capacity.as_ref(), status.allocatable.as_ref()) else { continue };
        let (Ok(cap), Ok(alloc)) = (Resources::from_resource_list(cap), Resources::from_resource_list(alloc)) else {
            continue;
        };
        if cap.cpu_millis > 0 && cap.memory_bytes > 0 {
            observed.entry(flavor.clone()).or_insert((cap, alloc));
        }
    }
    let mut refused = Vec::new();
    for it in input.pools.iter_mut().flat_map(|p| p.instance_types.iter_mut()) {
        if let Some((cap, alloc)) = observed.get(&it.name)
            && let Err(e) = it.observe(*cap, *alloc)
            && !refused.iter().any(|(f, _)| f == &it.name)
        {
            refused.push((it.name.clone(), e.to_string()));
        }
    }
    refused
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use scheduling::testkit::{GI, input, pod, pool};
    use serde_json::json;

    fn first_flavor(input: &scheduling::Input) -> String {
        let d = scheduling::solve(input);
        d.new_claims[0].instance_types[0].name.clone()
    }

    #[test]
    fn a_flavor_cooling_down_is_not_chosen_and_the_next_cheapest_is() {
        let mut i = input(vec![pool("default")], vec![pod("p", 1000, GI)]);
        assert_eq!(first_flavor(&i), "2XS");
        mark_unavailable(&mut i, &BTreeSet::from(["2XS".to_string()]));
        assert_eq!(first_flavor(&i), "XS");
        let d = scheduling::solve(&i);
        assert!(d.new_claims[0].instance_types.iter().all(|t| t.name != "2XS"), "2XS must not even be a candidate");
    }

    fn worker(flavor: &str, cpu: &str, memory: &str, alloc_memory: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": format!("n-{flavor}"), "labels": {labels::CLEVER_FLAVOR: flavor}},
            "status": {
                "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                "allocatable": {"cpu": cpu, "memory": alloc_memory, "pods": "110"},
            }
        }))
        .unwrap()
    }

    #[test]
    fn observed_node_capacity_corrects_the_catalogue_and_absurd_reports_are_refused() {
        let mut i = input(vec![pool("default")], vec![pod("p", 1000, GI)]);
        let before = i.pools[0].instance_types.iter().find(|t| t.name == "XS").unwrap().allocatable;
        // An XS whose kubelet reports less allocatable memory than the catalogue assumed.
        let nodes = vec![worker("XS", "6", "7937580Ki", "6Gi"), worker("2XS", "400", "1Ti", "1Ti")];
        let refused = correct_from_nodes(&mut i, &nodes);
        let xs = i.pools[0].instance_types.iter().find(|t| t.name == "XS").unwrap();
        assert_eq!(xs.allocatable.memory_bytes, 6 * GI, "was {before:?}");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "2XS");
        let two_xs = i.pools[0].instance_types.iter().find(|t| t.name == "2XS").unwrap();
        assert!(two_xs.capacity.cpu_millis < 400_000, "the absurd report is not applied");
    }

    #[test]
    fn nothing_cooling_down_changes_nothing() {
        let mut i = input(vec![pool("default")], vec![pod("p", 1000, GI)]);
        let before = format!("{:?}", i.pools);
        mark_unavailable(&mut i, &BTreeSet::new());
        assert_eq!(before, format!("{:?}", i.pools));
    }
}
