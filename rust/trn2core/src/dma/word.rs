//! Fixed-size elements viewed as machine words, so the block codecs compile to one load, one
//! compare and one store per element for each element size (1, 2, 4 or 8 bytes).

/// An element of `SIZE` bytes handled as one native-endian word. Only equality with zero and the
/// byte image matter to the codecs, so the byte order of the word is irrelevant.
pub(super) trait Word: Copy {
    /// Element size in bytes.
    const SIZE: usize;
    /// The all-zero word.
    const ZERO: Self;
    /// The word whose bytes are the first `SIZE` bytes of `b`, or `None` if `b` is shorter.
    fn load(b: &[u8]) -> Option<Self>;
    /// Writes the word into the first `SIZE` bytes of `b` (no-op if `b` is shorter).
    fn store(self, b: &mut [u8]);
    /// True unless every byte is zero (so `-0.0`, `0x80..00`, counts as non-zero).
    fn is_nonzero(self) -> bool;
    /// `self` if `keep` is 1, zero if `keep` is 0 (branch-free select).
    fn keep(self, keep: usize) -> Self;
}

macro_rules! impl_word {
    ($t:ty, $n:literal) => {
        impl Word for $t {
            const SIZE: usize = $n;
            const ZERO: Self = 0;
            #[inline(always)]
            fn load(b: &[u8]) -> Option<Self> {
                b.first_chunk::<$n>().map(|a| <$t>::from_ne_bytes(*a))
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                if let Some(a) = b.first_chunk_mut::<$n>() {
                    *a = self.to_ne_bytes();
                }
            }
            #[inline(always)]
            fn is_nonzero(self) -> bool {
                self != 0
            }
            #[inline(always)]
            fn keep(self, keep: usize) -> Self {
                self & (0 as $t).wrapping_sub(keep as $t)
            }
        }
    };
}

impl_word!(u8, 1);
impl_word!(u16, 2);
impl_word!(u32, 4);
impl_word!(u64, 8);
