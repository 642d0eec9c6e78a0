//! Number formats and rounding (contract section 1).
//!
//! - [`Format`] and [`Encoding`]: the eight formats and their bit layouts, with the configurable
//!   FP8 exponent bias of Trainium2.
//! - [`Rounding`]: the six rounding modes.
//! - [`encode()`]: any float input (f64, f32, bf16, f16, fp8) rounded *once* to a format, as raw
//!   codes; [`decode()`]: codes back to exact float32.
//! - [`StochasticBits`]: the counter-based generator of seeded stochastic rounding.
//!
//! Every result equals the exact input value rounded once under the mode, with IEEE 754 overflow
//! rules (or saturation), subnormals kept, the sign of zero kept and NaN mapped to the format's
//! canonical quiet NaN of the same sign (the codes ml_dtypes produces).

#[cfg(target_arch = "x86_64")]
mod avx512;
mod decode;
mod encode;
mod format;
pub(crate) mod kernels;
mod rng;
#[cfg(test)]
mod simd_tests;

pub use decode::{decode, decode_into, f16_to_f32, fp8_lut, CodesRef};
#[cfg(target_arch = "x86_64")]
pub(crate) use encode::has_avx512_bw_vl_dq;
pub use encode::{
    encode, encode_into, random_words_into, random_words_len, stochastic_words, Code, Codes,
    CodesMut, EncodeScratch, Random, RunEncoder, Source, MAX_RANDOM_WORDS,
};
pub use format::{Encoding, Format, FormatInfo};
pub use rng::{mix64, StochasticBits};

use crate::Result;

named_enum! {
    /// A rounding mode (contract section 1; \[S7\]\[S8\]\[S20\]).
    pub enum Rounding("rounding mode", format) {
        /// Round to nearest, ties to even: Trainium2's default.
        NearestEven = "nearest_even",
        /// Round to nearest, ties away from zero.
        NearestAway = "nearest_away",
        /// Truncate toward zero.
        TowardZero = "toward_zero",
        /// Round toward +Inf.
        TowardPositive = "toward_positive",
        /// Round toward -Inf.
        TowardNegative = "toward_negative",
        /// Stochastic rounding: up (in magnitude) with probability equal to the distance from the
        /// lower neighbour, in units of the gap between neighbours.
        Stochastic = "stochastic",
    }
}

