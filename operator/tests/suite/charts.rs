//! The Helm charts (charts/karpenter-hub-crds, charts/karpenter-hub) and the Dockerfile, checked
//! with a real `helm` (named by KARPENTER_HUB_HELM; `.ci/run` installs it) and a real API server
//! (envtest): lint and render on the default values and every file under charts/karpenter-hub/ci/,
//! what each value changes in the output, values the schema refuses and with which message, the
//! CRD chart against `karpenter-hub crds`, and the rendered objects accepted by a kube-apiserver.
//!
//! Without KARPENTER_HUB_HELM a helm test says it skipped; with KARPENTER_HUB_REQUIRE_ENVTEST=1
//! (CI) it fails instead, as the envtest tier does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams, ValidationDirective},
    discovery::{Discovery, Scope},
};
use serde_json::{Value, json};

const HELM_ENV: &str = "KARPENTER_HUB_HELM";
const RELEASE: &str = "karpenter-hub";
const NAMESPACE: &str = "karpenter-hub";
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn chart() -> PathBuf {
    repo().join("charts/karpenter-hub")
}

fn crds_chart() -> PathBuf {
    repo().join("charts/karpenter-hub-crds")
}

/// The helm binary, or None after saying why this test skipped (a failure where the environment
/// demands the real tiers, as envtest's skip does).
pub(crate) fn helm() -> Option<PathBuf> {
    let test = envtest::current_test();
    match std::env::var_os(HELM_ENV).filter(|v| !v.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "{test}: {HELM_ENV}={} is not a file", path.display());
            Some(path)
        }
        None => {
            let why = format!(
                "{HELM_ENV} is not set: point it at a helm v4 binary (`.ci/run` installs one into target/helm-bin, see docs/install.md)"
            );
            assert!(!envtest::required(), "{test}: no helm: {why}");
            // Straight to the process's stderr, past libtest's capture, so the skip is seen.
            let _ = writeln!(std::io::stderr().lock(), "test {test} ... skipped without helm: {why}");
            None
        }
    }
}

macro_rules! helm_or_skip {
    () => {
        match helm() {
            Some(h) => h,
            None => return,
        }
    };
}

/// `helm <args>`: (success, stdout, stderr).
fn run_helm(helm: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm)
        .args(args)
        // No kubeconfig of the person running the tests is read or contacted.
        .env("KUBECONFIG", "/nonexistent/karpenter-hub-charts-test")
        .env("HELM_CACHE_HOME", repo().join("target/helm-home/cache"))
        .env("HELM_CONFIG_HOME", repo().join("target/helm-home/config"))
        .env("HELM_DATA_HOME", repo().join("target/helm-home/data"))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value files under charts/karpenter-hub/ci/, sorted.
fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "charts/karpenter-hub/ci/ should hold the value sets CI renders: {files:?}");
    files
}

fn ci_file(name: &str) -> PathBuf {
    chart().join("ci").join(name)
}

/// The objects `helm template` renders.
pub(crate) struct Rendered {
    docs: Vec<Value>,
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    pub(crate) fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name).unwrap_or_else(|| {
            let present: Vec<String> =
                self.docs.iter().map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"])).collect();
            panic!("no {kind} {name} rendered; rendered: {present:?}")
        })
    }
}

fn parse(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("helm printed invalid YAML: {e}\n{yaml}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// `helm template` of the karpenter-hub chart as release karpenter-hub in namespace karpenter-hub.
fn template(helm: &Path, values: Option<&Path>, sets: &[&str]) -> Result<Rendered, String> {
    template_in(helm, NAMESPACE, values, sets)
}

/// `helm template` of the karpenter-hub chart as release karpenter-hub in `namespace`.
pub(crate) fn template_in(
    helm: &Path,
    namespace: &str,
    values: Option<&Path>,
    sets: &[&str],
) -> Result<Rendered, String> {
    let chart = chart();
    let mut args = vec!["template", RELEASE, chart.to_str().unwrap(), "--namespace", namespace];
    if let Some(v) = values {
        args.extend(["--values", v.to_str().unwrap()]);
    }
    for s in sets {
        args.extend(["--set", s]);
    }
    let (ok, stdout, stderr) = run_helm(helm, &args);
    if ok { Ok(Rendered { docs: parse(&stdout) }) } else { Err(stderr) }
}

fn render(helm: &Path, values: Option<&Path>) -> Rendered {
    template(helm, values, &[]).unwrap_or_else(|e| panic!("helm template with {values:?} failed: {e}"))
}

/// The names of the subjects of every (Cluster)RoleBinding of a rendering.
fn binding_subjects(r: &Rendered) -> BTreeSet<&str> {
    r.all("ClusterRoleBinding")
        .into_iter()
        .chain(r.all("RoleBinding"))
        .flat_map(|b| b["subjects"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()))
        .collect()
}

fn pod_spec(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]
}

fn container(deployment: &Value) -> &Value {
    &pod_spec(deployment)["containers"][0]
}

pub(crate) fn args(deployment: &Value) -> Vec<String> {
    container(deployment)["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

pub(crate) fn env(deployment: &Value, name: &str) -> Option<String> {
    container(deployment)["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str().map(String::from)
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector.as_object().unwrap().iter().all(|(k, v)| &labels[k] == v)
}

/// Documents of a file of the repository (config/...), by kind and name.
fn config_doc(path: &str, kind: &str, name: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    parse(&text)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{path} has no {kind} {name}"))
}

/// What every rendering must hold, whatever the values: hardened pods, references that resolve
/// within the release, a namespace on every namespaced object.
fn check_invariants(what: &str, r: &Rendered) {
    let cluster_scoped = ["ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"];
    for d in &r.docs {
        let ns = &d["metadata"]["namespace"];
        let kind = d["kind"].as_str().unwrap();
        assert_eq!(
            ns.is_string(),
            !cluster_scoped.contains(&kind),
            "{what}: {kind} {} namespace {ns}",
            d["metadata"]["name"]
        );
        assert_eq!(d["metadata"]["labels"]["app.kubernetes.io/instance"], RELEASE, "{what}: {kind} is not labelled");
    }
    let service_accounts: BTreeSet<&str> =
        r.all("ServiceAccount").iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    // The identities the pods run as: each one the chart creates, or an existing one
    // (serviceAccount.create=false) the release's bindings give the rights to.
    let bound = binding_subjects(r);
    let run_as: BTreeSet<&str> =
        r.all("Deployment").iter().map(|d| pod_spec(d)["serviceAccountName"].as_str().unwrap()).collect();
    for d in r.all("Deployment") {
        let name = &d["metadata"]["name"];
        let pod = pod_spec(d);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}: {name} may run as root");
        let sa = pod["serviceAccountName"].as_str().unwrap();
        assert!(
            service_accounts.contains(sa) || bound.contains(sa),
            "{what}: {name} runs as {sa}, which the chart neither creates nor binds"
        );
        assert!(labels_match(&d["spec"]["selector"]["matchLabels"], &d["spec"]["template"]["metadata"]["labels"]));
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: {name}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {name}");
            assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}: {name}");
            assert!(c["resources"]["requests"]["memory"].is_string(), "{what}: {name} requests no memory");
        }
    }
    // Selectors of Services and PDBs pick the pods of exactly one Deployment.
    for s in r.all("Service").into_iter().chain(r.all("PodDisruptionBudget")) {
        let selector = s["spec"]["selector"].get("matchLabels").unwrap_or(&s["spec"]["selector"]);
        let picked: Vec<_> = r
            .all("Deployment")
            .into_iter()
            .filter(|d| labels_match(selector, &d["spec"]["template"]["metadata"]["labels"]))
            .collect();
        assert_eq!(
            picked.len(),
            1,
            "{what}: {} {} selects {} Deployments",
            s["kind"],
            s["metadata"]["name"],
            picked.len()
        );
    }
    // Bindings name roles and ServiceAccounts of the release.
    for b in r.all("ClusterRoleBinding").into_iter().chain(r.all("RoleBinding")) {
        let role = &b["roleRef"];
        assert!(r.find(role["kind"].as_str().unwrap(), role["name"].as_str().unwrap()).is_some(), "{what}: {role}");
        for s in b["subjects"].as_array().unwrap() {
            assert!(run_as.contains(s["name"].as_str().unwrap()), "{what}: {s} is no pod's ServiceAccount");
            assert_eq!(s["namespace"], NAMESPACE);
        }
    }
    // The webhook configuration calls a Service of the release on 443, which reaches the HTTPS port.
    for vwc in r.all("ValidatingWebhookConfiguration") {
        for w in vwc["webhooks"].as_array().unwrap() {
            let svc = &w["clientConfig"]["service"];
            let service = r.get("Service", svc["name"].as_str().unwrap());
            assert_eq!(svc["namespace"], NAMESPACE);
            let port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["port"] == svc["port"]).unwrap();
            assert_eq!(port["targetPort"], "https", "{what}");
        }
    }
}

#[test]
fn crds_chart_holds_exactly_what_karpenter_hub_crds_prints() {
    let path = crds_chart().join("templates/crds.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == crds::crd::render_all().unwrap(),
        "{} differs from the generator: run `cargo run -p operator -- crds > charts/karpenter-hub-crds/templates/crds.yaml` and commit the result",
        path.display()
    );
    let templates: Vec<_> =
        std::fs::read_dir(crds_chart().join("templates")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(templates, ["crds.yaml"], "only the generated file belongs in the CRD chart's templates");

    let helm = helm_or_skip!();
    let (ok, out, err) = run_helm(&helm, &["lint", "--strict", crds_chart().to_str().unwrap()]);
    assert!(ok, "helm lint karpenter-hub-crds: {out}{err}");
    let (ok, out, err) = run_helm(&helm, &["template", "karpenter-hub-crds", crds_chart().to_str().unwrap()]);
    assert!(ok, "{err}");
    let rendered: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&out).unwrap();
    let generated: Vec<_> = crds::crd::hub_crds().into_iter().map(|f| f.crd).collect();
    assert_eq!(rendered, generated, "helm renders the CRDs as generated");
    // The chart has no settings, and says so rather than ignoring one.
    let (ok, _, err) = run_helm(&helm, &["template", "x", crds_chart().to_str().unwrap(), "--set", "install=false"]);
    assert!(!ok && err.contains("install"), "{err}");
}

#[test]
fn chart_lints_and_renders_on_the_default_values_and_every_ci_values_file() {
    let helm = helm_or_skip!();
    let chart = chart();
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    sets.extend(ci_values().into_iter().map(Some));
    for values in &sets {
        let mut lint = vec!["lint", "--strict", chart.to_str().unwrap(), "--namespace", NAMESPACE];
        if let Some(v) = values {
            lint.extend(["--values", v.to_str().unwrap()]);
        }
        let (ok, out, err) = run_helm(&helm, &lint);
        assert!(ok, "helm lint with {values:?}: {out}{err}");
        let r = render(&helm, values.as_deref());
        check_invariants(&format!("{values:?}"), &r);
    }
}

