//! `sim::apiserver::behaviour::secrets`: what kube-apiserver does to a created Secret: `data` must
//! be base64 (else 400, worded like Go's decoder), `type` defaults to `Opaque`, `stringData` is
//! encoded into `data` and not stored.
//!
//! Owns: Secret admission. Must not: fill service-account token Secrets (`tokens` does).

use serde_json::{Map, Value, json};

use crate::apiserver::status::ApiError;

/// Checks and defaults a created Secret.
pub(super) fn admit_secret(o: &mut Map<String, Value>) -> Result<(), ApiError> {
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
    Ok(())
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
