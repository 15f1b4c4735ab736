//! The emulator's storage: objects as JSON per (group, resource, namespace, name), one
//! resourceVersion counter per cluster (like etcd's revision), the watch event history (a bounded
//! ring: older versions answer `410 Gone`), lists (selectors, pages and continue tokens), and the
//! generic write path of kube-apiserver's registry: metadata set on create (uid, generated names,
//! timestamps, generation), optimistic concurrency, the status subresource, patches, delete
//! preconditions, finalizers and deletionTimestamp, graceful deletion (only pods get a grace
//! period), dry runs.
//!
//! Owns: the State behind the lock and its primitives (`put`, `remove`, which stamp a new
//! resourceVersion and send the watch event), and the order of a write: validation, the kind's
//! admission, storage, then what controllers do about it. What is particular to a kind or a
//! controller (pod defaults, eviction, PDB status, binding, namespaces, garbage collection, CRDs,
//! tokens) lives in `behaviour`, one module each, called at those points. Must not do: HTTP (the
//! server module parses requests and renders responses) or block: every operation runs under one
//! lock, synchronously.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::behaviour::{deletion_grace, is_crd};
use super::disruptions::{DisruptionLog, PdbState};
use super::events;
use super::object::Stored;
use super::patch::{self, PatchType};
use super::resources::{Registry, Resource};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use crate::clock::{Clock, SeededRng};

/// Storage key of a resource: (group, plural).
pub(crate) type ResKey = (String, String);
/// Object key within a resource: (namespace or "", name).
pub(crate) type ObjKey = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub key: ResKey,
    pub ty: EventType,
    pub object: Arc<Stored>,
    /// The previous version (for selector transitions).
    pub prev: Option<Arc<Stored>>,
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOptions {
    pub grace_period: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

impl DeleteOptions {
    pub fn from_value(v: &Value) -> DeleteOptions {
        DeleteOptions {
            grace_period: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            propagation: v.get("propagationPolicy").and_then(Value::as_str).map(String::from),
            precondition_uid: v.pointer("/preconditions/uid").and_then(Value::as_str).map(String::from),
            precondition_rv: v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(String::from),
        }
    }
}

/// The result of a list.
#[derive(Debug)]
pub(crate) struct ListResult {
    pub items: Vec<Arc<Stored>>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// The state behind the lock.
#[derive(Debug)]
pub(crate) struct State {
    pub rv: u64,
    pub registry: Registry,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Stored>>>,
    history: VecDeque<Arc<Event>>,
    history_cap: usize,
    /// Oldest resourceVersion a watch may start from (everything after it is in the history).
    compacted: u64,
    rng: SeededRng,
    clock: Clock,
    events: broadcast::Sender<Arc<Event>>,
    /// Tokens minted for service accounts (TokenRequest, token Secrets): token → "ns/name".
    pub minted_tokens: BTreeMap<String, String>,
    /// The cluster CA, for token Secrets' `ca.crt`.
    pub ca_pem: String,
    /// While set (a `dryRun` request), writes are computed and validated but not stored.
    pub dry_run: bool,
    /// Every pod whose termination began, and how (an observation point for tests).
    pub disruptions: DisruptionLog,
}

pub(super) fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub(super) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = Value::Object(Map::new());
    }
    match &mut obj["metadata"] {
        Value::Object(m) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

pub(super) fn being_deleted(obj: &Value) -> bool {
    meta(obj).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|v| !v.is_null()))
}

pub(crate) fn timestamp(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Which copy of the object a write touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
}

