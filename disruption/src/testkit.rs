//! Small builders for the crate's tests: a scope with the `default` pool, nodes, pods, PDBs.

use crds::nodepool::Disruption;
use jiff::Timestamp;

use crate::facts::{NodeFacts, PdbFacts, PodFacts, PoolFacts, Scope};

/// The tests' `now`: a Wednesday noon, UTC.
pub fn now() -> Timestamp {
    Timestamp::from_second(1_795_608_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A pool with the API defaults (policy, `consolidateAfter: 0s`, budget `10%`).
pub fn pool(name: &str) -> PoolFacts {
    PoolFacts::from_spec(name, &Disruption::default(), true)
}

/// A pool whose node class resolves to no instance type.
pub fn pool_unresolved(name: &str) -> PoolFacts {
    PoolFacts::from_spec(name, &Disruption::default(), false)
}

/// An initialized, Ready, consolidatable node of pool `default`, created a day before [`now`].
pub fn node(name: &str, price: f64) -> NodeFacts {
    let mut n = NodeFacts::new(name, "default", now() - jiff::SignedDuration::from_hours(24));
    n.price = price;
    n.instance_type = Some("XS".into());
    n.zone = Some("par".into());
    n.capacity_type = Some("on-demand".into());
    n
}

/// A running, Ready pod of namespace `default` owned by a ReplicaSet.
pub fn pod(name: &str) -> PodFacts {
    PodFacts { name: format!("default/{name}"), ready: true, ..PodFacts::default() }
}

/// A PDB of namespace `default`.
pub fn pdb(name: &str, allowed: i32) -> PdbFacts {
    PdbFacts {
        name: format!("default/{name}"),
        disruptions_allowed: allowed,
        always_allow_unhealthy: false,
        fully_blocking: false,
    }
}

/// A scope with pool `default` and these nodes.
pub fn scope(nodes: Vec<NodeFacts>) -> Scope {
    Scope { pools: vec![pool("default")], nodes }
}
/// A pool with these budgets.
pub fn pool_with_budgets(name: &str, budgets: &[(&str, Option<crds::nodepool::DisruptionReason>)]) -> PoolFacts {
    let disruption = Disruption {
        budgets: budgets
            .iter()
            .map(|(nodes, reason)| crds::nodepool::Budget {
                nodes: nodes.to_string(),
                schedule: None,
                duration: None,
                reasons: reason.map(|r| vec![r]),
            })
            .collect(),
        ..Disruption::default()
    };
    PoolFacts::from_spec(name, &disruption, true)
}
