//! The identity chain across clusters (clever-cloud.md §3.1–3.3, hub.md §5): the deterministic
//! NodeGroup name of a NodeClaim, the provider ID, the labels and annotations the hub writes on a
//! NodeGroup, and the ownership proof every destructive path checks.
//!
//! Owns: pure functions over names and metadata. Must not: read clusters, or decide *when* to delete
//! (that is garbage collection's and termination's job, which call [`prove`] first).

use std::collections::BTreeMap;

use crds::{labels, nodegroup::NodeGroup};
use sha2::{Digest, Sha256};

/// Prefix of provider IDs of CKE nodes stamped by the hub, and their form.
pub use crds::nodeclaim::{PROVIDER_ID_PREFIX, provider_id};
/// Longest NodeGroup name: it is also a label value on the Node.
pub const MAX_NODEGROUP_NAME: usize = 63;

/// The NodeGroup name of a claim: `<claim name, truncated>-<8 hex of SHA-256("<hub>/<ns>/<claim>")>`.
///
/// A pure function of the three, so a restart re-derives the same name and finds (or adopts) the
/// group it created before crashing; the hash keeps two namespaces or hubs apart even when claim
/// names collide.
pub fn nodegroup_name(hub_id: &str, namespace: &str, claim: &str) -> String {
    let digest = Sha256::digest(format!("{hub_id}/{namespace}/{claim}").as_bytes());
    let suffix: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    // A claim name is a DNS-1123 subdomain; a label allows no dots.
    let mut stem: String = claim
        .chars()
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' })
        .take(MAX_NODEGROUP_NAME - suffix.len() - 1)
        .collect();
    while stem.ends_with('-') {
        stem.pop();
    }
    if stem.is_empty() { format!("ng-{suffix}") } else { format!("{stem}-{suffix}") }
}

/// Why a provider ID does not name a NodeGroup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider ID `{0}` is not `clevercloud://<nodegroup>`")]
pub struct ForeignProviderId(pub String);

/// The NodeGroup a provider ID names.
pub fn parse_provider_id(id: &str) -> Result<&str, ForeignProviderId> {
    match id.strip_prefix(PROVIDER_ID_PREFIX) {
        Some(name) if !name.is_empty() && !name.contains('/') => Ok(name),
        _ => Err(ForeignProviderId(id.to_string())),
    }
}

/// The NodeGroup a Node belongs to: CKE's `clever-cloud.com/nodegroup` label, else the provider ID
/// the hub stamped.
pub fn node_group(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(labels::CLEVER_NODEGROUP)).cloned().or_else(|| {
        node.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| parse_provider_id(p).ok().map(str::to_string))
    })
}

/// Whether `node` is the node of NodeGroup `group_name` (CKE's label, or the provider id it sets).
pub fn is_node_of(node: &k8s_openapi::api::core::v1::Node, group_name: &str) -> bool {
    node.metadata.labels.as_ref().and_then(|l| l.get(labels::CLEVER_NODEGROUP)).map(String::as_str) == Some(group_name)
        || node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id(group_name).as_str())
}

/// Who this hub is, as every NodeGroup it writes says and every ownership proof checks: its hub id
/// and its management cluster (the UID of that cluster's `kube-system` namespace, read at start:
/// immutable for the cluster's life, and kept by an etcd restore of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    pub hub_id: &'a str,
    pub management_cluster: &'a str,
    /// For one cluster: the management cluster it was declared moved from
    /// ([`crate::decisions::handover`]), whose groups are [`Ownership::Moved`] instead of foreign.
    pub moved_from: Option<&'a str>,
}

impl<'a> Owner<'a> {
    /// This owner, for a cluster declared moved from management cluster `source` (or not moved).
    pub fn moved_from(self, source: Option<&'a str>) -> Self {
        Self { moved_from: source, ..self }
    }
}

/// Who the hub is and which claim a NodeGroup is written for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIdentity<'a> {
    pub hub_id: &'a str,
    /// The management cluster's identity ([`Owner::management_cluster`]); empty only in tests of
    /// groups made before identities existed.
    pub management_cluster: &'a str,
    pub namespace: &'a str,
    pub claim: &'a str,
    pub claim_uid: &'a str,
    pub nodepool: &'a str,
    pub nodeclass: &'a str,
}

