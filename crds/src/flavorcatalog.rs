//! `FlavorCatalog`: per-namespace overrides and additions on top of the built-in CKE flavors.
//!
//! Owns the API shape and the checks a CRD schema can express (bounds, unique names, new flavors
//! complete). The merge itself and the checks a schema cannot express live in [`crate::catalog`];
//! this module does no merging.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Condition;

/// Built-in flavor names, as known to the schema's CEL rule. Must match [`crate::catalog::BUILTIN_FLAVORS`].
pub const BUILTIN_FLAVOR_NAMES: [&str; 6] = ["2XS", "XS", "S", "M", "L", "XL"];

/// Overrides and additions to the built-in CKE flavor catalogue, referenced by a `CleverNodeClass`
/// of the same namespace through `spec.flavorCatalogRef`.
// Repeated `type_ = ...` arguments of `printcolumn(...)` look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "karpenter.clever-cloud.com",
    version = "v1alpha1",
    kind = "FlavorCatalog",
    plural = "flavorcatalogs",
    namespaced,
    status = "FlavorCatalogStatus",
    shortname = "fc",
    category = "karpenter",
    doc = "FlavorCatalog overrides the sizing or price of built-in CKE flavors and declares new ones, for the CleverNodeClasses of its namespace that reference it.",
    printcolumn(
        name = "Flavors",
        type_ = "integer",
        json_path = ".status.flavorCount",
        description = "Flavors served by this catalogue (built-in plus new)"
    ),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct FlavorCatalogSpec {
    /// Flavors to override or add. An entry naming a built-in flavor (`2XS`, `XS`, `S`, `M`, `L`, `XL`) overrides
    /// only the fields it sets; any other name declares a new flavor and must set `cpu`, `memoryKi` and
    /// `priceHourly`. Entries are keyed by `name`, which must be unique.
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self.all(f, f.name in ['2XS', 'XS', 'S', 'M', 'L', 'XL'] || (has(f.cpu) && has(f.memoryKi) && has(f.priceHourly)))").message("a new flavor (a name other than 2XS, XS, S, M, L, XL) must set cpu, memoryKi and priceHourly"))]
    pub flavors: Vec<FlavorOverride>,
}

/// One flavor entry of a `FlavorCatalog`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorOverride {
    /// Flavor name exactly as the CKE NodeGroup API accepts it in `spec.flavor` (e.g. `XS`). It is also the
    /// value of the `node.kubernetes.io/instance-type` and `clever-cloud.com/flavor` node labels, so it must be a
    /// valid label value.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"))]
    pub name: String,
    /// Number of vCPUs of one node of this flavor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub cpu: Option<i64>,
    /// Kernel-visible memory capacity of one node, in KiB (as the Node reports it in `status.capacity.memory`).
    /// Must exceed the 100Mi (102400 KiB) the kubelet reserves on every CKE node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 17_179_869_184_i64))]
    pub memory_ki: Option<i64>,
    /// Price of one node of this flavor, in EUR per hour. 0 is allowed (e.g. prepaid capacity) but makes the
    /// flavor win every cheapest-first choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub price_hourly: Option<f64>,
}

/// Observed state of a `FlavorCatalog`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorCatalogStatus {
    /// Number of flavors served to the node classes that reference this catalogue (built-in plus new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor_count: Option<i32>,
    /// `Ready` is False with the offending entry and field when the catalogue cannot be used; the hub then serves
    /// the built-in catalogue only to the node classes referencing it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::common::conditions")]
    pub conditions: Vec<Condition>,
}
