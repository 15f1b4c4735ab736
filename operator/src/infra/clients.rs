//! How the hub's API clients are built: each names itself (`User-Agent`, [`super::USER_AGENT`])
//! and sends a request again when the server asks for it — 429, 503 and 504, kube's server-aware
//! policy (`Retry-After` honoured, exponential back-off otherwise, 15 times at most) — counting
//! every such retry in `karpenter_hub_api_retries_total{api, cluster, code}`.
//!
//! Owns: the client stack's retry and its count. Must not: retry other answers (a 409 or a 500
//! goes back to the controller, which reads again before it writes), nor evictions (a 429 there
//! is a PodDisruptionBudget's refusal, which the drain handles: [`evictions`]).

use kube::{
    Client, Config,
    client::{ClientBuilder, DynBody, retry::RetryPolicy},
};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use tower::{
    BoxError,
    buffer::BufferLayer,
    layer::util::Stack,
    retry::{Policy, RetryLayer},
    util::BoxService,
};

use super::metrics::{Metrics, RetryLabels};

/// Which API server a client talks to, for the retry count's labels.
#[derive(Debug, Clone, Copy)]
pub enum Side<'a> {
    Management,
    /// A workload cluster, by its key (`<namespace>/<name>`).
    Workload(&'a str),
}

/// Requests queued per client before callers wait (kube's own client queue is 1024 as well).
const QUEUE: usize = 1024;

/// The codes kube's policy retries, with a counter each.
#[derive(Clone)]
struct Counters(Arc<[(u16, Counter); 3]>);

impl Counters {
    fn new(metrics: &Metrics, side: Side<'_>) -> Self {
        let (api, cluster) = match side {
            Side::Management => ("management", ""),
            Side::Workload(c) => ("workload", c),
        };
        let counter = |code: u16| {
            (
                code,
                metrics.api_retries.get(&RetryLabels {
                    api: api.to_string(),
                    cluster: cluster.to_string(),
                    code: code.to_string(),
                }),
            )
        };
        Self(Arc::new([counter(429), counter(503), counter(504)]))
    }
}

/// kube's retry policy, counting the retries it decides.
#[derive(Clone)]
struct Counted {
    policy: RetryPolicy,
    counters: Counters,
}

impl<B, Res> Policy<axum::http::Request<B>, axum::http::Response<Res>, BoxError> for Counted
where
    RetryPolicy: Policy<axum::http::Request<B>, axum::http::Response<Res>, BoxError>,
{
    type Future = <RetryPolicy as Policy<axum::http::Request<B>, axum::http::Response<Res>, BoxError>>::Future;

    fn retry(
        &mut self,
        req: &mut axum::http::Request<B>,
        result: &mut Result<axum::http::Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let code = result.as_ref().map(|r| r.status().as_u16()).ok();
        let again = self.policy.retry(req, result);
        if again.is_some()
            && let Some((_, counter)) = self.counters.0.iter().find(|(c, _)| Some(*c) == code)
        {
            counter.inc();
        }
        again
    }

    fn clone_request(&mut self, req: &axum::http::Request<B>) -> Option<axum::http::Request<B>> {
        self.policy.clone_request(req)
    }
}

/// A client from `config`, identified, retrying as the module says and counting it under `side`.
/// Must be called inside a Tokio runtime (the client's queues are tasks).
pub fn build(config: Config, metrics: &Metrics, side: Side<'_>) -> Result<Client, kube::Error> {
    Ok(builder(config)?.with_layer(&retrying(metrics, side)).build())
}

/// As [`build`], with `fence` (the sharded mode's) inside the retry, so a request it refuses is
/// not sent again.
pub fn build_fenced(
    config: Config,
    metrics: &Metrics,
    side: Side<'_>,
    fence: &super::fence::FenceLayer,
) -> Result<Client, kube::Error> {
    Ok(builder(config)?.with_layer(fence).with_layer(&retrying(metrics, side)).build())
}

/// The eviction client: identified, never retrying (a 429 is a PodDisruptionBudget's answer),
/// fenced like the others when `fence` is given.
pub fn evictions(config: Config, fence: Option<&super::fence::FenceLayer>) -> Result<Client, kube::Error> {
    let builder = builder(config)?;
    Ok(match fence {
        Some(fence) => builder.with_layer(fence).build(),
        None => builder.build(),
    })
}

/// kube's default client stack (its `GenericService`, not exported).
type KubeStack = BoxService<axum::http::Request<kube::client::Body>, axum::http::Response<Box<DynBody>>, BoxError>;

/// kube's stack, identified and without its own retry (which sits deep in the stack, where
/// nothing can count it: [`retrying`] replaces it, or nothing does, for evictions).
fn builder(mut config: Config) -> Result<ClientBuilder<KubeStack>, kube::Error> {
    super::identify(&mut config);
    config.default_retry = false;
    ClientBuilder::try_from(config)
}

