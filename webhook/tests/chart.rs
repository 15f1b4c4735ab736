//! The webhook as the karpenter-hub Helm chart runs it: the container arguments rendered by a real
//! `helm` (KARPENTER_HUB_HELM) for the default values and every charts/karpenter-hub/ci/ file are
//! flags this binary accepts, with ports, paths and grace periods lining up with the pod spec; and
//! the binary serves admission reviews started with exactly those arguments.
//!
//! Without KARPENTER_HUB_HELM these tests say they skipped; with KARPENTER_HUB_REQUIRE_ENVTEST=1
//! (CI) they fail instead (operator/tests/suite/charts.rs has the chart's other tests).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Parser;
use serde_json::Value;
use webhook::cli::{Args, Lookups};
use webhook::limits::Budget;

use common::*;

const HELM_ENV: &str = "KARPENTER_HUB_HELM";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The helm binary, or None after saying why the test skipped (a failure where the real tiers
/// are required, as envtest's skip does).
fn helm() -> Option<PathBuf> {
    let test = envtest::current_test();
    match std::env::var_os(HELM_ENV).filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            let why = format!("{HELM_ENV} is not set: point it at a helm v4 binary (`.ci/run` installs one)");
            assert!(!envtest::required(), "{test}: no helm: {why}");
            let _ = writeln!(std::io::stderr().lock(), "test {test} ... skipped without helm: {why}");
            None
        }
    }
}

/// Every object rendered with `values` (None: the defaults) and `--set` assignments, or helm's error.
fn render(helm: &Path, values: Option<&Path>, sets: &[&str]) -> Result<Vec<Value>, String> {
    render_as(helm, "karpenter-hub", "karpenter-hub", values, sets)
}

/// [`render`] as release `release` in `namespace`.
fn render_as(
    helm: &Path,
    release: &str,
    namespace: &str,
    values: Option<&Path>,
    sets: &[&str],
) -> Result<Vec<Value>, String> {
    let chart = repo().join("charts/karpenter-hub");
    let mut args = vec!["template", release, chart.to_str().unwrap(), "--namespace", namespace];
    if let Some(v) = values {
        args.extend(["--values", v.to_str().unwrap()]);
    }
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = Command::new(helm)
        .args(&args)
        .env("KUBECONFIG", "/nonexistent/karpenter-hub-charts-test")
        .env("HELM_CACHE_HOME", repo().join("target/helm-home/cache"))
        .env("HELM_CONFIG_HOME", repo().join("target/helm-home/config"))
        .env("HELM_DATA_HOME", repo().join("target/helm-home/data"))
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_saphyr::from_multiple::<Value>(&String::from_utf8_lossy(&out.stdout)).unwrap())
}

/// The webhook Deployment rendered with `values` (None: the defaults), if the webhook is enabled.
fn webhook_deployment(helm: &Path, values: Option<&Path>) -> Option<Value> {
    render(helm, values, &[])
        .unwrap_or_else(|e| panic!("helm template {values:?}: {e}"))
        .into_iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook")
}

fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("charts/karpenter-hub/ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn container_args(deployment: &Value) -> Vec<String> {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

fn container_port(deployment: &Value, name: &str) -> u16 {
    let ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().unwrap();
    let port = ports.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no container port {name}"));
    u16::try_from(port["containerPort"].as_u64().unwrap()).unwrap()
}

fn parse(args: &[String]) -> Args {
    let argv = std::iter::once("karpenter-hub-webhook".to_string()).chain(args.iter().cloned());
    Args::try_parse_from(argv).unwrap_or_else(|e| panic!("the chart's webhook arguments {args:?} are refused:\n{e}"))
}

#[test]
fn the_charts_webhook_arguments_parse_and_line_up_with_the_pod() {
    let Some(helm) = helm() else { return };
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    sets.extend(ci_values().into_iter().map(Some));
    let mut rendered = 0;
    for values in &sets {
        let Some(deployment) = webhook_deployment(&helm, values.as_deref()) else { continue };
        rendered += 1;
        let args = parse(&container_args(&deployment));
        assert_eq!(args.address.port(), container_port(&deployment, "https"), "{values:?}");
        assert_eq!(
            args.probe_address.map(|a| a.port()),
            Some(container_port(&deployment, "http-metrics")),
            "{values:?}"
        );
        let pod = &deployment["spec"]["template"]["spec"];
        let mount = pod["containers"][0]["volumeMounts"][0]["mountPath"].as_str().unwrap();
        assert!(args.tls_cert_file.starts_with(mount) && args.tls_key_file.starts_with(mount), "{values:?}");
        // In-flight reviews finish before the kubelet's SIGKILL.
        let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap());
        assert!(args.shutdown_grace < grace, "{values:?}: --shutdown-grace {:?} >= {grace:?}", args.shutdown_grace);
        // The API server's timeout stays above the webhook's own bound on lookups.
        let vwc_timeout =
            if values.as_deref().is_some_and(|v| v.ends_with("user-secret-values.yaml")) { 10 } else { 5 };
        assert!(args.lookup_timeout < Duration::from_secs(vwc_timeout), "{values:?}");
        // The limits work together (the binary refuses to start otherwise).
        let budget = Budget::new(args.max_concurrent_reviews, args.max_buffered_bytes, args.max_body_bytes as u64);
        assert!(budget.is_ok(), "{values:?}: {budget:?}");
        assert!(args.header_read_timeout <= args.idle_timeout, "{values:?}");
    }
    assert!(rendered >= 6, "too few renderings with the webhook: {rendered}");

    // What custom-flags-values.yaml sets is what the binary gets.
    let custom =
        webhook_deployment(&helm, Some(&repo().join("charts/karpenter-hub/ci/custom-flags-values.yaml"))).unwrap();
    let args = parse(&container_args(&custom));
    assert_eq!(args.lookups, Lookups::Off);
    assert_eq!(args.max_body_bytes, 1_048_576);
    assert_eq!(args.request_timeout, Duration::from_secs(5));
    assert_eq!(args.shutdown_grace, Duration::from_secs(15));
    assert_eq!(args.cert_poll_interval, Duration::from_secs(30));
    assert_eq!(args.lookup_timeout, Duration::from_secs(1));
    assert_eq!(args.log, "webhook=debug");
    assert_eq!(args.address.port(), 10443);
    assert_eq!((args.max_buffered_bytes, args.max_concurrent_reviews, args.max_connections), (8_388_608, 16, 32));
    assert_eq!((args.idle_timeout, args.header_read_timeout), (Duration::from_secs(60), Duration::from_secs(3)));
}

