//! Shared limits (an organisation's quota across pools, a pool's price ceiling), on the built-in
//! flavors: 2XS 4 CPU 0.0333, XS 6 CPU 0.0611, S 8 CPU 0.0889, M 10 CPU 0.1167, L 12, XL 16 (EUR/h).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{describe_left, format_eur};
use crate::model::{Draw, Headroom, Input, Limits, Operator, Settings};
use crate::solve;
use crate::testkit::*;
use crds::labels::INSTANCE_TYPE;

fn pods(n: usize, cpu: i64) -> Vec<crate::model::Pod> {
    (0..n).map(|i| pod(&format!("p{i:02}"), cpu, 256 * MI)).collect()
}

fn cpu_left(millis: i64) -> Headroom {
    Headroom { cpu_millis: Some(millis), ..Headroom::default() }
}

fn price_left(micros: i64) -> Headroom {
    Headroom { price_micros: Some(micros), ..Headroom::default() }
}

fn with_shared(mut i: Input, shared: Vec<crate::model::SharedLimit>) -> Input {
    i.shared = shared;
    i
}

/// Every limited dimension of every shared limit holds what the new claims draw (each its largest
/// option), and the decision reports exactly that.
fn assert_within(i: &Input, d: &crate::Decision) {
    let drawn = drawn(i, d);
    assert_eq!(d.shared_drawn, drawn);
    for (l, got) in i.shared.iter().zip(&drawn) {
        let r = &l.remaining;
        assert!(r.cpu_millis.is_none_or(|m| got.cpu_millis <= m), "{}: cpu {got:?}", l.name);
        assert!(r.memory_bytes.is_none_or(|m| got.memory_bytes <= m), "{}: memory {got:?}", l.name);
        assert!(r.price_micros.is_none_or(|m| got.price_micros <= m), "{}: price {got:?}", l.name);
    }
}

#[test]
fn a_shared_limit_makes_the_round_pick_a_smaller_type() {
    // Three pods of 2.5 CPU: one S holds them. With 6 CPU left in the organisation, only a 2XS or
    // an XS may open: the XS takes two, the third waits, its reason naming the organisation.
    let base = input(vec![pool("default")], pods(3, 2500));
    assert_eq!(summary(&base, &solve(&base)).claims, vec!["default:S"]);
    let i = with_shared(base, vec![shared_limit("organisation orga-acme", None, cpu_left(6000))]);
    let d = solve(&i);
    let s = summary(&i, &d);
    assert_eq!(s.claims, vec!["default:XS"]);
    assert_eq!(s.unschedulable.len(), 1);
    let why = &d.unschedulable[0].reason;
    assert!(why.contains("organisation orga-acme leaves cpu=6") && why.contains("best packing"), "{why}");
    assert_eq!(d.shared_drawn, vec![Draw { cpu_millis: 6000, memory_bytes: 8_128_081_920, price_micros: 61_100 }]);
    assert_within(&i, &d);
}

#[test]
fn two_pools_drawing_on_one_limit_never_exceed_it_together() {
    // Pool a (first) may add two 2XS; the rest goes to pool b, within what a left of the 20 CPU.
    let mut a = pool("a");
    a.weight = 10;
    a.requirements = vec![req(INSTANCE_TYPE, Operator::In, &["2XS"])];
    a.limits = Limits { nodes: Some(2), ..Limits::default() };
    let b = pool("b");
    let i = with_shared(
        input(vec![a, b], pods(10, 1500)),
        vec![shared_limit("organisation orga-acme", None, cpu_left(20_000))],
    );
    let d = solve(&i);
    let s = summary(&i, &d);
    assert!(s.unschedulable.is_empty(), "{:?}", d.unschedulable);
    assert!(s.claims.iter().any(|c| c.starts_with("a:")) && s.claims.iter().any(|c| c.starts_with("b:")), "{s:?}");
    assert_within(&i, &d);
    // Tighter: 10 CPU for both. Pool a's two 2XS take 8, nothing of b fits in the 2 left.
    let mut tight = i.clone();
    tight.shared[0].remaining = cpu_left(10_000);
    let d = solve(&tight);
    let s = summary(&tight, &d);
    assert_eq!(s.claims, vec!["a:2XS", "a:2XS"]);
    assert_eq!(s.unschedulable.len(), 6);
    assert_within(&tight, &d);
}

