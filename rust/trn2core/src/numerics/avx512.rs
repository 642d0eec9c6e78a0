//! Explicit AVX-512 versions of the two hot loops of seeded stochastic rounding: the
//! counter-based generator (`rng.rs`) and the float32 stochastic-rounding kernel
//! (`kernels::round_f32::<SR>`). Both give exactly the bits of the portable code; the unit tests
//! in `simd_tests.rs` check that on boundary-heavy inputs for every format and random-bit count.
//!
//! Why by hand: the generator needs 64-bit multiplies (`vpmullq`, AVX-512DQ) and the kernel is
//! a chain of variable shifts, unsigned compares and selects that maps one-to-one onto AVX-512
//! mask registers, where the auto-vectorised loop spends its time on mask/blend emulation and
//! on narrowing the 64-bit generator lanes to 32 bits. 16 lanes per step; the last partial step
//! uses masked loads and stores, so there is no scalar tail.
//!
//! Every function here is a safe `#[target_feature]` function: calling one is `unsafe` for a
//! caller without the features, so `encode.rs` calls them only after `is_x86_feature_detected!`.
//! Inside, `unsafe` is confined to the raw-pointer loads and stores (each in bounds by
//! construction, or masked) and the small traits and loop that wrap them.
//! AVX-512 intrinsics and target features are stable since Rust 1.89 (the crate's MSRV).

use std::arch::x86_64::*;

use super::kernels::Params;
use super::rng::{StochasticBits, GAMMA, MIX_M1, MIX_M2};

/// SplitMix64's output function on eight 64-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn mix64x8(z: __m512i) -> __m512i {
    let z = _mm512_xor_si512(z, _mm512_srli_epi64::<30>(z));
    let z = _mm512_mullo_epi64(z, _mm512_set1_epi64(MIX_M1 as i64));
    let z = _mm512_xor_si512(z, _mm512_srli_epi64::<27>(z));
    let z = _mm512_mullo_epi64(z, _mm512_set1_epi64(MIX_M2 as i64));
    _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z))
}

/// The mask of the first `len` (<= 16) lanes.
#[inline(always)]
fn tail_mask(len: usize) -> __mmask16 {
    ((1u32 << len) - 1) as __mmask16
}

/// The generator's words for indices `start..start + out.len()`, each ANDed with `mask`:
/// `StochasticBits::fill`, 16 words (eight SplitMix64 outputs) per step.
#[target_feature(enable = "avx512f,avx512dq")]
pub fn fill_words(g: &StochasticBits, start: u64, out: &mut [u32], mask: u32) {
    // An odd start begins with the high half of an output: done by the portable code.
    let (k, out) = g.odd_head(start, out, mask);
    let mut state = pair_states(g, k >> 1);
    let step = _mm512_set1_epi64(GAMMA.wrapping_mul(8) as i64);
    let maskv = _mm512_set1_epi32(mask as i32);
    let mut blocks = out.chunks_exact_mut(16);
    for o in &mut blocks {
        // Little-endian: 64-bit lane i holds word 2i in its low half and 2i + 1 in its high.
        let w = _mm512_and_si512(mix64x8(state), maskv);
        state = _mm512_add_epi64(state, step);
        // SAFETY: `o` has exactly 16 u32 elements; the store is unaligned.
        unsafe { _mm512_storeu_epi32(o.as_mut_ptr().cast(), w) };
    }
    let tail = blocks.into_remainder();
    if !tail.is_empty() {
        let w = _mm512_and_si512(mix64x8(state), maskv);
        // SAFETY: the mask enables only the first `tail.len()` lanes; masked-off lanes are not
        // written (nor can they fault).
        unsafe { _mm512_mask_storeu_epi32(tail.as_mut_ptr().cast(), tail_mask(tail.len()), w) };
    }
}

/// A code type the kernel can store: 8, 16 or 32 bits.
pub trait Store: Copy {
    /// Stores the low bits of the 64 lanes of `v` (lane order: `v[0]`'s 16, then `v[1]`'s, ...)
    /// to `dst[..64]`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of 64 elements; the CPU must support AVX-512F/BW.
    unsafe fn store64(dst: *mut Self, v: [__m512i; 4]);

    /// Stores the low bits of the lanes of `v` enabled in `k` to the same positions of `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of the enabled lanes; the CPU must support AVX-512F.
    unsafe fn store16(dst: *mut Self, v: __m512i, k: __mmask16);
}

// The narrowing stores use saturating packs (every code fits its width, so nothing
// saturates) and one lane permute, not `vpmovdb`/`vpmovdw` to memory, which are slow on AMD
// Zen 4. `packus` works within 128-bit lanes, so after the packs 128-bit lane i holds the i-th
// quarter of each input vector; the permute puts the quarters back in order.

