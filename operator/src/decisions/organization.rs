//! An organisation's quota and cost ceiling across its clusters (fleet.md §4, §5): which clusters a
//! `CleverOrganization` selects, what each cluster uses as Clever Cloud counts it, the effective
//! quota (declared, or learned from a refusal), the headroom a round may plan with, and the
//! reservation ledger in the object's status that launches of every cluster and every replica
//! share.
//!
//! The ledger: each selected cluster has one entry, written only by the replica that serves the
//! cluster — its usage (every Node by its flavor's nominal size, control plane and foreign nodes
//! included, plus the hub's NodeGroups not yet a Node) and the reservations of its launches about
//! to be sent. A launch reserves before it creates; the write carries the resourceVersion it read,
//! so two launches (of any clusters, on any replicas) never both spend the same headroom: the
//! second's write fails and it judges again on the first's reservation. A reservation leaves the
//! ledger when its NodeGroup is counted in the entry's usage (same write), when CKE refuses it, or
//! after [`RESERVATION_TTL`] without its group (a launch that died before creating).
//!
//! Owns: those rules as functions of plain data. Must not: read caches, the clock or any cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crds::{
    CleverOrganization, FlavorCatalog, NodeGroup,
    catalog::{Catalog, Flavor, InstanceType, nominal_gb},
    labels,
    nodegroup::Verdict,
    organization::{CleverOrganizationStatus, ObservedQuota, OrganizationCluster, QuotaAmount, Reservation},
    quantity::{format_decimal_bytes, format_millis_cpu, parse_price_micros, parse_quantity},
    selector::ClusterSelector,
};
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

/// A reservation whose NodeGroup the cluster's count has not shown this long is dropped: its
/// launch died between the reservation and the create (a create CKE received shows within
/// seconds).
pub const RESERVATION_TTL: Duration = Duration::from_secs(120);

/// An entry unchanged this long is written again, so a reader can tell a served cluster's count
/// from an abandoned one.
pub const REFRESH: Duration = Duration::from_secs(60);

/// An entry no replica refreshed for this long belongs to a cluster no replica serves (unregistered,
/// or the hub is down for it): it is dropped. Its nodes may still exist; the hub says so in a log.
pub const STALE_AFTER: Duration = Duration::from_secs(600);

/// A cluster waiting for headroom this long ranks first, whatever its pools' weight: no cluster
/// starves behind higher-weight ones forever.
pub const STARVATION: Duration = Duration::from_secs(300);

/// A waiting mark not renewed this long is ignored (the cluster stopped asking).
pub const WAITING_TTL: Duration = Duration::from_secs(90);

/// The limit key of a cost ceiling (NodePool and organisation).
pub use crds::labels::PRICE_PER_HOUR;

/// An amount against the organisation: vCPU millicores, nominal memory bytes, catalogue price in
/// micro-EUR per hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub price_micros: i64,
}

impl std::ops::Add for Amount {
    type Output = Amount;
    fn add(self, o: Amount) -> Amount {
        Amount {
            cpu_millis: self.cpu_millis.saturating_add(o.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(o.memory_bytes),
            price_micros: self.price_micros.saturating_add(o.price_micros),
        }
    }
}

impl std::ops::AddAssign for Amount {
    fn add_assign(&mut self, o: Amount) {
        *self = *self + o;
    }
}

/// Ceilings per dimension; `None`: not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Ceiling {
    pub cpu_millis: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub price_micros: Option<i64>,
}

impl Ceiling {
    /// Whether anything is limited.
    pub fn is_limited(&self) -> bool {
        self.cpu_millis.is_some() || self.memory_bytes.is_some() || self.price_micros.is_some()
    }

    /// The smaller per dimension (a cluster in two organisations has the room both leave).
    #[must_use]
    pub fn min(&self, o: &Ceiling) -> Ceiling {
        Ceiling {
            cpu_millis: min_some(self.cpu_millis, o.cpu_millis),
            memory_bytes: min_some(self.memory_bytes, o.memory_bytes),
            price_micros: min_some(self.price_micros, o.price_micros),
        }
    }

    /// What is left after `used`, floored at zero.
    #[must_use]
    pub fn minus(&self, used: Amount) -> Ceiling {
        let left = |c: Option<i64>, u: i64| c.map(|c| c.saturating_sub(u).max(0));
        Ceiling {
            cpu_millis: left(self.cpu_millis, used.cpu_millis),
            memory_bytes: left(self.memory_bytes, used.memory_bytes),
            price_micros: left(self.price_micros, used.price_micros),
        }
    }