#[test]
fn default_values_deploy_what_config_describes_with_leader_election_and_the_release_image() {
    let helm = helm_or_skip!();
    let r = render(&helm, None);
    let hub = r.get("Deployment", "karpenter-hub");
    assert_eq!(hub["spec"]["replicas"], 2);
    let a = args(hub);
    for expected in [
        "run",
        "--leader-elect=true",
        "--leader-election-namespace=karpenter-hub",
        "--metrics-bind-address=0.0.0.0:8080",
        "--health-probe-bind-address=0.0.0.0:8081",
        "--log-format=json",
        "--probe-interval-seconds=10",
        "--flavor-cooldown-seconds=180",
    ] {
        assert!(a.contains(&expected.to_string()), "hub args {a:?} lack {expected}");
    }
    assert!(
        !a.iter().any(|x| x.starts_with("--namespace")
            || x.starts_with("--hub-id")
            || x.starts_with("--allow-insecure")
            || x.starts_with("--registration-namespaces")
            || x.starts_with("--allow-link")),
        "{a:?}"
    );
    // The kubelet probes a listener of their own; /metrics is on the other port.
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container(hub)[probe]["httpGet"], json!({"path": path, "port": "http-probes"}));
    }
    assert_eq!(container(hub)["ports"][1], json!({"name": "http-probes", "containerPort": 8081, "protocol": "TCP"}));
    assert_eq!(
        env(hub, "RUST_LOG").as_deref(),
        Some("info,kube=warn,kube_client::client=error,kube_runtime::watcher=error,tower=warn,hyper=warn")
    );
    let image = format!("ghcr.io/clever-karpenter-hub/karpenter-hub:v{VERSION}");
    assert_eq!(container(hub)["image"], image.as_str());
    assert_eq!(container(hub)["command"], json!(["/usr/local/bin/karpenter-hub"]));
    let webhook = r.get("Deployment", "karpenter-hub-webhook");
    assert_eq!(container(webhook)["image"], image.as_str(), "one image holds both binaries");
    assert_eq!(container(webhook)["command"], json!(["/usr/local/bin/karpenter-hub-webhook"]));
    // The webhook runs with the flags of config/webhook/deployment.yaml (the defaults).
    let wa = args(webhook);
    let configured = config_doc("config/webhook/deployment.yaml", "Deployment", "karpenter-hub-webhook");
    assert_eq!(container(&configured)["command"], container(webhook)["command"], "config/webhook runs the same image");
    for arg in args(&configured) {
        assert!(wa.contains(&arg), "webhook args {wa:?} lack {arg} of config/webhook/deployment.yaml");
    }
    // The self-managed certificate by default: the in-memory volume it writes the pair to.
    assert_eq!(pod_spec(webhook)["volumes"][0], pod_spec(&configured)["volumes"][0]);
    assert_eq!(pod_spec(webhook)["volumes"][0]["emptyDir"]["medium"], "Memory");

    // RBAC: the same rules as config/hub/rbac.yaml and config/webhook/rbac.yaml.
    for (file, kind, name) in [
        ("config/hub/rbac.yaml", "ClusterRole", "karpenter-hub"),
        ("config/hub/rbac.yaml", "ClusterRole", "karpenter-hub-registrations"),
        ("config/hub/rbac.yaml", "Role", "karpenter-hub-leader-election"),
        ("config/webhook/rbac.yaml", "ClusterRole", "karpenter-hub-webhook"),
        ("config/webhook/rbac.yaml", "Role", "karpenter-hub-webhook-certificate"),
    ] {
        assert_eq!(
            r.get(kind, name)["rules"],
            config_doc(file, kind, name)["rules"],
            "{kind} {name} differs from {file}"
        );
    }
    assert_eq!(r.get("Role", "karpenter-hub-leader-election")["metadata"]["namespace"], NAMESPACE);
    // No --hub-id: the hub lists the Leases there once at start, to keep `default` where it ran.
    let lease_verbs = &r.get("Role", "karpenter-hub-leader-election")["rules"][0]["verbs"];
    assert!(lease_verbs.as_array().unwrap().contains(&json!("list")), "{lease_verbs}");
    // The documented default: registrations in every namespace, so Secrets readable and capacity
    // ConfigMaps writable cluster-wide, and only through the registrations role.
    assert!(
        r.find("ClusterRoleBinding", "karpenter-hub-registrations").is_some(),
        "all namespaces: Secrets read cluster-wide"
    );
    assert!(r.all("RoleBinding").iter().all(|b| b["metadata"]["name"] != "karpenter-hub-registrations"));
    let core_resources = |role: &Value| -> Vec<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| rule["apiGroups"] == json!([""]))
            .flat_map(|rule| rule["resources"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()))
            .collect()
    };
    // Beside the registrations role, two core resources: the PodTemplates CapacityBuffers name
    // (watched), and namespaces, read one by one (kube-system for the management cluster's
    // identity, a registration's namespace for an organisation's namespace selector).
    assert_eq!(
        core_resources(r.get("ClusterRole", "karpenter-hub")),
        ["podtemplates", "namespaces"],
        "core resources beside the registrations role"
    );
    let namespaces = r.get("ClusterRole", "karpenter-hub")["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["resources"] == json!(["namespaces"]))
        .cloned()
        .unwrap();
    assert_eq!((&namespaces["resourceNames"], &namespaces["verbs"]), (&Value::Null, &json!(["get"])));
    assert_eq!(core_resources(r.get("ClusterRole", "karpenter-hub-registrations")), ["secrets", "configmaps"]);

    // The webhook configuration is config/webhook's, rules, selectors and conditions included.
    let vwc = r.get("ValidatingWebhookConfiguration", "karpenter-hub-webhook");
    let configured = config_doc(
        "config/webhook/validating-webhook-configuration.yaml",
        "ValidatingWebhookConfiguration",
        "karpenter-hub-webhook",
    );
    assert_eq!(vwc["webhooks"], configured["webhooks"]);
    assert_eq!(vwc["metadata"]["annotations"], configured["metadata"]["annotations"]);
    // The webhook's own certificate by default: no cert-manager object, no caBundle rendered (the
    // webhook sets it), the Secret it keeps named in its Role and its flags.
    assert!(r.all("Issuer").is_empty() && r.all("Certificate").is_empty(), "nothing needs cert-manager");
    assert!(vwc["webhooks"].as_array().unwrap().iter().all(|w| w["clientConfig"].get("caBundle").is_none()));
    assert!(wa.contains(&"--certificate-secret=karpenter-hub-webhook-cert".to_string()), "{wa:?}");
    assert!(wa.contains(&"--webhook-configuration=karpenter-hub-webhook".to_string()), "{wa:?}");
    assert_eq!(r.get("Role", "karpenter-hub-webhook-certificate")["metadata"]["namespace"], NAMESPACE);
    assert_eq!(r.get("PodDisruptionBudget", "karpenter-hub-webhook")["spec"]["maxUnavailable"], 1);
    assert!(r.all("ServiceMonitor").is_empty(), "no ServiceMonitor unless asked");
    assert!(r.all("PrometheusRule").is_empty() && r.all("ConfigMap").is_empty(), "no alerts or dashboard unless asked");
    // Upstream Karpenter's priority; the hub's rollout one replica at a time without a surge, the
    // webhook's the API server's default.
    for d in [hub, webhook] {
        assert_eq!(pod_spec(d)["priorityClassName"], "system-cluster-critical");
        assert!(container(d).get("envFrom").is_none(), "{}", container(d));
    }
    assert_eq!(
        hub["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert!(webhook["spec"].get("strategy").is_none(), "{}", webhook["spec"]);
    assert!(pod_spec(hub).get("volumes").is_none() && container(hub).get("volumeMounts").is_none());
    let env_names: Vec<&str> =
        container(hub)["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(env_names, ["POD_NAMESPACE", "POD_NAME", "RUST_LOG"]);
    // No budget for the hub: only its leader is Ready, so one would block the leader's node drain.
    assert!(r.find("PodDisruptionBudget", "karpenter-hub").is_none());
    let metrics = r.get("Service", "karpenter-hub-metrics");
    assert_eq!(metrics["spec"]["ports"][0]["port"], 8080);
    assert_eq!(metrics["spec"]["publishNotReadyAddresses"], true, "standbys are scraped too");
    assert!(labels_match(&metrics["spec"]["selector"], &hub["spec"]["template"]["metadata"]["labels"]));
    assert!(!labels_match(&metrics["spec"]["selector"], &webhook["spec"]["template"]["metadata"]["labels"]));
    assert_eq!(pod_spec(hub)["topologySpreadConstraints"][0]["topologyKey"], "kubernetes.io/hostname");
}

#[test]
fn listed_registration_namespaces_get_a_role_binding_each_and_the_hub_watches_those_only() {
    let helm = helm_or_skip!();
    let r = template(&helm, None, &["hub.registrationNamespaces={team-a,team-b}", "hub.metrics.bindAddress=::1"])
        .unwrap_or_else(|e| panic!("{e}"));
    check_invariants("registrationNamespaces", &r);
    let a = args(r.get("Deployment", "karpenter-hub"));
    assert!(a.contains(&"--registration-namespaces=team-a,team-b".to_string()), "{a:?}");
    assert!(a.contains(&"--metrics-bind-address=[::1]:8080".to_string()), "an IPv6 address in brackets: {a:?}");
    assert!(r.find("ClusterRoleBinding", "karpenter-hub-registrations").is_none(), "no cluster-wide grant");
    let namespaces: Vec<&str> = r
        .all("RoleBinding")
        .into_iter()
        .filter(|b| b["metadata"]["name"] == "karpenter-hub-registrations")
        .map(|b| b["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, ["team-a", "team-b"]);
}

#[test]
fn each_ci_values_file_changes_what_it_sets() {
    let helm = helm_or_skip!();
    let default = render(&helm, None);
    let default_hub_args = args(default.get("Deployment", "karpenter-hub"));
    let default_webhook_args = args(default.get("Deployment", "karpenter-hub-webhook"));
    let mut checked = BTreeSet::new();
    let mut file = |name: &str| {
        checked.insert(name.to_string());
        render(&helm, Some(&ci_file(name)))
    };

    // cert-manager with the chart's self-signed Issuer: config/webhook/cert-manager's objects, the
    // Secret mounted read-only, the CA injected, no self-managed flag or Role.
    let r = file("cert-manager-values.yaml");
    for kind in ["Issuer", "Certificate"] {
        let configured = config_doc("config/webhook/cert-manager/certificate.yaml", kind, "karpenter-hub-webhook");
        assert_eq!(r.get(kind, "karpenter-hub-webhook")["spec"], configured["spec"], "{kind}");
    }
    let webhook = r.get("Deployment", "karpenter-hub-webhook");
    assert_eq!(pod_spec(webhook)["volumes"][0]["secret"]["secretName"], "karpenter-hub-webhook-tls");
    assert_eq!(container(webhook)["volumeMounts"][0]["readOnly"], true);
    assert!(!args(webhook).iter().any(|a| a.starts_with("--certificate-")), "{:?}", args(webhook));
    assert!(r.find("Role", "karpenter-hub-webhook-certificate").is_none());
    let vwc = r.get("ValidatingWebhookConfiguration", "karpenter-hub-webhook");
    assert_eq!(vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "karpenter-hub/karpenter-hub-webhook");

    // A ClusterIssuer of the user's instead of the self-signed Issuer.
    let r = file("cert-manager-issuer-values.yaml");
    assert!(r.all("Issuer").is_empty());
    let cert = &r.get("Certificate", "karpenter-hub-webhook")["spec"];
    assert_eq!(cert["issuerRef"], json!({"kind": "ClusterIssuer", "name": "corporate-ca"}));
    assert_eq!(cert["duration"], "720h");
    assert_eq!(cert["renewBefore"], "240h");
    assert!(
        cert["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("karpenter-hub-webhook.karpenter-hub.svc.cluster.example"))
    );
    let vwc = r.get("ValidatingWebhookConfiguration", "karpenter-hub-webhook");
    assert_eq!(vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "karpenter-hub/karpenter-hub-webhook");
    assert!(vwc["webhooks"].as_array().unwrap().iter().all(|w| w["clientConfig"].get("caBundle").is_none()));

    // A Secret of the user's: no cert-manager object, the CA given in every webhook.
    let r = file("user-secret-values.yaml");
    assert!(r.all("Issuer").is_empty() && r.all("Certificate").is_empty());
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(ci_file("user-secret-values.yaml")).unwrap()).unwrap();
    let ca = &values["webhook"]["certificate"]["secret"]["caBundle"];
    let vwc = r.get("ValidatingWebhookConfiguration", "karpenter-hub-webhook");
    assert!(vwc["metadata"].get("annotations").is_none(), "no cert-manager injection: {}", vwc["metadata"]);
    let webhooks = vwc["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 6);
    for w in webhooks {
        assert_eq!(&w["clientConfig"]["caBundle"], ca);
        assert_eq!(w["failurePolicy"], "Ignore");
        assert_eq!(w["timeoutSeconds"], 10);
    }
    let webhook = r.get("Deployment", "karpenter-hub-webhook");
    assert_eq!(pod_spec(webhook)["volumes"][0]["secret"]["secretName"], "my-webhook-tls");

    // ServiceMonitors: one per component, each selecting its metrics Service's named port.
    let r = file("servicemonitor-values.yaml");
    let monitors = r.all("ServiceMonitor");
    assert_eq!(monitors.len(), 2);
    for m in monitors {
        assert_eq!(m["metadata"]["labels"]["release"], "kube-prometheus-stack");
        let endpoint = &m["spec"]["endpoints"][0];
        assert_eq!((&endpoint["interval"], &endpoint["scrapeTimeout"]), (&json!("15s"), &json!("5s")));
        let services: Vec<_> = r
            .all("Service")
            .into_iter()
            .filter(|s| labels_match(&m["spec"]["selector"]["matchLabels"], &s["metadata"]["labels"]))
            .collect();
        assert_eq!(services.len(), 1, "{} selects {} Services", m["metadata"]["name"], services.len());
        assert!(services[0]["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == endpoint["port"]));
    }

    // Replicas.
    let r = file("replicas-values.yaml");
    assert_eq!(r.get("Deployment", "karpenter-hub")["spec"]["replicas"], 3);
    assert_eq!(r.get("Deployment", "karpenter-hub-webhook")["spec"]["replicas"], 3);
    assert_eq!(r.get("PodDisruptionBudget", "karpenter-hub-webhook")["spec"]["maxUnavailable"], "33%");

    // Every flag: each changed argument is in the output, and was not there with the defaults.
    let r = file("custom-flags-values.yaml");
    let hub = r.get("Deployment", "hub");
    let hub_args = args(hub);
    for expected in [
        "--hub-id=eu-west",
        "--namespace=fleet",
        "--allow-insecure-kubeconfig",
        "--allow-link-local-servers",
        "--probe-interval-seconds=30",
        "--flavor-cooldown-seconds=600",
        "--leader-election-namespace=hub-leases",
        "--leader-elect-lease-duration=20",
        "--leader-elect-renew-deadline=12",
        "--leader-elect-retry-period=3",
        "--gc-min-age-seconds=300",
        "--gc-period-seconds=60",
        "--gc-max-deletions-per-sweep=5",
        "--gc-halt-percent=30",
        "--disruption-validation-seconds=30",
        "--min-values-policy=best-effort",
        "--metrics-bind-address=127.0.0.1:9090",
        "--health-probe-bind-address=0.0.0.0:9091",
        "--log-format=text",
    ] {
        assert!(hub_args.contains(&expected.to_string()), "hub args {hub_args:?} lack {expected}");
        assert!(!default_hub_args.contains(&expected.to_string()), "{expected} is already a default");
    }
    assert_eq!(env(hub, "RUST_LOG").as_deref(), Some("info,operator=debug"));
    assert_eq!(container(hub)["image"], "registry.example/platform/karpenter-hub:v0.1.0-rc.1");
    assert_eq!(container(hub)["imagePullPolicy"], "Always");
    assert_eq!(pod_spec(hub)["imagePullSecrets"], json!([{"name": "registry-credentials"}]));
    assert_eq!(container(hub)["ports"][0]["containerPort"], 9090);
    assert_eq!(r.get("Service", "hub-metrics")["spec"]["ports"][0]["port"], 9090);
    assert_eq!(pod_spec(hub)["serviceAccountName"], "hub-operator");
    assert_eq!(r.get("ServiceAccount", "hub-operator")["metadata"]["annotations"]["example.com/role"], "hub");
    assert_eq!(hub["spec"]["template"]["metadata"]["annotations"]["example.com/scrape"], "true");
    assert_eq!(hub["spec"]["template"]["metadata"]["labels"]["tier"], "control");
    assert_eq!(pod_spec(hub)["terminationGracePeriodSeconds"], 45);
    assert_eq!(container(hub)["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(container(hub)["ports"][1]["containerPort"], 9091);
    // With a watched namespace, kubeconfig Secrets are readable (and capacity ConfigMaps
    // writable) there only; the Lease's Role follows the Lease.
    assert!(r.find("ClusterRoleBinding", "hub-registrations").is_none());
    let bindings: Vec<&Value> =
        r.all("RoleBinding").into_iter().filter(|b| b["metadata"]["name"] == "hub-registrations").collect();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0]["metadata"]["namespace"], "fleet");
    assert_eq!(r.get("Role", "hub-leader-election")["metadata"]["namespace"], "hub-leases");
    let webhook = r.get("Deployment", "hub-webhook");
    let webhook_args = args(webhook);
    for expected in [
        "--address=0.0.0.0:10443",
        "--probe-address=0.0.0.0:10081",
        "--cert-poll-interval=30s",
        "--lookups=off",
        "--lookup-timeout=1s",
        "--request-timeout=5s",
        "--shutdown-grace=15s",
        "--max-body-bytes=1048576",
        "--log-format=text",
        "--log=webhook=debug",
    ] {
        assert!(webhook_args.contains(&expected.to_string()), "webhook args {webhook_args:?} lack {expected}");
        assert!(!default_webhook_args.contains(&expected.to_string()), "{expected} is already a default");
    }
    assert_eq!(pod_spec(webhook)["terminationGracePeriodSeconds"], 25);
    let service = r.get("Service", "hub-webhook");
    assert_eq!(service["spec"]["ports"][1]["port"], 10081);
    let vwc = r.get("ValidatingWebhookConfiguration", "hub-webhook");
    assert_eq!(vwc["webhooks"][0]["clientConfig"]["service"]["name"], "hub-webhook");
    assert!(r.docs.iter().all(|d| d["metadata"]["labels"]["team"] == "platform"), "additionalLabels on every object");

    // Scheduling: node selectors, tolerations, affinity, priority, spread.
    let r = file("scheduling-values.yaml");
    let hub = pod_spec(r.get("Deployment", "karpenter-hub"));
    assert_eq!(hub["nodeSelector"], json!({"node-role.example/system": "true"}));
    assert_eq!(hub["tolerations"][0]["key"], "dedicated");
    assert_eq!(
        hub["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
            [0]["key"],
        "kubernetes.io/arch"
    );
    assert_eq!(hub["priorityClassName"], "platform-critical");
    assert!(hub.get("topologySpreadConstraints").is_none(), "spreadAcrossNodes: false");
    let webhook = pod_spec(r.get("Deployment", "karpenter-hub-webhook"));
    assert_eq!(webhook["tolerations"][0]["operator"], "Exists");
    let keys: Vec<_> =
        webhook["topologySpreadConstraints"].as_array().unwrap().iter().map(|t| &t["topologyKey"]).collect();
    assert_eq!(keys, [&json!("kubernetes.io/hostname"), &json!("topology.kubernetes.io/zone")]);
    assert_eq!(webhook["priorityClassName"], "platform-critical");
    for d in default.all("Deployment") {
        for key in ["nodeSelector", "tolerations", "affinity"] {
            assert!(pod_spec(d).get(key).is_none(), "default values set {key}");
        }
        assert_eq!(pod_spec(d)["priorityClassName"], "system-cluster-critical");
    }

    // What a platform team adds to the pods: environment, volumes, arguments after the chart's,
    // existing ServiceAccounts (none created, the roles bound to them), strategies, no priority.
    let r = file("extras-values.yaml");
    let hub = r.get("Deployment", "karpenter-hub");
    let env_names: Vec<&str> =
        container(hub)["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(env_names, ["POD_NAMESPACE", "POD_NAME", "RUST_LOG", "RUST_BACKTRACE", "NODE_NAME"]);
    assert_eq!(env(hub, "RUST_BACKTRACE").as_deref(), Some("1"));
    assert_eq!(container(hub)["env"][4]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(container(hub)["envFrom"], json!([{"configMapRef": {"name": "karpenter-hub-env", "optional": true}}]));
    assert_eq!(
        pod_spec(hub)["volumes"],
        json!([{"name": "management-kubeconfig", "secret": {"secretName": "management-kubeconfig"}}])
    );
    assert_eq!(
        container(hub)["volumeMounts"],
        json!([{"name": "management-kubeconfig", "mountPath": "/etc/karpenter-hub/management", "readOnly": true}])
    );
    let hub_args = args(hub);
    assert_eq!(hub_args.last().map(String::as_str), Some("--kubeconfig=/etc/karpenter-hub/management/kubeconfig"));
    assert_eq!(&hub_args[..hub_args.len() - 1], &default_hub_args[..], "the chart's arguments, then the extra one");
    assert_eq!(hub["spec"]["strategy"], json!({"type": "Recreate"}), "no rollingUpdate with Recreate");
    let webhook = r.get("Deployment", "karpenter-hub-webhook");
    assert_eq!(container(webhook)["env"], json!([{"name": "RUST_BACKTRACE", "value": "1"}]));
    assert_eq!(container(webhook)["envFrom"][0]["prefix"], "WEBHOOK_");
    assert_eq!(container(webhook)["envFrom"][0]["secretRef"]["name"], "karpenter-hub-webhook-env");
    // The chart's certificate volume and mount stay first; the extra ones follow.
    let volumes = pod_spec(webhook)["volumes"].as_array().unwrap();
    assert_eq!(volumes[0], pod_spec(default.get("Deployment", "karpenter-hub-webhook"))["volumes"][0]);
    assert_eq!(volumes[1..], [json!({"name": "scratch", "emptyDir": {"sizeLimit": "16Mi"}})]);
    let mounts = container(webhook)["volumeMounts"].as_array().unwrap();
    assert_eq!(mounts[0]["name"], "tls");
    assert_eq!(mounts[1..], [json!({"name": "scratch", "mountPath": "/tmp"})]);
    assert_eq!(args(webhook), default_webhook_args, "no extra webhook argument");
    assert_eq!(
        webhook["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    );
    for (d, sa) in [(hub, "platform-hub"), (webhook, "platform-webhook")] {
        assert!(pod_spec(d).get("priorityClassName").is_none(), "priorityClassName \"\" is none");
        assert_eq!(pod_spec(d)["serviceAccountName"], sa);
    }
    assert!(r.all("ServiceAccount").is_empty(), "serviceAccount.create=false creates none");
    let subjects = binding_subjects(&r);
    assert_eq!(subjects, BTreeSet::from(["platform-hub", "platform-webhook"]), "the roles go to the existing ones");

    // Prometheus: relabelings and endpoint fields on both ServiceMonitors, the documented alerts
    // and one more, the dashboard in Grafana's namespace with the sidecar's label.
    let r = file("prometheus-values.yaml");
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(ci_file("prometheus-values.yaml")).unwrap()).unwrap();
    let monitors = r.all("ServiceMonitor");
    assert_eq!(monitors.len(), 2);
    for m in monitors {
        let endpoint = &m["spec"]["endpoints"][0];
        assert_eq!(endpoint["relabelings"], values["serviceMonitor"]["relabelings"]);
        assert_eq!(endpoint["metricRelabelings"], values["serviceMonitor"]["metricRelabelings"]);
        assert_eq!((&endpoint["honorTimestamps"], &endpoint["scheme"]), (&json!(true), &json!("http")));
        assert_eq!(endpoint["port"], "http-metrics", "endpointConfig adds to the chart's fields");
    }
    let rule = r.get("PrometheusRule", "karpenter-hub");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), documented_alerts().len() + 1);
    assert_eq!(rules.last().unwrap(), &values["prometheusRule"]["additionalRules"][0]);
    let dashboard = r.get("ConfigMap", "karpenter-hub-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1", "the default sidecar label");
    assert_eq!(dashboard["metadata"]["annotations"], json!({"grafana_folder": "Karpenter"}));
    let json = std::fs::read_to_string(repo().join("docs/dashboards/karpenter-hub.json")).unwrap();
    assert_eq!(dashboard["data"]["karpenter-hub.json"], json.as_str(), "the dashboard, byte for byte");

    // Sharded mode: the flags, and a Role for the shard Leases beside the leader election's.
    let r = file("sharding-values.yaml");
    let hub = r.get("Deployment", "karpenter-hub");
    assert_eq!(hub["spec"]["replicas"], 3);
    let a = args(hub);
    for expected in
        ["--sharding=true", "--shard-lease-duration=15", "--shard-renew-deadline=10", "--shard-retry-period=5"]
    {
        assert!(a.contains(&expected.to_string()), "hub args {a:?} lack {expected}");
        assert!(!default_hub_args.iter().any(|d| d.starts_with("--shard")), "sharding is on by default");
    }
    let role = r.get("Role", "karpenter-hub-sharding");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(role["rules"][0]["verbs"], json!(["get", "list", "watch", "create", "update", "delete"]));
    assert_eq!(
        role["rules"],
        config_doc("config/hub/sharding-rbac.yaml", "Role", "karpenter-hub-sharding")["rules"],
        "the chart's shard Role differs from config/hub/sharding-rbac.yaml"
    );
    assert_eq!(r.get("RoleBinding", "karpenter-hub-sharding")["roleRef"]["name"], "karpenter-hub-sharding");
    assert!(default.find("Role", "karpenter-hub-sharding").is_none(), "no shard Role unless sharding");

    // One replica without leader election, no webhook.
    let r = file("single-replica-values.yaml");
    let hub = r.get("Deployment", "karpenter-hub");
    assert_eq!(hub["spec"]["replicas"], 1);
    let a = args(hub);
    assert!(
        a.contains(&"--leader-elect=false".to_string())
            && !a.iter().any(|x| x.starts_with("--leader-election-namespace"))
    );
    assert!(r.all("Role").is_empty() && r.all("RoleBinding").is_empty(), "no Lease, no Lease Role");
    assert!(r.docs.iter().all(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "hub"), "only hub objects");

    let all: BTreeSet<String> =
        ci_values().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(checked, all, "every ci/ values file has its assertions here");
}

#[test]
fn wrong_values_are_refused_with_a_message_naming_the_value() {
    let helm = helm_or_skip!();
    let ca = {
        let values: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(ci_file("user-secret-values.yaml")).unwrap()).unwrap();
        values["webhook"]["certificate"]["secret"]["caBundle"].as_str().unwrap().to_string()
    };
    let secret = "webhook.certificate.mode=secret";
    // (--set values, what the message must say)
    let cases: &[(&[&str], &[&str])] = &[
        (&["hub.replicas=0"], &["/hub/replicas", "minimum"]),
        (&["hub.hubId=not a label!"], &["/hub/hubId"]),
        // A label value, but never a Lease name (karpenter-hub-Prod_1): the hub could not lead.
        (&["hub.hubId=Prod_1"], &["/hub/hubId"]),
        (&["hub.hubId=team_a.eu-1"], &["/hub/hubId"]),
        (&["logLevel=verbose"], &["/logLevel", "'error', 'warn', 'info', 'debug', 'trace'"]),
        (&["logFormat=yaml"], &["/logFormat", "'json', 'text'"]),
        (&["hub.nodeSelectr.a=b"], &["/hub", "'nodeSelectr' not allowed"]),
        (&["replicas=2"], &["'replicas' not allowed"]),
        (&["hub.probeIntervalSeconds=0"], &["/hub/probeIntervalSeconds"]),
        (&["hub.flavorCooldownSeconds=90000"], &["/hub/flavorCooldownSeconds", "maximum"]),
        (&["hub.metrics.port=70000"], &["/hub/metrics/port"]),
        (&["hub.watchNamespace=Team_A"], &["/hub/watchNamespace"]),
        (&["webhook.failurePolicy=Never"], &["/webhook/failurePolicy", "'Fail', 'Ignore'"]),
        (&["webhook.lookups=false"], &["/webhook/lookups"]),
        (&["webhook.timeoutSeconds=31"], &["/webhook/timeoutSeconds", "maximum"]),
        (&["webhook.certPollInterval=10"], &["/webhook/certPollInterval"]),
        // The webhook reads one number and one unit, not Go's 1m30s.
        (&["webhook.certPollInterval=1m30s"], &["/webhook/certPollInterval"]),
        (&["webhook.lookupTimeout=0s"], &["/webhook/lookupTimeout"]),
        (&["serviceMonitor.interval=1.5s"], &["/serviceMonitor/interval"]),
        (&["image.digest=sha256:abc"], &["/image/digest"]),
        (
            &["webhook.certificate.mode=vault"],
            &["/webhook/certificate/mode", "'self-managed', 'cert-manager', 'secret'"],
        ),
        (&[secret], &["webhook.certificate.secret.name is empty"]),
        (
            &[secret, "webhook.certificate.secret.name=tls"],
            &["webhook.certificate.secret.caBundle is empty", "base64 -w0"],
        ),
        (
            &[secret, "webhook.certificate.secret.name=tls", "webhook.certificate.secret.caBundle=aGVsbG8="],
            &["caBundle is not a base64-encoded PEM certificate"],
        ),
        (&["hub.leaderElection.enabled=false"], &["hub.replicas is 2 but hub.leaderElection.enabled is false"]),
        (
            &["hub.sharding.enabled=true", "hub.replicas=1", "hub.leaderElection.enabled=false"],
            &["hub.sharding.enabled needs hub.leaderElection.enabled"],
        ),
        (
            &["hub.sharding.enabled=true", "hub.sharding.renewDeadlineSeconds=30"],
            &["hub.sharding.renewDeadlineSeconds (30) must be below hub.sharding.leaseDurationSeconds (30)"],
        ),
        (
            &["hub.sharding.enabled=true", "hub.sharding.retryPeriodSeconds=20"],
            &["hub.sharding.retryPeriodSeconds (20) must be below hub.sharding.renewDeadlineSeconds (20)"],
        ),
        (&["hub.sharding.leaseDurationSeconds=0"], &["/hub/sharding/leaseDurationSeconds", "minimum"]),
        (&["hub.registrationNamespaces={Team_A}"], &["/hub/registrationNamespaces/0"]),
        (&["hub.registrationNamespaces=team-a"], &["/hub/registrationNamespaces", "array"]),
        (
            &["hub.watchNamespace=fleet", "hub.registrationNamespaces={team-a}"],
            &["hub.registrationNamespaces is set with hub.watchNamespace (fleet)", "Drop hub.registrationNamespaces"],
        ),
        (&["hub.metrics.bindAddress=10.0.0.1"], &["/hub/metrics/bindAddress"]),
        (
            &["serviceMonitor.enabled=true", "hub.metrics.bindAddress=127.0.0.1"],
            &["hub.metrics.bindAddress is 127.0.0.1", "serviceMonitor.enabled=false"],
        ),
        (&["hub.healthProbe.port=8080"], &["hub.metrics.port and hub.healthProbe.port are both 8080"]),
        // The hub's tuning flags.
        (&["hub.minValuesPolicy=relaxed"], &["/hub/minValuesPolicy", "'strict', 'best-effort'"]),
        (&["hub.garbageCollection.haltPercent=0"], &["/hub/garbageCollection/haltPercent", "minimum"]),
        (
            &["hub.garbageCollection.maxDeletionsPerSweep=5000"],
            &["/hub/garbageCollection/maxDeletionsPerSweep", "maximum"],
        ),
        (&["hub.garbageCollection.minAgeSeconds=90000"], &["/hub/garbageCollection/minAgeSeconds", "maximum"]),
        (&["hub.garbageCollection.periodSeconds=0"], &["/hub/garbageCollection/periodSeconds", "minimum"]),
        (&["hub.disruptionValidationSeconds=0"], &["/hub/disruptionValidationSeconds", "minimum"]),
        (&["hub.leaderElection.renewDeadlineSeconds=0"], &["/hub/leaderElection/renewDeadlineSeconds", "minimum"]),
        (
            &["hub.leaderElection.leaseDurationSeconds=10"],
            &[
                "hub.leaderElection.renewDeadlineSeconds (10) must be below hub.leaderElection.leaseDurationSeconds (10)",
            ],
        ),
        (
            &["hub.leaderElection.retryPeriodSeconds=10"],
            &["hub.leaderElection.retryPeriodSeconds (10) must be below hub.leaderElection.renewDeadlineSeconds (10)"],
        ),
        // ServiceAccounts, priority, strategies.
        (
            &["hub.serviceAccount.create=false"],
            &[
                "hub.serviceAccount.create is false but hub.serviceAccount.name is empty",
                "hub.serviceAccount.create=true",
            ],
        ),
        (
            &["webhook.serviceAccount.create=false"],
            &["webhook.serviceAccount.create is false but webhook.serviceAccount.name is empty"],
        ),
        (&["hub.priorityClassName=System_Critical"], &["/hub/priorityClassName"]),
        (&["webhook.priorityClassName=-critical"], &["/webhook/priorityClassName"]),
        (&["hub.strategy.type=BlueGreen"], &["/hub/strategy/type", "'RollingUpdate', 'Recreate'"]),
        (&["webhook.strategy.rollingUpdate.maxSurge=ten"], &["/webhook/strategy/rollingUpdate/maxSurge"]),
        (&["webhook.strategy.rollingUpdate.maxSurg=1"], &["/webhook/strategy/rollingUpdate", "'maxSurg' not allowed"]),
        (
            &["hub.strategy.rollingUpdate.maxUnavailable=0"],
            &["hub.strategy.rollingUpdate.maxUnavailable and maxSurge are both 0"],
        ),
        // Environment, volumes, arguments.
        (&["hub.extraEnv[0].value=x"], &["/hub/extraEnv/0", "'name'"]),
        (&["webhook.extraEnv[0].name=A", "webhook.extraEnv[0].value=1"], &["/webhook/extraEnv/0/value", "string"]),
        (
            &["hub.extraEnv[0].name=RUST_LOG", "hub.extraEnv[0].value=debug"],
            &["hub.extraEnv sets RUST_LOG", "hub.logFilter"],
        ),
        (
            &["hub.extraEnv[0].name=A", "hub.extraEnv[0].value=x", "hub.extraEnv[1].name=A", "hub.extraEnv[1].value=y"],
            &["hub.extraEnv sets A"],
        ),
        (&["hub.envFrom[0].prefix=X_"], &["/hub/envFrom/0"]),
        (&["webhook.envFrom[0].secretRef.nam=x"], &["/webhook/envFrom/0/secretRef", "'nam' not allowed"]),
        (&["hub.extraVolumes[0].name=data"], &["/hub/extraVolumes/0", "minProperties"]),
        (
            &["hub.extraVolumes[0].name=Data", "hub.extraVolumes[0].emptyDir.medium=Memory"],
            &["/hub/extraVolumes/0/name"],
        ),
        (
            &["webhook.extraVolumes[0].name=tls", "webhook.extraVolumes[0].emptyDir.medium=Memory"],
            &["webhook.extraVolumes declares volume tls, which the pod has already"],
        ),
        (
            &["hub.extraVolumeMounts[0].name=data", "hub.extraVolumeMounts[0].mountPath=/data"],
            &["hub.extraVolumeMounts mounts volume data, which the pod does not have", "hub.extraVolumes"],
        ),
        (
            &["hub.extraVolumeMounts[0].name=data", "hub.extraVolumeMounts[0].mountPath=data"],
            &["/hub/extraVolumeMounts/0/mountPath"],
        ),
        (&["hub.extraArgs={kubeconfig=/k}"], &["/hub/extraArgs/0"]),
        (&["webhook.extraArgs=--lookups=off"], &["/webhook/extraArgs", "array"]),
        (
            &["hub.extraArgs={--probe-interval-seconds=5}"],
            &["hub.extraArgs gives --probe-interval-seconds, which the hub is given already"],
        ),
        (
            &["webhook.extraArgs={--lookups=off}"],
            &["webhook.extraArgs gives --lookups, which the webhook is given already"],
        ),
        // Prometheus and Grafana.
        (&["serviceMonitor.relabelings[0].action=rename"], &["/serviceMonitor/relabelings/0/action"]),
        (
            &["serviceMonitor.metricRelabelings[0].sourceLabels={exported-cluster}"],
            &["/serviceMonitor/metricRelabelings/0/sourceLabels/0"],
        ),
        (
            &["serviceMonitor.metricRelabelings[0].target_label=cluster"],
            &["/serviceMonitor/metricRelabelings/0", "'target_label' not allowed"],
        ),
        (
            &["serviceMonitor.endpointConfig.interval=1m"],
            &["serviceMonitor.endpointConfig sets interval, which the chart sets", "drop it"],
        ),
        (
            &["serviceMonitor.endpointConfig.honorLabels=yes"],
            &["/serviceMonitor/endpointConfig/honorLabels", "boolean"],
        ),
        (&["prometheusRule.additionalRules[0].alert=X"], &["/prometheusRule/additionalRules/0", "'expr'"]),
        (
            &[
                "prometheusRule.additionalRules[0].alert=X",
                "prometheusRule.additionalRules[0].expr=up",
                "prometheusRule.additionalRules[0].for=5 minutes",
            ],
            &["/prometheusRule/additionalRules/0/for"],
        ),
        (&["prometheusRule.labels.release=true"], &["/prometheusRule/labels/release", "string"]),
        (&["dashboard.namespace=Monitoring"], &["/dashboard/namespace"]),
        (&["dashboard.labels.grafana_dashboard=1"], &["/dashboard/labels/grafana_dashboard", "string"]),
    ];
    for (sets, expected) in cases {
        match template(&helm, None, sets) {
            Ok(_) => panic!("--set {sets:?} was accepted"),
            Err(message) => {
                for e in *expected {
                    assert!(message.contains(e), "--set {sets:?}: the message does not say {e:?}:\n{message}");
                }
            }
        }
    }
    // The neighbours of those refusals are accepted.
    let name = "webhook.certificate.secret.name=tls".to_string();
    let bundle = format!("webhook.certificate.secret.caBundle={ca}");
    for sets in [
        vec![secret, name.as_str(), bundle.as_str()],
        vec!["hub.replicas=1", "hub.leaderElection.enabled=false"],
        vec!["hub.hubId=team-a-eu-1", "webhook.failurePolicy=Ignore", "webhook.lookups=off", "logLevel=trace"],
        // Empty: the hub chooses its id at start.
        vec!["hub.hubId="],
        vec!["webhook.certPollInterval=500ms", "serviceMonitor.interval=1m30s", "webhook.shutdownGrace=2m"],
        vec!["hub.metrics.bindAddress=::1", "hub.registrationNamespaces={team-a,team-b}"],
        // A wrong certificate setting does not matter once the webhook is off.
        vec!["webhook.enabled=false", secret],
        vec!["webhook.enabled=false", "webhook.serviceAccount.create=false"],
        vec!["hub.serviceAccount.create=false", "hub.serviceAccount.name=existing", "hub.priorityClassName="],
        vec!["hub.strategy.type=Recreate", "webhook.strategy.rollingUpdate.maxUnavailable=0"],
        vec!["hub.strategy.rollingUpdate.maxUnavailable=0", "hub.strategy.rollingUpdate.maxSurge=1"],
        // Without leader election its timings are not passed, nor checked.
        vec!["hub.replicas=1", "hub.leaderElection.enabled=false", "hub.leaderElection.leaseDurationSeconds=1"],
        vec!["hub.leaderElection.leaseDurationSeconds=11", "hub.leaderElection.retryPeriodSeconds=9"],
        vec!["serviceMonitor.endpointConfig.honorLabels=true", "serviceMonitor.relabelings[0].action=Replace"],
        vec!["hub.extraVolumes[0].name=data", "hub.extraVolumes[0].emptyDir.medium=Memory"],
    ] {
        if let Err(e) = template(&helm, None, &sets) {
            panic!("--set {sets:?} was refused: {e}");
        }
    }
}

#[test]
fn notes_tell_how_to_register_a_cluster_with_the_real_flags() {
    let helm = helm_or_skip!();
    for (values, namespace) in [(None, "my-team"), (Some(ci_file("custom-flags-values.yaml")), "fleet")] {
        let chart = chart();
        let mut a = vec!["install", RELEASE, chart.to_str().unwrap(), "--namespace", NAMESPACE, "--dry-run=client"];
        if let Some(v) = &values {
            a.extend(["--values", v.to_str().unwrap()]);
        }
        let (ok, out, err) = run_helm(&helm, &a);
        assert!(ok, "{err}");
        let notes = out.split("NOTES:").nth(1).unwrap_or_else(|| panic!("no NOTES printed:\n{out}"));
        assert!(notes.contains(&format!("kubectl create namespace {namespace}")), "{notes}");
        assert!(notes.contains(&format!("--namespace {namespace}")), "{notes}");
        // Every flag the NOTES give to `register` is one it has.
        let help = Command::new(env!("CARGO_BIN_EXE_karpenter-hub")).args(["register", "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        let register = notes.split("karpenter-hub register").nth(1).expect("the NOTES show `karpenter-hub register`");
        let flags: Vec<&str> = register
            .split_whitespace()
            .map(|w| w.trim_start_matches('('))
            .filter(|w| w.starts_with("--"))
            .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
            .collect();
        for required in ["--cluster", "--namespace", "--workload-kubeconfig", "--kubeconfig", "--server"] {
            assert!(flags.contains(&required), "NOTES do not mention {required}: {notes}");
        }
        for flag in flags {
            assert!(help.contains(&format!("{flag} ")), "NOTES mention {flag}, which `karpenter-hub register` lacks");
        }
    }
}

#[test]
fn dockerfile_builds_both_binaries_with_the_workspace_rust_for_the_chart_version() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let msrv = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("Cargo.toml has a workspace rust-version");
    let froms: Vec<&str> = dockerfile.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a builder stage and a runtime stage: {froms:?}");
    assert!(froms[0].contains(&format!("/rust:{msrv}.")), "the builder is not Rust {msrv}: {}", froms[0]);
    assert!(froms[1].contains("distroless/cc") && froms[1].contains(":nonroot"), "{}", froms[1]);
    for bin in ["karpenter-hub", "karpenter-hub-webhook"] {
        assert!(dockerfile.contains(&format!("--bin {bin}")), "{bin} is not built");
        assert!(dockerfile.contains(&format!("/out/{bin}")), "{bin} is not copied");
    }
    assert!(dockerfile.contains("--locked"));
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains(&format!("ARG VERSION={VERSION}")), "the version label is not {VERSION}");
    assert!(dockerfile.contains("org.opencontainers.image.source="));
    for chart in ["charts/karpenter-hub/Chart.yaml", "charts/karpenter-hub-crds/Chart.yaml"] {
        let text = std::fs::read_to_string(repo().join(chart)).unwrap();
        assert!(text.contains(&format!("appVersion: \"{VERSION}\"")), "{chart}: appVersion is not {VERSION}");
    }
    // What the build compiles in (include_str!) is not excluded from the build context.
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    // Every workspace crate (the build reads each manifest), as Cargo.toml lists them.
    let members = cargo
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .expect("Cargo.toml lists the workspace members on one line")
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect::<Vec<_>>();
    assert!(members.iter().any(|m| m == "operator"), "members read from Cargo.toml: {members:?}");
    let needed = ["config", "examples", "Cargo.lock"].into_iter().map(str::to_string).chain(members);
    for needed in needed {
        assert!(!ignore.lines().any(|l| l.trim_end_matches('/') == needed), ".dockerignore drops {needed}");
    }
    assert!(ignore.lines().any(|l| l == "target/"), "the local target/ must stay out of the context");
}

/// `karpenter-hub run`'s flags, as the binary parses them (its `Cli` flattens the same `RunArgs`).
#[derive(Debug, clap::Parser)]
struct HubRun {
    #[command(flatten)]
    run: operator::commands::run::RunArgs,
}

/// The hub container's arguments parsed by the binary's own parser (`run` first), or the refusal.
fn parse_hub_args(a: &[String]) -> HubRun {
    use clap::Parser as _;
    assert_eq!(a.first().map(String::as_str), Some("run"), "{a:?}");
    let argv = std::iter::once("karpenter-hub".to_string()).chain(a[1..].iter().cloned());
    HubRun::try_parse_from(argv).unwrap_or_else(|e| panic!("the chart's hub arguments {a:?} are refused:\n{e}"))
}

/// The tuning flags the chart passes, as the binary holds them.
fn hub_tuning(r: &operator::commands::run::RunArgs) -> Vec<(&'static str, String)> {
    vec![
        ("--probe-interval-seconds", r.probe_interval_seconds.to_string()),
        ("--flavor-cooldown-seconds", r.flavor_cooldown_seconds.to_string()),
        ("--leader-elect", r.leader_elect.to_string()),
        ("--leader-elect-lease-duration", r.leader_elect_lease_duration.to_string()),
        ("--leader-elect-renew-deadline", r.leader_elect_renew_deadline.to_string()),
        ("--leader-elect-retry-period", r.leader_elect_retry_period.to_string()),
        ("--shard-lease-duration", r.shard_lease_duration.to_string()),
        ("--shard-renew-deadline", r.shard_renew_deadline.to_string()),
        ("--shard-retry-period", r.shard_retry_period.to_string()),
        ("--gc-min-age-seconds", r.gc_min_age_seconds.to_string()),
        ("--gc-period-seconds", r.gc_period_seconds.to_string()),
        ("--gc-max-deletions-per-sweep", r.gc_max_deletions_per_sweep.to_string()),
        ("--gc-halt-percent", r.gc_halt_percent.to_string()),
        ("--disruption-validation-seconds", r.disruption_validation_seconds.to_string()),
        ("--min-values-policy", format!("{:?}", r.min_values_policy)),
        ("--allow-insecure-kubeconfig", r.allow_insecure_kubeconfig.to_string()),
        ("--allow-link-local-servers", r.allow_link_local_servers.to_string()),
        ("--hub-id", format!("{:?}", r.hub_id)),
        ("--namespace", format!("{:?}", r.namespace)),
        ("--registration-namespaces", format!("{:?}", r.registration_namespaces)),
    ]
}

/// The hub's arguments of every rendering are flags `karpenter-hub run` accepts, and the chart's
/// defaults are the binary's own (values.yaml's convention): rendered with the default values
/// (sharded mode on, for its flags), the hub runs as it would with no flag at all. What the chart
/// sets on purpose (log format, listeners, the Lease namespace) is not a tuning flag.
#[test]
fn the_hubs_arguments_parse_and_its_defaults_are_the_binarys() {
    use clap::Parser as _;
    let helm = helm_or_skip!();
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    sets.extend(ci_values().into_iter().map(Some));
    for values in &sets {
        let r = render(&helm, values.as_deref());
        let hub =
            r.all("Deployment").into_iter().find(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "hub");
        parse_hub_args(&args(hub.unwrap()));
    }
    let binary = HubRun::try_parse_from(["karpenter-hub"]).unwrap();
    let r = template(&helm, None, &["hub.sharding.enabled=true"]).unwrap();
    let chart = parse_hub_args(&args(r.get("Deployment", "karpenter-hub")));
    assert_eq!(hub_tuning(&chart.run), hub_tuning(&binary.run), "values.yaml's defaults differ from the binary's");
    // Each one a flag of the rendering, but those left out while empty or false (as the binary's
    // default is).
    let a = args(r.get("Deployment", "karpenter-hub"));
    for (flag, _) in hub_tuning(&binary.run) {
        let passed = a.iter().any(|x| x == flag || x.starts_with(&format!("{flag}=")));
        let empty = [
            "--allow-insecure-kubeconfig",
            "--allow-link-local-servers",
            "--hub-id",
            "--namespace",
            "--registration-namespaces",
        ];
        assert_eq!(passed, !empty.contains(&flag), "{flag} in {a:?}");
    }
}

/// The chart's copy of the Grafana dashboard (Helm reads no file outside the chart) is
/// docs/dashboards/karpenter-hub.json, byte for byte; `each_ci_values_file_changes_what_it_sets`
/// checks the ConfigMap holds it unchanged.
#[test]
fn the_charts_dashboard_is_the_documented_one() {
    let docs = std::fs::read(repo().join("docs/dashboards/karpenter-hub.json")).unwrap();
    let copy = std::fs::read(chart().join("dashboards/karpenter-hub.json")).unwrap();
    assert!(
        docs == copy,
        "charts/karpenter-hub/dashboards/karpenter-hub.json differs from docs/dashboards/karpenter-hub.json: cp docs/dashboards/karpenter-hub.json charts/karpenter-hub/dashboards/"
    );
}

/// The alerts of docs/metrics.md, "Alerts worth having" (its YAML block): alert, expr, for.
fn documented_alerts() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let section = text.split("### Alerts worth having").nth(1).expect("docs/metrics.md has the alerts");
    let block = section.split("```yaml").nth(1).and_then(|b| b.split("```").next()).expect("a yaml block");
    let alerts: Vec<Value> = serde_saphyr::from_str(block).unwrap();
    assert!(alerts.len() >= 8, "{alerts:?}");
    alerts
}

/// Every series of docs/metrics.md's tables (hub and webhook), with its type.
fn documented_series() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let mut series = Vec::new();
    for table in ["hub", "webhook"] {
        let start = format!("<!-- metrics:{table} -->");
        let block = text.split(&start).nth(1).and_then(|b| b.split("<!-- /metrics:").next()).unwrap();
        for row in block.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            series.push((cells[1].trim_matches('`').to_string(), cells[2].to_string()));
        }
    }
    assert!(series.len() > 40, "{series:?}");
    series
}

/// The series a PromQL expression reads: its identifiers, less label matchers, ranges, strings,
/// grouping labels, functions (followed by `(`), keywords and numbers.
fn promql_series(expr: &str) -> Vec<String> {
    // Grouping clauses: their parenthesis holds label names, not series.
    const GROUPING: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    const KEYWORDS: [&str; 5] = ["bool", "and", "or", "unless", "offset"];
    // Aggregations may put their grouping clause between their name and their parenthesis.
    const AGGREGATIONS: [&str; 14] = [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "limitk",
        "limit_ratio",
    ];
    let mut plain = String::new();
    let (mut depth, mut quoted) = (0, false);
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            _ if quoted => {}
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let chars: Vec<char> = plain.chars().collect();
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !(chars[i].is_ascii_alphabetic() || chars[i] == '_' || chars[i] == ':')
            || (i > 0 && chars[i - 1].is_ascii_digit())
        {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && word_char(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let next = chars[i..].iter().position(|c| !c.is_whitespace()).map(|p| i + p);
        let call = next.is_some_and(|n| chars[n] == '(');
        if GROUPING.contains(&word.as_str()) {
            if let Some(open) = next.filter(|_| call) {
                i = open + chars[open..].iter().position(|c| *c == ')').unwrap() + 1;
            }
        } else if !call && !KEYWORDS.contains(&word.as_str()) && !AGGREGATIONS.contains(&word.as_str()) {
            names.push(word);
        }
    }
    names
}

/// prometheusRule.enabled renders exactly the alerts docs/metrics.md recommends (expressions and
/// `for:` unchanged), each with a summary, and every series they read is one of that page's
/// tables (which `metrics_docs` keeps equal to the code): no invented metric.
#[test]
fn the_prometheus_rule_holds_the_documented_alerts_over_documented_series() {
    let series = documented_series();
    let exists = |name: &str| {
        series.iter().any(|(s, kind)| {
            s == name
                || (kind == "histogram"
                    && ["_bucket", "_sum", "_count"].iter().any(|suffix| name.strip_suffix(suffix) == Some(s.as_str())))
        })
    };
    assert_eq!(promql_series("sum by (a) (rate(x_total{b=\"c\"}[5m])) > 5 and on (d) y == 1"), ["x_total", "y"]);
    let documented = documented_alerts();
    for alert in &documented {
        let names = promql_series(alert["expr"].as_str().unwrap());
        assert!(!names.is_empty(), "{alert}");
        for name in names {
            assert!(
                exists(&name),
                "docs/metrics.md's alert {} reads {name}, which its tables do not list",
                alert["alert"]
            );
        }
    }
    let helm = helm_or_skip!();
    let r = template(&helm, None, &["prometheusRule.enabled=true"]).unwrap();
    check_invariants("prometheusRule", &r);
    let rule = r.get("PrometheusRule", "karpenter-hub");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), documented.len(), "exactly the documented alerts: {rules:?}");
    for (rendered, documented) in rules.iter().zip(&documented) {
        for field in ["alert", "expr", "for"] {
            assert_eq!(rendered.get(field), documented.get(field), "{field} of {}", documented["alert"]);
        }
        let summary = rendered["annotations"]["summary"].as_str().unwrap();
        assert!(
            summary.contains("{{ $labels.") && !summary.contains("{{`"),
            "Prometheus templates, unrendered: {summary}"
        );
    }
}

/// extraArgs come after every argument of the chart, in their order, for the webhook as for the
/// hub (ci/extras-values.yaml gives the hub one; the webhook has no flag without a value to give).
#[test]
fn extra_args_follow_the_charts_own() {
    let helm = helm_or_skip!();
    let default = render(&helm, None);
    let r = template(&helm, None, &["webhook.extraArgs={--future-flag=1,--other}"]).unwrap();
    let with = args(r.get("Deployment", "karpenter-hub-webhook"));
    let mut expected = args(default.get("Deployment", "karpenter-hub-webhook"));
    expected.extend(["--future-flag=1".to_string(), "--other".to_string()]);
    assert_eq!(with, expected);
}

/// Minimal CRDs for the kinds of other projects the chart can render (cert-manager's Issuer and
/// Certificate, the Prometheus Operator's ServiceMonitor and PrometheusRule): their group,
/// version, kind and scope are checked by the API server, not their fields.
fn foreign_crds() -> Vec<CustomResourceDefinition> {
    [
        ("cert-manager.io", "Issuer", "issuers"),
        ("cert-manager.io", "Certificate", "certificates"),
        ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ]
    .into_iter()
    .map(|(group, kind, plural)| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        }))
        .unwrap()
    })
    .collect()
}

async fn wait_established(client: &Client, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let crd = api.get(name).await.unwrap();
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if established {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "CRD {name} not Established within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The CRD chart applied for real, exactly as helm renders it, with the stand-in CRDs of other
/// projects; returns once every CRD is Established.
async fn install_crds_chart(helm: &Path, client: &Client) {
    let (ok, out, err) = run_helm(helm, &["template", "karpenter-hub-crds", crds_chart().to_str().unwrap()]);
    assert!(ok, "{err}");
    let crds: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&out).unwrap();
    assert_eq!(crds.len(), crds::crd::hub_crds().len());
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let apply =
        PatchParams { field_validation: Some(ValidationDirective::Strict), ..PatchParams::apply("charts-test") };
    for crd in crds.iter().chain(foreign_crds().iter()) {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(&name, &apply, &Patch::Apply(crd)).await.unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    }
    for crd in crds.iter().chain(foreign_crds().iter()) {
        wait_established(client, crd.metadata.name.as_deref().unwrap()).await;
    }
}

async fn create_namespace(client: &Client, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_charts_are_accepted_by_a_real_api_server() {
    let helm = helm_or_skip!();
    let cp = envtest::shared_or_skip!("charts");
    let client = cp.client().await.unwrap();

    install_crds_chart(&helm, &client).await;

    // Namespaces the value sets name: the release's, the watched one, the Lease's and the
    // dashboard's.
    for ns in [NAMESPACE, "fleet", "hub-leases", "monitoring"] {
        create_namespace(&client, ns).await;
    }
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let dry_run = PatchParams {
        dry_run: true,
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::apply("charts-test")
    };
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    sets.extend(ci_values().into_iter().map(Some));
    let mut accepted = 0;
    for values in &sets {
        let r = render(&helm, values.as_deref());
        for doc in &r.docs {
            let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
                Some((g, v)) => (g, v),
                None => ("", doc["apiVersion"].as_str().unwrap()),
            };
            let kind = doc["kind"].as_str().unwrap();
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let (resource, caps): (ApiResource, _) = discovery
                .resolve_gvk(&gvk)
                .unwrap_or_else(|| panic!("{values:?}: the API server does not serve {gvk:?}"));
            let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
            let name = obj.metadata.name.clone().unwrap();
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(
                    client.clone(),
                    obj.metadata.namespace.as_deref().expect("namespaced objects name their namespace"),
                    &resource,
                ),
                Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            api.patch(&name, &dry_run, &Patch::Apply(&obj))
                .await
                .unwrap_or_else(|e| panic!("{values:?}: the API server refused {kind} {name}: {e}"));
            accepted += 1;
        }
    }
    eprintln!("{accepted} rendered objects accepted by the API server (server-side apply, dryRun=All)");

    // The pods of the default rendering are admitted in the release namespace with their
    // priority class, system-cluster-critical (a Deployment's is only checked when its pods are
    // made): created for real as a dry run, after their ServiceAccounts, which admission reads.
    let r = render(&helm, None);
    let apply =
        PatchParams { field_validation: Some(ValidationDirective::Strict), ..PatchParams::apply("charts-test") };
    let service_accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    for sa in r.all("ServiceAccount") {
        let name = sa["metadata"]["name"].as_str().unwrap();
        service_accounts.patch(name, &apply, &Patch::Apply(sa)).await.unwrap();
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for d in r.all("Deployment") {
        let name = d["metadata"]["name"].as_str().unwrap();
        let pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-admission"), "labels": d["spec"]["template"]["metadata"]["labels"]},
            "spec": pod_spec(d),
        }))
        .unwrap();
        let admitted = pods
            .create(&PostParams { dry_run: true, ..PostParams::default() }, &pod)
            .await
            .unwrap_or_else(|e| panic!("the API server refused a pod of {name}: {e}"));
        let spec = admitted.spec.unwrap();
        assert_eq!(spec.priority_class_name.as_deref(), Some("system-cluster-critical"), "{name}");
        assert_eq!(spec.priority, Some(2_000_000_000), "{name}: the class resolved to its priority");
    }

    // The negative side: the same path refuses an object the API server finds wrong.
    let mut bad: DynamicObject = serde_json::from_value(r.get("Deployment", "karpenter-hub").clone()).unwrap();
    bad.data["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUsr"] = json!(0);
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    let refused = deployments.patch("karpenter-hub", &dry_run, &Patch::Apply(&bad)).await;
    assert!(refused.is_err(), "a misspelt field was accepted: the server-side check would prove nothing");
}

