//! Bindings of `trn2core::numerics`: conversion and error mapping only.

use numpy::PyArrayMethods;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::numerics::{self, CodesMut, CodesRef, Format, FormatInfo, Random, Rounding, Source};
use trn2core::Error;

use crate::arrays::{borrow, new_uninit, slice, to_numpy};
use crate::errors::{guard, guard_work};

/// A fresh numpy array of `n` codes, allocated by numpy (huge pages for big arrays) and filled
/// by `fill` with the GIL released. Every element is written before Python can see it.
fn fill_codes<'py, T: numpy::Element + Send>(
    py: Python<'py>,
    n: usize,
    fill: impl FnOnce(&mut [T]) -> Result<(), Error> + Send,
) -> PyResult<Py<PyAny>> {
    let what = format!("the result of {n} codes");
    // SAFETY: `fill` writes every element (encode_into checks the length) and nothing reads
    // the array before.
    let arr = guard(py, || unsafe { new_uninit::<T>(py, n, "x", &what) })?;
    {
        let mut rw = arr.readwrite();
        let out = guard(py, || {
            rw.as_slice_mut()
                .map_err(|_| Error::shape("out", "expected a contiguous output"))
        })?;
        guard_work(py, n as u64, || fill(out))?;
    }
    Ok(arr.into_any().unbind())
}

/// Rounds the flat array `x` (kind: "f64", "f32", "bf16", "f16" or an fp8 format name, the
/// latter three as unsigned-integer views) into `fmt`; returns the flat codes.
#[pyfunction]
#[pyo3(signature = (x, kind, fmt, rounding, saturate, random_bits, random_bit_count, seed, exponent_bias))]
#[allow(clippy::too_many_arguments)]
pub fn encode(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    kind: &str,
    fmt: &str,
    rounding: &str,
    saturate: bool,
    random_bits: Option<&Bound<'_, PyAny>>,
    random_bit_count: u32,
    seed: Option<u64>,
    exponent_bias: Option<i64>,
) -> PyResult<Py<PyAny>> {
    let format = guard(py, || Format::parse("fmt", fmt))?;
    let mode = guard(py, || Rounding::parse("rounding", rounding))?;
    let enc = guard(py, || format.encoding_with_bias(exponent_bias))?;
    let bits_arr = match random_bits {
        Some(b) => Some(guard(py, || borrow::<u32>(b, "random_bits", "uint32"))?),
        None => None,
    };
    let bits = match &bits_arr {
        Some(a) => Some(guard(py, || slice(a, "random_bits"))?),
        None => None,
    };
    let random = match (bits, seed) {
        (Some(b), _) => Random::Bits(b, random_bit_count),
        (None, Some(s)) if mode == Rounding::Stochastic => Random::Seed(s, random_bit_count),
        _ => Random::None,
    };
    macro_rules! run {
        ($t:ty, $what:expr, $mk:expr) => {{
            let a = guard(py, || borrow::<$t>(x, "x", $what))?;
            let s = guard(py, || slice(&a, "x"))?;
            let src = $mk(s);
            let n = src.len();
            match format.code_bits() {
                8 => fill_codes::<u8>(py, n, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U8(o))
                }),
                16 => fill_codes::<u16>(py, n, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U16(o))
                }),
                _ => fill_codes::<u32>(py, n, |o| {
                    numerics::encode_into(&src, &enc, mode, saturate, &random, CodesMut::U32(o))
                }),
            }
        }};
    }
    match kind {
        "f64" => run!(f64, "float64", Source::F64),
        "f32" => run!(f32, "float32", Source::F32),
        "bf16" => run!(u16, "uint16", Source::Bf16),
        "f16" => run!(u16, "uint16", Source::F16),
        other => {
            let f = guard(py, || Format::parse("x", other))?;
            run!(u8, "uint8", |s| Source::Fp8(s, f))
        }
    }
}

