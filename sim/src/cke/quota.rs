//! `sim::cke::quota`: the organisation quota as CKE enforces it (clever-cloud.md §1.5, §1.7).
//!
//! Owns: the sizing CKE bills against the quota (vCPU and nominal GB per flavor), the accounting
//! (control plane included) and the verdict with CKE's message shape; and the organisation several
//! simulated clusters can share ([`OrganizationQuota`]): the quota belongs to the organisation on
//! Clever Cloud, so every member cluster's nodes and control plane count against one limit.
//! Must not do I/O or read a clock.
//!
//! Observed message (RAM): `Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB`, where
//! `actual` is the usage the new group would bring. The vCPU form is not observed; this simulator
//! writes `Quota exceeded: CPU max: limit = 40 | actual = 46` (inferred). RAM is judged first.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crds::catalog::{BuiltinFlavor, KI_PER_NOMINAL_GB};

/// A flavor as the simulated platform knows it: scheduling sizing and quota sizing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFlavor {
    /// Name as used in `spec.flavor`.
    pub name: String,
    /// vCPUs (node capacity and quota).
    pub cpu: i64,
    /// Kernel-visible memory capacity, KiB (node capacity).
    pub memory_ki: i64,
    /// Nominal GB (quota).
    pub nominal_gb: i64,
    /// Extended resources a device plugin reports on its nodes once they are Ready
    /// (`nvidia.com/gpu: 1`): none on the built-in flavors.
    pub devices: BTreeMap<String, i64>,
}

impl SimFlavor {
    /// A flavor with the quota size derived from its memory (for flavors outside the built-in table).
    pub fn new(name: impl Into<String>, cpu: i64, memory_ki: i64) -> SimFlavor {
        let nominal_gb = (memory_ki + KI_PER_NOMINAL_GB / 2) / KI_PER_NOMINAL_GB;
        SimFlavor { name: name.into(), cpu, memory_ki, nominal_gb, devices: BTreeMap::new() }
    }

    /// The built-in flavors (`2XS` … `XL`).
    pub fn builtins() -> Vec<SimFlavor> {
        crds::catalog::BUILTIN_FLAVORS.iter().map(SimFlavor::from).collect()
    }

    /// What one node of this flavor counts against the quota.
    pub fn usage(&self) -> Usage {
        Usage { vcpu: self.cpu, ram_gb: self.nominal_gb }
    }
}

impl From<&BuiltinFlavor> for SimFlavor {
    fn from(b: &BuiltinFlavor) -> SimFlavor {
        SimFlavor {
            name: b.name.to_string(),
            cpu: b.cpu,
            memory_ki: b.memory_ki,
            nominal_gb: b.nominal_gb,
            devices: BTreeMap::new(),
        }
    }
}

/// Quota usage or limit: vCPUs and nominal GB of RAM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// vCPUs.
    pub vcpu: i64,
    /// Nominal GB (10^9 bytes).
    pub ram_gb: i64,
}

impl Usage {
    /// `self + other × count`.
    #[must_use]
    pub fn plus(self, other: Usage, count: i64) -> Usage {
        Usage {
            vcpu: self.vcpu.saturating_add(other.vcpu.saturating_mul(count)),
            ram_gb: self.ram_gb.saturating_add(other.ram_gb.saturating_mul(count)),
        }
    }
}

impl Usage {
    /// The larger of each figure.
    fn peak(self, other: Usage) -> Usage {
        Usage { vcpu: self.vcpu.max(other.vcpu), ram_gb: self.ram_gb.max(other.ram_gb) }
    }
}

