//! The middle tier (docs/testing.md): a disruption pass's fact gathering, its methods and the
//! validation after the delay, over watch caches filled from watcher events as the hub's
//! reflectors fill them; no API server, no task, no sleep. What a pass decides is judged on its
//! command and on what it reports blocked; carrying a command out (records, replacements, taints,
//! the drain) and what the hub tells (events, metrics) are the emulator tier's (tests/suite/disruption.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::json;

use super::*;
use crate::infra::cache_fixture::{
    Caches,
    objects::{claim, class, key, node, pool, running_pod},
};

fn now() -> Timestamp {
    "2026-11-25T12:00:00Z".parse().unwrap()
}

/// The `default` class (Ready) and pool (`extra` merged), listed, and nothing else yet.
fn cluster(extra: serde_json::Value) -> Caches {
    let mut c = Caches::listed();
    c.list([class("default", true)]);
    c.list([pool("default", "default", extra)]);
    c
}

/// A consolidatable node `name` of pool `default` of flavor `flavor`: its claim and its Node.
fn add_node(c: &mut Caches, name: &str, flavor: &str, conditions: &[(&str, &str)]) {
    c.apply(claim(name, "default", flavor, true, conditions));
    c.apply(node(name, "default", flavor));
}

const CONSOLIDATABLE: (&str, &str) = ("Consolidatable", "Consolidatable");

/// The view of a pass at `at`, as the loop corrects it under no CKE refusal and no nomination.
fn view_at(c: &Caches, at: Timestamp) -> disruption_scope::View {
    view_nominated(c, &nomination::Nominations::default(), at)
}

/// The view of a pass at `at` with `nominations` made by provisioning.
fn view_nominated(c: &Caches, nominations: &nomination::Nominations, at: Timestamp) -> disruption_scope::View {
    let mgmt = c.mgmt();
    assert!(mgmt.is_ready());
    let claims = facts::claims(&mgmt, &key());
    let (snapshot, mut view) =
        gather(&mgmt, &c.workload(), &key(), &Default::default(), &Default::default(), &claims, at).unwrap();
    corrected(&mut view, &snapshot, &CapacityState::default(), nominations, at);
    view
}

/// One pass's methods at `at` (nothing skipped).
fn pass_at(c: &Caches, at: Timestamp) -> (disruption_scope::View, disruption_scope::Pass) {
    let view = view_at(c, at);
    let pass = methods(&view, false, at, |_, _| {});
    (view, pass)
}

/// The pass's command: method, candidates and the pools of its replacements.
fn command_of(pass: &disruption_scope::Pass) -> Option<(Method, Vec<String>, Vec<String>)> {
    pass.command().map(|c| {
        (
            c.method,
            c.claims().into_iter().map(str::to_string).collect(),
            c.replacements.iter().map(|r| r.nodepool.clone()).collect(),
        )
    })
}

/// Every `(claim, why)` the pass's methods reported blocked.
fn blocked(pass: &disruption_scope::Pass) -> Vec<(String, String)> {
    pass.methods.iter().flat_map(|(_, o)| o.blocked.iter().cloned()).collect()
}

#[test]
fn an_empty_consolidatable_node_is_removed_by_emptiness_once_validated_after_the_delay() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE]);
    add_node(&mut c, "default-b2", "XS", &[CONSOLIDATABLE]);
    c.list([running_pod("web-1", "default-b2", "5", "6Gi", json!({}))]);
    let (_, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), Some((Method::Emptiness, vec!["default-a1".into()], vec![])));
    let command = pass.command().cloned().unwrap();
    // After the validation delay the fresh view still has the node empty: the command stands.
    let later = now() + disruption_queue::VALIDATION_DELAY;
    let validated = validate(&command, &view_at(&c, later), later).unwrap();
    assert_eq!(validated.claims(), ["default-a1"]);
    // A pod bound to it meanwhile drops the command.
    c.apply(running_pod("web-2", "default-a1", "500m", "1Gi", json!({})));
    let dropped = validate(&command, &view_at(&c, later), later).unwrap_err();
    assert!(matches!(dropped, Dropped::NoEmptyNode), "{dropped}");
    // Its claim deleted meanwhile (a Delete event): the command is dropped naming it.
    c.delete(claim("default-a1", "default", "XS", true, &[CONSOLIDATABLE]));
    let dropped = validate(&command, &view_at(&c, later), later).unwrap_err();
    assert_eq!(dropped.to_string(), "default-a1 is gone");
}

