//! Bindings of `trn2core::sparsity` (N:M pruning, compression, the CUTLASS layout) and of the
//! sparse GEMM kernel. Arrays arrive as flat unsigned-integer views of their codes (the facade
//! views every dtype as `uint8/16/32/64` of its width) and leave the same way.

use numpy::PyArrayMethods;
use pyo3::prelude::*;
use trn2core::sparsity::{self, Compressed, CompressedLayout, CutlassMeta, Dtype, Pattern};
use trn2core::Error;

use crate::arrays::{borrow, new_uninit, slice, to_numpy};
use crate::errors::{guard, guard_work};

/// Runs `$body` with `$s` bound to the codes of `$x` as a slice of its unsigned width (`$t` is
/// the element type); any other dtype is a `FormatError` on `$arg`.
macro_rules! with_codes {
    ($py:expr, $x:expr, $arg:expr, |$s:ident: $t:ident| $body:expr) => {{
        let dt = $x
            .getattr("dtype")?
            .getattr("itemsize")?
            .extract::<usize>()?;
        match dt {
            1 => {
                type $t = u8;
                let a = guard($py, || borrow::<$t>($x, $arg, "uint8 codes"))?;
                let $s = guard($py, || slice(&a, $arg))?;
                $body
            }
            2 => {
                type $t = u16;
                let a = guard($py, || borrow::<$t>($x, $arg, "uint16 codes"))?;
                let $s = guard($py, || slice(&a, $arg))?;
                $body
            }
            4 => {
                type $t = u32;
                let a = guard($py, || borrow::<$t>($x, $arg, "uint32 codes"))?;
                let $s = guard($py, || slice(&a, $arg))?;
                $body
            }
            8 => {
                type $t = u64;
                let a = guard($py, || borrow::<$t>($x, $arg, "uint64 codes"))?;
                let $s = guard($py, || slice(&a, $arg))?;
                $body
            }
            w => Err(crate::errors::to_py(
                $py,
                Error::format(
                    $arg,
                    format!("elements of {w} bytes are not supported (1, 2, 4 or 8)"),
                ),
            )),
        }
    }};
}

/// `(values codes, packed indices, values shape, normalised axis)`.
type CompressedParts = (Py<PyAny>, Py<PyAny>, Vec<usize>, usize);

/// The pattern names, in order (`trn2core.SPARSITY_PATTERNS`).
#[pyfunction]
pub fn sparsity_patterns() -> Vec<String> {
    Pattern::ALL.iter().map(|p| p.name()).collect()
}

/// Magnitude pruning of the codes `x` (dtype name `dtype`, C-contiguous `shape`).
#[pyfunction]
pub fn sparsity_prune(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    dtype: &str,
    shape: Vec<usize>,
    axis: isize,
    pattern: &str,
) -> PyResult<Py<PyAny>> {
    let p = guard(py, || Pattern::parse(pattern))?;
    let d = guard(py, || Dtype::parse("x", dtype))?;
    with_codes!(py, x, "x", |s: T| {
        // The result lives in numpy's memory (huge pages for big arrays: far fewer page faults
        // than a fresh Rust allocation).
        // SAFETY: prune_to writes every element (it checks the length) before Python reads it.
        let arr = guard(py, || unsafe {
            new_uninit::<T>(py, s.len(), "x", "the pruned array")
        })?;
        {
            let mut rw = arr.readwrite();
            let out = guard(py, || {
                rw.as_slice_mut()
                    .map_err(|_| Error::shape("out", "expected a contiguous output"))
            })?;
            guard_work(py, s.len() as u64, || {
                sparsity::prune_to::<T>(s, out, d, &shape, axis, p)
            })?;
        }
        Ok(arr.into_any().unbind())
    })
}