impl State {
    pub fn new(clock: Clock, seed: u64, history_cap: usize, events: broadcast::Sender<Arc<Event>>) -> State {
        // Like a cluster whose etcd history was compacted long ago: resourceVersions below the
        // starting one are "too old" (410), as on any real cluster.
        let mut s = State {
            rv: 1000,
            registry: Registry::builtin(),
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_cap: history_cap.max(16),
            compacted: 1000,
            rng: SeededRng::new(seed),
            clock,
            events,
            minted_tokens: BTreeMap::new(),
            ca_pem: String::new(),
            dry_run: false,
            disruptions: DisruptionLog::default(),
        };
        if let Some(cr) = s.registry.get("rbac.authorization.k8s.io", "v1", "clusterroles") {
            let _ = s.create(
                &cr,
                None,
                json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                       "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
            );
        }
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if let Some(res) = s.registry.get("", "v1", "namespaces") {
                let _ = s.create(&res, None, json!({"metadata": {"name": ns}}));
            }
        }
        s
    }

    pub fn now(&self) -> String {
        timestamp(self.clock.now())
    }

    /// The clock's time, for what is not a timestamp string.
    pub(super) fn now_utc(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    fn uid(&mut self) -> String {
        let a = self.rng.next_u64();
        let b = self.rng.next_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5).map(|_| ALPHABET[self.rng.below(ALPHABET.len() as u64) as usize] as char).collect()
    }

    /// Mints a random bearer token.
    pub fn token(&mut self) -> String {
        format!("{:016x}{:016x}", self.rng.next_u64(), self.rng.next_u64())
    }

    fn stored(&self, key: &ResKey, ns: &str, name: &str) -> Option<&Arc<Stored>> {
        self.objects.get(key).and_then(|t| t.get(&(ns.to_string(), name.to_string())))
    }

    /// The object as `res` serves it (events.k8s.io Events converted from their core/v1 storage).
    pub fn lookup(&self, res: &Resource, ns: &str, name: &str) -> Option<Arc<Value>> {
        let v = self.lookup_key(&res.key(), ns, name)?;
        Some(if events::is_events_v1(res) { Arc::new(events::from_core(&v)) } else { v })
    }

    /// `put` of an object given as `res` serves it; answers it in that form too.
    pub(super) fn put_as(&mut self, res: &Resource, ns: &str, name: &str, obj: Value) -> Arc<Value> {
        if events::is_events_v1(res) {
            let stored = self.put(&res.key(), ns, name, events::to_core(obj));
            return Arc::new(events::from_core(&stored));
        }
        self.put(&res.key(), ns, name, obj)
    }

    pub(super) fn lookup_key(&self, key: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.stored(key, ns, name).map(|s| Arc::new(s.value()))
    }

    /// The selectable fields kept in the summary of objects of `key`.
    fn selectable(&self, key: &ResKey) -> Vec<String> {
        self.registry.any_version(&key.0, &key.1).map(|r| r.selectable.clone()).unwrap_or_default()
    }

    /// Objects of a resource (in a namespace, or all), in key order.
    pub fn objects_of<'a>(&'a self, key: &ResKey, ns: Option<&'a str>) -> impl Iterator<Item = &'a Arc<Stored>> + 'a {
        self.objects
            .get(key)
            .into_iter()
            .flat_map(move |t| t.iter().filter(move |((n, _), _)| ns.is_none_or(|ns| ns == n)).map(|(_, v)| v))
    }

    /// Objects of a resource with their keys, in key order.
    pub(super) fn entries_of<'a>(&'a self, key: &ResKey) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Stored>)> + 'a {
        self.objects.get(key).into_iter().flat_map(|t| t.iter())
    }

    /// Every stored object with its resource and key (resources in no particular order).
    pub(super) fn all_objects(&self) -> impl Iterator<Item = (&ResKey, &ObjKey, &Arc<Stored>)> {
        self.objects.iter().flat_map(|(key, t)| t.iter().map(move |(k, o)| (key, k, o)))
    }

    pub fn count(&self, key: &ResKey) -> usize {
        self.objects.get(key).map_or(0, BTreeMap::len)
    }

    // ---------------------------------------------------------------- commit primitives
    // Every change goes through `put` or `remove` (also those of `behaviour`): a new
    // resourceVersion, the history and the watch event.

    fn emit(&mut self, key: &ResKey, ty: EventType, object: Arc<Stored>, prev: Option<Arc<Stored>>) {
        let ev = Arc::new(Event { rv: self.rv, key: key.clone(), ty, object, prev });
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_cap {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        let _ = self.events.send(ev);
    }

    /// Stores `obj` under a new resourceVersion and emits ADDED/MODIFIED.
    pub(super) fn put(&mut self, key: &ResKey, ns: &str, name: &str, mut obj: Value) -> Arc<Value> {
        drop_empty_metadata(&mut obj);
        if self.dry_run {
            // Validated and computed, not stored: the current resourceVersion, no event.
            let rv = meta_str(&obj, "resourceVersion").unwrap_or("").to_string();
            if rv.is_empty() {
                meta_mut(&mut obj).remove("resourceVersion");
            }
            return Arc::new(obj);
        }
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        let stored = Arc::new(Stored::new(&obj, &self.selectable(key)));
        let prev =
            self.objects.entry(key.clone()).or_default().insert((ns.to_string(), name.to_string()), stored.clone());
        let ty = if prev.is_some() { EventType::Modified } else { EventType::Added };
        self.emit(key, ty, stored, prev);
        Arc::new(obj)
    }

    /// Removes the object under a new resourceVersion and emits DELETED.
    pub(super) fn remove(&mut self, key: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        if self.dry_run {
            return self.stored(key, ns, name).map(|s| Arc::new(s.value()));
        }
        let prev = self.objects.get_mut(key)?.remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let mut obj = prev.value();
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        let stored = Arc::new(Stored::new(&obj, &self.selectable(key)));
        self.emit(key, EventType::Deleted, stored, Some(prev));
        Some(Arc::new(obj))
    }

    // ---------------------------------------------------------------- reads

    pub fn get(&self, res: &Resource, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.lookup(res, ns, name).ok_or_else(|| ApiError::not_found(res, name))
    }

    pub fn list(
        &self,
        res: &Resource,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListResult, ApiError> {
        let (list_rv, start) = match continue_token {
            Some(t) => {
                let (rv, start) = decode_continue(t)?;
                if rv < self.compacted {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    ));
                }
                (rv, Some(start))
            }
            None => (self.rv, None),
        };
        let mut items = Vec::new();
        let mut last: Option<ObjKey> = None;
        let mut more = false;
        let mut remaining = 0u64;
        if let Some(table) = self.objects.get(&res.key()) {
            let iter: Box<dyn Iterator<Item = (&ObjKey, &Arc<Stored>)>> = match (&start, ns) {
                (Some(s), _) => Box::new(
                    table.range::<ObjKey, _>((std::ops::Bound::Excluded(s.clone()), std::ops::Bound::Unbounded)),
                ),
                (None, Some(ns)) => Box::new(table.range::<ObjKey, _>((ns.to_string(), String::new())..)),
                (None, None) => Box::new(table.iter()),
            };
            for (k, v) in iter {
                if let Some(ns) = ns
                    && k.0 != ns
                {
                    if k.0.as_str() > ns {
                        break;
                    }
                    continue;
                }
                if !labels.matches_with(|k| v.label(k)) || !fields.matches_with(|f| v.field(f)) {
                    continue;
                }
                if let Some(l) = limit
                    && items.len() >= l
                {
                    more = true;
                    remaining += 1;
                    continue;
                }
                last = Some(k.clone());
                items.push(v.clone());
            }
        }
        let continue_token = if more { last.map(|k| encode_continue(list_rv, &k)) } else { None };
        let remaining = (more && labels.is_empty() && fields.is_empty()).then_some(remaining);
        Ok(ListResult { items, rv: list_rv, continue_token, remaining })
    }

    /// Events after `rv` for a watch, or `410 Gone` if they are no longer kept.
    pub fn history_since(&self, rv: u64) -> Result<Vec<Arc<Event>>, ApiError> {
        if rv < self.compacted {
            return Err(ApiError::gone(format!("too old resource version: {rv} ({})", self.compacted + 1)));
        }
        Ok(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    // ---------------------------------------------------------------- create

    /// Puts the URL namespace into the body's metadata (400 if they differ).
    fn place(&self, res: &Resource, ns: Option<&str>, obj: &mut Value) -> Result<String, ApiError> {
        let m = meta_mut(obj);
        if res.namespaced {
            let ns = ns.ok_or_else(|| ApiError::bad_request("the server could not find the requested resource"))?;
            match m.get("namespace").and_then(Value::as_str) {
                Some(b) if !b.is_empty() && b != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
            m.insert("namespace".into(), Value::String(ns.to_string()));
            Ok(ns.to_string())
        } else {
            m.remove("namespace");
            Ok(String::new())
        }
    }

    pub fn create(
        &mut self,
        res: &Arc<Resource>,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<(Arc<Value>, Vec<String>), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be an object"));
        }
        self.type_meta(res, &mut obj)?;
        let ns = self.place(res, ns, &mut obj)?;
        let m = meta_mut(&mut obj);
        let mut name = m.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() {
            let prefix = m.get("generateName").and_then(Value::as_str).unwrap_or("").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid_fields(
                    res,
                    "",
                    &["metadata.name: Required value: name or generateName is required".to_string()],
                ));
            }
            // Like the apiserver, a generated name that collides is an AlreadyExists the client retries.
            let suffix = self.random_suffix();
            // names.SimpleNameGenerator: the prefix is cut to 58 characters, then 5 random ones.
            let cut = prefix.char_indices().nth(58).map_or(prefix.len(), |(i, _)| i);
            name = format!("{}{}", &prefix[..cut], suffix);
        }
        if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            // kube-apiserver answers a bare 500, without a reason.
            return Err(ApiError::new(500, "", "resourceVersion should not be set on objects to be created"));
        }
        if res.namespaced {
            self.check_namespace(res, &ns, &name)?;
        }
        let uid = self.uid();
        let now = self.now();
        let m = meta_mut(&mut obj);
        m.insert("name".into(), Value::String(name.clone()));
        m.insert("uid".into(), Value::String(uid));
        m.insert("creationTimestamp".into(), Value::String(now));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        if res.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        let mut warnings = Vec::new();
        if let Some(schema) = &res.schema {
            let adm = schema.create(&obj).map_err(|e| ApiError::invalid(&e))?;
            obj = adm.object;
            warnings = adm.warnings;
        } else {
            self.admit_builtin_create(res, &name, &mut obj)?;
        }
        if self.lookup(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(res, &name));
        }
        let crd_resources = if is_crd(res) { Some(self.compile_crd(res, &name, &mut obj)?) } else { None };
        let stored = self.put_as(res, &ns, &name, obj);
        if self.dry_run {
            return Ok((stored, warnings));
        }
        if let Some(rs) = crd_resources {
            self.serve_crd(&name, rs);
        }
        self.after_write(res, &ns, &stored);
        Ok((stored, warnings))
    }

    fn type_meta(&self, res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
        let Some(m) = obj.as_object_mut() else { return Ok(()) };
        match m.get("kind").and_then(Value::as_str) {
            Some(k) if !k.is_empty() && k != res.kind => {
                return Err(ApiError::bad_request(format!(
                    "the kind of the provided object ({k}) does not match the kind of the resource ({})",
                    res.kind
                )));
            }
            _ => {}
        }
        m.insert("kind".into(), Value::String(res.kind.clone()));
        // Built-in kinds are stored at their one version; a CR's apiVersion is checked by its schema.
        if res.schema.is_none() || m.get("apiVersion").and_then(Value::as_str).is_none_or(str::is_empty) {
            m.insert("apiVersion".into(), Value::String(res.api_version()));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- update

    pub fn update(
        &mut self,
        res: &Arc<Resource>,
        ns: Option<&str>,
        name: &str,
        mut obj: Value,
        sub: Sub,
    ) -> Result<(Arc<Value>, Vec<String>), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be an object"));
        }
        self.type_meta(res, &mut obj)?;
        let ns = self.place(res, ns, &mut obj)?;
        let old = self.get(res, &ns, name)?;
        let m = meta_mut(&mut obj);
        match m.get("name").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("name".into(), Value::String(name.to_string()));
            }
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {}
        }
        let old_rv = meta_str(&old, "resourceVersion").unwrap_or("").to_string();
        match m.get("resourceVersion").and_then(Value::as_str) {
            Some(rv) if !rv.is_empty() => {
                if rv != old_rv {
                    return Err(ApiError::stale(res, name));
                }
            }
            _ if res.schema.is_some() => {
                // This one check names the resource (`widgets.example.com`), not the kind.
                let mut e = ApiError::invalid_fields(
                    res,
                    name,
                    &["metadata.resourceVersion: Invalid value: 0: must be specified for an update".to_string()],
                );
                e.message = e.message.replacen(&format!("{}.{}", res.kind, res.group), &res.qualified(), 1);
                if let Some(d) = e.details.as_mut() {
                    d["kind"] = json!(res.plural);
                }
                return Err(e);
            }
            _ => {
                m.insert("resourceVersion".into(), Value::String(old_rv.clone()));
            }
        }
        if sub == Sub::Status {
            // The status strategy: only status changes; spec and metadata stay as stored.
            let status = obj.get("status").cloned();
            let mut next = (*old).clone();
            if let Some(o) = next.as_object_mut() {
                match status {
                    Some(s) => o.insert("status".into(), s),
                    None => o.remove("status"),
                };
            }
            obj = next;
        } else {
            // Immutable and server-owned metadata.
            let om = meta(&old).cloned().unwrap_or_default();
            let m = meta_mut(&mut obj);
            for k in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
                match om.get(k) {
                    Some(v) => m.insert(k.to_string(), v.clone()),
                    None => m.remove(k),
                };
            }
            m.remove("managedFields");
            if being_deleted(&old) {
                let before: BTreeSet<String> = finalizers(&old).into_iter().collect();
                let added: Vec<String> = finalizers(&obj).into_iter().filter(|f| !before.contains(f)).collect();
                if !added.is_empty() {
                    return Err(ApiError::invalid_fields(
                        res,
                        name,
                        &[format!(
                            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                            added.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", ")
                        )],
                    ));
                }
            }
            if res.has_status()
                && res.schema.is_none()
                && let Some(o) = obj.as_object_mut()
            {
                match old.get("status") {
                    Some(s) => o.insert("status".into(), s.clone()),
                    None => o.remove("status"),
                };
            }
        }
        let mut warnings = Vec::new();
        match (&res.schema, sub) {
            (Some(schema), Sub::Main) => {
                let adm = schema.update(&obj, &old).map_err(|e| ApiError::invalid(&e))?;
                obj = adm.object;
                warnings = adm.warnings;
            }
            (Some(_), Sub::Status) => {
                if let Some(schema) = &res.status_schema {
                    let adm = schema.update(&obj, &old).map_err(|e| ApiError::invalid(&e))?;
                    obj = adm.object;
                    warnings = adm.warnings;
                }
                // Status writes never change the generation.
                let g = meta(&old).and_then(|m| m.get("generation")).cloned();
                let m = meta_mut(&mut obj);
                match g {
                    Some(g) => m.insert("generation".into(), g),
                    None => m.remove("generation"),
                };
            }
            (None, Sub::Main) if res.generation => {
                let strip = |v: &Value| {
                    let mut m = v.as_object().cloned().unwrap_or_default();
                    m.remove("metadata");
                    m.remove("status");
                    m
                };
                if strip(&obj) != strip(&old) {
                    let g = meta(&old).and_then(|m| m.get("generation")).and_then(Value::as_i64).unwrap_or(0);
                    meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
                }
            }
            _ => {}
        }
        let crd_resources =
            if is_crd(res) && sub == Sub::Main { Some(self.recompile_crd(res, name, &mut obj, &old)?) } else { None };
        drop_empty_metadata(&mut obj);
        // A no-op write changes nothing: same resourceVersion, no event.
        if obj == *old {
            return Ok((old, warnings));
        }
        let stored = self.put_as(res, &ns, name, obj);
        if self.dry_run {
            return Ok((stored, warnings));
        }
        if let Some(rs) = crd_resources {
            self.serve_crd(name, rs);
        }
        if being_deleted(&stored) && finalizers(&stored).is_empty() && !self.graceful_pending(res, &stored) {
            self.finish_delete(res, &ns, name);
        }
        self.after_write(res, &ns, &stored);
        Ok((stored, warnings))
    }

    pub fn patch(
        &mut self,
        res: &Arc<Resource>,
        ns: Option<&str>,
        name: &str,
        ty: PatchType,
        body: &Value,
        sub: Sub,
    ) -> Result<(Arc<Value>, Vec<String>, bool), ApiError> {
        let ns_s = if res.namespaced { ns.unwrap_or("") } else { "" };
        let Some(old) = self.lookup(res, ns_s, name) else {
            if ty == PatchType::Apply && sub == Sub::Main {
                let mut obj = body.clone();
                if let Some(m) = obj.as_object_mut() {
                    m.entry("metadata").or_insert_with(|| json!({}));
                }
                if meta_str(&obj, "name").is_none() {
                    meta_mut(&mut obj).insert("name".into(), json!(name));
                }
                let (o, w) = self.create(res, ns, obj)?;
                return Ok((o, w, true));
            }
            return Err(ApiError::not_found(res, name));
        };
        let mut obj = (*old).clone();
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), json!(res.api_version()));
        }
        let builtin = res.schema.is_none();
        match ty {
            PatchType::Merge => patch::merge_patch(&mut obj, body),
            PatchType::Json => patch::json_patch(&mut obj, body).map_err(|_| ApiError::json_patch_failed())?,
            PatchType::Strategic if builtin => patch::strategic_merge(&mut obj, body),
            PatchType::Strategic => {
                return Err(ApiError::unsupported_patch_type());
            }
            PatchType::Apply => {
                let mut applied = body.clone();
                if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                patch::apply(&mut obj, &applied, builtin)
            }
        }
        if obj.get("metadata").and_then(|m| m.get("resourceVersion")).is_none_or(Value::is_null) {
            meta_mut(&mut obj).insert("resourceVersion".into(), json!(meta_str(&old, "resourceVersion")));
        }
        let (o, w) = self.update(res, ns, name, obj, sub)?;
        Ok((o, w, false))
    }

    // ---------------------------------------------------------------- delete

    pub fn delete(
        &mut self,
        res: &Arc<Resource>,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        self.delete_as(res, ns, name, opts, None)
    }

    /// [`State::delete`]; `eviction` is `Some` (with the budget that admitted it, if any) when
    /// the eviction subresource asks, so the disruption log says how the pod left.
    pub(super) fn delete_as(
        &mut self,
        res: &Arc<Resource>,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
        eviction: Option<Option<PdbState>>,
    ) -> Result<Arc<Value>, ApiError> {
        let ns = if res.namespaced { ns.unwrap_or("").to_string() } else { String::new() };
        let old = self.get(res, &ns, name)?;
        if let Some(uid) = &opts.precondition_uid
            && meta_str(&old, "uid") != Some(uid.as_str())
        {
            return Err(ApiError::precondition_failed(res, name, "UID", uid, meta_str(&old, "uid").unwrap_or("")));
        }
        if let Some(rv) = &opts.precondition_rv
            && meta_str(&old, "resourceVersion") != Some(rv.as_str())
        {
            return Err(ApiError::precondition_failed(
                res,
                name,
                "ResourceVersion",
                rv,
                meta_str(&old, "resourceVersion").unwrap_or(""),
            ));
        }
        let is_pod = res.group.is_empty() && res.plural == "pods";
        let is_ns = res.group.is_empty() && res.plural == "namespaces";
        let grace = if is_pod { deletion_grace(&old, opts) } else { 0 };
        if is_pod {
            self.record_disruption(&old, grace, eviction);
        }
        let fins = finalizers(&old);
        if is_ns {
            return Ok(self.delete_namespace(res, name, old));
        }
        if !fins.is_empty() || grace > 0 {
            let already = being_deleted(&old);
            let current_grace =
                meta(&old).and_then(|m| m.get("deletionGracePeriodSeconds")).and_then(Value::as_i64).unwrap_or(0);
            if already && !(is_pod && grace < current_grace) {
                return Ok(old);
            }
            let mut obj = (*old).clone();
            let when = self.clock.now() + chrono::Duration::seconds(grace);
            let m = meta_mut(&mut obj);
            m.insert("deletionTimestamp".into(), json!(timestamp(when)));
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            // A pod's graceful deletion is a change of its desired state: a new generation.
            if is_pod && let Some(g) = m.get("generation").and_then(Value::as_i64) {
                m.insert("generation".into(), json!(g + 1));
            }
            if is_pod && grace == 0 && fins.is_empty() {
                // Shortened to zero: deleted now.
                return Ok(self.finish_delete(res, &ns, name).unwrap_or(old));
            }
            let stored = self.put_as(res, &ns, name, obj);
            if !self.dry_run {
                self.after_write(res, &ns, &stored);
            }
            return Ok(stored);
        }
        let orphan = opts.propagation.as_deref() == Some("Orphan");
        let deleted = self.remove_and_collect(res, &ns, name, orphan);
        Ok(deleted.unwrap_or(old))
    }

    /// Final removal after the last finalizer or the kubelet's confirmation (background cascade).
    pub(super) fn finish_delete(&mut self, res: &Resource, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.remove_and_collect(res, ns, name, false)
    }

    fn remove_and_collect(&mut self, res: &Resource, ns: &str, name: &str, orphan: bool) -> Option<Arc<Value>> {
        let key = res.key();
        let mut removed = self.remove(&key, ns, name)?;
        if events::is_events_v1(res) {
            removed = Arc::new(events::from_core(&removed));
        }
        if self.dry_run {
            return Some(removed);
        }
        self.after_delete(res, ns, &removed, orphan);
        Some(removed)
    }
}

