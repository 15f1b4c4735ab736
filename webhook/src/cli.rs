//! Command-line flags of `karpenter-hub-webhook`; every flag also reads an environment variable
//! `KARPENTER_HUB_WEBHOOK_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::server::{
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CONCURRENT_REVIEWS, DEFAULT_MAX_CONNECTIONS,
    Settings,
};

/// How referenced objects are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lookups {
    /// From the management cluster (in-cluster config or KUBECONFIG).
    Api,
    /// Not at all: cross-object checks become warnings.
    Off,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// The admission webhook of Clever Karpenter Hub.
#[derive(Debug, Clone, Parser)]
#[command(name = "karpenter-hub-webhook", version, about)]
pub struct Args {
    /// HTTPS listen address.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443")]
    pub address: SocketAddr,
    /// Plain-HTTP address for /livez, /readyz and /metrics (off when unset).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_PROBE_ADDRESS")]
    pub probe_address: Option<SocketAddr>,
    /// PEM certificate chain, leaf first.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_TLS_CERT_FILE", default_value = "/etc/karpenter-hub-webhook/tls/tls.crt")]
    pub tls_cert_file: PathBuf,
    /// PEM private key.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_TLS_KEY_FILE", default_value = "/etc/karpenter-hub-webhook/tls/tls.key")]
    pub tls_key_file: PathBuf,
    /// Keep the serving certificate in this Secret (of --certificate-namespace): the webhook makes
    /// and renews its own CA and certificate there, writes the pair to --tls-cert-file and
    /// --tls-key-file (a writable directory), and sets the caBundle of --webhook-configuration.
    /// Unset: the files are someone else's (cert-manager, a Secret volume).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_CERTIFICATE_SECRET", requires = "certificate_namespace")]
    pub certificate_secret: Option<String>,
    /// Namespace of the webhook, its Service and its certificate Secret (the chart passes the pod's).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_CERTIFICATE_NAMESPACE")]
    pub certificate_namespace: Option<String>,
    /// The ValidatingWebhookConfiguration whose webhooks calling --service-name get the CA
    /// (with --certificate-secret).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,
    /// The webhook's Service: the serving certificate covers its DNS names.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_SERVICE_NAME", default_value = "karpenter-hub-webhook")]
    pub service_name: String,
    /// The cluster's DNS domain (`<service>.<namespace>.svc.<domain>`).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// How often the self-managed certificate's Secret and caBundle are checked (renewal is due
    /// weeks ahead; the caBundle is set again if something cleared it).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_CERTIFICATE_CHECK_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub certificate_check_interval: Duration,
    /// How often the certificate files are checked for a change (e.g. 10s, 500ms).
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_CERT_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub cert_poll_interval: Duration,
    /// Largest request body, in bytes.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Bodies of the reviews in flight, in bytes, together; past it a review gets 503, unread.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_MAX_BUFFERED_BYTES", default_value_t = DEFAULT_MAX_BUFFERED_BYTES)]
    pub max_buffered_bytes: u64,
    /// Reviews in flight at once; past it a review gets 503.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_MAX_CONCURRENT_REVIEWS", default_value_t = DEFAULT_MAX_CONCURRENT_REVIEWS)]
    pub max_concurrent_reviews: usize,
    /// Open connections at once; past it a new connection is closed at once.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Longest time for one request, body read included.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// How long a connection may stay open without a request in flight.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_IDLE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long the head of each request (and the first of a connection) may take to arrive.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_HEADER_READ_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long in-flight requests may finish after SIGTERM.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// How referenced CleverNodeClasses and FlavorCatalogs are read.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_LOOKUPS", value_enum, default_value_t = Lookups::Api)]
    pub lookups: Lookups,
    /// Longest time for one lookup; past it the check becomes a warning.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_LOOKUP_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub lookup_timeout: Duration,
    /// Log format.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing's env-filter syntax), e.g. info or webhook=debug.
    #[arg(long, env = "KARPENTER_HUB_WEBHOOK_LOG", default_value = "info")]
    pub log: String,
}

