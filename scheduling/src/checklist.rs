//! The provisioning items of the acceptance checklist (karpenter-semantics §10.3–§10.6), one test
//! each, numbered as there. Items about pod filtering (§10.2 33–36) and deleting nodes (89, 90) are
//! tested in [`crate::convert`], where those decisions live.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::model::{
    Limits, MinValuesPolicy, NodeInclusionPolicy, Operator, PreferencePolicy, TaintEffect, WeightedNodeTerm,
    WeightedPodAffinityTerm, WhenUnsatisfiable,
};
use crate::solve;
use crate::testkit::*;
use crds::labels::{CLEVER_FLAVOR, HOSTNAME, INSTANCE_TYPE, ZONE};

const ANYWAY: WhenUnsatisfiable = WhenUnsatisfiable::ScheduleAnyway;
const HARD: WhenUnsatisfiable = WhenUnsatisfiable::DoNotSchedule;

fn run(input: &crate::Input) -> (crate::Decision, Summary) {
    let d = solve(input);
    let s = summary(input, &d);
    (d, s)
}

fn reason(d: &crate::Decision) -> String {
    d.unschedulable.first().map(|u| u.reason.clone()).unwrap_or_default()
}

fn options(d: &crate::Decision, claim: usize) -> Vec<String> {
    d.new_claims[claim].instance_types.iter().map(|o| o.name.clone()).collect()
}

fn req_values(d: &crate::Decision, claim: usize, key: &str) -> Vec<String> {
    d.new_claims[claim].requirements.iter().filter(|r| r.key == key).flat_map(|r| r.values.clone()).collect()
}

// ---- §10.3 Requirements, affinity, weights --------------------------------------------------------

#[test]
fn c37_template_label_selected_by_pods() {
    let mut p = pool("default");
    p.labels = labels_of(&[("team", "a")]);
    let a = with(pod("a", 100, 0), |c| c.node_selector = labels_of(&[("team", "a")]));
    let b = with(pod("b", 100, 0), |c| c.node_selector = labels_of(&[("team", "b")]));
    let i = input(vec![p], vec![a, b]);
    let (d, s) = run(&i);
    assert_eq!(s.claim_pods, vec![vec!["a"]]);
    assert_eq!(d.new_claims[0].labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(s.unschedulable, vec!["b"]);
}

#[test]
fn c38_unknown_custom_key_is_named() {
    let i =
        input(vec![pool("default")], vec![with(pod("a", 100, 0), |c| c.node_selector = labels_of(&[("gpu", "yes")]))]);
    let (d, s) = run(&i);
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("gpu"), "{}", reason(&d));
    assert!(reason(&d).contains("no known values"), "{}", reason(&d));
}

#[test]
fn c39_negative_requirements_on_unknown_keys_are_fine() {
    for op in [Operator::NotIn, Operator::DoesNotExist] {
        let values: &[&str] = if op == Operator::NotIn { &["yes"] } else { &[] };
        let p = with(pod("a", 100, 0), |c| c.required_terms = vec![vec![req("gpu", op, values)]]);
        let (_, s) = run(&input(vec![pool("default")], vec![p]));
        assert_eq!(s.claims.len(), 1, "{op:?}");
    }
}

#[test]
fn c40_well_known_zone_selected_when_pool_is_silent() {
    let p = with(pod("a", 100, 0), |c| c.node_selector = labels_of(&[(ZONE, "par")]));
    let (d, s) = run(&input(vec![pool("default")], vec![p]));
    assert_eq!(s.claims.len(), 1);
    assert_eq!(req_values(&d, 0, ZONE), vec!["par"]);
}

#[test]
fn c41_impossible_zone_or_arch() {
    for (k, v) in [(ZONE, "mars"), ("kubernetes.io/arch", "arm64")] {
        let p = with(pod("a", 100, 0), |c| c.required_terms = vec![vec![req(k, Operator::In, &[v])]]);
        let (d, s) = run(&input(vec![pool("default")], vec![p]));
        assert!(s.claims.is_empty(), "{k}");
        assert!(!reason(&d).is_empty());
    }
}

