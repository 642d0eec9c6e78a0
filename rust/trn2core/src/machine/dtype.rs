//! The element types of the machine's memories, and the conversions every engine applies on the
//! way in and out: inputs widened exactly to float32 (integers rounded to nearest even when they
//! have more than 24 significant bits), outputs rounded from float32 to the destination
//! (floats through `numerics`' encode kernels: nearest-even, or seeded stochastic rounding;
//! integers to nearest even and saturated, NaN to 0).
//!
//! Sources: Vector/Scalar engines compute in FP32 with free casts in and out
//! (\[S1\]\[S2\]); fp32 -> integer casts round to nearest even and saturate (\[S30\]);
//! the NKI dtypes (14.1, \[S11\]). `fp8_e4m3fn` is not a Trainium2 type (NCC_EVRF051, 14.1) and is
//! refused, as the tensor engine refuses it.

use std::sync::OnceLock;

use super::simd::dispatch;
use crate::numerics::{encode_into, fp8_lut, CodesMut, Format, Random, Rounding, Source};
use crate::{Error, Result};

named_enum! {
    /// The element type of a tile: one of Trainium2's number formats or an integer type.
    pub enum Dtype("dtype", format) {
        /// IEEE binary32.
        Fp32 = "fp32",
        /// TensorFloat-32 in a float32 container (low 13 bits ignored on read, zero on write).
        Tf32 = "tf32",
        /// bfloat16.
        Bf16 = "bf16",
        /// IEEE binary16.
        Fp16 = "fp16",
        /// Neuron `float8_e4m3` (IEEE-style, max 240).
        Fp8E4m3 = "fp8_e4m3",
        /// `float8_e5m2`.
        Fp8E5m2 = "fp8_e5m2",
        /// Neuron `float8_e3m4` (max 15.5).
        Fp8E3m4 = "fp8_e3m4",
        /// Unsigned 8-bit integer (also NKI's `bool_`).
        Uint8 = "uint8",
        /// Signed 8-bit integer.
        Int8 = "int8",
        /// Unsigned 16-bit integer.
        Uint16 = "uint16",
        /// Signed 16-bit integer.
        Int16 = "int16",
        /// Unsigned 32-bit integer.
        Uint32 = "uint32",
        /// Signed 32-bit integer.
        Int32 = "int32",
    }
}

impl Dtype {
    /// Parses a name like [`Dtype::parse`], explaining why `fp8_e4m3fn` is refused.
    pub fn parse_name(arg: &str, name: &str) -> Result<Dtype> {
        if name == Format::Fp8E4m3fn.name() {
            return Err(Error::format(
                arg,
                "fp8_e4m3fn (OCP E4M3, max 448) is not a Trainium2 dtype (NeuronCore-v3; it \
                 arrives with v4); use fp8_e4m3, Neuron's IEEE-style float8_e4m3 (max 240)",
            ));
        }
        Dtype::parse(arg, name)
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::Fp32 | Dtype::Tf32 | Dtype::Uint32 | Dtype::Int32 => 4,
            Dtype::Bf16 | Dtype::Fp16 | Dtype::Uint16 | Dtype::Int16 => 2,
            _ => 1,
        }
    }

    /// The number format of a float dtype.
    pub const fn format(self) -> Option<Format> {
        Some(match self {
            Dtype::Fp32 => Format::Fp32,
            Dtype::Tf32 => Format::Tf32,
            Dtype::Bf16 => Format::Bf16,
            Dtype::Fp16 => Format::Fp16,
            Dtype::Fp8E4m3 => Format::Fp8E4m3,
            Dtype::Fp8E5m2 => Format::Fp8E5m2,
            Dtype::Fp8E3m4 => Format::Fp8E3m4,
            _ => return None,
        })
    }

    /// The dtype of a number format (`fp8_e4m3fn` has none on Trainium2).
    pub fn of_format(arg: &str, format: Format) -> Result<Dtype> {
        Dtype::parse_name(arg, format.name())
    }

    /// Whether this is an integer type.
    pub const fn is_int(self) -> bool {
        self.format().is_none()
    }

    /// Whether this is bf16 or fp16 (the types of the Vector engine's performance modes).
    pub const fn is_16bit_float(self) -> bool {
        matches!(self, Dtype::Bf16 | Dtype::Fp16)
    }

    /// `[min, max]` of an integer type, as f64 (exact).
    pub const fn int_range(self) -> (f64, f64) {
        match self {
            Dtype::Uint8 => (0.0, 255.0),
            Dtype::Int8 => (-128.0, 127.0),
            Dtype::Uint16 => (0.0, 65535.0),
            Dtype::Int16 => (-32768.0, 32767.0),
            Dtype::Uint32 => (0.0, 4294967295.0),
            Dtype::Int32 => (-2147483648.0, 2147483647.0),
            _ => (f64::NEG_INFINITY, f64::INFINITY),
        }
    }

    /// Sign-extends (signed types) or zero-extends the raw bits of one element to 64 bits.
    #[inline(always)]
    pub(crate) fn int_value(self, bits: u32) -> i64 {
        match self {
            Dtype::Int8 => bits as u8 as i8 as i64,
            Dtype::Int16 => bits as u16 as i16 as i64,
            Dtype::Int32 => bits as i32 as i64,
            _ => bits as i64,
        }
    }

    /// Raw bits of the integer `v` saturated to this integer type's range.
    #[inline(always)]
    pub(crate) fn saturate_int(self, v: i64) -> u32 {
        let (lo, hi) = self.int_range();
        v.clamp(lo as i64, hi as i64) as u32 & self.mask()
    }

    /// The mask of an element's bits.
    #[inline(always)]
    pub(crate) const fn mask(self) -> u32 {
        match self.size() {
            1 => 0xFF,
            2 => 0xFFFF,
            _ => 0xFFFF_FFFF,
        }
    }
}