impl ClaimIdentity<'_> {
    pub fn nodegroup_name(&self) -> String {
        nodegroup_name(self.hub_id, self.namespace, self.claim)
    }

    /// `metadata.labels` of the NodeGroup (clever-cloud.md §3.1). Never the in-cluster provider's
    /// `managed` marker: that provider would take the group for its own.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::from([
            (labels::HUB.to_string(), self.hub_id.to_string()),
            (labels::NODECLAIM_NAMESPACE.to_string(), self.namespace.to_string()),
            (labels::NODECLAIM.to_string(), self.claim.to_string()),
            (labels::HUB_NODEPOOL.to_string(), self.nodepool.to_string()),
            (labels::NODECLASS.to_string(), self.nodeclass.to_string()),
        ]);
        if !self.management_cluster.is_empty() {
            out.insert(labels::MANAGEMENT_CLUSTER.to_string(), self.management_cluster.to_string());
        }
        out
    }

    /// `metadata.annotations` of the NodeGroup: the UID proof and the node class drift hash.
    pub fn annotations(&self, nodeclass_hash: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NODECLAIM_UID.to_string(), self.claim_uid.to_string()),
            (crds::drift::NODECLASS_HASH_ANNOTATION.to_string(), nodeclass_hash.to_string()),
            (
                crds::drift::NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
                crds::drift::NODECLASS_HASH_VERSION.to_string(),
            ),
        ])
    }
}

/// `spec.labels` of a NodeGroup: node class labels, then claim labels (the claim wins), minus what
/// CKE refuses (reserved prefixes, any `kubernetes.io/` key, values over 63 characters).
pub fn nodegroup_spec_labels(
    nodeclass: &BTreeMap<String, String>,
    claim: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    nodeclass
        .iter()
        .chain(claim.iter())
        .filter(|(k, v)| {
            !labels::CKE_RESERVED_PREFIXES.iter().any(|p| k.starts_with(p))
                && !k.contains("kubernetes.io/")
                && v.len() <= 63
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Delete parameters that remove only this incarnation of `obj` (a UID precondition): an object
/// deleted and recreated under the same name since it was read is never touched.
pub fn delete_exactly<K: kube::Resource>(obj: &K) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        preconditions: obj
            .meta()
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
        ..kube::api::DeleteParams::default()
    }
}

/// What the ownership proof says about one NodeGroup, for this hub and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Every proof holds: the group was written by this hub, in this management cluster, for claim
    /// `claim` with UID `uid`.
    Owned { claim: String, uid: String },
    /// Every proof of a group made before management-cluster identities existed holds (this hub id
    /// and namespace, claim label, UID annotation, derived name), but the group names no management
    /// cluster: it may be this hub's, or another management cluster's hub's that used the same hub
    /// id. Its claim's (launch, termination) only when that claim, by name *and UID*, is in this
    /// management cluster (a UID is unique across clusters: [`Ownership::is_claims`]); never
    /// deleted as garbage. Left unstamped: the hub's workload identity may not patch NodeGroups.
    Legacy { claim: String, uid: String },
    /// Every proof holds but the management cluster, which is the one the cluster's registration
    /// declares it was moved from (hub.md, "Moving a fleet"): the group of the claim of that name in
    /// this management cluster (the copy has a new UID), to be re-stamped as ours
    /// ([`crate::decisions::handover::restamp`]). Never deleted as garbage: a claim not copied yet
    /// is not evidence of a leak.
    Moved { claim: String, uid: String },
    /// Not ours (no hub labels, another hub, another namespace, another management cluster): never
    /// touched.
    Foreign,
    /// Carries our labels but a proof fails (no UID annotation, name not derived from its claim
    /// label): a copy or a tampered group. Kept and reported, never deleted.
    Refused(String),
}

impl Ownership {
    /// Whether the group is the one made for claim `name` with UID `uid`, by this hub: owned, or
    /// a group from before management identities whose claim is this very claim (the UID proves it),
    /// or a group moved with its claim from the declared source (the name proves it: the copy's UID
    /// is new).
    pub fn is_claims(&self, name: &str, uid: &str) -> bool {
        match self {
            Ownership::Owned { claim, uid: u } | Ownership::Legacy { claim, uid: u } => {
                claim == name && u == uid && !uid.is_empty()
            }
            Ownership::Moved { claim, .. } => claim == name && !uid.is_empty(),
            _ => false,
        }
    }

    /// Whether the group carries this hub's and namespace's labels (owned, legacy or refused): the
    /// population garbage collection's brake measures itself against.
    pub fn is_labelled_ours(&self) -> bool {
        !matches!(self, Ownership::Foreign)
    }
}