/// Decodes flat codes of `fmt` (uint8 / uint16 / uint32 to match) to float32.
#[pyfunction]
#[pyo3(signature = (codes, fmt, exponent_bias))]
pub fn decode(
    py: Python<'_>,
    codes: &Bound<'_, PyAny>,
    fmt: &str,
    exponent_bias: Option<i64>,
) -> PyResult<Py<PyAny>> {
    let format = guard(py, || Format::parse("fmt", fmt))?;
    let enc = guard(py, || format.encoding_with_bias(exponent_bias))?;
    let n = codes.len().unwrap_or(0) as u64;
    guard(py, || {
        trn2core::host::check_alloc("codes", &format!("the {n} float32 values"), n as u128 * 4)
    })?;
    // decode skips its remaining chunks once cancelled; report that instead of a partial result.
    let decode = |c: CodesRef| {
        let v = numerics::decode(c, &enc);
        trn2core::cancel::check().map(|()| v)
    };
    let out = match format.code_bits() {
        8 => {
            let a = guard(py, || borrow::<u8>(codes, "codes", "uint8 (fp8 codes)"))?;
            let s = guard(py, || slice(&a, "codes"))?;
            guard_work(py, n, || decode(CodesRef::U8(s)))?
        }
        16 => {
            let a = guard(py, || {
                borrow::<u16>(codes, "codes", "uint16 (16-bit codes)")
            })?;
            let s = guard(py, || slice(&a, "codes"))?;
            guard_work(py, n, || decode(CodesRef::U16(s)))?
        }
        _ => {
            let a = guard(py, || {
                borrow::<u32>(codes, "codes", "uint32 (float32 containers)")
            })?;
            let s = guard(py, || slice(&a, "codes"))?;
            guard_work(py, n, || decode(CodesRef::U32(s)))?
        }
    };
    Ok(to_numpy(py, out))
}

/// The words of the seeded generator for flat indices `0..n`, written in parallel into a
/// numpy-allocated array (huge pages for big arrays).
#[pyfunction]
pub fn stochastic_bits(py: Python<'_>, n: usize, seed: u64) -> PyResult<Py<PyAny>> {
    guard(py, || {
        trn2core::host::check_alloc("shape", &format!("{n} random words"), n as u128 * 4)
    })?;
    if n > (1usize << 36) {
        return guard(py, || {
            Err(Error::capacity(
                "shape",
                format!("{n} elements is more than this emulator allocates at once (2**36)"),
            ))
        });
    }
    fill_codes::<u32>(py, n, |o| {
        numerics::stochastic_words(seed, o);
        Ok(())
    })
}

/// The facts of a format as a dict (the facade freezes it into a dataclass).
#[pyfunction]
#[pyo3(signature = (fmt, exponent_bias))]
pub fn format_info<'py>(
    py: Python<'py>,
    fmt: &str,
    exponent_bias: Option<i64>,
) -> PyResult<Bound<'py, PyDict>> {
    let format = guard(py, || Format::parse("fmt", fmt))?;
    let info = guard(py, || FormatInfo::new(format, exponent_bias))?;
    let d = PyDict::new(py);
    d.set_item("name", info.name)?;
    d.set_item("exponent_bits", info.exponent_bits)?;
    d.set_item("mantissa_bits", info.mantissa_bits)?;
    d.set_item("bias", info.bias)?;
    d.set_item("max", info.max)?;
    d.set_item("min_normal", info.min_normal)?;
    d.set_item("min_subnormal", info.min_subnormal)?;
    d.set_item("has_inf", info.has_inf)?;
    Ok(d)
}

/// Names of the formats and rounding modes, in contract order.
#[pyfunction]
pub fn names() -> (Vec<&'static str>, Vec<&'static str>) {
    (
        Format::ALL.iter().map(|f| f.name()).collect(),
        Rounding::ALL.iter().map(|r| r.name()).collect(),
    )
}
