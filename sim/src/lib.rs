//! The simulated world: what the hub's tests, benchmarks and `sandbox` run against when no real
//! Kubernetes or CKE is at hand. It must behave like kube-apiserver and CKE for everything the hub
//! relies on; the conformance suite keeps it honest.

pub mod apiserver;
pub mod cke;
pub mod clock;
pub mod qos;
/// The schema layer of the emulator: the `crd-schema` crate (the hub's `plan` uses it too).
pub use crd_schema as schema;
