//! `server::handlers`: a request on a resource path: the verb and subresource it is, its query
//! (selectors, pages, `dryRun`, `fieldValidation`, grace and propagation), the store operation it
//! calls under the lock, injected conflicts, and the answer (object, list, Table, Status, Scale).
//!
//! Owns: the mapping from HTTP to store operations. Must not: decide what a write does (the store
//! and `behaviour` do) or stream watches (`watch`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::ResPath;
use super::render::{
    deleted_status, json_response, list_response, parse_body, partial, present, wants_metadata, with_warnings,
};
use super::watch::watch;
use crate::apiserver::object::Stored;
use crate::apiserver::patch::PatchType;
use crate::apiserver::resources::Resource;
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::{self, ApiError};
use crate::apiserver::store::{DeleteOptions, Sub, meta_str};
use crate::apiserver::{Shared, events, lock, table};

/// Answers a request on the resource path `p` of `res` (`verb` as audit logs name it; `table`:
/// the client asked for a Table; `exempt`: no injected fault applies).
#[allow(clippy::too_many_arguments)]
pub(super) async fn resource_request(
    shared: &Arc<Shared>,
    res: &Arc<Resource>,
    p: &ResPath,
    verb: &str,
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
    table: bool,
    exempt: bool,
) -> Result<Response, ApiError> {
    let ns = p.ns.as_deref();
    let name = p.name.as_deref().unwrap_or("");
    let dry_run = q.contains_key("dryRun");
    let faulty = !exempt && !dry_run;
    if faulty && let Some(e) = injected_conflict(shared, res, p, verb) {
        return Err(e);
    }
    let sub = match p.sub.as_deref() {
        None => Sub::Main,
        Some("status") if res.has_status() => Sub::Status,
        Some(s) if res.subresources.iter().any(|x| x == s) => Sub::Main,
        Some(_) => return Err(ApiError::not_found_path()),
    };
    let now = shared.clock.now();
    // fieldValidation=Strict: unknown fields of a custom resource are a 400 (kube-apiserver's
    // "strict decoding error"); built-in kinds are not checked (no schemas here).
    if q.get("fieldValidation").is_some_and(|v| v == "Strict")
        && let Some(schema) = &res.schema
        && matches!(verb, "create" | "update" | "patch")
        && p.sub.is_none()
        && let Ok(v) = serde_json::from_slice::<Value>(body)
        && v.is_object()
    {
        let unknown = schema.unknown_fields(&v);
        if !unknown.is_empty() {
            let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                list.join(", "),
                kind = res.kind,
                version = res.version
            )));
        }
    }
    // Unknown fields of a built-in kind: dropped with a warning, or refused when Strict.
    let field_validation = q.get("fieldValidation").map_or("Warn", String::as_str);
    let check_builtin = |v: &mut Value| -> Result<Vec<String>, ApiError> {
        if res.schema.is_some() || p.sub.is_some() || field_validation == "Ignore" {
            return Ok(Vec::new());
        }
        let Some(unknown) = crate::apiserver::builtin::unknown_fields(res, v) else { return Ok(Vec::new()) };
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        if field_validation == "Strict" {
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                list.join(", "),
                kind = res.kind,
                version = res.version
            )));
        }
        crate::apiserver::builtin::prune(v, &unknown);
        Ok(list)
    };
    let metadata_only = wants_metadata(headers);
    let render_one = |obj: &Arc<Value>, code: u16| -> Response {
        let obj = present(res, obj);
        if metadata_only {
            json_response(code, &partial(&obj))
        } else if table {
            let meta = json!({"resourceVersion": meta_str(&obj, "resourceVersion")});
            json_response(
                code,
                &table::table(res, &[obj], meta, true, q.get("includeObject").map_or("", String::as_str), now),
            )
        } else {
            json_response(code, &obj)
        }
    };
    match (verb, p.sub.as_deref()) {
        ("watch", _) => Ok(watch(shared.clone(), res.clone(), p, q, table, metadata_only, exempt)),
        ("get", None) | ("get", Some("status")) => {
            let obj = lock(&shared.store).get(res, ns.unwrap_or(""), name)?;
            Ok(render_one(&obj, 200))
        }
        ("list", _) => {
            let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?;
            let fields = field_selector(res, q)?;
            let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
            let st = lock(&shared.store);
            let list = st.list(res, ns, &labels, &fields, limit, q.get("continue").map(String::as_str))?;
            drop(st);
            let mut meta = json!({"resourceVersion": list.rv.to_string()});
            if let Some(c) = &list.continue_token {
                meta["continue"] = json!(c);
            }
            if let Some(r) = list.remaining {
                meta["remainingItemCount"] = json!(r);
            }
            if table {
                let items: Vec<Arc<Value>> = list.items.iter().map(|o| present(res, &Arc::new(o.value()))).collect();
                let t = table::table(res, &items, meta, true, q.get("includeObject").map_or("", String::as_str), now);
                return Ok(json_response(200, &t));
            }
            if metadata_only {
                let items: Vec<Value> = list.items.iter().map(|o| partial(&o.value())).collect();
                return Ok(json_response(
                    200,
                    &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
                ));
            }
            Ok(list_response(res, &list.items, &meta))
        }
        ("create", None) => {
            let mut obj = parse_body(body, false)?;
            let mut warnings = check_builtin(&mut obj)?;
            let named = meta_str(&obj, "name").is_some_and(|n| !n.is_empty());
            let mut st = write_store(shared, dry_run);
            let (o, w) = st.create(res, ns, obj)?;
            drop(st);
            if faulty && named && shared.faults.injected_conflict(verb, &p.plural) {
                return Err(ApiError::already_exists(res, meta_str(&o, "name").unwrap_or("")));
            }
            warnings.extend(w);
            Ok(with_warnings(render_one(&o, 201), &warnings))
        }
        ("create", Some("binding")) => {
            let b = parse_body(body, false)?;
            write_store(shared, dry_run).bind(ns.unwrap_or(""), name, &b)?;
            Ok(json_response(201, &status::success(201)))
        }
        ("create", Some("eviction")) => {
            let b = parse_body(body, false)?;
            write_store(shared, dry_run).evict(ns.unwrap_or(""), name, &b)?;
            Ok(json_response(201, &status::success(201)))
        }
        ("create", Some("token")) => {
            let b = parse_body(body, false)?;
            let out = lock(&shared.store).token_request(res, ns, name, &b, now)?;
            Ok(json_response(201, &out))
        }
        ("get", Some("scale")) => {
            let obj = lock(&shared.store).get(res, ns.unwrap_or(""), name)?;
            Ok(json_response(200, &to_scale(res, &obj)))
        }
        ("update", Some("scale")) | ("patch", Some("scale")) => {
            let mut st = write_store(shared, dry_run);
            let obj = st.get(res, ns.unwrap_or(""), name)?;
            let mut scale = to_scale(res, &obj);
            let body_v = parse_body(body, false)?;
            if verb == "update" {
                scale = body_v;
            } else {
                let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
                match PatchType::from_content_type(ct) {
                    Some(PatchType::Json) => crate::apiserver::patch::json_patch(&mut scale, &body_v)
                        .map_err(|_| ApiError::json_patch_failed())?,
                    Some(_) => crate::apiserver::patch::merge_patch(&mut scale, &body_v),
                    None => return Err(ApiError::unknown_patch_type()),
                }
            }
            let replicas = scale.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0);
            let Some((spec_path, _, _)) = &res.scale else { return Err(ApiError::not_found_path()) };
            let mut next = (*obj).clone();
            set_path(&mut next, spec_path, json!(replicas));
            if let Some(rv) = scale.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                next["metadata"]["resourceVersion"] = json!(rv);
            }
            let (o, w) = st.update(res, ns, name, next, Sub::Main)?;
            drop(st);
            Ok(with_warnings(json_response(200, &to_scale(res, &o)), &w))
        }
        ("update", None) | ("update", Some("status")) | ("update", Some("finalize")) => {
            let mut obj = parse_body(body, false)?;
            let mut warnings = check_builtin(&mut obj)?;
            let mut st = write_store(shared, dry_run);
            let (o, w) = st.update(res, ns, name, obj, sub)?;
            drop(st);
            warnings.extend(w);
            Ok(with_warnings(render_one(&o, 200), &warnings))
        }
        ("patch", None) | ("patch", Some("status")) => {
            let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let ty = PatchType::from_content_type(ct).ok_or_else(ApiError::unknown_patch_type)?;
            if ty == PatchType::Apply && !q.contains_key("fieldManager") {
                return Err(ApiError {
                    details: Some(json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{
                        "reason": "FieldValueRequired",
                        "message": "Required value: is required for apply patch",
                        "field": "fieldManager"
                    }]})),
                    ..ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    )
                });
            }
            let mut patch = parse_body(body, ty == PatchType::Apply)?;
            let mut warnings = if ty == PatchType::Json { Vec::new() } else { check_builtin(&mut patch)? };
            let mut st = write_store(shared, dry_run);
            let (o, w, created) = st.patch(res, ns, name, ty, &patch, sub)?;
            drop(st);
            warnings.extend(w);
            Ok(with_warnings(render_one(&o, if created { 201 } else { 200 }), &warnings))
        }
        ("delete", None) => {
            let raw = if body.is_empty() { json!({}) } else { parse_body(body, false)? };
            // DeleteOptions may carry dryRun in the body.
            let dry_run = dry_run || raw.get("dryRun").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
            let mut opts = DeleteOptions::from_value(&raw);
            if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                opts.grace_period = Some(g);
            }
            if let Some(pp) = q.get("propagationPolicy") {
                opts.propagation = Some(pp.clone());
            }
            let o = write_store(shared, dry_run).delete(res, ns, name, &opts)?;
            Ok(match deleted_status(res, &o) {
                Some(status) => json_response(200, &status),
                None => render_one(&o, 200),
            })
        }
        ("deletecollection", None) => {
            let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
                .map_err(ApiError::bad_request)?;
            let fields = field_selector(res, q)?;
            let mut st = write_store(shared, dry_run);
            let list = st.list(res, ns, &labels, &fields, None, None)?;
            let mut deleted = Vec::new();
            for o in &list.items {
                let n = o.sum.name.clone();
                let ons = Some(o.sum.namespace.clone()).filter(|n| !n.is_empty());
                if let Ok(d) = st.delete(res, ons.as_deref(), &n, &DeleteOptions::default()) {
                    deleted.push(d);
                }
            }
            let rv = st.rv;
            drop(st);
            let deleted: Vec<Arc<Stored>> = deleted.iter().map(|d| Arc::new(Stored::new(d, &[]))).collect();
            Ok(list_response(res, &deleted, &json!({"resourceVersion": rv.to_string()})))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The `409 Conflict` an injected conflict answers to an update, patch or delete of an existing
/// object (its main resource, `status` or `scale`), unapplied: what kube-apiserver says to a write
/// that lost a race. Creates are handled where they are stored (`AlreadyExists` after the write).
fn injected_conflict(shared: &Shared, res: &Resource, p: &ResPath, verb: &str) -> Option<ApiError> {
    if !matches!(verb, "update" | "patch" | "delete") || !matches!(p.sub.as_deref(), None | Some("status" | "scale")) {
        return None;
    }
    let name = p.name.as_deref()?;
    // A missing object is a 404 on a real server, never a conflict.
    lock(&shared.store).lookup(res, p.ns.as_deref().unwrap_or(""), name)?;
    shared.faults.injected_conflict(verb, &p.plural).then(|| ApiError::stale(res, name))
}

/// The store locked for a write; with `dry_run` (a `dryRun=All` request) the write is computed and
/// validated but not stored. The flag is cleared when the guard drops.
struct WriteGuard<'a>(std::sync::MutexGuard<'a, crate::apiserver::store::State>);

