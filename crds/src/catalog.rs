//! The flavor catalogue: the built-in CKE flavors and their prices, the merge of a `FlavorCatalog`
//! over a base catalogue, and the instance types the scheduler sees (capacity, overhead,
//! allocatable, labels, offerings), including their runtime self-correction from observed Nodes and
//! the synthesised types of flavors that left the catalogue.
//!
//! Owns the semantics of `clever-cloud.md` §3.10, §4 and §5 and the checks a CRD schema cannot
//! express. Must not: do I/O, read the clock, log, or panic on any input: a bad catalogue is an
//! error value or a warning string that the caller reports, never a crash (§5). The API shape of
//! `FlavorCatalog` lives in [`crate::flavorcatalog`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::flavorcatalog::{BUILTIN_FLAVOR_NAMES, FlavorOverride};
use crate::labels;
use crate::quantity::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS, Resources, format_bytes, format_count, format_millis_cpu};

/// Zone of every CKE node today.
pub const DEFAULT_ZONE: &str = "par";
/// The only capacity type CKE offers.
pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
/// Karpenter's spot capacity type (never offered by CKE; part of the worst-launch-price order).
pub const CAPACITY_TYPE_SPOT: &str = "spot";
/// Karpenter's reserved capacity type (never offered by CKE; part of the worst-launch-price order).
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";
/// Architecture of every CKE node.
pub const ARCH_AMD64: &str = "amd64";
/// Operating system of every CKE node.
pub const OS_LINUX: &str = "linux";
/// `clever-cloud.com/cluster-node-role` of the nodes the hub manages.
pub const NODE_ROLE_WORKER: &str = "worker";

/// Most entries a `FlavorCatalog` may list (mirrors the CRD's `maxItems`, which keeps CEL cost bounded).
pub const MAX_FLAVORS: usize = 64;
/// Longest flavor name: it is a label value.
pub const MAX_NAME_LEN: usize = 63;
/// Largest `cpu` of an override (mirrors the CRD's `maximum`).
pub const MAX_CPU: i64 = 1024;
/// Largest `memoryKi` of an override, 16 TiB (mirrors the CRD's `maximum`).
pub const MAX_MEMORY_KI: i64 = 17_179_869_184;
/// Largest `priceHourly` of an override, EUR per hour (mirrors the CRD's `maximum`).
pub const MAX_PRICE_HOURLY: f64 = 1000.0;
/// Observations of CPU or memory capacity further than this from the catalogue are rejected (§4).
pub const OBSERVATION_TOLERANCE_PERCENT: i64 = 25;

/// One flavor as served: sizing used for scheduling, price used for cheapest-first choices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flavor {
    /// Name, as CKE accepts it in a NodeGroup's `spec.flavor`.
    pub name: String,
    /// vCPUs of one node.
    pub cpu: i64,
    /// Kernel-visible memory capacity of one node, KiB.
    pub memory_ki: i64,
    /// EUR per hour.
    pub price_hourly: f64,
}

/// A row of the built-in table: a [`Flavor`] plus the nominal GB that only pricing uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinFlavor {
    /// Name.
    pub name: &'static str,
    /// vCPUs (documented).
    pub cpu: i64,
    /// Kernel-visible memory, KiB (measured for 2XS…M, estimated for L and XL).
    pub memory_ki: i64,
    /// Nominal memory in GB (10^9 bytes) the platform bills; never used for scheduling.
    pub nominal_gb: i64,
    /// Documented public-beta worker price, EUR per hour; equals [`price`] at [`Rates::DEFAULT`].
    pub price_hourly: f64,
}

impl BuiltinFlavor {
    /// The flavor as served by the built-in catalogue.
    pub fn to_flavor(&self) -> Flavor {
        Flavor {
            name: self.name.to_string(),
            cpu: self.cpu,
            memory_ki: self.memory_ki,
            price_hourly: self.price_hourly,
        }
    }

    /// The flavor priced at other rates (the price refresh of §6 builds its base this way).
    pub fn to_flavor_at(&self, rates: Rates) -> Flavor {
        Flavor { price_hourly: price(self.cpu, self.nominal_gb, rates), ..self.to_flavor() }
    }
}

/// The built-in catalogue, small to large: this order is the tie-break order (§4).
pub const BUILTIN_FLAVORS: [BuiltinFlavor; 6] = [
    BuiltinFlavor { name: "2XS", cpu: 4, memory_ki: 3_911_884, nominal_gb: 4, price_hourly: 0.0333 },
    BuiltinFlavor { name: "XS", cpu: 6, memory_ki: 7_937_580, nominal_gb: 8, price_hourly: 0.0611 },
    BuiltinFlavor { name: "S", cpu: 8, memory_ki: 11_957_148, nominal_gb: 12, price_hourly: 0.0889 },
    BuiltinFlavor { name: "M", cpu: 10, memory_ki: 15_988_992, nominal_gb: 16, price_hourly: 0.1167 },
    // L and XL: nominal GB × 999312 KiB, the kernel-visible ratio measured on M.
    BuiltinFlavor { name: "L", cpu: 12, memory_ki: 23_983_488, nominal_gb: 24, price_hourly: 0.1667 },
    BuiltinFlavor { name: "XL", cpu: 16, memory_ki: 31_977_984, nominal_gb: 32, price_hourly: 0.2222 },
];

/// The built-in row of a flavor name (case-sensitive, like the platform and the CRD's CEL rule).
pub fn builtin(name: &str) -> Option<&'static BuiltinFlavor> {
    BUILTIN_FLAVORS.iter().find(|f| f.name == name)
}

/// The kernel-visible KiB per nominal GB measured on `M` (15988992 / 16).
pub const KI_PER_NOMINAL_GB: i64 = 999_312;

/// The nominal GB (10^9 bytes) Clever Cloud counts a flavor's node as, against the quota and for
/// its price: the built-in row's for a built-in name, else its memory over the ratio measured on `M`,
/// rounded (a `FlavorCatalog` flavor has no nominal size of its own).
pub fn nominal_gb(name: &str, memory_ki: i64) -> i64 {
    match builtin(name) {
        Some(b) => b.nominal_gb,
        None => (memory_ki.max(0) + KI_PER_NOMINAL_GB / 2) / KI_PER_NOMINAL_GB,
    }
}

/// Platform rates used by the price formula.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// EUR per vCPU per hour (`kubernetes.node.vcpu`).
    pub vcpu_hourly: f64,
    /// EUR per nominal GB (10^9 bytes) per hour (`kubernetes.node.ram`).
    pub ram_gb_hourly: f64,
}

impl Rates {
    /// Public-beta rates: ~2 EUR per vCPU and ~4 EUR per GB per 720-hour month.
    pub const DEFAULT: Rates = Rates { vcpu_hourly: 0.002_777_777_77, ram_gb_hourly: 0.005_555_555_55 };
}

/// `round4(vcpu × vcpu_rate + nominal_gb × ram_rate)` (§4).
pub fn price(vcpu: i64, nominal_gb: i64, rates: Rates) -> f64 {
    round4(vcpu as f64 * rates.vcpu_hourly + nominal_gb as f64 * rates.ram_gb_hourly)
}

/// Rounds to 4 decimals, half away from zero, exactly as the spec writes it: the same expression
/// everywhere keeps prices bit-identical between the refresher, the tests and the docs.
pub fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// The per-node shape shared by every CKE flavor (measured, §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShape;

impl NodeShape {
    /// No CPU is reserved: allocatable CPU is every vCPU.
    pub const KUBE_RESERVED_CPU_MILLIS: i64 = 0;
    /// kube-reserved memory, 100Mi.
    pub const KUBE_RESERVED_MEMORY_KI: i64 = 102_400;
    /// Ephemeral-storage capacity of every node.
    pub const EPHEMERAL_STORAGE_KI: i64 = 40_971_488;
    /// Hard eviction threshold on ephemeral storage (10 %).
    pub const EVICTION_THRESHOLD_EPHEMERAL_KI: i64 = 4_097_149;
    /// Pods per node.
    pub const PODS: i64 = 110;