    /// `cpu=6, memory=8G, EUR/h=0.1000`: the limited dimensions.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = self.cpu_millis {
            parts.push(format!("cpu={}", format_millis_cpu(c)));
        }
        if let Some(m) = self.memory_bytes {
            parts.push(format!("memory={}", format_decimal_bytes(m)));
        }
        if let Some(p) = self.price_micros {
            parts.push(format!("EUR/h={}", format_price(p)));
        }
        parts.join(", ")
    }

    /// Whether `need` fits under the ceilings.
    pub fn admits(&self, need: Amount) -> bool {
        self.cpu_millis.is_none_or(|c| need.cpu_millis <= c)
            && self.memory_bytes.is_none_or(|c| need.memory_bytes <= c)
            && self.price_micros.is_none_or(|c| need.price_micros <= c)
    }
}

/// EUR per hour → micro-EUR per hour, as the scheduler counts prices; 0 for a price that is not a
/// finite positive number.
pub fn price_micros(eur: f64) -> i64 {
    if eur.is_finite() { scheduling::model::price_micros(eur).max(0) } else { 0 }
}

/// Micro-EUR per hour as EUR with four places (`0.1834`).
pub fn format_price(micros: i64) -> String {
    format!("{:.4}", micros as f64 / 1e6)
}

/// A decimal EUR amount (`2.5`, `12`, `0.0611`) in micro-EUR; `None` when it is not one.
pub fn parse_price(text: &str) -> Option<i64> {
    parse_price_micros(text).ok()
}

/// What one node of each flavor counts as, by name: vCPUs and nominal GB (the platform's sizes),
/// and the catalogue's price.
#[derive(Debug, Clone, Default)]
pub struct Sizer {
    by_name: BTreeMap<String, Amount>,
}

impl Sizer {
    /// Sizes of `flavors` (the built-in ones and the catalogues' of the organisation's namespaces:
    /// the platform sizes a name the same in every cluster; a later flavor of a name known already
    /// only sets the price when the earlier one had none).
    pub fn new<'a>(flavors: impl IntoIterator<Item = &'a Flavor>) -> Sizer {
        let mut by_name: BTreeMap<String, Amount> = BTreeMap::new();
        for f in flavors {
            let size = Amount {
                cpu_millis: f.cpu.saturating_mul(1000),
                memory_bytes: nominal_gb(&f.name, f.memory_ki).saturating_mul(1_000_000_000),
                price_micros: price_micros(f.price_hourly),
            };
            by_name.entry(f.name.clone()).or_insert(size);
        }
        Sizer { by_name }
    }

    /// Sizes of the built-in flavors, then of the catalogues' own (a catalogue that does not merge
    /// adds nothing: the hub serves the built-in one for it).
    pub fn of_catalogs<'a>(catalogs: impl IntoIterator<Item = &'a FlavorCatalog>) -> Sizer {
        let builtin = Catalog::builtin();
        let mut flavors: Vec<Flavor> = builtin.flavors.clone();
        for fc in catalogs {
            if let Ok(merged) = crds::catalog::merge(&builtin.flavors, &fc.spec.flavors) {
                flavors.extend(merged.flavors);
            }
        }
        Sizer::new(&flavors)
    }

    /// The size of one node of `flavor`, if known.
    pub fn of(&self, flavor: &str) -> Option<Amount> {
        self.by_name.get(flavor).copied()
    }

    /// Every known flavor's size.
    pub fn sizes(&self) -> &BTreeMap<String, Amount> {
        &self.by_name
    }

    /// What one node of an instance type counts: its catalogue vCPUs and memory (the
    /// `instance-cpu`/`instance-memory` labels, which observed capacities never change) as the
    /// platform sizes them, and its price.
    pub fn of_type(t: &InstanceType) -> Amount {
        let label = |k: &str| t.labels.get(k).and_then(|v| v.parse::<i64>().ok());
        let cpu = label(labels::INSTANCE_CPU).unwrap_or_else(|| (t.capacity.cpu_millis.max(0) + 999) / 1000);
        let memory_ki = label(labels::INSTANCE_MEMORY).unwrap_or(t.capacity.memory_bytes / 1024);
        Amount {
            cpu_millis: cpu.saturating_mul(1000),
            memory_bytes: nominal_gb(&t.name, memory_ki).saturating_mul(1_000_000_000),
            price_micros: price_micros(t.price().unwrap_or(0.0)),
        }
    }
}

