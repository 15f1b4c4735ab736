#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crds::{CleverOrganizationSpec, catalog::BUILTIN_FLAVORS, organization::OrganizationQuota};
use k8s_openapi::jiff::SignedDuration;
use serde_json::json;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn org(cpu: &str, memory: &str) -> CleverOrganization {
    let mut o = CleverOrganization::new(
        "acme",
        CleverOrganizationSpec {
            quota: Some(OrganizationQuota { cpu: Some(cpu.into()), memory: Some(memory.into()) }),
            ..Default::default()
        },
    );
    o.metadata.generation = Some(1);
    o
}

fn sizer() -> Sizer {
    let flavors: Vec<Flavor> = BUILTIN_FLAVORS.iter().map(|b| b.to_flavor()).collect();
    Sizer::new(&flavors)
}

fn size(flavor: &str) -> Amount {
    sizer().of(flavor).unwrap()
}

fn launch<'a>(group: &'a str, flavor: &'a str, weight: i32, since: Timestamp) -> Launch<'a> {
    Launch { group, flavor, pool: "default", size: size(flavor), weight, since }
}

const PARIS: ClusterId<'static> = ClusterId { namespace: "team", name: "paris" };
const LYON: ClusterId<'static> = ClusterId { namespace: "team", name: "lyon" };
const NICE: ClusterId<'static> = ClusterId { namespace: "other", name: "nice" };

fn node(name: &str, flavor: Option<&str>, group: Option<&str>) -> Node {
    let mut labels = serde_json::Map::new();
    if let Some(f) = flavor {
        labels.insert(labels::CLEVER_FLAVOR.into(), json!(f));
    }
    if let Some(g) = group {
        labels.insert(labels::CLEVER_NODEGROUP.into(), json!(g));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": {"cpu": "3", "memory": "5Gi"}}
    }))
    .unwrap()
}

fn group(name: &str, flavor: &str, phase: Option<&str>) -> NodeGroup {
    let mut g: NodeGroup = serde_json::from_value(json!({
        "apiVersion": "api.clever-cloud.com/v1", "kind": "NodeGroup",
        "metadata": {"name": name},
        "spec": {"flavor": flavor, "nodeCount": 1}
    }))
    .unwrap();
    if let Some(p) = phase {
        g.status = Some(serde_json::from_value(json!({"phase": p})).unwrap());
    }
    g
}

fn counted(cpu: i64, gb: i64) -> Counted {
    Counted {
        nodes: 2,
        unknown: 0,
        usage: Amount { cpu_millis: cpu * 1000, memory_bytes: gb * 1_000_000_000, price_micros: 0 },
        groups: BTreeSet::new(),
    }
}

/// `org` with cluster `id`'s count recorded.
fn with_count(mut o: CleverOrganization, id: ClusterId<'_>, c: &Counted, now: Timestamp) -> CleverOrganization {
    o.status = Some(record(&o, id, c, "r1", now).unwrap());
    o
}

#[test]
fn sizes_are_the_platforms_nominal_ones_not_the_kernel_visible_memory() {
    let s = sizer();
    assert_eq!(s.of("XS"), Some(Amount { cpu_millis: 6000, memory_bytes: 8_000_000_000, price_micros: 61_100 }));
    assert_eq!(s.of("S").unwrap().memory_bytes, 12_000_000_000);
    // A catalogue flavor without a built-in row: its memory over the ratio measured on M.
    let custom = Flavor { name: "GPU-1".into(), cpu: 12, memory_ki: 47_967_000, price_hourly: 1.5 };
    assert_eq!(Sizer::new([&custom]).of("GPU-1").unwrap().memory_bytes, 48_000_000_000);
}

#[test]
fn a_cluster_counts_every_node_control_plane_and_foreign_included_and_groups_not_yet_nodes() {
    let nodes = [
        node("cp-0", Some("S"), None),
        node("cp-1", Some("S"), None),
        node("g1-node0", Some("XS"), Some("g1")),
        node("mystery", None, None),
    ];
    let groups = [group("g1", "XS", Some("Synced")), group("g2", "2XS", None), group("g3", "M", Some("QuotaExceeded"))];
    let c = count_cluster(&nodes, &groups, &sizer());
    assert_eq!(c.nodes, 4);
    assert_eq!(c.unknown, 1);
    // 2 × S (8, 12G) + XS (6, 8G) + mystery by capacity (3, 5Gi) + g2 in flight (4, 4G); g3 refused.
    assert_eq!(c.usage.cpu_millis, 16_000 + 6000 + 3000 + 4000);
    assert_eq!(c.usage.memory_bytes, 24_000_000_000 + 8_000_000_000 + 5 * 1024 * 1024 * 1024 + 4_000_000_000);
    // The hub's price: g1 and g2, not the refused g3, not the control plane.
    assert_eq!(c.usage.price_micros, 61_100 + 33_300);
    assert_eq!(c.groups, ["g1", "g2", "g3"].into_iter().map(String::from).collect());
}