/// The organisation quota: the default is 40 vCPU / 40 GB, and two `S` control-plane nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Limit of the organisation (ignored when [`QuotaConfig::organization`] is set: the shared
    /// organisation's limit applies).
    pub limit: Usage,
    /// What this cluster's control plane uses (counted against the limit).
    pub control_plane: Usage,
    /// The organisation this cluster shares its quota with, if any. Without it the cluster is alone
    /// in its organisation and judged against [`QuotaConfig::limit`]. With it, verdicts count every
    /// member cluster of the organisation (control planes, accepted groups, leaked reservations and,
    /// with `judge_concurrently`, groups awaiting their verdict), from the moment the member's
    /// NodeGroup controller runs until it stops.
    pub organization: Option<OrgMember>,
}

impl Default for QuotaConfig {
    fn default() -> QuotaConfig {
        QuotaConfig {
            limit: Usage { vcpu: 40, ram_gb: 40 },
            control_plane: Usage { vcpu: 16, ram_gb: 24 },
            organization: None,
        }
    }
}

/// CKE's verdict on a new group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaVerdict {
    /// Fits: the usage after acceptance.
    Fits(Usage),
    /// Refused, with CKE's message.
    Exceeded(String),
}

/// Judges a group that would add `adding` to `workers` (the accepted worker usage, and with
/// concurrent judging the other in-flight groups).
pub fn judge(quota: &QuotaConfig, workers: Usage, adding: Usage) -> QuotaVerdict {
    verdict(quota.limit, quota.control_plane.plus(workers, 1).plus(adding, 1))
}

/// The verdict on a usage of `actual` (the new group included) under `limit`.
fn verdict(limit: Usage, actual: Usage) -> QuotaVerdict {
    if actual.ram_gb > limit.ram_gb {
        return QuotaVerdict::Exceeded(format!(
            "Quota exceeded: RAM max: limit = {:.1} GB | actual = {:.1} GB",
            limit.ram_gb as f64, actual.ram_gb as f64
        ));
    }
    if actual.vcpu > limit.vcpu {
        return QuotaVerdict::Exceeded(format!(
            "Quota exceeded: CPU max: limit = {} | actual = {}",
            limit.vcpu, actual.vcpu
        ));
    }
    QuotaVerdict::Fits(actual)
}

/// An organisation's quota, shared by the simulated clusters whose [`QuotaConfig::organization`]
/// names it (clones are the same organisation). Its quota engine judges one group at a time, so two
/// clusters judging at the same instant never both take the last headroom.
#[derive(Clone)]
pub struct OrganizationQuota {
    state: Arc<Mutex<OrgState>>,
}

/// A cluster of an organisation: the organisation and the member's id (unique within it; two
/// simulators running with the same member overwrite each other's figures).
#[derive(Clone)]
pub struct OrgMember {
    org: OrganizationQuota,
    id: String,
}

/// What an organisation's quota engine did, for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrgStats {
    /// Quota verdicts given (accepted or refused).
    pub verdicts: u64,
    /// Of which refusals.
    pub refusals: u64,
    /// Refusals per member id.
    pub refusals_by_member: BTreeMap<String, u64>,
    /// The highest usage right after an acceptance, each figure on its own (control planes and
    /// leaked reservations included, groups awaiting their verdict not).
    pub peak: Usage,
}

#[derive(Debug)]
struct OrgState {
    limit: Usage,
    /// Hands out [`Seat`] sessions, so a seat left late cannot remove its successor's figures.
    next_session: u64,
    members: BTreeMap<String, MemberState>,
    stats: OrgStats,
}

#[derive(Debug)]
struct MemberState {
    session: u64,
    figures: MemberFigures,
}

/// What one member counts against its organisation, as its NodeGroup controller last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MemberFigures {
    /// The member's control plane.
    pub(crate) control_plane: Usage,
    /// Accepted groups until fully gone.
    pub(crate) accepted: Usage,
    /// Reservations left behind by gone groups (`reservation_leak`).
    pub(crate) leaked: Usage,
    /// Groups awaiting their verdict, by UID.
    pub(crate) in_flight: BTreeMap<String, Usage>,
}

impl MemberFigures {
    fn usage(&self) -> Usage {
        self.control_plane.plus(self.accepted, 1).plus(self.leaked, 1)
    }
}

