//! Which workload cluster `plan` plans for, and which NodePools serve it (fleet.md §1–2).
//!
//! The manifests may register clusters: a registration Secret `<cluster>-kubeconfig` labelled
//! `cluster.x-k8s.io/cluster-name=<cluster>` and a Cluster API `Cluster` of the same name and
//! namespace; the cluster's labels are the Secret's over the `Cluster`'s, as the hub's registry
//! merges them. A pool serves the cluster its `clusterName` names, or, for a fleet pool, every
//! registered cluster of its own namespace whose labels its `clusterSelector` matches. The plan is
//! for the cluster `--cluster` names, or the only one the pools serve; its snapshot holds the pools
//! serving it and the fleet pools it departed from that still have NodeClaims there (their budgets
//! keep applying to those nodes; they are no destination), as the hub's snapshot does.
//!
//! Owns: reading a registration's metadata, the label merge, cluster resolution and the per-cluster
//! snapshot. Must not: read a Secret's `data` or `stringData` (a kubeconfig holds credentials: only
//! `metadata` is handed over here, and only its name, namespace and labels are kept), or decide
//! anything the scheduling and disruption cores decide.

use std::collections::BTreeSet;

use crds::NodePool;
use crds::labels::NODEPOOL as NODEPOOL_LABEL;
use kube::api::ObjectMeta;
use scheduling::convert::Snapshot;
use serde_json::Value;

use super::{Manifests, PlanError};
use crate::infra::registry::{CLUSTER_API_GROUP, CLUSTER_API_VERSIONS, CLUSTER_NAME_LABEL, ClusterKey, LabelSources};

/// Labels by key (the registry's type).
pub use crate::infra::registry::Labels;

/// Whether `api_version` is one of the Cluster API `Cluster` versions the hub reads.
pub fn is_cluster_api(api_version: &str) -> bool {
    api_version.split_once('/').is_some_and(|(g, v)| g == CLUSTER_API_GROUP && CLUSTER_API_VERSIONS.contains(&v))
}

/// What the manifests say of one cluster's labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    /// The registration Secret's labels, when the Secret was given.
    pub secret: Option<Labels>,
    /// The Cluster API `Cluster`'s labels, when it was given.
    pub cluster: Option<Labels>,
}

impl Registration {
    /// The cluster's labels: the `Cluster`'s, then the Secret's over them (the Secret wins), as the
    /// hub's registry merges them.
    pub fn labels(&self) -> Labels {
        LabelSources { secret: self.secret.clone().unwrap_or_default(), cluster: self.cluster.clone() }.merged()
    }
}

/// Which object a registration document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A `v1` Secret.
    Secret,
    /// A Cluster API `Cluster`.
    Cluster,
}

/// What a Secret's or a `Cluster`'s metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// It registers (or labels) this cluster with these labels.
    Cluster(ClusterKey, Labels),
    /// It is no registration, and why (a note for the user).
    Skipped(String),
}

/// A field of a registration's metadata that cannot be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct MetadataError {
    pub field: String,
    pub message: String,
}

fn unreadable(field: impl Into<String>, message: impl Into<String>) -> MetadataError {
    MetadataError { field: field.into(), message: message.into() }
}

