//! `server::watch`: watch streams. A snapshot (synthetic ADDED events, the initial-events-end
//! bookmark) or the history since the client's resourceVersion (410 when compacted), then live
//! events filtered by namespace and selectors (selector transitions turned into ADDED/DELETED as
//! the watch cache does), periodic bookmarks, the timeout, and the faults that cut or expire a
//! stream.
//!
//! Owns: the life of one watch stream. Must not: change the store (it only reads the history and
//! subscribes under the lock).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::ResPath;
use super::handlers::field_selector;
use super::render::{error_response, partial, present, present_raw, truthy};
use crate::apiserver::faults::{FaultKind, WatchEnd};
use crate::apiserver::object::Stored;
use crate::apiserver::resources::Resource;
use crate::apiserver::selectors::{FieldSelector, LabelSelector};
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{Event, EventType, meta_str};
use crate::apiserver::{Shared, lock, table};

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

pub(super) fn watch(
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

/// Ends a watch stream as an etcd compaction does: an `ERROR` event `410 Expired`, and every later
/// watch from before the current resourceVersion refused with 410, so the client relists.
async fn expire_stream(shared: &Shared, tx: &tokio::sync::mpsc::Sender<Bytes>) {
    let rv = lock(&shared.store).rv;
    shared.faults.expire_below(rv);
    shared.faults.record(FaultKind::WatchExpired);
    let status = ApiError::gone("The resourceVersion for the provided watch is too old.").to_status();
    let _ = tx.send(event_line("ERROR", &status)).await;
}
