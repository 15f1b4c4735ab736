//! The small grammars of a NodePool: disruption budget schedules (cron), budget durations, budget
//! `nodes`, and Go-style durations (`expireAfter`, `consolidateAfter`, `terminationGracePeriod`).
//!
//! The cron grammar is the intersection of what upstream Karpenter accepts (robfig/cron's standard
//! parser: 5 fields or a macro) and what a strict POSIX/Vixie parser such as `croner` accepts, so a
//! schedule admitted here ports both ways and can be evaluated by the hub. Schedules are always
//! UTC. Parsing only: evaluating a schedule at a time belongs to the budget logic, which gets `now`
//! passed in. Pure: no clock, no I/O.

use std::fmt;

/// The macros Karpenter accepts, with the 5-field schedule each stands for.
pub const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const MONTH_NAMES: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
/// Longest day count of each month (February counts its leap day: a schedule on the 29th fires).
const DAYS_IN_MONTH: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
/// A schedule longer than this is not a typo we can help with; refuse it without parsing further.
const MAX_SCHEDULE_LEN: usize = 256;

/// The five fields of a schedule, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

impl Field {
    const ALL: [Field; 5] = [Field::Minute, Field::Hour, Field::DayOfMonth, Field::Month, Field::DayOfWeek];

    fn name(self) -> &'static str {
        match self {
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day of month",
            Field::Month => "month",
            Field::DayOfWeek => "day of week",
        }
    }

    fn bounds(self) -> (u32, u32) {
        match self {
            Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            Field::DayOfWeek => (0, 6),
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Month => &MONTH_NAMES,
            Field::DayOfWeek => &DAY_NAMES,
            _ => &[],
        }
    }

    /// The number a name stands for (`JAN` is 1, `SUN` is 0), case-insensitive.
    fn value_of_name(self, name: &str) -> Option<u32> {
        let offset = if self == Field::Month { 1 } else { 0 };
        self.names()
            .iter()
            .position(|n| n.eq_ignore_ascii_case(name))
            .and_then(|i| u32::try_from(i).ok())
            .map(|i| i + offset)
    }
}

/// A parsed schedule: the set of values of each field, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Bit `m` set: fires at minute `m`.
    pub minutes: u64,
    /// Bit `h` set: fires at hour `h`.
    pub hours: u32,
    /// Bit `d` set (1–31): fires on day `d` of the month.
    pub days_of_month: u32,
    /// Bit `m` set (1–12): fires in month `m`.
    pub months: u16,
    /// Bit `d` set (0 = Sunday … 6 = Saturday): fires on that weekday.
    pub days_of_week: u8,
    /// The day-of-month field was `*` or `?` (unrestricted).
    pub any_day_of_month: bool,
    /// The day-of-week field was `*` or `?` (unrestricted).
    pub any_day_of_week: bool,
}

impl Schedule {
    /// Whether the schedule matches a UTC minute (Vixie cron: when both day fields are restricted,
    /// either one matching is enough). `month` 1–12, `weekday` 0 = Sunday.
    pub fn matches(&self, minute: u32, hour: u32, day_of_month: u32, month: u32, weekday: u32) -> bool {
        let bit64 = |set: u64, v: u32| v < 64 && set & (1 << v) != 0;
        let dom = bit64(u64::from(self.days_of_month), day_of_month);
        let dow = bit64(u64::from(self.days_of_week), weekday);
        let day = match (self.any_day_of_month, self.any_day_of_week) {
            (false, false) => dom || dow,
            _ => dom && dow,
        };
        bit64(self.minutes, minute) && bit64(u64::from(self.hours), hour) && bit64(u64::from(self.months), month) && day
    }

    /// Whether the schedule ever fires: a day of month that no selected month has (`0 0 30 2 *`)
    /// never does. Only decidable this simply when the weekday is unrestricted; with both day fields
    /// restricted the weekdays alone make it fire.
    pub fn ever_fires(&self) -> bool {
        if self.any_day_of_month || !self.any_day_of_week {
            return true;
        }
        (1..=12u32).any(|month| {
            self.months & (1 << month) != 0
                && (1..=DAYS_IN_MONTH[month as usize - 1]).any(|day| self.days_of_month & (1 << day) != 0)
        })
    }
}

