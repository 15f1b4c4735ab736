//! `karpenter-hub plan`: the offline dry run. Reads ordinary multi-document manifests (NodePool,
//! CleverNodeClass, FlavorCatalog, CleverOrganization, NodeClaim, Node, Pod, DaemonSet, PodDisruptionBudget,
//! PersistentVolumeClaim, PersistentVolume, StorageClass, CSINode, and the metadata of registration
//! Secrets and Cluster API Clusters for cluster labels; `List`s of them), treats unbound
//! non-DaemonSet pods as pending, runs the same scheduling core as the operator for one cluster
//! (`--cluster`, or the only one the pools serve: [`clusters`]) and prints the decision as a table
//! or as JSON (a stable interface, see `docs/plan.md`).
//!
//! Owns the reading of files into a [`Snapshot`] and the rendering of the decision. Must not hold
//! scheduling logic: that is `scheduling::solve`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use crd_schema::CrdSchema;
use crds::admission::{
    Lookup, NodePoolReferences, Verdict, validate_capacity_buffer, validate_flavor_catalog, validate_node_claim,
    validate_node_class, validate_node_overlay, validate_node_pool, validate_organization,
};
use crds::catalog::round4;
use crds::quantity::{format_bytes, format_count, format_millis_cpu};
use crds::{CapacityBuffer, CleverNodeClass, CleverOrganization, FlavorCatalog, NodeOverlay};
use scheduling::CompactPod;
use scheduling::convert::{ConvertError, PendingRule, Snapshot, Volumes, build_input_with_volumes};

use crate::decisions::{capacity_buffer, static_capacity};
use scheduling::model::{PreferencePolicy, Settings};
use serde::Serialize;
use serde_json::Value;

use crate::infra::registry::ClusterKey;

pub mod clusters;
mod disruption_plan;
#[cfg(test)]
mod hub_agreement;
mod organizations;
pub use disruption_plan::{
    Blocked, DisruptionPlan, MethodResult, PlannedCandidate, PlannedCommand, PoolBudget, Replacement, plan_disruption,
    to_json as disruption_json, to_table as disruption_table,
};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for humans.
    Table,
    /// The stable JSON document.
    Json,
}

/// Arguments of `karpenter-hub plan`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Manifest files (multi-document YAML or JSON); `-` reads standard input. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Workload cluster to plan for (a NodePool's `spec.clusterName`, or a cluster registered in the
    /// manifests that a fleet pool's `spec.clusterSelector` selects); needed when the pools serve several.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// `respect` treats preferred affinities and `ScheduleAnyway` spreads as requirements until
    /// relaxed; `ignore` drops them (the hub-wide preference policy).
    #[arg(long, value_enum, default_value_t = PreferenceArg::Respect)]
    pub preference_policy: PreferenceArg,
    /// `strict` fails a claim whose options would fall below a `minValues`; `best-effort` lowers it.
    #[arg(long, value_enum, default_value_t = MinValuesArg::Strict)]
    pub min_values_policy: MinValuesArg,
    /// Plan disruption instead of provisioning: which NodeClaims the hub would remove or replace
    /// (emptiness, drift, consolidation), why, the replacements, the budgets left and the savings.
    #[arg(long)]
    pub disruption: bool,
    /// The instant to decide at (RFC 3339, e.g. `2026-11-25T12:00:00Z`) with `--disruption`;
    /// default: the wall clock. Fix it to make a snapshot's plan reproducible.
    #[arg(long, value_name = "RFC3339", requires = "disruption")]
    pub now: Option<String>,
}

/// `--preference-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PreferenceArg {
    /// Preferences act as requirements until relaxed.
    Respect,
    /// Preferences are dropped.
    Ignore,
}

pub use super::MinValuesArg;

impl PlanArgs {
    /// The scheduler settings the flags select.
    pub fn settings(&self) -> Settings {
        Settings {
            preference_policy: match self.preference_policy {
                PreferenceArg::Respect => PreferencePolicy::Respect,
                PreferenceArg::Ignore => PreferencePolicy::Ignore,
            },
            min_values_policy: self.min_values_policy.into(),
            ..Settings::default()
        }
    }
}

