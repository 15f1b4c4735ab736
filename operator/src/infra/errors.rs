//! What failed in a controller, said twice: in words for a person (the step a request was for, then
//! the API's answer) and as labels for a machine (the step's and the failure's [`Category`], in the
//! log fields `step` and `category` and in `karpenter_hub_reconcile_errors_total`). Modelled on
//! stackable operator-rs's `ReconcilerError::category`.
//!
//! A failed request gets its step where it is sent, with [`StepExt::step`]
//! (`api.patch(…).await.step(Step::WriteClaimStatus)?`) or, in a `match` that tolerates some codes,
//! [`Step::failed`]. A context wrapper rather than one error variant per write: the call site stays
//! one line, every controller's error enum holds one `Api(ApiError)` variant instead of thirty, and
//! one list of steps is the metric's label set, so a new write cannot go unnamed (no controller
//! error converts from a bare `kube::Error`).
//!
//! Owns: the steps, the categories, [`ApiError`] and the error counter's increment. Must not: put a
//! workload server's words anywhere but a log line (`Display` goes through [`plain`], for logs and
//! the management API; a condition or an event says [`ApiError::in_own_words`]), or decide a retry
//! (each controller keys its own on the category).

use std::fmt;

use crate::infra::{
    apierror::{in_own_words, plain},
    fence,
    hub::Hub,
    metrics::{Metrics, ReconcileErrorLabels},
    registry::ClusterKey,
};

macro_rules! steps {
    ($($(#[$doc:meta])* $variant:ident => $label:literal, $words:literal;)*) => {
        /// The step of a controller that failed: what it was doing, not how it failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Step {
            $($(#[$doc])* $variant),*
        }

        impl Step {
            /// Every step, in declaration order (the metric's whole `step` label set).
            pub const ALL: &'static [Step] = &[$(Step::$variant),*];

            /// The `step` label and log field: snake_case, stable.
            pub fn label(self) -> &'static str {
                match self {
                    $(Step::$variant => $label),*
                }
            }

            /// The step in words, as an error message starts.
            pub fn words(self) -> &'static str {
                match self {
                    $(Step::$variant => $words),*
                }
            }
        }
    };
}

steps! {
    // The management cluster: NodeClaims.
    AddClaimFinalizer => "add_claim_finalizer", "adding the termination finalizer to the NodeClaim";
    RemoveClaimFinalizer => "remove_claim_finalizer", "removing the termination finalizer from the NodeClaim";
    WriteClaimStatus => "write_claim_status", "writing the NodeClaim's status";
    PatchClaimLabels => "patch_claim_labels", "patching the NodeClaim's labels";
    StampTerminationTimestamp => "stamp_termination_timestamp", "stamping the NodeClaim's termination timestamp";
    RestampPoolHash => "restamp_pool_hash", "re-stamping the NodeClaim's NodePool hash";
    RemoveDisruptionRecord => "remove_disruption_record", "removing the disruption command from the NodeClaim";
    ReadClaim => "read_claim", "reading the NodeClaim live";
    CreateClaim => "create_claim", "creating a NodeClaim";
    DeleteClaim => "delete_claim", "deleting the NodeClaim";
    // The management cluster: the other kinds.
    ReadNodeClass => "read_nodeclass", "reading the CleverNodeClass live";
    WriteNodeClassStatus => "write_nodeclass_status", "writing the CleverNodeClass's status";
    WriteNodePoolStatus => "write_nodepool_status", "writing the NodePool's status";
    WriteFlavorCatalogStatus => "write_flavorcatalog_status", "writing the FlavorCatalog's status";
    WriteCapacityBufferStatus => "write_capacitybuffer_status", "writing the CapacityBuffer's status";
    WriteNodeOverlayStatus => "write_nodeoverlay_status", "writing the NodeOverlay's status";
    ReadCapacity => "read_capacity", "reading the cluster's capacity memory (its ConfigMap)";
    WriteCapacity => "write_capacity", "saving the cluster's capacity memory (its ConfigMap)";
    ReadRegistrationSecret => "read_registration_secret", "reading the cluster's registration Secret";
    WriteWorkloadCluster => "write_workloadcluster", "creating the cluster's WorkloadCluster report";
    WriteWorkloadClusterStatus => "write_workloadcluster_status", "writing the cluster's WorkloadCluster report";
    ReadOrganization => "read_organization", "reading the CleverOrganizations live";
    WriteOrganizationStatus => "write_organization_status", "writing the CleverOrganization's ledger (its status)";
    // A workload cluster.
    ReadNodeGroup => "read_nodegroup", "reading the NodeGroup live";
    CreateNodeGroup => "create_nodegroup", "creating the NodeGroup";
    RestampNodeGroup => "restamp_nodegroup", "re-stamping the moved NodeGroup as this management cluster's";
    DeleteNodeGroup => "delete_nodegroup", "deleting the NodeGroup";
    /// CKE answered the NodeGroup with a failure.
    NodeGroupVerdict => "nodegroup_verdict", "awaiting CKE's verdict on the NodeGroup";
    StampProviderId => "stamp_provider_id", "stamping the Node's providerID";
    RegisterNode => "register_node", "registering the Node";
    LabelNodeInitialized => "label_node_initialized", "labelling the Node initialized";
    CordonNode => "cordon_node", "cordoning the Node (disrupted taint, load-balancer exclusion)";
    TaintNode => "taint_node", "tainting the Node karpenter.sh/disrupted";
    UntaintNode => "untaint_node", "removing the karpenter.sh/disrupted taint from the Node";
    ReleaseNodeFinalizers => "release_node_finalizers", "releasing the termination finalizer of the NodeGroup's Nodes";
    ListVolumeAttachments => "list_volume_attachments", "listing the Node's VolumeAttachments";
    // Manifests (sandbox, `register`).
    ReadNamespace => "read_namespace", "reading the namespace";
    CreateNamespace => "create_namespace", "creating the namespace";
    CreateObject => "create_object", "creating the object";
    MergeObject => "merge_object", "merging the manifest onto the existing object";
    // No request: the hub's own work on what it read.
    IdentifyClaim => "identify_claim", "reading the NodeClaim's namespace and name";
    BuildRegistrationPatch => "build_registration_patch", "building the Node registration patch";
    BuildSchedulingInput => "build_scheduling_input", "building the scheduling input from the cluster's objects";
    BuildNodeClaim => "build_nodeclaim", "building a NodeClaim from its NodePool";
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.words())
    }
}

