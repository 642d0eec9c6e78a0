//! Bindings of the tensor engine's GEMM: `trn2core.gemm` (one call: operands as the caller
//! holds them, see [`gemm`]), and [`Codes`], the flat operand codes the machine's host-issued
//! instructions take (`Machine.matmul`).

use numpy::{PyReadonlyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use trn2core::engine::{Buffer, GemmCall, GemmOptions, GemmOut, Matrix, PerfMode, Sparse, Strided};
use trn2core::machine::HostOperand;
use trn2core::numerics::{CodesMut, CodesRef, Format, Rounding};
use trn2core::sparsity::{Dtype, Pattern};
use trn2core::Error;

use crate::arrays::{borrow, borrow_any, fill_new_array, slice, strided};
use crate::errors::PyTrn2Result;
use crate::perf::PyReport;

/// A borrowed flat array of one instruction operand's codes, in its format's width.
pub(crate) enum Codes<'py> {
    U8(PyReadonlyArray1<'py, u8>),
    U16(PyReadonlyArray1<'py, u16>),
    U32(PyReadonlyArray1<'py, u32>),
}

impl<'py> Codes<'py> {
    pub(crate) fn borrow(
        x: &Bound<'py, PyAny>, arg: &str, format: Format,
    ) -> Result<Codes<'py>, Error> {
        Ok(match format.code_bits() {
            8 => Codes::U8(borrow(x, arg, "uint8 (fp8 codes)")?),
            16 => Codes::U16(borrow(x, arg, "uint16 (16-bit codes)")?),
            _ => Codes::U32(borrow(x, arg, "uint32 (float32 containers)")?),
        })
    }

    /// The codes as the host operand `arg` of the array `shape` in `format`.
    pub(crate) fn operand<'s>(
        &'s self, arg: &str, shape: &'s [usize], format: Format,
    ) -> Result<HostOperand<'s>, Error> {
        let codes = match self {
            Codes::U8(a) => CodesRef::U8(slice(a, arg)?),
            Codes::U16(a) => CodesRef::U16(slice(a, arg)?),
            Codes::U32(a) => CodesRef::U32(slice(a, arg)?),
        };
        Ok(HostOperand { codes, shape, format })
    }
}

/// A borrowed operand array, as unsigned codes of its element width.
enum Held<'py> {
    U8(PyReadonlyArrayDyn<'py, u8>),
    U16(PyReadonlyArrayDyn<'py, u16>),
    U32(PyReadonlyArrayDyn<'py, u32>),
    U64(PyReadonlyArrayDyn<'py, u64>),
}

impl<'py> Held<'py> {
    fn new(x: &Bound<'py, PyAny>, arg: &str, dtype: Dtype) -> Result<Held<'py>, Error> {
        Ok(match dtype.bits() {
            8 => Held::U8(borrow_any(x, arg, "uint8")?),
            16 => Held::U16(borrow_any(x, arg, "uint16")?),
            32 => Held::U32(borrow_any(x, arg, "uint32")?),
            _ => Held::U64(borrow_any(x, arg, "uint64")?),
        })
    }

    /// The held 2-D array as a dense matrix in its layout.
    fn dense(&self, arg: &str, dtype: Dtype, swapped: bool) -> Result<Matrix<'_>, Error> {
        fn view<'a, T: numpy::Element>(
            a: &'a PyReadonlyArrayDyn<'_, T>, arg: &str, dtype: Dtype, swapped: bool,
        ) -> Result<Matrix<'a>, Error>
        where
            Buffer<'a>: From<&'a [T]>,
        {
            let (data, origin, strides) = strided(a, arg)?;
            let shape = [a.shape()[0], a.shape()[1]];
            let m = Strided::new(arg, data.into(), dtype, swapped, shape, origin, strides)?;
            Ok(Matrix::Dense(m))
        }
        match self {
            Held::U8(a) => view(a, arg, dtype, swapped),
            Held::U16(a) => view(a, arg, dtype, swapped),
            Held::U32(a) => view(a, arg, dtype, swapped),
            Held::U64(a) => view(a, arg, dtype, swapped),
        }
    }

    /// The held flat values of a compressed matrix.
    fn values(&self, arg: &str) -> Result<Buffer<'_>, Error> {
        fn flat<'a, T: numpy::Element>(
            a: &'a PyReadonlyArrayDyn<'_, T>, arg: &str,
        ) -> Result<&'a [T], Error> {
            a.as_slice().map_err(|_| Error::shape(arg, "expected C-contiguous compressed values"))
        }
        Ok(match self {
            Held::U8(a) => flat(a, arg)?.into(),
            Held::U16(a) => flat(a, arg)?.into(),
            Held::U32(a) => flat(a, arg)?.into(),
            Held::U64(a) => flat(a, arg)?.into(),
        })
    }
}