#[test]
fn a_launch_reserves_within_the_quota_and_not_beyond() {
    // Two clusters' control planes: 32 vCPU / 48G of a 48 / 64G quota.
    let mut o = org("48", "64G");
    o = with_count(o, PARIS, &counted(16, 24), at(0));
    o = with_count(o, LYON, &counted(16, 24), at(0));
    assert_eq!(
        headroom(&o),
        Ceiling { cpu_millis: Some(16_000), memory_bytes: Some(16_000_000_000), price_micros: None }
    );
    // M (10 vCPU, 16G) fits exactly.
    let status = reserve(&o, PARIS, &launch("g-m", "M", 0, at(1)), "r1", at(1)).unwrap();
    o.status = Some(status);
    assert_eq!(headroom(&o).memory_bytes, Some(0));
    assert_eq!(o.status.as_ref().unwrap().reserved.as_ref().unwrap().memory.as_deref(), Some("16G"));
    // Nothing else fits, in either cluster: the reason names the organisation and the numbers.
    let refused = reserve(&o, LYON, &launch("g-x", "2XS", 0, at(2)), "r1", at(2)).unwrap_err();
    let (short, waiting) = (refused.short, refused.marked);
    assert_eq!(short.message, "organisation acme: 64G/64G memory in use across 2 clusters; this node needs 4G");
    assert!(waiting.clusters.iter().any(|c| c.name == "lyon" && c.waiting.is_some()));
}

#[test]
fn the_same_groups_reservation_is_not_taken_twice() {
    let o = with_count(org("40", "40G"), PARIS, &counted(16, 24), at(0));
    let mut o2 = o.clone();
    o2.status = Some(reserve(&o, PARIS, &launch("g", "XS", 0, at(1)), "r1", at(1)).unwrap());
    let again = reserve(&o2, PARIS, &launch("g", "XS", 0, at(2)), "r1", at(2)).unwrap();
    assert_eq!(used(Some(&again)).1.memory_bytes, 8_000_000_000);
}

#[test]
fn a_reservation_is_settled_when_its_group_is_counted_refused_or_too_old() {
    let mut o = with_count(org("40", "40G"), PARIS, &counted(16, 24), at(0));
    o.status = Some(reserve(&o, PARIS, &launch("g1", "XS", 0, at(1)), "r1", at(1)).unwrap());
    o.status = Some(reserve(&o, PARIS, &launch("g2", "2XS", 0, at(1)), "r1", at(1)).unwrap());
    assert_eq!(used(o.status.as_ref()).1.memory_bytes, 12_000_000_000);
    // g1's group is counted: its reservation leaves in the same write that counts it.
    let mut c = counted(16, 24);
    c.usage.memory_bytes += 8_000_000_000;
    c.groups.insert("g1".into());
    o.status = Some(record(&o, PARIS, &c, "r1", at(2)).unwrap());
    assert_eq!(
        used(o.status.as_ref()),
        (
            Amount {
                cpu_millis: 16_000 + 4000,
                memory_bytes: 24_000_000_000 + 8_000_000_000 + 4_000_000_000,
                price_micros: 33_300
            },
            Amount { cpu_millis: 4000, memory_bytes: 4_000_000_000, price_micros: 33_300 },
        )
    );
    // Refused: released at once.
    let released = release(&o, PARIS, "g2").unwrap();
    assert_eq!(used(Some(&released)).1, Amount::default());
    assert_eq!(release(&o, PARIS, "nope"), None);
    // A launch that died before creating: gone after the TTL.
    let late = at(1) + SignedDuration::try_from(RESERVATION_TTL).unwrap() + SignedDuration::from_secs(1);
    let aged = record(&o, PARIS, &c, "r1", late).unwrap();
    assert_eq!(used(Some(&aged)).1, Amount::default());
}

