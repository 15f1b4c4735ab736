//! The webhook's metrics (OpenMetrics text on `/metrics`), all under `karpenter_hub_webhook_`:
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `karpenter_hub_webhook_requests_total` | `kind`, `outcome` (`allowed`, `denied`, `invalid`) | reviews answered; `invalid` = HTTP 400 |
//! | `karpenter_hub_webhook_denials_total` | `kind` | reviews denied |
//! | `karpenter_hub_webhook_warnings_total` | `kind` | warnings returned |
//! | `karpenter_hub_webhook_request_duration_seconds` | `kind` | time from body received to answer, lookups included |
//! | `karpenter_hub_webhook_certificate_reloads_total` | `outcome` (`success`, `failure`) | certificate pairs read after a change on disk |
//! | `karpenter_hub_webhook_certificate_expiry_timestamp_seconds` | — | `notAfter` of the served certificate (Unix seconds) |
//! | `karpenter_hub_webhook_refusals_total` | `bound` (`connections`, `reviews`, `bytes`) | connections closed and reviews answered 503 at once because a bound was reached |
//! | `karpenter_hub_webhook_lookups_total` | `kind` (of the object read), `outcome` (`found`, `missing`, `unchecked`) | reads of referenced objects; `unchecked` = failed, timed out or disabled, the check became a warning |

use std::time::Duration;

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::review::Kind;

/// How a review ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Allowed (possibly with warnings).
    Allowed,
    /// Denied.
    Denied,
    /// Not an AdmissionReview: HTTP 400.
    Invalid,
}

/// Which bound made the server refuse a connection or a review without serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refused {
    /// `--max-connections`: the connection was closed on accept.
    Connections,
    /// `--max-concurrent-reviews`: 503.
    Reviews,
    /// `--max-buffered-bytes`: 503.
    Bytes,
}

impl EncodeLabelValue for Refused {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Refused::Connections => "connections",
            Refused::Reviews => "reviews",
            Refused::Bytes => "bytes",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    bound: Refused,
}

/// How a certificate reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadOutcome {
    /// The new pair is served.
    Success,
    /// The new pair was refused; the previous one is still served.
    Failure,
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Invalid => "invalid",
        })
    }
}

impl EncodeLabelValue for ReloadOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ReloadOutcome::Success => "success",
            ReloadOutcome::Failure => "failure",
        })
    }
}

/// How a lookup of a referenced object ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LookupOutcome {
    /// The object exists.
    Found,
    /// The API server said it does not exist.
    Missing,
    /// Not read: failed, timed out, or lookups are off.
    Unchecked,
}

impl EncodeLabelValue for LookupOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            LookupOutcome::Found => "found",
            LookupOutcome::Missing => "missing",
            LookupOutcome::Unchecked => "unchecked",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LookupLabels {
    kind: Kind,
    outcome: LookupOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    kind: Kind,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    outcome: ReloadOutcome,
}

