//! `sim::cke::config`: what a simulated CKE is told: delays, quota, flavors, vanishing, seed.
//!
//! Owns the configuration types and their defaults (clever-cloud.md §9, "Simulated CKE defaults
//! SHOULD mirror the typical column"), and the seeded, order-independent draws made from them.
//! Must not do I/O.

use std::time::Duration;

use crate::clock::SeededRng;

use super::quota::{QuotaConfig, SimFlavor};

/// A delay drawn uniformly from `[min, max]` (a fixed delay when both are equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayRange {
    /// Shortest delay.
    pub min: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl DelayRange {
    /// Always `d`.
    pub const fn fixed(d: Duration) -> DelayRange {
        DelayRange { min: d, max: d }
    }

    /// Uniform in `[min, max]`.
    pub const fn between(min: Duration, max: Duration) -> DelayRange {
        DelayRange { min, max }
    }

    /// Draws a delay; deterministic for a given `(seed, key)`, whatever order draws happen in.
    pub fn draw(&self, seed: u64, key: &str) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        let span = (self.max - self.min).as_millis().min(u128::from(u64::MAX)) as u64;
        self.min + Duration::from_millis(rng(seed, key).below(span.saturating_add(1)))
    }
}

/// A generator for one decision: seeded with the run's seed and a key naming the decision (object
/// and purpose), so draws do not depend on the order watch events arrive in.
pub fn rng(seed: u64, key: &str) -> SeededRng {
    // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    SeededRng::new(h)
}

/// Which accepted NodeGroups a vanish rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupSelector {
    /// Every accepted group.
    All,
    /// Groups whose name starts with this prefix.
    NamePrefix(String),
    /// Groups carrying this label (key, value).
    Label(String, String),
    /// Groups whose acceptance brought RAM usage exactly to the quota limit (the suspected race of
    /// clever-cloud.md §1.5).
    AtQuotaEdge,
}

/// Makes accepted NodeGroups vanish: deleted by the platform, with no request and no event.
#[derive(Debug, Clone, PartialEq)]
pub struct VanishRule {
    /// Groups concerned.
    pub selector: GroupSelector,
    /// Chance that a matching group vanishes (0 to 1), drawn once per group from the seed.
    pub probability: f64,
    /// How long after acceptance it vanishes ("seconds after Synced").
    pub after: Duration,
}

/// The control plane of the simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    /// Flavor of the control-plane nodes (`S` on CKE).
    pub flavor: String,
    /// Number of control-plane nodes (2 on CKE).
    pub count: u32,
    /// Whether the simulator creates the control-plane Nodes (role `control-plane`).
    /// Their quota usage counts either way (see [`QuotaConfig::control_plane`]).
    pub create_nodes: bool,
    /// Whether those Nodes refuse workload pods: the kubeadm convention, label
    /// `node-role.kubernetes.io/control-plane: ""` and taint
    /// `node-role.kubernetes.io/control-plane:NoSchedule`. Off by default: clever-cloud.md §1.7
    /// records CKE's control-plane nodes as schedulable (workloads select
    /// `clever-cloud.com/cluster-node-role: worker` to stay off them).
    pub no_schedule: bool,
}

impl Default for ControlPlane {
    fn default() -> ControlPlane {
        ControlPlane { flavor: "S".to_string(), count: 2, create_nodes: true, no_schedule: false }
    }
}