/// Why a plan cannot be made, naming the document and the field.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A file cannot be read.
    #[error("{file}: {message}")]
    Read {
        /// Path.
        file: String,
        /// What failed.
        message: String,
    },
    /// A document is not valid YAML or not a valid object of its kind.
    #[error("{file}: document {index} ({kind}{name}): {message}")]
    Document {
        /// Path.
        file: String,
        /// 1-based position in the file.
        index: usize,
        /// `kind` of the document.
        kind: String,
        /// ` name`, or empty.
        name: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// An object the scheduler cannot read (a quantity, an operator...).
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// Which cluster to plan for is ambiguous.
    #[error("the NodePools serve several clusters ({0}); choose one with --cluster")]
    AmbiguousCluster(String),
    /// `--cluster` names a cluster no pool of the manifests serves and no NodeClaim is on.
    #[error(
        "--cluster {cluster}: no NodePool in the manifests serves cluster {cluster} and no NodeClaim is on it \
         (the pools serve: {served}); {registration}. Name a served cluster, or give the NodePool that should serve \
         it: spec.clusterName: {cluster}, or a spec.clusterSelector matching its labels in its namespace"
    )]
    ClusterNotServed {
        /// The cluster asked for.
        cluster: String,
        /// The clusters the pools serve, or `none`.
        served: String,
        /// What the manifests say of its registration.
        registration: String,
    },
    /// The cluster planned for is registered in several namespaces: which one the workload
    /// objects belong to, and which namespace's fleet pools serve it, is unknown.
    #[error(
        "cluster {cluster} is registered in several namespaces ({namespaces}) by registration Secrets or Cluster \
         API Clusters; plan one of them: give the Secrets, Clusters and NodePools of one namespace only"
    )]
    ClusterInSeveralNamespaces {
        /// The cluster.
        cluster: String,
        /// Its namespaces, comma-separated.
        namespaces: String,
    },
    /// Objects the API server (CRD schema and CEL rules) or the hub's webhook would refuse: the hub
    /// would never see them, so no plan is made.
    #[error("{}", refusals_message(.0))]
    Refused(Vec<Refusal>),
    /// `--now` is not an RFC 3339 instant.
    #[error("--now {value:?} is not an RFC 3339 instant (e.g. 2026-11-25T12:00:00Z): {message}")]
    Now {
        /// What was given.
        value: String,
        /// What the parser said.
        message: String,
    },
    /// A CRD of the hub does not compile into a validator (a defect of the hub, not of the input).
    #[error("cannot check {kind} objects: its CRD does not compile: {message}")]
    CrdSchema {
        /// Kind of the CRD.
        kind: String,
        /// What the compiler said.
        message: String,
    },
}

/// One refusal: which object, which field, and why, as the API server or the webhook would answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `file: document N (Kind namespace/name)`.
    pub object: String,
    /// Who refuses: `the API server` (schema, CEL) or `the webhook`.
    pub by: &'static str,
    /// Field path, e.g. `spec.weight`.
    pub field: String,
    /// The message, e.g. `0 is out of range: use 1 to 100, or omit it for 0`.
    pub message: String,
}

fn refusals_message(refusals: &[Refusal]) -> String {
    let mut out = format!(
        "{} refusal(s): these objects would not be accepted by the management cluster, so the hub would never \
         see them; fix them and run plan again:",
        refusals.len()
    );
    for r in refusals {
        let _ = write!(out, "\n  {}: {}: {} (refused by {})", r.object, r.field, r.message, r.by);
    }
    out
}

/// One NodeClaim the hub would create.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedClaim {
    /// Pool.
    pub node_pool: String,
    /// The cheapest option: what would be launched.
    pub flavor: String,
    /// Options, cheapest first.
    pub instance_types: Vec<String>,
    /// Price of `flavor`, EUR/h.
    pub price_per_hour: f64,
    /// `namespace/name` of its pods.
    pub pods: Vec<String>,
    /// Σ pod requests + DaemonSet overhead.
    pub requests: Requests,
}

/// Requests in canonical quantities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Requests {
    /// CPU.
    pub cpu: String,
    /// Memory.
    pub memory: String,
    /// Pod slots.
    pub pods: String,
    /// Extended resources (a NodeOverlay's capacity), as counts; absent when none.
    #[serde(flatten)]
    pub extended: BTreeMap<String, String>,
}

/// Pods going onto an existing node (or in-flight claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExistingNode {
    /// Node (or NodeClaim) name.
    pub name: String,
    /// `namespace/name`.
    pub pods: Vec<String>,
}

/// A pod left pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unplaced {
    /// `namespace/name`.
    pub pod: String,
    /// Why.
    pub reason: String,
}

/// The decision, in the stable JSON shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Cluster planned for.
    pub cluster: String,
    /// New claims.
    pub node_claims: Vec<PlannedClaim>,
    /// Existing nodes receiving pods.
    pub existing_nodes: Vec<ExistingNode>,
    /// Pods left pending.
    pub unschedulable: Vec<Unplaced>,
    /// Σ `pricePerHour`.
    pub total_price_per_hour: f64,
    /// Static pools (`spec.replicas`) serving the cluster and what keeps their count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub static_pools: Vec<PlannedStatic>,
    /// CapacityBuffers serving the cluster and where their pods go (they are in the claims' pods,
    /// never among `unschedulable`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capacity_buffers: Vec<PlannedBuffer>,
    /// Documents skipped and objects ignored (not part of the JSON interface).
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// A static pool: its count, its claims, and the claims the hub would make or delete now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedStatic {
    /// Pool.
    pub node_pool: String,
    /// `spec.replicas`.
    pub replicas: i64,
    /// Its claims in the cluster, not being deleted.
    pub claims: usize,
    /// Claims it would make (slots).
    pub create: usize,
    /// Claims it would delete, in order.
    pub delete: Vec<String>,
}

/// A CapacityBuffer: its pods and where the plan puts them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedBuffer {
    /// `namespace/name` (`name` when the manifest gives no namespace).
    pub name: String,
    /// Its pods (`replicas`, capped by what `limits` hold).
    pub replicas: i32,
    /// On existing nodes or claims.
    pub existing: i32,
    /// On the plan's new claims.
    pub new_capacity: i32,
    /// Nowhere.
    pub unplaceable: i32,
}

