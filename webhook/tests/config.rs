//! The deployment material in `config/webhook/` agrees with the binary: the webhook configuration
//! sends each validated kind to its route with the documented policy, the Deployment's flags parse,
//! and ports, paths and the certificate Secret line up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use webhook::cli::Args;
use webhook::review::Kind;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("config/webhook")
}

fn documents(name: &str) -> Vec<Value> {
    let text = fs::read_to_string(dir().join(name)).unwrap();
    serde_saphyr::from_multiple::<Value>(&text).unwrap().into_iter().filter(|v| !v.is_null()).collect()
}

fn one<T: serde::de::DeserializeOwned>(name: &str, kind: &str) -> T {
    let doc = documents(name).into_iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {name}"));
    serde_json::from_value(doc).unwrap()
}

#[test]
fn every_file_is_listed_in_the_kustomization() {
    let kustomization = &documents("kustomization.yaml")[0];
    let listed: BTreeSet<String> =
        kustomization["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_string()).collect();
    let files: BTreeSet<String> = fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, files);
}

#[test]
fn the_webhook_configuration_routes_each_kind_with_the_documented_policy() {
    let config: ValidatingWebhookConfiguration =
        one("validating-webhook-configuration.yaml", "ValidatingWebhookConfiguration");
    let webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), Kind::ALL.len());
    let deployment: Deployment = one("deployment.yaml", "Deployment");
    let args = Args::try_parse_from(
        std::iter::once("karpenter-hub-webhook".to_string())
            .chain(deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap()),
    )
    .unwrap();
    for kind in Kind::ALL {
        let hook = webhooks
            .iter()
            .find(|w| w.client_config.service.as_ref().and_then(|s| s.path.as_deref()) == Some(kind.path()))
            .unwrap_or_else(|| panic!("no webhook for {}", kind.path()));
        assert_eq!(hook.admission_review_versions, ["v1"]);
        assert_eq!(hook.side_effects, "None");
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        let timeout = hook.timeout_seconds.unwrap();
        assert!(
            (1..=10).contains(&timeout) && u64::try_from(timeout).unwrap() > args.lookup_timeout.as_secs(),
            "{timeout}"
        );
        let rules = hook.rules.as_ref().unwrap();
        assert_eq!(rules.len(), 1);
        let rule = &rules[0];
        assert_eq!(rule.api_groups.as_deref(), Some(&["karpenter.clever-cloud.com".to_string()][..]));
        assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_string(), "UPDATE".to_string()][..]));
        assert_eq!(rule.resources.as_deref(), Some(&[kind.plural().to_string()][..]), "main resource only");
        // The emergency exemption: on the namespace for a namespaced kind; on the object itself for a
        // cluster-scoped one (a namespaceSelector never skips a cluster-scoped object).
        let exempt = |selector: Option<&LabelSelector>| {
            selector.and_then(|s| s.match_expressions.as_ref()).is_some_and(|e| {
                e.iter().any(|e| {
                    e.key == "karpenter.clever-cloud.com/admission-webhook"
                        && e.operator == "NotIn"
                        && e.values.as_deref() == Some(&["disabled".to_string()][..])
                })
            })
        };
        if kind.cluster_scoped() {
            assert_eq!(rule.scope.as_deref(), Some("Cluster"), "{}", kind.plural());
            assert!(hook.namespace_selector.is_none(), "{}: a namespaceSelector would never apply", kind.plural());
            assert!(exempt(hook.object_selector.as_ref()), "{}", kind.plural());
        } else {
            assert_eq!(rule.scope.as_deref(), Some("Namespaced"), "{}", kind.plural());
            assert!(exempt(hook.namespace_selector.as_ref()) && hook.object_selector.is_none(), "{}", kind.plural());
        }
        let service = hook.client_config.service.as_ref().unwrap();
        assert_eq!((service.name.as_str(), service.namespace.as_str()), ("karpenter-hub-webhook", "karpenter-hub"));
        assert!(hook.name.starts_with(kind.plural()), "{}", hook.name);
    }
}

