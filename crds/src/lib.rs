//! Clever Karpenter Hub's API: the types of the management-cluster resources (`NodePool`,
//! `NodeClaim`, `CleverNodeClass`, `FlavorCatalog`, `CapacityBuffer`, ...), the client-side model of CKE's `NodeGroup`,
//! the generated CRDs, the flavor catalogue and the drift hashes.
//!
//! Everything here is pure data and pure functions shared by the operator and the webhook: no
//! I/O, no clock, no logging.

pub mod admission;
pub mod capacitybuffer;
pub mod catalog;
pub mod common;
pub mod crd;
pub mod drift;
pub mod flavorcatalog;
pub mod labels;
pub mod nodeclaim;
pub mod nodeclass;
pub mod nodegroup;
pub mod nodepool;
pub mod organization;
pub mod overlay;
pub mod quantity;
pub mod selector;
pub mod validation;
pub mod workloadcluster;

pub use capacitybuffer::{CapacityBuffer, CapacityBufferSpec, CapacityBufferStatus};
pub use flavorcatalog::{FlavorCatalog, FlavorCatalogSpec, FlavorOverride};
pub use nodeclaim::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
pub use nodeclass::{CleverNodeClass, CleverNodeClassSpec, CleverNodeClassStatus};
pub use nodegroup::{NodeGroup, NodeGroupSpec, NodeGroupStatus};
pub use nodepool::{NodePool, NodePoolSpec, NodePoolStatus};
pub use organization::{CleverOrganization, CleverOrganizationSpec, CleverOrganizationStatus};
pub use overlay::{NodeOverlay, NodeOverlaySpec, NodeOverlayStatus};
pub use workloadcluster::{WorkloadCluster, WorkloadClusterSpec, WorkloadClusterStatus};
