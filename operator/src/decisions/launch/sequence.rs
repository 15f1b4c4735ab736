//! The launch sequence's decisions, between its API calls (karpenter-semantics §6.1, clever-cloud.md
//! §3.4–3.5): whether the claim's node class lets it launch, the next step given the group of the
//! claim's name (refuse, adopt, take over, create), what CKE's verdict on that group means, and the
//! writes on the claim that follow the outcome.
//!
//! Owns: each of those choices, the cool-down and the events a verdict calls for, and the texts of
//! the launch's events and conditions. Must not: do I/O, read the clock or log: the nodeclaim
//! controller's launch reads, takes the per-cluster gate, creates, waits for the verdict and
//! carries out the writes returned here, in the order given.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{LaunchError, adopt, choose, desired_nodegroup};
use crate::decisions::{
    capacity::CapacityState,
    conditions, handover,
    lifecycle::{self, LaunchOutcome, READY},
    organization::{Ceiling, Sizer},
    ownership::{self, ClaimIdentity, Owner},
};
use crds::{
    CleverNodeClass, NodeClaim, NodeClaimStatus, NodeGroup,
    catalog::{Flavor, InstanceType},
    labels,
    nodegroup::Verdict,
    quantity::Resources,
};

/// How soon a launch that cannot go on now looks again: the claim or the group changed under it.
pub const RETRY_SOON: Duration = Duration::from_secs(1);

/// A launched claim's first look after its launch.
const AFTER_LAUNCH: Duration = Duration::from_secs(1);

/// A claim whose group's name is someone else's looks again after this.
const AFTER_CONFLICT: Duration = Duration::from_secs(60);

/// Whether a node class is Ready (the rule pools take part by, in [`crate::decisions::taking_part`]). A
/// cached class that is not (or a class missing from the cache) is read live before [`judge_class`]
/// judges it: the claim is deleted for it.
pub use crate::decisions::taking_part::class_ready;

/// The claim's node class `namespace/name` as read (`None`: it does not exist): launch with it, or
/// why not.
pub fn judge_class<'c>(
    namespace: &str,
    name: &str,
    class: Option<&'c CleverNodeClass>,
) -> Result<&'c CleverNodeClass, LaunchError> {
    let Some(class) = class else {
        return Err(LaunchError::InsufficientCapacity(format!("CleverNodeClass {namespace}/{name} does not exist")));
    };
    if !class_ready(class) {
        let class_conditions = class.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let why = conditions::get(class_conditions, READY)
            .map_or("its Ready condition is not set yet".to_string(), |c| c.message.clone());
        return Err(LaunchError::NodeClassNotReady(format!("CleverNodeClass {namespace}/{name}: {why}")));
    }
    Ok(class)
}

/// After the per-cluster gate: whether the claim, as re-read live (`None`: gone), is still the one
/// to launch (the same UID, not being deleted). Waiting may have outlived the claim read.
pub fn still_to_launch(read: &NodeClaim, live: Option<&NodeClaim>) -> bool {
    live.is_some_and(|live| live.uid() == read.uid() && live.metadata.deletion_timestamp.is_none())
}

/// What the next step of a launch rests on.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub claim: &'a NodeClaim,
    pub namespace: &'a str,
    /// The workload cluster, as messages name it (`namespace/name`).
    pub cluster: &'a str,
    /// This hub on that cluster, with the move its registration declares.
    pub owner: Owner<'a>,
    /// The claim's node class, Ready ([`judge_class`]).
    pub class: &'a CleverNodeClass,
    /// The flavors the class serves.
    pub types: &'a [InstanceType],
    /// The cluster's capacity memory, read after the gate (a refusal judged meanwhile counts).
    pub capacity: &'a CapacityState,
    /// What the cluster's organisations leave ([`crate::decisions::organization::headroom`]), with
    /// whose it is for messages (`organisation acme`); `None`: the cluster belongs to none.
    pub headroom: Option<(Ceiling, &'a str)>,
    pub now: Timestamp,
}

impl Facts<'_> {
    fn claim_name(&self) -> &str {
        self.claim.metadata.name.as_deref().unwrap_or_default()
    }

    /// The claim's NodeGroup: the name derived from the hub, the namespace and the claim.
    pub fn group_name(&self) -> String {
        ownership::nodegroup_name(self.owner.hub_id, self.namespace, self.claim_name())
    }
}

/// Go on with an existing group of the claim's name.
#[derive(Debug, Clone)]
pub struct Adoption {
    /// The flavor to describe the claim with: the group's own, not one chosen now.
    pub flavor: String,
    pub group: NodeGroup,
    /// The group came with its claim from the management cluster the registration declares: merge
    /// this patch first (re-stamped as this management cluster's, guarded by the version proven).
    pub restamp: Option<serde_json::Value>,
}

