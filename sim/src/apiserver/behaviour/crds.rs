//! `sim::apiserver::behaviour::crds`: CustomResourceDefinitions. A written CRD is compiled into the
//! resources it serves (refused with kube-apiserver's 422 when invalid or when another CRD serves
//! the same resource), given the status the CRD controllers set (NamesAccepted, Established,
//! storedVersions), and served once stored; a deleted CRD takes its custom resources with it.
//!
//! Owns: the link between stored CRDs and the served resources of the registry. Must not: judge
//! custom resources themselves (their compiled schema does, `sim::schema`).

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::apiserver::resources::{Registry, Resource};
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{ObjKey, State};

/// Whether `res` is the CustomResourceDefinition resource itself.
pub(in crate::apiserver) fn is_crd(res: &Resource) -> bool {
    res.plural == "customresourcedefinitions" && res.group == "apiextensions.k8s.io"
}

impl State {
    /// Compiles a posted CRD; sets the status the CRD controllers would (Established, NamesAccepted).
    pub(in crate::apiserver) fn compile_crd(
        &mut self,
        res: &Resource,
        name: &str,
        obj: &mut Value,
    ) -> Result<Vec<Resource>, ApiError> {
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

    /// [`State::compile_crd`] for an update of the CRD `old`: its status stays as stored.
    pub(in crate::apiserver) fn recompile_crd(
        &mut self,
        res: &Resource,
        name: &str,
        obj: &mut Value,
        old: &Value,
    ) -> Result<Vec<Resource>, ApiError> {
        let status = old.get("status").cloned();
        let r = self.compile_crd(res, name, obj)?;
        if let (Some(s), Some(o)) = (status, obj.as_object_mut()) {
            o.insert("status".into(), s);
        }
        Ok(r)
    }

    /// Serves what the stored CRD `name` compiled to, in place of what it served before (nothing,
    /// when it was just created).
    pub(in crate::apiserver) fn serve_crd(&mut self, name: &str, resources: Vec<Resource>) {
        self.registry.remove_crd(name);
        for r in resources {
            self.registry.insert(r);
        }
    }

    /// After the CRD `name` is deleted: its custom resources are removed (finalizers or not, each
    /// with its DELETED event) and it serves nothing.
    pub(super) fn unserve_crd(&mut self, name: &str) {
        let served: Vec<Arc<Resource>> =
            self.registry.by_gvr.values().filter(|r| r.crd.as_deref() == Some(name)).cloned().collect();
        if let Some(r) = served.first() {
            let key = r.key();
            let keys: Vec<ObjKey> = self.entries_of(&key).map(|(k, _)| k.clone()).collect();
            for (ns, n) in keys {
                self.remove(&key, &ns, &n);
            }
        }
        self.registry.remove_crd(name);
    }
}
