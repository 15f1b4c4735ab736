//! Rules of the NodePool status controller that need no cluster: what a pool's claims cost by the
//! catalogue, and whether the management cache has caught up with the events that woke a pool.
//!
//! Owns: those pure rules. Must not: read caches or the clock (the controller passes what it saw
//! and the time).

use std::time::{Duration, Instant};

use crds::{NodeClaim, catalog::InstanceType, labels};
use kube::ResourceExt;

/// What a pool's claims cost by the catalogue (see [`price_per_hour`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPrice {
    /// EUR per hour.
    pub eur_per_hour: f64,
    /// Launched claims whose flavor the catalogue does not price, as `claim (flavor)`.
    pub unpriced: Vec<String>,
}

/// The cost of a pool's claims: Σ catalogue price of each claim not being deleted that has launched
/// (launch writes the flavor as its instance-type label; before that no flavor is chosen, so nothing
/// is paid), at the offering of the claim's zone and capacity type, else the type's cheapest one.
/// Pure.
pub fn price_per_hour<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>, types: &[InstanceType]) -> PoolPrice {
    let mut out = PoolPrice { eur_per_hour: 0.0, unpriced: Vec::new() };
    for c in claims.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        let l = c.labels();
        let Some(flavor) = l.get(labels::INSTANCE_TYPE) else { continue };
        let offerings = types.iter().find(|t| &t.name == flavor).map(|t| t.offerings.as_slice()).unwrap_or_default();
        let wanted = |o: &&crds::catalog::Offering| {
            l.get(labels::ZONE).is_none_or(|z| *z == o.zone)
                && l.get(labels::CAPACITY_TYPE).is_none_or(|ct| *ct == o.capacity_type)
        };
        let cheapest = || offerings.iter().map(|o| o.price_hourly).min_by(f64::total_cmp);
        match offerings.iter().find(wanted).map(|o| o.price_hourly).or_else(cheapest) {
            Some(p) => out.eur_per_hour += p,
            None => out.unpriced.push(format!("{} ({flavor})", c.name_any())),
        }
    }
    out
}

/// How long the cache may lag behind the event that woke the pool before the pool is computed
/// anyway (a claim deleted without ever being cached cannot be caught up with).
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(2);

/// The kinds whose events wake a pool and that its status is computed from (through the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Claim,
    Class,
}

/// One event a pool was woken by: the object's namespace and name, the resourceVersion the event
/// carried, whether the object was being deleted, and when the event came.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub resource_version: Option<String>,
    pub deleting: bool,
    pub at: Instant,
}

