//! `karpenter-hub plan` on the examples: every manifest of `examples/*.yaml` is read sensibly (alone
//! and with a few pending pods), and every scenario of `examples/plan/` gives the decision recorded in
//! its `.expected.json` beside it (regenerate with `UPDATE_PLAN_EXPECTED=1 cargo test -p operator
//! --test plan`, then review the diff).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use operator::plan::{Plan, plan, read_snapshot, to_json};

mod common;
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
    // No NodePool: nothing can be provisioned.
    ("flavor-catalog.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // The class labels its nodes team=platform: the tool pod selecting it lands with the api pods.
    ("general-purpose.yaml", &["default:XS"], &[]),
    ("kubeconfig-secret.yaml", &[], &["platform/platform-tool", "shop/api-0", "shop/api-1"]),
    // minValues 2 on instance-type: options stay XS and S at least.
    ("min-values.yaml", &["flexible:XS"], &["platform/platform-tool"]),
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
