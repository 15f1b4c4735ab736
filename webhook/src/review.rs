//! The request path of one `AdmissionReview`: read the body, decide what it asks, read the objects
//! it refers to, run the shared validation of [`crds::admission`], and write the answer.
//!
//! The stages are split so that everything but the reads is synchronous and pure: [`read`] turns
//! bytes into either an immediate [`Answer`] or an [`Admission`] to validate, and
//! [`Admission::validate`] turns that and the [`Resolved`] references into an [`Answer`]. The fuzz
//! target and the property tests drive exactly these functions.
//!
//! A body that is not an `admission.k8s.io/v1` `AdmissionReview` with a request and a uid gets a
//! [`BadRequest`] (HTTP 400): there is no uid to answer to. Anything else gets a well-formed
//! answer: an object of the wrong kind, that cannot be read, or an unknown operation is denied with
//! a message saying why.

use std::fmt;

use crds::admission::{Lookup, NodePoolReferences, Verdict};
use crds::labels::{GROUP, NODECLASS_KIND};
use crds::validation::dns1123_subdomain;
use crds::{CapacityBuffer, CleverNodeClass, CleverOrganization, FlavorCatalog, NodeOverlay, NodePool};
use prometheus_client::encoding::EncodeLabelValue;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::references::References;

/// The only AdmissionReview version served (`admissionReviewVersions: ["v1"]`).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of the review document.
pub const REVIEW_KIND: &str = "AdmissionReview";
/// Version of the hub's resources.
pub const VERSION: &str = "v1alpha1";
/// Longest piece of a parse error quoted in a denial.
const MAX_ERROR_CHARS: usize = 300;

/// A resource this webhook validates; one route each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum Kind {
    /// `CleverNodeClass`.
    CleverNodeClass,
    /// `FlavorCatalog`.
    FlavorCatalog,
    /// `NodePool`.
    NodePool,
    /// `CleverOrganization` (cluster-scoped).
    CleverOrganization,
    /// `CapacityBuffer`.
    CapacityBuffer,
    /// `NodeOverlay`.
    NodeOverlay,
}

impl Kind {
    /// Every validated kind.
    pub const ALL: [Kind; 6] = [
        Kind::CleverNodeClass,
        Kind::FlavorCatalog,
        Kind::NodePool,
        Kind::CleverOrganization,
        Kind::CapacityBuffer,
        Kind::NodeOverlay,
    ];

    /// The kind's name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Kind::CleverNodeClass => NODECLASS_KIND,
            Kind::FlavorCatalog => "FlavorCatalog",
            Kind::NodePool => "NodePool",
            Kind::CleverOrganization => "CleverOrganization",
            Kind::CapacityBuffer => "CapacityBuffer",
            Kind::NodeOverlay => "NodeOverlay",
        }
    }

    /// The resource (plural) name.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::CleverNodeClass => "clevernodeclasses",
            Kind::FlavorCatalog => "flavorcatalogs",
            Kind::NodePool => "nodepools",
            Kind::CleverOrganization => "cleverorganizations",
            Kind::CapacityBuffer => "capacitybuffers",
            Kind::NodeOverlay => "nodeoverlays",
        }
    }

    /// Whether the resource is cluster-scoped: its objects have no namespace (the webhook
    /// configuration's rule says `scope: Cluster`, and a namespaceSelector never skips them).
    pub fn cluster_scoped(self) -> bool {
        matches!(self, Kind::CleverOrganization)
    }

    /// The route the API server posts reviews of this kind to.
    pub fn path(self) -> &'static str {
        match self {
            Kind::CleverNodeClass => "/validate/clevernodeclasses",
            Kind::FlavorCatalog => "/validate/flavorcatalogs",
            Kind::NodePool => "/validate/nodepools",
            Kind::CleverOrganization => "/validate/cleverorganizations",
            Kind::CapacityBuffer => "/validate/capacitybuffers",
            Kind::NodeOverlay => "/validate/nodeoverlays",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A body that is not an AdmissionReview this server can answer: HTTP 400 with the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// Not JSON, or not the shape of an AdmissionReview.
    #[error("the body is not an AdmissionReview: {0}")]
    Malformed(String),
    /// Another apiVersion or kind.
    #[error(
        "expected apiVersion {REVIEW_API_VERSION} and kind {REVIEW_KIND}, got {api_version:?} {kind:?}; set admissionReviewVersions: [\"v1\"]"
    )]
    Unsupported {
        /// The review's apiVersion.
        api_version: String,
        /// The review's kind.
        kind: String,
    },
    /// No `request`, or one without a uid.
    #[error("the AdmissionReview has no request or no request.uid")]
    NoRequest,
}