/// Whether the management cache has caught up with every event a pool was woken by: each object is
/// cached at the event's resourceVersion, or absent when the event showed it being deleted, or the
/// event is older than [`CATCH_UP_LIMIT`] (give up waiting: a later event wakes the pool again).
/// `cached` gives the cached resourceVersion of an object (`None`: not cached). Pure.
pub fn caught_up(seen: &[Seen], cached: impl Fn(Kind, &str, &str) -> Option<Option<String>>, now: Instant) -> bool {
    seen.iter().all(|s| {
        let matches = match cached(s.kind, &s.namespace, &s.name) {
            Some(rv) => rv == s.resource_version,
            None => s.deleting,
        };
        matches || now.saturating_duration_since(s.at) >= CATCH_UP_LIMIT
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crds::catalog::Catalog;
    use serde_json::json;

    fn claim(name: &str, labels: serde_json::Value, deleting: bool) -> NodeClaim {
        let mut v = json!({
            "apiVersion": "karpenter.clever-cloud.com/v1alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": name, "namespace": "team-a", "labels": labels},
            "spec": {"clusterName": "prod", "nodeClassRef": {"group": "karpenter.clever-cloud.com", "kind": "CleverNodeClass", "name": "default"}, "requirements": []},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    fn price(types: &[InstanceType], flavor: &str) -> f64 {
        types.iter().find(|t| t.name == flavor).unwrap().offerings[0].price_hourly
    }

    #[test]
    fn a_pool_costs_the_catalogue_price_of_its_launched_claims_not_being_deleted() {
        let types = Catalog::builtin().instance_types("par");
        let claims = vec![
            claim(
                "a",
                json!({labels::INSTANCE_TYPE: "XS", labels::ZONE: "par", labels::CAPACITY_TYPE: "on-demand"}),
                false,
            ),
            claim("b", json!({labels::INSTANCE_TYPE: "M"}), false),
            // Not launched yet: no flavor chosen, nothing paid.
            claim("c", json!({}), false),
            // Being deleted: no longer counted, as in the pool's usage.
            claim("d", json!({labels::INSTANCE_TYPE: "L"}), true),
        ];
        let p = price_per_hour(&claims, &types);
        let want = price(&types, "XS") + price(&types, "M");
        assert!((p.eur_per_hour - want).abs() < 1e-9, "{p:?} != {want}");
        assert!(p.unpriced.is_empty(), "{p:?}");
        assert_eq!(price_per_hour(std::iter::empty(), &types).eur_per_hour, 0.0);
    }

    #[test]
    fn a_pool_waits_for_the_cache_to_show_the_events_that_woke_it() {
        let now = Instant::now() + Duration::from_secs(10);
        // An event that came `age` before now.
        let seen = |name: &str, rv: &str, deleting: bool, age: Duration| Seen {
            kind: Kind::Claim,
            namespace: "team-a".into(),
            name: name.into(),
            resource_version: Some(rv.into()),
            deleting,
            at: now - age,
        };
        // The cache: claim a at "5", claim b not there.
        let cached = |_: Kind, _: &str, name: &str| (name == "a").then(|| Some("5".to_string()));
        let cases = [
            ("nothing awaited", vec![], true),
            ("the cache shows the event", vec![seen("a", "5", false, Duration::ZERO)], true),
            ("the cache is behind the event", vec![seen("a", "6", false, Duration::ZERO)], false),
            ("a new claim not cached yet", vec![seen("b", "1", false, Duration::ZERO)], false),
            ("a deleted claim gone from the cache", vec![seen("b", "2", true, Duration::ZERO)], true),
            (
                "a claim being deleted still cached at an older version",
                vec![seen("a", "7", true, Duration::ZERO)],
                false,
            ),
            ("waited long enough", vec![seen("a", "6", false, CATCH_UP_LIMIT)], true),
            (
                "one event caught up, one not",
                vec![seen("a", "5", false, Duration::ZERO), seen("b", "1", false, Duration::ZERO)],
                false,
            ),
        ];
        for (what, seen, want) in cases {
            assert_eq!(caught_up(&seen, cached, now), want, "{what}");
        }
    }

    #[test]
    fn the_offering_of_the_claims_zone_is_priced_and_an_unknown_flavor_is_reported_not_guessed() {
        let mut types = Catalog::builtin().instance_types("par");
        let xs = types.iter_mut().find(|t| t.name == "XS").unwrap();
        let mut other_zone = xs.offerings[0].clone();
        other_zone.zone = "rbx".to_string();
        other_zone.price_hourly = 1.5;
        xs.offerings.push(other_zone);
        let in_rbx = claim("a", json!({labels::INSTANCE_TYPE: "XS", labels::ZONE: "rbx"}), false);
        assert_eq!(price_per_hour(std::slice::from_ref(&in_rbx), &types).eur_per_hour, 1.5);
        // No zone label: the cheapest offering of the type.
        let anywhere = claim("b", json!({labels::INSTANCE_TYPE: "XS"}), false);
        assert_eq!(price_per_hour(&[anywhere], &types).eur_per_hour, price(&types, "XS"));
        let gone = claim("c", json!({labels::INSTANCE_TYPE: "RETIRED"}), false);
        let p = price_per_hour(&[gone, in_rbx], &types);
        assert_eq!(p.eur_per_hour, 1.5);
        assert_eq!(p.unpriced, vec!["c (RETIRED)".to_string()]);
    }
}