/// Why a schedule is refused; the message says how to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleError(pub String);

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const SHAPE: &str = "a schedule is 5 fields, minute hour day-of-month month day-of-week, in UTC (e.g. \"0 9 * * 1-5\"), \
                     or one of @yearly @annually @monthly @weekly @daily @midnight @hourly";

/// Parses a budget schedule: 5 fields (numbers, `*`, `?` in the day fields, ranges `a-b`, steps
/// `*/n` and `a-b/n`, lists, month and weekday names) or a macro; always UTC.
pub fn parse_schedule(schedule: &str) -> Result<Schedule, ScheduleError> {
    let fail = |message: String| Err(ScheduleError(message));
    if schedule.len() > MAX_SCHEDULE_LEN {
        return fail(format!("is {} characters long; {SHAPE}", schedule.len()));
    }
    let trimmed = schedule.trim();
    if trimmed.is_empty() {
        return fail(format!("is empty; {SHAPE}"));
    }
    let upper = trimmed.to_ascii_uppercase();
    if upper.starts_with("TZ=") || upper.starts_with("CRON_TZ=") {
        return fail("schedules are always UTC: remove the time-zone prefix and convert the times to UTC".to_string());
    }
    let expanded = if trimmed.starts_with('@') {
        match MACROS.iter().find(|(name, _)| *name == trimmed) {
            Some((_, fields)) => *fields,
            None if trimmed.starts_with("@every") => {
                return fail(format!("@every is not supported; {SHAPE}"));
            }
            None => return fail(format!("unknown macro {trimmed:?} (macros are lowercase); {SHAPE}")),
        }
    } else {
        trimmed
    };
    let parts: Vec<&str> = expanded.split_ascii_whitespace().collect();
    if parts.len() != 5 {
        let seconds = if parts.len() == 6 { " (seconds are not supported)" } else { "" };
        return fail(format!("has {} fields{seconds}; {SHAPE}", parts.len()));
    }
    let mut sets = [0u64; 5];
    for (i, field) in Field::ALL.into_iter().enumerate() {
        sets[i] = parse_field(field, parts[i])
            .map_err(|m| ScheduleError(format!("{} field {:?}: {m}", field.name(), parts[i])))?;
    }
    let any = |part: &str| part == "*" || part == "?";
    // The bounds above keep every set within its type.
    let schedule = Schedule {
        minutes: sets[0],
        hours: u32::try_from(sets[1]).unwrap_or(0),
        days_of_month: u32::try_from(sets[2]).unwrap_or(0),
        months: u16::try_from(sets[3]).unwrap_or(0),
        days_of_week: u8::try_from(sets[4]).unwrap_or(0),
        any_day_of_month: any(parts[2]),
        any_day_of_week: any(parts[4]),
    };
    if !schedule.ever_fires() {
        return fail(format!(
            "never fires: no selected month has day {}; pick days that exist (February has 29 at most)",
            parts[2]
        ));
    }
    Ok(schedule)
}

/// Why one field of a schedule is refused; [`parse_schedule`] prefixes the field's name and text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum FieldError {
    #[error("has an empty list item; separate values with single commas, e.g. 1,15")]
    EmptyItem,
    #[error("'?' is only allowed in the day-of-month and day-of-week fields; use '*'")]
    QuestionMark,
    #[error("range {range} runs backwards; write the smaller value first")]
    Backwards { range: String },
    #[error("write {range}-{max}/<step> rather than {range}/<step> (not every cron parser reads the short form)")]
    ShortStep { range: String, max: u32 },
    #[error("step {text:?} must be a whole number from 1 to {most}")]
    Step { text: String, most: u32 },
    #[error("7 is not a day of week here; write 0 for Sunday")]
    Sunday7,
    #[error("{value} is out of range {min}-{max}")]
    OutOfRange { value: u32, min: u32, max: u32 },
    #[error("{text:?} is not a number from {min} to {max}")]
    NotANumber { text: String, min: u32, max: u32 },
    #[error("{text:?} is not a number from {min} to {max} nor a name ({})", .names.join(" "))]
    NotANumberNorName { text: String, min: u32, max: u32, names: &'static [&'static str] },
}

