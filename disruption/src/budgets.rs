//! Disruption budgets at runtime (karpenter-semantics §1.2, §4.5, §9 D5–D6): how many of a pool's
//! nodes may be disrupted for a reason at `now`.
//!
//! Schedules are read with the webhook's grammar ([`crds::admission::schedule`]) first, so a
//! schedule the webhook refuses is never evaluated, then evaluated with `croner` in UTC. Pure: `now`
//! is an argument.

use std::collections::BTreeMap;

use crds::admission::schedule::{
    BudgetDurationError, BudgetNodes, BudgetNodesError, parse_budget_duration, parse_budget_nodes, parse_schedule,
};
use crds::nodepool::{Budget, DisruptionReason};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// The budget that applies when no budget is active for a reason (hub decision §9 D5).
pub const IMPLICIT_PERCENT: u8 = 10;

/// Why a pool's budgets cannot be evaluated; the pool then allows no disruption at all (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// `nodes` is neither a count nor a whole percentage.
    #[error("disruption budget {index}: nodes: {message}")]
    Nodes {
        /// Position in `spec.disruption.budgets`.
        index: usize,
        /// What is wrong and how to write it.
        message: BudgetNodesError,
    },
    /// `schedule` is not a UTC 5-field cron or macro.
    #[error("disruption budget {index}: schedule {schedule:?} {message}")]
    Schedule {
        /// Position in `spec.disruption.budgets`.
        index: usize,
        /// The schedule as written.
        schedule: String,
        /// What is wrong and how to write it.
        message: String,
    },
    /// `duration` is not hours and/or minutes.
    #[error("disruption budget {index}: duration: {message}")]
    Duration {
        /// Position in `spec.disruption.budgets`.
        index: usize,
        /// What is wrong and how to write it.
        message: BudgetDurationError,
    },
    /// Only one of `schedule` and `duration` is set.
    #[error(
        "disruption budget {index}: schedule and duration must be set together (e.g. schedule \"0 9 * * 1-5\", duration 8h)"
    )]
    Unpaired {
        /// Position in `spec.disruption.budgets`.
        index: usize,
    },
}

/// When a scheduled budget applies: for `minutes` after each time the cron fires.
#[derive(Debug, Clone)]
struct Window {
    cron: Cron,
    minutes: u64,
}

impl Window {
    /// Active iff the cron fired at some `f` with `now − duration < f ≤ now`.
    fn active(&self, now: Timestamp) -> bool {
        let zoned = now.to_zoned(TimeZone::UTC);
        // No earlier fire within croner's search range: never fired, so not active.
        let Ok(fired) = self.cron.find_previous_occurrence(&zoned, true) else {
            return false;
        };
        let elapsed = now.duration_since(fired.timestamp()).as_secs();
        // `minutes` is bounded by the parser; saturate anyway rather than overflow.
        let window = i64::try_from(self.minutes.saturating_mul(60)).unwrap_or(i64::MAX);
        elapsed < window
    }

    /// The first instant after `now` at which [`Window::active`] may answer differently: the open
    /// window's end, or the cron's next firing (whichever comes first).
    fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        let zoned = now.to_zoned(TimeZone::UTC);
        let next_fire = self.cron.find_next_occurrence(&zoned, false).ok().map(|z| z.timestamp());
        let window =
            jiff::SignedDuration::from_secs(i64::try_from(self.minutes.saturating_mul(60)).unwrap_or(i64::MAX));
        let end = self
            .cron
            .find_previous_occurrence(&zoned, true)
            .ok()
            .and_then(|fired| fired.timestamp().checked_add(window).ok())
            .filter(|end| *end > now);
        next_fire.into_iter().chain(end).min()
    }
}

/// One parsed budget.
#[derive(Debug, Clone)]
struct RuntimeBudget {
    nodes: BudgetNodes,
    window: Option<Window>,
    /// `None`: every reason.
    reasons: Option<Vec<DisruptionReason>>,
}

impl RuntimeBudget {
    fn value(&self, pool_nodes: usize) -> usize {
        value_of(self.nodes, pool_nodes)
    }

    fn applies_to(&self, reason: DisruptionReason) -> bool {
        self.reasons.as_ref().is_none_or(|r| r.contains(&reason))
    }