#[test]
fn c42_gt_on_template_label() {
    let mut p = pool("default");
    p.labels = labels_of(&[("tier", "5")]);
    let a = with(pod("a", 100, 0), |c| c.required_terms = vec![vec![req("tier", Operator::Gt, &["3"])]]);
    let b = with(pod("b", 100, 0), |c| c.required_terms = vec![vec![req("tier", Operator::Gt, &["7"])]]);
    let (_, s) = run(&input(vec![p], vec![a, b]));
    assert_eq!(s.claim_pods, vec![vec!["a"]]);
    assert_eq!(s.unschedulable, vec!["b"]);
}

#[test]
fn c43_exists_picks_one_value_for_the_label() {
    let mut p = pool("default");
    p.requirements = vec![req("tier", Operator::In, &["gold", "silver"])];
    let a = with(pod("a", 100, 0), |c| c.required_terms = vec![vec![req("tier", Operator::Exists, &[])]]);
    let (d, _) = run(&input(vec![p], vec![a]));
    assert_eq!(d.new_claims[0].labels.get("tier").map(String::as_str), Some("gold"));
}

#[test]
fn c44_not_in_excludes_a_flavor() {
    let mut p = pool("default");
    p.requirements = vec![req(INSTANCE_TYPE, Operator::NotIn, &["2XS"])];
    let (d, s) = run(&input(vec![p], vec![pod("a", 1000, 0)]));
    assert_eq!(s.claims, vec!["default:XS"]);
    assert!(!options(&d, 0).contains(&"2XS".to_string()));
}

#[test]
fn c45_weights_then_name_descending() {
    let mut low = pool("low");
    low.weight = 10;
    let mut high = pool("high");
    high.weight = 50;
    let (_, s) = run(&input(vec![low, high], vec![pod("a", 100, 0)]));
    assert_eq!(s.claims, vec!["high:2XS"]);
    let (_, s) = run(&input(vec![pool("a"), pool("b")], vec![pod("a", 100, 0)]));
    assert_eq!(s.claims, vec!["b:2XS"]);
}

#[test]
fn c46_weighted_pool_at_its_limits_falls_back() {
    let mut low = pool("low");
    low.weight = 10;
    let mut high = pool("high");
    high.weight = 50;
    high.limits = Limits { nodes: Some(1), ..Limits::default() };
    high.usage.nodes = 1;
    let (_, s) = run(&input(vec![low, high], vec![pod("a", 100, 0)]));
    assert_eq!(s.claims, vec!["low:2XS"]);
}

#[test]
fn c47_required_terms_are_ored() {
    let p = with(pod("a", 100, 0), |c| {
        c.required_terms = vec![vec![req(ZONE, Operator::In, &["mars"])], vec![req(ZONE, Operator::In, &["par"])]]
    });
    let (d, s) = run(&input(vec![pool("default")], vec![p]));
    assert_eq!(s.claims.len(), 1);
    assert_eq!(req_values(&d, 0, ZONE), vec!["par"]);
    let p = with(pod("a", 100, 0), |c| c.required_terms = vec![vec![req(ZONE, Operator::In, &["mars"])]]);
    let (_, s) = run(&input(vec![pool("default")], vec![p]));
    assert!(s.claims.is_empty());
}

#[test]
fn c48_preferred_terms_relax_by_weight() {
    let p = with(pod("a", 100, 0), |c| {
        c.preferred_terms = vec![
            WeightedNodeTerm { weight: 50, requirements: vec![req(ZONE, Operator::In, &["mars"])] },
            WeightedNodeTerm { weight: 10, requirements: vec![req(ZONE, Operator::In, &["par"])] },
        ]
    });
    let (d, s) = run(&input(vec![pool("default")], vec![p]));
    assert_eq!(s.claims.len(), 1);
    assert_eq!(req_values(&d, 0, ZONE), vec!["par"]);
}