/// §4.2 (issue 27 item 3): a node provisioning nominated for pending pods is no candidate for the
/// nomination window, by its Node's name or (in flight) its claim's; a command decided before the
/// nomination is dropped at validation.
#[test]
fn a_node_nominated_for_pending_pods_is_no_candidate_until_the_window_ends() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE]);
    let mut nominations = nomination::Nominations::default();
    let (_, pass) = pass_at(&c, now());
    let command = pass.command().cloned().unwrap();
    assert_eq!(command.claims(), ["default-a1"]);
    nominations.nominate(["default-a1"], now());
    let view = view_nominated(&c, &nominations, now());
    assert_eq!(methods(&view, false, now(), |_, _| {}).command().map(|c| c.claims()), None, "nominated");
    let later = now() + disruption_queue::VALIDATION_DELAY;
    let dropped = validate(&command, &view_nominated(&c, &nominations, later), later);
    assert!(dropped.is_err(), "a candidate nominated meanwhile drops the command");
    let after = now() + nomination::WINDOW;
    let view = view_nominated(&c, &nominations, after);
    assert_eq!(methods(&view, false, after, |_, _| {}).command().map(|c| c.claims()), Some(vec!["default-a1"]));
}

#[test]
fn an_empty_node_not_yet_consolidatable_stays() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[]);
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None);
    assert!(eligible(&view.scope, Method::Emptiness, now()).is_empty());
    // consolidateAfter passed (the lifecycle sets the condition): emptiness takes it.
    c.apply(claim("default-a1", "default", "XS", true, &[CONSOLIDATABLE]));
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), Some((Method::Emptiness, vec!["default-a1".into()], vec![])));
    assert_eq!(eligible(&view.scope, Method::Emptiness, now()).len(), 1);
}

#[test]
fn a_drifted_node_is_replaced_from_its_pool_without_waiting_for_consolidation() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[("Drifted", "NodePoolDrifted")]);
    c.list([running_pod("web-0", "default-a1", "500m", "1Gi", json!({}))]);
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), Some((Method::Drift, vec!["default-a1".into()], vec!["default".into()])));
    assert_eq!(pass.command().unwrap().reason, DisruptionReason::Drifted);
    assert_eq!(eligible(&view.scope, Method::Drift, now()).len(), 1);
}

/// Issue 27 item 2: several commands at once. A started command's candidates are charged to the
/// budget and are no candidates; the next command is decided beside it until the budget is spent.
#[test]
fn drift_commands_run_side_by_side_within_the_budget() {
    let mut c = cluster(json!({"spec": {"disruption": {"budgets": [{"nodes": "2"}]}}}));
    for (i, name) in ["default-a1", "default-b2", "default-c3"].iter().enumerate() {
        add_node(&mut c, name, "XS", &[("Drifted", "NodePoolDrifted")]);
        c.apply(running_pod(&format!("web-{i}"), name, "500m", "1Gi", json!({})));
    }
    let start = |c: &mut Caches, pass: &disruption_scope::Pass| {
        let command = pass.command().unwrap();
        let record = disruption_queue::Recorded {
            id: format!("id-{}", command.claims()[0]),
            method: command.method.to_string(),
            reason: command.reason,
            started: Time(now()),
            candidates: command.claims().iter().map(|c| c.to_string()).collect(),
            replacements: vec![],
            savings_per_hour: 0.0,
        };
        for name in command.claims() {
            let mut started = claim(name, "default", "XS", true, &[("Drifted", "NodePoolDrifted")]);
            started.annotations_mut().insert(disruption_queue::COMMAND_ANNOTATION.into(), record.to_annotation());
            c.apply(started);
        }
        command.claims()[0].to_string()
    };
    let (_, first) = pass_at(&c, now());
    let one = start(&mut c, &first);
    let (view, second) = pass_at(&c, now());
    assert!(view.scope.nodes.iter().any(|n| n.claim == one && n.queued));
    let two = start(&mut c, &second);
    assert_ne!(one, two, "a started command's candidate is no candidate of the next");
    let (_, third) = pass_at(&c, now());
    assert_eq!(command_of(&third), None, "two in flight spend a budget of 2");
    let drift = third.methods.iter().find(|(m, _)| *m == Method::Drift).map(|(_, o)| o.budget_constrained);
    assert_eq!(drift, Some(true));
}