impl OrgState {
    fn usage(&self) -> Usage {
        self.members.values().fold(Usage::default(), |acc, m| acc.plus(m.figures.usage(), 1))
    }
}

impl OrganizationQuota {
    /// An organisation with this limit and no member yet.
    pub fn new(limit: Usage) -> OrganizationQuota {
        let state = OrgState { limit, next_session: 0, members: BTreeMap::new(), stats: OrgStats::default() };
        OrganizationQuota { state: Arc::new(Mutex::new(state)) }
    }

    /// The member `id` of this organisation, for a cluster's [`QuotaConfig::organization`].
    pub fn member(&self, id: impl Into<String>) -> OrgMember {
        OrgMember { org: self.clone(), id: id.into() }
    }

    /// The organisation's limit.
    pub fn limit(&self) -> Usage {
        self.lock().limit
    }

    /// Changes the limit; verdicts given from now on use it (earlier ones stand, as on the platform).
    pub fn set_limit(&self, limit: Usage) {
        self.lock().limit = limit;
    }

    /// Current usage: every running member's control plane, accepted groups and leaked
    /// reservations (groups awaiting their verdict are requests, not usage).
    pub fn usage(&self) -> Usage {
        self.lock().usage()
    }

    /// Current usage of one member; `None` when it is not running.
    pub fn usage_of(&self, member: &str) -> Option<Usage> {
        self.lock().members.get(member).map(|m| m.figures.usage())
    }

    /// Ids of the running members.
    pub fn members(&self) -> Vec<String> {
        self.lock().members.keys().cloned().collect()
    }

    /// What the quota engine did so far.
    pub fn stats(&self) -> OrgStats {
        self.lock().stats.clone()
    }

    fn lock(&self) -> MutexGuard<'_, OrgState> {
        // Nothing panics while holding it; if something did, the figures are still the best we have.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PartialEq for OrganizationQuota {
    fn eq(&self, other: &OrganizationQuota) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for OrganizationQuota {}

impl fmt::Debug for OrganizationQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `try_lock`: formatting must not wait on (or deadlock with) a judgement in progress.
        let mut d = f.debug_struct("OrganizationQuota");
        d.field("id", &Arc::as_ptr(&self.state));
        if let Ok(state) = self.state.try_lock() {
            d.field("limit", &state.limit).field("members", &state.members.keys().collect::<Vec<_>>());
        }
        d.finish_non_exhaustive()
    }
}

impl OrgMember {
    /// The member's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The organisation.
    pub fn organization(&self) -> &OrganizationQuota {
        &self.org
    }
}

impl PartialEq for OrgMember {
    fn eq(&self, other: &OrgMember) -> bool {
        self.org == other.org && self.id == other.id
    }
}

impl Eq for OrgMember {}

impl fmt::Debug for OrgMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrgMember").field("org", &Arc::as_ptr(&self.org.state)).field("id", &self.id).finish()
    }
}

/// A member's place in its organisation while its NodeGroup controller runs: publishes the member's
/// figures and judges its groups. Dropping it (the controller stopped, or the cluster moved to
/// another organisation) removes the member's figures: a deleted cluster frees its quota.
#[derive(Debug)]
pub(crate) struct Seat {
    member: OrgMember,
    session: u64,
}

impl Seat {
    /// Takes a seat for `member` (it counts from its first publication).
    pub(crate) fn take(member: &OrgMember) -> Seat {
        let mut state = member.org.lock();
        state.next_session += 1;
        Seat { member: member.clone(), session: state.next_session }
    }

    /// The member this seat is for.
    pub(crate) fn member(&self) -> &OrgMember {
        &self.member
    }

    /// Replaces the member's figures with what its controller sees now.
    pub(crate) fn publish(&self, figures: MemberFigures) {
        let mut state = self.member.org.lock();
        state.members.insert(self.member.id.clone(), MemberState { session: self.session, figures });
    }

