//! Each registered cluster's labels (fleet.md §1): those of its registration Secret overlaid on
//! those of the Cluster API `Cluster` of the same name and namespace, the Secret's value winning on
//! a key both set.
//!
//! Owns: the two sources of one cluster's labels and their merge. Must not: read anything (the
//! registry's Secret watch and [`super::capi`] hand over what they saw) or keep other metadata.

use std::collections::BTreeMap;

/// Labels by key.
pub type Labels = BTreeMap<String, String>;

/// What each source says of one cluster's labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sources {
    /// The registration Secret's labels (empty when it has none or is gone).
    pub secret: Labels,
    /// The Cluster API `Cluster`'s labels; `None` when there is no such `Cluster` (or Cluster API is
    /// not served, or not readable).
    pub cluster: Option<Labels>,
}

impl Sources {
    /// The cluster's labels: the `Cluster`'s, then the Secret's over them.
    pub fn merged(&self) -> Labels {
        let mut labels = self.cluster.clone().unwrap_or_default();
        labels.extend(self.secret.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels
    }
}

/// `labels` as `k=v,k=v` (sorted by key), for a log line.
pub(crate) fn render(labels: &Labels) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_secret_wins_over_the_cluster_on_a_key_both_set() {
        let sources = Sources {
            secret: labels(&[("env", "prod"), ("team", "payments")]),
            cluster: Some(labels(&[("env", "staging"), ("region", "par")])),
        };
        assert_eq!(sources.merged(), labels(&[("env", "prod"), ("region", "par"), ("team", "payments")]));
        assert_eq!(render(&sources.merged()), "env=prod,region=par,team=payments");
    }

    #[test]
    fn either_source_alone_gives_its_labels_and_none_gives_none() {
        let only_secret = Sources { secret: labels(&[("env", "prod")]), cluster: None };
        assert_eq!(only_secret.merged(), labels(&[("env", "prod")]));
        let only_cluster = Sources { secret: Labels::new(), cluster: Some(labels(&[("env", "dev")])) };
        assert_eq!(only_cluster.merged(), labels(&[("env", "dev")]));
        assert_eq!(Sources::default().merged(), Labels::new());
        assert_eq!(render(&Labels::new()), "");
    }
}