/// Create a group for the claim.
#[derive(Debug, Clone)]
pub struct Creation {
    pub flavor: String,
    /// The chosen offering's price (for the log).
    pub price_hourly: f64,
    pub group: NodeGroup,
}

/// The next step of a launch.
#[derive(Debug, Clone)]
pub enum Step {
    Adopt(Box<Adoption>),
    Create(Box<Creation>),
}

/// The next step given the group of the claim's name (`None`: absent from the workload cache, so the
/// create is the real check; a group shown terminating there is read live first): refuse a group
/// being deleted or not this claim's, adopt one that is, refuse a creation while the cluster backs
/// off, else create the cheapest fitting flavor not cooling down.
pub fn next_step(f: &Facts<'_>, existing: Option<NodeGroup>) -> Result<Step, LaunchError> {
    if let Some(g) = existing {
        // A restart after the create, or a group moved with its claim.
        return adoption(f, g).map(|a| Step::Adopt(Box::new(a)));
    }
    if let Some(left) = f.capacity.backoff_remaining(f.now) {
        return Err(LaunchError::InsufficientCapacity(format!(
            "cluster {} is backing off NodeGroup creations for {}s after a CKE refusal{}",
            f.cluster,
            left.as_secs(),
            f.capacity.last_message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        )));
    }
    let requests = f.claim.spec.resources.requests.as_ref().map(Resources::from_resource_list).transpose();
    let requests = requests.map_err(|e| LaunchError::InsufficientCapacity(format!("bad requests: {e}")))?;
    let requests = requests.unwrap_or(Resources::ZERO);
    let extended = f.claim.spec.resources.requests.as_ref().map(crds::quantity::extended_of).transpose();
    let extended = extended.map_err(|e| LaunchError::InsufficientCapacity(format!("bad requests: {e}")))?;
    let extended = extended.unwrap_or_default();
    let available = |flavor: &str| f.capacity.is_available(flavor, f.now);
    // A flavor the organisation has no room for is not offered: the next fits, or none does.
    let fits = |flavor: &str| {
        f.headroom.is_none_or(|(left, _)| {
            f.types.iter().find(|t| t.name == flavor).is_none_or(|t| left.admits(Sizer::of_type(t)))
        })
    };
    let choice = match choose(&f.claim.spec.requirements, &requests, &extended, f.types, |fl| available(fl) && fits(fl))
    {
        Ok(choice) => choice,
        Err(e) => {
            return Err(match f.headroom {
                Some((left, whose))
                    if choose(&f.claim.spec.requirements, &requests, &extended, f.types, available).is_ok() =>
                {
                    LaunchError::InsufficientCapacity(format!(
                        "{whose}: no flavor this claim allows fits what is left of its quota ({})",
                        left.describe()
                    ))
                }
                _ => e,
            });
        }
    };
    let flavor = choice.instance_type.name.clone();
    let id = ClaimIdentity {
        hub_id: f.owner.hub_id,
        management_cluster: f.owner.management_cluster,
        namespace: f.namespace,
        claim: f.claim_name(),
        claim_uid: f.claim.metadata.uid.as_deref().unwrap_or_default(),
        nodepool: f.claim.labels().get(labels::NODEPOOL).map(String::as_str).unwrap_or_default(),
        nodeclass: &f.claim.spec.node_class_ref.name,
    };
    let group = desired_nodegroup(
        &id,
        &flavor,
        &f.class.spec.labels,
        f.claim.labels(),
        &crds::drift::nodeclass_hash(&f.class.spec),
    );
    Ok(Step::Create(Box::new(Creation { flavor, price_hourly: choice.offering.price_hourly, group })))
}

/// An existing group of the claim's name (cached, or read live after the create found the name
/// taken): nothing to adopt while it is being deleted (a refusal an earlier pass handled); adopted
/// only when the ownership proof says it is this claim's ([`adopt`]).
pub fn adoption(f: &Facts<'_>, g: NodeGroup) -> Result<Adoption, LaunchError> {
    if g.is_terminating() {
        return Err(LaunchError::InsufficientCapacity(format!("NodeGroup {} is being deleted", f.group_name())));
    }
    let adopted = adopt(&g, f.owner, f.namespace, f.claim)?;
    let restamp = adopted.moved.then(|| {
        handover::restamp(
            f.owner.management_cluster,
            f.claim.metadata.uid.as_deref().unwrap_or_default(),
            g.metadata.resource_version.as_deref().unwrap_or_default(),
        )
    });
    Ok(Adoption { flavor: adopted.flavor, group: g, restamp })
}

