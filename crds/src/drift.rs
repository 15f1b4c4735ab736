//! Drift hashes: stable, versioned fingerprints of the parts of a `CleverNodeClass` and of a NodePool
//! template that, when changed, mean existing nodes no longer match (docs/drift-hash.md).
//!
//! Pure and frozen: a hash version, once released, never changes its output (golden tests pin
//! known values). Changing the algorithm or the covered fields means a new version string, and the
//! re-stamp rule ([`judge`]) guarantees an upgrade never rolls the fleet. Must not read time or I/O.

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{nodeclass::CleverNodeClassSpec, nodepool::NodePoolSpec};

/// Current version of the CleverNodeClass hash.
pub const NODECLASS_HASH_VERSION: &str = "v1";
/// Current version of the NodePool template hash.
pub const NODEPOOL_HASH_VERSION: &str = "hub-v1";

/// Annotation carrying the CleverNodeClass hash on NodeClaims and NodeGroups.
pub const NODECLASS_HASH_ANNOTATION: &str = "karpenter.clever-cloud.com/clevernodeclass-hash";
/// Annotation carrying the CleverNodeClass hash version.
pub const NODECLASS_HASH_VERSION_ANNOTATION: &str = "karpenter.clever-cloud.com/clevernodeclass-hash-version";
/// Annotation carrying the NodePool template hash on NodePools and NodeClaims.
pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
/// Annotation carrying the NodePool template hash version.
pub const NODEPOOL_HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";

/// `v1` hash of a CleverNodeClass: covers `spec.labels` only (`flavorCatalogRef` changes prices, not
/// nodes). An absent and an empty map hash the same.
pub fn nodeclass_hash(spec: &CleverNodeClassSpec) -> String {
    let mut doc = BTreeMap::new();
    if !spec.labels.is_empty() {
        doc.insert("labels", string_map(&spec.labels));
    }
    hash16(&doc)
}

/// `hub-v1` hash of a NodePool template: labels, annotations, taints and startupTaints (as sets),
/// nodeClassRef, expireAfter, terminationGracePeriod. Not covered: requirements (they drift through
/// `RequirementsDrifted`), disruption, limits, weight, clusterName, clusterSelector (a cluster leaving a selection drifts as `ClusterNotSelected`), rollout (it paces this hash's drift). Empty equals absent, and
/// `expireAfter` at its default (`720h`) equals absent.
pub fn nodepool_hash(spec: &NodePoolSpec) -> String {
    let template = &spec.template;
    let mut doc: BTreeMap<&str, Value> = BTreeMap::new();
    if let Some(meta) = &template.metadata {
        if !meta.labels.is_empty() {
            doc.insert("labels", string_map(&meta.labels));
        }
        if !meta.annotations.is_empty() {
            doc.insert("annotations", string_map(&meta.annotations));
        }
    }
    for (name, taints) in [("taints", &template.spec.taints), ("startupTaints", &template.spec.startup_taints)] {
        if !taints.is_empty() {
            // A set: order and duplicates in the manifest do not matter.
            let mut set: Vec<String> = taints
                .iter()
                .map(|t| format!("{}={}:{}", t.key, t.value.as_deref().unwrap_or(""), t.effect.as_str()))
                .collect();
            set.sort();
            set.dedup();
            doc.insert(name, Value::from(set));
        }
    }
    let r = &template.spec.node_class_ref;
    doc.insert("nodeClassRef", Value::from(vec![r.group.clone(), r.kind.clone(), r.name.clone()]));
    if template.spec.expire_after != crate::nodepool::DEFAULT_EXPIRE_AFTER {
        doc.insert("expireAfter", Value::from(template.spec.expire_after.clone()));
    }
    if let Some(tgp) = &template.spec.termination_grace_period {
        doc.insert("terminationGracePeriod", Value::from(tgp.clone()));
    }
    hash16(&doc)
}

fn string_map(map: &BTreeMap<String, String>) -> Value {
    Value::Object(map.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect())
}