/// What the manifests hold: the scheduling snapshot, the storage objects and the clusters they
/// register.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// Hub and workload objects (every cluster's pools: [`clusters::target`] keeps one cluster's).
    pub snapshot: Snapshot,
    /// PVCs and StorageClasses, when any were given (pods' volumes are checked only then).
    pub volumes: Volumes,
    /// Registered clusters by namespace and name, with what their Secret and Cluster API `Cluster`
    /// say of their labels (nothing else of those objects is kept).
    pub clusters: BTreeMap<ClusterKey, clusters::Registration>,
    /// Organisations: their quota and cost ceiling limit the planned cluster's new nodes.
    pub organizations: Vec<CleverOrganization>,
    /// CapacityBuffers and the PodTemplates they name: their pods are placed after the pending ones.
    pub buffers: Vec<CapacityBuffer>,
    pub pod_templates: Vec<std::sync::Arc<k8s_openapi::api::core::v1::PodTemplate>>,
    /// NodeOverlays: evaluated over the manifests' pools of their namespace, the accepted ones
    /// change prices.
    pub overlays: Vec<NodeOverlay>,
}

/// Where each object read came from (`file: document N (Kind ns/name)`), per kind, in the order of
/// the snapshot's lists: refusals and warnings name the object by it.
#[derive(Debug, Default)]
struct Origins {
    node_pools: Vec<String>,
    node_classes: Vec<String>,
    flavor_catalogs: Vec<String>,
    node_claims: Vec<String>,
    organizations: Vec<String>,
    buffers: Vec<String>,
    overlays: Vec<String>,
    pods: Vec<String>,
}

/// What `read_snapshot` carries from document to document.
struct Reader {
    snap: Manifests,
    notes: Vec<String>,
    origins: Origins,
    /// The hub's CRD schemas by kind: what the API server checks before the webhook is asked.
    schemas: BTreeMap<String, CrdSchema>,
    refusals: Vec<Refusal>,
}

const API_SERVER: &str = "the API server";
const WEBHOOK: &str = "the webhook";

/// Reads manifests into a snapshot. `sources` are `(name, text)`; notes tell what was skipped.
///
/// The hub's objects are first checked as the management cluster would: the CRD schema and its CEL
/// rules (as kube-apiserver applies them on create), then the webhook's admission rules
/// (`crds::admission`). Any refusal stops here with [`PlanError::Refused`]: a plan built on objects
/// the cluster would refuse answers a question nobody can ask.
pub fn read_snapshot(sources: &[(String, String)]) -> Result<(Manifests, Vec<String>), PlanError> {
    let mut schemas = BTreeMap::new();
    for file in crds::crd::hub_crds() {
        let kind = file.crd.spec.names.kind.clone();
        let schema = CrdSchema::compile(&file.crd, "v1alpha1")
            .map_err(|e| PlanError::CrdSchema { kind: kind.clone(), message: e.join("; ") })?;
        schemas.insert(kind, schema);
    }
    let mut reader = Reader {
        snap: Manifests::default(),
        notes: Vec::new(),
        origins: Origins::default(),
        schemas,
        refusals: Vec::new(),
    };
    for (file, text) in sources {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text)
            .map_err(|e| PlanError::Read { file: file.clone(), message: format!("not valid YAML: {e}") })?;
        for (i, doc) in docs.into_iter().enumerate() {
            add_document(&mut reader, file, i + 1, doc)?;
        }
    }
    admit(&mut reader);
    if !reader.refusals.is_empty() {
        return Err(PlanError::Refused(reader.refusals));
    }
    dedupe_pods(&mut reader);
    Ok((reader.snap, reader.notes))
}

/// The webhook's rules on every hub object that passed the schema, with the references the
/// manifests hold (a reference not given is "not checked", as when the webhook cannot read it).
fn admit(reader: &mut Reader) {
    let snap = &reader.snap.snapshot;
    let ns = |m: &kube::api::ObjectMeta| m.namespace.clone().unwrap_or_else(|| "default".to_string());
    let not_given = || "not in the manifests given to plan".to_string();
    let mut verdicts: Vec<(String, Verdict)> = Vec::new();
    for (catalog, origin) in snap.flavor_catalogs.iter().zip(&reader.origins.flavor_catalogs) {
        verdicts.push((origin.clone(), validate_flavor_catalog(catalog, None)));
    }
    let catalog_of = |class: &CleverNodeClass| -> Lookup<&FlavorCatalog> {
        let Some(r) = &class.spec.flavor_catalog_ref else { return Lookup::Unchecked(not_given()) };
        snap.flavor_catalogs
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(r.name.as_str()) && ns(&c.metadata) == ns(&class.metadata))
            .map_or(Lookup::Unchecked(not_given()), Lookup::Found)
    };
    for (class, origin) in snap.node_classes.iter().zip(&reader.origins.node_classes) {
        verdicts.push((origin.clone(), validate_node_class(class, None, catalog_of(class))));
    }
    for (pool, origin) in snap.node_pools.iter().zip(&reader.origins.node_pools) {
        let class = snap.node_classes.iter().find(|c| {
            c.metadata.name.as_deref() == Some(pool.spec.template.spec.node_class_ref.name.as_str())
                && ns(&c.metadata) == ns(&pool.metadata)
        });
        let references = NodePoolReferences {
            node_class: class.map_or(Lookup::Unchecked(not_given()), Lookup::Found),
            flavor_catalog: class.map_or(Lookup::Unchecked(not_given()), catalog_of),
            base: None,
        };
        verdicts.push((origin.clone(), validate_node_pool(pool, None, references)));
    }
    for (claim, origin) in snap.node_claims.iter().zip(&reader.origins.node_claims) {
        verdicts.push((origin.clone(), validate_node_claim(claim, None)));
    }
    for (org, origin) in reader.snap.organizations.iter().zip(&reader.origins.organizations) {
        verdicts.push((origin.clone(), validate_organization(org, None)));
    }
    for (buffer, origin) in reader.snap.buffers.iter().zip(&reader.origins.buffers) {
        verdicts.push((origin.clone(), validate_capacity_buffer(buffer, None)));
    }
    for (overlay, origin) in reader.snap.overlays.iter().zip(&reader.origins.overlays) {
        verdicts.push((origin.clone(), validate_node_overlay(overlay, None)));
    }
    for (origin, verdict) in verdicts {
        for d in verdict.denials {
            reader.refusals.push(Refusal { object: origin.clone(), by: WEBHOOK, field: d.field, message: d.message });
        }
        for w in verdict.warnings {
            reader.notes.push(format!("{origin}: warning from the webhook: {w}"));
        }
    }
}