#[test]
fn an_unchanged_count_is_written_only_to_refresh() {
    let o = with_count(org("40", "40G"), PARIS, &counted(16, 24), at(0));
    assert_eq!(record(&o, PARIS, &counted(16, 24), "r1", at(10)), None);
    assert!(record(&o, PARIS, &counted(16, 24), "r1", at(61)).is_some());
    assert!(record(&o, PARIS, &counted(24, 36), "r1", at(10)).is_some());
}

#[test]
fn a_refusal_teaches_the_quota_and_the_smaller_one_wins_until_the_spec_changes() {
    assert_eq!(
        limit_in_refusal("Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB"),
        Some((true, 40_000_000_000))
    );
    assert_eq!(limit_in_refusal("Quota exceeded: CPU max: limit = 40 | actual = 46"), Some((false, 40_000)));
    assert_eq!(limit_in_refusal("something else"), None);
    assert_eq!(limit_in_refusal("RAM max: limit = lots"), None);
    let mut o = org("100", "100G");
    o.status = Some(learn(&o, PARIS, "Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB", at(0)).unwrap());
    assert_eq!(effective(&o).memory_bytes, Some(40_000_000_000));
    assert_eq!(effective(&o).cpu_millis, Some(100_000));
    assert_eq!(o.status.as_ref().unwrap().quota.as_ref().unwrap().memory.as_deref(), Some("40G"));
    // Learned twice: nothing new to write.
    assert_eq!(learn(&o, PARIS, "Quota exceeded: RAM max: limit = 40.0 GB | actual = 52.0 GB", at(1)), None);
    // The user edits the spec (Clever Cloud raised the quota): the learned value is forgotten.
    o.metadata.generation = Some(2);
    assert_eq!(effective(&o).memory_bytes, Some(100_000_000_000));
}

#[test]
fn a_cost_ceiling_limits_the_hubs_spend() {
    let mut o = org("1000", "1000G");
    o.spec.limits = Some([(PRICE_PER_HOUR.to_string(), serde_json::from_value(json!("0.1")).unwrap())].into());
    let mut c = counted(16, 24);
    c.usage.price_micros = 61_100;
    o = with_count(o, PARIS, &c, at(0));
    assert_eq!(headroom(&o).price_micros, Some(38_900));
    assert!(reserve(&o, PARIS, &launch("a", "2XS", 0, at(1)), "r1", at(1)).is_ok());
    let short = reserve(&o, PARIS, &launch("b", "XS", 0, at(1)), "r1", at(1)).unwrap_err().short;
    assert!(
        short.message == "organisation acme: 0.0611/0.1000 EUR/h in use across 1 cluster; this node needs 0.0611",
        "{}",
        short.message
    );
}

#[test]
fn prices_parse_as_decimal_euros() {
    assert_eq!(parse_price("2.5"), Some(2_500_000));
    assert_eq!(parse_price("12"), Some(12_000_000));
    assert_eq!(parse_price("0.0611"), Some(61_100));
    assert_eq!(parse_price(".5"), Some(500_000));
    for bad in ["", ".", "-1", "1e3", "0.1234567", "abc", "1.2.3"] {
        assert_eq!(parse_price(bad), None, "{bad}");
    }
}

#[test]
fn short_headroom_goes_by_weight_then_age_and_no_one_starves() {
    // 8G left: room for one XS.
    let mut o = with_count(org("100", "40G"), PARIS, &counted(16, 32), at(0));
    // Lyon (weight 10) asked first and was refused (nothing fit then): it is marked waiting.
    let mut full = o.clone();
    full.status.as_mut().unwrap().clusters[0].memory_bytes = 40_000_000_000;
    let marked = reserve(&full, LYON, &launch("l1", "XS", 10, at(5)), "r1", at(5)).unwrap_err().marked;
    o.status.as_mut().unwrap().clusters = marked.clusters.clone();
    o.status.as_mut().unwrap().clusters.iter_mut().find(|c| c.name == "paris").unwrap().memory_bytes = 32_000_000_000;
    // Rounds: Lyon sees the 8G; Nice, not waiting, sees what is not owed to Lyon.
    assert_eq!(headroom_for(&o, LYON, at(10)).memory_bytes, Some(8_000_000_000));
    assert_eq!(headroom_for(&o, NICE, at(10)).memory_bytes, Some(0));
    // Nice (weight 0) may not take Lyon's headroom; Lyon may.
    let short = reserve(&o, NICE, &launch("n1", "XS", 0, at(10)), "r1", at(10)).unwrap_err().short;
    assert!(short.message.contains("owed to clusters waiting before it"), "{}", short.message);
    assert!(reserve(&o, LYON, &launch("l1", "XS", 10, at(10)), "r1", at(10)).is_ok());
    // A higher weight than Lyon's goes first.
    assert!(reserve(&o, NICE, &launch("n2", "XS", 50, at(10)), "r1", at(10)).is_ok());
    // Nice waiting longer than STARVATION ranks first whatever the weights.
    let starving = at(10) - SignedDuration::try_from(STARVATION).unwrap() - SignedDuration::from_secs(1);
    assert!(reserve(&o, NICE, &launch("n3", "XS", 0, starving), "r1", at(10)).is_ok());
    // A mark not renewed stops counting.
    let later = at(5) + SignedDuration::try_from(WAITING_TTL).unwrap() + SignedDuration::from_secs(1);
    assert!(reserve(&o, NICE, &launch("n4", "XS", 0, later), "r1", later).is_ok());
}