/// Compresses the codes `x`: `(values codes, packed indices, values shape, axis)`.
#[pyfunction]
pub fn sparsity_compress(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    shape: Vec<usize>,
    axis: isize,
    pattern: &str,
) -> PyResult<CompressedParts> {
    let p = guard(py, || Pattern::parse(pattern))?;
    with_codes!(py, x, "x", |s: T| {
        let layout = guard(py, || CompressedLayout::new(s.len(), &shape, axis, p))?;
        guard(py, || {
            trn2core::host::check_alloc("x", "the compressed array", layout.bytes::<T>())
        })?;
        // Both outputs live in numpy's memory, as prune's does (fresh Rust pages cost as much
        // as the compression itself).
        // SAFETY: compress_into writes every element of both before returning Ok; on an error
        // the arrays are dropped unread.
        let (vals, idx) = guard(py, || unsafe {
            Ok((
                new_uninit::<T>(py, layout.values, "x", "the compressed values")?,
                new_uninit::<u8>(py, layout.index_bytes, "x", "the packed indices")?,
            ))
        })?;
        {
            let (mut vw, mut iw) = (vals.readwrite(), idx.readwrite());
            let contiguous = |_| Error::shape("out", "expected a contiguous output");
            let v = guard(py, || vw.as_slice_mut().map_err(contiguous))?;
            let i = guard(py, || iw.as_slice_mut().map_err(contiguous))?;
            guard_work(py, s.len() as u64, || {
                sparsity::compress_into::<T>(s, &layout, v, i)
            })?;
        }
        Ok((
            vals.into_any().unbind(),
            idx.into_any().unbind(),
            layout.values_shape(),
            layout.axis(),
        ))
    })
}

/// The dense codes of a compressed array (its parts are validated first).
#[pyfunction]
pub fn sparsity_decompress(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    indices: &Bound<'_, PyAny>,
    shape: Vec<usize>,
    axis: isize,
    pattern: &str,
) -> PyResult<Py<PyAny>> {
    let p = guard(py, || Pattern::parse(pattern))?;
    let ia = guard(py, || borrow::<u8>(indices, "indices", "uint8"))?;
    let idx = guard(py, || slice(&ia, "indices"))?.to_vec();
    with_codes!(py, values, "values", |s: T| {
        let vals = s.to_vec();
        let work = shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        let dense = guard_work(py, work, || {
            Compressed::<T>::from_parts(vals, idx, &shape, axis, p)?.decompress_checked()
        })?;
        Ok(to_numpy(py, dense))
    })
}

/// The positions (one byte each, in the order of the values) of packed indices.
#[pyfunction]
pub fn sparsity_positions(
    py: Python<'_>,
    indices: &Bound<'_, PyAny>,
    pattern: &str,
    count: usize,
) -> PyResult<Py<PyAny>> {
    let p = guard(py, || Pattern::parse(pattern))?;
    let ia = guard(py, || borrow::<u8>(indices, "indices", "uint8"))?;
    let idx = guard(py, || slice(&ia, "indices"))?;
    let need = (count as u128 * p.index_bits() as u128).div_ceil(8);
    if need != idx.len() as u128 {
        return Err(crate::errors::to_py(
            py,
            Error::shape(
                "indices",
                format!("{count} positions take {need} bytes, got {}", idx.len()),
            ),
        ));
    }
    let pos = guard_work(py, count as u64, || {
        Ok(sparsity::unpack_indices(idx, p.index_bits(), count))
    })?;
    Ok(to_numpy(py, pos))
}

/// PyTorch's CUTLASS layout of the `[rows, cols]` codes `x`: `(values codes, meta words)`.
#[pyfunction]
pub fn sparsity_to_cutlass(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    rows: usize,
    cols: usize,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    with_codes!(py, x, "x", |s: T| {
        let c = guard_work(py, s.len() as u64, || {
            sparsity::to_cutlass::<T>(s, rows, cols)
        })?;
        let meta = match c.meta {
            CutlassMeta::I16(w) => to_numpy(py, w),
            CutlassMeta::I32(w) => to_numpy(py, w),
        };
        Ok((to_numpy(py, c.values), meta))
    })
}

/// The dense `[rows, cols]` codes from PyTorch's CUTLASS layout (`meta` int16 or int32).
#[pyfunction]
pub fn sparsity_from_cutlass(
    py: Python<'_>,
    values: &Bound<'_, PyAny>,
    meta: &Bound<'_, PyAny>,
    rows: usize,
    cols: usize,
) -> PyResult<Py<PyAny>> {
    let words = if let Ok(m) = borrow::<i16>(meta, "meta", "int16") {
        CutlassMeta::I16(guard(py, || slice(&m, "meta"))?.to_vec())
    } else {
        let m = guard(py, || borrow::<i32>(meta, "meta", "int16 or int32 words"))?;
        CutlassMeta::I32(guard(py, || slice(&m, "meta"))?.to_vec())
    };
    with_codes!(py, values, "values", |s: T| {
        let dense = guard_work(py, 2 * s.len() as u64, || {
            sparsity::from_cutlass::<T>(s, &words, rows, cols)
        })?;
        Ok(to_numpy(py, dense))
    })
}