/// One cluster as counted from the hub's caches of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    /// Nodes counted.
    pub nodes: i64,
    /// Nodes of an unknown flavor, counted by capacity.
    pub unknown: i64,
    /// Quota usage (nodes, and groups not yet a node) and the hub's price.
    pub usage: Amount,
    /// The hub's NodeGroups seen, refused ones included: their reservations are settled.
    pub groups: BTreeSet<String>,
}

/// Counts one cluster: every Node by its flavor's size (`clever-cloud.com/flavor`; unknown: its
/// capacity), every hub NodeGroup not refused that has no Node yet by its flavor's size; the price
/// of the hub's groups not refused (nodes and launches alike).
pub fn count_cluster<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    groups: impl IntoIterator<Item = &'a NodeGroup>,
    sizer: &Sizer,
) -> Counted {
    let mut out = Counted::default();
    let mut with_node: BTreeSet<String> = BTreeSet::new();
    for n in nodes {
        let l = n.metadata.labels.as_ref();
        if let Some(g) = l.and_then(|l| l.get(labels::CLEVER_NODEGROUP)) {
            with_node.insert(g.clone());
        }
        out.nodes += 1;
        match l.and_then(|l| l.get(labels::CLEVER_FLAVOR)).and_then(|f| sizer.of(f)) {
            Some(size) => {
                out.usage.cpu_millis = out.usage.cpu_millis.saturating_add(size.cpu_millis);
                out.usage.memory_bytes = out.usage.memory_bytes.saturating_add(size.memory_bytes);
            }
            None => {
                out.unknown += 1;
                let cap = n.status.as_ref().and_then(|s| s.capacity.as_ref());
                let q = |k: &str| cap.and_then(|c| c.get(k)).and_then(|q| parse_quantity(&q.0).ok());
                out.usage.cpu_millis = out.usage.cpu_millis.saturating_add(q("cpu").map_or(0, |q| q.as_millis()));
                out.usage.memory_bytes = out.usage.memory_bytes.saturating_add(q("memory").map_or(0, |q| q.as_units()));
            }
        }
    }
    for g in groups {
        let name = g.metadata.name.clone().unwrap_or_default();
        let refused = matches!(g.verdict(), Verdict::QuotaRejected(_) | Verdict::Failed { .. });
        out.groups.insert(name.clone());
        if refused {
            continue;
        }
        let Some(size) = sizer.of(&g.spec.flavor) else { continue };
        let count = i64::from(g.spec.node_count.clamp(0, 1000));
        out.usage.price_micros = out.usage.price_micros.saturating_add(size.price_micros.saturating_mul(count));
        if !with_node.contains(&name) {
            out.usage.cpu_millis = out.usage.cpu_millis.saturating_add(size.cpu_millis.saturating_mul(count));
            out.usage.memory_bytes = out.usage.memory_bytes.saturating_add(size.memory_bytes.saturating_mul(count));
        }
    }
    out
}

/// Whether the organisation takes in a cluster registered in a namespace labelled `ns_labels`, with
/// the cluster labels `cluster_labels`.
pub fn selects(
    org: &CleverOrganization,
    ns_labels: &BTreeMap<String, String>,
    cluster_labels: &BTreeMap<String, String>,
) -> bool {
    org.spec.namespace_selector.as_ref().is_none_or(|s| s.matches(ns_labels))
        && org.spec.cluster_selector.matches(cluster_labels)
}

/// Whether the organisation selects namespaces by label (the caller then reads namespace labels).
pub fn needs_namespace_labels(org: &CleverOrganization) -> bool {
    org.spec.namespace_selector.as_ref().is_some_and(|s| *s != ClusterSelector::default())
}

fn quantity_millis(text: Option<&String>) -> Option<i64> {
    text.and_then(|t| parse_quantity(t).ok()).map(|q| q.as_millis())
}