/// webhook.networkPolicy: off by default; on, it selects exactly the webhook's pods and admits the
/// given peers only to the HTTPS port (and its probe peers to the probe port); on without peers,
/// the rendering fails naming the value (an ingress rule without `from` would admit everyone).
/// A real API server accepts it: operator/tests/suite/charts.rs applies every ci/ file (dry run).
#[test]
fn the_network_policy_admits_only_the_given_peers_to_the_webhook_port() {
    let Some(helm) = helm() else { return };
    let policies = |docs: &[Value]| docs.iter().filter(|d| d["kind"] == "NetworkPolicy").cloned().collect::<Vec<_>>();
    assert!(policies(&render(&helm, None, &[]).unwrap()).is_empty(), "a NetworkPolicy by default");

    let custom = repo().join("charts/karpenter-hub/ci/custom-flags-values.yaml");
    let docs = render(&helm, Some(&custom), &[]).unwrap();
    let [policy] = &policies(&docs)[..] else { panic!("one NetworkPolicy expected: {:?}", policies(&docs)) };
    let deployment = webhook_deployment(&helm, Some(&custom)).unwrap();
    let pod_labels = deployment["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
    let selector = policy["spec"]["podSelector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "{selector:?}");
    // The hub's pods are not selected.
    let hub = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "hub").unwrap();
    let hub_labels = hub["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
    assert!(!selector.iter().all(|(k, v)| hub_labels.get(k) == Some(v)), "the policy selects the hub");
    assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert_eq!(
        rules[0]["ports"],
        serde_json::json!([{"port": container_port(&deployment, "https"), "protocol": "TCP"}])
    );
    assert_eq!(rules[0]["from"], serde_json::json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}]));
    assert_eq!(rules[1]["ports"][0]["port"], container_port(&deployment, "http-metrics"));
    assert_eq!(rules[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");
    // Without probe peers the probe port is open to every source; the HTTPS port never is.
    let open_probes = render(&helm, Some(&custom), &["webhook.networkPolicy.probePeers=null"]).unwrap();
    let rules = policies(&open_probes)[0]["spec"]["ingress"].clone();
    assert!(rules[1].get("from").is_none() && rules[0]["from"].as_array().is_some_and(|f| !f.is_empty()), "{rules}");

    let error = render(&helm, None, &["webhook.networkPolicy.enabled=true"]).unwrap_err();
    assert!(error.contains("webhook.networkPolicy.apiServerPeers is empty"), "{error}");
    let error = render(
        &helm,
        None,
        &["webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiServerPeers[0].cidr=10.0.0.1/32"],
    )
    .unwrap_err();
    assert!(error.contains("/webhook/networkPolicy/apiServerPeers/0"), "{error}");
}

#[cfg(unix)]
#[tokio::test]
async fn the_webhook_serves_reviews_started_with_the_charts_arguments() {
    let Some(helm) = helm() else { return };
    // With the certificate from files (cert-manager's mode): this test writes them; the default
    // self-managed mode is the next test's.
    let deployment = render(
        &helm,
        Some(&repo().join("charts/karpenter-hub/ci/custom-flags-values.yaml")),
        &["webhook.certificate.mode=cert-manager"],
    )
    .unwrap()
    .into_iter()
    .find(|d| d["kind"] == "Deployment" && d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook")
    .unwrap();
    let ca = Ca::new();
    let dir = TempDir::new("chart-args");
    let (cert, key, _) = ca.issue(&["localhost"]);
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let probe_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The rendered arguments; only listeners (to the loopback) and the certificate files (the
    // Secret's mount does not exist here) move.
    let args: Vec<String> = container_args(&deployment)
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some(("--address", _)) => format!("--address=127.0.0.1:{port}"),
            Some(("--probe-address", _)) => format!("--probe-address=127.0.0.1:{probe_port}"),
            Some(("--tls-cert-file", _)) => format!("--tls-cert-file={}", dir.path().join("tls.crt").display()),
            Some(("--tls-key-file", _)) => format!("--tls-key-file={}", dir.path().join("tls.key").display()),
            _ => a,
        })
        .collect();
    let log = dir.path().join("webhook.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
        .args(&args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let client = client(&ca.pem(), false);
    let ready = tokio::time::timeout(
        Duration::from_secs(30),
        eventually("the webhook to be ready", || {
            let client = client.clone();
            async move {
                client
                    .get(format!("http://127.0.0.1:{probe_port}/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        }),
    )
    .await;
    if ready.is_err() || child.try_wait().unwrap().is_some() {
        let _ = child.kill();
        panic!("the webhook did not get ready with {args:?}:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    let body = review(
        "FlavorCatalog",
        "CREATE",
        flavor_catalog("c", serde_json::json!([{"name": "M", "priceHourly": 0.1}])),
        None,
    );
    let (status, answer) = post(&client, &format!("https://localhost:{port}/validate/flavorcatalogs"), &body).await;
    let free = review(
        "FlavorCatalog",
        "CREATE",
        flavor_catalog("c", serde_json::json!([{"name": "FREE", "cpu": 2, "memoryKi": 4_000_000, "priceHourly": 0.0}])),
        None,
    );
    let (free_status, refused) =
        post(&client, &format!("https://localhost:{port}/validate/flavorcatalogs"), &free).await;
    let _ = child.kill();
    let _ = child.wait();
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!((status, answer["response"]["allowed"].as_bool()), (200, Some(true)), "{answer}\n{logs}");
    assert_eq!((free_status, refused["response"]["allowed"].as_bool()), (200, Some(false)), "{refused}\n{logs}");
    // --log-format=text from the chart: no JSON lines.
    assert!(!logs.lines().any(|l| l.starts_with('{')), "{logs}");
}

/// The chart's default certificate mode for real: the chart rendered for a release of its own, the
/// webhook's ServiceAccount, roles and bindings created on a real API server with its
/// ValidatingWebhookConfiguration (made harmless: failures ignored, selecting nothing), and two
/// `karpenter-hub-webhook` processes started with exactly the rendered arguments (only listeners
/// and the in-memory volume's path moved) as that ServiceAccount (a TokenRequest token). With only
/// the chart's RBAC, they make one Secret, put its CA in every webhook's `caBundle`, become Ready,
/// and both serve a certificate a client trusting that `caBundle` accepts for the Service's name.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_webhook_keeps_its_own_certificate_with_the_charts_rbac_on_a_real_api_server() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
    use kube::Api;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    let _ = rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let Some(helm) = helm() else { return };
    let cp = envtest::shared_or_skip!("webhook-chart-certificate");
    let admin = cp.client().await.unwrap();
    let suffix = format!("{:x}", webhook::certificates::unix_now() % 0xffffff);
    let (release, ns) = (format!("whc{suffix}"), format!("webhook-chart-{suffix}"));
    let docs = render_as(&helm, &release, &ns, None, &[]).unwrap_or_else(|e| panic!("{e}"));
    let webhook_docs: Vec<&Value> =
        docs.iter().filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook").collect();
    let find =
        |kind: &str| webhook_docs.iter().find(|d| d["kind"] == kind).copied().unwrap_or_else(|| panic!("no {kind}"));
    let deployment = find("Deployment");
    let config_name = find("ValidatingWebhookConfiguration")["metadata"]["name"].as_str().unwrap().to_string();
    let service = find("Service")["metadata"]["name"].as_str().unwrap().to_string();
    let sa = find("ServiceAccount")["metadata"]["name"].as_str().unwrap().to_string();

    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    // Server-side apply of what the webhook's identity needs, as the chart renders it.
    let apply = PatchParams::apply("webhook-chart-test").force();
    for d in &webhook_docs {
        let mut d = (*d).clone();
        let kind = d["kind"].as_str().unwrap().to_string();
        let name = d["metadata"]["name"].as_str().unwrap().to_string();
        let (group, version) = match d["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), d["apiVersion"].as_str().unwrap().to_string()),
        };
        let plural = match kind.as_str() {
            "ServiceAccount" => "serviceaccounts",
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            "Role" => "roles",
            "RoleBinding" => "rolebindings",
            "ValidatingWebhookConfiguration" => {
                // Harmless on a shared server: no one's write is ever sent to it or refused by it.
                for hook in d["webhooks"].as_array_mut().unwrap() {
                    hook["failurePolicy"] = json!("Ignore");
                    for selector in ["namespaceSelector", "objectSelector"] {
                        if hook.get(selector).is_some() {
                            hook[selector]["matchLabels"] = json!({"karpenter-hub.example.com/never": "true"});
                        }
                    }
                }
                "validatingwebhookconfigurations"
            }
            _ => continue,
        };
        let ar = kube::api::ApiResource {
            group: group.clone(),
            version: version.clone(),
            api_version: d["apiVersion"].as_str().unwrap().to_string(),
            kind: kind.clone(),
            plural: plural.to_string(),
        };
        let api: Api<kube::api::DynamicObject> = match d["metadata"]["namespace"].as_str() {
            Some(n) => Api::namespaced_with(admin.clone(), n, &ar),
            None => Api::all_with(admin.clone(), &ar),
        };
        api.patch(&name, &apply, &Patch::Apply(&d)).await.unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
    }
    // The ServiceAccount's token, as the pod would mount it.
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create_token_request(&sa, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let dir = TempDir::new("chart-certificate");
    let mut kubeconfig = serde_json::to_value(cp.kubeconfig().unwrap()).unwrap();
    kubeconfig["users"][0]["user"] = json!({"token": token});
    let kubeconfig_path = dir.path().join("webhook.kubeconfig");
    std::fs::write(&kubeconfig_path, serde_json::to_string(&kubeconfig).unwrap()).unwrap();

    // Two replicas with the rendered arguments.
    let mut replicas = Vec::new();
    for replica in ["a", "b"] {
        let tls = dir.path().join(replica);
        std::fs::create_dir_all(&tls).unwrap();
        let (port, probe_port) = (free_port(), free_port());
        let args: Vec<String> = container_args(deployment)
            .into_iter()
            .map(|a| match a.split_once('=') {
                Some(("--address", _)) => format!("--address=127.0.0.1:{port}"),
                Some(("--probe-address", _)) => format!("--probe-address=127.0.0.1:{probe_port}"),
                Some(("--tls-cert-file", _)) => format!("--tls-cert-file={}", tls.join("tls.crt").display()),
                Some(("--tls-key-file", _)) => format!("--tls-key-file={}", tls.join("tls.key").display()),
                _ => a,
            })
            .collect();
        let log = tls.join("webhook.log");
        let child = Command::new(env!("CARGO_BIN_EXE_karpenter-hub-webhook"))
            .args(&args)
            .env_clear()
            .env("KUBECONFIG", &kubeconfig_path)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(tls.join("webhook.err")).unwrap())
            .spawn()
            .unwrap();
        replicas.push((child, port, probe_port, log));
    }
    for (child, _, probe_port, log) in &mut replicas {
        ready_or_panic(child, *probe_port, Duration::from_secs(60), log).await;
    }

    // One Secret, the webhook's; its CA in every webhook of the configuration.
    let secret_name = format!("{service}-cert");
    let secret = Api::<Secret>::namespaced(admin.clone(), &ns).get(&secret_name).await.unwrap();
    assert_eq!(
        secret.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
        webhook::certificates::MANAGED_BY
    );
    let ca = secret.data.as_ref().unwrap()["ca.crt"].0.clone();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let cfg = configs.get(&config_name).await.unwrap();
    let hooks = cfg.webhooks.unwrap();
    assert_eq!(hooks.len(), 6);
    for hook in &hooks {
        assert_eq!(hook.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()), Some(ca.as_slice()), "{}", hook.name);
    }
    // Both replicas serve a certificate the API server would accept for the Service's name.
    let name = format!("{service}.{ns}.svc");
    for (_, port, _, log) in &replicas {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(&ca) {
            roots.add(der.unwrap()).unwrap();
        }
        let tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .resolve(&name, std::net::SocketAddr::from(([127, 0, 0, 1], *port)))
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let body =
            review("FlavorCatalog", "CREATE", flavor_catalog("c", json!([{"name": "M", "priceHourly": 0.1}])), None);
        let (status, answer) = post(&client, &format!("https://{name}:{port}/validate/flavorcatalogs"), &body).await;
        assert_eq!(
            (status, answer["response"]["allowed"].as_bool()),
            (200, Some(true)),
            "{answer}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    for (mut child, ..) in replicas {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = configs.delete(&config_name, &DeleteParams::default()).await;
    let cluster_role = find("ClusterRole")["metadata"]["name"].as_str().unwrap();
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .delete(cluster_role, &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .delete(cluster_role, &DeleteParams::default())
        .await;
    let _ = Api::<Namespace>::all(admin).delete(&ns, &DeleteParams::default()).await;
}
