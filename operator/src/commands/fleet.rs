//! `karpenter-hub fleet`: one line per registered workload cluster (fleet.md §6), read from the
//! management cluster only: the registration Secrets' metadata, the NodePools (their status rows and
//! rollouts), the `WorkloadCluster` reports the hub writes and the `CleverOrganization` ledgers (the
//! room each organisation of a cluster has left). It never reaches a workload cluster
//! and never reads a kubeconfig (Secrets are listed as metadata).
//!
//! Owns: the flags, the four lists, the view ([`view`], pure) and its two renderings. The JSON
//! shape ([`Fleet`]) is stable: fields are only ever added. Must not: decide anything the hub
//! decides (it shows what the hub wrote).

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use crds::{CleverOrganization, NodePool, WorkloadCluster};
use k8s_openapi::{api::core::v1::Secret, jiff::Timestamp};
use kube::{
    Client, ResourceExt,
    api::{ListParams, ObjectList},
};
use serde::Serialize;

use super::run;
use crate::{
    decisions::{cluster_report, organization},
    infra::{
        apierror::plain,
        hub::scoped,
        registry::{CLUSTER_NAME_LABEL, ClusterKey, registered_by},
    },
};

/// The `apiVersion` of the JSON output; a change that is not an addition gets a new one.
pub const JSON_VERSION: &str = "fleet.karpenter.clever-cloud.com/v1";

/// Flags of `karpenter-hub fleet`.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Kubeconfig of the management cluster; default: $KUBECONFIG / ~/.kube/config, then in-cluster.
    #[arg(long, env = "KARPENTER_HUB_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace whose clusters to show; default: the kubeconfig context's namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE", conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Show the clusters of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// `table` (for people) or `json` (stable, for scripts: docs/fleets.md).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Why the fleet view could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Management(#[from] run::RunError),
    #[error("cannot list {what} in {scope}: {}{hint}", plain(.source))]
    List { what: &'static str, scope: String, hint: &'static str, source: kube::Error },
    #[error("cannot print the fleet as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The whole view (`-o json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fleet {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub clusters: Vec<ClusterRow>,
}

/// One registered cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRow {
    pub namespace: String,
    pub name: String,
    /// The hub's connection phase (`Connected`, `Unreachable`, …), `Unknown` before any report.
    pub reachability: String,
    /// The hub's words when not `Connected`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The report is older than a serving hub would leave it (no replica serves the cluster).
    pub stale: bool,
    /// When the report was written, if there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<Timestamp>,
    /// The replica that wrote the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_by: Option<String>,
    /// The NodePools serving the cluster, by name.
    pub pools: Vec<PoolRef>,
    pub nodes: Nodes,
    /// Pods waiting for capacity; absent while the hub has not synced the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<i64>,
    /// Catalogue price of the hub's nodes there, EUR/h (four decimals); absent before any report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eur_per_hour: Option<String>,
    /// The hub's NodeClaims there being deleted (disruption or termination in progress).
    pub disrupting: i64,
    /// The cluster's phase in each fleet pool's rollout.
    pub rollouts: Vec<RolloutRef>,
    /// The organisations whose ledger counts the cluster, with the room each has left.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub organizations: Vec<OrganizationRef>,
}

/// An organisation counting a cluster, and its room left (quota − usage, per limited resource).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrganizationRef {
    pub name: String,
    /// vCPUs left; absent when the organisation does not limit them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_cpu: Option<String>,
    /// Nominal memory left (e.g. `16G`); absent when not limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<String>,
    /// EUR/h left under the cost ceiling; absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_eur_per_hour: Option<String>,
}

/// A pool serving a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    pub name: String,
    /// A fleet pool (`spec.clusterSelector`), else a `clusterName` pool.
    pub fleet: bool,
}

/// Node counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nodes {
    /// The hub's NodeClaims not being deleted.
    pub hub: i64,
    /// Every Node of the cluster; absent while the hub has not synced it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<i64>,
}

/// A cluster's phase in one fleet pool's rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRef {
    pub pool: String,
    /// `Pending`, `Progressing`, `Soaking`, `Done` or `Failed`.
    pub phase: String,
    pub since: Timestamp,
}