type HistogramFamily = Family<KindLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.25 ms to ~4 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// The registry and its metrics; cheap to update from many tasks.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    denials: Family<KindLabels, Counter>,
    warnings: Family<KindLabels, Counter>,
    latency: HistogramFamily,
    reloads: Family<ReloadLabels, Counter>,
    lookups: Family<LookupLabels, Counter>,
    refusals: Family<RefusedLabels, Counter>,
    expiry: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered (and every kind pre-created, so dashboards see zeros).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("karpenter_hub_webhook");
        let requests = Family::<RequestLabels, Counter>::default();
        let denials = Family::<KindLabels, Counter>::default();
        let warnings = Family::<KindLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let reloads = Family::<ReloadLabels, Counter>::default();
        let lookups = Family::<LookupLabels, Counter>::default();
        let refusals = Family::<RefusedLabels, Counter>::default();
        let expiry = Gauge::default();
        registry.register("requests", "Admission reviews answered, by kind and outcome", requests.clone());
        registry.register("denials", "Admission reviews denied, by kind", denials.clone());
        registry.register("warnings", "Admission warnings returned, by kind", warnings.clone());
        registry.register(
            "request_duration_seconds",
            "Time to answer an admission review, reference lookups included, by kind",
            latency.clone(),
        );
        registry.register("certificate_reloads", "Serving certificate reloads after a change on disk", reloads.clone());
        registry.register("lookups", "Reads of referenced objects, by kind read and outcome", lookups.clone());
        registry.register(
            "refusals",
            "Connections closed and reviews answered 503 at once because a bound was reached, by bound",
            refusals.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the served certificate expires (notAfter, Unix seconds)",
            expiry.clone(),
        );
        for kind in Kind::ALL {
            for outcome in [Outcome::Allowed, Outcome::Denied, Outcome::Invalid] {
                let _ = requests.get_or_create(&RequestLabels { kind, outcome });
            }
            let _ = denials.get_or_create(&KindLabels { kind });
            let _ = warnings.get_or_create(&KindLabels { kind });
            let _ = latency.get_or_create(&KindLabels { kind });
        }
        for outcome in [ReloadOutcome::Success, ReloadOutcome::Failure] {
            let _ = reloads.get_or_create(&ReloadLabels { outcome });
        }
        for kind in [Kind::CleverNodeClass, Kind::FlavorCatalog] {
            for outcome in [LookupOutcome::Found, LookupOutcome::Missing, LookupOutcome::Unchecked] {
                let _ = lookups.get_or_create(&LookupLabels { kind, outcome });
            }
        }
        for bound in [Refused::Connections, Refused::Reviews, Refused::Bytes] {
            let _ = refusals.get_or_create(&RefusedLabels { bound });
        }
        Metrics { registry, requests, denials, warnings, latency, reloads, lookups, refusals, expiry }
    }

    /// Records one answered review.
    pub fn observe(&self, kind: Kind, outcome: Outcome, warnings: usize, elapsed: Duration) {
        self.requests.get_or_create(&RequestLabels { kind, outcome }).inc();
        if outcome == Outcome::Denied {
            self.denials.get_or_create(&KindLabels { kind }).inc();
        }
        if warnings > 0 {
            self.warnings.get_or_create(&KindLabels { kind }).inc_by(warnings as u64);
        }
        self.latency.get_or_create(&KindLabels { kind }).observe(elapsed.as_secs_f64());
    }

    /// Records a certificate reload.
    pub fn reload(&self, outcome: ReloadOutcome) {
        self.reloads.get_or_create(&ReloadLabels { outcome }).inc();
    }

    /// Records when the served certificate expires (0 when unknown).
    pub fn certificate_expiry(&self, not_after: Option<i64>) {
        self.expiry.set(not_after.unwrap_or(0));
    }

    /// Records a lookup of a referenced object of `kind`.
    pub fn lookup(&self, kind: Kind, outcome: LookupOutcome) {
        self.lookups.get_or_create(&LookupLabels { kind, outcome }).inc();
    }

    /// Records a connection or review refused because `bound` was reached.
    pub fn refused(&self, bound: Refused) {
        self.refusals.get_or_create(&RefusedLabels { bound }).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_metric_with_its_labels() {
        let metrics = Metrics::new();
        metrics.observe(Kind::NodePool, Outcome::Denied, 2, Duration::from_millis(3));
        metrics.reload(ReloadOutcome::Failure);
        let text = metrics.encode().unwrap();
        for line in [
            "karpenter_hub_webhook_requests_total{kind=\"NodePool\",outcome=\"denied\"} 1",
            "karpenter_hub_webhook_denials_total{kind=\"NodePool\"} 1",
            "karpenter_hub_webhook_warnings_total{kind=\"NodePool\"} 2",
            "karpenter_hub_webhook_request_duration_seconds_count{kind=\"NodePool\"} 1",
            "karpenter_hub_webhook_requests_total{kind=\"FlavorCatalog\",outcome=\"allowed\"} 0",
            "karpenter_hub_webhook_certificate_reloads_total{outcome=\"failure\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
