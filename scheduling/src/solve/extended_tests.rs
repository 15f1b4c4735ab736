//! Extended resources (`nvidia.com/gpu`, ...), which flavors offer only through NodeOverlays'
//! `capacity`: a pod asking for one goes to a node or a claim whose flavor offers enough of it,
//! counted per node and per claim, and is refused with the resource named when nothing does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use crate::model::{Input, Pod, RunningPod};
use crate::solve;
use crate::testkit::*;

const GPU: &str = "nvidia.com/gpu";

fn gpu_pod(name: &str, gpus: i64) -> Pod {
    let mut p = pod(name, 500, 512 * MI);
    p.extended = BTreeMap::from([(GPU.to_string(), gpus)]);
    p
}

/// A pool whose M and L offer one GPU and XL two (as an overlay's capacity would).
fn gpu_pool() -> crate::model::Pool {
    let mut p = pool("gpu");
    for t in &mut p.instance_types {
        match t.name.as_str() {
            "M" | "L" => t.extended = BTreeMap::from([(GPU.to_string(), 1)]),
            "XL" => t.extended = BTreeMap::from([(GPU.to_string(), 2)]),
            _ => {}
        }
    }
    p
}

/// Every claim asks the sum of its pods' extended resources, and every option offers it.
fn assert_claims_offer(i: &Input, d: &crate::Decision) {
    for c in &d.new_claims {
        let mut sum: BTreeMap<String, i64> = BTreeMap::new();
        for &p in &c.pods {
            for (k, v) in &i.pods[p].extended {
                *sum.entry(k.clone()).or_insert(0) += v;
            }
        }
        assert_eq!(c.extended, sum, "{c:?}");
        let pool = i.pools.iter().find(|p| p.name == c.nodepool).unwrap();
        for o in &c.instance_types {
            let t = pool.instance_types.iter().find(|t| t.name == o.name).unwrap();
            assert!(crds::quantity::extended_fits(&sum, &t.extended), "{} lacks {sum:?}", o.name);
        }
    }
}

#[test]
fn a_gpu_pod_goes_to_the_cheapest_flavor_offering_a_gpu() {
    let i = input(vec![gpu_pool()], vec![gpu_pod("train", 1), pod("web", 500, 512 * MI)]);
    let d = solve(&i);
    let s = summary(&i, &d);
    assert!(s.unschedulable.is_empty(), "{:?}", d.unschedulable);
    // The small pod shares the GPU claim (it fits): one M, not an M and a 2XS.
    assert_eq!(s.claims, vec!["gpu:M"]);
    let options: Vec<&str> = d.new_claims[0].instance_types.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(options, ["M", "L", "XL"]);
    assert_claims_offer(&i, &d);
}

#[test]
fn gpus_are_counted_per_claim() {
    // Two one-GPU pods: one claim of a two-GPU flavor, or two of one GPU each; never two pods on
    // a one-GPU flavor.
    let i = input(vec![gpu_pool()], vec![gpu_pod("a", 1), gpu_pod("b", 1), gpu_pod("c", 2)]);
    let d = solve(&i);
    assert!(d.unschedulable.is_empty(), "{:?}", d.unschedulable);
    assert_claims_offer(&i, &d);
    let gpus: i64 = d.new_claims.iter().map(|c| c.extended[GPU]).sum();
    assert_eq!(gpus, 4);
}

#[test]
fn a_pod_asking_more_than_any_flavor_offers_is_refused_naming_the_resource() {
    let i = input(vec![gpu_pool()], vec![gpu_pod("big", 3)]);
    let d = solve(&i);
    let why = &d.unschedulable[0].reason;
    assert!(
        why.contains("no instance type offers nvidia.com/gpu=3") && why.contains("largest offered: nvidia.com/gpu=2"),
        "{why}"
    );
    // A pool whose flavors offer none: the reason says where extended resources come from.
    let i = input(vec![pool("plain")], vec![gpu_pod("train", 1)]);
    let why = &solve(&i).unschedulable[0].reason;
    assert!(
        why.contains("nodepool plain: no instance type offers nvidia.com/gpu=1") && why.contains("NodeOverlays"),
        "{why}"
    );
}

#[test]
fn existing_nodes_are_used_for_the_gpus_they_have_left() {
    let mut full = node_of(
        "full",
        "M",
        vec![RunningPod { extended: BTreeMap::from([(GPU.to_string(), 1)]), ..running("busy", 500, 512 * MI, &[]) }],
    );
    full.extended = BTreeMap::from([(GPU.to_string(), 1)]);
    let mut free = node_of("free", "XL", Vec::new());
    free.extended = BTreeMap::from([(GPU.to_string(), 2)]);
    let mut i = input(vec![gpu_pool()], vec![gpu_pod("a", 1), gpu_pod("b", 1), gpu_pod("c", 1)]);
    i.nodes = vec![full, free];
    let d = solve(&i);
    let s = summary(&i, &d);
    // "full" has room for CPU but not a GPU; "free" takes two; the third needs a new claim.
    assert_eq!(s.existing, vec![("free".to_string(), vec!["a".to_string(), "b".to_string()])]);
    assert_eq!(s.claims, vec!["gpu:M"]);
    assert_claims_offer(&i, &d);
}

#[test]
fn repacking_for_cost_keeps_gpu_pods_on_flavors_that_offer_them() {
    // Many small pods beside GPU pods: the cost repack moves the small ones only.
    let mut pods: Vec<Pod> = (0..12).map(|n| pod(&format!("w{n:02}"), 900, 900 * MI)).collect();
    pods.extend((0..3).map(|n| gpu_pod(&format!("g{n}"), 1)));
    let i = input(vec![gpu_pool()], pods);
    let d = solve(&i);
    assert!(d.unschedulable.is_empty(), "{:?}", d.unschedulable);
    assert_claims_offer(&i, &d);
}

#[test]
fn a_limit_on_an_extended_resource_caps_the_pool() {
    // M alone offers a GPU; the pool may have two, one of which a node already holds.
    let mut p = gpu_pool();
    for t in &mut p.instance_types {
        if t.name != "M" {
            t.extended.clear();
        }
    }
    p.limits.extended = BTreeMap::from([(GPU.to_string(), 2)]);
    p.usage.extended = BTreeMap::from([(GPU.to_string(), 1)]);
    let i = input(vec![p], vec![gpu_pod("a", 1), gpu_pod("b", 1), pod("web", 500, 512 * MI)]);
    let d = solve(&i);
    let s = summary(&i, &d);
    assert_eq!(s.claims.iter().filter(|c| *c == "gpu:M").count(), 1, "{s:?}");
    assert_eq!(s.unschedulable.len(), 1, "{s:?}");
    let why = &d.unschedulable[0].reason;
    assert!(
        why.contains("no instance type offers nvidia.com/gpu=1")
            && why.contains("its limits exclude the others: remaining limits nvidia.com/gpu=0"),
        "{why}"
    );
    // Pods asking for no GPU still get nodes: types without one are within the limit.
    assert!(!s.unschedulable.contains(&"web".to_string()));
    assert_claims_offer(&i, &d);
}
