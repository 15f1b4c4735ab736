//! The middle tier (docs/testing.md): a provisioning round's fact gathering and decision over
//! watch caches filled from watcher events, as the hub's reflectors fill them; no API server, no
//! task, no sleep. What a round would create is judged on the NodeClaims it builds; the creates,
//! events and metrics are the emulator tier's (tests/suite/scenarios.rs, tests/suite/provisioning.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;

use super::*;
use crate::infra::cache_fixture::{
    Caches,
    objects::{CLUSTER, NS, claim, class, key, node, pending_pod, pool, running_pod},
};
use crds::CleverNodeClass;
use scheduling::model::Settings;

fn now() -> Timestamp {
    "2026-11-25T12:00:00Z".parse().unwrap()
}

/// The namespace's `default` class (Ready) and `default` pool, listed; the workload cluster listed
/// with `pods`.
fn cluster_with(pods: Vec<scheduling::CompactPod>) -> Caches {
    let mut c = Caches::listed();
    c.list([class("default", true)]);
    c.list([pool("default", "default", json!({}))]);
    c.list(pods);
    c
}

fn gathered(c: &Caches) -> Gathered {
    gather_with(c, Settings::default())
}

/// [`gathered`] under the scheduler `settings`.
fn gather_with(c: &Caches, settings: Settings) -> Gathered {
    let hub = crate::infra::hub::Settings { scheduler: settings, ..Default::default() };
    gather(&c.mgmt(), &c.workload(), &key(), &Default::default(), &hub, "2026-11-25T12:00:00Z".parse().unwrap())
        .unwrap()
}

fn round_of(c: &Caches) -> Round {
    match gathered(c) {
        Gathered::Round(r) => *r,
        other => panic!("expected pods to place, got {other:?}"),
    }
}

/// The round decided under no CKE refusal.
fn solved(c: &Caches) -> (Round, Solved) {
    let mut round = round_of(c);
    match decide(&mut round, &key(), &CapacityState::default(), &[], now()) {
        Decided::Solved(s) => (round, *s),
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// Per NodeClaim the round would create: its pool, its cheapest flavor and the names of its pods.
fn planned(round: &Round, s: &Solved) -> Vec<(String, String, Vec<String>)> {
    s.claims
        .iter()
        .map(|(i, built)| {
            let nc = built.as_ref().unwrap();
            let claim = &s.decision.new_claims[*i];
            let pool = nc.labels().get(labels::NODEPOOL).cloned().unwrap_or_default();
            let flavor = claim.instance_types.first().map(|o| o.name.clone()).unwrap_or_default();
            let mut pods: Vec<String> = claim.pods.iter().map(|p| round.input.pods[*p].name.clone()).collect();
            pods.sort();
            (pool, flavor, pods)
        })
        .collect()
}

#[test]
fn pending_pods_of_a_ready_pool_get_the_cheapest_claim_that_holds_them() {
    let c = cluster_with(vec![pending_pod("web-0", "500m", "1Gi"), pending_pod("web-1", "500m", "1Gi")]);
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("default".into(), "2XS".into(), vec!["web-0".into(), "web-1".into()])]);
    assert!(s.decision.unschedulable.is_empty());
    // The claim as it would be created: for this cluster, in its namespace, named for its pods.
    let nc = s.claims[0].1.as_ref().unwrap();
    assert_eq!(nc.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(nc.spec.cluster_name, CLUSTER);
    assert!(nc.annotations().contains_key(labels::PROVISIONING_DIGEST), "a retried create finds its claim");
    let options: Vec<&str> = s.decision.new_claims[0].instance_types.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(options, ["2XS", "XS", "S", "M"], "the pool's flavors, cheapest first");
}

#[test]
fn a_pod_deleted_by_a_watch_event_is_no_longer_planned_and_a_new_one_is() {
    let mut c = cluster_with(vec![pending_pod("web-0", "500m", "1Gi"), pending_pod("web-1", "4", "1Gi")]);
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("default".into(), "XS".into(), vec!["web-0".into(), "web-1".into()])]);
    c.delete(pending_pod("web-1", "4", "1Gi"));
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("default".into(), "2XS".into(), vec!["web-0".into()])]);
    // kube-scheduler bound the last one meanwhile: nothing is left to place.
    c.apply(running_pod("web-0", "elsewhere", "500m", "1Gi", json!({})));
    assert!(matches!(gathered(&c), Gathered::NoPod { .. }), "{:?}", gathered(&c));
    c.apply(pending_pod("web-2", "500m", "5Gi"));
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("default".into(), "XS".into(), vec!["web-2".into()])]);
}

