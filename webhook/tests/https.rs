//! The webhook over real HTTPS: generated certificates, a reqwest client, the routes as the API
//! server calls them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use crds::{CleverNodeClass, FlavorCatalog};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use webhook::references::{NoReferences, References, StaticReferences};

fn references() -> Arc<dyn References> {
    let class: CleverNodeClass = serde_json::from_value(node_class("default", json!({}), Some("extra"))).unwrap();
    let catalog: FlavorCatalog = serde_json::from_value(flavor_catalog(
        "extra",
        json!([{"name": "XXL", "cpu": 32, "memoryKi": 64000000, "priceHourly": 0.4}]),
    ))
    .unwrap();
    Arc::new(StaticReferences::default().with_node_class(class).with_flavor_catalog(catalog))
}

fn message(body: &Value) -> &str {
    body["response"]["status"]["message"].as_str().unwrap_or("")
}

fn warnings(body: &Value) -> Vec<String> {
    body["response"]["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn allowed_denied_and_warned_reviews() {
    let h = Harness::start("verdicts", references()).await;
    let client = h.client(false);

    // Allowed, no warnings: a class whose catalogue exists and is valid.
    let (status, body) = post(
        &client,
        &h.url("/validate/clevernodeclasses"),
        &review("CleverNodeClass", "CREATE", node_class("default", json!({"team": "a"}), Some("extra")), None),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["response"]["uid"], UID);
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(warnings(&body).is_empty(), "{body}");

    // Denied with the field and the fix: a free new flavor (legal for the CRD schema).
    let free = flavor_catalog("free", json!([{"name": "FREE", "cpu": 2, "memoryKi": 2097152, "priceHourly": 0}]));
    let (status, body) =
        post(&client, &h.url("/validate/flavorcatalogs"), &review("FlavorCatalog", "CREATE", free, None)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["allowed"], false);
    assert_eq!(body["response"]["status"]["code"], 403);
    assert!(message(&body).starts_with("spec.flavors[0].priceHourly: a new flavor must not be free"), "{body}");

    // Allowed with warnings: the referenced catalogue does not exist.
    let (_, body) = post(
        &client,
        &h.url("/validate/clevernodeclasses"),
        &review("CleverNodeClass", "CREATE", node_class("other", json!({}), Some("missing")), None),
    )
    .await;
    assert_eq!(body["response"]["allowed"], true);
    let w = warnings(&body);
    assert!(
        w.iter().any(|w| w.starts_with("spec.flavorCatalogRef.name: FlavorCatalog missing does not exist in team-a")),
        "{w:?}"
    );

    // Cross-object: the NodePool's class serves XXL through its catalogue...
    let pinned = |flavor: &str| {
        node_pool("pool", json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [flavor]}]))
    };
    let (_, body) =
        post(&client, &h.url("/validate/nodepools"), &review("NodePool", "CREATE", pinned("XXL"), None)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    // ...but no flavor called XYZ.
    let (_, body) =
        post(&client, &h.url("/validate/nodepools"), &review("NodePool", "CREATE", pinned("XYZ"), None)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(
        message(&body).contains("spec.template.spec.requirements[0] excludes every flavor of the catalogue"),
        "{body}"
    );

    // Immutable fields on update.
    let old = pinned("XXL");
    let mut new = old.clone();
    new["spec"]["clusterName"] = json!("staging-paris");
    let (_, body) = post(&client, &h.url("/validate/nodepools"), &review("NodePool", "UPDATE", new, Some(old))).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("spec.clusterName: clusterName is immutable"), "{body}");

    // Every answer was counted by kind and outcome.
    let metrics = client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = metrics.text().await.unwrap();
    for line in [
        "karpenter_hub_webhook_requests_total{kind=\"CleverNodeClass\",outcome=\"allowed\"} 2",
        "karpenter_hub_webhook_requests_total{kind=\"FlavorCatalog\",outcome=\"denied\"} 1",
        "karpenter_hub_webhook_requests_total{kind=\"NodePool\",outcome=\"denied\"} 2",
        "karpenter_hub_webhook_denials_total{kind=\"NodePool\"} 2",
        "karpenter_hub_webhook_request_duration_seconds_count{kind=\"NodePool\"} 3",
        "karpenter_hub_webhook_lookups_total{kind=\"CleverNodeClass\",outcome=\"found\"} 3",
        "karpenter_hub_webhook_lookups_total{kind=\"FlavorCatalog\",outcome=\"found\"} 4",
        "karpenter_hub_webhook_lookups_total{kind=\"FlavorCatalog\",outcome=\"missing\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    h.server.shutdown().await.unwrap();
}

/// The cluster-scoped kind: reviews without a namespace, answered on its own route, nothing read
/// (not even with lookups on), counted under its kind.
#[tokio::test]
async fn organizations_are_reviewed_without_a_namespace() {
    let h = Harness::start("organizations", references()).await;
    let client = h.client(false);
    let url = h.url("/validate/cleverorganizations");
    let selector = json!({"matchLabels": {"clever-cloud.com/organisation": "orga-acme"}});

    // Allowed, no warnings: fleet.md §4's example with a cost ceiling.
    let good = organization(
        "orga-acme",
        json!({"clusterSelector": selector, "quota": {"cpu": "40", "memory": "40G"},
               "limits": {"karpenter.clever-cloud.com/price-per-hour": "2.5"}}),
    );
    let (status, body) = post(&client, &url, &cluster_review("CleverOrganization", "CREATE", good.clone(), None)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["uid"], UID);
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(warnings(&body).is_empty(), "{body}");

    // Denied with the field and the fix: a resource in spec.limits, a price with an exponent.
    let bad = organization(
        "orga-acme",
        json!({"clusterSelector": selector, "limits": {"cpu": "40", "karpenter.clever-cloud.com/price-per-hour": "1e3"}}),
    );
    let (_, body) = post(&client, &url, &cluster_review("CleverOrganization", "UPDATE", bad, Some(good))).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    assert_eq!(body["response"]["status"]["code"], 403);
    let m = message(&body);
    assert!(m.starts_with("spec.limits[cpu]: spec.limits takes only karpenter.clever-cloud.com/price-per-hour"), "{m}");
    assert!(m.contains("move it to spec.quota.cpu"), "{m}");
    assert!(
        m.contains("spec.limits[karpenter.clever-cloud.com/price-per-hour]: \"1e3\" is not a decimal number"),
        "{m}"
    );

    // Allowed with warnings: a binary memory suffix, a quota below one control plane, everything selected.
    let odd = organization("everything", json!({"clusterSelector": {}, "quota": {"cpu": "8", "memory": "40Gi"}}));
    let (_, body) = post(&client, &url, &cluster_review("CleverOrganization", "CREATE", odd, None)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let w = warnings(&body);
    assert!(w.iter().any(|w| w.starts_with("spec.quota.memory: \"40Gi\" is 42.95G")), "{w:?}");
    assert!(w.iter().any(|w| w.starts_with("spec.quota.cpu: \"8\" is below 16 vCPU")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("selects every registered cluster of every namespace")), "{w:?}");

    // Another kind posted to this route is refused as misrouted.
    let (_, body) = post(&client, &url, &review("FlavorCatalog", "CREATE", flavor_catalog("c", json!([])), None)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("/validate/cleverorganizations validates CleverOrganization"), "{body}");

    let text = client.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "karpenter_hub_webhook_requests_total{kind=\"CleverOrganization\",outcome=\"allowed\"} 2",
        "karpenter_hub_webhook_requests_total{kind=\"CleverOrganization\",outcome=\"denied\"} 2",
        "karpenter_hub_webhook_warnings_total{kind=\"CleverOrganization\"} 3",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("lookups_total{kind=\"CleverOrganization\""), "nothing is read for an organisation");
    assert!(
        text.lines().filter(|l| l.starts_with("karpenter_hub_webhook_lookups_total{")).all(|l| l.ends_with(" 0")),
        "nothing is read for an organisation:\n{text}"
    );
    h.server.shutdown().await.unwrap();
}

/// CapacityBuffers on their own route: allowed, denied with the field and the fix, warned; nothing
/// read (the PodTemplate is the hub's to resolve); counted under their kind.
#[tokio::test]
async fn capacity_buffers_are_reviewed_on_their_route() {
    let h = Harness::start("capacitybuffers", references()).await;
    let client = h.client(false);
    let url = h.url("/validate/capacitybuffers");

    // Allowed, no warnings: a fleet buffer bounded by a count and by limits.
    let good = capacity_buffer(
        "web-burst",
        json!({"clusterSelector": {"matchLabels": {"env": "prod"}}, "podTemplateRef": {"name": "web-burst"},
               "replicas": 3, "limits": {"cpu": "8", "memory": "16Gi"}}),
    );
    let (status, body) = post(&client, &url, &review("CapacityBuffer", "CREATE", good.clone(), None)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["uid"], UID);
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(warnings(&body).is_empty(), "{body}");

    // Denied with the field and the fix: no cluster, no count nor limits, a negative limit.
    let bad = capacity_buffer("web-burst", json!({"podTemplateRef": {"name": "web-burst"}, "limits": {"cpu": "-2"}}));
    let (_, body) = post(&client, &url, &review("CapacityBuffer", "UPDATE", bad, Some(good))).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    assert_eq!(body["response"]["status"]["code"], 403);
    let m = message(&body);
    assert!(m.starts_with("spec: neither clusterName nor clusterSelector is set"), "{m}");
    assert!(m.contains("spec.limits[cpu]: \"-2\" is negative: limits are at least 0; remove the sign"), "{m}");

    // Allowed with warnings: replicas 0, limits naming none of cpu, memory and pods.
    let odd = capacity_buffer(
        "idle",
        json!({"clusterName": "prod-paris", "podTemplateRef": {"name": "web-burst"}, "replicas": 0,
               "limits": {"ephemeral-storage": "10Gi"}}),
    );
    let (_, body) = post(&client, &url, &review("CapacityBuffer", "CREATE", odd, None)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let w = warnings(&body);
    assert!(w.iter().any(|w| w.starts_with("spec.replicas: 0 keeps room for no pod")), "{w:?}");
    assert!(w.iter().any(|w| w.starts_with("spec.limits: names none of cpu, memory and pods")), "{w:?}");

    // Another kind posted to this route is refused as misrouted.
    let (_, body) = post(&client, &url, &review("FlavorCatalog", "CREATE", flavor_catalog("c", json!([])), None)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("/validate/capacitybuffers validates CapacityBuffer"), "{body}");

    let text = client.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "karpenter_hub_webhook_requests_total{kind=\"CapacityBuffer\",outcome=\"allowed\"} 2",
        "karpenter_hub_webhook_requests_total{kind=\"CapacityBuffer\",outcome=\"denied\"} 2",
        "karpenter_hub_webhook_warnings_total{kind=\"CapacityBuffer\"} 2",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(
        text.lines().filter(|l| l.starts_with("karpenter_hub_webhook_lookups_total{")).all(|l| l.ends_with(" 0")),
        "nothing is read for a buffer:\n{text}"
    );
    h.server.shutdown().await.unwrap();
}

/// NodeOverlays on their own route: allowed, denied with the field and the fix, warned; nothing read
/// (the hub evaluates an overlay against its namespace's pools); counted under their kind.
#[tokio::test]
async fn node_overlays_are_reviewed_on_their_route() {
    let h = Harness::start("nodeoverlays", references()).await;
    let client = h.client(false);
    let url = h.url("/validate/nodeoverlays");

    // Allowed, no warnings: a discount on two flavors, with a weight.
    let good = node_overlay(
        "cheaper-small",
        json!({"requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS", "S"]}],
               "priceAdjustment": "-10%", "weight": 10}),
    );
    let (status, body) = post(&client, &url, &review("NodeOverlay", "CREATE", good.clone(), None)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["uid"], UID);
    assert_eq!(body["response"]["allowed"], true, "{body}");
    assert!(warnings(&body).is_empty(), "{body}");

    // Denied with the field and the fix: no price change, a Gt without an integer, a bad value.
    let bad = node_overlay(
        "cheaper-small",
        json!({"requirements": [
            {"key": "karpenter.clever-cloud.com/instance-cpu", "operator": "Gt", "values": ["four"]},
            {"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS", "not valid"]}
        ]}),
    );
    let (_, body) = post(&client, &url, &review("NodeOverlay", "UPDATE", bad, Some(good))).await;
    assert_eq!(body["response"]["allowed"], false, "{body}");
    assert_eq!(body["response"]["status"]["code"], 403);
    let m = message(&body);
    assert!(m.starts_with("spec: none of price, priceAdjustment and capacity is set"), "{m}");
    assert!(m.contains("spec.requirements[0].values: operator Gt needs exactly one non-negative integer"), "{m}");
    assert!(m.contains("spec.requirements[1].values[1]: \"not valid\" is not a valid label value"), "{m}");

    // Allowed with warnings: a price of 0 for every flavor of the namespace.
    let odd = node_overlay("free", json!({"requirements": [], "price": "0"}));
    let (_, body) = post(&client, &url, &review("NodeOverlay", "CREATE", odd, None)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let w = warnings(&body);
    assert!(w.iter().any(|w| w.starts_with("spec.price: \"0\" makes the selected offerings free")), "{w:?}");
    assert!(w.iter().any(|w| w.starts_with("spec.requirements: is empty: the overlay selects every flavor")), "{w:?}");

    // Another kind posted to this route is refused as misrouted.
    let (_, body) = post(&client, &url, &review("FlavorCatalog", "CREATE", flavor_catalog("c", json!([])), None)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("/validate/nodeoverlays validates NodeOverlay"), "{body}");

    let text = client.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "karpenter_hub_webhook_requests_total{kind=\"NodeOverlay\",outcome=\"allowed\"} 2",
        "karpenter_hub_webhook_requests_total{kind=\"NodeOverlay\",outcome=\"denied\"} 2",
        "karpenter_hub_webhook_warnings_total{kind=\"NodeOverlay\"} 2",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(
        text.lines().filter(|l| l.starts_with("karpenter_hub_webhook_lookups_total{")).all(|l| l.ends_with(" 0")),
        "nothing is read for an overlay:\n{text}"
    );
    h.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_lookups_cross_object_checks_are_warnings() {
    let h = Harness::start("nolookups", Arc::new(NoReferences)).await;
    let client = h.client(false);
    let pool =
        node_pool("pool", json!([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["XXL"]}]));
    let (_, body) = post(&client, &h.url("/validate/nodepools"), &review("NodePool", "CREATE", pool, None)).await;
    assert_eq!(body["response"]["allowed"], true, "{body}");
    let w = warnings(&body);
    assert!(w.iter().any(|w| w.contains("--lookups=off")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("excludes every flavor")), "{w:?}");
    h.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_bodies_get_400_or_a_well_formed_denial() {
    let h = Harness::start_with("bad", Arc::new(NoReferences), |s| {
        s.max_body_bytes = 64 * 1024;
        s.request_timeout = Duration::from_secs(1);
    })
    .await;
    let client = h.client(false);
    let url = h.url("/validate/clevernodeclasses");
    for (body, expected) in [
        (Vec::new(), "not an AdmissionReview"),
        (b"{not json".to_vec(), "not an AdmissionReview"),
        (b"[]".to_vec(), "expected apiVersion admission.k8s.io/v1"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}"#.to_vec(),
            "admissionReviewVersions",
        ),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), "no request"),
        (vec![0xff, 0xfe, 0x00], "not an AdmissionReview"),
    ] {
        let response = client.post(&url).body(body.clone()).send().await.unwrap();
        assert_eq!(response.status(), 400, "{body:?}");
        let text = response.text().await.unwrap();
        assert!(text.contains(expected), "{body:?}: {text}");
    }
    // Oversized: refused before being read whole.
    let huge =
        review("CleverNodeClass", "CREATE", node_class("big", json!({"team": "a".repeat(128 * 1024)}), None), None);
    let response = client.post(&url).json(&huge).send().await.unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("larger than 65536 bytes"));
    // Deeply nested JSON is refused by the parser's recursion limit, not a stack overflow.
    let nested = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    assert_eq!(client.post(&url).body(nested).send().await.unwrap().status(), 400);
    let nested = format!("{{\"apiVersion\":{}1{}}}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(client.post(&url).body(nested).send().await.unwrap().status(), 400);
    // Wrong kind for the route, or an object of the wrong shape: a denial that says why.
    let (status, body) = post(&client, &url, &review("NodePool", "CREATE", node_pool("p", json!([])), None)).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("wrong path"), "{body}");
    let (_, body) =
        post(&client, &url, &review("CleverNodeClass", "CREATE", json!({"metadata": {"name": 7}}), None)).await;
    assert_eq!(body["response"]["allowed"], false);
    assert!(message(&body).contains("cannot be read as a CleverNodeClass"), "{body}");
    // Wrong method and unknown paths.
    assert_eq!(client.get(&url).send().await.unwrap().status(), 405);
    assert_eq!(client.post(h.url("/validate/pods")).body("{}").send().await.unwrap().status(), 404);

    // A client that stalls mid-body gets 408, and the server keeps serving.
    let mut stream = tls_connect(&h).await;
    stream
        .write_all(b"POST /validate/clevernodeclasses HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\n\r\n{\"apiVersion\"")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server held a stalled request open");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"), "{}", String::from_utf8_lossy(&answer));
    assert_eq!(client.get(h.url("/livez")).send().await.unwrap().status(), 200);

    let text = client.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        text.contains("karpenter_hub_webhook_requests_total{kind=\"CleverNodeClass\",outcome=\"invalid\"} 9"),
        "{text}"
    );
    h.server.shutdown().await.unwrap();
}