/// Print the fleet view for `args`.
pub async fn run(args: &FleetArgs) -> Result<String, FleetError> {
    let mgmt = run::management_client(args.kubeconfig.as_ref()).await?;
    let namespace = if args.all_namespaces {
        None
    } else {
        Some(args.namespace.clone().unwrap_or_else(|| mgmt.default_namespace().to_string()))
    };
    let fleet = gather(&mgmt, namespace.as_deref()).await?;
    match args.output {
        Output::Json => Ok(serde_json::to_string_pretty(&fleet)? + "\n"),
        Output::Table => Ok(table(&fleet, namespace.is_none())),
    }
}

/// The fleet view of `namespace` (every namespace with `None`) from the management cluster at `mgmt`.
pub async fn gather(mgmt: &Client, namespace: Option<&str>) -> Result<Fleet, FleetError> {
    let scope = namespace.map_or_else(|| "every namespace".to_string(), |ns| format!("namespace {ns}"));
    let failed = |what: &'static str, hint: &'static str| {
        let scope = scope.clone();
        move |source| FleetError::List { what, scope, hint, source }
    };
    // Metadata only: a registration Secret holds credentials.
    let secrets = scoped::<Secret>(mgmt, namespace)
        .list_metadata(&ListParams::default().labels(CLUSTER_NAME_LABEL))
        .await
        .map_err(failed("registration Secrets", " (the view needs list on secrets, metadata only)"))?;
    let pools: ObjectList<NodePool> = scoped::<NodePool>(mgmt, namespace)
        .list(&ListParams::default())
        .await
        .map_err(failed("NodePools", " (are the hub's CRDs installed?)"))?;
    let reports: ObjectList<WorkloadCluster> =
        scoped::<WorkloadCluster>(mgmt, namespace).list(&ListParams::default()).await.map_err(failed(
            "WorkloadClusters",
            " (is the WorkloadCluster CRD installed? upgrade the karpenter-hub-crds chart)",
        ))?;
    // Cluster-scoped; none without the CRD or the right to list it.
    let orgs = match kube::Api::<CleverOrganization>::all(mgmt.clone()).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Vec::new(),
        Err(source) => {
            return Err(FleetError::List {
                what: "CleverOrganizations",
                scope: "the management cluster".to_string(),
                hint: "",
                source,
            });
        }
    };
    let registered: Vec<ClusterKey> = secrets.items.iter().filter_map(|s| registered_by(&s.metadata)).collect();
    Ok(view(&registered, &pools.items, &reports.items, &orgs, Timestamp::now()))
}

/// The fleet view: one row per registered cluster, sorted by namespace and name. Pure.
pub fn view(
    registered: &[ClusterKey],
    pools: &[NodePool],
    reports: &[WorkloadCluster],
    orgs: &[CleverOrganization],
    now: Timestamp,
) -> Fleet {
    let reports: BTreeMap<ClusterKey, &WorkloadCluster> =
        reports.iter().filter_map(|r| Some((ClusterKey::new(r.namespace()?, r.name_any()), r))).collect();
    let mut pools_of: BTreeMap<&str, Vec<&NodePool>> = BTreeMap::new();
    for p in pools {
        pools_of.entry(p.metadata.namespace.as_deref().unwrap_or_default()).or_default().push(p);
    }
    let mut keys = registered.to_vec();
    keys.sort();
    keys.dedup();
    let clusters = keys
        .into_iter()
        .map(|key| {
            let here = pools_of.get(key.namespace.as_str()).map(Vec::as_slice).unwrap_or_default();
            let mut r = row(&key, here, reports.get(&key).and_then(|r| r.status.as_ref()), now);
            r.organizations = organizations_of(&key, orgs);
            r
        })
        .collect();
    Fleet { api_version: JSON_VERSION, kind: "Fleet", clusters }
}

