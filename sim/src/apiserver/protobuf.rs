//! Just enough of Kubernetes' protobuf encoding to accept the bodies `kubectl create <generator>`
//! sends (`kubectl create namespace|configmap|secret|serviceaccount`): the `k8s\0` envelope
//! (`runtime.Unknown`) and those four kinds with their ObjectMeta, decoded to JSON. Anything else
//! in protobuf is refused by the caller with 415, and responses are always JSON.
//! Must not do: encoding, or kinds beyond these.

use base64::Engine;
use serde_json::{Map, Value, json};

/// One decoded field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// The fields of a message, in order (groups and fixed-width fields are skipped).
fn fields(buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((num, Field::Varint(varint(buf, &mut pos)?))),
            1 => pos += 8,
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len)?;
                out.push((num, Field::Bytes(buf.get(pos..end)?)));
                pos = end;
            }
            5 => pos += 4,
            _ => return None,
        }
    }
    Some(out)
}

fn string(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

/// A `map<string, string>` (or `map<string, bytes>` rendered base64 when `bytes`) entry.
fn map_entry(b: &[u8], bytes: bool) -> Option<(String, Value)> {
    let mut k = String::new();
    let mut v = Value::String(String::new());
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => k = String::from_utf8_lossy(x).into_owned(),
            (2, Field::Bytes(x)) if bytes => v = json!(base64::engine::general_purpose::STANDARD.encode(x)),
            (2, Field::Bytes(x)) => v = string(x),
            _ => {}
        }
    }
    Some((k, v))
}

fn insert_entry(m: &mut Map<String, Value>, key: &str, b: &[u8], bytes: bool) -> Option<()> {
    let (k, v) = map_entry(b, bytes)?;
    if let Some(o) = m.entry(key).or_insert_with(|| json!({})).as_object_mut() {
        o.insert(k, v);
    }
    Some(())
}

fn object_meta(b: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), string(x));
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), string(x));
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), string(x));
            }
            (11, Field::Bytes(x)) => insert_entry(&mut m, "labels", x, false)?,
            (12, Field::Bytes(x)) => insert_entry(&mut m, "annotations", x, false)?,
            (14, Field::Bytes(x)) => {
                if let Some(a) = m.entry("finalizers").or_insert_with(|| json!([])).as_array_mut() {
                    a.push(string(x));
                }
            }
            _ => {}
        }
    }
    Some(Value::Object(m))
}

fn object_reference_name(b: &[u8]) -> Option<Value> {
    // ObjectReference.name is field 3; LocalObjectReference.name is field 1.
    let fs = fields(b)?;
    let name = fs.iter().find_map(|(n, f)| match (n, f) {
        (3, Field::Bytes(x)) | (1, Field::Bytes(x)) => Some(string(x)),
        _ => None,
    });
    Some(json!({"name": name.unwrap_or(Value::String(String::new()))}))
}

/// Decodes a `k8s\0`-prefixed protobuf body into the JSON object, or `None` if it is not one of the
/// supported kinds (or not valid).
pub(crate) fn decode(body: &[u8]) -> Option<Value> {
    let envelope = body.strip_prefix(b"k8s\0")?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (n, f) in fields(envelope)? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (tn, tf) in fields(tm)? {
                    match (tn, tf) {
                        (1, Field::Bytes(x)) => api_version = String::from_utf8_lossy(x).into_owned(),
                        (2, Field::Bytes(x)) => kind = String::from_utf8_lossy(x).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    if api_version != "v1" {
        return None;
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    for (n, f) in fields(raw)? {
        match (kind.as_str(), n, f) {
            (_, 1, Field::Bytes(x)) => {
                obj.insert("metadata".into(), object_meta(x)?);
            }
            ("Namespace", 2, Field::Bytes(spec)) => {
                let fins: Vec<Value> = fields(spec)?
                    .into_iter()
                    .filter_map(|(n, f)| match (n, f) {
                        (1, Field::Bytes(x)) => Some(string(x)),
                        _ => None,
                    })
                    .collect();
                obj.insert("spec".into(), json!({"finalizers": fins}));
            }
            ("ConfigMap", 2, Field::Bytes(x)) => insert_entry(&mut obj, "data", x, false)?,
            ("ConfigMap", 3, Field::Bytes(x)) => insert_entry(&mut obj, "binaryData", x, true)?,
            ("ConfigMap", 4, Field::Varint(v)) => {
                obj.insert("immutable".into(), json!(v != 0));
            }
            ("Secret", 2, Field::Bytes(x)) => insert_entry(&mut obj, "data", x, true)?,
            ("Secret", 3, Field::Bytes(x)) => {
                obj.insert("type".into(), string(x));
            }
            ("Secret", 4, Field::Bytes(x)) => insert_entry(&mut obj, "stringData", x, false)?,
            ("Secret", 5, Field::Varint(v)) => {
                obj.insert("immutable".into(), json!(v != 0));
            }
            ("ServiceAccount", 2, Field::Bytes(x)) => {
                if let Some(a) = obj.entry("secrets").or_insert_with(|| json!([])).as_array_mut() {
                    a.push(object_reference_name(x)?);
                }
            }
            ("ServiceAccount", 3, Field::Bytes(x)) => {
                if let Some(a) = obj.entry("imagePullSecrets").or_insert_with(|| json!([])).as_array_mut() {
                    a.push(object_reference_name(x)?);
                }
            }
            ("ServiceAccount", 4, Field::Varint(v)) => {
                obj.insert("automountServiceAccountToken".into(), json!(v != 0));
            }
            _ => {}
        }
    }
    matches!(kind.as_str(), "Namespace" | "ConfigMap" | "Secret" | "ServiceAccount").then_some(Value::Object(obj))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_configmap_like_kubectl_sends_it() {
        let mut meta = field(1, b"settings");
        meta.extend(field(11, &[field(1, b"app"), field(2, b"web")].concat()));
        let mut raw = field(1, &meta);
        raw.extend(field(2, &[field(1, b"k"), field(2, b"v")].concat()));
        let tm = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let mut body = b"k8s\0".to_vec();
        body.extend(field(1, &tm));
        body.extend(field(2, &raw));
        let v = decode(&body).unwrap();
        assert_eq!(v["kind"], "ConfigMap");
        assert_eq!(v["metadata"]["name"], "settings");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["data"]["k"], "v");
        assert!(decode(b"k8s\0\xff").is_none());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let mut body = b"k8s\0".to_vec();
            body.extend(bytes);
            let _ = decode(&body);
        }
    }
}
