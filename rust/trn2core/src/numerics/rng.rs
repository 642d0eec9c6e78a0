//! The counter-based random generator behind seeded stochastic rounding.
//!
//! The words of seed `s` are SplitMix64's output stream, started from the state
//! `key = mix64(s ^ 0x6A09E667F3BCC909)`, read as little-endian 32-bit words: the `j`-th 64-bit
//! output `z_j = mix64(key + (j + 1) * GAMMA)` gives word `2j` (its low half) and word `2j + 1`
//! (its high half), and element `k` of an array rounded with seed `s` uses word `k`. A word
//! depends only on `(seed, flat C-order index)`, never on how the array is cut into chunks or on
//! the number of threads, so results are reproducible everywhere. One 64-bit mix feeds two
//! elements, which halves the multiplies of the generator (it is most of the cost of seeded
//! rounding). Trainium2's own SR bit source is undocumented (in every source read); the
//! hardware `rng` instruction also yields 32 bits per element (\[S9\]), which is why a seeded
//! rounding uses 32 random bits unless told otherwise.

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
pub(crate) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// SplitMix64's two output multipliers (Stafford's "Mix13").
pub(crate) const MIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
pub(crate) const MIX_M2: u64 = 0x94D0_49BB_1331_11EB;

/// SplitMix64's output function (Stafford's "Mix13").
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(MIX_M1);
    z = (z ^ (z >> 27)).wrapping_mul(MIX_M2);
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
        StochasticBits { key: mix64(seed ^ 0x6A09_E667_F3BC_C909) }
    }

    /// SplitMix64's state before its `j`-th output (`j` counted from 0).
    #[inline(always)]
    pub(crate) fn state(&self, j: u64) -> u64 {
        self.key.wrapping_add(j.wrapping_add(1).wrapping_mul(GAMMA))
    }

    /// The 64-bit output `j`, which holds the words `2j` (low half) and `2j + 1` (high half).
    #[inline(always)]
    pub fn pair(&self, j: u64) -> u64 {
        mix64(self.state(j))
    }

    /// The 32-bit word for flat index `index`.
    #[inline(always)]
    pub fn word(&self, index: u64) -> u32 {
        (self.pair(index >> 1) >> (32 * (index & 1))) as u32
    }

    /// The first word of a fill from an odd `start` (the high half of an output), written to
    /// `out[0]`: the even index and the part of `out` that remain (all of it for an even start).
    #[inline(always)]
    pub fn odd_head<'a>(&self, start: u64, out: &'a mut [u32], mask: u32) -> (u64, &'a mut [u32]) {
        if start & 1 == 1 && !out.is_empty() {
            out[0] = self.word(start) & mask;
            (start + 1, &mut out[1..])
        } else {
            (start, out)
        }
    }

    /// Fills `out` with the words for indices `start..start + out.len()`, each ANDed with
    /// `mask` (the portable definition; `encode.rs` has the SIMD versions, tested equal).
    #[inline(always)]
    pub fn fill(&self, start: u64, out: &mut [u32], mask: u32) {
        let (k, out) = self.odd_head(start, out, mask);
        let mut state = self.state(k >> 1);
        let mut pairs = out.chunks_exact_mut(2);
        for o in &mut pairs {
            let z = mix64(state);
            state = state.wrapping_add(GAMMA);
            o[0] = z as u32 & mask;
            o[1] = (z >> 32) as u32 & mask;
        }
        if let [last] = pairs.into_remainder() {
            *last = mix64(state) as u32 & mask;
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
        g.fill(0, &mut a, !0);
        for (start, len) in [(500, 10), (501, 10), (501, 9), (0, 1), (7, 1), (998, 2), (999, 1)] {
            let mut b = vec![0u32; len];
            g.fill(start as u64, &mut b, !0);
            assert_eq!(&a[start..start + len], &b[..], "start {start} len {len}");
        }
        for (k, &w) in a.iter().enumerate() {
            assert_eq!(g.word(k as u64), w, "index {k}");
        }
        let mut m = vec![0u32; 999];
        g.fill(1, &mut m, 0xFF00_0000);
        assert!(m.iter().zip(&a[1..]).all(|(&m, &w)| m == w & 0xFF00_0000));
        assert_ne!(StochasticBits::new(43).word(0), g.word(0));
    }

    #[test]
    fn words_are_splitmix64_outputs_in_little_endian_order() {
        // SplitMix64 as published (Steele, Lea and Flood 2014; Vigna's splitmix64.c): the state
        // advances by GAMMA before each output. Independent of `state`/`pair` above.
        let seed = 2024u64;
        // The starting state is mix64(seed ^ c): a keyed start, not an output of the stream.
        let mut z = seed ^ 0x6A09_E667_F3BC_C909;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let mut state = z ^ (z >> 31);
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let bytes: Vec<u8> = (0..64).flat_map(|_| next().to_le_bytes()).collect();
        // The published first output from state 0 (Vigna's splitmix64.c).
        assert_eq!(mix64(GAMMA), 0xE220_A839_7B1D_CDAF);
        let g = StochasticBits::new(seed);
        for (k, w) in bytes.chunks_exact(4).enumerate() {
            let want = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(g.word(k as u64), want, "word {k}");
        }
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