    /// Capacity of a node with this sizing (a negative sizing counts as zero, so allocatable can
    /// never exceed capacity).
    pub fn capacity(cpu: i64, memory_ki: i64) -> Resources {
        Resources {
            cpu_millis: cpu.max(0).saturating_mul(1000),
            memory_bytes: memory_ki.max(0).saturating_mul(1024),
            ephemeral_storage_bytes: Self::EPHEMERAL_STORAGE_KI * 1024,
            pods: Self::PODS,
        }
    }

    /// kube-reserved + system-reserved + eviction threshold, per resource.
    pub fn overhead() -> Resources {
        Resources {
            cpu_millis: Self::KUBE_RESERVED_CPU_MILLIS,
            memory_bytes: Self::KUBE_RESERVED_MEMORY_KI * 1024,
            ephemeral_storage_bytes: Self::EVICTION_THRESHOLD_EPHEMERAL_KI * 1024,
            pods: 0,
        }
    }
}

/// A `FlavorCatalog` the hub cannot use, naming the entry, the field and the fix.
///
/// `field` is `"name"`, `"cpu"`, `"memoryKi"`, `"priceHourly"`, or `"flavors"` for the list as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CatalogError {
    /// Index of the offending entry in `spec.flavors` (for a list-level error, the first entry concerned).
    pub index: usize,
    /// Name of the offending entry (may be empty or invalid: it is what the user wrote).
    pub name: String,
    /// The offending field.
    pub field: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field == "flavors" {
            write!(f, "spec.flavors: {}", self.message)
        } else if self.name.is_empty() {
            write!(f, "spec.flavors[{}]: {}: {}", self.index, self.field, self.message)
        } else {
            write!(f, "spec.flavors[{}] ({}): {}: {}", self.index, self.name, self.field, self.message)
        }
    }
}

fn error(index: usize, entry: &FlavorOverride, field: &'static str, message: String) -> CatalogError {
    CatalogError { index, name: entry.name.clone(), field, message }
}

/// A Kubernetes label value that is not empty: the name becomes the `instance-type` and `flavor` labels.
fn is_label_value(name: &str) -> bool {
    !name.is_empty() && crate::validation::label_value(name).is_ok()
}

/// Checks a `FlavorCatalog`'s `spec.flavors` (§5), first failure wins: the list, then each entry in
/// order, and within an entry `name`, `cpu`, `memoryKi`, `priceHourly`. Besides the schema's rules
/// (repeated here for the webhook and for stored objects that bypassed it), `memoryKi` must exceed
/// the 100Mi kube-reserved (else allocatable memory is 0) and `priceHourly` must be finite.
pub fn validate_overrides(overrides: &[FlavorOverride]) -> Result<(), CatalogError> {
    if overrides.is_empty() {
        return Err(CatalogError {
            index: 0,
            name: String::new(),
            field: "flavors",
            message: "the list is empty; list at least one flavor, e.g. `- {name: M, priceHourly: 0.1167}`, \
                      or remove the flavorCatalogRef from the CleverNodeClass to use the built-in catalogue"
                .to_string(),
        });
    }
    if let Some(extra) = overrides.get(MAX_FLAVORS) {
        return Err(CatalogError {
            index: MAX_FLAVORS,
            name: extra.name.clone(),
            field: "flavors",
            message: format!(
                "{} entries, at most {MAX_FLAVORS} are allowed; drop entries that repeat built-in values",
                overrides.len()
            ),
        });
    }
    for (index, entry) in overrides.iter().enumerate() {
        validate_entry(index, entry, &overrides[..index])?;
    }
    Ok(())
}

fn validate_entry(index: usize, entry: &FlavorOverride, earlier: &[FlavorOverride]) -> Result<(), CatalogError> {
    let name = entry.name.as_str();
    if name.is_empty() {
        return Err(error(
            index,
            entry,
            "name",
            "must not be empty; use the flavor name exactly as CKE spells it, e.g. name: XS".to_string(),
        ));
    }
    if !is_label_value(name) {
        return Err(error(
            index,
            entry,
            "name",
            format!(
                "{name:?} is not a valid label value (at most {MAX_NAME_LEN} characters: letters, digits, '-', '_' \
                 or '.', starting and ending with a letter or digit); use the flavor name exactly as CKE spells it, \
                 e.g. name: XS"
            ),
        ));
    }
    if let Some(first) = earlier.iter().position(|e| e.name == name) {
        return Err(error(
            index,
            entry,
            "name",
            format!("{name} is already listed at spec.flavors[{first}]; merge the two entries into one"),
        ));
    }

    let is_builtin = builtin(name).is_some();
    // A name differing from a built-in only by case is the likeliest reason a "new" flavor is incomplete.
    let case_hint = || {
        BUILTIN_FLAVOR_NAMES
            .iter()
            .find(|b| b.eq_ignore_ascii_case(name))
            .map(|b| {
                format!("; or, to override the built-in flavor {b}, spell it name: {b} (names are case-sensitive)")
            })
            .unwrap_or_default()
    };

    match entry.cpu {
        None if !is_builtin => {
            return Err(error(
                index,
                entry,
                "cpu",
                format!("a new flavor must set cpu (vCPUs per node), e.g. cpu: 4{}", case_hint()),
            ));
        }
        Some(cpu) if !(1..=MAX_CPU).contains(&cpu) => {
            return Err(error(
                index,
                entry,
                "cpu",
                format!("must be between 1 and {MAX_CPU} vCPUs per node, got {cpu}; e.g. cpu: 4"),
            ));
        }
        _ => {}
    }

    match entry.memory_ki {
        None if !is_builtin => {
            return Err(error(
                index,
                entry,
                "memoryKi",
                format!(
                    "a new flavor must set memoryKi (the node's kernel-visible memory in KiB), e.g. memoryKi: 3911884{}",
                    case_hint()
                ),
            ));
        }
        Some(memory) if memory <= NodeShape::KUBE_RESERVED_MEMORY_KI => {
            return Err(error(
                index,
                entry,
                "memoryKi",
                format!(
                    "must exceed {} (the 100Mi the kubelet reserves on every CKE node, which would leave no \
                     allocatable memory), got {memory}; give the node's kernel-visible memory in KiB, e.g. \
                     memoryKi: 3911884 for 4 GB",
                    NodeShape::KUBE_RESERVED_MEMORY_KI
                ),
            ));
        }
        Some(memory) if memory > MAX_MEMORY_KI => {
            return Err(error(
                index,
                entry,
                "memoryKi",
                format!(
                    "must be at most {MAX_MEMORY_KI} (16 TiB), got {memory}; the unit is KiB, e.g. memoryKi: 3911884"
                ),
            ));
        }
        _ => {}
    }

    match entry.price_hourly {
        None if !is_builtin => {
            return Err(error(
                index,
                entry,
                "priceHourly",
                format!("a new flavor must set priceHourly (EUR per hour), e.g. priceHourly: 0.05{}", case_hint()),
            ));
        }
        Some(p) if !p.is_finite() => {
            return Err(error(
                index,
                entry,
                "priceHourly",
                format!("must be a finite number of EUR per hour, got {p}; e.g. priceHourly: 0.05"),
            ));
        }
        Some(p) if p < 0.0 => {
            return Err(error(
                index,
                entry,
                "priceHourly",
                format!("must not be negative, got {p}; give EUR per hour (0 is allowed), e.g. priceHourly: 0.05"),
            ));
        }
        Some(p) if p > MAX_PRICE_HOURLY => {
            return Err(error(
                index,
                entry,
                "priceHourly",
                format!(
                    "must be at most {MAX_PRICE_HOURLY} EUR per hour, got {p}; the unit is EUR per hour, not per \
                     month, e.g. priceHourly: 0.05"
                ),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// A served catalogue: flavors in tie-break order, plus warnings for the caller to report.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Catalog {
    /// Flavors, unique names, each with `cpu > 0`, `memory_ki > 0` and a finite `price_hourly >= 0`.
    pub flavors: Vec<Flavor>,
    /// Things worth an event or a log line (a built-in brought back, an entry skipped); never errors.
    pub warnings: Vec<String>,
}

impl Catalog {
    /// The six built-in flavors at their documented prices.
    pub fn builtin() -> Catalog {
        Catalog { flavors: BUILTIN_FLAVORS.iter().map(BuiltinFlavor::to_flavor).collect(), warnings: Vec::new() }
    }

    /// A base catalogue served as is (no `FlavorCatalog`), with the same defence in depth as
    /// [`merge`]: repeated names and unusable sizings or prices are skipped with a warning.
    pub fn from_base(base: &[Flavor]) -> Catalog {
        let mut catalog = Catalog::default();
        let mut seen = BTreeSet::new();
        for flavor in base {
            catalog.push_base(flavor.clone(), &mut seen);
        }
        catalog
    }

    /// The flavor of that name.
    pub fn get(&self, name: &str) -> Option<&Flavor> {
        self.flavors.iter().find(|f| f.name == name)
    }

    /// One instance type per flavor, in catalogue order, each with one available on-demand
    /// offering in `zone` at the flavor's price.
    pub fn instance_types(&self, zone: &str) -> Vec<InstanceType> {
        self.flavors.iter().map(|f| InstanceType::from_flavor(f, zone)).collect()
    }

    /// Adds a base flavor unless its name was seen already (first wins).
    fn push_base(&mut self, flavor: Flavor, seen: &mut BTreeSet<String>) {
        if seen.contains(&flavor.name) {
            self.warnings.push(format!(
                "flavor {} is listed twice in the base catalogue; the first entry is served",
                flavor.name
            ));
            return;
        }
        seen.insert(flavor.name.clone());
        self.push_checked(flavor);
    }

    /// Defence in depth behind admission (§5): an entry that still ends up unusable is skipped,
    /// never served at 0 size or a negative price.
    fn push_checked(&mut self, flavor: Flavor) {
        let problem = if flavor.cpu <= 0 {
            Some(format!("cpu {} is not positive", flavor.cpu))
        } else if flavor.memory_ki <= 0 {
            Some(format!("memoryKi {} is not positive", flavor.memory_ki))
        } else if !(flavor.price_hourly.is_finite() && flavor.price_hourly >= 0.0) {
            Some(format!("priceHourly {} is not a finite non-negative number", flavor.price_hourly))
        } else {
            None
        };
        match problem {
            Some(problem) => self.warnings.push(format!("flavor {} skipped: {problem}", flavor.name)),
            None => self.flavors.push(flavor),
        }
    }
}

/// Why a node class is served the base catalogue instead of its `FlavorCatalog`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogProblem {
    /// The referenced catalogue does not exist (yet).
    Missing { name: String },
    /// It exists but fails the admission rules or the merge; every override is dropped.
    Invalid { name: String, reason: String },
}

impl fmt::Display for CatalogProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogProblem::Missing { name } => {
                write!(f, "FlavorCatalog {name} does not exist; the built-in catalogue is served until it does")
            }
            CatalogProblem::Invalid { name, reason } => write!(
                f,
                "FlavorCatalog {name} cannot be used ({reason}); the built-in catalogue is served until it is fixed"
            ),
        }
    }
}

