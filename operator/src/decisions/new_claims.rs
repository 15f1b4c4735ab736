//! The NodeClaims a scheduling decision writes (karpenter-semantics §1.5), for provisioning and for
//! disruption's replacements alike: the object, its deterministic names and the digest they derive
//! from, so that a retried create finds its claim instead of making a second.
//!
//! Owns: building the NodeClaim and naming it. Must not: create it (the provisioning and disruption
//! controllers do), or read anything but its arguments.

use std::collections::BTreeSet;

use crds::{CleverNodeClass, NodeClaim, NodePool, labels};
use kube::{Resource, ResourceExt};
use scheduling::model::NewClaim;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The workload cluster a claim is for: its registration's namespace and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cluster<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

/// A decided claim that does not make a valid NodeClaim (a pool template the API would refuse).
#[derive(Debug, thiserror::Error)]
#[error("building a NodeClaim: {0}")]
pub struct BuildError(#[source] serde_json::Error);

pub const NAME_ATTEMPTS: u32 = 8;

/// The names a decided claim may take, in order: the decision's deterministic names, less those of
/// claims the decision already counted as capacity. Such a claim was made for the same pods by an
/// earlier round, but the solver may have given it to other pods (a larger or older pod that began
/// waiting since): this claim is then capacity beyond it, not a replay of its create.
pub fn candidate_names<'a>(
    pool: &'a str,
    digest: &'a str,
    counted: &'a BTreeSet<String>,
) -> impl Iterator<Item = (u32, String)> + 'a {
    (0..NAME_ATTEMPTS).map(move |a| (a, claim_name(pool, digest, a))).filter(move |(_, n)| !counted.contains(n))
}

