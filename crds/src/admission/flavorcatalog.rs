//! Admission of a `FlavorCatalog`: the catalogue rules of [`crate::catalog::validate_overrides`]
//! (reused as is), plus what makes a valid catalogue a dangerous one: a free new flavor (denied), and
//! warnings for unit mistakes, sizes CKE will not honour, and prices that invert the size order.

use crate::admission::{Verdict, shorten};
use crate::catalog::{self, BUILTIN_FLAVORS, Catalog, NodeShape, builtin, validate_overrides};
use crate::flavorcatalog::{BUILTIN_FLAVOR_NAMES, FlavorCatalog, FlavorOverride};

/// Below this much memory per vCPU a flavor looks like a unit mistake (memoryKi given in MiB).
const MIN_MEMORY_KI_PER_CPU: i64 = 256 * 1024;
/// Above this much memory per vCPU a flavor looks like a unit mistake (memoryKi given in bytes).
const MAX_MEMORY_KI_PER_CPU: i64 = 64 * 1024 * 1024;
/// Allocatable memory below this leaves no room for DaemonSets and pods.
const MIN_ALLOCATABLE_MEMORY_KI: i64 = 512 * 1024;
/// CKE sizes a flavor; overrides further than this from the measured size are ignored by the
/// hub's runtime self-correction (`catalog::OBSERVATION_TOLERANCE_PERCENT`).
const SIZE_TOLERANCE_PERCENT: i64 = catalog::OBSERVATION_TOLERANCE_PERCENT;
/// A price this many times away from the platform's formula is probably in the wrong unit.
const PRICE_FACTOR: f64 = 10.0;
/// KiB of kernel-visible memory per nominal GB, as measured on `M` (clever-cloud.md §4).
const KI_PER_NOMINAL_GB: i64 = 999_312;
/// Price-order warnings kept (one per inverted pair would flood a large catalogue).
const MAX_ORDER_WARNINGS: usize = 3;

/// Validates a `FlavorCatalog` (create or update; the old object changes nothing today).
///
/// Denied: everything [`validate_overrides`] refuses (first failure, as the hub's merge does), and a
/// new flavor priced at 0 (it would win every cheapest-first choice; 0 stays allowed on built-ins,
/// e.g. for prepaid capacity, with a warning). Warned: new flavors (CKE must offer them), a name
/// differing from a built-in only by case, memory per vCPU or allocatable memory that suggests a
/// unit mistake, built-in sizes moved beyond the runtime tolerance, prices far from the platform's
/// formula, entries with no effect, and a bigger flavor costing less than a smaller one.
pub fn validate_flavor_catalog(new: &FlavorCatalog, _old: Option<&FlavorCatalog>) -> Verdict {
    let mut verdict = Verdict::default();
    let flavors = &new.spec.flavors;
    if let Err(error) = validate_overrides(flavors) {
        let field = if error.field == "flavors" {
            "spec.flavors".to_string()
        } else {
            format!("spec.flavors[{}].{}", error.index, error.field)
        };
        verdict.deny(field, error.message);
        return verdict;
    }
    for (index, entry) in flavors.iter().enumerate() {
        check_entry(&mut verdict, index, entry);
    }
    if verdict.is_allowed() {
        check_price_order(&mut verdict, flavors);
    }
    verdict
}