#[test]
fn c49_prefer_no_schedule_pool_avoided_until_relaxed() {
    let mut a = pool("a");
    a.weight = 100;
    a.taints = vec![taint("x", None, TaintEffect::PreferNoSchedule)];
    let b = pool("b");
    let (_, s) = run(&input(vec![a.clone(), b], vec![pod("p", 100, 0)]));
    assert_eq!(s.claims, vec!["b:2XS"]);
    let (_, s) = run(&input(vec![a], vec![pod("p", 100, 0)]));
    assert_eq!(s.claims, vec!["a:2XS"]);
}

#[test]
fn c50_preferred_self_anti_affinity_respect_and_ignore() {
    let pods: Vec<_> = (0..3)
        .map(|i| {
            let mut p = with(pod(&format!("p{i}"), 100, 0), |c| {
                c.preferred_pod_anti_affinity =
                    vec![WeightedPodAffinityTerm { weight: 10, term: term(HOSTNAME, &[("app", "web")]) }]
            });
            p.labels = labels_of(&[("app", "web")]);
            p
        })
        .collect();
    let mut i = input(vec![pool("default")], pods);
    let (_, s) = run(&i);
    assert_eq!(s.claims.len(), 3);
    i.settings.preference_policy = PreferencePolicy::Ignore;
    let (_, s) = run(&i);
    assert_eq!(s.claims.len(), 1);
}

#[test]
fn c51_preferred_node_affinity_after_absent_pod_affinity() {
    let mut p = pool("default");
    p.requirements = vec![req("team", Operator::In, &["a", "b"])];
    let x = with(pod("x", 100, 0), |c| {
        c.preferred_pod_affinity =
            vec![WeightedPodAffinityTerm { weight: 10, term: term(HOSTNAME, &[("app", "nowhere")]) }];
        c.preferred_terms = vec![WeightedNodeTerm { weight: 1, requirements: vec![req("team", Operator::In, &["b"])] }];
    });
    let (d, _) = run(&input(vec![p], vec![x]));
    assert_eq!(d.new_claims[0].labels.get("team").map(String::as_str), Some("b"));
}

// ---- §10.4 Topology and taints --------------------------------------------------------------------

fn web(name: &str, f: impl FnOnce(&mut crate::model::Constraints)) -> crate::model::Pod {
    let mut p = with(pod(name, 100, 0), f);
    p.labels = labels_of(&[("app", "web")]);
    p
}

fn zone_pool() -> crate::model::Pool {
    let mut p = pool("default");
    p.instance_types = flavors_3_zones();
    p
}

#[test]
fn c52_zone_spread_one_zone_and_three_zones() {
    let pods = || {
        (0..3)
            .map(|i| web(&format!("p{i}"), |c| c.topology_spread = vec![spread(ZONE, 1, HARD, &[("app", "web")])]))
            .collect::<Vec<_>>()
    };
    let (_, s) = run(&input(vec![pool("default")], pods()));
    assert_eq!(s.claims.len(), 1);
    assert_eq!(s.claim_pods[0].len(), 3);
    let (d, s) = run(&input(vec![zone_pool()], pods()));
    assert_eq!(s.claims.len(), 3);
    let mut zones: Vec<Vec<String>> = (0..3).map(|c| req_values(&d, c, ZONE)).collect();
    zones.sort();
    assert_eq!(zones, vec![vec!["a"], vec!["b"], vec!["c"]]);
}

#[test]
fn c53_hostname_spread() {
    for (skew, claims) in [(1, 4), (2, 2)] {
        let pods = (0..4)
            .map(|i| {
                web(&format!("p{i}"), |c| c.topology_spread = vec![spread(HOSTNAME, skew, HARD, &[("app", "web")])])
            })
            .collect();
        let (_, s) = run(&input(vec![pool("default")], pods));
        assert_eq!(s.claims.len(), claims, "maxSkew {skew}");
    }
}

