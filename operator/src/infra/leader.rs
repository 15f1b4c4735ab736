//! Leader election (hub.md §6): one active hub per hub id, standby replicas ready to take over,
//! coordinated by a `coordination.k8s.io/v1` Lease in the management cluster — no other datastore.
//!
//! Owns: the Lease protocol (acquire, renew, hand over) and the signal that leadership was lost.
//! Must not: let a replica act on clusters before it holds the Lease, or keep acting after it could
//! no longer renew it (the controllers stop before another replica may take over).

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio_util::sync::CancellationToken;

use crate::infra::apierror::plain;

/// Timings of the protocol (client-go's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a Lease holds without renewal.
    pub lease_duration: Duration,
    /// The leader gives up if it could not renew for this long (< `lease_duration`, so it stops
    /// acting before anyone else may start).
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Leader election timings that cannot keep one active replica (named after the flags).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be shorter than --leader-elect-lease-duration ({lease:?}): the leader must stop acting before its Lease expires and a standby may take over; lower the deadline or raise the duration"
    )]
    DeadlineNotBeforeExpiry { renew: Duration, lease: Duration },
    #[error(
        "--leader-elect-retry-period ({retry:?}) must be shorter than --leader-elect-renew-deadline ({renew:?}): otherwise one missed renewal already stops the leader; lower the retry period or raise the deadline"
    )]
    RetryNotBeforeDeadline { retry: Duration, renew: Duration },
}

impl Timings {
    /// Validated timings (the error names the flags and the fix).
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingsError> {
        if renew_deadline >= lease_duration {
            return Err(TimingsError::DeadlineNotBeforeExpiry { renew: renew_deadline, lease: lease_duration });
        }
        if retry_period >= renew_deadline {
            return Err(TimingsError::RetryNotBeforeDeadline { retry: retry_period, renew: renew_deadline });
        }
        Ok(Self { lease_duration, renew_deadline, retry_period })
    }
}

/// What a candidate may do with the Lease as it stands. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it (absent, released or expired): take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it until then.
    Follow { holder: String },
}

/// Decide from the Lease's spec at `now`.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else { return Decision::Acquire };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == me {
        return Decision::Renew;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0);
    let duration = spec.lease_duration_seconds.unwrap_or(15).max(1);
    match renewed {
        Some(t) if t + Duration::from_secs(u64::from(duration.unsigned_abs())) > now => Decision::Follow { holder },
        _ => Decision::Acquire,
    }
}

/// The spec we write when acquiring or renewing.
pub fn spec_for(current: Option<&LeaseSpec>, me: &str, now: Timestamp, timings: Timings) -> LeaseSpec {
    let ours = current.and_then(|s| s.holder_identity.as_deref()) == Some(me);
    let transitions = current.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(timings.lease_duration.as_secs()).unwrap_or(15)),
        acquire_time: if ours { current.and_then(|s| s.acquire_time.clone()) } else { Some(MicroTime(now)) },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
        ..LeaseSpec::default()
    }
}

/// What ends a campaign for good: retrying cannot help, a person must act.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "the leader election Lease's namespace {namespace} does not exist{why}: create it (kubectl create namespace {namespace}), name an existing one with --leader-election-namespace, or run a single replica with --leader-elect=false"
    )]
    NamespaceMissing {
        namespace: String,
        /// Why it was not created (empty when creating it was not ours to do).
        why: String,
    },
}

/// Whether a refusal says the Lease's namespace does not exist (not the Lease itself).
pub fn namespace_missing(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        && s.details.as_ref().is_some_and(|d| d.kind == "namespaces"))
}