/// A process that is killed when the test ends, however it ends; its output goes to a file.
pub(crate) struct Running {
    child: std::process::Child,
    log: PathBuf,
}

impl Running {
    /// `karpenter-hub` with `args` as the chart's pod `pod` in `namespace` runs it (its downward
    /// API environment and `RUST_LOG`, nothing else), its output in `log`.
    pub(crate) fn hub(args: &[String], namespace: &str, pod: &str, rust_log: &str, log: PathBuf) -> Running {
        let file = std::fs::File::create(&log).unwrap();
        Running {
            child: Command::new(env!("CARGO_BIN_EXE_karpenter-hub"))
                .args(args)
                .env_clear()
                .env("POD_NAMESPACE", namespace)
                .env("POD_NAME", pod)
                .env("RUST_LOG", rust_log)
                .stdin(std::process::Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .unwrap(),
            log,
        }
    }

    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the output if the process has exited.
    pub(crate) fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("karpenter-hub exited ({status}):\n{}", self.output());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener the chart puts on every interface, moved to the loopback one (tests listen on
/// 127.0.0.1 only).
pub(crate) fn to_loopback(hub_args: &mut [String], flag: &str, port: u16) {
    let all_interfaces = format!("{flag}=0.0.0.0:{port}");
    let position =
        hub_args.iter().position(|a| *a == all_interfaces).unwrap_or_else(|| panic!("the chart sets {flag}"));
    hub_args[position] = format!("{flag}=127.0.0.1:{port}");
}

/// An unused port on the loopback interface.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The status code of `GET http://127.0.0.1:<port><path>`, None while nothing answers.
pub(crate) async fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).await.map(|(code, _)| code)
}

/// The status code and body of `GET http://127.0.0.1:<port><path>`, None while nothing answers.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

/// Whether the API server lets `user` do `verb` on `resource` in `namespace` (admin's question).
/// `resource` is `<group>/<plural>` outside the core group (`coordination.k8s.io/leases`): a review
/// naming no group asks about the core group, where no Lease is.
async fn allowed(admin: &Client, user: &str, verb: &str, resource: &str, namespace: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let (group, resource) = resource.rsplit_once('/').unwrap_or(("", resource));
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "resourceAttributes": {
            "verb": verb, "group": group, "resource": resource, "namespace": namespace
        }}
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(admin.clone()).create(&PostParams::default(), &review).await.unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

/// Create the hub's ServiceAccount, roles and bindings of a rendered chart (server-side apply).
pub(crate) async fn apply_hub_rbac(admin: &Client, r: &Rendered) {
    use k8s_openapi::api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    };
    let apply =
        PatchParams { field_validation: Some(ValidationDirective::Strict), ..PatchParams::apply("charts-test") };
    for d in r.docs.iter().filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "hub") {
        let name = d["metadata"]["name"].as_str().unwrap();
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let patch = Patch::Apply(d);
        let result = match d["kind"].as_str().unwrap() {
            "ServiceAccount" => {
                Api::<ServiceAccount>::namespaced(admin.clone(), ns).patch(name, &apply, &patch).await.map(drop)
            }
            "ClusterRole" => Api::<ClusterRole>::all(admin.clone()).patch(name, &apply, &patch).await.map(drop),
            "ClusterRoleBinding" => {
                Api::<ClusterRoleBinding>::all(admin.clone()).patch(name, &apply, &patch).await.map(drop)
            }
            "Role" => Api::<Role>::namespaced(admin.clone(), ns).patch(name, &apply, &patch).await.map(drop),
            "RoleBinding" => {
                Api::<RoleBinding>::namespaced(admin.clone(), ns).patch(name, &apply, &patch).await.map(drop)
            }
            _ => continue,
        };
        result.unwrap_or_else(|e| panic!("creating {} {name}: {e}", d["kind"]));
    }
}