impl Step {
    /// `source`, failed at this step.
    pub fn failed(self, source: kube::Error) -> ApiError {
        ApiError { step: self, category: Category::of(&source), source }
    }
}

/// What kind of failure it was: the `category` label and log field. A small closed set, so an
/// alert can tell a conflict (retried at once, harmless) from a refusal someone must fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// 409: optimistic concurrency (someone wrote the object meanwhile); retried soon.
    KubernetesConflict,
    /// 404: the object (or its API) is not there.
    KubernetesNotFound,
    /// 401: the credentials were refused (a kubeconfig Secret's token expired or was rotated).
    KubernetesUnauthorized,
    /// 403: RBAC or an admission policy refused the request.
    KubernetesForbidden,
    /// 400 or 422: the request was refused as invalid (a failed JSON patch test, a validation).
    KubernetesInvalid,
    /// 429: the server (or a PodDisruptionBudget) asked to come back later.
    KubernetesThrottled,
    /// Any other answer of the API (5xx, 410, an answer that does not decode).
    KubernetesApi,
    /// No answer: the connection, DNS, TLS, a timeout, credentials that could not be loaded.
    KubernetesTransport,
    /// The request was refused by this replica's own fence: it no longer owns the cluster.
    Fenced,
    /// What the hub read cannot be used (an object without a name, a spec the scheduler refuses).
    InvalidInput,
    /// CKE answered a NodeGroup with a failure.
    CloudProvider,
    /// A bug of the hub (a request or patch it could not build).
    Internal,
}