impl Store for u8 {
    #[inline(always)]
    unsafe fn store64(dst: *mut u8, v: [__m512i; 4]) {
        // After the packs, dword 4i + j holds bytes 4i..4i+4 of v[j]; dword d must come from
        // dword 4 (d % 4) + d / 4.
        // SAFETY: the caller's contract (64 writable bytes, AVX-512F/BW).
        unsafe {
            let idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
            let lo = _mm512_packus_epi32(v[0], v[1]);
            let hi = _mm512_packus_epi32(v[2], v[3]);
            let b = _mm512_permutexvar_epi32(idx, _mm512_packus_epi16(lo, hi));
            _mm512_storeu_epi32(dst.cast(), b)
        }
    }
    #[inline(always)]
    unsafe fn store16(dst: *mut u8, v: __m512i, k: __mmask16) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_mask_cvtepi32_storeu_epi8(dst.cast(), k, v) }
    }
}

impl Store for u16 {
    #[inline(always)]
    unsafe fn store64(dst: *mut u16, v: [__m512i; 4]) {
        // After the pack, qword 2i + j holds elements 4i..4i+4 of v[j]; qword d must come from
        // qword 2 (d % 4) + d / 4.
        // SAFETY: the caller's contract (64 writable u16, AVX-512F/BW); h < 2.
        unsafe {
            let idx = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
            for (h, pair) in v.chunks_exact(2).enumerate() {
                let w = _mm512_permutexvar_epi64(idx, _mm512_packus_epi32(pair[0], pair[1]));
                _mm512_storeu_epi32(dst.add(32 * h).cast(), w)
            }
        }
    }
    #[inline(always)]
    unsafe fn store16(dst: *mut u16, v: __m512i, k: __mmask16) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_mask_cvtepi32_storeu_epi16(dst.cast(), k, v) }
    }
}

impl Store for u32 {
    #[inline(always)]
    unsafe fn store64(dst: *mut u32, v: [__m512i; 4]) {
        for (j, w) in v.into_iter().enumerate() {
            // SAFETY: the caller's contract (64 writable u32); j < 4.
            unsafe { _mm512_storeu_epi32(dst.add(16 * j).cast(), w) }
        }
    }
    #[inline(always)]
    unsafe fn store16(dst: *mut u32, v: __m512i, k: __mmask16) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_mask_storeu_epi32(dst.cast(), k, v) }
    }
}

/// Where the kernel's random words come from. A source gives each element's `n`-bit word
/// `r` already placed at the top of 32 bits, `r << (32 - n)`.
trait Words {
    /// The placed words of elements `i..i + 16` (only the lanes of `k`, if given, are read).
    ///
    /// # Safety
    /// For a slice source, those elements must be in bounds; the CPU must support AVX-512F/DQ.
    unsafe fn next16(&mut self, i: usize, k: Option<__mmask16>) -> __m512i;
}

/// Words from a caller's array, each `< 2^n`, shifted left by `32 - n`.
struct FromSlice {
    ptr: *const u32,
    shift: __m128i,
}

impl Words for FromSlice {
    #[inline(always)]
    unsafe fn next16(&mut self, i: usize, k: Option<__mmask16>) -> __m512i {
        // SAFETY: the caller's contract (elements in bounds, or masked off; AVX-512F).
        unsafe {
            let w = match k {
                None => _mm512_loadu_epi32(self.ptr.add(i).cast()),
                Some(k) => _mm512_maskz_loadu_epi32(k, self.ptr.add(i).cast()),
            };
            _mm512_sll_epi32(w, self.shift)
        }
    }
}

/// Words straight from the generator, 16 per call in index order, ANDed with a mask that
/// keeps their top `n` bits in place (`fill_words` without the round trip through memory).
struct FromGenerator {
    state: __m512i,
    step: __m512i,
    mask: __m512i,
}

impl Words for FromGenerator {
    #[inline(always)]
    unsafe fn next16(&mut self, _i: usize, _k: Option<__mmask16>) -> __m512i {
        // SAFETY: the caller's contract (AVX-512F/DQ); no memory is touched.
        unsafe {
            let w = _mm512_and_si512(mix64x8(self.state), self.mask);
            self.state = _mm512_add_epi64(self.state, self.step);
            w
        }
    }
}

/// Stochastic rounding of float32 values into the format of `p` (`m < 23`) with `n`-bit random
/// words `r` (`p.sr_k = 64 - n`): `kernels::round_f32::<SR>` on 16 lanes. Processes
/// `min(x.len(), r.len(), out.len())` elements.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
pub fn sr_f32<O: Store>(x: &[f32], r: &[u32], out: &mut [O], p: &Params) {
    let n = x.len().min(r.len()).min(out.len());
    let words = FromSlice { ptr: r.as_ptr(), shift: _mm_cvtsi32_si128(p.sr_k as i32 - 32) };
    // SAFETY: `r` has at least `n` elements.
    unsafe { sr_f32_with(&x[..n], words, &mut out[..n], p) }
}