/// The answer to one review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The request's uid, echoed.
    pub uid: String,
    /// Whether the object may be stored.
    pub allowed: bool,
    /// Why not, when denied.
    pub message: Option<String>,
    /// Warnings shown to the client (kubectl prints them).
    pub warnings: Vec<String>,
}

impl Answer {
    fn allow(uid: String) -> Self {
        Answer { uid, allowed: true, message: None, warnings: Vec::new() }
    }

    fn deny(uid: String, message: String) -> Self {
        Answer { uid, allowed: false, message: Some(message), warnings: Vec::new() }
    }

    fn from_verdict(uid: String, verdict: &Verdict, mut warnings: Vec<String>) -> Self {
        warnings.extend(verdict.warning_messages());
        Answer { uid, allowed: verdict.is_allowed(), message: verdict.denial_message(), warnings }
    }

    /// The `AdmissionReview` response document.
    pub fn to_json(&self) -> Vec<u8> {
        let review = ReviewOut {
            api_version: REVIEW_API_VERSION,
            kind: REVIEW_KIND,
            response: ResponseOut {
                uid: &self.uid,
                allowed: self.allowed,
                status: self.message.as_deref().map(|message| StatusOut { code: 403, message }),
                warnings: &self.warnings,
            },
        };
        // Serialising plain strings and booleans cannot fail; an empty body would be a 500 anyway.
        serde_json::to_vec(&review).unwrap_or_default()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct StatusOut<'a> {
    code: u16,
    message: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, borrow)]
    request: Option<RequestIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    old_object: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    kind: String,
}

/// The object under review (and the stored one, on update).
#[derive(Debug, Clone)]
pub enum Subject {
    /// A `CleverNodeClass`.
    NodeClass {
        /// The object as it would be stored.
        new: Box<CleverNodeClass>,
        /// The stored object, on update.
        old: Option<Box<CleverNodeClass>>,
    },
    /// A `FlavorCatalog`.
    FlavorCatalog {
        /// The object as it would be stored.
        new: Box<FlavorCatalog>,
        /// The stored object, on update.
        old: Option<Box<FlavorCatalog>>,
    },
    /// A `NodePool`.
    NodePool {
        /// The object as it would be stored.
        new: Box<NodePool>,
        /// The stored object, on update.
        old: Option<Box<NodePool>>,
    },
    /// A `CleverOrganization`.
    Organization {
        /// The object as it would be stored.
        new: Box<CleverOrganization>,
        /// The stored object, on update.
        old: Option<Box<CleverOrganization>>,
    },
    /// A `CapacityBuffer`.
    CapacityBuffer {
        /// The object as it would be stored.
        new: Box<CapacityBuffer>,
        /// The stored object, on update.
        old: Option<Box<CapacityBuffer>>,
    },
    /// A `NodeOverlay`.
    NodeOverlay {
        /// The object as it would be stored.
        new: Box<NodeOverlay>,
        /// The stored object, on update.
        old: Option<Box<NodeOverlay>>,
    },
}

/// A create or update to validate.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The request's uid.
    pub uid: String,
    /// The object's namespace; empty for a cluster-scoped kind (`CleverOrganization`), which
    /// refers to nothing namespaced.
    pub namespace: String,
    /// The objects.
    pub subject: Subject,
    /// Warnings found while reading the request (e.g. an unreadable stored object).
    pub warnings: Vec<String>,
}

/// What reading a review gave.
#[derive(Debug, Clone)]
pub enum Step {
    /// Nothing to validate: the answer is known.
    Answer(Answer),
    /// A create or update to validate.
    Validate(Box<Admission>),
}

/// The objects an [`Admission`] refers to, as read.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The NodePool's `CleverNodeClass`.
    pub node_class: Lookup<CleverNodeClass>,
    /// The `FlavorCatalog` of the class under review, or of the NodePool's class.
    pub flavor_catalog: Lookup<FlavorCatalog>,
}

impl Resolved {
    /// Nothing could be read.
    pub fn unchecked(why: &str) -> Self {
        Resolved { node_class: Lookup::Unchecked(why.to_string()), flavor_catalog: Lookup::Unchecked(why.to_string()) }
    }
}