impl std::ops::Deref for WriteGuard<'_> {
    type Target = crate::apiserver::store::State;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.dry_run = false;
    }
}

fn write_store(shared: &Shared, dry_run: bool) -> WriteGuard<'_> {
    let mut g = lock(&shared.store);
    g.dry_run = dry_run;
    WriteGuard(g)
}

/// The `autoscaling/v1` Scale of a custom resource (paths from the CRD's scale subresource).
fn to_scale(res: &Resource, obj: &Value) -> Value {
    let get = |path: &str| {
        let p = format!("/{}", path.trim_start_matches('.').replace('.', "/"));
        obj.pointer(&p).cloned()
    };
    let (spec, status, selector) = res.scale.clone().unwrap_or_default();
    let mut out = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta_str(obj, "name"),
            "namespace": meta_str(obj, "namespace"),
            "uid": meta_str(obj, "uid"),
            "resourceVersion": meta_str(obj, "resourceVersion"),
            "creationTimestamp": meta_str(obj, "creationTimestamp"),
        },
        "spec": {"replicas": get(&spec).unwrap_or(json!(0))},
        "status": {"replicas": get(&status).unwrap_or(json!(0))},
    });
    if let Some(sel) = selector.and_then(|p| get(&p)) {
        out["status"]["selector"] = sel;
    }
    out
}