/// The catalogue served to a node class (§5 "A bad catalogue never crashes the hub"): `base` with
/// the referenced `FlavorCatalog` merged on when it exists and passes the webhook's rules, else
/// `base` alone and the problem to report. One function for every caller, so the scheduling
/// decision and the launch always see the same flavors.
pub fn served(
    base: &Catalog,
    reference: Option<&str>,
    found: Option<&crate::FlavorCatalog>,
) -> (Catalog, Option<CatalogProblem>) {
    let Some(name) = reference else {
        return (base.clone(), None);
    };
    let Some(fc) = found else {
        return (base.clone(), Some(CatalogProblem::Missing { name: name.to_string() }));
    };
    if let Some(denial) = crate::admission::validate_flavor_catalog(fc, None).denial_message() {
        return (base.clone(), Some(CatalogProblem::Invalid { name: name.to_string(), reason: denial }));
    }
    match merge(&base.flavors, &fc.spec.flavors) {
        Ok(c) => (c, None),
        Err(e) => (base.clone(), Some(CatalogProblem::Invalid { name: name.to_string(), reason: e.to_string() })),
    }
}

/// Serves `base` with a `FlavorCatalog`'s `spec.flavors` applied (§5).
///
/// Validates first ([`validate_overrides`]); an invalid list is an error and the caller serves the
/// base alone (all overrides dropped). Each field comes from the override, else the base, else the
/// built-in seed; base flavors keep their order and come first, then flavors only the overrides
/// name, in override order. A built-in the base omits comes back with a warning.
pub fn merge(base: &[Flavor], overrides: &[FlavorOverride]) -> Result<Catalog, CatalogError> {
    validate_overrides(overrides)?;
    let mut catalog = Catalog::default();
    let mut seen = BTreeSet::new();
    for flavor in base {
        let merged = match overrides.iter().find(|o| o.name == flavor.name) {
            Some(o) => Flavor {
                name: flavor.name.clone(),
                cpu: o.cpu.unwrap_or(flavor.cpu),
                memory_ki: o.memory_ki.unwrap_or(flavor.memory_ki),
                price_hourly: o.price_hourly.unwrap_or(flavor.price_hourly),
            },
            None => flavor.clone(),
        };
        catalog.push_base(merged, &mut seen);
    }
    for (index, o) in overrides.iter().enumerate() {
        if seen.contains(&o.name) {
            continue;
        }
        let seed = builtin(&o.name);
        if seed.is_some() {
            catalog.warnings.push(format!(
                "spec.flavors[{index}] ({}): {} is a built-in flavor the platform no longer lists; it is served \
                 again (built-in values for unset fields) but CKE may reject NodeGroups using it: remove the \
                 entry if launches fail",
                o.name, o.name
            ));
        }
        // Validation guarantees a seed or all three fields; the fallback to 0 is only reachable if that
        // changes, and push_checked then skips the entry rather than serving it.
        let merged = Flavor {
            name: o.name.clone(),
            cpu: o.cpu.or(seed.map(|s| s.cpu)).unwrap_or(0),
            memory_ki: o.memory_ki.or(seed.map(|s| s.memory_ki)).unwrap_or(0),
            price_hourly: o.price_hourly.or(seed.map(|s| s.price_hourly)).unwrap_or(f64::NAN),
        };
        seen.insert(o.name.clone());
        catalog.push_checked(merged);
    }
    Ok(catalog)
}

/// A way to buy an instance type: (zone, capacity type) at a price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offering {
    /// `topology.kubernetes.io/zone` value.
    pub zone: String,
    /// `karpenter.sh/capacity-type` value.
    pub capacity_type: String,
    /// EUR per hour.
    pub price_hourly: f64,
    /// Whether launches may use it (false while marked out of capacity, or never for synthesised types).
    pub available: bool,
}

/// A flavor as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceType {
    /// Flavor name.
    pub name: String,
    /// What the node has (NodePool limits compare with this).
    pub capacity: Resources,
    /// What the node keeps for itself: kube-reserved, system-reserved, eviction thresholds.
    pub overhead: Resources,
    /// What pods may request in total: capacity − overhead, floored at 0.
    pub allocatable: Resources,
    /// Single-valued requirements of the type (§4 "Instance-type requirements").
    pub labels: BTreeMap<String, String>,
    /// Ways to launch it.
    pub offerings: Vec<Offering>,
    /// Describes a live node whose flavor left the catalogue (§3.10); never offered for launches.
    pub synthesized: bool,
    /// Extended resources a node of the flavor offers (`nvidia.com/gpu: 1`), capacity and
    /// allocatable alike (nothing is reserved of them): none in the catalogue, NodeOverlays'
    /// `capacity` adds them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, i64>,
}

