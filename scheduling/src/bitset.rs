//! A small dense bitset over instance-type indices (a pool's types sorted cheapest first), so the set
//! of options of a claim narrows with word operations and iterates in price order.
//!
//! Owns bit manipulation only.

/// Bits over `0..len`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Bits {
    words: Vec<u64>,
}

impl Bits {
    /// All `len` bits set.
    pub fn full(len: usize) -> Bits {
        let mut words = vec![u64::MAX; len.div_ceil(64)];
        if !len.is_multiple_of(64)
            && let Some(last) = words.last_mut()
        {
            *last = (1u64 << (len % 64)) - 1;
        }
        Bits { words }
    }

    /// No bit set, room for `len`.
    pub fn empty(len: usize) -> Bits {
        Bits { words: vec![0; len.div_ceil(64)] }
    }

    /// Sets a bit.
    pub fn set(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// Clears a bit.
    pub fn clear(&mut self, i: usize) {
        if let Some(w) = self.words.get_mut(i / 64) {
            *w &= !(1 << (i % 64));
        }
    }

    /// Tests a bit.
    pub fn get(&self, i: usize) -> bool {
        self.words.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// `self &= other`.
    pub fn and_with(&mut self, other: &Bits) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a &= b;
        }
    }

    /// `self |= other`.
    pub fn or_with(&mut self, other: &Bits) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    /// No bit set.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// Number of bits set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Lowest set bit.
    pub fn first(&self) -> Option<usize> {
        self.words.iter().enumerate().find(|(_, w)| **w != 0).map(|(i, w)| i * 64 + w.trailing_zeros() as usize)
    }

    /// Set bits in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + b)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basics() {
        let mut b = Bits::full(70);
        assert_eq!(b.count(), 70);
        b.clear(0);
        b.clear(69);
        assert_eq!(b.first(), Some(1));
        assert_eq!(b.iter().last(), Some(68));
        let mut e = Bits::empty(70);
        e.set(65);
        b.and_with(&e);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![65]);
        assert!(!b.is_empty());
        assert!(Bits::empty(3).is_empty());
    }
}
