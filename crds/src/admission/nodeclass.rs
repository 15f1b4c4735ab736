//! Admission of a `CleverNodeClass` (clever-cloud.md §7.1): labels CKE will carry on NodeGroups, a
//! name that fits the label the hub stamps, and the `flavorCatalogRef` it points at.

use crate::admission::{
    Lookup, Verdict, check_label_value, check_name_is_label_value, label_key_problem, validate_flavor_catalog,
};
use crate::drift::nodeclass_hash;
use crate::flavorcatalog::FlavorCatalog;
use crate::labels::{CKE_RESERVED_PREFIXES, NODECLASS};
use crate::nodeclass::CleverNodeClass;
use crate::validation::{dns1123_subdomain, in_domain};

/// Label domains of the system: the hub's ownership labels and Karpenter's.
const SYSTEM_DOMAINS: [&str; 2] = ["karpenter.sh", "karpenter.clever-cloud.com"];

/// Validates a `CleverNodeClass`. `catalog` is the `FlavorCatalog` named by `spec.flavorCatalogRef`
/// (ignored when there is none).
///
/// Denied: label keys that are not qualified names (exact part lengths), that start with a prefix CKE
/// refuses (`kubernetes.io/`, `node.kubernetes.io/`, `clever-cloud.com/`), that contain
/// `kubernetes.io/` anywhere (the hub drops them from NodeGroups: accepted here they would silently
/// vanish), or that sit in the `karpenter.sh` / `karpenter.clever-cloud.com` domains; invalid label
/// values; a name over 63 characters; an invalid catalogue reference name.
///
/// A referenced catalogue that is missing, invalid or could not be read is a **warning**, not a
/// denial: the hub handles a dangling reference (it serves the built-in catalogue and says so in a
/// condition), and denying would break applying a class before its catalogue (GitOps tools sort
/// kinds alphabetically). Changing the labels of an existing class is warned: its nodes drift.
pub fn validate_node_class(
    new: &CleverNodeClass,
    old: Option<&CleverNodeClass>,
    catalog: Lookup<&FlavorCatalog>,
) -> Verdict {
    let mut verdict = Verdict::default();
    check_name_is_label_value(&mut verdict, new.metadata.name.as_deref(), NODECLASS);
    for (key, value) in &new.spec.labels {
        let field = format!("spec.labels[{key}]");
        if let Some(problem) = class_label_key_problem(key) {
            verdict.deny(&field, problem);
        }
        check_label_value(&mut verdict, &field, value);
    }
    if let Some(reference) = &new.spec.flavor_catalog_ref {
        let field = "spec.flavorCatalogRef.name";
        let name = &reference.name;
        let namespace = new.metadata.namespace.as_deref().unwrap_or("this namespace");
        if let Err(reason) = dns1123_subdomain(name) {
            verdict.deny(field, format!("{name:?} is not a valid FlavorCatalog name: it {reason}"));
        } else {
            match catalog {
                Lookup::Found(catalog) => {
                    if let Some(problem) = validate_flavor_catalog(catalog, None).denials.first() {
                        verdict.warn(
                            field,
                            format!(
                                "FlavorCatalog {name} is invalid ({problem}): the hub serves the built-in catalogue \
                                 to this class until it is fixed"
                            ),
                        );
                    }
                }
                Lookup::Missing => verdict.warn(
                    field,
                    format!(
                        "FlavorCatalog {name} does not exist in {namespace}: the hub serves the built-in catalogue \
                         until it does; create it or fix the name"
                    ),
                ),
                Lookup::Unchecked(why) => {
                    verdict.warn(field, format!("could not check that FlavorCatalog {name} exists: {why}"))
                }
            }
        }
    }
    if let Some(old) = old
        && nodeclass_hash(&old.spec) != nodeclass_hash(&new.spec)
    {
        verdict.warn(
            "spec.labels",
            "changing the labels makes every node of this class drifted: the hub replaces them, a new node launched \
             before each old one goes, within their pools' Drifted disruption budgets",
        );
    }
    verdict
}