/// A per-cluster counter of the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// CKE gave no verdict in time.
    AcceptanceTimeout,
    /// The group's flavor is not in the class's catalogue.
    UnknownFlavor,
    /// The group vanished during acceptance.
    Vanished,
    /// CKE refused the group for quota.
    QuotaRejection,
}

/// One write of the verdict step, carried out in the order given; a failed capacity write ends the
/// launch as an API failure.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Count(Counter),
    /// A warning event on the claim (action `Launch`).
    Event {
        reason: &'static str,
        note: String,
    },
    /// Arm the flavor's cool-down: its group vanished.
    RecordVanish {
        flavor: String,
    },
    /// Record CKE's quota refusal of the flavor in the cluster's capacity memory (its cool-down,
    /// those of the flavors as large, the back-off), with the catalogue's flavors to size them.
    RecordRejection {
        flavor: String,
        message: String,
        flavors: Vec<Flavor>,
    },
    /// Delete the refused group (UID precondition on the group the verdict was read on): it frees
    /// nothing. A failure is left to garbage collection. Then say so in one warning line.
    DeleteRefusedGroup {
        flavor: String,
        message: String,
    },
}

/// CKE gave no verdict on `group` within `timeout`: count it and say so; the launch goes on
/// optimistically.
pub fn acceptance_timeout(group: &str, timeout: Duration) -> Vec<Write> {
    vec![
        Write::Count(Counter::AcceptanceTimeout),
        Write::Event {
            reason: "NodeGroupAcceptanceTimeout",
            note: format!("CKE gave no verdict on NodeGroup {group} within {timeout:?}; proceeding"),
        },
    ]
}

/// A launch that went through: how its claim is described.
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    pub flavor: String,
    pub offering_zone: String,
    pub capacity_type: String,
    pub instance_type: InstanceType,
}

/// What the verdict step knows.
#[derive(Debug, Clone, Copy)]
pub struct VerdictFacts<'a> {
    pub group: &'a str,
    /// The flavor the claim is described by (the created or adopted group's).
    pub flavor: &'a str,
    pub types: &'a [InstanceType],
    pub zone: &'a str,
}

/// How the verdict step ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    Launched(Box<Launched>),
    /// Seen on the workload cache, then gone from it: read the group live and judge again with the
    /// answer ([`judge_verdict`]'s `gone`).
    ReadLive,
    Refused(LaunchError),
    /// CKE failed to reconcile the group: an API failure of the launch, retried.
    Failed(String),
}

/// The verdict step: its writes, then how it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub writes: Vec<Write>,
    pub end: End,
}

/// What CKE's verdict on the group means (`None`: the group was seen, then gone from the cache;
/// `gone`: the live read's answer, once [`End::ReadLive`] asked for one). Accepted, or no verdict
/// in time: launched. Vanished (confirmed live): the flavor cools down and the claim is refused.
/// Refused for quota: the refusal is recorded, the group deleted, the claim refused. Failed: an
/// error. A flavor the catalogue no longer has refuses the claim first, whatever the verdict.
pub fn judge_verdict(f: &VerdictFacts<'_>, verdict: Option<Verdict>, gone: Option<bool>) -> Judged {
    let (group, flavor) = (f.group, f.flavor);
    let Some(it) = f.types.iter().find(|t| t.name == flavor).cloned() else {
        return Judged {
            writes: vec![Write::Count(Counter::UnknownFlavor)],
            end: End::Refused(LaunchError::InsufficientCapacity(format!("flavor {flavor} is not in the catalogue"))),
        };
    };
    let launched = || Judged {
        writes: Vec::new(),
        end: End::Launched(Box::new(Launched {
            flavor: flavor.to_string(),
            offering_zone: f.zone.to_string(),
            capacity_type: "on-demand".into(),
            instance_type: it.clone(),
        })),
    };
    match verdict {
        None => match gone {
            None => Judged { writes: Vec::new(), end: End::ReadLive },
            Some(false) => launched(),
            Some(true) => {
                let why = format!("NodeGroup {group} vanished during acceptance");
                Judged {
                    writes: vec![
                        Write::RecordVanish { flavor: flavor.to_string() },
                        Write::Count(Counter::Vanished),
                        Write::Event { reason: "NodeGroupVanished", note: why.clone() },
                    ],
                    end: End::Refused(LaunchError::InsufficientCapacity(why)),
                }
            }
        },
        Some(Verdict::QuotaRejected(message)) => {
            let message = message.unwrap_or_else(|| "quota exceeded".to_string());
            let flavors = f
                .types
                .iter()
                .map(|t| Flavor {
                    name: t.name.clone(),
                    cpu: t.capacity.cpu_millis / 1000,
                    memory_ki: t.capacity.memory_bytes / 1024,
                    price_hourly: t.price().unwrap_or_default(),
                })
                .collect();
            Judged {
                writes: vec![
                    Write::Count(Counter::QuotaRejection),
                    Write::Event {
                        reason: "NodeGroupQuotaExceeded",
                        note: format!("CKE refused NodeGroup {group} (flavor {flavor}): {message}"),
                    },
                    Write::RecordRejection { flavor: flavor.to_string(), message: message.clone(), flavors },
                    Write::DeleteRefusedGroup { flavor: flavor.to_string(), message: message.clone() },
                ],
                end: End::Refused(LaunchError::InsufficientCapacity(format!("CKE refused flavor {flavor}: {message}"))),
            }
        }
        Some(Verdict::Failed { message, .. }) => Judged {
            writes: Vec::new(),
            end: End::Failed(format!("CKE failed to reconcile NodeGroup {group}: {}", message.unwrap_or_default())),
        },
        Some(Verdict::Accepted | Verdict::Pending) => launched(),
    }
}