/// Why a Node's reported capacity was not applied to its flavor's instance type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObservationError {
    /// CPU or memory capacity is too far from the catalogue to be the same flavor.
    #[error(
        "a node of flavor {flavor} reports {resource} capacity {observed}, more than {OBSERVATION_TOLERANCE_PERCENT} % \
         away from the catalogue's {expected}; observation not applied. Check the node's clever-cloud.com/flavor \
         label, or correct the flavor's sizing in the FlavorCatalog"
    )]
    OutOfRange {
        /// Flavor name.
        flavor: String,
        /// `cpu` or `memory`.
        resource: &'static str,
        /// Reported capacity, canonical quantity.
        observed: String,
        /// Catalogue capacity, canonical quantity.
        expected: String,
    },
    /// A reported quantity is negative.
    #[error(
        "a node of flavor {flavor} reports a negative {resource} {kind} ({value}); observation not applied. The \
         node's status is corrupt: check the kubelet"
    )]
    Negative {
        /// Flavor name.
        flavor: String,
        /// Resource name.
        resource: &'static str,
        /// `capacity` or `allocatable`.
        kind: &'static str,
        /// Reported quantity, canonical.
        value: String,
    },
    /// Allocatable above capacity: no kubelet reports that.
    #[error(
        "a node of flavor {flavor} reports {resource} allocatable {allocatable} above its capacity {capacity}; \
         observation not applied. The node's status is inconsistent: check the kubelet"
    )]
    AllocatableExceedsCapacity {
        /// Flavor name.
        flavor: String,
        /// Resource name.
        resource: &'static str,
        /// Reported capacity, canonical.
        capacity: String,
        /// Reported allocatable, canonical.
        allocatable: String,
    },
}

/// Canonical text of one resource's quantity (millicores for `cpu`, bytes for the others).
type Format = fn(i64) -> String;