async fn tls_connect(h: &Harness) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(h.ca.pem().as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(h.server.address()).await.unwrap();
    connector.connect("localhost".try_into().unwrap(), tcp).await.unwrap()
}

#[tokio::test]
async fn old_tls_versions_are_refused() {
    let h = Harness::start("tls12", Arc::new(NoReferences)).await;
    // TLS 1.2 is accepted...
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(h.ca.pem().as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(h.server.address()).await.unwrap();
    let stream =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect("localhost".try_into().unwrap(), tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    // ...a TLS 1.0 ClientHello is not: the server answers with an alert and closes.
    let mut tcp = tokio::net::TcpStream::connect(h.server.address()).await.unwrap();
    // A minimal TLS 1.0 ClientHello (record version 3.1, client version 3.1, one cipher suite).
    let mut hello = vec![0x01, 0x00, 0x00, 0x2d, 0x03, 0x01];
    hello.extend([0u8; 32]);
    hello.extend([0x00, 0x00, 0x02, 0x00, 0x2f, 0x01, 0x00, 0x00, 0x00]);
    hello[3] = (hello.len() - 4) as u8;
    let mut record = vec![0x16, 0x03, 0x01, 0x00, hello.len() as u8];
    record.extend(hello);
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer)).await.unwrap();
    assert_eq!(answer.first(), Some(&0x15), "expected a TLS alert, got {answer:?}");
    h.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn certificate_rotation_is_observed_by_a_client() {
    let h = Harness::start("rotation", Arc::new(NoReferences)).await;
    let client = h.client(true);
    let served = |client: reqwest::Client, url: String| async move {
        let response = client.get(url).send().await.unwrap();
        response.extensions().get::<reqwest::tls::TlsInfo>().and_then(|i| i.peer_certificate()).unwrap().to_vec()
    };
    assert_eq!(served(client.clone(), h.url("/livez")).await, h.leaf_der);

    // A new pair from the same CA: new connections get it, no restart.
    let (cert, key, new_der) = h.ca.issue_until(&["localhost"], Some((2031, 5, 17)));
    std::fs::write(h.dir.path().join("tls.key.tmp"), key).unwrap();
    std::fs::write(h.dir.path().join("tls.crt.tmp"), cert).unwrap();
    std::fs::rename(h.dir.path().join("tls.key.tmp"), h.dir.path().join("tls.key")).unwrap();
    std::fs::rename(h.dir.path().join("tls.crt.tmp"), h.dir.path().join("tls.crt")).unwrap();
    eventually("the new certificate to be served", || {
        let (client, url, new_der) = (client.clone(), h.url("/livez"), new_der.clone());
        async move { served(client, url).await == new_der }
    })
    .await;

    // A broken pair is refused: the previous one stays, and the failure is counted.
    std::fs::write(h.dir.path().join("tls.crt"), "garbage").unwrap();
    let metrics = h.server.metrics().clone();
    eventually("the broken pair to be refused", || {
        let metrics = metrics.clone();
        async move {
            metrics.encode().unwrap().contains("karpenter_hub_webhook_certificate_reloads_total{outcome=\"failure\"} 1")
        }
    })
    .await;
    assert_eq!(served(client.clone(), h.url("/livez")).await, new_der);
    let text = client.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("karpenter_hub_webhook_certificate_reloads_total{outcome=\"success\"} 1"), "{text}");
    // The expiry gauge follows the served certificate (an alert can watch it when rotations keep failing).
    assert_eq!(webhook::tls::not_after(&new_der), Some(1_936_742_400));
    assert!(text.contains("karpenter_hub_webhook_certificate_expiry_timestamp_seconds 1936742400\n"), "{text}");
    h.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn probes_on_the_plain_address_and_graceful_shutdown() {
    /// Answers every lookup after a delay, so a request is in flight during shutdown; says when one began.
    #[derive(Debug, Default)]
    struct Slow(std::sync::atomic::AtomicBool);
    impl References for Slow {
        fn node_class<'a>(&'a self, _: &'a str, _: &'a str) -> webhook::references::LookupFuture<'a, CleverNodeClass> {
            Box::pin(async {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                crds::admission::Lookup::Missing
            })
        }
        fn flavor_catalog<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> webhook::references::LookupFuture<'a, FlavorCatalog> {
            Box::pin(async { crds::admission::Lookup::Missing })
        }
    }
    let slow = Arc::new(Slow::default());
    let h = Harness::start_with("shutdown", slow.clone(), |s| s.probe_address = Some(([127, 0, 0, 1], 0).into())).await;
    let probe = format!("http://{}", h.server.probe_address().unwrap());
    let plain = h.client(false);
    assert_eq!(plain.get(format!("{probe}/livez")).send().await.unwrap().status(), 200);
    assert_eq!(plain.get(format!("{probe}/readyz")).send().await.unwrap().text().await.unwrap(), "ok");
    assert!(plain.get(format!("{probe}/metrics")).send().await.unwrap().text().await.unwrap().contains("# EOF"));
    assert_eq!(plain.post(format!("{probe}/validate/nodepools")).body("{}").send().await.unwrap().status(), 404);

    let client = h.client(false);
    let url = h.url("/validate/nodepools");
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move { post(&client, &url, &review("NodePool", "CREATE", node_pool("p", json!([])), None)).await }
    });
    eventually("the review to be in flight", || {
        let slow = slow.clone();
        async move { slow.0.load(std::sync::atomic::Ordering::SeqCst) }
    })
    .await;
    let address = h.server.address();
    let Harness { server, dir: _dir, .. } = h;
    let started = std::time::Instant::now();
    server.shutdown().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(4), "shutdown waited the whole grace period");
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "the in-flight review was cut");
    assert_eq!(body["response"]["allowed"], true);
    assert!(tokio::net::TcpStream::connect(address).await.is_err(), "still accepting after shutdown");
}