fn parse_field(field: Field, text: &str) -> Result<u64, FieldError> {
    let (min, max) = field.bounds();
    let mut set = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(FieldError::EmptyItem);
        }
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(parse_step(step, min, max)?)),
            None => (item, None),
        };
        let (start, end) = if range == "*" {
            (min, max)
        } else if range == "?" {
            if !matches!(field, Field::DayOfMonth | Field::DayOfWeek) {
                return Err(FieldError::QuestionMark);
            }
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (parse_value(field, a)?, parse_value(field, b)?);
            if a > b {
                return Err(FieldError::Backwards { range: range.to_string() });
            }
            (a, b)
        } else {
            let v = parse_value(field, range)?;
            if step.is_some() {
                return Err(FieldError::ShortStep { range: range.to_string(), max });
            }
            (v, v)
        };
        let step = step.unwrap_or(1);
        let mut v = start;
        while v <= end {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

fn parse_step(text: &str, min: u32, max: u32) -> Result<u32, FieldError> {
    match parse_number(text) {
        Some(step) if step >= 1 && step <= max - min + 1 => Ok(step),
        _ => Err(FieldError::Step { text: text.to_string(), most: max - min + 1 }),
    }
}

fn parse_value(field: Field, text: &str) -> Result<u32, FieldError> {
    let (min, max) = field.bounds();
    let names = field.names();
    let value = parse_number(text).or_else(|| field.value_of_name(text));
    match value {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        Some(v) if field == Field::DayOfWeek && v == 7 => Err(FieldError::Sunday7),
        Some(value) => Err(FieldError::OutOfRange { value, min, max }),
        None if names.is_empty() => Err(FieldError::NotANumber { text: text.to_string(), min, max }),
        None => Err(FieldError::NotANumberNorName { text: text.to_string(), min, max, names }),
    }
}

/// Digits only (no sign, no spaces), at most 4 of them: every field value is small.
fn parse_number(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 4 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Why a budget `duration` is refused; the message says how to write one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetDurationError {
    /// Not hours and/or minutes.
    #[error("{text:?} is not a budget duration; {BUDGET_DURATION_FIX}")]
    NotADuration {
        /// The duration as written.
        text: String,
    },
    /// Has seconds, which a budget window cannot.
    #[error("{text:?} has seconds; budget windows are whole minutes: {BUDGET_DURATION_FIX}")]
    Seconds {
        /// The duration as written.
        text: String,
    },
}

const BUDGET_DURATION_FIX: &str = "write hours and/or minutes, e.g. 8h, 90m or 1h30m";

/// Parses a budget `duration`: hours and/or minutes (`8h`, `90m`, `1h30m`), optionally followed by
/// `0s` as Go prints durations (`1h30m0s`). Returns minutes.
pub fn parse_budget_duration(text: &str) -> Result<u64, BudgetDurationError> {
    // Go prints `1h30m0s`: a trailing `0s` is allowed right after an hour or minute unit only.
    let core = text.strip_suffix("0s").filter(|c| c.ends_with('h') || c.ends_with('m')).unwrap_or(text);
    let not_a_duration = || BudgetDurationError::NotADuration { text: text.to_string() };
    let number = |digits: &str| -> Result<u64, BudgetDurationError> {
        if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(not_a_duration());
        }
        digits.parse().map_err(|_| not_a_duration())
    };
    let minutes = if let Some(hours) = core.strip_suffix('h') {
        number(hours)?.saturating_mul(60)
    } else if let Some(rest) = core.strip_suffix('m') {
        match rest.split_once('h') {
            Some((hours, minutes)) => number(hours)?.saturating_mul(60).saturating_add(number(minutes)?),
            None => number(rest)?,
        }
    } else if core.ends_with('s') {
        return Err(BudgetDurationError::Seconds { text: text.to_string() });
    } else {
        return Err(not_a_duration());
    };
    Ok(minutes)
}

/// A budget's `nodes`: a count or a whole percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetNodes {
    /// At most this many nodes.
    Count(u32),
    /// At most this percentage (0–100) of the pool's nodes, rounded up.
    Percent(u8),
}

/// Why a budget's `nodes` is refused; the message says how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetNodesError {
    /// Ends in `%` but is not a whole percentage from 0 to 100.
    #[error("{text:?} is not a valid percentage; {BUDGET_NODES_FIX}")]
    Percentage {
        /// The value as written.
        text: String,
    },
    /// Neither digits nor a percentage.
    #[error("{text:?} is not a node count; {BUDGET_NODES_FIX}")]
    Count {
        /// The value as written.
        text: String,
    },
    /// A count that does not fit an `int32`.
    #[error("{text:?} is too large (at most {}); {BUDGET_NODES_FIX}", i32::MAX)]
    TooLarge {
        /// The value as written.
        text: String,
    },
}