/// Configuration of a simulated CKE.
#[derive(Debug, Clone, PartialEq)]
pub struct SimCkeConfig {
    /// Seed of every random draw (delays within ranges, vanishing, upstream ids, IPs).
    pub seed: u64,
    /// Flavors the platform knows; a NodeGroup with another flavor fails (`ReconcileFailed`,
    /// reason `InvalidFlavor`). Default: the built-in `2XS` … `XL`.
    pub flavors: Vec<SimFlavor>,
    /// The organisation quota, control plane included; shared with other simulated clusters when
    /// `quota.organization` is set (see [`super::quota::OrganizationQuota`]).
    pub quota: QuotaConfig,
    /// Whether groups awaiting their verdict are judged together: each counts the others still in
    /// flight, so concurrent creations can be rejected together (clever-cloud.md §2.2 gotcha 2).
    pub judge_concurrently: bool,
    /// When set, a group that is deleted while refused for quota (or before its first verdict)
    /// keeps its quota reservation this long after it is gone (clever-cloud.md §2.2 gotcha 3).
    pub reservation_leak: Option<Duration>,
    /// Create → verdict (accepted or rejected). Measured 1–3 s.
    pub verdict_delay: DelayRange,
    /// Acceptance → Node `<group>-node<i>` created (joined, not Ready yet).
    pub node_join_delay: DelayRange,
    /// Node created → Node Ready (kubelet stand-in). Join + ready ≈ 30 s by default.
    pub node_ready_delay: DelayRange,
    /// NodeGroup deletion seen → its Nodes deleted (VM torn down). Measured ~30–40 s.
    pub node_removal_delay: DelayRange,
    /// NodeGroup deletion seen → finalizer removed, for a group that has no Node.
    pub empty_group_removal_delay: DelayRange,
    /// Pod bound → Running (kubelet stand-in).
    pub pod_start_delay: DelayRange,
    /// Pod deletion requested on a simulated node → pod gone (graceful termination).
    pub pod_termination_delay: DelayRange,
    /// Renewal period of the simulated kubelets' heartbeat Leases (`kube-node-lease/<node>`,
    /// 40 s duration as kubelets use); `None`: no Leases. A real API server's node lifecycle
    /// controller marks a node without heartbeats unreachable.
    pub node_lease_interval: Option<Duration>,
    /// Vanish rules, evaluated once when a group is accepted (first match that fires wins).
    pub vanish: Vec<VanishRule>,
    /// The control plane.
    pub control_plane: ControlPlane,
    /// Run the NodeGroup controller.
    pub nodegroups: bool,
    /// Run the kubelet stand-in (Node readiness, Running pods) on the nodes the simulator made.
    pub kubelet: bool,
    /// Run the binder (turn it off where a real kube-scheduler runs).
    pub binder: bool,
    /// Install the stand-in NodeGroup CRD if the API server does not serve NodeGroups yet.
    pub install_crd: bool,
    /// Kubernetes version reported by the simulated kubelets.
    pub kubelet_version: String,
}

impl Default for SimCkeConfig {
    fn default() -> SimCkeConfig {
        let s = Duration::from_secs;
        SimCkeConfig {
            seed: 0,
            flavors: SimFlavor::builtins(),
            quota: QuotaConfig::default(),
            judge_concurrently: true,
            reservation_leak: None,
            verdict_delay: DelayRange::fixed(s(1)),
            node_join_delay: DelayRange::fixed(s(25)),
            node_ready_delay: DelayRange::fixed(s(5)),
            node_removal_delay: DelayRange::fixed(s(35)),
            empty_group_removal_delay: DelayRange::fixed(s(1)),
            pod_start_delay: DelayRange::fixed(s(1)),
            pod_termination_delay: DelayRange::fixed(s(1)),
            node_lease_interval: Some(s(10)),
            vanish: Vec::new(),
            control_plane: ControlPlane::default(),
            nodegroups: true,
            kubelet: true,
            binder: true,
            install_crd: true,
            kubelet_version: "v1.36.0".to_string(),
        }
    }
}

impl SimCkeConfig {
    /// Every delay zero: verdicts, joins and readiness as fast as the API allows (handy with a real
    /// clock in tests that do not care about timing).
    pub fn instant() -> SimCkeConfig {
        let zero = DelayRange::fixed(Duration::ZERO);
        SimCkeConfig {
            verdict_delay: zero,
            node_join_delay: zero,
            node_ready_delay: zero,
            node_removal_delay: zero,
            empty_group_removal_delay: zero,
            pod_start_delay: zero,
            pod_termination_delay: zero,
            ..SimCkeConfig::default()
        }
    }

    /// The flavor named `name`, if the platform knows it.
    pub fn flavor(&self, name: &str) -> Option<&SimFlavor> {
        self.flavors.iter().find(|f| f.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_within_range() {
        let r = DelayRange::between(Duration::from_secs(26), Duration::from_secs(60));
        let a = r.draw(42, "ng-a/join/0");
        assert_eq!(a, r.draw(42, "ng-a/join/0"));
        assert!(a >= r.min && a <= r.max);
        let many: Vec<Duration> = (0..50).map(|i| r.draw(42, &format!("ng-{i}"))).collect();
        assert!(many.iter().all(|d| *d >= r.min && *d <= r.max));
        assert!(many.iter().any(|d| *d != many[0]), "draws vary by key");
        assert_ne!(
            (0..10).map(|i| r.draw(1, &i.to_string())).collect::<Vec<_>>(),
            (0..10).map(|i| r.draw(2, &i.to_string())).collect::<Vec<_>>()
        );
        assert_eq!(DelayRange::fixed(Duration::from_secs(3)).draw(9, "x"), Duration::from_secs(3));
    }
}
