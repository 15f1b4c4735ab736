//! Taints and tolerations with Kubernetes matching (karpenter-semantics §3.10): `Equal`/`Exists`,
//! an empty key with `Exists` tolerates everything, an absent effect matches every effect.
//!
//! Owns matching and the list of ephemeral taints. Must not decide which taints apply to a node
//! (the solver does, from the node's state).

use crate::model::{Taint, TaintEffect, Toleration, TolerationOperator};

/// Whether one toleration tolerates one taint.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect.is_some_and(|e| e != taint.effect) {
        return false;
    }
    match t.operator {
        TolerationOperator::Exists => t.key.is_empty() || t.key == taint.key,
        TolerationOperator::Equal => t.key == taint.key && t.value == taint.value.as_deref().unwrap_or(""),
    }
}

/// The first taint none of the tolerations tolerates. `PreferNoSchedule` taints count unless
/// `tolerate_prefer_no_schedule` (relaxation step 6, and always for DaemonSets).
pub fn first_untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    tolerate_prefer_no_schedule: bool,
) -> Option<&'a Taint> {
    taints.iter().find(|taint| {
        let soft_and_tolerated = tolerate_prefer_no_schedule && taint.effect == TaintEffect::PreferNoSchedule;
        !soft_and_tolerated && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

/// `key=value:Effect`, as kubectl prints taints.
pub fn describe(taint: &Taint) -> String {
    match &taint.value {
        Some(v) if !v.is_empty() => format!("{}={}:{}", taint.key, v, taint.effect.as_str()),
        _ => format!("{}:{}", taint.key, taint.effect.as_str()),
    }
}

/// Taints a managed node sheds on its own while it initializes (§1.7): disregarded until then.
pub fn is_ephemeral(taint: &Taint) -> bool {
    matches!(
        (taint.key.as_str(), taint.effect),
        ("node.kubernetes.io/not-ready", TaintEffect::NoSchedule | TaintEffect::NoExecute)
            | ("node.kubernetes.io/unreachable", TaintEffect::NoSchedule)
            | ("node.cloudprovider.kubernetes.io/uninitialized", TaintEffect::NoSchedule)
            | ("karpenter.sh/unregistered", TaintEffect::NoExecute)
    ) || taint.key.starts_with("readiness.k8s.io/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> Taint {
        Taint { key: key.into(), value: value.map(str::to_string), effect }
    }

    #[test]
    fn kubernetes_matching_rules() {
        let t = taint("dedicated", Some("x"), TaintEffect::NoSchedule);
        let equal = Toleration {
            key: "dedicated".into(),
            operator: TolerationOperator::Equal,
            value: "x".into(),
            effect: None,
        };
        assert!(tolerates(&equal, &t));
        let wrong_value = Toleration { value: "y".into(), ..equal.clone() };
        assert!(!tolerates(&wrong_value, &t));
        let exists_all = Toleration { key: String::new(), operator: TolerationOperator::Exists, ..equal.clone() };
        assert!(tolerates(&exists_all, &t));
        let wrong_effect = Toleration { effect: Some(TaintEffect::NoExecute), ..equal.clone() };
        assert!(!tolerates(&wrong_effect, &t));
    }

    #[test]
    fn prefer_no_schedule_counts_until_relaxed() {
        let taints = vec![taint("x", None, TaintEffect::PreferNoSchedule)];
        assert!(first_untolerated(&taints, &[], false).is_some());
        assert!(first_untolerated(&taints, &[], true).is_none());
    }

    #[test]
    fn ephemeral_taints() {
        assert!(is_ephemeral(&taint("node.kubernetes.io/not-ready", None, TaintEffect::NoExecute)));
        assert!(is_ephemeral(&taint("readiness.k8s.io/network", None, TaintEffect::NoSchedule)));
        assert!(!is_ephemeral(&taint("init", Some("1"), TaintEffect::NoSchedule)));
    }
}