#[test]
fn c54_min_domains() {
    for (when, placed) in [(HARD, 1), (ANYWAY, 2)] {
        let pods = (0..2)
            .map(|i| {
                web(&format!("p{i}"), |c| {
                    let mut sc = spread(ZONE, 1, when, &[("app", "web")]);
                    sc.min_domains = Some(3);
                    c.topology_spread = vec![sc];
                })
            })
            .collect();
        let (_, s) = run(&input(vec![pool("default")], pods));
        assert_eq!(s.claim_pods.iter().map(Vec::len).sum::<usize>(), placed, "{when:?}");
    }
}

#[test]
fn c55_pinned_away_from_a_crowded_zone() {
    let mut i = input(
        vec![zone_pool()],
        vec![web("new", |c| c.topology_spread = vec![spread(ZONE, 1, HARD, &[("app", "web")])])],
    );
    let mut n =
        node_of("n-a", "XL", vec![running("w1", 0, 0, &[("app", "web")]), running("w2", 0, 0, &[("app", "web")])]);
    n.labels.insert(ZONE.into(), "a".into());
    n.taints = vec![taint("full", None, TaintEffect::NoSchedule)];
    i.nodes = vec![n];
    let (d, s) = run(&i);
    assert_eq!(s.claims.len(), 1);
    let z = req_values(&d, 0, ZONE);
    assert!(z == vec!["b"] || z == vec!["c"], "{z:?}");
}

#[test]
fn c56_node_taints_policy() {
    for (policy, placed) in [(NodeInclusionPolicy::Honor, 4), (NodeInclusionPolicy::Ignore, 2)] {
        let mut ab = pool("ab");
        ab.instance_types = flavors_3_zones();
        ab.requirements = vec![req(ZONE, Operator::In, &["a", "b"])];
        let mut c = pool("c");
        c.instance_types = flavors_3_zones();
        c.requirements = vec![req(ZONE, Operator::In, &["c"])];
        c.taints = vec![taint("dedicated", Some("x"), TaintEffect::NoSchedule)];
        let pods = (0..4)
            .map(|i| {
                web(&format!("p{i}"), |k| {
                    let mut sc = spread(ZONE, 1, HARD, &[("app", "web")]);
                    sc.node_taints_policy = policy;
                    k.topology_spread = vec![sc];
                })
            })
            .collect();
        let (_, s) = run(&input(vec![ab, c], pods));
        assert_eq!(s.claim_pods.iter().map(Vec::len).sum::<usize>(), placed, "{policy:?}");
    }
}

#[test]
fn c57_match_label_keys_spread_revisions_independently() {
    let pods = (0..4)
        .map(|i| {
            let mut p = with(pod(&format!("p{i}"), 100, 0), |c| {
                let mut sc = spread(HOSTNAME, 1, HARD, &[("app", "web")]);
                sc.match_label_keys = vec!["pod-template-hash".into()];
                c.topology_spread = vec![sc];
            });
            p.labels = labels_of(&[("app", "web"), ("pod-template-hash", if i < 2 { "one" } else { "two" })]);
            p
        })
        .collect();
    let (_, s) = run(&input(vec![pool("default")], pods));
    // Each revision has 2 pods spread over 2 hosts; the two revisions share hosts.
    assert_eq!(s.claims.len(), 2);
}

#[test]
fn c58_required_hostname_self_anti_affinity() {
    let pods = (0..3)
        .map(|i| web(&format!("p{i}"), |c| c.pod_anti_affinity = vec![term(HOSTNAME, &[("app", "web")])]))
        .collect();
    let (_, s) = run(&input(vec![pool("default")], pods));
    assert_eq!(s.claims.len(), 3);
}

#[test]
fn c59_affinity_to_absent_pods() {
    let p = with(pod("a", 100, 0), |c| c.pod_affinity = vec![term(HOSTNAME, &[("app", "db")])]);
    let (d, s) = run(&input(vec![pool("default")], vec![p]));
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("pod affinity"), "{}", reason(&d));
}

