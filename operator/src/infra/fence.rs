//! The fence (hub.md §6): a tower layer on a workload cluster's clients that refuses every request
//! once an ownership token is cancelled, and abandons those in flight at that moment. Sharded mode
//! fences each owned cluster by its shard Lease's token; leader election fences every cluster by the
//! leader's.
//!
//! Owns: the layer, its refusal error and how to recognise it. Must not: decide when to fence (the
//! token's owner does: [`crate::infra::sharding`], leader election), or retry anything.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio_util::sync::CancellationToken;

/// Why a fenced client refused a request.
#[derive(Debug, thiserror::Error)]
#[error(
    "this hub replica no longer owns workload cluster {cluster} (its shard Lease was not renewed in time or was handed over): request refused so two replicas never write to one cluster"
)]
pub struct Fenced {
    pub cluster: String,
}

/// A tower layer refusing every request once `token` is cancelled, and abandoning those in flight
/// at that moment: a round already under way cannot write to the cluster after the fence.
#[derive(Debug, Clone)]
pub struct FenceLayer {
    pub token: CancellationToken,
    pub cluster: String,
}

impl<S> tower::Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceService { inner, token: self.token.clone(), cluster: self.cluster.clone() }
    }
}

/// The service of [`FenceLayer`].
#[derive(Debug, Clone)]
pub struct FenceService<S> {
    inner: S,
    token: CancellationToken,
    cluster: String,
}

impl<S, Req> tower::Service<Req> for FenceService<S>
where
    S: tower::Service<Req>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let refused = || -> tower::BoxError { Box::new(Fenced { cluster: self.cluster.clone() }) };
        if self.token.is_cancelled() {
            let e = refused();
            return Box::pin(async move { Err(e) });
        }
        let (token, fenced) = (self.token.clone(), refused());
        let call = self.inner.call(req);
        Box::pin(async move {
            tokio::select! {
                // Checked first: a response racing the fence is dropped, not acted upon.
                biased;
                () = token.cancelled() => Err(fenced),
                r = call => r.map_err(Into::into),
            }
        })
    }
}

/// Whether a kube error is a fenced client's refusal.
pub fn is_fenced(e: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<Fenced>() {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use futures::future::BoxFuture;
    use tower::{Layer, Service};

    type Call<T> = BoxFuture<'static, Result<T, tower::BoxError>>;

    /// A service answering when `release` fires (a request in flight).
    #[derive(Clone)]
    struct Slow(CancellationToken);

    impl Service<u32> for Slow {
        type Response = u32;
        type Error = tower::BoxError;
        type Future = Call<u32>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: u32) -> Self::Future {
            let release = self.0.clone();
            Box::pin(async move {
                release.cancelled().await;
                Ok(req)
            })
        }
    }

    #[tokio::test]
    async fn the_fence_refuses_new_requests_and_abandons_those_in_flight() {
        let (fence, answer) = (CancellationToken::new(), CancellationToken::new());
        let mut svc = FenceLayer { token: fence.clone(), cluster: "team-a/prod".into() }.layer(Slow(answer.clone()));
        // Before the fence: requests go through.
        let before = svc.call(1);
        answer.cancel();
        assert_eq!(before.await.unwrap(), 1);
        // A request in flight when the fence falls is abandoned, not answered.
        let mut svc =
            FenceLayer { token: fence.clone(), cluster: "team-a/prod".into() }.layer(Slow(CancellationToken::new()));
        let in_flight = tokio::spawn(svc.call(2));
        tokio::task::yield_now().await;
        fence.cancel();
        let e = in_flight.await.unwrap().unwrap_err();
        assert!(e.to_string().contains("no longer owns workload cluster team-a/prod"), "{e}");
        // After it: refused at once.
        let e = svc.call(3).await.unwrap_err();
        assert!(e.is::<Fenced>());
    }
}
