//! `sim::clock`: the time source and the randomness of the simulated world, so simulated delays
//! cost no wall time in tests and a seed reproduces a run.
//!
//! Owns: [`SeededRng`]; [`Clock`] is the `clock` crate's, re-exported (the hub reads the same type,
//! so a test can run the hub and the emulators on one manual clock).
//! Must not do: scheduling of work or anything else with side effects.

pub use ::clock::Clock;

/// A small deterministic pseudo-random generator (SplitMix64): the simulated world's only source of
/// randomness, so a seed reproduces a run.
#[derive(Clone, Debug)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> SeededRng {
        SeededRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An integer in `[0, n)` (`0` when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_rng_is_deterministic() {
        let mut a = SeededRng::new(7);
        let mut b = SeededRng::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert!((0..100).all(|_| a.next_f64() < 1.0));
        assert!((0..100).all(|_| a.below(3) < 3));
    }
}