    /// Disrupting nodes this budget is charged with (§9 D6): all of them for a reason-less budget,
    /// else those leaving for one of its reasons.
    fn covered(&self, disrupting: &Disrupting) -> usize {
        match &self.reasons {
            None => disrupting.total,
            Some(reasons) => reasons.iter().map(|r| disrupting.by_reason.get(r).copied().unwrap_or(0)).sum(),
        }
    }
}

/// A count, or `ceil(p × N / 100)` as PDBs round (5 % of 10 is 1, 10 % of 15 is 2, of 0 is 0).
fn value_of(nodes: BudgetNodes, pool_nodes: usize) -> usize {
    match nodes {
        BudgetNodes::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
        BudgetNodes::Percent(p) => pool_nodes.saturating_mul(usize::from(p)).div_ceil(100),
    }
}

/// Nodes of a pool already being disrupted (Node not Ready, or marked for deletion for any cause),
/// counted by the `DisruptionReason` of their claim when it is a budget reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disrupting {
    /// All of them, whatever the cause (NotReady, expiry, repair, manual deletion, a command).
    pub total: usize,
    /// Those whose claim's `DisruptionReason` is a budget reason.
    pub by_reason: BTreeMap<DisruptionReason, usize>,
}

impl Disrupting {
    /// Counts one more disrupting node; `reason` is its claim's `DisruptionReason` if it is `Empty`,
    /// `Drifted` or `Underutilized`, `None` otherwise.
    pub fn add(&mut self, reason: Option<DisruptionReason>) {
        self.total += 1;
        if let Some(reason) = reason {
            *self.by_reason.entry(reason).or_default() += 1;
        }
    }
}

impl FromIterator<Option<DisruptionReason>> for Disrupting {
    fn from_iter<I: IntoIterator<Item = Option<DisruptionReason>>>(iter: I) -> Self {
        let mut d = Disrupting::default();
        for reason in iter {
            d.add(reason);
        }
        d
    }
}

/// A pool's budgets, parsed once; evaluate with [`Budgets::allowed`].
#[derive(Debug, Clone)]
pub struct Budgets {
    parsed: Result<Vec<RuntimeBudget>, BudgetError>,
}

impl Budgets {
    /// Parses `spec.disruption.budgets`. Never fails: a budget that does not parse makes the whole
    /// pool allow 0 (see [`Budgets::error`] for the event to emit).
    pub fn parse(budgets: &[Budget]) -> Budgets {
        Budgets { parsed: budgets.iter().enumerate().map(|(i, b)| parse_one(i, b)).collect() }
    }

    /// Why the budgets could not be read, if so.
    pub fn error(&self) -> Option<&BudgetError> {
        self.parsed.as_ref().err()
    }

    /// The first instant after `now` at which a scheduled budget opens or closes (what
    /// [`Budgets::allowed`] answers may change then with nothing else changing); `None` without
    /// schedules.
    pub fn next_change(&self, now: Timestamp) -> Option<Timestamp> {
        let budgets = self.parsed.as_ref().ok()?;
        budgets.iter().filter_map(|b| b.window.as_ref()?.next_change(now)).min()
    }

    /// How many more nodes may be disrupted for `reason` at `now`, out of `pool_nodes` countable
    /// nodes (managed, initialized, claim not `InstanceTerminating`), with `disrupting` already
    /// leaving. The minimum over active budgets that cover the reason, each minus the disrupting
    /// nodes it covers; no such budget ⇒ the implicit `10%`.
    pub fn allowed(
        &self,
        pool_nodes: usize,
        disrupting: &Disrupting,
        reason: DisruptionReason,
        now: Timestamp,
    ) -> usize {
        let Ok(budgets) = &self.parsed else {
            return 0;
        };
        budgets
            .iter()
            .filter(|b| b.applies_to(reason) && b.window.as_ref().is_none_or(|w| w.active(now)))
            .map(|b| b.value(pool_nodes).saturating_sub(b.covered(disrupting)))
            .min()
            .unwrap_or_else(|| {
                value_of(BudgetNodes::Percent(IMPLICIT_PERCENT), pool_nodes).saturating_sub(disrupting.total)
            })
    }
}

