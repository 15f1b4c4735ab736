//! `karpenter-hub-webhook`: the admission webhook of Clever Karpenter Hub.
//!
//! It validates `CleverNodeClass`, `FlavorCatalog`, `NodePool`, `CapacityBuffer`, `NodeOverlay`
//! and (cluster-scoped) `CleverOrganization` objects before the management cluster stores them,
//! with the same rules the hub applies at runtime ([`crds::admission`]), and answers over HTTPS
//! with a certificate it reloads from disk. See `docs/webhook.md`.
//!
//! - [`review`]: one AdmissionReview from bytes to answer (pure, except reading references);
//! - [`references`]: reading the objects a reviewed object refers to;
//! - [`tls`]: the serving certificate and its hot reload;
//! - [`certificates`]: the self-managed certificate (its Secret, renewal, the `caBundle`);
//! - [`server`]: routes, limits, probes, metrics and graceful shutdown;
//! - [`limits`]: the bound on reviews in flight and on the bytes of their bodies;
//! - [`connection`]: the bound on connections, their idle and request-head timeouts;
//! - [`metrics`]: what `/metrics` exposes;
//! - [`cli`]: the command-line flags.

pub mod certificates;
pub mod cli;
pub mod connection;
pub mod limits;
pub mod metrics;
pub mod references;
pub mod review;
pub mod server;
pub mod tls;
