//! Bounds on what the admission routes hold at once, across requests: how many reviews are in
//! flight, and how many body bytes they may buffer in total. A request over a bound is refused at
//! once (503 with `Retry-After`), its body unread: whatever clients send, the bodies buffered never
//! add up to more than the budget (`max_body_bytes` bounds one body; this bounds their sum).
//!
//! A body is charged its declared length (`Content-Length`) before a byte of it is read, or
//! `max_body_bytes` when the length is not declared (HTTP/1.1 chunked, HTTP/2 without the header),
//! since that is as far as it may grow. Bodies over [`SMALL_BODY_BYTES`] share at most three
//! quarters of the budget: the last quarter is kept for small bodies — a review of the hub's kinds
//! is a few KiB — so a flood of large bodies cannot take the whole budget and leave the API
//! server's ordinary reviews refused.
//!
//! Must not: wait for room (a refusal is the answer: a queue would hold bodies or connections
//! longer), or read the body.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bodies up to this size may use the whole byte budget; larger ones three quarters of it.
pub const SMALL_BODY_BYTES: u64 = 64 * 1024;
/// The budget is counted in units of this many bytes (the semaphores count `u32` permits).
const UNIT: u64 = 1024;

/// Limits that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// A bound of zero would refuse everything.
    #[error("{flag} must be more than 0")]
    Zero {
        /// The flag.
        flag: &'static str,
    },
    /// The largest body accepted could never be admitted.
    #[error(
        "--max-buffered-bytes ({buffered}) leaves large bodies {large} bytes (three quarters), less than \
         --max-body-bytes ({body}): set --max-buffered-bytes to at least {needed} or lower --max-body-bytes"
    )]
    BodyLargerThanBudget {
        /// `--max-buffered-bytes`.
        buffered: u64,
        /// What large bodies may use.
        large: u64,
        /// `--max-body-bytes`.
        body: u64,
        /// The smallest budget that fits one largest body.
        needed: u64,
    },
    /// The budget does not fit the semaphores' counters.
    #[error("--max-buffered-bytes ({0}) is more than 4 TiB")]
    TooLarge(u64),
}

/// Why a review was refused without being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Too many reviews in flight.
    #[error("{limit} reviews are already in flight (--max-concurrent-reviews)")]
    Reviews {
        /// `--max-concurrent-reviews`.
        limit: usize,
    },
    /// The body would take the bytes buffered past the budget.
    #[error(
        "a body of {charged} bytes does not fit: the reviews in flight hold the budget of {limit} bytes (--max-buffered-bytes)"
    )]
    Bytes {
        /// What the body was charged.
        charged: u64,
        /// `--max-buffered-bytes`.
        limit: u64,
    },
}

/// The room a review holds until it is answered (dropping it gives the room back).
#[derive(Debug)]
pub struct Admitted {
    _review: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
    _large: Option<OwnedSemaphorePermit>,
}

/// The shared budget of the admission routes.
#[derive(Debug)]
pub struct Budget {
    reviews: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    large: Arc<Semaphore>,
    max_concurrent_reviews: usize,
    max_buffered_bytes: u64,
    max_body_bytes: u64,
}