/// A kubeconfig file in `dir` for the API server of `cp` as ServiceAccount `ns/sa` (a fresh token).
pub(crate) async fn service_account_kubeconfig(
    admin: &Client,
    cp: &envtest::ControlPlane,
    ns: &str,
    sa: &str,
    dir: &Path,
) -> PathBuf {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    std::fs::create_dir_all(dir).unwrap();
    let mut kubeconfig = serde_json::to_value(cp.kubeconfig().unwrap()).unwrap();
    kubeconfig["users"][0]["user"] = json!({"token": token});
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

/// The chart's hub, for real: its ServiceAccount, roles and bindings created on a kube-apiserver,
/// `karpenter-hub` started with exactly the container's arguments and environment (every flag of
/// custom-flags-values.yaml) and that ServiceAccount's token. It parses them, wins the Lease where
/// the chart's Role allows it, and writes the status of a NodePool in the watched namespace; its
/// identity may read kubeconfig Secrets there and nowhere else. A second replica started the same
/// way stands by and passes the rendered readiness probe too (`ready: standby`, `karpenter_hub_leader`
/// 0 against the leader's 1), so `helm install --wait` converges with two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_runs_with_the_chart_flags_and_rbac_on_a_real_api_server() {
    use k8s_openapi::api::coordination::v1::Lease;
    let helm = helm_or_skip!();
    let cp = envtest::shared_or_skip!("charts");
    let admin = cp.client().await.unwrap();
    install_crds_chart(&helm, &admin).await;
    let release_ns = "chart-run";
    for ns in [release_ns, "fleet", "hub-leases"] {
        create_namespace(&admin, ns).await;
    }
    let (port, probe_port) = (free_port(), free_port());
    let ports = [format!("hub.metrics.port={port}"), format!("hub.healthProbe.port={probe_port}")];
    let ports: Vec<&str> = ports.iter().map(String::as_str).collect();
    let r = template_in(&helm, release_ns, Some(&ci_file("custom-flags-values.yaml")), &ports).unwrap();

    apply_hub_rbac(&admin, &r).await;
    let apply =
        PatchParams { field_validation: Some(ValidationDirective::Strict), ..PatchParams::apply("charts-test") };

    // The identity is the chart's, with what the chart grants: Secrets and ConfigMaps of the
    // watched namespace only.
    let user = format!("system:serviceaccount:{release_ns}:hub-operator");
    assert!(allowed(&admin, &user, "watch", "secrets", "fleet").await);
    assert!(
        !allowed(&admin, &user, "watch", "secrets", "default").await,
        "Secrets readable outside hub.watchNamespace"
    );
    assert!(allowed(&admin, &user, "create", "configmaps", "fleet").await);
    for verb in ["get", "create", "patch"] {
        assert!(
            !allowed(&admin, &user, verb, "configmaps", "default").await,
            "ConfigMaps ({verb}) outside hub.watchNamespace"
        );
    }
    let leases = "coordination.k8s.io/leases";
    assert!(allowed(&admin, &user, "update", leases, "hub-leases").await, "no Lease rights in the Lease namespace");
    assert!(!allowed(&admin, &user, "update", leases, release_ns).await, "Lease rights outside its namespace");

    let dir = std::env::temp_dir().join(format!("karpenter-hub-charts-{}", std::process::id()));
    let kubeconfig_path = service_account_kubeconfig(&admin, cp, release_ns, "hub-operator", &dir).await;

    // The container's command line and environment, as rendered (/metrics on the loopback
    // interface, as hub.metrics.bindAddress asks); only the probes' listener moves from all
    // interfaces to the loopback one (tests listen on 127.0.0.1 only).
    let hub = r.get("Deployment", "hub");
    let mut hub_args = args(hub);
    assert!(hub_args.contains(&format!("--metrics-bind-address=127.0.0.1:{port}")), "{hub_args:?}");
    to_loopback(&mut hub_args, "--health-probe-bind-address", probe_port);
    hub_args.push(format!("--kubeconfig={}", kubeconfig_path.display()));
    let rust_log = env(hub, "RUST_LOG").unwrap();
    let mut running = Running::hub(&hub_args, release_ns, "hub-0", &rust_log, dir.join("hub.log"));

    // It leads through the Lease of its --hub-id in --leader-election-namespace, and is Ready.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "hub-leases");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        running.assert_alive();
        let holder = leases.get_opt("karpenter-hub-eu-west").await.unwrap().and_then(|l| l.spec?.holder_identity);
        if holder.as_deref().is_some_and(|h| h.starts_with("hub-0-"))
            && http_status(probe_port, "/readyz").await == Some(200)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub did not lead and get Ready within 30 s:\n{}",
            running.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A second replica, as the Deployment's second pod runs: it stands by and is Ready all the
    // same (helm --wait, rollout status), /readyz and karpenter_hub_leader saying which leads.
    let (port_1, probe_port_1) = (free_port(), free_port());
    let hub_1_args: Vec<String> = hub_args
        .iter()
        .map(|a| match a.split_once('=') {
            Some(("--metrics-bind-address", _)) => format!("--metrics-bind-address=127.0.0.1:{port_1}"),
            Some(("--health-probe-bind-address", _)) => format!("--health-probe-bind-address=127.0.0.1:{probe_port_1}"),
            _ => a.clone(),
        })
        .collect();
    let mut standby = Running::hub(&hub_1_args, release_ns, "hub-1", &rust_log, dir.join("hub-1.log"));
    let leader_gauge =
        |text: &str| text.lines().find_map(|l| l.strip_prefix("karpenter_hub_leader ")).map(|v| v.trim().to_string());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        standby.assert_alive();
        if http_get(probe_port_1, "/readyz").await == Some((200, "ready: standby".to_string())) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the standby is not Ready within 30 s:\n{}", standby.output());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(http_get(probe_port, "/readyz").await, Some((200, "ready: leader".to_string())));
    let metrics_of = |p: u16| async move { http_get(p, "/metrics").await.map(|(_, body)| body).unwrap_or_default() };
    assert_eq!(leader_gauge(&metrics_of(port).await).as_deref(), Some("1"), "the leader's gauge");
    assert_eq!(leader_gauge(&metrics_of(port_1).await).as_deref(), Some("0"), "the standby's gauge");
    let holder = leases.get_opt("karpenter-hub-eu-west").await.unwrap().and_then(|l| l.spec?.holder_identity);
    assert!(holder.as_deref().is_some_and(|h| h.starts_with("hub-0-")), "the standby took nothing: {holder:?}");
    drop(standby);

    // Each listener serves what it is for: /metrics and the probes on the metrics address, the
    // probes only on theirs.
    assert_eq!(http_status(port, "/metrics").await, Some(200));
    assert_eq!(http_status(probe_port, "/healthz").await, Some(200));
    assert_eq!(http_status(probe_port, "/metrics").await, Some(404), "/metrics on the probes' listener");

    // It serves the watched namespace: a NodePool there gets its cluster's state written.
    let example = std::fs::read_to_string(repo().join("examples/general-purpose.yaml")).unwrap();
    for doc in parse(&example).into_iter().filter(|d| d["kind"] == "NodePool" || d["kind"] == "CleverNodeClass") {
        let resource = if doc["kind"] == "NodePool" { "nodepools" } else { "clevernodeclasses" };
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("karpenter.clever-cloud.com", "v1alpha1", doc["kind"].as_str().unwrap()),
            resource,
        );
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let name = obj.metadata.name.clone().unwrap();
        Api::<DynamicObject>::namespaced_with(admin.clone(), "fleet", &ar)
            .patch(&name, &apply, &Patch::Apply(&obj))
            .await
            .unwrap();
    }
    let pools: Api<crds::NodePool> = Api::namespaced(admin.clone(), "fleet");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        running.assert_alive();
        let pool = pools.get("default").await.unwrap();
        let reachable =
            pool.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "ClusterReachable").cloned());
        if let Some(c) = reachable {
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "SecretMissing"), "{c:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ClusterReachable condition within 30 s:\n{}",
            running.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let output = running.output();
    for refused in ["forbidden", "Forbidden", " 403"] {
        assert!(!output.contains(refused), "the chart's RBAC refused the hub something:\n{output}");
    }
    // Text logs, as logFormat asked (JSON lines would start with '{').
    assert!(output.lines().any(|l| !l.is_empty()) && !output.lines().any(|l| l.starts_with('{')), "{output}");
    drop(running);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The chart's hub in sharded mode, for real: ci/sharding-values.yaml's arguments, run as the
