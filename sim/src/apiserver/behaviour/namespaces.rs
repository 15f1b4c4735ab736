//! `sim::apiserver::behaviour::namespaces`: namespaces' life. Admission refuses content in a
//! namespace that does not exist or is terminating; a created namespace gets its finalizer, phase
//! and `kubernetes.io/metadata.name` label, and (the service account controller) its `default`
//! ServiceAccount; a deleted one turns Terminating, the namespace controller deletes its contents
//! and the namespace goes once it is empty.
//!
//! Owns: those rules. Must not: delete or store other than through the store's operations.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::resources::Resource;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{DeleteOptions, ResKey, State, being_deleted, meta_mut, meta_str};

/// Defaults of a created namespace named `name`.
pub(super) fn default_namespace(obj: &mut Value, name: &str) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
        o.insert("status".into(), json!({"phase": "Active"}));
    }
    let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
}

impl State {
    /// The NamespaceLifecycle admission: an object of `res` named `name` may be created in `ns`.
    pub(in crate::apiserver) fn check_namespace(&self, res: &Resource, ns: &str, name: &str) -> Result<(), ApiError> {
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

    /// The service account controller: a namespace that is not terminating has a `default`
    /// ServiceAccount.
    pub(super) fn ensure_default_service_account(&mut self, namespace: &Value) {
        if being_deleted(namespace) {
            return;
        }
        let name = meta_str(namespace, "name").unwrap_or("").to_string();
        let sa_key = ("".to_string(), "serviceaccounts".to_string());
        if self.lookup_key(&sa_key, &name, "default").is_none()
            && let Some(sa) = self.registry.get("", "v1", "serviceaccounts")
        {
            let _ = self.create(&sa, Some(&name), json!({"metadata": {"name": "default"}}));
        }
    }

    /// A DELETE of the namespace `old` (named `name`): it turns Terminating, its contents are
    /// deleted and it goes when empty (answered as it is then); deleting it again changes nothing.
    pub(in crate::apiserver) fn delete_namespace(&mut self, res: &Resource, name: &str, old: Arc<Value>) -> Arc<Value> {
        if being_deleted(&old) {
            return old;
        }
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
            return stored;
        }
        self.empty_namespace(name);
        self.finalize_namespaces();
        self.lookup(res, "", name).unwrap_or(stored)
    }

    /// The namespace controller: deletes every object in a terminating namespace.
    fn empty_namespace(&mut self, ns: &str) {
        let victims: Vec<(ResKey, String)> = self
            .all_objects()
            .filter(|(_, (n, _), _)| n == ns)
            .map(|(key, (_, name), _)| (key.clone(), name.clone()))
            .collect();
        for (key, name) in victims {
            if let Some(res) = self.registry.any_version(&key.0, &key.1) {
                let _ =
                    self.delete(&res, Some(ns), &name, &DeleteOptions { grace_period: Some(0), ..Default::default() });
            }
        }
    }

    /// Removes terminating namespaces that have become empty.
    pub(super) fn finalize_namespaces(&mut self) {
        let key = ("".to_string(), "namespaces".to_string());
        let terminating: Vec<String> =
            self.entries_of(&key).filter(|(_, o)| o.sum.deleting).map(|((_, n), _)| n.clone()).collect();
        for ns in terminating {
            let empty = !self.all_objects().any(|(k, (n, _), _)| k != &key && *n == ns);
            if empty {
                self.remove(&key, "", &ns);
            }
        }
    }
}
