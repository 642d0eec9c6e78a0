//! Codes back to exact float32 values.

use rayon::prelude::*;

use super::format::{Encoding, Format};
use crate::{Error, Result};

/// The float32 value of every fp8 code under `enc` (NaN codes give a canonical NaN of that sign).
pub fn fp8_lut(enc: &Encoding) -> [f32; 256] {
    let mut lut = [0f32; 256];
    for (code, v) in lut.iter_mut().enumerate() {
        let code = code as u32;
        let mag = enc.magnitude_value(code & (enc.sign_bit - 1)) as f32;
        *v = if code & enc.sign_bit != 0 { -mag } else { mag };
    }
    lut
}

/// The exact float32 value of one IEEE binary16 code (every fp16 value is a float32 value).
/// Infinities keep their sign; a NaN keeps its sign and payload (shifted into float32's
/// mantissa) with the quiet bit set, as x86's `vcvtph2ps` converts it. Branch-free selects, so
/// the loops over codes vectorise.
#[inline(always)]
pub fn f16_to_f32(code: u16) -> f32 {
    let h = code as u32;
    let sign = (h & 0x8000) << 16;
    let e = (h >> 10) & 0x1F;
    let m = h & 0x3FF;
    // Exponent 1..=30: rebias by 127 - 15 = 112, widen the mantissa.
    let normal = ((e + 112) << 23) | (m << 13);
    // Exponent 0 (zero and subnormals): m * 2^-24, exact in float32.
    let subnormal = (m as f32 * (1.0 / 16_777_216.0)).to_bits();
    let quiet = if m != 0 { 0x0040_0000 } else { 0 };
    let special = 0x7F80_0000 | (m << 13) | quiet;
    let mag = if e == 0 {
        subnormal
    } else if e == 0x1F {
        special
    } else {
        normal
    };
    f32::from_bits(sign | mag)
}

/// Borrowed raw codes.
#[derive(Debug, Clone, Copy)]
pub enum CodesRef<'a> {
    /// fp8 codes.
    U8(&'a [u8]),
    /// bf16 or fp16 bit patterns.
    U16(&'a [u16]),
    /// tf32 or fp32 bit patterns (tf32 in a float32 container).
    U32(&'a [u32]),
}

const CHUNK: usize = 1 << 16;

fn map_par<T: Copy + Sync>(x: &[T], f: impl Fn(T) -> f32 + Sync) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    map_par_into(x, &mut out, f);
    out
}

fn map_par_into<T: Copy + Sync>(x: &[T], out: &mut [f32], f: impl Fn(T) -> f32 + Sync) {
    // Once cancelled the remaining chunks are skipped; the caller reports the interruption
    // (`crate::cancel::check`) instead of this partial result.
    let cancel = crate::cancel::current();
    out.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).filter(|_| !cancel.is_cancelled()).for_each(
        |(o, i)| {
            for (d, &s) in o.iter_mut().zip(i) {
                *d = f(s);
            }
        },
    );
}

/// Decodes `codes` of `enc`'s format into exact float32 values. The code width must match the
/// format (`Format::code_bits`); the caller checks that. Under a cancelled token
/// (`crate::cancel`) the result is incomplete: check the token afterwards.
///
/// tf32 codes are float32 containers; their low 13 bits are ignored as the hardware does.
pub fn decode(codes: CodesRef, enc: &Encoding) -> Vec<f32> {
    match (codes, enc.format) {
        (CodesRef::U8(c), _) => {
            let lut = fp8_lut(enc);
            map_par(c, |b| lut[b as usize])
        }
        (CodesRef::U16(c), Format::Bf16) => map_par(c, |b| f32::from_bits((b as u32) << 16)),
        (CodesRef::U16(c), _) => map_par(c, f16_to_f32),
        (CodesRef::U32(c), Format::Tf32) => map_par(c, |b| f32::from_bits(b & 0xFFFF_E000)),
        (CodesRef::U32(c), _) => map_par(c, f32::from_bits),
    }
}

/// [`decode`] into `out` (as many elements as `codes`), for the binding to fill a result in
/// numpy's memory: checks that the code width matches the format, and reports a cancelled call
/// as `Error::Interrupted` (the values are then incomplete).
pub fn decode_into(codes: CodesRef, enc: &Encoding, out: &mut [f32]) -> Result<()> {
    let (len, bits) = match codes {
        CodesRef::U8(c) => (c.len(), 8),
        CodesRef::U16(c) => (c.len(), 16),
        CodesRef::U32(c) => (c.len(), 32),
    };
    if bits != enc.format.code_bits() {
        return Err(Error::format(
            "codes",
            format!(
                "{} codes are {}-bit unsigned integers, got {bits}-bit ones",
                enc.format.name(),
                enc.format.code_bits()
            ),
        ));
    }
    if len != out.len() {
        return Err(Error::shape("out", format!("{} elements for {len} codes", out.len())));
    }
    match (codes, enc.format) {
        (CodesRef::U8(c), _) => {
            let lut = fp8_lut(enc);
            map_par_into(c, out, |b| lut[b as usize])
        }
        (CodesRef::U16(c), Format::Bf16) => {
            map_par_into(c, out, |b| f32::from_bits((b as u32) << 16))
        }
        (CodesRef::U16(c), _) => map_par_into(c, out, f16_to_f32),
        (CodesRef::U32(c), Format::Tf32) => {
            map_par_into(c, out, |b| f32::from_bits(b & 0xFFFF_E000))
        }
        (CodesRef::U32(c), _) => map_par_into(c, out, f32::from_bits),
    }
    crate::cancel::check()
}
