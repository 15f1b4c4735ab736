//! `server::render`: request parsing and response shapes shared by the handlers: query strings,
//! bodies (JSON, YAML for apply, protobuf refused with 415 unless decodable), content negotiation
//! (metadata-only, Table), objects as served at the requested version, lists rendered without
//! cloning items, Status answers and warnings, kube-apiserver's plain-text 404.
//!
//! Owns: the bytes of an answer. Must not: read or change the store.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::events;
use crate::apiserver::object::Stored;
use crate::apiserver::resources::Resource;
use crate::apiserver::status::{self, ApiError};
use crate::apiserver::store::meta_str;

pub(super) fn json_response(code: u16, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(super) fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

pub(super) fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

pub(super) fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
        .unwrap_or_default()
}

pub(super) fn truthy(q: &BTreeMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// Parses a JSON (or YAML, for apply) request body.
pub(super) fn parse_body(body: &Bytes, yaml_ok: bool) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    if body.starts_with(b"k8s\0") {
        if let Some(v) = crate::apiserver::protobuf::decode(body) {
            return Ok(v);
        }
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if yaml_ok => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request(e.to_string()))?;
            serde_saphyr::from_str::<Value>(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "the object provided is unrecognized: couldn't get version/kind; json parse error: {e}"
        ))),
    }
}

/// `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1` (metadata-only
/// clients such as kube's `metadata_watcher`).
pub(super) fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().unwrap_or("").contains("as=PartialObjectMetadata"))
}

pub(super) fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

pub(super) fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().unwrap_or("").contains("as=Table"))
}

/// The object as served at the requested version.
pub(super) fn present(res: &Resource, obj: &Arc<Value>) -> Arc<Value> {
    if events::is_events_v1(res) && obj.get("apiVersion").and_then(Value::as_str) != Some("events.k8s.io/v1") {
        return Arc::new(events::from_core(obj));
    }
    if res.schema.is_some() && obj.get("apiVersion").and_then(Value::as_str) != Some(res.api_version().as_str()) {
        let mut o = (**obj).clone();
        o["apiVersion"] = json!(res.api_version());
        Arc::new(o)
    } else {
        obj.clone()
    }
}

/// The stored bytes as served at the requested version.
pub(super) fn present_raw<'a>(res: &Resource, obj: &'a Stored) -> std::borrow::Cow<'a, [u8]> {
    if events::is_events_v1(res) {
        return std::borrow::Cow::Owned(serde_json::to_vec(&events::from_core(&obj.value())).unwrap_or_default());
    }
    if res.schema.is_some() && obj.sum.api_version != res.api_version() {
        let mut o = obj.value();
        o["apiVersion"] = json!(res.api_version());
        std::borrow::Cow::Owned(serde_json::to_vec(&o).unwrap_or_default())
    } else {
        std::borrow::Cow::Borrowed(&obj.raw)
    }
}

/// kube-apiserver's answer for a path no API serves: plain text, not a Status.
pub(super) fn page_not_found() -> Response {
    let mut r = Response::new(Body::from("404 page not found\n"));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// What a delete answers when the object is gone at once: kube-apiserver's stores answer a
/// success Status naming it, except those of pods, services and namespaces, which return the
/// object (as does any delete that only marks the object, for finalizers or a grace period).
pub(super) fn deleted_status(res: &Resource, deleted: &Value) -> Option<Value> {
    let returns_object = res.group.is_empty() && matches!(res.plural.as_str(), "pods" | "services" | "namespaces");
    if returns_object || deleted.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return None;
    }
    let mut details = json!({
        "name": meta_str(deleted, "name").unwrap_or(""),
        "kind": res.plural,
        "uid": meta_str(deleted, "uid").unwrap_or(""),
    });
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    let mut status = status::success(200);
    if let Some(o) = status.as_object_mut() {
        o.remove("code");
        o.insert("details".into(), details);
    }
    Some(status)
}

/// Renders a list without cloning items: `{"kind":"PodList","apiVersion":"v1","metadata":…,"items":[…]}`.
pub(super) fn list_response(res: &Resource, items: &[Arc<Stored>], meta: &Value) -> Response {
    let mut buf = Vec::with_capacity(256 + items.len() * 1024);
    buf.extend_from_slice(b"{\"kind\":");
    let _ = serde_json::to_writer(&mut buf, &format!("{}List", res.kind));
    buf.extend_from_slice(b",\"apiVersion\":");
    let _ = serde_json::to_writer(&mut buf, &res.api_version());
    buf.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut buf, meta);
    buf.extend_from_slice(b",\"items\":[");
    // kube-apiserver lists built-in kinds without each item's apiVersion and kind (custom
    // resources keep theirs): a client must take them from the list.
    let builtin = res.schema.is_none();
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        if builtin && let Ok(mut item) = serde_json::from_slice::<serde_json::Map<String, Value>>(&present_raw(res, o))
        {
            item.remove("apiVersion");
            item.remove("kind");
            let _ = serde_json::to_writer(&mut buf, &item);
        } else {
            buf.extend_from_slice(&present_raw(res, o));
        }
    }
    buf.extend_from_slice(b"]}");
    let mut r = Response::new(Body::from(buf));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
