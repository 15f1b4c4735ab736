//! HTTP side of the emulator: the TLS accept loop (with unreachability and shutdown), request
//! routing (discovery, resource paths, subresources), authentication and RBAC of minted tokens,
//! fault injection and request counting, then the answer: discovery documents
//! ([`discovery`]), resource requests ([`handlers`]) and watch streams ([`watch`]), rendered as
//! JSON, Table or metadata only ([`render`]).
//!
//! Owns: the accept loop, the route of a path, the order of the checks every request passes.
//! Must not do: storage semantics (the store owns them) or what a kind does on a write
//! (`behaviour`).

mod discovery;
mod handlers;
mod render;
mod watch;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::response::Response;
use serde_json::json;
use tokio::net::TcpListener;

use super::status::ApiError;
use super::{Shared, lock, openapi, rbac};
use discovery::{api_groups, resource_list, version};
use render::{error_response, json_response, page_not_found, query, truthy, wants_table};

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
            match handlers::resource_request(&shared, &res, &p, verb, &q, &headers, &body, table, exempt).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
    }
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
