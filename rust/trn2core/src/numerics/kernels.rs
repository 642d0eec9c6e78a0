//! Branch-light integer rounding kernels.
//!
//! One per-element function per input width (f32, f64) rounds the exact input value once into
//! any format of [`Encoding`] under any [`Rounding`] mode. The value is split into an integer
//! significand `s` and an exponent; the target quantum is `2^(te - M)` with `te = max(e, emin)`
//! (subnormals keep the quantum of the smallest normal binade); `sh` bits are dropped and the
//! kept part `q` plus the carry from rounding is added to the exponent field, so a carry out of
//! the mantissa moves to the next binade by itself. Everything is straight-line selects and
//! variable shifts, which LLVM vectorises (AVX2 `vpsrlvd`) in the dispatching loops of
//! `encode.rs`.
//!
//! Stochastic rounding with `n` random bits `r` rounds the magnitude up iff
//! `frac + r / 2^n >= 1` in exact arithmetic, `frac` being the dropped part as a fraction of the
//! quantum (gfloat's `RoundMode.StochasticFastest`). With `F = frac * 2^64` (exact when at most 64
//! bits are dropped, and a sticky 1 otherwise, which cannot change the outcome for `n <= 32`),
//! that is the carry out of `F + r * 2^(64-n)`.

use super::format::Encoding;
use super::Rounding;

/// Rounding mode as a const-generic parameter, so each kernel is specialised per mode.
pub const RNE: u8 = 0;
pub const AWAY: u8 = 1;
pub const TZ: u8 = 2;
pub const TP: u8 = 3;
pub const TN: u8 = 4;
pub const SR: u8 = 5;

/// The const-generic id of a rounding mode.
pub const fn mode_id(r: Rounding) -> u8 {
    match r {
        Rounding::NearestEven => RNE,
        Rounding::NearestAway => AWAY,
        Rounding::TowardZero => TZ,
        Rounding::TowardPositive => TP,
        Rounding::TowardNegative => TN,
        Rounding::Stochastic => SR,
    }
}

/// Everything a kernel needs, precomputed once per call.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub m: u32,
    /// `emin` in the biased exponent domain of the *input* format (f32: +127, f64: +1023).
    pub emin_b32: i32,
    pub emin_b64: i64,
    pub max_code: u32,
    /// Magnitude code for a finite overflow of a positive / negative value in this mode.
    pub ovf_pos: u32,
    pub ovf_neg: u32,
    /// Magnitude code for an infinite input.
    pub inf_code: u32,
    pub nan_code: u32,
    /// Position of the sign bit in the code.
    pub sign_shift: u32,
    /// Left shift applied to the finished code (13 for tf32's float32 container).
    pub out_shift: u32,
    /// `64 - n` for stochastic rounding with `n` random bits.
    pub sr_k: u32,
    /// Round-to-nearest-even float32 -> bf16 without saturation: the classic add-and-shift,
    /// equal to the general kernel and twice as fast.
    pub bf16_rne: bool,
}

impl Params {
    /// Parameters for rounding into `enc` with `mode`, `saturate` and `n` random bits.
    pub fn new(enc: &Encoding, mode: Rounding, saturate: bool, random_bit_count: u32) -> Params {
        let (ovf_pos, ovf_neg) = if saturate {
            (enc.max_code, enc.max_code)
        } else {
            // IEEE 754 overflow per mode (gfloat's rules): directed modes that round toward
            // zero for this sign stop at max, the others go to Inf (NaN without Inf).
            match mode {
                Rounding::TowardZero => (enc.max_code, enc.max_code),
                Rounding::TowardPositive => (enc.overflow_code, enc.max_code),
                Rounding::TowardNegative => (enc.max_code, enc.overflow_code),
                _ => (enc.overflow_code, enc.overflow_code),
            }
        };
        Params {
            m: enc.m,
            emin_b32: enc.emin + 127,
            emin_b64: enc.emin as i64 + 1023,
            max_code: enc.max_code,
            ovf_pos,
            ovf_neg,
            inf_code: if saturate { enc.max_code } else { enc.overflow_code },
            nan_code: enc.nan_code,
            sign_shift: enc.e + enc.m,
            out_shift: if enc.format == super::Format::Tf32 { 13 } else { 0 },
            sr_k: 64 - random_bit_count.clamp(1, 32),
            bf16_rne: enc.format == super::Format::Bf16
                && mode == Rounding::NearestEven
                && !saturate,
        }
    }
}

/// Whether to round the magnitude up, for modes other than stochastic, from the dropped bits
/// `rem` (below `half`, the weight of the first dropped bit) and the kept part's parity.
#[inline(always)]
fn round_up_det<const MODE: u8>(
    rem_gt_half: bool, rem_eq_half: bool, rem_nz: bool, q_odd: bool, neg: bool,
) -> bool {
    match MODE {
        RNE => rem_gt_half | (rem_eq_half & q_odd),
        AWAY => rem_gt_half | rem_eq_half,
        TZ => false,
        TP => rem_nz & !neg,
        TN => rem_nz & neg,
        _ => false,
    }
}