/// Why the loop decides the next command only once the started ones' replacements show in the
/// cache (issue 30 CI, the side-by-side drift test): the record is written before the replacements
/// are created, and a view with the first candidate leaving but without its replacement places that
/// candidate's pod on one more new node, so the second command would launch two nodes, not one.
/// Once the replacement shows, the leaving pod keeps it whichever pod sorts first (pods of one size
/// are placed by UID): with the pods in either order on the nodes, and the first candidate's node
/// tainted `karpenter.sh/disrupted` or not yet (its pod then shows as pending), the second command
/// launches one node and is not refused for moving its pod onto the first one's uninitialized
/// replacement.
#[test]
fn a_command_decided_before_a_started_one_s_replacement_shows_would_launch_for_its_pods_again() {
    let apart = json!({"spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
    ]}}}});
    let orders = [["web-0", "web-1", "web-2"], ["web-2", "web-1", "web-0"]];
    for (pods, tainted) in orders.into_iter().flat_map(|o| [(o, false), (o, true)]) {
        let mut c = cluster(json!({"spec": {"disruption": {"budgets": [{"nodes": "2"}]}}}));
        for (pod, name) in pods.iter().zip(["default-a1", "default-b2", "default-c3"]) {
            add_node(&mut c, name, "XS", &[("Drifted", "NodePoolDrifted")]);
            c.apply(running_pod(pod, name, "500m", "1Gi", apart.clone()));
        }
        let (_, first) = pass_at(&c, now());
        let one = first.command().unwrap().claims()[0].to_string();
        assert_eq!(first.command().unwrap().replacements.len(), 1);
        let record = disruption_queue::Recorded {
            id: "id-one".into(),
            method: Method::Drift.to_string(),
            reason: DisruptionReason::Drifted,
            started: Time(now()),
            candidates: vec![one.clone()],
            replacements: vec!["default-rone0".into()],
            savings_per_hour: 0.0,
        };
        let mut started = claim(&one, "default", "XS", true, &[("Drifted", "NodePoolDrifted")]);
        started.annotations_mut().insert(disruption_queue::COMMAND_ANNOTATION.into(), record.to_annotation());
        c.apply(started);
        if tainted {
            let mut n = node(&one, "default", "XS");
            n.spec.get_or_insert_default().taints = Some(vec![Taint {
                key: labels::DISRUPTED_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]);
            c.apply(n);
        }

        // The record shows, its replacement not yet: the gate holds, and rightly.
        let cached = |c: &Caches, name: &str| facts::claims(&c.mgmt(), &key()).iter().any(|x| x.name_any() == name);
        assert_eq!(disruption_queue::unseen_replacements(&record, |n| cached(&c, n)), ["default-rone0"]);
        let (_, early) = pass_at(&c, now());
        assert_eq!(
            early.command().unwrap().replacements.len(),
            2,
            "{pods:?} tainted {tainted}: the leaving pod placed a second time"
        );

        // The replacement shows (created, not launched yet): the second command launches one node.
        c.apply(claim("default-rone0", "default", "XS", false, &[]));
        assert!(disruption_queue::unseen_replacements(&record, |n| cached(&c, n)).is_empty());
        let (_, second) = pass_at(&c, now());
        let Some(command) = second.command() else {
            panic!("{pods:?} tainted {tainted}: no second command beside the first: {:?}", blocked(&second));
        };
        assert_ne!(command.claims()[0], one);
        assert_eq!(
            command.replacements.len(),
            1,
            "{pods:?} tainted {tainted}: the first command's pod goes to its own replacement"
        );
    }
}

