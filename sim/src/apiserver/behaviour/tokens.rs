//! `sim::apiserver::behaviour::tokens`: service-account tokens the emulator then accepts (under
//! RBAC, `rbac`): the `serviceaccounts/token` subresource (a TokenRequest answered with a token,
//! its expiry, the defaulted audience) and the token controller, which fills a
//! `kubernetes.io/service-account-token` Secret with a token, the namespace and the cluster CA.
//!
//! Owns: minting tokens and recording whom they stand for. Must not: authenticate or authorize a
//! request (the server does, with `rbac`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::apiserver::resources::Resource;
use crate::apiserver::status::ApiError;
use crate::apiserver::store::{State, meta_str, timestamp};

impl State {
    /// A TokenRequest for the service account `ns/name` (`res`: serviceaccounts), at `now`.
    pub(in crate::apiserver) fn token_request(
        &mut self,
        res: &Resource,
        ns: Option<&str>,
        name: &str,
        request: &Value,
        now: DateTime<Utc>,
    ) -> Result<Value, ApiError> {
        let b = request;
        let sa = self.get(res, ns.unwrap_or(""), name)?;
        let token = self.token();
        self.minted_tokens.insert(token.clone(), format!("{}/{name}", ns.unwrap_or("")));
        let secs = b.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
        let exp = timestamp(now + chrono::Duration::seconds(secs));
        let mut out = b.clone();
        out["kind"] = json!("TokenRequest");
        out["apiVersion"] = json!("authentication.k8s.io/v1");
        out["metadata"] =
            json!({"name": name, "namespace": ns, "creationTimestamp": null, "uid": sa.pointer("/metadata/uid")});
        out["status"] = json!({"token": token, "expirationTimestamp": exp});
        // The spec as defaulted: the API server's audience, an hour, no bound object.
        if !out["spec"].is_object() {
            out["spec"] = json!({});
        }
        out["spec"]["expirationSeconds"] = json!(secs);
        if out["spec"].get("audiences").is_none_or(|a| a.as_array().is_none_or(Vec::is_empty)) {
            out["spec"]["audiences"] = json!(["https://kubernetes.default.svc.cluster.local"]);
        }
        if out["spec"].get("boundObjectRef").is_none() {
            out["spec"]["boundObjectRef"] = Value::Null;
        }
        Ok(out)
    }

    /// Fills `token`, `ca.crt` and `namespace` of a `kubernetes.io/service-account-token` Secret
    /// (the token controller's job) with a token this emulator accepts.
    pub(super) fn fill_token_secret(&mut self, ns: &str, obj: &Arc<Value>) {
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
}