/// chart's ServiceAccount with the chart's roles. With one workload cluster registered, it holds
/// its membership Lease, every shard bucket's Lease and the leader Lease, is Ready; stopped with
/// SIGTERM, it releases the bucket Leases and deletes its membership Lease; the API refused it
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharded_hub_runs_with_the_chart_rbac_on_a_real_api_server() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::ListParams;
    let helm = helm_or_skip!();
    let cp = envtest::shared_or_skip!("charts");
    let admin = cp.client().await.unwrap();
    install_crds_chart(&helm, &admin).await;
    let (release_ns, team) = ("chart-shard", "shard-team");
    for ns in [release_ns, team] {
        create_namespace(&admin, ns).await;
    }
    let (port, probe_port) = (free_port(), free_port());
    // Registrations read in the team's namespace only, through a RoleBinding there: the hub must
    // watch that namespace's Secrets (it may not list them cluster-wide) to serve the cluster.
    let sets = [
        format!("hub.metrics.port={port}"),
        format!("hub.healthProbe.port={probe_port}"),
        format!("hub.registrationNamespaces={{{team}}}"),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = template_in(&helm, release_ns, Some(&ci_file("sharding-values.yaml")), &sets).unwrap();
    apply_hub_rbac(&admin, &r).await;
    let user = format!("system:serviceaccount:{release_ns}:karpenter-hub");
    for (verb, resource) in
        [("watch", "secrets"), ("get", "secrets"), ("create", "configmaps"), ("patch", "configmaps")]
    {
        assert!(allowed(&admin, &user, verb, resource, team).await, "{verb} {resource} in {team}");
        assert!(!allowed(&admin, &user, verb, resource, "default").await, "{verb} {resource} outside the list");
    }
    for verb in ["get", "list", "watch", "create", "update", "delete"] {
        let granted = allowed(&admin, &user, verb, "coordination.k8s.io/leases", release_ns).await;
        assert!(granted, "the chart does not grant {verb} on Leases");
    }
    let dir = std::env::temp_dir().join(format!("karpenter-hub-charts-sharded-{}", std::process::id()));
    let kubeconfig_path = service_account_kubeconfig(&admin, cp, release_ns, "karpenter-hub", &dir).await;
    // One workload cluster (an emulator on 127.0.0.1), registered as a user would.
    let workload = sim::apiserver::ApiServer::start(sim::apiserver::ApiServerConfig::workload("w")).await.unwrap();
    let bytes = serde_json::to_vec(&workload.kubeconfig()).unwrap();
    operator::commands::register_cluster::write_secret(&admin, team, "w", bytes).await.unwrap();

    let hub = r.get("Deployment", "karpenter-hub");
    let mut hub_args = args(hub);
    to_loopback(&mut hub_args, "--metrics-bind-address", port);
    to_loopback(&mut hub_args, "--health-probe-bind-address", probe_port);
    assert!(hub_args.contains(&format!("--registration-namespaces={team}")), "{hub_args:?}");
    hub_args.push(format!("--kubeconfig={}", kubeconfig_path.display()));
    assert!(hub_args.contains(&"--sharding=true".to_string()), "{hub_args:?}");
    let mut running = Running::hub(&hub_args, release_ns, "hub-0", &env(hub, "RUST_LOG").unwrap(), dir.join("hub.log"));
    let leases: Api<Lease> = Api::namespaced(admin.clone(), release_ns);
    // No hub.hubId, nothing of `default` in this namespace: the id derived from the management
    // cluster's identity (docs/hub.md, "The hub id").
    let uid =
        Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone()).get("kube-system").await.unwrap().metadata.uid;
    let hub_id = format!("m-{}", &uid.unwrap().replace('-', "")[..12]);
    let holders = |role: &'static str| {
        let (leases, hub_id) = (leases.clone(), hub_id.clone());
        async move {
            let selector = format!("karpenter.clever-cloud.com/hub={hub_id},karpenter.clever-cloud.com/shard={role}");
            leases
                .list(&ListParams::default().labels(&selector))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|l| l.spec.and_then(|s| s.holder_identity).unwrap_or_default())
                .collect::<Vec<_>>()
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        running.assert_alive();
        let ours = |h: &Vec<String>| h.len() == 1 && h[0].starts_with("hub-0-");
        let all_ours = |h: &Vec<String>| {
            h.len() == operator::decisions::shard_buckets::BUCKETS as usize && h.iter().all(|h| h.starts_with("hub-0-"))
        };
        let leader =
            leases.get_opt(&format!("karpenter-hub-{hub_id}")).await.unwrap().and_then(|l| l.spec?.holder_identity);
        if ours(&holders("member").await)
            && all_ours(&holders("bucket").await)
            && leader.is_some_and(|h| h.starts_with("hub-0-"))
            && http_status(probe_port, "/readyz").await == Some(200)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sharded hub did not hold its Leases and get Ready within 30 s:\n{}",
            running.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // SIGTERM: it stops acting, releases the bucket Leases and deletes its membership Lease.
    let terminated = Command::new("kill").args(["-TERM", &running.child.id().to_string()]).status().unwrap();
    assert!(terminated.success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while running.child.try_wait().unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no exit 30 s after SIGTERM:\n{}", running.output());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let buckets = holders("bucket").await;
    assert!(
        buckets.len() == operator::decisions::shard_buckets::BUCKETS as usize && buckets.iter().all(String::is_empty),
        "the bucket Leases are not all released: {buckets:?}"
    );
    assert!(holders("member").await.is_empty(), "the membership Lease is not deleted");
    let output = running.output();
    for refused in ["forbidden", "Forbidden", " 403"] {
        assert!(!output.contains(refused), "the chart's RBAC refused the sharded hub something:\n{output}");
    }
    let chosen: Vec<&str> = output.lines().filter(|l| l.contains("hub id chosen")).collect();
    assert_eq!(chosen.len(), 1, "one line says which hub id and why:\n{output}");
    assert!(chosen[0].contains(&hub_id) && chosen[0].contains("derived from the management cluster"), "{}", chosen[0]);
    drop(running);
    workload.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The install, upgrade and uninstall of docs/install.md, run with helm against a kube-apiserver
/// of its own (the webhook configuration it installs would otherwise intercept the other tests'
/// NodePools): the README's two install commands as written, on a bare server (no cert-manager:
/// the webhook keeps its own certificate), CRDs first, then the hub; an upgrade changes what it
/// sets; uninstalling the hub leaves the CRDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_as_the_docs_say_on_a_real_api_server() {
    use k8s_openapi::api::{
        admissionregistration::v1::ValidatingWebhookConfiguration, apps::v1::Deployment, rbac::v1::ClusterRole,
    };
    let helm = helm_or_skip!();
    let options = envtest::Options { controller_manager: false, ..envtest::Options::new("charts-helm") };
    let cp = match envtest::ControlPlane::start(&options) {
        Ok(cp) => cp,
        Err(e) => {
            envtest::skip(&envtest::current_test(), &e);
            return;
        }
    };
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.kubeconfig_path().to_str().unwrap().to_string();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let helm_ok = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--kubeconfig", &kubeconfig]);
        let (ok, out, err) = run_helm(&helm, &all);
        assert!(ok, "helm {}: {out}{err}", args.join(" "));
        out
    };
    let (crds, chart) = (crds_chart(), chart());
    let (crds, chart) = (crds.to_str().unwrap(), chart.to_str().unwrap());

    // The README's install commands, exactly as written (paths from the repository's root), on a
    // bare control plane: no cert-manager, nothing else installed first.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let install = readme.split("## Install").nth(1).unwrap();
    let commands: Vec<Vec<String>> = install
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("helm install "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|w| if w.starts_with("charts/") { repo().join(w).to_str().unwrap().to_string() } else { w.into() })
                .collect()
        })
        .collect();
    assert_eq!(commands.len(), 2, "the README's two install commands: {commands:?}");
    let first: Vec<&str> = commands[0].iter().map(String::as_str).collect();
    assert_eq!(first, ["install", "karpenter-hub-crds", crds], "the CRD chart first");
    helm_ok(&first);
    for file in crds::crd::hub_crds() {
        wait_established(&client, file.crd.metadata.name.as_deref().unwrap()).await;
    }
    let second: Vec<&str> = commands[1].iter().map(String::as_str).collect();
    assert!(second.contains(&RELEASE) && second.contains(&NAMESPACE), "{second:?}");
    let notes = helm_ok(&second);
    assert!(!notes.contains("does not seem to be installed"), "the CRD chart is installed: {notes}");
    assert!(notes.contains("karpenter-hub register --cluster"), "{notes}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let replicas = |d: Deployment| d.spec.and_then(|s| s.replicas);
    assert_eq!(replicas(deployments.get("karpenter-hub").await.unwrap()), Some(2));
    assert!(deployments.get_opt("karpenter-hub-webhook").await.unwrap().is_some());
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    assert!(vwcs.get_opt("karpenter-hub-webhook").await.unwrap().is_some());

    // Upgrade: CRDs first, then the hub with one value changed.
    helm_ok(&["upgrade", "karpenter-hub-crds", crds]);
    helm_ok(&["upgrade", RELEASE, chart, "--namespace", NAMESPACE, "--reuse-values", "--set", "hub.replicas=3"]);
    assert_eq!(replicas(deployments.get("karpenter-hub").await.unwrap()), Some(3));

    // Uninstalling the hub removes its objects, cluster-scoped ones included, and keeps the CRDs.
    helm_ok(&["uninstall", RELEASE, "--namespace", NAMESPACE]);
    // (Without kube-controller-manager nothing is garbage collected: what helm deleted is gone at once.)
    assert!(deployments.get_opt("karpenter-hub").await.unwrap().is_none(), "Deployment left by helm uninstall");
    assert!(vwcs.get_opt("karpenter-hub-webhook").await.unwrap().is_none(), "webhook configuration left");
    assert!(
        Api::<ClusterRole>::all(client.clone()).get_opt("karpenter-hub").await.unwrap().is_none(),
        "ClusterRole left"
    );
    for file in crds::crd::hub_crds() {
        assert!(
            api.get_opt(file.crd.metadata.name.as_deref().unwrap()).await.unwrap().is_some(),
            "CRD gone with the hub"
        );
    }
}