/// Sets `.a.b.c` in `obj`, creating maps on the way.
fn set_path(obj: &mut Value, path: &str, v: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        if i + 1 == parts.len() {
            cur[*part] = v;
            return;
        }
        cur = &mut cur[*part];
    }
}

pub(super) fn field_selector(res: &Resource, q: &BTreeMap<String, String>) -> Result<FieldSelector, ApiError> {
    let mut fs =
        FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str)).map_err(ApiError::bad_request)?;
    if events::is_events_v1(res) {
        // Stored as core/v1 Events: the group's field names stand for core/v1 ones.
        for (f, _, _) in &mut fs.reqs {
            *f = events::core_field(f)
                .ok_or_else(|| ApiError::bad_request(format!("field label not supported: {f}")))?;
        }
        return Ok(fs);
    }
    for (f, _, _) in &fs.reqs {
        let ok = f == "metadata.name"
            || (f == "metadata.namespace" && res.namespaced)
            || res.selectable.iter().any(|s| s == f);
        if !ok {
            // Kinds with field selectors of their own (pods, nodes, custom resources) word it so;
            // the others get the generic conversion's message.
            return Err(ApiError::bad_request(if res.schema.is_none() && res.selectable.is_empty() {
                format!("\"{f}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
            } else {
                format!("field label not supported: {f}")
            }));
        }
    }
    Ok(fs)
}
