//! The emulator's storage and write semantics: objects as JSON per (group, resource, namespace,
//! name), one resourceVersion counter per cluster (like etcd's revision), the watch event history
//! (a bounded ring: older versions answer `410 Gone`), and what kube-apiserver and the built-in
//! controllers do on writes — defaulting of metadata, optimistic concurrency, status subresource,
//! generation, finalizers and deletionTimestamp, graceful pod deletion, ownerReference cascade,
//! namespace termination, CRD registration, PodDisruptionBudget status and eviction, binding.
//!
//! Must not do: HTTP (the server module parses requests and renders responses) or block: every
//! operation runs under one lock, synchronously.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::disruptions::{DisruptionLog, PdbState, PodDisruption, Via};
use super::events;
use super::object::Stored;
use super::patch::{self, PatchType};
use super::resources::{Registry, Resource};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use crate::clock::{Clock, SeededRng};
use crate::qos::qos_class;

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

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
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

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn being_deleted(obj: &Value) -> bool {
    meta(obj).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|v| !v.is_null()))
}

/// DNS-1123 subdomain check (names of most kinds).
fn dns_subdomain_errors(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    (!ok).then(|| {
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    })
}

fn dns_label_errors(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!ok).then(|| {
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    })
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
    fn put_as(&mut self, res: &Resource, ns: &str, name: &str, obj: Value) -> Arc<Value> {
        if events::is_events_v1(res) {
            let stored = self.put(&res.key(), ns, name, events::to_core(obj));
            return Arc::new(events::from_core(&stored));
        }
        self.put(&res.key(), ns, name, obj)
    }

    fn lookup_key(&self, key: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
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

    pub fn count(&self, key: &ResKey) -> usize {
        self.objects.get(key).map_or(0, BTreeMap::len)
    }

    // ---------------------------------------------------------------- commit primitives

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
    fn put(&mut self, key: &ResKey, ns: &str, name: &str, mut obj: Value) -> Arc<Value> {
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
    fn remove(&mut self, key: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
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

    // ---------------------------------------------------------------- namespaces

    fn check_namespace(&self, res: &Resource, ns: &str, name: &str) -> Result<(), ApiError> {
        let key = ("".to_string(), "namespaces".to_string());
        match self.lookup_key(&key, "", ns) {
            None => Err(ApiError::namespace_not_found(ns)),
            Some(n) if being_deleted(&n) => Err(ApiError::forbidden(
                res,
                name,
                &format!("unable to create new content in namespace {ns} because it is being terminated"),
            )),
            Some(_) => Ok(()),
        }
    }

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

    // ---------------------------------------------------------------- create

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
            self.prepare_builtin_create(res, &name, &mut obj)?;
        }
        if self.lookup(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(res, &name));
        }
        let crd_resources = if res.plural == "customresourcedefinitions" && res.group == "apiextensions.k8s.io" {
            Some(self.compile_crd(res, &name, &mut obj)?)
        } else {
            None
        };
        let stored = self.put_as(res, &ns, &name, obj);
        if self.dry_run {
            return Ok((stored, warnings));
        }
        if let Some(rs) = crd_resources {
            for r in rs {
                self.registry.insert(r);
            }
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

    /// Validation, defaulting and status reset of built-in kinds (the parts clients notice).
    fn prepare_builtin_create(&mut self, res: &Resource, name: &str, obj: &mut Value) -> Result<(), ApiError> {
        let name_err = match res.plural.as_str() {
            "namespaces" | "serviceaccounts" => dns_label_errors(name),
            "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
                (name.contains('/') || name.contains('%') || name == "." || name == "..")
                    .then(|| format!("metadata.name: Invalid value: \"{name}\": may not contain '/'"))
            }
            _ => dns_subdomain_errors(name),
        };
        if let Some(e) = name_err {
            return Err(ApiError::invalid_fields(res, name, &[e]));
        }
        let Some(o) = obj.as_object_mut() else { return Ok(()) };
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "pods") => {
                let spec = o.entry("spec").or_insert_with(|| json!({}));
                let containers_missing = spec.get("containers").and_then(Value::as_array).is_none_or(|c| c.is_empty());
                if containers_missing {
                    return Err(ApiError::invalid_fields(res, name, &["spec.containers: Required value".to_string()]));
                }
                if let Some(s) = spec.as_object_mut() {
                    for (k, v) in [
                        ("restartPolicy", json!("Always")),
                        ("terminationGracePeriodSeconds", json!(30)),
                        ("dnsPolicy", json!("ClusterFirst")),
                        ("schedulerName", json!("default-scheduler")),
                        ("serviceAccountName", json!("default")),
                        ("serviceAccount", json!("default")),
                        ("securityContext", json!({})),
                        ("enableServiceLinks", json!(true)),
                        ("preemptionPolicy", json!("PreemptLowerPriority")),
                        ("priority", json!(0)),
                    ] {
                        s.entry(k).or_insert(v);
                    }
                    // DefaultTolerationSeconds admission.
                    let tolerations = s.entry("tolerations").or_insert_with(|| json!([]));
                    if let Some(t) = tolerations.as_array_mut() {
                        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
                            if !t.iter().any(|x| x.get("key").and_then(Value::as_str) == Some(key)) {
                                t.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
                            }
                        }
                    }
                    for list in ["initContainers", "containers"] {
                        let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) else { continue };
                        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                            c.entry("terminationMessagePath").or_insert(json!("/dev/termination-log"));
                            c.entry("terminationMessagePolicy").or_insert(json!("File"));
                            let policy = default_pull_policy(c.get("image").and_then(Value::as_str).unwrap_or(""));
                            c.entry("imagePullPolicy").or_insert(json!(policy));
                            default_requests_from_limits(c.entry("resources").or_insert(json!({})));
                        }
                    }
                }
                let qos = qos_class(spec);
                let node_bound = spec.get("nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
                let mut status = json!({"phase": "Pending", "qosClass": qos});
                if node_bound {
                    status["conditions"] = json!([]);
                }
                o.insert("status".into(), status);
            }
            ("", "namespaces") => {
                o.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
                o.insert("status".into(), json!({"phase": "Active"}));
                let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
            ("", "secrets") => {
                use base64::Engine;
                // Secret data is base64 (kube-apiserver fails to decode anything else: a 400).
                let bad = o.get("data").and_then(Value::as_object).and_then(|d| {
                    d.values().find_map(|v| {
                        let text = v.as_str().unwrap_or_default();
                        base64::engine::general_purpose::STANDARD.decode(text).err()
                    })
                });
                if let Some(e) = bad {
                    return Err(ApiError::bad_request(format!(
                        "Secret in version \"v1\" cannot be handled as a Secret: {}",
                        base64_error(&e)
                    )));
                }
                o.entry("type").or_insert(json!("Opaque"));
                if let Some(sd) = o.remove("stringData").and_then(|v| v.as_object().cloned()) {
                    let data = o.entry("data").or_insert_with(|| json!({}));
                    if let Some(d) = data.as_object_mut() {
                        for (k, v) in sd {
                            let s = v.as_str().unwrap_or_default();
                            d.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(s)));
                        }
                    }
                }
            }
            ("policy", "poddisruptionbudgets") => {
                // The zero status the disruption controller then fills in.
                o.insert(
                    "status".into(),
                    json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}),
                );
            }
            ("apps", "daemonsets") | ("", "persistentvolumeclaims") => {
                o.insert("status".into(), json!({}));
            }
            ("apps", _) => {}
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                o.remove("status");
            }
            _ => {}
        }
        Ok(())
    }

    /// Compiles a posted CRD; sets the status the CRD controllers would (Established, NamesAccepted).
    fn compile_crd(&mut self, res: &Resource, name: &str, obj: &mut Value) -> Result<Vec<Resource>, ApiError> {
        let crd: CustomResourceDefinition = serde_json::from_value(obj.clone())
            .map_err(|e| ApiError::bad_request(format!("decoding CustomResourceDefinition: {e}")))?;
        let resources = Registry::from_crd(&crd).map_err(|errs| ApiError::invalid_fields(res, name, &errs))?;
        // Another CRD must not serve the same resource.
        for r in &resources {
            if let Some(existing) = self.registry.get(&r.group, &r.version, &r.plural)
                && existing.crd.as_deref() != Some(name)
            {
                return Err(ApiError::invalid_fields(
                    res,
                    name,
                    &[format!("spec.names.plural: Invalid value: \"{}\": already served", r.plural)],
                ));
            }
        }
        let now = self.now();
        let stored: Vec<Value> =
            crd.spec.versions.iter().filter(|v| v.storage).map(|v| Value::String(v.name.clone())).collect();
        let names = serde_json::to_value(&crd.spec.names).unwrap_or_default();
        if let Some(o) = obj.as_object_mut() {
            o.insert(
                "status".into(),
                json!({
                    "acceptedNames": names,
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
                        {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
                    ],
                    "storedVersions": stored,
                }),
            );
        }
        Ok(resources)
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
            if res.plural == "customresourcedefinitions" && res.group == "apiextensions.k8s.io" && sub == Sub::Main {
                let status = old.get("status").cloned();
                let r = self.compile_crd(res, name, &mut obj)?;
                if let (Some(s), Some(o)) = (status, obj.as_object_mut()) {
                    o.insert("status".into(), s);
                }
                Some(r)
            } else {
                None
            };
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
            self.registry.remove_crd(name);
            for r in rs {
                self.registry.insert(r);
            }
        }
        if being_deleted(&stored) && finalizers(&stored).is_empty() && !self.graceful_pending(res, &stored) {
            self.finish_delete(res, &ns, name);
        }
        self.after_write(res, &ns, &stored);
        Ok((stored, warnings))
    }

    /// A pod in graceful deletion waits for its kubelet even with no finalizers left.
    fn graceful_pending(&self, res: &Resource, obj: &Value) -> bool {
        res.group.is_empty()
            && res.plural == "pods"
            && meta(obj).and_then(|m| m.get("deletionGracePeriodSeconds")).and_then(Value::as_i64).unwrap_or(0) > 0
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
    fn delete_as(
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
        // Pods bound to a node terminate gracefully: the kubelet deletes them with grace 0.
        let grace = if is_pod {
            let bound = old.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
            let phase = old.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
            if !bound || phase == "Succeeded" || phase == "Failed" {
                0
            } else {
                opts.grace_period
                    .or_else(|| old.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
                    .unwrap_or(30)
                    .max(0)
            }
        } else {
            0
        };
        if is_pod {
            self.record_disruption(&old, grace, eviction);
        }
        let fins = finalizers(&old);
        if is_ns {
            if !being_deleted(&old) {
                let mut obj = (*old).clone();
                let now = self.now();
                let m = meta_mut(&mut obj);
                m.insert("deletionTimestamp".into(), json!(now));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if let Some(o) = obj.as_object_mut() {
                    o.insert("status".into(), json!({"phase": "Terminating"}));
                }
                let stored = self.put_as(res, "", name, obj);
                if self.dry_run {
                    return Ok(stored);
                }
                self.empty_namespace(name);
                self.finalize_namespaces();
                return Ok(self.lookup(res, "", name).unwrap_or(stored));
            }
            return Ok(old);
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
    fn finish_delete(&mut self, res: &Resource, ns: &str, name: &str) -> Option<Arc<Value>> {
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
        let uid = meta_str(&removed, "uid").unwrap_or("").to_string();
        self.after_delete(res, ns, &removed);
        self.collect_dependents(&uid, orphan);
        self.finalize_namespaces();
        Some(removed)
    }

    /// The garbage collector: dependents of a deleted owner are deleted (background) when none of
    /// their other owners exists, or lose the ownerReference (orphan).
    fn collect_dependents(&mut self, uid: &str, orphan: bool) {
        if uid.is_empty() {
            return;
        }
        let mut dependents = Vec::new();
        for (key, table) in &self.objects {
            for ((ns, name), obj) in table {
                if obj.sum.owners.iter().any(|o| o == uid) {
                    dependents.push((key.clone(), ns.clone(), name.clone()));
                }
            }
        }
        for (key, ns, name) in dependents {
            let Some(res) = self.registry.any_version(&key.0, &key.1) else { continue };
            let Some(obj) = self.lookup(&res, &ns, &name) else { continue };
            let refs: Vec<Value> =
                obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
            let others: Vec<Value> =
                refs.iter().filter(|o| o.get("uid").and_then(Value::as_str) != Some(uid)).cloned().collect();
            let other_alive = others.iter().any(|o| {
                let u = o.get("uid").and_then(Value::as_str).unwrap_or("");
                self.uid_exists(u)
            });
            if orphan || other_alive {
                let mut next = (*obj).clone();
                if others.is_empty() {
                    meta_mut(&mut next).remove("ownerReferences");
                } else {
                    meta_mut(&mut next).insert("ownerReferences".into(), Value::Array(others));
                }
                self.put(&key, &ns, &name, next);
            } else {
                let _ = self.delete(&res, Some(&ns), &name, &DeleteOptions::default());
            }
        }
    }

    fn uid_exists(&self, uid: &str) -> bool {
        !uid.is_empty() && self.objects.values().any(|t| t.values().any(|o| o.sum.uid == uid))
    }

    /// The namespace controller: deletes every object in a terminating namespace.
    fn empty_namespace(&mut self, ns: &str) {
        let mut victims = Vec::new();
        for (key, table) in &self.objects {
            for (n, name) in table.keys() {
                if n == ns {
                    victims.push((key.clone(), name.clone()));
                }
            }
        }
        for (key, name) in victims {
            if let Some(res) = self.registry.any_version(&key.0, &key.1) {
                let _ =
                    self.delete(&res, Some(ns), &name, &DeleteOptions { grace_period: Some(0), ..Default::default() });
            }
        }
    }

    /// Removes terminating namespaces that have become empty.
    fn finalize_namespaces(&mut self) {
        let key = ("".to_string(), "namespaces".to_string());
        let terminating: Vec<String> = self
            .objects
            .get(&key)
            .map(|t| t.iter().filter(|(_, o)| o.sum.deleting).map(|((_, n), _)| n.clone()).collect())
            .unwrap_or_default();
        for ns in terminating {
            let empty = self.objects.iter().all(|(k, t)| k == &key || !t.keys().any(|(n, _)| *n == ns));
            if empty {
                self.remove(&key, "", &ns);
            }
        }
    }

    /// Effects of a write on other objects (what controllers would do).
    fn after_write(&mut self, res: &Resource, ns: &str, obj: &Arc<Value>) {
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "namespaces") if !being_deleted(obj) => {
                let name = meta_str(obj, "name").unwrap_or("").to_string();
                let sa_key = ("".to_string(), "serviceaccounts".to_string());
                if self.lookup_key(&sa_key, &name, "default").is_none()
                    && let Some(sa) = self.registry.get("", "v1", "serviceaccounts")
                {
                    let _ = self.create(&sa, Some(&name), json!({"metadata": {"name": "default"}}));
                }
            }
            ("", "pods") | ("policy", "poddisruptionbudgets") => self.refresh_pdbs(ns),
            ("", "secrets") => self.fill_token_secret(ns, obj),
            _ => {}
        }
    }

    fn after_delete(&mut self, res: &Resource, ns: &str, obj: &Value) {
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "pods") => self.refresh_pdbs(ns),
            ("", "nodes") => {
                // The pod garbage collector: pods bound to a deleted node are deleted.
                let node = meta_str(obj, "name").unwrap_or("").to_string();
                let key = ("".to_string(), "pods".to_string());
                let bound: Vec<(String, String)> = self
                    .objects
                    .get(&key)
                    .map(|t| {
                        t.iter().filter(|(_, p)| p.field("spec.nodeName") == node).map(|(k, _)| k.clone()).collect()
                    })
                    .unwrap_or_default();
                if let Some(pods) = self.registry.get("", "v1", "pods") {
                    for (ns, name) in bound {
                        if let Some(p) = self.lookup(&pods, &ns, &name) {
                            if finalizers(&p).is_empty() {
                                self.finish_delete(&pods, &ns, &name);
                            } else {
                                let _ = self.delete(
                                    &pods,
                                    Some(&ns),
                                    &name,
                                    &DeleteOptions { grace_period: Some(0), ..Default::default() },
                                );
                            }
                        }
                    }
                }
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let name = meta_str(obj, "name").unwrap_or("").to_string();
                let served: Vec<Arc<Resource>> = self
                    .registry
                    .by_gvr
                    .values()
                    .filter(|r| r.crd.as_deref() == Some(name.as_str()))
                    .cloned()
                    .collect();
                if let Some(r) = served.first() {
                    let key = r.key();
                    let keys: Vec<ObjKey> =
                        self.objects.get(&key).map(|t| t.keys().cloned().collect()).unwrap_or_default();
                    for (ns, n) in keys {
                        self.remove(&key, &ns, &n);
                    }
                }
                self.registry.remove_crd(&name);
            }
            _ => {}
        }
    }

    /// Fills `token`, `ca.crt` and `namespace` of a `kubernetes.io/service-account-token` Secret
    /// (the token controller's job) with a token this emulator accepts.
    fn fill_token_secret(&mut self, ns: &str, obj: &Arc<Value>) {
        if obj.get("type").and_then(Value::as_str) != Some("kubernetes.io/service-account-token")
            || obj.pointer("/data/token").is_some()
        {
            return;
        }
        let sa = obj
            .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let token = self.token();
        self.minted_tokens.insert(token.clone(), format!("{ns}/{sa}"));
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut next = (**obj).clone();
        let ca = self.ca_pem.clone();
        if let Some(o) = next.as_object_mut() {
            let data = o.entry("data").or_insert_with(|| json!({}));
            if let Some(d) = data.as_object_mut() {
                d.insert("token".into(), json!(b64(&token)));
                d.insert("namespace".into(), json!(b64(ns)));
                d.insert("ca.crt".into(), json!(b64(&ca)));
            }
        }
        let name = meta_str(obj, "name").unwrap_or("").to_string();
        self.put(&("".into(), "secrets".into()), ns, &name, next);
    }

    // ---------------------------------------------------------------- pods: binding, eviction, PDBs

    pub fn bind(&mut self, ns: &str, name: &str, binding: &Value) -> Result<(), ApiError> {
        let pods = self.registry.get("", "v1", "pods").ok_or_else(ApiError::not_found_path)?;
        let pod = self.get(&pods, ns, name)?;
        let node = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or("");
        if node.is_empty() {
            return Err(ApiError::invalid_fields(&pods, name, &["target.name: Required value".to_string()]));
        }
        if being_deleted(&pod) {
            return Err(ApiError::conflict(&pods, name, "pod is being deleted, cannot be assigned to a host"));
        }
        if let Some(cur) = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
            return Err(ApiError {
                details: Some(json!({"name": name, "kind": "pods/binding"})),
                ..ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{cur}\""
                    ),
                )
            });
        }
        let mut next = (*pod).clone();
        let now = self.now();
        if let Some(o) = next.as_object_mut() {
            if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("nodeName".into(), json!(node));
            }
            let status = o.entry("status").or_insert_with(|| json!({}));
            set_condition(
                status,
                json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}),
            );
        }
        let stored = self.put(&pods.key(), ns, name, next);
        self.after_write(&pods, ns, &stored);
        Ok(())
    }

    /// The eviction subresource: deletes the pod unless a PodDisruptionBudget forbids it (429).
    pub fn evict(&mut self, ns: &str, name: &str, eviction: &Value) -> Result<(), ApiError> {
        let pods = self.registry.get("", "v1", "pods").ok_or_else(ApiError::not_found_path)?;
        let pod = self.get(&pods, ns, name)?;
        let opts = eviction.get("deleteOptions").map(DeleteOptions::from_value).unwrap_or_default();
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
        if being_deleted(&pod) || phase == "Succeeded" || phase == "Failed" {
            self.delete(&pods, Some(ns), name, &opts)?;
            return Ok(());
        }
        let pdb_key = ("policy".to_string(), "poddisruptionbudgets".to_string());
        let labels = pod.pointer("/metadata/labels");
        let matching: Vec<Arc<Value>> = self
            .objects_of(&pdb_key, Some(ns))
            .map(|s| Arc::new(s.value()))
            .filter(|pdb| pdb_selects(pdb, |k| labels.and_then(|l| l.get(k)).and_then(Value::as_str)))
            .collect();
        if matching.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        let mut admitted_by = None;
        if let Some(pdb) = matching.first() {
            let status = self.pdb_status(pdb);
            admitted_by = Some(pdb_state(pdb, &status));
            let allowed = status.get("disruptionsAllowed").and_then(Value::as_i64).unwrap_or(0);
            let healthy = status.get("currentHealthy").and_then(Value::as_i64).unwrap_or(0);
            let desired = status.get("desiredHealthy").and_then(Value::as_i64).unwrap_or(0);
            let policy =
                pdb.pointer("/spec/unhealthyPodEvictionPolicy").and_then(Value::as_str).unwrap_or("IfHealthyBudget");
            let unhealthy_ok = !pod_ready(&pod) && (policy == "AlwaysAllow" || healthy >= desired);
            if allowed <= 0 && !unhealthy_ok {
                let pdb_name = meta_str(pdb, "name").unwrap_or("");
                return Err(ApiError {
                    details: Some(
                        json!({"causes": [{"reason": "DisruptionBudget", "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently")}]}),
                    ),
                    ..ApiError::new(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
                });
            }
        }
        self.delete_as(&pods, Some(ns), name, &opts, Some(admitted_by))?;
        Ok(())
    }

    /// Logs a pod whose termination begins now (not one already terminating or terminal, not a
    /// dry run): how, on which node, and its budget's state before this write.
    fn record_disruption(&self, pod: &Value, grace: i64, eviction: Option<Option<PdbState>>) {
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
        if self.dry_run || being_deleted(pod) || phase == "Succeeded" || phase == "Failed" {
            return;
        }
        let ns = meta_str(pod, "namespace").unwrap_or("");
        let (via, pdb) = match eviction {
            Some(pdb) => (Via::Eviction, pdb),
            None => {
                let pdb_key = ("policy".to_string(), "poddisruptionbudgets".to_string());
                let labels = pod.pointer("/metadata/labels");
                let mut matching = self
                    .objects_of(&pdb_key, Some(ns))
                    .map(|s| s.value())
                    .filter(|pdb| pdb_selects(pdb, |k| labels.and_then(|l| l.get(k)).and_then(Value::as_str)));
                let pdb = match (matching.next(), matching.next()) {
                    (Some(one), None) => Some(pdb_state(&one, &self.pdb_status(&one))),
                    _ => None,
                };
                (Via::Delete { grace_seconds: grace }, pdb)
            }
        };
        self.disruptions.record(PodDisruption {
            seq: 0,
            at: self.clock.now(),
            resource_version: self.rv,
            namespace: ns.to_string(),
            name: meta_str(pod, "name").unwrap_or("").to_string(),
            uid: meta_str(pod, "uid").unwrap_or("").to_string(),
            node: pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()).map(String::from),
            ready: pod_ready(pod),
            via,
            pdb,
        });
    }

    /// What the disruption controller computes for a PDB (pods matched by its selector in its namespace).
    fn pdb_status(&self, pdb: &Value) -> Value {
        let ns = meta_str(pdb, "namespace").unwrap_or("");
        let pods_key = ("".to_string(), "pods".to_string());
        let mut expected = 0i64;
        let mut healthy = 0i64;
        for p in self.objects_of(&pods_key, Some(ns)) {
            if !pdb_selects(pdb, |k| p.label(k)) {
                continue;
            }
            let phase = p.field("status.phase");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            expected += 1;
            if p.sum.ready && !p.sum.deleting {
                healthy += 1;
            }
        }
        let resolve = |v: &Value, round_up: bool| -> i64 {
            match v {
                Value::Number(n) => n.as_i64().unwrap_or(0),
                Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) {
                    Some(p) => {
                        let x = p * expected as f64 / 100.0;
                        if round_up { x.ceil() as i64 } else { x.floor() as i64 }
                    }
                    None => s.parse().unwrap_or(0),
                },
                _ => 0,
            }
        };
        let desired = if let Some(min) = pdb.pointer("/spec/minAvailable") {
            resolve(min, true)
        } else if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
            (expected - resolve(max, true)).max(0)
        } else {
            0
        };
        let allowed = (healthy - desired).max(0);
        let generation = meta(pdb).and_then(|m| m.get("generation")).cloned().unwrap_or(json!(1));
        let mut status = json!({
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
        });
        let now = self.now();
        let prev_cond = pdb.pointer("/status/conditions/0").cloned();
        let (st, reason) = if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
        let ltt = match &prev_cond {
            Some(c) if c.get("status").and_then(Value::as_str) == Some(st) => {
                c.get("lastTransitionTime").cloned().unwrap_or(json!(now))
            }
            _ => json!(now),
        };
        status["conditions"] = json!([{"type": "DisruptionAllowed", "status": st, "reason": reason, "message": "", "observedGeneration": generation, "lastTransitionTime": ltt}]);
        status
    }

    /// Keeps PDB statuses current (the disruption controller), writing only when they change.
    fn refresh_pdbs(&mut self, ns: &str) {
        let key = ("policy".to_string(), "poddisruptionbudgets".to_string());
        let pdbs: Vec<Arc<Value>> = self.objects_of(&key, Some(ns)).map(|s| Arc::new(s.value())).collect();
        for pdb in pdbs {
            let status = self.pdb_status(&pdb);
            if pdb.get("status") != Some(&status) {
                let mut next = (*pdb).clone();
                if let Some(o) = next.as_object_mut() {
                    o.insert("status".into(), status);
                }
                let name = meta_str(&pdb, "name").unwrap_or("").to_string();
                self.put(&key, ns, &name, next);
            }
        }
    }
}

