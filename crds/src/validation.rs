//! Kubernetes name and label syntax, as code. The CRD schemas check the same shapes with patterns;
//! these functions add what a pattern cannot express (per-part lengths) and serve the hub and the
//! webhook, so that the two can never disagree.
//!
//! Pure predicates returning a reason a user can act on; no I/O.

/// Why a string is not a valid name, value or key; the message reads after the string ("'x' must ...").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("must not be empty")]
    Empty,
    /// Longer than the kind of string allows.
    #[error("must be at most {max} characters (has {len})")]
    TooLong {
        /// The longest allowed.
        max: usize,
        /// Its length.
        len: usize,
    },
    #[error(
        "must consist of lowercase letters, digits and '-', and start and end with a letter or digit (e.g. 'prod-1')"
    )]
    NotDns1123Label,
    #[error("must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric (e.g. 'my-value')")]
    NotLabelValue,
    /// One dot-separated part of a subdomain is not a DNS-1123 label.
    #[error("'{part}' {reason}")]
    SubdomainPart {
        /// The part.
        part: String,
        /// Why it is not a label.
        reason: Box<Reason>,
    },
    #[error("prefix part must not be empty")]
    EmptyPrefix,
    /// The prefix of a qualified name is not a DNS-1123 subdomain.
    #[error("prefix part {0}")]
    Prefix(Box<Reason>),
    #[error("name part must not be empty")]
    EmptyName,
    /// The name part of a qualified name is not a label value.
    #[error("name part {0}")]
    Name(Box<Reason>),
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// DNS-1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric, at most 63.
pub fn dns1123_label(s: &str) -> Result<(), Reason> {
    if s.is_empty() {
        return Err(Reason::Empty);
    }
    if s.len() > 63 {
        return Err(Reason::TooLong { max: 63, len: s.len() });
    }
    let ok_chars = s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let ends = s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok_chars && ends { Ok(()) } else { Err(Reason::NotDns1123Label) }
}

/// DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253.
pub fn dns1123_subdomain(s: &str) -> Result<(), Reason> {
    if s.len() > 253 {
        return Err(Reason::TooLong { max: 253, len: s.len() });
    }
    for part in s.split('.') {
        dns1123_label(part)
            .map_err(|reason| Reason::SubdomainPart { part: part.to_string(), reason: Box::new(reason) })?;
    }
    Ok(())
}

/// Label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn label_value(s: &str) -> Result<(), Reason> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > 63 {
        return Err(Reason::TooLong { max: 63, len: s.len() });
    }
    let ok_chars = s.chars().all(|c| is_alnum(c) || matches!(c, '-' | '_' | '.'));
    if ok_chars && s.starts_with(is_alnum) && s.ends_with(is_alnum) { Ok(()) } else { Err(Reason::NotLabelValue) }
}

/// Qualified name (`[prefix/]name`), as label and taint keys: the name part follows the label-value
/// rules and is non-empty; the optional prefix is a DNS-1123 subdomain.
pub fn qualified_name(s: &str) -> Result<(), Reason> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err(Reason::EmptyPrefix);
        }
        dns1123_subdomain(prefix).map_err(|e| Reason::Prefix(Box::new(e)))?;
    }
    if name.is_empty() {
        return Err(Reason::EmptyName);
    }
    label_value(name).map_err(|e| Reason::Name(Box::new(e)))
}

/// Domain of a key: the part before `/`, or empty.
pub fn key_domain(key: &str) -> &str {
    key.split_once('/').map(|(d, _)| d).unwrap_or("")
}

/// True when `key`'s domain is `domain` or one of its subdomains.
pub fn in_domain(key: &str, domain: &str) -> bool {
    let d = key_domain(key);
    d == domain || d.ends_with(&format!(".{domain}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_label("prod-1").is_ok());
        assert!(dns1123_label("Prod").is_err());
        assert!(dns1123_label("-a").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("a.b-c.d").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
    }

    #[test]
    fn label_values() {
        assert!(label_value("").is_ok());
        assert!(label_value("XS").is_ok());
        assert!(label_value("a_b.c-d").is_ok());
        assert!(label_value("a b").is_err());
        assert!(label_value("_a").is_err());
        assert!(label_value(&"a".repeat(64)).is_err());
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name("team").is_ok());
        assert!(qualified_name("example.com/team").is_ok());
        assert!(qualified_name("/team").is_err());
        assert!(qualified_name("example.com/").is_err());
        assert!(qualified_name("Example.com/team").is_err());
        assert!(qualified_name(&format!("{}/a", "b".repeat(254))).is_err());
        assert!(qualified_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn domains() {
        assert!(in_domain("karpenter.sh/team", "karpenter.sh"));
        assert!(in_domain("x.karpenter.sh/team", "karpenter.sh"));
        assert!(!in_domain("notkarpenter.sh/team", "karpenter.sh"));
        assert!(!in_domain("team", "karpenter.sh"));
    }
}
