//! Admission rules for the hub's resources: what the `karpenter-hub-webhook` binary enforces and
//! what the hub re-checks at runtime on stored objects, from one implementation so the two never
//! disagree.
//!
//! Each `validate_*` function takes the new object, the old one on update, and the objects it
//! references (already read by the caller: a [`Lookup`] says whether a reference was found, is
//! missing, or could not be checked), and returns a [`Verdict`]: denials (field path, what is wrong
//! and how to fix it) and warnings (legal but suspicious). The rules cover what a CRD schema cannot
//! express and repeat the schema's own rules too, so that objects that never met an API server
//! (`karpenter-hub plan -f`) or were stored before a CRD change get the same answer.
//!
//! Must not: do I/O, read the clock, log, or panic on any input. Catalogue rules live in
//! [`crate::catalog`] and are reused, not restated.

mod capacitybuffer;
mod flavorcatalog;
mod nodeclaim;
mod nodeclass;
mod nodeoverlay;
mod nodepool;
mod organization;
pub mod schedule;

use std::fmt;

pub use capacitybuffer::validate_capacity_buffer;
pub use flavorcatalog::validate_flavor_catalog;
pub use nodeclaim::validate_node_claim;
pub use nodeclass::validate_node_class;
pub use nodeoverlay::validate_node_overlay;
pub use nodepool::{NodePoolReferences, validate_node_pool};
pub use organization::validate_organization;

use crate::validation;

/// Most denials a verdict keeps: beyond this the object is badly wrong and a longer answer helps nobody
/// (and a hostile object must not make the response grow without bound).
pub const MAX_DENIALS: usize = 20;
/// Most warnings a verdict keeps: the API server may drop a long list, and kubectl prints each one.
pub const MAX_WARNINGS: usize = 10;

/// One problem: where, what, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Field path in Kubernetes' notation, e.g. `spec.labels[team]` or `spec.flavors[2].priceHourly`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The answer for one object: allowed when there is no denial. Warnings never block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Reasons to refuse the object (at most [`MAX_DENIALS`], then one line counting the rest).
    pub denials: Vec<Violation>,
    /// Legal but suspicious settings (at most [`MAX_WARNINGS`]).
    pub warnings: Vec<Violation>,
    dropped_denials: usize,
}

impl Verdict {
    /// Whether the object may be stored.
    pub fn is_allowed(&self) -> bool {
        self.denials.is_empty()
    }

    /// All denials as one message (`field: message; field: message`), `None` when allowed.
    pub fn denial_message(&self) -> Option<String> {
        if self.denials.is_empty() {
            return None;
        }
        let mut message = self.denials.iter().map(Violation::to_string).collect::<Vec<_>>().join("; ");
        if self.dropped_denials > 0 {
            message.push_str(&format!("; and {} more problems", self.dropped_denials));
        }
        Some(message)
    }

    /// Warnings as the API server shows them (`field: message` each).
    pub fn warning_messages(&self) -> Vec<String> {
        self.warnings.iter().map(Violation::to_string).collect()
    }

    /// Refuses the object.
    pub fn deny(&mut self, field: impl Into<String>, message: impl Into<String>) {
        if self.denials.len() < MAX_DENIALS {
            self.denials.push(Violation { field: field.into(), message: message.into() });
        } else {
            self.dropped_denials += 1;
        }
    }

    /// Admits the object with a warning.
    pub fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(Violation { field: field.into(), message: message.into() });
        }
    }

    /// Either [`Verdict::deny`] or [`Verdict::warn`]: for checks that are certain only when the
    /// referenced objects could be read.
    fn deny_or_warn(&mut self, deny: bool, field: impl Into<String>, message: impl Into<String>) {
        if deny { self.deny(field, message) } else { self.warn(field, message) }
    }
}

/// What reading a referenced object gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<T> {
    /// The object exists.
    Found(T),
    /// The API server said it does not exist.
    Missing,
    /// Not checked: no API client configured, or the read failed (the reason, for the warning).
    Unchecked(String),
}

impl<T> Lookup<T> {
    /// Borrows the found object.
    pub fn as_ref(&self) -> Lookup<&T> {
        match self {
            Lookup::Found(t) => Lookup::Found(t),
            Lookup::Missing => Lookup::Missing,
            Lookup::Unchecked(why) => Lookup::Unchecked(why.clone()),
        }
    }
}

/// Why a label key is refused, shared by node class labels and NodePool template labels.
fn label_key_problem(key: &str) -> Option<String> {
    validation::qualified_name(key).err().map(|reason| {
        format!("{key:?} is not a valid label key: {reason}; write [prefix/]name, e.g. team or example.com/team")
    })
}

