//! Label selectors and the namespaces of pod (anti-)affinity terms (karpenter-semantics §3.11):
//! which pods a term or a spread constraint selects.
//!
//! Owns matching of a selector against a pod's labels and namespace. Must not count pods or pick
//! domains ([`crate::topology`] does).

use std::collections::BTreeMap;

use crate::model::{LabelSelector, SelectorOperator};

/// Whether a selector matches a label map (the empty selector matches everything).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().all(|e| {
            let value = labels.get(&e.key);
            match e.operator {
                SelectorOperator::In => value.is_some_and(|v| e.values.contains(v)),
                SelectorOperator::NotIn => value.is_none_or(|v| !e.values.contains(v)),
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// The namespaces a term applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespaces {
    /// Every namespace (an empty `namespaceSelector`).
    All,
    /// These namespaces, sorted.
    List(Vec<String>),
}

impl Namespaces {
    /// Resolves `namespaces` ∪ namespaces matched by `namespaceSelector`; both absent ⇒ the owner's own.
    pub fn resolve(
        owner: &str,
        listed: &[String],
        selector: Option<&LabelSelector>,
        namespace_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Namespaces {
        match selector {
            Some(sel) if sel.match_labels.is_empty() && sel.match_expressions.is_empty() => Namespaces::All,
            Some(sel) => {
                let mut out: Vec<String> = listed.to_vec();
                out.extend(namespace_labels.iter().filter(|(_, l)| selector_matches(sel, l)).map(|(n, _)| n.clone()));
                out.sort();
                out.dedup();
                Namespaces::List(out)
            }
            None if listed.is_empty() => Namespaces::List(vec![owner.to_string()]),
            None => {
                let mut out = listed.to_vec();
                out.sort();
                out.dedup();
                Namespaces::List(out)
            }
        }
    }

    /// Whether the namespace is included.
    pub fn contains(&self, ns: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::List(l) => l.binary_search_by(|n| n.as_str().cmp(ns)).is_ok(),
        }
    }
}

/// A selector with `matchLabelKeys` folded in: the pod's own values for those keys join it.
pub fn with_match_label_keys(sel: &LabelSelector, keys: &[String], labels: &BTreeMap<String, String>) -> LabelSelector {
    let mut out = sel.clone();
    for k in keys {
        if let Some(v) = labels.get(k) {
            out.match_expressions.push(crate::model::SelectorRequirement {
                key: k.clone(),
                operator: SelectorOperator::In,
                values: vec![v.clone()],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selectors() {
        let sel = LabelSelector {
            match_labels: labels(&[("app", "web")]),
            match_expressions: vec![SelectorRequirement {
                key: "tier".into(),
                operator: SelectorOperator::NotIn,
                values: vec!["db".into()],
            }],
        };
        assert!(selector_matches(&sel, &labels(&[("app", "web")])));
        assert!(!selector_matches(&sel, &labels(&[("app", "web"), ("tier", "db")])));
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn namespaces() {
        let nsl = BTreeMap::from([("a".to_string(), labels(&[("team", "x")])), ("b".to_string(), labels(&[]))]);
        assert_eq!(Namespaces::resolve("own", &[], None, &nsl), Namespaces::List(vec!["own".into()]));
        assert_eq!(Namespaces::resolve("own", &[], Some(&LabelSelector::default()), &nsl), Namespaces::All);
        let sel = LabelSelector { match_labels: labels(&[("team", "x")]), ..Default::default() };
        assert_eq!(
            Namespaces::resolve("own", &["c".into()], Some(&sel), &nsl),
            Namespaces::List(vec!["a".into(), "c".into()])
        );
    }

    #[test]
    fn match_label_keys_join_the_selector() {
        let sel = LabelSelector { match_labels: labels(&[("app", "web")]), ..Default::default() };
        let own = labels(&[("app", "web"), ("pod-template-hash", "1")]);
        let s = with_match_label_keys(&sel, &["pod-template-hash".into(), "absent".into()], &own);
        assert!(selector_matches(&s, &own));
        assert!(!selector_matches(&s, &labels(&[("app", "web"), ("pod-template-hash", "2")])));
    }
}
