//! B5 — admission webhook throughput, latency and memory (`../shared/spec/performance.md`).
//!
//! ```sh
//! cargo bench -p webhook --bench b5                 # table
//! B5_JSON=1 cargo bench -p webhook --bench b5       # plus one JSON object per case
//! ```
//!
//! Starts the real `karpenter-hub-webhook` binary (release build, `--lookups=off`: no API server
//! here) with a generated certificate, then drives it over HTTPS with a mix of valid and invalid
//! `CleverNodeClass` and `FlavorCatalog` reviews from a load generator in this process, at several
//! concurrencies, over HTTP/2 (one connection per client, as the API server multiplexes) and
//! HTTP/1.1 keep-alive. Reports reviews/s, client-observed latency percentiles and the server's
//! peak RSS (`VmHWM`). A final row measures the review path alone (parse, validate, answer) in
//! this process, single-threaded, to separate its cost from TLS and HTTP.
//!
//! Knobs: `B5_SECONDS` (per case, default 5), `B5_CONCURRENCY` (comma list, default `1,8,32,64`).
//! The load generator shares the machine's cores with the server: on 2 cores the figures are a
//! floor of what the server does alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use webhook::review::{Kind, review_offline};

fn review(kind: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "karpenter.clever-cloud.com", "version": "v1alpha1", "resource": kind.to_lowercase()},
            "operation": "CREATE", "namespace": "team-a", "name": object["metadata"]["name"].clone(),
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object, "dryRun": false
        }
    }))
    .unwrap()
}

/// The mix: (route, body, expected allowed), valid and invalid of both kinds.
fn bodies() -> Vec<(Kind, Vec<u8>, bool)> {
    let meta = |name: &str| json!({"name": name, "namespace": "team-a", "uid": "1", "resourceVersion": "1"});
    let class = |labels: Value| {
        json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "CleverNodeClass", "metadata": meta("default"),
               "spec": {"labels": labels}})
    };
    let catalog = |flavors: Value| {
        json!({"apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog", "metadata": meta("negotiated"),
               "spec": {"flavors": flavors}})
    };
    vec![
        (
            Kind::CleverNodeClass,
            review(
                "CleverNodeClass",
                class(json!({"team": "payments", "example.com/tier": "gold", "cost-center": "cc-1234"})),
            ),
            true,
        ),
        (
            Kind::CleverNodeClass,
            review(
                "CleverNodeClass",
                class(json!({"team": "payments", "node-role.kubernetes.io/worker": "", "karpenter.sh/x": "y"})),
            ),
            false,
        ),
        (
            Kind::FlavorCatalog,
            review(
                "FlavorCatalog",
                catalog(
                    json!([{"name": "M", "priceHourly": 0.105}, {"name": "L", "priceHourly": 0.15}, {"name": "CUSTOM", "cpu": 2, "memoryKi": 2097152, "priceHourly": 0.02}]),
                ),
            ),
            true,
        ),
        (
            Kind::FlavorCatalog,
            review(
                "FlavorCatalog",
                catalog(json!([{"name": "FREE", "cpu": 2, "memoryKi": 2097152, "priceHourly": 0}])),
            ),
            false,
        ),
    ]
}

