//! Admission of a `NodeClaim`: its spec records a decision of the hub and never changes (the CRD's
//! CEL rule says the same; this is the rule for the hub's own checks and for an optional webhook
//! route). Status writes go through the `/status` subresource and are not judged here.

use crate::admission::Verdict;
use crate::labels::{GROUP, NODECLASS_KIND};
use crate::nodeclaim::NodeClaim;
use crate::validation::dns1123_label;

/// Validates a `NodeClaim`: on update the spec must be unchanged; on create the cluster name and the
/// node class reference must be usable.
pub fn validate_node_claim(new: &NodeClaim, old: Option<&NodeClaim>) -> Verdict {
    let mut verdict = Verdict::default();
    if let Some(old) = old {
        if old.spec != new.spec {
            verdict.deny("spec", "NodeClaim spec is immutable: delete the NodeClaim and let the hub create another");
        }
        return verdict;
    }
    if let Err(reason) = dns1123_label(&new.spec.cluster_name) {
        verdict
            .deny("spec.clusterName", format!("{:?} is not a valid cluster name: it {reason}", new.spec.cluster_name));
    }
    let reference = &new.spec.node_class_ref;
    if reference.group != GROUP || reference.kind != NODECLASS_KIND {
        verdict.deny("spec.nodeClassRef", format!("must reference group {GROUP}, kind {NODECLASS_KIND}"));
    }
    verdict
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::common::NodeClassReference;
    use crate::nodeclaim::NodeClaimSpec;

    fn claim(cluster: &str, kind: &str) -> NodeClaim {
        NodeClaim::new(
            "default-abcde",
            NodeClaimSpec {
                cluster_name: cluster.into(),
                taints: vec![],
                startup_taints: vec![],
                requirements: vec![],
                resources: Default::default(),
                node_class_ref: NodeClassReference { group: GROUP.into(), kind: kind.into(), name: "default".into() },
                termination_grace_period: None,
                expire_after: "720h".into(),
            },
        )
    }

    #[test]
    fn spec_is_immutable() {
        let old = claim("prod", NODECLASS_KIND);
        let mut new = old.clone();
        assert!(validate_node_claim(&new, Some(&old)).is_allowed());
        new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(validate_node_claim(&new, Some(&old)).is_allowed());
        new.spec.expire_after = "1h".into();
        let v = validate_node_claim(&new, Some(&old));
        assert_eq!(
            v.denial_message().unwrap(),
            "spec: NodeClaim spec is immutable: delete the NodeClaim and let the hub create another"
        );
    }

    #[test]
    fn create_checks_cluster_and_class() {
        assert!(validate_node_claim(&claim("prod", NODECLASS_KIND), None).is_allowed());
        let v = validate_node_claim(&claim("Prod_1", "Other"), None);
        assert_eq!(v.denials.len(), 2);
    }
}
