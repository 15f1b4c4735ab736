//! Shared set-up of the simulated-CKE integration tests: an API emulator on a manual clock, the
//! simulated CKE on it, and bounded waits that advance simulated time instead of sleeping.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use crds::nodegroup::NodeGroup;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sim::apiserver::{ApiServer, ApiServerConfig};
use sim::cke::{SimCke, SimCkeConfig, SimCkeHandle};
use sim::clock::Clock;

/// Wall-time bound of every wait: generous for a loaded 2-core CI machine.
pub const WALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One simulated CKE cluster.
pub struct World {
    pub server: ApiServer,
    pub client: Client,
    pub clock: Clock,
    pub cke: SimCkeHandle,
}

impl World {
    /// A workload cluster (NodeGroup CRD preinstalled) on a manual clock, with a simulated CKE.
    pub async fn start(config: SimCkeConfig) -> World {
        let clock = Clock::manual_default();
        let server =
            ApiServer::start(ApiServerConfig::workload("cke").with_clock(clock.clone()).with_seed(config.seed))
                .await
                .expect("emulator starts");
        let client = server.client();
        let cke = SimCke::new(client.clone(), config).with_clock(clock.clone()).spawn();
        World { server, client, clock, cke }
    }

    pub fn groups(&self) -> Api<NodeGroup> {
        Api::all(self.client.clone())
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Polls `check` until it yields a value, advancing the simulated clock by `step` between
    /// polls (zero: wait for the API only). Panics after [`WALL_TIMEOUT`] of wall time.
    pub async fn until<T, F, Fut>(&self, what: &str, step: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + WALL_TIMEOUT;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
            self.clock.advance(step);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lets the simulator react to what happened so far without moving simulated time (for
    /// assertions that something did *not* happen).
    pub async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// Creates a NodeGroup as the hub does (`nodeCount: 1`).
    pub async fn create_group(&self, name: &str, flavor: &str, labels: Value, taints: Value) -> NodeGroup {
        let group: NodeGroup = serde_json::from_value(json!({
            "apiVersion": "api.clever-cloud.com/v1",
            "kind": "NodeGroup",
            "metadata": {"name": name, "labels": {"karpenter.clever-cloud.com/hub": "test"}},
            "spec": {"flavor": flavor, "nodeCount": 1, "labels": labels, "taints": taints},
        }))
        .unwrap();
        self.groups().create(&PostParams::default(), &group).await.expect("create NodeGroup")
    }

    /// Creates a plain NodeGroup; `None` when the API refused (e.g. an injected fault). An existing
    /// group of that name counts as created.
    pub async fn create_group_opt(&self, name: &str, flavor: &str) -> Option<()> {
        let group: NodeGroup = serde_json::from_value(json!({
            "apiVersion": "api.clever-cloud.com/v1",
            "kind": "NodeGroup",
            "metadata": {"name": name},
            "spec": {"flavor": flavor, "nodeCount": 1},
        }))
        .unwrap();
        match self.groups().create(&PostParams::default(), &group).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Some(()),
            Err(_) => None,
        }
    }

    /// The group, if it exists.
    pub async fn group(&self, name: &str) -> Option<NodeGroup> {
        self.groups().get_opt(name).await.expect("get NodeGroup")
    }

    /// The node, if it exists.
    pub async fn node(&self, name: &str) -> Option<Node> {
        self.nodes().get_opt(name).await.expect("get Node")
    }

    /// Names of all nodes, sorted.
    pub async fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .nodes()
            .list(&Default::default())
            .await
            .expect("list nodes")
            .items
            .iter()
            .map(|n| n.name_any())
            .collect();
        names.sort();
        names
    }

    /// Stops the simulator and the emulator.
    pub async fn stop(self) {
        self.cke.stop().await.expect("simulated CKE stops cleanly");
        self.server.shutdown().await;
    }
}

/// Whether a Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The taint keys of a Node.
pub fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}
