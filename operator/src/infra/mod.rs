//! What the controllers run on: the shared hub context, the registry of workload-cluster
//! connections, leader election, sharding across replicas and the fence on workload clients, metrics, the API-error helpers
//! and what a failed step is called ([`errors`]), manifests, a cluster's facts read from the watch caches ([`facts`]), and the organisations' ledger
//! writes ([`organizations`]).
//! No decisions.

pub mod apierror;
#[cfg(test)]
pub mod cache_fixture;
pub mod changes;
pub mod clients;
pub mod errors;
pub mod facts;
pub mod fence;
pub mod finalizers;
pub mod hub;
pub mod identity;
pub mod kubeconfig;
pub mod leader;
pub mod manifests;
pub mod metrics;
pub mod organizations;
pub mod registry;
pub mod sharding;

/// The `User-Agent` of every request the hub sends (API server audit logs tell its traffic apart
/// by it; kube's client sends none of its own).
pub const USER_AGENT: &str = concat!("karpenter-hub/", env!("CARGO_PKG_VERSION"));

/// Identify the clients built from `config` as replica `identity` of a sharded hub:
/// `karpenter-hub/<version> (replica <identity>)`, so an API server's audit log tells the replicas'
/// writes apart. Characters a header may not carry are dropped from the identity.
pub fn identify_replica(config: &mut kube::Config, identity: &str) {
    let clean: String =
        identity.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')).take(128).collect();
    if let Ok(value) = axum::http::HeaderValue::from_str(&format!("{USER_AGENT} (replica {clean})")) {
        config.headers.retain(|(name, _)| name != axum::http::header::USER_AGENT);
        config.headers.push((axum::http::header::USER_AGENT, value));
    }
}

/// The replica a `User-Agent` names, as [`identify_replica`] writes it; `None` for any other agent.
pub fn replica_of(user_agent: &str) -> Option<&str> {
    user_agent.strip_prefix(USER_AGENT)?.strip_prefix(" (replica ")?.strip_suffix(')')
}

/// Identify the clients built from `config` as the hub ([`USER_AGENT`]), once.
pub fn identify(config: &mut kube::Config) {
    if !config.headers.iter().any(|(name, _)| name == axum::http::header::USER_AGENT) {
        config.headers.push((axum::http::header::USER_AGENT, axum::http::HeaderValue::from_static(USER_AGENT)));
    }
}
