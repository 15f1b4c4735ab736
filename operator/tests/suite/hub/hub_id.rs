//! The hub id a hub chooses without `--hub-id` (docs/hub.md, "The hub id"), on a real API server:
//! `karpenter-hub run` as the binary runs it, on three management planes in one (a namespace each,
//! its Leases and NodeClaims): where nothing ran under `default` it takes the Lease of the id
//! derived from the management cluster's identity; where the Lease `karpenter-hub-default` exists,
//! or a NodeClaim was launched under `default`, it keeps `default` and leads through that Lease.

use std::time::Duration;

use crds::NodeClaim;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Namespace};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use operator::{commands::run, decisions::ownership};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::{self, wait_for};

const UP: Duration = Duration::from_secs(60);

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    run: run::RunArgs,
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// The holder of Lease `name` in `ns`, once someone holds it.
async fn holder(client: &Client, ns: &str, name: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns).get_opt(name).await.unwrap()?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_hub_id_a_fresh_management_cluster_derives_its_id_and_one_that_ran_default_keeps_it() {
    let cp = envtest::shared_or_skip!("hub-id");
    let client = cp.client().await.unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for f in crds::crd::hub_crds() {
        crds.create(&PostParams::default(), &f.crd).await.unwrap();
    }
    wait_for("NodeClaims served", UP, || async {
        client
            .list_api_group_resources("karpenter.clever-cloud.com/v1alpha1")
            .await
            .is_ok_and(|s| s.resources.iter().any(|r| r.name == "nodeclaims"))
    })
    .await;
    let uid = common::management_cluster(&client).await;
    let derived = format!("m-{}", &uid.replace('-', "")[..12]);

    // Each case in a namespace of its own: its Leases, and the NodeClaims the hub serves there.
    let (fresh, leased, claimed) = ("hub-id-fresh", "hub-id-leased", "hub-id-claimed");
    for ns in [fresh, leased, claimed] {
        create_namespace(&client, ns).await;
    }
    // An install that ran under `default` and released its Lease (or whose old pods still lead).
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "karpenter-hub-default"},
        "spec": {"leaseDurationSeconds": 15},
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), leased).create(&PostParams::default(), &lease).await.unwrap();
    // A NodeClaim launched under `default`: its provider ID names the group `default` derives.
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": "default-old", "namespace": claimed},
        "spec": {"clusterName": "w0", "requirements": [], "resources": {},
                 "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}}
    }))
    .unwrap();
    let claims = Api::<NodeClaim>::namespaced(client.clone(), claimed);
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let group = ownership::nodegroup_name("default", claimed, "default-old");
    let status = json!({"status": {"providerID": format!("clevercloud://{group}")}});
    claims.patch_status("default-old", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let stop = CancellationToken::new();
    let mut hubs = Vec::new();
    for ns in [fresh, leased, claimed] {
        let args = [
            "karpenter-hub".to_string(),
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            "--metrics-addr=127.0.0.1:0".into(),
            format!("--leader-election-namespace={ns}"),
            format!("--namespace={ns}"),
        ];
        let args = <Cli as clap::Parser>::try_parse_from(args).unwrap().run;
        assert_eq!(args.hub_id, None);
        hubs.push(tokio::spawn(run::run(args, stop.clone())));
    }
    let lease_of = |id: &str| format!("karpenter-hub-{id}");
    for (ns, id) in [(fresh, derived.as_str()), (leased, "default"), (claimed, "default")] {
        wait_for(&format!("the hub in {ns} leading through {}", lease_of(id)), UP, || async {
            holder(&client, ns, &lease_of(id)).await.is_some()
        })
        .await;
    }
    // The hubs that kept `default` never took the derived id's Lease, nor the other its.
    let names = |ns: &'static str| {
        let client = client.clone();
        async move {
            let leases = Api::<Lease>::namespaced(client, ns).list(&Default::default()).await.unwrap().items;
            leases.into_iter().filter_map(|l| l.metadata.name).collect::<Vec<_>>()
        }
    };
    assert_eq!(names(fresh).await, [lease_of(&derived)]);
    assert_eq!(names(leased).await, [lease_of("default")]);
    assert_eq!(names(claimed).await, [lease_of("default")]);
    stop.cancel();
    for h in hubs {
        tokio::time::timeout(UP, h).await.unwrap().unwrap().unwrap();
    }
}