#[test]
fn an_under_used_node_is_replaced_by_a_cheaper_one_unless_a_pdb_allows_nothing() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-l1", "XS", &[CONSOLIDATABLE]);
    c.list([running_pod("web-0", "default-l1", "500m", "1Gi", json!({}))]);
    let pdb = |allowed: i32| -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1},
        }))
        .unwrap()
    };
    c.list([pdb(0)]);
    let (_, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None, "the PDB allows no eviction");
    let why = blocked(&pass);
    assert!(
        why.iter().any(|(claim, why)| claim == "default-l1" && why.contains("PDB default/web")),
        "blocked naming the PDB: {why:?}"
    );
    // The budget allows one (its status, as the disruption controller counts it): a 2XS replaces
    // the XS.
    c.apply(pdb(1));
    let (_, pass) = pass_at(&c, now());
    let command = pass.command().unwrap();
    assert_eq!(command.reason, DisruptionReason::Underutilized);
    assert_eq!(command.claims(), ["default-l1"]);
    let flavors: Vec<&str> =
        command.replacements.iter().filter_map(|r| r.instance_types.first()).map(|o| o.name.as_str()).collect();
    assert_eq!(flavors, ["2XS"], "the cheaper flavor holding web-0");
}

#[test]
fn a_do_not_disrupt_pod_keeps_its_node_and_is_named() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE, ("Drifted", "NodePoolDrifted")]);
    let keep = json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}});
    c.list([running_pod("web-0", "default-a1", "500m", "1Gi", keep)]);
    let (_, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None, "neither drift nor consolidation moves it");
    let why = blocked(&pass);
    assert!(why.iter().any(|(claim, why)| claim == "default-a1" && why.contains("web-0")), "{why:?}");
    // The pod gone (a Delete event), the node is empty and goes.
    c.delete(running_pod("web-0", "default-a1", "500m", "1Gi", json!({})));
    let (_, pass) = pass_at(&c, now());
    assert!(pass.command().is_some_and(|c| c.claims() == ["default-a1"]), "{:?}", command_of(&pass));
}

#[test]
fn budgets_a_zero_budget_keeps_an_empty_node_and_fifty_percent_takes_one_of_two_at_a_time() {
    let zero = json!({"spec": {"disruption": {"budgets": [{"nodes": "0", "reasons": ["Empty"]}]}}});
    let mut c = cluster(zero);
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE]);
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None, "the budget forbids emptiness");
    assert_eq!(eligible(&view.scope, Method::Emptiness, now()).len(), 1, "the gauge's eligible node");
    assert_eq!(
        disruption::allowances(&view.scope, DisruptionReason::Empty, now()),
        BTreeMap::from([("default".to_string(), 0)])
    );
    // A cron window allowing nothing all day, beside 50 %: nothing goes.
    let window = json!({"spec": {"disruption": {"budgets": [
        {"nodes": "50%"}, {"nodes": "0", "schedule": "0 0 * * *", "duration": "24h"}
    ]}}});
    c.apply(pool("default", "default", window));
    add_node(&mut c, "default-b2", "XS", &[CONSOLIDATABLE]);
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None, "the window forbids");
    assert_eq!(eligible(&view.scope, Method::Emptiness, now()).len(), 2);
    // 50 % alone: one of the two empty nodes at a time.
    c.apply(pool("default", "default", json!({"spec": {"disruption": {"budgets": [{"nodes": "50%"}]}}})));
    let (_, pass) = pass_at(&c, now());
    let (method, claims, _) = command_of(&pass).unwrap();
    assert_eq!((method, claims.len()), (Method::Emptiness, 1), "{claims:?}");
}

#[test]
fn a_cluster_without_claims_is_viewed_without_its_pods_and_decides_nothing() {
    let mut c = cluster(json!({}));
    c.list([running_pod("web-0", "elsewhere", "500m", "1Gi", json!({}))]);
    let mgmt = c.mgmt();
    let (snapshot, view) =
        gather(&mgmt, &c.workload(), &key(), &Default::default(), &Default::default(), &[], now()).unwrap();
    assert!(snapshot.pods.is_empty() && snapshot.nodes.is_empty(), "no claim: no node to disrupt");
    assert_eq!(snapshot.node_pools.len(), 1, "the pools still give the budgets");
    assert_eq!(command_of(&methods(&view, false, now(), |_, _| {})), None);
}