#[test]
fn c60_zonal_self_affinity_in_one_zone() {
    let pods = (0..5)
        .map(|i| {
            let mut p = web(&format!("p{i}"), |c| c.pod_affinity = vec![term(ZONE, &[("app", "web")])]);
            p.requests = res(6000, 0);
            p
        })
        .collect();
    let (d, s) = run(&input(vec![zone_pool()], pods));
    assert_eq!(s.unschedulable, Vec::<String>::new());
    let zones: std::collections::BTreeSet<Vec<String>> =
        (0..d.new_claims.len()).map(|c| req_values(&d, c, ZONE)).collect();
    assert_eq!(zones.len(), 1, "{zones:?}");
}

#[test]
fn c61_running_pods_anti_affinity_applies_in_reverse() {
    let mut guard = running("guard", 0, 0, &[("app", "guard")]);
    guard.anti_affinity = vec![term(ZONE, &[("app", "web")])];
    let mut n = node_of("n-a", "XL", vec![guard]);
    n.labels.insert(ZONE.into(), "a".into());
    n.taints = vec![taint("full", None, TaintEffect::NoSchedule)];
    let pods = (0..3).map(|i| web(&format!("p{i}"), |_| {})).collect();
    let mut i = input(vec![zone_pool()], pods);
    i.nodes = vec![n];
    let (d, s) = run(&i);
    assert!(!s.claims.is_empty());
    for c in 0..d.new_claims.len() {
        assert!(!req_values(&d, c, ZONE).contains(&"a".to_string()), "{:?}", req_values(&d, c, ZONE));
    }
}

#[test]
fn c62_terminal_pods_not_counted() {
    let mut done = running("done", 0, 0, &[("app", "web")]);
    done.counted = false;
    let mut n = node_of("n1", "XL", vec![done]);
    n.taints = vec![taint("full", None, TaintEffect::NoSchedule)];
    // With the finished pod counted on n1 (a hostname domain at 1), maxSkew 1 would still admit new
    // hosts; use zones: the finished pod in zone a must not push the new pod out of a.
    n.labels.insert(ZONE.into(), "a".into());
    let mut p = zone_pool();
    p.requirements = vec![req(ZONE, Operator::In, &["a"])];
    let mut i = input(vec![p], vec![web("p", |c| c.topology_spread = vec![spread(ZONE, 1, HARD, &[("app", "web")])])]);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    assert_eq!(s.claims.len(), 1);
}

#[test]
fn c63_untolerated_pool_taint() {
    let mut p = pool("default");
    p.taints = vec![taint("dedicated", Some("x"), TaintEffect::NoSchedule)];
    let (d, s) = run(&input(vec![p], vec![pod("a", 100, 0)]));
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("dedicated=x:NoSchedule"), "{}", reason(&d));
}

#[test]
fn c64_startup_taints_need_no_toleration() {
    let mut p = pool("default");
    p.startup_taints = vec![taint("init", Some("1"), TaintEffect::NoSchedule)];
    let (d, s) = run(&input(vec![p], vec![pod("a", 100, 0)]));
    assert_eq!(s.claims.len(), 1);
    assert_eq!(d.new_claims[0].startup_taints[0].key, "init");
}

#[test]
fn c65_uninitialized_node_ephemeral_taints_ignored() {
    let mut n = node_of("n1", "XS", vec![]);
    n.managed = true;
    n.initialized = false;
    n.taints = vec![taint("node.kubernetes.io/not-ready", None, TaintEffect::NoExecute)];
    let mut i = input(vec![pool("default")], vec![pod("a", 1000, 0)]);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    assert!(s.claims.is_empty());
    assert_eq!(s.existing, vec![("n1".to_string(), vec!["a".to_string()])]);
}

#[test]
fn c66_initialized_node_with_startup_taint_refuses() {
    let mut n = node_of("n1", "XS", vec![]);
    n.managed = true;
    n.initialized = true;
    n.taints = vec![taint("init", Some("1"), TaintEffect::NoSchedule)];
    n.startup_taints = n.taints.clone();
    let mut i = input(vec![pool("default")], vec![pod("a", 1000, 0)]);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    assert!(s.existing.is_empty());
    assert_eq!(s.claims.len(), 1);
}

// ---- §10.5 Resources, DaemonSets, flavors ---------------------------------------------------------

