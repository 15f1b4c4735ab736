//! Which copy of a claim a lifecycle pass decides from ([`freshest`]): the one the controller's
//! watch cache holds, or the one its own last status write returned while the cache does not show
//! that write yet.
//!
//! Owns: that rule, over plain values (the write's age is passed in). Must not: keep the written
//! copies or read a clock (the controller remembers its writes and their age), or compare anything
//! but the claim's identity, status and deletion.

use std::time::Duration;

use crds::NodeClaim;

/// Which copy of a claim a pass decides from: the one read (the controller's cache), or `written`,
/// the claim as this controller's last status write returned it `age` ago, while the read copy
/// does not show that write yet (the watch lags behind it). Only this controller writes a claim's
/// status, so a read status other than the written one means the read copy is older, until `fresh`
/// has passed; a read copy being deleted while the written one is not is newer whatever its status.
/// Deciding from a lagging copy would write the same status again, and re-set conditions the
/// write had set (moving their `lastTransitionTime`).
pub fn freshest<'a>(read: &'a NodeClaim, written: Option<(&'a NodeClaim, Duration)>, fresh: Duration) -> &'a NodeClaim {
    match written {
        Some((w, age))
            if age < fresh
                && w.metadata.uid == read.metadata.uid
                && w.status != read.status
                && (read.metadata.deletion_timestamp.is_none() || w.metadata.deletion_timestamp.is_some()) =>
        {
            w
        }
        _ => read,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::{super::fixtures::*, *};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_pass_decides_from_its_own_last_write_while_the_cache_lags() {
        let fresh = Duration::from_secs(10);
        let read = claim();
        let written = launched_claim();
        let mut other = launched_claim();
        other.metadata.uid = Some("u2".into());
        let mut deleting = read.clone();
        deleting.metadata.deletion_timestamp = Some(Time(t(5)));
        type Case<'a> = (&'a str, &'a NodeClaim, Option<(&'a NodeClaim, Duration)>, bool);
        let cases: [Case<'_>; 6] = [
            ("nothing written", &read, None, false),
            ("the cache lags behind the write", &read, Some((&written, Duration::from_secs(1))), true),
            ("the cache shows the write", &written, Some((&written, Duration::from_secs(1))), false),
            ("the write is too old to trust", &read, Some((&written, fresh)), false),
            ("another claim of that name", &read, Some((&other, Duration::from_secs(1))), false),
            ("the read copy is being deleted", &deleting, Some((&written, Duration::from_secs(1))), false),
        ];
        for (what, read, written, want_written) in cases {
            let got = freshest(read, written, fresh);
            assert_eq!(std::ptr::eq(got, read), !want_written, "{what}");
        }
    }
}