const BUDGET_NODES_FIX: &str = "write a count such as \"3\" or a whole percentage from 0% to 100% such as \"10%\"";

/// Parses a budget's `nodes` (`"3"`, `"10%"`): counts fit an `int32`, percentages are whole, 0–100.
pub fn parse_budget_nodes(text: &str) -> Result<BudgetNodes, BudgetNodesError> {
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(percent) = text.strip_suffix('%') {
        return match percent.parse::<u8>() {
            Ok(p) if digits_only(percent) && percent.len() <= 3 && p <= 100 => Ok(BudgetNodes::Percent(p)),
            _ => Err(BudgetNodesError::Percentage { text: text.to_string() }),
        };
    }
    if !digits_only(text) {
        return Err(BudgetNodesError::Count { text: text.to_string() });
    }
    match text.parse::<u32>() {
        Ok(n) if i32::try_from(n).is_ok() => Ok(BudgetNodes::Count(n)),
        _ => Err(BudgetNodesError::TooLarge { text: text.to_string() }),
    }
}

/// Why a Go-style duration is refused. Each message quotes the text and says how to write one
/// (mentioning `Never` where the field allows it, `nillable`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// A number too large for a `u64` of seconds.
    #[error("{text:?} is too large; {}", duration_fix(*.nillable))]
    Overflow {
        /// The duration as written.
        text: String,
        /// Whether the field accepts `Never`.
        nillable: bool,
    },
    /// Beyond Go's `time.Duration` (an `int64` of nanoseconds).
    #[error("{text:?} is too large (at most about 292 years); {}", duration_fix(*.nillable))]
    BeyondGo {
        /// The duration as written.
        text: String,
        /// Whether the field accepts `Never`.
        nillable: bool,
    },
    /// Days, weeks or years, which Go durations do not have.
    #[error("{text:?}: days and weeks are not units here; {} (7 days = 168h)", duration_fix(*.nillable))]
    DaysOrWeeks {
        /// The duration as written.
        text: String,
        /// Whether the field accepts `Never`.
        nillable: bool,
    },
    /// A character that is neither a digit nor a unit.
    #[error("{text:?} is not a duration; {}", duration_fix(*.nillable))]
    NotADuration {
        /// The duration as written.
        text: String,
        /// Whether the field accepts `Never`.
        nillable: bool,
    },
    /// Digits without a unit, or no number at all.
    #[error("{text:?} is not a duration (every number needs a unit); {}", duration_fix(*.nillable))]
    MissingUnit {
        /// The duration as written.
        text: String,
        /// Whether the field accepts `Never`.
        nillable: bool,
    },
}

fn duration_fix(nillable: bool) -> &'static str {
    if nillable {
        "write a number with a unit s, m or h (e.g. 720h or 1h30m), or Never"
    } else {
        "write a number with a unit s, m or h (e.g. 10m or 1h30m)"
    }
}

/// A Go-style duration restricted to `s`, `m` and `h` units (`720h`, `1h30m`, `90s`), or `Never` when
/// `nillable`. Returns seconds, or `None` for `Never`. Durations beyond Go's limit (~292 years) are refused.
pub fn parse_duration(text: &str, nillable: bool) -> Result<Option<u64>, DurationError> {
    if nillable && text == "Never" {
        return Ok(None);
    }
    // Go's time.Duration is an int64 of nanoseconds.
    const MAX_SECONDS: u64 = (i64::MAX as u64) / 1_000_000_000;
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut saw_unit = false;
    for c in text.chars() {
        match c {
            '0'..='9' => digits.push(c),
            's' | 'm' | 'h' if !digits.is_empty() => {
                let n: u64 =
                    digits.parse().map_err(|_| DurationError::Overflow { text: text.to_string(), nillable })?;
                let unit = match c {
                    's' => 1,
                    'm' => 60,
                    _ => 3600,
                };
                total = n
                    .checked_mul(unit)
                    .and_then(|s| total.checked_add(s))
                    .ok_or_else(|| DurationError::Overflow { text: text.to_string(), nillable })?;
                digits.clear();
                saw_unit = true;
            }
            'd' | 'w' | 'y' => {
                return Err(DurationError::DaysOrWeeks { text: text.to_string(), nillable });
            }
            _ => return Err(DurationError::NotADuration { text: text.to_string(), nillable }),
        }
    }
    if !digits.is_empty() || !saw_unit {
        return Err(DurationError::MissingUnit { text: text.to_string(), nillable });
    }
    if total > MAX_SECONDS {
        return Err(DurationError::BeyondGo { text: text.to_string(), nillable });
    }
    Ok(Some(total))
}