fn row(
    key: &ClusterKey,
    pools: &[&NodePool],
    report: Option<&crds::WorkloadClusterStatus>,
    now: Timestamp,
) -> ClusterRow {
    let mut serving: Vec<PoolRef> = Vec::new();
    let mut rollouts: Vec<RolloutRef> = Vec::new();
    for p in pools {
        let status = p.status.as_ref();
        // A fleet pool serves the clusters its status has a row for: the hub's view of its labels.
        let serves = match &p.spec.cluster_name {
            Some(name) => *name == key.name,
            None => status.is_some_and(|s| s.clusters.iter().any(|r| r.name == key.name)),
        };
        if serves {
            serving.push(PoolRef { name: p.name_any(), fleet: p.is_fleet() });
        }
        let phase =
            status.and_then(|s| s.rollout.as_ref()).and_then(|r| r.clusters.iter().find(|c| c.name == key.name));
        if let Some(c) = phase {
            rollouts.push(RolloutRef { pool: p.name_any(), phase: format!("{:?}", c.phase), since: c.since.0 });
        }
    }
    serving.sort_by(|a, b| a.name.cmp(&b.name));
    rollouts.sort_by(|a, b| a.pool.cmp(&b.pool));
    ClusterRow {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        reachability: report.map_or_else(|| "Unknown".to_string(), |r| r.phase.clone()),
        message: report.and_then(|r| r.message.clone()),
        stale: report.is_some_and(|r| cluster_report::is_stale(r, now)),
        observed_time: report.map(|r| r.observed_time.0),
        reported_by: report.and_then(|r| r.replica.clone()),
        pools: serving,
        nodes: Nodes { hub: report.map_or(0, |r| r.hub_nodes), all: report.and_then(|r| r.nodes) },
        pending_pods: report.and_then(|r| r.pending_pods),
        eur_per_hour: report.map(|r| r.price_per_hour.clone()),
        disrupting: report.map_or(0, |r| r.disrupting),
        rollouts,
        organizations: Vec::new(),
    }
}