#[test]
fn a_flavor_cooling_down_after_a_cke_refusal_is_not_offered_to_a_replacement() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-l1", "XS", &[CONSOLIDATABLE]);
    c.list([running_pod("web-0", "default-l1", "500m", "1Gi", json!({}))]);
    let replacement = |capacity: &CapacityState| {
        let mgmt = c.mgmt();
        let claims = facts::claims(&mgmt, &key());
        let (snapshot, mut view) =
            gather(&mgmt, &c.workload(), &key(), &Default::default(), &Default::default(), &claims, now()).unwrap();
        corrected(&mut view, &snapshot, capacity, &nomination::Nominations::default(), now());
        let pass = methods(&view, false, now(), |_, _| {});
        pass.command().map(|c| {
            c.replacements.iter().filter_map(|r| r.instance_types.first()).map(|o| o.name.clone()).collect::<Vec<_>>()
        })
    };
    assert_eq!(replacement(&CapacityState::default()), Some(vec!["2XS".to_string()]));
    // CKE refused a 2XS for quota: it cools down, and nothing cheaper than the XS is left.
    let mut capacity = CapacityState::default();
    capacity.unavailable_until.insert("2XS".to_string(), now() + Duration::from_secs(180));
    assert_eq!(replacement(&capacity), None);
}

/// A pass whose replacements may use `cpu` vCPUs of organisation acme's room.
fn pass_within(c: &Caches, cpu: i64) -> disruption_scope::Pass {
    let room = crate::decisions::organization::Ceiling { cpu_millis: Some(cpu * 1000), ..Default::default() };
    let mut view = view_at(c, now());
    organization::limit_input(&mut view.model.input, &[("acme".into(), room)]);
    methods(&view, false, now(), |_, _| {})
}

/// Replacements spend the organisation's room while the candidates run (fleet.md §4): with room for
/// a 2XS the M is replaced by one; with none, no replace-first command is started (nothing else
/// could take the pod, so nothing is done).
#[test]
fn a_replacement_needs_the_organisations_room() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-m1", "M", &[CONSOLIDATABLE]);
    c.list([running_pod("web-1", "default-m1", "1", "1Gi", json!({}))]);
    let pass_with = |cpu: i64| pass_within(&c, cpu);
    assert_eq!(
        command_of(&pass_with(4)),
        Some((Method::SingleNodeConsolidation, vec!["default-m1".into()], vec!["default".into()]))
    );
    assert_eq!(command_of(&pass_with(0)), None);
}

/// A drifted node whose replacement the organisation has no room for is not replaced: it is
/// reported (`DisruptionBlocked`) with the organisation and what is left named, and replaced once
/// the room is there.
#[test]
fn a_drift_replacement_without_the_organisations_room_is_blocked_naming_it() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[("Drifted", "NodePoolDrifted")]);
    c.list([running_pod("web-0", "default-a1", "500m", "1Gi", json!({}))]);
    let pass_with = |cpu: i64| pass_within(&c, cpu);
    let pass = pass_with(0);
    assert_eq!(command_of(&pass), None);
    let why = blocked(&pass);
    assert_eq!(why.len(), 1, "{why:?}");
    assert_eq!(why[0].0, "default-a1");
    assert!(why[0].1.contains("organisation acme: every instance type would exceed what is left (cpu=0)"), "{why:?}");
    assert_eq!(command_of(&pass_with(4)), Some((Method::Drift, vec!["default-a1".into()], vec!["default".into()])));
}

/// The claim of node `name`, being deleted (a finalizer holds it) while its Node is not yet.
fn deleting_claim(name: &str, flavor: &str) -> crds::NodeClaim {
    let mut nc = claim(name, "default", flavor, true, &[CONSOLIDATABLE]);
    nc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    nc.metadata.finalizers = Some(vec!["karpenter.sh/termination".into()]);
    nc
}