/// Rounds a single f64 into `enc` and returns its code: a convenience for tests and the cost
/// model's constants, using the same kernel as the array path.
pub fn encode_scalar(
    x: f64, enc: &Encoding, mode: Rounding, saturate: bool, random: Option<(u32, u32)>,
) -> Result<u32> {
    let word = random.map_or(0, |(r, _)| r);
    let rnd = match (mode, random) {
        (Rounding::Stochastic, Some((_, n))) => Random::Bits(std::slice::from_ref(&word), n),
        (Rounding::Stochastic, None) => Random::Seed(0, 32),
        _ => Random::None,
    };
    Ok(match encode(&Source::F64(&[x]), enc, mode, saturate, &rnd)? {
        Codes::U8(v) => v[0] as u32,
        Codes::U16(v) => v[0] as u32,
        Codes::U32(v) => v[0],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e4m3(x: f64, mode: Rounding) -> u32 {
        encode_scalar(x, &Format::Fp8E4m3.encoding(), mode, false, None).expect("valid")
    }

    #[test]
    fn known_fp8_codes() {
        assert_eq!(e4m3(1.0, Rounding::NearestEven), 0x38);
        assert_eq!(e4m3(240.0, Rounding::NearestEven), 0x77);
        assert_eq!(e4m3(248.0, Rounding::NearestEven), 0x78, "tie above max goes to Inf");
        assert_eq!(e4m3(247.9, Rounding::NearestEven), 0x77);
        assert_eq!(e4m3(1e9, Rounding::TowardZero), 0x77);
        assert_eq!(e4m3(-1e9, Rounding::TowardPositive), 0xF7);
        assert_eq!(e4m3(-1e9, Rounding::TowardNegative), 0xF8);
        assert_eq!(
            e4m3(2f64.powi(-10), Rounding::NearestEven),
            0x00,
            "half the min subnormal ties to 0"
        );
        assert_eq!(e4m3(2f64.powi(-10), Rounding::NearestAway), 0x01);
        assert_eq!(e4m3(-0.0, Rounding::NearestEven), 0x80);
        assert_eq!(e4m3(f64::NAN, Rounding::NearestEven), 0x7C);
        let fnz = Format::Fp8E4m3fn.encoding();
        assert_eq!(
            encode_scalar(464.0, &fnz, Rounding::NearestEven, false, None).expect("ok"),
            0x7E
        );
        assert_eq!(
            encode_scalar(465.0, &fnz, Rounding::NearestEven, false, None).expect("ok"),
            0x7F
        );
        assert_eq!(
            encode_scalar(f64::INFINITY, &fnz, Rounding::NearestEven, true, None).expect("ok"),
            0x7E
        );
    }

    #[test]
    fn a_run_encoder_gives_each_run_the_codes_of_the_whole_array() {
        // Runs at odd and even offsets (word pairs split), of every length up to a sub-block.
        let x: Vec<f32> =
            (0..3000u64).map(|i| f32::from_bits(mix64(i) as u32 & 0xBFFF_FFFF)).collect();
        for format in [Format::Bf16, Format::Fp8E4m3, Format::Fp16, Format::Tf32, Format::Fp32] {
            for mode in Rounding::ALL {
                let enc = format.encoding();
                let random = match mode {
                    Rounding::Stochastic => Random::Seed(42, 32),
                    _ => Random::None,
                };
                let whole = encode(&Source::F32(&x), &enc, mode, false, &random).expect("ok");
                let runs = RunEncoder::new(format, mode, 42);
                assert_eq!(runs.format(), format);
                let mut at = 0;
                let mut scratch = EncodeScratch::new();
                for len in [1, 2, 3, 127, 128, 300, 1024, 1025] {
                    let src = Source::F32(&x[at..at + len]);
                    let (mut c8, mut c16, mut c32) =
                        (vec![0u8; len], vec![0u16; len], vec![0u32; len]);
                    let got: Vec<u32> = match format.code_bits() {
                        8 => {
                            runs.encode(&src, at as u64, CodesMut::U8(&mut c8), &mut scratch);
                            c8.iter().map(|&c| c as u32).collect()
                        }
                        16 => {
                            runs.encode(&src, at as u64, CodesMut::U16(&mut c16), &mut scratch);
                            c16.iter().map(|&c| c as u32).collect()
                        }
                        _ => {
                            runs.encode(&src, at as u64, CodesMut::U32(&mut c32), &mut scratch);
                            c32
                        }
                    };
                    let want: Vec<u32> = match &whole {
                        Codes::U8(v) => v[at..at + len].iter().map(|&c| c as u32).collect(),
                        Codes::U16(v) => v[at..at + len].iter().map(|&c| c as u32).collect(),
                        Codes::U32(v) => v[at..at + len].to_vec(),
                    };
                    assert_eq!(got, want, "{format:?} {mode:?} run {at}..+{len}");
                    at += len;
                }
            }
        }
    }

    #[test]
    fn stochastic_with_explicit_bits() {
        let enc = Format::Fp8E4m3.encoding();
        // 1 + 1/32 lies a quarter of the way from 1 to 1.125: with 2 random bits, r = 3 rounds up.
        let x = 1.0 + 1.0 / 32.0;
        let down = encode_scalar(x, &enc, Rounding::Stochastic, false, Some((2, 2))).expect("ok");
        let up = encode_scalar(x, &enc, Rounding::Stochastic, false, Some((3, 2))).expect("ok");
        assert_eq!((down, up), (0x38, 0x39));
    }
}