fn check_entry(verdict: &mut Verdict, index: usize, entry: &FlavorOverride) {
    let at = |field: &str| format!("spec.flavors[{index}].{field}");
    let name = entry.name.as_str();
    let seed = builtin(name);
    if seed.is_none() {
        if entry.price_hourly == Some(0.0) {
            verdict.deny(
                at("priceHourly"),
                format!(
                    "a new flavor must not be free: at 0 EUR/h {name} would win every cheapest-first choice; give its \
                     real hourly price, e.g. priceHourly: 0.05 (prepaid capacity: a small positive price keeps the order)"
                ),
            );
        }
        match BUILTIN_FLAVOR_NAMES.iter().find(|b| b.eq_ignore_ascii_case(name)) {
            Some(b) => verdict.warn(
                at("name"),
                format!(
                    "{name} differs from the built-in {b} only by case and is a new flavor; write {b} to override it"
                ),
            ),
            None => verdict.warn(
                at("name"),
                format!("{name} is a new flavor: CKE must offer it to your organisation, or its NodeGroups will fail"),
            ),
        }
    }
    // Sizing as served: the override, else the built-in (validation guarantees one of them for new flavors).
    let cpu = entry.cpu.or(seed.map(|s| s.cpu)).unwrap_or(0);
    let memory_ki = entry.memory_ki.or(seed.map(|s| s.memory_ki)).unwrap_or(0);
    if let Some(memory) = entry.memory_ki {
        let allocatable = memory - NodeShape::KUBE_RESERVED_MEMORY_KI;
        if allocatable < MIN_ALLOCATABLE_MEMORY_KI {
            verdict.warn(
                at("memoryKi"),
                format!("leaves {allocatable} KiB allocatable after the 100Mi kube-reserved: too little for pods"),
            );
        } else if cpu > 0 && !(MIN_MEMORY_KI_PER_CPU..=MAX_MEMORY_KI_PER_CPU).contains(&(memory / cpu)) {
            verdict.warn(
                at("memoryKi"),
                format!(
                    "{memory} KiB for {cpu} vCPU looks like a unit mistake: memoryKi is KiB (4 GB is about 3911884)"
                ),
            );
        }
    }
    if let Some(seed) = seed {
        for (field, given, measured) in [("cpu", entry.cpu, seed.cpu), ("memoryKi", entry.memory_ki, seed.memory_ki)] {
            let Some(given) = given else { continue };
            if (given - measured).abs() * 100 > measured * SIZE_TOLERANCE_PERCENT {
                verdict.warn(
                    at(field),
                    format!(
                        "{given} is more than {SIZE_TOLERANCE_PERCENT} % from {name}'s real {measured}: CKE decides the \
                         size, and nodes reporting it will not correct this override"
                    ),
                );
            }
        }
        if entry.cpu.is_none_or(|c| c == seed.cpu)
            && entry.memory_ki.is_none_or(|m| m == seed.memory_ki)
            && entry.price_hourly.is_none_or(|p| p == seed.price_hourly)
        {
            verdict.warn(at("name"), format!("every field equals the built-in {name}: the entry has no effect"));
        }
    }
    if let Some(price) = entry.price_hourly {
        let reference = match seed {
            Some(seed) => seed.price_hourly,
            None => {
                catalog::price(cpu, (memory_ki + KI_PER_NOMINAL_GB / 2) / KI_PER_NOMINAL_GB, catalog::Rates::DEFAULT)
            }
        };
        if price == 0.0 && seed.is_some() {
            verdict.warn(at("priceHourly"), format!("at 0 EUR/h {name} wins every cheapest-first choice"));
        } else if price > 0.0
            && reference > 0.0
            && !(reference / PRICE_FACTOR..=reference * PRICE_FACTOR).contains(&price)
        {
            verdict.warn(
                at("priceHourly"),
                format!(
                    "{price} is over {PRICE_FACTOR}x away from the expected ~{reference} EUR/h for this size: priceHourly \
                     is EUR per hour, not per month"
                ),
            );
        }
    }
}

/// Warns when, after the merge, a flavor at least as big as another in both cpu and memory (bigger in
/// one) costs less: the hub would never pick the smaller one, which is rarely what a price edit means.
fn check_price_order(verdict: &mut Verdict, overrides: &[FlavorOverride]) {
    let base: Vec<_> = BUILTIN_FLAVORS.iter().map(|f| f.to_flavor()).collect();
    let Ok(merged) = catalog::merge(&base, overrides) else { return };
    let touched = |name: &str| overrides.iter().position(|o| o.name == name);
    let mut warned = 0;
    for big in &merged.flavors {
        for small in &merged.flavors {
            let dominates = big.cpu >= small.cpu
                && big.memory_ki >= small.memory_ki
                && (big.cpu > small.cpu || big.memory_ki > small.memory_ki);
            if !dominates || big.price_hourly >= small.price_hourly {
                continue;
            }
            let Some(index) = touched(&big.name).or_else(|| touched(&small.name)) else { continue };
            if warned == MAX_ORDER_WARNINGS {
                return;
            }
            warned += 1;
            verdict.warn(
                format!("spec.flavors[{index}].priceHourly"),
                format!(
                    "{} ({} vCPU, {} KiB) at {} EUR/h costs less than the smaller {} at {}: the hub will never pick {}",
                    shorten(&big.name),
                    big.cpu,
                    big.memory_ki,
                    big.price_hourly,
                    shorten(&small.name),
                    small.price_hourly,
                    shorten(&small.name),
                ),
            );
        }
    }
}

