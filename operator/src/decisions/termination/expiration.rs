//! Expiration (karpenter-semantics §4.1): a claim older than its `expireAfter` is deleted at once,
//! forcefully: no disruption budget, no simulation, no replacement launched first (the provisioner
//! re-homes the pods the drain evicts). The deletion goes through the ordinary termination path.
//! Must not: read the clock (now is an argument) or delete anything itself.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Event reason on a claim deleted for its age (Karpenter's disruption reason `Expired`).
pub const EXPIRED: &str = "Expired";

/// What to do about a claim's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Past its lifetime: delete it now.
    Expire,
    /// Not yet: look again at this time (the claim's expiry), no polling before.
    RecheckAt(Timestamp),
    /// Never expires: `Never`, no `expireAfter`, no creation time, or already being deleted.
    Never,
}

impl Expiry {
    /// How long from `now` until the recheck, if there is one.
    pub fn recheck_in(self, now: Timestamp) -> Option<Duration> {
        match self {
            Expiry::RecheckAt(at) => Some(Duration::try_from(at.duration_since(now)).unwrap_or_default()),
            Expiry::Expire | Expiry::Never => None,
        }
    }
}

/// An `expireAfter` the hub cannot read. Admission rejects these; a claim written around the
/// webhook is left alone (never expired by guess) and reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpireAfterError {
    #[error("expireAfter {value:?} is not a duration like \"720h\" or \"Never\": {why}")]
    Unparsable { value: String, why: crds::admission::schedule::DurationError },
    #[error("expireAfter {value:?} puts the expiry past the representable time")]
    TooLarge { value: String },
}

/// Decide from the claim's creation time, its `expireAfter`, whether it is already being deleted,
/// and now. Expiry is at `created + expireAfter`, inclusive: at that instant the claim expires.
pub fn decide(
    created: Option<Timestamp>,
    expire_after: Option<&str>,
    deleting: bool,
    now: Timestamp,
) -> Result<Expiry, ExpireAfterError> {
    let (Some(created), Some(value), false) = (created, expire_after, deleting) else {
        return Ok(Expiry::Never);
    };
    let seconds = crds::admission::schedule::parse_duration(value, true)
        .map_err(|why| ExpireAfterError::Unparsable { value: value.to_string(), why })?;
    let Some(seconds) = seconds else {
        return Ok(Expiry::Never);
    };
    let too_large = || ExpireAfterError::TooLarge { value: value.to_string() };
    let at = i64::try_from(seconds)
        .ok()
        .and_then(|s| created.checked_add(SignedDuration::from_secs(s)).ok())
        .ok_or_else(too_large)?;
    Ok(if now >= at { Expiry::Expire } else { Expiry::RecheckAt(at) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const CREATED: &str = "2026-01-01T00:00:00Z";

    /// (case, created, expireAfter, deleting, now, expected)
    type Case = (&'static str, Option<Timestamp>, Option<&'static str>, bool, &'static str, Expiry);

    #[test]
    fn expiry_table() {
        let created = Some(ts(CREATED));
        let cases: [Case; 9] = [
            (
                "young claim rechecks at its expiry",
                created,
                Some("2m"),
                false,
                "2026-01-01T00:01:00Z",
                Expiry::RecheckAt(ts("2026-01-01T00:02:00Z")),
            ),
            (
                "one second before the boundary",
                created,
                Some("2m"),
                false,
                "2026-01-01T00:01:59Z",
                Expiry::RecheckAt(ts("2026-01-01T00:02:00Z")),
            ),
            ("exactly at the boundary expires", created, Some("2m"), false, "2026-01-01T00:02:00Z", Expiry::Expire),
            ("past the boundary expires", created, Some("2m"), false, "2026-01-02T00:00:00Z", Expiry::Expire),
            (
                "compound durations",
                created,
                Some("1h30m"),
                false,
                "2026-01-01T01:29:59Z",
                Expiry::RecheckAt(ts("2026-01-01T01:30:00Z")),
            ),
            ("Never disables expiry", created, Some("Never"), false, "2099-01-01T00:00:00Z", Expiry::Never),
            ("no expireAfter never expires", created, None, false, "2099-01-01T00:00:00Z", Expiry::Never),
            (
                "a claim already being deleted is not expired again",
                created,
                Some("2m"),
                true,
                "2099-01-01T00:00:00Z",
                Expiry::Never,
            ),
            ("no creation time: nothing to count from", None, Some("2m"), false, "2099-01-01T00:00:00Z", Expiry::Never),
        ];
        for (case, created, expire_after, deleting, now, want) in cases {
            assert_eq!(decide(created, expire_after, deleting, ts(now)), Ok(want), "{case}");
        }
    }

    #[test]
    fn an_unreadable_expire_after_is_an_error_naming_it_not_an_expiry() {
        let e = decide(Some(ts(CREATED)), Some("3 days"), false, ts("2099-01-01T00:00:00Z")).unwrap_err();
        assert!(e.to_string().contains("3 days"), "{e}");
    }

    #[test]
    fn the_recheck_is_the_time_left() {
        let now = ts("2026-01-01T00:01:00Z");
        let d = decide(Some(ts(CREATED)), Some("2m"), false, now).unwrap();
        assert_eq!(d.recheck_in(now), Some(Duration::from_secs(60)));
        assert_eq!(Expiry::Expire.recheck_in(now), None);
        assert_eq!(Expiry::Never.recheck_in(now), None);
    }
}
