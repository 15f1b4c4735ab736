//! What the controllers run on: the shared hub context, the registry of workload-cluster
//! connections, leader election, sharding across replicas, metrics and the API-error and manifest
//! helpers. No decisions.

pub mod apierror;
pub mod hub;
pub mod kubeconfig;
pub mod leader;
pub mod manifests;
pub mod metrics;
pub mod registry;
pub mod sharding;