#[test]
fn stale_entries_and_clusters_that_left_are_pruned() {
    let mut o = with_count(org("40", "40G"), PARIS, &counted(16, 24), at(0));
    o = with_count(o, LYON, &counted(16, 24), at(500));
    assert_eq!(prune(&o, |_, _| true, at(550)), None);
    let (status, stale) = prune(&o, |_, _| true, at(650)).unwrap();
    assert_eq!(stale, ["team/paris"]);
    assert_eq!(status.clusters.len(), 1);
    let (status, _) = prune(&o, |_, n| n != "lyon", at(550)).unwrap();
    assert_eq!(status.clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["paris"]);
    assert_eq!(status.cluster_count, 1);
}

#[test]
fn selection_by_cluster_and_namespace_labels() {
    let mut o = org("40", "40G");
    o.spec.cluster_selector = serde_json::from_value(json!({"matchLabels": {"org": "acme"}})).unwrap();
    let l = |k: &str, v: &str| -> BTreeMap<String, String> { [(k.to_string(), v.to_string())].into() };
    assert!(selects(&o, &BTreeMap::new(), &l("org", "acme")));
    assert!(!selects(&o, &BTreeMap::new(), &l("org", "other")));
    o.spec.namespace_selector = Some(serde_json::from_value(json!({"matchLabels": {"tier": "prod"}})).unwrap());
    assert!(!selects(&o, &l("tier", "dev"), &l("org", "acme")));
    assert!(selects(&o, &l("tier", "prod"), &l("org", "acme")));
    assert!(needs_namespace_labels(&o));
}

fn want(weight: i32, since: Timestamp, flavor: &str) -> Want {
    Want { weight, since, size: size(flavor), pools: vec!["default".into()] }
}

/// `o` with the status `change` made (panics when it made none).
fn changed(mut o: CleverOrganization, change: Option<CleverOrganizationStatus>) -> CleverOrganization {
    o.status = Some(change.expect("a change"));
    o
}

