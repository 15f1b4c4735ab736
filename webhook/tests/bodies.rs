//! Property tests of the request path: whatever the body, the answer is a 400 or a well-formed
//! AdmissionReview response echoing the uid, and nothing panics or hangs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use serde_json::{Value, json};
use webhook::references::NoReferences;
use webhook::review::{Kind, review_offline};

/// Any JSON value, a few levels deep, with the strings the validators care about mixed in.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        prop::sample::select(vec![
            "",
            "XS",
            "M",
            "NEW",
            "In",
            "NotIn",
            "Gt",
            "Exists",
            "720h",
            "Never",
            "0s",
            "10%",
            "@daily",
            "0 9 * * 1-5",
            "karpenter.sh/capacity-type",
            "node.kubernetes.io/instance-type",
            "kubernetes.io/hostname",
            "-100%",
            "+0.02",
            "0.05",
            "kubernetes.io/x",
            "a/b/c",
            "é",
            "\u{0}",
        ])
        .prop_map(|s| json!(s)),
        "[ -~]{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "metadata",
                    "name",
                    "namespace",
                    "spec",
                    "labels",
                    "flavors",
                    "cpu",
                    "memoryKi",
                    "priceHourly",
                    "flavorCatalogRef",
                    "template",
                    "requirements",
                    "key",
                    "operator",
                    "values",
                    "minValues",
                    "clusterName",
                    "nodeClassRef",
                    "disruption",
                    "budgets",
                    "limits",
                    "taints",
                    "x",
                ])
                .prop_map(String::from),
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop::sample::select(Kind::ALL.to_vec())
}

/// A valid object of each kind, to mutate.
fn valid(kind: Kind) -> Value {
    match kind {
        Kind::CleverNodeClass => node_class("default", json!({"team": "a"}), Some("extra")),
        Kind::FlavorCatalog => flavor_catalog("extra", json!([{"name": "M", "priceHourly": 0.1}])),
        Kind::NodePool => node_pool(
            "default",
            json!([{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]),
        ),
        Kind::CleverOrganization => organization(
            "orga-acme",
            json!({
                "clusterSelector": {"matchLabels": {"clever-cloud.com/organisation": "orga-acme"}},
                "quota": {"cpu": "40", "memory": "40G"},
                "limits": {"karpenter.clever-cloud.com/price-per-hour": "2.5"}
            }),
        ),
        Kind::CapacityBuffer => capacity_buffer(
            "web-burst",
            json!({
                "clusterSelector": {"matchLabels": {"env": "prod"}},
                "podTemplateRef": {"name": "web-burst"},
                "replicas": 3,
                "limits": {"cpu": "8", "pods": "10"}
            }),
        ),
        Kind::NodeOverlay => node_overlay(
            "cheaper-xs",
            json!({
                "requirements": [{"key": "clever-cloud.com/flavor", "operator": "In", "values": ["XS"]}],
                "priceAdjustment": "-10%",
                "weight": 10
            }),
        ),
    }
}

/// Replaces the value at a path of object keys (creating objects on the way) with `value`.
fn set(target: &mut Value, path: &[String], value: Value) {
    match path.split_first() {
        None => *target = value,
        Some((head, rest)) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Some(map) = target.as_object_mut() {
                set(map.entry(head.clone()).or_insert(Value::Null), rest, value);
            }
        }
    }
}

fn check_answer(kind: Kind, body: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(answer) = review_offline(kind, body) {
        prop_assert!(!answer.uid.is_empty());
        prop_assert_eq!(answer.allowed, answer.message.is_none());
        let v: Value = serde_json::from_slice(&answer.to_json()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&v["apiVersion"], "admission.k8s.io/v1");
        prop_assert_eq!(v["response"]["uid"].as_str(), Some(answer.uid.as_str()));
        prop_assert!(v["response"]["allowed"].is_boolean());
    }
    Ok(())
}

/// The objects the properties mutate are allowed as they are (so a mutation is what a denial judges).
#[test]
fn the_valid_objects_are_allowed() {
    for kind in Kind::ALL {
        let body = serde_json::to_vec(&review(kind.name(), "CREATE", valid(kind), None)).unwrap();
        let answer = review_offline(kind, &body).unwrap();
        assert!(answer.allowed, "{kind}: {answer:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(kind in kind(), body in prop::collection::vec(any::<u8>(), 0..512)) {
        check_answer(kind, &body)?;
    }

    #[test]
    fn arbitrary_objects_in_a_review(kind in kind(), object in any_json(), old in prop::option::of(any_json()),
                                     operation in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "", "create"])) {
        let body = serde_json::to_vec(&review(kind.name(), operation, object, old)).unwrap();
        check_answer(kind, &body)?;
    }

    #[test]
    fn mutated_valid_objects(kind in kind(),
                             path in prop::collection::vec(prop::sample::select(vec![
                                 "metadata", "name", "spec", "labels", "flavors", "template", "requirements",
                                 "clusterName", "nodeClassRef", "disruption", "budgets", "limits", "flavorCatalogRef", "weight",
                                 "clusterSelector", "namespaceSelector", "matchLabels", "quota", "cpu", "memory",
                                 "karpenter.clever-cloud.com/price-per-hour", "replicas", "podTemplateRef",
                                 "provisioningStrategy", "pods", "price", "priceAdjustment",
                             ]).prop_map(String::from), 1..5),
                             value in any_json(),
                             update in any::<bool>()) {
        let mut object = valid(kind);
        set(&mut object, &path, value);
        let old = update.then(|| valid(kind));
        let body = serde_json::to_vec(&review(kind.name(), if update { "UPDATE" } else { "CREATE" }, object, old)).unwrap();
        check_answer(kind, &body)?;
    }

    #[test]
    fn mutated_reviews(kind in kind(),
                       path in prop::collection::vec(prop::sample::select(vec![
                           "apiVersion", "kind", "request", "uid", "operation", "object", "oldObject", "namespace", "subResource", "group", "version",
                       ]).prop_map(String::from), 1..4),
                       value in any_json()) {
        let mut body = review(kind.name(), "CREATE", valid(kind), None);
        set(&mut body, &path, value);
        check_answer(kind, &serde_json::to_vec(&body).unwrap())?;
    }
}

/// The same over HTTPS: every answer is a 200 with a review or a 400 (too large included); the server survives.
#[test]
fn arbitrary_bodies_over_https() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let h = runtime.block_on(Harness::start_with("proptest", Arc::new(NoReferences), |s| s.max_body_bytes = 4096));
    let client = h.client(false);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 64, ..ProptestConfig::default() });
    let strategy = (
        kind(),
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..8192),
            any_json().prop_map(|object| serde_json::to_vec(&review("NodePool", "CREATE", object, None)).unwrap()),
        ],
    );
    runner
        .run(&strategy, |(kind, body)| {
            let (status, bytes) = runtime.block_on(async {
                let response = client.post(h.url(kind.path())).body(body.clone()).send().await.unwrap();
                (response.status().as_u16(), response.bytes().await.unwrap())
            });
            match status {
                200 => {
                    let v: Value = serde_json::from_slice(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(v["response"]["allowed"].is_boolean());
                }
                400 => prop_assert!(!bytes.is_empty()),
                other => prop_assert!(false, "status {}", other),
            }
            Ok(())
        })
        .unwrap();
    let livez = runtime.block_on(async { client.get(h.url("/livez")).send().await.unwrap().status() });
    assert_eq!(livez, 200);
    runtime.block_on(h.server.shutdown()).unwrap();
}
