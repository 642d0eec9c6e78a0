//! The number formats of Trainium2 and their bit layouts.
//!
//! Every format is a sign bit, `E` exponent bits and `M` stored mantissa bits with subnormals.
//! "IEEE-style" formats reserve the all-ones exponent for Inf (mantissa 0) and NaN (otherwise);
//! `fp8_e4m3fn` (OCP E4M3) has no Inf and a single NaN per sign (all ones), so its largest finite
//! value is `S.1111.110` = 448. Neuron's `float8_e4m3` is the IEEE-style one with max 240
//! (\[S22\]\[S23\]\[S26\]; docs/sources.md).

use crate::{Error, Result};

named_enum! {
    /// A Trainium2 number format (contract section 1).
    pub enum Format("format", format) {
        /// IEEE binary32, 1-8-23.
        Fp32 = "fp32",
        /// TensorFloat-32, 1-8-10, held in a float32 container whose low 13 bits are zero.
        Tf32 = "tf32",
        /// bfloat16, 1-8-7.
        Bf16 = "bf16",
        /// IEEE binary16, 1-5-10.
        Fp16 = "fp16",
        /// Neuron `float8_e4m3`: 1-4-3, bias 7, IEEE-style Inf/NaN, max 240.
        Fp8E4m3 = "fp8_e4m3",
        /// `float8_e5m2`: 1-5-2, bias 15, IEEE-style, max 57344.
        Fp8E5m2 = "fp8_e5m2",
        /// Neuron `float8_e3` (`float8_e3m4`): 1-3-4, bias 3, IEEE-style, max 15.5.
        Fp8E3m4 = "fp8_e3m4",
        /// OCP E4M3 (`float8_e4m3fn`): no Inf, NaN = S.1111.111, max 448. Numerics only: the Trn2
        /// tensor engine rejects it (\[S21\]: NCC_EVRF051).
        Fp8E4m3fn = "fp8_e4m3fn",
    }
}

impl Format {
    /// Other names users write for a format: the numpy / ml_dtypes dtype names (which JAX and
    /// NKI also use) and PyTorch's `str(torch.<dtype>)`. Each maps by bit semantics, not by
    /// spelling: ml_dtypes' `float8_e4m3` (IEEE-style, max 240) is Neuron's `fp8_e4m3`, while
    /// `float8_e4m3fn` (OCP E4M3, max 448) is `fp8_e4m3fn`. The `fnuz` formats (bias 8/16, NaN
    /// at 0x80, no -0) are none of Trainium2's and have no alias.
    pub const ALIASES: &'static [(&'static str, Format)] = &[
        ("float32", Format::Fp32),
        ("torch.float32", Format::Fp32),
        ("torch.float", Format::Fp32),
        ("bfloat16", Format::Bf16),
        ("torch.bfloat16", Format::Bf16),
        ("float16", Format::Fp16),
        ("half", Format::Fp16),
        ("torch.float16", Format::Fp16),
        ("torch.half", Format::Fp16),
        ("float8_e4m3", Format::Fp8E4m3),
        ("float8_e5m2", Format::Fp8E5m2),
        ("torch.float8_e5m2", Format::Fp8E5m2),
        ("float8_e3m4", Format::Fp8E3m4),
        ("float8_e4m3fn", Format::Fp8E4m3fn),
        ("torch.float8_e4m3fn", Format::Fp8E4m3fn),
    ];

    /// The format named `name`: one of [`Self::NAMES`] or of [`Self::ALIASES`]; an error naming
    /// the argument `arg` and listing both otherwise.
    pub fn resolve(arg: &str, name: &str) -> Result<Format> {
        if let Some(&(_, f)) = Self::ALIASES.iter().find(|(a, _)| *a == name) {
            return Ok(f);
        }
        Self::parse(arg, name).map_err(|_| {
            Error::format(
                arg,
                format!(
                    "unknown format {name:?}; expected one of {:?} or one of the aliases {:?}",
                    Self::NAMES,
                    Self::ALIASES.iter().map(|(a, _)| *a).collect::<Vec<_>>()
                ),
            )
        })
    }

    /// Exponent field width in bits.
    pub const fn exponent_bits(self) -> u32 {
        match self {
            Format::Fp32 | Format::Tf32 | Format::Bf16 => 8,
            Format::Fp16 | Format::Fp8E5m2 => 5,
            Format::Fp8E4m3 | Format::Fp8E4m3fn => 4,
            Format::Fp8E3m4 => 3,
        }
    }

    /// Stored mantissa (fraction) width in bits.
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            Format::Fp32 => 23,
            Format::Tf32 | Format::Fp16 => 10,
            Format::Bf16 => 7,
            Format::Fp8E4m3 | Format::Fp8E4m3fn => 3,
            Format::Fp8E5m2 => 2,
            Format::Fp8E3m4 => 4,
        }
    }

    /// The standard exponent bias.
    pub const fn standard_bias(self) -> i32 {
        (1 << (self.exponent_bits() - 1)) - 1
    }

    /// Whether the format has infinities (IEEE-style); only `fp8_e4m3fn` does not.
    pub const fn has_inf(self) -> bool {
        !matches!(self, Format::Fp8E4m3fn)
    }

    /// Whether the format is one of the FP8 formats (the only ones whose bias is configurable).
    pub const fn is_fp8(self) -> bool {
        matches!(self, Format::Fp8E4m3 | Format::Fp8E5m2 | Format::Fp8E3m4 | Format::Fp8E4m3fn)
    }

    /// Width of a raw code in bits: 8 (fp8), 16 (bf16, fp16) or 32 (tf32 and fp32 use the
    /// float32 container).
    pub const fn code_bits(self) -> u32 {
        match self {
            Format::Fp32 | Format::Tf32 => 32,
            Format::Bf16 | Format::Fp16 => 16,
            _ => 8,
        }
    }

    /// The encoding with the standard bias.
    pub fn encoding(self) -> Encoding {
        Encoding::new(self, self.standard_bias())
    }

    /// The encoding with an explicit exponent bias (Trainium2's configurable FP8, "cFP8";
    /// \[S4\]). Only fp8 formats accept one, in `0..=127` so every code decodes to an exact
    /// float32.
    pub fn encoding_with_bias(self, exponent_bias: Option<i64>) -> Result<Encoding> {
        match exponent_bias {
            None => Ok(self.encoding()),
            Some(_) if !self.is_fp8() => Err(Error::format(
                "exponent_bias",
                format!(
                    "only the fp8 formats have a configurable exponent bias; {} does not",
                    self.name()
                ),
            )),
            Some(b) if !(0..=127).contains(&b) => Err(Error::value(
                "exponent_bias",
                format!("got {b}; it must be an integer in 0..=127"),
            )),
            Some(b) => Ok(Encoding::new(self, b as i32)),
        }
    }
}