fn set_condition(status: &mut Value, cond: Value) {
    let Some(s) = status.as_object_mut() else { return };
    let conds = s.entry("conditions").or_insert_with(|| json!([]));
    if let Some(a) = conds.as_array_mut() {
        let ty = cond.get("type").cloned();
        match a.iter_mut().find(|c| c.get("type") == ty.as_ref()) {
            Some(c) => *c = cond,
            None => a.push(cond),
        }
    }
}

/// A budget's computed status, for the disruption log.
fn pdb_state(pdb: &Value, status: &Value) -> PdbState {
    let n = |k: &str| status.get(k).and_then(Value::as_i64).unwrap_or(0);
    PdbState {
        name: meta_str(pdb, "name").unwrap_or("").to_string(),
        disruptions_allowed: n("disruptionsAllowed"),
        current_healthy: n("currentHealthy"),
        desired_healthy: n("desiredHealthy"),
        expected_pods: n("expectedPods"),
    }
}

fn pod_ready(p: &Value) -> bool {
    p.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
        cs.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    })
}

/// Whether a PDB's `spec.selector` (matchLabels + matchExpressions) selects the pod. An empty
/// selector selects every pod of the namespace (policy/v1).
fn pdb_selects<'a>(pdb: &Value, get: impl Fn(&str) -> Option<&'a str>) -> bool {
    let Some(sel) = pdb.pointer("/spec/selector") else { return false };
    let ml_ok =
        sel.get("matchLabels").and_then(Value::as_object).is_none_or(|m| m.iter().all(|(k, v)| get(k) == v.as_str()));
    let me_ok = sel.get("matchExpressions").and_then(Value::as_array).is_none_or(|es| {
        es.iter().all(|e| {
            let k = e.get("key").and_then(Value::as_str).unwrap_or("");
            let vals: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                "In" => get(k).is_some_and(|x| vals.contains(&x)),
                "NotIn" => get(k).is_none_or(|x| !vals.contains(&x)),
                "Exists" => get(k).is_some(),
                "DoesNotExist" => get(k).is_none(),
                _ => false,
            }
        })
    });
    ml_ok && me_ok
}