/// Empty finalizers, labels, annotations and ownerReferences are not stored (Go's `omitempty`):
/// removing the last finalizer leaves no `finalizers: []` behind.
fn drop_empty_metadata(obj: &mut Value) {
    let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    for k in ["finalizers", "labels", "annotations", "ownerReferences"] {
        let empty = match m.get(k) {
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
            Some(Value::Null) => true,
            _ => false,
        };
        if empty {
            m.remove(k);
        }
    }
}

fn encode_continue(rv: u64, key: &ObjKey) -> String {
    use base64::Engine;
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}", key.0, key.1)}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, ObjKey), ApiError> {
    use base64::Engine;
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;

    /// A fresh store on a manual clock (also for the tests of `behaviour`).
    pub(in crate::apiserver) fn state(seed: u64) -> State {
        let (tx, _) = broadcast::channel(64);
        State::new(Clock::manual_default(), seed, 100, tx)
    }

    pub(in crate::apiserver) fn res(st: &State, group: &str, plural: &str) -> Arc<Resource> {
        st.registry.any_version(group, plural).unwrap()
    }

    #[test]
    fn generated_names_and_uids_follow_the_seed() {
        let mut a = state(9);
        let mut b = state(9);
        let cms = res(&a, "", "configmaps");
        let body = json!({"metadata": {"generateName": "x-"}});
        let (oa, _) = a.create(&cms, Some("default"), body.clone()).unwrap();
        let (ob, _) = b.create(&cms, Some("default"), body).unwrap();
        assert_eq!(meta_str(&oa, "name"), meta_str(&ob, "name"));
        assert_eq!(meta_str(&oa, "uid"), meta_str(&ob, "uid"));
        let name = meta_str(&oa, "name").unwrap();
        assert!(name.starts_with("x-") && name.len() == 7);
    }

    #[test]
    fn long_and_non_ascii_generate_names_do_not_panic() {
        let mut st = state(2);
        let cms = res(&st, "", "configmaps");
        let long = "a".repeat(80);
        let (o, _) = st.create(&cms, Some("default"), json!({"metadata": {"generateName": long}})).unwrap();
        assert_eq!(meta_str(&o, "name").unwrap().len(), 63);
        let err = st.create(&cms, Some("default"), json!({"metadata": {"generateName": "é".repeat(70)}})).unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn history_window_answers_gone() {
        let mut st = state(1);
        let cms = res(&st, "", "configmaps");
        let start = st.rv;
        for i in 0..150 {
            st.create(&cms, Some("default"), json!({"metadata": {"name": format!("c{i}")}})).unwrap();
        }
        assert_eq!(st.history_since(start).unwrap_err().code, 410);
        assert_eq!(st.history_since(st.rv - 10).unwrap().len(), 10);
    }
}