/// The bit-level parameters of a format with a given bias: everything the encode and decode
/// kernels need, precomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// The format.
    pub format: Format,
    /// Exponent bias in use.
    pub bias: i32,
    /// Stored mantissa bits `M`.
    pub m: u32,
    /// Exponent bits `E`.
    pub e: u32,
    /// Unbiased exponent of the smallest normal value, `1 - bias`.
    pub emin: i32,
    /// Magnitude code (no sign) of the largest finite value.
    pub max_code: u32,
    /// Magnitude code of +Inf, or of the NaN for a format without Inf.
    pub overflow_code: u32,
    /// Magnitude code of the canonical quiet NaN (what ml_dtypes produces).
    pub nan_code: u32,
    /// The sign bit of a code.
    pub sign_bit: u32,
}

impl Encoding {
    fn new(format: Format, bias: i32) -> Encoding {
        let m = format.mantissa_bits();
        let e = format.exponent_bits();
        let exp_all_ones = ((1u32 << e) - 1) << m;
        let (max_code, overflow_code, nan_code) = if format.has_inf() {
            (exp_all_ones - 1, exp_all_ones, exp_all_ones | (1 << (m - 1)))
        } else {
            let all_ones = exp_all_ones | ((1 << m) - 1);
            (all_ones - 1, all_ones, all_ones)
        };
        // fp32/tf32 codes live in a float32 container: shift tf32's 19-bit code to the top.
        Encoding {
            format,
            bias,
            m,
            e,
            emin: 1 - bias,
            max_code,
            overflow_code,
            nan_code,
            sign_bit: 1 << (e + m),
        }
    }

    /// Exact value of a magnitude code (no sign) as f64; NaN and Inf for the special codes.
    pub fn magnitude_value(&self, mag: u32) -> f64 {
        if self.format.has_inf() {
            if mag == self.overflow_code {
                return f64::INFINITY;
            }
            if mag > self.overflow_code {
                return f64::NAN;
            }
        } else if mag == self.overflow_code {
            return f64::NAN;
        }
        let exp_field = (mag >> self.m) as i32;
        let frac = (mag & ((1 << self.m) - 1)) as f64;
        let scale = |e: i32| 2f64.powi(e);
        if exp_field == 0 {
            frac * scale(self.emin - self.m as i32)
        } else {
            (frac + (1u64 << self.m) as f64) * scale(exp_field - self.bias - self.m as i32)
        }
    }