/// Builds the fp8 tables of [`lut`] now ([`crate::pool::warm_up`]).
pub(crate) fn warm_up() {
    for dtype in [Dtype::Fp8E4m3, Dtype::Fp8E5m2, Dtype::Fp8E3m4] {
        let _ = lut(dtype);
    }
}

/// The float32 value of every code of an fp8 dtype (NaN codes give NaN).
fn lut(dtype: Dtype) -> &'static [f32; 256] {
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    static E3M4: OnceLock<[f32; 256]> = OnceLock::new();
    let (cell, format) = match dtype {
        Dtype::Fp8E5m2 => (&E5M2, Format::Fp8E5m2),
        Dtype::Fp8E3m4 => (&E3M4, Format::Fp8E3m4),
        _ => (&E4M3, Format::Fp8E4m3),
    };
    cell.get_or_init(|| fp8_lut(&format.encoding()))
}

/// The exact float32 value of one element's raw bits (the scalar definition of [`widen`]).
#[inline(always)]
pub(crate) fn widen_one(dtype: Dtype, bits: u32) -> f32 {
    match dtype {
        Dtype::Fp32 => f32::from_bits(bits),
        Dtype::Tf32 => f32::from_bits(bits & 0xFFFF_E000),
        Dtype::Bf16 => f32::from_bits(bits << 16),
        Dtype::Fp16 => crate::numerics::f16_to_f32(bits as u16),
        Dtype::Fp8E4m3 | Dtype::Fp8E5m2 | Dtype::Fp8E3m4 => lut(dtype)[(bits & 0xFF) as usize],
        Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 => bits as f32,
        Dtype::Int8 | Dtype::Int16 | Dtype::Int32 => dtype.int_value(bits) as f32,
    }
}

/// Raw bits of element `i` of a packed little-endian array of `size`-byte elements.
#[inline(always)]
fn raw(src: &[u8], i: usize, size: usize) -> u32 {
    match size {
        1 => src[i] as u32,
        2 => u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32,
        _ => u32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]]),
    }
}