fn units(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl Budget {
    /// A budget of `max_concurrent_reviews` reviews and `max_buffered_bytes` body bytes, for bodies
    /// of at most `max_body_bytes`.
    pub fn new(
        max_concurrent_reviews: usize,
        max_buffered_bytes: u64,
        max_body_bytes: u64,
    ) -> Result<Self, LimitsError> {
        if max_concurrent_reviews == 0 {
            return Err(LimitsError::Zero { flag: "--max-concurrent-reviews" });
        }
        if max_buffered_bytes == 0 {
            return Err(LimitsError::Zero { flag: "--max-buffered-bytes" });
        }
        if max_body_bytes == 0 {
            return Err(LimitsError::Zero { flag: "--max-body-bytes" });
        }
        let total = units(max_buffered_bytes);
        if total > u64::from(u32::MAX) {
            return Err(LimitsError::TooLarge(max_buffered_bytes));
        }
        let large = total - total / 4;
        if units(max_body_bytes) > large {
            return Err(LimitsError::BodyLargerThanBudget {
                buffered: max_buffered_bytes,
                large: large * UNIT,
                body: max_body_bytes,
                needed: (units(max_body_bytes) * 4).div_ceil(3) * UNIT,
            });
        }
        // Both fit u32 (checked above), so they fit usize.
        let permits = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(Budget {
            reviews: Arc::new(Semaphore::new(max_concurrent_reviews)),
            bytes: Arc::new(Semaphore::new(permits(total))),
            large: Arc::new(Semaphore::new(permits(large))),
            max_concurrent_reviews,
            max_buffered_bytes,
            max_body_bytes,
        })
    }

    /// What a body of this declared length is charged: its length (a body over `max_body_bytes`
    /// is refused by the body limit after at most that much), or `max_body_bytes` when unknown.
    pub fn charge(&self, declared_length: Option<u64>) -> u64 {
        declared_length.map_or(self.max_body_bytes, |length| length.min(self.max_body_bytes))
    }

    /// Room for one review whose body declares `declared_length` bytes, or why not; never waits.
    pub fn admit(&self, declared_length: Option<u64>) -> Result<Admitted, Refusal> {
        let review = self
            .reviews
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Reviews { limit: self.max_concurrent_reviews })?;
        let charged = self.charge(declared_length);
        let refused = Refusal::Bytes { charged, limit: self.max_buffered_bytes };
        // Checked in `new`: a charge (at most max_body_bytes) fits u32 units.
        let needed = u32::try_from(units(charged)).map_err(|_| refused)?;
        if needed == 0 {
            return Ok(Admitted { _review: review, _bytes: None, _large: None });
        }
        let large = if charged > SMALL_BODY_BYTES {
            Some(self.large.clone().try_acquire_many_owned(needed).map_err(|_| refused)?)
        } else {
            None
        };
        let bytes = self.bytes.clone().try_acquire_many_owned(needed).map_err(|_| refused)?;
        Ok(Admitted { _review: review, _bytes: Some(bytes), _large: large })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn reviews_over_the_bound_are_refused() {
        let budget = Budget::new(2, 16 * MIB, 4 * MIB).unwrap();
        let a = budget.admit(Some(100)).unwrap();
        let _b = budget.admit(Some(100)).unwrap();
        assert_eq!(budget.admit(Some(100)).unwrap_err(), Refusal::Reviews { limit: 2 });
        drop(a);
        assert!(budget.admit(Some(100)).is_ok());
    }

    #[test]
    fn large_bodies_leave_a_quarter_to_small_ones() {
        let budget = Budget::new(100, 16 * MIB, 4 * MIB).unwrap();
        let large: Vec<_> = (0..3).map(|_| budget.admit(Some(4 * MIB)).unwrap()).collect();
        assert_eq!(budget.admit(Some(4 * MIB)).unwrap_err(), Refusal::Bytes { charged: 4 * MIB, limit: 16 * MIB });
        // Not even a body just over the small size: that room is the small bodies'.
        assert!(budget.admit(Some(SMALL_BODY_BYTES + 1)).is_err());
        let small: Vec<_> = (0..64).map(|_| budget.admit(Some(SMALL_BODY_BYTES)).unwrap()).collect();
        assert!(budget.admit(Some(1)).is_err(), "the whole budget is held");
        drop(small);
        drop(large);
        assert!(budget.admit(Some(4 * MIB)).is_ok());
    }

    #[test]
    fn an_undeclared_length_is_charged_the_largest_body() {
        let budget = Budget::new(100, 16 * MIB, 4 * MIB).unwrap();
        assert_eq!(budget.charge(None), 4 * MIB);
        assert_eq!(budget.charge(Some(40 * MIB)), 4 * MIB);
        assert_eq!(budget.charge(Some(0)), 0);
        let _held: Vec<_> = (0..3).map(|_| budget.admit(None).unwrap()).collect();
        assert!(budget.admit(None).is_err());
        assert!(budget.admit(Some(0)).is_ok(), "an empty body holds no bytes");
    }

    #[test]
    fn limits_that_cannot_work_are_refused_with_the_fix() {
        assert_eq!(Budget::new(0, MIB, MIB).unwrap_err(), LimitsError::Zero { flag: "--max-concurrent-reviews" });
        assert_eq!(Budget::new(1, 0, MIB).unwrap_err(), LimitsError::Zero { flag: "--max-buffered-bytes" });
        let error = Budget::new(1, 4 * MIB, 4 * MIB).unwrap_err();
        assert!(error.to_string().contains("set --max-buffered-bytes to at least 5593088"), "{error}");
        assert!(Budget::new(1, 5_593_088, 4 * MIB).is_ok());
        assert!(matches!(Budget::new(1, 8 << 40, MIB), Err(LimitsError::TooLarge(_))));
    }
}