/// Reads a review posted to the route of `route`.
pub fn read(route: Kind, body: &[u8]) -> Result<Step, BadRequest> {
    let review: ReviewIn<'_> =
        serde_json::from_slice(body).map_err(|e| BadRequest::Malformed(shorten(&e.to_string())))?;
    if review.api_version != REVIEW_API_VERSION || review.kind != REVIEW_KIND {
        return Err(BadRequest::Unsupported { api_version: shorten(&review.api_version), kind: shorten(&review.kind) });
    }
    let request = review.request.ok_or(BadRequest::NoRequest)?;
    if request.uid.is_empty() {
        return Err(BadRequest::NoRequest);
    }
    let uid = request.uid;
    let gvk = &request.kind;
    if gvk.group != GROUP || gvk.kind != route.name() {
        let message = format!(
            "{} validates {}.{GROUP} only, got kind {:?} of group {:?}: the ValidatingWebhookConfiguration's rules send \
             this resource to the wrong path",
            route.path(),
            route.name(),
            shorten(&gvk.kind),
            shorten(&gvk.group),
        );
        return Ok(Step::Answer(Answer::deny(uid, message)));
    }
    if gvk.version != VERSION {
        let message =
            format!("{} version {:?} is not served by this webhook (only {VERSION})", route, shorten(&gvk.version));
        return Ok(Step::Answer(Answer::deny(uid, message)));
    }
    if request.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        // Status writes belong to the hub: nothing here judges them.
        return Ok(Step::Answer(Answer::allow(uid)));
    }
    let update = match request.operation.as_str() {
        "CREATE" => false,
        "UPDATE" => true,
        "DELETE" | "CONNECT" => return Ok(Step::Answer(Answer::allow(uid))),
        other => {
            let message = format!("unexpected operation {:?}: only CREATE and UPDATE are validated", shorten(other));
            return Ok(Step::Answer(Answer::deny(uid, message)));
        }
    };
    let Some(object) = request.object else {
        return Ok(Step::Answer(Answer::deny(uid, format!("the request carries no {route} object"))));
    };
    let mut warnings = Vec::new();
    let old = if update { request.old_object } else { None };
    let subject = match route {
        Kind::CleverNodeClass => {
            parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::NodeClass { new, old })
        }
        Kind::FlavorCatalog => {
            parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::FlavorCatalog { new, old })
        }
        Kind::NodePool => parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::NodePool { new, old }),
        Kind::CleverOrganization => {
            parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::Organization { new, old })
        }
        Kind::CapacityBuffer => {
            parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::CapacityBuffer { new, old })
        }
        Kind::NodeOverlay => parse_pair(object, old, &mut warnings).map(|(new, old)| Subject::NodeOverlay { new, old }),
    };
    let subject = match subject {
        Ok(subject) => subject,
        Err(problem) => {
            let message = format!("the object cannot be read as a {route} {VERSION}: {problem}");
            return Ok(Step::Answer(Answer::deny(uid, message)));
        }
    };
    // A cluster-scoped object has none: the API server sends no namespace, and nothing is read.
    let namespace = request
        .namespace
        .filter(|n| !n.is_empty() && !route.cluster_scoped())
        .or_else(|| match &subject {
            Subject::NodeClass { new, .. } => new.metadata.namespace.clone(),
            Subject::FlavorCatalog { new, .. } => new.metadata.namespace.clone(),
            Subject::NodePool { new, .. } => new.metadata.namespace.clone(),
            Subject::CapacityBuffer { new, .. } => new.metadata.namespace.clone(),
            Subject::NodeOverlay { new, .. } => new.metadata.namespace.clone(),
            Subject::Organization { .. } => None,
        })
        .unwrap_or_default();
    Ok(Step::Validate(Box::new(Admission { uid, namespace, subject, warnings })))
}

/// The new object does not read as its kind; the message is the parser's, shortened.
#[derive(Debug, thiserror::Error)]
#[error("{}", shorten(&.0.to_string()))]
struct Unreadable(serde_json::Error);

/// Parses the new object (an error denies) and the old one (an error only skips the update checks).
fn parse_pair<T: serde::de::DeserializeOwned>(
    new: &RawValue,
    old: Option<&RawValue>,
    warnings: &mut Vec<String>,
) -> Result<(Box<T>, Option<Box<T>>), Unreadable> {
    let new = serde_json::from_str(new.get()).map_err(Unreadable)?;
    let old = match old.map(|o| serde_json::from_str(o.get())) {
        None => None,
        Some(Ok(old)) => Some(old),
        Some(Err(e)) => {
            warnings.push(format!(
                "the stored object cannot be read ({}): immutable fields were not checked",
                shorten(&e.to_string())
            ));
            None
        }
    };
    Ok((new, old))
}

/// The references an admission needs read first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Needs {
    /// The `CleverNodeClass` to read (a NodePool's).
    pub node_class: Option<String>,
    /// The `FlavorCatalog` to read (a class's), when known before reading the class.
    pub flavor_catalog: Option<String>,
}