/// The organisations whose ledger has an entry for `key` (the hub counted the cluster there), with
/// the room each has left.
fn organizations_of(key: &ClusterKey, orgs: &[CleverOrganization]) -> Vec<OrganizationRef> {
    let mut out: Vec<OrganizationRef> = orgs
        .iter()
        .filter(|o| {
            o.status
                .as_ref()
                .is_some_and(|s| s.clusters.iter().any(|c| c.namespace == key.namespace && c.name == key.name))
        })
        .map(|o| {
            let left = organization::headroom(o);
            OrganizationRef {
                name: o.name_any(),
                free_cpu: left.cpu_millis.map(crds::quantity::format_millis_cpu),
                free_memory: left.memory_bytes.map(crds::quantity::format_decimal_bytes),
                free_eur_per_hour: left.price_micros.map(organization::format_price),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The table for people: aligned columns, `-` for what is not known, a total line.
pub fn table(fleet: &Fleet, with_namespace: bool) -> String {
    let mut header = vec![
        "CLUSTER",
        "REACHABLE",
        "POOLS",
        "NODES(HUB/ALL)",
        "PENDING",
        "EUR/H",
        "DISRUPTING",
        "ROLLOUT",
        "ORGANIZATION (FREE)",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let dash = || "-".to_string();
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(ToString::to_string).collect()];
    for c in &fleet.clusters {
        let reachable = if c.stale { format!("{} (stale)", c.reachability) } else { c.reachability.clone() };
        let pools = if c.pools.is_empty() {
            dash()
        } else {
            c.pools
                .iter()
                .map(|p| if p.fleet { format!("{}*", p.name) } else { p.name.clone() })
                .collect::<Vec<_>>()
                .join(",")
        };
        let rollouts = if c.rollouts.is_empty() {
            dash()
        } else {
            c.rollouts.iter().map(|r| format!("{}={}", r.pool, r.phase)).collect::<Vec<_>>().join(",")
        };
        let mut line = vec![
            c.name.clone(),
            reachable,
            pools,
            format!("{}/{}", c.nodes.hub, c.nodes.all.map_or_else(dash, |n| n.to_string())),
            c.pending_pods.map_or_else(dash, |n| n.to_string()),
            c.eur_per_hour.clone().unwrap_or_else(dash),
            c.disrupting.to_string(),
            rollouts,
            organizations_cell(&c.organizations),
        ];
        if with_namespace {
            line.insert(0, c.namespace.clone());
        }
        lines.push(line);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    let hub: i64 = fleet.clusters.iter().map(|c| c.nodes.hub).sum();
    let pending: i64 = fleet.clusters.iter().filter_map(|c| c.pending_pods).sum();
    let eur: f64 = fleet.clusters.iter().filter_map(|c| c.eur_per_hour.as_deref()?.parse::<f64>().ok()).sum();
    let _ = writeln!(
        out,
        "{} cluster(s); {hub} node(s) by the hub; {pending} pending pod(s); {} EUR/h. Pools marked * are fleet pools.",
        fleet.clusters.len(),
        cluster_report::price(eur),
    );
    out
}

/// `acme: 8 vCPU, 16G, 0.5000 EUR/h` per organisation (what it limits), `-` for none.
fn organizations_cell(orgs: &[OrganizationRef]) -> String {
    if orgs.is_empty() {
        return "-".to_string();
    }
    orgs.iter()
        .map(|o| {
            let mut free: Vec<String> = Vec::new();
            free.extend(o.free_cpu.as_ref().map(|c| format!("{c} vCPU")));
            free.extend(o.free_memory.clone());
            free.extend(o.free_eur_per_hour.as_ref().map(|p| format!("{p} EUR/h")));
            format!("{}: {}", o.name, free.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn pool(v: serde_json::Value) -> NodePool {
        serde_json::from_value(v).unwrap()
    }

    fn pools() -> Vec<NodePool> {
        let template = json!({"spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}});
        vec![
            pool(json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "batch", "namespace": "team-a"},
                "spec": {"clusterName": "paris", "template": template}})),
            pool(json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "web", "namespace": "team-a"},
                "spec": {"clusterSelector": {"matchLabels": {"env": "prod"}}, "template": template},
                "status": {
                    "clusters": [{"name": "paris", "nodes": 2, "ready": "True", "reason": "Ready"},
                                 {"name": "lyon", "nodes": 0, "ready": "False", "reason": "Unreachable"}],
                    "rollout": {"revision": "abc", "clusters": [
                        {"name": "paris", "phase": "Soaking", "since": "2027-01-15T08:00:00Z"},
                        {"name": "lyon", "phase": "Pending", "since": "2027-01-15T08:00:00Z"}]}}})),
            // Another namespace's pool with the same cluster name serves nothing here.
            pool(json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
                "metadata": {"name": "other", "namespace": "team-b"},
                "spec": {"clusterName": "paris", "template": template}})),
        ]
    }

    fn report(ns: &str, name: &str, status: serde_json::Value) -> WorkloadCluster {
        serde_json::from_value(json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "WorkloadCluster",
            "metadata": {"name": name, "namespace": ns}, "spec": {}, "status": status}))
        .unwrap()
    }

    fn reports() -> Vec<WorkloadCluster> {
        vec![
            report(
                "team-a",
                "paris",
                json!({"phase": "Connected", "nodes": 5, "hubNodes": 3, "pendingPods": 1,
                "disrupting": 1, "pricePerHour": "0.1834", "replica": "hub-0", "observedTime": at(-30).to_string()}),
            ),
            report(
                "team-a",
                "lyon",
                json!({"phase": "Unreachable", "message": "no answer from the API server",
                "hubNodes": 0, "disrupting": 0, "pricePerHour": "0.0000", "observedTime": at(-3000).to_string()}),
            ),
            // A report whose Secret is gone is no registered cluster.
            report(
                "team-a",
                "gone",
                json!({"phase": "Connected", "hubNodes": 0, "disrupting": 0,
                "pricePerHour": "0.0000", "observedTime": at(0).to_string()}),
            ),
        ]
    }

    fn keys() -> Vec<ClusterKey> {
        vec![ClusterKey::new("team-a", "paris"), ClusterKey::new("team-a", "lyon"), ClusterKey::new("team-a", "nice")]
    }

    #[test]
    fn one_row_per_registered_cluster_from_what_the_hub_wrote() {
        let fleet = view(&keys(), &pools(), &reports(), &[], at(0));
        let names: Vec<&str> = fleet.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["lyon", "nice", "paris"]);
        let paris = &fleet.clusters[2];
        assert_eq!(paris.reachability, "Connected");
        assert!(!paris.stale);
        assert_eq!(
            paris.pools,
            [PoolRef { name: "batch".into(), fleet: false }, PoolRef { name: "web".into(), fleet: true }]
        );
        assert_eq!(paris.nodes, Nodes { hub: 3, all: Some(5) });
        assert_eq!((paris.pending_pods, paris.disrupting), (Some(1), 1));
        assert_eq!(paris.eur_per_hour.as_deref(), Some("0.1834"));
        assert_eq!(paris.rollouts.len(), 1);
        assert_eq!((paris.rollouts[0].pool.as_str(), paris.rollouts[0].phase.as_str()), ("web", "Soaking"));
        // An old report is flagged, not trusted silently.
        let lyon = &fleet.clusters[0];
        assert!(lyon.stale);
        assert_eq!(lyon.message.as_deref(), Some("no answer from the API server"));
        assert_eq!(lyon.nodes.all, None);
        // A cluster the hub has not reported yet.
        let nice = &fleet.clusters[1];
        assert_eq!((nice.reachability.as_str(), nice.pools.len(), nice.eur_per_hour.as_deref()), ("Unknown", 0, None));
    }

    #[test]
    fn the_json_shape_is_stable() {
        let fleet = view(&[ClusterKey::new("team-a", "paris")], &pools(), &reports(), &[], at(0));
        let v = serde_json::to_value(&fleet).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": JSON_VERSION, "kind": "Fleet", "clusters": [{
                "namespace": "team-a", "name": "paris", "reachability": "Connected", "stale": false,
                "observedTime": at(-30).to_string(), "reportedBy": "hub-0",
                "pools": [{"name": "batch", "fleet": false}, {"name": "web", "fleet": true}],
                "nodes": {"hub": 3, "all": 5}, "pendingPods": 1, "eurPerHour": "0.1834", "disrupting": 1,
                "rollouts": [{"pool": "web", "phase": "Soaking", "since": "2027-01-15T08:00:00Z"}],
            }]})
        );
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        fleet: FleetArgs,
    }

    #[test]
    fn flags_name_the_namespace_or_all_and_refuse_both_or_an_unknown_format() {
        use clap::Parser;
        let a = Cli::try_parse_from(["fleet", "-n", "team-a", "-o", "json"]).unwrap().fleet;
        assert_eq!((a.namespace.as_deref(), a.all_namespaces, a.output), (Some("team-a"), false, Output::Json));
        let a = Cli::try_parse_from(["fleet", "-A"]).unwrap().fleet;
        assert_eq!((a.namespace, a.all_namespaces, a.output), (None, true, Output::Table));
        let both = Cli::try_parse_from(["fleet", "-n", "team-a", "-A"]).unwrap_err().to_string();
        assert!(both.contains("--all-namespaces") && both.contains("cannot be used with"), "{both}");
        let yaml = Cli::try_parse_from(["fleet", "-o", "yaml"]).unwrap_err().to_string();
        assert!(yaml.contains("invalid value 'yaml'") && yaml.contains("table") && yaml.contains("json"), "{yaml}");
    }

    #[test]
    fn the_table_aligns_marks_and_totals() {
        let out = table(&view(&keys(), &pools(), &reports(), &[], at(0)), true);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE  CLUSTER  REACHABLE"), "{out}");
        assert!(lines[1].contains("Unreachable (stale)"), "{out}");
        assert!(lines[2].contains("Unknown") && lines[2].contains("0/-"), "{out}");
        assert!(
            lines[3].contains("batch,web*") && lines[3].contains("3/5") && lines[3].contains("web=Soaking"),
            "{out}"
        );
        // Columns line up: every row's CLUSTER cell starts where the header's does.
        let col = lines[0].find("CLUSTER").unwrap();
        assert!(lines[1..4].iter().all(|l| l[col..].starts_with(['l', 'n', 'p'])), "{out}");
        assert_eq!(
            lines[4],
            "3 cluster(s); 3 node(s) by the hub; 1 pending pod(s); 0.1834 EUR/h. Pools marked * are fleet pools."
        );
    }

    #[test]
    fn each_row_shows_the_room_its_organisations_have_left() {
        let org: CleverOrganization = serde_json::from_value(json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverOrganization",
            "metadata": {"name": "acme", "generation": 1},
            "spec": {"clusterSelector": {}, "quota": {"cpu": "64", "memory": "96G"}},
            "status": {"clusters": [{
                "namespace": "team-a", "name": "paris", "nodes": 4, "cpuMillis": 56000,
                "memoryBytes": 80000000000u64, "observedTime": "2027-01-15T08:00:00Z"
            }]}
        }))
        .unwrap();
        let fleet = view(&keys(), &pools(), &reports(), &[org], at(0));
        let paris = &fleet.clusters[2];
        assert_eq!(
            paris.organizations,
            [OrganizationRef {
                name: "acme".into(),
                free_cpu: Some("8".into()),
                free_memory: Some("16G".into()),
                free_eur_per_hour: None
            }]
        );
        // A cluster the ledger does not count has none (the JSON leaves the field out).
        assert!(fleet.clusters[0].organizations.is_empty());
        assert!(serde_json::to_value(&fleet.clusters[0]).unwrap().get("organizations").is_none());
        let out = table(&fleet, false);
        assert!(out.lines().next().unwrap().ends_with("ORGANIZATION (FREE)"), "{out}");
        assert!(out.lines().nth(3).unwrap().ends_with("acme: 8 vCPU, 16G"), "{out}");
    }
}