/// Three clusters compete for an organisation's room, freed one node at a time (fleet.md §4): the
/// rounds of the clusters marked waiting see it in rank order — the highest weight first, the
/// oldest pending pod between equal weights, and a cluster waiting longer than STARVATION before
/// anyone —, so the room is not taken by whichever round runs first.
#[test]
fn three_clusters_competing_are_served_by_weight_then_age_and_none_starves() {
    // 52 vCPU: the three control planes take 48, Paris's 2XS the last 4.
    let mut o = org("52", "1000G");
    for (id, cpu) in [(PARIS, 20), (LYON, 16), (NICE, 16)] {
        o = with_count(o, id, &counted(cpu, 24), at(0));
    }
    // Lyon's pods (weight 10) wait from t=0, Nice's (weight 50) from t=20: both rounds mark it.
    o = changed(o.clone(), mark(&o, LYON, &want(10, at(0), "2XS"), at(1)));
    o = changed(o.clone(), mark(&o, NICE, &want(50, at(20), "2XS"), at(21)));
    // Renewed only after RENEW, or when it changes.
    assert_eq!(mark(&o, NICE, &want(50, at(20), "2XS"), at(30)), None);
    assert!(mark(&o, NICE, &want(50, at(20), "2XS"), at(21 + RENEW.as_secs() as i64)).is_some());
    assert!(mark(&o, NICE, &want(50, at(20), "XS"), at(30)).is_some());
    // A cluster not counted yet is not marked (a mark must not stand for its count).
    assert_eq!(mark(&o, ClusterId { namespace: "x", name: "y" }, &want(1, at(0), "2XS"), at(30)), None);
    // The pool condition's words: numbers, line, clusters.
    let lyon = waits_for(&o, LYON, "default", at(30)).unwrap();
    assert!(lyon.starts_with("organisation acme: 52/52 vCPU"), "{lyon}");
    assert!(lyon.contains("team/lyon waits for 4 vCPU, 4G memory"), "{lyon}");
    assert!(lyon.contains("(1 cluster before it in line)"), "{lyon}");
    assert!(lyon.contains("team/paris 20"), "{lyon}");
    assert!(lyon.chars().count() <= 300, "a condition keeps 300 characters: {lyon}");
    assert!(waits_for(&o, NICE, "default", at(30)).unwrap().contains("(first in line)"));
    assert_eq!(waits_for(&o, NICE, "other-pool", at(30)), None);
    assert_eq!(waits_for(&o, PARIS, "default", at(30)), None);

    // Paris's node goes: 4 vCPU free. Nice (weight 50) sees it; Lyon sees what is not owed to Nice.
    o = with_count(o, PARIS, &counted(16, 24), at(40));
    assert_eq!(headroom_for(&o, NICE, at(40)).cpu_millis, Some(4000));
    assert_eq!(headroom_for(&o, LYON, at(40)).cpu_millis, Some(0));
    assert_eq!(headroom_for(&o, PARIS, at(40)).cpu_millis, Some(0), "a cluster not in line waits behind both");
    assert!(reserve(&o, LYON, &launch("l1", "2XS", 10, at(0)), "r1", at(40)).is_err());
    o = changed(o.clone(), reserve(&o, NICE, &launch("n1", "2XS", 50, at(20)), "r1", at(40)).ok());
    assert!(o.status.as_ref().unwrap().clusters.iter().all(|c| c.name != "nice" || c.waiting.is_none()));
    // Nice's new node is counted: its reservation is settled.
    let mut with_n1 = counted(20, 28);
    with_n1.groups.insert("n1".into());
    o = with_count(o, NICE, &with_n1, at(45));

    // Nice wants more (weight 50, pods from t=60) while Lyon still waits; more room frees at t=100:
    // between the two, the higher weight still goes first...
    o = changed(o.clone(), mark(&o, LYON, &want(10, at(0), "2XS"), at(60)));
    o = changed(o.clone(), mark(&o, NICE, &want(50, at(60), "2XS"), at(60)));
    o = with_count(o, PARIS, &counted(12, 24), at(100));
    assert_eq!(headroom_for(&o, NICE, at(100)).cpu_millis, Some(4000));
    assert_eq!(headroom_for(&o, LYON, at(100)).cpu_millis, Some(0));
    // Equal weights: the oldest pending pod first (Lyon's, from t=0; Nice's from t=60).
    let even = changed(o.clone(), mark(&o, LYON, &want(50, at(0), "2XS"), at(110)));
    assert_eq!(headroom_for(&even, LYON, at(110)).cpu_millis, Some(4000));
    assert_eq!(headroom_for(&even, NICE, at(110)).cpu_millis, Some(0));
    // ...until Lyon has waited longer than STARVATION: then it is first, whatever the weights.
    let late = at(0) + SignedDuration::try_from(STARVATION).unwrap() + SignedDuration::from_secs(1);
    o = changed(o.clone(), mark(&o, LYON, &want(10, at(0), "2XS"), late));
    o = changed(o.clone(), mark(&o, NICE, &want(50, at(60), "2XS"), late));
    assert_eq!(headroom_for(&o, LYON, late).cpu_millis, Some(4000));
    assert_eq!(headroom_for(&o, NICE, late).cpu_millis, Some(0));
    assert!(waits_for(&o, LYON, "default", late).unwrap().contains("(first in line)"));
    // A cluster whose pods no longer wait leaves the line; a mark not renewed stops counting.
    o = changed(o.clone(), unmark(&o, LYON));
    assert_eq!(unmark(&o, LYON), None);
    assert_eq!(headroom_for(&o, NICE, late).cpu_millis, Some(4000));
    let forgotten = late + SignedDuration::try_from(WAITING_TTL).unwrap() + SignedDuration::from_secs(1);
    assert_eq!(headroom_for(&o, PARIS, forgotten).cpu_millis, Some(4000));
}