impl Args {
    /// The self-managed certificate's manager these flags describe, when --certificate-secret is set.
    pub fn certificate_manager(&self, client: kube::Client) -> Option<crate::certificates::Manager> {
        let secret = self.certificate_secret.clone()?;
        Some(crate::certificates::Manager {
            client,
            identity: crate::certificates::Identity {
                namespace: self.certificate_namespace.clone().unwrap_or_default(),
                service: self.service_name.clone(),
                cluster_domain: self.cluster_domain.clone(),
            },
            secret,
            configuration: self.webhook_configuration.clone(),
            files: crate::tls::CertificateFiles { cert: self.tls_cert_file.clone(), key: self.tls_key_file.clone() },
        })
    }

    /// The server settings these flags describe.
    pub fn settings(&self) -> Settings {
        let mut settings = Settings::new(self.address, self.tls_cert_file.clone(), self.tls_key_file.clone());
        settings.probe_address = self.probe_address;
        settings.certificate_poll_interval = self.cert_poll_interval;
        settings.max_body_bytes = self.max_body_bytes;
        settings.max_buffered_bytes = self.max_buffered_bytes;
        settings.max_concurrent_reviews = self.max_concurrent_reviews;
        settings.connections.max_connections = self.max_connections;
        settings.connections.idle_timeout = self.idle_timeout;
        settings.connections.header_read_timeout = self.header_read_timeout;
        settings.request_timeout = self.request_timeout;
        settings.shutdown_grace = self.shutdown_grace;
        settings
    }
}

/// Why a duration flag is refused (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No whole number first.
    #[error("{0:?} is not a duration: write e.g. 500ms, 10s or 2m")]
    NotADuration(String),
    /// A number without a known unit.
    #[error("{0:?} has no unit: write e.g. 500ms, 10s or 2m")]
    NoUnit(String),
    /// Zero, which would make the timer spin or never wait.
    #[error("{0:?} must be more than zero")]
    Zero(String),
}

/// A duration as a whole number with a unit: `ms`, `s`, `m` or `h` (e.g. `500ms`, `10s`, `2m`).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| DurationError::NotADuration(text.to_string()))?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(DurationError::NoUnit(text.to_string())),
    };
    if duration.is_zero() {
        return Err(DurationError::Zero(text.to_string()));
    }
    Ok(duration)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "10", "s", "1.5s", "-1s", "0s", "10 s", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn flags_have_defaults_and_parse() {
        let args = Args::try_parse_from(["karpenter-hub-webhook"]).unwrap();
        assert_eq!(args.address.port(), 9443);
        // The flags' defaults are the server's.
        let defaults = Settings::new(args.address, args.tls_cert_file.clone(), args.tls_key_file.clone());
        assert_eq!(args.settings().connections, defaults.connections);
        assert_eq!(args.lookups, Lookups::Api);
        let args = Args::try_parse_from([
            "karpenter-hub-webhook",
            "--address=127.0.0.1:0",
            "--lookups=off",
            "--cert-poll-interval=250ms",
            "--probe-address=127.0.0.1:8081",
            "--idle-timeout=2s",
            "--header-read-timeout=500ms",
            "--max-connections=8",
            "--max-concurrent-reviews=4",
            "--max-buffered-bytes=8388608",
        ])
        .unwrap();
        let settings = args.settings();
        assert_eq!(settings.connections.idle_timeout, Duration::from_secs(2));
        assert_eq!(settings.connections.header_read_timeout, Duration::from_millis(500));
        assert_eq!(settings.connections.max_connections, 8);
        assert_eq!((settings.max_concurrent_reviews, settings.max_buffered_bytes), (4, 8_388_608));
        assert_eq!(settings.certificate_poll_interval, Duration::from_millis(250));
        assert_eq!(settings.probe_address.map(|a| a.port()), Some(8081));
        assert_eq!(args.lookups, Lookups::Off);
    }

    #[test]
    fn a_self_managed_certificate_needs_its_namespace() {
        let e = Args::try_parse_from(["karpenter-hub-webhook", "--certificate-secret=tls"]).unwrap_err();
        assert!(e.to_string().contains("--certificate-namespace"), "{e}");
        let args = Args::try_parse_from([
            "karpenter-hub-webhook",
            "--certificate-secret=tls",
            "--certificate-namespace=karpenter-hub",
            "--webhook-configuration=karpenter-hub-webhook",
            "--certificate-check-interval=30s",
        ])
        .unwrap();
        assert_eq!(args.certificate_check_interval, Duration::from_secs(30));
        assert_eq!(args.service_name, "karpenter-hub-webhook");
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
