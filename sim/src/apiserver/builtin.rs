//! Unknown fields of the built-in kinds: kube-apiserver decodes a built-in object into its Go type,
//! so a field that type does not have is dropped with a `unknown field "…"` warning, or, with
//! `fieldValidation=Strict`, refused (400 "strict decoding error"). The emulator finds such fields
//! by decoding the body into the k8s-openapi type of the kind and noting what did not survive.
//! Must not do: refuse a body the typed decoding cannot read at all (k8s-openapi is stricter than
//! Go's decoder, e.g. for a number given as a quantity): such a body is left as it is.

use serde_json::Value;

use super::resources::Resource;

/// The paths (`spec.bogus`, `spec.containers[0].bogus`) of `body`'s fields that the kind's type
/// does not have; `None` for a kind without a type here or a body the type cannot decode.
pub(crate) fn unknown_fields(res: &Resource, body: &Value) -> Option<Vec<String>> {
    // k8s-openapi's types insist on their apiVersion and kind, which patches leave out.
    let mut whole = body.clone();
    if let Some(o) = whole.as_object_mut() {
        o.insert("apiVersion".into(), Value::String(res.api_version()));
        o.insert("kind".into(), Value::String(res.kind.clone()));
    }
    let typed = round_trip(&res.group, &res.plural, &whole)?;
    let mut out = Vec::new();
    diff(body, &typed, String::new(), &mut out);
    Some(out)
}

/// Removes the fields at `paths` (as [`unknown_fields`] names them) from `body`.
pub(crate) fn prune(body: &mut Value, paths: &[String]) {
    for path in paths {
        remove(body, path);
    }
}

fn round_trip(group: &str, plural: &str, body: &Value) -> Option<Value> {
    use k8s_openapi::api::{apps, coordination, core, events, policy, rbac, storage};
    fn via<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Option<Value> {
        serde_json::from_value::<T>(v.clone()).ok().and_then(|t| serde_json::to_value(t).ok())
    }
    match (group, plural) {
        ("", "pods") => via::<core::v1::Pod>(body),
        ("", "nodes") => via::<core::v1::Node>(body),
        ("", "namespaces") => via::<core::v1::Namespace>(body),
        ("", "configmaps") => via::<core::v1::ConfigMap>(body),
        ("", "podtemplates") => via::<core::v1::PodTemplate>(body),
        ("", "secrets") => via::<core::v1::Secret>(body),
        ("", "serviceaccounts") => via::<core::v1::ServiceAccount>(body),
        ("", "events") => via::<core::v1::Event>(body),
        ("", "persistentvolumeclaims") => via::<core::v1::PersistentVolumeClaim>(body),
        ("", "services") => via::<core::v1::Service>(body),
        ("apps", "daemonsets") => via::<apps::v1::DaemonSet>(body),
        ("policy", "poddisruptionbudgets") => via::<policy::v1::PodDisruptionBudget>(body),
        ("coordination.k8s.io", "leases") => via::<coordination::v1::Lease>(body),
        ("events.k8s.io", "events") => via::<events::v1::Event>(body),
        ("rbac.authorization.k8s.io", "roles") => via::<rbac::v1::Role>(body),
        ("rbac.authorization.k8s.io", "rolebindings") => via::<rbac::v1::RoleBinding>(body),
        ("rbac.authorization.k8s.io", "clusterroles") => via::<rbac::v1::ClusterRole>(body),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => via::<rbac::v1::ClusterRoleBinding>(body),
        ("storage.k8s.io", "storageclasses") => via::<storage::v1::StorageClass>(body),
        ("storage.k8s.io", "volumeattachments") => via::<storage::v1::VolumeAttachment>(body),
        ("storage.k8s.io", "csinodes") => via::<storage::v1::CSINode>(body),
        ("", "persistentvolumes") => via::<core::v1::PersistentVolume>(body),
        _ => None,
    }
}

fn diff(original: &Value, typed: &Value, path: String, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                // A null is "unset" to both decoders; directives (`$patch`, `$setElementOrder/…`)
                // belong to strategic merge patches, not to the type.
                if v.is_null() || k.starts_with('$') {
                    continue;
                }
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match t.get(k) {
                    Some(tv) => diff(v, tv, p, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, (v, tv)) in o.iter().zip(t).enumerate() {
                diff(v, tv, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn remove(v: &mut Value, path: &str) {
    // The first segment: a key, possibly followed by `[i]` indexes.
    let (head, rest) = match path.find(['.', '[']) {
        Some(i) if path.as_bytes()[i] == b'.' => (&path[..i], Some(&path[i + 1..])),
        Some(i) => (&path[..i], Some(&path[i..])),
        None => (path, None),
    };
    if head.is_empty() {
        // `[i]…` on an array.
        if let (Some(r), Value::Array(a)) = (rest, v)
            && let Some(end) = r.find(']')
            && let Ok(i) = r[1..end].parse::<usize>()
            && let Some(item) = a.get_mut(i)
        {
            let after = r[end + 1..].strip_prefix('.').unwrap_or(&r[end + 1..]);
            if !after.is_empty() {
                remove(item, after);
            }
        }
        return;
    }
    let Some(m) = v.as_object_mut() else { return };
    match rest {
        None => {
            m.remove(head);
        }
        Some(r) => {
            if let Some(child) = m.get_mut(head) {
                remove(child, r);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> std::sync::Arc<Resource> {
        super::super::resources::Registry::builtin().get("", "v1", "pods").unwrap()
    }

    #[test]
    fn finds_and_prunes_unknown_fields_of_a_built_in_kind() {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"any": "label"}, "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "i", "typo": true}], "nodeName": null},
            "extra": {}
        });
        let unknown = unknown_fields(&pods(), &pod).unwrap();
        assert_eq!(unknown, ["extra", "metadata.bogus", "spec.containers[0].typo"]);
        prune(&mut pod, &unknown);
        assert_eq!(unknown_fields(&pods(), &pod).unwrap(), Vec::<String>::new());
        assert_eq!(pod["metadata"]["labels"]["any"], "label", "map keys are data, not fields");
        assert_eq!(pod["spec"]["containers"][0], json!({"name": "c", "image": "i"}));
    }

    #[test]
    fn a_body_the_type_cannot_decode_is_left_alone() {
        // The store's own checks answer for such a body.
        let pod = json!({"spec": {"containers": "not a list", "bogus": 1}});
        assert_eq!(unknown_fields(&pods(), &pod), None);
        // A patch (no apiVersion, no kind) is checked too.
        let patch = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"nodeNam": "n"}});
        assert_eq!(unknown_fields(&pods(), &patch).unwrap(), ["spec.nodeNam"]);
    }
}