/// A pod given twice (same namespace and name) is one pod to the API server: the later document
/// replaces the earlier, as `kubectl apply` would, and the user is told.
fn dedupe_pods(reader: &mut Reader) {
    let pods = std::mem::take(&mut reader.snap.snapshot.pods);
    let origins = std::mem::take(&mut reader.origins.pods);
    let key = |p: &CompactPod| p.key();
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        last.insert(key(p), i);
    }
    for (i, (pod, origin)) in pods.into_iter().zip(origins).enumerate() {
        let k = key(&pod);
        let kept = last.get(&k).copied().unwrap_or(i);
        if kept == i {
            reader.snap.snapshot.pods.push(pod);
            reader.origins.pods.push(origin);
        } else {
            reader.notes.push(format!(
                "warning: Pod {k} is given more than once: {origin} is replaced by a later document, as kubectl \
                 apply would; remove one of them"
            ));
        }
    }
}

fn add_document(reader: &mut Reader, file: &str, index: usize, doc: Value) -> Result<(), PlanError> {
    if doc.is_null() {
        return Ok(());
    }
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).map(|n| format!(" {n}")).unwrap_or_default();
    let namespaced_name = match (doc.pointer("/metadata/namespace").and_then(Value::as_str), name.is_empty()) {
        (Some(ns), false) => format!(" {ns}/{}", name.trim_start()),
        _ => name.clone(),
    };
    let origin = format!("{file}: document {index} ({kind}{namespaced_name})");
    let document_error = |message: String| PlanError::Document {
        file: file.to_string(),
        index,
        kind: kind.clone(),
        name: name.clone(),
        message,
    };
    if !doc.is_object() {
        return Err(document_error("not an object".to_string()));
    }
    fn typed<T: serde::de::DeserializeOwned>(doc: Value) -> Result<T, serde_json::Error> {
        serde_json::from_value(doc)
    }
    let fail = |e: serde_json::Error| document_error(e.to_string());
    let hub = api_version.starts_with("karpenter.clever-cloud.com/");
    if hub && let Some(schema) = reader.schemas.get(&kind) {
        // The API server checks the schema and CEL rules before anything else sees the object; an
        // object it refuses is not read further (its typed form may not even exist).
        if let Err(invalid) = schema.admit_create(&doc) {
            // kube-apiserver adds "some validation rules were not checked" when others failed: true,
            // but it tells a person nothing they can act on.
            let unchecked = |c: &crd_schema::Cause| c.message.contains("some validation rules were not checked");
            let only_unchecked = invalid.causes.iter().all(unchecked);
            for cause in invalid.causes.into_iter().filter(|c| only_unchecked || !unchecked(c)) {
                reader.refusals.push(Refusal {
                    object: origin.clone(),
                    by: API_SERVER,
                    field: cause.field,
                    message: cause.message,
                });
            }
            return Ok(());
        }
    }
    let snap = &mut reader.snap;
    match (kind.as_str(), hub) {
        ("List", _) => {
            let items = doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            for item in items {
                add_document(reader, file, index, item)?;
            }
        }
        ("NodePool", true) => {
            snap.snapshot.node_pools.push(typed(doc).map_err(fail)?);
            reader.origins.node_pools.push(origin);
        }
        ("CleverNodeClass", true) => {
            snap.snapshot.node_classes.push(typed(doc).map_err(fail)?);
            reader.origins.node_classes.push(origin);
        }
        ("FlavorCatalog", true) => {
            snap.snapshot.flavor_catalogs.push(typed(doc).map_err(fail)?);
            reader.origins.flavor_catalogs.push(origin);
        }
        ("NodeClaim", true) => {
            snap.snapshot.node_claims.push(typed(doc).map_err(fail)?);
            reader.origins.node_claims.push(origin);
        }
        ("CleverOrganization", true) => {
            snap.organizations.push(typed(doc).map_err(fail)?);
            reader.origins.organizations.push(origin);
        }
        ("CapacityBuffer", true) => {
            snap.buffers.push(typed(doc).map_err(fail)?);
            reader.origins.buffers.push(origin);
        }
        ("NodeOverlay", true) => {
            snap.overlays.push(typed(doc).map_err(fail)?);
            reader.origins.overlays.push(origin);
        }
        ("PodTemplate", false) if api_version == "v1" => {
            snap.pod_templates.push(std::sync::Arc::new(typed(doc).map_err(fail)?));
        }
        ("Node", false) => snap.snapshot.nodes.push(std::sync::Arc::new(typed(doc).map_err(fail)?)),
        ("Pod", false) => {
            snap.snapshot.pods.push(std::sync::Arc::new(typed(doc).map_err(fail)?));
            reader.origins.pods.push(origin);
        }
        ("DaemonSet", false) => snap.snapshot.daemonsets.push(std::sync::Arc::new(typed(doc).map_err(fail)?)),
        ("PodDisruptionBudget", false) => snap.snapshot.pdbs.push(std::sync::Arc::new(typed(doc).map_err(fail)?)),
        ("PersistentVolumeClaim", false) => {
            snap.volumes.pvcs.get_or_insert_with(Vec::new).push(std::sync::Arc::new(typed(doc).map_err(fail)?))
        }
        ("CSINode", false) => {
            snap.volumes.csinodes.get_or_insert_with(Vec::new).push(std::sync::Arc::new(typed(doc).map_err(fail)?))
        }
        ("PersistentVolume", false) => {
            snap.volumes.pvs.get_or_insert_with(Vec::new).push(std::sync::Arc::new(typed(doc).map_err(fail)?))
        }
        ("StorageClass", false) => {
            snap.volumes
                .storage_classes
                .get_or_insert_with(Vec::new)
                .push(std::sync::Arc::new(typed(doc).map_err(fail)?));
        }
        ("Secret", false) if api_version == "v1" => {
            // Only the metadata goes further: the data is a kubeconfig, credentials included.
            let found = clusters::read(clusters::Source::Secret, doc.get("metadata"));
            drop(doc);
            let skipped = format!("{file}: document {index} ({api_version} {kind}{name})");
            register(reader, found, clusters::Source::Secret, &origin, &skipped)
                .map_err(|e| document_error(e.to_string()))?;
        }
        ("Cluster", false) if clusters::is_cluster_api(&api_version) => {
            let found = clusters::read(clusters::Source::Cluster, doc.get("metadata"));
            let skipped = format!("{file}: document {index} ({api_version} {kind}{name})");
            register(reader, found, clusters::Source::Cluster, &origin, &skipped)
                .map_err(|e| document_error(e.to_string()))?;
        }
        _ => reader
            .notes
            .push(format!("{file}: document {index} ({api_version} {kind}{name}) skipped: not read by plan")),
    }
    Ok(())
}

