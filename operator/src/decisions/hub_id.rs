//! The hub id a hub takes when `--hub-id` is not given (hub.md, "The hub id").
//!
//! The rule, whole:
//! 1. `--hub-id` given: that id, always (an install that set one keeps it).
//! 2. Otherwise `default` when the management cluster shows an install that ran under it:
//!    - the Lease `karpenter-hub-default` exists in the leader election namespace: a rolling
//!      upgrade from an install with no NodeClaims still has old pods leading under that Lease,
//!      and a new pod campaigning for another Lease would be a second leader;
//!    - a Lease in that namespace is labelled `karpenter.clever-cloud.com/hub=default` (sharded
//!      mode's membership and cluster Leases): the same, for replicas sharding under `default`;
//!    - a NodeClaim the hub serves records (in its provider ID) the NodeGroup name derived under
//!      `default` for it: that group is labelled `default`, and a hub with another id would take
//!      it for another hub's (Foreign), never terminate it, and launch a second one.
//! 3. Otherwise `m-<the first 12 hex digits of the management cluster's identity, dashes
//!    removed>` (the UID of its `kube-system` namespace): two management clusters on the default
//!    setting never share an id, and a restart derives the same one (none of the facts of 2 can
//!    appear under a derived id).
//!
//! Owns: that rule over facts gathered elsewhere ([`crate::infra::identity`] reads them), and the
//! check that an id is usable. Must not: do I/O, or fall back to an id when a fact is unknown
//! (the caller retries until every fact is read).

use std::fmt;

/// The id every install had before ids were derived.
pub const DEFAULT: &str = "default";
/// Prefix of a derived id (`m` for management cluster).
pub const DERIVED_PREFIX: &str = "m-";
/// Hex digits of the management cluster's identity in a derived id (48 bits: two management
/// clusters collide with odds of one in 2^48).
pub const DERIVED_DIGITS: usize = 12;
/// Prefix of the leader election Lease's name, `karpenter-hub-<hub id>`.
pub const LEADER_LEASE_PREFIX: &str = "karpenter-hub-";

/// The leader election Lease of hub `hub_id`.
pub fn leader_lease_name(hub_id: &str) -> String {
    format!("{LEADER_LEASE_PREFIX}{hub_id}")
}

/// Why a hub id cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not a DNS-1123 label: it is a label value on every NodeGroup and part of the Lease name
    /// `karpenter-hub-<id>` (a DNS subdomain), so only lowercase letters, digits and '-' fit both.
    #[error(
        "{id:?} {reason}; it is written as a label value on every NodeGroup and in the Lease name karpenter-hub-<id>, so it takes lowercase letters, digits and '-', starts and ends with a letter or digit, at most 63 characters (e.g. 'prod-1')"
    )]
    Invalid { id: String, reason: crds::validation::Reason },
    /// The management cluster's identity has no 12 hex digits to derive an id from.
    #[error(
        "the management cluster's identity (the UID of kube-system) {uid:?} does not start with 12 hex digits; give this hub an id with --hub-id"
    )]
    UnusableIdentity { uid: String },
}

/// Checks that `id` can be a hub id: a label value, and inside `karpenter-hub-<id>` a Lease name.
/// At most 63 characters (a label value's bound; `karpenter-hub-` and 63 more stay far below a
/// Lease name's 253).
pub fn check(id: &str) -> Result<(), IdError> {
    crds::validation::dns1123_label(id).map_err(|reason| IdError::Invalid { id: id.to_string(), reason })
}

/// What the management cluster shows of an install that ran under `default`. Each is `None` when
/// absent; the `Some` names what was seen, for the log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The Lease `karpenter-hub-default` exists in the leader election namespace (its namespace).
    pub leader_lease: Option<String>,
    /// A Lease labelled with hub id `default` in that namespace (its name).
    pub labelled_lease: Option<String>,
    /// A NodeClaim launched under `default` (`namespace/name`).
    pub claim: Option<String>,
}

/// Why a hub runs under its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// `--hub-id` was given.
    Given,
    /// `default` kept: the leader Lease of `default` exists (in that namespace).
    LeaderLease(String),
    /// `default` kept: a Lease labelled with hub id `default` exists (that one).
    LabelledLease(String),
    /// `default` kept: a NodeClaim was launched under `default` (that one).
    Claim(String),
    /// No install ran under `default` here: derived from the management cluster's identity.
    Derived,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Given => f.write_str("given by --hub-id"),
            Self::LeaderLease(ns) => write!(
                f,
                "kept: the Lease {ns}/karpenter-hub-default exists (an install that ran under `default` may still lead there)"
            ),
            Self::LabelledLease(name) => write!(
                f,
                "kept: the Lease {name} carries hub id `default` (replicas sharding under `default` may still run)"
            ),
            Self::Claim(claim) => write!(
                f,
                "kept: NodeClaim {claim} was launched under `default` (its NodeGroup carries that id; another id would never terminate it)"
            ),
            Self::Derived => f.write_str(
                "derived from the management cluster's identity: nothing here ran under `default` (no Lease of it, no NodeClaim launched under it)",
            ),
        }
    }
}

/// The hub id, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub id: String,
    pub reason: Reason,
}

