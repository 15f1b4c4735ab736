//! Applying ordinary manifests to a cluster: create, or merge onto what exists. Used by the
//! sandbox (examples), `register` (the workload-side RBAC) and tests.
//!
//! Owns: kind → API mapping for the kinds the project ships. Must not: delete or replace what a
//! user changed beyond the fields the manifest sets (a merge patch, never a replace).

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use k8s_openapi::api::core::v1::Namespace;

use crate::infra::errors::{ApiError, Step, StepExt};

/// Why a manifest could not be applied; names the file and the object.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error("{file}: {kind} {name} was refused: {message}")]
    Refused { file: String, kind: String, name: String, message: String },
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// Kinds without a namespace among those the project ships.
pub fn is_cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "Node"
            | "NodeGroup"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "CustomResourceDefinition"
            | "ValidatingWebhookConfiguration"
    )
}

/// Create the namespace unless it exists.
pub async fn ensure_namespace(client: &Client, ns: &str) -> Result<(), ManifestError> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(ns).await.step(Step::ReadNamespace)?.is_none() {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap_or_default();
        match api.create(&PostParams::default(), &obj).await {
            // Created meanwhile by someone else: fine.
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(Step::CreateNamespace.failed(e).into()),
        }
    }
    Ok(())
}

/// Create or merge one object given as JSON, in `ns` when the kind is namespaced.
pub async fn apply_value(client: &Client, doc: &Value, ns: &str, file: &str) -> Result<(), ManifestError> {
    let bad = |m: &str| ManifestError::Invalid { file: file.to_string(), message: m.to_string() };
    let api_version =
        doc.get("apiVersion").and_then(Value::as_str).ok_or_else(|| bad("a document has no apiVersion"))?;
    let kind = doc.get("kind").and_then(Value::as_str).ok_or_else(|| bad("a document has no kind"))?;
    let name =
        doc.pointer("/metadata/name").and_then(Value::as_str).ok_or_else(|| bad("a document has no metadata.name"))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = if is_cluster_scoped(kind) {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), ns, &ar)
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).map_err(|e| bad(&format!("{kind} {name}: {e}")))?;
    let refused = |message: String| ManifestError::Refused {
        file: file.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        message,
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            match api.patch(name, &PatchParams::default(), &Patch::Merge(doc)).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) => Err(refused(s.message)),
                Err(e) => Err(Step::MergeObject.failed(e).into()),
            }
        }
        Err(kube::Error::Api(s)) => Err(refused(s.message)),
        Err(e) => Err(Step::CreateObject.failed(e).into()),
    }
}

/// The documents of a multi-document YAML text (empty documents skipped).
pub fn documents(file: &str, text: &str) -> Result<Vec<Value>, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ManifestError::Invalid { file: file.to_string(), message: e.to_string() })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}