/// How a launch attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    Launched(Box<Launched>),
    Refused(LaunchError),
    /// Not now: come back after this.
    Pending(Duration),
    /// An API failure, in the hub's own words (the condition is the tenant's to read; a workload
    /// server's words are not).
    Failed(String),
}

/// One write on the claim after a launch attempt, carried out in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimWrite {
    /// Merge-patch the claim's labels with these. When that fails, write `launching` (if any) before
    /// giving up: the launch TTL must count from the first attempt.
    Labels { labels: BTreeMap<String, String>, launching: Option<Box<NodeClaimStatus>> },
    /// Write the claim's whole status.
    Status(Box<NodeClaimStatus>),
    /// A warning event on the claim (action `Launch`).
    Event { reason: &'static str, note: String },
    /// Delete the claim (UID precondition) so its pods are re-planned; gone or replaced already is
    /// as good.
    Delete,
}

/// The writes on the claim after a launch attempt, and when to look again (`None`: when it changes).
#[derive(Debug, Clone, PartialEq)]
pub struct Conclusion {
    pub writes: Vec<ClaimWrite>,
    pub requeue: Option<Duration>,
}

/// The claim's writes after `attempt` on its group `group`. `launching` is the
/// `Launched=Unknown(Launching)` status the lifecycle set in this pass, if it did: the outcome is set
/// on it (one status write), and a launch that concludes nothing yet writes it alone.
pub fn conclude(
    claim: &NodeClaim,
    group: &str,
    launching: Option<NodeClaimStatus>,
    attempt: &Attempt,
    now: Timestamp,
) -> Conclusion {
    let with_launching;
    let base = match &launching {
        Some(status) if !matches!(attempt, Attempt::Pending(_)) => {
            with_launching = NodeClaim { status: Some(status.clone()), ..claim.clone() };
            &with_launching
        }
        _ => claim,
    };
    let status = |outcome: &LaunchOutcome| ClaimWrite::Status(Box::new(lifecycle::launched(base, outcome, now)));
    match attempt {
        Attempt::Launched(l) => {
            let mut labels_patch = l.instance_type.labels.clone();
            labels_patch.insert(labels::INSTANCE_TYPE.to_string(), l.flavor.clone());
            labels_patch.insert(labels::ZONE.to_string(), l.offering_zone.clone());
            labels_patch.insert(labels::CAPACITY_TYPE.to_string(), l.capacity_type.clone());
            // The claim's own labels win over resolved ones.
            for (k, v) in claim.labels() {
                labels_patch.insert(k.clone(), v.clone());
            }
            let outcome = LaunchOutcome::Launched {
                provider_id: ownership::provider_id(group),
                capacity: with_extended(l.instance_type.capacity.to_resource_list(), &l.instance_type.extended),
                allocatable: with_extended(l.instance_type.allocatable.to_resource_list(), &l.instance_type.extended),
            };
            Conclusion {
                writes: vec![
                    ClaimWrite::Labels { labels: labels_patch, launching: launching.clone().map(Box::new) },
                    status(&outcome),
                ],
                requeue: Some(AFTER_LAUNCH),
            }
        }
        Attempt::Refused(e @ LaunchError::Conflict { .. }) => Conclusion {
            writes: vec![
                ClaimWrite::Event { reason: e.reason(), note: e.to_string() },
                status(&LaunchOutcome::Conflict(e.to_string())),
            ],
            requeue: Some(AFTER_CONFLICT),
        },
        Attempt::Refused(e) => Conclusion {
            writes: vec![ClaimWrite::Event { reason: e.reason(), note: e.to_string() }, ClaimWrite::Delete],
            requeue: None,
        },
        Attempt::Pending(after) => Conclusion {
            writes: launching.map(|s| ClaimWrite::Status(Box::new(s))).into_iter().collect(),
            requeue: Some(*after),
        },
        Attempt::Failed(why) => Conclusion { writes: vec![status(&LaunchOutcome::Failed(why.clone()))], requeue: None },
    }
}

