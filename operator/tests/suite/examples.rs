//! Every manifest under `examples/` is accepted, and every one under `examples/invalid/` is rejected
//! with the message its `# expect:` header names, by the CRD schemas and CEL rules alone (no webhook).
//!
//! Runs twice in every `cargo test`: against the emulator's schema layer (`sim::schema`, which
//! mirrors kube-apiserver), and against a real kube-apiserver: the cluster named by
//! `KARPENTER_HUB_CONFORMANCE_KUBECONFIG` when set, else the envtest control plane `examples`
//! (`KUBEBUILDER_ASSETS`; a visible skip without it, a failure with `KARPENTER_HUB_REQUIRE_ENVTEST`).
//! There it server-side applies `crds/`, dry-runs every example in a scratch namespace and deletes that
//! namespace at the end (the CRDs stay: deleting them would delete user objects). Also: every CRD the
//! project generates is applied to the real server and becomes Established.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, fs, path::Path};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::common;
use common::{documents, poll_every, poll_until, repo, yaml_files};

fn expectation(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{} has no '# expect: <message>' header", path.display()))
        .to_string()
}

/// The hub's CRDs, read from the committed files (what a user applies).
fn committed_crds() -> Vec<CustomResourceDefinition> {
    yaml_files(&repo().join("crds"))
        .iter()
        .map(|p| serde_saphyr::from_str(&fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

/// An API server, or the part of one the examples need: create and update of single objects.
trait Server {
    /// Ok, or the server's rejection message.
    fn create(&mut self, obj: &Value) -> Result<(), String>;
    fn update(&mut self, obj: &Value, old: &Value) -> Result<(), String>;
}

/// kube-apiserver's schema and CEL layer, in process.
struct Offline {
    schemas: BTreeMap<String, sim::schema::CrdSchema>,
}

impl Offline {
    fn new() -> Self {
        let mut schemas = BTreeMap::new();
        for crd in committed_crds() {
            let name = crd.metadata.name.clone().unwrap();
            let schema = sim::schema::CrdSchema::compile(&crd, "v1alpha1")
                .unwrap_or_else(|e| panic!("CRD {name} would be refused by the API server: {e:?}"));
            schemas.insert(format!("{}/{}", crd.spec.group, crd.spec.names.kind), schema);
        }
        Self { schemas }
    }

    fn schema(&self, obj: &Value) -> Option<&sim::schema::CrdSchema> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.split_once('/').map(|(g, _)| g).unwrap_or("");
        self.schemas.get(&format!("{group}/{}", obj["kind"].as_str().unwrap_or_default()))
    }
}

impl Server for Offline {
    fn create(&mut self, obj: &Value) -> Result<(), String> {
        match self.schema(obj) {
            Some(s) => s.admit_create(obj).map(|_| ()).map_err(|e| e.to_string()),
            // Built-in kinds (the kubeconfig Secret, a buffer's PodTemplate): the typed model must
            // read them.
            None => match obj["kind"].as_str() {
                Some("Secret") => serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(obj.clone())
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Some("PodTemplate") => serde_json::from_value::<k8s_openapi::api::core::v1::PodTemplate>(obj.clone())
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                other => Err(format!("no schema for kind {other:?}")),
            },
        }
    }

    fn update(&mut self, obj: &Value, old: &Value) -> Result<(), String> {
        let s = self.schema(obj).expect("updates are only tested on the hub's kinds");
        s.admit_update(obj, old).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// A real API server reached through a kubeconfig.
pub(crate) mod remote {
    use super::*;
    use kube::{
        Api, Client, Config,
        api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
        config::{KubeConfigOptions, Kubeconfig},
    };

    pub struct Remote {
        pub client: Client,
        pub namespace: String,
        rt: tokio::runtime::Runtime,
    }

    /// The real API server of this run: the configured cluster, else the envtest plane `examples`;
    /// `None` (after a visible skip message) when neither is available.
    pub fn real_client(rt: &tokio::runtime::Runtime) -> Option<Client> {
        if let Ok(path) = std::env::var("KARPENTER_HUB_CONFORMANCE_KUBECONFIG")
            && !path.is_empty()
        {
            return Some(rt.block_on(async {
                let kubeconfig = Kubeconfig::read_from(&path).expect("reading KARPENTER_HUB_CONFORMANCE_KUBECONFIG");
                let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
                Client::try_from(config).unwrap()
            }));
        }
        match envtest::ControlPlane::shared("examples") {
            Ok(cp) => Some(rt.block_on(cp.client()).expect("a client of the envtest control plane")),
            Err(e) => {
                envtest::skip(&envtest::current_test(), &e);
                None
            }
        }
    }

    /// Server-side applies `crds` and waits until each is Established (30 s each at most).
    pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap();
            api.patch(&name, &PatchParams::apply("karpenter-hub-examples").force(), &Patch::Apply(crd))
                .await
                .unwrap_or_else(|e| panic!("the API server refused CRD {name}: {e}"));
        }
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap();
            let established = kube::runtime::wait::conditions::is_crd_established();
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                kube::runtime::wait::await_condition(api.clone(), &name, established),
            )
            .await
            .unwrap_or_else(|_| panic!("CRD {name} not Established after 30 s"))
            .unwrap();
        }
    }

    impl Remote {
        pub fn connect(rt: tokio::runtime::Runtime, client: Client) -> Self {
            let namespace = format!("karpenter-hub-examples-{}", std::process::id());
            rt.block_on(async {
                apply_crds(&client, &committed_crds()).await;
                let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
                let obj = serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap();
                ns.create(&PostParams::default(), &obj).await.unwrap();
            });
            Self { client, namespace, rt }
        }

        fn api(&self, obj: &Value) -> Api<DynamicObject> {
            let api_version = obj["apiVersion"].as_str().unwrap();
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let kind = obj["kind"].as_str().unwrap();
            let plural = match kind {
                "CleverNodeClass" => "clevernodeclasses".to_string(),
                other => format!("{}s", other.to_lowercase()),
            };
            let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
            // An organisation spans namespaces (cluster-scoped).
            if kind == "CleverOrganization" {
                Api::all_with(self.client.clone(), &ar)
            } else {
                Api::namespaced_with(self.client.clone(), &self.namespace, &ar)
            }
        }

        fn message(e: kube::Error) -> String {
            match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            }
        }
    }

    impl Server for Remote {
        fn create(&mut self, obj: &Value) -> Result<(), String> {
            let api = self.api(obj);
            let obj: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
            self.rt.block_on(create(&api, &obj, true)).map(|_| ())
        }

        fn update(&mut self, obj: &Value, old: &Value) -> Result<(), String> {
            let api = self.api(obj);
            let old: DynamicObject = serde_json::from_value(old.clone()).unwrap();
            let mut new: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
            self.rt.block_on(async {
                let created = create(&api, &old, false).await?;
                new.metadata.resource_version = created.metadata.resource_version;
                let pp = PostParams { dry_run: true, ..Default::default() };
                let name = new.metadata.name.clone().unwrap_or_default();
                api.replace(&name, &pp, &new).await.map(|_| ()).map_err(Self::message)
            })
        }
    }

    /// A create, retried for up to 20 s while a freshly Established kind is not yet served (404).
    async fn create(api: &Api<DynamicObject>, obj: &DynamicObject, dry_run: bool) -> Result<DynamicObject, String> {
        let pp = PostParams { dry_run, ..Default::default() };
        let last = std::cell::Cell::new(None);
        poll_every(std::time::Duration::from_millis(100), std::time::Duration::from_secs(20), || async {
            let r = api.create(&pp, obj).await;
            let served = !matches!(&r, Err(kube::Error::Api(s)) if s.code == 404);
            last.set(Some(r));
            served
        })
        .await;
        last.take().ok_or_else(|| "no create was sent".to_string())?.map_err(Remote::message)
    }

    impl Drop for Remote {
        fn drop(&mut self) {
            let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
            let _ = self.rt.block_on(ns.delete(&self.namespace, &DeleteParams::default()));
        }
    }
}