/// A Lease-based elector for one hub id.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    client: Client,
    namespace: String,
    name: String,
    identity: String,
    timings: Timings,
    create_namespace: bool,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("namespace", &self.namespace)
            .field("lease", &self.name)
            .field("identity", &self.identity)
            .finish()
    }
}

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, timings: Timings) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
            create_namespace: false,
        }
    }

    /// Create the Lease's namespace when it is missing (for a namespace nobody chose explicitly: a
    /// hub run by hand against a cluster where it is not installed yet).
    #[must_use]
    pub fn creating_namespace(mut self, create: bool) -> Self {
        self.create_namespace = create;
        self
    }

    /// One attempt to acquire or renew. `Ok(true)` when we hold the Lease afterwards.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        match decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now) {
            Decision::Follow { .. } => Ok(false),
            Decision::Acquire | Decision::Renew => {
                let spec = spec_for(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now, self.timings);
                let result = match current {
                    // `replace` carries the resourceVersion: two candidates racing, one wins.
                    Some(mut lease) => {
                        lease.spec = Some(spec);
                        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ())
                    }
                    None => {
                        let lease = Lease {
                            metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                            spec: Some(spec),
                        };
                        self.api.create(&PostParams::default(), &lease).await.map(|_| ())
                    }
                };
                match result {
                    Ok(()) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Wait until we hold the Lease (or `shutdown`). Returns whether we lead; a campaign that
    /// cannot succeed (see [`Elector::campaign`]) is logged and returns `false`.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        match self.campaign(shutdown).await {
            Ok(leading) => leading,
            Err(e) => {
                tracing::error!("{e}");
                false
            }
        }
    }

    /// Wait until we hold the Lease: `Ok(true)`, or `Ok(false)` on `shutdown`. A missing namespace
    /// is created when allowed ([`Elector::creating_namespace`]), else it ends the campaign with
    /// what to do. Other failures are retried; each distinct one is logged once, not every retry.
    pub async fn campaign(&self, shutdown: &CancellationToken) -> Result<bool, LeaderError> {
        let mut waiting_logged = false;
        let mut creation_tried = false;
        let mut last_error: Option<String> = None;
        loop {
            match self.try_hold().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "became the leader");
                    return Ok(true);
                }
                Ok(false) if !waiting_logged => {
                    tracing::info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "another replica leads; standing by");
                    waiting_logged = true;
                }
                Ok(false) => {}
                Err(e) if namespace_missing(&e) => {
                    if !self.create_namespace || creation_tried {
                        return Err(LeaderError::NamespaceMissing {
                            namespace: self.namespace.clone(),
                            why: String::new(),
                        });
                    }
                    creation_tried = true;
                    match self.create_namespace().await {
                        Ok(()) => {
                            tracing::info!(namespace = %self.namespace, "created namespace {} for the leader election Lease (it did not exist)", self.namespace);
                            continue;
                        }
                        Err(e) => {
                            return Err(LeaderError::NamespaceMissing {
                                namespace: self.namespace.clone(),
                                why: format!(" and creating it failed ({})", plain(&e)),
                            });
                        }
                    }
                }
                Err(e) => {
                    let error = plain(&e).to_string();
                    if last_error.as_deref() == Some(error.as_str()) {
                        tracing::debug!(lease = %self.name, namespace = %self.namespace, error = %error, "leader election attempt failed again");
                    } else {
                        tracing::warn!(
                            lease = %self.name, namespace = %self.namespace, error = %error,
                            "cannot take part in leader election yet; retrying every {} s (logged again only if the error changes)",
                            self.timings.retry_period.as_secs_f64()
                        );
                        last_error = Some(error);
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(false),
                () = tokio::time::sleep(self.timings.retry_period) => {}
            }
        }
    }

    async fn create_namespace(&self) -> Result<(), kube::Error> {
        let ns = Namespace {
            metadata: ObjectMeta { name: Some(self.namespace.clone()), ..ObjectMeta::default() },
            ..Namespace::default()
        };
        match Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await {
            // Created meanwhile by someone else: fine.
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Renew until renewal has failed for `renew_deadline` or another replica holds the Lease
    /// (then cancel `lost`), or until `stop`. Releasing is the caller's, once it stopped acting.
    ///
    /// `lost` fires no later than `renew_deadline` after the start of the last renewal that
    /// succeeded, whatever the management cluster does: an attempt that hangs (a partition that
    /// drops packets rather than refusing connections) is abandoned at the deadline, and the wait
    /// between attempts never runs past it.
    pub async fn keep(&self, lost: CancellationToken, stop: CancellationToken) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            let deadline = last_ok + self.timings.renew_deadline;
            let wake = (tokio::time::Instant::now() + self.timings.retry_period).min(deadline);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
            }
            // The Lease says it was renewed when the attempt began: count from there.
            let attempt = tokio::time::Instant::now();
            match tokio::time::timeout_at(deadline, self.try_hold()).await {
                Ok(Ok(true)) => {
                    last_ok = attempt;
                    continue;
                }
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.name, "another replica took the Lease; stopping");
                    lost.cancel();
                    return;
                }
                Ok(Err(e)) => tracing::warn!(lease = %self.name, error = %plain(&e), "renewing the Lease failed"),
                Err(_) => {
                    tracing::warn!(lease = %self.name, "renewing the Lease got no answer before the renew deadline")
                }
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::error!(
                    lease = %self.name,
                    renew_deadline_seconds = self.timings.renew_deadline.as_secs_f64(),
                    "could not renew the Lease in time; stopping"
                );
                lost.cancel();
                return;
            }
        }
    }

    /// Give the Lease up (best effort): a standby need not wait for it to expire.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str())
        {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.renew_time = None;
            }
            if let Err(e) = self.api.replace(&self.name, &PostParams::default(), &lease).await {
                tracing::debug!(lease = %self.name, error = %plain(&e), "releasing the Lease failed; it will expire");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn held(by: &str, renewed: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.to_string()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn an_absent_released_or_expired_lease_is_acquired() {
        let now = Timestamp::now();
        assert_eq!(decide(None, "a", now), Decision::Acquire);
        assert_eq!(decide(Some(&LeaseSpec::default()), "a", now), Decision::Acquire);
        let expired = held("b", now - Duration::from_secs(16));
        assert_eq!(decide(Some(&expired), "a", now), Decision::Acquire);
    }

    #[test]
    fn a_live_lease_of_another_is_followed_and_ours_renewed() {
        let now = Timestamp::now();
        let live = held("b", now - Duration::from_secs(5));
        assert_eq!(decide(Some(&live), "a", now), Decision::Follow { holder: "b".into() });
        assert_eq!(decide(Some(&live), "b", now), Decision::Renew);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let t0 = Timestamp::now();
        let theirs = LeaseSpec { lease_transitions: Some(3), ..held("b", t0 - Duration::from_secs(60)) };
        let taken = spec_for(Some(&theirs), "a", t0, Timings::default());
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(t0)));
        let later = t0 + Duration::from_secs(2);
        let renewed = spec_for(Some(&taken), "a", later, Timings::default());
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(t0)));
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));
    }
}