/// Why a key cannot be a node class label, naming where it belongs instead.
fn class_label_key_problem(key: &str) -> Option<String> {
    if let Some(problem) = label_key_problem(key) {
        return Some(problem);
    }
    if let Some(prefix) = CKE_RESERVED_PREFIXES.iter().find(|p| key.starts_with(*p)) {
        return Some(format!(
            "prefix {prefix} is refused by CKE on NodeGroups (kubernetes.io/, node.kubernetes.io/ and clever-cloud.com/ \
             belong to the platform); use your own prefix (e.g. example.com/role), or set it in a NodePool's \
             spec.template.metadata.labels, which the hub applies at registration"
        ));
    }
    if key.contains("kubernetes.io/") {
        return Some(
            "keys containing kubernetes.io/ are dropped from NodeGroups (the hub sets them at registration); move \
             it to a NodePool's spec.template.metadata.labels"
                .to_string(),
        );
    }
    if let Some(domain) = SYSTEM_DOMAINS.iter().find(|d| in_domain(key, d)) {
        return Some(format!(
            "domain {domain} is reserved for the system (ownership and Karpenter labels); use your own prefix, e.g. \
             example.com/team"
        ));
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::flavorcatalog::{FlavorCatalogSpec, FlavorOverride};
    use crate::nodeclass::{CleverNodeClassSpec, FlavorCatalogReference};

    fn class(labels: &[(&str, &str)], catalog: Option<&str>) -> CleverNodeClass {
        let mut c = CleverNodeClass::new(
            "default",
            CleverNodeClassSpec {
                labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                flavor_catalog_ref: catalog.map(|n| FlavorCatalogReference { name: n.to_string() }),
            },
        );
        c.metadata.namespace = Some("team-a".into());
        c
    }

    fn denied_fields(v: &Verdict) -> Vec<String> {
        v.denials.iter().map(|d| d.field.clone()).collect()
    }

    #[test]
    fn plain_labels_are_allowed() {
        let v = validate_node_class(
            &class(&[("team", "a"), ("example.com/tier", "gold"), ("empty", "")], None),
            None,
            Lookup::Missing,
        );
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn reserved_and_malformed_keys_are_denied_with_the_fix() {
        let cases = [
            ("kubernetes.io/role", "refused by CKE"),
            ("node.kubernetes.io/pool", "refused by CKE"),
            ("clever-cloud.com/flavor", "refused by CKE"),
            ("topology.kubernetes.io/zone", "spec.template.metadata.labels"),
            ("node-role.kubernetes.io/worker", "dropped from NodeGroups"),
            ("karpenter.sh/nodepool", "reserved for the system"),
            ("sub.karpenter.clever-cloud.com/x", "reserved for the system"),
            ("team name", "not a valid label key"),
            ("Example.com/team", "not a valid label key"),
        ];
        for (key, expect) in cases {
            let v = validate_node_class(&class(&[(key, "a")], None), None, Lookup::Missing);
            assert_eq!(denied_fields(&v), [format!("spec.labels[{key}]")], "{key}");
            assert!(v.denials[0].message.contains(expect), "{key}: {}", v.denials[0].message);
        }
        // Exact part lengths, which the CRD pattern cannot count.
        let long_name = format!("example.com/{}", "a".repeat(64));
        let v = validate_node_class(&class(&[(&long_name, "a")], None), None, Lookup::Missing);
        assert!(v.denials[0].message.contains("at most 63"), "{v:?}");
        let long_prefix = format!("{}.com/a", "b".repeat(250));
        assert!(!validate_node_class(&class(&[(&long_prefix, "a")], None), None, Lookup::Missing).is_allowed());
    }

    #[test]
    fn bad_values_and_long_names_are_denied() {
        let v = validate_node_class(&class(&[("team", &"a".repeat(64))], None), None, Lookup::Missing);
        assert!(v.denials[0].message.contains("at most 63"), "{v:?}");
        let v = validate_node_class(&class(&[("team", "-a")], None), None, Lookup::Missing);
        assert!(!v.is_allowed());
        let mut c = class(&[], None);
        c.metadata.name = Some("a".repeat(64));
        let v = validate_node_class(&c, None, Lookup::Missing);
        assert_eq!(denied_fields(&v), ["metadata.name"]);
        assert!(v.denials[0].message.contains("karpenter.clever-cloud.com/nodeclass"));
    }

    #[test]
    fn catalogue_reference_problems_are_warnings() {
        let c = class(&[], Some("negotiated"));
        let v = validate_node_class(&c, None, Lookup::Missing);
        assert!(v.is_allowed());
        assert_eq!(v.warnings[0].field, "spec.flavorCatalogRef.name");
        assert!(v.warnings[0].message.contains("does not exist in team-a"), "{v:?}");
        let v = validate_node_class(&c, None, Lookup::Unchecked("no API client configured".into()));
        assert!(v.is_allowed() && v.warnings[0].message.contains("no API client configured"));
        let good = FlavorCatalog::new(
            "negotiated",
            FlavorCatalogSpec {
                flavors: vec![FlavorOverride { name: "M".into(), cpu: None, memory_ki: None, price_hourly: Some(0.1) }],
            },
        );
        assert_eq!(validate_node_class(&c, None, Lookup::Found(&good)), Verdict::default());
        let mut bad = good.clone();
        bad.spec.flavors[0].name = "NEW".into();
        let v = validate_node_class(&c, None, Lookup::Found(&bad));
        assert!(v.is_allowed() && v.warnings[0].message.contains("is invalid"), "{v:?}");
        let v = validate_node_class(&class(&[], Some("Bad_Name")), None, Lookup::Missing);
        assert_eq!(denied_fields(&v), ["spec.flavorCatalogRef.name"]);
    }

    #[test]
    fn changing_labels_warns_about_drift() {
        let old = class(&[("team", "a")], None);
        let v = validate_node_class(&class(&[("team", "b")], None), Some(&old), Lookup::Missing);
        assert!(v.is_allowed() && v.warnings[0].message.contains("drift"), "{v:?}");
        let v = validate_node_class(&class(&[("team", "a")], Some("x")), Some(&old), Lookup::Unchecked(String::new()));
        assert!(!v.warning_messages().iter().any(|w| w.contains("drift")));
    }
}
