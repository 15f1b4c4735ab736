//! The webhook agrees with the CRDs on every example: each manifest under `examples/` is allowed
//! (warnings are fine), and each one under `examples/invalid/` that it validates is denied — the
//! webhook repeats the schema's rules, so objects that never met an API server get the same answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use crds::{CleverNodeClass, FlavorCatalog};
use serde_json::{Value, json};
use webhook::references::StaticReferences;
use webhook::review::{Kind, review};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text).unwrap().into_iter().filter(|v| !v.is_null()).collect()
}

fn kind_of(doc: &Value) -> Option<Kind> {
    Kind::ALL
        .into_iter()
        .find(|k| doc["apiVersion"] == "karpenter.clever-cloud.com/v1alpha1" && doc["kind"] == k.name())
}

/// The document in namespace `default` when it has none, as `kubectl apply` would place it (a
/// cluster-scoped kind stays without one).
fn with_namespace(mut doc: Value) -> Value {
    if doc["metadata"]["namespace"].is_null() && !kind_of(&doc).is_some_and(Kind::cluster_scoped) {
        doc["metadata"]["namespace"] = json!("default");
    }
    doc
}

fn body(kind: Kind, new: &Value, old: Option<&Value>) -> Vec<u8> {
    let mut request = json!({
        "uid": "example",
        "kind": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "kind": kind.name()},
        "operation": if old.is_some() { "UPDATE" } else { "CREATE" },
        "namespace": new["metadata"]["namespace"].clone(),
        "object": new,
    });
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
        .unwrap()
}

/// The classes and catalogues of a set of documents, served as the webhook would read them.
fn references(docs: &[Value]) -> StaticReferences {
    let mut refs = StaticReferences::default();
    for doc in docs {
        match kind_of(doc) {
            Some(Kind::CleverNodeClass) => {
                refs = refs.with_node_class(serde_json::from_value::<CleverNodeClass>(doc.clone()).unwrap())
            }
            Some(Kind::FlavorCatalog) => {
                refs = refs.with_flavor_catalog(serde_json::from_value::<FlavorCatalog>(doc.clone()).unwrap())
            }
            _ => {}
        }
    }
    refs
}

#[tokio::test]
async fn valid_examples_are_allowed() {
    let mut docs = Vec::new();
    for path in yaml_files(&repo().join("examples")) {
        docs.extend(documents(&path).into_iter().map(|d| (path.clone(), with_namespace(d))));
    }
    let all: Vec<Value> = docs.iter().map(|(_, d)| d.clone()).collect();
    let refs = references(&all);
    let mut checked = 0;
    for (path, doc) in &docs {
        let Some(kind) = kind_of(doc) else { continue };
        let answer = review(kind, &body(kind, doc, None), &refs).await.unwrap();
        assert!(answer.allowed, "{} ({} {}): {:?}", path.display(), kind, doc["metadata"]["name"], answer.message);
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} example objects found");
}