/// A duration as Go's `time.ParseDuration` reads it (what Karpenter reads
/// `karpenter.sh/do-not-disrupt` with): an optional sign, then decimal numbers with an optional
/// fraction, each with a unit `ns`, `us` (`µs`), `ms`, `s`, `m` or `h` (`1.5h`, `+30m`, `1h30m`,
/// `300ms`). `None` when it is not one, or not positive (Karpenter refuses those too), or beyond
/// Go's limit (~292 years).
pub fn parse_go_duration(text: &str) -> Option<std::time::Duration> {
    let nanos = crd_schema::parse_go_duration(text)?;
    u64::try_from(nanos).ok().filter(|n| *n > 0).map(std::time::Duration::from_nanos)
}

/// Whether `karpenter.sh/do-not-disrupt: <value>` protects a pod that has run `running_for` seconds
/// (from its start; `None`: not known): `"true"` always, `"false"` never, a Go duration while the
/// pod has run less than it (not known: it does, the cautious reading). `None`: the value is none
/// of these (the caller ignores it, and says so).
pub fn do_not_disrupt_holds(value: &str, running_for: Option<i64>) -> Option<bool> {
    match value {
        "true" => Some(true),
        "false" => Some(false),
        _ => {
            let d = parse_go_duration(value)?;
            Some(running_for.is_none_or(|r| r < i64::try_from(d.as_secs()).unwrap_or(i64::MAX)))
        }
    }
}