    /// Judges the member's group `uid` adding `adding`, against the organisation's limit and usage
    /// (with `concurrently`, every other group awaiting its verdict in the organisation counts too),
    /// and on acceptance counts it at once, under the same lock. Returns the verdict and the limit
    /// it was judged against.
    pub(crate) fn judge(&self, uid: &str, adding: Usage, concurrently: bool) -> (QuotaVerdict, Usage) {
        let mut state = self.member.org.lock();
        let id = self.member.id.as_str();
        let pending = if concurrently {
            state
                .members
                .iter()
                .flat_map(|(m, s)| s.figures.in_flight.iter().filter(move |(u, _)| !(m == id && u.as_str() == uid)))
                .fold(Usage::default(), |acc, (_, u)| acc.plus(*u, 1))
        } else {
            Usage::default()
        };
        let limit = state.limit;
        let result = verdict(limit, state.usage().plus(pending, 1).plus(adding, 1));
        state.stats.verdicts += 1;
        match &result {
            QuotaVerdict::Fits(_) => {
                let session = self.session;
                let member = state
                    .members
                    .entry(id.to_string())
                    .or_insert_with(|| MemberState { session, figures: MemberFigures::default() });
                member.figures.in_flight.remove(uid);
                member.figures.accepted = member.figures.accepted.plus(adding, 1);
                let usage = state.usage();
                state.stats.peak = state.stats.peak.peak(usage);
            }
            QuotaVerdict::Exceeded(_) => {
                // A refused group stays in flight until the member's next publication: groups
                // judged together in one pass are refused together, as for a lone cluster.
                state.stats.refusals += 1;
                *state.stats.refusals_by_member.entry(id.to_string()).or_default() += 1;
            }
        }
        (result, limit)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut state = self.member.org.lock();
        if state.members.get(&self.member.id).is_some_and(|m| m.session == self.session) {
            state.members.remove(&self.member.id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn flavor(name: &str) -> SimFlavor {
        SimFlavor::builtins().into_iter().find(|f| f.name == name).unwrap_or_else(|| SimFlavor::new(name, 0, 0))
    }

    #[test]
    fn default_quota_refuses_large_flavors() {
        let q = QuotaConfig::default();
        // 24 GB of control plane + L (24 GB) = 48 GB: exactly the observed message.
        assert_eq!(
            judge(&q, Usage::default(), flavor("L").usage()),
            QuotaVerdict::Exceeded("Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB".to_string())
        );
        assert!(matches!(judge(&q, Usage::default(), flavor("XL").usage()), QuotaVerdict::Exceeded(_)));
        // M (16 GB) only when nothing else runs.
        assert_eq!(
            judge(&q, Usage::default(), flavor("M").usage()),
            QuotaVerdict::Fits(Usage { vcpu: 26, ram_gb: 40 })
        );
        assert!(matches!(judge(&q, flavor("2XS").usage(), flavor("M").usage()), QuotaVerdict::Exceeded(_)));
    }

    #[test]
    fn exact_limit_fits_and_cpu_form() {
        let q = QuotaConfig {
            limit: Usage { vcpu: 20, ram_gb: 100 },
            control_plane: Usage { vcpu: 16, ram_gb: 24 },
            organization: None,
        };
        assert!(matches!(judge(&q, Usage::default(), flavor("2XS").usage()), QuotaVerdict::Fits(_)));
        assert_eq!(
            judge(&q, Usage::default(), flavor("XS").usage()),
            QuotaVerdict::Exceeded("Quota exceeded: CPU max: limit = 20 | actual = 22".to_string())
        );
    }

    const CP: Usage = Usage { vcpu: 16, ram_gb: 24 };

    fn org64() -> OrganizationQuota {
        OrganizationQuota::new(Usage { vcpu: 64, ram_gb: 64 })
    }

    fn figures(accepted: Usage, leaked: Usage, in_flight: &[(&str, Usage)]) -> MemberFigures {
        MemberFigures {
            control_plane: CP,
            accepted,
            leaked,
            in_flight: in_flight.iter().map(|(u, us)| (u.to_string(), *us)).collect(),
        }
    }

    #[test]
    fn an_organisation_counts_every_control_plane_and_acceptance() {
        let org = org64();
        let (a, b) = (Seat::take(&org.member("a")), Seat::take(&org.member("b")));
        a.publish(figures(Usage::default(), Usage::default(), &[("m", flavor("M").usage())]));
        b.publish(figures(Usage::default(), Usage::default(), &[("tiny", flavor("2XS").usage())]));
        // Two control planes: 32 vCPU / 48 GB used, 32 / 16 left.
        assert_eq!(org.usage(), Usage { vcpu: 32, ram_gb: 48 });
        assert_eq!(org.members(), ["a", "b"]);
        // Judged one after the other: the M takes the last 16 GB (b's 2XS, in flight, is counted
        // only with concurrent judging).
        let limit = Usage { vcpu: 64, ram_gb: 64 };
        assert_eq!(
            a.judge("m", flavor("M").usage(), false),
            (QuotaVerdict::Fits(Usage { vcpu: 42, ram_gb: 64 }), limit)
        );
        assert_eq!(org.usage_of("a"), Some(Usage { vcpu: 26, ram_gb: 40 }), "counted at once");
        assert_eq!(
            b.judge("tiny", flavor("2XS").usage(), false),
            (QuotaVerdict::Exceeded("Quota exceeded: RAM max: limit = 64.0 GB | actual = 68.0 GB".to_string()), limit)
        );
        let stats = org.stats();
        assert_eq!((stats.verdicts, stats.refusals), (2, 1));
        assert_eq!(stats.refusals_by_member, BTreeMap::from([("b".to_string(), 1)]));
        assert_eq!(stats.peak, Usage { vcpu: 42, ram_gb: 64 });
        assert_eq!(org.usage(), Usage { vcpu: 42, ram_gb: 64 });

        // A higher limit applies to the next verdicts.
        org.set_limit(Usage { vcpu: 100, ram_gb: 100 });
        assert_eq!(org.limit(), Usage { vcpu: 100, ram_gb: 100 });
        assert!(matches!(b.judge("tiny", flavor("2XS").usage(), false).0, QuotaVerdict::Fits(_)));
        assert_eq!(org.stats().peak, Usage { vcpu: 46, ram_gb: 68 });
    }

    #[test]
    fn concurrent_judging_counts_every_members_pending_groups() {
        let org = org64();
        let (a, b) = (Seat::take(&org.member("a")), Seat::take(&org.member("b")));
        a.publish(figures(Usage::default(), Usage::default(), &[("a-m", flavor("M").usage())]));
        b.publish(figures(Usage::default(), Usage::default(), &[("b-m", flavor("M").usage())]));
        // 48 + 16 (b's M, in flight) + 16 = 80 GB.
        assert_eq!(
            a.judge("a-m", flavor("M").usage(), true).0,
            QuotaVerdict::Exceeded("Quota exceeded: RAM max: limit = 64.0 GB | actual = 80.0 GB".to_string())
        );
        // Its own pending group is not counted twice; without concurrency, other requests are not.
        assert_eq!(org.members(), ["a", "b"]);
        a.publish(figures(Usage::default(), Usage::default(), &[]));
        assert_eq!(b.judge("b-m", flavor("M").usage(), true).0, QuotaVerdict::Fits(Usage { vcpu: 42, ram_gb: 64 }));
    }

    #[test]
    fn leaked_reservations_count_across_members() {
        let org = org64();
        let (a, b) = (Seat::take(&org.member("a")), Seat::take(&org.member("b")));
        a.publish(figures(Usage::default(), flavor("L").usage(), &[]));
        b.publish(figures(Usage::default(), Usage::default(), &[]));
        assert_eq!(org.usage(), Usage { vcpu: 44, ram_gb: 72 });
        assert_eq!(
            b.judge("tiny", flavor("2XS").usage(), true).0,
            QuotaVerdict::Exceeded("Quota exceeded: RAM max: limit = 64.0 GB | actual = 76.0 GB".to_string())
        );
        // The leak expires (a's next publication): the same request fits.
        a.publish(figures(Usage::default(), Usage::default(), &[]));
        assert!(matches!(b.judge("tiny", flavor("2XS").usage(), true).0, QuotaVerdict::Fits(_)));
    }

    #[test]
    fn a_member_that_stops_frees_its_usage() {
        let org = org64();
        let a = Seat::take(&org.member("a"));
        let b = Seat::take(&org.member("b"));
        a.publish(figures(flavor("M").usage(), Usage::default(), &[]));
        b.publish(figures(Usage::default(), Usage::default(), &[]));
        assert!(matches!(b.judge("x", flavor("2XS").usage(), true).0, QuotaVerdict::Exceeded(_)));
        drop(a);
        assert_eq!(org.members(), ["b"]);
        assert_eq!(org.usage(), CP);
        assert_eq!(org.usage_of("a"), None);
        assert!(matches!(b.judge("x", flavor("2XS").usage(), true).0, QuotaVerdict::Fits(_)));

        // A seat left late (its cluster already restarted under the same id) leaves its
        // successor's figures alone.
        let old = Seat::take(&org.member("a"));
        old.publish(figures(Usage::default(), Usage::default(), &[]));
        let new = Seat::take(&org.member("a"));
        new.publish(figures(flavor("S").usage(), Usage::default(), &[]));
        drop(old);
        assert_eq!(org.usage_of("a"), Some(Usage { vcpu: 24, ram_gb: 36 }));
        drop(new);
        assert_eq!(org.members(), ["b"]);
    }

    #[test]
    fn simultaneous_judgements_never_both_take_the_last_headroom() {
        // Room for one M (48 + 16 = 64 GB): two members judge one at the same instant, repeatedly.
        for _ in 0..50 {
            let org = org64();
            let (a, b) = (Seat::take(&org.member("a")), Seat::take(&org.member("b")));
            a.publish(figures(Usage::default(), Usage::default(), &[]));
            b.publish(figures(Usage::default(), Usage::default(), &[]));
            let barrier = std::sync::Barrier::new(2);
            let take_m = |seat: &Seat| {
                barrier.wait();
                matches!(seat.judge("m", flavor("M").usage(), true).0, QuotaVerdict::Fits(_))
            };
            let fits = std::thread::scope(|s| {
                let ha = s.spawn(|| take_m(&a));
                let hb = s.spawn(|| take_m(&b));
                [ha.join().unwrap(), hb.join().unwrap()]
            });
            assert_eq!(fits.iter().filter(|f| **f).count(), 1, "{fits:?}");
            assert_eq!(org.stats().peak, Usage { vcpu: 42, ram_gb: 64 });
        }
    }

    #[test]
    fn members_compare_by_organisation_and_id() {
        let (org, other) = (org64(), org64());
        assert_eq!(org.member("a"), org.clone().member("a"));
        assert_ne!(org.member("a"), org.member("b"));
        assert_ne!(org.member("a"), other.member("a"));
        let q = QuotaConfig { organization: Some(org.member("a")), ..QuotaConfig::default() };
        assert_eq!(q.clone(), q);
        assert_ne!(q, QuotaConfig::default());
        assert!(format!("{q:?}").contains("\"a\""));
    }

    #[test]
    fn nominal_gb_of_custom_flavors() {
        for b in SimFlavor::builtins() {
            assert_eq!(SimFlavor::new(&b.name, b.cpu, b.memory_ki).nominal_gb, b.nominal_gb, "{}", b.name);
        }
        assert_eq!(SimFlavor::new("CUSTOM", 2, 2_097_152).nominal_gb, 2);
    }
}