/// Records what a registration Secret or a Cluster API `Cluster` says of a cluster's labels (a
/// later document of the same object replaces an earlier one, as `kubectl apply` would), or notes
/// why it is skipped. `Err` names the field of a document error.
fn register(
    reader: &mut Reader,
    found: Result<clusters::Found, clusters::MetadataError>,
    source: clusters::Source,
    origin: &str,
    skipped: &str,
) -> Result<(), clusters::MetadataError> {
    let (key, labels) = match found? {
        clusters::Found::Cluster(key, labels) => (key, labels),
        clusters::Found::Skipped(why) => {
            reader.notes.push(format!("{skipped} skipped: {why}"));
            return Ok(());
        }
    };
    let registration = reader.snap.clusters.entry(key.clone()).or_default();
    let (slot, what) = match source {
        clusters::Source::Secret => (&mut registration.secret, "registration Secret"),
        clusters::Source::Cluster => (&mut registration.cluster, "Cluster API Cluster"),
    };
    if slot.replace(labels).is_some() {
        reader.notes.push(format!(
            "warning: the {what} of cluster {key} is given more than once: {origin} replaces the earlier document, as \
             kubectl apply would; remove one of them"
        ));
    }
    Ok(())
}

/// Plans for one cluster.
pub fn plan(manifests: &Manifests, cluster: Option<&str>, notes: Vec<String>) -> Result<Plan, PlanError> {
    plan_with(manifests, cluster, Settings::default(), notes)
}

