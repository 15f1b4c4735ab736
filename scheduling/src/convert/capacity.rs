//! Existing capacity and what pools offer: a Node as existing capacity (its allocatable, taints,
//! whether it is initialized), an in-flight claim with no Node yet (sized by its smallest option),
//! leaving nodes, a pool's instance types (its node class's flavor catalogue), its limits and its
//! price ceiling (`karpenter.clever-cloud.com/price-per-hour`) with what its nodes cost.
//!
//! Owns the reading of Nodes, NodeClaims, NodePools and node classes. Must not read pods (that is
//! `spec`) nor link a claim to its Node (that is `build_input`).

use std::collections::BTreeMap;

use crds::catalog::{Catalog, InstanceType};
use crds::quantity::{Resources, parse_quantity};
use crds::{NodeClaim, NodePool, labels};
use k8s_openapi::api::core::v1::Node as K8sNode;

use super::spec::taint_from;
use super::{ConvertError, Snapshot, err};
use crate::model::{ExistingNode, Limits, Operator, price_micros};

pub(super) fn node_marked_for_deletion(n: &K8sNode) -> bool {
    n.metadata.deletion_timestamp.is_some()
        || n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == labels::DISRUPTED_TAINT && t.effect == "NoSchedule"))
}

fn extended_of(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    obj: &str,
    field: &str,
) -> Result<BTreeMap<String, i64>, ConvertError> {
    match list {
        None => Ok(BTreeMap::new()),
        Some(l) => crds::quantity::extended_of(l).map_err(|e| err(obj, field, e.to_string())),
    }
}

fn resources_of(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    obj: &str,
    field: &str,
) -> Result<Resources, ConvertError> {
    match list {
        None => Ok(Resources::ZERO),
        Some(l) => Resources::from_resource_list(l).map_err(|e| err(obj, field, e.to_string())),
    }
}