/// The rest of a compressed `a` (whose values arrive as `a`, a flat unsigned view): its packed
/// positions, its pattern and its dense shape `(rows, cols)`.
type SparseParts<'py> = (Bound<'py, PyAny>, String, (usize, usize));

/// One `trn2core.gemm` call in one crossing: the operands as the caller holds them (2-D
/// unsigned views of their element width in any layout, named by their numpy `*_dtype`, or the
/// parts of a compressed `a`), rounded into their formats while the kernel packs them (no
/// float32 copy), the result rounded into `out_dtype`, and the timing on one NeuronCore or split
/// over the physical cores `cores`. Returns the flat result (float32, or the codes of
/// `out_dtype`), the report and the format the timing was costed at.
#[pyfunction]
#[pyo3(signature = (a, a_dtype, a_swapped, a_sparse, b, b_dtype, b_swapped, dtype, rounding, seeds, perf_mode, out_dtype, throttle, cores))]
#[allow(clippy::too_many_arguments)]
pub fn gemm<'py>(
    py: Python<'py>, a: &Bound<'py, PyAny>, a_dtype: &str, a_swapped: bool,
    a_sparse: Option<SparseParts<'py>>, b: &Bound<'py, PyAny>, b_dtype: &str, b_swapped: bool,
    dtype: Option<&str>, rounding: &str, seeds: [u64; 2], perf_mode: &str, out_dtype: &str,
    throttle: bool, cores: Option<Vec<usize>>,
) -> PyTrn2Result<(Py<PyAny>, PyReport, String)> {
    let options = GemmOptions {
        dtype: dtype.map(|d| Format::parse("dtype", d)).transpose()?,
        rounding: Rounding::parse("rounding", rounding)?,
        seeds,
        perf_mode: PerfMode::parse("perf_mode", perf_mode)?,
        out_format: Format::parse("out_dtype", out_dtype)?,
        throttle,
        cores,
    };
    let (ad, bd) = (Dtype::parse("a", a_dtype)?, Dtype::parse("b", b_dtype)?);
    let ah = Held::new(a, "a", ad)?;
    let bh = Held::new(b, "b", bd)?;
    let indices = match &a_sparse {
        Some((idx, ..)) => Some(borrow::<u8>(idx, "a", "uint8 positions")?),
        None => None,
    };
    let call = {
        let am = match (&a_sparse, &indices) {
            (Some((_, pattern, (rows, cols))), Some(idx)) => {
                let pattern = Pattern::parse(pattern)?;
                let idx = slice(idx, "a")?;
                Matrix::Sparse(Sparse::new("a", ah.values("a")?, idx, ad, pattern, [*rows, *cols])?)
            }
            _ => ah.dense("a", ad, a_swapped)?,
        };
        GemmCall::new(am, bh.dense("b", bd, b_swapped)?, options)?
    };
    let [m, k, n] = call.dims();
    let work = (m as u64).saturating_mul(k as u64).saturating_mul(n as u64);
    let what = format!("the {m} x {n} result");
    let len = m.checked_mul(n).ok_or_else(|| {
        Error::capacity("out", format!("{what} has more elements than this host can address"))
    })?;
    macro_rules! run {
        ($t:ty, $out:expr) => {{
            let (arr, report) =
                fill_new_array::<$t, _>(py, len, "out", &what, work, |o| call.run($out(o)))?;
            (arr.into_any().unbind(), report)
        }};
    }
    let (out, report) = match call.out_format() {
        Format::Fp32 => run!(f32, GemmOut::Fp32),
        f => match f.code_bits() {
            8 => run!(u8, |o| GemmOut::Codes(CodesMut::U8(o))),
            16 => run!(u16, |o| GemmOut::Codes(CodesMut::U16(o))),
            _ => run!(u32, |o| GemmOut::Codes(CodesMut::U32(o))),
        },
    };
    Ok((out, PyReport::of(py, &report)?, call.cost_format().to_string()))
}