/// Reads the `metadata` of a Secret or a Cluster API `Cluster` (nothing else of the document is
/// passed, so a Secret's data cannot leak from here). A Secret registers a cluster when it carries
/// `cluster.x-k8s.io/cluster-name=<cluster>` and is named `<cluster>-kubeconfig` (the hub ignores
/// other labelled Secrets); a `Cluster` labels the cluster of its own name. A missing namespace is
/// `default`, as for every other object `plan` reads.
pub fn read(source: Source, metadata: Option<&Value>) -> Result<Found, MetadataError> {
    let null = Value::Null;
    let metadata = metadata.unwrap_or(&null);
    if !metadata.is_object() && !metadata.is_null() {
        return Err(unreadable("metadata", "not an object"));
    }
    // Only these three fields are read: annotations may hold `kubectl apply`'s copy of a Secret,
    // data included.
    let text = |field: &str| -> Result<Option<String>, MetadataError> {
        match metadata.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(unreadable(format!("metadata.{field}"), "not a string")),
        }
    };
    let name = text("name")?;
    let namespace = text("namespace")?.unwrap_or_else(|| "default".to_string());
    let labels: Labels = match metadata.get("labels") {
        None | Some(Value::Null) => Labels::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| unreadable("metadata.labels", format!("not a map of strings to strings: {e}")))?,
    };
    match source {
        Source::Secret => {
            let Some(cluster) = labels.get(CLUSTER_NAME_LABEL).cloned() else {
                return Ok(Found::Skipped(format!("not a cluster registration (no label {CLUSTER_NAME_LABEL})")));
            };
            let name = name.ok_or_else(|| {
                unreadable("metadata.name", format!("missing: a registration Secret is named {cluster}-kubeconfig"))
            })?;
            if name != format!("{cluster}-kubeconfig") {
                return Ok(Found::Skipped(format!(
                    "labelled {CLUSTER_NAME_LABEL}={cluster} but not named {cluster}-kubeconfig: not a registration \
                     (the hub ignores it too)"
                )));
            }
            Ok(Found::Cluster(ClusterKey::new(namespace, cluster), labels))
        }
        Source::Cluster => {
            let name = name
                .ok_or_else(|| unreadable("metadata.name", "missing: a Cluster is named like the cluster it labels"))?;
            Ok(Found::Cluster(ClusterKey::new(namespace, name), labels))
        }
    }
}

/// The namespace of a hub object (`default` when omitted, as `plan` reads every object).
fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

/// Whether fleet pool `pool` serves registered cluster `key` with `labels`: never a cluster of
/// another namespace, whatever its labels (fleet.md §7.1).
fn fleet_serves(pool: &NodePool, key: &ClusterKey, labels: &Labels) -> bool {
    pool.is_fleet() && namespace_of(&pool.metadata) == key.namespace && pool.selects(&key.name, labels)
}

/// The clusters the manifests' pools serve: those named by `clusterName`, and the registered
/// clusters a fleet pool of their namespace selects.
pub fn served(manifests: &Manifests) -> BTreeSet<String> {
    let pools = &manifests.snapshot.node_pools;
    let mut out: BTreeSet<String> = pools.iter().filter_map(|p| p.spec.cluster_name.clone()).collect();
    for (key, registration) in &manifests.clusters {
        let labels = registration.labels();
        if pools.iter().any(|p| fleet_serves(p, key, &labels)) {
            out.insert(key.name.clone());
        }
    }
    out
}

/// The cluster a plan is for, its snapshot, and what the user should know about the choice.
#[derive(Debug, Clone)]
pub struct Target {
    /// The cluster (empty when no pool serves any).
    pub cluster: String,
    /// Its registration (namespace and name) when the manifests register it, else the namespace of
    /// a pool naming it.
    pub key: Option<ClusterKey>,
    /// The manifests' snapshot reduced to that cluster's pools, with its labels.
    pub snapshot: Snapshot,
    /// Notes for standard error.
    pub notes: Vec<String>,
}