/// The four resources with their names and canonical formatter, to report per-resource problems.
fn per_resource(r: &Resources) -> [(&'static str, i64, Format); 4] {
    let [cpu, memory, ephemeral, pods] = as_array(*r);
    [
        (CPU, cpu, format_millis_cpu),
        (MEMORY, memory, format_bytes),
        (EPHEMERAL_STORAGE, ephemeral, format_bytes),
        (PODS, pods, format_count),
    ]
}

/// The resources in the order cpu, memory, ephemeral-storage, pods (per-resource loops).
fn as_array(r: Resources) -> [i64; 4] {
    [r.cpu_millis, r.memory_bytes, r.ephemeral_storage_bytes, r.pods]
}

/// Inverse of [`as_array`].
fn from_array([cpu_millis, memory_bytes, ephemeral_storage_bytes, pods]: [i64; 4]) -> Resources {
    Resources { cpu_millis, memory_bytes, ephemeral_storage_bytes, pods }
}

impl InstanceType {
    /// The instance type of a flavor with one available on-demand offering in `zone` (§4).
    pub fn from_flavor(flavor: &Flavor, zone: &str) -> InstanceType {
        let mut labels = base_labels(&flavor.name);
        labels.insert(labels::ZONE.to_string(), zone.to_string());
        labels.insert(labels::INSTANCE_CPU.to_string(), flavor.cpu.to_string());
        labels.insert(labels::INSTANCE_MEMORY.to_string(), flavor.memory_ki.to_string());
        let capacity = NodeShape::capacity(flavor.cpu, flavor.memory_ki);
        let overhead = NodeShape::overhead();
        InstanceType {
            name: flavor.name.clone(),
            capacity,
            overhead,
            allocatable: capacity.saturating_sub(overhead).floored_at_zero(),
            labels,
            offerings: vec![Offering {
                zone: zone.to_string(),
                capacity_type: CAPACITY_TYPE_ON_DEMAND.to_string(),
                price_hourly: flavor.price_hourly,
                available: true,
            }],
            synthesized: false,
            extended: BTreeMap::new(),
        }
    }

    /// Describes a live node whose flavor is no longer served (§3.10): built-in sizing when the
    /// name is a built-in, else zero CPU and memory (the node's observed capacity fills it in, see
    /// [`InstanceType::observe`]). No offering at all, so it is never chosen for a launch (at
    /// 0 EUR/h it would win every choice); no zone label, the node's own labels say where it is.
    pub fn synthesize(name: &str) -> InstanceType {
        let mut labels = base_labels(name);
        let capacity = match builtin(name) {
            Some(b) => {
                labels.insert(labels::INSTANCE_CPU.to_string(), b.cpu.to_string());
                labels.insert(labels::INSTANCE_MEMORY.to_string(), b.memory_ki.to_string());
                NodeShape::capacity(b.cpu, b.memory_ki)
            }
            // Zero size; ephemeral storage and pods are the same on every CKE node, so they stay.
            None => NodeShape::capacity(0, 0),
        };
        let overhead = NodeShape::overhead();
        InstanceType {
            name: name.to_string(),
            capacity,
            overhead,
            allocatable: capacity.saturating_sub(overhead).floored_at_zero(),
            labels,
            offerings: Vec::new(),
            synthesized: true,
            extended: BTreeMap::new(),
        }
    }

    /// Price: the cheapest available offering; `None` (+∞) when none is available.
    pub fn price(&self) -> Option<f64> {
        self.price_where(|_| true)
    }

    /// Price under requirements: the cheapest available offering that `compatible` accepts.
    pub fn price_where(&self, compatible: impl Fn(&Offering) -> bool) -> Option<f64> {
        self.offerings.iter().filter(|o| o.available && compatible(o)).map(|o| o.price_hourly).min_by(f64::total_cmp)
    }

    /// Worst launch price (karpenter-semantics §2.2): among available offerings, the first capacity
    /// type of reserved → spot → on-demand that has one, and the priciest offering of that type;
    /// `f64::INFINITY` when none, so "worst < budget" comparisons fail naturally.
    pub fn worst_launch_price(&self) -> f64 {
        self.worst_launch_price_where(|_| true)
    }

    /// Worst launch price restricted to the offerings `compatible` accepts.
    pub fn worst_launch_price_where(&self, compatible: impl Fn(&Offering) -> bool) -> f64 {
        let usable: Vec<&Offering> = self.offerings.iter().filter(|o| o.available && compatible(o)).collect();
        [CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT, CAPACITY_TYPE_ON_DEMAND]
            .iter()
            .find_map(|ct| {
                usable.iter().filter(|o| o.capacity_type == *ct).map(|o| o.price_hourly).max_by(f64::total_cmp)
            })
            .unwrap_or(f64::INFINITY)
    }

    /// Applies a worker Node's reported `status.capacity` / `status.allocatable` (§4 runtime
    /// self-correction). Zero CPU or zero memory capacity means the kubelet has not reported yet:
    /// ignored, `Ok` with nothing changed. Otherwise observed capacity wins per resource it reports
    /// (non-zero), overhead becomes observed capacity − observed allocatable for those resources
    /// (replacing the eviction threshold), and allocatable is recomputed. Labels keep the catalogue
    /// values. CPU or memory further than ±25 % from the catalogue (the `instance-cpu` /
    /// `instance-memory` labels) is rejected; a type without those labels (an unknown synthesised
    /// flavor) has no reference and accepts any size.
    pub fn observe(&mut self, capacity: Resources, allocatable: Resources) -> Result<(), ObservationError> {
        if capacity.cpu_millis == 0 || capacity.memory_bytes == 0 {
            return Ok(());
        }
        for (kind, reported) in [("capacity", &capacity), ("allocatable", &allocatable)] {
            for (resource, value, format) in per_resource(reported) {
                if value < 0 {
                    return Err(ObservationError::Negative {
                        flavor: self.name.clone(),
                        resource,
                        kind,
                        value: format(value),
                    });
                }
            }
        }
        for ((resource, cap, format), (_, alloc, _)) in
            per_resource(&capacity).into_iter().zip(per_resource(&allocatable))
        {
            if alloc > cap {
                return Err(ObservationError::AllocatableExceedsCapacity {
                    flavor: self.name.clone(),
                    resource,
                    capacity: format(cap),
                    allocatable: format(alloc),
                });
            }
        }
        let reference_cpu = self.label_i64(labels::INSTANCE_CPU).map(|c| c.saturating_mul(1000));
        let reference_memory = self.label_i64(labels::INSTANCE_MEMORY).map(|m| m.saturating_mul(1024));
        let checks: [(&'static str, Option<i64>, i64, Format); 2] = [
            (CPU, reference_cpu, capacity.cpu_millis, format_millis_cpu),
            (MEMORY, reference_memory, capacity.memory_bytes, format_bytes),
        ];
        for (resource, reference, observed, format) in checks {
            if let Some(reference) = reference
                && !within_tolerance(observed, reference)
            {
                return Err(ObservationError::OutOfRange {
                    flavor: self.name.clone(),
                    resource,
                    observed: format(observed),
                    expected: format(reference),
                });
            }
        }
        // Per resource: a reported (non-zero) capacity replaces the static one and brings its own
        // overhead; an unreported one keeps the static capacity and overhead.
        let mut new_capacity = as_array(self.capacity);
        let mut new_overhead = as_array(self.overhead);
        for (i, (cap, alloc)) in as_array(capacity).into_iter().zip(as_array(allocatable)).enumerate() {
            if cap != 0 {
                new_capacity[i] = cap;
                new_overhead[i] = cap - alloc; // both checked non-negative with alloc <= cap above
            }
        }
        self.capacity = from_array(new_capacity);
        self.overhead = from_array(new_overhead);
        self.allocatable = self.capacity.saturating_sub(self.overhead).floored_at_zero();
        Ok(())
    }

    fn label_i64(&self, key: &str) -> Option<i64> {
        self.labels.get(key).and_then(|v| v.parse::<i64>().ok()).filter(|v| *v > 0)
    }
}

/// `|observed − reference| ≤ 25 % of reference`, in integers (i128: no overflow for any i64 pair).
fn within_tolerance(observed: i64, reference: i64) -> bool {
    let difference = (i128::from(observed) - i128::from(reference)).abs();
    difference * 100 <= i128::from(reference) * i128::from(OBSERVATION_TOLERANCE_PERCENT)
}

/// Labels every CKE worker of that flavor carries, whatever its sizing and zone.
fn base_labels(name: &str) -> BTreeMap<String, String> {
    [
        (labels::INSTANCE_TYPE, name),
        (labels::ARCH, ARCH_AMD64),
        (labels::OS, OS_LINUX),
        (labels::CAPACITY_TYPE, CAPACITY_TYPE_ON_DEMAND),
        (labels::CLEVER_FLAVOR, name),
        (labels::CLEVER_NODE_ROLE, NODE_ROLE_WORKER),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    fn fc(flavors: serde_json::Value) -> crate::FlavorCatalog {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1", "kind": "FlavorCatalog",
            "metadata": {"name": "fc", "namespace": "a"}, "spec": {"flavors": flavors}
        }))
        .unwrap()
    }

    #[test]
    fn served_merges_a_good_catalogue_and_falls_back_to_the_base_otherwise() {
        let base = Catalog::builtin();
        assert_eq!(served(&base, None, None), (base.clone(), None));
        let (c, p) = served(&base, Some("fc"), None);
        assert_eq!(c, base);
        assert_eq!(p, Some(CatalogProblem::Missing { name: "fc".into() }));
        let good = fc(serde_json::json!([{"name": "M", "priceHourly": 0.1}]));
        let (c, p) = served(&base, Some("fc"), Some(&good));
        assert_eq!(p, None);
        assert_eq!(c.get("M").unwrap().price_hourly, 0.1);
        // A new flavor without a price would enter at 0 EUR/h: the whole catalogue is refused.
        let bad = fc(serde_json::json!([{"name": "M", "priceHourly": 0.1}, {"name": "HUGE", "cpu": 64}]));
        let (c, p) = served(&base, Some("fc"), Some(&bad));
        assert_eq!(c, base, "every override is dropped, not just the bad entry");
        match p {
            Some(CatalogProblem::Invalid { name, reason }) => {
                assert_eq!(name, "fc");
                assert!(reason.contains("spec.flavors[1]"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    use super::*;
    use proptest::prelude::*;

    const KI: i64 = 1024;

    fn entry(name: &str, cpu: Option<i64>, memory_ki: Option<i64>, price_hourly: Option<f64>) -> FlavorOverride {
        FlavorOverride { name: name.to_string(), cpu, memory_ki, price_hourly }
    }

    fn names(catalog: &Catalog) -> Vec<&str> {
        catalog.flavors.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn builtin_names_match_the_schema() {
        let names: Vec<&str> = BUILTIN_FLAVORS.iter().map(|f| f.name).collect();
        assert_eq!(names, BUILTIN_FLAVOR_NAMES);
        assert_eq!(names, self::names(&Catalog::builtin()));
    }

    #[test]
    fn every_builtin_price_is_the_formula_at_default_rates() {
        for f in &BUILTIN_FLAVORS {
            assert_eq!(price(f.cpu, f.nominal_gb, Rates::DEFAULT), f.price_hourly, "{}", f.name);
            assert_eq!(f.to_flavor_at(Rates::DEFAULT), f.to_flavor());
        }
    }

    #[test]
    fn one_xs_is_cheaper_than_two_2xs() {
        let xs = builtin("XS").unwrap().price_hourly;
        let two_2xs = 2.0 * builtin("2XS").unwrap().price_hourly;
        assert!(xs < two_2xs);
        assert_eq!(round4(two_2xs), 0.0666);
    }

    #[test]
    fn round4_is_half_away_from_zero() {
        assert_eq!(round4(0.000_05), 0.0001);
        assert_eq!(round4(-0.000_05), -0.0001);
        assert_eq!(round4(0.123_44), 0.1234);
        assert_eq!(price(2, 1, Rates { vcpu_hourly: 0.01, ram_gb_hourly: 0.005 }), 0.025);
    }

    #[test]
    fn estimated_memory_uses_the_ratio_measured_on_m() {
        let m = builtin("M").unwrap();
        assert_eq!(m.memory_ki, 16 * 999_312);
        for name in ["L", "XL"] {
            let f = builtin(name).unwrap();
            assert_eq!(f.memory_ki, f.nominal_gb * 999_312, "{name}");
        }
    }

    #[test]
    fn allocatable_matches_the_spec_table() {
        let expected = [
            ("2XS", 4, 3_809_484),
            ("XS", 6, 7_835_180),
            ("S", 8, 11_854_748),
            ("M", 10, 15_886_592),
            ("L", 12, 23_881_088),
            ("XL", 16, 31_875_584),
        ];
        let types = Catalog::builtin().instance_types(DEFAULT_ZONE);
        assert_eq!(types.len(), expected.len());
        for (it, (name, cpu, memory_ki)) in types.iter().zip(expected) {
            assert_eq!(it.name, name);
            assert_eq!(
                it.allocatable,
                Resources {
                    cpu_millis: cpu * 1000,
                    memory_bytes: memory_ki * KI,
                    ephemeral_storage_bytes: 36_874_339 * KI,
                    pods: 110,
                },
                "{name}"
            );
            assert_eq!(it.capacity.cpu_millis, cpu * 1000);
            assert_eq!(it.capacity.ephemeral_storage_bytes, 40_971_488 * KI);
            assert_eq!(it.capacity.pods, 110);
            assert_eq!(it.overhead, NodeShape::overhead());
            assert!(!it.synthesized);
        }
        assert_eq!(NodeShape::overhead().memory_bytes, 100 * 1024 * 1024);
    }

    #[test]
    fn instance_types_carry_exactly_the_spec_labels_and_one_offering() {
        let catalog = Catalog::builtin();
        let xs = catalog.instance_types("par").into_iter().find(|t| t.name == "XS").unwrap();
        let expected: BTreeMap<String, String> = [
            ("node.kubernetes.io/instance-type", "XS"),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/os", "linux"),
            ("topology.kubernetes.io/zone", "par"),
            ("karpenter.sh/capacity-type", "on-demand"),
            ("clever-cloud.com/flavor", "XS"),
            ("clever-cloud.com/cluster-node-role", "worker"),
            ("karpenter.clever-cloud.com/instance-cpu", "6"),
            ("karpenter.clever-cloud.com/instance-memory", "7937580"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(xs.labels, expected);
        assert_eq!(
            xs.offerings,
            vec![Offering {
                zone: "par".to_string(),
                capacity_type: "on-demand".to_string(),
                price_hourly: 0.0611,
                available: true,
            }]
        );
        assert_eq!(xs.price(), Some(0.0611));
        assert_eq!(xs.worst_launch_price(), 0.0611);
        let elsewhere = catalog.instance_types("b");
        assert!(elsewhere.iter().all(|t| t.labels["topology.kubernetes.io/zone"] == "b"));
        assert!(elsewhere.iter().all(|t| t.offerings[0].zone == "b"));
    }

    fn offering(capacity_type: &str, zone: &str, price_hourly: f64, available: bool) -> Offering {
        Offering { zone: zone.to_string(), capacity_type: capacity_type.to_string(), price_hourly, available }
    }

    #[test]
    fn price_is_the_cheapest_available_offering() {
        let mut it = InstanceType::from_flavor(&builtin("S").unwrap().to_flavor(), "a");
        it.offerings = vec![
            offering("on-demand", "a", 0.30, true),
            offering("on-demand", "b", 0.10, false),
            offering("on-demand", "c", 0.20, true),
        ];
        assert_eq!(it.price(), Some(0.20));
        assert_eq!(it.price_where(|o| o.zone == "a"), Some(0.30));
        assert_eq!(it.price_where(|o| o.zone == "b"), None);
        it.offerings.iter_mut().for_each(|o| o.available = false);
        assert_eq!(it.price(), None);
        assert_eq!(it.worst_launch_price(), f64::INFINITY);
    }

    #[test]
    fn worst_launch_price_takes_the_first_capacity_type_then_the_priciest() {
        let mut it = InstanceType::from_flavor(&builtin("S").unwrap().to_flavor(), "a");
        it.offerings = vec![
            offering("on-demand", "a", 0.05, true),
            offering("spot", "a", 0.10, true),
            offering("spot", "b", 0.20, true),
            offering("spot", "c", 0.90, false),
            offering("reserved", "a", 0.50, true),
            offering("something-else", "a", 9.0, true),
        ];
        assert_eq!(it.worst_launch_price(), 0.50);
        assert_eq!(it.worst_launch_price_where(|o| o.capacity_type != "reserved"), 0.20);
        assert_eq!(it.worst_launch_price_where(|o| o.capacity_type == "on-demand"), 0.05);
        assert_eq!(it.worst_launch_price_where(|o| o.zone == "z"), f64::INFINITY);
    }

    #[test]
    fn validation_rules_first_failure_wins() {
        let ok = entry("M", None, None, Some(0.1167));
        let cases: Vec<(Vec<FlavorOverride>, usize, &str, &str)> = vec![
            (vec![], 0, "flavors", "list at least one flavor"),
            (vec![ok.clone(); 65], 64, "flavors", "at most 64"),
            (vec![entry("", None, None, None)], 0, "name", "must not be empty"),
            (vec![entry("x y", None, None, None)], 0, "name", "not a valid label value"),
            (vec![entry("-XS", None, None, None)], 0, "name", "not a valid label value"),
            (vec![entry(&"A".repeat(64), Some(1), Some(200_000), Some(0.1))], 0, "name", "at most 63"),
            (vec![ok.clone(), entry("M", Some(2), None, None)], 1, "name", "already listed at spec.flavors[0]"),
            (vec![entry("XS", Some(0), None, None)], 0, "cpu", "between 1 and 1024"),
            (vec![entry("XS", Some(1025), None, None)], 0, "cpu", "between 1 and 1024"),
            (vec![entry("XS", None, Some(0), None)], 0, "memoryKi", "must exceed 102400"),
            (vec![entry("XS", None, Some(102_400), None)], 0, "memoryKi", "must exceed 102400"),
            (vec![entry("XS", None, Some(MAX_MEMORY_KI + 1), None)], 0, "memoryKi", "at most"),
            (vec![entry("XS", None, None, Some(-0.01))], 0, "priceHourly", "must not be negative"),
            (vec![entry("XS", None, None, Some(f64::NAN))], 0, "priceHourly", "finite"),
            (vec![entry("XS", None, None, Some(f64::INFINITY))], 0, "priceHourly", "finite"),
            (vec![entry("XS", None, None, Some(1000.5))], 0, "priceHourly", "not per month"),
            (vec![entry("NEW", None, Some(200_000), Some(0.1))], 0, "cpu", "a new flavor must set cpu"),
            (vec![entry("NEW", Some(2), None, Some(0.1))], 0, "memoryKi", "a new flavor must set memoryKi"),
            (vec![entry("NEW", Some(2), Some(200_000), None)], 0, "priceHourly", "a new flavor must set priceHourly"),
            // First failing entry wins, and within it the first failing field.
            (
                vec![ok.clone(), entry("NEW", Some(0), None, None), entry("", None, None, None)],
                1,
                "cpu",
                "between 1 and 1024",
            ),
        ];
        for (overrides, index, field, needle) in cases {
            let error = validate_overrides(&overrides).unwrap_err();
            assert_eq!((error.index, error.field), (index, field), "{error}");
            assert!(error.message.contains(needle), "{error}");
            assert!(error.to_string().contains(needle), "{error}");
        }
    }

    #[test]
    fn errors_name_the_entry_the_field_and_the_fix() {
        let overrides = [
            entry("M", None, None, Some(0.1167)),
            entry("XS", Some(6), None, None),
            entry("CUSTOM", Some(2), Some(2_097_152), None),
        ];
        let error = validate_overrides(&overrides).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.flavors[2] (CUSTOM): priceHourly: a new flavor must set priceHourly (EUR per hour), e.g. priceHourly: 0.05"
        );
        assert_eq!(error.name, "CUSTOM");
        let lowercase = validate_overrides(&[entry("xs", None, None, Some(0.05))]).unwrap_err();
        assert_eq!(lowercase.field, "cpu");
        assert!(lowercase.message.contains("spell it name: XS (names are case-sensitive)"), "{lowercase}");
        let empty = validate_overrides(&[]).unwrap_err();
        assert!(empty.to_string().starts_with("spec.flavors: the list is empty"), "{empty}");
        let unnamed = validate_overrides(&[entry("", None, None, None)]).unwrap_err();
        assert!(unnamed.to_string().starts_with("spec.flavors[0]: name: must not be empty"), "{unnamed}");
    }

    #[test]
    fn spec_examples_are_valid() {
        validate_overrides(&[entry("M", None, None, Some(0.1167))]).unwrap();
        validate_overrides(&[entry("CUSTOM", Some(2), Some(2_097_152), Some(0.01))]).unwrap();
        validate_overrides(&[entry("FREE", Some(1), Some(102_401), Some(0.0))]).unwrap();
        validate_overrides(&[entry("XL", None, None, None)]).unwrap();
        validate_overrides(&vec![entry("M", None, None, None); 1]).unwrap();
        let many: Vec<_> = (0..64).map(|i| entry(&format!("F{i}"), Some(1), Some(200_000), Some(0.1))).collect();
        validate_overrides(&many).unwrap();
    }

    #[test]
    fn merge_overrides_fields_and_keeps_order() {
        let base = Catalog::builtin().flavors;
        let merged = merge(
            &base,
            &[
                entry("CUSTOM", Some(2), Some(2_097_152), Some(0.01)),
                entry("M", None, None, Some(0.2)),
                entry("2XS", Some(5), Some(4_000_000), None),
                entry("BIG", Some(64), Some(200_000_000), Some(2.5)),
            ],
        )
        .unwrap();
        assert_eq!(names(&merged), ["2XS", "XS", "S", "M", "L", "XL", "CUSTOM", "BIG"]);
        assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
        let m = merged.get("M").unwrap();
        assert_eq!((m.cpu, m.memory_ki, m.price_hourly), (10, 15_988_992, 0.2));
        let xxs = merged.get("2XS").unwrap();
        assert_eq!((xxs.cpu, xxs.memory_ki, xxs.price_hourly), (5, 4_000_000, 0.0333));
        assert_eq!(
            merged.get("CUSTOM"),
            Some(&Flavor { name: "CUSTOM".to_string(), cpu: 2, memory_ki: 2_097_152, price_hourly: 0.01 })
        );
        let custom = merged.instance_types("par").into_iter().find(|t| t.name == "CUSTOM").unwrap();
        assert_eq!(custom.allocatable.memory_bytes, (2_097_152 - 102_400) * KI);
        assert_eq!(custom.labels["karpenter.clever-cloud.com/instance-memory"], "2097152");
        assert_eq!(custom.price(), Some(0.01));
    }

    #[test]
    fn merge_takes_the_base_over_the_seed() {
        // A refreshed base at other rates: fields the override leaves unset come from it, not the seed.
        let rates = Rates { vcpu_hourly: 0.003, ram_gb_hourly: 0.006 };
        let base: Vec<Flavor> = BUILTIN_FLAVORS.iter().map(|f| f.to_flavor_at(rates)).collect();
        let merged = merge(&base, &[entry("S", Some(9), None, None)]).unwrap();
        let s = merged.get("S").unwrap();
        assert_eq!((s.cpu, s.memory_ki, s.price_hourly), (9, 11_957_148, price(8, 12, rates)));
        assert_eq!(merged.get("XL").unwrap().price_hourly, price(16, 32, rates));
    }

    #[test]
    fn merge_brings_back_an_omitted_builtin_with_a_warning() {
        let base: Vec<Flavor> = Catalog::builtin().flavors.into_iter().filter(|f| f.name != "L").collect();
        let merged =
            merge(&base, &[entry("NEW", Some(1), Some(200_000), Some(0.0)), entry("L", None, None, Some(0.15))])
                .unwrap();
        assert_eq!(names(&merged), ["2XS", "XS", "S", "M", "XL", "NEW", "L"]);
        let l = merged.get("L").unwrap();
        assert_eq!((l.cpu, l.memory_ki, l.price_hourly), (12, 23_983_488, 0.15));
        assert_eq!(merged.warnings.len(), 1);
        assert!(merged.warnings[0].starts_with("spec.flavors[1] (L): "), "{}", merged.warnings[0]);
        assert!(merged.warnings[0].contains("may reject NodeGroups"), "{}", merged.warnings[0]);
        // Seed price when the override sets none.
        let merged = merge(&base, &[entry("L", None, None, None)]).unwrap();
        assert_eq!(merged.get("L").unwrap().price_hourly, 0.1667);
    }

    #[test]
    fn merge_rejects_an_invalid_catalogue_whole() {
        let error = merge(
            &Catalog::builtin().flavors,
            &[entry("M", None, None, Some(0.1)), entry("CUSTOM", Some(2), None, Some(0.1))],
        )
        .unwrap_err();
        assert_eq!((error.index, error.field), (1, "memoryKi"));
    }

    #[test]
    fn merge_skips_unusable_base_entries_as_defence_in_depth() {
        let mut base = Catalog::builtin().flavors;
        base.push(Flavor { name: "ZERO".to_string(), cpu: 0, memory_ki: 1, price_hourly: 0.1 });
        base.push(Flavor { name: "NEGATIVE".to_string(), cpu: 1, memory_ki: 1, price_hourly: -1.0 });
        base.push(Flavor { name: "NAN".to_string(), cpu: 1, memory_ki: 1, price_hourly: f64::NAN });
        base.push(Flavor { name: "XS".to_string(), cpu: 99, memory_ki: 99, price_hourly: 9.9 });
        let merged = merge(&base, &[entry("M", None, None, None)]).unwrap();
        assert_eq!(merged.flavors, Catalog::builtin().flavors);
        assert_eq!(merged.warnings.len(), 4, "{:?}", merged.warnings);
        assert_eq!(Catalog::from_base(&base).flavors, Catalog::builtin().flavors);
        // "New" is judged against the built-in names, like the CRD's CEL rule (a base only ever holds
        // built-ins): a complete override replaces the unusable base entry in place.
        let fixed = merge(&base, &[entry("ZERO", Some(1), Some(200_000), Some(0.1))]).unwrap();
        assert_eq!(names(&fixed), ["2XS", "XS", "S", "M", "L", "XL", "ZERO"]);
    }

    fn observed_xs() -> (Resources, Resources) {
        let capacity = Resources {
            cpu_millis: 6000,
            memory_bytes: 7_937_580 * KI,
            ephemeral_storage_bytes: 50 * (1 << 30),
            pods: 110,
        };
        let allocatable = Resources {
            cpu_millis: 5900,
            memory_bytes: 7_700_000 * KI,
            ephemeral_storage_bytes: 45 * (1 << 30),
            pods: 110,
        };
        (capacity, allocatable)
    }

    #[test]
    fn observation_replaces_static_figures_but_not_labels() {
        let mut it = InstanceType::from_flavor(&builtin("XS").unwrap().to_flavor(), "par");
        let labels = it.labels.clone();
        let (capacity, allocatable) = observed_xs();
        it.observe(capacity, allocatable).unwrap();
        assert_eq!(it.capacity, capacity);
        assert_eq!(it.allocatable, allocatable);
        assert_eq!(
            it.overhead,
            Resources { cpu_millis: 100, memory_bytes: 237_580 * KI, ephemeral_storage_bytes: 5 * (1 << 30), pods: 0 }
        );
        assert_eq!(it.labels, labels);
        assert_eq!(it.price(), Some(0.0611));
    }

    #[test]
    fn observation_keeps_static_figures_for_unreported_resources() {
        let mut it = InstanceType::from_flavor(&builtin("XS").unwrap().to_flavor(), "par");
        let before = it.clone();
        let (mut capacity, mut allocatable) = observed_xs();
        capacity.ephemeral_storage_bytes = 0;
        allocatable.ephemeral_storage_bytes = 0;
        it.observe(capacity, allocatable).unwrap();
        assert_eq!(it.capacity.ephemeral_storage_bytes, before.capacity.ephemeral_storage_bytes);
        assert_eq!(it.allocatable.ephemeral_storage_bytes, 36_874_339 * KI);
        assert_eq!(it.allocatable.memory_bytes, 7_700_000 * KI);
    }

    #[test]
    fn zero_cpu_or_memory_observations_are_ignored() {
        let mut it = InstanceType::from_flavor(&builtin("XS").unwrap().to_flavor(), "par");
        let before = it.clone();
        let (capacity, allocatable) = observed_xs();
        for zeroed in [Resources { cpu_millis: 0, ..capacity }, Resources { memory_bytes: 0, ..capacity }] {
            it.observe(zeroed, allocatable).unwrap();
            assert_eq!(it, before);
        }
    }

    #[test]
    fn implausible_observations_are_rejected_and_explained() {
        let fresh = InstanceType::from_flavor(&builtin("XS").unwrap().to_flavor(), "par");
        let (capacity, allocatable) = observed_xs();
        // Memory of an M on a node labelled XS: +100 %.
        let mut it = fresh.clone();
        let error = it.observe(Resources { memory_bytes: 15_988_992 * KI, ..capacity }, allocatable).unwrap_err();
        assert!(matches!(error, ObservationError::OutOfRange { resource: "memory", .. }));
        let message = error.to_string();
        assert!(message.contains("flavor XS"), "{message}");
        assert!(message.contains("15988992Ki") && message.contains("7937580Ki"), "{message}");
        assert_eq!(it, fresh);
        // ±25 % is inclusive: 6 vCPU → 7.5 accepted, 7.6 rejected; 4.5 accepted.
        let at = |cpu_millis| Resources { cpu_millis, ..capacity };
        let alloc = Resources { cpu_millis: 1000, ..allocatable };
        assert!(fresh.clone().observe(at(7500), alloc).is_ok());
        assert!(fresh.clone().observe(at(4500), alloc).is_ok());
        assert!(matches!(
            fresh.clone().observe(at(7600), alloc),
            Err(ObservationError::OutOfRange { resource: "cpu", .. })
        ));
        let error = fresh.clone().observe(capacity, Resources { pods: 111, ..allocatable }).unwrap_err();
        assert!(matches!(error, ObservationError::AllocatableExceedsCapacity { resource: "pods", .. }));
        let error =
            fresh.clone().observe(capacity, Resources { ephemeral_storage_bytes: -1, ..allocatable }).unwrap_err();
        assert!(error.to_string().contains("negative ephemeral-storage allocatable"), "{error}");
    }

    #[test]
    fn synthesized_types_describe_but_never_launch() {
        let m = InstanceType::synthesize("M");
        assert!(m.synthesized);
        assert!(m.offerings.is_empty());
        assert_eq!(m.price(), None);
        assert_eq!(m.worst_launch_price(), f64::INFINITY);
        let served = InstanceType::from_flavor(&builtin("M").unwrap().to_flavor(), "par");
        assert_eq!((m.capacity, m.allocatable), (served.capacity, served.allocatable));
        assert_eq!(m.labels["karpenter.clever-cloud.com/instance-cpu"], "10");
        assert!(!m.labels.contains_key("topology.kubernetes.io/zone"));

        let mut unknown = InstanceType::synthesize("GPU-XL");
        assert!(unknown.synthesized && unknown.offerings.is_empty());
        assert_eq!(unknown.labels["node.kubernetes.io/instance-type"], "GPU-XL");
        assert_eq!(unknown.labels["clever-cloud.com/flavor"], "GPU-XL");
        assert!(!unknown.labels.contains_key("karpenter.clever-cloud.com/instance-cpu"));
        assert_eq!((unknown.capacity.cpu_millis, unknown.capacity.memory_bytes), (0, 0));
        assert_eq!(unknown.allocatable.memory_bytes, 0);
        // No catalogue reference: any observed size is taken as is.
        let (capacity, allocatable) = observed_xs();
        let huge = Resources { cpu_millis: 64_000, ..capacity };
        unknown.observe(huge, allocatable).unwrap();
        assert_eq!(unknown.capacity, huge);
        assert_eq!(unknown.allocatable, allocatable);
        assert!(unknown.synthesized && unknown.offerings.is_empty());
    }

    fn arbitrary_name() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(BUILTIN_FLAVOR_NAMES.to_vec()).prop_map(str::to_string),
            1 => prop::sample::select(vec!["xs", "m", "Xl"]).prop_map(str::to_string),
            3 => "[A-Za-z0-9][-A-Za-z0-9_.]{0,6}[A-Za-z0-9]",
            1 => ".{0,4}",
            1 => Just(String::new()),
        ]
    }

    fn arbitrary_override() -> impl Strategy<Value = FlavorOverride> {
        (
            arbitrary_name(),
            prop::option::of(prop_oneof![4 => 1i64..=64, 1 => any::<i64>(), 1 => -2i64..2]),
            prop::option::of(prop_oneof![
                4 => 102_401i64..64_000_000,
                1 => any::<i64>(),
                1 => 0i64..=102_401,
            ]),
            prop::option::of(prop_oneof![
                4 => 0.0f64..2.0,
                1 => any::<f64>(),
                1 => prop::sample::select(vec![0.0, -0.0, -1e-9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1000.0]),
            ]),
        )
            .prop_map(|(name, cpu, memory_ki, price_hourly)| FlavorOverride {
                name,
                cpu,
                memory_ki,
                price_hourly,
            })
    }

    /// The built-in catalogue, or a subset of it in its order (a refresh that dropped flavors).
    fn arbitrary_base() -> impl Strategy<Value = Vec<Flavor>> {
        prop::collection::vec(any::<bool>(), 6)
            .prop_map(|keep| BUILTIN_FLAVORS.iter().zip(keep).filter(|(_, k)| *k).map(|(f, _)| f.to_flavor()).collect())
    }

    fn arbitrary_resources() -> impl Strategy<Value = Resources> {
        let quantity = || prop_oneof![3 => 0i64..100_000_000_000, 1 => any::<i64>()];
        (quantity(), quantity(), quantity(), quantity()).prop_map(|(c, m, e, p)| Resources {
            cpu_millis: c,
            memory_bytes: m,
            ephemeral_storage_bytes: e,
            pods: p,
        })
    }

    fn assert_allocatable_sane(it: &InstanceType) -> Result<(), TestCaseError> {
        prop_assert!(it.allocatable.fits(&it.capacity), "{:?}", it);
        prop_assert!(!it.allocatable.any_negative(), "{:?}", it);
        Ok(())
    }

    proptest! {
        #[test]
        fn merge_never_panics_and_serves_only_usable_unique_flavors(
            base in arbitrary_base(),
            overrides in prop::collection::vec(arbitrary_override(), 0..6),
        ) {
            let validated = validate_overrides(&overrides);
            let merged = merge(&base, &overrides);
            prop_assert_eq!(validated.is_ok(), merged.is_ok());
            if let Err(error) = &validated {
                prop_assert_eq!(Some(error), merged.as_ref().err());
            }
            if let Ok(catalog) = merged {
                let mut seen = BTreeSet::new();
                for f in &catalog.flavors {
                    prop_assert!(f.cpu > 0 && f.memory_ki > 0, "{:?}", f);
                    prop_assert!(f.price_hourly.is_finite() && f.price_hourly >= 0.0, "{:?}", f);
                    prop_assert!(seen.insert(f.name.clone()), "duplicate {}", f.name);
                }
                // Every base flavor and every override is served.
                prop_assert_eq!(catalog.flavors.len(), base.len() + overrides.iter().filter(|o| !base.iter().any(|b| b.name == o.name)).count());
                for it in catalog.instance_types(DEFAULT_ZONE) {
                    assert_allocatable_sane(&it)?;
                    prop_assert!(it.price().is_some());
                }
            }
        }

        #[test]
        fn valid_overrides_always_merge_in_order(
            base in arbitrary_base(),
            fields in prop::collection::btree_map(
                arbitrary_name().prop_filter("valid name", |n| is_label_value(n)),
                (1i64..=MAX_CPU, 102_401i64..=MAX_MEMORY_KI, 0.0f64..=MAX_PRICE_HOURLY),
                1..8,
            ),
        ) {
            let overrides: Vec<FlavorOverride> = fields
                .into_iter()
                .map(|(name, (cpu, memory_ki, price_hourly))| entry(&name, Some(cpu), Some(memory_ki), Some(price_hourly)))
                .collect();
            let merged = merge(&base, &overrides).unwrap();
            let in_base = |n: &str| base.iter().any(|b| b.name == n);
            let expected: Vec<&str> = base
                .iter()
                .map(|b| b.name.as_str())
                .chain(overrides.iter().map(|o| o.name.as_str()).filter(|n| !in_base(n)))
                .collect();
            prop_assert_eq!(names(&merged), expected);
            for o in &overrides {
                let f = merged.get(&o.name).unwrap();
                prop_assert_eq!((Some(f.cpu), Some(f.memory_ki), Some(f.price_hourly)), (o.cpu, o.memory_ki, o.price_hourly));
            }
            let brought_back = overrides.iter().filter(|o| builtin(&o.name).is_some() && !in_base(&o.name)).count();
            prop_assert_eq!(merged.warnings.len(), brought_back);
        }

        #[test]
        fn large_lists_never_panic(overrides in prop::collection::vec(arbitrary_override(), 60..70)) {
            prop_assert_eq!(validate_overrides(&overrides).is_ok(), merge(&Catalog::builtin().flavors, &overrides).is_ok());
        }

        #[test]
        fn an_empty_override_of_a_builtin_changes_nothing(
            base in arbitrary_base().prop_filter("a flavor to override", |b| !b.is_empty()),
            which in any::<prop::sample::Index>(),
        ) {
            let name = &which.get(&base).name;
            let merged = merge(&base, &[entry(name, None, None, None)]).unwrap();
            prop_assert_eq!(merged.flavors, base);
            prop_assert!(merged.warnings.is_empty());
        }

        #[test]
        fn allocatable_never_exceeds_capacity_nor_goes_negative(
            cpu in any::<i64>(),
            memory_ki in any::<i64>(),
            name in arbitrary_name(),
            capacity in arbitrary_resources(),
            allocatable in arbitrary_resources(),
        ) {
            let flavor = Flavor { name: name.clone(), cpu, memory_ki, price_hourly: 0.1 };
            for mut it in [InstanceType::from_flavor(&flavor, "par"), InstanceType::synthesize(&name)] {
                assert_allocatable_sane(&it)?;
                let before = it.clone();
                if it.observe(capacity, allocatable).is_err() {
                    prop_assert_eq!(&it, &before);
                }
                assert_allocatable_sane(&it)?;
                prop_assert_eq!(&it.labels, &before.labels);
            }
        }
    }
}