#[test]
fn a_limit_of_some_pools_does_not_restrict_the_others() {
    let mut a = pool("a");
    a.weight = 10;
    let i = with_shared(
        input(vec![a, pool("b")], pods(1, 1000)),
        vec![shared_limit("organisation orga-acme", Some(&["a"]), cpu_left(0))],
    );
    let d = solve(&i);
    let s = summary(&i, &d);
    assert_eq!(s.claims, vec!["b:2XS"]);
    assert!(s.unschedulable.is_empty());
    assert_eq!(d.shared_drawn, vec![Draw::default()]);
}

#[test]
fn an_exhausted_limit_names_itself_and_what_is_left() {
    let left = Headroom { cpu_millis: Some(2000), memory_bytes: Some(4_000_000_000), price_micros: Some(10_000) };
    let i = with_shared(
        input(vec![pool("a"), pool("b")], pods(1, 100)),
        vec![shared_limit("organisation orga-acme", None, left)],
    );
    let d = solve(&i);
    assert!(d.new_claims.is_empty());
    // Said once for the two pools it refuses.
    assert_eq!(
        d.unschedulable[0].reason,
        "organisation orga-acme: every instance type would exceed what is left (cpu=2, memory=4G, \
         price-per-hour=0.0100 EUR)"
    );
    assert_eq!(d.shared_drawn, vec![Draw::default()]);
}

#[test]
fn limits_that_exclude_every_type_only_together_say_so() {
    // The pool's own cpu limit leaves 2XS and XS, the organisation's price (which counts these two
    // dearer than they are) S to XL: no type is within both.
    let mut p = pool("default");
    p.limits = Limits { cpu_millis: Some(6000), ..Limits::default() };
    let mut org = shared_limit("organisation orga-acme", None, price_left(250_000));
    for (name, price) in [("2XS", 300_000), ("XS", 300_000)] {
        org.sizes.insert(name.to_string(), Draw { price_micros: price, ..Draw::default() });
    }
    let i = with_shared(input(vec![p], pods(1, 100)), vec![org]);
    let d = solve(&i);
    let why = &d.unschedulable[0].reason;
    assert!(
        why.starts_with("nodepool default: every instance type would exceed one of its limits: remaining limits cpu=6")
            && why.contains("organisation orga-acme with price-per-hour=0.2500 EUR left"),
        "{why}"
    );
}

#[test]
fn a_price_ceiling_picks_a_cheaper_flavor_or_leaves_the_pod_pending() {
    let ceiling = |micros: i64| shared_limit("nodepool default price-per-hour", Some(&["default"]), price_left(micros));
    // 0.07 EUR/h: an XS (0.0611) for two of the three pods, not the S (0.0889) holding them all.
    let i = with_shared(input(vec![pool("default")], pods(3, 2500)), vec![ceiling(70_000)]);
    let d = solve(&i);
    let s = summary(&i, &d);
    assert_eq!(s.claims, vec!["default:XS"]);
    assert_eq!(s.unschedulable.len(), 1);
    let why = &d.unschedulable[0].reason;
    assert!(why.contains("nodepool default price-per-hour leaves price-per-hour=0.0700 EUR"), "{why}");
    assert_within(&i, &d);
    // 0.03 EUR/h: below the cheapest flavor.
    let i = with_shared(input(vec![pool("default")], pods(1, 100)), vec![ceiling(30_000)]);
    let d = solve(&i);
    assert!(d.new_claims.is_empty());
    assert_eq!(
        d.unschedulable[0].reason,
        "nodepool default price-per-hour: every instance type would exceed what is left (price-per-hour=0.0300 EUR)"
    );
}

#[test]
fn the_repack_never_breaks_a_shared_limit() {
    // Four pods of 1.9 CPU: two 2XS are the cheapest (0.0666), but the organisation counts a 2XS as
    // 5 CPU and has 9 left: two 2XS would draw 10. One S (8) holds them all within it.
    let base = input(vec![pool("default")], pods(4, 1900));
    assert_eq!(summary(&base, &solve(&base)).claims, vec!["default:2XS", "default:2XS"]);
    let mut org = shared_limit("organisation orga-acme", None, cpu_left(9000));
    org.sizes.insert("2XS".into(), Draw { cpu_millis: 5000, memory_bytes: 4_000_000_000, price_micros: 33_300 });
    let i = with_shared(base, vec![org]);
    for repack in [true, false] {
        let i = Input { settings: Settings { repack, ..Settings::default() }, ..i.clone() };
        let d = solve(&i);
        let s = summary(&i, &d);
        assert!(s.unschedulable.is_empty(), "{:?}", d.unschedulable);
        assert_eq!(s.claims, vec!["default:S"], "repack {repack}");
        assert_within(&i, &d);
    }
}