pub(super) fn node_from(
    n: &K8sNode,
    obj: &str,
    name: &str,
    pool: Option<String>,
    claim: Option<&NodeClaim>,
) -> Result<ExistingNode, ConvertError> {
    let lbls = n.metadata.labels.clone().unwrap_or_default();
    let status = n.status.as_ref();
    let capacity = resources_of(status.and_then(|s| s.capacity.as_ref()), obj, "status.capacity")?;
    let (allocatable, mut extended) = match status.and_then(|s| s.allocatable.as_ref()) {
        Some(a) => {
            (resources_of(Some(a), obj, "status.allocatable")?, extended_of(Some(a), obj, "status.allocatable")?)
        }
        None => (capacity, extended_of(status.and_then(|s| s.capacity.as_ref()), obj, "status.capacity")?),
    };
    let mut taints = Vec::new();
    for (i, t) in n.spec.as_ref().and_then(|s| s.taints.as_ref()).into_iter().flatten().enumerate() {
        taints.push(taint_from(t, obj, &format!("spec.taints[{i}]"))?);
    }
    let managed = pool.is_some();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True");
    let initialized = if managed { lbls.get(labels::INITIALIZED).is_some_and(|v| v == "true") } else { ready };
    // Until it is initialized, a managed node's device plugins may not have reported its extended
    // resources yet: its claim says what its flavor offers (upstream counts the claim's too).
    if managed
        && !initialized
        && let Some(c) = claim
    {
        let claimed =
            extended_of(c.status.as_ref().and_then(|s| s.allocatable.as_ref()), obj, "claim status.allocatable")?;
        for (k, v) in claimed {
            let e = extended.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    Ok(ExistingNode {
        name: name.to_string(),
        labels: lbls,
        taints,
        startup_taints: claim.map(|c| c.spec.startup_taints.clone()).unwrap_or_default(),
        allocatable,
        capacity,
        extended,
        pods: Vec::new(),
        managed,
        initialized,
        nodepool: pool,
        csi_limits: BTreeMap::new(),
    })
}

/// An in-flight claim (no Node yet): labels from its single-valued requirements, its own taints,
/// allocatable from its status or, before launch, the smallest of its options.
pub(super) fn in_flight(
    c: &NodeClaim,
    obj: &str,
    pool: Option<String>,
    types: Option<&[InstanceType]>,
    snapshot: &Snapshot,
) -> Result<ExistingNode, ConvertError> {
    let name = c.metadata.name.clone().ok_or_else(|| err(obj, "metadata.name", "missing"))?;
    let mut lbls: BTreeMap<String, String> = c.metadata.labels.clone().unwrap_or_default();
    for r in &c.spec.requirements {
        if r.operator == Operator::In && r.values.len() == 1 {
            lbls.insert(r.key.clone(), r.values[0].clone());
        }
    }
    lbls.insert(labels::HOSTNAME.to_string(), name.clone());
    let status = c.status.as_ref();
    let (mut capacity, mut allocatable) = (
        resources_of(status.and_then(|s| s.capacity.as_ref()), obj, "status.capacity")?,
        resources_of(status.and_then(|s| s.allocatable.as_ref()), obj, "status.allocatable")?,
    );
    let mut extended = extended_of(status.and_then(|s| s.allocatable.as_ref()), obj, "status.allocatable")?;
    if allocatable.is_zero() {
        let options = claim_options(c);
        let builtin;
        let types = match types {
            Some(t) => t,
            None => {
                builtin = Catalog::builtin().instance_types(snapshot.zone());
                builtin.as_slice()
            }
        };
        let smallest = types
            .iter()
            .filter(|t| options.contains(&t.name))
            .min_by_key(|t| (t.allocatable.cpu_millis, t.allocatable.memory_bytes));
        if let Some(t) = smallest {
            allocatable = t.allocatable;
            capacity = t.capacity;
            extended = t.extended.clone();
            for (k, v) in &t.labels {
                lbls.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    Ok(ExistingNode {
        name,
        labels: lbls,
        taints: c.spec.taints.clone(),
        startup_taints: c.spec.startup_taints.clone(),
        allocatable,
        capacity,
        extended,
        pods: Vec::new(),
        managed: true,
        initialized: false,
        nodepool: pool,
        csi_limits: BTreeMap::new(),
    })
}

/// The instance types of a pool (its node class's catalogue) and the class's node labels.
pub(super) fn pool_types(
    p: &NodePool,
    obj: &str,
    snapshot: &Snapshot,
    notes: &mut Vec<String>,
) -> (Vec<InstanceType>, BTreeMap<String, String>) {
    let ns = p.metadata.namespace.as_deref();
    let class_name = &p.spec.template.spec.node_class_ref.name;
    let class = snapshot.node_classes.iter().find(|c| {
        c.metadata.name.as_deref() == Some(class_name.as_str())
            && (ns.is_none() || c.metadata.namespace.as_deref() == ns || c.metadata.namespace.is_none())
    });
    let Some(class) = class else {
        notes.push(format!("{obj}: CleverNodeClass {class_name} not found; the built-in flavors are used"));
        return (overlaid(p, snapshot, Catalog::builtin().instance_types(snapshot.zone())), BTreeMap::new());
    };
    let reference = class.spec.flavor_catalog_ref.as_ref().map(|r| r.name.as_str());
    let found = reference.and_then(|name| {
        snapshot.flavor_catalogs.iter().find(|f| {
            f.metadata.name.as_deref() == Some(name)
                && (ns.is_none() || f.metadata.namespace.as_deref() == ns || f.metadata.namespace.is_none())
        })
    });
    let (catalog, problem) = crds::catalog::served(&Catalog::builtin(), reference, found);
    if let Some(problem) = problem {
        notes.push(format!("{obj}: {problem}"));
    }
    notes.extend(catalog.warnings.iter().map(|w| format!("{obj}: FlavorCatalog: {w}")));
    (overlaid(p, snapshot, catalog.instance_types(snapshot.zone())), class.spec.labels.clone())
}

/// `types` with the prices the snapshot's NodeOverlays of the pool's namespace give them.
fn overlaid(p: &NodePool, snapshot: &Snapshot, mut types: Vec<InstanceType>) -> Vec<InstanceType> {
    let ns = p.metadata.namespace.as_deref();
    let overlays: Vec<crds::NodeOverlay> = snapshot
        .node_overlays
        .iter()
        .filter(|o| ns.is_none() || o.metadata.namespace.is_none() || o.metadata.namespace.as_deref() == ns)
        .cloned()
        .collect();
    if overlays.is_empty() {
        return types;
    }
    crds::overlay::apply(&overlays, p.metadata.name.as_deref().unwrap_or_default(), p.template_labels(), &mut types);
    types
}

pub(super) fn limits_of(p: &NodePool, obj: &str) -> Result<Limits, ConvertError> {
    let mut l = Limits::default();
    // The price ceiling is no quantity: read by `price_limit_of`.
    for (k, q) in p.spec.limits.iter().flatten().filter(|(k, _)| k.as_str() != labels::PRICE_PER_HOUR) {
        let field = format!("spec.limits.{k}");
        let parsed = parse_quantity(q.0.trim()).map_err(|e| err(obj, &field, e.to_string()))?;
        match k.as_str() {
            "cpu" => l.cpu_millis = Some(parsed.as_millis()),
            "memory" => l.memory_bytes = Some(parsed.as_units()),
            "ephemeral-storage" => l.ephemeral_storage_bytes = Some(parsed.as_units()),
            "pods" => l.pods = Some(parsed.as_units()),
            "nodes" => l.nodes = Some(parsed.as_units()),
            other => {
                l.extended.insert(other.to_string(), parsed.as_units());
            }
        }
    }
    Ok(l)
}

/// The pool's price ceiling in micro-EUR per hour, when its limits set one.
pub(super) fn price_limit_of(p: &NodePool, obj: &str) -> Result<Option<i64>, ConvertError> {
    let Some(q) = p.spec.limits.as_ref().and_then(|l| l.get(labels::PRICE_PER_HOUR)) else { return Ok(None) };
    let field = format!("spec.limits.{}", labels::PRICE_PER_HOUR);
    crds::quantity::parse_price_micros(&q.0).map(Some).map_err(|e| err(obj, field, e.to_string()))
}

/// Instance types a pool's catalogue does not price.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .types.join(", "))]
pub(super) struct Unpriced {
    types: Vec<String>,
}

/// What a managed node or in-flight claim costs per hour against its pool's price ceiling, in
/// micro-EUR: its instance type's cheapest offering in the pool's catalogue; for a claim whose type
/// is not settled yet, its dearest option (it may launch any). `Err` names the types the catalogue
/// does not know.
pub(super) fn price_of(node: &ExistingNode, options: &[String], types: &[InstanceType]) -> Result<i64, Unpriced> {
    let price = |name: &str| {
        types
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.offerings.iter().map(|o| o.price_hourly).min_by(f64::total_cmp))
            .map(price_micros)
    };
    match node.labels.get(labels::INSTANCE_TYPE) {
        Some(t) => price(t).ok_or_else(|| Unpriced { types: vec![t.clone()] }),
        None => options.iter().filter_map(|o| price(o)).max().ok_or_else(|| Unpriced { types: options.to_vec() }),
    }
}

/// The instance types a claim may launch (its `In` requirement on the instance type).
pub(super) fn claim_options(c: &NodeClaim) -> Vec<String> {
    c.spec
        .requirements
        .iter()
        .filter(|r| r.key == labels::INSTANCE_TYPE && r.operator == Operator::In)
        .flat_map(|r| r.values.iter().cloned())
        .collect()
}