/// The catalogue a node class serves given its `FlavorCatalog` (for the NodePool checks): the base
/// with the overrides, or the base alone when the overrides are invalid (as the hub does).
pub(crate) fn served(base: &[catalog::Flavor], overrides: Option<&FlavorCatalog>) -> (Catalog, bool) {
    match overrides {
        None => (Catalog::from_base(base), true),
        Some(fc) => match catalog::merge(base, &fc.spec.flavors) {
            Ok(c) => (c, true),
            Err(_) => (Catalog::from_base(base), false),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::flavorcatalog::FlavorCatalogSpec;

    fn entry(name: &str, cpu: Option<i64>, memory_ki: Option<i64>, price_hourly: Option<f64>) -> FlavorOverride {
        FlavorOverride { name: name.to_string(), cpu, memory_ki, price_hourly }
    }

    fn catalog(flavors: Vec<FlavorOverride>) -> FlavorCatalog {
        FlavorCatalog::new("c", FlavorCatalogSpec { flavors })
    }

    fn verdict(flavors: Vec<FlavorOverride>) -> Verdict {
        validate_flavor_catalog(&catalog(flavors), None)
    }

    fn fields(v: &[crate::admission::Violation]) -> Vec<&str> {
        v.iter().map(|x| x.field.as_str()).collect()
    }

    #[test]
    fn the_documented_example_is_allowed_with_the_new_flavor_warning() {
        let v =
            verdict(vec![entry("M", None, None, Some(0.105)), entry("CUSTOM", Some(2), Some(2_097_152), Some(0.01))]);
        assert!(v.is_allowed(), "{v:?}");
        assert_eq!(fields(&v.warnings), ["spec.flavors[1].name"]);
        assert!(v.warnings[0].message.contains("new flavor"));
    }

    #[test]
    fn catalogue_rules_are_reused_with_their_field_paths() {
        let v = verdict(vec![entry("CUSTOM", Some(2), Some(2_097_152), None)]);
        assert_eq!(fields(&v.denials), ["spec.flavors[0].priceHourly"]);
        assert!(v.denials[0].message.contains("must set priceHourly"));
        let v = verdict(vec![]);
        assert_eq!(fields(&v.denials), ["spec.flavors"]);
        let v = verdict(vec![entry("M", None, Some(1000), None)]);
        assert_eq!(fields(&v.denials), ["spec.flavors[0].memoryKi"]);
        assert!(v.denials[0].message.contains("100Mi"));
    }

    #[test]
    fn a_free_new_flavor_is_denied_a_free_builtin_warned() {
        let v = verdict(vec![entry("FREE", Some(2), Some(2_097_152), Some(0.0))]);
        assert_eq!(fields(&v.denials), ["spec.flavors[0].priceHourly"]);
        assert!(v.denials[0].message.contains("must not be free"), "{v:?}");
        let v = verdict(vec![entry("XS", None, None, Some(0.0))]);
        assert!(v.is_allowed());
        assert!(v.warning_messages().iter().any(|w| w.contains("wins every cheapest-first choice")), "{v:?}");
    }

    #[test]
    fn unit_mistakes_are_warned() {
        // memoryKi given in bytes.
        let v = verdict(vec![entry("BIG", Some(2), Some(4_294_967_296), Some(0.05))]);
        assert!(v.is_allowed());
        assert!(v.warning_messages().iter().any(|w| w.contains("unit mistake")), "{v:?}");
        // A monthly price.
        let v = verdict(vec![entry("M", None, None, Some(84.0))]);
        assert!(v.warning_messages().iter().any(|w| w.contains("not per month")), "{v:?}");
        // Tiny allocatable memory.
        let v = verdict(vec![entry("TINY", Some(1), Some(200_000), Some(0.001))]);
        assert!(v.warning_messages().iter().any(|w| w.contains("too little for pods")), "{v:?}");
    }

    #[test]
    fn builtin_sizes_beyond_tolerance_and_no_op_entries_are_warned() {
        let v = verdict(vec![entry("M", Some(20), None, None)]);
        assert!(v.warning_messages().iter().any(|w| w.contains("CKE decides the size")), "{v:?}");
        let v = verdict(vec![entry("M", Some(10), None, Some(0.1167))]);
        assert!(v.warning_messages().iter().any(|w| w.contains("no effect")), "{v:?}");
        let v = verdict(vec![entry("xs", Some(6), Some(7_937_580), Some(0.0611))]);
        assert!(v.warning_messages().iter().any(|w| w.contains("only by case")), "{v:?}");
    }

    #[test]
    fn a_big_flavor_cheaper_than_a_small_one_is_warned() {
        let v = verdict(vec![entry("M", None, None, Some(0.05))]);
        assert!(v.is_allowed());
        let order: Vec<_> = v.warning_messages().into_iter().filter(|w| w.contains("costs less")).collect();
        assert_eq!(order.len(), 2, "{v:?}");
        assert!(order[0].starts_with("spec.flavors[0].priceHourly: \"M\""), "{order:?}");
        assert!(
            order.iter().any(|w| w.contains("smaller \"XS\"")) && order.iter().any(|w| w.contains("smaller \"S\""))
        );
        // A plain discount that keeps the order is quiet.
        assert!(verdict(vec![entry("M", None, None, Some(0.105))]).warnings.is_empty());
    }
}