fn quantity_units(text: Option<&String>) -> Option<i64> {
    text.and_then(|t| parse_quantity(t).ok()).map(|q| q.as_units())
}

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The quota the hub enforces: per resource the smaller of the declared one and the one learned
/// from a refusal under the current spec; and the cost ceiling.
pub fn effective(org: &CleverOrganization) -> Ceiling {
    effective_with(org, org.status.as_ref())
}

/// [`effective`] with `status` standing for the organisation's (one being written).
fn effective_with(org: &CleverOrganization, status: Option<&CleverOrganizationStatus>) -> Ceiling {
    let declared = org.spec.quota.as_ref();
    let observed = status
        .and_then(|s| s.observed_quota.as_ref())
        .filter(|o| org.metadata.generation.is_none_or(|g| g == o.generation));
    Ceiling {
        cpu_millis: min_some(
            quantity_millis(declared.and_then(|q| q.cpu.as_ref())),
            quantity_millis(observed.and_then(|o| o.cpu.as_ref())),
        ),
        memory_bytes: min_some(
            quantity_units(declared.and_then(|q| q.memory.as_ref())),
            quantity_units(observed.and_then(|o| o.memory.as_ref())),
        ),
        price_micros: org.spec.limits.as_ref().and_then(|l| l.get(PRICE_PER_HOUR)).and_then(|q| parse_price(&q.0)),
    }
}

fn reservation_amount(r: &Reservation) -> Amount {
    Amount { cpu_millis: r.cpu_millis, memory_bytes: r.memory_bytes, price_micros: r.price_micros }
}

fn entry_usage(c: &OrganizationCluster) -> Amount {
    Amount { cpu_millis: c.cpu_millis, memory_bytes: c.memory_bytes, price_micros: c.price_micros }
}

/// Σ of the entries' usage and reservations, and Σ of the reservations alone.
pub fn used(status: Option<&CleverOrganizationStatus>) -> (Amount, Amount) {
    let mut total = Amount::default();
    let mut reserved = Amount::default();
    for c in status.map(|s| s.clusters.as_slice()).unwrap_or_default() {
        total += entry_usage(c);
        for r in &c.reservations {
            reserved += reservation_amount(r);
        }
    }
    (total + reserved, reserved)
}

/// What a round may still plan with across the organisation.
pub fn headroom(org: &CleverOrganization) -> Ceiling {
    effective(org).minus(used(org.status.as_ref()).0)
}

/// What a round of cluster `id` may plan with: the headroom less what is owed to the other
/// clusters waiting before it (all that wait, when it does not wait itself: the first in line
/// always sees its share, so the line moves).
pub fn headroom_for(org: &CleverOrganization, id: ClusterId<'_>, now: Timestamp) -> Ceiling {
    let Some(status) = org.status.as_ref() else { return headroom(org) };
    let mine = status.clusters.iter().find(|c| id.is(c)).and_then(|c| c.waiting.as_ref()).filter(|w| asking(w, now));
    let mut owed = Amount::default();
    for c in status.clusters.iter().filter(|c| !id.is(c)) {
        let Some(w) = c.waiting.as_ref().filter(|w| asking(w, now)) else { continue };
        if mine.is_none_or(|m| rank(w, now) < rank(m, now)) {
            owed += Amount { cpu_millis: w.cpu_millis, memory_bytes: w.memory_bytes, price_micros: 0 };
        }
    }
    effective(org).minus(used(Some(status)).0 + owed)
}

/// The organisation's room as a limit every pool of a round draws on (the scheduling core's
/// [`scheduling::model::SharedLimit`]), each instance type of `types` sized as the platform counts it.
pub fn shared_limit<'a>(
    organization: &str,
    left: Ceiling,
    types: impl IntoIterator<Item = &'a InstanceType>,
) -> scheduling::model::SharedLimit {
    let sizes = types
        .into_iter()
        .map(|t| {
            let a = Sizer::of_type(t);
            let draw = scheduling::model::Draw {
                cpu_millis: a.cpu_millis,
                memory_bytes: a.memory_bytes,
                price_micros: a.price_micros,
            };
            (t.name.clone(), draw)
        })
        .collect();
    scheduling::model::SharedLimit {
        name: format!("organisation {organization}"),
        pools: None,
        remaining: scheduling::model::Headroom {
            cpu_millis: left.cpu_millis,
            memory_bytes: left.memory_bytes,
            price_micros: left.price_micros,
        },
        sizes,
    }
}