/// Retry (counted) over a queue: tower's retry needs a service it can clone, which kube's boxed
/// stack is not.
fn retrying<Req>(metrics: &Metrics, side: Side<'_>) -> Stack<BufferLayer<Req>, RetryLayer<Counted>> {
    let counted = Counted { policy: RetryPolicy::server_retry(), counters: Counters::new(metrics, side) };
    Stack::new(BufferLayer::new(QUEUE), RetryLayer::new(counted))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use axum::{
        Router,
        extract::State,
        http::{StatusCode, header},
        response::IntoResponse,
        routing::{get, post},
    };
    use std::sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    };
    use tokio_util::sync::CancellationToken;

    /// A server answering each request with the next scripted status (then 200), counting
    /// requests and the `User-Agent`s seen.
    #[derive(Clone, Default)]
    struct Script {
        answers: Arc<Mutex<Vec<u16>>>,
        served: Arc<AtomicUsize>,
        agents: Arc<Mutex<Vec<String>>>,
    }

    async fn answer(State(s): State<Script>, headers: axum::http::HeaderMap) -> impl IntoResponse {
        s.served.fetch_add(1, Ordering::SeqCst);
        let agents: Vec<String> =
            headers.get_all(header::USER_AGENT).iter().map(|v| v.to_str().unwrap_or_default().to_string()).collect();
        s.agents.lock().unwrap().push(agents.join(","));
        let code = {
            let mut a = s.answers.lock().unwrap();
            if a.is_empty() { 200 } else { a.remove(0) }
        };
        let status = StatusCode::from_u16(code).unwrap();
        let body = if code == 200 {
            r#"{"major":"1","minor":"36","gitVersion":"v1.36.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#.to_string()
        } else {
            format!(
                r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"scripted","reason":"","code":{code}}}"#
            )
        };
        (status, [(header::RETRY_AFTER, "0"), (header::CONTENT_TYPE, "application/json")], body)
    }

    async fn serve(answers: &[u16]) -> (Script, Config) {
        let script = Script { answers: Arc::new(Mutex::new(answers.to_vec())), ..Script::default() };
        let app = Router::new()
            .route("/version", get(answer))
            .route("/api/v1/namespaces/{ns}/pods/{pod}/eviction", post(answer))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (script, Config::new(url.parse().unwrap()))
    }

    fn retries(m: &Metrics, api: &str, cluster: &str, code: u16) -> u64 {
        m.api_retries.get(&RetryLabels { api: api.into(), cluster: cluster.into(), code: code.to_string() }).get()
    }

    #[tokio::test]
    async fn answers_that_ask_for_it_are_retried_and_counted_by_api_cluster_and_code() {
        let (script, config) = serve(&[429, 503, 504, 429]).await;
        let m = Metrics::new();
        let client = build(config, &m, Side::Workload("team-a/prod")).unwrap();
        client.apiserver_version().await.unwrap();
        assert_eq!(script.served.load(Ordering::SeqCst), 5);
        assert_eq!(
            [429, 503, 504].map(|c| retries(&m, "workload", "team-a/prod", c)),
            [2, 1, 1],
            "each retry counted under its code"
        );
        assert_eq!(retries(&m, "management", "", 429), 0);
        assert!(
            m.render()
                .contains(r#"karpenter_hub_api_retries_total{api="workload",cluster="team-a/prod",code="429"} 2"#)
        );
        // One User-Agent per request, the hub's, on every retry too.
        for agents in script.agents.lock().unwrap().iter() {
            assert_eq!(agents, super::super::USER_AGENT);
        }
    }

    /// A sharded replica's clients name it in their one `User-Agent` (audit logs tell the replicas
    /// apart); what a header may not carry is dropped from the identity.
    #[tokio::test]
    async fn a_replica_names_itself_in_its_user_agent() {
        let (script, mut config) = serve(&[]).await;
        super::super::identify_replica(&mut config, "hub-7d9f 1234\n");
        let client = build(config, &Metrics::new(), Side::Workload("team-a/prod")).unwrap();
        client.apiserver_version().await.unwrap();
        let agents = script.agents.lock().unwrap().clone();
        assert_eq!(agents, vec![format!("{} (replica hub-7d9f1234)", super::super::USER_AGENT)]);
        assert_eq!(super::super::replica_of(&agents[0]), Some("hub-7d9f1234"), "read back as written");
        assert_eq!(super::super::replica_of(super::super::USER_AGENT), None, "one replica: none named");
        assert_eq!(super::super::replica_of("kubectl/v1.36 (replica x)"), None, "not the hub's");
    }

    #[tokio::test]
    async fn other_errors_go_back_to_the_caller_unretried() {
        let (script, config) = serve(&[500, 409]).await;
        let m = Metrics::new();
        let client = build(config, &m, Side::Management).unwrap();
        assert!(client.apiserver_version().await.is_err());
        assert!(client.apiserver_version().await.is_err());
        client.apiserver_version().await.unwrap();
        assert_eq!(script.served.load(Ordering::SeqCst), 3);
        assert_eq!([429, 503, 504].map(|c| retries(&m, "management", "", c)), [0, 0, 0]);
    }

    #[tokio::test]
    async fn an_eviction_refused_with_429_is_not_sent_again() {
        let (script, config) = serve(&[429]).await;
        let client = evictions(config, None).unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, "default");
        let err = api.evict("web-0", &kube::api::EvictParams::default()).await.unwrap_err();
        assert!(matches!(err, kube::Error::Api(ref s) if s.code == 429), "{err}");
        assert_eq!(script.served.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_fenced_request_is_refused_without_reaching_the_server_or_being_retried() {
        let (script, config) = serve(&[]).await;
        let m = Metrics::new();
        let token = CancellationToken::new();
        let fence = super::super::fence::FenceLayer { token: token.clone(), cluster: "team-a/prod".into() };
        let client = build_fenced(config, &m, Side::Workload("team-a/prod"), &fence).unwrap();
        client.apiserver_version().await.unwrap();
        token.cancel();
        let err = client.apiserver_version().await.unwrap_err();
        assert!(err.to_string().contains("no longer owns workload cluster team-a/prod"), "{err}");
        assert_eq!(script.served.load(Ordering::SeqCst), 1);
        assert_eq!([429, 503, 504].map(|c| retries(&m, "workload", "team-a/prod", c)), [0, 0, 0]);
    }
}
