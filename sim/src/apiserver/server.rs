//! HTTP side of the emulator: the TLS accept loop (with unreachability and shutdown), request
//! routing (discovery, resource paths, subresources), authentication, fault injection, request
//! counting, content negotiation (JSON, Table) and watch streams.
//! Must not do: storage semantics (the store owns them) or what a kind does on a write
//! (`behaviour`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;

use super::faults::{FaultKind, WatchEnd};
use super::object::Stored;
use super::patch::PatchType;
use super::resources::Resource;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{DeleteOptions, Event, EventType, Sub, meta_str};
use super::{Shared, events, lock, openapi, rbac, table};

/// Accepts TLS connections until shutdown. While the cluster is unreachable, new connections are
/// closed at once and open ones are cut.
pub(crate) async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, shared: Arc<Shared>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let app = axum::Router::new()
        .fallback(handle)
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(shared.clone());
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        if *shared.faults.unreachable.borrow() {
            drop(tcp);
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let mut unreachable = shared.faults.unreachable.subscribe();
        let mut shutdown = shared.shutdown.subscribe();
        tokio::spawn(async move {
            let cut = async {
                tokio::select! {
                    _ = unreachable.wait_for(|u| *u) => {},
                    _ = shutdown.wait_for(|s| *s) => {},
                }
            };
            let serve = async {
                let Ok(stream) = acceptor.accept(tcp).await else { return };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), svc).await;
            };
            tokio::select! {
                _ = cut => {},
                _ = serve => {},
            }
        });
    }
}

/// What a request addresses.
#[derive(Debug)]
enum Route {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    GroupVersion(String, String),
    Resource(ResPath),
    OpenApiV2,
    OpenApiV3,
    OpenApiV3Gv(String, String),
    NotFound,
}