dispatch! {
    /// Widens the packed elements `src` (`out.len()` of them) to exact float32 values.
    pub(crate) fn widen(dtype: Dtype, src: &[u8], out: &mut [f32]) {
        let n = out.len();
        match dtype {
            Dtype::Fp32 => {
                for (o, c) in out.iter_mut().zip(src[..4 * n].chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Dtype::Bf16 => {
                for (o, c) in out.iter_mut().zip(src[..2 * n].chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                }
            }
            Dtype::Fp8E4m3 | Dtype::Fp8E5m2 | Dtype::Fp8E3m4 => {
                let t = lut(dtype);
                for (o, &c) in out.iter_mut().zip(&src[..n]) {
                    *o = t[c as usize];
                }
            }
            _ => {
                let size = dtype.size();
                for (i, o) in out.iter_mut().enumerate() {
                    *o = widen_one(dtype, raw(src, i, size));
                }
            }
        }
    }
}

/// Reads the raw bits of `out.len()` packed elements, zero-extended.
pub(crate) fn raw_bits(dtype: Dtype, src: &[u8], out: &mut [u32]) {
    let size = dtype.size();
    for (i, o) in out.iter_mut().enumerate() {
        *o = raw(src, i, size);
    }
}

/// Writes `bits` (one per element, low bits used) as packed little-endian elements.
pub(crate) fn pack_bits(dtype: Dtype, bits: &[u32], dst: &mut [u8]) {
    match dtype.size() {
        1 => {
            for (d, &b) in dst.iter_mut().zip(bits) {
                *d = b as u8;
            }
        }
        2 => {
            for (d, &b) in dst.chunks_exact_mut(2).zip(bits) {
                d.copy_from_slice(&(b as u16).to_le_bytes());
            }
        }
        _ => {
            for (d, &b) in dst.chunks_exact_mut(4).zip(bits) {
                d.copy_from_slice(&b.to_le_bytes());
            }
        }
    }
}

/// How engine outputs are rounded from float32 to a narrower float destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputRounding {
    /// Round to nearest, ties to even (Trainium2's default).
    #[default]
    NearestEven,
    /// Stochastic rounding with the counter-based generator of `numerics`, keyed by this seed
    /// (the machine derives one per instruction from it and the instruction's index).
    Stochastic(u64),
}

named_enum! {
    /// How engine outputs round to narrower float dtypes, by name (`rounding=` of a core).
    pub enum OutputRoundingMode("rounding", value) {
        /// Round to nearest, ties to even.
        NearestEven = "nearest_even",
        /// Seeded stochastic rounding.
        Stochastic = "stochastic",
    }
}

impl OutputRounding {
    /// The rounding named `mode` (`"nearest_even"` or `"stochastic"`), stochastic with `seed`.
    pub fn new(mode: &str, seed: u64) -> Result<OutputRounding> {
        Ok(match OutputRoundingMode::parse("rounding", mode)? {
            OutputRoundingMode::NearestEven => OutputRounding::NearestEven,
            OutputRoundingMode::Stochastic => OutputRounding::Stochastic(seed),
        })
    }
}

/// fp32 -> integer: round to nearest even, saturate, NaN -> 0 (\[S30\]).
#[inline(always)]
pub(crate) fn f32_to_int_bits(dtype: Dtype, v: f32) -> u32 {
    if v.is_nan() {
        return 0;
    }
    let (lo, hi) = dtype.int_range();
    let r = (v as f64).round_ties_even().clamp(lo, hi);
    (r as i64) as u32 & dtype.mask()
}

dispatch! {
    /// fp32 results to raw 32-bit words (NaN results are already canonical).
    fn f32_words(vals: &[f32], out: &mut [u8]) {
        for (d, &v) in out.chunks_exact_mut(4).zip(vals) {
            d.copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
}

dispatch! {
    fn int_words(dtype: Dtype, vals: &[f32], out: &mut [u8]) {
        let size = dtype.size();
        for (d, &v) in out.chunks_exact_mut(size).zip(vals) {
            let b = f32_to_int_bits(dtype, v);
            d.copy_from_slice(&b.to_le_bytes()[..size]);
        }
    }
}

/// Rounds `vals` (engine results, float32) to `dtype` and packs them into `out`
/// (`vals.len() * dtype.size()` bytes). `words` is scratch space the caller keeps between calls.
pub(crate) fn narrow(
    dtype: Dtype, vals: &[f32], rounding: OutputRounding, out: &mut [u8], words: &mut Vec<u32>,
) -> Result<()> {
    let n = vals.len();
    let size = dtype.size();
    let out = &mut out[..n * size];
    let Some(format) = dtype.format() else {
        int_words(dtype, vals, out);
        return Ok(());
    };
    if format == Format::Fp32 {
        f32_words(vals, out);
        return Ok(());
    }
    let (mode, random) = match rounding {
        OutputRounding::NearestEven => (Rounding::NearestEven, Random::None),
        OutputRounding::Stochastic(seed) => (Rounding::Stochastic, Random::Seed(seed, 32)),
    };
    let enc = format.encoding();
    let src = Source::F32(vals);
    match size {
        1 => encode_into(&src, &enc, mode, false, &random, CodesMut::U8(out)),
        2 => {
            words.resize(n.div_ceil(2), 0);
            let codes = u16_view(words, n);
            encode_into(&src, &enc, mode, false, &random, CodesMut::U16(codes))?;
            for (d, c) in out.chunks_exact_mut(2).zip(codes.iter()) {
                d.copy_from_slice(&c.to_le_bytes());
            }
            Ok(())
        }
        _ => {
            words.resize(n, 0);
            encode_into(&src, &enc, mode, false, &random, CodesMut::U32(&mut words[..n]))?;
            for (d, c) in out.chunks_exact_mut(4).zip(words.iter()) {
                d.copy_from_slice(&c.to_le_bytes());
            }
            Ok(())
        }
    }
}

/// The first `n` 16-bit halves of `words`.
fn u16_view(words: &mut [u32], n: usize) -> &mut [u16] {
    assert!(n <= 2 * words.len(), "u16_view: {n} halves of {} words", words.len());
    // SAFETY: `u32` storage is aligned for `u16`, every bit pattern is a valid `u16`, and the
    // view covers at most the `2 * words.len()` halves the borrow owns.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u16>(), n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_is_refused() {
        let err = Dtype::parse_name("dtype", "fp8_e4m3fn").expect_err("not on trn2");
        assert!(err.to_string().contains("not a Trainium2 dtype"), "{err}");
    }

    #[test]
    fn integer_casts_round_to_even_and_saturate() {
        assert_eq!(f32_to_int_bits(Dtype::Int8, 2.5), 2);
        assert_eq!(f32_to_int_bits(Dtype::Int8, 3.5), 4);
        assert_eq!(f32_to_int_bits(Dtype::Int8, -3.5), (-4i8) as u8 as u32);
        assert_eq!(f32_to_int_bits(Dtype::Int8, 1e9), 127);
        assert_eq!(f32_to_int_bits(Dtype::Int8, -1e9), 0x80);
        assert_eq!(f32_to_int_bits(Dtype::Uint8, -1.0), 0);
        assert_eq!(f32_to_int_bits(Dtype::Uint32, f32::INFINITY), u32::MAX);
        assert_eq!(f32_to_int_bits(Dtype::Int32, f32::NAN), 0);
        assert_eq!(f32_to_int_bits(Dtype::Int32, -2147483648.0), 0x8000_0000);
        assert_eq!(f32_to_int_bits(Dtype::Int32, 2147483648.0), 0x7FFF_FFFF);
    }

    #[test]
    fn widening_is_exact() {
        assert_eq!(widen_one(Dtype::Bf16, 0x3F80), 1.0);
        assert_eq!(widen_one(Dtype::Tf32, 0x3F80_1FFF), 1.0);
        assert_eq!(widen_one(Dtype::Fp8E4m3, 0x38), 1.0);
        assert_eq!(widen_one(Dtype::Int16, 0xFFFF), -1.0);
        assert_eq!(widen_one(Dtype::Uint16, 0xFFFF), 65535.0);
        // 2^24 + 1 is not a float32: nearest even.
        assert_eq!(widen_one(Dtype::Int32, 16_777_217), 16_777_216.0);
        let src = [0x80u8, 0x3F, 0x00, 0xC0];
        let mut out = [0f32; 2];
        widen(Dtype::Bf16, &src, &mut out);
        assert_eq!(out, [1.0, -2.0]);
    }

    #[test]
    fn narrowing_uses_the_encode_kernels() {
        let vals = [1.0f32, 1.0 + 2f32.powi(-8), f32::from_bits(0x7FC0_0000), 3.4e38];
        let mut out = [0u8; 8];
        let mut words = Vec::new();
        narrow(Dtype::Bf16, &vals, OutputRounding::NearestEven, &mut out, &mut words)
            .expect("valid");
        let codes: Vec<u16> =
            out.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1. 3.4e38 rounds to Inf.
        assert_eq!(codes, vec![0x3F80, 0x3F80, 0x7FC0, 0x7F80]);
        let mut out = [0u8; 4];
        narrow(Dtype::Fp8E4m3, &vals, OutputRounding::NearestEven, &mut out, &mut words)
            .expect("valid");
        assert_eq!(out, [0x38, 0x38, 0x7C, 0x78]);
    }
}
