//! The counter-based random generator behind seeded stochastic rounding.
//!
//! Element `i` of an array rounded with seed `s` uses the 32-bit word `stochastic_word(s, i)`:
//! the upper half of SplitMix64's output for state `mix(s) + (i + 1) * GAMMA`. A word depends
//! only on `(seed, flat C-order index)`, never on how the array is cut into chunks or on the
//! number of threads, so results are reproducible everywhere. Trainium2's own SR bit source is
//! undocumented (trn2_facts.md section 18); the hardware `rng` instruction also yields 32 bits
//! per element ([S9]), which is why a seeded rounding uses 32 random bits unless told otherwise.

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Stafford's "Mix13").
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A generator keyed by a seed; cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StochasticBits {
    key: u64,
}

impl StochasticBits {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        StochasticBits {
            key: mix64(seed ^ 0x6A09_E667_F3BC_C909),
        }
    }

    /// The 32-bit word for flat index `index`.
    #[inline(always)]
    pub fn word(&self, index: u64) -> u32 {
        let state = self
            .key
            .wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA));
        (mix64(state) >> 32) as u32
    }

    /// Fills `out` with the words for indices `start..start + out.len()` (inlined so callers
    /// compiled with AVX-512DQ get vectorised 64-bit multiplies).
    #[inline(always)]
    pub fn fill(&self, start: u64, out: &mut [u32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.word(start + i as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_depend_only_on_seed_and_index() {
        let g = StochasticBits::new(42);
        let mut a = vec![0u32; 1000];
        g.fill(0, &mut a);
        let mut b = vec![0u32; 10];
        g.fill(500, &mut b);
        assert_eq!(&a[500..510], &b[..]);
        assert_ne!(StochasticBits::new(43).word(0), g.word(0));
    }

    #[test]
    fn bits_are_balanced() {
        // Each of the 32 bit positions is set in about half of 2^16 words (5 sigma = 640).
        let g = StochasticBits::new(7);
        let mut counts = [0i64; 32];
        for i in 0..(1u64 << 16) {
            let w = g.word(i);
            for (b, c) in counts.iter_mut().enumerate() {
                *c += ((w >> b) & 1) as i64;
            }
        }
        for c in counts {
            assert!((c - (1 << 15)).abs() < 640, "bit count {c}");
        }
    }
}