fn hash16(doc: &BTreeMap<&str, Value>) -> String {
    let mut canonical = String::new();
    write_canonical(&Value::Object(doc.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()), &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Canonical JSON: keys sorted by their UTF-8 bytes, no whitespace. Sorted explicitly rather than
/// relying on `serde_json::Map` order, which a feature flag elsewhere in the build could change.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// What to do with a stamped hash when the current object is hashed again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Same version, same hash: nothing to do.
    InSync,
    /// Same version, different hash: the node drifted.
    Drifted,
    /// The stamp was made by another algorithm version: re-stamp with the current one, no drift, so that
    /// an upgrade never replaces the fleet.
    Restamp,
    /// No stamp: never drifted (and nothing to re-stamp from).
    Unstamped,
}

/// Compares a stamp (hash, version) with the current (hash, version).
pub fn judge(
    stamp_hash: Option<&str>,
    stamp_version: Option<&str>,
    current_hash: &str,
    current_version: &str,
) -> Judgement {
    match (stamp_hash, stamp_version) {
        (Some(h), Some(v)) if v == current_version => {
            if h == current_hash {
                Judgement::InSync
            } else {
                Judgement::Drifted
            }
        }
        (Some(_), _) => Judgement::Restamp,
        (None, _) => Judgement::Unstamped,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn class(labels: &[(&str, &str)]) -> CleverNodeClassSpec {
        CleverNodeClassSpec {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            flavor_catalog_ref: None,
        }
    }

    fn pool(yaml: &str) -> NodePoolSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const POOL: &str = "clusterName: prod\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.clever-cloud.com, kind: CleverNodeClass, name: default}\n    requirements: []\n";

    // Golden values: these must never change for v1 / hub-v1. If one fails, you changed the algorithm:
    // restore it, or introduce a new version (docs/drift-hash.md).
    #[test]
    fn nodeclass_v1_golden_values() {
        assert_eq!(nodeclass_hash(&class(&[])), "44136fa355b3678a");
        assert_eq!(nodeclass_hash(&class(&[("team", "platform")])), "21fbc71f2e7e4472");
        assert_eq!(nodeclass_hash(&class(&[("team", "platform"), ("env", "prod")])), "daa30a18f43d39a8");
    }

    #[test]
    fn nodepool_hub_v1_golden_values() {
        assert_eq!(nodepool_hash(&pool(POOL)), "5aeaf7324ba58bc6");
        let with_all = format!(
            "{POOL}    taints: [{{key: team, value: a, effect: NoSchedule}}]\n    startupTaints: [{{key: init, effect: NoExecute}}]\n    expireAfter: 24h\n    terminationGracePeriod: 1h\n  metadata:\n    labels: {{team: a}}\n    annotations: {{note: x}}\n"
        );
        assert_eq!(nodepool_hash(&pool(&with_all)), "77e1a0797eea006c");
    }

    #[test]
    fn nodeclass_canonical_form_is_documented_form() {
        // docs/drift-hash.md states the canonical document; keep the two in step.
        let mut s = String::new();
        write_canonical(&serde_json::json!({"labels": {"team": "platform", "env": "prod"}}), &mut s);
        assert_eq!(s, r#"{"labels":{"env":"prod","team":"platform"}}"#);
    }

    #[test]
    fn flavor_catalog_ref_does_not_drift() {
        let mut c = class(&[("team", "a")]);
        let before = nodeclass_hash(&c);
        c.flavor_catalog_ref = Some(crate::nodeclass::FlavorCatalogReference { name: "cheap".into() });
        assert_eq!(nodeclass_hash(&c), before);
    }

    #[test]
    fn pool_fields_outside_the_hash_do_not_drift() {
        let base = nodepool_hash(&pool(POOL));
        let changed = format!(
            "{}\nweight: 50\nlimits: {{cpu: 10}}\ndisruption: {{consolidateAfter: 5m, budgets: [{{nodes: '0'}}]}}\n",
            POOL.replace(
                "requirements: []",
                "requirements: [{key: clever-cloud.com/flavor, operator: In, values: [XS]}]"
            )
        );
        assert_eq!(nodepool_hash(&pool(&changed)), base);
        // The default expireAfter equals an absent one.
        assert_eq!(nodepool_hash(&pool(&format!("{POOL}    expireAfter: 720h\n"))), base);
        // nodeClassRef.name is covered.
        assert_ne!(nodepool_hash(&pool(&POOL.replace("name: default", "name: other"))), base);
    }

    #[test]
    fn judge_follows_the_restamp_rule() {
        assert_eq!(judge(Some("a"), Some("v1"), "a", "v1"), Judgement::InSync);
        assert_eq!(judge(Some("a"), Some("v1"), "b", "v1"), Judgement::Drifted);
        assert_eq!(judge(Some("a"), Some("v0"), "b", "v1"), Judgement::Restamp);
        assert_eq!(judge(Some("a"), None, "b", "v1"), Judgement::Restamp);
        assert_eq!(judge(None, None, "b", "v1"), Judgement::Unstamped);
    }

    proptest! {
        #[test]
        fn nodeclass_hash_ignores_insertion_order(pairs in proptest::collection::vec(("[a-z]{1,8}", "[a-z0-9]{0,8}"), 0..12)) {
            let forward: BTreeMap<String, String> = pairs.iter().cloned().collect();
            let backward: BTreeMap<String, String> = pairs.iter().rev().cloned().collect::<Vec<_>>().into_iter().rev().collect();
            let a = CleverNodeClassSpec { labels: forward, flavor_catalog_ref: None };
            let b = CleverNodeClassSpec { labels: backward, flavor_catalog_ref: None };
            prop_assert_eq!(nodeclass_hash(&a), nodeclass_hash(&b));
            prop_assert_eq!(nodeclass_hash(&a).len(), 16);
        }

        #[test]
        fn nodeclass_hash_changes_with_any_label_change(pairs in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{1,8}", 1..8), extra in "[a-z]{9,12}") {
            let a = CleverNodeClassSpec { labels: pairs.clone(), flavor_catalog_ref: None };
            let mut more = pairs.clone();
            more.insert(extra, "x".into());
            let b = CleverNodeClassSpec { labels: more, flavor_catalog_ref: None };
            prop_assert_ne!(nodeclass_hash(&a), nodeclass_hash(&b));
        }

        #[test]
        fn taint_order_does_not_matter(keys in proptest::collection::vec("[a-z]{1,6}", 1..6)) {
            let taints = |ks: &[String]| ks.iter().map(|k| format!("{{key: {k}, effect: NoSchedule}}")).collect::<Vec<_>>().join(", ");
            let mut rev = keys.clone();
            rev.reverse();
            let a = pool(&format!("{POOL}    taints: [{}]\n", taints(&keys)));
            let b = pool(&format!("{POOL}    taints: [{}]\n", taints(&rev)));
            prop_assert_eq!(nodepool_hash(&a), nodepool_hash(&b));
        }
    }
}
