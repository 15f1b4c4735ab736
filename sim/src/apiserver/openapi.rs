//! The OpenAPI documents kubectl reads: `/openapi/v2` (an empty document, so client-side schema
//! validation finds no schema and defers to the server) and `/openapi/v3` (a root index and
//! per-group-version documents whose PATCH operations declare the `fieldValidation` parameter, so
//! `kubectl apply` validates server-side with `fieldValidation=Strict`). Custom resources get
//! their CRD version's schema as kube-apiserver publishes it (`com.example.v1.Kind`, with
//! `apiVersion`, `kind`, `metadata` → ObjectMeta, and the List kind), which is what
//! `kubectl explain nodepool.spec` renders. Built-in kinds get no schema: kubectl then computes
//! client-side apply patches from its compiled-in types, as for any server without schemas.
//! Must not do: validation (the store and `sim::schema` do it).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::resources::{Registry, Resource};

/// The `/openapi/v3` index. Each URL carries a hash of its document, as kube-apiserver's do, so
/// that kubectl's cache (keyed by URL) is reused until a CRD changes the document.
pub(crate) fn v3_root(reg: &Registry) -> Value {
    use std::hash::{Hash, Hasher};
    let mut paths = BTreeMap::new();
    for r in reg.by_gvr.values() {
        let p = gv_path(&r.group, &r.version);
        if paths.contains_key(&p) {
            continue;
        }
        // A fixed-key SipHash: the same document always gets the same hash.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        v3_group_version(reg, &r.group, &r.version).map(|d| d.to_string()).hash(&mut h);
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={:016X}", h.finish())}));
    }
    json!({"paths": paths})
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// The `/openapi/v3/api/v1` or `/openapi/v3/apis/<g>/<v>` document, or `None` if not served.
pub(crate) fn v3_group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let rs: Vec<&Arc<Resource>> = reg.by_gvr.values().filter(|r| r.group == group && r.version == version).collect();
    if rs.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for r in rs {
        let prefix = format!("/{}", gv_path(group, version));
        let item = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let mut content = serde_json::Map::new();
        let mut types =
            vec!["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"];
        if r.schema.is_none() {
            types.push("application/strategic-merge-patch+json");
        }
        for t in types {
            content.insert(t.into(), json!({"schema": {"type": "object"}}));
        }
        let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force", "pretty"]
            .iter()
            .map(|n| json!({"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
            .collect();
        paths.insert(
            item,
            json!({
                "get": {"operationId": format!("read{}", r.kind), "x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}},
                "put": {"operationId": format!("replace{}", r.kind), "x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}},
                "patch": {
                    "operationId": format!("patch{}", r.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "requestBody": {"content": content, "required": true},
                    "responses": {"200": {"description": "OK"}}
                },
                "parameters": params,
            }),
        );
    }
    let mut schemas = serde_json::Map::new();
    for r in reg.by_gvr.values().filter(|r| r.group == group && r.version == version) {
        if let Some(schema) = &r.openapi_schema {
            let name = schema_name(&r.group, &r.version, &r.kind);
            schemas.insert(format!("{name}List"), list_schema(r, &name));
            schemas.insert(name, object_schema(r, schema));
        }
    }
    if !schemas.is_empty() {
        schemas.extend(meta_schemas());
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-sim"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// kube-apiserver's name of a custom resource's schema: the group reversed, then version and
/// kind (`karpenter.clever-cloud.com` → `com.clever-cloud.karpenter.v1alpha1.NodePool`).
fn schema_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn reference(name: &str, description: &str) -> Value {
    json!({"description": description, "allOf": [{"$ref": format!("#/components/schemas/{name}")}]})
}

const API_VERSION_DOC: &str = "The versioned schema of this representation of an object (group/version).";
const KIND_DOC: &str = "The REST resource this object represents, in CamelCase.";

/// The CRD's schema with the standard fields kube-apiserver sets: `apiVersion`, `kind`,
/// `metadata` (ObjectMeta, whatever the CRD says of it) and the group-version-kind extension.
fn object_schema(r: &Resource, crd_schema: &Value) -> Value {
    let mut s = crd_schema.clone();
    if !s.is_object() {
        s = json!({});
    }
    s["type"] = json!("object");
    s["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "kind": r.kind, "version": r.version}]);
    if !s["properties"].is_object() {
        s["properties"] = json!({});
    }
    s["properties"]["apiVersion"] = json!({"description": API_VERSION_DOC, "type": "string"});
    s["properties"]["kind"] = json!({"description": KIND_DOC, "type": "string"});
    s["properties"]["metadata"] = reference(
        &format!("{META}.ObjectMeta"),
        "Standard object's metadata: name, namespace, labels, annotations, owners, finalizers.",
    );
    s
}

fn list_schema(r: &Resource, item: &str) -> Value {
    json!({
        "description": format!("{}List is a list of {}", r.kind, r.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": API_VERSION_DOC, "type": "string"},
            "kind": {"description": KIND_DOC, "type": "string"},
            "items": {
                "description": format!("List of {}.", r.plural),
                "type": "array",
                "items": {"$ref": format!("#/components/schemas/{item}")},
            },
            "metadata": reference(&format!("{META}.ListMeta"), "Standard list metadata."),
        },
        "x-kubernetes-group-version-kind": [{"group": r.group, "kind": format!("{}List", r.kind), "version": r.version}],
    })
}

/// ObjectMeta and the types it refers to, as far as `kubectl explain <kind>.metadata` walks.
fn meta_schemas() -> serde_json::Map<String, Value> {
    let string = |d: &str| json!({"description": d, "type": "string"});
    let map = |d: &str| json!({"description": d, "type": "object", "additionalProperties": {"type": "string", "default": ""}});
    let time = |d: &str| reference(&format!("{META}.Time"), d);
    let object_meta = json!({
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object",
        "properties": {
            "annotations": map("Unstructured key-value data stored with the object, not used to select it."),
            "creationTimestamp": time("When the server created the object (set by the server, read-only)."),
            "deletionGracePeriodSeconds": {"description": "Seconds the object has to terminate once deletionTimestamp is set (read-only).", "type": "integer", "format": "int64"},
            "deletionTimestamp": time("When the object will be deleted; set by the server when deletion is requested (read-only)."),
            "finalizers": {"description": "Entries that must be removed before the object is deleted.", "type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set"},
            "generateName": string("Prefix of a name the server generates when name is empty."),
            "generation": {"description": "Sequence number of the desired state (set by the server, read-only).", "type": "integer", "format": "int64"},
            "labels": map("Key-value pairs used to organize and select objects."),
            "managedFields": {"description": "Which field manager owns which fields (server-side apply).", "type": "array", "items": {"$ref": format!("#/components/schemas/{META}.ManagedFieldsEntry")}},
            "name": string("Name must be unique within a namespace. Required when creating, unless generateName is set. Cannot be updated."),
            "namespace": string("The namespace the object belongs to. Cannot be updated."),
            "ownerReferences": {"description": "Objects this object depends on; it is garbage-collected when all of them are gone.", "type": "array", "items": {"$ref": format!("#/components/schemas/{META}.OwnerReference")}, "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map"},
            "resourceVersion": string("Opaque version of the object, for optimistic concurrency and watches (read-only)."),
            "selfLink": string("Deprecated; not set."),
            "uid": string("Unique identifier of the object over time (set by the server, read-only)."),
        },
    });
    let owner = json!({
        "description": "OwnerReference names an object this one depends on.",
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": string("API version of the owner."),
            "blockOwnerDeletion": {"description": "Whether the owner's foreground deletion waits for this object.", "type": "boolean"},
            "controller": {"description": "Whether the owner is the managing controller.", "type": "boolean"},
            "kind": string("Kind of the owner."),
            "name": string("Name of the owner."),
            "uid": string("UID of the owner."),
        },
        "x-kubernetes-map-type": "atomic",
    });
    let managed = json!({
        "description": "ManagedFieldsEntry records which fields a field manager owns.",
        "type": "object",
        "properties": {
            "apiVersion": string("Version of the resource the fields are given in."),
            "fieldsType": string("Format of fieldsV1 (always FieldsV1)."),
            "fieldsV1": reference(&format!("{META}.FieldsV1"), "The fields owned."),
            "manager": string("Name of the field manager."),
            "operation": string("Apply or Update."),
            "subresource": string("The subresource written, if any."),
            "time": time("When the fields were last changed."),
        },
    });
    let list_meta = json!({
        "description": "ListMeta is the metadata of a list.",
        "type": "object",
        "properties": {
            "continue": string("Token for the next page of a chunked list."),
            "remainingItemCount": {"description": "Items left after this page, when known.", "type": "integer", "format": "int64"},
            "resourceVersion": string("Version of the list, for watches."),
            "selfLink": string("Deprecated; not set."),
        },
    });
    let mut m = serde_json::Map::new();
    m.insert(format!("{META}.ObjectMeta"), object_meta);
    m.insert(format!("{META}.OwnerReference"), owner);
    m.insert(format!("{META}.ManagedFieldsEntry"), managed);
    m.insert(format!("{META}.ListMeta"), list_meta);
    m.insert(
        format!("{META}.FieldsV1"),
        json!({"description": "FieldsV1 is a set of fields as a JSON trie.", "type": "object"}),
    );
    m.insert(
        format!("{META}.Time"),
        json!({"description": "An RFC 3339 date and time, in UTC.", "type": "string", "format": "date-time"}),
    );
    m
}

/// `/openapi/v2` as JSON (kubectl asks for protobuf, which gets an empty document).
pub(crate) fn v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0-sim"}, "paths": {}, "definitions": {}})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn document_hashes_change_only_with_the_document() {
        let mut reg = Registry::builtin();
        let before = v3_root(&reg);
        assert_eq!(before, v3_root(&reg), "the same registry, the same hashes");
        for file in crds::crd::hub_crds() {
            for r in Registry::from_crd(&file.crd).unwrap() {
                reg.insert(r);
            }
        }
        let after = v3_root(&reg);
        assert_eq!(after["paths"]["api/v1"], before["paths"]["api/v1"]);
        let url = after["paths"]["apis/karpenter.clever-cloud.com/v1alpha1"]["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with("/openapi/v3/apis/karpenter.clever-cloud.com/v1alpha1?hash="), "{url}");
        let doc = v3_group_version(&reg, "karpenter.clever-cloud.com", "v1alpha1").unwrap();
        let pool = &doc["components"]["schemas"]["com.clever-cloud.karpenter.v1alpha1.NodePool"];
        assert_eq!(pool["properties"]["spec"]["properties"]["clusterName"]["type"], "string");
        assert!(doc["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"].is_object());
        // Built-in kinds publish no schema (kubectl falls back to its compiled-in types).
        assert_eq!(v3_group_version(&reg, "", "v1").unwrap()["components"]["schemas"], json!({}));
    }
}
