//! The emulator's schema layer (`sim::schema`) and a real kube-apiserver give the same verdict, with
//! the same message, on the same CRDs and objects.
//!
//! The corpus is data: every `*.yaml` under `tests/differential/` is a case (its format is in
//! `tests/differential/README.md`), plus one generated case per CRD the project ships (`crds/`,
//! `crds/testing/`) holding every example of that kind (`examples/`, `examples/invalid/`,
//! `examples/invalid/updates/`). Each CRD is compiled by the emulator and created on the real server;
//! each object is admitted by the emulator and dry-run created (or, with an `old`, that old object
//! created and the object dry-run replaced over it) on the real server.
//!
//! Two tiers:
//! - offline (always): the emulator meets the corpus' recorded expectations (`verdict`, `message`);
//! - real (the shared envtest plane `differential`, a visible skip without `KUBEBUILDER_ASSETS`):
//!   the real server meets them too, and the emulator's message equals the real server's.
//!
//! Message comparison: the whole refusal must match, with two normalisations, applied to both sides:
//! - the causes are compared as a sorted list (with the `Kind.group "name" is invalid` head), not in
//!   the order of the message: kube-apiserver reports the OpenAPI errors of sibling properties, and the
//!   "contributed to estimated rule cost total" errors, in Go map order, which changes from run to run;
//! - the detail of a CEL compilation error is cut after `compilation failed`: cel-go's checker
//!   diagnostics (positions, carets, type names) are not reproduced by the emulator, which only
//!   gives the same verdict on the same rule.
//!
//! For CRDs, the emulator's compile errors are rendered as the apiserver's Status would carry them
//! (`CustomResourceDefinition.apiextensions.k8s.io "<name>" is invalid: ...`, one cause per error).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use serde::Deserialize;
use serde_json::Value;

/// The namespace namespaced objects are submitted in.
const NAMESPACE: &str = "differential";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", path.display()))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Accepted,
    Refused,
}

/// One object submission of a case.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submission {
    /// What the submission shows (used in failure reports).
    name: String,
    /// The expected verdict, if recorded (both sides must give it).
    verdict: Option<Verdict>,
    /// A text the refusal message must contain, if recorded (both sides).
    message: Option<String>,
    /// For an update: the object as stored before (created for real first).
    old: Option<Value>,
    object: Value,
}

/// A case: a CRD, the verdict on it, and objects submitted under it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Case {
    #[serde(skip)]
    source: String,
    description: String,
    /// An inline CRD...
    crd: Option<Value>,
    /// ...or a CRD file, relative to the repository's root.
    crd_file: Option<String>,
    /// The expected verdict on the CRD, if recorded.
    crd_verdict: Option<Verdict>,
    /// A text the CRD's refusal message must contain, if recorded.
    crd_message: Option<String>,
    #[serde(default)]
    objects: Vec<Submission>,
}

impl Case {
    fn crd(&self) -> CustomResourceDefinition {
        let value = match (&self.crd, &self.crd_file) {
            (Some(v), None) => v.clone(),
            (None, Some(f)) => {
                let docs = documents(&repo().join(f));
                assert_eq!(docs.len(), 1, "{}: {f} must hold one CRD", self.source);
                docs[0].clone()
            }
            _ => panic!("{}: give exactly one of crd and crdFile", self.source),
        };
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{}: not a CRD: {e}", self.source))
    }
}

/// Every case: the corpus files, then one per project CRD with its examples.
fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    for path in yaml_files(&corpus_dir()) {
        let text = fs::read_to_string(&path).unwrap();
        let mut case: Case =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: not a case: {e}", path.display()));
        case.source = format!("tests/differential/{}", path.file_name().unwrap().to_string_lossy());
        cases.push(case);
    }
    cases.extend(project_cases());
    // Cases share one API server: their CRDs must not collide.
    let mut names = BTreeSet::new();
    for c in &cases {
        let crd = c.crd();
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert!(names.insert(name.clone()), "{}: CRD {name} is already used by another case", c.source);
    }
    cases
}