/// Seeded stochastic rounding of float32 values: [`sr_f32`] with the words of `g` for indices
/// `start..`, ANDed with `mask` (which keeps their top `n` bits; `p.sr_k` is ignored),
/// generated in registers. `start` must be even (a word-pair boundary); the caller falls back to
/// `fill_words` + [`sr_f32`] otherwise.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
pub fn sr_f32_seeded<O: Store>(
    x: &[f32], g: &StochasticBits, start: u64, mask: u32, out: &mut [O], p: &Params,
) {
    debug_assert!(start.is_multiple_of(2), "odd start {start}");
    let n = x.len().min(out.len());
    let words = FromGenerator {
        state: pair_states(g, start >> 1),
        step: _mm512_set1_epi64(GAMMA.wrapping_mul(8) as i64),
        mask: _mm512_set1_epi32(mask as i32),
    };
    // SAFETY: the generator reads no memory.
    unsafe { sr_f32_with(&x[..n], words, &mut out[..n], p) }
}

/// The generator states of outputs `j0..j0 + 8`, lane `i` holding output `j0 + i`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_states(g: &StochasticBits, j0: u64) -> __m512i {
    let lane = |i: u64| g.state(j0 + i) as i64;
    // `_mm512_set_epi64` takes the highest lane first.
    _mm512_set_epi64(lane(7), lane(6), lane(5), lane(4), lane(3), lane(2), lane(1), lane(0))
}

/// The loop of [`sr_f32`]: 64 elements per step, the rest 16 at a time with masks, so there is
/// no scalar tail. `x` and `out` have the same length.
///
/// # Safety
/// `words` must be able to give the words of elements `0..x.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
unsafe fn sr_f32_with<O: Store, W: Words>(x: &[f32], mut words: W, out: &mut [O], p: &Params) {
    let n = x.len().min(out.len());
    let c = Consts::new(p);
    // Only tf32 (a u32 code) is shifted into its float32 container.
    let shift_out = std::mem::size_of::<O>() == 4;
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: elements i..i + 64 of `x` and `out` are in bounds (i + 64 <= n), and of the
        // words by the caller's contract.
        unsafe {
            let mut lanes = |j: usize| {
                let b = _mm512_loadu_epi32(xp.add(i + 16 * j).cast());
                sr16(b, words.next16(i + 16 * j, None), &c, shift_out)
            };
            let v = [lanes(0), lanes(1), lanes(2), lanes(3)];
            O::store64(op.add(i), v);
        }
        i += 64;
    }
    while i < n {
        let k = tail_mask((n - i).min(16));
        // SAFETY: the mask enables only lanes i..min(i + 16, n), which are in bounds;
        // masked-off lanes are neither read nor written (nor can they fault).
        unsafe {
            let b = _mm512_maskz_loadu_epi32(k, xp.add(i).cast());
            let v = sr16(b, words.next16(i, Some(k)), &c, shift_out);
            O::store16(op.add(i), v, k);
        }
        i += 16;
    }
}

/// The kernel's broadcast constants.
struct Consts {
    /// Fast path: `u = abs - ((emin_b - 1) << 23)` is in `2^23..=fast_hi` exactly when the
    /// value is in the format's normal range and at most its maximum.
    adj: __m512i,
    fast_lo: __m512i,
    fast_hi: __m512i,
    /// Shift counts `23 - m` and `32 - (23 - m)`.
    c0_count: __m128i,
    r_count: __m128i,
    emin_b: __m512i,
    c0: __m512i,
    m: __m128i,
    max_code: __m512i,
    ovf_pos: __m512i,
    ovf_neg: __m512i,
    inf_code: __m512i,
    nan_code: __m512i,
    sign_bit: __m512i,
    out_shift: __m128i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new(p: &Params) -> Consts {
        let b = |v: u32| _mm512_set1_epi32(v as i32);
        let c0 = 23 - p.m;
        Consts {
            adj: b(((p.emin_b32 - 1) as u32) << 23),
            fast_lo: b(1 << 23),
            fast_hi: b(p.max_code << c0),
            c0_count: _mm_cvtsi32_si128(c0 as i32),
            r_count: _mm_cvtsi32_si128(32 - c0 as i32),
            emin_b: b(p.emin_b32 as u32),
            c0: b(c0),
            m: _mm_cvtsi32_si128(p.m as i32),
            max_code: b(p.max_code),
            ovf_pos: b(p.ovf_pos),
            ovf_neg: b(p.ovf_neg),
            inf_code: b(p.inf_code),
            nan_code: b(p.nan_code),
            sign_bit: b(1 << p.sign_shift),
            out_shift: _mm_cvtsi32_si128(p.out_shift as i32),
        }
    }
}