    /// Largest finite value.
    pub fn max_value(&self) -> f64 {
        self.magnitude_value(self.max_code)
    }
    /// Smallest positive normal value.
    pub fn min_normal(&self) -> f64 {
        self.magnitude_value(1 << self.m)
    }
    /// Smallest positive subnormal value.
    pub fn min_subnormal(&self) -> f64 {
        self.magnitude_value(1)
    }
}

/// The facts `trn2core.format_info` reports about a format.
#[derive(Debug, Clone, PartialEq)]
pub struct FormatInfo {
    /// The format's name, e.g. `"fp8_e4m3"`.
    pub name: &'static str,
    /// Width of the exponent field.
    pub exponent_bits: u32,
    /// Width of the stored mantissa (fraction) field.
    pub mantissa_bits: u32,
    /// Exponent bias in effect (standard, or the configurable FP8 bias).
    pub bias: i32,
    /// Largest finite value (e.g. 240 for fp8_e4m3, 448 for fp8_e4m3fn).
    pub max: f64,
    /// Smallest positive normal value.
    pub min_normal: f64,
    /// Smallest positive subnormal value.
    pub min_subnormal: f64,
    /// Whether the format has infinities (all but fp8_e4m3fn).
    pub has_inf: bool,
}

impl FormatInfo {
    /// The facts of `format` under `exponent_bias` (standard bias if `None`).
    pub fn new(format: Format, exponent_bias: Option<i64>) -> Result<FormatInfo> {
        let enc = format.encoding_with_bias(exponent_bias)?;
        Ok(FormatInfo {
            name: format.name(),
            exponent_bits: enc.e,
            mantissa_bits: enc.m,
            bias: enc.bias,
            max: enc.max_value(),
            min_normal: enc.min_normal(),
            min_subnormal: enc.min_subnormal(),
            has_inf: format.has_inf(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxima_match_the_sources() {
        // [S22][S23][S26] (docs/sources.md) and the contract's table.
        assert_eq!(Format::Fp8E4m3.encoding().max_value(), 240.0);
        assert_eq!(Format::Fp8E5m2.encoding().max_value(), 57344.0);
        assert_eq!(Format::Fp8E3m4.encoding().max_value(), 15.5);
        assert_eq!(Format::Fp8E4m3fn.encoding().max_value(), 448.0);
        assert_eq!(Format::Bf16.encoding().max_value(), (2.0 - 2f64.powi(-7)) * 2f64.powi(127));
        assert_eq!(Format::Fp16.encoding().max_value(), 65504.0);
        assert_eq!(Format::Fp32.encoding().max_value(), f32::MAX as f64);
        assert_eq!(Format::Fp8E4m3.encoding().min_subnormal(), 2f64.powi(-9));
        assert_eq!(Format::Fp8E5m2.encoding().min_normal(), 2f64.powi(-14));
    }

    #[test]
    fn exponent_bias_scales_values() {
        let std = Format::Fp8E4m3.encoding();
        let b10 = Format::Fp8E4m3.encoding_with_bias(Some(10)).expect("valid bias");
        assert_eq!(b10.max_value(), std.max_value() * 2f64.powi(7 - 10));
        assert!(Format::Bf16.encoding_with_bias(Some(3)).is_err());
        assert!(Format::Fp8E5m2.encoding_with_bias(Some(128)).is_err());
    }

    #[test]
    fn aliases_resolve_by_bit_semantics() {
        for f in Format::ALL {
            assert_eq!(Format::resolve("dtype", f.name()).ok(), Some(f));
        }
        for (alias, f) in Format::ALIASES {
            assert_eq!(Format::resolve("dtype", alias).ok(), Some(*f));
            assert!(!Format::NAMES.contains(alias), "{alias} is a name, not an alias");
        }
        // ml_dtypes' float8_e4m3 is IEEE-style (max 240) = Neuron's; float8_e4m3fn is OCP (448).
        assert_eq!(Format::resolve("d", "float8_e4m3").ok(), Some(Format::Fp8E4m3));
        assert_eq!(Format::resolve("d", "float8_e4m3fn").ok(), Some(Format::Fp8E4m3fn));
        assert_eq!(Format::resolve("d", "torch.bfloat16").ok(), Some(Format::Bf16));
        let err = Format::resolve("dtype", "float8_e4m3fnuz").err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.starts_with("dtype: unknown format \"float8_e4m3fnuz\""), "{err}");
        assert!(err.contains("\"bfloat16\""), "{err}");
    }
}