/// The project's CRDs, each with the examples of its kind.
fn project_cases() -> Vec<Case> {
    let root = repo();
    let mut crd_files: Vec<PathBuf> = yaml_files(&root.join("crds"));
    crd_files.extend(yaml_files(&root.join("crds/testing")));
    let mut examples: Vec<(String, Value)> = Vec::new();
    for dir in ["examples", "examples/invalid"] {
        for p in yaml_files(&root.join(dir)) {
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            examples.extend(documents(&p).into_iter().map(|d| (rel.clone(), d)));
        }
    }
    let updates: Vec<(String, Vec<Value>)> = yaml_files(&root.join("examples/invalid/updates"))
        .into_iter()
        .map(|p| (p.strip_prefix(&root).unwrap().display().to_string(), documents(&p)))
        .collect();
    crd_files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(&root).unwrap().display().to_string();
            let crd: CustomResourceDefinition = serde_json::from_value(documents(&f)[0].clone()).unwrap();
            let of_kind = |d: &Value| {
                d["kind"].as_str() == Some(crd.spec.names.kind.as_str())
                    && d["apiVersion"].as_str().and_then(|a| a.split_once('/')).map(|(g, _)| g)
                        == Some(crd.spec.group.as_str())
            };
            let mut objects: Vec<Submission> = examples
                .iter()
                .filter(|(_, d)| of_kind(d))
                .map(|(src, d)| Submission {
                    name: format!("{src} {}", d["metadata"]["name"].as_str().unwrap_or("")),
                    verdict: Some(if src.contains("/invalid/") { Verdict::Refused } else { Verdict::Accepted }),
                    message: None,
                    old: None,
                    object: d.clone(),
                })
                .collect();
            for (src, docs) in &updates {
                if docs.len() == 2 && of_kind(&docs[1]) {
                    objects.push(Submission {
                        name: src.clone(),
                        verdict: Some(Verdict::Refused),
                        message: None,
                        old: Some(docs[0].clone()),
                        object: docs[1].clone(),
                    });
                }
            }
            Case {
                source: rel.clone(),
                description: format!("the project's CRD {rel} and its examples"),
                crd: None,
                crd_file: Some(rel),
                crd_verdict: Some(Verdict::Accepted),
                crd_message: None,
                objects,
            }
        })
        .collect()
}

/// A refusal: the Status message and its causes (`field: message`), as both sides report them.
#[derive(Clone, Debug)]
struct Refusal {
    message: String,
    causes: Vec<String>,
}

impl Refusal {
    fn plain(message: String) -> Self {
        Refusal { message, causes: Vec::new() }
    }

    fn contains(&self, text: &str) -> bool {
        self.message.contains(text)
    }