impl Category {
    /// Every category (the metric's whole `category` label set).
    pub const ALL: &'static [Category] = &[
        Category::KubernetesConflict,
        Category::KubernetesNotFound,
        Category::KubernetesUnauthorized,
        Category::KubernetesForbidden,
        Category::KubernetesInvalid,
        Category::KubernetesThrottled,
        Category::KubernetesApi,
        Category::KubernetesTransport,
        Category::Fenced,
        Category::InvalidInput,
        Category::CloudProvider,
        Category::Internal,
    ];

    /// The category of a failed request, from its HTTP status or the kind of error.
    pub fn of(e: &kube::Error) -> Category {
        match e {
            kube::Error::Api(s) => match s.code {
                409 => Category::KubernetesConflict,
                404 => Category::KubernetesNotFound,
                401 => Category::KubernetesUnauthorized,
                403 => Category::KubernetesForbidden,
                400 | 422 => Category::KubernetesInvalid,
                429 => Category::KubernetesThrottled,
                _ => Category::KubernetesApi,
            },
            // An answer came, but not one kube could read.
            kube::Error::SerdeError(_)
            | kube::Error::FromUtf8(_)
            | kube::Error::LinesCodecMaxLineLengthExceeded
            | kube::Error::Discovery(_) => Category::KubernetesApi,
            kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => Category::Internal,
            // The fence refuses as the transport would (a service error): told apart first.
            e if fence::is_fenced(e) => Category::Fenced,
            _ => Category::KubernetesTransport,
        }
    }

    /// The `category` label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::KubernetesConflict => "kubernetes_conflict",
            Category::KubernetesNotFound => "kubernetes_not_found",
            Category::KubernetesUnauthorized => "kubernetes_unauthorized",
            Category::KubernetesForbidden => "kubernetes_forbidden",
            Category::KubernetesInvalid => "kubernetes_invalid",
            Category::KubernetesThrottled => "kubernetes_throttled",
            Category::KubernetesApi => "kubernetes_api",
            Category::KubernetesTransport => "kubernetes_transport",
            Category::Fenced => "fenced",
            Category::InvalidInput => "invalid_input",
            Category::CloudProvider => "cloud_provider",
            Category::Internal => "internal",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that failed, with the step it was for. Its text is for logs (the API's message
/// through [`plain`]); a condition or an event uses [`ApiError::in_own_words`].
#[derive(Debug, thiserror::Error)]
#[error("{step}: {}", plain(.source))]
pub struct ApiError {
    pub step: Step,
    pub category: Category,
    pub source: kube::Error,
}

impl ApiError {
    /// A failure CKE reported on a NodeGroup, told as a transport error `source` whose text is the
    /// log's only (CKE's message is the workload cluster's words).
    pub fn cloud_provider(step: Step, source: kube::Error) -> ApiError {
        ApiError { step, category: Category::CloudProvider, source }
    }

    /// The step and the HTTP status, nothing the server (or CKE) wrote: for a condition or an event.
    pub fn in_own_words(&self) -> String {
        if self.category == Category::CloudProvider {
            return format!("{}: CKE reported a failure (the hub's log has its message)", self.step);
        }
        format!("{}: {}", self.step, in_own_words(&self.source))
    }
}

/// Name the step of a request's failure (see the module's header).
pub trait StepExt<T> {
    fn step(self, step: Step) -> Result<T, ApiError>;
}

impl<T> StepExt<T> for Result<T, kube::Error> {
    fn step(self, step: Step) -> Result<T, ApiError> {
        self.map_err(|source| step.failed(source))
    }
}

/// What a controller's error path reads of an error: its step and category.
pub trait Categorized {
    fn step(&self) -> Step;
    fn category(&self) -> Category;
}

/// What stops a pass of a controller that converts a cluster's facts, builds NodeClaims and writes
/// them (provisioning, disruption, static pools); the next pass retries. A request's failure says
/// its step.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Build(#[from] crate::decisions::new_claims::BuildError),
    #[error("{0}")]
    Convert(#[from] scheduling::convert::ConvertError),
}

impl Categorized for PassError {
    fn step(&self) -> Step {
        match self {
            PassError::Api(e) => e.step,
            PassError::Build(_) => Step::BuildNodeClaim,
            PassError::Convert(_) => Step::BuildSchedulingInput,
        }
    }

    fn category(&self) -> Category {
        match self {
            PassError::Api(e) => e.category,
            PassError::Build(_) | PassError::Convert(_) => Category::InvalidInput,
        }
    }
}

impl Categorized for ApiError {
    fn step(&self) -> Step {
        self.step
    }

    fn category(&self) -> Category {
        self.category
    }
}

/// The controllers whose errors are counted (the `controller` label). Not `Controller`: that is
/// kube-runtime's, which every controller imports too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciler {
    NodeClaim,
    Provisioning,
    Disruption,
    NodePool,
    NodeClass,
    FlavorCatalog,
    ClusterReport,
    Organization,
    CapacityBuffer,
    NodeOverlay,
}