/// Every example, valid and invalid, submitted to `server`: the list of those not handled as documented.
fn check_examples(server: &mut dyn Server) -> Vec<String> {
    let mut failures = vec![];

    let valid = yaml_files(&repo().join("examples"));
    assert!(valid.len() >= 5, "expected the example set under examples/");
    for path in &valid {
        for doc in documents(path) {
            if let Err(e) = server.create(&doc) {
                failures.push(format!("{}: {} {} refused: {e}", path.display(), doc["kind"], doc["metadata"]["name"]));
            }
        }
    }

    let invalid = yaml_files(&repo().join("examples/invalid"));
    assert!(invalid.len() >= 30, "expected the invalid example set under examples/invalid/");
    for path in &invalid {
        let expect = expectation(path);
        let docs = documents(path);
        assert_eq!(docs.len(), 1, "{}: one object per invalid example", path.display());
        match server.create(&docs[0]) {
            Ok(()) => failures.push(format!("{}: accepted, expected rejection with '{expect}'", path.display())),
            Err(e) if !e.contains(&expect) => failures.push(format!(
                "{}: rejected with\n    {e}\n  expected a message containing '{expect}'",
                path.display()
            )),
            Err(_) => {}
        }
    }

    let updates = yaml_files(&repo().join("examples/invalid/updates"));
    assert!(updates.len() >= 3, "expected the update examples under examples/invalid/updates/");
    for path in updates {
        let expect = expectation(&path);
        let docs = documents(&path);
        assert_eq!(docs.len(), 2, "{}: an update example holds the object and its update", path.display());
        if let Err(e) = server.create(&docs[0]) {
            failures.push(format!("{}: original refused: {e}", path.display()));
            continue;
        }
        match server.update(&docs[1], &docs[0]) {
            Ok(()) => failures.push(format!("{}: update accepted, expected rejection with '{expect}'", path.display())),
            Err(e) if !e.contains(&expect) => {
                failures.push(format!("{}: update rejected with\n    {e}\n  expected '{expect}'", path.display()))
            }
            Err(_) => {}
        }
    }
    failures
}