/// `input` limited by the room each organisation leaves the cluster (`rooms`: name and room): a
/// shared limit every pool draws on, its instance types sized as the platform counts them.
/// Provisioning's rounds and the disruption loop's replacements plan with it.
pub fn limit_input(input: &mut scheduling::Input, rooms: &[(String, Ceiling)]) {
    for (name, left) in rooms {
        let types: Vec<&InstanceType> = input.pools.iter().flat_map(|p| &p.instance_types).collect();
        input.shared.push(shared_limit(name, *left, types));
    }
}

/// One cluster, as the ledger names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterId<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

impl ClusterId<'_> {
    fn is(&self, c: &OrganizationCluster) -> bool {
        c.namespace == self.namespace && c.name == self.name
    }
}

/// A launch about to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch<'a> {
    pub group: &'a str,
    pub flavor: &'a str,
    /// The claim's NodePool (a refusal marks it waiting).
    pub pool: &'a str,
    pub size: Amount,
    /// Weight of the claim's pool (fairness).
    pub weight: i32,
    /// When its pods started waiting (fairness), at the latest now.
    pub since: Timestamp,
}

/// Why a launch may not be sent now, in words naming the organisation and the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Short {
    pub message: String,
}

/// A time as the API server stores it (`metav1.Time` keeps whole seconds): what the ledger writes
/// is what it reads back, so an unchanged entry compares equal.
fn time(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

fn age(t: &Time, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(t.0)).unwrap_or(Duration::ZERO)
}

fn entry_mut<'s>(
    status: &'s mut CleverOrganizationStatus,
    id: ClusterId<'_>,
    now: Timestamp,
) -> &'s mut OrganizationCluster {
    let i = match status.clusters.iter().position(|c| id.is(c)) {
        Some(i) => i,
        None => {
            status.clusters.push(OrganizationCluster {
                namespace: id.namespace.to_string(),
                name: id.name.to_string(),
                nodes: 0,
                unknown_flavor_nodes: 0,
                cpu_millis: 0,
                memory_bytes: 0,
                price_micros: 0,
                reservations: Vec::new(),
                waiting: None,
                replica: None,
                observed_time: time(now),
            });
            status.clusters.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            status.clusters.iter().position(|c| id.is(c)).unwrap_or_default()
        }
    };
    &mut status.clusters[i]
}

/// Describes the shortfall in the organisation's words.
fn shortfall(org: &CleverOrganization, quota: Ceiling, used: Amount, need: Amount, owed: Amount) -> String {
    let name = org.metadata.name.as_deref().unwrap_or_default();
    let clusters = org
        .status
        .as_ref()
        .map(|s| {
            s.clusters.iter().filter(|c| entry_usage(c) != Amount::default() || !c.reservations.is_empty()).count()
        })
        .unwrap_or(0);
    let mut parts = Vec::new();
    let mut check = |what: &str, limit: Option<i64>, used: i64, need: i64, owed: i64, fmt: &dyn Fn(i64) -> String| {
        if let Some(limit) = limit
            && used.saturating_add(need).saturating_add(owed) > limit
        {
            let queue = if owed > 0 {
                format!(" (and {} is owed to clusters waiting before it)", fmt(owed))
            } else {
                String::new()
            };
            parts.push(format!(
                "{}/{} {what} in use across {clusters} cluster{}; this node needs {}{queue}",
                fmt(used),
                fmt(limit),
                if clusters == 1 { "" } else { "s" },
                fmt(need)
            ));
        }
    };
    let vcpu = |m: i64| format_millis_cpu(m);
    check("vCPU", quota.cpu_millis, used.cpu_millis, need.cpu_millis, owed.cpu_millis, &vcpu);
    check("memory", quota.memory_bytes, used.memory_bytes, need.memory_bytes, owed.memory_bytes, &|b| {
        format_decimal_bytes(b)
    });
    check("EUR/h", quota.price_micros, used.price_micros, need.price_micros, 0, &|p| format_price(p));
    format!("organisation {name}: {}", parts.join("; "))
}

/// A launch refused: why, and the status marking its cluster as waiting (fairness).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub short: Short,
    pub marked: CleverOrganizationStatus,
}

/// Whether cluster `id` has been counted in the ledger: a launch of a cluster whose own nodes do
/// not count yet would judge the headroom without them.
pub fn counted(org: &CleverOrganization, id: ClusterId<'_>) -> bool {
    org.status.as_ref().is_some_and(|s| s.clusters.iter().any(|c| id.is(c)))
}