#[test]
fn deployment_service_and_certificate_line_up() {
    let deployment: Deployment = one("deployment.yaml", "Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let args = Args::try_parse_from(
        std::iter::once("karpenter-hub-webhook".to_string()).chain(container.args.clone().unwrap()),
    )
    .unwrap();
    let ports = container.ports.as_ref().unwrap();
    let port = |name: &str| ports.iter().find(|p| p.name.as_deref() == Some(name)).unwrap().container_port;
    assert_eq!(i32::from(args.address.port()), port("https"));
    assert_eq!(args.probe_address.map(|a| i32::from(a.port())), Some(port("probes")));
    // Probes hit the plain-HTTP listener.
    for probe in [container.liveness_probe.as_ref().unwrap(), container.readiness_probe.as_ref().unwrap()] {
        assert_eq!(probe.http_get.as_ref().unwrap().port, IntOrString::String("probes".into()));
    }
    // The webhook keeps its certificate: the files in a writable in-memory volume, the Secret and
    // configuration its RBAC names, the Service's names covered.
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
    assert!(args.tls_cert_file.starts_with(&mount.mount_path) && args.tls_key_file.starts_with(&mount.mount_path));
    assert_ne!(mount.read_only, Some(true));
    let volume = pod.volumes.unwrap().into_iter().find(|v| v.name == mount.name).unwrap();
    assert_eq!(volume.empty_dir.unwrap().medium.as_deref(), Some("Memory"));
    let secret = args.certificate_secret.clone().unwrap();
    assert_eq!(args.certificate_namespace.as_deref(), deployment.metadata.namespace.as_deref());
    let config: ValidatingWebhookConfiguration =
        one("validating-webhook-configuration.yaml", "ValidatingWebhookConfiguration");
    assert_eq!(args.webhook_configuration, config.metadata.name);
    let rbac = documents("rbac.yaml");
    let role = rbac.iter().find(|d| d["kind"] == "Role").unwrap();
    assert_eq!(role["rules"][0]["resourceNames"][0], secret.as_str());
    let cluster_role = rbac.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let vwc_rule = cluster_role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"][0] == "validatingwebhookconfigurations")
        .unwrap();
    assert_eq!(vwc_rule["resourceNames"][0], config.metadata.name.as_deref().unwrap());
    // cert-manager's alternative writes another Secret (a move between the two never meets a
    // Secret of the other), for the same names.
    let certificate =
        serde_saphyr::from_multiple::<Value>(&fs::read_to_string(dir().join("cert-manager/certificate.yaml")).unwrap())
            .unwrap()
            .into_iter()
            .find(|d| d["kind"] == "Certificate")
            .unwrap();
    assert_ne!(certificate["spec"]["secretName"], secret.as_str());
    // The grace period outlasts the webhook's own shutdown grace.
    assert!(pod.termination_grace_period_seconds.unwrap() > i64::try_from(args.shutdown_grace.as_secs()).unwrap());
    // The Service sends 443 to the HTTPS port, under the name the certificate covers.
    let service: Service = one("service.yaml", "Service");
    assert_eq!(service.metadata.name.as_deref(), Some(args.service_name.as_str()));
    let manager = webhook::certificates::Identity {
        namespace: args.certificate_namespace.clone().unwrap(),
        service: args.service_name.clone(),
        cluster_domain: args.cluster_domain.clone(),
    };
    assert!(manager.dns_names().contains(&"karpenter-hub-webhook.karpenter-hub.svc".to_string()));
    let https = service.spec.unwrap().ports.unwrap().into_iter().find(|p| p.port == 443).unwrap();
    assert_eq!(https.target_port, Some(IntOrString::String("https".into())));
    let names: Vec<&str> =
        certificate["spec"]["dnsNames"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.contains(&"karpenter-hub-webhook.karpenter-hub.svc"), "{names:?}");
}