#[test]
fn examples_are_handled_as_documented_by_the_emulator() {
    let failures = check_examples(&mut Offline::new());
    assert!(failures.is_empty(), "{} example(s) not handled as documented:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn examples_are_handled_as_documented_by_a_real_api_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(client) = remote::real_client(&rt) else { return };
    let mut server = remote::Remote::connect(rt, client);
    let failures = check_examples(&mut server);
    assert!(failures.is_empty(), "{} example(s) not handled as documented:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_generated_crd_is_established_on_a_real_api_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(client) = remote::real_client(&rt) else { return };
    // What `karpenter-hub crds` prints (the hub's CRDs) and the committed test-only CRDs.
    let mut crds: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&crds::crd::render_all().unwrap()).unwrap();
    assert_eq!(crds.len(), 8, "the hub ships eight CRDs");
    crds.extend(crds::crd::testing_crds().into_iter().map(|f| f.crd));
    rt.block_on(async {
        remote::apply_crds(&client, &crds).await;
        // Established, and serving: a list of each kind answers.
        for crd in &crds {
            let v = crd.spec.versions.iter().find(|v| v.storage).unwrap();
            let gvk = kube::api::GroupVersionKind::gvk(&crd.spec.group, &v.name, &crd.spec.names.kind);
            let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(client.clone(), &ar);
            let served = || async { api.list(&Default::default()).await.is_ok() };
            if !poll_until(std::time::Duration::from_secs(20), served).await {
                let e = api.list(&Default::default()).await.err();
                panic!("{} is Established but not served: {e:?}", crd.metadata.name.clone().unwrap());
            }
        }
    });
}

#[test]
fn valid_examples_read_into_the_typed_api() {
    for path in yaml_files(&repo().join("examples")) {
        for doc in documents(&path) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let res = match kind.as_str() {
                "NodePool" => serde_json::from_value::<crds::NodePool>(doc).map(|_| ()),
                "NodeClaim" => serde_json::from_value::<crds::NodeClaim>(doc).map(|_| ()),
                "CleverNodeClass" => serde_json::from_value::<crds::CleverNodeClass>(doc).map(|_| ()),
                "FlavorCatalog" => serde_json::from_value::<crds::FlavorCatalog>(doc).map(|_| ()),
                "CleverOrganization" => serde_json::from_value::<crds::CleverOrganization>(doc).map(|_| ()),
                _ => Ok(()),
            };
            res.unwrap_or_else(|e| panic!("{}: {kind} does not read into the typed API: {e}", path.display()));
        }
    }
}

#[test]
fn committed_crds_are_up_to_date() {
    let dir = repo().join("crds");
    let files = crds::crd::hub_crds()
        .into_iter()
        .map(|f| (dir.join(&f.file_name), f))
        .chain(crds::crd::testing_crds().into_iter().map(|f| (dir.join("testing").join(&f.file_name), f)));
    for (path, file) in files {
        let committed = fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == crds::crd::render(&file.crd).unwrap(),
            "{} is stale: run `cargo run -p operator -- crds --out-dir crds` and commit the result",
            path.display()
        );
    }
    // And nothing else lies in crds/ that `kubectl apply -f crds/` would pick up.
    assert_eq!(yaml_files(&dir).len(), crds::crd::hub_crds().len());
}

#[test]
fn crds_command_prints_every_crd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_karpenter-hub")).arg("crds").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, crds::crd::render_all().unwrap());
    let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
    let names: Vec<_> = docs.iter().map(|d| d.metadata.name.clone().unwrap()).collect();
    assert_eq!(
        names,
        [
            "nodepools.karpenter.clever-cloud.com",
            "nodeclaims.karpenter.clever-cloud.com",
            "clevernodeclasses.karpenter.clever-cloud.com",
            "flavorcatalogs.karpenter.clever-cloud.com",
            "workloadclusters.karpenter.clever-cloud.com",
            "cleverorganizations.karpenter.clever-cloud.com",
            "capacitybuffers.karpenter.clever-cloud.com",
            "nodeoverlays.karpenter.clever-cloud.com"
        ]
    );
}