/// A node whose claim is being deleted (its Node not yet) is no destination (issue 27, item 2): an
/// under-used M whose pod would fit on it is replaced by a cheaper node instead of deleted onto a
/// node that is going.
#[test]
fn a_node_whose_claim_is_being_deleted_receives_no_moved_pod() {
    // The going node counts against the default 10 % budget: let every node go.
    let mut c = cluster(json!({"spec": {"disruption": {"budgets": [{"nodes": "100%"}]}}}));
    add_node(&mut c, "default-m1", "M", &[CONSOLIDATABLE]);
    c.apply(deleting_claim("default-x1", "XS"));
    c.apply(node("default-x1", "default", "XS"));
    c.list([running_pod("web-1", "default-m1", "1", "1Gi", json!({}))]);
    let (view, pass) = pass_at(&c, now());
    assert_eq!(view.model.deleting.len(), 1, "the going node is known as such");
    assert_eq!(
        command_of(&pass),
        Some((Method::SingleNodeConsolidation, vec!["default-m1".into()], vec!["default".into()])),
        "a replacement, not a delete onto the going node"
    );
}

/// The pods of a node being deleted need one place each (issue 27, items 3 and 4): a Node being
/// deleted has its pods pending once (not again as leaving), and of a node whose claim is being
/// deleted, the pods kept there for good (an active do-not-disrupt) get no place.
#[test]
fn pods_of_leaving_nodes_are_placed_once_and_pods_kept_for_good_not_at_all() {
    let mut c = cluster(json!({}));
    // A Node being deleted: the round's conversion already counts its pods as pending.
    c.apply(deleting_claim("default-x1", "XS"));
    let mut going = node("default-x1", "default", "XS");
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    going.metadata.finalizers = Some(vec!["karpenter.sh/termination".into()]);
    c.apply(going);
    // A claim being deleted, its Node not yet: one pod leaves, one is kept by do-not-disrupt.
    c.apply(deleting_claim("default-x2", "XS"));
    c.apply(node("default-x2", "default", "XS"));
    let kept = json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}});
    c.list([
        running_pod("web-a", "default-x1", "2", "1Gi", json!({})),
        running_pod("web-b", "default-x2", "1", "1Gi", json!({})),
        running_pod("web-c", "default-x2", "1", "1Gi", kept),
    ]);
    let view = view_at(&c, now());
    let keys = |pods: &[scheduling::model::Pod]| pods.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let (pending, leaving) = (keys(&view.model.input.pods), keys(&view.model.leaving));
    let all: Vec<&String> = pending.iter().chain(&leaving).collect();
    assert_eq!(all.iter().filter(|n| n.as_str() == "web-a").count(), 1, "once: {pending:?} {leaving:?}");
    assert_eq!(leaving, ["web-b"], "web-c stays for good: {leaving:?}");
}