#[test]
fn c67_five_gi_pod() {
    let (d, s) = run(&input(vec![pool("default")], vec![pod("a", 0, 5 * GI)]));
    assert_eq!(s.claims, vec!["default:XS"]);
    assert_eq!(options(&d, 0), vec!["XS", "S", "M", "L", "XL"]);
}

#[test]
fn c68_allocatable_not_capacity() {
    let (_, s) = run(&input(vec![pool("default")], vec![pod("a", 0, 36 * GI / 10)]));
    assert_eq!(s.claims, vec!["default:2XS"]);
    let (_, s) = run(&input(vec![pool("default")], vec![pod("a", 0, 37 * GI / 10)]));
    assert_eq!(s.claims, vec!["default:XS"]);
}

#[test]
fn c69_daemonset_overhead_moves_to_a_bigger_flavor() {
    let (_, s) = run(&input(vec![pool("default")], vec![pod("a", 4000, 0)]));
    assert_eq!(s.claims, vec!["default:2XS"]);
    let mut i = input(vec![pool("default")], vec![pod("a", 4000, 0)]);
    i.daemonsets = vec![crate::model::DaemonSet {
        namespace: "kube-system".into(),
        name: "agent".into(),
        pod: pod("agent", 100, 0),
    }];
    let (_, s) = run(&i);
    assert_eq!(s.claims, vec!["default:XS"]);
}

#[test]
fn c70_too_big_names_resources() {
    let (d, s) = run(&input(vec![pool("default")], vec![pod("a", 17000, 0)]));
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("resources"), "{}", reason(&d));
    assert!(reason(&d).contains("cpu=17"), "{}", reason(&d));
}

#[test]
fn c71_one_xs_beats_two_2xs() {
    let (d, s) = run(&input(vec![pool("default")], vec![pod("a", 3000, 0), pod("b", 3000, 0)]));
    assert_eq!(s.claims, vec!["default:XS"]);
    assert!((d.total_price() - 0.0611).abs() < 1e-9);
}

#[test]
fn c76_pods_per_node() {
    let pods = (0..111).map(|i| pod(&format!("p{i}"), 10, 10 * MI)).collect();
    let (_, s) = run(&input(vec![pool("default")], pods));
    assert_eq!(s.claims.len(), 2);
}

#[test]
fn c77_daemonsets_that_would_not_run_add_nothing() {
    let mut p = pool("default");
    p.taints = vec![taint("dedicated", Some("x"), TaintEffect::NoSchedule)];
    let tolerating = with(pod("a", 4000, 0), |c| c.tolerations = vec![toleration("dedicated", Some("x"))]);
    let ds_selecting = crate::model::DaemonSet {
        namespace: "kube-system".into(),
        name: "gpu".into(),
        pod: with(pod("gpu", 1000, 0), |c| {
            c.node_selector = labels_of(&[("gpu", "yes")]);
            c.tolerations = vec![toleration("dedicated", None)];
        }),
    };
    let ds_intolerant =
        crate::model::DaemonSet { namespace: "kube-system".into(), name: "agent".into(), pod: pod("agent", 1000, 0) };
    let mut i = input(vec![p], vec![tolerating]);
    i.daemonsets = vec![ds_selecting, ds_intolerant];
    let (d, s) = run(&i);
    assert_eq!(s.claims, vec!["default:2XS"]);
    assert_eq!(d.new_claims[0].requests.cpu_millis, 4000);
}

#[test]
fn c78_daemonset_overhead_once_per_claim() {
    let mut i = input(vec![pool("default")], (0..3).map(|n| pod(&format!("p{n}"), 100, 100 * MI)).collect());
    i.daemonsets = vec![crate::model::DaemonSet {
        namespace: "kube-system".into(),
        name: "agent".into(),
        pod: pod("agent", 0, 200 * MI),
    }];
    let (d, s) = run(&i);
    assert_eq!(s.claims.len(), 1);
    assert_eq!(d.new_claims[0].requests.memory_bytes, 500 * MI);
    assert_eq!(d.new_claims[0].requests.pods, 4);
}