#[test]
fn a_pool_takes_part_only_while_its_node_class_is_ready_and_it_is_not_deleted() {
    let mut c = cluster_with(vec![pending_pod("web-0", "500m", "1Gi")]);
    c.apply(class("default", false));
    assert!(matches!(gathered(&c), Gathered::NoPool), "a class not Ready: {:?}", gathered(&c));
    c.apply(class("default", true));
    assert!(matches!(gathered(&c), Gathered::Round(_)));
    // Another cluster's pool, and this cluster's pool being deleted, take no part.
    c.apply(pool("default", "default", json!({"spec": {"clusterName": "beta"}})));
    assert!(matches!(gathered(&c), Gathered::NoPool), "another cluster's pool: {:?}", gathered(&c));
    c.apply(pool("default", "default", json!({"metadata": {"deletionTimestamp": "2026-11-25T11:00:00Z"}})));
    assert!(matches!(gathered(&c), Gathered::NoPool), "a deleted pool: {:?}", gathered(&c));
    c.delete(pool("default", "default", json!({})));
    c.apply(pool("spare", "default", json!({})));
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("spare".into(), "2XS".into(), vec!["web-0".into()])]);
}

#[test]
fn room_on_a_node_and_on_a_claim_in_flight_takes_pending_pods_before_a_new_claim() {
    let mut c =
        cluster_with(vec![running_pod("busy", "default-a1", "1", "1Gi", json!({})), pending_pod("web-0", "2", "2Gi")]);
    c.list([claim("default-a1", "default", "XS", true, &[])]);
    c.list([node("default-a1", "default", "XS")]);
    let (round, s) = solved(&c);
    assert!(planned(&round, &s).is_empty(), "the XS has 5 CPUs free");
    let on: Vec<(&str, Vec<&str>)> = s
        .decision
        .existing
        .iter()
        .map(|a| {
            (
                round.input.nodes[a.node].name.as_str(),
                a.pods.iter().map(|p| round.input.pods[*p].name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(on, [("default-a1", vec!["web-0"])]);
    // The node goes (its claim stays, in flight again): a claim without a node is sized by its
    // flavor and takes the pod as well.
    c.delete(node("default-a1", "default", "XS"));
    c.delete(running_pod("busy", "default-a1", "1", "1Gi", json!({})));
    c.apply(claim("default-a1", "default", "XS", false, &[]));
    let (round, s) = solved(&c);
    assert!(planned(&round, &s).is_empty(), "the claim in flight holds the pod: {:?}", planned(&round, &s));
    assert_eq!(s.decision.existing.len(), 1);
    // A pod too big for the XS needs a claim of its own.
    c.apply(pending_pod("big", "7", "2Gi"));
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s), [("default".into(), "S".into(), vec!["big".into()])]);
}

#[test]
fn nothing_is_decided_before_the_management_caches_have_listed() {
    let mut c = Caches::default();
    c.list(vec![pending_pod("web-0", "500m", "1Gi")]);
    // The management watches have started listing: what they hold is not yet in the stores.
    c.event(&kube::runtime::watcher::Event::<CleverNodeClass>::Init);
    c.event(&kube::runtime::watcher::Event::InitApply(class("default", true)));
    c.list([pool("default", "default", json!({}))]);
    c.list::<NodeClaim>([]);
    assert!(matches!(gathered(&c), Gathered::NotListed), "{:?}", gathered(&c));
    c.event(&kube::runtime::watcher::Event::<CleverNodeClass>::InitDone);
    assert!(matches!(gathered(&c), Gathered::NotListed), "the catalogues have not listed: {:?}", gathered(&c));
    c.list::<crds::FlavorCatalog>([]);
    assert!(matches!(gathered(&c), Gathered::Round(_)), "{:?}", gathered(&c));
}

#[test]
fn a_back_off_holds_every_claim_and_flavors_cooling_down_are_not_offered() {
    let c = cluster_with(vec![pending_pod("web-0", "500m", "1Gi")]);
    let mut capacity = CapacityState::default();
    let flavors = crds::catalog::Catalog::builtin().flavors;
    let ram = "Quota exceeded: RAM max: limit = 40.0 GB | actual = 44.0 GB";
    capacity.record_rejection("2XS", ram, &flavors, now(), crate::decisions::capacity::Policy::default());
    let mut round = round_of(&c);
    match decide(&mut round, &key(), &capacity, &[], now()) {
        Decided::BackingOff { left } => assert!(left > Duration::ZERO),
        other => panic!("expected the back-off, got {other:?}"),
    }
    // Past the back-off every flavor at least as large in memory as the refused 2XS still cools
    // down: none of the pool's is offered, and the pod waits.
    capacity.backoff_until = None;
    let mut round = round_of(&c);
    let Decided::Solved(s) = decide(&mut round, &key(), &capacity, &[], now()) else { panic!("expected a decision") };
    assert!(s.claims.is_empty(), "{:?}", planned(&round, &s));
    assert_eq!(s.decision.unschedulable.len(), 1);
    assert!(s.cooling.contains("2XS") && s.cooling.contains("M"), "{:?}", s.cooling);
}

#[test]
fn the_claims_of_another_cluster_of_the_namespace_hold_none_of_its_pods() {
    let mut c = cluster_with(vec![pending_pod("web-0", "500m", "1Gi")]);
    let mut other = claim("beta-x1", "default", "XS", false, &[]);
    other.spec.cluster_name = "beta".to_string();
    c.list([other]);
    let (round, s) = solved(&c);
    assert!(round.snapshot.node_claims.is_empty(), "only this cluster's claims are read");
    assert_eq!(planned(&round, &s), [("default".into(), "2XS".into(), vec!["web-0".into()])]);
}

/// The room an organisation leaves the cluster is a limit every pool draws on (fleet.md §4): the
/// round picks what fits, and with no room the pods wait with the organisation named.
#[test]
fn the_organisations_room_limits_the_round() {
    let c = cluster_with(vec![pending_pod("a", "3", "1Gi"), pending_pod("b", "3", "1Gi")]);
    let room =
        |cpu: i64| Ceiling { cpu_millis: Some(cpu * 1000), memory_bytes: Some(100_000_000_000), price_micros: None };
    // Unlimited, one XS (6 vCPU) holds both pods.
    let (round, s) = solved(&c);
    assert_eq!(planned(&round, &s).iter().map(|(_, f, _)| f.as_str()).collect::<Vec<_>>(), ["XS"]);
    // Four vCPU left: one 2XS for one pod, the other waits naming the organisation.
    let mut round = round_of(&c);
    let Decided::Solved(s) = decide(&mut round, &key(), &CapacityState::default(), &[("acme".into(), room(4))], now())
    else {
        panic!("expected a decision")
    };
    assert_eq!(planned(&round, &s).iter().map(|(_, f, _)| f.as_str()).collect::<Vec<_>>(), ["2XS"]);
    assert_eq!(s.decision.unschedulable.len(), 1);
    assert!(s.decision.unschedulable[0].reason.contains("organisation acme"), "{:?}", s.decision.unschedulable);
    // The pod held back puts the cluster in the organisation's line, for the node it would take
    // without the limit (a 2XS: 4 vCPU, 4 nominal GB), its pool and its pod's age.
    let want = s.waiting.expect("the cluster waits for room");
    assert_eq!((want.size.cpu_millis, want.size.memory_bytes), (4000, 4_000_000_000));
    assert_eq!(want.pools, ["default"]);
    let created = round.input.pods.iter().map(|p| p.created).min().unwrap();
    assert_eq!(want.since.as_second(), created);
    // No room at all: both pods wait, one node's worth owed (the XS that holds both).
    let mut round = round_of(&c);
    let Decided::Solved(s) = decide(&mut round, &key(), &CapacityState::default(), &[("acme".into(), room(0))], now())
    else {
        panic!("expected a decision")
    };
    assert!(s.claims.is_empty());
    assert_eq!(s.waiting.map(|w| w.size.cpu_millis), Some(6000));
    // Unlimited, or pods that wait for another reason: nobody is in line.
    assert_eq!(solved(&c).1.waiting, None);
    let big = cluster_with(vec![pending_pod("huge", "500", "1Gi")]);
    let mut round = round_of(&big);
    let Decided::Solved(s) = decide(&mut round, &key(), &CapacityState::default(), &[("acme".into(), room(0))], now())
    else {
        panic!("expected a decision")
    };
    assert_eq!(s.decision.unschedulable.len(), 1);
    assert_eq!(s.waiting, None, "no flavor holds the pod: the room is not what it waits for");
}

/// Issue 28 item 5: `--min-values-policy best-effort` in the hub as upstream. A pool asking for
/// three flavors at least, of which one can hold the pod: strict, the pod waits; best-effort, a
/// claim is made with the `minValues` lowered, and the claim says so.
#[test]
fn best_effort_lowers_a_min_values_the_flavors_cannot_meet_and_the_claim_says_so() {
    let mut c = cluster_with(vec![pending_pod("big", "10", "8Gi")]);
    c.list([pool(
        "default",
        "default",
        json!({"spec": {"template": {"spec": {"requirements": [
            {"key": "clever-cloud.com/flavor", "operator": "In", "values": ["2XS", "XS", "S", "M"], "minValues": 3}
        ]}}}}),
    )]);
    let (round, strict) = solved(&c);
    assert!(planned(&round, &strict).is_empty(), "only M holds 10 CPUs: below minValues 3");
    assert_eq!(strict.decision.unschedulable.len(), 1);

    let best_effort =
        Settings { min_values_policy: scheduling::model::MinValuesPolicy::BestEffort, ..Settings::default() };
    let Gathered::Round(mut round) = gather_with(&c, best_effort) else { panic!("pods to place") };
    let Decided::Solved(s) = decide(&mut round, &key(), &CapacityState::default(), &[], now()) else {
        panic!("expected a decision")
    };
    assert_eq!(planned(&round, &s), [("default".into(), "M".into(), vec!["big".into()])]);
    let nc = s.claims[0].1.as_ref().unwrap();
    assert_eq!(nc.annotations().get(labels::MIN_VALUES_RELAXED).map(String::as_str), Some("true"));
}
