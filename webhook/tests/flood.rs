//! The flood of issue 23 against the real `karpenter-hub-webhook` binary with its default limits:
//! 40 clients (20 over HTTP/1.1, 20 over HTTP/2, each its own connection) post 4 MB reviews as
//! fast as they are answered, bodies built to cost the most memory once parsed (a `CleverNodeClass`
//! of 290,000 labels: about 11 times its size). The process's memory, read from
//! `/proc/<pid>/status`, must stay well under the chart's 128 Mi limit, the excess must be refused
//! at once with 503 and `Retry-After`, and a valid review posted meanwhile must be answered every
//! time. Before the bounds, 40 such bodies were buffered and parsed at once (issue 23 measured
//! 173 MB with 40 plain 4 MB bodies).
//!
//! Prints one `webhook flood summary` line with the figures docs/reliability.md records.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const ATTACKERS: usize = 40;
const FLOOD: Duration = Duration::from_secs(10);
const BODY_BYTES: usize = 4_000_000;
/// The peak resident memory allowed: three quarters of the chart's 128 Mi limit.
const PEAK_LIMIT_KIB: u64 = 96 * 1024;
/// Past this the process is killed: the test has failed already, the machine must not suffer.
const KILL_KIB: u64 = 1024 * 1024;

/// A review of a `CleverNodeClass` whose labels fill `size` bytes: many tiny strings in a map,
/// the shape that costs the most memory per byte once parsed.
fn costly_review(size: usize) -> Vec<u8> {
    let mut labels = String::with_capacity(size + 64);
    let mut i = 0u32;
    while labels.len() < size {
        if i > 0 {
            labels.push(',');
        }
        labels.push_str(&format!("\"{i:x}\":\"\""));
        i += 1;
    }
    let object = format!(
        "{{\"apiVersion\":\"karpenter.clever-cloud.com/v1alpha1\",\"kind\":\"CleverNodeClass\",\
         \"metadata\":{{\"name\":\"flood\",\"namespace\":\"team-a\"}},\"spec\":{{\"labels\":{{{labels}}}}}}}"
    );
    format!(
        "{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{{\"uid\":\"{UID}\",\
         \"kind\":{{\"group\":\"karpenter.clever-cloud.com\",\"version\":\"v1alpha1\",\"kind\":\"CleverNodeClass\"}},\
         \"operation\":\"CREATE\",\"namespace\":\"team-a\",\"object\":{object}}}}}"
    )
    .into_bytes()
}

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    refused: AtomicU64,
    refused_without_retry_after: AtomicU64,
    other_status: AtomicU64,
    errors: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_large_bodies_keeps_memory_bounded_and_valid_reviews_answered() {
    let mut webhook = Binary::start("flood", &[]).await;
    let url = webhook.url("/validate/clevernodeclasses");
    let valid = review("CleverNodeClass", "CREATE", node_class("ok", json!({"team": "a"}), None), None);
    let reviewer = client(&webhook.ca.pem(), false);
    for _ in 0..3 {
        let (status, answer) = post(&reviewer, &url, &valid).await;
        assert_eq!((status, answer["response"]["allowed"].as_bool()), (200, Some(true)), "{answer}");
    }
    let baseline_kib = webhook.status_kib("VmRSS").unwrap();

    let body: &'static [u8] = Box::leak(costly_review(BODY_BYTES).into_boxed_slice());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut attackers = Vec::new();
    for i in 0..ATTACKERS {
        // Even: HTTP/1.1, a new connection per request; odd: one HTTP/2 connection each.
        let client = client(&webhook.ca.pem(), i % 2 == 0);
        let (url, tally, stop) = (url.clone(), tally.clone(), stop.clone());
        attackers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) && started.elapsed() < FLOOD {
                match client.post(&url).header("content-type", "application/json").body(body).send().await {
                    Ok(response) => {
                        let counter = match response.status().as_u16() {
                            200 | 400 => &tally.answered,
                            503 => {
                                if response.headers().get("retry-after").is_none_or(|v| v != "1") {
                                    tally.refused_without_retry_after.fetch_add(1, Ordering::Relaxed);
                                }
                                &tally.refused
                            }
                            _ => &tally.other_status,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        let _ = response.bytes().await;
                    }
                    // A refused HTTP/1.1 body is not read: the server may close while it is sent.
                    Err(_) => {
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }

    // The valid review, every 100 ms through the flood, and the memory every 20 ms.
    let mut valid_latencies = Vec::new();
    let mut valid_failures = Vec::new();
    let mut peak_rss_kib = 0;
    let mut next_review = Instant::now();
    while started.elapsed() < FLOOD {
        let rss = webhook.status_kib("VmRSS").unwrap_or(0);
        peak_rss_kib = peak_rss_kib.max(rss);
        if rss > KILL_KIB {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        if Instant::now() >= next_review {
            let asked = Instant::now();
            let response = reviewer.post(&url).json(&valid).send().await;
            match response {
                Ok(r) if r.status() == 200 => {
                    let answer: serde_json::Value = r.json().await.unwrap_or_default();
                    if answer["response"]["allowed"] == true {
                        valid_latencies.push(asked.elapsed());
                    } else {
                        valid_failures.push(answer.to_string());
                    }
                }
                Ok(r) => valid_failures.push(format!("status {}", r.status())),
                Err(error) => valid_failures.push(error.to_string()),
            }
            next_review = asked + Duration::from_millis(100);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hwm_kib = webhook.status_kib("VmHWM").unwrap_or(KILL_KIB);
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        let _ = attacker.await;
    }
    let metrics = client(&webhook.ca.pem(), true)
        .get(format!("http://127.0.0.1:{}/metrics", webhook.probe_port))
        .send()
        .await
        .map(|r| r.status())
        .ok();
    let max_latency = valid_latencies.iter().max().copied().unwrap_or_default();
    println!(
        "webhook flood summary: baseline VmRSS {} MiB, peak VmRSS {} MiB, VmHWM {} MiB; large bodies answered {}, \
         refused 503 {}, connection errors {}, other statuses {}; valid reviews answered {} (slowest {:?}), failed {}",
        baseline_kib / 1024,
        peak_rss_kib / 1024,
        hwm_kib / 1024,
        tally.answered.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.other_status.load(Ordering::Relaxed),
        valid_latencies.len(),
        max_latency,
        valid_failures.len(),
    );
    let logs = webhook.logs();
    webhook.kill();
    assert!(hwm_kib <= PEAK_LIMIT_KIB, "peak memory {} MiB over {} MiB", hwm_kib / 1024, PEAK_LIMIT_KIB / 1024);
    assert!(valid_failures.is_empty(), "valid reviews not answered during the flood: {valid_failures:?}");
    assert!(valid_latencies.len() >= 50, "only {} valid reviews sent", valid_latencies.len());
    assert!(tally.answered.load(Ordering::Relaxed) > 0, "no large body was served: the flood proved nothing");
    assert!(tally.refused.load(Ordering::Relaxed) > 0, "no body was refused");
    assert_eq!(tally.refused_without_retry_after.load(Ordering::Relaxed), 0, "a 503 without Retry-After: 1");
    assert_eq!(tally.other_status.load(Ordering::Relaxed), 0, "unexpected statuses");
    assert!(metrics.is_some_and(|s| s == 200), "the webhook stopped serving:\n{logs}");
}