    /// What is compared: see the module documentation.
    fn key(&self) -> (String, Vec<String>) {
        if self.causes.is_empty() {
            return (normalise(&self.message), Vec::new());
        }
        let head = self.message.split(" is invalid").next().unwrap_or_default().to_string();
        let mut causes: Vec<String> = self.causes.iter().map(|c| normalise(c)).collect();
        causes.sort();
        causes.dedup();
        (head, causes)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A verdict with its refusal.
type Outcome = Result<(), Refusal>;

fn same(a: &Outcome, b: &Outcome) -> bool {
    match (a, b) {
        (Ok(()), Ok(())) => true,
        (Err(x), Err(y)) => x.key() == y.key(),
        _ => false,
    }
}

/// The causes only one side gave, when both refused with causes (easier to read than two messages).
fn cause_diff(a: &Outcome, b: &Outcome) -> String {
    let (Err(a), Err(b)) = (a, b) else { return String::new() };
    let (ka, kb) = (a.key().1, b.key().1);
    if ka.is_empty() || kb.is_empty() {
        return String::new();
    }
    let only = |x: &[String], y: &[String]| -> Vec<String> { x.iter().filter(|c| !y.contains(c)).cloned().collect() };
    format!(
        "\n    only from the emulator:       {:?}\n    only from kube-apiserver:     {:?}",
        only(&ka, &kb),
        only(&kb, &ka)
    )
}

fn show(o: &Outcome) -> String {
    match o {
        Ok(()) => "accepted".into(),
        Err(r) => format!("refused: {}", r.message),
    }
}

fn verdict_of(o: &Outcome) -> Verdict {
    if o.is_ok() { Verdict::Accepted } else { Verdict::Refused }
}

/// Renders errors the way `ErrorList.ToAggregate` prints in a Status message.
fn aggregate(errs: &[String]) -> String {
    let mut seen = BTreeSet::new();
    let errs: Vec<&String> = errs.iter().filter(|e| seen.insert(e.as_str())).collect();
    match errs.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
    }
}

/// See the module documentation: only cel-go's checker diagnostics are cut (in one cause, or in a
/// message that is not split into causes).
fn normalise(message: &str) -> String {
    let mut out = String::new();
    let mut rest = message;
    const MARK: &str = "compilation failed";
    while let Some(i) = rest.find(MARK) {
        out.push_str(&rest[..i + MARK.len()]);
        rest = &rest[i + MARK.len()..];
        // Skip to the end of this cause: the next `, spec.` or the closing `]`.
        let end = rest.find(", spec.").or_else(|| rest.rfind(']')).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The emulator's side: the CRD's served versions compiled, and the objects admitted.
struct Emulated {
    crd: Outcome,
    schema: Option<sim::schema::CrdSchema>,
}

fn emulate_crd(crd: &CustomResourceDefinition) -> Emulated {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let mut errs = Vec::new();
    let mut schema = None;
    for v in crd.spec.versions.iter().filter(|v| v.served) {
        match sim::schema::CrdSchema::compile(crd, &v.name) {
            Ok(s) => {
                if v.storage {
                    schema = Some(s);
                }
            }
            Err(e) => errs.extend(e),
        }
    }
    let outcome = if errs.is_empty() {
        Ok(())
    } else {
        Err(Refusal {
            message: format!("CustomResourceDefinition.apiextensions.k8s.io {name:?} is invalid: {}", aggregate(&errs)),
            causes: errs,
        })
    };
    Emulated { crd: outcome, schema }
}

/// The object as submitted: namespaced kinds in [`NAMESPACE`], cluster-scoped without a namespace.
fn placed(obj: &Value, namespaced: bool) -> Value {
    let mut obj = obj.clone();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if namespaced {
            m.insert("namespace".into(), NAMESPACE.into());
        } else {
            m.remove("namespace");
        }
    }
    obj
}

fn emulate_object(schema: &sim::schema::CrdSchema, s: &Submission) -> Outcome {
    let obj = placed(&s.object, schema.namespaced());
    let refusal = |e: sim::schema::Invalid| Refusal {
        message: e.to_string(),
        causes: e.causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect(),
    };
    match &s.old {
        None => schema.admit_create(&obj).map(|_| ()).map_err(refusal),
        Some(old) => {
            let old = placed(old, schema.namespaced());
            // The old object is stored first: it must itself be admitted.
            let stored = schema.admit_create(&old).map_err(|e| Refusal::plain(format!("(old object refused) {e}")))?;
            schema.admit_update(&obj, &stored).map(|_| ()).map_err(refusal)
        }
    }
}

/// Checks an outcome against a case's recorded expectation.
fn check_expected(side: &str, what: &str, o: &Outcome, verdict: Option<Verdict>, message: Option<&str>) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(v) = verdict
        && verdict_of(o) != v
    {
        failures.push(format!("{what}: {side} gave {:?}, the corpus records {v:?}: {}", verdict_of(o), show(o)));
    }
    if let (Some(m), Err(e)) = (message, o)
        && !e.contains(m)
    {
        failures.push(format!(
            "{what}: {side} refused with\n      {e}\n    the corpus records a message containing\n      {m}"
        ));
    }
    failures
}

#[test]
fn the_emulator_meets_the_corpus_expectations() {
    let cases = corpus();
    let mut failures = Vec::new();
    let mut submissions = 0;
    for case in &cases {
        let em = emulate_crd(&case.crd());
        failures.extend(check_expected(
            "the emulator",
            &format!("{} (CRD)", case.source),
            &em.crd,
            case.crd_verdict,
            case.crd_message.as_deref(),
        ));
        let Some(schema) = &em.schema else { continue };
        for s in &case.objects {
            submissions += 1;
            let o = emulate_object(schema, s);
            let what = format!("{}: {}", case.source, s.name);
            failures.extend(check_expected("the emulator", &what, &o, s.verdict, s.message.as_deref()));
        }
    }
    assert!(cases.len() >= 20, "expected the differential corpus under tests/differential/");
    eprintln!("differential corpus: {} CRDs, {submissions} object submissions", cases.len());
    assert!(failures.is_empty(), "{} divergence(s) from the corpus:\n  {}", failures.len(), failures.join("\n  "));
}

/// The real server's side.
mod real {
    use super::*;
    use kube::runtime::wait::{await_condition, conditions::is_crd_established};

    pub fn refusal(e: kube::Error) -> Refusal {
        match e {
            kube::Error::Api(status) => Refusal {
                message: status.message.clone(),
                causes: status
                    .details
                    .as_ref()
                    .map(|d| d.causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect())
                    .unwrap_or_default(),
            },
            other => Refusal::plain(format!("(no API status) {other}")),
        }
    }

