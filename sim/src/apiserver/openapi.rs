//! The minimal OpenAPI documents kubectl needs: `/openapi/v2` (an empty document, so client-side
//! schema validation finds no schema and defers to the server) and `/openapi/v3` (a root index and
//! per-group-version documents whose PATCH operations declare the `fieldValidation` parameter, so
//! `kubectl apply` validates server-side with `fieldValidation=Strict`). No schemas are published:
//! kubectl then computes client-side apply patches from its compiled-in types (built-in kinds) or
//! as JSON merge patches (custom resources), as it does for any server without schemas.
//! Must not do: validation (the store and `sim::schema` do it).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::resources::{Registry, Resource};

/// The `/openapi/v3` index.
pub(crate) fn v3_root(reg: &Registry, rv: u64) -> Value {
    let mut paths = BTreeMap::new();
    for r in reg.by_gvr.values() {
        let p = gv_path(&r.group, &r.version);
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={rv:016X}")}));
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
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-sim"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// `/openapi/v2` as JSON (kubectl asks for protobuf, which gets an empty document).
pub(crate) fn v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0-sim"}, "paths": {}, "definitions": {}})
}
