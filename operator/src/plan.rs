//! `karpenter-hub plan`: the offline dry run. Reads ordinary multi-document manifests (NodePool,
//! CleverNodeClass, FlavorCatalog, NodeClaim, Node, Pod, DaemonSet, PodDisruptionBudget,
//! PersistentVolumeClaim, PersistentVolume, StorageClass, CSINode; `List`s
//! of them), treats unbound non-DaemonSet pods as pending, runs the same scheduling core as the
//! operator and prints the decision as a table or as JSON (a stable interface, see `docs/plan.md`).
//!
//! Owns the reading of files into a [`Snapshot`] and the rendering of the decision. Must not hold
//! scheduling logic: that is `scheduling::solve`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use crds::catalog::round4;
use crds::quantity::{format_bytes, format_count, format_millis_cpu};
use scheduling::convert::{ConvertError, PendingRule, Snapshot, Volumes, build_input_with_volumes};
use scheduling::model::{MinValuesPolicy, PreferencePolicy, Settings};
use serde::Serialize;
use serde_json::Value;

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
    /// Workload cluster to plan for (a NodePool `spec.clusterName`); needed when the pools serve several.
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
}

/// `--preference-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PreferenceArg {
    /// Preferences act as requirements until relaxed.
    Respect,
    /// Preferences are dropped.
    Ignore,
}

/// `--min-values-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MinValuesArg {
    /// Placement fails.
    Strict,
    /// minValues is lowered to what remains.
    BestEffort,
}

impl PlanArgs {
    /// The scheduler settings the flags select.
    pub fn settings(&self) -> Settings {
        Settings {
            preference_policy: match self.preference_policy {
                PreferenceArg::Respect => PreferencePolicy::Respect,
                PreferenceArg::Ignore => PreferencePolicy::Ignore,
            },
            min_values_policy: match self.min_values_policy {
                MinValuesArg::Strict => MinValuesPolicy::Strict,
                MinValuesArg::BestEffort => MinValuesPolicy::BestEffort,
            },
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
    /// Documents skipped and objects ignored (not part of the JSON interface).
    #[serde(skip)]
    pub notes: Vec<String>,
}

/// What the manifests hold: the scheduling snapshot and the storage objects.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// Hub and workload objects.
    pub snapshot: Snapshot,
    /// PVCs and StorageClasses, when any were given (pods' volumes are checked only then).
    pub volumes: Volumes,
}

/// Reads manifests into a snapshot. `sources` are `(name, text)`; notes tell what was skipped.
pub fn read_snapshot(sources: &[(String, String)]) -> Result<(Manifests, Vec<String>), PlanError> {
    let mut snap = Manifests::default();
    let mut notes = Vec::new();
    for (file, text) in sources {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text)
            .map_err(|e| PlanError::Read { file: file.clone(), message: format!("not valid YAML: {e}") })?;
        for (i, doc) in docs.into_iter().enumerate() {
            add_document(&mut snap, &mut notes, file, i + 1, doc)?;
        }
    }
    Ok((snap, notes))
}