impl Admission {
    /// Which objects to read (names already valid; an invalid one is denied by validation anyway).
    pub fn needs(&self) -> Needs {
        let valid = |name: &str| dns1123_subdomain(name).is_ok().then(|| name.to_string());
        match &self.subject {
            Subject::NodeClass { new, .. } => Needs {
                node_class: None,
                flavor_catalog: new.spec.flavor_catalog_ref.as_ref().and_then(|r| valid(&r.name)),
            },
            // A buffer's PodTemplate is not read: the hub reports a missing or unusable one. An
            // overlay refers to nothing: the hub evaluates it against the namespace's pools.
            Subject::FlavorCatalog { .. }
            | Subject::Organization { .. }
            | Subject::CapacityBuffer { .. }
            | Subject::NodeOverlay { .. } => Needs::default(),
            Subject::NodePool { new, .. } => {
                let r = &new.spec.template.spec.node_class_ref;
                let ours = r.group == GROUP && r.kind == NODECLASS_KIND;
                Needs { node_class: if ours { valid(&r.name) } else { None }, flavor_catalog: None }
            }
        }
    }

    /// Validates with the references read.
    pub fn validate(self, resolved: &Resolved) -> Answer {
        let verdict = match &self.subject {
            Subject::NodeClass { new, old } => {
                crds::admission::validate_node_class(new, old.as_deref(), resolved.flavor_catalog.as_ref())
            }
            Subject::FlavorCatalog { new, old } => crds::admission::validate_flavor_catalog(new, old.as_deref()),
            Subject::NodePool { new, old } => crds::admission::validate_node_pool(
                new,
                old.as_deref(),
                NodePoolReferences {
                    node_class: resolved.node_class.as_ref(),
                    flavor_catalog: resolved.flavor_catalog.as_ref(),
                    base: None,
                },
            ),
            Subject::Organization { new, old } => crds::admission::validate_organization(new, old.as_deref()),
            Subject::CapacityBuffer { new, old } => crds::admission::validate_capacity_buffer(new, old.as_deref()),
            Subject::NodeOverlay { new, old } => crds::admission::validate_node_overlay(new, old.as_deref()),
        };
        Answer::from_verdict(self.uid, &verdict, self.warnings)
    }
}

/// Reads the references of an admission through `references`.
pub async fn resolve(admission: &Admission, references: &dyn References) -> Resolved {
    let needs = admission.needs();
    let namespace = admission.namespace.as_str();
    let mut resolved = Resolved { node_class: Lookup::Missing, flavor_catalog: Lookup::Missing };
    if let Some(name) = &needs.node_class {
        resolved.node_class = references.node_class(namespace, name).await;
        if let Lookup::Found(class) = &resolved.node_class
            && let Some(r) = &class.spec.flavor_catalog_ref
            && dns1123_subdomain(&r.name).is_ok()
        {
            resolved.flavor_catalog = references.flavor_catalog(namespace, &r.name).await;
        }
    }
    if let Some(name) = &needs.flavor_catalog {
        resolved.flavor_catalog = references.flavor_catalog(namespace, name).await;
    }
    resolved
}

/// The whole path: read, resolve the references, validate.
///
/// A bug that panics inside the validation rules still gets an answer: a denial saying so (the
/// object is refused rather than stored unchecked), logged as an error.
pub async fn review(route: Kind, body: &[u8], references: &dyn References) -> Result<Answer, BadRequest> {
    Ok(answer(route, read(route, body)?, references).await)
}

/// The answer to a review already [`read`]: its references resolved and the object validated.
pub async fn answer(route: Kind, step: Step, references: &dyn References) -> Answer {
    match step {
        Step::Answer(answer) => answer,
        Step::Validate(admission) => {
            let resolved = resolve(&admission, references).await;
            let uid = admission.uid.clone();
            let validated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| admission.validate(&resolved)));
            validated.unwrap_or_else(|_| {
                tracing::error!(%route, %uid, "validation panicked; the object is refused");
                Answer::deny(uid, format!("internal error while validating this {route}: the object is refused to be safe; please report it"))
            })
        }
    }
}

/// The whole path without reading references (they count as unchecked): what the fuzz target runs.
pub fn review_offline(route: Kind, body: &[u8]) -> Result<Answer, BadRequest> {
    match read(route, body)? {
        Step::Answer(answer) => Ok(answer),
        Step::Validate(admission) => Ok(admission.validate(&Resolved::unchecked("offline"))),
    }
}

