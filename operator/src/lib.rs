//! The hub's library: everything `karpenter-hub` runs, in modules named for what they do, so that
//! integration tests and benchmarks drive the same code as the binary.

pub mod apierror;
pub mod batcher;
pub mod capacity;
pub mod conditions;
pub mod flavorcatalog;
pub mod gc;
pub mod hub;
pub mod kubeconfig;
pub mod launch;
pub mod leader;
pub mod lifecycle;
pub mod manifests;
pub mod metrics;
pub mod nodeclass;
pub mod nodepool;
pub mod ownership;
pub mod plan;
pub mod provisioning;
pub mod register;
pub mod registration;
pub mod registry;
pub mod reporting;
pub mod run;
pub mod sandbox;
pub mod termination;