fn add_document(
    snap: &mut Manifests,
    notes: &mut Vec<String>,
    file: &str,
    index: usize,
    doc: Value,
) -> Result<(), PlanError> {
    if doc.is_null() {
        return Ok(());
    }
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string();
    let name = doc.pointer("/metadata/name").and_then(Value::as_str).map(|n| format!(" {n}")).unwrap_or_default();
    let fail = |message: String| PlanError::Document {
        file: file.to_string(),
        index,
        kind: kind.clone(),
        name: name.clone(),
        message,
    };
    if !doc.is_object() {
        return Err(fail("not an object".to_string()));
    }
    fn typed<T: serde::de::DeserializeOwned>(doc: Value) -> Result<T, String> {
        serde_json::from_value(doc).map_err(|e| e.to_string())
    }
    let hub = api_version.starts_with("karpenter.clever-cloud.com/");
    match (kind.as_str(), hub) {
        ("List", _) => {
            let items = doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            for item in items {
                add_document(snap, notes, file, index, item)?;
            }
        }
        ("NodePool", true) => snap.snapshot.node_pools.push(typed(doc).map_err(fail)?),
        ("CleverNodeClass", true) => snap.snapshot.node_classes.push(typed(doc).map_err(fail)?),
        ("FlavorCatalog", true) => snap.snapshot.flavor_catalogs.push(typed(doc).map_err(fail)?),
        ("NodeClaim", true) => snap.snapshot.node_claims.push(typed(doc).map_err(fail)?),
        ("Node", false) => snap.snapshot.nodes.push(typed(doc).map_err(fail)?),
        ("Pod", false) => snap.snapshot.pods.push(typed(doc).map_err(fail)?),
        ("DaemonSet", false) => snap.snapshot.daemonsets.push(typed(doc).map_err(fail)?),
        ("PodDisruptionBudget", false) => snap.snapshot.pdbs.push(typed(doc).map_err(fail)?),
        ("PersistentVolumeClaim", false) => {
            snap.volumes.pvcs.get_or_insert_with(Vec::new).push(typed(doc).map_err(fail)?)
        }
        ("CSINode", false) => snap.volumes.csinodes.get_or_insert_with(Vec::new).push(typed(doc).map_err(fail)?),
        ("PersistentVolume", false) => snap.volumes.pvs.get_or_insert_with(Vec::new).push(typed(doc).map_err(fail)?),
        ("StorageClass", false) => {
            snap.volumes.storage_classes.get_or_insert_with(Vec::new).push(typed(doc).map_err(fail)?);
        }
        _ => notes.push(format!("{file}: document {index} ({api_version} {kind}{name}) skipped: not read by plan")),
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
    let snapshot = &manifests.snapshot;
    let cluster = match cluster {
        Some(c) => c.to_string(),
        None => {
            let clusters: BTreeSet<&str> = snapshot.node_pools.iter().map(|p| p.spec.cluster_name.as_str()).collect();
            match clusters.len() {
                0 => String::new(),
                1 => clusters.into_iter().next().unwrap_or_default().to_string(),
                _ => return Err(PlanError::AmbiguousCluster(clusters.into_iter().collect::<Vec<_>>().join(", "))),
            }
        }
    };
    let converted = build_input_with_volumes(snapshot, &manifests.volumes, &cluster, PendingRule::Unbound, settings)?;
    notes.extend(converted.notes);
    let input = converted.input;
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
                memory: format_bytes(c.requests.memory_bytes),
                pods: format_count(c.requests.pods),
            },
        })
        .collect();
    let total = round4(node_claims.iter().fold(0.0, |acc, c| acc + c.price_per_hour));
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
            .map(|u| Unplaced { pod: key(&u.pod), reason: u.reason.clone() })
            .collect(),
        node_claims,
        total_price_per_hour: total,
        notes,
    })
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
        let rows: Vec<[String; 7]> = plan
            .node_claims
            .iter()
            .map(|c| {
                let more = c.instance_types.len().saturating_sub(4);
                let mut opts = c.instance_types.iter().take(4).cloned().collect::<Vec<_>>().join(",");
                if more > 0 {
                    let _ = write!(opts, " (+{more})");
                }
                [
                    c.node_pool.clone(),
                    c.flavor.clone(),
                    opts,
                    format!("{:.4}", c.price_per_hour),
                    c.requests.cpu.clone(),
                    c.requests.memory.clone(),
                    c.pods.len().to_string(),
                ]
            })
            .collect();
        let header = ["NODEPOOL", "FLAVOR", "OPTIONS", "EUR/H", "CPU", "MEMORY", "PODS"].map(str::to_string);
        let mut widths = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        out.push('\n');
        for r in std::iter::once(&header).chain(rows.iter()) {
            let line: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
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
    let (snapshot, notes) = read_snapshot(&sources)?;
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
        assert_eq!(p.node_claims[0].requests, Requests { cpu: "6".into(), memory: "0".into(), pods: "2".into() });
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
        assert!(e.contains("document 1 (NodePool default)"), "{e}");
        assert!(e.contains("clusterName"), "{e}");
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
