//! Well-known label, annotation, taint and finalizer names. Karpenter's names are kept so that
//! workloads, dashboards and habits carry over; the hub's own live under `karpenter.clever-cloud.com/`.
//!
//! Names only: no logic.

/// API group of the hub's resources.
pub const GROUP: &str = "karpenter.clever-cloud.com";
/// Kind of the node class.
pub const NODECLASS_KIND: &str = "CleverNodeClass";

// Karpenter's well-known labels.
/// Owning NodePool (NodeClaim and Node).
pub const NODEPOOL: &str = "karpenter.sh/nodepool";
/// Capacity type (`on-demand`).
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// `true` once registration is done.
pub const REGISTERED: &str = "karpenter.sh/registered";
/// `true` once initialization is done.
pub const INITIALIZED: &str = "karpenter.sh/initialized";
/// `true` on a Node: registration copies no NodeClaim taints.
pub const DO_NOT_SYNC_TAINTS: &str = "karpenter.sh/do-not-sync-taints";
/// Pod/Node/NodeClaim annotation blocking voluntary disruption.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// NodeClaim annotation: RFC 3339 deadline after which pods are force-deleted.
pub const TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";
/// NodeClaim annotation: `"true"` when BestEffort lowered minValues.
pub const MIN_VALUES_RELAXED: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
/// Finalizer on managed NodeClaims and Nodes.
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
/// Taint marking a node that is leaving (`NoSchedule`, no value).
pub const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// Taint a node joins with until the hub registers it (`NoExecute`, no value).
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

// Kubernetes well-known labels.
/// Node name.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Instance type (the flavor name).
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Zone (`par`).
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Region.
pub const REGION: &str = "topology.kubernetes.io/region";
/// Architecture (`amd64`).
pub const ARCH: &str = "kubernetes.io/arch";
/// Operating system (`linux`).
pub const OS: &str = "kubernetes.io/os";
/// Set to `karpenter` when termination starts.
pub const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

// CKE's labels (stamped by the platform).
/// Flavor of a CKE node.
pub const CLEVER_FLAVOR: &str = "clever-cloud.com/flavor";
/// NodeGroup of a CKE node.
pub const CLEVER_NODEGROUP: &str = "clever-cloud.com/nodegroup";
/// `worker` or `control-plane`.
pub const CLEVER_NODE_ROLE: &str = "clever-cloud.com/cluster-node-role";

// The hub's own.
/// Hub identity on NodeGroups and Nodes.
pub const HUB: &str = "karpenter.clever-cloud.com/hub";
/// The management cluster whose hub made a NodeGroup: the UID of that cluster's `kube-system`
/// namespace (hub.md §5). Two management clusters whose hubs share a hub id never take each
/// other's groups for their own.
pub const MANAGEMENT_CLUSTER: &str = "karpenter.clever-cloud.com/management-cluster";
/// Namespace of the owning NodeClaim.
pub const NODECLAIM_NAMESPACE: &str = "karpenter.clever-cloud.com/nodeclaim-namespace";
/// Name of the owning NodeClaim.
pub const NODECLAIM: &str = "karpenter.clever-cloud.com/nodeclaim";
/// Name of the owning NodePool (on NodeGroups).
pub const HUB_NODEPOOL: &str = "karpenter.clever-cloud.com/nodepool";
/// Name of the CleverNodeClass (on NodeGroups).
pub const NODECLASS: &str = "karpenter.clever-cloud.com/nodeclass";
/// NodeClaim label naming its class (`karpenter.clever-cloud.com/clevernodeclass=<name>`).
pub const CLEVERNODECLASS: &str = "karpenter.clever-cloud.com/clevernodeclass";
/// Annotation on a provisioned NodeClaim: the digest of its cluster, pool and the UIDs of the pods
/// it was made for. A create answered 409 is the hub's own retried create only if the claim
/// holding the name carries the same digest.
pub const PROVISIONING_DIGEST: &str = "karpenter.clever-cloud.com/provisioning-digest";
/// Annotation with the owning NodeClaim's UID: the ownership proof.
pub const NODECLAIM_UID: &str = "karpenter.clever-cloud.com/nodeclaim-uid";
/// vCPUs of the flavor (well-known, usable in requirements).
pub const INSTANCE_CPU: &str = "karpenter.clever-cloud.com/instance-cpu";
/// Memory of the flavor in KiB (well-known, usable in requirements).
pub const INSTANCE_MEMORY: &str = "karpenter.clever-cloud.com/instance-memory";
/// Marker of the in-cluster Karpenter provider; the hub never sets it.
pub const IN_CLUSTER_MANAGED: &str = "karpenter.clever-cloud.com/managed";
/// Finalizer on CleverNodeClasses.
pub const NODECLASS_FINALIZER: &str = "karpenter.clever-cloud.com/termination";
/// NodePool limit key: a ceiling on the hourly price of the pool's nodes in the cluster, in EUR per
/// hour as a decimal string (`"0.5"`, `"12"`), not a resource (nothing compares it with capacity).
pub const PRICE_PER_HOUR: &str = "karpenter.clever-cloud.com/price-per-hour";

/// Label keys a pod may select and a pool may require although no NodePool lists them: their values
/// come from the instance types.
pub const WELL_KNOWN: &[&str] = &[
    NODEPOOL,
    CAPACITY_TYPE,
    INSTANCE_TYPE,
    ZONE,
    REGION,
    ARCH,
    OS,
    CLEVER_FLAVOR,
    CLEVER_NODE_ROLE,
    INSTANCE_CPU,
    INSTANCE_MEMORY,
];

/// Label key prefixes CKE refuses in a NodeGroup's `spec.labels`.
pub const CKE_RESERVED_PREFIXES: &[&str] = &["kubernetes.io/", "node.kubernetes.io/", "clever-cloud.com/"];