/// Whether the launch may be sent: its reservation added to the cluster's entry (and the cluster's
/// waiting mark cleared), or why not with the status that marks the cluster as waiting (fairness).
/// A reservation already held for the group is not taken twice.
pub fn reserve(
    org: &CleverOrganization,
    id: ClusterId<'_>,
    launch: &Launch<'_>,
    replica: &str,
    now: Timestamp,
) -> Result<CleverOrganizationStatus, Box<Refused>> {
    let mut status = org.status.clone().unwrap_or_default();
    if status.clusters.iter().any(|c| id.is(c) && c.reservations.iter().any(|r| r.group == launch.group)) {
        return Ok(status);
    }
    let quota = effective(org);
    let (used, _) = used(Some(&status));
    let owed = owed_before(&status, id, launch, now);
    let fits = quota.admits(used + launch.size + Amount { price_micros: 0, ..owed });
    let entry = entry_mut(&mut status, id, now);
    entry.replica = (!replica.is_empty()).then(|| replica.to_string());
    if !fits {
        let want = Want {
            weight: launch.weight,
            since: launch.since,
            size: launch.size,
            pools: vec![launch.pool.to_string()],
        };
        entry.waiting = Some(waiting::waiting(entry.waiting.as_ref(), &want, now));
        summarize(org, &mut status);
        return Err(Box::new(Refused {
            short: Short { message: shortfall(org, quota, used, launch.size, owed) },
            marked: status,
        }));
    }
    entry.waiting = None;
    entry.reservations.push(Reservation {
        group: launch.group.to_string(),
        flavor: launch.flavor.to_string(),
        cpu_millis: launch.size.cpu_millis,
        memory_bytes: launch.size.memory_bytes,
        price_micros: launch.size.price_micros,
        time: time(now),
    });
    summarize(org, &mut status);
    Ok(status)
}

/// The status without the reservation of `group` (refused, or its create failed); `None` when it
/// holds none.
pub fn release(org: &CleverOrganization, id: ClusterId<'_>, group: &str) -> Option<CleverOrganizationStatus> {
    with_entry(org, id, |entry| {
        let before = entry.reservations.len();
        entry.reservations.retain(|r| r.group != group);
        entry.reservations.len() != before
    })
}

/// The status with cluster `id`'s existing entry changed by `change` (which says whether it
/// changed anything), summed up again; `None` without a status, an entry or a change.
fn with_entry(
    org: &CleverOrganization,
    id: ClusterId<'_>,
    change: impl FnOnce(&mut OrganizationCluster) -> bool,
) -> Option<CleverOrganizationStatus> {
    let mut status = org.status.clone()?;
    let entry = status.clusters.iter_mut().find(|c| id.is(c))?;
    if !change(entry) {
        return None;
    }
    summarize(org, &mut status);
    Some(status)
}

/// Reads a quota refusal's limit: `Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB`
/// (memory, bytes) or `... CPU max: limit = 40 | actual = 46` (vCPU millicores). The message is not
/// a contract: anything else reads as nothing.
pub fn limit_in_refusal(message: &str) -> Option<(bool, i64)> {
    let lower = message.to_ascii_lowercase();
    let memory = lower.contains("ram") || lower.contains("memory");
    let cpu = lower.contains("cpu");
    if memory == cpu {
        return None;
    }
    let rest = &lower[lower.find("limit")? + "limit".len()..];
    let rest = rest.trim_start().strip_prefix('=')?.trim_start();
    let number: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() || !(0.0..=1e9).contains(&value) {
        return None;
    }
    let unit = rest[number.len()..].trim_start();
    if memory {
        let scale = if unit.starts_with("gb") || unit.starts_with('g') { 1e9 } else { return None };
        Some((true, (value * scale).round() as i64))
    } else {
        Some((false, (value * 1000.0).round() as i64))
    }
}