/// [`plan`] with explicit scheduler settings.
pub fn plan_with(
    manifests: &Manifests,
    cluster: Option<&str>,
    settings: Settings,
    mut notes: Vec<String>,
) -> Result<Plan, PlanError> {
    let mut target = clusters::target(manifests, cluster)?;
    notes.append(&mut target.notes);
    let cluster = target.cluster;
    let buffers = buffer_pods(manifests, &mut target.snapshot, &target.key, &cluster, &mut notes);
    target.snapshot.node_overlays = accepted_overlays(manifests, &mut notes);
    let converted =
        build_input_with_volumes(&target.snapshot, &manifests.volumes, &cluster, PendingRule::Unbound, settings)?;
    notes.extend(converted.notes);
    let converted_static = converted.static_pools;
    let mut input = converted.input;
    let rooms = organization_rooms(manifests, &target.key, &target.snapshot, &cluster, &mut notes);
    crate::decisions::organization::limit_input(&mut input, &rooms);
    let decision = scheduling::solve(&input);
    let key = |i: &usize| input.pods[*i].key();
    let node_claims: Vec<PlannedClaim> = decision
        .new_claims
        .iter()
        .map(|c| PlannedClaim {
            node_pool: c.nodepool.clone(),
            flavor: c.instance_types.first().map(|o| o.name.clone()).unwrap_or_default(),
            instance_types: c.instance_types.iter().map(|o| o.name.clone()).collect(),
            price_per_hour: round4(c.price),
            pods: c.pods.iter().map(key).collect(),
            requests: Requests {
                cpu: format_millis_cpu(c.requests.cpu_millis),
                memory: person_bytes(c.requests.memory_bytes),
                pods: format_count(c.requests.pods),
                extended: c.extended.iter().map(|(k, v)| (k.clone(), format_count(*v))).collect(),
            },
        })
        .collect();
    let total = round4(node_claims.iter().fold(0.0, |acc, c| acc + c.price_per_hour));
    let static_pools = converted_static
        .iter()
        .filter_map(|sp| {
            let pool = target.snapshot.node_pools.iter().find(|p| p.metadata.name.as_deref() == Some(&sp.pool.name))?;
            let claims = target.snapshot.node_claims.iter().filter(|c| c.spec.cluster_name == cluster);
            let facts = static_capacity::facts_of(pool, sp.replicas, claims, &target.snapshot);
            let decided = static_capacity::decide(&facts);
            Some(PlannedStatic {
                node_pool: sp.pool.name.clone(),
                replicas: sp.replicas,
                claims: facts.members.iter().filter(|m| !m.deleting).count(),
                create: decided.create.len(),
                delete: decided.delete,
            })
        })
        .collect();
    Ok(Plan {
        cluster,
        existing_nodes: decision
            .existing
            .iter()
            .map(|a| ExistingNode { name: input.nodes[a.node].name.clone(), pods: a.pods.iter().map(key).collect() })
            .collect(),
        unschedulable: decision
            .unschedulable
            .iter()
            .filter(|u| input.pods[u.pod].buffer.is_none())
            .map(|u| Unplaced { pod: key(&u.pod), reason: u.reason.clone() })
            .collect(),
        capacity_buffers: {
            let placed = capacity_buffer::placements(&input, &decision);
            buffers
                .into_iter()
                .map(|(name, replicas)| {
                    let p = placed.get(&name).copied().unwrap_or_default();
                    PlannedBuffer {
                        name: name.trim_start_matches('/').to_string(),
                        replicas,
                        existing: p.existing,
                        new_capacity: p.new_capacity,
                        unplaceable: p.unplaceable,
                    }
                })
                .collect()
        },
        node_claims,
        total_price_per_hour: total,
        static_pools,
        notes,
    })
}