#[test]
fn c79_host_ports() {
    let p = |n: &str, proto: &str| with(pod(n, 100, 0), |c| c.host_ports = vec![host_port(8080, proto)]);
    let (_, s) = run(&input(vec![pool("default")], vec![p("a", "TCP"), p("b", "TCP")]));
    assert_eq!(s.claims.len(), 2);
    let (_, s) = run(&input(vec![pool("default")], vec![p("a", "TCP"), p("b", "UDP")]));
    assert_eq!(s.claims.len(), 1);
}

// ---- §10.6 Limits, minValues, existing capacity ---------------------------------------------------

fn limited(cpu: i64, existing_2xs: bool) -> (crate::model::Pool, Vec<crate::model::ExistingNode>) {
    let mut p = pool("default");
    p.limits = Limits { cpu_millis: Some(cpu), ..Limits::default() };
    let mut nodes = Vec::new();
    if existing_2xs {
        let mut n = node_of("n1", "2XS", vec![running("busy", 4000, 0, &[])]);
        n.managed = true;
        n.nodepool = Some("default".into());
        p.usage.resources = n.capacity;
        p.usage.nodes = 1;
        nodes.push(n);
    }
    (p, nodes)
}

#[test]
fn c80_cpu_limit_refuses() {
    let (p, nodes) = limited(10_000, true);
    let mut i = input(vec![p], vec![pod("a", 7000, 0)]);
    i.nodes = nodes;
    let (d, s) = run(&i);
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("limits"), "{}", reason(&d));
}

#[test]
fn c81_cpu_limit_narrows_options() {
    let (p, nodes) = limited(10_000, true);
    let mut i = input(vec![p], vec![pod("a", 5000, 0)]);
    i.nodes = nodes;
    let (d, _) = run(&i);
    assert_eq!(options(&d, 0), vec!["XS"]);
}

#[test]
fn c82_node_limit_is_strict_within_a_round() {
    let mut p = pool("default");
    p.limits = Limits { nodes: Some(2), ..Limits::default() };
    p.usage.nodes = 1;
    let mut n = node_of("n1", "2XS", vec![]);
    n.taints = vec![taint("full", None, TaintEffect::NoSchedule)];
    let pods = (0..3)
        .map(|i| web(&format!("p{i}"), |c| c.pod_anti_affinity = vec![term(HOSTNAME, &[("app", "web")])]))
        .collect();
    let mut i = input(vec![p], pods);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    assert_eq!(s.claims.len(), 1);
    assert_eq!(s.unschedulable.len(), 2);
}

#[test]
fn c83_memory_limit() {
    let mut p = pool("default");
    p.limits = Limits { memory_bytes: Some(8 * GI), ..Limits::default() };
    let pods = (0..2)
        .map(|i| {
            let mut x = web(&format!("p{i}"), |c| c.pod_anti_affinity = vec![term(HOSTNAME, &[("app", "web")])]);
            x.requests = res(0, GI);
            x
        })
        .collect();
    // Karpenter's loop: the first claim is charged its largest option (an XS, 7.6Gi of the 8Gi),
    // the second anti-affine pod stays pending.
    let i = input(vec![p], pods);
    let plain = crate::Input { settings: crate::model::Settings { repack: false, ..Default::default() }, ..i.clone() };
    let (d, s) = run(&plain);
    assert_eq!(s.claims.len(), 1);
    assert_eq!(options(&d, 0), vec!["2XS", "XS"]);
    assert_eq!(s.unschedulable.len(), 1);
    // Hub decision (limits as part of the packing, issue 14): two 2XS (7.5Gi) hold both.
    let (_, s) = run(&i);
    assert_eq!(s.claims, vec!["default:2XS", "default:2XS"]);
    assert!(s.unschedulable.is_empty());
}

fn min_values_pool() -> crate::model::Pool {
    let mut p = pool("default");
    let mut r = req(INSTANCE_TYPE, Operator::Exists, &[]);
    r.min_values = Some(3);
    p.requirements = vec![r];
    p
}