/// The status with the quota a refusal revealed learned (`None` when the message says nothing new).
pub fn learn(
    org: &CleverOrganization,
    id: ClusterId<'_>,
    message: &str,
    now: Timestamp,
) -> Option<CleverOrganizationStatus> {
    let (memory, value) = limit_in_refusal(message)?;
    let generation = org.metadata.generation.unwrap_or_default();
    let mut status = org.status.clone().unwrap_or_default();
    let mut observed = status.observed_quota.clone().filter(|o| o.generation == generation).unwrap_or_else(|| {
        ObservedQuota { cpu: None, memory: None, cluster: String::new(), observed_time: time(now), generation }
    });
    let text = if memory { format_decimal_bytes(value) } else { format_millis_cpu(value) };
    let slot = if memory { &mut observed.memory } else { &mut observed.cpu };
    if slot.as_deref() == Some(text.as_str()) {
        return None;
    }
    *slot = Some(text);
    observed.cluster = format!("{}/{}", id.namespace, id.name);
    observed.observed_time = time(now);
    status.observed_quota = Some(observed);
    summarize(org, &mut status);
    Some(status)
}

/// The status with cluster `id`'s entry set to what was counted: reservations whose group the
/// count shows (or older than [`RESERVATION_TTL`]) settled. `None` when nothing changed and the
/// entry is younger than [`REFRESH`].
pub fn record(
    org: &CleverOrganization,
    id: ClusterId<'_>,
    counted: &Counted,
    replica: &str,
    now: Timestamp,
) -> Option<CleverOrganizationStatus> {
    let mut status = org.status.clone().unwrap_or_default();
    let existed = status.clusters.iter().any(|c| id.is(c));
    let entry = entry_mut(&mut status, id, now);
    let before = entry.clone();
    entry.nodes = counted.nodes;
    entry.unknown_flavor_nodes = counted.unknown;
    entry.cpu_millis = counted.usage.cpu_millis;
    entry.memory_bytes = counted.usage.memory_bytes;
    entry.price_micros = counted.usage.price_micros;
    entry.reservations.retain(|r| !counted.groups.contains(&r.group) && age(&r.time, now) < RESERVATION_TTL);
    if entry.waiting.as_ref().is_some_and(|w| !asking(w, now)) {
        entry.waiting = None;
    }
    entry.replica = (!replica.is_empty()).then(|| replica.to_string());
    if existed && *entry == before && age(&before.observed_time, now) < REFRESH {
        return None;
    }
    entry.observed_time = time(now);
    summarize(org, &mut status);
    Some(status)
}

/// The status without entries `keep` refuses (clusters this replica serves that left the
/// selection) and entries no replica refreshed for [`STALE_AFTER`]; `None` when none goes. Returns
/// the clusters dropped as stale too.
pub fn prune(
    org: &CleverOrganization,
    keep: impl Fn(&str, &str) -> bool,
    now: Timestamp,
) -> Option<(CleverOrganizationStatus, Vec<String>)> {
    let mut status = org.status.clone()?;
    let mut stale = Vec::new();
    let before = status.clusters.len();
    status.clusters.retain(|c| {
        let old = age(&c.observed_time, now) > STALE_AFTER;
        if old {
            stale.push(format!("{}/{}", c.namespace, c.name));
        }
        keep(&c.namespace, &c.name) && !old
    });
    if status.clusters.len() == before {
        return None;
    }
    summarize(org, &mut status);
    Some((status, stale))
}

/// The summary fields from the entries: clusters, used, reserved, the effective quota, the spend.
pub fn summarize(org: &CleverOrganization, status: &mut CleverOrganizationStatus) {
    let (total, reserved) = used(Some(status));
    let quota = effective_with(org, Some(status));
    status.cluster_count = i64::try_from(status.clusters.len()).unwrap_or(i64::MAX);
    status.used = Some(QuotaAmount {
        cpu: Some(format_millis_cpu(total.cpu_millis)),
        memory: Some(format_decimal_bytes(total.memory_bytes)),
    });
    status.reserved = Some(QuotaAmount {
        cpu: Some(format_millis_cpu(reserved.cpu_millis)),
        memory: Some(format_decimal_bytes(reserved.memory_bytes)),
    });
    status.quota = (quota.cpu_millis.is_some() || quota.memory_bytes.is_some()).then(|| QuotaAmount {
        cpu: quota.cpu_millis.map(format_millis_cpu),
        memory: quota.memory_bytes.map(format_decimal_bytes),
    });
    status.price_per_hour = Some(format_price(total.price_micros));
}

mod waiting;

pub use waiting::{RENEW, Want, held_back, mark, unmark, waits_for};
use waiting::{asking, owed_before, rank};

#[cfg(test)]
mod tests;