/// Checks a label value (empty allowed, like Kubernetes).
fn check_label_value(verdict: &mut Verdict, field: &str, value: &str) {
    if let Err(reason) = validation::label_value(value) {
        verdict.deny(field, format!("value {} is not a valid label value: {reason}", shorten(value)));
    }
}

/// A user string quoted for a message, cut to a readable length (a 1 MiB value must not be echoed).
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}... ({} characters)", s.chars().count())
    }
}

/// Checks that an object's name fits a label value: the hub stamps it on NodeClaims, NodeGroups and
/// Nodes (`karpenter.sh/nodepool`, `karpenter.clever-cloud.com/nodeclass`).
fn check_name_is_label_value(verdict: &mut Verdict, name: Option<&str>, label: &str) {
    let Some(name) = name.filter(|n| !n.is_empty()) else { return };
    if let Err(reason) = validation::label_value(name) {
        verdict.deny(
            "metadata.name",
            format!(
                "{} cannot be used: the hub writes it as the value of the {label} label, and it {reason}; choose a \
                 shorter name",
                shorten(name)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_caps_and_formats() {
        let mut v = Verdict::default();
        assert!(v.is_allowed());
        assert_eq!(v.denial_message(), None);
        for i in 0..(MAX_DENIALS + 3) {
            v.deny(format!("spec.x[{i}]"), "bad");
        }
        for _ in 0..(MAX_WARNINGS + 3) {
            v.warn("spec.y", "odd");
        }
        assert!(!v.is_allowed());
        assert_eq!(v.denials.len(), MAX_DENIALS);
        assert_eq!(v.warnings.len(), MAX_WARNINGS);
        let message = v.denial_message().unwrap_or_default();
        assert!(message.starts_with("spec.x[0]: bad; spec.x[1]: bad"), "{message}");
        assert!(message.ends_with("and 3 more problems"), "{message}");
        assert_eq!(v.warning_messages()[0], "spec.y: odd");
    }

    #[test]
    fn long_values_are_shortened() {
        let s = shorten(&"a".repeat(1000));
        assert!(s.len() < 120 && s.contains("1000 characters"), "{s}");
        assert_eq!(shorten("XS"), "\"XS\"");
    }
}

/// The cluster a pool or a buffer targets: exactly one of `clusterName` (a DNS label: the hub reads
/// the Secret `<clusterName>-kubeconfig`) and `clusterSelector` (terms a label selector accepts).
/// `one` and `many` say, for the messages, what the object is with either (`"a pool serving one
/// cluster"`, `"a fleet pool serving every registered cluster of the namespace whose labels
/// match"`), `this` what it is (`"this pool"`).
pub(crate) fn check_cluster_target(
    verdict: &mut Verdict,
    name: Option<&String>,
    selector: Option<&crate::selector::ClusterSelector>,
    (one, many, this): (&str, &str, &str),
) {
    match (name, selector) {
        (Some(_), Some(_)) => verdict.deny(
            "spec",
            format!("clusterName and clusterSelector are both set: keep clusterName for {one}, or clusterSelector for {many}"),
        ),
        (None, None) => verdict.deny(
            "spec",
            format!(
                "neither clusterName nor clusterSelector is set: name the workload cluster {this} serves \
                 (clusterName: prod-paris), or select clusters by label (clusterSelector: {{matchLabels: {{env: prod}}}})"
            ),
        ),
        _ => {}
    }
    if let Some(cluster) = name
        && let Err(reason) = validation::dns1123_label(cluster)
    {
        verdict.deny(
            "spec.clusterName",
            format!(
                "{} is not a valid cluster name: it {reason}; the hub reads the Secret <clusterName>-kubeconfig, so use \
                 the workload cluster's name, e.g. prod-paris",
                shorten(cluster)
            ),
        );
    }
    if let Some((path, why)) = selector.and_then(|s| s.problem()) {
        verdict.deny(format!("spec.clusterSelector.{path}"), why);
    }
}

/// What the admission tests ask of a verdict.
#[cfg(test)]
pub(crate) mod verdict_checks {
    use super::{Verdict, Violation};

    /// The fields of `v`, in order.
    pub(crate) fn fields(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|x| x.field.as_str()).collect()
    }

    /// Denied at `field` with a message containing `text`.
    pub(crate) fn denied(v: &Verdict, field: &str, text: &str) -> bool {
        v.denials.iter().any(|d| d.field == field && d.message.contains(text))
    }

    /// Warned at `field` with a message containing `text`.
    pub(crate) fn warned(v: &Verdict, field: &str, text: &str) -> bool {
        v.warnings.iter().any(|w| w.field == field && w.message.contains(text))
    }
}