/// Issue 30 item 1: the loop keeps its last verdict while its inputs stand. Every kind of change a
/// verdict reads moves them — each watch cache the view is gathered from, the cluster's labels, the
/// flavors cooling down, the nominations, the organisations' room — and a change in another
/// namespace does not.
#[test]
fn a_change_to_anything_the_verdict_reads_moves_its_inputs() {
    let mut c = cluster(json!({}));
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE]);
    let (labels, capacity, nominations) =
        (facts::ClusterLabels::default(), CapacityState::default(), nomination::Nominations::default());
    let inputs =
        |c: &Caches| Inputs::of(&c.mgmt(), &c.workload(), &key(), &labels, &capacity, &nominations, &[], now());
    let mut last = inputs(&c);
    assert_eq!(inputs(&c), last, "reading changes nothing");
    let mut moved = |c: &Caches, what: &str| {
        let now = inputs(c);
        assert_ne!(now, last, "{what} was not seen");
        last = now;
    };
    c.apply(running_pod("web-1", "default-a1", "500m", "1Gi", json!({})));
    moved(&c, "a pod");
    c.apply(node("default-a1", "default", "XS"));
    moved(&c, "a node");
    c.apply(claim("default-a1", "default", "XS", true, &[CONSOLIDATABLE, ("Drifted", "NodeClassDrifted")]));
    moved(&c, "a claim (its Drifted condition: the drift inputs' verdict)");
    c.apply(pool("default", "default", json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})));
    moved(&c, "a NodePool");
    c.apply(class("default", false));
    moved(&c, "a node class");
    let catalog: crds::FlavorCatalog = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
        "metadata": {"name": "prices", "namespace": key().namespace, "uid": "uid-catalog"}, "spec": {"flavors": []}
    }))
    .unwrap();
    c.apply(catalog);
    moved(&c, "a flavor catalogue");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-pdb"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    c.apply(pdb.clone());
    moved(&c, "a PodDisruptionBudget");
    c.delete(pdb);
    moved(&c, "a deletion");
    c.list([running_pod("web-1", "default-a1", "500m", "1Gi", json!({}))]);
    moved(&c, "a relist");
    // Another tenant's namespace: not this cluster's inputs.
    let mut elsewhere = claim("other-a1", "default", "XS", true, &[]);
    elsewhere.metadata.namespace = Some("team-other".into());
    c.apply(elsewhere);
    assert_eq!(inputs(&c), last, "a claim of another namespace");

    // What the hub holds beside the caches, each as it stands at the pass's time.
    let at = |labels: &facts::ClusterLabels, capacity: &CapacityState, nominations: &nomination::Nominations, rooms| {
        Inputs::of(&c.mgmt(), &c.workload(), &key(), labels, capacity, nominations, rooms, now())
    };
    let base = at(&labels, &capacity, &nominations, &[]);
    let mut relabelled = labels.clone();
    relabelled.labels.insert("tier".into(), "gold".into());
    assert_ne!(at(&relabelled, &capacity, &nominations, &[]), base, "the cluster's labels");
    let mut cooling = CapacityState::default();
    cooling.unavailable_until.insert("2XS".to_string(), now() + Duration::from_secs(180));
    assert_ne!(at(&labels, &cooling, &nominations, &[]), base, "a flavor cooling down");
    let mut ended = CapacityState::default();
    ended.unavailable_until.insert("2XS".to_string(), now());
    assert_eq!(at(&labels, &ended, &nominations, &[]), base, "a cool-down over is no input");
    let mut nominated = nomination::Nominations::default();
    nominated.nominate(["default-a1"], now());
    assert_ne!(at(&labels, &capacity, &nominated, &[]), base, "a nomination");
    let room = [("acme".to_string(), organization::Ceiling { cpu_millis: Some(4000), ..Default::default() })];
    assert_ne!(at(&labels, &capacity, &nominations, &room), base, "an organisation's room");
}

/// Issue 30 item 1: a budget's schedule is a change time alone brings. The verdict kept while the
/// window forbids is dropped when it closes, and the pass then decides.
#[test]
fn a_kept_verdict_ends_when_a_budget_window_closes() {
    let window = json!({"spec": {"disruption": {"budgets": [
        {"nodes": "1"}, {"nodes": "0", "schedule": "0 9 * * *", "duration": "4h"}
    ]}}});
    let mut c = cluster(window);
    add_node(&mut c, "default-a1", "XS", &[CONSOLIDATABLE]);
    // 12:00, inside 09:00–13:00: nothing may go.
    let (view, pass) = pass_at(&c, now());
    assert_eq!(command_of(&pass), None, "the window forbids");
    let inputs = 1u64; // the caches stand still: only time moves
    let kept = Kept::new(inputs, now(), view.scope.next_change(now()));
    let closes: Timestamp = "2026-11-25T13:00:00Z".parse().unwrap();
    assert!(kept.holds(&inputs, now() + Duration::from_secs(299)), "kept while nothing changes");
    assert_eq!(kept.left(now()), crate::decisions::kept_verdict::MAX_AGE, "the age limit comes first");
    // Looked at again at the age limit, it is kept until the window closes, not a second longer.
    let later = closes - Duration::from_secs(120);
    let kept = Kept::new(inputs, later, pass_at(&c, later).0.scope.next_change(later));
    assert!(kept.holds(&inputs, closes - Duration::from_secs(1)));
    assert!(!kept.holds(&inputs, closes), "the window's end is a change");
    let (_, pass) = pass_at(&c, closes);
    assert_eq!(command_of(&pass).map(|(m, _, _)| m), Some(Method::Emptiness), "and then the node goes");
}
