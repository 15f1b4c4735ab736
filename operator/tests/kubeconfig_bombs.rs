//! Hostile kubeconfigs of issue 23: YAML alias bombs are refused within bounded memory, with a
//! message naming the limit; a server or proxy URL holding a password, a proxy, and a server on a
//! link-local address (a cloud metadata endpoint) are refused, and no password ever reaches a
//! condition, an event or a log line. Everything the hub and its libraries log at debug level is
//! captured, as in secrets_not_logged.rs.
//!
//! This file holds a single test: it installs the process-wide log subscriber, and it reads the
//! process's peak memory (`VmHWM`, reset through `/proc/self/clear_refs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use crds::NodePool;
use k8s_openapi::api::core::v1::Event;
use kube::{Api, Client, api::ListParams};
use operator::commands::sandbox::world::{World, quick_cke};
use tracing_subscriber::util::SubscriberInitExt;

mod common;
use common::{apply_example, metric, wait_for};

/// `ClusterReachable` of the pool `default` in `ns`: (reason, message).
async fn reachable(mgmt: &Client, ns: &str) -> Option<(String, String)> {
    let pool = Api::<NodePool>::namespaced(mgmt.clone(), ns).get("default").await.ok()?;
    let c = pool.status?.conditions.into_iter().find(|c| c.type_ == "ClusterReachable")?;
    Some((c.reason, c.message))
}

/// Wait until the pool's `ClusterReachable` has `reason` and a message holding `message_has`;
/// that message.
async fn wait_reachable(mgmt: &Client, ns: &str, reason: &str, message_has: &str) -> String {
    wait_for(
        &format!("{ns}: ClusterReachable {reason} mentioning {message_has:?}"),
        Duration::from_secs(30),
        || async { reachable(mgmt, ns).await.is_some_and(|(r, m)| r == reason && m.contains(message_has)) },
    )
    .await;
    reachable(mgmt, ns).await.map(|(_, m)| m).unwrap_or_default()
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line =
        status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap()
}

/// The classic alias bomb, 650 bytes: a 400-byte string, then six levels of eight aliases of the
/// level before (8^6 = 262,144 copies, 100 MiB of text, once expanded).
fn alias_bomb() -> String {
    let mut y = format!("a: &a \"{}\"\n", "x".repeat(400));
    let levels = ["a", "b", "c", "d", "e", "f", "g"];
    for w in levels.windows(2) {
        let refs = vec![format!("*{}", w[0]); 8].join(",");
        y.push_str(&format!("{}: &{} [{refs}]\n", w[1], w[1]));
    }
    y
}

/// Peak memory growth the bombs may cause: the parse of one Secret is bounded to about 1 MiB of
/// text and 20,000 nodes; the rest is room for what the hub and the emulators do meanwhile.
const MAX_GROWTH_MIB: f64 = 48.0;