impl Reconciler {
    pub const ALL: &'static [Reconciler] = &[
        Reconciler::NodeClaim,
        Reconciler::Provisioning,
        Reconciler::Disruption,
        Reconciler::NodePool,
        Reconciler::NodeClass,
        Reconciler::FlavorCatalog,
        Reconciler::ClusterReport,
        Reconciler::Organization,
        Reconciler::CapacityBuffer,
        Reconciler::NodeOverlay,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reconciler::NodeClaim => "nodeclaim",
            Reconciler::Provisioning => "provisioning",
            Reconciler::Disruption => "disruption",
            Reconciler::NodePool => "nodepool",
            Reconciler::NodeClass => "nodeclass",
            Reconciler::FlavorCatalog => "flavorcatalog",
            Reconciler::ClusterReport => "cluster_report",
            Reconciler::Organization => "organization",
            Reconciler::CapacityBuffer => "capacitybuffer",
            Reconciler::NodeOverlay => "nodeoverlay",
        }
    }
}

/// Count a failed reconcile (or round, or pass) of `controller` in
/// `karpenter_hub_reconcile_errors_total`. The `cluster` label is the workload cluster's key while
/// this replica serves it, empty otherwise (a node class, a catalogue, a pool of an unregistered
/// cluster): a cluster's series go with it ([`crate::infra::metrics::Metrics::cluster_removed`]),
/// and no name a user writes in a spec makes a series of its own.
pub fn count(hub: &Hub, controller: Reconciler, cluster: Option<&ClusterKey>, e: &impl Categorized) {
    count_in(&hub.metrics, &hub.registry.clusters(), controller, cluster, e);
}

/// [`count`] with the clusters this replica serves given.
fn count_in(
    metrics: &Metrics,
    served: &[ClusterKey],
    controller: Reconciler,
    cluster: Option<&ClusterKey>,
    e: &impl Categorized,
) {
    let cluster = cluster.filter(|k| served.contains(k)).map(ToString::to_string).unwrap_or_default();
    metrics.reconcile_errors.get(&labels(controller, cluster, e)).inc();
}