/// The ownership proof of clever-cloud.md §3.3, bound to the management cluster (hub.md §5).
pub fn prove(group: &NodeGroup, owner: Owner<'_>, namespace: &str) -> Ownership {
    let meta = &group.metadata;
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
    if label(labels::HUB) != Some(owner.hub_id) || label(labels::NODECLAIM_NAMESPACE) != Some(namespace) {
        return Ownership::Foreign;
    }
    let management = label(labels::MANAGEMENT_CLUSTER);
    // The management cluster the registration says the cluster was moved from: its groups are
    // taken over, once every other proof holds.
    let moved = management.is_some_and(|m| owner.moved_from == Some(m) && m != owner.management_cluster);
    // Another management cluster's group (a second install on the same hub id, a migration not
    // declared, a restore without claims): not ours, whatever else it says. A hub that does not
    // know its own management cluster (never in production) treats every stamped group as another's.
    if !moved && management.is_some_and(|m| m != owner.management_cluster || owner.management_cluster.is_empty()) {
        return Ownership::Foreign;
    }
    let Some(claim) = label(labels::NODECLAIM).filter(|c| !c.is_empty()) else {
        return Ownership::Refused(format!("label {} is missing", labels::NODECLAIM));
    };
    let Some(uid) = meta.annotations.as_ref().and_then(|a| a.get(labels::NODECLAIM_UID)).filter(|u| !u.is_empty())
    else {
        return Ownership::Refused(format!("annotation {} is missing", labels::NODECLAIM_UID));
    };
    let name = meta.name.as_deref().unwrap_or_default();
    let expected = nodegroup_name(owner.hub_id, namespace, claim);
    if name != expected {
        return Ownership::Refused(format!(
            "its name is not the one derived from NodeClaim {namespace}/{claim} ({expected}): a copy of another group"
        ));
    }
    match management {
        Some(_) if moved => Ownership::Moved { claim: claim.to_string(), uid: uid.clone() },
        Some(_) => Ownership::Owned { claim: claim.to_string(), uid: uid.clone() },
        None => Ownership::Legacy { claim: claim.to_string(), uid: uid.clone() },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crds::nodegroup::NodeGroupSpec;
    use kube::api::ObjectMeta;

    fn group(id: &ClaimIdentity<'_>) -> NodeGroup {
        NodeGroup {
            metadata: ObjectMeta {
                name: Some(id.nodegroup_name()),
                labels: Some(id.labels()),
                annotations: Some(id.annotations("h")),
                ..ObjectMeta::default()
            },
            spec: NodeGroupSpec { flavor: "M".into(), node_count: 1, labels: None, taints: None },
            status: None,
        }
    }

    const ID: ClaimIdentity<'static> = ClaimIdentity {
        hub_id: "default",
        management_cluster: "mgmt-1",
        namespace: "team-a",
        claim: "general-x7k2p",
        claim_uid: "u-1",
        nodepool: "general",
        nodeclass: "default",
    };

    #[test]
    fn names_are_stable_short_and_distinct_per_namespace_and_hub() {
        let n = nodegroup_name("default", "team-a", "general-x7k2p");
        // Pinned: a change would orphan every group created by an earlier release.
        // (Python: hashlib.sha256(b"default/team-a/general-x7k2p").hexdigest()[:8])
        assert_eq!(n, "general-x7k2p-7c286b66");
        assert_ne!(n, nodegroup_name("default", "team-b", "general-x7k2p"));
        assert_ne!(n, nodegroup_name("other", "team-a", "general-x7k2p"));
        let long = nodegroup_name("default", "ns", &format!("{}.pool-abcde", "a".repeat(70)));
        assert!(long.len() <= MAX_NODEGROUP_NAME);
        assert!(crds::validation::dns1123_label(&long).is_ok(), "{long}");
        assert!(crds::validation::dns1123_label(&nodegroup_name("d", "n", "a.b.c")).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn every_derived_name_is_a_dns_label(claim in "[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", ns in "[a-z0-9-]{1,63}") {
            let n = nodegroup_name("default", &ns, &claim);
            proptest::prop_assert!(crds::validation::dns1123_label(&n).is_ok(), "{}", n);
        }
    }

    #[test]
    fn provider_ids_round_trip_and_foreign_ones_are_refused() {
        assert_eq!(parse_provider_id(&provider_id("ng-1")).unwrap(), "ng-1");
        for bad in ["aws:///i-123", "", "clevercloud://", "clevercloud://a/b"] {
            assert!(parse_provider_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spec_labels_merge_with_claim_winning_and_drop_what_cke_refuses() {
        let class = BTreeMap::from([("team".to_string(), "a".to_string()), ("env".to_string(), "prod".to_string())]);
        let claim = BTreeMap::from([
            ("team".to_string(), "b".to_string()),
            (labels::NODEPOOL.to_string(), "general".to_string()),
            (labels::INSTANCE_TYPE.to_string(), "M".to_string()),
            ("example.kubernetes.io/x".to_string(), "y".to_string()),
            ("clever-cloud.com/flavor".to_string(), "M".to_string()),
            ("long".to_string(), "v".repeat(64)),
        ]);
        let got = nodegroup_spec_labels(&class, &claim);
        assert_eq!(
            got,
            BTreeMap::from([
                ("env".to_string(), "prod".to_string()),
                (labels::NODEPOOL.to_string(), "general".to_string()),
                ("team".to_string(), "b".to_string()),
            ])
        );
    }

    const ME: Owner<'static> = Owner { hub_id: "default", management_cluster: "mgmt-1", moved_from: None };

    #[test]
    fn only_a_group_with_every_proof_is_owned() {
        assert_eq!(prove(&group(&ID), ME, "team-a"), Ownership::Owned { claim: ID.claim.into(), uid: "u-1".into() });
        assert_eq!(prove(&group(&ID), Owner { hub_id: "other-hub", ..ME }, "team-a"), Ownership::Foreign);
        assert_eq!(prove(&group(&ID), ME, "team-b"), Ownership::Foreign);
        let mut no_uid = group(&ID);
        no_uid.metadata.annotations = None;
        assert!(matches!(prove(&no_uid, ME, "team-a"), Ownership::Refused(m) if m.contains("nodeclaim-uid")));
        let mut copy = group(&ID);
        copy.metadata.name = Some("copied-group".into());
        assert!(matches!(prove(&copy, ME, "team-a"), Ownership::Refused(m) if m.contains("copy")));
        let mut unlabelled = group(&ID);
        unlabelled.metadata.labels = None;
        assert_eq!(prove(&unlabelled, ME, "team-a"), Ownership::Foreign);
    }

    #[test]
    fn another_management_cluster_s_group_is_foreign_whatever_its_hub_id() {
        // The incident: a second management cluster's hub on the same (default) hub id, same
        // namespace name, made this group; every other proof holds.
        let theirs = group(&ClaimIdentity { management_cluster: "mgmt-2", ..ID });
        assert_eq!(prove(&theirs, ME, "team-a"), Ownership::Foreign);
        // A hub that does not know its own management cluster claims no stamped group.
        assert_eq!(prove(&group(&ID), Owner { management_cluster: "", ..ME }, "team-a"), Ownership::Foreign);
    }

    #[test]
    fn a_group_from_before_identities_is_legacy_and_only_its_own_claim_proves_it() {
        let old = group(&ClaimIdentity { management_cluster: "", ..ID });
        assert!(!old.metadata.labels.as_ref().unwrap().contains_key(labels::MANAGEMENT_CLUSTER));
        let proof = prove(&old, ME, "team-a");
        assert_eq!(proof, Ownership::Legacy { claim: ID.claim.into(), uid: "u-1".into() });
        assert!(proof.is_claims(ID.claim, "u-1"));
        assert!(!proof.is_claims(ID.claim, "u-2"), "a claim of the same name made elsewhere is not proof");
        assert!(!proof.is_claims("other", "u-1"));
        assert!(!Ownership::Foreign.is_claims(ID.claim, "u-1"));
        assert!(!proof.is_claims(ID.claim, ""));
    }

    #[test]
    fn a_group_of_the_declared_source_is_moved_and_its_claim_is_proven_by_name() {
        let theirs = group(&ClaimIdentity { management_cluster: "mgmt-0", ..ID });
        assert_eq!(prove(&theirs, ME, "team-a"), Ownership::Foreign, "no move declared");
        let me = ME.moved_from(Some("mgmt-0"));
        let proof = prove(&theirs, me, "team-a");
        assert_eq!(proof, Ownership::Moved { claim: ID.claim.into(), uid: "u-1".into() });
        assert!(proof.is_claims(ID.claim, "u-copy"), "the copy's new UID");
        assert!(!proof.is_claims("other", "u-copy"));
        assert!(!proof.is_claims(ID.claim, ""));
        // Any other management cluster stays foreign; every other proof still counts.
        assert_eq!(
            prove(&group(&ClaimIdentity { management_cluster: "mgmt-9", ..ID }), me, "team-a"),
            Ownership::Foreign
        );
        assert_eq!(prove(&theirs, Owner { hub_id: "other", ..me }, "team-a"), Ownership::Foreign);
        assert_eq!(prove(&theirs, me, "team-b"), Ownership::Foreign);
        let mut copy = theirs.clone();
        copy.metadata.name = Some("copied-group".into());
        assert!(matches!(prove(&copy, me, "team-a"), Ownership::Refused(_)));
        // Our own groups are still ours.
        assert!(matches!(prove(&group(&ID), me, "team-a"), Ownership::Owned { .. }));
    }
}