/// `round_f32::<SR>` on 16 lanes: float32 bits `b`, placed random words `rs = r << (32 - n)`.
///
/// Fast path, when every lane is in the format's normal range and at most its maximum (finite,
/// cannot overflow): the dropped bits are the low `c0 = 23 - m` bits of the float32 pattern in
/// every lane, and rounding up iff `F + rs >= 2^32` (F = the dropped bits as a 32-bit fraction)
/// is the same as adding `rs >> (32 - c0)` (the random word aligned under the dropped bits) to
/// the pattern and truncating, because `F + rs >= 2^32` iff `(F >> (32 - c0)) + (rs >> (32 -
/// c0)) >= 2^c0` when `F`'s low `32 - c0` bits are 0. The carry runs into the kept mantissa and
/// on into the exponent by itself; subtracting `(emin_b - 1) << 23` first turns the float32
/// exponent into the format's. Otherwise the vector takes the general path.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn sr16(b: __m512i, rs: __m512i, c: &Consts, shift_out: bool) -> __m512i {
    let abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFF_FFFF));
    let u = _mm512_sub_epi32(abs, c.adj);
    let fast = _mm512_mask_cmple_epu32_mask(_mm512_cmpge_epu32_mask(u, c.fast_lo), u, c.fast_hi);
    let neg = _mm512_movepi32_mask(b);
    let mag = if fast == 0xFFFF {
        let r = _mm512_srl_epi32(rs, c.r_count);
        _mm512_srl_epi32(_mm512_add_epi32(u, r), c.c0_count)
    } else {
        sr16_general(abs, rs, neg, c)
    };
    let code = _mm512_mask_or_epi32(mag, neg, mag, c.sign_bit);
    if shift_out {
        _mm512_sll_epi32(code, c.out_shift)
    } else {
        code
    }
}

/// The magnitude code of `round_f32::<SR>` for any lanes: `abs` = the float32 bits without the
/// sign, `rs` = the placed random words, `neg` = the lanes with the sign bit set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn sr16_general(abs: __m512i, rs: __m512i, neg: __mmask16, c: &Consts) -> __m512i {
    let one = _mm512_set1_epi32(1);
    let e_raw = _mm512_srli_epi32::<23>(abs);
    // Significand with the implicit bit of normal inputs.
    let mant = _mm512_and_si512(abs, _mm512_set1_epi32(0x007F_FFFF));
    let normal = _mm512_cmpge_epu32_mask(abs, _mm512_set1_epi32(0x0080_0000));
    let s = _mm512_mask_or_epi32(mant, normal, mant, _mm512_set1_epi32(0x0080_0000));
    // e = max(e_raw, 1), te = max(e, emin), sh = 23 - m + te - e.
    let e = _mm512_max_epu32(e_raw, one);
    let te = _mm512_max_epi32(e, c.emin_b);
    let sh = _mm512_add_epi32(c.c0, _mm512_sub_epi32(te, e));
    // The dropped bits as a 32-bit fraction F = floor(frac * 2^32): `s << (32 - sh)` if
    // sh <= 32 (the kept bits leave the 32-bit lane), `s >> (sh - 32)` otherwise. A "negative"
    // count wraps to a huge one, and variable shifts by 32 or more give 0, so one of the two
    // terms is always 0 (both are `s` when sh = 32).
    let c32 = _mm512_set1_epi32(32);
    let f = _mm512_or_si512(
        _mm512_sllv_epi32(s, _mm512_sub_epi32(c32, sh)),
        _mm512_srlv_epi32(s, _mm512_sub_epi32(sh, c32)),
    );
    // Up iff F > !rs, i.e. F + rs carries out of 32 bits.
    let up = _mm512_cmpgt_epu32_mask(f, _mm512_xor_si512(rs, _mm512_set1_epi32(-1)));
    let q = _mm512_srlv_epi32(s, sh);
    let mag = _mm512_add_epi32(_mm512_sll_epi32(_mm512_sub_epi32(te, c.emin_b), c.m), q);
    let mag = _mm512_mask_add_epi32(mag, up, mag, one);
    // Overflow per sign, then Inf and NaN inputs.
    let ovf = _mm512_mask_mov_epi32(c.ovf_pos, neg, c.ovf_neg);
    let mag = _mm512_mask_mov_epi32(mag, _mm512_cmpgt_epu32_mask(mag, c.max_code), ovf);
    let inf = _mm512_set1_epi32(0x7F80_0000);
    let mag = _mm512_mask_mov_epi32(mag, _mm512_cmpge_epu32_mask(abs, inf), c.nan_code);
    _mm512_mask_mov_epi32(mag, _mm512_cmpeq_epi32_mask(abs, inf), c.inf_code)
}