/// The cluster `asked` (`--cluster`), or the only one the pools serve, and its snapshot.
pub fn target(manifests: &Manifests, asked: Option<&str>) -> Result<Target, PlanError> {
    let snap = &manifests.snapshot;
    let served = served(manifests);
    let list = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(", ");
    let cluster = match asked {
        Some(c) => {
            // A cluster with NodeClaims and no pool serving it is still worth planning: a fleet pool
            // it departed from may have nodes there (their disruption), and pods may fit on them.
            let has_claims = snap.node_claims.iter().any(|claim| claim.spec.cluster_name == c);
            if !served.contains(c) && !has_claims {
                return Err(not_served(manifests, c, &served));
            }
            c.to_string()
        }
        None => match served.len() {
            0 => String::new(),
            1 => served.iter().next().cloned().unwrap_or_default(),
            _ => return Err(PlanError::AmbiguousCluster(list(&served))),
        },
    };
    let registrations: Vec<(&ClusterKey, &Registration)> =
        manifests.clusters.iter().filter(|(k, _)| k.name == cluster).collect();
    if registrations.len() > 1 {
        let namespaces: Vec<&str> = registrations.iter().map(|(k, _)| k.namespace.as_str()).collect();
        return Err(PlanError::ClusterInSeveralNamespaces { cluster, namespaces: namespaces.join(", ") });
    }
    let registration = registrations.first().map(|(k, r)| (*k, r.labels(), *r));
    let mut notes = selecting_nothing(manifests);
    if let Some((key, _, r)) = &registration
        && r.secret.is_none()
        && snap.node_pools.iter().any(NodePool::is_fleet)
    {
        notes.push(format!(
            "cluster {key} has no registration Secret {}-kubeconfig in the manifests: its labels are its Cluster's \
             alone; the hub serves it only once that Secret exists, and the Secret's labels win over the Cluster's \
             (give the Secret; its metadata suffices)",
            key.name
        ));
    }

    // The fleet pools with NodeClaims on the cluster, by (namespace, pool): the ones it departed
    // from are kept for their budgets.
    let with_claims: BTreeSet<(&str, &str)> = snap
        .node_claims
        .iter()
        .filter(|c| c.spec.cluster_name == cluster)
        .filter_map(|c| Some((namespace_of(&c.metadata), c.metadata.labels.as_ref()?.get(NODEPOOL_LABEL)?.as_str())))
        .collect();
    let mut node_pools = Vec::new();
    for p in &snap.node_pools {
        // A `clusterName` pool serves its cluster whatever the namespaces, as `plan` always read it.
        if let Some(name) = &p.spec.cluster_name {
            if *name == cluster {
                node_pools.push(p.clone());
            }
            continue;
        }
        if registration.as_ref().is_some_and(|(key, labels, _)| fleet_serves(p, key, labels)) {
            node_pools.push(p.clone());
        } else if let Some(name) = p.metadata.name.as_deref()
            && with_claims.contains(&(namespace_of(&p.metadata), name))
        {
            // Departed: the copy targets no cluster, so the scheduling core never takes it as a
            // destination (a pool naming no cluster and selecting none serves nothing), while the
            // disruption view still counts its budgets on its nodes.
            let mut departed = p.clone();
            departed.spec.cluster_selector = None;
            node_pools.push(departed);
        }
    }
    let key = registration.as_ref().map(|(k, _, _)| (*k).clone()).or_else(|| {
        let pool = node_pools.iter().find(|p| p.spec.cluster_name.as_deref() == Some(cluster.as_str()))?;
        Some(ClusterKey::new(namespace_of(&pool.metadata).to_string(), cluster.clone()))
    });
    let mut snapshot = snap.clone();
    snapshot.node_pools = node_pools;
    snapshot.cluster_labels = registration.map(|(_, labels, _)| (cluster.clone(), labels)).into_iter().collect();
    Ok(Target { cluster, key, snapshot, notes })
}

/// Why `--cluster` names no cluster of the manifests, and what would make it one.
fn not_served(manifests: &Manifests, cluster: &str, served: &BTreeSet<String>) -> PlanError {
    let served =
        if served.is_empty() { "none".to_string() } else { served.iter().cloned().collect::<Vec<_>>().join(", ") };
    let registered: Vec<String> = manifests
        .clusters
        .iter()
        .filter(|(k, _)| k.name == cluster)
        .map(|(k, r)| format!("namespace {} with labels {{{}}}", k.namespace, render(&r.labels())))
        .collect();
    let registration = if registered.is_empty() {
        format!(
            "it is not registered in the manifests either: a fleet pool selects it only with its registration Secret \
             {cluster}-kubeconfig (metadata suffices) or its Cluster API Cluster"
        )
    } else {
        format!("it is registered in {}, which no clusterSelector of that namespace matches", registered.join(" and "))
    };
    PlanError::ClusterNotServed { cluster: cluster.to_string(), served, registration }
}

