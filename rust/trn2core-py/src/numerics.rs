//! Bindings of `trn2core::numerics`: conversion and error mapping only.

use numpy::PyArray1;
use pyo3::prelude::*;
use trn2core::numerics::{self, CodesMut, CodesRef, Format, FormatInfo, Random, Rounding, Source};

use crate::arrays::{borrow, fill_new_array, slice};
use crate::errors::PyTrn2Result;

/// Rounds the flat array `x` into `format`; returns the flat codes. `source` says what `x`
/// holds: "f64", "f32", "bf16" or "f16" (the latter two as uint16 views) or an fp8 format name
/// (uint8 codes).
#[pyfunction]
#[pyo3(signature = (x, source, format, rounding, saturate, random_bits, random_bit_count, seed, exponent_bias))]
#[allow(clippy::too_many_arguments)]
pub fn encode<'py>(
    py: Python<'py>, x: &Bound<'py, PyAny>, source: &str, format: &str, rounding: &str,
    saturate: bool, random_bits: Option<&Bound<'py, PyAny>>, random_bit_count: u32,
    seed: Option<u64>, exponent_bias: Option<i64>,
) -> PyTrn2Result<Bound<'py, PyAny>> {
    let format = Format::parse("dtype", format)?;
    let mode = Rounding::parse("rounding", rounding)?;
    let enc = format.encoding_with_bias(exponent_bias)?;
    let bits_arr = random_bits.map(|b| borrow::<u32>(b, "random_bits", "uint32")).transpose()?;
    let bits = bits_arr.as_ref().map(|a| slice(a, "random_bits")).transpose()?;
    let random = Random::choose(mode, bits, seed, random_bit_count);
    macro_rules! run {
        ($t:ty, $what:expr, $mk:expr) => {{
            let a = borrow::<$t>(x, "x", $what)?;
            let src = $mk(slice(&a, "x")?);
            let n = src.len();
            let what = format!("the result of {n} codes");
            let arr = match format.code_bits() {
                8 => fill_new_array::<u8, _>(py, n, "x", &what, n as u64, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U8(o))
                })?
                .0
                .into_any(),
                16 => fill_new_array::<u16, _>(py, n, "x", &what, n as u64, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U16(o))
                })?
                .0
                .into_any(),
                _ => fill_new_array::<u32, _>(py, n, "x", &what, n as u64, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U32(o))
                })?
                .0
                .into_any(),
            };
            Ok(arr)
        }};
    }
    match source {
        "f64" => run!(f64, "float64", Source::F64),
        "f32" => run!(f32, "float32", Source::F32),
        "bf16" => run!(u16, "uint16", Source::Bf16),
        "f16" => run!(u16, "uint16", Source::F16),
        other => {
            let f = Format::parse("x", other)?;
            run!(u8, "uint8", |s| Source::Fp8(s, f))
        }
    }
}

/// Decodes flat codes of `format` (uint8 / uint16 / uint32 to match) to float32.
#[pyfunction]
#[pyo3(signature = (codes, format, exponent_bias))]
pub fn decode<'py>(
    py: Python<'py>, codes: &Bound<'py, PyAny>, format: &str, exponent_bias: Option<i64>,
) -> PyTrn2Result<Bound<'py, PyArray1<f32>>> {
    let format = Format::parse("dtype", format)?;
    let enc = format.encoding_with_bias(exponent_bias)?;
    macro_rules! run {
        ($t:ty, $what:expr, $codes:path) => {{
            let a = borrow::<$t>(codes, "codes", $what)?;
            let s = slice(&a, "codes")?;
            let n = s.len();
            let what = format!("the {n} float32 values");
            fill_new_array(py, n, "codes", &what, n as u64, |o| {
                numerics::decode_into($codes(s), &enc, o)
            })?
            .0
        }};
    }
    Ok(match format.code_bits() {
        8 => run!(u8, "uint8 (fp8 codes)", CodesRef::U8),
        16 => run!(u16, "uint16 (16-bit codes)", CodesRef::U16),
        _ => run!(u32, "uint32 (float32 containers)", CodesRef::U32),
    })
}

/// The words of the seeded generator for flat indices `0..n`.
#[pyfunction]
pub fn stochastic_bits(
    py: Python<'_>, n: u64, seed: u64,
) -> PyTrn2Result<Bound<'_, PyArray1<u32>>> {
    let n = numerics::random_words_len("shape", n)?;
    let what = format!("{n} random words");
    let (arr, ()) =
        fill_new_array(py, n, "shape", &what, n as u64, |o| numerics::random_words_into(seed, o))?;
    Ok(arr)
}

/// The facts of a number format (the facade adds its numpy dtype).
#[pyclass(name = "FormatInfo", module = "trn2core._core", frozen, get_all)]
pub struct PyFormatInfo {
    name: &'static str,
    exponent_bits: u32,
    mantissa_bits: u32,
    bias: i32,
    max: f64,
    min_normal: f64,
    min_subnormal: f64,
    has_inf: bool,
}

/// The facts of `format` under `exponent_bias`.
#[pyfunction]
#[pyo3(signature = (format, exponent_bias))]
pub fn format_info(format: &str, exponent_bias: Option<i64>) -> PyTrn2Result<PyFormatInfo> {
    let i = FormatInfo::new(Format::parse("dtype", format)?, exponent_bias)?;
    Ok(PyFormatInfo {
        name: i.name,
        exponent_bits: i.exponent_bits,
        mantissa_bits: i.mantissa_bits,
        bias: i.bias,
        max: i.max,
        min_normal: i.min_normal,
        min_subnormal: i.min_subnormal,
        has_inf: i.has_inf,
    })
}
