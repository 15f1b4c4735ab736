//! `sim::apiserver::behaviour`: what kube-apiserver's admission and registry strategies, and the
//! controllers of kube-controller-manager, do with built-in kinds beyond storing them. One module
//! per behaviour, so that "how does the emulator evict a pod" is answered in one place:
//! - `names`: which names a built-in kind accepts;
//! - `pods`: pod defaults and initial status (QoS class: `crate::qos`), a deletion's grace
//!   period, the pod garbage collector (pods of a deleted Node);
//! - `binding`: `pods/binding`;
//! - `eviction`: `pods/eviction` and the disruption log's records;
//! - `disruption`: the disruption controller (PodDisruptionBudget status);
//! - `namespaces`: namespace lifecycle admission, defaults, `default` ServiceAccount, deletion;
//! - `garbage`: the garbage collector (ownerReference cascade);
//! - `crds`: CustomResourceDefinitions compiled, served and unserved;
//! - `secrets`: Secret admission (base64 data, stringData);
//! - `tokens`: TokenRequest and token Secrets.
//!
//! Owns: which behaviour runs for which kind: admission of a created built-in object
//! ([`State::admit_builtin_create`], called by the store before it stores it) and the
//! controllers' reactions to a write or a removal ([`State::after_write`], [`State::after_delete`]).
//! Where the store's own path forks by kind, it calls the module directly: a namespace's
//! existence and deletion, a CRD's compilation, a pod's deletion grace and disruption record.
//! Must not: HTTP (the server), or change objects other than through the store's operations and
//! primitives, so that every change gets a resourceVersion and a watch event; default or validate
//! custom resources (their schemas do).

mod binding;
mod crds;
mod disruption;
mod eviction;
mod garbage;
mod names;
mod namespaces;
mod pods;
mod secrets;
mod tokens;

use std::sync::Arc;

use serde_json::{Value, json};

pub(super) use crds::is_crd;
pub(super) use pods::deletion_grace;

use super::resources::Resource;
use super::status::ApiError;
use super::store::{State, meta_str};

impl State {
    /// Validation, defaulting and status reset of a created object of a built-in kind (the parts
    /// clients notice).
    pub(super) fn admit_builtin_create(&mut self, res: &Resource, name: &str, obj: &mut Value) -> Result<(), ApiError> {
        if let Some(e) = names::name_error(res, name) {
            return Err(ApiError::invalid_fields(res, name, &[e]));
        }
        let Some(o) = obj.as_object_mut() else { return Ok(()) };
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "pods") => pods::default_pod(res, name, o)?,
            ("", "namespaces") => namespaces::default_namespace(obj, name),
            ("", "secrets") => secrets::admit_secret(o)?,
            ("policy", "poddisruptionbudgets") => {
                // The zero status the disruption controller then fills in.
                o.insert("status".into(), disruption::initial_status());
            }
            ("apps", "daemonsets") | ("", "persistentvolumeclaims") => {
                o.insert("status".into(), json!({}));
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                o.remove("status");
            }
            _ => {}
        }
        Ok(())
    }

    /// Effects of a stored write of `obj` (of `res`, in `ns`) on other objects: what controllers
    /// would do.
    pub(super) fn after_write(&mut self, res: &Resource, ns: &str, obj: &Arc<Value>) {
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "namespaces") => self.ensure_default_service_account(obj),
            ("", "pods") | ("policy", "poddisruptionbudgets") => self.refresh_pdbs(ns),
            ("", "secrets") => self.fill_token_secret(ns, obj),
            _ => {}
        }
    }

    /// Effects of the removal of `removed` (of `res`, in `ns`): the controllers of its kind, then
    /// the garbage collector (its dependents; `orphan`: they only lose the reference), then the
    /// namespace controller (terminating namespaces this left empty go).
    pub(super) fn after_delete(&mut self, res: &Resource, ns: &str, removed: &Value, orphan: bool) {
        match (res.group.as_str(), res.plural.as_str()) {
            ("", "pods") => self.refresh_pdbs(ns),
            ("", "nodes") => self.delete_pods_of_node(meta_str(removed, "name").unwrap_or("")),
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                self.unserve_crd(meta_str(removed, "name").unwrap_or(""));
            }
            _ => {}
        }
        let uid = meta_str(removed, "uid").unwrap_or("").to_string();
        self.collect_dependents(&uid, orphan);
        self.finalize_namespaces();
    }
}