fn labels(controller: Reconciler, cluster: String, e: &impl Categorized) -> ReconcileErrorLabels {
    ReconcileErrorLabels {
        cluster,
        controller: controller.as_str().to_string(),
        step: e.step().label().to_string(),
        category: e.category().as_str().to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn refused(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("INTERNAL-ADMIN-PANEL says no", reason).with_code(code).boxed())
    }

    #[test]
    fn an_api_refusal_is_categorized_by_its_status_code() {
        let cases = [
            (409, "Conflict", "kubernetes_conflict"),
            (404, "NotFound", "kubernetes_not_found"),
            (401, "Unauthorized", "kubernetes_unauthorized"),
            (403, "Forbidden", "kubernetes_forbidden"),
            (422, "Invalid", "kubernetes_invalid"),
            (400, "BadRequest", "kubernetes_invalid"),
            (429, "TooManyRequests", "kubernetes_throttled"),
            (500, "InternalError", "kubernetes_api"),
            (410, "Expired", "kubernetes_api"),
        ];
        for (code, reason, want) in cases {
            assert_eq!(Category::of(&refused(code, reason)).as_str(), want, "HTTP {code}");
        }
    }

    #[test]
    fn no_answer_is_transport_and_the_fence_is_told_apart() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(Category::of(&kube::Error::Service(Box::new(io))), Category::KubernetesTransport);
        assert_eq!(Category::of(&kube::Error::TlsRequired), Category::KubernetesTransport);
        let fenced = kube::Error::Service(Box::new(fence::Fenced { cluster: "team-a/prod".into() }));
        assert_eq!(Category::of(&fenced), Category::Fenced);
        let undecodable = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(Category::of(&kube::Error::SerdeError(undecodable)), Category::KubernetesApi);
    }

    #[test]
    fn the_message_starts_with_the_step_and_a_condition_gets_no_server_text() {
        let e = Step::CreateNodeGroup.failed(refused(403, "Forbidden"));
        assert_eq!((e.step, e.category), (Step::CreateNodeGroup, Category::KubernetesForbidden));
        assert_eq!(e.to_string(), "creating the NodeGroup: INTERNAL-ADMIN-PANEL says no (403 Forbidden)");
        let shown = e.in_own_words();
        assert!(shown.starts_with("creating the NodeGroup: the API answered HTTP 403"), "{shown}");
        assert!(!shown.contains("ADMIN"), "{shown}");
        let r: Result<(), kube::Error> = Err(refused(409, "Conflict"));
        let e = r.step(Step::WriteClaimStatus).unwrap_err();
        assert!(e.to_string().starts_with("writing the NodeClaim's status: "), "{e}");
        assert_eq!(e.category, Category::KubernetesConflict);
        let cke = ApiError::cloud_provider(Step::NodeGroupVerdict, kube::Error::Service("CKE: boom".into()));
        assert_eq!(cke.category(), Category::CloudProvider);
        assert_eq!(
            cke.in_own_words(),
            "awaiting CKE's verdict on the NodeGroup: CKE reported a failure (the hub's log has its message)"
        );
    }

    #[test]
    fn labels_are_unique_snake_case_and_words_are_lowercase_phrases() {
        let snake = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        let mut seen = std::collections::BTreeSet::new();
        for s in Step::ALL {
            assert!(snake(s.label()), "{s:?}: {}", s.label());
            assert!(seen.insert(s.label()), "{} twice", s.label());
            assert!(s.words().starts_with(|c: char| c.is_ascii_lowercase()), "{s:?}: {}", s.words());
        }
        for c in Category::ALL {
            assert!(snake(c.as_str()) && seen.insert(c.as_str()), "{c:?}");
        }
        for c in Reconciler::ALL {
            assert!(snake(c.as_str()), "{c:?}");
        }
    }

    #[test]
    fn a_counted_error_is_a_series_by_controller_cluster_step_and_category() {
        let m = Metrics::new();
        let (served, gone) = (ClusterKey::new("team-a", "prod"), ClusterKey::new("team-a", "typo"));
        let e = Step::WriteNodePoolStatus.failed(refused(409, "Conflict"));
        for _ in 0..2 {
            count_in(&m, std::slice::from_ref(&served), Reconciler::NodePool, Some(&served), &e);
        }
        // A cluster this replica does not serve (a pool naming an unregistered one): no series of its own.
        count_in(&m, std::slice::from_ref(&served), Reconciler::NodePool, Some(&gone), &e);
        count_in(&m, std::slice::from_ref(&served), Reconciler::NodeClass, None, &e);
        let text = m.render();
        assert!(
            text.contains(
                "karpenter_hub_reconcile_errors_total{cluster=\"team-a/prod\",controller=\"nodepool\",\
                 step=\"write_nodepool_status\",category=\"kubernetes_conflict\"} 2"
            ),
            "{text}"
        );
        assert!(!text.contains("typo"), "{text}");
        assert!(text.contains("karpenter_hub_reconcile_errors_total{cluster=\"\",controller=\"nodeclass\","), "{text}");
        assert!(text.contains("{cluster=\"\",controller=\"nodepool\","), "{text}");
        m.cluster_removed("team-a/prod");
        let text = m.render();
        assert!(!text.contains("team-a/prod"), "a removed cluster's error series go: {text}");
        assert!(text.contains("controller=\"nodeclass\""), "{text}");
    }
}
