//! The resource registry: which kinds the emulator serves (built-in ones and those of CRDs posted
//! at run time), with the facts the server needs about each (scope, subresources, generation,
//! selectable fields, printer columns, CRD schemas).
//! Must not do: storage or HTTP.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::schema::CrdSchema;

/// An additional printer column (`kubectl get`).
#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub name: String,
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    /// A JSONPath for CRD columns; `None` for built-in columns computed in code.
    pub json_path: Option<String>,
}

/// One served resource (all versions of a CRD share the storage, keyed by group and plural).
#[derive(Debug)]
pub(crate) struct Resource {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources served (`status`, `binding`, `eviction`, `scale`, `token`).
    pub subresources: Vec<String>,
    /// Whether `metadata.generation` is maintained.
    pub generation: bool,
    /// Extra fields usable in field selectors besides metadata.name/namespace.
    pub selectable: Vec<String>,
    /// Printer columns of a CRD version (empty: built-in rules or Name/Age).
    pub columns: Vec<Column>,
    /// CRD schema for the main resource and the one used to validate `/status` writes.
    pub schema: Option<Arc<CrdSchema>>,
    pub status_schema: Option<Arc<CrdSchema>>,
    /// The CRD version's `openAPIV3Schema` as posted, for `/openapi/v3` (`kubectl explain`).
    pub openapi_schema: Option<Arc<Value>>,
    /// Name of the CRD that defines this resource.
    pub crd: Option<String>,
    /// The scale subresource's (specReplicasPath, statusReplicasPath, labelSelectorPath).
    pub scale: Option<(String, String, Option<String>)>,
}

impl Resource {
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `pods` or `nodepools.karpenter.clever-cloud.com`, as in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Storage key. events.k8s.io Events are core/v1 Events in storage, as in kube-apiserver.
    pub fn key(&self) -> (String, String) {
        if super::events::is_events_v1(self) {
            return (String::new(), self.plural.clone());
        }
        (self.group.clone(), self.plural.clone())
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    }
}

struct B {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    sub: &'static [&'static str],
    generation: bool,
    selectable: &'static [&'static str],
}