#[tokio::test]
async fn invalid_examples_are_denied() {
    let refs = StaticReferences::default();
    let mut checked = 0;
    for path in yaml_files(&repo().join("examples/invalid")) {
        for doc in documents(&path) {
            let Some(kind) = kind_of(&doc) else { continue };
            let answer = review(kind, &body(kind, &with_namespace(doc), None), &refs).await.unwrap();
            assert!(!answer.allowed, "{} was allowed (warnings: {:?})", path.display(), answer.warnings);
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} invalid examples found");
}

#[tokio::test]
async fn invalid_updates_are_denied() {
    let refs = StaticReferences::default();
    let mut checked = 0;
    for path in yaml_files(&repo().join("examples/invalid/updates")) {
        let docs = documents(&path);
        let [old, new] = &docs[..] else { panic!("{}: expected two documents", path.display()) };
        let Some(kind) = kind_of(new) else { continue };
        let (old, new) = (with_namespace(old.clone()), with_namespace(new.clone()));
        assert!(
            review(kind, &body(kind, &old, None), &refs).await.unwrap().allowed,
            "{}: the old object",
            path.display()
        );
        let answer = review(kind, &body(kind, &new, Some(&old)), &refs).await.unwrap();
        assert!(!answer.allowed, "{} was allowed", path.display());
        checked += 1;
    }
    assert!(checked >= 2);
}

/// The fleet examples (fleet.md §2): the webhook's own denial names the field and the fix, for
/// objects that never met an API server (the CRD's message is each file's `# expect:`).
#[tokio::test]
async fn fleet_examples_are_denied_naming_the_field_and_the_fix() {
    let refs = StaticReferences::default();
    let creates = [
        (
            "nodepool-cluster-name-and-selector.yaml",
            "spec: clusterName and clusterSelector are both set: keep clusterName",
        ),
        (
            "nodepool-missing-cluster-name.yaml",
            "spec: neither clusterName nor clusterSelector is set: name the workload cluster",
        ),
        (
            "nodepool-selector-in-without-values.yaml",
            "spec.clusterSelector.matchExpressions[0].values: operator In needs at least one value, e.g. values: [prod]",
        ),
        (
            "nodepool-selector-exists-with-values.yaml",
            "spec.clusterSelector.matchExpressions[0].values: operator Exists takes no values: remove them",
        ),
        (
            "nodepool-selector-bad-label-key.yaml",
            "spec.clusterSelector.matchLabels[\"deployment env\"]: is not a valid label key",
        ),
    ];
    for (file, expected) in creates {
        let path = repo().join("examples/invalid").join(file);
        let doc = with_namespace(documents(&path).remove(0));
        let answer = review(Kind::NodePool, &body(Kind::NodePool, &doc, None), &refs).await.unwrap();
        let message = answer.message.unwrap_or_default();
        assert!(!answer.allowed && message.contains(expected), "{file}: {message}");
    }
    let updates = [
        ("nodepool-cluster-name-removed.yaml", "spec.clusterName: clusterName \"prod-paris\" cannot be removed"),
        ("nodepool-cluster-name-added.yaml", "spec.clusterName: clusterName \"prod-paris\" cannot be added"),
    ];
    for (file, expected) in updates {
        let docs = documents(&repo().join("examples/invalid/updates").join(file));
        let (old, new) = (with_namespace(docs[0].clone()), with_namespace(docs[1].clone()));
        let answer = review(Kind::NodePool, &body(Kind::NodePool, &new, Some(&old)), &refs).await.unwrap();
        let message = answer.message.unwrap_or_default();
        assert!(!answer.allowed && message.contains(expected), "{file}: {message}");
        assert!(message.contains("create a new NodePool"), "{file}: the fix: {message}");
    }
}

/// A fleet pool's selector is mutable: the example's pool with its selector edited is allowed, with
/// a warning saying what happens to the clusters that stop matching.
#[tokio::test]
async fn a_fleet_pool_s_selector_may_be_edited() {
    let docs: Vec<Value> =
        documents(&repo().join("examples/fleet-nodepools.yaml")).into_iter().map(with_namespace).collect();
    let refs = references(&docs);
    let old = docs.iter().find(|d| d["kind"] == "NodePool").expect("the fleet example's NodePool").clone();
    assert!(old["spec"]["clusterSelector"].is_object() && old["spec"]["clusterName"].is_null(), "{old}");
    for selector in [
        json!({"matchLabels": {"env": "staging"}}),
        json!({"matchLabels": {"env": "prod"}, "matchExpressions": [{"key": "region", "operator": "In", "values": ["par", "lyo"]}]}),
        json!({}),
    ] {
        let mut new = old.clone();
        new["spec"]["clusterSelector"] = selector.clone();
        let answer = review(Kind::NodePool, &body(Kind::NodePool, &new, Some(&old)), &refs).await.unwrap();
        assert!(answer.allowed, "{selector}: {:?}", answer.message);
        assert!(answer.warnings.iter().any(|w| w.contains("ClusterNotSelected")), "{selector}: {:?}", answer.warnings);
    }
    // Unchanged selector, other edit: no selector warning.
    let mut new = old.clone();
    new["spec"]["weight"] = json!(20);
    let answer = review(Kind::NodePool, &body(Kind::NodePool, &new, Some(&old)), &refs).await.unwrap();
    assert!(answer.allowed && !answer.warnings.iter().any(|w| w.contains("ClusterNotSelected")), "{answer:?}");
}