/// Notes for fleet pools that select no cluster the manifests register in their namespace, naming a
/// cluster of another namespace they would match (the usual mistake: a pool or a Secret written
/// without `metadata.namespace`).
fn selecting_nothing(manifests: &Manifests) -> Vec<String> {
    let mut notes = Vec::new();
    let labelled: Vec<(&ClusterKey, Labels)> = manifests.clusters.iter().map(|(k, r)| (k, r.labels())).collect();
    for p in manifests.snapshot.node_pools.iter().filter(|p| p.is_fleet()) {
        let ns = namespace_of(&p.metadata);
        let name = p.metadata.name.as_deref().unwrap_or_default();
        if labelled.iter().any(|(k, l)| fleet_serves(p, k, l)) {
            continue;
        }
        let elsewhere: Vec<String> = labelled
            .iter()
            .filter(|(k, l)| k.namespace != ns && p.selects(&k.name, l))
            .map(|(k, _)| k.to_string())
            .collect();
        let mut note = format!(
            "NodePool {ns}/{name}: its clusterSelector selects no cluster registered in namespace {ns} in the manifests \
             (registration Secrets <cluster>-kubeconfig, Cluster API Clusters): it serves none here"
        );
        if !elsewhere.is_empty() {
            note.push_str(&format!(
                "; it would match {}, but a pool serves only clusters of its own namespace (a missing \
                 metadata.namespace is default)",
                elsewhere.join(", ")
            ));
        }
        notes.push(note);
    }
    notes
}