/// The digest of a provisioning decision: its cluster, pool and pods (UIDs).
pub fn provisioning_digest(cluster: &Cluster<'_>, pool: &str, pods: &[String]) -> String {
    Sha256::digest(format!("{}/{}/{}/{}", cluster.namespace, cluster.name, pool, pods.join(",")).as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `attempt`-th name of a decision: the pool and five hex digits, as Karpenter's
/// `<pool>-<suffix>`; attempt 0 takes them from the digest itself, later ones from the digest
/// salted with the attempt, so every replay of the decision walks the same names.
pub fn claim_name(pool: &str, digest: &str, attempt: u32) -> String {
    let salted = if attempt == 0 {
        digest.to_string()
    } else {
        Sha256::digest(format!("{digest}/{attempt}").as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    };
    let mut name: String = pool.chars().take(63 - 6).collect();
    name.push('-');
    name.extend(salted.chars().take(5));
    name
}

/// The NodeClaim for a decided claim (karpenter-semantics §1.5). Its name is derived from the pool
/// and the UIDs of the pods it was made for (also stamped as [`labels::PROVISIONING_DIGEST`]), so
/// a retried create is idempotent.
/// The node class's hash is stamped too, so a later change of the class drifts the claim (§4.1).
pub fn node_claim(
    pool: &NodePool,
    nodeclass: Option<&CleverNodeClass>,
    claim: &NewClaim,
    cluster: &Cluster<'_>,
    pods: &[String],
) -> Result<NodeClaim, BuildError> {
    let pool_name = pool.name_any();
    let digest = provisioning_digest(cluster, &pool_name, pods);
    let name = claim_name(&pool_name, &digest, 0);
    let template = &pool.spec.template;
    let class = &template.spec.node_class_ref;
    let mut claim_labels = template.metadata.as_ref().map(|m| m.labels.clone()).unwrap_or_default();
    claim_labels.extend(claim.labels.clone());
    claim_labels.insert(labels::NODEPOOL.to_string(), pool_name.clone());
    claim_labels.insert(labels::CLEVERNODECLASS.to_string(), class.name.clone());
    let mut annotations = template.metadata.as_ref().map(|m| m.annotations.clone()).unwrap_or_default();
    annotations.insert(crds::drift::NODEPOOL_HASH_ANNOTATION.to_string(), crds::drift::nodepool_hash(&pool.spec));
    annotations.insert(
        crds::drift::NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
        crds::drift::NODEPOOL_HASH_VERSION.to_string(),
    );
    if let Some(nodeclass) = nodeclass {
        annotations
            .insert(crds::drift::NODECLASS_HASH_ANNOTATION.to_string(), crds::drift::nodeclass_hash(&nodeclass.spec));
        annotations.insert(
            crds::drift::NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
            crds::drift::NODECLASS_HASH_VERSION.to_string(),
        );
    }
    annotations.insert(labels::MIN_VALUES_RELAXED.to_string(), claim.min_values_relaxed.to_string());
    if !pods.is_empty() {
        annotations.insert(labels::PROVISIONING_DIGEST.to_string(), digest);
    }
    let owner = pool.controller_owner_ref(&()).map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = Some(true);
        o
    });
    // Extended resources as upstream records them: the node counts as initialized once it reports them.
    let mut requests = claim.requests.to_resource_list();
    requests.extend(crds::quantity::extended_list(&claim.extended));
    let value = json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
        "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "namespace": cluster.namespace,
            "labels": claim_labels,
            "annotations": annotations,
            "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
            "finalizers": [labels::TERMINATION_FINALIZER],
        },
        "spec": {
            "clusterName": cluster.name,
            "taints": claim.taints,
            "startupTaints": claim.startup_taints,
            "requirements": claim.requirements,
            "resources": {"requests": requests},
            "nodeClassRef": class,
            "terminationGracePeriod": template.spec.termination_grace_period,
            "expireAfter": template.spec.expire_after,
        }
    });
    serde_json::from_value(value).map_err(BuildError)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_the_decision_counted_is_never_taken_for_a_replay_of_its_create() {
        let key = Cluster { namespace: "team-a", name: "prod" };
        // Pod A's claim exists and the solver gave it to pod B; A needs a new claim, whose
        // digest (pods: A) is the one A's first claim was made under.
        let digest = provisioning_digest(&key, "default", &["uid-a".into()]);
        let first = claim_name("default", &digest, 0);
        let nothing = BTreeSet::new();
        assert_eq!(candidate_names("default", &digest, &nothing).next(), Some((0, first.clone())));
        let counted = BTreeSet::from([first.clone()]);
        let names: Vec<(u32, String)> = candidate_names("default", &digest, &counted).collect();
        assert_eq!(names.first(), Some(&(1, claim_name("default", &digest, 1))), "the next name, not the counted one");
        assert_eq!(names.len(), NAME_ATTEMPTS as usize - 1);
        assert!(names.iter().all(|(_, n)| *n != first));
    }

    #[test]
    fn claim_names_follow_pod_incarnations_and_walk_the_same_names_on_every_replay() {
        let key = Cluster { namespace: "team-a", name: "prod" };
        let first = provisioning_digest(&key, "default", &["uid-1".into()]);
        let recreated = provisioning_digest(&key, "default", &["uid-2".into()]);
        // The same pod name recreated (new UID) is another decision, under another name.
        assert_ne!(claim_name("default", &first, 0), claim_name("default", &recreated, 0));
        // A replay of one decision walks the same names, and each attempt is a new name.
        let walk = |d: &str| (0..NAME_ATTEMPTS).map(|a| claim_name("default", d, a)).collect::<Vec<_>>();
        assert_eq!(walk(&first), walk(&first));
        let distinct: BTreeSet<String> = walk(&first).into_iter().collect();
        assert_eq!(distinct.len(), NAME_ATTEMPTS as usize);
        // Karpenter's shape: `<pool>-<5 hex>`, and within the 63 characters of a name.
        let name = claim_name("default", &first, 0);
        assert!(name.starts_with("default-") && name.len() == "default-".len() + 5, "{name}");
        assert!(claim_name(&"p".repeat(80), &first, 3).len() <= 63);
    }
}