/// The manifests' NodeOverlays the hub would apply: each namespace's evaluated over that
/// namespace's NodePools (their node classes' flavors), as the hub's status controller does; a note
/// for each refused one.
fn accepted_overlays(manifests: &Manifests, notes: &mut Vec<String>) -> Vec<NodeOverlay> {
    if manifests.overlays.is_empty() {
        return Vec::new();
    }
    let snap = &manifests.snapshot;
    let mut namespaces: Vec<Option<&str>> =
        manifests.overlays.iter().map(|o| o.metadata.namespace.as_deref()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let mut out = Vec::new();
    for ns in namespaces {
        let overlays: Vec<NodeOverlay> =
            manifests.overlays.iter().filter(|o| o.metadata.namespace.as_deref() == ns).cloned().collect();
        let pools: Vec<&crds::NodePool> = snap
            .node_pools
            .iter()
            .filter(|p| ns.is_none() || p.metadata.namespace.is_none() || p.metadata.namespace.as_deref() == ns)
            .collect();
        let types: Vec<Vec<crds::catalog::InstanceType>> =
            pools.iter().map(|p| scheduling::convert::pool_instance_types(snap, p)).collect();
        let views: Vec<crds::overlay::PoolTypes<'_>> =
            pools.iter().zip(&types).map(|(p, t)| crds::overlay::PoolTypes::of(p, t)).collect();
        let verdict = crds::overlay::evaluate(&overlays, &views);
        for (name, (reason, message)) in &verdict.refused {
            notes.push(format!("NodeOverlay {name}: not applied ({reason}): {message}"));
        }
        out.extend(verdict.kept(overlays));
    }
    out
}

/// The pods of the manifests' CapacityBuffers serving `cluster` (of the namespace of its `key`
/// when both say one) put into `snapshot`; returns each buffer (`namespace/name`) with its pod count.
/// A buffer whose template does not resolve has none, and a note says why.
fn buffer_pods(
    manifests: &Manifests,
    snapshot: &mut Snapshot,
    key: &Option<ClusterKey>,
    cluster: &str,
    notes: &mut Vec<String>,
) -> Vec<(String, i32)> {
    let labels = snapshot.cluster_labels.get(cluster).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for b in &manifests.buffers {
        let ns = b.metadata.namespace.as_deref();
        if !b.selects(cluster, &labels) || key.as_ref().zip(ns).is_some_and(|(k, ns)| k.namespace != ns) {
            continue;
        }
        match capacity_buffer::resolve(b, &manifests.pod_templates) {
            // Its key (`namespace/name`) is the one its pods carry: what placements are counted by.
            capacity_buffer::Resolution::Ready(r) => {
                out.push((r.buffer, r.replicas));
                snapshot.buffer_pods.extend(r.pods);
            }
            capacity_buffer::Resolution::NotReady { reason, message } => {
                let name = b.metadata.name.as_deref().unwrap_or_default();
                let name = ns.map_or(name.to_string(), |ns| format!("{ns}/{name}"));
                notes.push(format!("CapacityBuffer {name}: no pods ({reason}): {message}"));
            }
        }
    }
    out
}

/// The room the manifests' organisations leave the planned cluster ([`organizations::rooms`]).
fn organization_rooms(
    manifests: &Manifests,
    key: &Option<ClusterKey>,
    snapshot: &Snapshot,
    cluster: &str,
    notes: &mut Vec<String>,
) -> Vec<(String, crate::decisions::organization::Ceiling)> {
    let Some(key) = key else { return Vec::new() };
    let labels = snapshot.cluster_labels.get(cluster).cloned().unwrap_or_default();
    organizations::rooms(&manifests.organizations, key, &labels, snapshot, notes)
}

/// The `--now` flag, or the wall clock.
pub fn now_of(args: &PlanArgs) -> Result<jiff::Timestamp, PlanError> {
    match &args.now {
        None => Ok(jiff::Timestamp::now()),
        Some(v) => v.parse().map_err(|e: jiff::Error| PlanError::Now { value: v.clone(), message: e.to_string() }),
    }
}

/// Bytes as a person writes them: `1Gi` or `1G`, whichever is exact and shorter (binary first), so
/// that a pod asking `1G` does not come back as `1000000000`.
pub fn person_bytes(bytes: i64) -> String {
    let binary = format_bytes(bytes);
    let decimal = format_count(bytes);
    if decimal.len() < binary.len() { decimal } else { binary }
}

/// The JSON document (pretty, with a trailing newline).
pub fn to_json(plan: &Plan) -> String {
    let mut s = serde_json::to_string_pretty(plan).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// The table for humans.
pub fn to_table(plan: &Plan) -> String {
    let mut out = String::new();
    let cluster = if plan.cluster.is_empty() { "(no NodePool)" } else { plan.cluster.as_str() };
    let _ = writeln!(
        out,
        "Cluster {cluster}: {} new NodeClaim(s), {:.4} EUR/h; {} pod(s) on existing nodes; {} unschedulable",
        plan.node_claims.len(),
        plan.total_price_per_hour,
        plan.existing_nodes.iter().map(|n| n.pods.len()).sum::<usize>(),
        plan.unschedulable.len()
    );
    if !plan.node_claims.is_empty() {
        // Extended resources (a NodeOverlay's capacity) get a column when a claim asks for any.
        let extended = plan.node_claims.iter().any(|c| !c.requests.extended.is_empty());
        let rows: Vec<Vec<String>> = plan
            .node_claims
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let more = c.instance_types.len().saturating_sub(4);
                let mut opts = c.instance_types.iter().take(4).cloned().collect::<Vec<_>>().join(",");
                if more > 0 {
                    let _ = write!(opts, " (+{more})");
                }
                let mut row = vec![
                    format!("{}", i + 1),
                    c.node_pool.clone(),
                    c.flavor.clone(),
                    opts,
                    format!("{:.4}", c.price_per_hour),
                    c.requests.cpu.clone(),
                    c.requests.memory.clone(),
                    c.pods.len().to_string(),
                ];
                if extended {
                    let e: Vec<String> = c.requests.extended.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    row.push(e.join(","));
                }
                row
            })
            .collect();
        let mut header: Vec<String> =
            ["#", "NODEPOOL", "FLAVOR", "OPTIONS", "EUR/H", "CPU", "MEMORY", "PODS"].map(str::to_string).to_vec();
        if extended {
            header.push("EXTENDED".to_string());
        }
        let mut widths: Vec<usize> = header.iter().map(String::len).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        out.push('\n');
        for r in std::iter::once(&header).chain(rows.iter()) {
            let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        // Which pods land where: the question a person asks first, and the table has no room for it.
        let _ = writeln!(out, "\nPods on each new NodeClaim:");
        for (i, c) in plan.node_claims.iter().enumerate() {
            let _ = writeln!(out, "  #{} ({} {}): {}", i + 1, c.node_pool, c.flavor, c.pods.join(", "));
        }
    }
    if !plan.existing_nodes.is_empty() {
        let _ = writeln!(out, "\nExisting nodes:");
        for n in &plan.existing_nodes {
            let _ = writeln!(out, "  {}: {}", n.name, n.pods.join(", "));
        }
    }
    if !plan.unschedulable.is_empty() {
        let _ = writeln!(out, "\nUnschedulable:");
        for u in &plan.unschedulable {
            let _ = writeln!(out, "  {}: {}", u.pod, u.reason);
        }
    }
    if !plan.static_pools.is_empty() {
        let _ = writeln!(out, "\nStatic pools (a fixed count, no node for pending pods):");
        for s in &plan.static_pools {
            let delete = if s.delete.is_empty() { String::new() } else { format!(", delete {}", s.delete.join(", ")) };
            let _ = writeln!(
                out,
                "  {}: {} of {} replicas; create {}{delete}",
                s.node_pool, s.claims, s.replicas, s.create
            );
        }
    }
    if !plan.capacity_buffers.is_empty() {
        let _ = writeln!(out, "\nCapacity buffers (room kept for pods not yet there, placed after every real pod):");
        for b in &plan.capacity_buffers {
            let _ = writeln!(
                out,
                "  {}: {} pod(s): {} on existing capacity, {} on new NodeClaims, {} unplaceable",
                b.name, b.replicas, b.existing, b.new_capacity, b.unplaceable
            );
        }
    }
    out
}

/// Runs the command: reads the files, plans, prints. Notes go to standard error.
pub fn run(args: &PlanArgs) -> Result<String, PlanError> {
    let mut sources = Vec::new();
    for f in &args.files {
        let name = f.display().to_string();
        let text = if name == "-" {
            std::io::read_to_string(std::io::stdin())
                .map_err(|e| PlanError::Read { file: name.clone(), message: e.to_string() })?
        } else {
            std::fs::read_to_string(f).map_err(|e| PlanError::Read { file: name.clone(), message: e.to_string() })?
        };
        sources.push((name, text));
    }
    let (mut snapshot, notes) = read_snapshot(&sources)?;
    let now = now_of(args)?;
    // do-not-disrupt durations of pods on leaving nodes are judged at --now.
    snapshot.snapshot.now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).ok();
    if args.disruption {
        let plan = plan_disruption(&snapshot, args.cluster.as_deref(), args.settings(), now, notes)?;
        for n in &plan.notes {
            eprintln!("note: {n}");
        }
        return Ok(match args.output {
            Format::Table => disruption_table(&plan),
            Format::Json => disruption_json(&plan),
        });
    }
    let plan = plan_with(&snapshot, args.cluster.as_deref(), args.settings(), notes)?;
    for n in &plan.notes {
        eprintln!("note: {n}");
    }
    Ok(match args.output {
        Format::Table => to_table(&plan),
        Format::Json => to_json(&plan),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn plan_of(yaml: &str) -> Result<Plan, PlanError> {
        let (snap, notes) = read_snapshot(&[("test.yaml".to_string(), yaml.to_string())])?;
        plan(&snap, None, notes)
    }

    const POOL: &str = "
apiVersion: karpenter.clever-cloud.com/v1alpha1
kind: NodePool
metadata: {name: default, namespace: team}
spec:
  clusterName: c1
  template:
    spec:
      nodeClassRef: {group: karpenter.clever-cloud.com, kind: CleverNodeClass, name: default}
      requirements: []
";

    #[test]
    fn two_small_pods_share_one_xs() {
        let yaml = format!(
            "{POOL}---
apiVersion: v1
kind: Pod
metadata: {{name: a, namespace: web}}
spec:
  containers: [{{name: app, resources: {{requests: {{cpu: '3'}}}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: b, namespace: web}}
spec:
  containers: [{{name: app, resources: {{requests: {{cpu: '3'}}}}}}]
"
        );
        let p = plan_of(&yaml).unwrap();
        assert_eq!(p.cluster, "c1");
        assert_eq!(p.node_claims.len(), 1);
        assert_eq!(p.node_claims[0].flavor, "XS");
        assert_eq!(p.node_claims[0].pods, vec!["web/a", "web/b"]);
        assert_eq!(
            p.node_claims[0].requests,
            Requests { cpu: "6".into(), memory: "0".into(), pods: "2".into(), extended: BTreeMap::new() }
        );
        assert_eq!(p.total_price_per_hour, 0.0611);
        let json: Value = serde_json::from_str(&to_json(&p)).unwrap();
        assert_eq!(json["nodeClaims"][0]["pricePerHour"], 0.0611);
        assert!(json.get("notes").is_none());
        assert!(to_table(&p).contains("XS"));
    }

    #[test]
    fn malformed_documents_name_the_document_and_field() {
        let bad = POOL.replace("clusterName: c1", "clusterNam: c1");
        let e = plan_of(&bad).unwrap_err().to_string();
        // Refused by the CRD schema, as the API server would, before the typed model is read.
        assert!(
            e.contains("document 1 (NodePool team/default): spec: Invalid value: set exactly one of spec.clusterName"),
            "{e}"
        );
        assert!(e.contains("clusterSelector"), "{e}");
        let bad_qty = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: app, resources: {requests: {cpu: lots}}}]\n";
        let e = plan_of(bad_qty).unwrap_err().to_string();
        assert!(e.contains("Pod default/a"), "{e}");
        assert!(e.contains("containers[app]") && e.contains("cpu"), "{e}");
    }

    #[test]
    fn unknown_kinds_are_reported_and_skipped() {
        let yaml = format!("{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\n");
        let p = plan_of(&yaml).unwrap();
        assert!(p.notes.iter().any(|n| n.contains("Deployment web") && n.contains("skipped")), "{:?}", p.notes);
    }

    #[test]
    fn several_clusters_need_a_choice() {
        let other = POOL.replace("c1", "c2").replace("name: default,", "name: other,");
        let yaml = format!("{POOL}---{other}");
        assert!(matches!(plan_of(&yaml), Err(PlanError::AmbiguousCluster(_))));
        let (snap, notes) = read_snapshot(&[("t".into(), yaml)]).unwrap();
        assert_eq!(plan(&snap, Some("c2"), notes).unwrap().cluster, "c2");
    }
}