/// A resource list with the flavor's extended resources (a NodeOverlay's capacity) added, as the
/// claim's status reports them.
fn with_extended(
    mut list: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    extended: &BTreeMap<String, i64>,
) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    list.extend(crds::quantity::extended_list(extended));
    list
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::decisions::{
        conditions::{TRUE, UNKNOWN},
        lifecycle::{
            LAUNCHED,
            fixtures::{claim, t},
        },
    };
    use crds::catalog::Catalog;

    const ME: Owner<'static> = Owner { hub_id: "default", management_cluster: "mgmt-1", moved_from: None };

    fn class(ready: Option<(&str, &str)>) -> CleverNodeClass {
        let mut class: CleverNodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
            "metadata": {"name": "default", "namespace": "team-a"},
            "spec": {},
        }))
        .unwrap();
        if let Some((status, message)) = ready {
            let mut s = crds::CleverNodeClassStatus::default();
            conditions::set(&mut s.conditions, READY, status, "Because", message, Some(1), t(0));
            class.status = Some(s);
        }
        class
    }

    fn types() -> Vec<InstanceType> {
        Catalog::builtin().instance_types("par")
    }

    fn facts<'a>(
        claim: &'a NodeClaim,
        class: &'a CleverNodeClass,
        types: &'a [InstanceType],
        capacity: &'a CapacityState,
    ) -> Facts<'a> {
        Facts {
            claim,
            namespace: "team-a",
            cluster: "team-a/prod",
            owner: ME,
            class,
            types,
            capacity,
            headroom: None,
            now: t(100),
        }
    }

    /// The group this hub creates for `claim`, as CKE holds it.
    fn ours(claim: &NodeClaim, management_cluster: &str, flavor: &str) -> NodeGroup {
        let mut g = desired_nodegroup(
            &ClaimIdentity {
                hub_id: "default",
                management_cluster,
                namespace: "team-a",
                claim: "c1",
                claim_uid: claim.metadata.uid.as_deref().unwrap(),
                nodepool: "general",
                nodeclass: "default",
            },
            flavor,
            &BTreeMap::new(),
            claim.labels(),
            "h",
        );
        g.metadata.resource_version = Some("7".into());
        g
    }

    #[test]
    fn a_class_launches_only_when_it_exists_and_is_ready() {
        assert!(matches!(
            judge_class("team-a", "default", None),
            Err(LaunchError::InsufficientCapacity(m)) if m == "CleverNodeClass team-a/default does not exist"
        ));
        let unset = class(None);
        assert!(!class_ready(&unset));
        assert_eq!(
            judge_class("team-a", "default", Some(&unset)).unwrap_err(),
            LaunchError::NodeClassNotReady("CleverNodeClass team-a/default: its Ready condition is not set yet".into())
        );
        let not_ready = class(Some((UNKNOWN, "the catalogue is refused")));
        assert!(!class_ready(&not_ready));
        assert_eq!(
            judge_class("team-a", "default", Some(&not_ready)).unwrap_err(),
            LaunchError::NodeClassNotReady("CleverNodeClass team-a/default: the catalogue is refused".into())
        );
        let ready = class(Some((TRUE, "")));
        assert!(class_ready(&ready));
        assert!(std::ptr::eq(judge_class("team-a", "default", Some(&ready)).unwrap(), &ready));
    }

    #[test]
    fn a_claim_is_launched_only_while_the_live_copy_is_the_same_and_not_deleting() {
        let read = claim();
        assert!(still_to_launch(&read, Some(&read)));
        assert!(!still_to_launch(&read, None), "deleted meanwhile");
        let mut replaced = read.clone();
        replaced.metadata.uid = Some("u2".into());
        assert!(!still_to_launch(&read, Some(&replaced)), "a new claim of that name");
        let mut deleting = read.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(50)));
        assert!(!still_to_launch(&read, Some(&deleting)));
    }

    #[test]
    fn no_group_creates_the_cheapest_fitting_flavor_as_this_claim_s() {
        let (c, class, types, capacity) = (claim(), class(Some((TRUE, ""))), types(), CapacityState::default());
        let f = facts(&c, &class, &types, &capacity);
        let Step::Create(new) = next_step(&f, None).unwrap() else { panic!("no create") };
        assert_eq!(new.flavor, "2XS");
        assert_eq!(new.group.spec.flavor, "2XS");
        assert_eq!(new.group.metadata.name.as_deref(), Some(f.group_name().as_str()));
        assert_eq!(new.group.metadata.annotations.as_ref().unwrap()[labels::NODECLAIM_UID], "u1");
        assert!(new.price_hourly > 0.0);
    }

    #[test]
    fn no_group_while_the_cluster_backs_off_refuses_with_the_time_left_and_cke_s_words() {
        let (c, class, types) = (claim(), class(Some((TRUE, ""))), types());
        let capacity = CapacityState {
            backoff_until: Some(t(130)),
            last_message: Some("cpu quota".into()),
            ..CapacityState::default()
        };
        let f = facts(&c, &class, &types, &capacity);
        assert_eq!(
            next_step(&f, None).unwrap_err(),
            LaunchError::InsufficientCapacity(
                "cluster team-a/prod is backing off NodeGroup creations for 30s after a CKE refusal: cpu quota".into()
            )
        );
        // Over: creates again.
        let f = Facts { now: t(130), ..f };
        assert!(matches!(next_step(&f, None), Ok(Step::Create(_))));
    }

    #[test]
    fn no_group_and_no_flavor_left_refuses_naming_those_cooling_down() {
        let (class, types) = (class(Some((TRUE, ""))), types());
        let mut c = claim();
        c.spec.requirements = vec![crds::common::NodeSelectorRequirement {
            key: labels::INSTANCE_TYPE.into(),
            operator: crds::common::Operator::In,
            values: vec!["XS".into()],
            min_values: None,
        }];
        let capacity = CapacityState {
            unavailable_until: BTreeMap::from([("XS".to_string(), t(500))]),
            ..CapacityState::default()
        };
        let e = next_step(&facts(&c, &class, &types, &capacity), None).unwrap_err();
        assert!(e.to_string().contains("cooling down") && e.to_string().contains("XS"), "{e}");
        // Requests that do not parse are named.
        let mut bad = claim();
        bad.spec.resources.requests = Some(BTreeMap::from([(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
        )]));
        let e = next_step(&facts(&bad, &class, &types, &CapacityState::default()), None).unwrap_err();
        assert!(e.to_string().contains("bad requests"), "{e}");
    }

    #[test]
    fn an_existing_group_is_adopted_refused_or_taken_over_by_its_proof() {
        let (c, class, types, capacity) = (claim(), class(Some((TRUE, ""))), types(), CapacityState::default());
        let f = facts(&c, &class, &types, &capacity);
        // Ours, from before a restart: adopted as it is, by its own flavor; no back-off stops it.
        let backing_off = CapacityState { backoff_until: Some(t(500)), ..CapacityState::default() };
        let g = ours(&c, "mgmt-1", "L");
        let step = next_step(&Facts { capacity: &backing_off, ..f.clone() }, Some(g.clone())).unwrap();
        let Step::Adopt(a) = step else { panic!("not adopted: {step:?}") };
        assert_eq!((a.flavor.as_str(), a.group.metadata.name.as_deref()), ("L", g.metadata.name.as_deref()));
        assert_eq!(a.restamp, None, "ours already: nothing to re-stamp");
        // Being deleted: nothing to adopt.
        let mut going = g.clone();
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(90)));
        assert_eq!(
            adoption(&f, going).unwrap_err(),
            LaunchError::InsufficientCapacity(format!("NodeGroup {} is being deleted", f.group_name()))
        );
        // Another claim's (another UID): a conflict, untouched.
        let mut other = claim();
        other.metadata.uid = Some("u9".into());
        assert!(matches!(next_step(&f, Some(ours(&other, "mgmt-1", "L"))), Err(LaunchError::Conflict { .. })));
        // Moved with its claim from the declared source: taken over, re-stamped at the version proven.
        let moved = ours(&other, "mgmt-0", "M");
        assert!(matches!(adoption(&f, moved.clone()), Err(LaunchError::Conflict { .. })), "no move declared");
        let f = Facts { owner: ME.moved_from(Some("mgmt-0")), ..f };
        let a = adoption(&f, moved.clone()).unwrap();
        assert_eq!(a.flavor, "M");
        assert_eq!(a.restamp, Some(handover::restamp("mgmt-1", "u1", "7")));
        assert_eq!(a.group.metadata.annotations, moved.metadata.annotations, "the group as read, not patched here");
    }

    fn verdict_facts(types: &[InstanceType]) -> VerdictFacts<'_> {
        VerdictFacts { group: "ng-1", flavor: "M", types, zone: "par" }
    }

    #[test]
    fn accepted_or_no_verdict_in_time_launches_with_the_flavor_s_instance_type() {
        let types = types();
        let f = verdict_facts(&types);
        for v in [Verdict::Accepted, Verdict::Pending] {
            let j = judge_verdict(&f, Some(v), None);
            assert!(j.writes.is_empty(), "{j:?}");
            let End::Launched(l) = j.end else { panic!("not launched: {j:?}") };
            assert_eq!(
                (l.flavor.as_str(), l.offering_zone.as_str(), l.capacity_type.as_str()),
                ("M", "par", "on-demand")
            );
            assert_eq!(l.instance_type.name, "M");
        }
        let timeout = acceptance_timeout("ng-1", Duration::from_secs(15));
        assert_eq!(timeout[0], Write::Count(Counter::AcceptanceTimeout));
        assert_eq!(
            timeout[1],
            Write::Event {
                reason: "NodeGroupAcceptanceTimeout",
                note: "CKE gave no verdict on NodeGroup ng-1 within 15s; proceeding".into()
            }
        );
    }

    #[test]
    fn a_group_gone_from_the_cache_is_read_live_and_only_a_confirmed_absence_is_a_vanish() {
        let types = types();
        let f = verdict_facts(&types);
        assert_eq!(judge_verdict(&f, None, None), Judged { writes: Vec::new(), end: End::ReadLive });
        assert!(matches!(judge_verdict(&f, None, Some(false)).end, End::Launched(_)));
        let gone = judge_verdict(&f, None, Some(true));
        let why = "NodeGroup ng-1 vanished during acceptance".to_string();
        assert_eq!(
            gone.writes,
            vec![
                Write::RecordVanish { flavor: "M".into() },
                Write::Count(Counter::Vanished),
                Write::Event { reason: "NodeGroupVanished", note: why.clone() },
            ]
        );
        assert_eq!(gone.end, End::Refused(LaunchError::InsufficientCapacity(why)));
    }

    #[test]
    fn a_quota_refusal_records_the_cool_down_deletes_the_group_and_refuses_the_claim() {
        let types = types();
        let f = verdict_facts(&types);
        let j = judge_verdict(&f, Some(Verdict::QuotaRejected(Some("cpu quota".into()))), None);
        assert_eq!(j.writes[0], Write::Count(Counter::QuotaRejection));
        assert_eq!(
            j.writes[1],
            Write::Event {
                reason: "NodeGroupQuotaExceeded",
                note: "CKE refused NodeGroup ng-1 (flavor M): cpu quota".into()
            }
        );
        let Write::RecordRejection { flavor, message, flavors } = &j.writes[2] else { panic!("{j:?}") };
        assert_eq!((flavor.as_str(), message.as_str()), ("M", "cpu quota"));
        assert_eq!(flavors.len(), types.len());
        let m = flavors.iter().find(|x| x.name == "M").unwrap();
        let it = types.iter().find(|x| x.name == "M").unwrap();
        assert_eq!((m.cpu, m.memory_ki), (it.capacity.cpu_millis / 1000, it.capacity.memory_bytes / 1024));
        assert_eq!(j.writes[3], Write::DeleteRefusedGroup { flavor: "M".into(), message: "cpu quota".into() });
        assert_eq!(j.writes.len(), 4);
        assert_eq!(j.end, End::Refused(LaunchError::InsufficientCapacity("CKE refused flavor M: cpu quota".into())));
        // CKE said nothing: the hub's words.
        let j = judge_verdict(&f, Some(Verdict::QuotaRejected(None)), None);
        assert_eq!(
            j.end,
            End::Refused(LaunchError::InsufficientCapacity("CKE refused flavor M: quota exceeded".into()))
        );
    }

    #[test]
    fn a_failed_reconcile_is_an_error_and_an_unknown_flavor_refuses_first() {
        let types = types();
        let f = verdict_facts(&types);
        let failed = Verdict::Failed { reason: Some("Boom".into()), message: Some("no network".into()) };
        let j = judge_verdict(&f, Some(failed.clone()), None);
        assert_eq!(
            j,
            Judged {
                writes: Vec::new(),
                end: End::Failed("CKE failed to reconcile NodeGroup ng-1: no network".into())
            }
        );
        let gone_flavor = VerdictFacts { flavor: "XXL-retired", ..f };
        for v in [Some(Verdict::Accepted), Some(failed), None] {
            let j = judge_verdict(&gone_flavor, v, None);
            assert_eq!(j.writes, vec![Write::Count(Counter::UnknownFlavor)]);
            assert_eq!(
                j.end,
                End::Refused(LaunchError::InsufficientCapacity("flavor XXL-retired is not in the catalogue".into()))
            );
        }
    }

    fn launching() -> NodeClaimStatus {
        let mut s = NodeClaimStatus::default();
        conditions::set(&mut s.conditions, LAUNCHED, UNKNOWN, "Launching", "", Some(1), t(100));
        s
    }

    fn launched_attempt() -> Attempt {
        let it = types().into_iter().find(|x| x.name == "M").unwrap();
        Attempt::Launched(Box::new(Launched {
            flavor: "M".into(),
            offering_zone: "par".into(),
            capacity_type: "on-demand".into(),
            instance_type: it,
        }))
    }

    #[test]
    fn a_launch_labels_the_claim_then_writes_launched_over_launching() {
        let c = claim();
        let d = conclude(&c, "ng-1", Some(launching()), &launched_attempt(), t(101));
        assert_eq!(d.requeue, Some(Duration::from_secs(1)));
        let [ClaimWrite::Labels { labels: l, launching: on_failure }, ClaimWrite::Status(s)] = d.writes.as_slice()
        else {
            panic!("{d:?}")
        };
        assert_eq!(on_failure.as_deref(), Some(&launching()), "the TTL counts from the first attempt");
        assert_eq!(l[labels::ZONE], "par");
        assert_eq!(l[labels::CAPACITY_TYPE], "on-demand");
        assert_eq!(l[labels::NODEPOOL], "general", "the claim's labels are kept");
        // The claim's own labels win over resolved ones.
        let mut c2 = claim();
        c2.metadata.labels.as_mut().unwrap().insert(labels::ZONE.into(), "mine".into());
        let d2 = conclude(&c2, "ng-1", None, &launched_attempt(), t(101));
        let ClaimWrite::Labels { labels: l2, launching: None } = &d2.writes[0] else { panic!("{d2:?}") };
        assert_eq!(l2[labels::ZONE], "mine");
        assert_eq!(s.provider_id.as_deref(), Some("clevercloud://ng-1"));
        let cond = conditions::get(&s.conditions, LAUNCHED).unwrap();
        assert_eq!((cond.status.as_str(), cond.reason.as_str()), (TRUE, "Launched"));
        assert_eq!(cond.last_transition_time.0, t(101));
        assert!(s.capacity.as_ref().is_some_and(|m| m.contains_key("cpu")));
    }

    #[test]
    fn a_refused_launch_deletes_the_claim_with_an_event_of_its_reason() {
        let c = claim();
        for (e, reason) in [
            (LaunchError::InsufficientCapacity("none left".into()), "InsufficientCapacity"),
            (LaunchError::NodeClassNotReady("not yet".into()), "NodeClassNotReady"),
        ] {
            let d = conclude(&c, "ng-1", Some(launching()), &Attempt::Refused(e.clone()), t(101));
            assert_eq!(d.writes, vec![ClaimWrite::Event { reason, note: e.to_string() }, ClaimWrite::Delete]);
            assert_eq!(d.requeue, None);
        }
    }

    #[test]
    fn a_conflict_is_reported_on_the_claim_and_looked_at_again_in_a_minute() {
        let c = claim();
        let e = LaunchError::Conflict { name: "ng-1".into(), why: "not ours".into() };
        let d = conclude(&c, "ng-1", Some(launching()), &Attempt::Refused(e.clone()), t(101));
        assert_eq!(d.requeue, Some(Duration::from_secs(60)));
        assert_eq!(d.writes[0], ClaimWrite::Event { reason: "NodeGroupConflict", note: e.to_string() });
        let ClaimWrite::Status(s) = &d.writes[1] else { panic!("{d:?}") };
        let cond = conditions::get(&s.conditions, LAUNCHED).unwrap();
        assert_eq!((cond.reason.as_str(), cond.message.as_str()), ("NodeGroupConflict", e.to_string().as_str()));
        // Set on the Launching status of this pass (still Unknown since then), not on the claim read.
        assert_eq!(cond.last_transition_time.0, t(100));
        assert_eq!(d.writes.len(), 2);
    }

    #[test]
    fn a_pending_launch_writes_launching_alone_and_a_failed_one_its_words() {
        let c = claim();
        let wait = Attempt::Pending(Duration::from_secs(1));
        let d = conclude(&c, "ng-1", Some(launching()), &wait, t(101));
        assert_eq!(
            d,
            Conclusion {
                writes: vec![ClaimWrite::Status(Box::new(launching()))],
                requeue: Some(Duration::from_secs(1))
            }
        );
        assert_eq!(conclude(&c, "ng-1", None, &wait, t(101)).writes, Vec::new());
        let d = conclude(&c, "ng-1", Some(launching()), &Attempt::Failed("HTTP 503".into()), t(101));
        assert_eq!(d.requeue, None);
        let [ClaimWrite::Status(s)] = d.writes.as_slice() else { panic!("{d:?}") };
        let cond = conditions::get(&s.conditions, LAUNCHED).unwrap();
        assert_eq!((cond.reason.as_str(), cond.message.as_str()), ("LaunchFailed", "HTTP 503"));
    }
}