#[test]
fn c84_min_values_strict() {
    let (d, s) = run(&input(vec![min_values_pool()], vec![pod("a", 0, 20 * GI)]));
    assert!(s.claims.is_empty());
    assert!(reason(&d).contains("minValues"), "{}", reason(&d));
}

#[test]
fn c85_min_values_best_effort() {
    let mut i = input(vec![min_values_pool()], vec![pod("a", 0, 20 * GI)]);
    i.settings.min_values_policy = MinValuesPolicy::BestEffort;
    let (d, _) = run(&i);
    assert_eq!(options(&d, 0), vec!["L", "XL"]);
    assert!(d.new_claims[0].min_values_relaxed);
    let it = d.new_claims[0].requirements.iter().find(|r| r.key == INSTANCE_TYPE).unwrap();
    assert_eq!(it.min_values, Some(2));
}

#[test]
fn c86_truncation_to_600_cheapest() {
    let base = flavors()[0].clone();
    let types = (0..700)
        .map(|i| {
            let mut t = base.clone();
            t.name = format!("T{i:03}");
            t.labels.insert(INSTANCE_TYPE.into(), t.name.clone());
            t.labels.insert(CLEVER_FLAVOR.into(), t.name.clone());
            t.offerings[0].price_hourly = 1.0 + f64::from(699 - i) / 1000.0;
            t
        })
        .collect();
    let mut p = pool("default");
    p.instance_types = types;
    let (d, _) = run(&input(vec![p], vec![pod("a", 100, 0)]));
    let o = &d.new_claims[0].instance_types;
    assert_eq!(o.len(), 600);
    assert!(o.windows(2).all(|w| w[0].price <= w[1].price));
    assert_eq!(o[0].name, "T699");
    assert_eq!(req_values(&d, 0, crds::labels::CAPACITY_TYPE), vec!["on-demand"]);
}

#[test]
fn c87_existing_room_first() {
    let mut i = input(vec![pool("default")], vec![pod("a", 1000, 0)]);
    i.nodes = vec![node_of("n1", "2XS", vec![running("busy", 2000, 0, &[])])];
    let (_, s) = run(&i);
    assert!(s.claims.is_empty());
    assert_eq!(s.existing, vec![("n1".to_string(), vec!["a".to_string()])]);
}

#[test]
fn c88_in_flight_claim_counts() {
    let mut n = node_of("claim-1", "XS", vec![]);
    n.managed = true;
    n.initialized = false;
    n.taints = vec![taint("karpenter.sh/unregistered", None, TaintEffect::NoExecute)];
    let mut i = input(vec![pool("default")], vec![pod("a", 1000, 0)]);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    assert!(s.claims.is_empty());
}

#[test]
fn c91_unmanaged_node_with_room() {
    let mut i = input(vec![pool("default")], vec![pod("a", 1000, 0)]);
    i.nodes = vec![node_of("control-plane-0", "S", vec![])];
    let (_, s) = run(&i);
    assert!(s.claims.is_empty());
    assert_eq!(s.existing.len(), 1);
}

// ---- §3.12 CSI attach limits (no numbered item) -------------------------------------------------

#[test]
fn csi_attach_limits_of_existing_nodes() {
    let mut r = running("db-0", 100, 0, &[]);
    r.csi_volumes = vec![("csi.example".into(), "default/a".into())];
    let mut n = node_of("n1", "XL", vec![r]);
    n.csi_limits = [("csi.example".to_string(), 1)].into();
    let mut shared = pod("shares-a", 100, 0);
    shared.csi_volumes = vec![("csi.example".into(), "default/a".into())];
    let mut other = pod("needs-b", 100, 0);
    other.csi_volumes = vec![("csi.example".into(), "default/b".into())];
    let mut i = input(vec![pool("default")], vec![shared, other]);
    i.nodes = vec![n];
    let (_, s) = run(&i);
    // A claim already attached counts once; a second one exceeds the limit.
    assert_eq!(s.existing, vec![("n1".to_string(), vec!["shares-a".to_string()])]);
    assert_eq!(s.claim_pods, vec![vec!["needs-b"]]);
}