    /// Creates the CRD and waits until it is Established and its objects are served.
    pub async fn create_crd(client: &Client, crd: &CustomResourceDefinition) -> Outcome {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), crd).await.map_err(refusal)?;
        tokio::time::timeout(Duration::from_secs(30), await_condition(api, &name, is_crd_established()))
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not Established within 30 s"))
            .unwrap();
        Ok(())
    }

    pub fn api(client: &Client, crd: &CustomResourceDefinition) -> Api<DynamicObject> {
        let v = crd.spec.versions.iter().find(|v| v.storage).unwrap();
        let gvk = GroupVersionKind::gvk(&crd.spec.group, &v.name, &crd.spec.names.kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
        if crd.spec.scope == "Namespaced" {
            Api::namespaced_with(client.clone(), NAMESPACE, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        }
    }

    /// A create, retried while the freshly Established resource is not yet served (404).
    async fn create(api: &Api<DynamicObject>, obj: &DynamicObject, dry_run: bool) -> Result<DynamicObject, Refusal> {
        let pp = PostParams { dry_run, ..Default::default() };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match api.create(&pp, obj).await {
                Err(kube::Error::Api(s)) if s.code == 404 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other.map_err(refusal),
            }
        }
    }

    pub async fn submit(api: &Api<DynamicObject>, namespaced: bool, s: &Submission) -> Outcome {
        let obj: DynamicObject = serde_json::from_value(placed(&s.object, namespaced)).unwrap();
        match &s.old {
            None => create(api, &obj, true).await.map(|_| ()),
            Some(old) => {
                let old: DynamicObject = serde_json::from_value(placed(old, namespaced)).unwrap();
                let stored =
                    create(api, &old, false).await.map_err(|e| Refusal::plain(format!("(old object refused) {e}")))?;
                let mut new = obj;
                new.metadata.resource_version = stored.metadata.resource_version;
                let name = new.metadata.name.clone().unwrap_or_default();
                let pp = PostParams { dry_run: true, ..Default::default() };
                api.replace(&name, &pp, &new).await.map(|_| ()).map_err(refusal)
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_and_kube_apiserver_agree_on_the_corpus() {
    let cp = envtest::shared_or_skip!("differential");
    let client = cp.client().await.unwrap();
    let started = Instant::now();
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let obj = serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}})).unwrap();
    ns.create(&PostParams::default(), &obj).await.unwrap();

    let cases = corpus();
    // CRDs first, all at once (each waits for Established), then the objects.
    let crds: Vec<CustomResourceDefinition> = cases.iter().map(Case::crd).collect();
    let real_crds = futures::future::join_all(crds.iter().map(|c| real::create_crd(&client, c))).await;

    let mut failures = Vec::new();
    let (mut compared_crds, mut compared_objects) = (0, 0);
    for ((case, crd), real_crd) in cases.iter().zip(&crds).zip(&real_crds) {
        let em = emulate_crd(crd);
        let what = format!("{} (CRD; {})", case.source, case.description);
        compared_crds += 1;
        failures.extend(check_expected(
            "kube-apiserver",
            &what,
            real_crd,
            case.crd_verdict,
            case.crd_message.as_deref(),
        ));
        if !same(&em.crd, real_crd) {
            failures.push(format!(
                "{what}: the emulator and kube-apiserver disagree\n    emulator:       {}\n    kube-apiserver: {}{}",
                show(&em.crd),
                show(real_crd),
                cause_diff(&em.crd, real_crd)
            ));
            continue;
        }
        let Some(schema) = &em.schema else { continue };
        if real_crd.is_err() {
            continue;
        }
        let api = real::api(&client, crd);
        for s in &case.objects {
            compared_objects += 1;
            let what = format!("{}: {}", case.source, s.name);
            let real = real::submit(&api, schema.namespaced(), s).await;
            let emulated = emulate_object(schema, s);
            failures.extend(check_expected("kube-apiserver", &what, &real, s.verdict, s.message.as_deref()));
            if !same(&emulated, &real) {
                failures.push(format!(
                    "{what}: the emulator and kube-apiserver disagree\n    emulator:       {}\n    kube-apiserver: {}{}",
                    show(&emulated),
                    show(&real),
                    cause_diff(&emulated, &real)
                ));
            }
        }
    }
    eprintln!(
        "differential: {compared_crds} CRDs and {compared_objects} objects compared with kube-apiserver in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(compared_objects >= 50, "expected the corpus to submit objects");
    assert!(failures.is_empty(), "{} divergence(s):\n  {}", failures.len(), failures.join("\n  "));
}
