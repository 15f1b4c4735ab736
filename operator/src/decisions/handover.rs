//! Moving a workload cluster's registration to another management cluster (hub.md, "Moving a
//! fleet to another management cluster"): the declaration a registration Secret carries, whether
//! this hub may honour it, and the re-stamp that makes a moved NodeGroup this management cluster's.
//!
//! A NodeGroup names the management cluster that made it; another's is never touched
//! ([`crate::decisions::ownership::prove`]). A move is the one case where another's groups must
//! become ours, and only the user can say it is one: the target's registration Secret names the
//! hub id and the management cluster the cluster came from. A group of that source is then the
//! claim's of the same name in this management cluster (the copy has a new UID, so the name is the
//! proof), and is re-stamped with this management cluster and the new claim UID.
//!
//! Owns: parsing the declaration, the hub-id check, the re-stamp patch. Must not: do I/O, or decide
//! anything about groups without a claim here (they are kept: the copy may be under way).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The declaration, on the registration Secret in the target management cluster.
pub const MOVED_FROM_ANNOTATION: &str = "karpenter.clever-cloud.com/moved-from";

/// Where a registration's cluster was moved from: the source's hub id and management cluster
/// (the UID of its `kube-system` namespace), as its NodeGroups' labels say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedFrom {
    pub hub_id: String,
    pub management_cluster: String,
}

/// Why a declared move is not honoured: the hub takes no action on the cluster until it is fixed
/// (acting could launch a second group beside a moved one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandoverError {
    #[error(
        "the annotation {MOVED_FROM_ANNOTATION} must be `<hub id>/<management cluster UID>` (the source's hub id and the UID of its kube-system namespace, as its NodeGroups' labels {hub} and {mgmt} say): {why}",
        hub = crds::labels::HUB,
        mgmt = crds::labels::MANAGEMENT_CLUSTER
    )]
    Malformed { why: &'static str },
    #[error(
        "the annotation {MOVED_FROM_ANNOTATION} says the cluster comes from hub id {source_hub}, and this hub runs as {this_hub}: a moved fleet keeps its hub id (its NodeGroups' names derive from it); run this hub with --hub-id={source_hub} (chart value hub.hubId), or remove the annotation"
    )]
    OtherHubId { source_hub: String, this_hub: String },
}

/// The declaration in a registration Secret's annotations, if any. Bounded: a UID is at most 63
/// lowercase alphanumerics and dashes, a hub id a label value.
pub fn parse(annotations: Option<&BTreeMap<String, String>>) -> Result<Option<MovedFrom>, HandoverError> {
    let Some(value) = annotations.and_then(|a| a.get(MOVED_FROM_ANNOTATION)) else {
        return Ok(None);
    };
    let Some((hub_id, uid)) = value.split_once('/') else {
        return Err(HandoverError::Malformed { why: "no `/` between the two" });
    };
    if hub_id.is_empty() || crds::validation::label_value(hub_id).is_err() {
        return Err(HandoverError::Malformed { why: "the hub id is not a label value" });
    }
    let uid_ok = !uid.is_empty()
        && uid.len() <= 63
        && uid.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !uid_ok {
        return Err(HandoverError::Malformed {
            why: "the management cluster UID is not 1 to 63 lowercase letters, digits and dashes",
        });
    }
    Ok(Some(MovedFrom { hub_id: hub_id.to_string(), management_cluster: uid.to_string() }))
}

/// The declaration, checked against this hub: the source management cluster whose groups this
/// hub may take over for the cluster (`None`: no move declared, or one from this very management
/// cluster, which changes nothing).
pub fn honoured<'a>(
    moved: Option<&'a MovedFrom>,
    hub_id: &str,
    management_cluster: &str,
) -> Result<Option<&'a str>, HandoverError> {
    match moved {
        None => Ok(None),
        Some(m) if m.hub_id != hub_id => {
            Err(HandoverError::OtherHubId { source_hub: m.hub_id.clone(), this_hub: hub_id.to_string() })
        }
        Some(m) if m.management_cluster == management_cluster => Ok(None),
        Some(m) => Ok(Some(&m.management_cluster)),
    }
}

/// The merge patch that makes a moved group this management cluster's, for the claim of UID
/// `claim_uid`: guarded by the resource version it was proven at, so a group changed since is
/// never re-stamped on a stale proof (the write answers 409 and the next pass proves it again).
pub fn restamp(management_cluster: &str, claim_uid: &str, resource_version: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {crds::labels::MANAGEMENT_CLUSTER: management_cluster},
            "annotations": {crds::labels::NODECLAIM_UID: claim_uid},
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn annotated(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(MOVED_FROM_ANNOTATION.to_string(), v.to_string())])
    }

    #[test]
    fn the_declaration_is_parsed_strictly_and_a_bad_one_names_the_form() {
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some(&BTreeMap::new())).unwrap(), None);
        let uid = "5a1c0a57-1111-4000-8000-000000000001";
        assert_eq!(
            parse(Some(&annotated(&format!("default/{uid}")))).unwrap(),
            Some(MovedFrom { hub_id: "default".into(), management_cluster: uid.into() })
        );
        for bad in [
            "",
            "default",
            "/abc",
            "default/",
            "Prod_1!/abc",
            "default/ABC",
            "default/a/b",
            &format!("d/{}", "a".repeat(64)),
        ] {
            let e = parse(Some(&annotated(bad))).unwrap_err();
            assert!(e.to_string().contains(MOVED_FROM_ANNOTATION) && e.to_string().contains("<hub id>/"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_move_is_honoured_only_into_a_hub_of_the_same_id() {
        let m = MovedFrom { hub_id: "default".into(), management_cluster: "src".into() };
        assert_eq!(honoured(Some(&m), "default", "dst").unwrap(), Some("src"));
        assert_eq!(honoured(None, "default", "dst").unwrap(), None);
        assert_eq!(honoured(Some(&m), "default", "src").unwrap(), None, "moved from itself: nothing to take over");
        let e = honoured(Some(&m), "m-0123456789ab", "dst").unwrap_err();
        assert!(e.to_string().contains("--hub-id=default"), "{e}");
    }

    #[test]
    fn the_restamp_names_this_management_cluster_and_the_new_claim_and_is_guarded() {
        let p = restamp("dst", "uid-new", "42");
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["metadata"]["labels"][crds::labels::MANAGEMENT_CLUSTER], "dst");
        assert_eq!(p["metadata"]["annotations"][crds::labels::NODECLAIM_UID], "uid-new");
        assert!(p.get("spec").is_none(), "a re-stamp never touches the spec");
    }
}