#[tokio::test]
async fn many_concurrent_reviews_over_http2() {
    let h = Harness::start("h2", references()).await;
    let client = h.client(false);
    // One review first, as the API server's client does: until a connection has negotiated h2, the
    // client cannot know it may share one, and 200 requests at once would open 200 connections,
    // of which those over --max-connections (64) are closed during their handshake.
    let warm = client
        .post(h.url("/validate/clevernodeclasses"))
        .json(&review("CleverNodeClass", "CREATE", node_class("c", json!({}), None), None))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.version(), reqwest::Version::HTTP_2);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (client, url) = (client.clone(), h.url("/validate/clevernodeclasses"));
        tasks.push(tokio::spawn(async move {
            let labels = if i % 2 == 0 { json!({"team": "a"}) } else { json!({"kubernetes.io/role": "x"}) };
            let response = client
                .post(url)
                .json(&review("CleverNodeClass", "CREATE", node_class("c", labels, None), None))
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), reqwest::Version::HTTP_2);
            let body: Value = response.json().await.unwrap();
            body["response"]["allowed"].as_bool().unwrap() == (i % 2 == 0)
        }));
    }
    for task in tasks {
        assert!(task.await.unwrap());
    }
    h.server.shutdown().await.unwrap();
}

#[cfg(unix)]
#[tokio::test]
async fn a_kubernetes_secret_volume_swap_is_observed_by_a_client() {
    use std::os::unix::fs::symlink;
    let ca = Ca::new();
    let dir = TempDir::new("secret-volume");
    // The kubelet's layout: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/.
    let write_version = |name: &str| {
        let (cert, key, der) = ca.issue(&["localhost"]);
        let version = dir.path().join(name);
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("tls.crt"), cert).unwrap();
        std::fs::write(version.join("tls.key"), key).unwrap();
        der
    };
    let first = write_version("..2026_11_23_09_00_00.1");
    symlink("..2026_11_23_09_00_00.1", dir.path().join("..data")).unwrap();
    symlink("..data/tls.crt", dir.path().join("tls.crt")).unwrap();
    symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
    let server = webhook::server::start(settings(dir.path()), Arc::new(NoReferences), provider()).await.unwrap();
    let url = format!("https://localhost:{}/livez", server.address().port());
    let client = client(&ca.pem(), true);
    let served = || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let response = client.get(url).send().await.unwrap();
            response.extensions().get::<reqwest::tls::TlsInfo>().and_then(|i| i.peer_certificate()).unwrap().to_vec()
        }
    };
    assert_eq!(served().await, first);

    // The update: a new timestamped directory, a new ..data link renamed over the old, old dir removed.
    let second = write_version("..2026_11_23_10_00_00.2");
    symlink("..2026_11_23_10_00_00.2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    std::fs::remove_dir_all(dir.path().join("..2026_11_23_09_00_00.1")).unwrap();
    eventually("the swapped certificate to be served", || {
        let (served, second) = (served(), second.clone());
        async move { served.await == second }
    })
    .await;
    server.shutdown().await.unwrap();
}