struct Pki {
    ca_pem: String,
    dir: std::path::PathBuf,
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    let dir = std::env::temp_dir().join(format!("karpenter-hub-b5-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    Pki { ca_pem: ca.pem(), dir }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(pki: &Pki) -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
        .arg(format!("--address=127.0.0.1:{port}"))
        .arg(format!("--tls-cert-file={}", pki.dir.join("tls.crt").display()))
        .arg(format!("--tls-key-file={}", pki.dir.join("tls.key").display()))
        .arg("--lookups=off")
        .arg("--log=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Server { child, port }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn client(ca_pem: &str, http2: bool) -> reqwest::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let builder = reqwest::Client::builder().tls_backend_preconfigured(tls).timeout(Duration::from_secs(10));
    let builder = if http2 { builder.http2_prior_knowledge() } else { builder.http1_only() };
    builder.build().unwrap()
}

struct Case {
    protocol: &'static str,
    concurrency: usize,
    reviews: usize,
    seconds: f64,
    latencies_us: Vec<u64>,
    errors: usize,
}

impl Case {
    fn rate(&self) -> f64 {
        self.reviews as f64 / self.seconds
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
    }
}

async fn run_case(ca_pem: &str, port: u16, http2: bool, concurrency: usize, seconds: f64) -> Case {
    let bodies = Arc::new(bodies());
    // HTTP/2: a connection per 8 streams, as an API server spreads calls over a few connections.
    let clients: Vec<reqwest::Client> =
        (0..if http2 { concurrency.div_ceil(8) } else { 1 }).map(|_| client(ca_pem, http2)).collect();
    // Warm up the connections.
    for c in &clients {
        let _ = c.get(format!("https://localhost:{port}/livez")).send().await;
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let client = clients[worker % clients.len()].clone();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut i = worker;
            while Instant::now() < deadline {
                let (kind, body, allowed) = &bodies[i % bodies.len()];
                i += 1;
                let sent = Instant::now();
                let result =
                    client.post(format!("https://localhost:{port}{}", kind.path())).body(body.clone()).send().await;
                let ok = match result {
                    Ok(response) if response.status() == 200 => match response.bytes().await {
                        // Cheap check that the verdict is the expected one.
                        Ok(bytes) => {
                            let needle: &[u8] = if *allowed { b"\"allowed\":true" } else { b"\"allowed\":false" };
                            bytes.windows(needle.len()).any(|w| w == needle)
                        }
                        Err(_) => false,
                    },
                    _ => false,
                };
                if ok {
                    latencies.push(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies_us = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.unwrap();
        latencies_us.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies_us.sort_unstable();
    Case {
        protocol: if http2 { "h2" } else { "http/1.1" },
        concurrency,
        reviews: latencies_us.len(),
        seconds,
        latencies_us,
        errors,
    }
}

/// The review path alone, single-threaded, in this process: reviews/s.
fn in_process(seconds: f64) -> (f64, usize) {
    let bodies = bodies();
    let started = Instant::now();
    let mut n = 0usize;
    while started.elapsed().as_secs_f64() < seconds {
        for (kind, body, allowed) in &bodies {
            let answer = review_offline(*kind, body).unwrap();
            assert_eq!(answer.allowed, *allowed);
            std::hint::black_box(answer.to_json());
            n += 1;
        }
    }
    (n as f64 / started.elapsed().as_secs_f64(), n)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing special: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let seconds: f64 =
        std::env::var("B5_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(if quick { 0.3 } else { 5.0 });
    let concurrencies: Vec<usize> = std::env::var("B5_CONCURRENCY")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| if quick { vec![4] } else { vec![1, 8, 32, 64] });
    let json_out = std::env::var("B5_JSON").is_ok_and(|v| v == "1");

    let pki = pki();
    let server = start_server(&pki);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let ca_pem = pki.ca_pem.clone();
    runtime.block_on(async {
        let probe = client(&ca_pem, false);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = probe.get(format!("https://localhost:{}/readyz", server.port)).send().await
                && r.status() == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "the webhook did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let pid = server.child.id();
    let idle_rss = status_kib(pid, "VmRSS:");

    println!(
        "B5 — admission webhook ({} cores visible, {seconds} s per case)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<9} {:>11} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "protocol", "concurrency", "reviews/s", "p50 ms", "p99 ms", "max ms", "errors"
    );
    let mut cases = Vec::new();
    for http2 in [true, false] {
        for &concurrency in &concurrencies {
            let case = runtime.block_on(run_case(&ca_pem, server.port, http2, concurrency, seconds));
            println!(
                "{:<9} {:>11} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>7}",
                case.protocol,
                case.concurrency,
                case.rate(),
                case.percentile(0.5),
                case.percentile(0.99),
                case.percentile(1.0),
                case.errors
            );
            cases.push(case);
        }
    }
    let peak_rss = status_kib(pid, "VmHWM:");
    let rss = status_kib(pid, "VmRSS:");
    println!(
        "server RSS: idle {:.1} MiB, now {:.1} MiB, peak {:.1} MiB",
        idle_rss as f64 / 1024.0,
        rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
    let (rate, n) = in_process(if quick { 0.2 } else { 3.0 });
    println!(
        "review path alone (1 thread, no TLS/HTTP): {rate:.0} reviews/s ({:.1} µs per review, {n} reviews)",
        1e6 / rate
    );
    if json_out {
        let mut out = std::io::stdout().lock();
        for c in &cases {
            let line = json!({
                "bench": "B5", "protocol": c.protocol, "concurrency": c.concurrency, "reviews_per_second": c.rate(),
                "p50_ms": c.percentile(0.5), "p99_ms": c.percentile(0.99), "max_ms": c.percentile(1.0), "errors": c.errors,
                "server_peak_rss_kib": peak_rss,
            });
            writeln!(out, "{line}").unwrap();
        }
        writeln!(out, "{}", json!({"bench": "B5", "case": "review-path-in-process", "reviews_per_second": rate}))
            .unwrap();
    }
    let errors: usize = cases.iter().map(|c| c.errors).sum();
    drop(server);
    let _ = std::fs::remove_dir_all(&pki.dir);
    assert_eq!(errors, 0, "some reviews failed or got an unexpected verdict");
}