/// The hub id given no `--hub-id` (rule 2 then 3 of the module's header), from every fact and the
/// management cluster's identity.
pub fn choose(facts: &Facts, management_cluster: &str) -> Result<Choice, IdError> {
    let kept = |reason| Ok(Choice { id: DEFAULT.to_string(), reason });
    if let Some(ns) = &facts.leader_lease {
        return kept(Reason::LeaderLease(ns.clone()));
    }
    if let Some(name) = &facts.labelled_lease {
        return kept(Reason::LabelledLease(name.clone()));
    }
    if let Some(claim) = &facts.claim {
        return kept(Reason::Claim(claim.clone()));
    }
    Ok(Choice { id: derived(management_cluster)?, reason: Reason::Derived })
}

/// `m-<first 12 hex digits of the UID, dashes removed, lowercase>`.
pub fn derived(management_cluster: &str) -> Result<String, IdError> {
    let digits: String = management_cluster.chars().filter(|c| *c != '-').take(DERIVED_DIGITS).collect();
    if digits.len() < DERIVED_DIGITS || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(IdError::UnusableIdentity { uid: management_cluster.chars().take(64).collect() });
    }
    Ok(format!("{DERIVED_PREFIX}{}", digits.to_ascii_lowercase()))
}

/// Whether NodeClaim `namespace/name` with provider ID `provider_id` was launched under
/// `default`: its NodeGroup is the one `default` derives for it.
pub fn launched_under_default(namespace: &str, name: &str, provider_id: Option<&str>) -> bool {
    provider_id
        .and_then(|p| crate::decisions::ownership::parse_provider_id(p).ok())
        .is_some_and(|group| group == crate::decisions::ownership::nodegroup_name(DEFAULT, namespace, name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::decisions::ownership::nodegroup_name;

    const UID: &str = "3F2a9c1e-7b44-4d0e-9a51-0c6e2d8b1f00";

    #[test]
    fn nothing_of_default_here_derives_the_id_from_the_management_cluster() {
        let choice = choose(&Facts::default(), UID).unwrap();
        assert_eq!(choice, Choice { id: "m-3f2a9c1e7b44".into(), reason: Reason::Derived });
        check(&choice.id).unwrap();
        check(&leader_lease_name(&choice.id)).unwrap();
        assert_ne!(choose(&Facts::default(), "0c6e2d8b-1f00-4d0e-9a51-3f2a9c1e7b44").unwrap().id, choice.id);
    }

    #[test]
    fn each_fact_alone_keeps_default() {
        let cases = [
            (
                Facts { leader_lease: Some("karpenter".into()), ..Facts::default() },
                Reason::LeaderLease("karpenter".into()),
            ),
            (
                Facts { labelled_lease: Some("kh-default-member-a".into()), ..Facts::default() },
                Reason::LabelledLease("kh-default-member-a".into()),
            ),
            (
                Facts { claim: Some("team-a/default-x".into()), ..Facts::default() },
                Reason::Claim("team-a/default-x".into()),
            ),
        ];
        for (facts, reason) in cases {
            let choice = choose(&facts, UID).unwrap();
            assert_eq!(choice, Choice { id: DEFAULT.into(), reason }, "{facts:?}");
            // Kept even when no id could be derived: an existing install never changes id.
            assert_eq!(choose(&facts, "").unwrap().id, DEFAULT);
        }
    }

    #[test]
    fn an_identity_without_twelve_hex_digits_derives_nothing() {
        for uid in ["", "3f2a-9c", "zz2a9c1e-7b44-4d0e-9a51-0c6e2d8b1f00"] {
            let e = choose(&Facts::default(), uid).unwrap_err().to_string();
            assert!(e.contains("--hub-id"), "{e}");
        }
    }

    #[test]
    fn a_claim_is_launched_under_default_when_its_group_is_the_one_default_derives() {
        let group = nodegroup_name(DEFAULT, "team-a", "default-x");
        assert!(launched_under_default("team-a", "default-x", Some(&format!("clevercloud://{group}"))));
        let other = nodegroup_name("m-3f2a9c1e7b44", "team-a", "default-x");
        assert!(!launched_under_default("team-a", "default-x", Some(&format!("clevercloud://{other}"))));
        assert!(!launched_under_default("team-b", "default-x", Some(&format!("clevercloud://{group}"))));
        assert!(!launched_under_default("team-a", "default-x", None), "not launched yet");
        assert!(!launched_under_default("team-a", "default-x", Some(&group)), "not a CKE provider ID");
    }

    #[test]
    fn an_id_must_fit_a_label_value_and_a_lease_name() {
        for good in ["default", "eu-west", "m-3f2a9c1e7b44", "a", &"a".repeat(63)] {
            check(good).unwrap();
            crds::validation::label_value(good).unwrap();
            // A Lease name is a DNS-1123 subdomain: at most 253 characters (no bound per part).
            let lease = leader_lease_name(good);
            let fits = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            assert!(lease.len() <= 253 && lease.chars().all(|c| fits(c) || c == '-'), "{lease}");
            assert!(lease.starts_with(fits) && lease.ends_with(fits), "{lease}");
        }
        for bad in ["", "Prod_1", "team_a.eu-1", "-a", "a-", "a.b", &"a".repeat(64)] {
            let e = check(bad).unwrap_err().to_string();
            assert!(e.contains("lowercase letters, digits and '-'"), "{bad}: {e}");
        }
    }
}