/// [`Budgets::allowed`] as a free function.
pub fn allowed(
    budgets: &Budgets,
    pool_nodes: usize,
    disrupting: &Disrupting,
    reason: DisruptionReason,
    now: Timestamp,
) -> usize {
    budgets.allowed(pool_nodes, disrupting, reason, now)
}

fn parse_one(index: usize, budget: &Budget) -> Result<RuntimeBudget, BudgetError> {
    let nodes = parse_budget_nodes(&budget.nodes).map_err(|message| BudgetError::Nodes { index, message })?;
    let window = match (&budget.schedule, &budget.duration) {
        (None, None) => None,
        (Some(schedule), Some(duration)) => {
            let minutes =
                parse_budget_duration(duration).map_err(|message| BudgetError::Duration { index, message })?;
            Some(Window { cron: parse_cron(index, schedule)?, minutes })
        }
        _ => return Err(BudgetError::Unpaired { index }),
    };
    Ok(RuntimeBudget { nodes, window, reasons: budget.reasons.clone() })
}

fn parse_cron(index: usize, schedule: &str) -> Result<Cron, BudgetError> {
    let fail = |message: String| BudgetError::Schedule { index, schedule: schedule.to_string(), message };
    // The webhook's grammar decides what is a schedule; croner only evaluates it.
    parse_schedule(schedule).map_err(|e| fail(e.0))?;
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(schedule.trim())
        .map_err(|e| fail(format!("cannot be evaluated: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use DisruptionReason::{Drifted, Empty, Underutilized};
    use proptest::prelude::*;

    fn budget(nodes: &str) -> Budget {
        Budget { nodes: nodes.to_string(), schedule: None, duration: None, reasons: None }
    }

    /// The loop keeps a view while nothing changes; time alone changes a scheduled budget's
    /// verdict, and `next_change` says when: never between two of its answers.
    #[test]
    fn a_scheduled_budget_says_when_it_opens_and_closes() {
        let nine_to_five = Budget { schedule: Some("0 9 * * *".into()), duration: Some("8h".into()), ..budget("0") };
        let b = Budgets::parse(&[nine_to_five]);
        let none = Disrupting::default();
        assert_eq!(b.next_change(at("2026-11-25T08:00:00Z")), Some(at("2026-11-25T09:00:00Z")), "opens at nine");
        assert_eq!(b.next_change(at("2026-11-25T10:30:00Z")), Some(at("2026-11-25T17:00:00Z")), "closes at five");
        assert_eq!(b.next_change(at("2026-11-25T17:00:00Z")), Some(at("2026-11-26T09:00:00Z")), "then the next day");
        assert_eq!(Budgets::parse(&[budget("1")]).next_change(at("2026-11-25T08:00:00Z")), None, "no schedule");
        // At every minute of two days, the answer does not move before the announced change.
        let mut t = at("2026-11-25T00:00:00Z");
        while t < at("2026-11-27T00:00:00Z") {
            let next = b.next_change(t).unwrap();
            assert!(next > t);
            let answer = b.allowed(10, &none, Empty, t);
            let just_before = next - jiff::SignedDuration::from_secs(1);
            assert_eq!(b.allowed(10, &none, Empty, just_before), answer, "{t} .. {just_before}");
            assert_ne!(b.allowed(10, &none, Empty, next), answer, "{next}");
            t += jiff::SignedDuration::from_mins(7);
        }
    }

    fn scheduled(nodes: &str, schedule: &str, duration: &str) -> Budget {
        Budget { schedule: Some(schedule.to_string()), duration: Some(duration.to_string()), ..budget(nodes) }
    }

    fn for_reasons(mut b: Budget, reasons: &[DisruptionReason]) -> Budget {
        b.reasons = Some(reasons.to_vec());
        b
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn none() -> Disrupting {
        Disrupting::default()
    }

    fn allowed_of(budgets: &[Budget], n: usize, d: &Disrupting, reason: DisruptionReason, now: &str) -> usize {
        Budgets::parse(budgets).allowed(n, d, reason, at(now))
    }

    const NOON: &str = "2026-11-25T12:00:00Z";

    #[test]
    fn counts_and_percentages_round_up_as_pdbs() {
        // §1.2 step 2: 5 % of 10 is 1, 10 % of 15 is 2, 10 % of 0 is 0.
        assert_eq!(allowed_of(&[budget("5%")], 10, &none(), Empty, NOON), 1);
        assert_eq!(allowed_of(&[budget("10%")], 15, &none(), Empty, NOON), 2);
        assert_eq!(allowed_of(&[budget("10%")], 0, &none(), Empty, NOON), 0);
        assert_eq!(allowed_of(&[budget("100%")], 7, &none(), Empty, NOON), 7);
        assert_eq!(allowed_of(&[budget("0%")], 7, &none(), Empty, NOON), 0);
        assert_eq!(allowed_of(&[budget("3")], 100, &none(), Empty, NOON), 3);
        // A count above the pool size is not capped here: the candidates are.
        assert_eq!(allowed_of(&[budget("30")], 2, &none(), Empty, NOON), 30);
    }

    #[test]
    fn default_budget_is_ten_percent() {
        let default = crds::nodepool::Disruption::default().budgets;
        assert_eq!(allowed_of(&default, 25, &none(), Underutilized, NOON), 3);
    }

    #[test]
    fn minimum_over_active_budgets_for_the_reason() {
        let budgets = [budget("5"), for_reasons(budget("1"), &[Drifted]), for_reasons(budget("0"), &[Empty])];
        assert_eq!(allowed_of(&budgets, 100, &none(), Underutilized, NOON), 5);
        assert_eq!(allowed_of(&budgets, 100, &none(), Drifted, NOON), 1);
        assert_eq!(allowed_of(&budgets, 100, &none(), Empty, NOON), 0);
    }

    #[test]
    fn cron_window_is_active_for_its_duration_after_each_fire() {
        // "No disruption on weekdays 09:00–17:00 UTC": 2026-11-25 is a Wednesday.
        let budgets = [scheduled("0", "0 9 * * 1-5", "8h"), budget("100%")];
        assert_eq!(allowed_of(&budgets, 10, &none(), Drifted, "2026-11-25T08:59:59Z"), 10);
        assert_eq!(allowed_of(&budgets, 10, &none(), Drifted, "2026-11-25T09:00:00Z"), 0);
        assert_eq!(allowed_of(&budgets, 10, &none(), Drifted, "2026-11-25T16:59:59Z"), 0);
        // The window is `now − duration < fire ≤ now`: 17:00 itself is outside.
        assert_eq!(allowed_of(&budgets, 10, &none(), Drifted, "2026-11-25T17:00:00Z"), 10);
        // Saturday: the cron did not fire that morning.
        assert_eq!(allowed_of(&budgets, 10, &none(), Drifted, "2026-11-28T10:00:00Z"), 10);
        // A window spanning midnight counts from the previous day's fire.
        let night = [scheduled("0", "0 22 * * *", "10h"), budget("100%")];
        assert_eq!(allowed_of(&night, 10, &none(), Drifted, "2026-11-25T07:59:00Z"), 0);
        assert_eq!(allowed_of(&night, 10, &none(), Drifted, "2026-11-25T08:00:00Z"), 10);
        // Macros and names as the webhook admits them.
        let hourly = [scheduled("0", "@hourly", "30m")];
        assert_eq!(allowed_of(&hourly, 10, &none(), Empty, "2026-11-25T12:29:00Z"), 0);
        let weekday_names = [scheduled("0", "0 9 * * MON-FRI", "1h30m"), budget("4")];
        assert_eq!(allowed_of(&weekday_names, 10, &none(), Empty, "2026-11-25T10:29:00Z"), 0);
        assert_eq!(allowed_of(&weekday_names, 10, &none(), Empty, "2026-11-25T10:30:00Z"), 4);
    }

    #[test]
    fn rare_and_long_windows() {
        // Every four years; a window longer than the gap between fires stays active throughout.
        let leap = [scheduled("0", "0 0 29 2 *", "1h"), budget("100%")];
        assert_eq!(allowed_of(&leap, 10, &none(), Empty, "2028-02-29T00:30:00Z"), 0);
        assert_eq!(allowed_of(&leap, 10, &none(), Empty, "2027-02-28T00:30:00Z"), 10);
        let always = [scheduled("0", "@hourly", "2h")];
        for now in ["2026-11-25T00:00:00Z", "2026-11-25T13:59:59Z"] {
            assert_eq!(allowed_of(&always, 10, &none(), Empty, now), 0, "{now}");
        }
    }

    #[test]
    fn a_reason_with_no_active_budget_gets_the_implicit_ten_percent() {
        // §9 D5: upstream leaves Drifted unbounded outside the window; the hub applies 10 %.
        let budgets = [for_reasons(scheduled("0", "0 9 * * 1-5", "8h"), &[Drifted])];
        assert_eq!(allowed_of(&budgets, 30, &none(), Drifted, "2026-11-25T10:00:00Z"), 0);
        assert_eq!(allowed_of(&budgets, 30, &none(), Drifted, "2026-11-25T20:00:00Z"), 3);
        assert_eq!(allowed_of(&budgets, 30, &none(), Empty, "2026-11-25T10:00:00Z"), 3);
        // The implicit budget is charged with every disrupting node.
        let d: Disrupting = [Some(Empty), None].into_iter().collect();
        assert_eq!(allowed_of(&budgets, 30, &d, Empty, "2026-11-25T10:00:00Z"), 1);
    }

    #[test]
    fn disrupting_nodes_are_charged_per_budget() {
        // §4.5 / §9 D6: a Drifted budget is not eaten by emptiness; a reason-less one counts all.
        let budgets = [for_reasons(budget("2"), &[Drifted]), budget("5")];
        let d: Disrupting = [Some(Empty), Some(Empty), None].into_iter().collect();
        assert_eq!(allowed_of(&budgets, 100, &d, Drifted, NOON), 2);
        assert_eq!(allowed_of(&budgets, 100, &d, Empty, NOON), 2);
        let d: Disrupting = [Some(Drifted)].into_iter().collect();
        assert_eq!(allowed_of(&budgets, 100, &d, Drifted, NOON), 1);
        // Never below zero.
        let d: Disrupting = std::iter::repeat_n(None, 9).collect();
        assert_eq!(allowed_of(&budgets, 100, &d, Underutilized, NOON), 0);
    }

    #[test]
    fn a_budget_that_does_not_parse_allows_nothing() {
        // §1.2 step 4: fail closed, with an error to report.
        for bad in [
            vec![budget("ten")],
            vec![budget("5"), scheduled("1", "0 9 * *", "8h")],
            vec![scheduled("1", "TZ=Europe/Paris 0 9 * * *", "8h")],
            vec![scheduled("1", "0 9 * * *", "30s")],
            vec![Budget { schedule: Some("@daily".into()), ..budget("1") }],
        ] {
            let parsed = Budgets::parse(&bad);
            assert!(parsed.error().is_some(), "{bad:?}");
            for reason in [Empty, Drifted, Underutilized] {
                assert_eq!(parsed.allowed(100, &none(), reason, at(NOON)), 0, "{bad:?}");
            }
        }
        let e = Budgets::parse(&[scheduled("1", "0 9 * *", "8h")]).error().cloned().unwrap();
        assert!(e.to_string().contains("has 4 fields"), "{e}");
    }

    #[test]
    fn checklist_10_1_budgets() {
        // 12. `10%` and 10 / 15 / 25 / 0 countable nodes → 1 / 2 / 3 / 0.
        for (n, want) in [(10, 1), (15, 2), (25, 3), (0, 0)] {
            assert_eq!(allowed_of(&[budget("10%")], n, &none(), Empty, NOON), want, "12: {n} nodes");
        }
        // 13. A weekday 09:00 window at 0 beside 20 %: Monday 10:00 → 0, 18:00 → 2 (2026-11-23 is a Monday).
        let b13 = [scheduled("0", "0 9 * * 1-5", "8h"), budget("20%")];
        assert_eq!(allowed_of(&b13, 10, &none(), Empty, "2026-11-23T10:00:00Z"), 0, "13");
        assert_eq!(allowed_of(&b13, 10, &none(), Empty, "2026-11-23T18:00:00Z"), 2, "13");
        // 14. `@daily` for 1h: active at 00:30, not at 01:30.
        let b14 = [scheduled("0", "@daily", "1h"), budget("100%")];
        assert_eq!(allowed_of(&b14, 10, &none(), Empty, "2026-11-23T00:30:00Z"), 0, "14");
        assert_eq!(allowed_of(&b14, 10, &none(), Empty, "2026-11-23T01:30:00Z"), 10, "14");
        // 15. Only a 09:00–17:00 window at 0, 20 nodes, 20:00 → the implicit 10 %: 2, not unbounded.
        let b15 = [scheduled("0", "0 9 * * *", "8h")];
        assert_eq!(allowed_of(&b15, 20, &none(), Drifted, "2026-11-23T20:00:00Z"), 2, "15");
        // 16. `[{0, [Drifted]}, {10%}]`, 10 nodes → Drifted 0, Empty 1, Underutilized 1.
        let b16 = [for_reasons(budget("0"), &[Drifted]), budget("10%")];
        assert_eq!(allowed_of(&b16, 10, &none(), Drifted, NOON), 0, "16");
        assert_eq!(allowed_of(&b16, 10, &none(), Empty, NOON), 1, "16");
        assert_eq!(allowed_of(&b16, 10, &none(), Underutilized, NOON), 1, "16");
        // 17. An unparsable stored cron → 0 for every reason, and an error for the event.
        let b17 = Budgets::parse(&[scheduled("5", "0 25 * * *", "1h")]);
        assert!(b17.error().is_some(), "17");
        for reason in [Empty, Drifted, Underutilized] {
            assert_eq!(b17.allowed(10, &none(), reason, at(NOON)), 0, "17");
        }
        // 18. Budget 3, 10 nodes, one Node NotReady (no reason) → 2.
        let not_ready: Disrupting = [None].into_iter().collect();
        assert_eq!(allowed_of(&[budget("3")], 10, &not_ready, Empty, NOON), 2, "18");
        // 19. `[{1, [Drifted]}, {50%}]`, 10 nodes, one leaving for Underutilized → Drifted 1, Underutilized 4.
        let b19 = [for_reasons(budget("1"), &[Drifted]), budget("50%")];
        let one: Disrupting = [Some(Underutilized)].into_iter().collect();
        assert_eq!(allowed_of(&b19, 10, &one, Drifted, NOON), 1, "19");
        assert_eq!(allowed_of(&b19, 10, &one, Underutilized, NOON), 4, "19");
    }

    proptest! {
        /// croner (evaluation) and the webhook's grammar (admission) agree minute by minute on
        /// every schedule the webhook admits, including Vixie's day-of-month/day-of-week rule.
        #[test]
        fn croner_agrees_with_the_webhook_grammar(
            minute in "(\\*|[0-5]?[0-9]|[0-9]-[1-5][0-9]|\\*/[1-9][0-9]?)",
            hour in "(\\*|1?[0-9]|[0-9]-1[0-9]|\\*/[1-9])",
            dom in "(\\*|\\?|[1-9]|1[0-9]|2[0-9]|3[01]|[1-9]-2[0-9]|\\*/[1-9]|1,15)",
            month in "(\\*|[1-9]|1[0-2]|[1-6]-1[0-2]|JAN|jun|\\*/[2-4])",
            dow in "(\\*|\\?|[0-6]|[0-2]-[3-6]|MON-FRI|sun|\\*/2|1,3)",
            offset in 0i64..(4 * 366 * 24 * 60),
        ) {
            let text = format!("{minute} {hour} {dom} {month} {dow}");
            let Ok(ours) = parse_schedule(&text) else { return Ok(()) };
            let cron = parse_cron(0, &text).expect("croner reads what the webhook admits");
            let t = at("2024-01-01T00:00:00Z").checked_add(jiff::SignedDuration::from_mins(offset)).unwrap();
            let z = t.to_zoned(TimeZone::UTC);
            let expected = ours.matches(
                z.minute() as u32, z.hour() as u32, z.day() as u32, z.month() as u32,
                z.weekday().to_sunday_zero_offset() as u32,
            );
            prop_assert_eq!(cron.is_time_matching(&z).unwrap(), expected, "{} at {}", text, t);
        }
    }
}
