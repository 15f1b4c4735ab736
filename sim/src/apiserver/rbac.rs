//! RBAC authorization for service-account tokens the emulator minted (TokenRequest, token Secrets):
//! Roles, ClusterRoles, RoleBindings and ClusterRoleBindings evaluated the way kube-apiserver's RBAC
//! authorizer does (apiGroups, resources incl. `pods/eviction` and `*/sub`, verbs, resourceNames).
//! The cluster's admin token is a superuser; non-resource paths (discovery, `/version`) are open to
//! every authenticated identity, as `system:discovery` makes them.
//! Must not do: authentication (the server checks tokens) or aggregation of ClusterRoles.

use serde_json::Value;

use super::status::ApiError;
use super::store::State;

/// The identity behind a minted token.
#[derive(Clone, Debug)]
pub(crate) struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccount {
    pub fn parse(s: &str) -> ServiceAccount {
        let (ns, name) = s.split_once('/').unwrap_or(("", s));
        ServiceAccount { namespace: ns.into(), name: name.into() }
    }

    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    fn is_subject(&self, subjects: Option<&Value>) -> bool {
        let groups = [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{}", self.namespace),
            "system:authenticated".to_string(),
        ];
        subjects.and_then(Value::as_array).is_some_and(|subs| {
            subs.iter().any(|s| {
                let kind = s.get("kind").and_then(Value::as_str).unwrap_or("");
                let name = s.get("name").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "ServiceAccount" => {
                        name == self.name && s.get("namespace").and_then(Value::as_str).unwrap_or("") == self.namespace
                    }
                    "User" => name == self.user(),
                    "Group" => groups.iter().any(|g| g == name),
                    _ => false,
                }
            })
        })
    }
}

/// One request to authorize.
#[derive(Debug)]
pub(crate) struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

fn has(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|x| x.as_str() == Some(want) || x.as_str() == Some("*")))
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    if !has(rule.get("verbs"), a.verb) || !has(rule.get("apiGroups"), a.group) {
        return false;
    }
    let combined = match a.subresource {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    let resource_ok = rule.get("resources").and_then(Value::as_array).is_some_and(|rs| {
        rs.iter()
            .filter_map(Value::as_str)
            .any(|r| r == "*" || r == combined || a.subresource.is_some_and(|s| r.strip_prefix("*/") == Some(s)))
    });
    if !resource_ok {
        return false;
    }
    match rule.get("resourceNames").and_then(Value::as_array) {
        Some(names) if !names.is_empty() => a.name.is_some_and(|n| names.iter().any(|x| x.as_str() == Some(n))),
        _ => true,
    }
}

fn role_rules(st: &State, kind: &str, name: &str, ns: &str) -> Vec<Value> {
    let (plural, ns) = if kind == "ClusterRole" { ("clusterroles", "") } else { ("roles", ns) };
    let Some(res) = st.registry.get("rbac.authorization.k8s.io", "v1", plural) else { return Vec::new() };
    st.lookup(&res, ns, name).and_then(|r| r.get("rules").and_then(Value::as_array).cloned()).unwrap_or_default()
}

/// `Ok` if allowed, else the 403 kube-apiserver returns.
pub(crate) fn authorize(st: &State, sa: &ServiceAccount, a: &Attributes<'_>) -> Result<(), ApiError> {
    let mut rules = Vec::new();
    if let Some(crbs) = st.registry.get("rbac.authorization.k8s.io", "v1", "clusterrolebindings") {
        for b in st.objects_of(&crbs.key(), None) {
            let b = b.value();
            if sa.is_subject(b.get("subjects")) {
                let name = b.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("");
                rules.extend(role_rules(st, "ClusterRole", name, ""));
            }
        }
    }
    if let (Some(ns), Some(rbs)) = (a.namespace, st.registry.get("rbac.authorization.k8s.io", "v1", "rolebindings")) {
        for b in st.objects_of(&rbs.key(), Some(ns)) {
            let b = b.value();
            if sa.is_subject(b.get("subjects")) {
                let kind = b.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or("");
                let name = b.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("");
                rules.extend(role_rules(st, kind, name, ns));
            }
        }
    }
    if rules.iter().any(|r| rule_allows(r, a)) {
        return Ok(());
    }
    let combined = match a.subresource {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    let what = match a.name {
        Some(n) => format!("{} \"{n}\"", qualified(a)),
        None => qualified(a),
    };
    let scope = match a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let mut e = ApiError::new(
        403,
        "Forbidden",
        format!(
            "{what} is forbidden: User \"{}\" cannot {} resource \"{combined}\" in API group \"{}\" {scope}",
            sa.user(),
            a.verb,
            a.group
        ),
    );
    let mut d = serde_json::json!({"kind": a.resource});
    if let Some(n) = a.name {
        d["name"] = serde_json::json!(n);
    }
    if !a.group.is_empty() {
        d["group"] = serde_json::json!(a.group);
    }
    e.details = Some(d);
    Err(e)
}

fn qualified(a: &Attributes<'_>) -> String {
    let base = match a.subresource {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    if a.group.is_empty() { base } else { format!("{}.{}", a.resource, a.group) }
}