/// Go's wording of a base64 decoding error.
fn base64_error(e: &base64::DecodeError) -> String {
    match e {
        base64::DecodeError::InvalidByte(i, _) | base64::DecodeError::InvalidLastSymbol(i, _) => {
            format!("illegal base64 data at input byte {i}")
        }
        _ => "illegal base64 data at input byte 0".to_string(),
    }
}

/// kube-apiserver's default pull policy: `Always` for an untagged or `:latest` image, else
/// `IfNotPresent`.
fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

/// A container's requests default to its limits, resource by resource (so a pod with limits only
/// is scheduled, and classed Guaranteed, by them).
fn default_requests_from_limits(resources: &mut Value) {
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else { return };
    let Some(r) = resources.as_object_mut() else { return };
    let requests = r.entry("requests").or_insert_with(|| json!({}));
    if let Some(req) = requests.as_object_mut() {
        for (k, v) in limits {
            req.entry(k).or_insert(v);
        }
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
mod tests {
    use super::*;

    fn state(seed: u64) -> State {
        let (tx, _) = broadcast::channel(64);
        State::new(Clock::manual_default(), seed, 100, tx)
    }

    fn res(st: &State, group: &str, plural: &str) -> Arc<Resource> {
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
    fn pdb_status_counts_ready_matching_pods() {
        let mut st = state(1);
        let pods = res(&st, "", "pods");
        let pdbs = res(&st, "policy", "poddisruptionbudgets");
        for (n, ready) in [("a", true), ("b", true), ("c", false)] {
            let mut p =
                json!({"metadata": {"name": n, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}});
            if ready {
                p["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
            }
            st.create(&pods, Some("default"), p.clone()).unwrap();
            if ready {
                st.update(&pods, Some("default"), n, p, Sub::Status).unwrap();
            }
        }
        st.create(
            &pdbs,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "x"}}}}),
        )
        .unwrap();
        let pdb = st.get(&pdbs, "default", "p").unwrap();
        // 3 expected, 50% of 3 rounded up = 2 may be unavailable: 1 desired healthy; 2 healthy.
        assert_eq!(pdb["status"]["expectedPods"], 3);
        assert_eq!(pdb["status"]["currentHealthy"], 2);
        assert_eq!(pdb["status"]["desiredHealthy"], 1);
        assert_eq!(pdb["status"]["disruptionsAllowed"], 1);
        st.evict("default", "a", &json!({})).unwrap();
        let err = st.evict("default", "b", &json!({})).unwrap_err();
        assert_eq!(err.code, 429);
        // The unready pod may go: the budget is met without it.
        st.evict("default", "c", &json!({})).unwrap();
    }

    #[test]
    fn the_disruption_log_says_how_each_pod_began_to_leave_and_under_which_budget() {
        let mut st = state(1);
        let pods = res(&st, "", "pods");
        let pdbs = res(&st, "policy", "poddisruptionbudgets");
        for n in ["a", "b", "c"] {
            let p = json!({"metadata": {"name": n, "labels": {"app": "x"}},
                           "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
            st.create(&pods, Some("default"), p.clone()).unwrap();
            st.update(&pods, Some("default"), n, p, Sub::Status).unwrap();
        }
        st.create(
            &pdbs,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}}),
        )
        .unwrap();
        st.evict("default", "a", &json!({})).unwrap();
        assert_eq!(st.evict("default", "b", &json!({})).unwrap_err().code, 429, "refusals are not logged");
        // A DELETE ignores the budget: logged with the budget's state, which forbade it.
        st.delete(&pods, Some("default"), "b", &DeleteOptions::default()).unwrap();
        // The kubelet confirming a graceful deletion is not a new disruption.
        let confirm = DeleteOptions { grace_period: Some(0), ..DeleteOptions::default() };
        st.delete(&pods, Some("default"), "a", &confirm).unwrap();
        let log = st.disruptions.entries();
        let seen: Vec<(u64, &str, Via, Option<i64>)> = log
            .iter()
            .map(|d| (d.seq, d.name.as_str(), d.via.clone(), d.pdb.as_ref().map(|p| p.disruptions_allowed)))
            .collect();
        assert_eq!(
            seen,
            [(0, "a", Via::Eviction, Some(1)), (1, "b", Via::Delete { grace_seconds: 30 }, Some(0))],
            "{log:#?}"
        );
        assert!(log.iter().all(|d| d.ready && d.node.as_deref() == Some("n1")));
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
