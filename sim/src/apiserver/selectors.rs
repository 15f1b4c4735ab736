//! Label and field selectors, parsed and matched the way apimachinery's `labels.Parse` and
//! `fields.ParseSelector` do for the forms clients send.
//! Must not do: decide which fields a resource supports (the server checks that).

use std::collections::BTreeSet;

#[cfg(test)]
use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector (all requirements must hold).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Req>,
}

/// A selector the API server refuses; its text is the message of the 400 it answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidSelector(String);

impl From<InvalidSelector> for String {
    fn from(e: InvalidSelector) -> String {
        e.0
    }
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn set(s: &str) -> Result<BTreeSet<String>, InvalidSelector> {
    let inner = s.trim();
    let inner = inner
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| InvalidSelector(format!("found '{inner}', expected: '('")))?;
    let vals: BTreeSet<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    for v in &vals {
        if !valid_value(v) {
            return Err(InvalidSelector(format!("invalid label value: \"{v}\"")));
        }
    }
    Ok(vals)
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3`. The error is the message of the 400.
    pub fn parse(s: &str) -> Result<LabelSelector, InvalidSelector> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            let r = if let Some(k) = term.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some(i) = term.find(" notin ") {
                Req::NotIn(term[..i].trim().to_string(), set(&term[i + 7..])?)
            } else if let Some(i) = term.find(" in ") {
                Req::In(term[..i].trim().to_string(), set(&term[i + 4..])?)
            } else if let Some(i) = term.find("!=") {
                Req::Ne(term[..i].trim().to_string(), term[i + 2..].trim().to_string())
            } else if let Some(i) = term.find("==") {
                Req::Eq(term[..i].trim().to_string(), term[i + 2..].trim().to_string())
            } else if let Some(i) = term.find('=') {
                Req::Eq(term[..i].trim().to_string(), term[i + 1..].trim().to_string())
            } else if let Some(i) = term.find('>') {
                let n =
                    term[i + 1..].trim().parse().map_err(|_| InvalidSelector(format!("invalid selector: '{term}'")))?;
                Req::Gt(term[..i].trim().to_string(), n)
            } else if let Some(i) = term.find('<') {
                let n =
                    term[i + 1..].trim().parse().map_err(|_| InvalidSelector(format!("invalid selector: '{term}'")))?;
                Req::Lt(term[..i].trim().to_string(), n)
            } else {
                Req::Exists(term.trim().to_string())
            };
            let (key, val) = match &r {
                Req::Eq(k, v) | Req::Ne(k, v) => (k, Some(v)),
                Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k)
                | Req::Gt(k, _)
                | Req::Lt(k, _) => (k, None),
            };
            if !valid_key(key) {
                return Err(InvalidSelector(format!("unable to parse requirement: invalid label key \"{key}\"")));
            }
            if let Some(v) = val
                && !valid_value(v)
            {
                return Err(InvalidSelector(format!("unable to parse requirement: invalid label value: \"{v}\"")));
            }
            reqs.push(r);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether `obj`'s `metadata.labels` satisfy every requirement.
    #[cfg(test)]
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Whether the labels `get` returns satisfy every requirement.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
            Req::Gt(k, n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x > *n),
            Req::Lt(k, n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma-separated.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FieldSelector {
    pub reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, InvalidSelector> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (f, eq, v) = if let Some(i) = term.find("!=") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = term.find("==") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = term.find('=') {
                (&term[..i], true, &term[i + 1..])
            } else {
                return Err(InvalidSelector(format!("invalid selector: '{s}'; can't understand '{term}'")));
            };
            reqs.push((f.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    #[cfg(test)]
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_with(|f| super::resources::field_string(obj, f))
    }

    /// Whether the fields `get` returns satisfy every term.
    pub fn matches_with(&self, get: impl Fn(&str) -> String) -> bool {
        self.reqs.iter().all(|(f, eq, v)| (get(f) == *v) == *eq)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_match_like_apimachinery() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "fe", "n": "5"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("n>4", true),
            ("n<5", false),
            ("app in (web),tier notin (be)", true),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
        assert!(LabelSelector::parse("a=b c").is_err());
    }

    #[test]
    fn field_selectors_match_nested_fields() {
        let o = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("spec.nodeName=n1,status.phase!=Pending").unwrap().matches(&o));
        assert!(!FieldSelector::parse("metadata.name=q").unwrap().matches(&o));
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&json!({"spec": {}})));
        assert!(FieldSelector::parse("foo").is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_selectors_never_panic(s in "\\PC{0,40}") {
            let o = json!({"metadata": {"labels": {"a": "b"}}});
            if let Ok(l) = LabelSelector::parse(&s) {
                let _ = l.matches(&o);
            }
            if let Ok(f) = FieldSelector::parse(&s) {
                let _ = f.matches(&o);
            }
        }
    }
}