/// Alias-bomb Secrets registered at once.
const BOMBS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_kubeconfigs_are_refused_in_bounded_memory_without_a_password_shown() {
    let capture = common::LogCapture::default();
    tracing_subscriber::fmt()
        .with_writer(capture.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish()
        .try_init()
        .unwrap();

    let mut world = World::start(&[("team-a", "alpha")], |i| quick_cke(i as u64 + 80)).await.unwrap();
    world.registry_settings.probe_interval = Duration::from_secs(1);
    apply_example(&world, 0).await;
    world.start_hub();
    let mgmt = world.mgmt.client();
    wait_reachable(&mgmt, "team-a", "Connected", "").await;

    // Alias bombs, registered all at once: the hub's peak memory stays bounded.
    let rss_before = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS (VmHWM)");
    let bomb = alias_bomb();
    assert!(bomb.len() < 700, "the bomb is {} bytes", bomb.len());
    for i in 0..BOMBS {
        world.put_secret("team-a", &format!("bomb-{i}"), bomb.as_bytes()).await.unwrap();
    }
    wait_for("every bomb refused", Duration::from_secs(120), || async {
        (0..BOMBS).all(|i| {
            let cluster = format!("team-a/bomb-{i}");
            metric(&world, "karpenter_hub_cluster_phase", &[("cluster", &cluster), ("phase", "InvalidKubeconfig")])
                == 1.0
        })
    })
    .await;
    let peak = status_kib("VmHWM:");
    let growth_mib = peak.saturating_sub(rss_before) as f64 / 1024.0;
    eprintln!(
        "{BOMBS} alias bombs of {} bytes: RSS {:.1} MiB before, peak {:.1} MiB after (growth {growth_mib:.1} MiB)",
        bomb.len(),
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    assert!(growth_mib < MAX_GROWTH_MIB, "the bombs grew the peak memory by {growth_mib:.1} MiB");

    // Credentials in URLs, a proxy, a metadata endpoint: each refused, naming the field.
    let good = world.clusters[0].server.kubeconfig();
    let url = good.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap();
    let passwords = ["url-pass-5b1e7a", "proxy-pass-8c4d2f"];
    let with = |server: Option<String>, proxy: Option<&str>| {
        let mut k = good.clone();
        let cluster = k.clusters[0].cluster.as_mut().unwrap();
        if let Some(server) = server {
            cluster.server = Some(server);
        }
        cluster.proxy_url = proxy.map(String::from);
        serde_json::to_string(&k).unwrap()
    };
    // Consecutive refusals say different things, so each is seen.
    let hostile: Vec<(&str, String)> = vec![
        (
            "clusters[0].cluster.server` holds credentials",
            with(Some(url.replace("https://", &format!("https://hub:{}@", passwords[0]))), None),
        ),
        ("link-local", with(Some("https://169.254.169.254:6443".into()), None)),
        (
            "clusters[0].cluster.proxy-url` holds credentials",
            with(None, Some(&format!("http://squid:{}@127.0.0.1:3128", passwords[1]))),
        ),
        ("link-local", with(Some("https://[fe80::1%25eth0]:6443".into()), None)),
        ("does not connect through proxies", with(None, Some("socks5://127.0.0.1:1080"))),
        // 169.254.169.254 as inet_aton (and so getaddrinfo) reads a single number.
        ("link-local", with(Some("https://2852039166:6443".into()), None)),
        ("goes over the hub's limit of", alias_bomb()),
    ];
    // Every condition message seen, then every event.
    let mut published = String::new();
    for (marker, bytes) in &hostile {
        world.put_secret("team-a", "alpha", bytes.as_bytes()).await.unwrap();
        published.push_str(&wait_reachable(&mgmt, "team-a", "InvalidKubeconfig", marker).await);
        published.push('\n');
    }

    // The cluster comes back, named by a host name this time: resolved before connecting (to
    // loopback, which is allowed), then with its real kubeconfig.
    let by_name = with(Some(url.replace("127.0.0.1", "localhost")), None);
    assert!(by_name.contains("https://localhost:"), "{url}");
    world.put_secret("team-a", "alpha", by_name.as_bytes()).await.unwrap();
    wait_reachable(&mgmt, "team-a", "Connected", "https://localhost:").await;
    world.register(0).await.unwrap();
    wait_reachable(&mgmt, "team-a", "Connected", "https://127.0.0.1:").await;

    // Statuses and events as the API shows them.
    let pools = Api::<NodePool>::namespaced(mgmt.clone(), "team-a").list(&ListParams::default()).await.unwrap();
    published.push_str(&serde_json::to_string(&pools.items).unwrap());
    let events = Api::<Event>::all(mgmt.clone()).list(&ListParams::default()).await.unwrap();
    published.push_str(&serde_json::to_string(&events.items).unwrap());
    world.shutdown().await;

    let logs = capture.text();
    for expected in ["DEBUG", "InvalidKubeconfig", "holds credentials", "link-local", "YAML"] {
        assert!(logs.contains(expected), "the captured logs lack {expected:?}");
    }
    for expected in ["holds credentials", "proxies", "link-local", "goes over the hub's limit of"] {
        assert!(published.contains(expected), "no condition says {expected:?}");
    }
    // Events are written on a change of reason: the first refusal's is there.
    let events = serde_json::to_string(&events.items).unwrap();
    assert!(events.contains("clusters[0].cluster.server` holds credentials"), "no event on the first refusal");
    for secret in passwords {
        if let Some(at) = logs.find(secret) {
            let line_start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let line_end = logs[at..].find('\n').map_or(logs.len(), |i| at + i);
            panic!("a URL password was logged: {}", &logs[line_start..line_end]);
        }
        assert!(!published.contains(secret), "a URL password was published in a status or an event");
    }
}