/// `k=v,k=v`, sorted by key.
fn render(labels: &Labels) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::super::{Plan, plan, plan_disruption, read_snapshot};
    use super::*;
    use crate::commands::plan::DisruptionPlan;

    /// The credential a registration Secret's data holds in these tests: it must never come out.
    const TOKEN: &str = "s3cr3t-token-of-the-workload";

    fn docs(docs: &[Value]) -> String {
        docs.iter().map(Value::to_string).collect::<Vec<_>>().join("\n---\n")
    }

    fn manifests(docs_: &[Value]) -> Result<(Manifests, Vec<String>), PlanError> {
        read_snapshot(&[("fleet.yaml".to_string(), docs(docs_))])
    }

    fn plan_for(docs_: &[Value], cluster: Option<&str>) -> Result<Plan, PlanError> {
        let (m, notes) = manifests(docs_)?;
        plan(&m, cluster, notes)
    }

    fn pool(ns: &str, name: &str, target: Value) -> Value {
        let mut spec = json!({"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"},
            "requirements": []}}});
        spec.as_object_mut().unwrap().extend(target.as_object().unwrap().clone());
        json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodePool",
               "metadata": {"name": name, "namespace": ns}, "spec": spec})
    }

    fn fleet(ns: &str, name: &str, match_labels: Value) -> Value {
        pool(ns, name, json!({"clusterSelector": {"matchLabels": match_labels}}))
    }

    /// A registration Secret as `kubectl get secret -o yaml` prints it, kubeconfig and all.
    fn secret(ns: &str, cluster: &str, labels: Value) -> Value {
        let mut labels = labels;
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
        json!({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
               "metadata": {"name": format!("{cluster}-kubeconfig"), "namespace": ns, "labels": labels,
                            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": TOKEN}},
               "stringData": {"value": format!("users: [{{name: hub, user: {{token: {TOKEN}}}}}]")}})
    }

    fn capi_cluster(ns: &str, name: &str, labels: Value) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
               "metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {"paused": false}})
    }

    fn pending(name: &str, cpu: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop"},
               "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}}}]}})
    }

    fn claims_by_pool(p: &Plan) -> Vec<&str> {
        p.node_claims.iter().map(|c| c.node_pool.as_str()).collect()
    }

    #[test]
    fn a_fleet_pool_serves_the_cluster_its_selector_picks_by_the_secret_s_labels() {
        let prod = fleet("team", "web", json!({"env": "prod"}));
        let objects = [
            prod.clone(),
            secret("team", "paris", json!({"env": "prod"})),
            secret("team", "lyon", json!({"env": "staging"})),
            pending("a", "1"),
        ];
        let p = plan_for(&objects, None).unwrap();
        assert_eq!(p.cluster, "paris", "{p:#?}");
        assert_eq!(claims_by_pool(&p), ["web"], "{p:#?}");
        // The JSON and the table say which cluster; the fleet pool appears as any pool.
        let json: Value = serde_json::from_str(&super::super::to_json(&p)).unwrap();
        assert_eq!(
            (json["cluster"].as_str(), json["nodeClaims"][0]["nodePool"].as_str()),
            (Some("paris"), Some("web"))
        );
        assert!(super::super::to_table(&p).starts_with("Cluster paris:"), "{}", super::super::to_table(&p));
        // Only name, namespace and labels were kept: the kubeconfig and the annotation holding a
        // copy of it are nowhere in what was read, nor in the notes.
        let (m, notes) = manifests(&objects).unwrap();
        assert!(!format!("{m:?}{notes:?}").contains(TOKEN));
        let kept: Labels = [(CLUSTER_NAME_LABEL, "paris"), ("env", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(m.clusters[&ClusterKey::new("team", "paris")], Registration { secret: Some(kept), cluster: None });
        // The label is what selects: relabelled staging, paris is served by no pool any more.
        let relabelled = [prod, secret("team", "paris", json!({"env": "staging"})), pending("a", "1")];
        let p = plan_for(&relabelled, None).unwrap();
        assert_eq!((p.cluster.as_str(), p.node_claims.len()), ("", 0), "{p:#?}");
    }

    #[test]
    fn the_cluster_api_cluster_s_labels_count_and_the_secret_s_win_over_them() {
        let objects = |secret_env: &str| {
            vec![
                fleet("team", "prod-par", json!({"env": "prod", "region": "par"})),
                capi_cluster("team", "paris", json!({"env": "prod", "region": "par"})),
                secret("team", "paris", json!({"env": secret_env})),
                pending("a", "1"),
            ]
        };
        // The Secret agrees: both sources' labels are the cluster's (region only on the Cluster).
        let p = plan_for(&objects("prod"), None).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("paris", vec!["prod-par"]), "{p:#?}");
        // The Secret says staging: it wins over the Cluster's prod, and the pool no longer selects paris.
        let p = plan_for(&objects("staging"), None).unwrap();
        assert_eq!((p.cluster.as_str(), p.node_claims.len()), ("", 0), "{p:#?}");
        let (m, _) = manifests(&objects("staging")).unwrap();
        let labels = m.clusters[&ClusterKey::new("team", "paris")].labels();
        assert_eq!(labels.get("env").map(String::as_str), Some("staging"));
        assert_eq!(labels.get("region").map(String::as_str), Some("par"));
        // A Cluster alone labels a cluster too, with a note that the hub also needs the Secret.
        let alone = [objects("prod")[0].clone(), objects("prod")[1].clone(), pending("a", "1")];
        let p = plan_for(&alone, None).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("paris", vec!["prod-par"]), "{p:#?}");
        assert!(p.notes.iter().any(|n| n.contains("no registration Secret paris-kubeconfig")), "{:?}", p.notes);
    }

    #[test]
    fn a_fleet_pool_never_serves_a_cluster_of_another_namespace() {
        let objects = [
            fleet("team-b", "web", json!({"env": "prod"})),
            secret("team-a", "paris", json!({"env": "prod"})),
            pending("a", "1"),
        ];
        let p = plan_for(&objects, None).unwrap();
        assert_eq!((p.cluster.as_str(), p.node_claims.len(), p.unschedulable.len()), ("", 0, 1), "{p:#?}");
        assert!(
            p.notes.iter().any(|n| n.contains("NodePool team-b/web") && n.contains("would match team-a/paris")),
            "{:?}",
            p.notes
        );
        let e = plan_for(&objects, Some("paris")).unwrap_err().to_string();
        assert!(e.starts_with("--cluster paris: no NodePool in the manifests serves cluster paris"), "{e}");
        assert!(e.contains("namespace team-a with labels {cluster.x-k8s.io/cluster-name=paris,env=prod}"), "{e}");
        // The same pool in the Secret's namespace serves it; a missing namespace is `default` for both.
        let same = [fleet("team-a", "web", json!({"env": "prod"})), objects[1].clone(), pending("a", "1")];
        assert_eq!(plan_for(&same, None).unwrap().cluster, "paris");
        let mut unnamespaced =
            [fleet("default", "web", json!({"env": "prod"})), secret("default", "paris", json!({"env": "prod"}))];
        for o in &mut unnamespaced {
            o["metadata"].as_object_mut().unwrap().remove("namespace");
        }
        assert_eq!(plan_for(&unnamespaced, None).unwrap().cluster, "paris");
    }

    #[test]
    fn two_selected_clusters_are_ambiguous_until_cluster_picks_one() {
        let objects = [
            fleet("team", "web", json!({"env": "prod"})),
            secret("team", "paris", json!({"env": "prod"})),
            secret("team", "lyon", json!({"env": "prod"})),
            pending("a", "1"),
        ];
        let e = plan_for(&objects, None).unwrap_err();
        assert!(matches!(&e, PlanError::AmbiguousCluster(c) if c == "lyon, paris"), "{e}");
        let p = plan_for(&objects, Some("lyon")).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("lyon", vec!["web"]), "{p:#?}");
        // A cluster no pool serves and no claim is on is refused, naming the flag and the way out.
        let e = plan_for(&objects, Some("nice")).unwrap_err().to_string();
        assert!(e.contains("--cluster nice") && e.contains("(the pools serve: lyon, paris)"), "{e}");
        assert!(e.contains("nice-kubeconfig") && e.contains("spec.clusterName: nice"), "{e}");
        // The same for a clusterName pool's cluster mistyped: the rule does not depend on the pool's kind.
        let named = [pool("team", "general", json!({"clusterName": "paris"})), pending("a", "1")];
        assert!(matches!(plan_for(&named, Some("pairs")), Err(PlanError::ClusterNotServed { .. })));
        assert_eq!(plan_for(&named, Some("paris")).unwrap().cluster, "paris");
    }

    #[test]
    fn a_fleet_pool_and_a_named_pool_serve_one_cluster_together_by_weight() {
        let mut heavy = fleet("team", "web", json!({"env": "prod"}));
        heavy["spec"]["weight"] = json!(50);
        let objects = [
            pool("team", "general", json!({"clusterName": "paris"})),
            heavy,
            secret("team", "paris", json!({"env": "prod"})),
            pending("a", "1"),
        ];
        let p = plan_for(&objects, None).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("paris", vec!["web"]), "{p:#?}");
    }

    #[test]
    fn a_selector_matching_nothing_leaves_pods_pending_for_want_of_a_pool() {
        let objects = [
            fleet("team", "web", json!({"env": "prod"})),
            secret("team", "paris", json!({"env": "staging"})),
            pending("a", "1"),
        ];
        let p = plan_for(&objects, None).unwrap();
        assert_eq!(p.node_claims.len(), 0, "{p:#?}");
        assert_eq!(p.unschedulable.len(), 1, "{p:#?}");
        assert_eq!(p.unschedulable[0].reason, "no NodePool available (none is Ready for this cluster)");
        assert!(
            p.notes.iter().any(|n| n.contains("NodePool team/web: its clusterSelector selects no cluster")),
            "{:?}",
            p.notes
        );
        assert!(super::super::to_table(&p).starts_with("Cluster (no NodePool):"));
    }

    #[test]
    fn only_registration_secrets_are_read_and_a_malformed_one_names_its_field() {
        let mut misnamed = secret("team", "paris", json!({"env": "prod"}));
        misnamed["metadata"]["name"] = json!("paris-admin");
        let mut unlabelled = secret("team", "lyon", json!({}));
        unlabelled["metadata"]["labels"] = json!({"env": "prod"});
        let objects = [fleet("team", "web", json!({"env": "prod"})), misnamed, unlabelled, pending("a", "1")];
        let p = plan_for(&objects, None).unwrap();
        assert_eq!(p.cluster, "", "{p:#?}");
        assert!(p.notes.iter().any(|n| n.contains("Secret paris-admin) skipped: labelled")), "{:?}", p.notes);
        assert!(
            p.notes.iter().any(|n| n.contains("Secret lyon-kubeconfig) skipped: not a cluster registration")),
            "{:?}",
            p.notes
        );
        // A Secret of metadata alone is a registration: what a user writes not to dump credentials.
        let bare = json!({"apiVersion": "v1", "kind": "Secret",
                          "metadata": {"name": "paris-kubeconfig", "namespace": "team",
                                       "labels": {CLUSTER_NAME_LABEL: "paris", "env": "prod"}}});
        assert_eq!(plan_for(&[objects[0].clone(), bare.clone()], None).unwrap().cluster, "paris");
        let mut bad = bare;
        bad["metadata"]["labels"]["env"] = json!(3);
        let e = plan_for(&[bad], None).unwrap_err().to_string();
        assert!(e.contains("document 1 (Secret paris-kubeconfig): metadata.labels: not a map of strings"), "{e}");
    }

    #[test]
    fn a_cluster_registered_in_two_namespaces_is_refused_by_name() {
        let objects = [
            fleet("team-a", "web", json!({"env": "prod"})),
            secret("team-a", "paris", json!({"env": "prod"})),
            secret("team-b", "paris", json!({"env": "prod"})),
        ];
        let e = plan_for(&objects, None).unwrap_err().to_string();
        assert!(e.contains("cluster paris is registered in several namespaces (team-a, team-b)"), "{e}");
        // One namespace's objects plan.
        assert_eq!(plan_for(&objects[..2], None).unwrap().cluster, "paris");
    }

    // --- plan --disruption: a cluster that left a fleet pool's selection (fleet.md §2) ---

    const NOW: &str = "2026-11-25T12:00:00Z";

    fn claim(name: &str, pool: &str, cluster: &str, drift: Option<&str>) -> Value {
        let at = "2026-11-24T12:00:00Z";
        let condition = |t: &str, reason: &str| json!({"type": t, "status": "True", "reason": reason, "message": "", "lastTransitionTime": at});
        let mut conditions: Vec<Value> = ["Launched", "Registered", "Initialized", "Ready", "Consolidatable"]
            .iter()
            .map(|t| condition(t, t))
            .collect();
        conditions.extend(drift.map(|reason| condition("Drifted", reason)));
        json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
               "metadata": {"name": name, "namespace": "team", "creationTimestamp": at,
                            "labels": {"karpenter.sh/nodepool": pool, "node.kubernetes.io/instance-type": "XS"}},
               "spec": {"clusterName": cluster, "requirements": [],
                        "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}},
               "status": {"providerID": format!("clevercloud://{name}"), "nodeName": name, "conditions": conditions}})
    }

    fn node(name: &str, pool: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "creationTimestamp": "2026-11-24T12:00:00Z", "labels": {
                   "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "XS",
                   "topology.kubernetes.io/zone": "par", "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                   "karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": pool,
                   "karpenter.sh/registered": "true", "karpenter.sh/initialized": "true"}},
               "spec": {"providerID": format!("clevercloud://{name}")},
               "status": {"capacity": {"cpu": "6", "memory": "7835180Ki", "pods": "110"},
                          "allocatable": {"cpu": "6", "memory": "7835180Ki", "pods": "110"},
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn bound(name: &str, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "shop", "creationTimestamp": "2026-11-24T12:00:00Z",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f",
                                                 "uid": "uid-web-5d8f", "controller": true}]},
               "spec": {"nodeName": node, "containers": [{"name": "app", "resources": {"requests": {"cpu": "5"}}}]},
               "status": {"phase": "Running", "startTime": "2026-11-24T12:00:00Z",
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    /// Cluster lyon left fleet pool `web` (env=prod; lyon is now staging): its two nodes there are
    /// drifted ClusterNotSelected, each busy with a pod of 5 CPU; `general` serves lyon by name.
    /// `web` weighs more and budgets `nodes` at a time.
    fn departed(nodes: &str, with_general: bool) -> Vec<Value> {
        let mut web = fleet("team", "web", json!({"env": "prod"}));
        web["spec"]["weight"] = json!(100);
        web["spec"]["disruption"] = json!({"consolidateAfter": "1m", "budgets": [{"nodes": nodes}]});
        let mut objects = vec![
            web,
            secret("team", "lyon", json!({"env": "staging"})),
            claim("web-1", "web", "lyon", Some(crate::decisions::disruption_conditions::CLUSTER_NOT_SELECTED)),
            claim("web-2", "web", "lyon", Some(crate::decisions::disruption_conditions::CLUSTER_NOT_SELECTED)),
            node("web-1", "web"),
            node("web-2", "web"),
            bound("w1", "web-1"),
            bound("w2", "web-2"),
        ];
        if with_general {
            objects.push(pool("team", "general", json!({"clusterName": "lyon"})));
        }
        objects
    }

    fn disruption_for(objects: &[Value], cluster: Option<&str>) -> Result<DisruptionPlan, PlanError> {
        let (m, notes) = manifests(objects)?;
        plan_disruption(&m, cluster, Default::default(), NOW.parse().unwrap(), notes)
    }

    #[test]
    fn a_departed_fleet_pool_s_nodes_drift_within_its_budget_to_the_pools_still_serving() {
        let p = disruption_for(&departed("1", true), None).unwrap();
        assert_eq!(p.cluster, "lyon", "{p:#?}");
        let d = p.decision.as_ref().unwrap_or_else(|| panic!("no decision: {p:#?}"));
        assert_eq!((d.method.as_str(), d.reason.as_str()), ("drift", "Drifted"), "{p:#?}");
        // The departed pool's budget (one node at a time) holds: one of its two nodes goes.
        let candidates: Vec<&str> = d.candidates.iter().map(|c| c.node_claim.as_str()).collect();
        assert_eq!(candidates, ["web-1"], "{p:#?}");
        // Its replacement comes from the pool still serving lyon, never from the departed one,
        // though the departed one weighs more.
        assert!(!d.replacements.is_empty() && d.replacements.iter().all(|r| r.node_pool == "general"), "{p:#?}");
        let web = p.budgets.iter().find(|b| b.node_pool == "web").unwrap_or_else(|| panic!("{p:#?}"));
        assert_eq!((web.nodes, web.allowed["Drifted"]), (2, 1), "{p:#?}");

        // A budget of 0 on the departed pool stops the drift: nothing is disrupted, and it says why.
        let p = disruption_for(&departed("0", true), None).unwrap();
        assert!(p.decision.is_none(), "{p:#?}");
        assert!(p.methods.iter().any(|m| m.method == "drift" && m.budget_constrained), "{p:#?}");

        // Provisioning for lyon: a pod too big for the room left on web's nodes gets a general node.
        let mut objects = departed("1", true);
        objects.push(pending("big", "3"));
        let (m, notes) = manifests(&objects).unwrap();
        let p = plan(&m, None, notes).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("lyon", vec!["general"]), "{p:#?}");
        // The same when lyon is not registered in the manifests and web selects every cluster
        // (`{}`): web has nodes there but serves only registered clusters, so it takes no pod.
        for o in &mut objects {
            if o["metadata"]["name"] == "web" && o["kind"] == "NodePool" {
                o["spec"]["clusterSelector"] = json!({});
            }
        }
        objects.retain(|o| o["kind"] != "Secret");
        let (m, notes) = manifests(&objects).unwrap();
        let p = plan(&m, None, notes).unwrap();
        assert_eq!((p.cluster.as_str(), claims_by_pool(&p)), ("lyon", vec!["general"]), "{p:#?}");
    }

    #[test]
    fn a_cluster_only_a_departed_pool_has_nodes_in_is_planned_by_name_and_keeps_its_nodes() {
        let objects = departed("1", false);
        // No pool serves lyon: without --cluster there is nothing to plan for...
        assert_eq!(disruption_for(&objects, None).unwrap().cluster, "");
        // ...and --cluster lyon is accepted for its NodeClaims, with the departed pool's budget.
        let p = disruption_for(&objects, Some("lyon")).unwrap();
        assert_eq!(p.cluster, "lyon");
        assert!(p.budgets.iter().any(|b| b.node_pool == "web" && b.nodes == 2), "{p:#?}");
        // Nothing replaces the busy nodes, so they are left in place (fleet.md §2).
        assert!(p.decision.is_none(), "{p:#?}");
    }
}
