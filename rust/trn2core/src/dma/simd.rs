//! x86-64 fast paths of zvc, chosen at run time: AVX-512 `VPCOMPRESS` / `VPEXPAND`, whose bitmask-plus-packed-values layout is precisely what those instructions
//! produce and consume (bit `i` of the lane mask is element `i`, least significant first).
//!
//! Each kernel produces the same bytes as its portable twin in `zvc.rs` (unit
//! tests compare them). Pointer accesses cover only bytes of checked slices: full 64-byte
//! vectors come from `chunks` of length 64, partial ones use masked loads and stores whose
//! lane masks cover only the slice's bytes.

use std::arch::x86_64::*;

#[cfg(test)]
thread_local! {
    /// Set on a thread (in tests) to make it take the portable paths, so both can be compared.
    pub(super) static FORCE_PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the current thread must use the portable paths (only ever true in tests).
#[inline(always)]
pub(super) fn forced_portable() -> bool {
    #[cfg(test)]
    return FORCE_PORTABLE.with(|f| f.get());
    #[cfg(not(test))]
    false
}

/// Proof that this CPU has the AVX-512 subsets the zvc kernels use (F, BW, VBMI2).
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512(());

impl Avx512 {
    /// The token, if the CPU supports the kernels (feature detection is cached by std).
    #[inline]
    pub(super) fn detect() -> Option<Avx512> {
        (!forced_portable()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi2")
            && is_x86_feature_detected!("popcnt"))
        .then_some(Avx512(()))
    }
}

/// A mask of the low `n` bits (all 64 from `n = 64` on).
#[inline(always)]
fn low_bits(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

macro_rules! zvc_kernels {
    ($count:ident, $encode:ident, $decode:ident, $size:literal, $mask:ty, $test:ident, $compress:ident,
     $expand:ident, $load:ident, $store:ident) => {
        /// Non-zero elements of `block`, with AVX-512.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
        pub(super) fn $count(block: &[u8]) -> usize {
            let mut n = 0usize;
            for chunk in block.chunks(64) {
                let lanes = low_bits(chunk.len() / $size) as $mask;
                // SAFETY: the lane mask covers exactly the bytes of `chunk`.
                let v = unsafe { $load(lanes, chunk.as_ptr().cast()) };
                n += $test(v, v).count_ones() as usize;
            }
            n
        }

        /// zvc-codes `block` with AVX-512: writes the bitmask to `mask` (`ceil(n / 8)` bytes)
        /// and the packed non-zero elements to `vals`, writing no byte past them. Returns the
        /// bytes of `vals` used (all of them when `vals` was sized by the count).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
        pub(super) fn $encode(block: &[u8], mask: &mut [u8], vals: &mut [u8]) -> usize {
            const LANES: usize = 64 / $size;
            let mut j = 0usize;
            for (chunk, m_out) in block.chunks(64).zip(mask.chunks_mut(LANES / 8)) {
                let lanes = low_bits(chunk.len() / $size) as $mask;
                // SAFETY: the lane mask covers exactly the bytes of `chunk`.
                let v = unsafe { $load(lanes, chunk.as_ptr().cast()) };
                let k = $test(v, v);
                let packed = $compress(k, v);
                let count = k.count_ones() as usize;
                let Some(dst) = vals.get_mut(j..j + count * $size) else {
                    break;
                };
                // SAFETY: the lane mask covers exactly the `count` elements of `dst`.
                unsafe { $store(dst.as_mut_ptr().cast(), low_bits(count) as $mask, packed) };
                j += count * $size;
                match m_out.first_chunk_mut::<{ LANES / 8 }>() {
                    Some(m) => *m = k.to_le_bytes(),
                    None => {
                        let kb = (k as u64).to_le_bytes();
                        m_out.copy_from_slice(&kb[..m_out.len()]);
                    }
                }
            }
            j
        }

        /// Decodes a validated zvc block with AVX-512: `mask` has `ceil(n / 8)` bytes, `vals`
        /// exactly the population count of `mask` elements, `out` `n` elements. Returns false
        /// if `vals` runs short (impossible after validation).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,popcnt")]
        pub(super) fn $decode(mask: &[u8], vals: &[u8], out: &mut [u8]) -> bool {
            const LANES: usize = 64 / $size;
            let mut j = 0usize;
            for (og, m_in) in out.chunks_mut(64).zip(mask.chunks(LANES / 8)) {
                let k = match m_in.first_chunk::<{ LANES / 8 }>() {
                    Some(m) => <$mask>::from_le_bytes(*m),
                    None => {
                        let mut kb = [0u8; 8];
                        kb[..m_in.len()].copy_from_slice(m_in);
                        u64::from_le_bytes(kb) as $mask
                    }
                };
                let count = k.count_ones() as usize;
                let Some(src) = vals.get(j..j + count * $size) else {
                    return false;
                };
                // SAFETY: the lane mask covers exactly the `count` elements of `src`.
                let v = unsafe { $load(low_bits(count) as $mask, src.as_ptr().cast()) };
                let r = $expand(k, v);
                let lanes = low_bits(og.len() / $size) as $mask;
                // SAFETY: the lane mask covers exactly the bytes of `og`.
                unsafe { $store(og.as_mut_ptr().cast(), lanes, r) };
                j += count * $size;
            }
            true
        }
    };
}

zvc_kernels!(
    zvc_count_1,
    zvc_encode_1,
    zvc_decode_1,
    1,
    u64,
    _mm512_test_epi8_mask,
    _mm512_maskz_compress_epi8,
    _mm512_maskz_expand_epi8,
    _mm512_maskz_loadu_epi8,
    _mm512_mask_storeu_epi8
);
zvc_kernels!(
    zvc_count_2,
    zvc_encode_2,
    zvc_decode_2,
    2,
    u32,
    _mm512_test_epi16_mask,
    _mm512_maskz_compress_epi16,
    _mm512_maskz_expand_epi16,
    _mm512_maskz_loadu_epi16,
    _mm512_mask_storeu_epi16
);
zvc_kernels!(
    zvc_count_4,
    zvc_encode_4,
    zvc_decode_4,
    4,
    u16,
    _mm512_test_epi32_mask,
    _mm512_maskz_compress_epi32,
    _mm512_maskz_expand_epi32,
    _mm512_maskz_loadu_epi32,
    _mm512_mask_storeu_epi32
);
zvc_kernels!(
    zvc_count_8,
    zvc_encode_8,
    zvc_decode_8,
    8,
    u8,
    _mm512_test_epi64_mask,
    _mm512_maskz_compress_epi64,
    _mm512_maskz_expand_epi64,
    _mm512_maskz_loadu_epi64,
    _mm512_mask_storeu_epi64
);

impl Avx512 {
    /// [`zvc_count_1`] .. [`zvc_count_8`] for element size `size`.
    #[inline]
    pub(super) fn zvc_count(self, size: usize, block: &[u8]) -> usize {
        // SAFETY: holding `self` proves the target features.
        unsafe {
            match size {
                1 => zvc_count_1(block),
                2 => zvc_count_2(block),
                4 => zvc_count_4(block),
                _ => zvc_count_8(block),
            }
        }
    }

    /// [`zvc_encode_1`] .. [`zvc_encode_8`] for element size `size`.
    #[inline]
    pub(super) fn zvc_encode(
        self, size: usize, block: &[u8], mask: &mut [u8], vals: &mut [u8],
    ) -> usize {
        // SAFETY: holding `self` proves the target features.
        unsafe {
            match size {
                1 => zvc_encode_1(block, mask, vals),
                2 => zvc_encode_2(block, mask, vals),
                4 => zvc_encode_4(block, mask, vals),
                _ => zvc_encode_8(block, mask, vals),
            }
        }
    }

    /// [`zvc_decode_1`] .. [`zvc_decode_8`] for element size `size`.
    #[inline]
    pub(super) fn zvc_decode(self, size: usize, mask: &[u8], vals: &[u8], out: &mut [u8]) -> bool {
        // SAFETY: holding `self` proves the target features.
        unsafe {
            match size {
                1 => zvc_decode_1(mask, vals, out),
                2 => zvc_decode_2(mask, vals, out),
                4 => zvc_decode_4(mask, vals, out),
                _ => zvc_decode_8(mask, vals, out),
            }
        }
    }
}
