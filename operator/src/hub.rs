//! The shared context of every controller in one hub process: the management client, the cluster
//! registry, the settings, the per-cluster capacity memory and the per-cluster launch gates.
//!
//! Owns: wiring and the persistence of [`CapacityState`] (one ConfigMap per workload cluster in the
//! registering namespace, so cool-downs and back-off survive restarts and leader changes).
//! Must not: contain decisions; those live in the pure modules the controllers call.

use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError},
    time::Duration,
};

use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::Mutex;

use crate::{
    capacity::{self, CapacityState},
    registry::{ClusterKey, Registry},
};

/// Field manager and event reporter name.
pub const MANAGER: &str = "karpenter-hub";
/// ConfigMap data key holding a cluster's [`CapacityState`] as JSON.
pub const CAPACITY_KEY: &str = "state";

/// Hub-wide settings (flags of `karpenter-hub run`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This hub's identity on NodeGroups (`karpenter.clever-cloud.com/hub`).
    pub hub_id: String,
    /// Zone of CKE's offerings (`par`).
    pub zone: String,
    /// `Launched` not True after this ⇒ the claim is deleted (5 min).
    pub launch_ttl: Duration,
    /// `Registered` not True after this ⇒ the claim is deleted (15 min).
    pub registration_ttl: Duration,
    /// How long a launch waits for CKE's verdict before going on optimistically (15 s).
    pub verdict_timeout: Duration,
    pub capacity: capacity::Policy,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            hub_id: "default".to_string(),
            zone: "par".to_string(),
            launch_ttl: Duration::from_secs(300),
            registration_ttl: Duration::from_secs(900),
            verdict_timeout: Duration::from_secs(15),
            capacity: capacity::Policy::default(),
        }
    }
}

/// Everything a controller needs. Cheap to share (`Arc`).
pub struct Hub {
    pub mgmt: Client,
    pub registry: Registry,
    pub settings: Settings,
    pub recorder: Recorder,
    capacity: std::sync::Mutex<BTreeMap<ClusterKey, CapacityState>>,
    gates: std::sync::Mutex<BTreeMap<ClusterKey, Arc<Mutex<()>>>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("settings", &self.settings).field("registry", &self.registry).finish()
    }
}

impl Hub {
    pub fn new(mgmt: Client, registry: Registry, settings: Settings) -> Arc<Self> {
        let recorder = Recorder::new(mgmt.clone(), Reporter { controller: MANAGER.to_string(), instance: None });
        Arc::new(Self {
            mgmt,
            registry,
            settings,
            recorder,
            capacity: std::sync::Mutex::new(BTreeMap::new()),
            gates: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// The launch gate of a cluster: CKE's quota engine judges concurrent creations together, so
    /// one NodeGroup at a time awaits its verdict per cluster; clusters never wait on each other.
    pub fn launch_gate(&self, key: &ClusterKey) -> Arc<Mutex<()>> {
        self.gates.lock().unwrap_or_else(PoisonError::into_inner).entry(key.clone()).or_default().clone()
    }

    /// The capacity memory of a cluster, loaded from the management cluster the first time.
    pub async fn capacity(&self, key: &ClusterKey) -> Result<CapacityState, kube::Error> {
        if let Some(s) = self.capacity.lock().unwrap_or_else(PoisonError::into_inner).get(key) {
            return Ok(s.clone());
        }
        let api: Api<ConfigMap> = Api::namespaced(self.mgmt.clone(), &key.namespace);
        let loaded = api
            .get_opt(&capacity_configmap(key))
            .await?
            .and_then(|cm| cm.data)
            .and_then(|d| d.get(CAPACITY_KEY).cloned())
            .and_then(|json| match serde_json::from_str::<CapacityState>(&json) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(cluster = %key, error = %e, "stored capacity state is unreadable; starting afresh");
                    None
                }
            })
            .unwrap_or_default();
        Ok(self.capacity.lock().unwrap_or_else(PoisonError::into_inner).entry(key.clone()).or_insert(loaded).clone())
    }

    /// Change a cluster's capacity memory and persist it before returning.
    pub async fn update_capacity(
        &self,
        key: &ClusterKey,
        now: Timestamp,
        change: impl FnOnce(&mut CapacityState),
    ) -> Result<CapacityState, kube::Error> {
        let mut state = self.capacity(key).await?;
        change(&mut state);
        state.prune(now);
        self.capacity.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), state.clone());
        let api: Api<ConfigMap> = Api::namespaced(self.mgmt.clone(), &key.namespace);
        let json = serde_json::to_string(&state).unwrap_or_else(|_| "{}".to_string());
        let name = capacity_configmap(key);
        let patch = serde_json::json!({ "data": { CAPACITY_KEY: json } });
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": name,
                        "labels": {
                            crate::registry::CLUSTER_NAME_LABEL: key.name,
                            "app.kubernetes.io/managed-by": MANAGER,
                        },
                    },
                    "data": { CAPACITY_KEY: json },
                }))
                .unwrap_or_default();
                match api.create(&PostParams::default(), &cm).await {
                    // Lost a race with another writer: apply our change on top of theirs.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    }
                    r => {
                        r?;
                    }
                }
            }
            Err(e) => return Err(e),
        }
        Ok(state)
    }

    /// Publish an event, logging (not failing) when the API refuses it.
    pub async fn event(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            tracing::debug!(error = %e, reason, "publishing an event failed");
        }
    }
}

/// Name of the ConfigMap holding a cluster's capacity memory.
pub fn capacity_configmap(key: &ClusterKey) -> String {
    format!("{}-karpenter-hub-capacity", key.name)
}