#[test]
fn the_repack_spends_a_shared_limit_on_more_pods() {
    // 18 CPU left, fourteen 1.5-CPU pods: the loop's first claim is charged its largest option, an
    // XL (16), and holds ten; nothing fits in the 2 left. Three XS (18) hold twelve.
    let i = with_shared(input(vec![pool("a")], pods(14, 1500)), vec![shared_limit("quota", None, cpu_left(18_000))]);
    let plain = Input { settings: Settings { repack: false, ..Settings::default() }, ..i.clone() };
    let (d, p) = (solve(&i), solve(&plain));
    assert_within(&i, &d);
    assert_within(&plain, &p);
    assert_eq!(summary(&plain, &p).claims, vec!["a:XL"]);
    assert_eq!(p.unschedulable.len(), 4);
    assert_eq!(d.unschedulable.len(), 2, "{:?}", summary(&i, &d));
}

#[test]
fn what_is_left_reads_as_the_quota_counts_it() {
    assert_eq!(format_eur(10_000), "0.0100");
    assert_eq!(format_eur(61_100), "0.0611");
    assert_eq!(format_eur(12_000_000), "12.0000");
    assert_eq!(format_eur(1_234_567), "1.234567");
    assert_eq!(format_eur(-5_000), "-0.0050");
    assert_eq!(
        describe_left(&[Some(2000), Some(4_000_000_000), Some(10_000)]),
        "cpu=2, memory=4G, price-per-hour=0.0100 EUR"
    );
    assert_eq!(describe_left(&[None, Some(4 * GI), None]), "memory=4Gi");
}

/// Issue 28 item 2: a CapacityBuffer's pod is placed after every real pod, whatever its size: it
/// never takes the room of an existing node, nor a shared limit, that a real pod could use.
#[test]
fn buffer_pods_come_after_every_real_pod() {
    let buffered = |mut p: crate::model::Pod| {
        p.buffer = Some("demo/warm".to_string());
        p
    };
    // A 2XS with room for one of them: the larger buffer pod would be first in size order.
    let mut i = input(vec![pool("default")], vec![buffered(pod("warm-1", 3000, 256 * MI)), pod("web", 2000, 256 * MI)]);
    i.nodes = vec![node_of("n1", "2XS", Vec::new())];
    let d = solve(&i);
    let on_node: Vec<&str> = d.existing.iter().flat_map(|a| a.pods.iter().map(|&p| i.pods[p].name.as_str())).collect();
    assert_eq!(on_node, ["web"], "the real pod takes the node's room");
    assert_eq!(d.new_claims.len(), 1);
    assert_eq!(d.new_claims[0].pods.iter().map(|&p| i.pods[p].name.as_str()).collect::<Vec<_>>(), ["warm-1"]);
    // Room for one 2XS in the organisation: the real pod gets it, the buffer pod waits.
    let mut tight = with_shared(
        input(vec![pool("default")], vec![buffered(pod("warm-1", 3000, 256 * MI)), pod("web", 2000, 256 * MI)]),
        vec![shared_limit("organisation orga-acme", None, cpu_left(4000))],
    );
    tight.pools[0].requirements = vec![req(INSTANCE_TYPE, Operator::In, &["2XS"])];
    let d = solve(&tight);
    assert_eq!(d.new_claims.len(), 1);
    assert_eq!(d.new_claims[0].pods.iter().map(|&p| tight.pods[p].name.as_str()).collect::<Vec<_>>(), ["web"]);
    assert_eq!(d.unschedulable.iter().map(|u| tight.pods[u.pod].name.as_str()).collect::<Vec<_>>(), ["warm-1"]);
    // Without the mark the size order puts the larger pod first: the test tells the two apart.
    let mut plain = i.clone();
    plain.pods[0].buffer = None;
    let d = solve(&plain);
    let on_node: Vec<&str> =
        d.existing.iter().flat_map(|a| a.pods.iter().map(|&p| plain.pods[p].name.as_str())).collect();
    assert_eq!(on_node, ["warm-1"]);
}