/// The stochastic decision from the dropped fraction `f = frac * 2^64` and random word `r`.
#[inline(always)]
fn round_up_sr(f: u64, r: u32, k: u32) -> bool {
    // frac + r / 2^n >= 1  <=>  F + r * 2^(64-n) >= 2^64  <=>  F > !(r << k).
    f > !((r as u64) << k)
}

/// Rounds one float32 (as bits) into the format; `r` is the random word (SR only).
/// The format must have `m < 23` (float32 into fp32 is the identity and handled by the caller).
#[inline(always)]
pub fn round_f32<const MODE: u8>(bits: u32, r: u32, p: &Params) -> u32 {
    let sign = bits >> 31;
    let abs = bits & 0x7FFF_FFFF;
    let e_raw = abs >> 23;
    let s = (abs & 0x007F_FFFF) | (((e_raw != 0) as u32) << 23);
    let e = e_raw.max(1) as i32;
    let te = e.max(p.emin_b32);
    let sh = (23 - p.m as i32 + te - e) as u32; // >= 1 because m < 23
    let up = if MODE == SR {
        // All in 32 bits: F = floor(frac * 2^32). Because the threshold (2^n - r) * 2^(32-n) is
        // an integer, floor(frac * 2^32) >= it exactly when frac * 2^32 >= it, so the bits
        // below 2^-32 never matter. `s < 2^24`, so a right shift of 24 or more gives 0.
        let rem = if sh >= 32 { s } else { s & ((1u32 << sh) - 1) };
        let f = if sh <= 32 {
            rem << (32 - sh) // sh >= 1 because m < 23
        } else if sh - 32 < 32 {
            rem >> (sh - 32)
        } else {
            0
        };
        let k = p.sr_k - 32; // 32 - n
        f > !(r << k)
    } else {
        let shc = sh.min(31);
        let rem = s & ((1u32 << shc) - 1);
        let half = 1u32 << (shc - 1);
        let q_odd = (s >> shc) & 1 != 0;
        round_up_det::<MODE>(rem > half, rem == half, rem != 0, q_odd, sign != 0)
    };
    let q = s >> sh.min(31);
    let mag = (((te - p.emin_b32) as u32) << p.m) + q + up as u32;
    let (inf, special) = (abs == 0x7F80_0000, abs >= 0x7F80_0000);
    finish(p, sign, mag, mag > p.max_code, special, inf)
}

/// float32 -> bf16, round to nearest even, no saturation. bf16 has float32's exponent range, so
/// adding `0x7FFF + lsb` and dropping 16 bits rounds normals and subnormals alike, and a carry
/// out of the largest finite value lands on Inf as IEEE 754 says. NaN becomes the canonical
/// quiet NaN of its sign.
#[inline(always)]
pub fn round_f32_bf16_rne(bits: u32) -> u32 {
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let nan = ((bits >> 16) & 0x8000) | 0x7FC0;
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// Rounds one float64 (as bits) into the format, once and directly (no pass through float32).
#[inline(always)]
pub fn round_f64<const MODE: u8>(bits: u64, r: u32, p: &Params) -> u32 {
    let sign = (bits >> 63) as u32;
    let abs = bits & 0x7FFF_FFFF_FFFF_FFFF;
    let e_raw = (abs >> 52) as i64;
    let s = (abs & 0x000F_FFFF_FFFF_FFFF) | (((e_raw != 0) as u64) << 52);
    let e = e_raw.max(1);
    let te = e.max(p.emin_b64);
    let sh = (52 - p.m as i64 + te - e) as u64; // >= 29 because m <= 23
    let up = if MODE == SR {
        // F = floor(frac * 2^64); as in `round_f32`, the bits below never matter.
        let f = if sh < 64 {
            (s & ((1u64 << sh) - 1)) << (64 - sh)
        } else if sh - 64 < 64 {
            s >> (sh - 64)
        } else {
            0
        };
        round_up_sr(f, r, p.sr_k)
    } else {
        let shc = sh.min(63);
        let rem = s & ((1u64 << shc) - 1);
        let half = 1u64 << (shc - 1);
        let q_odd = (s >> shc) & 1 != 0;
        round_up_det::<MODE>(rem > half, rem == half, rem != 0, q_odd, sign != 0)
    };
    let q = s >> sh.min(63);
    let mag = (((te - p.emin_b64) as u64) << p.m) + q + up as u64;
    let (inf, special) = (abs == 0x7FF0_0000_0000_0000, abs >= 0x7FF0_0000_0000_0000);
    finish(p, sign, mag as u32, mag > p.max_code as u64, special, inf)
}

/// The code of rounded magnitude `mag` with sign `sign`: the overflow code of the sign where
/// `overflow`, Inf's or NaN's code for a non-finite input (`special`; `inf` for an infinity),
/// shifted into place.
#[inline(always)]
fn finish(p: &Params, sign: u32, mag: u32, overflow: bool, special: bool, inf: bool) -> u32 {
    // Bitwise select: an `if` here makes LLVM select between two addresses and gather.
    let ovf = p.ovf_pos ^ ((p.ovf_pos ^ p.ovf_neg) & sign.wrapping_neg());
    let mag = if overflow { ovf } else { mag };
    let mag = if special {
        if inf {
            p.inf_code
        } else {
            p.nan_code
        }
    } else {
        mag
    };
    ((sign << p.sign_shift) | mag) << p.out_shift
}