#[derive(Debug)]
struct ResPath {
    group: String,
    version: String,
    plural: String,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    legacy_watch: bool,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let res = |group: &str, version: &str, rest: &[&str]| -> Route {
        let (legacy_watch, rest) = match rest.first() {
            Some(&"watch") => (true, &rest[1..]),
            _ => (false, rest),
        };
        let (ns, rest) = if rest.len() >= 3 && rest[0] == "namespaces" {
            (Some(rest[1].to_string()), &rest[2..])
        } else {
            (None, rest)
        };
        if rest.is_empty() || rest.len() > 3 {
            return Route::NotFound;
        }
        Route::Resource(ResPath {
            group: group.into(),
            version: version.into(),
            plural: rest[0].into(),
            ns,
            name: rest.get(1).map(|s| s.to_string()),
            sub: rest.get(2).map(|s| s.to_string()),
            legacy_watch,
        })
    };
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::Api,
        ["api", v] => Route::GroupVersion(String::new(), v.to_string()),
        ["api", v, rest @ ..] => res("", v, rest),
        ["apis"] => Route::Apis,
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::GroupVersion(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => res(g, v, rest),
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3,
        ["openapi", "v3", "api", v] => Route::OpenApiV3Gv(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApiV3Gv(g.to_string(), v.to_string()),
        _ => Route::NotFound,
    }
}

fn json_response(code: u16, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
        .unwrap_or_default()
}

fn truthy(q: &BTreeMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// Parses a JSON (or YAML, for apply) request body.
fn parse_body(body: &Bytes, yaml_ok: bool) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    if body.starts_with(b"k8s\0") {
        if let Some(v) = super::protobuf::decode(body) {
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
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().unwrap_or("").contains("as=PartialObjectMetadata"))
}

fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().unwrap_or("").contains("as=Table"))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = route(uri.path());
    let q = query(&uri);
    // The verb and resource as audit logs name them, for counters and faults.
    let (verb, resource) = match &route {
        Route::Resource(p) => {
            let watch = p.legacy_watch || truthy(&q, "watch");
            let verb = match (&method, p.name.is_some(), p.sub.as_deref()) {
                (&Method::GET, _, _) if watch => "watch",
                (&Method::GET, true, _) => "get",
                (&Method::GET, false, _) => "list",
                (&Method::POST, _, _) => "create",
                (&Method::PUT, _, _) => "update",
                (&Method::PATCH, _, _) => "patch",
                (&Method::DELETE, true, _) => "delete",
                (&Method::DELETE, false, _) => "deletecollection",
                _ => "unknown",
            };
            let res = match &p.sub {
                Some(s) => format!("{}/{s}", p.plural),
                None => p.plural.clone(),
            };
            (verb, res)
        }
        _ => ("get", String::new()),
    };
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    shared.requests.record(verb, &resource, agent);
    let exempt = headers.contains_key(super::faults::FAULT_EXEMPT_HEADER);
    if !exempt {
        injected_delay(&shared).await;
    }
    let mut blackhole = shared.faults.blackhole.subscribe();
    if *blackhole.borrow() {
        let _ = blackhole.wait_for(|b| !*b).await;
    }
    // Authentication. Without credentials, /version and the health endpoints are public (as with
    // kube-apiserver's anonymous access and system:public-info-viewer); a bad token is always 401.
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let token = authorization.and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    let admin = shared.token.read().map(|t| t.clone()).unwrap_or_default();
    let public = authorization.is_none() && matches!(route, Route::Version | Route::Health);
    let service_account = if token == admin || public {
        None
    } else {
        match lock(&shared.store).minted_tokens.get(token) {
            Some(sa) => Some(rbac::ServiceAccount::parse(sa)),
            None => return error_response(&ApiError::unauthorized()),
        }
    };
    if shared.faults.unauthorized() {
        return error_response(&ApiError::unauthorized());
    }
    // RBAC for minted service-account tokens.
    if let (Some(sa), Route::Resource(p)) = (&service_account, &route) {
        let attrs = rbac::Attributes {
            verb,
            group: &p.group,
            resource: &p.plural,
            subresource: p.sub.as_deref(),
            namespace: p.ns.as_deref().or(if p.plural == "namespaces" { p.name.as_deref() } else { None }),
            name: p.name.as_deref(),
        };
        if let Err(e) = rbac::authorize(&lock(&shared.store), sa, &attrs) {
            return error_response(&e);
        }
    }
    if !exempt
        && !matches!(route, Route::Health)
        && let Some(code) = shared.faults.injected_error(verb, &resource)
    {
        return error_response(&ApiError::injected(code));
    }
    let table = wants_table(&headers);
    match route {
        Route::Version => json_response(200, &version()),
        Route::Health => {
            let mut r = Response::new(Body::from("ok"));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            r
        }
        Route::Api => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]}),
        ),
        Route::Apis => json_response(200, &api_groups(&shared)),
        Route::Group(g) => match api_groups(&shared)["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|x| x["name"] == g.as_str()).cloned())
        {
            Some(mut grp) => {
                if let Some(o) = grp.as_object_mut() {
                    o.insert("kind".into(), json!("APIGroup"));
                    o.insert("apiVersion".into(), json!("v1"));
                }
                json_response(200, &grp)
            }
            None => page_not_found(),
        },
        Route::GroupVersion(g, v) => match resource_list(&shared, &g, &v) {
            Some(l) => json_response(200, &l),
            None => page_not_found(),
        },
        Route::NotFound => page_not_found(),
        Route::OpenApiV2 => {
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
            if accept.contains("protobuf") {
                // An empty protobuf message is a valid, empty openapi_v2.Document.
                let mut r = Response::new(Body::empty());
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
                );
                r
            } else {
                json_response(200, &openapi::v2_json())
            }
        }
        Route::OpenApiV3 => json_response(200, &openapi::v3_root(&lock(&shared.store).registry)),
        Route::OpenApiV3Gv(g, v) => match openapi::v3_group_version(&lock(&shared.store).registry, &g, &v) {
            Some(doc) => json_response(200, &doc),
            None => error_response(&ApiError::not_found_path()),
        },
        Route::Resource(p) => {
            let res = lock(&shared.store).registry.get(&p.group, &p.version, &p.plural);
            let Some(res) = res else {
                // An unserved group/version is no API at all (Go's mux); a served one answers a Status.
                if resource_list(&shared, &p.group, &p.version).is_none() {
                    return page_not_found();
                }
                return error_response(&ApiError::not_found_path());
            };
            if p.ns.is_some() && !res.namespaced {
                return error_response(&ApiError::not_found_path());
            }
            if res.namespaced && p.ns.is_none() && p.name.is_some() {
                return error_response(&ApiError::not_found_path());
            }
            match resource_request(&shared, &res, &p, verb, &q, &headers, &body, table, exempt).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
    }
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn api_groups(shared: &Shared) -> Value {
    let st = lock(&shared.store);
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in st.registry.by_gvr.values().filter(|r| !r.group.is_empty()) {
        let vs = groups.entry(r.group.clone()).or_default();
        if !vs.contains(&r.version) {
            vs.push(r.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, mut vs)| {
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
            let versions: Vec<Value> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            let preferred = versions.first().cloned().unwrap_or(json!({}));
            json!({"name": g, "versions": versions, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else { return (0, 0, 0) };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

fn resource_list(shared: &Shared, group: &str, version: &str) -> Option<Value> {
    let st = lock(&shared.store);
    let rs: Vec<Arc<Resource>> =
        st.registry.by_gvr.values().filter(|r| r.group == group && r.version == version).cloned().collect();
    if rs.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for r in &rs {
        let mut main = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            main["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            main["categories"] = json!(r.categories);
        }
        out.push(main);
        for s in &r.subresources {
            let (kind, verbs, grp, ver): (String, Vec<&str>, Option<&str>, Option<&str>) = match s.as_str() {
                "status" => (r.kind.clone(), vec!["get", "patch", "update"], None, None),
                "scale" => ("Scale".into(), vec!["get", "patch", "update"], Some("autoscaling"), Some("v1")),
                "binding" => ("Binding".into(), vec!["create"], None, None),
                "eviction" => ("Eviction".into(), vec!["create"], Some("policy"), Some("v1")),
                "token" => ("TokenRequest".into(), vec!["create"], Some("authentication.k8s.io"), Some("v1")),
                "finalize" => (r.kind.clone(), vec!["update"], None, None),
                _ => continue,
            };
            let mut sr = json!({"name": format!("{}/{s}", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": kind, "verbs": verbs});
            if let Some(g) = grp {
                sr["group"] = json!(g);
                sr["version"] = json!(ver);
            }
            out.push(sr);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}))
}

/// The object as served at the requested version.
fn present(res: &Resource, obj: &Arc<Value>) -> Arc<Value> {
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
fn present_raw<'a>(res: &Resource, obj: &'a Stored) -> std::borrow::Cow<'a, [u8]> {
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

#[allow(clippy::too_many_arguments)]
async fn resource_request(
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
        let Some(unknown) = super::builtin::unknown_fields(res, v) else { return Ok(Vec::new()) };
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
        super::builtin::prune(v, &unknown);
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
                    Some(PatchType::Json) => {
                        super::patch::json_patch(&mut scale, &body_v).map_err(|_| ApiError::json_patch_failed())?
                    }
                    Some(_) => super::patch::merge_patch(&mut scale, &body_v),
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

/// Ends a watch stream as an etcd compaction does: an `ERROR` event `410 Expired`, and every later
/// watch from before the current resourceVersion refused with 410, so the client relists.
async fn expire_stream(shared: &Shared, tx: &tokio::sync::mpsc::Sender<Bytes>) {
    let rv = lock(&shared.store).rv;
    shared.faults.expire_below(rv);
    shared.faults.record(FaultKind::WatchExpired);
    let status = ApiError::gone("The resourceVersion for the provided watch is too old.").to_status();
    let _ = tx.send(event_line("ERROR", &status)).await;
}

/// Injected latency, then a slow response's extra wait (faults the request is not exempt from).
async fn injected_delay(shared: &Shared) {
    let latency = shared.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(d) = shared.faults.slow_delay() {
        tokio::time::sleep(d).await;
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

/// kube-apiserver's answer for a path no API serves: plain text, not a Status.
fn page_not_found() -> Response {
    let mut r = Response::new(Body::from("404 page not found\n"));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// What a delete answers when the object is gone at once: kube-apiserver's stores answer a
/// success Status naming it, except those of pods, services and namespaces, which return the
/// object (as does any delete that only marks the object, for finalizers or a grace period).
fn deleted_status(res: &Resource, deleted: &Value) -> Option<Value> {
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
    let mut status = super::status::success(200);
    if let Some(o) = status.as_object_mut() {
        o.remove("code");
        o.insert("details".into(), details);
    }
    Some(status)
}

/// The store locked for a write; with `dry_run` (a `dryRun=All` request) the write is computed and
/// validated but not stored. The flag is cleared when the guard drops.
struct WriteGuard<'a>(std::sync::MutexGuard<'a, super::store::State>);

impl std::ops::Deref for WriteGuard<'_> {
    type Target = super::store::State;
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

fn field_selector(res: &Resource, q: &BTreeMap<String, String>) -> Result<FieldSelector, ApiError> {
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

/// Renders a list without cloning items: `{"kind":"PodList","apiVersion":"v1","metadata":…,"items":[…]}`.
fn list_response(res: &Resource, items: &[Arc<Stored>], meta: &Value) -> Response {
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

/// Which events of the stream a watcher sees.
struct WatchFilter {
    res: Arc<Resource>,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, obj: &Stored) -> bool {
        self.ns.as_deref().is_none_or(|ns| obj.sum.namespace == ns)
            && self.labels.matches_with(|k| obj.label(k))
            && self.fields.matches_with(|f| obj.field(f))
    }

    /// The event this watcher gets for a change, with selector transitions turned into
    /// ADDED/DELETED like the watch cache does.
    fn convert(&self, ev: &Event) -> Option<(EventType, Arc<Stored>)> {
        if ev.key != self.res.key() {
            return None;
        }
        let cur = self.matches(&ev.object);
        let old = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        match ev.ty {
            EventType::Added => cur.then(|| (EventType::Added, ev.object.clone())),
            EventType::Deleted => (old || cur).then(|| (EventType::Deleted, ev.object.clone())),
            EventType::Modified => match (old, cur) {
                (true, true) => Some((EventType::Modified, ev.object.clone())),
                (false, true) => Some((EventType::Added, ev.object.clone())),
                (true, false) => {
                    let mut o = ev.prev.as_ref().map(|p| p.value()).unwrap_or_default();
                    o["metadata"]["resourceVersion"] = json!(ev.rv.to_string());
                    Some((EventType::Deleted, Arc::new(Stored::new(&o, &[]))))
                }
                (false, false) => None,
            },
        }
    }
}

fn event_line(ty: &str, obj: &Value) -> Bytes {
    event_line_raw(ty, &serde_json::to_vec(obj).unwrap_or_default())
}

fn event_line_raw(ty: &str, obj: &[u8]) -> Bytes {
    let mut buf = Vec::with_capacity(obj.len() + 32);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(ty.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    buf.extend_from_slice(obj);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

fn watch(
    shared: Arc<Shared>,
    res: Arc<Resource>,
    p: &ResPath,
    q: &BTreeMap<String, String>,
    table: bool,
    metadata_only: bool,
    exempt: bool,
) -> Response {
    let labels = match LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str)) {
        Ok(l) => l,
        Err(e) => return error_response(&ApiError::bad_request(e)),
    };
    let mut fields = match field_selector(&res, q) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    if let Some(n) = &p.name {
        fields.reqs.push(("metadata.name".into(), true, n.clone()));
    }
    let filter = WatchFilter { res: res.clone(), ns: p.ns.clone(), labels, fields };
    let bookmarks = truthy(q, "allowWatchBookmarks");
    let initial_events = truthy(q, "sendInitialEvents");
    let include_object = q.get("includeObject").cloned().unwrap_or_default();
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(shared.watch_timeout);
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();

    // Snapshot and subscription under one lock, so no event falls between them.
    let (initial, backlog, mut rx, start_rv, gone) = {
        let st = lock(&shared.store);
        let rx = st.subscribe();
        let mut initial = Vec::new();
        let mut backlog = Vec::new();
        let mut gone = None;
        let synthetic = initial_events || rv_param.is_empty() || rv_param == "0";
        if synthetic {
            let all = st.list(&res, p.ns.as_deref(), &filter.labels, &filter.fields, None, None);
            if let Ok(l) = all {
                initial = l.items;
            }
        } else {
            match rv_param.parse::<u64>() {
                Ok(rv) => match st.history_since(rv) {
                    Ok(_) if !exempt && let Some(oldest) = shared.faults.expired(rv) => {
                        shared.faults.record(FaultKind::WatchRefusedExpired);
                        gone = Some(ApiError::gone(format!("too old resource version: {rv} ({oldest})")));
                    }
                    Ok(h) => backlog = h,
                    Err(e) => gone = Some(e),
                },
                Err(_) => gone = Some(ApiError::bad_request(format!("invalid resource version: {rv_param}"))),
            }
        }
        (initial, backlog, rx, st.rv, gone)
    };

    let (tx, out_rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let mut drops = shared.faults.watch_drops.subscribe();
    drops.mark_unchanged();
    let mut expiries = shared.faults.watch_expiries.subscribe();
    expiries.mark_unchanged();
    let churn = if exempt { None } else { shared.faults.watch_end() };
    let faults = shared.clone();
    let mut shutdown = shared.shutdown.subscribe();
    let bookmark_interval = shared.bookmark_interval;
    let clock = shared.clock.clone();
    tokio::spawn(async move {
        let mut headers_sent = false;
        let mut render = |ty: &str, obj: &Stored| -> Bytes {
            if metadata_only {
                event_line(ty, &partial(&obj.value()))
            } else if table {
                let obj = present(&res, &Arc::new(obj.value()));
                let meta = json!({"resourceVersion": meta_str(&obj, "resourceVersion")});
                let t = table::table(&res, &[obj], meta, !headers_sent, &include_object, clock.now());
                headers_sent = true;
                event_line(ty, &t)
            } else {
                event_line_raw(ty, &present_raw(&res, obj))
            }
        };
        if let Some(e) = gone {
            let _ = tx.send(event_line("ERROR", &e.to_status())).await;
            return;
        }
        let bookmark = |rv: u64, end: bool| -> Bytes {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            event_line("BOOKMARK", &json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": meta}))
        };
        for o in &initial {
            if tx.send(render("ADDED", o)).await.is_err() {
                return;
            }
        }
        if initial_events && bookmarks && tx.send(bookmark(start_rv, true)).await.is_err() {
            return;
        }
        let mut last_rv = start_rv;
        for ev in &backlog {
            last_rv = last_rv.max(ev.rv);
            if let Some((ty, o)) = filter.convert(ev)
                && tx.send(render(ty.as_str(), &o)).await.is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let bookmark_at = |now: tokio::time::Instant| {
            let periodic = now + bookmark_interval;
            // kube-apiserver also sends one about 2 s before the watch times out.
            let before_end = deadline.checked_sub(Duration::from_secs(2)).unwrap_or(deadline);
            if before_end > now { periodic.min(before_end) } else { periodic }
        };
        let mut next_bookmark = bookmark_at(tokio::time::Instant::now());
        let churn_at = churn.map(|(life, _)| tokio::time::Instant::now() + life);
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Ok(ev) => {
                        if ev.rv <= last_rv { continue; }
                        last_rv = ev.rv;
                        if let Some((ty, o)) = filter.convert(&ev)
                            && tx.send(render(ty.as_str(), &o)).await.is_err()
                        {
                            return;
                        }
                    }
                    // A watcher too slow for the event rate is closed, like the watch cache does.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
                _ = tokio::time::sleep_until(next_bookmark), if bookmarks => {
                    if tx.send(bookmark(last_rv, false)).await.is_err() {
                        return;
                    }
                    next_bookmark = bookmark_at(tokio::time::Instant::now());
                    if next_bookmark <= tokio::time::Instant::now() {
                        next_bookmark = deadline + Duration::from_secs(1);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = drops.changed() => {
                    faults.faults.record(FaultKind::WatchDropped);
                    return;
                }
                _ = expiries.changed(), if !exempt => {
                    expire_stream(&faults, &tx).await;
                    return;
                }
                _ = async { if let Some(t) = churn_at { tokio::time::sleep_until(t).await } }, if churn_at.is_some() => {
                    match churn.map(|(_, end)| end) {
                        Some(WatchEnd::Expired) => expire_stream(&faults, &tx).await,
                        _ => faults.faults.record(FaultKind::WatchDropped),
                    }
                    return;
                }
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream =
        futures::stream::unfold(
            out_rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx)) },
        );
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    r
}
