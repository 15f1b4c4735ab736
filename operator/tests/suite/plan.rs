//! `karpenter-hub plan` on the examples: every manifest of `examples/*.yaml` is read sensibly (alone
//! and with a few pending pods), and every scenario of `examples/plan/` gives the decision recorded in
//! its `.expected.json` beside it (regenerate with `UPDATE_PLAN_EXPECTED=1 cargo test -p operator
//! --test suite plan::`, then review the diff).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use operator::commands::plan::{DisruptionPlan, Plan, plan, plan_disruption, read_snapshot, to_json};

use crate::common;
use common::{repo, yaml_files};

fn plan_files(files: &[(String, String)]) -> Plan {
    let (snap, notes) = read_snapshot(files).unwrap_or_else(|e| panic!("{e}"));
    plan(&snap, None, notes).unwrap_or_else(|e| panic!("{e}"))
}

fn source(path: &Path) -> (String, String) {
    (path.display().to_string(), fs::read_to_string(path).unwrap())
}

const PENDING: &str = "
apiVersion: v1
kind: Pod
metadata: {name: api-0, namespace: shop}
spec:
  containers: [{name: app, image: registry.example/api:1, resources: {requests: {cpu: '1', memory: 2Gi}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: api-1, namespace: shop}
spec:
  containers: [{name: app, image: registry.example/api:1, resources: {requests: {cpu: '1', memory: 2Gi}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: platform-tool, namespace: platform}
spec:
  nodeSelector: {team: platform}
  tolerations: [{key: team, operator: Equal, value: platform, effect: NoSchedule}]
  containers: [{name: app, image: registry.example/tool:1, resources: {requests: {cpu: 500m, memory: 1Gi}}}]
";

/// Expected decision per example with the pending pods above: (file, claims as `pool:flavor`,
/// unschedulable pods).
const EXPECTED: &[(&str, &[&str], &[&str])] = &[
    // One pool, office-hours budgets: both api pods share a 2XS... (2 CPU, 4Gi > 3.63Gi: an XS).
    ("disruption-budgets.yaml", &["office-hours:XS"], &["platform/platform-tool"]),
    // A fleet pool, and no cluster registered in the manifests for it to select: no pool serves.
    ("fleet-nodepools.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // No NodePool: nothing can be provisioned.
    ("flavor-catalog.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // A CapacityBuffer alone: no pool, so no room is made; its pods are never unschedulable pods.
    ("capacity-buffer.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // The class labels its nodes team=platform: the tool pod selecting it lands with the api pods.
    ("general-purpose.yaml", &["default:XS"], &[]),
    ("kubeconfig-secret.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // An organisation alone: no pool, nothing provisioned (with a pool, examples/plan/organization-room.yaml).
    ("organization.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // NodeOverlays alone: no pool, nothing provisioned (with a pool, examples/plan/o01-node-overlay.yaml).
    ("node-overlay.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // minValues 2 on instance-type: options stay XS and S at least.
    ("min-values.yaml", &["flexible:XS"], &["platform/platform-tool"]),
    // A static pool only: it makes no node for pending pods (plan lists its own claims apart).
    ("static-nodepool.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // The team pool is tainted: only the tolerating tool pod may use it, and the api pods get nothing.
    ("team-dedicated.yaml", &["team-platform:XS"], &["shop/api-0", "shop/api-1"]),
    // preferred-small (weight 50) takes everything it can.
    ("weighted-nodepools.yaml", &["preferred-small:XS"], &["platform/platform-tool"]),
];

#[test]
fn every_example_is_read_and_planned_sensibly() {
    let files = yaml_files(&repo().join("examples"));
    assert!(!files.is_empty());
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        // Alone: nothing pending, nothing to do, nothing fails.
        let alone = plan_files(&[source(f)]);
        assert!(alone.node_claims.is_empty() && alone.unschedulable.is_empty(), "{name}: {alone:?}");
        // With pending pods: the recorded decision.
        let expected =
            EXPECTED.iter().find(|(n, ..)| *n == name).unwrap_or_else(|| panic!("{name}: add it to EXPECTED"));
        let p = plan_files(&[source(f), ("pending.yaml".into(), PENDING.into())]);
        let claims: Vec<String> = p.node_claims.iter().map(|c| format!("{}:{}", c.node_pool, c.flavor)).collect();
        let mut unschedulable: Vec<&str> = p.unschedulable.iter().map(|u| u.pod.as_str()).collect();
        unschedulable.sort_unstable();
        assert_eq!(claims, expected.1, "{name}: {p:#?}");
        assert_eq!(unschedulable, expected.2, "{name}: {p:#?}");
        for u in &p.unschedulable {
            assert!(!u.reason.is_empty(), "{name}: {} has no reason", u.pod);
        }
    }
}

#[test]
fn every_scenario_gives_its_expected_decision() {
    let dir = repo().join("examples/plan");
    let files = yaml_files(&dir);
    assert!(files.len() >= 20, "scenarios missing");
    let update = std::env::var_os("UPDATE_PLAN_EXPECTED").is_some();
    let mut failures = Vec::new();
    for f in &files {
        let p = plan_files(&[source(f)]);
        let got = to_json(&p);
        let expected_path = f.with_extension("expected.json");
        if update {
            fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_PLAN_EXPECTED=1", expected_path.display()));
        if got != expected {
            failures.push(format!("{}:\n--- expected\n{expected}\n--- got\n{got}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_binary_prints_json_and_tables() {
    let bin = env!("CARGO_BIN_EXE_karpenter-hub");
    let scenario = repo().join("examples/plan/c71-one-xs.yaml");
    let out =
        std::process::Command::new(bin).args(["plan", "-f"]).arg(&scenario).args(["-o", "json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodeClaims"][0]["flavor"], "XS");
    assert_eq!(v["totalPricePerHour"], 0.0611);
    let out = std::process::Command::new(bin).args(["plan", "-f"]).arg(&scenario).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("NODEPOOL"));
    // 85: the same minValues scenario as 84 under BestEffort gives options L, XL.
    let min_values = repo().join("examples/plan/c84-min-values.yaml");
    let out = std::process::Command::new(bin)
        .args(["plan", "-o", "json", "--min-values-policy", "best-effort", "-f"])
        .arg(&min_values)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodeClaims"][0]["instanceTypes"], serde_json::json!(["L", "XL"]));
    let bad = std::env::temp_dir().join("karpenter-hub-plan-bad.yaml");
    fs::write(&bad, "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {memory: 1GB}}}]}\n").unwrap();
    let out = std::process::Command::new(bin).args(["plan", "-f"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Pod default/a") && err.contains("spec.containers[c].resources.requests.memory"), "{err}");
}

const CLASS_AND_POOL: &str = "
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: CleverNodeClass
metadata: {name: default, namespace: demo}
spec: {}
---
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: NodePool
metadata: {name: web, namespace: demo}
spec:
  clusterName: demo
  weight: 10
  template:
    spec:
      nodeClassRef: {group: karpenter.clever-cloud.com, kind: CleverNodeClass, name: default}
      requirements: []
";

fn pod(name: &str, cpu: &str, memory: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  containers: [{{name: app, \
         image: registry.example/app:1, resources: {{requests: {{cpu: '{cpu}', memory: '{memory}'}}}}}}]\n"
    )
}

fn run_plan(args: &[&str], manifest: &str, file: &str) -> std::process::Output {
    let path = std::env::temp_dir().join(format!("karpenter-hub-plan-{}-{file}", std::process::id()));
    fs::write(&path, manifest).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
        .arg("plan")
        .args(args)
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    let _ = fs::remove_file(&path);
    out
}

/// Issue 13 item 9: what the management cluster refuses (the CRD schema's `weight >= 1` and its CEL
/// rule "Gt needs an integer", the webhook's "no flavor matches") is reported as a refusal naming the object, the field and the message, with
/// a failing exit and no plan; the same manifests with the fields corrected are planned.
#[test]
fn objects_the_cluster_refuses_are_reported_and_not_planned() {
    let weight_zero = CLASS_AND_POOL.replace("weight: 10", "weight: 0") + &pod("a", "1", "1Gi");
    let gt_abc = CLASS_AND_POOL
        .replace("requirements: []", "requirements: [{key: example.com/generation, operator: Gt, values: [abc]}]")
        + &pod("a", "1", "1Gi");
    // The schema accepts it; the webhook knows no flavor is called NOPE.
    let no_flavor = CLASS_AND_POOL.replace(
        "requirements: []",
        "requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [NOPE]}]",
    ) + &pod("a", "1", "1Gi");
    for (case, manifest, field, by) in [
        ("weight-0", &weight_zero, "spec.weight", "the API server"),
        ("gt-abc", &gt_abc, "spec.template.spec.requirements", "the API server"),
        ("no-flavor", &no_flavor, "spec.template.spec.requirements[0]", "the webhook"),
    ] {
        let err = read_snapshot(&[("hub.yaml".into(), manifest.clone())]).unwrap_err();
        let operator::commands::plan::PlanError::Refused(refusals) = &err else {
            panic!("{case}: not a refusal: {err}")
        };
        assert!(
            refusals.iter().all(|r| r.object == "hub.yaml: document 2 (NodePool demo/web)"),
            "{case}: {refusals:#?}"
        );
        assert!(refusals.iter().any(|r| r.field.starts_with(field)), "{case}: {refusals:#?}");
        assert!(refusals.iter().all(|r| !r.message.is_empty() && r.by == by), "{case}: {refusals:#?}");

        let out = run_plan(&["-o", "json"], manifest, &format!("{case}.yaml"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case}: {stderr}");
        assert!(out.stdout.is_empty(), "{case}: a plan was printed: {}", String::from_utf8_lossy(&out.stdout));
        assert!(
            stderr.contains("refus") && stderr.contains("NodePool demo/web") && stderr.contains(field),
            "{case}: {stderr}"
        );
    }
    // An organisation the API server refuses (its CEL: it limits nothing; a selector term without
    // values) stops the plan too, named.
    let org = |quota: &str| {
        format!(
            "apiVersion: karpenter.clever-cloud.com/v1alpha1\nkind: CleverOrganization\nmetadata: {{name: acme}}\n\
             spec: {{clusterSelector: {{}}{quota}}}\n"
        )
    };
    for (manifest, by) in [
        (org(""), "the API server"),
        (
            org(", quota: {cpu: '40'}, namespaceSelector: {matchExpressions: [{key: env, operator: In, values: []}]}"),
            "the API server",
        ),
    ] {
        let err = read_snapshot(&[("org.yaml".into(), manifest.clone())]).unwrap_err();
        let operator::commands::plan::PlanError::Refused(refusals) = &err else { panic!("not a refusal: {err}") };
        assert!(refusals.iter().all(|r| r.object == "org.yaml: document 1 (CleverOrganization acme)"), "{refusals:#?}");
        assert!(refusals.iter().any(|r| r.by == by && r.field.starts_with("spec")), "{manifest}: {refusals:#?}");
    }
    // The negative side: the same objects, valid, are planned.
    let fine = CLASS_AND_POOL
        .replace("requirements: []", "requirements: [{key: example.com/generation, operator: Gt, values: ['2']}]")
        + &pod("a", "1", "1Gi");
    let out = run_plan(&["-o", "json"], &fine, "fine.yaml");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 13 item 9: requests print as a person writes them: `1G` (not `1000000000`), `1Gi`, `500m`.
#[test]
fn quantities_print_as_written() {
    for (cpu, memory, want_cpu, want_memory) in
        [("500m", "1G", "500m", "1G"), ("1", "1Gi", "1", "1Gi"), ("250m", "1500M", "250m", "1500M")]
    {
        let p = plan_files(&[("q.yaml".into(), CLASS_AND_POOL.to_string() + &pod("a", cpu, memory))]);
        assert_eq!(p.node_claims.len(), 1, "{p:#?}");
        assert_eq!(p.node_claims[0].requests.cpu, want_cpu);
        assert_eq!(p.node_claims[0].requests.memory, want_memory);
    }
}

/// Issue 13 item 9: a pod given twice is one pod (the later document, as `kubectl apply` would
/// leave it), and the user is warned, naming the pod.
#[test]
fn a_pod_given_twice_is_warned_about_and_counted_once() {
    let manifest = CLASS_AND_POOL.to_string() + &pod("a", "1", "1Gi") + &pod("b", "1", "1Gi") + &pod("a", "2", "1Gi");
    let p = plan_files(&[("dup.yaml".into(), manifest.clone())]);
    let pods: Vec<&String> = p.node_claims.iter().flat_map(|c| &c.pods).collect();
    assert_eq!(pods.iter().filter(|k| k.as_str() == "shop/a").count(), 1, "{p:#?}");
    assert_eq!(p.node_claims.iter().map(|c| c.requests.cpu.as_str()).collect::<Vec<_>>(), ["3"], "{p:#?}");
    let warnings: Vec<&String> =
        p.notes.iter().filter(|n| n.contains("shop/a") && n.contains("more than once")).collect();
    assert_eq!(warnings.len(), 1, "{:?}", p.notes);
    assert!(!p.notes.iter().any(|n| n.contains("shop/b")), "{:?}", p.notes);
    let out = run_plan(&[], &manifest, "dup.yaml");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shop/a is given more than once"));
}

/// Issue 13 item 9: the table says which pods land on which new NodeClaim.
#[test]
fn the_table_shows_the_pods_of_each_claim() {
    let manifest = CLASS_AND_POOL.to_string() + &pod("a", "1", "1Gi") + &pod("b", "1", "1Gi");
    let out = run_plan(&[], &manifest, "table.yaml");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().any(|l| l.starts_with("  #1 (web ") && l.ends_with("): shop/a, shop/b")), "{table}");
}

/// The instant every `examples/plan-disruption/` scenario is decided at (`--now`): a day after the
/// claims were created.
const DISRUPTION_NOW: &str = "2026-11-25T12:00:00Z";

fn disruption_plan_files(files: &[(String, String)]) -> DisruptionPlan {
    let (snap, notes) = read_snapshot(files).unwrap_or_else(|e| panic!("{e}"));
    plan_disruption(&snap, None, Default::default(), DISRUPTION_NOW.parse().unwrap(), notes)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Issue 12 item 5: each disruption scenario gives the decision recorded beside it (regenerated
/// with `UPDATE_PLAN_EXPECTED=1`), and the decision is the one the scenario is about: method,
/// candidates, replacements, savings, or the reason nothing happens.
#[test]
fn every_disruption_scenario_gives_its_expected_decision() {
    let dir = repo().join("examples/plan-disruption");
    let files = yaml_files(&dir);
    assert!(files.len() >= 6, "scenarios missing");
    let update = std::env::var_os("UPDATE_PLAN_EXPECTED").is_some();
    let mut failures = Vec::new();
    for f in &files {
        let p = disruption_plan_files(&[source(f)]);
        let got = operator::commands::plan::disruption_json(&p);
        let expected_path = f.with_extension("expected.json");
        if update {
            fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_PLAN_EXPECTED=1", expected_path.display()));
        if got != expected {
            failures.push(format!("{}:\n--- expected\n{expected}\n--- got\n{got}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn scenario(name: &str) -> DisruptionPlan {
    disruption_plan_files(&[source(&repo().join("examples/plan-disruption").join(format!("{name}.yaml")))])
}

fn decided(p: &DisruptionPlan) -> (&str, Vec<&str>, Vec<&str>, f64) {
    let c = p.decision.as_ref().unwrap_or_else(|| panic!("no decision: {p:#?}"));
    (
        c.method.as_str(),
        c.candidates.iter().map(|c| c.node_claim.as_str()).collect(),
        c.replacements.iter().map(|r| r.flavor.as_str()).collect(),
        c.savings_per_hour,
    )
}

#[test]
fn an_empty_node_is_deleted_and_the_busy_one_kept() {
    let p = scenario("d1-empty-node");
    assert_eq!(decided(&p), ("emptiness", vec!["default-a1"], vec![], 0.0611), "{p:#?}");
    assert_eq!(p.decision.as_ref().unwrap().reason, "Empty");
    // 10 % of two nodes, rounded up: one may go.
    assert_eq!(p.budgets[0].allowed["Empty"], 1, "{p:#?}");
}

#[test]
fn an_under_used_node_is_replaced_by_a_cheaper_one_launched_first() {
    let p = scenario("d2-underused-replace");
    assert_eq!(decided(&p), ("single-node consolidation", vec!["default-l1"], vec!["2XS"], 0.1334), "{p:#?}");
    let c = p.decision.as_ref().unwrap();
    assert_eq!(c.candidates[0].pods, ["shop/web-1"]);
    assert_eq!(c.candidates[0].price_per_hour, 0.1667);
    assert!(c.summary.contains("launch one node in NodePool default"), "{}", c.summary);
    // The loop's order: emptiness and drift found nothing before consolidation decided.
    let methods: Vec<&str> = p.methods.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(methods, ["emptiness", "drift", "multi-node consolidation", "single-node consolidation"]);
}

#[test]
fn a_drifted_node_is_replaced_even_when_the_pool_only_consolidates_empty_nodes() {
    let p = scenario("d3-drifted");
    let (method, claims, replacements, _) = decided(&p);
    assert_eq!((method, claims, replacements), ("drift", vec!["default-d1"], vec!["XS"]), "{p:#?}");
    assert_eq!(p.decision.as_ref().unwrap().reason, "Drifted");
}

#[test]
fn a_budget_of_zero_a_do_not_disrupt_pod_or_a_pdb_blocks_and_says_why() {
    let p = scenario("d4-budget-zero");
    assert!(p.decision.is_none(), "{p:#?}");
    assert!(p.methods[0].budget_constrained, "{p:#?}");
    assert_eq!(p.budgets[0].allowed.values().copied().collect::<Vec<_>>(), [0, 0, 0]);
    for (name, why) in [
        ("d5-do-not-disrupt", "pod shop/batch-1 has karpenter.sh/do-not-disrupt"),
        ("d6-pdb-blocks", "PDB shop/web allows no disruption of pod shop/web-1"),
    ] {
        let p = scenario(name);
        assert!(p.decision.is_none(), "{name}: {p:#?}");
        let blocked: Vec<_> = p.methods.iter().flat_map(|m| &m.blocked).collect();
        assert!(!blocked.is_empty(), "{name}: {p:#?}");
        assert!(blocked.iter().all(|b| b.node_claim == "default-l1" && b.reason.contains(why)), "{name}: {blocked:#?}");
        // The budget is not what holds it back.
        assert!(p.methods.iter().all(|m| !m.budget_constrained), "{name}: {p:#?}");
    }
}

#[test]
fn the_binary_plans_disruption_as_json_and_as_a_table() {
    let d2 = repo().join("examples/plan-disruption/d2-underused-replace.yaml");
    let bin = env!("CARGO_BIN_EXE_karpenter-hub");
    let out = std::process::Command::new(bin)
        .args(["plan", "--disruption", "--now", DISRUPTION_NOW, "-o", "json", "-f"])
        .arg(&d2)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["now"], DISRUPTION_NOW);
    assert_eq!(v["decision"]["method"], "single-node consolidation");
    assert_eq!(v["decision"]["replacements"][0]["flavor"], "2XS");
    let out = std::process::Command::new(bin).args(["plan", "--disruption", "-f"]).arg(&d2).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("delete default-l1") && table.contains("launch first: NodePool default, 2XS"), "{table}");
    // The negative side: without --disruption the same snapshot is a provisioning plan (nothing pending).
    let out = std::process::Command::new(bin).args(["plan", "-o", "json", "-f"]).arg(&d2).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("decision").is_none() && v["nodeClaims"] == serde_json::json!([]), "{v}");
}

/// Bad input to `plan --disruption` fails with the flag, object and field named, and no plan printed.
#[test]
fn bad_disruption_input_names_the_object_and_field() {
    let d2 = fs::read_to_string(repo().join("examples/plan-disruption/d2-underused-replace.yaml")).unwrap();
    let out = run_plan(&["--disruption", "--now", "yesterday"], &d2, "bad-now.yaml");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert!(err.contains("--now \"yesterday\" is not an RFC 3339 instant"), "{err}");
    // --now means nothing to a provisioning plan.
    let out = run_plan(&["--now", DISRUPTION_NOW], &d2, "now-alone.yaml");
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--disruption"));
    let bad_cost = d2.replacen(
        "\"namespace\": \"shop\",",
        "\"namespace\": \"shop\", \"annotations\": {\"controller.kubernetes.io/pod-deletion-cost\": \"cheap\"},",
        1,
    );
    assert_ne!(bad_cost, d2);
    let out = run_plan(&["--disruption", "--now", DISRUPTION_NOW], &bad_cost, "bad-cost.yaml");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert!(
        err.contains("Pod shop/web-1")
            && err.contains("metadata.annotations[controller.kubernetes.io/pod-deletion-cost]")
            && err.contains("\"cheap\""),
        "{err}"
    );
    let bad_pdb = d2.clone()
        + "---\n{\"apiVersion\": \"policy/v1\", \"kind\": \"PodDisruptionBudget\", \"metadata\": {\"name\": \"web\", \
           \"namespace\": \"shop\"}, \"spec\": {\"selector\": {\"matchExpressions\": [{\"key\": \"app\", \"operator\": \
           \"Sometimes\"}]}}}\n";
    let out = run_plan(&["--disruption", "--now", DISRUPTION_NOW], &bad_pdb, "bad-pdb.yaml");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("PodDisruptionBudget shop/web") && err.contains("spec.selector"), "{err}");
}

#[test]
fn under_used_nodes_are_consolidated_together_within_the_budget() {
    let p = scenario("d7-multi-node");
    assert_eq!(decided(&p), ("multi-node consolidation", vec!["default-x1", "default-x2"], vec![], 0.1222), "{p:#?}");
    assert_eq!(p.budgets[0].allowed["Underutilized"], 3, "{p:#?}");
}

/// fleet.md §2: the fleet example is planned for paris, the one of its two registered clusters whose
/// labels (the Secret's over the Cluster API Cluster's) the fleet pool selects; `--cluster lyon`,
/// whose Secret's env=staging wins over its Cluster's env=prod, is refused with the labels named.
#[test]
fn a_fleet_pool_is_planned_for_the_registered_cluster_it_selects() {
    let example = repo().join("examples/plan/fleet-two-clusters.yaml");
    let p = plan_files(&[source(&example)]);
    assert_eq!(p.cluster, "paris", "{p:#?}");
    assert_eq!(p.node_claims.iter().map(|c| c.node_pool.as_str()).collect::<Vec<_>>(), ["prod"], "{p:#?}");
    let bin = env!("CARGO_BIN_EXE_karpenter-hub");
    let out = std::process::Command::new(bin).args(["plan", "-f"]).arg(&example).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Cluster paris: 1 new NodeClaim(s)"));
    let out = std::process::Command::new(bin).args(["plan", "--cluster", "lyon", "-f"]).arg(&example).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert!(err.contains("--cluster lyon: no NodePool in the manifests serves cluster lyon"), "{err}");
    assert!(
        err.contains("namespace demo with labels {cluster.x-k8s.io/cluster-name=lyon,env=staging,region=lyo}"),
        "{err}"
    );
}

/// fleet.md §3: d3's drifted node, its pool rolling its template out with the cluster `Pending` in
/// the pool's status: the drift waits, and the plan says why; the cluster's turn lets it go.
#[test]
fn a_rollout_holds_back_drift_in_a_cluster_whose_turn_it_is_not() {
    let p = scenario("d9-rollout-holds-drift");
    assert!(p.decision.is_none(), "{p:#?}");
    assert!(
        p.notes.iter().any(|n| n.contains("its drifted nodes wait for the rollout: cluster demo is Pending")),
        "{:?}",
        p.notes
    );
    let path = repo().join("examples/plan-disruption/d9-rollout-holds-drift.yaml");
    let text = fs::read_to_string(&path).unwrap().replace("\"phase\": \"Pending\"", "\"phase\": \"Progressing\"");
    let turn = disruption_plan_files(&[(path.display().to_string(), text)]);
    let (method, claims, _, _) = decided(&turn);
    assert_eq!((method, claims), ("drift", vec!["default-d1"]), "{turn:#?}");
}

/// fleet.md §2: the nodes a fleet pool has in a cluster that left its selection drift
/// (`ClusterNotSelected`) within that pool's budget, one at a time here, and are replaced by the
/// pool still serving the cluster, not by the departed one although it weighs more.
#[test]
fn a_cluster_that_left_a_fleet_pool_drifts_its_nodes_within_the_pool_s_budget() {
    let p = scenario("d8-cluster-left-fleet");
    let (method, claims, _, _) = decided(&p);
    assert_eq!((p.cluster.as_str(), method, claims), ("lyon", "drift", vec!["web-1"]), "{p:#?}");
    let replacements: Vec<&str> =
        p.decision.as_ref().unwrap().replacements.iter().map(|r| r.node_pool.as_str()).collect();
    assert_eq!(replacements, ["general"], "{p:#?}");
    let web = p.budgets.iter().find(|b| b.node_pool == "web").expect("the departed pool's budget");
    assert_eq!((web.nodes, web.allowed["Drifted"]), (2, 1), "{p:#?}");
}