const BUILTINS: &[B] = &[
    B {
        group: "",
        version: "v1",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
        sub: &["status", "finalize"],
        generation: false,
        selectable: &["status.phase"],
    },
    B {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
        sub: &["status", "binding", "eviction"],
        // Since Kubernetes 1.34 (PodObservedGenerationTracking).
        generation: true,
        selectable: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    B {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        short: &["no"],
        sub: &["status"],
        generation: false,
        selectable: &["spec.unschedulable"],
    },
    B {
        group: "",
        version: "v1",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &["type"],
    },
    B {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        short: &["cm"],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "",
        version: "v1",
        plural: "podtemplates",
        kind: "PodTemplate",
        namespaced: true,
        short: &[],
        sub: &[],
        generation: true,
        selectable: &[],
    },
    B {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        kind: "ServiceAccount",
        namespaced: true,
        short: &["sa"],
        sub: &["token"],
        generation: false,
        selectable: &[],
    },
    B {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        short: &["ev"],
        sub: &[],
        generation: false,
        selectable: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    },
    B {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        short: &["pvc"],
        sub: &["status"],
        generation: false,
        selectable: &[],
    },
    B {
        group: "",
        version: "v1",
        plural: "services",
        kind: "Service",
        namespaced: true,
        short: &["svc"],
        sub: &["status"],
        generation: false,
        selectable: &[],
    },
    B {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        kind: "DaemonSet",
        namespaced: true,
        short: &["ds"],
        sub: &["status"],
        generation: true,
        selectable: &[],
    },
    B {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
        short: &["pdb"],
        sub: &["status"],
        generation: true,
        selectable: &[],
    },
    B {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        short: &["ev"],
        sub: &[],
        generation: false,
        selectable: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
    },
    B {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        kind: "Role",
        namespaced: true,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        kind: "RoleBinding",
        namespaced: true,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        kind: "ClusterRole",
        namespaced: false,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "storage.k8s.io",
        version: "v1",
        plural: "storageclasses",
        kind: "StorageClass",
        namespaced: false,
        short: &["sc"],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    // What a node's termination waits for before its instance goes (the hub's volume step).
    B {
        group: "storage.k8s.io",
        version: "v1",
        plural: "volumeattachments",
        kind: "VolumeAttachment",
        namespaced: false,
        short: &[],
        sub: &["status"],
        generation: true,
        selectable: &[],
    },
    // A node's CSI drivers and their attach limits (the hub's provisioning reads them).
    B {
        group: "storage.k8s.io",
        version: "v1",
        plural: "csinodes",
        kind: "CSINode",
        namespaced: false,
        short: &[],
        sub: &[],
        generation: false,
        selectable: &[],
    },
    B {
        group: "",
        version: "v1",
        plural: "persistentvolumes",
        kind: "PersistentVolume",
        namespaced: false,
        short: &["pv"],
        sub: &["status"],
        generation: false,
        selectable: &[],
    },
    B {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        short: &["crd", "crds"],
        sub: &["status"],
        generation: true,
        selectable: &[],
    },
];

/// Resources by (group, version, plural).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub by_gvr: BTreeMap<(String, String, String), Arc<Resource>>,
}

impl Registry {
    pub fn builtin() -> Registry {
        let mut r = Registry::default();
        for b in BUILTINS {
            r.insert(Resource {
                group: b.group.into(),
                version: b.version.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                kind: b.kind.into(),
                namespaced: b.namespaced,
                short_names: b.short.iter().map(|s| s.to_string()).collect(),
                categories: if matches!(b.plural, "pods" | "daemonsets") { vec!["all".into()] } else { vec![] },
                subresources: b.sub.iter().map(|s| s.to_string()).collect(),
                generation: b.generation,
                selectable: b.selectable.iter().map(|s| s.to_string()).collect(),
                columns: Vec::new(),
                schema: None,
                status_schema: None,
                openapi_schema: None,
                crd: None,
                scale: None,
            });
        }
        r
    }

    pub fn insert(&mut self, r: Resource) {
        self.by_gvr.insert((r.group.clone(), r.version.clone(), r.plural.clone()), Arc::new(r));
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        self.by_gvr.get(&(group.to_string(), version.to_string(), plural.to_string())).cloned()
    }

    /// Any served version of (group, plural).
    pub fn any_version(&self, group: &str, plural: &str) -> Option<Arc<Resource>> {
        self.by_gvr.values().find(|r| r.group == group && r.plural == plural).cloned()
    }

    /// Removes every version served by the CRD `name`.
    pub fn remove_crd(&mut self, name: &str) {
        self.by_gvr.retain(|_, r| r.crd.as_deref() != Some(name));
    }

    /// Compiles every served version of `crd` into resources (errors as the apiserver words them).
    pub fn from_crd(crd: &CustomResourceDefinition) -> Result<Vec<Resource>, Vec<String>> {
        let spec = &crd.spec;
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut errs = Vec::new();
        let expected = format!("{}.{}", spec.names.plural, spec.group);
        if name != expected {
            errs.push(format!("metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"));
        }
        let storage = spec.versions.iter().filter(|v| v.storage).count();
        if storage != 1 {
            errs.push(format!(
                "spec.versions: Invalid value: []apiextensions.CustomResourceDefinitionVersion{{...}}: must have exactly one version marked as storage version (found {storage})"
            ));
        }
        let mut out = Vec::new();
        for v in spec.versions.iter().filter(|v| v.served) {
            let schema = match CrdSchema::compile(crd, &v.name) {
                Ok(s) => s,
                Err(e) => {
                    errs.extend(e);
                    continue;
                }
            };
            // Status writes are validated against a copy without the status subresource, so that
            // the status is kept and checked; the server restores spec and metadata itself.
            let mut no_status = crd.clone();
            for nv in &mut no_status.spec.versions {
                if let Some(s) = nv.subresources.as_mut() {
                    s.status = None;
                }
            }
            let status_schema = CrdSchema::compile(&no_status, &v.name).ok();
            let mut subresources = Vec::new();
            if let Some(s) = &v.subresources {
                if s.status.is_some() {
                    subresources.push("status".to_string());
                }
                if s.scale.is_some() {
                    subresources.push("scale".to_string());
                }
            }
            let columns = match &v.additional_printer_columns {
                Some(cols) if !cols.is_empty() => cols
                    .iter()
                    .map(|c| Column {
                        name: c.name.clone(),
                        ty: c.type_.clone(),
                        format: c.format.clone().unwrap_or_default(),
                        // kube-apiserver's wording when the CRD gives none.
                        description: c.description.clone().filter(|d| !d.is_empty()).unwrap_or_else(|| {
                            format!("Custom resource definition column (in JSONPath format): {}", c.json_path)
                        }),
                        priority: c.priority.map(i64::from).unwrap_or(0),
                        json_path: Some(c.json_path.clone()),
                    })
                    .collect(),
                _ => vec![Column {
                    name: "Age".into(),
                    ty: "date".into(),
                    format: String::new(),
                    description: "Custom resource definition column (in JSONPath format): .metadata.creationTimestamp"
                        .into(),
                    priority: 0,
                    json_path: Some(".metadata.creationTimestamp".into()),
                }],
            };
            let selectable =
                v.selectable_fields.iter().flatten().map(|f| f.json_path.trim_start_matches('.').to_string()).collect();
            out.push(Resource {
                group: spec.group.clone(),
                version: v.name.clone(),
                plural: spec.names.plural.clone(),
                singular: spec.names.singular.clone().unwrap_or_else(|| spec.names.kind.to_lowercase()),
                kind: spec.names.kind.clone(),
                namespaced: spec.scope == "Namespaced",
                short_names: spec.names.short_names.clone().unwrap_or_default(),
                categories: spec.names.categories.clone().unwrap_or_default(),
                subresources,
                generation: true,
                selectable,
                columns,
                schema: Some(Arc::new(schema)),
                status_schema: status_schema.map(Arc::new),
                openapi_schema: v
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .and_then(|s| serde_json::to_value(s).ok())
                    .map(Arc::new),
                crd: Some(name.clone()),
                scale: v.subresources.as_ref().and_then(|s| s.scale.as_ref()).map(|s| {
                    (s.spec_replicas_path.clone(), s.status_replicas_path.clone(), s.label_selector_path.clone())
                }),
            });
        }
        if errs.is_empty() { Ok(out) } else { Err(errs) }
    }
}

/// Reads a field by dotted path (`spec.nodeName`) as a string, the way field selectors see it
/// (missing → `""`, booleans and numbers formatted).
pub(crate) fn field_string(obj: &Value, path: &str) -> String {
    if path == "source" && obj.get("source").is_none_or(Value::is_object) {
        // An Event's `source` selector: its component, else the reporting controller (kube's
        // event strategy), so Events written through events.k8s.io/v1 match by reporter.
        let component = field_string(obj, "source.component");
        return if component.is_empty() { field_string(obj, "reportingComponent") } else { component };
    }
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