/// Seconds as a short human text (`1h30m`, `45s`).
pub fn format_seconds(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> Schedule {
        parse_schedule(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(s: &str) -> String {
        match parse_schedule(s) {
            Ok(v) => panic!("{s:?} accepted: {v:?}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn accepts_karpenter_schedules() {
        for s in [
            "0 9 * * 1-5",
            "* * * * *",
            "*/15 * * * *",
            "0 0 1,15 * *",
            "0 22 * * MON-FRI",
            "0 0 1 jan *",
            "30 2 ? * sun",
            "0-30/10 8-18/2 1-31 1-12 0-6",
            "0 0 29 2 *",
            "  0 9 * * 1  ",
            "0\t9 * * 1",
        ] {
            ok(s);
        }
        for (name, _) in MACROS {
            ok(name);
        }
        let s = ok("0 9 * * 1-5");
        assert_eq!(s.minutes, 1);
        assert_eq!(s.hours, 1 << 9);
        assert_eq!(s.days_of_week, 0b0011_1110);
        assert!(s.any_day_of_month && !s.any_day_of_week);
        assert_eq!(ok("@daily"), ok("0 0 * * *"));
        assert_eq!(ok("@midnight"), ok("@daily"));
        assert_eq!(ok("@weekly").days_of_week, 1);
    }

    #[test]
    fn refuses_what_some_parser_would_not_read() {
        assert!(err("").contains("empty"));
        assert!(err("0 9 * *").contains("has 4 fields"));
        assert!(err("0 0 9 * * 1").contains("seconds are not supported"));
        assert!(err("TZ=Europe/Paris 0 9 * * *").contains("always UTC"));
        assert!(err("CRON_TZ=UTC 0 9 * * *").contains("always UTC"));
        assert!(err("@DAILY").contains("lowercase"));
        assert!(err("@every 1h").contains("@every"));
        assert!(err("60 * * * *").contains("minute field \"60\": 60 is out of range 0-59"));
        assert!(err("0 24 * * *").contains("hour"));
        assert!(err("0 0 0 * *").contains("day of month"));
        assert!(err("0 0 * 13 *").contains("month"));
        assert!(err("0 0 * * 7").contains("write 0 for Sunday"));
        assert!(err("5/15 * * * *").contains("5-59/<step>"));
        assert!(err("*/0 * * * *").contains("step"));
        assert!(err("*/61 * * * *").contains("step"));
        assert!(err("0 17-9 * * *").contains("backwards"));
        assert!(err("0 0 L * *").contains("not a number"));
        assert!(err("0 0 * * 1#2").contains("not a number"));
        assert!(err("0 0 1W * *").contains("not a number"));
        assert!(err("0 0 1,,2 * *").contains("empty list item"));
        assert!(err("? * * * *").contains("'?' is only allowed"));
        assert!(err("0 0 * * MONDAY").contains("nor a name"));
        assert!(err("-1 * * * *").contains("not a number"));
        assert!(err(&"1 ".repeat(200)).contains("characters long"));
    }

    #[test]
    fn impossible_days_never_fire() {
        assert!(err("0 0 30 2 *").contains("never fires"));
        assert!(err("0 0 31 4,6,9,11 *").contains("never fires"));
        // With the weekday restricted too, Vixie cron fires on those weekdays.
        ok("0 0 30 2 1");
        ok("0 0 31 1-12 *");
    }

    #[test]
    fn matches_follows_vixie_day_rules() {
        let s = ok("0 9 * * 1-5");
        assert!(s.matches(0, 9, 17, 11, 1));
        assert!(!s.matches(0, 9, 15, 11, 0));
        assert!(!s.matches(1, 9, 17, 11, 1));
        // Both day fields restricted: either is enough.
        let s = ok("0 0 1 * 1");
        assert!(s.matches(0, 0, 1, 3, 4));
        assert!(s.matches(0, 0, 9, 3, 1));
        assert!(!s.matches(0, 0, 9, 3, 2));
        // Out-of-range inputs never match and never panic.
        assert!(!ok("* * * * *").matches(99, 99, 99, 99, 99));
    }

    #[test]
    fn budget_durations() {
        assert_eq!(parse_budget_duration("8h"), Ok(480));
        assert_eq!(parse_budget_duration("90m"), Ok(90));
        assert_eq!(parse_budget_duration("1h30m"), Ok(90));
        assert_eq!(parse_budget_duration("1h30m0s"), Ok(90));
        assert_eq!(parse_budget_duration("2h0s"), Ok(120));
        assert!(parse_budget_duration("30s").unwrap_err().to_string().contains("whole minutes"));
        for bad in ["", "0s", "1d", "h", "1h30", "1m30h", "-1h", "1.5h", "1h 30m", "99999999999999h"] {
            assert!(parse_budget_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn budget_nodes() {
        assert_eq!(parse_budget_nodes("0"), Ok(BudgetNodes::Count(0)));
        assert_eq!(parse_budget_nodes("25"), Ok(BudgetNodes::Count(25)));
        assert_eq!(parse_budget_nodes("100%"), Ok(BudgetNodes::Percent(100)));
        assert_eq!(parse_budget_nodes("0%"), Ok(BudgetNodes::Percent(0)));
        for bad in ["101%", "10.5%", "-1", "", "%", "1e3", " 1", "+1", "4294967296", "2147483648", "0100%"] {
            assert!(parse_budget_nodes(bad).is_err(), "{bad:?}");
        }
        assert!(parse_budget_nodes("2147483647").is_ok());
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("720h", true), Ok(Some(720 * 3600)));
        assert_eq!(parse_duration("Never", true), Ok(None));
        assert!(parse_duration("Never", false).is_err());
        assert_eq!(parse_duration("1h30m10s", false), Ok(Some(5410)));
        assert_eq!(parse_duration("0s", false), Ok(Some(0)));
        assert!(parse_duration("30d", true).unwrap_err().to_string().contains("168h"));
        for bad in ["", "10", "h", "1.5h", "-1h", "1ms", "1 h", "99999999999999999999h", "2562048h"] {
            assert!(parse_duration(bad, true).is_err(), "{bad:?}");
        }
        assert_eq!(format_seconds(5410), "1h30m10s");
        assert_eq!(format_seconds(0), "0s");
        assert_eq!(format_seconds(120), "2m");
    }

    /// The typed errors print the words the webhook has always denied with.
    #[test]
    fn error_messages_keep_their_words() {
        let never = "write a number with a unit s, m or h (e.g. 720h or 1h30m), or Never";
        let plain = "write a number with a unit s, m or h (e.g. 10m or 1h30m)";
        let duration = |t: &str, n: bool| parse_duration(t, n).unwrap_err().to_string();
        assert_eq!(duration("99999999999999999999s", true), format!("\"99999999999999999999s\" is too large; {never}"));
        assert_eq!(
            duration("3000000h", false),
            format!("\"3000000h\" is too large (at most about 292 years); {plain}")
        );
        assert_eq!(duration("2d", true), format!("\"2d\": days and weeks are not units here; {never} (7 days = 168h)"));
        assert_eq!(duration("1x", false), format!("\"1x\" is not a duration; {plain}"));
        assert_eq!(duration("10", true), format!("\"10\" is not a duration (every number needs a unit); {never}"));
        let fix = "write a count such as \"3\" or a whole percentage from 0% to 100% such as \"10%\"";
        let nodes = |t: &str| parse_budget_nodes(t).unwrap_err().to_string();
        assert_eq!(nodes("101%"), format!("\"101%\" is not a valid percentage; {fix}"));
        assert_eq!(nodes("x"), format!("\"x\" is not a node count; {fix}"));
        assert_eq!(nodes("2147483648"), format!("\"2147483648\" is too large (at most 2147483647); {fix}"));
        let fix = "write hours and/or minutes, e.g. 8h, 90m or 1h30m";
        let window = |t: &str| parse_budget_duration(t).unwrap_err().to_string();
        assert_eq!(window("1d"), format!("\"1d\" is not a budget duration; {fix}"));
        assert_eq!(window("30s"), format!("\"30s\" has seconds; budget windows are whole minutes: {fix}"));
        assert_eq!(err("*/0 * * * *"), "minute field \"*/0\": step \"0\" must be a whole number from 1 to 60");
        assert_eq!(
            err("0 0 * * MONDAY"),
            "day of week field \"MONDAY\": \"MONDAY\" is not a number from 0 to 6 nor a name (SUN MON TUE WED THU FRI SAT)"
        );
    }

    proptest! {
        #[test]
        fn schedules_never_panic(s in "[0-9*?/,\\- A-Za-z@#]{0,40}") {
            let _ = parse_schedule(&s);
        }

        #[test]
        fn durations_never_panic(s in "[0-9smhdNever.%\\-]{0,30}") {
            let _ = parse_duration(&s, true);
            let _ = parse_budget_duration(&s);
            let _ = parse_budget_nodes(&s);
        }

        #[test]
        fn parsed_schedules_stay_in_bounds(s in "(\\*|[0-9]{1,2}(-[0-9]{1,2})?)(/[1-9])? \\* \\* \\* \\*") {
            if let Ok(schedule) = parse_schedule(&s) {
                prop_assert!(schedule.minutes < 1 << 60);
                prop_assert!(schedule.minutes != 0);
            }
        }
    }

    #[test]
    fn go_durations_read_as_go_reads_them() {
        use std::time::Duration as D;
        let go = parse_go_duration;
        assert_eq!(go("1.5h"), Some(D::from_secs(5400)));
        assert_eq!(go(".5h"), Some(D::from_secs(1800)));
        assert_eq!(go("1.h"), Some(D::from_secs(3600)));
        assert_eq!(go("+30m"), Some(D::from_secs(1800)));
        assert_eq!(go("1h30m10s"), Some(D::from_secs(5410)));
        assert_eq!(go("300ms"), Some(D::from_millis(300)));
        assert_eq!(go("2us"), Some(D::from_micros(2)));
        assert_eq!(go("2\u{b5}s"), Some(D::from_micros(2)));
        assert_eq!(go("7ns"), Some(D::from_nanos(7)));
        for bad in ["", "0", "0s", "-5m", "+", ".", "5", "5d", "1h 30m", "true", "h", "3000000h"] {
            assert_eq!(go(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn do_not_disrupt_holds_forever_never_or_for_its_duration() {
        assert_eq!(do_not_disrupt_holds("true", Some(i64::MAX)), Some(true));
        assert_eq!(do_not_disrupt_holds("false", None), Some(false));
        assert_eq!(do_not_disrupt_holds("0.5h", Some(1799)), Some(true));
        assert_eq!(do_not_disrupt_holds("0.5h", Some(1800)), Some(false));
        assert_eq!(do_not_disrupt_holds("30m", None), Some(true), "start not known: it holds");
        assert_eq!(do_not_disrupt_holds("banana", Some(0)), None);
    }
}