/// A user string cut to a readable length for a message.
fn shorten(s: &str) -> String {
    if s.chars().count() <= MAX_ERROR_CHARS {
        s.to_string()
    } else {
        let head: String = s.chars().take(MAX_ERROR_CHARS).collect();
        format!("{head}...")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn review_of(kind: &str, operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        let mut request = json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": GROUP, "version": VERSION, "kind": kind},
            "resource": {"group": GROUP, "version": VERSION, "resource": "x"},
            "operation": operation,
            "namespace": "team-a",
            "name": "default",
            "userInfo": {"username": "admin"},
            "object": object,
            "dryRun": false,
        });
        if let Some(old) = old {
            request["oldObject"] = old;
        }
        serde_json::to_vec(&json!({"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "request": request})).unwrap()
    }

    fn class(labels: Value) -> Value {
        json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass",
            "metadata": {"name": "default", "namespace": "team-a"},
            "spec": {"labels": labels}
        })
    }

    fn response(answer: &Answer) -> Value {
        serde_json::from_slice(&answer.to_json()).unwrap()
    }

    #[test]
    fn an_allowed_review_echoes_the_uid_in_a_v1_response() {
        let answer = review_offline(
            Kind::CleverNodeClass,
            &review_of("CleverNodeClass", "CREATE", class(json!({"team": "a"})), None),
        )
        .unwrap();
        assert!(answer.allowed, "{answer:?}");
        let v = response(&answer);
        assert_eq!(v["apiVersion"], REVIEW_API_VERSION);
        assert_eq!(v["kind"], REVIEW_KIND);
        assert_eq!(v["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("status").is_none() && v["response"].get("warnings").is_none(), "{v}");
    }

    #[test]
    fn a_denial_names_the_field_and_the_fix() {
        let body = review_of("CleverNodeClass", "CREATE", class(json!({"node-role.kubernetes.io/worker": ""})), None);
        let answer = review_offline(Kind::CleverNodeClass, &body).unwrap();
        assert!(!answer.allowed);
        let v = response(&answer);
        assert_eq!(v["response"]["status"]["code"], 403);
        let message = v["response"]["status"]["message"].as_str().unwrap();
        assert!(message.starts_with("spec.labels[node-role.kubernetes.io/worker]: "), "{message}");
        assert!(message.contains("spec.template.metadata.labels"), "{message}");
    }

    #[test]
    fn bodies_that_are_not_reviews_are_bad_requests() {
        assert!(matches!(read(Kind::NodePool, b""), Err(BadRequest::Malformed(_))));
        assert!(matches!(read(Kind::NodePool, b"{"), Err(BadRequest::Malformed(_))));
        assert!(matches!(read(Kind::NodePool, b"[1,2]"), Err(BadRequest::Malformed(_))));
        assert!(matches!(read(Kind::NodePool, b"{\"apiVersion\": 3}"), Err(BadRequest::Malformed(_))));
        assert!(matches!(read(Kind::NodePool, b"{}"), Err(BadRequest::Unsupported { .. })));
        let v1beta1 = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": REVIEW_KIND, "request": {"uid": "u"}});
        let e = read(Kind::NodePool, &serde_json::to_vec(&v1beta1).unwrap()).unwrap_err();
        assert!(e.to_string().contains("admissionReviewVersions"), "{e}");
        let no_request = json!({"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND});
        assert_eq!(read(Kind::NodePool, &serde_json::to_vec(&no_request).unwrap()).unwrap_err(), BadRequest::NoRequest);
        let no_uid = json!({"apiVersion": REVIEW_API_VERSION, "kind": REVIEW_KIND, "request": {"operation": "CREATE"}});
        assert_eq!(read(Kind::NodePool, &serde_json::to_vec(&no_uid).unwrap()).unwrap_err(), BadRequest::NoRequest);
    }

    #[test]
    fn unexpected_requests_get_well_formed_denials() {
        // Wrong kind for the route.
        let body = review_of("NodePool", "CREATE", json!({}), None);
        let answer = review_offline(Kind::CleverNodeClass, &body).unwrap();
        assert!(!answer.allowed && answer.message.as_deref().unwrap().contains("wrong path"), "{answer:?}");
        // An object that does not fit the type.
        let body = review_of("CleverNodeClass", "CREATE", json!({"metadata": {}, "spec": {"labels": 5}}), None);
        let answer = review_offline(Kind::CleverNodeClass, &body).unwrap();
        assert!(!answer.allowed && answer.message.as_deref().unwrap().contains("cannot be read as a CleverNodeClass"));
        // No object.
        let body = review_of("CleverNodeClass", "CREATE", Value::Null, None);
        assert!(!review_offline(Kind::CleverNodeClass, &body).unwrap().allowed);
        // Unknown operation.
        let body = review_of("CleverNodeClass", "PATCH", class(json!({})), None);
        assert!(!review_offline(Kind::CleverNodeClass, &body).unwrap().allowed);
    }

    #[test]
    fn deletes_and_status_writes_are_allowed_without_looking() {
        let body = review_of("FlavorCatalog", "DELETE", Value::Null, Some(json!({"garbage": true})));
        assert!(review_offline(Kind::FlavorCatalog, &body).unwrap().allowed);
        let mut v: Value = serde_json::from_slice(&review_of("FlavorCatalog", "UPDATE", json!({}), None)).unwrap();
        v["request"]["subResource"] = json!("status");
        assert!(review_offline(Kind::FlavorCatalog, &serde_json::to_vec(&v).unwrap()).unwrap().allowed);
    }

    #[test]
    fn an_unreadable_stored_object_is_a_warning() {
        let body = review_of("CleverNodeClass", "UPDATE", class(json!({})), Some(json!({"spec": {"labels": []}})));
        let answer = review_offline(Kind::CleverNodeClass, &body).unwrap();
        assert!(answer.allowed);
        assert!(answer.warnings[0].contains("immutable fields were not checked"), "{answer:?}");
    }

    fn organization(spec: Value) -> Value {
        json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
            "metadata": {"name": "orga-acme"},
            "spec": spec
        })
    }

    /// A review of a cluster-scoped object, as the API server sends it: no `namespace`.
    fn cluster_review(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(&review_of("CleverOrganization", operation, object, old)).unwrap();
        v["request"].as_object_mut().unwrap().remove("namespace");
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_cluster_scoped_organization_is_validated_without_a_namespace() {
        let good = organization(
            json!({"clusterSelector": {"matchLabels": {"org": "acme"}}, "quota": {"cpu": "40", "memory": "40G"}}),
        );
        let Step::Validate(admission) =
            read(Kind::CleverOrganization, &cluster_review("CREATE", good.clone(), None)).unwrap()
        else {
            panic!("expected a validation");
        };
        assert_eq!(admission.namespace, "");
        assert_eq!(admission.needs(), Needs::default(), "an organisation refers to nothing");
        let answer = admission.validate(&Resolved::unchecked("offline"));
        assert!(answer.allowed && answer.warnings.is_empty(), "{answer:?}");

        // Denied with the field and the fix, on create and on update.
        let bad = organization(json!({"clusterSelector": {}, "quota": {"memory": "40Gi"}, "limits": {"cpu": "4"}}));
        for body in [cluster_review("CREATE", bad.clone(), None), cluster_review("UPDATE", bad, Some(good))] {
            let answer = review_offline(Kind::CleverOrganization, &body).unwrap();
            assert!(!answer.allowed, "{answer:?}");
            let message = answer.message.as_deref().unwrap();
            assert!(message.starts_with("spec.limits[cpu]: ") && message.contains("spec.quota.cpu"), "{message}");
            assert!(
                answer.warnings.iter().any(|w| w.starts_with("spec.quota.memory: \"40Gi\" is 42.95G")),
                "{answer:?}"
            );
        }
        // A namespace in the request (there is none for this kind) changes nothing.
        let body = review_of(
            "CleverOrganization",
            "CREATE",
            organization(json!({"clusterSelector": {}, "quota": {"cpu": "40"}})),
            None,
        );
        let Step::Validate(admission) = read(Kind::CleverOrganization, &body).unwrap() else { panic!() };
        assert_eq!(admission.namespace, "");
        // The other kinds' routes refuse it.
        let answer = review_offline(Kind::NodePool, &body).unwrap();
        assert!(!answer.allowed && answer.message.as_deref().unwrap().contains("wrong path"), "{answer:?}");
        assert!(Kind::CleverOrganization.cluster_scoped());
        assert!(Kind::ALL.iter().filter(|k| k.cluster_scoped()).eq([&Kind::CleverOrganization]));
    }

    fn capacity_buffer(spec: Value) -> Value {
        json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CapacityBuffer",
            "metadata": {"name": "web-burst", "namespace": "team-a"},
            "spec": spec
        })
    }

    #[test]
    fn capacity_buffers_are_validated_on_their_route() {
        let good = capacity_buffer(
            json!({"clusterName": "prod-paris", "podTemplateRef": {"name": "web-burst"}, "replicas": 3}),
        );
        let Step::Validate(admission) =
            read(Kind::CapacityBuffer, &review_of("CapacityBuffer", "CREATE", good.clone(), None)).unwrap()
        else {
            panic!("expected a validation");
        };
        assert_eq!(admission.namespace, "team-a");
        assert_eq!(admission.needs(), Needs::default(), "the PodTemplate is not read");
        let answer = admission.validate(&Resolved::unchecked("offline"));
        assert!(answer.allowed && answer.warnings.is_empty(), "{answer:?}");
        let v = response(&answer);
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("status").is_none(), "{v}");

        // Denied with each field and its fix, on create and on update.
        let bad = capacity_buffer(json!({
            "clusterName": "prod-paris", "clusterSelector": {}, "podTemplateRef": {"name": "Web"},
            "replicas": -1, "provisioningStrategy": "buffer.x-k8s.io/resource-only"
        }));
        for body in [
            review_of("CapacityBuffer", "CREATE", bad.clone(), None),
            review_of("CapacityBuffer", "UPDATE", bad, Some(good.clone())),
        ] {
            let answer = review_offline(Kind::CapacityBuffer, &body).unwrap();
            assert!(!answer.allowed, "{answer:?}");
            let v = response(&answer);
            assert_eq!(v["response"]["status"]["code"], 403);
            let message = v["response"]["status"]["message"].as_str().unwrap();
            assert!(message.starts_with("spec: clusterName and clusterSelector are both set"), "{message}");
            assert!(message.contains("; spec.replicas: -1 is out of range: give 0 to 10000"), "{message}");
            assert!(
                message.contains("; spec.provisioningStrategy: \"buffer.x-k8s.io/resource-only\" is not supported"),
                "{message}"
            );
            assert!(message.contains("; spec.podTemplateRef.name: \"Web\" is not a valid name"), "{message}");
        }

        // Allowed with warnings: no room kept, limits that may bound nothing.
        let odd = capacity_buffer(json!({
            "clusterSelector": {"matchLabels": {"env": "prod"}}, "podTemplateRef": {"name": "web-burst"},
            "replicas": 0, "limits": {"nvidia.com/gpu": "1"}
        }));
        let answer = review_offline(Kind::CapacityBuffer, &review_of("CapacityBuffer", "CREATE", odd, None)).unwrap();
        assert!(answer.allowed, "{answer:?}");
        assert!(answer.warnings[0].starts_with("spec.replicas: 0 keeps room for no pod"), "{answer:?}");
        assert!(answer.warnings[1].starts_with("spec.limits: names none of cpu, memory and pods"), "{answer:?}");

        // An object that is not a CapacityBuffer (no podTemplateRef), and misrouted reviews.
        let unreadable = capacity_buffer(json!({"clusterName": "prod-paris", "replicas": 1}));
        let answer =
            review_offline(Kind::CapacityBuffer, &review_of("CapacityBuffer", "CREATE", unreadable, None)).unwrap();
        assert!(!answer.allowed, "{answer:?}");
        assert!(answer.message.as_deref().unwrap().contains("cannot be read as a CapacityBuffer"), "{answer:?}");
        let body = review_of("CapacityBuffer", "CREATE", good, None);
        let answer = review_offline(Kind::NodePool, &body).unwrap();
        assert!(!answer.allowed && answer.message.as_deref().unwrap().contains("wrong path"), "{answer:?}");
        let body = review_of("NodePool", "CREATE", json!({}), None);
        let answer = review_offline(Kind::CapacityBuffer, &body).unwrap();
        let message = answer.message.as_deref().unwrap();
        assert!(message.contains("/validate/capacitybuffers validates CapacityBuffer.karpenter.clever-cloud.com only"));
        assert!(!Kind::CapacityBuffer.cluster_scoped());
    }

    fn node_overlay(spec: Value) -> Value {
        json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": "cheaper-xs", "namespace": "team-a"},
            "spec": spec
        })
    }

    #[test]
    fn node_overlays_are_validated_on_their_route() {
        let good = node_overlay(json!({
            "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS"]}],
            "priceAdjustment": "-10%", "weight": 10
        }));
        let Step::Validate(admission) =
            read(Kind::NodeOverlay, &review_of("NodeOverlay", "CREATE", good.clone(), None)).unwrap()
        else {
            panic!("expected a validation");
        };
        assert_eq!(admission.namespace, "team-a");
        assert_eq!(admission.needs(), Needs::default(), "an overlay refers to nothing");
        let answer = admission.validate(&Resolved::unchecked("offline"));
        assert!(answer.allowed && answer.warnings.is_empty(), "{answer:?}");
        let v = response(&answer);
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("status").is_none(), "{v}");

        // Denied with each field and its fix, on create and on update.
        let bad = node_overlay(json!({
            "requirements": [
                {"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS"]},
                {"key": "kubernetes.io/hostname", "operator": "Exists"},
                {"key": "team", "operator": "In", "values": []}
            ],
            "price": "0.05", "priceAdjustment": "-101%", "weight": 0
        }));
        for body in [
            review_of("NodeOverlay", "CREATE", bad.clone(), None),
            review_of("NodeOverlay", "UPDATE", bad, Some(good.clone())),
        ] {
            let answer = review_offline(Kind::NodeOverlay, &body).unwrap();
            assert!(!answer.allowed, "{answer:?}");
            let v = response(&answer);
            assert_eq!(v["response"]["status"]["code"], 403);
            let message = v["response"]["status"]["message"].as_str().unwrap();
            assert!(message.starts_with("spec: price and priceAdjustment are both set"), "{message}");
            assert!(message.contains("; spec.priceAdjustment: \"-101%\" is not a price adjustment"), "{message}");
            assert!(message.contains("; spec.requirements[1].key: kubernetes.io/hostname is restricted"), "{message}");
            assert!(
                message.contains("; spec.requirements[2].values: operator In needs at least one value"),
                "{message}"
            );
            assert!(message.contains("; spec.weight: 0 is out of range: give 1 to 10000"), "{message}");
        }

        // Allowed with warnings: free offerings, every flavor of the namespace.
        let odd = node_overlay(json!({"requirements": [], "priceAdjustment": "-100%"}));
        let answer = review_offline(Kind::NodeOverlay, &review_of("NodeOverlay", "CREATE", odd, None)).unwrap();
        assert!(answer.allowed, "{answer:?}");
        assert!(answer.warnings[0].starts_with("spec.priceAdjustment: \"-100%\" makes the selected offerings free"));
        assert!(answer.warnings[1].starts_with("spec.requirements: is empty: the overlay selects every flavor"));
        let zero = node_overlay(json!({"requirements": [{"key": "team", "operator": "Exists"}], "price": "0"}));
        let answer = review_offline(Kind::NodeOverlay, &review_of("NodeOverlay", "CREATE", zero, None)).unwrap();
        assert!(answer.allowed, "{answer:?}");
        assert!(answer.warnings[0].starts_with("spec.price: \"0\" makes the selected offerings free"), "{answer:?}");

        // An object that is not a NodeOverlay (an unknown operator), and misrouted reviews.
        let unreadable = node_overlay(json!({"requirements": [{"key": "team", "operator": "Like"}], "price": "1"}));
        let answer = review_offline(Kind::NodeOverlay, &review_of("NodeOverlay", "CREATE", unreadable, None)).unwrap();
        assert!(!answer.allowed, "{answer:?}");
        assert!(answer.message.as_deref().unwrap().contains("cannot be read as a NodeOverlay"), "{answer:?}");
        let body = review_of("NodeOverlay", "CREATE", good, None);
        let answer = review_offline(Kind::NodePool, &body).unwrap();
        assert!(!answer.allowed && answer.message.as_deref().unwrap().contains("wrong path"), "{answer:?}");
        let body = review_of("NodePool", "CREATE", json!({}), None);
        let answer = review_offline(Kind::NodeOverlay, &body).unwrap();
        let message = answer.message.as_deref().unwrap();
        assert!(message.contains("/validate/nodeoverlays validates NodeOverlay.karpenter.clever-cloud.com only"));
        assert!(!Kind::NodeOverlay.cluster_scoped());
    }

    #[test]
    fn each_route_names_its_crds_kind_and_resource() {
        use kube::Resource;
        let crds = [
            (CleverNodeClass::kind(&()), CleverNodeClass::plural(&())),
            (FlavorCatalog::kind(&()), FlavorCatalog::plural(&())),
            (NodePool::kind(&()), NodePool::plural(&())),
            (CleverOrganization::kind(&()), CleverOrganization::plural(&())),
            (CapacityBuffer::kind(&()), CapacityBuffer::plural(&())),
            (NodeOverlay::kind(&()), NodeOverlay::plural(&())),
        ];
        assert_eq!(crds.len(), Kind::ALL.len());
        for (kind, (name, plural)) in Kind::ALL.into_iter().zip(crds) {
            assert_eq!((kind.name(), kind.plural()), (name.as_ref(), plural.as_ref()));
            assert_eq!(kind.path(), format!("/validate/{plural}"));
        }
    }

    #[test]
    fn needs_follow_the_references() {
        let mut object = class(json!({}));
        object["spec"]["flavorCatalogRef"] = json!({"name": "negotiated"});
        let Step::Validate(admission) =
            read(Kind::CleverNodeClass, &review_of("CleverNodeClass", "CREATE", object, None)).unwrap()
        else {
            panic!("expected a validation");
        };
        assert_eq!(admission.needs(), Needs { node_class: None, flavor_catalog: Some("negotiated".into()) });
        assert_eq!(admission.namespace, "team-a");
    }
}
